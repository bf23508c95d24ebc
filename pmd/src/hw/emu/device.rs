//! [`EmuDevice`]: one host on the emulated fabric, implementing
//! [`NtbDevice`].

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, fence};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::DeviceConfig;
use super::fabric::EmuFabric;
use super::layout::{MAX_GRANT, SlotRegs, SlotState, SlotWord};
use super::liveness::{now_ns, own_pid, own_start};
use super::rlut;
use super::segment::shm_dir;
use super::windows::WindowMem;
use crate::hw::grant_table::{GRANT_TABLE_LEN, GrantRefused, LiveGrants};
use crate::hw::{
    CounterSnapshot, DeviceCounters, GrantId, HwError, Keepalive, LinkEvent, LinkState,
    LocalWindow, MwGeometry, NtbDevice, PeerGrant, PeerWindow, Port, Result, Strided, Tenure,
};

/// Inbound translations must be aligned to this.
const XLAT_ALIGN: usize = 4096;

/// One host on an emulated fabric: it owns a slot, its inbound window and
/// its registers until dropped.
///
/// Dropping it stops its heartbeat and frees the slot: peers see the link go
/// down. If the process dies instead, peers see the link go down when the
/// heartbeat goes stale, and the slot is reclaimed.
///
/// # Example
/// ```
/// use ntbdk_pmd::hw::NtbDevice;
/// use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};
///
/// let dir = std::env::temp_dir().join(format!("ntbdk-doc-device-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let cfg = DeviceConfig {
///     fabric: FabricConfig { slots: 4, window_size: 64 << 10, ..Default::default() },
///     dir: Some(dir.clone()),
///     ..Default::default()
/// };
/// // Two hosts (here in one process; normally two processes).
/// let a = EmuDevice::open("doc", &cfg).unwrap();
/// let b = EmuDevice::open("doc", &cfg).unwrap();
/// assert!(a.link(b.port()).unwrap().up);
///
/// // Posted writes into b's window; b reads its own window.
/// let w = a.peer_window(b.port(), 0).unwrap();
/// w.write(128, b"hello").unwrap();
/// w.write_u64(0, 1).unwrap();
/// let mine = b.local_window(0).unwrap();
/// assert_eq!(mine.load_u64(0).unwrap(), 1);
/// let mut buf = [0u8; 5];
/// mine.read(128, &mut buf).unwrap();
/// assert_eq!(&buf, b"hello");
///
/// // Doorbells and scratchpads.
/// a.peer_db_set(b.port(), 0b101).unwrap();
/// assert_eq!(b.db_read(), 0b101);
/// a.peer_spad_write(b.port(), 3, 0xfeed).unwrap();
/// assert_eq!(b.spad_read(3).unwrap(), 0xfeed);
/// assert_eq!(a.counters().non_posted_reads, 0);
///
/// drop((a, b));
/// EmuFabric::destroy_in(&dir, "doc").unwrap();
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub struct EmuDevice {
    inner: Arc<Inner>,
    heartbeat: Option<JoinHandle<()>>,
}

/// A peer's window mapping and the generation it belongs to.
type PeerMap = (u64, WindowMem);

struct Inner {
    fabric: EmuFabric,
    port: Port,
    /// Our packed word while we own the slot (state up).
    word: u64,
    generation: u64,
    window: WindowMem,
    counters: Arc<DeviceCounters>,
    read_latency: Duration,
    /// Peer window mappings, by peer, with the generation they belong to.
    peer_maps: Vec<Mutex<Option<PeerMap>>>,
    /// Link state per port as last reported by `poll_link_events`.
    seen: Mutex<Vec<LinkState>>,
    lost: AtomicBool,
    stop: AtomicBool,
    background: bool,
    /// Serialises our edits of our slot's grant table (one writer).
    grant_edits: Mutex<()>,
}

impl std::fmt::Debug for EmuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuDevice")
            .field("fabric", &self.inner.fabric.name())
            .field("port", &self.inner.port)
            .field("generation", &self.inner.generation)
            .finish_non_exhaustive()
    }
}

