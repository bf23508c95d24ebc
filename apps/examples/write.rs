//! A write: host A writes 1 MiB into a region of host B's.
//!
//! B registers a region peers may write and sends its key in a message; A
//! fills a region of its own and posts one write naming B's key. The data
//! crosses as posted writes only (A copies straight into B's region after
//! B sent it where the region lies); A's completion means B has it. A then
//! tells B, which checks every byte and answers. Each host runs in its own
//! thread on a private emulated fabric, removed at the end (in real use
//! each host is its own process or machine: see the `messages` example).
//!
//! ```sh
//! cargo run --release -p ntbdk-apps --example write
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
    let fabric = PrivateFabric::new("write");
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

/// The byte at `i` of what A writes.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Host A: the writer.
fn host_a(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(A))?; // or "vfio:0000:00:04.0".parse()?
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(B)?; // the peer on port 1
    let inbox = t.register_region(64, Access::LOCAL)?;
    let slot = Sge {
        key: inbox,
        offset: 0,
        len: 64,
    };
    t.post_recv(qp, slot, 0)?;
    t.wait_connected(B, WAIT)?;

    // B's first message is the key of the region it lets us write.
    next(&mut t, OpKind::Recv)?;
    let mut key = [0u8; 4];
    t.region_read(inbox, 0, &mut key)?;
    let remote = RemoteAddr {
        key: RegionKey(u32::from_le_bytes(key)),
        offset: 0,
    };
    say(format!("B's region key is {:#010x}", remote.key.0));
    t.post_recv(qp, slot, 1)?;

    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    let buf = t.register_region(LEN, Access::LOCAL)?;
    t.region_write(buf, 0, &data)?;
    let local = [Sge {
        key: buf,
        offset: 0,
        len: LEN as u64,
    }];
    t.post_write(qp, &local, remote, 7)?;
    let c = next(&mut t, OpKind::Write)?; // polls t.poll_completions(): B has every byte
    say(format!("wrote {} bytes into B's region", c.bytes));

    t.post_send(qp, b"written", 0)?;
    let c = next(&mut t, OpKind::Recv)?;
    let mut answer = vec![0u8; c.bytes as usize];
    t.region_read(inbox, 0, &mut answer)?;
    say(format!("B says {:?}", String::from_utf8_lossy(&answer)));
    let reads = t.device().counters().non_posted_reads;
    say(format!("non-posted reads across the bridge: {reads}"));
    Ok(()) // dropping the transport hangs up
}

/// Host B: the target, which checks what landed.
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
    let region = t.register_region(LEN, Access::LOCAL | Access::REMOTE_WRITE)?;
    t.wait_connected(A, WAIT)?;
    t.post_send(qp, &region.0.to_le_bytes(), 1)?;

    // B's transport serves the write while it polls, here for A's message.
    next(&mut t, OpKind::Recv)?;
    let mut got = vec![0u8; LEN];
    t.region_read(region, 0, &mut got)?;
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(i))
        .count();
    ensure!(bad == 0, "{bad} of {LEN} bytes differ from what A wrote");
    say(format!(
        "all {LEN} bytes of region {:#010x} are A's",
        region.0
    ));
    t.post_send(qp, b"verified", 2)?;
    hang_up(&mut t, qp)
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
