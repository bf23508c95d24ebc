//! Where a slot's inbound window memory comes from, as this process maps it.
//!
//! - Per-owner memory (the emulated fabric on one host): the owner creates a
//!   memfd zone (hugepages when reserved) and publishes its pid and
//!   descriptor number in its slot; a peer maps it as `/proc/<pid>/fd/<fd>`.
//! - One shared region (an ivshmem BAR): slot `i`'s window is bytes
//!   `windows_offset + i * window_size ..` of the region every host maps;
//!   nothing is published.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use ntbdk_mempool::{Zone, ZoneOptions};

use super::fabric::EmuFabric;
use super::layout::{SlotRegs, WINDOW_ALIGN};
use super::liveness::own_pid;
use crate::hw::{DeviceCounters, HwError, Keepalive, LocalWindow, PeerWindow, Port, Result};

/// One window's memory, mapped here, and what keeps it mapped.
#[derive(Clone)]
pub(crate) struct WindowMem {
    base: *mut u8,
    len: usize,
    page_size: usize,
    huge: bool,
    keep: Keepalive,
    /// The memfd zone, for per-owner memory (its descriptor is published).
    zone: Option<Arc<Zone>>,
}

// SAFETY: `base` points into a shared mapping that `keep` keeps alive; it is
// only turned into window handles, which never make references over it.
unsafe impl Send for WindowMem {}
// SAFETY: as for Send: no method reads or writes through `base`.
unsafe impl Sync for WindowMem {}

impl WindowMem {
    /// Creates (per-owner memory) or locates (shared region) the inbound
    /// window of our slot `port`.
    pub fn own(fabric: &EmuFabric, port: Port) -> Result<WindowMem> {
        if fabric.inner.windows.is_some() {
            return Self::in_region(fabric, port);
        }
        let size = fabric.config().window_size;
        check_memory(size)?;
        // Locked where RLIMIT_MEMLOCK allows (always for root), quietly
        // otherwise: nothing translates an emulated window's physical
        // addresses, so a swapped page costs latency only, and a default
        // memlock limit (8 MiB) is below the windows of the main benchmark.
        let zone = Zone::create(
            &window_zone_name(fabric, port),
            size,
            &ZoneOptions {
                warn_unlocked: false,
                ..ZoneOptions::huge_or_fallback()
            },
        )?;
        Ok(Self::from_zone(Arc::new(zone)))
    }

    /// Maps `peer`'s window as its slot registers `r` publish it: a zone of
    /// the slot's owner (`owner_pid`, from the slot word) named as
    /// [`own`](Self::own) names the window of that port. Anything else is
    /// refused: the control segment is writable by every member, and a
    /// hostile one could otherwise name another process's file, or one of
    /// our own private zones, as its window and have us write into it. The
    /// caller checks the slot's word before and after (the owner may leave
    /// meanwhile).
    pub fn peer(fabric: &EmuFabric, peer: Port, r: &SlotRegs, owner_pid: u32) -> Result<WindowMem> {
        if fabric.inner.windows.is_some() {
            return Self::in_region(fabric, peer);
        }
        let pid = r.win_pid.load(Relaxed);
        let fd = r.win_fd.load(Relaxed);
        if pid != owner_pid {
            return Err(HwError::Fabric(format!(
                "port {peer} published a window in process {pid}, not its own ({owner_pid}): \
                 refused"
            )));
        }
        let zone = Zone::open_from_pid(pid as i32, fd as i32)?;
        let want = window_zone_name(fabric, peer);
        if zone.name() != want {
            return Err(HwError::Fabric(format!(
                "port {peer} published the zone {:?} as its window, not {want:?}: refused",
                zone.name()
            )));
        }
        Ok(Self::from_zone(Arc::new(zone)))
    }

    fn from_zone(zone: Arc<Zone>) -> WindowMem {
        WindowMem {
            base: zone.as_ptr(),
            len: zone.len(),
            page_size: zone.page_size().bytes(),
            huge: zone.is_huge(),
            keep: zone.clone(),
            zone: Some(zone),
        }
    }

