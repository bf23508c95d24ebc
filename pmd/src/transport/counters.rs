//! Per-queue-pair counters: operations, bytes, errors by kind, empty polls.

/// Why a message from a peer was dropped or failed an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum DropKind {
    /// The body did not decode (unknown code, reserved bits set, bad count).
    Malformed,
    /// A message on a queue that does not carry it.
    WrongQueue,
    /// A length, offset or SGL entry out of range.
    OutOfRange,
    /// An op id that names no operation in a state expecting this message.
    UnknownOp,
    /// An op id already used (a replayed or duplicated message).
    Replay,
    /// An unknown key or missing permission.
    Access,
    /// A bad eager buffer (index not lent to the sender) or FreeQ entry.
    BadBuffer,
    /// A credit word going backwards or beyond what was produced.
    BadCredit,
    /// The peer started more operations than we serve at once, advertised
    /// more regions than we keep, sent a write-with-immediate notice while
    /// our completion queue was at its depth, asked for an operation whose
    /// SGL our queue to it (or to the chain link it named) could not hold
    /// now (refused), or stopped
    /// crediting what we send it (refused, or the connection reset).
    Overload,
}

/// Number of [`DropKind`]s.
pub const DROP_KINDS: usize = 9;

impl DropKind {
    /// Every kind, in the order of [`QpCounters::dropped`].
    pub const ALL: [DropKind; DROP_KINDS] = [
        DropKind::Malformed,
        DropKind::WrongQueue,
        DropKind::OutOfRange,
        DropKind::UnknownOp,
        DropKind::Replay,
        DropKind::Access,
        DropKind::BadBuffer,
        DropKind::BadCredit,
        DropKind::Overload,
    ];

    /// Its name in tables: `malformed`, `wrong-queue`...
    pub fn name(self) -> &'static str {
        match self {
            DropKind::Malformed => "malformed",
            DropKind::WrongQueue => "wrong-queue",
            DropKind::OutOfRange => "out-of-range",
            DropKind::UnknownOp => "unknown-op",
            DropKind::Replay => "replay",
            DropKind::Access => "access",
            DropKind::BadBuffer => "bad-buffer",
            DropKind::BadCredit => "bad-credit",
            DropKind::Overload => "overload",
        }
    }
}

/// Counters of one queue pair (one peer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Sends posted.
    pub sends: u64,
    /// Messages received into posted receives.
    pub recvs: u64,
    /// Writes completed (as initiator).
    pub writes: u64,
    /// Reads completed (as initiator).
    pub reads: u64,
    /// Multicast puts towards this peer completed.
    pub multicasts: u64,
    /// Operations served as target (writes placed, reads served, multicast
    /// deliveries).
    pub served: u64,
    /// Payload bytes we moved towards the peer.
    pub bytes_out: u64,
    /// Payload bytes we received (eager) or that the peer placed into our
    /// regions.
    pub bytes_in: u64,
    /// Operations completed with an error status.
    pub failed_ops: u64,
    /// Messages dropped or refused, by [`DropKind`].
    pub dropped: [u64; DROP_KINDS],
    /// Polls of this peer's queues that found nothing.
    pub empty_polls: u64,
    /// Connections established (1 + reconnects).
    pub connects: u64,
    /// Connections lost.
    pub disconnects: u64,
    /// Connections reset because their rings stopped making progress.
    pub resyncs: u64,
}

impl QpCounters {
    /// Messages dropped, all kinds.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// Messages dropped of one kind.
    pub fn dropped(&self, kind: DropKind) -> u64 {
        self.dropped[kind as usize]
    }

    #[inline]
    pub(crate) fn drop_one(&mut self, kind: DropKind) {
        self.dropped[kind as usize] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_at_its_index_with_its_own_name() {
        for (i, k) in DropKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        let mut names: Vec<_> = DropKind::ALL.iter().map(|k| k.name()).collect();
        names.dedup();
        assert_eq!(names.len(), DROP_KINDS);
    }
}
