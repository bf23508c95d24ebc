//! Byte moves into windows: short ones inline, longer ones through
//! `memmove`.
//!
//! A data-queue message of 64 bytes is one `memmove` call per message, and
//! at 20 M/s the call and its size dispatch are a visible part of the
//! sender's time. Up to 64 bytes, [`move_bytes`] loads the whole span first
//! (two possibly overlapping loads of the widest size that fits, as `memmove`
//! implementations do for short spans) and then stores it, so it keeps
//! `memmove`'s meaning even when source and destination overlap (a loopback
//! fabric maps one memory as both windows).

use core::ptr;

/// Spans up to this many bytes are moved inline.
pub(crate) const INLINE_MAX: usize = 64;

/// Moves `len` bytes from `src` to `dst`, as `ptr::copy` (the two may
/// overlap).
///
/// # Safety
/// `src .. src + len` is valid for reads and `dst .. dst + len` for writes.
#[inline(always)]
pub(crate) unsafe fn move_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // In every arm each load reads inside `src .. src + len` and each store
    // writes inside `dst .. dst + len` (a pair's second span ends at `len`).
    // SAFETY: as just said, with unaligned accesses of plain-data arrays,
    // all loads before any store; the spans are valid (the caller's promise).
    unsafe {
        match len {
            33..=INLINE_MAX => pair::<32>(src, dst, len),
            17..=32 => pair::<16>(src, dst, len),
            8..=16 => pair::<8>(src, dst, len),
            4..=7 => pair::<4>(src, dst, len),
            0..=3 => {
                let bytes: [u8; 3] =
                    core::array::from_fn(|i| if i < len { src.add(i).read() } else { 0 });
                for (i, b) in bytes.iter().enumerate().take(len) {
                    dst.add(i).write(*b);
                }
            }
            _ => ptr::copy(src, dst, len),
        }
    }
}

/// Moves `len` bytes (`W <= len <= 2 * W`) as two `W`-byte spans, the first
/// at 0 and the second ending at `len`, both loaded before either is
/// stored.
///
/// # Safety
/// As [`move_bytes`], with `W <= len <= 2 * W`.
#[inline(always)]
unsafe fn pair<const W: usize>(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!((W..=2 * W).contains(&len));
    // SAFETY: `0 .. W` and `len - W .. len` lie inside both spans (the
    // caller's promise and `W <= len`); `[u8; W]` has alignment 1.
    unsafe {
        let head = src.cast::<[u8; W]>().read_unaligned();
        let tail = src.add(len - W).cast::<[u8; W]>().read_unaligned();
        dst.cast::<[u8; W]>().write_unaligned(head);
        dst.add(len - W).cast::<[u8; W]>().write_unaligned(tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length up to twice the inline limit, at every offset of a
    /// shared buffer in both directions (overlapping moves included),
    /// against `ptr::copy`.
    #[test]
    fn moves_like_memmove_at_every_length_and_overlap() {
        let n = 3 * INLINE_MAX;
        let orig: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..=2 * INLINE_MAX {
            for (from, to) in [(0, 0), (0, 1), (1, 0), (0, 9), (9, 0), (3, 40), (40, 3)] {
                if from + len > n || to + len > n {
                    continue;
                }
                let mut want = orig.clone();
                let mut got = orig.clone();
                // SAFETY: both spans lie inside the vectors (checked above).
                unsafe {
                    ptr::copy(want.as_ptr().add(from), want.as_mut_ptr().add(to), len);
                    let p = got.as_mut_ptr();
                    move_bytes(p.add(from), p.add(to), len);
                }
                assert_eq!(got, want, "len {len}, from {from} to {to}");
            }
        }
    }
}
