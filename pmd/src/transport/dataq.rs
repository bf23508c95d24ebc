//! Data queues: DPDK-style bursts of mbufs to and from one peer, beside the
//! queue pair, each queue owned by one thread at a time.
//!
//! Queue `q` towards peer `p` is two one-way channels, laid out in the
//! sections as `geometry.rs` says ([`DataPart`]): in *our* window, `p`'s
//! section holds the descriptors of its messages to us, our receive buffers
//! it writes into, the FreeQ where it lends us its receive buffers, and its
//! credit for our descriptors; in *its* window our section holds the same
//! for the other direction. Everything is a posted write into the
//! receiver's window, as DPDK's raw/ntb ring layout (remote writes only).
//!
//! - **tx_burst**: for each mbuf, take a buffer the peer lent us (FreeQ),
//!   copy the payload into it, write a descriptor slot {buffer, length, user
//!   word} (tag by release store last); then free the local mbufs (at once,
//!   or in batches of the tx free threshold, DPDK's `tx_free_thresh`).
//! - **rx_burst**: take each descriptor whose tag is there, check it (a
//!   buffer we lent, a length that fits), and hand out that very buffer as an
//!   mbuf of the queue's receive pool — no copy. Dropping (or bulk-freeing)
//!   the mbuf returns the buffer to the pool; the next bursts lend free
//!   buffers back to the peer in batches.
//!
//! The receive pool is an `ntbdk-mempool` pool over the buffers in our
//! window ([`Pool::create_over`]); its bookkeeping is private memory.
//!
//! **Connection changes.** The transport publishes the peer's connection in
//! a [`ConnWatch`] word; each burst loads it first. On a new connection the
//! queue starts over: buffers lent to the peer come back to the pool, lends
//! from the peer are forgotten, sequences restart under the new epoch. While
//! down, bursts move nothing.
//!
//! **Trust.** The peer writes descriptors, FreeQ entries, a credit word and
//! the payloads; each is validated before use (a descriptor naming a buffer
//! we did not lend, a length past the buffer, a lend out of range or twice)
//! and counted, never followed. A received payload may change under the
//! application (the peer can write its buffers at any time): that is the
//! threat model of every NTB window, and why mbuf bytes are only copied or
//! loaded, never borrowed as slices.

use std::sync::Arc;

use ntbdk_mempool::{ObjIdx, Pool, PoolOptions};

use crate::hw::{LocalWindow, NtbDevice, PeerWindow, Port};
use crate::mbuf::Mbuf;

use super::geometry::{DataPart, Layout};
use super::queue::{Consumer, Producer, free_entry, parse_free_entry};
use super::watch::{ConnWatch, epoch_of};
use super::wire::BODY;

/// Most buffers lent back to the peer in one go.
const LEND_BATCH: usize = 64;

/// Counters of one data queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataQueueStats {
    /// Mbufs sent.
    pub tx: u64,
    /// Payload bytes sent.
    pub tx_bytes: u64,
    /// Mbufs received.
    pub rx: u64,
    /// Payload bytes received (in place: none of them copied).
    pub rx_bytes: u64,
    /// tx bursts that stopped short for want of a lent buffer or a
    /// descriptor (back-pressure).
    pub tx_full: u64,
    /// Mbufs dropped at tx because they exceed the peer's buffers.
    pub tx_oversize: u64,
    /// Descriptors refused (a buffer we had not lent, a bad length).
    pub bad_desc: u64,
    /// FreeQ entries refused (out of range, or lent twice).
    pub bad_lend: u64,
    /// Buffers lent to the peer (in total).
    pub lent: u64,
    /// Times the queue started over on a new connection.
    pub resets: u64,
    /// Bursts that failed on a device error (the link went away under us).
    pub device_errors: u64,
}

