//! An in-process fabric: every port's window is plain memory of this
//! process. For unit tests and doc examples of the transport; the emulated
//! fabric (`hw::emu`) is the multi-process one (and the benchmarks').
//!
//! Links go up when a port joins and down when it leaves ([`LoopbackDevice`]
//! is dropped or [`LoopbackFabric::kill`] is called), with a new generation
//! on every join, as a real fabric reports them; [`LoopbackFabric::revive`]
//! brings a killed port back under its old generation (a host that only
//! stalled).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::hw::{
    CounterSnapshot, DeviceCounters, HwError, LinkEvent, LinkState, LocalWindow, MwGeometry,
    NtbDevice, PeerWindow, Port, Result,
};

const SPADS: usize = 8;

/// One cache line of window memory: windows are cache-line aligned, as a
/// device's BAR or a hugepage is (receive buffers are carved at 64-byte
/// boundaries). Atomics, because the window handles write it through raw
/// pointers while the fabric holds shared references to it.
#[repr(C, align(64))]
#[derive(Default)]
struct Line([AtomicU64; 8]);

struct PortState {
    window: Arc<Vec<Line>>,
    up: bool,
    generation: u64,
    events: Vec<LinkEvent>,
}

/// Queues `event` (about `port`) for every other port that is up.
fn announce(ports: &mut [PortState], port: Port, event: LinkEvent) {
    for (i, other) in ports.iter_mut().enumerate() {
        if i != port as usize && other.up {
            other.events.push(event);
        }
    }
}

/// Brings `port`'s link up under its current generation and tells the
/// others; returns the generation.
fn bring_up(ports: &mut [PortState], port: Port) -> u64 {
    let st = &mut ports[port as usize];
    st.up = true;
    let generation = st.generation;
    announce(
        ports,
        port,
        LinkEvent::Up {
            peer: port,
            generation,
        },
    );
    generation
}

/// A fabric of `ports` ports whose windows live in this process.
///
/// # Example
/// ```
/// use ntbdk_pmd::hw::NtbDevice;
/// use ntbdk_pmd::hw::loopback::LoopbackFabric;
/// let fabric = LoopbackFabric::new(2, 1 << 20);
/// let a = fabric.join(0).unwrap();
/// let b = fabric.join(1).unwrap();
/// assert!(a.link(1).unwrap().up);
/// a.peer_window(1, 0).unwrap().write(0, b"hi").unwrap();
/// let mut got = [0u8; 2];
/// b.local_window(0).unwrap().read(0, &mut got).unwrap();
/// assert_eq!(&got, b"hi");
/// ```
pub struct LoopbackFabric {
    window_size: usize,
    ports: Mutex<Vec<PortState>>,
    doorbells: Vec<AtomicU64>,
    spads: Vec<AtomicU32>,
    rlut_in_use: Vec<AtomicUsize>,
    rlut_entries: usize,
}

impl std::fmt::Debug for LoopbackFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackFabric")
            .field("window_size", &self.window_size)
            .finish_non_exhaustive()
    }
}

