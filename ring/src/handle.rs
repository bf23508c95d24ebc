//! Split handles for a `Single` side: [`Producer`] and [`Consumer`]. The
//! design is in the crate documentation ("Split handles").

use core::fmt;
use core::ptr::NonNull;
use std::sync::Arc;

use crate::burst::Burst;
use crate::error::RingError;
use crate::headtail::Amount;
use crate::mode::SyncMode;
use crate::ring::Ring;
use crate::slots::{self, Slot};
use crate::sync::{AtomicU64, Ordering};

/// Slots available between this side's index `own` and `limit` (the other
/// side's tail, plus the capacity for a producer), clamped to `capacity` so
/// that no corrupted tail can make an operation run past the slot array.
#[inline(always)]
fn available(limit: u64, own: u64, capacity: usize) -> usize {
    limit.wrapping_sub(own).min(capacity as u64) as usize
}

/// How many of `want` elements to move when `available` are there.
#[inline(always)]
fn decide(want: usize, available: usize, amount: Amount) -> usize {
    match amount {
        Amount::Exactly if want <= available => want,
        Amount::Exactly => 0,
        Amount::UpTo => want.min(available),
    }
}

/// What both handles hold: the ring's region and this handle's copies of its
/// geometry.
struct Shared<T: Copy> {
    /// The first of `capacity` slots.
    slots: NonNull<Slot<T>>,
    /// This side's tail in the header: the handle stores it, the other side
    /// loads it.
    own_tail: NonNull<AtomicU64>,
    /// The other side's tail in the header: loaded only when the cached view
    /// runs out.
    other_tail: NonNull<AtomicU64>,
    /// `capacity - 1`.
    mask: u64,
    /// Number of slots.
    capacity: usize,
    /// Keeps the region alive (and frees a [`Ring::new`] allocation when the
    /// last handle goes).
    ring: Arc<Ring<T>>,
}

impl<T: Copy> Shared<T> {
    /// The view of `ring` from its producer side (`producer`) or its
    /// consumer side.
    fn new(ring: Arc<Ring<T>>, producer: bool) -> Shared<T> {
        let h = ring.header();
        let (own, other) = if producer {
            (&h.prod.tail, &h.cons.tail)
        } else {
            (&h.cons.tail, &h.prod.tail)
        };
        Shared {
            slots: ring.slots,
            own_tail: NonNull::from(own),
            other_tail: NonNull::from(other),
            mask: ring.mask,
            capacity: ring.capacity,
            ring,
        }
    }

    /// This side's tail.
    #[inline(always)]
    fn own_tail(&self) -> &AtomicU64 {
        // SAFETY: points into the header of the region `ring` keeps alive;
        // the header is only ever accessed through atomics.
        unsafe { self.own_tail.as_ref() }
    }

    /// The other side's tail.
    #[inline(always)]
    fn other_tail(&self) -> &AtomicU64 {
        // SAFETY: as for `own_tail`.
        unsafe { self.other_tail.as_ref() }
    }
}

/// Fails unless `sync` is `Single`.
fn require_single(
    sync: SyncMode,
    side: &'static str,
    ring: &Ring<impl Copy>,
) -> Result<(), RingError> {
    match sync {
        SyncMode::Single => Ok(()),
        SyncMode::Multi => Err(RingError::SideNotSingle {
            side,
            mode: ring.mode,
        }),
    }
}

