//! The poll-mode NTB driver.
//!
//! - [`hw`]: the device layer — the [`hw::NtbDevice`] trait and its backends.
//! - [`lcore`]: the runtime — pinned worker threads and polling loops.

pub mod hw;
pub mod lcore;
pub mod transport;
