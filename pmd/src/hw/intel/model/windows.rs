//! Where a modelled NTB's windows lead: our BAR2/BAR4 aperture is the part
//! of the other side's DRAM that **its** translation registers select
//! (base = a bus address in its DRAM, limit = its BAR start + size), checked
//! as the hardware requires (alignment per part; gen3 also its external
//! limit). Inbound memory is carved from our own side's DRAM at aligned bus
//! addresses.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use super::memory::{DRAM_IOVA, side};
use super::registers::{ModelSide, bar_bus, embar_bus};
use crate::hw::intel::IntelError;
use crate::hw::intel::iova::IovaAllocator;
use crate::hw::intel::memory::{Aperture, InboundMemory, Outbound};
use crate::hw::{LocalWindow, WriteCombining};

/// Our apertures onto the other side, as its registers map them.
pub(crate) struct ModelOutbound {
    pub(super) side: Arc<ModelSide>,
    pub(super) wc: [Option<Arc<WriteCombining>>; 2],
}

impl Outbound for ModelOutbound {
    fn bar_size(&self, mw: usize) -> usize {
        self.side.mem.bar_size()[mw.min(1)]
    }

    fn bar_bus_address(&self, mw: usize) -> u64 {
        bar_bus(self.side.side, mw)
    }

    fn aperture(&self, mw: usize) -> Result<Aperture, IntelError> {
        if mw >= 2 {
            return Err(IntelError::NoSuchWindow { mw });
        }
        let mem = &self.side.mem;
        let peer = 1 - self.side.side;
        let bad = |why: String| IntelError::PeerWindowUnusable { mw, why };
        let bar = mem.bar_size()[mw];
        let base = self.side.peer_reg(side::XLAT + 16 * mw).load(SeqCst);
        let limit = self.side.peer_reg(side::XLAT + 16 * mw + 8).load(SeqCst);
        let start = bar_bus(peer, mw);
        let mut size = limit.saturating_sub(start);
        if size == 0 {
            return Err(bad(format!(
                "its limit {limit:#x} leaves a zero-length window (BAR start {start:#x})"
            )));
        }
        if size > bar as u64 {
            return Err(bad(format!(
                "its limit {limit:#x} is beyond its {bar:#x}-byte BAR at {start:#x}"
            )));
        }
        if !mem.part().is_gen4() {
            let em = self.side.peer_reg(side::EM_XLMT + 8 * mw).load(SeqCst);
            let em_size = em.saturating_sub(embar_bus(peer, mw));
            if em_size == 0 {
                return Err(bad("its external (B2B) limit is not set".into()));
            }
            size = size.min(em_size);
        }
        let align = mem.part().addr_align(bar).max(4096) as u64;
        if !base.is_multiple_of(align) {
            return Err(bad(format!(
                "its base {base:#x} is not a multiple of {align:#x}"
            )));
        }
        let off = base
            .checked_sub(DRAM_IOVA)
            .filter(|o| o + size <= mem.dram_len() as u64)
            .ok_or_else(|| {
                bad(format!(
                    "its base {base:#x} + {size:#x} is outside its memory \
                     ({DRAM_IOVA:#x} + {:#x})",
                    mem.dram_len()
                ))
            })?;
        let region = mem.region();
        let p = region
            .ptr_at(mem.dram_offset(peer) + off as usize, size as usize)
            .map_err(IntelError::Register)?;
        let p = NonNull::new(p).expect("a mapping is not at address 0");
        // SAFETY: `size` bytes at `p` lie in the shared mapping (checked by
        // `ptr_at`), 8-byte aligned (page-aligned mapping, DRAM offsets and
        // `off` multiples of 4 KiB), kept mapped by the region's keepalive;
        // window handles make no references over them.
        Ok(
            // SAFETY: holds for the reasons given just above.
            unsafe {
                Aperture::from_raw(p, size as usize, region.keepalive(), self.wc[mw].clone())
            },
        )
    }
}

/// Our side's DRAM, handed out at aligned bus addresses.
pub(crate) struct ModelInbound {
    pub(super) side: Arc<ModelSide>,
    pub(super) iova: IovaAllocator,
}

impl ModelInbound {
    pub(super) fn new(side: Arc<ModelSide>) -> ModelInbound {
        let len = side.mem.dram_len() as u64;
        ModelInbound {
            side,
            iova: IovaAllocator::new(DRAM_IOVA, DRAM_IOVA + len),
        }
    }
}

impl InboundMemory for ModelInbound {
    fn allocate(&self, size: usize, align: u64) -> Result<LocalWindow, IntelError> {
        let iova = self.iova.alloc(size, align)?;
        let mem = &self.side.mem;
        let off = mem.dram_offset(self.side.side) + (iova - DRAM_IOVA) as usize;
        let p = mem
            .region()
            .ptr_at(off, size)
            .map_err(IntelError::Register)?;
        // SAFETY: `size` bytes at `p` lie in the shared mapping (checked);
        // a raw-pointer fill, no reference; fresh memory starts zeroed, as
        // newly allocated hugepages do.
        unsafe { std::ptr::write_bytes(p, 0, size) };
        // SAFETY: as above, 8-byte aligned (page-aligned mapping and
        // offsets), mapped while the region's keepalive lives.
        Ok(unsafe { LocalWindow::from_raw(p, size, iova, mem.region().keepalive()) })
    }
}
