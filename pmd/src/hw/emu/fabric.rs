//! [`EmuFabric`]: one process's handle on a named fabric's control segment.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::config::{DeviceConfig, FabricConfig};
use super::layout::{SlotRegs, SlotState, SlotWord, windows_offset};
use super::liveness::{Liveness, Progress, now_ns, owner_gone, pid_exists};
use super::region::SharedRegion;
use super::rlut;
use super::segment::{FILE_PREFIX, Segment, segment_path, shm_dir, validate_name};
use super::status::{FabricInfo, FabricStatus, SlotStatus, WindowBacking};
use super::{EmuDevice, SlotRegisters};
use crate::hw::{CounterSnapshot, HwError, LinkState, Port, Result};

/// How long an attacher waits for a fabric's creator to finish initialising
/// its control segment.
const ATTACH_WAIT: Duration = Duration::from_secs(2);

/// A handle on a named emulated fabric: its control segment, mapped.
///
/// Cheap to clone. Dropping it unmaps the segment but leaves the fabric in
/// place (like a file); [`EmuFabric::destroy`] removes it.
///
/// # Example
/// ```
/// use ntbdk_pmd::hw::emu::{EmuFabric, FabricConfig};
///
/// let dir = std::env::temp_dir().join(format!("ntbdk-doc-fabric-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let cfg = FabricConfig { slots: 4, window_size: 64 << 10, ..Default::default() };
/// let fabric = EmuFabric::create_in(&dir, "doc", &cfg).unwrap();
/// // Another process would attach by name and get the same geometry.
/// let other = EmuFabric::attach_in(&dir, "doc").unwrap();
/// assert_eq!(other.config().slots, 4);
/// // A different geometry is refused.
/// let wrong = FabricConfig { slots: 8, ..cfg.clone() };
/// assert!(EmuFabric::open_in(&dir, "doc", &wrong).is_err());
/// assert_eq!(fabric.status().slots.len(), 4);
/// EmuFabric::destroy_in(&dir, "doc").unwrap();
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Clone)]
pub struct EmuFabric {
    pub(crate) inner: Arc<FabricInner>,
}

pub(crate) struct FabricInner {
    pub seg: Segment,
    pub name: String,
    pub dir: PathBuf,
    pub cfg: FabricConfig,
    pub timeout_ns: u64,
    pub liveness: Liveness,
    /// Offset of slot 0's window in the segment's region, when the region
    /// holds the windows (slot `i`'s is `i * window_size` further);
    /// `None` when each owner publishes its own window memfd.
    pub windows: Option<usize>,
    /// What we last saw of each slot ([`Liveness::HeartbeatOnly`] only).
    progress: Vec<Mutex<Progress>>,
    /// Our clock at our last dead-slot scan ([`Liveness::HeartbeatOnly`]:
    /// clocks of other hosts cannot be compared with ours, so the header's
    /// election timestamp is not used).
    last_scan_ns: AtomicU64,
    /// Our clock when this handle was made: under
    /// [`Liveness::HeartbeatOnly`], a handle younger than a timeout has not
    /// watched the slots long enough to judge them.
    opened_ns: u64,
}

impl std::fmt::Debug for EmuFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuFabric")
            .field("name", &self.inner.name)
            .field("path", &self.inner.seg.path())
            .field("config", &self.inner.cfg)
            .finish()
    }
}

fn geometry_mismatch(name: &str, want: &FabricConfig, have: &FabricConfig) -> Option<String> {
    let fields = [
        ("slots", want.slots, have.slots),
        ("window size", want.window_size, have.window_size),
        ("scratchpads", want.spads, have.spads),
        (
            "doorbell bits",
            want.db_bits as usize,
            have.db_bits as usize,
        ),
        ("R-LUT entries", want.rlut_entries, have.rlut_entries),
    ];
    let diffs: Vec<String> = fields
        .iter()
        .filter(|(_, w, h)| w != h)
        .map(|(what, w, h)| format!("{what} {h} (wanted {w})"))
        .collect();
    (!diffs.is_empty()).then(|| {
        format!(
            "fabric {name:?} exists with another geometry: {}; use the same geometry, \
             another fabric name, or destroy it (ntb-tool destroy {name})",
            diffs.join(", ")
        )
    })
}

