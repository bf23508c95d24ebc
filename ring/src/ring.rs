//! The [`Ring`] handle: creation, attachment, and the queries on its state.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::error::RingError;
use crate::exclusive::SideGuard;
use crate::header::{self, Header};
use crate::headtail::SideRef;
use crate::mode::RingMode;
use crate::slots::Slot;
use crate::sync::Ordering;

/// A bounded lock-free FIFO of `Copy` elements, in the manner of DPDK's
/// `rte_ring`.
///
/// The ring either owns a heap allocation ([`Ring::new`]) or is a handle on a
/// caller-provided region ([`Ring::init_in`], [`Ring::attach`]), such as
/// memory shared between processes. Its [`RingMode`], fixed at creation, says
/// whether one or many threads may enqueue, and one or many dequeue.
///
/// All operations take `&self`: share a ring between threads with an
/// [`Arc`](std::sync::Arc) (it is not `Clone`), or between processes by
/// attaching the same region in each. The whole `capacity` is usable.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use ntbdk_ring::{Ring, RingMode};
///
/// let ring = Arc::new(Ring::<u64>::new(1024, RingMode::SPSC)?);
/// let producer = {
///     let ring = Arc::clone(&ring);
///     std::thread::spawn(move || {
///         for i in 0..10_000u64 {
///             let mut item = i;
///             while let Err(back) = ring.enqueue(item) {
///                 item = back;
///                 std::thread::yield_now();
///             }
///         }
///     })
/// };
/// let mut next = 0;
/// let mut buf = [0u64; 32];
/// while next < 10_000 {
///     let got = ring.dequeue_burst(&mut buf);
///     for &v in &buf[..got.n] {
///         assert_eq!(v, next);
///         next += 1;
///     }
///     if got.n == 0 {
///         std::thread::yield_now();
///     }
/// }
/// producer.join().unwrap();
/// assert!(ring.is_empty());
/// # Ok::<(), ntbdk_ring::RingError>(())
/// ```
pub struct Ring<T: Copy> {
    /// The header at the start of the region.
    pub(crate) hdr: NonNull<Header>,
    /// The first of `capacity` slots.
    pub(crate) slots: NonNull<Slot<T>>,
    /// `capacity - 1`, this handle's own copy (never re-read from the region).
    pub(crate) mask: u64,
    /// Number of slots, this handle's own copy.
    pub(crate) capacity: usize,
    /// The ring's modes, this handle's own copy.
    pub(crate) mode: RingMode,
    /// The thread that uses a `Single` producer side through this handle.
    pub(crate) prod_guard: SideGuard,
    /// The thread that uses a `Single` consumer side through this handle.
    pub(crate) cons_guard: SideGuard,
    /// What to free on drop: `None` for a handle on a caller's region.
    owned: Option<Owned>,
    /// The ring holds `T`s.
    _elems: PhantomData<T>,
}

