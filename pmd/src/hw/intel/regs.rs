//! Register offsets and bits of the Intel Xeon NTB (gen3 Skylake-SP, gen4
//! Ice Lake-SP and Sapphire Rapids): BAR0 (MMIO) and PCI config space.
//!
//! Hardware facts, each with the public driver header that names it:
//! `linux:drivers/ntb/hw/intel/ntb_hw_gen3.h` (gen3),
//! `linux:drivers/ntb/hw/intel/ntb_hw_gen4.h` (gen4),
//! `linux:drivers/ntb/hw/intel/ntb_hw_intel.h` (shared link-status bits) and
//! `dpdk:drivers/raw/ntb/ntb_hw_intel.h` (the same map as DPDK uses it).
//! Only offsets are taken from them; no code.

/// PCI vendor ID of Intel.
pub const VENDOR_INTEL: u16 = 0x8086;
/// Device ID of the Skylake-SP NTB ("gen3";
/// `linux:drivers/ntb/hw/intel/ntb_hw_intel.h` `PCI_DEVICE_ID_INTEL_NTB_B2B_SKX`).
pub const DEVICE_GEN3_SKX: u16 = 0x201C;
/// Device ID of the Ice Lake-SP and Sapphire Rapids NTB ("gen4", told apart
/// by revision; `linux:drivers/ntb/hw/intel/ntb_hw_intel.h`
/// `PCI_DEVICE_ID_INTEL_NTB_B2B_ICX`).
pub const DEVICE_GEN4: u16 = 0x347E;

// ---- BAR0, both generations ----

/// NTB control `NTBCNTL`, 32 bits (gen3 `GEN3_NTBCNTL_OFFSET`, gen4
/// `GEN4_NTBCNTL_OFFSET`).
pub const NTBCNTL: usize = 0x0000;
/// `NTBCNTL`: configuration lock (`NTB_CTL_CFG_LOCK`, ntb_hw_intel.h).
pub const NTBCNTL_CFG_LOCK: u32 = 0x0001;
/// `NTBCNTL`: link disable (`NTB_CTL_DISABLE`, ntb_hw_intel.h).
pub const NTBCNTL_DISABLE: u32 = 0x0002;
/// `NTBCNTL`: snoop bits for BAR2/3 and BAR4/5 in both directions
/// (`NTB_CTL_{P2S,S2P}_BAR{2,4}_SNOOP` = 0x4, 0x10, 0x40, 0x100; gen4 names
/// them `E2I`/`I2E`; ntb_hw_intel.h, gen4 `intel_ntb4_link_enable`).
pub const NTBCNTL_SNOOP: u32 = 0x0004 | 0x0010 | 0x0040 | 0x0100;

/// Inbound translation base of memory window `mw` (64 bits; gen3
/// `GEN3_IMBAR1XBASE_OFFSET` 0x10 / `GEN3_IMBAR2XBASE_OFFSET` 0x20, gen4
/// `GEN4_IM23XBASE_OFFSET` / `GEN4_IM45XBASE_OFFSET`, same offsets).
pub const fn xbase(mw: usize) -> usize {
    0x0010 + 0x10 * mw
}

/// Inbound translation limit of memory window `mw`: an absolute bus address,
/// BAR start + size (64 bits; gen3 `GEN3_IMBAR1XLMT_OFFSET` 0x18 /
/// `GEN3_IMBAR2XLMT_OFFSET` 0x28, gen4 `GEN4_IM23XLMT_OFFSET` /
/// `GEN4_IM45XLMT_OFFSET`).
pub const fn xlmt(mw: usize) -> usize {
    0x0018 + 0x10 * mw
}

