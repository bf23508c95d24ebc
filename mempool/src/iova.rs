//! I/O virtual addresses: what a device must be told to reach a byte of a
//! zone.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::error::MemError;

/// How devices address memory, as in DPDK's `--iova-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IovaMode {
    /// Physical addresses, for devices without an IOMMU in front of them.
    /// Read from `/proc/self/pagemap`, which needs root (`CAP_SYS_ADMIN`).
    Pa,
    /// Virtual addresses, for devices behind an IOMMU programmed (e.g. by
    /// vfio) to map this process's virtual addresses.
    Va,
}

impl IovaMode {
    /// The mode a device driver would pick here: [`IovaMode::Va`] when the
    /// system has an IOMMU (IOMMU groups exist) or physical addresses are out
    /// of reach (not root), [`IovaMode::Pa`] otherwise.
    pub fn detect() -> IovaMode {
        let iommu = std::fs::read_dir("/sys/kernel/iommu_groups")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        let root = nix::unistd::geteuid().is_root();
        if iommu || !root {
            IovaMode::Va
        } else {
            IovaMode::Pa
        }
    }
}

/// `/proc/self/pagemap` entry bits.
const PM_PRESENT: u64 = 1 << 63;
const PM_PFN_MASK: u64 = (1 << 55) - 1;

/// The size pagemap indexes by (the base page size, also for hugepages).
const BASE_PAGE: usize = 4096;

/// The physical address of virtual address `va` of this process.
///
/// # Errors
/// [`MemError::PaLookupNeedsRoot`] when the kernel hides page frame numbers
/// (they read as 0 without `CAP_SYS_ADMIN`); [`MemError::PageNotPresent`]
/// when the page is not resident; [`MemError::Io`] when pagemap is unreadable.
pub(crate) fn virt_to_phys(va: usize) -> Result<u64, MemError> {
    let pagemap =
        File::open("/proc/self/pagemap").map_err(|e| MemError::io("open /proc/self/pagemap", e))?;
    let mut entry = [0u8; 8];
    let at = (va / BASE_PAGE * 8) as u64;
    pagemap
        .read_exact_at(&mut entry, at)
        .map_err(|e| MemError::io(format!("read /proc/self/pagemap at {at:#x}"), e))?;
    let entry = u64::from_le_bytes(entry);
    if entry & PM_PRESENT == 0 {
        return Err(MemError::PageNotPresent { offset: va });
    }
    let pfn = entry & PM_PFN_MASK;
    if pfn == 0 {
        return Err(MemError::PaLookupNeedsRoot);
    }
    Ok(pfn * BASE_PAGE as u64 + (va % BASE_PAGE) as u64)
}
