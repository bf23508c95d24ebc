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
//! is kept. It prints Mops/s, then the ratios ntbdk/peer against the floors
//! of the issue that introduced the ring.

use std::hint::spin_loop;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use crossbeam_queue::ArrayQueue;
use ntbdk_bench::{
    Row, check_floor, core_pair, describe_machine, median, pin, print_floor_header, print_table,
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
    /// `rtrb` `push`/`pop`.
    RtrbSingle,
    /// `rtrb` chunk API (`push_partial_slice`/`pop_partial_slice`) of up to N.
    RtrbChunk(usize),
}

const CASES: [Case; 9] = [
    Case::NtbdkSingle(RingMode::SPSC),
    Case::NtbdkBurst(RingMode::SPSC, 8),
    Case::NtbdkBurst(RingMode::SPSC, 32),
    Case::NtbdkSingle(RingMode::MPMC),
    Case::NtbdkBurst(RingMode::MPMC, 32),
    Case::ArrayQueue,
    Case::RtrbSingle,
    Case::RtrbChunk(32),
    Case::NtbdkBurst(RingMode::MPMC, 8),
];

impl Case {
    fn name(self) -> String {
        let mode = |m: RingMode| if m == RingMode::SPSC { "SPSC" } else { "MPMC" };
        match self {
            Case::NtbdkSingle(m) => format!("ntbdk {} single", mode(m)),
            Case::NtbdkBurst(m, n) => format!("ntbdk {} burst {n}", mode(m)),
            Case::ArrayQueue => "crossbeam ArrayQueue push/pop".into(),
            Case::RtrbSingle => "rtrb push/pop".into(),
            Case::RtrbChunk(n) => format!("rtrb chunk {n}"),
        }
    }
}

/// What a thread does when its queue is full or empty: spin, or yield when
/// producer and consumer share a core (spinning would only stall the other).
fn idle(shared_core: bool) {
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
            start.wait();
            producer();
        });
        let c = s.spawn(|| {
            pin(cc);
            start.wait();
            let t = Instant::now();
            let bad = consumer();
            (t.elapsed(), bad)
        });
        p.join().expect("producer panicked");
        let (elapsed, bad) = c.join().expect("consumer panicked");
        assert_eq!(bad, 0, "items arrived out of order");
        elapsed
    })
}

/// Moves `items` items through ntbdk, one at a time.
fn ntbdk_single(mode: RingMode, capacity: usize, items: u64, shared: bool) -> Duration {
    let ring = Ring::<u64>::new(capacity, mode).expect("ring");
    run_pair(
        || {
            for i in 0..items {
                while ring.enqueue(i).is_err() {
                    idle(shared);
                }
            }
        },
        || {
            let (mut next, mut bad) = (0, 0);
            while next < items {
                match ring.dequeue() {
                    Some(v) => {
                        bad += u64::from(v != next);
                        next += 1;
                    }
                    None => idle(shared),
                }
            }
            bad
        },
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
        || {
            let mut buf = [0u64; B];
            let mut i = 0;
            while i < items {
                let n = (items - i).min(B as u64) as usize;
                for (k, v) in buf[..n].iter_mut().enumerate() {
                    *v = i + k as u64;
                }
                let sent = ring.enqueue_burst(&buf[..n]).n;
                i += sent as u64;
                if sent == 0 {
                    idle(shared);
                }
            }
        },
        || {
            let mut buf = [0u64; B];
            let (mut next, mut bad) = (0, 0);
            while next < items {
                let got = ring.dequeue_burst(&mut buf).n;
                for &v in &buf[..got] {
                    bad += u64::from(v != next);
                    next += 1;
                }
                if got == 0 {
                    idle(shared);
                }
            }
            bad
        },
    )
}

/// Moves `items` items through a crossbeam `ArrayQueue`.
fn array_queue(capacity: usize, items: u64, shared: bool) -> Duration {
    let q = ArrayQueue::<u64>::new(capacity);
    run_pair(
        || {
            for i in 0..items {
                let mut v = i;
                while let Err(back) = q.push(v) {
                    v = back;
                    idle(shared);
                }
            }
        },
        || {
            let (mut next, mut bad) = (0, 0);
            while next < items {
                match q.pop() {
                    Some(v) => {
                        bad += u64::from(v != next);
                        next += 1;
                    }
                    None => idle(shared),
                }
            }
            bad
        },
    )
}

/// Moves `items` items through `rtrb`, one at a time.
fn rtrb_single(capacity: usize, items: u64, shared: bool) -> Duration {
    let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(capacity);
    run_pair(
        move || {
            for i in 0..items {
                while p.push(i).is_err() {
                    idle(shared);
                }
            }
        },
        move || {
            let (mut next, mut bad) = (0, 0);
            while next < items {
                match c.pop() {
                    Ok(v) => {
                        bad += u64::from(v != next);
                        next += 1;
                    }
                    Err(_) => idle(shared),
                }
            }
            bad
        },
    )
}

