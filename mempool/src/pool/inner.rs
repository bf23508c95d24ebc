//! The pool's data path: moving handles between the caller, the calling
//! thread's cache and the shared free ring, and the per-object state bytes.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ntbdk_ring::Ring;

use super::cache::{self, CacheBuf, CacheSlot};
use super::error::PoolError;
use super::handle::ObjIdx;
use crate::zone::Zone;

/// Object state bytes (kept when the pool tracks state).
pub(crate) const FREE: u8 = 0;
/// Taken as a raw handle ([`Pool::get_bulk`](super::Pool::get_bulk)).
pub(crate) const RAW: u8 = 1;
/// Owned by a live [`Obj`](super::Obj).
pub(crate) const OBJ: u8 = 2;

/// Indices staged on the stack when handles go to the ring.
const STAGE: usize = 64;

/// The pool handle's state, shared by its clones and referenced (weakly) by
/// the thread caches.
pub(crate) struct Inner {
    /// Process-unique id of this handle: the thread caches' key.
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) tag: u32,
    pub(crate) count: u32,
    pub(crate) tracked: bool,
    pub(crate) elt_size: usize,
    pub(crate) stride: usize,
    pub(crate) cache_size: usize,
    /// Offset of the pool in its zone.
    pub(crate) offset: usize,
    /// Offset of object 0 in the zone.
    pub(crate) elems_off: usize,
    pub(crate) elems: NonNull<u8>,
    pub(crate) state: NonNull<AtomicU8>,
    pub(crate) ring: Ring<u32>,
    pub(crate) caches: Mutex<Vec<Arc<CacheSlot>>>,
    pub(crate) retired_hits: AtomicU64,
    pub(crate) retired_misses: AtomicU64,
    pub(crate) get_failures: AtomicU64,
    /// Where the objects are when the pool does not own them, and what
    /// keeps that memory mapped.
    pub(crate) external: Option<External>,
    /// Keeps the mapping alive; dropped last.
    pub(crate) zone: Arc<Zone>,
}

/// Objects in memory the pool does not own (`Pool::create_over`).
pub(crate) struct External {
    /// Object 0.
    pub(crate) objects: NonNull<u8>,
    /// Keeps the objects' memory mapped.
    pub(crate) _keep: Arc<dyn std::any::Any + Send + Sync>,
}

// SAFETY: the raw pointers point into `zone`, which lives as long as Inner
// and is itself Send + Sync (or into external memory that `external._keep`,
// Send + Sync, keeps mapped); the state bytes are atomics; objects are handed
// out under the pool's ownership protocol (one owner per object).
unsafe impl Send for Inner {}
// SAFETY: as above; every shared mutation goes through atomics, the ring, a
// Mutex, or a thread cache under its protocol.
unsafe impl Sync for Inner {}

impl Inner {
    /// The per-object state bytes.
    pub(crate) fn states(&self) -> &[AtomicU8] {
        // SAFETY: `count` state bytes live in the zone, which `self` keeps
        // mapped; AtomicU8 has the layout of u8 and tolerates sharing.
        unsafe { std::slice::from_raw_parts(self.state.as_ptr(), self.count as usize) }
    }

    /// The state byte of a handle this pool owns (checked by the caller).
    pub(crate) fn state_of(&self, h: ObjIdx) -> &AtomicU8 {
        &self.states()[h.index() as usize]
    }

    /// First byte of object `index` (`index < count`, checked: an index out
    /// of range can only come from a free ring corrupted by another process).
    #[inline]
    pub(crate) fn elem_ptr(&self, index: u32) -> NonNull<u8> {
        assert!(
            index < self.count,
            "pool {:?}: object index {index} out of range (corrupted free list?)",
            self.name
        );
        // SAFETY: in bounds of the element area (index < count), inside the
        // zone mapping.
        unsafe { NonNull::new_unchecked(self.elems.as_ptr().add(index as usize * self.stride)) }
    }

    /// Whether `h` names an object of this pool.
    #[inline]
    pub(crate) fn owns(&self, h: ObjIdx) -> bool {
        h.tag() == self.tag && h.index() < self.count
    }

    pub(crate) fn foreign(&self, handle: ObjIdx) -> PoolError {
        PoolError::ForeignHandle {
            handle,
            pool: self.name.clone(),
            tag: self.tag,
            count: self.count,
        }
    }

    /// Marks handles just taken as `state` (tracked pools only).
    pub(crate) fn mark_taken(&self, hs: &[ObjIdx], state: u8) {
        if !self.tracked {
            return;
        }
        let states = self.states();
        for h in hs {
            // Bounds-checked: an index out of range means a corrupted ring.
            states[h.index() as usize].store(state, Ordering::Relaxed);
        }
    }

