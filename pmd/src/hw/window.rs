//! Memory-window handles: the local inbound window (read-write, ours) and the
//! outbound handle onto a peer's inbound window (**posted writes only**).
//!
//! A write through an NTB is a posted PCIe transaction: fire and forget,
//! ordered, cheap. A read is non-posted: it waits a round trip and occupies a
//! requester-ID look-up table (R-LUT) entry. [`PeerWindow`] therefore has no
//! read method at all; the non-posted reads are
//! [`NtbDevice::non_posted_read`](super::NtbDevice::non_posted_read) and
//! [`NtbDevice::peer_spad_read`](super::NtbDevice::peer_spad_read), separately
//! named and counted.
//!
//! Every access is bounds-checked here: an offset or length outside the window
//! is an [`HwError::OutOfBounds`], never a stray write.
//!
//! # Memory model
//! Window memory is shared with other processes (or, on hardware, with another
//! host). Bulk copies are plain copies; ordering between a payload and the flag
//! that publishes it comes from [`PeerWindow::write_u64`] /
//! [`PeerWindow::write_u32`] (release stores) on the writer side and
//! [`LocalWindow::load_u64`] (acquire loads) on the reader side, as in any
//! single-producer message-passing protocol.

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};

use super::copy::move_bytes;
use super::counters::{DeviceCounters, HandleCounters};
use super::error::{HwError, Result};
use super::grant::covered;
use super::grant_table::LiveGrants;
use super::tenure::Tenure;
use super::wc::WriteCombining;

/// Keeps a mapping alive for as long as any handle onto it exists.
pub type Keepalive = Arc<dyn Any + Send + Sync>;

#[inline]
fn check(offset: usize, len: usize, window_len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= window_len => Ok(()),
        _ => Err(HwError::OutOfBounds {
            offset,
            len,
            window_len,
        }),
    }
}

#[inline]
fn check_aligned(offset: usize, size: usize, window_len: usize) -> Result<()> {
    check(offset, size, window_len)?;
    if !offset.is_multiple_of(size) {
        return Err(HwError::Misaligned { offset, size });
    }
    Ok(())
}

/// The outbound handle onto one peer's inbound window: posted writes only.
///
/// Cheap to clone (it shares the mapping). There is deliberately no way to
/// read through it.
///
/// A handle is `Send` but not `Sync`: it counts its writes without atomic
/// read-modify-writes (see [`DeviceCounters`]), so each thread that writes
/// holds its own clone.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::AtomicU64;
/// use ntbdk_pmd::hw::{DeviceCounters, PeerWindow};
///
/// // A window over memory of this process, as a backend would build one over
/// // a mapping: atomics, as memory written through a raw pointer while
/// // shared references to it exist must be interior-mutable.
/// let mem: Arc<Vec<AtomicU64>> = Arc::new((0..512).map(|_| AtomicU64::new(0)).collect());
/// let counters = Arc::new(DeviceCounters::default());
/// // SAFETY: `mem` is 4096 bytes, 8-byte aligned, interior-mutable, lives as
/// // long as the handle (it is the keepalive) and is only accessed through
/// // this handle.
/// let win = unsafe {
///     PeerWindow::from_raw(mem.as_ptr() as *mut u8, 4096, 1, counters.clone(), mem.clone())
/// };
/// win.write(0, b"hello").unwrap();
/// win.write_u64(8, 42).unwrap();
/// assert!(win.write(4090, b"too long").is_err()); // bounds-checked, nothing written
/// assert_eq!(counters.snapshot().posted_writes, 2);
/// assert_eq!(counters.snapshot().non_posted_reads, 0);
/// ```
pub struct PeerWindow {
    base: *mut u8,
    len: usize,
    peer: u16,
    /// Checks and policies some backends add (tenure, grant,
    /// write-combining); `None` keeps the plain path free of them.
    guard: Option<Arc<Guard>>,
    counters: Arc<DeviceCounters>,
    /// This handle's own counts (single writer: the handle is not `Sync`).
    mine: Arc<HandleCounters>,
    _keep: Keepalive,
    _not_sync: PhantomData<Cell<()>>,
}

// The handle only writes into a mapping kept alive by `_keep`; racing writers
// are the protocol's concern (as on real hardware); it never makes references.
// SAFETY: as just said; a move also moves its counter block's only writer.
unsafe impl Send for PeerWindow {}

impl Clone for PeerWindow {
    /// Another handle onto the same mapping, with its own counter block.
    fn clone(&self) -> Self {
        Self {
            base: self.base,
            len: self.len,
            peer: self.peer,
            guard: self.guard.clone(),
            counters: self.counters.clone(),
            mine: self.counters.register(),
            _keep: self._keep.clone(),
            _not_sync: PhantomData,
        }
    }
}

impl Drop for PeerWindow {
    fn drop(&mut self) {
        self.counters.retire(&self.mine);
    }
}

