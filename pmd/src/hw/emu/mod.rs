//! The emulated NTB fabric: a multi-peer PCIe switch modelled in shared
//! memory between processes on one host. The default device everywhere.
//!
//! # Model
//! A fabric has a name, S slots (ports; 16 by default, up to 4096) and one
//! inbound memory window per slot (16 MiB by default). A process joins by
//! claiming a slot ([`EmuDevice::open`] / [`EmuDevice::join`]); it owns the
//! slot's window and registers until it drops the device or dies.
//!
//! # Control segment
//! A file `ntbdk-fabric-<name>` in [`shm_dir`] (`$NTBDK_SHM_DIR`, else
//! `/dev/shm`), created with `O_CREAT | O_EXCL` and mode 0600 by the first
//! process that asks (or by `ntb-tool create`). Attachers refuse a file
//! that is not that (a symlink, another user's, or one others may access)
//! in a directory others may write, where it could have been planted: a
//! fabric is used by the user that created it. The creator sizes it, writes
//! the header — layout version, header and slot sizes, geometry (slots,
//! window size, scratchpads, doorbell bits, R-LUT entries) and timings — and
//! writes the magic **last**, with release ordering. Attachers wait up to two
//! seconds for the magic, then refuse a different layout version; opening with
//! [`EmuFabric::open`] also refuses a different geometry. Names are 1 to 64
//! characters of `A-Z a-z 0-9 _ - .`.
//!
//! Then one cache-line aligned, all-atomic register block per slot:
//!
//! - a packed word `state:2 | generation:30 | owner pid:32`; state is free,
//!   claimed or up. Claim, release and reclaim are compare-and-swaps of the
//!   whole word, so an intervening re-join (new generation) makes a stale CAS
//!   fail;
//! - the owner's start time (`/proc/<pid>/stat` field 22, against pid reuse),
//!   heartbeat (CLOCK_MONOTONIC nanoseconds, comparable across processes) and
//!   heartbeat count;
//! - the window's publication: the owner's pid and the descriptor number of
//!   its window memfd, so peers map it as `/proc/<pid>/fd/<fd>`
//!   ([`Zone::open_from_pid`](ntbdk_mempool::Zone::open_from_pid)). The
//!   window lives exactly as long as its owner process (or the last peer
//!   mapping): a SIGKILLed process leaks nothing;
//! - doorbell bits and mask, scratchpads, the recorded inbound translation,
//!   the R-LUT map, and the owner's counters (mirrored by its heartbeat).
//!
//! # Joining and leaving
//! Claim = CAS free → claimed (generation + 1, our pid); reset the
//! registers; create the window zone (hugepages when reserved, else 4 KiB
//! pages with one warning: [`ZoneOptions::huge_or_fallback`](ntbdk_mempool::ZoneOptions::huge_or_fallback));
//! publish it; CAS claimed → up with release ordering. Dropping the device
//! CASes up → free. Peers see a link up while the slot is up **and** its
//! heartbeat is fresh; [`NtbDevice::link`](crate::hw::NtbDevice::link)
//! reports the generation, and
//! [`poll_link_events`](crate::hw::NtbDevice::poll_link_events) reports a
//! re-join as down (old generation) then up (new one); its first call
//! reports every peer already up. Peer window mappings are cached per (peer,
//! generation) and remapped after a re-join. A window's
//! [`LocalWindow::iova`](crate::hw::LocalWindow::iova) is its virtual address
//! (the emulated bus has an IOMMU in VA mode); `set_inbound_translation`
//! checks alignment (4 KiB) and size against the window and records it in the
//! slot for `ntb-tool status`.
//!
//! # Death and hot plug
//! An owner is dead when its pid is gone (or a zombie, or reused: start time
//! differs) or its heartbeat is older than the fabric's timeout (1 s by
//! default). The device's background thread beats every timeout/4 and, at
//! most every timeout/4 fabric-wide (a CAS on a header timestamp elects the
//! scanner), scans the slots and reclaims dead ones with a CAS; a joiner
//! reclaims dead slots it meets, and [`EmuFabric::reclaim_dead`] does it on
//! demand. Reclaiming also frees the R-LUT entries the dead requester held.
//! A process that disables the thread must call
//! [`service`](crate::hw::NtbDevice::service) more often than the timeout.
//! Every host of a file-backed fabric must see the others' pids: processes
//! in different pid namespaces (containers sharing one `/dev/shm`) would
//! take each other's live slots for dead ones. Give each such container its
//! own `NTBDK_SHM_DIR`, or share a pid namespace. A slot left `Claimed` by
//! a joiner killed mid-join is judged by its pid alone (its start time is
//! not written yet): if that pid is reused before a scan, the slot stays
//! claimed until the fabric is destroyed.
//!
//! # Memory sources
//! The same code runs a fabric over two kinds of memory
//! ([`SharedRegion`]):
//! - the above: a control segment file, windows in per-owner memfds, and
//!   owners judged by pid, start time and heartbeat timestamp
//!   ([`Liveness::HostProcesses`]);
//! - one region that holds the control area **and** every window
//!   ([`EmuFabric::open_shared`]): an ivshmem BAR2 shared by VMs
//!   ([`crate::hw::vfio::ivshmem`]), or in tests a memfd standing in for
//!   it. Its first user lays it out; owners are judged by heartbeat
//!   progress only ([`Liveness::HeartbeatOnly`]), since pids and clocks of
//!   other VMs mean nothing; peers are not isolated
//!   ([`WindowBacking::OneSharedRegion`]).
//!
//! # R-LUT
//! Non-posted reads ([`non_posted_read`](crate::hw::NtbDevice::non_posted_read),
//! [`peer_spad_read`](crate::hw::NtbDevice::peer_spad_read)) take one of the
//! target port's R-LUT entries (32 by default) for an emulated round trip
//! (1 µs by default) and fail with
//! [`HwError::RlutExhausted`](crate::hw::HwError::RlutExhausted) when none is
//! free; refusals are counted by the requester and the target. Posted writes
//! (window writes, doorbell rings, peer scratchpad writes) need none.

mod config;
mod device;
mod fabric;
mod layout;
mod liveness;
mod region;
mod registers;
mod rlut;
mod segment;
mod status;
mod windows;

pub use config::{DeviceConfig, FabricConfig, MAX_SLOTS};
pub use device::EmuDevice;
pub use fabric::EmuFabric;
pub use layout::{SlotState, windows_start};
pub use liveness::Liveness;
pub use region::SharedRegion;
pub use registers::SlotRegisters;
pub use segment::{MAX_NAME_LEN, shm_dir, validate_name};
pub use status::{FabricInfo, FabricStatus, SlotStatus, WindowBacking};

/// A two-slot fabric `name` in a directory of its own, with a member in
/// each slot (for tests).
#[cfg(test)]
pub(crate) fn two_members(name: &str) -> (std::path::PathBuf, EmuFabric, [EmuDevice; 2]) {
    let dir = std::env::temp_dir().join(format!("ntbdk-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = FabricConfig {
        slots: 2,
        window_size: 1 << 20,
        heartbeat_timeout: std::time::Duration::from_secs(2),
        ..FabricConfig::default()
    };
    let fabric = EmuFabric::create_in(&dir, name, &cfg).unwrap();
    let join = |slot| {
        let dc = DeviceConfig {
            slot: Some(slot),
            fabric: cfg.clone(),
            dir: Some(dir.clone()),
            ..DeviceConfig::default()
        };
        EmuDevice::join(&fabric, &dc).unwrap()
    };
    let members = [join(0), join(1)];
    (dir, fabric, members)
}
