//! The poll-mode NTB driver.
//!
//! - [`hw`]: the device layer — the [`hw::NtbDevice`] trait and its backends.
//! - [`lcore`]: the runtime — pinned worker threads and polling loops.
//! - [`mbuf`]: message buffers from mempool pools, for the data queues'
//!   bursts.
//! - [`transport`]: queue pairs (verbs-like) and data queues (DPDK-like
//!   bursts of mbufs) over posted writes.

pub mod hw;
pub mod lcore;
pub mod mbuf;
pub mod transport;
