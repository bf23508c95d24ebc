//! One transport per window: a record, for this process, of the local
//! windows transports run on.
//!
//! A transport owns its inbound window: its rings, its eager buffers, and
//! the buffers its data queues lend to peers and hand out as mbufs
//! (`dataq/rx.rs` builds a pool over them, `Pool::create_over`, whose
//! contract is that nothing else hands those bytes out). A second transport
//! on the same window (the same device opened twice, or a new transport
//! while mbufs the old one received are still alive) would take the same
//! rings and lend the same buffers again: a peer would overwrite bytes the
//! application still holds. So [`Transport::new`](super::Transport::new)
//! claims the window, and the claim lives as long as the transport and
//! every receive pool over the window (each pool keeps a clone).
//!
//! A claim is recorded by the window's address, so it keeps the window
//! mapped: were the mapping gone first, a new mapping at the same address
//! (another device, in another thread) would find the stale record and be
//! refused.

use std::sync::{Arc, Mutex, PoisonError};

use crate::hw::LocalWindow;

use super::error::{Result, TransportError};

/// The start addresses of the windows claimed now.
static CLAIMED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A claim on one local window; released when the last clone is dropped.
#[derive(Debug)]
pub(crate) struct WindowClaim {
    start: usize,
    /// Keeps the mapping (and so the address) ours until the record is gone:
    /// `drop` removes the record before the fields are dropped.
    _window: LocalWindow,
}

impl WindowClaim {
    /// Claims `local` (memory window `mw`), or says who holds it.
    pub(crate) fn take(local: &LocalWindow, mw: usize) -> Result<Arc<WindowClaim>> {
        let start = local.ptr_at(0, 0)? as usize;
        let mut claimed = CLAIMED.lock().unwrap_or_else(PoisonError::into_inner);
        if claimed.contains(&start) {
            return Err(TransportError::WindowInUse { mw });
        }
        claimed.push(start);
        Ok(Arc::new(WindowClaim {
            start,
            _window: local.clone(),
        }))
    }
}

impl Drop for WindowClaim {
    fn drop(&mut self) {
        let mut claimed = CLAIMED.lock().unwrap_or_else(PoisonError::into_inner);
        claimed.retain(|&s| s != self.start);
    }
}
