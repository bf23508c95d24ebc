//! Copies tried again: an SGL whose copy found the peer's grant table
//! mid-edit at every look is set aside (in the store of `parked.rs`, whose
//! documentation says why) and tried again from the slow path, each
//! operation's SGLs in arrival order; a multicast put whose copy to a
//! target found it so leaves a marker, and the put copies again to every
//! target still waiting.

use crate::hw::Port;

use super::endpoint::Transport;
use super::ops::{InOp, OutKind};
use super::parked::{NotParked, OpKey, PER_PEER, ParkedKind};
use super::wire::WireSge;

impl Transport {
    /// Sets an SGL of operation `key` aside to copy later (see the module
    /// documentation): `true` when it was (or when its peer, past its share
    /// of set-aside SGLs, is having its connection reset); `false` when it
    /// does not follow the SGLs waiting for its operation, for the caller's
    /// usual checks to refuse.
    pub(crate) fn park_sgl(&mut self, key: OpKey, start: u32, sges: &[WireSge]) -> bool {
        match self.parked.park(key, start, sges) {
            Ok(()) => true,
            Err(NotParked::OutOfOrder) => false,
            Err(NotParked::TooMany) => {
                tracing::warn!(
                    me = self.me,
                    peer = key.0,
                    "transport: the peer's grant table stayed mid-edit through {PER_PEER} SGLs: \
                     resetting the connection"
                );
                self.doomed.push(key.0);
                true
            }
        }
    }