/// Holds one R-LUT entry of a target for the duration of a non-posted read.
struct RlutEntry<'a> {
    target: &'a SlotRegs,
    bit: usize,
    /// The requester's tag the entry was taken for.
    tag: u32,
}

impl Drop for RlutEntry<'_> {
    fn drop(&mut self) {
        rlut::release(self.target, self.bit, self.tag);
    }
}

/// Waits `d`: spinning for short (emulated bus) latencies, sleeping for long.
fn hold(d: Duration) {
    if d >= Duration::from_micros(100) {
        std::thread::sleep(d);
    } else {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }
}

impl EmuDevice {
    /// Opens (creating it if needed, see [`EmuFabric::open`]) fabric `name`
    /// in `cfg.dir` and joins it.
    pub fn open(name: &str, cfg: &DeviceConfig) -> Result<EmuDevice> {
        let dir = cfg.dir.clone().unwrap_or_else(shm_dir);
        let fabric = EmuFabric::open_in(&dir, name, &cfg.fabric)?;
        Self::join(&fabric, cfg)
    }

    /// Joins `fabric`: claims a slot (`cfg.slot` or the first free one,
    /// reclaiming dead owners' slots on the way), creates and publishes the
    /// inbound window, then brings the link up.
    pub fn join(fabric: &EmuFabric, cfg: &DeviceConfig) -> Result<EmuDevice> {
        let fcfg = fabric.config().clone();
        let (port, generation) = claim(fabric, cfg.slot)?;
        let regs = fabric.regs_of(port as usize);
        let pid = own_pid();
        let claimed = SlotWord {
            state: SlotState::Claimed,
            generation,
            pid,
        }
        .pack();
        let release = || {
            let free = SlotWord {
                state: SlotState::Free,
                generation,
                pid: 0,
            };
            let _ = regs
                .word
                .compare_exchange(claimed, free.pack(), AcqRel, Relaxed);
        };
        // Whether the slot is still ours: a claimer stalled past the
        // heartbeat timeout (a paused VM, where only heartbeats tell) may
        // have been reaped and its slot taken, and must not reset or
        // publish over the new owner's registers.
        let taken = || {
            HwError::Fabric(format!(
                "slot {port} of fabric {:?} was taken from us while we set it up \
                 (were we stalled past the {:?} heartbeat timeout?): try again",
                fabric.name(),
                fcfg.heartbeat_timeout
            ))
        };
        if regs.word.load(Acquire) != claimed {
            return Err(taken());
        }
        // Fresh registers for the new generation. The grant template's
        // sequence number keeps rising across owners (count 0: nothing
        // published), so that a reader of the last owner's template cannot
        // take a mix of the two for one.
        regs.owner_start.store(own_start(), Relaxed);
        regs.heartbeat_ns.store(now_ns(), Relaxed);
        regs.heartbeat_count.store(0, Relaxed);
        regs.db.store(0, Relaxed);
        regs.db_mask.store(0, Relaxed);
        regs.xlat_iova.store(0, Relaxed);
        regs.xlat_size.store(0, Relaxed);
        regs.rlut_refusals.store(0, Relaxed);
        let template_seq = (regs.grant_count.load(Relaxed) >> 32) as u32;
        regs.grant_count
            .store(u64::from(template_seq.wrapping_add(2) & !1) << 32, Relaxed);
        regs.grants.reset();
        for c in &regs.counters {
            c.store(0, Relaxed);
        }
        for s in &regs.spads {
            s.store(0, Relaxed);
        }
        let window = match WindowMem::own(fabric, port) {
            Ok(w) => w,
            Err(e) => {
                release();
                return Err(e);
            }
        };
        if regs.word.load(Acquire) != claimed {
            return Err(taken());
        }
        regs.win_pid.store(window.published_pid(), Relaxed);
        regs.win_fd.store(window.published_fd(), Relaxed);
        regs.win_len.store(window.len() as u64, Relaxed);
        regs.win_page.store(window.page_size() as u64, Relaxed);
        regs.heartbeat_ns.store(now_ns(), Relaxed);
        let up = SlotWord {
            state: SlotState::Up,
            generation,
            pid,
        }
        .pack();
        if regs
            .word
            .compare_exchange(claimed, up, Release, Relaxed)
            .is_err()
        {
            return Err(taken());
        }
        tracing::debug!(
            fabric = fabric.name(),
            port,
            generation,
            huge = window.is_huge(),
            "joined"
        );
        let inner = Arc::new(Inner {
            fabric: fabric.clone(),
            port,
            word: up,
            generation,
            window,
            counters: Arc::new(DeviceCounters::default()),
            read_latency: cfg.read_latency.unwrap_or(fcfg.read_latency),
            peer_maps: (0..fcfg.slots).map(|_| Mutex::new(None)).collect(),
            seen: Mutex::new(vec![
                LinkState {
                    up: false,
                    generation: 0
                };
                fcfg.slots
            ]),
            lost: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            background: cfg.heartbeat_thread,
            grant_edits: Mutex::new(()),
        });
        let heartbeat = if cfg.heartbeat_thread {
            let period = (fcfg.heartbeat_timeout / 4).max(Duration::from_micros(500));
            let inner2 = inner.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ntb-hb-{port}"))
                .spawn(move || {
                    while !inner2.stop.load(Acquire) {
                        std::thread::park_timeout(period);
                        inner2.beat();
                        inner2.fabric.maybe_scan(now_ns());
                    }
                });
            match spawned {
                Ok(h) => Some(h),
                Err(source) => {
                    inner.leave();
                    return Err(HwError::Io {
                        what: "spawning the heartbeat thread".into(),
                        source,
                    });
                }
            }
        } else {
            None
        };
        Ok(EmuDevice { inner, heartbeat })
    }

