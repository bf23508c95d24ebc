//! The errors of memory zones and IOVA look-ups.

use crate::page::PageSize;

/// Why a memory zone could not be created, attached or translated.
///
/// Every message says what failed, why, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Too few hugepages of the requested size are free to back the zone.
    #[error(
        "not enough {page_size} hugepages: need {needed_pages}, {free_pages} free: \
         run scripts/setup-hugepages.sh --setup {suggested_total}{size_arg}, \
         or allow the 4 KiB fallback (ZoneOptions::huge_or_fallback)",
        size_arg = page_size.setup_size_arg()
    )]
    NoHugepages {
        /// The hugepage size asked for.
        page_size: PageSize,
        /// How many pages of that size the zone needs.
        needed_pages: usize,
        /// How many were free (not allocated nor reserved) when it was tried.
        free_pages: usize,
        /// The total reservation that would cover this zone:
        /// the current one plus the shortfall.
        suggested_total: usize,
    },

    /// This kernel or CPU offers no hugepages of the requested size at all.
    #[error(
        "this system offers no {page_size} hugepages \
         (no /sys/kernel/mm/hugepages/{dir}): use 2 MiB pages, \
         or allow the 4 KiB fallback (ZoneOptions::huge_or_fallback)",
        dir = page_size.sysfs_dir()
    )]
    HugepagesUnsupported {
        /// The hugepage size asked for.
        page_size: PageSize,
    },

    /// A system call failed; `what` says which one and on what.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. `memfd_create("ntbdk:pool")`.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The argument of a call is unusable (empty name, zero length…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The file handed to [`Zone::attach`](crate::Zone::attach) is not a zone
    /// created by [`Zone::create`](crate::Zone::create), or it is damaged.
    #[error("not a valid ntbdk memory zone: {why}")]
    BadZone {
        /// What the validation found.
        why: String,
    },

    /// Physical addresses were asked for without the privilege to read them.
    #[error(
        "physical address look-up needs root (CAP_SYS_ADMIN): /proc/self/pagemap \
         hides page frame numbers from unprivileged processes; run as root, or \
         use IovaMode::Va (devices behind an IOMMU)"
    )]
    PaLookupNeedsRoot,

    /// The page holding an offset is not resident, so it has no physical
    /// address (zones are populated and locked, so this means the lock failed
    /// and the page was reclaimed).
    #[error(
        "page at offset {offset:#x} is not resident: lock the zone in memory \
         (raise RLIMIT_MEMLOCK, e.g. `ulimit -l unlimited`)"
    )]
    PageNotPresent {
        /// The offset asked for.
        offset: usize,
    },

    /// An offset lies outside the zone.
    #[error("offset {offset:#x} is outside the zone ({len:#x} usable bytes)")]
    OutOfRange {
        /// The offset asked for.
        offset: usize,
        /// The zone's usable length.
        len: usize,
    },
}

impl MemError {
    /// An [`MemError::Io`] from an `io::Error`.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

impl MemError {
    /// A hugepage shortage said for a zone that falls back to 4 KiB pages:
    /// what was short and how to reserve more, without the advice to allow
    /// the fallback it is taking. `None` for other errors.
    pub(crate) fn hugepage_shortfall(&self) -> Option<String> {
        match self {
            MemError::NoHugepages {
                page_size,
                needed_pages,
                free_pages,
                suggested_total,
            } => Some(format!(
                "not enough {page_size} hugepages: need {needed_pages}, {free_pages} free \
                 (to use hugepages: scripts/setup-hugepages.sh --setup {suggested_total}{})",
                page_size.setup_size_arg()
            )),
            MemError::HugepagesUnsupported { page_size } => {
                Some(format!("this system offers no {page_size} hugepages"))
            }
            _ => None,
        }
    }
}
