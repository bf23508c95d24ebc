//! Checks made in sysfs and `/dev` **before** pci-driver opens a device, so
//! that each way it can fail gets its own message and fix (pci-driver would
//! report most of them as a bare OS error).
//!
//! Both roots are injectable ([`SysRoots`]) so tests run every error path
//! against a fake tree in a temporary directory. What is read, per the
//! kernel's `Documentation/ABI/testing/sysfs-bus-pci`:
//!
//! | path | meaning |
//! | --- | --- |
//! | `<sys>/bus/pci/devices/<BDF>/` | the device |
//! | `…/driver` | link to the bound driver (`…/drivers/vfio-pci`) |
//! | `…/iommu_group` | link to `…/kernel/iommu_groups/<N>`; absent without an IOMMU |
//! | `…/vendor`, `…/device` | IDs, `0x1af4` |
//! | `…/resource` | one line per resource, `start end flags` in hex; BAR *i* is line *i* |
//! | `<dev>/vfio/<N>` | the group's node that pci-driver opens |

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use super::{Bdf, VfioError};

/// The roots the checks look under: `/sys` and `/dev` on a real system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoots {
    /// Where sysfs is mounted.
    pub sys: PathBuf,
    /// Where device nodes are.
    pub dev: PathBuf,
}

impl Default for SysRoots {
    fn default() -> Self {
        SysRoots {
            sys: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
        }
    }
}

/// What the checks found: a device bound to vfio-pci whose group node opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prechecked {
    /// The device's sysfs directory (what pci-driver opens).
    pub path: PathBuf,
    /// Its IOMMU group.
    pub group: u32,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Sizes of BAR0..=BAR5 from `resource` (0 = absent).
    pub bar_len: [u64; 6],
}

impl SysRoots {
    /// The sysfs directory of `bdf`.
    pub fn device_path(&self, bdf: Bdf) -> PathBuf {
        self.sys.join("bus/pci/devices").join(bdf.to_string())
    }

    /// Checks, in order: the device exists, is bound to vfio-pci, has an
    /// IOMMU group whose node exists and opens read-write; then reads its
    /// IDs and BAR sizes.
    pub fn precheck(&self, bdf: Bdf) -> Result<Prechecked, VfioError> {
        let path = self.device_path(bdf);
        if !path.exists() {
            return Err(VfioError::NoDevice { bdf, path });
        }
        let driver = link_name(&path.join("driver"));
        if driver.as_deref() != Some("vfio-pci") {
            return Err(VfioError::NotBoundToVfio { bdf, driver });
        }
        let group = link_name(&path.join("iommu_group"))
            .and_then(|g| g.parse::<u32>().ok())
            .ok_or(VfioError::NoIommuGroup { bdf })?;
        let node = self.dev.join("vfio").join(group.to_string());
        if !node.exists() {
            return Err(VfioError::GroupNodeMissing {
                bdf,
                group,
                path: node,
            });
        }
        // Opened and closed again at once: pci-driver opens it for good.
        if let Err(source) = OpenOptions::new().read(true).write(true).open(&node) {
            return Err(group_open_failed(bdf, group, node, source));
        }
        let vendor = read_id(&path.join("vendor"))?;
        let device = read_id(&path.join("device"))?;
        let bar_len = read_bars(&path.join("resource"))?;
        Ok(Prechecked {
            path,
            group,
            vendor,
            device,
            bar_len,
        })
    }
}

/// The last component of the link at `link`, if it is one.
fn link_name(link: &Path) -> Option<String> {
    let target = std::fs::read_link(link).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

fn read(path: &Path) -> Result<String, VfioError> {
    std::fs::read_to_string(path).map_err(|source| VfioError::Sysfs {
        path: path.to_owned(),
        source,
    })
}

fn invalid(path: &Path, what: &str) -> VfioError {
    VfioError::Sysfs {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()),
    }
}

