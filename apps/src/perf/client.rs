//! The measuring side of `ntb-perf`: bandwidth (a window of outstanding
//! work requests posted in bursts, completions polled in bursts) and latency
//! (one operation at a time, into an HDR histogram of nanoseconds).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::hw::{NtbDevice, Port};
use ntbdk_pmd::transport::{
    Completion, OpKind, Qp, QpCounters, RegionKey, RemoteAddr, Sge, TransportError,
};

use super::control::{BidirLoad, BidirResult, ClientControl, Command, Phase};
use super::endpoint::{EAGER_SIZE, Endpoint};
use super::pump::{Load, Pumped, Target, pump};
use super::{Op, WriteMode, budget::Budget};
use crate::cli::session::{check_interrupted, completion_error};
use crate::report::{BwRow, LatRow, new_histogram};

/// Completions polled per call.
const POLL_BURST: usize = 64;
/// How long no message from the servers ends a bidirectional phase's
/// drain (`Client::drain_recvs`): long enough for a server descheduled on
/// a loaded machine to deliver what its backlog held.
const BIDIR_QUIET: Duration = Duration::from_millis(100);

/// One server as the client sees it.
struct Server {
    qp: Qp,
    key: RegionKey,
    len: u64,
    ctl: ClientControl,
}

/// The client: our endpoint and the servers it measures against.
///
/// # Example
/// A server on a thread and a client, on a private fabric in a temporary
/// directory:
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ntbdk_apps::perf::{Budget, Client, Endpoint, Op, control::ServerControl,
///     fabric_config, serve};
/// use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric};
///
/// let dir = std::env::temp_dir().join(format!("ntbdk-doc-client-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let fabric = EmuFabric::create_in(&dir, "doc", &fabric_config(2)).unwrap();
/// let device = |slot| {
///     let cfg = DeviceConfig {
///         slot: Some(slot),
///         fabric: fabric.config().clone(),
///         dir: Some(dir.clone()),
///         ..DeviceConfig::default()
///     };
///     Arc::new(EmuDevice::join(&fabric, &cfg).unwrap())
/// };
/// let timeout = Duration::from_secs(10);
/// let (server_dev, client_dev) = (device(1), device(0));
/// let server = std::thread::spawn(move || {
///     let mut ctl = ServerControl::new(server_dev.clone()).unwrap();
///     let mut ep = Endpoint::new(server_dev, timeout).unwrap();
///     serve(&mut ep, &mut ctl, 0, timeout).unwrap()
/// });
/// let ep = Endpoint::new(client_dev, timeout).unwrap();
/// let mut client = Client::connect(ep, &[1], timeout).unwrap();
/// let bw = client.bandwidth(Op::Write, 4096, 8, 32, Budget::iterations(100)).unwrap();
/// assert_eq!((bw.bytes, bw.iterations), (4096, 100));
/// let lat = client.latency(Op::Send, 64, 10, Budget::iterations(100)).unwrap();
/// assert_eq!(lat.iterations, 100);
/// client.stop().unwrap();
/// assert!(server.join().unwrap().echoes >= 100); // and the warm-up's
/// drop(client);
/// EmuFabric::destroy_in(&dir, "doc").unwrap();
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub struct Client {
    ep: Endpoint,
    servers: Vec<Server>,
    timeout: Duration,
    comps: Vec<Completion>,
    write_mode: WriteMode,
    cq_mod: usize,
}

impl Client {
    /// Connects to `ports` (servers), exchanges region keys through the
    /// control channel and posts receives. Every wait ends after `timeout`.
    pub fn connect(mut ep: Endpoint, ports: &[Port], timeout: Duration) -> Result<Self> {
        let dev: Arc<dyn NtbDevice> = ep.t.device().clone();
        let mut servers = Vec::new();
        for (i, &p) in ports.iter().enumerate() {
            let qp = ep.t.create_qp(p)?;
            ep.wait_connected(p, timeout, "is it an ntb-perf --server, and still running?")?;
            ep.post_recvs(qp)?;
            let mut ctl = ClientControl::new(dev.clone(), p, i)?;
            let t = &mut ep.t;
            ctl.await_server(timeout, || {
                t.progress();
                check_interrupted()
            })?;
            let key = ctl.call(
                Command::Hello {
                    client_key: ep.data.0,
                },
                timeout,
                || {
                    t.progress();
                    check_interrupted()
                },
            )?;
            let len = u64::from(ctl.call(Command::RegionLen, timeout, || {
                t.progress();
                check_interrupted()
            })?);
            servers.push(Server {
                qp,
                key: RegionKey(key),
                len,
                ctl,
            });
        }
        Ok(Self {
            ep,
            servers,
            timeout,
            comps: vec![Completion::default(); POLL_BURST],
            write_mode: WriteMode::default(),
            cq_mod: 1,
        })
    }

    /// How `Op::Write` writes from now on (default: [`WriteMode::Direct`]).
    pub fn set_write_mode(&mut self, mode: WriteMode) {
        self.write_mode = mode;
    }

    /// How `Op::Write` writes.
    pub fn write_mode(&self) -> WriteMode {
        self.write_mode
    }

    /// Completion moderation of bandwidth tests from now on, as perftest's
    /// `--cq-mod` (default 1: every request signaled): one request in
    /// `cq_mod` is signaled, and each queue pair's last. Applies to sends
    /// and one-sided writes, and to what the servers post in a
    /// bidirectional test.
    pub fn set_cq_mod(&mut self, cq_mod: usize) {
        self.cq_mod = cq_mod.max(1);
    }

    /// The endpoint (counters, transport).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The servers' ports.
    pub fn server_ports(&self) -> Vec<Port> {
        self.servers.iter().map(|s| s.qp.peer()).collect()
    }

    /// Counters of the queue pair to each server.
    pub fn counters(&self) -> Vec<(Port, QpCounters)> {
        self.servers
            .iter()
            .map(|s| (s.qp.peer(), self.ep.t.counters(s.qp)))
            .collect()
    }

    /// The largest message `op` can move here.
    pub fn max_size(&self, op: Op) -> u64 {
        let region = self
            .servers
            .iter()
            .map(|s| s.len)
            .fold(self.ep.data_len, u64::min);
        match op {
            Op::Send => u64::from(EAGER_SIZE).min(region),
            Op::Write | Op::Read => region,
        }
    }

    /// Tells every server (or the first only) what to do next.
    fn phase(&mut self, phase: Phase, first_only: bool) -> Result<()> {
        let n = if first_only { 1 } else { self.servers.len() };
        let timeout = self.timeout;
        for s in &mut self.servers[..n] {
            let t = &mut self.ep.t;
            s.ctl.call(Command::Phase(phase), timeout, || {
                t.progress();
                check_interrupted()
            })?;
        }
        Ok(())
    }

    /// Ends the servers' bidirectional phase: the command ends a timed
    /// one; a counted one answers once its count is done, so meanwhile we
    /// keep taking what the servers send (receives reposted).
    fn end_bidir(&mut self, ours_took: Duration) -> Result<()> {
        let timeout = self.timeout + ours_took;
        let qps: Vec<Qp> = self.servers.iter().map(|s| s.qp).collect();
        let Self {
            ep, comps, servers, ..
        } = self;
        for s in servers.iter_mut() {
            // The server's count is what we wait for: while what it sends
            // or asks of us moves, it is working, however long that takes.
            let qp = s.qp;
            let moved = |ep: &Endpoint| {
                let c = ep.t.counters(qp);
                c.recvs + c.served + c.bytes_in
            };
            let mut seen = moved(ep);
            s.ctl
                .call_while_busy(Command::Phase(Phase::Passive), timeout, || {
                    let n = ep.t.poll_completions(comps);
                    for c in &comps[..n] {
                        check(c)?;
                        if c.op == OpKind::Recv
                            && let Some(&qp) = qps.iter().find(|q| q.peer() == c.peer)
                        {
                            ep.repost(qp, c.cookie)?;
                        }
                    }
                    check_interrupted()?;
                    let now = moved(ep);
                    let progressed = now != seen;
                    seen = now;
                    Ok(progressed)
                })?;
        }
        Ok(())
    }

    /// Takes the servers' last sends of a bidirectional phase, which may
    /// still wait in our rings (or in a server's backlog) when they answer
    /// (a send completes at its post), so that a test after this one (a
    /// send latency) does not take them for its echoes: until none came
    /// for [`BIDIR_QUIET`], or the timeout.
    fn drain_recvs(&mut self) -> Result<()> {
        let qps: Vec<Qp> = self.servers.iter().map(|s| s.qp).collect();
        let start = Instant::now();
        let mut quiet_since = start;
        while quiet_since.elapsed() < BIDIR_QUIET && start.elapsed() < self.timeout {
            let n = self.ep.t.poll_completions(&mut self.comps);
            for c in &self.comps[..n] {
                check(c)?;
                if c.op == OpKind::Recv
                    && let Some(&qp) = qps.iter().find(|q| q.peer() == c.peer)
                {
                    self.ep.repost(qp, c.cookie)?;
                    quiet_since = Instant::now();
                }
            }
            check_interrupted()?;
        }
        Ok(())
    }

    /// Ends the session after Ctrl-C: tells every server to stop (so it
    /// exits cleanly, not "the client left"), giving each at most
    /// `timeout`, ignoring the interrupt and any failure (a server that was
    /// interrupted too is gone already).
    pub fn stop_after_interrupt(&mut self, timeout: Duration) {
        for s in &mut self.servers {
            let t = &mut self.ep.t;
            let _ = s.ctl.call(Command::Stop, timeout, || {
                t.progress();
                Ok(())
            });
        }
    }

    /// Ends the session with every server.
    pub fn stop(&mut self) -> Result<()> {
        let timeout = self.timeout;
        for s in &mut self.servers {
            let t = &mut self.ep.t;
            s.ctl.call(Command::Stop, timeout, || {
                t.progress();
                check_interrupted()
            })?;
        }
        Ok(())
    }

    /// Bandwidth of `op` with messages of `size`: bursts of `burst` work
    /// requests, at most `depth` outstanding, spread over the servers in
    /// turn, for `budget` after `depth` untimed warm-up operations.
    pub fn bandwidth(
        &mut self,
        op: Op,
        size: u64,
        burst: usize,
        depth: usize,
        budget: Budget,
    ) -> Result<BwRow> {
        self.check_size(op, size)?;
        self.phase(Phase::Passive, false)?;
        let warm = Budget::iterations(depth as u64);
        self.pump(op, size, burst, depth, warm)?;
        self.bandwidth_continued(op, size, burst, depth, budget)
    }

    /// Another bandwidth measurement right after [`bandwidth`](Self::bandwidth)
    /// with the same `op` and `size`: no phase change and no warm-up, so
    /// back-to-back intervals (`--run_infinitely`) lose no time between
    /// them.
    pub fn bandwidth_continued(
        &mut self,
        op: Op,
        size: u64,
        burst: usize,
        depth: usize,
        budget: Budget,
    ) -> Result<BwRow> {
        self.check_size(op, size)?;
        let p = self.pump(op, size, burst, depth, budget)?;
        let peak = p.peak_mpps * 1e6 * size as f64 / 1e9;
        Ok(BwRow::new(size, p.done, p.elapsed).with_peak(peak))
    }

    /// Bidirectional bandwidth (`-b`): every server posts the same load
    /// towards us while we measure as [`bandwidth`](Self::bandwidth) does.
    /// Returns our direction and the servers' (their operations over the
    /// time each timed itself, from its first post to its last completion,
    /// summed over servers).
    pub fn bandwidth_bidir(
        &mut self,
        op: Op,
        size: u64,
        burst: usize,
        depth: usize,
        budget: Budget,
    ) -> Result<(BwRow, BwRow)> {
        self.check_size(op, size)?;
        let load = BidirLoad {
            op,
            write_mode: self.write_mode,
            burst: burst as u32,
            depth: depth as u32,
        };
        self.command_all(Command::BidirCqMod {
            cq_mod: self.cq_mod as u32,
        })?;
        self.command_all(Command::BidirLoad(load))?;
        // A counted run: the servers post -n between them, as we do
        // (u32: -n is at most 10^9); a share may be 0.
        let servers = self.servers.len() as u64;
        for i in 0..self.servers.len() {
            let iters = budget
                .iteration_limit()
                .map(|n| (n / servers + u64::from((i as u64) < n % servers)) as u32);
            self.call(i, Command::BidirIters { iters })?;
        }
        self.phase(Phase::Bidir { size: size as u32 }, false)?;
        let warm = Budget::iterations(depth as u64);
        self.pump(op, size, burst, depth, warm)?;
        let ours = self.bandwidth_continued(op, size, burst, depth, budget)?;
        // The servers started their count when we started ours: allow them
        // as long again as our own run took, on top of the timeout (their
        // one-sided writes show us no progress).
        self.end_bidir(Duration::from_secs_f64(ours.seconds))?;
        let mut theirs = BwRow::new(size, 0, Duration::ZERO);
        for i in 0..self.servers.len() {
            let mut w = [0u32; 4];
            for (k, word) in w.iter_mut().enumerate() {
                *word = self.call(i, Command::BidirResult { word: k as u32 })?;
            }
            let r = BidirResult::from_words(w);
            let row = BwRow::new(size, r.done, Duration::from_micros(u64::from(r.micros)))
                .with_peak(f64::from(r.peak_mpps) * 1e6 * size as f64 / 1e9);
            theirs = theirs.plus(&row);
        }
        self.drain_recvs()?;
        Ok((ours, theirs))
    }

    /// Sends `cmd` to every server.
    fn command_all(&mut self, cmd: Command) -> Result<()> {
        for i in 0..self.servers.len() {
            self.call(i, cmd)?;
        }
        Ok(())
    }

    /// Sends `cmd` to server `i` and returns its answer.
    fn call(&mut self, i: usize, cmd: Command) -> Result<u32> {
        let timeout = self.timeout;
        let t = &mut self.ep.t;
        self.servers[i].ctl.call(cmd, timeout, || {
            t.progress();
            check_interrupted()
        })
    }

    fn check_size(&self, op: Op, size: u64) -> Result<()> {
        let max = self.max_size(op);
        if size == 0 || size > max {
            bail!(
                "{op:?} of {size} bytes: at most {max} bytes here{}",
                if op == Op::Send {
                    " (a send carries one eager buffer; use --op write for larger messages)"
                } else {
                    ""
                }
            );
        }
        Ok(())
    }

    /// Runs the [`pump`](super::pump::pump) of `op` to every server.
    fn pump(
        &mut self,
        op: Op,
        size: u64,
        burst: usize,
        depth: usize,
        budget: Budget,
    ) -> Result<Pumped> {
        let load = Load {
            op,
            write_mode: self.write_mode,
            size,
            burst,
            depth,
            cq_mod: self.cq_mod,
        };
        let targets: Vec<Target> = self
            .servers
            .iter()
            .map(|s| Target {
                qp: s.qp,
                key: s.key,
            })
            .collect();
        pump(
            &mut self.ep,
            &mut self.comps,
            &targets,
            load,
            budget,
            self.timeout,
            |_| Ok(false),
        )
    }

    /// Latency of `op` with messages of `size`, one operation at a time
    /// with the first server: `warmup` untimed, then samples until `budget`.
    /// Sends and writes are ping-pongs (the server answers in kind) and
    /// record half the round trip; reads record the whole round trip.
    pub fn latency(&mut self, op: Op, size: u64, warmup: u64, budget: Budget) -> Result<LatRow> {
        self.latency_samples(op, size, warmup, budget, None)
    }

    /// [`latency`](Self::latency), also appending every sample (in
    /// nanoseconds, in the order measured) to `samples` when given: what
    /// perftest's `-H`/`-U` print. At most [`MAX_KEPT_SAMPLES`] are kept (a
    /// long `-D` run would otherwise grow them without bound); the row
    /// still summarises every sample.
    pub fn latency_samples(
        &mut self,
        op: Op,
        size: u64,
        warmup: u64,
        budget: Budget,
        mut samples: Option<&mut Vec<u64>>,
    ) -> Result<LatRow> {
        self.check_size(op, size)?;
        let direct = op == Op::Write && self.write_mode == WriteMode::Direct;
        let phase = match op {
            Op::Send => Phase::SendEcho,
            Op::Write if direct => Phase::WriteDirectEcho { size: size as u32 },
            Op::Write => Phase::WriteEcho { size: size as u32 },
            Op::Read => Phase::Passive,
        };
        // The one-sided ping-pong: the server's answer lands in our region;
        // its last byte says which answer it is (never 0, which we start from).
        let view = self.ep.t.region_view(self.ep.data)?;
        let mut direct_src = Vec::new();
        if direct {
            self.ep.t.region_write(self.ep.data, size - 1, &[0])?;
            direct_src = vec![0xa5u8; size as usize];
        }
        self.phase(phase, true)?;
        let mut hist = new_histogram();
        let payload = vec![0xa5u8; size.min(u64::from(EAGER_SIZE)) as usize];
        let local = [Sge {
            key: self.ep.data,
            offset: 0,
            len: size,
        }];
        let s = &self.servers[0];
        let (qp, remote) = (
            s.qp,
            RemoteAddr {
                key: s.key,
                offset: 0,
            },
        );
        let mut served = self.ep.t.counters(qp).served;
        let warm_end = Instant::now() + Duration::from_millis(50);
        let mut i = 0u64;
        // A timed run's clock starts when the warm-up ends: the warm-up
        // does not eat the budget (a short -D would otherwise measure
        // nothing).
        let mut t_start = None;
        let mut interrupted = false;
        loop {
            let warming = i < warmup && Instant::now() < warm_end;
            if !warming {
                let since = t_start.get_or_insert_with(Instant::now).elapsed();
                if budget.reached(hist.len(), since) {
                    break;
                }
            }
            // Ctrl-C ends the size with the samples taken (one relaxed load
            // a round trip: a round trip on quiet cores may never wait long
            // enough for the waits' own checks); a size complete already
            // is not marked.
            if !hist.is_empty() && crate::cli::session::interrupted() {
                interrupted = true;
                break;
            }
            let t0 = Instant::now();
            // One round trip; `self`, the one-sided source and the served
            // count passed in, so an error can be looked at before it ends
            // the size.
            let round_trip = |this: &mut Self, served: &mut u64, direct_src: &mut [u8]| match op {
                Op::Send => {
                    this.post_retry(|t| t.post_send(qp, &payload, i))?;
                    this.wait(op, |c, _| c.op == OpKind::Recv, |_| true)
                }
                Op::Write if direct => {
                    let v = (i % 255 + 1) as u8;
                    direct_src[size as usize - 1] = v;
                    let src = &*direct_src;
                    this.post_retry(|t| t.post_write_direct(qp, src, remote, None, i))?;
                    this.wait(
                        op,
                        |c, _| c.op == OpKind::WriteDirect,
                        |_| view.load_u8(size - 1) == Some(v),
                    )
                }
                Op::Write => {
                    this.post_retry(|t| t.post_write(qp, &local, remote, i))?;
                    let want = *served + 1;
                    this.wait(
                        op,
                        |c, _| c.op == OpKind::Write,
                        |ep| ep.t.counters(qp).served >= want,
                    )?;
                    *served = want;
                    Ok(())
                }
                Op::Read => {
                    this.post_retry(|t| t.post_read(qp, &local, remote, i))?;
                    this.wait(op, |c, _| c.op == OpKind::Read, |_| true)
                }
            };
            if let Err(e) = round_trip(self, &mut served, &mut direct_src) {
                // Ctrl-C during a size: the samples taken are its row (the
                // caller prints and saves it, then ends the run).
                if crate::cli::is_interrupted(&e) && !hist.is_empty() {
                    interrupted = true;
                    break;
                }
                return Err(e);
            }
            let ns = t0.elapsed().as_nanos() as u64;
            if !warming {
                let sample = if op == Op::Read { ns } else { ns / 2 };
                hist.saturating_record(sample.max(1));
                if let Some(v) = samples.as_deref_mut() {
                    keep_sample(v, sample);
                }
            }
            i += 1;
        }
        Ok(LatRow {
            interrupted,
            ..LatRow::from_histogram(size, &hist)
        })
    }

    /// Posts with `post`, polling while the transport is out of room.
    fn post_retry(
        &mut self,
        mut post: impl FnMut(
            &mut ntbdk_pmd::transport::Transport,
        ) -> std::result::Result<(), TransportError>,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            match post(&mut self.ep.t) {
                Ok(()) => return Ok(()),
                Err(
                    TransportError::Busy { .. }
                    | TransportError::TooManyOutstanding { .. }
                    // The server's region not advertised to us yet.
                    | TransportError::UnknownRemoteKey { .. },
                ) => {
                    let n = self.ep.t.poll_completions(&mut self.comps);
                    for c in &self.comps[..n] {
                        check(c)?;
                        if c.op == OpKind::Recv {
                            self.ep.repost(self.servers[0].qp, c.cookie)?;
                        }
                    }
                    if start.elapsed() >= self.timeout {
                        bail!(
                            "no room to post for {:?}: is the server still running?",
                            self.timeout
                        );
                    }
                    check_interrupted()?;
                }
                Err(e) => bail!("posting: {e}"),
            }
        }
    }

    /// Polls until a completion matching `want` arrived and `also` holds;
    /// reposts the receives it consumes. Fails after the timeout.
    fn wait(
        &mut self,
        op: Op,
        mut want: impl FnMut(&Completion, &Endpoint) -> bool,
        mut also: impl FnMut(&Endpoint) -> bool,
    ) -> Result<()> {
        let mut got = false;
        let mut polls = 0u32;
        let mut start: Option<Instant> = None;
        loop {
            let n = self.ep.t.poll_completions(&mut self.comps);
            for c in &self.comps[..n] {
                check(c)?;
                if want(c, &self.ep) {
                    got = true;
                }
                if c.op == OpKind::Recv {
                    // Reposted for the server it came from.
                    let qp = self
                        .servers
                        .iter()
                        .map(|s| s.qp)
                        .find(|q| q.peer() == c.peer)
                        .unwrap_or(self.servers[0].qp);
                    self.ep.repost(qp, c.cookie)?;
                }
            }
            if got && also(&self.ep) {
                return Ok(());
            }
            polls += 1;
            if polls.is_multiple_of(1024) {
                let s = *start.get_or_insert_with(Instant::now);
                check_interrupted()?;
                if s.elapsed() >= self.timeout {
                    bail!(
                        "no answer to a {op:?} from port {} within {:?}: is the server still running?",
                        self.servers[0].qp.peer(),
                        self.timeout
                    );
                }
            }
        }
    }
}

