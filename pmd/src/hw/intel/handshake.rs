//! The link-up handshake through scratchpads and one doorbell bit.
//!
//! The hardware link (link-status register) says a cable and a peer NTB are
//! there, not that a peer *driver* is. As in DPDK's raw/ntb driver
//! (`dpdk:drivers/raw/ntb/ntb.c`, `ntb.h` `enum ntb_spad_idx`), each side
//! writes its announcement into the **peer's** scratchpads (posted writes)
//! and rings a doorbell, and reads only its **own** scratchpads: no
//! non-posted read crosses the link. The layout is ntbdk's own:
//!
//! | spad | content |
//! | --- | --- |
//! | 0 | reserved (DPDK reserves it too) |
//! | 1 | magic: `HELLO` or `BYE`, written last |
//! | 2, 3 | the sender's generation (low, high) |
//! | 4, 5 | the generation of ours the sender has seen (low, high; 0 = none) |
//! | 6, 7 | the sender's inbound window 0 / 1 size in 4 KiB pages |
//! | 8 | heartbeat count (written on its own) |
//! | 9 | checksum of spads 1..=7 (torn announcements are ignored) |
//! | 10..=15 | left to applications (user scratchpads 0..=5) |
//!
//! A generation is a random nonzero 64-bit number drawn when the device
//! opens: a restarted peer announces a new one and is a new incarnation
//! (link down, then up with the new generation). A side that sees an
//! announcement not acknowledging its own generation answers with its own,
//! so both sides learn each other in at most two announcements whoever
//! starts first. Closing announces `BYE`, and so does a side that declares
//! its peer gone by its heartbeat (the peer, if it only paused, then sees
//! the link down too).

use super::regs::SPAD_COUNT;

/// The doorbell bit that says "read your scratchpads": 28. Bits 0..=27
/// are the user's; 29 and 30 are left unused and 31 is avoided because
/// Skylake's link interrupt is remapped onto vector 31
/// (`NTB_HWERR_MSIX_VECTOR32_BAD`, `linux:drivers/ntb/hw/intel/ntb_hw_gen3.c`).
pub const DB_CTRL: u64 = 1 << 28;
/// The doorbell bits offered to users ([`NtbDevice::db_valid_mask`](crate::hw::NtbDevice::db_valid_mask)).
pub const DB_USER_MASK: u64 = (1 << 28) - 1;

/// Scratchpad of the magic word.
pub const SPAD_MAGIC: usize = 1;
/// Scratchpad of the heartbeat count.
pub const SPAD_HEARTBEAT: usize = 8;
/// Scratchpad of the checksum.
pub const SPAD_CHECK: usize = 9;
/// Scratchpads applications may use freely: the six the handshake leaves
/// (user scratchpad `i` is register `10 + i`). `ntb-perf`'s control
/// channel uses the last as each side's role register, 0..=3 on a server
/// for commands, and two per server on a client for answers.
pub const SPAD_USER: [usize; 6] = [10, 11, 12, 13, 14, 15];
const _: () = assert!(SPAD_USER[0] > SPAD_CHECK && SPAD_USER[5] < SPAD_COUNT);

/// The hello of this scratchpad layout (user scratchpads 10..=15).
const MAGIC_HELLO: u32 = 0x4E54_4B32; // "NTK2"
/// The hello of the first layout (user scratchpads 14 and 15 only), which
/// this one cannot talk to: an application's control channel would land in
/// the other side's handshake registers.
const MAGIC_HELLO_V1: u32 = 0x4E54_4B48; // "NTKH"
const MAGIC_BYE: u32 = 0x4E54_4B42; // "NTKB"

/// What an announcement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The sender is up.
    Hello,
    /// The sender is going away.
    Bye,
}

/// One announcement, as carried in scratchpads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement {
    /// Hello or bye.
    pub kind: Kind,
    /// The sender's generation (nonzero).
    pub generation: u64,
    /// Our generation as the sender last saw it (0 = not yet).
    pub ack: u64,
    /// The sender's inbound window sizes in 4 KiB pages (0 = not backed).
    pub inbound_pages: [u32; 2],
}

fn checksum(words: &[u32]) -> u32 {
    // FNV-1a over the words.
    words
        .iter()
        .fold(0x811C_9DC5u32, |h, &w| (h ^ w).wrapping_mul(0x0100_0193))
}

