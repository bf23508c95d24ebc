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

use ntbdk_ring::{Burst, Consumer, Producer, Ring, RingMode};

/// Items each producer sends (a few hundred under Miri, which interprets
/// every step and checks each access for races).
const PER_PRODUCER: u64 = if cfg!(miri) { 300 } else { 1_000_000 };
/// Ring capacity: small, so the ring is often full, often empty, and wraps.
const CAPACITY: usize = 64;
/// Largest batch: bulk operations must stay at or below the capacity, or
/// they could never succeed.
const MAX_BATCH: usize = 40;
/// A run that takes longer than this is a hang, not a slow machine (nor
/// Miri's interpreter).
const DEADLINE: Duration = Duration::from_secs(if cfg!(miri) { 600 } else { 60 });

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

/// The producer operations, on a shared [`Ring`] or an owned [`Producer`].
trait Enqueue {
    fn enqueue(&mut self, item: u64) -> Result<(), u64>;
    fn enqueue_bulk(&mut self, items: &[u64]) -> Result<usize, usize>;
    fn enqueue_burst(&mut self, items: &[u64]) -> Burst;
}

/// The consumer operations, on a shared [`Ring`] or an owned [`Consumer`].
trait Dequeue {
    fn dequeue(&mut self) -> Option<u64>;
    fn dequeue_bulk(&mut self, out: &mut [u64]) -> Result<usize, usize>;
    fn dequeue_burst(&mut self, out: &mut [u64]) -> Burst;
}

impl Enqueue for &Ring<u64> {
    fn enqueue(&mut self, item: u64) -> Result<(), u64> {
        Ring::enqueue(self, item)
    }
    fn enqueue_bulk(&mut self, items: &[u64]) -> Result<usize, usize> {
        Ring::enqueue_bulk(self, items)
    }
    fn enqueue_burst(&mut self, items: &[u64]) -> Burst {
        Ring::enqueue_burst(self, items)
    }
}

impl Enqueue for Producer<u64> {
    fn enqueue(&mut self, item: u64) -> Result<(), u64> {
        Producer::enqueue(self, item)
    }
    fn enqueue_bulk(&mut self, items: &[u64]) -> Result<usize, usize> {
        Producer::enqueue_bulk(self, items)
    }
    fn enqueue_burst(&mut self, items: &[u64]) -> Burst {
        Producer::enqueue_burst(self, items)
    }
}

impl Dequeue for &Ring<u64> {
    fn dequeue(&mut self) -> Option<u64> {
        Ring::dequeue(self)
    }
    fn dequeue_bulk(&mut self, out: &mut [u64]) -> Result<usize, usize> {
        Ring::dequeue_bulk(self, out)
    }
    fn dequeue_burst(&mut self, out: &mut [u64]) -> Burst {
        Ring::dequeue_burst(self, out)
    }
}

impl Dequeue for Consumer<u64> {
    fn dequeue(&mut self) -> Option<u64> {
        Consumer::dequeue(self)
    }
    fn dequeue_bulk(&mut self, out: &mut [u64]) -> Result<usize, usize> {
        Consumer::dequeue_bulk(self, out)
    }
    fn dequeue_burst(&mut self, out: &mut [u64]) -> Burst {
        Consumer::dequeue_burst(self, out)
    }
}

fn producer(mut ring: impl Enqueue, id: u64, start: Instant, abort: &AtomicBool) {
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
    mut ring: impl Dequeue,
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

/// Which operations the threads use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// Every thread uses the `Ring`'s own operations.
    Ring,
    /// One producer and one consumer, through `split_spsc`'s handles.
    Split,
    /// The one producer through `into_producer`'s handle, the consumers
    /// through a `Ring` attached to the same region.
    ProducerHandle,
    /// The one consumer through `into_consumer`'s handle, the producers
    /// through a `Ring` attached to the same region.
    ConsumerHandle,
}