    /// Marks handles being returned by their owner as free (tracked pools
    /// only). Debug builds check they were out as raw handles.
    pub(crate) fn mark_returned(&self, hs: &[ObjIdx], was: u8) {
        if !self.tracked {
            debug_assert!(
                hs.iter().all(|h| self.owns(*h)),
                "pool {:?}: foreign handle",
                self.name
            );
            return;
        }
        let states = self.states();
        for &h in hs {
            if cfg!(debug_assertions) {
                if !self.owns(h) {
                    panic!("{}", self.foreign(h));
                }
                let s = states[h.index() as usize].swap(FREE, Ordering::Relaxed);
                if s != was {
                    panic!("{}", self.misuse(h, s));
                }
            } else {
                states[h.index() as usize].store(FREE, Ordering::Relaxed);
            }
        }
    }

    /// The error for returning `h` whose state is `s`.
    pub(crate) fn misuse(&self, h: ObjIdx, s: u8) -> PoolError {
        let pool = self.name.clone();
        if s == OBJ {
            PoolError::OwnedByObj {
                index: h.index(),
                pool,
            }
        } else {
            PoolError::NotInUse {
                index: h.index(),
                pool,
            }
        }
    }

    #[cold]
    fn exhausted(&self, requested: usize, available: usize) -> PoolError {
        self.get_failures.fetch_add(1, Ordering::Relaxed);
        PoolError::Exhausted {
            pool: self.name.clone(),
            requested,
            available,
        }
    }

    // ---- moving handles ----------------------------------------------------

    /// Takes `out.len()` free objects, all or nothing, through this thread's
    /// cache when there is one. Does not touch state bytes.
    pub(crate) fn get_handles(self: &Arc<Self>, out: &mut [ObjIdx]) -> Result<(), PoolError> {
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        if self.cache_size > 0 {
            // Too big for the cache: straight from the ring, unless the ring
            // alone is short and this thread's cache can make up the rest.
            if n > self.cache_size && self.dequeue(out).is_ok() {
                return Ok(());
            }
            // (The closure returns a small Result: a PoolError is built only
            // on failure, outside the hot path.)
            match cache::with_cache(self, |buf, slot| self.get_cached(buf, slot, out)) {
                Some(Ok(())) => return Ok(()),
                Some(Err(available)) => return Err(self.exhausted(n, available)),
                None => {}
            }
        }
        self.dequeue(out).map_err(|seen| self.exhausted(n, seen))
    }

    /// `Err(objects this thread could reach)` when short.
    fn get_cached(
        &self,
        buf: &mut CacheBuf,
        slot: &CacheSlot,
        out: &mut [ObjIdx],
    ) -> Result<(), usize> {
        let n = out.len();
        let have = buf.len;
        if have >= n {
            slot.hit();
        } else if n <= self.cache_size {
            // Refill so that about half a cache is left after taking `n`.
            slot.miss();
            let need = n - have;
            let want = (need + self.cache_size / 2).min(self.cache_size - have);
            if self.dequeue(&mut buf.objs[have..have + want]).is_ok() {
                buf.len += want;
            } else if self.dequeue(&mut buf.objs[have..have + need]).is_ok() {
                buf.len += need;
            } else {
                return Err(have + self.ring.len());
            }
        } else {
            // Larger than the cache: what the ring has, then the whole cache.
            slot.miss();
            let need = n - have;
            if self.dequeue(&mut out[..need]).is_err() {
                return Err(have + self.ring.len());
            }
            out[need..].copy_from_slice(&buf.objs[..have]);
            buf.len = 0;
            slot.set_len(0);
            return Ok(());
        }
        let from = buf.len - n;
        copy_handles(out, &buf.objs[from..buf.len]);
        buf.len = from;
        slot.set_len(from);
        Ok(())
    }

    /// Returns free objects (state bytes already updated), through this
    /// thread's cache unless `bypass` (a bulk put larger than the cache).
    pub(crate) fn put_handles(self: &Arc<Self>, hs: &[ObjIdx], bypass: bool) {
        let n = hs.len();
        if n == 0 {
            return;
        }
        if !bypass
            && n <= self.cache_size
            && cache::with_cache(self, |buf, slot| self.put_cached(buf, slot, hs)).is_some()
        {
            return;
        }
        self.enqueue(hs);
    }

    fn put_cached(&self, buf: &mut CacheBuf, slot: &CacheSlot, hs: &[ObjIdx]) {
        let n = hs.len();
        if buf.len + n > self.cache_size {
            // Flush down to about half a cache, making room for `n`.
            slot.miss();
            let keep = (self.cache_size / 2).min(self.cache_size - n);
            // The length first: `enqueue_in_place` turns the flushed
            // handles into ring indices in place, and if it panics (debug
            // builds, objects returned twice) the cache must not count
            // them as handles any more.
            let len = std::mem::replace(&mut buf.len, keep);
            self.enqueue_in_place(&mut buf.objs[keep..len]);
        } else {
            slot.hit();
        }
        copy_handles(&mut buf.objs[buf.len..buf.len + n], hs);
        buf.len += n;
        slot.set_len(buf.len);
    }

