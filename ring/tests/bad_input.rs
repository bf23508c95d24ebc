//! Bad input: constructing with an impossible capacity, or attaching to a
//! region that is too small, misaligned, or whose header is not a valid ring
//! header (at the offsets the crate documents), is an error, never UB.
#![cfg(not(loom))] // loom builds run only tests/loom.rs

use std::alloc::{Layout, alloc_zeroed, dealloc};

use ntbdk_ring::{Ring, RingError, RingMode};

/// A zeroed, `Ring::REGION_ALIGN`-aligned heap region, freed on drop.
struct Region {
    ptr: *mut u8,
    layout: Layout,
}

impl Region {
    fn new(len: usize) -> Region {
        let layout = Layout::from_size_align(len, Ring::<u64>::REGION_ALIGN).unwrap();
        // SAFETY: every region used here is non-empty.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Region { ptr, layout }
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    /// Overwrites the `u32` at byte `offset` of the header.
    fn poke_u32(&self, offset: usize, v: u32) {
        assert!(offset + 4 <= self.len());
        // SAFETY: in bounds (checked) and 4-byte aligned (every header offset
        // used is); no other thread touches the region while a test pokes.
        unsafe { self.ptr.add(offset).cast::<u32>().write(v) };
    }

    /// Overwrites the `u64` at byte `offset` of the header.
    fn poke_u64(&self, offset: usize, v: u64) {
        assert!(offset + 8 <= self.len());
        // SAFETY: as for `poke_u32`, 8-byte aligned.
        unsafe { self.ptr.add(offset).cast::<u64>().write(v) };
    }

    /// Constructs a ring of `capacity` `u64`s in the region and drops the
    /// handle (the ring stays in the region).
    fn init(&self, capacity: usize, mode: RingMode) {
        // SAFETY: the region is ours, aligned, `len()` bytes long.
        unsafe { Ring::<u64>::init_in(self.ptr, self.len(), capacity, mode) }.unwrap();
    }

    /// Attaches as a ring of `T`, with `len` bytes.
    fn attach_as<T: Copy>(&self, len: usize) -> Result<Ring<T>, RingError> {
        assert!(len <= self.len());
        // SAFETY: the region is ours, aligned, at least `len` bytes long, and
        // holds only integers written by `init` or the pokes.
        unsafe { Ring::<T>::attach(self.ptr, len) }
    }

    fn attach(&self) -> Result<Ring<u64>, RingError> {
        self.attach_as::<u64>(self.len())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the handles are gone.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// Header offsets, as documented in the crate's "Region layout" section.
const VERSION: usize = 8;
const HEADER_SIZE: usize = 12;
const ELEM_SIZE: usize = 16;
const FLAGS: usize = 24;
const RESERVED: usize = 28;
const CAPACITY: usize = 32;
const MASK: usize = 40;

fn ring_region(capacity: usize) -> Region {
    let r = Region::new(Ring::<u64>::bytes_for(capacity).unwrap());
    r.init(capacity, RingMode::MPMC);
    r
}

#[test]
fn capacity_must_be_a_nonzero_power_of_two() {
    assert_eq!(
        Ring::<u64>::new(0, RingMode::SPSC).unwrap_err(),
        RingError::ZeroCapacity
    );
    for capacity in [3, 6, 1000, 1025] {
        assert_eq!(
            Ring::<u64>::new(capacity, RingMode::MPMC).unwrap_err(),
            RingError::CapacityNotPowerOfTwo { capacity }
        );
    }
    let err = Ring::<u64>::new(1 << 40, RingMode::SPSC).unwrap_err();
    assert!(matches!(err, RingError::CapacityTooLarge { .. }), "{err}");
    // The message says what to do.
    let msg = RingError::CapacityNotPowerOfTwo { capacity: 1000 }.to_string();
    assert!(msg.contains("1024"), "{msg}");
}

#[test]
fn init_in_rejects_small_misaligned_and_null_regions() {
    let need = Ring::<u64>::bytes_for(64).unwrap();
    let r = Region::new(need + Ring::<u64>::REGION_ALIGN);
    // SAFETY: the region is ours and `need - 1 < len()` bytes long.
    let err = unsafe { Ring::<u64>::init_in(r.ptr, need - 1, 64, RingMode::SPSC) }.unwrap_err();
    assert_eq!(
        err,
        RingError::RegionTooSmall {
            need,
            have: need - 1
        }
    );
    // SAFETY: one byte in, `need` bytes remain in the region.
    let err = unsafe { Ring::<u64>::init_in(r.ptr.add(1), need, 64, RingMode::SPSC) }.unwrap_err();
    assert!(
        matches!(err, RingError::Misaligned { align: 128, .. }),
        "{err}"
    );
    // SAFETY: a null region is rejected before any access.
    let err = unsafe { Ring::<u64>::init_in(std::ptr::null_mut(), need, 64, RingMode::SPSC) }
        .unwrap_err();
    assert_eq!(err, RingError::NullRegion);
    // SAFETY: the region is ours and long enough.
    let err = unsafe { Ring::<u64>::init_in(r.ptr, r.len(), 100, RingMode::SPSC) }.unwrap_err();
    assert_eq!(err, RingError::CapacityNotPowerOfTwo { capacity: 100 });
}

#[test]
fn attach_to_a_valid_region_works() {
    let r = ring_region(16);
    let ring = r.attach().unwrap();
    assert_eq!((ring.capacity(), ring.mode()), (16, RingMode::MPMC));
    ring.enqueue(1).unwrap();
    // A second handle sees the same ring.
    assert_eq!(r.attach().unwrap().dequeue(), Some(1));
}

#[test]
fn attach_rejects_a_region_too_small_for_header_or_slots() {
    let r = ring_region(16);
    let need = Ring::<u64>::bytes_for(16).unwrap();
    assert_eq!(
        r.attach_as::<u64>(need - 1).unwrap_err(),
        RingError::RegionTooSmall {
            need,
            have: need - 1
        }
    );
    assert!(matches!(
        r.attach_as::<u64>(100).unwrap_err(),
        RingError::RegionTooSmall { have: 100, .. }
    ));
}

#[test]
fn attach_rejects_a_misaligned_region() {
    let r = ring_region(16);
    // SAFETY: 64 bytes in is still inside the region, which has `len - 64`
    // bytes after it; the header check fails before reading.
    let err = unsafe { Ring::<u64>::attach(r.ptr.add(64), r.len() - 64) }.unwrap_err();
    assert!(matches!(err, RingError::Misaligned { .. }), "{err}");
}

#[test]
fn attach_rejects_memory_that_holds_no_ring() {
    let r = Region::new(Ring::<u64>::bytes_for(16).unwrap());
    assert!(matches!(
        r.attach().unwrap_err(),
        RingError::BadMagic { found: 0, .. }
    ));
}

#[test]
fn attach_rejects_a_corrupted_magic() {
    let r = ring_region(16);
    r.poke_u64(0, u64::from_le_bytes(*b"NTBDKRNH"));
    assert!(matches!(
        r.attach().unwrap_err(),
        RingError::BadMagic { .. }
    ));
}

#[test]
fn attach_rejects_another_version() {
    let r = ring_region(16);
    r.poke_u32(VERSION, 2);
    assert_eq!(
        r.attach().unwrap_err(),
        RingError::VersionMismatch {
            found: 2,
            expected: 1
        }
    );
}

#[test]
fn attach_rejects_another_element_type() {
    let r = ring_region(16);
    let err = r.attach_as::<u32>(r.len()).unwrap_err();
    assert_eq!(
        err,
        RingError::ElementMismatch {
            found_size: 8,
            found_align: 8,
            expected_size: 4,
            expected_align: 4
        }
    );
    // Same size, other alignment.
    let err = r.attach_as::<[u32; 2]>(r.len()).unwrap_err();
    assert!(matches!(
        err,
        RingError::ElementMismatch {
            found_align: 8,
            expected_align: 4,
            ..
        }
    ));
    r.poke_u32(ELEM_SIZE, 16);
    assert!(matches!(
        r.attach().unwrap_err(),
        RingError::ElementMismatch { found_size: 16, .. }
    ));
}

#[test]
fn attach_rejects_a_header_inconsistent_with_itself_or_the_length() {
    // Capacity larger than the region holds.
    let r = ring_region(16);
    r.poke_u64(CAPACITY, 32);
    r.poke_u64(MASK, 31);
    let need = Ring::<u64>::bytes_for(32).unwrap();
    assert_eq!(
        r.attach().unwrap_err(),
        RingError::RegionTooSmall {
            need,
            have: r.len()
        }
    );

    // Capacity and mask disagree.
    let r = ring_region(16);
    r.poke_u64(MASK, 7);
    assert!(matches!(
        r.attach().unwrap_err(),
        RingError::Corrupted { .. }
    ));

    // Capacity not a power of two, or zero.
    for bad in [0u64, 12] {
        let r = ring_region(16);
        r.poke_u64(CAPACITY, bad);
        r.poke_u64(MASK, bad.wrapping_sub(1));
        assert!(matches!(
            r.attach().unwrap_err(),
            RingError::Corrupted { .. }
        ));
    }

    // Unknown mode flags, a non-zero reserved field, another header size.
    for (offset, v) in [(FLAGS, 4), (RESERVED, 1), (HEADER_SIZE, 256)] {
        let r = ring_region(16);
        r.poke_u32(offset, v);
        assert!(
            matches!(r.attach().unwrap_err(), RingError::Corrupted { .. }),
            "offset {offset}"
        );
    }
}

#[test]
fn corrupted_indices_cannot_leave_the_slot_array() {
    // A peer scribbling over the indices after attach may make items
    // garbage, but every access stays inside the slots. (SPSC: a Multi side
    // would wait forever for a tail that a corrupted head never lets come,
    // which is the documented limit of the scheme.)
    let r = Region::new(Ring::<u64>::bytes_for(16).unwrap());
    r.init(16, RingMode::SPSC);
    let ring = r.attach().unwrap();
    let indices = [
        (128, u64::MAX / 3),
        (256, 7),
        (264, 99),
        (384, 12345),
        (512, u64::MAX),
        (520, 1 << 40),
    ];
    for (offset, v) in indices {
        r.poke_u64(offset, v);
        let _ = ring.enqueue_burst(&[1; 40]);
        let mut out = [0u64; 40];
        let b = ring.dequeue_burst(&mut out);
        assert!(b.n <= 16 && b.left <= 16);
        assert!(ring.len() <= 16);
    }
}
