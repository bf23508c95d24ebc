//! [`VfioFunction`]: a PCI function bound to vfio-pci, opened with the
//! `pci-driver` crate.
//!
//! Sequence (pci-driver 0.1.4 docs; the kernel's `Documentation/driver-api/vfio.rst`):
//! the sysfs pre-checks ([`SysRoots::precheck`]), then
//! `VfioPciDevice::open(<sysfs dir>)` (group, container, TYPE1v2 IOMMU,
//! device fd), the vendor and device IDs from config space, memory space and
//! bus mastering enabled in the Command register (config 0x04, bits 1 and
//! 2), then BARs mapped read-write on demand.

use pci_driver::backends::vfio::VfioPciDevice;
use pci_driver::device::PciDevice;
use pci_driver::regions::Permissions;

use super::{Bdf, MappedBar, Prechecked, SysRoots, VfioError};

/// An open PCI function, with memory space and bus mastering enabled.
#[derive(Debug)]
pub struct VfioFunction {
    bdf: Bdf,
    device: VfioPciDevice,
    info: Prechecked,
}

impl VfioFunction {
    /// Opens `bdf`, which must be `vendor:device` (`name` says what that is
    /// in errors). Sysfs and `/dev` are looked at under `roots`.
    pub fn open(
        bdf: Bdf,
        roots: &SysRoots,
        vendor: u16,
        device: u16,
        name: &str,
    ) -> Result<VfioFunction, VfioError> {
        let info = roots.precheck(bdf)?;
        let wrong = |v: u16, d: u16| VfioError::WrongDevice {
            bdf,
            vendor: v,
            device: d,
            expected: format!("{vendor:04x}:{device:04x} ({name})"),
        };
        if (info.vendor, info.device) != (vendor, device) {
            return Err(wrong(info.vendor, info.device));
        }
        let driver = |what: &str| {
            let what = what.to_owned();
            move |source| VfioError::Driver { bdf, what, source }
        };
        let dev = VfioPciDevice::open(&info.path).map_err(|source| {
            // pci-driver 0.1's words for a container whose IOMMU offers no
            // Type1v2 (`vfio_check_extension` in its `containers.rs`).
            if source.kind() == std::io::ErrorKind::InvalidInput && source.to_string() == "TODO" {
                VfioError::NoType1 { bdf }
            } else {
                driver("opening")(source)
            }
        })?;
        let config = dev.config();
        let v = config
            .vendor_id()
            .read()
            .map_err(driver("reading the config of"))?;
        let d = config
            .device_id()
            .read()
            .map_err(driver("reading the config of"))?;
        if (v, d) != (vendor, device) {
            return Err(wrong(v, d));
        }
        let command = config.command();
        command
            .memory_space_enable()
            .write(true)
            .map_err(driver("enabling memory space of"))?;
        command
            .bus_master_enable()
            .write(true)
            .map_err(driver("enabling bus mastering of"))?;
        Ok(VfioFunction {
            bdf,
            device: dev,
            info,
        })
    }

    /// The function's address.
    pub fn bdf(&self) -> Bdf {
        self.bdf
    }

    /// The pci-driver device (its IOMMU, for DMA mappings).
    pub fn pci(&self) -> &VfioPciDevice {
        &self.device
    }

    /// What the sysfs checks found (IOMMU group, BAR sizes...).
    pub fn info(&self) -> &Prechecked {
        &self.info
    }

    /// Maps BAR `index` read-write whole; it must hold at least `need`
    /// bytes for `what`.
    pub fn map_bar(
        &self,
        index: usize,
        need: u64,
        what: &'static str,
    ) -> Result<MappedBar, VfioError> {
        let bdf = self.bdf;
        let too_small = |len| VfioError::BarTooSmall {
            bdf,
            bar: index,
            len,
            need,
            what,
        };
        let bar = self.device.bar(index).ok_or_else(|| too_small(0))?;
        let len = pci_driver::regions::PciRegion::len(&bar);
        if len < need {
            return Err(too_small(len));
        }
        let map = bar
            .map(.., Permissions::ReadWrite)
            .map_err(|source| VfioError::Driver {
                bdf,
                what: format!("mapping BAR{index} of"),
                source,
            })?;
        Ok(MappedBar::new(map))
    }
}
