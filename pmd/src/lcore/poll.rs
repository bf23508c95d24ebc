//! Polling loops: spin, or spin then yield.

use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// How a [`PollLoop`] waits when a poll finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Never give the core up (a dedicated core per spinner).
    Spin,
    /// After `spins` consecutive empty polls, yield the core once
    /// (`sched_yield`), for machines with fewer cores than spinners.
    Hybrid {
        /// Empty polls before a yield.
        spins: u32,
    },
}

/// A shared flag that ends polling loops. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A lowered flag.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises it: every loop watching it returns after its current poll.
    /// Release: what this thread did before (a last enqueue, say) is seen
    /// by a thread that sees the flag raised.
    pub fn stop(&self) {
        self.0.store(true, Release);
    }

    /// Whether it is raised (Acquire: see [`stop`](Self::stop)).
    #[inline]
    pub fn is_stopped(&self) -> bool {
        self.0.load(Acquire)
    }
}

/// Counters of one loop, readable by other threads while it runs (published
/// every 1024 iterations and at the end).
#[derive(Debug, Default)]
pub struct LoopCounters {
    iterations: AtomicU64,
    busy_polls: AtomicU64,
    empty_polls: AtomicU64,
    yields: AtomicU64,
    work: AtomicU64,
}

impl LoopCounters {
    /// A copy of the counters.
    pub fn snapshot(&self) -> LoopStats {
        LoopStats {
            iterations: self.iterations.load(Relaxed),
            busy_polls: self.busy_polls.load(Relaxed),
            empty_polls: self.empty_polls.load(Relaxed),
            yields: self.yields.load(Relaxed),
            work: self.work.load(Relaxed),
        }
    }

    fn publish(&self, s: &LoopStats) {
        self.iterations.store(s.iterations, Relaxed);
        self.busy_polls.store(s.busy_polls, Relaxed);
        self.empty_polls.store(s.empty_polls, Relaxed);
        self.yields.store(s.yields, Relaxed);
        self.work.store(s.work, Relaxed);
    }
}

/// What a loop did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Polls made.
    pub iterations: u64,
    /// Polls that found work.
    pub busy_polls: u64,
    /// Polls that found nothing.
    pub empty_polls: u64,
    /// Times the loop yielded the core (hybrid mode).
    pub yields: u64,
    /// Sum of the work counts the polls returned.
    pub work: u64,
}

/// A polling loop: calls a poll function until its [`StopFlag`] is raised.
#[derive(Debug)]
pub struct PollLoop {
    mode: PollMode,
    stop: StopFlag,
    counters: Arc<LoopCounters>,
}

impl PollLoop {
    /// A loop in `mode` that ends when `stop` is raised.
    pub fn new(mode: PollMode, stop: StopFlag) -> Self {
        PollLoop {
            mode,
            stop,
            counters: Arc::default(),
        }
    }

    /// The loop's live counters (to print from another thread).
    pub fn counters(&self) -> Arc<LoopCounters> {
        self.counters.clone()
    }

    /// Runs `poll` until the stop flag is raised. `poll` returns how much
    /// work it did (0 = an empty poll). Returns the loop's totals.
    pub fn run(&mut self, mut poll: impl FnMut() -> usize) -> LoopStats {
        let mut s = LoopStats::default();
        let mut idle: u32 = 0;
        while !self.stop.is_stopped() {
            let n = poll();
            s.iterations += 1;
            if n > 0 {
                s.busy_polls += 1;
                s.work += n as u64;
                idle = 0;
            } else {
                s.empty_polls += 1;
                match self.mode {
                    PollMode::Spin => std::hint::spin_loop(),
                    PollMode::Hybrid { spins } => {
                        idle += 1;
                        if idle >= spins {
                            idle = 0;
                            s.yields += 1;
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
            }
            if s.iterations.is_multiple_of(1024) {
                self.counters.publish(&s);
            }
        }
        self.counters.publish(&s);
        s
    }
}
