//! Property tests: random single-threaded sequences of operations on a ring
//! and on a `VecDeque` model, checking every return value, the free and
//! remaining counts included, and the contents moved.
#![cfg(not(loom))] // loom builds run only tests/loom.rs

use std::collections::VecDeque;

use ntbdk_ring::{Burst, Consumer, Producer, Ring, RingMode};
use proptest::prelude::*;

/// Random sequences per property: fewer under Miri, which interprets every
/// step.
const CASES: u32 = if cfg!(miri) { 4 } else { 1024 };

#[derive(Clone, Debug)]
enum Op {
    Enqueue,
    Dequeue,
    EnqueueBulk(usize),
    EnqueueBurst(usize),
    DequeueBulk(usize),
    DequeueBurst(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // Sizes up to 20 exceed the largest capacity tested (16).
    prop_oneof![
        Just(Op::Enqueue),
        Just(Op::Dequeue),
        (0usize..=20).prop_map(Op::EnqueueBulk),
        (0usize..=20).prop_map(Op::EnqueueBurst),
        (0usize..=20).prop_map(Op::DequeueBulk),
        (0usize..=20).prop_map(Op::DequeueBurst),
    ]
}

fn mode() -> impl Strategy<Value = RingMode> {
    prop_oneof![
        Just(RingMode::SPSC),
        Just(RingMode::MPSC),
        Just(RingMode::SPMC),
        Just(RingMode::MPMC),
    ]
}

/// The model: a `VecDeque` plus the two cached tails the ring keeps, so that
/// the free/remaining counts it reports can be predicted exactly.
///
/// Each side counts from its cached copy of the other side's tail and reads
/// the real tail only when the cache shows fewer slots than asked for, so a
/// reported count is exact at a refresh and a lower bound otherwise.
struct Model {
    cap: usize,
    items: VecDeque<u64>,
    /// Elements enqueued and dequeued so far (the producer and consumer tails).
    enqueued: usize,
    dequeued: usize,
    /// The producers' cached consumer tail and the consumers' cached producer tail.
    prod_cache: usize,
    cons_cache: usize,
}

impl Model {
    /// Free slots the producer side sees when asked for `want`.
    fn free_seen(&mut self, want: usize) -> usize {
        if self.cap + self.prod_cache - self.enqueued < want {
            self.prod_cache = self.dequeued;
        }
        self.cap + self.prod_cache - self.enqueued
    }

    /// Elements the consumer side sees when asked for `want`.
    fn held_seen(&mut self, want: usize) -> usize {
        if self.cons_cache - self.dequeued < want {
            self.cons_cache = self.enqueued;
        }
        self.cons_cache - self.dequeued
    }

    fn push(&mut self, items: &[u64]) {
        self.items.extend(items);
        self.enqueued += items.len();
    }

