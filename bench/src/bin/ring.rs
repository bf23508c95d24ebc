//! Ring benchmark: ntbdk-ring against `crossbeam_queue::ArrayQueue` and
//! `rtrb`, one producer thread and one consumer thread pinned to two
//! different cores, every case in the same run.
//!
//! ```text
//! cargo run --release -p ntbdk-bench --bin ring -- [--items N] [--reps N] [--capacity N]
//! ```
//!
//! Each case moves the same number of `u64` items (a counter, checked in order
//! by the consumer) through a queue of the same capacity; each case runs
//! `--reps` times, the repetitions interleaved across cases, and the median
//! is kept (with the range over the repetitions). It prints Mops/s, then the
//! ratios ntbdk/peer against the floors set for the ring and for its split
//! handles, then a sustained figure: the split handles
//! and rtrb, single and chunk 32, each moving enough items for a continuous
//! run of at least `--sustain-secs`, interleaved.
//!
//! Each floor's ratio is also given paired: the median over the repetitions
//! of the ratio within each one, with its range. Beside the floors, a
//! control: `rtrb push/pop` runs twice more under two names (`control A`,
//! `control B`), and their paired ratio, the same code on both sides, shows
//! how far the run's noise moves a ratio of 1.0 (it runs whenever `rtrb
//! push/pop` does; its two cases always run side by side, so it understates
//! the noise of a floor whose two cases run further apart). The cores'
//! coupling (a cache-line ping-pong) is measured before the first repetition
//! and after each; when it changed during the run (a shared VM's vCPUs moved
//! between one physical core and two), the paired medians are also given on
//! either side of the change.

use std::hint::{black_box, spin_loop};
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use crossbeam_queue::ArrayQueue;
use ntbdk_bench::{
    PairedFloor, Row, check_floor, command_line, core_pair, coupling_changed, coupling_ns,
    describe_machine, median, pin, print_floor_header, print_paired, print_table, report_coupling,
};
use ntbdk_ring::{Ring, RingMode};

/// Ring benchmark: ntbdk-ring vs crossbeam ArrayQueue vs rtrb, producer and
/// consumer pinned to two cores.
#[derive(Parser, Debug)]
#[command(name = "ring")]
struct Args {
    /// Items moved per case and repetition.
    #[arg(long, default_value_t = 10_000_000)]
    items: u64,
    /// Repetitions per case (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Capacity of every queue (a power of two).
    #[arg(long, default_value_t = 4096)]
    capacity: usize,
    /// Length in seconds of each sustained run (0 to skip them).
    #[arg(long, default_value_t = 1.5)]
    sustain_secs: f64,
    /// Sustained runs per case, interleaved.
    #[arg(long, default_value_t = 3)]
    sustain_reps: usize,
    /// Dependent additions the consumer does on each item it takes (0:
    /// none, the queue alone). A consumer that is slower per item catches
    /// its producer less often: the cross-core single-item figures move
    /// with it (see bench/RESULTS.md).
    #[arg(long, default_value_t = 0)]
    consumer_work: u64,
    /// Exit with status 1 when a floor is missed.
    #[arg(long)]
    strict: bool,
    /// Run only the cases whose name contains this text (repeatable); the
    /// floors whose rows did not run are skipped. For profiling one case.
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
}

/// The cases, in the order they are printed.
#[derive(Clone, Copy, Debug)]
enum Case {
    /// ntbdk ring, `enqueue`/`dequeue`.
    NtbdkSingle(RingMode),
    /// ntbdk ring, `enqueue_burst`/`dequeue_burst` of up to N.
    NtbdkBurst(RingMode, usize),
    /// `ArrayQueue::push`/`pop`.
    ArrayQueue,
    /// ntbdk SPSC ring through its split handles, `enqueue`/`dequeue`.
    HandlesSingle,
    /// ntbdk SPSC split handles, `enqueue_burst`/`dequeue_burst` of up to N.
    HandlesBurst(usize),
    /// `rtrb` `push`/`pop`.
    RtrbSingle,
    /// `rtrb` chunk API (`push_partial_slice`/`pop_partial_slice`) of up to N.
    RtrbChunk(usize),
    /// `rtrb` `push`/`pop` once more, under another name (`A` or `B`): two
    /// cases of the same code, whose paired ratio shows how far the noise
    /// alone moves a ratio of this run from 1.0.
    RtrbControl(char),
}

