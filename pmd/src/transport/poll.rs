//! The poll loop: one round of progress over every connected peer — link
//! events and handshakes every so often, each peer's rings drained in
//! place, every control message validated and handed to the role that owns
//! it, backlogs flushed and credits written back — and the expiry of
//! operations that made no progress.
//!
//! Sends (the PostQ) are taken by `receive.rs`; requests a peer makes of
//! us by `target.rs`; answers to our own operations by `initiator.rs`;
//! multicast and chains by `multicast.rs`.

use std::time::Instant;

use crate::hw::{HwError, Port};

use super::conn::Conn;
use super::counters::DropKind;
use super::endpoint::Transport;
use super::geometry::{Geometry, Layout};
use super::ops::OutKind;
use super::types::{PeerState, Status};
use super::wire::{self, Limits, Msg, Ring, SGES_PER_MSG, WireError};

/// Polls between two looks at the clock for the slow path, all peers
/// connected.
const SLOW_CHECK_EVERY: u32 = 64;
/// The same while a peer is missing (handshakes wait on the slow path).
const SLOW_CHECK_EVERY_CONNECTING: u32 = 8;

/// What a message on connection `c` may name: the bounds its validation
/// checks against.
pub(crate) fn limits(layout: &Layout, g: &Geometry, c: &Conn) -> Limits {
    Limits {
        max_len: u32::MAX,
        region_start: layout.region_area_start() as u64,
        window_len: c.win().len() as u64,
        eager_count: g.eager_count,
        eager_size: g.eager_size,
    }
}

/// The drop counter a message that failed decoding or validation goes to.
pub(crate) fn drop_kind(e: WireError) -> DropKind {
    match e {
        WireError::UnknownCode(_) | WireError::Malformed => DropKind::Malformed,
        WireError::WrongQueue => DropKind::WrongQueue,
        WireError::OutOfRange => DropKind::OutOfRange,
    }
}

impl Transport {
    /// One round of progress: link events and handshakes (every so often),
    /// every connected peer's queues, backlogs, credits and timeouts.
    /// Returns how many messages were handled.
    pub fn progress(&mut self) -> usize {
        if self.lost {
            return 0;
        }
        self.polls = self.polls.wrapping_add(1);
        // The clock is read every few polls, not every poll (a read costs
        // about as much as a whole poll): every 64th, or every 8th while a
        // peer is missing, so handshakes go on at the slow path's pace.
        let every = if self.connected.len() + 1 < self.peers.len() {
            SLOW_CHECK_EVERY_CONNECTING
        } else {
            SLOW_CHECK_EVERY
        };
        if self.polls.is_multiple_of(every) {
            let now = Instant::now();
            if now.duration_since(self.last_slow).as_micros() >= 500 {
                self.last_slow = now;
                self.slow_path(now);
            }
        }
        let mut work = 0;
        let mut i = 0;
        while i < self.connected.len() {
            let p = self.connected[i];
            work += self.poll_peer(p);
            i += 1;
        }
        while let Some(p) = self.doomed.pop() {
            self.start_over(p, Status::Reset);
        }
        work
    }

    /// Every 500 µs at most: the device's housekeeping, link events,
    /// hellos, and expiry. Out of line, so that a poll that finds nothing
    /// pays no more than its looks.
    #[inline(never)]
    fn slow_path(&mut self, now: Instant) {
        if let Err(HwError::SlotLost { .. }) = self.dev.service() {
            return self.lose();
        }
        self.handle_link_events();
        for p in 0..self.peers.len() as Port {
            if p == self.me {
                continue;
            }
            self.poll_hello(p);
            let peer = &self.peers[p as usize];
            let due = peer
                .last_hello_sent
                .is_none_or(|t| now.duration_since(t) >= self.cfg.hello_interval);
            if peer.conn.is_none() && due {
                let down = peer.state == PeerState::Down;
                match self.dev.link(p) {
                    Ok(l) if l.up && down => self.link_up(p, l.generation),
                    Ok(l) if l.up => self.send_hello(p),
                    // The link is down (a peer that said goodbye and left,
                    // on a device that reports no event for it): say so.
                    // Nothing is settled here: a goodbye settled already (a
                    // new incarnation), and a hold after a reset or a link
                    // drop stays until the peer comes back or it expires.
                    _ => {
                        let peer = &mut self.peers[p as usize];
                        peer.last_hello_sent = Some(now);
                        if peer.state == PeerState::Connecting {
                            peer.state = PeerState::Down;
                            peer.forget_inc();
                        }
                    }
                }
            }
        }
        self.expire(now);
        self.retry_parked();
        self.maybe_publish_stats(now);
    }

