//! Shared helpers of the ntbdk benchmark harnesses: core pinning, timing,
//! the side-by-side table every harness prints, and the probe of how tightly
//! the two benchmark cores are coupled.
//!
//! Every harness measures ntbdk and its peers in one process and one run, so
//! the figures that matter are the ratios between rows, not the absolute times
//! (the machines these run on are shared and noisy), and only between rows
//! measured at one coupling ([`coupling_ns`]).

#[cfg(feature = "iceoryx2")]
pub mod iceoryx2_pingpong;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The cores this process may use, as first seen. Remembered because
/// `core_affinity::get_core_ids` reports the calling thread's affinity, which
/// pinning narrows: asked again after a pin (or from a thread spawned by a
/// pinned one) it would list that one core only.
fn usable_cores() -> &'static [core_affinity::CoreId] {
    static CORES: OnceLock<Vec<core_affinity::CoreId>> = OnceLock::new();
    CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

/// Pins the calling thread to `core` (an index into the cores this process may
/// use). Returns `false`, and leaves the thread unpinned, when no core is
/// known.
pub fn pin(core: usize) -> bool {
    match usable_cores() {
        [] => false,
        ids => core_affinity::set_for_current(ids[core % ids.len()]),
    }
}

/// The two cores a producer/consumer pair runs on: the first two usable cores,
/// or `(0, 0)` on a single-core machine (the figures are then meaningless, and
/// [`describe_machine`] says so).
pub fn core_pair() -> (usize, usize) {
    if usable_cores().len() >= 2 {
        (0, 1)
    } else {
        (0, 0)
    }
}

/// One line of a side-by-side table: a name, how many operations ran, and how
/// long they took.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured, e.g. `ntbdk SPSC burst 32`.
    pub name: String,
    /// Operations (items, objects, messages) completed.
    pub ops: u64,
    /// Wall-clock time they took.
    pub elapsed: Duration,
}

impl Row {
    /// Millions of operations per second.
    pub fn mops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64() / 1e6
    }

    /// Nanoseconds per operation.
    pub fn ns_per_op(&self) -> f64 {
        self.elapsed.as_nanos() as f64 / self.ops.max(1) as f64
    }
}