    fn pop(&mut self, n: usize) -> Vec<u64> {
        self.dequeued += n;
        self.items.drain(..n).collect()
    }
}

/// An SPSC ring used through its own operations until `split`, then through
/// its split handles.
enum Target {
    Ring(Ring<u64>),
    Handles(Producer<u64>, Consumer<u64>),
}

impl Target {
    fn split(&mut self) {
        if let Target::Ring(_) = self {
            let Target::Ring(ring) =
                std::mem::replace(self, Target::Ring(Ring::new(1, RingMode::SPSC).unwrap()))
            else {
                unreachable!()
            };
            let (tx, rx) = ring.split_spsc().unwrap();
            *self = Target::Handles(tx, rx);
        }
    }
    fn enqueue(&mut self, v: u64) -> Result<(), u64> {
        match self {
            Target::Ring(r) => r.enqueue(v),
            Target::Handles(tx, _) => tx.enqueue(v),
        }
    }
    fn dequeue(&mut self) -> Option<u64> {
        match self {
            Target::Ring(r) => r.dequeue(),
            Target::Handles(_, rx) => rx.dequeue(),
        }
    }
    fn enqueue_bulk(&mut self, items: &[u64]) -> Result<usize, usize> {
        match self {
            Target::Ring(r) => r.enqueue_bulk(items),
            Target::Handles(tx, _) => tx.enqueue_bulk(items),
        }
    }
    fn enqueue_burst(&mut self, items: &[u64]) -> Burst {
        match self {
            Target::Ring(r) => r.enqueue_burst(items),
            Target::Handles(tx, _) => tx.enqueue_burst(items),
        }
    }
    fn dequeue_bulk(&mut self, out: &mut [u64]) -> Result<usize, usize> {
        match self {
            Target::Ring(r) => r.dequeue_bulk(out),
            Target::Handles(_, rx) => rx.dequeue_bulk(out),
        }
    }
    fn dequeue_burst(&mut self, out: &mut [u64]) -> Burst {
        match self {
            Target::Ring(r) => r.dequeue_burst(out),
            Target::Handles(_, rx) => rx.dequeue_burst(out),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// The split handles report exactly what the ring would: same cached
    /// views (each handle starts from the real tails), same results.
    #[test]
    fn handles_match_vecdeque(
        cap_log2 in 0u32..=4,
        split_at in 0usize..50,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let cap = 1usize << cap_log2;
        let mut t = Target::Ring(Ring::<u64>::new(cap, RingMode::SPSC).unwrap());
        let mut model = Model {
            cap,
            items: VecDeque::new(),
            enqueued: 0,
            dequeued: 0,
            prod_cache: 0,
            cons_cache: 0,
        };
        let mut next = 0u64;
        for (i, op) in ops.into_iter().enumerate() {
            if i == split_at {
                t.split();
                // The handles load both real tails.
                model.prod_cache = model.dequeued;
                model.cons_cache = model.enqueued;
            }
            match op {
                Op::Enqueue => {
                    let v = next;
                    next += 1;
                    if model.free_seen(1) >= 1 {
                        prop_assert_eq!(t.enqueue(v), Ok(()));
                        model.push(&[v]);
                    } else {
                        prop_assert_eq!(t.enqueue(v), Err(v));
                    }
                }
                Op::Dequeue => {
                    let expect = if model.held_seen(1) >= 1 { model.pop(1).pop() } else { None };
                    prop_assert_eq!(t.dequeue(), expect);
                }
                Op::EnqueueBulk(n) | Op::EnqueueBurst(n) => {
                    let items: Vec<u64> = (next..next + n as u64).collect();
                    next += n as u64;
                    let free = model.free_seen(n);
                    if let Op::EnqueueBulk(_) = op {
                        if n <= free {
                            prop_assert_eq!(t.enqueue_bulk(&items), Ok(free - n));
                            model.push(&items);
                        } else {
                            prop_assert_eq!(t.enqueue_bulk(&items), Err(free));
                        }
                    } else {
                        let moved = n.min(free);
                        prop_assert_eq!(t.enqueue_burst(&items), Burst { n: moved, left: free - moved });
                        model.push(&items[..moved]);
                    }
                }
                Op::DequeueBulk(n) => {
                    let mut out = vec![u64::MAX; n];
                    let held = model.held_seen(n);
                    if n <= held {
                        prop_assert_eq!(t.dequeue_bulk(&mut out), Ok(held - n));
                        prop_assert_eq!(out, model.pop(n));
                    } else {
                        prop_assert_eq!(t.dequeue_bulk(&mut out), Err(held));
                        prop_assert!(out.iter().all(|&v| v == u64::MAX), "refused bulk wrote");
                    }
                }
                Op::DequeueBurst(n) => {
                    let mut out = vec![u64::MAX; n];
                    let held = model.held_seen(n);
                    let moved = n.min(held);
                    prop_assert_eq!(t.dequeue_burst(&mut out), Burst { n: moved, left: held - moved });
                    prop_assert_eq!(&out[..moved], &model.pop(moved)[..]);
                    prop_assert!(out[moved..].iter().all(|&v| v == u64::MAX), "burst wrote past n");
                }
            }
            let len = model.items.len();
            match &mut t {
                Target::Ring(r) => {
                    prop_assert_eq!(r.len(), len);
                    prop_assert_eq!(r.free_count(), cap - len);
                }
                // Not after every operation: these reload the other side's
                // tail, refreshing the cached views, which would then never
                // be stale.
                Target::Handles(tx, rx) if i % 4 == 3 => {
                    prop_assert_eq!(rx.len(), len);
                    prop_assert_eq!(tx.free_count(), cap - len);
                    prop_assert_eq!(rx.is_empty(), len == 0);
                    prop_assert_eq!(tx.is_full(), len == cap);
                    model.prod_cache = model.dequeued;
                    model.cons_cache = model.enqueued;
                }
                Target::Handles(..) => {}
            }
        }
    }

    #[test]
    fn ring_matches_vecdeque(
        mode in mode(),
        cap_log2 in 0u32..=4,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let cap = 1usize << cap_log2;
        let ring = Ring::<u64>::new(cap, mode).unwrap();
        let mut model = Model {
            cap,
            items: VecDeque::new(),
            enqueued: 0,
            dequeued: 0,
            prod_cache: 0,
            cons_cache: 0,
        };
        let mut next = 0u64;
        let mut fresh = |n: usize| -> Vec<u64> {
            let v: Vec<u64> = (next..next + n as u64).collect();
            next += n as u64;
            v
        };

        for op in ops {
            match op {
                Op::Enqueue => {
                    let v = fresh(1)[0];
                    if model.free_seen(1) >= 1 {
                        prop_assert_eq!(ring.enqueue(v), Ok(()));
                        model.push(&[v]);
                    } else {
                        prop_assert_eq!(ring.enqueue(v), Err(v));
                    }
                }
                Op::Dequeue => {
                    let expect = if model.held_seen(1) >= 1 { model.pop(1).pop() } else { None };
                    prop_assert_eq!(ring.dequeue(), expect);
                }
                Op::EnqueueBulk(n) => {
                    let items = fresh(n);
                    let free = model.free_seen(n);
                    if n <= free {
                        prop_assert_eq!(ring.enqueue_bulk(&items), Ok(free - n));
                        model.push(&items);
                    } else {
                        prop_assert_eq!(ring.enqueue_bulk(&items), Err(free));
                    }
                }
                Op::EnqueueBurst(n) => {
                    let items = fresh(n);
                    let free = model.free_seen(n);
                    let moved = n.min(free);
                    let expect = Burst { n: moved, left: free - moved };
                    prop_assert_eq!(ring.enqueue_burst(&items), expect);
                    model.push(&items[..moved]);
                }
                Op::DequeueBulk(n) => {
                    let mut out = vec![u64::MAX; n];
                    let held = model.held_seen(n);
                    if n <= held {
                        prop_assert_eq!(ring.dequeue_bulk(&mut out), Ok(held - n));
                        prop_assert_eq!(out, model.pop(n));
                    } else {
                        prop_assert_eq!(ring.dequeue_bulk(&mut out), Err(held));
                        prop_assert!(out.iter().all(|&v| v == u64::MAX), "refused bulk wrote");
                    }
                }
                Op::DequeueBurst(n) => {
                    let mut out = vec![u64::MAX; n];
                    let held = model.held_seen(n);
                    let moved = n.min(held);
                    let expect = Burst { n: moved, left: held - moved };
                    prop_assert_eq!(ring.dequeue_burst(&mut out), expect);
                    prop_assert_eq!(&out[..moved], &model.pop(moved)[..]);
                    prop_assert!(out[moved..].iter().all(|&v| v == u64::MAX), "burst wrote past n");
                }
            }
            // The queries read both real tails: always exact.
            let len = model.items.len();
            prop_assert_eq!(ring.len(), len);
            prop_assert_eq!(ring.free_count(), cap - len);
            prop_assert_eq!(ring.is_empty(), len == 0);
            prop_assert_eq!(ring.is_full(), len == cap);
        }
    }

    /// Elements wider than a word (a small `#[repr(C)]` descriptor) keep
    /// every byte through wrap-around copies.
    #[test]
    fn descriptors_survive_wrapping_bursts(
        sizes in prop::collection::vec(1usize..=12, 1..60),
    ) {
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        struct Desc {
            offset: u64,
            len: u32,
            flags: u16,
            tag: u8,
            pad: u8,
        }
        let desc = |i: u64| Desc {
            offset: i.wrapping_mul(4096),
            len: i as u32 ^ 0xA5A5,
            flags: i as u16,
            tag: i as u8,
            pad: 0,
        };
        let ring = Ring::<Desc>::new(8, RingMode::SPSC).unwrap();
        let (mut sent, mut recv) = (0u64, 0u64);
        for n in sizes {
            let batch: Vec<Desc> = (sent..sent + n as u64).map(desc).collect();
            sent += ring.enqueue_burst(&batch).n as u64;
            let mut out = vec![desc(u64::MAX); n / 2 + 1];
            let got = ring.dequeue_burst(&mut out).n;
            for d in &out[..got] {
                prop_assert_eq!(*d, desc(recv));
                recv += 1;
            }
        }
        prop_assert_eq!(ring.len() as u64, sent - recv);
    }
}

/// A zeroed, `Ring::REGION_ALIGN`-aligned region of a ring of `capacity`
/// `u64`s, freed on drop: for handles made with `init_in` and `attach`.
struct Region(*mut u8, std::alloc::Layout);

impl Region {
    fn new(capacity: usize) -> Region {
        let len = Ring::<u64>::bytes_for(capacity).unwrap();
        let layout = std::alloc::Layout::from_size_align(len, Ring::<u64>::REGION_ALIGN).unwrap();
        // SAFETY: a non-zero-sized layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Region(ptr, layout)
    }

    fn init(&self, capacity: usize) -> Ring<u64> {
        // SAFETY: the region is ours, aligned, `bytes_for(capacity)` long.
        unsafe { Ring::init_in(self.0, self.1.size(), capacity, RingMode::SPSC) }.unwrap()
    }

    fn attach(&self) -> Ring<u64> {
        // SAFETY: a ring `init` made; only ring handles touch the region.
        unsafe { Ring::attach(self.0, self.1.size()) }.unwrap()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the handles are gone.
        unsafe { std::alloc::dealloc(self.0, self.1) };
    }
}

/// A side run through a handle, then through a `Ring` attached after the
/// handle is dropped: the header's cached copy of the other side's tail,
/// which the handle left behind, is no licence to take more than the ring
/// holds (a consumer reading slots never written) or to overwrite what it
/// holds (a producer).
#[test]
fn a_ring_after_a_handle_on_the_same_side_counts_from_the_real_tail() {
    let region = Region::new(16);
    // Consumer side: 12 in, 10 out through a handle, then a `Ring`.
    let producer = region.init(16);
    for v in 0..12 {
        producer.enqueue(v).unwrap();
    }
    let mut consumer = region.attach().into_consumer().unwrap();
    for v in 0..10 {
        assert_eq!(consumer.dequeue(), Some(v));
    }
    drop(consumer);
    let after = region.attach();
    let mut out = [0u64; 16];
    assert_eq!(after.dequeue_burst(&mut out).n, 2, "{out:?}");
    assert_eq!(out[..2], [10, 11]);
    assert_eq!(after.dequeue(), None);
    drop((producer, after));

    // Producer side: a handle fills 16 of 16 after the consumer took 2 of
    // the first 4, then a `Ring` finds no room.
    let region = Region::new(4);
    let consumer = region.init(4);
    let mut handle = region.attach().into_producer().unwrap();
    for v in 0..4 {
        handle.enqueue(v).unwrap();
    }
    assert_eq!(consumer.dequeue(), Some(0));
    assert_eq!(consumer.dequeue(), Some(1));
    for v in 4..6 {
        handle.enqueue(v).unwrap();
    }
    drop(handle);
    let after = region.attach();
    assert_eq!(after.enqueue(99), Err(99), "a full ring took an element");
    assert_eq!(after.enqueue_burst(&[99; 4]).n, 0);
    for v in 2..6 {
        assert_eq!(consumer.dequeue(), Some(v));
    }
    assert_eq!(consumer.dequeue(), None);
}
