//! The state of one peer: handshake bookkeeping and, while connected, the
//! queues, eager buffers and operations in flight with it.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::hw::{LocalWindow, PeerWindow, Port, Result as HwResult};

use super::counters::{DropKind, QpCounters};
use super::geometry::{Layout, Part};
use super::queue::{Consumer, Producer, parse_free_entry};
use super::region::RegionKey;
use super::sgl::ExtentCursor;
use super::types::PeerState;
use super::wire::Body;

/// Most messages waiting for credits towards one ring of a peer.
pub(crate) const BACKLOG_LIMIT: usize = 1 << 16;

/// Ring indices: the order of the credit words.
pub(crate) const RX: usize = 0;
pub(crate) const TX: usize = 1;
pub(crate) const CQ: usize = 2;
pub(crate) const POSTQ: usize = 3;

/// A receive posted by the application.
#[derive(Debug)]
pub(crate) struct RecvWr {
    pub extents: Extents,
    pub len: u64,
    pub cookie: u64,
}

/// Window extents, inline when there is only one (receive buffers usually
/// are contiguous: no allocation per posted receive).
#[derive(Debug)]
pub(crate) enum Extents {
    One([(u64, u64); 1]),
    Many(Vec<(u64, u64)>),
}

impl Extents {
    pub fn from_vec(v: Vec<(u64, u64)>) -> Self {
        match v.as_slice() {
            [one] => Extents::One([*one]),
            _ => Extents::Many(v),
        }
    }

    #[inline]
    pub fn as_slice(&self) -> &[(u64, u64)] {
        match self {
            Extents::One(a) => a,
            Extents::Many(v) => v,
        }
    }
}

/// An operation a peer started that we serve.
#[derive(Debug)]
pub(crate) enum InOp {
    /// We granted a write and wait for its Done.
    Write { len: u32, deadline: Instant },
    /// We serve a read: copy from `src` as SGL segments arrive.
    Read {
        src: ExtentCursor,
        len: u32,
        delivered: u32,
        deadline: Instant,
    },
    /// A multicast target: storage allocated, waiting for Done.
    McRecv {
        region: RegionKey,
        len: u32,
        deadline: Instant,
        chain: Option<Box<ChainLink>>,
    },
}

/// A target's place in a store-and-forward multicast chain.
#[derive(Debug)]
pub(crate) struct ChainLink {
    /// Where our data comes from (the initiator or the previous target).
    pub prev: Port,
    /// Where we forward it, with that target's storage as it arrives.
    pub next: Option<Port>,
    pub next_sgl: Vec<(u64, u64)>,
    pub next_got: u32,
    /// Whether we sent our own storage to `prev` (clear to send).
    pub cts_sent: bool,
}

impl InOp {
    pub fn deadline(&self) -> Instant {
        match self {
            InOp::Write { deadline, .. }
            | InOp::Read { deadline, .. }
            | InOp::McRecv { deadline, .. } => *deadline,
        }
    }
}

/// Everything that exists only while connected.
pub(crate) struct Conn {
    pub win: PeerWindow,
    pub epoch: u32,
    pub prod: [Producer; 4],
    pub cons: [Consumer; 4],
    pub backlog: [VecDeque<Body>; 3],
    pub fq_base: usize,
    pub fq_seq: u64,
    /// `fq_seq` modulo the FreeQ's length (kept, not divided for).
    pub fq_slot: usize,
    pub eager_free: Vec<u32>,
    pub eager_have: Vec<bool>,
    pub fq_out_base: usize,
    pub fq_out_seq: u64,
    pub lent: Vec<bool>,
    pub inbound: HashMap<u64, InOp>,
    pub hwm: [u64; 2],
    pub credit_base: usize,
}

impl Conn {
    /// Builds the connection state for `peer` (we are `me`).
    pub fn new(layout: &Layout, me: Port, peer: Port, win: PeerWindow, epoch: u32) -> Self {
        let g = layout.geometry();
        let depth = g.queue_depth;
        let parts = [Part::Rx, Part::Tx, Part::Cq, Part::PostQ];
        let credits = layout.part(peer, Part::Credits);
        let prod = std::array::from_fn(|k| {
            Producer::new(layout.part(me, parts[k]), depth, epoch, credits + 8 * k)
        });
        let cons =
            std::array::from_fn(|k| Consumer::new(layout.part(peer, parts[k]), depth, epoch));
        Self {
            win,
            epoch,
            prod,
            cons,
            backlog: Default::default(),
            fq_base: layout.part(peer, Part::FreeQ),
            fq_seq: 0,
            fq_slot: 0,
            eager_free: Vec::with_capacity(g.eager_count as usize),
            eager_have: vec![false; g.eager_count as usize],
            fq_out_base: layout.part(me, Part::FreeQ),
            fq_out_seq: 0,
            lent: vec![false; g.eager_count as usize],
            inbound: HashMap::new(),
            hwm: [0; 2],
            credit_base: layout.part(me, Part::Credits),
        }
    }

