//! Multicast put (EP 3025241's multicast flow): one source to several
//! targets, fan-out (the initiator copies to each) or store and forward
//! down a chain (each target deposits and forwards to the next).
//!
//! Initiator: a request to send to every target, each answers with storage
//! it allocated (clear to send), a check-in counter of targets not yet
//! ready reaches zero, the data is put, each target `Ack`s; one completion.
//! Target: allocate storage for a request, then in a chain wait for the
//! successor's storage before sending ours to the predecessor, deposit,
//! forward with `ChainDone`.

use std::time::Instant;

/// Most chain storage announcements kept while their request is awaited,
/// for one origin from one sender. Per pair, not per sender: a hostile
/// origin can make an honest port send us storage for its chains, and
/// must not use up that port's room for other origins' chains.
const EARLY_PER_PAIR: usize = 64;
/// Most kept in all, per port of the fabric. One hostile port takes part
/// in about two pairs per port (as the origin, and as the sender), so it
/// can fill at most about half of this; honest pairs keep the rest.
const EARLY_MAX_PER_PORT: usize = 4 * EARLY_PER_PAIR;

use crate::hw::{GRANT_TABLE_LEN, Port};

use super::config::saturating_after;
use super::counters::DropKind;
use super::dma::{SglCopyError, copy_to_sgl, to_wire};
use super::endpoint::{Movers, Transport};
use super::error::{Result, TransportError};
use super::initiator::status_of;
use super::key::{Access, RegionKey};
use super::ops::{ChainLink, EarlySgl, InOp, KeptStorage, McTarget, OutKind};
use super::parked::ParkedKind;
use super::region::{GRAIN, footprint};
use super::sgl::{ExtentPos, Sge};
use super::types::{Qp, Status};
use super::wire::{self, Msg, Ring, WireSge, WireStatus};

/// How a multicast put reaches its targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MulticastMode {
    /// The initiator copies to every target itself.
    #[default]
    FanOut,
    /// Store and forward: the initiator copies to the first target, which
    /// deposits the data and forwards it to the next, and so on down the
    /// list (the "deposit bit" of the reference). Each target's storage is
    /// sent to its predecessor; the first target's clear-to-send arrives
    /// only once the whole chain is ready.
    Chain,
}

impl Transport {
    /// Puts the bytes of `local` to every target at once: a request to send
    /// to each, each answers clear-to-send with storage it allocated, a
    /// check-in counter reaches zero, then one call copies to all (fan-out
    /// by the initiator). Completes once with [`OpKind::MulticastPut`](super::OpKind::MulticastPut);
    /// each target gets an [`OpKind::MulticastRecv`](super::OpKind::MulticastRecv) completion with the
    /// region holding the data.
    pub fn post_multicast_put(&mut self, targets: &[Qp], local: &[Sge], cookie: u64) -> Result<()> {
        self.post_multicast_put_with(targets, local, MulticastMode::FanOut, cookie)
    }

    /// [`post_multicast_put`](Self::post_multicast_put) with a choice of
    /// [`MulticastMode`] (fan-out, or store and forward down the list).
    pub fn post_multicast_put_with(
        &mut self,
        targets: &[Qp],
        local: &[Sge],
        mode: MulticastMode,
        cookie: u64,
    ) -> Result<()> {
        if targets.is_empty() {
            return Err(TransportError::NoTargets);
        }
        for (i, t) in targets.iter().enumerate() {
            self.check_op_post(*t)?;
            // Its request waits for credits like any message (`Busy` past
            // the room a post may take of the backlog).
            self.backlog_room(t.peer, Ring::Rx, 1)?;
            if targets[..i].contains(t) {
                return Err(TransportError::DuplicateTarget { peer: t.peer });
            }
        }
        let (src, len) = self.resolve_sges(local, Access::LOCAL_READ)?;
        let chain = mode == MulticastMode::Chain;
        let op = self.new_op(
            cookie,
            OutKind::Multicast {
                posted: Instant::now(),
                src,
                len,
                targets: targets
                    .iter()
                    .map(|t| McTarget {
                        peer: t.peer,
                        sgl: Vec::new(),
                        got: 0,
                        ready: false,
                        copied: false,
                        status: None,
                    })
                    .collect(),
                put: false,
                chain,
            },
        );
        for (i, t) in targets.iter().enumerate() {
            let msg = if chain {
                Msg::ChainRts {
                    op,
                    len,
                    prev: if i == 0 { self.me } else { targets[i - 1].peer },
                    next: targets.get(i + 1).map(|q| q.peer),
                }
            } else {
                Msg::Rts { op, len }
            };
            self.emit(t.peer, Ring::Rx, &msg);
            self.ring_doorbell(t.peer);
        }
        Ok(())
    }

