//! Why a ring could not be created or attached.

use crate::header::MAX_CAPACITY;
use crate::mode::RingMode;

/// Why a ring could not be created, constructed in a region, or attached.
///
/// Every variant says what failed and what to do about it. Attaching never
/// trusts the region's description of the ring: a header whose metadata
/// (magic, version, element size and alignment, mode, capacity, mask) is
/// not what this build of the crate would have written is reported here,
/// never used. The indices are not checked (another process moves them
/// while we attach): corrupted ones cannot make an operation leave the slot
/// array, but they can lose or repeat elements, or stall a `Multi` side.
///
/// # Examples
///
/// ```
/// use ntbdk_ring::{Ring, RingError, RingMode};
///
/// let err = Ring::<u64>::new(1000, RingMode::SPSC).unwrap_err();
/// assert!(matches!(err, RingError::CapacityNotPowerOfTwo { capacity: 1000 }));
/// println!("{err}"); // ... pick a power of two such as 1024
/// ```
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingError {
    /// A ring needs at least one slot.
    #[error("ring capacity is 0: a ring needs at least one slot (pick a power of two >= 1)")]
    ZeroCapacity,
    /// Slot indices are masked, so the capacity must be a power of two.
    #[error(
        "ring capacity {capacity} is not a power of two: pick a power of two such as {}",
        suggest_capacity(.capacity)
    )]
    CapacityNotPowerOfTwo {
        /// The capacity asked for.
        capacity: usize,
    },
    /// The capacity is larger than the ring supports, or its size in bytes
    /// overflows.
    #[error("ring capacity {capacity} is too large: the maximum is {max} slots")]
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: usize,
        /// The largest capacity supported for this element type.
        max: usize,
    },
    /// The element type is aligned more strictly than the slot array can be.
    #[error(
        "element alignment {align} is larger than the ring's region alignment {max}: \
         store a smaller-aligned type (or a handle to the object)"
    )]
    ElementAlignTooLarge {
        /// `align_of` the element type.
        align: usize,
        /// The largest supported alignment ([`Ring::REGION_ALIGN`](crate::Ring::REGION_ALIGN)).
        max: usize,
    },
    /// The region handed to `init_in`/`attach` is a null pointer.
    #[error("ring region is a null pointer: pass the start of a mapped region")]
    NullRegion,
    /// The region is shorter than the header plus the slots.
    #[error(
        "ring region too small: need {need} bytes, have {have} \
         (size the region with Ring::bytes_for(capacity))"
    )]
    RegionTooSmall {
        /// Bytes the ring needs.
        need: usize,
        /// Bytes the region has.
        have: usize,
    },
    /// The region does not start on a [`Ring::REGION_ALIGN`](crate::Ring::REGION_ALIGN) boundary.
    #[error(
        "ring region at {addr:#x} is not aligned to {align} bytes: \
         place rings at multiples of Ring::REGION_ALIGN (page-aligned mappings always are)"
    )]
    Misaligned {
        /// The region's address.
        addr: usize,
        /// The alignment needed.
        align: usize,
    },
    /// The region does not start with a ring header.
    #[error(
        "no ring in this region: magic {found:#018x} instead of {expected:#018x} \
         (was it initialised with Ring::init_in, at this offset?)"
    )]
    BadMagic {
        /// The magic number found.
        found: u64,
        /// The magic number a ring header starts with.
        expected: u64,
    },
    /// The ring was created by an incompatible version of this crate.
    #[error(
        "ring header version {found}, this build understands version {expected}: \
         build every process sharing the ring with the same ntbdk version"
    )]
    VersionMismatch {
        /// The version found in the header.
        found: u32,
        /// The version this build writes and reads.
        expected: u32,
    },
    /// The ring holds elements of another type.
    #[error(
        "ring element mismatch: the ring holds {found_size}-byte elements aligned to \
         {found_align}, attached as {expected_size}-byte elements aligned to {expected_align}: \
         attach with the element type it was created with"
    )]
    ElementMismatch {
        /// Element size recorded in the header.
        found_size: usize,
        /// Element alignment recorded in the header.
        found_align: usize,
        /// `size_of` the type attached with.
        expected_size: usize,
        /// `align_of` the type attached with.
        expected_align: usize,
    },
    /// A [`Producer`](crate::Producer) or [`Consumer`](crate::Consumer)
    /// handle was asked of a ring whose side is [`Multi`](crate::SyncMode::Multi).
    #[error(
        "the {side} side of this {mode:?} ring is Multi, and a handle needs a Single side: \
         create the ring with RingMode::SPSC (or SPMC/MPSC for one side), or keep using \
         the Ring's own enqueue/dequeue (check Ring::mode before converting: the ring is \
         dropped with this error)"
    )]
    SideNotSingle {
        /// `"producer"` or `"consumer"`.
        side: &'static str,
        /// The ring's modes.
        mode: RingMode,
    },
    /// The header is internally inconsistent (overwritten or torn).
    #[error("ring header corrupted: {reason}; re-create the ring with Ring::init_in")]
    Corrupted {
        /// Which check failed.
        reason: &'static str,
    },
}

/// The power of two to suggest instead of `capacity`.
fn suggest_capacity(capacity: &usize) -> usize {
    capacity
        .checked_next_power_of_two()
        .unwrap_or(MAX_CAPACITY)
        .min(MAX_CAPACITY)
}
