//! What a host lets each peer write in its inbound window: per-peer
//! translation, as a multi-host switch's per-requester look-up-table
//! windows give it (an Intel NTB is point-to-point and has one peer).
//!
//! The transport lays every window out the same way: each port has a
//! mailbox and a section at offsets that step by port. So the fixed part
//! of a grant is a template — ranges that step with the peer's port, and
//! ranges every peer may write — from which the ranges a given peer may
//! write are computed. The regions a host registers come and go; they are
//! granted one by one, each to its protection domain, through the live
//! table of [`grant_table`](super::grant_table) (see
//! [`NtbDevice::grant_range`](super::NtbDevice::grant_range)). A backend
//! that can enforce both builds each peer's
//! [`PeerWindow`](super::PeerWindow) from them: a write outside them fails
//! ([`HwError::NotGranted`](super::HwError), counted in
//! [`CounterSnapshot::ungranted_writes`](super::CounterSnapshot)).

use std::ops::Range;

/// Ranges `base + port * stride .. + len` of a window: one per port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    /// Offset of port 0's range.
    pub base: usize,
    /// Distance between consecutive ports' ranges.
    pub stride: usize,
    /// Length of each range.
    pub len: usize,
}

/// What each peer may write in one of our windows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerGrant {
    /// Ranges that step with the writer's port (its mailbox, its section).
    pub per_port: Vec<Strided>,
    /// Ranges every peer may write, fixed for the window's life.
    pub shared: Vec<Range<usize>>,
}

impl PeerGrant {
    /// The ranges `port` may write: its own ones, largest first (a
    /// transport's section, where most of its writes go, is checked
    /// first), then the shared ones.
    pub fn ranges_for(&self, port: u16) -> Vec<Range<usize>> {
        let p = usize::from(port);
        let mut own: Vec<Range<usize>> = self
            .per_port
            .iter()
            .filter_map(|s| {
                let start = s.base.checked_add(p.checked_mul(s.stride)?)?;
                Some(start..start.checked_add(s.len)?)
            })
            .filter(|r| !r.is_empty())
            .collect();
        own.sort_by_key(|r| std::cmp::Reverse(r.len()));
        own.extend(self.shared.iter().filter(|r| !r.is_empty()).cloned());
        own
    }
}

/// Whether `offset..offset + len` lies inside one of `ranges`.
#[inline]
pub(crate) fn covered(ranges: &[Range<usize>], offset: usize, len: usize) -> bool {
    let end = offset.saturating_add(len);
    ranges.iter().any(|r| offset >= r.start && end <= r.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_gets_its_own_strided_ranges_and_the_shared_ones() {
        let g = PeerGrant {
            per_port: vec![
                Strided {
                    base: 64,
                    stride: 64,
                    len: 64,
                },
                Strided {
                    base: 4096,
                    stride: 1000,
                    len: 1000,
                },
            ],
            shared: std::iter::once(1 << 20..2 << 20).collect(),
        };
        let r = g.ranges_for(2);
        assert_eq!(r, vec![6096..7096, 192..256, 1 << 20..2 << 20]);
        assert!(covered(&r, 192, 64));
        assert!(!covered(&r, 128, 64), "port 1's mailbox");
        assert!(!covered(&r, 5096, 8), "port 1's section");
        assert!(covered(&r, (1 << 20) + 5, 100));
        assert!(!covered(&r, (2 << 20) - 4, 8), "straddles the end");
    }
}
