//! A one-line progress indicator for long sweeps, on stderr and only when
//! stderr is a terminal (so logs, pipes and tests stay clean).

use std::io::{IsTerminal, Stderr, Write};
use std::time::{Duration, Instant};

/// How long a sweep runs before its progress line appears: short sweeps
/// never show one.
pub const SHOW_AFTER: Duration = Duration::from_secs(2);

/// Progress through `total` steps of a sweep, redrawn in place with `\r`.
///
/// ```
/// use ntbdk_apps::report::Progress;
///
/// let mut p = Progress::new("write bw", 3); // draws only on a terminal
/// for size in [64, 4096, 65536] {
///     p.step(&format!("{size} B"));
///     // … measure …
/// }
/// p.finish();
/// ```
pub struct Progress<W: Write = Stderr> {
    label: String,
    total: usize,
    done: usize,
    started: Instant,
    show_after: Duration,
    out: Option<W>,
    drawn: bool,
}

impl Progress<Stderr> {
    /// Progress of `total` steps labelled `label`, drawn on stderr after
    /// [`SHOW_AFTER`] when stderr is a terminal, and never otherwise.
    pub fn new(label: &str, total: usize) -> Self {
        let err = std::io::stderr();
        let out = err.is_terminal().then_some(err);
        Self::build(label, total, out, SHOW_AFTER)
    }
}

impl<W: Write> Progress<W> {
    /// Progress drawn on `out` (whatever it is) once `show_after` has passed.
    pub fn with_writer(label: &str, total: usize, out: W, show_after: Duration) -> Self {
        Self::build(label, total, Some(out), show_after)
    }

    fn build(label: &str, total: usize, out: Option<W>, show_after: Duration) -> Self {
        Self {
            label: label.to_string(),
            total,
            done: 0,
            started: Instant::now(),
            show_after,
            out,
            drawn: false,
        }
    }

    /// Starts the next step, described by `what` (e.g. the message size).
    pub fn step(&mut self, what: &str) {
        self.done = (self.done + 1).min(self.total.max(1));
        let elapsed = self.started.elapsed();
        if elapsed < self.show_after {
            return;
        }
        let line = progress_line(&self.label, self.done, self.total, what, elapsed);
        if let Some(out) = self.out.as_mut() {
            // Progress is best effort: a failed write to stderr is ignored.
            let _ = write!(out, "\r\x1b[K{line}").and_then(|()| out.flush());
            self.drawn = true;
        }
    }

    /// Clears the progress line (if one was drawn) and returns the writer.
    pub fn finish(mut self) -> Option<W> {
        self.clear();
        self.out.take()
    }

    /// Clears the progress line (if one is drawn), so that what is printed
    /// next to the same terminal starts on a clean line; the next
    /// [`step`](Self::step) draws it again.
    pub fn clear(&mut self) {
        if self.drawn {
            if let Some(out) = self.out.as_mut() {
                let _ = write!(out, "\r\x1b[K").and_then(|()| out.flush());
            }
            self.drawn = false;
        }
    }
}

impl<W: Write> Drop for Progress<W> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The text of a progress line: `label [done/total] what (elapsed s)`.
pub fn progress_line(
    label: &str,
    done: usize,
    total: usize,
    what: &str,
    elapsed: Duration,
) -> String {
    let width = total.to_string().len();
    format!(
        "{label} [{done:>width$}/{total}] {what} ({:.1} s)",
        elapsed.as_secs_f64()
    )
}
