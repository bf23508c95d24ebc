//! The errors of object pools.

use ntbdk_ring::RingError;

use super::handle::ObjIdx;
use crate::error::MemError;

/// Why a pool operation failed.
///
/// Every message says what failed, why, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Fewer free objects than asked for; nothing was taken.
    #[error(
        "pool {pool:?} exhausted: asked for {requested} objects, {available} free in the \
         shared ring and this thread's cache (the rest are in use or in other threads' \
         caches): make the pool larger, its caches smaller, or return objects sooner"
    )]
    Exhausted {
        /// The pool's name.
        pool: String,
        /// Objects asked for.
        requested: usize,
        /// Objects this thread could reach when it tried.
        available: usize,
    },

    /// The pool options are unusable.
    #[error("invalid pool options: {0}")]
    InvalidOptions(String),

    /// The handle does not belong to this pool (another pool's handle, or a
    /// made-up one).
    #[error("handle {handle} does not belong to pool {pool:?} (tag {tag:#010x}, {count} objects)")]
    ForeignHandle {
        /// The handle given.
        handle: ObjIdx,
        /// The pool's name.
        pool: String,
        /// The pool's tag.
        tag: u32,
        /// The pool's object count.
        count: u32,
    },

    /// The object is not in use: it was already returned (a double put).
    #[error("object {index} of pool {pool:?} is not in use: it was already returned (double put)")]
    NotInUse {
        /// Index of the object.
        index: u32,
        /// The pool's name.
        pool: String,
    },

    /// The object is owned by a live [`Obj`](crate::Obj), which returns it
    /// when dropped.
    #[error(
        "object {index} of pool {pool:?} is owned by a live Obj, which returns it when \
         dropped (take it over with Obj::into_handle first)"
    )]
    OwnedByObj {
        /// Index of the object.
        index: u32,
        /// The pool's name.
        pool: String,
    },

    /// The checked API needs per-object state, which this pool does not keep.
    #[error(
        "pool {pool:?} does not track object state (created with track_state = false), \
         so it cannot check handles: create it with PoolOptions::track_state = true"
    )]
    Untracked {
        /// The pool's name.
        pool: String,
    },

    /// A byte offset does not name the start of an object of this pool.
    #[error("offset {offset:#x} is not the start of an object of pool {pool:?}")]
    BadOffset {
        /// The offset given (from the start of the zone).
        offset: usize,
        /// The pool's name.
        pool: String,
    },

    /// The zone region handed to the pool is too small or misplaced.
    #[error(
        "pool region at zone offset {offset:#x} needs {need} bytes, the zone has {have} \
         after it: size the zone with Pool::bytes_for"
    )]
    ZoneTooSmall {
        /// Offset of the pool in the zone.
        offset: usize,
        /// Bytes the pool needs.
        need: usize,
        /// Bytes the zone has from `offset` on.
        have: usize,
    },

    /// The region attached holds no valid pool.
    #[error("not a valid ntbdk pool at zone offset {offset:#x}: {why}")]
    BadPool {
        /// Offset of the region in the zone.
        offset: usize,
        /// What the validation found.
        why: String,
    },

    /// What a pool over external memory cannot do.
    #[error(
        "pool {pool:?} holds objects in memory it does not own (created over it): {what} is not available"
    )]
    External {
        /// The pool's name.
        pool: String,
        /// The refused call.
        what: String,
    },

    /// The zone could not be created.
    #[error(transparent)]
    Zone(#[from] MemError),

    /// The free-list ring could not be constructed or attached.
    #[error("pool free list: {0}")]
    Ring(#[from] RingError),
}