    fn in_region(fabric: &EmuFabric, port: Port) -> Result<WindowMem> {
        let start = fabric.inner.windows.unwrap_or(0);
        let size = fabric.config().window_size;
        let region = fabric.region();
        let offset = (port as usize)
            .checked_mul(size)
            .and_then(|o| o.checked_add(start))
            .ok_or_else(|| HwError::Invalid(format!("window of port {port} out of range")))?;
        Ok(WindowMem {
            base: region.ptr_at(offset, size)?,
            len: size,
            page_size: WINDOW_ALIGN,
            huge: false,
            keep: region.keepalive(),
            zone: None,
        })
    }

    /// Bytes mapped (at least the fabric's window size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Page size backing the window.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Whether hugepages back it.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// The start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// The descriptor to publish in our slot (per-owner memory), else 0.
    pub fn published_fd(&self) -> u32 {
        self.zone
            .as_ref()
            .map_or(0, |z| z.as_fd().as_raw_fd() as u32)
    }

    /// The pid to publish in our slot.
    pub fn published_pid(&self) -> u32 {
        own_pid()
    }

    /// The read-write handle onto the first `len` bytes (our own window).
    /// Its bus address is its virtual address (the emulated bus has an
    /// IOMMU in VA mode).
    pub fn local_window(&self, len: usize) -> LocalWindow {
        let len = len.min(self.len);
        // SAFETY: `base..base+len` is inside the mapping, page aligned,
        // read-write, kept alive by the handle's keepalive.
        unsafe { LocalWindow::from_raw(self.base, len, self.base as u64, self.keep.clone()) }
    }

    /// The write-only handle onto the first `len` bytes (a peer's window).
    pub fn peer_window(&self, len: usize, peer: Port, counters: Arc<DeviceCounters>) -> PeerWindow {
        let len = len.min(self.len);
        // SAFETY: `base..base+len` is inside the mapping, page aligned,
        // writable, kept alive by the handle's keepalive.
        unsafe { PeerWindow::from_raw(self.base, len, peer, counters, self.keep.clone()) }
    }
}

/// Refuses a window larger than the memory that could back it now: the
/// zone takes 2 MiB hugepages if enough are free (and not reserved), or
/// else falls back to small pages entirely, which must then fit in what
/// is available of the rest (`MemAvailable`, which leaves the reserved
/// hugepages out). Reserving more would wake the OOM killer, not fail.
fn check_memory(size: usize) -> Result<()> {
    let Some(avail) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| mem_available(&info))
    else {
        return Ok(()); // unknown (not Linux, or no /proc): let the zone try
    };
    let huge = free_2m_hugepages().unwrap_or(0);
    if !window_fits(size as u64, avail, huge) {
        return Err(HwError::Invalid(format!(
            "a window of {size} bytes does not fit: need {size}, {avail} available \
             (MemAvailable), {huge} in free 2 MiB hugepages; use a smaller window size"
        )));
    }
    Ok(())
}

