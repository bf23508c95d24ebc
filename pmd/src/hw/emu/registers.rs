//! Direct access to one slot's registers, for tools acting as that slot's
//! host (`ntb-tool db read`, `spad write`...).

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use super::config::FabricConfig;
use super::layout::SlotRegs;
use crate::hw::{HwError, Port, Result};

/// The doorbell and scratchpad registers of one slot, as its host sees them.
/// From [`EmuFabric::registers`](super::EmuFabric::registers).
pub struct SlotRegisters<'a> {
    pub(crate) regs: &'a SlotRegs,
    pub(crate) cfg: &'a FabricConfig,
    pub(crate) slot: Port,
}

impl std::fmt::Debug for SlotRegisters<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRegisters")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl SlotRegisters<'_> {
    /// The slot.
    pub fn slot(&self) -> Port {
        self.slot
    }

    /// Pending doorbell bits.
    pub fn db(&self) -> u64 {
        self.regs.db.load(Acquire)
    }

    /// Sets doorbell `bits` (as a peer's ring would). Bits outside the
    /// fabric's doorbell are an error.
    pub fn db_set(&self, bits: u64) -> Result<()> {
        self.check_bits(bits)?;
        self.regs.db.fetch_or(bits, AcqRel);
        self.regs.db_rings.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Clears doorbell `bits`.
    pub fn db_clear(&self, bits: u64) {
        self.regs.db.fetch_and(!bits, AcqRel);
    }

    /// The doorbell mask.
    pub fn db_mask(&self) -> u64 {
        self.regs.db_mask.load(Acquire)
    }

    /// Sets `bits` in the mask.
    pub fn db_set_mask(&self, bits: u64) -> Result<()> {
        self.check_bits(bits)?;
        self.regs.db_mask.fetch_or(bits, AcqRel);
        Ok(())
    }

    /// Clears `bits` from the mask.
    pub fn db_clear_mask(&self, bits: u64) {
        self.regs.db_mask.fetch_and(!bits, AcqRel);
    }

    /// Scratchpad registers of this fabric.
    pub fn spad_count(&self) -> usize {
        self.cfg.spads
    }

    /// Reads scratchpad `index`.
    pub fn spad(&self, index: usize) -> Result<u32> {
        self.check_spad(index)?;
        Ok(self.regs.spads[index].load(Acquire))
    }

    /// Writes scratchpad `index`.
    pub fn set_spad(&self, index: usize, value: u32) -> Result<()> {
        self.check_spad(index)?;
        self.regs.spads[index].store(value, Release);
        Ok(())
    }

    fn check_spad(&self, index: usize) -> Result<()> {
        if index >= self.cfg.spads {
            return Err(HwError::NoSuchSpad {
                index,
                count: self.cfg.spads,
            });
        }
        Ok(())
    }

    fn check_bits(&self, bits: u64) -> Result<()> {
        let valid = self.cfg.db_valid_mask();
        if bits & !valid != 0 {
            return Err(HwError::Invalid(format!(
                "doorbell bits {bits:#x} outside the fabric's {} bits (mask {valid:#x})",
                self.cfg.db_bits
            )));
        }
        Ok(())
    }
}
