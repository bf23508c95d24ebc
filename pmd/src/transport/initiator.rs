//! Our operations' progress (the initiator side): the target's answers to
//! our writes and reads — the size of a read of unknown size, the SGL of a
//! granted write, the final `Ack` — and the completion that ends each.
//!
//! Every answer is checked against the operation it names: it must exist,
//! involve the peer that answered, be in the state that expects it, and
//! (SGL segments) arrive in order within the transfer. Anything else is
//! dropped and counted, or fails the operation with [`Status::Protocol`].

use crate::hw::Port;

use super::counters::DropKind;
use super::dma::{SglCopyError, copy_to_sgl};
use super::endpoint::{Movers, Transport};
use super::ops::OutKind;
use super::parked::ParkedKind;
use super::types::{Completion, OpKind, Status};
use super::wire::{Msg, Ring, WireSge, WireStatus};

/// The completion status a peer's wire status stands for.
pub(crate) fn status_of(s: WireStatus) -> Status {
    match s {
        WireStatus::Ok => Status::Success,
        WireStatus::Access => Status::RemoteAccess,
        WireStatus::Protocol => Status::Protocol,
        WireStatus::NoRoom => Status::TooLarge,
    }
}

impl Transport {
    /// `ReadSize`: the target told the size of a read of unknown size;
    /// allocate a region that large (within the caller's bound) and read
    /// into it under a fresh op id.
    pub(crate) fn on_read_size(&mut self, p: Port, op: u64, status: WireStatus, len: u32) {
        let Some(o) = self.ops.get(&op) else {
            return self.count(p, DropKind::UnknownOp);
        };
        let cookie = o.cookie;
        let OutKind::ReadSize {
            peer,
            rkey,
            roff,
            max_len,
        } = o.kind
        else {
            return self.count(p, DropKind::UnknownOp);
        };
        if peer != p {
            return self.count(p, DropKind::UnknownOp);
        }
        if status != WireStatus::Ok {
            return self.finish(op, status_of(status), 0);
        }
        if u64::from(len) > max_len {
            return self.finish(op, Status::TooLarge, 0);
        }
        // Storage only the target writes.
        let Ok(key) = self.storage_for(len, p) else {
            return self.finish(op, Status::TooLarge, 0);
        };
        let ext = self.regions.extents(key, len);
        // Storage scattered over a fragmented area into more extents than
        // our queue to the peer can carry now: the read fails instead of
        // resetting the connection.
        if !self.sgl_fits(p, Self::read_req_msgs(&ext)) {
            let _ = self.regions.deregister(key);
            return self.finish(op, Status::TooLarge, 0);
        }
        self.ops.remove(&op);
        // A fresh op id: ids on the peer's TX ring must only grow.
        let id = self.new_op(
            cookie,
            OutKind::Read {
                peer: p,
                len,
                region: Some(key),
            },
        );
        self.send_read_req(p, id, rkey, roff, len, &ext);
    }

    /// `Sgl`: part of the storage a target granted for our write (EP
    /// 3025241, write step 3: copy it straight in, then `Done`), or a
    /// multicast target's clear-to-send.
    pub(crate) fn on_sgl(&mut self, p: Port, op: u64, start: u32, sges: &[WireSge]) {
        let key = (p, op, ParkedKind::Write);
        if self.parked.holds(key) && self.park_sgl(key, start, sges) {
            return;
        }
        if matches!(
            self.ops.get(&op).map(|o| &o.kind),
            Some(OutKind::Multicast { .. })
        ) {
            return self.on_multicast_sgl(p, op, start, sges);
        }
        let deadline_now = self.cfg.op_deadline();
        let window = self.cfg.copy_window();
        let Movers(ops, peers, engine, local, _) = self.movers();
        let Some(o) = ops.get_mut(&op) else {
            return peers[p as usize].counters.drop_one(DropKind::UnknownOp);
        };
        let OutKind::Write {
            peer,
            src,
            len,
            delivered,
            done,
            posted,
        } = &mut o.kind
        else {
            return peers[p as usize].counters.drop_one(DropKind::UnknownOp);
        };
        if *peer != p || *done {
            return peers[p as usize].counters.drop_one(DropKind::UnknownOp);
        }
        // The target gives its storage up a timeout after our request
        // reached it: a copy started late could still be running then,
        // into memory it may have reused. We start none (a target sending
        // its storage in crumbs cannot keep the write open either).
        if posted.elapsed() >= window {
            return self.finish(op, Status::Timeout, 0);
        }
        let total: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        if start != *delivered || u64::from(start) + total > u64::from(*len) {
            peers[p as usize].counters.drop_one(DropKind::OutOfRange);
            return self.finish(op, Status::Protocol, 0);
        }
        let Some(c) = peers[p as usize].conn.as_ref() else {
            return;
        };
        let (src, at) = src.parts();
        match copy_to_sgl(engine, local, c.win(), src, at, u64::from(start), sges) {
            Ok(()) => {}
            Err(SglCopyError::Busy) if self.park_sgl(key, start, sges) => return,
            Err(_) => return self.doomed.push(p),
        }
        *delivered += total as u32;
        peers[p as usize].counters.bytes_out += total;
        if *delivered == *len {
            *done = true;
            // The acknowledgement gets a whole timeout from the copy's end.
            o.deadline = deadline_now;
            let len = *len;
            self.emit(p, Ring::Cq, &Msg::Done { op, len });
        }
    }

