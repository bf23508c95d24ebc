//! Serving a peer's requests (the target side): granting a write into one
//! of our regions, serving a read of one, telling a region's size, and the
//! `Done` that ends a write or a multicast deposit.
//!
//! Every request is checked before anything moves: a fresh op id (no
//! replay), at most `Config::max_outstanding` served for the peer, a known
//! key with the permission and the range inside the region. A refusal is
//! an error `Ack` (or `ReadSize`) to the peer and a drop counter.

use std::time::Instant;

use crate::hw::Port;

use super::config::saturating_after;
use super::counters::DropKind;
use super::dma::{SglCopyError, copy_to_sgl};
use super::endpoint::{Movers, Transport};
use super::key::{Access, RegionKey};
use super::ops::{DeliveredStorage, InOp};
use super::parked::ParkedKind;
use super::sgl::ExtentPos;
use super::types::{Completion, OpKind, Status};
use super::wire::{Msg, Ring, WireSge, WireStatus, sgl_msgs};

impl Transport {
    /// Admits a fresh op id from `p` on `ring` (RX or TX); `false`
    /// (counted) for a replay, or (refused with an error `Ack`) when we
    /// already serve `max_outstanding` operations for this peer.
    pub(crate) fn fresh(&mut self, p: Port, ring: Ring, op: u64) -> bool {
        let limit = self.cfg.max_outstanding;
        let peer = &mut self.peers[p as usize];
        let Some(c) = peer.conn.as_mut() else {
            return false;
        };
        if !c.admit(ring, op) {
            peer.counters.drop_one(DropKind::Replay);
            return false;
        }
        if c.serving() >= limit {
            // Serving too much for this peer already: refuse this one.
            peer.counters.drop_one(DropKind::Overload);
            self.nak(p, op, WireStatus::NoRoom);
            return false;
        }
        true
    }

    /// Starts serving `p`'s operation `op` (a write holds its region until
    /// it ends: see [`served_ended`](Self::served_ended)).
    pub(crate) fn serve(&mut self, p: Port, op: u64, io: InOp) {
        let Some(c) = self.peers[p as usize].conn.as_mut() else {
            return;
        };
        if let InOp::Write { region, .. } = io {
            self.regions.write_served(region);
        }
        c.serve(op, io);
    }

    /// A served operation ended (done, refused, expired, or its peer gone):
    /// what it held is let go. A multicast target's storage is freed; a
    /// written region's hold is released (a region deregistered while the
    /// peer could still write into it is retired only now).
    pub(crate) fn served_ended(&mut self, io: &InOp) {
        match *io {
            InOp::McRecv { region, .. } => {
                let _ = self.regions.deregister(region);
            }
            InOp::Write { region, .. } => self.regions.write_ended(region),
            InOp::Read { .. } => {}
        }
    }

    /// A multicast put from `origin` is in our storage `region`: it goes to
    /// the application as a `MulticastRecv` completion, and stays counted
    /// in `origin`'s share until the application deregisters it. With the
    /// completion queue at its depth (puts complete unasked, like notices)
    /// the storage goes instead and the put is refused.
    fn deliver_storage(
        &mut self,
        origin: Port,
        op: u64,
        region: RegionKey,
        len: u32,
    ) -> WireStatus {
        if self.completions.len() >= self.cfg.cq_depth {
            let _ = self.regions.deregister(region);
            self.notice_overrun(origin);
            return WireStatus::NoRoom;
        }
        self.peers[origin as usize].counters.served += 1;
        self.delivered_storage.push(DeliveredStorage {
            origin,
            region,
            len,
        });
        self.completions.push_back(Completion {
            peer: origin,
            op: OpKind::MulticastRecv,
            status: Status::Success,
            bytes: u64::from(len),
            cookie: op,
            region: Some(region),
        });
        WireStatus::Ok
    }

    /// Region `key` was deregistered: the reads of it we serve end now,
    /// refused (as verbs fails an operation on an invalidated region), so no
    /// byte of the area is copied out for them once it may be reused. The
    /// reader's segments still on their way are then counted as unknown
    /// operations when they arrive.
    pub(crate) fn end_reads_of(&mut self, key: RegionKey) {
        for i in 0..self.connected.len() {
            let p = self.connected[i];
            let Some(c) = self.peers[p as usize].conn.as_mut() else {
                continue;
            };
            let ops = c.served_reads_of(key);
            for &op in &ops {
                c.unserve(op);
            }
            for op in ops {
                self.nak(p, op, WireStatus::Access);
            }
        }
    }

