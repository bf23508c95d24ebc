//! The vfio layer's error type: every variant says what failed and the
//! command or setting that fixes it.

use std::path::PathBuf;

use thiserror::Error;

use super::Bdf;
use crate::hw::HwError;

/// What can go wrong opening a PCI function through vfio-pci.
#[derive(Debug, Error)]
pub enum VfioError {
    /// The PCI address does not parse.
    #[error(
        "bad PCI address {input:?}: expected domain:bus:device.function in hex, \
         e.g. 0000:00:03.0 (or bus:device.function, e.g. 00:03.0)"
    )]
    BadAddress {
        /// What was given.
        input: String,
    },
    /// No such device in sysfs.
    #[error(
        "no PCI device {bdf}: {} does not exist; list devices with lspci -D or \
         scripts/ntbdk-devbind --status", path.display()
    )]
    NoDevice {
        /// The device.
        bdf: Bdf,
        /// The sysfs path looked at.
        path: PathBuf,
    },
    /// The device is not bound to vfio-pci.
    #[error(
        "PCI device {bdf} is bound to {}, not vfio-pci: bind it with \
         scripts/ntbdk-devbind --bind=vfio-pci {bdf}",
        driver.as_deref().map_or("no driver".to_owned(), |d| format!("driver {d}"))
    )]
    NotBoundToVfio {
        /// The device.
        bdf: Bdf,
        /// The driver it is bound to, if any.
        driver: Option<String>,
    },
    /// The device has no IOMMU group: no IOMMU is active.
    #[error(
        "PCI device {bdf} has no IOMMU group: the IOMMU is off. Enable it (firmware \
         VT-d/AMD-Vi, and intel_iommu=on or amd_iommu=on on the kernel command line; in a \
         QEMU guest, -device intel-iommu), reboot, then bind the device again"
    )]
    NoIommuGroup {
        /// The device.
        bdf: Bdf,
    },
    /// The group's device node does not exist.
    #[error(
        "{} (IOMMU group {group} of {bdf}) does not exist: is the vfio-pci module loaded and \
         the device bound? scripts/ntbdk-devbind --bind=vfio-pci {bdf}", path.display()
    )]
    GroupNodeMissing {
        /// The device.
        bdf: Bdf,
        /// Its IOMMU group.
        group: u32,
        /// The device node.
        path: PathBuf,
    },
    /// The group's device node is open in another process (a vfio group
    /// is opened by one process at a time).
    #[error(
        "IOMMU group {group} of {bdf} ({}) is in use by another process (vfio lets one process \
         open a group): stop it (`fuser -v {}` names it), or use another device",
        path.display(), path.display()
    )]
    GroupBusy {
        /// The device.
        bdf: Bdf,
        /// Its IOMMU group.
        group: u32,
        /// The device node.
        path: PathBuf,
    },
    /// The group's device node cannot be opened read-write.
    #[error(
        "cannot open {} (IOMMU group {group} of {bdf}): {source}; run as root, or let your \
         user open it with scripts/ntbdk-devbind --user NAME", path.display()
    )]
    GroupNotAccessible {
        /// The device.
        bdf: Bdf,
        /// Its IOMMU group.
        group: u32,
        /// The device node.
        path: PathBuf,
        /// Why it could not be opened.
        #[source]
        source: std::io::Error,
    },
    /// The device is not the one the caller asked for.
    #[error("PCI device {bdf} is {vendor:04x}:{device:04x}, not {expected}")]
    WrongDevice {
        /// The device.
        bdf: Bdf,
        /// Its vendor ID.
        vendor: u16,
        /// Its device ID.
        device: u16,
        /// What was expected.
        expected: String,
    },
    /// No backend drives this vendor:device.
    #[error(
        "PCI device {bdf} is {vendor:04x}:{device:04x}, which ntbdk does not drive; \
         supported: {supported}"
    )]
    Unsupported {
        /// The device.
        bdf: Bdf,
        /// Its vendor ID.
        vendor: u16,
        /// Its device ID.
        device: u16,
        /// The devices that are supported.
        supported: String,
    },
    /// A BAR the backend needs is absent or too small.
    #[error("BAR{bar} of PCI device {bdf} is {len} bytes; the {what} needs at least {need}")]
    BarTooSmall {
        /// The device.
        bdf: Bdf,
        /// The BAR.
        bar: usize,
        /// Its size (0 = absent).
        len: u64,
        /// Bytes needed.
        need: u64,
        /// What needs them.
        what: &'static str,
    },
    /// Reading a sysfs attribute failed.
    #[error("reading {}: {source}", path.display())]
    Sysfs {
        /// The attribute.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The vfio container offers no Type1v2 IOMMU, which pci-driver needs.
    #[error(
        "opening PCI device {bdf} through vfio: the vfio container offers no Type1 IOMMU: load \
         it (`modprobe vfio_iommu_type1`; vfio-pci loaded with insmod does not pull it in)"
    )]
    NoType1 {
        /// The device.
        bdf: Bdf,
    },
    /// pci-driver failed to open, configure or map the device.
    #[error(
        "{what} PCI device {bdf} through vfio: {source} (\"busy\": another process has the \
         device's IOMMU group open; \"not viable\": bind every device of its group to vfio-pci)"
    )]
    Driver {
        /// The device.
        bdf: Bdf,
        /// What was being done.
        what: String,
        /// The error pci-driver returned.
        #[source]
        source: std::io::Error,
    },
    /// The fabric in the device's shared memory could not be used.
    #[error("PCI device {bdf}: {source}")]
    Fabric {
        /// The device.
        bdf: Bdf,
        /// The device-layer error.
        #[source]
        source: HwError,
    },
}