    /// Slow path: tries the set-aside SGLs again, each operation's in
    /// arrival order, for the operations still waiting for them. A peer
    /// whose table is still mid-edit gets one try per pass (its other SGLs
    /// wait untried); a peer whose copy failed is being reset (its SGLs are
    /// dropped).
    pub(crate) fn retry_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let mut busy: Vec<Port> = Vec::new();
        // Multicasts retried this pass: one retry copies to every target
        // still waiting (each its own peer), and parks those that wait on.
        let mut puts: Vec<u64> = Vec::new();
        for (key, sgls) in self.parked.take() {
            let (peer, op, kind) = key;
            if self.doomed.contains(&peer) || !self.still_waits(key) {
                continue;
            }
            if kind == ParkedKind::Put {
                if puts.contains(&op) {
                    continue;
                }
                puts.push(op);
            }
            if busy.contains(&peer) {
                self.parked.put_back(key, sgls);
                continue;
            }
            for sgl in sgls {
                // A copy failed (the connection is being reset), or the
                // operation ended on the last one (its copy window closed).
                if self.doomed.contains(&peer) || !self.still_waits(key) {
                    break;
                }
                match kind {
                    ParkedKind::Write => self.on_sgl(peer, op, sgl.start, &sgl.sges),
                    ParkedKind::Read => self.on_read_sgl(peer, op, sgl.start, &sgl.sges),
                    // The put copies to every target still waiting for it.
                    ParkedKind::Put => self.mc_maybe_put(op),
                }
            }
            if self.parked.holds(key) {
                busy.push(peer);
            }
        }
    }

    /// Whether operation `key` still waits for its SGLs (it may have timed
    /// out, or been finished by the peer, since they were set aside).
    fn still_waits(&self, (peer, op, kind): OpKey) -> bool {
        match kind {
            ParkedKind::Write => self
                .ops
                .get(&op)
                .is_some_and(|o| matches!(o.kind, OutKind::Write { peer: p, .. } if p == peer)),
            ParkedKind::Read => self.peers[peer as usize]
                .conn
                .as_ref()
                .is_some_and(|c| matches!(c.served(op), Some(InOp::Read { .. }))),
            ParkedKind::Put => self.ops.get(&op).is_some_and(|o| match &o.kind {
                OutKind::Multicast { targets, .. } => targets
                    .iter()
                    .any(|t| t.peer == peer && t.status.is_none() && !t.copied),
                _ => false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::hw::emu::{DeviceConfig, EmuFabric, FabricConfig};
    use crate::transport::{
        Access, Completion, Config, DataQueues, Geometry, Qp, RegionKey, RemoteAddr, Sge, Status,
    };

    /// Bytes moved by each test's operation: 16 extents of 4 KiB, scattered
    /// where they are written (4 SGL messages of at most 5 entries), so
    /// SGLs wait behind the first one set aside.
    const LEN: usize = 16 * EXTENT;
    const EXTENT: usize = 4096;

    /// Two connected transports on an emulated fabric of two slots, a
    /// (port 0) and b (port 1), with operations timing out after
    /// `op_timeout`. b's region `dst` (`LEN` bytes, zeroes, a may write and
    /// read it) and a's `into` (`LEN` bytes, zeroes) are scattered in 4 KiB
    /// extents; a's `src` holds `data`.
    struct Pair {
        dir: std::path::PathBuf,
        name: &'static str,
        fabric: EmuFabric,
        a: Transport,
        b: Transport,
        qa: Qp,
        src: RegionKey,
        into: RegionKey,
        dst: RegionKey,
        data: Vec<u8>,
    }

    /// A region of `LEN` bytes of `t`'s area in 16 extents apart from each
    /// other: regions registered between them, every other one freed.
    fn scattered(t: &mut Transport, access: Access) -> RegionKey {
        let fill: Vec<RegionKey> = (0..32)
            .map(|_| t.register_region(EXTENT, Access::LOCAL).unwrap())
            .collect();
        for k in fill.iter().step_by(2) {
            t.deregister_region(*k).unwrap();
        }
        t.register_region_scattered(LEN, access, EXTENT).unwrap()
    }

    /// `n` transports on an emulated fabric of `n` slots in a directory of
    /// its own, connected to each other, their operations timing out after
    /// `op_timeout`.
    fn connected(
        name: &str,
        n: u16,
        op_timeout: Duration,
    ) -> (std::path::PathBuf, EmuFabric, Vec<Transport>) {
        let dir = std::env::temp_dir().join(format!("ntbdk-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fcfg = FabricConfig {
            slots: usize::from(n),
            window_size: 4 << 20,
            heartbeat_timeout: Duration::from_secs(2),
            ..FabricConfig::default()
        };
        let fabric = EmuFabric::create_in(&dir, name, &fcfg).unwrap();
        let mut cfg = Config::new(Geometry {
            ports: n,
            queue_depth: 64,
            eager_count: 32,
            eager_size: 4096,
            data: DataQueues::NONE,
        });
        cfg.op_timeout = op_timeout;
        let mut ts: Vec<Transport> = (0..n)
            .map(|slot| {
                let dc = DeviceConfig {
                    slot: Some(slot),
                    fabric: fcfg.clone(),
                    dir: Some(dir.clone()),
                    ..DeviceConfig::default()
                };
                Transport::new(Arc::new(fabric.join(&dc).unwrap()), cfg.clone()).unwrap()
            })
            .collect();
        let end = Instant::now() + LONG;
        let all = |ts: &[Transport]| {
            ts.iter()
                .all(|t| (0..n).all(|p| p == t.port() || t.is_connected(p)))
        };
        while !all(&ts) {
            for t in ts.iter_mut() {
                t.progress();
            }
            assert!(Instant::now() < end, "no connection");
        }
        (dir, fabric, ts)
    }

    impl Pair {
        fn new(name: &'static str, op_timeout: Duration) -> Pair {
            let (dir, fabric, mut ts) = connected(name, 2, op_timeout);
            let (mut b, mut a) = (ts.pop().unwrap(), ts.pop().unwrap());
            let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8 | 1).collect();
            let dst = scattered(&mut b, Access::ALL);
            let into = scattered(&mut a, Access::LOCAL);
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
                into,
                dst,
                data,
            }
        }

        /// Runs both transports until `until` with `port`'s grant table
        /// held mid-edit (held again after each poll of its owner, whose own
        /// edits end a hold), checking that both stay connected, that SGLs
        /// waited behind the first set aside (going on until they did, if
        /// `until` came first), and that nothing completes before `by`;
        /// then ends the hold.
        fn hold(&mut self, port: usize, until: Instant, by: Instant) -> Vec<Completion> {
            let table = &self.fabric.regs_of(port).grants;
            let mut done = [Completion::default(); 4];
            let mut got = Vec::new();
            let mut queued = 0;
            let cap = Instant::now() + LONG;
            while Instant::now() < until || (queued <= 1 && Instant::now() < cap) {
                self.a.progress();
                table.hold_mid_edit(true);
                self.b.progress();
                table.hold_mid_edit(true);
                let n = self.a.poll_completions(&mut done);
                got.extend_from_slice(&done[..n]);
                assert!(got.is_empty() || Instant::now() >= by, "{got:?}");
                for t in [&self.a, &self.b] {
                    queued = queued.max(t.parked.longest_queue());
                }
            }
            assert!(queued > 1, "no SGL waited behind another ({queued})");
            assert!(self.a.is_connected(1) && self.b.is_connected(0));
            table.hold_mid_edit(false);
            got
        }

        /// Polls until `a` has a completion, then checks that neither side
        /// keeps an SGL or lost its connection.
        fn complete(&mut self) -> Completion {
            let mut done = [Completion::default(); 4];
            let end = Instant::now() + Duration::from_secs(10);
            while self.a.poll_completions(&mut done) == 0 {
                self.b.progress();
                assert!(Instant::now() < end, "the operation never completed");
            }
            self.settle();
            done[0]
        }

        /// Runs both sides a while longer (a late copy would land now), then
        /// checks that neither keeps an SGL or lost its connection.
        fn settle(&mut self) {
            let end = Instant::now() + Duration::from_millis(50);
            while Instant::now() < end {
                self.a.progress();
                self.b.progress();
            }
            assert!(self.a.parked.is_empty() && self.b.parked.is_empty());
            let qb = self.b.create_qp(0).unwrap();
            assert_eq!(self.a.counters(self.qa).disconnects, 0);
            assert_eq!(self.b.counters(qb).disconnects, 0);
        }

        fn sge(&self, key: RegionKey) -> Sge {
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

        fn read(t: &mut Transport, key: RegionKey) -> Vec<u8> {
            let mut got = vec![0u8; LEN];
            t.region_read(key, 0, &mut got).unwrap();
            got
        }

        fn finish(self) {
            drop((self.a, self.b));
            EmuFabric::destroy_in(&self.dir, self.name).unwrap();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    const LONG: Duration = Duration::from_secs(10);
    const HOLD: Duration = Duration::from_millis(100);

    /// A time no test reaches.
    fn far() -> Instant {
        Instant::now() + 2 * LONG
    }

    /// A rendezvous write whose target's grant table stays mid-edit (its
    /// owner preempted inside an edit) waits, connection kept, its later
    /// SGLs behind the first, and lands whole once the edit ends; every
    /// byte checked at the target.
    #[test]
    fn a_write_into_a_table_mid_edit_waits_and_lands() {
        let mut t = Pair::new("parkedw", LONG);
        let (sge, at) = (t.sge(t.src), t.remote());
        t.a.post_write(t.qa, &[sge], at, 9).unwrap();
        assert!(t.hold(1, Instant::now() + HOLD, far()).is_empty());
        let c = t.complete();
        assert_eq!(
            (c.cookie, c.status, c.bytes),
            (9, Status::Success, LEN as u64)
        );
        assert!(
            Pair::read(&mut t.b, t.dst) == t.data,
            "the target's bytes differ"
        );
        t.finish();
    }

    /// The mirror: a read we serve, into a reader whose grant table stays
    /// mid-edit, waits at the serving side and lands whole.
    #[test]
    fn a_read_served_into_a_table_mid_edit_waits_and_lands() {
        let mut t = Pair::new("parkedr", LONG);
        let data = t.data.iter().map(|b| b ^ 0x5a).collect::<Vec<u8>>();
        t.b.region_write(t.dst, 0, &data).unwrap();
        let (sge, at) = (t.sge(t.into), t.remote());
        t.a.post_read(t.qa, &[sge], at, 10).unwrap();
        assert!(t.hold(0, Instant::now() + HOLD, far()).is_empty());
        let c = t.complete();
        assert_eq!(
            (c.cookie, c.status, c.bytes),
            (10, Status::Success, LEN as u64)
        );
        assert!(
            Pair::read(&mut t.a, t.into) == data,
            "the reader's bytes differ"
        );
        t.finish();
    }

    /// A table mid-edit past the copy window (3/4 of the timeout): no
    /// copy starts any more, so none can still run when the other side
    /// gives up. The write fails with `Timeout` at its next try; the read
    /// we serve is dropped, and the reader's fails with `Timeout`. No byte
    /// lands (the target's and the reader's regions stay zero), even once
    /// the edit ends before the timeout; the connection is kept.
    #[test]
    fn past_the_copy_window_nothing_lands() {
        // The edit ends at 0.9 of the timeout after the post, well past the
        // window (0.75), well before the timeout: margins of 450 and 300 ms
        // for a loaded machine.
        let timeout = Duration::from_secs(3);
        let (hold, by) = (timeout * 9 / 10, timeout * 7 / 10);
        let mut t = Pair::new("parkedt", timeout);
        let (sge, at) = (t.sge(t.src), t.remote());
        let posted = Instant::now();
        t.a.post_write(t.qa, &[sge], at, 11).unwrap();
        let got = t.hold(1, posted + hold, posted + by);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].cookie, got[0].status), (11, Status::Timeout));
        t.settle();
        assert!(Pair::read(&mut t.b, t.dst).iter().all(|&b| b == 0));

        t.b.region_write(t.dst, 0, &t.data).unwrap();
        let sge = t.sge(t.into);
        let posted = Instant::now();
        t.a.post_read(t.qa, &[sge], at, 12).unwrap();
        assert!(t.hold(0, posted + hold, posted + by).is_empty());
        let c = t.complete();
        assert_eq!((c.cookie, c.status), (12, Status::Timeout));
        assert!(Pair::read(&mut t.a, t.into).iter().all(|&b| b == 0));
        t.finish();
    }

    /// The connection ending while SGLs wait drops them: nothing is copied
    /// into the new connection's peer.
    #[test]
    fn a_connection_that_ends_drops_what_waits() {
        let mut t = Pair::new("parkedd", LONG);
        let (sge, at) = (t.sge(t.src), t.remote());
        t.a.post_write(t.qa, &[sge], at, 13).unwrap();
        assert!(t.hold(1, Instant::now() + HOLD, far()).is_empty());
        t.a.start_over(1, Status::Reset);
        assert!(t.a.parked.is_empty());
        let mut done = [Completion::default(); 4];
        let n = t.a.poll_completions(&mut done);
        assert_eq!((n, done[0].cookie, done[0].status), (1, 13, Status::Reset));
        assert!(Pair::read(&mut t.b, t.dst).iter().all(|&b| b == 0));
        t.finish();
    }

    /// A one-sided write into a region whose owner's grant table stays
    /// mid-edit is `Busy` (nothing written, the connection kept), and goes
    /// through once the edit ends.
    #[test]
    fn a_one_sided_write_into_a_table_mid_edit_is_busy() {
        use crate::transport::TransportError;

        let mut t = Pair::new("parkedo", LONG);
        let region = t.b.register_region_for(4096, Access::ALL, &[0]).unwrap();
        let at = RemoteAddr {
            key: region,
            offset: 64,
        };
        let end = Instant::now() + LONG;
        // Until the advertisement arrives (a zero-length probe is refused
        // for its size once the key is known).
        while let Err(TransportError::UnknownRemoteKey { .. }) =
            t.a.post_write_direct(t.qa, &[], at, None, 0)
        {
            t.a.progress();
            t.b.progress();
            assert!(Instant::now() < end, "never advertised");
        }
        let table = &t.fabric.regs_of(1).grants;
        table.hold_mid_edit(true);
        for _ in 0..3 {
            let e = t.a.post_write_direct(t.qa, &t.data[..64], at, None, 14);
            assert!(
                matches!(e, Err(TransportError::Busy { peer: 1, .. })),
                "{e:?}"
            );
            t.a.progress();
            t.b.progress();
            table.hold_mid_edit(true);
        }
        table.hold_mid_edit(false);
        t.a.post_write_direct(t.qa, &t.data[..64], at, None, 14)
            .unwrap();
        let mut got = [0u8; 128];
        t.b.region_read(region, 0, &mut got).unwrap();
        assert!(got[..64].iter().all(|&b| b == 0) && got[64..] == t.data[..64]);
        t.settle();
        t.finish();
    }

    /// Three connected transports for a multicast from port 0 to ports 1
    /// and 2 of `LEN` bytes of `data`, and what each has completed so far
    /// (their fabric is returned beside them by `new`, to outlive them).
    struct Three {
        dir: std::path::PathBuf,
        name: &'static str,
        ts: Vec<Transport>,
        data: Vec<u8>,
        got: Vec<Vec<Completion>>,
    }

    impl Three {
        fn new(name: &'static str, op_timeout: Duration) -> (EmuFabric, Three) {
            let (dir, fabric, ts) = connected(name, 3, op_timeout);
            let data = (0..LEN).map(|i| (i * 13) as u8 | 1).collect();
            let three = Three {
                dir,
                name,
                ts,
                data,
                got: vec![Vec::new(); 3],
            };
            (fabric, three)
        }

        /// Posts the put (`mode`) from port 0 to ports 1 and 2.
        fn put(&mut self, mode: crate::transport::MulticastMode, cookie: u64) {
            let t = &mut self.ts[0];
            let src = t.register_region(LEN, Access::LOCAL).unwrap();
            t.region_write(src, 0, &self.data).unwrap();
            let targets = [t.create_qp(1).unwrap(), t.create_qp(2).unwrap()];
            let sge = Sge {
                key: src,
                offset: 0,
                len: LEN as u64,
            };
            t.post_multicast_put_with(&targets, &[sge], mode, cookie)
                .unwrap();
        }

        /// Polls each transport's completions once, calling `after_each`
        /// after each.
        fn poll(&mut self, mut after_each: impl FnMut()) {
            let mut done = [Completion::default(); 4];
            for (i, t) in self.ts.iter_mut().enumerate() {
                let n = t.poll_completions(&mut done);
                self.got[i].extend_from_slice(&done[..n]);
                after_each();
            }
        }

        /// The bytes port `i`'s multicast receive holds, once it has one.
        fn received(&mut self, i: usize) -> Option<Vec<u8>> {
            let recv = self.got[i]
                .iter()
                .find(|c| c.op == crate::transport::OpKind::MulticastRecv)?;
            let mut bytes = vec![0u8; LEN];
            self.ts[i]
                .region_read(recv.region.unwrap(), 0, &mut bytes)
                .unwrap();
            Some(bytes)
        }

        /// Checks that no connection was lost, and removes the fabric.
        fn finish(mut self) {
            for (i, t) in self.ts.iter_mut().enumerate() {
                for j in (0..3u16).filter(|&j| j as usize != i) {
                    let q = t.create_qp(j).unwrap();
                    assert_eq!(t.counters(q).disconnects, 0, "{i} -> {j}");
                }
            }
            drop(self.ts);
            EmuFabric::destroy_in(&self.dir, self.name).unwrap();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A chain link whose successor's grant table stays mid-edit gives its
    /// forward up instead of resetting that connection: the first target
    /// gets its data, the put ends (not `Success`: the last target got
    /// nothing) within its timeout, and every connection is kept.
    #[test]
    fn a_chain_forward_into_a_table_mid_edit_gives_up_and_keeps_the_connection() {
        use crate::transport::{MulticastMode, OpKind};

        let (fabric, mut t) = Three::new("parkedc", Duration::from_secs(1));
        t.put(MulticastMode::Chain, 15);
        let table = &fabric.regs_of(2).grants;
        let end = Instant::now() + LONG;
        while t.got[0].is_empty() {
            t.poll(|| table.hold_mid_edit(true));
            assert!(Instant::now() < end, "the put never completed");
        }
        table.hold_mid_edit(false);
        let put = t.got[0][0];
        assert_eq!((put.cookie, put.op), (15, OpKind::MulticastPut));
        assert_ne!(put.status, Status::Success, "{put:?}");
        let first = t.received(1);
        let first = first.unwrap_or_else(|| panic!("the first target got nothing: {:?}", t.got[1]));
        assert!(first == t.data, "the first target's bytes differ");
        assert!(t.received(2).is_none(), "{:?}", t.got[2]);
        t.finish();
    }

    /// A fan-out put to a target whose grant table stays mid-edit copies to
    /// the others, waits for that one, connection kept, and copies to it
    /// once the edit ends: `Success`, every target's bytes checked.
    #[test]
    fn a_fan_out_to_a_table_mid_edit_waits_and_lands() {
        put_waits_for_a_table_mid_edit("parkedf", crate::transport::MulticastMode::FanOut, 2);
    }

    /// The same for a chain whose first target's table stays mid-edit: the
    /// whole chain waits, and the data goes down it once the edit ends.
    #[test]
    fn a_chain_whose_first_table_is_mid_edit_waits_and_lands() {
        put_waits_for_a_table_mid_edit("parkedh", crate::transport::MulticastMode::Chain, 1);
    }

    /// A put from port 0 to ports 1 and 2 (`mode`) while port `held`'s
    /// grant table stays mid-edit, then after the edit ends: no target has
    /// its data before (but, in a fan-out, the other), both after, the put
    /// `Success`, every connection kept.
    fn put_waits_for_a_table_mid_edit(
        name: &'static str,
        mode: crate::transport::MulticastMode,
        held: usize,
    ) {
        use crate::transport::{MulticastMode, OpKind};

        let (fabric, mut t) = Three::new(name, LONG);
        t.put(mode, 16);
        let table = &fabric.regs_of(held).grants;
        // Held until the copy was set aside (the put went out), and a while
        // after.
        let end = Instant::now() + LONG;
        let mut after = None;
        while after.is_none_or(|t: Instant| t.elapsed() < HOLD) {
            t.poll(|| {});
            table.hold_mid_edit(true);
            if after.is_none() && t.ts[0].parked.longest_queue() > 0 {
                after = Some(Instant::now());
            }
            assert!(Instant::now() < end, "the copy was never set aside");
        }
        assert!(
            t.got[0].is_empty() && t.received(held).is_none(),
            "{:?}",
            t.got
        );
        if mode == MulticastMode::FanOut {
            let other = 3 - held;
            while t.received(other).is_none() {
                t.poll(|| {});
                table.hold_mid_edit(true);
                assert!(Instant::now() < end, "the other target got nothing");
            }
        } else {
            assert!(t.received(2).is_none(), "{:?}", t.got);
        }
        table.hold_mid_edit(false);
        while t.got[0].is_empty() {
            t.poll(|| {});
            assert!(Instant::now() < end, "the put never completed");
        }
        let put = t.got[0][0];
        assert_eq!(
            (put.cookie, put.op, put.status),
            (16, OpKind::MulticastPut, Status::Success)
        );
        for i in [1, 2] {
            let end = Instant::now() + LONG;
            let bytes = loop {
                if let Some(b) = t.received(i) {
                    break b;
                }
                t.poll(|| {});
                assert!(Instant::now() < end, "target {i} got nothing");
            };
            assert!(bytes == t.data, "target {i}'s bytes differ");
        }
        t.finish();
    }
}
