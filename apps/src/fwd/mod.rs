//! `ntb-fwd`'s engines on the data plane: DPDK `ntb_fwd`'s forwarding modes
//! on the transport's data queues ([`DataQueue`](ntbdk_pmd::transport::DataQueue):
//! `tx_burst` / `rx_burst` of mbufs), one pinned, spinning lcore per queue
//! ([`ntbdk_pmd::lcore`]), the transport polled on the main thread.
//!
//! - [`Mode::TxOnly`] ([`txonly`]): mbufs from an [`MbufPool`](ntbdk_pmd::mbuf::MbufPool)
//!   filled with a checkable [`pattern`](fill) and a sequence in the user
//!   word, then an end marker; whatever comes back is counted (and checked
//!   with `--verify`);
//! - [`Mode::RxOnly`] ([`rxonly`]): receive and bulk free, checking
//!   sequence and bytes with `--verify`, until the end marker;
//! - [`Mode::IoFwd`]: send every mbuf back to the peer (a reflector), run
//!   to completion ([`iofwd`]) or as an rx lcore → [`MbufRing`](ntbdk_pmd::mbuf::MbufRing)
//!   → tx lcore pipeline ([`pipeline_rx`], [`pipeline_tx`]);
//! - [`Mode::FileTrans`]: a file in chunks ([`send_file`]), written out and
//!   checked by the receiver ([`recv_file`]), which acknowledges.
//!
//! The data queues' shape comes from the flags, fitted to the window
//! ([`plan_geometry`]); per-queue [`QueueCounters`] are printed by a
//! [`StatsPrinter`] every period and at exit; [`run_lcores`] launches the
//! lcores and polls the transport until they end (Ctrl-C raises their stop
//! flag).

mod checksum;
mod connect;
mod eal;
mod file;
mod geometry;
mod iofwd;
mod lcore;
mod pattern;
mod run;
mod stats;
mod txrx;

pub use checksum::Checksum;
pub use connect::wait_connected;
pub use eal::eal_hint;
pub use file::{Transfer, recv_file, send_file};
pub use geometry::{
    DEFAULT_NB_DESC, MAX_EMU_WINDOW, MIN_NB_DESC, Shape, emu_window, plan_geometry, window_needed,
};
pub use iofwd::{iofwd, pipeline_rx, pipeline_tx};
pub use lcore::{LcoreCtx, Limit, RaiseOnDrop};
pub use pattern::{Kind, check, fill, parse_user, user_word};
pub use run::{Job, LcoreFn, Outcome, run_lcores};
pub use stats::{QueueCounters, QueueStats, StatsPrinter};
pub use txrx::{TxOnly, rxonly, txonly};

/// The tool's name, for messages.
pub const TOOL: &str = "ntb-fwd";

/// What a forwarder does (DPDK `ntb_fwd`'s `--fwd-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Send test packets (and count, or check, what comes back).
    #[value(name = "txonly")]
    TxOnly,
    /// Receive and drop (checking with --verify).
    #[value(name = "rxonly")]
    RxOnly,
    /// Send everything received back to the peer.
    #[value(name = "iofwd")]
    IoFwd,
    /// Send a file, or receive one and check it.
    #[value(name = "file-trans")]
    FileTrans,
}
