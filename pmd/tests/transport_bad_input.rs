//! Bad input from a peer: malformed, misrouted, out-of-range, replayed and
//! unknown messages injected straight into a victim's window. The victim
//! must count and drop them (or fail the operation they name), never panic,
//! and keep serving honest peers with its regions intact.

mod transport_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::loopback::{LoopbackDevice, LoopbackFabric};
use ntbdk_pmd::transport::wire::{self, INLINE_MAX, Msg, SGES_PER_MSG, WireSge, WireStatus};
use ntbdk_pmd::transport::{
    Access, Completion, Config, DirectWr, DropKind, Geometry, MulticastMode, OpKind, Part, Qp,
    RegionKey, RemoteAddr, Sge, Status, Transport, TransportError, epoch,
};
use ntbdk_pmd::transport::{
    Ring,
    inject::{Injector, first_op_id},
};
use proptest::prelude::*;
use transport_common::{Rng, collect, drain, until_reached};

struct Setup {
    _fabric: Arc<LoopbackFabric>,
    ts: Vec<Transport>,
    rogue: Transport,
    rogue_dev: Arc<LoopbackDevice>,
    inj: Injector,
    protected: RegionKey,
    open: RegionKey,
}

fn setup() -> Setup {
    setup_with(Config::new(Geometry::small(3)))
}

/// Ports 0 and 1 honest, port 2 the rogue (connected, then it stops
/// polling: everything it does from then on goes through the injector).
fn setup_with(cfg: Config) -> Setup {
    setup_on(cfg, 4 << 20)
}

/// [`setup_with`] on windows of `window` bytes (a fabric of as many ports
/// as `cfg`'s geometry has: ports past 2 stay empty).
fn setup_on(cfg: Config, window: usize) -> Setup {
    let fabric = LoopbackFabric::new(cfg.geometry.ports, window);
    let rogue_dev: Arc<LoopbackDevice> = Arc::new(fabric.join(2).unwrap());
    let mut ts: Vec<Transport> = (0..2)
        .map(|p| Transport::new(Arc::new(fabric.join(p).unwrap()), cfg.clone()).unwrap())
        .collect();
    let mut rogue = Transport::new(rogue_dev.clone(), cfg).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !(ts[0].is_connected(1)
        && ts[1].is_connected(0)
        && ts[1].is_connected(2)
        && rogue.is_connected(1))
    {
        ts[0].progress();
        ts[1].progress();
        rogue.progress();
        assert!(Instant::now() < end);
    }
    let protected = ts[1]
        .register_region(4096, Access::LOCAL | Access::REMOTE_READ)
        .unwrap();
    ts[1].region_write(protected, 0, &[0xab; 4096]).unwrap();
    let open = ts[1].register_region(4096, Access::ALL).unwrap();
    let e = epoch(rogue.incarnation(), ts[1].incarnation());
    let inj = Injector::new(&*rogue_dev, 1, *ts[1].layout(), e).unwrap();
    Setup {
        _fabric: fabric,
        ts,
        rogue,
        rogue_dev,
        inj,
        protected,
        open,
    }
}

/// Posts an honest multicast of `len` bytes (0x11 each) from port 0 to
/// the ports `to`; returns port 0's queue pairs to them.
fn multicast_from_0(
    s: &mut Setup,
    to: &[u16],
    len: u32,
    mode: MulticastMode,
    cookie: u64,
) -> Vec<Qp> {
    let t = &mut s.ts[0];
    let src = t.register_region(len as usize, Access::LOCAL).unwrap();
    t.region_write(src, 0, &vec![0x11; len as usize]).unwrap();
    let qps: Vec<Qp> = to.iter().map(|&p| t.create_qp(p).unwrap()).collect();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: len.into(),
    }];
    t.post_multicast_put_with(&qps, &sge, mode, cookie).unwrap();
    qps
}

/// The victim still serves the honest peer and its protected region is intact.
fn honest_traffic_works(s: &mut Setup) {
    let q0 = s.ts[0].create_qp(1).unwrap();
    let q1 = s.ts[1].create_qp(0).unwrap();
    let src = s.ts[0].register_region(4096, Access::LOCAL).unwrap();
    s.ts[0].region_write(src, 0, &[0x5a; 4096]).unwrap();
    s.ts[0]
        .post_write(
            q0,
            &[Sge {
                key: src,
                offset: 0,
                len: 4096,
            }],
            RemoteAddr {
                key: s.open,
                offset: 0,
            },
            1,
        )
        .unwrap();
    let c = collect(&mut s.ts, 0, 1);
    assert_eq!((c[0].status, c[0].cookie), (Status::Success, 1));
    let rb = s.ts[1].register_region(64, Access::LOCAL).unwrap();
    s.ts[1]
        .post_recv(
            q1,
            Sge {
                key: rb,
                offset: 0,
                len: 64,
            },
            2,
        )
        .unwrap();
    s.ts[0].post_send(q0, b"ok", 3).unwrap();
    let c = collect(&mut s.ts, 1, 1);
    assert!(
        c.iter()
            .any(|c| c.cookie == 2 && c.status == Status::Success),
        "{c:?}"
    );
    let mut back = [0u8; 4096];
    s.ts[1].region_read(s.protected, 0, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0xab),
        "a protected region changed"
    );
    s.ts[0].deregister_region(src).unwrap();
    s.ts[1].deregister_region(rb).unwrap();
}

fn sgl(op: u64, start: u32, entries: &[(u64, u32)]) -> [WireSge; SGES_PER_MSG] {
    let _ = (op, start);
    let mut s = [WireSge::default(); SGES_PER_MSG];
    for (i, &(offset, len)) in entries.iter().enumerate() {
        s[i] = WireSge { offset, len };
    }
    s
}