const CASES: [Case; 14] = [
    Case::HandlesSingle,
    Case::RtrbSingle,
    Case::HandlesBurst(32),
    Case::RtrbChunk(32),
    Case::HandlesBurst(8),
    Case::NtbdkSingle(RingMode::SPSC),
    Case::NtbdkBurst(RingMode::SPSC, 8),
    Case::NtbdkBurst(RingMode::SPSC, 32),
    Case::NtbdkSingle(RingMode::MPMC),
    Case::NtbdkBurst(RingMode::MPMC, 32),
    Case::ArrayQueue,
    Case::NtbdkBurst(RingMode::MPMC, 8),
    Case::RtrbControl('A'),
    Case::RtrbControl('B'),
];

impl Case {
    fn name(self) -> String {
        let mode = |m: RingMode| if m == RingMode::SPSC { "SPSC" } else { "MPMC" };
        match self {
            Case::NtbdkSingle(m) => format!("ntbdk {} single", mode(m)),
            Case::NtbdkBurst(m, n) => format!("ntbdk {} burst {n}", mode(m)),
            Case::HandlesSingle => "ntbdk SPSC handles single".into(),
            Case::HandlesBurst(n) => format!("ntbdk SPSC handles burst {n}"),
            Case::ArrayQueue => "crossbeam ArrayQueue push/pop".into(),
            Case::RtrbSingle => "rtrb push/pop".into(),
            Case::RtrbChunk(n) => format!("rtrb chunk {n}"),
            Case::RtrbControl(c) => format!("rtrb push/pop, control {c}"),
        }
    }
}

/// The floors: (label, our row, the peer's row, the least ratio ours / peer).
const FLOORS: [(&str, &str, &str, f64); 5] = [
    (
        "SPSC burst 32 vs ArrayQueue",
        "ntbdk SPSC burst 32",
        "crossbeam ArrayQueue push/pop",
        4.0,
    ),
    (
        "SPSC single vs rtrb push/pop",
        "ntbdk SPSC single",
        "rtrb push/pop",
        1.0,
    ),
    (
        "SPSC handles single vs rtrb push/pop",
        "ntbdk SPSC handles single",
        "rtrb push/pop",
        1.0,
    ),
    (
        "SPSC handles burst 32 vs rtrb chunk 32",
        "ntbdk SPSC handles burst 32",
        "rtrb chunk 32",
        1.0,
    ),
    (
        "MPMC burst 32 vs ArrayQueue",
        "ntbdk MPMC burst 32",
        "crossbeam ArrayQueue push/pop",
        2.0,
    ),
];

/// The control, printed with the paired floors but not a floor: rtrb
/// against itself, (label, "ours", "peer"). Its paired median and range
/// are what the noise alone makes of a ratio of 1.0 in the same run.
const CONTROL: (&str, &str, &str) = (
    "control: rtrb push/pop vs itself",
    "rtrb push/pop, control B",
    "rtrb push/pop, control A",
);

/// Each floor's ratio ours / peer within each repetition (`runs`, in case
/// order; ours and the peer ran in the same repetition, a few cases apart
/// at most), for the paired table; `coupling` is the cores' coupling
/// before the first repetition and after each. The [`CONTROL`] comes last
/// when both its cases ran.
fn paired_ratios(runs: &[Vec<Row>], coupling: &[f64]) -> Vec<PairedFloor> {
    let find = |name: &str| runs.iter().find(|r| r[0].name == name);
    let around: Vec<(f64, f64)> = coupling
        .windows(2)
        .map(|w| (w[0].min(w[1]), w[0].max(w[1])))
        .collect();
    let (label, ours, peer) = CONTROL;
    FLOORS
        .iter()
        .map(|&(label, ours, peer, min)| (label, ours, peer, format!(">= {min}x")))
        .chain([(label, ours, peer, "(no floor: 1.0x)".to_string())])
        .filter_map(|(label, ours, peer, needed)| {
            let (o, p) = (find(ours)?, find(peer)?);
            Some(PairedFloor {
                label: label.to_string(),
                needed,
                ratios: o.iter().zip(p).map(|(o, p)| o.mops() / p.mops()).collect(),
                around: around.clone(),
            })
        })
        .collect()
}

