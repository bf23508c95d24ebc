//! A `Single` side used by one thread at a time, enforced per `Ring` handle.
//!
//! A `Single` side runs the head/tail scheme without read-modify-writes (see
//! `headtail.rs`): two threads in it at once would both reserve the same
//! slots and copy into or out of them together, a data race, and a torn
//! element. A [`Ring`](crate::Ring) is `Sync`, so safe code can share one
//! (`Arc<Ring>`) between threads: each handle therefore records, per side,
//! the thread that uses it. The first operation on a `Single` side claims it
//! for its thread (one compare-and-swap); later operations of that thread
//! only compare (no atomic read-modify-write, so no wait for the thread's
//! earlier stores: a lock per operation measured two to four times slower);
//! another thread panics (two threads used the side: a bug in the caller)
//! instead of racing. A thread hands the side over with
//! [`Ring::release_producer`](crate::Ring::release_producer) /
//! [`release_consumer`](crate::Ring::release_consumer); the next thread to
//! use it claims it. A join alone does not hand it over: a side stays held
//! by a thread that ended (or panicked) without releasing it, until someone
//! with `&mut` to the handle (after moving it, or `Arc::get_mut`) calls
//! [`Ring::release_sides`](crate::Ring::release_sides).
//!
//! The record is the handle's own, not in the shared region: other
//! processes, and other handles on the same region (made with the `unsafe`
//! [`attach`](crate::Ring::attach)), stay the caller's promise, as
//! [`SyncMode::Single`](crate::SyncMode::Single) documents. The split
//! handles ([`Producer`](crate::Producer), [`Consumer`](crate::Consumer))
//! need no record: they take `&mut self` and are not `Sync`.
//!
//! Under `--cfg loom` the record is not kept (the models check the ring's
//! algorithm with correct use; loom threads share one OS thread's
//! thread-locals).

#[cfg(not(loom))]
use core::sync::atomic::{AtomicUsize, Ordering};

/// The thread that uses one side (0: none yet), on a line of its own (a
/// pair, for the adjacent-line prefetcher): it is written when a thread
/// claims or releases the side, never by every operation.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct SideGuard {
    #[cfg(not(loom))]
    owner: AtomicUsize,
}

/// This thread's token: a number no other thread of the process ever gets
/// (drawn from a counter on the thread's first use of any ring).
#[cfg(not(loom))]
#[inline(always)]
fn thread_token() -> usize {
    use core::cell::Cell;
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    std::thread_local! {
        static TOKEN: Cell<usize> = const { Cell::new(0) };
    }
    TOKEN.with(|t| match t.get() {
        0 => {
            // Never wraps (a reused token could pass for another thread's),
            // even where `usize` is 32 bits.
            let v = NEXT
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
                .expect("more threads than ring thread tokens");
            t.set(v);
            v
        }
        v => v,
    })
}

impl SideGuard {
    /// A side no thread has used.
    pub(crate) fn new() -> SideGuard {
        SideGuard {
            #[cfg(not(loom))]
            owner: AtomicUsize::new(0),
        }
    }

    /// Checks that this thread may use the side, claiming it if no thread
    /// holds it.
    ///
    /// # Panics
    ///
    /// When another thread holds it (`side` names it in the message).
    #[inline(always)]
    pub(crate) fn enter(&self, side: &'static str) {
        #[cfg(not(loom))]
        {
            let me = thread_token();
            // Relaxed: equal only if this very thread stored it.
            if self.owner.load(Ordering::Relaxed) != me {
                self.claim(me, side);
            }
        }
        #[cfg(loom)]
        let _ = side;
    }

    /// Claims the side for `me`, or panics if another thread holds it.
    #[cfg(not(loom))]
    #[cold]
    #[inline(never)]
    fn claim(&self, me: usize, side: &'static str) {
        // Acquire: the previous holder's operations, before its release,
        // happen before ours.
        if let Err(holder) =
            self.owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            // `holder` is not `me`: only this thread stores its token.
            panic!(
                "two threads used the {side} side of a ring whose {side} side is Single \
                 (thread token {holder} holds it, this is {me}): keep one thread on it, hand it \
                 over with release_{side}() from the thread that used it, use a \
                 Producer/Consumer handle, or make the side Multi"
            );
        }
    }

    /// Forgets the holder: `&mut` proves no other thread uses the handle,
    /// and whatever gave us `&mut` (a move, `Arc::get_mut`) ordered their
    /// operations before ours.
    pub(crate) fn forget(&mut self) {
        #[cfg(not(loom))]
        {
            *self.owner.get_mut() = 0;
        }
    }

    /// Gives the side up, if this thread holds it: the next thread to use it
    /// claims it.
    pub(crate) fn release(&self) {
        #[cfg(not(loom))]
        if self.owner.load(Ordering::Relaxed) == thread_token() {
            // Release: our operations happen before the next holder's.
            self.owner.store(0, Ordering::Release);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use crate::{Ring, RingMode};

    /// A second thread on a `Single` side panics before it touches a slot;
    /// after a release, another thread may take the side over.
    #[test]
    fn a_second_thread_on_a_single_side_panics_until_the_side_is_released() {
        let ring = Arc::new(Ring::<u64>::new(8, RingMode::SPSC).unwrap());
        ring.enqueue(1).unwrap();
        assert_eq!(ring.dequeue(), Some(1));
        ring.enqueue(2).unwrap();
        for producer in [true, false] {
            let r = ring.clone();
            let caught = std::thread::spawn(move || {
                if producer {
                    let _ = r.enqueue(3);
                } else {
                    let _ = r.dequeue();
                }
            })
            .join()
            .expect_err("another thread used a side this thread holds");
            let msg = caught.downcast_ref::<String>().unwrap();
            assert!(msg.contains("two threads"), "{msg}");
            assert_eq!(ring.len(), 1, "the refused operation moved an element");
        }
        // Handed over: the other thread takes both sides.
        ring.release_producer();
        ring.release_consumer();
        let r = ring.clone();
        std::thread::spawn(move || {
            r.enqueue(3).unwrap();
            assert_eq!(r.dequeue(), Some(2));
        })
        .join()
        .unwrap();
        // That thread still holds them (it ended without releasing).
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ring.dequeue()));
        assert!(again.is_err());
        // With `&mut` back, the holders are forgotten.
        let mut ring = Arc::try_unwrap(ring).unwrap();
        ring.release_sides();
        assert_eq!(ring.dequeue(), Some(3));
        ring.enqueue(4).unwrap();
        // Multi sides are not recorded.
        let mpmc = Arc::new(Ring::<u64>::new(8, RingMode::MPMC).unwrap());
        mpmc.enqueue(1).unwrap();
        let m = mpmc.clone();
        std::thread::spawn(move || m.enqueue(2).unwrap())
            .join()
            .unwrap();
        assert_eq!(mpmc.len(), 2);
    }
}
