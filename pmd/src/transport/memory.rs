//! The region verbs: registering regions of our window's region area and
//! copying bytes in and out of them (local access).

use super::endpoint::Transport;
use crate::hw::{LocalWindow, Port};

use super::error::{Result, TransportError};
use super::key::{Access, RegionKey};
use super::sgl::Sge;

impl Transport {
    /// Storage the transport allocates for one peer, `writer`, to write
    /// (a multicast target's, a chain link's, the destination of a read of
    /// unknown size): `len` bytes in `writer`'s domain only, zeroed, so
    /// that what an earlier operation (another peer's data, or our
    /// application's) left in those bytes is never delivered as this one's
    /// when the writer writes less than it claims.
    pub(crate) fn storage_for(&mut self, len: u32, writer: Port) -> Result<RegionKey> {
        self.check_tenure()?;
        let key =
            self.regions
                .register_for(u64::from(len), Access::LOCAL, None, Some(&[writer]))?;
        // At memset's pace (a copy from a page of zeros): nothing of ours
        // reads these bytes meanwhile. A peer that asks for storage and
        // cancels makes us do this once per request, within its quota.
        const ZEROS: [u8; 4096] = [0; 4096];
        for (off, l) in self.regions.extents(key, len) {
            let (mut at, end) = (off as usize, (off + l) as usize);
            while at < end {
                let n = (end - at).min(ZEROS.len());
                if let Err(e) = self.local.write(at, &ZEROS[..n]) {
                    let _ = self.regions.deregister(key);
                    return Err(e.into());
                }
                at += n;
            }
        }
        Ok(key)
    }

    /// [`TransportError::Lost`] once our place on the fabric is another
    /// host's (see [`NtbDevice::check_tenure`](crate::hw::NtbDevice::check_tenure)):
    /// before the transport writes its own window.
    pub(crate) fn check_tenure(&self) -> Result<()> {
        if self.lost || self.dev.check_tenure().is_err() {
            return Err(TransportError::Lost);
        }
        Ok(())
    }

    /// Registers a region of `len` bytes in our window's region area: peers
    /// may place data into it (remote write) or read it (remote read) as
    /// `access` allows. Returns its key, drawn at random (an OS-seeded
    /// permutation), so that a peer cannot guess the keys of regions it was
    /// not told of.
    ///
    /// With remote-write access, a region in one piece of the area is
    /// advertised to the peers for one-sided writes; on an area too
    /// fragmented to hold `len` bytes in one piece the region is scattered
    /// over several and serves rendezvous writes only (compact the area by
    /// deregistering, or register large regions first).
    pub fn register_region(&mut self, len: usize, access: Access) -> Result<RegionKey> {
        let key = self.regions.register(len as u64, access, None)?;
        self.advertise_new(key);
        Ok(key)
    }

    /// Like [`register_region`](Self::register_region), remotely accessible
    /// only by `peers` (the region's protection domain, as a verbs PD): a
    /// write, read or size request naming its key from any other peer is
    /// refused (an access error to that peer, counted).
    pub fn register_region_for(
        &mut self,
        len: usize,
        access: Access,
        peers: &[Port],
    ) -> Result<RegionKey> {
        let key = self
            .regions
            .register_for(len as u64, access, None, Some(peers))?;
        self.advertise_new(key);
        Ok(key)
    }

    /// Like [`register_region`](Self::register_region), built from extents
    /// of at most `max_extent` bytes (scattered where the area is
    /// fragmented): SGLs naming it have several entries. One that ends up
    /// in one piece is advertised for one-sided writes as well.
    pub fn register_region_scattered(
        &mut self,
        len: usize,
        access: Access,
        max_extent: usize,
    ) -> Result<RegionKey> {
        let key = self
            .regions
            .register(len as u64, access, Some(max_extent as u64))?;
        self.advertise_new(key);
        Ok(key)
    }

    /// Deregisters a region. Do not deregister a region that posted work
    /// still uses (as in RDMA verbs): its bytes may be handed out again.
    /// Peers' operations on it end safely: reads of it we serve are refused
    /// from now on, and its bytes are not reused while a peer may still
    /// write into them (a one-sided write before it acknowledged the
    /// revocation, a rendezvous write we granted before its `Done`).
    pub fn deregister_region(&mut self, key: RegionKey) -> Result<()> {
        let advertised = self.regions.deregister(key)?;
        // Multicast storage the application was given leaves its origin's
        // share.
        self.delivered_storage.retain(|d| d.region != key);
        self.revoke(key, &advertised);
        self.end_reads_of(key);
        Ok(())
    }

    /// Length of a region.
    pub fn region_len(&self, key: RegionKey) -> Option<u64> {
        self.regions.get(key).map(|r| r.len)
    }

    /// Bytes free in the region area.
    pub fn region_area_free(&self) -> u64 {
        self.regions.free_bytes()
    }

