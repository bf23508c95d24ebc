//! Read-only views of a fabric, for `ntb-tool list` and `status`.

use std::path::PathBuf;
use std::time::Duration;

use super::config::FabricConfig;
use super::layout::SlotState;
use crate::hw::{CounterSnapshot, Port};

/// One fabric found by [`EmuFabric::list`](super::EmuFabric::list).
#[derive(Debug, Clone)]
pub struct FabricInfo {
    /// Its name.
    pub name: String,
    /// Its control segment.
    pub path: PathBuf,
    /// Its geometry, if it could be attached.
    pub config: Option<FabricConfig>,
    /// Slots whose link is up.
    pub up_slots: usize,
    /// Why it could not be attached (wrong version, never initialised...).
    pub problem: Option<String>,
}

/// A snapshot of a whole fabric.
#[derive(Debug, Clone)]
pub struct FabricStatus {
    /// Its name.
    pub name: String,
    /// Its control segment.
    pub path: PathBuf,
    /// Its geometry and timings.
    pub config: FabricConfig,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: u64,
    /// Every slot.
    pub slots: Vec<SlotStatus>,
}

/// A snapshot of one slot.
#[derive(Debug, Clone)]
pub struct SlotStatus {
    /// The slot (port) number.
    pub slot: Port,
    /// Free, claimed or up.
    pub state: SlotState,
    /// Its generation (bumped on every claim; 0 = never claimed).
    pub generation: u64,
    /// The owner's pid, unless free.
    pub owner_pid: Option<u32>,
    /// Whether the owner process exists (and is not a zombie or a reused pid).
    pub owner_alive: bool,
    /// Whether peers see its link up (state up and heartbeat fresh).
    pub link_up: bool,
    /// Time since the owner's last heartbeat, unless free.
    pub heartbeat_age: Option<Duration>,
    /// Heartbeats since the claim.
    pub heartbeats: u64,
    /// Pending doorbell bits.
    pub db: u64,
    /// Doorbell mask.
    pub db_mask: u64,
    /// R-LUT entries in use at this port (non-posted reads in flight to it).
    pub rlut_in_use: u32,
    /// Non-posted reads to this port refused for want of an R-LUT entry.
    pub rlut_refusals: u64,
    /// The owner's device counters as of its last heartbeat.
    pub counters: CounterSnapshot,
    /// Bytes backing its window, while up.
    pub window_len: Option<usize>,
    /// Page size backing its window, while up.
    pub window_page_size: Option<usize>,
    /// The inbound translation it recorded (bus address, size), if any.
    pub inbound_translation: Option<(u64, usize)>,
}