thread_local! {
    /// Calls of [`idle`] on this thread: how often it found its queue full
    /// (producer) or empty (consumer).
    static IDLE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Steps of work the consumer does on each item (`--consumer-work`).
static CONSUMER_WORK: AtomicU64 = AtomicU64::new(0);

/// The consumer's work on one item: `steps` dependent additions the
/// compiler cannot fold away (about a cycle each).
#[inline(always)]
fn work_on(item: u64, steps: u64) {
    let mut x = item;
    for _ in 0..steps {
        x = black_box(x.wrapping_add(1));
    }
    black_box(x);
}

/// Full and empty findings (producer, consumer) of the last [`run_pair`].
static LAST_IDLE: std::sync::Mutex<(u64, u64)> = std::sync::Mutex::new((0, 0));

/// What a thread does when its queue is full or empty: spin, or yield when
/// producer and consumer share a core (spinning would only stall the other).
fn idle(shared_core: bool) {
    IDLE.with(|n| n.set(n.get() + 1));
    if shared_core {
        thread::yield_now();
    } else {
        spin_loop();
    }
}

/// Runs `producer` and `consumer` on the two benchmark cores, released
/// together; the time is the consumer's, from release to its last item.
/// The consumer returns how many items arrived out of order (must be 0).
fn run_pair<P, C>(producer: P, consumer: C) -> Duration
where
    P: FnOnce() + Send,
    C: FnOnce() -> u64 + Send,
{
    let (pc, cc) = core_pair();
    let start = Barrier::new(2);
    thread::scope(|s| {
        let p = s.spawn(|| {
            pin(pc);
            IDLE.with(|n| n.set(0));
            start.wait();
            producer();
            IDLE.with(|n| n.get())
        });
        let c = s.spawn(|| {
            pin(cc);
            IDLE.with(|n| n.set(0));
            start.wait();
            let t = Instant::now();
            let bad = consumer();
            (t.elapsed(), bad, IDLE.with(|n| n.get()))
        });
        let full = p.join().expect("producer panicked");
        let (elapsed, bad, empty) = c.join().expect("consumer panicked");
        assert_eq!(bad, 0, "items arrived out of order");
        *LAST_IDLE.lock().unwrap() = (full, empty);
        elapsed
    })
}

/// The producer side of a one-at-a-time case: `push(i)` for every item in
/// order, idling while it says the queue is full.
fn produce_single(items: u64, shared: bool, mut push: impl FnMut(u64) -> bool) {
    for i in 0..items {
        while !push(i) {
            idle(shared);
        }
    }
}

/// The consumer side of a one-at-a-time case: `pop()` until every item
/// arrived; returns how many came out of order.
fn consume_single(items: u64, shared: bool, mut pop: impl FnMut() -> Option<u64>) -> u64 {
    let steps = CONSUMER_WORK.load(Ordering::Relaxed);
    let (mut next, mut bad) = (0, 0);
    while next < items {
        match pop() {
            Some(v) => {
                bad += u64::from(v != next);
                next += 1;
                work_on(v, steps);
            }
            None => idle(shared),
        }
    }
    bad
}

/// The producer side of a burst case: `push(run)` for runs of up to `B`
/// consecutive items, which returns how many it took.
fn produce_bursts<const B: usize>(items: u64, shared: bool, mut push: impl FnMut(&[u64]) -> usize) {
    let mut buf = [0u64; B];
    let mut i = 0;
    while i < items {
        let n = (items - i).min(B as u64) as usize;
        for (k, v) in buf[..n].iter_mut().enumerate() {
            *v = i + k as u64;
        }
        let sent = push(&buf[..n]);
        i += sent as u64;
        if sent == 0 {
            idle(shared);
        }
    }
}

/// The consumer side of a burst case: `pop(buf)` (how many it filled)
/// until every item arrived; returns how many came out of order.
fn consume_bursts<const B: usize>(
    items: u64,
    shared: bool,
    mut pop: impl FnMut(&mut [u64]) -> usize,
) -> u64 {
    let steps = CONSUMER_WORK.load(Ordering::Relaxed);
    let mut buf = [0u64; B];
    let (mut next, mut bad) = (0, 0);
    while next < items {
        let got = pop(&mut buf);
        for &v in &buf[..got] {
            bad += u64::from(v != next);
            next += 1;
            work_on(v, steps);
        }
        if got == 0 {
            idle(shared);
        }
    }
    bad
}

/// Moves `items` items through ntbdk, one at a time.
fn ntbdk_single(mode: RingMode, capacity: usize, items: u64, shared: bool) -> Duration {
    let ring = Ring::<u64>::new(capacity, mode).expect("ring");
    run_pair(
        || produce_single(items, shared, |i| ring.enqueue(i).is_ok()),
        || consume_single(items, shared, || ring.dequeue()),
    )
}

/// Moves `items` items through ntbdk in bursts of up to `B`.
fn ntbdk_burst<const B: usize>(
    mode: RingMode,
    capacity: usize,
    items: u64,
    shared: bool,
) -> Duration {
    let ring = Ring::<u64>::new(capacity, mode).expect("ring");
    run_pair(
        || produce_bursts::<B>(items, shared, |run| ring.enqueue_burst(run).n),
        || consume_bursts::<B>(items, shared, |buf| ring.dequeue_burst(buf).n),
    )
}

/// Moves `items` items through an SPSC ring's split handles, one at a time.
fn handles_single(capacity: usize, items: u64, shared: bool) -> Duration {
    let (mut p, mut c) = Ring::<u64>::new(capacity, RingMode::SPSC)
        .and_then(Ring::split_spsc)
        .expect("ring");
    run_pair(
        move || produce_single(items, shared, |i| p.enqueue(i).is_ok()),
        move || consume_single(items, shared, || c.dequeue()),
    )
}

/// Moves `items` items through an SPSC ring's split handles in bursts of up
/// to `B`.
fn handles_burst<const B: usize>(capacity: usize, items: u64, shared: bool) -> Duration {
    let (mut p, mut c) = Ring::<u64>::new(capacity, RingMode::SPSC)
        .and_then(Ring::split_spsc)
        .expect("ring");
    run_pair(
        move || produce_bursts::<B>(items, shared, |run| p.enqueue_burst(run).n),
        move || consume_bursts::<B>(items, shared, |buf| c.dequeue_burst(buf).n),
    )
}

/// Moves `items` items through a crossbeam `ArrayQueue`.
fn array_queue(capacity: usize, items: u64, shared: bool) -> Duration {
    let q = ArrayQueue::<u64>::new(capacity);
    run_pair(
        || produce_single(items, shared, |i| q.push(i).is_ok()),
        || consume_single(items, shared, || q.pop()),
    )
}

/// Moves `items` items through `rtrb`, one at a time.
fn rtrb_single(capacity: usize, items: u64, shared: bool) -> Duration {
    let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(capacity);
    run_pair(
        move || produce_single(items, shared, |i| p.push(i).is_ok()),
        move || consume_single(items, shared, || c.pop().ok()),
    )
}

/// Moves `items` items through `rtrb`'s chunk API in chunks of up to `B`.
fn rtrb_chunk<const B: usize>(capacity: usize, items: u64, shared: bool) -> Duration {
    let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(capacity);
    run_pair(
        move || produce_bursts::<B>(items, shared, |run| p.push_partial_slice(run).0.len()),
        move || consume_bursts::<B>(items, shared, |buf| c.pop_partial_slice(buf).0.len()),
    )
}

/// Runs one repetition of `case`.
/// The case run `k`-th in repetition `rep` of `n` cases: the list rotated
/// by whole pairs (so each case in turn runs first, after the coupling
/// probe, on a fresh allocation), forwards in even repetitions and
/// backwards in odd ones, so that of two cases side by side in the list (a
/// floor's ours and peer) each runs first in every other repetition.
fn run_order(rep: usize, k: usize, n: usize) -> usize {
    let off = (2 * (rep / 2)) % n;
    if rep.is_multiple_of(2) {
        (off + k) % n
    } else {
        (off + n - 1 - k) % n
    }
}

fn run_case(case: Case, args: &Args, shared: bool) -> Row {
    run_case_items(case, args.capacity, args.items, shared)
}

/// Runs `case` once, moving `items` items.
fn run_case_items(case: Case, cap: usize, items: u64, shared: bool) -> Row {
    let elapsed = match case {
        Case::HandlesSingle => handles_single(cap, items, shared),
        Case::HandlesBurst(8) => handles_burst::<8>(cap, items, shared),
        Case::HandlesBurst(32) => handles_burst::<32>(cap, items, shared),
        Case::NtbdkSingle(m) => ntbdk_single(m, cap, items, shared),
        Case::NtbdkBurst(m, 8) => ntbdk_burst::<8>(m, cap, items, shared),
        Case::NtbdkBurst(m, 32) => ntbdk_burst::<32>(m, cap, items, shared),
        Case::ArrayQueue => array_queue(cap, items, shared),
        Case::RtrbSingle | Case::RtrbControl(_) => rtrb_single(cap, items, shared),
        Case::RtrbChunk(32) => rtrb_chunk::<32>(cap, items, shared),
        other => unreachable!("no harness for {other:?}"),
    };
    Row {
        name: case.name(),
        ops: items,
        elapsed,
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.items > 0 && args.reps > 0,
        "--items and --reps must be at least 1"
    );
    anyhow::ensure!(
        args.capacity.is_power_of_two(),
        "--capacity {} is not a power of two (the ntbdk ring needs one)",
        args.capacity
    );
    let (pc, cc) = core_pair();
    let shared = pc == cc;
    CONSUMER_WORK.store(args.consumer_work, Ordering::Relaxed);

    println!("## Ring benchmark\n");
    println!("- machine: {}", describe_machine());
    println!("- command: `{}`", command_line("ring"));
    println!(
        "- {} u64 items per case, capacity {}, producer on core {pc}, consumer on core {cc}, \
         median of {} interleaved repetitions",
        args.items, args.capacity, args.reps
    );

    let picked = |c: &Case| args.only.is_empty() || args.only.iter().any(|o| c.name().contains(o));
    let is_control = |c: &Case| matches!(c, Case::RtrbControl(_));
    let mut cases: Vec<Case> = CASES
        .into_iter()
        .filter(|c| !is_control(c) && picked(c))
        .collect();
    // The control pair, whole, at the end of the list (runs rotate and
    // reverse it like any pair): with `rtrb push/pop` or when asked
    // for by name.
    if cases.iter().any(|c| matches!(c, Case::RtrbSingle))
        || CASES.iter().any(|c| is_control(c) && picked(c))
    {
        cases.extend(CASES.into_iter().filter(is_control));
    }
    anyhow::ensure!(!cases.is_empty(), "no case matches --only {:?}", args.only);
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); cases.len()];
    // The cores' coupling before the first repetition and after each.
    let mut coupling = vec![coupling_ns(pc, cc)];
    for rep in 0..args.reps {
        // Each case's Mops/s, with (full/empty findings per 1000 items):
        // which regime the pair settled in.
        eprint!("rep {}/{}:", rep + 1, args.reps);
        let mut findings = vec![(0, 0); cases.len()];
        for k in 0..cases.len() {
            let i = run_order(rep, k, cases.len());
            let row = run_case(cases[i], &args, shared);
            let (f, e) = *LAST_IDLE.lock().unwrap();
            findings[i] = (f * 1000 / row.ops, e * 1000 / row.ops);
            runs[i].push(row);
        }
        for (run, (f, e)) in runs.iter().zip(findings) {
            eprint!(" {:.0}({f}/{e})", run[rep].mops());
        }
        coupling.push(coupling_ns(pc, cc));
        eprintln!(
            " Mops/s, coupling {:.0} -> {:.0} ns",
            coupling[rep],
            coupling[rep + 1]
        );
    }
    let paired = paired_ratios(&runs, &coupling);
    // Range (slowest .. fastest repetition) of each case, for the record.
    let ranges: Vec<(String, f64, f64)> = runs
        .iter()
        .map(|r| {
            let m = r.iter().map(Row::mops);
            (
                r[0].name.clone(),
                m.clone().fold(f64::INFINITY, f64::min),
                m.fold(0.0, f64::max),
            )
        })
        .collect();
    let rows: Vec<Row> = runs.into_iter().map(median).collect();
    print_table("Throughput (one producer, one consumer)", &rows);
    println!("\n### Range over the {} repetitions (Mops/s)\n", args.reps);
    println!("| case | slowest | fastest |");
    println!("| --- | ---: | ---: |");
    for (name, lo, hi) in &ranges {
        println!("| {name} | {lo:.2} | {hi:.2} |");
    }

    let by = |name: &str| rows.iter().find(|r| r.name == name);
    let aq = "crossbeam ArrayQueue push/pop";
    print_floor_header();
    let mut ok = true;
    for (label, ours, peer, min) in FLOORS {
        if let (Some(o), Some(p)) = (by(ours), by(peer)) {
            ok &= check_floor(label, o, p, min);
        }
    }
    print_paired(&paired);
    report_coupling(coupling[0], coupling[args.reps]);

    println!("\n### Other ratios (same run, no floor)\n");
    println!("| ours / peer | ratio |");
    println!("| --- | ---: |");
    for (ours, peer) in [
        ("ntbdk SPSC burst 32", "rtrb chunk 32"),
        ("ntbdk SPSC handles single", "ntbdk SPSC single"),
        ("ntbdk SPSC handles burst 32", "ntbdk SPSC burst 32"),
        ("ntbdk SPSC handles burst 8", "ntbdk SPSC burst 8"),
        ("ntbdk SPSC burst 8", aq),
        ("ntbdk SPSC single", aq),
        ("ntbdk MPMC single", aq),
        ("ntbdk MPMC burst 8", aq),
    ] {
        if let (Some(o), Some(p)) = (by(ours), by(peer)) {
            println!("| {ours} / {peer} | {:.2}x |", o.mops() / p.mops());
        }
    }
    one_thread(&args);
    if args.sustain_secs > 0.0 && args.sustain_reps > 0 {
        let slowest: Vec<(String, f64)> = ranges
            .iter()
            .map(|(name, lo, _)| (name.clone(), *lo))
            .collect();
        sustained(&args, &slowest, (pc, cc));
    }
    if !ok {
        println!("\nA floor was missed (see bench/RESULTS.md for what limits it on this machine).");
        if args.strict {
            std::process::exit(1);
        }
    }
    Ok(())
}

