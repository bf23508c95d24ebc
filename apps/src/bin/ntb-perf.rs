//! `ntb-perf`: perftest-style bandwidth and latency on an NTB fabric, like
//! `ib_write_bw` / `ib_write_lat` / `ib_read_*` / `ib_send_*`, with
//! perftest's flags and its tables column for column.
//!
//! With no arguments it runs the whole demo by itself: it creates a private
//! emulated fabric, starts the server as a second process (itself, with the
//! hidden `--spawned-side` role), pins the two to different cores, sweeps message
//! sizes from 2 B to 8 MiB for write bandwidth and write latency, prints
//! perftest's tables and the counters, and cleans up. With `--fabric NAME`
//! or `--device SPEC` the two sides run in two terminals (or on two hosts):
//! one with `--server` serves, the other measures.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::error::{ContextKind, ContextValue};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use ntbdk_apps::cli::host::{Host, open_device};
use ntbdk_apps::cli::hugepages::hugepage_pools;
use ntbdk_apps::cli::session::{
    Children, FabricGuard, attach, attach_or_create, check_interrupted, check_writable,
    die_with_parent, join, leave_signals_to_parent, pick_core, pin, publish_stats, spawned_by_us,
    usable_cores, wait_peers, warn_shared_cores,
};
use ntbdk_apps::cli::units::secs;
use ntbdk_apps::cli::{is_interrupted, run_main, usage_error};
use ntbdk_apps::perf::control::{ServerControl, max_servers};
use ntbdk_apps::perf::perftest::{self, Invocation};
use ntbdk_apps::perf::{
    Budget, Client, EAGER_SIZE, Endpoint, Op, Test, WriteMode, fabric_config, parse_size, serve,
    size_label, sweep_sizes,
};
use ntbdk_apps::report::{
    BwRow, BwUnit, Progress, RULE, Report, bw_header, bw_line, lat_header, lat_line, write_svg,
};
use ntbdk_pmd::hw::emu::EmuFabric;
use ntbdk_pmd::hw::open::DeviceSpec;
use ntbdk_pmd::hw::{NtbDevice, Port};

/// This tool's name, in messages.
const TOOL: &str = "ntb-perf";
/// Time spent on each message size when neither -n nor -D is given.
const DEFAULT_BUDGET: Duration = Duration::from_millis(200);
/// Seconds between reports of --run_infinitely when -D is not given
/// (perftest's default duration).
const DEFAULT_INTERVAL: f64 = 5.0;
/// Message size of --run_infinitely when -s is not given (perftest's
/// bandwidth default).
const DEFAULT_INFINITE_SIZE: u64 = 65536;
/// Untimed latency round trips before each size's samples (bounded by
/// 50 ms).
const LAT_WARMUP: u64 = 100;
/// How long a client waits for its server to appear when --timeout is not
/// given (a server waits until Ctrl-C, as perftest's does).
const DEFAULT_CLIENT_WAIT: f64 = 10.0;
/// How long an operation or control command may take when --timeout is not
/// given.
const DEFAULT_OP_TIMEOUT: f64 = 10.0;

