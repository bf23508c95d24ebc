//! Named, page-backed, shareable memory zones.

mod header;
mod options;

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

pub use options::ZoneOptions;

use nix::errno::Errno;

use crate::error::MemError;
use crate::iova::{self, IovaMode};
use crate::page::{HugepageCounts, PageSize, round_up};
use crate::sys::{self, Mapping};
use header::{HEADER_BYTES, HeaderInfo, MAX_NAME};

/// Prefix of the memfd name of every zone (`/memfd:ntbdk:<name>` in
/// `/proc/<pid>/fd`).
const MEMFD_PREFIX: &str = "ntbdk:";

/// A named, page-backed, shared-mappable memory region, reserved up front.
///
/// A zone is a `memfd` (with `MFD_HUGETLB` for hugepages) sized, allocated
/// (`fallocate`), sealed against resizing, mapped shared, pre-faulted and
/// locked before [`create`](Zone::create) returns: a missing hugepage is a
/// clear error now, never a SIGBUS later. Its bytes start zeroed.
///
/// The last 4 KiB of the file hold a small header (magic, version, sizes,
/// name) that lets another process validate the zone when it
/// [attaches](Zone::attach) it; [`as_ptr`](Zone::as_ptr) starts at a page
/// boundary and [`len`](Zone::len) bytes from it are free for the caller.
///
/// # Sharing with another process
///
/// A zone is reached from another process in one of two ways:
///
/// * **pass the descriptor**: send [`as_fd`](Zone::as_fd) over a Unix socket
///   with `SCM_RIGHTS`; the receiver calls [`Zone::attach`] on it;
/// * **open it by name**: `/proc/<pid>/fd/<fd>` of the creating process, with
///   [`Zone::open_from_pid`] (the opener needs the same user, or root, and
///   the creator must still be alive and holding the zone).
///
/// Both map the same pages. What the processes keep in a zone must be plain
/// data (offsets, not pointers): each maps it at a different address.
///
/// # Example
///
/// ```
/// use ntbdk_mempool::{IovaMode, Zone, ZoneOptions};
///
/// # fn main() -> Result<(), ntbdk_mempool::MemError> {
/// // 2 MiB hugepages when reserved, otherwise 4 KiB pages and a warning.
/// let zone = Zone::create("doc-zone", 64 * 1024, &ZoneOptions::huge_or_fallback())?;
/// assert!(zone.len() >= 64 * 1024);
/// assert_eq!(zone.as_ptr() as usize % 4096, 0);
///
/// // SAFETY: the zone is ours alone and `len()` bytes long.
/// let bytes = unsafe { std::slice::from_raw_parts_mut(zone.as_ptr(), zone.len()) };
/// assert!(bytes.iter().all(|&b| b == 0));
/// bytes[0] = 42;
///
/// // A second mapping of the same pages (as another process would get).
/// let fd = zone.as_fd().try_clone_to_owned().unwrap();
/// let again = Zone::attach(fd)?;
/// // SAFETY: in bounds; nobody writes concurrently.
/// assert_eq!(unsafe { *again.as_ptr() }, 42);
///
/// // Under an IOMMU the device address is the virtual address.
/// assert_eq!(zone.iova(8, IovaMode::Va)?, zone.as_ptr() as u64 + 8);
/// # Ok(())
/// # }
/// ```
pub struct Zone {
    /// The shared mapping of the whole file, header included; unmapped on drop.
    map: Mapping,
    len: usize,
    name: String,
    page_size: PageSize,
    fd: OwnedFd,
}

// SAFETY: a Zone is a mapping plus a descriptor; it hands out only raw
// pointers, so moving or sharing the handle between threads is sound (what is
// done with the bytes is the caller's business, as with any shared memory).
unsafe impl Send for Zone {}
// SAFETY: as above; no method mutates the handle through `&self`.
unsafe impl Sync for Zone {}

