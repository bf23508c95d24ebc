//! One-sided writes (RDMA write, seed 004's direct placement into a remote
//! address range), beside the rendezvous write of EP 3025241.
//!
//! A target advertises each region registered with remote-write access —
//! contiguous, in the peer's protection domain — to the peer once
//! (`Advertise`: key → its extent in the window). The initiator then writes
//! straight into it with posted writes, checking key, bounds and
//! permission first (an honest peer never writes outside a region), and
//! completes at once; only when asked, a `WriteImm` on the target's RX ring,
//! written after the data, tells the target's application (verbs' write
//! with immediate). Deregistering an advertised region sends `Revoke`; its
//! bytes return to the area only once every peer has answered `RevokeAck`
//! or is gone (left, restarted, or connected again, which it does only
//! once its side of the old connection has ended), so a late write never
//! lands in reused memory. One limit: a peer whose link dropped and that
//! never comes back is taken for gone after two operation timeouts
//! (`Config::op_timeout`); a peer stalled longer than that and then
//! resumed could still write the old bytes.
//!
//! Threat model: on an NTB a peer can write anywhere in a window it maps;
//! what the target guarantees is that nothing a peer writes makes it read
//! or write outside its window, panic, hang or corrupt its control state —
//! not that region contents are private. A `WriteImm` for a region not
//! registered for that peer is dropped and counted, unless the region was
//! deregistered lately (one of the last `RETIRED_KEPT`): the notice of an
//! honest write can arrive after its region's revocation ended.

use crate::hw::{HwError, Port, WindowSpan};

use super::conn::Conn;
use super::counters::DropKind;
use super::endpoint::Transport;
use super::error::{Result, TransportError};
use super::key::{Access, RegionKey};
use super::sgl::RemoteAddr;
use super::types::{Completion, DirectWr, OpKind, Qp, Status};
use super::wire::{Msg, Ring};

impl Transport {
    /// Writes `data` straight into the peer's advertised region
    /// `remote.key` at `remote.offset` (posted writes; no rendezvous), and,
    /// with `imm`, then tells the peer's application with a
    /// [`OpKind::WriteImm`] completion carrying `imm` (ordered after the
    /// data). Completes with [`OpKind::WriteDirect`] as soon as the data is
    /// posted.
    ///
    /// The notice travels as a message: if the connection resets before the
    /// peer takes it (still waiting in our backlog for the peer's credits,
    /// or unread in its ring), it is lost, though this write completed. The
    /// peer's application learns of the reset itself (its receives flushed,
    /// its operations with this host failed), not of each lost notice. A
    /// notice that reaches the peer after its application deregistered the
    /// region is dropped there too, uncounted (nobody is at fault) as long
    /// as the region is among the peer's last 64 deregistered; past that it
    /// counts as an access drop.
    ///
    /// Fails at once, writing nothing, when the peer has not advertised the
    /// key to us ([`TransportError::UnknownRemoteKey`]) or the range leaves
    /// the region ([`TransportError::RemoteOutOfRange`]).
    pub fn post_write_direct(
        &mut self,
        qp: Qp,
        data: &[u8],
        remote: RemoteAddr,
        imm: Option<u64>,
        cookie: u64,
    ) -> Result<()> {
        let wr = DirectWr {
            data,
            remote,
            imm,
            signaled: true,
            cookie,
        };
        // One write: the batch's steps without its bookkeeping, the
        // ping-pong's path (`ib_write_lat` posts one write at a time).
        self.check_post(qp)?;
        let peer = qp.peer;
        let nt_threshold = self.cfg.nt_threshold;
        let Some(c) = self.peers[peer as usize].conn.as_ref() else {
            return Err(TransportError::NotConnected { peer });
        };
        if let Err(stop) = place(c, &mut None, peer, &wr, 0, nt_threshold) {
            return Err(self.stopped(peer, stop));
        }
        self.placed(peer, &wr);
        self.ring_doorbell(peer);
        Ok(())
    }

