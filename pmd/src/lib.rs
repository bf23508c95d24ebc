//! The poll-mode NTB driver.
//!
//! - [`hw`]: the device layer — the [`hw::NtbDevice`] trait and its backends.

pub mod hw;
