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
//! - **tx_burst**: take the buffers the peer lent us since the last burst
//!   (FreeQ) onto a stack, so the ones lent last are used first and the
//!   buffers in circulation stay few and warm; for each mbuf, copy the
//!   payload into a buffer; then write the descriptors {buffer, length,
//!   user word}, three to a slot (tag by release store last), slots
//!   last-first so that the receiver polling the first finds the run
//!   written; then free the local mbufs (at once, or in batches of the tx
//!   free threshold, DPDK's `tx_free_thresh`).
//! - **rx_burst**: take each slot whose tag is there, check its count and
//!   each descriptor (a buffer we lent, a length that fits), and hand out
//!   that very buffer as an mbuf of the queue's receive pool — no copy
//!   (descriptors past `max` wait for the next burst). Dropping (or
//!   bulk-freeing) the mbuf returns the buffer to the pool; the next bursts
//!   lend free buffers back to the peer in batches.
//!
//! The receive pool is an `ntbdk-mempool` pool over the buffers in our
//! window (`Pool::create_over`); its bookkeeping is private memory.
//!
//! The two directions share nothing but the connection they follow: a
//! [`DataQueue`] is an [`RxQueue`] (`rx.rs`) and a [`TxQueue`] (`tx.rs`),
//! and [`DataQueue::split`] gives them to two lcores (an rx stage and a tx
//! stage of a pipeline) with no lock between them.
//!
//! **Epochs.** Every connection has its own epoch, derived from the two
//! sides' incarnations: processes that restart, resyncs, and a link that
//! drops and comes back (the side that saw it drop takes a new incarnation)
//! all give a new one, so a descriptor, lend or credit the peer's old halves
//! write late is never taken for the new connection's.
//!
//! **Connection changes.** The transport publishes the peer's connection in
//! a connection word (`watch.rs`, followed by `link.rs`); each burst loads it first. On a new connection the
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

mod link;
mod rx;
mod tx;

use std::sync::Arc;

use crate::hw::{LocalWindow, NtbDevice, Port};
use crate::mbuf::Mbuf;

use super::claim::WindowClaim;
use super::geometry::Layout;
use super::watch::ConnWatch;
use super::wire::{BODY, Words};

pub use rx::RxQueue;
pub use tx::TxQueue;

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
    /// Credit words refused (behind the last one, or past what we sent).
    pub bad_credit: u64,
    /// Buffers lent to the peer (in total).
    pub lent: u64,
    /// Times the queue started over on a new connection.
    pub resets: u64,
    /// Bursts that failed on a device error (the link went away under us).
    pub device_errors: u64,
}

impl DataQueueStats {
    /// The counters of both directions together.
    fn merge(rx: DataQueueStats, tx: DataQueueStats) -> DataQueueStats {
        DataQueueStats {
            tx: tx.tx,
            tx_bytes: tx.tx_bytes,
            rx: rx.rx,
            rx_bytes: rx.rx_bytes,
            tx_full: tx.tx_full,
            tx_oversize: tx.tx_oversize,
            bad_desc: rx.bad_desc,
            bad_lend: tx.bad_lend,
            bad_credit: tx.bad_credit,
            lent: rx.lent,
            resets: rx.resets.max(tx.resets),
            device_errors: rx.device_errors + tx.device_errors,
        }
    }
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
#[derive(Debug)]
pub struct DataQueue {
    rx: RxQueue,
    tx: TxQueue,
}

impl DataQueue {
    /// Builds queue `queue` of `me` towards `peer` (called by
    /// [`Transport::data_queue`](super::Transport::data_queue)).
    pub(crate) fn new(
        layout: &Layout,
        me: Port,
        peer: Port,
        queue: u16,
        local: (LocalWindow, Arc<WindowClaim>),
        dev: (Arc<dyn NtbDevice>, usize),
        watch: Arc<ConnWatch>,
    ) -> super::error::Result<DataQueue> {
        let link = link::Link::new(peer, queue, local, dev, watch);
        Ok(DataQueue {
            rx: RxQueue::new(layout, me, link.clone())?,
            tx: TxQueue::new(layout, me, link),
        })
    }

