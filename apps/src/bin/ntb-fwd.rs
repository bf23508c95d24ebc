//! `ntb-fwd`: a DPDK `ntb_fwd`-style forwarder on an NTB fabric.
//!
//! Modes: `txonly` (send), `rxonly` (receive and drop), `iofwd` (receive
//! from one peer, forward to another: three processes) and `file-trans`
//! (send a file; the receiver writes it out and checks its checksum).
//! Per-queue statistics are printed every `--stats-period` seconds and at
//! exit; Ctrl-C ends the run cleanly.
//!
//! ```text
//! ntb-fwd --fabric demo --mode rxonly                  # terminal 1 (creates the fabric)
//! ntb-fwd --fabric demo --mode txonly -s 64 -D 5       # terminal 2
//! ntb-fwd --fabric f --mode file-trans --recv out.bin  # receiver
//! ntb-fwd --fabric f --mode file-trans --send in.bin   # sender
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Parser;
use ntbdk_apps::cli::run_main;
use ntbdk_apps::cli::session::{
    attach_or_create, check_writable, join, open_vfio, pick_core, pin, usable_cores, wait_peers,
};
use ntbdk_apps::fwd::{Limit, Mode, Stats, forward, recv_file, send_file};
use ntbdk_apps::perf::{EAGER_SIZE, Endpoint, fabric_config, parse_size};
use ntbdk_pmd::hw::open::DeviceSpec;
use ntbdk_pmd::hw::{NtbDevice, Port};
use ntbdk_pmd::transport::Qp;

const TOOL: &str = "ntb-fwd";

/// A DPDK ntb_fwd-style forwarder on an NTB fabric: txonly, rxonly, iofwd,
/// file-trans.
///
/// The first process on --fabric creates it (and removes it on exit).
///   ntb-fwd --fabric demo --mode rxonly
///   ntb-fwd --fabric demo --mode txonly -s 64 -D 5
///   ntb-fwd --fabric demo --mode iofwd --rx-slot 0 --peer-slot 2
///   ntb-fwd --fabric f --mode file-trans --recv out.bin
///   ntb-fwd --fabric f --mode file-trans --send in.bin
/// Between two VMs sharing an ivshmem device bound to vfio-pci:
///   ntb-fwd --device vfio:0000:00:03.0 --mode file-trans --recv out.bin
///   ntb-fwd --device vfio:0000:00:03.0 --mode file-trans --send in.bin
#[derive(Debug, Parser)]
#[command(name = "ntb-fwd", version, verbatim_doc_comment)]
#[command(group(clap::ArgGroup::new("where").args(["fabric", "device"]).required(true)))]
struct Args {
    /// Forwarding mode.
    #[arg(long, value_enum)]
    mode: Mode,
    /// The fabric to join (created with --slots slots if it does not
    /// exist).
    #[arg(long, value_name = "NAME")]
    fabric: Option<String>,
    /// The device to use instead of --fabric: emu:NAME (as --fabric NAME)
    /// or vfio:BDF (a PCI function bound to vfio-pci; ivshmem).
    #[arg(long, value_name = "SPEC", conflicts_with = "fabric")]
    device: Option<DeviceSpec>,
    /// Our slot (default: the first free one).
    #[arg(long, value_name = "N")]
    slot: Option<Port>,
    /// The peer to send to (txonly, iofwd, file-trans) or receive from
    /// (rxonly); default: the first other slot whose link comes up.
    #[arg(long, value_name = "N")]
    peer_slot: Option<Port>,
    /// iofwd: the peer to receive from (the one forwarded to is
    /// --peer-slot).
    #[arg(long, value_name = "N")]
    rx_slot: Option<Port>,
    /// Queue pairs (txonly and rxonly: one per peer, the first N whose
    /// links come up).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=15))]
    qp: u64,
    /// Message size for txonly (at most one eager buffer, 4K).
    #[arg(short = 's', long, value_name = "SIZE", default_value = "64", value_parser = parse_size)]
    size: u64,
    /// Messages posted per call.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    burst: u64,
    /// Stop after this many messages (sent for txonly, received otherwise).
    #[arg(short = 'n', long, value_name = "N")]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(short = 'D', long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// file-trans: the file to send.
    #[arg(long, value_name = "FILE", conflicts_with = "recv")]
    send: Option<PathBuf>,
    /// file-trans: where to write the file received.
    #[arg(long, value_name = "FILE")]
    recv: Option<PathBuf>,
    /// Seconds between statistics lines.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    stats_period: f64,
    /// Slots of a fabric we create.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=16))]
    slots: u64,
    /// Core to pin to (an index into the usable cores).
    #[arg(long, value_name = "CORE", default_value_t = 0)]
    lcore: usize,
    /// Seconds to wait for peers, and for any message, before giving up.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    run_main(TOOL, || run(&args))
}

/// What to start on the other side for `mode`, for a wait that gave up.
fn start_hint(mode: Mode, how: &str, name: &str, receiving: bool) -> String {
    let other = match mode {
        Mode::TxOnly => "--mode rxonly".to_string(),
        Mode::RxOnly => "--mode txonly".to_string(),
        Mode::IoFwd => "a txonly sender at --rx-slot and an rxonly receiver at --peer-slot".into(),
        Mode::FileTrans if receiving => "--mode file-trans --send FILE".to_string(),
        Mode::FileTrans => "--mode file-trans --recv FILE".to_string(),
    };
    format!("start the other side ({TOOL} {how} {name} {other})")
}

