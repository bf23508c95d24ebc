//! [`Mmio`]: volatile 32- and 64-bit register accesses at byte offsets of a
//! register block, bounds- and alignment-checked.
//!
//! Backends reach device registers only through this trait, so a software
//! register file ([`RegisterFile`]) can stand in for a BAR in tests. The
//! implementation over a BAR mapped through vfio is
//! [`vfio::MappedBar`](super::vfio::MappedBar). (pci-driver's own region
//! accessors stop at 32 bits and its traits are sealed, hence this trait.)

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;

use super::{HwError, Result};

/// A block of device registers: volatile accesses at byte offsets.
pub trait Mmio: Send + Sync {
    /// Bytes in the block.
    fn len(&self) -> usize;
    /// Whether the block has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads the 32-bit register at `offset` (4-byte aligned).
    fn read32(&self, offset: usize) -> Result<u32>;
    /// Writes the 32-bit register at `offset` (4-byte aligned).
    fn write32(&self, offset: usize, value: u32) -> Result<()>;
    /// Reads the 64-bit register at `offset` (8-byte aligned).
    fn read64(&self, offset: usize) -> Result<u64>;
    /// Writes the 64-bit register at `offset` (8-byte aligned).
    fn write64(&self, offset: usize, value: u64) -> Result<()>;
    /// Writes the 16-bit register at `offset` (2-byte aligned). A block
    /// that can store 16 bits (a mapped BAR) touches only those; the
    /// default writes the dword holding them, with `other` in its other
    /// half (the value harmless there: its current value for a plain
    /// register, 0 for a write-1-to-clear status).
    fn write16(&self, offset: usize, value: u16, other: u16) -> Result<()> {
        check_access(offset, 2, self.len())?;
        let (lo, hi) = if offset & 2 == 0 {
            (value, other)
        } else {
            (other, value)
        };
        self.write32(offset & !3, u32::from(lo) | (u32::from(hi) << 16))
    }
}

/// Checks that a `size`-byte access at `offset` fits in `len` bytes and is
/// aligned to its size.
pub(crate) fn check_access(offset: usize, size: usize, len: usize) -> Result<()> {
    match offset.checked_add(size) {
        Some(end) if end <= len => {}
        _ => {
            return Err(HwError::OutOfBounds {
                offset,
                len: size,
                window_len: len,
            });
        }
    }
    if !offset.is_multiple_of(size) {
        return Err(HwError::Misaligned { offset, size });
    }
    Ok(())
}

/// A software register file: plain memory with register semantics of the
/// simplest kind (what is written is read back). Stands in for a BAR in
/// tests; a model with side effects wraps it.
#[derive(Debug)]
pub struct RegisterFile {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl RegisterFile {
    /// A zeroed register file of `len` bytes (rounded up to 8).
    pub fn new(len: usize) -> RegisterFile {
        RegisterFile {
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }
}

impl Mmio for RegisterFile {
    fn len(&self) -> usize {
        self.len
    }

    fn read32(&self, offset: usize) -> Result<u32> {
        check_access(offset, 4, self.len)?;
        let shift = (offset % 8) * 8;
        Ok((self.words[offset / 8].load(SeqCst) >> shift) as u32)
    }

    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        check_access(offset, 4, self.len)?;
        let shift = (offset % 8) * 8;
        let mask = 0xFFFF_FFFFu64 << shift;
        let _ = self.words[offset / 8].fetch_update(SeqCst, SeqCst, |w| {
            Some((w & !mask) | ((value as u64) << shift))
        });
        Ok(())
    }

    fn read64(&self, offset: usize) -> Result<u64> {
        check_access(offset, 8, self.len)?;
        Ok(self.words[offset / 8].load(SeqCst))
    }

    fn write64(&self, offset: usize, value: u64) -> Result<()> {
        check_access(offset, 8, self.len)?;
        self.words[offset / 8].store(value, SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_16_bit_write_without_16_bit_stores_writes_the_dword_with_the_other_half() {
        let r = RegisterFile::new(16);
        r.write32(0x4, 0x1111_2222).unwrap();
        r.write16(0x6, 0xabcd, 0x2222).unwrap();
        assert_eq!(r.read32(0x4).unwrap(), 0xabcd_2222);
        r.write16(0x4, 0x0042, 0xabcd).unwrap();
        assert_eq!(r.read32(0x4).unwrap(), 0xabcd_0042);
        assert!(matches!(
            r.write16(0x5, 1, 0),
            Err(HwError::Misaligned { .. })
        ));
        assert!(matches!(
            r.write16(0x10, 1, 0),
            Err(HwError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn register_file_reads_back_and_checks_bounds() {
        let r = RegisterFile::new(256);
        r.write32(0x08, 0xdead_beef).unwrap();
        r.write32(0x0c, 0x1234_5678).unwrap();
        assert_eq!(r.read32(0x08).unwrap(), 0xdead_beef);
        assert_eq!(r.read64(0x08).unwrap(), 0x1234_5678_dead_beef);
        r.write64(0xf8, u64::MAX).unwrap();
        assert_eq!(r.read32(0xfc).unwrap(), u32::MAX);
        assert!(matches!(r.read32(0x100), Err(HwError::OutOfBounds { .. })));
        assert!(matches!(r.read64(0xfc), Err(HwError::OutOfBounds { .. })));
        assert!(matches!(r.read64(0x04), Err(HwError::Misaligned { .. })));
        assert!(matches!(
            r.write32(0x02, 1),
            Err(HwError::Misaligned { .. })
        ));
    }
}