/// Runs `f` and returns how long it took.
pub fn time<F: FnOnce() -> R, R>(f: F) -> (R, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// Returns the median of `runs` by throughput: benchmarks repeat each case a
/// few times and keep the median so one descheduled run does not decide.
/// For an even count, a row of the upper middle run's operations at the
/// mean of the two middle runs' rates.
pub fn median(mut runs: Vec<Row>) -> Row {
    assert!(!runs.is_empty(), "median of no runs");
    runs.sort_by(|a, b| a.mops().total_cmp(&b.mops()));
    let n = runs.len();
    if n % 2 == 1 {
        return runs.swap_remove(n / 2);
    }
    let rate = (runs[n / 2 - 1].mops() + runs[n / 2].mops()) / 2.0;
    let mut m = runs.swap_remove(n / 2);
    if rate.is_finite() && rate > 0.0 {
        m.elapsed = Duration::from_secs_f64(m.ops as f64 / (rate * 1e6));
    }
    m
}

/// The command that ran, as one would type it again in a POSIX shell:
/// `cargo run --release -p ntbdk-bench --bin BIN [--features F] -- ARGS`
/// with this process's arguments (single-quoted where a shell would read
/// them otherwise) and the bench crate's features this build has.
pub fn command_line(bin: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_=.,/:+@%".contains(c);
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .map(|a| {
            if !a.is_empty() && a.chars().all(safe) {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect();
    let mut cmd = format!("cargo run --release -p ntbdk-bench --bin {bin}");
    if cfg!(feature = "iceoryx2") {
        cmd.push_str(" --features iceoryx2");
    }
    if !args.is_empty() {
        cmd.push_str(" -- ");
        cmd.push_str(&args.join(" "));
    }
    cmd
}

/// The median of `v` (the mean of the two middle values for an even count),
/// sorting it; `None` when it is empty.
pub fn median_f64(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Prints `rows` as a Markdown table with Mops/s and ns/op.
pub fn print_table(title: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| case | Mops/s | ns/op |");
    println!("| --- | ---: | ---: |");
    for r in rows {
        println!("| {} | {:.2} | {:.2} |", r.name, r.mops(), r.ns_per_op());
    }
}

/// A floor from an issue: `ours` must be at least `min` times `peer`
/// (throughput ratio). Printed as a Markdown table row; returns whether it held.
pub fn check_floor(label: &str, ours: &Row, peer: &Row, min: f64) -> bool {
    let ratio = ours.mops() / peer.mops();
    let ok = ratio >= min;
    println!(
        "| {label} | {} / {} | {ratio:.2}x | >= {min}x | {} |",
        ours.name,
        peer.name,
        if ok { "met" } else { "MISSED" }
    );
    ok
}

/// Prints the header of the floor table [`check_floor`] fills.
pub fn print_floor_header() {
    println!("\n### Ratios (same run)\n");
    println!("| floor | ours / peer | ratio | floor | status |");
    println!("| --- | --- | ---: | ---: | --- |");
}

/// A one-line description of this machine (CPU model, cores, kernel) and the
/// date, for `bench/RESULTS.md`.
pub fn describe_machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = usable_cores().len();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let warn = if cores < 2 {
        " (single core: pinned pairs share it, figures are not meaningful)"
    } else {
        ""
    };
    format!("{cpu}, {cores} usable cores, Linux {kernel}, {date}{warn}")
}

/// The calling thread's CPU time and involuntary context switches so far
/// (`getrusage(RUSAGE_THREAD)`): over a spinning run, CPU time well below
/// the wall time, or many involuntary switches, means the thread was
/// preempted (by another job on a shared core), not slow.
pub fn thread_cpu() -> (Duration, u64) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_THREAD only reads
    // the calling thread's accounting.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return (Duration::ZERO, 0);
    }
    // SAFETY: getrusage succeeded, so it filled `ru`.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime) + tv(ru.ru_stime), ru.ru_nivcsw as u64)
}

/// `n` sends of the same `data` (cookie 0): a burst for `post_sends`.
pub fn send_burst(data: &[u8], n: usize) -> Vec<ntbdk_pmd::transport::SendWr<'_>> {
    let wr = ntbdk_pmd::transport::SendWr {
        data,
        cookie: 0,
        signaled: true,
    };
    vec![wr; n]
}

/// One cache line, alone in its 128 bytes (adjacent-line prefetch pairs
/// lines), bumped in turn by two threads.
#[repr(align(128))]
pub struct Line(pub AtomicU64);

/// Spins until `line` holds `want`, yielding now and then in case the two
/// threads share a core (or run one at a time, as under an instrumenting
/// tool).
#[inline]
pub fn spin_until(line: &AtomicU64, want: u64) {
    spin_until_with(line, want, || {});
}

/// [`spin_until`], calling `meanwhile` on every spin.
#[inline]
pub fn spin_until_with(line: &AtomicU64, want: u64, meanwhile: impl FnMut()) {
    spin_until_yielding(line, want, 1 << 16, meanwhile);
}

/// [`spin_until_with`], yielding every `yield_every` spins.
#[inline]
fn spin_until_yielding(line: &AtomicU64, want: u64, yield_every: u32, mut meanwhile: impl FnMut()) {
    let mut spins = 0u32;
    while line.load(Ordering::Acquire) != want {
        meanwhile();
        std::hint::spin_loop();
        spins += 1;
        if spins == yield_every {
            spins = 0;
            std::thread::yield_now();
        }
    }
}

/// How tightly cores `a` and `b` are coupled: the one-way time in ns of a
/// cache line bounced between a thread on each (the median of up to 64
/// batches of 256 round trips, halved: about 0.5 ms across cores at 14 ns,
/// 5 ms at 160 ns; it stops after 50 ms, with at least one batch).
///
/// On a shared VM the two vCPUs can move between one physical core (tens of
/// ns here) and two (over a hundred) within minutes, and every cross-core
/// figure moves with them: harnesses measure this beside their rows and
/// say when it changed.
pub fn coupling_ns(a: usize, b: usize) -> f64 {
    const BATCHES: usize = 64;
    const BATCH: u64 = 256;
    const BUDGET: Duration = Duration::from_millis(50);
    let line = Line(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    // Yielding soon: the probe must stay short where the two threads take
    // turns on one core (or under an instrumenting tool).
    let wait = |want| spin_until_yielding(&line.0, want, 1 << 10, || {});
    let mut times = std::thread::scope(|s| {
        s.spawn(|| {
            pin(b);
            for i in 0.. {
                wait(2 * i + 1);
                if stop.load(Ordering::Acquire) {
                    return;
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        let timed = s.spawn(|| {
            pin(a);
            let start = Instant::now();
            let mut times = Vec::with_capacity(BATCHES);
            let mut i = 0;
            while times.len() < BATCHES && (times.is_empty() || start.elapsed() < BUDGET) {
                let t = Instant::now();
                for _ in 0..BATCH {
                    line.0.store(2 * i + 1, Ordering::Release);
                    wait(2 * i + 2);
                    i += 1;
                }
                times.push(t.elapsed());
            }
            // The partner wakes on the next odd value, sees `stop`, ends.
            stop.store(true, Ordering::Release);
            line.0.store(2 * i + 1, Ordering::Release);
            times
        });
        timed.join().expect("coupling probe panicked")
    });
    times.sort_unstable();
    times[times.len() / 2].as_nanos() as f64 / BATCH as f64 / 2.0
}

/// Runs `f` between two probes of the cores' coupling: its result, and the
/// coupling (one-way ns) just before and just after it.
pub fn with_coupling<R>(a: usize, b: usize, f: impl FnOnce() -> R) -> (R, (f64, f64)) {
    let before = coupling_ns(a, b);
    let r = f();
    (r, (before, coupling_ns(a, b)))
}

/// Whether two coupling figures differ by more than half: the vCPUs moved
/// between sharing a physical core and not, and figures measured on either
/// side are not comparable.
pub fn coupling_changed(a: f64, b: f64) -> bool {
    a.max(b) > 1.5 * a.min(b)
}

/// Prints the coupling measured at the start and the end of a run, with a
/// warning when it changed (a change and back between the two is not seen).
pub fn report_coupling(start: f64, end: f64) {
    println!(
        "\n- cores' coupling (cache-line ping-pong one-way): {start:.1} ns at the start, \
         {end:.1} ns at the end"
    );
    if coupling_changed(start, end) {
        println!(
            "- WARNING: the coupling changed during the run (the vCPUs moved between sharing \
             a physical core and not): rows measured before and after the change are not \
             comparable; run again"
        );
    }
}

/// One floor's ratio ours / peer within each repetition of an interleaved
/// run (ours and the peer ran in the same repetition, moments apart), with
/// the cores' coupling around the two.
#[derive(Debug, Clone)]
pub struct PairedFloor {
    /// What the floor compares.
    pub label: String,
    /// What it needs, as printed (">= 1.0x", "<= 1.3x").
    pub needed: String,
    /// Ours / peer in each repetition, in order.
    pub ratios: Vec<f64>,
    /// The lowest and highest coupling (ns) probed around ours and the peer
    /// in each repetition.
    pub around: Vec<(f64, f64)>,
}

impl PairedFloor {
    /// A floor with no repetitions yet.
    pub fn new(label: impl Into<String>, needed: impl Into<String>) -> PairedFloor {
        PairedFloor {
            label: label.into(),
            needed: needed.into(),
            ratios: Vec::new(),
            around: Vec::new(),
        }
    }

    /// Records one repetition's ratio and the coupling around it.
    pub fn push(&mut self, ratio: f64, around: (f64, f64)) {
        self.ratios.push(ratio);
        self.around.push(around);
    }
}

/// Prints each floor's ratio within each repetition, median over the
/// repetitions (with their number, and the lowest and highest ratio): a drift
/// of the machine between repetitions does not pair ours from one state with
/// the peer from another. When the coupling changed during the run, also the
/// medians over the repetitions run below the geometric midpoint of the
/// lowest and highest coupling seen and over those run above it (every probe
/// around the pair on one side; a repetition across a change counts in
/// neither).
pub fn print_paired(floors: &[PairedFloor]) {
    if floors.is_empty() {
        return;
    }
    let (lo, hi) = floors
        .iter()
        .flat_map(|f| f.around.iter().flat_map(|&(a, b)| [a, b]))
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), c| {
            (lo.min(c), hi.max(c))
        });
    let split = coupling_changed(lo, hi);
    let mid = (lo * hi).sqrt();
    let median_of = |f: &PairedFloor, keep: &dyn Fn(f64, f64) -> bool| {
        let mut v: Vec<f64> = f
            .ratios
            .iter()
            .zip(&f.around)
            .filter(|(_, (a, b))| keep(*a, *b))
            .map(|(r, _)| *r)
            .collect();
        match median_f64(&mut v) {
            // `median_f64` sorted `v`: its ends are the range.
            Some(m) => format!("{m:.2}x ({}; {:.2}-{:.2})", v.len(), v[0], v[v.len() - 1]),
            None => "- (0)".to_string(),
        }
    };
    println!("\n### Paired ratios (ours / peer within each repetition)\n");
    println!(
        "Each cell: the median ratio (repetitions it is taken over; the lowest and \
         highest ratio among them).\n"
    );
    if split {
        println!(
            "The cores' coupling went from {lo:.0} to {hi:.0} ns during the run: the \
             medians are also given over the repetitions run below {mid:.0} ns and \
             over those run above.\n"
        );
        println!("| floor | all | below {mid:.0} ns | above {mid:.0} ns | needed |");
        println!("| --- | ---: | ---: | ---: | ---: |");
    } else {
        println!("| floor | all | needed |");
        println!("| --- | ---: | ---: |");
    }
    for f in floors {
        let all = median_of(f, &|_, _| true);
        if split {
            let below = median_of(f, &|a, b| a < mid && b < mid);
            let above = median_of(f, &|a, b| a >= mid && b >= mid);
            println!("| {} | {all} | {below} | {above} | {} |", f.label, f.needed);
        } else {
            println!("| {} | {all} | {} |", f.label, f.needed);
        }
    }
}