impl std::fmt::Debug for PeerWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerWindow")
            .field("peer", &self.peer)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PeerWindow {
    /// Builds a handle over `len` bytes at `base`, the mapping of `peer`'s
    /// inbound window, counting into `counters`.
    ///
    /// # Safety
    /// `base..base+len` must be a valid writable mapping for as long as `keep`
    /// is alive, and must be at least 8-byte aligned. Memory of this process
    /// must be writable through `base`: not reached through a shared
    /// reference unless it is interior-mutable (atomics or `UnsafeCell`).
    pub unsafe fn from_raw(
        base: *mut u8,
        len: usize,
        peer: u16,
        counters: Arc<DeviceCounters>,
        keep: Keepalive,
    ) -> Self {
        debug_assert_eq!(base as usize % 8, 0, "window base must be 8-byte aligned");
        Self {
            base,
            len,
            peer,
            guard: None,
            mine: counters.register(),
            counters,
            _keep: keep,
            _not_sync: PhantomData,
        }
    }

    /// The same handle, writing only while `tenure` holds: every write
    /// first checks that the writer still holds its place on the fabric,
    /// and fails with [`HwError::SlotLost`] (nothing written) once it does
    /// not.
    pub fn with_tenure(mut self, tenure: Tenure) -> Self {
        self.guard_mut().tenure = Some(tenure);
        self
    }

    /// The same handle, writing only inside `ranges` (what the peer
    /// granted us: see [`PeerGrant`](super::PeerGrant)); a write outside
    /// them fails with [`HwError::NotGranted`] (nothing written, counted).
    pub fn with_grant(mut self, ranges: Vec<Range<usize>>) -> Self {
        self.guard_mut().granted = Some(ranges.into());
        self
    }

    /// The same handle, also writing what the peer's live table grants us
    /// (the regions it registered for us, consulted at each write outside
    /// the ranges of [`with_grant`](Self::with_grant)).
    pub(crate) fn with_live_grants(mut self, live: LiveGrants) -> Self {
        self.guard_mut().live = Some(live);
        self
    }

    /// The guard, to set a field of it (before the handle is shared), under
    /// a new id: its checks are not those of any other guard.
    fn guard_mut(&mut self) -> &mut Guard {
        /// The last guard id handed out (0: a handle without checks).
        static LAST_GUARD_ID: AtomicU64 = AtomicU64::new(0);
        let g = Arc::make_mut(self.guard.get_or_insert_with(Default::default));
        g.id = LAST_GUARD_ID.fetch_add(1, Ordering::Relaxed) + 1;
        g
    }

    /// Whether this handle may write `len` bytes at `offset` (see
    /// [`with_tenure`](Self::with_tenure), [`with_grant`](Self::with_grant)).
    #[inline]
    fn admitted(&self, offset: usize, len: usize) -> Result<Option<u64>> {
        match &self.guard {
            None => Ok(None),
            Some(g) => g.admit(self.peer, &self.counters, offset, len),
        }
    }

    /// Marks the mapping write-combining (see [`WriteCombining`]): every release
    /// store is then preceded by a store fence.
    pub fn write_combining(mut self, wc: Arc<WriteCombining>) -> Self {
        self.guard_mut().wc = Some(wc);
        self
    }

    /// The write-combining policy, if the mapping is write-combining.
    #[inline]
    fn wc(&self) -> Option<&WriteCombining> {
        self.guard.as_ref()?.wc.as_deref()
    }

    /// Whether the mapping is write-combining.
    #[inline]
    pub fn is_write_combining(&self) -> bool {
        self.wc().is_some()
    }

    /// Tells a write-combining policy's probe of a data store.
    #[inline]
    fn note_data(&self, offset: usize, len: usize) {
        if let Some(wc) = self.wc() {
            wc.data(offset, len);
        }
    }

    /// Size of the window in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no bytes (never true for a real window).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The peer (port/slot) whose window this is.
    #[inline]
    pub fn peer(&self) -> u16 {
        self.peer
    }

    /// Copies `src` to `offset` in the peer's window (posted writes).
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is ordinary memory of `src.len()` bytes, readable.
        unsafe { self.write_from_ptr(offset, src.as_ptr(), src.len()) }
    }

    /// Copies `len` bytes at `src` to `offset` in the peer's window (posted
    /// writes), pointer to pointer: for sources no slice may be made over,
    /// such as a buffer of our own window that a peer filled (a received
    /// mbuf being forwarded).
    ///
    /// # Safety
    /// `src .. src + len` is valid for reads for the whole call (it may be
    /// written concurrently: the copy then carries whatever bytes it read).
    #[inline]
    pub unsafe fn write_from_ptr(&self, offset: usize, src: *const u8, len: usize) -> Result<()> {
        check(offset, len, self.len)?;
        self.admitted(offset, len)?;
        // A move (memmove) holds even if the two overlap (a loopback fabric
        // maps one memory as both windows).
        // SAFETY: bounds checked above; the mapping is valid while `_keep`
        // lives; `src` is readable for `len` bytes (the caller's contract).
        unsafe { move_bytes(src, self.base.add(offset), len) };
        self.mine.posted(len);
        self.note_data(offset, len);
        Ok(())
    }

    /// Checks `len` bytes at `offset` once (bounds, and the tenure and
    /// grants of [`with_tenure`](Self::with_tenure) and
    /// [`with_grant`](Self::with_grant)) for many writes into them: a
    /// burst's payloads into the buffers a peer lent. The checks hold as of
    /// this call, as a single write's hold as of that write.
    #[inline]
    pub fn span(&self, offset: usize, len: usize) -> Result<WindowSpan<'_>> {
        check(offset, len, self.len)?;
        self.admitted(offset, len)?;
        Ok(WindowSpan {
            win: self,
            offset,
            len,
        })
    }

    /// Checks `len` bytes at `offset` as [`span`](Self::span) does, into a
    /// token the caller keeps across calls: for a stream of writes into one
    /// region ([`write_admitted`](Self::write_admitted)).
    #[inline]
    pub fn admit(&self, offset: usize, len: usize) -> Result<Admitted> {
        check(offset, len, self.len)?;
        let epoch = self.admitted(offset, len)?;
        Ok(Admitted {
            base: self.base as usize,
            guard: self.guard_id(),
            offset,
            len,
            epoch,
        })
    }

    /// Which checks this handle makes (its guard's id; 0: none): handles
    /// onto one mapping with other checks differ in it. An id, not the
    /// guard's address, which a later guard may be given once this one is
    /// freed (a token would then pass for one of the new guard's).
    #[inline]
    fn guard_id(&self) -> u64 {
        self.guard.as_ref().map_or(0, |g| g.id)
    }

    /// The range `admitted` as a span for many writes, checked once: its
    /// bounds against this handle's window, then what can have changed
    /// since the admission (see [`Admitted`]); when that no longer holds,
    /// or another handle (another mapping, or the same with other checks)
    /// admitted it, the range is admitted again first (and `admitted`
    /// updated) or the error returned.
    #[inline]
    pub fn span_admitted(&self, admitted: &mut Admitted) -> Result<WindowSpan<'_>> {
        if let Some(span) = self.span_if_admitted(admitted) {
            return Ok(span);
        }
        // Whoever admitted it, the range never reaches past this window:
        // `admit` checks it against this handle's length first.
        *admitted = self.readmit(admitted)?;
        Ok(WindowSpan {
            win: self,
            offset: admitted.offset,
            len: admitted.len,
        })
    }

    /// The range `admitted` as a span when its admission still holds
    /// through this handle: admitted through it (same mapping, same
    /// checks), inside its window, and nothing since changed what admitted
    /// it (see [`Admitted`]). `None` when it must be admitted again
    /// ([`span_admitted`](Self::span_admitted) does that): the stream's
    /// common case alone, small enough to inline where writes are posted.
    #[inline(always)]
    pub fn span_if_admitted(&self, admitted: &Admitted) -> Option<WindowSpan<'_>> {
        let inside = admitted
            .offset
            .checked_add(admitted.len)
            .is_some_and(|end| end <= self.len);
        let current = inside
            && admitted.base == self.base as usize
            && admitted.guard == self.guard_id()
            && self
                .guard
                .as_ref()
                .is_none_or(|g| g.still_admits(admitted.epoch));
        // The range lies in this window (checked just above).
        current.then_some(WindowSpan {
            win: self,
            offset: admitted.offset,
            len: admitted.len,
        })
    }

    /// [`write`](Self::write) at `at` bytes into the range `admitted`,
    /// through [`span_admitted`](Self::span_admitted): checked against the
    /// range's bounds, nothing written on an error.
    #[inline]
    pub fn write_admitted(&self, admitted: &mut Admitted, at: usize, src: &[u8]) -> Result<()> {
        check(at, src.len(), admitted.len)?;
        self.span_admitted(admitted)?.write(at, src)
    }

    /// [`admit`](Self::admit) again of the range of a token that no longer
    /// holds here (out of line: the stream's rare case).
    #[cold]
    #[inline(never)]
    fn readmit(&self, stale: &Admitted) -> Result<Admitted> {
        self.admit(stale.offset, stale.len)
    }

    /// Stores `words` at `offset` (8-byte aligned), two words to a 16-byte
    /// store where the CPU has them (publish them with a release store
    /// after). For queue slots a sender builds as words: a body built byte
    /// by byte and copied out with wide loads stalls on store forwarding;
    /// words read one by one do not, and wide stores keep few entries of
    /// the store buffer busy while the lines are fetched for writing.
    #[inline]
    pub fn write_words(&self, offset: usize, words: &[u64]) -> Result<()> {
        check_aligned(offset, 8, self.len)?;
        check(offset, words.len() * 8, self.len)?;
        self.admitted(offset, words.len() * 8)?;
        // SAFETY: `offset .. + 8 * words.len()` is in bounds and 8-byte
        // aligned (checked above; base is 8-byte aligned).
        unsafe { self.store_words(offset, words) };
        Ok(())
    }

    /// [`write_words`](Self::write_words), then `last` in the 8 bytes right
    /// after them with a release store: a whole queue slot (its body, then
    /// the tag that publishes it) checked and admitted once, not once per
    /// store.
    #[inline]
    pub fn write_words_then_u64(&self, offset: usize, words: &[u64], last: u64) -> Result<()> {
        check_aligned(offset, 8, self.len)?;
        self.span(offset, words.len() * 8 + 8)?
            .write_words_then_u64(0, words, last)
    }

    /// Stores `words` at `offset` ([`store_words_uncounted`]), and counts
    /// them.
    ///
    /// [`store_words_uncounted`]: Self::store_words_uncounted
    ///
    /// # Safety
    /// As [`store_words_uncounted`](Self::store_words_uncounted).
    #[inline(always)]
    unsafe fn store_words(&self, offset: usize, words: &[u64]) {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.store_words_uncounted(offset, words) };
        self.mine.posted(words.len() * 8);
        self.note_data(offset, words.len() * 8);
    }

    /// Stores `words` at `offset`, two words to a 16-byte store where the
    /// CPU has them; the caller counts them.
    ///
    /// # Safety
    /// `offset .. offset + 8 * words.len()` is inside the window and
    /// `offset` is 8-byte aligned (the mapping lives while `_keep` does).
    #[inline(always)]
    unsafe fn store_words_uncounted(&self, offset: usize, words: &[u64]) {
        let dst = self.base.wrapping_add(offset);
        let mut pairs = words.chunks_exact(2);
        let mut i = 0;
        for p in &mut pairs {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `offset + 8 * i .. + 16` is in bounds (the caller's
            // promise for the whole run); SSE2 is baseline on x86_64; the
            // store is unaligned-safe.
            unsafe {
                use std::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_storeu_si128};
                let v = _mm_set_epi64x(p[1] as i64, p[0] as i64);
                _mm_storeu_si128(dst.add(8 * i).cast::<__m128i>(), v);
            }
            #[cfg(not(target_arch = "x86_64"))]
            // SAFETY: in bounds and 8-byte aligned (the caller's promise;
            // base is 8-byte aligned).
            unsafe {
                dst.add(8 * i).cast::<u64>().write(p[0]);
                dst.add(8 * i + 8).cast::<u64>().write(p[1]);
            }
            i += 2;
        }
        if let [w] = pairs.remainder() {
            // SAFETY: in bounds and 8-byte aligned (the caller's promise;
            // base is 8-byte aligned).
            unsafe { dst.add(8 * i).cast::<u64>().write(*w) };
        }
    }

    /// Like [`write`](Self::write), with non-temporal (cache-bypassing)
    /// stores where the CPU has them, for large copies the writer will not
    /// touch again. Ends with a store fence, so a following release store is
    /// ordered after the data.
    #[inline]
    pub fn write_nt(&self, offset: usize, src: &[u8]) -> Result<()> {
        check(offset, src.len(), self.len)?;
        self.admitted(offset, src.len())?;
        // SAFETY: bounds checked above; the mapping is valid while `_keep`
        // lives; `src` is ordinary memory of `src.len()` bytes.
        unsafe { nt_copy(self.base.add(offset), src.as_ptr(), src.len()) };
        self.mine.posted(src.len());
        self.note_data(offset, src.len());
        if let Some(wc) = self.wc() {
            wc.fenced();
        }
        Ok(())
    }

    /// Copies `len` bytes at `src_off` of our window `src` to `offset` in
    /// the peer's window (posted writes), with non-temporal stores when
    /// `non_temporal` (then ending with a store fence). Pointer to pointer:
    /// no reference is ever made over either window's memory, which peers
    /// may be writing concurrently (the copy then carries whatever bytes it
    /// read; it never leaves either mapping).
    #[inline]
    pub fn copy_from_local(
        &self,
        offset: usize,
        src: &LocalWindow,
        src_off: usize,
        len: usize,
        non_temporal: bool,
    ) -> Result<()> {
        check(offset, len, self.len)?;
        self.admitted(offset, len)?;
        let from = src.ptr_at(src_off, len)?;
        let to = self.base.wrapping_add(offset);
        // Non-temporal stores copy forwards: only for ranges apart (a
        // loopback fabric maps one memory as both windows).
        let (from_a, to_a) = (from.addr(), to.addr());
        let apart = from_a + len <= to_a || to_a + len <= from_a;
        // SAFETY: both ranges were checked to lie in their mappings, which
        // `self._keep` and `src` keep alive for this call; `copy` allows
        // overlap, and `nt_copy` runs only on ranges apart.
        unsafe {
            if non_temporal && apart {
                nt_copy(self.base.add(offset), from, len);
            } else {
                std::ptr::copy(from, self.base.add(offset), len);
                if non_temporal {
                    // As `nt_copy` ends, so that `non_temporal` means the
                    // same ordering whichever copy ran.
                    store_fence();
                }
            }
        }
        self.mine.posted(len);
        self.note_data(offset, len);
        if non_temporal && let Some(wc) = self.wc() {
            wc.fenced();
        }
        Ok(())
    }

    /// Stores `v` at `offset` (4-byte aligned) with release ordering: every
    /// write this thread made before it is visible to a reader that sees `v`.
    #[inline]
    pub fn write_u32(&self, offset: usize, v: u32) -> Result<()> {
        self.store_release(offset, 4, |p| {
            // SAFETY: `store_release` checked `p` is in bounds and 4-byte
            // aligned; AtomicU32 has u32's layout.
            unsafe { AtomicU32::from_ptr(p.cast()) }.store(v, Ordering::Release)
        })
    }

    /// Stores `v` at `offset` (8-byte aligned) with release ordering: every
    /// write this thread made before it is visible to a reader that sees `v`.
    #[inline]
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<()> {
        self.store_release(offset, 8, |p| {
            // SAFETY: `store_release` checked `p` is in bounds and 8-byte
            // aligned; AtomicU64 has u64's layout.
            unsafe { AtomicU64::from_ptr(p.cast()) }.store(v, Ordering::Release)
        })
    }

    /// Checks that a `size`-byte word at `offset` is in bounds and aligned
    /// (base is 8-byte aligned), lets `store` write it at its address (the
    /// mapping lives while `_keep` does), and counts it.
    #[inline]
    fn store_release(&self, offset: usize, size: usize, store: impl FnOnce(*mut u8)) -> Result<()> {
        check_aligned(offset, size, self.len)?;
        self.admitted(offset, size)?;
        self.publish(offset, size, store);
        Ok(())
    }

    /// Lets `store` write the checked and admitted `size`-byte word at
    /// `offset` (a release store), fenced first on a write-combining
    /// mapping, and counts it.
    #[inline(always)]
    fn publish(&self, offset: usize, size: usize, store: impl FnOnce(*mut u8)) {
        if let Some(wc) = self.wc() {
            wc.before_publish();
        }
        store(self.base.wrapping_add(offset));
        self.mine.posted(size);
        if let Some(wc) = self.wc() {
            wc.published(offset, size);
        }
    }

    /// Write barrier: orders every earlier write (including non-temporal
    /// ones) before every later one.
    #[inline]
    pub fn wmb(&self) {
        store_fence();
        if let Some(wc) = self.wc() {
            wc.fenced();
        }
    }
}

