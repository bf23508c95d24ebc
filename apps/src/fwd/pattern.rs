//! What an `ntb-fwd` mbuf carries: a kind and a sequence in its user word,
//! and (for test traffic) payload bytes that follow from the sequence, so a
//! receiver can check both without knowing anything else.

use ntbdk_pmd::mbuf::Mbuf;

/// What an mbuf is (the user word's top byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Test traffic (txonly): the sequence numbers the packets of a queue.
    Data = 1,
    /// The end of a txonly stream: the sequence is how many were sent.
    End = 2,
    /// file-trans: the file's size in the payload.
    FileHeader = 3,
    /// file-trans: a chunk of the file; the sequence is its index.
    FileChunk = 4,
    /// file-trans: the sequence is the chunk count, the payload the
    /// checksum.
    FileTrailer = 5,
    /// file-trans: the receiver's answer; the sequence is 1 when the
    /// checksums matched.
    FileAck = 6,
    /// rxonly's answer to an end marker: the sequence is how many packets
    /// it received, so the sender ends on it rather than waiting for a
    /// peer that leaves only once every queue has ended.
    EndAck = 7,
}

const SEQ_BITS: u32 = 56;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The user word of a `kind` mbuf with sequence `seq`.
///
/// ```
/// use ntbdk_apps::fwd::{Kind, parse_user, user_word};
/// assert_eq!(parse_user(user_word(Kind::End, 42)), (Some(Kind::End), 42));
/// assert_eq!(parse_user(0).0, None);
/// ```
#[inline]
pub fn user_word(kind: Kind, seq: u64) -> u64 {
    (u64::from(kind as u8) << SEQ_BITS) | (seq & SEQ_MASK)
}

/// The kind (`None`: not one of ours) and sequence of a user word.
#[inline]
pub fn parse_user(word: u64) -> (Option<Kind>, u64) {
    let kind = match (word >> SEQ_BITS) as u8 {
        1 => Some(Kind::Data),
        2 => Some(Kind::End),
        3 => Some(Kind::FileHeader),
        4 => Some(Kind::FileChunk),
        5 => Some(Kind::FileTrailer),
        6 => Some(Kind::FileAck),
        7 => Some(Kind::EndAck),
        _ => None,
    };
    (kind, word & SEQ_MASK)
}

/// The seed of test packet `seq` of `len` bytes: both mixed (splitmix64's
/// finaliser), so packets of other sequences or lengths share no word.
#[inline]
fn seed(seq: u64, len: usize) -> u64 {
    let mut z = seq
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((len as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Word `k` of the packet seeded `h`: a step per word, so a packet
/// shifted by any number of bytes does not check (and the loop vectorises).
#[inline(always)]
fn word(h: u64, k: usize) -> [u8; 8] {
    h.wrapping_add((k as u64).wrapping_mul(0x2545_F491_4F6C_DD1D))
        .to_le_bytes()
}

/// Writes test packet `seq`'s bytes (as many as `out` holds) into `out`:
/// words that follow from the sequence and the length together, so no
/// other packet's bytes check, nor this packet shifted or cut short
/// (packets of 8 bytes or more; a shorter one holds only part of a word,
/// and a stale packet of under 8 bytes passes with a chance of 2^-8 per
/// byte).
fn pattern(seq: u64, out: &mut [u8]) {
    let h = seed(seq, out.len());
    let mut words = out.chunks_exact_mut(8);
    let mut k = 0;
    for w in &mut words {
        w.copy_from_slice(&word(h, k));
        k += 1;
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&word(h, k)[..n]);
}

/// Makes `m` (an mbuf of a private pool) test packet `seq` of `size`
/// bytes.
///
/// # Panics
/// If `m` is a received mbuf or `size` exceeds its room (checked by the
/// caller's flags).
pub fn fill(m: &mut Mbuf, seq: u64, size: usize) {
    m.reset(0).expect("no headroom always fits");
    m.set_len(size).expect("-s is checked against --buf-size");
    pattern(seq, m.data_mut().expect("an mbuf of our own pool"));
    m.set_user(user_word(Kind::Data, seq));
}

/// Whether `m`'s bytes are those of test packet `seq` of its length
/// (copied out into `scratch` first: a received mbuf lies in memory the
/// peer can write).
pub fn check(m: &Mbuf, seq: u64, scratch: &mut Vec<u8>) -> bool {
    let len = m.len();
    scratch.resize(len, 0);
    if m.read(0, scratch).is_err() {
        return false;
    }
    let h = seed(seq, len);
    let mut words = scratch.chunks_exact(8);
    let mut k = 0;
    let mut same = true;
    for w in &mut words {
        same &= *w == word(h, k);
        k += 1;
    }
    let tail = words.remainder();
    same && *tail == word(h, k)[..tail.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ntbdk_mempool::ZoneOptions;
    use ntbdk_pmd::mbuf::MbufPool;

    #[test]
    fn a_filled_packet_checks_and_any_changed_byte_or_sequence_fails() {
        let name = format!("fwd-pattern-{}", std::process::id());
        let pool = MbufPool::create(&name, 16, 512, 0, &ZoneOptions::no_huge()).unwrap();
        let mut m = pool.alloc().unwrap();
        fill(&mut m, 7, 300);
        assert_eq!(parse_user(m.user()), (Some(Kind::Data), 7));
        let mut scratch = Vec::new();
        assert!(check(&m, 7, &mut scratch));
        assert!(!check(&m, 8, &mut scratch), "another packet's bytes");
        // Bytes left over from a packet 256 (or 2^32) sequences earlier.
        for earlier in [7 + 256, 7 + (1 << 32)] {
            assert!(!check(&m, earlier, &mut scratch), "packet {earlier}");
        }
        // The same bytes cut short, by a byte or to its first word.
        for cut in [299, 8] {
            m.set_len(cut).unwrap();
            assert!(!check(&m, 7, &mut scratch), "cut to {cut} bytes");
        }
        // Sizes that are no multiple of a word, and under one.
        for size in [1, 3, 8, 13, 61] {
            let mut small = pool.alloc().unwrap();
            fill(&mut small, 9, size);
            assert!(check(&small, 9, &mut scratch), "{size} bytes");
        }
        for at in [0, 1, 255, 256, 299] {
            let mut bad = pool.alloc().unwrap();
            fill(&mut bad, 7, 300);
            bad.data_mut().unwrap()[at] ^= 0x01;
            assert!(!check(&bad, 7, &mut scratch), "byte {at} flipped");
        }
        // The right packet's bytes, displaced by `shift` bytes.
        let mut right = vec![0u8; 300];
        pattern(7, &mut right);
        for shift in [1, 8, 255, 256] {
            let mut moved = pool.alloc().unwrap();
            fill(&mut moved, 7, 300);
            moved.data_mut().unwrap()[shift..].copy_from_slice(&right[..300 - shift]);
            assert!(!check(&moved, 7, &mut scratch), "shifted by {shift}");
        }
    }
}