    /// We lost our place on the fabric: every connection ends (operations
    /// fail with [`Status::PeerDown`], receives are flushed), every peer
    /// reads [`PeerState::Lost`], and nothing is written from now on — not
    /// even a goodbye, which would reach the host that holds our place now.
    fn lose(&mut self) {
        if self.lost {
            return;
        }
        tracing::warn!(
            port = self.me,
            "this host was dropped from the fabric (stalled past the heartbeat timeout): \
             the transport stops; drop it and its device, then join again"
        );
        // First, so that the teardowns write nothing either (no cancel,
        // release or put to the peers still listed).
        self.lost = true;
        for p in 0..self.peers.len() as Port {
            if p != self.me {
                self.teardown(p, Status::PeerDown);
                // Receives posted while it was not connected, too.
                self.flush_recvs(p);
                // Our window, regions and all, is another host's now.
                self.settle(p);
                self.peers[p as usize].state = PeerState::Lost;
            }
        }
    }

    /// Fails our operations past their deadline, drops served ones (freeing
    /// the storage they hold) and early chain storage nobody claimed.
    fn expire(&mut self, now: Instant) {
        let timeout = self.cfg.op_timeout;
        // A next target's storage whose request never came: released,
        // not counted (a request refused or lost with its connection is
        // no fault of the next target's).
        let stale: Vec<(Port, Port, u64)> = self
            .chain_early
            .iter()
            .filter(|e| now.duration_since(e.at) >= timeout)
            .map(|e| (e.from, e.origin, e.op))
            .collect();
        self.chain_early
            .retain(|e| now.duration_since(e.at) < timeout);
        for (from, origin, op) in stale {
            self.release_storage(from, origin, op);
        }
        // Storage set aside waits two timeouts: the previous link's (or
        // the read target's) own deadline may have started up to one
        // timeout after ours.
        let kept_for = timeout.saturating_mul(2);
        self.free_kept(|k| now.duration_since(k.at) >= kept_for);
        // Operations served for connections that ended under the peer:
        // past their deadline, an honest peer writes them no more.
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.orphans)
            .into_iter()
            .partition(|(_, _, io)| io.deadline() <= now);
        self.orphans = held;
        for (p, op, io) in due {
            self.served_abandoned(p, op, io);
        }
        // A peer whose connection we ended on our own and that has not
        // come back within two timeouts (a peer that died on a device that
        // reports no link change, or stalls that long): what we advertised
        // to it is void. A live peer sees our new incarnation within a
        // poll or two of its slow path.
        for p in 0..self.peers.len() as Port {
            if self.peers[p as usize]
                .unsettled_since
                .is_some_and(|t| now.duration_since(t) >= kept_for)
            {
                self.settle(p);
            }
        }
        let expired: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let targets: Vec<Port> = match self.ops.get(&id).map(|o| &o.kind) {
                Some(OutKind::Multicast { targets, .. }) => targets
                    .iter()
                    .filter(|t| t.status.is_none())
                    .map(|t| t.peer)
                    .collect(),
                _ => Vec::new(),
            };
            if targets.is_empty() {
                self.finish(id, Status::Timeout, 0);
            } else {
                for t in targets {
                    self.mc_target_failed(id, t, Status::Timeout);
                }
            }
        }
        let mut wedged = Vec::new();
        for i in 0..self.connected.len() {
            let p = self.connected[i];
            let Some(c) = self.peers[p as usize].conn.as_mut() else {
                continue;
            };
            let wedge = c.wedged(&self.local, now, timeout);
            for (op, io) in c.expire_served(now) {
                self.served_abandoned(p, op, io);
            }
            if wedge {
                wedged.push(p);
            }
        }
        for p in wedged {
            self.resync(p);
        }
    }

    /// Drains `p`'s rings in our window: its FreeQ, then its control rings
    /// (decoded and validated, handled after its sends), then its sends;
    /// then flushes the backlog towards it and credits it. Returns how many
    /// messages were taken.
    ///
    /// Control messages are rare beside sends: each control ring's next
    /// tag is looked at first, and the rings are drained (out of line)
    /// only when one has arrived.
    fn poll_peer(&mut self, p: Port) -> usize {
        let peer = &mut self.peers[p as usize];
        let Some(c) = peer.conn.as_mut() else {
            return 0;
        };
        let arrived = c.arrivals(&self.local);
        if arrived.none() {
            // The slot after the PostQ's next one too (see
            // `Consumer::prefetch_ahead`), as the drain does when it finds
            // nothing: a send of two slots then arrives in one round of
            // line transfers, not two.
            c.consumer(Ring::PostQ).prefetch_ahead(&self.local, 1);
            peer.counters.empty_polls += 1;
            return 0;
        }
        if arrived.freeq {
            c.poll_freeq(&self.local, &mut peer.counters);
        }
        let control = arrived.control.then(|| self.take_control(p));
        let delivered = if arrived.sends {
            self.receive_sends(p)
        } else {
            0
        };
        let handled = match control {
            Some((scratch, refused)) => self.handle_control(p, scratch, refused),
            None => 0,
        };
        let peer = &mut self.peers[p as usize];
        if handled == 0 && delivered == 0 {
            peer.counters.empty_polls += 1;
        }
        if let Some(c) = peer.conn.as_mut()
            && c.settle(&self.local, &mut peer.counters).is_err()
        {
            self.doomed.push(p);
        }
        handled + delivered
    }

    /// Takes what arrived on `p`'s control rings: the messages that passed
    /// decoding and validation (in `scratch`'s storage), and the operations
    /// of ours whose answers failed validation. Malformed ones are counted.
    #[inline(never)]
    fn take_control(&mut self, p: Port) -> (Vec<Msg>, Vec<u64>) {
        let depth = self.cfg.geometry.queue_depth;
        let mut scratch = std::mem::take(&mut self.scratch);
        // Answers to our operations that failed validation (rare: no
        // allocation unless there is one).
        let mut refused = Vec::new();
        let peer = &mut self.peers[p as usize];
        let Some(c) = peer.conn.as_mut() else {
            return (scratch, refused);
        };
        let limits = limits(&self.layout, &self.cfg.geometry, c);
        for ring in Ring::CONTROL {
            let cons = c.consumer(ring);
            for _ in 0..depth {
                let Some(b) = cons.peek(&self.local) else {
                    break;
                };
                cons.advance();
                match wire::decode(&b) {
                    Ok(m) => match wire::validate(&m, ring, &limits) {
                        Ok(()) => scratch.push(m),
                        Err(e) => {
                            peer.counters.drop_one(drop_kind(e));
                            refused.extend(m.answer_to());
                        }
                    },
                    Err(e) => peer.counters.drop_one(drop_kind(e)),
                }
            }
        }
        (scratch, refused)
    }

    /// Hands what [`take_control`](Self::take_control) took to the roles
    /// that own it, and gives `scratch`'s storage back. Returns how many
    /// messages were handled.
    #[inline(never)]
    fn handle_control(&mut self, p: Port, mut scratch: Vec<Msg>, refused: Vec<u64>) -> usize {
        let n = scratch.len();
        for m in scratch.drain(..) {
            self.handle(p, m);
        }
        self.scratch = scratch;
        for op in refused {
            self.fail_answered(p, op);
        }
        n
    }

    /// Hands a validated control message from `p` to the role that owns it.
    fn handle(&mut self, p: Port, m: Msg) {
        if self.peers[p as usize].conn.is_none() {
            return;
        }
        let sgl = |n: u8| (n as usize).min(SGES_PER_MSG);
        match m {
            // A peer's requests of us (target side).
            Msg::WriteReq {
                op,
                rkey,
                roff,
                len,
            } => self.on_write_req(p, op, rkey, roff, len),
            Msg::ReadReq {
                op,
                rkey,
                roff,
                len,
            } => self.on_read_req(p, op, rkey, roff, len),
            Msg::ReadSgl { op, start, n, sges } => self.on_read_sgl(p, op, start, &sges[..sgl(n)]),
            Msg::ReadIntent { op, rkey, roff } => self.on_read_intent(p, op, rkey, roff),
            Msg::Done { op, len } => self.on_done(p, p, op, len),
            // Multicast and chains (target side).
            Msg::Rts { op, len } => self.on_rts(p, op, len),
            Msg::ChainRts {
                op,
                len,
                prev,
                next,
            } => self.on_chain_rts(p, op, len, prev, next),
            Msg::ChainSgl {
                op,
                origin,
                start,
                n,
                sges,
            } => self.on_chain_sgl(p, origin, op, start, &sges[..sgl(n)]),
            Msg::ChainDone { op, origin, len } => self.on_done(p, origin, op, len),
            Msg::Cancel { op } => self.on_cancel(p, op),
            Msg::ChainRelease { op, origin } => self.on_chain_release(p, origin, op),
            // Answers to our own operations (initiator side).
            Msg::ReadSize { op, status, len } => self.on_read_size(p, op, status, len),
            Msg::Sgl { op, start, n, sges } => self.on_sgl(p, op, start, &sges[..sgl(n)]),
            Msg::Ack { op, status, len } => self.on_ack(p, op, status, len),
            // One-sided writes.
            Msg::Advertise { rkey, offset, len } => self.on_advertise(p, rkey, offset, len),
            Msg::Revoke { rkey } => self.on_revoke(p, rkey),
            Msg::RevokeAck { rkey } => self.on_revoke_ack(p, rkey),
            Msg::WriteImm {
                rkey,
                roff,
                len,
                imm,
            } => self.on_write_imm(p, rkey, roff, len, imm),
            // Sends arrive on the PostQ only, taken in `receive_sends`.
            Msg::SendInline { .. } | Msg::SendBuf { .. } => {
                self.count(p, DropKind::WrongQueue);
            }
        }
    }

    /// Fails our operation `op` with [`Status::Protocol`] after `p` sent a
    /// malformed answer to it (only an operation that involves `p`: a peer
    /// can fail nothing of anyone else's).
    fn fail_answered(&mut self, p: Port, op: u64) {
        match self.ops.get(&op).map(|o| (o.involves(p), &o.kind)) {
            Some((true, OutKind::Multicast { .. })) => {
                self.mc_target_failed(op, p, Status::Protocol)
            }
            Some((true, _)) => self.finish(op, Status::Protocol, 0),
            _ => {}
        }
    }

    /// Counts a dropped message from `p`.
    pub(crate) fn count(&mut self, p: Port, kind: DropKind) {
        self.peers[p as usize].counters.drop_one(kind);
    }
}