    /// `Rts` (target): allocate storage for a multicast put and send it to
    /// the initiator as clear-to-send.
    pub(crate) fn on_rts(&mut self, p: Port, op: u64, len: u32) {
        if !self.fresh(p, Ring::Rx, op)
            || !self.within_quota(p, op, len)
            || !self.within_grant_share(p, op, 1, None)
        {
            return;
        }
        // Storage only the initiator writes.
        match self.storage_for(len, p) {
            Err(_) => self.nak(p, op, WireStatus::NoRoom),
            Ok(key) => {
                let more = self.regions.grant_entries(key);
                if !self.within_grant_share(p, op, more, Some(key)) {
                    return;
                }
                let ext = self.regions.extents(key, len);
                // Storage scattered over a fragmented area into more
                // extents than our queue to it can carry now: refused.
                if !self.sgl_fits(p, wire::sgl_msgs(&ext)) {
                    return self.refuse_storage(p, op, Some(key));
                }
                self.serve_deposit(p, op, key, len, None);
                self.emit_sgl(p, op, &ext);
            }
        }
    }

    /// The storage of our region area held for `p`'s requests: what we
    /// serve for it now, what we set aside or still hold from an earlier
    /// connection of `p` (reconnecting does not buy a peer a fresh share),
    /// and what we delivered to the application from it.
    fn storage_of(&self, p: Port) -> Vec<(RegionKey, u32)> {
        let serving = self.peers[p as usize].conn.as_ref();
        let kept = self.kept_storage.iter().filter(|k| k.origin == p);
        let orphaned = self.orphans.iter().filter(|o| o.0 == p);
        let delivered = self.delivered_storage.iter().filter(|d| d.origin == p);
        serving
            .into_iter()
            .flat_map(|c| c.storage())
            .chain(kept.map(|k| (k.region, k.len)))
            .chain(orphaned.filter_map(|o| o.2.storage()))
            .chain(delivered.map(|d| (d.region, d.len)))
            .collect()
    }

    /// Target: whether `len` more bytes of storage for `p` stay within its
    /// quota of our region area; if not, refuses `op` ("no room") and
    /// counts an overload.
    fn within_quota(&mut self, p: Port, op: u64, len: u32) -> bool {
        // Counted as the region area takes it (whole grains), so that tiny
        // requests cannot hold more than the quota.
        let held: u64 = self.storage_of(p).iter().map(|s| footprint(s.1)).sum();
        if held + footprint(len) <= self.storage_quota {
            return true;
        }
        self.refuse_storage(p, op, None);
        false
    }

    /// Target: whether `p`'s storage may take `more` grant-table entries
    /// (an entry per extent: a peer asking for storage without ever
    /// finishing must not take the entries the application's regions and
    /// the other peers need). Its share is half the table (the other half
    /// left to the application's regions) split among the connected peers;
    /// devices that keep no table grant no entries, so nothing is refused
    /// there. If not, refuses `op` (its storage `key`, if allocated, goes).
    fn within_grant_share(
        &mut self,
        p: Port,
        op: u64,
        more: usize,
        key: Option<RegionKey>,
    ) -> bool {
        let held: usize = self
            .storage_of(p)
            .into_iter()
            .map(|(k, _)| self.regions.grant_entries(k))
            .sum();
        // At least one entry, so that a device without a table (no entries
        // held) refuses nothing however many peers are connected.
        let share = (GRANT_TABLE_LEN / 2 / self.connected.len().max(1)).max(1);
        if held + more <= share {
            return true;
        }
        self.refuse_storage(p, op, key);
        false
    }

    /// Target: refuses `p`'s storage request `op` ("no room", counted as an
    /// overload), freeing its storage `key` if it was allocated (just
    /// registered, unadvertised, unused: it goes at once).
    fn refuse_storage(&mut self, p: Port, op: u64, key: Option<RegionKey>) {
        if let Some(key) = key {
            let _ = self.regions.deregister(key);
        }
        self.count(p, DropKind::Overload);
        self.nak(p, op, WireStatus::NoRoom);
    }

    /// Target: serves `p`'s multicast `op` with storage `region` allocated
    /// for it (and our place in a chain, if any), until its `Done`.
    fn serve_deposit(
        &mut self,
        p: Port,
        op: u64,
        region: RegionKey,
        len: u32,
        chain: Option<Box<ChainLink>>,
    ) {
        let deadline = self.served_deadline();
        let io = InOp::McRecv {
            region,
            len,
            deadline,
            chain,
        };
        self.serve(p, op, io);
    }

