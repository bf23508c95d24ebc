//! [`IntelNtb`]: an Intel Xeon NTB (gen3, gen4) as an [`NtbDevice`], reached
//! through [`Mmio`] only (BAR0 and config space), so the same code drives a
//! BAR mapped through vfio and the register model.
//!
//! Bring-up follows the public drivers' sequence, in ntbdk's own code
//! (`linux:drivers/ntb/hw/intel/ntb_hw_gen3.c` `gen3_init_ntb`,
//! `intel_ntb3_link_enable`; `linux:drivers/ntb/hw/intel/ntb_hw_gen4.c`
//! `gen4_init_dev`, `intel_ntb4_link_enable`; `dpdk:drivers/raw/ntb/ntb_hw_intel.c`
//! `intel_ntb_dev_init`):
//! 1. identify the part (device ID, revision) and the side (port definition);
//! 2. zero-length inbound windows (limit = BAR start, base 0);
//! 3. gen3: enable the secondary side (`SPCICMD` = memory | master);
//! 4. doorbells masked in the hardware (polled: no interrupt is taken; the
//!    status still latches) and all cleared;
//! 5. back our inbound windows with memory at an aligned IOVA and translate
//!    them (base, limit; gen3 the external limit, Ice Lake the base index);
//! 6. enable the link (snoop bits, link-disable cleared; gen4 link training);
//! 7. announce ourselves through the peer's scratchpads ([`super::handshake`]).
//!
//! Closing announces `BYE`, disables the link and clears the translations.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::IntelError;
use super::handshake::{
    Announcement, DB_CTRL, DB_USER_MASK, Kind, SPAD_HEARTBEAT, SPAD_USER, new_generation,
};
use super::memory::{InboundMemory, Outbound};
use super::part::{B2bSide, IntelPart};
use super::regs::{self, DB_LINK_BIT, DB_MASK, DB_STATUS, SPAD_COUNT};
use crate::hw::mmio::Mmio;
use crate::hw::{
    CounterSnapshot, DeviceCounters, HwError, LinkEvent, LinkState, LocalWindow, MwGeometry,
    NtbDevice, PeerWindow, Port, Result, store_fence,
};

/// Page granularity of window sizes.
const PAGE: usize = 4096;

/// The longest a side goes between two heartbeats (see
/// [`IntelConfig::heartbeat_timeout`]).
pub const BEAT_PERIOD: Duration = Duration::from_millis(100);

/// How to bring an Intel NTB up.
#[derive(Debug, Clone)]
pub struct IntelConfig {
    /// Bytes of memory behind each inbound window; `None` (default) = the
    /// whole BAR. A multiple of 4 KiB, at most the BAR size.
    pub window_size: Option<usize>,
    /// How many windows to back and translate at open (0..=2; default 2).
    pub windows: usize,
    /// Declare the peer gone when its heartbeat scratchpad stops advancing
    /// for this long (`None`, the default: only the link status, a new
    /// generation or a `BYE` end a peer), and tell it so with a `BYE`, so
    /// that both sides see the link down until one of them restarts. Every
    /// side beats, whether or not it judges its peer: every quarter of its
    /// own timeout, and at least every [`BEAT_PERIOD`] (so a peer that
    /// judges with a timeout of 4 × `BEAT_PERIOD` or more can rely on a
    /// side that does not).
    pub heartbeat_timeout: Option<Duration>,
}

impl Default for IntelConfig {
    fn default() -> Self {
        IntelConfig {
            window_size: None,
            windows: 2,
            heartbeat_timeout: None,
        }
    }
}

/// The peer driver as its announcements describe it.
#[derive(Debug, Clone, Copy)]
struct PeerInfo {
    generation: u64,
    inbound_pages: [u32; 2],
}