impl<T: Copy> Ring<T> {
    /// Splits an SPSC ring into its [`Producer`] and [`Consumer`] handles,
    /// which keep their indices in themselves instead of in the header (see
    /// the [`Producer`] documentation). The ring's memory stays alive until
    /// both handles are dropped.
    ///
    /// Fails with [`RingError::SideNotSingle`] when either side of the ring is
    /// `Multi` (the ring is dropped then: check [`mode`](Self::mode) first
    /// to keep it).
    ///
    /// The handles take over the ring's state as it is: elements already in
    /// the ring are dequeued first.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Burst, Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(8, RingMode::SPSC)?;
    /// ring.enqueue(1).unwrap();
    /// let (mut tx, mut rx) = ring.split_spsc()?;
    /// assert_eq!(tx.enqueue_burst(&[2, 3]), Burst { n: 2, left: 5 });
    /// let mut out = [0; 4];
    /// assert_eq!(rx.dequeue_burst(&mut out), Burst { n: 3, left: 0 });
    /// assert_eq!(out[..3], [1, 2, 3]);
    /// assert!(Ring::<u64>::new(8, RingMode::SPMC)?.split_spsc().is_err());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn split_spsc(self) -> Result<(Producer<T>, Consumer<T>), RingError> {
        require_single(self.mode.producer, "producer", &self)?;
        require_single(self.mode.consumer, "consumer", &self)?;
        let ring = Arc::new(self);
        Ok((Producer::new(Arc::clone(&ring)), Consumer::new(ring)))
    }

    /// Turns this handle into the ring's one [`Producer`], for a ring whose
    /// producer side is `Single` (SPSC or SPMC). The consumers use other
    /// handles on the same region: a [`Consumer`] or a [`Ring`] attached in
    /// another process (or, for a region in this process, another
    /// [`attach`](Self::attach)).
    ///
    /// As with any `Single` side, the caller promises that no other producer
    /// (handle or `Ring` operation, in any process) uses the ring while the
    /// handle lives. Fails with [`RingError::SideNotSingle`] on a
    /// multi-producer ring.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::{alloc, dealloc, Layout};
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let len = Ring::<u64>::bytes_for(64)?;
    /// let layout = Layout::from_size_align(len, Ring::<u64>::REGION_ALIGN).unwrap();
    /// // SAFETY: a non-zero-sized layout.
    /// let region = unsafe { alloc(layout) };
    /// assert!(!region.is_null());
    /// {
    ///     // SAFETY: `region` holds `len` bytes, suitably aligned, and
    ///     // outlives every handle, all dropped before it is freed.
    ///     let mut tx = unsafe { Ring::<u64>::init_in(region, len, 64, RingMode::SPMC)? }
    ///         .into_producer()?;
    ///     // Consumers (here one, usually in other processes) attach.
    ///     // SAFETY: as above.
    ///     let consumers = unsafe { Ring::<u64>::attach(region, len)? };
    ///     tx.enqueue(7).unwrap();
    ///     assert_eq!(consumers.dequeue(), Some(7));
    /// }
    /// // SAFETY: allocated above with `layout`; no handle uses it any more.
    /// unsafe { dealloc(region, layout) };
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn into_producer(self) -> Result<Producer<T>, RingError> {
        require_single(self.mode.producer, "producer", &self)?;
        Ok(Producer::new(Arc::new(self)))
    }

    /// Turns this handle into the ring's one [`Consumer`], for a ring whose
    /// consumer side is `Single` (SPSC or MPSC): the mirror of
    /// [`into_producer`](Self::into_producer), with the same promise. Fails
    /// with [`RingError::SideNotSingle`] on a multi-consumer ring.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let mut rx = Ring::<u64>::new(64, RingMode::MPSC)?.into_consumer()?;
    /// assert!(rx.is_empty());
    /// assert!(Ring::<u64>::new(64, RingMode::SPMC)?.into_consumer().is_err());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn into_consumer(self) -> Result<Consumer<T>, RingError> {
        require_single(self.mode.consumer, "consumer", &self)?;
        Ok(Consumer::new(Arc::new(self)))
    }
}

