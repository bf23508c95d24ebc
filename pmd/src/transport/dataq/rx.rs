//! The receive half of a data queue: lends our receive buffers to the peer
//! and hands out the ones it filled, in place.

use std::sync::Arc;

use ntbdk_mempool::{ObjIdx, Pool, PoolOptions};

use crate::hw::Port;
use crate::mbuf::{Adding, Mbuf, PoolRef};

use super::super::error::{Result, TransportError};
use super::super::geometry::{DataPart, Layout};
use super::super::queue::{Consumer, free_entry};
use super::link::{Link, Seen};
use super::{DataQueueStats, Desc, PER_SLOT, parse_descriptor_slot};

/// Most buffers lent back to the peer in one go.
const LEND_BATCH: usize = 64;

/// The receive half of a data queue (see [`DataQueue`](super::DataQueue)):
/// `Send`, for one thread at a time.
pub struct RxQueue {
    link: Link,
    nb_desc: u32,
    buf_size: u32,
    /// The peer's descriptors for us, in our window.
    cons: Consumer,
    /// Offset of our receive buffers' FreeQ in the peer's window.
    fq_out: usize,
    fq_out_seq: u64,
    /// Offset of our credit word in the peer's window.
    credit_out: usize,
    /// Our receive buffers: the pool over them and, per buffer, whether it
    /// is lent to the peer now.
    pool: PoolRef,
    lent: Vec<bool>,
    lent_now: u32,
    /// The descriptors of the slot last taken, `held[held_at..held_len]`
    /// not yet delivered (a burst that ended inside a slot).
    held: [Desc; PER_SLOT],
    held_len: usize,
    held_at: usize,
    stats: DataQueueStats,
}