#[test]
fn each_kind_of_bad_message_is_counted_and_dropped() {
    let mut s = setup();
    let victim_qp = s.ts[1].create_qp(2).unwrap();
    let window_len = s.ts[1].device().local_window(0).unwrap().len() as u64;
    let enc = |m: Msg| wire::encode(&m);
    let mut cases: Vec<(Ring, [u8; 56], DropKind)> = vec![
        (Ring::Rx, [0xee; 56], DropKind::Malformed),
        (
            Ring::Tx,
            {
                let mut b = enc(Msg::Done { op: 1, len: 1 });
                b[40] = 1;
                b
            },
            DropKind::Malformed,
        ),
        (
            Ring::Tx,
            enc(Msg::WriteReq {
                op: 5,
                rkey: s.open.0,
                roff: 0,
                len: 10,
            }),
            DropKind::WrongQueue,
        ),
        (
            Ring::Cq,
            enc(Msg::Ack {
                op: 999,
                status: WireStatus::Ok,
                len: 1,
            }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Cq,
            enc(Msg::Done { op: 12345, len: 10 }),
            DropKind::UnknownOp,
        ),
        // An empty inline send: no sender makes one.
        (
            Ring::PostQ,
            enc(Msg::SendInline {
                len: 0,
                data: [0; INLINE_MAX],
            }),
            DropKind::Malformed,
        ),
        // An acknowledgement of no revocation (forged or repeated).
        (
            Ring::Cq,
            enc(Msg::RevokeAck { rkey: 4242 }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Tx,
            enc(Msg::Sgl {
                op: 77,
                start: 0,
                n: 1,
                sges: sgl(77, 0, &[(0, 64)]),
            }),
            DropKind::OutOfRange,
        ),
        (
            Ring::Tx,
            enc(Msg::Sgl {
                op: 77,
                start: 0,
                n: 1,
                sges: sgl(77, 0, &[(window_len - 8, 64)]),
            }),
            DropKind::OutOfRange,
        ),
        (
            Ring::Tx,
            enc(Msg::Sgl {
                op: 77,
                start: 0,
                n: 1,
                sges: sgl(77, 0, &[(1 << 20, 64)]),
            }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Rx,
            enc(Msg::WriteReq {
                op: 10,
                rkey: s.protected.0,
                roff: 0,
                len: 10,
            }),
            DropKind::Access,
        ),
        (
            Ring::Rx,
            enc(Msg::WriteReq {
                op: 11,
                rkey: s.open.0,
                roff: 4090,
                len: 10,
            }),
            DropKind::Access,
        ),
        (
            Ring::Rx,
            enc(Msg::WriteReq {
                op: 11,
                rkey: s.open.0,
                roff: 0,
                len: 10,
            }),
            DropKind::Replay,
        ),
        (
            Ring::Rx,
            enc(Msg::WriteReq {
                op: 3,
                rkey: s.open.0,
                roff: 0,
                len: 10,
            }),
            DropKind::Replay,
        ),
        (
            Ring::Rx,
            enc(Msg::WriteReq {
                op: 12,
                rkey: s.open.0,
                roff: u64::MAX - 2,
                len: 10,
            }),
            DropKind::OutOfRange,
        ),
        (
            Ring::Rx,
            enc(Msg::WriteReq {
                op: 13,
                rkey: 0xdead,
                roff: 0,
                len: 10,
            }),
            DropKind::Access,
        ),
        (
            Ring::Tx,
            enc(Msg::ReadSgl {
                op: 4242,
                start: 0,
                n: 1,
                sges: sgl(0, 0, &[(1 << 20, 64)]),
            }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Tx,
            enc(Msg::ReadReq {
                op: 20,
                rkey: s.open.0,
                roff: 0,
                len: 0,
            }),
            DropKind::OutOfRange,
        ),
        (
            Ring::PostQ,
            enc(Msg::SendBuf { buf: 1000, len: 10 }),
            DropKind::OutOfRange,
        ),
        (
            Ring::PostQ,
            enc(Msg::SendBuf {
                buf: 1,
                len: 100_000,
            }),
            DropKind::OutOfRange,
        ),
        (
            Ring::Rx,
            enc(Msg::ReadSize {
                op: 31337,
                status: WireStatus::Ok,
                len: 100,
            }),
            DropKind::UnknownOp,
        ),
    ];
    cases.extend([
        (
            Ring::Cq,
            enc(Msg::ChainDone {
                op: 5000,
                origin: 0,
                len: 10,
            }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Cq,
            enc(Msg::ChainDone {
                op: 5000,
                origin: 9999,
                len: 10,
            }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Tx,
            enc(Msg::ChainSgl {
                op: 1,
                origin: 1,
                start: 0,
                n: 1,
                sges: sgl(0, 0, &[(1 << 20, 64)]),
            }),
            DropKind::UnknownOp,
        ),
        (
            Ring::Rx,
            enc(Msg::ChainRts {
                op: 40,
                len: 100,
                prev: 1,
                next: Some(2),
            }),
            DropKind::OutOfRange,
        ),
        (
            Ring::Rx,
            enc(Msg::ChainRts {
                op: 41,
                len: 100,
                prev: 0,
                next: Some(0),
            }),
            DropKind::OutOfRange,
        ),
    ]);
    let rb = s.ts[1].register_region(4096, Access::LOCAL).unwrap();
    for i in 0..4 {
        s.ts[1]
            .post_recv(
                victim_qp,
                Sge {
                    key: rb,
                    offset: i * 1024,
                    len: 1024,
                },
                500 + i,
            )
            .unwrap();
    }
    for (i, (ring, body, kind)) in cases.into_iter().enumerate() {
        let before = s.ts[1].counters(victim_qp).dropped(kind);
        s.inj.push(ring, &body).unwrap();
        for _ in 0..3 {
            s.ts[1].progress();
        }
        let after = s.ts[1].counters(victim_qp).dropped(kind);
        assert_eq!(
            after,
            before + 1,
            "case {i}: expected one more {kind:?}: {:?}",
            s.ts[1].counters(victim_qp)
        );
    }
    // No operation of the victim's was completed by any of it, and its
    // posted receives are still there.
    assert!(drain(&mut s.ts[1]).is_empty());
    assert_eq!(s.ts[1].resources(victim_qp).recvs_posted, 4);
    // Scribbling over the whole section of the rogue in the victim's window
    // (queues, FreeQ, credits) does no harm either.
    let sec = s.ts[1].layout().section_offset(2);
    let size = s.ts[1].layout().section_size();
    let mut junk = vec![0u8; size];
    Rng(99).fill(&mut junk);
    s.inj.scribble(sec, &junk).unwrap();
    for _ in 0..10 {
        s.ts[1].progress();
    }
    honest_traffic_works(&mut s);
    let _ = &s.rogue;
}

/// The victim (host 1) posts a 100-byte write from `src` to the rogue.
fn write_to_rogue(s: &mut Setup, q: Qp, src: RegionKey, cookie: u64) {
    let sge = Sge {
        key: src,
        offset: 0,
        len: 100,
    };
    let remote = RemoteAddr {
        key: RegionKey(1),
        offset: 0,
    };
    s.ts[1].post_write(q, &[sge], remote, cookie).unwrap();
}

#[test]
fn a_write_with_a_bad_sgl_fails_with_a_protocol_error() {
    // The rogue is the target: it answers our write intent with an SGL that
    // points outside its region area; the write must fail, not copy.
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let src = s.ts[1].register_region(4096, Access::LOCAL).unwrap();
    write_to_rogue(&mut s, q, src, 9);
    // The victim's first op; the SGL claims 200 bytes of a 100-byte write.
    let op1 = first_op_id(s.ts[1].incarnation());
    let big = sgl(op1, 0, &[((1 << 20) as u64, 200)]);
    s.inj
        .push(
            Ring::Tx,
            &wire::encode(&Msg::Sgl {
                op: op1,
                start: 0,
                n: 1,
                sges: big,
            }),
        )
        .unwrap();
    let c = collect(&mut s.ts, 1, 1);
    assert_eq!((c[0].cookie, c[0].status), (9, Status::Protocol));
    // An Ack for a write whose data never moved is a protocol error too.
    write_to_rogue(&mut s, q, src, 10);
    s.inj
        .push(
            Ring::Cq,
            &wire::encode(&Msg::Ack {
                op: op1 + 1,
                status: WireStatus::Ok,
                len: 100,
            }),
        )
        .unwrap();
    let c = collect(&mut s.ts, 1, 1);
    assert_eq!((c[0].cookie, c[0].status), (10, Status::Protocol));
    // An SGL that fails validation itself (an entry outside the window) is
    // dropped and counted, and fails the write it names at once (not by
    // its 10 s timeout).
    write_to_rogue(&mut s, q, src, 11);
    let outside = sgl(op1 + 2, 0, &[((64 << 20) as u64, 100)]);
    s.inj
        .push(
            Ring::Tx,
            &wire::encode(&Msg::Sgl {
                op: op1 + 2,
                start: 0,
                n: 1,
                sges: outside,
            }),
        )
        .unwrap();
    let t0 = Instant::now();
    let c = collect(&mut s.ts, 1, 1);
    assert_eq!((c[0].cookie, c[0].status), (11, Status::Protocol));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let q2 = s.ts[1].create_qp(2).unwrap();
    assert!(s.ts[1].counters(q2).dropped(DropKind::OutOfRange) >= 1);
    honest_traffic_works(&mut s);
}

fn ring_of(x: u8) -> Ring {
    [Ring::Rx, Ring::Tx, Ring::Cq, Ring::PostQ][(x % 4) as usize]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random and mutated messages from a rogue peer: no panic, no hang,
    /// protected memory intact, honest traffic unaffected.
    #[test]
    fn random_and_mutated_messages_do_no_harm(
        raw in prop::collection::vec((any::<u8>(), prop::array::uniform32(any::<u8>()), prop::array::uniform24(any::<u8>())), 1..48),
        mutate in prop::collection::vec((any::<u8>(), 0usize..56, any::<u8>()), 1..48),
    ) {
        let mut s = setup();
        let q = s.ts[1].create_qp(2).unwrap();
        let rb = s.ts[1].register_region(4096, Access::LOCAL).unwrap();
        for i in 0..4 {
            s.ts[1].post_recv(q, Sge { key: rb, offset: i * 1024, len: 1024 }, i).unwrap();
        }
        for (r, a, b) in raw {
            let mut body = [0u8; 56];
            body[..32].copy_from_slice(&a);
            body[32..].copy_from_slice(&b);
            body[0] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0x10, 0x11, body[0]][(body[0] % 12) as usize];
            s.inj.push(ring_of(r), &body).unwrap();
            s.ts[1].progress();
        }
        // Mutations of plausible messages naming the victim's real keys.
        let open = s.open.0;
        let base = [
            Msg::WriteReq { op: 1000, rkey: open, roff: 0, len: 100 },
            Msg::ReadReq { op: 1001, rkey: open, roff: 0, len: 100 },
            Msg::ReadIntent { op: 1002, rkey: open, roff: 0 },
            Msg::Rts { op: 1003, len: 100 },
            Msg::ChainRts { op: 1004, len: 100, prev: 2, next: Some(0) },
            Msg::ChainDone { op: 1004, origin: 2, len: 100 },
            Msg::Done { op: 1000, len: 100 },
            Msg::ReadSgl { op: 1001, start: 0, n: 1, sges: sgl(0, 0, &[(1 << 20, 100)]) },
            Msg::SendBuf { buf: 0, len: 10 },
        ];
        for (i, (which, at, x)) in mutate.into_iter().enumerate() {
            let m = base[which as usize % base.len()];
            let mut body = wire::encode(&m);
            body[at] ^= x;
            let ring = match m { Msg::WriteReq { .. } | Msg::Rts { .. } | Msg::ChainRts { .. } => Ring::Rx, Msg::Done { .. } | Msg::ChainDone { .. } => Ring::Cq, Msg::SendBuf { .. } => Ring::PostQ, _ => Ring::Tx };
            s.inj.push(if i % 7 == 0 { ring_of(x) } else { ring }, &body).unwrap();
            s.ts[1].progress();
        }
        let _ = drain(&mut s.ts[1]);
        honest_traffic_works(&mut s);
        let mut c = [Completion::default(); 4];
        let _ = s.ts[1].poll_completions(&mut c);
    }
}

/// A read of a region, served when the region is deregistered, ends then:
/// the rest of it is refused, and no byte of a region that reuses the area
/// reaches the reader.
#[test]
fn a_served_read_of_a_deregistered_region_copies_nothing_more() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let secret = s.ts[1]
        .register_region(4096, Access::LOCAL | Access::REMOTE_READ)
        .unwrap();
    s.ts[1].region_write(secret, 0, &[0x11; 4096]).unwrap();
    let read = Msg::ReadReq {
        op: 77,
        rkey: secret.0,
        roff: 0,
        len: 4096,
    };
    s.inj.push(Ring::Tx, &wire::encode(&read)).unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q).serving, 1);
    s.ts[1].deregister_region(secret).unwrap();
    assert_eq!(s.ts[1].resources(q).serving, 0, "the read is still served");
    // The area is reused for private bytes; the rogue's SGL then arrives.
    let reused = s.ts[1].register_region(4096, Access::LOCAL).unwrap();
    s.ts[1].region_write(reused, 0, &[0x55; 4096]).unwrap();
    let dst = 1u64 << 20;
    let m = Msg::ReadSgl {
        op: 77,
        start: 0,
        n: 1,
        sges: sgl(0, 0, &[(dst, 4096)]),
    };
    s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::UnknownOp), 1);
    let mut got = [0u8; 4096];
    s.rogue_dev
        .local_window(0)
        .unwrap()
        .read(dst as usize, &mut got)
        .unwrap();
    assert!(got.iter().all(|&b| b == 0), "bytes reached the reader");
    honest_traffic_works(&mut s);
}

/// A rendezvous write granted before its region is deregistered: the
/// region's bytes stay out of the area until the writer's `Done` (an
/// honest writer still writing into them lands in no one else's region),
/// or until the write expires.
#[test]
fn a_region_being_written_keeps_its_bytes_until_the_write_ends() {
    let mut cfg = Config::new(Geometry::small(3));
    cfg.op_timeout = Duration::from_millis(200);
    let mut s = setup_with(cfg);
    let q = s.ts[1].create_qp(2).unwrap();
    for (op, ends_by_done) in [(1u64, true), (2, false)] {
        let free = s.ts[1].region_area_free();
        // In two pieces, so not advertised for one-sided writes (only a
        // region in one piece is): only the served write holds it. An
        // advertised one also waits for its peers' acknowledgments of the
        // revocation.
        let target = s.ts[1]
            .register_region_scattered(8192, Access::ALL, 4096)
            .unwrap();
        let m = Msg::WriteReq {
            op,
            rkey: target.0,
            roff: 0,
            len: 8192,
        };
        s.inj.push(Ring::Rx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
        assert_eq!(s.ts[1].resources(q).serving, 1);
        s.ts[1].deregister_region(target).unwrap();
        assert_eq!(
            s.ts[1].region_area_free(),
            free - 8192,
            "write {op}: the bytes were freed under the writer"
        );
        if ends_by_done {
            let done = Msg::Done { op, len: 8192 };
            s.inj.push(Ring::Cq, &wire::encode(&done)).unwrap();
            s.ts[1].progress();
        } else {
            let end = Instant::now() + Duration::from_secs(5);
            while s.ts[1].resources(q).serving > 0 {
                s.ts[1].progress();
                assert!(Instant::now() < end, "the write never expired");
            }
        }
        assert_eq!(s.ts[1].resources(q).serving, 0);
        assert_eq!(s.ts[1].region_area_free(), free, "write {op}: bytes lost");
    }
    honest_traffic_works(&mut s);
}

#[test]
fn a_flood_of_requests_is_refused_past_the_limit() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let limit = 4096u64; // Config::new's max_outstanding
    for op in 1..=limit + 10 {
        let m = Msg::WriteReq {
            op,
            rkey: s.open.0,
            roff: 0,
            len: 10,
        };
        s.inj.push(Ring::Rx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
    }
    let c = s.ts[1].counters(q);
    assert_eq!(c.dropped(DropKind::Overload), 10, "{c:?}");
    assert_eq!(s.ts[1].resources(q).serving, limit as usize);
    honest_traffic_works(&mut s);
}

/// A peer advertising fresh region keys without end: the table of its
/// regions stops growing at its limit; the rest are refused and counted.
#[test]
fn advertisements_past_the_limit_are_refused() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let limit = 1u32 << 16; // MAX_REMOTE_REGIONS
    let offset = s.ts[1].layout().region_area_start() as u64;
    for rkey in 1..=limit + 10 {
        let m = Msg::Advertise {
            rkey,
            offset,
            len: 64,
        };
        s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
    }
    // A key already known is updated, not refused.
    let again = Msg::Advertise {
        rkey: 5,
        offset,
        len: 128,
    };
    s.inj.push(Ring::Tx, &wire::encode(&again)).unwrap();
    s.ts[1].progress();
    let c = s.ts[1].counters(q);
    assert_eq!(c.dropped(DropKind::Overload), 10, "{c:?}");
    assert_eq!(c.dropped_total(), 10, "{c:?}");
    // Revoking a refused region is acknowledged all the same (the peer
    // holds its bytes until then), and counted as an unknown key.
    let refused = limit + 5;
    s.inj
        .push(Ring::Tx, &wire::encode(&Msg::Revoke { rkey: refused }))
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::UnknownOp), 1);
    assert!(
        in_rogue_cq(&s, Msg::RevokeAck { rkey: refused }),
        "no RevokeAck for the refused region"
    );
    honest_traffic_works(&mut s);
}