/// Whether a window of `size` bytes fits: all in free hugepages
/// (`huge` bytes), or all in small pages (`avail` bytes); a zone never
/// mixes the two.
fn window_fits(size: u64, avail: u64, huge: u64) -> bool {
    size <= huge || size <= avail
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes in free, unreserved 2 MiB hugepages (the size zones take).
fn free_2m_hugepages() -> Option<u64> {
    let read = |f: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let pages = read("free_hugepages")?.saturating_sub(read("resv_hugepages").unwrap_or(0));
    Some(pages.saturating_mul(2 << 20))
}

/// The name of the zone holding port `port`'s window on `fabric`.
fn window_zone_name(fabric: &EmuFabric, port: Port) -> String {
    format!("emu-{}-{port}", fabric.name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::emu::two_members;
    use crate::hw::{NtbDevice, PeerGrant, Strided};

    #[test]
    fn a_window_fits_in_hugepages_or_in_small_pages_not_in_their_sum() {
        let gib = 1u64 << 30;
        assert!(window_fits(gib, 2 * gib, 0));
        assert!(window_fits(3 * gib, 2 * gib, 4 * gib));
        // 2.5 GiB: neither 1 GiB of hugepages nor 2 GiB of the rest holds
        // it alone, and a zone does not mix them.
        assert!(!window_fits(5 * gib / 2, 2 * gib, gib));
        let info = "MemTotal:       16000000 kB\nMemAvailable:    2000000 kB\n";
        assert_eq!(mem_available(info), Some(2_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }

    /// A member that publishes another file as its window (here one of our
    /// own private zones, or a zone in another process) is refused; what it
    /// really owns is mapped.
    #[test]
    fn a_window_published_as_another_zone_or_process_is_refused() {
        let (dir, fabric, [a, b]) = two_members("winpub");
        let secret = Zone::create("private", 1 << 20, &ZoneOptions::no_huge()).unwrap();
        let regs = fabric.regs_of(1);
        let (pid, fd) = (regs.win_pid.load(Relaxed), regs.win_fd.load(Relaxed));
        regs.win_fd
            .store(secret.as_fd().as_raw_fd() as u32, Relaxed);
        let e = a.peer_window(1, 0).unwrap_err().to_string();
        assert!(e.contains("\"private\"") && e.contains("refused"), "{e}");
        regs.win_fd.store(fd, Relaxed);
        regs.win_pid.store(1, Relaxed);
        let e = a.peer_window(1, 0).unwrap_err().to_string();
        assert!(e.contains("process 1") && e.contains("refused"), "{e}");
        regs.win_pid.store(pid, Relaxed);
        a.peer_window(1, 0).unwrap();
        drop((a, b));
        EmuFabric::destroy_in(&dir, "winpub").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A peer's grant template is read under its sequence lock: one caught
    /// mid-rewrite (forever, here) is an error to try again, instead of
    /// reading as "nothing published" (the whole window) or as a mix of
    /// two templates; once rewritten, the new one holds.
    #[test]
    fn a_grant_template_being_rewritten_is_not_used() {
        let (dir, fabric, [a, b]) = two_members("grantseq");
        let grant = PeerGrant {
            per_port: vec![Strided {
                base: 4096,
                stride: 4096,
                len: 4096,
            }],
            shared: Vec::new(),
        };
        b.grant_peers(0, &grant).unwrap();
        // Port 0 may write 4096 + 0 * 4096 .. 8192, nothing else.
        let w = a.peer_window(1, 0).unwrap();
        w.write_u64(4096, 1).unwrap();
        assert!(w.write_u64(0, 1).is_err());
        // b "dies" mid-rewrite: the word stays odd.
        let regs = fabric.regs_of(1);
        let seq = regs.grant_count.load(Relaxed) >> 32;
        regs.grant_count.store((seq + 1) << 32, Relaxed);
        let e = a.peer_window(1, 0).unwrap_err();
        assert!(e.to_string().contains("being rewritten"), "{e}");
        // Finished: the sequence even again, one range for port 0 at 0.
        regs.grant[0][1].store(0, Relaxed);
        regs.grant_count
            .store(((seq + 2) << 32) | 1, std::sync::atomic::Ordering::Release);
        let w = a.peer_window(1, 0).unwrap();
        w.write_u64(0, 1).unwrap();
        assert!(w.write_u64(4096, 1).is_err());
        drop((a, b));
        EmuFabric::destroy_in(&dir, "grantseq").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A write the live grant table must admit, while the peer's table is
    /// mid-edit at every look (its owner preempted), is "busy, try again",
    /// not "not granted" (which ends a connection); once the edit ends, it
    /// goes through.
    #[test]
    fn a_write_into_a_table_mid_edit_is_busy_not_refused() {
        let (dir, fabric, [a, b]) = two_members("grantbusy");
        // A template granting port 0 its first page; 8192.. by the table.
        let template = PeerGrant {
            per_port: vec![Strided {
                base: 0,
                stride: 4096,
                len: 4096,
            }],
            shared: Vec::new(),
        };
        b.grant_peers(0, &template).unwrap();
        b.grant_range(0, 8192, 4096, Some(0)).unwrap();
        let w = a.peer_window(1, 0).unwrap();
        w.write_u64(8192, 1).unwrap();
        let table = &fabric.regs_of(1).grants;
        table.hold_mid_edit(true);
        let e = w.write_u64(8192, 2).unwrap_err();
        assert!(matches!(e, HwError::GrantTableBusy { peer: 1 }), "{e}");
        table.hold_mid_edit(false);
        w.write_u64(8192, 3).unwrap();
        drop((w, a, b));
        EmuFabric::destroy_in(&dir, "grantbusy").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
