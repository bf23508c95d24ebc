//! The control segment: the header and slot blocks, in a [`SharedRegion`].
//!
//! Two places hold one:
//! - a file in a shared-memory directory ([`Segment::create`],
//!   [`Segment::attach`]): the emulated fabric. The creator opens it with
//!   `O_CREAT | O_EXCL` and mode 0600 (owner only) and sizes it; the file
//!   holds the control area only (windows are the owners' memfds);
//! - a region that also holds the windows ([`Segment::open_region`]): an
//!   ivshmem BAR shared by VMs, where nobody creates anything and the first
//!   host to arrive initialises it.
//!
//! Either way the initialiser claims the blank header with a CAS of the magic
//! 0 → `MAGIC_INIT`, writes the header, and only then the magic, with release
//! ordering. An attacher waits (bounded) for the magic with acquire ordering,
//! then checks the layout version and sizes before it touches the slots.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use super::config::FabricConfig;
use super::layout::{
    HEADER_LEN, Header, MAGIC, MAGIC_INIT, SLOT_LEN, SlotRegs, VERSION, control_len, region_len,
};
use super::region::SharedRegion;
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

/// Total bytes of a control segment file with `slots` slots.
pub(crate) fn segment_len(slots: usize) -> usize {
    control_len(slots)
}

/// What a region holds besides the control area, which sets the size it
/// must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extent {
    /// The control area only (a control segment file): exactly its size.
    ControlOnly,
    /// The control area and every slot's window (an ivshmem BAR): at least
    /// their size.
    WithWindows,
}

/// A mapped control segment.
pub(crate) struct Segment {
    region: SharedRegion,
    /// The header's configuration, read once and validated when the
    /// segment was created or attached: every member can write the header,
    /// so it is never read again.
    cfg: FabricConfig,
    path: PathBuf,
}