/// perftest-style bandwidth and latency on an NTB fabric (ib_write_bw,
/// ib_write_lat, ib_read_*, ib_send_*), with perftest's flags and tables.
///
/// With no --fabric/--device it runs both sides itself on a private
/// emulated fabric (the server as a second process, pinned to another core);
/// with no arguments at all it sweeps 2 B .. 8 MiB for write bandwidth and
/// write latency. For two terminals (no server address: the two sides meet
/// on the fabric):
///   ntb-perf --fabric demo --server
///   ntb-perf --fabric demo --test bw --op write -s 1M
/// Between two VMs sharing an ivshmem device bound to vfio-pci:
///   ntb-perf --device vfio:0000:00:03.0 --server
///   ntb-perf --device vfio:0000:00:03.0 --test bw --op write -s 64K
/// perftest's flags mean what they mean there (ib_write_bw -s 64K -n 5000
/// is ntb-perf --test bw -s 64K -n 5000); what has no NTB meaning is refused
/// with the nearest option that has one.
#[derive(Debug, Parser)]
#[command(
    name = "ntb-perf",
    version,
    verbatim_doc_comment,
    allow_negative_numbers = true
)]
#[command(group(clap::ArgGroup::new("shared").args(["fabric", "device"])))]
struct Args {
    /// Test to run: bw (bandwidth and message rate, as ib_*_bw) or lat
    /// (latency, as ib_*_lat). Default: both.
    #[arg(long, value_enum)]
    test: Option<Test>,
    /// Operation: write (into the server's region; see --write-mode), read
    /// (of the server's region) or send (eager, at most 4 KiB).
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// How --op write writes: direct (one-sided posted writes into the
    /// server's advertised region, as ib_write_* do; latency polls the
    /// buffer's last byte) or rendezvous (the transport's request, placement
    /// and acknowledgment). Default: direct.
    #[arg(long, value_enum, value_name = "MODE")]
    write_mode: Option<WriteMode>,
    /// Message size (bytes; K, M suffixes: 64, 4K, 1M, 8M). Default: all
    /// sizes (-a).
    #[arg(short = 's', long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "all")]
    size: Option<u64>,
    /// All sizes: powers of two from 2 B to 8 MiB (to 4 KiB for send).
    #[arg(short = 'a', long)]
    all: bool,
    /// Iterations per size (default: as many as fit in 0.2 s).
    #[arg(short = 'n', long, value_name = "ITERS", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    iters: Option<u64>,
    /// Seconds per size (instead of -n); with --run_infinitely, seconds
    /// between reports (default 5).
    #[arg(short = 'D', long, value_name = "SECONDS", conflicts_with = "iters")]
    duration: Option<f64>,
    /// Work requests posted per call (perftest's post list; --burst is the
    /// same).
    #[arg(short = 'l', long = "post_list", visible_alias = "burst", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    post_list: u64,
    /// Completion moderation of bandwidth tests, as perftest's: one send or
    /// one-sided write in N is signaled (and each queue pair's last of -n),
    /// its completion accounting for those before it. Default as
    /// perftest's: 100, the post list when -l > 1 (which must then be a
    /// multiple of -Q), 1 for one-sided writes of more than 8 KiB at one
    /// size (not in a sweep). At most each queue pair's share of -t, and
    /// with -l a divisor of the post list. Rendezvous writes and reads
    /// complete with the server's answer and are always signaled.
    #[arg(short = 'Q', long = "cq-mod", visible_alias = "cq_mod", value_name = "N", value_parser = clap::value_parser!(u64).range(1..=4096))]
    cq_mod: Option<u64>,
    /// Most bandwidth operations outstanding at once.
    #[arg(short = 't', long = "tx-depth", visible_alias = "tx_depth", value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=4096))]
    tx_depth: u64,
    /// Queue pairs (one per server: the transport has one per peer). The
    /// private fabric gets one server process per queue pair; with --fabric,
    /// the client uses the first N servers whose links are up (start N
    /// servers first; a fabric of N + 1 slots: --slots). -n counts
    /// operations over all queue pairs (perftest's counts per queue pair);
    /// latency runs over the first queue pair only.
    #[arg(short = 'q', long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=7))]
    qp: u64,
    /// Bidirectional bandwidth, as perftest's -b: every server posts the
    /// same operations towards the client while the client measures (with
    /// -n, each direction posts -n); the table's rows sum both directions,
    /// each direction is shown after it.
    #[arg(short = 'b', long)]
    bidirectional: bool,
    /// Largest send carried inline (perftest's -I). ntbdk's transport
    /// always inlines sends of up to 216 bytes and puts larger ones in an
    /// eager buffer: accepted for compatibility, it changes nothing.
    #[arg(short = 'I', long = "inline_size", value_name = "BYTES")]
    inline_size: Option<u64>,
    /// Accepted for compatibility (perftest's --CPU-freq): ntb-perf times
    /// with the monotonic clock, not CPU cycles, so there is no frequency
    /// warning to silence.
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Bandwidth in Gb/sec (10^9 bits per second) instead of MB/sec (2^20
    /// bytes per second).
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Bandwidth until Ctrl-C, one report line every -D seconds (default 5),
    /// of one size (-s, default 64K). Bandwidth only.
    #[arg(long = "run_infinitely", conflicts_with_all = ["all", "iters"])]
    run_infinitely: bool,
    /// Do not measure the peak bandwidth (its column shows 0.00).
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    /// Latency: print every sample, sorted, before the table row.
    #[arg(short = 'H', long = "report-histogram")]
    histogram: bool,
    /// Latency: print every sample in the order measured (implies -H).
    #[arg(short = 'U', long = "report-unsorted")]
    unsorted: bool,
    /// Write every figure as JSON to --out_json_file.
    #[arg(long = "out_json")]
    out_json: bool,
    /// The JSON file of --out_json (default perftest_out.json; giving it
    /// implies --out_json; --json is the same).
    #[arg(long = "out_json_file", visible_alias = "json", value_name = "FILE")]
    out_json_file: Option<PathBuf>,
    /// Refuse to run unless this side's windows are on hugepages (without
    /// it, a machine without free hugepages falls back to 4 KiB pages with
    /// a warning).
    #[arg(long = "use_hugepages")]
    use_hugepages: bool,
    /// Core to pin this side to (an index into the usable cores; default 1
    /// for --server when there are two or more, else 0).
    #[arg(long, value_name = "CORE")]
    lcore: Option<usize>,
    /// Core to pin the spawned server to (without --fabric; default 1, or 0
    /// when this process may use one core only); with -q N, the other
    /// servers take the next cores, wrapping around.
    #[arg(long, value_name = "CORE", conflicts_with = "shared")]
    peer_lcore: Option<usize>,
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
    /// The other side's slot (default: a client, the first other slot whose
    /// link comes up; a server, the first peer that says it is a client, so
    /// that several servers may wait on one fabric for a -q N client).
    #[arg(long, value_name = "N", requires = "shared", visible_alias = "peer")]
    peer_slot: Option<Port>,
    /// Be the server (with --fabric or --device): wait for a client (until
    /// Ctrl-C unless --timeout), serve its run, exit.
    #[arg(long, requires = "shared")]
    server: bool,
    /// Slots of the fabric a --server creates (clients and servers; 2 for
    /// one queue pair, N+1 for --qp N).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=16))]
    slots: u64,
    /// Seconds to wait for the other side to appear (default: 10 for a
    /// client; a server waits until Ctrl-C), and for any answer or
    /// operation (default 10).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Plot bandwidth vs size and the latency distribution as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// The server spawned by a self-contained run (internal).
    #[arg(long = "spawned-side", hide = true, requires_all = ["fabric", "slot", "peer_slot"])]
    spawned: bool,
}

/// The options that only matter on the client (the server serves whatever
/// the client asks for), by clap id and as the user types them.
const CLIENT_ONLY: &[(&str, &str)] = &[
    ("test", "--test"),
    ("op", "--op"),
    ("size", "-s"),
    ("all", "-a"),
    ("iters", "-n"),
    ("duration", "-D"),
    ("post_list", "-l/--post_list"),
    ("cq_mod", "-Q/--cq-mod"),
    ("tx_depth", "-t/--tx-depth"),
    ("qp", "-q/--qp"),
    ("write_mode", "--write-mode"),
    ("inline_size", "-I"),
    ("report_gbits", "--report_gbits"),
    ("run_infinitely", "--run_infinitely"),
    ("no_peak", "-N"),
    ("histogram", "-H"),
    ("unsorted", "-U"),
    ("out_json", "--out_json"),
    ("out_json_file", "--out_json_file"),
    ("plot", "--plot"),
];

fn main() -> ExitCode {
    let (mut args, matches) = match parse() {
        Ok(v) => v,
        Err(code) => return code,
    };
    // An emu: device is a named fabric.
    if let Some(DeviceSpec::Emu(name)) = &args.device {
        args.fabric = Some(name.clone());
        args.device = None;
    }
    run_main(TOOL, || {
        if args.server && !args.spawned {
            let given: Vec<&str> = CLIENT_ONLY
                .iter()
                .filter(|(id, _)| matches.value_source(id) == Some(ValueSource::CommandLine))
                .map(|(_, flag)| *flag)
                .collect();
            if !given.is_empty() {
                eprintln!(
                    "{TOOL}: note: {} ignored on the server: the client chooses what to measure \
                     and reports it",
                    given.join(", ")
                );
            }
        }
        run(&args)
    })
}

/// Parses the command line; perftest flags that have no meaning here, and a
/// server address, are refused with what to use instead (exit status 2).
fn parse() -> Result<(Args, ArgMatches), ExitCode> {
    // `args_os`: a path that is not UTF-8 is clap's to judge, not a panic.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let words: Vec<String> = argv
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(msg) = perftest::refuse(&words, Invocation::Perf) {
        eprintln!("{TOOL}: error: {msg}\n\nFor more information, try '--help'.");
        return Err(ExitCode::from(2));
    }
    let matches = match Args::command().try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => {
            // A word the parser did not expect: perftest's server address?
            if e.kind() == clap::error::ErrorKind::UnknownArgument
                && let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg)
                && let Some(msg) = perftest::hint(arg, Invocation::Perf)
            {
                eprintln!("{TOOL}: error: {msg}\n\nFor more information, try '--help'.");
                return Err(ExitCode::from(2));
            }
            e.exit()
        }
    };
    match Args::from_arg_matches(&matches) {
        Ok(a) => Ok((a, matches)),
        Err(e) => e.exit(),
    }
}

