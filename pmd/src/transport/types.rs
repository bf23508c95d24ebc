//! The public vocabulary of the transport: queue pairs, work requests,
//! completions and their statuses, peer states.

use crate::hw::Port;

use super::key::RegionKey;
use super::sgl::{RemoteAddr, Sge};

/// A queue pair: the handle for exchanging work with one peer. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Qp {
    pub(crate) peer: Port,
}

impl Qp {
    /// The peer this queue pair talks to.
    #[inline]
    pub fn peer(&self) -> Port {
        self.peer
    }
}

/// What kind of work a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// An eager send left (the payload is in the peer's window).
    Send,
    /// A message arrived into a posted receive.
    Recv,
    /// A write into a peer's region was received.
    Write,
    /// A read of known size landed in our region.
    Read,
    /// A read of unknown size landed in a region the transport allocated
    /// ([`Completion::region`]).
    ReadUnknown,
    /// A multicast put was delivered to every target (or failed for one).
    MulticastPut,
    /// A peer's multicast put landed in a region the transport allocated
    /// ([`Completion::region`]); the cookie is the initiator's op id.
    MulticastRecv,
    /// A one-sided write of ours was posted into the peer's region.
    WriteDirect,
    /// A peer's one-sided write with immediate landed in our region
    /// ([`Completion::region`]); the cookie is its immediate value.
    WriteImm,
}

/// One finished operation, as [`Transport::poll_completions`](super::Transport::poll_completions)
/// returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The peer (for a multicast put, the first target that failed, else the
    /// first target).
    pub peer: Port,
    /// The operation.
    pub op: OpKind,
    /// Its outcome.
    pub status: Status,
    /// Payload bytes moved.
    pub bytes: u64,
    /// The caller's cookie.
    pub cookie: u64,
    /// For [`OpKind::ReadUnknown`] and [`OpKind::MulticastRecv`], the
    /// region the transport allocated for the data: the application's now,
    /// deregister it when done with it. For [`OpKind::WriteImm`], the
    /// application's own region the peer wrote (leave it registered).
    pub region: Option<RegionKey>,
}

impl Completion {
    pub(crate) const EMPTY: Completion = Completion {
        peer: 0,
        op: OpKind::Send,
        status: Status::Success,
        bytes: 0,
        cookie: 0,
        region: None,
    };
}

impl Completion {
    /// Copies `src` field by field. A completion is read right after it was
    /// written, field by field: a whole-struct copy becomes wide loads that
    /// span several narrow stores still in the store buffer, which cannot be
    /// forwarded and stall (measured: a few ns per completion, on the
    /// latency path). Volatile reads keep each load the size of its store.
    #[inline]
    pub(crate) fn copy_fields(&mut self, src: &Completion) {
        // SAFETY: each pointer comes from a reference to a live, aligned,
        // initialised field; volatile only stops the loads being merged.
        unsafe {
            self.peer = std::ptr::read_volatile(&src.peer);
            self.op = std::ptr::read_volatile(&src.op);
            self.status = std::ptr::read_volatile(&src.status);
            self.bytes = std::ptr::read_volatile(&src.bytes);
            self.cookie = std::ptr::read_volatile(&src.cookie);
            self.region = std::ptr::read_volatile(&src.region);
        }
    }
}

impl Default for Completion {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// The connection state of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerState {
    /// The link is down (the peer is absent or dead).
    Down,
    /// The link is up and the handshake is under way.
    Connecting,
    /// Connected: queue pairs to this peer can post.
    Connected,
    /// The handshake failed (version or geometry mismatch); the reason.
    Failed(String),
    /// We were dropped from the fabric: this host stalled past the
    /// device's heartbeat timeout and its place was given to another. The
    /// transport writes nothing more; drop it and its device and join again.
    Lost,
}

/// Resources of one queue pair, for monitoring and for tests that check
/// that everything returns after a failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// Eager buffers of the peer's window we hold and may send into.
    pub eager_free: u32,
    /// Eager buffers per sender (the full count).
    pub eager_total: u32,
    /// Free slots in the peer's PostQ, as last credited.
    pub postq_free: u64,
    /// Messages waiting for credits towards the peer.
    pub backlog: usize,
    /// Operations of ours involving this peer that are still outstanding.
    pub outstanding: usize,
    /// Operations of the peer's that we are serving.
    pub serving: usize,
    /// Receives posted and not yet consumed.
    pub recvs_posted: usize,
}