/// What a backend adds to a peer window's writes: a tenure to check (no
/// zombies), a grant to stay inside (per-peer translation: fixed ranges,
/// then the peer's live table), a write-combining policy. Kept behind one
/// pointer, checked out of line, so the plain path (loopback, a window
/// with none of them) pays one test.
#[derive(Clone, Default)]
struct Guard {
    /// Unique among the guards of this process (see `PeerWindow::guard_id`).
    id: u64,
    tenure: Option<Tenure>,
    granted: Option<Arc<[Range<usize>]>>,
    live: Option<LiveGrants>,
    wc: Option<Arc<WriteCombining>>,
}

impl Guard {
    /// `Ok` when `len` bytes at `offset` are inside the grant (a fixed
    /// range first: the writer's own section, where most writes go; else
    /// the live table) and we still hold our place; else the error (a
    /// grant refusal is counted). The `Ok` says on what the admission
    /// rests: `None`, the fixed ranges (which never change); `Some(n)`,
    /// the live table at sequence number `n`.
    #[inline]
    fn admit(
        &self,
        peer: u16,
        counters: &DeviceCounters,
        offset: usize,
        len: usize,
    ) -> Result<Option<u64>> {
        match &self.granted {
            Some(g) if !covered(g, offset, len) => {
                return self.admit_live(peer, counters, offset, len);
            }
            // Live grants alone (no fixed ranges): every write is the
            // table's to admit.
            None if self.live.is_some() => {
                return self.admit_live(peer, counters, offset, len);
            }
            _ => {}
        }
        self.held().map(|()| None)
    }

