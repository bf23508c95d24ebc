//! The consumer operations: single-element, bulk (all or nothing) and burst
//! (as many as available).

use crate::burst::Burst;
use crate::headtail::{Amount, Reservation};
use crate::mode::SyncMode;
use crate::ring::Ring;
use crate::slots;

impl<T: Copy> Ring<T> {
    /// Reserves up to `want` filled slots, copies them to `dst` and releases
    /// them to the producers; with `CHECK`, through the one-thread check of
    /// a `Single` side (without it, the caller vouches for it).
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `want` elements.
    #[inline(always)]
    unsafe fn dequeue_n<const CHECK: bool>(
        &self,
        dst: *mut T,
        want: usize,
        amount: Amount,
    ) -> Reservation {
        if CHECK && self.mode.consumer == SyncMode::Single {
            self.cons_guard.enter("consumer");
        }
        let side = self.consumers();
        let r = side.reserve(want, amount);
        if r.n > 0 {
            // SAFETY: `slots` points to `capacity` slots; the start is masked
            // below `capacity`; `r.n <= capacity` (reserve clamps every
            // count); the slots `head .. head + n` are ours: a Multi side won
            // them with its CAS on the head, a Single side is used by one
            // thread at a time (this handle's guard, above, in this process;
            // the mode's contract across handles); the producers wrote
            // them before publishing their tail, which we acquired, and will
            // not reuse them before we publish ours; `dst` holds
            // `want >= r.n` elements (our caller's promise) and, being the
            // caller's memory, does not overlap the slots.
            // SAFETY: holds for the reasons given just above.
            unsafe {
                slots::read(
                    self.slots.as_ptr(),
                    self.capacity,
                    (r.head & self.mask) as usize,
                    dst,
                    r.n,
                )
            };
            side.publish(r.head, r.n);
        }
        r
    }

    /// Dequeues one element, or `None` when the ring is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(2, RingMode::SPSC)?;
    /// ring.enqueue(9).unwrap();
    /// assert_eq!(ring.dequeue(), Some(9));
    /// assert_eq!(ring.dequeue(), None);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn dequeue(&self) -> Option<T> {
        let mut out = core::mem::MaybeUninit::<T>::uninit();
        // SAFETY: `out` is valid for writes of one `T`.
        let r = unsafe { self.dequeue_n::<true>(out.as_mut_ptr(), 1, Amount::Exactly) };
        if r.n == 1 {
            // SAFETY: `dequeue_n` moved one element into `out`.
            Some(unsafe { out.assume_init() })
        } else {
            None
        }
    }

    /// Dequeues exactly `out.len()` elements into `out`, or none when fewer
    /// are in the ring.
    ///
    /// Returns `Ok(elements remaining)` after dequeueing, or `Err(elements
    /// seen)` when there were fewer than `out.len()`; the counts are lower
    /// bounds (see [`Burst::left`]). An empty slice succeeds.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(4, RingMode::MPMC)?;
    /// ring.enqueue_bulk(&[1, 2, 3]).unwrap();
    /// let mut out = [0; 2];
    /// assert_eq!(ring.dequeue_bulk(&mut out), Ok(1));
    /// assert_eq!(out, [1, 2]);
    /// assert_eq!(ring.dequeue_bulk(&mut out), Err(1)); // nothing dequeued
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn dequeue_bulk(&self, out: &mut [T]) -> Result<usize, usize> {
        // SAFETY: `out` is valid for writes of `out.len()` elements.
        let r = unsafe { self.dequeue_n::<true>(out.as_mut_ptr(), out.len(), Amount::Exactly) };
        if r.n == out.len() {
            Ok(r.available - r.n)
        } else {
            Err(r.available)
        }
    }

    /// Dequeues as many elements as are available, up to `out.len()`, into the
    /// front of `out`.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Burst, Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(8, RingMode::SPSC)?;
    /// ring.enqueue_bulk(&[1, 2, 3]).unwrap();
    /// let mut out = [0; 8];
    /// assert_eq!(ring.dequeue_burst(&mut out), Burst { n: 3, left: 0 });
    /// assert_eq!(&out[..3], &[1, 2, 3]);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn dequeue_burst(&self, out: &mut [T]) -> Burst {
        // SAFETY: `out` is valid for writes of `out.len()` elements.
        let r = unsafe { self.dequeue_n::<true>(out.as_mut_ptr(), out.len(), Amount::UpTo) };
        Burst {
            n: r.n,
            left: r.available - r.n,
        }
    }

    /// [`dequeue_burst`](Self::dequeue_burst) without the check that keeps
    /// a `Single` consumer side to one thread at a time (see
    /// [`enqueue_burst_unchecked`](Self::enqueue_burst_unchecked)).
    ///
    /// # Safety
    ///
    /// As for [`enqueue_burst_unchecked`](Self::enqueue_burst_unchecked),
    /// on the consumer side: this call and every other dequeue on that side
    /// are ordered by happens-before.
    #[inline]
    pub unsafe fn dequeue_burst_unchecked(&self, out: &mut [T]) -> Burst {
        // SAFETY: `out` is valid for writes of `out.len()` elements; the
        // caller vouches for the side.
        let r = unsafe { self.dequeue_n::<false>(out.as_mut_ptr(), out.len(), Amount::UpTo) };
        Burst {
            n: r.n,
            left: r.available - r.n,
        }
    }
}
