//! Which Intel NTB this is (gen3 Skylake-SP, gen4 Ice Lake-SP or Sapphire
//! Rapids) and which side of the back-to-back link we are (the port).
//!
//! Identification by device ID and revision follows
//! `linux:drivers/ntb/hw/intel/ntb_hw_intel.h` (`pdev_is_gen3`, `pdev_is_ICX`:
//! 0x347E with revision 0x02..=0x0F, `pdev_is_SPR`: revision above 0x0F).
//! The topology comes from the port definition register: gen3 config-space
//! PPD (`gen3_ppd_topo`: connection type in bits 1:0, 1 = B2B; bit 0x10 =
//! DSD; bit 0x40 = split BAR), gen4 MMIO PPD1 (`gen4_ppd_topo` /
//! `spr_ppd_topo` in `linux:drivers/ntb/hw/intel/ntb_hw_gen4.c`: connection
//! in mask 0x0300 (ICX) or 0x0700 (SPR), 0x0200 = B2B; DSD bit 0x1000 (ICX)
//! or 0x4000 (SPR)). Only back-to-back is driven, as DPDK does
//! (`dpdk:drivers/raw/ntb/ntb_hw_intel.c` `intel_ntb_dev_init`).

use super::IntelError;
use super::regs::{DEVICE_GEN3_SKX, DEVICE_GEN4};
use crate::hw::Port;

/// The NTB part, which decides the register differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntelPart {
    /// Skylake-SP (gen3, 8086:201C).
    Gen3Skx,
    /// Ice Lake-SP (gen4, 8086:347E revision 0x02..=0x0F).
    Gen4Icx,
    /// Sapphire Rapids (gen4 register map, 8086:347E revision above 0x0F).
    Gen4Spr,
}

/// Which end of the back-to-back link this NTB is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum B2bSide {
    /// Upstream device (`NTB_TOPO_B2B_USD`): port 0.
    Usd,
    /// Downstream device (`NTB_TOPO_B2B_DSD`): port 1.
    Dsd,
}

impl B2bSide {
    /// Our port: USD is 0 and DSD is 1 (Linux `NTB_PORT_PRI_USD` /
    /// `NTB_PORT_SEC_DSD`, `linux:include/linux/ntb.h`).
    pub fn port(self) -> Port {
        match self {
            B2bSide::Usd => 0,
            B2bSide::Dsd => 1,
        }
    }
}

impl IntelPart {
    /// The part for PCI `device` at `revision`, if ntbdk drives it.
    pub fn identify(device: u16, revision: u8) -> Result<IntelPart, IntelError> {
        match (device, revision) {
            (DEVICE_GEN3_SKX, _) => Ok(IntelPart::Gen3Skx),
            (DEVICE_GEN4, 0x02..=0x0F) => Ok(IntelPart::Gen4Icx),
            (DEVICE_GEN4, 0x10..) => Ok(IntelPart::Gen4Spr),
            _ => Err(IntelError::UnknownPart { device, revision }),
        }
    }