#[derive(Debug)]
struct State {
    /// Memory this device allocated for inbound windows.
    backing: Vec<LocalWindow>,
    /// What each inbound window is translated to, if it is our memory.
    local: [Option<LocalWindow>; 2],
    db_mask: u64,
    /// The hardware link, as last read.
    hw_up: bool,
    peer: Option<PeerInfo>,
    /// The last peer generation that ended (reported with a down link).
    last_generation: u64,
    /// A generation that said `BYE` or stopped beating: not brought up again.
    gone: Option<u64>,
    events: Vec<LinkEvent>,
    beat: u32,
    beat_sent: Instant,
    peer_beat: u32,
    peer_beat_at: Instant,
    /// Whether a peer of an older scratchpad layout was reported.
    warned_older: bool,
}

/// Link events kept for [`NtbDevice::poll_link_events`]; past that the
/// oldest go (a peer announcing new generations without end, to an
/// application that never asks, must not grow the list without end; the
/// link state itself is always current).
const MAX_PENDING_EVENTS: usize = 64;

impl State {
    fn push_event(&mut self, e: LinkEvent) {
        if self.events.len() >= MAX_PENDING_EVENTS {
            self.events.remove(0);
        }
        self.events.push(e);
    }
}

/// An Intel Xeon NTB driven through its registers.
pub struct IntelNtb<M: Mmio> {
    bar0: M,
    config: Arc<dyn Mmio>,
    part: IntelPart,
    side: B2bSide,
    outbound: Box<dyn Outbound>,
    inbound: Box<dyn InboundMemory>,
    counters: Arc<DeviceCounters>,
    generation: u64,
    cfg: IntelConfig,
    state: Mutex<State>,
}

impl<M: Mmio> std::fmt::Debug for IntelNtb<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntelNtb")
            .field("part", &self.part)
            .field("side", &self.side)
            .field("generation", &format_args!("{:#x}", self.generation))
            .finish_non_exhaustive()
    }
}

impl<M: Mmio> IntelNtb<M> {
    /// Brings up the NTB whose BAR0 is `bar0` and whose config space is
    /// `config`; `outbound` are its BAR2/BAR4 apertures and `inbound` the
    /// memory for its inbound windows.
    pub fn new(
        bar0: M,
        config: Arc<dyn Mmio>,
        outbound: Box<dyn Outbound>,
        inbound: Box<dyn InboundMemory>,
        cfg: IntelConfig,
    ) -> Result<IntelNtb<M>, IntelError> {
        let id = config.read32(regs::CFG_ID)?;
        let (vendor, device) = (id as u16, (id >> 16) as u16);
        let revision = config.read32(regs::CFG_REVISION)? as u8;
        if vendor != regs::VENDOR_INTEL {
            return Err(IntelError::UnknownPart { device, revision });
        }
        let part = IntelPart::identify(device, revision)?;
        if bar0.len() < regs::BAR0_MIN_LEN {
            return Err(IntelError::Register(HwError::Invalid(format!(
                "BAR0 is {} bytes; the Intel NTB register block is at least {} bytes \
                 (is this function the NTB?)",
                bar0.len(),
                regs::BAR0_MIN_LEN
            ))));
        }
        let ppd = if part.is_gen4() {
            bar0.read32(regs::GEN4_PPD1)?
        } else {
            config.read32(regs::GEN3_CFG_PPD)? & 0xFF
        };
        let side = part.side(ppd)?;
        if cfg.windows > 2 {
            return Err(IntelError::NoSuchWindow {
                mw: cfg.windows - 1,
            });
        }
        if cfg.heartbeat_timeout.is_some_and(|t| t.is_zero()) {
            return Err(IntelError::Register(HwError::Invalid(
                "a heartbeat timeout of 0 would declare the peer gone at the first poll: \
                 give a positive timeout (a few seconds) or none"
                    .into(),
            )));
        }
        let now = Instant::now();
        let dev = IntelNtb {
            bar0,
            config,
            part,
            side,
            outbound,
            inbound,
            counters: Arc::new(DeviceCounters::default()),
            generation: new_generation(),
            cfg,
            state: Mutex::new(State {
                backing: Vec::new(),
                local: [None, None],
                db_mask: 0,
                hw_up: false,
                peer: None,
                last_generation: 0,
                gone: None,
                events: Vec::new(),
                beat: 0,
                beat_sent: now,
                peer_beat: 0,
                peer_beat_at: now,
                warned_older: false,
            }),
        };
        dev.bring_up()?;
        tracing::debug!(part = part.name(), port = side.port(), "Intel NTB up");
        Ok(dev)
    }

