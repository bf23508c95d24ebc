//! The send half of a data queue: copies mbufs into the buffers the peer
//! lent and announces each with a descriptor.

use std::mem::MaybeUninit;

use crate::hw::Port;
use crate::mbuf::Mbuf;

use super::super::geometry::{DataPart, Layout};
use super::super::queue::{Producer, parse_free_entry};
use super::link::{Link, Seen};
use super::{DataQueueStats, Desc, PER_SLOT, descriptor_slot};

/// Mbufs sent as one run: payloads first, then the descriptor slots
/// last-first. A multiple of [`PER_SLOT`], so that runs fill their slots
/// and a burst takes no more slots than its mbufs need.
const RUN: usize = 11 * PER_SLOT;

/// The send half of a data queue (see [`DataQueue`](super::DataQueue)):
/// `Send`, for one thread at a time.
pub struct TxQueue {
    link: Link,
    nb_desc: u32,
    buf_size: u32,
    /// Our descriptors for the peer, in its window.
    prod: Producer,
    /// Offset of the peer's FreeQ in our window (its buffers lent to us).
    fq_in: usize,
    fq_in_seq: u64,
    /// Offset of the peer's buffers in its window (we send into them).
    bufs_out: usize,
    /// Peer buffers we may send into, and per buffer whether it is here.
    /// A stack: new lends go on top at every burst and are used first, so
    /// the buffers in circulation stay as few as the traffic needs and warm
    /// in the caches, while the rest rest at the bottom. (Used in lending
    /// order, every one of `nb_desc` buffers of 4 KiB was written in turn,
    /// 4 MiB, more than an L2: 3.3 against 4.9 M/s at 4 KiB in
    /// `bench dataplane`.)
    peer_free: Vec<u32>,
    peer_have: Vec<bool>,
    /// Sent mbufs waiting to be freed in bulk, and how many trigger it
    /// (DPDK's `tx_free_thresh`; 0 or 1: freed as sent).
    tx_done: Vec<Mbuf>,
    tx_free_thresh: usize,
    /// A run failed after some of its slots were written ahead: nothing
    /// more is sent until the connection starts over.
    broken: bool,
    stats: DataQueueStats,
}

impl TxQueue {
    pub(super) fn new(layout: &Layout, me: Port, link: Link) -> TxQueue {
        let (peer, queue) = (link.peer, link.queue);
        let d = layout.geometry().data;
        let n = d.nb_desc as usize;
        TxQueue {
            nb_desc: d.nb_desc,
            buf_size: d.buf_size,
            prod: Producer::new(
                layout.data_part(me, queue, DataPart::Desc),
                d.nb_desc,
                0,
                layout.data_part(peer, queue, DataPart::Credit),
            ),
            fq_in: layout.data_part(peer, queue, DataPart::FreeQ),
            fq_in_seq: 0,
            bufs_out: layout.data_part(me, queue, DataPart::Bufs),
            peer_free: Vec::with_capacity(n),
            peer_have: vec![false; n],
            tx_done: Vec::new(),
            tx_free_thresh: 0,
            broken: false,
            link,
            stats: DataQueueStats::default(),
        }
    }

    /// The peer this queue talks to.
    pub fn peer(&self) -> Port {
        self.link.peer
    }

    /// This queue's index.
    pub fn queue(&self) -> u16 {
        self.link.queue
    }

    /// Whether the connection is up (as of the last burst or this call).
    pub fn is_up(&mut self) -> bool {
        self.sync()
    }

    /// The send counters (`tx`, `tx_bytes`, `tx_full`, `tx_oversize`,
    /// `bad_lend`, `bad_credit`, `resets`, `device_errors`).
    pub fn stats(&self) -> DataQueueStats {
        self.link.counted(self.stats)
    }

    /// Bytes per buffer of the peer (the largest mbuf `tx_burst` sends).
    pub fn buf_size(&self) -> usize {
        self.buf_size as usize
    }