    /// Chain target: the data is deposited in `region`; forward it to the
    /// next target's storage and tell it, if our `deadline` has not passed
    /// (past it, the next link may have given its storage up: its
    /// deadline started before ours, at its own clear-to-send).
    pub(crate) fn chain_forward(
        &mut self,
        origin: Port,
        op: u64,
        len: u32,
        region: RegionKey,
        ch: &ChainLink,
        deadline: Instant,
    ) {
        let Some(next) = ch.next else { return };
        let peer = &self.peers[next as usize];
        if ch.next_got != len
            || peer.peer_inc != ch.next_inc
            || peer.conn.is_none()
            || Instant::now() >= deadline
        {
            // Too late, not the host that gave the storage, or not all of
            // it: we will never write it (a new host ignores the release;
            // with no connection there is nobody to tell).
            return self.release_next(ch, origin, op);
        }
        let src = self.regions.extents(region, len);
        let Movers(_, peers, engine, local, _) = self.movers();
        let Some(c) = peers[next as usize].conn.as_ref() else {
            return; // checked above
        };
        let at = &mut ExtentPos::default();
        match copy_to_sgl(engine, local, c.win(), &src, at, 0, &to_wire(&ch.next_sgl)) {
            Ok(()) => {
                peers[next as usize].counters.bytes_out += u64::from(len);
                self.emit(next, Ring::Cq, &Msg::ChainDone { op, origin, len });
            }
            // The successor's grant table mid-edit at every look: no reason
            // to end that connection; the chain stops here, as when too
            // late, and the rest of it gives its storage back.
            Err(SglCopyError::Busy) => self.release_next(ch, origin, op),
            Err(SglCopyError::Failed) => self.doomed.push(next),
        }
    }

    /// `ChainRts` (target): allocate storage for our place in a chain;
    /// clear to send once the successor's storage is known.
    pub(crate) fn on_chain_rts(
        &mut self,
        p: Port,
        op: u64,
        len: u32,
        prev: Port,
        next: Option<Port>,
    ) {
        // A refused request: the next target's storage that came before
        // it will never be written.
        if !self.fresh(p, Ring::Rx, op) {
            return self.release_early(p, op);
        }
        let ports = self.peers.len();
        let me = self.me;
        let ok_port = |x: Port| (x as usize) < ports && x != me;
        let valid = ok_port(prev) && next.is_none_or(|n| ok_port(n) && n != p && n != prev);
        if !valid {
            self.count(p, DropKind::OutOfRange);
            self.release_early(p, op);
            return self.nak(p, op, WireStatus::Protocol);
        }
        if !self.within_quota(p, op, len) || !self.within_grant_share(p, op, 1, None) {
            return self.release_early(p, op);
        }
        // Storage only the previous link of the chain writes.
        let Ok(key) = self.storage_for(len, prev) else {
            self.release_early(p, op);
            return self.nak(p, op, WireStatus::NoRoom);
        };
        let more = self.regions.grant_entries(key);
        if !self.within_grant_share(p, op, more, Some(key)) {
            return self.release_early(p, op);
        }
        let link = ChainLink {
            prev,
            next,
            next_sgl: Vec::new(),
            next_got: 0,
            next_inc: 0,
            cts_sent: false,
            cancelled: false,
        };
        self.serve_deposit(p, op, key, len, Some(Box::new(link)));
        // The next target's storage may have come before our request.
        let mut early = Vec::new();
        self.chain_early.retain(|e| {
            let mine = e.origin == p && e.op == op;
            if mine {
                early.push((e.from, e.start, e.sges.clone()));
            }
            !mine
        });
        for (from, start, sges) in early {
            self.on_chain_sgl(from, p, op, start, &sges);
        }
        if next.is_none() {
            self.chain_cts(p, op);
        }
    }

