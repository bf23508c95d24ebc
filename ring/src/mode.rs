//! Producer and consumer synchronisation modes, chosen when a ring is created.

/// How one side of a ring (the producers or the consumers) is synchronised.
///
/// # Examples
///
/// ```
/// use ntbdk_ring::{RingMode, SyncMode};
///
/// let mode = RingMode { producer: SyncMode::Multi, consumer: SyncMode::Single };
/// assert_eq!(mode, RingMode::MPSC);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// At most one thread at a time uses this side. Reserving slots needs no
    /// atomic read-modify-write on the shared indices and publishing them is
    /// one store: the cheapest mode.
    ///
    /// This is a promise by the caller, as in DPDK. Through one
    /// [`Ring`](crate::Ring) handle it is checked: the first thread to use
    /// the side holds it, another thread's operation on it panics, and the
    /// holder hands it over with
    /// [`release_producer`](crate::Ring::release_producer) /
    /// [`release_consumer`](crate::Ring::release_consumer) (a join alone does
    /// not; see [`release_sides`](crate::Ring::release_sides)). The check is
    /// one compare-and-swap on a thread's first operation, then a compare
    /// with the holder, no atomic read-modify-write. Across
    /// processes, or handles on one region made with the `unsafe`
    /// [`attach`](crate::Ring::attach), it is not checked: two threads
    /// enqueueing (or dequeueing) at once race on the slots and lose or
    /// duplicate items. The split handles ([`Producer`](crate::Producer),
    /// [`Consumer`](crate::Consumer)) take `&mut self` and need no check.
    Single,
    /// Any number of threads (or processes) may use this side at once. Each
    /// operation reserves its slots with a compare-and-swap on the side's
    /// head and publishes them in order on the side's tail. So, as in
    /// DPDK's rings, a user stopped or killed between the two (a process
    /// that dies mid-operation, one stopped in a debugger) holds every later
    /// operation on this side until it publishes: one that died never
    /// does, and the ring must be made again.
    Multi,
}

/// The synchronisation modes of both sides of a ring.
///
/// # Examples
///
/// ```
/// use ntbdk_ring::{Ring, RingMode};
///
/// let ring = Ring::<u64>::new(64, RingMode::MPMC)?;
/// assert_eq!(ring.mode(), RingMode::MPMC);
/// # Ok::<(), ntbdk_ring::RingError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMode {
    /// How the enqueueing side is synchronised.
    pub producer: SyncMode,
    /// How the dequeueing side is synchronised.
    pub consumer: SyncMode,
}

impl RingMode {
    /// One producer thread, one consumer thread: the fastest mode.
    pub const SPSC: RingMode = RingMode {
        producer: SyncMode::Single,
        consumer: SyncMode::Single,
    };
    /// Any number of producers and consumers.
    pub const MPMC: RingMode = RingMode {
        producer: SyncMode::Multi,
        consumer: SyncMode::Multi,
    };
    /// One producer, any number of consumers (e.g. a work distributor).
    pub const SPMC: RingMode = RingMode {
        producer: SyncMode::Single,
        consumer: SyncMode::Multi,
    };
    /// Any number of producers, one consumer (e.g. a free list returned to
    /// its owner).
    pub const MPSC: RingMode = RingMode {
        producer: SyncMode::Multi,
        consumer: SyncMode::Single,
    };

    /// Bit in the header's mode flags: the producer side is `Multi`.
    pub(crate) const FLAG_MULTI_PRODUCER: u32 = 1;
    /// Bit in the header's mode flags: the consumer side is `Multi`.
    pub(crate) const FLAG_MULTI_CONSUMER: u32 = 2;

    /// Encodes the mode as the header's flag word.
    pub(crate) fn to_flags(self) -> u32 {
        let mut flags = 0;
        if self.producer == SyncMode::Multi {
            flags |= Self::FLAG_MULTI_PRODUCER;
        }
        if self.consumer == SyncMode::Multi {
            flags |= Self::FLAG_MULTI_CONSUMER;
        }
        flags
    }

    #[cfg_attr(loom, allow(dead_code))] // attach does not exist under loom
    /// Decodes the header's flag word; `None` when unknown bits are set.
    pub(crate) fn from_flags(flags: u32) -> Option<RingMode> {
        if flags & !(Self::FLAG_MULTI_PRODUCER | Self::FLAG_MULTI_CONSUMER) != 0 {
            return None;
        }
        let side = |bit| {
            if flags & bit != 0 {
                SyncMode::Multi
            } else {
                SyncMode::Single
            }
        };
        Some(RingMode {
            producer: side(Self::FLAG_MULTI_PRODUCER),
            consumer: side(Self::FLAG_MULTI_CONSUMER),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_round_trip() {
        for mode in [
            RingMode::SPSC,
            RingMode::MPMC,
            RingMode::SPMC,
            RingMode::MPSC,
        ] {
            assert_eq!(RingMode::from_flags(mode.to_flags()), Some(mode));
        }
        assert_eq!(RingMode::from_flags(4), None);
    }
}
