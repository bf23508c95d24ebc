//! `ntb-tool`: create, inspect and poke NTB fabrics, like Linux's `ntb_tool`.
//!
//! ```text
//! ntb-tool create lab --slots 8 --window-size 1M
//! ntb-tool status lab
//! ntb-tool db ring lab --peer 1 0x1        # claims a slot briefly to ring
//! ntb-tool db read lab --slot 1            # slot 1's own doorbell register
//! ntb-tool spad write lab --slot 1 0 0xbeef
//! ntb-tool mw write lab --peer 1 --offset 0x100 de:ad:be:ef
//! ntb-tool mw read lab --peer 1 --offset 0x100 --len 64
//! ntb-tool db wait lab --slot 1 0x1 --timeout 5
//! ntb-tool link wait lab --slot 1 --timeout 5
//! ntb-tool status lab --watch 1
//! ntb-tool destroy lab
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ntbdk_apps::cli::session::check_interrupted;
use ntbdk_apps::cli::{units, usage_error};
use ntbdk_apps::tool::hexdump::{hexdump, parse_hex_bytes};
use ntbdk_apps::tool::qp::{find_pages, remove_pages, render_qps};
use ntbdk_apps::tool::watch::Watch;
use ntbdk_apps::tool::{dead_owners, fmt_size, parse_size, parse_u32, parse_u64, render_status};
use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig, shm_dir};
use ntbdk_pmd::hw::open::{DeviceSpec, OpenOptions, attach_fabric};

/// Create, inspect and poke emulated NTB fabrics (and, later, any backend).
#[derive(Parser, Debug)]
#[command(
    name = "ntb-tool",
    version,
    about = "Create, inspect and poke NTB fabrics: slots, links, doorbells, scratchpads"
)]
struct Cli {
    /// Directory of the fabrics' control segments [default: $NTBDK_SHM_DIR, else /dev/shm]
    #[arg(long, global = true, value_name = "DIR")]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a fabric.
    Create {
        /// Fabric name (A-Z a-z 0-9 _ - ., up to 64 characters).
        name: String,
        /// Number of slots (ports), 2 to 4096.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(2..=4096))]
        slots: u16,
        /// Inbound window size per slot (K, M, G suffixes).
        #[arg(long, default_value = "16M", value_parser = parse_size)]
        window_size: usize,
        /// Scratchpad registers per slot (at most 64).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u8).range(0..=64))]
        spads: u8,
        /// Doorbell bits per slot (1 to 64).
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=64))]
        db_bits: u32,
        /// R-LUT entries per slot (1 to 64).
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u8).range(1..=64))]
        rlut: u8,
        /// Heartbeat timeout in milliseconds: a host silent this long is
        /// dead (not a wait, unlike the other tools' --timeout).
        #[arg(long = "heartbeat-ms", visible_alias = "timeout-ms", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        timeout_ms: u64,
        /// Emulated non-posted read latency in nanoseconds.
        #[arg(long, default_value_t = 1000)]
        read_latency_ns: u64,
    },
    /// Remove a fabric.
    Destroy {
        /// Fabric name.
        name: String,
        /// Remove it even while slots are up.
        #[arg(long)]
        force: bool,
    },
    /// List fabrics; those whose owners are all dead are marked.
    List,
    /// Show a fabric's slots: owners, link, generations, heartbeats, counters.
    Status {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF (the fabric in an
        /// ivshmem function's shared memory; takes no slot).
        name: String,
        /// Show never-used slots too.
        #[arg(long)]
        all: bool,
        /// First reclaim slots whose owner is dead.
        #[arg(long)]
        reclaim: bool,
        /// Print per-host rates (posted writes/s, MiB/s, reads/s), joins and
        /// link downs every SECS seconds (default 1) until Ctrl-C.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = parse_watch)]
        watch: Option<f64>,
        /// With --watch, stop after N samples.
        #[arg(long, value_name = "N", requires = "watch")]
        count: Option<u64>,
    },
    /// Queue pairs of every host running a transport on the fabric: state,
    /// outstanding writes/reads/multicasts, receives posted, backlog,
    /// counters and drops by kind, per peer (from the stats pages the
    /// transports publish beside the fabric).
    Qp {
        /// Fabric name, or emu:NAME.
        name: String,
        /// Show peers never connected too.
        #[arg(long)]
        all: bool,
    },
    /// Scratchpad registers.
    Spad {
        #[command(subcommand)]
        op: SpadOp,
    },
    /// Doorbell registers.
    Db {
        #[command(subcommand)]
        op: DbOp,
    },
    /// Memory windows: a byte range of a peer's window through the bridge.
    Mw {
        #[command(subcommand)]
        op: MwOp,
    },
    /// Links.
    Link {
        #[command(subcommand)]
        op: LinkOp,
    },
}

