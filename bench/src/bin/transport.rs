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
//! - **two-line ping-pong**: the same with one line each way (core `a`
//!   stores to line x and polls line y, core `b` polls x and stores to y).
//!   A posted-write transport can never share one line between the two
//!   directions: each side writes into the *other* side's memory (its
//!   receive ring) and polls its *own*, so each direction has its own line,
//!   and a round trip moves two lines where the ping-pong above moves one.
//!   This is the floor of any such transport, with no software at all.
//! - **window two-line ping-pong**: the same through the emulated fabric's
//!   windows, with no transport: each side stores through its device's
//!   peer window (bounds, tenure and grant checked, as every posted write
//!   there) and polls its own inbound window. What the windows' memory and
//!   handles add to the plain lines; ntbdk's polled one-sided write
//!   ping-pong adds only the transport's software to it.
//! - **message ring ping-pong, zero software**: two rings (one per
//!   direction) of 256 64-byte slots, each 56 body bytes and an 8-byte tag
//!   (the slot's sequence number, written last with release order); a
//!   message of k slots carries 56·k − 8 bytes after an 8-byte header, so a
//!   64 B message needs 2 slots (2 lines) and 48 B is the largest that fits
//!   one. The writer fills the slots last first; the reader spins on the
//!   first slot's tag (prefetching the second slot meanwhile, on x86-64),
//!   then waits for each further tag and reads the bodies. No queue, no
//!   credits, no completions: what a 64 B message costs when it walks a
//!   ring as ntbdk's queues do, rows for 2 slots and for 1.
//! - **the same, 2 slots reused**: rings one 2-slot message deep, so each
//!   message lands on the two lines of the one before (label `ring one
//!   message deep`): two lines each way, both kept in place, no walk. On
//!   this project's AMD EPYC VMs it reads 1.1-1.2× the
//!   two-line ping-pong where the walked ring reads 1.4-1.6×: moving to a
//!   line not used since the ring's last lap costs more than a second line
//!   (bench/RESULTS.md).
//! - **Unix domain socket ping-pong** of 64-byte messages between two
//!   threads pinned to the same two cores (a stream socket pair, blocking
//!   reads); half the round trip.
//! - **iceoryx2 ping-pong** (built with `--features iceoryx2`; see
//!   `bench/run-iceoryx2.sh`): 64-byte publish/subscribe over iceoryx2's
//!   inter-process services, each thread with its own node, polled; half
//!   the round trip. Label `iceoryx2`.
//!
//! - **ntbdk** rows: two transports on a private emulated fabric in this
//!   process, one per thread, pinned to the same two cores (core `a`
//!   initiates, core `b` serves: it progresses, reposts receives and, for
//!   the latency row, echoes). *write* bandwidth at the same three sizes
//!   (bursts of 32, 128 outstanding), with the default copy engine
//!   (non-temporal stores above the largest cache's size) and with cached
//!   stores only; 64 B one-way latency as half a `send` ping-pong (48 B
//!   too: the largest one-slot send), and the same 64 B ping-pong with both
//!   transports on one core (the software part of the round trip: no line
//!   crosses cores); and the 64 B `send` rate with bursts of 32, counted
//!   where the messages arrive. Bandwidth and rate batches last about 2 ms
//!   each (each drains its pipeline).
//! - **continuous send rate** (`--small-only` only): one run of at least
//!   1 s each, counted where the messages arrive, for 64 B (2 slots) and
//!   48 B (1 slot), beside a **zero-software ring stream** of the same
//!   slots (bursts of 32 written last-first, credits every quarter ring,
//!   as ntbdk), and 64 B once more with one send per burst signaled (as
//!   perftest's `ib_send_bw` signals one in `--cq-mod`; the other rows
//!   signal every send). Each row also gives its 100 ms windows, how often the
//!   sender found no credit and the receiver nothing to take, and the CPU
//!   time and involuntary context switches of both threads: a rate that
//!   collapses while a thread got half its core was preempted, not slow.
//!
//! `--small-only` runs just the latency rows (the cache-line, two-line and
//! ring baselines, then ntbdk's) and the rate row, for profiling; with
//! `--only <SUBSTRING>` it runs only the cases whose label contains the
//! substring, ignoring case (labels: `cache-line`, `two-line`,
//! `window lines`, `ring 2 slots`, `ring one message deep`, `ring 1 slot`,
//! `send 64 B`, `send 48 B`,
//! `one-sided 64 B`, `one-sided polled 64 B`, `one core 64 B`,
//! `one core 48 B`, `one core one-sided polled 64 B`, `empty poll`,
//! `empty poll, 4 ports`, `rate`,
//! `one-sided rate`, `one core rate`, `continuous ring`, `continuous send`;
//! e.g. `--only "one core"` or `--only continuous`). `one core one-sided
//! polled 64 B` is the polled one-sided ping-pong's software alone (both
//! ends on one core, each write found by the other end's first load).
//! `empty poll` is one `poll_completions` that finds nothing on a
//! connected transport: what a waiting poller pays per turn; `empty poll,
//! 4 ports` the same on a fabric with two ports empty (hosts missing,
//! whose handshakes the poll keeps looking after).
//! `one core rate` is the send rate's software
//! alone: bursts of 32 sends from one transport to another on one core,
//! the receiver polling after each burst (steady under callgrind).
//!
//! `--paired N` measures the later latency floors (the polled one-sided
//! write ping-pong ≤ 1.3× the two-line, the 64 B send ping-pong ≤ 1.5×) as
//! ratios within repetitions: N repetitions of the two-line row, the
//! window two-line row, the two zero-software 2-slot rows (reused and
//! walked) and both ntbdk rows back to back, the coupling probed before
//! each row and after the last, each floor's median over the repetitions
//! (split by coupling when it changed; a ratio whose probes disagree counts
//! in neither half), and beside them ratios with no floor: the polled write
//! over the window two-line row (what the transport's software adds), the
//! zero-software rows over the two-line (what a 64 B message's lines cost,
//! kept hot or walked), and the send over the reused row.
//!
//! Every latency row and every continuous run carries the cores' coupling
//! (a short cache-line ping-pong) measured just before and just after it,
//! marked when the two differ, and every run ends with the coupling at its
//! start and its end, with a warning when it changed: on a shared VM the two
//! vCPUs move between sharing a physical core and not, and rows measured on
//! either side of such a move are not comparable.
//!
//! Floors, checked at the end as same-run ratios: 1 MiB write bandwidth
//! ≥ 0.9× memcpy of cached buffers (issue 15) and ≥ 0.8× of cold ones
//! (issue 6, where a cold copy is the slower peer); from issue 6, 64 B
//! one-way latency ≤ 2× the cache-line floor
//! and ≤ 0.1× the Unix socket; 64 B send rate (burst 32) ≥ 10 M messages/s.
//! The 64 B latency is also printed as a multiple of the two-line row and
//! the zero-software 2-slot rows, for information only: a 64 B message
//! plus its header fills two lines, which cost 1.1-1.2× the two-line
//! ping-pong's one when they are reused and 1.4-1.6× when the message
//! walks a ring (depending on the cores' coupling).

use std::hint::black_box;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use crossbeam_utils::CachePadded;
use ntbdk_bench::{
    Line, PairedFloor, Row, check_floor, command_line, core_pair, coupling_changed, coupling_ns,
    describe_machine, median_f64, pin, print_floor_header, print_paired, report_coupling,
    send_burst, spin_until, spin_until_with, thread_cpu, with_coupling,
};
use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};
use ntbdk_pmd::transport::{
    Access, Completion, Config, DataQueues, DirectWr, Geometry, OpKind, Qp, RecvWr, RegionKey,
    RemoteAddr, Sge, Transport, TransportError, WriteWr, wire,
};

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
    about = "ntbdk transport vs its baselines (memcpy; cache-line, two-line, zero-software ring and Unix socket ping-pong), pinned"
)]
struct Args {
    /// Operations (copies, round trips) per case, rounded up to whole timed
    /// batches. Default: as many as take about --target-ms, found by a short
    /// calibration.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Duration each case aims at when --iters is not given, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    target_ms: u64,
    /// Run only the latency cases (the cache-line, two-line and ring
    /// baselines, then ntbdk's) and the ntbdk send-rate case, skipping the
    /// bandwidth table and the floor check; for profiling the small-message
    /// path.
    #[arg(long)]
    small_only: bool,
    /// With --small-only: run only the cases whose label contains SUBSTRING
    /// (case-insensitive). Labels: "cache-line", "two-line", "window lines", "ring 2 slots",
    /// "ring one message deep", "ring 1 slot", "send 64 B", "send 48 B", "one-sided 64 B",
    /// "one-sided polled 64 B", "one core 64 B", "one core 48 B",
    /// "one core one-sided polled 64 B", "empty poll", "empty poll, 4 ports",
    /// "rate", "one-sided rate", "one core rate",
    /// "continuous ring", "continuous send", and "iceoryx2" when built
    /// with that feature (e.g.
    /// --only "one core", --only continuous).
    #[arg(long, value_name = "SUBSTRING", requires = "small_only")]
    only: Option<String>,
    /// Measure the latency floors as paired ratios instead: N repetitions,
    /// each the two-line ping-pong (plain memory, then through the fabric's
    /// windows), the zero-software 64 B message (two lines reused, and
    /// walking a ring), ntbdk's polled one-sided write ping-pong and 64 B
    /// send ping-pong, back to back (each about --target-ms), the cores'
    /// coupling probed between rows; prints every repetition and each
    /// ratio's median within repetitions, with its range.
    #[arg(long, value_name = "N", conflicts_with = "small_only",
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    paired: Option<u64>,
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