    /// The fabric this device is on.
    pub fn fabric(&self) -> &EmuFabric {
        &self.inner.fabric
    }

    /// The live counters (shared with every window handle of this device).
    pub fn counters_handle(&self) -> Arc<DeviceCounters> {
        self.inner.counters.clone()
    }

    /// Whether our slot was taken from us (declared dead while we were
    /// stalled, then reclaimed). A lost device must be dropped and rejoined.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.load(Relaxed)
    }

    /// Whether the inbound window is backed by hugepages.
    pub fn window_is_huge(&self) -> bool {
        self.inner.window.is_huge()
    }

    fn regs(&self) -> &SlotRegs {
        self.inner.fabric.regs_of(self.inner.port as usize)
    }

    /// Fails with [`HwError::SlotLost`] unless the slot is still ours: a
    /// host dropped from the fabric must not edit the grant table of the
    /// host that took its place (whose grants its stale ids would
    /// withdraw). Checked before each edit; a reclaim between the check and
    /// the edit needs this host stalled past the heartbeat timeout in
    /// between, as any reclaim does. Also before each register write, so
    /// one load of the slot word (not the `lost` flag, which only ever
    /// follows the word changing, and shares a line with locks the
    /// heartbeat takes): the word's line is written only on join, leave
    /// and reclaim, and by heartbeats, four per timeout.
    #[inline]
    fn still_ours(&self) -> Result<()> {
        if self.regs().word.load(Acquire) != self.inner.word {
            return Err(HwError::SlotLost {
                port: self.inner.port,
            });
        }
        Ok(())
    }

    fn spads(&self) -> usize {
        self.inner.fabric.config().spads
    }

    fn check_spad(&self, index: usize) -> Result<()> {
        if index >= self.spads() {
            return Err(HwError::NoSuchSpad {
                index,
                count: self.spads(),
            });
        }
        Ok(())
    }

    fn check_mw(&self, mw: usize) -> Result<()> {
        if mw != 0 {
            return Err(HwError::NoSuchWindow { mw, count: 1 });
        }
        Ok(())
    }

    /// What `peer` published as its grant (see [`NtbDevice::grant_peers`]),
    /// if anything. Read when a handle onto its window is built: a peer
    /// grants once, when its transport starts, before its first hello.
    ///
    /// The template is read under its sequence lock (see
    /// `SlotRegs::grant_count`). One still being rewritten after a bounded
    /// number of tries (its owner preempted mid-rewrite, or a peer that
    /// never finishes) is an error: the handle is asked for again later.
    fn published_grant(&self, peer: Port) -> Result<Option<PeerGrant>> {
        let r = self.inner.fabric.regs_of(peer as usize);
        for _ in 0..GRANT_READ_TRIES {
            let before = r.grant_count.load(Acquire);
            if (before >> 32) % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let n = ((before & u64::from(u32::MAX)) as usize).min(MAX_GRANT);
            if n == 0 {
                return Ok(None);
            }
            let mut g = PeerGrant::default();
            for e in &r.grant[..n] {
                let [kind, base, stride, len] = e.each_ref().map(|w| w.load(Relaxed) as usize);
                match kind {
                    1 => g.per_port.push(Strided { base, stride, len }),
                    2 => g.shared.push(base..base.saturating_add(len)),
                    _ => {}
                }
            }
            // The copy happens before the second look at the word.
            fence(Acquire);
            if r.grant_count.load(Relaxed) == before {
                return Ok(Some(g));
            }
        }
        Err(HwError::Fabric(format!(
            "port {peer}'s grant template was being rewritten at each of \
             {GRANT_READ_TRIES} looks: try again (a live peer finishes in \
             microseconds)"
        )))
    }

    /// Checks `peer` and that its link is up; returns its registers and word.
    fn up_peer(&self, peer: Port) -> Result<(&SlotRegs, u64)> {
        let f = &self.inner.fabric;
        f.check_port(peer, self.inner.port)?;
        let r = f.regs_of(peer as usize);
        let raw = r.word.load(Acquire);
        if !f.link_at(peer as usize, now_ns()).up {
            return Err(HwError::LinkDown { peer });
        }
        Ok((r, raw))
    }

    /// `peer`'s window, mapped (cached per generation).
    fn peer_mem(&self, peer: Port) -> Result<WindowMem> {
        let (r, raw) = self.up_peer(peer)?;
        let w = SlotWord::unpack(raw);
        let mut slot = self.inner.peer_maps[peer as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((g, z)) = slot.as_ref()
            && *g == w.generation
        {
            return Ok(z.clone());
        }
        let zone = WindowMem::peer(&self.inner.fabric, peer, r, w.pid).map_err(|e| {
            if r.word.load(Acquire) != raw {
                HwError::LinkDown { peer }
            } else {
                e
            }
        })?;
        // The owner may have left and another taken the slot meanwhile.
        if r.word.load(Acquire) != raw {
            return Err(HwError::LinkDown { peer });
        }
        let size = self.inner.fabric.config().window_size;
        if zone.len() < size {
            return Err(HwError::Fabric(format!(
                "port {peer}'s window is {} bytes, the fabric promises {size}",
                zone.len()
            )));
        }
        *slot = Some((w.generation, zone.clone()));
        Ok(zone)
    }

    /// Takes an R-LUT entry of `target` or counts the refusal.
    fn take_rlut<'a>(&self, target: &'a SlotRegs) -> Result<RlutEntry<'a>> {
        let entries = self.inner.fabric.config().rlut_entries;
        let tag = rlut::tag(self.inner.port, self.inner.generation);
        match rlut::take(target, entries, tag) {
            Some(bit) => Ok(RlutEntry { target, bit, tag }),
            None => {
                self.inner.counters.rlut_refused();
                target.rlut_refusals.fetch_add(1, Relaxed);
                Err(HwError::RlutExhausted { entries })
            }
        }
    }
}

