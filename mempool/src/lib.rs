//! Hugepage memory zones, IOVA and fixed-size object pools: the memory layer
//! every buffer, ring and memory window of ntbdk lives in, in the spirit of
//! DPDK's EAL memory and `rte_mempool`.
//!
//! * [`Zone`]: a named region backed by a `memfd` of 2 MiB or 1 GiB hugepages
//!   (or 4 KiB pages), reserved up front so a shortage is an error rather
//!   than a SIGBUS, locked in memory and shareable with other processes.
//! * [`IovaMode`] and [`Zone::iova`]: the address a device uses for a byte
//!   of a zone (physical, or virtual under an IOMMU).
//! * [`HugepageCounts`]: the kernel's hugepage counters.
//! * [`Pool`]: fixed-size objects carved from a zone, their free list an
//!   ntbdk MPMC ring with a per-thread cache in front of it, usable from
//!   several processes at once (handles are indices, not pointers).
//!
//! Hugepages are reserved by the administrator with
//! `scripts/setup-hugepages.sh --setup N` (or `/proc/sys/vm/nr_hugepages`).
//!
//! # Sharing between processes
//!
//! A zone reaches another process either by passing its descriptor over a
//! Unix socket (`SCM_RIGHTS`: [`Zone::as_fd`] here, [`Zone::attach`] there)
//! or by name, as `/proc/<pid>/fd/<fd>` of its creator
//! ([`Zone::open_from_pid`]); either way the attacher validates it (a sealed
//! ntbdk memfd whose header matches). A pool built in a zone
//! ([`Pool::create_in`]) is then attached there with [`Pool::attach`].
//! Everything kept in shared memory must be plain data: each process maps
//! the zone at its own address, so pointers mean nothing across it; pools
//! hand out indices ([`ObjIdx`]) and byte offsets instead.

mod error;
mod iova;
mod page;
mod pool;
mod sys;
mod zone;

pub use error::MemError;
pub use iova::IovaMode;
pub use page::{HugepageCounts, PageSize};
pub use pool::{Obj, ObjIdx, Pool, PoolError, PoolOptions, PoolStats};
pub use zone::{Zone, ZoneOptions};
