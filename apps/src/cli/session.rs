//! Process plumbing shared by the apps: Ctrl-C, core choice and pinning,
//! fabrics and devices, spawned peers that die with their parent, and waits
//! for peers.

use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};
use ntbdk_pmd::hw::{NtbDevice, Port};

/// Set by SIGINT / SIGTERM; every wait checks it.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether Ctrl-C (or SIGTERM) arrived.
#[inline]
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// The error of a run ended by Ctrl-C or SIGTERM; [`run_main`](super::run_main)
/// exits with status 130 when it finds one in an error's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// Fails with [`Interrupted`] once Ctrl-C arrived.
#[inline]
pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        return Err(Interrupted.into());
    }
    Ok(())
}

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C, SIGTERM and SIGHUP (the terminal closed) set a flag that every
/// wait checks, so a run ends through its normal path: fabric removed,
/// children reaped.
///
/// A signal already ignored when the process started (`nohup`, a
/// background job of a script) stays ignored, as shells leave it.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a null new action only reads the current one into `old`,
        // a plain C struct for which all-zero bytes are valid.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            continue;
        }
        // SAFETY: `on_signal` is async-signal-safe (one atomic store) and
        // has the signature `signal` expects.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// The environment variable a spawner sets in its peers to its own pid
/// ([`spawned_by_us`], [`die_with_parent`]).
pub const SPAWNER_PID_ENV: &str = "NTBDK_SPAWNER_PID";

/// Marks `cmd` as a peer this process spawns: it learns our pid, so it can
/// tell whether we died before it could ask to die with us.
pub fn spawned_by_us(cmd: &mut std::process::Command) -> &mut std::process::Command {
    cmd.env(SPAWNER_PID_ENV, std::process::id().to_string())
}

/// A spawned peer dies with the process that spawned it (`PR_SET_PDEATHSIG`).
pub fn die_with_parent() {
    // SAFETY: PR_SET_PDEATHSIG with a valid signal number only sets a
    // process attribute; no memory is passed.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    // The spawner may have died before the call: then we were re-parented,
    // to init or to a subreaper (`systemd --user`, tini), and no signal
    // will come.
    let parent = std::os::unix::process::parent_id();
    let spawner = std::env::var(SPAWNER_PID_ENV)
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    // (Without the variable, being re-parented to init is the sign; with
    // it, init may be the spawner itself: a container or a pid namespace.)
    let orphaned = match spawner {
        Some(s) => s != parent,
        None => parent == 1,
    };
    if orphaned {
        std::process::exit(1);
    }
}

/// The cores this process may use (as first seen, before any pinning).
pub fn usable_cores() -> Vec<core_affinity::CoreId> {
    core_affinity::get_core_ids().unwrap_or_default()
}

/// Core `index` of `cores` (an index into the cores this process may use,
/// as DPDK's lcore ids number the cores of its `-l` list), or a usage error
/// naming `flag` and the CPU each index stands for.
pub fn pick_core(
    cores: &[core_affinity::CoreId],
    index: usize,
    flag: &str,
) -> Result<core_affinity::CoreId> {
    match cores.len() {
        0 => Ok(core_affinity::CoreId { id: 0 }),
        n if index < n => Ok(cores[index]),
        n => {
            let cpus: Vec<String> = cores
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{i} is CPU {}", c.id))
                .collect();
            Err(crate::cli::usage_error(anyhow::anyhow!(
                "{flag} {index}: this process may use {n} cores, indices 0..={} ({}); pick one \
                 of those",
                n - 1,
                cpus.join(", ")
            )))
        }
    }
}

/// Pins the calling thread (call it after joining the fabric, so the
/// device's heartbeat thread stays free to run anywhere).
pub fn pin(tool: &str, core: core_affinity::CoreId) {
    if !core_affinity::set_for_current(core) {
        eprintln!("{tool}: warning: could not pin to CPU {}", core.id);
    }
}