    /// Nanoseconds per operation in the median batch (the mean of the two
    /// middle ones for an even count).
    fn typical_ns(&self) -> f64 {
        let mut t: Vec<f64> = self.times.iter().map(|d| d.as_nanos() as f64).collect();
        median_f64(&mut t).unwrap_or(0.0) / self.batch as f64
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

    println!("## Transport (ntbdk-pmd) and its baselines\n");
    println!("- machine: {}", describe_machine());
    println!("- cores: {a} and {b}; figures are the median batch, mean beside it");
    println!(
        "- cold memcpy arenas: 2 x {} MiB (twice the {} MiB last-level cache)",
        arena >> 20,
        llc >> 20
    );
    println!("- command: `{}`", command_line("transport"));

    // Bandwidth, on core `a`.
    if !pin(a) {
        eprintln!("warning: could not pin to core {a}");
    }
    if let Some(reps) = args.paired {
        return paired(a, b, reps, args.iters, target);
    }
    let coupling = coupling_ns(a, b);
    if args.small_only {
        let run = small_only(a, b, &args, target);
        report_coupling(coupling, coupling_ns(a, b));
        return run;
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
    // ntbdk rows: write bandwidth at the same sizes, core `a` writing into a
    // region that a thread on core `b` serves (two transports on a private
    // emulated fabric, one process).
    let ntb_bw = ntb_write_bw(a, b, &BW_SIZES, None, args.iters, target)?;
    bw.extend(ntb_bw);
    // The same with the copy engine's non-temporal stores off: what the
    // default threshold (the largest cache's size) costs or saves here.
    let ntb_bw = ntb_write_bw(a, b, &BW_SIZES, Some(usize::MAX), args.iters, target)?;
    bw.extend(ntb_bw);
    print_bandwidth(&bw);

    // One-way latency between cores `a` and `b`: the cache-line floor (one
    // line both ways), then the floors of a posted-write transport with no
    // software at all (one line each way; rings of 64-byte slots).
    let mut lat = Latencies::default();
    for (_, case) in baseline_cases(a, b, args.iters, target) {
        lat.run(a, b, case)?;
    }
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
    lat.run(a, b, || unix_socket_pingpong(a, b, p))?;
    #[cfg(feature = "iceoryx2")]
    lat.run(a, b, || iceoryx2_latency(a, b, args.iters, target))?;
    // ntbdk rows: 64 B one-way latency (a send ping-pong: the serving thread
    // echoes each message), and the 64 B send rate with bursts of 32.
    lat.run(a, b, || ntb_send_latency(a, b, MSG, args.iters, target))?;
    // For comparison: the largest send that fits one queue slot (inline).
    lat.run(a, b, || ntb_send_latency(a, b, 48, args.iters, target))?;
    // What of the 64 B round trip is software: the same on one core, where
    // no cache line crosses between cores.
    lat.run(a, b, || ntb_send_one_core(a, MSG, args.iters, target))?;
    lat.print();
    let lat = lat.rows;
    let rate = ntb_send_rate(a, b, args.iters, target)?;
    print_rate(&rate);

    // Floors of issue 6, all as throughput ratios (a latency at most k
    // times another is a rate at least 1/k times the other's).
    print_floor_header();
    let find = |rows: &[(usize, Samples)], prefix: &str, size: usize| {
        rows.iter()
            .find(|(s, r)| *s == size && r.name.starts_with(prefix))
            .map(|(_, r)| as_row(r))
            .expect("row measured above")
    };
    let ours = find(&bw, "ntbdk write 1 MiB (default", 1 << 20);
    let mut met = check_floor(
        "1 MiB write >= 0.9x memcpy (cached)",
        &ours,
        &find(&bw, "memcpy 1 MiB, cached", 1 << 20),
        0.9,
    );
    met &= check_floor(
        "1 MiB write >= 0.8x memcpy (cold)",
        &ours,
        &find(&bw, "memcpy 1 MiB, cold", 1 << 20),
        0.8,
    );
    let find_lat = |prefix: &str| {
        lat.iter()
            .find(|s| s.name.starts_with(prefix))
            .map(as_row)
            .expect("row measured above")
    };
    let (cl, sock, ntb) = (
        find_lat(CACHE_LINE),
        find_lat("Unix socket ping-pong"),
        find_lat(&ntb_latency_prefix(MSG)),
    );
    met &= check_floor("64 B latency <= 2x cache line", &ntb, &cl, 0.5);
    met &= check_floor("64 B latency <= 0.1x Unix socket", &ntb, &sock, 10.0);
    let ten_m = Row {
        name: "10 M messages/s".into(),
        ops: 10_000_000,
        elapsed: Duration::from_secs(1),
    };
    met &= check_floor("64 B send rate >= 10 M/s", &as_row(&rate), &ten_m, 1.0);
    // What no ring transport can beat here: not floors, not in `met`.
    println!();
    print_latency_ratios(
        &lat,
        &[
            (&ring_prefix(2), "the zero-software 2-slot ring"),
            (
                &reused_prefix(),
                "the zero-software message on reused lines",
            ),
            (TWO_LINE, "the two-line ping-pong"),
            (ICEORYX2, "iceoryx2's publish/subscribe ping-pong"),
        ],
    );
    println!(
        "\n{}",
        if met {
            "every floor of this table met (the latency floors against the two-line \
             ping-pong are checked paired: --paired N)"
        } else {
            "at least one floor of this table MISSED (see bench/RESULTS.md for why; the \
             latency floors against the two-line ping-pong are checked paired: --paired N)"
        }
    );
    report_coupling(coupling, coupling_ns(a, b));
    Ok(())
}

/// The latency floors as paired ratios (`--paired`): `reps` repetitions of
/// the two-line ping-pong, its window form, the zero-software 2-slot rows
/// (reused and walked), the polled one-sided write ping-pong and the 64 B
/// send ping-pong, back to back, each floor's ratio taken within each
/// repetition (the machine drifts between repetitions, and the cores'
/// coupling, probed between them, can change several-fold).
fn paired(a: usize, b: usize, reps: u64, iters: Option<u64>, target: Duration) -> Result<()> {
    println!("\n### Latency floors, paired: {reps} repetitions, cores {a} <-> {b}, one-way ns\n");
    println!(
        "The cores' coupling is probed before the first row and after each; a ratio is \
         marked (changed) when the probes of its repetition differ. The rows run in the \
         order window two-line, one-sided polled, two-line, send, reused, walked (each \
         floor's two rows side by side) in odd repetitions and in the reverse order in \
         even ones, so that neither side of a ratio always runs first.\n"
    );
    println!(
        "| repetition | two-line | window two-line | 2 slots reused, zero software | 2-slot ring walked, zero software | one-sided polled 64 B | send 64 B | coupling ns before and after each row, in run order |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    let baseline = |wanted: &str| {
        let (_, case) = baseline_cases(a, b, iters, target)
            .into_iter()
            .find(|(label, _)| *label == wanted)
            .expect("a baseline case");
        case()
    };
    let first = coupling_ns(a, b);
    let mut last = first;
    let mut polled = PairedFloor::new(
        format!("{MSG} B one-sided write ping-pong (polled) / two-line"),
        "<= 1.3x",
    );
    let mut send = PairedFloor::new(format!("{MSG} B send ping-pong / two-line"), "<= 1.5x");
    // Not a floor: how much of the polled write's time the windows' memory
    // and handles take, the rest being the transport's software.
    let mut over_windows = PairedFloor::new(
        format!("{MSG} B one-sided write ping-pong (polled) / window two-line"),
        "(no floor)",
    );
    // Not floors: what a 64 B message's two lines cost with no software,
    // reused and walked, and the send over the first.
    let mut reused = PairedFloor::new(
        format!("{MSG} B message on 2 reused slots, zero software / two-line"),
        "(no floor)",
    );
    let mut walked = PairedFloor::new(
        format!("{MSG} B message walking a 2-slot ring, zero software / two-line"),
        "(no floor)",
    );
    let mut over_reused = PairedFloor::new(
        format!("{MSG} B send ping-pong / 2 reused slots, zero software"),
        "(no floor)",
    );
    // The walk's own cost: the two zero-software rows, run side by side.
    let mut walk = PairedFloor::new(
        format!("{MSG} B message walking a 2-slot ring / on 2 reused slots, zero software"),
        "(no floor)",
    );
    for rep in 0..reps {
        // One-way ns of each row, indexed as the table's columns, run in
        // an order that keeps each floor's two rows (and the polled
        // write's window row) side by side: window, polled, two-line,
        // send, reused, walked, forwards or backwards; the coupling probed
        // before the first and after each.
        let mut order: [usize; 6] = [1, 4, 0, 5, 2, 3];
        if rep % 2 == 1 {
            order.reverse();
        }
        let mut ns = [0.0f64; 6];
        let mut probes = vec![last];
        for k in order {
            ns[k] = match k {
                0 => baseline("two-line")?,
                1 => window_lines_pingpong(a, b, iters, target)?,
                2 => baseline("ring one message deep")?,
                3 => baseline("ring 2 slots")?,
                4 => ntb_polled_latency(a, b, iters, target)?,
                _ => ntb_send_latency(a, b, MSG, iters, target)?,
            }
            .typical_ns()
                / 2.0;
            probes.push(coupling_ns(a, b));
        }
        last = probes[6];
        let [floor, windows, lines, ring, p, s] = ns;
        // The probes from just before the earlier of two rows to just after
        // the later: probe j was taken before run j.
        let at = |k: usize| order.iter().position(|&o| o == k).unwrap_or(0);
        let span_of = |x: usize, y: usize| {
            let (lo, hi) = (at(x).min(at(y)), at(x).max(at(y)) + 1);
            probes[lo..=hi]
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(lo, hi), &c| {
                    (lo.min(c), hi.max(c))
                })
        };
        let (pa, sa, wa) = (span_of(0, 4), span_of(0, 5), span_of(1, 4));
        let (la, ra, sl) = (span_of(0, 2), span_of(0, 3), span_of(2, 5));
        let mark = |(lo, hi): (f64, f64)| {
            if coupling_changed(lo, hi) {
                " (changed)"
            } else {
                ""
            }
        };
        let around: Vec<String> = probes.iter().map(|c| format!("{c:.0}")).collect();
        println!(
            "| {} | {floor:.1} | {windows:.1} | {lines:.1} ({:.2}x{}) | {ring:.1} ({:.2}x{}) | {p:.1} ({:.2}x{}) | {s:.1} ({:.2}x{}) | {} |",
            rep + 1,
            lines / floor,
            mark(la),
            ring / floor,
            mark(ra),
            p / floor,
            mark(pa),
            s / floor,
            mark(sa),
            around.join(", "),
        );
        polled.push(p / floor, pa);
        send.push(s / floor, sa);
        over_windows.push(p / windows, wa);
        reused.push(lines / floor, la);
        walked.push(ring / floor, ra);
        over_reused.push(s / lines, sl);
        walk.push(ring / lines, span_of(2, 3));
    }
    print_paired(&[
        polled,
        send,
        over_windows,
        reused,
        walked,
        over_reused,
        walk,
    ]);
    report_coupling(first, last);
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

/// Start of the cache-line ping-pong row's name.
const CACHE_LINE: &str = "cache-line ping-pong";
/// Start of the iceoryx2 row's name (built with the `iceoryx2` feature).
const ICEORYX2: &str = "iceoryx2 publish";
/// Start of the two-line ping-pong row's name.
const TWO_LINE: &str = "two-line ping-pong";
/// Start of the row of the two-line ping-pong through the fabric's windows.
const WINDOW_LINES: &str = "window two-line ping-pong";

/// The baseline latency cases of core `a` and `b`, each with the label
/// `--only` matches: the cache-line ping-pong, the two-line one (plain
/// and through the fabric's windows) and the zero-software rings (2 slots
/// walked, 2 slots reused, 1 slot), calibrated alike.
fn baseline_cases<'a>(
    a: usize,
    b: usize,
    iters: Option<u64>,
    target: Duration,
) -> Vec<(&'static str, Case<'a>)> {
    let case = move |run: fn(usize, usize, Plan) -> Samples| -> Case<'a> {
        Box::new(move || Ok(calibrated(|p| run(a, b, p), iters, target)))
    };
    vec![
        ("cache-line", case(cacheline_pingpong)),
        ("two-line", case(two_line_pingpong)),
        (
            "window lines",
            Box::new(move || window_lines_pingpong(a, b, iters, target)),
        ),
        (
            "ring 2 slots",
            case(|a, b, p| slot_ring_pingpong(a, b, 2, false, p)),
        ),
        (
            "ring one message deep",
            case(|a, b, p| slot_ring_pingpong(a, b, 2, true, p)),
        ),
        (
            "ring 1 slot",
            case(|a, b, p| slot_ring_pingpong(a, b, 1, false, p)),
        ),
    ]
}

/// 64 B one-way latency as half an iceoryx2 publish/subscribe ping-pong
/// (inter-process services, polled) between cores `a` and `b`, calibrated
/// like the other rows: the peer row of a shared-memory IPC library.
#[cfg(feature = "iceoryx2")]
fn iceoryx2_latency(a: usize, b: usize, iters: Option<u64>, target: Duration) -> Result<Samples> {
    use ntbdk_bench::iceoryx2_pingpong::{MSG as ICE_MSG, pingpong};
    // A failed probe ends the calibration; the run below reports the error.
    let p = plan(
        |n| pingpong(a, b, n, 1).map_or(Duration::MAX, |t| t[0]),
        iters,
        target,
    );
    Ok(Samples {
        name: format!(
            "{ICEORYX2}/subscribe ping-pong {ICE_MSG} B (ipc service, polled), cores {a} <-> {b}"
        ),
        batch: p.batch,
        times: pingpong(a, b, p.batch, p.batches)?,
    })
}

