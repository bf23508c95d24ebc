//! Write-combined peer windows: a store fence before every publication.
//!
//! A BAR mapped write-combining (sysfs `resourceN_wc`, or an MTRR range)
//! lets the CPU merge and reorder stores to it: on x86, stores to WC memory
//! are weakly ordered, so a plain (release) store of a slot's tag may reach
//! the peer before the slot body written just before it. DPDK's NTB guide
//! reports more than 10x from WC on BAR2/BAR4 (`dpdk:doc/guides/rawdevs/ntb.rst`,
//! "write combining"), so it is worth having, but only with an `sfence`
//! between data and the flag that publishes it.
//!
//! A [`PeerWindow`](super::PeerWindow) marked write-combining
//! ([`PeerWindow::write_combining`](super::PeerWindow::write_combining))
//! makes a [`store_fence`](super::store_fence) before every release store
//! (`write_u64` / `write_u32`: how the transport publishes tags, credits and
//! FreeQ entries). A window that is not WC pays one predictable branch.
//!
//! A [`StoreProbe`] sees the stores of a WC window in program order; a
//! software register model installs one to check that no data store sits
//! between the last fence and a publication, and that no word is written
//! both as data and as a publication.

use std::sync::Arc;

use super::window::store_fence;

/// Observes the stores a write-combined window makes, in program order.
pub trait StoreProbe: Send + Sync {
    /// `len` bytes of data were stored at `offset` (not a publication).
    fn data(&self, offset: usize, len: usize);
    /// A store fence was issued.
    fn fence(&self);
    /// A `size`-byte release store (a publication) was made at `offset`.
    fn publish(&self, offset: usize, size: usize);
}

/// The write-combining policy of one mapping: fence before each publication,
/// optionally observed.
#[derive(Clone, Default)]
pub struct WriteCombining {
    probe: Option<Arc<dyn StoreProbe>>,
}

impl std::fmt::Debug for WriteCombining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteCombining")
            .field("probed", &self.probe.is_some())
            .finish()
    }
}

impl WriteCombining {
    /// The policy for a write-combined mapping, unobserved (hardware).
    pub fn new() -> WriteCombining {
        WriteCombining { probe: None }
    }

    /// The policy with `probe` told of every store (register models, tests).
    pub fn probed(probe: Arc<dyn StoreProbe>) -> WriteCombining {
        WriteCombining { probe: Some(probe) }
    }

    /// Before a publication: the fence (and its record).
    #[inline]
    pub(crate) fn before_publish(&self) {
        store_fence();
        if let Some(p) = &self.probe {
            p.fence();
        }
    }

    /// After a publication at `offset`.
    #[inline]
    pub(crate) fn published(&self, offset: usize, size: usize) {
        if let Some(p) = &self.probe {
            p.publish(offset, size);
        }
    }

    /// After a data store at `offset`.
    #[inline]
    pub(crate) fn data(&self, offset: usize, len: usize) {
        if let Some(p) = &self.probe {
            p.data(offset, len);
        }
    }

    /// After an explicit fence ([`PeerWindow::wmb`](super::PeerWindow::wmb),
    /// or the one ending a non-temporal copy).
    #[inline]
    pub(crate) fn fenced(&self) {
        if let Some(p) = &self.probe {
            p.fence();
        }
    }
}
