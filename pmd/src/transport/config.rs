//! How a transport is set up: the agreed geometry, the window, timeouts,
//! limits and copy settings.

use std::time::{Duration, Instant};

use super::dma::default_nt_threshold;
use super::geometry::Geometry;

/// How a [`Transport`](super::Transport) is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The agreed geometry (must be the same on every host).
    pub geometry: Geometry,
    /// The memory window the transport uses.
    pub mw: usize,
    /// An operation that makes no progress for this long fails with
    /// [`Status::Timeout`](super::Status::Timeout). Use the same value on
    /// every host: a host guesses from its own how long a peer keeps
    /// storage it gave out (a multicast put writes nothing later than three
    /// quarters of it after its post; a chain link keeps storage its
    /// previous link may write for two of it after giving the operation
    /// up), so a peer with a much shorter timeout may free storage a late
    /// honest write still reaches. It also bounds how long what a peer may
    /// still write is held after we reset its connection or saw its link
    /// drop (two of it, unless the peer comes back sooner): with
    /// `Duration::MAX`, a peer that never comes back holds it for good.
    pub op_timeout: Duration,
    /// How often a hello is re-sent to a peer that has not answered. A
    /// peer's new incarnations are taken at most every five of it (a peer
    /// restarting at every hello would otherwise keep the poll busy wiping
    /// its section).
    pub hello_interval: Duration,
    /// Most operations outstanding at once (as initiator).
    pub max_outstanding: usize,
    /// Most bytes of our region area the storage one peer asks us for
    /// (multicast targets) may hold at once, each request counted in
    /// whole 64-byte grains as the area allocates it; more is refused with
    /// "no room". `None`: the area divided evenly among the other ports.
    pub peer_storage_quota: Option<u64>,
    /// Whether each send completes with an [`OpKind::Send`](super::OpKind)
    /// completion (default, as a verbs queue pair with `sq_sig_all`). Off,
    /// sends are unsignaled, as verbs' sends without `IBV_SEND_SIGNALED`,
    /// unless their [`SendWr::signaled`](super::SendWr::signaled) asks: a
    /// send is complete when `post_send` returns (its bytes are copied), and
    /// the completion queue carries only what the application waits for.
    pub signal_sends: bool,
    /// Copies of at least this many bytes use non-temporal stores
    /// (default: [`default_nt_threshold`](super::default_nt_threshold), the
    /// last-level cache size, at least 2 MiB; `usize::MAX`: never).
    pub nt_threshold: usize,
    /// Ring the peer's doorbell (bit 0) after each batch of posts, for peers
    /// that sleep on doorbells instead of polling.
    pub doorbell: bool,
    /// Most completions waiting in the completion queue before a peer's
    /// write-with-immediate notice ([`OpKind::WriteImm`](super::OpKind)) is
    /// refused (its data is in place regardless; the notice is counted as
    /// [`DropKind::Overload`](super::DropKind) of that peer), as a verbs
    /// completion queue overruns at its depth. Peers send notices
    /// unasked, so an application that does not poll its completions
    /// would otherwise hold them without bound. Our own operations'
    /// completions are never refused (they count towards the depth,
    /// though). 0 refuses every notice. Default 65 536.
    pub cq_depth: usize,
}

impl Config {
    /// Defaults for `geometry`.
    pub fn new(geometry: Geometry) -> Self {
        Self {
            geometry,
            mw: 0,
            op_timeout: Duration::from_secs(10),
            hello_interval: Duration::from_millis(20),
            max_outstanding: 4096,
            peer_storage_quota: None,
            signal_sends: true,
            nt_threshold: default_nt_threshold(),
            doorbell: false,
            cq_depth: 65_536,
        }
    }
}

impl Config {
    /// When an operation started or moved along now times out.
    #[inline]
    pub(crate) fn op_deadline(&self) -> Instant {
        saturating_after(self.op_timeout)
    }

    /// How long after its post an operation of ours may still start a
    /// copy into a target's storage: three quarters of the operation
    /// timeout. The target gives its storage up a timeout after our request
    /// reached it, after the post; the quarter is the margin for our
    /// polling and a copy in progress. (Hosts are assumed to use the same
    /// timeout: see [`op_timeout`](Self::op_timeout).)
    pub(crate) fn copy_window(&self) -> Duration {
        let t = self.op_timeout;
        t - t / 4
    }
}

/// `now + d`, or a time so far ahead it never comes when that overflows
/// (`Duration::MAX` means "no timeout", not a panic).
pub(crate) fn saturating_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}
