//! The producer operations: single-element, bulk (all or nothing) and burst
//! (as many as fit).

use crate::burst::Burst;
use crate::headtail::{Amount, Reservation};
use crate::mode::SyncMode;
use crate::ring::Ring;
use crate::slots;

impl<T: Copy> Ring<T> {
    /// Reserves slots for up to `items.len()` elements, copies them in and
    /// publishes them; with `CHECK`, through the one-thread check of a
    /// `Single` side (without it, the caller vouches for it).
    #[inline(always)]
    fn enqueue_n<const CHECK: bool>(&self, items: &[T], amount: Amount) -> Reservation {
        if CHECK && self.mode.producer == SyncMode::Single {
            self.prod_guard.enter("producer");
        }
        let side = self.producers();
        let r = side.reserve(items.len(), amount);
        if r.n > 0 {
            // SAFETY: `slots` points to `capacity` slots; the start is masked
            // below `capacity`; `r.n <= capacity` (reserve clamps every
            // count); the slots `head .. head + n` are ours: a Multi side won
            // them with its CAS on the head, a Single side is used by one
            // thread at a time (this handle's guard, above, in this process;
            // the mode's contract across handles), and the consumers
            // released them (we acquired their tail) and will not read them
            // before we publish.
            // SAFETY: holds for the reasons given just above.
            unsafe {
                slots::write(
                    self.slots.as_ptr(),
                    self.capacity,
                    (r.head & self.mask) as usize,
                    &items[..r.n],
                )
            };
            side.publish(r.head, r.n);
        }
        r
    }

    /// Enqueues one element, or gives it back when the ring is full.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(1, RingMode::SPSC)?;
    /// assert_eq!(ring.enqueue(1), Ok(()));
    /// assert_eq!(ring.enqueue(2), Err(2));
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn enqueue(&self, item: T) -> Result<(), T> {
        if self
            .enqueue_n::<true>(core::slice::from_ref(&item), Amount::Exactly)
            .n
            == 1
        {
            Ok(())
        } else {
            Err(item)
        }
    }

    /// Enqueues all of `items`, or none of them when they do not all fit.
    ///
    /// Returns `Ok(free slots left)` after enqueueing, or `Err(free slots
    /// seen)` when there were fewer than `items.len()`; the counts are lower
    /// bounds (see [`Burst::left`]). An empty slice succeeds.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(4, RingMode::MPMC)?;
    /// assert_eq!(ring.enqueue_bulk(&[1, 2, 3]), Ok(1));
    /// assert_eq!(ring.enqueue_bulk(&[4, 5]), Err(1)); // nothing enqueued
    /// assert_eq!(ring.len(), 3);
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn enqueue_bulk(&self, items: &[T]) -> Result<usize, usize> {
        let r = self.enqueue_n::<true>(items, Amount::Exactly);
        if r.n == items.len() {
            Ok(r.available - r.n)
        } else {
            Err(r.available)
        }
    }

    /// Enqueues as many of `items` as fit, from the front of the slice.
    ///
    /// # Examples
    ///
    /// ```
    /// use ntbdk_ring::{Burst, Ring, RingMode};
    ///
    /// let ring = Ring::<u64>::new(4, RingMode::SPSC)?;
    /// assert_eq!(ring.enqueue_burst(&[1, 2, 3, 4, 5]), Burst { n: 4, left: 0 });
    /// # Ok::<(), ntbdk_ring::RingError>(())
    /// ```
    #[inline]
    pub fn enqueue_burst(&self, items: &[T]) -> Burst {
        let r = self.enqueue_n::<true>(items, Amount::UpTo);
        Burst {
            n: r.n,
            left: r.available - r.n,
        }
    }

    /// [`enqueue_burst`](Self::enqueue_burst) without the check that keeps
    /// a `Single` producer side to one thread (which would refuse a thread
    /// other than the side's holder; see
    /// [`release_producer`](Self::release_producer)).
    ///
    /// # Safety
    ///
    /// On a `Single` producer side, this call and every other enqueue on
    /// that side (through any handle or process, checked or not) are
    /// ordered by happens-before: not at the same time, and not merely one
    /// after the other without synchronisation. For example: the caller
    /// holds the only `&mut` to a wrapper that owns the side, and moving the
    /// wrapper between threads orders them. A checked enqueue after
    /// unchecked ones claims the side as if no thread had used it.
    #[inline]
    pub unsafe fn enqueue_burst_unchecked(&self, items: &[T]) -> Burst {
        let r = self.enqueue_n::<false>(items, Amount::UpTo);
        Burst {
            n: r.n,
            left: r.available - r.n,
        }
    }
}