    /// Frees sent mbufs in batches of `thresh` (DPDK's `tx_free_thresh`)
    /// instead of one by one as they are sent: they return to their pools
    /// with [`Mbuf::free_bulk`] once `thresh` have gathered. 0 or 1 frees
    /// each as it is sent (the default). Mbufs still gathered are freed by
    /// [`tx_done_cleanup`](TxQueue::tx_done_cleanup) or when the queue is
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
    /// [`set_tx_free_thresh`](TxQueue::set_tx_free_thresh)). Returns how
    /// many were sent; the rest stay in `mbufs` (back-pressure: the peer has
    /// not lent more buffers or credited more descriptors yet), to be sent
    /// again or freed by the caller. An mbuf longer than the peer's buffers
    /// is dropped and counted as sent.
    pub fn tx_burst(&mut self, mbufs: &mut Vec<Mbuf>) -> usize {
        if mbufs.is_empty() || !self.sync() || self.broken {
            return 0;
        }
        // Every burst, so that the buffers lent last (the ones the peer
        // freed last) are on top of the stack: see `peer_free`.
        self.take_lends();
        if self.link.win().is_none() {
            return 0;
        }
        // Reads the peer's credit only when short of descriptor slots (each
        // carries PER_SLOT descriptors).
        let want = (mbufs.len() as u64).div_ceil(PER_SLOT as u64);
        let (_, sane) = self.prod.room(&self.link.local, want);
        if !sane {
            self.stats.bad_credit += 1;
        }
        let slots = self.prod.free(&self.link.local).0 as usize;
        let n = mbufs.len().min(slots * PER_SLOT).min(self.peer_free.len());
        let (mut sent, errors) = (0, self.stats.device_errors);
        while sent < n {
            let end = (sent + RUN).min(n);
            let done = self.send_run(&mbufs[sent..end]);
            sent += done;
            if sent < end {
                break;
            }
        }
        // Back-pressure only: a run cut short by a device error counted
        // that instead.
        if sent < mbufs.len() && self.stats.device_errors == errors {
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

    /// Sends `run` (at most [`RUN`] mbufs, with a lent buffer each and a
    /// free slot for every [`PER_SLOT`]): copies every payload into its
    /// buffer, then writes the descriptor slots last-first and produces them
    /// together, so that the receiver, polling the run's first slot, finds
    /// the whole run written instead of taking each line while the next is
    /// being written (as the queue pair's send batches do). Returns how many
    /// mbufs of the front of `run` were handled (sent, or dropped as
    /// oversize): fewer than all on a device error, after which the window
    /// is going away.
    fn send_run(&mut self, run: &[Mbuf]) -> usize {
        let Some(win) = self.link.win() else {
            return 0;
        };
        let buf_size = self.buf_size as usize;
        // The peer's buffers for this queue and our descriptor ring there,
        // each checked once for the run.
        let (Ok(bufs), Ok(ring)) = (
            win.span(self.bufs_out, self.nb_desc as usize * buf_size),
            self.prod.span(win),
        ) else {
            self.stats.device_errors += 1;
            return 0;
        };
        // Filled up to `k` before any is read (no zeroing of the whole run).
        let mut descs = [MaybeUninit::<Desc>::uninit(); RUN];
        let (mut k, mut handled, mut oversize, mut bytes) = (0, 0, 0, 0u64);
        for m in run {
            if m.len() > buf_size {
                oversize += 1;
                handled += 1;
                continue;
            }
            let b = self.peer_free.pop().expect("a lent buffer per mbuf");
            self.peer_have[b as usize] = false;
            let (src, len) = m.data_ptr();
            // SAFETY: `src` points at the mbuf's `len` data bytes, which the
            // mbuf owns and keeps mapped for this call.
            if unsafe { bufs.write_from_ptr(b as usize * buf_size, src, len) }.is_err() {
                give_back(&mut self.peer_free, &mut self.peer_have, b);
                self.stats.device_errors += 1;
                break;
            }
            descs[k].write((b, len as u32, m.user()));
            k += 1;
            handled += 1;
            bytes += len as u64;
        }
        // SAFETY: the first `k` were written above (`k <= RUN`);
        // `MaybeUninit<Desc>` has `Desc`'s layout.
        let descs: &[Desc] = unsafe { std::slice::from_raw_parts(descs.as_ptr().cast(), k) };
        let slots = k.div_ceil(PER_SLOT);
        for j in (0..slots).rev() {
            let group = &descs[j * PER_SLOT..k.min((j + 1) * PER_SLOT)];
            if self
                .prod
                .write_ahead(&ring, j as u64, &descriptor_slot(group))
                .is_err()
            {
                // Nothing of the run is produced: its buffers are still ours.
                for &(b, _, _) in descs {
                    give_back(&mut self.peer_free, &mut self.peer_have, b);
                }
                self.stats.device_errors += 1;
                // Slots already written ahead carry valid tags past the
                // first one: a shorter run later would leave them for the
                // receiver to take. Send nothing more on this connection
                // (a device error means it is going away); the next one
                // starts over under a new epoch, which makes them stale.
                self.broken = j + 1 < slots;
                return 0;
            }
        }
        self.prod.produce(&ring, slots as u64);
        self.stats.tx += k as u64;
        self.stats.tx_bytes += bytes;
        self.stats.tx_oversize += oversize;
        handled
    }

    /// Follows the connection; on a change, starts over. Returns whether it
    /// is up.
    #[inline]
    fn sync(&mut self) -> bool {
        if let Seen::Restarted(epoch) = self.link.check() {
            self.start_over(epoch);
        }
        self.link.is_up()
    }

    /// A new connection (or none): the old peer's lends are forgotten,
    /// descriptors are written from sequence 0 under `epoch`.
    #[cold]
    fn start_over(&mut self, epoch: u32) {
        self.peer_free.clear();
        self.peer_have.fill(false);
        self.prod = Producer::new(
            self.prod.base(),
            self.nb_desc,
            epoch,
            self.prod.credit_offset(),
        );
        self.fq_in_seq = 0;
        self.broken = false;
        if epoch != 0 {
            self.stats.resets += 1;
        }
    }

    /// Takes the buffers the peer lent us from the FreeQ in our window (at
    /// most one lap of it per call, so a peer rewriting entries cannot keep
    /// us here).
    fn take_lends(&mut self) {
        let epoch = self.link.epoch();
        let mask = u64::from(self.nb_desc) - 1;
        for _ in 0..self.nb_desc {
            let at = self.fq_in + ((self.fq_in_seq & mask) as usize) * 8;
            let Ok(raw) = self.link.local.load_u64(at) else {
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
}

/// Puts buffer `b`, still lent to us, back on the stack `free` (`have`:
/// whether each buffer is on it).
fn give_back(free: &mut Vec<u32>, have: &mut [bool], b: u32) {
    free.push(b);
    have[b as usize] = true;
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxQueue")
            .field("peer", &self.link.peer)
            .field("queue", &self.link.queue)
            .field("up", &self.link.is_up())
            .field("lent to us", &self.peer_free.len())
            .field("stats", &self.stats)
            .finish()
    }
}
