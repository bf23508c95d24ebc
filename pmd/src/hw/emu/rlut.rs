//! The requester ID look-up table model.
//!
//! On NTB hardware a non-posted read that crosses the bridge needs an R-LUT
//! entry at the target for its whole round trip, so the completion finds its
//! way back; the table is small (32 entries is typical). Posted writes need
//! none. Here each slot keeps a 64-bit map of entries in use and, per entry,
//! the tag of the requester holding it, so the entries of a requester that
//! dies mid-read are freed when its slot is reclaimed.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use super::layout::SlotRegs;

/// The tag that marks an entry as held by `port` in `generation`.
pub(crate) fn tag(port: u16, generation: u64) -> u32 {
    ((port as u32 + 1) << 16) | (generation as u32 & 0xFFFF)
}

/// Takes a free entry of `target` (one of its first `entries`) for `tag`;
/// `None` when all are in use (or the map kept changing under us).
pub(crate) fn take(target: &SlotRegs, entries: usize, tag: u32) -> Option<usize> {
    let valid = if entries >= 64 {
        u64::MAX
    } else {
        (1u64 << entries) - 1
    };
    let mut map = target.rlut_map.load(Relaxed);
    // A bounded number of tries: every member can store to the map, and one
    // storing without pause must not keep a reader here (it is refused).
    for _ in 0..TAKE_TRIES {
        let free = !map & valid;
        if free == 0 {
            return None;
        }
        let bit = free.trailing_zeros() as usize;
        match target
            .rlut_map
            .compare_exchange_weak(map, map | 1 << bit, Acquire, Relaxed)
        {
            Ok(_) => {
                target.rlut_owner[bit].store(tag, Relaxed);
                return Some(bit);
            }
            Err(m) => map = m,
        }
    }
    None
}

/// Compare-and-swap attempts [`take`] makes before it gives up.
const TAKE_TRIES: usize = 64;

/// Gives entry `bit` of `target`, taken for `tag`, back, if `tag` still
/// holds it: a requester whose entries were purged (reclaimed as dead while
/// it stalled) must not free an entry another requester took since.
pub(crate) fn release(target: &SlotRegs, bit: usize, tag: u32) {
    if target.rlut_owner[bit]
        .compare_exchange(tag, 0, AcqRel, Relaxed)
        .is_ok()
    {
        target.rlut_map.fetch_and(!(1u64 << bit), Release);
    }
}

/// Frees every entry of `target` held by `tag` (a dead requester's).
/// Returns how many.
pub(crate) fn purge(target: &SlotRegs, tag: u32) -> usize {
    let mut n = 0;
    let map = target.rlut_map.load(Acquire);
    for bit in 0..64 {
        if map & (1 << bit) != 0
            && target.rlut_owner[bit]
                .compare_exchange(tag, 0, AcqRel, Relaxed)
                .is_ok()
        {
            target.rlut_map.fetch_and(!(1u64 << bit), Release);
            n += 1;
        }
    }
    n
}

/// Entries of `target` in use.
pub(crate) fn in_use(target: &SlotRegs) -> u32 {
    target.rlut_map.load(Relaxed).count_ones()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeroed slot registers (all atomics: every bit pattern is valid).
    fn regs() -> Box<SlotRegs> {
        // SAFETY: `SlotRegs` holds only atomics and arrays of them, for which
        // all-zero bytes are a valid value.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn a_purged_holder_releasing_late_frees_nothing_of_the_next() {
        let r = regs();
        let (dead, next) = (tag(1, 7), tag(2, 9));
        let bit = take(&r, 32, dead).unwrap();
        assert_eq!(purge(&r, dead), 1);
        assert_eq!(take(&r, 32, next), Some(bit), "the freed entry is reused");
        release(&r, bit, dead); // the stalled holder wakes up
        assert_eq!(in_use(&r), 1, "the next holder's entry was freed");
        release(&r, bit, next);
        assert_eq!(in_use(&r), 0);
    }
}
