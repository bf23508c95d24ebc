//! Receive: a peer's sends arrive on its PostQ in our window (inline in one
//! slot or a run of slots, or naming an eager buffer it filled) and become
//! receive completions, handed to the oldest posted receive in order.
//!
//! The small-message fast path: a send is taken, validated and copied into
//! its receive right here, with no detour through the control-message
//! scratch list; an eager buffer is lent back to the sender at once.

use crate::hw::{LocalSpan, LocalWindow, Port};

use super::completion_queue::CompletionQueue;
use super::counters::DropKind;
use super::dma::DmaEngine;
use super::endpoint::Transport;
use super::geometry::Layout;
use super::peer::Peer;
use super::poll::{drop_kind, limits};
use super::types::{Completion, OpKind, Status};
use super::wire::{self, Msg, Ring};

/// Where the payload bytes of slot `k` of an inline send (at offset `slot`
/// of the PostQ's area) start, and how many of the `left` still to copy it holds: a
/// head's body after its 8 header bytes, a continuation's whole body.
#[inline(always)]
fn piece(k: usize, slot: usize, left: usize) -> (usize, usize) {
    if k == 0 {
        (slot + 8, left.min(wire::INLINE_MAX))
    } else {
        (slot, left.min(wire::BODY))
    }
}

/// Copies an inline payload of `len` bytes from its slots at `at` of
/// `ring` (the first slot's body after its 8 header bytes, the others'
/// whole bodies) over `extents` of our window, whose total is at least
/// `len`. Returns whether every byte was copied.
#[inline(always)]
fn scatter(ring: &LocalSpan<'_>, at: &[usize], len: usize, extents: &[(u64, u64)]) -> bool {
    match extents {
        // A receive buffer of one extent (the usual case): a copy per slot.
        [(o, _)] => {
            let mut dst = *o as usize;
            let mut left = len;
            for (k, &slot) in at.iter().enumerate() {
                let (src, n) = piece(k, slot, left);
                if ring.copy_to_window(src, dst, n).is_err() {
                    return false;
                }
                dst += n;
                left -= n;
            }
            true
        }
        _ => scatter_extents(ring, at, len, extents),
    }
}

/// [`scatter`] over several extents: each slot's piece split where an
/// extent ends.
#[inline(never)]
fn scatter_extents(ring: &LocalSpan<'_>, at: &[usize], len: usize, extents: &[(u64, u64)]) -> bool {
    let mut ext = extents.iter();
    let (mut dst, mut room) = (0usize, 0usize);
    let mut left = len;
    for (k, &slot) in at.iter().enumerate() {
        let (mut src, mut n) = piece(k, slot, left);
        left -= n;
        while n > 0 {
            if room == 0 {
                let Some(&(o, l)) = ext.next() else {
                    return false;
                };
                (dst, room) = (o as usize, l as usize);
                continue;
            }
            let m = room.min(n);
            if ring.copy_to_window(src, dst, m).is_err() {
                return false;
            }
            (src, dst, room, n) = (src + m, dst + m, room - m, n - m);
        }
    }
    true
}

/// What delivering a send touches, borrowed apart from the peer so the
/// PostQ loop can deliver while it holds the connection.
struct Sink<'a> {
    p: Port,
    local: &'a LocalWindow,
    engine: &'a mut dyn DmaEngine,
    layout: &'a Layout,
    completions: &'a mut CompletionQueue,
    doomed: &'a mut Vec<Port>,
}

