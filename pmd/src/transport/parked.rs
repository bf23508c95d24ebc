//! SGLs whose copy found the peer's grant table mid-edit at every look.
//!
//! A rendezvous copy goes into storage the peer granted us through its live
//! grant table (see `crate::hw::grant_table`). A table that stays mid-edit
//! (its owner preempted inside an edit, for milliseconds on a busy host) is
//! no answer yet, not a refusal: ending the connection for it would fail
//! every operation with an honest peer. So the SGL is set aside here and its
//! copy tried again from the slow path, until it goes through, or its
//! operation ends (its timeout, or the connection's end). The SGLs of one
//! operation that arrive meanwhile wait behind it, so they are copied in
//! the order they came.

use crate::hw::Port;

use super::endpoint::Transport;
use super::ops::{InOp, OutKind};
use super::wire::WireSge;

/// SGLs one peer may have set aside at once. Past it (a peer that keeps its
/// table mid-edit and sends SGL after SGL) the connection is reset, as any
/// failed copy resets it.
const PER_PEER: usize = 256;

/// Which of our roles the SGL serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParkedKind {
    /// Our rendezvous write: where the target wants its bytes (`Sgl`).
    Write,
    /// A read we serve: where the reader wants the bytes (`ReadSgl`).
    Read,
}

/// One SGL set aside.
#[derive(Debug)]
pub(crate) struct ParkedSgl {
    /// The peer whose window the copy goes into.
    pub(crate) peer: Port,
    /// The operation (ours for a write, the peer's for a read we serve).
    pub(crate) op: u64,
    /// Which role.
    pub(crate) kind: ParkedKind,
    /// The SGL's position in the operation's bytes.
    pub(crate) start: u32,
    /// Its entries.
    pub(crate) sges: Vec<WireSge>,
}

/// The SGLs set aside, in arrival order.
#[derive(Debug, Default)]
pub(crate) struct Parked(Vec<ParkedSgl>);

/// The peer has [`PER_PEER`] SGLs set aside already.
#[derive(Debug)]
pub(crate) struct TooManyParked;

impl Parked {
    /// Whether nothing is set aside (the slow path's one look).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an SGL of `op` from `peer` waits: a newer one must wait
    /// behind it.
    #[inline]
    pub(crate) fn holds(&self, peer: Port, op: u64, kind: ParkedKind) -> bool {
        !self.0.is_empty()
            && self
                .0
                .iter()
                .any(|e| e.peer == peer && e.op == op && e.kind == kind)
    }

    /// Sets an SGL aside, after those already waiting.
    pub(crate) fn park(
        &mut self,
        peer: Port,
        op: u64,
        kind: ParkedKind,
        start: u32,
        sges: &[WireSge],
    ) -> Result<(), TooManyParked> {
        if self.0.iter().filter(|e| e.peer == peer).count() >= PER_PEER {
            return Err(TooManyParked);
        }
        self.0.push(ParkedSgl {
            peer,
            op,
            kind,
            start,
            sges: sges.to_vec(),
        });
        Ok(())
    }

    /// Everything set aside, in arrival order, to try again (what fails
    /// again is parked anew, in the same order).
    pub(crate) fn take(&mut self) -> Vec<ParkedSgl> {
        std::mem::take(&mut self.0)
    }

    /// Drops what waits for `peer` (its connection ended: what the SGLs
    /// served has failed with it).
    pub(crate) fn forget_peer(&mut self, peer: Port) {
        self.0.retain(|e| e.peer != peer);
    }
}

impl Transport {
    /// Sets `op`'s SGL aside to copy later (see the module documentation);
    /// a peer past its share of set-aside SGLs has its connection reset.
    pub(crate) fn park(
        &mut self,
        p: Port,
        op: u64,
        kind: ParkedKind,
        start: u32,
        sges: &[WireSge],
    ) {
        if self.parked.park(p, op, kind, start, sges).is_err() {
            tracing::warn!(
                me = self.me,
                peer = p,
                "transport: the peer's grant table stayed mid-edit through {PER_PEER} SGLs: resetting the connection"
            );
            self.doomed.push(p);
        }
    }