    /// A deadline for a served operation, from now.
    pub(crate) fn served_deadline(&self) -> Instant {
        self.cfg.op_deadline()
    }

    /// Sends `ext` (our storage) to `p` as the SGL of its operation `op`.
    pub(crate) fn emit_sgl(&mut self, p: Port, op: u64, ext: &[(u64, u64)]) {
        super::wire::chunk_sgl(ext, |start, n, sges| {
            self.emit(p, Ring::Tx, &Msg::Sgl { op, start, n, sges })
        });
    }

    /// `WriteReq` (EP 3025241, write step 2): grant the write with the
    /// region's extents as our SGL, or refuse it.
    pub(crate) fn on_write_req(&mut self, p: Port, op: u64, rkey: u32, roff: u64, len: u32) {
        if !self.fresh(p, Ring::Rx, op) {
            return;
        }
        match self.regions.resolve_remote(
            p,
            RegionKey(rkey),
            roff,
            u64::from(len),
            Access::REMOTE_WRITE,
        ) {
            Err(_) => {
                self.count(p, DropKind::Access);
                self.nak(p, op, WireStatus::Access);
            }
            // More extents than our queue to it can carry now.
            Ok(ext) if !self.sgl_fits(p, sgl_msgs(&ext)) => {
                self.count(p, DropKind::Overload);
                self.nak(p, op, WireStatus::NoRoom);
            }
            Ok(ext) => {
                let deadline = self.served_deadline();
                let region = RegionKey(rkey);
                self.serve(
                    p,
                    op,
                    InOp::Write {
                        region,
                        len,
                        deadline,
                    },
                );
                self.emit_sgl(p, op, &ext);
            }
        }
    }

    /// `ReadReq` (EP 3025241, read step 2): serve a read of our region as
    /// the reader's SGL arrives, or refuse it.
    pub(crate) fn on_read_req(&mut self, p: Port, op: u64, rkey: u32, roff: u64, len: u32) {
        if !self.fresh(p, Ring::Tx, op) {
            return;
        }
        // Checked as a write is, but the extents are not copied out: the
        // read walks the region's own as the reader's SGL arrives.
        let admitted = self.regions.admitted(
            p,
            RegionKey(rkey),
            roff,
            u64::from(len),
            Access::REMOTE_READ,
        );
        match admitted.map(|r| r.serial) {
            Err(_) => {
                self.count(p, DropKind::Access);
                self.nak(p, op, WireStatus::Access);
            }
            Ok(serial) => {
                let deadline = self.served_deadline();
                let copy_by = saturating_after(self.cfg.copy_window());
                self.serve(
                    p,
                    op,
                    InOp::Read {
                        region: RegionKey(rkey),
                        serial,
                        roff,
                        at: ExtentPos::default(),
                        len,
                        delivered: 0,
                        deadline,
                        copy_by,
                    },
                );
            }
        }
    }

    /// `ReadSgl` (EP 3025241, read step 3): copy the next part of a read we
    /// serve straight into the reader's window; `Ack` once all of it is there.
    pub(crate) fn on_read_sgl(&mut self, p: Port, op: u64, start: u32, sges: &[WireSge]) {
        let key = (p, op, ParkedKind::Read);
        if self.parked.holds(key) && self.park_sgl(key, start, sges) {
            return;
        }
        let deadline_now = self.cfg.op_deadline();
        let Movers(_, peers, engine, local, regions) = self.movers();
        let peer = &mut peers[p as usize];
        let Some(c) = peer.conn.as_mut() else { return };
        let (win, io) = c.served_with_win(op);
        let Some(InOp::Read {
            region,
            serial,
            roff,
            at,
            len,
            delivered,
            deadline,
            copy_by,
            ..
        }) = io
        else {
            return peer.counters.drop_one(DropKind::UnknownOp);
        };
        // Too late to copy: the reader may have given up and reused its
        // memory (see `InOp::Read::copy_by`).
        if Instant::now() >= *copy_by {
            c.unserve(op);
            return;
        }
        let total: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        if start != *delivered || u64::from(start) + total > u64::from(*len) {
            c.unserve(op);
            peer.counters.drop_one(DropKind::OutOfRange);
            return self.nak(p, op, WireStatus::Protocol);
        }
        // Registered while the read is served (deregistering ends it); the
        // serial makes sure of it.
        let Some(r) = regions.get(*region).filter(|r| r.serial == *serial) else {
            c.unserve(op);
            peer.counters.drop_one(DropKind::UnknownOp);
            return self.nak(p, op, WireStatus::Protocol);
        };
        match copy_to_sgl(
            engine,
            local,
            win,
            &r.extents,
            at,
            *roff + u64::from(start),
            sges,
        ) {
            Ok(()) => {}
            Err(SglCopyError::Busy) if self.park_sgl(key, start, sges) => return,
            Err(_) => return self.doomed.push(p),
        }
        *delivered += total as u32;
        *deadline = deadline_now;
        peer.counters.bytes_out += total;
        if *delivered == *len {
            let len = *len;
            c.unserve(op);
            peer.counters.served += 1;
            self.emit(
                p,
                Ring::Cq,
                &Msg::Ack {
                    op,
                    status: WireStatus::Ok,
                    len,
                },
            );
        }
    }

