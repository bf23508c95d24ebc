//! Handles to pool objects: the raw [`ObjIdx`] and the owning [`Obj`].

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::Pool;
use super::inner::{OBJ, RAW};

/// A raw handle to one object of a [`Pool`]: the pool's tag and the object's
/// index.
///
/// Plain data (two `u32`s, `#[repr(C)]`): it means the same in every process
/// that attached the pool, so it can be stored in shared memory or sent in a
/// message (see also [`Pool::offset_of`] for a byte offset). It does not own
/// the object: whoever holds it returns it exactly once, with
/// [`Pool::put_checked`] or the unchecked, `unsafe` [`Pool::put`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct ObjIdx {
    tag: u32,
    index: u32,
}

impl ObjIdx {
    /// A handle of no pool (tag 0 is never a pool's): a placeholder.
    pub const NONE: ObjIdx = ObjIdx { tag: 0, index: 0 };

    pub(crate) const fn new(tag: u32, index: u32) -> Self {
        ObjIdx { tag, index }
    }

    /// The object's index in its pool, `0..pool.size()`.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The tag of the pool the handle came from (random per pool, the same in
    /// every process).
    pub const fn tag(self) -> u32 {
        self.tag
    }

    /// The handle as one `u64` (tag in the high half), for storing in shared
    /// memory.
    pub const fn to_bits(self) -> u64 {
        (self.tag as u64) << 32 | self.index as u64
    }

    /// The handle stored with [`to_bits`](Self::to_bits). Any value is
    /// accepted here; the pool checks it when it is used.
    pub const fn from_bits(bits: u64) -> Self {
        ObjIdx {
            tag: (bits >> 32) as u32,
            index: bits as u32,
        }
    }
}

impl fmt::Debug for ObjIdx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjIdx({}@{:08x})", self.index, self.tag)
    }
}

impl fmt::Display for ObjIdx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} (tag {:08x})", self.index, self.tag)
    }
}

/// An object taken from a [`Pool`] with [`Pool::get`]: derefs to its bytes
/// and returns itself to the pool when dropped.
///
/// The bytes are not cleared between uses: an object holds whatever its last
/// user wrote (zeros the first time).
///
/// ```
/// use ntbdk_mempool::{Pool, PoolOptions, ZoneOptions};
///
/// let pool = Pool::create("doc-obj", &PoolOptions::new(128, 64), &ZoneOptions::no_huge())?;
/// {
///     let mut obj = pool.get()?;
///     obj[..5].copy_from_slice(b"hello");
///     assert_eq!(obj.len(), 128);
///     assert_eq!(pool.in_use(), 1);
/// } // returned here
/// assert_eq!(pool.in_use(), 0);
/// # Ok::<(), ntbdk_mempool::PoolError>(())
/// ```
pub struct Obj<'a> {
    pool: &'a Pool,
    handle: ObjIdx,
    ptr: NonNull<u8>,
}

impl<'a> Obj<'a> {
    pub(super) fn new(pool: &'a Pool, handle: ObjIdx, ptr: NonNull<u8>) -> Self {
        Obj { pool, handle, ptr }
    }

    /// Wraps a handle that the caller owns.
    ///
    /// # Safety
    /// `handle` must be a handle of `pool` that the caller owns as a raw
    /// handle (taken with [`Pool::get_bulk`] / [`Pool::get_raw`] or
    /// [`Obj::into_handle`], not returned since): no other `Obj` or raw access
    /// to it may exist while the `Obj` lives, and nobody else may return it.
    ///
    /// # Panics
    /// For a pool over memory it does not own ([`Pool::create_over`]): its
    /// objects may be written by others, so no slice may be made over them.
    pub unsafe fn from_handle(pool: &'a Pool, handle: ObjIdx) -> Self {
        assert!(
            !pool.is_external(),
            "Obj::from_handle: pool {:?} holds objects in memory it does not own",
            pool.name()
        );
        let ptr = pool
            .ptr(handle)
            .expect("Obj::from_handle: not a handle of this pool");
        pool.inner.mark_returned(std::slice::from_ref(&handle), RAW);
        pool.inner.mark_taken(std::slice::from_ref(&handle), OBJ);
        Obj { pool, handle, ptr }
    }

    /// The object's raw handle (the object stays owned by this `Obj`).
    pub fn handle(&self) -> ObjIdx {
        self.handle
    }

    /// Gives up ownership without returning the object: the raw handle must
    /// be returned with [`Pool::put_checked`] / [`Pool::put`] (or wrapped
    /// again) later.
    pub fn into_handle(self) -> ObjIdx {
        let h = self.handle;
        self.pool.inner.mark_returned(std::slice::from_ref(&h), OBJ);
        self.pool.inner.mark_taken(std::slice::from_ref(&h), RAW);
        std::mem::forget(self);
        h
    }

    /// The pool the object belongs to.
    pub fn pool(&self) -> &'a Pool {
        self.pool
    }
}

impl Deref for Obj<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `elt_size` bytes of the pool's zone, which
        // lives as long as `'a`; this Obj owns the object exclusively (taken
        // from the free list, or the `from_handle` contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.pool.elt_size()) }
    }
}

impl DerefMut for Obj<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.pool.elt_size()) }
    }
}

impl Drop for Obj<'_> {
    fn drop(&mut self) {
        self.pool.put_obj(self.handle);
    }
}

impl fmt::Debug for Obj<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Obj")
            .field("handle", &self.handle)
            .field("ptr", &self.ptr)
            .finish()
    }
}

// SAFETY: an Obj is an exclusive handle to bytes in shared memory plus a
// shared reference to a Sync pool; moving it to another thread is like moving
// a `Box<[u8]>`.
unsafe impl Send for Obj<'_> {}
// SAFETY: `&Obj` only gives `&[u8]`.
unsafe impl Sync for Obj<'_> {}
