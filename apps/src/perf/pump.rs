//! The bandwidth engine both sides run: bursts of work requests posted to
//! one or more peers, at most a window outstanding, one in `cq_mod`
//! signaled (perftest's completion moderation), completions polled in
//! bursts. The client runs it to measure; a server runs it too in a
//! bidirectional test (`-b`), towards the client, until told to stop.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::transport::{
    Completion, DirectWr, OpKind, Qp, RegionKey, RemoteAddr, SendWr, Sge, TransportError, WriteWr,
};

use super::endpoint::{EAGER_SIZE, Endpoint};
use super::{Budget, Op, WriteMode};
use crate::cli::session::{check_interrupted, completion_error};

/// Least completions over which the peak bandwidth is measured (at least
/// the tx depth: shorter stretches would time bursts of the queue, not the
/// link).
pub const PEAK_WINDOW: u64 = 256;

/// What a pump posts: `op` of `size` bytes, in bursts of `burst`, at most
/// `depth` outstanding, one in `cq_mod` signaled; writes as `write_mode`
/// says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// The operation.
    pub op: Op,
    /// How writes write.
    pub write_mode: WriteMode,
    /// Bytes per operation.
    pub size: u64,
    /// Work requests per post.
    pub burst: usize,
    /// Most outstanding.
    pub depth: usize,
    /// Completion moderation, as perftest's `--cq-mod`: of the requests to
    /// each target, every `cq_mod`-th is signaled (and a counted budget's
    /// last), and its completion accounts for those before it. Only sends
    /// and one-sided writes, which complete once posted, can go
    /// unsignaled (the transport must leave sends unsignaled unless asked:
    /// `Config::signal_sends` off); a timed run counts the unsignaled tail
    /// it stops with when it stops. Rendezvous writes and reads are always
    /// signaled (1). Clamped so that a signaled request always fits in the
    /// window: [`Load::moderation`].
    pub cq_mod: usize,
}

impl Load {
    /// Whether this load's requests can go unsignaled: sends and one-sided
    /// writes.
    pub fn moderable(&self) -> bool {
        self.op.moderable(self.write_mode)
    }

    /// The moderation used towards `targets` targets: 1 for what cannot go
    /// unsignaled, else `cq_mod` at most each target's share of the
    /// window (with `depth` outstanding over all targets, a target whose
    /// signaled request lay beyond its share would never complete).
    pub fn moderation(&self, targets: usize) -> u64 {
        if !self.moderable() {
            return 1;
        }
        let share = (self.depth / targets.max(1)).max(1);
        self.cq_mod.clamp(1, share) as u64
    }
}

/// The cookie of a pump's request: the target's index in the high 16 bits,
/// the request's number towards that target (from 1) below.
fn cookie(target: usize, seq: u64) -> u64 {
    (target as u64) << 48 | seq
}

/// The target index and request number in a [`cookie`].
fn from_cookie(cookie: u64) -> (usize, u64) {
    ((cookie >> 48) as usize, cookie & ((1 << 48) - 1))
}

/// A peer to post to: its queue pair and its data region.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The queue pair.
    pub qp: Qp,
    /// The peer's data region.
    pub key: RegionKey,
}

/// What a pump did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pumped {
    /// Operations completed.
    pub done: u64,
    /// From the first post to the last completion.
    pub elapsed: Duration,
    /// Peak message rate, millions per second, over any stretch of
    /// [`PEAK_WINDOW`] completions or more (the average when shorter).
    pub peak_mpps: f64,
    /// Completions taken for our requests: `done` over the moderation,
    /// about.
    pub completions: u64,
}

