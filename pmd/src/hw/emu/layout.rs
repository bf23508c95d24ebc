//! The control segment's binary layout: a header, then one register block per
//! slot. Everything in it is an atomic, so any process may hold shared
//! references into the mapping; every field has a fixed offset (`#[repr(C)]`)
//! and blocks are cache-line aligned so slots do not false-share.
//!
//! ```text
//! offset 0            Header            (4096 bytes, magic written last)
//! offset 4096         SlotRegs[0]       (SLOT_LEN bytes each)
//! ...                 SlotRegs[S-1]
//! ```
//!
//! A slot's state, owner pid and generation share one 64-bit word
//! ([`SlotWord`]), so claiming, releasing and reclaiming are single
//! compare-and-swaps that cannot be confused by an intervening re-join
//! (the generation is part of what is compared).

use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::hw::grant_table::GrantTable;

/// "NTBDKFAB", little endian.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"NTBDKFAB");
/// Bumped on every incompatible change of this layout.
pub(crate) const VERSION: u32 = 5;
/// Most ranges in a slot's published grant.
pub(crate) const MAX_GRANT: usize = 8;
/// Bytes reserved for the header (one page).
pub(crate) const HEADER_LEN: usize = 4096;
/// Scratchpads reserved per slot; a fabric uses the first `spads` of them.
pub(crate) const MAX_SPADS: usize = 64;
/// R-LUT entries reserved per slot (one bit of a 64-bit map each).
pub(crate) const MAX_RLUT: usize = 64;
/// Bytes of one slot's register block.
pub(crate) const SLOT_LEN: usize = std::mem::size_of::<SlotRegs>();
/// [`Header::magic`] while one host initialises a region that others may
/// attach to at the same moment (the region is claimed by a CAS 0 → this).
pub(crate) const MAGIC_INIT: u64 = u64::from_le_bytes(*b"NTBDKINI");
/// Alignment of the windows in a region that holds them (see
/// [`windows_offset`]).
pub(crate) const WINDOW_ALIGN: usize = 4096;

/// Total bytes of the control area of a fabric with `slots` slots.
pub(crate) const fn control_len(slots: usize) -> usize {
    HEADER_LEN + slots * SLOT_LEN
}

/// Where the windows start in a region that holds the control area and the
/// windows (an ivshmem BAR): right after the control area, page aligned.
///
/// ```text
/// 0                          control area (header, slot blocks)
/// windows_offset(S)          window of slot 0   (window_size bytes)
/// + window_size              window of slot 1
/// ...                        window of slot S-1
/// ```
pub(crate) const fn windows_offset(slots: usize) -> usize {
    control_len(slots).next_multiple_of(WINDOW_ALIGN)
}

/// Bytes a region needs to hold the control area and `slots` windows of
/// `window_size` bytes.
pub(crate) fn region_len(slots: usize, window_size: usize) -> Option<usize> {
    slots
        .checked_mul(window_size)?
        .checked_add(windows_offset(slots))
}

/// Where slot 0's window starts in a region that holds the control area
/// and the windows (an ivshmem BAR2) of a fabric of `slots` slots; slot
/// `i`'s starts `i * window_size` further.
pub fn windows_start(slots: usize) -> usize {
    windows_offset(slots)
}

/// The fabric header. Written by the creator before [`Header::magic`].
#[repr(C, align(64))]
pub(crate) struct Header {
    /// [`MAGIC`] once the segment is fully initialised (release store, last).
    pub magic: AtomicU64,
    /// [`VERSION`] of the creator.
    pub version: AtomicU32,
    /// [`HEADER_LEN`] of the creator.
    pub header_len: AtomicU32,
    /// [`SLOT_LEN`] of the creator.
    pub slot_len: AtomicU32,
    /// Number of slots.
    pub slots: AtomicU32,
    /// Bytes of each slot's inbound window.
    pub window_size: AtomicU64,
    /// Scratchpads per slot.
    pub spads: AtomicU32,
    /// Doorbell bits per slot.
    pub db_bits: AtomicU32,
    /// R-LUT entries per slot.
    pub rlut_entries: AtomicU32,
    /// Pid of the creator (informational).
    pub creator_pid: AtomicU32,
    /// Heartbeat timeout in nanoseconds.
    pub heartbeat_timeout_ns: AtomicU64,
    /// Emulated round trip of a non-posted read, in nanoseconds.
    pub read_latency_ns: AtomicU64,
    /// Creation time, seconds since the Unix epoch (informational).
    pub created_unix: AtomicU64,
    /// CLOCK_MONOTONIC time of the last dead-slot scan: whoever advances it
    /// with a CAS does the scan, so the fabric is scanned a few times per
    /// timeout however many devices are attached.
    pub last_scan_ns: AtomicU64,
}