    /// [`admit`](Self::admit) outside the fixed ranges: by the live table
    /// (out of line, so the hot path into a section stays small).
    #[cold]
    #[inline(never)]
    fn admit_live(
        &self,
        peer: u16,
        counters: &DeviceCounters,
        offset: usize,
        len: usize,
    ) -> Result<Option<u64>> {
        let epoch = match self.live.as_ref().map(|l| l.admitted_at(offset, len)) {
            Some(Ok(Some(epoch))) => epoch,
            Some(Err(_)) => return Err(HwError::GrantTableBusy { peer }),
            Some(Ok(None)) | None => {
                counters.ungranted();
                return Err(HwError::NotGranted { peer, offset, len });
            }
        };
        self.held().map(|()| Some(epoch))
    }

    /// Whether an admission resting on `epoch` (see [`admit`](Self::admit))
    /// holds now: we hold our place and, for one the live table made, the
    /// table has not been edited since.
    #[inline]
    fn still_admits(&self, epoch: Option<u64>) -> bool {
        self.held().is_ok()
            && epoch.is_none_or(|n| self.live.as_ref().is_some_and(|l| l.epoch() == n))
    }

    /// `Ok` while we hold our place on the fabric (or nothing says).
    #[inline]
    fn held(&self) -> Result<()> {
        match &self.tenure {
            Some(t) => t.check(),
            None => Ok(()),
        }
    }
}

/// A range of one [`PeerWindow`] admitted once ([`PeerWindow::admit`]) and
/// kept by its owner across calls, unlike a borrowed [`WindowSpan`] (which
/// [`PeerWindow::span_admitted`] makes of it, to read its bounds): the
/// region a stream of one-sided writes targets. A write through it
/// ([`PeerWindow::write_admitted`]) re-checks only what can have changed
/// since: that we hold our place and, when the live grant table admitted
/// it, that the table's sequence number is the same (every edit raises it);
/// and, always, that the range lies in the window written through. A token
/// another handle admitted (another mapping, or the same with other checks)
/// is admitted again, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// The handle it was admitted through: its mapping's address and its
    /// checks (`PeerWindow::guard_id`); a write through another handle
    /// admits the range again.
    base: usize,
    guard: u64,
    offset: usize,
    len: usize,
    /// What the admission rests on (see `Guard::admit`).
    epoch: Option<u64>,
}

/// A range of a [`PeerWindow`] checked once ([`PeerWindow::span`]), for
/// many writes into it.
#[derive(Debug, Clone, Copy)]
pub struct WindowSpan<'a> {
    win: &'a PeerWindow,
    offset: usize,
    len: usize,
}