/// Posts bursts of `load` to `targets` in turn until `budget` is spent
/// (counting operations posted) or `stop` says so (asked every few turns),
/// then drains. Receives consumed meanwhile (a peer sending to us) are
/// posted again. Fails on an error completion, when nothing completes for
/// `timeout`, or on Ctrl-C.
pub fn pump(
    ep: &mut Endpoint,
    comps: &mut [Completion],
    targets: &[Target],
    load: Load,
    budget: Budget,
    timeout: Duration,
    mut stop: impl FnMut(&mut Endpoint) -> Result<bool>,
) -> Result<Pumped> {
    let Load {
        op,
        size,
        burst,
        depth,
        ..
    } = load;
    let start = Instant::now();
    let window = PEAK_WINDOW.max(depth as u64);
    let mut mark = (start, 0u64);
    let mut peak = 0f64;
    let local = [Sge {
        key: ep.data,
        offset: 0,
        len: size,
    }];
    let payload = vec![0x5au8; size.min(u64::from(EAGER_SIZE)) as usize];
    let direct = op == Op::Write && load.write_mode == WriteMode::Direct;
    let cq_mod = load.moderation(targets.len());
    let direct_src = if direct {
        vec![0x5au8; size as usize]
    } else {
        Vec::new()
    };
    // Every write goes to the start of its target's region.
    let start_of = |s: &Target| RemoteAddr {
        key: s.key,
        offset: 0,
    };
    let mut writes: Vec<Vec<WriteWr<'_>>> = Vec::new();
    let mut direct_writes: Vec<Vec<DirectWr<'_>>> = Vec::new();
    let mut sends: Vec<SendWr<'_>> = Vec::new();
    match op {
        Op::Write if direct => {
            for s in targets {
                let wr = DirectWr {
                    data: &direct_src,
                    remote: start_of(s),
                    imm: None,
                    signaled: true,
                    cookie: 0,
                };
                direct_writes.push(vec![wr; burst]);
            }
        }
        Op::Write => {
            for s in targets {
                let wr = WriteWr {
                    local: &local,
                    remote: start_of(s),
                    cookie: 0,
                };
                writes.push(vec![wr; burst]);
            }
        }
        Op::Send => {
            sends = vec![
                SendWr {
                    data: &payload,
                    cookie: 0,
                    signaled: true,
                };
                burst
            ]
        }
        Op::Read => {}
    }
    // Per target: requests posted, the last of them signaled, and how many
    // completions have accounted for (sends and one-sided writes complete
    // in the order posted, so a signaled one accounts for all before it).
    let mut seq = vec![0u64; targets.len()];
    // A counted budget is shared out between the targets in advance, so
    // that each target's last request is known (and signaled).
    let quota: Vec<u64> = match budget.iteration_limit() {
        Some(n) => {
            let t = targets.len() as u64;
            (0..t).map(|i| n / t + u64::from(i < n % t)).collect()
        }
        None => vec![u64::MAX; targets.len()],
    };
    let mut signaled_to = vec![0u64; targets.len()];
    let mut accounted = vec![0u64; targets.len()];
    let (mut posted, mut done, mut completions) = (0u64, 0u64, 0u64);
    let mut turn = 0usize;
    let mut empty = 0u32;
    let mut last_progress = Instant::now();
    let mut stopping = false;
    let mut tails_settled = false;
    let mut turn_clock = 0u32;
    loop {
        // The clock is read every 8th turn only: at millions of messages a
        // second it would cost as much as the posting.
        turn_clock = turn_clock.wrapping_add(1);
        // Ctrl-C is seen within a few turns even when every poll completes
        // something (one-sided writes do), not only on idle polls.
        if turn_clock.is_multiple_of(8) {
            check_interrupted()?;
        }
        if !stopping
            && (budget.remaining(posted) == Some(0)
                || (turn_clock.is_multiple_of(8) && budget.reached(posted, start.elapsed()))
                || (turn_clock.is_multiple_of(16) && stop(ep)?))
        {
            stopping = true;
        }
        if stopping && !tails_settled {
            // A timed run stops with each target's requests after its last
            // signaled one unsignaled. They completed when they were posted
            // (sends and one-sided writes are done once posted); no
            // completion will say so, so they are counted here.
            // (Those up to the last signaled one are its completion's to
            // count.)
            done += (0..targets.len())
                .map(|i| seq[i] - signaled_to[i])
                .sum::<u64>();
            tails_settled = true;
        }
        let outstanding = (posted - done) as usize;
        if !stopping && outstanding < depth {
            // The next target in turn with requests left to post (one has:
            // the budget is not spent).
            let mut i = turn % targets.len();
            while seq[i] >= quota[i] {
                turn += 1;
                i = turn % targets.len();
            }
            turn += 1;
            let left = quota[i] - seq[i];
            let k = burst.min(depth - outstanding).min(left as usize);
            // A target's last request is signaled.
            let last = left == k as u64;
            let s = &targets[i];
            let remote = start_of(s);
            let first = seq[i] + 1;
            let signal = |j: usize| {
                let n = first + j as u64;
                n.is_multiple_of(cq_mod) || (last && j + 1 == k)
            };
            let r = match op {
                Op::Write if direct => {
                    let wrs = &mut direct_writes[i][..k];
                    for (j, wr) in wrs.iter_mut().enumerate() {
                        wr.signaled = signal(j);
                        wr.cookie = cookie(i, first + j as u64);
                    }
                    ep.t.post_writes_direct(s.qp, wrs)
                }
                Op::Write => ep.t.post_writes(s.qp, &writes[i][..k]),
                Op::Send => {
                    for (j, wr) in sends[..k].iter_mut().enumerate() {
                        wr.signaled = signal(j);
                        wr.cookie = cookie(i, first + j as u64);
                    }
                    ep.t.post_sends(s.qp, &sends[..k])
                }
                Op::Read => post_each(k, || ep.t.post_read(s.qp, &local, remote, 0)),
            };
            match r {
                Ok(n) => {
                    posted += n as u64;
                    seq[i] += n as u64;
                    if let Some(j) = (0..n).rev().find(|&j| signal(j)) {
                        signaled_to[i] = first + j as u64;
                    }
                }
                Err(TransportError::Busy { .. } | TransportError::TooManyOutstanding { .. }) => {}
                // The peer's region not advertised to us yet.
                Err(TransportError::UnknownRemoteKey { .. })
                    if last_progress.elapsed() < timeout =>
                {
                    ep.t.progress();
                }
                Err(e) => return Err(post_failed(ep, s.qp.peer(), op, e)),
            }
        } else if stopping && outstanding == 0 {
            let elapsed = start.elapsed();
            // A run shorter than one window: its peak is its average (the
            // row keeps any peak at least at the average: `BwRow::with_peak`).
            if peak == 0.0 && done > 0 && elapsed > Duration::ZERO {
                peak = done as f64 / elapsed.as_secs_f64() / 1e6;
            }
            return Ok(Pumped {
                done,
                elapsed,
                peak_mpps: peak,
                completions,
            });
        }
        let n = ep.t.poll_completions(comps);
        if n > 0 {
            for c in &comps[..n] {
                if c.op == OpKind::Recv {
                    // A peer sending to us (bidirectional sends), or a
                    // receive flushed by a reset: post it again.
                    let qp = targets.iter().find(|t| t.qp.peer() == c.peer);
                    if let Some(t) = qp {
                        ep.repost(t.qp, c.cookie)?;
                    }
                    continue;
                }
                if !c.status.is_ok() {
                    return Err(completion_error(c));
                }
                match c.op {
                    OpKind::Send | OpKind::WriteDirect => {
                        let (i, n) = from_cookie(c.cookie);
                        if let Some(a) = accounted.get_mut(i)
                            && n > *a
                        {
                            done += n - *a;
                            *a = n;
                            completions += 1;
                        }
                    }
                    OpKind::Write | OpKind::Read => {
                        done += 1;
                        completions += 1;
                    }
                    _ => {}
                }
            }
            empty = 0;
            last_progress = Instant::now();
            if done - mark.1 >= window {
                let dt = last_progress.duration_since(mark.0).as_secs_f64();
                if dt > 0.0 {
                    peak = peak.max((done - mark.1) as f64 / dt / 1e6);
                }
                mark = (last_progress, done);
            }
        } else {
            empty += 1;
            if empty.is_multiple_of(1024) {
                check_interrupted()?;
                if posted > done && last_progress.elapsed() >= timeout {
                    bail!(
                        "no {op:?} completed within {timeout:?} ({} outstanding): \
                         is the other side still running?",
                        posted - done
                    );
                }
            }
        }
    }
}