/// A multicast target answering with storage entries no region of its
/// own could make (shorter than the area's grain before the end of the
/// transfer), in its first segment or a later one, fails its part of the
/// put: the initiator does not keep 16 bytes per byte.
#[test]
fn a_multicast_target_sending_crumbs_of_storage_fails_its_part() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let layout = *s.ts[1].layout();
    let area = layout.region_area_start() as u64;
    let src = s.ts[1].register_region(4096, Access::LOCAL).unwrap();
    let local = s.rogue_dev.local_window(0).unwrap();
    let rx = layout.part(1, Part::Rx);
    let depth = layout.geometry().queue_depth as usize;
    // Each case: its segments, as (transfer offset, entries).
    type Segment<'a> = (u32, &'a [(u64, u32)]);
    let cases: [&[Segment]; 2] = [
        &[(0, &[(area, 64), (area + 64, 1), (area + 128, 64)])],
        &[
            (0, &[(area, 128)]),
            (128, &[(area + 128, 32), (area + 192, 64)]),
        ],
    ];
    for (cookie, segments) in cases.into_iter().enumerate() {
        let sge = Sge {
            key: src,
            offset: 0,
            len: 4096,
        };
        s.ts[1]
            .post_multicast_put(&[q], &[sge], cookie as u64)
            .unwrap();
        s.ts[1].progress();
        // The request to send, as the rogue finds it in its window.
        let op = (0..depth)
            .filter_map(|k| {
                let mut body = [0u8; wire::BODY];
                local.read(rx + k * wire::SLOT, &mut body).unwrap();
                match wire::decode(&body) {
                    Ok(Msg::Rts { op, len: 4096 }) => Some(op),
                    _ => None,
                }
            })
            .max()
            .expect("no Rts in the rogue's window");
        for &(start, entries) in segments {
            let m = Msg::Sgl {
                op,
                start,
                n: entries.len() as u8,
                sges: sgl(op, start, entries),
            };
            s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
            s.ts[1].progress();
        }
        let c = collect(&mut s.ts[1..2], 0, 1);
        assert_eq!(
            (c[0].cookie, c[0].status),
            (cookie as u64, Status::Protocol),
            "{segments:?}: {c:?}"
        );
    }
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::OutOfRange), 2);
    honest_traffic_works(&mut s);
}

#[test]
fn one_peer_cannot_hold_the_whole_region_area() {
    // The rogue asks the victim for multicast storage, again and again: it
    // gets its share of the region area (half, with two other ports) and
    // no more; the honest peer's multicast still finds room.
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let free = s.ts[1].region_area_free();
    let chunk = (free / 5) as u32;
    for op in 1..=4u64 {
        s.inj
            .push(Ring::Rx, &wire::encode(&Msg::Rts { op, len: chunk }))
            .unwrap();
        s.ts[1].progress();
    }
    let c = s.ts[1].counters(q);
    assert_eq!(c.dropped(DropKind::Overload), 2, "{c:?}");
    assert_eq!(s.ts[1].resources(q).serving, 2);
    assert!(s.ts[1].region_area_free() >= free - 2 * u64::from(chunk) - 128);
    // The honest peer puts as much as the rogue was refused.
    let len = 2 * chunk as usize;
    let src = s.ts[0].register_region(len, Access::LOCAL).unwrap();
    s.ts[0].region_write(src, 0, &vec![0x77; len]).unwrap();
    let q0 = s.ts[0].create_qp(1).unwrap();
    let sge = Sge {
        key: src,
        offset: 0,
        len: len as u64,
    };
    s.ts[0].post_multicast_put(&[q0], &[sge], 77).unwrap();
    let c = collect(&mut s.ts, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (77, Status::Success));
    let got = drain(&mut s.ts[1]);
    let recv = got
        .iter()
        .find(|c| c.op == OpKind::MulticastRecv && c.peer == 0)
        .expect("the victim's multicast receive");
    let mut data = vec![0u8; len];
    s.ts[1]
        .region_read(recv.region.unwrap(), 0, &mut data)
        .unwrap();
    assert!(data.iter().all(|&b| b == 0x77));
}

// ---- eager buffers, credits and the backlog ----

/// The rogue's connection epoch with the victim (tags and FreeQ entries).
fn rogue_epoch(s: &Setup) -> u32 {
    epoch(s.rogue.incarnation(), s.ts[1].incarnation())
}

/// A FreeQ entry lending buffer `index` at sequence `seq`, as the
/// transport's `queue.rs` writes one: the epoch plus the sequence in the
/// high half, the index + 1 in the low half.
fn free_entry(epoch: u32, seq: u64, index: u32) -> u64 {
    (u64::from(epoch.wrapping_add(seq as u32)) << 32) | (u64::from(index) + 1)
}

/// A rogue that watches the victim's credits (they come back into the
/// rogue's own window) and keeps the victim's PostQ full of malformed sends
/// just ahead of it: each poll still takes at most one lap of the ring, so
/// the rogue cannot hold the victim's progress thread.
#[test]
fn a_peer_refilling_the_postq_ahead_of_the_victim_cannot_hold_its_poll() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let rb = s.ts[1].register_region(64, Access::LOCAL).unwrap();
    let sge = Sge {
        key: rb,
        offset: 0,
        len: 64,
    };
    // A posted receive, so the victim drains its PostQ; never consumed,
    // since nothing the rogue sends is valid.
    s.ts[1].post_recv(q, sge, 1).unwrap();
    let depth = u64::from(Geometry::small(3).queue_depth);
    let layout = *s.ts[1].layout();
    let e = rogue_epoch(&s);
    let mut inj = Injector::new(&*s.rogue_dev, 1, layout, e).unwrap();
    let local = s.rogue_dev.local_window(0).unwrap();
    let credit = layout.part(1, Part::Credits) + 8 * Ring::PostQ.index();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rogue = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut pushed = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // The credit's low 32 bits (the high ones are the epoch).
                let consumed = local.load_u64(credit).unwrap() & 0xffff_ffff;
                while pushed < consumed + depth {
                    inj.push(Ring::PostQ, &[0xff; 56]).unwrap();
                    pushed += 1;
                }
            }
            pushed
        })
    };
    // Polls until the rogue got 100 laps in (or 10 s passed: the assert
    // below then says it barely ran).
    let (mut most, mut before) = (0, 0);
    let end = Instant::now() + Duration::from_secs(10);
    while before < 100 * depth && Instant::now() < end {
        s.ts[1].progress();
        let now = s.ts[1].counters(q).dropped_total();
        most = most.max(now - before);
        before = now;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let pushed = rogue.join().unwrap();
    assert!(
        before > 4 * depth,
        "the rogue barely ran: {before} dropped, {pushed} pushed"
    );
    assert!(
        most <= depth,
        "one poll took {most} slots, more than the ring's {depth} (of {pushed} pushed)"
    );
    // The receive is still posted, untouched by the flood.
    assert_eq!(s.ts[1].resources(q).recvs_posted, 1);
}

#[test]
fn bad_freeq_entries_are_counted_as_bad_buffers_and_lend_nothing() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let count = Geometry::small(3).eager_count;
    for _ in 0..100 {
        s.ts[1].progress();
    }
    // The rogue lent its buffers at connect time: the victim holds them all.
    assert_eq!(s.ts[1].resources(q).eager_free, count);
    let e = rogue_epoch(&s);
    let fq = s.ts[1].layout().part(2, Part::FreeQ);
    // The victim expects entry `count` next, in slot 0 of the FreeQ.
    // A buffer index out of range:
    s.inj
        .scribble(
            fq,
            &free_entry(e, u64::from(count), count + 5).to_le_bytes(),
        )
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::BadBuffer), 1);
    // A buffer the victim already holds (lent twice):
    s.inj
        .scribble(
            fq + 8,
            &free_entry(e, u64::from(count) + 1, 0).to_le_bytes(),
        )
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::BadBuffer), 2);
    // An entry of another epoch is not one (not taken, not counted).
    s.inj
        .scribble(
            fq + 16,
            &free_entry(e ^ 1, u64::from(count) + 2, 1).to_le_bytes(),
        )
        .unwrap();
    s.ts[1].progress();
    let c = s.ts[1].counters(q);
    assert_eq!(c.dropped(DropKind::BadBuffer), 2, "{c:?}");
    assert_eq!(c.dropped_total(), 2, "{c:?}");
    assert_eq!(
        s.ts[1].resources(q).eager_free,
        count,
        "a bad FreeQ entry lent a buffer"
    );
    honest_traffic_works(&mut s);
}

#[test]
fn nonsense_credit_words_are_counted_and_a_sane_one_releases_the_backlog() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let depth = u64::from(Geometry::small(3).queue_depth);
    let credit = s.ts[1].layout().part(2, Part::Credits) + 8 * Ring::Tx.index();
    let bad = |s: &Setup| s.ts[1].counters(q).dropped(DropKind::BadCredit);
    // Write requests the victim grants, each answered with an SGL on the
    // rogue's TX ring; the rogue never credits, so past the ring's depth
    // the answers wait in the backlog. One TX slot already holds the
    // victim's advertisement of its open region (one-sided writes).
    for op in 1..=depth + 3 {
        let m = Msg::WriteReq {
            op,
            rkey: s.open.0,
            roff: 0,
            len: 64,
        };
        s.inj.push(Ring::Rx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].resources(q).backlog, 4);
    assert_eq!(bad(&s), 0);
    // A credit beyond what was produced: counted, nothing sent.
    s.inj
        .scribble(credit, &s.inj.credit_word(depth + 100).to_le_bytes())
        .unwrap();
    s.ts[1].progress();
    assert!(bad(&s) >= 1);
    assert_eq!(s.ts[1].resources(q).backlog, 4);
    // A sane partial credit sends two.
    s.inj
        .scribble(credit, &s.inj.credit_word(2).to_le_bytes())
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q).backlog, 2);
    // A credit going backwards: counted, nothing sent.
    let before = bad(&s);
    s.inj
        .scribble(credit, &s.inj.credit_word(1).to_le_bytes())
        .unwrap();
    s.ts[1].progress();
    assert!(bad(&s) > before);
    assert_eq!(s.ts[1].resources(q).backlog, 2);
    // Crediting everything produced releases the rest.
    s.inj
        .scribble(credit, &s.inj.credit_word(depth + 2).to_le_bytes())
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q).backlog, 0);
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// `BACKLOG_LIMIT` of `transport/conn.rs`: most messages waiting for
/// credits towards one ring of a peer.
const BACKLOG_LIMIT: usize = 1 << 16;

