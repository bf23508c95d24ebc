//! Progress: polling the queues in place, validating every message from a
//! peer against our state, moving data, and completing operations.

use std::time::Instant;

use crate::hw::{LocalWindow, PeerWindow, Port};

use super::conn::{CQ, InOp, POSTQ, RX, TX};
use super::counters::DropKind;
use super::dma::DmaEngine;
use super::endpoint::{OutKind, Transport};
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
        {
            let peer = &mut self.peers[p as usize];
            let Some(c) = peer.conn.as_mut() else {
                self.scratch = scratch;
                return 0;
            };
            let limits = Limits {
                max_len: u32::MAX,
                region_start: self.layout.region_area_start() as u64,
                window_len: c.win.len() as u64,
                eager_count: g.eager_count,
                eager_size: g.eager_size,
            };
            c.poll_freeq(&self.local, &mut peer.counters);
            for (k, q) in [(CQ, Queue::Cq), (TX, Queue::Tx), (RX, Queue::Rx)] {
                for _ in 0..g.queue_depth {
                    let Some(b) = c.cons[k].peek(&self.local) else {
                        break;
                    };
                    c.cons[k].advance();
                    match wire::decode_validated(&b, q, &limits) {
                        Ok(m) => scratch.push((q, m)),
                        Err(e) => peer.counters.drop_one(drop_kind(e)),
                    }
                }
            }
            let mut want = peer.recvs.len();
            while want > 0 {
                let Some(b) = c.cons[POSTQ].peek(&self.local) else {
                    break;
                };
                c.cons[POSTQ].advance();
                match wire::decode_validated(&b, Queue::PostQ, &limits) {
                    Ok(m) => {
                        scratch.push((Queue::PostQ, m));
                        want -= 1;
                    }
                    Err(e) => peer.counters.drop_one(drop_kind(e)),
                }
            }
            if scratch.is_empty() {
                peer.counters.empty_polls += 1;
            }
        }
        let n = scratch.len();
        for (_, m) in scratch.drain(..) {
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
    /// (counted) for a replay.
    fn fresh(&mut self, p: Port, ring: usize, op: u64) -> bool {
        let peer = &mut self.peers[p as usize];
        let Some(c) = peer.conn.as_mut() else {
            return false;
        };
        if op <= c.hwm[ring] || c.inbound.contains_key(&op) {
            peer.counters.drop_one(DropKind::Replay);
            return false;
        }
        c.hwm[ring] = op;
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
        let deadline = Instant::now() + self.cfg.op_timeout;
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
                        self.inbound_insert(p, op, InOp::Write { len, deadline });
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
                                deadline,
                            },
                        );
                        self.emit_sgl(p, op, &ext);
                    }
                }
            }
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
                            deadline,
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
            Msg::Done { op, len } => self.on_done(p, op, len),
            Msg::Ack { op, status, len } => self.on_ack(p, op, status, len),
            Msg::SendInline { len, data } => {
                self.deliver(p, None, &data[..(len as usize).min(data.len())])
            }
            Msg::SendBuf { buf, len } => {
                let lent = self.peers[p as usize]
                    .conn
                    .as_ref()
                    .is_some_and(|c| c.lent.get(buf as usize).copied().unwrap_or(false));
                if !lent {
                    self.count(p, DropKind::BadBuffer);
                    return;
                }
                self.deliver(p, Some((buf, len)), &[]);
            }
        }
    }

    /// Hands an eager message to the oldest posted receive.
    fn deliver(&mut self, p: Port, buf: Option<(u32, u32)>, inline: &[u8]) {
        let me = self.me;
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
                    None => local.write(o as usize, &inline[at as usize..(at + n) as usize]),
                    Some((b, _)) => engine.copy_local(
                        local,
                        layout.eager_buffer(p, b) + at as usize,
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
        let _ = me;
        if let (Some((b, _)), Some(c)) = (buf, peer.conn.as_mut()) {
            c.lent[b as usize] = false;
            if c.lend(b).is_err() {
                doomed.push(p);
            }
        }
        if status.is_ok() {
            peer.counters.recvs += 1;
            peer.counters.bytes_in += len;
        } else {
            peer.counters.failed_ops += 1;
        }
        completions.push_back(Completion {
            peer: p,
            op: OpKind::Recv,
            status,
            bytes: if status.is_ok() { len } else { 0 },
            cookie: wr.cookie,
            region: None,
        });
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
                targets, len, put, ..
            } if !*put => {
                let Some(t) = targets
                    .iter_mut()
                    .find(|t| t.peer == p && !t.ready && t.status.is_none())
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

    fn on_done(&mut self, p: Port, op: u64, len: u32) {
        let peer = &mut self.peers[p as usize];
        let Some(c) = peer.conn.as_mut() else { return };
        let reply = match c.inbound.remove(&op) {
            Some(InOp::Write { len: l, .. }) if l == len => {
                peer.counters.served += 1;
                peer.counters.bytes_in += u64::from(len);
                WireStatus::Ok
            }
            Some(InOp::McRecv { region, len: l, .. }) if l == len => {
                peer.counters.served += 1;
                peer.counters.bytes_in += u64::from(len);
                self.completions.push_back(Completion {
                    peer: p,
                    op: OpKind::MulticastRecv,
                    status: Status::Success,
                    bytes: u64::from(len),
                    cookie: op,
                    region: Some(region),
                });
                WireStatus::Ok
            }
            Some(other) => {
                peer.counters.drop_one(DropKind::OutOfRange);
                if let InOp::McRecv { region, .. } = other {
                    let _ = self.regions.deregister(region);
                }
                WireStatus::Protocol
            }
            None => return peer.counters.drop_one(DropKind::UnknownOp),
        };
        let len = if reply == WireStatus::Ok { len } else { 0 };
        self.emit(
            p,
            CQ,
            &Msg::Ack {
                op,
                status: reply,
                len,
            },
        );
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
        let Some(OutKind::Multicast { targets, .. }) = self.ops.get_mut(&op).map(|o| &mut o.kind)
        else {
            return;
        };
        if let Some(t) = targets
            .iter_mut()
            .find(|t| t.peer == p && t.status.is_none())
        {
            t.status = Some(status);
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
        }) = ops.get_mut(&op).map(|o| &mut o.kind)
        else {
            return;
        };
        let len = *len;
        // The check-in counter: targets neither ready nor failed.
        let waiting = targets
            .iter()
            .filter(|t| !t.ready && t.status.is_none())
            .count();
        if waiting == 0 && !*put {
            *put = true;
            let mut dones = Vec::new();
            for t in targets.iter_mut().filter(|t| t.status.is_none()) {
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