impl RxQueue {
    pub(super) fn new(layout: &Layout, me: Port, link: Link) -> Result<RxQueue> {
        let (peer, queue) = (link.peer, link.queue);
        let d = layout.geometry().data;
        let n = d.nb_desc as usize;
        let bytes = n * d.buf_size as usize;
        let ptr = link
            .local
            .ptr_at(layout.data_part(peer, queue, DataPart::Bufs), bytes)?;
        let opts = PoolOptions {
            cache_size: 0,
            track_state: true,
            ..PoolOptions::new(d.buf_size as usize, d.nb_desc)
        };
        let objects = std::ptr::NonNull::new(ptr).expect("a window pointer is not null");
        let name = format!("ntbdk-rxq-{me}-{peer}-{queue}");
        let keep = Arc::new((link.local.clone(), link.claim.clone()));
        // SAFETY: the buffers lie in our window (checked by `ptr_at`), which
        // the `LocalWindow` clone passed in `keep` keeps mapped; only this
        // queue hands them out: it is taken once per peer and queue of this
        // transport, and no other transport of this process can run on the
        // window while `keep` holds the transport's claim (`claim.rs`).
        // SAFETY: holds for the reasons given just above.
        let pool = unsafe { Pool::create_over(&name, &opts, objects, bytes, keep) }
            .map_err(|e| TransportError::DataQueuePool(e.to_string()))?;
        let pool = PoolRef::new(pool);
        Ok(RxQueue {
            nb_desc: d.nb_desc,
            buf_size: d.buf_size,
            cons: Consumer::new(layout.data_part(peer, queue, DataPart::Desc), d.nb_desc, 0),
            fq_out: layout.data_part(me, queue, DataPart::FreeQ),
            fq_out_seq: 0,
            credit_out: layout.data_part(me, queue, DataPart::Credit),
            pool,
            lent: vec![false; n],
            lent_now: 0,
            held: [(0, 0, 0); PER_SLOT],
            held_len: 0,
            held_at: 0,
            link,
            stats: DataQueueStats::default(),
        })
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

    /// The receive counters (`rx`, `rx_bytes`, `bad_desc`, `lent`,
    /// `resets`, `device_errors`).
    pub fn stats(&self) -> DataQueueStats {
        self.link.counted(self.stats)
    }

    /// Receive buffers in all (`nb_desc`).
    pub fn pool_size(&self) -> usize {
        self.pool.pool().size()
    }

    /// Receive buffers free in the pool: neither lent to the peer nor held
    /// by the application as received mbufs.
    pub fn pool_available(&self) -> usize {
        self.pool.pool().available()
    }

    /// Receive buffers lent to the peer now.
    pub fn lent(&self) -> usize {
        self.lent_now as usize
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
        let (mut n, mut bytes) = (0, 0u64);
        // References for the mbufs this burst may make, added in one go once
        // a descriptor is there (an empty poll adds none).
        let mut adding = None;
        // At most one lap of slots per call, so a peer rewriting slots ahead
        // of us cannot keep us here.
        let mut slots = 0;
        while n < max {
            let desc = if self.held_at < self.held_len {
                self.held_at += 1;
                self.held[self.held_at - 1]
            } else {
                if slots == self.nb_desc {
                    break;
                }
                let Some(body) = self.cons.peek_stable(&self.link.local) else {
                    break;
                };
                self.cons.advance();
                slots += 1;
                let (count, descs) = parse_descriptor_slot(&body);
                if !(1..=PER_SLOT as u64).contains(&count) {
                    self.stats.bad_desc += 1;
                    continue;
                }
                // The rest of the slot waits for this burst's next rounds,
                // or the next burst.
                self.held = descs;
                self.held_len = count as usize;
                self.held_at = 1;
                descs[0]
            };
            let adding = adding.get_or_insert_with(|| {
                Adding::reserve(&self.pool, max.min(self.lent_now as usize))
            });
            if let Some(len) = self.deliver(desc, adding, out) {
                n += 1;
                bytes += u64::from(len);
            }
        }
        self.stats.rx += n as u64;
        self.stats.rx_bytes += bytes;
        if self.cons.uncredited() >= u64::from(self.nb_desc / 4).max(1)
            && let Some(win) = self.link.win()
            && self.cons.credit(win, self.credit_out).is_err()
        {
            self.stats.device_errors += 1;
        }
        n
    }

    /// Checks descriptor `(b, len, user)` (a buffer we lent the peer, a
    /// length that fits) and appends that buffer to `out` as an mbuf; a bad
    /// one is counted and skipped. Returns the length of the mbuf appended,
    /// if one was (the caller counts them).
    #[inline(always)]
    fn deliver(
        &mut self,
        (b, len, user): Desc,
        adding: &mut Adding,
        out: &mut Vec<Mbuf>,
    ) -> Option<u32> {
        if b >= self.nb_desc || !self.lent[b as usize] || len > self.buf_size {
            self.stats.bad_desc += 1;
            return None;
        }
        self.lent[b as usize] = false;
        self.lent_now -= 1;
        let h = self
            .pool
            .pool()
            .handle(b)
            .expect("b < nb_desc, the pool's size");
        let origin = (self.link.peer, self.link.queue);
        // SAFETY: buffer `b` was lent (taken from the pool as a raw handle
        // when lent) and is now the peer's no longer: the mbuf becomes its
        // only owner; `adding` is this pool's.
        let m = unsafe { Mbuf::from_pool(&self.pool, adding, h, len, origin) };
        push_in_place(out, m).set_user(user);
        Some(len)
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

    /// A new connection (or none): buffers lent to the old one's peer come
    /// back to the pool, descriptors are read from sequence 0 under `epoch`.
    #[cold]
    fn start_over(&mut self, epoch: u32) {
        let lent: Vec<ObjIdx> = (0..self.nb_desc)
            .filter(|&b| self.lent[b as usize])
            .filter_map(|b| self.pool.pool().handle(b).ok())
            .collect();
        // The peer of the old connection no longer holds them.
        let _ = self.pool.pool().put_bulk_checked(&lent);
        self.lent.fill(false);
        self.lent_now = 0;
        // They named buffers of the old connection.
        self.held_len = 0;
        self.held_at = 0;
        self.cons = Consumer::new(self.cons.base(), self.nb_desc, epoch);
        self.fq_out_seq = 0;
        if epoch != 0 {
            self.stats.resets += 1;
        }
    }

    /// Lends free receive buffers to the peer, in batches.
    fn lend(&mut self) {
        let Some(win) = self.link.win() else {
            return;
        };
        let room = self.nb_desc - self.lent_now;
        // The pool has no thread caches: every free buffer is in its ring.
        let avail = self.pool.pool().available_in_ring().min(room as usize);
        if avail == 0 || (avail < LEND_BATCH.min(self.nb_desc as usize / 4) && self.lent_now > 0) {
            return;
        }
        // The peer's FreeQ for this queue, checked once for the batch.
        let Ok(fq) = win.span(self.fq_out, self.nb_desc as usize * 8) else {
            self.stats.device_errors += 1;
            return;
        };
        let mut hs = [ObjIdx::default(); LEND_BATCH];
        let mut left = avail;
        let epoch = self.link.epoch();
        let mask = u64::from(self.nb_desc) - 1;
        while left > 0 {
            let k = left.min(LEND_BATCH);
            if self.pool.pool().get_bulk(&mut hs[..k]).is_err() {
                break; // only this queue takes from the pool: cannot happen
            }
            for h in &hs[..k] {
                let b = h.index();
                let at = ((self.fq_out_seq & mask) as usize) * 8;
                let entry = free_entry(epoch, self.fq_out_seq, b);
                if fq.write_u64(at, entry).is_err() {
                    self.stats.device_errors += 1;
                    // Not lent after all.
                    let _ = self.pool.pool().put_checked(*h);
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
}

/// `out.push(m)`, with `m` written straight into the vector's buffer: an
/// mbuf built on the stack and then copied in is read back wider than its
/// fields were written, which stalls store forwarding for every mbuf (47 →
/// 59 ns per message, both sides on one core, `bench dataplane --one-core`).
/// Returns the mbuf in place.
#[inline(always)]
fn push_in_place(out: &mut Vec<Mbuf>, m: Mbuf) -> &mut Mbuf {
    out.reserve(1);
    let at = out.len();
    let slot = &mut out.spare_capacity_mut()[0];
    let ptr: *mut Mbuf = slot.write(m);
    // SAFETY: slot `at` (the first spare one, which `reserve` made) was just
    // initialised.
    unsafe { out.set_len(at + 1) };
    // SAFETY: `ptr` points at element `at` of `out`, initialised, and stays
    // valid while `out` is borrowed mutably by the returned reference.
    unsafe { &mut *ptr }
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueue")
            .field("peer", &self.link.peer)
            .field("queue", &self.link.queue)
            .field("up", &self.link.is_up())
            .field("lent", &self.lent_now)
            .field("stats", &self.stats)
            .finish()
    }
}
