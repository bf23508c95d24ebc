//! Bus addresses (IOVAs) for inbound windows, aligned as the NTB needs.
//!
//! Gen3 and Ice Lake translate a window only to an address aligned to the
//! whole BAR size (up to 512 MiB or more; `linux:drivers/ntb/hw/intel/ntb_hw_gen3.c`
//! `intel_ntb3_mw_set_trans` refuses anything else). Virtual addresses used
//! as IOVAs (`IovaMode::Va`) and physical addresses of hugepages almost never
//! have that alignment, so the backend picks IOVAs itself, from a range the
//! IOMMU accepts, and maps its memory there through the vfio container.
//! Windows live as long as the device, so a bump allocator is enough.

use std::sync::Mutex;

use super::IntelError;

/// Hands out aligned, non-overlapping IOVA ranges from `[start, end)`.
#[derive(Debug)]
pub struct IovaAllocator {
    next: Mutex<u64>,
    end: u64,
}

impl IovaAllocator {
    /// An allocator over `[start, end)`.
    pub fn new(start: u64, end: u64) -> IovaAllocator {
        IovaAllocator {
            next: Mutex::new(start),
            end,
        }
    }

    /// `size` bytes at an address that is a multiple of `align` (a power
    /// of two).
    pub fn alloc(&self, size: usize, align: u64) -> Result<u64, IntelError> {
        debug_assert!(align.is_power_of_two());
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let exhausted = IntelError::IovaExhausted {
            size,
            align,
            left: self.end.saturating_sub(*next),
        };
        let Some(end) = next
            .checked_next_multiple_of(align)
            .and_then(|base| base.checked_add(size as u64))
            .filter(|&end| end <= self.end)
        else {
            return Err(exhausted);
        };
        let base = end - size as u64;
        *next = end;
        Ok(base)
    }

    /// Takes back `size` bytes at `base` if they are the last range handed
    /// out (an allocation whose mapping failed), so a failed map leaks no
    /// address space; any other range stays taken.
    pub fn give_back(&self, base: u64, size: usize) {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        if base.checked_add(size as u64) == Some(*next) {
            *next = base;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_aligned_disjoint_and_bounded() {
        let a = IovaAllocator::new(0x1000, 0x1000_0000);
        let x = a.alloc(0x3000, 1 << 20).unwrap();
        assert_eq!(x, 1 << 20);
        let y = a.alloc(0x10_0000, 1 << 22).unwrap();
        assert_eq!(y, 1 << 22);
        let z = a.alloc(4096, 4096).unwrap();
        assert_eq!(z, (1 << 22) + 0x10_0000);
        let e = a.alloc(0x1000_0000, 1 << 20).unwrap_err();
        assert!(matches!(e, IntelError::IovaExhausted { .. }), "{e}");
        assert!(e.to_string().contains("window_size"), "{e}");
        // A failed allocation takes nothing.
        assert_eq!(a.alloc(4096, 4096).unwrap(), z + 4096);
        // The last range given back is handed out again; an earlier one is
        // not.
        a.give_back(z + 4096, 4096);
        a.give_back(x, 0x3000);
        assert_eq!(a.alloc(4096, 4096).unwrap(), z + 4096);
    }
}
