//! Sizes as people type and read them: byte counts with `K`/`M`/`G`
//! suffixes ([`parse_bytes`], and [`parse_size`] for message sizes), the
//! `-a` sweep (every power of two from 2 B to 8 MiB, as perftest's `-a`)
//! and labels (`4 KiB`, [`size_label`]). The one home of size parsing for
//! every app, and of durations given in seconds ([`secs`]).

use std::fmt;
use std::time::Duration;

/// Largest message size `-a` sweeps to (and `-s` accepts): 8 MiB.
pub const MAX_SIZE: u64 = 8 << 20;
/// Smallest message size `-a` sweeps from.
pub const MIN_SWEEP_SIZE: u64 = 2;

/// A duration flag's value (`--timeout 2.5`), checked: above 0 and at most
/// a day, so that adding it to a clock cannot overflow.
///
/// ```
/// use ntbdk_apps::cli::units::secs;
/// assert_eq!(secs(2.5, "--timeout").unwrap().as_millis(), 2500);
/// for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e20] {
///     assert!(secs(bad, "--timeout").is_err());
/// }
/// ```
pub fn secs(v: f64, flag: &str) -> anyhow::Result<Duration> {
    if !(v > 0.0 && v.is_finite() && v <= 86_400.0) {
        anyhow::bail!("{flag} must be a positive number of seconds (at most a day), not {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// Why a `-s` value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// Parses a byte count: a number (decimal, or `0x` hex, `_` allowed) with
/// an optional binary suffix `K`, `M` or `G` (case-insensitive; `KB`,
/// `KiB`… accepted too, all powers of 1024).
///
/// ```
/// use ntbdk_apps::cli::units::parse_bytes;
/// assert_eq!(parse_bytes("16M"), Ok(16 << 20));
/// assert_eq!(parse_bytes("0x1000"), Ok(4096));
/// assert_eq!(parse_bytes("2KiB"), Ok(2048));
/// assert!(parse_bytes("3X").is_err());
/// ```
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let t = text.trim().replace('_', "");
    let bad = |why: &str| SizeError(format!("bad size {text:?}: {why}"));
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).map_err(|_| bad("not a hex number"));
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(bad(&format!(
                "unknown size unit {:?}: give bytes, optionally with K, M or G \
                 (e.g. 64, 4K, 1M)",
                unit.trim()
            )));
        }
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| bad("give bytes, optionally with K, M or G (e.g. 64, 4K, 1M)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| bad("too large"))
}

/// Parses a message size ([`parse_bytes`]) from 1 byte to [`MAX_SIZE`].
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
    let range = || {
        SizeError(format!(
            "bad size {text:?}: give bytes, optionally with K, M or G (e.g. 64, 4K, 1M), \
             from 1 to {MAX_SIZE} (8M)"
        ))
    };
    match parse_bytes(text) {
        Ok(b) if (1..=MAX_SIZE).contains(&b) => Ok(b),
        _ => Err(range()),
    }
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

/// `64 B`, `4 KiB`, `1 MiB`, `2 GiB`: a size for messages and progress
/// lines.
pub fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
