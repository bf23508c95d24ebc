//! The figures of one measurement: a bandwidth row and a latency row.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Bandwidth of one message size: how many messages of `bytes` moved in how
/// long, and the rates that follow.
///
/// Bandwidth is in decimal gigabytes (10⁹ bytes) per second, the message rate
/// in millions of messages per second; the tables convert to perftest's
/// units ([`BwUnit`](super::BwUnit)). The peak is the best rate over any
/// stretch of the run (0 when not measured, as perftest prints it).
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::BwRow;
///
/// let row = BwRow::new(65536, 10_000, Duration::from_millis(100));
/// assert!((row.gb_per_s - 6.5536).abs() < 1e-9);
/// assert!((row.mpps - 0.1).abs() < 1e-9);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BwRow {
    /// Message size in bytes.
    pub bytes: u64,
    /// Messages moved.
    pub iterations: u64,
    /// Wall-clock time they took, in seconds.
    pub seconds: f64,
    /// Average bandwidth, GB/s (10⁹ bytes per second).
    pub gb_per_s: f64,
    /// Peak bandwidth, GB/s: the best rate over any stretch of the run (0
    /// when not measured).
    #[serde(default)]
    pub peak_gb_per_s: f64,
    /// Message rate, millions of messages per second.
    pub mpps: f64,
}

impl BwRow {
    /// Two directions of one concurrent run as one row, as perftest's `-b`
    /// reports it: messages, bandwidths and rates summed, the longer time.
    pub fn plus(&self, other: &BwRow) -> BwRow {
        BwRow {
            bytes: self.bytes,
            iterations: self.iterations + other.iterations,
            seconds: self.seconds.max(other.seconds),
            gb_per_s: self.gb_per_s + other.gb_per_s,
            peak_gb_per_s: self.peak_gb_per_s + other.peak_gb_per_s,
            mpps: self.mpps + other.mpps,
        }
    }

    /// The row for `iterations` messages of `bytes` that took `elapsed`.
    pub fn new(bytes: u64, iterations: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        let (gb_per_s, mpps) = if seconds > 0.0 {
            (
                bytes as f64 * iterations as f64 / seconds / 1e9,
                iterations as f64 / seconds / 1e6,
            )
        } else {
            (0.0, 0.0)
        };
        Self {
            bytes,
            iterations,
            seconds,
            gb_per_s,
            peak_gb_per_s: 0.0,
            mpps,
        }
    }

    /// The same row with a peak bandwidth (GB/s).
    pub fn with_peak(mut self, peak_gb_per_s: f64) -> Self {
        // Never below the average: some stretch of the run was at least
        // as fast as the whole (a peak measured over whole windows can miss
        // it, and one passed on rounded can fall just under).
        self.peak_gb_per_s = peak_gb_per_s.max(self.gb_per_s);
        self
    }
}

/// One point of a latency distribution: the latency at or below which a
/// `quantile` of the samples fall.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    /// The fraction of samples, in `0.0..=1.0`.
    pub quantile: f64,
    /// The latency at that quantile, in microseconds.
    pub usec: f64,
}

/// Latency of one message size, summarised from an HDR histogram of
/// nanoseconds the way `ib_write_lat` reports it (times in microseconds;
/// `t_typical` is the median).
///
/// ```
/// use ntbdk_apps::report::{LatRow, new_histogram};
///
/// let mut hist = new_histogram();
/// for ns in 1..=1000 {
///     hist.record(ns).unwrap();
/// }
/// let row = LatRow::from_histogram(64, &hist);
/// assert_eq!(row.iterations, 1000);
/// assert_eq!(row.t_typical_us, 0.5);
/// assert_eq!(row.p99_us, 0.99);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatRow {
    /// Message size in bytes.
    pub bytes: u64,
    /// Samples recorded.
    pub iterations: u64,
    /// Smallest sample, µs.
    pub t_min_us: f64,
    /// Median sample, µs.
    pub t_typical_us: f64,
    /// Mean, µs.
    pub t_avg_us: f64,
    /// Standard deviation, µs.
    pub t_stdev_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p99_9_us: f64,
    /// Largest sample, µs.
    pub t_max_us: f64,
    /// The whole distribution (HdrHistogram's percentile steps, denser
    /// towards the tail), for plots and later analysis.
    pub distribution: Vec<Percentile>,
    /// Whether Ctrl-C cut this size short: `iterations` is what was
    /// measured, fewer than asked for. Written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// Steps per halving of the remaining tail in [`LatRow::distribution`]
/// (HdrHistogram's usual percentile output uses 5).
const TICKS_PER_HALF: u32 = 5;

impl LatRow {
    /// Summarises `hist`, whose samples are nanoseconds, as the latency of
    /// messages of `bytes`. An empty histogram gives zeros.
    pub fn from_histogram(bytes: u64, hist: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        let distribution = if hist.is_empty() {
            Vec::new()
        } else {
            hist.iter_quantiles(TICKS_PER_HALF)
                .map(|v| Percentile {
                    quantile: v.quantile_iterated_to(),
                    usec: us(v.value_iterated_to()),
                })
                .collect()
        };
        Self {
            bytes,
            iterations: hist.len(),
            t_min_us: us(hist.min()),
            t_typical_us: us(hist.value_at_quantile(0.5)),
            t_avg_us: hist.mean() / 1000.0,
            t_stdev_us: hist.stdev() / 1000.0,
            p99_us: us(hist.value_at_quantile(0.99)),
            p99_9_us: us(hist.value_at_quantile(0.999)),
            t_max_us: us(hist.max()),
            distribution,
            interrupted: false,
        }
    }
}

/// A histogram for latencies in nanoseconds: 1 ns to 100 s, three
/// significant digits (0.1 % resolution), the precision `ib_*_lat` reports.
///
/// Samples above 100 s should be clamped by the caller
/// (`hist.saturating_record(ns)`).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("constant histogram bounds are valid")
}