    /// Chain target: the successor's storage is complete (or there is
    /// none): send ours to our predecessor.
    fn chain_cts(&mut self, origin: Port, op: u64) {
        let Some(c) = self.peers[origin as usize].conn.as_mut() else {
            return;
        };
        let deadline_now = self.cfg.op_deadline();
        let Some(InOp::McRecv {
            region,
            len,
            chain: Some(ch),
            deadline,
            ..
        }) = c.served_mut(op)
        else {
            return;
        };
        if ch.cts_sent {
            return;
        }
        ch.cts_sent = true;
        // From now on our storage waits for the data: as long as the
        // initiator waits for the whole chain, not less.
        *deadline = deadline_now;
        let (prev, region, len) = (ch.prev, *region, *len);
        let next = ch.holding_next();
        let ext = self.regions.extents(region, len);
        let refuse = |t: &mut Self, status: WireStatus| {
            if let Some(n) = next {
                t.release_storage(n, origin, op);
            }
            t.end_served(origin, op);
            t.nak(origin, op, status);
        };
        if prev != origin && self.peers[prev as usize].conn.is_none() {
            return refuse(self, WireStatus::Protocol);
        }
        // Our storage scattered into more extents than our queue to the
        // previous link can carry now: refused (the origin's request, and a
        // backlog towards a third port, never reset that port's link).
        if !self.sgl_fits(prev, wire::sgl_msgs(&ext)) {
            self.count(origin, DropKind::Overload);
            return refuse(self, WireStatus::NoRoom);
        }
        if prev == origin {
            return self.emit_sgl(origin, op, &ext);
        }
        let mut msgs = Vec::new();
        wire::chunk_sgl(&ext, |start, n, sges| {
            msgs.push(Msg::ChainSgl {
                op,
                origin,
                start,
                n,
                sges,
            })
        });
        for m in &msgs {
            self.emit(prev, Ring::Tx, m);
        }
    }

    /// Chain target: part of the next target's storage, from it (kept
    /// aside when it comes before the initiator's request).
    pub(crate) fn on_chain_sgl(
        &mut self,
        s: Port,
        origin: Port,
        op: u64,
        start: u32,
        sges: &[WireSge],
    ) {
        if origin as usize >= self.peers.len() || origin == self.me || origin == s {
            return self.count(s, DropKind::UnknownOp);
        }
        // Which host on `s`'s port gives this storage.
        let sender_inc = self.peers[s as usize].peer_inc;
        let deadline_now = self.cfg.op_deadline();
        let Some(c) = self.peers[origin as usize].conn.as_mut() else {
            // No connection to the origin yet (a handshake completes on
            // one side first): kept for its request, as below, and
            // released if none comes.
            return self.keep_early(s, origin, op, start, sges);
        };
        let total: u64 = sges.iter().map(|x| u64::from(x.len)).sum();
        let may_start = c.may_start(Ring::Rx, op);
        match c.served_mut(op) {
            Some(InOp::McRecv {
                len,
                chain: Some(ch),
                deadline,
                ..
            }) if ch.next == Some(s) && !ch.cts_sent => {
                if start != ch.next_got
                    || u64::from(start) + total > u64::from(*len)
                    || !storage_entries(start, sges, *len)
                {
                    if let Some(io) = c.unserve(op) {
                        self.served_ended(&io);
                    }
                    self.count(s, DropKind::OutOfRange);
                    // We will write none of the next target's storage.
                    self.release_storage(s, origin, op);
                    return self.nak(origin, op, WireStatus::Protocol);
                }
                if ch.next_got == 0 {
                    ch.next_inc = sender_inc;
                }
                ch.next_sgl
                    .extend(sges.iter().map(|x| (x.offset, u64::from(x.len))));
                ch.next_got += total as u32;
                *deadline = deadline_now;
                if ch.next_got == *len {
                    self.chain_cts(origin, op);
                }
            }
            // More of it once our clear-to-send is out: not storage we take.
            Some(InOp::McRecv {
                chain: Some(ch), ..
            }) if ch.next == Some(s) => self.count(s, DropKind::UnknownOp),
            // Storage from a port that is not our next link (its origin may
            // have told it we are its previous one): we will never write it.
            Some(_) => self.release_storage(s, origin, op),
            None if may_start => self.keep_early(s, origin, op, start, sges),
            // An operation we saw and do not serve (refused, cancelled or
            // over): we will never write this storage.
            None if !may_start => {
                self.release_storage(s, origin, op);
            }
            None => self.count(s, DropKind::UnknownOp),
        }
    }

    /// Keeps part of a next target's storage that came before our own
    /// request (bounded: [`EARLY_PER_PAIR`] for one origin from one sender,
    /// [`EARLY_MAX_PER_PORT`] per port in all; past that it is released at
    /// once and counted against the sender).
    fn keep_early(&mut self, s: Port, origin: Port, op: u64, start: u32, sges: &[WireSge]) {
        let most = EARLY_MAX_PER_PORT * self.peers.len();
        if self.chain_early.len() >= most
            || self
                .chain_early
                .iter()
                .filter(|e| e.from == s && e.origin == origin)
                .count()
                >= EARLY_PER_PAIR
        {
            // No room to keep it: we will not write it, so say so at once.
            self.count(s, DropKind::Overload);
            return self.release_storage(s, origin, op);
        }
        self.chain_early.push(EarlySgl {
            origin,
            op,
            from: s,
            start,
            sges: sges.to_vec(),
            at: Instant::now(),
        });
    }

