//! The header a zone keeps in its last 4 KiB, so that a process attaching it
//! can check what it was handed.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::MemError;
use crate::page::PageSize;

/// Bytes at the end of every zone reserved for its [`ZoneHeader`].
pub(crate) const HEADER_BYTES: usize = 4096;

/// Longest zone name, in bytes.
pub(crate) const MAX_NAME: usize = 200;

/// `"NTBDKZON"`: marks a complete zone header. Written last.
const MAGIC: u64 = u64::from_le_bytes(*b"NTBDKZON");

/// Layout version of [`ZoneHeader`].
const VERSION: u32 = 1;

/// The header, as laid out in shared memory (the last [`HEADER_BYTES`] of the
/// file). Plain data only: it is read by other processes.
#[repr(C)]
pub(crate) struct ZoneHeader {
    magic: AtomicU64,
    version: u32,
    page_shift: u32,
    total_len: u64,
    usable_len: u64,
    creator_pid: i32,
    name_len: u32,
    name: [u8; MAX_NAME],
}

const _: () = assert!(size_of::<ZoneHeader>() <= HEADER_BYTES);

/// What a valid header says about its zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderInfo {
    pub page_size: PageSize,
    pub usable_len: usize,
    pub name: String,
}

/// Where the header of a mapping of `total_len` bytes at `base` lives.
fn header_ptr(base: NonNull<u8>, total_len: usize) -> *mut ZoneHeader {
    base.as_ptr().wrapping_add(total_len - HEADER_BYTES).cast()
}

/// Writes a complete header into a fresh zone.
///
/// # Safety
/// `base` must be a writable mapping of `total_len >= HEADER_BYTES` bytes
/// (page-aligned) that nobody else accesses yet.
pub(crate) unsafe fn write(base: NonNull<u8>, total_len: usize, info: &HeaderInfo) {
    debug_assert!(info.name.len() <= MAX_NAME);
    let mut name = [0u8; MAX_NAME];
    name[..info.name.len()].copy_from_slice(info.name.as_bytes());
    let h = header_ptr(base, total_len);
    // SAFETY: `h` is inside the mapping, page-aligned (so aligned for the
    // header) and not shared yet (caller's contract); the magic is stored
    // last with Release so a reader that sees it sees the rest.
    unsafe {
        h.write(ZoneHeader {
            magic: AtomicU64::new(0),
            version: VERSION,
            page_shift: info.page_size.shift(),
            total_len: total_len as u64,
            usable_len: info.usable_len as u64,
            creator_pid: std::process::id() as i32,
            name_len: info.name.len() as u32,
            name,
        });
        (*h).magic.store(MAGIC, Ordering::Release);
    }
}

/// Reads and validates the header of a mapping of `total_len` bytes whose
/// pages are `page_size`.
///
/// # Safety
/// `base` must be a readable mapping of `total_len >= HEADER_BYTES` bytes.
pub(crate) unsafe fn read(
    base: NonNull<u8>,
    total_len: usize,
    page_size: PageSize,
) -> Result<HeaderInfo, MemError> {
    let bad = |why: String| MemError::BadZone { why };
    let h = header_ptr(base, total_len);
    // SAFETY: `h` is inside the readable mapping and aligned (page-aligned
    // offset). Another process may write the bytes concurrently, so they are
    // copied once with a volatile read and validated as untrusted data.
    let (magic, version, page_shift, total, usable, name_len, name) = unsafe {
        let magic = (*h).magic.load(Ordering::Acquire);
        let copy = |p: *const u8, n: usize| {
            let mut v = vec![0u8; n];
            for (i, b) in v.iter_mut().enumerate() {
                *b = p.add(i).read_volatile();
            }
            v
        };
        (
            magic,
            std::ptr::addr_of!((*h).version).read_volatile(),
            std::ptr::addr_of!((*h).page_shift).read_volatile(),
            std::ptr::addr_of!((*h).total_len).read_volatile(),
            std::ptr::addr_of!((*h).usable_len).read_volatile(),
            std::ptr::addr_of!((*h).name_len).read_volatile(),
            copy(std::ptr::addr_of!((*h).name).cast(), MAX_NAME),
        )
    };
    if magic != MAGIC {
        return Err(bad(format!(
            "bad magic {magic:#018x} (expected {MAGIC:#018x}): not created by Zone::create, \
             or not finished"
        )));
    }
    if version != VERSION {
        return Err(bad(format!(
            "header version {version}, this library reads {VERSION}"
        )));
    }
    if page_shift != page_size.shift() {
        return Err(bad(format!(
            "header says 2^{page_shift}-byte pages but the file is backed by {page_size} pages"
        )));
    }
    if total != total_len as u64 {
        return Err(bad(format!(
            "header says {total} bytes but the file has {total_len}"
        )));
    }
    if usable == 0 || usable > (total_len - HEADER_BYTES) as u64 {
        return Err(bad(format!(
            "usable length {usable} does not fit the {total_len}-byte file"
        )));
    }
    let name_len = name_len as usize;
    if name_len == 0 || name_len > MAX_NAME {
        return Err(bad(format!("name length {name_len} out of range")));
    }
    let name = String::from_utf8(name[..name_len].to_vec())
        .map_err(|_| bad("name is not UTF-8".into()))?;
    Ok(HeaderInfo {
        page_size,
        usable_len: usable as usize,
        name,
    })
}
