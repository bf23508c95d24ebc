//! How a zone is backed: page size, fallback, locking.

use crate::page::PageSize;

/// How [`Zone::create`](crate::Zone::create) backs a zone.
///
/// The default asks for 2 MiB hugepages, fails with a clear error when too few
/// are reserved, and locks the zone in memory.
///
/// ```
/// use ntbdk_mempool::{PageSize, ZoneOptions};
///
/// let strict = ZoneOptions::default(); // 2 MiB hugepages or an error
/// assert_eq!(strict.page_size, PageSize::Huge2M);
/// let relaxed = ZoneOptions::huge_or_fallback(); // 2 MiB, else 4 KiB + a warning
/// assert!(relaxed.allow_fallback);
/// let small = ZoneOptions::no_huge(); // 4 KiB pages, no warning (like DPDK --no-huge)
/// assert_eq!(small.page_size, PageSize::Small4K);
/// ```
#[derive(Clone, Debug)]
pub struct ZoneOptions {
    /// The page size to back the zone with (default: [`PageSize::Huge2M`]).
    pub page_size: PageSize,
    /// When hugepages of `page_size` are short or unsupported: `false`
    /// (default) returns [`MemError::NoHugepages`](crate::MemError::NoHugepages);
    /// `true` backs the zone with 4 KiB pages instead and logs one warning.
    pub allow_fallback: bool,
    /// Lock the zone in memory with `mlock` (default `true`), so its pages are
    /// never swapped and their physical addresses stay put. Failure to lock
    /// (e.g. `RLIMIT_MEMLOCK`) is a warning, not an error.
    pub lock: bool,
    /// Whether a failure to lock is a warning (default `true`) or only a
    /// debug message (`false`: for memory whose swapping would cost only
    /// latency, never a stale physical address, such as the emulated NTB's
    /// windows, which a user without root cannot lock past the usual 8 MiB
    /// `RLIMIT_MEMLOCK`).
    pub warn_unlocked: bool,
}

impl Default for ZoneOptions {
    fn default() -> Self {
        ZoneOptions {
            page_size: PageSize::Huge2M,
            allow_fallback: false,
            lock: true,
            warn_unlocked: true,
        }
    }
}

impl ZoneOptions {
    /// 4 KiB pages, asked for directly (no warning): DPDK's `--no-huge`.
    pub fn no_huge() -> Self {
        ZoneOptions {
            page_size: PageSize::Small4K,
            ..Self::default()
        }
    }

    /// 2 MiB hugepages when enough are free, otherwise 4 KiB pages and one
    /// warning.
    pub fn huge_or_fallback() -> Self {
        ZoneOptions {
            allow_fallback: true,
            ..Self::default()
        }
    }
}