    /// Splits the queue into its receive and send halves, for two lcores
    /// (an rx stage and a tx stage); each follows the connection by itself.
    pub fn split(self) -> (RxQueue, TxQueue) {
        (self.rx, self.tx)
    }

    /// The peer this queue talks to.
    pub fn peer(&self) -> Port {
        self.rx.peer()
    }

    /// This queue's index.
    pub fn queue(&self) -> u16 {
        self.rx.queue()
    }

    /// Whether the connection is up (as of the last burst or this call).
    pub fn is_up(&mut self) -> bool {
        let rx = self.rx.is_up();
        self.tx.is_up() && rx
    }

    /// The counters of both directions.
    pub fn stats(&self) -> DataQueueStats {
        DataQueueStats::merge(self.rx.stats(), self.tx.stats())
    }

    /// Bytes per buffer of the peer (the largest mbuf `tx_burst` sends).
    pub fn buf_size(&self) -> usize {
        self.tx.buf_size()
    }

    /// Receive buffers in all (`nb_desc`).
    pub fn rx_pool_size(&self) -> usize {
        self.rx.pool_size()
    }

    /// Receive buffers free in the pool: neither lent to the peer nor held
    /// by the application as received mbufs.
    pub fn rx_pool_available(&self) -> usize {
        self.rx.pool_available()
    }

    /// Receive buffers lent to the peer now.
    pub fn rx_lent(&self) -> usize {
        self.rx.lent()
    }

    /// See [`TxQueue::set_tx_free_thresh`].
    pub fn set_tx_free_thresh(&mut self, thresh: usize) {
        self.tx.set_tx_free_thresh(thresh);
    }

    /// See [`TxQueue::tx_done_cleanup`].
    pub fn tx_done_cleanup(&mut self) -> usize {
        self.tx.tx_done_cleanup()
    }

    /// See [`TxQueue::tx_burst`].
    #[inline]
    pub fn tx_burst(&mut self, mbufs: &mut Vec<Mbuf>) -> usize {
        self.tx.tx_burst(mbufs)
    }

    /// See [`RxQueue::rx_burst`].
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        self.rx.rx_burst(out, max)
    }
}

/// Descriptors per slot. A slot's body is seven words: the count (1..=3)
/// in word 0, then each descriptor as two words: its buffer index and
/// length (little-endian u32s, word `1 + 2i`) and its user word (word
/// `2 + 2i`). A burst thus moves one slot line per three messages, not one
/// per message.
pub(crate) const PER_SLOT: usize = 3;

/// One descriptor: buffer index, length, user word.
pub(crate) type Desc = (u32, u32, u64);

/// The words of a slot carrying `descs` (1..=[`PER_SLOT`] of them).
#[inline]
fn descriptor_slot(descs: &[Desc]) -> Words {
    debug_assert!((1..=PER_SLOT).contains(&descs.len()));
    let mut w = [0u64; BODY / 8];
    w[0] = descs.len() as u64;
    for (i, &(buffer, len, user)) in descs.iter().enumerate() {
        w[1 + 2 * i] = u64::from(buffer) | (u64::from(len) << 32);
        w[2 + 2 * i] = user;
    }
    w
}

/// A slot's count word and its descriptors (any bytes: the caller checks
/// the count and each descriptor).
#[inline]
fn parse_descriptor_slot(b: &[u8; BODY]) -> (u64, [Desc; PER_SLOT]) {
    let word = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(a)
    };
    let desc = |i: usize| {
        let w = word(1 + 2 * i);
        (w as u32, (w >> 32) as u32, word(2 + 2 * i))
    };
    (word(0), [desc(0), desc(1), desc(2)])
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
            (self.local.clone(), self.claim.clone()),
            (self.dev.clone(), self.cfg.mw),
            watch.clone(),
        )
        .inspect_err(|_| watch.release(queue))
    }
}
