//! A fast hasher for the ids we hand out ourselves (operation ids, region
//! keys). Tables keyed by ids a peer chooses keep the standard, keyed hasher.

use std::hash::{BuildHasherDefault, Hasher};

/// Mixes integer keys with a multiply-xorshift; not for peer-chosen keys.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let z = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z ^ (z >> 32)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ u64::from(b);
        }
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.0 ^= u64::from(i);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 ^= i;
    }
}

/// A `HashMap` keyed by our own ids.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;