    /// Our connection to `peer` ended: the next targets' storage kept for
    /// its operations is released (they will never be served), and what
    /// `peer` itself sent us as a next target goes.
    pub(crate) fn forget_early(&mut self, peer: Port) {
        let mut release = Vec::new();
        self.chain_early.retain(|e| {
            if e.origin == peer && !release.contains(&(e.from, e.op)) {
                release.push((e.from, e.op));
            }
            e.origin != peer && e.from != peer
        });
        for (s, op) in release {
            self.release_storage(s, peer, op);
        }
    }

    /// `Sgl` from a multicast target (initiator): part of its storage; once
    /// complete it is ready (in a chain, the first target's readiness means
    /// the whole chain's).
    pub(crate) fn on_multicast_sgl(&mut self, p: Port, op: u64, start: u32, sges: &[WireSge]) {
        let Some(o) = self.ops.get_mut(&op) else {
            return self.count(p, DropKind::UnknownOp);
        };
        let OutKind::Multicast {
            targets,
            len,
            put: false,
            chain,
            ..
        } = &mut o.kind
        else {
            return self.count(p, DropKind::UnknownOp);
        };
        // In a chain only the first target answers us.
        let chain = *chain;
        let Some(t) = targets
            .iter_mut()
            .enumerate()
            .find(|(i, t)| t.peer == p && !t.ready && t.status.is_none() && (!chain || *i == 0))
            .map(|(_, t)| t)
        else {
            return self.count(p, DropKind::UnknownOp);
        };
        let total: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        if start != t.got
            || u64::from(start) + total > u64::from(*len)
            || !storage_entries(start, sges, *len)
        {
            self.count(p, DropKind::OutOfRange);
            return self.mc_target_failed(op, p, Status::Protocol);
        }
        t.sgl
            .extend(sges.iter().map(|s| (s.offset, u64::from(s.len))));
        t.got += total as u32;
        // The operation's deadline stays a timeout after the post (no put
        // may come later anyway): a target sending crumbs of storage
        // slowly cannot keep the multicast open.
        let ready = t.got == *len;
        t.ready = ready;
        if ready {
            if chain {
                // The first target's clear-to-send comes only once the
                // whole chain is ready.
                for t in targets.iter_mut() {
                    t.ready = true;
                }
            }
            self.mc_maybe_put(op);
        }
    }

    /// `Ack` from a multicast target (initiator): its outcome.
    pub(crate) fn on_multicast_ack(&mut self, p: Port, op: u64, status: WireStatus, len: u32) {
        let Some(OutKind::Multicast {
            targets,
            len: l,
            chain,
            ..
        }) = self.ops.get_mut(&op).map(|o| &mut o.kind)
        else {
            return self.count(p, DropKind::UnknownOp);
        };
        // The data went its way: we copied it to this target, or (a chain)
        // to the first, which forwards it.
        let first_copied = targets.first().is_some_and(|f| f.copied);
        let Some(t) = targets
            .iter_mut()
            .find(|t| t.peer == p && t.status.is_none())
        else {
            return self.count(p, DropKind::UnknownOp);
        };
        let reached = if *chain { first_copied } else { t.copied };
        let s = match status {
            WireStatus::Ok if reached && t.ready && len == *l => Status::Success,
            WireStatus::Ok => Status::Protocol,
            other => status_of(other),
        };
        self.mc_target_failed(op, p, s);
    }

