//! The Intel Xeon NTB (gen3 Skylake-SP `8086:201C`; gen4 Ice Lake-SP and
//! Sapphire Rapids `8086:347E`) as an [`NtbDevice`](crate::hw::NtbDevice).
//!
//! [`IntelNtb`] reaches the device's registers only through
//! [`Mmio`](crate::hw::mmio::Mmio): over a BAR mapped through vfio on
//! hardware, or over [`model::IntelNtbModel`], a software register file with
//! the hardware's side effects, which is how the backend is tested (no
//! machine here has the hardware).
//!
//! | file | what |
//! | --- | --- |
//! | `regs.rs` | register offsets and bits, each with its source |
//! | `part.rs` | which part (device ID, revision) and side (port definition) |
//! | `device.rs` | [`IntelNtb`]: bring-up, translation, doorbells, scratchpads, link |
//! | `handshake.rs` | the scratchpad/doorbell announcement with a generation |
//! | `memory.rs` | the seams: outbound apertures, inbound memory |
//! | `iova.rs` | bus addresses aligned to the BAR size |
//! | `vfio.rs` | opening a real function through vfio-pci |
//! | `error.rs` | [`IntelError`] |
//! | `model/` | the register model and its shared memory |
//!
//! Facts come from the public Linux (`linux:drivers/ntb/hw/intel/`) and
//! DPDK (`dpdk:drivers/raw/ntb/`) drivers, cited where used; no code is
//! taken from them.

mod device;
mod error;
pub mod handshake;
mod iova;
mod memory;
pub mod model;
mod part;
pub mod regs;
pub mod vfio;

pub use device::{BEAT_PERIOD, IntelConfig, IntelNtb};
pub use error::IntelError;
pub use iova::IovaAllocator;
pub use memory::{Aperture, InboundMemory, Outbound};
pub use part::{B2bSide, IntelPart};