#[derive(Subcommand, Debug)]
enum MwOp {
    /// Read a byte range of a peer's window as a host (one non-posted read,
    /// counted as such) and hex-dump it.
    Read {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The peer whose window to read.
        #[arg(long)]
        peer: u16,
        /// The slot to act as (claimed briefly; default: the first free one).
        #[arg(long)]
        slot: Option<u16>,
        /// First byte, from the window's start (K, M suffixes, 0x hex).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        offset: usize,
        /// Bytes to read (at most 1 MiB).
        #[arg(long, default_value = "64", value_parser = parse_size)]
        len: usize,
    },
    /// Write bytes into a peer's window as a host (posted writes): the
    /// given hex bytes, or --len bytes of --fill.
    Write {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The peer whose window to write.
        #[arg(long)]
        peer: u16,
        /// The slot to act as (claimed briefly; default: the first free one).
        #[arg(long)]
        slot: Option<u16>,
        /// First byte, from the window's start (K, M suffixes, 0x hex).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        offset: usize,
        /// Write this byte (decimal, 0x hex) --len times instead of BYTES.
        #[arg(long, value_parser = parse_byte, requires = "len", conflicts_with = "bytes")]
        fill: Option<u8>,
        /// With --fill, how many bytes (at most 1 MiB).
        #[arg(long, value_parser = parse_size, requires = "fill")]
        len: Option<usize>,
        /// The bytes in hex: deadbeef, de:ad:be:ef or "de ad be ef".
        #[arg(value_parser = parse_hex_bytes, required_unless_present = "fill")]
        bytes: Option<HexBytes>,
    },
}

#[derive(Subcommand, Debug)]
enum LinkOp {
    /// Wait until slot N's link is up (or, with --down, down); fails after
    /// --timeout.
    Wait {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot.
        #[arg(long)]
        slot: u16,
        /// Wait for the link to go down instead.
        #[arg(long)]
        down: bool,
        /// Give up after SECS seconds.
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        timeout: f64,
    },
}

#[derive(Subcommand, Debug)]
enum SpadOp {
    /// Read slot N's scratchpads, or (with --peer) read a peer's through the
    /// bridge as a host (a non-posted read).
    Read {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot whose registers to read; with --peer, the slot to act as
        /// (claimed briefly; default: the first free one).
        #[arg(long)]
        slot: Option<u16>,
        /// Read this peer's scratchpad through the bridge.
        #[arg(long)]
        peer: Option<u16>,
        /// The scratchpad (default: all).
        #[arg(value_parser = parse_index)]
        index: Option<usize>,
    },
    /// Write slot N's scratchpad, or (with --peer) a peer's as a host (a
    /// posted write).
    Write {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot whose register to write; with --peer, the slot to act as
        /// (claimed briefly; default: the first free one).
        #[arg(long)]
        slot: Option<u16>,
        /// Write this peer's scratchpad through the bridge.
        #[arg(long)]
        peer: Option<u16>,
        /// The scratchpad.
        #[arg(value_parser = parse_index)]
        index: usize,
        /// The value (decimal, 0x hex, 0b binary).
        #[arg(value_parser = parse_u32)]
        value: u32,
    },
}

