//! Pools of mbufs the application creates (DPDK's
//! `rte_pktmbuf_pool_create`).

use ntbdk_mempool::{ObjIdx, Pool, PoolError, PoolOptions, ZoneOptions};

use super::{Adding, Mbuf, PoolRef};

/// A pool of mbufs of one data room, created by the application (DPDK's
/// `rte_pktmbuf_pool_create`). Clones share the pool; it lives until the
/// last clone and the last of its mbufs are gone.
#[derive(Clone)]
pub struct MbufPool {
    pool: PoolRef,
}

impl std::fmt::Debug for MbufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.pool().fmt(f)
    }
}

impl MbufPool {
    /// Creates a pool of `count` mbufs of `data_room` bytes each, with a
    /// per-thread cache of `cache` mbufs, backed as `zone` says (2 MiB
    /// hugepages, or a fallback to 4 KiB pages).
    ///
    /// # Errors
    /// [`PoolError`] for an impossible shape or memory that cannot be had.
    pub fn create(
        name: &str,
        count: u32,
        data_room: usize,
        cache: usize,
        zone: &ZoneOptions,
    ) -> Result<MbufPool, PoolError> {
        let opts = PoolOptions {
            cache_size: cache,
            ..PoolOptions::new(data_room, count)
        };
        Ok(MbufPool {
            pool: PoolRef::new(Pool::create(name, &opts, zone)?),
        })
    }

    /// Takes one mbuf (empty, data offset 0).
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when none is free.
    pub fn alloc(&self) -> Result<Mbuf, PoolError> {
        let h = self.pool().get_raw()?;
        let mut adding = Adding::reserve(&self.pool, 1);
        // SAFETY: `h` was just taken from this private pool and is ours.
        Ok(unsafe { Mbuf::from_pool(&self.pool, &mut adding, h, 0, (0, 0)) })
    }

    /// Takes `n` mbufs into `out`, all or nothing (DPDK's
    /// `rte_pktmbuf_alloc_bulk`).
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when fewer than `n` are free; `out` is then
    /// unchanged.
    pub fn alloc_bulk(&self, n: usize, out: &mut Vec<Mbuf>) -> Result<(), PoolError> {
        const CHUNK: usize = 64;
        let mut hs = [ObjIdx::default(); CHUNK];
        let start = out.len();
        let mut left = n;
        while left > 0 {
            let k = left.min(CHUNK);
            if let Err(e) = self.pool().get_bulk(&mut hs[..k]) {
                let taken = out.len() - start;
                out.truncate(start); // the mbufs taken so far go back on drop
                // Say what the caller asked for, and count what this call
                // held, which it has just given back.
                return Err(match e {
                    PoolError::Exhausted {
                        pool, available, ..
                    } => PoolError::Exhausted {
                        pool,
                        requested: n,
                        available: available + taken,
                    },
                    other => other,
                });
            }
            let mut adding = Adding::reserve(&self.pool, k);
            out.reserve(k);
            let at = out.len();
            // Written in place: an mbuf built on the stack and then copied
            // into the vector is read back wider than its fields were
            // written, which stalls store forwarding for every mbuf.
            for (slot, &h) in out.spare_capacity_mut().iter_mut().zip(&hs[..k]) {
                // SAFETY: `h` was just taken from this private pool.
                slot.write(unsafe { Mbuf::from_pool(&self.pool, &mut adding, h, 0, (0, 0)) });
            }
            // SAFETY: the `k` slots after `at` were just initialised (the
            // reserve made room for them, and `hs[..k]` has `k` handles).
            unsafe { out.set_len(at + k) };
            left -= k;
        }
        Ok(())
    }

    /// Bytes of data room per mbuf.
    pub fn data_room(&self) -> usize {
        self.pool().elt_size()
    }

    /// Mbufs in the pool.
    pub fn size(&self) -> usize {
        self.pool().size()
    }

    /// Mbufs free (in the pool's ring and this process's caches).
    pub fn available(&self) -> usize {
        self.pool().available()
    }

    /// Returns the calling thread's cached mbufs to the pool's ring, as
    /// [`Pool::flush_cache`]: a scoped thread whose mbufs must be counted in
    /// [`available`](Self::available) when the scope ends calls this last
    /// (its cache is otherwise returned only as the thread's locals are
    /// destroyed, which the scope does not wait for).
    pub fn flush_cache(&self) {
        self.pool().flush_cache();
    }

    /// The pool under the mbufs (crate-private: returning its objects by
    /// hand would free what a live mbuf owns).
    pub(crate) fn pool(&self) -> &Pool {
        self.pool.pool()
    }
}