/// The producing side of a ring with a `Single` producer side, with its
/// index and its cached copy of the consumer tail in itself: one `Release`
/// store per call, and the consumer tail loaded only when the cached view
/// shows too little room (see "Split handles" in the crate documentation).
///
/// Made by [`Ring::split_spsc`] or [`Ring::into_producer`]. The operations
/// are those of the [`Ring`], with the same results, taking `&mut self`.
///
/// # Examples
///
/// ```
/// use ntbdk_ring::{Ring, RingMode};
///
/// let (mut tx, mut rx) = Ring::<u32>::new(2, RingMode::SPSC)?.split_spsc()?;
/// assert_eq!(tx.enqueue_bulk(&[1, 2]), Ok(0));
/// assert_eq!(tx.enqueue(3), Err(3)); // full
/// assert_eq!(rx.dequeue(), Some(1));
/// assert_eq!(tx.enqueue(3), Ok(()));
/// # Ok::<(), ntbdk_ring::RingError>(())
/// ```
#[repr(align(128))]
pub struct Producer<T: Copy> {
    /// The next index to write; always the producer tail last published.
    tail: u64,
    /// The consumer tail as last loaded, plus the capacity: indices below it
    /// are free. Only ever lower than the real bound (tails only grow).
    limit: u64,
    /// The ring.
    shared: Shared<T>,
}

// SAFETY: the handle moves `T`s to another thread, hence `T: Send`; its
// pointers point into the region its `Arc<Ring>` keeps alive, shared state
// there is accessed through atomics or slots the head/tail scheme reserves
// for this side, and the handle's own fields move with it (it is neither
// `Clone` nor `Sync`, so one thread at a time runs this side).
unsafe impl<T: Copy + Send> Send for Producer<T> {}

impl<T: Copy> Producer<T> {
    /// Takes over the producer side of `ring` as the header shows it.
    fn new(ring: Arc<Ring<T>>) -> Producer<T> {
        let shared = Shared::new(ring, true);
        // Acquire on both: whoever ran this side before (a `Ring` operation
        // on another thread, handed over with synchronisation) published its
        // tail; the consumer tail read here releases slots to us.
        let tail = shared.own_tail().load(Ordering::Acquire);
        let cons = shared.other_tail().load(Ordering::Acquire);
        Producer {
            tail,
            limit: cons.wrapping_add(shared.capacity as u64),
            shared,
        }
    }

    /// Free slots from the cached view, or, when it shows fewer than `want`,
    /// from a fresh load of the consumer tail.
    #[inline(always)]
    fn room(&mut self, want: usize) -> usize {
        let cap = self.shared.capacity;
        let avail = available(self.limit, self.tail, cap);
        if avail >= want {
            return avail;
        }
        self.refresh();
        available(self.limit, self.tail, cap)
    }

    /// Reloads the consumer tail into the cached view.
    #[inline(always)]
    fn refresh(&mut self) {
        // Acquire: the consumer's reads of the slots it released happen
        // before we overwrite them.
        let cons = self.shared.other_tail().load(Ordering::Acquire);
        self.limit = cons.wrapping_add(self.shared.capacity as u64);
    }

    /// Publishes the slots written up to `tail`.
    #[inline(always)]
    fn publish(&mut self, tail: u64) {
        self.tail = tail;
        // Release: our slot writes happen before the consumer, acquiring
        // this tail, reads them.
        self.shared.own_tail().store(tail, Ordering::Release);
    }

    /// Copies up to `items.len()` elements in and publishes them.
    #[inline(always)]
    fn enqueue_n(&mut self, items: &[T], amount: Amount) -> (usize, usize) {
        let avail = self.room(items.len());
        let n = decide(items.len(), avail, amount);
        if n > 0 {
            let sh = &self.shared;
            // SAFETY: `slots` points to `capacity` slots; the start is masked
            // below `capacity`; `n <= avail <= capacity` (clamped); the slots
            // `tail .. tail + n` are free (below the consumer tail we
            // acquired, plus the capacity) and ours alone: this handle is the
            // only producer and the consumer does not read past our tail.
            // SAFETY: holds for the reasons given just above.
            unsafe {
                slots::write(
                    sh.slots.as_ptr(),
                    sh.capacity,
                    (self.tail & sh.mask) as usize,
                    &items[..n],
                )
            };
            self.publish(self.tail.wrapping_add(n as u64));
        }
        (n, avail)
    }

