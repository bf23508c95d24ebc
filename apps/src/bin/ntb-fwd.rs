//! `ntb-fwd`: DPDK's `ntb_fwd` on the transport's data queues: txonly,
//! rxonly, iofwd (a reflector, run to completion or pipelined) and
//! file-trans, one pinned spinning lcore per queue, per-queue statistics
//! every `--stats-period` seconds and at exit; Ctrl-C ends the run cleanly.
//!
//! ```text
//! ntb-fwd --fabric demo --fwd-mode rxonly --verify              # terminal 1 (creates the fabric)
//! ntb-fwd --fabric demo --fwd-mode txonly -s 64 -n 100000      # terminal 2
//! ntb-fwd --fabric f --fwd-mode file-trans --recv out.bin      # receiver
//! ntb-fwd --fabric f --fwd-mode file-trans --send in.bin       # sender
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use ntbdk_apps::cli::host::{Host, open_device};
use ntbdk_apps::cli::session::{
    attach_or_create, check_writable, join, pick_core, usable_cores, wait_peers, warn_shared_cores,
};
use ntbdk_apps::cli::units::{parse_bytes, parse_size, secs};
use ntbdk_apps::cli::{run_main, usage_error};
use ntbdk_apps::fwd::{
    Job, LcoreCtx, Limit, Mode, QueueCounters, RaiseOnDrop, Shape, StatsPrinter, TOOL, TxOnly,
    eal_hint, emu_window, iofwd, pipeline_rx, pipeline_tx, plan_geometry, recv_file, rxonly,
    send_file, txonly,
};
use ntbdk_apps::perf::fabric_config;
use ntbdk_mempool::ZoneOptions;
use ntbdk_pmd::hw::Port;
use ntbdk_pmd::hw::open::DeviceSpec;
use ntbdk_pmd::lcore::{PollMode, StopFlag};
use ntbdk_pmd::mbuf::{MbufPool, MbufRing};
use ntbdk_pmd::transport::{Config, DataQueue, DataQueues, Transport};

