//! Thin wrappers over the system calls zones are made of: `memfd_create`,
//! `ftruncate`, `fallocate`, file seals, `mmap`, `mlock`.
//!
//! Each returns the raw `io::Error` so the caller can tell a shortage
//! (`ENOSPC`) from other failures and add its own context.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// The seals every zone carries: its size can never change, so a mapping of
/// it can never turn into a SIGBUS because someone shrank the file.
pub(crate) const ZONE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// `memfd_create(name, flags)`.
pub(crate) fn memfd_create(name: &CString, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ftruncate(fd, len)`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain system call on a valid descriptor; no memory is passed.
    let r = unsafe { libc::ftruncate(fd.as_raw_fd(), len) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `fallocate(fd, 0, 0, len)`: allocates every page now, so that a later
/// touch cannot fault for lack of memory. Hugetlb files fail with `ENOSPC`
/// when the pool is short.
pub(crate) fn fallocate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        // SAFETY: plain system call on a valid descriptor; no memory is passed.
        let r = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Adds `seals` to a memfd created with `MFD_ALLOW_SEALING`.
pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int argument; no memory is passed.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The seals of a file; fails (`EINVAL`) on files that are not memfds/shmem.
pub(crate) fn get_seals(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: F_GET_SEALS takes no argument; no memory is passed.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` points to writable memory of the right type and size.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// What `/proc/self/fd/<fd>` points to, e.g. `/memfd:ntbdk:pool (deleted)`.
pub(crate) fn fd_target(fd: BorrowedFd<'_>) -> io::Result<String> {
    let p = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(p.to_string_lossy().into_owned())
}

/// Maps `len` bytes of `fd` shared and read-write, pre-faulted.
pub(crate) fn mmap_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh mapping chosen by the kernel (addr NULL) overlaps no
    // existing Rust object; the arguments are plain values.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

/// Unmaps a mapping made by [`mmap_shared`].
///
/// # Safety
/// `ptr`/`len` must be exactly one mapping returned by [`mmap_shared`] that no
/// live reference points into any more.
pub(crate) unsafe fn munmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller guarantees the range is our mapping and unused.
    let r = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    debug_assert_eq!(r, 0, "munmap: {}", io::Error::last_os_error());
}

/// Locks a mapping in memory (no swapping, stable physical addresses).
pub(crate) fn mlock(ptr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: mlock only changes the residency of pages we mapped; it reads
    // and writes no memory.
    let r = unsafe { libc::mlock(ptr.as_ptr().cast(), len) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
