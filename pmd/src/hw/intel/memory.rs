//! Where an Intel NTB's window memory comes from: the two seams besides the
//! BAR0 registers that differ between hardware and the register model.
//!
//! - [`Outbound`]: our BAR2/BAR4 apertures onto the peer (on hardware a
//!   fixed mapping of the BAR through vfio; in the model, the part of the
//!   shared memory the peer's translation registers select).
//! - [`InboundMemory`]: memory for our inbound windows at a bus address
//!   (IOVA) aligned as the part needs (on hardware hugepage zones from
//!   ntbdk-mempool, DMA-mapped through the vfio container; in the model,
//!   the side's part of the shared memory).

use std::ptr::NonNull;
use std::sync::Arc;

use super::IntelError;
use crate::hw::{Keepalive, LocalWindow, WriteCombining};

/// One outbound aperture: a mapping whose writes reach the peer.
pub struct Aperture {
    base: NonNull<u8>,
    len: usize,
    keep: Keepalive,
    wc: Option<Arc<WriteCombining>>,
}

// SAFETY: an aperture is a raw mapping kept alive by `keep`; it is only
// turned into window handles, which never make references over it.
unsafe impl Send for Aperture {}

impl std::fmt::Debug for Aperture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aperture")
            .field("len", &self.len)
            .field("write_combining", &self.wc.is_some())
            .finish_non_exhaustive()
    }
}

impl Aperture {
    /// An aperture of `len` bytes at `base`, kept mapped by `keep`;
    /// write-combining when `wc` is given.
    ///
    /// # Safety
    /// `base..base+len` must be writable (and readable, for the counted
    /// non-posted read), 8-byte aligned, mapped while `keep` lives, and
    /// covered by no Rust reference or slice.
    pub unsafe fn from_raw(
        base: NonNull<u8>,
        len: usize,
        keep: Keepalive,
        wc: Option<Arc<WriteCombining>>,
    ) -> Aperture {
        Aperture {
            base,
            len,
            keep,
            wc,
        }
    }

    /// Bytes of the aperture.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the aperture has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether stores to it are write-combined.
    pub fn is_write_combining(&self) -> bool {
        self.wc.is_some()
    }

    /// Its parts: base, length, keepalive, write-combining policy.
    pub(crate) fn parts(&self) -> (NonNull<u8>, usize, Keepalive, Option<Arc<WriteCombining>>) {
        (self.base, self.len, self.keep.clone(), self.wc.clone())
    }
}

/// Our BAR2 (window 0) and BAR4 (window 1) apertures onto the peer.
pub trait Outbound: Send + Sync {
    /// Bytes of BAR `mw` (what `mw_get_align` reports as the maximum size).
    fn bar_size(&self, mw: usize) -> usize;
    /// The bus address of our BAR `mw`'s start (sysfs `resource` on
    /// hardware): the inbound limit register takes BAR start + size
    /// (`linux:drivers/ntb/hw/intel/ntb_hw_gen3.c` `intel_ntb3_mw_set_trans`).
    fn bar_bus_address(&self, mw: usize) -> u64;
    /// The aperture of window `mw` as it is now.
    fn aperture(&self, mw: usize) -> Result<Aperture, IntelError>;
}

/// Memory for our inbound windows.
pub trait InboundMemory: Send + Sync {
    /// `size` bytes of memory at a bus address that is a multiple of
    /// `align` (a power of two), mapped for the device to write.
    fn allocate(&self, size: usize, align: u64) -> Result<LocalWindow, IntelError>;

    /// Whether what it allocated so far is all on hugepages (`None`: it
    /// cannot say, or allocated nothing yet).
    fn on_hugepages(&self) -> Option<bool> {
        None
    }
}
