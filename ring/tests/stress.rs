//! Multi-thread stress: N producers x M consumers on a small ring, for every
//! mode, mixing single-element, bulk and burst operations. Every item carries
//! its producer id and sequence number; the test checks that each item is
//! delivered exactly once and that every consumer sees each producer's items
//! in order.
#![cfg(not(loom))] // loom builds run only tests/loom.rs

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use ntbdk_ring::{Ring, RingMode};

/// Items each producer sends.
const PER_PRODUCER: u64 = 1_000_000;
/// Ring capacity: small, so the ring is often full, often empty, and wraps.
const CAPACITY: usize = 64;
/// Largest batch: bulk operations must stay at or below the capacity, or
/// they could never succeed.
const MAX_BATCH: usize = 40;
/// A run that takes longer than this is a hang, not a slow machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// Item `seq` of producer `id`.
fn item(id: u64, seq: u64) -> u64 {
    (id << 48) | seq
}

/// A tiny deterministic generator for batch sizes and operation kinds.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A batch size in `1..=MAX_BATCH`, and which operation to use:
    /// 0 single, 1 bulk, 2 burst.
    fn op(&mut self) -> (usize, u64) {
        let r = self.next();
        let kind = r % 3;
        let n = if kind == 0 {
            1
        } else {
            1 + (r >> 8) as usize % MAX_BATCH
        };
        (n, kind)
    }
}

/// Waits a little when an operation made no progress; panics past the
/// deadline or when another thread failed.
fn idle(spins: &mut u32, start: Instant, abort: &AtomicBool) {
    *spins += 1;
    if spins.is_multiple_of(64) {
        thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
    if spins.is_multiple_of(4096) && (abort.load(Ordering::Relaxed) || start.elapsed() > DEADLINE) {
        abort.store(true, Ordering::Relaxed);
        panic!("no progress before the deadline (or another thread failed)");
    }
}

fn producer(ring: &Ring<u64>, id: u64, start: Instant, abort: &AtomicBool) {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (id + 1));
    let mut seq = 0;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut spins = 0;
    while seq < PER_PRODUCER {
        let (n, kind) = rng.op();
        let n = n.min((PER_PRODUCER - seq) as usize);
        batch.clear();
        batch.extend((seq..seq + n as u64).map(|s| item(id, s)));
        let sent = match kind {
            0 => usize::from(ring.enqueue(batch[0]).is_ok()),
            1 => match ring.enqueue_bulk(&batch) {
                Ok(left) => {
                    assert!(left <= CAPACITY - n);
                    n
                }
                Err(seen) => {
                    assert!(seen < n, "bulk of {n} refused with {seen} free");
                    0
                }
            },
            _ => {
                let b = ring.enqueue_burst(&batch);
                assert!(b.n <= n && b.left <= CAPACITY - b.n);
                b.n
            }
        };
        seq += sent as u64;
        if sent == 0 {
            idle(&mut spins, start, abort);
        }
    }
}

fn consumer(
    ring: &Ring<u64>,
    id: u64,
    total: usize,
    taken: &AtomicUsize,
    start: Instant,
    abort: &AtomicBool,
) -> Vec<u64> {
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03 ^ (id + 1));
    let mut got = Vec::new();
    let mut buf = [0u64; MAX_BATCH];
    let mut spins = 0;
    while taken.load(Ordering::Relaxed) < total {
        let (n, kind) = rng.op();
        let out = &mut buf[..n];
        let recv = match kind {
            0 => match ring.dequeue() {
                Some(v) => {
                    out[0] = v;
                    1
                }
                None => 0,
            },
            1 => match ring.dequeue_bulk(out) {
                Ok(left) => {
                    assert!(left <= CAPACITY - n);
                    n
                }
                Err(seen) => {
                    assert!(seen < n, "bulk of {n} refused with {seen} available");
                    0
                }
            },
            _ => {
                let b = ring.dequeue_burst(out);
                assert!(b.n <= n && b.left <= CAPACITY - b.n);
                b.n
            }
        };
        got.extend_from_slice(&out[..recv]);
        taken.fetch_add(recv, Ordering::Relaxed);
        if recv == 0 {
            idle(&mut spins, start, abort);
        }
    }
    got
}

/// Kills the whole test process if the returned guard is not dropped within
/// `limit`: a thread stuck inside the ring (say, waiting for a tail that never
/// comes) cannot be interrupted, and a hung test must fail, not hang.
fn watchdog(what: String, limit: Duration) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            eprintln!("{what}: still running after {limit:?}, aborting the test process");
            std::process::abort();
        }
    });
    tx
}

/// Runs `producers` x `consumers` threads on one ring and checks delivery.
fn run(mode: RingMode, producers: u64, consumers: u64) {
    let _watchdog = watchdog(format!("{mode:?}"), DEADLINE + Duration::from_secs(10));
    let ring = Arc::new(Ring::<u64>::new(CAPACITY, mode).unwrap());
    let total = (producers * PER_PRODUCER) as usize;
    let taken = Arc::new(AtomicUsize::new(0));
    let abort = Arc::new(AtomicBool::new(false));
    let start = Instant::now();

    let prods: Vec<_> = (0..producers)
        .map(|id| {
            let (ring, abort) = (ring.clone(), abort.clone());
            thread::spawn(move || producer(&ring, id, start, &abort))
        })
        .collect();
    let cons: Vec<_> = (0..consumers)
        .map(|id| {
            let (ring, taken, abort) = (ring.clone(), taken.clone(), abort.clone());
            thread::spawn(move || consumer(&ring, id, total, &taken, start, &abort))
        })
        .collect();

    let mut failed = false;
    for p in prods {
        failed |= p.join().is_err();
    }
    let mut seen: Vec<Vec<u64>> = Vec::new();
    for c in cons {
        match c.join() {
            Ok(v) => seen.push(v),
            Err(_) => failed = true,
        }
    }
    assert!(!failed, "{mode:?}: a thread panicked");

    // Each consumer saw each producer's items in increasing order.
    for (c, items) in seen.iter().enumerate() {
        let mut last = vec![None::<u64>; producers as usize];
        for &v in items {
            let (p, s) = ((v >> 48) as usize, v & 0xFFFF_FFFF_FFFF);
            assert!(p < producers as usize, "{mode:?}: bogus item {v:#x}");
            if let Some(prev) = last[p] {
                assert!(
                    s > prev,
                    "{mode:?}: consumer {c} got {s} after {prev} from {p}"
                );
            }
            last[p] = Some(s);
        }
    }
    // Every item exactly once.
    let mut delivered = vec![vec![false; PER_PRODUCER as usize]; producers as usize];
    let mut count = 0;
    for &v in seen.iter().flatten() {
        let (p, s) = ((v >> 48) as usize, (v & 0xFFFF_FFFF_FFFF) as usize);
        assert!(
            !delivered[p][s],
            "{mode:?}: item {s} of {p} delivered twice"
        );
        delivered[p][s] = true;
        count += 1;
    }
    assert_eq!(count, total, "{mode:?}: items lost");
    assert!(ring.is_empty());
}

#[test]
fn spsc_one_by_one() {
    run(RingMode::SPSC, 1, 1);
}

#[test]
fn mpsc_three_by_one() {
    run(RingMode::MPSC, 3, 1);
}

#[test]
fn spmc_one_by_three() {
    run(RingMode::SPMC, 1, 3);
}

#[test]
fn mpmc_three_by_three() {
    run(RingMode::MPMC, 3, 3);
}

#[test]
fn mpmc_used_as_spsc() {
    run(RingMode::MPMC, 1, 1);
}