/// Checks what clap cannot: numbers in range, combinations (output paths:
/// `check_outputs`).
fn check_args(args: &Args) -> Result<()> {
    if let Some(t) = args.timeout {
        secs(t, "--timeout")?;
    }
    if let Some(d) = args.duration
        && !(d > 0.0 && d.is_finite() && d <= 3600.0)
    {
        bail!("-D/--duration must be a number of seconds in (0, 3600], not {d}");
    }
    if !args.server && args.peer_slot.is_some() && args.qp > 1 {
        bail!(
            "--peer-slot names one server, -q/--qp {} asks for {}: use one or the other",
            args.qp,
            args.qp
        );
    }
    if args.qp > 1 && args.test == Some(Test::Lat) {
        bail!(
            "-q {}: a latency test runs over one queue pair (as perftest's): drop -q, or use \
             --test bw",
            args.qp
        );
    }
    if args.write_mode.is_some() && args.op != Op::Write {
        bail!(
            "--write-mode says how --op write writes: drop it, or use --op write (not --op {})",
            args.op.name()
        );
    }
    if args.op == Op::Send
        && let Some(s) = args.size
        && s > u64::from(EAGER_SIZE)
    {
        bail!(
            "-s {s}: a send carries at most {EAGER_SIZE} bytes (one eager buffer); use --op write \
             for larger messages"
        );
    }
    if let Some(n) = args.cq_mod {
        if args.test == Some(Test::Lat) {
            bail!(
                "-Q/--cq-mod moderates the completions of bandwidth tests (as perftest's): drop \
                 it, or use --test bw"
            );
        }
        if !moderable(args) && n > 1 {
            let what = match args.op {
                Op::Read => "reads complete with the server's data",
                _ => "rendezvous writes complete with the server's acknowledgment",
            };
            bail!(
                "-Q {n}: {what} and are always signaled; completion moderation applies to \
                 --op send and to one-sided writes (--write-mode direct)"
            );
        }
        if args.post_list > 1 && !args.post_list.is_multiple_of(n) {
            bail!(
                "-l {} must be a multiple of -Q {n} (as in perftest: every post list ends \
                 with its signaled request)",
                args.post_list
            );
        }
    }
    if args.bidirectional && args.test == Some(Test::Lat) {
        bail!("-b/--bidirectional measures bandwidth (as perftest's): drop --test lat");
    }
    if args.bidirectional && args.run_infinitely {
        bail!("-b/--bidirectional reports per size: drop --run_infinitely (or -b)");
    }
    if args.run_infinitely && args.test == Some(Test::Lat) {
        bail!("--run_infinitely measures bandwidth only (as perftest's): drop --test lat");
    }
    if (args.histogram || args.unsorted) && (args.test == Some(Test::Bw) || args.run_infinitely) {
        bail!(
            "-H/-U print latency samples: they need --test lat (or no --test, without \
             --run_infinitely)"
        );
    }
    if let Some(i) = args.inline_size
        && !args.server
    {
        eprintln!(
            "{TOOL}: note: -I {i} changes nothing: sends of up to 216 bytes always go inline, \
             larger ones through an eager buffer"
        );
    }
    Ok(())
}

