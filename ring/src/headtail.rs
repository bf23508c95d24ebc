//! The head/tail reservation scheme both sides of the ring run.
//!
//! Producers and consumers are symmetrical: each side owns a head and a tail
//! ([`Side`]); a side finds how many slots it may take from the *other*
//! side's tail, reserves them by moving its own head, copies, then publishes
//! them by moving its own tail. See the crate documentation for the
//! algorithm and its memory orderings.

use crate::header::Side;
use crate::mode::SyncMode;
use crate::sync::{Ordering, wait_step};

/// How many elements an operation must move (DPDK's fixed and variable
/// queue behaviours).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Amount {
    /// All or nothing (`*_bulk`, single-element operations).
    Exactly,
    /// As many as possible, up to the number asked for (`*_burst`).
    UpTo,
}

/// Slots reserved by one operation.
pub(crate) struct Reservation {
    /// Index of the first reserved slot (free-running).
    pub(crate) head: u64,
    /// Number of slots reserved (0 when the operation moves nothing).
    pub(crate) n: usize,
    /// Slots that were available (free, for producers; filled, for
    /// consumers) when the reservation was made, `n` included.
    pub(crate) available: usize,
}

/// The view of one side of a ring that the algorithm needs.
pub(crate) struct SideRef<'a> {
    /// This side's indices.
    pub(crate) own: &'a Side,
    /// The other side's indices (only its tail is read).
    pub(crate) other: &'a Side,
    /// How this side is synchronised.
    pub(crate) sync: SyncMode,
    /// Added to `other tail - own head` to count available slots: the
    /// capacity for producers (free slots), 0 for consumers (filled slots).
    pub(crate) offset: u64,
    /// The ring's capacity; no count ever exceeds it, even if a corrupted
    /// shared header says otherwise.
    pub(crate) capacity: usize,
}

/// Available slots seen from `head` given the other side's `other_tail`,
/// clamped to `capacity` so that no corrupted index can make an operation
/// run past the slot array.
#[inline(always)]
fn available(offset: u64, other_tail: u64, head: u64, capacity: usize) -> usize {
    let n = offset.wrapping_add(other_tail).wrapping_sub(head);
    n.min(capacity as u64) as usize
}

/// How many of `want` elements to move when `available` slots are free or
/// filled.
#[inline(always)]
fn decide(want: usize, available: usize, amount: Amount) -> usize {
    match amount {
        Amount::Exactly if want <= available => want,
        Amount::Exactly => 0,
        Amount::UpTo => want.min(available),
    }
}

impl SideRef<'_> {
    /// Reserves up to `want` slots (all of them, or none, for
    /// [`Amount::Exactly`]). Moves this side's head; the caller then copies
    /// and calls [`publish`](Self::publish) when `n > 0`.
    #[inline(always)]
    pub(crate) fn reserve(&self, want: usize, amount: Amount) -> Reservation {
        match self.sync {
            SyncMode::Single => self.reserve_single(want, amount),
            SyncMode::Multi => self.reserve_multi(want, amount),
        }
    }

    /// Single side: this thread is the only one on this side, so nothing is
    /// ever reserved but unpublished between its operations: its head is its
    /// own tail, read relaxed, and reserving stores nothing. The other side's
    /// tail is taken from this side's cache unless the cache shows too few
    /// slots, or more than the capacity: a [`Producer`](crate::Producer) or
    /// [`Consumer`](crate::Consumer) that ran this side before keeps its own
    /// cache and leaves the header's behind, so the header's may be older
    /// than this side's index, a "negative" count (as on a `Multi` side).
    #[inline(always)]
    fn reserve_single(&self, want: usize, amount: Amount) -> Reservation {
        let head = self.own.tail.load(Ordering::Relaxed);
        let cached = self.own.other_tail.load(Ordering::Relaxed);
        let counted = self.offset.wrapping_add(cached).wrapping_sub(head);
        let avail = if counted < want as u64 || counted > self.capacity as u64 {
            // Acquire: the other side's work on the slots it released (the
            // consumers' reads, the producers' writes) happens before ours.
            let fresh = self.other.tail.load(Ordering::Acquire);
            self.own.other_tail.store(fresh, Ordering::Relaxed);
            available(self.offset, fresh, head, self.capacity)
        } else {
            counted as usize
        };
        Reservation {
            head,
            n: decide(want, avail, amount),
            available: avail,
        }
    }

    /// Multi side: compare-and-swap the head from the value the count was
    /// computed with; on failure another thread reserved first, so recount
    /// from the head it left.
    ///
    /// The side shares one cached copy of the other side's tail. Any value in
    /// it was the real tail once, so it under-counts; but it may be older
    /// than the head another thread has since moved, which would make the
    /// count negative (a huge `u64`): a count above the capacity, like one
    /// below `want`, sends us to the real tail.
    #[inline(always)]
    fn reserve_multi(&self, want: usize, amount: Amount) -> Reservation {
        // Acquire (and AcqRel/Acquire on the CAS below): the thread that set
        // this head had read an other-side tail that allowed it; acquiring
        // the head makes our read of that tail at least as recent, so a count
        // from the real tail cannot go negative.
        let mut head = self.own.head.load(Ordering::Acquire);
        // Acquire: pairs with the release store of whichever thread of this
        // side cached it, which had acquired it from the other side.
        let mut other_tail = self.own.other_tail.load(Ordering::Acquire);
        loop {
            let counted = self.offset.wrapping_add(other_tail).wrapping_sub(head);
            let avail = if counted < want as u64 || counted > self.capacity as u64 {
                other_tail = self.other.tail.load(Ordering::Acquire);
                // Release: hands the synchronisation with the other side on
                // to the threads of this side that acquire the cache. Racing
                // stores may leave an older value: still a lower bound.
                self.own.other_tail.store(other_tail, Ordering::Release);
                available(self.offset, other_tail, head, self.capacity)
            } else {
                counted as usize
            };
            let n = decide(want, avail, amount);
            if n == 0 {
                return Reservation {
                    head,
                    n,
                    available: avail,
                };
            }
            match self.own.head.compare_exchange_weak(
                head,
                head.wrapping_add(n as u64),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Reservation {
                        head,
                        n,
                        available: avail,
                    };
                }
                Err(now) => head = now,
            }
        }
    }

    /// Publishes the `n` slots reserved at `head` to the other side.
    ///
    /// Multi sides publish in reservation order: wait until every earlier
    /// reservation is published (the tail reaches `head`), then move the tail.
    #[inline(always)]
    pub(crate) fn publish(&self, head: u64, n: usize) {
        if self.sync == SyncMode::Multi {
            let mut spins = 0;
            // Acquire: the earlier reserver's slot accesses happen before our
            // release below, so whoever acquires our tail sees theirs too.
            while self.own.tail.load(Ordering::Acquire) != head {
                wait_step(&mut spins);
            }
        }
        // Release: our slot writes (producer) or reads (consumer) happen
        // before the other side, acquiring this tail, reuses the slots.
        self.own
            .tail
            .store(head.wrapping_add(n as u64), Ordering::Release);
    }
}