#[test]
fn a_peer_that_stops_crediting_is_disconnected_past_the_backlog_limit() {
    // The rogue keeps asking and never credits the answers: the victim
    // queues them up to the limit, then drops the connection instead of
    // growing without bound. The operation timeout is an hour, so the
    // stall detector cannot be what ends it.
    let mut cfg = Config::new(Geometry::small(3));
    cfg.op_timeout = Duration::from_secs(3600);
    cfg.max_outstanding = 64;
    let mut s = setup_with(cfg);
    let q = s.ts[1].create_qp(2).unwrap();
    let mut most = 0;
    let mut asked = 0u64;
    while s.ts[1].is_connected(2) {
        asked += 1;
        assert!(
            asked < 4 * BACKLOG_LIMIT as u64,
            "still connected with a backlog of {}",
            s.ts[1].resources(q).backlog
        );
        let m = Msg::WriteReq {
            op: asked,
            rkey: s.open.0,
            roff: 0,
            len: 64,
        };
        s.inj.push(Ring::Rx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
        most = most.max(s.ts[1].resources(q).backlog);
    }
    // Granted (64 served) or refused ("no room", on the CQ), every
    // request was answered; the CQ's answers reached the limit.
    assert!(
        most >= BACKLOG_LIMIT,
        "disconnected at a backlog of {most}, below the limit"
    );
    assert!(asked > BACKLOG_LIMIT as u64);
    let c = s.ts[1].counters(q);
    assert_eq!((c.disconnects, c.resyncs), (1, 0), "{c:?}");
    assert!(
        c.dropped(DropKind::Overload) >= BACKLOG_LIMIT as u64,
        "{c:?}"
    );
    assert_ne!(
        s.ts[1].peer_state(2),
        ntbdk_pmd::transport::PeerState::Connected
    );
    let r = s.ts[1].resources(q);
    assert_eq!((r.backlog, r.serving, r.outstanding), (0, 0, 0), "{r:?}");
    honest_traffic_works(&mut s);
}

/// Posts towards a peer that stops crediting wait in the backlog like any
/// message: reads of unknown size (a request each), rendezvous writes (a
/// request each), one-sided writes with an immediate (a notice each, one by
/// one or in batches) and multicast puts (a request each). Past the room a
/// post may take of the backlog they are refused as `Busy`, not queued
/// until the backlog overflows and resets the connection.
#[test]
fn posts_past_the_backlog_room_are_busy_not_a_reset() {
    type Post = fn(&mut Transport, Qp, RegionKey, RegionKey, u64) -> Result<usize, TransportError>;
    fn at(key: RegionKey) -> RemoteAddr {
        RemoteAddr { key, offset: 0 }
    }
    fn from(src: RegionKey) -> [Sge; 1] {
        [Sge {
            key: src,
            offset: 0,
            len: 64,
        }]
    }
    let posts: [(&str, Post); 5] = [
        ("read of unknown size", |t, q, _, remote, i| {
            t.post_read_unknown(q, at(remote), 64, i).map(|()| 1)
        }),
        ("rendezvous write", |t, q, src, remote, i| {
            t.post_write(q, &from(src), at(remote), i).map(|()| 1)
        }),
        ("one-sided write with an immediate", |t, q, _, remote, i| {
            t.post_write_direct(q, &[1; 64], at(remote), Some(i), i)
                .map(|()| 1)
        }),
        (
            "batch of one-sided writes with immediates",
            |t, q, _, remote, i| {
                let wrs: Vec<DirectWr> = (0..1000)
                    .map(|k| DirectWr {
                        data: &[1; 64],
                        remote: at(remote),
                        imm: Some(i + k),
                        signaled: false,
                        cookie: i + k,
                    })
                    .collect();
                t.post_writes_direct(q, &wrs)
            },
        ),
        ("multicast put", |t, q, src, _, i| {
            t.post_multicast_put(&[q], &from(src), i).map(|()| 1)
        }),
    ];
    for (what, post) in posts {
        let mut cfg = Config::new(Geometry::small(3));
        cfg.op_timeout = Duration::from_secs(3600);
        cfg.max_outstanding = 4 * BACKLOG_LIMIT;
        let mut s = setup_with(cfg);
        let q = s.ts[1].create_qp(2).unwrap();
        let src = s.ts[1].register_region(64, Access::ALL).unwrap();
        // A region of the rogue's, advertised for one-sided writes.
        let remote = RegionKey(0x5eed);
        let offset = s.rogue.layout().region_area_start() as u64;
        let m = Msg::Advertise {
            rkey: remote.0,
            offset,
            len: 4096,
        };
        s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
        let mut posted = 0usize;
        let err = loop {
            match post(&mut s.ts[1], q, src, remote, posted as u64) {
                Ok(n) => posted += n,
                Err(e) => break e,
            }
            assert!(posted <= 2 * BACKLOG_LIMIT, "{what}: never refused");
        };
        assert!(
            matches!(err, TransportError::Busy { peer: 2, .. }),
            "{what}: {err:?} after {posted}"
        );
        assert!(
            posted >= BACKLOG_LIMIT / 2,
            "{what}: refused early, at {posted}"
        );
        let backlog = s.ts[1].resources(q).backlog;
        assert!(
            backlog <= BACKLOG_LIMIT / 2,
            "{what}: the backlog holds {backlog}"
        );
        s.ts[1].progress();
        assert!(s.ts[1].is_connected(2), "{what}: the connection was reset");
        assert_eq!(s.ts[1].counters(q).disconnects, 0, "{what}");
    }
}

// ---- storage held for an initiator that goes away ----

/// The rogue asks the victim for multicast storage twice (and never puts
/// anything into it); returns the victim's region-area free bytes before.
fn rogue_holds_storage(s: &mut Setup, q: Qp) -> u64 {
    let free0 = s.ts[1].region_area_free();
    for op in 1..=2u64 {
        let m = Msg::Rts { op, len: 100_000 };
        s.inj.push(Ring::Rx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].resources(q).serving, 2);
    assert!(s.ts[1].region_area_free() <= free0 - 200_000);
    free0
}

/// An initiator whose link goes down: its storage is held until its
/// deadline (a host seen down may only have stalled, and write on when it
/// comes back under the same generation), then freed.
#[test]
fn storage_held_for_a_dead_initiator_is_freed() {
    let op_timeout = Duration::from_millis(300);
    let mut cfg = Config::new(Geometry::small(3));
    cfg.op_timeout = op_timeout;
    let mut s = setup_with(cfg);
    let q = s.ts[1].create_qp(2).unwrap();
    let free0 = rogue_holds_storage(&mut s, q);
    s._fabric.kill(2);
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].is_connected(2) {
        s.ts[1].progress();
        assert!(Instant::now() < end, "the victim did not see the death");
    }
    assert_eq!(s.ts[1].resources(q).serving, 0);
    let end = Instant::now() + 2 * op_timeout + Duration::from_secs(5);
    while s.ts[1].region_area_free() != free0 {
        s.ts[1].progress();
        assert!(
            Instant::now() < end,
            "the dead initiator's storage was never freed"
        );
    }
    assert!(
        drain(&mut s.ts[1]).iter().all(|c| c.peer != 2),
        "storage nothing was put into was delivered"
    );
    honest_traffic_works(&mut s);
}

#[test]
fn storage_held_for_a_silent_initiator_is_freed_after_the_timeout() {
    let op_timeout = Duration::from_millis(300);
    let mut cfg = Config::new(Geometry::small(3));
    cfg.op_timeout = op_timeout;
    let mut s = setup_with(cfg);
    let q = s.ts[1].create_qp(2).unwrap();
    let asked = Instant::now();
    let free0 = rogue_holds_storage(&mut s, q);
    let end = asked + op_timeout + Duration::from_secs(5);
    while s.ts[1].region_area_free() != free0 {
        s.ts[1].progress();
        assert!(Instant::now() < end, "storage still held");
    }
    assert!(asked.elapsed() >= op_timeout, "{:?}", asked.elapsed());
    assert_eq!(s.ts[1].resources(q).serving, 0);
    assert!(s.ts[1].is_connected(2));
    // The initiator's late `Done` names nothing any more.
    let before = s.ts[1].counters(q).dropped(DropKind::UnknownOp);
    s.inj
        .push(
            Ring::Cq,
            &wire::encode(&Msg::Done {
                op: 1,
                len: 100_000,
            }),
        )
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::UnknownOp), before + 1);
    assert!(drain(&mut s.ts[1]).iter().all(|c| c.peer != 2));
    honest_traffic_works(&mut s);
}

/// A write into a region of more tiny extents than the victim's queue to
/// the writer can carry as one SGL is refused ("no room", an overload), not
/// granted into a backlog that overflows and resets the connection.
#[test]
fn a_write_spanning_too_many_extents_is_refused_not_a_reset() {
    let mut s = setup_on(Config::new(Geometry::small(3)), 32 << 20);
    let q = s.ts[1].create_qp(2).unwrap();
    // 64-byte extents: 21 MiB is 344 064 of them, 68 813 SGL messages: more
    // than the whole backlog holds (granted, they reset the connection),
    // and than the half of it one SGL may take.
    let len = 21usize << 20;
    let target = s.ts[1]
        .register_region_scattered(len, Access::ALL, 64)
        .unwrap();
    let small = s.ts[1]
        .register_region_scattered(64 << 10, Access::ALL, 64)
        .unwrap();
    let write = |op: u64, key: RegionKey, len: usize| Msg::WriteReq {
        op,
        rkey: key.0,
        roff: 0,
        len: len as u32,
    };
    s.inj
        .push(Ring::Rx, &wire::encode(&write(1, target, len)))
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q).serving, 0, "the write was granted");
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 1);
    assert!(s.ts[1].is_connected(2), "the connection was reset");
    assert!(acked(&s, 1, WireStatus::NoRoom), "no 'no room' answer");
    // A write over 1024 of the same extents (205 SGL messages) is served.
    s.inj
        .push(Ring::Rx, &wire::encode(&write(2, small, 64 << 10)))
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q).serving, 1, "a fitting write is served");
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 1);
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// Whether the victim wrote `want` into the rogue's CQ ring.
fn in_rogue_cq(s: &Setup, want: Msg) -> bool {
    let layout = *s.ts[1].layout();
    let cq = layout.part(1, Part::Cq);
    let local = s.rogue_dev.local_window(0).unwrap();
    (0..layout.geometry().queue_depth as usize).any(|k| {
        let mut body = [0u8; wire::BODY];
        local.read(cq + k * wire::SLOT, &mut body).unwrap();
        wire::decode(&body) == Ok(want)
    })
}