    /// Records the outcome of target `p` of multicast `op` (success too),
    /// then puts when the check-in counter reaches zero, and completes when
    /// every target is resolved.
    pub(crate) fn mc_target_failed(&mut self, op: u64, p: Port, status: Status) {
        let Some(OutKind::Multicast { targets, chain, .. }) =
            self.ops.get_mut(&op).map(|o| &mut o.kind)
        else {
            return;
        };
        // Targets the put will not reach, told so when the data did not go
        // their way (we copied it to neither them nor, in a chain, the
        // first): none of their storage is written any more, so it can go
        // at once. Where it went, data may still be on its way down a chain;
        // their storage goes with the `Done` or at the target's timeout.
        let chain = *chain;
        let first_copied = targets.first().is_some_and(|f| f.copied);
        let unreached = |t: &McTarget| !(if chain { first_copied } else { t.copied });
        let mut cancel = Vec::new();
        if let Some(t) = targets
            .iter_mut()
            .find(|t| t.peer == p && t.status.is_none())
        {
            t.status = Some(status);
            if unreached(t) {
                cancel.push(p);
            }
        }
        if chain && !status.is_ok() {
            // A broken chain: the other targets will not get the data either.
            for t in targets.iter_mut().filter(|t| t.status.is_none()) {
                t.status = Some(status);
                if unreached(t) {
                    cancel.push(t.peer);
                }
            }
        }
        if !status.is_ok() {
            for t in cancel {
                self.emit(t, Ring::Rx, &Msg::Cancel { op });
            }
        }
        self.mc_maybe_put(op);
    }

    /// `Cancel` (target): the initiator `p` will put nothing for its
    /// multicast `op`. Our storage for it goes now unless another target
    /// may still write it: a chain link whose storage went to a previous
    /// target keeps it until that target releases it (`ChainRelease`) or
    /// is done with it (`ChainDone`), or, past the operation's timeout, for
    /// two more timeouts set aside, so that only the one peer that may write
    /// a range can end its use, never the initiator for it. A next
    /// target's storage we hold, from the request or from before it, is
    /// released to that target. Only `p`'s own operations can be
    /// cancelled (they are served per connection); a cancel of one we no
    /// longer serve (it timed out, or we refused it) is no error.
    pub(crate) fn on_cancel(&mut self, p: Port, op: u64) {
        let Some(c) = self.peers[p as usize].conn.as_mut() else {
            return;
        };
        // A cancel comes behind its request on the same ring: one for an
        // operation not requested yet is no cancel of anything.
        if c.may_start(Ring::Rx, op) {
            return;
        }
        if let Some(InOp::McRecv { chain, .. }) = c.served_mut(op) {
            let (next, written_by_other) = match chain.as_deref_mut() {
                Some(ch) => {
                    let next = ch.holding_next();
                    let kept = ch.prev != p && ch.cts_sent;
                    if kept {
                        // Whatever `prev` still does, nothing of ours goes
                        // on to the storage we release now.
                        ch.cancelled = true;
                        ch.next_sgl = Vec::new();
                        ch.next_got = 0;
                    }
                    (next, kept)
                }
                None => (None, false),
            };
            if let Some(n) = next {
                self.release_storage(n, p, op);
            }
            if !written_by_other {
                self.end_served(p, op);
            }
        }
        self.release_early(p, op);
    }

    /// `ChainRelease` (chain target): our previous target `s` will never
    /// write the storage we gave it for op `op` of `origin`: it goes now,
    /// and the next target's storage we hold is released in turn. From
    /// anyone but that previous target it changes nothing.
    pub(crate) fn on_chain_release(&mut self, s: Port, origin: Port, op: u64) {
        if origin as usize >= self.peers.len() || origin == self.me || origin == s {
            return self.count(s, DropKind::OutOfRange);
        }
        let served = self.peers[origin as usize]
            .conn
            .as_ref()
            .and_then(|c| c.served(op));
        let Some(InOp::McRecv {
            chain: Some(ch), ..
        }) = served
        else {
            self.release_kept(s, origin, op);
            return;
        };
        if ch.prev != s {
            if !self.release_kept(s, origin, op) {
                self.count(s, DropKind::UnknownOp);
            }
            return;
        }
        if let Some(n) = ch.holding_next() {
            self.release_storage(n, origin, op);
        }
        self.end_served(origin, op);
    }

    /// Tells `to`, the next link of chain op `op` of `origin`, that we will
    /// never write the storage it gave us (`ChainRelease`).
    pub(crate) fn release_storage(&mut self, to: Port, origin: Port, op: u64) {
        self.emit(to, Ring::Cq, &Msg::ChainRelease { op, origin });
    }

    /// [`release_storage`](Self::release_storage) to `ch`'s next link, if
    /// we hold any of the storage it gave us.
    pub(crate) fn release_next(&mut self, ch: &ChainLink, origin: Port, op: u64) {
        if let Some(n) = ch.holding_next() {
            self.release_storage(n, origin, op);
        }
    }

    /// Stops serving `origin`'s op `op` and frees what it held.
    pub(crate) fn end_served(&mut self, origin: Port, op: u64) {
        if let Some(io) = self.peers[origin as usize]
            .conn
            .as_mut()
            .and_then(|c| c.unserve(op))
        {
            self.served_ended(&io);
        }
    }