    /// Whether the register map is gen4's.
    pub fn is_gen4(self) -> bool {
        !matches!(self, IntelPart::Gen3Skx)
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            IntelPart::Gen3Skx => "Skylake-SP (gen3)",
            IntelPart::Gen4Icx => "Ice Lake-SP (gen4)",
            IntelPart::Gen4Spr => "Sapphire Rapids (gen4)",
        }
    }

    /// Required alignment of an inbound translation address for a window of
    /// `bar_size` bytes: the whole BAR size on gen3 and Ice Lake (Linux
    /// `intel_ntb3_mw_set_trans`, and the `NTB_HWERR_BAR_ALIGN` erratum of
    /// `gen4_init_dev`), a 4 KiB page on Sapphire Rapids (`mw_get_align`).
    pub fn addr_align(self, bar_size: usize) -> usize {
        match self {
            IntelPart::Gen3Skx | IntelPart::Gen4Icx => bar_size,
            IntelPart::Gen4Spr => 4096,
        }
    }

    /// The side of the link from the port definition register value `ppd`
    /// (config-space PPD on gen3, MMIO PPD1 on gen4).
    pub fn side(self, ppd: u32) -> Result<B2bSide, IntelError> {
        let (conn_mask, b2b, dsd, split) = match self {
            // gen3: CONN bits 1:0 = 1 is B2B; DEV 0x10 = DSD; SPLIT 0x40.
            IntelPart::Gen3Skx => (0x03, 0x01, 0x10, 0x40),
            // ICX: GEN4_PPD_CONN_MASK 0x0300, B2B 0x0200, GEN4_PPD_DEV_DSD 0x1000.
            IntelPart::Gen4Icx => (0x0300, 0x0200, 0x1000, 0),
            // SPR: SPR_PPD_CONN_MASK 0x0700, B2B 0x0200, SPR_PPD_DEV_DSD 0x4000.
            IntelPart::Gen4Spr => (0x0700, 0x0200, 0x4000, 0),
        };
        if ppd & conn_mask != b2b {
            return Err(IntelError::NotB2b { part: self, ppd });
        }
        if split != 0 && ppd & split != 0 {
            return Err(IntelError::SplitBar { ppd });
        }
        Ok(if ppd & dsd != 0 {
            B2bSide::Dsd
        } else {
            B2bSide::Usd
        })
    }

    /// The port definition value a part of this kind reports for `side`
    /// (B2B): what a register model presents.
    pub fn ppd_for(self, side: B2bSide) -> u32 {
        let dsd = matches!(side, B2bSide::Dsd);
        match self {
            IntelPart::Gen3Skx => 0x01 | if dsd { 0x10 } else { 0 },
            IntelPart::Gen4Icx => 0x0200 | if dsd { 0x1000 } else { 0 },
            IntelPart::Gen4Spr => 0x0200 | if dsd { 0x4000 } else { 0 },
        }
    }

    /// A revision ID that identifies as this part (for register models).
    pub fn revision(self) -> u8 {
        match self {
            IntelPart::Gen3Skx => 0x04,
            IntelPart::Gen4Icx => 0x04,
            IntelPart::Gen4Spr => 0x20,
        }
    }

    /// The PCI device ID of this part.
    pub fn device_id(self) -> u16 {
        if self.is_gen4() {
            DEVICE_GEN4
        } else {
            DEVICE_GEN3_SKX
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_told_apart_by_device_and_revision() {
        assert_eq!(IntelPart::identify(0x201C, 0).unwrap(), IntelPart::Gen3Skx);
        assert_eq!(
            IntelPart::identify(0x347E, 0x02).unwrap(),
            IntelPart::Gen4Icx
        );
        assert_eq!(
            IntelPart::identify(0x347E, 0x0F).unwrap(),
            IntelPart::Gen4Icx
        );
        assert_eq!(
            IntelPart::identify(0x347E, 0x10).unwrap(),
            IntelPart::Gen4Spr
        );
        let e = IntelPart::identify(0x347E, 0x01).unwrap_err();
        assert!(e.to_string().contains("revision 0x01"), "{e}");
        assert!(IntelPart::identify(0x3725, 0).is_err());
    }

    #[test]
    fn ppd_gives_the_port_and_refuses_other_topologies() {
        for part in [IntelPart::Gen3Skx, IntelPart::Gen4Icx, IntelPart::Gen4Spr] {
            for side in [B2bSide::Usd, B2bSide::Dsd] {
                assert_eq!(part.side(part.ppd_for(side)).unwrap(), side);
            }
        }
        assert_eq!(B2bSide::Usd.port(), 0);
        assert_eq!(B2bSide::Dsd.port(), 1);
        // gen3 transparent (0) and root port (2) are refused; so is split BAR.
        let e = IntelPart::Gen3Skx.side(0x00).unwrap_err();
        assert!(e.to_string().contains("NTB to NTB"), "{e}");
        assert!(IntelPart::Gen3Skx.side(0x02).is_err());
        let e = IntelPart::Gen3Skx.side(0x41).unwrap_err();
        assert!(e.to_string().contains("SPLIT"), "{e}");
        // SPR's wider CONN mask: ICX's DSD bit means nothing there.
        assert_eq!(IntelPart::Gen4Spr.side(0x1200).unwrap(), B2bSide::Usd);
        assert!(IntelPart::Gen4Spr.side(0x0600).is_err());
        assert!(IntelPart::Gen4Icx.side(0x0100).is_err());
    }

    #[test]
    fn alignment_is_the_bar_size_except_on_sapphire_rapids() {
        assert_eq!(IntelPart::Gen3Skx.addr_align(1 << 20), 1 << 20);
        assert_eq!(IntelPart::Gen4Icx.addr_align(1 << 20), 1 << 20);
        assert_eq!(IntelPart::Gen4Spr.addr_align(1 << 20), 4096);
    }
}
