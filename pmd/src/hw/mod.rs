//! The device layer: what NTB hardware offers, and nothing of the transport.
//!
//! [`NtbDevice`] is modelled on the Linux `ntb.h` API and DPDK's NTB raw
//! device ops: an own port, peers and their links, memory windows, doorbells,
//! scratchpads and inbound translation. Backends implement it: the emulated
//! fabric in shared memory (the default everywhere), and real hardware through
//! vfio-pci.
//!
//! The outbound handle onto a peer's window, [`PeerWindow`], offers posted
//! writes only. The non-posted accesses, [`NtbDevice::non_posted_read`] and
//! [`NtbDevice::peer_spad_read`], are separately named, take an R-LUT entry
//! for their duration and are counted, so
//! [`NtbDevice::counters`] proves what the transport does not do.

pub(crate) mod copy;
mod counters;
pub mod emu;
mod error;
mod grant;
mod grant_table;
pub(crate) use grant_table::GRANT_TABLE_LEN;
pub mod intel;
pub mod loopback;
pub mod mmio;
pub mod open;
mod tenure;
pub mod vfio;
mod wc;
mod window;

pub use counters::{CounterSnapshot, DeviceCounters};
pub use error::{HwError, Result};
pub use grant::{PeerGrant, Strided};
pub use grant_table::GrantId;
pub use tenure::Tenure;
pub use wc::{StoreProbe, WriteCombining};
pub use window::{
    Admitted, Keepalive, LocalSpan, LocalWindow, PeerWindow, WindowSpan, store_fence,
};

/// A port (the emulated fabric calls it a slot): a host's number on the
/// fabric. Peers are named by their port.
pub type Port = u16;

/// The state of the link to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkState {
    /// Whether the peer is present and its link is up.
    pub up: bool,
    /// The peer's join generation: it changes every time the peer (re)joins,
    /// so a reconnect is never mistaken for the old connection.
    pub generation: u64,
}

/// A change of a peer's link, as reported by [`NtbDevice::poll_link_events`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The peer joined (or rejoined) with this generation.
    Up {
        /// The peer.
        peer: Port,
        /// Its new generation.
        generation: u64,
    },
    /// The peer left, died or was declared dead; `generation` is the one that
    /// went away.
    Down {
        /// The peer.
        peer: Port,
        /// The generation that ended.
        generation: u64,
    },
}

/// Geometry of one memory window (as `ntb_mw_get_align` reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwGeometry {
    /// Size of the window in bytes.
    pub size: usize,
    /// Required alignment of the inbound translation address.
    pub addr_align: usize,
    /// Required granularity of the translated size.
    pub size_align: usize,
}

/// An NTB device: one host's view of the bridge or multi-peer switch.
///
/// All methods take `&self`: one device is shared by the polling cores of a
/// host (wrap it in an `Arc`).
pub trait NtbDevice: Send + Sync {
    /// Our own port number.
    fn port(&self) -> Port;
    /// Ports on the fabric (ours included).
    fn port_count(&self) -> usize;
    /// Every port other than ours, whether or not its link is up.
    fn peer_ports(&self) -> Vec<Port> {
        let own = self.port();
        (0..self.port_count() as Port)
            .filter(|&p| p != own)
            .collect()
    }
    /// Our own join generation (what peers see in [`LinkState::generation`]).
    fn generation(&self) -> u64;
    /// The link state of `peer`.
    fn link(&self, peer: Port) -> Result<LinkState>;
    /// Appends link changes seen since the last call to `out`; returns how many.
    fn poll_link_events(&self, out: &mut Vec<LinkEvent>) -> usize;
    /// Housekeeping the backend needs from the polling loop (heartbeat,
    /// dead-peer detection). Cheap; call it every few thousand polls or more
    /// often than the dead-peer timeout.
    fn service(&self) -> Result<()>;
    /// Fails with [`HwError::SlotLost`] once our place on the fabric was
    /// given to another host (we were declared dead while stalled): on a
    /// fabric whose windows are one shared region (ivshmem), our inbound
    /// window's bytes are then that host's, and a transport writing its own
    /// window (resetting a section, a region write) checks this first. One
    /// load; the default (a device whose place cannot be lost) is `Ok`.
    fn check_tenure(&self) -> Result<()> {
        Ok(())
    }

