//! Progress: polling the queues in place, validating every message from a
//! peer against our state, moving data, and completing operations.

use std::time::Instant;

use crate::hw::{LocalWindow, PeerWindow, Port};

use super::conn::{CQ, ChainLink, InOp, POSTQ, Peer, RX, TX};
use super::counters::DropKind;
use super::dma::DmaEngine;
use super::endpoint::{EarlySgl, OutKind, Transport};
use super::error::Status;
use super::region::{Access, RegionKey};
use super::sgl::ExtentCursor;
use super::types::{Completion, OpKind, PeerState};
use super::wire::{self, Limits, Msg, Queue, SGES_PER_MSG, WireError, WireSge, WireStatus};

fn drop_kind(e: WireError) -> DropKind {
    match e {
        WireError::UnknownCode(_) | WireError::Malformed => DropKind::Malformed,
        WireError::WrongQueue => DropKind::WrongQueue,
        WireError::OutOfRange => DropKind::OutOfRange,
    }
}

fn status_of(s: WireStatus) -> Status {
    match s {
        WireStatus::Ok => Status::Success,
        WireStatus::Access => Status::RemoteAccess,
        WireStatus::Protocol => Status::Protocol,
        WireStatus::NoRoom => Status::TooLarge,
    }
}

/// Copies transfer bytes `start..` of `src` (our window) to the entries of
/// `sges` (the peer's window), in order. `false` if a piece failed or the
/// source does not cover the range.
fn copy_pieces(
    engine: &mut dyn DmaEngine,
    local: &LocalWindow,
    win: &PeerWindow,
    src: &mut ExtentCursor,
    start: u64,
    sges: &[WireSge],
) -> bool {
    let mut pos = start;
    for s in sges {
        let mut d = s.offset as usize;
        let ok = src.for_range(pos, u64::from(s.len), |so, sl| {
            let r = engine
                .copy_to_peer(local, so as usize, win, d, sl as usize)
                .is_ok();
            d += sl as usize;
            r
        });
        if !ok {
            return false;
        }
        pos += u64::from(s.len);
    }
    true
}

fn to_wire(ext: &[(u64, u64)]) -> Vec<WireSge> {
    ext.iter()
        .map(|&(o, l)| WireSge {
            offset: o,
            len: l as u32,
        })
        .collect()
}

/// What delivering a send touches, borrowed apart from the peer so the
/// PostQ loop can deliver while it holds the connection.
struct Sink<'a> {
    p: Port,
    local: &'a LocalWindow,
    engine: &'a mut dyn DmaEngine,
    layout: &'a super::geometry::Layout,
    completions: &'a mut std::collections::VecDeque<Completion>,
    doomed: &'a mut Vec<Port>,
}

impl Sink<'_> {
    /// Hands an eager message (inline bytes, or eager buffer `buf` of
    /// `len` bytes) to the oldest posted receive, returns a lent buffer to
    /// the peer, and completes the receive.
    fn deliver(&mut self, peer: &mut Peer, buf: Option<(u32, u32)>, inline: &[u8]) {
        let p = self.p;
        let Some(wr) = peer.recvs.pop_front() else {
            return;
        };
        let len = buf.map_or(inline.len() as u64, |b| u64::from(b.1));
        let mut status = Status::Success;
        if len > wr.len {
            status = Status::LocalLength;
        } else {
            let mut at = 0u64;
            for &(o, l) in wr.extents.as_slice() {
                if at >= len {
                    break;
                }
                let n = l.min(len - at);
                let r = match buf {
                    None => self
                        .local
                        .write(o as usize, &inline[at as usize..(at + n) as usize]),
                    Some((b, _)) => self.engine.copy_local(
                        self.local,
                        self.layout.eager_buffer(p, b) + at as usize,
                        o as usize,
                        n as usize,
                    ),
                };
                if r.is_err() {
                    status = Status::Protocol;
                    break;
                }
                at += n;
            }
        }
        if let (Some((b, _)), Some(c)) = (buf, peer.conn.as_mut()) {
            c.lent[b as usize] = false;
            if c.lend(b).is_err() {
                self.doomed.push(p);
            }
        }
        if status.is_ok() {
            peer.counters.recvs += 1;
            peer.counters.bytes_in += len;
        } else {
            peer.counters.failed_ops += 1;
        }
        self.completions.push_back(Completion {
            peer: p,
            op: OpKind::Recv,
            status,
            bytes: if status.is_ok() { len } else { 0 },
            cookie: wr.cookie,
            region: None,
        });
    }
}

