//! Posting work: writes, reads, sends and receives (multicast puts are in
//! `multicast.rs`). A post checks its arguments, records the operation and
//! writes its first message; the poll loop moves it along from there.

use std::time::Instant;

use crate::hw::Port;

use super::conn::{EagerBuffers, SGL_BACKLOG_ROOM};
use super::endpoint::Transport;
use super::error::{Result, TransportError};
use super::geometry::Part;
use super::key::{Access, RegionKey};
use super::ops::{OutKind, PostedRecv};
use super::region::{Extents, in_extent};
use super::sgl::{ExtentCursor, RemoteAddr, Sge};
use super::types::{Completion, OpKind, Qp, RecvWr, SendWr, Status, WriteWr};
use super::wire::{self, Msg, Ring};

impl Transport {
    /// Writes the bytes of `local` (our regions) into `remote` (the peer's
    /// region) — the rendezvous write: intent → the peer's SGL → one copy
    /// straight into its region → done → received. Completes with
    /// [`OpKind::Write`].
    pub fn post_write(
        &mut self,
        qp: Qp,
        local: &[Sge],
        remote: RemoteAddr,
        cookie: u64,
    ) -> Result<()> {
        self.post_writes(
            qp,
            &[WriteWr {
                local,
                remote,
                cookie,
            }],
        )
        .map(|_| ())
    }