impl WindowSpan<'_> {
    /// Where the span starts in its window.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The span's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// [`PeerWindow::write`] at `at` bytes into the span, checked against
    /// the span's bounds only.
    #[inline]
    pub fn write(&self, at: usize, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is ordinary memory of `src.len()` bytes, readable.
        unsafe { self.write_from_ptr(at, src.as_ptr(), src.len()) }
    }

    /// [`PeerWindow::write_from_ptr`] at `at` bytes into the span, checked
    /// against the span's bounds only (the window's checks were made for the
    /// whole span).
    ///
    /// # Safety
    /// As [`PeerWindow::write_from_ptr`].
    #[inline(always)]
    pub unsafe fn write_from_ptr(&self, at: usize, src: *const u8, len: usize) -> Result<()> {
        check(at, len, self.len)?;
        let offset = self.offset + at;
        // `at .. at + len` lies in the span (checked above), which lies in
        // the window (checked where the span was made: `span`,
        // `span_admitted`), mapped while it is borrowed here.
        // SAFETY: as just said; `src` is readable (the caller's contract); a
        // move holds even for overlapping spans.
        unsafe { move_bytes(src, self.win.base.add(offset), len) };
        self.win.mine.posted(len);
        self.win.note_data(offset, len);
        Ok(())
    }

    /// [`PeerWindow::write_words_then_u64`] at `at` bytes into the span
    /// (8-byte aligned), checked against the span's bounds only: a queue
    /// slot (its body, then the tag that publishes it) of a ring whose
    /// whole area the span is.
    #[inline(always)]
    pub fn write_words_then_u64(&self, at: usize, words: &[u64], last: u64) -> Result<()> {
        self.store_words_then_u64(at, words, last)?;
        // Two posted writes, as `store_words` and `publish` count them.
        self.count_posted_writes(2, words.len() * 8 + 8);
        Ok(())
    }

    /// [`write_words_then_u64`](Self::write_words_then_u64) without
    /// counting the two posted writes: for a run of slots counted once, with
    /// [`count_posted_writes`](Self::count_posted_writes) (a counter update
    /// per slot is two more stores queued behind the slot's, which wait for
    /// lines the receiver holds).
    #[inline(always)]
    pub fn store_words_then_u64(&self, at: usize, words: &[u64], last: u64) -> Result<()> {
        let tail = words.len() * 8;
        // One bounds check in the span (which lies in the window), one
        // alignment check of where the slot lands in the window.
        check(at, tail + 8, self.len)?;
        let offset = self.offset + at;
        if !offset.is_multiple_of(8) {
            return Err(HwError::Misaligned { offset, size: 8 });
        }
        // SAFETY: `offset .. + tail + 8` lies in the span (checked above),
        // inside the window (checked where the span was made: `span`,
        // `span_admitted`), and is 8-byte aligned.
        unsafe { self.win.store_words_uncounted(offset, words) };
        let wc = self.win.wc();
        if let Some(wc) = wc {
            wc.data(offset, tail);
            wc.before_publish();
        }
        // SAFETY: the 8 bytes after the words, in bounds and 8-byte aligned
        // as checked above; AtomicU64 has u64's layout.
        let tag = unsafe { AtomicU64::from_ptr(self.win.base.add(offset + tail).cast()) };
        tag.store(last, Ordering::Release);
        if let Some(wc) = wc {
            wc.published(offset + tail, 8);
        }
        Ok(())
    }

    /// Counts `writes` posted writes of `bytes` bytes in all made through
    /// the span with [`store_words_then_u64`](Self::store_words_then_u64).
    #[inline]
    pub fn count_posted_writes(&self, writes: u64, bytes: usize) {
        self.win.mine.posted_writes(writes, bytes);
    }

    /// [`PeerWindow::write_u64`] at `at` bytes into the span (8-byte
    /// aligned), checked against the span's bounds only.
    #[inline]
    pub fn write_u64(&self, at: usize, v: u64) -> Result<()> {
        check_aligned(at, 8, self.len)?;
        let offset = self.offset + at;
        check_aligned(offset, 8, self.win.len)?;
        self.win.publish(offset, 8, |p| {
            // SAFETY: `offset .. + 8` lies in the span, inside the window
            // (checked where the span was made), 8-byte aligned (checked
            // above; the base is too); AtomicU64 has u64's layout.
            unsafe { AtomicU64::from_ptr(p.cast()) }.store(v, Ordering::Release)
        });
        Ok(())
    }
}

/// Orders all earlier stores, non-temporal ones included, before later ones.
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions; SSE is baseline on x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    fence(Ordering::Release);
}

