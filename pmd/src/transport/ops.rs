//! Operations in flight: ours (initiated by this host, waiting for a peer)
//! and served ones (a peer's, waiting for more of its messages), plus the
//! receives the application posted.
//!
//! These are plain records; the files that move them along are
//! `initiator.rs` (ours), `target.rs` (served) and `multicast.rs`.

use std::time::Instant;

use crate::hw::Port;

use super::key::RegionKey;
use super::region::Extents;
use super::sgl::{ExtentCursor, ExtentPos};
use super::types::Status;
use super::wire::WireSge;

/// An operation we initiated.
#[derive(Debug)]
pub(crate) struct OutOp {
    /// The caller's cookie, returned in the completion.
    pub cookie: u64,
    /// When it fails with [`Status::Timeout`] (pushed back on progress).
    pub deadline: Instant,
    /// What it is waiting for.
    pub kind: OutKind,
}

impl OutOp {
    /// Whether this op involves `peer`.
    pub fn involves(&self, peer: Port) -> bool {
        match &self.kind {
            OutKind::Write { peer: p, .. }
            | OutKind::ReadSize { peer: p, .. }
            | OutKind::Read { peer: p, .. } => *p == peer,
            OutKind::Multicast { targets, .. } => targets.iter().any(|t| t.peer == peer),
        }
    }
}

/// What an operation of ours is waiting for.
#[derive(Debug)]
pub(crate) enum OutKind {
    /// A rendezvous write: the target's SGL, then its `Ack`.
    Write {
        /// The target.
        peer: Port,
        /// Our source extents.
        src: ExtentCursor,
        /// Transfer length.
        len: u32,
        /// Bytes copied so far (SGL segments arrive in order).
        delivered: u32,
        /// Whether we sent `Done` (everything copied).
        done: bool,
        /// When it was posted: no copy starts past
        /// [`Config::copy_window`](super::Config::copy_window) after it.
        posted: Instant,
    },
    /// A read of unknown size: the target's `ReadSize`.
    ReadSize {
        /// The target.
        peer: Port,
        /// Its region key.
        rkey: u32,
        /// Offset in its region.
        roff: u64,
        /// The most the caller accepts.
        max_len: u64,
    },
    /// A read: the target copies into our extents, then `Ack`s.
    Read {
        /// The target.
        peer: Port,
        /// Transfer length.
        len: u32,
        /// The region we allocated for a read of unknown size (freed if it
        /// fails, handed to the caller if it succeeds).
        region: Option<RegionKey>,
    },
    /// A multicast put: every target's storage, one copy each, their acks.
    Multicast {
        /// When it was posted: every target's deadline for the put
        /// started after that (when it got the request).
        posted: Instant,
        /// Our source extents.
        src: Vec<(u64, u64)>,
        /// Transfer length.
        len: u32,
        /// Each target's progress.
        targets: Vec<McTarget>,
        /// Whether the data was put (the check-in counter reached zero).
        put: bool,
        /// Store and forward down the list rather than fan-out.
        chain: bool,
    },
}

/// A target of a multicast put.
#[derive(Debug)]
pub(crate) struct McTarget {
    /// Its port.
    pub peer: Port,
    /// Its storage, as its SGL segments arrive.
    pub sgl: Vec<(u64, u64)>,
    /// Bytes of storage announced so far.
    pub got: u32,
    /// Whether its storage is complete (clear to send).
    pub ready: bool,
    /// Whether we copied the data into its storage (fan-out: each target;
    /// chain: the first). A ready target not copied after the put found its
    /// grant table mid-edit: the copy is tried again.
    pub copied: bool,
    /// Its outcome, once known.
    pub status: Option<Status>,
}

/// An operation a peer started that we serve.
#[derive(Debug)]
pub(crate) enum InOp {
    /// We granted a write and wait for its Done.
    Write {
        /// The region written (held until the write ends).
        region: RegionKey,
        /// Transfer length.
        len: u32,
        /// When we stop waiting.
        deadline: Instant,
    },
    /// We serve a read: copy from the region as SGL segments arrive.
    Read {
        /// The region read (deregistering it ends the read, so its extents
        /// stay as they are while this lives).
        region: RegionKey,
        /// Its registration ([`Region::serial`](super::region::Region)):
        /// checked at each segment, so the walk never goes on over another
        /// region that took the key.
        serial: u64,
        /// The region offset of the transfer's first byte.
        roff: u64,
        /// Where the copy is in the region's extents (region offsets).
        at: ExtentPos,
        /// Transfer length.
        len: u32,
        /// Bytes copied so far.
        delivered: u32,
        /// When we stop waiting.
        deadline: Instant,
        /// When we stop copying: the copy window from the request's
        /// arrival. The reader gives its operation up a timeout after it
        /// posted it, and may reuse its memory then; a part copied later
        /// (one that waited out a peer's grant table mid-edit, or arrived
        /// late) could land in it. Past this, the read is dropped unserved
        /// and the reader's operation times out. This assumes, as
        /// `Config::op_timeout` does, equal timeouts on both sides and a
        /// request handled within a quarter of one after it was posted; a
        /// host stalled longer than that can still copy after the reader
        /// gave up.
        copy_by: Instant,
    },
    /// A multicast target: storage allocated, waiting for Done.
    McRecv {
        /// The storage we allocated.
        region: RegionKey,
        /// Transfer length.
        len: u32,
        /// When we stop waiting (and free the storage).
        deadline: Instant,
        /// Our place in a store-and-forward chain.
        chain: Option<Box<ChainLink>>,
    },
}