/// Warns once per core that two or more of `spinners` (each named, e.g.
/// `"the client"`, `"server 2"`) are pinned to: polling loops that share a
/// core take turns at the scheduler's pace, and the figures measure that.
/// `hint` names the app's flags that choose cores (`--lcore/--peer-lcore`).
/// Every app calls this for every set of spinners it pins. Returns whether
/// it warned.
pub fn warn_shared_cores(
    tool: &str,
    spinners: &[(String, core_affinity::CoreId)],
    hint: &str,
) -> bool {
    let shared = shared_cores(spinners);
    for (core, names) in &shared {
        eprintln!(
            "{tool}: warning: {} poll on the same core {core}: the figures measure the \
             scheduler, not the fabric (give each its own core: {hint})",
            names.join(" and "),
        );
    }
    !shared.is_empty()
}

/// The cores that two or more of `spinners` share, each once (in the order
/// of their first spinner) with the names of the spinners on it.
pub fn shared_cores(spinners: &[(String, core_affinity::CoreId)]) -> Vec<(usize, Vec<&str>)> {
    let mut out = Vec::new();
    for (i, (_, core)) in spinners.iter().enumerate() {
        if spinners[..i].iter().any(|(_, c)| c == core) {
            continue;
        }
        let sharing: Vec<&str> = spinners
            .iter()
            .filter(|(_, c)| c == core)
            .map(|(n, _)| n.as_str())
            .collect();
        if sharing.len() > 1 {
            out.push((core.id, sharing));
        }
    }
    out
}

/// Publishes `t`'s stats page beside `dev`'s fabric, where `ntb-tool qp`
/// reads it (removed when `t` is dropped). Failing to is a warning: the run
/// goes on without it. A fabric with no directory (one shared through an
/// ivshmem device, which `ntb-tool` cannot name) gets no page.
pub fn publish_stats(tool: &str, t: &mut ntbdk_pmd::transport::Transport, dev: &EmuDevice) {
    let f = dev.fabric();
    if f.dir().as_os_str().is_empty() {
        return;
    }
    let path = ntbdk_pmd::transport::stats_path(f.dir(), f.name(), dev.port());
    if let Err(e) = t.publish_stats(&path) {
        eprintln!("{tool}: warning: {e}: ntb-tool qp will not show this host");
    }
}

/// Attaches to the existing fabric `name`; when there is none, says so and
/// adds `hint` (what to run to create it).
pub fn attach(name: &str, hint: &str) -> Result<EmuFabric> {
    let exists = EmuFabric::list()
        .map(|l| l.iter().any(|f| f.name == name))
        .unwrap_or(true);
    if !exists {
        bail!(
            "no fabric named {name:?} in {} ({hint})",
            ntbdk_pmd::hw::emu::shm_dir().display()
        );
    }
    EmuFabric::attach(name).with_context(|| format!("attaching to fabric {name:?}"))
}

/// Attaches to `name`, or creates it with `cfg`; returns a guard that
/// removes a fabric we created.
pub fn attach_or_create(
    name: &str,
    cfg: &FabricConfig,
) -> Result<(EmuFabric, Option<FabricGuard>)> {
    if let Ok(f) = EmuFabric::attach(name) {
        return Ok((f, None));
    }
    match EmuFabric::create(name, cfg) {
        Ok(f) => Ok((f, Some(FabricGuard(name.to_string())))),
        // Created by someone else meanwhile: attach to theirs.
        Err(_) => Ok((EmuFabric::attach(name)?, None)),
    }
}

/// Joins `fabric` at `slot` (or the first free slot).
pub fn join(fabric: &EmuFabric, slot: Option<Port>) -> Result<EmuDevice> {
    if let Some(s) = slot
        && usize::from(s) >= fabric.config().slots
    {
        bail!(
            "--slot {s}: fabric {:?} has slots 0..={}",
            fabric.name(),
            fabric.config().slots - 1
        );
    }
    let cfg = DeviceConfig {
        slot,
        fabric: fabric.config().clone(),
        ..DeviceConfig::default()
    };
    EmuDevice::join(fabric, &cfg).with_context(|| format!("joining fabric {:?}", fabric.name()))
}

