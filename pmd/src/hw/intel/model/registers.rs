//! The register file of one modelled NTB, with the hardware's side effects
//! (facts of `linux:drivers/ntb/hw/intel/ntb_hw_gen3.h`, `ntb_hw_gen4.h`,
//! as listed in [`regs`]):
//!
//! - doorbell status (0x40) is write-1-to-clear;
//! - a write at `0x100 + 4n` sets bit n in the **other** side's status;
//! - peer scratchpad offsets (0x180 gen3, 0x8080 gen4) reach the other
//!   side's scratchpads (reads return all ones while the link is down, as a
//!   read that completes with an error does);
//! - the link is up while both sides are present and enabled (gen3:
//!   `NTBCNTL.DISABLE` clear; gen4: `LINK_CTRL` disable clear and `PPD0`
//!   training started); every change sets the link bit (32) on both sides;
//!   the link status reads in config space (gen3) or MMIO 0xB052 (gen4);
//! - the port definition (config 0xD4 on gen3, MMIO PPD1 on gen4) says
//!   which side this is.
//!
//! Anything else reads back what was written (a private [`RegisterFile`]).

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use super::memory::{ModelMemory, side};
use crate::hw::Result;
use crate::hw::intel::part::B2bSide;
use crate::hw::intel::regs;
use crate::hw::mmio::{Mmio, RegisterFile, check_access};

/// Link status a model reports when up: active, Gen3 speed, x16.
const LNKSTS_UP: u32 = regs::LNK_STA_ACTIVE | 0x3 | (16 << 4);

/// One side's registers in the shared memory, plus its private ones.
pub(crate) struct ModelSide {
    pub(super) mem: ModelMemory,
    pub(super) side: usize,
    /// Our attach token: once another model takes the side over, this one
    /// is a dead host's (its writes are lost, its reads return all ones).
    token: u64,
    private: RegisterFile,
    config: RegisterFile,
}

impl std::fmt::Debug for ModelSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSide")
            .field("side", &self.side)
            .finish_non_exhaustive()
    }
}

/// The bus address of side `s`'s BAR `mw` (aligned for any model BAR).
pub(crate) fn bar_bus(s: usize, mw: usize) -> u64 {
    0x4000_0000_0000 + (s as u64) * 0x1000_0000_0000 + (mw as u64) * 0x100_0000_0000
}

/// The gen3 external BAR `mw` of side `s` as its secondary side sees it.
pub(crate) fn embar_bus(s: usize, mw: usize) -> u64 {
    0x6000_0000_0000 + (s as u64) * 0x1000_0000_0000 + (mw as u64) * 0x100_0000_0000
}

impl ModelSide {
    /// Attaches as side `side` (a power-on reset of its registers; a side
    /// that was present is taken over, as a rebooted host would).
    pub(super) fn attach(mem: &ModelMemory, side: B2bSide) -> Arc<ModelSide> {
        let s = side.port() as usize;
        let part = mem.part();
        let m = ModelSide {
            mem: mem.clone(),
            side: s,
            token: mem.next_token(),
            private: RegisterFile::new(regs::BAR0_MIN_LEN),
            config: RegisterFile::new(4096),
        };
        let id = u32::from(regs::VENDOR_INTEL) | (u32::from(part.device_id()) << 16);
        let _ = m.config.write32(regs::CFG_ID, id);
        let _ = m
            .config
            .write32(regs::CFG_REVISION, u32::from(part.revision()));
        // Reset: link disabled, every doorbell masked, nothing translated.
        m.reg(side::OWNER).store(m.token, SeqCst);
        m.reg(side::PRESENT).store(0, SeqCst);
        m.recompute_link();
        m.reg(side::NTBCNTL).store(
            u64::from(regs::NTBCNTL_CFG_LOCK | regs::NTBCNTL_DISABLE),
            SeqCst,
        );
        m.reg(side::LINK_CTRL)
            .store(u64::from(regs::GEN4_LINK_CTRL_DISABLE), SeqCst);
        m.reg(side::PPD0).store(0, SeqCst);
        m.reg(side::DB_STATUS).store(0, SeqCst);
        m.reg(side::DB_MASK).store(u64::MAX, SeqCst);
        for w in 0..2 {
            m.reg(side::XLAT + 16 * w).store(0, SeqCst);
            m.reg(side::XLAT + 16 * w + 8).store(0, SeqCst);
            m.reg(side::EM_XLMT + 8 * w).store(0, SeqCst);
        }
        for i in 0..regs::SPAD_COUNT {
            m.mem.spad(s, i).store(0, SeqCst);
        }
        m.reg(side::PRESENT).store(1, SeqCst);
        m.recompute_link();
        Arc::new(m)
    }

    /// Whether this model still owns its side.
    fn live(&self) -> bool {
        self.reg(side::OWNER).load(SeqCst) == self.token
    }

    fn reg(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        self.mem.reg(self.side, off)
    }

    pub(super) fn peer_reg(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        self.mem.reg(1 - self.side, off)
    }

