//! One peer port as seen by us: handshake bookkeeping, counters, posted
//! receives and, while connected, the connection.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::conn::Conn;
use super::counters::QpCounters;
use super::ops::PostedRecv;
use super::types::PeerState;
use super::watch::ConnWatch;

/// One peer port as seen by us.
pub(crate) struct Peer {
    /// Where the handshake stands.
    pub state: PeerState,
    /// Our incarnation towards this peer: the transport's at first, drawn
    /// anew when we reset this one connection (resync), see its link drop,
    /// or say goodbye, so that the next connection has a fresh epoch.
    pub my_inc: u64,
    /// The peer's incarnation from its last hello (0: none seen, or
    /// forgotten after link down).
    pub peer_inc: u64,
    /// The link generation the device reported when the link came up.
    pub link_gen: u64,
    /// How many hellos we wrote to it (their tags count up).
    pub hello_seq: u64,
    /// The tag of the last hello we read from it (a new tag is a new hello).
    pub last_hello_tag: u64,
    /// When it last presented a new incarnation (see
    /// `handshake::NEW_INCARNATION_HELLOS`).
    pub new_incarnation_at: Option<Instant>,
    /// Its incarnation as it was when we forgot it at a link drop: the same
    /// one presented again is the peer coming back, not a new incarnation,
    /// and is not held back by the rate limit.
    pub forgotten_inc: u64,
    /// When we last wrote it a hello (resent every `Config::hello_interval`).
    pub last_hello_sent: Option<Instant>,
    /// The connection, while connected.
    pub conn: Option<Conn>,
    /// The queue pair's counters (they survive reconnects).
    pub counters: QpCounters,
    /// Receives posted for its messages, oldest first.
    pub recvs: VecDeque<PostedRecv>,
    /// Whether the application created the queue pair.
    pub qp: bool,
    /// The connection as the peer's data queues see it.
    pub watch: Arc<ConnWatch>,
    /// Since when a connection we ended on our own, or whose link we saw
    /// drop, may still be alive at the peer (see `Transport::start_over`,
    /// `Transport::link_down`): `None` once the peer is known to hold
    /// nothing of it (`Transport::settle`).
    pub unsettled_since: Option<Instant>,
}

impl Peer {
    /// Forgets the peer's incarnation (its link dropped), remembering it
    /// in `forgotten_inc` so that the same one presented again is the peer
    /// coming back.
    pub fn forget_inc(&mut self) {
        if self.peer_inc != 0 {
            self.forgotten_inc = self.peer_inc;
        }
        self.peer_inc = 0;
    }

    /// A peer never heard of; we are incarnation `my_inc` towards it.
    pub fn new(my_inc: u64) -> Self {
        Self {
            state: PeerState::Down,
            my_inc,
            peer_inc: 0,
            link_gen: 0,
            hello_seq: 0,
            last_hello_tag: 0,
            new_incarnation_at: None,
            forgotten_inc: 0,
            last_hello_sent: None,
            conn: None,
            counters: QpCounters::default(),
            recvs: VecDeque::new(),
            qp: false,
            watch: Arc::new(ConnWatch::new()),
            unsettled_since: None,
        }
    }
}