impl Zone {
    /// Creates a zone of at least `len` bytes named `name`, backed as `opts`
    /// says.
    ///
    /// The size is rounded up so that the zone plus its 4 KiB header fill
    /// whole pages: a 4 KiB zone wastes one small page, a hugepage zone at
    /// most one hugepage. The name (1 to 200 bytes, no NUL) shows in
    /// `/proc/<pid>/fd` and `/proc/<pid>/maps` as `/memfd:ntbdk:<name>`;
    /// names need not be unique.
    ///
    /// # Errors
    /// [`MemError::NoHugepages`] (with the number of pages needed and free and
    /// how to reserve them) or [`MemError::HugepagesUnsupported`], unless
    /// `opts.allow_fallback`; [`MemError::InvalidArgument`] for an empty or
    /// too long name or a zero length; [`MemError::Io`] when memory runs out.
    pub fn create(name: &str, len: usize, opts: &ZoneOptions) -> Result<Zone, MemError> {
        if name.is_empty() || name.len() > MAX_NAME || name.contains('\0') {
            return Err(MemError::InvalidArgument(format!(
                "zone name {name:?}: must be 1 to {MAX_NAME} bytes without NUL"
            )));
        }
        if len == 0 {
            return Err(MemError::InvalidArgument(format!(
                "zone {name:?}: length must not be zero"
            )));
        }
        match Self::create_backed(name, len, opts.page_size, opts) {
            Err(e @ (MemError::NoHugepages { .. } | MemError::HugepagesUnsupported { .. }))
                if opts.allow_fallback =>
            {
                let why = e.hugepage_shortfall().unwrap_or_else(|| e.to_string());
                tracing::warn!(zone = name, "{why}; falling back to 4 KiB pages");
                Self::create_backed(name, len, PageSize::Small4K, opts)
            }
            r => r,
        }
    }

    /// Creates the zone with exactly `page_size` pages.
    fn create_backed(
        name: &str,
        len: usize,
        page_size: PageSize,
        opts: &ZoneOptions,
    ) -> Result<Zone, MemError> {
        let too_big =
            || MemError::InvalidArgument(format!("zone {name:?}: {len} bytes is too large"));
        let map_len = len
            .checked_add(HEADER_BYTES)
            .and_then(|n| round_up(n, page_size.bytes()))
            .filter(|&n| i64::try_from(n).is_ok())
            .ok_or_else(too_big)?;
        let counts = HugepageCounts::read(page_size);
        if page_size.is_huge() && counts.is_none() {
            return Err(MemError::HugepagesUnsupported { page_size });
        }

        let memfd_name = format!("{MEMFD_PREFIX}{name}");
        let memfd = sys::memfd_create(&memfd_name, page_size).map_err(|e| {
            if page_size.is_huge() && e.raw_os_error() == Some(Errno::EINVAL as i32) {
                MemError::HugepagesUnsupported { page_size }
            } else {
                MemError::io(format!("memfd_create({memfd_name:?})"), e)
            }
        })?;
        let fd = memfd.as_file().as_fd();
        sys::ftruncate(fd, map_len)
            .map_err(|e| MemError::io(format!("ftruncate(zone {name:?}, {map_len})"), e))?;

        // Reserve every page now: a hugetlb memfd is happy to exist without
        // pages and would SIGBUS on first touch.
        if let Err(e) = sys::fallocate(fd, map_len) {
            let short = matches!(
                e.raw_os_error().map(Errno::from_raw),
                Some(Errno::ENOSPC | Errno::ENOMEM)
            );
            return Err(if page_size.is_huge() && short {
                let needed_pages = map_len / page_size.bytes();
                let c = HugepageCounts::read(page_size)
                    .or(counts)
                    .unwrap_or(HugepageCounts {
                        total: 0,
                        free: 0,
                        reserved: 0,
                        surplus: 0,
                    });
                let free_pages = c.available();
                MemError::NoHugepages {
                    page_size,
                    needed_pages,
                    free_pages,
                    suggested_total: c.total + needed_pages.saturating_sub(free_pages).max(1),
                }
            } else {
                MemError::io(
                    format!("fallocate(zone {name:?}, {map_len} bytes of {page_size} pages)"),
                    e,
                )
            });
        }
        sys::seal(&memfd).map_err(|e| MemError::io(format!("seal zone {name:?}"), e))?;
        let fd = OwnedFd::from(memfd.into_file());

        let map = Mapping::shared(&fd, map_len)
            .map_err(|e| MemError::io(format!("mmap(zone {name:?}, {map_len})"), e))?;
        let info = HeaderInfo {
            page_size,
            usable_len: map_len - HEADER_BYTES,
            name: name.to_owned(),
        };
        // SAFETY: `map` is our fresh writable mapping of `map_len` bytes,
        // page-aligned and not yet visible to anyone else.
        unsafe { header::write(map.ptr(), map_len, &info) };
        let zone = Zone {
            map,
            len: info.usable_len,
            name: info.name,
            page_size,
            fd,
        };
        if opts.lock {
            zone.lock(opts.warn_unlocked);
        }
        Ok(zone)
    }