impl InOp {
    /// The storage we allocated for it (a multicast target's): region and
    /// length.
    pub fn storage(&self) -> Option<(RegionKey, u32)> {
        match *self {
            InOp::McRecv { region, len, .. } => Some((region, len)),
            _ => None,
        }
    }

    /// When we stop waiting for it.
    pub fn deadline(&self) -> Instant {
        match self {
            InOp::Write { deadline, .. }
            | InOp::Read { deadline, .. }
            | InOp::McRecv { deadline, .. } => *deadline,
        }
    }
}

/// A target's place in a store-and-forward multicast chain.
#[derive(Debug)]
pub(crate) struct ChainLink {
    /// Where our data comes from (the initiator or the previous target).
    pub prev: Port,
    /// Where we forward it, with that target's storage as it arrives.
    pub next: Option<Port>,
    /// The next target's storage, as its segments arrive.
    pub next_sgl: Vec<(u64, u64)>,
    /// Bytes of the next target's storage announced so far.
    pub next_got: u32,
    /// The incarnation of the host on `next`'s port that gave us that
    /// storage: a new host there (the old one restarted) may have reused
    /// the memory, so it is written only while this one is there.
    pub next_inc: u64,
    /// Whether we sent our own storage to `prev` (clear to send).
    pub cts_sent: bool,
    /// Whether the initiator cancelled the operation while `prev` may
    /// still write our storage: we wait for `prev` to be done with it
    /// (`ChainDone` or `ChainRelease`), then free it, delivering and
    /// forwarding nothing.
    pub cancelled: bool,
}

impl ChainLink {
    /// The next link, when we hold (part of) the storage it gave us.
    pub fn holding_next(&self) -> Option<Port> {
        self.next.filter(|_| self.next_got > 0)
    }
}

/// Storage we stopped using while the one peer that writes it may still
/// do so: kept aside, not reused, until that peer is done with it or two
/// more operation timeouts pass (a connection to it that ends proves
/// nothing: it may not have noticed yet). Two kinds: a chain link's we
/// stopped serving (it timed out, or our connection to the initiator
/// ended), which its previous link may still forward into until its
/// `ChainDone` or `ChainRelease`; and the destination of our read of
/// unknown size that failed, which the target serves from when our request
/// reached it and may still be copying into. The read's target serves it
/// within its connection with us, so a destination also goes once that
/// target holds nothing of the connection any more (`settle`).
#[derive(Debug)]
pub(crate) struct KeptStorage {
    /// The operation's initiator (we, for a read's destination).
    pub origin: Port,
    /// Its op id.
    pub op: u64,
    /// The one peer that may write the storage: the previous link, or the
    /// read's target.
    pub prev: Port,
    /// The storage.
    pub region: RegionKey,
    /// Its length (a chain link's still counts against the initiator's
    /// quota).
    pub len: u32,
    /// When it was set aside.
    pub at: Instant,
}

/// Multicast storage delivered to the application (the region of a
/// `MulticastRecv` completion): it stays in its origin's share of the
/// region area and of the grant table until the application deregisters
/// it, so that a peer cannot hold more than its share by having each put
/// delivered.
#[derive(Debug)]
pub(crate) struct DeliveredStorage {
    /// The peer whose put filled it.
    pub origin: Port,
    /// The storage, now the application's region.
    pub region: RegionKey,
    /// Its length.
    pub len: u32,
}

/// A chain target's storage that arrived before our own request to send.
#[derive(Debug)]
pub(crate) struct EarlySgl {
    /// The chain's initiator.
    pub origin: Port,
    /// Its op id.
    pub op: u64,
    /// The target that sent the storage (our successor).
    pub from: Port,
    /// Offset of the first segment in the transfer.
    pub start: u32,
    /// The segments.
    pub sges: Vec<WireSge>,
    /// When it arrived (dropped after the operation timeout).
    pub at: Instant,
}

/// A receive posted by the application.
#[derive(Debug)]
pub(crate) struct PostedRecv {
    /// Where the message goes (our window).
    pub extents: Extents,
    /// The buffer's length.
    pub len: u64,
    /// The caller's cookie.
    pub cookie: u64,
}
