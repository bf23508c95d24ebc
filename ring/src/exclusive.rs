//! A `Single` side used by one thread at a time, enforced in this process.
//!
//! A `Single` side runs the head/tail scheme without read-modify-writes (see
//! `headtail.rs`): two threads in it at once would both reserve the same
//! slots and copy into or out of them together, a data race, and a torn
//! element. A [`Ring`](crate::Ring) is `Sync`, so safe code can share one
//! (`Arc<Ring>`) between threads: each handle therefore keeps, per side, a
//! flag that an operation on a `Single` side sets for its duration. A second
//! thread that finds it set panics (two threads used the side at once: a bug
//! in the caller) instead of racing.
//!
//! The flag is the handle's own, not in the shared region: other processes,
//! and other handles on the same region (made with the `unsafe`
//! [`attach`](crate::Ring::attach)), stay the caller's promise, as
//! [`SyncMode::Single`](crate::SyncMode::Single) documents. The split
//! handles ([`Producer`](crate::Producer), [`Consumer`](crate::Consumer))
//! need no flag: they take `&mut self` and are not `Sync`.

use crate::sync::{AtomicBool, Ordering};

/// One side's "a thread is in it" flag, on a line (a pair of lines, for
/// the adjacent-line prefetcher) of its own: the producer's and the
/// consumer's flags are written by different threads, and sharing a line
/// with each other, or with the handle's read-only fields, would bounce it
/// between their cores on every operation (measured: ten times slower).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct SideGuard(AtomicBool);

impl SideGuard {
    /// A side no thread is in.
    pub(crate) fn new() -> SideGuard {
        SideGuard(AtomicBool::new(false))
    }

    /// Enters the side for one operation; leaving is dropping the result.
    ///
    /// # Panics
    ///
    /// When another thread is in the side (`side` names it in the message).
    #[inline(always)]
    pub(crate) fn enter(&self, side: &'static str) -> Entered<'_> {
        // Acquire: the previous thread's operation (released on leaving)
        // happens before ours.
        if self.0.swap(true, Ordering::Acquire) {
            panic!(
                "two threads used the {side} side of a ring whose {side} side is Single \
                 at the same time: give that side one thread (or a Producer/Consumer \
                 handle), or make it Multi"
            );
        }
        Entered(&self.0)
    }
}

/// A thread's stay in a side; leaves it when dropped.
pub(crate) struct Entered<'a>(&'a AtomicBool);

impl Drop for Entered<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: our operation happens before the next thread's.
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{Ring, RingMode};

    /// A thread entering a `Single` side another thread is in panics before
    /// it touches a slot (the other thread's stay is held here by hand).
    #[test]
    fn a_second_thread_in_a_single_side_panics_and_the_ring_is_untouched() {
        let ring = Ring::<u64>::new(8, RingMode::SPSC).unwrap();
        ring.enqueue(1).unwrap();
        for producer in [true, false] {
            let guard = if producer {
                &ring.prod_guard
            } else {
                &ring.cons_guard
            };
            let held = guard.enter("held");
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if producer {
                    let _ = ring.enqueue(2);
                } else {
                    let _ = ring.dequeue();
                }
            }));
            let msg = caught.expect_err("entered a side another thread is in");
            let msg = msg.downcast_ref::<String>().unwrap();
            assert!(msg.contains("two threads"), "{msg}");
            drop(held);
            assert_eq!(ring.len(), 1, "the refused operation moved an element");
        }
        // Free again: the next operations pass.
        ring.enqueue(2).unwrap();
        assert_eq!(ring.dequeue(), Some(1));
        // Multi sides need no flag.
        let mpmc = Ring::<u64>::new(8, RingMode::MPMC).unwrap();
        let _held = mpmc.prod_guard.enter("held");
        mpmc.enqueue(3).unwrap();
    }
}
