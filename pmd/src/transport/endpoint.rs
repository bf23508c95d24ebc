//! [`Transport`]: one host's endpoint — its window, region table, peers and
//! operations — and the verbs-like posting API.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw::{LinkEvent, LocalWindow, NtbDevice, Port};

use super::conn::{Conn, Extents, POSTQ, Peer, RX, RecvWr, TX};
use super::counters::QpCounters;
use super::dma::{CpuEngine, DmaEngine};
use super::error::{Result, Status, TransportError};
use super::geometry::Layout;
use super::idhash::IdMap;
use super::region::{Access, RegionKey, RegionTable};
use super::sgl::{ExtentCursor, RemoteAddr, Sge};
use super::types::{Completion, Config, OpKind, PeerState, Qp, Resources};
use super::wire::{self, Msg};

/// A planned send that goes inline in its slots (no eager buffer).
const INLINE: u32 = u32::MAX;

/// A target of a multicast put.
#[derive(Debug)]
pub(crate) struct McTarget {
    pub peer: Port,
    pub sgl: Vec<(u64, u64)>,
    pub got: u32,
    pub ready: bool,
    pub status: Option<Status>,
}

/// What an operation of ours is waiting for.
#[derive(Debug)]
pub(crate) enum OutKind {
    Write {
        peer: Port,
        src: ExtentCursor,
        len: u32,
        delivered: u32,
        done: bool,
    },
    ReadSize {
        peer: Port,
        rkey: u32,
        roff: u64,
        max_len: u64,
    },
    Read {
        peer: Port,
        len: u32,
        region: Option<RegionKey>,
    },
    Multicast {
        src: Vec<(u64, u64)>,
        len: u32,
        targets: Vec<McTarget>,
        put: bool,
        chain: bool,
    },
}

/// How a multicast put reaches its targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MulticastMode {
    /// The initiator copies to every target itself.
    #[default]
    FanOut,
    /// Store and forward: the initiator copies to the first target, which
    /// deposits the data and forwards it to the next, and so on down the
    /// list (the "deposit bit" of the reference). Each target's storage is
    /// sent to its predecessor; the first target's clear-to-send arrives
    /// only once the whole chain is ready.
    Chain,
}

/// An operation we initiated.
#[derive(Debug)]
pub(crate) struct OutOp {
    pub cookie: u64,
    pub deadline: Instant,
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

/// One send of a batch: the payload (copied at post time) and a cookie.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// The payload, at most the geometry's `eager_size` bytes.
    pub data: &'a [u8],
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

/// One host's transport endpoint over an [`NtbDevice`].
///
/// All progress happens in [`poll_completions`](Self::poll_completions) (or
/// [`progress`](Self::progress)): the transport has no thread of its own.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ntbdk_pmd::transport::{loopback::LoopbackFabric, Access, Completion, Config, Geometry,
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
    pub(crate) dev: Arc<dyn NtbDevice>,
    pub(crate) me: Port,
    pub(crate) cfg: Config,
    pub(crate) layout: Layout,
    pub(crate) local: LocalWindow,
    pub(crate) incarnation: u64,
    pub(crate) peers: Vec<Peer>,
    pub(crate) connected: Vec<Port>,
    pub(crate) regions: RegionTable,
    pub(crate) ops: IdMap<u64, OutOp>,
    pub(crate) next_op: u64,
    pub(crate) completions: VecDeque<Completion>,
    pub(crate) engine: Box<dyn DmaEngine>,
    pub(crate) polls: u32,
    pub(crate) last_slow: Instant,
    pub(crate) events: Vec<LinkEvent>,
    pub(crate) doomed: Vec<Port>,
    /// Control-ring messages taken by a poll, handled after it (kept for reuse).
    pub(crate) scratch: Vec<Msg>,
    /// Per send of the batch being posted: its eager buffer, or [`INLINE`]
    /// (kept for reuse).
    pub(crate) send_plan: Vec<u32>,
    pub(crate) chain_early: Vec<EarlySgl>,
}

