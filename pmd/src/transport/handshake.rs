//! Connecting to peers with posted writes only, and tearing connections down.
//!
//! Each side writes a [`Hello`] {magic, version, geometry, its incarnation,
//! the incarnation of ours it saw} into its mailbox in the peer's window: the
//! body first, then a tag (a counter) with a release store; the reader
//! copies the body and re-checks the tag (a torn hello is retried later). A
//! side is connected once it sees a hello that carries its own incarnation;
//! both then derive the same connection epoch from the two incarnations.
//!
//! Before a side answers a new incarnation it clears its section for that
//! peer, so nothing of an earlier connection survives. A new incarnation,
//! or a hello that no longer carries our incarnation, tears the connection
//! down: every operation involving the peer completes with
//! [`Status::PeerDown`], posted receives are flushed, served operations are
//! dropped (their regions freed), and the section is cleared. A link going
//! down tears it down the same way, but the peer may only have stalled (and
//! come back under the same generation without seeing a link change), so
//! what it may still write stays held, as after a connection we end on our
//! own while the peer may still be up (`start_over`: a wedge, a failed
//! store, a peer that stopped crediting; [`Status::Reset`]): the operations
//! we served until their deadline, the regions we advertised until the peer
//! holds nothing of that connection (`settle`) or two operation timeouts
//! pass. Both take a new incarnation of ours, so the next connection has a
//! new epoch.

use std::sync::atomic::{Ordering, fence};
use std::time::Instant;

use crate::hw::{LinkEvent, Port};

use super::conn::Conn;
use super::counters::DropKind;
use super::endpoint::{Transport, random_u64};
use super::error::Result;
use super::geometry::{DataPart, HEADER_SIZE, Part};
use super::ops::{InOp, OutKind};
use super::queue::zero_slots;
use super::types::Status;
use super::types::{Completion, OpKind, PeerState};
use super::wire::{BODY, Hello, TAG_OFFSET};

