//! `ntb-perf`: perftest-style bandwidth and latency between hosts on an NTB
//! fabric (`ib_write_bw`, `ib_write_lat`, `ib_read_*`, `ib_send_*`).
//!
//! A run has a **client**, which measures, and one or more **servers**,
//! which serve: they keep their transport progressing (writes land, reads
//! are served), keep receives posted and, in latency tests, echo. The two
//! agree on what to do through a [`control`] channel in the scratchpad
//! registers (where perftest uses a TCP socket), then move data with the
//! transport only.
//!
//! - [`Endpoint`]: a transport with a data region (8 MiB: the largest
//!   message) and posted receives, on a fabric whose windows hold both
//!   ([`fabric_config`]);
//! - [`Client`]: bandwidth (bursts of `post_list` work requests, at most
//!   `depth` outstanding, completions polled in bursts) and latency (one
//!   operation at a time into an HDR histogram);
//! - [`serve`]: the server loop;
//! - [`cli::session`](crate::cli::session): process plumbing (Ctrl-C,
//!   pinning, spawned peers), shared with the other apps;
//! - [`parse_size`], [`sweep_sizes`], [`Budget`]: what `-s`, `-a`, `-n` and
//!   `-D` mean;
//! - [`perftest`]: perftest's flags that have no NTB meaning, and what to
//!   use instead.

mod budget;
mod client;
pub mod control;
mod endpoint;
pub mod perftest;
mod pump;
mod server;
mod write_mode;

pub use crate::cli::units::{
    MAX_SIZE, MIN_SWEEP_SIZE, SizeError, parse_size, size_label, sweep_sizes,
};
pub use budget::Budget;
pub use client::{Client, MAX_KEPT_SAMPLES};
pub use endpoint::{
    EAGER_COUNT, EAGER_SIZE, Endpoint, HEARTBEAT_TIMEOUT, QUEUE_DEPTH, RECVS, connect_failure,
    fabric_config, geometry, window_size,
};
pub use pump::PEAK_WINDOW;
pub use server::{ServeStats, serve};
pub use write_mode::WriteMode;

/// Which operation is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Op {
    /// Write into the server's region (`ib_write_*`): one-sided or
    /// rendezvous, as --write-mode says.
    Write,
    /// Read of the server's region into ours (`ib_read_*`).
    Read,
    /// Eager send into a posted receive (`ib_send_*`; at most one eager
    /// buffer, 4 KiB).
    Send,
}

impl Op {
    /// Whether requests of this operation can go unsignaled (completion
    /// moderation, perftest's `--cq-mod`): sends and one-sided writes,
    /// which complete once posted; not rendezvous writes or reads, which
    /// complete with the server's answer.
    pub fn moderable(self, write_mode: WriteMode) -> bool {
        match self {
            Op::Send => true,
            Op::Write => write_mode == WriteMode::Direct,
            Op::Read => false,
        }
    }

    /// `write`, `read`, `send`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
        }
    }
}

/// Which test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Test {
    /// Bandwidth and message rate.
    Bw,
    /// Latency.
    Lat,
}
