//! What the examples share: a private two-slot emulated fabric, both hosts
//! run as threads with their lines printed in turn, and two small waits.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuFabric, FabricConfig};
use ntbdk_pmd::hw::open::{DeviceSpec, OpenOptions};
use ntbdk_pmd::transport::{Completion, OpKind, Qp, Status, Transport};

/// How long any wait of the examples lasts before it is an error.
pub const WAIT: Duration = Duration::from_secs(10);

/// A host of an example: its fabric, and where it says what it does.
pub type Host = fn(&PrivateFabric, &dyn Fn(String)) -> Result<()>;

/// Runs host A (in this thread) and host B (in another) on a private
/// fabric named after the example, printing each one's lines to `out`.
pub fn run_hosts(what: &str, out: impl Write + Send, host_a: Host, host_b: Host) -> Result<()> {
    let fabric = PrivateFabric::new(what);
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

/// The next completion of kind `op` (a failed one is an error; send
/// completions, which come at once, are checked and skipped).
pub fn next(t: &mut Transport, op: OpKind) -> Result<Completion> {
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
pub fn hang_up(t: &mut Transport, qp: Qp) -> Result<()> {
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
pub struct PrivateFabric {
    /// How hosts name it.
    pub spec: DeviceSpec,
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
    pub fn options(&self, slot: u16) -> OpenOptions {
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