/// Protocol version spoken in hellos (2: inline sends may span up to four
/// consecutive PostQ slots; 3: one-sided writes — advertise, revoke,
/// write-with-immediate; 4: data queues, whose shape the hello carries;
/// 5: data descriptors up to three to a slot; 6: credit words tagged with
/// the connection's epoch).
pub const VERSION: u16 = 6;

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The connection epoch both sides derive from their incarnations (odd, so
/// never 0).
pub fn epoch(a: u64, b: u64) -> u32 {
    (mix(a.wrapping_add(b)) as u32) | 1
}

/// How often a peer may present a new incarnation, in hello intervals
/// (`Config::hello_interval`, 20 ms by default: once per 100 ms): a host
/// restarts far less often, and each new one has us wipe its section of our
/// window (the eager buffers included) and re-advertise our regions to it.
/// A peer's goodbye followed by a restart within it waits the rest of it.
pub(crate) const NEW_INCARNATION_HELLOS: u32 = 5;

impl Transport {
    pub(crate) fn write_header(&self) -> Result<()> {
        let g = &self.cfg.geometry;
        let mut h = [0u8; HEADER_SIZE];
        h[0..8].copy_from_slice(b"NTBDKXPT");
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&g.ports.to_le_bytes());
        h[12..16].copy_from_slice(&g.queue_depth.to_le_bytes());
        h[16..20].copy_from_slice(&g.eager_count.to_le_bytes());
        h[20..24].copy_from_slice(&g.eager_size.to_le_bytes());
        h[24..32].copy_from_slice(&(self.layout.region_area_start() as u64).to_le_bytes());
        h[32..34].copy_from_slice(&g.data.count.to_le_bytes());
        h[36..40].copy_from_slice(&g.data.nb_desc.to_le_bytes());
        h[40..44].copy_from_slice(&g.data.buf_size.to_le_bytes());
        self.local.write(0, &h)?;
        Ok(())
    }

    /// Clears our section for `peer` (its mailbox lies elsewhere and stays),
    /// except the data queues' receive buffers: the application may still
    /// hold some of them as received mbufs.
    pub(crate) fn reset_section(&self, peer: Port) -> Result<()> {
        // A host dropped from the fabric (its slot given to another) writes
        // nothing: on a shared region its window is the new owner's now.
        if self.check_tenure().is_err() {
            return Ok(());
        }
        let l = &self.layout;
        let start = l.section_offset(peer);
        self.zero_words(start, start + l.data_area())?;
        for q in 0..l.geometry().data.count {
            let block = l.data_part(peer, q, DataPart::Credit);
            self.zero_words(block, l.data_part(peer, q, DataPart::Bufs))?;
        }
        Ok(())
    }

    /// Zeroes bytes `start..end` of our window for a section being reset
    /// ([`zero_slots`]: tags before bodies, for the data-queue threads that
    /// may be reading it meanwhile).
    fn zero_words(&self, start: usize, end: usize) -> Result<()> {
        zero_slots(&self.local, start, end)?;
        Ok(())
    }

    fn hello(&self, peer: Port) -> Hello {
        let g = &self.cfg.geometry;
        Hello {
            version: VERSION,
            ports: g.ports,
            queue_depth: g.queue_depth,
            eager_count: g.eager_count,
            eager_size: g.eager_size,
            data: g.data,
            incarnation: self.peers[peer as usize].my_inc,
            seen: self.peers[peer as usize].peer_inc,
        }
    }

    /// Writes our hello into `peer`'s mailbox for us.
    pub(crate) fn send_hello(&mut self, peer: Port) {
        let body = self.hello(peer).encode();
        let off = self.layout.part(self.me, Part::Mailbox);
        let Ok(win) = self.dev.peer_window(peer, self.cfg.mw) else {
            return;
        };
        let p = &mut self.peers[peer as usize];
        p.hello_seq += 1;
        // Nonzero (hello_seq starts at 1) and different for every hello.
        let tag = (p.my_inc << 32) | (p.hello_seq & 0xffff_ffff).max(1);
        let r = win
            .write_u64(off + TAG_OFFSET, 0)
            .map(|_| win.wmb())
            .and_then(|_| win.write(off, &body))
            .and_then(|_| win.write_u64(off + TAG_OFFSET, tag));
        if r.is_ok() {
            p.last_hello_sent = Some(Instant::now());
        }
    }

    /// Tells every peer we are going away: a hello from a fresh incarnation
    /// that has seen nobody, so each peer tears its connection down at once
    /// (failing what involves us) instead of waiting for timeouts.
    pub(crate) fn say_goodbye(&mut self) {
        if self.lost {
            // Our place belongs to another host now: not a word to anyone.
            return;
        }
        self.incarnation = random_u64(self.incarnation);
        for p in 0..self.peers.len() as Port {
            self.peers[p as usize].my_inc = self.incarnation;
            if p != self.me && self.peers[p as usize].state != PeerState::Down {
                self.peers[p as usize].peer_inc = 0;
                self.send_hello(p);
            }
        }
    }

    pub(crate) fn link_up(&mut self, peer: Port, generation: u64) {
        let p = &mut self.peers[peer as usize];
        if p.link_gen != 0 && p.link_gen != generation {
            // A new generation of the link: the peer's device is a new one,
            // which holds nothing of an earlier connection.
            self.teardown(peer, Status::PeerDown);
            self.settle(peer);
        }
        let p = &mut self.peers[peer as usize];
        p.link_gen = generation;
        if p.conn.is_none() && !matches!(p.state, PeerState::Failed(_)) {
            p.state = PeerState::Connecting;
        }
        self.send_hello(peer);
    }

    /// The peer's link went down. It may only have stalled, and come back
    /// under the same generation without having seen a link change (the
    /// emulated fabric declares a silent host down a while before it gives
    /// its place away; an Intel link flap one side misses): what we
    /// advertised to it stays unreleased until it holds nothing of the old
    /// connection ([`settle`](Self::settle): it connects again, its device
    /// is a new generation, or two operation timeouts pass), and the next
    /// connection is under a new incarnation of ours, so a new epoch: no
    /// late word of the old connection is taken for the next one's.
    pub(crate) fn link_down(&mut self, peer: Port) {
        let had_conn = self.peers[peer as usize].conn.is_some();
        self.teardown(peer, Status::PeerDown);
        let p = &mut self.peers[peer as usize];
        if had_conn {
            p.unsettled_since.get_or_insert_with(Instant::now);
        }
        p.my_inc = random_u64(p.my_inc);
        p.forget_inc();
        p.state = PeerState::Down;
    }

    pub(crate) fn handle_link_events(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        self.dev.poll_link_events(&mut events);
        for e in events.drain(..) {
            match e {
                LinkEvent::Up { peer, generation }
                    if (peer as usize) < self.peers.len() && peer != self.me =>
                {
                    self.link_up(peer, generation)
                }
                // A down event of an older generation than the one we
                // know is stale.
                LinkEvent::Down { peer, generation }
                    if (peer as usize) < self.peers.len()
                        && peer != self.me
                        && matches!(self.peers[peer as usize].link_gen, 0)
                            | (self.peers[peer as usize].link_gen == generation) =>
                {
                    self.link_down(peer)
                }
                _ => {}
            }
        }
        self.events = events;
    }

    /// Reads a new hello from `peer`, if one arrived.
    pub(crate) fn poll_hello(&mut self, peer: Port) {
        let off = self.layout.part(peer, Part::Mailbox);
        let Ok(tag) = self.local.load_u64(off + TAG_OFFSET) else {
            return;
        };
        if tag == 0 || tag == self.peers[peer as usize].last_hello_tag {
            return;
        }
        let mut body = [0u8; BODY];
        if self.local.read(off, &mut body).is_err() {
            return;
        }
        fence(Ordering::Acquire);
        if self.local.load_u64(off + TAG_OFFSET).ok() != Some(tag) {
            return; // torn: being rewritten, read it next time
        }
        self.peers[peer as usize].last_hello_tag = tag;
        let Some(h) = Hello::decode(&body) else {
            self.peers[peer as usize]
                .counters
                .drop_one(DropKind::Malformed);
            return;
        };
        let g = &self.cfg.geometry;
        let mismatch = if h.version != VERSION {
            Some(format!(
                "peer speaks protocol version {}, we speak {VERSION}",
                h.version
            ))
        } else if (h.ports, h.queue_depth, h.eager_count, h.eager_size, h.data)
            != (g.ports, g.queue_depth, g.eager_count, g.eager_size, g.data)
        {
            Some(format!(
                "peer geometry (ports {}, queue depth {}, {} eager buffers of {} B, {} data queues of {} x {} B) differs from ours (ports {}, queue depth {}, {} eager buffers of {} B, {} data queues of {} x {} B)",
                h.ports,
                h.queue_depth,
                h.eager_count,
                h.eager_size,
                h.data.count,
                h.data.nb_desc,
                h.data.buf_size,
                g.ports,
                g.queue_depth,
                g.eager_count,
                g.eager_size,
                g.data.count,
                g.data.nb_desc,
                g.data.buf_size
            ))
        } else {
            None
        };
        if let Some(reason) = mismatch {
            // A hello from a host of another make: a new transport there.
            self.teardown(peer, Status::PeerDown);
            self.settle(peer);
            let p = &mut self.peers[peer as usize];
            if !matches!(p.state, PeerState::Failed(_)) {
                tracing::warn!(peer, %reason, "transport handshake failed");
            }
            p.state = PeerState::Failed(reason);
            if p.peer_inc != h.incarnation {
                p.peer_inc = h.incarnation;
                self.send_hello(peer);
            }
            return;
        }
        if h.incarnation != self.peers[peer as usize].peer_inc {
            let now = Instant::now();
            let p = &mut self.peers[peer as usize];
            // Saturating: a `hello_interval` of `Duration::MAX` means never.
            let every = self
                .cfg
                .hello_interval
                .saturating_mul(NEW_INCARNATION_HELLOS);
            let returning = h.incarnation == p.forgotten_inc;
            if !returning
                && p.new_incarnation_at
                    .is_some_and(|t| now.duration_since(t) < every)
            {
                // Too soon after the last one: read again at a later poll
                // (a peer changing incarnation at every hello would
                // otherwise have us wipe its section at every one).
                p.last_hello_tag = 0;
                return;
            }
            p.new_incarnation_at = Some(now);
            // A new incarnation: forget everything of the old one (the
            // section is wiped once: by the teardown of a connection, else
            // here).
            let connected = p.conn.is_some();
            self.teardown(peer, Status::PeerDown);
            self.settle(peer);
            if !connected {
                let _ = self.reset_section(peer);
            }
            let p = &mut self.peers[peer as usize];
            p.peer_inc = h.incarnation;
            p.state = PeerState::Connecting;
            if h.seen == self.peers[peer as usize].my_inc {
                self.connect(peer);
            }
            self.send_hello(peer);
            return;
        }
        let connected = self.peers[peer as usize].conn.is_some();
        let mine = self.peers[peer as usize].my_inc;
        if connected && h.seen != mine {
            // The peer restarted its view of us (its connection to us is
            // gone): start over.
            self.teardown(peer, Status::PeerDown);
            self.settle(peer);
            let _ = self.reset_section(peer);
            self.peers[peer as usize].state = PeerState::Connecting;
            self.send_hello(peer);
        } else if !connected && h.seen == mine {
            self.connect(peer);
            self.send_hello(peer);
        } else if !connected {
            self.send_hello(peer);
        }
    }

    fn connect(&mut self, peer: Port) {
        // A failed attempt (a device error) reads the peer's hello again at
        // the next slow path: the peer, connected already, sends no new one.
        let Ok(win) = self.dev.peer_window(peer, self.cfg.mw) else {
            self.peers[peer as usize].last_hello_tag = 0;
            return;
        };
        let p = &mut self.peers[peer as usize];
        let e = epoch(p.my_inc, p.peer_inc);
        let mut c = Conn::new(&self.layout, self.me, peer, win, e);
        if !c.lend_all() {
            p.last_hello_tag = 0;
            return;
        }
        p.conn = Some(c);
        p.state = PeerState::Connected;
        p.watch.up(e);
        p.counters.connects += 1;
        if !self.connected.contains(&peer) {
            self.connected.push(peer);
        }
        tracing::debug!(me = self.me, peer, epoch = e, "transport connected");
        // The peer answered our current incarnation, so its side of any
        // earlier connection is gone.
        self.settle(peer);
        self.advertise_to(peer);
    }

    /// Resets the connection with `peer` after its rings stopped making
    /// progress (a slot or credit lost or corrupted): what involves it
    /// fails with [`Status::Reset`], and we start over towards it as a new
    /// incarnation, so both sides reconnect under a fresh epoch and nothing
    /// of the wedged connection is taken for a new message.
    pub(crate) fn resync(&mut self, peer: Port) {
        tracing::warn!(
            me = self.me,
            peer,
            "transport connection made no progress: resetting it"
        );
        self.peers[peer as usize].counters.resyncs += 1;
        self.start_over(peer, Status::Reset);
    }

    /// Ends a connection the peer may still hold (what involves it fails
    /// with `status`) and starts over towards it as a new incarnation: the
    /// peer, seeing it, ends its side too, and both reconnect under a
    /// fresh epoch. Until it does, what we advertised to it stays void but
    /// unreleased (see [`settle`](Self::settle)).
    pub(crate) fn start_over(&mut self, peer: Port, status: Status) {
        if self.peers[peer as usize].conn.is_none() {
            return; // already ended (doomed twice in one poll)
        }
        self.teardown(peer, status);
        let p = &mut self.peers[peer as usize];
        p.unsettled_since.get_or_insert_with(Instant::now);
        p.my_inc = random_u64(p.my_inc);
        p.state = PeerState::Connecting;
        self.send_hello(peer);
    }

    /// `peer` holds nothing of an earlier connection with us any more (it
    /// is gone, restarted, or has connected again): what we advertised to
    /// it is void, and revocations it had not acknowledged complete.
    ///
    /// Not part of [`teardown`](Self::teardown): a connection we end
    /// ourselves (a wedge, a broken ring) may still be alive at the peer,
    /// which may go on writing the regions it knows until it sees our new
    /// incarnation. Their bytes stay out of the area until then.
    pub(crate) fn settle(&mut self, peer: Port) {
        self.peers[peer as usize].unsettled_since = None;
        self.regions.forget_peer(peer);
        // Our reads' destinations set aside because `peer`, their target,
        // might still copy into them: it serves them within its connection
        // with us, which is over. Not a chain link's storage (`origin` not
        // us): the previous link forwards into it within its connection
        // with the initiator, which ours with it says nothing about.
        let me = self.me;
        self.free_kept(|k| k.prev == peer && k.origin == me);
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.orphans)
            .into_iter()
            .partition(|&(p, _, _)| p == peer);
        self.orphans = rest;
        for (_, op, io) in mine {
            self.served_abandoned(peer, op, io);
        }
    }

    /// Ends the connection with `peer` (if any): fails what involves it.
    pub(crate) fn teardown(&mut self, peer: Port, status: Status) {
        // A reset asked for the connection ending here is done: it must not
        // end the next one (a failed post, then the peer's new incarnation
        // connected in the same poll, before the reset requests are taken).
        self.doomed.retain(|&q| q != peer);
        self.forget_early(peer);
        self.parked.forget_peer(peer);
        let p = &mut self.peers[peer as usize];
        let conn = p.conn.take();
        p.watch.down();
        self.connected.retain(|&q| q != peer);
        let Some(conn) = conn else { return };
        p.counters.disconnects += 1;
        if p.state == PeerState::Connected {
            p.state = PeerState::Connecting;
        }
        // What we served keeps its hold until its deadline, or until the
        // peer is known to be done with this connection (the callers that
        // know it settle at once).
        // A chain link whose previous link is another peer goes to the
        // storage set aside at once (`served_abandoned`), where that link's
        // `ChainDone` or `ChainRelease` still finds it.
        let now = Instant::now();
        for (op, io) in conn.into_served() {
            let other_writer =
                matches!(&io, InOp::McRecv { chain: Some(ch), .. } if ch.prev != peer);
            if io.deadline() <= now || other_writer {
                self.served_abandoned(peer, op, io);
            } else {
                self.orphans.push((peer, op, io));
            }
        }
        self.flush_recvs(peer);
        let ids: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.involves(peer))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let multicast = matches!(
                self.ops.get(&id).map(|o| &o.kind),
                Some(OutKind::Multicast { .. })
            );
            if multicast {
                self.mc_target_failed(id, peer, status);
            } else {
                self.finish(id, status, 0);
            }
        }
        let _ = self.reset_section(peer);
        tracing::debug!(me = self.me, peer, "transport disconnected");
    }

    /// Completes the receives posted for `peer` as `Flushed` (its
    /// connection ended, or we lost our place on the fabric).
    pub(crate) fn flush_recvs(&mut self, peer: Port) {
        let recvs = std::mem::take(&mut self.peers[peer as usize].recvs);
        for r in recvs {
            self.completions.push_back(Completion {
                peer,
                op: OpKind::Recv,
                status: Status::Flushed,
                bytes: 0,
                cookie: r.cookie,
                region: None,
            });
        }
    }
}