/// One send of a batch: the payload (copied at post time), a cookie, and
/// whether it completes.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// The payload, at most the geometry's `eager_size` bytes.
    pub data: &'a [u8],
    /// The caller's cookie, returned in the completion.
    pub cookie: u64,
    /// Whether the send completes on our queue ([`OpKind::Send`]), as
    /// verbs' `IBV_SEND_SIGNALED`. With
    /// [`Config::signal_sends`](super::Config::signal_sends) on (the
    /// default, as a queue pair created with `sq_sig_all`) every send does,
    /// whatever this says; off, only the sends that ask. An unsignaled send
    /// is done when the post returns (its bytes are copied).
    pub signaled: bool,
}

/// One receive of a batch
/// ([`Transport::post_recvs`](super::Transport::post_recvs)).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr {
    /// The buffer (local write) the message is copied into.
    pub sge: Sge,
    /// The caller's cookie, returned in the completion.
    pub cookie: u64,
}

/// One write of a batch.
#[derive(Debug, Clone, Copy)]
pub struct WriteWr<'a> {
    /// Local source: SGEs in our registered regions (local read).
    pub local: &'a [Sge],
    /// Where in the peer's region.
    pub remote: RemoteAddr,
    /// The caller's cookie.
    pub cookie: u64,
}

/// One one-sided write of a batch
/// ([`Transport::post_writes_direct`](super::Transport::post_writes_direct)).
#[derive(Debug, Clone, Copy)]
pub struct DirectWr<'a> {
    /// The bytes to write, copied at post time.
    pub data: &'a [u8],
    /// Where in the peer's advertised region.
    pub remote: RemoteAddr,
    /// With `Some`, the peer's application is told, after the data, with a
    /// [`OpKind::WriteImm`] completion carrying it (verbs' write with
    /// immediate).
    pub imm: Option<u64>,
    /// Whether the write completes on our queue ([`OpKind::WriteDirect`]),
    /// as verbs' `IBV_SEND_SIGNALED`; an unsignaled write is done when the
    /// post returns.
    pub signaled: bool,
    /// The caller's cookie, returned in the completion.
    pub cookie: u64,
}

/// The outcome of a completed operation, as [`Completion::status`]
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The operation completed; `bytes` moved.
    Success,
    /// The remote side refused: unknown key, missing permission or range
    /// outside the remote region.
    RemoteAccess,
    /// A received message did not fit the posted receive buffer.
    LocalLength,
    /// The peer went down (left, died or rejoined) before the operation
    /// completed.
    PeerDown,
    /// The operation made no progress within the configured timeout.
    Timeout,
    /// The peer sent a malformed or out-of-range message for this operation.
    Protocol,
    /// A read of unknown size announced more than the caller allowed, or more
    /// than fits the region area or our queue's room for its SGL; or the
    /// target had no room for the operation: it serves its limit for us
    /// already, our storage quota there is spent, or the SGL of its range
    /// (a region scattered into many small extents) does not fit what its
    /// queue to us holds now. These pass, so a retry can succeed, unless
    /// the range alone needs more than half that queue (about 163 835 SGL
    /// entries). A multicast refused at one target gives the other
    /// targets' storage (and its share of our quota there) back as soon as
    /// they hear of the failure (a cancel, and down a chain a release from
    /// the link that would have written it), not at their operation
    /// timeout: a retry right after the completion may still find it held.
    TooLarge,
    /// A posted receive was discarded because its queue pair was reset.
    Flushed,
    /// The connection was reset from this side, the peer perhaps still up:
    /// its rings stopped making progress (a lost or corrupted slot or
    /// credit), a store into its window failed, or it stopped crediting
    /// what we queued for it; it reconnects by itself.
    Reset,
}

impl Status {
    /// Whether this is [`Status::Success`].
    #[inline]
    pub fn is_ok(self) -> bool {
        self == Status::Success
    }
}
