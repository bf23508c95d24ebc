//! Hugepage memory zones, IOVA and fixed-size object pools.