/// Checks, before a run, that the files it will write can be written (an
/// error of the system, not of the command line: exit 1).
fn check_outputs(args: &Args) -> Result<()> {
    if !args.server && !args.spawned {
        if let Some(p) = json_path(args) {
            check_writable(&p, "--out_json_file")?;
        }
        if let Some(p) = &args.plot {
            check_writable(p, "--plot")?;
        }
    }
    Ok(())
}

/// Where --out_json writes, if it does.
fn json_path(args: &Args) -> Option<PathBuf> {
    match (&args.out_json_file, args.out_json) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(PathBuf::from("perftest_out.json")),
        (None, false) => None,
    }
}

fn run(args: &Args) -> Result<()> {
    check_args(args).map_err(usage_error)?;
    check_outputs(args)?;
    let op_timeout = secs(args.timeout.unwrap_or(DEFAULT_OP_TIMEOUT), "--timeout")?;
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
    let how = if vfio.is_some() {
        "--device"
    } else {
        "--fabric"
    };
    match args.fabric.as_ref().or(vfio_name.as_ref()) {
        None => self_contained(args, &cores, core, op_timeout),
        Some(name) if args.spawned || args.server => {
            if args.spawned {
                die_with_parent();
                leave_signals_to_parent();
            }
            // `_owned` removes the fabric on exit if we created it.
            let (host, _owned) = match &vfio {
                Some(spec) => (open_device(spec, args.slot)?, None),
                None if args.spawned => {
                    let f = attach(name, "the fabric of the run that spawned us is gone")?;
                    (Host::member(join(&f, args.slot)?), None)
                }
                None => {
                    let (f, owned) = attach_or_create(name, &fabric_config(args.slots as usize))?;
                    (Host::member(join(&f, args.slot)?), owned)
                }
            };
            check_hugepages(args, &host)?;
            let mut ctl = ServerControl::new(host.dev.clone())?;
            let mut ep = Endpoint::new(host.dev.clone(), op_timeout)?;
            publish_host_stats(&mut ep, &host);
            // perftest's server waits for its client as long as it takes.
            let wait = args.timeout.map(Duration::from_secs_f64);
            if !args.spawned {
                let until = match wait {
                    Some(t) => format!("for {t:?}"),
                    None => "until Ctrl-C".to_string(),
                };
                println!(
                    "{TOOL}: server on port {} of {}: waiting for a client {until} \
                     (on the other side run: {TOOL} {how} {name} [-s SIZE ...])",
                    host.port(),
                    host.place
                );
                println!("{TOOL}: server windows: {}", host.windows(&[host.port()]));
            }
            let hint = format!("start the client on the other side ({TOOL} {how} {name})");
            // With no --peer-slot, the first peer that says it is a client
            // (several servers may wait on one fabric for one `-q N`
            // client).
            let client = match args.peer_slot {
                Some(p) => wait_peers(&*host.dev, &host.place, &[p], 1, wait, &hint, || Ok(()))?[0],
                None => ctl.await_client(&host.place, wait, &hint, || {
                    for _ in 0..64 {
                        ep.t.progress();
                    }
                    Ok(())
                })?,
            };
            pin(TOOL, core);
            let stats = serve(&mut ep, &mut ctl, client, op_timeout)?;
            if !args.spawned {
                println!(
                    "{TOOL}: served port {client}: {} commands, {} messages received, {} echoes",
                    stats.commands, stats.recvs, stats.echoes
                );
            }
            Ok(())
        }
        Some(name) => {
            let host = match &vfio {
                Some(spec) => open_device(spec, args.slot)?,
                None => {
                    let fabric = attach(
                        name,
                        &format!("start the server first: {TOOL} --fabric {name} --server"),
                    )?;
                    Host::member(join(&fabric, args.slot)?)
                }
            };
            check_hugepages(args, &host)?;
            if args.qp as usize > max_servers(&*host.dev) {
                bail!(
                    "-q/--qp {}: at most {} servers per client on {}",
                    args.qp,
                    max_servers(&*host.dev),
                    host.place
                );
            }
            let others = host.dev.port_count().saturating_sub(1);
            if args.qp as usize > others {
                bail!(
                    "-q/--qp {}: {} has {} other port(s), so at most {others} server(s){}",
                    args.qp,
                    host.place,
                    others,
                    if host.member.is_some() {
                        format!(
                            "; an emulated fabric has the slots it was made with: remove it \
                             (ntb-tool destroy {name}) and start the servers again with \
                             --slots {}",
                            args.qp + 1
                        )
                    } else {
                        String::new()
                    }
                );
            }
            let mut ep = Endpoint::new(host.dev.clone(), op_timeout)?;
            publish_host_stats(&mut ep, &host);
            let want: Vec<Port> = args.peer_slot.into_iter().collect();
            let wait = secs(args.timeout.unwrap_or(DEFAULT_CLIENT_WAIT), "--timeout")?;
            let hint = format!("start the server on the other side ({TOOL} {how} {name} --server)");
            let servers = wait_peers(
                &*host.dev,
                &host.place,
                &want,
                args.qp as usize,
                Some(wait),
                &hint,
                || Ok(()),
            )?;
            pin(TOOL, core);
            let client = Client::connect(ep, &servers, op_timeout)?;
            measure(args, &host, client, name, core, None)
        }
    }
}