impl Announcement {
    /// The scratchpad writes, in the order to make them: fields, checksum,
    /// and the magic word last.
    pub fn writes(&self) -> [(usize, u32); 8] {
        let magic = match self.kind {
            Kind::Hello => MAGIC_HELLO,
            Kind::Bye => MAGIC_BYE,
        };
        let w = [
            magic,
            self.generation as u32,
            (self.generation >> 32) as u32,
            self.ack as u32,
            (self.ack >> 32) as u32,
            self.inbound_pages[0],
            self.inbound_pages[1],
        ];
        [
            (2, w[1]),
            (3, w[2]),
            (4, w[3]),
            (5, w[4]),
            (6, w[5]),
            (7, w[6]),
            (SPAD_CHECK, checksum(&w)),
            (SPAD_MAGIC, magic),
        ]
    }

    /// Whether `spads` hold a hello of the first scratchpad layout: a peer
    /// running an older ntbdk, which is not brought up (say so).
    pub fn is_older_layout(spads: &[u32; SPAD_COUNT]) -> bool {
        spads[SPAD_MAGIC] == MAGIC_HELLO_V1
    }

    /// Decodes our scratchpads `spads` (all 16); `None` when they hold no
    /// complete, consistent announcement (or one of an older layout).
    pub fn decode(spads: &[u32; SPAD_COUNT]) -> Option<Announcement> {
        let kind = match spads[SPAD_MAGIC] {
            MAGIC_HELLO => Kind::Hello,
            MAGIC_BYE => Kind::Bye,
            _ => return None,
        };
        if checksum(&spads[1..=7]) != spads[SPAD_CHECK] {
            return None;
        }
        let generation = u64::from(spads[2]) | (u64::from(spads[3]) << 32);
        if generation == 0 {
            return None;
        }
        Some(Announcement {
            kind,
            generation,
            ack: u64::from(spads[4]) | (u64::from(spads[5]) << 32),
            inbound_pages: [spads[6], spads[7]],
        })
    }
}

/// A fresh random nonzero generation.
pub fn new_generation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `a`'s scratchpad writes into `spads`.
    fn write(spads: &mut [u32; SPAD_COUNT], a: &Announcement) {
        for (i, v) in a.writes() {
            spads[i] = v;
        }
    }

    #[test]
    fn announcements_round_trip_and_torn_ones_are_ignored() {
        let a = Announcement {
            kind: Kind::Hello,
            generation: 0x1234_5678_9abc_def0,
            ack: 7,
            inbound_pages: [256, 0],
        };
        let mut spads = [0u32; SPAD_COUNT];
        assert_eq!(Announcement::decode(&spads), None);
        assert_eq!(a.writes().last().unwrap().0, SPAD_MAGIC, "magic last");
        write(&mut spads, &a);
        assert_eq!(Announcement::decode(&spads), Some(a));
        // A newer announcement half written over it: rejected.
        let b = Announcement {
            generation: 99,
            ..a
        };
        spads[2] = b.writes()[0].1;
        assert_eq!(Announcement::decode(&spads), None);
        write(&mut spads, &b);
        assert_eq!(Announcement::decode(&spads), Some(b));
        let bye = Announcement {
            kind: Kind::Bye,
            ..b
        };
        write(&mut spads, &bye);
        assert_eq!(Announcement::decode(&spads).unwrap().kind, Kind::Bye);
        const { assert!(DB_CTRL & DB_USER_MASK == 0 && DB_CTRL < 1 << 31) };
        assert_ne!(new_generation(), 0);
    }

    #[test]
    fn a_hello_of_the_first_layout_is_recognised_and_not_taken() {
        let a = Announcement {
            kind: Kind::Hello,
            generation: 7,
            ack: 0,
            inbound_pages: [1, 1],
        };
        let mut spads = [0u32; SPAD_COUNT];
        write(&mut spads, &a);
        assert!(!Announcement::is_older_layout(&spads));
        // The same announcement as the first layout wrote it.
        spads[SPAD_MAGIC] = MAGIC_HELLO_V1;
        let mut w = [0u32; 7];
        w.copy_from_slice(&spads[1..=7]);
        spads[SPAD_CHECK] = checksum(&w);
        assert_eq!(Announcement::decode(&spads), None);
        assert!(Announcement::is_older_layout(&spads));
    }
}