impl EmuFabric {
    fn from_segment(seg: Segment, dir: &Path, name: &str) -> EmuFabric {
        Self::build(seg, dir, name, Liveness::HostProcesses, None)
    }

    fn build(
        seg: Segment,
        dir: &Path,
        name: &str,
        liveness: Liveness,
        windows: Option<usize>,
    ) -> EmuFabric {
        let cfg = seg.config();
        let progress = match liveness {
            Liveness::HostProcesses => Vec::new(),
            Liveness::HeartbeatOnly => (0..cfg.slots).map(|_| Mutex::default()).collect(),
        };
        EmuFabric {
            inner: Arc::new(FabricInner {
                timeout_ns: cfg.heartbeat_timeout.as_nanos() as u64,
                seg,
                name: name.to_owned(),
                dir: dir.to_owned(),
                cfg,
                liveness,
                windows,
                progress,
                last_scan_ns: AtomicU64::new(0),
                opened_ns: now_ns(),
            }),
        }
    }

    /// Opens the fabric laid out in `region`, one shared memory that holds
    /// the control area **and** every slot's window (an ivshmem BAR mapped
    /// through vfio; in tests, a memfd standing in for one). A blank
    /// (all-zero) region is initialised for `cfg`; an initialised one is
    /// attached whatever its geometry. Owners are judged by heartbeat only
    /// ([`Liveness::HeartbeatOnly`]): they may be in other VMs. `label`
    /// names the region in messages and status.
    ///
    /// Every host maps the whole region, so peers are not isolated from
    /// each other's windows ([`WindowBacking::OneSharedRegion`]).
    pub fn open_shared(region: SharedRegion, label: &str, cfg: &FabricConfig) -> Result<EmuFabric> {
        let seg = Segment::open_region(region, Some(cfg), label, ATTACH_WAIT)?;
        Ok(Self::shared(seg, label))
    }

    /// Attaches to the fabric already laid out in `region` (see
    /// [`open_shared`](Self::open_shared)) without initialising a blank one.
    pub fn attach_shared(region: SharedRegion, label: &str) -> Result<EmuFabric> {
        let seg = Segment::open_region(region, None, label, ATTACH_WAIT)?;
        Ok(Self::shared(seg, label))
    }

    fn shared(seg: Segment, label: &str) -> EmuFabric {
        let slots = seg.config().slots;
        Self::build(
            seg,
            Path::new(""),
            label,
            Liveness::HeartbeatOnly,
            Some(windows_offset(slots)),
        )
    }

    /// Creates fabric `name` in [`shm_dir`]; an existing one is an error.
    pub fn create(name: &str, cfg: &FabricConfig) -> Result<EmuFabric> {
        Self::create_in(&shm_dir(), name, cfg)
    }

