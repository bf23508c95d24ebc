//! Model checks of the head/tail scheme with `loom`: every interleaving (up
//! to a preemption bound) of a few threads on a tiny ring, with loom's cells
//! reporting any slot a producer and a consumer touch without ordering.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p ntbdk-ring --release --test loom`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use ntbdk_ring::{Ring, RingMode};

/// A loom model builder with a preemption bound that keeps each model to a
/// few seconds.
fn model<F: Fn() + Sync + Send + 'static>(bound: usize, f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.max_branches = 100_000;
    b.check(f);
}

/// Enqueues `item`, yielding to the model while the ring is full.
fn push(ring: &Ring<u64>, item: u64) {
    while ring.enqueue(item).is_err() {
        thread::yield_now();
    }
}

/// Dequeues one item, yielding to the model while the ring is empty.
fn pop(ring: &Ring<u64>) -> u64 {
    loop {
        if let Some(v) = ring.dequeue() {
            return v;
        }
        thread::yield_now();
    }
}

#[test]
fn spsc_single_elements_in_order() {
    model(3, || {
        let ring = Arc::new(Ring::<u64>::new(2, RingMode::SPSC).unwrap());
        let p = {
            let ring = ring.clone();
            thread::spawn(move || {
                for i in 1..=3 {
                    push(&ring, i);
                }
            })
        };
        for i in 1..=3 {
            assert_eq!(pop(&ring), i);
        }
        p.join().unwrap();
        assert!(ring.is_empty());
    });
}

#[test]
fn spsc_bursts_wrap_in_order() {
    model(3, || {
        let ring = Arc::new(Ring::<u64>::new(2, RingMode::SPSC).unwrap());
        let p = {
            let ring = ring.clone();
            thread::spawn(move || {
                let items = [1, 2, 3];
                let mut sent = 0;
                while sent < items.len() {
                    let b = ring.enqueue_burst(&items[sent..]);
                    sent += b.n;
                    if b.n == 0 {
                        thread::yield_now();
                    }
                }
            })
        };
        let mut got = Vec::new();
        let mut buf = [0u64; 2];
        while got.len() < 3 {
            let b = ring.dequeue_burst(&mut buf);
            got.extend_from_slice(&buf[..b.n]);
            if b.n == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(got, [1, 2, 3]);
        p.join().unwrap();
    });
}

#[test]
fn mpmc_two_producers_one_consumer() {
    model(2, || {
        let ring = Arc::new(Ring::<u64>::new(4, RingMode::MPMC).unwrap());
        let producers: Vec<_> = [(10u64, 2u64), (20, 1)]
            .into_iter()
            .map(|(base, count)| {
                let ring = ring.clone();
                thread::spawn(move || {
                    for i in 1..=count {
                        push(&ring, base + i);
                    }
                })
            })
            .collect();
        // Two tries while the producers run (a spinning consumer would make
        // the model explode), then drain what is left after they finish.
        let mut got: Vec<u64> = (0..2).filter_map(|_| ring.dequeue()).collect();
        for p in producers {
            p.join().unwrap();
        }
        while let Some(v) = ring.dequeue() {
            got.push(v);
        }
        // FIFO per producer...
        let first: Vec<u64> = got.iter().copied().filter(|v| v / 10 == 1).collect();
        assert_eq!(first, [11, 12]);
        // ...and every item exactly once.
        got.sort_unstable();
        assert_eq!(got, [11, 12, 21]);
        assert!(ring.is_empty());
    });
}

#[test]
fn mpmc_one_producer_two_consumers() {
    model(2, || {
        let ring = Arc::new(Ring::<u64>::new(2, RingMode::MPMC).unwrap());
        let consumer = {
            let ring = ring.clone();
            thread::spawn(move || [pop(&ring), pop(&ring)])
        };
        for i in 1..=3 {
            push(&ring, i);
        }
        let mine = pop(&ring);
        let theirs = consumer.join().unwrap();
        assert!(
            theirs[0] < theirs[1],
            "consumer saw {theirs:?} out of order"
        );
        let mut all = vec![mine, theirs[0], theirs[1]];
        all.sort_unstable();
        assert_eq!(all, [1, 2, 3]);
    });
}

#[test]
fn mpmc_bulk_producers_race_for_space() {
    model(1, || {
        let ring = Arc::new(Ring::<u64>::new(2, RingMode::MPMC).unwrap());
        let producers: Vec<_> = [0u64, 10]
            .into_iter()
            .map(|base| {
                let ring = ring.clone();
                thread::spawn(move || {
                    while ring.enqueue_bulk(&[base + 1, base + 2]).is_err() {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        let mut got = Vec::new();
        let mut buf = [0u64; 2];
        while got.len() < 4 {
            // Only one batch fits at a time, and bulk operations are all or
            // nothing: each dequeue gets one producer's whole batch.
            match ring.dequeue_bulk(&mut buf) {
                Ok(_) => got.extend_from_slice(&buf),
                Err(_) => thread::yield_now(),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(
            got == [1, 2, 11, 12] || got == [11, 12, 1, 2],
            "got {got:?}"
        );
    });
}