    /// Number of memory windows.
    fn mw_count(&self) -> usize;
    /// Geometry of window `mw`.
    fn mw_geometry(&self, mw: usize) -> Result<MwGeometry>;
    /// Our own inbound window `mw`, read-write.
    fn local_window(&self, mw: usize) -> Result<LocalWindow>;
    /// The outbound, write-only handle onto `peer`'s inbound window `mw`.
    fn peer_window(&self, peer: Port, mw: usize) -> Result<PeerWindow>;
    /// Publishes what each peer may write in our window `mw` (per-peer
    /// translation). Returns whether this backend enforces it in the
    /// handles peers build from then on; `false` (the default) where it
    /// cannot isolate peers, and the caller should say so.
    fn grant_peers(&self, mw: usize, grant: &PeerGrant) -> Result<bool> {
        let _ = (mw, grant);
        Ok(false)
    }
    /// Lets `peer` (every peer: `None`) also write `len` bytes at `offset`
    /// of our window `mw` (a region registered for it), from now until
    /// [`withdraw_range`](Self::withdraw_range). `None` where the backend
    /// keeps no such grants (then [`grant_peers`](Self::grant_peers)'s
    /// template, or nothing, is all it enforces).
    fn grant_range(
        &self,
        mw: usize,
        offset: usize,
        len: usize,
        peer: Option<Port>,
    ) -> Result<Option<GrantId>> {
        let _ = (mw, offset, len, peer);
        Ok(None)
    }
    /// Withdraws a grant made by [`grant_range`](Self::grant_range): no
    /// write on its strength is admitted after this returns. Not a barrier:
    /// a write admitted just before (a span or token already checked) may
    /// still be copying; wait for the writers to acknowledge before reusing
    /// the memory (the transport's revocation does).
    fn withdraw_range(&self, mw: usize, id: GrantId) {
        let _ = (mw, id);
    }
    /// Points inbound window `mw` at `size` bytes of local memory at bus
    /// address `iova` (the translation and limit registers on hardware).
    fn set_inbound_translation(&self, mw: usize, iova: u64, size: usize) -> Result<()>;

    /// The doorbell bits this device implements.
    fn db_valid_mask(&self) -> u64;
    /// Our pending doorbell bits (masked bits included).
    fn db_read(&self) -> u64;
    /// Clears `bits` of our doorbell.
    fn db_clear(&self, bits: u64);
    /// Our doorbell mask (set bits do not signal).
    fn db_mask(&self) -> u64;
    /// Sets `bits` in our doorbell mask.
    fn db_set_mask(&self, bits: u64);
    /// Clears `bits` from our doorbell mask.
    fn db_clear_mask(&self, bits: u64);
    /// Rings `bits` on `peer`'s doorbell (a posted write).
    fn peer_db_set(&self, peer: Port, bits: u64) -> Result<()>;

    /// Number of scratchpad registers per port.
    fn spad_count(&self) -> usize;
    /// Reads our own scratchpad `index` (local, not through the bridge).
    fn spad_read(&self, index: usize) -> Result<u32>;
    /// Writes our own scratchpad `index`.
    fn spad_write(&self, index: usize, value: u32) -> Result<()>;
    /// Writes `peer`'s scratchpad `index` (a posted write).
    fn peer_spad_write(&self, peer: Port, index: usize, value: u32) -> Result<()>;
    /// Reads `peer`'s scratchpad `index`: a **non-posted** read through the
    /// bridge, counted and subject to the R-LUT like
    /// [`non_posted_read`](Self::non_posted_read).
    fn peer_spad_read(&self, peer: Port, index: usize) -> Result<u32>;

    /// Reads `dst.len()` bytes at `offset` of `peer`'s window `mw` through the
    /// bridge: a **non-posted** read. It waits a round trip, holds one R-LUT
    /// entry while it does, fails with [`HwError::RlutExhausted`] when none is
    /// free, and is counted. Exists for completeness and diagnostics; the
    /// transport never uses it.
    fn non_posted_read(&self, peer: Port, mw: usize, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// Traffic counters of this device.
    fn counters(&self) -> CounterSnapshot;
}
