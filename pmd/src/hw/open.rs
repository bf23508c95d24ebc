//! Naming a device, as DPDK's `-a` does, and opening it.
//!
//! | spec | device |
//! | --- | --- |
//! | `emu:NAME` (or a bare `NAME`) | a member of the emulated fabric NAME (created if absent) |
//! | `vfio:0000:00:03.0` (or a bare address) | a PCI function bound to vfio-pci; the backend is chosen by its vendor:device ([`SUPPORTED`]) |
//!
//! [`open`] returns the device as `Arc<dyn NtbDevice>`. The emulated fabric
//! and ivshmem are fabric members ([`EmuDevice`]); [`open_member`] returns
//! that type for tools that also show the fabric, [`open_either`] either
//! kind as [`Opened`], and [`attach_fabric`] the fabric alone, without
//! taking a slot. An Intel NTB is a two-port bridge, not a fabric: [`open`]
//! and [`open_either`] open it.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use thiserror::Error;

use super::emu::{DeviceConfig, EmuDevice, EmuFabric, shm_dir, validate_name};
use super::intel::IntelConfig;
use super::intel::regs::{DEVICE_GEN3_SKX, DEVICE_GEN4, VENDOR_INTEL};
use super::vfio::ivshmem::{self, IVSHMEM_DEVICE, IVSHMEM_VENDOR, IvshmemConfig};
use super::vfio::{Bdf, SysRoots, VfioError};
use super::{HwError, NtbDevice};

/// The PCI devices a `vfio:` spec can open: vendor, device, what it is.
pub const SUPPORTED: &[(u16, u16, &str)] = &[
    (
        IVSHMEM_VENDOR,
        IVSHMEM_DEVICE,
        "QEMU ivshmem (ivshmem-plain, ivshmem-doorbell)",
    ),
    (VENDOR_INTEL, DEVICE_GEN3_SKX, "Intel Skylake-SP NTB (gen3)"),
    (
        VENDOR_INTEL,
        DEVICE_GEN4,
        "Intel Ice Lake-SP / Sapphire Rapids NTB (gen4)",
    ),
];

/// Which backend drives a PCI function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PciBackend {
    /// QEMU ivshmem, as a fabric.
    Ivshmem,
    /// An Intel Xeon NTB.
    IntelNtb,
}

/// The backend for `vendor:device`, if one of [`SUPPORTED`].
pub fn backend_for(vendor: u16, device: u16) -> Option<PciBackend> {
    match (vendor, device) {
        (IVSHMEM_VENDOR, IVSHMEM_DEVICE) => Some(PciBackend::Ivshmem),
        (VENDOR_INTEL, DEVICE_GEN3_SKX | DEVICE_GEN4) => Some(PciBackend::IntelNtb),
        _ => None,
    }
}

/// A device, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A member of the emulated fabric of this name.
    Emu(String),
    /// A PCI function bound to vfio-pci.
    Vfio(Bdf),
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Emu(name) => write!(f, "emu:{name}"),
            DeviceSpec::Vfio(bdf) => write!(f, "vfio:{bdf}"),
        }
    }
}

/// A device spec that does not parse.
#[derive(Debug, Error)]
#[error(
    "bad device {input:?}: {why}; name a device as emu:NAME (an emulated fabric) or \
     vfio:DDDD:BB:DD.F (a PCI function bound to vfio-pci, e.g. vfio:0000:00:03.0)"
)]
pub struct SpecError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub why: String,
}

impl FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<DeviceSpec, SpecError> {
        let err = |why: String| SpecError {
            input: s.to_owned(),
            why,
        };
        if let Some(name) = s.strip_prefix("emu:") {
            validate_name(name).map_err(|e| err(e.to_string()))?;
            return Ok(DeviceSpec::Emu(name.to_owned()));
        }
        if let Some(addr) = s.strip_prefix("vfio:") {
            return addr
                .parse()
                .map(DeviceSpec::Vfio)
                .map_err(|e: VfioError| err(e.to_string()));
        }
        if let Ok(bdf) = s.parse::<Bdf>() {
            return Ok(DeviceSpec::Vfio(bdf));
        }
        match s.split_once(':') {
            Some((kind, _)) => Err(err(format!("unknown kind {kind:?}"))),
            None => validate_name(s)
                .map(|()| DeviceSpec::Emu(s.to_owned()))
                .map_err(|e| err(e.to_string())),
        }
    }
}

/// How to open devices of each kind.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// For `emu:` devices (its `dir` says where fabrics live).
    pub emu: DeviceConfig,
    /// For ivshmem functions.
    pub ivshmem: IvshmemConfig,
    /// For Intel NTB functions.
    pub intel: IntelConfig,
    /// Where sysfs and `/dev` are (tests point them at a fake tree).
    pub roots: SysRoots,
}

