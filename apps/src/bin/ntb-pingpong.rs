//! `ntb-pingpong`: doorbell or scratchpad ping-pong between two peers (on
//! an emulated NTB fabric, or a device given with `--device`), like Linux's
//! `ntb_pingpong`, reporting round-trip times.
//!
//! With no role arguments it runs the whole thing by itself: it creates a
//! private fabric, starts the echo side as a second process (itself, with the
//! hidden `--spawned-side` role), pins the two to different cores, measures, prints
//! and cleans up. With `--fabric NAME` the two sides run in two terminals:
//! one with `--server` echoes, the other measures.
//!
//! Protocol. Doorbells: the measuring side rings bit 0 on the echo side,
//! which clears it and rings bit 0 back; bit 1 tells the echo side to stop.
//! Scratchpads: the measuring side writes a sequence number into the echo
//! side's scratchpad 0, which copies it back into the measuring side's
//! scratchpad 0; `u32::MAX` tells it to stop. Every access is a posted write
//! or a read of one's own registers; nothing reads through the bridge.
//!
//! Pairing. Before the first ping the measuring side writes "measuring"
//! into its peer's role register (the last scratchpad, `cli::role`) and
//! waits for "echo" in its own; the echo side takes only a peer that said
//! it measures. So two measuring sides say what the other is instead of
//! timing each other's pings, and an echo side is not taken by another app
//! or a host that joined the fabric for a moment. The marks name the
//! registers (`--via`) too: sides given different ones both say so at
//! once, where the echo side would otherwise wait for pings that never
//! come.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use ntbdk_apps::cli::host::{Host, open_device};
use ntbdk_apps::cli::role::{
    Role, Via, announce, announced, await_counterpart, check_same_via, clear_role,
};
use ntbdk_apps::cli::session::{
    Children, FabricGuard, attach, attach_or_create, check_interrupted, check_writable,
    die_with_parent, join, leave_signals_to_parent, pick_core, pin, spawned_by_us, usable_cores,
    wait_peers, wait_peers_where, warn_shared_cores,
};
use ntbdk_apps::cli::units::secs;
use ntbdk_apps::cli::{is_interrupted, run_main, usage_error};
use ntbdk_apps::perf::HEARTBEAT_TIMEOUT;
use ntbdk_apps::report::{LatRow, Report, lat_table, new_histogram, write_svg};
use ntbdk_pmd::hw::emu::{EmuFabric, FabricConfig};
use ntbdk_pmd::hw::open::DeviceSpec;
use ntbdk_pmd::hw::{NtbDevice, Port};

/// Doorbell bit of a ping (and of its echo).
const DB_PING: u64 = 1 << 0;
/// Doorbell bit that tells the echo side to stop.
const DB_STOP: u64 = 1 << 1;
/// Scratchpad that carries the sequence number.
const SPAD_SEQ: usize = 0;
/// Sequence number that tells the echo side to stop.
const SPAD_STOP: u32 = u32::MAX;
/// Polls spent spinning before a wait starts looking at the clock.
const FAST_SPINS: u32 = 4096;
/// Once a wait has lasted this long it yields the core between polls, so a
/// peer sharing the core (or a starved heartbeat thread) can run.
const YIELD_AFTER: Duration = Duration::from_micros(200);

/// Clears what this side reads of the pairing and the ping-pong: its role
/// register, its sequence scratchpad and its ping and stop doorbells. An
/// Intel NTB's scratchpads outlive the run that wrote them (an emulated
/// fabric's slot starts zeroed): the stop a previous run left would end
/// the next echo side at once.
fn clear_own(dev: &dyn NtbDevice) -> Result<()> {
    clear_role(dev)?;
    dev.spad_write(SPAD_SEQ, 0)?;
    dev.db_clear(DB_PING | DB_STOP);
    Ok(())
}

