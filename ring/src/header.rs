//! The ring's header: the `#[repr(C)]` block at the start of its region, how
//! big a region must be, and how an attached region is validated.
//!
//! The layout is documented in the crate documentation ("Region layout"),
//! and `tests::layout_matches_the_documented_table` keeps the two in step.

use core::mem::{align_of, size_of};

use crate::error::RingError;
use crate::mode::RingMode;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// First eight bytes of every ring region.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"NTBDKRNG");
/// Version of the region layout described in this module.
pub(crate) const VERSION: u32 = 1;
/// The largest capacity a ring may have.
pub(crate) const MAX_CAPACITY: usize = 1 << 31;
/// Size of each header block, and the alignment of the region.
pub(crate) const LINE: usize = 128;
/// Size of the whole header; the slots start at this offset.
pub(crate) const HEADER_SIZE: usize = size_of::<Header>();

/// What the ring is and holds. Written once by `init_in`, read by `attach`.
#[repr(C, align(128))]
pub(crate) struct Meta {
    /// [`MAGIC`] once the header is complete.
    pub(crate) magic: AtomicU64,
    /// [`VERSION`].
    pub(crate) version: AtomicU32,
    /// [`HEADER_SIZE`].
    pub(crate) header_size: AtomicU32,
    /// `size_of::<T>()`.
    pub(crate) elem_size: AtomicU32,
    /// `align_of::<T>()`.
    pub(crate) elem_align: AtomicU32,
    /// The [`RingMode`] as flags.
    pub(crate) flags: AtomicU32,
    /// Zero; keeps the 64-bit fields aligned.
    pub(crate) reserved: AtomicU32,
    /// Number of slots, a power of two.
    pub(crate) capacity: AtomicU64,
    /// `capacity - 1`, stored so a torn or overwritten header is detectable.
    pub(crate) mask: AtomicU64,
}

/// One side's indices (producer or consumer), in two 128-byte blocks: the
/// tail, which the other side reads, alone in the first; the head and the
/// cached copy of the other side's tail, which only this side touches, in the
/// second. The fast path of either side thus never *loads* from a cache line
/// the other side writes, except when its cached view runs out.
#[repr(C, align(128))]
pub(crate) struct Side {
    /// Every index below this one is finished by this side (written, for the
    /// producers; read, for the consumers). The other side reads it.
    pub(crate) tail: AtomicU64,
    /// Fills the tail's block. Atomic bytes, never accessed: the header is
    /// read through a shared reference while other processes may write the
    /// region, so it holds nothing but atomics.
    pub(crate) tail_pad: [std::sync::atomic::AtomicU8; LINE - size_of::<AtomicU64>()],
    /// Multi sides only: the next index this side will reserve, moved with
    /// a compare-and-swap. (A single side has nothing reserved between its
    /// operations, so its head is its tail; this field stays 0.)
    pub(crate) head: AtomicU64,
    /// The other side's tail as this side last read it, so that checking
    /// for room does not touch the other side's cache line until the cached
    /// view runs out. A single side's one thread accesses it relaxed; the
    /// threads of a multi side share it with release/acquire.
    pub(crate) other_tail: AtomicU64,
}

/// The header at the start of a ring region.
#[repr(C)]
pub(crate) struct Header {
    /// What the ring is.
    pub(crate) meta: Meta,
    /// Producer indices.
    pub(crate) prod: Side,
    /// Consumer indices.
    pub(crate) cons: Side,
}

impl Side {
    fn new() -> Side {
        Side {
            tail: AtomicU64::new(0),
            tail_pad: [const { std::sync::atomic::AtomicU8::new(0) };
                LINE - size_of::<AtomicU64>()],
            head: AtomicU64::new(0),
            other_tail: AtomicU64::new(0),
        }
    }
}

impl Header {
    /// A header for an empty ring of `capacity` `T`s, with its magic still 0:
    /// the creator stores [`MAGIC`] (release) once the header is in place.
    pub(crate) fn new<T>(capacity: usize, mode: RingMode) -> Header {
        Header {
            meta: Meta {
                magic: AtomicU64::new(0),
                version: AtomicU32::new(VERSION),
                header_size: AtomicU32::new(HEADER_SIZE as u32),
                elem_size: AtomicU32::new(size_of::<T>() as u32),
                elem_align: AtomicU32::new(align_of::<T>() as u32),
                flags: AtomicU32::new(mode.to_flags()),
                reserved: AtomicU32::new(0),
                capacity: AtomicU64::new(capacity as u64),
                mask: AtomicU64::new(capacity as u64 - 1),
            },
            prod: Side::new(),
            cons: Side::new(),
        }
    }
}

/// The largest capacity for elements of `T` whose region size fits in an
/// `isize` (a power of two, at most [`MAX_CAPACITY`]).
pub(crate) fn max_capacity<T>() -> usize {
    let elem = size_of::<T>().max(1);
    // Leave room for the header and for rounding the size up to LINE.
    let fit = (isize::MAX as usize - HEADER_SIZE - LINE) / elem;
    if fit >= MAX_CAPACITY {
        MAX_CAPACITY
    } else {
        // Largest power of two <= fit (fit >= 1 for any real type).
        1 << (usize::BITS - 1 - fit.max(1).leading_zeros())
    }
}

/// Checks `capacity` and the element type `T`, and returns the size in bytes
/// of a region holding a ring of `capacity` `T`s.
pub(crate) fn bytes_for<T>(capacity: usize) -> Result<usize, RingError> {
    if align_of::<T>() > LINE {
        return Err(RingError::ElementAlignTooLarge {
            align: align_of::<T>(),
            max: LINE,
        });
    }
    if capacity == 0 {
        return Err(RingError::ZeroCapacity);
    }
    if !capacity.is_power_of_two() {
        return Err(RingError::CapacityNotPowerOfTwo { capacity });
    }
    let max = if size_of::<T>() > u32::MAX as usize {
        0
    } else {
        max_capacity::<T>()
    };
    if capacity > max {
        return Err(RingError::CapacityTooLarge { capacity, max });
    }
    // Cannot overflow: capacity <= max_capacity, which keeps it in an isize.
    Ok(HEADER_SIZE + capacity * size_of::<T>())
}

