//! Page sizes and the kernel's hugepage counters.

use std::fmt;

use memfd::HugetlbSize;
use std::path::PathBuf;

/// The size of the pages backing a [`Zone`](crate::Zone).
///
/// Hugepages cut TLB misses and give devices physically contiguous runs of
/// 2 MiB or 1 GiB; they must be reserved by the administrator first
/// (`scripts/setup-hugepages.sh --setup N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageSize {
    /// Ordinary 4 KiB pages: always available, no reservation needed.
    Small4K,
    /// 2 MiB hugepages (the default).
    Huge2M,
    /// 1 GiB hugepages (x86-64 with `pdpe1gb`, reserved at boot or early).
    Huge1G,
}

impl PageSize {
    /// The page size in bytes.
    pub const fn bytes(self) -> usize {
        1 << self.shift()
    }

    /// log2 of [`bytes`](Self::bytes).
    pub const fn shift(self) -> u32 {
        match self {
            PageSize::Small4K => 12,
            PageSize::Huge2M => 21,
            PageSize::Huge1G => 30,
        }
    }

    /// The page size whose log2 is `shift`, if it is one of ours.
    pub const fn from_shift(shift: u32) -> Option<PageSize> {
        match shift {
            12 => Some(PageSize::Small4K),
            21 => Some(PageSize::Huge2M),
            30 => Some(PageSize::Huge1G),
            _ => None,
        }
    }

    /// Whether this is a hugepage size.
    pub const fn is_huge(self) -> bool {
        !matches!(self, PageSize::Small4K)
    }

    /// The hugetlb page size of a memfd backed by these pages (`None`: an
    /// ordinary shmem memfd of 4 KiB pages).
    pub(crate) fn hugetlb(self) -> Option<HugetlbSize> {
        match self {
            PageSize::Small4K => None,
            PageSize::Huge2M => Some(HugetlbSize::Huge2MB),
            PageSize::Huge1G => Some(HugetlbSize::Huge1GB),
        }
    }

    /// The sysfs directory name of this size's hugepage pool.
    pub(crate) fn sysfs_dir(self) -> String {
        format!("hugepages-{}kB", self.bytes() / 1024)
    }

    /// The `--size` argument of `scripts/setup-hugepages.sh` for this size
    /// (empty for the script's default, 2 MiB).
    pub(crate) fn setup_size_arg(self) -> &'static str {
        match self {
            PageSize::Huge1G => " --size 1G",
            _ => "",
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageSize::Small4K => "4 KiB",
            PageSize::Huge2M => "2 MiB",
            PageSize::Huge1G => "1 GiB",
        })
    }
}

/// The kernel's counters for one hugepage size (system-wide, all NUMA nodes),
/// read from `/sys/kernel/mm/hugepages/hugepages-<size>kB/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugepageCounts {
    /// Pages in the pool (`nr_hugepages`).
    pub total: usize,
    /// Pages not yet allocated (`free_hugepages`), reserved ones included.
    pub free: usize,
    /// Free pages promised to existing mappings (`resv_hugepages`).
    pub reserved: usize,
    /// Pages allocated above `total` by overcommit (`surplus_hugepages`).
    pub surplus: usize,
}

impl HugepageCounts {
    /// Reads the counters of `size`; `None` for 4 KiB pages or a size this
    /// system does not offer.
    pub fn read(size: PageSize) -> Option<HugepageCounts> {
        if !size.is_huge() {
            return None;
        }
        let dir = PathBuf::from("/sys/kernel/mm/hugepages").join(size.sysfs_dir());
        let read = |name: &str| -> Option<usize> {
            std::fs::read_to_string(dir.join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(HugepageCounts {
            total: read("nr_hugepages")?,
            free: read("free_hugepages")?,
            reserved: read("resv_hugepages").unwrap_or(0),
            surplus: read("surplus_hugepages").unwrap_or(0),
        })
    }

    /// Pages a new zone can still get: free and not reserved.
    pub fn available(&self) -> usize {
        self.free.saturating_sub(self.reserved)
    }
}

/// Rounds `n` up to a multiple of the power of two `align`, or `None` on
/// overflow.
pub(crate) fn round_up(n: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_flags() {
        assert_eq!(PageSize::Small4K.bytes(), 4096);
        assert_eq!(PageSize::Huge2M.bytes(), 2 << 20);
        assert_eq!(PageSize::Huge1G.bytes(), 1 << 30);
        assert!(PageSize::Small4K.hugetlb().is_none());
        assert!(matches!(
            PageSize::Huge2M.hugetlb(),
            Some(HugetlbSize::Huge2MB)
        ));
        assert!(matches!(
            PageSize::Huge1G.hugetlb(),
            Some(HugetlbSize::Huge1GB)
        ));
        assert_eq!(PageSize::Huge2M.sysfs_dir(), "hugepages-2048kB");
        for p in [PageSize::Small4K, PageSize::Huge2M, PageSize::Huge1G] {
            assert_eq!(PageSize::from_shift(p.shift()), Some(p));
        }
        assert_eq!(PageSize::from_shift(13), None);
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up(0, 4096), Some(0));
        assert_eq!(round_up(1, 4096), Some(4096));
        assert_eq!(round_up(4096, 4096), Some(4096));
        assert_eq!(round_up(usize::MAX, 4096), None);
    }

    #[test]
    fn counts_of_4k_are_none() {
        assert_eq!(HugepageCounts::read(PageSize::Small4K), None);
    }
}