/// A latency case, run when called.
type Case<'a> = Box<dyn FnOnce() -> Result<Samples> + 'a>;

/// Runs `run` with the plan [`plan`] finds for it (probes of one batch).
fn calibrated(run: impl Fn(Plan) -> Samples, iters: Option<u64>, target: Duration) -> Samples {
    let p = plan(
        |n| {
            run(Plan {
                batches: 1,
                batch: n,
            })
            .times[0]
        },
        iters,
        target,
    );
    run(p)
}

/// Round trips between a thread on core `a`, timed, where `ping(i)` sends
/// message `i` and waits for its answer, and one on core `b`, where
/// `pong(i)` waits for message `i` and answers it; both start together.
fn pinned_pingpong(
    name: String,
    a: usize,
    b: usize,
    plan: Plan,
    mut ping: impl FnMut(u64),
    mut pong: impl FnMut(u64) + Send,
) -> Samples {
    let n = plan.batches * plan.batch;
    let ready = &Barrier::new(2);
    let times = std::thread::scope(|s| {
        s.spawn(move || {
            pin(b);
            ready.wait();
            for i in 0..n {
                pong(i);
            }
        });
        pin(a);
        ready.wait();
        let mut times = Vec::with_capacity(plan.batches as usize);
        let mut i = 0;
        for _ in 0..plan.batches {
            let t = Instant::now();
            for _ in 0..plan.batch {
                ping(i);
                i += 1;
            }
            times.push(t.elapsed());
        }
        times
    });
    Samples {
        name,
        batch: plan.batch,
        times,
    }
}

/// Round trips of a cache line between a thread on core `a` (timed) and one
/// on core `b`: one line both ways.
fn cacheline_pingpong(a: usize, b: usize, plan: Plan) -> Samples {
    let line = Line(AtomicU64::new(0));
    pinned_pingpong(
        format!("{CACHE_LINE}, cores {a} <-> {b}"),
        a,
        b,
        plan,
        |i| {
            line.0.store(2 * i + 1, Ordering::Release);
            spin_until(&line.0, 2 * i + 2);
        },
        |i| {
            spin_until(&line.0, 2 * i + 1);
            line.0.store(2 * i + 2, Ordering::Release);
        },
    )
}

/// Round trips between a thread on core `a` (timed) and one on core `b`
/// with one line each way, as a posted-write transport must have: `a`
/// stores to x and polls y, `b` polls x and stores to y.
fn two_line_pingpong(a: usize, b: usize, plan: Plan) -> Samples {
    let (x, y) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    pinned_pingpong(
        format!("{TWO_LINE} (one line each way: the posted-write floor), cores {a} <-> {b}"),
        a,
        b,
        plan,
        |i| {
            x.0.store(i + 1, Ordering::Release);
            spin_until(&y.0, i + 1);
        },
        |i| {
            spin_until(&x.0, i + 1);
            y.0.store(i + 1, Ordering::Release);
        },
    )
}

/// Byte offset of the line each side polls in its own window in
/// [`window_lines_pingpong`] (any line: no transport lays the window out).
const WINDOW_LINE_AT: usize = 64 << 10;

/// The two-line ping-pong through the emulated fabric's windows, with no
/// transport: each side stores into the other's inbound window through its
/// device's peer window (with the checks every posted write makes there:
/// bounds, our tenure, the peer's grant) and polls a line of its own
/// window. What the windows' memory and handles cost over the plain lines
/// of the two-line row: the floor of ntbdk's polled one-sided write ping-pong,
/// whose software is the only thing it adds to this row. Calibrated like
/// the other rows, on one fabric made for it.
fn window_lines_pingpong(
    a: usize,
    b: usize,
    iters: Option<u64>,
    target: Duration,
) -> Result<Samples> {
    with_fabric(|fabric, dir| {
        let join = |slot| -> Result<EmuDevice> {
            Ok(EmuDevice::join(
                fabric,
                &DeviceConfig {
                    slot: Some(slot),
                    fabric: fabric.config().clone(),
                    dir: Some(dir.to_path_buf()),
                    ..DeviceConfig::default()
                },
            )?)
        };
        let (d0, d1) = (join(0)?, join(1)?);
        let (to_b, mine) = (d0.peer_window(1, 0)?, d0.local_window(0)?);
        // Values rise across the calibration's runs, so a line never still
        // holds the value a new run waits for.
        let next = std::cell::Cell::new(0u64);
        let failed = std::cell::Cell::new(None);
        let run = |plan: Plan| -> Result<Samples> {
            let (to_a, theirs) = (d1.peer_window(0, 0)?, d1.local_window(0)?);
            let base = next.get();
            next.set(base + plan.batches * plan.batch);
            let wait = |w: &ntbdk_pmd::hw::LocalWindow, want: u64| {
                let mut spins = 0u32;
                while w.load_u64(WINDOW_LINE_AT).ok() != Some(want) {
                    std::hint::spin_loop();
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(1 << 16) {
                        std::thread::yield_now();
                    }
                }
            };
            Ok(pinned_pingpong(
                format!(
                    "{WINDOW_LINES} (no transport: the polled one-sided write's floor), cores {a} <-> {b}"
                ),
                a,
                b,
                plan,
                |i| {
                    let v = base + i + 1;
                    to_b.write_u64(WINDOW_LINE_AT, v)
                        .expect("a line inside the window");
                    wait(&mine, v);
                },
                move |i| {
                    let v = base + i + 1;
                    wait(&theirs, v);
                    to_a.write_u64(WINDOW_LINE_AT, v)
                        .expect("a line inside the window");
                },
            ))
        };
        let samples = calibrated(
            |p| {
                run(p).unwrap_or_else(|e| {
                    failed.set(Some(e));
                    Samples {
                        name: String::new(),
                        batch: p.batch,
                        times: vec![Duration::MAX; p.batches as usize],
                    }
                })
            },
            iters,
            target,
        );
        match failed.into_inner() {
            Some(e) => Err(e.context("the two-line ping-pong through the fabric's windows")),
            None => Ok(samples),
        }
    })
}

/// Body bytes of a ring slot (the rest of its 64 is the tag).
const SLOT_BODY: usize = 56;
/// Bytes of header a ring message carries in its first slot's body.
const RING_HEADER: usize = 8;
/// Slots per ring of the zero-software ring rows (as [`Q_DEPTH`]).
const RING_DEPTH: usize = 256;

/// One 64-byte slot of a zero-software ring: 56 body bytes, then a tag
/// holding the sequence number of the slot's last write (stored last,
/// with release order, so a reader that sees it sees the body).
#[repr(C, align(64))]
struct Slot {
    body: [AtomicU64; SLOT_BODY / 8],
    tag: AtomicU64,
}

/// A ring of slots (most rows: [`RING_DEPTH`]), one direction of a ring
/// ping-pong, with its depth's mask (a power of two: no division per slot).
struct SlotRing {
    slots: Box<[Slot]>,
    mask: usize,
}

impl SlotRing {
    /// A ring of [`RING_DEPTH`] slots.
    fn new() -> Self {
        Self::with_depth(RING_DEPTH)
    }

    /// A ring of `depth` slots, a power of two.
    fn with_depth(depth: usize) -> Self {
        assert!(depth.is_power_of_two(), "{depth} slots: not a power of two");
        let slot = || Slot {
            body: Default::default(),
            // No sequence number: slot 0 is not taken for message 0.
            tag: AtomicU64::new(u64::MAX),
        };
        Self {
            slots: (0..depth).map(|_| slot()).collect(),
            mask: depth - 1,
        }
    }

    fn slot(&self, seq: u64) -> &Slot {
        &self.slots[seq as usize & self.mask]
    }

    /// Writes the `k`-slot message at sequence number `seq` (words derived
    /// from `word`), last slot first, so that the first slot's tag, which
    /// the reader waits for, comes last.
    #[inline]
    fn write(&self, seq: u64, k: u64, word: u64) {
        for j in (0..k).rev() {
            let slot = self.slot(seq + j);
            for (w, body) in (0u64..).zip(&slot.body) {
                body.store(word ^ w, Ordering::Relaxed);
            }
            slot.tag.store(seq + j, Ordering::Release);
        }
    }

    /// Waits for the `k`-slot message at sequence number `seq` and returns
    /// its body words folded into one.
    #[inline]
    fn read(&self, seq: u64, k: u64) -> u64 {
        let first = self.slot(seq);
        let second = (k > 1).then(|| self.slot(seq + 1));
        // Fetch the second line while waiting for the first: the writer
        // wrote it before, so it is likely there already.
        spin_until_with(&first.tag, seq, || {
            if let Some(s) = second {
                prefetch(s);
            }
        });
        let fold = |acc: u64, slot: &Slot| {
            slot.body
                .iter()
                .fold(acc, |acc, w| acc.wrapping_add(w.load(Ordering::Relaxed)))
        };
        let mut acc = fold(0, first);
        for j in 1..k {
            let slot = self.slot(seq + j);
            spin_until(&slot.tag, seq + j);
            acc = fold(acc, slot);
        }
        acc
    }
}

/// Asks for `slot`'s line in cache (a hint: nothing on other targets).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch(slot: &Slot) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch is a hint that never faults nor changes memory,
    // and the pointer comes from a live reference anyway.
    unsafe { _mm_prefetch::<_MM_HINT_T0>((slot as *const Slot).cast()) }
}

/// Asks for `slot`'s line in cache (a hint: nothing on other targets).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn prefetch(_slot: &Slot) {}

/// Start of the name of the zero-software ring row with `k`-slot messages:
/// a 64 B message, or the largest that fits `k` slots if less.
fn ring_prefix(k: usize) -> String {
    let bytes = (SLOT_BODY * k - RING_HEADER).min(MSG);
    let slots = if k == 1 { "slot" } else { "slots" };
    format!("{bytes} B message ring ping-pong, {k} {slots}, zero software")
}

/// Start of the name of the zero-software row whose rings hold one 2-slot
/// message each: a 64 B message whose two lines are reused every time.
fn reused_prefix() -> String {
    format!("{MSG} B message ping-pong, 2 slots reused, zero software")
}

/// Round trips of `k`-slot messages over two rings of 64-byte slots, one
/// each way, between a thread on core `a` (timed) and one on core `b`
/// that echoes each message: what a ring transport costs with no software
/// (no queue state, no credits, no completions). The rings hold
/// [`RING_DEPTH`] slots, walked as ntbdk's queues are, or, with `reused`,
/// one message: each message then lands on the lines of the last one.
fn slot_ring_pingpong(a: usize, b: usize, k: usize, reused: bool, plan: Plan) -> Samples {
    assert!(
        (1..=RING_DEPTH).contains(&k) && RING_DEPTH.is_multiple_of(k),
        "{k} slots per message"
    );
    let depth = if reused { k } else { RING_DEPTH };
    let name = if reused {
        format!(
            "{} (rings one message deep: the lines of a {MSG} B message, no walk), cores {a} <-> {b}",
            reused_prefix()
        )
    } else {
        let what = if k * SLOT_BODY - RING_HEADER >= MSG {
            format!("the lines of a {MSG} B message walking a {RING_DEPTH}-slot ring")
        } else {
            "the largest one-slot message".to_string()
        };
        format!("{} ({what}), cores {a} <-> {b}", ring_prefix(k))
    };
    let (there, back) = (SlotRing::with_depth(depth), SlotRing::with_depth(depth));
    let k = k as u64;
    pinned_pingpong(
        name,
        a,
        b,
        plan,
        |i| {
            there.write(i * k, k, i);
            black_box(back.read(i * k, k));
        },
        |i| {
            let got = there.read(i * k, k);
            back.write(i * k, k, black_box(got));
        },
    )
}

