//! The atomics the ring is built from, in one place.
//!
//! A normal build uses `core::sync::atomic`, whose types have the same layout
//! as the integers they wrap, so they can live in memory shared between
//! processes. A `--cfg loom` build swaps in `loom`'s model-checked atomics and
//! yields (they cannot live in shared memory: under loom only
//! [`Ring::new`](crate::Ring::new) exists).

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// How many times a waiter spins (with the CPU's spin-loop hint) before it
/// starts yielding its time slice to the scheduler.
#[cfg(not(loom))]
const SPINS_BEFORE_YIELD: u32 = 64;

/// One step of waiting for another thread to finish (an earlier multi-producer
/// or multi-consumer publishing its tail).
///
/// Spins a while, then yields: on a machine with fewer cores than threads, the
/// thread we wait for may be descheduled, and spinning would only delay it.
#[inline]
pub(crate) fn wait_step(spins: &mut u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if *spins < SPINS_BEFORE_YIELD {
            *spins += 1;
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