/// Why a device could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The device layer refused (fabric full, geometry mismatch...).
    #[error(transparent)]
    Hw(#[from] HwError),
    /// The PCI function could not be opened or is not supported.
    #[error(transparent)]
    Vfio(#[from] VfioError),
    /// The device is a two-port bridge, not a fabric with slots.
    #[error(
        "{spec} is an Intel NTB, a two-port bridge and not a fabric: open it as a device \
         (it has no fabric to attach to or slot to show)"
    )]
    NotAFabric {
        /// The device.
        spec: String,
    },
}

/// An opened device, by kind: tools that show a fabric's slots and status
/// need the member's own type.
pub enum Opened {
    /// A member of a fabric (the emulated fabric, ivshmem).
    Member(EmuDevice),
    /// A two-port bridge (an Intel NTB): a device, with no fabric.
    Bridge {
        /// The device.
        dev: Arc<dyn NtbDevice>,
        /// Whether its inbound windows are on hugepages, when it can say.
        hugepages: Option<bool>,
    },
}

impl Opened {
    /// The device, whatever its kind.
    pub fn into_device(self) -> Arc<dyn NtbDevice> {
        match self {
            Opened::Member(m) => Arc::new(m),
            Opened::Bridge { dev, .. } => dev,
        }
    }
}

/// Opens `spec` as a device.
pub fn open(spec: &DeviceSpec, opts: &OpenOptions) -> Result<Arc<dyn NtbDevice>, OpenError> {
    open_either(spec, opts).map(Opened::into_device)
}

/// Opens `spec`, keeping its kind: a fabric member as [`EmuDevice`], an
/// Intel NTB as a device.
pub fn open_either(spec: &DeviceSpec, opts: &OpenOptions) -> Result<Opened, OpenError> {
    if let DeviceSpec::Vfio(bdf) = spec
        && supported(*bdf, &opts.roots)? == PciBackend::IntelNtb
    {
        let dev = super::intel::vfio::open(*bdf, &opts.roots, &opts.intel)?;
        let hugepages = dev.inbound_on_hugepages();
        return Ok(Opened::Bridge {
            dev: Arc::new(dev),
            hugepages,
        });
    }
    Ok(Opened::Member(open_member(spec, opts)?))
}

/// Opens `spec` as a fabric member (both backends so far are).
pub fn open_member(spec: &DeviceSpec, opts: &OpenOptions) -> Result<EmuDevice, OpenError> {
    match spec {
        DeviceSpec::Emu(name) => Ok(EmuDevice::open(name, &opts.emu)?),
        DeviceSpec::Vfio(bdf) => {
            fabric_backend(spec, *bdf, &opts.roots)?;
            Ok(ivshmem::open(*bdf, &opts.roots, &opts.ivshmem)?)
        }
    }
}

/// Attaches to the fabric of `spec` without taking a slot (for status);
/// an `emu:` fabric must exist.
pub fn attach_fabric(spec: &DeviceSpec, opts: &OpenOptions) -> Result<EmuFabric, OpenError> {
    match spec {
        DeviceSpec::Emu(name) => {
            let dir = opts.emu.dir.clone().unwrap_or_else(shm_dir);
            Ok(EmuFabric::attach_in(&dir, name)?)
        }
        DeviceSpec::Vfio(bdf) => {
            fabric_backend(spec, *bdf, &opts.roots)?;
            Ok(ivshmem::attach(*bdf, &opts.roots)?)
        }
    }
}

/// Checks `bdf` is a fabric (ivshmem), not a bridge.
fn fabric_backend(spec: &DeviceSpec, bdf: Bdf, roots: &SysRoots) -> Result<(), OpenError> {
    match supported(bdf, roots)? {
        PciBackend::Ivshmem => Ok(()),
        PciBackend::IntelNtb => Err(OpenError::NotAFabric {
            spec: spec.to_string(),
        }),
    }
}