/// Publishes the transport's stats page beside a fabric member's fabric,
/// where `ntb-tool qp` reads it (a bridge has no fabric to put it beside,
/// nor has an ivshmem device's shared fabric a directory: `publish_stats`
/// skips it).
fn publish_host_stats(ep: &mut Endpoint, host: &Host) {
    if let Some(m) = &host.member {
        publish_stats(TOOL, &mut ep.t, m);
    }
}

/// Refuses to run on 4 KiB pages with --use_hugepages.
fn check_hugepages(args: &Args, host: &Host) -> Result<()> {
    if args.use_hugepages && host.on_small_pages() {
        bail!(
            "--use_hugepages: this side's windows are on 4 KiB pages ({}): reserve hugepages \
             (scripts/setup-hugepages.sh, or echo N > /proc/sys/vm/nr_hugepages) or drop \
             --use_hugepages",
            hugepage_pools()
        );
    }
    Ok(())
}

/// Both sides: a private fabric, the server(s) as child processes.
fn self_contained(
    args: &Args,
    cores: &[core_affinity::CoreId],
    core: core_affinity::CoreId,
    timeout: Duration,
) -> Result<()> {
    let first = match args.peer_lcore {
        Some(l) => l,
        None => 1.min(cores.len().saturating_sub(1)),
    };
    pick_core(cores, first, "--peer-lcore")?;
    // Server i takes the i-th core from the first one on, wrapping around.
    let server_index = |i: usize| (first + i) % cores.len().max(1);
    let server_cores: Vec<core_affinity::CoreId> = (0..args.qp as usize)
        .map(|i| pick_core(cores, server_index(i), "--peer-lcore"))
        .collect::<Result<_>>()?;
    let mut spinners = vec![("the client".to_string(), core)];
    for (i, c) in server_cores.iter().enumerate() {
        spinners.push((format!("server {}", i + 1), *c));
    }
    warn_shared_cores(
        TOOL,
        &spinners,
        "--lcore, and --peer-lcore for the first server: the others take the next cores",
    );
    let name = format!("perf-{}", std::process::id());
    let slots = args.qp as usize + 1;
    let fabric = EmuFabric::create(&name, &fabric_config(slots))
        .with_context(|| format!("creating the private fabric {name:?}"))?;
    let _fabric_guard = FabricGuard(name.clone());
    let host = Host::member(join(&fabric, Some(0))?);
    check_hugepages(args, &host)?;
    let mut ep = Endpoint::new(host.dev.clone(), timeout)?;
    publish_host_stats(&mut ep, &host);

    let exe = std::env::current_exe().context("finding this program to start the server")?;
    let mut children = Children::default();
    for slot in 1..slots {
        let child = spawned_by_us(&mut Command::new(&exe))
            .args(["--spawned-side", "--fabric", &name, "--peer-slot", "0"])
            .args(["--slot", &slot.to_string()])
            .args(["--lcore", &server_index(slot - 1).to_string()])
            .args(["--timeout", &timeout.as_secs_f64().to_string()])
            .args(args.use_hugepages.then_some("--use_hugepages"))
            .stdin(Stdio::null())
            .spawn()
            .context("starting the server process")?;
        children.push(child);
    }
    let want: Vec<Port> = (1..slots as Port).collect();
    wait_peers(
        &*host.dev,
        &host.place,
        &want,
        want.len(),
        Some(timeout),
        "the machine may be overloaded",
        || children.check_running("the server process"),
    )
    .context("waiting for the server process to join the private fabric")?;
    pin(TOOL, core);
    let client = Client::connect(ep, &want, timeout)?;
    measure(
        args,
        &host,
        client,
        &name,
        core,
        Some((server_cores, &mut children)),
    )
}

