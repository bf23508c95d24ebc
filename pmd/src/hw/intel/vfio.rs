//! Opening a real Intel NTB bound to vfio-pci as `IntelNtb<MappedBar>`.
//!
//! - BAR0 (registers) mapped through vfio; config space read from sysfs
//!   `config` (revision, gen3 port definition and link status);
//! - BAR2/BAR4 (the peer windows) mapped **write-combining** through sysfs
//!   `resource2_wc` / `resource4_wc` where the kernel offers them (a
//!   prefetchable BAR), else through vfio, uncached, with one warning: DPDK's
//!   guide reports more than 10x from WC (`dpdk:doc/guides/rawdevs/ntb.rst`);
//! - the BARs' bus addresses from sysfs `resource` (the translation limit
//!   registers take BAR start + size);
//! - inbound memory: hugepage zones of ntbdk-mempool (4 KiB pages if none
//!   are reserved), DMA-mapped through the function's vfio container at IOVAs
//!   aligned to the BAR size ([`IovaAllocator`]).
//!
//! Not run on hardware (no machine here has an Intel NTB): the model tests
//! drive the same `IntelNtb` code; this file only gathers the mappings.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use ntbdk_mempool::{Zone, ZoneOptions};
use pci_driver::device::PciDevice;
use pci_driver::regions::Permissions;

use super::memory::{Aperture, InboundMemory, Outbound};
use super::regs::{BAR0_MIN_LEN, VENDOR_INTEL};
use super::{IntelConfig, IntelError, IntelNtb, IovaAllocator};
use crate::hw::emu::SharedRegion;
use crate::hw::mmio::{Mmio, check_access};
use crate::hw::vfio::{Bdf, MappedBar, SysRoots, VfioError, VfioFunction};
use crate::hw::{HwError, LocalWindow, Result, WriteCombining};

/// Config space through sysfs `config` (reads; root sees all 4 KiB).
#[derive(Debug)]
struct SysfsConfig {
    file: File,
}

impl Mmio for SysfsConfig {
    fn len(&self) -> usize {
        4096
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        check_access(offset, 4, 4096)?;
        let mut b = [0u8; 4];
        self.file
            .read_exact_at(&mut b, offset as u64)
            .map_err(|source| HwError::Io {
                what: format!(
                    "reading config space at {offset:#x} (sysfs gives a user who is not root \
                     the first 64 bytes only: run as root; as root, a short read means no \
                     PCIe extended config space)"
                ),
                source,
            })?;
        Ok(u32::from_le_bytes(b))
    }
    fn write32(&self, offset: usize, _value: u32) -> Result<()> {
        Err(HwError::Invalid(format!(
            "config space at {offset:#x} is read-only here"
        )))
    }
    fn read64(&self, offset: usize) -> Result<u64> {
        check_access(offset, 8, 4096)?;
        Ok(u64::from(self.read32(offset)?) | (u64::from(self.read32(offset + 4)?) << 32))
    }
    fn write64(&self, offset: usize, value: u64) -> Result<()> {
        self.write32(offset, value as u32)
    }
}

/// Start addresses of BAR0..=BAR5 from sysfs `resource`.
fn bar_starts(path: &Path) -> Result<[u64; 6], VfioError> {
    let s = std::fs::read_to_string(path).map_err(|source| VfioError::Sysfs {
        path: path.to_owned(),
        source,
    })?;
    let mut out = [0u64; 6];
    for (i, line) in s.lines().take(6).enumerate() {
        let start = line.split_whitespace().next().unwrap_or("0");
        out[i] = u64::from_str_radix(start.trim_start_matches("0x"), 16).map_err(|_| {
            VfioError::Sysfs {
                path: path.to_owned(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "a line does not start with a hex address",
                ),
            }
        })?;
    }
    Ok(out)
}

