//! The system calls zones are made of, through the crates made for them: the
//! `memfd` crate creates and seals the file (hugetlb page size included),
//! nix sizes, allocates, inspects, maps and locks it.
//!
//! Each returns the raw `io::Error` (nix's `Errno` converts into one with the
//! same `raw_os_error`) so the caller can tell a shortage (`ENOSPC`,
//! `ENOMEM`) from other failures and add its own context.
//!
//! The only `unsafe` left here is the mapping's lifetime: [`Mapping`] maps,
//! locks and unmaps, and is the one owner of the range.

use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use memfd::{FileSeal, Memfd, MemfdOptions};
use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fcntl};
use nix::libc::off_t;
use nix::sys::mman::{MapFlags, ProtFlags, mlock, mmap, munmap};
use nix::sys::stat::FileStat;

use crate::page::PageSize;

/// The seals every zone carries: its size can never change, so a mapping of
/// it can never turn into a SIGBUS because someone shrank the file.
const ZONE_SEALS: SealFlag = SealFlag::F_SEAL_SHRINK.union(SealFlag::F_SEAL_GROW);

/// The `memfd` crate's error, back to the `io::Error` it wraps.
fn memfd_error(e: memfd::Error) -> io::Error {
    match e {
        memfd::Error::Create(e) | memfd::Error::AddSeals(e) | memfd::Error::GetSeals(e) => e,
    }
}

/// A close-on-exec memfd that allows sealing, backed by `page_size` pages
/// (`MFD_HUGETLB` with the matching `MFD_HUGE_*` size for hugepages).
/// A kernel without hugetlb memfds (or without that size) fails with
/// `EINVAL`.
pub(crate) fn memfd_create(name: &str, page_size: PageSize) -> io::Result<Memfd> {
    MemfdOptions::new()
        .close_on_exec(true)
        .allow_sealing(true)
        .hugetlb(page_size.hugetlb())
        .create(name)
        .map_err(memfd_error)
}

/// `len` as an `off_t`, or an `InvalidInput` error when it does not fit.
fn file_len(len: usize) -> io::Result<off_t> {
    off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `ftruncate(fd, len)`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    Ok(nix::unistd::ftruncate(fd, file_len(len)?)?)
}

/// `fallocate(fd, 0, 0, len)`: allocates every page now, so that a later
/// touch cannot fault for lack of memory. Hugetlb files fail with `ENOSPC`
/// (or `ENOMEM`) when the pool is short.
pub(crate) fn fallocate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len = file_len(len)?;
    loop {
        match nix::fcntl::fallocate(fd, FallocateFlags::empty(), 0, len) {
            Err(Errno::EINTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Seals a zone's memfd against resizing, and against further sealing.
pub(crate) fn seal(memfd: &Memfd) -> io::Result<()> {
    memfd
        .add_seals(&[FileSeal::SealShrink, FileSeal::SealGrow, FileSeal::SealSeal])
        .map_err(memfd_error)
}

/// Whether `fd` carries the seals of a zone, with all its seals (for
/// messages). Fails (`EINVAL`) on files that are not memfds/shmem.
///
/// nix rather than the `memfd` crate: `Memfd::try_from_fd` drops the errno
/// of a failed `F_GET_SEALS`, and the caller reports it.
pub(crate) fn zone_seals(fd: BorrowedFd<'_>) -> io::Result<(bool, SealFlag)> {
    let seals = SealFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GET_SEALS)?);
    Ok((seals.contains(ZONE_SEALS), seals))
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    Ok(nix::sys::stat::fstat(fd)?)
}

/// The size of the pages under a memfd: the file system's block size for a
/// hugetlbfs file (an `MFD_HUGETLB` memfd), else 4 KiB. Not `st_blksize`:
/// since Linux 4.18 a shmem file reports the transparent hugepage size
/// there whenever shmem THP is on, though it is made of 4 KiB pages.
pub(crate) fn page_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    use nix::sys::statfs::{HUGETLBFS_MAGIC, fstatfs};
    let fs = fstatfs(fd)?;
    if fs.filesystem_type() == HUGETLBFS_MAGIC {
        u64::try_from(fs.block_size()).map_err(|_| io::Error::other("negative block size"))
    } else {
        Ok(4096)
    }
}

/// What `/proc/self/fd/<fd>` points to, e.g. `/memfd:ntbdk:pool (deleted)`.
pub(crate) fn fd_target(fd: BorrowedFd<'_>) -> io::Result<String> {
    let p = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(p.to_string_lossy().into_owned())
}

/// A shared, read-write, pre-faulted mapping of a whole file, unmapped on
/// drop. Whoever holds raw pointers into it must not use them after that.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: NonZeroUsize,
}

impl Mapping {
    /// Maps the first `len` bytes of `fd` (`MAP_SHARED | MAP_POPULATE`,
    /// read-write). A hugetlb file short of pages fails with `ENOMEM`.
    pub(crate) fn shared(fd: impl AsFd, len: usize) -> io::Result<Mapping> {
        let len = NonZeroUsize::new(len).ok_or_else(|| io::Error::from(Errno::EINVAL))?;
        // SAFETY: the kernel picks the address (none is given, no MAP_FIXED),
        // so the new mapping overlaps no existing Rust object; the other
        // arguments are plain values. The mapping is owned by the returned
        // `Mapping` alone, which unmaps it once.
        // SAFETY: holds for the reasons given just above.
        let p = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd,
                0,
            )
        }?;
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len.get()
    }

    /// Locks the mapping in memory (no swapping, stable physical addresses).
    pub(crate) fn lock(&self) -> io::Result<()> {
        // SAFETY: the range is exactly our live mapping; mlock only changes
        // the residency of its pages and reads or writes no memory.
        Ok(unsafe { mlock(self.ptr.cast(), self.len.get()) }?)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` is the mapping `shared` made, unmapped only
        // here; its owner is going away, and raw pointers handed out by it are
        // documented to live no longer than it.
        let r = unsafe { munmap(self.ptr.cast(), self.len.get()) };
        debug_assert!(r.is_ok(), "munmap: {r:?}");
    }
}