/// Doorbell and scratchpad ping-pong between two peers on an emulated NTB
/// fabric or a --device, reporting round-trip times.
///
/// With no --fabric it runs both sides itself on a private fabric (the echo
/// side as a second process, pinned to another core). For two terminals:
///   ntb-pingpong --fabric demo --slot 0 --server
///   ntb-pingpong --fabric demo --slot 1
/// Between two VMs sharing an ivshmem device bound to vfio-pci:
///   ntb-pingpong --device vfio:0000:00:03.0 --server
///   ntb-pingpong --device vfio:0000:00:03.0
#[derive(Debug, Parser)]
#[command(
    name = "ntb-pingpong",
    version,
    verbatim_doc_comment,
    allow_negative_numbers = true
)]
#[command(group(clap::ArgGroup::new("shared").args(["fabric", "device"])))]
struct Args {
    /// Ping-pong through doorbells or scratchpads (both sides must say the
    /// same: a side waiting on one never sees the other).
    #[arg(long, value_enum, default_value = "db")]
    via: Via,
    /// Round trips to measure.
    #[arg(short = 'n', long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    iters: u64,
    /// Round trips run first and not measured.
    #[arg(long, default_value_t = 1000)]
    warmup: u64,
    /// Join the shared fabric NAME instead of running both sides on a
    /// private one. The --server side creates it if it does not exist (and
    /// removes it on exit).
    #[arg(long, value_name = "NAME")]
    fabric: Option<String>,
    /// The device to use instead of a private fabric: emu:NAME (as --fabric
    /// NAME) or vfio:BDF (a PCI function bound to vfio-pci: ivshmem, or an
    /// Intel NTB, whose port is its side of the link).
    #[arg(long, value_name = "SPEC", conflicts_with = "fabric")]
    device: Option<DeviceSpec>,
    /// Our slot on --fabric (default: the first free one).
    #[arg(long, value_name = "N", requires = "shared")]
    slot: Option<Port>,
    /// The other side's slot (default: the first other slot whose link comes
    /// up).
    #[arg(long, value_name = "N", requires = "shared", visible_alias = "peer")]
    peer_slot: Option<Port>,
    /// Be the echo side (with --fabric or --device); the other side measures.
    #[arg(long, requires = "shared")]
    server: bool,
    /// Core to pin this side to (an index into the usable cores; default 1
    /// for --server, else 0; 0 on a single usable core).
    #[arg(long, value_name = "CORE")]
    lcore: Option<usize>,
    /// Core to pin the spawned echo side to (without --fabric; default 1,
    /// or 0 on a single usable core, where the two sides share it).
    #[arg(long, value_name = "CORE", conflicts_with = "shared")]
    peer_lcore: Option<usize>,
    /// Seconds to wait for the peer to appear (default: 10 for the
    /// measuring side; the echo side waits until Ctrl-C), and for any answer
    /// (default 10).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Write every figure as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Plot the round-trip time distribution as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// The echo side spawned by a self-contained run (internal).
    #[arg(long = "spawned-side", hide = true, requires_all = ["fabric", "slot", "peer_slot"])]
    spawned: bool,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    // An emu: device is a named fabric.
    if let Some(DeviceSpec::Emu(name)) = &args.device {
        args.fabric = Some(name.clone());
        args.device = None;
    }
    run_main(TOOL, || run(&args))
}

/// This tool's name, in messages.
const TOOL: &str = "ntb-pingpong";