    /// Creates fabric `name` in `dir`; an existing one is an error.
    pub fn create_in(dir: &Path, name: &str, cfg: &FabricConfig) -> Result<EmuFabric> {
        validate_name(name)?;
        match Segment::create(&segment_path(dir, name), cfg) {
            Ok(seg) => Ok(Self::from_segment(seg, dir, name)),
            Err(HwError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                Err(HwError::Fabric(format!(
                    "fabric {name:?} already exists in {}: attach to it, or destroy it first \
                     (ntb-tool destroy {name})",
                    dir.display()
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Attaches to the existing fabric `name` in [`shm_dir`], whatever its
    /// geometry (a different layout version is an error).
    pub fn attach(name: &str) -> Result<EmuFabric> {
        Self::attach_in(&shm_dir(), name)
    }

    /// Attaches to the existing fabric `name` in `dir`.
    pub fn attach_in(dir: &Path, name: &str) -> Result<EmuFabric> {
        validate_name(name)?;
        let seg = Segment::attach(&segment_path(dir, name), name, ATTACH_WAIT)?;
        Ok(Self::from_segment(seg, dir, name))
    }

    /// Creates fabric `name` in [`shm_dir`] if it does not exist, else
    /// attaches to it and checks that its geometry is `cfg`'s.
    pub fn open(name: &str, cfg: &FabricConfig) -> Result<EmuFabric> {
        Self::open_in(&shm_dir(), name, cfg)
    }

    /// [`open`](Self::open) in `dir`.
    pub fn open_in(dir: &Path, name: &str, cfg: &FabricConfig) -> Result<EmuFabric> {
        validate_name(name)?;
        cfg.validate()?;
        let path = segment_path(dir, name);
        for _ in 0..3 {
            match Segment::create(&path, cfg) {
                Ok(seg) => return Ok(Self::from_segment(seg, dir, name)),
                Err(HwError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            match Segment::attach(&path, name, ATTACH_WAIT) {
                Ok(seg) => {
                    let f = Self::from_segment(seg, dir, name);
                    if let Some(why) = geometry_mismatch(name, cfg, &f.inner.cfg) {
                        return Err(HwError::Fabric(why));
                    }
                    return Ok(f);
                }
                // Destroyed between our create and attach: try again.
                Err(HwError::Fabric(_)) if !path.exists() => continue,
                Err(e) => return Err(e),
            }
        }
        Err(HwError::Fabric(format!(
            "fabric {name:?} keeps appearing and disappearing in {}: is someone destroying it?",
            dir.display()
        )))
    }

    /// Removes fabric `name` from [`shm_dir`]. Processes attached keep their
    /// mappings until they drop them; new attachers no longer find it.
    pub fn destroy(name: &str) -> Result<()> {
        Self::destroy_in(&shm_dir(), name)
    }

    /// Removes fabric `name` from `dir`.
    pub fn destroy_in(dir: &Path, name: &str) -> Result<()> {
        validate_name(name)?;
        let path = segment_path(dir, name);
        std::fs::remove_file(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                HwError::Fabric(format!("no fabric named {name:?} in {}", dir.display()))
            } else {
                HwError::Io {
                    what: format!("removing {}", path.display()),
                    source,
                }
            }
        })
    }

    /// The fabrics in [`shm_dir`].
    pub fn list() -> Result<Vec<FabricInfo>> {
        Self::list_in(&shm_dir())
    }

    /// The fabrics in `dir`, by name. One that cannot be attached is listed
    /// with the reason.
    pub fn list_in(dir: &Path) -> Result<Vec<FabricInfo>> {
        let rd = std::fs::read_dir(dir).map_err(|source| HwError::Io {
            what: format!("listing {}", dir.display()),
            source,
        })?;
        let mut out = Vec::new();
        for e in rd.flatten() {
            let file = e.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_prefix(FILE_PREFIX)) else {
                continue;
            };
            if validate_name(name).is_err() {
                continue;
            }
            let info = match Segment::attach(&e.path(), name, Duration::ZERO) {
                Ok(seg) => {
                    let f = Self::from_segment(seg, dir, name);
                    let now = now_ns();
                    let up = (0..f.inner.cfg.slots)
                        .filter(|&i| f.link_at(i, now).up)
                        .count();
                    FabricInfo {
                        name: name.to_owned(),
                        path: e.path(),
                        config: Some(f.inner.cfg.clone()),
                        up_slots: up,
                        problem: None,
                    }
                }
                Err(err) => FabricInfo {
                    name: name.to_owned(),
                    path: e.path(),
                    config: None,
                    up_slots: 0,
                    problem: Some(err.to_string()),
                },
            };
            out.push(info);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The fabric's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The directory its control segment is in: empty for a fabric shared
    /// through a device's memory ([`open_shared`](Self::open_shared)),
    /// which has no file.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Path of the control segment.
    pub fn path(&self) -> &Path {
        self.inner.seg.path()
    }

    /// Its geometry and timings.
    pub fn config(&self) -> &FabricConfig {
        &self.inner.cfg
    }

    /// How it tells live slot owners from dead ones.
    pub fn liveness(&self) -> Liveness {
        self.inner.liveness
    }

    /// Where its windows live.
    pub fn window_backing(&self) -> WindowBacking {
        match self.inner.windows {
            None => WindowBacking::PerOwnerMemory,
            Some(_) => WindowBacking::OneSharedRegion,
        }
    }

    /// The region that holds the control area (and, for
    /// [`open_shared`](Self::open_shared) fabrics, the windows).
    pub(crate) fn region(&self) -> &SharedRegion {
        self.inner.seg.region()
    }

    /// Joins the fabric as a device: claims a slot (see [`DeviceConfig`];
    /// its `fabric` and `dir` fields are ignored here).
    pub fn join(&self, cfg: &DeviceConfig) -> Result<EmuDevice> {
        EmuDevice::join(self, cfg)
    }

    /// A read-only snapshot of every slot (what `ntb-tool status` prints).
    pub fn status(&self) -> FabricStatus {
        let now = now_ns();
        let slots = (0..self.inner.cfg.slots)
            .map(|i| self.slot_status(i, now))
            .collect();
        FabricStatus {
            name: self.inner.name.clone(),
            path: self.path().to_owned(),
            config: self.inner.cfg.clone(),
            created_unix: self.inner.seg.header().created_unix.load(Relaxed),
            liveness: self.inner.liveness,
            window_backing: self.window_backing(),
            slots,
        }
    }

    fn slot_status(&self, i: usize, now: u64) -> SlotStatus {
        let r = self.regs_of(i);
        let raw = r.word.load(Acquire);
        let w = SlotWord::unpack(raw);
        let owned = w.state != SlotState::Free;
        let age = self.heartbeat_age(i, raw, now);
        let alive = match self.inner.liveness {
            Liveness::HostProcesses => !owner_gone(w.pid, r.owner_start.load(Relaxed)),
            Liveness::HeartbeatOnly => age <= self.inner.timeout_ns,
        };
        let c = |k: usize| r.counters[k].load(Relaxed);
        let xs = r.xlat_size.load(Relaxed) as usize;
        SlotStatus {
            slot: i as Port,
            state: w.state,
            generation: w.generation,
            owner_pid: owned.then_some(w.pid),
            owner_alive: owned && alive,
            link_up: self.link_at(i, now).up,
            heartbeat_age: owned.then(|| Duration::from_nanos(age)),
            heartbeats: r.heartbeat_count.load(Relaxed),
            db: r.db.load(Relaxed),
            db_mask: r.db_mask.load(Relaxed),
            db_rings: r.db_rings.load(Relaxed),
            rlut_in_use: rlut::in_use(r),
            rlut_refusals: r.rlut_refusals.load(Relaxed),
            counters: CounterSnapshot {
                posted_writes: c(0),
                posted_bytes: c(1),
                non_posted_reads: c(2),
                non_posted_bytes: c(3),
                rlut_refusals: c(4),
                ungranted_writes: c(5),
            },
            window_len: (w.state == SlotState::Up).then(|| r.win_len.load(Relaxed) as usize),
            window_page_size: (w.state == SlotState::Up).then(|| r.win_page.load(Relaxed) as usize),
            inbound_translation: (xs != 0).then(|| (r.xlat_iova.load(Relaxed), xs)),
            granted_ranges: if owned { r.grants.live() } else { 0 },
        }
    }

    /// Registers of `slot`, for tools acting as that slot's host (read and
    /// write its doorbell, mask and scratchpads directly).
    pub fn registers(&self, slot: Port) -> Result<SlotRegisters<'_>> {
        if slot as usize >= self.inner.cfg.slots {
            return Err(HwError::Invalid(format!(
                "no slot {slot}: fabric {:?} has {} slots (0..={})",
                self.inner.name,
                self.inner.cfg.slots,
                self.inner.cfg.slots - 1
            )));
        }
        Ok(SlotRegisters {
            regs: self.regs_of(slot as usize),
            cfg: &self.inner.cfg,
            slot,
        })
    }

    /// Scans every slot and reclaims those whose owner is dead (pid gone,
    /// zombie, pid reused, or heartbeat stale past the timeout). Returns the
    /// slots reclaimed.
    ///
    /// Under [`Liveness::HeartbeatOnly`] (ivshmem) a handle opened less than
    /// a heartbeat timeout ago first watches the slots that long (it blocks
    /// for about 1.25 timeouts): a dead host's slot is told from a live one
    /// only by a heartbeat count that stopped, which takes a timeout of
    /// watching to see.
    pub fn reclaim_dead(&self) -> Vec<Port> {
        self.watch_if_new();
        let now = now_ns();
        self.inner.seg.header().last_scan_ns.store(now, Relaxed);
        (0..self.inner.cfg.slots)
            .filter(|&i| self.reclaim_if_dead(i, now))
            .map(|i| i as Port)
            .collect()
    }

    /// Under [`Liveness::HeartbeatOnly`], for a handle that has not yet
    /// watched the slots for a heartbeat timeout: looks at every taken slot
    /// now, then waits a timeout and a heartbeat period, so that the next
    /// scan can tell the slots whose heartbeat stopped (their owners' hosts
    /// died) from live ones. Without it a newcomer would find every slot of
    /// a dead host alive, and could neither claim nor reclaim one. Returns
    /// whether it waited.
    pub(crate) fn watch_if_new(&self) -> bool {
        if self.inner.liveness != Liveness::HeartbeatOnly {
            return false;
        }
        // The heartbeat period is a quarter timeout (see the device's
        // heartbeat thread): a live owner beats within it.
        let watch = self.inner.timeout_ns + self.inner.timeout_ns / 4;
        let now = now_ns();
        if now.saturating_sub(self.inner.opened_ns) > watch {
            return false;
        }
        for i in 0..self.inner.cfg.slots {
            let raw = self.regs_of(i).word.load(Acquire);
            if SlotWord::unpack(raw).state != SlotState::Free {
                self.heartbeat_age(i, raw, now);
            }
        }
        std::thread::sleep(Duration::from_nanos(watch + 1_000_000));
        true
    }

    /// Scans for dead slots if nobody has in the last quarter timeout
    /// (fabric-wide on one host; per handle across hosts, whose clocks
    /// differ).
    pub(crate) fn maybe_scan(&self, now: u64) {
        let last_scan = match self.inner.liveness {
            Liveness::HostProcesses => &self.inner.seg.header().last_scan_ns,
            Liveness::HeartbeatOnly => &self.inner.last_scan_ns,
        };
        let last = last_scan.load(Relaxed);
        // A last scan in the future (every member can write the word) is
        // due, so that no one can switch scanning off.
        if now
            .checked_sub(last)
            .is_some_and(|d| d < self.inner.timeout_ns / 4)
        {
            return;
        }
        if last_scan
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_ok()
        {
            for i in 0..self.inner.cfg.slots {
                self.reclaim_if_dead(i, now);
            }
        }
    }

    /// How long slot `i` (whose word is `raw`) has gone without a sign of
    /// life: since its heartbeat timestamp on this host's clock, or, across
    /// hosts, since we last saw its word or heartbeat count change.
    fn heartbeat_age(&self, i: usize, raw: u64, now: u64) -> u64 {
        let r = self.regs_of(i);
        match self.inner.liveness {
            Liveness::HostProcesses => now.saturating_sub(r.heartbeat_ns.load(Relaxed)),
            Liveness::HeartbeatOnly => self.inner.progress[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .observe(raw, r.heartbeat_count.load(Relaxed), now),
        }
    }

    /// Whether slot `i`, whose packed word is `raw`, has a dead owner.
    pub(crate) fn is_dead(&self, i: usize, raw: u64, now: u64) -> bool {
        let w = SlotWord::unpack(raw);
        let stale = || self.heartbeat_age(i, raw, now) > self.inner.timeout_ns;
        match (w.state, self.inner.liveness) {
            (SlotState::Free, _) => false,
            // Start time and heartbeat may not be written yet: judge by pid.
            (SlotState::Claimed, Liveness::HostProcesses) => owner_gone(w.pid, 0),
            (SlotState::Up, Liveness::HostProcesses) => stale() || !pid_exists(w.pid),
            // Across hosts a claim's new word starts a fresh observation, so
            // a claimer gets a full timeout to bring its slot up.
            (_, Liveness::HeartbeatOnly) => stale(),
        }
    }

    /// Reclaims slot `i` if its owner is dead; true if this call did.
    pub(crate) fn reclaim_if_dead(&self, i: usize, now: u64) -> bool {
        let r = self.regs_of(i);
        let raw = r.word.load(Acquire);
        let w = SlotWord::unpack(raw);
        if !self.is_dead(i, raw, now) {
            return false;
        }
        let free = SlotWord {
            state: SlotState::Free,
            generation: w.generation,
            pid: 0,
        };
        if r.word
            .compare_exchange(raw, free.pack(), AcqRel, Relaxed)
            .is_err()
        {
            return false;
        }
        let tag = rlut::tag(i as Port, w.generation);
        let freed: usize = (0..self.inner.cfg.slots)
            .map(|t| rlut::purge(self.regs_of(t), tag))
            .sum();
        tracing::info!(
            fabric = %self.inner.name,
            slot = i,
            pid = w.pid,
            generation = w.generation,
            rlut_entries_freed = freed,
            "reclaimed the slot of a dead owner"
        );
        true
    }

    /// The link state of slot `i` as any peer sees it: up while the slot is
    /// up and its heartbeat fresh.
    pub(crate) fn link_at(&self, i: usize, now: u64) -> LinkState {
        let raw = self.regs_of(i).word.load(Acquire);
        let w = SlotWord::unpack(raw);
        let fresh = self.heartbeat_age(i, raw, now) <= self.inner.timeout_ns;
        LinkState {
            up: w.state == SlotState::Up && fresh,
            generation: w.generation,
        }
    }

    pub(crate) fn regs_of(&self, i: usize) -> &SlotRegs {
        self.inner.seg.slot(i)
    }

    /// Checks that `port` exists and is not `own`.
    pub(crate) fn check_port(&self, port: Port, own: Port) -> Result<()> {
        if port as usize >= self.inner.cfg.slots || port == own {
            return Err(HwError::NoSuchPeer {
                peer: port,
                ports: self.inner.cfg.slots,
                own,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::NtbDevice;

    fn fabric(dir: &Path, name: &str) -> (EmuFabric, FabricConfig) {
        std::fs::create_dir_all(dir).unwrap();
        let cfg = FabricConfig {
            slots: 2,
            window_size: 1 << 20,
            heartbeat_timeout: Duration::from_secs(2),
            ..FabricConfig::default()
        };
        (EmuFabric::create_in(dir, name, &cfg).unwrap(), cfg)
    }

    /// Removes what [`fabric`] made, once its handle `f` is gone.
    fn remove(dir: &Path, name: &str, f: EmuFabric) {
        drop(f);
        EmuFabric::destroy_in(dir, name).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Every member can write the header: what it writes after we attached
    /// is never read again (no slot index past the real slots, no
    /// scratchpad past the real ones), and attaching to a header it broke
    /// is an error, not a panic.
    #[test]
    fn a_header_rewritten_after_attach_changes_nothing_and_a_broken_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("ntbdk-hdr-{}", std::process::id()));
        let (f, cfg) = fabric(&dir, "hdr");
        let dc = DeviceConfig {
            slot: Some(0),
            fabric: cfg.clone(),
            dir: Some(dir.clone()),
            ..DeviceConfig::default()
        };
        let a = EmuDevice::join(&f, &dc).unwrap();
        let h = f.inner.seg.header();
        h.slots.store(4000, Relaxed);
        h.spads.store(200, Relaxed);
        h.heartbeat_timeout_ns.store(0, Relaxed);
        assert_eq!(f.status().slots.len(), 2);
        assert_eq!(a.spad_count(), cfg.spads);
        assert!(a.spad_read(cfg.spads).is_err());
        a.service().unwrap();
        let e = EmuFabric::attach_in(&dir, "hdr").unwrap_err().to_string();
        assert!(e.contains("corrupt header"), "{e}");
        h.slots.store(2, Relaxed);
        h.spads.store(cfg.spads as u32, Relaxed);
        h.heartbeat_timeout_ns
            .store(cfg.heartbeat_timeout.as_nanos() as u64, Relaxed);
        h.read_latency_ns.store(u64::MAX, Relaxed);
        let e = EmuFabric::attach_in(&dir, "hdr").unwrap_err().to_string();
        assert!(e.contains("read latency"), "{e}");
        drop(a);
        remove(&dir, "hdr", f);
    }

    /// In a directory others may write (as `/dev/shm`), a control segment
    /// that others may access (as one planted by another user would be),
    /// one owned by another user, or a symlink to one, is refused with the
    /// reason; the fabric's own file is attached. In a directory only its
    /// owner may write, nobody else could have planted the file, and its
    /// mode is not checked.
    #[test]
    fn a_control_segment_that_is_not_ours_alone_is_refused_where_others_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ntbdk-own-{}", std::process::id()));
        let (f, _) = fabric(&dir, "own");
        let path = segment_path(&dir, "own");
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&dir, 0o1777);
        drop(EmuFabric::attach_in(&dir, "own").unwrap());
        mode(&path, 0o666);
        let e = EmuFabric::attach_in(&dir, "own").unwrap_err().to_string();
        assert!(e.contains("mode 666") && e.contains("NTBDK_SHM_DIR"), "{e}");
        // A private directory: the same file is taken.
        mode(&dir, 0o755);
        drop(EmuFabric::attach_in(&dir, "own").unwrap());
        mode(&dir, 0o1777);
        mode(&path, 0o600);
        // As root (CI), give the file to another user (where uid 65534 is
        // mapped: not in every user namespace).
        if nix::unistd::geteuid().is_root() {
            let nobody = nix::unistd::Uid::from_raw(65534);
            if nix::unistd::chown(&path, Some(nobody), None).is_ok() {
                let e = EmuFabric::attach_in(&dir, "own").unwrap_err().to_string();
                assert!(e.contains("owned by uid 65534"), "{e}");
                nix::unistd::chown(&path, Some(nix::unistd::geteuid()), None).unwrap();
            }
        }
        let link = segment_path(&dir, "link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = EmuFabric::attach_in(&dir, "link").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_file(&link).unwrap();
        drop(EmuFabric::attach_in(&dir, "own").unwrap());
        mode(&dir, 0o755);
        remove(&dir, "own", f);
    }

    /// A member flipping the header's slot count while we attach: we use
    /// the one value we read and validated, or refuse; never a mix of two
    /// reads (which made `status` index past the mapped slots).
    #[test]
    fn attaching_while_a_member_flips_the_header_uses_one_read() {
        let dir = std::env::temp_dir().join(format!("ntbdk-flip-{}", std::process::id()));
        let (f, _) = fabric(&dir, "flip");
        /// Stops the flipper however the loop ends (a failed assertion
        /// included, or the scope would wait for it forever).
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mut ok, mut refused) = (0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let h = f.inner.seg.header();
                while !stop.load(Relaxed) {
                    h.slots.store(4000, Relaxed);
                    h.slots.store(2, Relaxed);
                }
            });
            let _stop = StopOnDrop(&stop);
            // Until both outcomes were seen (a count of tries can fall in
            // one time slice of the flipper when the two share a core).
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while (ok + refused < 3000 || ok == 0 || refused == 0)
                && std::time::Instant::now() < end
            {
                match EmuFabric::attach_in(&dir, "flip") {
                    Ok(g) => {
                        assert_eq!(g.status().slots.len(), 2);
                        ok += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
        });
        assert!(
            ok > 0 && refused > 0,
            "no race: {ok} attached, {refused} refused"
        );
        f.inner.seg.header().slots.store(2, Relaxed);
        remove(&dir, "flip", f);
    }

    /// A last scan a member dated in the future is due at once: no member
    /// can switch the scan for dead slots off.
    #[test]
    fn a_last_scan_in_the_future_is_due() {
        let dir = std::env::temp_dir().join(format!("ntbdk-scan-{}", std::process::id()));
        let (f, _) = fabric(&dir, "scan");
        let last = &f.inner.seg.header().last_scan_ns;
        last.store(u64::MAX, Relaxed);
        let now = now_ns();
        f.maybe_scan(now);
        assert_eq!(last.load(Relaxed), now);
        remove(&dir, "scan", f);
    }
}