/// Checks `bdf` (pre-checks included) is a device of [`SUPPORTED`]; its
/// backend.
fn supported(bdf: Bdf, roots: &SysRoots) -> Result<PciBackend, VfioError> {
    let found = roots.precheck(bdf)?;
    if let Some(b) = backend_for(found.vendor, found.device) {
        return Ok(b);
    }
    Err(VfioError::Unsupported {
        bdf,
        vendor: found.vendor,
        device: found.device,
        supported: SUPPORTED
            .iter()
            .map(|(v, d, what)| format!("{v:04x}:{d:04x} {what}"))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::vfio::sysfs_fake::FakeSys;

    #[test]
    fn specs_parse_and_print() {
        let cases = [
            ("emu:demo", "emu:demo"),
            ("demo", "emu:demo"),
            ("vfio:0000:00:03.0", "vfio:0000:00:03.0"),
            ("vfio:00:03.0", "vfio:0000:00:03.0"),
            ("0000:af:00.1", "vfio:0000:af:00.1"),
        ];
        for (input, shown) in cases {
            let spec: DeviceSpec = input.parse().unwrap();
            assert_eq!(spec.to_string(), shown);
            assert_eq!(spec.to_string().parse::<DeviceSpec>().unwrap(), spec);
        }
    }

    #[test]
    fn bad_specs_say_what_is_wrong_and_how_to_name_a_device() {
        for (input, why) in [
            ("pci:0000:00:03.0", "unknown kind \"pci\""),
            ("vfio:0000:00:3g.0", "bad PCI address"),
            ("vfio:", "bad PCI address"),
            ("emu:", "bad fabric name"),
            ("emu:a/b", "bad fabric name"),
            ("", "bad fabric name"),
        ] {
            let e = input.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(e.contains(why), "{input:?}: {e}");
            assert!(e.contains("emu:NAME") && e.contains("vfio:"), "{e}");
        }
    }

    #[test]
    fn an_unsupported_pci_device_lists_what_is_supported() {
        let fs = FakeSys::new("open-unsupported");
        let bdf: Bdf = "0000:00:04.0".parse().unwrap();
        fs.add_device(bdf, 0x8086, 0x3725, &[1 << 16]);
        fs.bind(bdf, "vfio-pci");
        fs.group(bdf, 5, true);
        let opts = OpenOptions {
            roots: fs.roots.clone(),
            ..OpenOptions::default()
        };
        let e = open(&DeviceSpec::Vfio(bdf), &opts).err().unwrap();
        let msg = e.to_string();
        assert!(
            matches!(e, OpenError::Vfio(VfioError::Unsupported { .. })),
            "{msg}"
        );
        assert!(
            msg.contains("8086:3725") && msg.contains("8086:201c") && msg.contains("1af4:1110"),
            "{msg}"
        );
    }

    #[test]
    fn intel_ids_route_to_the_intel_backend() {
        assert_eq!(backend_for(0x8086, 0x201c), Some(PciBackend::IntelNtb));
        assert_eq!(backend_for(0x8086, 0x347e), Some(PciBackend::IntelNtb));
        assert_eq!(backend_for(0x1af4, 0x1110), Some(PciBackend::Ivshmem));
        assert_eq!(backend_for(0x8086, 0x3725), None);
        // Bound to vfio-pci with an Intel ID: opened by the Intel backend
        // (which reaches pci-driver, refusing the fake group node), and not
        // a fabric.
        let fs = FakeSys::new("open-intel");
        let bdf: Bdf = "0000:00:06.0".parse().unwrap();
        fs.add_device(bdf, 0x8086, 0x347e, &[64 << 10, 0, 1 << 20, 0, 1 << 20]);
        fs.bind(bdf, "vfio-pci");
        fs.group(bdf, 9, true);
        let opts = OpenOptions {
            roots: fs.roots.clone(),
            ..OpenOptions::default()
        };
        let spec = DeviceSpec::Vfio(bdf);
        let e = open(&spec, &opts).err().unwrap();
        assert!(
            matches!(e, OpenError::Vfio(VfioError::Driver { .. })),
            "{e}"
        );
        let e = attach_fabric(&spec, &opts).err().unwrap();
        assert!(matches!(e, OpenError::NotAFabric { .. }), "{e}");
        assert!(e.to_string().contains("two-port bridge"), "{e}");
        let e = open_member(&spec, &opts).err().unwrap();
        assert!(matches!(e, OpenError::NotAFabric { .. }), "{e}");
    }

    #[test]
    fn vfio_errors_come_through_the_opener() {
        let fs = FakeSys::new("open-unbound");
        let bdf: Bdf = "0000:00:03.0".parse().unwrap();
        fs.add_device(bdf, 0x1af4, 0x1110, &[256, 0, 1 << 20]);
        let opts = OpenOptions {
            roots: fs.roots.clone(),
            ..OpenOptions::default()
        };
        let e = attach_fabric(&DeviceSpec::Vfio(bdf), &opts).err().unwrap();
        assert!(
            e.to_string().contains("--bind=vfio-pci 0000:00:03.0"),
            "{e}"
        );
    }

    #[test]
    fn emu_specs_open_an_emulated_fabric_member() {
        let dir = std::env::temp_dir().join(format!("ntbdk-open-emu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = OpenOptions {
            emu: DeviceConfig {
                dir: Some(dir.clone()),
                fabric: crate::hw::emu::FabricConfig {
                    slots: 2,
                    window_size: 64 << 10,
                    ..Default::default()
                },
                ..DeviceConfig::default()
            },
            ..OpenOptions::default()
        };
        let spec: DeviceSpec = "emu:open-test".parse().unwrap();
        let a = open(&spec, &opts).unwrap();
        let b = open(&spec, &opts).unwrap();
        assert!(a.link(b.port()).unwrap().up);
        assert_eq!(attach_fabric(&spec, &opts).unwrap().config().slots, 2);
        drop((a, b));
        EmuFabric::destroy_in(&dir, "open-test").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