/// Fails on a completion with an error status.
fn check(c: &Completion) -> Result<()> {
    if !c.status.is_ok() {
        return Err(completion_error(c));
    }
    Ok(())
}

/// Most latency samples [`Client::latency_samples`] keeps for `-H`/`-U`:
/// 2^24, 128 MiB (about 5 s of round trips at 300 ns).
pub const MAX_KEPT_SAMPLES: usize = 1 << 24;

/// Appends `sample` to `kept` unless it holds [`MAX_KEPT_SAMPLES`].
fn keep_sample(kept: &mut Vec<u64>, sample: u64) {
    if kept.len() < MAX_KEPT_SAMPLES {
        kept.push(sample);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::control::ServerControl;

    #[test]
    fn samples_kept_stop_at_the_bound() {
        let mut kept = vec![7; MAX_KEPT_SAMPLES - 1];
        keep_sample(&mut kept, 1);
        keep_sample(&mut kept, 2);
        assert_eq!(kept.len(), MAX_KEPT_SAMPLES);
        assert_eq!(kept.last(), Some(&1), "the first ones are kept");
    }
    use crate::perf::{fabric_config, serve};
    use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric};

    /// The pump's own bookkeeping, on a private fabric with a server on a
    /// thread: how many completions a load takes, and that every request
    /// is counted once.
    #[test]
    fn moderation_takes_one_completion_in_cq_mod_and_counts_every_request() {
        let dir = std::env::temp_dir().join(format!("ntbdk-cqmod-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fabric = EmuFabric::create_in(&dir, "cqmod", &fabric_config(2)).unwrap();
        let device = |slot| {
            let cfg = DeviceConfig {
                slot: Some(slot),
                fabric: fabric.config().clone(),
                dir: Some(dir.clone()),
                ..DeviceConfig::default()
            };
            Arc::new(EmuDevice::join(&fabric, &cfg).unwrap())
        };
        let timeout = Duration::from_secs(10);
        let (server_dev, client_dev) = (device(1), device(0));
        let server = std::thread::spawn(move || {
            let mut ctl = ServerControl::new(server_dev.clone()).unwrap();
            let mut ep = Endpoint::new(server_dev, timeout).unwrap();
            serve(&mut ep, &mut ctl, 0, timeout).unwrap()
        });
        let ep = Endpoint::new(client_dev, timeout).unwrap();
        let mut client = Client::connect(ep, &[1], timeout).unwrap();
        // (operation, write mode, burst, cq_mod, iterations, completions):
        // every cq_mod-th request and the last are signaled.
        for (op, mode, burst, cq_mod, iters, completions) in [
            (Op::Send, WriteMode::Direct, 1, 100, 1000, 10),
            (Op::Send, WriteMode::Direct, 1, 1, 300, 300),
            (Op::Send, WriteMode::Direct, 32, 32, 1000, 32),
            (Op::Write, WriteMode::Direct, 1, 7, 999, 143),
            (Op::Write, WriteMode::Direct, 8, 100, 1000, 10),
            // Always signaled, whatever is asked.
            (Op::Write, WriteMode::Rendezvous, 1, 100, 200, 200),
            (Op::Read, WriteMode::Direct, 4, 100, 200, 200),
        ] {
            client.set_write_mode(mode);
            client.set_cq_mod(cq_mod);
            let p = client
                .pump(op, 64, burst, 128, Budget::iterations(iters))
                .unwrap();
            assert_eq!(
                (p.done, p.completions),
                (iters, completions),
                "{op:?} {mode:?} burst {burst} cq_mod {cq_mod}"
            );
        }
        // A timed run stops with an unsignaled tail: counted, and the run
        // ends (nothing waits for a completion that will not come).
        for op in [Op::Send, Op::Write] {
            client.set_write_mode(WriteMode::Direct);
            client.set_cq_mod(100);
            let p = client
                .pump(op, 64, 1, 128, Budget::duration(Duration::from_millis(30)))
                .unwrap();
            assert!(p.done > 0, "{op:?}");
            assert!(p.completions <= p.done / 100 + 1, "{op:?}: {p:?}");
        }
        client.stop().unwrap();
        server.join().unwrap();
        drop(client);
        EmuFabric::destroy_in(&dir, "cqmod").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
