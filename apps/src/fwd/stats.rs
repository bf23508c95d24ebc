//! Per-queue statistics of `ntb-fwd`, printed every period and at exit.

use std::fmt::Write;
use std::time::Instant;

use ntbdk_pmd::hw::Port;

/// Counts of one queue pair (one peer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages received.
    pub rx: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Messages sent.
    pub tx: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Messages forwarded (iofwd).
    pub forwarded: u64,
    /// Bursts refused for want of room at the peer (retried).
    pub busy: u64,
}

impl QueueStats {
    /// Counts a message sent.
    pub fn sent(&mut self, bytes: u64) {
        self.tx += 1;
        self.tx_bytes += bytes;
    }

    /// Counts a message received.
    pub fn received(&mut self, bytes: u64) {
        self.rx += 1;
        self.rx_bytes += bytes;
    }
}

/// The statistics of every queue, and what was last printed (for rates).
///
/// ```
/// use std::time::Instant;
/// use ntbdk_apps::fwd::Stats;
/// let mut s = Stats::new(Instant::now());
/// s.queue(1).sent(64);
/// assert!(s.report(Instant::now()).contains("port 1"));
/// ```
#[derive(Debug, Clone)]
pub struct Stats {
    queues: Vec<(Port, QueueStats)>,
    last: Vec<(Port, QueueStats)>,
    last_at: Instant,
    started: Instant,
}

impl Stats {
    /// Empty statistics, starting at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            queues: Vec::new(),
            last: Vec::new(),
            last_at: now,
            started: now,
        }
    }

    /// The counts of the queue to `peer` (created on first use).
    pub fn queue(&mut self, peer: Port) -> &mut QueueStats {
        let i = match self.queues.iter().position(|(p, _)| *p == peer) {
            Some(i) => i,
            None => {
                self.queues.push((peer, QueueStats::default()));
                self.queues.sort_by_key(|(p, _)| *p);
                self.queues
                    .iter()
                    .position(|(p, _)| *p == peer)
                    .expect("just added")
            }
        };
        &mut self.queues[i].1
    }

    /// The counts of every queue, by peer.
    pub fn queues(&self) -> &[(Port, QueueStats)] {
        &self.queues
    }

    /// One line per queue: totals and rates since the last report.
    pub fn report(&mut self, now: Instant) -> String {
        let secs = now.duration_since(self.last_at).as_secs_f64().max(1e-9);
        let mut out = String::new();
        for (p, q) in &self.queues {
            let prev = self
                .last
                .iter()
                .find(|(lp, _)| lp == p)
                .map(|(_, s)| *s)
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  port {p}: rx {} msgs {} B ({:.3} Mmsg/s, {:.3} GB/s) | tx {} msgs {} B \
                 ({:.3} Mmsg/s, {:.3} GB/s) | fwd {} | busy {}",
                q.rx,
                q.rx_bytes,
                (q.rx - prev.rx) as f64 / secs / 1e6,
                (q.rx_bytes - prev.rx_bytes) as f64 / secs / 1e9,
                q.tx,
                q.tx_bytes,
                (q.tx - prev.tx) as f64 / secs / 1e6,
                (q.tx_bytes - prev.tx_bytes) as f64 / secs / 1e9,
                q.forwarded,
                q.busy
            );
        }
        if out.is_empty() {
            out.push_str("  (no traffic yet)\n");
        }
        self.last = self.queues.clone();
        self.last_at = now;
        format!(
            "ntb-fwd stats at {:.1} s:\n{out}",
            now.duration_since(self.started).as_secs_f64()
        )
    }
}
