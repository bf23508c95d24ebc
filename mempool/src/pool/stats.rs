//! A snapshot of a pool's occupancy and counters.

/// Occupancy and counters of a [`Pool`](crate::Pool) handle, from
/// [`Pool::stats`](crate::Pool::stats).
///
/// Occupancy is read without stopping other threads, so under load the
/// numbers are a close snapshot, not an exact one. Counters cover this handle
/// (and its clones) in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Objects in the pool.
    pub size: usize,
    /// Free objects: `in_ring + in_caches`.
    pub available: usize,
    /// `size - available`: taken, or held by other processes' caches.
    pub in_use: usize,
    /// Free objects in the shared ring.
    pub in_ring: usize,
    /// Free objects in this handle's thread caches.
    pub in_caches: usize,
    /// Gets and puts served by a thread cache alone.
    pub cache_hits: u64,
    /// Gets and puts that had to refill from or flush to the shared ring.
    pub cache_misses: u64,
    /// Gets that failed because the pool was exhausted.
    pub get_failures: u64,
}
