//! What every `ntb-fwd` lcore shares: its context (stop flag, poll mode,
//! burst, counters), a polling loop that can end itself, its limits, the
//! counted `tx_burst`, and [`RaiseOnDrop`], which raises a flag on every
//! way out of an lcore (a failure, a panic, a job that never ran).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use ntbdk_pmd::lcore::{PollLoop, PollMode, StopFlag};
use ntbdk_pmd::mbuf::Mbuf;

use super::pattern::{Kind, parse_user};
use super::stats::QueueCounters;

/// What an lcore gets from the run.
#[derive(Debug, Clone)]
pub struct LcoreCtx {
    /// Raised on Ctrl-C or when another lcore failed: every lcore ends.
    pub stop: StopFlag,
    /// Spin, or spin then yield when lcores share a core.
    pub poll: PollMode,
    /// Packets per burst (`--burst`).
    pub burst: usize,
    /// How long to wait for the peer before giving up (`--timeout`).
    pub timeout: Duration,
    /// This queue's counters.
    pub counters: Arc<QueueCounters>,
}

impl LcoreCtx {
    /// How long a receiver that answered its sender's last message (file-trans's
    /// acknowledgement, rxonly's end marker back) waits for the sender to
    /// read it and leave, so that its own leaving does not end the
    /// connection first: `--timeout`, at most 5 s.
    pub fn linger(&self) -> Duration {
        self.timeout.min(Duration::from_secs(5))
    }
}

/// When an lcore stops on its own (besides the peer leaving and Ctrl-C).
#[derive(Debug, Clone, Copy, Default)]
pub struct Limit {
    /// After this many packets (sent for txonly, received otherwise).
    pub packets: Option<u64>,
    /// At this time (`-D`).
    pub deadline: Option<Instant>,
}

impl Limit {
    /// Whether `packets` reached the limit.
    #[inline]
    pub fn count_reached(&self, packets: u64) -> bool {
        self.packets.is_some_and(|n| packets >= n)
    }

    /// At most `room`, and no more than the packets left before the limit
    /// once `packets` are done.
    #[inline]
    pub fn left_of(&self, room: usize, packets: u64) -> usize {
        self.packets
            .map_or(room, |n| room.min(n.saturating_sub(packets) as usize))
    }

    /// Whether the time is up (a clock read: call it now and then).
    #[inline]
    pub fn time_up(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// What one poll of an lcore did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Moved this many packets (0: an empty poll).
    Work(usize),
    /// The lcore's job is done.
    Done,
}

/// Runs `step` in a [`PollLoop`] until it is done, fails, or the run's stop
/// flag is raised; returns whether it finished (`false`: stopped).
pub fn spin(ctx: &LcoreCtx, mut step: impl FnMut() -> Result<Step>) -> Result<bool> {
    let mine = StopFlag::new();
    let mut out = Ok(false);
    PollLoop::new(ctx.poll, mine.clone()).run(|| {
        if ctx.stop.is_stopped() {
            mine.stop();
            return 0;
        }
        match step() {
            Ok(Step::Work(n)) => n,
            Ok(Step::Done) => {
                out = Ok(true);
                mine.stop();
                0
            }
            Err(e) => {
                out = Err(e);
                mine.stop();
                0
            }
        }
    });
    out
}

/// Raises a flag when dropped, unless [`disarm`](Self::disarm)ed: on every
/// way out of a scope, a panic's unwinding and a closure dropped unrun
/// among them.
#[derive(Debug)]
pub struct RaiseOnDrop(Option<StopFlag>);

impl RaiseOnDrop {
    /// Raises `flag` when dropped.
    pub fn new(flag: StopFlag) -> Self {
        Self(Some(flag))
    }

    /// Drops it without raising the flag.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            f.stop();
        }
    }
}

/// Packets (end markers and their acknowledgements are not packets) and
/// bytes in `mbufs`.
#[inline]
pub fn counts(mbufs: &[Mbuf]) -> (u64, u64) {
    mbufs
        .iter()
        .filter(|m| !matches!(parse_user(m.user()).0, Some(Kind::End | Kind::EndAck)))
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len() as u64))
}

/// `tx_burst` of `mbufs` on `q`, counted; returns how many left `mbufs`.
#[inline]
pub fn tx_counted(
    send: impl FnOnce(&mut Vec<Mbuf>) -> usize,
    mbufs: &mut Vec<Mbuf>,
    c: &QueueCounters,
) -> usize {
    let (n0, b0) = counts(mbufs);
    let sent = send(mbufs);
    if sent > 0 {
        let (n1, b1) = counts(mbufs);
        c.sent(n0 - n1, b0 - b1);
    }
    sent
}

/// Frees what is left unsent, counting it as dropped.
pub fn drop_unsent(mbufs: &mut Vec<Mbuf>, c: &QueueCounters) {
    c.dropped(counts(mbufs).0);
    Mbuf::free_bulk(mbufs);
}

/// Says yes once every so many calls (for clock reads and peer checks in a
/// hot loop).
#[derive(Debug, Default)]
pub struct Every(u32);

impl Every {
    /// Whether this is the call to act on.
    #[inline]
    pub fn tick(&mut self, every: u32) -> bool {
        self.0 = self.0.wrapping_add(1);
        self.0.is_multiple_of(every)
    }
}
