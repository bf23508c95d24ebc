//! Helpers of `ntb-tool`: number and size parsing, the status table,
//! [`hexdump`]s of window bytes, the [`watch`] of rates and the [`qp`]
//! view of published queue pairs.

pub mod hexdump;
pub mod qp;
pub mod watch;

use std::fmt::Write as _;

use ntbdk_pmd::hw::emu::{FabricStatus, Liveness, SlotState};

/// Parses an integer in decimal, `0x` hex or `0b` binary (`_` allowed).
pub fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if let Some(b) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
        u64::from_str_radix(b, 2)
    } else {
        t.parse()
    };
    r.map_err(|_| format!("{s:?} is not a number (decimal, 0x hex or 0b binary)"))
}

/// Parses a 32-bit value like [`parse_u64`].
pub fn parse_u32(s: &str) -> Result<u32, String> {
    let v = parse_u64(s)?;
    u32::try_from(v).map_err(|_| format!("{s:?} does not fit in 32 bits"))
}

/// Parses a byte size ([`parse_bytes`](crate::cli::units::parse_bytes):
/// `K`, `M`, `G` suffixes, `0x` hex) that fits a `usize`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let n = crate::cli::units::parse_bytes(s).map_err(|e| e.to_string())?;
    usize::try_from(n).map_err(|_| format!("{s:?} is too large"))
}

/// Formats a byte count with a binary unit
/// ([`size_label`](crate::cli::units::size_label)).
pub fn fmt_size(n: usize) -> String {
    crate::cli::units::size_label(n as u64)
}

/// Renders `ntb-tool status`: the geometry, then one row per slot (only
/// slots ever claimed unless `all`).
pub fn render_status(st: &FabricStatus, all: bool) -> String {
    let c = &st.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fabric {} ({})\n  {} slots, {} windows, {} scratchpads, {} doorbell bits, \
         {} R-LUT entries, heartbeat timeout {:?}, read latency {:?}",
        st.name,
        st.path.display(),
        c.slots,
        fmt_size(c.window_size),
        c.spads,
        c.db_bits,
        c.rlut_entries,
        c.heartbeat_timeout,
        c.read_latency
    );
    if !st.window_backing.isolates_peers() {
        let _ = writeln!(
            out,
            "  peers are NOT isolated: every window is in one shared memory that every host \
             maps whole, so any host can write any window"
        );
    }
    if st.liveness == Liveness::HeartbeatOnly {
        let _ = writeln!(
            out,
            "  owners may be on other hosts: pids are theirs, alive = heartbeat advancing, \
             hb-age = time since this tool saw it advance"
        );
    }
    let up = st.slots.iter().filter(|s| s.link_up).count();
    let _ = writeln!(out, "  {up} of {} slots up", c.slots);
    let _ = writeln!(
        out,
        "{:>4} {:<7} {:>5} {:>8} {:<5} {:<4} {:>9} {:>18} {:>18} {:>4} {:>10} {:>12} {:>8} {:>8} {:>6}",
        "slot",
        "state",
        "gen",
        "pid",
        "alive",
        "link",
        "hb-age",
        "db",
        "db-mask",
        "rlut",
        "posted-wr",
        "posted-bytes",
        "np-reads",
        "refused",
        "grants"
    );
    for s in &st.slots {
        if !all && s.generation == 0 && s.state == SlotState::Free {
            continue;
        }
        let pid = s
            .owner_pid
            .map(|p| p.to_string())
            .unwrap_or_else(|| "-".into());
        let age = s
            .heartbeat_age
            .map(|a| format!("{:.1}ms", a.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "-".into());
        let alive = match (s.state, s.owner_alive) {
            (SlotState::Free, _) => "-",
            (_, true) => "yes",
            (_, false) => "NO",
        };
        let _ = writeln!(
            out,
            "{:>4} {:<7} {:>5} {:>8} {:<5} {:<4} {:>9} {:>#18x} {:>#18x} {:>4} {:>10} {:>12} {:>8} {:>8} {:>6}",
            s.slot,
            s.state.to_string(),
            s.generation,
            pid,
            alive,
            if s.link_up { "up" } else { "down" },
            age,
            s.db,
            s.db_mask,
            s.rlut_in_use,
            s.counters.posted_writes,
            s.counters.posted_bytes,
            s.counters.non_posted_reads,
            s.rlut_refusals,
            s.granted_ranges
        );
    }
    out
}

/// What `ntb-tool list` says of a fabric's owners: `None` while any owner
/// lives or no slot is owned, else how many slots dead owners hold (their
/// processes exited or crashed without leaving).
pub fn dead_owners(st: &FabricStatus) -> Option<usize> {
    let owned: Vec<_> = st
        .slots
        .iter()
        .filter(|s| s.state != SlotState::Free)
        .collect();
    (!owned.is_empty() && owned.iter().all(|s| !s.owner_alive)).then_some(owned.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_sizes_parse() {
        assert_eq!(parse_u64("42"), Ok(42));
        assert_eq!(parse_u64("0x2A"), Ok(42));
        assert_eq!(parse_u64("0b101010"), Ok(42));
        assert_eq!(parse_u64("1_000"), Ok(1000));
        assert!(parse_u64("forty").is_err());
        assert!(parse_u32("0x1_0000_0000").is_err());
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("3 parsecs").is_err());
        assert_eq!(fmt_size(16 << 20), "16 MiB");
        assert_eq!(fmt_size(100), "100 B");
    }
}
