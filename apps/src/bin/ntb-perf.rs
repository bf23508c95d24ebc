//! `ntb-perf`: perftest-style bandwidth and latency on an NTB fabric, like
//! `ib_write_bw` / `ib_write_lat` / `ib_read_*` / `ib_send_*`.
//!
//! With no arguments it runs the whole demo by itself: it creates a private
//! emulated fabric, starts the server as a second process (itself, with the
//! hidden `--peer` role), pins the two to different cores, sweeps message
//! sizes from 2 B to 8 MiB for write bandwidth and write latency, prints
//! perftest-style tables and the counters, and cleans up. With `--fabric
//! NAME` the two sides run in two terminals: one with `--server` serves, the
//! other measures.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ntbdk_apps::perf::control::{ServerControl, max_servers};
use ntbdk_apps::perf::session::{
    Children, FabricGuard, attach, attach_or_create, check_interrupted, die_with_parent,
    install_signal_handlers, join, open_vfio, pick_core, pin, usable_cores, wait_peers,
};
use ntbdk_apps::perf::{
    Budget, Client, Endpoint, Op, Test, fabric_config, parse_size, serve, size_label, sweep_sizes,
};
use ntbdk_apps::report::{Progress, Report, Table, write_svg};
use ntbdk_pmd::hw::emu::{EmuDevice, EmuFabric};
use ntbdk_pmd::hw::open::DeviceSpec;
use ntbdk_pmd::hw::{NtbDevice, Port};

/// This tool's name, in messages.
const TOOL: &str = "ntb-perf";
/// Time spent on each message size when neither -n nor -D is given.
const DEFAULT_BUDGET: Duration = Duration::from_millis(200);
/// Untimed latency round trips before each size's samples (bounded by
/// 50 ms).
const LAT_WARMUP: u64 = 100;

