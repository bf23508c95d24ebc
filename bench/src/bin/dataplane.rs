//! `bench dataplane`: the data queues' bursts of mbufs against the queue
//! pair's copy path, side by side in one process on a private emulated
//! fabric, each case a continuous run counted where messages arrive.
//!
//! - **copy path**: `post_send` in bursts of 32 from a byte slice; the
//!   receiver's messages land in posted receives (a copy out of the eager
//!   buffer) and the application copies each out with `region_read` (a
//!   second copy), then reposts.
//! - **rx_burst**: `tx_burst` of mbufs in bursts of 32 (the sender writes an
//!   8-byte sequence into each and sets its length); the receiver takes them
//!   in place with `rx_burst` and frees them with `Mbuf::free_bulk` (no copy).
//! - **two queues**: two sender threads, one queue each, to one receiver
//!   thread polling both queues, against one sender and one queue.
//!
//! Sender and receiver are pinned one per core; in the burst cases the main
//! thread keeps both transports polled (the control path) every
//! millisecond. Each case runs `--seconds` after a warm-up; cases are
//! interleaved over `--runs` repetitions and the median and range printed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ntbdk_bench::{command_line, core_pair, describe_machine, median_f64, pin, send_burst};
use ntbdk_mempool::ZoneOptions;
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};
use ntbdk_pmd::mbuf::{Mbuf, MbufPool};
use ntbdk_pmd::transport::{
    Access, Completion, Config, DataQueue, DataQueues, Geometry, OpKind, Sge, Transport,
    TransportError,
};

/// Messages per burst, both paths.
const BURST: usize = 32;
/// Receives the copy path keeps posted.
const RECVS: u64 = 256;
/// Eager buffers of the copy path's queue pair.
const EAGER: u32 = 128;
/// Bytes per receive buffer (both paths) and eager buffer.
const BUF: u32 = 4096;

#[derive(Debug, Parser)]
#[command(
    name = "dataplane",
    about = "data queues (rx_burst) vs the copy path, side by side"
)]
struct Args {
    /// Seconds of each continuous run (after a 0.2 s warm-up).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Interleaved repetitions of every case (at least 1).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Message sizes in bytes, comma-separated (e.g. `--sizes 64,1500`),
    /// each 1..=4096.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1500, 4096])]
    sizes: Vec<usize>,
    /// Data descriptors, and so receive buffers, per queue (a power of
    /// two; DPDK `ntb_fwd`'s default).
    #[arg(long, default_value_t = 1024)]
    nb_desc: u32,
    /// Skip the two-queue scaling case.
    #[arg(long)]
    no_scaling: bool,
    /// Run only the burst path (for profiling it).
    #[arg(long)]
    burst_only: bool,
    /// Instead of the table: N messages (at least 1) of the first size
    /// through one queue with both sides on this thread (software cost per
    /// message; run it under callgrind to count instructions).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    one_core: Option<u64>,
}

/// The fabric's geometry: the copy path's queue pair and `nb_desc` data
/// descriptors (and receive buffers) per queue.
fn geometry(nb_desc: u32) -> Geometry {
    Geometry {
        ports: 2,
        queue_depth: 256,
        eager_count: EAGER,
        eager_size: BUF,
        data: DataQueues {
            count: 2,
            nb_desc,
            buf_size: BUF,
        },
    }
}

