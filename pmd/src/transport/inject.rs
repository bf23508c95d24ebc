//! Raw slot injection, for tests and fuzzing of the validation paths: writes
//! arbitrary bodies into a peer's queues exactly as a (misbehaving) connected
//! peer would, with the right tags so that the victim consumes them.

use crate::hw::{NtbDevice, PeerWindow, Port, Result};

use super::geometry::{DataPart, Layout, Part};
use super::queue::tag;
use super::wire::{Body, Ring, SLOT, TAG_OFFSET};

/// The id of the first operation a transport of incarnation `incarnation`
/// posts (see [`Transport::incarnation`](super::Transport::incarnation));
/// its later ones follow one by one. For tests that name an honest
/// transport's operations in injected messages.
pub fn first_op_id(incarnation: u64) -> u64 {
    super::endpoint::first_op_id(incarnation)
}

/// Writes raw slots into `victim`'s rings as port `me` of connection epoch
/// `epoch` (see [`epoch`](super::epoch)). Use it on a port whose own
/// transport has connected to the victim and then stopped posting (its
/// rings towards the victim are then at sequence 0).
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use ntbdk_pmd::hw::loopback::LoopbackFabric;
/// use ntbdk_pmd::transport::{epoch, inject::Injector, Ring,
///     Config, DropKind, Geometry, Transport};
///
/// let fabric = LoopbackFabric::new(2, 1 << 20);
/// let cfg = Config::new(Geometry::small(2));
/// let rogue_dev = Arc::new(fabric.join(0).unwrap());
/// let mut rogue = Transport::new(rogue_dev.clone(), cfg.clone()).unwrap();
/// let mut victim = Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap();
/// while !rogue.is_connected(1) || !victim.is_connected(0) {
///     rogue.progress();
///     victim.progress();
/// }
/// let e = epoch(rogue.incarnation(), victim.incarnation());
/// let mut inj = Injector::new(&*rogue_dev, 1, *victim.layout(), e).unwrap();
/// inj.push(Ring::Rx, &[0xff; 56]).unwrap(); // an unknown op code
/// victim.progress();
/// let qp = victim.create_qp(0).unwrap();
/// assert_eq!(victim.counters(qp).dropped(DropKind::Malformed), 1);
/// ```
#[derive(Debug)]
pub struct Injector {
    win: PeerWindow,
    layout: Layout,
    me: Port,
    epoch: u32,
    seq: [u64; 4],
}

impl Injector {
    /// An injector from `dev`'s port into `victim`'s window.
    pub fn new(dev: &dyn NtbDevice, victim: Port, layout: Layout, epoch: u32) -> Result<Self> {
        Ok(Self {
            win: dev.peer_window(victim, 0)?,
            layout,
            me: dev.port(),
            epoch,
            seq: [0; 4],
        })
    }

    /// Writes `body` into the next slot of `ring`, tagged so the victim
    /// takes it as the next message. (It ignores credits: the victim's
    /// consumer must keep up, as it does when progressed between pushes.)
    pub fn push(&mut self, ring: Ring, body: &Body) -> Result<()> {
        let part = Part::from(ring);
        let depth = u64::from(self.layout.geometry().queue_depth);
        let k = ring.index();
        let off = self.layout.part(self.me, part) + (self.seq[k] % depth) as usize * SLOT;
        self.win.write(off, body)?;
        self.win
            .write_u64(off + TAG_OFFSET, tag(self.epoch, self.seq[k]))?;
        self.seq[k] += 1;
        Ok(())
    }

    /// Writes `body` as descriptor slot `seq` of data queue `queue` (the
    /// victim's `rx_burst` takes it when `seq` is the next it expects): a
    /// count (u64 at 0, 1..=3), then per descriptor a buffer (u32 at
    /// 8 + 16i), a length (u32 at 12 + 16i) and a user word (u64 at
    /// 16 + 16i).
    pub fn push_descriptor(&mut self, queue: u16, seq: u64, body: &Body) -> Result<()> {
        let depth = u64::from(self.layout.geometry().data.nb_desc);
        let off =
            self.layout.data_part(self.me, queue, DataPart::Desc) + (seq % depth) as usize * SLOT;
        self.win.write(off, body)?;
        self.win.write_u64(off + TAG_OFFSET, tag(self.epoch, seq))
    }

    /// The credit word saying our consumer has taken `seq` messages of a
    /// ring, as an honest peer of this connection writes it.
    pub fn credit_word(&self, seq: u64) -> u64 {
        tag(self.epoch, seq)
    }

    /// Writes raw bytes anywhere in the victim's window (a peer can; the
    /// victim must survive it).
    pub fn scribble(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.win.write(offset, bytes)
    }
}