/// Whether the victim answered the rogue's op `op` with an `Ack` of
/// `status`.
fn acked(s: &Setup, op: u64, status: WireStatus) -> bool {
    in_rogue_cq(s, Msg::Ack { op, status, len: 0 })
}

/// Fills `t`'s region area with 64-byte regions, then frees every other
/// one of the first 2 × 172 032: storage allocated now is scattered over
/// 64-byte holes, 34 407 SGL messages for all of them, more than the half
/// of the backlog one SGL may take. Returns how many holes.
fn fragment(t: &mut Transport) -> usize {
    let mut fill = Vec::new();
    while let Ok(k) = t.register_region(64, Access::LOCAL) {
        fill.push(k);
    }
    let holes = 172_032usize;
    assert!(fill.len() >= 2 * holes, "area too small: {}", fill.len());
    for k in fill.iter().step_by(2).take(holes) {
        t.deregister_region(*k).unwrap();
    }
    holes
}

/// Storage the victim allocates for a multicast lands in a region area
/// fragmented into 64-byte holes: its SGL would overflow the queue to the
/// one it goes to (the initiator, or a chain's previous link), so the
/// request is refused ("no room", an overload) and the storage freed; no
/// connection is reset, the victim's own included.
#[test]
fn multicast_storage_too_scattered_for_one_sgl_is_refused_not_a_reset() {
    let cfg = Config {
        peer_storage_quota: Some(u64::MAX),
        ..Config::new(Geometry::small(3))
    };
    let mut s = setup_on(cfg, 32 << 20);
    let q = s.ts[1].create_qp(2).unwrap();
    let holes = fragment(&mut s.ts[1]);
    let free = s.ts[1].region_area_free();
    let len = (holes * 64) as u32;
    let requests = [
        Msg::Rts { op: 1, len },
        Msg::ChainRts {
            op: 2,
            len,
            prev: 2,
            next: None,
        },
        Msg::ChainRts {
            op: 3,
            len,
            prev: 0,
            next: None,
        },
    ];
    for (i, m) in requests.iter().enumerate() {
        s.inj.push(Ring::Rx, &wire::encode(m)).unwrap();
        s.ts[1].progress();
        let op = i as u64 + 1;
        assert_eq!(s.ts[1].resources(q).serving, 0, "request {op} was served");
        assert_eq!(
            s.ts[1].counters(q).dropped(DropKind::Overload),
            op,
            "request {op}"
        );
        assert!(
            acked(&s, op, WireStatus::NoRoom),
            "request {op}: no 'no room'"
        );
        assert_eq!(
            s.ts[1].region_area_free(),
            free,
            "request {op}: storage kept"
        );
        assert!(s.ts[1].is_connected(2) && s.ts[1].is_connected(0));
    }
    assert!(s.ts[0].is_connected(1), "the third port's link was reset");
    honest_traffic_works(&mut s);
}

/// Our own reads into storage too scattered for one SGL fail cleanly: a
/// read into a local region of too many small extents is refused when
/// posted (`SglTooLong`, nothing sent); a read of unknown size whose
/// storage lands on a fragmented area completes `TooLarge`, the storage
/// freed. No connection resets.
#[test]
fn a_read_into_storage_too_scattered_for_one_sgl_fails_cleanly() {
    let mut s = setup_on(Config::new(Geometry::small(3)), 32 << 20);
    let q0 = s.ts[0].create_qp(1).unwrap();
    let len = 172_032usize * 64;
    let remote = s.ts[1].register_region(len, Access::ALL).unwrap();
    let into = s.ts[0]
        .register_region_scattered(len, Access::ALL, 64)
        .unwrap();
    let sge = Sge {
        key: into,
        offset: 0,
        len: len as u64,
    };
    let at = RemoteAddr {
        key: remote,
        offset: 0,
    };
    match s.ts[0].post_read(q0, &[sge], at, 1) {
        Err(TransportError::SglTooLong { msgs, max }) => assert!(msgs > max, "{msgs} {max}"),
        other => panic!("a read with a 34 408-message SGL: {other:?}"),
    }
    assert_eq!(s.ts[0].resources(q0).outstanding, 0, "nothing was posted");
    s.ts[0].deregister_region(into).unwrap();

    fragment(&mut s.ts[0]);
    let free = s.ts[0].region_area_free();
    s.ts[0].post_read_unknown(q0, at, u64::MAX, 2).unwrap();
    let c = collect(&mut s.ts, 0, 1);
    assert_eq!((c[0].status, c[0].cookie), (Status::TooLarge, 2));
    assert_eq!(s.ts[0].region_area_free(), free, "the storage was kept");
    assert!(s.ts[0].is_connected(1) && s.ts[1].is_connected(0));
}

// ---- cancelled multicasts ----

/// Storage the victim holds for the rogue's multicasts: a `Cancel` frees
/// storage only the rogue could write at once, but not a chain link's
/// whose storage went to a third port (only that port can release it), and
/// the rogue can neither release that one itself nor cancel anyone else's.
#[test]
fn a_cancel_frees_only_storage_no_other_peer_may_write() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let q0 = s.ts[1].create_qp(0).unwrap();
    let free0 = s.ts[1].region_area_free();
    let len = 100_000;
    let requests = [
        Msg::Rts { op: 1, len },
        // Storage the honest port 0 will write (the chain's previous link).
        Msg::ChainRts {
            op: 2,
            len,
            prev: 0,
            next: None,
        },
    ];
    for m in requests {
        s.inj.push(Ring::Rx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].resources(q).serving, 2);
    // What one request's storage takes of the area.
    let each = (free0 - s.ts[1].region_area_free()) / 2;
    // An honest multicast from port 0, served beside them.
    multicast_from_0(&mut s, &[1], len, MulticastMode::FanOut, 9);
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].resources(q0).serving == 0 {
        s.ts[1].progress();
        assert!(Instant::now() < end, "the honest multicast was not served");
    }
    let drops = |s: &Setup| s.ts[1].counters(q).dropped_total();
    let before = drops(&s);
    let free = s.ts[1].region_area_free();
    let cancels = [
        (Ring::Rx, Msg::Cancel { op: 1 }),
        (Ring::Rx, Msg::Cancel { op: 2 }),
        // Port 0's first op: not the rogue's to cancel.
        (
            Ring::Rx,
            Msg::Cancel {
                op: first_op_id(s.ts[0].incarnation()),
            },
        ),
        // Never asked for.
        (Ring::Rx, Msg::Cancel { op: 77 }),
        // The rogue is the chain's origin, not its previous link.
        (Ring::Cq, Msg::ChainRelease { op: 2, origin: 2 }),
    ];
    for (ring, m) in cancels {
        s.inj.push(ring, &wire::encode(&m)).unwrap();
    }
    s.ts[1].progress();
    assert_eq!(
        s.ts[1].resources(q).serving,
        1,
        "the chain link's storage went"
    );
    assert_eq!(s.ts[1].resources(q0).serving, 1, "port 0's storage went");
    assert_eq!(s.ts[1].region_area_free(), free + each);
    assert_eq!(
        drops(&s),
        before + 1,
        "only the release from the origin is a drop"
    );
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::OutOfRange), 1);
    assert!(s.ts[1].is_connected(2));
    // Port 0's multicast still completes, and the victim still serves.
    let c = collect(&mut s.ts, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (9, Status::Success));
    let got = collect(&mut s.ts, 1, 1);
    assert_eq!((got[0].peer, got[0].op), (0, OpKind::MulticastRecv));
    honest_traffic_works(&mut s);
}

/// Only a chain link's previous target may release the storage it was
/// given: the rogue's release of storage the victim gave port 0 changes
/// nothing (an unknown operation); its release of storage the victim gave
/// the rogue itself frees it at once.
#[test]
fn only_the_previous_link_of_a_chain_can_release_its_storage() {
    let mut s = setup();
    let q0 = s.ts[1].create_qp(0).unwrap();
    let q2 = s.ts[1].create_qp(2).unwrap();
    let len = 100_000u32;
    let src = s.ts[0]
        .register_region(len as usize, Access::LOCAL)
        .unwrap();
    let to = |t: &mut Transport, p: u16| t.create_qp(p).unwrap();
    let (q01, q02) = (to(&mut s.ts[0], 1), to(&mut s.ts[0], 2));
    let sge = [Sge {
        key: src,
        offset: 0,
        len: len.into(),
    }];
    // Op 1: the victim first (its storage goes to port 0), then the rogue.
    // Op 2: the rogue first, then the victim (its storage goes to the rogue).
    let mode = ntbdk_pmd::transport::MulticastMode::Chain;
    s.ts[0]
        .post_multicast_put_with(&[q01, q02], &sge, mode, 1)
        .unwrap();
    s.ts[0]
        .post_multicast_put_with(&[q02, q01], &sge, mode, 2)
        .unwrap();
    let free = s.ts[1].region_area_free();
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].resources(q0).serving < 2 {
        s.ts[0].progress();
        s.ts[1].progress();
        assert!(Instant::now() < end, "the chains were not served");
    }
    let free0 = s.ts[1].region_area_free();
    let before = s.ts[1].counters(q2).dropped(DropKind::UnknownOp);
    let release = |op| Msg::ChainRelease { op, origin: 0 };
    let op1 = first_op_id(s.ts[0].incarnation());
    s.inj.push(Ring::Cq, &wire::encode(&release(op1))).unwrap();
    s.ts[1].progress();
    assert_eq!(
        s.ts[1].resources(q0).serving,
        2,
        "port 0's link was released"
    );
    assert_eq!(
        s.ts[1].counters(q2).dropped(DropKind::UnknownOp),
        before + 1
    );
    s.inj
        .push(Ring::Cq, &wire::encode(&release(op1 + 1)))
        .unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q0).serving, 1);
    let each = (free - free0) / 2;
    assert_eq!(s.ts[1].region_area_free(), free0 + each);
    assert!(s.ts[1].is_connected(2) && s.ts[1].is_connected(0));
    honest_traffic_works(&mut s);
}