    /// Enqueues one element, or gives it back when the ring is full.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let mut tx = Ring::<u64>::new(1, RingMode::SPSC)?.into_producer()?;
    /// assert_eq!(tx.enqueue(1), Ok(()));
    /// assert_eq!(tx.enqueue(2), Err(2));
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn enqueue(&mut self, item: T) -> Result<(), T> {
        let tail = self.tail;
        if tail == self.limit {
            self.refresh();
            if tail == self.limit {
                return Err(item);
            }
        }
        let sh = &self.shared;
        // SAFETY: the index is masked below `capacity`; slot `tail` is free
        // (`tail` differs from the consumer tail we acquired plus the
        // capacity, and a count above the capacity only comes from a
        // corrupted tail, which masking keeps in bounds) and ours alone, as
        // in `enqueue_n`.
        // SAFETY: holds for the reasons given just above.
        unsafe { slots::write_one(sh.slots.as_ptr(), (tail & sh.mask) as usize, item) };
        self.publish(tail.wrapping_add(1));
        Ok(())
    }

    /// Enqueues all of `items`, or none when they do not all fit: `Ok(free
    /// slots left)` or `Err(free slots seen)`, as
    /// [`Ring::enqueue_bulk`]. An empty slice succeeds.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let mut tx = Ring::<u64>::new(4, RingMode::SPSC)?.into_producer()?;
    /// assert_eq!(tx.enqueue_bulk(&[1, 2, 3]), Ok(1));
    /// assert_eq!(tx.enqueue_bulk(&[4, 5]), Err(1)); // nothing enqueued
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn enqueue_bulk(&mut self, items: &[T]) -> Result<usize, usize> {
        let (n, avail) = self.enqueue_n(items, Amount::Exactly);
        if n == items.len() {
            Ok(avail - n)
        } else {
            Err(avail)
        }
    }

    /// Enqueues as many of `items` as fit, from the front of the slice, with
    /// one `Release` store for the whole burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Burst, Ring, RingMode};
    ///
    /// let mut tx = Ring::<u64>::new(4, RingMode::SPSC)?.into_producer()?;
    /// assert_eq!(tx.enqueue_burst(&[1, 2, 3, 4, 5]), Burst { n: 4, left: 0 });
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn enqueue_burst(&mut self, items: &[T]) -> Burst {
        let (n, avail) = self.enqueue_n(items, Amount::UpTo);
        Burst { n, left: avail - n }
    }

    /// Number of free slots, from a fresh load of the consumer tail (which
    /// also refreshes the cached view). A lower bound: the consumer may free
    /// more at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let mut tx = Ring::<u64>::new(4, RingMode::SPSC)?.into_producer()?;
    /// tx.enqueue(1).unwrap();
    /// assert_eq!(tx.free_count(), 3);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn free_count(&mut self) -> usize {
        self.refresh();
        available(self.limit, self.tail, self.shared.capacity)
    }

    /// Whether the ring is full (from a fresh load of the consumer tail).
    pub fn is_full(&mut self) -> bool {
        self.free_count() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// The ring's modes.
    pub fn mode(&self) -> crate::RingMode {
        self.shared.ring.mode
    }
}

impl<T: Copy> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.shared.capacity)
            .field("tail", &self.tail)
            .field(
                "cached_free",
                &available(self.limit, self.tail, self.shared.capacity),
            )
            .finish()
    }
}