/// Waits until `count` peers' links are up on `dev` (`place` names it in
/// messages: `fabric "NAME"`): the ports in `want` if given, else the first
/// other ports that come up. With a `timeout` it gives up
/// after that long, saying `start_hint` (what to run on the other side);
/// without one it waits until Ctrl-C. `child_alive` is asked now and then
/// (a spawned peer that exited is an error).
pub fn wait_peers(
    dev: &dyn NtbDevice,
    place: &str,
    want: &[Port],
    count: usize,
    timeout: Option<Duration>,
    start_hint: &str,
    child_alive: impl FnMut() -> Result<()>,
) -> Result<Vec<Port>> {
    let any = |_| true;
    wait_peers_where(
        dev,
        place,
        want,
        count,
        timeout,
        start_hint,
        any,
        child_alive,
    )
}

/// [`wait_peers`], counting only the ports `accept` takes (an `ntb-perf`
/// server: the peers that said they are clients), and calling `idle` (for
/// `child_alive`) between looks, where the caller may also move its
/// transport along.
#[allow(clippy::too_many_arguments)]
pub fn wait_peers_where(
    dev: &dyn NtbDevice,
    place: &str,
    want: &[Port],
    count: usize,
    timeout: Option<Duration>,
    start_hint: &str,
    accept: impl Fn(Port) -> bool,
    mut idle: impl FnMut() -> Result<()>,
) -> Result<Vec<Port>> {
    for &p in want {
        if p == dev.port() {
            bail!("--peer-slot {p} is our own slot on {place}: name the other side's slot");
        }
        dev.link(p)
            .with_context(|| format!("--peer-slot {p} on {place}"))?;
    }
    let started = Instant::now();
    loop {
        let ready = |&p: &Port| accept(p) && dev.link(p).is_ok_and(|l| l.up);
        let up: Vec<Port> = if want.is_empty() {
            dev.peer_ports()
                .into_iter()
                .filter(ready)
                .take(count)
                .collect()
        } else {
            want.iter().copied().filter(ready).collect()
        };
        if up.len() >= count {
            return Ok(up);
        }
        idle()?;
        check_interrupted()?;
        if let Some(t) = timeout
            && started.elapsed() >= t
        {
            bail!(
                "{} of {count} peer(s) joined {place} within {t:?} (we are port {}): \
                 {start_hint}, or wait longer (--timeout)",
                up.len(),
                dev.port(),
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Removes a fabric this process created, on every exit path.
pub struct FabricGuard(pub String);

impl Drop for FabricGuard {
    fn drop(&mut self) {
        let _ = EmuFabric::destroy(&self.0);
        // With the stats pages of hosts that died before removing theirs
        // (a killed peer).
        crate::tool::qp::remove_pages(&ntbdk_pmd::hw::emu::shm_dir(), &self.0);
    }
}

/// Spawned peers, killed and reaped on every exit path that did not wait
/// for them.
#[derive(Default)]
pub struct Children(Vec<Option<Child>>);

impl Children {
    /// Takes charge of `child`.
    pub fn push(&mut self, child: Child) {
        self.0.push(Some(child));
    }

    /// Fails if a child already exited (before it was expected to).
    pub fn check_running(&mut self, what: &str) -> Result<()> {
        for c in self.0.iter_mut().flatten() {
            if let Some(status) = c.try_wait().context("checking on a spawned peer")? {
                bail!("{what} exited early ({status})");
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for every child to exit; kills the ones left
    /// after that. Returns their statuses.
    pub fn wait_all(&mut self, timeout: Duration) -> Result<Vec<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        let mut statuses = Vec::new();
        for slot in &mut self.0 {
            let Some(child) = slot.as_mut() else { continue };
            loop {
                if let Some(s) = child.try_wait().context("waiting for a spawned peer")? {
                    statuses.push(s);
                    *slot = None;
                    break;
                }
                if Instant::now() >= deadline {
                    bail!("a spawned peer did not exit within {timeout:?} after the run");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(statuses)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for mut child in self.0.drain(..).flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The error for a completion that failed, in the user's terms: a peer that
/// went away is "the connection was lost", not a flushed receive.
///
/// ```
/// use ntbdk_apps::cli::session::completion_error;
/// use ntbdk_pmd::transport::{Completion, OpKind, Status};
///
/// let c = Completion { op: OpKind::Recv, peer: 0, status: Status::Flushed, ..Completion::default() };
/// let text = completion_error(&c).to_string();
/// assert!(text.contains("connection to port 0 was lost"), "{text}");
/// assert!(!text.contains("Flushed"), "{text}");
/// ```
pub fn completion_error(c: &ntbdk_pmd::transport::Completion) -> anyhow::Error {
    use ntbdk_pmd::transport::{OpKind, Status};
    let op = match c.op {
        OpKind::Send => "send",
        OpKind::Recv => "receive",
        OpKind::Write => "write",
        OpKind::Read => "read",
        _ => "operation",
    };
    let p = c.peer;
    match c.status {
        Status::PeerDown | Status::Flushed => anyhow::anyhow!(
            "the connection to port {p} was lost (its link went down: the other side exited \
             or died) while a {op} was outstanding"
        ),
        Status::Timeout => anyhow::anyhow!(
            "a {op} with port {p} made no progress within the operation timeout: is the other \
             side still running (and not starved of CPU)?"
        ),
        Status::Reset => anyhow::anyhow!(
            "the connection to port {p} was reset while a {op} was outstanding: its queues \
             stopped making progress (a lost or corrupted message, or the other side stopped \
             reading them) or a store into its window failed; it reconnects by itself"
        ),
        Status::RemoteAccess => anyhow::anyhow!(
            "port {p} refused a {op} (unknown region key, missing permission or out of its \
             region): are both sides the same ntbdk version?"
        ),
        Status::LocalLength => anyhow::anyhow!(
            "a message from port {p} did not fit our receive buffer: are both sides the same \
             ntbdk version?"
        ),
        Status::TooLarge => anyhow::anyhow!(
            "port {p} had no room for a {op}: it serves as many operations for us as it takes, \
             our storage quota there is spent, or the range is scattered over more extents than \
             its queue to us holds now; retry, or use smaller operations (a range over more \
             than about 163 835 extents never fits)"
        ),
        Status::Protocol => anyhow::anyhow!(
            "port {p} answered a {op} with a malformed message ({:?}): are both sides the \
             same ntbdk version?",
            c.status
        ),
        Status::Success => anyhow::anyhow!("a {op} with port {p} succeeded"),
    }
}

/// A spawned peer leaves the signals that end a run to the process that
/// spawned it (which ends the run and tells the peer to stop): it ignores
/// SIGINT, SIGTERM and SIGHUP, so one Ctrl-C in a terminal, a `timeout`, a
/// `kill` of the process group or a closed terminal does not kill it
/// before its spawner is done with it. It still dies with its spawner
/// ([`die_with_parent`]).
pub fn leave_signals_to_parent() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: SIG_IGN only changes how the signal is delivered; no
        // handler code runs.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

/// Checks, before a run, that `path` (`flag`'s value) can be written, so a
/// typo does not cost the whole measurement. A file created by the check
/// is removed again.
pub fn check_writable(path: &std::path::Path, flag: &str) -> Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("{flag} {}: cannot write there", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use core_affinity::CoreId;

    #[test]
    fn each_shared_core_is_named_once_with_its_spinners() {
        let on = |name: &str, id| (name.to_string(), CoreId { id });
        assert!(shared_cores(&[on("the client", 0), on("server 1", 1)]).is_empty());
        let qp2 = [on("the client", 0), on("server 1", 1), on("server 2", 1)];
        assert_eq!(shared_cores(&qp2), vec![(1, vec!["server 1", "server 2"])]);
        let all = [on("a", 3), on("b", 2), on("c", 3), on("d", 2), on("e", 3)];
        assert_eq!(
            shared_cores(&all),
            vec![(3, vec!["a", "c", "e"]), (2, vec!["b", "d"])]
        );
    }
}
