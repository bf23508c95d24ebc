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
//! or is gone, so a late write never lands in reused memory.
//!
//! Threat model: on an NTB a peer can write anywhere in a window it maps;
//! what the target guarantees is that nothing a peer writes makes it read
//! or write outside its window, panic, hang or corrupt its control state —
//! not that region contents are private. A `WriteImm` for a region not
//! registered for that peer is dropped and counted.

use crate::hw::{Port, WindowSpan};

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
        self.post_writes_direct(qp, &[wr]).map(|_| ())
    }

    /// Posts a batch of one-sided writes (each as
    /// [`post_write_direct`](Self::post_write_direct), signaled or not as
    /// it says), ringing the doorbell (if configured) once. Returns how
    /// many were posted: all, unless one fails its checks, which stops the
    /// batch there (its error is returned when it was the first).
    ///
    /// The window is checked once per run of writes into one region, not
    /// per write, and the immediates are written after all the batch's
    /// data, so each still follows its own.
    pub fn post_writes_direct(&mut self, qp: Qp, wrs: &[DirectWr<'_>]) -> Result<usize> {
        self.check_post(qp)?;
        let peer = qp.peer;
        let nt_threshold = self.cfg.nt_threshold;
        let Some(c) = self.peers[peer as usize].conn.as_mut() else {
            return Err(TransportError::NotConnected { peer });
        };
        let win = c.win();
        let mut n = 0;
        let mut stopped = None;
        let mut broken = false;
        // The region of the previous write: its key, length, and its bytes
        // in the window, checked once.
        let mut last: Option<(u32, u32, WindowSpan<'_>)> = None;
        for wr in wrs {
            let key = wr.remote.key;
            let (region_len, span) = match last {
                Some((k, len, ref span)) if k == key.0 => (len, span),
                _ => {
                    // The key first: a caller may probe whether a region
                    // is known yet with an empty write.
                    let Some((base, len)) = c.remote_region(key.0) else {
                        stopped = Some(TransportError::UnknownRemoteKey { peer, key });
                        break;
                    };
                    match win.span(base as usize, len as usize) {
                        Ok(span) => {
                            let l = last.insert((key.0, len, span));
                            (l.1, &l.2)
                        }
                        Err(e) => {
                            broken = true;
                            stopped = Some(e.into());
                            break;
                        }
                    }
                }
            };
            let len = wr.data.len() as u64;
            if len == 0 || len > u64::from(u32::MAX) {
                stopped = Some(TransportError::TransferSize { len });
                break;
            }
            if wr
                .remote
                .offset
                .checked_add(len)
                .is_none_or(|end| end > u64::from(region_len))
            {
                stopped = Some(TransportError::RemoteOutOfRange {
                    peer,
                    key,
                    offset: wr.remote.offset,
                    len,
                    region_len,
                });
                break;
            }
            let at = wr.remote.offset as usize;
            let written = if wr.data.len() >= nt_threshold {
                win.write_nt(span.offset() + at, wr.data)
            } else {
                span.write(at, wr.data)
            };
            if let Err(e) = written {
                broken = true;
                stopped = Some(e.into());
                break;
            }
            n += 1;
        }
        if broken {
            self.doomed.push(peer);
        }
        for wr in &wrs[..n] {
            let len = wr.data.len() as u64;
            if let Some(imm) = wr.imm {
                // The notice's slot is published by its tag, a release
                // store made after the data's stores: the peer sees the
                // data first.
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
        if n > 0 {
            self.ring_doorbell(peer);
        }
        match stopped {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
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

    /// Revokes `key` at `peers` (after a deregister); a peer not connected
    /// counts as having acknowledged.
    pub(crate) fn revoke(&mut self, key: RegionKey, peers: &[Port]) {
        for &p in peers {
            if self.peers[p as usize].conn.is_some() {
                self.emit(p, Ring::Tx, &Msg::Revoke { rkey: key.0 });
            } else {
                self.regions.revoke_acked(key, p);
            }
        }
    }

    /// `Advertise` from `p`: remember where its region is.
    pub(crate) fn on_advertise(&mut self, p: Port, rkey: u32, offset: u64, len: u32) {
        if let Some(c) = self.peers[p as usize].conn.as_mut() {
            c.learn_region(rkey, offset, len);
        }
    }

    /// `Revoke` from `p`: forget the region, then acknowledge (our later
    /// writes can no longer name it).
    pub(crate) fn on_revoke(&mut self, p: Port, rkey: u32) {
        let Some(c) = self.peers[p as usize].conn.as_mut() else {
            return;
        };
        if !c.forget_region(rkey) {
            return self.count(p, DropKind::UnknownOp);
        }
        self.emit(p, Ring::Cq, &Msg::RevokeAck { rkey });
    }

    /// `RevokeAck` from `p`.
    pub(crate) fn on_revoke_ack(&mut self, p: Port, rkey: u32) {
        self.regions.revoke_acked(RegionKey(rkey), p);
    }

    /// `WriteImm` from `p`: its one-sided write is in our region; tell the
    /// application, if the region is one `p` may write.
    pub(crate) fn on_write_imm(&mut self, p: Port, rkey: u32, roff: u64, len: u32, imm: u64) {
        let key = RegionKey(rkey);
        if self
            .regions
            .resolve_remote(p, key, roff, u64::from(len), Access::REMOTE_WRITE)
            .is_err()
        {
            return self.count(p, DropKind::Access);
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
}