    /// Whether our inbound windows are on hugepages (`None`: the memory
    /// cannot say, as the register model's).
    pub fn inbound_on_hugepages(&self) -> Option<bool> {
        self.inbound.on_hugepages()
    }

    /// The part.
    pub fn part(&self) -> IntelPart {
        self.part
    }

    /// Which end of the back-to-back link we are.
    pub fn side(&self) -> B2bSide {
        self.side
    }

    /// The BAR0 register block (for diagnostics and tests).
    pub fn registers(&self) -> &M {
        &self.bar0
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn peer_spad_offset(&self, i: usize) -> usize {
        if self.part.is_gen4() {
            regs::gen4_peer_spad(i)
        } else {
            regs::gen3_peer_spad(i)
        }
    }

    fn bring_up(&self) -> Result<(), IntelError> {
        let r = &self.bar0;
        if !self.part.is_gen4() {
            // A previous close left the configuration locked; the windows
            // are translated below, before the link is enabled, so unlock
            // first (the link stays disabled). Linux translates only after
            // `intel_ntb3_link_enable` has cleared the lock.
            let cntl = r.read32(regs::NTBCNTL)?;
            r.write32(regs::NTBCNTL, cntl & !regs::NTBCNTL_CFG_LOCK)?;
        }
        // Zero-length windows until translated: limit = BAR start
        // (`gen3_setup_b2b_mw`, `gen4_init_dev`).
        for mw in 0..2 {
            r.write64(regs::xlmt(mw), self.outbound.bar_bus_address(mw))?;
            r.write64(regs::xbase(mw), 0)?;
        }
        if !self.part.is_gen4() {
            // Enable the secondary side; the upper half (secondary status,
            // write-1-to-clear) is written 0.
            r.write32(regs::GEN3_SPCICMD, regs::PCI_COMMAND_MEMORY_MASTER)?;
        }
        // Polled mode: every doorbell and the link bit masked in the
        // hardware, as Linux's `gen3_init_ntb`/`gen4_init_ntb` leave them
        // (`db_valid_mask` into `IM_INT_DISABLE`), since nothing takes the
        // interrupts (vfio-pci would raise INTx for each ring otherwise);
        // the status still latches, and is what we poll. Everything
        // pending is cleared (DPDK `intel_ntb_dev_init`).
        r.write64(DB_MASK, u64::from(u32::MAX) | DB_LINK_BIT)?;
        r.write64(DB_STATUS, u64::from(u32::MAX) | DB_LINK_BIT)?;
        for mw in 0..self.cfg.windows {
            let bar = self.outbound.bar_size(mw);
            let size = self.cfg.window_size.unwrap_or(bar);
            if size == 0 || size > bar || !size.is_multiple_of(PAGE) {
                return Err(IntelError::TranslationSize {
                    mw,
                    size,
                    bar_size: bar,
                });
            }
            let align = self.part.addr_align(bar).max(PAGE) as u64;
            let mem = self.inbound.allocate(size, align)?;
            let iova = mem.iova();
            self.lock().backing.push(mem);
            self.translate(mw, iova, size)?;
        }
        self.link_enable()?;
        let mut st = self.lock();
        st.hw_up = self.read_link()?;
        if st.hw_up {
            self.announce(&mut st, Kind::Hello)?;
        }
        Ok(())
    }

    /// Programs inbound window `mw` to `size` bytes at bus address `iova`
    /// (`intel_ntb3_mw_set_trans` / `intel_ntb4_mw_set_trans` steps).
    pub fn translate(&self, mw: usize, iova: u64, size: usize) -> Result<(), IntelError> {
        if mw >= 2 {
            return Err(IntelError::NoSuchWindow { mw });
        }
        let bar = self.outbound.bar_size(mw);
        if size == 0 || size > bar {
            return Err(IntelError::TranslationSize {
                mw,
                size,
                bar_size: bar,
            });
        }
        let align = self.part.addr_align(bar).max(PAGE);
        if !iova.is_multiple_of(align as u64) {
            return Err(IntelError::TranslationMisaligned {
                part: self.part,
                mw,
                iova,
                align,
            });
        }
        let r = &self.bar0;
        let bus = self.outbound.bar_bus_address(mw);
        r.write64(regs::xbase(mw), iova)?;
        let read = r.read64(regs::xbase(mw))?;
        if read != iova {
            r.write64(regs::xbase(mw), 0)?;
            return Err(IntelError::TranslationReadback {
                mw,
                wrote: iova,
                read,
            });
        }
        let limit = bus + size as u64;
        r.write64(regs::xlmt(mw), limit)?;
        let read = r.read64(regs::xlmt(mw))?;
        if read != limit {
            r.write64(regs::xlmt(mw), bus)?;
            r.write64(regs::xbase(mw), 0)?;
            return Err(IntelError::LimitReadback {
                mw,
                bar: bus,
                wrote: limit,
                read,
            });
        }
        match self.part {
            IntelPart::Gen3Skx => {
                // The external (B2B) side's limit too: its BAR as the
                // secondary side sees it, plus the size.
                let embar = r.read64(regs::gen3_embar(mw))? & !0xF;
                r.write64(regs::gen3_embar_xlmt(mw), embar + size as u64)?;
            }
            IntelPart::Gen4Icx => {
                // NTB_HWERR_BAR_ALIGN: the base index holds log2(size); the
                // other window's index (the other half of the dword) is kept.
                let other = regs::read16(r, regs::gen4_xbaseidx(1 - mw))?;
                regs::write16(r, regs::gen4_xbaseidx(mw), size.ilog2() as u16, other)?;
            }
            IntelPart::Gen4Spr => {}
        }
        let mut st = self.lock();
        st.local[mw] = st.backing.iter().find_map(|b| {
            let off = iova.checked_sub(b.iova())? as usize;
            off.checked_add(size)
                .is_some_and(|end| end <= b.len())
                .then(|| sub_window(b, off, size))
        });
        Ok(())
    }

    fn link_enable(&self) -> Result<(), IntelError> {
        let r = &self.bar0;
        if self.part.is_gen4() {
            r.write32(regs::NTBCNTL, regs::NTBCNTL_SNOOP)?;
            let ctrl = regs::read16(r, regs::GEN4_LINK_CTRL)?;
            // The other half is LINK_STATUS, whose writable bits are
            // write-1-to-clear: written 0.
            regs::write16(
                r,
                regs::GEN4_LINK_CTRL,
                ctrl & !(regs::GEN4_LINK_CTRL_DISABLE as u16),
                0,
            )?;
            let ppd0 = r.read32(regs::GEN4_PPD0)?;
            r.write32(regs::GEN4_PPD0, ppd0 | regs::GEN4_PPD_LINKTRN)?;
            if r.read32(regs::GEN4_PPD0)? & regs::GEN4_PPD_LINKTRN == 0 {
                tracing::warn!(
                    "Intel NTB: link is not training (PPD0 LINKTRN reads back clear); \
                     check the cable or retimers"
                );
            }
        } else {
            let cntl = r.read32(regs::NTBCNTL)?;
            let cntl =
                (cntl & !(regs::NTBCNTL_CFG_LOCK | regs::NTBCNTL_DISABLE)) | regs::NTBCNTL_SNOOP;
            r.write32(regs::NTBCNTL, cntl)?;
        }
        Ok(())
    }

    fn link_disable(&self) -> Result<(), IntelError> {
        let r = &self.bar0;
        let cntl = r.read32(regs::NTBCNTL)? & !regs::NTBCNTL_SNOOP;
        if self.part.is_gen4() {
            r.write32(regs::NTBCNTL, cntl)?;
            let ctrl = regs::read16(r, regs::GEN4_LINK_CTRL)?;
            regs::write16(
                r,
                regs::GEN4_LINK_CTRL,
                ctrl | regs::GEN4_LINK_CTRL_DISABLE as u16,
                0,
            )?;
        }
        // The translations go before the configuration is locked.
        for mw in 0..2 {
            r.write64(regs::xlmt(mw), self.outbound.bar_bus_address(mw))?;
            r.write64(regs::xbase(mw), 0)?;
        }
        if !self.part.is_gen4() {
            r.write32(
                regs::NTBCNTL,
                cntl | regs::NTBCNTL_CFG_LOCK | regs::NTBCNTL_DISABLE,
            )?;
        }
        Ok(())
    }

    /// Reads the link-status register: config space on gen3, MMIO on gen4.
    fn read_link(&self) -> Result<bool, IntelError> {
        let lnk = if self.part.is_gen4() {
            regs::read16(&self.bar0, regs::GEN4_LINK_STATUS)?
        } else {
            regs::read16(self.config.as_ref(), regs::GEN3_CFG_LNKSTS)?
        };
        Ok(u32::from(lnk) & regs::LNK_STA_ACTIVE != 0)
    }

    /// Acknowledges a link-state change (gen4 first writes `SLOTSTS.DLLSCS`,
    /// 16 bits alone on a mapped BAR; slot control, the dword's other half,
    /// is rewritten with its value only where 16-bit stores are not had).
    fn ack_link_change(&self) -> Result<(), IntelError> {
        if self.part.is_gen4() {
            let slot_ctrl = regs::read16(&self.bar0, regs::GEN4_SLOTSTS - 2)?;
            regs::write16(
                &self.bar0,
                regs::GEN4_SLOTSTS,
                regs::GEN4_SLOTSTS_DLLSCS as u16,
                slot_ctrl,
            )?;
        }
        self.bar0.write64(DB_STATUS, DB_LINK_BIT)?;
        Ok(())
    }

    /// Writes an announcement into the peer's scratchpads and rings it.
    fn announce(&self, st: &mut State, kind: Kind) -> Result<(), IntelError> {
        let pages = |mw: usize| st.local[mw].as_ref().map_or(0, |w| (w.len() / PAGE) as u32);
        let a = Announcement {
            kind,
            generation: self.generation,
            ack: st.peer.map_or(0, |p| p.generation),
            inbound_pages: [pages(0), pages(1)],
        };
        for (i, v) in a.writes() {
            self.bar0.write32(self.peer_spad_offset(i), v)?;
            self.counters.posted(4);
        }
        self.ring(DB_CTRL)
    }

    fn ring(&self, bits: u64) -> Result<(), IntelError> {
        // Window stores still in write-combining buffers go out before the
        // doorbell that tells the peer to look at them (an uncached write
        // drains them on Intel parts already, per the SDM; the fence makes
        // it so on any).
        store_fence();
        for bit in 0..regs::DB_COUNT {
            if bits & (1 << bit) != 0 {
                self.bar0.write32(regs::peer_doorbell(bit), 1)?;
                self.counters.posted(4);
            }
        }
        Ok(())
    }

    fn peer_ended(&self, st: &mut State) {
        if let Some(p) = st.peer.take() {
            st.last_generation = p.generation;
            st.push_event(LinkEvent::Down {
                peer: self.peer_port(),
                generation: p.generation,
            });
        }
    }

    fn peer_port(&self) -> Port {
        1 - self.side.port()
    }

    /// Follows the link and the peer's announcements.
    fn poll(&self, st: &mut State) -> Result<(), IntelError> {
        let status = self.bar0.read64(DB_STATUS)?;
        if status & DB_LINK_BIT != 0 {
            self.ack_link_change()?;
            let up = self.read_link()?;
            if up != st.hw_up {
                st.hw_up = up;
                if up {
                    self.announce(st, Kind::Hello)?;
                } else {
                    self.peer_ended(st);
                }
            }
        }
        if !st.hw_up {
            return Ok(());
        }
        if status & DB_CTRL != 0 {
            self.bar0.write64(DB_STATUS, DB_CTRL)?;
            let mut spads = [0u32; SPAD_COUNT];
            for (i, s) in spads.iter_mut().enumerate() {
                *s = self.bar0.read32(regs::spad(i))?;
            }
            if let Some(a) = Announcement::decode(&spads) {
                self.on_announcement(st, a)?;
            } else if Announcement::is_older_layout(&spads) && !st.warned_older {
                st.warned_older = true;
                tracing::warn!(
                    port = self.side.port(),
                    "the peer's ntbdk announces the first scratchpad layout (user \
                     scratchpads 14 and 15): not bringing the link up; run the same ntbdk \
                     version on both hosts"
                );
            }
        }
        self.heartbeat(st, self.cfg.heartbeat_timeout)?;
        Ok(())
    }

    fn on_announcement(&self, st: &mut State, a: Announcement) -> Result<(), IntelError> {
        match a.kind {
            Kind::Hello if st.gone == Some(a.generation) => {}
            Kind::Hello => {
                if st.peer.map(|p| p.generation) != Some(a.generation) {
                    self.peer_ended(st);
                    st.peer = Some(PeerInfo {
                        generation: a.generation,
                        inbound_pages: a.inbound_pages,
                    });
                    st.peer_beat_at = Instant::now();
                    st.push_event(LinkEvent::Up {
                        peer: self.peer_port(),
                        generation: a.generation,
                    });
                } else if let Some(p) = st.peer.as_mut() {
                    p.inbound_pages = a.inbound_pages;
                }
                if a.ack != self.generation {
                    self.announce(st, Kind::Hello)?;
                }
            }
            Kind::Bye => {
                if st.peer.map(|p| p.generation) == Some(a.generation) {
                    st.gone = Some(a.generation);
                    self.peer_ended(st);
                }
            }
        }
        Ok(())
    }

    /// Beats, and with a `timeout` judges the peer's beat: a peer silent
    /// that long is gone, and is told so.
    fn heartbeat(&self, st: &mut State, timeout: Option<Duration>) -> Result<(), IntelError> {
        let now = Instant::now();
        let period = timeout.map_or(BEAT_PERIOD, |t| (t / 4).min(BEAT_PERIOD));
        if now.duration_since(st.beat_sent) >= period {
            st.beat = st.beat.wrapping_add(1);
            st.beat_sent = now;
            self.bar0
                .write32(self.peer_spad_offset(SPAD_HEARTBEAT), st.beat)?;
            self.counters.posted(4);
        }
        let Some(timeout) = timeout else {
            return Ok(());
        };
        let seen = self.bar0.read32(regs::spad(SPAD_HEARTBEAT))?;
        if seen != st.peer_beat {
            st.peer_beat = seen;
            st.peer_beat_at = now;
        } else if let Some(p) = st.peer
            && now.duration_since(st.peer_beat_at) > timeout
        {
            tracing::warn!(
                generation = p.generation,
                "Intel NTB: the peer's heartbeat stopped; declaring it down (and telling it, \
                 should it only have paused: it restarts to come back)"
            );
            st.gone = Some(p.generation);
            self.peer_ended(st);
            // A peer that only paused (stopped, swapped, in a debugger)
            // would otherwise go on seeing our beats and writing to us
            // while we take it for gone.
            self.announce(st, Kind::Bye)?;
        }
        Ok(())
    }

    fn polled(&self) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        if let Err(e) = self.poll(&mut st) {
            tracing::warn!("Intel NTB: polling the link failed: {e}");
        }
        st
    }

