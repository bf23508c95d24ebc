//! The ivshmem backend: QEMU's inter-VM shared memory device as an N-host
//! NTB fabric.
//!
//! QEMU `ivshmem-plain` / `ivshmem-doorbell` (`docs/specs/ivshmem-spec.rst`)
//! is PCI `1af4:1110`. BAR0 holds four 32-bit registers (IntrMask 0x00,
//! IntrStatus 0x04, IVPosition 0x08, Doorbell 0x0C); BAR2 is memory shared
//! by every VM whose device uses the same memory backend.
//!
//! BAR2 is laid out exactly as the emulated fabric, by the same code
//! ([`EmuFabric::open_shared`]): the control area (header, one register
//! block per slot: slot claim word, generation, heartbeat, doorbell and
//! mask, scratchpads, R-LUT) and then one inbound window per slot. The first
//! VM to open a blank (all-zero) BAR2 initialises it; the others attach.
//! Slots are claimed by compare-and-swap, and a VM that stops is found dead
//! when its heartbeat count stops advancing ([`Liveness::HeartbeatOnly`]:
//! pids and clocks of other VMs mean nothing here).
//!
//! ```text
//! BAR2 0                      header + slot register blocks
//!      windows_offset         window of slot 0
//!      + window_size          window of slot 1 ...
//! ```
//!
//! Every VM maps the whole BAR: the backend **cannot isolate peers** (any
//! host can write any window), which `ntb-tool status` says. Doorbells and
//! scratchpads are words in BAR2, polled; the device's own doorbell
//! register (and its MSI-X vectors, `ivshmem-doorbell` only) is not used.
//!
//! [`Liveness::HeartbeatOnly`]: crate::hw::emu::Liveness::HeartbeatOnly

use std::time::Duration;

use super::{Bdf, SysRoots, VfioError, VfioFunction};
use crate::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig, SharedRegion};
use crate::hw::mmio::Mmio;
use crate::hw::{HwError, Port, Result};

/// PCI vendor ID of ivshmem (Red Hat, Inc.; ivshmem-spec.rst).
pub const IVSHMEM_VENDOR: u16 = 0x1af4;
/// PCI device ID of ivshmem (ivshmem-spec.rst).
pub const IVSHMEM_DEVICE: u16 = 0x1110;
/// BAR0 register: the VM's ID on an `ivshmem-doorbell` server
/// (ivshmem-spec.rst, "IVPosition"; not meaningful for `ivshmem-plain`).
pub const REG_IVPOSITION: usize = 0x08;
/// Bytes of BAR0 (ivshmem-spec.rst: 256).
pub const BAR0_LEN: u64 = 256;
/// Fewest bytes of BAR2 that hold a fabric (2 slots of 4 KiB windows).
pub const BAR2_MIN_LEN: u64 = 64 << 10;

/// How to open an ivshmem function as a fabric member.
#[derive(Debug, Clone)]
pub struct IvshmemConfig {
    /// Slots of the fabric, if this VM is the first to open BAR2. Default 4.
    pub slots: usize,
    /// Bytes of each window, if this VM is the first; `None` (default)
    /// splits what BAR2 holds after the control area evenly, 4 KiB aligned.
    pub window_size: Option<usize>,
    /// Heartbeat timeout, if this VM is the first. Default 1 s: VMs are
    /// slower to schedule than processes (and much slower under TCG).
    pub heartbeat_timeout: Duration,
    /// The slot to claim; `None` claims the first free one.
    pub slot: Option<Port>,
    /// Run the background heartbeat thread (default true; see
    /// [`DeviceConfig::heartbeat_thread`]).
    pub heartbeat_thread: bool,
}

impl Default for IvshmemConfig {
    fn default() -> Self {
        IvshmemConfig {
            slots: 4,
            window_size: None,
            heartbeat_timeout: Duration::from_secs(1),
            slot: None,
            heartbeat_thread: true,
        }
    }
}