    /// Posts a batch of one-sided writes (each as
    /// [`post_write_direct`](Self::post_write_direct), signaled or not as
    /// it says), ringing the doorbell (if configured) once. Returns how
    /// many were posted: all, unless one fails its checks, which stops the
    /// batch there (its error is returned when it was the first).
    ///
    /// The window admits a region once for the stream of writes into it,
    /// across calls, and each call re-checks only what can have changed
    /// since (once per run of writes into one region: see
    /// [`Admitted`](crate::hw::Admitted)); the immediates are written
    /// after all the batch's data, so each still follows its own.
    pub fn post_writes_direct(&mut self, qp: Qp, wrs: &[DirectWr<'_>]) -> Result<usize> {
        self.check_post(qp)?;
        let peer = qp.peer;
        let nt_threshold = self.cfg.nt_threshold;
        let Some(c) = self.peers[peer as usize].conn.as_ref() else {
            return Err(TransportError::NotConnected { peer });
        };
        let mut n = 0;
        // Immediates placed so far: their notices are emitted after the
        // batch's data, so each write's room check counts them.
        let mut imms = 0;
        let mut stopped = None;
        let mut target = None;
        for wr in wrs {
            if let Err(stop) = place(c, &mut target, peer, wr, imms, nt_threshold) {
                stopped = Some(stop);
                break;
            }
            imms += usize::from(wr.imm.is_some());
            n += 1;
        }
        let stopped = stopped.map(|stop| self.stopped(peer, stop));
        for wr in &wrs[..n] {
            self.placed(peer, wr);
        }
        if n > 0 {
            self.ring_doorbell(peer);
        }
        match stopped {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// A write [`place`] refused: its error, the peer doomed when the
    /// window refused what the peer advertised (out of line: the rare
    /// case).
    #[cold]
    #[inline(never)]
    fn stopped(&mut self, peer: Port, stop: Stop) -> TransportError {
        match stop {
            Stop::Refused(e) => e,
            Stop::Broken(e) => {
                self.doomed.push(peer);
                e
            }
        }
    }

    /// After [`place`]: the immediate's notice (written after the data's
    /// stores, its slot published by a release store, so the peer sees
    /// the data first), the counters, and the completion when signaled.
    #[inline]
    fn placed(&mut self, peer: Port, wr: &DirectWr<'_>) {
        let len = wr.data.len() as u64;
        if let Some(imm) = wr.imm {
            self.emit(
                peer,
                Ring::Rx,
                &Msg::WriteImm {
                    rkey: wr.remote.key.0,
                    roff: wr.remote.offset,
                    len: len as u32,
                    imm,
                },
            );
        }
        let counters = &mut self.peers[peer as usize].counters;
        counters.writes += 1;
        counters.bytes_out += len;
        if wr.signaled {
            self.completions.push_back(Completion {
                peer,
                op: OpKind::WriteDirect,
                status: Status::Success,
                bytes: len,
                cookie: wr.cookie,
                region: None,
            });
        }
    }

    /// Advertises to `peer` the regions it may write one-sided that it was
    /// not told of yet (when it connects).
    pub(crate) fn advertise_to(&mut self, peer: Port) {
        if self.peers[peer as usize].conn.is_none() {
            return;
        }
        for found in self.regions.advertise_to(peer) {
            self.send_advertise(peer, found);
        }
    }

    /// Advertises the new region `key` to every connected peer it is for.
    pub(crate) fn advertise_new(&mut self, key: RegionKey) {
        for i in 0..self.connected.len() {
            let p = self.connected[i];
            if let Some(found) = self.regions.advertise_one(key, p) {
                self.send_advertise(p, found);
            }
        }
    }

    fn send_advertise(&mut self, peer: Port, (key, offset, len): (RegionKey, u64, u32)) {
        self.emit(
            peer,
            Ring::Tx,
            &Msg::Advertise {
                rkey: key.0,
                offset,
                len,
            },
        );
    }

    /// Revokes `key` at `peers` (after a deregister). A peer still listed
    /// while not connected is one whose connection we ended ourselves: it
    /// may still write what it knows until it sees our new incarnation, so
    /// its acknowledgement is the end of that connection at its side
    /// ([`settle`](Self::settle)), not an answer.
    pub(crate) fn revoke(&mut self, key: RegionKey, peers: &[Port]) {
        for &p in peers {
            if self.peers[p as usize].conn.is_some() {
                self.emit(p, Ring::Tx, &Msg::Revoke { rkey: key.0 });
            }
        }
    }

    /// `Advertise` from `p`: remember where its region is (refused and
    /// counted as an overload past [`MAX_REMOTE_REGIONS`](super::region::MAX_REMOTE_REGIONS)).
    pub(crate) fn on_advertise(&mut self, p: Port, rkey: u32, offset: u64, len: u32) {
        if let Some(c) = self.peers[p as usize].conn.as_mut()
            && !c.learn_region(rkey, offset, len)
        {
            self.count(p, DropKind::Overload);
        }
    }

    /// `Revoke` from `p`: forget the region, then acknowledge (our later
    /// writes can no longer name it). A key we do not know (one we refused
    /// past [`MAX_REMOTE_REGIONS`](super::region::MAX_REMOTE_REGIONS), or
    /// nonsense) is counted and acknowledged all the same: we write nothing
    /// to it, and the peer holds the region's bytes until we say so.
    pub(crate) fn on_revoke(&mut self, p: Port, rkey: u32) {
        let Some(c) = self.peers[p as usize].conn.as_mut() else {
            return;
        };
        if !c.forget_region(rkey) {
            self.count(p, DropKind::UnknownOp);
        }
        self.emit(p, Ring::Cq, &Msg::RevokeAck { rkey });
    }

    /// `RevokeAck` from `p`. One for no revocation waiting on `p` (never
    /// sent by an honest peer: a forged or repeated one) is counted.
    pub(crate) fn on_revoke_ack(&mut self, p: Port, rkey: u32) {
        if !self.regions.revoke_acked(RegionKey(rkey), p) {
            self.count(p, DropKind::UnknownOp);
        }
    }

    /// `WriteImm` from `p`: its one-sided write is in our region; tell the
    /// application, if the region is one `p` may write and the completion
    /// queue is not at its depth (`Config::cq_depth`: notices come unasked,
    /// so a peer could otherwise pile them up without bound; multicast
    /// deliveries are checked the same way).
    pub(crate) fn on_write_imm(&mut self, p: Port, rkey: u32, roff: u64, len: u32, imm: u64) {
        let key = RegionKey(rkey);
        if self
            .regions
            .admitted(p, key, roff, u64::from(len), Access::REMOTE_WRITE)
            .is_err()
        {
            // A notice for a region our application has deregistered since
            // (the write landed before; the notice waited for credits, or
            // behind the acknowledgement): not the writer's fault, and
            // nobody to tell.
            if self.regions.was_deregistered(key) {
                return;
            }
            return self.count(p, DropKind::Access);
        }
        if self.completions.len() >= self.cfg.cq_depth {
            return self.notice_overrun(p);
        }
        let counters = &mut self.peers[p as usize].counters;
        counters.served += 1;
        counters.bytes_in += u64::from(len);
        self.completions.push_back(Completion {
            peer: p,
            op: OpKind::WriteImm,
            status: Status::Success,
            bytes: u64::from(len),
            cookie: imm,
            region: Some(key),
        });
    }

    /// A notice from `p` found the completion queue at its depth: counted,
    /// and said once per overrun (until polling takes the queue below its
    /// depth again).
    #[cold]
    pub(crate) fn notice_overrun(&mut self, p: Port) {
        self.count(p, DropKind::Overload);
        if !self.cq_overrun {
            self.cq_overrun = true;
            tracing::warn!(
                peer = p,
                depth = self.cfg.cq_depth,
                "completion queue full: write-with-immediate notices are dropped \
                 until the application polls its completions (raise Config::cq_depth, \
                 or poll more often)"
            );
        }
    }
}

/// Why [`place`] wrote nothing.
enum Stop {
    /// The write's own fault (unknown key, size, range): nothing else is
    /// wrong.
    Refused(TransportError),
    /// The window refused what the peer advertised: the connection is
    /// broken.
    Broken(TransportError),
}

/// Places one write's bytes in the peer's region, after checking the key
/// first (a caller may probe whether a region is known yet with an empty
/// write), then the size and the range. `target` is the region the
/// previous write of the call went to (its key and span): writes into the
/// same region reuse its span, checked once per call as
/// [`crate::hw::PeerWindow::span`] checks (see [`Conn::remote_span`]).
/// `imms_before` counts the batch's earlier immediates, whose notices are
/// not queued yet.
#[inline(always)]
fn place<'w>(
    c: &'w Conn,
    target: &mut Option<(u32, WindowSpan<'w>)>,
    peer: Port,
    wr: &DirectWr<'_>,
    imms_before: usize,
    nt_threshold: usize,
) -> std::result::Result<(), Stop> {
    let key = wr.remote.key;
    let span = match *target {
        Some((k, span)) if k == key.0 => span,
        _ => match c.remote_span(key.0) {
            Some(Ok(span)) => target.insert((key.0, span)).1,
            // The peer's table mid-edit at every look: no answer, not a
            // refusal; the write is posted again later.
            Some(Err(HwError::GrantTableBusy { .. })) => return Err(table_busy(peer)),
            Some(Err(e)) => return Err(Stop::Broken(e.into())),
            None => {
                return Err(Stop::Refused(TransportError::UnknownRemoteKey {
                    peer,
                    key,
                }));
            }
        },
    };
    let len = wr.data.len() as u64;
    if len == 0 || len > u64::from(u32::MAX) {
        return Err(Stop::Refused(TransportError::TransferSize { len }));
    }
    // The immediate's notice waits for credits like any message: past the
    // room a post may take of the backlog, the write waits too (`Busy`).
    if wr.imm.is_some() && !c.sgl_fits(Ring::Rx, imms_before + 1) {
        return Err(Stop::Refused(TransportError::backlog_busy(peer)));
    }
    // Regions are at most `u32::MAX` bytes (their advertisement's length
    // field).
    let region_len = span.len() as u32;
    if wr
        .remote
        .offset
        .checked_add(len)
        .is_none_or(|end| end > u64::from(region_len))
    {
        return Err(Stop::Refused(TransportError::RemoteOutOfRange {
            peer,
            key,
            offset: wr.remote.offset,
            len,
            region_len,
        }));
    }
    let at = wr.remote.offset as usize;
    let written = if wr.data.len() >= nt_threshold {
        c.win().write_nt(span.offset() + at, wr.data)
    } else {
        span.write(at, wr.data)
    };
    written.map_err(|e| match e {
        // A non-temporal write is admitted again by the live table: one
        // edited since `remote_span` and mid-edit at every look is no
        // answer yet, as above.
        HwError::GrantTableBusy { .. } => table_busy(peer),
        e => Stop::Broken(e.into()),
    })
}

/// The peer's grant table was mid-edit at every look: no answer yet, not a
/// refusal; the write is posted again later.
fn table_busy(peer: Port) -> Stop {
    Stop::Refused(TransportError::Busy {
        peer,
        what: "the peer's grant table was being edited",
    })
}
