//! One connection: everything that exists only while a peer is connected —
//! our producers into its window and consumers of its rings in ours, the
//! control messages waiting for credits, the eager buffers lent each way,
//! and the operations of its that we serve.
//!
//! The fields are private: the rest of the transport asks a connection to
//! send, take, lend and serve, and never pokes its rings.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::hw::{Admitted, LocalWindow, PeerWindow, Port, Result as HwResult, WindowSpan};

use super::counters::{DropKind, QpCounters};
use super::error::TransportError;
use super::geometry::{Layout, Part};
use super::key::RegionKey;
use super::ops::InOp;
use super::queue::{Consumer, Producer, free_entry, parse_free_entry};
use super::region::MAX_REMOTE_REGIONS;
use super::types::SendWr;
use super::wire::{self, Body, Msg, Ring};

/// Most messages waiting for credits towards one ring of a peer.
pub(crate) const BACKLOG_LIMIT: usize = 1 << 16;

/// Most messages one SGL we send may take of a ring's backlog: an
/// operation whose SGL would not fit in this much beside what waits
/// already is refused (a peer's request answered "no room"; our own read
/// failed with `SglTooLong`, `Busy` or `TooLarge`), so a write into a
/// region of many tiny extents cannot overflow the backlog and reset the
/// connection, and half the backlog stays for the other messages.
pub(crate) const SGL_BACKLOG_ROOM: usize = BACKLOG_LIMIT / 2;

/// Where our eager buffers lie in the peer's window (the peer's copy of
/// our section).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EagerBuffers {
    /// Offset of buffer 0.
    pub base: usize,
    /// Bytes per buffer.
    pub size: usize,
}

impl EagerBuffers {
    /// Offset of buffer `index`.
    #[inline]
    fn offset(self, index: u32) -> usize {
        self.base + index as usize * self.size
    }
}

/// What writing a batch of sends did.
#[derive(Debug)]
pub(crate) struct SendBatch {
    /// How many sends of the batch were posted (a prefix of it).
    pub posted: usize,
    /// Why the batch stopped short, if it did.
    pub stopped: Option<TransportError>,
    /// Whether the device failed under us (the connection is broken).
    pub broken: bool,
}

/// What [`Conn::arrivals`] found: the parts of a poll that have work.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrivals {
    /// The peer lent us an eager buffer.
    pub freeq: bool,
    /// A control message is on one of the control rings.
    pub control: bool,
    /// A send is on the PostQ.
    pub sends: bool,
    /// Control messages of ours wait for credits.
    pub backlog: bool,
}

impl Arrivals {
    /// Nothing arrived and nothing waits: the poll has no work.
    #[inline(always)]
    pub fn none(self) -> bool {
        !(self.freeq | self.control | self.sends | self.backlog)
    }
}

/// Everything that exists only while connected.
pub(crate) struct Conn {
    /// The peer's window: everything we send it is a posted write into it.
    win: PeerWindow,
    /// The connection epoch: slot tags and FreeQ entries carry it, so
    /// nothing of an earlier connection is taken for a new message.
    epoch: u32,
    /// Our producers into our section of the peer's window, per [`Ring`].
    prod: [Producer; 4],
    /// Our consumers of the peer's section of our window, per [`Ring`].
    cons: [Consumer; 4],
    /// Control messages waiting for credits, per control ring (RX, TX, CQ).
    backlog: [VecDeque<Body>; 3],
    /// Offset of the FreeQ in our window where the peer lends us buffers.
    fq_base: usize,
    /// Sequence of the next FreeQ entry we expect.
    fq_seq: u64,
    /// `fq_seq` modulo the FreeQ's length (kept, not divided for).
    fq_slot: usize,
    /// Eager buffers of the peer's window we may send into (a stack).
    eager_free: Vec<u32>,
    /// Per buffer of the peer's: whether it is in `eager_free` (a buffer
    /// lent twice is the peer's error, counted, not a second use).
    eager_have: Vec<bool>,
    /// Offset of the FreeQ in the peer's window where we lend it buffers.
    fq_out_base: usize,
    /// Sequence of the next FreeQ entry we write.
    fq_out_seq: u64,
    /// Per buffer of ours: whether the peer holds it (a send naming a
    /// buffer it does not hold is dropped).
    lent: Vec<bool>,
    /// The peer's operations we serve, by its op id.
    served: HashMap<u64, InOp>,
    /// Highest op id seen per ring that starts operations (RX, TX):
    /// anything at or below is a replay.
    hwm: [u64; 2],
    /// Offset of our credit words in the peer's window.
    credit_base: usize,
    /// The peer's regions advertised to us for one-sided writes: key →
    /// (window offset, length).
    remote: HashMap<u32, (u64, u32)>,
    /// The last region written to (a stream of writes names one region):
    /// its key and its range, admitted in the window.
    remote_last: Cell<Option<(u32, Admitted)>>,
    /// Since when the connection has looked wedged (see [`Conn::wedged`]).
    stalled_since: Option<Instant>,
    /// Our producers' credits at the last stall check.
    credits_seen: [u64; 4],
}

