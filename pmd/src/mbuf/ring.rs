//! Rings of mbufs between pipeline stages (DPDK's `rte_ring` of mbuf
//! pointers): an `ntbdk-ring` ring whose slots carry mbufs given up as
//! plain data.

use ntbdk_ring::{Ring, RingError, RingMode};

use super::{Mbuf, RawMbuf};

/// Mbufs moved per ring call.
const CHUNK: usize = 64;

/// A bounded lock-free ring of mbufs, for passing them between lcores (for
/// example an rx stage and a tx stage). Mbufs left in it when it is dropped
/// are freed.
pub struct MbufRing {
    ring: Ring<RawMbuf>,
}

impl MbufRing {
    /// A ring of `capacity` mbufs (a power of two) with producer and
    /// consumer sides as `mode` says (SP/MP × SC/MC).
    ///
    /// # Errors
    /// [`RingError`] for a bad capacity.
    pub fn new(capacity: usize, mode: RingMode) -> Result<MbufRing, RingError> {
        Ok(MbufRing {
            ring: Ring::new(capacity, mode)?,
        })
    }

    /// Moves as many mbufs from the front of `mbufs` into the ring as fit;
    /// returns how many (they are removed from `mbufs`, the rest stay in
    /// order).
    pub fn enqueue_burst(&self, mbufs: &mut Vec<Mbuf>) -> usize {
        let mut raw = [RawMbuf::EMPTY; CHUNK];
        let mut total = 0;
        while !mbufs.is_empty() {
            let k = mbufs.len().min(CHUNK);
            for (slot, m) in raw.iter_mut().zip(mbufs.drain(..k)) {
                *slot = m.into_raw();
            }
            let n = self.ring.enqueue_burst(&raw[..k]).n;
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
        let mut raw = [RawMbuf::EMPTY; CHUNK];
        let mut total = 0;
        while total < max {
            let k = (max - total).min(CHUNK);
            let n = self.ring.dequeue_burst(&mut raw[..k]).n;
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

impl Drop for MbufRing {
    fn drop(&mut self) {
        let mut left = Vec::new();
        while self.dequeue_burst(&mut left, CHUNK) > 0 {
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
