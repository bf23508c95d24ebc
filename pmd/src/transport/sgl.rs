//! Scatter/gather lists: local work-request SGEs and the walk that pairs a
//! source list of window extents with a destination list, piece by piece.

use super::key::RegionKey;

/// One local scatter/gather element: `len` bytes at `offset` of a
/// registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// The region.
    pub key: RegionKey,
    /// Offset in the region.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// A remote address: an offset in a peer's registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    /// The peer's region key (its rkey).
    pub key: RegionKey,
    /// Offset in that region.
    pub offset: u64,
}

/// A place in a list of window extents `(offset, len)`: the extent a walk
/// is in and the transfer position where that extent starts. It holds no
/// extents itself, so an operation we serve over a registered region keeps
/// this and the region's key, never a copy of the region's extents (a
/// region built scattered has many; a peer may have `max_outstanding`
/// reads of it served at once).
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtentPos {
    idx: usize,
    base: u64,
}

impl ExtentPos {
    /// Calls `f(window_offset, len)` for the pieces of `extents` covering
    /// transfer positions `pos..pos+len`; returns `false` (having called
    /// nothing more) when that range is not covered or `f` refused. Walks
    /// on from where the last call ended, so positions should not go
    /// backwards (SGL segments arrive in order); when they do, the walk
    /// starts over. `extents` must be the same list at every call.
    pub fn walk(
        &mut self,
        extents: &[(u64, u64)],
        pos: u64,
        len: u64,
        mut f: impl FnMut(u64, u64) -> bool,
    ) -> bool {
        if pos < self.base {
            *self = Self::default();
        }
        let end = match pos.checked_add(len) {
            Some(e) => e,
            None => return false,
        };
        let mut at = pos;
        while at < end {
            let Some(&(eo, el)) = extents.get(self.idx) else {
                return false;
            };
            if at >= self.base + el {
                self.base += el;
                self.idx += 1;
                continue;
            }
            let within = at - self.base;
            let n = (el - within).min(end - at);
            if !f(eo + within, n) {
                return false;
            }
            at += n;
        }
        true
    }
}

/// A list of window extents that an operation owns, and its place in it.
#[derive(Debug, Clone)]
pub struct ExtentCursor {
    extents: Vec<(u64, u64)>,
    at: ExtentPos,
}

impl ExtentCursor {
    /// A cursor at position 0 of `extents`.
    pub fn new(extents: Vec<(u64, u64)>) -> Self {
        Self {
            extents,
            at: ExtentPos::default(),
        }
    }

    /// The extents and the place, for [`ExtentPos::walk`].
    pub fn parts(&mut self) -> (&[(u64, u64)], &mut ExtentPos) {
        (&self.extents, &mut self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_ranges_across_extents() {
        let mut c = ExtentCursor::new(vec![(100, 10), (500, 5), (900, 20)]);
        let (ext, at) = c.parts();
        let mut got = Vec::new();
        assert!(at.walk(ext, 8, 10, |o, l| {
            got.push((o, l));
            true
        }));
        assert_eq!(got, vec![(108, 2), (500, 5), (900, 3)]);
        got.clear();
        assert!(at.walk(ext, 18, 17, |o, l| {
            got.push((o, l));
            true
        }));
        assert_eq!(got, vec![(903, 17)]);
        assert!(!at.walk(ext, 30, 10, |_, _| true));
        assert!(at.walk(ext, 0, 1, |o, _| o == 100));
    }
}
