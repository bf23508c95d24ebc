//! txonly and rxonly: test traffic with a sequence in every packet's user
//! word and bytes that follow from it, and an end marker that tells the
//! receiver how many were sent.
//!
//! txonly also receives whatever comes back (from an iofwd reflector) and,
//! with `--verify`, checks it as rxonly does; once it has sent everything it
//! sends the end marker and waits until the marker comes back (an iofwd
//! reflects it), rxonly acknowledges it (with how many it received), or the
//! peer leaves.
//!
//! With `--verify`, an error is a packet whose bytes are wrong, one that
//! comes after a later one (out of order or duplicated), or one missing at
//! the end (sent and never received): a lost packet counts once, not also
//! as the gap it leaves.

use std::time::Instant;

use anyhow::{Result, bail};
use ntbdk_pmd::mbuf::{Mbuf, MbufPool};
use ntbdk_pmd::transport::DataQueue;

use super::lcore::{Every, LcoreCtx, Limit, Step, drop_unsent, spin, tx_counted};
use super::pattern::{Kind, check, fill, parse_user, user_word};

/// What txonly sends.
#[derive(Debug, Clone, Copy)]
pub struct TxOnly {
    /// Bytes per packet (`-s`).
    pub size: usize,
    /// When to stop sending.
    pub limit: Limit,
    /// Check what comes back.
    pub verify: bool,
}

/// Checks received packets in order: sequence and bytes.
#[derive(Debug, Default)]
struct Checker {
    /// One past the highest sequence received.
    next: u64,
    scratch: Vec<u8>,
    /// Packets received, the count the end marker announced, and the count
    /// an rxonly acknowledged receiving.
    received: u64,
    end: Option<u64>,
    acked: Option<u64>,
    /// The end marker itself, when kept ([`take`](Self::take)'s `keep_end`:
    /// rxonly sends it back as its acknowledgement).
    end_mbuf: Option<Mbuf>,
}

impl Checker {
    /// Counts and (with `verify`) checks `got`, then frees it (all but the
    /// end marker, with `keep_end`). A packet after a gap is not an error:
    /// what is missing counts at the end.
    fn take(&mut self, got: &mut Vec<Mbuf>, verify: bool, keep_end: bool, ctx: &LcoreCtx) {
        let (mut n, mut bytes, mut bad) = (0, 0, 0);
        let mut end_at = None;
        for (i, m) in got.iter().enumerate() {
            match parse_user(m.user()) {
                (Some(Kind::Data), seq) => {
                    n += 1;
                    bytes += m.len() as u64;
                    if verify && (seq < self.next || !check(m, seq, &mut self.scratch)) {
                        bad += 1;
                    }
                    self.next = self.next.max(seq + 1);
                }
                (Some(Kind::End), seq) => {
                    self.end = Some(seq);
                    end_at = Some(i);
                }
                (Some(Kind::EndAck), count) => self.acked = Some(count),
                _ => bad += u64::from(verify),
            }
        }
        self.received += n;
        ctx.counters.received(n, bytes);
        if bad > 0 {
            ctx.counters.failed(bad);
        }
        if keep_end && let Some(i) = end_at {
            self.end_mbuf = Some(got.swap_remove(i));
        }
        Mbuf::free_bulk(got);
    }
}