/// DPDK ntb_fwd on an NTB fabric's data queues: txonly, rxonly, iofwd,
/// file-trans.
///
/// The first process on --fabric creates it (and removes it on exit). Both
/// sides must give the same --qp, --nb-desc and --buf-size.
///   ntb-fwd --fabric demo --fwd-mode rxonly --verify
///   ntb-fwd --fabric demo --fwd-mode txonly -s 64 -n 1000000
///   ntb-fwd --fabric demo --fwd-mode iofwd [--pipeline]       (a reflector)
///   ntb-fwd --fabric demo --fwd-mode txonly --verify -D 5     (checks what returns)
///   ntb-fwd --fabric f --fwd-mode file-trans --recv out.bin
///   ntb-fwd --fabric f --fwd-mode file-trans --send in.bin
/// Between two VMs sharing an ivshmem device bound to vfio-pci:
///   ntb-fwd --device vfio:0000:00:03.0 --fwd-mode file-trans --recv out.bin
///   ntb-fwd --device vfio:0000:00:03.0 --fwd-mode file-trans --send in.bin
#[derive(Debug, Parser)]
#[command(
    name = "ntb-fwd",
    version,
    verbatim_doc_comment,
    allow_negative_numbers = true
)]
#[command(group(clap::ArgGroup::new("where").args(["fabric", "device"]).required(true)))]
struct Args {
    /// Forwarding mode (DPDK's --fwd-mode; --mode is an alias).
    #[arg(
        long = "fwd-mode",
        visible_alias = "mode",
        value_enum,
        value_name = "MODE"
    )]
    fwd_mode: Mode,
    /// The fabric to join (created with --slots slots if it does not
    /// exist).
    #[arg(long, value_name = "NAME")]
    fabric: Option<String>,
    /// The device to use instead of --fabric: emu:NAME (as --fabric NAME)
    /// or vfio:BDF (a PCI function bound to vfio-pci: ivshmem, or an Intel NTB,
    /// whose port is its side of the link).
    #[arg(long, value_name = "SPEC", conflicts_with = "fabric")]
    device: Option<DeviceSpec>,
    /// Our slot (default: the first free one).
    #[arg(long, value_name = "N")]
    slot: Option<Port>,
    /// The peer (default: the first other slot whose link comes up).
    #[arg(long, value_name = "N", visible_alias = "peer")]
    peer_slot: Option<Port>,
    /// Queues to the peer (DPDK's --qp), one lcore each (two with
    /// --pipeline). The same on both sides.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=DataQueues::MAX_COUNT as i64))]
    qp: u16,
    /// Descriptors (and receive buffers) per queue: a power of two in
    /// 16..=4096 (DPDK's --nb-desc). Default 1024, halved until the queues
    /// fit the device's window. The same on both sides.
    #[arg(long, value_name = "N", value_parser = parse_nb_desc)]
    nb_desc: Option<u32>,
    /// Bytes of an mbuf's data and of each receive buffer (DPDK's
    /// --buf-size): a multiple of 64 in 64..=64K. The same on both sides.
    #[arg(long, value_name = "SIZE", default_value = "2048", value_parser = parse_buf_size)]
    buf_size: u32,
    /// Sent mbufs are freed in batches of this many (DPDK's --txfreet; at
    /// most half of --nb-desc) [default: 256, or half of a smaller --nb-desc].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=2048))]
    txfreet: Option<u64>,
    /// Packets per burst (DPDK's --burst).
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=32))]
    burst: u64,
    /// txonly: bytes per packet (at most --buf-size; default 64).
    #[arg(short = 's', long, value_name = "SIZE", value_parser = parse_packet_size)]
    size: Option<u64>,
    /// Stop after this many packets per queue (sent for txonly, received
    /// for rxonly and iofwd).
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(short = 'D', long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// txonly, rxonly: check every packet received (sequence and bytes);
    /// the run fails if any is wrong or missing (txonly: not sent back by a
    /// reflector, or not received by an rxonly), or (rxonly) when the peer
    /// leaves without its end marker.
    #[arg(long)]
    verify: bool,
    /// iofwd: an rx lcore and a tx lcore per queue, linked by a ring,
    /// instead of one lcore doing both.
    #[arg(long)]
    pipeline: bool,
    /// file-trans: the file to send.
    #[arg(long, value_name = "FILE", conflicts_with = "recv")]
    send: Option<PathBuf>,
    /// file-trans: where to write the file received.
    #[arg(long, value_name = "FILE")]
    recv: Option<PathBuf>,
    /// Seconds between statistics.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    stats_period: f64,
    /// Slots of a fabric we create.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=16))]
    slots: u64,
    /// The first lcore's core (an index into the usable cores); the others
    /// take the next ones, wrapping around. Default: port × this host's
    /// lcores, so that hosts on one machine running as many lcores each
    /// spin on different cores while there are enough (past them, a note,
    /// and loops that yield when idle).
    #[arg(long, value_name = "CORE")]
    lcore: Option<usize>,
    /// Seconds to wait for the peer, and for any message, before giving up.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
}

fn parse_nb_desc(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of descriptors"))?;
    if !n.is_power_of_two() || !(16..=4096).contains(&n) {
        return Err(format!("{n}: must be a power of two in 16..=4096"));
    }
    Ok(n)
}

/// A packet size: at least a byte (at most `--buf-size`, checked once both
/// are known).
fn parse_packet_size(s: &str) -> Result<u64, String> {
    match parse_bytes(s) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "bad size {s:?}: give bytes, optionally with K (e.g. 64, 1K), from 1 to --buf-size"
        )),
    }
}

fn parse_buf_size(s: &str) -> Result<u32, String> {
    let n = parse_size(s).map_err(|e| e.to_string())?;
    if !n.is_multiple_of(64) || !(64..=65536).contains(&n) {
        return Err(format!("{n}: must be a multiple of 64 in 64..=65536"));
    }
    Ok(n as u32)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(msg) = eal_hint(&argv) {
        eprintln!("{TOOL}: error: {msg}\n\nFor more information, try '--help'.");
        return ExitCode::from(2);
    }
    let args = Args::parse();
    run_main(TOOL, || run(&args))
}

