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

/// Where a send's payload is in our window.
#[derive(Clone, Copy)]
enum Payload<'a> {
    /// Inline, in place in its PostQ slots (their window offsets, the
    /// first a lone slot or a run's head), `len` bytes.
    Slots { at: &'a [usize], len: usize },
    /// In eager buffer `buf` we lent, `len` bytes.
    Buffer { buf: u32, len: u32 },
}

/// Where the payload bytes of slot `k` of an inline send (at window offset
/// `slot`) start, and how many of the `left` still to copy it holds: a
/// head's body after its 8 header bytes, a continuation's whole body.
#[inline(always)]
fn piece(k: usize, slot: usize, left: usize) -> (usize, usize) {
    if k == 0 {
        (slot + 8, left.min(wire::INLINE_MAX))
    } else {
        (slot, left.min(wire::BODY))
    }
}

/// Copies an inline payload of `len` bytes from its slots at `at` (the
/// first slot's body after its 8 header bytes, the others' whole bodies)
/// over `extents`, whose total is at least `len`.
#[inline]
fn scatter(
    local: &LocalWindow,
    at: &[usize],
    len: usize,
    extents: &[(u64, u64)],
) -> crate::hw::Result<()> {
    // A receive buffer of one extent (the usual case): a copy per slot.
    if let Some(&(o, l)) = extents.first()
        && l as usize >= len
    {
        let mut dst = o as usize;
        let mut left = len;
        for (k, &slot) in at.iter().enumerate() {
            let (src, n) = piece(k, slot, left);
            local.copy_within(src, dst, n)?;
            dst += n;
            left -= n;
        }
        return Ok(());
    }
    let mut ext = extents.iter();
    let (mut dst, mut room) = (0usize, 0usize);
    let mut left = len;
    for (k, &slot) in at.iter().enumerate() {
        let (mut src, mut n) = piece(k, slot, left);
        left -= n;
        while n > 0 {
            if room == 0 {
                let Some(&(o, l)) = ext.next() else {
                    return Err(crate::hw::HwError::OutOfBounds {
                        offset: dst,
                        len: n,
                        window_len: local.len(),
                    });
                };
                (dst, room) = (o as usize, l as usize);
                continue;
            }
            let m = room.min(n);
            local.copy_within(src, dst, m)?;
            (src, dst, room, n) = (src + m, dst + m, room - m, n - m);
        }
    }
    Ok(())
}

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
    /// Hands an eager message to the oldest posted receive, returns a lent
    /// buffer to the peer, and completes the receive.
    #[inline]
    fn deliver(&mut self, peer: &mut Peer, payload: Payload<'_>) {
        let p = self.p;
        let Some(wr) = peer.recvs.pop_front() else {
            return;
        };
        let (buf, len) = match payload {
            Payload::Slots { len, .. } => (None, len as u64),
            Payload::Buffer { buf, len } => (Some(buf), u64::from(len)),
        };
        let mut status = Status::Success;
        if len > wr.len {
            status = Status::LocalLength;
        } else {
            let copied = match payload {
                Payload::Slots { at, len } => scatter(self.local, at, len, wr.extents.as_slice()),
                Payload::Buffer { buf, .. } => {
                    let from = self.layout.eager_buffer(p, buf);
                    let mut at = 0u64;
                    let mut r = Ok(());
                    for &(o, l) in wr.extents.as_slice() {
                        if at >= len {
                            break;
                        }
                        let n = l.min(len - at);
                        r = self.engine.copy_local(
                            self.local,
                            from + at as usize,
                            o as usize,
                            n as usize,
                        );
                        if r.is_err() {
                            break;
                        }
                        at += n;
                    }
                    r
                }
            };
            if copied.is_err() {
                status = Status::Protocol;
            }
        }
        if let (Some(b), Some(c)) = (buf, peer.conn.as_mut())
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
            if c.credit_when_due(Ring::PostQ).is_err() {
                sink.doomed.push(p);
                break;
            }
            let postq = c.consumer(Ring::PostQ);
            let Some(first) = postq.arrived(local, 0) else {
                postq.prefetch_ahead(local, 1);
                break;
            };
            // Inline sends (one slot, or a run published by its last tag)
            // are read in place: taken once every slot is there, checked
            // as a unit, and copied from the slots to the receive.
            let w0 = local.load_u64(first).unwrap_or(0);
            if let Some(head) = wire::inline_first_word(w0) {
                let (len, slots) = match head {
                    Ok(x) => x,
                    Err(e) => {
                        postq.advance();
                        peer.counters.drop_one(drop_kind(e));
                        continue;
                    }
                };
                let mut at = [first; wire::INLINE_SLOTS_MAX];
                let mut complete = true;
                let mut k = 1;
                while k < slots {
                    match postq.arrived(local, k as u64) {
                        Some(o) => at[k] = o,
                        None => {
                            complete = false;
                            break;
                        }
                    }
                    k += 1;
                }
                if !complete {
                    break;
                }
                postq.advance_by(slots as u64);
                let last = local
                    .load_words::<{ wire::BODY / 8 }>(at[slots - 1])
                    .unwrap_or([u64::MAX; wire::BODY / 8]);
                let padded = wire::zero_from(wire::inline_last_used(len, slots), |i| last[i]);
                if padded {
                    sink.deliver(
                        peer,
                        Payload::Slots {
                            at: &at[..slots],
                            len,
                        },
                    );
                    delivered += 1;
                } else {
                    peer.counters.drop_one(DropKind::Malformed);
                }
                continue;
            }
            let Some(b) = postq.peek(local) else {
                break;
            };
            postq.advance();
            match wire::decode_validated(&b, Ring::PostQ, limits) {
                Ok(Msg::SendBuf { buf, len }) => {
                    if c.is_lent(buf) {
                        sink.deliver(peer, Payload::Buffer { buf, len });
                        delivered += 1;
                    } else {
                        peer.counters.drop_one(DropKind::BadBuffer);
                    }
                }
                // Only sends are valid on the PostQ (checked by the
                // decoder; inline ones were taken above); anything else is
                // counted, never acted on.
                Ok(_) => peer.counters.drop_one(DropKind::WrongQueue),
                Err(e) => peer.counters.drop_one(drop_kind(e)),
            }
        }
        delivered
    }
}