#[derive(Subcommand, Debug)]
enum DbOp {
    /// Ring a peer's doorbell bits as a host (claims a slot briefly).
    Ring {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The peer to ring.
        #[arg(long)]
        peer: u16,
        /// The slot to act as (default: the first free one).
        #[arg(long)]
        slot: Option<u16>,
        /// The bits (decimal, 0x hex, 0b binary).
        #[arg(value_parser = parse_u64)]
        bits: u64,
    },
    /// Read slot N's pending doorbell bits.
    Read {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot.
        #[arg(long)]
        slot: u16,
    },
    /// Clear slot N's doorbell bits.
    Clear {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot.
        #[arg(long)]
        slot: u16,
        /// The bits to clear (default: all).
        #[arg(value_parser = parse_u64)]
        bits: Option<u64>,
    },
    /// Wait until any of BITS (default: any bit) is pending in slot N's
    /// doorbell and print them; fails after --timeout. Leaves them pending.
    Wait {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot whose doorbell to watch.
        #[arg(long)]
        slot: u16,
        /// The bits to wait for (decimal, 0x hex, 0b binary).
        #[arg(value_parser = parse_u64)]
        bits: Option<u64>,
        /// Give up after SECS seconds.
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        timeout: f64,
    },
    /// Show, set or clear slot N's doorbell mask.
    Mask {
        /// Fabric name, or a device: emu:NAME, or vfio:BDF.
        name: String,
        /// The slot.
        #[arg(long)]
        slot: u16,
        /// Bits to set in the mask.
        #[arg(long, value_parser = parse_u64)]
        set: Option<u64>,
        /// Bits to clear from the mask.
        #[arg(long, value_parser = parse_u64)]
        clear: Option<u64>,
    },
}

fn parse_index(s: &str) -> Result<usize, String> {
    parse_u64(s).map(|v| v as usize)
}

/// Bytes given as one hex argument (an alias, so that clap takes one
/// value rather than a list).
type HexBytes = Vec<u8>;

fn parse_byte(s: &str) -> Result<u8, String> {
    let v = parse_u64(s)?;
    u8::try_from(v).map_err(|_| format!("{s:?} is not a byte (0 to 255)"))
}

/// Most bytes `mw read` and `mw write --fill` move in one go.
const MW_MAX: usize = 1 << 20;

/// Checks a byte count for `mw`: 1 to [`MW_MAX`].
fn mw_len(len: usize) -> Result<usize> {
    if len == 0 || len > MW_MAX {
        bail!(
            "{len} bytes: mw moves 1 byte to {} at a time",
            fmt_size(MW_MAX)
        );
    }
    Ok(len)
}

/// A timeout in seconds as a `Duration`, or an error naming the flag.
fn timeout(secs: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| anyhow::anyhow!("--timeout {secs}: give a number of seconds, 0 or more"))
}

