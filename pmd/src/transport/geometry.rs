//! The agreed geometry of a transport and the window layout computed from it.
//!
//! Both sides compute every offset from the same [`Geometry`] (checked in the
//! handshake), so a host knows where its section lies in a peer's window
//! without ever reading it.

pub use super::dataqueues::DataQueues;
use super::error::{GeometryError, Result};
use super::wire::{Ring, SLOT};

/// Size of the transport header at the start of every window.
pub const HEADER_SIZE: usize = 64;
/// Alignment of the region area (a page).
pub const REGION_ALIGN: usize = 4096;

/// The agreed shape of the per-peer sections: both sides must use the same
/// one, or the handshake fails.
///
/// # Example
/// ```
/// use ntbdk_pmd::transport::Geometry;
/// use ntbdk_pmd::transport::DataQueues;
/// let g = Geometry { ports: 4, queue_depth: 64, eager_count: 16, eager_size: 2048, data: DataQueues::NONE };
/// let layout = g.layout().unwrap();
/// assert_eq!(layout.section_offset(1), layout.section_offset(0) + layout.section_size());
/// assert!(layout.region_area_start() % 4096 == 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Ports on the fabric (one section per port, ours included).
    pub ports: u16,
    /// Slots per message queue (a power of two, 4..=4096).
    pub queue_depth: u32,
    /// Eager buffers per sender (1..=4096).
    pub eager_count: u32,
    /// Bytes per eager buffer (a multiple of 64, 64..=1 MiB).
    pub eager_size: u32,
    /// Data queues per peer for bursts of mbufs (none by default).
    pub data: DataQueues,
}

/// Checks a data queue shape and returns the bytes of one queue's block.
fn data_block_size(d: &DataQueues) -> std::result::Result<usize, GeometryError> {
    if d.count == 0 {
        return Ok(0);
    }
    if d.count > DataQueues::MAX_COUNT {
        return Err(GeometryError::DataQueues(d.count));
    }
    if !d.nb_desc.is_power_of_two() || !(16..=4096).contains(&d.nb_desc) {
        return Err(GeometryError::DataDesc(d.nb_desc));
    }
    if !d.buf_size.is_multiple_of(64) || !(64..=1 << 16).contains(&d.buf_size) {
        return Err(GeometryError::DataBufSize(d.buf_size));
    }
    let n = d.nb_desc as usize;
    Ok(SLOT + (n * 8).next_multiple_of(SLOT) + n * SLOT + n * d.buf_size as usize)
}
/// Which part of a data queue's block in a section (all written by the
/// section's port, read by the window's owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPart {
    /// The writer's consumer progress on the descriptors we write into its
    /// window (one word in a line of its own).
    Credit,
    /// FreeQ: the writer's receive buffers lent to us (one u64 entry each).
    FreeQ,
    /// Descriptors of the writer's messages to us (64-byte tagged slots).
    Desc,
    /// Our receive buffers that the writer sends into.
    Bufs,
}

impl Geometry {
    /// A geometry for `ports` ports with moderate queues (64 slots, 32 eager
    /// buffers of 4 KiB per peer).
    pub fn new(ports: u16) -> Self {
        Self {
            ports,
            queue_depth: 64,
            eager_count: 32,
            eager_size: 4096,
            data: DataQueues::NONE,
        }
    }

    /// A small geometry for many ports and small windows (16 slots, 8 eager
    /// buffers of 256 bytes).
    pub fn small(ports: u16) -> Self {
        Self {
            ports,
            queue_depth: 16,
            eager_count: 8,
            eager_size: 256,
            data: DataQueues::NONE,
        }
    }

