//! Fixed-size object pools with per-thread caches, in the spirit of
//! `rte_mempool`.

mod cache;
mod error;
mod handle;
mod inner;
mod layout;
mod options;
mod stats;

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ntbdk_ring::{Ring, RingMode};

pub use error::PoolError;
pub use handle::{Obj, ObjIdx};
pub use options::PoolOptions;
pub use stats::PoolStats;

use crate::iova::IovaMode;
use crate::zone::{Zone, ZoneOptions};
use inner::{External, FREE, Inner, OBJ, RAW};
use layout::{Layout, POOL_ALIGN};

/// A pool of `count` fixed-size objects carved from a [`Zone`], in the
/// spirit of DPDK's `rte_mempool`.
///
/// Free objects wait in an MPMC [`ntbdk_ring::Ring`] of indices; in front of
/// it, every thread keeps a cache of up to `cache_size` handles, refilled
/// from and flushed to the ring half a cache at a time, so most gets and puts
/// are a memcpy that touches no shared cache line.
///
/// * [`get`](Pool::get) returns an [`Obj`] that derefs to the object's bytes
///   and returns it on drop;
/// * [`get_bulk`](Pool::get_bulk) / [`put_bulk`](Pool::put_bulk) move raw
///   [`ObjIdx`] handles, all or nothing, for the data path;
///   [`put_checked`](Pool::put_checked) /
///   [`put_bulk_checked`](Pool::put_bulk_checked) are their safe, checked
///   counterparts;
/// * running out is [`PoolError::Exhausted`], never a wait or a panic.
///
/// **Shared memory.** The pool's header, free ring, state bytes and objects
/// all live in its zone at fixed offsets, and handles are indices (or byte
/// offsets, [`offset_of`](Pool::offset_of)), never pointers: another process
/// that maps the zone ([`Zone::attach`]) and [`attach`](Pool::attach)es the
/// pool gets and puts the same objects. Objects held in a process's thread
/// caches, or taken by a process that dies, are not seen by the others; a
/// process that dies (or is stopped) inside a get or put of the free ring
/// holds the others' gets or puts until it finishes (a multi-process ring
/// publishes in order: see `ntbdk_ring::SyncMode::Multi`), so a pool
/// shared with a process that died mid-operation must be made again.
///
/// **Misuse.** With [`PoolOptions::track_state`] (the default), every object
/// has a state byte: free, out as a raw handle, or owned by an `Obj`.
/// [`put_checked`](Pool::put_checked) then rejects a double put, a handle of
/// another pool and a handle still owned by an `Obj` with an error, exactly
/// even when threads race on one handle's state, and debug builds assert on
/// the same misuse in the unchecked [`put`](Pool::put). One case it cannot
/// tell: a stale copy of a raw handle put back after the object was freed
/// and handed out again as a raw handle (the state byte records an object's
/// state, not who holds it), so a raw handle must be put once, by its
/// holder. Without it the data path touches no per-object byte, and only
/// foreign handles are caught.
///
/// **Caches hold objects.** [`available`](Pool::available) counts the ring
/// plus this process's thread caches; a thread's cache returns to the ring
/// when the thread exits, when it calls [`flush_cache`](Pool::flush_cache),
/// and when the last handle to the pool is dropped. With many threads and a
/// small pool, a get can fail while other threads' caches hold objects, as
/// in DPDK: size the pool for `threads * cache_size` extra.
///
/// # Example
///
/// ```
/// use ntbdk_mempool::{ObjIdx, Pool, PoolOptions, ZoneOptions};
///
/// let pool = Pool::create("doc-pool", &PoolOptions::new(2048, 1024), &ZoneOptions::huge_or_fallback())?;
/// assert_eq!(pool.size(), 1024);
///
/// // Safe API: the object returns itself on drop.
/// let mut buf = pool.get()?;
/// buf.fill(0xAB);
/// drop(buf);
///
/// // Data path: bulk, all or nothing, raw handles.
/// let mut burst = [ObjIdx::default(); 32];
/// pool.get_bulk(&mut burst)?;
/// assert_eq!(pool.in_use(), 32);
/// pool.put_bulk_checked(&burst)?;
/// assert_eq!(pool.available(), 1024);
///
/// // Misuse is an error in the checked API.
/// let h = pool.get_raw()?;
/// pool.put_checked(h)?;
/// assert!(pool.put_checked(h).is_err()); // double put
/// # Ok::<(), ntbdk_mempool::PoolError>(())
/// ```
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Pool {
    /// The largest per-thread cache.
    pub const MAX_CACHE: usize = 1024;

    /// The bytes of zone a pool shaped by `opts` occupies (for
    /// [`create_in`](Pool::create_in)).
    ///
    /// # Errors
    /// [`PoolError::InvalidOptions`] for an impossible shape.
    pub fn bytes_for(opts: &PoolOptions) -> Result<usize, PoolError> {
        Ok(Layout::new(opts)?.total)
    }

    /// Creates a pool in a zone of its own, named `name`, backed as
    /// `zone_opts` says (2 MiB hugepages, 4 KiB pages, fallback…).
    ///
    /// # Errors
    /// [`PoolError::InvalidOptions`]; [`PoolError::Zone`] when the zone
    /// cannot be created (e.g. no hugepages, with the reason and the fix).
    pub fn create(
        name: &str,
        opts: &PoolOptions,
        zone_opts: &ZoneOptions,
    ) -> Result<Pool, PoolError> {
        check_cache(opts.cache_size)?;
        let need = Pool::bytes_for(opts)?;
        let zone = Arc::new(Zone::create(name, need, zone_opts)?);
        // SAFETY: the zone is brand new and ours alone.
        unsafe { Pool::create_in(zone, 0, name, opts) }
    }

    /// Creates a pool at byte `offset` (a multiple of 4096) of `zone`,
    /// occupying [`bytes_for(opts)`](Pool::bytes_for) bytes, so that other
    /// processes can [`attach`](Pool::attach) it there. Any previous content
    /// of those bytes is overwritten. The name is recorded in the pool's
    /// header (cut to 64 bytes).
    ///
    /// # Safety
    /// Nothing else may use those bytes of the zone while the pool exists
    /// (in any process), except handles attached to this pool; in
    /// particular no other pool may be created or used there concurrently.
    ///
    /// # Errors
    /// [`PoolError::InvalidOptions`] (also for a misaligned `offset`);
    /// [`PoolError::ZoneTooSmall`] when the pool does not fit.
    pub unsafe fn create_in(
        zone: Arc<Zone>,
        offset: usize,
        name: &str,
        opts: &PoolOptions,
    ) -> Result<Pool, PoolError> {
        check_cache(opts.cache_size)?;
        let l = Layout::new(opts)?;
        let base = region(&zone, offset, l.total)?;
        let tag = new_tag();
        let tracked = opts.track_state || cfg!(debug_assertions);
        // SAFETY: the header area is inside the region (checked by
        // `region`), 4096-aligned, zone memory, and ours (the caller's
        // contract).
        unsafe { layout::retract_header(base) };
        // SAFETY: `region` checked that `l.total` bytes from `base` are in
        // the zone, and `base` is 4096-aligned; the caller guarantees nobody
        // else uses them.
        let ring = unsafe { init_free_list(base, &l)? };
        // SAFETY: the header area is inside the region, 4096-aligned, ours;
        // it is written last, after the old magic was cleared above, so an
        // attacher sees a complete pool or none.
        unsafe { layout::write_header(base, &l, tag, tracked, name) };
        let name = layout::HeaderInfo::cut_name(name);
        Ok(Pool::from_parts(
            zone,
            offset,
            base,
            l,
            tag,
            tracked,
            name,
            ring,
            opts.cache_size,
            None,
        ))
    }

    /// Attaches to the pool that [`create_in`](Pool::create_in) (or
    /// [`create`](Pool::create), at offset 0) built at `offset` of `zone`,
    /// typically in another process, after validating its header and free
    /// ring. This handle gets its own thread caches of `cache_size` objects.
    ///
    /// # Safety
    /// Bytes at `offset` that look like a pool are one that `create_in`
    /// built there, and nothing but handles to that pool uses them (in any
    /// process) while this handle lives. Validation refuses a region that
    /// holds no pool, or a corrupted one; it cannot tell a pool from bytes
    /// made to look like one, such as a live object's, which the pool would
    /// then hand out as objects of its own while their holder writes them.
    ///
    /// # Errors
    /// [`PoolError::BadPool`] when the region holds no valid pool;
    /// [`PoolError::ZoneTooSmall`]; [`PoolError::Ring`] when the free ring
    /// does not validate; [`PoolError::InvalidOptions`] for a bad cache size
    /// or offset.
    pub unsafe fn attach(
        zone: Arc<Zone>,
        offset: usize,
        cache_size: usize,
    ) -> Result<Pool, PoolError> {
        check_cache(cache_size)?;
        let base = region(&zone, offset, layout::HEADER_BYTES)?;
        // SAFETY: `region` checked that the header bytes are in the zone, and
        // `base` is 4096-aligned.
        let info = unsafe { layout::read_header(base, zone.len() - offset, offset)? };
        let l = info.layout;
        // SAFETY: `l.total` bytes from `base` are in the zone (read_header);
        // the ring region is where the layout puts it, aligned, and used only
        // through ring handles (our caller's promise).
        let ring = unsafe { Ring::<u32>::attach(base.as_ptr().add(l.ring_off), l.ring_len)? };
        if ring.capacity() != l.ring_cap || ring.mode() != RingMode::MPMC {
            return Err(PoolError::BadPool {
                offset,
                why: format!(
                    "free ring has capacity {} and mode {:?}, expected {} MPMC",
                    ring.capacity(),
                    ring.mode(),
                    l.ring_cap
                ),
            });
        }
        let (tag, tracked) = (info.tag, info.tracked);
        Ok(Pool::from_parts(
            zone, offset, base, l, tag, tracked, info.name, ring, cache_size, None,
        ))
    }

    /// Creates a pool whose `opts.count` objects lie in memory the pool does
    /// not own: `objects`, `len` bytes (for instance a receive area inside an
    /// NTB window, which peers write). Only the bookkeeping (free ring and
    /// state bytes) lives in a private zone of 4 KiB pages; `keep` keeps the
    /// objects' memory mapped for as long as the pool lives.
    ///
    /// Such a pool hands out raw handles only ([`get_bulk`](Pool::get_bulk),
    /// [`get_raw`](Pool::get_raw), [`ptr`](Pool::ptr)): its objects may be
    /// written by others at any time, so [`get`](Pool::get), whose `Obj`
    /// derefs to a slice, refuses; so do [`offset_of`](Pool::offset_of) and
    /// [`iova`](Pool::iova), which speak of the zone. It cannot be attached
    /// from another process.
    ///
    /// # Safety
    /// `objects .. objects + len` stays valid for reads and writes through
    /// raw pointers while `keep` lives, and nothing else hands those bytes
    /// out as objects.
    ///
    /// # Errors
    /// [`PoolError::InvalidOptions`] for an impossible shape, a misaligned
    /// `objects`, or `len` too small for `count` objects; [`PoolError::Zone`]
    /// when the bookkeeping zone cannot be created.
    pub unsafe fn create_over(
        name: &str,
        opts: &PoolOptions,
        objects: NonNull<u8>,
        len: usize,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Pool, PoolError> {
        check_cache(opts.cache_size)?;
        let l = Layout::new(opts)?;
        let need = l.stride * l.count as usize;
        if !(objects.as_ptr() as usize).is_multiple_of(l.elt_align) || len < need {
            return Err(PoolError::InvalidOptions(format!(
                "external objects at {objects:p}, {len} bytes: need {need} bytes aligned to {}",
                l.elt_align
            )));
        }
        let zone = Arc::new(Zone::create(name, l.elems_off, &ZoneOptions::no_huge())?);
        let base = region(&zone, 0, l.elems_off)?;
        // SAFETY: the zone is brand new, ours alone, and holds the layout's
        // bookkeeping (`l.elems_off` bytes); `base` is 4096-aligned.
        let ring = unsafe { init_free_list(base, &l)? };
        let tracked = opts.track_state || cfg!(debug_assertions);
        Ok(Pool::from_parts(
            zone,
            0,
            base,
            l,
            new_tag(),
            tracked,
            layout::HeaderInfo::cut_name(name),
            ring,
            opts.cache_size,
            Some(External {
                objects,
                _keep: keep,
            }),
        ))
    }

    /// Whether the objects lie in memory the pool does not own
    /// ([`create_over`](Pool::create_over)).
    #[inline]
    pub fn is_external(&self) -> bool {
        self.inner.external.is_some()
    }

    /// The error for what an external pool cannot do.
    fn refuse_external(&self, what: &str) -> Result<(), PoolError> {
        match self.inner.external {
            Some(_) => Err(PoolError::External {
                pool: self.inner.name.clone(),
                what: what.to_string(),
            }),
            None => Ok(()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        zone: Arc<Zone>,
        offset: usize,
        base: NonNull<u8>,
        l: Layout,
        tag: u32,
        tracked: bool,
        name: String,
        ring: Ring<u32>,
        cache_size: usize,
        external: Option<External>,
    ) -> Pool {
        // SAFETY: both offsets are inside the region the callers validated
        // (an external pool's objects are where its creator said).
        let (elems, state) = unsafe {
            (
                external.as_ref().map_or_else(
                    || NonNull::new_unchecked(base.as_ptr().add(l.elems_off)),
                    |e| e.objects,
                ),
                NonNull::new_unchecked(base.as_ptr().add(l.state_off).cast()),
            )
        };
        Pool {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                name,
                tag,
                count: l.count,
                tracked,
                elt_size: l.elt_size,
                stride: l.stride,
                cache_size,
                offset,
                elems_off: offset + l.elems_off,
                elems,
                state,
                ring,
                caches: Mutex::new(Vec::new()),
                retired_hits: AtomicU64::new(0),
                retired_misses: AtomicU64::new(0),
                get_failures: AtomicU64::new(0),
                external,
                zone,
            }),
        }
    }

    // ---- getting objects ---------------------------------------------------

    /// Takes one object, which returns itself to the pool when dropped.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when no object is free.
    pub fn get(&self) -> Result<Obj<'_>, PoolError> {
        self.refuse_external("get (an Obj derefs to a slice; use get_bulk and ptr)")?;
        let mut h = [ObjIdx::default()];
        self.inner.get_handles(&mut h)?;
        self.inner.mark_taken(&h, OBJ);
        Ok(Obj::new(self, h[0], self.inner.elem_ptr(h[0].index())))
    }

    /// Takes `out.len()` objects as raw handles, all or nothing: on error no
    /// object was taken and `out` is unchanged.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when fewer are free.
    pub fn get_bulk(&self, out: &mut [ObjIdx]) -> Result<(), PoolError> {
        self.inner.get_handles(out)?;
        self.inner.mark_taken(out, RAW);
        Ok(())
    }

    /// Takes one object as a raw handle.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when no object is free.
    pub fn get_raw(&self) -> Result<ObjIdx, PoolError> {
        let mut h = [ObjIdx::default()];
        self.get_bulk(&mut h)?;
        Ok(h[0])
    }

    // ---- returning objects -------------------------------------------------

    /// Returns an object taken as a raw handle, without checks in release
    /// builds (the data path); [`put_checked`](Pool::put_checked) is the safe
    /// version.
    ///
    /// # Safety
    /// `handle` must be a handle of this pool that the caller owns: taken
    /// with [`get_bulk`](Pool::get_bulk) / [`get_raw`](Pool::get_raw) (or
    /// [`Obj::into_handle`]) and not returned since. Returning it twice would
    /// let two owners use the same bytes. Debug builds (and tracked pools
    /// through [`put_checked`](Pool::put_checked)) catch such misuse; release
    /// builds do not look.
    pub unsafe fn put(&self, handle: ObjIdx) {
        // SAFETY: the caller's contract.
        unsafe { self.put_bulk(std::slice::from_ref(&handle)) }
    }

    /// Returns objects taken as raw handles (see [`put`](Pool::put)). Bulks
    /// larger than the cache go straight to the shared ring.
    ///
    /// # Safety
    /// As for [`put`](Pool::put), for every handle (and no handle twice).
    pub unsafe fn put_bulk(&self, handles: &[ObjIdx]) {
        self.inner.mark_returned(handles, RAW);
        self.inner
            .put_handles(handles, handles.len() > self.inner.cache_size);
    }

    /// Returns an object taken as a raw handle, after checking, atomically,
    /// that it is a handle of this pool, out as a raw handle, and not already
    /// returned.
    ///
    /// # Errors
    /// [`PoolError::ForeignHandle`]; [`PoolError::NotInUse`] (a double put);
    /// [`PoolError::OwnedByObj`]; [`PoolError::Untracked`] when the pool
    /// keeps no object state. The pool is unchanged on error.
    pub fn put_checked(&self, handle: ObjIdx) -> Result<(), PoolError> {
        self.put_bulk_checked(std::slice::from_ref(&handle))
    }

    /// Returns objects, all or nothing, after checking each as
    /// [`put_checked`](Pool::put_checked) does (a handle listed twice is a
    /// double put).
    ///
    /// # Errors
    /// As [`put_checked`](Pool::put_checked); on error no object was returned.
    pub fn put_bulk_checked(&self, handles: &[ObjIdx]) -> Result<(), PoolError> {
        let inner = &*self.inner;
        if let Some(&h) = handles.iter().find(|h| !inner.owns(**h)) {
            return Err(inner.foreign(h));
        }
        if !inner.tracked {
            return Err(PoolError::Untracked {
                pool: inner.name.clone(),
            });
        }
        for (k, &h) in handles.iter().enumerate() {
            let s = inner.state_of(h);
            if let Err(was) = s.compare_exchange(RAW, FREE, Ordering::AcqRel, Ordering::Relaxed) {
                for &back in &handles[..k] {
                    inner.state_of(back).store(RAW, Ordering::Relaxed);
                }
                return Err(inner.misuse(h, was));
            }
        }
        self.inner
            .put_handles(handles, handles.len() > inner.cache_size);
        Ok(())
    }

    /// Returns an object owned by an [`Obj`] being dropped.
    fn put_obj(&self, handle: ObjIdx) {
        self.inner.mark_returned(std::slice::from_ref(&handle), OBJ);
        self.inner.put_handles(std::slice::from_ref(&handle), false);
    }

    /// Returns the calling thread's cached objects to the shared ring (a
    /// thread about to stop using the pool, or a test counting objects).
    ///
    /// Threads return their caches when they exit anyway, but the end of a
    /// `std::thread::scope` does not wait for that (thread-local destructors
    /// run after a scoped thread is reported finished): a scoped thread whose
    /// objects must be back in the ring when the scope ends calls this last.
    pub fn flush_cache(&self) {
        if let Some(slot) = cache::take_cache(&self.inner) {
            // SAFETY: the slot was this thread's and is no longer in its
            // list, so nobody else can use it; the pool is alive (`self`).
            unsafe { self.inner.retire_cache(&slot) };
        }
    }

    // ---- raw handles -------------------------------------------------------

    /// The handle of object `index`, for callers that keep bare indices.
    ///
    /// # Errors
    /// [`PoolError::ForeignHandle`] when `index >= size()`.
    #[inline]
    pub fn handle(&self, index: u32) -> Result<ObjIdx, PoolError> {
        let h = ObjIdx::new(self.inner.tag, index);
        if self.inner.owns(h) {
            Ok(h)
        } else {
            Err(self.inner.foreign(h))
        }
    }

    /// Pointer to the object's first byte (valid while the pool lives), for
    /// the data path. Dereferencing it is the caller's business: the pool
    /// only checks that the handle is one of its own.
    ///
    /// # Errors
    /// [`PoolError::ForeignHandle`].
    #[inline]
    pub fn ptr(&self, handle: ObjIdx) -> Result<NonNull<u8>, PoolError> {
        if !self.inner.owns(handle) {
            return Err(self.inner.foreign(handle));
        }
        Ok(self.inner.elem_ptr(handle.index()))
    }

    /// Byte offset of the object from the start of the zone: the same in
    /// every process that maps the zone.
    ///
    /// # Errors
    /// [`PoolError::ForeignHandle`].
    pub fn offset_of(&self, handle: ObjIdx) -> Result<usize, PoolError> {
        self.refuse_external("offset_of (its objects are not in its zone)")?;
        if !self.inner.owns(handle) {
            return Err(self.inner.foreign(handle));
        }
        Ok(self.inner.elems_off + handle.index() as usize * self.inner.stride)
    }

    /// The handle of the object starting at byte `offset` of the zone
    /// (inverse of [`offset_of`](Pool::offset_of)).
    ///
    /// # Errors
    /// [`PoolError::BadOffset`] when no object starts there.
    pub fn handle_at(&self, offset: usize) -> Result<ObjIdx, PoolError> {
        self.refuse_external("handle_at (its objects are not in its zone)")?;
        let inner = &*self.inner;
        let bad = || PoolError::BadOffset {
            offset,
            pool: inner.name.clone(),
        };
        let rel = offset.checked_sub(inner.elems_off).ok_or_else(bad)?;
        if rel % inner.stride != 0 || rel / inner.stride >= inner.count as usize {
            return Err(bad());
        }
        Ok(ObjIdx::new(inner.tag, (rel / inner.stride) as u32))
    }

    /// The device address of the object's first byte (see [`Zone::iova`]).
    ///
    /// With [`IovaMode::Pa`] this holds for the object's first page only:
    /// objects are not padded to stay within a page, so one that crosses a
    /// page boundary of its zone (4 KiB pages, or a 2 MiB boundary) goes on
    /// at an unrelated physical address. For a device that must reach a
    /// whole object, look up each of its pages ([`Zone::iova`]) or pick an
    /// element size whose stride divides the page size.
    ///
    /// # Errors
    /// [`PoolError::ForeignHandle`]; [`PoolError::Zone`] from the look-up.
    pub fn iova(&self, handle: ObjIdx, mode: IovaMode) -> Result<u64, PoolError> {
        self.refuse_external("iova (its objects are not in its zone)")?;
        Ok(self.inner.zone.iova(self.offset_of(handle)?, mode)?)
    }

    /// Whether the object is taken (as a raw handle or by an [`Obj`]), in any
    /// process.
    ///
    /// # Errors
    /// [`PoolError::ForeignHandle`]; [`PoolError::Untracked`].
    pub fn is_in_use(&self, handle: ObjIdx) -> Result<bool, PoolError> {
        if !self.inner.owns(handle) {
            return Err(self.inner.foreign(handle));
        }
        if !self.inner.tracked {
            return Err(PoolError::Untracked {
                pool: self.inner.name.clone(),
            });
        }
        Ok(self.inner.state_of(handle).load(Ordering::Relaxed) != FREE)
    }

    // ---- facts and counters ------------------------------------------------

    /// Number of objects in the pool.
    pub fn size(&self) -> usize {
        self.inner.count as usize
    }

    /// Objects free: in the shared ring plus in this process's thread caches
    /// of this handle.
    pub fn available(&self) -> usize {
        self.inner.ring.len() + self.inner.cached()
    }

    /// Objects free in the shared ring only (not counting thread caches): a
    /// lock-free read for pools without caches, whose every free object is
    /// there.
    #[inline]
    pub fn available_in_ring(&self) -> usize {
        self.inner.ring.len()
    }

    /// Objects not [`available`](Pool::available): taken by someone (or held
    /// in another process's caches).
    pub fn in_use(&self) -> usize {
        self.size().saturating_sub(self.available())
    }

    /// Counters and occupancy in one snapshot.
    pub fn stats(&self) -> PoolStats {
        let inner = &*self.inner;
        // Under the caches' lock, which a retiring cache holds while its
        // counts move to the retired totals.
        let caches = inner.caches.lock().unwrap_or_else(|p| p.into_inner());
        let (mut hits, mut misses) = (
            inner.retired_hits.load(Ordering::Relaxed),
            inner.retired_misses.load(Ordering::Relaxed),
        );
        let mut in_caches = 0;
        for s in caches.iter() {
            let (h, m) = s.counts();
            hits += h;
            misses += m;
            in_caches += s.len();
        }
        let in_ring = inner.ring.len();
        let size = self.size();
        PoolStats {
            size,
            available: in_ring + in_caches,
            in_use: size.saturating_sub(in_ring + in_caches),
            in_ring,
            in_caches,
            cache_hits: hits,
            cache_misses: misses,
            get_failures: inner.get_failures.load(Ordering::Relaxed),
        }
    }

    /// Bytes of each object.
    #[inline]
    pub fn elt_size(&self) -> usize {
        self.inner.elt_size
    }

    /// Distance in bytes between consecutive objects.
    pub fn stride(&self) -> usize {
        self.inner.stride
    }

    /// This handle's per-thread cache size (0: no cache).
    pub fn cache_size(&self) -> usize {
        self.inner.cache_size
    }

    /// Whether the pool keeps per-object state ([`PoolOptions::track_state`]).
    pub fn is_tracked(&self) -> bool {
        self.inner.tracked
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The pool's tag: random, recorded in its header, part of every handle.
    #[inline]
    pub fn tag(&self) -> u32 {
        self.inner.tag
    }

    /// The zone the pool lives in.
    pub fn zone(&self) -> &Arc<Zone> {
        &self.inner.zone
    }

    /// Offset of the pool in its zone (for [`attach`](Pool::attach)).
    pub fn offset(&self) -> usize {
        self.inner.offset
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.inner.name)
            .field("tag", &format_args!("{:#010x}", self.inner.tag))
            .field("size", &self.size())
            .field("elt_size", &self.inner.elt_size)
            .field("cache_size", &self.inner.cache_size)
            .field("available", &self.available())
            .finish()
    }
}

