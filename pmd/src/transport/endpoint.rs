//! [`Transport`]: one host's endpoint — its window, region table, peers and
//! operations — its construction, what it tells about itself, and the
//! completion queue the application polls.
//!
//! The verbs live beside it, one role a file: `memory.rs` (regions),
//! `post.rs` (posting work), `poll.rs` (the poll loop), `receive.rs`,
//! `target.rs`, `initiator.rs`, `multicast.rs`, `direct.rs` (one-sided
//! writes), `handshake.rs`, `publish.rs` (the stats page), `retry.rs`
//! (copies set aside while a peer's grant table is mid-edit) and `dataq/`
//! (the data queues).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw::{LinkEvent, LocalWindow, NtbDevice, PeerGrant, Port, Strided};

use super::claim::WindowClaim;
use super::completion_queue::CompletionQueue;
use super::config::{Config, saturating_after};
use super::counters::QpCounters;
use super::dma::{CpuEngine, DmaEngine};
use super::error::{Result, TransportError};
use super::geometry::Layout;
use super::idhash::IdMap;
use super::ops::{DeliveredStorage, EarlySgl, InOp, KeptStorage, OutKind, OutOp};
use super::parked::Parked;
use super::peer::Peer;
use super::region::RegionTable;
use super::stats_page::StatsPage;
use super::types::{Completion, PeerState, Qp, Resources};
use super::wire::{Msg, Ring, SLOT, WireStatus};

/// `poll_completions` makes progress at least once in this many calls, even
/// while completions are waiting (see [`Transport::poll_completions`]).
pub(crate) const PROGRESS_AT_LEAST_EVERY: u32 = 16;