/// A chain 0 → 2 (the rogue) → 1 (the victim) → 3 whose initiator cancels
/// it before its put: the victim keeps its own storage (the rogue may
/// still write it) and releases port 3's, which port 3 frees. The rogue's
/// `ChainDone` afterwards makes the victim free its storage, but deliver
/// and forward nothing: never a write into port 3's released storage.
#[test]
fn a_cancelled_link_forwards_nothing_into_released_storage() {
    let fabric = LoopbackFabric::new(4, 4 << 20);
    // The initiator gives up after 300 ms; the targets would wait a minute.
    let cfg = |p: u16| Config {
        op_timeout: Duration::from_millis(if p == 0 { 300 } else { 60_000 }),
        ..Config::new(Geometry::small(4))
    };
    let rogue_dev: Arc<LoopbackDevice> = Arc::new(fabric.join(2).unwrap());
    let mut rogue = Transport::new(rogue_dev.clone(), cfg(2)).unwrap();
    let mut ts: Vec<Transport> = [0u16, 1, 3]
        .iter()
        .map(|&p| Transport::new(Arc::new(fabric.join(p).unwrap()), cfg(p)).unwrap())
        .collect();
    let end = Instant::now() + Duration::from_secs(5);
    while !(ts
        .iter()
        .all(|t| (0..4).all(|q| q == t.port() || t.is_connected(q)))
        && rogue.is_connected(1))
    {
        rogue.progress();
        for t in ts.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end, "the fabric did not connect");
    }
    let e = epoch(rogue.incarnation(), ts[1].incarnation());
    let mut inj = Injector::new(&*rogue_dev, 1, *ts[1].layout(), e).unwrap();
    let len = 100_000u32;
    let src = ts[0].register_region(len as usize, Access::LOCAL).unwrap();
    let qps: Vec<Qp> = [2u16, 1, 3]
        .iter()
        .map(|&p| ts[0].create_qp(p).unwrap())
        .collect();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: len.into(),
    }];
    let mode = ntbdk_pmd::transport::MulticastMode::Chain;
    ts[0].post_multicast_put_with(&qps, &sge, mode, 5).unwrap();
    let (victim_q0, next_q0) = (ts[1].create_qp(0).unwrap(), ts[2].create_qp(0).unwrap());
    let free3 = ts[2].region_area_free();
    // The initiator's op times out (the rogue never answers): cancelled.
    let c = collect(&mut ts, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (5, Status::Timeout));
    let end = Instant::now() + Duration::from_secs(5);
    while ts[2].resources(next_q0).serving > 0 {
        for t in ts.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end, "port 3's storage was not released");
    }
    assert_eq!(ts[2].region_area_free(), free3);
    assert_eq!(
        ts[1].resources(victim_q0).serving,
        1,
        "the victim's storage went early"
    );
    // The rogue says it deposited the data.
    let done = Msg::ChainDone {
        op: first_op_id(ts[0].incarnation()),
        origin: 0,
        len,
    };
    inj.push(Ring::Cq, &wire::encode(&done)).unwrap();
    for _ in 0..100 {
        for t in ts.iter_mut() {
            t.progress();
        }
    }
    assert_eq!(ts[1].resources(victim_q0).serving, 0);
    let q13 = ts[1].create_qp(3).unwrap();
    assert!(
        ts[1].is_connected(3) && ts[1].counters(q13).disconnects == 0,
        "the victim wrote into port 3's released storage"
    );
    assert!(
        drain(&mut ts[1]).is_empty(),
        "a cancelled multicast was delivered"
    );
    assert!(drain(&mut ts[2]).is_empty());
    let q31 = ts[2].create_qp(1).unwrap();
    assert_eq!(ts[2].counters(q31).dropped_total(), 0);
}

/// Storage a next target (here the rogue) sent for a chain of port 0's
/// before port 0's request arrived is released to it when the victim's
/// connection to port 0 ends, not kept until it expires (and then counted
/// against the next target, which did nothing wrong).
#[test]
fn early_chain_storage_is_released_when_its_origin_goes() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let area = s.ts[1].layout().region_area_start() as u64;
    let early = Msg::ChainSgl {
        op: 5,
        origin: 0,
        start: 0,
        n: 1,
        sges: sgl(5, 0, &[(area, 4096)]),
    };
    s.inj.push(Ring::Tx, &wire::encode(&early)).unwrap();
    s.ts[1].progress();
    let release = Msg::ChainRelease { op: 5, origin: 0 };
    assert!(
        !in_rogue_cq(&s, release),
        "released while its request may come"
    );
    s._fabric.kill(0);
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].is_connected(0) {
        s.ts[1].progress();
        assert!(Instant::now() < end, "the victim did not see the death");
    }
    assert!(in_rogue_cq(&s, release), "no release when the origin went");
    assert_eq!(s.ts[1].counters(q).dropped_total(), 0);
    assert!(s.ts[1].is_connected(2));
}

/// A next target's storage for a chain of `origin`'s, op `op`, as the
/// rogue (the next target) would send it: one 4096-byte extent at the
/// start of the victim's region area.
fn early_sgl(s: &Setup, op: u64, origin: u16) -> Msg {
    let area = s.ts[1].layout().region_area_start() as u64;
    Msg::ChainSgl {
        op,
        origin,
        start: 0,
        n: 1,
        sges: sgl(op, 0, &[(area, 4096)]),
    }
}

/// Storage for a chain the rogue says it started itself (it names itself
/// as the origin of a chain it is the next link of) is no storage: counted
/// as an unknown operation, not kept and not released.
#[test]
fn chain_storage_from_its_own_origin_is_refused() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let m = early_sgl(&s, 5, 2);
    s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
    s.ts[1].progress();
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::UnknownOp), 1);
    assert_eq!(s.ts[1].counters(q).dropped_total(), 1);
    assert!(!in_rogue_cq(&s, Msg::ChainRelease { op: 5, origin: 2 }));
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// Storage sent before its request is kept for at most 64 operations of
/// one origin from one sender: the 65th is counted as an overload and
/// released to its sender at once (the victim will never write it), the
/// others kept. Another origin's storage from the same sender still has
/// room (port 3, which has not joined the fabric yet).
#[test]
fn early_chain_storage_past_the_per_pair_bound_is_released_at_once() {
    let mut s = setup_with(Config::new(Geometry::small(4)));
    let q = s.ts[1].create_qp(2).unwrap();
    let first = 1000u64;
    for k in 0..65 {
        let m = early_sgl(&s, first + k, 0);
        s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 1);
    assert_eq!(s.ts[1].counters(q).dropped_total(), 1);
    let release = |op| Msg::ChainRelease { op, origin: 0 };
    assert!(
        in_rogue_cq(&s, release(first + 64)),
        "the 65th was not released"
    );
    assert!(!in_rogue_cq(&s, release(first)), "a kept one was released");
    let other = early_sgl(&s, first, 3);
    s.inj.push(Ring::Tx, &wire::encode(&other)).unwrap();
    s.ts[1].progress();
    assert_eq!(
        s.ts[1].counters(q).dropped_total(),
        1,
        "no room for port 3's"
    );
    assert!(!in_rogue_cq(
        &s,
        Msg::ChainRelease {
            op: first,
            origin: 3
        }
    ));
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// Storage for a chain whose origin the victim is not connected to (a
/// handshake completes on one side first) is kept for its request, and
/// released to its sender when no request comes within the operation
/// timeout; the sender is not counted against.
#[test]
fn early_chain_storage_before_a_connection_is_kept_then_released() {
    let mut s = setup_with(Config {
        op_timeout: Duration::from_millis(300),
        ..Config::new(Geometry::small(3))
    });
    let q = s.ts[1].create_qp(2).unwrap();
    s._fabric.kill(0);
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].is_connected(0) {
        s.ts[1].progress();
        assert!(Instant::now() < end, "the victim did not see the death");
    }
    let m = early_sgl(&s, 5, 0);
    s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
    s.ts[1].progress();
    let release = Msg::ChainRelease { op: 5, origin: 0 };
    assert!(
        !in_rogue_cq(&s, release),
        "released while its request may come"
    );
    let end = Instant::now() + Duration::from_secs(5);
    while !in_rogue_cq(&s, release) {
        s.ts[1].progress();
        assert!(Instant::now() < end, "never released");
    }
    assert_eq!(s.ts[1].counters(q).dropped_total(), 0);
    assert!(s.ts[1].is_connected(2));
}

/// The rogue's injector into port 0's window, once the two are connected.
fn injector_into_0(s: &mut Setup) -> Injector {
    let end = Instant::now() + Duration::from_secs(5);
    while !(s.ts[0].is_connected(2) && s.rogue.is_connected(0)) {
        s.ts[0].progress();
        s.rogue.progress();
        s.ts[1].progress();
        assert!(Instant::now() < end, "the rogue did not connect to port 0");
    }
    let e0 = epoch(s.rogue.incarnation(), s.ts[0].incarnation());
    Injector::new(&*s.rogue_dev, 0, *s.ts[0].layout(), e0).unwrap()
}

/// Starts the rogue's chain op `op` of `len` bytes whose last link is port
/// 0, with the victim as its previous link: port 0 serves it and sends its
/// storage to the victim, which has not been asked yet and keeps it for
/// its request. Returns port 0's queue pair to the rogue.
fn rogue_chain_ending_at_0(s: &mut Setup, op: u64, len: u32) -> Qp {
    let mut inj0 = injector_into_0(s);
    let last = Msg::ChainRts {
        op,
        len,
        prev: 1,
        next: None,
    };
    inj0.push(Ring::Rx, &wire::encode(&last)).unwrap();
    let q02 = s.ts[0].create_qp(2).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[0].resources(q02).serving == 0 {
        s.ts[0].progress();
        assert!(Instant::now() < end, "port 0 did not serve the chain");
    }
    for _ in 0..10 {
        s.ts[1].progress();
    }
    q02
}

/// The rogue asks the victim to be the middle link of its chain op `op`
/// (2 → 1 → 0).
fn ask_victim_as_middle_link(s: &mut Setup, op: u64, len: u32) {
    let middle = Msg::ChainRts {
        op,
        len,
        prev: 2,
        next: Some(0),
    };
    s.inj.push(Ring::Rx, &wire::encode(&middle)).unwrap();
}

/// A `Cancel` comes behind its request on the same ring, so one for an
/// operation not requested yet cancels nothing: in a chain the rogue
/// starts (2 → 1 → 0), port 0's storage, which reached the victim before
/// the victim's request, is not released by it, and the request that
/// follows still finds it.
#[test]
fn a_cancel_before_its_request_releases_nothing() {
    let mut s = setup();
    let (op, len) = (5, 100_000);
    let q02 = rogue_chain_ending_at_0(&mut s, op, len);
    // The rogue cancels at the victim what it has not asked for yet.
    s.inj
        .push(Ring::Rx, &wire::encode(&Msg::Cancel { op }))
        .unwrap();
    for _ in 0..10 {
        s.ts[1].progress();
        s.ts[0].progress();
    }
    assert_eq!(
        s.ts[0].resources(q02).serving,
        1,
        "a cancel before its request released port 0's storage"
    );
    // The request: the victim takes port 0's storage as its successor's.
    ask_victim_as_middle_link(&mut s, op, len);
    s.ts[1].progress();
    let q12 = s.ts[1].create_qp(2).unwrap();
    assert_eq!(s.ts[1].resources(q12).serving, 1);
    assert_eq!(s.ts[1].counters(q12).dropped_total(), 0);
    let q10 = s.ts[1].create_qp(0).unwrap();
    assert_eq!(s.ts[1].counters(q10).dropped_total(), 0);
    assert_eq!(s.ts[0].counters(q02).dropped_total(), 0);
    honest_traffic_works(&mut s);
}

