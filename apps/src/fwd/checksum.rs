//! A 64-bit FNV-1a checksum of a byte stream, computed as it streams.

/// FNV-1a, 64 bits: fast, order-sensitive, good enough to catch a lost,
/// repeated or reordered chunk (not a cryptographic hash).
///
/// ```
/// use ntbdk_apps::fwd::Checksum;
/// let mut a = Checksum::new();
/// a.update(b"hello ");
/// a.update(b"world");
/// let mut b = Checksum::new();
/// b.update(b"hello world");
/// assert_eq!(a.value(), b.value());
/// let mut c = Checksum::new();
/// c.update(b"world hello");
/// assert_ne!(a.value(), c.value());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

impl Checksum {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// The checksum of nothing.
    pub fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    /// The checksum so far.
    pub fn value(&self) -> u64 {
        self.0
    }
}