/// One host's transport endpoint over an [`NtbDevice`].
///
/// All progress happens in [`poll_completions`](Self::poll_completions) (or
/// [`progress`](Self::progress)): the transport has no thread of its own.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ntbdk_pmd::hw::loopback::LoopbackFabric;
/// use ntbdk_pmd::transport::{Access, Completion, Config, Geometry,
///     OpKind, RemoteAddr, Sge, Transport};
///
/// let fabric = LoopbackFabric::new(2, 1 << 20);
/// let cfg = Config::new(Geometry::small(2));
/// let mut a = Transport::new(Arc::new(fabric.join(0).unwrap()), cfg.clone()).unwrap();
/// let mut b = Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap();
/// let (qa, _qb) = (a.create_qp(1).unwrap(), b.create_qp(0).unwrap());
/// let deadline = std::time::Instant::now() + Duration::from_secs(5);
/// while !a.is_connected(1) || !b.is_connected(0) {
///     a.progress();
///     b.progress();
///     assert!(std::time::Instant::now() < deadline);
/// }
/// // B exposes a region; A writes into it with one copy.
/// let dst = b.register_region(4096, Access::ALL).unwrap();
/// let src = a.register_region(4096, Access::LOCAL).unwrap();
/// a.region_write(src, 0, &[7u8; 4096]).unwrap();
/// let sge = Sge { key: src, offset: 0, len: 4096 };
/// a.post_write(qa, &[sge], RemoteAddr { key: dst, offset: 0 }, 42).unwrap();
/// let mut done = [Completion::default(); 8];
/// loop {
///     b.progress();
///     let n = a.poll_completions(&mut done);
///     if n > 0 {
///         assert_eq!((done[0].op, done[0].cookie, done[0].bytes), (OpKind::Write, 42, 4096));
///         assert!(done[0].status.is_ok());
///         break;
///     }
///     assert!(std::time::Instant::now() < deadline);
/// }
/// let mut check = [0u8; 4096];
/// b.region_read(dst, 0, &mut check).unwrap();
/// assert!(check.iter().all(|&x| x == 7));
/// ```
pub struct Transport {
    /// The device underneath (link state, windows, doorbells).
    pub(crate) dev: Arc<dyn NtbDevice>,
    /// Our port on the fabric.
    pub(crate) me: Port,
    /// The configuration we were created with.
    pub(crate) cfg: Config,
    /// Where everything lies in every host's window (from the geometry).
    pub(crate) layout: Layout,
    /// Our inbound window: what peers write, and only we read.
    pub(crate) local: LocalWindow,
    /// Our incarnation: random, new for every transport (and on goodbye).
    pub(crate) incarnation: u64,
    /// Every port of the fabric (ours included, never connected), by port.
    pub(crate) peers: Vec<Peer>,
    /// The connected ports, in the order the poll loop visits them.
    pub(crate) connected: Vec<Port>,
    /// Our registered regions and the region area's allocator.
    pub(crate) regions: RegionTable,
    /// Operations we initiated, by op id.
    pub(crate) ops: IdMap<u64, OutOp>,
    /// The next op id (ids only grow: a peer's replay check relies on it).
    pub(crate) next_op: u64,
    /// Completions not yet polled by the application.
    pub(crate) completions: CompletionQueue,
    /// A notice was refused at `Config::cq_depth` and the queue has not
    /// been polled below its depth since (so the warning is said once per
    /// overrun).
    pub(crate) cq_overrun: bool,
    /// The data mover for payloads.
    pub(crate) engine: Box<dyn DmaEngine>,
    /// Polls so far (the clock is read for the slow path every 64th, or
    /// every 8th while a peer is missing).
    pub(crate) polls: u32,
    /// `poll_completions` calls in a row that found completions waiting and
    /// so made no progress (see [`PROGRESS_AT_LEAST_EVERY`]).
    pub(crate) polls_without_progress: u32,
    /// When the slow path last ran.
    pub(crate) last_slow: Instant,
    /// Link events taken from the device (kept for reuse).
    pub(crate) events: Vec<LinkEvent>,
    /// Peers whose connection broke during this poll (torn down at its end).
    pub(crate) doomed: Vec<Port>,
    /// SGLs whose copy found the peer's grant table mid-edit, tried again
    /// from the slow path.
    pub(crate) parked: Parked,
    /// Control-ring messages taken by a poll, handled after it (kept for reuse).
    pub(crate) scratch: Vec<Msg>,
    /// The slots of the send batch being posted, encoded here before one
    /// run of stores copies them into the peer's PostQ (kept for reuse).
    pub(crate) send_stage: Vec<super::wire::Words>,
    /// Chain targets' storage that arrived before our request from the
    /// chain's initiator.
    pub(crate) chain_early: Vec<EarlySgl>,
    /// Storage set aside while a peer could still write it (see
    /// [`KeptStorage`]).
    pub(crate) kept_storage: Vec<KeptStorage>,
    /// Multicast storage the application holds (see [`DeliveredStorage`]).
    pub(crate) delivered_storage: Vec<DeliveredStorage>,
    /// Operations we served for a connection that ended while the peer
    /// may still be working on them (it writes what we granted until it
    /// sees the connection end): each keeps what it holds until its
    /// deadline, or until the peer is known to hold nothing of that
    /// connection (`settle`).
    pub(crate) orphans: Vec<(Port, u64, InOp)>,
    /// Most bytes of the region area one peer's storage requests may hold
    /// (from `Config::peer_storage_quota`).
    pub(crate) storage_quota: u64,
    /// Whether the device enforces our per-peer grant (see
    /// [`peers_isolated`](Transport::peers_isolated)).
    pub(crate) isolated: bool,
    /// Whether the device told us we lost our place on the fabric: from
    /// then on nothing is written (see [`PeerState::Lost`]).
    pub(crate) lost: bool,
    /// Where our counters are published for other processes, if anywhere
    /// (see [`publish_stats`](Transport::publish_stats)).
    pub(crate) stats_page: Option<StatsPage>,
    /// Our claim on the local window (one transport per window in this
    /// process; released after everything else, the goodbye included).
    pub(crate) claim: Arc<WindowClaim>,
}

/// The parts of a transport that moving data touches, borrowed apart: the
/// operations we initiated, every port (windows, counters), the data mover,
/// our window, and our regions (read only: a served read walks one's
/// extents).
pub(crate) struct Movers<'a>(
    pub &'a mut IdMap<u64, OutOp>,
    pub &'a mut [Peer],
    pub &'a mut dyn DmaEngine,
    pub &'a LocalWindow,
    pub &'a RegionTable,
);

impl Drop for Transport {
    fn drop(&mut self) {
        self.say_goodbye();
        for p in &self.peers {
            p.watch.down();
        }
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("port", &self.me)
            .field("connected", &self.connected)
            .field("outstanding", &self.ops.len())
            .finish_non_exhaustive()
    }
}

/// The first op id of a transport of incarnation `incarnation`: its low
/// 31 bits above the 32 bits of a counter. A peer tells our operations
/// apart by id alone (`Done`, `ChainRelease`, ... name an op of ours), so
/// a transport that replaces another on the same port must not reuse the
/// old one's ids while messages about them may still be on their way;
/// ids still only rise (a peer refuses an id at or below the highest it
/// has seen from us, on each connection), from at most 2^63: 2^63
/// operations before they could wrap.
pub(crate) fn first_op_id(incarnation: u64) -> u64 {
    ((incarnation & 0x7fff_ffff) << 32) | 1
}

