//! The runtime: worker closures pinned to named cores, and polling loops.
//!
//! As in DPDK's EAL, each busy worker owns a core ("lcore") and spins on its
//! queues. [`Lcores`] launches closures on cores chosen by number
//! (`core_affinity`), joins them and collects one `Result` per worker — a
//! panic is reported as [`LcoreError::Panicked`], never propagated as an
//! abort. [`PollLoop`] runs a poll function until a [`StopFlag`] is raised,
//! either spinning ([`PollMode::Spin`], for dedicated cores) or spinning a
//! bounded number of empty polls and then yielding ([`PollMode::Hybrid`],
//! for machines with fewer cores than spinners), and counts iterations,
//! busy and empty polls and yields.
//!
//! # Example
//! ```
//! use ntbdk_pmd::lcore::{Lcores, PollLoop, PollMode, StopFlag};
//!
//! let stop = StopFlag::new();
//! let mut lcores = Lcores::new();
//! let s = stop.clone();
//! let core = ntbdk_pmd::lcore::available_cores()[0];
//! lcores.launch(Some(core), "poller", move || {
//!     let mut n = 0u64;
//!     let stats = PollLoop::new(PollMode::Hybrid { spins: 64 }, s.clone()).run(|| {
//!         n += 1;
//!         if n == 1000 {
//!             s.stop(); // any holder of the flag (here the poll itself) ends the loop
//!         }
//!         if n >= 1000 { 0 } else { 1 } // work done by this poll
//!     });
//!     stats.busy_polls
//! }).unwrap();
//! let results = lcores.join();
//! assert_eq!(*results[0].as_ref().unwrap(), 999);
//! ```

mod launch;
mod poll;

pub use launch::{CoreId, LcoreError, Lcores, Worker, available_cores, current_cpu};
pub use poll::{LoopCounters, LoopStats, PollLoop, PollMode, StopFlag};
