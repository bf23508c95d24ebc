//! What each half of a data queue keeps of its connection: the connection
//! word it runs under and, while up, the peer's window (fetched anew at each
//! connection, as the transport's own connection does).

use std::sync::Arc;

use crate::hw::{LocalWindow, NtbDevice, PeerWindow, Port};

use super::super::claim::WindowClaim;
use super::super::watch::{ConnWatch, epoch_of};
use super::DataQueueStats;

/// How the connection stands at a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// As at the last burst, and up.
    Up,
    /// Down (or its window could not be had).
    Down,
    /// A new connection under this epoch (or none, under 0): start over,
    /// then go on as up (or down).
    Restarted(u32),
}

/// One half's view of the connection.
#[derive(Clone)]
pub(super) struct Link {
    pub peer: Port,
    pub queue: u16,
    /// Our window (we read what the peer writes).
    pub local: LocalWindow,
    /// The transport's claim on it (kept by the receive pool over it).
    pub claim: Arc<WindowClaim>,
    dev: Arc<dyn NtbDevice>,
    mw: usize,
    watch: Arc<ConnWatch>,
    /// The connection word we run under (0: down).
    seen: u64,
    /// The peer's window while connected.
    win: Option<PeerWindow>,
    /// Peer windows that could not be had.
    window_errors: u64,
}

impl Link {
    pub fn new(
        peer: Port,
        queue: u16,
        (local, claim): (LocalWindow, Arc<WindowClaim>),
        (dev, mw): (Arc<dyn NtbDevice>, usize),
        watch: Arc<ConnWatch>,
    ) -> Self {
        Self {
            peer,
            queue,
            local,
            claim,
            dev,
            mw,
            watch,
            seen: 0,
            win: None,
            window_errors: 0,
        }
    }

    /// Loads the connection word (one acquire load when nothing changed).
    #[inline]
    pub fn check(&mut self) -> Seen {
        let w = self.watch.load();
        if w != self.seen {
            return self.renew(w);
        }
        if w == 0 {
            Seen::Down
        } else if self.win.is_some() {
            Seen::Up
        } else {
            self.retry_window()
        }
    }

    /// A try at the connection's window. Retried on the same connection
    /// (its window could not be had yet) it has nothing to start over:
    /// nothing went to the peer without it.
    #[cold]
    fn retry_window(&mut self) -> Seen {
        match self.dev.peer_window(self.peer, self.mw) {
            Ok(w) => {
                self.win = Some(w);
                Seen::Up
            }
            Err(_) => {
                self.window_errors += 1;
                Seen::Down
            }
        }
    }

    #[cold]
    fn renew(&mut self, word: u64) -> Seen {
        self.seen = word;
        self.win = None;
        if word == 0 {
            return Seen::Restarted(0);
        }
        // Up or not, the queue starts over under the new epoch.
        let _ = self.retry_window();
        Seen::Restarted(epoch_of(word))
    }

    /// The peer's window, while up.
    #[inline]
    pub fn win(&self) -> Option<&PeerWindow> {
        self.win.as_ref()
    }

    /// The epoch we run under (0: down).
    #[inline]
    pub fn epoch(&self) -> u32 {
        epoch_of(self.seen)
    }

    /// `stats` with the peer windows that could not be had counted as
    /// device errors.
    pub fn counted(&self, stats: DataQueueStats) -> DataQueueStats {
        DataQueueStats {
            device_errors: stats.device_errors + self.window_errors,
            ..stats
        }
    }

    /// Whether we are up with a window.
    #[inline]
    pub fn is_up(&self) -> bool {
        self.seen != 0 && self.win.is_some()
    }
}