/// Maps BAR `bar` write-combining through `resource<bar>_wc`, if offered.
fn map_wc(dev: &Path, bar: usize, len: usize) -> Option<SharedRegion> {
    let path = dev.join(format!("resource{bar}_wc"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .ok()?;
    SharedRegion::map_fd(&file, len, &path.display().to_string()).ok()
}

/// A BAR mapping as an outbound window.
struct Bar {
    region: SharedRegion,
    wc: Option<Arc<WriteCombining>>,
    bus: u64,
}

struct VfioOutbound {
    bars: [Bar; 2],
}

impl Outbound for VfioOutbound {
    fn bar_size(&self, mw: usize) -> usize {
        self.bars[mw.min(1)].region.len()
    }
    fn bar_bus_address(&self, mw: usize) -> u64 {
        self.bars[mw.min(1)].bus
    }
    fn aperture(&self, mw: usize) -> Result<Aperture, IntelError> {
        let b = self.bars.get(mw).ok_or(IntelError::NoSuchWindow { mw })?;
        let p = b.region.ptr_at(0, b.region.len())?;
        let p = NonNull::new(p).expect("a mapping is not at address 0");
        // SAFETY: the whole BAR is mapped read-write at `p` (page aligned)
        // while the region's keepalive lives; only window handles reach it.
        Ok(unsafe { Aperture::from_raw(p, b.region.len(), b.region.keepalive(), b.wc.clone()) })
    }
}

/// A zone DMA-mapped at an IOVA; unmapped and freed on drop.
struct DmaZone {
    function: Arc<VfioFunction>,
    /// Freed after the IOVA is unmapped (fields drop after `drop`).
    _zone: Zone,
    iova: u64,
    len: usize,
}

impl Drop for DmaZone {
    fn drop(&mut self) {
        if let Err(e) = self.function.pci().iommu().unmap(self.iova, self.len) {
            tracing::warn!(iova = self.iova, "unmapping an NTB window's memory: {e}");
        }
    }
}

struct VfioInbound {
    function: Arc<VfioFunction>,
    iova: IovaAllocator,
    /// The pages of the zones allocated so far: `NONE_YET`, `ALL_HUGE` or
    /// `SOME_SMALL` (a zone that fell back to 4 KiB pages).
    pages: AtomicU8,
}

const NONE_YET: u8 = 0;
const ALL_HUGE: u8 = 1;
const SOME_SMALL: u8 = 2;

impl InboundMemory for VfioInbound {
    fn allocate(&self, size: usize, align: u64) -> Result<LocalWindow, IntelError> {
        let zone = Zone::create("intel-ntb-window", size, &ZoneOptions::huge_or_fallback())
            .map_err(HwError::from)?;
        let pages = if zone.is_huge() { ALL_HUGE } else { SOME_SMALL };
        self.pages.fetch_max(pages, Ordering::Relaxed);
        let iova = self.iova.alloc(size, align)?;
        // SAFETY: `size` bytes at the zone's start are ours, mapped and
        // locked for as long as the `DmaZone` below (which unmaps the IOVA
        // before the zone is freed) lives.
        unsafe {
            self.function
                .pci()
                .iommu()
                .map(iova, size, zone.as_ptr(), Permissions::ReadWrite)
        }
        .map_err(|source| {
            self.iova.give_back(iova, size);
            // vfio's type1 backend pins the pages against RLIMIT_MEMLOCK
            // and fails with ENOMEM past it (`vfio_pin_pages_remote`), which
            // reads like a shortage of memory.
            let hint = if source.raw_os_error() == Some(libc::ENOMEM) {
                let limit =
                    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
                        .map_or("unknown".into(), |(soft, _)| {
                            if soft == nix::sys::resource::RLIM_INFINITY {
                                "unlimited".into()
                            } else {
                                format!("{} KiB", soft / 1024)
                            }
                        });
                format!(
                    " (vfio pins DMA memory against the locked-memory limit, {limit} here: raise \
                     it, `ulimit -l`, or see `ntbdk-devbind --user` for the limit to set)"
                )
            } else {
                String::new()
            };
            HwError::Io {
                what: format!("DMA-mapping {size:#x} bytes at IOVA {iova:#x}{hint}"),
                source,
            }
        })?;
        let base = zone.as_ptr();
        let keep = Arc::new(DmaZone {
            function: self.function.clone(),
            _zone: zone,
            iova,
            len: size,
        });
        // SAFETY: the zone maps at least `size` bytes at `base`, page aligned,
        // kept (and DMA-mapped) by `keep`.
        Ok(unsafe { LocalWindow::from_raw(base, size, iova, keep) })
    }

    fn on_hugepages(&self) -> Option<bool> {
        match self.pages.load(Ordering::Relaxed) {
            NONE_YET => None,
            p => Some(p == ALL_HUGE),
        }
    }
}

/// Opens the Intel NTB `bdf` (bound to vfio-pci) and brings it up.
pub fn open(
    bdf: Bdf,
    roots: &SysRoots,
    cfg: &IntelConfig,
) -> Result<IntelNtb<MappedBar>, VfioError> {
    let info = roots.precheck(bdf)?;
    let fabric = |source: HwError| VfioError::Fabric { bdf, source };
    let f = Arc::new(VfioFunction::open(
        bdf,
        roots,
        VENDOR_INTEL,
        info.device,
        "Intel NTB",
    )?);
    let config = File::open(info.path.join("config")).map_err(|source| VfioError::Sysfs {
        path: info.path.join("config"),
        source,
    })?;
    let bar0 = f.map_bar(0, BAR0_MIN_LEN as u64, "Intel NTB register block")?;
    let starts = bar_starts(&info.path.join("resource"))?;
    let mut bars = Vec::new();
    for (mw, index) in [2usize, 4].into_iter().enumerate() {
        let len = info.bar_len[index];
        let bar = match map_wc(&info.path, index, len as usize) {
            Some(region) => Bar {
                region,
                wc: Some(Arc::new(WriteCombining::new())),
                bus: starts[index],
            },
            None => {
                tracing::warn!(
                    %bdf,
                    "BAR{index} (memory window {mw}) is mapped uncached: sysfs offers no \
                     resource{index}_wc (the BAR is not prefetchable, or not as root); \
                     expect far lower bandwidth than with write-combining"
                );
                let m = f.map_bar(index, 4096, "Intel NTB memory window")?;
                Bar {
                    region: m.shared_region(),
                    wc: None,
                    bus: starts[index],
                }
            }
        };
        bars.push(bar);
    }
    let [b2, b4]: [Bar; 2] = bars.try_into().ok().expect("two windows");
    let ranges = f.pci().iommu().valid_iova_ranges().to_vec();
    let range = ranges
        .into_iter()
        .max_by_key(|r| r.end - r.start)
        .unwrap_or(1 << 32..1 << 40);
    let inbound = VfioInbound {
        function: f.clone(),
        iova: IovaAllocator::new(range.start.max(1 << 20), range.end),
        pages: AtomicU8::new(NONE_YET),
    };
    IntelNtb::new(
        bar0,
        Arc::new(SysfsConfig { file: config }),
        Box::new(VfioOutbound { bars: [b2, b4] }),
        Box::new(inbound),
        cfg.clone(),
    )
    .map_err(|e| fabric(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::vfio::sysfs_fake::FakeSys;

    #[test]
    fn bar_starts_come_from_sysfs_resource() {
        let fs = FakeSys::new("intel-resource");
        let bdf: Bdf = "0000:00:05.0".parse().unwrap();
        let d = fs.add_device(bdf, 0x8086, 0x201c, &[64 << 10, 0, 1 << 20, 0, 1 << 20]);
        let s = bar_starts(&d.join("resource")).unwrap();
        assert_eq!(s[0], 0xfe00_0000);
        assert!(s[2] > s[0] && s[4] > s[2]);
        assert_eq!(s[1], 0);
        std::fs::write(d.join("resource"), "nonsense\n").unwrap();
        assert!(bar_starts(&d.join("resource")).is_err());
        assert!(
            map_wc(&d, 2, 4096).is_none(),
            "no resource2_wc in the fake tree"
        );
    }

    #[test]
    fn sysfs_config_reads_little_endian_dwords_and_refuses_writes() {
        let fs = FakeSys::new("intel-config");
        let p = fs.top().join("config");
        let mut bytes = vec![0u8; 4096];
        bytes[..4].copy_from_slice(&0x201C_8086u32.to_le_bytes());
        bytes[0xD4] = 0x11;
        std::fs::write(&p, &bytes).unwrap();
        let c = SysfsConfig {
            file: File::open(&p).unwrap(),
        };
        assert_eq!(c.read32(0).unwrap(), 0x201C_8086);
        assert_eq!(c.read32(0xD4).unwrap() & 0xFF, 0x11);
        assert!(c.write32(0, 1).is_err());
        assert!(c.read32(4096).is_err());
    }
}
