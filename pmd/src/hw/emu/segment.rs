//! The control segment: a file in a shared-memory directory, mapped shared by
//! every process attached to the fabric.
//!
//! The creator opens it with `O_CREAT | O_EXCL` and mode 0600 (owner only),
//! sizes it, writes the header and only then the magic, with release
//! ordering. An attacher waits (bounded) for the magic with acquire ordering,
//! then checks the layout version and sizes before it maps the slots.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use super::config::FabricConfig;
use super::layout::{HEADER_LEN, Header, MAGIC, SLOT_LEN, SlotRegs, VERSION};
use crate::hw::{HwError, Result};

/// Prefix of every control segment's file name.
pub(crate) const FILE_PREFIX: &str = "ntbdk-fabric-";
/// Longest fabric name.
pub const MAX_NAME_LEN: usize = 64;

/// The directory control segments live in: `$NTBDK_SHM_DIR` if set, else
/// `/dev/shm`.
pub fn shm_dir() -> PathBuf {
    std::env::var_os("NTBDK_SHM_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

/// Checks a fabric name: 1 to 64 characters of `A-Z a-z 0-9 _ - .`, not
/// starting with a dot.
pub fn validate_name(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty()
        || name.len() > MAX_NAME_LEN
        || name.starts_with('.')
        || !name.chars().all(ok_char)
    {
        return Err(HwError::Invalid(format!(
            "bad fabric name {name:?}: use 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ - . \
             (not starting with a dot)"
        )));
    }
    Ok(())
}

/// Path of fabric `name`'s control segment in `dir`.
pub(crate) fn segment_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{name}"))
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HwError {
    let what = what.into();
    move |source| HwError::Io { what, source }
}

fn last_err(what: impl Into<String>) -> HwError {
    io(what)(std::io::Error::last_os_error())
}

/// Total bytes of a segment with `slots` slots.
pub(crate) fn segment_len(slots: usize) -> usize {
    HEADER_LEN + slots * SLOT_LEN
}

/// A mapped control segment.
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    slots: usize,
    path: PathBuf,
}

// SAFETY: the mapping is shared memory accessed only through atomics (every
// field of Header and SlotRegs is atomic); the pointer stays valid until Drop.
unsafe impl Send for Segment {}
// SAFETY: as for Send.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| HwError::Invalid(format!("path {} contains a NUL byte", path.display())))
}

/// Maps `len` bytes of `fd` shared, read-write.
fn map(fd: i32, len: usize, path: &Path) -> Result<*mut u8> {
    // SAFETY: a fresh shared mapping of an open fd; the kernel picks the
    // address; failure is checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_err(format!(
            "mapping control segment {}",
            path.display()
        )));
    }
    Ok(p.cast())
}

struct Fd(i32);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

impl Segment {
    /// Creates the segment at `path` (which must not exist) for `cfg`.
    /// An existing file is an `Io` error of kind `AlreadyExists`.
    pub fn create(path: &Path, cfg: &FabricConfig) -> Result<Segment> {
        cfg.validate()?;
        let c = cpath(path)?;
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(last_err(format!(
                "creating control segment {}",
                path.display()
            )));
        }
        let fd = Fd(fd);
        let len = segment_len(cfg.slots);
        let result = (|| {
            // SAFETY: `fd` is open for writing.
            if unsafe { libc::ftruncate(fd.0, len as libc::off_t) } != 0 {
                return Err(last_err(format!(
                    "sizing control segment {}",
                    path.display()
                )));
            }
            let base = map(fd.0, len, path)?;
            let seg = Segment {
                base,
                len,
                slots: cfg.slots,
                path: path.to_owned(),
            };
            let h = seg.header();
            h.version.store(VERSION, Relaxed);
            h.header_len.store(HEADER_LEN as u32, Relaxed);
            h.slot_len.store(SLOT_LEN as u32, Relaxed);
            h.slots.store(cfg.slots as u32, Relaxed);
            h.window_size.store(cfg.window_size as u64, Relaxed);
            h.spads.store(cfg.spads as u32, Relaxed);
            h.db_bits.store(cfg.db_bits, Relaxed);
            h.rlut_entries.store(cfg.rlut_entries as u32, Relaxed);
            h.creator_pid.store(std::process::id(), Relaxed);
            h.heartbeat_timeout_ns
                .store(cfg.heartbeat_timeout.as_nanos() as u64, Relaxed);
            h.read_latency_ns
                .store(cfg.read_latency.as_nanos() as u64, Relaxed);
            let unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            h.created_unix.store(unix, Relaxed);
            // Slots are zero (ftruncate): free, generation 0.
            h.magic.store(MAGIC, Release);
            Ok(seg)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(path);
        }
        result
    }

