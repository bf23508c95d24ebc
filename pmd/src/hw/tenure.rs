//! A host's tenure of its place on a fabric, checked before every posted
//! write it makes.
//!
//! A fabric that declares a stalled host dead gives its place (slot, port)
//! to the next host that joins. The stalled host may wake up any time and
//! go on writing into its peers' windows at the offsets of that place — the
//! new occupant's mailbox and rings. A [`Tenure`] stops that: it names the
//! word that records who holds the place (the emulated fabric's slot word:
//! state, generation, owner) and the value it had when we joined; a peer
//! window carrying one refuses every write once the word differs
//! ([`HwError::SlotLost`], nothing written). The check is one relaxed load
//! of a line written only on join, leave and reclaim. The host's own window
//! is checked the same way before the transport writes it
//! ([`NtbDevice::check_tenure`](super::NtbDevice::check_tenure)): on a
//! fabric whose windows are one shared region it is the new occupant's.

use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{HwError, Result};
use super::window::Keepalive;

/// The word that records who holds a place on the fabric, and its value
/// while we hold it.
#[derive(Clone)]
pub struct Tenure {
    word: *mut u64,
    held: u64,
    port: u16,
    _keep: Keepalive,
}

// The word is only ever accessed atomically, in a mapping `_keep` keeps
// alive; the handle holds no other state.
// SAFETY: as just said.
unsafe impl Send for Tenure {}
// SAFETY: as for `Send`: shared access is atomic loads only.
unsafe impl Sync for Tenure {}

impl std::fmt::Debug for Tenure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenure")
            .field("port", &self.port)
            .field("held", &format_args!("{:#x}", self.held))
            .finish_non_exhaustive()
    }
}

impl Tenure {
    /// A tenure of place `port` while the u64 at `word` reads `held`.
    ///
    /// # Safety
    /// `word` must be 8-byte aligned, valid for as long as `keep` lives, and
    /// accessed by every party only atomically.
    pub unsafe fn from_raw(word: *mut u64, held: u64, port: u16, keep: Keepalive) -> Self {
        Self {
            word,
            held,
            port,
            _keep: keep,
        }
    }

    /// `Ok` while we still hold the place.
    #[inline]
    pub fn check(&self) -> Result<()> {
        // SAFETY: per `from_raw`: aligned, alive while `_keep` is, and only
        // accessed atomically.
        let w = unsafe { AtomicU64::from_ptr(self.word) };
        if w.load(Ordering::Relaxed) == self.held {
            Ok(())
        } else {
            Err(HwError::SlotLost { port: self.port })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_changed_word_ends_the_tenure() {
        let word = Arc::new(AtomicU64::new(7));
        // SAFETY: the word is an AtomicU64 (aligned), kept alive by the
        // tenure's keepalive, accessed only atomically.
        let t = unsafe { Tenure::from_raw(word.as_ptr(), 7, 3, word.clone()) };
        assert!(t.check().is_ok());
        word.store(8, Ordering::Relaxed);
        assert!(matches!(t.check(), Err(HwError::SlotLost { port: 3 })));
    }
}