impl Segment {
    /// Creates the segment at `path` (which must not exist) for `cfg`.
    /// An existing file is an `Io` error of kind `AlreadyExists`.
    pub fn create(path: &Path, cfg: &FabricConfig) -> Result<Segment> {
        cfg.validate()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io(format!("creating control segment {}", path.display())))?;
        let len = segment_len(cfg.slots);
        let result = (|| {
            file.set_len(len as u64)
                .map_err(io(format!("sizing control segment {}", path.display())))?;
            // Reserve the blocks now: a full shared-memory directory is an
            // error here, not a SIGBUS at the first touch of a sparse page.
            nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, len as i64)
                .map_err(std::io::Error::from)
                .map_err(io(format!(
                    "reserving {len} bytes for control segment {} (is its directory full?)",
                    path.display()
                )))?;
            let what = format!("control segment {}", path.display());
            let region = SharedRegion::map_fd(&file, len, &what)?;
            // Slots are zero (a fresh file): free, generation 0.
            if !init_header(&region, cfg) {
                return Err(HwError::Fabric(format!(
                    "{} was initialised by someone else while we created it",
                    path.display()
                )));
            }
            Ok(Segment {
                region,
                cfg: cfg.clone(),
                path: path.to_owned(),
            })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(path);
        }
        result
    }

    /// Attaches to the segment at `path`, waiting up to `wait` for its
    /// creator to finish initialising it.
    pub fn attach(path: &Path, name: &str, wait: Duration) -> Result<Segment> {
        // No symlink: the file must be the one its name says, checked below.
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(HwError::Fabric(format!(
                    "no fabric named {name:?} in {}: create it (ntb-tool create {name}) \
                     or open a device with EmuDevice::open",
                    path.parent().unwrap_or(Path::new("")).display()
                )));
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(HwError::Fabric(format!(
                    "{} is a symbolic link, not a fabric's control segment (another \
                     user may have planted it): use another fabric name, or set \
                     NTBDK_SHM_DIR to a directory only you can write",
                    path.display()
                )));
            }
            Err(e) => return Err(io(format!("opening control segment {}", path.display()))(e)),
        };
        check_ours(&file, path)?;
        let deadline = Instant::now() + wait;
        // Wait for the creator's ftruncate, which sizes the file whole.
        let size = loop {
            let size = file
                .metadata()
                .map_err(io(format!("stat of control segment {}", path.display())))?
                .len() as usize;
            if size >= HEADER_LEN {
                break size;
            }
            if Instant::now() >= deadline {
                return Err(never_initialised(name, path));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let what = format!("control segment {}", path.display());
        let region = SharedRegion::map_fd(&file, size, &what)?;
        Self::attach_region(region, path, name, deadline, Extent::ControlOnly)
    }

    /// Opens the fabric in `region`, a region that holds the control area
    /// and the windows: initialises it for `cfg` if it is blank (all zero),
    /// else attaches to it, whatever its geometry, waiting up to `wait` for
    /// another host's initialisation. `label` names the region in messages.
    pub fn open_region(
        region: SharedRegion,
        cfg: Option<&FabricConfig>,
        label: &str,
        wait: Duration,
    ) -> Result<Segment> {
        let path = PathBuf::from(label);
        if let Some(cfg) = cfg {
            cfg.validate()?;
            let need = region_len(cfg.slots, cfg.window_size).unwrap_or(usize::MAX);
            let fits = need <= region.len();
            let magic = region.u64_at(0)?.load(Acquire);
            if magic == 0 && !fits {
                return Err(HwError::Invalid(format!(
                    "{label} is {} bytes; {} slots of {}-byte windows need {need}: use fewer \
                     slots or smaller windows, or give the shared memory more room",
                    region.len(),
                    cfg.slots,
                    cfg.window_size
                )));
            }
            // Only a geometry that fits is ever laid out (the magic may have
            // been zeroed since we looked); else we attach to what is there.
            if fits && init_header(&region, cfg) {
                return Ok(Segment {
                    region,
                    cfg: cfg.clone(),
                    path,
                });
            }
        }
        let deadline = Instant::now() + wait;
        Self::attach_region(region, &path, label, deadline, Extent::WithWindows)
    }

    /// Waits for the magic, checks the header against `region`, and maps
    /// the slots.
    fn attach_region(
        region: SharedRegion,
        path: &Path,
        name: &str,
        deadline: Instant,
        extent: Extent,
    ) -> Result<Segment> {
        if region.len() < HEADER_LEN {
            return Err(HwError::Fabric(format!(
                "{} is {} bytes, too small for an ntbdk fabric header ({HEADER_LEN} bytes)",
                path.display(),
                region.len()
            )));
        }
        let magic = region.u64_at(0)?;
        loop {
            match magic.load(Acquire) {
                MAGIC => break,
                0 | MAGIC_INIT if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                0 | MAGIC_INIT if extent == Extent::WithWindows => {
                    return Err(HwError::Fabric(format!(
                        "{} holds no ntbdk fabric (blank, or its initialiser stopped \
                         half-way): open it as a device first, which lays the fabric out; \
                         if that fails too, zero the shared memory (recreate its backing file)",
                        path.display()
                    )));
                }
                0 | MAGIC_INIT => return Err(never_initialised(name, path)),
                _ => {
                    return Err(HwError::Fabric(format!(
                        "{} is not an ntbdk fabric control segment (bad magic)",
                        path.display()
                    )));
                }
            }
        }
        // SAFETY: the region holds at least HEADER_LEN bytes (checked above),
        // page aligned; Header is all atomics.
        let h: &Header = unsafe { region.atomic_at(0) };
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
        // One read of the header, validated and kept: what a member writes
        // there later (every member can) is never looked at again.
        let cfg = read_config(h);
        cfg.validate()
            .map_err(|e| HwError::Fabric(format!("fabric {name:?} has a corrupt header: {e}")))?;
        let slots = cfg.slots;
        let size = region.len();
        match extent {
            Extent::ControlOnly if size != segment_len(slots) => {
                return Err(HwError::Fabric(format!(
                    "fabric {name:?} is corrupt: its control segment is {size} bytes, \
                     {slots} slots need {}: destroy it (ntb-tool destroy {name})",
                    segment_len(slots)
                )));
            }
            Extent::WithWindows => {
                let need = region_len(slots, cfg.window_size).unwrap_or(usize::MAX);
                if need > size {
                    return Err(HwError::Fabric(format!(
                        "{} holds a fabric of {slots} slots of {}-byte windows ({need} bytes) \
                         but is only {size} bytes: was the shared memory resized? Zero it \
                         (recreate its backing file) and start again",
                        path.display(),
                        cfg.window_size
                    )));
                }
            }
            Extent::ControlOnly => {}
        }
        Ok(Segment {
            region,
            cfg,
            path: path.to_owned(),
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the region holds at least HEADER_LEN bytes (checked when
        // it was created or attached), page aligned; Header is all atomics.
        unsafe { self.region.atomic_at(0) }
    }

    /// Slot `i`'s registers. Panics if `i` is out of range (callers check).
    pub fn slot(&self, i: usize) -> &SlotRegs {
        assert!(i < self.cfg.slots, "slot {i} out of range");
        // SAFETY: in range (asserted), so inside the region (its size was
        // checked against the slot count); the offset is a multiple of 64
        // from a page-aligned base, SlotRegs' alignment; the type is all
        // atomics.
        // SAFETY: holds for the reasons given just above.
        unsafe { self.region.atomic_at(HEADER_LEN + i * SLOT_LEN) }
    }

    /// The region the segment is in.
    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// Path of the file (or the region's label).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fabric's configuration, as the header held it when the segment
    /// was created or attached (validated then).
    pub fn config(&self) -> FabricConfig {
        self.cfg.clone()
    }
}

/// The configuration recorded in header `h`, each field read once.
fn read_config(h: &Header) -> FabricConfig {
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

/// Refuses a control segment that is not what [`Segment::create`] makes: a
/// regular file of this user with no access for anyone else. In a
/// directory others may write (`/dev/shm` is writable by every user),
/// another user could plant a file under a fabric's name (mode 0666, a
/// valid header) and, once we attached, rewrite our slot word, ring our
/// doorbells or shrink the file under us. A directory only its owner (us,
/// or root) may write holds no such file, so there the file is taken as it
/// is: some file systems (vfat, NFS with squashed owners) show no modes or
/// owners worth checking.
fn check_ours(file: &std::fs::File, path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let private_dir = path
        .parent()
        .and_then(|d| std::fs::metadata(d).ok())
        .is_some_and(|d| d.mode() & 0o022 == 0 && (d.uid() == me || d.uid() == 0));
    let m = file
        .metadata()
        .map_err(io(format!("stat of control segment {}", path.display())))?;
    if !m.file_type().is_file() {
        return Err(HwError::Fabric(format!(
            "{} is not a regular file, so not a fabric's control segment (another \
             user may have planted it): use another fabric name, or set NTBDK_SHM_DIR \
             to a directory only you can write",
            path.display()
        )));
    }
    if private_dir || (m.uid() == me && m.mode() & 0o077 == 0) {
        return Ok(());
    }
    Err(HwError::Fabric(format!(
        "{} is owned by uid {} with mode {:o}: a fabric's creator makes it mode 600, \
         and only its own user (uid {}) may attach it here (this is uid {me}), since \
         others may write this directory and could have planted it. Run as the \
         fabric's user, use another fabric name, or set NTBDK_SHM_DIR to a directory \
         only you can write",
        path.display(),
        m.uid(),
        m.mode() & 0o7777,
        m.uid(),
    )))
}

fn never_initialised(name: &str, path: &Path) -> HwError {
    HwError::Fabric(format!(
        "fabric {name:?} ({}) was never initialised (its creator died while creating \
         it?): destroy it (ntb-tool destroy {name}) and create it again",
        path.display()
    ))
}

/// Claims a blank header (magic 0) and writes `cfg` into it, the magic last.
/// False if the header was not blank (someone else initialises or did).
/// The caller has checked that the region holds the fabric.
fn init_header(region: &SharedRegion, cfg: &FabricConfig) -> bool {
    // SAFETY: every region holds at least HEADER_LEN bytes (callers size it
    // for the whole fabric), page aligned; Header is all atomics.
    let h: &Header = unsafe { region.atomic_at(0) };
    if h.magic
        .compare_exchange(0, MAGIC_INIT, Acquire, Relaxed)
        .is_err()
    {
        return false;
    }
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
    h.magic.store(MAGIC, Release);
    true
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