/// Sustained runs: the split handles and rtrb, single and chunk 32, each
/// moving enough items for a continuous run of at least `--sustain-secs`
/// at its slowest rate above (a run that ends sooner is repeated with more
/// items),
/// `--sustain-reps` times, interleaved. Prints each run and the ratios of the
/// medians.
fn sustained(args: &Args, slowest: &[(String, f64)], (pc, cc): (usize, usize)) {
    let shared = pc == cc;
    let pairs = [
        (Case::HandlesSingle, Case::RtrbSingle),
        (Case::HandlesBurst(32), Case::RtrbChunk(32)),
    ];
    let want = Duration::from_secs_f64(args.sustain_secs);
    // Items per case: the slowest repetition's rate (from the table's
    // runs, or a guess) times the length asked for; a run that still ends
    // sooner is scaled up and repeated below.
    let items_for = |case: Case| -> u64 {
        let mops = slowest
            .iter()
            .find(|(name, _)| *name == case.name())
            .map_or(50.0, |&(_, m)| m);
        (mops * 1e6 * args.sustain_secs).max(1e6) as u64
    };
    // Flattened: ours, peer, ours, peer, ...
    let cases: Vec<Case> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    let mut items: Vec<u64> = cases.iter().map(|&c| items_for(c)).collect();
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); cases.len()];
    let mut idles: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new(); cases.len()];
    let mut coupling = vec![coupling_ns(pc, cc)];
    for rep in 0..args.sustain_reps {
        eprint!("sustained {}/{}:", rep + 1, args.sustain_reps);
        // Ordered as the table's repetitions are.
        for j in 0..cases.len() {
            let k = run_order(rep, j, cases.len());
            let case = cases[k];
            let mut row = run_case_items(case, args.capacity, items[k], shared);
            while row.elapsed < want {
                // Too short at this rate: scale up and run again.
                let scale = want.as_secs_f64() / row.elapsed.as_secs_f64().max(1e-3);
                items[k] = (items[k] as f64 * scale * 1.2) as u64;
                row = run_case_items(case, args.capacity, items[k], shared);
            }
            eprint!(" {}: {:.0}", case.name(), row.mops());
            let (full, empty) = *LAST_IDLE.lock().unwrap();
            idles[k].push((full, empty, row.ops));
            runs[k].push(row);
        }
        coupling.push(coupling_ns(pc, cc));
        eprintln!(" Mops/s");
    }
    println!(
        "\n### Sustained (continuous runs of at least {} s, {} interleaved each)\n",
        args.sustain_secs, args.sustain_reps
    );
    println!(
        "| case | items per run | seconds per run | Mops/s per run | full, empty per 1000 items | median Mops/s |"
    );
    println!("| --- | ---: | --- | --- | --- | ---: |");
    let mut medians = Vec::new();
    for (r, idle) in runs.into_iter().zip(idles) {
        let join = |v: Vec<String>| v.join(", ");
        let secs = join(
            r.iter()
                .map(|x| format!("{:.2}", x.elapsed.as_secs_f64()))
                .collect(),
        );
        let per = join(r.iter().map(|x| format!("{:.1}", x.mops())).collect());
        let polls = join(
            idle.iter()
                .map(|&(f, e, n)| {
                    format!(
                        "{:.0}/{:.0}",
                        f as f64 * 1000.0 / n as f64,
                        e as f64 * 1000.0 / n as f64
                    )
                })
                .collect(),
        );
        let m = median(r);
        println!(
            "| {} | {} | {secs} | {per} | {polls} | {:.2} |",
            m.name,
            m.ops,
            m.mops()
        );
        medians.push(m);
    }
    let around: Vec<String> = coupling.iter().map(|c| format!("{c:.0}")).collect();
    println!(
        "\nThe cores' coupling (ns, one-way) before the first run and after each round: {}{}",
        around.join(", "),
        if coupling.windows(2).any(|w| coupling_changed(w[0], w[1])) {
            " (changed: runs on either side are not comparable)"
        } else {
            ""
        }
    );
    println!("\n| sustained ours / peer | ratio |");
    println!("| --- | ---: |");
    for pair in medians.chunks(2) {
        println!(
            "| {} / {} | {:.2}x |",
            pair[0].name,
            pair[1].name,
            pair[0].mops() / pair[1].mops()
        );
    }
}