/// Looks at a peer's grant template before it is taken as being rewritten
/// without end (see `published_grant`).
const GRANT_READ_TRIES: usize = 64;

/// Claims `want` or the first free slot; returns it and its new generation.
///
/// A handle that cannot judge the taken slots yet (heartbeat-only liveness,
/// just opened) watches them for a timeout and tries once more: slots of
/// hosts that died are then reclaimed and taken.
fn claim(fabric: &EmuFabric, want: Option<Port>) -> Result<(Port, u64)> {
    match claim_once(fabric, want) {
        Err(HwError::Fabric(_)) if fabric.watch_if_new() => claim_once(fabric, want),
        done => done,
    }
}

/// One try of [`claim`].
fn claim_once(fabric: &EmuFabric, want: Option<Port>) -> Result<(Port, u64)> {
    let slots = fabric.config().slots;
    let pid = own_pid();
    let try_slot = |i: usize| -> std::result::Result<u64, SlotWord> {
        let r = fabric.regs_of(i);
        for _ in 0..8 {
            let raw = r.word.load(Acquire);
            let w = SlotWord::unpack(raw);
            if w.state != SlotState::Free {
                if fabric.reclaim_if_dead(i, now_ns()) {
                    continue;
                }
                return Err(w);
            }
            let generation = SlotWord::next_generation(w.generation);
            let claimed = SlotWord {
                state: SlotState::Claimed,
                generation,
                pid,
            };
            if r.word
                .compare_exchange(raw, claimed.pack(), AcqRel, Relaxed)
                .is_ok()
            {
                return Ok(generation);
            }
        }
        Err(SlotWord::unpack(r.word.load(Acquire)))
    };
    match want {
        Some(p) => {
            if p as usize >= slots {
                return Err(HwError::Invalid(format!(
                    "no slot {p}: fabric {:?} has {slots} slots (0..={})",
                    fabric.name(),
                    slots - 1
                )));
            }
            try_slot(p as usize).map(|g| (p, g)).map_err(|w| {
                HwError::Fabric(format!(
                    "slot {p} of fabric {:?} is {} by pid {} (generation {}): pick another \
                     slot, or let the device take the first free one",
                    fabric.name(),
                    w.state,
                    w.pid,
                    w.generation
                ))
            })
        }
        None => (0..slots)
            .find_map(|i| try_slot(i).ok().map(|g| (i as Port, g)))
            .ok_or_else(|| {
                HwError::Fabric(format!(
                    "all {slots} slots of fabric {:?} are taken by live owners: wait for one \
                     to leave, or use a fabric with more slots",
                    fabric.name()
                ))
            }),
    }
}