// SAFETY: a ring moves `T`s between threads, hence `T: Send`; the handle's
// raw pointers point to memory that stays valid for the handle's life (its
// own allocation, or a region the creator of the handle vouched for), and
// all shared state in it is accessed through atomics or slots reserved by
// the head/tail scheme.
unsafe impl<T: Copy + Send> Send for Ring<T> {}
// SAFETY: as for `Send`: every `&self` operation synchronises through the
// header's atomics; the slots one thread copies are reserved for it (a
// Multi side wins them with a CAS; a Single side admits only the thread
// that holds it through this handle, `exclusive.rs`, and the handle is the
// only way safe code reaches the region).
unsafe impl<T: Copy + Send> Sync for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// The alignment a region must have for [`init_in`](Self::init_in) and
    /// [`attach`](Self::attach): 128 bytes (two cache lines), which every
    /// page-aligned mapping satisfies.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::Ring;
    ///
    /// assert_eq!(Ring::<u64>::REGION_ALIGN, 128);
    /// ```
    pub const REGION_ALIGN: usize = header::LINE;

    /// The size in bytes of a region holding a ring of `capacity` `T`s: a
    /// 640-byte header, then the slots.
    ///
    /// Fails when `capacity` is zero, not a power of two, or too large, or
    /// when `T` is aligned to more than [`REGION_ALIGN`](Self::REGION_ALIGN).
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::Ring;
    ///
    /// assert_eq!(Ring::<u64>::bytes_for(1024)?, 640 + 1024 * 8);
    /// assert!(Ring::<u64>::bytes_for(1000).is_err());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn bytes_for(capacity: usize) -> Result<usize, RingError> {
        header::bytes_for::<T>(capacity)
    }

    /// A ring of `capacity` slots (a power of two) in its own heap
    /// allocation, freed when the ring is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u32>::new(8, RingMode::MPMC)?;
    /// assert_eq!(ring.capacity(), 8);
    /// assert!(ring.is_empty());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[cfg(not(loom))]
    pub fn new(capacity: usize, mode: RingMode) -> Result<Self, RingError> {
        use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};

        let size = Self::bytes_for(capacity)?;
        let layout = Layout::from_size_align(size, Self::REGION_ALIGN).map_err(|_| {
            RingError::CapacityTooLarge {
                capacity,
                max: header::max_capacity::<T>(),
            }
        })?;
        // SAFETY: the layout's size is at least the header's, never zero.
        let region = unsafe { alloc(layout) };
        if region.is_null() {
            handle_alloc_error(layout);
        }
        // SAFETY: a fresh allocation of `size` bytes aligned to REGION_ALIGN,
        // used by nothing else, that lives until this ring frees it on drop.
        match unsafe { Self::init_in(region, size, capacity, mode) } {
            Ok(mut ring) => {
                ring.owned = Some(Owned { layout });
                Ok(ring)
            }
            Err(e) => {
                // SAFETY: allocated above with this layout, not used since.
                unsafe { dealloc(region, layout) };
                Err(e)
            }
        }
    }

    /// A ring of `capacity` slots whose header and slots are model-checked
    /// loom objects (the loom build has no region constructors).
    #[cfg(loom)]
    pub fn new(capacity: usize, mode: RingMode) -> Result<Self, RingError> {
        Self::bytes_for(capacity)?;
        let hdr = Box::new(Header::new::<T>(capacity, mode));
        hdr.meta.magic.store(header::MAGIC, Ordering::Release);
        let slots: Box<[Slot<T>]> = (0..capacity)
            .map(|_| loom::cell::UnsafeCell::new(core::mem::MaybeUninit::uninit()))
            .collect();
        let hdr = NonNull::from(Box::leak(hdr));
        let slots = NonNull::from(Box::leak(slots)).cast::<Slot<T>>();
        let mut ring = Self::from_parts(hdr, slots, capacity, mode);
        ring.owned = Some(Owned);
        Ok(ring)
    }

    /// Constructs an empty ring of `capacity` `T`s in place at the start of
    /// `region` and returns a handle on it. Other handles (in this process or
    /// others that map the same memory) then [`attach`](Self::attach) to it.
    ///
    /// The region needs [`bytes_for(capacity)`](Self::bytes_for) bytes and
    /// [`REGION_ALIGN`](Self::REGION_ALIGN) alignment; whatever it held is
    /// overwritten. The header's magic number is stored last (with release
    /// ordering), so an `attach` that sees it sees the whole header.
    ///
    /// Elements in memory shared between processes must be plain data:
    /// integers, offsets, and `#[repr(C)]` structs or arrays of them, never
    /// pointers or references (they mean nothing in another address space).
    ///
    /// # Safety
    ///
    /// - `region` is valid for reads and writes of `len` bytes for as long as
    ///   the returned ring, and any handle attached later, is used;
    /// - that memory is accessed only through ring handles (or not at all)
    ///   from now on, and no other `init_in` or handle uses it while this one
    ///   runs.
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
    ///     // SAFETY: `region` holds `len` bytes, suitably aligned, and outlives
    ///     // both handles, which are dropped before it is freed.
    ///     let creator = unsafe { Ring::<u64>::init_in(region, len, 64, RingMode::SPSC)? };
    ///     let attached = unsafe { Ring::<u64>::attach(region, len)? };
    ///     creator.enqueue(7).unwrap();
    ///     assert_eq!(attached.dequeue(), Some(7));
    /// }
    /// // SAFETY: allocated above with `layout`; no handle uses it any more.
    /// unsafe { dealloc(region, layout) };
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[cfg(not(loom))]
    pub unsafe fn init_in(
        region: *mut u8,
        len: usize,
        capacity: usize,
        mode: RingMode,
    ) -> Result<Self, RingError> {
        let need = Self::bytes_for(capacity)?;
        header::check_region(region, len, need)?;
        let hdr = region.cast::<Header>();
        // SAFETY: the region is aligned for the header (checked above), valid
        // for writes of `len >= need` bytes and ours alone (the caller's
        // promise).
        unsafe { hdr.write(Header::new::<T>(capacity, mode)) };
        // SAFETY: written just above, valid and aligned.
        let hdr_ref = unsafe { &*hdr };
        // Release: publishes the rest of the header to whoever acquires the
        // magic in `attach`.
        hdr_ref.meta.magic.store(header::MAGIC, Ordering::Release);
        // SAFETY: `need` includes the header, so the slots start inside the
        // region, at an offset that is a multiple of REGION_ALIGN >= align_of::<T>.
        let slots = unsafe { region.add(header::HEADER_SIZE) }.cast::<Slot<T>>();
        Ok(Self::from_parts(
            // The handle keeps the region's own pointer, not one derived
            // from `hdr_ref`: `Ring::new` frees the region through it, and a
            // pointer derived from a shared reference may not deallocate
            // (Stacked and Tree Borrows).
            // SAFETY: `check_region` refused a null region.
            unsafe { NonNull::new_unchecked(hdr) },
            // SAFETY: derived from the non-null region by an in-bounds offset.
            unsafe { NonNull::new_unchecked(slots) },
            capacity,
            mode,
        ))
    }

    /// Attaches to a ring that [`init_in`](Self::init_in) constructed at the
    /// start of `region` (in this process or another one mapping the same
    /// memory), after checking its header: magic number, layout version,
    /// element size and alignment, mode flags, capacity and mask, and that
    /// `len` bytes hold all its slots. A region that fails any check is an
    /// error, never used.
    ///
    /// The handle keeps its own copy of the capacity and mode: a header
    /// overwritten after attaching cannot make it access memory outside the
    /// slots.
    ///
    /// # Safety
    ///
    /// - `region` is valid for reads and writes of `len` bytes for as long as
    ///   the returned ring is used, and is accessed only through ring handles;
    /// - every bit pattern another user of the region may write into a slot is
    ///   a valid `T` (plain data: no pointers, references, `bool`s or enums
    ///   when the other side is another program);
    /// - no `init_in` on this region runs concurrently.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::{alloc_zeroed, dealloc, Layout};
    /// use ntbdk_ring::{Ring, RingError};
    ///
    /// let len = Ring::<u64>::bytes_for(16)?;
    /// let layout = Layout::from_size_align(len, Ring::<u64>::REGION_ALIGN).unwrap();
    /// // SAFETY: a non-zero-sized layout.
    /// let region = unsafe { alloc_zeroed(layout) };
    /// assert!(!region.is_null());
    /// // Zeroed memory holds no ring: attaching is an error, not UB.
    /// // SAFETY: `region` holds `len` bytes and is not used elsewhere.
    /// let err = unsafe { Ring::<u64>::attach(region, len) }.unwrap_err();
    /// assert!(matches!(err, RingError::BadMagic { .. }));
    /// // SAFETY: allocated above with `layout`.
    /// unsafe { dealloc(region, layout) };
    /// # Ok::<(), RingError>(())
    /// ```
    #[cfg(not(loom))]
    pub unsafe fn attach(region: *mut u8, len: usize) -> Result<Self, RingError> {
        header::check_region(region, len, header::HEADER_SIZE)?;
        // SAFETY: aligned and at least header-sized (checked above), valid for
        // reads (the caller's promise); every bit pattern is a valid header
        // (integers and atomics), so reading garbage is defined.
        let hdr_ref = unsafe { &*region.cast::<Header>() };
        let (capacity, mode) = header::validate::<T>(hdr_ref, len)?;
        // SAFETY: `validate` checked that `len` holds header and slots.
        let slots = unsafe { region.add(header::HEADER_SIZE) }.cast::<Slot<T>>();
        Ok(Self::from_parts(
            // SAFETY: `check_region` refused a null region.
            unsafe { NonNull::new_unchecked(region.cast::<Header>()) },
            // SAFETY: derived from the non-null region by an in-bounds offset.
            unsafe { NonNull::new_unchecked(slots) },
            capacity,
            mode,
        ))
    }

    /// A handle with nothing to free on drop.
    fn from_parts(
        hdr: NonNull<Header>,
        slots: NonNull<Slot<T>>,
        capacity: usize,
        mode: RingMode,
    ) -> Self {
        Ring {
            hdr,
            slots,
            mask: capacity as u64 - 1,
            capacity,
            mode,
            prod_guard: SideGuard::new(),
            cons_guard: SideGuard::new(),
            owned: None,
            _elems: PhantomData,
        }
    }

    /// The header.
    #[inline(always)]
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: `hdr` points to a header that outlives the handle (its own
        // allocation, or the region its creator vouched for).
        unsafe { self.hdr.as_ref() }
    }

    /// The producers' view of the head/tail scheme.
    #[inline(always)]
    pub(crate) fn producers(&self) -> SideRef<'_> {
        let h = self.header();
        SideRef {
            own: &h.prod,
            other: &h.cons,
            sync: self.mode.producer,
            offset: self.capacity as u64,
            capacity: self.capacity,
        }
    }

    /// The consumers' view of the head/tail scheme.
    #[inline(always)]
    pub(crate) fn consumers(&self) -> SideRef<'_> {
        let h = self.header();
        SideRef {
            own: &h.cons,
            other: &h.prod,
            sync: self.mode.consumer,
            offset: 0,
            capacity: self.capacity,
        }
    }

    /// Number of elements in the ring: published by producers and not yet
    /// released by consumers. A snapshot: other threads may change it at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(4, RingMode::SPSC)?;
    /// ring.enqueue_bulk(&[1, 2, 3]).unwrap();
    /// assert_eq!(ring.len(), 3);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn len(&self) -> usize {
        let h = self.header();
        // Consumer tail first, with acquire: the producer tail read after it
        // is then at least as recent, so the difference is not negative.
        let cons = h.cons.tail.load(Ordering::Acquire);
        let prod = h.prod.tail.load(Ordering::Acquire);
        prod.wrapping_sub(cons).min(self.capacity as u64) as usize
    }

    /// Hands a `Single` producer side over: called by the thread that used
    /// it through this handle, it lets the next thread to enqueue claim it
    /// (a `Single` side is otherwise kept to the first thread that used it:
    /// another thread's enqueue panics, even after that thread was joined;
    /// see also [`release_sides`](Self::release_sides)). Does nothing on a
    /// `Multi` side, or in a thread that does not hold the side.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Arc::new(Ring::<u64>::new(4, RingMode::SPSC)?);
    /// ring.enqueue(1).unwrap(); // this thread holds the producer side
    /// ring.release_producer();
    /// let r = ring.clone();
    /// std::thread::spawn(move || r.enqueue(2).unwrap()).join().unwrap();
    /// assert_eq!(ring.len(), 2);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn release_producer(&self) {
        self.prod_guard.release();
    }

    /// Hands a `Single` consumer side over, as
    /// [`release_producer`](Self::release_producer) does the producer side.
    pub fn release_consumer(&self) {
        self.cons_guard.release();
    }

    /// Forgets which threads held this handle's `Single` sides, with
    /// exclusive access: after moving the ring to another thread, or once
    /// [`Arc::get_mut`](std::sync::Arc::get_mut) gives it back, the next
    /// thread to use each side claims it. (A join alone does not hand a
    /// side over: a thread that ended, or panicked, without
    /// [`release_producer`](Self::release_producer) still holds it.)
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(4, RingMode::SPSC)?;
    /// ring.enqueue(1).unwrap(); // prefilled here: this thread holds the producer side
    /// let t = std::thread::spawn(move || {
    ///     let mut ring = ring;
    ///     ring.release_sides();
    ///     ring.enqueue(2).unwrap();
    ///     ring.len()
    /// });
    /// assert_eq!(t.join().unwrap(), 2);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn release_sides(&mut self) {
        self.prod_guard.forget();
        self.cons_guard.forget();
    }

    /// Number of free slots: `capacity() - len()`. A snapshot.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(4, RingMode::SPSC)?;
    /// ring.enqueue(1).unwrap();
    /// assert_eq!(ring.free_count(), 3);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn free_count(&self) -> usize {
        self.capacity - self.len()
    }

    /// Number of slots; all of them are usable.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(2, RingMode::SPSC)?;
    /// assert_eq!(ring.capacity(), 2);
    /// ring.enqueue_bulk(&[1, 2]).unwrap();
    /// assert!(ring.is_full());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the ring holds no element (a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(2, RingMode::SPSC)?;
    /// assert!(ring.is_empty());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every slot holds an element (a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(1, RingMode::SPSC)?;
    /// ring.enqueue(5).unwrap();
    /// assert!(ring.is_full());
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn is_full(&self) -> bool {
        self.len() == self.capacity
    }

    /// The producer and consumer modes the ring was created with.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode, SyncMode};
    ///
    /// let ring = Ring::<u64>::new(2, RingMode::MPSC)?;
    /// assert_eq!(ring.mode().producer, SyncMode::Multi);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    pub fn mode(&self) -> RingMode {
        self.mode
    }
}

