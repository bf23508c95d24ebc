//! How long each message size runs: a count of operations (`-n`), a
//! duration (`-D`), or both (whichever comes first).

use std::time::Duration;

/// When a measurement of one size stops.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::perf::Budget;
/// let b = Budget::iterations(1000);
/// assert!(!b.reached(999, Duration::from_secs(60)));
/// assert!(b.reached(1000, Duration::ZERO));
/// let b = Budget::duration(Duration::from_millis(200)).max_iterations(10);
/// assert!(b.reached(10, Duration::ZERO));
/// assert!(b.reached(1, Duration::from_millis(200)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    iters: Option<u64>,
    time: Option<Duration>,
}

impl Budget {
    /// Exactly `n` operations.
    pub fn iterations(n: u64) -> Self {
        Self {
            iters: Some(n.max(1)),
            time: None,
        }
    }

    /// As many operations as fit in `d`.
    pub fn duration(d: Duration) -> Self {
        Self {
            iters: None,
            time: Some(d),
        }
    }

    /// No limit: until the caller stops (a server's side of a
    /// bidirectional test).
    pub fn until_stopped() -> Self {
        Self {
            iters: None,
            time: None,
        }
    }

    /// Stops after `n` operations even if time is left.
    pub fn max_iterations(mut self, n: u64) -> Self {
        self.iters = Some(n.max(1));
        self
    }

    /// Whether `done` operations in `elapsed` exhaust the budget.
    #[inline]
    pub fn reached(&self, done: u64, elapsed: Duration) -> bool {
        self.iters.is_some_and(|n| done >= n) || self.time.is_some_and(|t| elapsed >= t)
    }

    /// Operations left after `done`, when the budget counts them.
    #[inline]
    pub fn remaining(&self, done: u64) -> Option<u64> {
        self.iters.map(|n| n.saturating_sub(done))
    }

    /// The count of operations it stops at, if it counts them.
    pub fn iteration_limit(&self) -> Option<u64> {
        self.iters
    }

    /// The time it stops at, if it is timed.
    pub fn time_limit(&self) -> Option<Duration> {
        self.time
    }

    /// A short description: `5000 iterations`, `0.20 s`.
    pub fn describe(&self) -> String {
        match (self.iters, self.time) {
            (Some(n), None) => format!("{n} iterations"),
            (None, Some(t)) => format!("{:.2} s", t.as_secs_f64()),
            (Some(n), Some(t)) => format!("{:.2} s or {n} iterations", t.as_secs_f64()),
            (None, None) => "until stopped".into(),
        }
    }
}
