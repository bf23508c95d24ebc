//! The live part of a per-peer translation: a bounded table of ranges of a
//! window, each granted to one peer or to every peer, that the owner edits
//! as it registers and deregisters regions, and that a writer consults
//! before each write outside the fixed template of
//! [`PeerGrant`](super::PeerGrant) — as a multi-host switch's per-requester
//! look-up-table windows are reprogrammed while traffic flows.
//!
//! The table lives in memory both sides map (the emulated fabric's control
//! segment): only atomics, owner the single writer, guarded by a sequence
//! number (a seqlock), so a writer never acts on a half-edited entry. A
//! writer bounds its retries: a table that stays mid-edit refuses the write
//! rather than hang the writer.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use super::Port;
use super::window::Keepalive;

/// Entries in one window's table.
pub(crate) const GRANT_TABLE_LEN: usize = 512;
/// A tag granting an entry to every peer.
const EVERY_PEER: u64 = 0xffff;
/// Bits of an entry's second word holding the tag (the length is above).
const TAG_BITS: u32 = 16;
/// Most bytes of one entry (the length's 48 bits).
const MAX_LEN: u64 = (1 << (64 - TAG_BITS)) - 1;
/// How often a writer re-reads a table caught mid-edit before refusing.
const RETRIES: usize = 64;

/// The name of one granted range, to withdraw it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantId(pub(crate) u32);

/// The table, in place in shared memory (`#[repr(C)]`, atomics only).
#[repr(C, align(64))]
pub(crate) struct GrantTable {
    /// Odd while the owner edits the table; bumped twice per edit.
    seq: AtomicU64,
    /// Entries `0..used` may be live.
    used: AtomicU64,
    /// `[offset, len << 16 | tag]` each; tag 0 = free, `0xffff` = every
    /// peer, else the peer's port + 1.
    entries: [[AtomicU64; 2]; GRANT_TABLE_LEN],
}

/// Why a range could not be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantRefused {
    /// Every entry is live.
    Full,
    /// Empty, or longer than an entry holds, or a port with no tag.
    Unrepresentable,
}

fn tag_of(peer: Option<Port>) -> Option<u64> {
    match peer {
        None => Some(EVERY_PEER),
        Some(p) if u64::from(p) + 1 < EVERY_PEER => Some(u64::from(p) + 1),
        Some(_) => None,
    }
}

impl GrantTable {
    /// Empties the table (a new owner of the slot; no writer may rely on
    /// what the previous one granted). One more edit, so the sequence
    /// number keeps rising across owners: an admission remembered at an
    /// earlier owner's number never matches again (see [`epoch`](Self::epoch)).
    pub fn reset(&self) {
        self.edit(|| self.used.store(0, Ordering::Relaxed));
    }

    /// The table's sequence number now: an admission made at this number
    /// (see [`admitted_at`](Self::admitted_at)) still holds while it reads
    /// the same, since every edit, `reset` included, raises it.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Runs `edit` as one edit: readers that overlap it retry. The
    /// sequence number becomes odd (the low bit set: an even one moves to
    /// the next odd one; an odd one an owner that died mid-edit left stays,
    /// still read as "editing"), then moves to the next even one (the low
    /// bit set again, then one added). It never falls and no even number is
    /// seen twice, even if a stale owner the fabric already replaced still
    /// edits beside the new one. Each step is a read-modify-write that
    /// cannot loop (every member can store to the word: a compare-and-swap
    /// loop could be kept spinning) and wraps instead of overflowing.
    fn edit<R>(&self, edit: impl FnOnce() -> R) -> R {
        self.seq.fetch_or(1, Ordering::Relaxed);
        fence(Ordering::Release);
        let r = edit();
        self.seq.fetch_or(1, Ordering::Release);
        self.seq.fetch_add(1, Ordering::Release);
        r
    }

