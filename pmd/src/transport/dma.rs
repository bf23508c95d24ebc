//! Data movers: the [`DmaEngine`] trait and the CPU-copy engine.
//!
//! The rendezvous path moves each payload byte exactly once: from a region
//! of our window straight into a region of the peer's window.

use crate::hw::{HwError, LocalWindow, PeerWindow, Result};

use super::sgl::ExtentPos;
use super::wire::WireSge;

/// Copies bytes from our window into a peer's window (or within ours).
/// Hardware DMA engines implement it later; [`CpuEngine`] copies with the CPU.
pub trait DmaEngine: Send {
    /// Copies `len` bytes at `src_off` of `src` to `dst_off` of `dst`.
    /// Bounds are checked on both sides.
    fn copy_to_peer(
        &mut self,
        src: &LocalWindow,
        src_off: usize,
        dst: &PeerWindow,
        dst_off: usize,
        len: usize,
    ) -> Result<()>;

    /// Copies `len` bytes within our own window (eager receive into a
    /// posted buffer).
    fn copy_local(
        &mut self,
        win: &LocalWindow,
        src_off: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<()>;
}

/// Smallest default non-temporal threshold (2 MiB), whatever the caches.
pub const MIN_NT_THRESHOLD: usize = 2 << 20;

/// The default non-temporal threshold: the size of the largest CPU cache
/// (from sysfs, read once), at least [`MIN_NT_THRESHOLD`]; 8 MiB when the
/// cache size is unknown.
///
/// Why: a copy that fits the last-level cache (a reused 1 MiB buffer, say)
/// stays cache-resident, and plain stores beat non-temporal ones there
/// (measured 0.53-0.76x of memcpy with a 256 KiB threshold, 0.91-0.99x with
/// plain stores); only copies larger than the cache gain from bypassing it.
pub fn default_nt_threshold() -> usize {
    static CACHED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CACHED.get_or_init(|| largest_cache().unwrap_or(8 << 20).max(MIN_NT_THRESHOLD))
}

/// Size of CPU 0's largest cache, from sysfs (`None` where unknown).
fn largest_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_cache_size(s.trim()))
        .max()
}

/// `32768K`, `4096K`, `32M` → bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// Copies with the CPU; from `nt_threshold` bytes on it uses non-temporal
/// stores (cache-bypassing, for copies too large to stay in the caches).
///
/// The default threshold is [`default_nt_threshold`] (the last-level cache
/// size, at least 2 MiB): below it plain stores win, since the buffers
/// stay cache-resident.
///
/// # Example
/// ```
/// use ntbdk_pmd::transport::{CpuEngine, DmaEngine, MIN_NT_THRESHOLD};
/// let engine = CpuEngine::default();
/// assert!(engine.nt_threshold >= MIN_NT_THRESHOLD);
/// let never = CpuEngine { nt_threshold: usize::MAX }; // plain stores only
/// # let _ = never;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CpuEngine {
    /// Copies of at least this many bytes use non-temporal stores
    /// (`usize::MAX`: never).
    pub nt_threshold: usize,
}

impl Default for CpuEngine {
    fn default() -> Self {
        Self {
            nt_threshold: default_nt_threshold(),
        }
    }
}

impl DmaEngine for CpuEngine {
    fn copy_to_peer(
        &mut self,
        src: &LocalWindow,
        src_off: usize,
        dst: &PeerWindow,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        // Pointer to pointer (no slice over our window, which peers write).
        dst.copy_from_local(dst_off, src, src_off, len, len >= self.nt_threshold)
    }

    fn copy_local(
        &mut self,
        win: &LocalWindow,
        src_off: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        let s = win.ptr_at(src_off, len)?;
        let d = win.ptr_at(dst_off, len)?;
        // SAFETY: both ranges were checked to lie in our window's mapping,
        // which `win` keeps alive; `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, len) };
        Ok(())
    }
}

/// Why [`copy_to_sgl`] stopped short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SglCopyError {
    /// The peer's grant table was mid-edit at every look: no answer yet;
    /// the same copy may go through later.
    Busy,
    /// A piece was refused or failed, or `src` does not cover the range.
    Failed,
}

/// Copies transfer bytes `start..` of `src` (extents of our window, walked
/// on from `at`) to the entries of `sges` (a peer's SGL into its window),
/// in order, with `engine`. Copying the same SGL again writes the same
/// bytes to the same places, so one that stopped short may be tried again
/// whole.
pub(crate) fn copy_to_sgl(
    engine: &mut dyn DmaEngine,
    local: &LocalWindow,
    win: &PeerWindow,
    src: &[(u64, u64)],
    at: &mut ExtentPos,
    start: u64,
    sges: &[WireSge],
) -> std::result::Result<(), SglCopyError> {
    let mut pos = start;
    let mut why = SglCopyError::Failed;
    for s in sges {
        let mut d = s.offset as usize;
        let ok = at.walk(src, pos, u64::from(s.len), |so, sl| {
            let r = engine.copy_to_peer(local, so as usize, win, d, sl as usize);
            d += sl as usize;
            if let Err(HwError::GrantTableBusy { .. }) = r {
                why = SglCopyError::Busy;
            }
            r.is_ok()
        });
        if !ok {
            return Err(why);
        }
        pos += u64::from(s.len);
    }
    Ok(())
}

/// `(offset, len)` extents as SGL entries.
pub(crate) fn to_wire(ext: &[(u64, u64)]) -> Vec<WireSge> {
    ext.iter()
        .map(|&(o, l)| WireSge {
            offset: o,
            len: l as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("xK"), None);
    }
}