/// One data queue towards one peer: `tx_burst` and `rx_burst`, `Send`, owned
/// by one thread at a time (see the module docs).
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use ntbdk_mempool::ZoneOptions;
/// use ntbdk_pmd::hw::loopback::LoopbackFabric;
/// use ntbdk_pmd::mbuf::{Mbuf, MbufPool};
/// use ntbdk_pmd::transport::{Config, DataQueues, Geometry, Transport};
///
/// // Both hosts agree on one data queue per peer: 64 descriptors, 256 B buffers.
/// let g = Geometry {
///     data: DataQueues { count: 1, nb_desc: 64, buf_size: 256 },
///     ..Geometry::small(2)
/// };
/// let fabric = LoopbackFabric::new(2, 1 << 20);
/// let mut a = Transport::new(Arc::new(fabric.join(0)?), Config::new(g))?;
/// let mut b = Transport::new(Arc::new(fabric.join(1)?), Config::new(g))?;
/// let (mut tx, mut rx) = (a.data_queue(1, 0)?, b.data_queue(0, 0)?);
/// let deadline = Instant::now() + Duration::from_secs(5);
/// while !a.is_connected(1) || !b.is_connected(0) {
///     a.progress(); // the control path: keep polling it (any thread)
///     b.progress();
///     assert!(Instant::now() < deadline);
/// }
/// let pool = MbufPool::create("doc-tx", 64, 256, 0, &ZoneOptions::no_huge())?;
/// let mut burst = Vec::new();
/// pool.alloc_bulk(4, &mut burst)?;
/// for (i, m) in burst.iter_mut().enumerate() {
///     m.append(format!("message {i}").as_bytes())?;
/// }
/// let mut got = Vec::new();
/// while got.len() < 4 {
///     tx.tx_burst(&mut burst); // sent mbufs are freed; the rest stay
///     rx.rx_burst(&mut got, 32); // lends buffers; hands out the peer's, in place
///     assert!(Instant::now() < deadline);
/// }
/// assert_eq!(got[3].to_vec(), b"message 3");
/// Mbuf::free_bulk(&mut got); // lent back to the sender in batches
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DataQueue {
    peer: Port,
    queue: u16,
    local: LocalWindow,
    /// The device, for the peer's window at each new connection.
    dev: Arc<dyn NtbDevice>,
    mw: usize,
    /// The peer's window while connected.
    win: Option<PeerWindow>,
    watch: Arc<ConnWatch>,
    /// The connection word we run under (0: down).
    seen: u64,
    nb_desc: u32,
    buf_size: u32,
    /// Our descriptors for the peer, in its window.
    prod: Producer,
    /// The peer's descriptors for us, in our window.
    cons: Consumer,
    /// Offset of our receive buffers' FreeQ in the peer's window.
    fq_out: usize,
    fq_out_seq: u64,
    /// Offset of the peer's FreeQ in our window (its buffers lent to us).
    fq_in: usize,
    fq_in_seq: u64,
    /// Offset of the peer's buffers in its window (we send into them).
    bufs_out: usize,
    /// Offset of our credit word in the peer's window.
    credit_out: usize,
    /// Peer buffers we may send into (a stack) and, per buffer, whether it
    /// is in that stack.
    peer_free: Vec<u32>,
    peer_have: Vec<bool>,
    /// Our receive buffers: the pool over them and, per buffer, whether it
    /// is lent to the peer now.
    pool: Pool,
    lent: Vec<bool>,
    lent_now: u32,
    /// Sent mbufs waiting to be freed in bulk, and how many trigger it
    /// (DPDK's `tx_free_thresh`; 0 or 1: freed as sent).
    tx_done: Vec<Mbuf>,
    tx_free_thresh: usize,
    stats: DataQueueStats,
}

impl DataQueue {
    /// Builds queue `queue` of `me` towards `peer` (called by
    /// [`Transport::data_queue`](super::Transport::data_queue)).
    pub(crate) fn new(
        layout: &Layout,
        me: Port,
        peer: Port,
        queue: u16,
        local: LocalWindow,
        (dev, mw): (Arc<dyn NtbDevice>, usize),
        watch: Arc<ConnWatch>,
    ) -> super::error::Result<DataQueue> {
        let d = layout.geometry().data;
        let n = d.nb_desc as usize;
        let bufs_in = layout.data_part(peer, queue, DataPart::Bufs);
        let ptr = local.ptr_at(bufs_in, n * d.buf_size as usize)?;
        let opts = PoolOptions {
            cache_size: 0,
            track_state: true,
            ..PoolOptions::new(d.buf_size as usize, d.nb_desc)
        };
        let objects = std::ptr::NonNull::new(ptr).expect("a window pointer is not null");
        // SAFETY: the buffers lie in our window (checked by `ptr_at`), which
        // the `LocalWindow` clone passed as `keep` keeps mapped; only this
        // queue (taken once per peer and queue) hands them out.
        let pool = unsafe {
            Pool::create_over(
                &format!("ntbdk-rxq-{me}-{peer}-{queue}"),
                &opts,
                objects,
                n * d.buf_size as usize,
                Arc::new(local.clone()),
            )
        }
        .map_err(|e| super::error::TransportError::DataQueuePool(e.to_string()))?;
        let credit_in = layout.data_part(peer, queue, DataPart::Credit);
        Ok(DataQueue {
            peer,
            queue,
            prod: Producer::new(
                layout.data_part(me, queue, DataPart::Desc),
                d.nb_desc,
                0,
                credit_in,
            ),
            cons: Consumer::new(layout.data_part(peer, queue, DataPart::Desc), d.nb_desc, 0),
            fq_out: layout.data_part(me, queue, DataPart::FreeQ),
            fq_out_seq: 0,
            fq_in: layout.data_part(peer, queue, DataPart::FreeQ),
            fq_in_seq: 0,
            bufs_out: layout.data_part(me, queue, DataPart::Bufs),
            credit_out: layout.data_part(me, queue, DataPart::Credit),
            local,
            dev,
            mw,
            win: None,
            watch,
            seen: 0,
            nb_desc: d.nb_desc,
            buf_size: d.buf_size,
            peer_free: Vec::with_capacity(n),
            peer_have: vec![false; n],
            pool,
            lent: vec![false; n],
            lent_now: 0,
            tx_done: Vec::new(),
            tx_free_thresh: 0,
            stats: DataQueueStats::default(),
        })
    }

