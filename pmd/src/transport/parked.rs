//! SGLs whose copy found the peer's grant table mid-edit at every look.
//!
//! A rendezvous copy goes into storage the peer granted us through its live
//! grant table (see `crate::hw::grant_table`). A table that stays mid-edit
//! (its owner preempted inside an edit, for milliseconds on a busy host) is
//! no answer yet, not a refusal: ending the connection for it would fail
//! every operation with an honest peer. So the SGL is set aside here and its
//! copy tried again from the slow path, until it goes through, or its
//! operation ends (its copy window or timeout, or the connection's end).
//! The SGLs of one operation that arrive meanwhile wait behind it, so they
//! are copied in the order they came.
//!
//! This file is the store, which the [`Transport`](super::Transport) keeps;
//! `retry.rs` sets SGLs aside and tries them again. What a peer can make us
//! do with it is bounded: a pass tries one copy per peer whose table is
//! still mid-edit (the rest wait without a try), and a peer past
//! [`PER_PEER`] SGLs set aside has its connection reset.

use std::collections::HashMap;

use crate::hw::Port;

use super::wire::WireSge;

/// SGL messages one peer may have set aside at once: room for every one of
/// our operations (at most `Config::max_outstanding`, 4096 by default) and
/// of theirs we serve to wait with several each. Past it (a peer that keeps
/// its table mid-edit and sends SGL after SGL) the connection is reset, as
/// any failed copy resets it.
pub(crate) const PER_PEER: usize = 16 << 10;

/// Which of our roles the SGL serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ParkedKind {
    /// Our rendezvous write: where the target wants its bytes (`Sgl`).
    Write,
    /// A read we serve: where the reader wants the bytes (`ReadSgl`).
    Read,
    /// Our multicast put's copy to one target (whose storage we hold
    /// already): a marker, with no SGL of its own.
    Put,
}

/// An operation's place among the set-aside SGLs: the peer whose window
/// they go into, the operation (ours for a write, the peer's for a read we
/// serve), and which role.
pub(crate) type OpKey = (Port, u64, ParkedKind);

/// One SGL set aside: its position in the operation's bytes, its entries.
#[derive(Debug)]
pub(crate) struct ParkedSgl {
    /// The SGL's position in the operation's bytes.
    pub(crate) start: u32,
    /// Its entries.
    pub(crate) sges: Vec<WireSge>,
}

impl ParkedSgl {
    /// The position just past its bytes.
    fn end(&self) -> u64 {
        u64::from(self.start) + self.sges.iter().map(|s| u64::from(s.len)).sum::<u64>()
    }
}

/// The SGLs set aside, by operation, each operation's in arrival order.
#[derive(Debug, Default)]
pub(crate) struct Parked {
    by_op: HashMap<OpKey, Vec<ParkedSgl>>,
    /// SGLs set aside per peer (the [`PER_PEER`] bound).
    per_peer: HashMap<Port, usize>,
}

/// Why an SGL was not set aside.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotParked {
    /// The peer has [`PER_PEER`] SGLs set aside already.
    TooMany,
    /// It does not follow the last one waiting for its operation (SGLs come
    /// in order): for the caller's usual checks to refuse.
    OutOfOrder,
}