impl Inner {
    /// One heartbeat: proves we are alive and mirrors our counters into the
    /// slot for `ntb-tool status`. Detects a lost slot.
    fn beat(&self) {
        let r = self.fabric.regs_of(self.port as usize);
        if r.word.load(Acquire) != self.word {
            if !self.lost.swap(true, Relaxed) {
                tracing::warn!(
                    fabric = self.fabric.name(),
                    port = self.port,
                    "our slot was reclaimed by a peer (we were stalled past the heartbeat \
                     timeout): this device must be dropped and rejoined"
                );
            }
            return;
        }
        r.heartbeat_ns.store(now_ns(), Relaxed);
        r.heartbeat_count.fetch_add(1, Relaxed);
        let c = self.counters.snapshot();
        for (reg, v) in r.counters.iter().zip([
            c.posted_writes,
            c.posted_bytes,
            c.non_posted_reads,
            c.non_posted_bytes,
            c.rlut_refusals,
            c.ungranted_writes,
        ]) {
            reg.store(v, Relaxed);
        }
    }

    /// Frees the slot, if it is still ours.
    fn leave(&self) {
        let r = self.fabric.regs_of(self.port as usize);
        let free = SlotWord {
            state: SlotState::Free,
            generation: self.generation,
            pid: 0,
        };
        self.beat(); // last counters for the record
        if r.word
            .compare_exchange(self.word, free.pack(), AcqRel, Relaxed)
            .is_ok()
        {
            tracing::debug!(fabric = self.fabric.name(), port = self.port, "left");
        }
    }
}