/// perftest-style bandwidth and latency on an NTB fabric (ib_write_bw,
/// ib_write_lat, ib_read_*, ib_send_*).
///
/// With no --fabric it runs both sides itself on a private emulated fabric
/// (the server as a second process, pinned to another core); with no
/// arguments at all it sweeps 2 B .. 8 MiB for write bandwidth and write
/// latency. For two terminals:
///   ntb-perf --fabric demo --server
///   ntb-perf --fabric demo --test bw --op write -s 1M
/// Between two VMs sharing an ivshmem device bound to vfio-pci:
///   ntb-perf --device vfio:0000:00:03.0 --server
///   ntb-perf --device vfio:0000:00:03.0 --test bw --op write -s 64K
#[derive(Debug, Parser)]
#[command(name = "ntb-perf", version, verbatim_doc_comment)]
#[command(group(clap::ArgGroup::new("shared").args(["fabric", "device"])))]
struct Args {
    /// Test to run: bw (bandwidth and message rate) or lat (latency).
    /// Default: both.
    #[arg(long, value_enum)]
    test: Option<Test>,
    /// Operation: write (rendezvous, into the server's region), read (of
    /// the server's region) or send (eager, at most 4 KiB).
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Message size (bytes; K, M suffixes: 64, 4K, 1M, 8M). Default: all
    /// sizes (-a).
    #[arg(short = 's', long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "all")]
    size: Option<u64>,
    /// All sizes: powers of two from 2 B to 8 MiB (to 4 KiB for send).
    #[arg(short = 'a', long)]
    all: bool,
    /// Operations per size (default: as many as fit in 0.2 s).
    #[arg(short = 'n', long, value_name = "ITERS", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    iters: Option<u64>,
    /// Seconds per size (instead of -n).
    #[arg(short = 'D', long, value_name = "SECONDS", conflicts_with = "iters")]
    duration: Option<f64>,
    /// Work requests posted per call.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    burst: u64,
    /// Most bandwidth operations outstanding at once (perftest's tx-depth).
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=4096))]
    tx_depth: u64,
    /// Queue pairs (one per server: the transport has one per peer). The
    /// private fabric gets one server process per queue pair; with --fabric,
    /// the client uses the first N servers whose links are up.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    qp: u64,
    /// Core to pin this side to (an index into the usable cores; default 1
    /// for --server when there are two or more, else 0).
    #[arg(long, value_name = "CORE")]
    lcore: Option<usize>,
    /// Core to pin the spawned server(s) to (without --fabric).
    #[arg(
        long,
        value_name = "CORE",
        default_value_t = 1,
        conflicts_with = "shared"
    )]
    peer_lcore: usize,
    /// Join the shared fabric NAME instead of running both sides on a
    /// private one. The --server side creates it if it does not exist (and
    /// removes it on exit).
    #[arg(long, value_name = "NAME")]
    fabric: Option<String>,
    /// The device to use instead of a private fabric: emu:NAME (as --fabric
    /// NAME) or vfio:BDF (a PCI function bound to vfio-pci; ivshmem).
    #[arg(long, value_name = "SPEC", conflicts_with = "fabric")]
    device: Option<DeviceSpec>,
    /// Our slot on --fabric (default: the first free one).
    #[arg(long, value_name = "N", requires = "shared")]
    slot: Option<Port>,
    /// The other side's slot (default: the first other slot whose link comes
    /// up).
    #[arg(long, value_name = "N", requires = "shared")]
    peer_slot: Option<Port>,
    /// Be the server (with --fabric); the other side measures.
    #[arg(long, requires = "shared")]
    server: bool,
    /// Slots of the fabric a --server creates (clients and servers; 2 for
    /// one queue pair, N+1 for --qp N).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=16))]
    slots: u64,
    /// Seconds to wait for the peer to appear, and for any answer, before
    /// giving up.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
    /// Write every figure as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Plot bandwidth vs size and the latency distribution as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// The server spawned by a self-contained run (internal).
    #[arg(long, hide = true, requires_all = ["fabric", "slot", "peer_slot"])]
    peer: bool,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    // An emu: device is a named fabric.
    if let Some(DeviceSpec::Emu(name)) = &args.device {
        args.fabric = Some(name.clone());
        args.device = None;
    }
    install_signal_handlers();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{TOOL}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!(
            "--timeout must be a positive number of seconds, not {}",
            args.timeout
        );
    }
    if let Some(d) = args.duration
        && !(d > 0.0 && d.is_finite() && d <= 3600.0)
    {
        bail!("-D/--duration must be a number of seconds in (0, 3600], not {d}");
    }
    if args.op == Op::Send
        && let Some(s) = args.size
        && s > u64::from(ntbdk_apps::perf::EAGER_SIZE)
    {
        bail!(
            "-s {s}: a send carries at most {} bytes (one eager buffer); use --op write for \
             larger messages",
            ntbdk_apps::perf::EAGER_SIZE
        );
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let cores = usable_cores();
    // A server defaults to the second usable core, so that a client on the
    // same host keeps the first; with only one core (a one-vCPU VM, a
    // cpuset of one), both sides take it.
    let lcore = args
        .lcore
        .unwrap_or(usize::from(args.server && cores.len() > 1));
    let core = pick_core(&cores, lcore, "--lcore")?;
    let vfio = args.device.clone();
    let vfio_name = vfio.as_ref().map(|spec| spec.to_string());
    match args.fabric.as_ref().or(vfio_name.as_ref()) {
        None => self_contained(args, &cores, core, timeout),
        Some(name) if args.peer || args.server => {
            if args.peer {
                die_with_parent();
            }
            // `_owned` removes the fabric on exit if we created it.
            let (dev, _owned) = match &vfio {
                Some(spec) => (open_vfio(spec, args.slot)?, None),
                None if args.peer => {
                    let f = attach(name, "the fabric of the run that spawned us is gone")?;
                    (join(&f, args.slot)?, None)
                }
                None => {
                    let (f, owned) = attach_or_create(name, &fabric_config(args.slots as usize))?;
                    (join(&f, args.slot)?, owned)
                }
            };
            let dev = Arc::new(dev);
            let mut ctl = ServerControl::new(dev.clone())?;
            let mut ep = Endpoint::new(dev.clone(), timeout)?;
            if !args.peer {
                let how = if vfio.is_some() {
                    "--device"
                } else {
                    "--fabric"
                };
                println!(
                    "{TOOL}: server on port {} of fabric {name:?}: waiting for a client \
                     (ntb-perf {how} {name}) for {timeout:?}",
                    dev.port()
                );
            }
            let want: Vec<Port> = args.peer_slot.into_iter().collect();
            let client = wait_peers(&dev, &want, 1, timeout, TOOL, || Ok(()))?[0];
            pin(TOOL, core);
            let stats = serve(&mut ep, &mut ctl, client, timeout)?;
            if !args.peer {
                println!(
                    "{TOOL}: served port {client}: {} commands, {} messages received, {} echoes",
                    stats.commands, stats.recvs, stats.echoes
                );
            }
            Ok(())
        }
        Some(name) => {
            let dev = match &vfio {
                Some(spec) => open_vfio(spec, args.slot)?,
                None => {
                    let fabric = attach(
                        name,
                        &format!("start the server first: ntb-perf --fabric {name} --server"),
                    )?;
                    join(&fabric, args.slot)?
                }
            };
            let dev = Arc::new(dev);
            if args.qp as usize > max_servers(dev.as_ref()) {
                bail!(
                    "--qp {}: at most {} servers per client on this fabric",
                    args.qp,
                    max_servers(dev.as_ref())
                );
            }
            let ep = Endpoint::new(dev.clone(), timeout)?;
            let want: Vec<Port> = args.peer_slot.into_iter().collect();
            if !want.is_empty() && args.qp > 1 {
                bail!("--peer-slot names one server: use it with --qp 1");
            }
            let servers = wait_peers(&dev, &want, args.qp as usize, timeout, TOOL, || Ok(()))?;
            pin(TOOL, core);
            let client = Client::connect(ep, &servers, timeout)?;
            measure(args, &dev, client, name, core, None)
        }
    }
}