/// The registers of one slot.
#[repr(C, align(64))]
pub(crate) struct SlotRegs {
    /// The packed [`SlotWord`]: state, generation, owner pid.
    pub word: AtomicU64,
    /// The owner's start time (clock ticks since boot, `/proc/<pid>/stat`
    /// field 22), to tell a reused pid from the owner.
    pub owner_start: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds of the owner's last heartbeat.
    pub heartbeat_ns: AtomicU64,
    /// Heartbeats since the claim.
    pub heartbeat_count: AtomicU64,
    /// Pid that holds the window memfd open (the owner).
    pub win_pid: AtomicU32,
    /// The window memfd's descriptor number in `win_pid`.
    pub win_fd: AtomicU32,
    /// Bytes backing the window (>= the fabric's window size).
    pub win_len: AtomicU64,
    /// Page size backing the window.
    pub win_page: AtomicU64,
    /// Recorded inbound translation: bus address.
    pub xlat_iova: AtomicU64,
    /// Recorded inbound translation: size (0 = none).
    pub xlat_size: AtomicU64,
    /// Doorbell bits (peers set them with fetch_or).
    pub db: AtomicU64,
    /// Doorbell mask.
    pub db_mask: AtomicU64,
    /// R-LUT entries in use at this (target) port: one bit per entry.
    pub rlut_map: AtomicU64,
    /// Non-posted reads refused at this target for want of an entry.
    pub rlut_refusals: AtomicU64,
    /// Doorbell rings received (each peer's ring adds one; tools'
    /// `ntb-tool status --watch` rates).
    pub db_rings: AtomicU64,
    /// Owner's counters, mirrored by its heartbeat: posted writes, posted
    /// bytes, non-posted reads, non-posted bytes, R-LUT refusals, writes
    /// refused outside a grant.
    pub counters: [AtomicU64; 6],
    /// What each peer may write in this slot's window (see
    /// `hw::PeerGrant`), published by the owner under a sequence lock: the
    /// low 32 bits count the ranges below (0 = nothing published: the
    /// whole window), the high 32 bits are a sequence number the owner
    /// makes odd while it rewrites the ranges and even again after, so a
    /// reader that sees the same even word before and after its copy has a
    /// whole template.
    pub grant_count: AtomicU64,
    /// Grant ranges, `[kind, base, stride, len]` each: kind 1 = per port
    /// (`base + port * stride .. + len`), kind 2 = shared (`base .. + len`).
    pub grant: [[AtomicU64; 4]; MAX_GRANT],
    /// Who holds each R-LUT entry: requester tag (see `rlut`), 0 = none.
    pub rlut_owner: [AtomicU32; MAX_RLUT],
    /// Scratchpad registers.
    pub spads: [AtomicU32; MAX_SPADS],
    /// The live part of the grant: ranges of this slot's window (regions
    /// the owner registered) each peer, or every peer, may write beyond
    /// the template above; the owner edits it, writers consult it.
    pub grants: GrantTable,
}

/// A slot's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Nobody owns it.
    Free,
    /// Claimed; the owner is still setting up its window.
    Claimed,
    /// The owner's window is published: the link is up.
    Up,
}

impl std::fmt::Display for SlotState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlotState::Free => "free",
            SlotState::Claimed => "claimed",
            SlotState::Up => "up",
        })
    }
}

const GEN_BITS: u32 = 30;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;

/// The packed slot word: `state:2 | generation:30 | pid:32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotWord {
    pub state: SlotState,
    pub generation: u64,
    pub pid: u32,
}

impl SlotWord {
    pub fn unpack(w: u64) -> SlotWord {
        let state = match w >> 62 {
            0 => SlotState::Free,
            1 => SlotState::Claimed,
            _ => SlotState::Up,
        };
        SlotWord {
            state,
            generation: (w >> 32) & GEN_MASK,
            pid: w as u32,
        }
    }

    pub fn pack(self) -> u64 {
        let s: u64 = match self.state {
            SlotState::Free => 0,
            SlotState::Claimed => 1,
            SlotState::Up => 2,
        };
        (s << 62) | ((self.generation & GEN_MASK) << 32) | self.pid as u64
    }

    /// The generation after `g` (never 0, which means "never claimed").
    pub fn next_generation(g: u64) -> u64 {
        let n = (g + 1) & GEN_MASK;
        if n == 0 { 1 } else { n }
    }
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_LEN);
const _: () = assert!(SLOT_LEN.is_multiple_of(64));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_round_trips() {
        for state in [SlotState::Free, SlotState::Claimed, SlotState::Up] {
            for generation in [0, 1, GEN_MASK] {
                for pid in [0, 1, u32::MAX] {
                    let w = SlotWord {
                        state,
                        generation,
                        pid,
                    };
                    assert_eq!(SlotWord::unpack(w.pack()), w);
                }
            }
        }
        assert_eq!(SlotWord::next_generation(GEN_MASK), 1);
        assert_eq!(SlotWord::next_generation(0), 1);
    }
}