/// Moves `items` items through `rtrb`'s chunk API in chunks of up to `B`.
fn rtrb_chunk<const B: usize>(capacity: usize, items: u64, shared: bool) -> Duration {
    let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(capacity);
    run_pair(
        move || {
            let mut buf = [0u64; B];
            let mut i = 0;
            while i < items {
                let n = (items - i).min(B as u64) as usize;
                for (k, v) in buf[..n].iter_mut().enumerate() {
                    *v = i + k as u64;
                }
                let (pushed, _) = p.push_partial_slice(&buf[..n]);
                i += pushed.len() as u64;
                if pushed.is_empty() {
                    idle(shared);
                }
            }
        },
        move || {
            let mut buf = [0u64; B];
            let (mut next, mut bad) = (0, 0);
            while next < items {
                let (popped, _) = c.pop_partial_slice(&mut buf);
                let got = popped.len();
                for &v in &popped[..] {
                    bad += u64::from(v != next);
                    next += 1;
                }
                if got == 0 {
                    idle(shared);
                }
            }
            bad
        },
    )
}

/// Runs one repetition of `case`.
fn run_case(case: Case, args: &Args, shared: bool) -> Row {
    let (cap, items) = (args.capacity, args.items);
    let elapsed = match case {
        Case::NtbdkSingle(m) => ntbdk_single(m, cap, items, shared),
        Case::NtbdkBurst(m, 8) => ntbdk_burst::<8>(m, cap, items, shared),
        Case::NtbdkBurst(m, 32) => ntbdk_burst::<32>(m, cap, items, shared),
        Case::ArrayQueue => array_queue(cap, items, shared),
        Case::RtrbSingle => rtrb_single(cap, items, shared),
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

    println!("## Ring benchmark\n");
    println!("- machine: {}", describe_machine());
    println!(
        "- command: `cargo run --release -p ntbdk-bench --bin ring -- --items {} --reps {} --capacity {}`",
        args.items, args.reps, args.capacity
    );
    println!(
        "- {} u64 items per case, capacity {}, producer on core {pc}, consumer on core {cc}, \
         median of {} interleaved repetitions",
        args.items, args.capacity, args.reps
    );

    let cases: Vec<Case> = CASES
        .into_iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|o| c.name().contains(o)))
        .collect();
    anyhow::ensure!(!cases.is_empty(), "no case matches --only {:?}", args.only);
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); cases.len()];
    for rep in 0..args.reps {
        eprint!("rep {}/{}:", rep + 1, args.reps);
        for (i, &case) in cases.iter().enumerate() {
            let row = run_case(case, &args, shared);
            eprint!(" {:.0}", row.mops());
            runs[i].push(row);
        }
        eprintln!(" Mops/s");
    }
    let rows: Vec<Row> = runs.into_iter().map(median).collect();
    print_table("Throughput (one producer, one consumer)", &rows);

    let by = |name: &str| rows.iter().find(|r| r.name == name);
    let aq = "crossbeam ArrayQueue push/pop";
    print_floor_header();
    let mut ok = true;
    for (label, ours, peer, min) in [
        (
            "SPSC burst 32 vs ArrayQueue",
            "ntbdk SPSC burst 32",
            aq,
            4.0,
        ),
        (
            "SPSC single vs rtrb push/pop",
            "ntbdk SPSC single",
            "rtrb push/pop",
            1.0,
        ),
        (
            "MPMC burst 32 vs ArrayQueue",
            "ntbdk MPMC burst 32",
            aq,
            2.0,
        ),
    ] {
        if let (Some(o), Some(p)) = (by(ours), by(peer)) {
            ok &= check_floor(label, o, p, min);
        }
    }

    println!("\n### Other ratios (same run, no floor)\n");
    println!("| ours / peer | ratio |");
    println!("| --- | ---: |");
    for (ours, peer) in [
        ("ntbdk SPSC burst 32", "rtrb chunk 32"),
        ("ntbdk SPSC burst 8", aq),
        ("ntbdk SPSC single", aq),
        ("ntbdk MPMC single", aq),
        ("ntbdk MPMC burst 8", aq),
    ] {
        if let (Some(o), Some(p)) = (by(ours), by(peer)) {
            println!("| {ours} / {peer} | {:.2}x |", o.mops() / p.mops());
        }
    }
    if !ok {
        println!("\nA floor was missed (see bench/RESULTS.md for what limits it on this machine).");
        if args.strict {
            std::process::exit(1);
        }
    }
    Ok(())
}
