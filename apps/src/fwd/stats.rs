//! Per-queue counters of `ntb-fwd`, written by the lcores and printed by
//! the main thread, as DPDK `ntb_fwd` prints them: packets and bytes each
//! way, drops and errors per queue, a total, and rates.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Live counters of one queue: each field has one writer (the lcore that
/// moves that direction), any thread reads them.
#[derive(Debug, Default)]
pub struct QueueCounters {
    rx: AtomicU64,
    rx_bytes: AtomicU64,
    tx: AtomicU64,
    tx_bytes: AtomicU64,
    drops: AtomicU64,
    errors: AtomicU64,
}

impl QueueCounters {
    /// Counts `n` packets of `bytes` received.
    #[inline]
    pub fn received(&self, n: u64, bytes: u64) {
        self.rx.fetch_add(n, Relaxed);
        self.rx_bytes.fetch_add(bytes, Relaxed);
    }

    /// Counts `n` packets of `bytes` sent.
    #[inline]
    pub fn sent(&self, n: u64, bytes: u64) {
        self.tx.fetch_add(n, Relaxed);
        self.tx_bytes.fetch_add(bytes, Relaxed);
    }

    /// Counts `n` packets freed without being sent.
    #[inline]
    pub fn dropped(&self, n: u64) {
        self.drops.fetch_add(n, Relaxed);
    }

    /// Counts `n` packets that failed a check (`--verify`, file-trans).
    #[inline]
    pub fn failed(&self, n: u64) {
        self.errors.fetch_add(n, Relaxed);
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> QueueStats {
        QueueStats {
            rx: self.rx.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx: self.tx.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            drops: self.drops.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }
}

/// The counters of one queue (or their total) at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Packets received.
    pub rx: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent.
    pub tx: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets freed unsent (left over at the end, or too long for the
    /// peer's buffers).
    pub drops: u64,
    /// Packets that failed a check.
    pub errors: u64,
}

impl QueueStats {
    fn add(mut self, o: &QueueStats) -> QueueStats {
        self.rx += o.rx;
        self.rx_bytes += o.rx_bytes;
        self.tx += o.tx;
        self.tx_bytes += o.tx_bytes;
        self.drops += o.drops;
        self.errors += o.errors;
        self
    }

    fn since(&self, o: &QueueStats) -> QueueStats {
        QueueStats {
            rx: self.rx - o.rx,
            rx_bytes: self.rx_bytes - o.rx_bytes,
            tx: self.tx - o.tx,
            tx_bytes: self.tx_bytes - o.tx_bytes,
            drops: self.drops - o.drops,
            errors: self.errors - o.errors,
        }
    }

    /// One line: counts, then rates over `secs` of `delta`.
    fn line(&self, label: &str, delta: &QueueStats, secs: f64) -> String {
        let secs = secs.max(1e-9);
        format!(
            "  {label:<8} RX-packets: {:<12} RX-bytes: {:<14} RX-errors: {:<6} \
             TX-packets: {:<12} TX-bytes: {:<14} TX-drops: {:<6} \
             | RX {:.3} Mpps {:.3} Gbit/s, TX {:.3} Mpps {:.3} Gbit/s",
            self.rx,
            self.rx_bytes,
            self.errors,
            self.tx,
            self.tx_bytes,
            self.drops,
            delta.rx as f64 / secs / 1e6,
            delta.rx_bytes as f64 * 8.0 / secs / 1e9,
            delta.tx as f64 / secs / 1e6,
            delta.tx_bytes as f64 * 8.0 / secs / 1e9,
        )
    }
}

/// Prints the queues' counters: every period with the rates since the
/// last print, and at the end with the rates over the whole run.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use ntbdk_apps::fwd::{QueueCounters, StatsPrinter};
/// let q = Arc::new(QueueCounters::default());
/// let mut p = StatsPrinter::new(vec![q.clone()], Instant::now());
/// q.sent(2, 128);
/// let text = p.summary(Instant::now());
/// assert!(text.contains("queue 0"), "{text}");
/// assert!(text.contains("TX-packets: 2 "), "{text}");
/// assert!(p.total().tx_bytes == 128);
/// ```
#[derive(Debug)]
pub struct StatsPrinter {
    queues: Vec<std::sync::Arc<QueueCounters>>,
    last: Vec<QueueStats>,
    last_at: Instant,
    started: Instant,
}

impl StatsPrinter {
    /// A printer of `queues` (by index), starting at `now`.
    pub fn new(queues: Vec<std::sync::Arc<QueueCounters>>, now: Instant) -> Self {
        let last = vec![QueueStats::default(); queues.len()];
        StatsPrinter {
            queues,
            last,
            last_at: now,
            started: now,
        }
    }

    /// The counters of every queue now.
    pub fn snapshot(&self) -> Vec<QueueStats> {
        self.queues.iter().map(|q| q.snapshot()).collect()
    }

    /// The sum over the queues now.
    pub fn total(&self) -> QueueStats {
        self.snapshot()
            .iter()
            .fold(QueueStats::default(), |a, q| a.add(q))
    }

    fn block(&self, title: &str, now: &[QueueStats], base: &[QueueStats], secs: f64) -> String {
        let mut out = format!("######## {title} ########\n");
        let mut total = QueueStats::default();
        let mut total_delta = QueueStats::default();
        for (i, (q, b)) in now.iter().zip(base).enumerate() {
            let d = q.since(b);
            let _ = writeln!(out, "{}", q.line(&format!("queue {i}"), &d, secs));
            total = total.add(q);
            total_delta = total_delta.add(&d);
        }
        let _ = writeln!(out, "{}", total.line("total", &total_delta, secs));
        out
    }

    /// The periodic report: counts, and rates since the last one.
    pub fn report(&mut self, now: Instant) -> String {
        let snap = self.snapshot();
        let secs = now.duration_since(self.last_at).as_secs_f64();
        let at = now.duration_since(self.started).as_secs_f64();
        let out = self.block(
            &format!("ntb-fwd statistics at {at:.1} s"),
            &snap,
            &self.last,
            secs,
        );
        self.last = snap;
        self.last_at = now;
        out
    }

    /// The summary at exit: counts, and rates over the whole run.
    pub fn summary(&self, now: Instant) -> String {
        let snap = self.snapshot();
        let secs = now.duration_since(self.started).as_secs_f64();
        let zero = vec![QueueStats::default(); snap.len()];
        self.block(
            &format!("ntb-fwd summary over {secs:.3} s"),
            &snap,
            &zero,
            secs,
        )
    }
}