/// What to start on the other side, for a wait that gave up.
fn start_hint(args: &Args, how: &str, name: &str) -> String {
    let other = match args.fwd_mode {
        Mode::TxOnly => "--fwd-mode rxonly (or iofwd)",
        Mode::RxOnly | Mode::IoFwd => "--fwd-mode txonly",
        Mode::FileTrans if args.recv.is_some() => "--fwd-mode file-trans --send FILE",
        Mode::FileTrans => "--fwd-mode file-trans --recv FILE",
    };
    format!("start the other side ({TOOL} {how} {name} {other}, same --qp/--nb-desc/--buf-size)")
}

/// Checks the flags that depend on each other.
fn check_args(args: &Args) -> Result<()> {
    if let Some(s) = args.size {
        if args.fwd_mode != Mode::TxOnly {
            bail!(
                "-s is the packet size txonly sends; rxonly, iofwd and file-trans take what comes"
            );
        }
        if s > u64::from(args.buf_size) {
            bail!(
                "-s {s}: a packet fits one buffer of --buf-size {} bytes",
                args.buf_size
            );
        }
    }
    if args.fwd_mode == Mode::FileTrans && (args.count.is_some() || args.duration.is_some()) {
        bail!("-n and -D do not apply to file-trans: it ends when the whole file has crossed");
    }
    if args.fwd_mode == Mode::FileTrans && args.send.is_none() && args.recv.is_none() {
        bail!("file-trans needs --send FILE (sender) or --recv FILE (receiver)");
    }
    if args.fwd_mode != Mode::FileTrans && (args.send.is_some() || args.recv.is_some()) {
        bail!("--send and --recv are for --fwd-mode file-trans");
    }
    if args.fwd_mode == Mode::FileTrans && args.qp > 1 {
        bail!(
            "--qp {}: file-trans moves the file over queue 0 only; drop --qp",
            args.qp
        );
    }
    if args.pipeline && args.fwd_mode != Mode::IoFwd {
        bail!("--pipeline is for --fwd-mode iofwd");
    }
    if args.verify && !matches!(args.fwd_mode, Mode::TxOnly | Mode::RxOnly) {
        bail!(
            "--verify checks what txonly gets back and what rxonly receives; file-trans always checks"
        );
    }
    if let (Some(t), Some(n)) = (args.txfreet, args.nb_desc)
        && t > u64::from(n / 2)
    {
        bail!("--txfreet {t}: at most half of --nb-desc {n} ({})", n / 2);
    }
    Ok(())
}

/// Checks the files file-trans reads and writes (an error of the system,
/// not of the command line: exit 1).
fn check_files(args: &Args) -> Result<()> {
    if let Some(p) = &args.send
        && !p.is_file()
    {
        bail!("--send {}: no such file", p.display());
    }
    if let Some(p) = &args.recv {
        check_writable(p, "--recv")?;
    }
    Ok(())
}

/// Mbufs a sending lcore's pool holds: a burst being filled, the sent ones
/// waiting for the tx free threshold, and the per-thread cache.
fn pool_size(burst: usize, txfreet: usize) -> u32 {
    ((2 * burst + txfreet + 64) as u32).next_power_of_two()
}

fn mbuf_pool(tag: &str, count: u32, room: usize) -> Result<MbufPool> {
    let name = format!("ntb-fwd-{}-{tag}", std::process::id());
    MbufPool::create(&name, count, room, 32, &ZoneOptions::huge_or_fallback())
        .with_context(|| format!("creating the mbuf pool {name} ({count} x {room} B)"))
}