impl Drop for EmuDevice {
    fn drop(&mut self) {
        self.inner.stop.store(true, Release);
        if let Some(h) = self.heartbeat.take() {
            h.thread().unpark();
            let _ = h.join();
        }
        self.inner.leave();
    }
}

impl NtbDevice for EmuDevice {
    fn port(&self) -> Port {
        self.inner.port
    }

    fn port_count(&self) -> usize {
        self.inner.fabric.config().slots
    }

    fn generation(&self) -> u64 {
        self.inner.generation
    }

    fn link(&self, peer: Port) -> Result<LinkState> {
        self.inner.fabric.check_port(peer, self.inner.port)?;
        Ok(self.inner.fabric.link_at(peer as usize, now_ns()))
    }

    fn poll_link_events(&self, out: &mut Vec<LinkEvent>) -> usize {
        let now = now_ns();
        let mut seen = self
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = out.len();
        for (p, last) in seen.iter_mut().enumerate() {
            if p == self.inner.port as usize {
                continue;
            }
            let cur = self.inner.fabric.link_at(p, now);
            let cur = LinkState {
                up: cur.up,
                // A down link keeps the generation that went down.
                generation: if cur.up {
                    cur.generation
                } else {
                    last.generation
                },
            };
            if cur == *last {
                continue;
            }
            let peer = p as Port;
            if last.up {
                // The window of the owner that left is not mapped on, so
                // its memory (hugepages, often) goes with its owner.
                *self.inner.peer_maps[p]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                out.push(LinkEvent::Down {
                    peer,
                    generation: last.generation,
                });
            }
            if cur.up {
                out.push(LinkEvent::Up {
                    peer,
                    generation: cur.generation,
                });
            }
            *last = cur;
        }
        out.len() - before
    }

    fn check_tenure(&self) -> Result<()> {
        self.still_ours()
    }

    fn service(&self) -> Result<()> {
        self.inner.beat();
        if !self.inner.background {
            self.inner.fabric.maybe_scan(now_ns());
        }
        if self.inner.lost.load(Relaxed) {
            return Err(HwError::SlotLost {
                port: self.inner.port,
            });
        }
        Ok(())
    }

    fn mw_count(&self) -> usize {
        1
    }

    fn mw_geometry(&self, mw: usize) -> Result<MwGeometry> {
        self.check_mw(mw)?;
        Ok(MwGeometry {
            size: self.inner.fabric.config().window_size,
            addr_align: XLAT_ALIGN,
            size_align: XLAT_ALIGN,
        })
    }

    fn local_window(&self, mw: usize) -> Result<LocalWindow> {
        self.check_mw(mw)?;
        Ok(self
            .inner
            .window
            .local_window(self.inner.fabric.config().window_size))
    }

    fn peer_window(&self, peer: Port, mw: usize) -> Result<PeerWindow> {
        self.check_mw(mw)?;
        let z = self.peer_mem(peer)?;
        let word = self
            .inner
            .fabric
            .regs_of(self.inner.port as usize)
            .word
            .as_ptr();
        let keep: Keepalive = Arc::new(self.inner.fabric.clone());
        // SAFETY: our slot word lies in the control segment, which the
        // fabric handle in `keep` keeps mapped; every party accesses it
        // atomically (it is an AtomicU64 there).
        let tenure = unsafe { Tenure::from_raw(word, self.inner.word, self.inner.port, keep) };
        // `peer_mem` checked the mapping holds at least `window_size` bytes.
        let win = z
            .peer_window(
                self.inner.fabric.config().window_size,
                peer,
                self.inner.counters.clone(),
            )
            .with_tenure(tenure);
        let Some(g) = self.published_grant(peer)? else {
            return Ok(win);
        };
        let table = &self.inner.fabric.regs_of(peer as usize).grants;
        let keep: Keepalive = Arc::new(self.inner.fabric.clone());
        // SAFETY: the peer's grant table lies in the control segment, which
        // the fabric handle in `keep` keeps mapped; it is atomics only.
        let live = unsafe { LiveGrants::from_raw(table, self.inner.port, keep) };
        Ok(win
            .with_grant(g.ranges_for(self.inner.port))
            .with_live_grants(live))
    }