    /// Posts a batch of writes: all intents are written back to back, then
    /// the doorbell (if configured) rings once. Returns how many were posted
    /// (all, unless an error stops the batch; the error is returned when
    /// none was).
    pub fn post_writes(&mut self, qp: Qp, wrs: &[WriteWr<'_>]) -> Result<usize> {
        if wrs.is_empty() {
            return Ok(0);
        }
        let mut n = 0;
        // One clock read for the batch (the copy windows then start no
        // later than each write's own post).
        let posted = Instant::now();
        for wr in wrs {
            let r = self
                .check_op_post(qp)
                .and_then(|_| self.backlog_room(qp.peer, Ring::Rx, 1))
                .and_then(|_| self.resolve_sges(wr.local, Access::LOCAL_READ))
                .and_then(|(ext, len)| remote_end(wr.remote, len).map(|()| (ext, len)));
            let (ext, len) = match r {
                Ok(x) => x,
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            };
            let op = self.new_op(
                wr.cookie,
                OutKind::Write {
                    peer: qp.peer,
                    src: ExtentCursor::new(ext),
                    len,
                    delivered: 0,
                    done: false,
                    posted,
                },
            );
            let msg = Msg::WriteReq {
                op,
                rkey: wr.remote.key.0,
                roff: wr.remote.offset,
                len,
            };
            self.emit(qp.peer, Ring::Rx, &msg);
            n += 1;
        }
        self.ring_doorbell(qp.peer);
        Ok(n)
    }

    /// Reads `remote` (the peer's region, remote read) into `local` (our
    /// regions, local write); the size is the total of `local`. We send our
    /// SGL; the peer copies straight into it. Completes with [`OpKind::Read`].
    ///
    /// A read that fails (a timeout above all) may still be served late: a
    /// target that reads the request only then copies into `local`, up to
    /// two more [`Config::op_timeout`](super::Config::op_timeout)s after the
    /// failure for a live, polling target. Keep `local` registered and
    /// unused that long (as the transport does with the destination of a
    /// [`post_read_unknown`](Self::post_read_unknown) that failed).
    ///
    /// `local` scattered into so many small extents that the SGL would take
    /// more than half the control backlog towards the peer fails with
    /// [`TransportError::SglTooLong`]; with [`TransportError::Busy`] when
    /// it fits only once the messages waiting for the peer's credits drain.
    pub fn post_read(
        &mut self,
        qp: Qp,
        local: &[Sge],
        remote: RemoteAddr,
        cookie: u64,
    ) -> Result<()> {
        self.check_op_post(qp)?;
        let (ext, len) = self.resolve_sges(local, Access::LOCAL_WRITE)?;
        remote_end(remote, len)?;
        // The target writes our destination: it must be in its domain (the
        // device would refuse its stores otherwise).
        if let Some(s) = local
            .iter()
            .find(|s| self.regions.get(s.key).is_some_and(|r| !r.admits(qp.peer)))
        {
            return Err(TransportError::NotInDomain {
                key: s.key,
                peer: qp.peer,
            });
        }
        // The request and our SGL must fit the backlog towards the peer (a
        // longer one would overflow it and reset the connection).
        let msgs = Self::read_req_msgs(&ext);
        if msgs > SGL_BACKLOG_ROOM {
            return Err(TransportError::SglTooLong {
                msgs,
                max: SGL_BACKLOG_ROOM,
            });
        }
        self.backlog_room(qp.peer, Ring::Tx, msgs)?;
        let op = self.new_op(
            cookie,
            OutKind::Read {
                peer: qp.peer,
                len,
                region: None,
            },
        );
        self.send_read_req(qp.peer, op, remote.key.0, remote.offset, len, &ext);
        self.ring_doorbell(qp.peer);
        Ok(())
    }

    /// Messages [`send_read_req`](Self::send_read_req) writes for `ext`:
    /// the request and our SGL.
    pub(crate) fn read_req_msgs(ext: &[(u64, u64)]) -> usize {
        wire::sgl_msgs(ext) + 1
    }

    /// Writes a read request and our SGL (the extents the peer copies
    /// into) to `peer`'s TX ring.
    pub(crate) fn send_read_req(
        &mut self,
        peer: Port,
        op: u64,
        rkey: u32,
        roff: u64,
        len: u32,
        ext: &[(u64, u64)],
    ) {
        self.emit(
            peer,
            Ring::Tx,
            &Msg::ReadReq {
                op,
                rkey,
                roff,
                len,
            },
        );
        let mut msgs = Vec::new();
        wire::chunk_sgl(ext, |start, n, sges| {
            msgs.push(Msg::ReadSgl { op, start, n, sges })
        });
        for m in &msgs {
            self.emit(peer, Ring::Tx, m);
        }
    }

    /// Reads the peer's region `remote.key` from `remote.offset` to its end,
    /// without knowing the size: the peer tells it, we allocate a region of
    /// that size (refusing more than `max_len`), then read as
    /// [`post_read`](Self::post_read). Completes with
    /// [`OpKind::ReadUnknown`] and the new region in
    /// [`Completion::region`]. Fails with [`TransportError::Busy`] while
    /// the control messages waiting for the peer's credits leave no room
    /// for its request.
    pub fn post_read_unknown(
        &mut self,
        qp: Qp,
        remote: RemoteAddr,
        max_len: u64,
        cookie: u64,
    ) -> Result<()> {
        self.check_op_post(qp)?;
        // Its one request must fit the backlog towards the peer, as
        // `post_read`'s do (past the backlog's limit the connection resets).
        self.backlog_room(qp.peer, Ring::Tx, 1)?;
        let op = self.new_op(
            cookie,
            OutKind::ReadSize {
                peer: qp.peer,
                rkey: remote.key.0,
                roff: remote.offset,
                max_len,
            },
        );
        let msg = Msg::ReadIntent {
            op,
            rkey: remote.key.0,
            roff: remote.offset,
        };
        self.emit(qp.peer, Ring::Tx, &msg);
        self.ring_doorbell(qp.peer);
        Ok(())
    }

    /// Sends a small message (at most `eager_size` bytes), copied now (with
    /// [`Config::signal_sends`](super::Config::signal_sends) off, nothing
    /// completes: the send is done when this returns; a batch's
    /// [`SendWr::signaled`] asks for a completion per send): up to
    /// 48 bytes inline in one PostQ slot (one cache line), up to
    /// `wire::INLINE_LONG_MAX` (216) bytes inline in up to four
    /// consecutive slots, else into an eager buffer the peer lent us plus a
    /// slot. Completes with
    /// [`OpKind::Send`] at once; fails with [`TransportError::Busy`] when
    /// the peer's PostQ or our eager buffers are exhausted.
    pub fn post_send(&mut self, qp: Qp, data: &[u8], cookie: u64) -> Result<()> {
        let wr = SendWr {
            data,
            cookie,
            signaled: false,
        };
        self.sends(qp, &[wr]).map(|_| ())
    }

    /// Posts a batch of sends back to back, ringing the doorbell (if
    /// configured) once. Returns how many were posted; stops at the first
    /// that finds no room (the error is returned if that was the first).
    ///
    /// The batch's slots are written last-first, its first slot last: the
    /// peer, polling that slot, finds the whole batch there at once and
    /// streams through it, instead of chasing the writer line by line (two
    /// cores contending for the line being written is what limits a
    /// message rate, not the work on either side).
    pub fn post_sends(&mut self, qp: Qp, wrs: &[SendWr<'_>]) -> Result<usize> {
        self.sends(qp, wrs)
    }

    /// [`post_sends`](Self::post_sends)' body, inlined into it and into
    /// [`post_send`](Self::post_send), where the batch of one makes its
    /// loops straight-line code.
    #[inline(always)]
    fn sends(&mut self, qp: Qp, wrs: &[SendWr<'_>]) -> Result<usize> {
        self.check_post(qp)?;
        let eager = EagerBuffers {
            base: self.layout.part(self.me, Part::Eager),
            size: self.cfg.geometry.eager_size as usize,
        };
        let peer = &mut self.peers[qp.peer as usize];
        let Some(c) = peer.conn.as_mut() else {
            return Err(TransportError::NotConnected { peer: qp.peer });
        };
        let stage = &mut self.send_stage;
        let batch = c.write_sends(&self.local, eager, wrs, stage, &mut peer.counters);
        if batch.broken {
            self.doomed.push(qp.peer);
        }
        let n = batch.posted;
        let posted = &wrs[..n];
        peer.counters.sends += n as u64;
        peer.counters.bytes_out += posted.iter().map(|wr| wr.data.len() as u64).sum::<u64>();
        let all = self.cfg.signal_sends;
        // One reservation for the batch's completions.
        self.completions
            .extend(
                posted
                    .iter()
                    .filter(|wr| all || wr.signaled)
                    .map(|wr| Completion {
                        peer: qp.peer,
                        op: OpKind::Send,
                        status: Status::Success,
                        bytes: wr.data.len() as u64,
                        cookie: wr.cookie,
                        region: None,
                    }),
            );
        if n > 0 {
            self.ring_doorbell(qp.peer);
        }
        match batch.stopped {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Posts a receive buffer (local write) for the next message from the
    /// queue pair's peer. Completes with [`OpKind::Recv`] when one arrives
    /// ([`Status::LocalLength`] when it does not fit), or
    /// [`Status::Flushed`] when the connection resets. A receive posted
    /// while no connection is up waits for the next one: a peer that is
    /// down, or failed its handshake, does not flush it (a compatible
    /// peer may still connect); only losing our place on the fabric does.
    pub fn post_recv(&mut self, qp: Qp, sge: Sge, cookie: u64) -> Result<()> {
        self.recvs(qp, &[RecvWr { sge, cookie }]).map(|_| ())
    }

    /// Posts a batch of receive buffers, in order (as
    /// [`post_recv`](Self::post_recv) each, with the region looked up once
    /// per run of buffers in one region). Returns how many were posted:
    /// all, unless one names a range it may not write, which stops the
    /// batch there (its error is returned when it was the first).
    pub fn post_recvs(&mut self, qp: Qp, wrs: &[RecvWr]) -> Result<usize> {
        self.recvs(qp, wrs)
    }

    /// [`post_recvs`](Self::post_recvs)' body, inlined into it and into
    /// [`post_recv`](Self::post_recv), as [`sends`](Self::sends).
    #[inline(always)]
    fn recvs(&mut self, qp: Qp, wrs: &[RecvWr]) -> Result<usize> {
        if qp.peer as usize >= self.peers.len() || qp.peer == self.me {
            return Err(TransportError::NoSuchPeer { peer: qp.peer });
        }
        if self.lost {
            return Err(TransportError::Lost);
        }
        let recvs = &mut self.peers[qp.peer as usize].recvs;
        recvs.reserve(wrs.len());
        // The region of the previous buffer: its key, and its first
        // extent's window offset and length when it may be written.
        let mut last: Option<(RegionKey, Option<(u64, u64)>)> = None;
        for (n, wr) in wrs.iter().enumerate() {
            let sge = wr.sge;
            let first = match last {
                Some((key, first)) if key == sge.key => first,
                _ => {
                    let first = self.regions.first_extent(sge.key, Access::LOCAL_WRITE);
                    last = Some((sge.key, first));
                    first
                }
            };
            // In the first extent (every region not built scattered): one
            // extent, no allocation.
            let one = first.and_then(|e| in_extent(e, sge.offset, sge.len));
            let extents = match one {
                Some(o) => Extents::One([(o, sge.len)]),
                None => match self.regions.resolve_one(
                    sge.key,
                    sge.offset,
                    sge.len,
                    Access::LOCAL_WRITE,
                ) {
                    Ok(e) => e,
                    Err(e) if n == 0 => return Err(e),
                    Err(_) => return Ok(n),
                },
            };
            recvs.push_back(PostedRecv {
                extents,
                len: sge.len,
                cookie: wr.cookie,
            });
        }
        Ok(wrs.len())
    }
}

/// Refuses a remote range `len` bytes long at `remote` whose end does not
/// fit in 64 bits: the target drops such a request unanswered, so the
/// operation would only fail by timeout.
fn remote_end(remote: RemoteAddr, len: u32) -> Result<()> {
    match remote.offset.checked_add(u64::from(len)) {
        Some(_) => Ok(()),
        None => Err(TransportError::RemoteRangeOverflows {
            key: remote.key,
            offset: remote.offset,
            len: u64::from(len),
        }),
    }
}
