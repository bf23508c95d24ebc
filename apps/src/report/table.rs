//! perftest-style text tables (`ib_write_bw`, `ib_write_lat`).
//!
//! Columns are left-aligned under their headers and have fixed widths, so a
//! sweep can print its header first and each row as soon as it is measured,
//! as perftest does.

use super::figures::{BwRow, LatRow};

/// Spaces between two columns.
const GAP: usize = 4;

/// One column: its header and the least width of its values.
struct Column {
    header: &'static str,
    min_width: usize,
}

impl Column {
    const fn new(header: &'static str, min_width: usize) -> Self {
        Self { header, min_width }
    }

    fn width(&self) -> usize {
        self.header.len().max(self.min_width)
    }
}

/// A table layout: which columns, in order.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::{BwRow, Table};
///
/// let row = BwRow::new(65536, 5000, Duration::from_millis(25));
/// let text = Table::BANDWIDTH.render(&[Table::BANDWIDTH.bw_line(&row)]);
/// assert!(text.contains("#bytes"));
/// assert!(text.contains("13.11"));
/// ```
pub struct Table {
    columns: &'static [Column],
}

impl Table {
    /// `#bytes #iterations BW average[GB/s] MsgRate[Mpps]`.
    pub const BANDWIDTH: Table = Table {
        columns: &[
            Column::new("#bytes", 7),
            Column::new("#iterations", 10),
            Column::new("BW average[GB/s]", 7),
            Column::new("MsgRate[Mpps]", 8),
        ],
    };

    /// `#bytes #iterations t_min[usec] t_typical[usec] t_avg[usec] p99[usec]
    /// p99.9[usec] t_max[usec]` (`t_typical` is the median).
    pub const LATENCY: Table = Table {
        columns: &[
            Column::new("#bytes", 7),
            Column::new("#iterations", 10),
            Column::new("t_min[usec]", 7),
            Column::new("t_typical[usec]", 7),
            Column::new("t_avg[usec]", 7),
            Column::new("p99[usec]", 7),
            Column::new("p99.9[usec]", 7),
            Column::new("t_max[usec]", 7),
        ],
    };

    /// The dashed rule printed above the header and below the last row.
    pub fn rule(&self) -> String {
        let width: usize = 1
            + self.columns.iter().map(Column::width).sum::<usize>()
            + GAP * (self.columns.len() - 1);
        "-".repeat(width)
    }

    /// The header line.
    pub fn header(&self) -> String {
        let cells: Vec<&str> = self.columns.iter().map(|c| c.header).collect();
        self.line(&cells)
    }

    /// The line of one bandwidth row (for [`Table::BANDWIDTH`]).
    pub fn bw_line(&self, row: &BwRow) -> String {
        self.line(&[
            &row.bytes.to_string(),
            &row.iterations.to_string(),
            &format!("{:.2}", row.gb_per_s),
            &format!("{:.6}", row.mpps),
        ])
    }

    /// The line of one latency row (for [`Table::LATENCY`]).
    pub fn lat_line(&self, row: &LatRow) -> String {
        self.line(&[
            &row.bytes.to_string(),
            &row.iterations.to_string(),
            &format!("{:.2}", row.t_min_us),
            &format!("{:.2}", row.t_typical_us),
            &format!("{:.2}", row.t_avg_us),
            &format!("{:.2}", row.p99_us),
            &format!("{:.2}", row.p99_9_us),
            &format!("{:.2}", row.t_max_us),
        ])
    }

    /// The whole table: rule, header, `lines`, rule; one per line, each
    /// ending with a newline.
    pub fn render(&self, lines: &[String]) -> String {
        let mut out = String::new();
        for l in [self.rule(), self.header()]
            .iter()
            .chain(lines)
            .chain([self.rule()].iter())
        {
            out.push_str(l);
            out.push('\n');
        }
        out
    }

    /// Lays `cells` out in the columns: a leading space, each cell padded to
    /// its column's width, no trailing spaces.
    fn line(&self, cells: &[&str]) -> String {
        debug_assert_eq!(cells.len(), self.columns.len());
        let mut out = String::from(" ");
        for (i, (cell, col)) in cells.iter().zip(self.columns).enumerate() {
            if i > 0 {
                out.push_str(&" ".repeat(GAP));
            }
            out.push_str(&format!("{cell:<width$}", width = col.width()));
        }
        out.truncate(out.trim_end().len());
        out
    }
}

/// The bandwidth table of `rows`, ready to print.
pub fn bw_table(rows: &[BwRow]) -> String {
    let t = Table::BANDWIDTH;
    let lines: Vec<String> = rows.iter().map(|r| t.bw_line(r)).collect();
    t.render(&lines)
}

/// The latency table of `rows`, ready to print.
pub fn lat_table(rows: &[LatRow]) -> String {
    let t = Table::LATENCY;
    let lines: Vec<String> = rows.iter().map(|r| t.lat_line(r)).collect();
    t.render(&lines)
}
