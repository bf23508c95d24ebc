//! The device layer's error type.

use thiserror::Error;

/// What can go wrong at the device layer. Every variant says what failed and,
/// where there is one, what to do about it.
#[derive(Debug, Error)]
pub enum HwError {
    /// An access would fall outside a memory window. Nothing was written.
    #[error(
        "access out of bounds: offset {offset} + length {len} exceeds the {window_len}-byte window"
    )]
    OutOfBounds {
        /// Requested offset.
        offset: usize,
        /// Requested length.
        len: usize,
        /// Size of the window.
        window_len: usize,
    },
    /// An atomic store or load at an offset not aligned to its size.
    #[error("misaligned {size}-byte access at offset {offset}")]
    Misaligned {
        /// Requested offset.
        offset: usize,
        /// Access size in bytes.
        size: usize,
    },
    /// Our place on the fabric was given to another host: we stalled past
    /// the heartbeat timeout (a stopped process, a debugger, swap) and were
    /// declared dead. Nothing more is written through this device.
    #[error(
        "our slot {port} was reclaimed by a peer (this host stalled past the heartbeat \
         timeout): drop the device and everything built on it, and join again"
    )]
    SlotLost {
        /// The slot (port) we held.
        port: u16,
    },
    /// A posted write fell outside what the peer granted us (its per-peer
    /// translation). Nothing was written.
    #[error(
        "write of {len} bytes at offset {offset} is outside what port {peer} granted us \
         (our mailbox, our section, the regions it registered for us)"
    )]
    NotGranted {
        /// The peer whose window it was.
        peer: u16,
        /// Requested offset.
        offset: usize,
        /// Requested length.
        len: usize,
    },
    /// The peer's table of granted ranges was being edited at every look
    /// (its owner preempted mid-edit): no answer yet. Nothing was written;
    /// try again.
    #[error(
        "port {peer}'s grant table was being edited at every look: nothing written; try again \
         (a live peer finishes an edit in microseconds)"
    )]
    GrantTableBusy {
        /// The peer whose table it is.
        peer: u16,
    },
    /// The table of ranges granted to peers (regions registered for them)
    /// is full.
    #[error(
        "cannot grant a peer {len} bytes at offset {offset}: all {capacity} entries of this \
         window's grant table are in use (one per extent and peer of each registered region); \
         deregister regions, or register fewer scattered or per-peer ones"
    )]
    GrantTableFull {
        /// Offset of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Entries in the table.
        capacity: usize,
    },
    /// The peer (slot/port) number does not exist on this fabric or is our own.
    #[error("no such peer: port {peer} (this fabric has {ports} ports; own port {own})")]
    NoSuchPeer {
        /// Requested peer.
        peer: u16,
        /// Ports on the fabric.
        ports: usize,
        /// Our own port.
        own: u16,
    },
    /// The link to the peer is down (the peer is absent or has left).
    #[error("link to port {peer} is down")]
    LinkDown {
        /// The peer.
        peer: u16,
    },
    /// A memory window index that the device does not have.
    #[error("no memory window {mw} (the device has {count})")]
    NoSuchWindow {
        /// Requested window.
        mw: usize,
        /// Windows the device has.
        count: usize,
    },
    /// A scratchpad index that the device does not have.
    #[error("no scratchpad {index} (the device has {count})")]
    NoSuchSpad {
        /// Requested scratchpad.
        index: usize,
        /// Scratchpads the device has.
        count: usize,
    },
    /// A non-posted read found every requester-ID look-up table entry taken.
    #[error(
        "non-posted read refused: all {entries} R-LUT entries are in use (posted writes do not need one)"
    )]
    RlutExhausted {
        /// Entries in the R-LUT.
        entries: usize,
    },
    /// An argument the device cannot accept (bad geometry, bad translation).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The fabric or device is not in a usable state (wrong version, geometry
    /// mismatch, corrupted control data, all slots taken...).
    #[error("{0}")]
    Fabric(String),
    /// Memory for a window could not be created or mapped.
    #[error(transparent)]
    Mem(#[from] ntbdk_mempool::MemError),
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Shorthand for device-layer results.
pub type Result<T, E = HwError> = std::result::Result<T, E>;