/// Both sides: a private fabric, the server(s) as child processes.
fn self_contained(
    args: &Args,
    cores: &[core_affinity::CoreId],
    core: core_affinity::CoreId,
    timeout: Duration,
) -> Result<()> {
    let peer_core = pick_core(cores, args.peer_lcore, "--peer-lcore")?;
    if cores.len() < 2 || peer_core == core {
        eprintln!(
            "{TOOL}: warning: client and server share core {}: the figures measure the \
             scheduler, not the fabric",
            core.id
        );
    }
    let name = format!("perf-{}", std::process::id());
    let slots = args.qp as usize + 1;
    let fabric = EmuFabric::create(&name, &fabric_config(slots))
        .with_context(|| format!("creating the private fabric {name:?}"))?;
    let _fabric_guard = FabricGuard(name.clone());
    let dev = Arc::new(join(&fabric, Some(0))?);
    let ep = Endpoint::new(dev.clone(), timeout)?;

    let exe = std::env::current_exe().context("finding this program to start the server")?;
    let mut children = Children::default();
    for slot in 1..slots {
        let child = Command::new(&exe)
            .args(["--peer", "--fabric", &name, "--peer-slot", "0"])
            .args(["--slot", &slot.to_string()])
            .args(["--lcore", &args.peer_lcore.to_string()])
            .args(["--timeout", &args.timeout.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the server process")?;
        children.push(child);
    }
    let want: Vec<Port> = (1..slots as Port).collect();
    wait_peers(&dev, &want, want.len(), timeout, TOOL, || {
        children.check_running("the server process")
    })
    .context("waiting for the server process to join the private fabric")?;
    pin(TOOL, core);
    let client = Client::connect(ep, &want, timeout)?;
    measure(
        args,
        &dev,
        client,
        &name,
        core,
        Some((peer_core, &mut children)),
    )
}

/// The sizes to run for `op`: `-s`, or the sweep up to what `op` can move.
fn sizes(args: &Args, client: &Client, op: Op) -> Vec<u64> {
    match args.size {
        Some(s) => vec![s],
        None => sweep_sizes(client.max_size(op)),
    }
}

fn budget(args: &Args) -> Budget {
    match (args.iters, args.duration) {
        (Some(n), _) => Budget::iterations(n),
        (None, Some(d)) => Budget::duration(Duration::from_secs_f64(d)),
        (None, None) => Budget::duration(DEFAULT_BUDGET),
    }
}

/// Runs the tests, prints the tables and counters, writes --json/--plot.
fn measure(
    args: &Args,
    dev: &EmuDevice,
    mut client: Client,
    fabric: &str,
    core: core_affinity::CoreId,
    spawned: Option<(core_affinity::CoreId, &mut Children)>,
) -> Result<()> {
    let tests: Vec<Test> = match args.test {
        Some(t) => vec![t],
        None => vec![Test::Bw, Test::Lat],
    };
    let budget = budget(args);
    let servers = client.server_ports();
    let peer_desc = match &spawned {
        Some((c, _)) => format!("port(s) {servers:?} (core {})", c.id),
        None => format!("port(s) {servers:?}"),
    };
    println!(
        "{TOOL}: {} on fabric {fabric}: port {} (core {}) -> {peer_desc}",
        args.op.name(),
        dev.port(),
        core.id
    );
    if dev.window_is_huge() {
        println!("{TOOL}: windows on hugepages");
    } else {
        println!("{TOOL}: windows on 4 KiB pages (no hugepages reserved)");
    }
    let mut report = Report::new(TOOL);
    report
        .param("op", args.op.name())
        .param("burst", args.burst)
        .param("tx_depth", args.tx_depth)
        .param("qp", args.qp)
        .param("budget", budget.describe())
        .param("fabric", fabric)
        .param("lcore", core.id)
        .param(
            "latency",
            "one-way (half round trip) for write and send; round trip for read",
        );
    let started = Instant::now();
    for test in tests {
        let sizes = sizes(args, &client, args.op);
        let mut progress = Progress::new(
            &format!("{} {}", args.op.name(), test_name(test)),
            sizes.len(),
        );
        match test {
            Test::Bw => {
                println!(
                    "\n{} bandwidth: burst {}, tx depth {}, {} queue pair(s), {} per size",
                    args.op.name(),
                    args.burst,
                    args.tx_depth,
                    args.qp,
                    budget.describe()
                );
                let t = Table::BANDWIDTH;
                println!("{}\n{}", t.rule(), t.header());
                for &size in &sizes {
                    progress.step(&size_label(size));
                    let row = client.bandwidth(
                        args.op,
                        size,
                        args.burst as usize,
                        args.tx_depth as usize,
                        budget,
                    )?;
                    println!("{}", t.bw_line(&row));
                    report.bandwidth.push(row);
                    check_interrupted()?;
                }
                progress.finish();
                println!("{}", t.rule());
            }
            Test::Lat => {
                let what = if args.op == Op::Read {
                    "round trip"
                } else {
                    "one-way = half round trip"
                };
                println!(
                    "\n{} latency ({what}), {} per size:",
                    args.op.name(),
                    budget.describe()
                );
                let t = Table::LATENCY;
                println!("{}\n{}", t.rule(), t.header());
                for &size in &sizes {
                    progress.step(&size_label(size));
                    let row = client.latency(args.op, size, LAT_WARMUP, budget)?;
                    println!("{}", t.lat_line(&row));
                    report.latency.push(row);
                    check_interrupted()?;
                }
                progress.finish();
                println!("{}", t.rule());
            }
        }
    }
    let took = started.elapsed();
    client.stop()?;
    if let Some((_, children)) = spawned {
        for status in children.wait_all(Duration::from_secs(5))? {
            if !status.success() {
                bail!("the server process failed ({status})");
            }
        }
    }
    print_counters(&client, dev, took);
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!("{TOOL}: figures written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        write_svg(&report, path)?;
        println!("{TOOL}: plot written to {}", path.display());
    }
    Ok(())
}

fn test_name(t: Test) -> &'static str {
    match t {
        Test::Bw => "bw",
        Test::Lat => "lat",
    }
}

/// Queue-pair and device counters of the client, and what they prove.
fn print_counters(client: &Client, dev: &EmuDevice, took: Duration) {
    println!(
        "\ncounters (client side, {:.1} s of tests):",
        took.as_secs_f64()
    );
    for (port, c) in client.counters() {
        println!(
            "  qp -> port {port}: writes {}, reads {}, sends {}, recvs {}, served {}, \
             bytes out {}, bytes in {}, failed {}, dropped {}, empty polls {}",
            c.writes,
            c.reads,
            c.sends,
            c.recvs,
            c.served,
            c.bytes_out,
            c.bytes_in,
            c.failed_ops,
            c.dropped_total(),
            c.empty_polls
        );
    }
    let d = dev.counters();
    println!(
        "  device: posted writes {} ({} bytes), non-posted reads {}{}",
        d.posted_writes,
        d.posted_bytes,
        d.non_posted_reads,
        if d.non_posted_reads == 0 {
            " (0: every byte, message and credit crossed as a posted write)"
        } else {
            " (NOT 0: something read through the bridge)"
        }
    );
}