/// The sizes to run for `op`: `-s`, or the sweep up to what `op` can move.
fn sizes(args: &Args, client: &Client, op: Op) -> Vec<u64> {
    match args.size {
        Some(s) => vec![s],
        None => sweep_sizes(client.max_size(op)),
    }
}

/// perftest's default completion moderation (`DEF_CQ_MOD`).
const DEFAULT_CQ_MOD: u64 = 100;
/// Above this size perftest signals every request unless told otherwise
/// (`MSG_SIZE_CQ_MOD_LIMIT`).
const CQ_MOD_SIZE_LIMIT: u64 = 8192;

/// Whether the operation can go unsignaled ([`Op::moderable`]).
fn moderable(args: &Args) -> bool {
    args.op.moderable(args.write_mode.unwrap_or_default())
}

/// The one size --run_infinitely measures: -s, or a default at most
/// `max_size` (the largest the operation can move here).
fn infinite_size(args: &Args, max_size: u64) -> u64 {
    args.size.unwrap_or(DEFAULT_INFINITE_SIZE.min(max_size))
}

/// The completion moderation the bandwidth test uses: -Q, or perftest's
/// default, at most each queue pair's share of the tx depth (the window
/// is shared by the servers, where perftest has one per queue pair).
/// `max_size`: the largest message of the operation here.
fn cq_mod(args: &Args, max_size: u64) -> u64 {
    if !moderable(args) {
        return 1;
    }
    // One size (-s, or --run_infinitely's; a sweep keeps the moderation,
    // as perftest's -a does).
    let size = (args.size.is_some() || args.run_infinitely).then(|| infinite_size(args, max_size));
    let n = match args.cq_mod {
        Some(n) => n,
        None if args.post_list > 1 => args.post_list,
        None if size.is_some_and(|s| s > CQ_MOD_SIZE_LIMIT) => 1,
        None => DEFAULT_CQ_MOD,
    };
    // At most a queue pair's share of the window; with a post list, still
    // a divisor of it, so each list ends with its signaled request.
    let mut m = n.min((args.tx_depth / args.qp).max(1));
    if args.post_list > 1 {
        while !args.post_list.is_multiple_of(m) {
            m -= 1;
        }
    }
    m
}

fn budget(args: &Args) -> Budget {
    match (args.iters, args.duration) {
        (Some(n), _) => Budget::iterations(n),
        (None, Some(d)) => Budget::duration(Duration::from_secs_f64(d)),
        (None, None) => Budget::duration(DEFAULT_BUDGET),
    }
}

/// perftest's test title: `RDMA_Write BW Test` becomes `NTB Write BW Test`.
fn title(op: Op, test: Test, post_list: u64, bidirectional: bool) -> String {
    let op = match op {
        Op::Write => "Write",
        Op::Read => "Read",
        Op::Send => "Send",
    };
    match test {
        Test::Bw if bidirectional => format!("NTB {op} Bidirectional BW Test"),
        Test::Bw if post_list > 1 => format!("NTB {op} Post List BW Test"),
        Test::Bw => format!("NTB {op} BW Test"),
        Test::Lat => format!("NTB {op} Latency Test"),
    }
}