/// Copies `n` bytes from `src` to `dst` with non-temporal stores where
/// available, then fences.
///
/// # Safety
/// `dst..dst+n` must be valid for writes and `src..src+n` for reads.
unsafe fn nt_copy(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let mut i = 0;
        // Head: plain copy up to 16-byte alignment of the destination.
        let head = (dst as usize).wrapping_neg() % 16;
        let head = head.min(n);
        // SAFETY: `head <= n`; both ranges are valid per the caller.
        unsafe { std::ptr::copy(src, dst, head) };
        i += head;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` keeps both accesses in bounds; dst+i is
            // 16-byte aligned after the head; the load is unaligned-safe.
            unsafe {
                let v = _mm_loadu_si128(src.add(i).cast::<__m128i>());
                _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
            }
            i += 16;
        }
        // SAFETY: the tail `i..n` is in bounds of both ranges.
        unsafe { std::ptr::copy(src.add(i), dst.add(i), n - i) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: per the caller.
    unsafe {
        std::ptr::copy(src, dst, n)
    };
    store_fence();
}

/// Our own inbound window: the memory peers write into. Only its owner reads
/// it. Cheap to clone (it shares the mapping).
///
/// Peers write it concurrently and are untrusted: read what they wrote with
/// [`read`](Self::read) / [`load_u64`](Self::load_u64) into local memory,
/// then validate the copy (never validate in place and use it again).
#[derive(Clone)]
pub struct LocalWindow {
    base: *mut u8,
    len: usize,
    iova: u64,
    _keep: Keepalive,
}

// SAFETY: the handle performs raw-pointer and atomic accesses to a mapping kept
// alive by `_keep`; it never creates references into it.
unsafe impl Send for LocalWindow {}
// SAFETY: as for Send.
unsafe impl Sync for LocalWindow {}

impl std::fmt::Debug for LocalWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWindow")
            .field("len", &self.len)
            .field("iova", &format_args!("{:#x}", self.iova))
            .finish_non_exhaustive()
    }
}

impl LocalWindow {
    /// Builds a handle over `len` bytes at `base` whose bus address is `iova`.
    ///
    /// # Safety
    /// `base..base+len` must be a valid read-write mapping for as long as
    /// `keep` is alive, at least 8-byte aligned, and writable through `base`
    /// (as for [`PeerWindow::from_raw`]).
    pub unsafe fn from_raw(base: *mut u8, len: usize, iova: u64, keep: Keepalive) -> Self {
        debug_assert_eq!(base as usize % 8, 0, "window base must be 8-byte aligned");
        Self {
            base,
            len,
            iova,
            _keep: keep,
        }
    }

    /// Size in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no bytes (never true for a real window).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bus (I/O virtual) address of the window's first byte, as the inbound
    /// translation registers see it.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Raw pointer to `offset`, checked to leave `len` bytes in the window.
    /// For direct placement (DMA into a registered region) and zero-copy reads.
    #[inline]
    pub fn ptr_at(&self, offset: usize, len: usize) -> Result<*mut u8> {
        check(offset, len, self.len)?;
        // SAFETY: offset is within the mapping (checked above).
        Ok(unsafe { self.base.add(offset) })
    }

    /// Copies `dst.len()` bytes at `offset` out of the window.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check(offset, dst.len(), self.len)?;
        // `move_bytes`: a short read, as a message taken out of a receive
        // buffer, is moved inline, not by a call.
        // SAFETY: bounds checked; the mapping is valid while `_keep` lives;
        // `dst` is a unique borrow, so it does not alias the window's bytes.
        unsafe { move_bytes(self.base.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` to `offset` in our own window (the owner may write it, e.g.
    /// to initialise queues or to place data locally).
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check(offset, src.len(), self.len)?;
        // SAFETY: bounds checked; the mapping is valid while `_keep` lives.
        unsafe { std::ptr::copy(src.as_ptr(), self.base.add(offset), src.len()) };
        Ok(())
    }

    /// Acquire load of the byte at `offset`: for polling a byte a peer
    /// writes (the last byte of a one-sided write, as `ib_write_lat` does).
    #[inline]
    pub fn load_u8(&self, offset: usize) -> Result<u8> {
        check(offset, 1, self.len)?;
        // SAFETY: in bounds; AtomicU8 has u8's layout and alignment; the
        // mapping lives while `_keep` does.
        let a = unsafe { AtomicU8::from_ptr(self.base.add(offset)) };
        Ok(a.load(Ordering::Acquire))
    }

    /// Acquire load of the u64 at `offset` (8-byte aligned): pairs with a
    /// peer's [`PeerWindow::write_u64`].
    #[inline]
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        check_aligned(offset, 8, self.len)?;
        // SAFETY: in bounds and aligned; AtomicU64 has u64's layout; the
        // mapping lives while `_keep` does.
        let a = unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) };
        Ok(a.load(Ordering::Acquire))
    }

    /// Relaxed loads of the `dst.len()` u64s from `offset` (8-byte
    /// aligned), word by word: for a slot body that another thread of this
    /// process may be zeroing meanwhile (a connection reset), which a plain
    /// copy would race. Order it with a fence, as a sequence lock's reader.
    #[inline]
    pub fn load_words_relaxed(&self, offset: usize, dst: &mut [u64]) -> Result<()> {
        check_aligned(offset, 8, self.len)?;
        check(offset, dst.len() * 8, self.len)?;
        for (i, w) in dst.iter_mut().enumerate() {
            // SAFETY: `offset + 8 * i + 8 <= len` (checked above) and 8-byte
            // aligned; AtomicU64 has u64's layout; the mapping lives while
            // `_keep` does.
            let a = unsafe { AtomicU64::from_ptr(self.base.add(offset + 8 * i).cast()) };
            *w = a.load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// [`load_u64`](Self::load_u64) for a poller, to whom an offset outside
    /// the window (or misaligned) only means that nothing arrived there:
    /// `None` then, with no error built and dropped on the poll's path.
    #[inline(always)]
    pub fn poll_u64(&self, offset: usize) -> Option<u64> {
        let inside = offset
            .checked_add(8)
            .is_some_and(|end| end <= self.len && offset.is_multiple_of(8));
        if !inside {
            return None;
        }
        // SAFETY: in bounds and 8-byte aligned (offset checked above, base
        // by `from_raw`'s contract); AtomicU64 has u64's layout; the mapping
        // lives while `_keep` does.
        let a = unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) };
        Some(a.load(Ordering::Acquire))
    }

    /// Hints the CPU to fetch the cache line holding `offset` (no access is
    /// made, nothing faults; out-of-window offsets are ignored). For a poller
    /// that will read the next slot of a ring soon.
    #[inline]
    pub fn prefetch(&self, offset: usize) {
        if offset >= self.len {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults or changes memory; the address is
        // inside the mapping (checked above).
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(self.base.add(offset).cast::<i8>());
        }
    }

    /// Acquire load of the u32 at `offset` (4-byte aligned).
    #[inline]
    pub fn load_u32(&self, offset: usize) -> Result<u32> {
        check_aligned(offset, 4, self.len)?;
        // SAFETY: in bounds and aligned; AtomicU32 has u32's layout.
        let a = unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) };
        Ok(a.load(Ordering::Acquire))
    }

    /// Release store of a u64 into our own window (8-byte aligned).
    #[inline]
    pub fn store_u64(&self, offset: usize, v: u64) -> Result<()> {
        check_aligned(offset, 8, self.len)?;
        // SAFETY: in bounds and aligned; AtomicU64 has u64's layout.
        let a = unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) };
        a.store(v, Ordering::Release);
        Ok(())
    }

    /// The `len` bytes at `offset` (8-byte aligned; `len` a power of two,
    /// at least 8), checked once, for many reads in place: a ring's slots,
    /// polled and read by offsets the reader computes inside the span.
    pub fn span(&self, offset: usize, len: usize) -> Result<LocalSpan<'_>> {
        check_aligned(offset, 8, self.len)?;
        check(offset, len, self.len)?;
        if len < 8 || !len.is_power_of_two() {
            return Err(HwError::Invalid(format!(
                "a span of {len} bytes: its length must be a power of two, at least 8"
            )));
        }
        Ok(LocalSpan {
            win: self,
            offset,
            len,
        })
    }
}

/// A range of a [`LocalWindow`] checked once ([`LocalWindow::span`]): the
/// slots of a ring a peer writes into our window, read in place.
///
/// Its word loads take no error path: an offset is taken modulo the span's
/// length (a power of two, as a ring's is) and rounded down to a word, so a
/// reader that computes a wrong offset reads a wrong word of the span,
/// never memory outside it. Readers compute offsets inside it (a slot index
/// masked by the ring's depth).
#[derive(Debug, Clone, Copy)]
pub struct LocalSpan<'a> {
    win: &'a LocalWindow,
    offset: usize,
    /// A power of two, at least 8.
    len: usize,
}