    /// Grants `len` bytes at `offset` to `peer` (every peer: `None`).
    /// Owner only, one edit at a time (the caller serialises).
    pub fn grant(
        &self,
        offset: usize,
        len: usize,
        peer: Option<Port>,
    ) -> Result<GrantId, GrantRefused> {
        let tag = tag_of(peer).ok_or(GrantRefused::Unrepresentable)?;
        if len == 0 || len as u64 > MAX_LEN {
            return Err(GrantRefused::Unrepresentable);
        }
        let used = (self.used.load(Ordering::Relaxed) as usize).min(GRANT_TABLE_LEN);
        let free = (0..used).find(|&i| self.entries[i][1].load(Ordering::Relaxed) == 0);
        let i = match free {
            Some(i) => i,
            None if used < GRANT_TABLE_LEN => used,
            None => return Err(GrantRefused::Full),
        };
        self.edit(|| {
            self.entries[i][0].store(offset as u64, Ordering::Relaxed);
            self.entries[i][1].store((len as u64) << TAG_BITS | tag, Ordering::Relaxed);
            if i == used {
                self.used.store(used as u64 + 1, Ordering::Relaxed);
            }
        });
        Ok(GrantId(i as u32))
    }

    /// Withdraws a grant: from the edit's end no writer admits a write on
    /// its strength. Owner only, one edit at a time.
    pub fn withdraw(&self, id: GrantId) {
        let i = id.0 as usize;
        if i < GRANT_TABLE_LEN {
            self.edit(|| self.entries[i][1].store(0, Ordering::Relaxed));
        }
    }

    /// Live entries (for status and tests).
    pub fn live(&self) -> usize {
        let used = (self.used.load(Ordering::Acquire) as usize).min(GRANT_TABLE_LEN);
        (0..used)
            .filter(|&i| self.entries[i][1].load(Ordering::Relaxed) != 0)
            .count()
    }

    /// Whether entry `i` lets a writer tagged `tag` write `offset..end`.
    #[inline]
    fn covers(&self, i: usize, tag: u64, offset: u64, end: u64) -> bool {
        let w = self.entries[i][1].load(Ordering::Relaxed);
        let t = w & ((1 << TAG_BITS) - 1);
        if t == 0 || (t != tag && t != EVERY_PEER) {
            return false;
        }
        let start = self.entries[i][0].load(Ordering::Relaxed);
        offset >= start && end <= start.saturating_add(w >> TAG_BITS)
    }

    /// Test only: leaves the table as an owner preempted mid-edit does
    /// (its sequence number odd), or ends that edit.
    #[cfg(test)]
    pub(crate) fn hold_mid_edit(&self, held: bool) {
        let odd = self.seq.load(Ordering::Relaxed) & 1 == 1;
        if odd != held {
            self.seq.fetch_add(1, Ordering::Release);
        }
    }

    /// [`admitted_at`](Self::admitted_at) as a yes or no.
    #[cfg(test)]
    pub fn admits(&self, writer: Port, offset: usize, len: usize, hint: &AtomicUsize) -> bool {
        matches!(self.admitted_at(writer, offset, len, hint), Ok(Some(_)))
    }

