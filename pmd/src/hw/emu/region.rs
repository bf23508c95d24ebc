//! The memory a fabric lives in: one shared mapping, whoever provides it.
//!
//! A [`SharedRegion`] is a base pointer, a length and a keepalive. The fabric
//! code reaches it in two ways only: atomics at fixed, aligned offsets (the
//! control area: every field of the header and slot blocks is an atomic, so a
//! shared `&AtomicU64` into it is sound however many processes or VMs write
//! it, as vm-memory's `get_atomic_ref` allows), and window handles built
//! from raw pointers ([`LocalWindow`](crate::hw::LocalWindow),
//! [`PeerWindow`](crate::hw::PeerWindow)). No plain reference or slice is
//! ever made over it.
//!
//! Where it comes from:
//! - a file or memfd mapped shared ([`SharedRegion::map_fd`]): the emulated
//!   fabric's control segment, or a memfd standing in for an ivshmem BAR in
//!   tests;
//! - a PCI BAR mapped through vfio (the ivshmem backend), wrapped with
//!   [`SharedRegion::from_raw`].

use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use crate::hw::{HwError, Keepalive, Result};

/// A shared mapping: its start, its length, and what keeps it mapped.
#[derive(Clone)]
pub struct SharedRegion {
    base: NonNull<u8>,
    len: usize,
    keep: Keepalive,
}

// SAFETY: the region is shared memory reached only through atomics and raw
// pointers (never references to non-atomic data); `keep` keeps it mapped for
// as long as any clone exists, whichever thread holds it.
unsafe impl Send for SharedRegion {}
// SAFETY: as for Send.
unsafe impl Sync for SharedRegion {}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A mapping made by [`SharedRegion::map_fd`], unmapped on drop.
struct FdMapping {
    base: NonNull<std::ffi::c_void>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; unmapping
// it from any thread is fine.
unsafe impl Send for FdMapping {}
// SAFETY: `FdMapping` has no methods that touch the memory.
unsafe impl Sync for FdMapping {}

impl Drop for FdMapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is the mapping made in `map_fd`, unmapped
        // once, here; every handle onto it holds this value alive.
        let _ = unsafe { munmap(self.base, self.len) };
    }
}

impl SharedRegion {
    /// Maps the first `len` bytes of `fd` shared and read-write. `what`
    /// names the mapping in errors.
    pub fn map_fd(fd: impl AsFd, len: usize, what: &str) -> Result<SharedRegion> {
        let nz = NonZeroUsize::new(len)
            .ok_or_else(|| HwError::Invalid(format!("cannot map 0 bytes of {what}")))?;
        // SAFETY: a fresh shared mapping of an open descriptor at an address
        // the kernel picks, so it aliases no Rust object; it is only reached
        // through atomics and raw pointers (module doc).
        let base = unsafe {
            mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| HwError::Io {
            what: format!("mapping {len} bytes of {what}"),
            source: e.into(),
        })?;
        let keep: Keepalive = Arc::new(FdMapping { base, len });
        Ok(SharedRegion {
            base: base.cast(),
            len,
            keep,
        })
    }

    /// Wraps `len` bytes at `base`, kept mapped by `keep`.
    ///
    /// # Safety
    /// `base..base+len` must be readable and writable shared memory, page
    /// aligned, that stays mapped while `keep` is alive, and that no Rust
    /// reference or slice covers.
    pub unsafe fn from_raw(base: NonNull<u8>, len: usize, keep: Keepalive) -> SharedRegion {
        SharedRegion { base, len, keep }
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What keeps the mapping alive (for window handles onto it).
    pub fn keepalive(&self) -> Keepalive {
        self.keep.clone()
    }

    /// The address of byte `offset`, if `offset + len` fits.
    pub(crate) fn ptr_at(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            // SAFETY: `offset <= self.len`, so the result is inside the
            // mapping or one past its end.
            Some(end) if end <= self.len => Ok(unsafe { self.base.as_ptr().add(offset) }),
            _ => Err(HwError::OutOfBounds {
                offset,
                len,
                window_len: self.len,
            }),
        }
    }

    /// A reference to `T` at `offset`.
    ///
    /// # Safety
    /// `T` must be made of atomics only (valid for any bytes, mutated only
    /// through `&`), and `offset` must be aligned for `T`.
    pub(crate) unsafe fn atomic_at<T>(&self, offset: usize) -> &T {
        let p = self
            .ptr_at(offset, std::mem::size_of::<T>())
            .expect("control-area offset inside the region (checked by the caller)");
        debug_assert!((p as usize).is_multiple_of(std::mem::align_of::<T>()));
        // SAFETY: in bounds (checked above), aligned and all-atomic (the
        // caller's promise); the mapping lives as long as `self`.
        unsafe { &*p.cast::<T>() }
    }

    /// The 64-bit atomic at `offset` (8-byte aligned, in bounds).
    pub(crate) fn u64_at(&self, offset: usize) -> Result<&AtomicU64> {
        self.check_atomic(offset, 8)?;
        // SAFETY: checked in bounds and 8-byte aligned; AtomicU64 is an atomic.
        Ok(unsafe { self.atomic_at(offset) })
    }

    fn check_atomic(&self, offset: usize, size: usize) -> Result<()> {
        self.ptr_at(offset, size)?;
        if !(self.base.as_ptr() as usize + offset).is_multiple_of(size) {
            return Err(HwError::Misaligned { offset, size });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    fn memfd(len: usize) -> std::fs::File {
        let fd = nix::sys::memfd::memfd_create(
            c"ntbdk-region-test",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .unwrap();
        let f = std::fs::File::from(fd);
        f.set_len(len as u64).unwrap();
        f
    }

    #[test]
    fn two_mappings_of_one_memfd_share_bytes() {
        let f = memfd(8192);
        let a = SharedRegion::map_fd(&f, 8192, "test memfd").unwrap();
        let b = SharedRegion::map_fd(&f, 8192, "test memfd").unwrap();
        a.u64_at(4096).unwrap().store(0xfeed, Relaxed);
        assert_eq!(b.u64_at(4096).unwrap().load(Relaxed), 0xfeed);
        assert!(a.u64_at(8192 - 4).is_err(), "out of bounds");
        assert!(matches!(a.u64_at(4), Err(HwError::Misaligned { .. })));
        assert!(SharedRegion::map_fd(&f, 0, "test memfd").is_err());
    }
}
