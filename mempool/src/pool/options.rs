//! How a pool is shaped: object size and alignment, count, cache size.

/// The shape of a [`Pool`](crate::Pool): `count` objects of `elt_size` bytes,
/// each aligned to `elt_align`, and a per-thread cache of `cache_size`.
///
/// ```
/// use ntbdk_mempool::PoolOptions;
///
/// let o = PoolOptions::new(2048, 4096);
/// assert_eq!((o.elt_align, o.cache_size), (64, 256)); // cache-line aligned
/// assert!(o.track_state); // misuse is caught
/// let lean = PoolOptions { track_state: false, ..o }; // data path: no per-object state
/// let uncached = PoolOptions { cache_size: 0, ..PoolOptions::new(64, 16) };
/// assert_eq!(uncached.cache_size, 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// Bytes of each object (at least 1).
    pub elt_size: usize,
    /// Alignment of each object: a power of two from 1 to 4096; default 64
    /// (a cache line, so no two objects share one).
    pub elt_align: usize,
    /// Number of objects (1 to 2^30).
    pub count: u32,
    /// Objects each thread keeps in its cache in front of the shared ring
    /// (0 disables caching; at most [`Pool::MAX_CACHE`](crate::Pool::MAX_CACHE)).
    /// Default: 256, capped at a quarter of `count` so that one thread
    /// cannot hoard the pool.
    pub cache_size: usize,
    /// Keep a state byte per object (free, raw handle out, owned by an
    /// [`Obj`](crate::Obj)) so that misuse is caught: the checked API
    /// ([`Pool::put_checked`](crate::Pool::put_checked)) rejects a double put
    /// or a handle still owned by an `Obj` with an error, exactly even when
    /// threads race, and debug builds assert on misuse in the unchecked
    /// [`Pool::put`](crate::Pool::put). Default `true`.
    ///
    /// `false` is the lean data-path configuration: gets and puts move
    /// handles with a memcpy and touch no per-object byte (about 3x cheaper
    /// through the cache), misuse is not detected, and the checked API
    /// answers [`PoolError::Untracked`](crate::PoolError::Untracked). Debug
    /// builds create pools with state regardless; a handle
    /// [`attach`](crate::Pool::attach)ed to a pool follows the pool's header,
    /// so a debug build attached to an untracked pool made by a release
    /// build checks nothing.
    pub track_state: bool,
}

impl PoolOptions {
    /// `count` objects of `elt_size` bytes, cache-line aligned, with the
    /// default cache size.
    pub fn new(elt_size: usize, count: u32) -> Self {
        PoolOptions {
            elt_size,
            elt_align: 64,
            count,
            cache_size: (count as usize / 4).min(256),
            track_state: true,
        }
    }
}
