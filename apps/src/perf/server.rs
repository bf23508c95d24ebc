//! The serving side of `ntb-perf`: keeps the transport progressing (so
//! writes land and reads are served), keeps receives posted, answers the
//! client's commands and, in latency phases, echoes.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::hw::Port;
use ntbdk_pmd::transport::{
    Completion, OpKind, PeerState, RegionKey, RemoteAddr, Sge, TransportError,
};

use super::control::{BidirLoad, BidirResult, Command, Phase, REFUSED, Received, ServerControl};
use super::endpoint::{EAGER_SIZE, Endpoint};
use super::pump::{Load, Target, pump};
use super::{Budget, Op};
use crate::cli::session::{check_interrupted, completion_error};

/// What a server did, for its closing line.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeStats {
    /// Commands answered.
    pub commands: u64,
    /// Messages received.
    pub recvs: u64,
    /// Echoes sent (sends or writes).
    pub echoes: u64,
}

/// Serves `client` until it says stop. Fails when the client leaves
/// without stopping (its link goes down), a post finds no room for
/// `timeout`, or on Ctrl-C.
pub fn serve(
    ep: &mut Endpoint,
    ctl: &mut ServerControl,
    client: Port,
    timeout: Duration,
) -> Result<ServeStats> {
    let qp = ep.t.create_qp(client)?;
    ep.wait_connected(client, timeout, "is it an ntb-perf client?")?;
    ep.post_recvs(qp)?;
    let mut stats = ServeStats::default();
    let mut comps = vec![Completion::default(); 64];
    let mut phase = Phase::Passive;
    let mut client_key: Option<RegionKey> = None;
    let mut echo = vec![0u8; EAGER_SIZE as usize];
    let mut served = ep.t.counters(qp).served;
    let mut owed = 0u64;
    // The one-sided echo: our region as the client writes it, the value we
    // wait for next, and the bytes we answer with.
    let view = ep.t.region_view(ep.data)?;
    let mut next = 1u8;
    let mut direct_echo: Vec<u8> = Vec::new();
    // The bidirectional phase: what to post, what was done, and the command
    // that ended it.
    let mut bidir_load: Option<BidirLoad> = None;
    // One request in this many signaled in a bidirectional phase (a client
    // that does not say signals every one).
    let mut bidir_cq_mod = 1usize;
    // A counted bidirectional phase's operations (`None`: until the
    // client's next command).
    let mut bidir_iters: Option<u32> = None;
    let mut bidir_result = BidirResult::default();
    let mut pending: Option<Received> = None;
    let mut polls = 0u32;
    loop {
        let n = ep.t.poll_completions(&mut comps);
        for c in &comps[..n] {
            match c.op {
                OpKind::Recv if c.status.is_ok() => {
                    stats.recvs += 1;
                    if phase == Phase::SendEcho {
                        let len = c.bytes as usize;
                        ep.read_recv(c.cookie, &mut echo[..len])?;
                        post_retry(ep, timeout, |t| t.post_send(qp, &echo[..len], 0))?;
                        stats.echoes += 1;
                    }
                    ep.repost(qp, c.cookie)?;
                }
                OpKind::Recv => {
                    // Flushed by a reset (the connection is gone) or too long.
                    ep.repost(qp, c.cookie)?;
                }
                _ if !c.status.is_ok() => {
                    return Err(completion_error(c));
                }
                _ => {}
            }
        }
        if let (Phase::WriteEcho { size }, Some(key)) = (phase, client_key) {
            let now = ep.t.counters(qp).served;
            owed += now - served;
            served = now;
            while owed > 0 {
                let local = [Sge {
                    key: ep.data,
                    offset: 0,
                    len: u64::from(size),
                }];
                let remote = RemoteAddr { key, offset: 0 };
                post_retry(ep, timeout, |t| t.post_write(qp, &local, remote, 0))?;
                owed -= 1;
                stats.echoes += 1;
            }
        }
        if let (Phase::WriteDirectEcho { size }, Some(key)) = (phase, client_key) {
            let last = u64::from(size) - 1;
            if view.load_u8(last) == Some(next) {
                direct_echo[last as usize] = next;
                let remote = RemoteAddr { key, offset: 0 };
                post_retry(ep, timeout, |t| {
                    t.post_write_direct(qp, &direct_echo, remote, None, 0)
                })?;
                next = next % 255 + 1;
                stats.echoes += 1;
            }
        }
        polls = polls.wrapping_add(1);
        // A command that ended a bidirectional phase is answered first.
        let rx = match pending.take() {
            Some(rx) => Some(rx),
            None if polls.is_multiple_of(16) => ctl.poll(),
            None => None,
        };
        if let Some(rx) = rx {
            stats.commands += 1;
            let answer = match rx.cmd {
                Some(Command::Hello { client_key: k }) => {
                    client_key = Some(RegionKey(k));
                    ep.data.0
                }
                Some(Command::RegionLen) => ep.data_len as u32,
                Some(Command::Phase(p)) => {
                    let ok = match p {
                        Phase::WriteEcho { size } | Phase::WriteDirectEcho { size } => {
                            client_key.is_some() && u64::from(size) <= ep.data_len && size > 0
                        }
                        Phase::Bidir { size } => {
                            client_key.is_some()
                                && size > 0
                                && u64::from(size) <= ep.data_len
                                && bidir_load
                                    .is_some_and(|l| l.op != Op::Send || size <= EAGER_SIZE)
                        }
                        _ => true,
                    };
                    if ok && let Phase::WriteDirectEcho { size } = p {
                        // The sequence starts again from a zero last byte.
                        ep.t.region_write(ep.data, u64::from(size) - 1, &[0])?;
                        next = 1;
                        direct_echo = vec![0x5a; size as usize];
                    }
                    if ok {
                        phase = p;
                        served = ep.t.counters(qp).served;
                        owed = 0;
                        0
                    } else {
                        REFUSED
                    }
                }
                Some(Command::Stop) => {
                    ctl.reply(client, &rx, 0)?;
                    return Ok(stats);
                }
                Some(Command::BidirLoad(l)) => {
                    bidir_load = Some(l);
                    0
                }
                Some(Command::BidirCqMod { cq_mod }) => {
                    bidir_cq_mod = cq_mod.max(1) as usize;
                    0
                }
                Some(Command::BidirIters { iters }) => {
                    bidir_iters = iters;
                    0
                }
                Some(Command::BidirResult { word }) => bidir_result.word(word).unwrap_or(REFUSED),
                None => REFUSED,
            };
            ctl.reply(client, &rx, answer)?;
            if bidir_iters == Some(0) {
                // Nothing to post (a share of 0 when -n is below -q).
                if let Phase::Bidir { .. } = phase {
                    bidir_result = BidirResult::default();
                    phase = Phase::Passive;
                }
            } else if let (Phase::Bidir { size }, Some(l), Some(key)) =
                (phase, bidir_load, client_key)
            {
                // Towards the client until its next command, which is kept
                // to be answered next.
                let load = Load {
                    op: l.op,
                    write_mode: l.write_mode,
                    size: u64::from(size),
                    burst: l.burst as usize,
                    depth: l.depth as usize,
                    cq_mod: bidir_cq_mod,
                };
                // A count runs to its end (the client's `Phase(Passive)`
                // waits for it), unless the client asks anything else (a
                // `Stop` after Ctrl-C); otherwise its next command ends
                // the phase.
                let budget = match bidir_iters {
                    Some(n) => Budget::iterations(u64::from(n)),
                    None => Budget::until_stopped(),
                };
                let counted = bidir_iters.is_some();
                let passive = Some(Command::Phase(Phase::Passive));
                let p = pump(
                    ep,
                    &mut comps,
                    &[Target { qp, key }],
                    load,
                    budget,
                    timeout,
                    |_| {
                        // A newer command replaces a pending `Phase(Passive)`
                        // (the client gave up waiting for the count: a
                        // `Stop` after Ctrl-C) and ends the count.
                        if pending.is_none_or(|p| p.cmd == passive)
                            && let Some(newer) = ctl.poll()
                        {
                            pending = Some(newer);
                        }
                        Ok(pending.is_some_and(|p| !counted || p.cmd != passive))
                    },
                )?;
                bidir_result = BidirResult {
                    done: p.done,
                    micros: u32::try_from(p.elapsed.as_micros()).unwrap_or(u32::MAX),
                    peak_mpps: p.peak_mpps as f32,
                };
                phase = Phase::Passive;
                served = ep.t.counters(qp).served;
            }
        }
        if stats.commands == 0 && polls.is_multiple_of(1024) {
            ctl.check_peer_role(client)?;
        }
        // No silence timeout while the client is connected: its one-sided
        // writes are invisible here, so a quiet session may be a busy one.
        // A client that died or left is seen by its link (the fabric's
        // dead-peer detection). Looked at every 4096 polls, busy or not: a
        // client that keeps the server busy (a send bandwidth run) must not
        // hold Ctrl-C off.
        if polls.is_multiple_of(4096) {
            check_interrupted()?;
            if ep.t.peer_state(client) != PeerState::Connected {
                bail!("the client on port {client} left before the end of the run");
            }
        }
    }
}

/// Posts with `post`, polling while the transport is out of room.
fn post_retry(
    ep: &mut Endpoint,
    timeout: Duration,
    mut post: impl FnMut(&mut ntbdk_pmd::transport::Transport) -> Result<(), TransportError>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        match post(&mut ep.t) {
            Ok(()) => return Ok(()),
            Err(
                TransportError::Busy { .. }
                | TransportError::TooManyOutstanding { .. }
                // The client's region not advertised to us yet.
                | TransportError::UnknownRemoteKey { .. },
            ) => {
                ep.t.progress();
                if start.elapsed() >= timeout {
                    bail!("no room to post an echo for {timeout:?}: is the client still running?");
                }
                check_interrupted()?;
            }
            Err(e) => bail!("posting an echo: {e}"),
        }
    }
}
