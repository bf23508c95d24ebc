//! Real PCI functions through vfio-pci, opened with the `pci-driver` crate.
//!
//! - [`SysRoots::precheck`]: sysfs and `/dev` checks made first, so each
//!   failure (not bound, no IOMMU, no access...) says its own fix;
//! - [`VfioFunction`]: open, enable memory space and bus mastering, map BARs;
//! - [`MappedBar`]: a mapped BAR, reached through [`Mmio`](super::mmio::Mmio)
//!   or, for a BAR that is shared memory, as a
//!   [`SharedRegion`](super::emu::SharedRegion);
//! - [`ivshmem`]: QEMU ivshmem as an N-host fabric, by the emulated fabric's
//!   code over BAR2.
//!
//! pci-driver 0.1.4 needs a real (or emulated) IOMMU: it opens
//! `/dev/vfio/<group>` with the TYPE1v2 IOMMU and has no no-IOMMU mode.

mod bar;
mod bdf;
mod error;
mod function;
pub mod ivshmem;
#[cfg(test)]
mod ivshmem_fabric_tests;
mod sysfs;
#[cfg(test)]
pub(crate) use sysfs::fake as sysfs_fake;

pub use bar::MappedBar;
pub use bdf::Bdf;
pub use error::VfioError;
pub use function::VfioFunction;
pub use sysfs::{Prechecked, SysRoots};
