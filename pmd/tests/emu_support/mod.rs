//! Helpers shared by the emulated-fabric tests: private fabric directories,
//! child processes (the test binary re-executed in a role) and bounded waits.

#![allow(dead_code)]

use std::time::{Duration, Instant};

#[path = "../child_roles/mod.rs"]
mod child_roles;
#[allow(unused_imports)] // not every test crate runs children
pub use child_roles::{RoleChild, TestDir, child_role, death_bound, env};

/// Waits until `f` returns `Some`, polling every millisecond, for at most
/// `limit`; panics with `what` on timeout.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A byte pattern that differs by writer, reader and position.
pub fn pattern(from: u16, to: u16, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add(from as u64 * 131 + to as u64 * 7)
        .rotate_right(11) as u8
}
