//! [`MappedBar`]: a BAR mapped through vfio, reached with volatile accesses.
//!
//! pci-driver maps a BAR with `mmap(MAP_SHARED)` of the vfio device fd and
//! hands out its address (`MappedOwningPciRegion::as_mut_ptr`); the mapping
//! lives until the `MappedOwningPciRegion` drops, so it is kept in an `Arc`
//! that every user of the address holds (pci-driver docs, `regions`
//! module). Its own accessors stop at 32 bits, hence volatile 64-bit
//! accesses here. Nothing makes a reference or slice over the BAR.

use std::ptr::NonNull;
use std::sync::Arc;

use pci_driver::regions::MappedOwningPciRegion;

use crate::hw::emu::SharedRegion;
use crate::hw::mmio::{Mmio, check_access};
use crate::hw::{Keepalive, Result};

/// A BAR mapped read-write into this process.
#[derive(Debug, Clone)]
pub struct MappedBar {
    map: Arc<MappedOwningPciRegion>,
}

impl MappedBar {
    /// Wraps a mapping made by pci-driver.
    pub fn new(map: MappedOwningPciRegion) -> MappedBar {
        MappedBar { map: Arc::new(map) }
    }

    fn ptr(&self, offset: usize) -> *mut u8 {
        // The caller checked `offset` against the length.
        self.map.as_mut_ptr().wrapping_add(offset)
    }

    /// The BAR as a shared memory region (for a BAR that is memory shared
    /// with other hosts, such as ivshmem's BAR2). The region keeps the
    /// mapping alive.
    pub fn shared_region(&self) -> SharedRegion {
        let keep: Keepalive = self.map.clone();
        let base = NonNull::new(self.map.as_mut_ptr()).expect("a mapped BAR is not at address 0");
        // SAFETY: pci-driver mapped `len` bytes read-write at `base` (page
        // aligned, by mmap); `keep` holds the mapping; ntbdk makes no
        // reference over it (module doc).
        unsafe { SharedRegion::from_raw(base, self.map.len(), keep) }
    }
}

impl Mmio for MappedBar {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn read32(&self, offset: usize) -> Result<u32> {
        check_access(offset, 4, self.len())?;
        // SAFETY: in bounds and 4-byte aligned (checked); the mapping lives
        // as long as `self.map`; a device register is read volatile.
        Ok(unsafe { self.ptr(offset).cast::<u32>().read_volatile() })
    }

    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        check_access(offset, 4, self.len())?;
        // SAFETY: as in `read32`.
        unsafe { self.ptr(offset).cast::<u32>().write_volatile(value) };
        Ok(())
    }

    fn read64(&self, offset: usize) -> Result<u64> {
        check_access(offset, 8, self.len())?;
        // SAFETY: in bounds and 8-byte aligned (checked); the mapping lives
        // as long as `self.map`.
        Ok(unsafe { self.ptr(offset).cast::<u64>().read_volatile() })
    }

    fn write64(&self, offset: usize, value: u64) -> Result<()> {
        check_access(offset, 8, self.len())?;
        // SAFETY: as in `read64`.
        unsafe { self.ptr(offset).cast::<u64>().write_volatile(value) };
        Ok(())
    }

    /// A real 16-bit store: the register's neighbour in its dword is not
    /// written at all (on an Intel gen4 NTB, slot control beside slot
    /// status, where a write is a command; Linux `gen4_poll_link` writes
    /// the 16 bits alone).
    fn write16(&self, offset: usize, value: u16, _other: u16) -> Result<()> {
        check_access(offset, 2, self.len())?;
        // SAFETY: in bounds and 2-byte aligned (checked); the mapping lives
        // as long as `self.map`.
        unsafe { self.ptr(offset).cast::<u16>().write_volatile(value) };
        Ok(())
    }
}