/// `k`-slot messages streamed for `run` over one ring of 64-byte slots from
/// core `a` to core `b`, in bursts of [`BURST`] written last-first (as
/// ntbdk's `post_sends`), the reader crediting its progress back every
/// quarter ring (as ntbdk): the message rate of a ring with no software,
/// counted where the messages arrive (the credited progress). What an
/// ntbdk send rate of `k`-slot messages is to be compared with.
fn slot_ring_stream(a: usize, b: usize, k: usize, run: Duration) -> Sustained {
    let k = k as u64;
    let depth = RING_DEPTH as u64;
    let burst = BURST as u64 * k;
    assert!(
        burst <= depth,
        "a burst of {BURST} {k}-slot messages fits the ring"
    );
    let ring = SlotRing::new();
    let credit = CachePadded::new(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let (ring, credit, stop) = (&ring, &credit, &stop);
    std::thread::scope(|s| {
        let reader = s.spawn(move || {
            pin(b);
            let cpu0 = thread_cpu();
            let (mut seq, mut credited, mut polls, mut empty) = (0u64, 0u64, 0u64, 0u64);
            let mut acc = 0u64;
            loop {
                polls += 1;
                let first = ring.slot(seq);
                if first.tag.load(Ordering::Acquire) != seq {
                    empty += 1;
                    if empty.is_multiple_of(256) && stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if k > 1 {
                        prefetch(ring.slot(seq + 1));
                    }
                    std::hint::spin_loop();
                    continue;
                }
                for j in 0..k {
                    let slot = ring.slot(seq + j);
                    spin_until(&slot.tag, seq + j);
                    acc = slot
                        .body
                        .iter()
                        .fold(acc, |acc, w| acc.wrapping_add(w.load(Ordering::Relaxed)));
                }
                seq += k;
                if seq - credited >= depth / 4 {
                    credit.store(seq, Ordering::Release);
                    credited = seq;
                }
            }
            black_box(acc);
            let cpu = thread_cpu();
            (polls, empty, (cpu.0 - cpu0.0, cpu.1 - cpu0.1))
        });
        pin(a);
        let cpu0 = thread_cpu();
        let (mut seq, mut seen, mut posts, mut busy) = (0u64, 0u64, 0u64, 0u64);
        // Timed as ntbdk's sender is (around one burst in eight).
        let (mut writing, mut written) = (Duration::ZERO, 0u64);
        let mut clock = Windows::start(0);
        let (received, elapsed) = loop {
            posts += 1;
            if seq + burst - seen > depth {
                seen = credit.load(Ordering::Acquire);
            }
            if seq + burst - seen > depth {
                busy += 1;
            } else {
                let t = posts.is_multiple_of(WRITE_TIMED_EVERY).then(Instant::now);
                for m in (0..BURST as u64).rev() {
                    ring.write(seq + m * k, k, seq + m);
                }
                if let Some(t) = t {
                    writing += t.elapsed();
                    written += BURST as u64;
                }
                seq += burst;
            }
            if posts.is_multiple_of(64) && clock.due(Instant::now()) {
                let got = credit.load(Ordering::Acquire) / k;
                let elapsed = clock.close(Instant::now(), got);
                if elapsed >= run {
                    break (got, elapsed);
                }
            }
        };
        let cpu = thread_cpu();
        stop.store(true, Ordering::Relaxed);
        let (polls, empty, reader_cpu) = reader.join().expect("ring reader panicked");
        Sustained {
            name: format!(
                "{} B message ring stream, {k} slot{}, zero software, burst {BURST}, cores {a} -> {b} (credited)",
                (SLOT_BODY * k as usize - RING_HEADER).min(MSG),
                if k == 1 { "" } else { "s" }
            ),
            received,
            elapsed,
            windows: clock.rates,
            posts,
            busy,
            server_polls: polls,
            server_empty: empty,
            sender_cpu: (cpu.0 - cpu0.0, cpu.1 - cpu0.1),
            server_cpu: reader_cpu,
            writing,
            written,
        }
    })
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

/// The latency rows of a run, each with the cores' coupling measured just
/// before and just after it: a row is comparable only with rows measured
/// at the same coupling (the vCPUs of a shared VM move between one
/// physical core and two within minutes).
#[derive(Default)]
struct Latencies {
    /// The rows, in the order they ran.
    rows: Vec<Samples>,
    /// Each row's coupling (one-way ns) before and after it.
    coupling: Vec<(f64, f64)>,
}

impl Latencies {
    /// Runs one latency case between two probes of the coupling.
    fn run(&mut self, a: usize, b: usize, case: impl FnOnce() -> Result<Samples>) -> Result<()> {
        let (row, coupling) = with_coupling(a, b, case);
        self.rows.push(row?);
        self.coupling.push(coupling);
        Ok(())
    }

    /// The latency table; a row whose coupling changed while it ran is
    /// marked, as its figure mixes two regimes.
    fn print(&self) {
        println!("\n### {MSG} B one-way latency (half round trip)\n");
        println!(
            "| case | one-way ns | round trip ns | mean one-way ns | round trips | \
             coupling ns before / after |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | --- |");
        for (s, &(before, after)) in self.rows.iter().zip(&self.coupling) {
            let rtt = s.typical_ns();
            let changed = if coupling_changed(before, after) {
                " (changed)"
            } else {
                ""
            };
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {} | {before:.0} / {after:.0}{changed} |",
                s.name,
                rtt / 2.0,
                rtt,
                s.mean_ns() / 2.0,
                s.ops()
            );
        }
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

// ---- ntbdk rows ----

/// Slots per message queue of the ntbdk rows (as `ntb-perf`).
const Q_DEPTH: u32 = 256;
/// Eager buffers per sender.
const EAGER_COUNT: u32 = 128;
/// Bytes per eager buffer.
const EAGER_SIZE: u32 = 4096;
/// Receives kept posted.
const RECVS: u64 = 256;
/// Writes outstanding at once in the bandwidth rows (perftest's tx-depth).
const TX_DEPTH: usize = 128;
/// Work requests per post call.
const BURST: usize = 32;
/// A timed batch of the ntbdk bandwidth and rate rows lasts about this long
/// (each batch drains its pipeline, so it must be long against a round trip).
const NTB_BATCH_TIME: Duration = Duration::from_millis(2);

/// What the serving thread does besides progressing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serve {
    /// Serve writes, repost receives.
    Passive,
    /// Also answer each message with a send of the same length.
    EchoSend,
    /// Answer each one-sided write with immediate by one of the same
    /// length into the initiator's region (the immediate is its key).
    EchoWriteImm,
    /// Learn the initiator's region key from a first write with immediate,
    /// then poll the last byte of a 64-byte message in our region and
    /// answer each new value with a one-sided write of the same bytes (as
    /// `ib_write_lat`).
    EchoPolled,
}

/// The initiator's side of an ntbdk session between two threads.
struct Side {
    t: Transport,
    qp: Qp,
    /// Our data region (source of writes).
    data: RegionKey,
    /// The peer's data region (target of writes).
    remote: RegionKey,
    recv: RegionKey,
    /// Messages the serving thread received so far.
    received: Arc<AtomicU64>,
    /// How the serving thread's polls went (published every 256 polls).
    served: Arc<ServerPolls>,
    comps: Vec<Completion>,
}

/// The serving thread's poll loop, counted: how many times it polled and
/// how many of those polls found nothing (published every 256 polls, so
/// counting costs the loop nothing measurable).
#[derive(Default)]
struct ServerPolls {
    polls: AtomicU64,
    empty: AtomicU64,
    /// The serving thread's CPU time (ns) and involuntary context switches
    /// ([`thread_cpu`]).
    cpu_ns: AtomicU64,
    preempted: AtomicU64,
}

impl Side {
    fn repost(&mut self, cookie: u64) -> Result<()> {
        let sge = Sge {
            key: self.recv,
            offset: (cookie % RECVS) * u64::from(EAGER_SIZE),
            len: u64::from(EAGER_SIZE),
        };
        self.t.post_recv(self.qp, sge, cookie)?;
        Ok(())
    }
}

fn ntb_config() -> (FabricConfig, Config) {
    ntb_config_ports(2)
}

/// [`ntb_config`] for a fabric of `ports` ports (slots): those past the
/// two ends a case connects stay empty, as hosts missing from a fabric.
fn ntb_config_ports(ports: u16) -> (FabricConfig, Config) {
    let geometry = Geometry {
        ports,
        queue_depth: Q_DEPTH,
        eager_count: EAGER_COUNT,
        eager_size: EAGER_SIZE,
        data: DataQueues::NONE,
    };
    let layout = geometry.layout().expect("constant geometry");
    let window = layout
        .window_size_for(RECVS as usize * EAGER_SIZE as usize + (8 << 20) + (64 << 10))
        .next_multiple_of(1 << 20);
    let fabric = FabricConfig {
        slots: usize::from(ports),
        window_size: window,
        heartbeat_timeout: Duration::from_secs(2),
        ..FabricConfig::default()
    };
    (fabric, Config::new(geometry))
}

/// Joins `fabric` at `slot` and sets up a transport with a data region
/// (8 MiB, all access) and receive buffers.
fn ntb_endpoint(
    fabric: &EmuFabric,
    dir: &std::path::Path,
    slot: u16,
    cfg: &Config,
) -> Result<(Transport, RegionKey, RegionKey)> {
    let dev = EmuDevice::join(
        fabric,
        &DeviceConfig {
            slot: Some(slot),
            fabric: fabric.config().clone(),
            dir: Some(dir.to_path_buf()),
            ..DeviceConfig::default()
        },
    )?;
    let mut t = Transport::new(Arc::new(dev), cfg.clone())?;
    let recv = t.register_region(RECVS as usize * EAGER_SIZE as usize, Access::LOCAL)?;
    let data = t.register_region(8 << 20, Access::ALL)?;
    t.region_write(data, 0, &vec![FILL; 8 << 20])?;
    Ok((t, data, recv))
}

/// Runs `f` on core `a` against a transport served by a thread on core `b`,
/// both on a private emulated fabric in one process.
fn ntb_session<R>(
    a: usize,
    b: usize,
    serve: Serve,
    nt_threshold: Option<usize>,
    f: impl FnOnce(&mut Side) -> Result<R>,
) -> Result<R> {
    let (_, mut cfg) = ntb_config();
    if let Some(nt) = nt_threshold {
        cfg.nt_threshold = nt;
    }
    ntb_session_with(a, b, serve, &cfg, f)
}

/// [`ntb_session`] with both endpoints configured by `cfg`.
fn ntb_session_with<R>(
    a: usize,
    b: usize,
    serve: Serve,
    cfg: &Config,
    f: impl FnOnce(&mut Side) -> Result<R>,
) -> Result<R> {
    with_fabric(|fabric, dir| session_on(fabric, dir, cfg, a, b, serve, f))
}

/// The body of [`ntb_session`] on a fabric [`with_fabric`] made.
fn session_on<R>(
    fabric: &EmuFabric,
    dir: &std::path::Path,
    cfg: &Config,
    a: usize,
    b: usize,
    serve: Serve,
    f: impl FnOnce(&mut Side) -> Result<R>,
) -> Result<R> {
    let stop = AtomicBool::new(false);
    let received = Arc::new(AtomicU64::new(0));
    let served = Arc::new(ServerPolls::default());
    let (key_tx, key_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| -> Result<R> {
        let server = s.spawn(|| -> Result<()> {
            let (mut t, data, recv) = ntb_endpoint(fabric, dir, 1, cfg)?;
            let _ = key_tx.send(data);
            let qp = t.create_qp(0)?;
            t.wait_connected(0, Duration::from_secs(10))?;
            for i in 0..RECVS {
                t.post_recv(qp, recv_sge(recv, i), i)?;
            }
            pin(b);
            let mut comps = vec![Completion::default(); 64];
            let mut echo = vec![0u8; EAGER_SIZE as usize];
            let (mut polls, mut empty) = (0u64, 0u64);
            let mut got = 0u64;
            let mut reposts = Vec::with_capacity(comps.len());
            if serve == Serve::EchoPolled {
                return serve_polled(&mut t, qp, data, &stop);
            }
            loop {
                let n = t.poll_completions(&mut comps);
                for c in &comps[..n] {
                    if c.op == OpKind::WriteImm && serve == Serve::Passive {
                        // A burst's last one-sided write names how many
                        // writes the burst held (see `ntb_direct_burst`).
                        got += c.cookie;
                    }
                    if c.op == OpKind::WriteImm && serve == Serve::EchoWriteImm {
                        let back = RemoteAddr {
                            key: RegionKey(c.cookie as u32),
                            offset: 0,
                        };
                        let len = c.bytes as usize;
                        while let Err(e) = t.post_write_direct(qp, &echo[..len], back, Some(0), 0) {
                            if !matches!(e, TransportError::UnknownRemoteKey { .. }) {
                                return Err(e.into());
                            }
                            t.progress();
                        }
                    }
                    if c.op == OpKind::Recv {
                        if serve == Serve::EchoSend && c.status.is_ok() {
                            let len = c.bytes as usize;
                            let off = (c.cookie % RECVS) * u64::from(EAGER_SIZE);
                            t.region_read(recv, off, &mut echo[..len])?;
                            while let Err(e) = t.post_send(qp, &echo[..len], 0) {
                                if !matches!(e, TransportError::Busy { .. }) {
                                    return Err(e.into());
                                }
                                t.progress();
                            }
                        }
                        reposts.push(RecvWr {
                            sge: recv_sge(recv, c.cookie),
                            cookie: c.cookie,
                        });
                        got += 1;
                    }
                }
                if !reposts.is_empty() {
                    t.post_recvs(qp, &reposts)?;
                    reposts.clear();
                }
                if n > 0 {
                    // One store per poll, not one per message: the
                    // initiator reads this line while it sends.
                    received.store(got, Ordering::Relaxed);
                } else {
                    empty += 1;
                }
                polls += 1;
                if polls.is_multiple_of(256) {
                    served.polls.store(polls, Ordering::Relaxed);
                    served.empty.store(empty, Ordering::Relaxed);
                    if polls.is_multiple_of(1 << 12) {
                        let (cpu, preempted) = thread_cpu();
                        served
                            .cpu_ns
                            .store(cpu.as_nanos() as u64, Ordering::Relaxed);
                        served.preempted.store(preempted, Ordering::Relaxed);
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
            }
        });
        let run = || -> Result<R> {
            let (mut t, data, recv) = ntb_endpoint(fabric, dir, 0, cfg)?;
            let remote = key_rx
                .recv_timeout(Duration::from_secs(10))
                .context("the serving thread did not set up")?;
            let qp = t.create_qp(1)?;
            t.wait_connected(1, Duration::from_secs(10))?;
            for i in 0..RECVS {
                t.post_recv(qp, recv_sge(recv, i), i)?;
            }
            pin(a);
            let mut side = Side {
                t,
                qp,
                data,
                remote,
                recv,
                received: received.clone(),
                served: served.clone(),
                comps: vec![Completion::default(); 64],
            };
            f(&mut side)
        };
        let r = run();
        stop.store(true, Ordering::Relaxed);
        let served = server.join().expect("serving thread panicked");
        let r = r?;
        served?;
        Ok(r)
    })
}

/// Runs `f` on a private emulated fabric (in its own directory) made for
/// it with [`ntb_config`]'s settings, then removes both, whatever `f` did.
fn with_fabric<R>(f: impl FnOnce(&EmuFabric, &std::path::Path) -> Result<R>) -> Result<R> {
    with_fabric_ports(2, f)
}

/// [`with_fabric`] on a fabric of `ports` ports (see [`ntb_config_ports`]).
fn with_fabric_ports<R>(
    ports: u16,
    f: impl FnOnce(&EmuFabric, &std::path::Path) -> Result<R>,
) -> Result<R> {
    let dir = std::env::temp_dir().join(format!("ntbdk-bench-transport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating the fabric directory")?;
    let (fcfg, _) = ntb_config_ports(ports);
    let r = EmuFabric::create_in(&dir, "bench", &fcfg)
        .map_err(anyhow::Error::from)
        .and_then(|fabric| f(&fabric, &dir));
    let _ = EmuFabric::destroy_in(&dir, "bench");
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn recv_sge(recv: RegionKey, cookie: u64) -> Sge {
    Sge {
        key: recv,
        offset: (cookie % RECVS) * u64::from(EAGER_SIZE),
        len: u64::from(EAGER_SIZE),
    }
}

/// Fails on a completion with an error status.
fn ok(c: &Completion) -> Result<()> {
    if !c.status.is_ok() {
        bail!("a {:?} failed: {:?}", c.op, c.status);
    }
    Ok(())
}

/// `n` writes of `size` bytes, bursts of [`BURST`], at most [`TX_DEPTH`]
/// outstanding, drained at the end; returns how long they took.
fn ntb_writes(side: &mut Side, size: u64, n: u64) -> Result<Duration> {
    let local = [Sge {
        key: side.data,
        offset: 0,
        len: size,
    }];
    let wr = WriteWr {
        local: &local,
        remote: RemoteAddr {
            key: side.remote,
            offset: 0,
        },
        cookie: 0,
    };
    let wrs = vec![wr; BURST];
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let mut last = Instant::now();
    let mut idle = 0u32;
    while done < n {
        let out = (posted - done) as usize;
        if posted < n && out < TX_DEPTH {
            let k = BURST.min(TX_DEPTH - out).min((n - posted) as usize);
            match side.t.post_writes(side.qp, &wrs[..k]) {
                Ok(m) => posted += m as u64,
                Err(TransportError::Busy { .. } | TransportError::TooManyOutstanding { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let m = side.t.poll_completions(&mut side.comps);
        for c in &side.comps[..m] {
            ok(c)?;
            if c.op == OpKind::Write {
                done += 1;
            }
        }
        if m > 0 {
            idle = 0;
        } else {
            idle += 1;
            if idle.is_multiple_of(4096) {
                if last.elapsed() > Duration::from_secs(10) {
                    bail!("writes stalled ({} outstanding)", posted - done);
                }
            } else if idle == 1 {
                last = Instant::now();
            }
        }
    }
    Ok(start.elapsed())
}

/// The timed batches of `op` (which does `n` operations and returns how
/// long they took), each lasting about `batch_time` (and at least
/// `min_batch` operations), for about `target` in all (or `iters`
/// operations), after 50 ms of warm-up.
fn ntb_sample(
    name: String,
    iters: Option<u64>,
    target: Duration,
    min_batch: u64,
    batch_time: Duration,
    mut op: impl FnMut(u64) -> Result<Duration>,
) -> Result<Samples> {
    // Warm up first: the first writes into a window fault its pages in.
    let warm_end = Instant::now() + Duration::from_millis(50);
    while Instant::now() < warm_end {
        op(min_batch)?;
    }
    let mut n = min_batch;
    let mut per_op = loop {
        let t = op(n)?;
        if t >= batch_time.max(Duration::from_millis(2)) || n >= 1 << 24 {
            break t.as_secs_f64() / n as f64;
        }
        n *= 2;
    };
    // A preempted probe would make every operation look slow: keep the
    // fastest of three.
    for _ in 0..2 {
        per_op = per_op.min(op(n)?.as_secs_f64() / n as f64);
    }
    let batch = ((batch_time.as_secs_f64() / per_op) as u64).max(min_batch);
    let ops = iters.unwrap_or(((target.as_secs_f64() / per_op) as u64).max(1));
    let batches = ops.div_ceil(batch).max(1);
    let mut times = Vec::with_capacity(batches as usize);
    for _ in 0..batches {
        times.push(op(batch)?);
    }
    Ok(Samples { name, batch, times })
}

/// ntbdk write bandwidth at `sizes`, core `a` writing into a region served
/// by core `b`.
fn ntb_write_bw(
    a: usize,
    b: usize,
    sizes: &[usize],
    nt_threshold: Option<usize>,
    iters: Option<u64>,
    target: Duration,
) -> Result<Vec<(usize, Samples)>> {
    ntb_session(a, b, Serve::Passive, nt_threshold, |side| {
        let mut rows = Vec::new();
        for &size in sizes {
            let stores = match nt_threshold {
                None => "default",
                Some(usize::MAX) => "cached stores",
                Some(_) => "custom stores",
            };
            let name = format!(
                "ntbdk write {} ({stores}; burst {BURST}, depth {TX_DEPTH}), cores {a} -> {b}",
                size_name(size)
            );
            let s = ntb_sample(name, iters, target, 16, NTB_BATCH_TIME, |n| {
                ntb_writes(side, size as u64, n)
            })?;
            rows.push((size, s));
        }
        Ok(rows)
    })
}

/// Polls until a completion of kind `op` arrives (others are checked and
/// skipped); fails after 10 s. The clock is read once every 4096 empty
/// polls only: reading it on every poll would slow the loop that waits.
fn await_completion(side: &mut Side, op: OpKind) -> Result<Completion> {
    let (mut spins, mut t0) = (0u32, None::<Instant>);
    loop {
        let m = side.t.poll_completions(&mut side.comps);
        for c in &side.comps[..m] {
            ok(c)?;
            if c.op == op {
                return Ok(*c);
            }
        }
        if m == 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                let since = *t0.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(10) {
                    bail!("no {op:?} completion within 10 s");
                }
            }
        }
    }
}

/// Polls until the serving thread's data region has been advertised to us
/// (it is when the session connects): an empty one-sided write to it is
/// refused for its size, not its key, from then on.
fn await_advertised(side: &mut Side) -> Result<()> {
    let to = RemoteAddr {
        key: side.remote,
        offset: 0,
    };
    let end = Instant::now() + Duration::from_secs(10);
    while let Err(TransportError::UnknownRemoteKey { .. }) =
        side.t.post_write_direct(side.qp, &[], to, None, 0)
    {
        side.t.progress();
        if Instant::now() > end {
            bail!("the serving thread's region was never advertised");
        }
    }
    Ok(())
}

/// `n` round trips of a `len`-byte send echoed by the serving thread.
fn ntb_send_pingpong(side: &mut Side, len: usize, n: u64) -> Result<Duration> {
    let msg = vec![7u8; len];
    let start = Instant::now();
    for _ in 0..n {
        loop {
            match side.t.post_send(side.qp, &msg, 0) {
                Ok(()) => break,
                Err(TransportError::Busy { .. }) => {
                    side.t.progress();
                }
                Err(e) => return Err(e.into()),
            }
        }
        let c = await_completion(side, OpKind::Recv)?;
        side.repost(c.cookie)?;
    }
    Ok(start.elapsed())
}

/// `n` round trips of a `len`-byte one-sided write with immediate, echoed
/// by the serving thread the same way (as `ib_write_lat`, with the notice
/// in place of polling the buffer's last byte).
fn ntb_direct_pingpong(side: &mut Side, len: usize, n: u64) -> Result<Duration> {
    let msg = vec![7u8; len];
    let to = RemoteAddr {
        key: side.remote,
        offset: 0,
    };
    let imm = Some(u64::from(side.data.0));
    await_advertised(side)?;
    let start = Instant::now();
    for _ in 0..n {
        side.t.post_write_direct(side.qp, &msg, to, imm, 0)?;
        await_completion(side, OpKind::WriteImm)?;
    }
    Ok(start.elapsed())
}

/// What every data region is filled with at the start.
const FILL: u8 = 0x5a;

/// The serving side of [`Serve::EchoPolled`]: the first write with
/// immediate names the initiator's region; then each new value of the last
/// byte of the 64-byte message at the start of `ours` is answered, as
/// `ib_write_lat`'s server does, by a one-sided write of our own 64-byte
/// buffer carrying that value in its last byte into the initiator's region.
fn serve_polled(t: &mut Transport, qp: Qp, ours: RegionKey, stop: &AtomicBool) -> Result<()> {
    let view = t.region_view(ours)?;
    let mut comps = vec![Completion::default(); 64];
    let back = loop {
        let n = t.poll_completions(&mut comps);
        if let Some(c) = comps[..n].iter().find(|c| c.op == OpKind::WriteImm) {
            break RemoteAddr {
                key: RegionKey(c.cookie as u32),
                offset: 0,
            };
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
    };
    // Regions start filled with FILL ([`ntb_endpoint`]); sequence values
    // never take it, so the first message is seen as new whenever it came.
    let mut last = FILL;
    let mut msg = [7u8; MSG];
    let mut polls = 0u32;
    loop {
        let v = view.load_u8(MSG as u64 - 1).unwrap_or(last);
        // Polled as the baselines poll (`spin_until`), with a pause.
        if v == last {
            std::hint::spin_loop();
        } else {
            last = v;
            // As `ib_write_lat`'s server: our own buffer, the sequence
            // number we saw in its last byte (the message is not copied).
            msg[MSG - 1] = v;
            t.post_write_direct(qp, &msg, back, None, 0)?;
            // Its completion, at once (as `ib_write_lat` polls its CQ): a
            // queue left to grow reallocates under the timed loop.
            let _ = t.poll_completions(&mut comps);
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(256) {
            // Completions of our writes, credits, liveness.
            let _ = t.poll_completions(&mut comps);
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
        }
    }
}

/// `n` round trips of a 64-byte one-sided write whose last byte the
/// serving thread polls, echoed the same way into ours (`ib_write_lat`).
fn ntb_polled_pingpong(side: &mut Side, n: u64, seq: &mut u8) -> Result<Duration> {
    let to = RemoteAddr {
        key: side.remote,
        offset: 0,
    };
    let view = side.t.region_view(side.data)?;
    let mut msg = [7u8; MSG];
    let start = Instant::now();
    for _ in 0..n {
        *seq = seq.wrapping_add(1);
        if *seq == FILL {
            *seq = seq.wrapping_add(1);
        }
        msg[MSG - 1] = *seq;
        side.t.post_write_direct(side.qp, &msg, to, None, 0)?;
        // Its completion, at once (as `ib_write_lat` polls its CQ): a queue
        // left to grow reallocates under the timed loop.
        let _ = side.t.poll_completions(&mut side.comps);
        let (mut spins, mut t0) = (0u32, None::<Instant>);
        while view.load_u8(MSG as u64 - 1) != Some(*seq) {
            // As the baselines poll (`spin_until`), with a pause.
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                // Our writes' completions, credits, liveness.
                let _ = side.t.poll_completions(&mut side.comps);
            }
            if spins.is_multiple_of(1 << 16) {
                let since = *t0.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(10) {
                    bail!("no echo within 10 s");
                }
            }
        }
    }
    Ok(start.elapsed())
}

/// Polled one-sided write ping-pong samples (round trips) of 64 bytes.
fn ntb_polled_latency(a: usize, b: usize, iters: Option<u64>, target: Duration) -> Result<Samples> {
    ntb_session(a, b, Serve::EchoPolled, None, |side| {
        // Name our region to the server with one write with immediate.
        let to = RemoteAddr {
            key: side.remote,
            offset: MSG as u64,
        };
        let imm = Some(u64::from(side.data.0));
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            match side.t.post_write_direct(side.qp, &[0u8; 8], to, imm, 0) {
                Ok(()) => break,
                Err(TransportError::UnknownRemoteKey { .. }) if Instant::now() < end => {
                    side.t.progress();
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut seq = 0u8;
        ntb_sample(
            format!(
                "ntbdk one-sided write ping-pong {MSG} B (polled last byte), cores {a} <-> {b}"
            ),
            iters,
            target,
            1,
            BATCH_TIME,
            |n| ntb_polled_pingpong(side, n, &mut seq),
        )
    })
}

/// One-sided write ping-pong samples (round trips) of `len` bytes.
fn ntb_direct_latency(
    a: usize,
    b: usize,
    len: usize,
    iters: Option<u64>,
    target: Duration,
) -> Result<Samples> {
    ntb_session(a, b, Serve::EchoWriteImm, None, |side| {
        ntb_sample(
            format!("ntbdk one-sided write ping-pong {len} B (with immediate), cores {a} <-> {b}"),
            iters,
            target,
            1,
            BATCH_TIME,
            |n| ntb_direct_pingpong(side, len, n),
        )
    })
}

/// Send ping-pong samples (round trips) of `len`-byte messages.
fn ntb_send_latency(
    a: usize,
    b: usize,
    len: usize,
    iters: Option<u64>,
    target: Duration,
) -> Result<Samples> {
    let how = match wire::inline_slots(len) {
        Some(1) => "inline, 1 slot".to_string(),
        Some(k) => format!("inline, {k} slots"),
        None => "eager buffer".to_string(),
    };
    ntb_session(a, b, Serve::EchoSend, None, |side| {
        ntb_sample(
            format!("{}{how}), cores {a} <-> {b}", ntb_latency_prefix(len)),
            iters,
            target,
            1,
            BATCH_TIME,
            |n| ntb_send_pingpong(side, len, n),
        )
    })
}

/// Software cost of a send round trip with no cross-core transfer: both
/// transports on core `a`, one thread, each message sent, received, its
/// receive reposted and echoed back. What is left of a two-core round trip
/// after this is the cache-line transfers (and polling).
fn ntb_send_one_core(
    a: usize,
    len: usize,
    iters: Option<u64>,
    target: Duration,
) -> Result<Samples> {
    one_core(a, |[(mut t0, q0, recv0, _), (mut t1, q1, recv1, _)]| {
        let msg = vec![7u8; len];
        let mut echo = vec![0u8; len];
        let mut comps = vec![Completion::default(); 64];
        // One hop: `from` sends, `to` polls until the receive completes,
        // reposts it and reads the message into `buf`.
        let mut hop = |from: &mut Transport,
                       fq: Qp,
                       to: &mut Transport,
                       tq: Qp,
                       recv: RegionKey,
                       data: &[u8],
                       buf: &mut [u8]|
         -> Result<()> {
            from.post_send(fq, data, 0)?;
            from.poll_completions(&mut comps);
            for _ in 0..1000 {
                let m = to.poll_completions(&mut comps);
                if let Some(c) = comps[..m].iter().find(|c| c.op == OpKind::Recv) {
                    ok(c)?;
                    let off = (c.cookie % RECVS) * u64::from(EAGER_SIZE);
                    to.region_read(recv, off, buf)?;
                    return Ok(to.post_recv(tq, recv_sge(recv, c.cookie), c.cookie)?);
                }
            }
            bail!("a message sent on one core was not received")
        };
        let mut back = vec![0u8; len];
        ntb_sample(
            format!("ntbdk send ping-pong {len} B, one core (software only), core {a}"),
            iters,
            target,
            1,
            BATCH_TIME,
            |n| {
                let start = Instant::now();
                for _ in 0..n {
                    hop(&mut t0, q0, &mut t1, q1, recv1, &msg, &mut echo)?;
                    hop(&mut t1, q1, &mut t0, q0, recv0, &echo, &mut back)?;
                }
                Ok(start.elapsed())
            },
        )
    })
}

/// Samples of `poll_completions` finding nothing on a connected transport
/// (both ends on core `a`, each polled once per sample, so the one-way
/// column is one poll): what a poller pays per turn while it waits, half
/// of which a message that arrives meanwhile waits on average before the
/// poll that finds it.
fn ntb_empty_poll(a: usize, ports: u16, iters: Option<u64>, target: Duration) -> Result<Samples> {
    one_core_ports(a, ports, |[(mut t0, _, _, _), (mut t1, _, _, _)]| {
        let mut comps = vec![Completion::default(); 64];
        let fabric = match ports {
            2 => String::new(),
            n => format!(", {n}-port fabric ({} ports empty)", n - 2),
        };
        ntb_sample(
            format!(
                "ntbdk empty poll (poll_completions finding nothing; one-way column: one poll){fabric}, one core, core {a}"
            ),
            iters,
            target,
            1,
            BATCH_TIME,
            |n| {
                let start = Instant::now();
                for _ in 0..n {
                    for t in [&mut t0, &mut t1] {
                        if t.poll_completions(&mut comps) != 0 {
                            bail!("a poll found a completion with nothing posted");
                        }
                    }
                }
                Ok(start.elapsed())
            },
        )
    })
}

/// One connected end of a one-core pair: its transport, queue pair,
/// receive region and data region (advertised to the other end).
type End = (Transport, Qp, RegionKey, RegionKey);

/// Runs `f` on core `a` with two transports connected to each other on a
/// private emulated fabric, each with [`RECVS`] receives posted: both ends
/// in this one thread, so no cache line crosses cores (the software cost
/// alone).
fn one_core<R>(a: usize, f: impl FnOnce([End; 2]) -> Result<R>) -> Result<R> {
    one_core_ports(a, 2, f)
}

/// [`one_core`] on a fabric of `ports` ports, the two ends on its first
/// two.
fn one_core_ports<R>(a: usize, ports: u16, f: impl FnOnce([End; 2]) -> Result<R>) -> Result<R> {
    let (_, cfg) = ntb_config_ports(ports);
    with_fabric_ports(ports, |fabric, dir| {
        pin(a);
        let (mut t0, data0, recv0) = ntb_endpoint(fabric, dir, 0, &cfg)?;
        let (mut t1, data1, recv1) = ntb_endpoint(fabric, dir, 1, &cfg)?;
        let (q0, q1) = (t0.create_qp(1)?, t1.create_qp(0)?);
        let end = Instant::now() + Duration::from_secs(10);
        while !(t0.is_connected(1) && t1.is_connected(0)) {
            t0.progress();
            t1.progress();
            if Instant::now() > end {
                bail!("the two transports did not connect");
            }
        }
        for i in 0..RECVS {
            t0.post_recv(q0, recv_sge(recv0, i), i)?;
            t1.post_recv(q1, recv_sge(recv1, i), i)?;
        }
        f([(t0, q0, recv0, data0), (t1, q1, recv1, data1)])
    })
}

/// Software cost of a polled one-sided write round trip with no cross-core
/// transfer: both transports on core `a`, one thread; each hop a 64-byte
/// one-sided write into the other end's data region, its completion
/// polled at once, and the other end's load of the last byte that finds
/// it (as [`ntb_polled_pingpong`], with nothing to wait for).
fn ntb_polled_one_core(a: usize, iters: Option<u64>, target: Duration) -> Result<Samples> {
    one_core(a, |[(mut t0, q0, _, data0), (mut t1, q1, _, data1)]| {
        let end = Instant::now() + Duration::from_secs(10);
        for (t, q, key) in [(&mut t0, q0, data1), (&mut t1, q1, data0)] {
            let to = RemoteAddr { key, offset: 0 };
            while let Err(TransportError::UnknownRemoteKey { .. }) =
                t.post_write_direct(q, &[], to, None, 0)
            {
                t.progress();
                if Instant::now() > end {
                    bail!("a data region was never advertised");
                }
            }
        }
        let (view0, view1) = (t0.region_view(data0)?, t1.region_view(data1)?);
        let mut comps = vec![Completion::default(); 64];
        let mut msg = [7u8; MSG];
        let mut seq = 0u8;
        ntb_sample(
            format!(
                "ntbdk one-sided write ping-pong {MSG} B (polled last byte), one core (software only), core {a}"
            ),
            iters,
            target,
            1,
            BATCH_TIME,
            |n| {
                let start = Instant::now();
                for _ in 0..n {
                    for (t, q, key, view) in
                        [(&mut t0, q0, data1, &view1), (&mut t1, q1, data0, &view0)]
                    {
                        seq = seq.wrapping_add(1);
                        msg[MSG - 1] = seq;
                        t.post_write_direct(q, &msg, RemoteAddr { key, offset: 0 }, None, 0)?;
                        let _ = t.poll_completions(&mut comps);
                        if view.load_u8(MSG as u64 - 1) != Some(seq) {
                            bail!("a one-sided write on one core did not land");
                        }
                    }
                }
                Ok(start.elapsed())
            },
        )
    })
}

/// The send rate's software cost: `len`-byte sends in bursts of [`BURST`]
/// from one transport to another on the same core, the receiver polling
/// (and reposting) after each burst, until it has received them all.
/// Nothing crosses cores, so this is the per-message work of the streaming
/// path, steady under callgrind and on a loaded machine.
fn ntb_send_rate_one_core(
    a: usize,
    len: usize,
    iters: Option<u64>,
    target: Duration,
) -> Result<Samples> {
    one_core(a, |[(mut t0, q0, _, _), (mut t1, q1, recv1, _)]| {
        let msg = vec![7u8; len];
        let wrs = send_burst(&msg, BURST);
        let mut comps = vec![Completion::default(); 64];
        let mut reposts = Vec::with_capacity(comps.len());
        ntb_sample(
            format!("ntbdk send {len} B, burst {BURST}, one core (software only), core {a}"),
            iters,
            target,
            BURST as u64,
            NTB_BATCH_TIME,
            |n| {
                let start = Instant::now();
                let (mut posted, mut got) = (0u64, 0u64);
                while got < n {
                    if posted < n {
                        let k = BURST.min((n - posted) as usize);
                        match t0.post_sends(q0, &wrs[..k]) {
                            Ok(m) => posted += m as u64,
                            Err(TransportError::Busy { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                        let m = t0.poll_completions(&mut comps);
                        for c in &comps[..m] {
                            ok(c)?;
                        }
                    }
                    let before = got;
                    loop {
                        let m = t1.poll_completions(&mut comps);
                        if m == 0 {
                            break;
                        }
                        reposts.clear();
                        for c in &comps[..m] {
                            ok(c)?;
                            if c.op == OpKind::Recv {
                                reposts.push(RecvWr {
                                    sge: recv_sge(recv1, c.cookie),
                                    cookie: c.cookie,
                                });
                                got += 1;
                            }
                        }
                        t1.post_recvs(q1, &reposts)?;
                    }
                    if got == before && posted == got {
                        bail!("{got} of {n} sends on one core were received");
                    }
                }
                Ok(start.elapsed())
            },
        )
    })
}

/// Sends of [`MSG`] bytes in bursts of [`BURST`] until the serving thread
/// has received `n` more; returns how long that took.
fn ntb_send_burst(side: &mut Side, n: u64) -> Result<Duration> {
    let msg = [7u8; MSG];
    let wrs = send_burst(&msg, BURST);
    let base = side.received.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut posted = 0u64;
    let mut spins = 0u32;
    loop {
        let got = side.received.load(Ordering::Relaxed) - base;
        if got >= n {
            return Ok(start.elapsed());
        }
        if posted < n {
            let k = BURST.min((n - posted) as usize);
            match side.t.post_sends(side.qp, &wrs[..k]) {
                Ok(m) => posted += m as u64,
                Err(TransportError::Busy { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Send completions are immediate: drain them (and make progress:
        // credits and returned eager buffers).
        let m = side.t.poll_completions(&mut side.comps);
        for c in &side.comps[..m] {
            ok(c)?;
        }
        spins += 1;
        if spins.is_multiple_of(4096) && start.elapsed() > Duration::from_secs(10) {
            bail!("sends stalled: {got} of {n} received");
        }
    }
}

/// Length of the windows a sustained run is cut into.
const SUSTAINED_WINDOW: Duration = Duration::from_millis(100);

/// The clock of a sustained run: its start, and the rate of each
/// [`SUSTAINED_WINDOW`] of it from a count of messages read at its end.
struct Windows {
    start: Instant,
    at: Instant,
    count_at: u64,
    rates: Vec<f64>,
}

impl Windows {
    /// A run starting now, with the count at `count`.
    fn start(count: u64) -> Self {
        let now = Instant::now();
        Self {
            start: now,
            at: now,
            count_at: count,
            rates: Vec::new(),
        }
    }

    /// Whether a window has passed by `now` (then [`close`](Self::close) it).
    fn due(&self, now: Instant) -> bool {
        now - self.at >= SUSTAINED_WINDOW
    }

    /// Ends the window at `now`, `count` messages so far; returns how long
    /// the run has lasted.
    fn close(&mut self, now: Instant, count: u64) -> Duration {
        let secs = (now - self.at).as_secs_f64();
        self.rates.push((count - self.count_at) as f64 / secs / 1e6);
        (self.at, self.count_at) = (now, count);
        now - self.start
    }
}

/// What a sustained send run measured: messages counted where they
/// arrived over the whole run, the rate of each window of it, and why the
/// sender or the receiver waited.
struct Sustained {
    name: String,
    /// Messages the serving thread received during the run.
    received: u64,
    elapsed: Duration,
    /// Messages received per window, in M/s, in order.
    windows: Vec<f64>,
    /// `post_sends` calls, and how many of them posted nothing (Busy: no
    /// PostQ credit).
    posts: u64,
    busy: u64,
    /// The serving thread's polls, and how many of them found nothing.
    server_polls: u64,
    server_empty: u64,
    /// CPU time and involuntary context switches of the sending and the
    /// serving thread during the run.
    sender_cpu: (Duration, u64),
    server_cpu: (Duration, u64),
    /// Time the sender spent in the calls that wrote messages, and how
    /// many messages they wrote, over the calls timed (one in
    /// [`WRITE_TIMED_EVERY`]): the writer's own cost per message, apart
    /// from its waits for credit.
    writing: Duration,
    written: u64,
}

impl Sustained {
    fn rate(&self) -> f64 {
        self.received as f64 / self.elapsed.as_secs_f64() / 1e6
    }

    /// The sender's time per message in the calls that wrote messages.
    fn writing_ns(&self) -> f64 {
        self.writing.as_nanos() as f64 / self.written.max(1) as f64
    }
}

/// Sends `len` bytes in bursts of [`BURST`] without pause for `run`,
/// counting what the serving thread received (read only at window
/// boundaries: nothing else crosses cores but the transport's own lines).
fn ntb_send_sustained(
    side: &mut Side,
    name: String,
    len: usize,
    run: Duration,
    signaled: Signaled,
) -> Result<Sustained> {
    let msg = vec![7u8; len];
    let mut wrs = send_burst(&msg, BURST);
    if signaled == Signaled::LastOfBurst {
        for wr in &mut wrs[..BURST - 1] {
            wr.signaled = false;
        }
    }
    // Warm up (faults the window's pages in, settles the credits).
    ntb_send_burst(side, 1 << 16)?;
    let polls0 = side.served.polls.load(Ordering::Relaxed);
    let empty0 = side.served.empty.load(Ordering::Relaxed);
    let server_cpu0 = server_cpu(&side.served);
    let sender_cpu0 = thread_cpu();
    let base = side.received.load(Ordering::Relaxed);
    let mut clock = Windows::start(base);
    let (mut posts, mut busy, mut spins) = (0u64, 0u64, 0u32);
    let (mut writing, mut written) = (Duration::ZERO, 0u64);
    loop {
        // One call in eight is timed (a clock read costs about a
        // message's writing).
        let t = posts.is_multiple_of(WRITE_TIMED_EVERY).then(Instant::now);
        match side.t.post_sends(side.qp, &wrs) {
            Ok(n) => {
                if let Some(t) = t {
                    writing += t.elapsed();
                    written += n as u64;
                }
            }
            Err(TransportError::Busy { .. }) => busy += 1,
            Err(e) => return Err(e.into()),
        }
        posts += 1;
        let m = side.t.poll_completions(&mut side.comps);
        for c in &side.comps[..m] {
            ok(c)?;
        }
        spins += 1;
        if spins.is_multiple_of(64) && clock.due(Instant::now()) {
            let got = side.received.load(Ordering::Relaxed);
            let elapsed = clock.close(Instant::now(), got);
            if elapsed >= run {
                let (sender, server) = (thread_cpu(), server_cpu(&side.served));
                return Ok(Sustained {
                    name,
                    received: got - base,
                    elapsed,
                    windows: clock.rates,
                    posts,
                    busy,
                    server_polls: side.served.polls.load(Ordering::Relaxed) - polls0,
                    server_empty: side.served.empty.load(Ordering::Relaxed) - empty0,
                    sender_cpu: (sender.0 - sender_cpu0.0, sender.1 - sender_cpu0.1),
                    server_cpu: (server.0 - server_cpu0.0, server.1 - server_cpu0.1),
                    writing,
                    written,
                });
            }
        }
    }
}

/// The serving thread's CPU time and involuntary switches as last published.
fn server_cpu(s: &ServerPolls) -> (Duration, u64) {
    (
        Duration::from_nanos(s.cpu_ns.load(Ordering::Relaxed)),
        s.preempted.load(Ordering::Relaxed),
    )
}

/// Which sends of a continuous run ask for a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signaled {
    /// Every send (`Config::signal_sends`, the default).
    All,
    /// The last of each burst only (`signal_sends` off, `SendWr::signaled`
    /// on one in [`BURST`]), as perftest's `ib_send_bw` signals one send in
    /// `--cq-mod`.
    LastOfBurst,
}

/// The send rate of `len`-byte messages as one continuous run of `run`,
/// counted where the messages arrive.
fn ntb_send_rate_sustained(
    a: usize,
    b: usize,
    len: usize,
    run: Duration,
    signaled: Signaled,
) -> Result<Sustained> {
    let (_, mut cfg) = ntb_config();
    let how = match signaled {
        Signaled::All => String::new(),
        Signaled::LastOfBurst => {
            cfg.signal_sends = false;
            format!(", one signaled per burst (as perftest's --cq-mod {BURST})")
        }
    };
    ntb_session_with(a, b, Serve::Passive, &cfg, |side| {
        ntb_send_sustained(
            side,
            format!(
                "ntbdk send {len} B, burst {BURST}{how}, continuous, cores {a} -> {b} (received)"
            ),
            len,
            run,
            signaled,
        )
    })
}

/// The continuous-run rows time one write call in this many.
const WRITE_TIMED_EVERY: u64 = 8;

/// The continuous-run rows: the rate over the whole run, the spread of its
/// 100 ms windows, how often each side found nothing to do (by count of
/// calls: a Busy post or an empty poll is short), the sender's time per
/// message in the calls that wrote (which side limits: a sender that
/// writes for nearly the whole run at `1 / rate` per message is the
/// limit), and how much CPU each thread got (a thread that shares its core
/// with another job spins while the other side is off its core, and the
/// rate collapses), and the cores' coupling just before and after each
/// run (runs are comparable only at one coupling).
fn print_sustained(rows: &[(Sustained, (f64, f64))]) {
    println!("\n### Send rate, one continuous run each\n");
    println!(
        "| case | M messages/s | seconds | messages | 100 ms windows: min / median / max M/s | posts Busy | receiver polls empty | sender ns/message writing | CPU % sender / receiver | preempted sender / receiver | coupling ns before / after |"
    );
    println!("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- | --- |");
    for (s, coupling) in rows {
        print_sustained_row(s, *coupling);
    }
}

fn print_sustained_row(s: &Sustained, (before, after): (f64, f64)) {
    let mut w = s.windows.clone();
    w.sort_by(f64::total_cmp);
    let cpu = |c: Duration| 100.0 * c.as_secs_f64() / s.elapsed.as_secs_f64();
    println!(
        "| {} | {:.2} | {:.2} | {} | {:.2} / {:.2} / {:.2} | {:.1}% | {:.1}% | {:.1} | {:.0} / {:.0} | {} / {} | {before:.0} / {after:.0}{} |",
        s.name,
        s.rate(),
        s.elapsed.as_secs_f64(),
        s.received,
        w.first().copied().unwrap_or(0.0),
        w.get(w.len() / 2).copied().unwrap_or(0.0),
        w.last().copied().unwrap_or(0.0),
        100.0 * s.busy as f64 / s.posts.max(1) as f64,
        100.0 * s.server_empty as f64 / s.server_polls.max(1) as f64,
        s.writing_ns(),
        cpu(s.sender_cpu.0),
        cpu(s.server_cpu.0),
        s.sender_cpu.1,
        s.server_cpu.1,
        if coupling_changed(before, after) {
            " (changed)"
        } else {
            ""
        },
    );
}

/// `n` one-sided 64-byte writes in bursts of up to [`BURST`] into the
/// serving thread's region, each burst one `post_writes_direct`; the last
/// write of each burst is the only signaled one (as `ib_write_bw` signals
/// one write in `cq_mod`) and carries an immediate saying how many writes
/// the burst held, so they are counted where they arrive (the notice comes
/// after its burst's data).
fn ntb_direct_burst(side: &mut Side, n: u64) -> Result<Duration> {
    let msg = [7u8; MSG];
    let slots = 1024u64;
    let base = side.received.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut posted = 0u64;
    let mut spins = 0u32;
    let mut wrs = Vec::with_capacity(BURST);
    loop {
        let got = side.received.load(Ordering::Relaxed) - base;
        if got >= n {
            return Ok(start.elapsed());
        }
        if posted < n {
            let k = (BURST as u64).min(n - posted);
            wrs.clear();
            wrs.extend((0..k).map(|j| {
                let last = j + 1 == k;
                DirectWr {
                    data: &msg,
                    remote: RemoteAddr {
                        key: side.remote,
                        offset: ((posted + j) % slots) * MSG as u64,
                    },
                    imm: last.then_some(k),
                    signaled: last,
                    cookie: 0,
                }
            }));
            let done = side.t.post_writes_direct(side.qp, &wrs)?;
            ensure!(
                done == wrs.len(),
                "a burst of one-sided writes stopped at {done}"
            );
            posted += k;
        }
        let m = side.t.poll_completions(&mut side.comps);
        for c in &side.comps[..m] {
            ok(c)?;
        }
        spins += 1;
        if spins.is_multiple_of(4096) && start.elapsed() > Duration::from_secs(10) {
            bail!("one-sided writes stalled: {got} of {n} counted");
        }
    }
}

/// 64 B one-sided write rate with bursts of 32, counted where they arrive.
fn ntb_direct_rate(a: usize, b: usize, iters: Option<u64>, target: Duration) -> Result<Samples> {
    ntb_session(a, b, Serve::Passive, None, |side| {
        await_advertised(side)?;
        ntb_sample(
            format!(
                "ntbdk one-sided write {MSG} B, burst {BURST}, cores {a} -> {b} (counted at the target)"
            ),
            iters,
            target,
            BURST as u64,
            NTB_BATCH_TIME,
            |n| ntb_direct_burst(side, n),
        )
    })
}

/// 64 B send rate with bursts of 32, counted where the messages arrive.
fn ntb_send_rate(a: usize, b: usize, iters: Option<u64>, target: Duration) -> Result<Samples> {
    ntb_session(a, b, Serve::Passive, None, |side| {
        ntb_sample(
            format!("ntbdk send {MSG} B, burst {BURST}, cores {a} -> {b} (received)"),
            iters,
            target,
            BURST as u64,
            NTB_BATCH_TIME,
            |n| ntb_send_burst(side, n),
        )
    })
}

/// The latency rows (baselines, then ntbdk's) and the send-rate row, or
/// those whose label contains `--only` (see `--small-only`).
fn small_only(a: usize, b: usize, args: &Args, target: Duration) -> Result<()> {
    let iters = args.iters;
    let only = args.only.as_deref().map(str::to_lowercase);
    let wanted = |label: &str| {
        only.as_ref()
            .is_none_or(|o| label.to_lowercase().contains(o.as_str()))
    };
    let mut cases = baseline_cases(a, b, iters, target);
    #[cfg(feature = "iceoryx2")]
    cases.push((
        "iceoryx2",
        Box::new(move || iceoryx2_latency(a, b, iters, target)),
    ));
    cases.extend([
        (
            "send 64 B",
            Box::new(move || ntb_send_latency(a, b, MSG, iters, target)) as Case,
        ),
        (
            "send 48 B",
            Box::new(move || ntb_send_latency(a, b, 48, iters, target)),
        ),
        (
            "one-sided 64 B",
            Box::new(move || ntb_direct_latency(a, b, MSG, iters, target)),
        ),
        (
            "one-sided polled 64 B",
            Box::new(move || ntb_polled_latency(a, b, iters, target)),
        ),
        (
            "one core 64 B",
            Box::new(move || ntb_send_one_core(a, MSG, iters, target)),
        ),
        (
            "one core 48 B",
            Box::new(move || ntb_send_one_core(a, 48, iters, target)),
        ),
        (
            "one core one-sided polled 64 B",
            Box::new(move || ntb_polled_one_core(a, iters, target)),
        ),
        (
            "empty poll",
            Box::new(move || ntb_empty_poll(a, 2, iters, target)),
        ),
        (
            "empty poll, 4 ports",
            Box::new(move || ntb_empty_poll(a, 4, iters, target)),
        ),
    ]);
    const RATE: &str = "rate";
    const DIRECT_RATE: &str = "one-sided rate";
    const ONE_CORE_RATE: &str = "one core rate";
    const SUSTAINED_RING: &str = "continuous ring";
    const SUSTAINED_SEND: &str = "continuous send";
    let labels: Vec<&str> = cases
        .iter()
        .map(|(l, _)| *l)
        .chain([
            RATE,
            DIRECT_RATE,
            ONE_CORE_RATE,
            SUSTAINED_RING,
            SUSTAINED_SEND,
        ])
        .collect();
    if !labels.iter().any(|l| wanted(l)) {
        bail!(
            "--only {:?} matches no case (labels: {})",
            args.only.as_deref().unwrap_or_default(),
            labels.join(", ")
        );
    }
    let mut lat = Latencies::default();
    for (label, case) in cases {
        if wanted(label) {
            lat.run(a, b, case)?;
        }
    }
    if !lat.rows.is_empty() {
        lat.print();
        println!();
        print_latency_ratios(
            &lat.rows,
            &[
                (
                    CACHE_LINE,
                    "the cache-line ping-pong (the full run checks <= 2x)",
                ),
                (&ring_prefix(2), "the zero-software 2-slot ring"),
                (
                    &reused_prefix(),
                    "the zero-software message on reused lines",
                ),
                (TWO_LINE, "the two-line ping-pong"),
                (ICEORYX2, "iceoryx2's publish/subscribe ping-pong"),
            ],
        );
    }
    if wanted(RATE) {
        let rate = ntb_send_rate(a, b, iters, target)?;
        print_rate(&rate);
    }
    // Continuous runs of at least 1 s, the zero-software ring beside
    // ntbdk's send, for 2-slot (64 B) and 1-slot (48 B) messages.
    let run = target.max(Duration::from_secs(1));
    // Each run with the cores' coupling just before and after it.
    let mut sustained = Vec::new();
    let mut coupled = |row: &dyn Fn() -> Result<Sustained>| -> Result<()> {
        let (s, coupling) = with_coupling(a, b, row);
        sustained.push((s?, coupling));
        Ok(())
    };
    for (len, slots) in [(MSG, 2), (48, 1)] {
        if wanted(SUSTAINED_RING) {
            coupled(&|| Ok(slot_ring_stream(a, b, slots, run)))?;
        }
        if wanted(SUSTAINED_SEND) {
            coupled(&|| ntb_send_rate_sustained(a, b, len, run, Signaled::All))?;
        }
    }
    if wanted(SUSTAINED_SEND) {
        let last = Signaled::LastOfBurst;
        coupled(&|| ntb_send_rate_sustained(a, b, MSG, run, last))?;
    }
    if !sustained.is_empty() {
        print_sustained(&sustained);
    }
    if wanted(DIRECT_RATE) {
        let rate = ntb_direct_rate(a, b, iters, target)?;
        print_rate(&rate);
    }
    if wanted(ONE_CORE_RATE) {
        print_rate(&ntb_send_rate_one_core(a, MSG, iters, target)?);
    }
    Ok(())
}

/// Start of the name of the ntbdk two-core send ping-pong row of `len`
/// bytes (the one-core row's name goes on with `,`, not ` (`).
fn ntb_latency_prefix(len: usize) -> String {
    format!("ntbdk send ping-pong {len} B (")
}

/// Prints, for information only (no floor), the one-way latency of the
/// ntbdk 64 B send row as a multiple of each peer's (`(name prefix,
/// description)`), for those rows of `lat` that were measured.
fn print_latency_ratios(lat: &[Samples], peers: &[(&str, &str)]) {
    let find = |prefix: &str| lat.iter().find(|s| s.name.starts_with(prefix));
    let Some(ours) = find(&ntb_latency_prefix(MSG)) else {
        return;
    };
    for &(prefix, what) in peers {
        if let Some(peer) = find(prefix) {
            println!(
                "- {MSG} B latency vs {what}: {:.2}x ({:.1} vs {:.1} ns one-way; informational, not a floor)",
                ours.typical_ns() / peer.typical_ns(),
                ours.typical_ns() / 2.0,
                peer.typical_ns() / 2.0,
            );
        }
    }
}

fn print_rate(rate: &Samples) {
    println!("\n### {MSG} B rate, burst {BURST}\n");
    println!("| case | M messages/s | ns/message | mean M messages/s | messages |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| {} | {:.2} | {:.1} | {:.2} | {} |",
        rate.name,
        1e3 / rate.typical_ns(),
        rate.typical_ns(),
        1e3 / rate.mean_ns(),
        rate.ops()
    );
}

/// Rows as the floor check wants them (operations and total time of the
/// median-batch rate).
fn as_row(s: &Samples) -> Row {
    Row {
        name: s.name.clone(),
        ops: 1_000_000,
        elapsed: Duration::from_nanos((s.typical_ns() * 1e6) as u64),
    }
}