    /// Checks the geometry and computes its layout.
    pub fn layout(&self) -> Result<Layout> {
        if self.ports < 2 {
            return Err(GeometryError::Ports(self.ports).into());
        }
        if !self.queue_depth.is_power_of_two() || !(4..=4096).contains(&self.queue_depth) {
            return Err(GeometryError::QueueDepth(self.queue_depth).into());
        }
        if !(1..=4096).contains(&self.eager_count) {
            return Err(GeometryError::EagerCount(self.eager_count).into());
        }
        if !self.eager_size.is_multiple_of(64) || !(64..=1 << 20).contains(&self.eager_size) {
            return Err(GeometryError::EagerSize(self.eager_size).into());
        }
        let depth = self.queue_depth as usize;
        let credits = 0;
        let rx = credits + SLOT;
        let tx = rx + depth * SLOT;
        let cq = tx + depth * SLOT;
        let postq = cq + depth * SLOT;
        let freeq = postq + depth * SLOT;
        let eager = freeq + (self.eager_count as usize * 8).next_multiple_of(SLOT);
        let data = eager + self.eager_count as usize * self.eager_size as usize;
        let block_size = data_block_size(&self.data)?;
        let section_size = data + self.data.count as usize * block_size;
        let sections_start = HEADER_SIZE + self.ports as usize * SLOT;
        let region_area_start =
            (sections_start + self.ports as usize * section_size).next_multiple_of(REGION_ALIGN);
        Ok(Layout {
            geometry: *self,
            section_size,
            sections_start,
            region_area_start,
            off: [0, credits, rx, tx, cq, postq, freeq, eager],
            data,
            block_size,
        })
    }
}

/// Which part of a per-peer section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Part {
    /// The hello mailbox (one slot) the peer writes its handshake into; it
    /// lies in the mailbox table after the header, not in the section.
    Mailbox = 0,
    /// Credit words: the peer's consumer progress on the queues we write
    /// into its window (u64 each: RX, TX, CQ, PostQ).
    Credits = 1,
    /// RX queue: "prepare to receive" messages from the peer.
    Rx = 2,
    /// TX queue: "prepare to send" messages from the peer.
    Tx = 3,
    /// Completion queue: "done" / "received" messages from the peer.
    Cq = 4,
    /// PostQ: the peer's eager sends (inline, or naming an eager buffer).
    PostQ = 5,
    /// FreeQ: eager buffers of the peer's window that we may send into.
    FreeQ = 6,
    /// Eager buffers that the peer sends into.
    Eager = 7,
}

impl From<Ring> for Part {
    /// Where ring `r` lies in a section.
    #[inline]
    fn from(r: Ring) -> Part {
        match r {
            Ring::Rx => Part::Rx,
            Ring::Tx => Part::Tx,
            Ring::Cq => Part::Cq,
            Ring::PostQ => Part::PostQ,
        }
    }
}

/// Offsets within a window, computed from a [`Geometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    geometry: Geometry,
    section_size: usize,
    sections_start: usize,
    region_area_start: usize,
    off: [usize; 8],
    /// Offset of the data queues' blocks in a section.
    data: usize,
    /// Bytes of one data queue's block.
    block_size: usize,
}

impl Layout {
    /// The geometry this layout was computed from.
    #[inline]
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Bytes per peer section.
    #[inline]
    pub fn section_size(&self) -> usize {
        self.section_size
    }

    /// Offset of the section that `port` writes into, in any host's window.
    #[inline]
    pub fn section_offset(&self, port: u16) -> usize {
        self.sections_start + port as usize * self.section_size
    }

    /// Offset of `port`'s hello mailbox: right after the header, one slot per
    /// port, at an offset that depends on the port only, so that hosts with
    /// different geometries still find each other's hellos (and can tell
    /// that they differ).
    #[inline]
    pub fn mailbox(port: u16) -> usize {
        HEADER_SIZE + port as usize * SLOT
    }

    /// Offset of `part` of `port`'s section (the mailbox is outside it).
    #[inline]
    pub fn part(&self, port: u16, part: Part) -> usize {
        match part {
            Part::Mailbox => Self::mailbox(port),
            _ => self.section_offset(port) + self.off[part as usize],
        }
    }