fn run(args: &Args) -> Result<()> {
    let timeout = secs(args.timeout.unwrap_or(10.0), "--timeout").map_err(usage_error)?;
    for (path, flag) in [(&args.json, "--json"), (&args.plot, "--plot")] {
        match path {
            Some(p) if !args.server => check_writable(p, flag)?,
            Some(_) if !args.spawned => eprintln!(
                "{TOOL}: note: {flag} ignored on the echo side: the measuring side writes it"
            ),
            _ => {}
        }
    }
    let cores = usable_cores();
    // One usable core (a one-vCPU VM, taskset -c 0): both sides on it.
    let second = usize::from(cores.len() > 1);
    let lcore = args.lcore.unwrap_or(if args.server { second } else { 0 });
    let core = pick_core(&cores, lcore, "--lcore")?;
    let vfio_name = args.device.as_ref().map(|spec| spec.to_string());
    let how = if args.device.is_some() {
        "--device"
    } else {
        "--fabric"
    };
    match args.fabric.as_ref().or(vfio_name.as_ref()) {
        None => self_contained(args, &cores, core, timeout),
        Some(name) if args.spawned || args.server => {
            if args.spawned {
                die_with_parent();
                leave_signals_to_parent();
            }
            // `_owned` removes the fabric on exit if we created it.
            let (host, _owned) = match &args.device {
                Some(spec) => (open_device(spec, args.slot)?, None),
                None if args.spawned => (
                    Host::member(join(
                        &attach(name, "the fabric of the run that spawned us is gone")?,
                        args.slot,
                    )?),
                    None,
                ),
                None => {
                    let (fabric, owned) = attach_or_create(name, &fabric_config())?;
                    (Host::member(join(&fabric, args.slot)?), owned)
                }
            };
            let dev = &*host.dev;
            clear_own(dev)?;
            if !args.spawned {
                println!(
                    "{TOOL}: echo side on port {} of {}: waiting for the measuring side (on the \
                     other side run: {TOOL} {how} {name})",
                    dev.port(),
                    host.place
                );
            }
            let want: Vec<Port> = args.peer_slot.into_iter().collect();
            let hint = format!("start the measuring side ({TOOL} {how} {name})");
            let wait = args.timeout.map(|_| timeout);
            // Only a measuring side that said so: not a twin, not another
            // app, not a host that joined for a moment (ntb-tool). One
            // that pings through the other registers is an error, at once.
            let (mine, theirs) = (Role::Echo(args.via), Role::Measure(args.via));
            let refused = std::cell::RefCell::new(None);
            let measuring = |p| {
                if let Err(e) = check_same_via(dev, p, mine, theirs) {
                    refused.borrow_mut().get_or_insert(e);
                }
                announced(dev, p, theirs)
            };
            let peer =
                wait_peers_where(dev, &host.place, &want, 1, wait, &hint, measuring, || {
                    refused.borrow_mut().take().map_or(Ok(()), Err)
                })?[0];
            announce(dev, peer, mine)?;
            pin(TOOL, core);
            let served = echo(dev, peer, args.via, timeout)?;
            if !args.spawned {
                println!("{TOOL}: echoed {served} round trips for port {peer}");
            }
            Ok(())
        }
        Some(name) => {
            let host = match &args.device {
                Some(spec) => open_device(spec, args.slot)?,
                None => Host::member(join(
                    &attach(
                        name,
                        &format!("start the echo side first: {TOOL} --fabric {name} --server"),
                    )?,
                    args.slot,
                )?),
            };
            let dev = &*host.dev;
            clear_own(dev)?;
            let want: Vec<Port> = args.peer_slot.into_iter().collect();
            let hint = format!("start the echo side ({TOOL} {how} {name} --server)");
            let peer = wait_peers(dev, &host.place, &want, 1, Some(timeout), &hint, || Ok(()))?[0];
            await_echo(dev, peer, args.via, timeout)?;
            pin(TOOL, core);
            let (rtt, stopped) = measure(dev, peer, args, timeout)?;
            finish(args, &host, peer, name, core, None, &rtt)?;
            stopped.map_or(Ok(()), Err)
        }
    }
}

/// Both sides: a private fabric, the echo side as a child process.
fn self_contained(
    args: &Args,
    cores: &[core_affinity::CoreId],
    core: core_affinity::CoreId,
    timeout: Duration,
) -> Result<()> {
    let peer_lcore = args.peer_lcore.unwrap_or(usize::from(cores.len() > 1));
    let peer_core = pick_core(cores, peer_lcore, "--peer-lcore")?;
    warn_shared_cores(
        TOOL,
        &[
            ("the measuring side".to_string(), core),
            ("the echo side".to_string(), peer_core),
        ],
        "--lcore, --peer-lcore",
    );
    let name = format!("pingpong-{}", std::process::id());
    let cfg = fabric_config();
    let fabric = EmuFabric::create(&name, &cfg)
        .with_context(|| format!("creating the private fabric {name:?}"))?;
    let _fabric_guard = FabricGuard(name.clone());
    let host = Host::member(join(&fabric, Some(0))?);
    let dev = &*host.dev;
    clear_own(dev)?;

    let exe = std::env::current_exe().context("finding this program to start the echo side")?;
    let mut cmd = Command::new(exe);
    spawned_by_us(&mut cmd);
    cmd.args([
        "--spawned-side",
        "--fabric",
        &name,
        "--slot",
        "1",
        "--peer-slot",
        "0",
    ])
    .args([
        "--via",
        args.via
            .to_possible_value()
            .expect("not skipped")
            .get_name(),
    ])
    .args(["--lcore", &peer_lcore.to_string()])
    .args(["--timeout", &timeout.as_secs_f64().to_string()])
    .stdin(Stdio::null());
    let mut children = Children::default();
    children.push(cmd.spawn().context("starting the echo side")?);
    // The echo side is up when its link is.
    wait_peers(
        dev,
        &host.place,
        &[1],
        1,
        Some(timeout),
        "the machine may be overloaded; try a longer --timeout",
        || children.check_running("the echo side"),
    )
    .with_context(|| format!("waiting for the echo side to join fabric {name:?}"))?;
    await_echo(dev, 1, args.via, timeout)?;
    pin(TOOL, core);
    let (rtt, stopped) = measure(dev, 1, args, timeout)?;
    if stopped.is_none() {
        for status in children.wait_all(timeout)? {
            if !status.success() {
                bail!("the echo side failed ({status})");
            }
        }
    }
    finish(args, &host, 1, &name, core, Some(peer_core), &rtt)?;
    stopped.map_or(Ok(()), Err)
}