/// Reads an ID attribute (`0x1af4`).
fn read_id(path: &Path) -> Result<u16, VfioError> {
    let s = read(path)?;
    let hex = s.trim().trim_start_matches("0x");
    u16::from_str_radix(hex, 16).map_err(|_| invalid(path, "not a 16-bit hex ID"))
}

/// Reads the sizes of BAR0..=BAR5 from a `resource` attribute.
fn read_bars(path: &Path) -> Result<[u64; 6], VfioError> {
    let s = read(path)?;
    let mut out = [0u64; 6];
    for (i, line) in s.lines().take(6).enumerate() {
        let f: Vec<u64> = line
            .split_whitespace()
            .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| invalid(path, "a line is not three hex numbers"))?;
        if let [start, end, _flags] = f[..] {
            if end > start {
                // A BAR spanning the whole 64-bit space is no real BAR.
                out[i] = (end - start)
                    .checked_add(1)
                    .ok_or_else(|| invalid(path, "a BAR spans the whole address space"))?;
            }
        } else {
            return Err(invalid(path, "a line is not three hex numbers"));
        }
    }
    Ok(out)
}

/// Why the group's node could not be opened: in use elsewhere (`EBUSY`),
/// or not ours to open.
fn group_open_failed(bdf: Bdf, group: u32, path: PathBuf, source: std::io::Error) -> VfioError {
    if source.raw_os_error() == Some(libc::EBUSY) {
        VfioError::GroupBusy { bdf, group, path }
    } else {
        VfioError::GroupNotAccessible {
            bdf,
            group,
            path,
            source,
        }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake sysfs and /dev tree in a temporary directory.

    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};

    use super::SysRoots;
    use crate::hw::vfio::Bdf;

    /// A fake tree, removed on drop.
    pub struct FakeSys {
        /// The roots to check against.
        pub roots: SysRoots,
        top: PathBuf,
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.top);
        }
    }

    impl FakeSys {
        /// An empty tree with a unique name.
        pub fn new(tag: &str) -> FakeSys {
            let top = std::env::temp_dir().join(format!(
                "ntbdk-fake-sys-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&top);
            std::fs::create_dir_all(top.join("sys/bus/pci/devices")).unwrap();
            std::fs::create_dir_all(top.join("dev/vfio")).unwrap();
            FakeSys {
                roots: SysRoots {
                    sys: top.join("sys"),
                    dev: top.join("dev"),
                },
                top,
            }
        }

        /// Adds device `bdf` with IDs and BAR sizes, unbound, no group.
        pub fn add_device(&self, bdf: Bdf, vendor: u16, device: u16, bars: &[u64]) -> PathBuf {
            let d = self.roots.device_path(bdf);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
            std::fs::write(d.join("device"), format!("0x{device:04x}\n")).unwrap();
            let mut res = String::new();
            let mut base = 0xfe00_0000u64;
            for i in 0..13 {
                let len = bars.get(i).copied().unwrap_or(0);
                if len == 0 {
                    res.push_str("0x0000000000000000 0x0000000000000000 0x0000000000000000\n");
                } else {
                    res.push_str(&format!(
                        "0x{base:016x} 0x{:016x} 0x0000000000040200\n",
                        base + len - 1
                    ));
                    base += len.next_multiple_of(1 << 20);
                }
            }
            std::fs::write(d.join("resource"), res).unwrap();
            d
        }

        /// Binds `bdf` to `driver` (a link, as sysfs has).
        pub fn bind(&self, bdf: Bdf, driver: &str) {
            let drv = self.roots.sys.join("bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&drv).unwrap();
            let link = self.roots.device_path(bdf).join("driver");
            let _ = std::fs::remove_file(&link);
            symlink(&drv, link).unwrap();
        }

        /// Puts `bdf` in IOMMU group `group`, with or without its node.
        pub fn group(&self, bdf: Bdf, group: u32, node: bool) -> PathBuf {
            let g = self
                .roots
                .sys
                .join("kernel/iommu_groups")
                .join(group.to_string());
            std::fs::create_dir_all(&g).unwrap();
            symlink(&g, self.roots.device_path(bdf).join("iommu_group")).unwrap();
            let n = self.roots.dev.join("vfio").join(group.to_string());
            if node {
                std::fs::write(&n, b"").unwrap();
            }
            n
        }

        /// The top of the tree.
        pub fn top(&self) -> &Path {
            &self.top
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSys;
    use super::*;

    const BDF: &str = "0000:00:03.0";

    #[test]
    fn every_failure_names_its_fix() {
        let bdf: Bdf = BDF.parse().unwrap();
        let fs = FakeSys::new("precheck");
        let r = &fs.roots;

        let e = r.precheck(bdf).unwrap_err();
        assert!(matches!(e, VfioError::NoDevice { .. }), "{e}");
        assert!(e.to_string().contains("lspci"), "{e}");

        fs.add_device(bdf, 0x1af4, 0x1110, &[256, 0, 1 << 20]);
        let e = r.precheck(bdf).unwrap_err();
        assert!(
            matches!(e, VfioError::NotBoundToVfio { driver: None, .. }),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("ntbdk-devbind --bind=vfio-pci 0000:00:03.0"),
            "{e}"
        );

        fs.bind(bdf, "ivshmem");
        let e = r.precheck(bdf).unwrap_err();
        assert!(e.to_string().contains("driver ivshmem"), "{e}");

        fs.bind(bdf, "vfio-pci");
        let e = r.precheck(bdf).unwrap_err();
        assert!(matches!(e, VfioError::NoIommuGroup { .. }), "{e}");
        assert!(e.to_string().contains("intel_iommu=on"), "{e}");

        let node = fs.group(bdf, 7, false);
        let e = r.precheck(bdf).unwrap_err();
        assert!(
            matches!(e, VfioError::GroupNodeMissing { group: 7, .. }),
            "{e}"
        );

        // A node that cannot be opened read-write (a directory: even root
        // cannot open it for writing).
        std::fs::create_dir(&node).unwrap();
        let e = r.precheck(bdf).unwrap_err();
        assert!(
            matches!(e, VfioError::GroupNotAccessible { group: 7, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("--user NAME"), "{e}");
        // A group another process holds (EBUSY) says so, not "run as root".
        let busy = group_open_failed(
            bdf,
            7,
            node.clone(),
            std::io::Error::from_raw_os_error(libc::EBUSY),
        );
        assert!(
            matches!(busy, VfioError::GroupBusy { group: 7, .. }),
            "{busy}"
        );
        assert!(busy.to_string().contains("another process"), "{busy}");
        assert!(!busy.to_string().contains("root"), "{busy}");

        std::fs::remove_dir(&node).unwrap();
        std::fs::write(&node, b"").unwrap();
        let ok = r.precheck(bdf).unwrap();
        assert_eq!((ok.vendor, ok.device, ok.group), (0x1af4, 0x1110, 7));
        assert_eq!(ok.bar_len, [256, 0, 1 << 20, 0, 0, 0]);
        assert!(ok.path.starts_with(fs.top()));
    }

    #[test]
    fn garbage_attributes_are_reported_with_their_path() {
        let bdf: Bdf = BDF.parse().unwrap();
        let fs = FakeSys::new("garbage");
        let d = fs.add_device(bdf, 0x1af4, 0x1110, &[256]);
        fs.bind(bdf, "vfio-pci");
        fs.group(bdf, 3, true);
        std::fs::write(d.join("vendor"), "nonsense").unwrap();
        let e = fs.roots.precheck(bdf).unwrap_err();
        assert!(e.to_string().contains("vendor"), "{e}");
        // A BAR line spanning the whole 64-bit space: an error, not an
        // overflow.
        std::fs::write(d.join("vendor"), "0x1af4").unwrap();
        let whole = "0x0000000000000000 0xffffffffffffffff 0x0000000000040200\n";
        std::fs::write(d.join("resource"), whole).unwrap();
        let e = fs.roots.precheck(bdf).unwrap_err();
        assert!(e.to_string().contains("whole address space"), "{e}");
    }
}