    /// Slow path: tries every set-aside SGL again, in arrival order, whose
    /// operation is still waiting for it; those that find the table
    /// mid-edit again are set aside again.
    pub(crate) fn retry_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        for e in self.parked.take() {
            let waiting = match e.kind {
                ParkedKind::Write => self.ops.get(&e.op).is_some_and(
                    |o| matches!(o.kind, OutKind::Write { peer, .. } if peer == e.peer),
                ),
                ParkedKind::Read => self.peers[e.peer as usize]
                    .conn
                    .as_ref()
                    .is_some_and(|c| matches!(c.served(e.op), Some(InOp::Read { .. }))),
            };
            if !waiting {
                continue; // timed out, or its connection ended
            }
            match e.kind {
                ParkedKind::Write => self.on_sgl(e.peer, e.op, e.start, &e.sges),
                ParkedKind::Read => self.on_read_sgl(e.peer, e.op, e.start, &e.sges),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(offset: u64) -> WireSge {
        WireSge { offset, len: 64 }
    }

    #[test]
    fn keeps_arrival_order_bounds_each_peer_and_forgets_a_peer() {
        let mut p = Parked::default();
        assert!(p.is_empty() && !p.holds(1, 7, ParkedKind::Write));
        p.park(1, 7, ParkedKind::Write, 0, &[sge(0)]).unwrap();
        p.park(2, 7, ParkedKind::Read, 0, &[sge(64)]).unwrap();
        p.park(1, 7, ParkedKind::Write, 64, &[sge(128)]).unwrap();
        assert!(p.holds(1, 7, ParkedKind::Write));
        assert!(!p.holds(1, 7, ParkedKind::Read) && !p.holds(1, 8, ParkedKind::Write));
        let all = p.take();
        assert!(p.is_empty());
        let order: Vec<_> = all.iter().map(|e| (e.peer, e.start)).collect();
        assert_eq!(order, [(1, 0), (2, 0), (1, 64)]);
        for i in 0..PER_PEER {
            p.park(3, i as u64, ParkedKind::Write, 0, &[sge(0)])
                .unwrap();
        }
        assert!(p.park(3, 0, ParkedKind::Write, 0, &[sge(0)]).is_err());
        p.park(4, 0, ParkedKind::Write, 0, &[sge(0)]).unwrap();
        p.forget_peer(3);
        assert!(!p.holds(3, 0, ParkedKind::Write) && p.holds(4, 0, ParkedKind::Write));
    }

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::hw::emu::{DeviceConfig, EmuFabric, FabricConfig};
    use crate::transport::{
        Access, Completion, Config, DataQueues, Geometry, Qp, RemoteAddr, Sge, Status,
    };

    const LEN: usize = 8192;

    /// Two connected transports on an emulated fabric of two slots, a
    /// (port 0) and b (port 1); b's region `dst` holds `LEN` bytes a may
    /// write and read, and a's `src` as many, filled with `data`.
    struct Pair {
        dir: std::path::PathBuf,
        name: &'static str,
        fabric: EmuFabric,
        a: Transport,
        b: Transport,
        qa: Qp,
        src: crate::transport::RegionKey,
        dst: crate::transport::RegionKey,
        data: Vec<u8>,
    }

    impl Pair {
        fn new(name: &'static str) -> Pair {
            let dir = std::env::temp_dir().join(format!("ntbdk-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let fcfg = FabricConfig {
                slots: 2,
                window_size: 4 << 20,
                heartbeat_timeout: Duration::from_secs(2),
                ..FabricConfig::default()
            };
            let fabric = EmuFabric::create_in(&dir, name, &fcfg).unwrap();
            let join = |slot| {
                let dc = DeviceConfig {
                    slot: Some(slot),
                    fabric: fcfg.clone(),
                    dir: Some(dir.clone()),
                    ..DeviceConfig::default()
                };
                Arc::new(fabric.join(&dc).unwrap())
            };
            let geo = Geometry {
                ports: 2,
                queue_depth: 64,
                eager_count: 32,
                eager_size: 4096,
                data: DataQueues::NONE,
            };
            let mut a = Transport::new(join(0), Config::new(geo)).unwrap();
            let mut b = Transport::new(join(1), Config::new(geo)).unwrap();
            let end = Instant::now() + Duration::from_secs(10);
            while !a.is_connected(1) || !b.is_connected(0) {
                a.progress();
                b.progress();
                assert!(Instant::now() < end, "no connection");
            }
            let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect();
            let dst = b.register_region_for(LEN, Access::ALL, &[0]).unwrap();
            let src = a.register_region(LEN, Access::LOCAL).unwrap();
            a.region_write(src, 0, &data).unwrap();
            let qa = a.create_qp(1).unwrap();
            Pair {
                dir,
                name,
                fabric,
                a,
                b,
                qa,
                src,
                dst,
                data,
            }
        }

        /// Runs both transports for 100 ms with `port`'s grant table held
        /// mid-edit (held again after each poll of its owner, whose own
        /// edits end a hold), checking that nothing completes and both stay
        /// connected; then ends the hold and returns `a`'s completion.
        fn hold_then_complete(&mut self, port: usize) -> Completion {
            let table = &self.fabric.regs_of(port).grants;
            let mut done = [Completion::default(); 4];
            let hold = Instant::now() + Duration::from_millis(100);
            while Instant::now() < hold {
                self.a.progress();
                table.hold_mid_edit(true);
                self.b.progress();
                table.hold_mid_edit(true);
                assert_eq!(self.a.poll_completions(&mut done), 0, "{:?}", done[0]);
            }
            assert!(
                !self.a.parked.is_empty() || !self.b.parked.is_empty(),
                "no copy was set aside"
            );
            assert!(self.a.is_connected(1) && self.b.is_connected(0));
            table.hold_mid_edit(false);
            let end = Instant::now() + Duration::from_secs(10);
            while self.a.poll_completions(&mut done) == 0 {
                self.b.progress();
                assert!(Instant::now() < end, "the operation never completed");
            }
            assert!(self.a.parked.is_empty() && self.b.parked.is_empty());
            let qb = self.b.create_qp(0).unwrap();
            assert_eq!(self.a.counters(self.qa).disconnects, 0);
            assert_eq!(self.b.counters(qb).disconnects, 0);
            done[0]
        }

        fn sge(&self, key: crate::transport::RegionKey) -> Sge {
            Sge {
                key,
                offset: 0,
                len: LEN as u64,
            }
        }

        fn remote(&self) -> RemoteAddr {
            RemoteAddr {
                key: self.dst,
                offset: 0,
            }
        }

        fn finish(self) {
            drop((self.a, self.b));
            EmuFabric::destroy_in(&self.dir, self.name).unwrap();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A rendezvous write whose target's grant table stays mid-edit (its
    /// owner preempted inside an edit) waits, connection kept, and lands
    /// whole once the edit ends; every byte checked at the target.
    #[test]
    fn a_write_into_a_table_mid_edit_waits_and_lands() {
        let mut t = Pair::new("parkedw");
        let (sge, at) = (t.sge(t.src), t.remote());
        t.a.post_write(t.qa, &[sge], at, 9).unwrap();
        let c = t.hold_then_complete(1);
        assert_eq!(
            (c.cookie, c.status, c.bytes),
            (9, Status::Success, LEN as u64)
        );
        let mut got = vec![0u8; LEN];
        t.b.region_read(t.dst, 0, &mut got).unwrap();
        assert!(got == t.data, "the target's bytes differ");
        t.finish();
    }

    /// The mirror: a read we serve, into a reader whose grant table stays
    /// mid-edit, waits at the serving side and lands whole.
    #[test]
    fn a_read_served_into_a_table_mid_edit_waits_and_lands() {
        let mut t = Pair::new("parkedr");
        let data = t.data.iter().map(|b| b ^ 0x5a).collect::<Vec<u8>>();
        t.b.region_write(t.dst, 0, &data).unwrap();
        let into = t.a.register_region(LEN, Access::LOCAL).unwrap();
        let (sge, at) = (t.sge(into), t.remote());
        t.a.post_read(t.qa, &[sge], at, 10).unwrap();
        let c = t.hold_then_complete(0);
        assert_eq!(
            (c.cookie, c.status, c.bytes),
            (10, Status::Success, LEN as u64)
        );
        let mut got = vec![0u8; LEN];
        t.a.region_read(into, 0, &mut got).unwrap();
        assert!(got == data, "the reader's bytes differ");
        t.finish();
    }
}