impl Transport {
    /// One round of progress: link events and handshakes (every so often),
    /// every connected peer's queues, backlogs, credits and timeouts.
    /// Returns how many messages were handled.
    pub fn progress(&mut self) -> usize {
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(64) || self.connected.len() + 1 < self.peers.len() {
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
            self.teardown(p, Status::PeerDown);
        }
        work
    }

    fn slow_path(&mut self, now: Instant) {
        let _ = self.dev.service();
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
                if peer.state == PeerState::Down {
                    match self.dev.link(p) {
                        Ok(l) if l.up => self.link_up(p, l.generation),
                        _ => self.peers[p as usize].last_hello_sent = Some(now),
                    }
                } else {
                    self.send_hello(p);
                }
            }
        }
        self.expire(now);
    }

    fn expire(&mut self, now: Instant) {
        let timeout = self.cfg.op_timeout;
        let stale: Vec<Port> = self
            .chain_early
            .iter()
            .filter(|e| now.duration_since(e.at) >= timeout)
            .map(|e| e.from)
            .collect();
        self.chain_early
            .retain(|e| now.duration_since(e.at) < timeout);
        for from in stale {
            self.count(from, DropKind::UnknownOp);
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
        for i in 0..self.connected.len() {
            let p = self.connected[i] as usize;
            let Some(c) = self.peers[p].conn.as_mut() else {
                continue;
            };
            let old: Vec<u64> = c
                .inbound
                .iter()
                .filter(|(_, o)| o.deadline() <= now)
                .map(|(id, _)| *id)
                .collect();
            for id in old {
                if let Some(InOp::McRecv { region, .. }) = c.inbound.remove(&id) {
                    let _ = self.regions.deregister(region);
                }
            }
        }
    }

    fn poll_peer(&mut self, p: Port) -> usize {
        let g = self.cfg.geometry;
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut delivered = 0;
        {
            let Self {
                peers,
                local,
                engine,
                layout,
                completions,
                doomed,
                ..
            } = self;
            let peer = &mut peers[p as usize];
            let Some(c) = peer.conn.as_mut() else {
                self.scratch = scratch;
                return 0;
            };
            let limits = Limits {
                max_len: u32::MAX,
                region_start: layout.region_area_start() as u64,
                window_len: c.win.len() as u64,
                eager_count: g.eager_count,
                eager_size: g.eager_size,
            };
            c.poll_freeq(local, &mut peer.counters);
            for (k, q) in [(CQ, Queue::Cq), (TX, Queue::Tx), (RX, Queue::Rx)] {
                for _ in 0..g.queue_depth {
                    let Some(b) = c.cons[k].peek(local) else {
                        break;
                    };
                    c.cons[k].advance();
                    match wire::decode_validated(&b, q, &limits) {
                        Ok(m) => scratch.push(m),
                        Err(e) => peer.counters.drop_one(drop_kind(e)),
                    }
                }
            }
            // Sends are handed to posted receives right here, in order (no
            // detour through `scratch`): this is the small-message fast path.
            let mut sink = Sink {
                p,
                local,
                engine: engine.as_mut(),
                layout,
                completions,
                doomed,
            };
            while !peer.recvs.is_empty() {
                let Some(c) = peer.conn.as_mut() else { break };
                let Some(b) = c.cons[POSTQ].peek(local) else {
                    c.cons[POSTQ].prefetch_ahead(local, 1);
                    break;
                };
                if b[0] == wire::code::SEND_INLINE_LONG {
                    // A run of slots, published by its last tag: take it
                    // once every slot is there, validate it as a unit.
                    let slots = match wire::decode_inline_head(&b) {
                        Ok((_, k)) => k,
                        Err(e) => {
                            c.cons[POSTQ].advance();
                            peer.counters.drop_one(drop_kind(e));
                            continue;
                        }
                    };
                    let mut conts = [[0u8; wire::BODY]; wire::INLINE_SLOTS_MAX - 1];
                    let mut complete = true;
                    for k in 1..slots {
                        match c.cons[POSTQ].peek_ahead(local, k as u64) {
                            Some(x) => conts[k - 1] = x,
                            None => {
                                complete = false;
                                break;
                            }
                        }
                    }
                    if !complete {
                        break;
                    }
                    c.cons[POSTQ].advance_by(slots as u64);
                    let mut payload = [0u8; wire::INLINE_LONG_MAX];
                    match wire::gather_inline(&b, &conts[..slots - 1], &mut payload) {
                        Ok(len) => {
                            sink.deliver(peer, None, &payload[..len]);
                            delivered += 1;
                        }
                        Err(e) => peer.counters.drop_one(drop_kind(e)),
                    }
                    continue;
                }
                c.cons[POSTQ].advance();
                match wire::decode_validated(&b, Queue::PostQ, &limits) {
                    Ok(Msg::SendInline { len, data }) => {
                        sink.deliver(peer, None, &data[..(len as usize).min(data.len())]);
                        delivered += 1;
                    }
                    Ok(Msg::SendBuf { buf, len }) => {
                        let lent = peer
                            .conn
                            .as_ref()
                            .is_some_and(|c| c.lent.get(buf as usize).copied().unwrap_or(false));
                        if lent {
                            sink.deliver(peer, Some((buf, len)), &[]);
                            delivered += 1;
                        } else {
                            peer.counters.drop_one(DropKind::BadBuffer);
                        }
                    }
                    // Only sends are valid on the PostQ (checked by the
                    // decoder); anything else is counted, never acted on.
                    Ok(_) => peer.counters.drop_one(DropKind::WrongQueue),
                    Err(e) => peer.counters.drop_one(drop_kind(e)),
                }
            }
            if scratch.is_empty() && delivered == 0 {
                peer.counters.empty_polls += 1;
            }
        }
        let n = scratch.len() + delivered;
        for m in scratch.drain(..) {
            self.handle(p, m);
        }
        self.scratch = scratch;
        let peer = &mut self.peers[p as usize];
        if let Some(c) = peer.conn.as_mut() {
            let batch = u64::from(g.queue_depth / 4).max(1);
            let need_credit = c.cons.iter().any(|q| q.uncredited() >= batch);
            let r = c
                .flush(&self.local, &mut peer.counters)
                .and_then(|_| if need_credit { c.credit() } else { Ok(()) });
            if r.is_err() {
                self.doomed.push(p);
            }
        }
        n
    }

    /// Registers a fresh inbound op id on `ring` (0: RX, 1: TX); `false`
    /// (counted) for a replay, or (refused with an error `Ack`) when we
    /// already serve `max_outstanding` operations for this peer.
    fn fresh(&mut self, p: Port, ring: usize, op: u64) -> bool {
        let limit = self.cfg.max_outstanding;
        let peer = &mut self.peers[p as usize];
        let Some(c) = peer.conn.as_mut() else {
            return false;
        };
        if op <= c.hwm[ring] || c.inbound.contains_key(&op) {
            peer.counters.drop_one(DropKind::Replay);
            return false;
        }
        c.hwm[ring] = op;
        if c.inbound.len() >= limit {
            // Serving too much for this peer already: refuse this one.
            peer.counters.drop_one(DropKind::Overload);
            let nak = Msg::Ack {
                op,
                status: WireStatus::NoRoom,
                len: 0,
            };
            self.emit(p, CQ, &nak);
            return false;
        }
        true
    }

    fn count(&mut self, p: Port, kind: DropKind) {
        self.peers[p as usize].counters.drop_one(kind);
    }

    fn inbound_insert(&mut self, p: Port, op: u64, io: InOp) {
        if let Some(c) = self.peers[p as usize].conn.as_mut() {
            c.inbound.insert(op, io);
        }
    }

    fn emit_sgl(&mut self, p: Port, op: u64, ext: &[(u64, u64)]) {
        let mut msgs = Vec::new();
        wire::chunk_sgl(ext, |start, n, sges| {
            msgs.push(Msg::Sgl { op, start, n, sges })
        });
        for m in &msgs {
            self.emit(p, TX, m);
        }
    }

    fn handle(&mut self, p: Port, m: Msg) {
        if self.peers[p as usize].conn.is_none() {
            return;
        }
        // Only the messages that start an operation need the clock.
        let timeout = self.cfg.op_timeout;
        let deadline = || Instant::now() + timeout;
        match m {
            Msg::WriteReq {
                op,
                rkey,
                roff,
                len,
            } => {
                if !self.fresh(p, 0, op) {
                    return;
                }
                match self.regions.resolve(
                    RegionKey(rkey),
                    roff,
                    u64::from(len),
                    Access::REMOTE_WRITE,
                ) {
                    Err(_) => {
                        self.count(p, DropKind::Access);
                        self.emit(
                            p,
                            CQ,
                            &Msg::Ack {
                                op,
                                status: WireStatus::Access,
                                len: 0,
                            },
                        );
                    }
                    Ok(ext) => {
                        self.inbound_insert(
                            p,
                            op,
                            InOp::Write {
                                len,
                                deadline: deadline(),
                            },
                        );
                        self.emit_sgl(p, op, &ext);
                    }
                }
            }
            Msg::Rts { op, len } => {
                if !self.fresh(p, 0, op) {
                    return;
                }
                match self.regions.register(u64::from(len), Access::LOCAL, None) {
                    Err(_) => self.emit(
                        p,
                        CQ,
                        &Msg::Ack {
                            op,
                            status: WireStatus::NoRoom,
                            len: 0,
                        },
                    ),
                    Ok(key) => {
                        let ext = self
                            .regions
                            .get(key)
                            .map(|r| r.slice(0, u64::from(len)))
                            .unwrap_or_default();
                        self.inbound_insert(
                            p,
                            op,
                            InOp::McRecv {
                                region: key,
                                len,
                                deadline: deadline(),
                                chain: None,
                            },
                        );
                        self.emit_sgl(p, op, &ext);
                    }
                }
            }
            Msg::ChainRts {
                op,
                len,
                prev,
                next,
            } => self.on_chain_rts(p, op, len, prev, next, deadline()),
            Msg::ChainSgl {
                op,
                origin,
                start,
                n,
                sges,
            } => self.on_chain_sgl(
                p,
                origin,
                op,
                start,
                &sges[..(n as usize).min(SGES_PER_MSG)],
            ),
            Msg::ChainDone { op, origin, len } => self.on_done(p, origin, op, len),
            Msg::ReadSize { op, status, len } => self.on_read_size(p, op, status, len),
            Msg::Sgl { op, start, n, sges } => {
                self.on_sgl(p, op, start, &sges[..(n as usize).min(SGES_PER_MSG)])
            }
            Msg::ReadReq {
                op,
                rkey,
                roff,
                len,
            } => {
                if !self.fresh(p, 1, op) {
                    return;
                }
                match self.regions.resolve(
                    RegionKey(rkey),
                    roff,
                    u64::from(len),
                    Access::REMOTE_READ,
                ) {
                    Err(_) => {
                        self.count(p, DropKind::Access);
                        self.emit(
                            p,
                            CQ,
                            &Msg::Ack {
                                op,
                                status: WireStatus::Access,
                                len: 0,
                            },
                        );
                    }
                    Ok(ext) => self.inbound_insert(
                        p,
                        op,
                        InOp::Read {
                            src: ExtentCursor::new(ext),
                            len,
                            delivered: 0,
                            deadline: deadline(),
                        },
                    ),
                }
            }
            Msg::ReadSgl { op, start, n, sges } => {
                self.on_read_sgl(p, op, start, &sges[..(n as usize).min(SGES_PER_MSG)])
            }
            Msg::ReadIntent { op, rkey, roff } => {
                let reply = match self.regions.get(RegionKey(rkey)) {
                    Some(r)
                        if r.access.contains(Access::REMOTE_READ)
                            && roff < r.len
                            && r.len - roff <= u64::from(u32::MAX) =>
                    {
                        Msg::ReadSize {
                            op,
                            status: WireStatus::Ok,
                            len: (r.len - roff) as u32,
                        }
                    }
                    _ => {
                        self.count(p, DropKind::Access);
                        Msg::ReadSize {
                            op,
                            status: WireStatus::Access,
                            len: 0,
                        }
                    }
                };
                self.emit(p, RX, &reply);
            }
            Msg::Done { op, len } => self.on_done(p, p, op, len),
            Msg::Ack { op, status, len } => self.on_ack(p, op, status, len),
            // Sends arrive on the PostQ only, handled in `poll_peer`.
            Msg::SendInline { .. } | Msg::SendBuf { .. } => {
                self.count(p, DropKind::WrongQueue);
            }
        }
    }

    fn on_read_size(&mut self, p: Port, op: u64, status: WireStatus, len: u32) {
        let Some(o) = self.ops.get(&op) else {
            return self.count(p, DropKind::UnknownOp);
        };
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
        let Ok(key) = self.regions.register(u64::from(len), Access::LOCAL, None) else {
            return self.finish(op, Status::TooLarge, 0);
        };
        let ext = self
            .regions
            .get(key)
            .map(|r| r.slice(0, u64::from(len)))
            .unwrap_or_default();
        let cookie = o.cookie;
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

    fn on_sgl(&mut self, p: Port, op: u64, start: u32, sges: &[WireSge]) {
        let timeout = self.cfg.op_timeout;
        let Self {
            ops,
            peers,
            engine,
            local,
            ..
        } = self;
        let Some(o) = ops.get_mut(&op) else {
            return peers[p as usize].counters.drop_one(DropKind::UnknownOp);
        };
        let total: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        match &mut o.kind {
            OutKind::Write {
                peer,
                src,
                len,
                delivered,
                done,
            } if *peer == p && !*done => {
                if start != *delivered || u64::from(start) + total > u64::from(*len) {
                    peers[p as usize].counters.drop_one(DropKind::OutOfRange);
                    return self.finish(op, Status::Protocol, 0);
                }
                let Some(c) = peers[p as usize].conn.as_ref() else {
                    return;
                };
                if !copy_pieces(engine.as_mut(), local, &c.win, src, u64::from(start), sges) {
                    self.doomed.push(p);
                    return;
                }
                *delivered += total as u32;
                o.deadline = Instant::now() + timeout;
                peers[p as usize].counters.bytes_out += total;
                if *delivered == *len {
                    *done = true;
                    let len = *len;
                    self.emit(p, CQ, &Msg::Done { op, len });
                }
            }
            OutKind::Multicast {
                targets,
                len,
                put,
                chain,
                ..
            } if !*put => {
                // In a chain only the first target answers us.
                let chain = *chain;
                let Some(t) = targets
                    .iter_mut()
                    .enumerate()
                    .find(|(i, t)| {
                        t.peer == p && !t.ready && t.status.is_none() && (!chain || *i == 0)
                    })
                    .map(|(_, t)| t)
                else {
                    return peers[p as usize].counters.drop_one(DropKind::UnknownOp);
                };
                if start != t.got || u64::from(start) + total > u64::from(*len) {
                    peers[p as usize].counters.drop_one(DropKind::OutOfRange);
                    return self.mc_target_failed(op, p, Status::Protocol);
                }
                t.sgl
                    .extend(sges.iter().map(|s| (s.offset, u64::from(s.len))));
                t.got += total as u32;
                o.deadline = Instant::now() + timeout;
                if t.got == *len {
                    t.ready = true;
                    if chain {
                        // The first target's clear-to-send comes only once
                        // the whole chain is ready.
                        for t in targets.iter_mut() {
                            t.ready = true;
                        }
                    }
                    self.mc_maybe_put(op);
                }
            }
            _ => peers[p as usize].counters.drop_one(DropKind::UnknownOp),
        }
    }

    fn on_read_sgl(&mut self, p: Port, op: u64, start: u32, sges: &[WireSge]) {
        let Self {
            peers,
            engine,
            local,
            ..
        } = self;
        let peer = &mut peers[p as usize];
        let Some(c) = peer.conn.as_mut() else { return };
        let Some(InOp::Read {
            src,
            len,
            delivered,
            deadline,
        }) = c.inbound.get_mut(&op)
        else {
            return peer.counters.drop_one(DropKind::UnknownOp);
        };
        let total: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        if start != *delivered || u64::from(start) + total > u64::from(*len) {
            c.inbound.remove(&op);
            peer.counters.drop_one(DropKind::OutOfRange);
            return self.emit(
                p,
                CQ,
                &Msg::Ack {
                    op,
                    status: WireStatus::Protocol,
                    len: 0,
                },
            );
        }
        if !copy_pieces(engine.as_mut(), local, &c.win, src, u64::from(start), sges) {
            self.doomed.push(p);
            return;
        }
        *delivered += total as u32;
        *deadline = Instant::now() + self.cfg.op_timeout;
        peer.counters.bytes_out += total;
        if *delivered == *len {
            let len = *len;
            c.inbound.remove(&op);
            peer.counters.served += 1;
            self.emit(
                p,
                CQ,
                &Msg::Ack {
                    op,
                    status: WireStatus::Ok,
                    len,
                },
            );
        }
    }

    /// A `Done` (from the initiator) or `ChainDone` (from the previous
    /// target of a chain) for op `op` of `origin`.
    fn on_done(&mut self, from: Port, origin: Port, op: u64, len: u32) {
        if origin as usize >= self.peers.len() {
            return self.count(from, DropKind::UnknownOp);
        }
        let Some(c) = self.peers[origin as usize].conn.as_mut() else {
            return self.count(from, DropKind::UnknownOp);
        };
        let legit = match c.inbound.get(&op) {
            Some(InOp::McRecv {
                chain: Some(ch), ..
            }) => ch.prev == from,
            Some(_) => from == origin,
            None => false,
        };
        if !legit {
            return self.count(from, DropKind::UnknownOp);
        }
        let entry = c.inbound.remove(&op);
        let counters = &mut self.peers[origin as usize].counters;
        let reply = match entry {
            Some(InOp::Write { len: l, .. }) if l == len => {
                counters.served += 1;
                counters.bytes_in += u64::from(len);
                WireStatus::Ok
            }
            Some(InOp::McRecv {
                region,
                len: l,
                chain,
                ..
            }) if l == len => {
                counters.served += 1;
                counters.bytes_in += u64::from(len);
                if let Some(ch) = chain {
                    self.chain_forward(origin, op, len, region, &ch);
                }
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
            Some(other) => {
                counters.drop_one(DropKind::OutOfRange);
                if let InOp::McRecv { region, .. } = other {
                    let _ = self.regions.deregister(region);
                }
                WireStatus::Protocol
            }
            None => return,
        };
        let len = if reply == WireStatus::Ok { len } else { 0 };
        self.emit(
            origin,
            CQ,
            &Msg::Ack {
                op,
                status: reply,
                len,
            },
        );
    }

    /// Chain target: the data is deposited in `region`; forward it to the
    /// next target's storage and tell it.
    fn chain_forward(
        &mut self,
        origin: Port,
        op: u64,
        len: u32,
        region: RegionKey,
        ch: &ChainLink,
    ) {
        let Some(next) = ch.next else { return };
        if ch.next_got != len {
            return;
        }
        let src = self
            .regions
            .get(region)
            .map(|r| r.slice(0, u64::from(len)))
            .unwrap_or_default();
        let Self {
            peers,
            engine,
            local,
            ..
        } = self;
        let Some(c) = peers[next as usize].conn.as_ref() else {
            return;
        };
        let mut cur = ExtentCursor::new(src);
        if copy_pieces(
            engine.as_mut(),
            local,
            &c.win,
            &mut cur,
            0,
            &to_wire(&ch.next_sgl),
        ) {
            peers[next as usize].counters.bytes_out += u64::from(len);
            self.emit(next, CQ, &Msg::ChainDone { op, origin, len });
        } else {
            self.doomed.push(next);
        }
    }

    fn on_chain_rts(
        &mut self,
        p: Port,
        op: u64,
        len: u32,
        prev: Port,
        next: Option<Port>,
        deadline: Instant,
    ) {
        if !self.fresh(p, 0, op) {
            return;
        }
        let ports = self.peers.len();
        let me = self.me;
        let ok_port = |x: Port| (x as usize) < ports && x != me;
        let valid = ok_port(prev) && next.is_none_or(|n| ok_port(n) && n != p && n != prev);
        if !valid {
            self.count(p, DropKind::OutOfRange);
            let nak = Msg::Ack {
                op,
                status: WireStatus::Protocol,
                len: 0,
            };
            return self.emit(p, CQ, &nak);
        }
        let Ok(key) = self.regions.register(u64::from(len), Access::LOCAL, None) else {
            let nak = Msg::Ack {
                op,
                status: WireStatus::NoRoom,
                len: 0,
            };
            return self.emit(p, CQ, &nak);
        };
        let link = ChainLink {
            prev,
            next,
            next_sgl: Vec::new(),
            next_got: 0,
            cts_sent: false,
        };
        self.inbound_insert(
            p,
            op,
            InOp::McRecv {
                region: key,
                len,
                deadline,
                chain: Some(Box::new(link)),
            },
        );
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
        let Some(InOp::McRecv {
            region,
            len,
            chain: Some(ch),
            ..
        }) = c.inbound.get_mut(&op)
        else {
            return;
        };
        if ch.cts_sent {
            return;
        }
        ch.cts_sent = true;
        let (prev, region, len) = (ch.prev, *region, *len);
        let ext = self
            .regions
            .get(region)
            .map(|r| r.slice(0, u64::from(len)))
            .unwrap_or_default();
        if prev == origin {
            return self.emit_sgl(origin, op, &ext);
        }
        if self.peers[prev as usize].conn.is_none() {
            if let Some(InOp::McRecv { region, .. }) = self.peers[origin as usize]
                .conn
                .as_mut()
                .and_then(|c| c.inbound.remove(&op))
            {
                let _ = self.regions.deregister(region);
            }
            let nak = Msg::Ack {
                op,
                status: WireStatus::Protocol,
                len: 0,
            };
            return self.emit(origin, CQ, &nak);
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
            self.emit(prev, TX, m);
        }
    }

    /// Chain target: part of the next target's storage, from it.
    fn on_chain_sgl(&mut self, s: Port, origin: Port, op: u64, start: u32, sges: &[WireSge]) {
        if origin as usize >= self.peers.len() || origin == self.me {
            return self.count(s, DropKind::UnknownOp);
        }
        let timeout = self.cfg.op_timeout;
        let Some(c) = self.peers[origin as usize].conn.as_mut() else {
            return self.count(s, DropKind::UnknownOp);
        };
        let total: u64 = sges.iter().map(|x| u64::from(x.len)).sum();
        match c.inbound.get_mut(&op) {
            Some(InOp::McRecv {
                len,
                chain: Some(ch),
                deadline,
                ..
            }) if ch.next == Some(s) && !ch.cts_sent => {
                if start != ch.next_got || u64::from(start) + total > u64::from(*len) {
                    if let Some(InOp::McRecv { region, .. }) = c.inbound.remove(&op) {
                        let _ = self.regions.deregister(region);
                    }
                    self.count(s, DropKind::OutOfRange);
                    let nak = Msg::Ack {
                        op,
                        status: WireStatus::Protocol,
                        len: 0,
                    };
                    return self.emit(origin, CQ, &nak);
                }
                ch.next_sgl
                    .extend(sges.iter().map(|x| (x.offset, u64::from(x.len))));
                ch.next_got += total as u32;
                *deadline = Instant::now() + timeout;
                if ch.next_got == *len {
                    self.chain_cts(origin, op);
                }
            }
            Some(_) => self.count(s, DropKind::UnknownOp),
            None if op > c.hwm[0] && self.chain_early.len() < 1024 => {
                self.chain_early.push(EarlySgl {
                    origin,
                    op,
                    from: s,
                    start,
                    sges: sges.to_vec(),
                    at: Instant::now(),
                });
            }
            None => self.count(s, DropKind::UnknownOp),
        }
    }

    fn on_ack(&mut self, p: Port, op: u64, status: WireStatus, len: u32) {
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
            OutKind::Multicast {
                targets,
                len: l,
                put,
                ..
            } => {
                let Some(t) = targets
                    .iter_mut()
                    .find(|t| t.peer == p && t.status.is_none())
                else {
                    return self.count(p, DropKind::UnknownOp);
                };
                let s = match status {
                    WireStatus::Ok if *put && t.ready && len == *l => Status::Success,
                    WireStatus::Ok => Status::Protocol,
                    other => status_of(other),
                };
                self.mc_target_failed(op, p, s);
            }
            _ => self.count(p, DropKind::UnknownOp),
        }
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
        if let Some(t) = targets
            .iter_mut()
            .find(|t| t.peer == p && t.status.is_none())
        {
            t.status = Some(status);
        }
        if *chain && !status.is_ok() {
            // A broken chain: the other targets will not get the data either.
            for t in targets.iter_mut().filter(|t| t.status.is_none()) {
                t.status = Some(status);
            }
        }
        self.mc_maybe_put(op);
    }

    fn mc_maybe_put(&mut self, op: u64) {
        let Self {
            ops,
            peers,
            engine,
            local,
            ..
        } = self;
        let Some(OutKind::Multicast {
            src,
            len,
            targets,
            put,
            chain,
        }) = ops.get_mut(&op).map(|o| &mut o.kind)
        else {
            return;
        };
        let (len, chain) = (*len, *chain);
        // The check-in counter: targets neither ready nor failed.
        let waiting = targets
            .iter()
            .filter(|t| !t.ready && t.status.is_none())
            .count();
        if waiting == 0 && !*put {
            *put = true;
            let mut dones = Vec::new();
            // Fan-out: one copy per target. Chain: to the first only; it
            // deposits and forwards.
            for (_, t) in targets
                .iter_mut()
                .enumerate()
                .filter(|(i, t)| t.status.is_none() && (!chain || *i == 0))
            {
                let Some(c) = peers[t.peer as usize].conn.as_ref() else {
                    t.status = Some(Status::PeerDown);
                    continue;
                };
                let mut cur = ExtentCursor::new(src.clone());
                if copy_pieces(
                    engine.as_mut(),
                    local,
                    &c.win,
                    &mut cur,
                    0,
                    &to_wire(&t.sgl),
                ) {
                    peers[t.peer as usize].counters.bytes_out += u64::from(len);
                    dones.push(t.peer);
                } else {
                    t.status = Some(Status::PeerDown);
                }
            }
            if chain && dones.is_empty() {
                for t in targets.iter_mut().filter(|t| t.status.is_none()) {
                    t.status = Some(Status::PeerDown);
                }
            }
            for d in dones {
                self.emit(d, CQ, &Msg::Done { op, len });
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

    /// Completes op `id` with `status`.
    pub(crate) fn finish(&mut self, id: u64, status: Status, bytes: u64) {
        let Some(o) = self.ops.remove(&id) else {
            return;
        };
        let ok = status.is_ok();
        let (peer, op, region) = match o.kind {
            OutKind::Write { peer, .. } => {
                let c = &mut self.peers[peer as usize].counters;
                if ok {
                    c.writes += 1;
                }
                (peer, OpKind::Write, None)
            }
            OutKind::ReadSize { peer, .. } => (peer, OpKind::ReadUnknown, None),
            OutKind::Read { peer, region, .. } => {
                if ok {
                    self.peers[peer as usize].counters.reads += 1;
                }
                let kind = if region.is_some() {
                    OpKind::ReadUnknown
                } else {
                    OpKind::Read
                };
                let region = match region {
                    Some(k) if !ok => {
                        let _ = self.regions.deregister(k);
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