/// Polls `done` every 100 µs until it returns `Some`, `limit` passes
/// (an error saying `what` did not happen), or Ctrl-C.
fn wait_for<T>(limit: Duration, what: &str, mut done: impl FnMut() -> Option<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = done() {
            return Ok(v);
        }
        if start.elapsed() >= limit {
            bail!("{what} within {limit:?}: nothing happened; try a longer --timeout");
        }
        check_interrupted()?;
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// `--watch`'s optional SECS: a word that is no number is most likely the
/// fabric's name given after it.
fn parse_watch(s: &str) -> std::result::Result<f64, String> {
    s.parse().map_err(|_| {
        format!(
            "{s:?} is not a number of seconds (give the fabric's name before --watch: \
             ntb-tool status NAME --watch [SECS])"
        )
    })
}

/// Attaches to the fabric `name` in `dir`; when there is none, says how to
/// create one (in this tool's terms).
fn attach(dir: &Path, name: &str) -> Result<EmuFabric> {
    let exists = EmuFabric::list_in(dir)
        .map(|l| l.iter().any(|f| f.name == name))
        .unwrap_or(true);
    if !exists {
        bail!(
            "no fabric named {name:?} in {}: create it (ntb-tool create {name}), or start an app \
             that creates it (ntb-perf --fabric {name} --server); ntb-tool list shows those there",
            dir.display()
        );
    }
    EmuFabric::attach_in(dir, name).with_context(|| format!("attaching to fabric {name:?}"))
}

/// Attaches to a fabric named by name or by device (`emu:NAME`,
/// `vfio:BDF`: the fabric in that function's shared memory).
fn attach_device(dir: &Path, name: &str) -> Result<EmuFabric> {
    match name.parse::<DeviceSpec>()? {
        DeviceSpec::Emu(name) => attach(dir, &name),
        spec @ DeviceSpec::Vfio(_) => {
            let opts = OpenOptions {
                emu: DeviceConfig {
                    dir: Some(dir.to_owned()),
                    ..DeviceConfig::default()
                },
                ..OpenOptions::default()
            };
            attach_fabric(&spec, &opts).with_context(|| format!("attaching to {spec}"))
        }
    }
}

/// Attaches to the fabric in a PCI function's shared memory, then watches
/// it for one heartbeat timeout: across hosts an owner is judged alive only
/// by seeing its heartbeat advance.
fn attach_shared(spec: &DeviceSpec, dir: &Path) -> Result<EmuFabric> {
    let f = attach_device(dir, &spec.to_string())?;
    let _ = f.status();
    std::thread::sleep(f.config().heartbeat_timeout + f.config().heartbeat_timeout / 4);
    Ok(f)
}

/// Joins `fabric` briefly as a host to act on `peer`: slot `slot`, or the
/// first free one (which must not be `peer` itself).
fn host(fabric: &EmuFabric, slot: Option<u16>, peer: u16) -> Result<EmuDevice> {
    let dev = join_briefly(fabric, slot)?;
    if dev.port() == peer {
        bail!(
            "slot {peer} was free, so it is no peer to act on (ntb-tool took it to act from): \
             name a slot that is up (ntb-tool status {}), or start a host there first",
            fabric.name()
        );
    }
    Ok(dev)
}

/// Joins `fabric` briefly as a host: slot `slot`, or the first free one.
fn join_briefly(fabric: &EmuFabric, slot: Option<u16>) -> Result<EmuDevice> {
    let cfg = DeviceConfig {
        slot,
        heartbeat_thread: false,
        ..Default::default()
    };
    // A one-shot verb's window carries no data, so whether it got hugepages
    // does not matter: the zone's fallback warning would only be noise.
    // (Failures still come back as errors.)
    let quiet = tracing::subscriber::NoSubscriber::default();
    tracing::subscriber::with_default(quiet, || fabric.join(&cfg)).with_context(|| {
        format!(
            "joining fabric {:?} as a host{}",
            fabric.name(),
            slot.map(|s| format!(" in slot {s}")).unwrap_or_default()
        )
    })
}

fn spads_to_show(count: usize, index: Option<usize>) -> Result<Vec<usize>> {
    match index {
        Some(i) if i >= count => bail!("no scratchpad {i}: the fabric has {count} (0..{count})"),
        Some(i) => Ok(vec![i]),
        None => Ok((0..count).collect()),
    }
}

fn run(cli: Cli) -> Result<()> {
    let dir = cli.dir.unwrap_or_else(shm_dir);
    match cli.cmd {
        Cmd::Create {
            name,
            slots,
            window_size,
            spads,
            db_bits,
            rlut,
            timeout_ms,
            read_latency_ns,
        } => {
            let cfg = FabricConfig {
                slots: usize::from(slots),
                window_size,
                spads: usize::from(spads),
                db_bits,
                rlut_entries: usize::from(rlut),
                heartbeat_timeout: Duration::from_millis(timeout_ms),
                read_latency: Duration::from_nanos(read_latency_ns),
            };
            let f = EmuFabric::create_in(&dir, &name, &cfg)
                .with_context(|| format!("creating fabric {name:?}"))?;
            println!(
                "created fabric {name}: {slots} slots, {} windows, at {}",
                fmt_size(window_size),
                f.path().display()
            );
        }
        Cmd::Destroy { name, force } => {
            if !force && let Ok(f) = EmuFabric::attach_in(&dir, &name) {
                let up: Vec<u16> = f
                    .status()
                    .slots
                    .iter()
                    .filter(|s| s.link_up)
                    .map(|s| s.slot)
                    .collect();
                if !up.is_empty() {
                    bail!(
                        "fabric {name:?} has slots up ({up:?}): stop their processes first, \
                         or pass --force"
                    );
                }
            }
            EmuFabric::destroy_in(&dir, &name)
                .with_context(|| format!("destroying fabric {name:?}"))?;
            // Stats pages left by hosts that died without dropping their
            // transport go with the fabric.
            remove_pages(&dir, &name);
            println!("destroyed fabric {name}");
        }
        Cmd::List => {
            let list = EmuFabric::list_in(&dir)
                .with_context(|| format!("listing fabrics in {}", dir.display()))?;
            if list.is_empty() {
                println!("no fabrics in {}", dir.display());
            }
            for f in list {
                match (&f.config, &f.problem) {
                    (Some(c), _) => {
                        let dead = EmuFabric::attach_in(&dir, &f.name)
                            .ok()
                            .and_then(|fab| dead_owners(&fab.status()))
                            .map(|n| {
                                format!(
                                    "  owners dead ({n} slots held): ntb-tool status {} \
                                     --reclaim, or destroy it",
                                    f.name
                                )
                            })
                            .unwrap_or_default();
                        println!(
                            "{:<24} {:>4} slots  {:>4} up  {:>8} windows{dead}",
                            f.name,
                            c.slots,
                            f.up_slots,
                            fmt_size(c.window_size)
                        )
                    }
                    (None, p) => println!(
                        "{:<24} unusable: {}",
                        f.name,
                        p.as_deref().unwrap_or("unknown")
                    ),
                }
            }
        }
        Cmd::Status {
            name,
            all,
            reclaim,
            watch,
            count,
        } => {
            let f = match name.parse::<DeviceSpec>()? {
                DeviceSpec::Emu(name) => attach(&dir, &name)?,
                spec @ DeviceSpec::Vfio(_) => attach_shared(&spec, &dir)?,
            };
            if reclaim {
                let r = f.reclaim_dead();
                if !r.is_empty() {
                    println!("reclaimed dead slots {r:?}");
                }
            }
            match watch {
                None => print!("{}", render_status(&f.status(), all)),
                Some(secs) => {
                    let every = units::secs(secs, "--watch").map_err(usage_error)?;
                    let mut w = Watch::new(f.status());
                    let mut last = Instant::now();
                    for _ in 0..count.unwrap_or(u64::MAX) {
                        let due = last + every;
                        while Instant::now() < due {
                            check_interrupted()?;
                            std::thread::sleep(
                                (due - Instant::now()).min(Duration::from_millis(50)),
                            );
                        }
                        let now = Instant::now();
                        println!("{}", w.next(f.status(), now - last, all));
                        last = now;
                    }
                }
            }
        }
        Cmd::Qp { name, all } => {
            let name = match name.parse::<DeviceSpec>() {
                Ok(DeviceSpec::Emu(n)) => n,
                Ok(dev) => bail!(
                    "qp {dev}: only hosts on an emulated fabric publish their queue pairs \
                     (a device's hosts have no fabric directory to put them in); give a fabric \
                     name, or ask the host's application for its counters"
                ),
                Err(e) => bail!("qp: {e}"),
            };
            let f = attach(&dir, &name)?;
            let pages = find_pages(&dir, &name)
                .with_context(|| format!("listing stats pages in {}", dir.display()))?;
            print!("{}", render_qps(&f.status(), &pages, all));
        }
        Cmd::Spad { op } => match op {
            SpadOp::Read {
                name,
                slot,
                peer,
                index,
            } => {
                let f = attach_device(&dir, &name)?;
                if let Some(peer) = peer {
                    let dev = host(&f, slot, peer)?;
                    for i in spads_to_show(dev.spad_count(), index)? {
                        let v = dev
                            .peer_spad_read(peer, i)
                            .with_context(|| format!("reading scratchpad {i} of peer {peer}"))?;
                        println!("peer {peer} spad {i}: {v:#010x} ({v})");
                    }
                } else {
                    let Some(slot) = slot else {
                        bail!("say whose scratchpads to read: --slot N (or --peer P)")
                    };
                    let regs = f.registers(slot)?;
                    for i in spads_to_show(regs.spad_count(), index)? {
                        let v = regs.spad(i)?;
                        println!("slot {slot} spad {i}: {v:#010x} ({v})");
                    }
                }
            }
            SpadOp::Write {
                name,
                slot,
                peer,
                index,
                value,
            } => {
                let f = attach_device(&dir, &name)?;
                if let Some(peer) = peer {
                    let dev = host(&f, slot, peer)?;
                    dev.peer_spad_write(peer, index, value)
                        .with_context(|| format!("writing scratchpad {index} of peer {peer}"))?;
                    println!(
                        "peer {peer} spad {index} <- {value:#010x} (from slot {})",
                        dev.port()
                    );
                } else {
                    let Some(slot) = slot else {
                        bail!("say whose scratchpad to write: --slot N (or --peer P)")
                    };
                    f.registers(slot)?.set_spad(index, value)?;
                    println!("slot {slot} spad {index} <- {value:#010x}");
                }
            }
        },
        Cmd::Db { op } => match op {
            DbOp::Ring {
                name,
                peer,
                slot,
                bits,
            } => {
                let f = attach_device(&dir, &name)?;
                let dev = host(&f, slot, peer)?;
                dev.peer_db_set(peer, bits)
                    .with_context(|| format!("ringing doorbell {bits:#x} of peer {peer}"))?;
                println!(
                    "rang peer {peer} doorbell {bits:#x} (from slot {})",
                    dev.port()
                );
            }
            DbOp::Read { name, slot } => {
                let f = attach_device(&dir, &name)?;
                let r = f.registers(slot)?;
                println!("slot {slot} db {:#x} mask {:#x}", r.db(), r.db_mask());
            }
            DbOp::Clear { name, slot, bits } => {
                let f = attach_device(&dir, &name)?;
                let r = f.registers(slot)?;
                r.db_clear(bits.unwrap_or(u64::MAX));
                println!("slot {slot} db {:#x}", r.db());
            }
            DbOp::Wait {
                name,
                slot,
                bits,
                timeout: secs,
            } => {
                let f = attach_device(&dir, &name)?;
                let r = f.registers(slot)?;
                let want = bits.unwrap_or(u64::MAX);
                let which = match bits {
                    Some(b) => format!("no doorbell bit of {b:#x}"),
                    None => "no doorbell bit".to_string(),
                };
                let got = wait_for(
                    timeout(secs)?,
                    &format!("{which} rang at slot {slot}"),
                    || Some(r.db() & want).filter(|&b| b != 0),
                )?;
                println!("slot {slot} db {got:#x}");
            }
            DbOp::Mask {
                name,
                slot,
                set,
                clear,
            } => {
                let f = attach_device(&dir, &name)?;
                let r = f.registers(slot)?;
                if let Some(b) = set {
                    r.db_set_mask(b)?;
                }
                if let Some(b) = clear {
                    r.db_clear_mask(b);
                }
                println!("slot {slot} db mask {:#x}", r.db_mask());
            }
        },
        Cmd::Mw { op } => match op {
            MwOp::Read {
                name,
                peer,
                slot,
                offset,
                len,
            } => {
                let f = attach_device(&dir, &name)?;
                let dev = host(&f, slot, peer)?;
                let mut buf = vec![0u8; mw_len(len)?];
                dev.non_posted_read(peer, 0, offset, &mut buf)
                    .with_context(|| {
                        format!("reading {len} bytes at {offset:#x} of peer {peer}'s window")
                    })?;
                print!("{}", hexdump(offset, &buf));
            }
            MwOp::Write {
                name,
                peer,
                slot,
                offset,
                fill,
                len,
                bytes,
            } => {
                let bytes = match (fill, len, bytes) {
                    (Some(b), Some(n), _) => vec![b; mw_len(n)?],
                    (_, _, Some(bytes)) => bytes,
                    _ => bail!("say what to write: hex BYTES, or --fill B --len N"),
                };
                let f = attach_device(&dir, &name)?;
                let dev = host(&f, slot, peer)?;
                dev.peer_window(peer, 0)
                    .and_then(|w| w.write(offset, &bytes))
                    .with_context(|| {
                        format!(
                            "writing {} bytes at {offset:#x} of peer {peer}'s window",
                            bytes.len()
                        )
                    })?;
                println!(
                    "peer {peer} mw [{offset:#x}, {:#x}) <- {} bytes (from slot {})",
                    offset + bytes.len(),
                    bytes.len(),
                    dev.port()
                );
            }
        },
        Cmd::Link { op } => match op {
            LinkOp::Wait {
                name,
                slot,
                down,
                timeout: secs,
            } => {
                let f = attach_device(&dir, &name)?;
                f.registers(slot)?; // the slot exists
                let want_up = !down;
                let state = if want_up { "up" } else { "down" };
                let generation = wait_for(
                    timeout(secs)?,
                    &format!("slot {slot}'s link did not go {state}"),
                    || {
                        let s = &f.status().slots[slot as usize];
                        (s.link_up == want_up).then_some(s.generation)
                    },
                )?;
                println!("slot {slot} link {state} (generation {generation})");
            }
        },
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ntbdk_apps::cli::run_main("ntb-tool", || run(cli))
}