    /// Attaches to the segment at `path`, waiting up to `wait` for its
    /// creator to finish initialising it.
    pub fn attach(path: &Path, name: &str, wait: Duration) -> Result<Segment> {
        let c = cpath(path)?;
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::NotFound {
                return Err(HwError::Fabric(format!(
                    "no fabric named {name:?} in {}: create it (ntb-tool create {name}) \
                     or open a device with EmuDevice::open",
                    path.parent().unwrap_or(Path::new("")).display()
                )));
            }
            return Err(io(format!("opening control segment {}", path.display()))(e));
        }
        let fd = Fd(fd);
        let deadline = Instant::now() + wait;
        let uninit = || {
            HwError::Fabric(format!(
                "fabric {name:?} ({}) was never initialised (its creator died while creating \
                 it?): destroy it (ntb-tool destroy {name}) and create it again",
                path.display()
            ))
        };
        // Wait for the creator's ftruncate.
        loop {
            let size = file_size(fd.0, path)?;
            if size >= HEADER_LEN {
                break;
            }
            if Instant::now() >= deadline {
                return Err(uninit());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let hbase = map(fd.0, HEADER_LEN, path)?;
        let hseg = Segment {
            base: hbase,
            len: HEADER_LEN,
            slots: 0,
            path: path.to_owned(),
        };
        let h = hseg.header();
        loop {
            match h.magic.load(Acquire) {
                MAGIC => break,
                0 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                0 => return Err(uninit()),
                _ => {
                    return Err(HwError::Fabric(format!(
                        "{} is not an ntbdk fabric control segment (bad magic)",
                        path.display()
                    )));
                }
            }
        }
        let version = h.version.load(Relaxed);
        let hl = h.header_len.load(Relaxed) as usize;
        let sl = h.slot_len.load(Relaxed) as usize;
        if version != VERSION || hl != HEADER_LEN || sl != SLOT_LEN {
            return Err(HwError::Fabric(format!(
                "fabric {name:?} has layout version {version} (header {hl} B, slot {sl} B); \
                 this build speaks version {VERSION} (header {HEADER_LEN} B, slot {SLOT_LEN} B): \
                 stop its users, destroy it (ntb-tool destroy {name}) and create it again"
            )));
        }
        let slots = h.slots.load(Relaxed) as usize;
        let len = segment_len(slots);
        let size = file_size(fd.0, path)?;
        if size != len {
            return Err(HwError::Fabric(format!(
                "fabric {name:?} is corrupt: its control segment is {size} bytes, \
                 {slots} slots need {len}: destroy it (ntb-tool destroy {name})"
            )));
        }
        drop(hseg);
        let base = map(fd.0, len, path)?;
        let seg = Segment {
            base,
            len,
            slots,
            path: path.to_owned(),
        };
        seg.config()
            .validate()
            .map_err(|e| HwError::Fabric(format!("fabric {name:?} has a corrupt header: {e}")))?;
        Ok(seg)
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_LEN bytes, page aligned, lives
        // as long as `self`, and Header is all atomics (valid for any bytes,
        // shared mutation through &).
        unsafe { &*self.base.cast::<Header>() }
    }

    /// Slot `i`'s registers. Panics if `i` is out of range (callers check).
    pub fn slot(&self, i: usize) -> &SlotRegs {
        assert!(i < self.slots, "slot {i} out of range");
        // SAFETY: in range (asserted), so inside the mapping; the offset is a
        // multiple of 64 from a page-aligned base, SlotRegs' alignment; the
        // type is all atomics.
        unsafe { &*self.base.add(HEADER_LEN + i * SLOT_LEN).cast::<SlotRegs>() }
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fabric's configuration as recorded in the header.
    pub fn config(&self) -> FabricConfig {
        let h = self.header();
        FabricConfig {
            slots: h.slots.load(Relaxed) as usize,
            window_size: h.window_size.load(Relaxed) as usize,
            spads: h.spads.load(Relaxed) as usize,
            db_bits: h.db_bits.load(Relaxed),
            rlut_entries: h.rlut_entries.load(Relaxed) as usize,
            heartbeat_timeout: Duration::from_nanos(h.heartbeat_timeout_ns.load(Relaxed)),
            read_latency: Duration::from_nanos(h.read_latency_ns.load(Relaxed)),
        }
    }
}

fn file_size(fd: i32, path: &Path) -> Result<usize> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(last_err(format!(
            "stat of control segment {}",
            path.display()
        )));
    }
    Ok(st.st_size as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in ["a", "fab-1", "x.y_z", &"n".repeat(64)] {
            validate_name(ok).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "sp ace", &"n".repeat(65), "ü"] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