/// Local doorbell status, read = pending, write 1 to clear (64 bits; gen3
/// `GEN3_IM_INT_STATUS_OFFSET`, gen4 `GEN4_IM_INT_STATUS_OFFSET`).
pub const DB_STATUS: usize = 0x0040;
/// Local doorbell mask, 1 = masked (64 bits; `GEN3_IM_INT_DISABLE_OFFSET`,
/// `GEN4_IM_INT_DISABLE_OFFSET`).
pub const DB_MASK: usize = 0x0048;
/// Local scratchpad `i` of 16 (32 bits each; `GEN3_IM_SPAD_OFFSET`,
/// `GEN4_IM_SPAD_OFFSET`).
pub const fn spad(i: usize) -> usize {
    0x0080 + 4 * i
}
/// Ring the peer's doorbell bit `bit` by writing 1 here (32 bits per bit;
/// `GEN3_IM_DOORBELL_OFFSET`, `GEN4_IM_DOORBELL_OFFSET`; DPDK
/// `intel_ntb_peer_db_set` writes 1 at `+ 4 * bit`).
pub const fn peer_doorbell(bit: u32) -> usize {
    0x0100 + 4 * bit as usize
}
/// Doorbell bits the hardware has (`GEN3_DB_COUNT` = `GEN4_DB_COUNT` = 32).
pub const DB_COUNT: u32 = 32;
/// The link-state-change bit of the doorbell status (`GEN3_DB_LINK` =
/// `GEN4_DB_LINK` = 32).
pub const DB_LINK_BIT: u64 = 1 << 32;
/// Scratchpads per side (`GEN3_SPAD_COUNT` = `GEN4_SPAD_COUNT` = 16).
pub const SPAD_COUNT: usize = 16;

// ---- BAR0, gen3 only ----

/// The peer's scratchpad `i`, reached through the local BAR0 on gen3
/// (`GEN3_B2B_SPAD_OFFSET` 0x180; DPDK `XEON_B2B_SPAD_OFFSET`).
pub const fn gen3_peer_spad(i: usize) -> usize {
    0x0180 + 4 * i
}
/// Secondary-side PCI command register, 16 bits (`GEN3_SPCICMD_OFFSET`);
/// written `MEMORY | MASTER` at bring-up (`gen3_init_ntb`).
pub const GEN3_SPCICMD: usize = 0x4504;
/// `PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER`.
pub const PCI_COMMAND_MEMORY_MASTER: u32 = 0x0006;
/// External (B2B) memory window `mw` limit (64 bits; `GEN3_EMBAR1XLMT_OFFSET`
/// 0x4018 / `GEN3_EMBAR2XLMT_OFFSET` 0x4028; set by `intel_ntb3_mw_set_trans`).
pub const fn gen3_embar_xlmt(mw: usize) -> usize {
    0x4018 + 0x10 * mw
}
/// External BAR `mw` base as the secondary side sees it (64 bits;
/// `GEN3_EMBAR1_OFFSET` 0x4518 / `GEN3_EMBAR2_OFFSET` 0x4520).
pub const fn gen3_embar(mw: usize) -> usize {
    0x4518 + 8 * mw
}

// ---- BAR0, gen4 only ----