    /// The peer this queue talks to.
    pub fn peer(&self) -> Port {
        self.peer
    }

    /// This queue's index.
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// Whether the connection is up (as of the last burst or this call).
    pub fn is_up(&mut self) -> bool {
        self.sync()
    }

    /// The counters.
    pub fn stats(&self) -> DataQueueStats {
        self.stats
    }

    /// Bytes per buffer of the peer (the largest mbuf `tx_burst` sends).
    pub fn buf_size(&self) -> usize {
        self.buf_size as usize
    }

    /// Receive buffers in all (`nb_desc`).
    pub fn rx_pool_size(&self) -> usize {
        self.pool.size()
    }

    /// Receive buffers free in the pool: neither lent to the peer nor held
    /// by the application as received mbufs.
    pub fn rx_pool_available(&self) -> usize {
        self.pool.available()
    }

    /// Receive buffers lent to the peer now.
    pub fn rx_lent(&self) -> usize {
        self.lent_now as usize
    }

    /// Frees sent mbufs in batches of `thresh` (DPDK's `tx_free_thresh`)
    /// instead of one by one as they are sent: they return to their pools
    /// with [`Mbuf::free_bulk`] once `thresh` have gathered. 0 or 1 frees
    /// each as it is sent (the default). Mbufs still gathered are freed by
    /// [`tx_done_cleanup`](DataQueue::tx_done_cleanup) or when the queue is
    /// dropped. Keep it well under the senders' pools (and, when sending
    /// received mbufs back, under `nb_desc`): gathered mbufs are not free.
    pub fn set_tx_free_thresh(&mut self, thresh: usize) {
        self.tx_free_thresh = thresh;
        if self.tx_done.len() >= thresh {
            self.tx_done_cleanup();
        }
    }

    /// Frees the sent mbufs gathered so far (DPDK's
    /// `rte_eth_tx_done_cleanup`); returns how many.
    pub fn tx_done_cleanup(&mut self) -> usize {
        let n = self.tx_done.len();
        Mbuf::free_bulk(&mut self.tx_done);
        n
    }

    /// Sends a prefix of `mbufs` (DPDK's `rte_eth_tx_burst`): each one's data
    /// is copied into a buffer the peer lent and announced by a descriptor;
    /// the sent mbufs are removed from the front of `mbufs` and freed to
    /// their pools (at once, or in batches: see
    /// [`set_tx_free_thresh`](DataQueue::set_tx_free_thresh)). Returns how many were sent; the rest stay in `mbufs`
    /// (back-pressure: the peer has not lent more buffers or credited more
    /// descriptors yet), to be sent again or freed by the caller. An mbuf
    /// longer than the peer's buffers is dropped and counted as sent.
    pub fn tx_burst(&mut self, mbufs: &mut Vec<Mbuf>) -> usize {
        if mbufs.is_empty() || !self.sync() {
            return 0;
        }
        if self.peer_free.len() < mbufs.len() {
            self.take_lends();
        }
        let Some(win) = self.win.as_ref() else {
            return 0;
        };
        // Reads the peer's credit only when short of descriptors.
        let _ = self.prod.room(&self.local, mbufs.len() as u64);
        let slots = self.prod.free(&self.local).0 as usize;
        let n = mbufs.len().min(slots).min(self.peer_free.len());
        let mut sent = 0;
        for m in &mbufs[..n] {
            if m.len() > self.buf_size as usize {
                self.stats.tx_oversize += 1;
                sent += 1;
                continue;
            }
            let b = self.peer_free.pop().expect("n <= peer_free.len()");
            self.peer_have[b as usize] = false;
            let (src, len) = m.data_ptr();
            let off = self.bufs_out + b as usize * self.buf_size as usize;
            // SAFETY: `src` points at the mbuf's `len` data bytes, which the
            // mbuf owns and keeps mapped for this call.
            let wrote = unsafe { win.write_from_ptr(off, src, len) }
                .and_then(|_| self.prod.push(win, &descriptor(b, len as u32, m.user())));
            if wrote.is_err() {
                self.stats.device_errors += 1;
                break;
            }
            self.stats.tx += 1;
            self.stats.tx_bytes += len as u64;
            sent += 1;
        }
        if sent < mbufs.len() {
            self.stats.tx_full += 1;
        }
        if self.tx_free_thresh > 1 {
            self.tx_done.extend(mbufs.drain(..sent));
            if self.tx_done.len() >= self.tx_free_thresh {
                Mbuf::free_bulk(&mut self.tx_done);
            }
        } else {
            Mbuf::free_front(mbufs, sent);
        }
        sent
    }