    /// `ReadIntent` (read of unknown size): tell the reader how many bytes
    /// region `rkey` holds from `roff`, or refuse.
    pub(crate) fn on_read_intent(&mut self, p: Port, op: u64, rkey: u32, roff: u64) {
        // Admitted as a read of the byte at `roff` (the region's
        // permission, bounds and domain); the size is the rest from there.
        let admitted = self
            .regions
            .admitted(p, RegionKey(rkey), roff, 1, Access::REMOTE_READ);
        let reply = match admitted {
            Ok(r) if r.len - roff <= u64::from(u32::MAX) => Msg::ReadSize {
                op,
                status: WireStatus::Ok,
                len: (r.len - roff) as u32,
            },
            _ => {
                self.count(p, DropKind::Access);
                Msg::ReadSize {
                    op,
                    status: WireStatus::Access,
                    len: 0,
                }
            }
        };
        self.emit(p, Ring::Rx, &reply);
    }

    /// A `Done` (from the initiator; EP 3025241, write step 4) or
    /// `ChainDone` (from the previous target of a chain) for op `op` of
    /// `origin`: the data is in place; `Ack` it (step 5), and a chain
    /// target forwards it.
    pub(crate) fn on_done(&mut self, from: Port, origin: Port, op: u64, len: u32) {
        if origin as usize >= self.peers.len() {
            return self.count(from, DropKind::UnknownOp);
        }
        let legit = match self.peers[origin as usize]
            .conn
            .as_ref()
            .and_then(|c| c.served(op))
        {
            // A chain link's storage goes to its previous link only with
            // our clear-to-send: no data can be in it before.
            Some(InOp::McRecv {
                chain: Some(ch), ..
            }) => ch.prev == from && ch.cts_sent,
            Some(_) => from == origin,
            None => false,
        };
        if !legit {
            // Storage set aside when we gave the operation up: the
            // previous link is done with it now.
            if origin != from && self.release_kept(from, origin, op) {
                return;
            }
            return self.count(from, DropKind::UnknownOp);
        }
        let Some(c) = self.peers[origin as usize].conn.as_mut() else {
            return;
        };
        // A chain link the initiator cancelled: the previous link is done
        // with our storage, which goes; nothing is delivered or forwarded.
        if let Some(InOp::McRecv {
            chain: Some(ch), ..
        }) = c.served(op)
            && ch.cancelled
        {
            return self.end_served(origin, op);
        }
        let entry = c.unserve(op);
        let counters = &mut self.peers[origin as usize].counters;
        let reply = match entry {
            Some(InOp::Write { region, len: l, .. }) if l == len => {
                counters.served += 1;
                counters.bytes_in += u64::from(len);
                self.regions.write_ended(region);
                WireStatus::Ok
            }
            Some(InOp::McRecv {
                region,
                len: l,
                chain,
                deadline,
            }) if l == len => {
                // The bytes came in; served only once delivered.
                counters.bytes_in += u64::from(len);
                if let Some(ch) = chain {
                    self.chain_forward(origin, op, len, region, &ch, deadline);
                }
                self.deliver_storage(origin, op, region, len)
            }
            Some(other) => {
                counters.drop_one(DropKind::OutOfRange);
                if let InOp::McRecv {
                    chain: Some(ref ch),
                    ..
                } = other
                {
                    // We will never write the next link's storage.
                    self.release_next(ch, origin, op);
                }
                self.served_ended(&other);
                WireStatus::Protocol
            }
            None => return,
        };
        let len = if reply == WireStatus::Ok { len } else { 0 };
        self.emit(
            origin,
            Ring::Cq,
            &Msg::Ack {
                op,
                status: reply,
                len,
            },
        );
    }
}
