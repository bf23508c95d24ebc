//! Per-device traffic counters: posted writes, posted bytes, non-posted reads.
//!
//! The transport promises to use posted writes only; these counters are how a
//! test (or `ntb-tool status`) proves it.
//!
//! # Cost
//! A posted write is a few nanoseconds; counting it with an atomic
//! read-modify-write would cost more than the write and, being a full barrier
//! on x86, would stall every store behind it until the peer's cache line
//! arrives. So each [`PeerWindow`](super::PeerWindow) handle counts into its
//! own [`HandleCounters`] block with plain (relaxed load + store) updates:
//! a handle is used by one thread at a time (it is `Send`, not `Sync`), so
//! no update is lost. A snapshot sums the live blocks and what dropped
//! handles left behind. Device-level writes (doorbells, scratchpads) and
//! every non-posted read are counted atomically, at once.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_utils::CachePadded;

/// Live counters of one device, shared by all its window handles.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    posted_writes: CachePadded<AtomicU64>,
    posted_bytes: AtomicU64,
    non_posted_reads: CachePadded<AtomicU64>,
    non_posted_bytes: AtomicU64,
    rlut_refusals: AtomicU64,
    ungranted_writes: AtomicU64,
    /// The blocks of live window handles.
    handles: Mutex<Vec<Arc<HandleCounters>>>,
}

/// A point-in-time copy of [`DeviceCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Posted write transactions (copies and stores into peer windows,
    /// doorbell rings and peer scratchpad writes).
    pub posted_writes: u64,
    /// Bytes carried by posted writes.
    pub posted_bytes: u64,
    /// Non-posted reads issued (reads through the bridge).
    pub non_posted_reads: u64,
    /// Bytes carried by non-posted reads.
    pub non_posted_bytes: u64,
    /// Non-posted reads refused because the R-LUT was full.
    pub rlut_refusals: u64,
    /// Posted writes refused because they fell outside what the peer
    /// granted us (see [`PeerGrant`](super::PeerGrant)); nothing was written.
    pub ungranted_writes: u64,
}

/// The posted-write counts of one window handle: written by that handle's
/// thread only, read by anyone taking a snapshot.
#[derive(Debug, Default)]
pub struct HandleCounters {
    writes: CachePadded<AtomicU64>,
    bytes: AtomicU64,
}

impl HandleCounters {
    /// Counts one posted write of `bytes` bytes. Only the owning handle
    /// calls this, from one thread at a time, so a relaxed load and store
    /// (plain moves, no barrier) never lose an update.
    #[inline]
    pub(crate) fn posted(&self, bytes: usize) {
        self.posted_writes(1, bytes);
    }

    /// Counts `writes` posted writes carrying `bytes` bytes in all, as
    /// [`posted`](Self::posted) does one.
    #[inline]
    pub(crate) fn posted_writes(&self, writes: u64, bytes: usize) {
        self.writes
            .store(self.writes.load(Relaxed).wrapping_add(writes), Relaxed);
        self.bytes
            .store(self.bytes.load(Relaxed).wrapping_add(bytes as u64), Relaxed);
    }
}