/// A fabric of two hosts in a directory of its own, removed after `f`.
fn with_hosts<R>(nb_desc: u32, f: impl FnOnce(Transport, Transport) -> Result<R>) -> Result<R> {
    let g = geometry(nb_desc);
    let window = g
        .layout()
        .with_context(|| format!("--nb-desc {nb_desc}"))?
        .window_size_for(RECVS as usize * BUF as usize + (1 << 20))
        .next_multiple_of(1 << 20);
    let dir = std::env::temp_dir().join(format!("ntbdk-bench-dataplane-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating the fabric directory")?;
    let fc = FabricConfig {
        slots: 2,
        window_size: window,
        heartbeat_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let r = (|| {
        let fabric = EmuFabric::create_in(&dir, "bench", &fc)?;
        let host = |slot| -> Result<Transport> {
            let dev = EmuDevice::join(
                &fabric,
                &DeviceConfig {
                    slot: Some(slot),
                    fabric: fc.clone(),
                    dir: Some(dir.clone()),
                    ..Default::default()
                },
            )?;
            Ok(Transport::new(Arc::new(dev), Config::new(g))?)
        };
        let (mut a, mut b) = (host(0)?, host(1)?);
        let end = Instant::now() + Duration::from_secs(10);
        while !(a.is_connected(1) && b.is_connected(0)) {
            a.progress();
            b.progress();
            if Instant::now() > end {
                bail!("the two hosts did not connect");
            }
        }
        f(a, b)
    })();
    let _ = EmuFabric::destroy_in(&dir, "bench");
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Counts messages where they arrive; the timer reads it.
struct Counter {
    got: AtomicU64,
    bytes: AtomicU64,
    stop: AtomicBool,
}

impl Counter {
    fn new() -> Self {
        Self {
            got: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }
}

/// One measured run: messages and bytes per second at the receiver.
#[derive(Debug, Clone, Copy)]
struct Rate {
    mps: f64,
    bps: f64,
}

/// Waits for the warm-up, counts for `secs`, then stops the run; `poll`
/// runs about every millisecond meanwhile (the control path).
fn time_run(c: &Counter, secs: f64, mut poll: impl FnMut()) -> Rate {
    let wait = |d: Duration, poll: &mut dyn FnMut()| {
        let end = Instant::now() + d;
        while Instant::now() < end {
            poll();
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait(Duration::from_millis(200), &mut poll);
    let (m0, b0, t0) = (
        c.got.load(Ordering::Relaxed),
        c.bytes.load(Ordering::Relaxed),
        Instant::now(),
    );
    wait(Duration::from_secs_f64(secs), &mut poll);
    let (m1, b1, dt) = (
        c.got.load(Ordering::Relaxed),
        c.bytes.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64(),
    );
    c.stop.store(true, Ordering::Relaxed);
    Rate {
        mps: (m1 - m0) as f64 / dt,
        bps: (b1 - b0) as f64 / dt,
    }
}

/// The copy path: sends from a slice, posted receives, `region_read`.
fn copy_path(size: usize, nb_desc: u32, secs: f64) -> Result<Rate> {
    let (ca, cb) = core_pair();
    with_hosts(nb_desc, |mut a, mut b| {
        let c = Counter::new();
        let qa = a.create_qp(1)?;
        let qb = b.create_qp(0)?;
        let recv = b.register_region(RECVS as usize * BUF as usize, Access::LOCAL)?;
        let sge = |i: u64| Sge {
            key: recv,
            offset: (i % RECVS) * u64::from(BUF),
            len: u64::from(BUF),
        };
        for i in 0..RECVS {
            b.post_recv(qb, sge(i), i)?;
        }
        std::thread::scope(|s| -> Result<Rate> {
            let rx = s.spawn(|| -> Result<()> {
                pin(cb);
                let mut comps = vec![Completion::default(); 64];
                let mut app = vec![0u8; BUF as usize];
                let (mut got, mut bytes) = (0u64, 0u64);
                while !c.stop.load(Ordering::Relaxed) {
                    let n = b.poll_completions(&mut comps);
                    for x in &comps[..n] {
                        if x.op == OpKind::Recv && x.status.is_ok() {
                            let len = x.bytes as usize;
                            b.region_read(
                                recv,
                                (x.cookie % RECVS) * u64::from(BUF),
                                &mut app[..len],
                            )?;
                            b.post_recv(qb, sge(x.cookie), x.cookie)?;
                            got += 1;
                            bytes += len as u64;
                        }
                    }
                    if n > 0 {
                        c.got.store(got, Ordering::Relaxed);
                        c.bytes.store(bytes, Ordering::Relaxed);
                    }
                }
                Ok(())
            });
            let tx = s.spawn(|| -> Result<()> {
                pin(ca);
                let msg = vec![7u8; size];
                let wrs = send_burst(&msg, BURST);
                let mut comps = vec![Completion::default(); 64];
                while !c.stop.load(Ordering::Relaxed) {
                    match a.post_sends(qa, &wrs) {
                        Ok(_) | Err(TransportError::Busy { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                    a.poll_completions(&mut comps);
                }
                Ok(())
            });
            let r = time_run(&c, secs, || {});
            tx.join().expect("sender panicked")?;
            rx.join().expect("receiver panicked")?;
            Ok(r)
        })
    })
}

/// Sends mbufs of `size` bytes through `q` until `stop`.
fn send_bursts(q: &mut DataQueue, pool: &MbufPool, size: usize, stop: &AtomicBool) -> Result<()> {
    let mut batch: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let want = BURST - batch.len();
        if want > 0 && pool.alloc_bulk(want, &mut batch).is_ok() {
            for m in &mut batch[BURST - want..] {
                m.append(&seq.to_le_bytes()).expect("8 bytes fit");
                m.set_len(size).expect("size fits the data room");
                seq += 1;
            }
        }
        q.tx_burst(&mut batch);
    }
    Ok(())
}

/// Receives from every queue of `qs` in turn until `stop`, counting.
fn receive_bursts(qs: &mut [DataQueue], c: &Counter) {
    let mut got: Vec<Mbuf> = Vec::with_capacity(BURST);
    let (mut n, mut bytes) = (0u64, 0u64);
    while !c.stop.load(Ordering::Relaxed) {
        let mut any = false;
        for q in qs.iter_mut() {
            if q.rx_burst(&mut got, BURST) > 0 {
                any = true;
                n += got.len() as u64;
                bytes += got.iter().map(|m| m.len() as u64).sum::<u64>();
                Mbuf::free_bulk(&mut got);
            }
        }
        if any {
            c.got.store(n, Ordering::Relaxed);
            c.bytes.store(bytes, Ordering::Relaxed);
        }
    }
}

/// The data queues: `senders` sender threads (one queue each) to one
/// receiver thread polling all of them.
fn burst_path(size: usize, senders: usize, nb_desc: u32, secs: f64) -> Result<Rate> {
    let (ca, cb) = core_pair();
    with_hosts(nb_desc, |mut a, mut b| {
        let c = Counter::new();
        let mut txs: Vec<DataQueue> = (0..senders as u16)
            .map(|q| a.data_queue(1, q))
            .collect::<Result<_, _>>()?;
        let mut rxs: Vec<DataQueue> = (0..senders as u16)
            .map(|q| b.data_queue(0, q))
            .collect::<Result<_, _>>()?;
        let pools: Vec<MbufPool> = (0..senders)
            .map(|i| {
                MbufPool::create(
                    &format!("bench-dp-{}-{i}", std::process::id()),
                    2048,
                    BUF as usize,
                    64,
                    &ZoneOptions::huge_or_fallback(),
                )
            })
            .collect::<Result<_, _>>()?;
        std::thread::scope(|s| -> Result<Rate> {
            let rx = s.spawn(|| {
                pin(cb);
                receive_bursts(&mut rxs, &c);
            });
            let mut txj = Vec::new();
            for (i, (q, p)) in txs.iter_mut().zip(&pools).enumerate() {
                let stop = &c.stop;
                txj.push(s.spawn(move || {
                    // The first sender has core A; a second shares core B
                    // with the receiver (a two-core machine).
                    pin(if i == 0 { ca } else { cb });
                    send_bursts(q, p, size, stop)
                }));
            }
            let r = time_run(&c, secs, || {
                a.progress();
                b.progress();
            });
            for j in txj {
                j.join().expect("sender panicked")?;
            }
            rx.join().expect("receiver panicked");
            Ok(r)
        })
    })
}

/// Both sides of one queue on this thread: `n` messages in bursts, sent,
/// received and freed; returns nanoseconds per message.
fn one_core(size: usize, nb_desc: u32, n: u64) -> Result<f64> {
    with_hosts(nb_desc, |mut a, mut b| {
        let mut tx = a.data_queue(1, 0)?;
        let mut rx = b.data_queue(0, 0)?;
        let pool = MbufPool::create(
            &format!("bench-dp1-{}", std::process::id()),
            2048,
            BUF as usize,
            64,
            &ZoneOptions::huge_or_fallback(),
        )?;
        let (mut batch, mut got) = (Vec::with_capacity(BURST), Vec::with_capacity(BURST));
        let (mut sent, mut recvd) = (0u64, 0u64);
        let start = Instant::now();
        while recvd < n {
            if batch.is_empty() && sent < n {
                pool.alloc_bulk(BURST, &mut batch)?;
                for m in &mut batch {
                    m.append(&sent.to_le_bytes())?;
                    m.set_len(size)?;
                    sent += 1;
                }
            }
            tx.tx_burst(&mut batch);
            recvd += rx.rx_burst(&mut got, BURST) as u64;
            Mbuf::free_bulk(&mut got);
            if start.elapsed() > Duration::from_secs(60) {
                bail!("one-core run stalled at {recvd} of {n}");
            }
        }
        let dt = start.elapsed();
        a.progress();
        b.progress();
        Ok(dt.as_nanos() as f64 / n as f64)
    })
}

/// Median and range of `runs`.
fn summary(runs: &[Rate], pick: impl Fn(&Rate) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = runs.iter().map(pick).collect();
    let m = median_f64(&mut v).unwrap_or(0.0);
    (m, v[0], v[v.len() - 1])
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(&size) = args.sizes.iter().find(|&&s| s == 0 || s > BUF as usize) {
        bail!("--sizes: {size} B: each size must be 1..={BUF}");
    }
    if let Some(n) = args.one_core {
        let size = args.sizes[0];
        let ns = one_core(size, args.nb_desc, n)?;
        println!(
            "one core, {size} B, {n} messages: {ns:.1} ns per message (tx_burst + rx_burst + free)"
        );
        return Ok(());
    }
    println!("# bench dataplane — {}", describe_machine());
    println!("- command: `{}`", command_line("dataplane"));
    println!(
        "continuous runs of {} s counted at the receiver, {} interleaved repetitions; median [min – max]",
        args.seconds, args.runs
    );
    println!(
        "receive buffers of {BUF} B: {} per data queue (--nb-desc), {EAGER} eager buffers on the copy path\n",
        args.nb_desc
    );
    println!("| case | size | Mmsg/s | GB/s | ratio to copy path (median) |");
    println!("| --- | --- | --- | --- | --- |");
    for &size in &args.sizes {
        let (mut copy, mut burst) = (Vec::new(), Vec::new());
        // Alternately copy first and burst first, so neither always runs
        // after the other.
        for run in 0..args.runs {
            if run % 2 == 1 {
                burst.push(burst_path(size, 1, args.nb_desc, args.seconds)?);
            }
            if !args.burst_only {
                copy.push(copy_path(size, args.nb_desc, args.seconds)?);
            }
            if run % 2 == 0 {
                burst.push(burst_path(size, 1, args.nb_desc, args.seconds)?);
            }
        }
        if args.burst_only {
            let (bm, bl, bh) = summary(&burst, |r| r.mps);
            println!(
                "| rx_burst + free_bulk | {size} B | {:.2} [{:.2} – {:.2}] | | |",
                bm / 1e6,
                bl / 1e6,
                bh / 1e6
            );
            continue;
        }
        let (cm, cl, ch) = summary(&copy, |r| r.mps);
        let (bm, bl, bh) = summary(&burst, |r| r.mps);
        let gb = |r: &[Rate]| summary(r, |x| x.bps / 1e9);
        let (cg, cgl, cgh) = gb(&copy);
        let (bg, bgl, bgh) = gb(&burst);
        println!(
            "| post_recv + region_read | {size} B | {:.2} [{:.2} – {:.2}] | {cg:.2} [{cgl:.2} – {cgh:.2}] | 1.00 |",
            cm / 1e6,
            cl / 1e6,
            ch / 1e6
        );
        println!(
            "| rx_burst + free_bulk | {size} B | {:.2} [{:.2} – {:.2}] | {bg:.2} [{bgl:.2} – {bgh:.2}] | {:.2} |",
            bm / 1e6,
            bl / 1e6,
            bh / 1e6,
            bm / cm
        );
    }
    if !args.no_scaling {
        let (mut one, mut two) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            one.push(burst_path(64, 1, args.nb_desc, args.seconds)?);
            two.push(burst_path(64, 2, args.nb_desc, args.seconds)?);
        }
        let (om, ol, oh) = summary(&one, |r| r.mps);
        let (tm, tl, th) = summary(&two, |r| r.mps);
        println!(
            "\n| 64 B, one peer | Mmsg/s | ratio |\n| --- | --- | --- |\n| one queue, one sender (cores A, B) | {:.2} [{:.2} – {:.2}] | 1.00 |\n| two queues, two senders (A; B shared with the receiver) | {:.2} [{:.2} – {:.2}] | {:.2} |",
            om / 1e6,
            ol / 1e6,
            oh / 1e6,
            tm / 1e6,
            tl / 1e6,
            th / 1e6,
            tm / om
        );
    }
    Ok(())
}
