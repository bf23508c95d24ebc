//! Per-thread object caches, as `rte_mempool`'s per-lcore caches: each thread
//! keeps up to `cache_size` handles of free objects of each pool it uses, so most
//! gets and puts touch no shared cache line.
//!
//! A cache lives in a thread-local list keyed by the pool handle's id. The
//! pool keeps a registry of its caches too, to count the objects they hold
//! ([`Pool::available`](crate::Pool::available)) and to return them to the
//! shared ring when the pool handle goes away. A thread returns its caches'
//! objects when it exits (thread-local destructor), or on demand with
//! [`Pool::flush_cache`](crate::Pool::flush_cache).
//!
//! Who touches a cache's objects: its thread, during a pool operation (which
//! holds a `&Pool`, so the pool is alive); its thread's destructor, after
//! upgrading its weak reference to the pool (so the pool is alive); and the
//! pool's destructor, which runs only when no `&Pool` is left, hence when no
//! operation can be running and no destructor can upgrade. These never
//! overlap, so the objects need no lock.

use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use super::handle::ObjIdx;
use super::inner::Inner;

/// The free objects of one thread's cache of one pool.
pub(crate) struct CacheBuf {
    /// Handles of free objects: `objs[..len]`, the newest last.
    pub objs: Box<[ObjIdx]>,
    /// How many of `objs` are filled.
    pub len: usize,
}

/// One thread's cache of one pool, shared between the thread and the pool's
/// registry.
pub(crate) struct CacheSlot {
    buf: UnsafeCell<CacheBuf>,
    /// Copy of `buf.len` that other threads may read.
    len: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

// SAFETY: `buf` is only accessed under the protocol in the module docs (one
// user at a time, with happens-before between them); the other fields are
// atomics.
unsafe impl Sync for CacheSlot {}
// SAFETY: as above; the contents are plain integers.
unsafe impl Send for CacheSlot {}

impl CacheSlot {
    fn new(size: usize) -> Self {
        CacheSlot {
            buf: UnsafeCell::new(CacheBuf {
                objs: vec![ObjIdx::default(); size].into_boxed_slice(),
                len: 0,
            }),
            len: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The cache's objects.
    ///
    /// # Safety
    /// The caller is the one user allowed by the protocol in the module docs,
    /// and holds no other reference from this method.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn buf(&self) -> &mut CacheBuf {
        // SAFETY: the caller's contract.
        unsafe { &mut *self.buf.get() }
    }

    /// Objects held, as last published by the owner.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Publishes the number of objects held (owner only).
    pub(crate) fn set_len(&self, n: usize) {
        self.len.store(n, Ordering::Relaxed);
    }

    /// Counts an operation served by the cache alone (owner only: a plain
    /// increment, no read-modify-write).
    pub(crate) fn hit(&self) {
        self.hits
            .store(self.hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Counts an operation that went to the shared ring (owner only).
    pub(crate) fn miss(&self) {
        self.misses
            .store(self.misses.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// (hits, misses) so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

struct Entry {
    id: u64,
    pool: Weak<Inner>,
    slot: Arc<CacheSlot>,
}

/// This thread's caches, one per pool handle it has used.
struct ThreadCaches {
    entries: Vec<Entry>,
}

impl Drop for ThreadCaches {
    fn drop(&mut self) {
        for e in self.entries.drain(..) {
            if let Some(pool) = e.pool.upgrade() {
                // SAFETY: this is the owning thread, outside any operation
                // (its thread-locals are being destroyed), and the pool is
                // alive through `pool`.
                unsafe { pool.retire_cache(&e.slot) };
            }
        }
    }
}

thread_local! {
    static CACHES: RefCell<ThreadCaches> = const { RefCell::new(ThreadCaches { entries: Vec::new() }) };
}

/// Runs `f` on the calling thread's cache of `pool`, creating it on first
/// use. `None` when the thread's caches are gone (the thread is exiting): the
/// caller then goes straight to the ring.
///
/// `f` must not call back into the pool's cache functions.
pub(crate) fn with_cache<R>(
    pool: &Arc<Inner>,
    f: impl FnOnce(&mut CacheBuf, &CacheSlot) -> R,
) -> Option<R> {
    CACHES
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let i = match c.entries.iter().position(|e| e.id == pool.id) {
                Some(i) => i,
                None => {
                    // Forget caches of pools that are gone (their objects were
                    // returned by the pool's destructor).
                    c.entries.retain(|e| e.pool.strong_count() > 0);
                    let slot = Arc::new(CacheSlot::new(pool.cache_size));
                    pool.register_cache(slot.clone());
                    c.entries.push(Entry {
                        id: pool.id,
                        pool: Arc::downgrade(pool),
                        slot,
                    });
                    c.entries.len() - 1
                }
            };
            let slot = &c.entries[i].slot;
            // SAFETY: we are the owning thread, inside an operation on a live
            // pool (`pool`), and this is the only reference to the buffer.
            let buf = unsafe { slot.buf() };
            Some(f(buf, slot))
        })
        .ok()
        .flatten()
}

/// Removes the calling thread's cache of `pool` from its list, returning the
/// slot (so the caller can flush it); `None` when it has none.
pub(crate) fn take_cache(pool: &Inner) -> Option<Arc<CacheSlot>> {
    CACHES
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let i = c.entries.iter().position(|e| e.id == pool.id)?;
            Some(c.entries.swap_remove(i).slot)
        })
        .ok()
        .flatten()
}
