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

/// Walks a list of window extents `(offset, len)` by transfer position.
/// Positions asked for must not go backwards (SGL segments arrive in order).
#[derive(Debug, Clone)]
pub struct ExtentCursor {
    extents: Vec<(u64, u64)>,
    idx: usize,
    base: u64,
}

impl ExtentCursor {
    /// A cursor at position 0 of `extents`.
    pub fn new(extents: Vec<(u64, u64)>) -> Self {
        Self {
            extents,
            idx: 0,
            base: 0,
        }
    }

    /// Calls `f(window_offset, len)` for the pieces covering `pos..pos+len`;
    /// returns `false` (having called nothing more) when that range is not
    /// covered or `pos` went backwards.
    pub fn for_range(&mut self, pos: u64, len: u64, mut f: impl FnMut(u64, u64) -> bool) -> bool {
        if pos < self.base {
            self.idx = 0;
            self.base = 0;
        }
        let end = match pos.checked_add(len) {
            Some(e) => e,
            None => return false,
        };
        let mut at = pos;
        while at < end {
            let Some(&(eo, el)) = self.extents.get(self.idx) else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_ranges_across_extents() {
        let mut c = ExtentCursor::new(vec![(100, 10), (500, 5), (900, 20)]);
        let mut got = Vec::new();
        assert!(c.for_range(8, 10, |o, l| {
            got.push((o, l));
            true
        }));
        assert_eq!(got, vec![(108, 2), (500, 5), (900, 3)]);
        got.clear();
        assert!(c.for_range(18, 17, |o, l| {
            got.push((o, l));
            true
        }));
        assert_eq!(got, vec![(903, 17)]);
        assert!(!c.for_range(30, 10, |_, _| true));
        assert!(c.for_range(0, 1, |o, _| o == 100));
    }
}
