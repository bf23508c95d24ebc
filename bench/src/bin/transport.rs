//! Transport baselines: what the ntbdk transport is compared against, side
//! by side in one pinned run.
//!
//! ```text
//! cargo run --release -p ntbdk-bench --bin transport [-- --iters N --target-ms 300]
//! ```
//!
//! Every case runs its operations in timed batches (a batch lasts about
//! 20 µs or one operation, whichever is longer) and reports the **median
//! batch** per operation, so a run that another process preempts now and then
//! still reports what the hardware does; the mean over the whole run is
//! printed beside it.
//!
//! - **memcpy bandwidth** at 64 KiB, 1 MiB and 8 MiB on one pinned core, two
//!   ways: *cached* copies the same source to the same destination every
//!   time (the best case, where the size fits in the caches); *cold* walks
//!   source and destination through two arenas each twice the size of the
//!   last-level cache, so every copy reads and writes memory (the floor a
//!   CPU-copy transport faces on data not in cache). GB/s counts the bytes
//!   copied (10⁹ B/s), not the read + write traffic.
//! - **cache-line ping-pong** between two threads pinned to the two cores:
//!   one 128-byte aligned atomic that each side in turn waits for and bumps;
//!   half the round trip is the physical floor of one-way latency.
//! - **Unix domain socket ping-pong** of 64-byte messages between two
//!   threads pinned to the same two cores (a stream socket pair, blocking
//!   reads); half the round trip.
//!
//! Floors (issue 6, checked once the transport rows exist): 1 MiB write
//! bandwidth ≥ 0.8× memcpy; 64 B one-way latency ≤ 2× the cache-line floor
//! and ≤ 0.1× the Unix socket; 64 B send rate (burst 32) ≥ 10 M messages/s.

use std::hint::black_box;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ntbdk_bench::{core_pair, describe_machine, pin};

/// Message sizes of the bandwidth rows.
const BW_SIZES: [usize; 3] = [64 << 10, 1 << 20, 8 << 20];
/// Message size of the latency rows.
const MSG: usize = 64;
/// Smallest arena of the cold memcpy rows, whatever the cache.
const MIN_ARENA: usize = 64 << 20;
/// Largest arena (per side) of the cold memcpy rows.
const MAX_ARENA: usize = 1 << 30;
/// Length a timed batch aims at: long enough that reading the clock costs
/// nothing, short enough that most batches see no preemption.
const BATCH_TIME: Duration = Duration::from_micros(20);

#[derive(Parser, Debug)]
#[command(
    about = "Transport baselines: memcpy bandwidth, cache-line and Unix socket ping-pong, pinned"
)]
struct Args {
    /// Operations (copies, round trips) per case. Default: as many as take
    /// about --target-ms, found by a short calibration.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Duration each case aims at when --iters is not given, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    target_ms: u64,
}

/// The timed batches of one case.
struct Samples {
    /// What was measured.
    name: String,
    /// Operations per batch.
    batch: u64,
    /// Duration of each batch.
    times: Vec<Duration>,
}

impl Samples {
    fn ops(&self) -> u64 {
        self.batch * self.times.len() as u64
    }

    /// Nanoseconds per operation in the median batch.
    fn typical_ns(&self) -> f64 {
        let mut t = self.times.clone();
        t.sort_unstable();
        t[t.len() / 2].as_nanos() as f64 / self.batch as f64
    }

    /// Nanoseconds per operation over the whole run.
    fn mean_ns(&self) -> f64 {
        let total: Duration = self.times.iter().sum();
        total.as_nanos() as f64 / self.ops() as f64
    }
}

/// How many operations a case does, in batches of how many.
#[derive(Clone, Copy)]
struct Plan {
    batches: u64,
    batch: u64,
}

