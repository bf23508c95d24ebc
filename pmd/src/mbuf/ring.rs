//! Rings of mbufs between pipeline stages (DPDK's `rte_ring` of mbuf
//! pointers): an `ntbdk-ring` ring whose slots carry mbufs given up as
//! plain data.

use std::sync::Arc;

use ntbdk_ring::{Ring, RingError, RingMode};

use super::{Mbuf, RawMbuf};

/// Mbufs moved per ring call.
const CHUNK: usize = 64;

/// A bounded lock-free ring of mbufs, for passing them between lcores (for
/// example an rx stage and a tx stage). Mbufs left in it when it is dropped
/// are freed.
///
/// A shared `MbufRing` is multi-producer and multi-consumer (any thread may
/// enqueue or dequeue). For one producer and one consumer,
/// [`spsc`](MbufRing::spsc) gives the faster single-producer/single-consumer ring
/// as two handles, one per side, that cannot be shared: a slot carries an
/// mbuf's ownership, and two threads on a single-threaded side would
/// duplicate or lose mbufs.
pub struct MbufRing {
    ring: Ring<RawMbuf>,
}

/// The producer side of an [`MbufRing::spsc`] ring: one thread at a time.
pub struct MbufProducer(Arc<MbufRing>);

/// The consumer side of an [`MbufRing::spsc`] ring: one thread at a time.
pub struct MbufConsumer(Arc<MbufRing>);

impl MbufRing {
    /// A multi-producer, multi-consumer ring of `capacity` mbufs (a power of
    /// two).
    ///
    /// # Errors
    /// [`RingError`] for a bad capacity.
    pub fn new(capacity: usize) -> Result<MbufRing, RingError> {
        Ok(MbufRing {
            ring: Ring::new(capacity, RingMode::MPMC)?,
        })
    }

    /// A single-producer, single-consumer ring of `capacity` mbufs (a power
    /// of two), as its two sides.
    ///
    /// # Errors
    /// [`RingError`] for a bad capacity.
    pub fn spsc(capacity: usize) -> Result<(MbufProducer, MbufConsumer), RingError> {
        let ring = Arc::new(MbufRing {
            ring: Ring::new(capacity, RingMode::SPSC)?,
        });
        Ok((MbufProducer(ring.clone()), MbufConsumer(ring)))
    }

    /// Moves as many mbufs from the front of `mbufs` into the ring as fit;
    /// returns how many (they are removed from `mbufs`, the rest stay in
    /// order).
    pub fn enqueue_burst(&self, mbufs: &mut Vec<Mbuf>) -> usize {
        self.enqueue_in(mbufs, false)
    }

    /// [`enqueue_burst`](Self::enqueue_burst); `sole` when the caller is
    /// the side's one user (an [`MbufProducer`], through `&mut`), which
    /// skips the ring's one-thread check.
    fn enqueue_in(&self, mbufs: &mut Vec<Mbuf>, sole: bool) -> usize {
        let mut raw = [RawMbuf::EMPTY; CHUNK];
        let mut total = 0;
        while !mbufs.is_empty() {
            let k = mbufs.len().min(CHUNK);
            for (slot, m) in raw.iter_mut().zip(mbufs.drain(..k)) {
                *slot = m.into_raw();
            }
            let n = if sole {
                // SAFETY: the caller is the side's only user (`sole`).
                unsafe { self.ring.enqueue_burst_unchecked(&raw[..k]) }.n
            } else {
                self.ring.enqueue_burst(&raw[..k]).n
            };
            let back = raw[n..k].iter().map(|r| {
                // SAFETY: the ones the ring did not take are still only
                // ours, each taken back once.
                unsafe { Mbuf::from_raw(*r) }
            });
            mbufs.splice(0..0, back);
            total += n;
            if n < k {
                break;
            }
        }
        total
    }

    /// Moves up to `max` mbufs out of the ring onto the end of `out`;
    /// returns how many.
    pub fn dequeue_burst(&self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        self.dequeue_in(out, max, false)
    }

    /// [`dequeue_burst`](Self::dequeue_burst); `sole` as in
    /// [`enqueue_in`](Self::enqueue_in), for an [`MbufConsumer`].
    fn dequeue_in(&self, out: &mut Vec<Mbuf>, max: usize, sole: bool) -> usize {
        let mut raw = [RawMbuf::EMPTY; CHUNK];
        let mut total = 0;
        while total < max {
            let k = (max - total).min(CHUNK);
            let n = if sole {
                // SAFETY: the caller is the side's only user (`sole`).
                unsafe { self.ring.dequeue_burst_unchecked(&mut raw[..k]) }.n
            } else {
                self.ring.dequeue_burst(&mut raw[..k]).n
            };
            // SAFETY: each slot dequeued held an mbuf given up by
            // `enqueue_burst`, and the ring hands each slot out once.
            out.extend(raw[..n].iter().map(|r| unsafe { Mbuf::from_raw(*r) }));
            total += n;
            if n < k {
                break;
            }
        }
        total
    }

    /// Mbufs in the ring now.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether the ring holds no mbuf now.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The most mbufs it holds.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }
}

impl MbufProducer {
    /// See [`MbufRing::enqueue_burst`].
    pub fn enqueue_burst(&mut self, mbufs: &mut Vec<Mbuf>) -> usize {
        // The one producer (not `Clone`, the ring private), borrowed `&mut`.
        self.0.enqueue_in(mbufs, true)
    }

    /// Mbufs in the ring now.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the ring holds no mbuf now.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl MbufConsumer {
    /// See [`MbufRing::dequeue_burst`].
    pub fn dequeue_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        // The one consumer (not `Clone`, the ring private), borrowed `&mut`;
        // the ring's own drop runs only once both sides are gone.
        self.0.dequeue_in(out, max, true)
    }

    /// Mbufs in the ring now.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the ring holds no mbuf now.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for MbufProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MbufProducer").field(&*self.0).finish()
    }
}

impl std::fmt::Debug for MbufConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MbufConsumer").field(&*self.0).finish()
    }
}

impl Drop for MbufRing {
    fn drop(&mut self) {
        // `&mut`: no other user is left, whichever thread drops it (a
        // Single side's holder may be another thread).
        let mut left = Vec::new();
        while self.dequeue_in(&mut left, CHUNK, true) > 0 {
            Mbuf::free_bulk(&mut left);
        }
    }
}

impl std::fmt::Debug for MbufRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MbufRing")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}
