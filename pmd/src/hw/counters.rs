//! Per-device traffic counters: posted writes, posted bytes, non-posted reads.
//!
//! The transport promises to use posted writes only; these counters are how a
//! test (or `ntb-tool status`) proves it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

/// Live counters of one device, shared by all its window handles.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    posted_writes: CachePadded<AtomicU64>,
    posted_bytes: AtomicU64,
    non_posted_reads: CachePadded<AtomicU64>,
    non_posted_bytes: AtomicU64,
    rlut_refusals: AtomicU64,
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
}

impl DeviceCounters {
    /// Counts one posted write of `bytes` bytes.
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

    /// Counts one non-posted read refused for want of an R-LUT entry.
    #[inline]
    pub fn rlut_refused(&self) {
        self.rlut_refusals.fetch_add(1, Relaxed);
    }

    /// Reads all counters.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            posted_writes: self.posted_writes.load(Relaxed),
            posted_bytes: self.posted_bytes.load(Relaxed),
            non_posted_reads: self.non_posted_reads.load(Relaxed),
            non_posted_bytes: self.non_posted_bytes.load(Relaxed),
            rlut_refusals: self.rlut_refusals.load(Relaxed),
        }
    }
}