fn secs(v: f64, flag: &str) -> Result<Duration> {
    if !(v > 0.0 && v.is_finite() && v <= 86_400.0) {
        bail!("{flag} must be a positive number of seconds, not {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

fn run(args: &Args) -> Result<()> {
    let timeout = secs(args.timeout, "--timeout")?;
    let period = secs(args.stats_period, "--stats-period")?;
    let duration = args
        .duration
        .map(|d| secs(d, "-D/--duration"))
        .transpose()?;
    if args.size > u64::from(EAGER_SIZE) {
        bail!(
            "-s {}: a message carries at most {EAGER_SIZE} bytes (one eager buffer)",
            args.size
        );
    }
    if args.mode == Mode::FileTrans && args.send.is_none() && args.recv.is_none() {
        bail!("file-trans needs --send FILE (sender) or --recv FILE (receiver)");
    }
    if args.mode == Mode::IoFwd && (args.rx_slot.is_none() || args.peer_slot.is_none()) {
        bail!("iofwd needs --rx-slot (the peer to receive from) and --peer-slot (to forward to)");
    }
    if let Some(p) = &args.send
        && !p.is_file()
    {
        bail!("--send {}: no such file", p.display());
    }
    if let Some(p) = &args.recv {
        check_writable(p, "--recv")?;
    }
    let core = pick_core(&usable_cores(), args.lcore, "--lcore")?;
    // `_owned` removes a fabric we created on exit.
    let (dev, name, _owned) = match (&args.fabric, &args.device) {
        (_, Some(spec @ DeviceSpec::Vfio(_))) => (
            Arc::new(open_vfio(spec, args.slot)?),
            spec.to_string(),
            None,
        ),
        (Some(name), _) | (None, Some(DeviceSpec::Emu(name))) => {
            let (fabric, owned) = attach_or_create(name, &fabric_config(args.slots as usize))?;
            (Arc::new(join(&fabric, args.slot)?), name.clone(), owned)
        }
        (None, None) => bail!("give --fabric NAME or --device SPEC"),
    };
    let mut ep = Endpoint::new(dev.clone(), timeout)?;
    let how = if args.device.is_some() {
        "--device"
    } else {
        "--fabric"
    };
    let hint = start_hint(args.mode, how, &name, args.recv.is_some());
    println!(
        "{TOOL}: {:?} on port {} of fabric {name:?}",
        args.mode,
        dev.port(),
    );

    // The peers: the ones named, else the first that come up.
    let (tx_ports, rx_ports): (Vec<Port>, Vec<Port>) = match args.mode {
        Mode::IoFwd => {
            let rx = args.rx_slot.expect("checked");
            let tx = args.peer_slot.expect("checked");
            wait_peers(&dev, &[rx, tx], 2, Some(timeout), &hint, || Ok(()))?;
            (vec![tx], vec![rx])
        }
        _ => {
            let want: Vec<Port> = args.peer_slot.into_iter().collect();
            let n = if want.is_empty() { args.qp as usize } else { 1 };
            let peers = wait_peers(&dev, &want, n, Some(timeout), &hint, || Ok(()))?;
            match args.mode {
                Mode::RxOnly => (vec![], peers),
                Mode::FileTrans if args.recv.is_some() => (vec![], peers),
                _ => (peers, vec![]),
            }
        }
    };
    let qps = |ports: &[Port], ep: &mut Endpoint| -> Result<Vec<Qp>> {
        let mut v = Vec::new();
        for &p in ports {
            let qp = ep.t.create_qp(p)?;
            ep.t.wait_connected(p, timeout).map_err(|e| {
                anyhow::anyhow!(
                    "connecting to port {p}: {}: is it an {TOOL} too, and still running?",
                    ntbdk_apps::perf::connect_failure(&e)
                )
            })?;
            v.push(qp);
        }
        Ok(v)
    };
    let tx = qps(&tx_ports, &mut ep)?;
    let rx = qps(&rx_ports, &mut ep)?;
    pin(TOOL, core);
    let mut stats = Stats::new(Instant::now());
    let result = match args.mode {
        Mode::FileTrans => {
            let r = match (&args.send, &args.recv) {
                (Some(path), _) => send_file(
                    &mut ep,
                    tx[0],
                    path,
                    args.burst as usize,
                    timeout,
                    &mut stats,
                ),
                (None, Some(path)) => recv_file(&mut ep, rx[0], path, timeout, &mut stats),
                (None, None) => unreachable!("checked above"),
            };
            r.map(|t| {
                let what = if args.send.is_some() { "sent" } else { "received" };
                println!(
                    "{TOOL}: file {what}: {} bytes in {:.3} s ({:.3} GB/s), checksum {:016x} matches",
                    t.bytes,
                    t.elapsed.as_secs_f64(),
                    t.bytes as f64 / t.elapsed.as_secs_f64().max(1e-9) / 1e9,
                    t.checksum
                );
            })
        }
        mode => {
            for &q in &rx {
                ep.post_recvs(q)?;
            }
            let limit = Limit {
                messages: args.count,
                duration,
            };
            forward(
                &mut ep,
                mode,
                &tx,
                &rx,
                args.size as usize,
                args.burst as usize,
                limit,
                period,
                timeout,
                &mut stats,
            )
        }
    };
    print!("{}", stats.report(Instant::now()));
    let d = dev.counters();
    println!(
        "{TOOL}: device: posted writes {}, non-posted reads {}",
        d.posted_writes, d.non_posted_reads
    );
    result
}