impl Sink<'_> {
    /// Hands an inline send (`len` bytes in its slots at `at` of `ring`)
    /// to the oldest posted receive and completes it: the small-message
    /// path, kept small enough to inline into the PostQ loop.
    #[inline(always)]
    fn deliver_inline(&mut self, peer: &mut Peer, ring: &LocalSpan<'_>, at: &[usize], len: usize) {
        let Some(wr) = peer.recvs.pop_front() else {
            return;
        };
        let status = if len as u64 > wr.len {
            Status::LocalLength
        } else if scatter(ring, at, len, wr.extents.as_slice()) {
            Status::Success
        } else {
            Status::Protocol
        };
        self.complete(peer, wr.cookie, status, len as u64);
    }

    /// Hands an eager message (`len` bytes in buffer `buf` we lent) to the
    /// oldest posted receive, returns the buffer to the peer, and completes
    /// the receive.
    #[inline(never)]
    fn deliver_buffer(&mut self, peer: &mut Peer, buf: u32, len: u32) {
        let p = self.p;
        let Some(wr) = peer.recvs.pop_front() else {
            return;
        };
        let len = u64::from(len);
        let status = if len > wr.len {
            Status::LocalLength
        } else {
            let from = self.layout.eager_buffer(p, buf);
            let mut at = 0u64;
            let mut r = Ok(());
            for &(o, l) in wr.extents.as_slice() {
                if at >= len {
                    break;
                }
                let n = l.min(len - at);
                r = self
                    .engine
                    .copy_local(self.local, from + at as usize, o as usize, n as usize);
                if r.is_err() {
                    break;
                }
                at += n;
            }
            if r.is_ok() {
                Status::Success
            } else {
                Status::Protocol
            }
        };
        if let Some(c) = peer.conn.as_mut()
            && c.give_back(buf).is_err()
        {
            self.doomed.push(p);
        }
        self.complete(peer, wr.cookie, status, len);
    }

    /// Counts a delivered receive and queues its completion.
    #[inline(always)]
    fn complete(&mut self, peer: &mut Peer, cookie: u64, status: Status, len: u64) {
        let bytes = if status.is_ok() {
            peer.counters.recvs += 1;
            peer.counters.bytes_in += len;
            len
        } else {
            peer.counters.failed_ops += 1;
            0
        };
        self.completions.push_back(Completion {
            peer: self.p,
            op: OpKind::Recv,
            status,
            bytes,
            cookie,
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
    pub(crate) fn receive_sends(&mut self, p: Port) -> usize {
        let Self {
            peers,
            local,
            engine,
            layout,
            completions,
            doomed,
            cfg,
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
        if peer.recvs.is_empty() {
            return 0;
        }
        // The PostQ's slots, checked once for the whole drain, and its depth.
        let (ring, lap) = match peer.conn.as_mut().map(|c| {
            let q = c.consumer(Ring::PostQ);
            (q.area(local), q.depth())
        }) {
            Some((Ok(ring), lap)) => (ring, lap),
            Some((Err(_), _)) => {
                sink.doomed.push(p);
                return 0;
            }
            None => return 0,
        };
        // At most one lap of slots per call, delivered or dropped: the peer
        // sees our credits, so it could refill the ring just ahead of us
        // with sends we drop and keep us here (as `take_control` and
        // `rx_burst` stop after a lap too).
        let mut taken = 0u64;
        while !peer.recvs.is_empty() && taken < lap {
            let Some(c) = peer.conn.as_mut() else { break };
            if c.credit_when_due(Ring::PostQ).is_err() {
                sink.doomed.push(p);
                break;
            }
            let postq = c.consumer(Ring::PostQ);
            let Some(first) = postq.arrived_in(&ring, 0) else {
                postq.prefetch_ahead(local, 1);
                break;
            };
            // Inline sends (one slot, or a run published by its last tag)
            // are read in place: taken once every slot is there, checked
            // as a unit, and copied from the slots to the receive.
            let w0 = ring.load_u64_relaxed(first);
            if let Some(head) = wire::inline_first_word(w0) {
                let (len, slots) = match head {
                    Ok(x) => x,
                    Err(e) => {
                        postq.advance();
                        taken += 1;
                        peer.counters.drop_one(drop_kind(e));
                        continue;
                    }
                };
                let mut at = [first; wire::INLINE_SLOTS_MAX];
                let mut complete = true;
                let mut k = 1;
                while k < slots {
                    match postq.arrived_in(&ring, k as u64) {
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
                taken += slots as u64;
                // The last slot's unused bytes are zero in a valid send
                // (each word loaded once: the peer may be writing them).
                let last = at[slots - 1];
                let padded = wire::zero_from(wire::inline_last_used(len, slots), |i| {
                    ring.load_u64_relaxed(last + 8 * i)
                });
                if padded {
                    sink.deliver_inline(peer, &ring, &at[..slots], len);
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
            taken += 1;
            match wire::decode_validated(&b, Ring::PostQ, &limits(layout, &cfg.geometry, c)) {
                Ok(Msg::SendBuf { buf, len }) => {
                    if c.is_lent(buf) {
                        sink.deliver_buffer(peer, buf, len);
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