/// A random nonzero 64-bit number (incarnations, first region keys).
pub(crate) fn random_u64(salt: u64) -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

impl Transport {
    /// Sets up the transport on `dev`'s window `cfg.mw`: writes the header,
    /// clears the per-peer sections (not the mailboxes, which peers may
    /// already have written) and starts the handshake with every peer whose
    /// link is up.
    pub fn new(dev: Arc<dyn NtbDevice>, cfg: Config) -> Result<Self> {
        let layout = cfg.geometry.layout()?;
        if usize::from(cfg.geometry.ports) < dev.port_count() {
            return Err(TransportError::TooFewPorts {
                geometry: cfg.geometry.ports,
                fabric: dev.port_count(),
            });
        }
        let local = dev.local_window(cfg.mw)?;
        if local.len() < layout.window_size_for(4096) {
            return Err(TransportError::WindowTooSmall {
                len: local.len(),
                needed: layout.window_size_for(4096),
            });
        }
        let claim = WindowClaim::take(&local, cfg.mw)?;
        let me = dev.port();
        let incarnation = random_u64(dev.generation());
        let regions = RegionTable::new(layout.region_area_start() as u64, local.len() as u64)
            .with_grants(dev.clone(), cfg.mw);
        let others = (dev.port_count() as u64).saturating_sub(1).max(1);
        let storage_quota = cfg
            .peer_storage_quota
            .unwrap_or(regions.free_bytes() / others);
        let mut t = Self {
            peers: (0..dev.port_count())
                .map(|_| Peer::new(incarnation))
                .collect(),
            dev,
            me,
            layout,
            local,
            incarnation,
            connected: Vec::new(),
            regions,
            ops: IdMap::default(),
            next_op: first_op_id(incarnation),
            completions: CompletionQueue::default(),
            cq_overrun: false,
            engine: Box::new(CpuEngine {
                nt_threshold: cfg.nt_threshold,
            }),
            cfg,
            polls: 0,
            polls_without_progress: 0,
            last_slow: Instant::now(),
            events: Vec::new(),
            doomed: Vec::new(),
            parked: Parked::default(),
            scratch: Vec::new(),
            send_stage: Vec::new(),
            chain_early: Vec::new(),
            kept_storage: Vec::new(),
            delivered_storage: Vec::new(),
            orphans: Vec::new(),
            storage_quota,
            isolated: false,
            lost: false,
            stats_page: None,
            claim,
        };
        // Per-peer translation: each peer may write its own mailbox and
        // section, and the regions registered for it (granted one by one
        // by the region table), nothing else (where the device can enforce
        // it); published before our first hello.
        let grant = PeerGrant {
            per_port: vec![
                Strided {
                    base: Layout::mailbox(0),
                    stride: SLOT,
                    len: SLOT,
                },
                Strided {
                    base: t.layout.section_offset(0),
                    stride: t.layout.section_size(),
                    len: t.layout.section_size(),
                },
            ],
            shared: Vec::new(),
        };
        t.isolated = t.dev.grant_peers(t.cfg.mw, &grant)?;
        t.write_header()?;
        for p in 0..t.peers.len() as Port {
            if p != me {
                t.reset_section(p)?;
            }
        }
        t.dev.poll_link_events(&mut t.events);
        t.events.clear();
        for p in t.dev.peer_ports() {
            if let Ok(l) = t.dev.link(p)
                && l.up
            {
                t.link_up(p, l.generation);
            }
        }
        Ok(t)
    }

    /// Replaces the data mover (a hardware DMA engine, or a CPU engine with
    /// other settings).
    pub fn set_engine(&mut self, engine: Box<dyn DmaEngine>) {
        self.engine = engine;
    }

    /// Our port.
    pub fn port(&self) -> Port {
        self.me
    }

    /// The device underneath.
    pub fn device(&self) -> &Arc<dyn NtbDevice> {
        &self.dev
    }

    /// The window layout in use.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether the device keeps each peer's writes to its own mailbox and
    /// section of our window and the regions registered for it (per-peer
    /// translation); `false` where the backend cannot isolate peers (see
    /// the README's threat model).
    pub fn peers_isolated(&self) -> bool {
        self.isolated
    }

    /// Our incarnation (changes every time a transport is created).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The connection state of `peer`.
    pub fn peer_state(&self, peer: Port) -> PeerState {
        self.peers
            .get(peer as usize)
            .map_or(PeerState::Down, |p| p.state.clone())
    }