/// The consuming side of a ring with a `Single` consumer side, with its
/// index and its cached copy of the producer tail in itself: the mirror of
/// [`Producer`].
///
/// Made by [`Ring::split_spsc`] or [`Ring::into_consumer`].
///
/// # Examples
///
/// ```
/// use ntbdk_ring::{Burst, Ring, RingMode};
///
/// let (mut tx, mut rx) = Ring::<u32>::new(4, RingMode::SPSC)?.split_spsc()?;
/// assert_eq!(rx.dequeue(), None); // empty
/// tx.enqueue_bulk(&[1, 2, 3]).unwrap();
/// let mut out = [0; 2];
/// assert_eq!(rx.dequeue_bulk(&mut out), Ok(1));
/// assert_eq!(out, [1, 2]);
/// assert_eq!(rx.dequeue_burst(&mut out), Burst { n: 1, left: 0 });
/// # Ok::<(), ntbdk_ring::RingError>(())
/// ```
#[repr(align(128))]
pub struct Consumer<T: Copy> {
    /// The next index to read; always the consumer tail last published.
    head: u64,
    /// The producer tail as last loaded: indices below it hold elements.
    /// Only ever lower than the real one (tails only grow).
    limit: u64,
    /// The ring.
    shared: Shared<T>,
}

// SAFETY: as for `Producer`: the handle moves `T`s from another thread, its
// pointers stay valid while its `Arc<Ring>` lives, and one thread at a time
// owns it.
unsafe impl<T: Copy + Send> Send for Consumer<T> {}

impl<T: Copy> Consumer<T> {
    /// Takes over the consumer side of `ring` as the header shows it.
    fn new(ring: Arc<Ring<T>>) -> Consumer<T> {
        let shared = Shared::new(ring, false);
        // Acquire on both, as in `Producer::new`; the producer tail read here
        // makes the slots below it readable.
        let head = shared.own_tail().load(Ordering::Acquire);
        let limit = shared.other_tail().load(Ordering::Acquire);
        Consumer {
            head,
            limit,
            shared,
        }
    }

    /// Elements from the cached view, or, when it shows fewer than `want`,
    /// from a fresh load of the producer tail.
    #[inline(always)]
    fn held(&mut self, want: usize) -> usize {
        let cap = self.shared.capacity;
        let avail = available(self.limit, self.head, cap);
        if avail >= want {
            return avail;
        }
        self.refresh();
        available(self.limit, self.head, cap)
    }

    /// Reloads the producer tail into the cached view.
    #[inline(always)]
    fn refresh(&mut self) {
        // Acquire: the producer's writes of the slots it published happen
        // before we read them.
        self.limit = self.shared.other_tail().load(Ordering::Acquire);
    }

    /// Releases the slots read up to `head` to the producer.
    #[inline(always)]
    fn publish(&mut self, head: u64) {
        self.head = head;
        // Release: our slot reads happen before the producer, acquiring this
        // tail, overwrites them.
        self.shared.own_tail().store(head, Ordering::Release);
    }

    /// Copies up to `want` elements to `dst` and releases their slots.
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `want` elements.
    #[inline(always)]
    unsafe fn dequeue_n(&mut self, dst: *mut T, want: usize, amount: Amount) -> (usize, usize) {
        let avail = self.held(want);
        let n = decide(want, avail, amount);
        if n > 0 {
            let sh = &self.shared;
            // SAFETY: `slots` points to `capacity` slots; the start is masked
            // below `capacity`; `n <= avail <= capacity` (clamped); the slots
            // `head .. head + n` were written by the producer before it
            // published the tail we acquired, and it will not reuse them
            // before we publish ours; this handle is the only consumer; `dst`
            // holds `want >= n` elements (our caller's promise) and, being
            // the caller's memory, does not overlap the slots.
            // SAFETY: holds for the reasons given just above.
            unsafe {
                slots::read(
                    sh.slots.as_ptr(),
                    sh.capacity,
                    (self.head & sh.mask) as usize,
                    dst,
                    n,
                )
            };
            self.publish(self.head.wrapping_add(n as u64));
        }
        (n, avail)
    }