    fn grant_peers(&self, mw: usize, grant: &PeerGrant) -> Result<bool> {
        self.check_mw(mw)?;
        let n = grant.per_port.len() + grant.shared.len();
        if n > MAX_GRANT {
            return Err(HwError::Invalid(format!(
                "a grant of {n} ranges: this fabric keeps at most {MAX_GRANT}"
            )));
        }
        self.still_ours()?;
        // One editor of our grants at a time: two threads sharing this
        // device would otherwise interleave their ranges under one even
        // sequence number, which a reader would take for a whole template.
        let _edit = self
            .inner
            .grant_edits
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let r = self.regs();
        // Sequence lock (see `SlotRegs::grant_count`): odd while the ranges
        // change, even with the new count after.
        let seq = (r.grant_count.load(Relaxed) >> 32) as u32;
        let editing = seq.wrapping_add(1) | 1;
        r.grant_count.store(u64::from(editing) << 32, Relaxed);
        // The odd word is seen before any range changes.
        fence(Release);
        let entries = grant
            .per_port
            .iter()
            .map(|s| [1, s.base, s.stride, s.len])
            .chain(grant.shared.iter().map(|x| [2, x.start, 0, x.len()]));
        for (slot, e) in r.grant.iter().zip(entries) {
            for (w, v) in slot.iter().zip(e) {
                w.store(v as u64, Relaxed);
            }
        }
        let done = u64::from(editing.wrapping_add(1)) << 32;
        r.grant_count.store(done | n as u64, Release);
        // Enforced in the handles every ntbdk peer builds; but where every
        // host maps one shared region whole (ivshmem), a host that ignores
        // the grant can still write anywhere: not isolation.
        Ok(self.inner.fabric.inner.windows.is_none())
    }

    fn grant_range(
        &self,
        mw: usize,
        offset: usize,
        len: usize,
        peer: Option<Port>,
    ) -> Result<Option<GrantId>> {
        self.check_mw(mw)?;
        let window_len = self.inner.fabric.config().window_size;
        if offset.checked_add(len).is_none_or(|end| end > window_len) {
            return Err(HwError::OutOfBounds {
                offset,
                len,
                window_len,
            });
        }
        match peer {
            // We write our own window directly, not through a grant.
            Some(p) if p == self.inner.port => return Ok(None),
            Some(p) => self.inner.fabric.check_port(p, self.inner.port)?,
            None => {}
        }
        let _one_editor = self
            .inner
            .grant_edits
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.still_ours()?;
        match self.regs().grants.grant(offset, len, peer) {
            Ok(id) => Ok(Some(id)),
            Err(GrantRefused::Full) => Err(HwError::GrantTableFull {
                offset,
                len,
                capacity: GRANT_TABLE_LEN,
            }),
            Err(GrantRefused::Unrepresentable) => Err(HwError::Invalid(format!(
                "a grant of {len} bytes at offset {offset}: empty, or longer than a grant \
                 table entry holds"
            ))),
        }
    }

    fn withdraw_range(&self, mw: usize, id: GrantId) {
        if self.check_mw(mw).is_err() {
            return;
        }
        let _one_editor = self
            .inner
            .grant_edits
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The table may be another host's now (see `still_ours`).
        if self.still_ours().is_ok() {
            self.regs().grants.withdraw(id);
        }
    }