impl LocalSpan<'_> {
    /// Where the span starts in its window.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The word at `at` bytes into the span, taken modulo the span's length
    /// and rounded down to a multiple of 8 (one mask: `len` is a power of
    /// two, at least 8).
    #[inline(always)]
    fn word(&self, at: usize) -> &AtomicU64 {
        // `at <= len - 8`, so `offset + at + 8 <= offset + len <= window
        // len` (the span was checked against the window), and `offset + at`
        // is 8-byte aligned (both multiples of 8, the base 8-byte aligned).
        let at = at & (self.len - 8);
        // SAFETY: in bounds and aligned, as just said; AtomicU64 has u64's
        // layout; the mapping lives while the window (which outlives the
        // span) does.
        unsafe { AtomicU64::from_ptr(self.win.base.add(self.offset + at).cast()) }
    }

    /// Acquire load of the u64 at `at` (see the type's documentation for
    /// offsets outside the span): a ring slot's tag.
    #[inline]
    pub fn load_u64(&self, at: usize) -> u64 {
        self.word(at).load(Ordering::Acquire)
    }

    /// Relaxed load of the u64 at `at`: a slot word read after its tag.
    #[inline]
    pub fn load_u64_relaxed(&self, at: usize) -> u64 {
        self.word(at).load(Ordering::Relaxed)
    }

    /// Moves the `len` bytes at `at` of the span to offset `dst` of the
    /// window (as `memmove`): a message taken from its slots straight into
    /// a receive buffer. Both ranges are checked (the source against the
    /// span).
    #[inline]
    pub fn copy_to_window(&self, at: usize, dst: usize, len: usize) -> Result<()> {
        check(at, len, self.len)?;
        check(dst, len, self.win.len)?;
        let src = self.offset + at;
        // SAFETY: both ranges are in bounds of the mapping (checked above,
        // the span inside the window), valid while the window lives; raw
        // pointers only, no reference over memory a peer may write.
        unsafe { move_bytes(self.win.base.add(src), self.win.base.add(dst), len) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` zeroed words to build a window over: atomics, since the handles
    /// write through a raw pointer while the test holds shared references.
    fn zeroed(n: usize) -> Arc<Vec<AtomicU64>> {
        Arc::new((0..n).map(|_| AtomicU64::new(0)).collect())
    }

    /// The words of `mem` in `r`, loaded.
    fn load(mem: &[AtomicU64], r: core::ops::Range<usize>) -> Vec<u64> {
        mem[r].iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn write_words_stores_each_word_in_place_and_checks_bounds() {
        let mem = zeroed(16);
        let counters = Arc::new(DeviceCounters::default());
        // SAFETY: `mem` is 128 bytes, 8-aligned, kept alive by the handle
        // and read below only after the writes.
        let win =
            unsafe { PeerWindow::from_raw(mem.as_ptr() as *mut u8, 128, 1, counters, mem.clone()) };
        let words: Vec<u64> = (1..=7).map(|i| i * 0x0101_0101_0101_0101).collect();
        win.write_words(8, &words).unwrap();
        assert_eq!(load(&mem, 1..8), words);
        assert_eq!((load(&mem, 0..1), load(&mem, 8..9)), (vec![0], vec![0]));
        win.write_words(64, &words[..2]).unwrap();
        assert_eq!(load(&mem, 8..10), words[..2]);
        assert!(matches!(
            win.write_words(4, &words),
            Err(HwError::Misaligned { .. })
        ));
        assert!(matches!(
            win.write_words(80, &words),
            Err(HwError::OutOfBounds { .. })
        ));
        assert_eq!(load(&mem, 10..16), [0; 6]);
    }

    /// A non-temporal copy between overlapping ranges of one memory (a
    /// loopback fabric maps one memory as both windows) moves the bytes as
    /// `memmove` does: the forward streaming copy is kept for ranges apart.
    #[test]
    fn an_overlapping_non_temporal_copy_moves_the_bytes() {
        let mem = zeroed(16);
        for (i, w) in mem.iter().enumerate() {
            w.store(0x0101_0101_0101_0101 * i as u64, Ordering::Relaxed);
        }
        let before = load(&mem, 0..16);
        let ptr = mem.as_ptr() as *mut u8;
        // SAFETY: `mem` is 128 bytes, 8-aligned, interior-mutable and kept
        // alive by both handles; read below only after the copy.
        let local = unsafe { LocalWindow::from_raw(ptr, 128, 0, mem.clone()) };
        // SAFETY: as above.
        let peer = unsafe {
            PeerWindow::from_raw(
                ptr,
                128,
                1,
                Arc::new(DeviceCounters::default()),
                mem.clone(),
            )
        };
        peer.copy_from_local(16, &local, 0, 64, true).unwrap();
        assert_eq!(load(&mem, 2..10), before[0..8]);
        assert_eq!(load(&mem, 0..2), before[0..2]);
    }

    /// A window over `mem` whose live grant table is `table` (writer port
    /// 1), beyond a fixed grant of its first 64 bytes.
    fn granted_window(
        mem: &Arc<Vec<AtomicU64>>,
        table: &Arc<super::super::grant_table::GrantTable>,
        counters: &Arc<DeviceCounters>,
    ) -> PeerWindow {
        // SAFETY: the table is atomics only, kept alive by the keepalive.
        let live =
            unsafe { LiveGrants::from_raw(Arc::as_ptr(table), 1, table.clone() as Keepalive) };
        // SAFETY: `mem` is 512 bytes, 8-aligned, kept alive by the handle;
        // the test reads it only between writes.
        unsafe {
            PeerWindow::from_raw(
                mem.as_ptr() as *mut u8,
                512,
                1,
                counters.clone(),
                mem.clone(),
            )
        }
        .with_grant(vec![Range { start: 0, end: 64 }])
        .with_live_grants(live)
    }

    #[test]
    fn an_admitted_range_holds_until_its_grant_changes_then_is_checked_again() {
        use super::super::grant_table::GrantTable;
        let mem = zeroed(64);
        // SAFETY: an all-zero GrantTable is valid (atomics, zero = empty).
        let table: Arc<GrantTable> = Arc::new(unsafe { std::mem::zeroed() });
        let counters = Arc::new(DeviceCounters::default());
        let win = granted_window(&mem, &table, &counters);
        let bytes =
            |i: usize| -> Vec<u8> { load(&mem, i / 8..i / 8 + 1)[0].to_le_bytes().to_vec() };

        assert!(matches!(
            win.admit(256, 64),
            Err(HwError::NotGranted { .. })
        ));
        let id = table.grant(256, 64, Some(1)).unwrap();
        let mut region = win.admit(256, 64).unwrap();
        let span = win.span_admitted(&mut region).unwrap();
        assert_eq!((span.offset(), span.len()), (256, 64));
        let fast = win.span_if_admitted(&region).expect("current");
        assert_eq!((fast.offset(), fast.len()), (256, 64));
        win.write_admitted(&mut region, 8, &[1; 8]).unwrap();
        assert_eq!(bytes(264), vec![1; 8]);
        // Bounds are the range's, not the window's.
        assert!(matches!(
            win.write_admitted(&mut region, 60, &[2; 8]),
            Err(HwError::OutOfBounds { .. })
        ));

        // Withdrawn: the next write is checked again and refused, nothing
        // written, the refusal counted.
        table.withdraw(id);
        assert!(
            win.span_if_admitted(&region).is_none(),
            "the table moved on"
        );
        let before = counters.snapshot().ungranted_writes;
        assert!(matches!(
            win.write_admitted(&mut region, 16, &[3; 8]),
            Err(HwError::NotGranted { .. })
        ));
        assert_eq!(bytes(272), vec![0; 8]);
        assert_eq!(counters.snapshot().ungranted_writes, before + 1);

        // Granted again (another edit): admitted again, the token renewed.
        table.grant(256, 64, Some(1)).unwrap();
        win.write_admitted(&mut region, 16, &[4; 8]).unwrap();
        assert_eq!(bytes(272), vec![4; 8]);
        let renewed = region;

        // A new owner's table, granting the same range anew: the number
        // has moved on, so an old token is never taken as current.
        table.reset();
        table.grant(256, 64, Some(1)).unwrap();
        let mut stale = renewed;
        win.write_admitted(&mut stale, 24, &[5; 8]).unwrap();
        assert_ne!(stale, renewed, "admitted again after the reset");
        table.reset();
        assert!(matches!(
            win.write_admitted(&mut stale, 24, &[6; 8]),
            Err(HwError::NotGranted { .. })
        ));
        assert_eq!(bytes(280), vec![5; 8]);

        // Another window's token is admitted again for this one.
        let other_mem = zeroed(64);
        let other = granted_window(&other_mem, &table, &counters);
        let mut foreign = other.admit(0, 64).unwrap();
        assert!(
            win.span_if_admitted(&foreign).is_none(),
            "another mapping's"
        );
        win.write_admitted(&mut foreign, 0, &[7; 8]).unwrap();
        assert_eq!(bytes(0), vec![7; 8]);
        assert_eq!(load(&other_mem, 0..1), [0]);
    }

    #[test]
    fn a_token_from_another_handle_onto_the_same_memory_is_checked_again() {
        let mem = zeroed(64);
        let counters = Arc::new(DeviceCounters::default());
        // SAFETY: `mem` is 512 bytes, 8-aligned, kept alive by the handles;
        // the test reads it only between writes.
        let handle = |len: usize| unsafe {
            PeerWindow::from_raw(
                mem.as_ptr() as *mut u8,
                len,
                1,
                counters.clone(),
                mem.clone(),
            )
        };
        let (whole, short) = (handle(512), handle(128));
        let mut far = whole.admit(256, 64).unwrap();
        // Admitted on the whole window, never written past the short one.
        assert!(short.span_if_admitted(&far).is_none());
        assert!(matches!(
            short.write_admitted(&mut far, 8, &[1; 8]),
            Err(HwError::OutOfBounds { .. })
        ));
        // A handle with a grant does not take an ungated handle's word for
        // a range outside it.
        let gated = handle(512).with_grant(vec![Range { start: 0, end: 64 }]);
        assert!(matches!(
            gated.write_admitted(&mut far, 8, &[2; 8]),
            Err(HwError::NotGranted { .. })
        ));
        assert!(load(&mem, 0..64).iter().all(|&w| w == 0));
        // Inside the grant, the token is admitted again and written.
        let mut near = whole.admit(0, 64).unwrap();
        gated.write_admitted(&mut near, 8, &[3; 8]).unwrap();
        assert_eq!(load(&mem, 1..2), [u64::from_le_bytes([3; 8])]);
    }

    #[test]
    fn a_slot_write_stores_body_then_word_checked_and_admitted_as_one() {
        let mem = zeroed(32);
        let counters = Arc::new(DeviceCounters::default());
        // SAFETY: `mem` is 256 bytes, 8-aligned, kept alive by the handle
        // and read below only after the writes.
        let win = unsafe {
            PeerWindow::from_raw(
                mem.as_ptr() as *mut u8,
                256,
                1,
                counters.clone(),
                mem.clone(),
            )
        }
        .with_grant(vec![Range { start: 0, end: 128 }]);
        let words: Vec<u64> = (1..=7).collect();
        win.write_words_then_u64(64, &words, 99).unwrap();
        assert_eq!(load(&mem, 8..15), words);
        assert_eq!(load(&mem, 15..16), [99]);
        assert_eq!((load(&mem, 7..8), load(&mem, 16..17)), (vec![0], vec![0]));
        // The word after the body would leave the grant (or the window):
        // refused whole, nothing stored, the refusal counted.
        assert!(matches!(
            win.write_words_then_u64(72, &words, 5),
            Err(HwError::NotGranted { .. })
        ));
        assert!(matches!(
            win.write_words_then_u64(200, &words, 5),
            Err(HwError::OutOfBounds { .. })
        ));
        assert!(matches!(
            win.write_words_then_u64(68, &words, 5),
            Err(HwError::Misaligned { .. })
        ));
        assert_eq!(load(&mem, 8..15), words);
        assert_eq!(load(&mem, 15..16), [99]);
        assert!(load(&mem, 16..32).iter().all(|&w| w == 0));
        assert_eq!(counters.snapshot().ungranted_writes, 1);
    }

    #[test]
    fn a_poll_load_outside_the_window_or_misaligned_finds_nothing() {
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(AtomicU64::new).collect());
        // SAFETY: `mem` is 32 bytes, 8-aligned, interior-mutable, and kept
        // alive by the handle.
        let win = unsafe { LocalWindow::from_raw(mem.as_ptr() as *mut u8, 32, 0, mem.clone()) };
        assert_eq!((win.poll_u64(0), win.poll_u64(24)), (Some(0), Some(3)));
        for at in [4, 25, 32, usize::MAX - 7, usize::MAX] {
            assert_eq!(win.poll_u64(at), None, "offset {at}");
        }
    }

    #[test]
    fn a_local_span_is_checked_once_and_never_reads_outside_itself() {
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..32).map(AtomicU64::new).collect());
        let word = |i: usize| mem[i].load(Ordering::Relaxed);
        // SAFETY: `mem` is 256 bytes, 8-aligned, interior-mutable, and kept
        // alive by the handle.
        let win = unsafe { LocalWindow::from_raw(mem.as_ptr() as *mut u8, 256, 0, mem.clone()) };
        assert!(matches!(win.span(4, 64), Err(HwError::Misaligned { .. })));
        for len in [96, 4] {
            assert!(matches!(win.span(0, len), Err(HwError::Invalid(_))));
        }
        assert!(matches!(
            win.span(192, 128),
            Err(HwError::OutOfBounds { .. })
        ));
        let span = win.span(64, 64).unwrap();
        assert_eq!(span.offset(), 64);
        assert_eq!((span.load_u64(0), span.load_u64(56)), (8, 15));
        // Offsets wrap around the span and round down to a word.
        assert_eq!(span.load_u64(64), 8);
        assert_eq!(span.load_u64_relaxed(61), 15);
        assert_eq!(span.load_u64_relaxed(usize::MAX), 15);
        // Copies out of the span check both ranges.
        span.copy_to_window(8, 0, 16).unwrap();
        assert_eq!((word(0), word(1), word(2)), (9, 10, 2));
        assert!(matches!(
            span.copy_to_window(56, 0, 16),
            Err(HwError::OutOfBounds { .. })
        ));
        assert!(matches!(
            span.copy_to_window(0, 250, 8),
            Err(HwError::OutOfBounds { .. })
        ));
        assert_eq!(word(31), 31);
    }
}
