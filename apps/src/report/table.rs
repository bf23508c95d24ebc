//! perftest's text tables, column for column (`ib_write_bw`,
//! `ib_write_lat`), so that scripts written for perftest's output parse
//! ours unchanged.
//!
//! The layout is perftest's: the same rule of 87 dashes, the same header
//! text and the same field widths, separators and precision in each row
//! (left-aligned numbers, a tab before the message rate), so both a
//! whitespace split (`awk '{print $4}'`) and a search for the header line
//! find the same fields as in perftest's output. A sweep prints its header
//! first and each row as soon as it is measured, as perftest does.
//!
//! Units as perftest means them: `MB/sec` is 2²⁰ bytes per second (what
//! perftest divides by, whatever its header says), `Gb/sec`
//! (`--report_gbits`) is 10⁹ bits per second, `Mpps` 10⁶ messages per
//! second, `usec` microseconds.

use super::figures::{BwRow, LatRow};

/// The rule perftest prints above and below its tables (87 dashes).
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The unit of the bandwidth columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BwUnit {
    /// perftest's default: `MB/sec`, 2²⁰ bytes per second.
    #[default]
    MBps,
    /// perftest's `--report_gbits`: `Gb/sec`, 10⁹ bits per second.
    Gbps,
}

impl BwUnit {
    /// The unit as the header writes it: `MB/sec` or `Gb/sec`.
    pub fn label(self) -> &'static str {
        match self {
            BwUnit::MBps => "MB/sec",
            BwUnit::Gbps => "Gb/sec",
        }
    }

    /// A bandwidth of `gb_per_s` decimal gigabytes per second in this unit.
    ///
    /// ```
    /// use ntbdk_apps::report::BwUnit;
    /// assert_eq!(BwUnit::Gbps.convert(1.0), 8.0);
    /// assert_eq!(BwUnit::MBps.convert(1.048576), 1000.0);
    /// ```
    pub fn convert(self, gb_per_s: f64) -> f64 {
        match self {
            BwUnit::MBps => gb_per_s * 1e9 / f64::from(1u32 << 20),
            BwUnit::Gbps => gb_per_s * 8.0,
        }
    }
}

/// perftest's bandwidth header:
/// ` #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]`.
pub fn bw_header(unit: BwUnit) -> String {
    let u = unit.label();
    format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]")
}

/// One bandwidth row laid out as perftest's: size, iterations, peak and
/// average bandwidth with two decimals, message rate with six (in Gb/sec
/// below 0.1, perftest's extended accuracy: six decimals everywhere).
pub fn bw_line(row: &BwRow, unit: BwUnit) -> String {
    let peak = unit.convert(row.peak_gb_per_s);
    let avg = unit.convert(row.gb_per_s);
    if unit == BwUnit::Gbps && avg < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            row.bytes, row.iterations, peak, avg, row.mpps
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t     {:<7.6}",
            row.bytes, row.iterations, peak, avg, row.mpps
        )
    }
}

/// perftest's latency header (note its trailing space):
/// ` #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] `.
pub fn lat_header() -> String {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
     t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        .to_string()
}

/// One latency row laid out as perftest's: size, iterations, then minimum,
/// maximum, typical (median), average, standard deviation, 99th and 99.9th
/// percentile in microseconds, two decimals each.
pub fn lat_line(row: &LatRow) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        row.bytes,
        row.iterations,
        row.t_min_us,
        row.t_max_us,
        row.t_typical_us,
        row.t_avg_us,
        row.t_stdev_us,
        row.p99_us,
        row.p99_9_us
    )
}

/// A whole table: rule, `header`, `lines`, rule; each line ending with a
/// newline.
fn render(header: String, lines: impl Iterator<Item = String>) -> String {
    let mut out = format!("{RULE}\n{header}\n");
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out.push_str(RULE);
    out.push('\n');
    out
}

/// The bandwidth table of `rows` in `unit`, ready to print.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::{BwRow, BwUnit, bw_table};
///
/// let row = BwRow::new(65536, 5000, Duration::from_millis(25));
/// let text = bw_table(&[row], BwUnit::MBps);
/// let fields: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
/// // 65536 B × 5000 in 25 ms: 12500.00 MB/sec (2^20 B/s), 0.2 Mpps.
/// assert_eq!(fields, ["65536", "5000", "0.00", "12500.00", "0.200000"]);
/// ```
pub fn bw_table(rows: &[BwRow], unit: BwUnit) -> String {
    render(bw_header(unit), rows.iter().map(|r| bw_line(r, unit)))
}

/// The latency table of `rows`, ready to print.
pub fn lat_table(rows: &[LatRow]) -> String {
    render(lat_header(), rows.iter().map(lat_line))
}