/// A chain link's storage is written only after its clear-to-send: a
/// `Done` from its previous link before that (here the rogue is both the
/// origin and the previous link, and the next link, port 0, never answers)
/// is counted as an unknown operation, and nothing is delivered.
#[test]
fn a_done_before_the_clear_to_send_delivers_nothing() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    let (op, len) = (5, 4096);
    ask_victim_as_middle_link(&mut s, op, len);
    s.ts[1].progress();
    assert_eq!(s.ts[1].resources(q).serving, 1);
    s.inj
        .push(Ring::Cq, &wire::encode(&Msg::Done { op, len }))
        .unwrap();
    for _ in 0..10 {
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::UnknownOp), 1);
    assert_eq!(
        s.ts[1].resources(q).serving,
        1,
        "still waiting for its data"
    );
    let got = drain(&mut s.ts[1]);
    assert!(
        !got.iter().any(|c| c.op == OpKind::MulticastRecv),
        "delivered before any data could be there: {got:?}"
    );
    assert!(!acked(&s, op, WireStatus::Ok));
    honest_traffic_works(&mut s);
}

/// A multicast 0 → {1, 2 (the rogue)} whose initiator stalls (here: is not
/// polled) while port 1 answers, gives its storage up at its deadline and
/// reuses the memory. When the initiator comes back and reads both
/// answers, the put must not write port 1's old storage: past three
/// quarters of the timeout since the post, it writes nobody's; the
/// multicast fails with a timeout and port 1's new region keeps its bytes.
#[test]
fn a_put_never_writes_storage_that_waited_past_its_targets_deadline() {
    // The scenario needs port 0 to read both answers before its expiry
    // fails the operation.
    let intact = until_reached(
        "port 0 never read the answers before its expiry",
        put_after_the_initiator_stalled,
    );
    assert!(intact, "the put wrote storage its target had given up");
}

/// [`a_put_never_writes_storage_that_waited_past_its_targets_deadline`]'s
/// scenario: whether port 1's new region kept its bytes, or `None` when
/// port 0 expired the operation before it read the answers.
fn put_after_the_initiator_stalled() -> Option<bool> {
    let timeout = Duration::from_millis(400);
    let mut s = setup_with(Config {
        op_timeout: timeout,
        ..Config::new(Geometry::small(3))
    });
    // The rogue connected to port 0 first: once it stops polling, it
    // answers the request only through the injector.
    let mut inj0 = injector_into_0(&mut s);
    let len = 4096u32;
    let qps = multicast_from_0(&mut s, &[1, 2], len, MulticastMode::FanOut, 6);
    let op = first_op_id(s.ts[0].incarnation());
    // Only port 1 is polled: it answers, then gives its storage up.
    let q10 = s.ts[1].create_qp(0).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].resources(q10).serving == 0 {
        s.ts[1].progress();
        assert!(Instant::now() < end, "port 1 did not serve the multicast");
    }
    while s.ts[1].resources(q10).serving > 0 {
        s.ts[1].progress();
        assert!(Instant::now() < end, "port 1 never gave its storage up");
    }
    // Its memory goes to a new region of its own, filled.
    let mine = s.ts[1]
        .register_region(len as usize, Access::LOCAL)
        .unwrap();
    s.ts[1]
        .region_write(mine, 0, &vec![0xee; len as usize])
        .unwrap();
    // The rogue's answer is there too when the initiator comes back.
    let area = s.rogue.layout().region_area_start() as u64;
    let answer = Msg::Sgl {
        op,
        start: 0,
        n: 1,
        sges: sgl(op, 0, &[(area, len)]),
    };
    inj0.push(Ring::Tx, &wire::encode(&answer)).unwrap();
    let c = collect(&mut s.ts, 0, 1);
    assert_eq!((c[0].cookie, c[0].op), (6, OpKind::MulticastPut));
    assert_eq!(c[0].status, Status::Timeout, "{c:?}");
    if qps.iter().any(|&q| s.ts[0].counters(q).dropped_total() > 0) {
        return None;
    }
    let mut back = vec![0u8; len as usize];
    s.ts[1].region_read(mine, 0, &mut back).unwrap();
    assert!(drain(&mut s.ts[1]).is_empty());
    assert!(s.ts[1].is_connected(0));
    Some(back.iter().all(|&b| b == 0xee))
}

/// A chain the rogue starts, 2 → 1 (the victim) → 0, whose data the rogue
/// then claims with the wrong length: the victim fails its part (an
/// out-of-range drop) and, as it will never forward, releases port 0's
/// storage at once.
#[test]
fn a_done_of_the_wrong_length_releases_the_next_links_storage() {
    let mut s = setup();
    let (op, len) = (5, 4096);
    let (q02, q12) = victim_cleared_to_send(&mut s, op, len);
    let wrong = Msg::Done { op, len: len - 1 };
    s.inj.push(Ring::Cq, &wire::encode(&wrong)).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[0].resources(q02).serving > 0 {
        s.ts[0].progress();
        s.ts[1].progress();
        assert!(Instant::now() < end, "port 0's storage was not released");
    }
    assert_eq!(s.ts[1].resources(q12).serving, 0);
    assert_eq!(s.ts[1].counters(q12).dropped(DropKind::OutOfRange), 1);
    assert!(acked(&s, op, WireStatus::Protocol));
    assert_eq!(s.ts[0].counters(q02).dropped_total(), 0);
    honest_traffic_works(&mut s);
}

/// The rogue's chain op `op` (2 → 1 → 0) up to the victim's clear to
/// send: the victim holds port 0's storage and has sent its own to the
/// rogue. Returns port 0's queue pair to the rogue and the victim's.
fn victim_cleared_to_send(s: &mut Setup, op: u64, len: u32) -> (Qp, Qp) {
    let q02 = rogue_chain_ending_at_0(s, op, len);
    ask_victim_as_middle_link(s, op, len);
    let q12 = s.ts[1].create_qp(2).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[0].resources(q02).serving == 0 || s.ts[1].resources(q12).serving == 0 {
        s.ts[0].progress();
        s.ts[1].progress();
        assert!(Instant::now() < end, "the chain was not served");
    }
    for _ in 0..10 {
        s.ts[0].progress();
        s.ts[1].progress();
    }
    (q02, q12)
}

/// A chain link forwards only before its own deadline: the previous
/// link's `Done` that comes after it, handled before the housekeeping
/// (every 64th poll) expires the operation, releases the next link's
/// storage, into which nothing is written: the next link may have given
/// it up and reused it by then. A run whose first poll after the deadline
/// was the housekeeping's does not reach the check and is tried again.
#[test]
fn a_done_past_the_links_deadline_is_not_forwarded() {
    let timeout = Duration::from_millis(200);
    let (op, len) = (5, 4096);
    let forwarded_nothing = until_reached(
        "every run expired the operation before handling the late Done",
        || {
            let mut s = setup_with(Config {
                op_timeout: timeout,
                ..Config::new(Geometry::small(3))
            });
            victim_cleared_to_send(&mut s, op, len);
            std::thread::sleep(timeout + Duration::from_millis(50));
            s.inj
                .push(Ring::Cq, &wire::encode(&Msg::Done { op, len }))
                .unwrap();
            s.ts[1].progress();
            // Delivered: the `Done` found the operation still served.
            let delivered = drain(&mut s.ts[1])
                .iter()
                .any(|c| c.op == OpKind::MulticastRecv && c.status == Status::Success);
            if !delivered {
                return None;
            }
            let q10 = s.ts[1].create_qp(0).unwrap();
            Some(s.ts[1].counters(q10).bytes_out == 0)
        },
    );
    assert!(forwarded_nothing, "forwarded past the link's deadline");
}

/// Storage counts against a peer's quota as the region area takes it, in
/// whole 64-byte grains: 1-byte requests cannot hold 64 times the quota.
#[test]
fn tiny_storage_requests_count_whole_grains_against_the_quota() {
    let mut s = setup_with(Config {
        peer_storage_quota: Some(32 * 64),
        ..Config::new(Geometry::small(3))
    });
    let q = s.ts[1].create_qp(2).unwrap();
    for op in 1..=33u64 {
        s.inj
            .push(Ring::Rx, &wire::encode(&Msg::Rts { op, len: 1 }))
            .unwrap();
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].resources(q).serving, 32);
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 1);
    assert!(acked(&s, 33, WireStatus::NoRoom));
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// A target that sends its storage in crumbs, each just inside the
/// operation timeout, cannot keep a multicast open: it fails within about
/// a timeout of the first crumb (300 ms here), not a timeout after the
/// last (the crumbs here would take seven seconds).
#[test]
fn a_target_sending_storage_in_crumbs_cannot_keep_a_multicast_open() {
    let timeout = Duration::from_millis(300);
    let mut s = setup_with(Config {
        op_timeout: timeout,
        ..Config::new(Geometry::small(3))
    });
    let mut inj0 = injector_into_0(&mut s);
    let len = 35 * 64u32;
    multicast_from_0(&mut s, &[2], len, MulticastMode::FanOut, 8);
    let op = first_op_id(s.ts[0].incarnation());
    let area = s.rogue.layout().region_area_start() as u64;
    let first = Instant::now();
    let mut buf = [Completion::default(); 4];
    for k in 0..35u32 {
        let crumb = Msg::Sgl {
            op,
            start: k * 64,
            n: 1,
            sges: sgl(op, 0, &[(area + u64::from(k) * 64, 64)]),
        };
        inj0.push(Ring::Tx, &wire::encode(&crumb)).unwrap();
        let next = Instant::now() + timeout * 2 / 3;
        while Instant::now() < next {
            if s.ts[0].poll_completions(&mut buf) > 0 {
                assert_eq!((buf[0].cookie, buf[0].status), (8, Status::Timeout));
                assert!(
                    first.elapsed() < timeout * 5,
                    "it took {:?}",
                    first.elapsed()
                );
                return;
            }
        }
    }
    panic!("the multicast was still open after every crumb");
}

/// Storage for a chain we serve from a port that is not our next link (a
/// hostile origin may have told that port we are its previous link) is
/// released to it at once, not dropped and counted against it: it frees
/// the storage instead of holding it until its timeout.
#[test]
fn chain_storage_from_a_port_that_is_not_our_next_link_is_released() {
    let mut s = setup();
    // Port 0's chain with the victim as its only (last) link.
    let q10 = s.ts[1].create_qp(0).unwrap();
    multicast_from_0(&mut s, &[1], 4096, MulticastMode::Chain, 3);
    let end = Instant::now() + Duration::from_secs(5);
    while s.ts[1].resources(q10).serving == 0 {
        s.ts[1].progress();
        assert!(Instant::now() < end, "the victim did not serve the chain");
    }
    let op = first_op_id(s.ts[0].incarnation());
    let m = early_sgl(&s, op, 0);
    s.inj.push(Ring::Tx, &wire::encode(&m)).unwrap();
    s.ts[1].progress();
    assert!(in_rogue_cq(&s, Msg::ChainRelease { op, origin: 0 }));
    let q12 = s.ts[1].create_qp(2).unwrap();
    assert_eq!(s.ts[1].counters(q12).dropped_total(), 0);
    // Port 0's chain still completes.
    let c = collect(&mut s.ts, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (3, Status::Success));
}