/// Runs the tests, prints the tables and counters, writes the JSON and the
/// plot (also after Ctrl-C, with what was measured).
fn measure(
    args: &Args,
    host: &Host,
    mut client: Client,
    fabric: &str,
    core: core_affinity::CoreId,
    spawned: Option<(Vec<core_affinity::CoreId>, &mut Children)>,
) -> Result<()> {
    let write_mode = args.write_mode.unwrap_or_default();
    client.set_write_mode(write_mode);
    let cq_mod = cq_mod(args, client.max_size(args.op));
    client.set_cq_mod(cq_mod as usize);
    let tests: Vec<Test> = match (args.test, args.run_infinitely) {
        (_, true) => vec![Test::Bw],
        (Some(t), false) => vec![t],
        (None, false) => vec![Test::Bw, Test::Lat],
    };
    let unit = if args.report_gbits {
        BwUnit::Gbps
    } else {
        BwUnit::MBps
    };
    let budget = budget(args);
    let servers = client.server_ports();
    let peer_desc = match &spawned {
        Some((cs, _)) if cs.len() == 1 => format!("port(s) {servers:?} (CPU {})", cs[0].id),
        Some((cs, _)) => format!(
            "port(s) {servers:?} (CPUs {:?})",
            cs.iter().map(|c| c.id).collect::<Vec<_>>()
        ),
        None => format!("port(s) {servers:?}"),
    };
    let mut report = Report::new(TOOL);
    report
        .param("op", args.op.name())
        .param("bidirectional", args.bidirectional)
        .param(
            "write_mode",
            (args.op == Op::Write).then_some(write_mode.name()),
        )
        .param("post_list", args.post_list)
        .param("cq_mod", cq_mod)
        .param("tx_depth", args.tx_depth)
        .param("qp", args.qp)
        .param("budget", budget.describe())
        .param("iterations_per_size", budget.iteration_limit())
        .param(
            "seconds_per_size",
            budget.time_limit().map(|d| d.as_secs_f64()),
        )
        .param("run_infinitely", args.run_infinitely)
        .param("report_gbits", args.report_gbits)
        .param("fabric", fabric)
        .param("cpu", core.id)
        .param("bw_unit", unit.label())
        .param(
            "latency",
            "one-way (half round trip) for write and send; round trip for read",
        );
    let started = Instant::now();
    let mut result = Ok(());
    for &test in &tests {
        let header = Header {
            args,
            test,
            host,
            fabric,
            peers: &peer_desc,
            servers: &servers,
            core,
            budget,
            cq_mod,
        };
        header.print();
        let r = match test {
            Test::Bw if args.run_infinitely => run_forever(args, &mut client, unit, &mut report),
            Test::Bw => bandwidth(args, &mut client, unit, budget, &mut report),
            Test::Lat => latency(args, &mut client, budget, &mut report),
        };
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    let took = started.elapsed();
    let interrupted = result.as_ref().is_err_and(is_interrupted);
    if interrupted {
        client.stop_after_interrupt(Duration::from_secs(1));
    } else if result.is_ok() {
        result = client.stop();
    }
    if result.is_ok()
        && let Some((_, children)) = spawned
    {
        result = children
            .wait_all(Duration::from_secs(5))
            .and_then(|statuses| match statuses.iter().find(|s| !s.success()) {
                Some(status) => Err(anyhow::anyhow!("the server process failed ({status})")),
                None => Ok(()),
            });
    }
    if result.is_ok() || interrupted {
        print_counters(&client, &*host.dev, took);
    }
    // What was measured is saved whatever ended the run (a failed run's
    // report says why in its parameters, `error`), so an hour's sweep is not
    // lost to a server that died at its last size.
    if let Err(e) = &result
        && !interrupted
    {
        report
            .params
            .insert("error".into(), format!("{e:#}").into());
    }
    match (save(args, &report), &result) {
        (Err(e), Ok(())) => return Err(e),
        (Err(e), Err(_)) => eprintln!("{TOOL}: {e:#}"),
        (Ok(true), Err(_)) if !interrupted => {
            eprintln!("{TOOL}: the figures measured before the failure are saved")
        }
        _ => {}
    }
    result
}

/// The block perftest prints before a table: what runs, where, how.
struct Header<'a> {
    args: &'a Args,
    test: Test,
    host: &'a Host,
    fabric: &'a str,
    peers: &'a str,
    /// The servers' ports (whose windows the header describes too).
    servers: &'a [Port],
    core: core_affinity::CoreId,
    budget: Budget,
    /// The completion moderation of bandwidth tests.
    cq_mod: u64,
}

impl Header<'_> {
    fn print(&self) {
        let a = self.args;
        println!("{RULE}");
        println!(
            "                    {}",
            title(a.op, self.test, a.post_list, a.bidirectional)
        );
        println!(" Device          : {}", self.fabric);
        if a.op == Op::Write {
            println!(
                " Write mode      : {}",
                a.write_mode.unwrap_or_default().describe()
            );
        }
        println!(
            " Ports           : {} (CPU {}) -> {}",
            self.host.port(),
            self.core.id,
            self.peers
        );
        println!(
            " Number of qps   : {}\t\tTransport type : ntbdk (posted writes only)",
            // A latency test runs over one queue pair, whatever -q says.
            if self.test == Test::Lat { 1 } else { a.qp }
        );
        if self.test == Test::Bw {
            println!(" TX depth        : {}", a.tx_depth);
            if a.post_list > a.tx_depth {
                // At most the TX depth is ever outstanding: a list is cut
                // to what fits.
                println!(
                    " Post List       : {} (at most {} at once: the TX depth)",
                    a.post_list, a.tx_depth
                );
            } else {
                println!(" Post List       : {}", a.post_list);
            }
            println!(" CQ Moderation   : {}", self.cq_mod);
        }
        let budget = if a.run_infinitely {
            format!(
                "until Ctrl-C, a report every {} s",
                a.duration.unwrap_or(DEFAULT_INTERVAL)
            )
        } else {
            format!("{} per size", self.budget.describe())
        };
        println!(" Duration        : {budget}");
        let mut sides = vec![self.host.port()];
        sides.extend_from_slice(self.servers);
        println!(" Windows         : {}", self.host.windows(&sides));
        if self.test == Test::Lat {
            let what = if a.op == Op::Read {
                "round trip"
            } else {
                "one-way = half round trip"
            };
            println!(" Latency         : {what}");
        }
    }
}