    fn check_peer(&self, peer: Port) -> Result<()> {
        if peer != self.peer_port() {
            return Err(HwError::NoSuchPeer {
                peer,
                ports: 2,
                own: self.side.port(),
            });
        }
        Ok(())
    }

    fn check_mw(&self, mw: usize) -> Result<()> {
        if mw >= 2 {
            return Err(HwError::NoSuchWindow { mw, count: 2 });
        }
        Ok(())
    }

    fn user_spad(&self, index: usize) -> Result<usize> {
        SPAD_USER.get(index).copied().ok_or(HwError::NoSuchSpad {
            index,
            count: SPAD_USER.len(),
        })
    }
}

/// The part `off..off+len` of `w` as a window of its own.
fn sub_window(w: &LocalWindow, off: usize, len: usize) -> LocalWindow {
    let base = w
        .ptr_at(off, len)
        .expect("the range was checked to lie in the window");
    // SAFETY: `off..off+len` lies in `w` (checked by `ptr_at`), whose
    // mapping the clone kept as keepalive holds; 8-byte alignment holds
    // because `off` is a multiple of the page-aligned translation offset.
    unsafe { LocalWindow::from_raw(base, len, w.iova() + off as u64, Arc::new(w.clone())) }
}

impl<M: Mmio> Drop for IntelNtb<M> {
    fn drop(&mut self) {
        let mut st = self.lock();
        let r = if st.hw_up {
            self.announce(&mut st, Kind::Bye)
        } else {
            Ok(())
        };
        drop(st);
        if let Err(e) = r.and_then(|()| self.link_disable()) {
            tracing::warn!("Intel NTB: closing: {e}");
        }
    }
}

