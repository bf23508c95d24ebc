//! The transport's error type, for calls that fail at once (operations
//! that fail later report a [`Status`](super::Status) in their completion).

use std::time::Duration;

use thiserror::Error;

use crate::hw::{HwError, Port};

use super::key::RegionKey;
use super::types::PeerState;

/// Why a transport call failed. Nothing was posted when a call returns one.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The device layer refused an access or a setup step.
    #[error("device: {0}")]
    Hw(#[from] HwError),
    /// The queue pair's peer is not connected (yet, or any more).
    #[error(
        "port {peer} is not connected: wait for the handshake (poll, or `wait_connected`) and retry"
    )]
    NotConnected {
        /// The peer.
        peer: Port,
    },
    /// The handshake with a peer failed: the two sides disagree on version
    /// or geometry. The connection stays down until one side restarts.
    #[error(
        "handshake with port {peer} failed: {reason}; create both transports with the same `Geometry`"
    )]
    HandshakeFailed {
        /// The peer.
        peer: Port,
        /// What did not match.
        reason: String,
    },
    /// Another transport of this process runs on this window (the same
    /// device opened twice), or mbufs an earlier one received are still
    /// alive: their buffers lie in it.
    #[error(
        "memory window {mw} of this device is in use by another transport of this process, or \
         by mbufs one received that are still alive: drop it (and free them) before creating \
         another"
    )]
    WindowInUse {
        /// The memory window.
        mw: usize,
    },
    /// No such peer port, or our own port.
    #[error("no such peer: port {peer}")]
    NoSuchPeer {
        /// The port asked for.
        peer: Port,
    },
    /// The local queue or eager buffers towards that peer are all in use, or
    /// the control messages waiting for its credits leave no room for a
    /// post's messages (an SGL, a request, an immediate's notice).
    #[error("no room towards port {peer}: {what}; poll completions and retry")]
    Busy {
        /// The peer.
        peer: Port,
        /// What is exhausted.
        what: &'static str,
    },
    /// Too many operations are outstanding on this transport.
    #[error("{limit} operations are already outstanding; poll completions and retry")]
    TooManyOutstanding {
        /// The configured limit.
        limit: usize,
    },
    /// A region key that is not registered.
    #[error("no registered region with key {0:?}")]
    NoSuchRegion(RegionKey),
    /// A one-sided write names a region the peer has not advertised to us
    /// (or has revoked).
    #[error(
        "port {peer} has not advertised region {key:?} for one-sided writes (or revoked it): \
         the peer must register it with remote-write access for us, in one piece of its area \
         (a scattered region is not advertised); or use post_write"
    )]
    UnknownRemoteKey {
        /// The peer.
        peer: Port,
        /// The key.
        key: RegionKey,
    },
    /// A one-sided write outside the peer's advertised region.
    #[error("range {offset}+{len} is outside port {peer}'s region {key:?} of {region_len} bytes")]
    RemoteOutOfRange {
        /// The peer.
        peer: Port,
        /// The region.
        key: RegionKey,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The region's length.
        region_len: u32,
    },
    /// A remote range whose end does not fit in 64 bits: no region holds
    /// it (the target would drop the request as malformed, unanswered).
    #[error(
        "remote range {offset}+{len} of region {key:?} overflows 64 bits: no region holds it; \
         check the remote offset"
    )]
    RemoteRangeOverflows {
        /// The region.
        key: RegionKey,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
    },
    /// A peer named a region outside its protection domain.
    #[error("region {key:?} is not registered for port {peer}")]
    NotInDomain {
        /// The region.
        key: RegionKey,
        /// The peer that asked.
        peer: Port,
    },
    /// A read into local regions so scattered that its SGL would take more
    /// control messages than one operation may queue towards a peer.
    #[error(
        "the read's local SGL needs {msgs} control messages, more than the {max} one operation \
         may queue: read into fewer, larger extents (register_region), or split the read"
    )]
    SglTooLong {
        /// Messages the request and its SGL need.
        msgs: usize,
        /// Most one operation may queue.
        max: usize,
    },
    /// A local region lacks the permission an operation needs.
    #[error("region {key:?} does not allow {needed}")]
    Permission {
        /// The region.
        key: RegionKey,
        /// The missing permission.
        needed: &'static str,
    },
    /// An offset/length outside a local region.
    #[error("range {offset}+{len} is outside region {key:?} of {region_len} bytes")]
    OutOfRange {
        /// The region.
        key: RegionKey,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Region length.
        region_len: u64,
    },
    /// The window's region area has no room for a new region.
    #[error(
        "no room for a {len}-byte region ({free} bytes free in the window's region area): deregister regions or use a larger window"
    )]
    RegionAreaFull {
        /// Bytes asked for.
        len: u64,
        /// Bytes free.
        free: u64,
    },
    /// This host was dropped from the fabric (it stalled past the device's
    /// heartbeat timeout and its place was given to another).
    #[error(
        "this host was dropped from the fabric (it stalled past the heartbeat timeout and \
         its place was given to another host): drop the transport and its device, then join again"
    )]
    Lost,
    /// The geometry cannot be laid out.
    #[error("invalid geometry: {0}")]
    Geometry(#[from] GeometryError),
    /// The geometry has fewer ports than the fabric.
    #[error(
        "geometry has {geometry} ports but the fabric has {fabric}: use Geometry with ports >= {fabric}"
    )]
    TooFewPorts {
        /// Ports in the geometry.
        geometry: u16,
        /// Ports of the fabric.
        fabric: usize,
    },
    /// No such data queue in the geometry.
    #[error(
        "data queue {queue} towards port {peer} does not exist: the geometry has {count} data queues per peer (set Geometry::data)"
    )]
    NoDataQueue {
        /// The peer asked for.
        peer: u16,
        /// The queue asked for.
        queue: u16,
        /// Data queues per peer.
        count: u16,
    },
    /// The data queue was taken already (each is taken once, then moved
    /// between threads as needed).
    #[error("data queue {queue} towards port {peer} was taken already: move that handle instead")]
    DataQueueTaken {
        /// The peer.
        peer: u16,
        /// The queue.
        queue: u16,
    },
    /// The receive pool over a data queue's buffers could not be built.
    #[error("data queue receive pool: {0}")]
    DataQueuePool(String),
    /// The device's window cannot hold the geometry's sections.
    #[error(
        "window of {len} bytes is too small for this geometry (needs at least {needed}): use a smaller Geometry or a larger window"
    )]
    WindowTooSmall {
        /// The window's length.
        len: usize,
        /// The least it needs.
        needed: usize,
    },
    /// A transfer of zero bytes, or of 4 GiB or more.
    #[error("transfer of {len} bytes: must be 1 byte to 4 GiB - 1")]
    TransferSize {
        /// Bytes asked for.
        len: u64,
    },
    /// A send of zero bytes, or larger than an eager buffer.
    #[error("send of {len} bytes: must be 1..={max} (use post_write for more)")]
    SendSize {
        /// Bytes asked for.
        len: usize,
        /// The geometry's `eager_size`.
        max: usize,
    },
    /// A region of zero bytes.
    #[error("a region needs at least one byte")]
    EmptyRegion,
    /// A multicast put with no target.
    #[error("multicast put needs at least one target")]
    NoTargets,
    /// A multicast put that lists a target twice.
    #[error("port {peer} is listed twice among the multicast targets")]
    DuplicateTarget {
        /// The port listed twice.
        peer: Port,
    },
    /// A peer did not connect in time.
    #[error("port {peer} did not connect within {timeout:?} (state {state:?})")]
    ConnectTimeout {
        /// The peer.
        peer: Port,
        /// How long we waited.
        timeout: Duration,
        /// Where the handshake stood.
        state: PeerState,
    },
    /// A stats page could not be published or read (see
    /// [`read_stats`](super::read_stats)).
    #[error("stats page {what}")]
    Stats {
        /// Which page, and what went wrong.
        what: String,
    },
    /// A stats page whose owner stayed in the middle of rewriting it (or
    /// rewrote it at every try) for the 100 ms
    /// [`read_stats`](super::read_stats) retries: the owner is stopped (a
    /// job-control stop, a debugger), stuck, or was killed mid-write (tell
    /// these apart by whether `pid` still holds its port).
    #[error(
        "stats page {}: its owner (pid {pid}) stayed in the middle of rewriting it: \
         stopped, stuck, or killed while writing",
        path.display()
    )]
    StatsMidWrite {
        /// The page.
        path: std::path::PathBuf,
        /// The owner's pid, from the page's header.
        pid: u32,
        /// The owner's join generation, from the page's header.
        generation: u64,
    },
}