    /// Whether `writer` may write `len` bytes at `offset`, by a table
    /// consistent at one moment: `Ok(Some(n))` with the sequence number at
    /// which it may (even: the table as of that number admitted the write),
    /// `Ok(None)` when it may not, `Err(TableBusy)` when the table was being
    /// edited at every look (its owner preempted mid-edit, or a peer that
    /// never finishes one): no answer, ask again later. `hint` is the entry
    /// that admitted this writer last (tried first; updated).
    #[inline]
    pub fn admitted_at(
        &self,
        writer: Port,
        offset: usize,
        len: usize,
        hint: &AtomicUsize,
    ) -> Result<Option<u64>, TableBusy> {
        let Some(tag) = tag_of(Some(writer)) else {
            return Ok(None);
        };
        let (offset, end) = (offset as u64, offset.saturating_add(len) as u64);
        for _ in 0..RETRIES {
            let s = self.seq.load(Ordering::Acquire);
            if s & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let used = (self.used.load(Ordering::Relaxed) as usize).min(GRANT_TABLE_LEN);
            let h = hint.load(Ordering::Relaxed);
            let found = if h < used && self.covers(h, tag, offset, end) {
                Some(h)
            } else {
                (0..used).find(|&i| self.covers(i, tag, offset, end))
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s {
                // Stored only when it changes: the line holding the hint
                // stays clean in the writer's cache.
                if let Some(i) = found.filter(|&i| i != h) {
                    hint.store(i, Ordering::Relaxed);
                }
                return Ok(found.map(|_| s));
            }
        }
        Err(TableBusy)
    }
}

/// A grant table being edited at every look: no answer yet (see
/// [`GrantTable::admitted_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableBusy;

/// A writer's view of one peer's table: where it is, who we are, the
/// entry that admitted us last.
pub(crate) struct LiveGrants {
    table: *const GrantTable,
    writer: Port,
    hint: AtomicUsize,
    _keep: Keepalive,
}

// SAFETY: the table is atomics only, in a mapping `_keep` keeps alive;
// the view makes no other access.
unsafe impl Send for LiveGrants {}
// SAFETY: as for Send.
unsafe impl Sync for LiveGrants {}

impl Clone for LiveGrants {
    fn clone(&self) -> Self {
        Self {
            table: self.table,
            writer: self.writer,
            hint: AtomicUsize::new(self.hint.load(Ordering::Relaxed)),
            _keep: self._keep.clone(),
        }
    }
}

impl LiveGrants {
    /// A view of the table at `table`, for writes by `writer`.
    ///
    /// # Safety
    /// `table` must point to a `GrantTable` in a mapping that `keep` keeps
    /// alive, accessed by every party through atomics only.
    pub unsafe fn from_raw(table: *const GrantTable, writer: Port, keep: Keepalive) -> Self {
        Self {
            table,
            writer,
            hint: AtomicUsize::new(0),
            _keep: keep,
        }
    }

    /// The table, to read.
    #[inline]
    fn table(&self) -> &GrantTable {
        // SAFETY: per `from_raw`, the table is alive and atomics only, so a
        // shared reference to it is sound however others write it.
        unsafe { &*self.table }
    }

    /// The sequence number at which the table lets us write `len` bytes at
    /// `offset`, `None` when it does not, or no answer yet
    /// ([`GrantTable::admitted_at`]).
    #[inline]
    pub fn admitted_at(&self, offset: usize, len: usize) -> Result<Option<u64>, TableBusy> {
        self.table()
            .admitted_at(self.writer, offset, len, &self.hint)
    }