    fn enabled(&self, s: usize) -> bool {
        let r = |off| self.mem.reg(s, off).load(SeqCst) as u32;
        r(side::PRESENT) != 0
            && if self.mem.part().is_gen4() {
                r(side::LINK_CTRL) & regs::GEN4_LINK_CTRL_DISABLE == 0
                    && r(side::PPD0) & regs::GEN4_PPD_LINKTRN != 0
            } else {
                r(side::NTBCNTL) & regs::NTBCNTL_DISABLE == 0
            }
    }

    /// Whether the link is up: both sides present and enabled.
    pub(crate) fn link_up(&self) -> bool {
        self.enabled(0) && self.enabled(1)
    }

    /// Brings the shared link word up to date; a change sets the link bit
    /// of both sides. Every writer re-checks after its own update, so two
    /// sides changing at once settle on the true state.
    fn recompute_link(&self) {
        loop {
            let up = u64::from(self.link_up());
            if self.mem.link_word().swap(up, SeqCst) != up {
                for s in 0..2 {
                    self.mem
                        .reg(s, side::DB_STATUS)
                        .fetch_or(regs::DB_LINK_BIT, SeqCst);
                }
            }
            if u64::from(self.link_up()) == up {
                return;
            }
        }
    }

    fn lnksts(&self) -> u32 {
        if self.link_up() { LNKSTS_UP } else { 0 }
    }

    fn ppd(&self) -> u32 {
        let side = if self.side == 0 {
            B2bSide::Usd
        } else {
            B2bSide::Dsd
        };
        self.mem.part().ppd_for(side)
    }

    fn peer_spad_index(&self, offset: usize) -> Option<usize> {
        let base = if self.mem.part().is_gen4() {
            regs::gen4_peer_spad(0)
        } else {
            regs::gen3_peer_spad(0)
        };
        (base..base + 4 * regs::SPAD_COUNT)
            .contains(&offset)
            .then(|| (offset - base) / 4)
    }

    /// The shared 64-bit register at `offset` (8-byte aligned), if modelled.
    fn shared64(&self, offset: usize) -> Option<&std::sync::atomic::AtomicU64> {
        let gen3 = !self.mem.part().is_gen4();
        Some(match offset {
            regs::NTBCNTL => self.reg(side::NTBCNTL),
            0x10..=0x28 => self.reg(side::XLAT + (offset - 0x10)),
            regs::DB_STATUS => self.reg(side::DB_STATUS),
            regs::DB_MASK => self.reg(side::DB_MASK),
            0x4018 | 0x4028 if gen3 => self.reg(side::EM_XLMT + (offset - 0x4018) / 2),
            _ => return None,
        })
    }

    fn bar_read32(&self, offset: usize) -> Result<u32> {
        check_access(offset, 4, regs::BAR0_MIN_LEN)?;
        if !self.live() {
            return Ok(u32::MAX);
        }
        let gen4 = self.mem.part().is_gen4();
        if let Some(i) = (regs::spad(0)..regs::spad(regs::SPAD_COUNT))
            .contains(&offset)
            .then(|| (offset - regs::spad(0)) / 4)
        {
            return Ok(self.mem.spad(self.side, i).load(SeqCst));
        }
        if let Some(i) = self.peer_spad_index(offset) {
            return Ok(if self.link_up() {
                self.mem.spad(1 - self.side, i).load(SeqCst)
            } else {
                u32::MAX
            });
        }
        if (regs::peer_doorbell(0)..regs::peer_doorbell(regs::DB_COUNT)).contains(&offset) {
            return Ok(0);
        }
        match offset {
            o if gen4 && o == regs::GEN4_LINK_CTRL => {
                let ctrl = self.reg(side::LINK_CTRL).load(SeqCst) as u32 & 0xFFFF;
                return Ok(ctrl | (self.lnksts() << 16));
            }
            o if gen4 && o == regs::GEN4_PPD0 => {
                return Ok(self.reg(side::PPD0).load(SeqCst) as u32);
            }
            o if gen4 && o == regs::GEN4_PPD1 => return Ok(self.ppd()),
            _ => {}
        }
        if let Some(w) = self.shared64(offset & !7) {
            return Ok((w.load(SeqCst) >> ((offset & 4) * 8)) as u32);
        }
        self.private.read32(offset)
    }

