//! Model checks of the head/tail scheme with `loom`: every interleaving (up
//! to a preemption bound) of a few threads on a tiny ring, with loom's cells
//! reporting any slot a producer and a consumer touch without ordering.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p ntbdk-ring --release --test loom`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use ntbdk_ring::{Consumer, Producer, Ring, RingMode};

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

/// Enqueues `item` through a producer handle, yielding while the ring is full.
fn push_h(tx: &mut Producer<u64>, item: u64) {
    while tx.enqueue(item).is_err() {
        thread::yield_now();
    }
}

/// Dequeues one item through a consumer handle, yielding while it is empty.
fn pop_h(rx: &mut Consumer<u64>) -> u64 {
    loop {
        if let Some(v) = rx.dequeue() {
            return v;
        }
        thread::yield_now();
    }
}

#[test]
fn handles_single_elements_in_order_through_full_and_empty() {
    // Capacity 2 and three items: the producer finds the ring full (and must
    // reload the consumer tail) and the consumer finds it empty, in every
    // interleaving the bound allows.
    model(3, || {
        let (mut tx, mut rx) = Ring::<u64>::new(2, RingMode::SPSC)
            .unwrap()
            .split_spsc()
            .unwrap();
        let p = thread::spawn(move || {
            for i in 1..=3 {
                push_h(&mut tx, i);
            }
            tx
        });
        for i in 1..=3 {
            assert_eq!(pop_h(&mut rx), i);
        }
        let mut tx = p.join().unwrap();
        assert!(rx.is_empty());
        assert_eq!(tx.free_count(), 2);
    });
}

#[test]
fn handles_bursts_wrap_in_order() {
    model(3, || {
        let (mut tx, mut rx) = Ring::<u64>::new(2, RingMode::SPSC)
            .unwrap()
            .split_spsc()
            .unwrap();
        let p = thread::spawn(move || {
            let items = [1, 2, 3];
            let mut sent = 0;
            while sent < items.len() {
                let b = tx.enqueue_burst(&items[sent..]);
                assert!(b.n + b.left <= 2);
                sent += b.n;
                if b.n == 0 {
                    thread::yield_now();
                }
            }
        });
        let mut got = Vec::new();
        let mut buf = [0u64; 2];
        while got.len() < 3 {
            let b = rx.dequeue_burst(&mut buf);
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
fn handles_bulk_is_all_or_nothing_at_the_edges() {
    // A bulk of 2 on a ring of 2 fits only when the ring is empty, and a
    // bulk dequeue of 2 succeeds only when it is full: both edges exactly.
    model(3, || {
        let (mut tx, mut rx) = Ring::<u64>::new(2, RingMode::SPSC)
            .unwrap()
            .split_spsc()
            .unwrap();
        let p = thread::spawn(move || {
            for base in [10u64, 20] {
                while tx.enqueue_bulk(&[base + 1, base + 2]).is_err() {
                    thread::yield_now();
                }
            }
        });
        let mut buf = [0u64; 2];
        for base in [10u64, 20] {
            loop {
                match rx.dequeue_bulk(&mut buf) {
                    Ok(left) => {
                        assert_eq!(left, 0);
                        break;
                    }
                    Err(seen) => {
                        assert!(seen < 2);
                        thread::yield_now();
                    }
                }
            }
            assert_eq!(buf, [base + 1, base + 2]);
        }
        p.join().unwrap();
    });
}

#[test]
fn handles_take_over_a_ring_in_use() {
    // The ring's own operations run first; the handles pick up its state
    // (one element in, its tails moved) and wrap past it.
    model(3, || {
        let ring = Ring::<u64>::new(2, RingMode::SPSC).unwrap();
        ring.enqueue(1).unwrap();
        ring.enqueue(2).unwrap();
        assert_eq!(ring.dequeue(), Some(1));
        let (mut tx, mut rx) = ring.split_spsc().unwrap();
        let p = thread::spawn(move || {
            push_h(&mut tx, 3);
            push_h(&mut tx, 4);
        });
        for i in 2..=4 {
            assert_eq!(pop_h(&mut rx), i);
        }
        p.join().unwrap();
    });
}