fn check_cache(cache_size: usize) -> Result<(), PoolError> {
    if cache_size > Pool::MAX_CACHE {
        return Err(PoolError::InvalidOptions(format!(
            "cache size {cache_size}: at most {} objects per thread",
            Pool::MAX_CACHE
        )));
    }
    Ok(())
}

/// The start of `need` bytes at `offset` of `zone`, checked.
fn region(zone: &Zone, offset: usize, need: usize) -> Result<NonNull<u8>, PoolError> {
    if !offset.is_multiple_of(POOL_ALIGN) {
        return Err(PoolError::InvalidOptions(format!(
            "pool offset {offset:#x} in zone {:?}: must be a multiple of {POOL_ALIGN}",
            zone.name()
        )));
    }
    let have = zone.len().saturating_sub(offset);
    if offset >= zone.len() || need > have {
        return Err(PoolError::ZoneTooSmall { offset, need, have });
    }
    // SAFETY: offset < zone.len(), so the pointer is inside the mapping.
    Ok(unsafe { NonNull::new_unchecked(zone.as_ptr().add(offset)) })
}

/// Builds the free ring (every index free) and the state bytes of a pool laid
/// out as `l` at `base`.
///
/// # Safety
/// The bytes `base .. base + l.elems_off` are valid, 4096-aligned at `base`,
/// and used by nobody else.
unsafe fn init_free_list(base: NonNull<u8>, l: &Layout) -> Result<Ring<u32>, PoolError> {
    // SAFETY: the ring's bytes are inside the caller's region (layout), ours
    // alone, and aligned (the region is 4096-aligned, `ring_off` a multiple
    // of 128).
    let ring = unsafe {
        let ring_region = base.as_ptr().add(l.ring_off);
        Ring::<u32>::init_in(ring_region, l.ring_len, l.ring_cap, RingMode::MPMC)?
    };
    // SAFETY: the state bytes are inside the region (layout), ours alone.
    unsafe {
        base.as_ptr()
            .add(l.state_off)
            .write_bytes(FREE, l.count as usize)
    };
    let mut next = 0u32;
    let mut chunk = [0u32; 1024];
    while next < l.count {
        let n = ((l.count - next) as usize).min(chunk.len());
        for (i, c) in chunk[..n].iter_mut().enumerate() {
            *c = next + i as u32;
        }
        ring.enqueue_bulk(&chunk[..n])
            .expect("a fresh ring of capacity >= count holds every index");
        next += n as u32;
    }
    Ok(ring)
}

/// A random non-zero tag for a new pool.
fn new_tag() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT_ID.load(Ordering::Relaxed));
    h.write_u32(std::process::id());
    let t = h.finish();
    ((t >> 32) as u32 ^ t as u32).max(1)
}