    /// Maps a zone created elsewhere (typically received from another process
    /// over a Unix socket with `SCM_RIGHTS`) after validating it: it must be
    /// a sealed ntbdk memfd whose header (magic, version, page size, sizes)
    /// matches the file. The mapping is not locked again: the pages are
    /// already allocated and locked by the creator's mapping.
    ///
    /// # Errors
    /// [`MemError::BadZone`] saying what did not match; [`MemError::Io`] when
    /// the descriptor cannot be inspected or mapped.
    pub fn attach(fd: OwnedFd) -> Result<Zone, MemError> {
        let raw = fd.as_raw_fd();
        let bad = |why: String| MemError::BadZone { why };
        let target = sys::fd_target(fd.as_fd())
            .map_err(|e| MemError::io(format!("readlink /proc/self/fd/{raw}"), e))?;
        let expected = format!("/memfd:{MEMFD_PREFIX}");
        if !target.starts_with(&expected) {
            return Err(bad(format!(
                "fd {raw} is {target:?}, not a zone memfd ({expected}<name>)"
            )));
        }
        let (sealed, seals) = sys::zone_seals(fd.as_fd())
            .map_err(|e| MemError::io(format!("F_GET_SEALS on fd {raw}"), e))?;
        if !sealed {
            return Err(bad(format!(
                "fd {raw} is not sealed against resizing (seals {:#x})",
                seals.bits()
            )));
        }
        let st = sys::fstat(fd.as_fd()).map_err(|e| MemError::io(format!("fstat fd {raw}"), e))?;
        let blk = sys::page_bytes(fd.as_fd())
            .map_err(|e| MemError::io(format!("fstatfs fd {raw}"), e))?;
        let page_size = (blk.is_power_of_two())
            .then(|| PageSize::from_shift(blk.trailing_zeros()))
            .flatten()
            .ok_or_else(|| bad(format!("fd {raw} has an unknown page size of {blk} bytes")))?;
        let map_len = usize::try_from(st.st_size).unwrap_or(0);
        if map_len < HEADER_BYTES + 4096 || map_len % page_size.bytes() != 0 {
            return Err(bad(format!(
                "fd {raw} is {map_len} bytes, not a whole number of {page_size} pages \
                 holding a zone"
            )));
        }
        let map = Mapping::shared(&fd, map_len)
            .map_err(|e| MemError::io(format!("mmap(fd {raw}, {map_len})"), e))?;
        // SAFETY: `map` maps `map_len >= HEADER_BYTES` readable bytes. On an
        // error it is dropped (unmapped) on the way out.
        let info = unsafe { header::read(map.ptr(), map_len, page_size) }?;
        let zone = Zone {
            map,
            len: info.usable_len,
            name: info.name,
            page_size,
            fd,
        };
        Ok(zone)
    }

