//! Is a slot's owner still alive?
//!
//! Between processes on one host: pids, process start times and a clock that
//! every process agrees on ([`Liveness::HostProcesses`]). Between hosts (VMs
//! sharing an ivshmem BAR) none of these mean anything, so an owner is alive
//! while its heartbeat count keeps advancing, as timed by the observer's own
//! clock ([`Liveness::HeartbeatOnly`], [`Progress`]).

/// How a fabric tells a live slot owner from a dead one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Owners are processes on this host: an owner is dead when its pid is
    /// gone (or a zombie, or reused) or its heartbeat timestamp, on the
    /// host-wide CLOCK_MONOTONIC, is older than the timeout.
    HostProcesses,
    /// Owners may be on other hosts, whose pids and clocks mean nothing
    /// here: an owner is dead when its heartbeat count has not moved for a
    /// timeout of the observer's clock. A host that starts observing a
    /// slot gives it a full timeout before judging it.
    HeartbeatOnly,
}

/// What one observer last saw of a slot, for [`Liveness::HeartbeatOnly`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Progress {
    word: u64,
    count: u64,
    /// Our clock when `word` or `count` last changed (0 = never observed).
    since: u64,
}

impl Progress {
    /// Records the slot's current `word` and heartbeat `count` at our time
    /// `now`; returns how long they have been unchanged.
    pub fn observe(&mut self, word: u64, count: u64, now: u64) -> u64 {
        if self.since == 0 || word != self.word || count != self.count {
            *self = Progress {
                word,
                count,
                since: now.max(1),
            };
        }
        now.saturating_sub(self.since)
    }
}

/// CLOCK_MONOTONIC in nanoseconds: system-wide, so heartbeats written by one
/// process can be aged by another.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Our own pid.
pub(crate) fn own_pid() -> u32 {
    std::process::id()
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// The state letter (R, S, D, Z, X, T...).
    pub state: u8,
    /// Start time in clock ticks since boot (field 22).
    pub start: u64,
}

/// Reads `/proc/<pid>/stat`; `None` if the process does not exist.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything:
    // parse from the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let state = f.next()?.bytes().next()?;
    // After the state (field 3), field 22 is the 19th more.
    let start = f.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start })
}

/// Start time of the calling process.
pub(crate) fn own_start() -> u64 {
    proc_stat(own_pid()).map(|s| s.start).unwrap_or(0)
}

/// Whether `pid` exists at all (kill(pid, 0) is not ESRCH). A zombie exists.
pub(crate) fn pid_exists(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks existence and permission.
    let r = unsafe { libc::kill(pid as i32, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whether the process that registered as (`pid`, `start`) is gone: no such
/// pid, a zombie, or a different process that reused the pid. `start == 0`
/// skips the start-time comparison.
pub(crate) fn owner_gone(pid: u32, start: u64) -> bool {
    if !pid_exists(pid) {
        return true;
    }
    match proc_stat(pid) {
        None => true,
        Some(st) => matches!(st.state, b'Z' | b'X' | b'x') || (start != 0 && st.start != start),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive() {
        let me = own_pid();
        assert!(pid_exists(me));
        assert!(!owner_gone(me, own_start()));
        assert!(
            owner_gone(me, own_start() + 1),
            "start time mismatch means gone"
        );
        assert!(!pid_exists(0));
    }

    #[test]
    fn progress_ages_only_while_nothing_moves() {
        let mut p = Progress::default();
        assert_eq!(p.observe(7, 1, 1000), 0, "first sight is fresh");
        assert_eq!(p.observe(7, 1, 1500), 500);
        assert_eq!(p.observe(7, 2, 2000), 0, "a beat resets the age");
        assert_eq!(p.observe(9, 2, 2600), 0, "a new word (re-join) too");
        assert_eq!(p.observe(9, 2, 3000), 400);
    }
}
