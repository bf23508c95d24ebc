//! `ntb-fwd`: a DPDK `ntb_fwd`-style forwarder over the transport's eager
//! sends, and a file transfer whose receiver checks what it wrote.
//!
//! - [`Mode::TxOnly`]: send messages of a size, in bursts, to one or more
//!   peers;
//! - [`Mode::RxOnly`]: receive and drop;
//! - [`Mode::IoFwd`]: receive from one peer and forward every message to
//!   another;
//! - [`Mode::FileTrans`]: send a file ([`send_file`]) as a header, chunks of
//!   one eager buffer and a trailer with its [`Checksum`]; the receiver
//!   ([`recv_file`]) writes it out, checks the checksum and acknowledges, so
//!   the sender knows it arrived intact.
//!
//! Every loop prints per-queue [`Stats`] every period and at the end, and
//! stops on Ctrl-C ([`interrupted`](crate::cli::session::interrupted)).

mod checksum;
mod file;
mod stats;

pub use checksum::Checksum;
pub use file::{Transfer, recv_file, send_file};
pub use stats::{QueueStats, Stats};

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::transport::{Completion, OpKind, PeerState, Qp, SendWr, TransportError};

use crate::cli::session::{check_interrupted, completion_error, interrupted};
use crate::perf::Endpoint;

/// What a forwarder does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Send only.
    #[value(name = "txonly")]
    TxOnly,
    /// Receive only (and drop).
    #[value(name = "rxonly")]
    RxOnly,
    /// Receive from one peer, forward to another.
    #[value(name = "iofwd")]
    IoFwd,
    /// Send a file, or receive one and check it.
    #[value(name = "file-trans")]
    FileTrans,
}

/// When a forwarding loop ends (besides Ctrl-C and errors).
#[derive(Debug, Clone, Copy, Default)]
pub struct Limit {
    /// After this many messages (sent for txonly, received otherwise).
    pub messages: Option<u64>,
    /// After this long.
    pub duration: Option<Duration>,
}

impl Limit {
    fn reached(&self, messages: u64, elapsed: Duration) -> bool {
        self.messages.is_some_and(|n| messages >= n) || self.duration.is_some_and(|d| elapsed >= d)
    }
}

/// Posts `wrs` to `qp`, retrying while the peer has no room, for up to
/// `timeout`. Returns how many were posted (all of them).
pub fn send_all(ep: &mut Endpoint, qp: Qp, wrs: &[SendWr<'_>], timeout: Duration) -> Result<usize> {
    let mut done = 0;
    let mut start: Option<Instant> = None;
    while done < wrs.len() {
        match ep.t.post_sends(qp, &wrs[done..]) {
            Ok(n) => done += n,
            Err(TransportError::Busy { .. }) => {
                ep.t.progress();
                let s = *start.get_or_insert_with(Instant::now);
                if s.elapsed() >= timeout {
                    bail!(
                        "port {} took no message for {timeout:?}: is it still receiving?",
                        qp.peer()
                    );
                }
                check_interrupted()?;
            }
            Err(e) => bail!("sending to port {}: {e}", qp.peer()),
        }
    }
    Ok(done)
}

/// The forwarding loop of txonly, rxonly and iofwd. `tx` are the queues
/// sent to (txonly: round robin; iofwd: the first), `rx` the queues
/// received from (receives must be posted). Prints `stats` every `period`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    ep: &mut Endpoint,
    mode: Mode,
    tx: &[Qp],
    rx: &[Qp],
    size: usize,
    burst: usize,
    limit: Limit,
    period: Duration,
    timeout: Duration,
    stats: &mut Stats,
) -> Result<()> {
    let payload = vec![0x42u8; size];
    let wrs = vec![
        SendWr {
            data: &payload,
            cookie: 0
        };
        burst
    ];
    let mut comps = vec![Completion::default(); 64];
    let mut buf = vec![0u8; crate::perf::EAGER_SIZE as usize];
    let start = Instant::now();
    let mut next_print = start + period;
    let mut turn = 0usize;
    let mut polls = 0u32;
    let mut sent = 0u64;
    let mut received = 0u64;
    loop {
        if mode == Mode::TxOnly {
            let qp = tx[turn % tx.len()];
            turn += 1;
            let k = match limit.messages {
                Some(n) => burst.min((n - sent) as usize),
                None => burst,
            };
            match ep.t.post_sends(qp, &wrs[..k]) {
                Ok(n) => sent += n as u64,
                Err(TransportError::Busy { .. }) => stats.queue(qp.peer()).busy += 1,
                Err(e) => bail!("sending to port {}: {e}", qp.peer()),
            }
        }
        let n = ep.t.poll_completions(&mut comps);
        for c in &comps[..n] {
            if !c.status.is_ok() {
                if c.op == OpKind::Recv {
                    continue; // flushed by a peer leaving
                }
                return Err(completion_error(c));
            }
            match c.op {
                OpKind::Send => stats.queue(c.peer).sent(c.bytes),
                OpKind::Recv => {
                    received += 1;
                    stats.queue(c.peer).received(c.bytes);
                    let Some(&rq) = rx.iter().find(|q| q.peer() == c.peer) else {
                        continue;
                    };
                    if mode == Mode::IoFwd {
                        let len = c.bytes as usize;
                        ep.read_recv(c.cookie, &mut buf[..len])?;
                        let wr = [SendWr {
                            data: &buf[..len],
                            cookie: 0,
                        }];
                        send_all(ep, tx[0], &wr, timeout)?;
                        stats.queue(c.peer).forwarded += 1;
                    }
                    ep.repost(rq, c.cookie)?;
                }
                _ => {}
            }
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(256) {
            let now = Instant::now();
            let counted = if mode == Mode::TxOnly { sent } else { received };
            if interrupted() || limit.reached(counted, now - start) {
                return Ok(());
            }
            if now >= next_print {
                print!("{}", stats.report(now));
                next_print = now + period;
            }
            let watched = if mode == Mode::TxOnly { tx } else { rx };
            if watched
                .iter()
                .all(|q| ep.t.peer_state(q.peer()) != PeerState::Connected)
            {
                if mode == Mode::TxOnly || received == 0 {
                    bail!("every peer left (its link went down)");
                }
                // The senders are done and gone: a normal end.
                return Ok(());
            }
        }
    }
}