/// Why posting to `peer` failed: when the peer left (its link down: it
/// exited, was stopped or killed, its grants revoked on the way) or the
/// connection was reset under us, that, and not the raw transport error.
/// Gives the transport up to 100 ms to notice.
fn post_failed(ep: &mut Endpoint, peer: u16, op: Op, e: TransportError) -> anyhow::Error {
    let until = Instant::now() + Duration::from_millis(100);
    let (link_up, connected) = loop {
        let link_up = ep.t.device().link(peer).is_ok_and(|l| l.up);
        let connected = ep.t.is_connected(peer);
        if !link_up || Instant::now() >= until {
            break (link_up, connected);
        }
        ep.t.progress();
    };
    // The connection's own advice (wait for the handshake) is for library
    // callers; here the peer or the connection is what went away.
    let why = match &e {
        TransportError::NotConnected { .. } => String::new(),
        e => format!(" ({e})"),
    };
    if !link_up {
        anyhow::anyhow!(
            "port {peer} left during the run (it exited, was stopped or was killed): \
             a {op:?} towards it failed{why}"
        )
    } else if !connected {
        anyhow::anyhow!(
            "the connection to port {peer} was reset during the run (a lost or corrupted \
             message; it reconnects by itself, but this run's operations are gone): a {op:?} \
             towards it failed{why}"
        )
    } else {
        anyhow::anyhow!("posting a {op:?} to port {peer}: {e}")
    }
}

/// Posts up to `k` operations with `post`, stopping at the first refusal:
/// how many were posted, or the refusal when none was.
fn post_each(
    k: usize,
    mut post: impl FnMut() -> std::result::Result<(), TransportError>,
) -> std::result::Result<usize, TransportError> {
    for n in 0..k {
        if let Err(e) = post() {
            return if n > 0 { Ok(n) } else { Err(e) };
        }
    }
    Ok(k)
}
