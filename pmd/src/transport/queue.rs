//! Single-producer, single-consumer rings of 64-byte slots, polled in place.
//!
//! The ring lives in the consumer's window. The producer writes a slot's body
//! and then its tag with a release store; the tag is `(epoch << 32) | seq`, so
//! the consumer, polling the slot it expects next, tells a new message from
//! an old one (an earlier lap, or an earlier connection) without reading any
//! index. The consumer writes its progress back into the producer's window
//! (credits), in batches, tagged like a slot (`(epoch << 32) | seq`), so
//! that a credit an earlier connection's consumer writes late (a peer that
//! drains its old rings before it sees that we reset) is never taken for
//! this connection's; the producer never reads the consumer's memory.

use crate::hw::{LocalSpan, LocalWindow, PeerWindow, Result as HwResult, WindowSpan};

use super::wire::{BODY, Body, SLOT, TAG_OFFSET, Words, body_words};

/// The tag of message `seq` of connection `epoch` (never 0: epochs are odd).
#[inline]
pub fn tag(epoch: u32, seq: u64) -> u64 {
    (u64::from(epoch) << 32) | (seq & 0xffff_ffff)
}

/// Window offset of message `seq`'s slot in the ring at `base` of `depth`
/// slots (a power of two: a mask, not a division, on every slot).
#[inline]
fn slot_offset(base: usize, depth: u64, seq: u64) -> usize {
    base + (seq & (depth - 1)) as usize * SLOT
}

/// Zeroes bytes `start..end` of our window (8-byte aligned), one atomic
/// word at a time and from the end down, for a section being reset while
/// another thread of ours may be reading its words (a data queue's receive
/// half): a plain copy racing its loads would be a data race, and going
/// down zeroes each slot's tag (its last word) before its body, so a
/// reader that loaded a body while it was being zeroed finds the tag gone
/// when it looks again ([`Consumer::peek_stable`]) and does not take a
/// half-zeroed slot.
pub(crate) fn zero_slots(local: &LocalWindow, start: usize, end: usize) -> HwResult<()> {
    debug_assert!(start.is_multiple_of(8) && end.is_multiple_of(8));
    for at in (start..end).step_by(8).rev() {
        local.store_u64(at, 0)?;
    }
    Ok(())
}

/// A ring's depth, which must be a power of two (slots are found by mask).
fn ring_depth(depth: u32) -> u64 {
    assert!(
        depth.is_power_of_two(),
        "ring depth {depth} is not a power of two"
    );
    u64::from(depth)
}

/// The writing end of a ring in a peer's window.
#[derive(Debug)]
pub struct Producer {
    base: usize,
    depth: u64,
    epoch: u32,
    seq: u64,
    credit: u64,
    credit_offset: usize,
}

impl Producer {
    /// A producer for the ring at `base` (in the peer's window) of `depth`
    /// slots, whose consumer writes its progress to `credit_offset` of our
    /// own window.
    ///
    /// # Panics
    /// When `depth` is not a power of two (a [`Geometry`](super::Geometry)
    /// never gives one that is not).
    pub fn new(base: usize, depth: u32, epoch: u32, credit_offset: usize) -> Self {
        Self {
            base,
            depth: ring_depth(depth),
            epoch,
            seq: 0,
            credit: 0,
            credit_offset,
        }
    }

    /// Messages produced so far.
    /// Offset of the ring in the peer's window.
    #[inline]
    pub fn base(&self) -> usize {
        self.base
    }

    /// Offset of the credit word in our window.
    #[inline]
    pub fn credit_offset(&self) -> usize {
        self.credit_offset
    }

    #[inline]
    pub fn produced(&self) -> u64 {
        self.seq
    }

    /// The consumer's progress as last credited.
    #[inline]
    pub fn credit(&self) -> u64 {
        self.credit
    }

    /// Free slots as last known, refreshing the credit from our window when
    /// the ring looks full. A credit beyond what was produced or going
    /// backwards is ignored (returns `false` in the second field).
    #[inline]
    pub fn free(&mut self, local: &LocalWindow) -> (u64, bool) {
        let mut sane = true;
        if self.seq - self.credit >= self.depth {
            sane = self.refresh(local);
        }
        (self.depth - (self.seq - self.credit), sane)
    }

