//! Read-only views of a fabric, for `ntb-tool list` and `status`.

use std::path::PathBuf;
use std::time::Duration;

use super::config::FabricConfig;
use super::layout::SlotState;
use super::liveness::Liveness;
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
    /// How live owners are told from dead ones.
    pub liveness: Liveness,
    /// Where the windows live, which says whether peers are isolated.
    pub window_backing: WindowBacking,
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
    /// Whether the owner is alive: its process exists (and is not a zombie
    /// or a reused pid); across hosts ([`Liveness::HeartbeatOnly`]), its
    /// heartbeat still advances.
    pub owner_alive: bool,
    /// Whether peers see its link up (state up and heartbeat fresh).
    pub link_up: bool,
    /// Time since the owner's last heartbeat, unless free (across hosts:
    /// since this observer last saw it advance).
    pub heartbeat_age: Option<Duration>,
    /// Heartbeats since the claim.
    pub heartbeats: u64,
    /// Pending doorbell bits.
    pub db: u64,
    /// Doorbell mask.
    pub db_mask: u64,
    /// Doorbell rings received since the fabric was created.
    pub db_rings: u64,
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
    /// Ranges of its window granted to peers beyond the fixed template
    /// (one per extent and peer of each region it registered).
    pub granted_ranges: usize,
}

/// Where a fabric's windows live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowBacking {
    /// Each window is memory of its owner (a memfd); a host maps only the
    /// peer windows it writes to.
    PerOwnerMemory,
    /// Every window is in one memory that every host maps whole (an ivshmem
    /// BAR): the backend cannot isolate peers, any host can write any
    /// window.
    OneSharedRegion,
}

impl WindowBacking {
    /// Whether a host can reach only the windows of peers it was given.
    pub fn isolates_peers(self) -> bool {
        self == WindowBacking::PerOwnerMemory
    }
}
