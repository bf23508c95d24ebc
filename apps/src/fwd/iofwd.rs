//! iofwd: a reflector. Every mbuf received from the peer is sent back to
//! it, in order, with its user word (end markers too), so a txonly sender
//! can check what returns.
//!
//! - run to completion ([`iofwd`]): one lcore per queue receives a burst
//!   and sends it back;
//! - pipeline ([`pipeline_rx`], [`pipeline_tx`]): an rx lcore receives and passes the
//!   mbufs through an [`MbufRing`](ntbdk_pmd::mbuf::MbufRing) to a tx lcore that sends them; the queue
//!   is split into its receive and send halves ([`DataQueue::split`]), one
//!   per lcore, with no lock between them.
//!
//! Nothing is dropped for want of room: what the peer cannot take yet stays
//! queued (back-pressure) until it can, or until the run ends.

use anyhow::Result;
use ntbdk_pmd::lcore::StopFlag;
use ntbdk_pmd::mbuf::{Mbuf, MbufConsumer, MbufProducer};
use ntbdk_pmd::transport::{DataQueue, RxQueue, TxQueue};

use super::lcore::{
    Every, LcoreCtx, Limit, RaiseOnDrop, Step, counts, drop_unsent, spin, tx_counted,
};

/// Receives into `into` up to a burst, no more than `limit` leaves,
/// counted.
#[inline]
fn rx_counted(q: &mut RxQueue, into: &mut Vec<Mbuf>, limit: &Limit, ctx: &LcoreCtx) -> usize {
    let from = into.len();
    // The counters are read only when there is a count to stop at.
    let done = limit.packets.map_or(0, |_| ctx.counters.snapshot().rx);
    let max = limit.left_of(ctx.burst - from, done);
    if max == 0 {
        return 0;
    }
    let n = q.rx_burst(into, max);
    if n > 0 {
        let (p, b) = counts(&into[from..]);
        ctx.counters.received(p, b);
    }
    n
}

/// Run-to-completion iofwd on queue `q` until the peer leaves, the limit
/// (packets received) or the end of the run. Returns a line for the
/// summary.
pub fn iofwd(q: DataQueue, limit: Limit, ctx: LcoreCtx) -> Result<String> {
    let qid = q.queue();
    let (mut rx, mut tx) = q.split();
    let mut pending: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let (mut every, mut clock) = (Every::default(), Every::default());
    let mut left = false;
    // Past the limit nothing more is received, and what was received is
    // still sent (not dropped) before the run ends.
    let mut limit_hit = false;
    spin(&ctx, || {
        let mut work = 0;
        if !limit_hit && pending.len() < ctx.burst {
            work += rx_counted(&mut rx, &mut pending, &limit, &ctx);
        }
        if !pending.is_empty() {
            work += tx_counted(|m| tx.tx_burst(m), &mut pending, &ctx.counters);
        }
        limit_hit = limit_hit
            || (limit.packets.is_some() && limit.count_reached(ctx.counters.snapshot().rx))
            || (clock.tick(64) && limit.time_up());
        if limit_hit && pending.is_empty() {
            return Ok(Step::Done);
        }
        if work == 0 && every.tick(256) && !rx.is_up() {
            left = true;
            return Ok(Step::Done);
        }
        Ok(Step::Work(work))
    })?;
    drop_unsent(&mut pending, &ctx.counters);
    Ok(ended(qid, left))
}

fn ended(qid: u16, peer_left: bool) -> String {
    if peer_left {
        format!("queue {qid}: forwarded until the peer left")
    } else {
        format!("queue {qid}: forwarded until the end of the run")
    }
}

/// The rx stage of a pipeline on `q`: receives and enqueues into `ring`
/// until the peer leaves or the limit is reached; `done`, dropped on every
/// way out (a panic's too, and with a job that never ran), then tells the
/// tx stage that nothing more comes.
pub fn pipeline_rx(
    mut q: RxQueue,
    mut ring: MbufProducer,
    done: RaiseOnDrop,
    limit: Limit,
    ctx: LcoreCtx,
) -> Result<String> {
    let _done = done;
    let mut held: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let (mut every, mut clock) = (Every::default(), Every::default());
    let mut left = false;
    let qid = q.queue();
    let r = spin(&ctx, || {
        let mut work = 0;
        if held.len() < ctx.burst {
            work += rx_counted(&mut q, &mut held, &limit, &ctx);
        }
        if !held.is_empty() {
            ring.enqueue_burst(&mut held);
        }
        if (limit.packets.is_some() && limit.count_reached(ctx.counters.snapshot().rx))
            || (clock.tick(64) && limit.time_up())
        {
            return Ok(Step::Done);
        }
        if work == 0 && every.tick(256) && !q.is_up() {
            left = true;
            return Ok(Step::Done);
        }
        Ok(Step::Work(work))
    });
    drop_unsent(&mut held, &ctx.counters);
    r?;
    Ok(ended(qid, left))
}

/// The tx stage of a pipeline on `q`: dequeues from `ring` and sends; ends
/// once `done` is raised and the ring is drained (or the peer is gone).
pub fn pipeline_tx(
    mut q: TxQueue,
    mut ring: MbufConsumer,
    done: StopFlag,
    ctx: LcoreCtx,
) -> Result<String> {
    let mut pending: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let mut every = Every::default();
    spin(&ctx, || {
        if pending.len() < ctx.burst {
            let room = ctx.burst - pending.len();
            ring.dequeue_burst(&mut pending, room);
        }
        let mut work = 0;
        if !pending.is_empty() {
            work = tx_counted(|m| q.tx_burst(m), &mut pending, &ctx.counters);
        }
        if work == 0
            && done.is_stopped()
            && ((pending.is_empty() && ring.is_empty()) || (every.tick(256) && !q.is_up()))
        {
            return Ok(Step::Done);
        }
        Ok(Step::Work(work))
    })?;
    drop_unsent(&mut pending, &ctx.counters);
    // Stopped (Ctrl-C, another lcore failed) before the rx stage ended: it
    // may still enqueue, so what is left is counted once it has (its
    // `done`, raised on any way out, orders its last enqueue before).
    let mut rest = Vec::new();
    loop {
        let ended = done.is_stopped();
        while ring.dequeue_burst(&mut rest, 64) > 0 {
            drop_unsent(&mut rest, &ctx.counters);
        }
        if ended {
            break;
        }
        std::thread::yield_now();
    }
    Ok(String::new())
}