impl LoopbackFabric {
    /// A fabric of `ports` ports with windows of `window_size` bytes
    /// (rounded up to 8).
    pub fn new(ports: u16, window_size: usize) -> Arc<Self> {
        let window_size = window_size.next_multiple_of(64);
        Arc::new(Self {
            window_size,
            ports: Mutex::new(
                (0..ports)
                    .map(|_| PortState {
                        window: Arc::new(Vec::new()),
                        up: false,
                        generation: 0,
                        events: Vec::new(),
                    })
                    .collect(),
            ),
            doorbells: (0..ports).map(|_| AtomicU64::new(0)).collect(),
            spads: (0..ports as usize * SPADS)
                .map(|_| AtomicU32::new(0))
                .collect(),
            rlut_in_use: (0..ports).map(|_| AtomicUsize::new(0)).collect(),
            rlut_entries: 32,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PortState>> {
        self.ports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the fabric as `port` (which must be free): a fresh, zeroed window.
    pub fn join(self: &Arc<Self>, port: Port) -> Result<LoopbackDevice> {
        let mut ports = self.lock();
        let n = ports.len();
        let st = ports.get_mut(port as usize).ok_or(HwError::NoSuchPeer {
            peer: port,
            ports: n,
            own: port,
        })?;
        if st.up {
            return Err(HwError::Fabric(format!("port {port} is taken")));
        }
        st.generation += 1;
        st.window = Arc::new(
            (0..self.window_size / 64)
                .map(|_| Line::default())
                .collect(),
        );
        st.events.clear();
        let generation = bring_up(&mut ports, port);
        Ok(LoopbackDevice {
            fabric: self.clone(),
            port,
            generation,
            counters: Arc::new(DeviceCounters::default()),
        })
    }

    /// Marks `port` down as if its host died (its device stays usable but
    /// its peers see the link drop).
    pub fn kill(&self, port: Port) {
        let mut ports = self.lock();
        let Some(st) = ports.get_mut(port as usize) else {
            return;
        };
        if !st.up {
            return;
        }
        st.up = false;
        let generation = st.generation;
        announce(
            &mut ports,
            port,
            LinkEvent::Down {
                peer: port,
                generation,
            },
        );
    }
}

impl LoopbackFabric {
    /// Brings a [`kill`](Self::kill)ed `port` up again under the same
    /// generation, its window as it was: a host that stalled long enough
    /// for its peers to see its link drop, and came back before its place
    /// was given away (it never saw a link change itself).
    pub fn revive(&self, port: Port) {
        let mut ports = self.lock();
        let Some(st) = ports.get_mut(port as usize) else {
            return;
        };
        if st.up {
            return;
        }
        bring_up(&mut ports, port);
    }
}

/// One port of a [`LoopbackFabric`]. Leaves the fabric when dropped.
pub struct LoopbackDevice {
    fabric: Arc<LoopbackFabric>,
    port: Port,
    generation: u64,
    counters: Arc<DeviceCounters>,
}

impl std::fmt::Debug for LoopbackDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackDevice")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for LoopbackDevice {
    fn drop(&mut self) {
        let still_ours = self.fabric.lock()[self.port as usize].generation == self.generation;
        if still_ours {
            self.fabric.kill(self.port);
        }
    }
}

impl LoopbackDevice {
    fn check_peer(&self, peer: Port) -> Result<()> {
        let n = self.port_count();
        if peer as usize >= n || peer == self.port {
            return Err(HwError::NoSuchPeer {
                peer,
                ports: n,
                own: self.port,
            });
        }
        Ok(())
    }
}

impl NtbDevice for LoopbackDevice {
    fn port(&self) -> Port {
        self.port
    }
    fn port_count(&self) -> usize {
        self.fabric.doorbells.len()
    }
    fn generation(&self) -> u64 {
        self.generation
    }
    fn link(&self, peer: Port) -> Result<LinkState> {
        self.check_peer(peer)?;
        let ports = self.fabric.lock();
        let st = &ports[peer as usize];
        Ok(LinkState {
            up: st.up,
            generation: st.generation,
        })
    }
    fn poll_link_events(&self, out: &mut Vec<LinkEvent>) -> usize {
        let mut ports = self.fabric.lock();
        let st = &mut ports[self.port as usize];
        if st.generation != self.generation {
            return 0;
        }
        let n = st.events.len();
        out.append(&mut st.events);
        n
    }
    fn service(&self) -> Result<()> {
        Ok(())
    }
    fn mw_count(&self) -> usize {
        1
    }
    fn mw_geometry(&self, mw: usize) -> Result<MwGeometry> {
        if mw != 0 {
            return Err(HwError::NoSuchWindow { mw, count: 1 });
        }
        Ok(MwGeometry {
            size: self.fabric.window_size,
            addr_align: 4096,
            size_align: 4096,
        })
    }
    fn local_window(&self, mw: usize) -> Result<LocalWindow> {
        self.mw_geometry(mw)?;
        let w = self.fabric.lock()[self.port as usize].window.clone();
        let base = w.as_ptr() as *mut u8;
        // SAFETY: `window_size` interior-mutable bytes, 64-byte aligned, kept
        // alive by the handle's Arc; accessed only through window handles.
        Ok(unsafe { LocalWindow::from_raw(base, self.fabric.window_size, base as u64, w) })
    }
    fn peer_window(&self, peer: Port, mw: usize) -> Result<PeerWindow> {
        self.check_peer(peer)?;
        self.mw_geometry(mw)?;
        let ports = self.fabric.lock();
        let st = &ports[peer as usize];
        if !st.up {
            return Err(HwError::LinkDown { peer });
        }
        let w = st.window.clone();
        let base = w.as_ptr() as *mut u8;
        // SAFETY: as in `local_window`: a live, aligned allocation of
        // `window_size` bytes kept alive by the handle.
        Ok(unsafe {
            PeerWindow::from_raw(
                base,
                self.fabric.window_size,
                peer,
                self.counters.clone(),
                w,
            )
        })
    }
    fn set_inbound_translation(&self, _mw: usize, _iova: u64, _size: usize) -> Result<()> {
        Ok(())
    }
    fn db_valid_mask(&self) -> u64 {
        u64::MAX
    }
    fn db_read(&self) -> u64 {
        self.fabric.doorbells[self.port as usize].load(Ordering::Acquire)
    }
    fn db_clear(&self, bits: u64) {
        self.fabric.doorbells[self.port as usize].fetch_and(!bits, Ordering::AcqRel);
    }
    fn db_mask(&self) -> u64 {
        0
    }
    fn db_set_mask(&self, _bits: u64) {}
    fn db_clear_mask(&self, _bits: u64) {}
    fn peer_db_set(&self, peer: Port, bits: u64) -> Result<()> {
        self.check_peer(peer)?;
        self.fabric.doorbells[peer as usize].fetch_or(bits, Ordering::AcqRel);
        self.counters.posted(8);
        Ok(())
    }
    fn spad_count(&self) -> usize {
        SPADS
    }
    fn spad_read(&self, index: usize) -> Result<u32> {
        self.spad(self.port, index)
            .map(|s| s.load(Ordering::Acquire))
    }
    fn spad_write(&self, index: usize, value: u32) -> Result<()> {
        self.spad(self.port, index)?.store(value, Ordering::Release);
        Ok(())
    }
    fn peer_spad_write(&self, peer: Port, index: usize, value: u32) -> Result<()> {
        self.check_peer(peer)?;
        self.spad(peer, index)?.store(value, Ordering::Release);
        self.counters.posted(4);
        Ok(())
    }
    fn peer_spad_read(&self, peer: Port, index: usize) -> Result<u32> {
        self.check_peer(peer)?;
        self.counters.non_posted(4);
        self.spad(peer, index).map(|s| s.load(Ordering::Acquire))
    }
    fn non_posted_read(&self, peer: Port, mw: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.mw_geometry(mw)?;
        let rlut = &self.fabric.rlut_in_use[peer as usize];
        if rlut.fetch_add(1, Ordering::AcqRel) >= self.fabric.rlut_entries {
            rlut.fetch_sub(1, Ordering::AcqRel);
            self.counters.rlut_refused();
            return Err(HwError::RlutExhausted {
                entries: self.fabric.rlut_entries,
            });
        }
        let w = self.fabric.lock()[peer as usize].window.clone();
        let base = w.as_ptr() as *mut u8;
        // SAFETY: as in `local_window`.
        let win = unsafe { LocalWindow::from_raw(base, self.fabric.window_size, 0, w) };
        let r = win.read(offset, dst);
        rlut.fetch_sub(1, Ordering::AcqRel);
        self.counters.non_posted(dst.len());
        r
    }
    fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }
}

impl LoopbackDevice {
    fn spad(&self, port: Port, index: usize) -> Result<&AtomicU32> {
        if index >= SPADS {
            return Err(HwError::NoSuchSpad {
                index,
                count: SPADS,
            });
        }
        Ok(&self.fabric.spads[port as usize * SPADS + index])
    }
}
