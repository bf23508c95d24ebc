//! The reference every mbuf holds to its pool, counted in batches.
//!
//! An `Arc<Pool>` per mbuf costs two atomic read-modify-writes per mbuf (a
//! clone when it is made, a drop when it is freed), the largest single cost
//! of a burst at 64 bytes. `Arc` has no way to add or remove many references
//! at once, so the count lives here: a burst that makes `n` mbufs adds `n`
//! with one `fetch_add`, a bulk free of `k` mbufs of one pool removes `k`
//! with one `fetch_sub`, and whoever removes the last frees the pool.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering, fence};

use ntbdk_mempool::Pool;

/// The pool and how many references (its owner's and one per mbuf) hold it.
struct Shared {
    refs: AtomicUsize,
    pool: Pool,
}

/// One counted reference to a pool: the owner's (an `MbufPool`, a receive
/// queue). Mbufs hold copies of the pointer ([`PoolPtr`]) whose references
/// an [`Adding`] added.
pub(crate) struct PoolRef(PoolPtr);

/// A pointer to a counted pool, as an mbuf keeps it: `Copy`, no count of its
/// own (the mbuf's reference is added by an [`Adding`] and released by
/// [`PoolPtr::release`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolPtr(NonNull<Shared>);

// SAFETY: the pointee is a `Pool` (Send + Sync) and an atomic; a PoolPtr
// only reads it, and frees it only as the holder of the last reference.
unsafe impl Send for PoolPtr {}
// SAFETY: as above.
unsafe impl Sync for PoolPtr {}

impl PoolRef {
    /// Takes `pool`, counted once (this owner).
    pub fn new(pool: Pool) -> PoolRef {
        let shared = Box::new(Shared {
            refs: AtomicUsize::new(1),
            pool,
        });
        PoolRef(PoolPtr(NonNull::from(Box::leak(shared))))
    }

    /// The pointer mbufs keep.
    #[inline]
    pub fn ptr(&self) -> PoolPtr {
        self.0
    }

    /// The pool.
    #[inline]
    pub fn pool(&self) -> &Pool {
        self.0.pool()
    }
}

impl Clone for PoolRef {
    fn clone(&self) -> Self {
        // Relaxed, as `Arc::clone`: a holder exists, so the pool is alive.
        self.0.shared().refs.fetch_add(1, Ordering::Relaxed);
        PoolRef(self.0)
    }
}

impl Drop for PoolRef {
    fn drop(&mut self) {
        // SAFETY: this owner's one reference, released once.
        unsafe { self.0.release(1) };
    }
}

impl PoolPtr {
    #[inline]
    fn shared(&self) -> &Shared {
        // SAFETY: whoever holds a PoolPtr holds a reference (an mbuf's, or
        // its owner's), so the allocation is alive.
        unsafe { self.0.as_ref() }
    }

    /// The pool.
    #[inline]
    pub fn pool(&self) -> &Pool {
        &self.shared().pool
    }

    /// Releases `n` references held through copies of this pointer; the
    /// last one frees the pool (as `Arc`'s drop: release, then an acquire
    /// fence before freeing).
    ///
    /// # Safety
    /// The caller holds `n` references (added for mbufs now gone) and uses
    /// none of them, nor this pointer, afterwards.
    #[inline]
    pub unsafe fn release(self, n: usize) {
        if n == 0 || self.shared().refs.fetch_sub(n, Ordering::Release) != n {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: the count reached zero: nobody else holds a reference, and
        // the allocation came from `Box::leak` in `PoolRef::new`.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }

    /// The pointer as an integer (for an mbuf's raw, ring-slot form).
    #[inline]
    pub fn to_bits(self) -> usize {
        self.0.as_ptr() as usize
    }

    /// Back from [`to_bits`](Self::to_bits).
    ///
    /// # Safety
    /// `bits` came from `to_bits` of a pointer whose reference the caller
    /// now holds.
    #[inline]
    pub unsafe fn from_bits(bits: usize) -> PoolPtr {
        // SAFETY: the caller's contract: a live allocation's address.
        PoolPtr(unsafe { NonNull::new_unchecked(bits as *mut Shared) })
    }
}

/// References added ahead for the mbufs a burst may make: `reserve` adds
/// them in one go before any mbuf exists (so no mbuf is ever dropped
/// against a count that does not include it, even during unwinding), each
/// mbuf made takes one, and the unused ones are released on drop.
pub(crate) struct Adding {
    ptr: PoolPtr,
    reserved: usize,
    used: usize,
}

impl Adding {
    /// Adds `n` references to the pool behind `owner`, for up to `n` mbufs.
    #[inline]
    pub fn reserve(owner: &PoolRef, n: usize) -> Adding {
        if n > 0 {
            // Relaxed, as `Arc::clone`: the owner's reference keeps the
            // pool alive.
            owner.0.shared().refs.fetch_add(n, Ordering::Relaxed);
        }
        Adding {
            ptr: owner.0,
            reserved: n,
            used: 0,
        }
    }

    /// One more mbuf holds the pointer (one of the reserved references).
    #[inline]
    pub fn one(&mut self) {
        assert!(
            self.used < self.reserved,
            "more mbufs than references reserved"
        );
        self.used += 1;
    }
}

impl Drop for Adding {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the unused references were added by `reserve` and are
        // held by nobody; the owner's reference keeps the count above zero.
        unsafe { self.ptr.release(self.reserved - self.used) };
    }
}