/// Prints the table (and writes `--json` / `--plot`).
fn finish(
    args: &Args,
    host: &Host,
    peer: Port,
    fabric: &str,
    core: core_affinity::CoreId,
    peer_core: Option<core_affinity::CoreId>,
    rtt: &LatRow,
) -> Result<()> {
    let peer_core = peer_core.map_or_else(String::new, |c| format!(" (CPU {})", c.id));
    println!(
        "{TOOL}: {} ping-pong, port {} (CPU {}) <-> port {peer}{peer_core}, {}",
        args.via.describe(),
        host.port(),
        core.id,
        host.place,
    );
    println!(
        "round-trip times, {} round trips after {} warm-up{}:",
        rtt.iterations,
        args.warmup,
        if rtt.interrupted {
            " (cut short by Ctrl-C)"
        } else {
            ""
        }
    );
    print!("{}", lat_table(std::slice::from_ref(rtt)));
    let c = host.dev.counters();
    println!(
        "one-way (half round trip): typical {:.3} usec; posted writes {}, non-posted reads {}",
        rtt.t_typical_us / 2.0,
        c.posted_writes,
        c.non_posted_reads
    );

    let mut report = Report::new("ntb-pingpong");
    report
        .param("via", args.via.describe())
        .param("iters", args.iters)
        .param("warmup", args.warmup)
        .param("fabric", fabric)
        .param("cpu", core.id)
        .param("metric", "round trip")
        .param("bytes", args.via.bytes());
    report.latency.push(rtt.clone());
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    if let Some(path) = &args.plot {
        write_svg(&report, path)?;
    }
    Ok(())
}

/// Before the first ping: tells `peer` we measure, and waits until it says
/// it echoes. Fails when it is another measuring side, leaves, or says
/// nothing for `timeout`.
fn await_echo(dev: &dyn NtbDevice, peer: Port, via: Via, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    await_counterpart(
        dev,
        peer,
        Role::Measure(via),
        Role::Echo(via),
        timeout,
        || {
            check_interrupted()?;
            if !dev.link(peer)?.up {
                bail!("port {peer} left the fabric before it said it is an echo side");
            }
            if start.elapsed() >= YIELD_AFTER {
                std::thread::yield_now();
            }
            Ok(())
        },
    )
}

/// The measuring side: warm-up, then `iters` timed round trips. Interrupted
/// (Ctrl-C) after some were timed, it returns those with the interrupt, so
/// what was measured is still printed and saved.
fn measure(
    dev: &dyn NtbDevice,
    peer: Port,
    args: &Args,
    timeout: Duration,
) -> Result<(LatRow, Option<anyhow::Error>)> {
    let waiter = Waiter::new(dev, peer, timeout);
    let mut hist = new_histogram();
    let mut seq: u32 = 0;
    let round_trip = |seq: &mut u32| -> Result<()> {
        match args.via {
            Via::Db => {
                dev.peer_db_set(peer, DB_PING)?;
                waiter.wait("the echo of a doorbell", || dev.db_read() & DB_PING != 0)?;
                dev.db_clear(DB_PING);
            }
            Via::Spad => {
                *seq = if *seq + 1 == SPAD_STOP { 1 } else { *seq + 1 };
                let want = *seq;
                dev.peer_spad_write(peer, SPAD_SEQ, want)?;
                waiter.wait("the echo of a scratchpad write", || {
                    dev.spad_read(SPAD_SEQ).is_ok_and(|v| v == want)
                })?;
            }
        }
        Ok(())
    };
    let mut run = || -> Result<(LatRow, Option<anyhow::Error>)> {
        for _ in 0..args.warmup {
            check_interrupted()?;
            round_trip(&mut seq)?;
        }
        let mut t0 = Instant::now();
        for _ in 0..args.iters {
            // Ctrl-C is looked at every round trip (one relaxed load): a
            // round trip on quiet cores never waits long enough for the
            // wait's own check, and a long -n would run to its end.
            match check_interrupted().and_then(|()| round_trip(&mut seq)) {
                Ok(()) => {}
                Err(e) if is_interrupted(&e) && !hist.is_empty() => {
                    let row = LatRow {
                        interrupted: true,
                        ..LatRow::from_histogram(args.via.bytes(), &hist)
                    };
                    return Ok((row, Some(e)));
                }
                Err(e) => return Err(e),
            }
            let t1 = Instant::now();
            hist.saturating_record(t1.duration_since(t0).as_nanos() as u64);
            t0 = t1;
        }
        Ok((LatRow::from_histogram(args.via.bytes(), &hist), None))
    };
    let measured = run();
    // The echo side stops at this word, after the last round trip or at
    // Ctrl-C (so that it ends cleanly too; best effort then: the result is
    // what was measured).
    let tell_stop = || match args.via {
        Via::Db => dev.peer_db_set(peer, DB_STOP),
        Via::Spad => dev.peer_spad_write(peer, SPAD_SEQ, SPAD_STOP),
    };
    match &measured {
        Ok((_, None)) => tell_stop()?,
        Ok((_, Some(_))) => {
            let _ = tell_stop();
        }
        Err(e) if is_interrupted(e) => {
            let _ = tell_stop();
        }
        Err(_) => {}
    }
    measured
}

