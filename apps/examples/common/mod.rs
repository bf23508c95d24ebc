//! What the examples share: how one runs (two processes on a private
//! two-slot emulated fabric: host A in this one, host B in a child; or one
//! host, `--role a|b --fabric NAME`, with the other started by hand), and
//! two small waits.

use std::io::Write;
use std::process::{Command, Stdio};
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

/// An example: its name and its two hosts.
pub struct Example {
    /// Its name (`messages`, `write`, `read`), which names its fabric.
    pub name: &'static str,
    /// Host A (port 0).
    pub host_a: Host,
    /// Host B (port 1).
    pub host_b: Host,
}

/// Which host a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Host A (port 0).
    A,
    /// Host B (port 1).
    B,
}

impl std::str::FromStr for Role {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "a" | "A" => Ok(Role::A),
            "b" | "B" => Ok(Role::B),
            _ => bail!("--role {s:?}: say a or b"),
        }
    }
}

impl Example {
    /// The example's `main`: with no arguments, both hosts as two processes
    /// (host B is this program again, `--role b`); with `--role a|b
    /// --fabric NAME`, that host only, on the fabric NAME (start the other
    /// the same way in another terminal; host A removes the fabric when it
    /// is done).
    pub fn main(&self) -> Result<()> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match args[..] {
            [] => {
                let exe =
                    std::env::current_exe().context("finding this program to start host B")?;
                self.run_pair(std::io::stdout(), &|fabric| {
                    let mut c = Command::new(&exe);
                    c.args(["--role", "b", "--fabric", fabric]);
                    c
                })
            }
            ["--role", role, "--fabric", fabric] | ["--fabric", fabric, "--role", role] => {
                self.run_role(role.parse()?, fabric, std::io::stdout())
            }
            ["-h" | "--help"] => {
                println!("{}", self.usage());
                Ok(())
            }
            _ => bail!("unexpected arguments {args:?}\n{}", self.usage()),
        }
    }

    fn usage(&self) -> String {
        let n = self.name;
        format!(
            "Usage: {n}                                # both hosts, as two processes\n       \
             {n} --role a|b --fabric NAME      # one host on the fabric NAME\n\n\
             Options:\n  --role a|b       which host this process runs (a: port 0, b: port 1)\n  \
             --fabric NAME    the emulated fabric both hosts open (the first creates it)\n  \
             -h, --help       print this help"
        )
    }

    /// Both hosts as two processes on a private fabric: host A in this one,
    /// host B in the process `spawn_b` makes for the fabric's name (this
    /// program with `--role b --fabric NAME`, or a test re-running itself).
    /// A's lines, then B's, go to `out`; the fabric is removed at the end.
    pub fn run_pair(&self, mut out: impl Write, spawn_b: &dyn Fn(&str) -> Command) -> Result<()> {
        let fabric = PrivateFabric::new(self.name, true);
        let child = spawn_b(&fabric.name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting host B's process")?;
        let lines = Mutex::new(Vec::new());
        let a = (self.host_a)(&fabric, &|m| {
            lines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("host A: {m}"))
        });
        // Host B's own waits end it within its WAITs, even when A failed.
        let b = child
            .wait_with_output()
            .context("waiting for host B's process")?;
        for l in lines.into_inner().unwrap_or_else(|e| e.into_inner()) {
            writeln!(out, "{l}")?;
        }
        out.write_all(&b.stdout)?;
        let b = if b.status.success() {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "host B's process failed ({}): {}",
                b.status,
                String::from_utf8_lossy(&b.stderr).trim()
            ))
        };
        match (a, b) {
            (Ok(()), b) => b,
            (Err(a), Ok(())) => Err(a.context("host A")),
            (Err(a), Err(b)) => Err(a.context(format!("host A (and {b:#})"))),
        }
    }

    /// One host, `role`, on the fabric `fabric` (created by whichever host
    /// opens it first; host A removes it when done), its lines to `out`.
    pub fn run_role(&self, role: Role, fabric: &str, out: impl Write) -> Result<()> {
        let fabric = PrivateFabric::named(fabric, role == Role::A);
        let out = Mutex::new(out);
        let say = |who: &str, m: String| {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(out, "host {who}: {m}");
            let _ = out.flush();
        };
        match role {
            Role::A => (self.host_a)(&fabric, &|m| say("A", m)).context("host A"),
            Role::B => (self.host_b)(&fabric, &|m| say("B", m)).context("host B"),
        }
    }
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

/// A two-slot emulated fabric of an example, removed when dropped by the
/// host that owns it.
pub struct PrivateFabric {
    /// How hosts name it.
    pub spec: DeviceSpec,
    name: String,
    owner: bool,
}

impl PrivateFabric {
    /// The fabric of example `what` run by this process (`example-what-PID`).
    fn new(what: &str, owner: bool) -> Self {
        Self::named(&format!("example-{what}-{}", std::process::id()), owner)
    }

    /// The fabric `name`; removed on drop when `owner`.
    fn named(name: &str, owner: bool) -> Self {
        Self {
            spec: DeviceSpec::Emu(name.to_string()),
            name: name.to_string(),
            owner,
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
                    // Two spinning processes on a small, busy machine can
                    // starve a heartbeat thread for a while: a generous
                    // timeout keeps a slow host from being declared dead.
                    heartbeat_timeout: Duration::from_secs(2),
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
        if self.owner {
            let _ = EmuFabric::destroy(&self.name);
        }
    }
}