/// The peer's scratchpad `i` through the local BAR0 on gen4
/// (`GEN4_EM_SPAD_OFFSET` 0x8080).
pub const fn gen4_peer_spad(i: usize) -> usize {
    0x8080 + 4 * i
}
/// Window `mw` base index, log2 of the window size, 16 bits
/// (`GEN4_IM23XBASEIDX_OFFSET` 0x74 / `GEN4_IM45XBASEIDX_OFFSET` 0x76;
/// written on Ice Lake for the `NTB_HWERR_BAR_ALIGN` erratum).
pub const fn gen4_xbaseidx(mw: usize) -> usize {
    0x0074 + 2 * mw
}
/// Link control, 16 bits (`GEN4_LINK_CTRL_OFFSET` 0xB050).
pub const GEN4_LINK_CTRL: usize = 0xB050;
/// Link status, 16 bits (`GEN4_LINK_STATUS_OFFSET` 0xB052): gen4 has it in
/// MMIO, gen3 in config space.
pub const GEN4_LINK_STATUS: usize = 0xB052;
/// `LINK_CTRL`: link disable (`GEN4_LINK_CTRL_LINK_DISABLE`).
pub const GEN4_LINK_CTRL_DISABLE: u32 = 0x0010;
/// Slot status, 16 bits (`GEN4_SLOTSTS` 0xB05A); `DLLSCS` (0x100) is
/// written before the link bit is cleared (`intel_ntb4_link_is_up` path).
pub const GEN4_SLOTSTS: usize = 0xB05A;
/// `SLOTSTS.DLLSCS` (`GEN4_SLOTSTS_DLLSCS`).
pub const GEN4_SLOTSTS_DLLSCS: u32 = 0x0100;
/// Port definition 0, 32 bits (`GEN4_PPD0_OFFSET` 0xB0D4).
pub const GEN4_PPD0: usize = 0xB0D4;
/// `PPD0`: start link training (`GEN4_PPD_LINKTRN`).
pub const GEN4_PPD_LINKTRN: u32 = 0x0008;
/// Port definition 1 (topology), 32 bits (`GEN4_PPD1_OFFSET` 0xB4C0).
pub const GEN4_PPD1: usize = 0xB4C0;
/// Bytes of BAR0 the backend reaches (gen4 offsets go up to 0xF040).
pub const BAR0_MIN_LEN: usize = 0x1_0000;

// ---- config space ----

/// Vendor and device ID, 32 bits (PCI header).
pub const CFG_ID: usize = 0x00;
/// Revision ID in the low byte (PCI header 0x08).
pub const CFG_REVISION: usize = 0x08;
/// Gen3 port definition, 8 bits at 0xD4 of config space (`XEON_PPD_OFFSET`,
/// `linux:drivers/ntb/hw/intel/ntb_hw_intel.h`; read by `gen3_init_dev`).
pub const GEN3_CFG_PPD: usize = 0x00D4;
/// Gen3 link status `LNKSTS`, 16 bits at 0x1A2 of config space
/// (`GEN3_LINK_STATUS_OFFSET`, ntb_hw_gen3.h); read as the upper half of the
/// dword at 0x1A0.
pub const GEN3_CFG_LNKSTS: usize = 0x01A2;
/// Link status: link active (`NTB_LNK_STA_ACTIVE_BIT` 0x2000, ntb_hw_intel.h).
pub const LNK_STA_ACTIVE: u32 = 0x2000;
/// Link status: speed in bits 3:0 (`NTB_LNK_STA_SPEED_MASK`).
pub const LNK_STA_SPEED_MASK: u32 = 0x000F;
/// Link status: width in bits 9:4 (`NTB_LNK_STA_WIDTH_MASK`).
pub const LNK_STA_WIDTH_MASK: u32 = 0x03F0;

/// Reads the 16-bit register at `offset` (2-byte aligned) of `mmio` as half
/// of its dword (the `Mmio` trait has 32- and 64-bit accesses only).
pub fn read16(mmio: &dyn crate::hw::mmio::Mmio, offset: usize) -> crate::hw::Result<u16> {
    let dword = mmio.read32(offset & !3)?;
    Ok((dword >> ((offset & 2) * 8)) as u16)
}

/// Writes the 16-bit register at `offset` ([`Mmio::write16`]: 16 bits
/// alone where the block can store them, else a dword write that leaves the
/// other half as `other`; callers pass the value that is harmless there:
/// the other half's current value for a plain register, 0 for a
/// write-1-to-clear status register).
///
/// [`Mmio::write16`]: crate::hw::mmio::Mmio::write16
pub fn write16(
    mmio: &dyn crate::hw::mmio::Mmio,
    offset: usize,
    value: u16,
    other: u16,
) -> crate::hw::Result<()> {
    mmio.write16(offset, value, other)
}