impl<M: Mmio> NtbDevice for IntelNtb<M> {
    fn port(&self) -> Port {
        self.side.port()
    }

    fn port_count(&self) -> usize {
        2
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn link(&self, peer: Port) -> Result<LinkState> {
        self.check_peer(peer)?;
        let st = self.polled();
        Ok(match st.peer {
            Some(p) => LinkState {
                up: true,
                generation: p.generation,
            },
            None => LinkState {
                up: false,
                generation: st.last_generation,
            },
        })
    }

    fn poll_link_events(&self, out: &mut Vec<LinkEvent>) -> usize {
        let mut st = self.polled();
        let n = st.events.len();
        out.append(&mut st.events);
        n
    }

    fn service(&self) -> Result<()> {
        let mut st = self.lock();
        self.poll(&mut st).map_err(HwError::from)
    }

    fn mw_count(&self) -> usize {
        2
    }

    fn mw_geometry(&self, mw: usize) -> Result<MwGeometry> {
        self.check_mw(mw)?;
        let size = self.outbound.bar_size(mw);
        Ok(MwGeometry {
            size,
            addr_align: self.part.addr_align(size).max(PAGE),
            size_align: PAGE,
        })
    }

    fn local_window(&self, mw: usize) -> Result<LocalWindow> {
        self.check_mw(mw)?;
        self.lock().local[mw]
            .clone()
            .ok_or_else(|| IntelError::WindowNotBacked { mw }.into())
    }

    fn peer_window(&self, peer: Port, mw: usize) -> Result<PeerWindow> {
        self.check_peer(peer)?;
        self.check_mw(mw)?;
        let announced = self
            .lock()
            .peer
            .map(|p| p.inbound_pages[mw] as usize * PAGE);
        if announced == Some(0) {
            return Err(IntelError::PeerWindowUnusable {
                mw,
                why: "the peer has no memory behind it".into(),
            }
            .into());
        }
        let ap = self.outbound.aperture(mw)?;
        let (base, len, keep, wc) = ap.parts();
        let len = announced.map_or(len, |a| a.min(len));
        // SAFETY: the aperture is a writable mapping of at least `len` bytes
        // at `base`, 8-byte aligned, kept mapped by `keep`
        // (`Aperture::from_raw`'s contract).
        let w =
            // SAFETY: holds for the reasons given just above.
            unsafe { PeerWindow::from_raw(base.as_ptr(), len, peer, self.counters.clone(), keep) };
        Ok(match wc {
            Some(wc) => w.write_combining(wc),
            None => w,
        })
    }

    fn set_inbound_translation(&self, mw: usize, iova: u64, size: usize) -> Result<()> {
        self.translate(mw, iova, size).map_err(HwError::from)
    }

    fn db_valid_mask(&self) -> u64 {
        DB_USER_MASK
    }

    fn db_read(&self) -> u64 {
        self.bar0.read64(DB_STATUS).unwrap_or(0) & DB_USER_MASK
    }

    fn db_clear(&self, bits: u64) {
        let _ = self.bar0.write64(DB_STATUS, bits & DB_USER_MASK);
    }

    fn db_mask(&self) -> u64 {
        self.lock().db_mask
    }

    /// The mask is kept for callers; the hardware's stays all set (see
    /// `bring_up`): a polled device takes no doorbell interrupt.
    fn db_set_mask(&self, bits: u64) {
        self.lock().db_mask |= bits & DB_USER_MASK;
    }

    fn db_clear_mask(&self, bits: u64) {
        self.lock().db_mask &= !bits;
    }

    fn peer_db_set(&self, peer: Port, bits: u64) -> Result<()> {
        self.check_peer(peer)?;
        if bits & !DB_USER_MASK != 0 {
            return Err(HwError::Invalid(format!(
                "doorbell bits {bits:#x} outside the valid mask {DB_USER_MASK:#x} (bit 28 is \
                 the handshake's, 29..=31 are not used)"
            )));
        }
        self.ring(bits).map_err(HwError::from)
    }

    fn spad_count(&self) -> usize {
        SPAD_USER.len()
    }

    fn spad_read(&self, index: usize) -> Result<u32> {
        let i = self.user_spad(index)?;
        self.bar0.read32(regs::spad(i))
    }

    fn spad_write(&self, index: usize, value: u32) -> Result<()> {
        let i = self.user_spad(index)?;
        self.bar0.write32(regs::spad(i), value)
    }

    fn peer_spad_write(&self, peer: Port, index: usize, value: u32) -> Result<()> {
        self.check_peer(peer)?;
        let i = self.user_spad(index)?;
        self.bar0.write32(self.peer_spad_offset(i), value)?;
        self.counters.posted(4);
        Ok(())
    }

    fn peer_spad_read(&self, peer: Port, index: usize) -> Result<u32> {
        self.check_peer(peer)?;
        let i = self.user_spad(index)?;
        // A read of the peer's register through the bridge: non-posted.
        self.counters.non_posted(4);
        self.bar0.read32(self.peer_spad_offset(i))
    }

    fn non_posted_read(&self, peer: Port, mw: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.check_mw(mw)?;
        let ap = self.outbound.aperture(mw)?;
        let (base, len, _keep, _) = ap.parts();
        match offset.checked_add(dst.len()) {
            Some(end) if end <= len => {}
            _ => {
                return Err(HwError::OutOfBounds {
                    offset,
                    len: dst.len(),
                    window_len: len,
                });
            }
        }
        // SAFETY: `offset..offset+dst.len()` lies in the aperture (checked),
        // mapped while `_keep` lives; a pointer copy, no reference over it.
        unsafe {
            std::ptr::copy(base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len());
        }
        self.counters.non_posted(dst.len());
        Ok(())
    }

    fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }
}