impl IvshmemConfig {
    /// The fabric geometry to lay out in a blank BAR2 of `bar2_len` bytes.
    pub fn fabric_config(&self, bar2_len: usize) -> Result<FabricConfig> {
        let start = crate::hw::emu::windows_start(self.slots);
        let window_size = match self.window_size {
            Some(w) => w,
            None => (bar2_len.saturating_sub(start) / self.slots.max(1)) & !4095,
        };
        if window_size == 0 {
            return Err(HwError::Invalid(format!(
                "the shared memory is {bar2_len} bytes: too small for {} slots \
                 (the control area alone takes {start}); use fewer slots or more memory",
                self.slots
            )));
        }
        let cfg = FabricConfig {
            slots: self.slots,
            window_size,
            heartbeat_timeout: self.heartbeat_timeout,
            ..FabricConfig::default()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn device_config(&self) -> DeviceConfig {
        DeviceConfig {
            slot: self.slot,
            heartbeat_thread: self.heartbeat_thread,
            ..DeviceConfig::default()
        }
    }
}

/// Opens (initialising it if blank) the fabric in `bar2`, the ivshmem shared
/// memory (or a memfd standing in for it). `label` names it in messages.
pub fn fabric_in(bar2: SharedRegion, label: &str, cfg: &IvshmemConfig) -> Result<EmuFabric> {
    let fcfg = cfg.fabric_config(bar2.len())?;
    EmuFabric::open_shared(bar2, label, &fcfg)
}

/// Joins the fabric in `bar2` as a device (see [`fabric_in`]).
pub fn join_in(bar2: SharedRegion, label: &str, cfg: &IvshmemConfig) -> Result<EmuDevice> {
    fabric_in(bar2, label, cfg)?.join(&cfg.device_config())
}

/// The IVPosition register of an ivshmem BAR0.
pub fn iv_position(bar0: &dyn Mmio) -> Result<u32> {
    bar0.read32(REG_IVPOSITION)
}

/// The ivshmem function `bdf`, opened and its BARs mapped; BAR2 as a region.
fn open_bars(bdf: Bdf, roots: &SysRoots) -> Result<(SharedRegion, u32, String), VfioError> {
    let f = VfioFunction::open(bdf, roots, IVSHMEM_VENDOR, IVSHMEM_DEVICE, "QEMU ivshmem")?;
    let bar0 = f.map_bar(0, BAR0_LEN, "ivshmem register block")?;
    let position = iv_position(&bar0).map_err(|source| VfioError::Fabric { bdf, source })?;
    let bar2 = f.map_bar(2, BAR2_MIN_LEN, "ivshmem fabric (shared memory)")?;
    let label = format!("ivshmem {bdf} BAR2");
    tracing::debug!(%bdf, position, bar2_len = bar2.len(), "ivshmem function open");
    Ok((bar2.shared_region(), position, label))
}

/// Opens the ivshmem function `bdf` (bound to vfio-pci) and joins the
/// fabric in its BAR2, initialising BAR2 if this VM is the first.
pub fn open(bdf: Bdf, roots: &SysRoots, cfg: &IvshmemConfig) -> Result<EmuDevice, VfioError> {
    let (bar2, _position, label) = open_bars(bdf, roots)?;
    join_in(bar2, &label, cfg).map_err(|source| VfioError::Fabric { bdf, source })
}

/// Attaches to the fabric in the BAR2 of ivshmem function `bdf` without
/// joining it (for status); a blank BAR2 is an error.
pub fn attach(bdf: Bdf, roots: &SysRoots) -> Result<EmuFabric, VfioError> {
    let (bar2, _position, label) = open_bars(bdf, roots)?;
    EmuFabric::attach_shared(bar2, &label).map_err(|source| VfioError::Fabric { bdf, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::mmio::RegisterFile;

    #[test]
    fn geometry_splits_bar2_evenly() {
        let cfg = IvshmemConfig::default();
        let f = cfg.fabric_config(64 << 20).unwrap();
        assert_eq!(f.slots, 4);
        assert!(f.window_size.is_multiple_of(4096));
        let start = crate::hw::emu::windows_start(4);
        assert!(start + 4 * f.window_size <= 64 << 20);
        assert!(start + 4 * (f.window_size + 4096) > 64 << 20);
        let e = cfg.fabric_config(8192).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
    }

    #[test]
    fn iv_position_is_bar0_offset_8() {
        let bar0 = RegisterFile::new(BAR0_LEN as usize);
        bar0.write32(REG_IVPOSITION, 3).unwrap();
        assert_eq!(iv_position(&bar0).unwrap(), 3);
    }
}
