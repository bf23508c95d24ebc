//! Data movers: the [`DmaEngine`] trait and the CPU-copy engine.
//!
//! The rendezvous path moves each payload byte exactly once: from a region
//! of our window straight into a region of the peer's window.

use crate::hw::{LocalWindow, PeerWindow, Result};

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

/// Copies with the CPU; above `nt_threshold` bytes it uses non-temporal
/// stores (cache-bypassing, for large copies the writer will not reread).
///
/// # Example
/// ```
/// use ntbdk_pmd::transport::{CpuEngine, DmaEngine};
/// let engine = CpuEngine::default();
/// assert_eq!(engine.nt_threshold, 256 * 1024);
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
            nt_threshold: 256 * 1024,
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
        let p = src.ptr_at(src_off, len)?;
        // SAFETY: `ptr_at` checked that `len` bytes at `p` lie in our window's
        // mapping, which `src` keeps alive for this call. The bytes belong to
        // a registered region that the application promised not to modify
        // while the operation is posted; peers only write to regions through
        // SGLs we issue, never to a region being sent from. A racing write by
        // a misbehaving peer can only change the bytes copied, not make the
        // copy leave the mapping.
        // SAFETY: holds for the reasons given just above.
        let s = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
        if len >= self.nt_threshold {
            dst.write_nt(dst_off, s)
        } else {
            dst.write(dst_off, s)
        }
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
