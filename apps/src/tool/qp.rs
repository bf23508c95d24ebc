//! `ntb-tool qp`: the queue pairs of every host on a fabric, from the stats
//! pages their transports publish beside it (outstanding operations and
//! drops by kind per peer).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ntbdk_pmd::hw::emu::{FabricStatus, SlotState};
use ntbdk_pmd::transport::{
    DropKind, PublishedStats, TransportError, is_page_being_built, read_stats, stats_prefix,
};

/// One host's page as found beside a fabric.
#[derive(Debug)]
pub struct HostPage {
    /// The port its file name gives.
    pub port: u16,
    /// The file.
    pub path: PathBuf,
    /// What it holds, or why it could not be read.
    pub stats: Result<PublishedStats, TransportError>,
}

/// The pages of fabric `fabric` in `dir`, by port.
pub fn find_pages(dir: &Path, fabric: &str) -> std::io::Result<Vec<HostPage>> {
    let prefix = format!("{}{fabric}-", stats_prefix());
    let mut pages: Vec<HostPage> = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let port = name.to_str()?.strip_prefix(&prefix)?.parse().ok()?;
            let path = e.path();
            let stats = read_stats(&path);
            Some(HostPage { port, path, stats })
        })
        .collect();
    pages.sort_by_key(|p| p.port);
    Ok(pages)
}

/// Removes every stats page of fabric `fabric` in `dir` (with the fabric:
/// a page whose host died stays otherwise); best effort.
pub fn remove_pages(dir: &Path, fabric: &str) {
    for page in find_pages(dir, fabric).unwrap_or_default() {
        let _ = std::fs::remove_file(&page.path);
    }
    // Pages hosts were building when they died.
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name()
            .to_str()
            .is_some_and(|n| is_page_being_built(n, fabric))
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether `st`'s slot `port` is still held by the page's author (same pid
/// and join generation): otherwise the page was left by a host that is gone.
pub fn page_is_live(st: &FabricStatus, port: u16, page: &PublishedStats) -> bool {
    holds_slot(st, port, page.pid, page.generation)
}

/// Whether `st`'s slot `port` is held by `pid` under join `generation`.
fn holds_slot(st: &FabricStatus, port: u16, pid: u32, generation: u64) -> bool {
    st.slots.get(usize::from(port)).is_some_and(|s| {
        s.state != SlotState::Free && s.owner_pid == Some(pid) && s.generation == generation
    })
}

/// A page not rewritten for this long is shown with its age: its host holds
/// its slot but its transport has not polled its slow path since (the host
/// rewrites it every few milliseconds while it polls).
const STILL_PAGE: Duration = Duration::from_secs(2);

/// Drops by kind, `kind=count` for each kind seen, or `-`.
pub fn drops_by_kind(dropped: &[u64]) -> String {
    let seen: Vec<String> = DropKind::ALL
        .iter()
        .zip(dropped)
        .filter(|(_, n)| **n != 0)
        .map(|(k, n)| format!("{}={n}", k.name()))
        .collect();
    if seen.is_empty() {
        "-".into()
    } else {
        seen.join(",")
    }
}

/// Renders the queue pairs of every page: one row per (host, peer), peers
/// never connected hidden unless `all`.
pub fn render_qps(st: &FabricStatus, pages: &[HostPage], all: bool) -> String {
    let mut out = String::new();
    if pages.is_empty() {
        let _ = writeln!(
            out,
            "no queue pairs published on fabric {}: no transport runs on it (ntb-perf and \
             ntb-fwd publish theirs)",
            st.name
        );
        return out;
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let _ = writeln!(
        out,
        "{:>4} {:>8} {:>4} {:<10} {:>6} {:>6} {:>6} {:>7} {:>6} {:>7} {:>10} {:>10} {:>10} \
         {:>10} {:>10} {:>6}  drops",
        "host",
        "pid",
        "peer",
        "state",
        "out-wr",
        "out-rd",
        "out-mc",
        "serving",
        "recvs",
        "backlog",
        "sends",
        "recvd",
        "writes",
        "reads",
        "served",
        "failed"
    );
    for page in pages {
        let stats = match &page.stats {
            Ok(s) => s,
            Err(TransportError::StatsMidWrite {
                pid, generation, ..
            }) => {
                let why = if holds_slot(st, page.port, *pid, *generation) {
                    "its host was in the middle of rewriting it for 100 ms (stopped, stuck, or \
                     badly starved of CPU); try again"
                } else {
                    "left half-written by a host that is gone; remove it"
                };
                let _ = writeln!(
                    out,
                    "{:>4} {:>8} unreadable: {why} ({})",
                    page.port,
                    pid,
                    page.path.display()
                );
                continue;
            }
            Err(e) => {
                let _ = writeln!(out, "{:>4} unreadable: {e}", page.port);
                continue;
            }
        };
        if !page_is_live(st, page.port, stats) {
            let _ = writeln!(
                out,
                "{:>4} {:>8} stale: left by a host that is gone ({}); remove it",
                page.port,
                stats.pid,
                page.path.display()
            );
            continue;
        }
        let age = now_ms.saturating_sub(stats.updated_unix_ms);
        if age >= STILL_PAGE.as_millis() as u64 {
            let _ = writeln!(
                out,
                "{:>4} {:>8} last rewritten {:.1} s ago: its transport has not polled since \
                 (stopped or busy elsewhere), so these figures are that old",
                stats.port,
                stats.pid,
                age as f64 / 1000.0
            );
        }
        for p in &stats.peers {
            if !all && p.counters.connects == 0 {
                continue;
            }
            let c = &p.counters;
            let _ = writeln!(
                out,
                "{:>4} {:>8} {:>4} {:<10} {:>6} {:>6} {:>6} {:>7} {:>6} {:>7} {:>10} {:>10} \
                 {:>10} {:>10} {:>10} {:>6}  {}",
                stats.port,
                stats.pid,
                p.peer,
                p.state.to_string(),
                p.outstanding_writes,
                p.outstanding_reads,
                p.outstanding_multicasts,
                p.serving,
                p.recvs_posted,
                p.backlog,
                c.sends,
                c.recvs,
                c.writes,
                c.reads,
                c.served,
                c.failed_ops,
                drops_by_kind(&c.dropped)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_a_fabrics_pages_removes_pages_left_half_built() {
        let dir = std::env::temp_dir().join(format!("ntbdk-qp-rm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = stats_prefix();
        let names = [
            format!("{p}lab-3.4242.new"), // ours, half built: goes
            format!("{p}lab-b-3.1.new"),  // fabric "lab-b": stays
            format!("{p}other-3.1.new"),  // another fabric: stays
        ];
        for n in &names {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        remove_pages(&dir, "lab");
        let left: Vec<bool> = names.iter().map(|n| dir.join(n).exists()).collect();
        assert_eq!(left, [false, true, true]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn drops_are_named_by_kind() {
        assert_eq!(drops_by_kind(&[0; 9]), "-");
        let mut d = [0u64; 9];
        d[DropKind::Replay as usize] = 3;
        d[DropKind::Malformed as usize] = 1;
        assert_eq!(drops_by_kind(&d), "malformed=1,replay=3");
    }
}