    /// Receives up to `max` mbufs into `out` (DPDK's `rte_eth_rx_burst`):
    /// each is the very buffer the peer wrote, in our window, handed out in
    /// place. Returns how many were appended. Also lends freed buffers back
    /// to the peer and credits its descriptors: the peer can send nothing
    /// on this queue until its receiver has called `rx_burst` once since
    /// the connection came up (that first call lends every free buffer).
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        if !self.sync() {
            return 0;
        }
        self.lend();
        let mut n = 0;
        while n < max {
            let Some(body) = self.cons.peek(&self.local) else {
                break;
            };
            self.cons.advance();
            let (b, len, user) = parse_descriptor(&body);
            if b >= self.nb_desc || !self.lent[b as usize] || len > self.buf_size {
                self.stats.bad_desc += 1;
                continue;
            }
            self.lent[b as usize] = false;
            self.lent_now -= 1;
            let h = self.pool.handle(b).expect("b < nb_desc, the pool's size");
            // SAFETY: buffer `b` was lent (taken from the pool as a raw
            // handle when lent) and is now the peer's no longer: the mbuf
            // becomes its only owner.
            let mut m = unsafe { Mbuf::from_pool(&self.pool, h, len, self.peer, self.queue) };
            m.set_user(user);
            out.push(m);
            self.stats.rx += 1;
            self.stats.rx_bytes += u64::from(len);
            n += 1;
        }
        if self.cons.uncredited() >= u64::from(self.nb_desc / 4).max(1)
            && let Some(win) = self.win.as_ref()
            && self.cons.credit(win, self.credit_out).is_err()
        {
            self.stats.device_errors += 1;
        }
        n
    }

    /// Follows the connection word: on a change, starts over (see the
    /// module docs). Returns whether the connection is up.
    #[inline]
    fn sync(&mut self) -> bool {
        let w = self.watch.load();
        if w == self.seen && (w == 0 || self.win.is_some()) {
            return w != 0;
        }
        self.start_over(w);
        self.win.is_some()
    }

    #[cold]
    fn start_over(&mut self, word: u64) {
        let lent: Vec<ObjIdx> = (0..self.nb_desc)
            .filter(|&b| self.lent[b as usize])
            .filter_map(|b| self.pool.handle(b).ok())
            .collect();
        // The peer of the old connection no longer holds them.
        let _ = self.pool.put_bulk_checked(&lent);
        self.lent.fill(false);
        self.lent_now = 0;
        self.peer_free.clear();
        self.peer_have.fill(false);
        self.seen = word;
        let epoch = epoch_of(word);
        let credit_in = self.prod_credit_offset();
        self.prod = Producer::new(self.prod_base(), self.nb_desc, epoch, credit_in);
        self.cons = Consumer::new(self.cons_base(), self.nb_desc, epoch);
        self.fq_out_seq = 0;
        self.fq_in_seq = 0;
        self.win = None;
        if word != 0 {
            self.stats.resets += 1;
            match self.dev.peer_window(self.peer, self.mw) {
                Ok(w) => self.win = Some(w),
                Err(_) => self.stats.device_errors += 1,
            }
        }
    }

    /// Lends free receive buffers to the peer, in batches.
    fn lend(&mut self) {
        let Some(win) = self.win.as_ref() else {
            return;
        };
        let room = self.nb_desc - self.lent_now;
        // The pool has no thread caches: every free buffer is in its ring.
        let avail = self.pool.available_in_ring().min(room as usize);
        if avail == 0 || (avail < LEND_BATCH.min(self.nb_desc as usize / 4) && self.lent_now > 0) {
            return;
        }
        let mut hs = [ObjIdx::default(); LEND_BATCH];
        let mut left = avail;
        let epoch = epoch_of(self.seen);
        let mask = u64::from(self.nb_desc) - 1;
        while left > 0 {
            let k = left.min(LEND_BATCH);
            if self.pool.get_bulk(&mut hs[..k]).is_err() {
                break; // taken meanwhile by nobody else: cannot happen; stop
            }
            for h in &hs[..k] {
                let b = h.index();
                let at = self.fq_out + ((self.fq_out_seq & mask) as usize) * 8;
                let entry = free_entry(epoch, self.fq_out_seq, b);
                if win.write_u64(at, entry).is_err() {
                    self.stats.device_errors += 1;
                    // Not lent after all.
                    let _ = self.pool.put_checked(*h);
                    continue;
                }
                self.fq_out_seq += 1;
                self.lent[b as usize] = true;
                self.lent_now += 1;
                self.stats.lent += 1;
            }
            left -= k;
        }
    }

    /// Takes the buffers the peer lent us from the FreeQ in our window.
    fn take_lends(&mut self) {
        let epoch = epoch_of(self.seen);
        let mask = u64::from(self.nb_desc) - 1;
        loop {
            let at = self.fq_in + ((self.fq_in_seq & mask) as usize) * 8;
            let Ok(raw) = self.local.load_u64(at) else {
                return;
            };
            let Some(b) = parse_free_entry(epoch, self.fq_in_seq, raw) else {
                return;
            };
            self.fq_in_seq += 1;
            if b >= self.nb_desc || self.peer_have[b as usize] {
                self.stats.bad_lend += 1;
                continue;
            }
            self.peer_have[b as usize] = true;
            self.peer_free.push(b);
        }
    }

    fn prod_base(&self) -> usize {
        self.prod.base()
    }

    fn prod_credit_offset(&self) -> usize {
        self.prod.credit_offset()
    }

    fn cons_base(&self) -> usize {
        self.cons.base()
    }
}