/// Storage the victim allocates for a peer starts zeroed: a rogue that
/// asks for multicast storage and claims it wrote it all without writing a
/// byte gets its message delivered as zeros, not as what the area held
/// before (here the victim application's own bytes; as well another
/// peer's earlier message).
#[test]
fn storage_a_peer_never_wrote_is_delivered_as_zeros_not_as_older_bytes() {
    let mut s = setup();
    let len = 4096;
    let old = s.ts[1].register_region(len, Access::LOCAL).unwrap();
    s.ts[1].region_write(old, 0, &[0x77; 4096]).unwrap();
    s.ts[1].deregister_region(old).unwrap();
    let op = 5;
    s.inj
        .push(
            Ring::Rx,
            &wire::encode(&Msg::Rts {
                op,
                len: len as u32,
            }),
        )
        .unwrap();
    s.ts[1].progress();
    let q = s.ts[1].create_qp(2).unwrap();
    assert_eq!(s.ts[1].resources(q).serving, 1);
    s.inj
        .push(
            Ring::Cq,
            &wire::encode(&Msg::Done {
                op,
                len: len as u32,
            }),
        )
        .unwrap();
    s.ts[1].progress();
    let got = drain(&mut s.ts[1]);
    let c = got
        .iter()
        .find(|c| c.op == OpKind::MulticastRecv)
        .expect("the multicast was not delivered");
    assert_eq!(c.status, Status::Success);
    let mut bytes = vec![0xffu8; len];
    s.ts[1]
        .region_read(c.region.unwrap(), 0, &mut bytes)
        .unwrap();
    assert!(
        bytes.iter().all(|&b| b == 0),
        "older bytes delivered as the rogue's message"
    );
    honest_traffic_works(&mut s);
}

/// A queue pair of another transport, naming a port this one does not
/// have: its counters and resources are all zero, not a panic.
#[test]
fn a_queue_pair_of_another_transport_reads_as_zero() {
    let s = setup();
    let mut wide = s.ts.into_iter().next().unwrap();
    let qp = wide.create_qp(2).unwrap();
    let narrow_fabric = LoopbackFabric::new(2, 4 << 20);
    let narrow = Transport::new(
        Arc::new(narrow_fabric.join(0).unwrap()),
        Config::new(Geometry::small(2)),
    )
    .unwrap();
    assert_eq!(narrow.counters(qp), Default::default());
    assert_eq!(narrow.resources(qp), Default::default());
    assert_ne!(wide.resources(qp).eager_total, 0);
}

/// A device that keeps no grant table (this in-process fabric) grants no
/// entries: storage requests are bounded by the area quota and
/// `max_outstanding` only, not refused for a share of a table that is not
/// there (the share is tested on the emulated fabric, in
/// `transport_isolation.rs`).
#[test]
fn without_a_grant_table_storage_takes_no_share() {
    let mut s = setup();
    let q = s.ts[1].create_qp(2).unwrap();
    for op in 1..=520u64 {
        s.inj
            .push(Ring::Rx, &wire::encode(&Msg::Rts { op, len: 1 }))
            .unwrap();
        s.ts[1].progress();
    }
    assert_eq!(s.ts[1].resources(q).serving, 520);
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 0);
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// The rogue asks the victim (port 1) for 64 bytes of storage for its put
/// `op` and finishes it at once, writing nothing.
fn empty_put(s: &mut Setup, op: u64) {
    s.inj
        .push(Ring::Rx, &wire::encode(&Msg::Rts { op, len: 64 }))
        .unwrap();
    s.ts[1].progress();
    s.inj
        .push(Ring::Cq, &wire::encode(&Msg::Done { op, len: 64 }))
        .unwrap();
    s.ts[1].progress();
}

/// A peer that finishes each put at once (a `Done` with no data written)
/// cannot have its storage delivered to the application past its quota:
/// delivered storage counts against it until the application deregisters
/// it, which gives the share back.
#[test]
fn delivered_storage_counts_against_its_origin_until_deregistered() {
    let mut s = setup_with(Config {
        peer_storage_quota: Some(4 * 64),
        ..Config::new(Geometry::small(3))
    });
    let q = s.ts[1].create_qp(2).unwrap();
    for op in 1..=5u64 {
        empty_put(&mut s, op);
    }
    let mut got: Vec<Completion> = Vec::new();
    let mut buf = [Completion::default(); 8];
    let n = s.ts[1].poll_completions(&mut buf);
    got.extend(
        buf[..n]
            .iter()
            .filter(|c| c.op == OpKind::MulticastRecv)
            .copied(),
    );
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 1);
    assert!(acked(&s, 5, WireStatus::NoRoom));
    // The application gives one back: the next put fits.
    s.ts[1].deregister_region(got[0].region.unwrap()).unwrap();
    empty_put(&mut s, 6);
    let n = s.ts[1].poll_completions(&mut buf);
    assert_eq!(
        buf[..n]
            .iter()
            .filter(|c| c.op == OpKind::MulticastRecv)
            .count(),
        1
    );
    assert!(s.ts[1].is_connected(2));
    honest_traffic_works(&mut s);
}

/// Multicast deliveries come unasked, like notices: with the completion
/// queue at its depth a put is refused and its storage freed, not queued
/// without bound.
#[test]
fn puts_past_the_completion_queue_depth_are_refused() {
    let mut s = setup_with(Config {
        cq_depth: 2,
        ..Config::new(Geometry::small(3))
    });
    let q = s.ts[1].create_qp(2).unwrap();
    let free = s.ts[1].region_area_free();
    for op in 1..=3u64 {
        empty_put(&mut s, op);
    }
    assert_eq!(s.ts[1].counters(q).dropped(DropKind::Overload), 1);
    assert_eq!(
        s.ts[1].counters(q).served,
        2,
        "the refused put counted as served"
    );
    assert!(acked(&s, 3, WireStatus::NoRoom));
    assert_eq!(
        s.ts[1].region_area_free(),
        free - 2 * 64,
        "the refused put's storage was kept"
    );
    let mut buf = [Completion::default(); 8];
    assert_eq!(s.ts[1].poll_completions(&mut buf), 2);
    assert!(s.ts[1].is_connected(2));
}

/// A peer presenting a new incarnation at every hello (each has us wipe
/// its section of our window and re-advertise to it) is taken at most once
/// per five hello intervals; the one it settles on is still connected.
#[test]
fn new_incarnations_are_taken_at_most_once_per_five_hello_intervals() {
    let cfg = Config {
        hello_interval: Duration::from_millis(200),
        ..Config::new(Geometry::small(3))
    };
    let Setup {
        mut ts,
        rogue,
        rogue_dev,
        inj,
        ..
    } = setup_with(cfg.clone());
    let sec = ts[1].layout().section_offset(2);
    // A mark in the rogue's section of the victim's window: a wipe clears it.
    let marked = |ts: &mut Vec<Transport>| {
        ts[1].progress();
        let mut b = [0u8; 8];
        rogue_dev.non_posted_read(1, 0, sec, &mut b).unwrap();
        b == [0x5a; 8]
    };
    let restart = |old: Transport| {
        drop(old);
        let mut t = Transport::new(rogue_dev.clone(), cfg.clone()).unwrap();
        t.progress();
        t
    };
    inj.scribble(sec, &[0x5a; 8]).unwrap();
    let rogue = restart(rogue);
    let end = Instant::now() + Duration::from_secs(5);
    // Taken no earlier than the look that saw it taken began.
    let mut first = Instant::now();
    while marked(&mut ts) {
        assert!(
            Instant::now() < end,
            "the first new incarnation was not taken"
        );
        first = Instant::now();
    }
    inj.scribble(sec, &[0x5a; 8]).unwrap();
    let mut rogue = restart(rogue);
    // Polled for 400 ms (many slow-path ticks, each reading hellos), all
    // within the 1 s the second one must wait.
    while first.elapsed() < Duration::from_millis(400) {
        let still = marked(&mut ts);
        if first.elapsed() < Duration::from_millis(900) {
            assert!(still, "a second new incarnation taken within the interval");
        }
    }
    let end = Instant::now() + Duration::from_secs(5);
    while !(ts[1].is_connected(2) && rogue.is_connected(1)) {
        rogue.progress();
        ts[0].progress();
        ts[1].progress();
        assert!(
            Instant::now() < end,
            "the settled incarnation did not connect"
        );
    }
    assert!(first.elapsed() >= Duration::from_secs(1));
    assert!(!marked(&mut ts));
}

/// A remote offset whose range overflows 64 bits names no region: a write
/// or a read is refused at its post, not failed by timeout after the target
/// dropped the request unanswered.
#[test]
fn a_remote_range_past_64_bits_is_refused_at_the_post() {
    let mut s = setup();
    let q = s.ts[0].create_qp(1).unwrap();
    let src = s.ts[0].register_region(100, Access::LOCAL).unwrap();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: 100,
    }];
    let remote = RemoteAddr {
        key: s.open,
        offset: u64::MAX - 10,
    };
    let e = s.ts[0].post_write(q, &sge, remote, 1).unwrap_err();
    assert!(
        matches!(e, TransportError::RemoteRangeOverflows { .. }),
        "{e}"
    );
    let e = s.ts[0].post_read(q, &sge, remote, 2).unwrap_err();
    assert!(
        matches!(e, TransportError::RemoteRangeOverflows { .. }),
        "{e}"
    );
    assert_eq!(s.ts[0].resources(q).outstanding, 0);
    honest_traffic_works(&mut s);
}

/// A region's bytes end at its length, not at the 64-byte grain the area
/// allocates it in: local writes and reads past it, and a receive posted
/// over the padding, are refused on the fast paths as on the general one.
#[test]
fn the_grain_padding_after_a_region_is_no_part_of_it() {
    let mut s = setup();
    let t = &mut s.ts[1];
    let k = t.register_region(100, Access::ALL).unwrap();
    assert!(matches!(
        t.region_write(k, 100, &[0; 28]),
        Err(TransportError::OutOfRange { .. })
    ));
    assert!(matches!(
        t.region_read(k, 90, &mut [0; 38]),
        Err(TransportError::OutOfRange { .. })
    ));
    t.region_write(k, 72, &[1; 28]).unwrap();
    let q = t.create_qp(0).unwrap();
    let over = Sge {
        key: k,
        offset: 0,
        len: 128,
    };
    let e = t.post_recv(q, over, 9).unwrap_err();
    assert!(matches!(e, TransportError::OutOfRange { .. }), "{e}");
    honest_traffic_works(&mut s);
}

/// `max_outstanding` bounds the operations a post creates (rendezvous
/// writes, reads, puts); a send or a one-sided write creates none and is
/// not refused for it.
#[test]
fn sends_are_not_refused_for_outstanding_operations() {
    let mut s = setup_with(Config {
        max_outstanding: 1,
        ..Config::new(Geometry::small(3))
    });
    let q = s.ts[0].create_qp(1).unwrap();
    let src = s.ts[0].register_region(64, Access::LOCAL).unwrap();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: 64,
    }];
    let remote = RemoteAddr {
        key: s.open,
        offset: 0,
    };
    s.ts[0].post_write(q, &sge, remote, 1).unwrap();
    let e = s.ts[0].post_write(q, &sge, remote, 2).unwrap_err();
    assert!(
        matches!(e, TransportError::TooManyOutstanding { .. }),
        "{e}"
    );
    s.ts[0].post_send(q, b"still sent", 3).unwrap();
}