/// A `Ring::REGION_ALIGN`-aligned heap region, freed on drop.
struct Region {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the region is plain memory; the rings in it synchronise access.
unsafe impl Send for Region {}
// SAFETY: as for `Send`.
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> Region {
        let layout = std::alloc::Layout::from_size_align(len, Ring::<u64>::REGION_ALIGN).unwrap();
        // SAFETY: a non-empty layout.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null());
        Region { ptr, layout }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; every ring handle on
        // it was dropped before (declared after it, or joined threads).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Runs `producers` x `consumers` threads on one ring and checks delivery.
fn run(mode: RingMode, producers: u64, consumers: u64) {
    run_with(mode, producers, consumers, Use::Ring);
}

/// Runs `producers` x `consumers` threads on one ring, the first producer
/// and consumer using handles as `how` says, and checks delivery.
fn run_with(mode: RingMode, producers: u64, consumers: u64, how: Use) {
    let _watchdog = watchdog(
        format!("{mode:?} {how:?}"),
        DEADLINE + Duration::from_secs(10),
    );
    let len = Ring::<u64>::bytes_for(CAPACITY).unwrap();
    let region = Region::new(len);
    // SAFETY: the region is ours, aligned and `len` bytes long, and outlives
    // every handle (the threads are joined and `ring` dropped before it).
    let created = unsafe { Ring::<u64>::init_in(region.ptr, len, CAPACITY, mode) }.unwrap();
    // SAFETY: as above; the ring was just constructed there.
    let attach = || unsafe { Ring::<u64>::attach(region.ptr, len) }.unwrap();
    let (mut tx, mut rx, ring) = match how {
        Use::Ring => (None, None, created),
        Use::Split => {
            let (tx, rx) = created.split_spsc().unwrap();
            (Some(tx), Some(rx), attach())
        }
        Use::ProducerHandle => (Some(created.into_producer().unwrap()), None, attach()),
        Use::ConsumerHandle => (None, Some(created.into_consumer().unwrap()), attach()),
    };
    let ring = Arc::new(ring);
    let total = (producers * PER_PRODUCER) as usize;
    let taken = Arc::new(AtomicUsize::new(0));
    let abort = Arc::new(AtomicBool::new(false));
    let start = Instant::now();

    let prods: Vec<_> = (0..producers)
        .map(|id| {
            let (ring, abort) = (ring.clone(), abort.clone());
            let handle = tx.take();
            thread::spawn(move || match handle {
                Some(h) => producer(h, id, start, &abort),
                None => producer(&*ring, id, start, &abort),
            })
        })
        .collect();
    let cons: Vec<_> = (0..consumers)
        .map(|id| {
            let (ring, taken, abort) = (ring.clone(), taken.clone(), abort.clone());
            let handle = rx.take();
            thread::spawn(move || match handle {
                Some(h) => consumer(h, id, total, &taken, start, &abort),
                None => consumer(&*ring, id, total, &taken, start, &abort),
            })
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

#[test]
fn spsc_handles_one_by_one() {
    run_with(RingMode::SPSC, 1, 1, Use::Split);
}

#[test]
fn producer_handle_on_spmc_one_by_three() {
    run_with(RingMode::SPMC, 1, 3, Use::ProducerHandle);
}

#[test]
fn consumer_handle_on_mpsc_three_by_one() {
    run_with(RingMode::MPSC, 3, 1, Use::ConsumerHandle);
}

#[test]
fn multi_sides_refuse_handles() {
    for mode in [RingMode::MPMC, RingMode::MPSC, RingMode::SPMC] {
        let err = Ring::<u64>::new(8, mode).unwrap().split_spsc().unwrap_err();
        assert!(
            matches!(err, ntbdk_ring::RingError::SideNotSingle { .. }),
            "{err}"
        );
    }
    assert!(
        Ring::<u64>::new(8, RingMode::MPSC)
            .unwrap()
            .into_producer()
            .is_err()
    );
    assert!(
        Ring::<u64>::new(8, RingMode::SPMC)
            .unwrap()
            .into_consumer()
            .is_err()
    );
}