    /// Whether `k` slots are free, refreshing the credit from our window
    /// when fewer look free. The second field is `false` when the credit
    /// word held nonsense (ignored, as in [`free`](Self::free)).
    #[inline]
    pub fn room(&mut self, local: &LocalWindow, k: u64) -> (bool, bool) {
        let mut sane = true;
        if self.depth - (self.seq - self.credit) < k {
            sane = self.refresh(local);
        }
        (self.depth - (self.seq - self.credit) >= k, sane)
    }

    /// Ring depth in slots.
    #[inline]
    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// Re-reads the credit word; `false` when the peer wrote nonsense.
    ///
    /// The word is [`tag`]`(epoch, seq)`, the consumer's progress in the low
    /// 32 bits: a word of another epoch (zero before the first credit, or a
    /// late one of an earlier connection) credits nothing and is not
    /// nonsense; this epoch's is taken as the smallest progress at or past
    /// ours with those low bits (we are never 2^32 messages ahead of the
    /// consumer), and is nonsense when that is past what we produced (a
    /// credit going backwards lands there too).
    ///
    /// Out of line: the ring looking full is the rare case of a send.
    #[cold]
    #[inline(never)]
    pub fn refresh(&mut self, local: &LocalWindow) -> bool {
        let Ok(raw) = local.load_u64(self.credit_offset) else {
            return false;
        };
        if raw >> 32 != u64::from(self.epoch) {
            return true;
        }
        let c = self.credit + u64::from((raw as u32).wrapping_sub(self.credit as u32));
        if c > self.seq {
            return false;
        }
        self.credit = c;
        true
    }

    /// Writes `body` into the next slot. The caller checked [`free`](Self::free).
    #[inline]
    pub fn push(&mut self, win: &PeerWindow, body: &Body) -> HwResult<()> {
        debug_assert!(self.seq - self.credit < self.depth);
        self.write_slot(win, self.seq, &body_words(body))?;
        self.seq += 1;
        Ok(())
    }

    /// Writes `body` into the slot `k` places after the next one, without
    /// producing it yet: a sender writes a run (a multi-slot message, or a
    /// batch of messages) last-first, the run's first slot last, so the
    /// consumer, polling that slot, finds the whole run already written
    /// instead of chasing the writer line by line. Each slot still carries
    /// its own tag and is checked. The caller checked [`room`](Self::room)
    /// for the run, writes through `ring`, this ring's [`span`](Self::span)
    /// (the window's checks made once for the run), and then calls
    /// [`produce`](Self::produce), which counts the run's posted writes.
    #[inline(always)]
    pub fn write_ahead(&self, ring: &WindowSpan<'_>, k: u64, body: &Words) -> HwResult<()> {
        debug_assert!(self.seq - self.credit + k < self.depth);
        let seq = self.seq + k;
        ring.store_words_then_u64(slot_offset(0, self.depth, seq), body, tag(self.epoch, seq))
    }

    /// Writes `bodies` into the next `bodies.len()` slots through `ring`
    /// (this ring's [`span`](Self::span)), last-first as
    /// [`write_ahead`](Self::write_ahead) does, in one run of stores, and
    /// produces them. The caller checked [`room`](Self::room) for them. On a
    /// device error nothing is produced, but the slots after the failed one
    /// were written with valid tags: the caller stops sending on this
    /// connection (a new epoch makes them stale).
    #[inline]
    pub fn write_run(&mut self, ring: &WindowSpan<'_>, bodies: &[Words]) -> HwResult<()> {
        for (k, body) in bodies.iter().enumerate().rev() {
            let seq = self.seq + k as u64;
            ring.store_words_then_u64(slot_offset(0, self.depth, seq), body, tag(self.epoch, seq))?;
        }
        self.produce(ring, bodies.len() as u64);
        Ok(())
    }

    /// The ring's whole area in the peer's window, checked once (bounds,
    /// tenure, grant) for a run of [`write_ahead`](Self::write_ahead).
    #[inline]
    pub fn span<'w>(&self, win: &'w PeerWindow) -> HwResult<WindowSpan<'w>> {
        win.span(self.base, self.depth as usize * SLOT)
    }

    /// Counts the `k` slots written with [`write_ahead`](Self::write_ahead)
    /// through `ring` as produced, and their posted writes (a body and a tag
    /// each) on the window's counters. A run that failed part way is not
    /// produced, and the slots it wrote are not counted.
    #[inline]
    pub fn produce(&mut self, ring: &WindowSpan<'_>, k: u64) {
        debug_assert!(self.seq - self.credit + k <= self.depth);
        self.seq += k;
        ring.count_posted_writes(2 * k, k as usize * SLOT);
    }

    /// Writes message `seq`'s body, then its tag (release), as one checked
    /// write of the slot.
    #[inline]
    fn write_slot(&self, win: &PeerWindow, seq: u64, body: &Words) -> HwResult<()> {
        let off = slot_offset(self.base, self.depth, seq);
        win.write_words_then_u64(off, body, tag(self.epoch, seq))
    }
}