/// txonly on queue `q`: sends test packets from `pool` until the limit,
/// then the end marker. Returns a line for the summary.
pub fn txonly(mut q: DataQueue, pool: MbufPool, cfg: TxOnly, ctx: LcoreCtx) -> Result<String> {
    let (peer, qid) = (q.peer(), q.queue());
    let mut seq = 0u64;
    let mut batch: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let mut got: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let mut chk = Checker::default();
    let (mut end_queued, mut end_sent, mut peer_left) = (false, false, false);
    // The peer left with every packet sent but the end marker (an rxonly
    // that stopped at its own -n gives no buffer back for it).
    let mut marker_unsent = false;
    let mut idle_since = Instant::now();
    let (mut every, mut clock) = (Every::default(), Every::default());
    let mut time_up = false;
    let finished = spin(&ctx, || {
        if !end_queued {
            time_up = time_up || (clock.tick(64) && cfg.limit.time_up());
            if !time_up && !cfg.limit.count_reached(seq) {
                let room = ctx.burst - batch.len();
                let k = cfg.limit.left_of(room, seq);
                let from = batch.len();
                if k > 0 && pool.alloc_bulk(k, &mut batch).is_ok() {
                    for m in &mut batch[from..] {
                        fill(m, seq, cfg.size);
                        seq += 1;
                    }
                }
            } else if let Ok(mut m) = pool.alloc() {
                m.set_user(user_word(Kind::End, seq));
                batch.push(m);
                end_queued = true;
            }
        }
        let mut work = 0;
        if !batch.is_empty() {
            work += tx_counted(|m| q.tx_burst(m), &mut batch, &ctx.counters);
            if end_queued && batch.is_empty() {
                end_sent = true;
            }
        }
        let n = q.rx_burst(&mut got, ctx.burst);
        if n > 0 {
            chk.take(&mut got, cfg.verify, false, &ctx);
            work += n;
        }
        if end_sent && (chk.end.is_some() || chk.acked.is_some()) {
            return Ok(Step::Done);
        }
        if work > 0 {
            idle_since = Instant::now();
        } else if every.tick(256) {
            if !q.is_up() {
                if end_sent {
                    peer_left = true;
                    return Ok(Step::Done);
                }
                if end_queued && batch.len() == 1 {
                    marker_unsent = true;
                    return Ok(Step::Done);
                }
                bail!(
                    "port {peer} left while queue {qid} was sending (after {} packets): \
                     did it stop early (-n, -D, Ctrl-C)?",
                    ctx.counters.snapshot().tx
                );
            }
            if end_sent && idle_since.elapsed() >= ctx.timeout {
                bail!(
                    "queue {qid}: port {peer} neither returned the end marker, acknowledged it, \
                     nor left within {:?} of it: is it an {} rxonly or iofwd?",
                    ctx.timeout,
                    super::TOOL
                );
            }
        }
        Ok(Step::Work(work))
    });
    drop_unsent(&mut batch, &ctx.counters);
    finished?;
    // Packets that left (the ones filled but unsent at a stop are drops).
    let sent = ctx.counters.snapshot().tx;
    let back = chk.received;
    // Missing at the end: what a reflector did not send back (whether or
    // not its marker came: one that left early still reflected some), or
    // what an rxonly says it did not receive.
    let missing = match chk.acked {
        Some(got) => seq.saturating_sub(got),
        None if chk.end.is_some() || ((peer_left || marker_unsent) && back > 0) => {
            seq.saturating_sub(back)
        }
        None => 0,
    };
    if cfg.verify && missing > 0 {
        ctx.counters.failed(missing);
    }
    if marker_unsent {
        return Ok(format!(
            "queue {qid}: sent {sent} packets; the peer left before the end marker (did it \
             stop at its own -n?)"
        ));
    }
    Ok(match (chk.end, chk.acked, peer_left) {
        (Some(_), _, _) => {
            format!("queue {qid}: sent {sent} packets, {back} came back, then the end marker")
        }
        (None, Some(got), _) => {
            format!("queue {qid}: sent {sent} packets and the end marker; the peer received {got}")
        }
        (None, None, true) if back > 0 => format!(
            "queue {qid}: sent {sent} packets and the end marker; {back} came back, then the \
             peer left without returning the marker ({missing} missing)"
        ),
        (None, None, true) => {
            format!("queue {qid}: sent {sent} packets and the end marker; the peer left")
        }
        (None, None, false) => format!("queue {qid}: sent {sent} packets (stopped)"),
    })
}

/// rxonly on queue `q`: receives and frees, checking with `verify`, until
/// the end marker, the limit, or the peer leaving. Returns a line for the
/// summary.
pub fn rxonly(mut q: DataQueue, limit: Limit, verify: bool, ctx: LcoreCtx) -> Result<String> {
    let qid = q.queue();
    let mut got: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let mut chk = Checker::default();
    let mut peer_left = false;
    let (mut every, mut clock) = (Every::default(), Every::default());
    spin(&ctx, || {
        let max = limit.left_of(ctx.burst, chk.received);
        let n = q.rx_burst(&mut got, max);
        if n > 0 {
            chk.take(&mut got, verify, true, &ctx);
        }
        if chk.end.is_some()
            || limit.count_reached(chk.received)
            || (clock.tick(64) && limit.time_up())
        {
            return Ok(Step::Done);
        }
        if n == 0 && every.tick(256) && !q.is_up() {
            peer_left = true;
            return Ok(Step::Done);
        }
        Ok(Step::Work(n))
    })?;
    let got = chk.received;
    if let Some(mut m) = chk.end_mbuf.take() {
        m.set_user(user_word(Kind::EndAck, got));
        acknowledge(&mut q, m, &ctx);
    }
    Ok(match chk.end {
        Some(sent) => {
            if verify && sent != got {
                ctx.counters.failed(sent.abs_diff(got));
            }
            format!(
                "queue {qid}: received {got} of the {sent} packets the peer sent ({} missing)",
                sent.saturating_sub(got)
            )
        }
        None if peer_left && verify => bail!(
            "queue {qid}: the peer left after {got} packets without its end marker, so the \
             count cannot be verified: did the sender stop early (Ctrl-C, a crash)?"
        ),
        None if peer_left => format!("queue {qid}: received {got} packets; the peer left"),
        None => format!("queue {qid}: received {got} packets"),
    })
}

/// Sends `ack` back to the sender (which ends on it), then waits for the
/// sender to leave, so that our leaving does not end the connection before
/// it has read the acknowledgement (as `recv_file` does after its answer):
/// until it leaves, a stop, or `--timeout` (at most 5 s) passes.
fn acknowledge(q: &mut DataQueue, ack: Mbuf, ctx: &LcoreCtx) {
    let mut out = vec![ack];
    let mut got: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let wait = ctx.linger();
    let since = Instant::now();
    while q.is_up() && !ctx.stop.is_stopped() && since.elapsed() < wait {
        let sent = if out.is_empty() {
            0
        } else {
            q.tx_burst(&mut out)
        };
        // Anything more is not counted (the stream ended at its marker).
        if q.rx_burst(&mut got, ctx.burst) > 0 {
            Mbuf::free_bulk(&mut got);
        } else if sent == 0 {
            std::thread::yield_now();
        }
    }
    Mbuf::free_bulk(&mut out);
}