fn run(args: &Args) -> Result<()> {
    let timeout = secs(args.timeout, "--timeout").map_err(usage_error)?;
    let period = secs(args.stats_period, "--stats-period").map_err(usage_error)?;
    let duration = args
        .duration
        .map(|d| secs(d, "-D/--duration"))
        .transpose()
        .map_err(usage_error)?;
    check_args(args).map_err(usage_error)?;
    check_files(args)?;
    let cores = usable_cores();
    if let Some(l) = args.lcore {
        pick_core(&cores, l, "--lcore")?;
    }

    // The device: a fabric we create gets windows that fit the queues.
    let shape = Shape {
        queues: args.qp,
        nb_desc: args.nb_desc,
        buf_size: args.buf_size,
    };
    let (host, name, _owned) = match (&args.fabric, &args.device) {
        (_, Some(spec @ DeviceSpec::Vfio(_))) => {
            (open_device(spec, args.slot)?, spec.to_string(), None)
        }
        (Some(name), _) | (None, Some(DeviceSpec::Emu(name))) => {
            let window = emu_window(args.slots as u16, &shape)?;
            let cfg = ntbdk_pmd::hw::emu::FabricConfig {
                window_size: window,
                ..fabric_config(args.slots as usize)
            };
            let (fabric, owned) = attach_or_create(name, &cfg)?;
            if owned.is_none() {
                // Another run's (the peer's, or one killed before it could
                // remove it): its geometry, not ours, applies.
                let c = fabric.config();
                eprintln!(
                    "{TOOL}: note: joining the existing fabric {name:?} ({} slots, {} MiB \
                     windows); `ntb-tool destroy {name}` removes one a killed run left",
                    c.slots,
                    c.window_size >> 20
                );
            }
            (Host::member(join(&fabric, args.slot)?), name.clone(), owned)
        }
        (None, None) => bail!("give --fabric NAME or --device SPEC"),
    };
    let dev = host.dev.clone();
    let ports = dev.port_count() as u16;
    let window = dev.mw_geometry(0).map(|g| g.size).unwrap_or(0);
    let (geometry, note) = plan_geometry(ports, window, &shape)?;
    if let Some(note) = note {
        eprintln!("{TOOL}: note: {note}");
    }
    let d = geometry.data;
    let txfreet = match args.txfreet {
        Some(t) if t > u64::from(d.nb_desc / 2) => bail!(
            "--txfreet {t}: at most half of the {} descriptors per queue ({})",
            d.nb_desc,
            d.nb_desc / 2
        ),
        Some(t) => t as usize,
        None => 256.min(d.nb_desc as usize / 2),
    };
    let mut t = Transport::new(dev.clone(), Config::new(geometry)).with_context(|| {
        format!("setting up the transport on the {window}-byte window of {name}")
    })?;
    let how = if args.device.is_some() {
        "--device"
    } else {
        "--fabric"
    };
    let hint = start_hint(args, how, &name);
    let want: Vec<Port> = args.peer_slot.into_iter().collect();
    let peer = wait_peers(
        &*dev,
        &host.place,
        &want,
        1,
        Some(timeout),
        &hint,
        || Ok(()),
    )?[0];
    let mut queues: Vec<DataQueue> = Vec::new();
    for q in 0..args.qp {
        let mut dq = t.data_queue(peer, q)?;
        dq.set_tx_free_thresh(txfreet);
        queues.push(dq);
    }
    ntbdk_apps::fwd::wait_connected(&mut t, peer, timeout)?;
    println!(
        "{TOOL}: {} on port {} of {name:?} with port {peer}: {} queue(s) of {} x {} B, \
         burst {}, txfreet {txfreet}",
        args.fwd_mode
            .to_possible_value()
            .expect("every mode has a name")
            .get_name(),
        dev.port(),
        d.count,
        d.nb_desc,
        d.buf_size,
        args.burst
    );

    // One lcore per queue (two with --pipeline), on consecutive cores.
    let per_queue = if args.pipeline { 2 } else { 1 };
    // By default each host's lcores follow the lower ports' (port p takes
    // the p-th run of as many cores), so hosts on one machine do not overlap
    // while the machine has the cores.
    let first = args
        .lcore
        .unwrap_or(usize::from(dev.port()) * queues.len() * per_queue);
    let core_of = |k: usize| -> Option<usize> {
        (!cores.is_empty()).then(|| cores[(first + k) % cores.len()].id)
    };
    let mut spinners = Vec::new();
    for k in 0..queues.len() * per_queue {
        if let Some(c) = core_of(k) {
            spinners.push((format!("lcore {k}"), core_affinity::CoreId { id: c }));
        }
    }
    // Past the machine's cores the default placement wraps onto the cores
    // of lower ports' hosts, which this process cannot see: yield when
    // idle, as with cores shared within the process.
    let wraps = args.lcore.is_none() && first + queues.len() * per_queue > cores.len();
    if wraps {
        eprintln!(
            "{TOOL}: note: port {}'s default cores wrap past the machine's {} (hosts of lower \
             ports on this machine take the first ones): polling yields when idle; give \
             --lcore to place the lcores yourself",
            dev.port(),
            cores.len()
        );
    }
    let shared = warn_shared_cores(
        TOOL,
        &spinners,
        "--lcore (the first core; queues take the next ones)",
    );
    let poll = if shared || wraps {
        PollMode::Hybrid { spins: 256 }
    } else {
        PollMode::Spin
    };
    let stop = StopFlag::new();
    let counters: Vec<Arc<QueueCounters>> = (0..queues.len()).map(|_| Arc::default()).collect();
    let limit = Limit {
        packets: args.count,
        deadline: duration.map(|d| Instant::now() + d),
    };
    let burst = args.burst as usize;
    let mut jobs = Vec::new();
    for (i, q) in queues.into_iter().enumerate() {
        let ctx = LcoreCtx {
            stop: stop.clone(),
            poll,
            burst,
            timeout,
            counters: counters[i].clone(),
        };
        let core = core_of(i * per_queue);
        let mut job =
            |name: String, core, run: ntbdk_apps::fwd::LcoreFn| jobs.push(Job { name, core, run });
        match args.fwd_mode {
            Mode::TxOnly => {
                let pool = mbuf_pool(
                    &format!("tx{i}"),
                    pool_size(burst, txfreet),
                    d.buf_size as usize,
                )?;
                let cfg = TxOnly {
                    size: args.size.unwrap_or(64) as usize,
                    limit,
                    verify: args.verify,
                };
                job(
                    format!("txonly-{i}"),
                    core,
                    Box::new(move || txonly(q, pool, cfg, ctx)),
                );
            }
            Mode::RxOnly => {
                let verify = args.verify;
                job(
                    format!("rxonly-{i}"),
                    core,
                    Box::new(move || rxonly(q, limit, verify, ctx)),
                );
            }
            Mode::IoFwd if args.pipeline => {
                let (rxq, txq) = q.split();
                let (to_tx, from_rx) = MbufRing::spsc((d.nb_desc as usize).next_power_of_two())?;
                let done = StopFlag::new();
                let (d2, c2) = (done.clone(), ctx.clone());
                let done = RaiseOnDrop::new(done);
                job(
                    format!("iofwd-rx-{i}"),
                    core,
                    Box::new(move || pipeline_rx(rxq, to_tx, done, limit, ctx)),
                );
                job(
                    format!("iofwd-tx-{i}"),
                    core_of(i * per_queue + 1),
                    Box::new(move || pipeline_tx(txq, from_rx, d2, c2)),
                );
            }
            Mode::IoFwd => job(
                format!("iofwd-{i}"),
                core,
                Box::new(move || iofwd(q, limit, ctx)),
            ),
            Mode::FileTrans => {
                // The file goes over queue 0; any others stay idle.
                if i > 0 {
                    continue;
                }
                if let Some(path) = args.send.clone() {
                    let pool = mbuf_pool("file", pool_size(burst, txfreet), d.buf_size as usize)?;
                    job(
                        "file-send".into(),
                        core,
                        Box::new(move || send_file(q, pool, &path, ctx).map(|t| t.line("sent"))),
                    );
                } else if let Some(path) = args.recv.clone() {
                    let pool = mbuf_pool("ack", 64, 64)?;
                    job(
                        "file-recv".into(),
                        core,
                        Box::new(move || {
                            recv_file(q, pool, &path, ctx).map(|t| t.line("received"))
                        }),
                    );
                }
            }
        }
    }
    let mut stats = StatsPrinter::new(counters, Instant::now());
    let outcome = ntbdk_apps::fwd::run_lcores(&mut t, jobs, &mut stats, period, &stop)?;
    print!("{}", stats.summary(Instant::now()));
    for line in &outcome.lines {
        println!("{TOOL}: {line}");
    }
    let c = dev.counters();
    println!(
        "{TOOL}: device: posted writes {}, non-posted reads {}",
        c.posted_writes, c.non_posted_reads
    );
    if let Some(e) = outcome.error {
        return Err(e);
    }
    let errors = stats.total().errors;
    if args.verify && errors > 0 {
        bail!("--verify: {errors} packet(s) wrong, out of order or missing (see the summary)");
    }
    Ok(())
}
