//! Where a pool's parts live in its zone region, and the header that records
//! it for processes that attach later.
//!
//! A pool occupies `[offset, offset + total)` of a zone (`offset` a multiple
//! of 4096), laid out as:
//!
//! | at | what |
//! | --- | --- |
//! | 0 | [`PoolHeader`] (256 bytes) |
//! | 256 | the free list: an MPMC `Ring<u32>` of object indices, capacity `count.next_power_of_two()` |
//! | `state_off` | one state byte per object (free / raw handle out / owned by an `Obj`), used when the pool tracks state |
//! | `elems_off` | `count` objects, `stride` bytes apart (`elt_size` rounded up to `elt_align`) |
//!
//! Everything is plain data at fixed offsets: nothing in it is a pointer, so
//! every process that maps the zone sees the same pool.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use ntbdk_ring::Ring;

use super::error::PoolError;
use super::options::PoolOptions;
use crate::page::round_up;

/// Where pools may start in a zone, and the largest object alignment.
pub(crate) const POOL_ALIGN: usize = 4096;
/// Bytes reserved for the header; the ring follows.
pub(crate) const HEADER_BYTES: usize = 256;
/// The most objects a pool may hold.
pub(crate) const MAX_COUNT: u32 = 1 << 30;
/// Longest pool name stored in the header, in bytes (longer names are cut).
pub(crate) const MAX_NAME: usize = 64;

const MAGIC: u64 = u64::from_le_bytes(*b"NTBDKPOL");
/// Header flag: objects carry a state byte (see `PoolOptions::track_state`).
const FLAG_TRACKED: u32 = 1;
const VERSION: u32 = 1;

/// The header at the start of a pool's region.
#[repr(C)]
pub(crate) struct PoolHeader {
    magic: AtomicU64,
    version: u32,
    tag: u32,
    count: u32,
    elt_size: u32,
    elt_align: u32,
    stride: u32,
    ring_off: u64,
    ring_len: u64,
    state_off: u64,
    elems_off: u64,
    total_len: u64,
    name_len: u32,
    flags: u32,
    name: [u8; MAX_NAME],
}

const _: () = assert!(size_of::<PoolHeader>() <= HEADER_BYTES);
const _: () = assert!(HEADER_BYTES.is_multiple_of(128));

/// The offsets (from the pool's start) and sizes of a pool's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub count: u32,
    pub elt_size: usize,
    pub elt_align: usize,
    pub stride: usize,
    pub ring_cap: usize,
    pub ring_off: usize,
    pub ring_len: usize,
    pub state_off: usize,
    pub elems_off: usize,
    pub total: usize,
}

impl Layout {
    /// The layout of a pool shaped by `o`, or why there is none.
    pub(crate) fn new(o: &PoolOptions) -> Result<Layout, PoolError> {
        Self::compute(o.elt_size, o.elt_align, o.count)
    }

    fn compute(elt_size: usize, elt_align: usize, count: u32) -> Result<Layout, PoolError> {
        let bad = |s: String| PoolError::InvalidOptions(s);
        if elt_size == 0 || elt_size > u32::MAX as usize {
            return Err(bad(format!(
                "object size {elt_size}: must be 1 to 2^32-1 bytes"
            )));
        }
        if !elt_align.is_power_of_two() || elt_align > POOL_ALIGN {
            return Err(bad(format!(
                "object alignment {elt_align}: must be a power of two up to {POOL_ALIGN}"
            )));
        }
        if count == 0 || count > MAX_COUNT {
            return Err(bad(format!(
                "object count {count}: must be 1 to {MAX_COUNT}"
            )));
        }
        let too_big = || {
            bad(format!(
                "{count} objects of {elt_size} bytes do not fit in memory"
            ))
        };
        let stride = round_up(elt_size, elt_align).ok_or_else(too_big)?;
        if stride > u32::MAX as usize {
            return Err(too_big());
        }
        let ring_cap = (count as usize).next_power_of_two();
        let ring_off = HEADER_BYTES;
        let ring_len = Ring::<u32>::bytes_for(ring_cap)?;
        let state_off = round_up(ring_off + ring_len, 64).ok_or_else(too_big)?;
        let elems_off = state_off
            .checked_add(count as usize)
            .and_then(|n| round_up(n, elt_align.max(64)))
            .ok_or_else(too_big)?;
        let total = stride
            .checked_mul(count as usize)
            .and_then(|n| n.checked_add(elems_off))
            .filter(|&n| isize::try_from(n).is_ok())
            .ok_or_else(too_big)?;
        Ok(Layout {
            count,
            elt_size,
            elt_align,
            stride,
            ring_cap,
            ring_off,
            ring_len,
            state_off,
            elems_off,
            total,
        })
    }
}

