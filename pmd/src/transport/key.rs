//! What names a registered region and what it allows: the key (an RDMA
//! lkey/rkey) and the access permissions checked before any byte moves.

/// The key naming a registered region (what RDMA calls an lkey/rkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionKey(pub u32);

/// Permissions of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// The owner may read it (source of a write or send).
    pub const LOCAL_READ: Access = Access(1);
    /// The owner may write it (destination of a read or receive).
    pub const LOCAL_WRITE: Access = Access(2);
    /// Peers may read it (`post_read` from a peer).
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may write it (`post_write` from a peer).
    pub const REMOTE_WRITE: Access = Access(8);
    /// Every permission.
    pub const ALL: Access = Access(15);
    /// Local read and write only.
    pub const LOCAL: Access = Access(3);

    /// Whether every bit of `other` is set in `self`.
    #[inline]
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The permission's name, for errors.
    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            1 => "local read",
            2 => "local write",
            4 => "remote read",
            8 => "remote write",
            _ => "the requested access",
        }
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}