    /// Copies `data` into region `key` at `offset` (local write). Fails
    /// with [`TransportError::Lost`] once we were dropped from the fabric:
    /// on a fabric whose windows are one shared region, the bytes are the
    /// new occupant's then.
    pub fn region_write(&mut self, key: RegionKey, offset: u64, data: &[u8]) -> Result<()> {
        self.check_tenure()?;
        let len = data.len() as u64;
        if let Some(o) = self
            .regions
            .contiguous(key, offset, len, Access::LOCAL_WRITE)
        {
            return Ok(self.local.write(o as usize, data)?);
        }
        let ext = self
            .regions
            .resolve_one(key, offset, data.len() as u64, Access::LOCAL_WRITE)?;
        let mut at = 0usize;
        for &(o, l) in ext.as_slice() {
            self.local.write(o as usize, &data[at..at + l as usize])?;
            at += l as usize;
        }
        Ok(())
    }

    /// A view of region `key` for access in place: loads of the bytes peers
    /// write into it (one-sided writes), without copying the region and
    /// without a Rust reference over memory peers write (every access is an
    /// atomic or pointer copy, as rust-vmm's `VolatileSlice`).
    pub fn region_view(&self, key: RegionKey) -> Result<RegionView> {
        let r = self
            .regions
            .get(key)
            .ok_or(TransportError::NoSuchRegion(key))?;
        Ok(RegionView {
            key,
            local: self.local.clone(),
            extents: r.slice(0, r.len),
            len: r.len,
        })
    }

    /// Copies bytes of region `key` at `offset` into `out` (local read).
    pub fn region_read(&self, key: RegionKey, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len() as u64;
        if let Some(o) = self
            .regions
            .contiguous(key, offset, len, Access::LOCAL_READ)
        {
            return Ok(self.local.read(o as usize, out)?);
        }
        let ext = self
            .regions
            .resolve_one(key, offset, out.len() as u64, Access::LOCAL_READ)?;
        let mut at = 0usize;
        for &(o, l) in ext.as_slice() {
            self.local.read(o as usize, &mut out[at..at + l as usize])?;
            at += l as usize;
        }
        Ok(())
    }

    /// Resolves local SGEs needing `need` into window extents and their
    /// total length (1 byte to 4 GiB - 1).
    #[inline]
    pub(crate) fn resolve_sges(
        &self,
        sges: &[Sge],
        need: Access,
    ) -> Result<(Vec<(u64, u64)>, u32)> {
        let mut ext = Vec::with_capacity(sges.len());
        let mut total = 0u64;
        for s in sges {
            ext.extend(self.regions.resolve(s.key, s.offset, s.len, need)?);
            total += s.len;
        }
        if total == 0 || total > u64::from(u32::MAX) {
            return Err(TransportError::TransferSize { len: total });
        }
        Ok((ext, total as u32))
    }
}

/// A registered region, viewed in place (see
/// [`Transport::region_view`]): offsets are the region's, checked.
#[derive(Debug, Clone)]
pub struct RegionView {
    key: RegionKey,
    local: LocalWindow,
    extents: Vec<(u64, u64)>,
    len: u64,
}

impl RegionView {
    /// The region's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty (never: regions have a byte at least).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window offset of region byte `off`.
    #[inline]
    fn at(&self, off: u64) -> Option<usize> {
        let mut pos = 0;
        for &(o, l) in &self.extents {
            if off < pos + l {
                return Some((o + off - pos) as usize);
            }
            pos += l;
        }
        None
    }

    /// Acquire load of region byte `off` (`None` past the end): poll it for
    /// a peer's one-sided write, as `ib_write_lat` polls its buffer's last
    /// byte. Over a CPU copy (the emulated fabric) the bytes of one write
    /// may land in any order: when the whole buffer must be there, use a
    /// write with immediate and wait for its completion.
    ///
    /// Poll with [`std::hint::spin_loop`] between loads: a poll that loads
    /// back to back takes the line back from the writer between its stores,
    /// each store then waiting for the line again (measured on the emulated
    /// fabric: a 64-byte polled ping-pong 1.39-1.42× the two-line ping-pong
    /// without the pause, 1.10× with it; bench/RESULTS.md).
    #[inline]
    pub fn load_u8(&self, off: u64) -> Option<u8> {
        self.local.load_u8(self.at(off)?).ok()
    }

    /// Copies region bytes `off..off + out.len()` into `out`.
    pub fn read(&self, off: u64, out: &mut [u8]) -> Result<()> {
        let end = off
            .checked_add(out.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or(TransportError::OutOfRange {
                key: self.key,
                offset: off,
                len: out.len() as u64,
                region_len: self.len,
            })?;
        let mut pos = 0;
        for &(o, l) in &self.extents {
            let (s, e) = (pos.max(off), (pos + l).min(end));
            if s < e {
                let dst = &mut out[(s - off) as usize..(e - off) as usize];
                self.local.read((o + s - pos) as usize, dst)?;
            }
            pos += l;
            if pos >= end {
                break;
            }
        }
        Ok(())
    }
}