/// Sizes a case: probes of `f` (which does `n` operations and returns
/// their duration), doubling `n` until one lasts a tenth of `target`,
/// estimate the cost of one operation; batches then last about
/// [`BATCH_TIME`], and the case `target` (or `iters` operations).
fn plan(mut f: impl FnMut(u64) -> Duration, iters: Option<u64>, target: Duration) -> Plan {
    let probe = (target / 10).max(Duration::from_millis(5));
    let mut n = 1u64;
    let per_op = loop {
        let t = f(n);
        if t >= probe || n >= 1 << 32 {
            break t.as_secs_f64() / n as f64;
        }
        n *= 2;
    };
    let batch = ((BATCH_TIME.as_secs_f64() / per_op) as u64).max(1);
    let ops = iters.unwrap_or(((target.as_secs_f64() / per_op) as u64).max(1));
    Plan {
        batches: ops.div_ceil(batch).max(1),
        batch: batch.min(ops),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (a, b) = core_pair();
    let target = Duration::from_millis(args.target_ms);
    let llc = last_level_cache().unwrap_or(32 << 20);
    let arena = (2 * llc)
        .next_multiple_of(8 << 20)
        .clamp(MIN_ARENA, MAX_ARENA);

    println!("## Transport baselines\n");
    println!("- machine: {}", describe_machine());
    println!("- cores: {a} and {b}; figures are the median batch, mean beside it");
    println!(
        "- cold memcpy arenas: 2 x {} MiB (twice the {} MiB last-level cache)",
        arena >> 20,
        llc >> 20
    );
    println!("- command: cargo run --release -p ntbdk-bench --bin transport");

    // Bandwidth, on core `a`.
    if !pin(a) {
        eprintln!("warning: could not pin to core {a}");
    }
    let mut bw = Vec::new();
    for &size in &BW_SIZES {
        let (src, mut dst) = (vec![0x5au8; size], vec![0xa5u8; size]);
        let name = format!("memcpy {}, cached (same buffers)", size_name(size));
        let mut op = |_: u64| {
            dst.copy_from_slice(black_box(&src));
            black_box(dst.as_mut_slice());
        };
        let p = plan(|n| time_ops(n, &mut op), args.iters, target);
        bw.push((size, sample(name, p, &mut op)));
    }
    {
        let src = vec![0x5au8; arena];
        let mut dst = vec![0xa5u8; arena];
        for &size in &BW_SIZES {
            let slots = (arena / size) as u64;
            let name = format!(
                "memcpy {}, cold ({} MiB arenas)",
                size_name(size),
                arena >> 20
            );
            let mut op = |i: u64| {
                let off = (i % slots) as usize * size;
                dst[off..off + size].copy_from_slice(black_box(&src[off..off + size]));
                black_box(dst.as_mut_slice());
            };
            let p = plan(|n| time_ops(n, &mut op), args.iters, target);
            bw.push((size, sample(name, p, &mut op)));
        }
    }
    // ntbdk rows: added with the transport (write bandwidth at 64 KiB, 1 MiB
    // and 8 MiB between the two cores, pushed into `bw`, then the 1 MiB floor
    // checked against the memcpy rows with `check_floor`).
    print_bandwidth(&bw);

    // One-way latency between cores `a` and `b`.
    let p = plan(
        |n| {
            cacheline_pingpong(
                a,
                b,
                Plan {
                    batches: 1,
                    batch: n,
                },
            )
            .times[0]
        },
        args.iters,
        target,
    );
    let mut lat = vec![cacheline_pingpong(a, b, p)];
    let p = plan(
        |n| {
            unix_socket_pingpong(
                a,
                b,
                Plan {
                    batches: 1,
                    batch: n,
                },
            )
            .expect("Unix socket ping-pong")
            .times[0]
        },
        args.iters,
        target,
    );
    lat.push(unix_socket_pingpong(a, b, p)?);
    // ntbdk rows: added with the transport (64 B one-way latency, pushed
    // into `lat`, with the floors against both rows above; and a 64 B send
    // rate table, burst 32, against the 10 M messages/s floor).
    print_latency(&lat);
    Ok(())
}

/// Runs `op(i)` for `i` in `0..n`; returns how long that took.
fn time_ops(n: u64, op: &mut impl FnMut(u64)) -> Duration {
    let t = Instant::now();
    for i in 0..n {
        op(i);
    }
    t.elapsed()
}

/// Runs `op` `plan.batches × plan.batch` times, timing each batch.
fn sample(name: String, plan: Plan, op: &mut impl FnMut(u64)) -> Samples {
    let mut times = Vec::with_capacity(plan.batches as usize);
    let mut i = 0u64;
    for _ in 0..plan.batches {
        let t = Instant::now();
        for _ in 0..plan.batch {
            op(i);
            i += 1;
        }
        times.push(t.elapsed());
    }
    Samples {
        name,
        batch: plan.batch,
        times,
    }
}

/// One cache line, alone in its 128 bytes (adjacent-line prefetch pairs
/// lines), bumped in turn by the two sides.
#[repr(align(128))]
struct Line(AtomicU64);

/// Spins until `line` holds `want`, yielding now and then in case the two
/// threads share a core.
#[inline]
fn spin_until(line: &AtomicU64, want: u64) {
    let mut spins = 0u32;
    while line.load(Ordering::Acquire) != want {
        std::hint::spin_loop();
        spins += 1;
        if spins == 1 << 16 {
            spins = 0;
            std::thread::yield_now();
        }
    }
}

/// Round trips of a cache line between a thread on core `a` (timed) and one
/// on core `b`.
fn cacheline_pingpong(a: usize, b: usize, plan: Plan) -> Samples {
    let n = plan.batches * plan.batch;
    let line = Line(AtomicU64::new(0));
    let ready = Barrier::new(2);
    let times = std::thread::scope(|s| {
        s.spawn(|| {
            pin(b);
            ready.wait();
            for i in 0..n {
                spin_until(&line.0, 2 * i + 1);
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        pin(a);
        ready.wait();
        let mut times = Vec::with_capacity(plan.batches as usize);
        let mut i = 0;
        for _ in 0..plan.batches {
            let t = Instant::now();
            for _ in 0..plan.batch {
                line.0.store(2 * i + 1, Ordering::Release);
                spin_until(&line.0, 2 * i + 2);
                i += 1;
            }
            times.push(t.elapsed());
        }
        times
    });
    Samples {
        name: format!("cache-line ping-pong, cores {a} <-> {b}"),
        batch: plan.batch,
        times,
    }
}

/// Round trips of a 64-byte message over a Unix stream socket pair between
/// a thread on core `a` (timed) and one on core `b`.
fn unix_socket_pingpong(a: usize, b: usize, plan: Plan) -> Result<Samples> {
    let n = plan.batches * plan.batch;
    let (ping, mut pong) = UnixStream::pair().context("socketpair")?;
    let ready = &Barrier::new(2);
    // Each thread owns its end, so that when one side stops early (an
    // error) its end closes and the other's blocking read returns.
    let times = std::thread::scope(|s| -> Result<Vec<Duration>> {
        let mut ping = ping;
        let echo = s.spawn(move || -> std::io::Result<()> {
            pin(b);
            ready.wait();
            let mut buf = [0u8; MSG];
            for _ in 0..n {
                pong.read_exact(&mut buf)?;
                pong.write_all(&buf)?;
            }
            Ok(())
        });
        pin(a);
        ready.wait();
        let mut buf = [7u8; MSG];
        let mut times = Vec::with_capacity(plan.batches as usize);
        let mut i = 0u64;
        for _ in 0..plan.batches {
            let t = Instant::now();
            for _ in 0..plan.batch {
                buf[0] = i as u8;
                ping.write_all(&buf)?;
                ping.read_exact(&mut buf)?;
                if buf[0] != i as u8 {
                    bail!("the echo of message {i} came back changed");
                }
                i += 1;
            }
            times.push(t.elapsed());
        }
        drop(ping);
        echo.join().expect("echo thread panicked")?;
        Ok(times)
    })?;
    Ok(Samples {
        name: format!("Unix socket ping-pong {MSG} B, cores {a} <-> {b}"),
        batch: plan.batch,
        times,
    })
}

fn print_bandwidth(cases: &[(usize, Samples)]) {
    println!("\n### Bandwidth, single thread (GB/s = 10^9 B/s copied)\n");
    println!("| case | GB/s | us/op | mean GB/s | copies |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (bytes, s) in cases {
        let gbps = |ns: f64| *bytes as f64 / ns;
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} |",
            s.name,
            gbps(s.typical_ns()),
            s.typical_ns() / 1e3,
            gbps(s.mean_ns()),
            s.ops()
        );
    }
}

fn print_latency(cases: &[Samples]) {
    println!("\n### {MSG} B one-way latency (half round trip)\n");
    println!("| case | one-way ns | round trip ns | mean one-way ns | round trips |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for s in cases {
        let rtt = s.typical_ns();
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} |",
            s.name,
            rtt / 2.0,
            rtt,
            s.mean_ns() / 2.0,
            s.ops()
        );
    }
}

/// `64 KiB`, `1 MiB`, …
fn size_name(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Size of the largest cache of CPU 0, from sysfs.
fn last_level_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_size(s.trim()))
        .max()
}

/// `107520K`, `4096K`, `32M` → bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}