    /// `origin`'s op `op`, which we stopped serving without finishing it
    /// (it timed out, or the connection to `origin` ended): frees what it
    /// held and, for a chain link, releases the next target's storage,
    /// which we will never write. A chain link's own storage that its
    /// previous link (another peer) may still write is set aside instead
    /// of freed, until that link is done with it (see [`KeptStorage`]):
    /// that link's deadline restarted at its own clear-to-send, after
    /// ours, so an honest one may still forward after we give up.
    pub(crate) fn served_abandoned(&mut self, origin: Port, op: u64, io: InOp) {
        if let InOp::McRecv {
            chain: Some(ref ch),
            ..
        } = io
        {
            self.release_next(ch, origin, op);
        }
        match io {
            InOp::McRecv {
                region,
                len,
                chain: Some(ch),
                ..
            } if ch.prev != origin && ch.cts_sent && !self.lost => {
                self.set_aside(origin, op, ch.prev, region, len);
            }
            io => self.served_ended(&io),
        }
    }

    /// Sets storage `region` (`len` bytes, for `origin`'s op `op`) aside,
    /// unused, while `writer` may still write it (see [`KeptStorage`]).
    pub(crate) fn set_aside(
        &mut self,
        origin: Port,
        op: u64,
        writer: Port,
        region: RegionKey,
        len: u32,
    ) {
        self.kept_storage.push(KeptStorage {
            origin,
            op,
            prev: writer,
            region,
            len,
            at: Instant::now(),
        });
    }

    /// The previous link `from` is done with the storage we set aside for
    /// op `op` of `origin` (its `ChainDone` or `ChainRelease`): it goes.
    /// Whether there was such storage.
    pub(crate) fn release_kept(&mut self, from: Port, origin: Port, op: u64) -> bool {
        let Some(i) = self
            .kept_storage
            .iter()
            .position(|k| k.origin == origin && k.op == op && k.prev == from)
        else {
            return false;
        };
        let k = self.kept_storage.swap_remove(i);
        let _ = self.regions.deregister(k.region);
        true
    }

    /// Frees the storage set aside that `pred` selects.
    pub(crate) fn free_kept(&mut self, pred: impl Fn(&KeptStorage) -> bool) {
        let mut gone = Vec::new();
        self.kept_storage.retain(|k| {
            if pred(k) {
                gone.push(k.region);
            }
            !pred(k)
        });
        for region in gone {
            let _ = self.regions.deregister(region);
        }
    }

    /// Drops the next targets' storage kept for `origin`'s op `op` from
    /// before its request (we will not serve it), releasing each to its
    /// sender.
    fn release_early(&mut self, origin: Port, op: u64) {
        let mut from = Vec::new();
        self.chain_early.retain(|e| {
            let mine = e.origin == origin && e.op == op;
            if mine && !from.contains(&e.from) {
                from.push(e.from);
            }
            !mine
        });
        for s in from {
            self.release_storage(s, origin, op);
        }
    }