/// Withdraws the header a pool made earlier at `base` may have left (a
/// pool made again in place): its magic is cleared, and fenced, before the
/// free ring is rebuilt, so that an attacher arriving meanwhile finds no
/// pool rather than the old header over a ring being refilled.
///
/// # Safety
/// `base` must be valid for reads and writes of [`HEADER_BYTES`] (zone
/// memory: initialised) and aligned to 8.
pub(crate) unsafe fn retract_header(base: NonNull<u8>) {
    let h = base.as_ptr().cast::<PoolHeader>();
    // SAFETY: the caller's contract; the magic is the header's first field,
    // an atomic that attachers only ever load atomically.
    unsafe { (*h).magic.store(0, Ordering::Release) };
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// Writes a complete header for `layout` at `base` (the magic last).
///
/// # Safety
/// `base` must be valid for writes of [`HEADER_BYTES`], aligned to 8, and not
/// in use by anyone else yet.
pub(crate) unsafe fn write_header(
    base: NonNull<u8>,
    l: &Layout,
    tag: u32,
    tracked: bool,
    name: &str,
) {
    let name = truncate(name);
    let mut name_buf = [0u8; MAX_NAME];
    name_buf[..name.len()].copy_from_slice(name.as_bytes());
    let h = base.as_ptr().cast::<PoolHeader>();
    // SAFETY: the caller's contract; the magic is published with Release
    // after the rest, so a reader that acquires it sees a complete header.
    unsafe {
        h.write(PoolHeader {
            magic: AtomicU64::new(0),
            version: VERSION,
            tag,
            count: l.count,
            elt_size: l.elt_size as u32,
            elt_align: l.elt_align as u32,
            stride: l.stride as u32,
            ring_off: l.ring_off as u64,
            ring_len: l.ring_len as u64,
            state_off: l.state_off as u64,
            elems_off: l.elems_off as u64,
            total_len: l.total as u64,
            name_len: name.len() as u32,
            flags: if tracked { FLAG_TRACKED } else { 0 },
            name: name_buf,
        });
        (*h).magic.store(MAGIC, Ordering::Release);
    }
}

/// What a validated header says: the layout, the tag and the name.
pub(crate) struct HeaderInfo {
    pub layout: Layout,
    pub tag: u32,
    pub tracked: bool,
    pub name: String,
}

/// Reads and validates the header at `base`, for a region of `have` bytes:
/// the layout it records must be exactly the one its shape implies.
///
/// # Safety
/// `base` must be valid for reads of [`HEADER_BYTES`] and aligned to 8.
pub(crate) unsafe fn read_header(
    base: NonNull<u8>,
    have: usize,
    offset: usize,
) -> Result<HeaderInfo, PoolError> {
    let bad = |why: String| PoolError::BadPool { offset, why };
    let h = base.as_ptr().cast::<PoolHeader>();
    // SAFETY: the caller's contract. Other processes may write the header, so
    // it is copied with volatile reads (every bit pattern is a valid
    // PoolHeader: integers only) and then validated as untrusted data.
    let (magic, copy) = unsafe {
        let magic = (*h).magic.load(Ordering::Acquire);
        (
            magic,
            std::ptr::read_volatile(h.cast::<[u8; size_of::<PoolHeader>()]>()),
        )
    };
    if magic != MAGIC {
        return Err(bad(format!(
            "bad magic {magic:#018x}: no pool was created here"
        )));
    }
    // SAFETY: PoolHeader is repr(C) plain data (its one atomic is a u64 in
    // memory), valid for any bytes; read_unaligned copes with the byte array.
    let hdr: PoolHeader = unsafe { std::ptr::read_unaligned(copy.as_ptr().cast()) };
    if hdr.version != VERSION {
        return Err(bad(format!(
            "layout version {}, this library reads {VERSION}",
            hdr.version
        )));
    }
    // Tag 0 is no pool's: `ObjIdx::NONE` and a default handle carry it.
    if hdr.tag == 0 {
        return Err(bad("tag 0, which no pool is given".into()));
    }
    let layout = Layout::compute(hdr.elt_size as usize, hdr.elt_align as usize, hdr.count)
        .map_err(|e| bad(format!("header records an impossible shape: {e}")))?;
    let recorded = (
        hdr.stride as usize,
        hdr.ring_off as usize,
        hdr.ring_len as usize,
        hdr.state_off as usize,
        hdr.elems_off as usize,
        hdr.total_len as usize,
    );
    let expected = (
        layout.stride,
        layout.ring_off,
        layout.ring_len,
        layout.state_off,
        layout.elems_off,
        layout.total,
    );
    if recorded != expected {
        return Err(bad(format!(
            "recorded layout {recorded:?} differs from the one its shape implies {expected:?}"
        )));
    }
    if layout.total > have {
        return Err(bad(format!(
            "pool needs {} bytes, the zone has {have} from here",
            layout.total
        )));
    }
    if hdr.flags & !FLAG_TRACKED != 0 {
        return Err(bad(format!("unknown flags {:#x}", hdr.flags)));
    }
    let name_len = (hdr.name_len as usize).min(MAX_NAME);
    let name = String::from_utf8_lossy(&hdr.name[..name_len]).into_owned();
    Ok(HeaderInfo {
        layout,
        tag: hdr.tag,
        tracked: hdr.flags & FLAG_TRACKED != 0,
        name,
    })
}

impl HeaderInfo {
    /// The name as the header records it.
    pub(crate) fn cut_name(name: &str) -> String {
        truncate(name).to_owned()
    }
}

/// `name` cut to at most [`MAX_NAME`] bytes on a character boundary.
fn truncate(name: &str) -> &str {
    let mut end = name.len().min(MAX_NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_tight() {
        let l = Layout::new(&PoolOptions::new(2000, 1000)).unwrap();
        assert_eq!(l.stride, 2048);
        assert_eq!(l.ring_cap, 1024);
        assert_eq!(l.ring_off % 128, 0);
        assert!(l.state_off >= l.ring_off + l.ring_len);
        assert_eq!(l.elems_off % 64, 0);
        assert!(l.elems_off >= l.state_off + 1000);
        assert_eq!(l.total, l.elems_off + 1000 * 2048);
        let l = Layout::new(&PoolOptions {
            elt_align: 4096,
            ..PoolOptions::new(10, 3)
        })
        .unwrap();
        assert_eq!((l.stride, l.elems_off % 4096), (4096, 0));
        let l = Layout::new(&PoolOptions {
            elt_align: 1,
            ..PoolOptions::new(3, 5)
        })
        .unwrap();
        assert_eq!(l.stride, 3);
    }

    #[test]
    fn impossible_shapes_are_rejected() {
        for (size, align, count) in [
            (0, 64, 1),
            (8, 0, 1),
            (8, 48, 1),
            (8, 8192, 1),
            (8, 64, 0),
            (8, 64, MAX_COUNT + 1),
            (u32::MAX as usize, 4096, MAX_COUNT),
        ] {
            let o = PoolOptions {
                elt_size: size,
                elt_align: align,
                count,
                cache_size: 0,
                track_state: true,
            };
            assert!(Layout::new(&o).is_err(), "{o:?}");
        }
    }

    #[test]
    fn names_are_cut_on_char_boundaries() {
        assert_eq!(truncate("short"), "short");
        let long = "é".repeat(40); // 80 bytes
        let t = truncate(&long);
        assert!(t.len() <= MAX_NAME && t.len().is_multiple_of(2));
    }
}