impl<T: Copy> fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.capacity)
            .field("mode", &self.mode)
            .field("len", &self.len())
            .field("owned", &self.owned.is_some())
            .finish()
    }
}

impl<T: Copy> Drop for Ring<T> {
    fn drop(&mut self) {
        if let Some(owned) = self.owned.take() {
            owned.free(self);
        }
    }
}

/// The allocation a ring made for itself in [`Ring::new`].
#[cfg(not(loom))]
struct Owned {
    /// The layout the region was allocated with.
    layout: std::alloc::Layout,
}

#[cfg(not(loom))]
impl Owned {
    /// Frees the region of `ring`, which must not be used afterwards.
    fn free<T: Copy>(self, ring: &Ring<T>) {
        // SAFETY: `Ring::new` allocated the region at `hdr` with this layout,
        // and the ring being dropped was its only user.
        unsafe { std::alloc::dealloc(ring.hdr.as_ptr().cast::<u8>(), self.layout) };
    }
}

/// Loom build: the header and slots were leaked boxes.
#[cfg(loom)]
struct Owned;

#[cfg(loom)]
impl Owned {
    /// Frees the boxes of `ring`, which must not be used afterwards.
    fn free<T: Copy>(self, ring: &Ring<T>) {
        // SAFETY: both come from `Box::leak` in `Ring::new` (the slots as a
        // boxed slice of `capacity` cells) and the dropped ring was their only
        // user.
        unsafe {
            drop(Box::from_raw(ring.hdr.as_ptr()));
            drop(Box::from_raw(core::ptr::slice_from_raw_parts_mut(
                ring.slots.as_ptr(),
                ring.capacity,
            )));
        }
    }
}