    /// Puts to every target once none is still waiting for its storage
    /// (the check-in counter at zero), then completes once every target's
    /// outcome is known.
    pub(crate) fn mc_maybe_put(&mut self, op: u64) {
        let lost = self.lost;
        let put_window = self.cfg.copy_window();
        let timeout = self.cfg.op_timeout;
        let Movers(ops, peers, engine, local, _) = self.movers();
        let Some(o) = ops.get_mut(&op) else {
            return;
        };
        let OutKind::Multicast {
            posted,
            src,
            len,
            targets,
            put,
            chain,
        } = &mut o.kind
        else {
            return;
        };
        // Whether it is too late to write a target's storage: it may have
        // given it up (and, stalled or slow, we may only now read its
        // answer). Asked before each copy, as earlier copies take time (a
        // single copy longer than a quarter of the timeout is not covered).
        let posted = *posted;
        let late = || posted.elapsed() >= put_window;
        let mut was_late = false;
        let (len, chain) = (*len, *chain);
        // The check-in counter: targets neither ready nor failed.
        let waiting = targets
            .iter()
            .filter(|t| !t.ready && t.status.is_none())
            .count();
        // The targets to copy to: fan-out, each; chain, the first. After
        // the put, those still not copied found their grant table mid-edit.
        let to_copy =
            |i: usize, t: &McTarget| t.status.is_none() && !t.copied && (!chain || i == 0);
        let mut busy = Vec::new();
        if waiting == 0 && targets.iter().enumerate().any(|(i, t)| to_copy(i, t)) {
            *put = true;
            let mut dones = Vec::new();
            // The targets the put did not reach (its copy failed, or, in a
            // chain, the first link's did): they hold storage only we
            // wrote, and are told to let it go.
            let mut missed = Vec::new();
            // Fan-out: one copy per target. Chain: to the first only; it
            // deposits and forwards.
            for (_, t) in targets
                .iter_mut()
                .enumerate()
                .filter(|(i, t)| to_copy(*i, t))
            {
                let Some(c) = peers[t.peer as usize].conn.as_ref().filter(|_| !lost) else {
                    t.status = Some(Status::PeerDown);
                    continue;
                };
                if late() {
                    was_late = true;
                    t.status = Some(Status::Timeout);
                    missed.push(t.peer);
                    continue;
                }
                let at = &mut ExtentPos::default();
                match copy_to_sgl(engine, local, c.win(), src, at, 0, &to_wire(&t.sgl)) {
                    Ok(()) => {
                        t.copied = true;
                        peers[t.peer as usize].counters.bytes_out += u64::from(len);
                        dones.push(t.peer);
                    }
                    // Its grant table mid-edit at every look: tried again
                    // (from the slow path, or the next answer), until its
                    // copy window closes.
                    Err(SglCopyError::Busy) => busy.push(t.peer),
                    Err(SglCopyError::Failed) => {
                        t.status = Some(Status::PeerDown);
                        missed.push(t.peer);
                    }
                }
            }
            if chain && dones.is_empty() && busy.is_empty() {
                let status = if was_late {
                    Status::Timeout
                } else {
                    Status::PeerDown
                };
                for t in targets.iter_mut().filter(|t| t.status.is_none()) {
                    t.status = Some(status);
                    missed.push(t.peer);
                }
            }
            if !dones.is_empty() {
                // The targets' acknowledgements get a whole timeout from
                // the end of the copies.
                o.deadline = saturating_after(timeout);
            }
            for d in dones {
                self.emit(d, Ring::Cq, &Msg::Done { op, len });
            }
            for t in missed {
                self.emit(t, Ring::Rx, &Msg::Cancel { op });
            }
        }
        for p in busy {
            let key = (p, op, ParkedKind::Put);
            if !self.parked.holds(key) {
                self.park_sgl(key, 0, &[]);
            }
        }
        let Some(OutKind::Multicast { targets, .. }) = self.ops.get(&op).map(|o| &o.kind) else {
            return;
        };
        if targets.iter().all(|t| t.status.is_some()) {
            let worst = targets
                .iter()
                .find(|t| t.status != Some(Status::Success))
                .and_then(|t| t.status)
                .unwrap_or(Status::Success);
            let bytes = if worst.is_ok() { u64::from(len) } else { 0 };
            self.finish(op, worst, bytes);
        }
    }
}

/// Whether SGL entries `sges`, continuing at transfer offset `start` a
/// multicast of `len` bytes, are as a target's storage makes them: whole
/// extents of a fresh region, each at least [`GRAIN`] bytes but the one
/// that ends the transfer (the decoder already refused empty ones). We keep
/// these lists until the put, 16 bytes an entry: shorter entries would let
/// a peer make us hold up to 16 times the transfer.
fn storage_entries(start: u32, sges: &[WireSge], len: u32) -> bool {
    let (mut at, len) = (u64::from(start), u64::from(len));
    sges.iter().all(|s| {
        let l = u64::from(s.len);
        at += l;
        l >= GRAIN || at >= len
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target's storage scattered in extents of whole 16 MiB (longer than
    /// one entry holds) is chunked into entries its own check accepts: the
    /// split pieces are whole grains, not a 16 MiB - 1 entry and a 1-byte
    /// one, which the initiator refused from an honest target.
    #[test]
    fn storage_split_at_the_entry_limit_passes_the_storage_check() {
        const MIB: u64 = 1 << 20;
        let ext = [
            (0, 16 * MIB),
            (32 * MIB, 4 * MIB),
            (48 * MIB, 32 * MIB + 64),
        ];
        let len = ext.iter().map(|e| e.1).sum::<u64>() as u32;
        let mut msgs = 0;
        wire::chunk_sgl(&ext, |start, n, sges| {
            msgs += 1;
            assert!(
                storage_entries(start, &sges[..n as usize], len),
                "{:?}",
                &sges[..n as usize]
            );
        });
        assert!(msgs > 0);
    }
}