    /// Offset of eager buffer `index` in `port`'s section.
    #[inline]
    pub fn eager_buffer(&self, port: u16, index: u32) -> usize {
        self.part(port, Part::Eager) + index as usize * self.geometry.eager_size as usize
    }

    /// Offset of `part` of data queue `queue`'s block in `port`'s section.
    #[inline]
    pub fn data_part(&self, port: u16, queue: u16, part: DataPart) -> usize {
        let n = self.geometry.data.nb_desc as usize;
        let block = self.section_offset(port) + self.data + queue as usize * self.block_size;
        block
            + match part {
                DataPart::Credit => 0,
                DataPart::FreeQ => SLOT,
                DataPart::Desc => SLOT + (n * 8).next_multiple_of(SLOT),
                DataPart::Bufs => SLOT + (n * 8).next_multiple_of(SLOT) + n * SLOT,
            }
    }

    /// Offset of the data queues' area in a section (its end when there
    /// are none): what comes before it is the queue pair's.
    #[inline]
    pub fn data_area(&self) -> usize {
        self.data
    }

    /// First byte of the region area (page aligned).
    #[inline]
    pub fn region_area_start(&self) -> usize {
        self.region_area_start
    }

    /// The smallest window this layout fits in, with `region_bytes` of room
    /// for registered regions.
    pub fn window_size_for(&self, region_bytes: usize) -> usize {
        self.region_area_start + region_bytes.next_multiple_of(REGION_ALIGN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_do_not_overlap_and_are_slot_aligned() {
        let g = Geometry::new(8);
        let l = g.layout().unwrap();
        for p in 0..8u16 {
            let s = l.section_offset(p);
            assert_eq!(s % SLOT, 0);
            assert!(l.part(p, Part::Eager) + 32 * 4096 <= s + l.section_size());
            assert_eq!(l.part(p, Part::Rx) % SLOT, 0);
        }
        assert!(l.region_area_start() >= l.section_offset(8));
    }

    #[test]
    fn data_queue_blocks_tile_the_end_of_each_section() {
        let g = Geometry {
            data: DataQueues {
                count: 3,
                nb_desc: 16,
                buf_size: 128,
            },
            ..Geometry::small(4)
        };
        let l = g.layout().unwrap();
        let plain = Geometry::small(4).layout().unwrap();
        assert_eq!(l.data_area(), plain.section_size());
        for p in 0..4u16 {
            let mut at = l.section_offset(p) + l.data_area();
            for q in 0..3u16 {
                assert_eq!(l.data_part(p, q, DataPart::Credit), at);
                assert_eq!(l.data_part(p, q, DataPart::FreeQ), at + SLOT);
                assert_eq!(l.data_part(p, q, DataPart::Desc), at + 3 * SLOT);
                assert_eq!(l.data_part(p, q, DataPart::Bufs), at + 3 * SLOT + 16 * SLOT);
                at += 3 * SLOT + 16 * SLOT + 16 * 128;
            }
            assert_eq!(at, l.section_offset(p) + l.section_size());
        }
    }

    #[test]
    fn bad_geometry_is_refused() {
        for g in [
            Geometry {
                queue_depth: 3,
                ..Geometry::new(2)
            },
            Geometry {
                eager_size: 100,
                ..Geometry::new(2)
            },
            Geometry {
                eager_count: 0,
                ..Geometry::new(2)
            },
            Geometry::new(1),
            Geometry {
                data: DataQueues {
                    nb_desc: 100,
                    ..DataQueues::new(1)
                },
                ..Geometry::new(2)
            },
            Geometry {
                data: DataQueues {
                    buf_size: 100,
                    ..DataQueues::new(1)
                },
                ..Geometry::new(2)
            },
            Geometry {
                data: DataQueues::new(17),
                ..Geometry::new(2)
            },
        ] {
            assert!(g.layout().is_err(), "{g:?}");
        }
    }
}
