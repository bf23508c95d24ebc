//! The plumbing every app shares: one [`run_main`] (logging, Ctrl-C, exit
//! codes, error printing), process [`session`]s (fabrics, devices, cores,
//! spawned peers, waits that end), the [`host`] device of either kind,
//! [`role`] (which app and side a peer is), and [`units`] (sizes and
//! durations as people type them).
//!
//! An app's `main` is one line:
//!
//! ```no_run
//! use std::process::ExitCode;
//! fn main() -> ExitCode {
//!     ntbdk_apps::cli::run_main("ntb-example", || {
//!         println!("hello");
//!         Ok(())
//!     })
//! }
//! ```

pub mod host;
pub mod hugepages;
pub mod role;
pub mod session;
pub mod units;

use std::io::IsTerminal;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;

pub use session::Interrupted;

/// Exit status after Ctrl-C (SIGINT), as shells report `128 + 2`.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit status of a command line that cannot run (clap's own, for a bad
/// option or value, and [`UsageError`]'s, for options that do not go
/// together).
pub const EXIT_USAGE: u8 = 2;
/// Exit status after stdout was closed under us (`ntb-perf | head`), as
/// shells report a process killed by SIGPIPE (`128 + 13`).
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// A command line whose options parse but do not go together (found by an
/// app's own checks, after clap's): [`run_main`] exits with
/// [`EXIT_USAGE`], as for clap's errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(String);

/// Marks `e` (an app's check of its options failing) as a [`UsageError`].
pub fn usage_error(e: anyhow::Error) -> anyhow::Error {
    UsageError(format_error(&e)).into()
}

/// Installs the `tracing` subscriber every app uses: `RUST_LOG` chooses what
/// is shown (default: warnings and errors, so the library's warnings — a
/// hugepage fallback, a failed handshake — reach the user), on stderr,
/// coloured only when stderr is a terminal. A second call does nothing.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .try_init();
}

/// Runs an app's body and turns its end into an exit status, the way Unix
/// tools end:
///
/// - success: 0;
/// - Ctrl-C or SIGTERM ([`Interrupted`] anywhere in the error chain): 130,
///   with a one-line note (what was measured before is the body's to
///   print or save before returning);
/// - stdout closed by the reader (`| head`): 141, silently;
/// - options that do not go together ([`UsageError`]): 2, printed as
///   `TOOL: error: …` with a pointer to `--help`, as clap prints its own;
/// - any other error: 1, printed once as `TOOL: error: …` (see
///   [`format_error`]).
///
/// Before the body runs it installs the logging subscriber
/// ([`init_logging`]) and the Ctrl-C handler
/// ([`session::install_signal_handlers`]).
pub fn run_main(tool: &str, body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    init_logging();
    session::install_signal_handlers();
    // `println!` panics when stdout is a closed pipe: that panic is a quiet
    // exit, not a crash report. Guards (fabrics, children) are dropped while
    // it unwinds.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_broken_pipe_panic(info.payload()) {
            default_hook(info);
        }
    }));
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) if is_interrupted(&e) => {
            eprintln!("{tool}: interrupted");
            ExitCode::from(EXIT_INTERRUPTED)
        }
        Ok(Err(e)) if is_broken_pipe(&e) => ExitCode::from(EXIT_BROKEN_PIPE),
        Ok(Err(e)) if e.chain().any(|c| c.is::<UsageError>()) => {
            eprintln!(
                "{tool}: error: {}\n\nFor more information, try '--help'.",
                format_error(&e)
            );
            ExitCode::from(EXIT_USAGE)
        }
        Ok(Err(e)) => {
            eprintln!("{tool}: error: {}", format_error(&e));
            ExitCode::FAILURE
        }
        Err(payload) if is_broken_pipe_panic(payload.as_ref()) => ExitCode::from(EXIT_BROKEN_PIPE),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// Whether `e` (or anything in its chain) is [`Interrupted`].
pub fn is_interrupted(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Interrupted>())
}

/// Whether `e` comes from writing to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Whether a panic payload is `println!`'s "failed printing to stdout:
/// Broken pipe".
fn is_broken_pipe_panic(payload: &(dyn std::any::Any + Send)) -> bool {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    msg.contains("Broken pipe") || msg.contains("os error 32")
}

/// An error and its causes on one line, `outer: inner: …`, each cause said
/// once: a cause whose text the line already holds (an OS error that a
/// library error also quotes) is left out.
///
/// ```
/// use anyhow::Context;
/// use ntbdk_apps::cli::format_error;
///
/// let io = std::io::Error::from_raw_os_error(13);
/// let quoted = format!("cannot open /x: {io}");
/// let e = anyhow::Error::new(io).context(quoted).context("saving the figures");
/// let line = format_error(&e);
/// assert_eq!(line.matches("Permission denied").count(), 1, "{line}");
/// assert!(line.starts_with("saving the figures: cannot open /x"));
/// ```
pub fn format_error(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