/// The bandwidth table: one row per size.
fn bandwidth(
    args: &Args,
    client: &mut Client,
    unit: BwUnit,
    budget: Budget,
    report: &mut Report,
) -> Result<()> {
    let sizes = sizes(args, client, args.op);
    let mut progress = Progress::new(&format!("{} bw", args.op.name()), sizes.len());
    println!("{RULE}\n{}", bw_header(unit));
    let (burst, depth) = (args.post_list as usize, args.tx_depth as usize);
    // -b: each direction's rows, shown after the table of their sums.
    let mut directions: Vec<(BwRow, BwRow)> = Vec::new();
    for &size in &sizes {
        progress.step(&size_label(size));
        let mut row = if args.bidirectional {
            let (mut ours, mut theirs) =
                client.bandwidth_bidir(args.op, size, burst, depth, budget)?;
            if args.no_peak {
                ours.peak_gb_per_s = 0.0;
                theirs.peak_gb_per_s = 0.0;
            }
            // perftest's -b row: both directions' rates summed beside
            // this side's own #iterations.
            let sum = BwRow {
                iterations: ours.iterations,
                ..ours.plus(&theirs)
            };
            directions.push((ours, theirs));
            sum
        } else {
            client.bandwidth(args.op, size, burst, depth, budget)?
        };
        if args.no_peak {
            row.peak_gb_per_s = 0.0;
        }
        progress.clear();
        println!("{}", bw_line(&row, unit));
        report.bandwidth.push(row);
        check_interrupted()?;
    }
    progress.finish();
    println!("{RULE}");
    if !directions.is_empty() {
        let (us, them) = (client.endpoint().t.port(), client.server_ports());
        println!(
            " Rows above: both directions' bandwidths and rates summed, this side's \
             #iterations (as perftest's -b). By direction:"
        );
        println!(" port {us} -> {them:?} (this side, as measured here):");
        for (ours, _) in &directions {
            println!("{}", bw_line(ours, unit));
        }
        println!(" {them:?} -> port {us} (the servers, as each timed itself):");
        for (_, theirs) in &directions {
            println!("{}", bw_line(theirs, unit));
        }
        println!("{RULE}");
    }
    Ok(())
}

/// --run_infinitely: one size, a row every interval, until Ctrl-C.
fn run_forever(args: &Args, client: &mut Client, unit: BwUnit, report: &mut Report) -> Result<()> {
    let size = infinite_size(args, client.max_size(args.op));
    let every = Budget::duration(Duration::from_secs_f64(
        args.duration.unwrap_or(DEFAULT_INTERVAL),
    ));
    println!("{RULE}\n{}", bw_header(unit));
    let (burst, depth) = (args.post_list as usize, args.tx_depth as usize);
    let mut first = true;
    loop {
        let mut row = if first {
            client.bandwidth(args.op, size, burst, depth, every)?
        } else {
            client.bandwidth_continued(args.op, size, burst, depth, every)?
        };
        first = false;
        if args.no_peak {
            row.peak_gb_per_s = 0.0;
        }
        println!("{}", bw_line(&row, unit));
        report.bandwidth.push(row);
        check_interrupted()?;
    }
}

/// The latency table: one row per size (after its samples with -H/-U).
fn latency(args: &Args, client: &mut Client, budget: Budget, report: &mut Report) -> Result<()> {
    let sizes = sizes(args, client, args.op);
    let mut progress = Progress::new(&format!("{} lat", args.op.name()), sizes.len());
    let samples = args.histogram || args.unsorted;
    if !samples {
        println!("{RULE}\n{}", lat_header());
    }
    for &size in &sizes {
        progress.step(&size_label(size));
        let mut raw = Vec::new();
        let row = client.latency_samples(
            args.op,
            size,
            LAT_WARMUP,
            budget,
            samples.then_some(&mut raw),
        )?;
        progress.clear();
        if samples {
            print_samples(&mut raw, args.unsorted);
            if (raw.len() as u64) < row.iterations {
                eprintln!(
                    "{TOOL}: -H/-U: printed the first {} of the {} samples of {size} B \
                     (the row summarises all of them)",
                    raw.len(),
                    row.iterations
                );
            }
            println!("{RULE}\n{}", lat_header());
        }
        println!("{}", lat_line(&row));
        if row.interrupted {
            eprintln!(
                "ntb-perf: the {size} B row holds the {} round trips measured before Ctrl-C \
                 (marked \"interrupted\" in --json)",
                row.iterations
            );
        }
        report.latency.push(row);
        check_interrupted()?;
    }
    progress.finish();
    println!("{RULE}");
    Ok(())
}

/// perftest's -U (every sample as measured) or -H (sorted): `#, usec`, then
/// `index, value` lines.
fn print_samples(raw: &mut [u64], unsorted: bool) {
    if !unsorted {
        raw.sort_unstable();
    }
    println!("#, usec");
    for (i, ns) in raw.iter().enumerate() {
        println!("{}, {}", i + 1, *ns as f64 / 1000.0);
    }
}

/// Writes `--out_json` and `--plot`, if asked, when the report holds rows
/// (what was measured, even after Ctrl-C or a failure); returns whether
/// anything was written.
fn save(args: &Args, report: &Report) -> Result<bool> {
    if report.bandwidth.is_empty() && report.latency.is_empty() {
        return Ok(false);
    }
    let mut wrote = false;
    if let Some(path) = json_path(args) {
        report.write_json(&path)?;
        println!("{TOOL}: figures written to {}", path.display());
        wrote = true;
    }
    if let Some(path) = &args.plot {
        write_svg(report, path)?;
        println!("{TOOL}: plot written to {}", path.display());
        wrote = true;
    }
    Ok(wrote)
}

/// Queue-pair and device counters of the client, and what they prove.
fn print_counters(client: &Client, dev: &dyn NtbDevice, took: Duration) {
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