    /// Sends `body` on `ring` of the peer, or queues it behind earlier ones
    /// while the ring has no credit.
    #[inline]
    ///
    /// A peer that stops crediting while we keep producing for it would make
    /// the backlog grow without bound: past [`BACKLOG_LIMIT`] messages the
    /// connection is declared broken (an error, like a device failure).
    pub fn emit(&mut self, local: &LocalWindow, ring: usize, body: &Body) -> HwResult<()> {
        if self.backlog[ring].is_empty() && self.prod[ring].free(local).0 > 0 {
            self.prod[ring].push(&self.win, body)
        } else if self.backlog[ring].len() >= BACKLOG_LIMIT {
            Err(crate::hw::HwError::Fabric(
                "the peer stopped crediting its queue: connection reset".into(),
            ))
        } else {
            self.backlog[ring].push_back(*body);
            Ok(())
        }
    }

    /// Sends what waits for credits; counts a nonsensical credit word.
    pub fn flush(&mut self, local: &LocalWindow, counters: &mut QpCounters) -> HwResult<()> {
        for ring in 0..3 {
            while !self.backlog[ring].is_empty() {
                let (free, sane) = self.prod[ring].free(local);
                if !sane {
                    counters.drop_one(DropKind::BadCredit);
                }
                if free == 0 {
                    break;
                }
                let body = self.backlog[ring].pop_front().unwrap_or([0; 56]);
                self.prod[ring].push(&self.win, &body)?;
            }
        }
        Ok(())
    }

    /// Writes our consumer progress back to the peer, one word per ring
    /// that moved.
    pub fn credit(&mut self) -> HwResult<()> {
        for k in 0..4 {
            if self.cons[k].uncredited() > 0 {
                self.cons[k].credit(&self.win, self.credit_base + 8 * k)?;
            }
        }
        Ok(())
    }

    /// Lends our eager buffer `index` to the peer (a FreeQ entry in its window).
    pub fn lend(&mut self, index: u32) -> HwResult<()> {
        let cap = self.lent.len() as u64;
        let off = self.fq_out_base + (self.fq_out_seq % cap) as usize * 8;
        self.win.write_u64(
            off,
            super::queue::free_entry(self.epoch, self.fq_out_seq, index),
        )?;
        self.fq_out_seq += 1;
        self.lent[index as usize] = true;
        Ok(())
    }

    /// Takes the eager buffers the peer lent us since the last call.
    pub fn poll_freeq(&mut self, local: &LocalWindow, counters: &mut QpCounters) {
        let cap = self.eager_have.len();
        loop {
            let off = self.fq_base + self.fq_slot * 8;
            let Ok(raw) = local.load_u64(off) else { return };
            match parse_free_entry(self.epoch, self.fq_seq, raw) {
                Some(i) if (i as usize) < self.eager_have.len() && !self.eager_have[i as usize] => {
                    self.eager_have[i as usize] = true;
                    self.eager_free.push(i);
                }
                Some(_) => counters.drop_one(DropKind::BadBuffer),
                None => return,
            }
            self.fq_seq += 1;
            self.fq_slot += 1;
            if self.fq_slot == cap {
                self.fq_slot = 0;
            }
        }
    }

    /// Takes an eager buffer of the peer's window to send into.
    #[inline]
    pub fn take_buffer(&mut self) -> Option<u32> {
        let i = self.eager_free.pop()?;
        self.eager_have[i as usize] = false;
        Some(i)
    }
}

/// One peer port as seen by us.
pub(crate) struct Peer {
    pub state: PeerState,
    pub peer_inc: u64,
    pub link_gen: u64,
    pub hello_seq: u64,
    pub last_hello_tag: u64,
    pub last_hello_sent: Option<Instant>,
    pub conn: Option<Conn>,
    pub counters: QpCounters,
    pub recvs: VecDeque<RecvWr>,
    pub qp: bool,
}

impl Peer {
    pub fn new() -> Self {
        Self {
            state: PeerState::Down,
            peer_inc: 0,
            link_gen: 0,
            hello_seq: 0,
            last_hello_tag: 0,
            last_hello_sent: None,
            conn: None,
            counters: QpCounters::default(),
            recvs: VecDeque::new(),
            qp: false,
        }
    }
}