    fn bar_write32(&self, offset: usize, value: u32) -> Result<()> {
        check_access(offset, 4, regs::BAR0_MIN_LEN)?;
        if !self.live() {
            return Ok(());
        }
        let gen4 = self.mem.part().is_gen4();
        let peer = 1 - self.side;
        if let Some(i) = (regs::spad(0)..regs::spad(regs::SPAD_COUNT))
            .contains(&offset)
            .then(|| (offset - regs::spad(0)) / 4)
        {
            self.mem.spad(self.side, i).store(value, SeqCst);
            return Ok(());
        }
        if let Some(i) = self.peer_spad_index(offset) {
            // A posted write into the other host's register: lost while
            // the link is down.
            if self.link_up() {
                self.mem.spad(peer, i).store(value, SeqCst);
            }
            return Ok(());
        }
        if (regs::peer_doorbell(0)..regs::peer_doorbell(regs::DB_COUNT)).contains(&offset) {
            let bit = (offset - regs::peer_doorbell(0)) / 4;
            if value & 1 != 0 && self.link_up() {
                self.peer_reg(side::DB_STATUS).fetch_or(1 << bit, SeqCst);
            }
            return Ok(());
        }
        match offset {
            o if gen4 && o == regs::GEN4_LINK_CTRL => {
                // LINK_STATUS (upper half) is not writable here.
                self.reg(side::LINK_CTRL)
                    .store(u64::from(value & 0xFFFF), SeqCst);
                self.recompute_link();
                return Ok(());
            }
            o if gen4 && o == regs::GEN4_PPD0 => {
                self.reg(side::PPD0).store(u64::from(value), SeqCst);
                self.recompute_link();
                return Ok(());
            }
            o if gen4 && o == regs::GEN4_PPD1 => return Ok(()),
            _ => {}
        }
        if let Some(w) = self.shared64(offset & !7) {
            let shift = (offset & 4) * 8;
            if offset & !7 == regs::DB_STATUS {
                w.fetch_and(!(u64::from(value) << shift), SeqCst);
            } else {
                let mask = 0xFFFF_FFFFu64 << shift;
                let _ = w.fetch_update(SeqCst, SeqCst, |old| {
                    Some((old & !mask) | (u64::from(value) << shift))
                });
                if offset == regs::NTBCNTL {
                    self.recompute_link();
                }
            }
            return Ok(());
        }
        self.private.write32(offset, value)
    }

    fn bar_read64(&self, offset: usize) -> Result<u64> {
        check_access(offset, 8, regs::BAR0_MIN_LEN)?;
        if !self.live() {
            return Ok(u64::MAX);
        }
        let gen3 = !self.mem.part().is_gen4();
        if gen3 && (offset == regs::gen3_embar(0) || offset == regs::gen3_embar(1)) {
            let mw = (offset - regs::gen3_embar(0)) / 8;
            return Ok(embar_bus(self.side, mw));
        }
        if let Some(w) = self.shared64(offset) {
            return Ok(w.load(SeqCst));
        }
        let lo = self.bar_read32(offset)?;
        let hi = self.bar_read32(offset + 4)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    fn bar_write64(&self, offset: usize, value: u64) -> Result<()> {
        check_access(offset, 8, regs::BAR0_MIN_LEN)?;
        if !self.live() {
            return Ok(());
        }
        if let Some(w) = self.shared64(offset) {
            if offset == regs::DB_STATUS {
                w.fetch_and(!value, SeqCst);
            } else {
                w.store(value, SeqCst);
                if offset == regs::NTBCNTL {
                    self.recompute_link();
                }
            }
            return Ok(());
        }
        self.bar_write32(offset, value as u32)?;
        self.bar_write32(offset + 4, (value >> 32) as u32)
    }

    fn config_read32(&self, offset: usize) -> Result<u32> {
        check_access(offset, 4, 4096)?;
        let gen3 = !self.mem.part().is_gen4();
        Ok(match offset {
            o if gen3 && o == regs::GEN3_CFG_PPD => self.ppd(),
            o if gen3 && o == regs::GEN3_CFG_LNKSTS & !3 => {
                (self.config.read32(o)? & 0xFFFF) | (self.lnksts() << 16)
            }
            o => self.config.read32(o)?,
        })
    }

    /// Detaches: the side is no longer present (unless another model took
    /// it over since).
    fn detach(&self) {
        if self
            .reg(side::OWNER)
            .compare_exchange(self.token, 0, SeqCst, SeqCst)
            .is_ok()
        {
            self.reg(side::PRESENT).store(0, SeqCst);
            self.recompute_link();
        }
    }
}

impl Drop for ModelSide {
    fn drop(&mut self) {
        self.detach();
    }
}

/// BAR0 of a modelled NTB: what [`IntelNtb`](crate::hw::intel::IntelNtb)
/// drives in tests.
#[derive(Debug, Clone)]
pub struct ModelBar(pub(super) Arc<ModelSide>);

impl Mmio for ModelBar {
    fn len(&self) -> usize {
        regs::BAR0_MIN_LEN
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        self.0.bar_read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        self.0.bar_write32(offset, value)
    }
    fn read64(&self, offset: usize) -> Result<u64> {
        self.0.bar_read64(offset)
    }
    fn write64(&self, offset: usize, value: u64) -> Result<()> {
        self.0.bar_write64(offset, value)
    }
}

/// Config space of a modelled NTB (IDs, revision, gen3 PPD and link status).
#[derive(Debug, Clone)]
pub struct ModelConfig(pub(super) Arc<ModelSide>);

impl Mmio for ModelConfig {
    fn len(&self) -> usize {
        4096
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        self.0.config_read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        self.0.config.write32(offset, value)
    }
    fn read64(&self, offset: usize) -> Result<u64> {
        check_access(offset, 8, 4096)?;
        let lo = self.read32(offset)?;
        let hi = self.read32(offset + 4)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }
    fn write64(&self, offset: usize, value: u64) -> Result<()> {
        self.0.config.write64(offset, value)
    }
}