#[cfg_attr(loom, allow(dead_code))] // attach does not exist under loom
/// Checks the start and length of a region handed to `init_in` or `attach`.
pub(crate) fn check_region(region: *const u8, len: usize, need: usize) -> Result<(), RingError> {
    if region.is_null() {
        return Err(RingError::NullRegion);
    }
    if !(region as usize).is_multiple_of(LINE) {
        return Err(RingError::Misaligned {
            addr: region as usize,
            align: LINE,
        });
    }
    if len < need {
        return Err(RingError::RegionTooSmall { need, have: len });
    }
    Ok(())
}

#[cfg_attr(loom, allow(dead_code))] // attach does not exist under loom
/// Validates the header of a region of `len` bytes for elements of `T`.
///
/// Returns the capacity and mode recorded there when everything agrees with
/// what [`Header::new`] would have written for that capacity and a region
/// that holds all of its slots.
pub(crate) fn validate<T>(hdr: &Header, len: usize) -> Result<(usize, RingMode), RingError> {
    let m = &hdr.meta;
    // Acquire pairs with the creator's release store of the magic: every
    // other header field was written before it.
    let magic = m.magic.load(Ordering::Acquire);
    if magic != MAGIC {
        return Err(RingError::BadMagic {
            found: magic,
            expected: MAGIC,
        });
    }
    let version = m.version.load(Ordering::Relaxed);
    if version != VERSION {
        return Err(RingError::VersionMismatch {
            found: version,
            expected: VERSION,
        });
    }
    if m.header_size.load(Ordering::Relaxed) as usize != HEADER_SIZE {
        return Err(RingError::Corrupted {
            reason: "header size differs from this build's",
        });
    }
    let (size, align) = (
        m.elem_size.load(Ordering::Relaxed) as usize,
        m.elem_align.load(Ordering::Relaxed) as usize,
    );
    if size != size_of::<T>() || align != align_of::<T>() {
        return Err(RingError::ElementMismatch {
            found_size: size,
            found_align: align,
            expected_size: size_of::<T>(),
            expected_align: align_of::<T>(),
        });
    }
    let mode =
        RingMode::from_flags(m.flags.load(Ordering::Relaxed)).ok_or(RingError::Corrupted {
            reason: "unknown mode flags",
        })?;
    if m.reserved.load(Ordering::Relaxed) != 0 {
        return Err(RingError::Corrupted {
            reason: "reserved field is not zero",
        });
    }
    let capacity = m.capacity.load(Ordering::Relaxed);
    if capacity == 0 || !capacity.is_power_of_two() || capacity > max_capacity::<T>() as u64 {
        return Err(RingError::Corrupted {
            reason: "capacity is not a supported power of two",
        });
    }
    if m.mask.load(Ordering::Relaxed) != capacity - 1 {
        return Err(RingError::Corrupted {
            reason: "mask does not match capacity",
        });
    }
    let capacity = capacity as usize;
    let need = bytes_for::<T>(capacity)?;
    if len < need {
        return Err(RingError::RegionTooSmall { need, have: len });
    }
    Ok((capacity, mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layout_matches_the_documented_table() {
        assert_eq!(HEADER_SIZE, 640);
        assert_eq!(align_of::<Header>(), LINE);
        assert_eq!(offset_of!(Header, meta) + offset_of!(Meta, magic), 0);
        assert_eq!(offset_of!(Meta, version), 8);
        assert_eq!(offset_of!(Meta, header_size), 12);
        assert_eq!(offset_of!(Meta, elem_size), 16);
        assert_eq!(offset_of!(Meta, elem_align), 20);
        assert_eq!(offset_of!(Meta, flags), 24);
        assert_eq!(offset_of!(Meta, reserved), 28);
        assert_eq!(offset_of!(Meta, capacity), 32);
        assert_eq!(offset_of!(Meta, mask), 40);
        assert_eq!(offset_of!(Header, prod), 128);
        assert_eq!(offset_of!(Header, cons), 384);
        assert_eq!(offset_of!(Side, tail), 0);
        assert_eq!(offset_of!(Side, head), 128);
        assert_eq!(offset_of!(Side, other_tail), 136);
        assert_eq!(MAGIC.to_le_bytes(), *b"NTBDKRNG");
    }

    #[test]
    fn bytes_for_checks_capacity() {
        assert_eq!(bytes_for::<u64>(1), Ok(640 + 8));
        assert_eq!(bytes_for::<u64>(1024), Ok(640 + 8192));
        assert_eq!(bytes_for::<u64>(0), Err(RingError::ZeroCapacity));
        assert_eq!(
            bytes_for::<u64>(3),
            Err(RingError::CapacityNotPowerOfTwo { capacity: 3 })
        );
        assert!(matches!(
            bytes_for::<u64>(MAX_CAPACITY * 2),
            Err(RingError::CapacityTooLarge { .. })
        ));
        assert!(matches!(
            bytes_for::<[u8; 1 << 40]>(1 << 30),
            Err(RingError::CapacityTooLarge { .. })
        ));
        #[repr(align(256))]
        #[derive(Clone, Copy)]
        struct Wide(#[allow(dead_code)] u8);
        assert!(matches!(
            bytes_for::<Wide>(4),
            Err(RingError::ElementAlignTooLarge { align: 256, .. })
        ));
    }
}