    /// Dequeues `out.len()` indices from the ring, all or nothing, and turns
    /// them into handles in place. `Err(entries seen)` when short.
    fn dequeue(&self, out: &mut [ObjIdx]) -> Result<(), usize> {
        let n = out.len();
        let p = out.as_mut_ptr();
        // SAFETY: ObjIdx is two u32s (repr(C), no padding), so the first `n`
        // u32s of `out`'s memory are in bounds and aligned; the view ends
        // before the expansion below writes through `p`.
        let idx = unsafe { std::slice::from_raw_parts_mut(p.cast::<u32>(), n) };
        self.ring.dequeue_bulk(idx)?;
        // Expand backwards: handle `i` overwrites u32s `2i` and `2i + 1`,
        // which (for i > 0) lie above `i` and were already read.
        for i in (0..n).rev() {
            // SAFETY: `i < n`: in bounds for both views, which alias the same
            // live allocation through one raw pointer.
            unsafe {
                let index = p.cast::<u32>().add(i).read();
                p.add(i).write(ObjIdx::new(self.tag, index));
            }
        }
        Ok(())
    }

    /// Enqueues the handles' indices (the ring has room: capacity >= count).
    fn enqueue(&self, hs: &[ObjIdx]) {
        let mut stage = [0u32; STAGE];
        for chunk in hs.chunks(STAGE) {
            for (s, h) in stage.iter_mut().zip(chunk) {
                *s = h.index();
            }
            self.push(&stage[..chunk.len()]);
        }
    }

    /// Enqueues the handles' indices, reusing their memory (which is left
    /// garbage): the cache's flush path, without a staging copy.
    fn enqueue_in_place(&self, hs: &mut [ObjIdx]) {
        let n = hs.len();
        let p = hs.as_mut_ptr();
        // Compress forwards: u32 `i` lands at bytes 4i.., below handle `i`'s
        // bytes 8i.., which were read first.
        for i in 0..n {
            // SAFETY: `i < n`: in bounds for both views of the same memory
            // (ObjIdx is two u32s, repr(C)), through one raw pointer.
            unsafe {
                let index = p.add(i).read().index();
                p.cast::<u32>().add(i).write(index);
            }
        }
        // SAFETY: the first `n` u32s were just written, in bounds, aligned.
        let idx = unsafe { std::slice::from_raw_parts(p.cast::<u32>(), n) };
        self.push(idx);
    }

    /// Puts indices on the ring. It always has room (capacity >= count)
    /// unless objects were returned twice by a broken `unsafe` caller: as
    /// many as fit go on (a burst, not all-or-nothing, so that as few as
    /// possible are lost), the rest are dropped (and debug builds panic).
    /// Which are dropped is not chosen: an object returned once may be
    /// among them while a duplicate went on.
    fn push(&self, idx: &[u32]) {
        if self.ring.enqueue_burst(idx).n < idx.len() {
            debug_assert!(
                false,
                "pool {:?}: free ring full: objects returned twice",
                self.name
            );
        }
    }

    // ---- caches ------------------------------------------------------------

    /// Objects in this handle's thread caches.
    pub(crate) fn cached(&self) -> usize {
        let caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        caches.iter().map(|s| s.len()).sum()
    }

    pub(crate) fn register_cache(&self, slot: Arc<CacheSlot>) {
        self.caches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(slot);
    }

    /// Returns a cache's objects to the ring and forgets the cache, keeping
    /// its counters.
    ///
    /// # Safety
    /// The caller may use the slot's buffer (see the protocol in `cache`).
    pub(crate) unsafe fn retire_cache(&self, slot: &Arc<CacheSlot>) {
        // SAFETY: the caller's contract.
        let buf = unsafe { slot.buf() };
        self.enqueue_in_place(&mut buf.objs[..buf.len]);
        buf.len = 0;
        slot.set_len(0);
        // The counts move from the slot to the retired totals under the
        // lock `stats` reads both under: it sees them in one place or the
        // other, never twice or nowhere.
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        let (h, m) = slot.counts();
        self.retired_hits.fetch_add(h, Ordering::Relaxed);
        self.retired_misses.fetch_add(m, Ordering::Relaxed);
        caches.retain(|s| !Arc::ptr_eq(s, slot));
    }
}

/// `dst.copy_from_slice(src)` for the short runs of the cache fast path,
/// inlined as 64-byte block moves rather than a call to `memmove` (whose
/// size dispatch costs as much as the copy at these sizes).
#[inline(always)]
fn copy_handles(dst: &mut [ObjIdx], src: &[ObjIdx]) {
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let s: &[ObjIdx; 8] = s.try_into().expect("chunks of 8");
        let d: &mut [ObjIdx; 8] = d.try_into().expect("chunks of 8");
        *d = *s;
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = *s;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No `&Pool` is left, so no thread is inside an operation and no
        // thread-local destructor can reach this pool: every cache is ours.
        let caches = std::mem::take(self.caches.get_mut().unwrap_or_else(|p| p.into_inner()));
        for slot in caches {
            // SAFETY: see above: nobody else can use the slot's buffer now.
            let buf = unsafe { slot.buf() };
            self.enqueue_in_place(&mut buf.objs[..buf.len]);
            buf.len = 0;
            slot.set_len(0);
        }
    }
}