/// The echo side: answers pings until told to stop. Returns how many.
fn echo(dev: &dyn NtbDevice, peer: Port, via: Via, timeout: Duration) -> Result<u64> {
    let waiter = Waiter::new(dev, peer, timeout);
    let mut served = 0u64;
    match via {
        // Ctrl-C is looked at every ping, as the measuring side does: on
        // quiet cores each ping can come before the wait's own check.
        Via::Db => loop {
            check_interrupted()?;
            let mut bits = 0;
            waiter.wait("a ping", || {
                bits = dev.db_read() & (DB_PING | DB_STOP);
                bits != 0
            })?;
            // Stop first: a ping still unanswered at the measuring side's
            // Ctrl-C has nobody left to answer.
            if bits & DB_STOP != 0 {
                dev.db_clear(DB_STOP | DB_PING);
                return Ok(served);
            }
            dev.db_clear(DB_PING);
            dev.peer_db_set(peer, DB_PING)?;
            served += 1;
        },
        Via::Spad => {
            let mut last = 0u32;
            loop {
                check_interrupted()?;
                let mut v = 0;
                waiter.wait("a ping", || {
                    v = dev.spad_read(SPAD_SEQ).unwrap_or(last);
                    v != last
                })?;
                if v == SPAD_STOP {
                    return Ok(served);
                }
                dev.peer_spad_write(peer, SPAD_SEQ, v)?;
                last = v;
                served += 1;
            }
        }
    }
}

/// Spin-waits with a timeout, watching the peer's link and Ctrl-C.
struct Waiter<'a> {
    dev: &'a dyn NtbDevice,
    peer: Port,
    timeout: Duration,
}

impl<'a> Waiter<'a> {
    fn new(dev: &'a dyn NtbDevice, peer: Port, timeout: Duration) -> Self {
        Self { dev, peer, timeout }
    }

    /// Polls `ready` until it holds. Fails when `timeout` passes, the peer's
    /// link goes down or the process is interrupted.
    #[inline]
    fn wait(&self, what: &str, mut ready: impl FnMut() -> bool) -> Result<()> {
        for _ in 0..FAST_SPINS {
            if ready() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        self.wait_slow(what, &mut ready)
    }

    #[inline(never)]
    fn wait_slow(&self, what: &str, ready: &mut dyn FnMut() -> bool) -> Result<()> {
        let start = Instant::now();
        let mut polls = 0u64;
        loop {
            if ready() {
                return Ok(());
            }
            polls += 1;
            if polls.is_multiple_of(64) {
                let waited = start.elapsed();
                check_interrupted()?;
                if waited >= self.timeout {
                    bail!(
                        "no answer from port {} within {:?} while waiting for {what}: \
                         is the other side still running?",
                        self.peer,
                        self.timeout
                    );
                }
                if polls.is_multiple_of(4096) && !self.dev.link(self.peer)?.up {
                    bail!(
                        "port {} left the fabric (its link went down) while we waited for {what}",
                        self.peer
                    );
                }
                if waited >= YIELD_AFTER {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// The geometry of the fabrics this tool creates: two slots, small windows
/// (ping-pong uses registers only).
fn fabric_config() -> FabricConfig {
    FabricConfig {
        slots: 2,
        window_size: 64 << 10,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        ..FabricConfig::default()
    }
}