    /// The table's sequence number now ([`GrantTable::epoch`]).
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.table().epoch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Box<GrantTable> {
        // SAFETY: an all-zero GrantTable is valid (atomics, zero = empty).
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn a_range_admits_its_peer_only_and_withdrawing_ends_it() {
        let t = table();
        let h = AtomicUsize::new(0);
        let a = t.grant(4096, 1024, Some(3)).unwrap();
        let all = t.grant(8192, 64, None).unwrap();
        assert!(t.admits(3, 4096, 1024, &h));
        assert!(t.admits(3, 5000, 8, &h));
        assert!(!t.admits(3, 5100, 64, &h), "straddles the end");
        assert!(!t.admits(2, 4096, 8, &h), "another peer");
        assert!(!t.admits(3, 4000, 8, &h), "before the start");
        assert!(t.admits(2, 8192, 64, &h) && t.admits(7, 8200, 8, &h));
        t.withdraw(a);
        assert!(!t.admits(3, 4096, 8, &h));
        assert_eq!(t.live(), 1);
        // The freed entry is reused.
        assert_eq!(t.grant(0, 64, Some(1)).unwrap(), a);
        t.withdraw(all);
        assert!(!t.admits(2, 8192, 64, &h));
    }

    #[test]
    fn a_reader_racing_edits_never_admits_a_torn_entry() {
        // The owner flips one entry between 0..128 and 4096..4160; a torn
        // read (the new start with the old length) would admit 4160..4224,
        // which neither grant covers.
        let t: &'static GrantTable = Box::leak(table());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut id = t.grant(0, 128, Some(1)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    t.withdraw(id);
                    id = t.grant(4096, 64, Some(1)).unwrap();
                    t.withdraw(id);
                    id = t.grant(0, 128, Some(1)).unwrap();
                }
            })
        };
        let h = AtomicUsize::new(0);
        let mut admitted = 0u64;
        // At least 2 M looks, and on until one admitted the real grant
        // (other tests' threads can starve the reader of stable moments for
        // a while; the bound is a deadline, not a count).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut looks = 0u64;
        while looks < 2_000_000 || admitted == 0 {
            assert!(!t.admits(1, 4160, 64, &h), "a torn entry was admitted");
            admitted += u64::from(t.admits(1, 0, 64, &h));
            looks += 1;
            if looks.is_multiple_of(1 << 16) && std::time::Instant::now() > deadline {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        owner.join().unwrap();
        assert!(
            admitted > 0,
            "the reader never saw a grant in {looks} looks"
        );
    }

    #[test]
    fn every_edit_and_every_reset_raise_the_epoch() {
        let t = table();
        let h = AtomicUsize::new(0);
        let mut seen = vec![t.epoch()];
        let a = t.grant(0, 64, Some(1)).unwrap();
        let at = t.admitted_at(1, 0, 64, &h).unwrap().unwrap();
        assert_eq!(at, t.epoch());
        seen.push(t.epoch());
        t.withdraw(a);
        seen.push(t.epoch());
        t.reset();
        seen.push(t.epoch());
        // An owner that died mid-edit, then a new owner.
        t.seq.fetch_add(1, Ordering::Relaxed);
        t.reset();
        seen.push(t.epoch());
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert!(seen.iter().all(|s| s % 2 == 0), "{seen:?}");
        assert_eq!(t.admitted_at(1, 0, 64, &h), Ok(None));
    }

    /// A stale owner the fabric already replaced may still edit beside
    /// the new one: the number must still only rise (a number seen twice
    /// could let a remembered admission outlive an edit).
    #[test]
    fn racing_editors_never_move_the_epoch_back() {
        const EDITS: u64 = 100_000;
        let t = table();
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for i in 0..2u32 {
                let (t, start) = (&t, &start);
                s.spawn(move || {
                    start.wait();
                    let mut last = t.epoch();
                    for _ in 0..EDITS {
                        t.withdraw(GrantId(i));
                        let now = t.epoch();
                        assert!(now > last, "epoch went from {last} to {now} over an edit");
                        last = now;
                    }
                });
            }
        });
        assert_eq!(t.epoch() % 2, 0, "left even once every edit ended");
        assert!(
            t.epoch() >= 2 * EDITS,
            "each thread's every edit moved it once at least"
        );
    }

    /// Every member can store to the word: a number at the top of the
    /// range wraps (no overflow panic in a debug build) and edits still end
    /// on an even number.
    #[test]
    fn an_edit_from_a_number_a_peer_wrote_at_the_top_wraps() {
        let t = table();
        for top in [u64::MAX, u64::MAX - 1] {
            t.seq.store(top, Ordering::Relaxed);
            t.withdraw(GrantId(0));
            assert_eq!(t.epoch() % 2, 0, "from {top:#x}: {:#x}", t.epoch());
        }
    }

    #[test]
    fn a_full_table_refuses_and_a_table_left_mid_edit_admits_nothing() {
        let t = table();
        for i in 0..GRANT_TABLE_LEN {
            t.grant(i * 64, 64, Some(1)).unwrap();
        }
        assert_eq!(t.grant(0, 64, Some(1)), Err(GrantRefused::Full));
        assert_eq!(t.grant(0, 0, Some(1)), Err(GrantRefused::Unrepresentable));
        let h = AtomicUsize::new(0);
        assert!(t.admits(1, 64 * 100, 64, &h));
        // An owner that died mid-edit (or a hostile one): refused, no hang.
        t.seq.fetch_add(1, Ordering::Relaxed);
        assert!(!t.admits(1, 64 * 100, 64, &h));
        t.reset();
        assert!(!t.admits(1, 64 * 100, 64, &h), "reset empties the table");
    }
}
