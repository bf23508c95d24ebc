//! The transport's error type (for calls that fail at once) and the status of
//! a completion (for operations that fail later).

use thiserror::Error;

use crate::hw::{HwError, Port};

use super::region::RegionKey;

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
    /// No such peer port, or our own port.
    #[error("no such peer: port {peer}")]
    NoSuchPeer {
        /// The port asked for.
        peer: Port,
    },
    /// The local queue or eager buffers towards that peer are all in use.
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
    /// A bad argument (empty transfer, too long, bad geometry...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A wait ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),
}

/// Shorthand for transport results.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// The outcome of a completed operation, as [`Completion::status`](super::Completion)
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
    /// than fits the region area.
    TooLarge,
    /// A posted receive was discarded because its queue pair was reset.
    Flushed,
}

impl Status {
    /// Whether this is [`Status::Success`].
    #[inline]
    pub fn is_ok(self) -> bool {
        self == Status::Success
    }
}