/// The reading end of a ring in our own window.
#[derive(Debug)]
pub struct Consumer {
    base: usize,
    depth: u64,
    epoch: u32,
    seq: u64,
    credited: u64,
    /// Where slot `seq` lies in the ring, and the tag it has once message
    /// `seq` is there: kept as `seq` moves, so that a poll finding nothing
    /// (most polls) computes neither.
    next: (usize, u64),
}

impl Consumer {
    /// A consumer of the ring at `base` of our window.
    ///
    /// # Panics
    /// When `depth` is not a power of two, as [`Producer::new`].
    pub fn new(base: usize, depth: u32, epoch: u32) -> Self {
        let depth = ring_depth(depth);
        Self {
            base,
            depth,
            epoch,
            seq: 0,
            credited: 0,
            next: (slot_offset(0, depth, 0), tag(epoch, 0)),
        }
    }

    /// Where slot `k` places after the next one lies in the ring, and the
    /// tag it has once its message is there.
    #[inline(always)]
    fn expect(&self, k: u64) -> (usize, u64) {
        if k == 0 {
            return self.next;
        }
        let seq = self.seq + k;
        (slot_offset(0, self.depth, seq), tag(self.epoch, seq))
    }

    /// Offset of the ring in our window.
    #[inline]
    pub fn base(&self) -> usize {
        self.base
    }

    /// The ring's slots in our window, checked once, for a run of
    /// [`arrived_in`](Self::arrived_in) and reads of the slots in place.
    #[inline]
    pub fn area<'w>(&self, local: &'w LocalWindow) -> HwResult<LocalSpan<'w>> {
        local.span(self.base, self.depth as usize * SLOT)
    }

    /// Where in `ring` (this ring's [`area`](Self::area)) the slot `k`
    /// places after the next one is, if that slot has arrived (its own tag
    /// is there): a message read in place, as [`arrived`](Self::arrived)
    /// reads it, with the bounds checked once for the ring.
    #[inline]
    pub fn arrived_in(&self, ring: &LocalSpan<'_>, k: u64) -> Option<usize> {
        let (at, tag) = self.expect(k);
        (ring.load_u64(at + TAG_OFFSET) == tag).then_some(at)
    }

    /// Copies out the next message if it has arrived (without consuming it).
    #[inline]
    pub fn peek(&self, local: &LocalWindow) -> Option<Body> {
        self.peek_ahead(local, 0)
    }

    /// Copies out the slot `k` places after the next one if it has arrived
    /// (its own tag is there), without consuming anything. For messages
    /// that span consecutive slots.
    #[inline]
    pub fn peek_ahead(&self, local: &LocalWindow, k: u64) -> Option<Body> {
        let off = self.arrived(local, k)?;
        let mut body = [0u8; BODY];
        local.read(off, &mut body).ok()?;
        Some(body)
    }

    /// Where in our window the body of the slot `k` places after the next
    /// one is, if that slot has arrived (its own tag is there): for reading
    /// a message in place, without consuming anything. Its bytes stay as
    /// they are until we credit the slot back, unless the peer breaks the
    /// protocol (then they are whatever it wrote: read each once).
    #[inline]
    pub fn arrived(&self, local: &LocalWindow, k: u64) -> Option<usize> {
        let (at, tag) = self.expect(k);
        let off = self.base + at;
        let t = local.poll_u64(off + TAG_OFFSET)?;
        (t == tag).then_some(off)
    }

    /// Like [`peek`](Self::peek), for a consumer on another thread than
    /// the one that may reset the section (a data queue's receive half): the
    /// body is loaded word by word (relaxed atomics, not a copy that would
    /// race the reset's stores), then the tag again behind an acquire fence,
    /// as a sequence lock's reader. A slot zeroed or rewritten while it was
    /// being read is not taken: the reset zeroes each slot's tag before its
    /// body ([`zero_slots`]).
    #[inline]
    pub fn peek_stable(&self, local: &LocalWindow) -> Option<Body> {
        let off = self.arrived(local, 0)?;
        let mut words = [0u64; BODY / 8];
        local.load_words_relaxed(off, &mut words).ok()?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let t = local.load_u64(off + TAG_OFFSET).ok()?;
        if t != tag(self.epoch, self.seq) {
            return None;
        }
        let mut body = [0u8; BODY];
        for (b, w) in body.chunks_exact_mut(8).zip(words) {
            b.copy_from_slice(&w.to_le_bytes());
        }
        Some(body)
    }

    /// Hints the CPU to fetch slot `k` places after the next one: a poller
    /// waiting on the next slot touches the one after too, so a message that
    /// spans both arrives in one round of line transfers, not two.
    #[inline]
    pub fn prefetch_ahead(&self, local: &LocalWindow, k: u64) {
        let seq = self.seq + k;
        local.prefetch(slot_offset(self.base, self.depth, seq));
    }

    /// Consumes the message last peeked.
    #[inline]
    pub fn advance(&mut self) {
        self.advance_by(1);
    }

    /// Consumes `k` slots (a message spanning them).
    #[inline]
    pub fn advance_by(&mut self, k: u64) {
        self.seq += k;
        self.next = (
            slot_offset(0, self.depth, self.seq),
            tag(self.epoch, self.seq),
        );
    }

    /// Slots in the ring.
    #[inline]
    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// Consumed messages not yet credited back.
    #[inline]
    pub fn uncredited(&self) -> u64 {
        self.seq - self.credited
    }

    /// Writes our progress into the producer's credit word at `offset` of
    /// its window (one posted write for a whole batch).
    pub fn credit(&mut self, win: &PeerWindow, offset: usize) -> HwResult<()> {
        win.write_u64(offset, tag(self.epoch, self.seq))?;
        self.credited = self.seq;
        Ok(())
    }
}