    /// Whether `peer` is connected.
    pub fn is_connected(&self, peer: Port) -> bool {
        self.peers
            .get(peer as usize)
            .is_some_and(|p| p.conn.is_some())
    }

    /// Polls until `peer` is connected, or fails after `timeout` (or at once
    /// when the handshake failed).
    pub fn wait_connected(&mut self, peer: Port, timeout: Duration) -> Result<()> {
        let end = saturating_after(timeout);
        loop {
            self.progress();
            match self.peer_state(peer) {
                PeerState::Connected => return Ok(()),
                PeerState::Failed(reason) => {
                    return Err(TransportError::HandshakeFailed { peer, reason });
                }
                PeerState::Lost => return Err(TransportError::Lost),
                _ => {}
            }
            if Instant::now() >= end {
                return Err(TransportError::ConnectTimeout {
                    peer,
                    timeout,
                    state: self.peer_state(peer),
                });
            }
            std::thread::yield_now();
        }
    }

    /// Creates the queue pair to `peer` (one per peer; creating it again
    /// returns the same one). It can be created before the peer connects.
    pub fn create_qp(&mut self, peer: Port) -> Result<Qp> {
        match self.peers.get_mut(peer as usize) {
            Some(p) if peer != self.me => {
                p.qp = true;
                Ok(Qp { peer })
            }
            _ => Err(TransportError::NoSuchPeer { peer }),
        }
    }

    /// Counters of a queue pair (all zero for a queue pair of another
    /// transport, whose peer this one does not have).
    pub fn counters(&self, qp: Qp) -> QpCounters {
        self.peers
            .get(qp.peer as usize)
            .map_or_else(QpCounters::default, |p| p.counters)
    }

    /// Resources of a queue pair (while disconnected, all zero but the
    /// totals and the receives posted for its next connection;
    /// all zero for a queue pair of another transport, whose peer this one
    /// does not have).
    pub fn resources(&self, qp: Qp) -> Resources {
        let Some(p) = self.peers.get(qp.peer as usize) else {
            return Resources::default();
        };
        let mut r = Resources {
            eager_total: self.cfg.geometry.eager_count,
            outstanding: self.ops.values().filter(|o| o.involves(qp.peer)).count(),
            recvs_posted: p.recvs.len(),
            ..Resources::default()
        };
        if let Some(c) = &p.conn {
            r.eager_free = c.eager_free();
            r.postq_free = c.postq_free();
            r.backlog = c.backlog();
            r.serving = c.serving();
        }
        r
    }

    /// Operations we initiated that are outstanding.
    pub fn outstanding(&self) -> usize {
        self.ops.len()
    }

    /// Makes progress (handshakes, incoming messages, timeouts), then
    /// moves up to `out.len()` completions into `out`; returns how many.
    ///
    /// Completions wait for this call in a queue without a bound: a loop
    /// that posts signaled work (sends, one-sided writes) must poll as it
    /// goes, as a verbs application polls its CQ, or the queue grows (and
    /// reallocates on the hot path); sends can be made unsignaled instead
    /// ([`Config::signal_sends`](super::Config::signal_sends)).
    ///
    /// While completions are waiting it hands them out first and makes
    /// progress only every `PROGRESS_AT_LEAST_EVERY` (16) calls: a caller that
    /// posts work completing at once (sends, one-sided writes) between
    /// polls always finds some waiting, and would otherwise never take
    /// credits, acknowledgements or its peers' messages.
    pub fn poll_completions(&mut self, out: &mut [Completion]) -> usize {
        // The 16th call in a row with completions waiting progresses.
        if self.completions.is_empty() || self.polls_without_progress + 1 >= PROGRESS_AT_LEAST_EVERY
        {
            self.polls_without_progress = 0;
            self.progress();
        } else {
            self.polls_without_progress += 1;
        }
        if self.completions.is_empty() {
            return 0;
        }
        let n = self.completions.take_into(out);
        if self.cq_overrun && self.completions.len() < self.cfg.cq_depth {
            self.cq_overrun = false;
        }
        n
    }

    /// Whether work may be posted on `qp` now: the peer is connected and
    /// we are under `max_outstanding` operations.
    #[inline]
    pub(crate) fn check_post(&self, qp: Qp) -> Result<()> {
        // Not `ok_or`: the error built on every post would be dropped by an
        // out-of-line call (it has drop glue), 20 instructions a post.
        let Some(p) = self.peers.get(qp.peer as usize) else {
            return Err(TransportError::NoSuchPeer { peer: qp.peer });
        };
        if self.lost {
            return Err(TransportError::Lost);
        }
        if p.conn.is_none() {
            return Err(match &p.state {
                PeerState::Failed(reason) => TransportError::HandshakeFailed {
                    peer: qp.peer,
                    reason: reason.clone(),
                },
                _ => TransportError::NotConnected { peer: qp.peer },
            });
        }
        Ok(())
    }