impl TransportError {
    /// `Busy`: the control messages waiting for `peer`'s credits leave no
    /// room for a post's messages.
    pub(crate) fn backlog_busy(peer: Port) -> Self {
        TransportError::Busy {
            peer,
            what: "control messages waiting for the peer's credits",
        }
    }
}

/// Why a [`Geometry`](super::Geometry) cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GeometryError {
    /// Fewer than two ports.
    #[error("geometry needs at least 2 ports, got {0}")]
    Ports(u16),
    /// A queue depth that is not a power of two in 4..=4096.
    #[error("queue_depth must be a power of two in 4..=4096, got {0}")]
    QueueDepth(u32),
    /// An eager buffer count outside 1..=4096.
    #[error("eager_count must be in 1..=4096, got {0}")]
    EagerCount(u32),
    /// An eager buffer size that is not a multiple of 64 in 64..=1 MiB.
    #[error("eager_size must be a multiple of 64 in 64..=1048576, got {0}")]
    EagerSize(u32),
    /// More than 16 data queues per peer.
    #[error("data queues per peer must be at most 16, got {0}")]
    DataQueues(u16),
    /// A data queue descriptor count that is not a power of two in 16..=4096.
    #[error("data queue nb_desc must be a power of two in 16..=4096, got {0}")]
    DataDesc(u32),
    /// A data queue buffer size that is not a multiple of 64 in 64..=64 KiB.
    #[error("data queue buf_size must be a multiple of 64 in 64..=65536, got {0}")]
    DataBufSize(u32),
}

/// Shorthand for transport results.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;