    fn set_inbound_translation(&self, mw: usize, iova: u64, size: usize) -> Result<()> {
        self.check_mw(mw)?;
        let max = self.inner.fabric.config().window_size;
        if size == 0
            || size > max
            || !size.is_multiple_of(XLAT_ALIGN)
            || !iova.is_multiple_of(XLAT_ALIGN as u64)
        {
            return Err(HwError::Invalid(format!(
                "inbound translation {iova:#x}+{size:#x}: the address and size must be \
                 multiples of {XLAT_ALIGN} and the size 1..={max} bytes"
            )));
        }
        self.still_ours()?;
        let r = self.regs();
        r.xlat_iova.store(iova, Relaxed);
        r.xlat_size.store(size as u64, Release);
        Ok(())
    }

    fn db_valid_mask(&self) -> u64 {
        self.inner.fabric.config().db_valid_mask()
    }

    fn db_read(&self) -> u64 {
        self.regs().db.load(Acquire)
    }

    fn db_clear(&self, bits: u64) {
        if self.still_ours().is_ok() {
            self.regs().db.fetch_and(!bits, AcqRel);
        }
    }

    fn db_mask(&self) -> u64 {
        self.regs().db_mask.load(Acquire)
    }

    fn db_set_mask(&self, bits: u64) {
        if self.still_ours().is_ok() {
            self.regs()
                .db_mask
                .fetch_or(bits & self.db_valid_mask(), AcqRel);
        }
    }

    fn db_clear_mask(&self, bits: u64) {
        if self.still_ours().is_ok() {
            self.regs().db_mask.fetch_and(!bits, AcqRel);
        }
    }

    fn peer_db_set(&self, peer: Port, bits: u64) -> Result<()> {
        let valid = self.db_valid_mask();
        if bits & !valid != 0 {
            return Err(HwError::Invalid(format!(
                "doorbell bits {bits:#x} outside the device's doorbell (mask {valid:#x})"
            )));
        }
        self.still_ours()?;
        let (r, _) = self.up_peer(peer)?;
        r.db.fetch_or(bits, Release);
        r.db_rings.fetch_add(1, Relaxed);
        self.inner.counters.posted(8);
        Ok(())
    }

    fn spad_count(&self) -> usize {
        self.spads()
    }

    fn spad_read(&self, index: usize) -> Result<u32> {
        self.check_spad(index)?;
        Ok(self.regs().spads[index].load(Acquire))
    }

    fn spad_write(&self, index: usize, value: u32) -> Result<()> {
        self.check_spad(index)?;
        self.still_ours()?;
        self.regs().spads[index].store(value, Release);
        Ok(())
    }

    fn peer_spad_write(&self, peer: Port, index: usize, value: u32) -> Result<()> {
        self.check_spad(index)?;
        self.still_ours()?;
        let (r, _) = self.up_peer(peer)?;
        r.spads[index].store(value, Release);
        self.inner.counters.posted(4);
        Ok(())
    }

    fn peer_spad_read(&self, peer: Port, index: usize) -> Result<u32> {
        self.check_spad(index)?;
        let (r, _) = self.up_peer(peer)?;
        let _entry = self.take_rlut(r)?;
        hold(self.inner.read_latency);
        let v = r.spads[index].load(Acquire);
        self.inner.counters.non_posted(4);
        Ok(v)
    }

    fn non_posted_read(&self, peer: Port, mw: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_mw(mw)?;
        let window_len = self.inner.fabric.config().window_size;
        match offset.checked_add(dst.len()) {
            Some(end) if end <= window_len => {}
            _ => {
                return Err(HwError::OutOfBounds {
                    offset,
                    len: dst.len(),
                    window_len,
                });
            }
        }
        let z = self.peer_mem(peer)?;
        let r = self.inner.fabric.regs_of(peer as usize);
        let _entry = self.take_rlut(r)?;
        hold(self.inner.read_latency);
        // SAFETY: `offset + dst.len() <= window_size <= z.len()` (checked
        // above and in `peer_mem`); the mapping lives while `z` does; `dst`
        // is a unique borrow of ordinary memory, distinct from the mapping.
        unsafe { std::ptr::copy(z.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        self.inner.counters.non_posted(dst.len());
        Ok(())
    }

    fn counters(&self) -> CounterSnapshot {
        self.inner.counters.snapshot()
    }
}
