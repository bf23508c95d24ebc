//! A read: host A reads 1 MiB out of a region of host B's.
//!
//! B fills a region peers may read and sends its key in a message; A posts
//! one read naming that key and its own region to land in. No byte is read
//! across the bridge: A sends B where its region lies, and B copies the
//! data into it with posted writes, so A's device counts zero non-posted
//! reads. Each host runs in its own thread on a private emulated fabric,
//! removed at the end (in real use each host is its own process or machine:
//! see the `messages` example).
//!
//! ```sh
//! cargo run --release -p ntbdk-apps --example read
//! ```

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuFabric, FabricConfig};
use ntbdk_pmd::hw::open::{DeviceSpec, OpenOptions, open};
use ntbdk_pmd::transport::{
    Access, Completion, Config, Geometry, OpKind, Qp, RegionKey, RemoteAddr, Sge, Status, Transport,
};

const A: u16 = 0;
const B: u16 = 1;
const LEN: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(10);

fn main() -> Result<()> {
    run(std::io::stdout())
}

/// Runs both hosts and prints what each does to `out`.
pub fn run(out: impl Write + Send) -> Result<()> {
    let fabric = PrivateFabric::new("read");
    let out = Mutex::new(out);
    let say = |who: &str, what: String| {
        let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "host {who}: {what}");
    };
    std::thread::scope(|s| {
        let b = s.spawn(|| host_b(&fabric, &|m| say("B", m)));
        let a = host_a(&fabric, &|m| say("A", m));
        let b = b.join().expect("host B panicked");
        a.context("host A").and(b.context("host B"))
    })
}

/// The byte at `i` of B's region.
fn pattern(i: usize) -> u8 {
    (i % 253) as u8
}

/// Host A: the reader.
fn host_a(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(A))?; // or "vfio:0000:00:04.0".parse()?
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(B)?;
    let inbox = t.register_region(64, Access::LOCAL)?;
    t.post_recv(
        qp,
        Sge {
            key: inbox,
            offset: 0,
            len: 64,
        },
        0,
    )?;
    t.wait_connected(B, WAIT)?;

    next(&mut t, OpKind::Recv)?;
    let mut key = [0u8; 4];
    t.region_read(inbox, 0, &mut key)?;
    let remote = RegionKey(u32::from_le_bytes(key));
    say(format!("B's region key is {:#010x}", remote.0));

    let local = t.register_region(LEN, Access::LOCAL)?;
    let sge = [Sge {
        key: local,
        offset: 0,
        len: LEN as u64,
    }];
    t.post_read(
        qp,
        &sge,
        RemoteAddr {
            key: remote,
            offset: 0,
        },
        9,
    )?;
    let c = next(&mut t, OpKind::Read)?;
    let mut got = vec![0u8; LEN];
    t.region_read(local, 0, &mut got)?;
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(i))
        .count();
    ensure!(bad == 0, "{bad} of {LEN} bytes read differ from B's region");
    say(format!(
        "read {} bytes of B's region (cookie {}), all as B wrote them",
        c.bytes, c.cookie
    ));
    let reads = t.device().counters().non_posted_reads;
    say(format!("non-posted reads across the bridge: {reads}"));

    t.post_send(qp, b"done", 0)?;
    // A sent last: it waits for B to hang up.
    hang_up(&mut t, qp)
}

/// Host B: the region's owner, which serves the read while it polls.
fn host_b(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(B))?;
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(A)?;
    let inbox = t.register_region(64, Access::LOCAL)?;
    t.post_recv(
        qp,
        Sge {
            key: inbox,
            offset: 0,
            len: 64,
        },
        0,
    )?;
    let region = t.register_region(LEN, Access::LOCAL | Access::REMOTE_READ)?;
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    t.region_write(region, 0, &data)?;
    t.wait_connected(A, WAIT)?;
    say(format!("filled region {:#010x}; sending its key", region.0));
    t.post_send(qp, &region.0.to_le_bytes(), 1)?;

    let c = next(&mut t, OpKind::Recv)?;
    let mut text = vec![0u8; c.bytes as usize];
    t.region_read(inbox, 0, &mut text)?;
    say(format!("A says {:?}", String::from_utf8_lossy(&text)));
    Ok(())
}

/// The next completion of kind `op` (a failed one is an error; send
/// completions, which come at once, are checked and skipped).
fn next(t: &mut Transport, op: OpKind) -> Result<Completion> {
    let end = Instant::now() + WAIT;
    let mut c = [Completion::default()];
    while Instant::now() < end {
        if t.poll_completions(&mut c) == 0 {
            std::hint::spin_loop();
            continue;
        }
        if c[0].status != Status::Success {
            bail!("{:?} failed: {:?}", c[0].op, c[0].status);
        }
        if c[0].op == op {
            return Ok(c[0]);
        }
    }
    bail!("no {op:?} completion within {WAIT:?}")
}

/// Waits for the peer to disconnect, still serving it meanwhile.
fn hang_up(t: &mut Transport, qp: Qp) -> Result<()> {
    let end = Instant::now() + WAIT;
    while t.is_connected(qp.peer()) {
        if Instant::now() >= end {
            bail!("the peer did not hang up within {WAIT:?}");
        }
        t.progress();
    }
    Ok(())
}

/// A two-slot emulated fabric of this process's own, removed when dropped.
struct PrivateFabric {
    spec: DeviceSpec,
    name: String,
}

impl PrivateFabric {
    fn new(what: &str) -> Self {
        let name = format!("example-{what}-{}", std::process::id());
        Self {
            spec: DeviceSpec::Emu(name.clone()),
            name,
        }
    }

    /// How a host opens its device: slot `slot` of the fabric, which the
    /// first host to open it creates.
    fn options(&self, slot: u16) -> OpenOptions {
        OpenOptions {
            emu: DeviceConfig {
                slot: Some(slot),
                fabric: FabricConfig {
                    slots: 2,
                    window_size: 4 << 20,
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

impl Drop for PrivateFabric {
    fn drop(&mut self) {
        let _ = EmuFabric::destroy(&self.name);
    }
}