    /// Opens the zone that process `pid` holds at descriptor `fd`, through
    /// `/proc/<pid>/fd/<fd>`, and [attaches](Zone::attach) it.
    ///
    /// This is the zone's well-defined name: the creator publishes its pid and
    /// `zone.as_fd().as_raw_fd()` (in a file, an environment variable, a
    /// command line) and keeps the zone alive while others open it. The
    /// caller needs the right to inspect `pid` (same user, or root).
    ///
    /// # Errors
    /// [`MemError::Io`] when the path cannot be opened (the process exited,
    /// closed the fd, or belongs to another user); those of [`Zone::attach`].
    pub fn open_from_pid(pid: i32, fd: RawFd) -> Result<Zone, MemError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = format!("/proc/{pid}/fd/{fd}");
        let io = |what: &str, e| {
            MemError::io(
                format!(
                    "{what} {path} (the process must be alive, hold the zone at that fd, \
                     and be ours to inspect)"
                ),
                e,
            )
        };
        // What the descriptor names is checked before its file is opened
        // (opening a FIFO, or a file on a stalled mount, could block), on a
        // handle of our own (O_PATH: no open of the file itself), so the
        // owner cannot swap the descriptor between the check and the open.
        let named = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_PATH)
            .open(&path)
            .map_err(|e| io("look up", e))?;
        let ours = format!("/proc/self/fd/{}", named.as_raw_fd());
        let target = std::fs::read_link(&ours).map_err(|e| io("readlink", e))?;
        let expected = format!("/memfd:{MEMFD_PREFIX}");
        if !target.to_string_lossy().starts_with(&expected) {
            return Err(MemError::BadZone {
                why: format!("{path} is {target:?}, not a zone memfd ({expected}<name>)"),
            });
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&ours)
            .map_err(|e| io("open", e))?;
        Zone::attach(file.into())
    }

    /// Start of the usable bytes; aligned to the page size (at least 4096).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr().as_ptr()
    }

    /// Number of usable bytes from [`as_ptr`](Zone::as_ptr) (at least the
    /// length asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zones are never empty. (Here for API symmetry.)
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The zone's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The size of the pages that actually back the zone (after any
    /// fallback).
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Whether hugepages back the zone.
    pub fn is_huge(&self) -> bool {
        self.page_size.is_huge()
    }

    /// The zone's descriptor, to pass to another process (`SCM_RIGHTS`) or
    /// publish as `/proc/<pid>/fd/<fd>`.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The I/O virtual address of byte `offset` of the zone: the physical
    /// address in [`IovaMode::Pa`] (root only), the virtual address in
    /// [`IovaMode::Va`].
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] when `offset >= len()`;
    /// [`MemError::PaLookupNeedsRoot`] for a physical address without the
    /// privilege to read it; [`MemError::PageNotPresent`].
    pub fn iova(&self, offset: usize, mode: IovaMode) -> Result<u64, MemError> {
        if offset >= self.len {
            return Err(MemError::OutOfRange {
                offset,
                len: self.len,
            });
        }
        let va = self.as_ptr() as usize + offset;
        match mode {
            IovaMode::Va => Ok(va as u64),
            IovaMode::Pa => iova::virt_to_phys(va).map_err(|e| match e {
                MemError::PageNotPresent { .. } => MemError::PageNotPresent { offset },
                e => e,
            }),
        }
    }

    /// Locks the whole mapping; a failure is logged (a warning if `warn`,
    /// else a debug message), not returned.
    fn lock(&self, warn: bool) {
        if let Err(e) = self.map.lock() {
            let len = self.map.len();
            if warn {
                tracing::warn!(
                    zone = %self.name,
                    "could not lock {len} bytes in memory ({e}): pages may be swapped and \
                     physical addresses may change; raise RLIMIT_MEMLOCK (ulimit -l)"
                );
            } else {
                tracing::debug!(
                    zone = %self.name,
                    "could not lock {len} bytes in memory ({e}): pages may be swapped"
                );
            }
        }
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Zone")
            .field("name", &self.name)
            .field("base", &self.map.ptr())
            .field("len", &self.len)
            .field("page_size", &self.page_size)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}