impl Parked {
    /// Whether nothing is set aside (the slow path's one look).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_op.is_empty()
    }

    /// Whether an SGL of operation `key` waits: a newer one must wait
    /// behind it.
    #[inline]
    pub(crate) fn holds(&self, key: OpKey) -> bool {
        !self.by_op.is_empty() && self.by_op.contains_key(&key)
    }

    /// Sets an SGL of operation `key` aside, after those already waiting
    /// for it (it must start where the last one ends).
    pub(crate) fn park(
        &mut self,
        key: OpKey,
        start: u32,
        sges: &[WireSge],
    ) -> Result<(), NotParked> {
        let count = self.per_peer.entry(key.0).or_default();
        if *count >= PER_PEER {
            return Err(NotParked::TooMany);
        }
        let queue = self.by_op.entry(key).or_default();
        if queue
            .last()
            .is_some_and(|last| last.end() != u64::from(start))
        {
            return Err(NotParked::OutOfOrder);
        }
        queue.push(ParkedSgl {
            start,
            sges: sges.to_vec(),
        });
        *count += 1;
        Ok(())
    }

    /// Everything set aside, to try again (what fails again is parked anew,
    /// in the same order).
    pub(crate) fn take(&mut self) -> HashMap<OpKey, Vec<ParkedSgl>> {
        self.per_peer.clear();
        std::mem::take(&mut self.by_op)
    }

    /// Puts an operation's SGLs back untried, ahead of any that came since.
    pub(crate) fn put_back(&mut self, key: OpKey, mut sgls: Vec<ParkedSgl>) {
        *self.per_peer.entry(key.0).or_default() += sgls.len();
        let queue = self.by_op.entry(key).or_default();
        sgls.append(queue);
        *queue = sgls;
    }

    /// Drops what waits for operation `key` (it ended).
    pub(crate) fn forget_op(&mut self, key: OpKey) {
        if let Some(q) = self.by_op.remove(&key)
            && let Some(n) = self.per_peer.get_mut(&key.0)
        {
            *n -= q.len();
        }
    }

    /// The most SGLs waiting for one operation (tests).
    #[cfg(test)]
    pub(crate) fn longest_queue(&self) -> usize {
        self.by_op.values().map(Vec::len).max().unwrap_or(0)
    }

    /// Drops what waits for `peer` (its connection ended: what the SGLs
    /// served has failed with it).
    pub(crate) fn forget_peer(&mut self, peer: Port) {
        self.by_op.retain(|k, _| k.0 != peer);
        self.per_peer.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(offset: u64) -> WireSge {
        WireSge { offset, len: 64 }
    }

    #[test]
    fn keeps_each_operations_order_bounds_each_peer_and_forgets() {
        let mut p = Parked::default();
        let (w1, r2) = ((1, 7, ParkedKind::Write), (2, 7, ParkedKind::Read));
        assert!(p.is_empty() && !p.holds(w1));
        p.park(w1, 0, &[sge(0)]).unwrap();
        p.park(r2, 0, &[sge(64)]).unwrap();
        p.park(w1, 64, &[sge(128), sge(256)]).unwrap();
        // Not where the last one waiting ends (128).
        assert_eq!(p.park(w1, 64, &[sge(0)]), Err(NotParked::OutOfOrder));
        assert!(p.holds(w1) && p.holds(r2));
        assert!(!p.holds((1, 7, ParkedKind::Read)) && !p.holds((1, 8, ParkedKind::Write)));
        let mut all = p.take();
        assert!(p.is_empty());
        let starts: Vec<u32> = all[&w1].iter().map(|s| s.start).collect();
        assert_eq!(starts, [0, 64]);
        // Put back ahead of one that came meanwhile.
        p.park(w1, 192, &[sge(0)]).unwrap();
        p.put_back(w1, all.remove(&w1).unwrap());
        let starts: Vec<u32> = p.by_op[&w1].iter().map(|s| s.start).collect();
        assert_eq!(starts, [0, 64, 192]);
        assert_eq!(p.per_peer[&1], 3);
        p.forget_op(w1);
        assert_eq!((p.per_peer[&1], p.is_empty()), (0, true));
        for i in 0..PER_PEER {
            p.park((3, i as u64, ParkedKind::Write), 0, &[sge(0)])
                .unwrap();
        }
        assert_eq!(
            p.park((3, 0, ParkedKind::Read), 0, &[sge(0)]),
            Err(NotParked::TooMany)
        );
        p.park((4, 0, ParkedKind::Write), 0, &[sge(0)]).unwrap();
        p.forget_peer(3);
        assert!(!p.holds((3, 0, ParkedKind::Write)) && p.holds((4, 0, ParkedKind::Write)));
    }
}