impl std::fmt::Debug for DataQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataQueue")
            .field("peer", &self.peer)
            .field("queue", &self.queue)
            .field("up", &(self.seen != 0))
            .field("stats", &self.stats)
            .finish()
    }
}

/// A descriptor's body: buffer index, length, user word.
#[inline]
fn descriptor(buffer: u32, len: u32, user: u64) -> [u8; BODY] {
    let mut b = [0u8; BODY];
    b[0..4].copy_from_slice(&buffer.to_le_bytes());
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[8..16].copy_from_slice(&user.to_le_bytes());
    b
}

/// The fields of a descriptor's body (any bytes: validated by the caller).
#[inline]
fn parse_descriptor(b: &[u8; BODY]) -> (u32, u32, u64) {
    let word = |r: std::ops::Range<usize>| {
        let mut a = [0u8; 8];
        a[..r.len()].copy_from_slice(&b[r]);
        u64::from_le_bytes(a)
    };
    (word(0..4) as u32, word(4..8) as u32, word(8..16))
}

impl super::Transport {
    /// Takes data queue `queue` towards `peer` (DPDK's queue setup): a
    /// handle with [`tx_burst`](DataQueue::tx_burst) and
    /// [`rx_burst`](DataQueue::rx_burst), `Send`, for one thread at a time.
    /// Each queue is taken once; it can be taken before the peer connects
    /// and follows reconnects by itself. The transport must keep being
    /// polled (by any thread that owns it) for the connection to come up and
    /// be kept alive; the queues move data without it.
    ///
    /// # Errors
    /// [`TransportError::NoSuchPeer`](super::TransportError::NoSuchPeer),
    /// [`TransportError::NoDataQueue`](super::TransportError::NoDataQueue)
    /// (the geometry has fewer data queues),
    /// [`TransportError::DataQueueTaken`](super::TransportError::DataQueueTaken),
    /// or a device error getting the peer's window.
    pub fn data_queue(&mut self, peer: Port, queue: u16) -> super::error::Result<DataQueue> {
        use super::error::TransportError;
        if peer == self.me || peer as usize >= self.peers.len() {
            return Err(TransportError::NoSuchPeer { peer });
        }
        let count = self.layout.geometry().data.count;
        if queue >= count {
            return Err(TransportError::NoDataQueue { peer, queue, count });
        }
        let watch = self.peers[peer as usize].watch.clone();
        if !watch.take(queue) {
            return Err(TransportError::DataQueueTaken { peer, queue });
        }
        DataQueue::new(
            &self.layout,
            self.me,
            peer,
            queue,
            self.local.clone(),
            (self.dev.clone(), self.cfg.mw),
            watch.clone(),
        )
        .inspect_err(|_| watch.release(queue))
    }
}
