//! What a data queue knows of its connection: one word the transport
//! publishes and the queue's owner thread reads at each burst.
//!
//! The word is 0 while the peer is not connected, else `(generation << 32) |
//! epoch`: a new connection (even under the same epoch) is a new word, so a
//! queue sees every reconnect and starts over. This is the only state a
//! data queue shares with the transport; queues share nothing with each
//! other.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::dataqueues::DataQueues;

/// The connection word of one peer, and which of its data queues are taken.
#[derive(Debug)]
pub(crate) struct ConnWatch {
    word: AtomicU64,
    /// Connections so far (only the transport's thread writes it).
    generation: AtomicU64,
    taken: [AtomicBool; DataQueues::MAX_COUNT as usize],
}

impl ConnWatch {
    pub fn new() -> Self {
        Self {
            word: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            taken: Default::default(),
        }
    }

    /// The connection is up under `epoch`.
    pub fn up(&self, epoch: u32) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.word.store(
            ((generation & 0xffff_ffff) << 32) | u64::from(epoch.max(1)),
            Ordering::Release,
        );
    }

    /// The connection is gone.
    pub fn down(&self) {
        self.word.store(0, Ordering::Release);
    }

    /// The current word (0: down).
    #[inline]
    pub fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// Marks queue `q` free again (its taking failed).
    pub fn release(&self, q: u16) {
        self.taken[q as usize].store(false, Ordering::Release);
    }

    /// Marks queue `q` taken; false if it already was.
    pub fn take(&self, q: u16) -> bool {
        !self.taken[q as usize].swap(true, Ordering::AcqRel)
    }
}

/// The epoch of a connection word.
#[inline]
pub(crate) fn epoch_of(word: u64) -> u32 {
    word as u32
}