/// A chain target's storage that arrived before our own request to send.
#[derive(Debug)]
pub(crate) struct EarlySgl {
    pub origin: Port,
    pub op: u64,
    pub from: Port,
    pub start: u32,
    pub sges: Vec<wire::WireSge>,
    pub at: Instant,
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.say_goodbye();
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
            return Err(TransportError::Invalid(format!(
                "geometry has {} ports but the fabric has {}: use Geometry with ports >= {}",
                cfg.geometry.ports,
                dev.port_count(),
                dev.port_count()
            )));
        }
        let local = dev.local_window(cfg.mw)?;
        if local.len() < layout.window_size_for(4096) {
            return Err(TransportError::Invalid(format!(
                "window of {} bytes is too small for this geometry (needs at least {}): use a smaller Geometry or a larger window",
                local.len(),
                layout.window_size_for(4096)
            )));
        }
        let me = dev.port();
        let incarnation = random_u64(dev.generation());
        let regions = RegionTable::new(
            layout.region_area_start() as u64,
            local.len() as u64,
            incarnation as u32,
        );
        let mut t = Self {
            peers: (0..dev.port_count()).map(|_| Peer::new()).collect(),
            dev,
            me,
            layout,
            local,
            incarnation,
            connected: Vec::new(),
            regions,
            ops: IdMap::default(),
            next_op: 1,
            completions: VecDeque::new(),
            engine: Box::new(CpuEngine {
                nt_threshold: cfg.nt_threshold,
            }),
            cfg,
            polls: 0,
            last_slow: Instant::now(),
            events: Vec::new(),
            doomed: Vec::new(),
            scratch: Vec::new(),
            send_plan: Vec::new(),
            chain_early: Vec::new(),
        };
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
        let end = Instant::now() + timeout;
        loop {
            self.progress();
            match self.peer_state(peer) {
                PeerState::Connected => return Ok(()),
                PeerState::Failed(reason) => {
                    return Err(TransportError::HandshakeFailed { peer, reason });
                }
                _ => {}
            }
            if Instant::now() >= end {
                return Err(TransportError::Timeout(format!(
                    "port {peer} did not connect within {timeout:?} (state {:?})",
                    self.peer_state(peer)
                )));
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

    /// Counters of a queue pair.
    pub fn counters(&self, qp: Qp) -> QpCounters {
        self.peers[qp.peer as usize].counters
    }

    /// Resources of a queue pair (all zero but the totals while disconnected).
    pub fn resources(&self, qp: Qp) -> Resources {
        let p = &self.peers[qp.peer as usize];
        let mut r = Resources {
            eager_total: self.cfg.geometry.eager_count,
            outstanding: self.ops.values().filter(|o| o.involves(qp.peer)).count(),
            recvs_posted: p.recvs.len(),
            ..Resources::default()
        };
        if let Some(c) = &p.conn {
            r.eager_free = c.eager_free.len() as u32;
            r.postq_free = u64::from(self.cfg.geometry.queue_depth)
                - (c.prod[POSTQ].produced() - c.cons_credit(POSTQ));
            r.backlog = c.backlog.iter().map(|b| b.len()).sum();
            r.serving = c.inbound.len();
        }
        r
    }

    /// Operations we initiated that are outstanding.
    pub fn outstanding(&self) -> usize {
        self.ops.len()
    }

    // ---- regions ----

    /// Registers a region of `len` bytes in our window's region area: peers
    /// may place data into it (remote write) or read it (remote read) as
    /// `access` allows. Returns its key.
    pub fn register_region(&mut self, len: usize, access: Access) -> Result<RegionKey> {
        self.regions.register(len as u64, access, None)
    }

    /// Like [`register_region`](Self::register_region), built from extents
    /// of at most `max_extent` bytes (scattered where the area is
    /// fragmented): SGLs naming it have several entries.
    pub fn register_region_scattered(
        &mut self,
        len: usize,
        access: Access,
        max_extent: usize,
    ) -> Result<RegionKey> {
        self.regions
            .register(len as u64, access, Some(max_extent as u64))
    }

    /// Deregisters a region. Do not deregister a region that posted work
    /// still uses (as in RDMA verbs): its bytes may be handed out again.
    pub fn deregister_region(&mut self, key: RegionKey) -> Result<()> {
        self.regions.deregister(key)
    }

    /// Length of a region.
    pub fn region_len(&self, key: RegionKey) -> Option<u64> {
        self.regions.get(key).map(|r| r.len)
    }

    /// Bytes free in the region area.
    pub fn region_area_free(&self) -> u64 {
        self.regions.free_bytes()
    }

    /// Copies `data` into region `key` at `offset` (local write).
    pub fn region_write(&mut self, key: RegionKey, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        if let Some(o) = self
            .regions
            .contiguous(key, offset, len, Access::LOCAL_WRITE)
        {
            return Ok(self.local.write(o as usize, data)?);
        }
        let ext = self
            .regions
            .resolve_one(key, offset, data.len() as u64, Access::LOCAL_WRITE)?;
        let mut at = 0usize;
        for &(o, l) in ext.as_slice() {
            self.local.write(o as usize, &data[at..at + l as usize])?;
            at += l as usize;
        }
        Ok(())
    }

    /// Copies bytes of region `key` at `offset` into `out` (local read).
    pub fn region_read(&self, key: RegionKey, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len() as u64;
        if let Some(o) = self
            .regions
            .contiguous(key, offset, len, Access::LOCAL_READ)
        {
            return Ok(self.local.read(o as usize, out)?);
        }
        let ext = self
            .regions
            .resolve_one(key, offset, out.len() as u64, Access::LOCAL_READ)?;
        let mut at = 0usize;
        for &(o, l) in ext.as_slice() {
            self.local.read(o as usize, &mut out[at..at + l as usize])?;
            at += l as usize;
        }
        Ok(())
    }

    fn resolve_sges(&self, sges: &[Sge], need: Access) -> Result<(Vec<(u64, u64)>, u32)> {
        let mut ext = Vec::with_capacity(sges.len());
        let mut total = 0u64;
        for s in sges {
            ext.extend(self.regions.resolve(s.key, s.offset, s.len, need)?);
            total += s.len;
        }
        if total == 0 || total > u64::from(u32::MAX) {
            return Err(TransportError::Invalid(format!(
                "transfer of {total} bytes: must be 1 byte to 4 GiB - 1"
            )));
        }
        Ok((ext, total as u32))
    }

    // ---- posting ----

    fn check_post(&self, qp: Qp) -> Result<()> {
        let p = self
            .peers
            .get(qp.peer as usize)
            .ok_or(TransportError::NoSuchPeer { peer: qp.peer })?;
        if p.conn.is_none() {
            return Err(match &p.state {
                PeerState::Failed(reason) => TransportError::HandshakeFailed {
                    peer: qp.peer,
                    reason: reason.clone(),
                },
                _ => TransportError::NotConnected { peer: qp.peer },
            });
        }
        if self.ops.len() >= self.cfg.max_outstanding {
            return Err(TransportError::TooManyOutstanding {
                limit: self.cfg.max_outstanding,
            });
        }
        Ok(())
    }

    pub(crate) fn new_op(&mut self, cookie: u64, kind: OutKind) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        self.ops.insert(
            id,
            OutOp {
                cookie,
                deadline: Instant::now() + self.cfg.op_timeout,
                kind,
            },
        );
        id
    }

    /// Sends `msg` to `peer`'s `ring`; a device error dooms the connection.
    pub(crate) fn emit(&mut self, peer: Port, ring: usize, msg: &Msg) {
        let body = wire::encode(msg);
        self.emit_body(peer, ring, &body);
    }

    pub(crate) fn emit_body(&mut self, peer: Port, ring: usize, body: &wire::Body) {
        let Some(c) = self.peers[peer as usize].conn.as_mut() else {
            return;
        };
        if c.emit(&self.local, ring, body).is_err() {
            self.doomed.push(peer);
        }
    }

    fn ring_doorbell(&self, peer: Port) {
        if self.cfg.doorbell {
            let _ = self.dev.peer_db_set(peer, 1);
        }
    }

    /// Writes the bytes of `local` (our regions) into `remote` (the peer's
    /// region) — the rendezvous write: intent → the peer's SGL → one copy
    /// straight into its region → done → received. Completes with
    /// [`OpKind::Write`].
    pub fn post_write(
        &mut self,
        qp: Qp,
        local: &[Sge],
        remote: RemoteAddr,
        cookie: u64,
    ) -> Result<()> {
        self.post_writes(
            qp,
            &[WriteWr {
                local,
                remote,
                cookie,
            }],
        )
        .map(|_| ())
    }

    /// Posts a batch of writes: all intents are written back to back, then
    /// the doorbell (if configured) rings once. Returns how many were posted
    /// (all, unless an error stops the batch; the error is returned when
    /// none was).
    pub fn post_writes(&mut self, qp: Qp, wrs: &[WriteWr<'_>]) -> Result<usize> {
        let mut n = 0;
        for wr in wrs {
            let r = self
                .check_post(qp)
                .and_then(|_| self.resolve_sges(wr.local, Access::LOCAL_READ));
            let (ext, len) = match r {
                Ok(x) => x,
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            };
            let op = self.new_op(
                wr.cookie,
                OutKind::Write {
                    peer: qp.peer,
                    src: ExtentCursor::new(ext),
                    len,
                    delivered: 0,
                    done: false,
                },
            );
            let msg = Msg::WriteReq {
                op,
                rkey: wr.remote.key.0,
                roff: wr.remote.offset,
                len,
            };
            self.emit(qp.peer, RX, &msg);
            n += 1;
        }
        self.ring_doorbell(qp.peer);
        Ok(n)
    }

    /// Reads `remote` (the peer's region, remote read) into `local` (our
    /// regions, local write); the size is the total of `local`. We send our
    /// SGL; the peer copies straight into it. Completes with [`OpKind::Read`].
    pub fn post_read(
        &mut self,
        qp: Qp,
        local: &[Sge],
        remote: RemoteAddr,
        cookie: u64,
    ) -> Result<()> {
        self.check_post(qp)?;
        let (ext, len) = self.resolve_sges(local, Access::LOCAL_WRITE)?;
        let op = self.new_op(
            cookie,
            OutKind::Read {
                peer: qp.peer,
                len,
                region: None,
            },
        );
        self.send_read_req(qp.peer, op, remote.key.0, remote.offset, len, &ext);
        self.ring_doorbell(qp.peer);
        Ok(())
    }

    pub(crate) fn send_read_req(
        &mut self,
        peer: Port,
        op: u64,
        rkey: u32,
        roff: u64,
        len: u32,
        ext: &[(u64, u64)],
    ) {
        self.emit(
            peer,
            TX,
            &Msg::ReadReq {
                op,
                rkey,
                roff,
                len,
            },
        );
        let mut msgs = Vec::new();
        wire::chunk_sgl(ext, |start, n, sges| {
            msgs.push(Msg::ReadSgl { op, start, n, sges })
        });
        for m in &msgs {
            self.emit(peer, TX, m);
        }
    }

    /// Reads the peer's region `remote.key` from `remote.offset` to its end,
    /// without knowing the size: the peer tells it, we allocate a region of
    /// that size (refusing more than `max_len`), then read as
    /// [`post_read`](Self::post_read). Completes with
    /// [`OpKind::ReadUnknown`] and the new region in
    /// [`Completion::region`].
    pub fn post_read_unknown(
        &mut self,
        qp: Qp,
        remote: RemoteAddr,
        max_len: u64,
        cookie: u64,
    ) -> Result<()> {
        self.check_post(qp)?;
        let op = self.new_op(
            cookie,
            OutKind::ReadSize {
                peer: qp.peer,
                rkey: remote.key.0,
                roff: remote.offset,
                max_len,
            },
        );
        let msg = Msg::ReadIntent {
            op,
            rkey: remote.key.0,
            roff: remote.offset,
        };
        self.emit(qp.peer, TX, &msg);
        self.ring_doorbell(qp.peer);
        Ok(())
    }

    /// Sends a small message (at most `eager_size` bytes), copied now: up to
    /// 48 bytes inline in one PostQ slot (one cache line), up to
    /// [`wire::INLINE_LONG_MAX`] (216) bytes inline in up to four
    /// consecutive slots, else into an eager buffer the peer lent us plus a
    /// slot. Completes with
    /// [`OpKind::Send`] at once; fails with [`TransportError::Busy`] when
    /// the peer's PostQ or our eager buffers are exhausted.
    pub fn post_send(&mut self, qp: Qp, data: &[u8], cookie: u64) -> Result<()> {
        self.post_sends(qp, &[SendWr { data, cookie }]).map(|_| ())
    }

    /// Posts a batch of sends back to back, ringing the doorbell (if
    /// configured) once. Returns how many were posted; stops at the first
    /// that finds no room (the error is returned if that was the first).
    ///
    /// The batch's slots are written last-first, its first slot last: the
    /// peer, polling that slot, finds the whole batch there at once and
    /// streams through it, instead of chasing the writer line by line (two
    /// cores contending for the line being written is what limits a
    /// message rate, not the work on either side).
    pub fn post_sends(&mut self, qp: Qp, wrs: &[SendWr<'_>]) -> Result<usize> {
        self.check_post(qp)?;
        let eager_size = self.cfg.geometry.eager_size as usize;
        let me = self.me;
        let layout = self.layout;
        let mut plan = std::mem::take(&mut self.send_plan);
        plan.clear();
        let peer = &mut self.peers[qp.peer as usize];
        let Some(c) = peer.conn.as_mut() else {
            self.send_plan = plan;
            return Err(TransportError::NotConnected { peer: qp.peer });
        };
        // First pass: how many fit, in how many slots each; eager payloads
        // are written now (before any slot names them).
        let mut slots_total = 0u64;
        let mut err = None;
        for wr in wrs {
            let len = wr.data.len();
            if len == 0 || len > eager_size {
                err = Some(TransportError::Invalid(format!(
                    "send of {len} bytes: must be 1..={eager_size} (use post_write for more)"
                )));
                break;
            }
            // Inline in consecutive slots where it fits (no eager buffer,
            // no buffer to return: fewer cache-line transfers both ways),
            // as long as the run is at most half the ring (so the
            // consumer's quarter-ring credits always make room for it).
            let slots = match wire::inline_slots(len) {
                Some(k) if k == 1 || 2 * k as u64 <= c.prod[POSTQ].depth() => k as u64,
                _ => 0,
            };
            if !c.prod[POSTQ]
                .room(&self.local, slots_total + slots.max(1))
                .0
            {
                err = Some(TransportError::Busy {
                    peer: qp.peer,
                    what: "the peer's PostQ is full",
                });
                break;
            }
            if slots > 0 {
                plan.push(INLINE);
            } else {
                if c.eager_free.is_empty() {
                    c.poll_freeq(&self.local, &mut peer.counters);
                }
                let Some(buf) = c.take_buffer() else {
                    err = Some(TransportError::Busy {
                        peer: qp.peer,
                        what: "no eager buffer lent by the peer",
                    });
                    break;
                };
                if let Err(e) = c.win.write(layout.eager_buffer(me, buf), wr.data) {
                    err = Some(e.into());
                    self.doomed.push(qp.peer);
                    break;
                }
                plan.push(buf);
            }
            slots_total += slots.max(1);
        }
        let n = plan.len();
        // Second pass: the slots, encoded straight from the caller's bytes
        // and written last-first (no staging copy).
        let mut at = slots_total;
        for (wr, &buf) in wrs[..n].iter().zip(&plan).rev() {
            let k = if buf == INLINE {
                wire::inline_slots(wr.data.len()).unwrap_or(1)
            } else {
                1
            };
            at -= k as u64;
            for j in (0..k).rev() {
                let words = if buf == INLINE {
                    wire::inline_slot_words(wr.data, j)
                } else {
                    wire::body_words(&wire::encode(&Msg::SendBuf {
                        buf,
                        len: wr.data.len() as u32,
                    }))
                };
                if let Err(e) = c.prod[POSTQ].write_ahead(&c.win, at + j as u64, &words) {
                    // The device failed under us: nothing of the batch is
                    // produced and the connection is doomed.
                    self.send_plan = plan;
                    self.doomed.push(qp.peer);
                    return Err(e.into());
                }
            }
        }
        c.prod[POSTQ].produce(slots_total);
        self.send_plan = plan;
        for wr in &wrs[..n] {
            let len = wr.data.len() as u64;
            peer.counters.sends += 1;
            peer.counters.bytes_out += len;
            self.completions.push_back(Completion {
                peer: qp.peer,
                op: OpKind::Send,
                status: Status::Success,
                bytes: len,
                cookie: wr.cookie,
                region: None,
            });
        }
        if n > 0 {
            self.ring_doorbell(qp.peer);
        }
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Posts a receive buffer (local write) for the next message from the
    /// queue pair's peer. Completes with [`OpKind::Recv`] when one arrives
    /// ([`Status::LocalLength`] when it does not fit), or
    /// [`Status::Flushed`] when the connection resets.
    pub fn post_recv(&mut self, qp: Qp, sge: Sge, cookie: u64) -> Result<()> {
        if qp.peer as usize >= self.peers.len() || qp.peer == self.me {
            return Err(TransportError::NoSuchPeer { peer: qp.peer });
        }
        let extents =
            match self
                .regions
                .contiguous(sge.key, sge.offset, sge.len, Access::LOCAL_WRITE)
            {
                Some(o) => Extents::One([(o, sge.len)]),
                None => {
                    self.regions
                        .resolve_one(sge.key, sge.offset, sge.len, Access::LOCAL_WRITE)?
                }
            };
        self.peers[qp.peer as usize].recvs.push_back(RecvWr {
            extents,
            len: sge.len,
            cookie,
        });
        Ok(())
    }

    /// Puts the bytes of `local` to every target at once: a request to send
    /// to each, each answers clear-to-send with storage it allocated, a
    /// check-in counter reaches zero, then one call copies to all (fan-out
    /// by the initiator). Completes once with [`OpKind::MulticastPut`];
    /// each target gets an [`OpKind::MulticastRecv`] completion with the
    /// region holding the data.
    pub fn post_multicast_put(&mut self, targets: &[Qp], local: &[Sge], cookie: u64) -> Result<()> {
        self.post_multicast_put_with(targets, local, MulticastMode::FanOut, cookie)
    }

    /// [`post_multicast_put`](Self::post_multicast_put) with a choice of
    /// [`MulticastMode`] (fan-out, or store and forward down the list).
    pub fn post_multicast_put_with(
        &mut self,
        targets: &[Qp],
        local: &[Sge],
        mode: MulticastMode,
        cookie: u64,
    ) -> Result<()> {
        if targets.is_empty() {
            return Err(TransportError::Invalid(
                "multicast put needs at least one target".into(),
            ));
        }
        for (i, t) in targets.iter().enumerate() {
            self.check_post(*t)?;
            if targets[..i].contains(t) {
                return Err(TransportError::Invalid(format!(
                    "port {} is listed twice",
                    t.peer
                )));
            }
        }
        let (src, len) = self.resolve_sges(local, Access::LOCAL_READ)?;
        let chain = mode == MulticastMode::Chain;
        let op = self.new_op(
            cookie,
            OutKind::Multicast {
                src,
                len,
                targets: targets
                    .iter()
                    .map(|t| McTarget {
                        peer: t.peer,
                        sgl: Vec::new(),
                        got: 0,
                        ready: false,
                        status: None,
                    })
                    .collect(),
                put: false,
                chain,
            },
        );
        for (i, t) in targets.iter().enumerate() {
            let msg = if chain {
                Msg::ChainRts {
                    op,
                    len,
                    prev: if i == 0 { self.me } else { targets[i - 1].peer },
                    next: targets.get(i + 1).map(|q| q.peer),
                }
            } else {
                Msg::Rts { op, len }
            };
            self.emit(t.peer, RX, &msg);
            self.ring_doorbell(t.peer);
        }
        Ok(())
    }

    /// Makes progress (handshakes, incoming messages, timeouts), then
    /// moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll_completions(&mut self, out: &mut [Completion]) -> usize {
        if self.completions.is_empty() {
            self.progress();
        }
        let n = out.len().min(self.completions.len());
        let (a, b) = self.completions.as_slices();
        for (slot, c) in out.iter_mut().zip(a.iter().chain(b)) {
            slot.copy_fields(c);
        }
        self.completions.drain(..n);
        n
    }
}

impl Conn {
    /// The last credit the peer gave for ring `k`.
    pub(crate) fn cons_credit(&self, k: usize) -> u64 {
        self.prod[k].credit()
    }
}