/// The entry of FreeQ position `seq` naming buffer `index` (never 0).
#[inline]
pub fn free_entry(epoch: u32, seq: u64, index: u32) -> u64 {
    (u64::from(epoch.wrapping_add(seq as u32)) << 32) | (u64::from(index) + 1)
}

/// Decodes FreeQ entry `raw` expected at `seq`: the buffer index, or `None`
/// when the entry is not (yet) the expected one.
#[inline]
pub fn parse_free_entry(epoch: u32, seq: u64, raw: u64) -> Option<u32> {
    if (raw >> 32) as u32 != epoch.wrapping_add(seq as u32) {
        return None;
    }
    (raw as u32).checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::DeviceCounters;
    use std::sync::Arc;

    pub(crate) fn windows(bytes: usize) -> (LocalWindow, PeerWindow) {
        let mem: Arc<Vec<std::sync::atomic::AtomicU64>> =
            Arc::new((0..bytes / 8).map(|_| Default::default()).collect());
        let ptr = mem.as_ptr() as *mut u8;
        // SAFETY: `mem` has `bytes` bytes, is 8-aligned, interior-mutable and
        // kept alive by the handles; it is only accessed through them.
        let local = unsafe { LocalWindow::from_raw(ptr, bytes, 0, mem.clone()) };
        // SAFETY: as above.
        let peer = unsafe {
            PeerWindow::from_raw(ptr, bytes, 1, Arc::new(DeviceCounters::default()), mem)
        };
        (local, peer)
    }

    /// A reset zeroing a slot while another thread reads it never hands
    /// that thread a half-zeroed body: every body `peek_stable` returns is
    /// the whole of one write (checked word by word, until 20 000 were
    /// taken, rounds of write then reset on one thread, reads on another).
    /// Each round is a new connection, as after a real reset: a new epoch,
    /// so the slot's tag never comes back.
    #[test]
    fn a_slot_being_reset_is_never_taken_half_zeroed() {
        use std::sync::atomic::{AtomicU64, Ordering};
        const TAKE: u64 = 20_000;
        const MAX_ROUNDS: u32 = 50_000_000;
        let (local, peer) = windows(4096);
        let taken = AtomicU64::new(0);
        let rounds = std::thread::scope(|s| {
            let (writer_local, writer_taken) = (&local, &taken);
            let writer = s.spawn(move || {
                let mut round = 0;
                while writer_taken.load(Ordering::Relaxed) < TAKE && round < MAX_ROUNDS {
                    round += 1;
                    let word = u64::from(round) | 1 << 63;
                    peer.write_words_then_u64(0, &[word; BODY / 8], tag(2 * round + 1, 0))
                        .unwrap();
                    zero_slots(writer_local, 0, SLOT).unwrap();
                }
                round
            });
            let mut torn = 0u64;
            while !writer.is_finished() {
                // The consumer of the connection whose tag is there now.
                let epoch = (local.load_u64(TAG_OFFSET).unwrap() >> 32) as u32;
                if epoch == 0 {
                    continue;
                }
                if let Some(body) = Consumer::new(0, 4, epoch).peek_stable(&local) {
                    taken.fetch_add(1, Ordering::Relaxed);
                    let word = u64::from(epoch / 2) | 1 << 63;
                    torn += u64::from(body.chunks_exact(8).any(|w| w != word.to_le_bytes()));
                }
            }
            assert_eq!(torn, 0, "{torn} bodies taken were torn");
            writer.join().unwrap()
        });
        assert!(
            taken.load(Ordering::Relaxed) > 0,
            "no body taken in {rounds} rounds: the test tested nothing"
        );
    }

    #[test]
    fn messages_pass_in_order_and_credits_bound_the_producer() {
        let (local, peer) = windows(8192);
        let mut p = Producer::new(0, 4, 3, 4096);
        let mut c = Consumer::new(0, 4, 3);
        let mut got = Vec::new();
        let mut sent = 0u8;
        for _ in 0..50 {
            while p.free(&local).0 > 0 && sent < 100 {
                let mut b = [0u8; BODY];
                b[0] = sent;
                p.push(&peer, &b).unwrap();
                sent += 1;
            }
            while let Some(b) = c.peek(&local) {
                got.push(b[0]);
                c.advance();
            }
            c.credit(&peer, 4096).unwrap();
        }
        assert_eq!(got, (0..100).collect::<Vec<u8>>());
    }

    #[test]
    fn runs_of_slots_are_seen_slot_by_slot_and_room_counts_them() {
        let (local, peer) = windows(8192);
        let mut p = Producer::new(0, 4, 3, 4096);
        let mut c = Consumer::new(0, 4, 3);
        assert_eq!(p.room(&local, 4), (true, true));
        p.push(&peer, &[1u8; BODY]).unwrap();
        assert!(c.peek_ahead(&local, 1).is_none());
        p.push(&peer, &[2u8; BODY]).unwrap();
        p.push(&peer, &[3u8; BODY]).unwrap();
        assert_eq!(p.room(&local, 2), (false, true));
        assert_eq!(c.peek_ahead(&local, 2).map(|b| b[0]), Some(3));
        assert!(c.peek_ahead(&local, 3).is_none());
        c.advance_by(3);
        c.credit(&peer, 4096).unwrap();
        assert_eq!(p.room(&local, 4), (true, true));
        // Wrapping: slot 3 and then slot 0 again (seq 4).
        p.push(&peer, &[4u8; BODY]).unwrap();
        p.push(&peer, &[5u8; BODY]).unwrap();
        assert_eq!(c.peek(&local).map(|b| b[0]), Some(4));
        assert_eq!(c.peek_ahead(&local, 1).map(|b| b[0]), Some(5));
        // A slot of an earlier lap is not taken for a later one.
        assert!(c.peek_ahead(&local, 5).is_none());
    }

    #[test]
    fn a_run_written_ahead_last_first_is_seen_once_its_first_slot_lands() {
        let (local, peer) = windows(8192);
        let mut p = Producer::new(0, 8, 3, 4096);
        let c = Consumer::new(0, 8, 3);
        assert_eq!(p.room(&local, 3), (true, true));
        let ring = p.span(&peer).unwrap();
        p.write_ahead(&ring, 2, &body_words(&[3u8; BODY])).unwrap();
        p.write_ahead(&ring, 1, &body_words(&[2u8; BODY])).unwrap();
        // The rest of the run is there, its first slot is not: no message.
        assert!(c.peek(&local).is_none());
        assert_eq!(c.peek_ahead(&local, 2).map(|b| b[0]), Some(3));
        p.write_ahead(&ring, 0, &body_words(&[1u8; BODY])).unwrap();
        p.produce(&ring, 3);
        assert_eq!(p.produced(), 3);
        let got: Vec<u8> = (0..3)
            .map(|k| c.peek_ahead(&local, k).map_or(0, |b| b[0]))
            .collect();
        assert_eq!(got, [1, 2, 3]);
        // The next write lands after the run.
        p.push(&peer, &[4u8; BODY]).unwrap();
        assert_eq!(c.peek_ahead(&local, 3).map(|b| b[0]), Some(4));
    }

    #[test]
    fn a_run_wraps_the_ring_and_is_produced_in_order() {
        let (local, peer) = windows(8192);
        let mut p = Producer::new(0, 8, 3, 4096);
        let mut c = Consumer::new(0, 8, 3);
        // Move both ends to slot 6, so the run of five wraps to slot 0.
        for i in 0..6u8 {
            p.push(&peer, &[i; BODY]).unwrap();
            assert_eq!(c.peek(&local).map(|b| b[0]), Some(i));
            c.advance();
        }
        c.credit(&peer, 4096).unwrap();
        assert_eq!(p.room(&local, 5), (true, true));
        let ring = p.span(&peer).unwrap();
        let bodies: Vec<Words> = (10..15u8).map(|i| body_words(&[i; BODY])).collect();
        p.write_run(&ring, &bodies).unwrap();
        assert_eq!(p.produced(), 11);
        let got: Vec<u8> = (0..6)
            .map(|k| c.peek_ahead(&local, k).map_or(0, |b| b[0]))
            .collect();
        assert_eq!(got, [10, 11, 12, 13, 14, 0], "five in order, nothing after");
    }

    #[test]
    fn stale_epoch_is_not_a_message() {
        let (local, peer) = windows(4096);
        let mut p = Producer::new(0, 4, 3, 1024);
        p.push(&peer, &[1u8; BODY]).unwrap();
        let c = Consumer::new(0, 4, 5);
        assert!(c.peek(&local).is_none());
        assert!(Consumer::new(0, 4, 3).peek(&local).is_some());
    }

    #[test]
    fn insane_credit_is_ignored() {
        let (local, peer) = windows(4096);
        let mut p = Producer::new(0, 4, 3, 1024);
        peer.write_u64(1024, tag(3, 1_000)).unwrap();
        for _ in 0..4 {
            p.push(&peer, &[0u8; BODY]).unwrap();
        }
        let (free, sane) = p.free(&local);
        assert_eq!(free, 0);
        assert!(!sane);
        // Backwards (below the 2 credited) is past what was produced too.
        peer.write_u64(1024, tag(3, 2)).unwrap();
        assert_eq!(p.free(&local), (2, true));
        peer.write_u64(1024, tag(3, 1)).unwrap();
        assert_eq!(p.room(&local, 3), (false, false));
        assert_eq!(p.credit(), 2);
    }

    /// A credit an earlier connection's consumer wrote (late, after the
    /// reset zeroed the word) credits nothing to this one, and is no
    /// nonsense: taken, it would have the producer overwrite slots the
    /// consumer never read.
    #[test]
    fn another_epochs_credit_credits_nothing() {
        let (local, peer) = windows(4096);
        let mut p = Producer::new(0, 4, 3, 1024);
        for _ in 0..4 {
            p.push(&peer, &[0u8; BODY]).unwrap();
        }
        peer.write_u64(1024, tag(5, 4)).unwrap();
        assert_eq!(p.free(&local), (0, true));
        peer.write_u64(1024, tag(3, 4)).unwrap();
        assert_eq!(p.free(&local), (4, true));
    }

    /// Progress past 2^32 messages: the low 32 bits wrap, the credit goes on.
    #[test]
    fn credits_follow_the_low_bits_across_their_wrap() {
        let (local, peer) = windows(4096);
        let mut p = Producer::new(0, 4, 3, 1024);
        p.seq = (1 << 32) - 2;
        p.credit = (1 << 32) - 2;
        for _ in 0..4 {
            p.push(&peer, &[0u8; BODY]).unwrap();
        }
        peer.write_u64(1024, tag(3, (1 << 32) + 1)).unwrap();
        assert_eq!(p.free(&local), (3, true));
        assert_eq!(p.credit(), (1 << 32) + 1);
    }

    #[test]
    fn free_entries_roundtrip() {
        let e = free_entry(7, 12, 3);
        assert_eq!(parse_free_entry(7, 12, e), Some(3));
        assert_eq!(parse_free_entry(7, 13, e), None);
        assert_eq!(parse_free_entry(9, 12, e), None);
        assert_eq!(parse_free_entry(7, 0, 0), None);
    }
}