impl DeviceCounters {
    /// Counts one posted write of `bytes` bytes made by the device itself
    /// (a doorbell or scratchpad write), atomically.
    #[inline]
    pub fn posted(&self, bytes: usize) {
        self.posted_writes.fetch_add(1, Relaxed);
        self.posted_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts one non-posted read of `bytes` bytes.
    #[inline]
    pub fn non_posted(&self, bytes: usize) {
        self.non_posted_reads.fetch_add(1, Relaxed);
        self.non_posted_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts a posted write refused for falling outside a peer's grant.
    pub fn ungranted(&self) {
        self.ungranted_writes.fetch_add(1, Relaxed);
    }

    /// Counts one non-posted read refused for want of an R-LUT entry.
    #[inline]
    pub fn rlut_refused(&self) {
        self.rlut_refusals.fetch_add(1, Relaxed);
    }

    /// A fresh block for a new window handle, included in snapshots until
    /// [`retire`](Self::retire)d.
    pub(crate) fn register(&self) -> Arc<HandleCounters> {
        let h = Arc::new(HandleCounters::default());
        self.lock().push(h.clone());
        h
    }

    /// Folds a dropped handle's block into the device totals.
    pub(crate) fn retire(&self, h: &Arc<HandleCounters>) {
        let mut handles = self.lock();
        if let Some(i) = handles.iter().position(|x| Arc::ptr_eq(x, h)) {
            handles.swap_remove(i);
            self.posted_writes
                .fetch_add(h.writes.load(Relaxed), Relaxed);
            self.posted_bytes.fetch_add(h.bytes.load(Relaxed), Relaxed);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<HandleCounters>>> {
        // The list stays consistent whatever a panicking holder did (every
        // change is a single push or swap_remove).
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads all counters. Counts of writes still in progress on other
    /// threads may be missing; nothing counted is ever lost.
    pub fn snapshot(&self) -> CounterSnapshot {
        let handles = self.lock();
        let (mut writes, mut bytes) = (
            self.posted_writes.load(Relaxed),
            self.posted_bytes.load(Relaxed),
        );
        for h in handles.iter() {
            writes += h.writes.load(Relaxed);
            bytes += h.bytes.load(Relaxed);
        }
        CounterSnapshot {
            posted_writes: writes,
            posted_bytes: bytes,
            non_posted_reads: self.non_posted_reads.load(Relaxed),
            non_posted_bytes: self.non_posted_bytes.load(Relaxed),
            rlut_refusals: self.rlut_refusals.load(Relaxed),
            ungranted_writes: self.ungranted_writes.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_counts_survive_their_handle() {
        let d = DeviceCounters::default();
        let a = d.register();
        let b = d.register();
        a.posted(8);
        a.posted(56);
        b.posted(4);
        d.posted(1);
        let s = d.snapshot();
        assert_eq!((s.posted_writes, s.posted_bytes), (4, 69));
        d.retire(&a);
        d.retire(&a); // twice is harmless
        assert_eq!(d.snapshot(), s);
        d.retire(&b);
        assert_eq!(d.snapshot(), s);
        assert!(d.lock().is_empty());
    }

    #[test]
    fn every_window_clone_counts_and_a_dropped_one_is_kept() {
        use crate::hw::PeerWindow;
        let mem: Arc<Vec<std::sync::atomic::AtomicU64>> =
            Arc::new((0..64).map(|_| Default::default()).collect());
        let d = Arc::new(DeviceCounters::default());
        // SAFETY: `mem` is 512 bytes, 8-aligned, interior-mutable and
        // outlives the handles (it is their keepalive); only they access it.
        let w = unsafe {
            PeerWindow::from_raw(mem.as_ptr() as *mut u8, 512, 1, d.clone(), mem.clone())
        };
        let w2 = w.clone();
        w.write(0, &[1; 10]).unwrap();
        w2.write_u64(16, 5).unwrap();
        std::thread::spawn(move || w2.write_u32(24, 7).unwrap())
            .join()
            .unwrap();
        w.write_nt(64, &[2; 100]).unwrap();
        let s = d.snapshot();
        assert_eq!((s.posted_writes, s.posted_bytes), (4, 122));
        assert_eq!(s.non_posted_reads, 0);
        drop(w);
        assert_eq!(d.snapshot(), s);
        assert!(d.lock().is_empty());
    }

    #[test]
    fn concurrent_handles_lose_nothing() {
        let d = Arc::new(DeviceCounters::default());
        std::thread::scope(|s| {
            for _ in 0..4 {
                let d = d.clone();
                s.spawn(move || {
                    let h = d.register();
                    for _ in 0..10_000 {
                        h.posted(3);
                    }
                    d.retire(&h);
                });
            }
            for _ in 0..100 {
                let snap = d.snapshot();
                assert!(snap.posted_writes <= 40_000);
                assert!(snap.posted_bytes <= 120_000);
            }
        });
        let s = d.snapshot();
        assert_eq!((s.posted_writes, s.posted_bytes), (40_000, 120_000));
    }
}