    /// `Ack`: the target's verdict on our write or read (EP 3025241, write
    /// step 5), or on its part of a multicast.
    pub(crate) fn on_ack(&mut self, p: Port, op: u64, status: WireStatus, len: u32) {
        let Some(o) = self.ops.get_mut(&op) else {
            return self.count(p, DropKind::UnknownOp);
        };
        match &mut o.kind {
            OutKind::Write {
                peer, len: l, done, ..
            } if *peer == p => {
                let s = match status {
                    WireStatus::Ok if *done && len == *l => Status::Success,
                    WireStatus::Ok => Status::Protocol,
                    other => status_of(other),
                };
                let bytes = if s.is_ok() { u64::from(len) } else { 0 };
                self.finish(op, s, bytes);
            }
            OutKind::Read { peer, len: l, .. } if *peer == p => {
                let s = match status {
                    WireStatus::Ok if len == *l => Status::Success,
                    WireStatus::Ok => Status::Protocol,
                    other => status_of(other),
                };
                let bytes = if s.is_ok() { u64::from(len) } else { 0 };
                if s.is_ok() {
                    self.peers[p as usize].counters.bytes_in += bytes;
                }
                self.finish(op, s, bytes);
            }
            OutKind::Multicast { .. } => self.on_multicast_ack(p, op, status, len),
            _ => self.count(p, DropKind::UnknownOp),
        }
    }

    /// Completes op `id` with `status`.
    pub(crate) fn finish(&mut self, id: u64, status: Status, bytes: u64) {
        let Some(o) = self.ops.remove(&id) else {
            return;
        };
        let ok = status.is_ok();
        let (peer, op, region) = match o.kind {
            OutKind::Write { peer, .. } => {
                self.parked.forget_op((peer, id, ParkedKind::Write));
                let c = &mut self.peers[peer as usize].counters;
                if ok {
                    c.writes += 1;
                }
                (peer, OpKind::Write, None)
            }
            OutKind::ReadSize { peer, .. } => (peer, OpKind::ReadUnknown, None),
            OutKind::Read { peer, region, len } => {
                if ok {
                    self.peers[peer as usize].counters.reads += 1;
                }
                let kind = if region.is_some() {
                    OpKind::ReadUnknown
                } else {
                    OpKind::Read
                };
                let region = match region {
                    // The target's link is down (or we are gone): freed at
                    // once, so that a dead target's reads hold nothing. Not
                    // covered: a target that had only stalled and copies in
                    // when it wakes, before it sees the link change (the
                    // transport cannot tell it from a dead one until the
                    // device gives its place away).
                    Some(k) if status == Status::PeerDown => {
                        let _ = self.regions.deregister(k);
                        None
                    }
                    Some(k) if !ok => {
                        // The target serves the read from when our request
                        // reached it and may still be copying in: the
                        // storage is set aside, not reused, until the target
                        // holds nothing of this connection (`settle`) or two
                        // operation timeouts pass.
                        self.set_aside(self.me, id, peer, k, len);
                        None
                    }
                    r => r,
                };
                (peer, kind, region)
            }
            OutKind::Multicast { ref targets, .. } => {
                for t in targets {
                    let c = &mut self.peers[t.peer as usize].counters;
                    if t.status == Some(Status::Success) {
                        c.multicasts += 1;
                    }
                }
                let first = targets
                    .iter()
                    .find(|t| t.status != Some(Status::Success))
                    .or(targets.first())
                    .map_or(0, |t| t.peer);
                (first, OpKind::MulticastPut, None)
            }
        };
        if !ok {
            self.peers[peer as usize].counters.failed_ops += 1;
        }
        self.completions.push_back(Completion {
            peer,
            op,
            status,
            bytes,
            cookie: o.cookie,
            region,
        });
    }
}