/// How many slots past the one a consumer waits for are probed for a
/// valid message (evidence that the producer went on without it).
const STALL_PROBE: u64 = 8;

impl Conn {
    /// Builds the connection state for `peer` (we are `me`).
    pub fn new(layout: &Layout, me: Port, peer: Port, win: PeerWindow, epoch: u32) -> Self {
        let g = layout.geometry();
        let depth = g.queue_depth;
        let credits = layout.part(peer, Part::Credits);
        let prod = Ring::ALL.map(|r| {
            Producer::new(
                layout.part(me, Part::from(r)),
                depth,
                epoch,
                credits + 8 * r.index(),
            )
        });
        let cons = Ring::ALL.map(|r| Consumer::new(layout.part(peer, Part::from(r)), depth, epoch));
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
            served: HashMap::new(),
            hwm: [0; 2],
            credit_base: layout.part(me, Part::Credits),
            remote: HashMap::new(),
            remote_last: Cell::new(None),
            stalled_since: None,
            credits_seen: [0; 4],
        }
    }

    /// The peer's window.
    #[inline]
    pub fn win(&self) -> &PeerWindow {
        &self.win
    }

    // ---- sending control messages ----

    /// Sends `msg` on `ring` of the peer, or queues it behind earlier ones
    /// while the ring has no credit.
    ///
    /// A peer that stops crediting while we keep producing for it would make
    /// the backlog grow without bound: past [`BACKLOG_LIMIT`] messages the
    /// connection is declared broken (an error, like a device failure).
    #[inline]
    pub fn emit(&mut self, local: &LocalWindow, ring: Ring, msg: &Msg) -> HwResult<()> {
        let body = wire::encode(msg);
        let k = ring.index();
        if self.backlog[k].is_empty() && self.prod[k].free(local).0 > 0 {
            self.prod[k].push(&self.win, &body)
        } else if self.backlog[k].len() >= BACKLOG_LIMIT {
            Err(crate::hw::HwError::Fabric(
                "the peer stopped crediting its queue: connection reset".into(),
            ))
        } else {
            self.backlog[k].push_back(body);
            Ok(())
        }
    }

    /// What a poll of this connection has to look at: which of the peer's
    /// queues in our window show a new entry (each queue's next tag or
    /// FreeQ word, one load each), and whether messages wait for credits.
    /// Most polls find nothing, and stop here.
    #[inline(always)]
    pub fn arrivals(&self, local: &LocalWindow) -> Arrivals {
        // Sends first: the line a waiting peer's message lands on.
        let sends = self.cons[Ring::PostQ.index()].arrived(local, 0).is_some();
        let freeq = local
            .poll_u64(self.fq_base + self.fq_slot * 8)
            .is_some_and(|raw| parse_free_entry(self.epoch, self.fq_seq, raw).is_some());
        let control = Ring::CONTROL
            .iter()
            .any(|&r| self.cons[r.index()].arrived(local, 0).is_some());
        Arrivals {
            freeq,
            control,
            sends,
            backlog: self.backlog.iter().any(|b| !b.is_empty()),
        }
    }

    /// Sends what waits for credits (counting a nonsensical credit word),
    /// then writes our consumer progress back once a ring has a quarter
    /// of its depth uncredited.
    #[inline]
    pub fn settle(&mut self, local: &LocalWindow, counters: &mut QpCounters) -> HwResult<()> {
        for k in 0..self.backlog.len() {
            while !self.backlog[k].is_empty() {
                let (free, sane) = self.prod[k].free(local);
                if !sane {
                    counters.drop_one(DropKind::BadCredit);
                }
                if free == 0 {
                    break;
                }
                let body = self.backlog[k].pop_front().unwrap_or([0; wire::BODY]);
                self.prod[k].push(&self.win, &body)?;
            }
        }
        let batch = (self.cons[0].depth() / 4).max(1);
        if self.cons.iter().any(|q| q.uncredited() >= batch) {
            for k in 0..self.cons.len() {
                if self.cons[k].uncredited() > 0 {
                    self.cons[k].credit(&self.win, self.credit_base + 8 * k)?;
                }
            }
        }
        Ok(())
    }

    /// Writes our progress on `ring` back at once when a quarter of its
    /// depth is uncredited (as [`settle`](Self::settle) would at the end of
    /// the poll): a receiver draining a long run of sends credits the
    /// sender as it goes, so the two overlap instead of taking turns.
    #[inline]
    pub fn credit_when_due(&mut self, ring: Ring) -> HwResult<()> {
        let k = ring.index();
        let batch = (self.cons[k].depth() / 4).max(1);
        if self.cons[k].uncredited() >= batch {
            self.cons[k].credit(&self.win, self.credit_base + 8 * k)?;
        }
        Ok(())
    }

    // ---- receiving ----

    /// Our consumer of the peer's `ring` (in our window).
    #[inline]
    pub fn consumer(&mut self, ring: Ring) -> &mut Consumer {
        &mut self.cons[ring.index()]
    }

    // ---- eager buffers ----

    /// Lends all our eager buffers to the peer (at connect time); `false`
    /// if the device failed.
    pub fn lend_all(&mut self) -> bool {
        (0..self.lent.len() as u32).all(|i| self.lend(i).is_ok())
    }

    /// Lends our eager buffer `index` to the peer (a FreeQ entry in its window).
    #[inline]
    fn lend(&mut self, index: u32) -> HwResult<()> {
        let cap = self.lent.len() as u64;
        let off = self.fq_out_base + (self.fq_out_seq % cap) as usize * 8;
        self.win
            .write_u64(off, free_entry(self.epoch, self.fq_out_seq, index))?;
        self.fq_out_seq += 1;
        self.lent[index as usize] = true;
        Ok(())
    }

    /// Whether the peer holds our eager buffer `index` (so a send may name it).
    #[inline]
    pub fn is_lent(&self, index: u32) -> bool {
        self.lent.get(index as usize).copied().unwrap_or(false)
    }

    /// Takes back eager buffer `index` (its message was delivered) and
    /// lends it to the peer again.
    #[inline]
    pub fn give_back(&mut self, index: u32) -> HwResult<()> {
        self.lent[index as usize] = false;
        self.lend(index)
    }

    /// Takes the eager buffers the peer lent us since the last call: at
    /// most one lap of the FreeQ (a peer writing entries as fast as we take
    /// them, valid or not, cannot keep us here; the rest wait for the next
    /// call).
    #[inline]
    pub fn poll_freeq(&mut self, local: &LocalWindow, counters: &mut QpCounters) {
        let cap = self.eager_have.len();
        for _ in 0..cap {
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
    fn take_buffer(&mut self) -> Option<u32> {
        let i = self.eager_free.pop()?;
        self.eager_have[i as usize] = false;
        Some(i)
    }

    // ---- sends ----

    /// Writes a batch of sends (`data` of each) onto the peer's PostQ: as
    /// many as fit, stopping at the first that finds no room.
    ///
    /// One pass over the batch: how many fit, each send's slots encoded
    /// straight from the caller's bytes into `stage` (our own memory), an
    /// eager payload written into the peer's buffer at once (before any
    /// slot names it). Then one run of stores copies the slots into the
    /// peer's ring, last-first, the batch's first slot last — the peer,
    /// polling that slot, finds the whole batch at once and streams through
    /// it instead of chasing the writer line by line — and publishes them.
    ///
    /// Why a stage: each store to a slot line waits for the line to come
    /// back from the receiver, and stores leave the core in order, so what
    /// sits in the store queue between slot stores (the encoding's spills
    /// and register saves) limits how many lines are fetched at once. Built
    /// first and copied in one tight run, the slot stores fill the queue
    /// alone: 64 B sends sustained 8.4 -> 15.2 M/s with the cores on
    /// different physical cores, 27 -> 31 M/s on one (bench/RESULTS.md).
    #[inline(always)]
    pub fn write_sends(
        &mut self,
        local: &LocalWindow,
        eager: EagerBuffers,
        wrs: &[SendWr<'_>],
        stage: &mut Vec<wire::Words>,
        counters: &mut QpCounters,
    ) -> SendBatch {
        let peer = self.win.peer();
        let eager_size = eager.size;
        let postq = Ring::PostQ.index();
        // Slots of the batch so far, each encoded in `stage` (our own
        // memory, grown to the largest batch seen, never shrunk).
        let mut need = 0usize;
        let mut n = 0;
        let mut stopped = None;
        for wr in wrs {
            let (d, len) = (wr.data, wr.data.len());
            if len == 0 || len > eager_size {
                stopped = Some(TransportError::SendSize {
                    len,
                    max: eager_size,
                });
                break;
            }
            // Inline in consecutive slots where it fits (no eager buffer,
            // no buffer to return: fewer cache-line transfers both ways),
            // as long as the run is at most half the ring (so the
            // consumer's quarter-ring credits always make room for it).
            let inline = match wire::inline_slots(len) {
                Some(k) if k == 1 || 2 * k as u64 <= self.prod[postq].depth() => k,
                _ => 0,
            };
            let k = inline.max(1);
            if !self.prod[postq].room(local, (need + k) as u64).0 {
                stopped = Some(TransportError::Busy {
                    peer,
                    what: "the peer's PostQ is full",
                });
                break;
            }
            if stage.len() < need + k {
                stage.resize(need + k, [0; wire::BODY / 8]);
            }
            if inline > 0 {
                wire::encode_inline_words(d, &mut stage[need..need + k]);
            } else {
                if self.eager_free.is_empty() {
                    self.poll_freeq(local, counters);
                }
                let Some(buf) = self.take_buffer() else {
                    stopped = Some(TransportError::Busy {
                        peer,
                        what: "no eager buffer lent by the peer",
                    });
                    break;
                };
                // The payload now, before any slot names its buffer.
                if let Err(e) = self.win.write(eager.offset(buf), d) {
                    return SendBatch {
                        posted: 0,
                        stopped: Some(e.into()),
                        broken: true,
                    };
                }
                let len = len as u32;
                stage[need] = wire::body_words(&wire::encode(&Msg::SendBuf { buf, len }));
            }
            need += k;
            n += 1;
        }
        // The PostQ's area, checked once for the batch. Borrowed in place
        // (`ref`), not moved out of the result: a move copied the span
        // (built with 8-byte stores) with a 16-byte load, which the CPU
        // cannot forward from them, and every send stalled on it just before
        // its slot stores.
        let span = self.prod[postq].span(&self.win);
        let ring = match span {
            Ok(ref ring) => ring,
            Err(e) if n > 0 => {
                return SendBatch {
                    posted: 0,
                    stopped: Some(e.into()),
                    broken: true,
                };
            }
            Err(_) => {
                return SendBatch {
                    posted: 0,
                    stopped,
                    broken: false,
                };
            }
        };
        if let Err(e) = self.prod[postq].write_run(ring, &stage[..need]) {
            // The device failed under us: nothing of the batch is
            // produced and the connection is broken.
            return SendBatch {
                posted: 0,
                stopped: Some(e.into()),
                broken: true,
            };
        }
        SendBatch {
            posted: n,
            stopped,
            broken: false,
        }
    }

    // ---- operations we serve ----

    /// Admits a fresh op id on `ring` (RX or TX, the rings that start
    /// operations); `false` for a replay (an id at or below the highest
    /// seen, or one being served).
    pub fn admit(&mut self, ring: Ring, op: u64) -> bool {
        let hwm = &mut self.hwm[ring.index() & 1];
        if op <= *hwm || self.served.contains_key(&op) {
            return false;
        }
        *hwm = op;
        true
    }

    /// Whether `op` is above every id seen on `ring` (an operation that may
    /// still start).
    pub fn may_start(&self, ring: Ring, op: u64) -> bool {
        op > self.hwm[ring.index() & 1]
    }

    /// Starts serving the peer's operation `op`.
    pub fn serve(&mut self, op: u64, io: InOp) {
        self.served.insert(op, io);
    }

    /// The served operation `op`.
    pub fn served(&self, op: u64) -> Option<&InOp> {
        self.served.get(&op)
    }

    /// The served operation `op`, to move it along.
    pub fn served_mut(&mut self, op: u64) -> Option<&mut InOp> {
        self.served.get_mut(&op)
    }

    /// The served operation `op` together with the peer's window, to copy
    /// its data while moving it along.
    pub fn served_with_win(&mut self, op: u64) -> (&PeerWindow, Option<&mut InOp>) {
        (&self.win, self.served.get_mut(&op))
    }

    /// Stops serving `op` (done or failed).
    pub fn unserve(&mut self, op: u64) -> Option<InOp> {
        self.served.remove(&op)
    }

    /// The reads of region `key` we serve.
    pub fn served_reads_of(&self, key: RegionKey) -> Vec<u64> {
        self.served
            .iter()
            .filter(|(_, io)| matches!(io, InOp::Read { region, .. } if *region == key))
            .map(|(&op, _)| op)
            .collect()
    }

    /// The storage of our region area held for the peer's operations we
    /// serve: (region, length) each.
    pub fn storage(&self) -> impl Iterator<Item = (RegionKey, u32)> + '_ {
        self.served.values().filter_map(InOp::storage)
    }

    /// How many of the peer's operations we serve.
    pub fn serving(&self) -> usize {
        self.served.len()
    }

    /// Stops serving every operation past its deadline; returns them.
    pub fn expire_served(&mut self, now: Instant) -> Vec<(u64, InOp)> {
        let old: Vec<u64> = self
            .served
            .iter()
            .filter(|(_, o)| o.deadline() <= now)
            .map(|(id, _)| *id)
            .collect();
        old.into_iter()
            .filter_map(|id| Some((id, self.served.remove(&id)?)))
            .collect()
    }

    /// Ends the connection: the operations still served, by op id.
    pub fn into_served(self) -> impl Iterator<Item = (u64, InOp)> {
        self.served.into_iter()
    }

    // ---- the peer's regions, for one-sided writes ----

    /// The peer advertised region `rkey`: `len` bytes at `offset` of its
    /// window (validated inside its region area by the decoder). `false`
    /// (nothing learnt) when it already has [`MAX_REMOTE_REGIONS`] others
    /// advertised: the table is our memory, and a peer sending fresh keys
    /// without end must not grow it without end.
    pub fn learn_region(&mut self, rkey: u32, offset: u64, len: u32) -> bool {
        if self.remote.len() >= MAX_REMOTE_REGIONS && !self.remote.contains_key(&rkey) {
            return false;
        }
        self.remote_last.set(None);
        self.remote.insert(rkey, (offset, len));
        true
    }

    /// The peer revoked region `rkey`; whether we knew it.
    pub fn forget_region(&mut self, rkey: u32) -> bool {
        self.remote_last.set(None);
        self.remote.remove(&rkey).is_some()
    }

    /// The peer's advertised region `rkey` as a span of its window, for
    /// the writes of one call; `None` when it was not advertised to us, the
    /// window's error when the window refuses it (a peer that advertised
    /// what it does not grant us). The last region taken keeps its
    /// admission, so a stream of writes into it re-checks only what can
    /// change (see [`PeerWindow::span_admitted`]).
    #[inline(always)]
    pub fn remote_span(&self, rkey: u32) -> Option<HwResult<WindowSpan<'_>>> {
        // The stream's common case, inline: the region last written, its
        // admission still holding. The token is read where it is, never
        // stored back (a store loaded back by the next write stalls on
        // store forwarding).
        if let Some((k, region)) = self.remote_last.get()
            && k == rkey
            && let Some(span) = self.win.span_if_admitted(&region)
        {
            return Some(Ok(span));
        }
        self.remote_span_again(rkey)
    }

    /// [`remote_span`](Self::remote_span) when the region is another than
    /// the last one or its admission must be checked again: looked up,
    /// admitted (again) and kept for the writes that follow.
    #[cold]
    #[inline(never)]
    fn remote_span_again(&self, rkey: u32) -> Option<HwResult<WindowSpan<'_>>> {
        let mut region = match self.remote_last.get() {
            Some((k, region)) if k == rkey => region,
            _ => {
                let (offset, len) = self.remote.get(&rkey).copied()?;
                match self.win.admit(offset as usize, len as usize) {
                    Ok(region) => region,
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        let span = self.win.span_admitted(&mut region);
        if span.is_ok() {
            self.remote_last.set(Some((rkey, region)));
        }
        Some(span)
    }

    // ---- liveness of the connection itself ----

    /// Whether the connection has made no progress for `timeout` while the
    /// peer kept producing: a ring whose next slot never becomes valid
    /// though a later one did (a lost or corrupted slot), or messages
    /// waiting for credits that do not move. Checked every so often by the
    /// poll loop; a momentary gap (a batch published last-first) or a quiet
    /// peer is not a stall.
    pub fn wedged(&mut self, local: &LocalWindow, now: Instant, timeout: Duration) -> bool {
        let gap = self.cons.iter().any(|c| {
            c.peek(local).is_none() && (1..=STALL_PROBE).any(|k| c.peek_ahead(local, k).is_some())
        });
        let credits = std::array::from_fn(|k| self.prod[k].credit());
        let starved = self.backlog.iter().any(|b| !b.is_empty()) && credits == self.credits_seen;
        self.credits_seen = credits;
        if !(gap || starved) {
            self.stalled_since = None;
            return false;
        }
        let since = *self.stalled_since.get_or_insert(now);
        now.duration_since(since) >= timeout
    }

    // ---- resources ----

    /// Eager buffers of the peer's we hold.
    pub fn eager_free(&self) -> u32 {
        self.eager_free.len() as u32
    }

    /// Free slots in the peer's PostQ, as of its last credit.
    pub fn postq_free(&self) -> u64 {
        let p = &self.prod[Ring::PostQ.index()];
        p.depth() - (p.produced() - p.credit())
    }

    /// Control messages waiting for credits.
    pub fn backlog(&self) -> usize {
        self.backlog.iter().map(VecDeque::len).sum()
    }

    /// Whether an SGL of `msgs` messages towards `ring` fits beside what
    /// waits there already (see [`SGL_BACKLOG_ROOM`]).
    pub fn sgl_fits(&self, ring: Ring, msgs: usize) -> bool {
        self.backlog[ring.index()].len() + msgs <= SGL_BACKLOG_ROOM
    }
}
