//! Receive: a peer's sends arrive on its PostQ in our window (inline in one
//! slot or a run of slots, or naming an eager buffer it filled) and become
//! receive completions, handed to the oldest posted receive in order.
//!
//! The small-message fast path: a send is taken, validated and copied into
//! its receive right here, with no detour through the control-message
//! scratch list; an eager buffer is lent back to the sender at once.

use std::collections::VecDeque;

use crate::hw::{LocalWindow, Port};

use super::counters::DropKind;
use super::dma::DmaEngine;
use super::endpoint::Transport;
use super::geometry::Layout;
use super::peer::Peer;
use super::poll::drop_kind;
use super::types::{Completion, OpKind, Status};
use super::wire::{self, Limits, Msg, Ring};

/// What delivering a send touches, borrowed apart from the peer so the
/// PostQ loop can deliver while it holds the connection.
struct Sink<'a> {
    p: Port,
    local: &'a LocalWindow,
    engine: &'a mut dyn DmaEngine,
    layout: &'a Layout,
    completions: &'a mut VecDeque<Completion>,
    doomed: &'a mut Vec<Port>,
}

impl Sink<'_> {
    /// Hands an eager message (inline bytes, or eager buffer `buf` of
    /// `len` bytes) to the oldest posted receive, returns a lent buffer to
    /// the peer, and completes the receive.
    #[inline]
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
        if let (Some((b, _)), Some(c)) = (buf, peer.conn.as_mut())
            && c.give_back(b).is_err()
        {
            self.doomed.push(p);
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
    /// Takes `p`'s sends from its PostQ while receives are posted for
    /// them; returns how many were delivered. A malformed send, one naming
    /// a buffer we did not lend, or a non-send on the PostQ is dropped and
    /// counted, never acted on.
    #[inline]
    pub(crate) fn receive_sends(&mut self, p: Port, limits: &Limits) -> usize {
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
        let mut sink = Sink {
            p,
            local,
            engine: engine.as_mut(),
            layout,
            completions,
            doomed,
        };
        let mut delivered = 0;
        while !peer.recvs.is_empty() {
            let Some(c) = peer.conn.as_mut() else { break };
            let postq = c.consumer(Ring::PostQ);
            let Some(b) = postq.peek(local) else {
                postq.prefetch_ahead(local, 1);
                break;
            };
            if wire::is_inline_head(&b) {
                // A run of slots, published by its last tag: take it
                // once every slot is there, validate it as a unit.
                let slots = match wire::decode_inline_head(&b) {
                    Ok((_, k)) => k,
                    Err(e) => {
                        postq.advance();
                        peer.counters.drop_one(drop_kind(e));
                        continue;
                    }
                };
                let mut conts = [[0u8; wire::BODY]; wire::INLINE_SLOTS_MAX - 1];
                let mut complete = true;
                for k in 1..slots {
                    match postq.peek_ahead(local, k as u64) {
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
                postq.advance_by(slots as u64);
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
            postq.advance();
            match wire::decode_validated(&b, Ring::PostQ, limits) {
                Ok(Msg::SendInline { len, data }) => {
                    sink.deliver(peer, None, &data[..(len as usize).min(data.len())]);
                    delivered += 1;
                }
                Ok(Msg::SendBuf { buf, len }) => {
                    if c.is_lent(buf) {
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
        delivered
    }
}