    /// Dequeues one element, or `None` when the ring is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let (mut tx, mut rx) = Ring::<u64>::new(2, RingMode::SPSC)?.split_spsc()?;
    /// tx.enqueue(9).unwrap();
    /// assert_eq!(rx.dequeue(), Some(9));
    /// assert_eq!(rx.dequeue(), None);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn dequeue(&mut self) -> Option<T> {
        let head = self.head;
        if head == self.limit {
            self.refresh();
            if head == self.limit {
                return None;
            }
        }
        let sh = &self.shared;
        // SAFETY: the index is masked below `capacity`; slot `head` is below
        // the producer tail we acquired (a corrupted tail can only make it
        // a stale slot, which masking keeps in bounds), so the producer wrote
        // it and will not reuse it before we publish; ours alone, as in
        // `dequeue_n`.
        // SAFETY: holds for the reasons given just above.
        let v = unsafe { slots::read_one(sh.slots.as_ptr(), (head & sh.mask) as usize) };
        self.publish(head.wrapping_add(1));
        Some(v)
    }

    /// Dequeues exactly `out.len()` elements, or none when fewer are in the
    /// ring: `Ok(elements remaining)` or `Err(elements seen)`, as
    /// [`Ring::dequeue_bulk`]. An empty slice succeeds.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let (mut tx, mut rx) = Ring::<u64>::new(4, RingMode::SPSC)?.split_spsc()?;
    /// tx.enqueue_bulk(&[1, 2, 3]).unwrap();
    /// let mut out = [0; 2];
    /// assert_eq!(rx.dequeue_bulk(&mut out), Ok(1));
    /// assert_eq!(rx.dequeue_bulk(&mut out), Err(1)); // nothing dequeued
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn dequeue_bulk(&mut self, out: &mut [T]) -> Result<usize, usize> {
        // SAFETY: `out` is valid for writes of `out.len()` elements.
        let (n, avail) = unsafe { self.dequeue_n(out.as_mut_ptr(), out.len(), Amount::Exactly) };
        if n == out.len() {
            Ok(avail - n)
        } else {
            Err(avail)
        }
    }

    /// Dequeues as many elements as are available, up to `out.len()`, into
    /// the front of `out`, with one `Release` store for the whole burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Burst, Ring, RingMode};
    ///
    /// let (mut tx, mut rx) = Ring::<u64>::new(8, RingMode::SPSC)?.split_spsc()?;
    /// tx.enqueue_bulk(&[1, 2, 3]).unwrap();
    /// let mut out = [0; 8];
    /// assert_eq!(rx.dequeue_burst(&mut out), Burst { n: 3, left: 0 });
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn dequeue_burst(&mut self, out: &mut [T]) -> Burst {
        // SAFETY: `out` is valid for writes of `out.len()` elements.
        let (n, avail) = unsafe { self.dequeue_n(out.as_mut_ptr(), out.len(), Amount::UpTo) };
        Burst { n, left: avail - n }
    }

    /// Number of elements in the ring, from a fresh load of the producer
    /// tail (which also refreshes the cached view). A lower bound: the
    /// producer may add more at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let (mut tx, mut rx) = Ring::<u64>::new(4, RingMode::SPSC)?.split_spsc()?;
    /// tx.enqueue_bulk(&[1, 2]).unwrap();
    /// assert_eq!(rx.len(), 2);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn len(&mut self) -> usize {
        self.refresh();
        available(self.limit, self.head, self.shared.capacity)
    }

    /// Whether the ring is empty (from a fresh load of the producer tail).
    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// The ring's modes.
    pub fn mode(&self) -> crate::RingMode {
        self.shared.ring.mode
    }
}

impl<T: Copy> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.shared.capacity)
            .field("head", &self.head)
            .field(
                "cached_len",
                &available(self.limit, self.head, self.shared.capacity),
            )
            .finish()
    }
}
