//! Message sizes: parsing `-s` values (`64`, `4K`, `1M`, `8M`…) and the `-a`
//! sweep (every power of two from 2 B to 8 MiB, as perftest's `-a`).

use std::fmt;

/// Largest message size `-a` sweeps to (and `-s` accepts): 8 MiB.
pub const MAX_SIZE: u64 = 8 << 20;
/// Smallest message size `-a` sweeps from.
pub const MIN_SWEEP_SIZE: u64 = 2;

/// Why a `-s` value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// Parses a message size: a number of bytes with an optional binary suffix
/// `K`, `M` or `G` (case-insensitive, an optional trailing `B` or `iB`),
/// from 1 byte to [`MAX_SIZE`].
///
/// ```
/// use ntbdk_apps::perf::parse_size;
/// assert_eq!(parse_size("64"), Ok(64));
/// assert_eq!(parse_size("4K"), Ok(4096));
/// assert_eq!(parse_size("1MiB"), Ok(1 << 20));
/// assert!(parse_size("0").is_err());
/// assert!(parse_size("9M").is_err());
/// assert!(parse_size("lots").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match body.as_bytes().last() {
        Some(b'k') => (&body[..body.len() - 1], 1u64 << 10),
        Some(b'm') => (&body[..body.len() - 1], 1 << 20),
        Some(b'g') => (&body[..body.len() - 1], 1 << 30),
        _ => (body, 1),
    };
    let bad = || {
        SizeError(format!(
            "bad size {text:?}: give bytes, optionally with K, M or G (e.g. 64, 4K, 1M), \
             from 1 to {} (8M)",
            MAX_SIZE
        ))
    };
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(mult).ok_or_else(bad)?;
    if bytes == 0 || bytes > MAX_SIZE {
        return Err(bad());
    }
    Ok(bytes)
}

/// The sizes of an `-a` sweep up to `max` bytes: 2, 4, 8, … (powers of two
/// from [`MIN_SWEEP_SIZE`]), at most `max`.
///
/// ```
/// use ntbdk_apps::perf::sweep_sizes;
/// assert_eq!(sweep_sizes(16), vec![2, 4, 8, 16]);
/// assert_eq!(sweep_sizes(8 << 20).len(), 23);
/// ```
pub fn sweep_sizes(max: u64) -> Vec<u64> {
    std::iter::successors(Some(MIN_SWEEP_SIZE), |s| s.checked_mul(2))
        .take_while(|&s| s <= max)
        .collect()
}

/// `64 B`, `4 KiB`, `1 MiB`: a size for messages and progress lines.
pub fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