/// The cost of the operations themselves, without a second core: one
/// thread enqueues and dequeues through the split handles and through rtrb
/// (one element, then bursts/chunks of 32) over a ring that never fills,
/// then each side alone (laps of a full ring's enqueues, then its
/// dequeues, one of the two timed); `--reps` interleaved repetitions of
/// about `--items` items, median ns per item.
fn one_thread(args: &Args) {
    use std::hint::black_box;
    let items = args.items;
    let handles_single = || {
        let (mut p, mut c) = Ring::<u64>::new(args.capacity, RingMode::SPSC)
            .and_then(Ring::split_spsc)
            .expect("ring");
        let t = Instant::now();
        for i in 0..items {
            p.enqueue(black_box(i)).expect("room");
            black_box(c.dequeue());
        }
        t.elapsed()
    };
    let rtrb_single = || {
        let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(args.capacity);
        let t = Instant::now();
        for i in 0..items {
            p.push(black_box(i)).expect("room");
            black_box(c.pop().ok());
        }
        t.elapsed()
    };
    let handles_burst = || {
        let (mut p, mut c) = Ring::<u64>::new(args.capacity, RingMode::SPSC)
            .and_then(Ring::split_spsc)
            .expect("ring");
        let (src, mut dst) = ([7u64; 32], [0u64; 32]);
        let t = Instant::now();
        for _ in 0..items / 32 {
            black_box(p.enqueue_burst(black_box(&src)));
            black_box(c.dequeue_burst(&mut dst));
        }
        t.elapsed()
    };
    let rtrb_chunk = || {
        let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(args.capacity);
        let (src, mut dst) = ([7u64; 32], [0u64; 32]);
        let t = Instant::now();
        for _ in 0..items / 32 {
            black_box(p.push_partial_slice(black_box(&src)));
            black_box(c.pop_partial_slice(&mut dst));
        }
        t.elapsed()
    };
    // Each side alone: laps of a full ring's enqueues, then its dequeues,
    // only one of the two timed (which side paces a cross-core run).
    let laps = (items / args.capacity as u64).max(1);
    let lap_items = laps * args.capacity as u64;
    // One side's time over the laps: `fill` enqueues a full ring, `drain`
    // empties it; `time_fill` says which of the two is timed.
    let one_side = |time_fill: bool, fill: &mut dyn FnMut(), drain: &mut dyn FnMut()| {
        let mut timed = Duration::ZERO;
        for _ in 0..laps {
            let t = Instant::now();
            fill();
            let filled = Instant::now();
            drain();
            timed += if time_fill {
                filled - t
            } else {
                filled.elapsed()
            };
        }
        timed
    };
    let handles_side = |time_enqueue: bool| {
        let (mut p, mut c) = Ring::<u64>::new(args.capacity, RingMode::SPSC)
            .and_then(Ring::split_spsc)
            .expect("ring");
        one_side(
            time_enqueue,
            &mut || {
                for i in 0..args.capacity as u64 {
                    p.enqueue(black_box(i)).expect("room");
                }
            },
            &mut || {
                for _ in 0..args.capacity {
                    black_box(c.dequeue());
                }
            },
        )
    };
    let rtrb_side = |time_push: bool| {
        let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(args.capacity);
        one_side(
            time_push,
            &mut || {
                for i in 0..args.capacity as u64 {
                    p.push(black_box(i)).expect("room");
                }
            },
            &mut || {
                for _ in 0..args.capacity {
                    black_box(c.pop().ok());
                }
            },
        )
    };
    let (handles_enqueue, handles_dequeue) = (|| handles_side(true), || handles_side(false));
    let (rtrb_push, rtrb_pop) = (|| rtrb_side(true), || rtrb_side(false));
    type Case<'a> = (&'static str, u64, &'a dyn Fn() -> Duration);
    let cases: [Case<'_>; 8] = [
        ("ntbdk SPSC handles single", items, &handles_single),
        ("rtrb push/pop", items, &rtrb_single),
        (
            "ntbdk SPSC handles burst 32",
            items / 32 * 32,
            &handles_burst,
        ),
        ("rtrb chunk 32", items / 32 * 32, &rtrb_chunk),
        (
            "ntbdk SPSC handles enqueue alone",
            lap_items,
            &handles_enqueue,
        ),
        ("rtrb push alone", lap_items, &rtrb_push),
        (
            "ntbdk SPSC handles dequeue alone",
            lap_items,
            &handles_dequeue,
        ),
        ("rtrb pop alone", lap_items, &rtrb_pop),
    ];
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); cases.len()];
    for _ in 0..args.reps {
        for (k, &(name, ops, f)) in cases.iter().enumerate() {
            runs[k].push(Row {
                name: name.into(),
                ops,
                elapsed: f(),
            });
        }
    }
    let rows: Vec<Row> = runs.into_iter().map(median).collect();
    print_table(
        "One thread (enqueue then dequeue, and each side alone over a full ring's laps; no second core: the cost of the operations)",
        &rows,
    );
}
