//! Fabric geometry and per-device options.

use std::path::PathBuf;
use std::time::Duration;

use super::layout::{MAX_RLUT, MAX_SPADS};
use crate::hw::{HwError, Port, Result};

/// Most slots a fabric may have.
pub const MAX_SLOTS: usize = 4096;
/// Longest heartbeat timeout (its nanoseconds are kept in 64 bits, and a
/// dead peer should be noticed within the hour).
pub const MAX_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest window.
pub const MAX_WINDOW: usize = 1 << 40;
/// Longest emulated non-posted read latency (a read stalls its reader that
/// long: a header asking for more is corrupt or hostile).
pub const MAX_READ_LATENCY: Duration = Duration::from_secs(1);

/// The geometry and timing of an emulated fabric, fixed by its creator.
///
/// Geometry (slots, window size, scratchpads, doorbell bits, R-LUT entries)
/// must match between the creator and anyone who opens the fabric with
/// [`EmuFabric::open`](super::EmuFabric::open); the timings are the
/// creator's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// Number of slots (ports). Default 16; 2..=4096.
    pub slots: usize,
    /// Bytes of each slot's inbound window. Default 16 MiB; a multiple of
    /// 4096. 4 KiB-page windows are populated up front, so keep them small
    /// when hugepages are not reserved.
    pub window_size: usize,
    /// Scratchpad registers per slot. Default 16; at most 64.
    pub spads: usize,
    /// Doorbell bits per slot. Default 64; 1..=64.
    pub db_bits: u32,
    /// R-LUT (requester ID look-up table) entries per slot: how many
    /// non-posted reads may target one port at once. Default 32; 1..=64.
    pub rlut_entries: usize,
    /// A slot whose owner's heartbeat is older than this is dead. Default
    /// 1 s (as the ivshmem fabric's): a shorter one finds its host faster,
    /// but a live host its machine stalls that long (a throttled container,
    /// a loaded laptop) is dropped.
    pub heartbeat_timeout: Duration,
    /// Emulated round trip of a non-posted read (the time it holds its R-LUT
    /// entry). Default 1 µs.
    pub read_latency: Duration,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            slots: 16,
            window_size: 16 << 20,
            spads: 16,
            db_bits: 64,
            rlut_entries: 32,
            heartbeat_timeout: Duration::from_secs(1),
            read_latency: Duration::from_micros(1),
        }
    }
}

impl FabricConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(HwError::Invalid(why));
        if !(2..=MAX_SLOTS).contains(&self.slots) {
            return bad(format!("slots must be 2..={MAX_SLOTS}, not {}", self.slots));
        }
        if self.window_size == 0 || !self.window_size.is_multiple_of(4096) {
            return bad(format!(
                "window size must be a non-zero multiple of 4096, not {}",
                self.window_size
            ));
        }
        if self.spads > MAX_SPADS {
            return bad(format!("spads must be 0..={MAX_SPADS}, not {}", self.spads));
        }
        if !(1..=64).contains(&self.db_bits) {
            return bad(format!(
                "doorbell bits must be 1..=64, not {}",
                self.db_bits
            ));
        }
        if !(1..=MAX_RLUT).contains(&self.rlut_entries) {
            return bad(format!(
                "R-LUT entries must be 1..={MAX_RLUT}, not {}",
                self.rlut_entries
            ));
        }
        if self.heartbeat_timeout < Duration::from_millis(1)
            || self.heartbeat_timeout > MAX_HEARTBEAT_TIMEOUT
        {
            return bad(format!(
                "heartbeat timeout must be 1 ms..={MAX_HEARTBEAT_TIMEOUT:?}, not {:?}",
                self.heartbeat_timeout
            ));
        }
        if self.read_latency > MAX_READ_LATENCY {
            return bad(format!(
                "read latency must be at most {MAX_READ_LATENCY:?}, not {:?}",
                self.read_latency
            ));
        }
        if self.window_size > MAX_WINDOW {
            return bad(format!(
                "window size must be at most {MAX_WINDOW} bytes (1 TiB), not {}",
                self.window_size
            ));
        }
        Ok(())
    }

    /// The doorbell bits as a mask.
    pub fn db_valid_mask(&self) -> u64 {
        if self.db_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << self.db_bits) - 1
        }
    }
}

/// How a process joins a fabric as a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The slot to claim; `None` claims the first free one. A requested slot
    /// held by a dead owner is reclaimed first.
    pub slot: Option<Port>,
    /// Geometry used to create the fabric if it does not exist yet, and
    /// checked against it if it does ([`EmuDevice::open`](super::EmuDevice::open)).
    pub fabric: FabricConfig,
    /// Directory of the control segment; `None` uses [`shm_dir`](super::shm_dir)
    /// (`$NTBDK_SHM_DIR`, else `/dev/shm`).
    pub dir: Option<PathBuf>,
    /// Run a background heartbeat thread (default true), so a process that
    /// does not call [`service`](crate::hw::NtbDevice::service) often is not
    /// declared dead. It also scans for dead peers and reclaims their slots.
    pub heartbeat_thread: bool,
    /// Overrides the fabric's emulated non-posted read latency for reads
    /// this device issues.
    pub read_latency: Option<Duration>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            slot: None,
            fabric: FabricConfig::default(),
            dir: None,
            heartbeat_thread: true,
            read_latency: None,
        }
    }
}
