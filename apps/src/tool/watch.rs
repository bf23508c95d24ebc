//! `ntb-tool status --watch`: per-host rates between two snapshots of a
//! fabric, and the link changes seen since the watch began.

use std::fmt::Write as _;
use std::time::Duration;

use ntbdk_pmd::hw::emu::{FabricStatus, SlotState, SlotStatus};

/// Rates of each slot between successive snapshots of one fabric.
///
/// Counters are the owners' own, mirrored into the fabric by their
/// heartbeats (a few times per heartbeat timeout), so a rate over an
/// interval shorter than that is lumpy. Doorbell rings and peer scratchpad
/// writes are posted writes and are counted among the ringer's; the rings a
/// slot received are counted at the slot, as they happen. Joins come from the
/// slot's generation, which every claim bumps, so none is missed between
/// samples; link downs are counted when a sample sees the link go down, or
/// infers it from a join while the link was up.
#[derive(Debug)]
pub struct Watch {
    prev: FabricStatus,
    /// Per slot: joins and downs since the first snapshot.
    joins: Vec<u64>,
    downs: Vec<u64>,
}

impl Watch {
    /// Starts watching from `first`.
    pub fn new(first: FabricStatus) -> Self {
        let n = first.slots.len();
        Self {
            prev: first,
            joins: vec![0; n],
            downs: vec![0; n],
        }
    }

    /// Takes the next snapshot, `elapsed` after the previous one, and
    /// renders the rates since then (only slots ever claimed unless `all`).
    pub fn next(&mut self, now: FabricStatus, elapsed: Duration, all: bool) -> String {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let mut out = String::new();
        let up = now.slots.iter().filter(|s| s.link_up).count();
        let _ = writeln!(
            out,
            "fabric {}: {up} of {} slots up, rates over {:.2}s",
            now.name,
            now.slots.len(),
            secs
        );
        let _ = writeln!(
            out,
            "{:>4} {:<7} {:<4} {:>8} {:>6} {:>6} {:>12} {:>10} {:>10} {:>10} {:>18}",
            "slot",
            "state",
            "link",
            "pid",
            "joins",
            "downs",
            "posted-wr/s",
            "MiB/s",
            "reads/s",
            "db-rings/s",
            "db"
        );
        for (i, s) in now.slots.iter().enumerate() {
            let Some(p) = self.prev.slots.get(i) else {
                continue;
            };
            let (joins, downs) = link_changes(p, s);
            self.joins[i] += joins;
            self.downs[i] += downs;
            if !all && s.generation == 0 && s.state == SlotState::Free {
                continue;
            }
            // A new owner's counters start again from zero: rate it from there.
            let same_owner = p.generation == s.generation;
            let delta = |now: u64, before: u64| {
                if same_owner {
                    now.saturating_sub(before)
                } else {
                    now
                }
            };
            let c = &s.counters;
            let pc = &p.counters;
            let writes = delta(c.posted_writes, pc.posted_writes) as f64 / secs;
            let mbps = delta(c.posted_bytes, pc.posted_bytes) as f64 / secs / f64::from(1u32 << 20);
            let reads = delta(c.non_posted_reads, pc.non_posted_reads) as f64 / secs;
            // Rings received are the slot's own count, whoever owns it.
            let rings = s.db_rings.saturating_sub(p.db_rings) as f64 / secs;
            let pid = s
                .owner_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                out,
                "{:>4} {:<7} {:<4} {:>8} {:>6} {:>6} {:>12.0} {:>10.2} {:>10.0} {:>10.0} {:>#18x}",
                s.slot,
                s.state.to_string(),
                if s.link_up { "up" } else { "down" },
                pid,
                self.joins[i],
                self.downs[i],
                writes,
                mbps,
                reads,
                rings,
                s.db
            );
        }
        self.prev = now;
        out
    }
}

/// Joins and link downs of one slot between snapshots `p` and `s`.
fn link_changes(p: &SlotStatus, s: &SlotStatus) -> (u64, u64) {
    let joins = s.generation.saturating_sub(p.generation);
    if joins == 0 {
        return (0, u64::from(p.link_up && !s.link_up));
    }
    // Every join but the last ended in a down no sample saw; so did the
    // link that was up before the first, and the last join if it is over.
    let mut downs = joins - 1 + u64::from(p.link_up);
    if !s.link_up && s.state != SlotState::Claimed {
        downs += 1;
    }
    (joins, downs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ntbdk_pmd::hw::emu::{EmuFabric, FabricConfig};

    /// A real snapshot of a fresh two-slot fabric (each call its own).
    fn status() -> FabricStatus {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ntbdk-watch-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = FabricConfig {
            slots: 2,
            window_size: 64 << 10,
            ..Default::default()
        };
        let f = EmuFabric::create_in(&dir, "w", &cfg).unwrap();
        let st = f.status();
        drop(f);
        let _ = std::fs::remove_dir_all(&dir);
        st
    }

    fn slot(generation: u64, state: SlotState, link_up: bool) -> SlotStatus {
        let mut s = status().slots[0].clone();
        s.generation = generation;
        s.state = state;
        s.link_up = link_up;
        s
    }

    #[test]
    fn joins_come_from_generations_and_downs_are_inferred() {
        use SlotState::{Claimed, Free, Up};
        assert_eq!(link_changes(&slot(1, Up, true), &slot(1, Up, true)), (0, 0));
        assert_eq!(
            link_changes(&slot(1, Up, true), &slot(1, Free, false)),
            (0, 1)
        );
        assert_eq!(
            link_changes(&slot(0, Free, false), &slot(1, Up, true)),
            (1, 0)
        );
        assert_eq!(
            link_changes(&slot(0, Free, false), &slot(1, Claimed, false)),
            (1, 0)
        );
        // Up, then left and came back twice between two samples.
        assert_eq!(link_changes(&slot(1, Up, true), &slot(3, Up, true)), (2, 2));
        // Joined and left again between two samples.
        assert_eq!(
            link_changes(&slot(1, Free, false), &slot(2, Free, false)),
            (1, 1)
        );
    }

    #[test]
    fn rates_are_deltas_over_the_interval_and_restart_with_a_new_owner() {
        let mut first = status();
        first.slots[0] = slot(1, SlotState::Up, true);
        first.slots[0].counters.posted_writes = 1_000;
        first.slots[0].counters.posted_bytes = 64_000;
        let mut w = Watch::new(first.clone());
        let mut second = first.clone();
        second.slots[0].counters.posted_writes = 3_000;
        // 2 MiB in 2 s: 1.00 MiB/s (2^20 bytes, as ntb-perf's MB/sec).
        second.slots[0].counters.posted_bytes = 64_000 + 2 * (1 << 20);
        second.slots[0].counters.non_posted_reads = 10;
        second.slots[0].db_rings = 8;
        let out = w.next(second.clone(), Duration::from_secs(2), false);
        let row = out.lines().nth(2).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[6..10], ["1000", "1.00", "5", "4"], "{out}");
        assert_eq!(out.lines().count(), 3, "never-used slot 1 hidden: {out}");
        // A rejoin: the new owner's counters count from zero.
        let mut third = second;
        third.slots[0].generation = 2;
        third.slots[0].counters.posted_writes = 500;
        let out = w.next(third, Duration::from_secs(1), true);
        let cols: Vec<&str> = out.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(cols[4..7], ["1", "1", "500"], "{out}");
        assert_eq!(out.lines().count(), 4, "all slots shown: {out}");
    }
}