    /// [`check_post`](Self::check_post) for a post that creates an
    /// operation (rendezvous writes, reads, multicast): also within
    /// `Config::max_outstanding`. Sends and one-sided writes create none.
    #[inline]
    pub(crate) fn check_op_post(&self, qp: Qp) -> Result<()> {
        self.check_post(qp)?;
        if self.ops.len() >= self.cfg.max_outstanding {
            return Err(TransportError::TooManyOutstanding {
                limit: self.cfg.max_outstanding,
            });
        }
        Ok(())
    }

    /// Records a new operation of ours; returns its (fresh, growing) id.
    pub(crate) fn new_op(&mut self, cookie: u64, kind: OutKind) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        self.ops.insert(
            id,
            OutOp {
                cookie,
                deadline: self.cfg.op_deadline(),
                kind,
            },
        );
        id
    }

    /// Sends `msg` to `peer`'s `ring` (or queues it for credits); a device
    /// error dooms the connection.
    #[inline]
    pub(crate) fn emit(&mut self, peer: Port, ring: Ring, msg: &Msg) {
        // Nothing is written once we lost our place (see `lose`), even
        // from the teardowns that follow it.
        if self.lost {
            return;
        }
        let Some(c) = self.peers[peer as usize].conn.as_mut() else {
            return;
        };
        if c.emit(&self.local, ring, msg).is_err() {
            self.doomed.push(peer);
        }
    }

    /// Whether `msgs` more messages fit the backlog of our TX ring
    /// towards `p` (see [`SGL_BACKLOG_ROOM`](super::conn::SGL_BACKLOG_ROOM));
    /// if not, the caller refuses or fails the operation whose SGL they
    /// are instead of letting the backlog overflow and reset the connection.
    pub(crate) fn sgl_fits(&self, p: Port, msgs: usize) -> bool {
        self.peers[p as usize]
            .conn
            .as_ref()
            .is_some_and(|c| c.sgl_fits(Ring::Tx, msgs))
    }

    /// For a post: `Busy` when the `msgs` messages it queues on `ring`
    /// towards `p` would take more than the room one operation may take of
    /// that ring's backlog (see
    /// [`SGL_BACKLOG_ROOM`](super::conn::SGL_BACKLOG_ROOM)): a post waits
    /// for the peer's credits instead of overflowing the backlog, which
    /// would reset the connection.
    pub(crate) fn backlog_room(&self, p: Port, ring: Ring, msgs: usize) -> Result<()> {
        match self.peers[p as usize].conn.as_ref() {
            Some(c) if !c.sgl_fits(ring, msgs) => Err(TransportError::backlog_busy(p)),
            _ => Ok(()),
        }
    }

    /// Refuses the peer's operation `op` with an error `Ack` on its CQ.
    pub(crate) fn nak(&mut self, peer: Port, op: u64, status: WireStatus) {
        self.emit(peer, Ring::Cq, &Msg::Ack { op, status, len: 0 });
    }

    /// The parts that moving data touches, borrowed apart.
    #[inline]
    pub(crate) fn movers(&mut self) -> Movers<'_> {
        Movers(
            &mut self.ops,
            &mut self.peers,
            self.engine.as_mut(),
            &self.local,
            &self.regions,
        )
    }

    /// Rings `peer`'s doorbell after a batch, when configured to.
    #[inline]
    pub(crate) fn ring_doorbell(&self, peer: Port) {
        if self.cfg.doorbell {
            let _ = self.dev.peer_db_set(peer, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::first_op_id;

    #[test]
    fn op_ids_of_another_incarnation_start_elsewhere_and_cannot_wrap() {
        let a = first_op_id(0x1234_5678_9abc_def0);
        let b = first_op_id(0x1234_5678_9abc_def1);
        // 2^32 operations apart at least: one cannot reach the other's ids
        // in any realistic run.
        assert!(a.abs_diff(b) >= 1 << 32, "{a:#x} {b:#x}");
        for inc in [0, 1, u64::MAX, 0x8000_0000, 0x7fff_ffff] {
            let first = first_op_id(inc);
            let highest = (1 << 63) - (1 << 32) + 1;
            assert!((1..=highest).contains(&first), "{first:#x}");
        }
    }
}
