//! The transport between in-process hosts (loopback fabric): every operation,
//! error completions, handshake failure, peer death and reconnect.

mod transport_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::loopback::LoopbackFabric;
use ntbdk_pmd::transport::{
    Access, Completion, Config, Geometry, MulticastMode, OpKind, PeerState, Qp, RecvWr, RegionKey,
    RemoteAddr, SendWr, Sge, Status, Transport, TransportError,
};
use transport_common::{Rng, collect, drain, loopback, loopback_with, until_reached};

const WIN: usize = 8 << 20;

fn geo(n: u16) -> Geometry {
    Geometry {
        ports: n,
        queue_depth: 32,
        eager_count: 16,
        eager_size: 1024,
        data: ntbdk_pmd::transport::DataQueues::NONE,
    }
}

#[test]
fn a_transport_can_move_to_a_polling_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Transport>();
    let (_f, ts) = loopback(2, WIN, geo(2));
    let handles: Vec<_> = ts
        .into_iter()
        .map(|mut t| {
            std::thread::spawn(move || {
                let peer = 1 - t.port();
                t.wait_connected(peer, Duration::from_secs(5)).unwrap();
                t
            })
        })
        .collect();
    // Joined all before any is dropped: one that says goodbye while the
    // other still waits would fail that wait.
    let ts: Vec<Transport> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(ts.iter().all(|t| t.outstanding() == 0));
}

#[test]
fn send_recv_inline_and_buffered_with_cookies() {
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let qb = ts[1].create_qp(0).unwrap();
    let rbuf = ts[1].register_region(64 * 1024, Access::LOCAL).unwrap();
    let other = ts[1].register_region(64 * 1024, Access::LOCAL).unwrap();
    let sizes = [1usize, 7, 47, 48, 49, 64, 500, 1024];
    // Receives posted as one batch, in runs that switch region.
    let region_of = |i: usize| if i % 3 == 2 { other } else { rbuf };
    let recvs: Vec<RecvWr> = (0..sizes.len())
        .map(|i| RecvWr {
            sge: Sge {
                key: region_of(i),
                offset: i as u64 * 2048,
                len: 1024,
            },
            cookie: 100 + i as u64,
        })
        .collect();
    // A batch stops at its first bad buffer (the ones before it posted);
    // a bad first buffer is the batch's error.
    let mut bad = recvs.clone();
    bad[0].sge.len = 64 * 1024 + 1;
    assert!(matches!(
        ts[1].post_recvs(qb, &bad),
        Err(TransportError::OutOfRange { .. })
    ));
    assert_eq!(ts[1].resources(qb).recvs_posted, 0);
    assert_eq!(ts[1].post_recvs(qb, &[]).unwrap(), 0);
    assert_eq!(ts[1].post_recvs(qb, &recvs).unwrap(), sizes.len());
    let mut rng = Rng(7);
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| {
            let mut v = vec![0u8; n];
            rng.fill(&mut v);
            v
        })
        .collect();
    let wrs: Vec<SendWr> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| SendWr {
            data: p,
            cookie: i as u64,
            signaled: true,
        })
        .collect();
    assert_eq!(ts[0].post_sends(qa, &wrs).unwrap(), sizes.len());
    let sent = drain(&mut ts[0]);
    assert_eq!(sent.len(), sizes.len());
    for (i, c) in sent.iter().enumerate() {
        assert_eq!(
            (c.op, c.status, c.cookie, c.bytes),
            (OpKind::Send, Status::Success, i as u64, sizes[i] as u64)
        );
    }
    let got = collect(&mut ts, 1, sizes.len());
    for (i, c) in got.iter().enumerate() {
        assert_eq!(
            (c.op, c.status, c.cookie, c.bytes),
            (
                OpKind::Recv,
                Status::Success,
                100 + i as u64,
                sizes[i] as u64
            )
        );
        let mut back = vec![0u8; sizes[i]];
        ts[1]
            .region_read(region_of(i), i as u64 * 2048, &mut back)
            .unwrap();
        assert_eq!(back, payloads[i]);
    }
    // Too large for the posted buffer: LocalLength, and the buffer comes back.
    ts[1]
        .post_recv(
            qb,
            Sge {
                key: rbuf,
                offset: 0,
                len: 10,
            },
            999,
        )
        .unwrap();
    ts[0].post_send(qa, &[1u8; 100], 5).unwrap();
    let got = collect(&mut ts, 1, 1);
    assert_eq!((got[0].status, got[0].cookie), (Status::LocalLength, 999));
    // Too large to send eagerly: refused at once.
    assert!(matches!(
        ts[0].post_send(qa, &[0u8; 1025], 1),
        Err(TransportError::SendSize { len: 1025, .. })
    ));
    // Every eager buffer returns.
    let end = Instant::now() + Duration::from_secs(5);
    while ts[0].resources(qa).eager_free != 16 {
        ts[0].progress();
        ts[1].progress();
        assert!(Instant::now() < end, "{:?}", ts[0].resources(qa));
    }
    // A bad buffer later in a batch stops it there: the ones before it
    // are posted, the error is not returned.
    let mut third_bad = recvs.clone();
    third_bad[2].sge.key = RegionKey(rbuf.0 ^ 0x5555);
    let before = ts[1].resources(qb).recvs_posted;
    assert_eq!(ts[1].post_recvs(qb, &third_bad).unwrap(), 2);
    assert_eq!(ts[1].resources(qb).recvs_posted, before + 2);
}

#[test]
fn sends_beyond_the_rings_are_refused_then_flow() {
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let qb = ts[1].create_qp(0).unwrap();
    let rbuf = ts[1].register_region(4096, Access::LOCAL).unwrap();
    // Refused: the receiver does not poll, so small sends (one PostQ slot
    // each) fill its PostQ and the next one is refused, not lost.
    let mut posted = 0u64;
    let err = loop {
        match ts[0].post_send(qa, &posted.to_le_bytes(), posted) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= 32, "more sends accepted than the PostQ holds");
    };
    assert!(
        matches!(err, TransportError::Busy { peer: 1, what } if what.contains("PostQ")),
        "{err}"
    );
    assert_eq!(posted, 32, "one slot per small send: the PostQ's depth");
    assert_eq!(ts[0].resources(qa).postq_free, 0);
    for _ in 0..200 {
        ts[0].progress();
    }
    assert!(matches!(
        ts[0].post_send(qa, b"x", 99),
        Err(TransportError::Busy { .. })
    ));
    // Exactly the accepted sends completed (eager: at once), in order.
    let sent = drain(&mut ts[0]);
    assert_eq!(sent.len() as u64, posted);
    for (i, c) in sent.iter().enumerate() {
        assert_eq!(
            (c.op, c.status, c.cookie),
            (OpKind::Send, Status::Success, i as u64)
        );
    }
    // Then they flow: the receiver posts receives and polls; every send
    // arrives once, in order, refused ones retried by the sender.
    let mut received = 0u64;
    let mut refused = 1u64;
    let end = Instant::now() + Duration::from_secs(10);
    while received < posted || posted < 1000 {
        if posted < 1000 {
            match ts[0].post_send(qa, &posted.to_le_bytes(), posted) {
                Ok(()) => posted += 1,
                Err(TransportError::Busy { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        for c in drain(&mut ts[0]) {
            assert_eq!((c.op, c.status), (OpKind::Send, Status::Success));
        }
        if ts[1].resources(qb).recvs_posted < 4 {
            ts[1]
                .post_recv(
                    qb,
                    Sge {
                        key: rbuf,
                        offset: 0,
                        len: 8,
                    },
                    0,
                )
                .unwrap();
        }
        for c in drain(&mut ts[1]) {
            assert_eq!(
                (c.op, c.status, c.bytes),
                (OpKind::Recv, Status::Success, 8)
            );
            let mut v = [0u8; 8];
            ts[1].region_read(rbuf, 0, &mut v).unwrap();
            assert_eq!(u64::from_le_bytes(v), received, "in order, exactly once");
            received += 1;
        }
        assert!(Instant::now() < end, "{received} of {posted} received");
    }
    // Nothing more arrives.
    for _ in 0..200 {
        ts[0].progress();
        assert!(drain(&mut ts[1]).is_empty());
    }
    let (ca, cb) = (ts[0].counters(qa), ts[1].counters(qb));
    assert_eq!((ca.sends, cb.recvs), (1000, 1000));
    assert_eq!(cb.dropped_total(), 0);
    eprintln!("{refused} sends refused while the receiver lagged");

    // Eager buffers: sends too long to go inline each take one the peer
    // lent; when all are taken the next send is refused until the peer
    // has delivered and returned them.
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let qb = ts[1].create_qp(0).unwrap();
    let rbuf = ts[1].register_region(16 * 1024, Access::LOCAL).unwrap();
    let msg = |i: u64| vec![i as u8 ^ 0x5a; 1000];
    let mut n = 0u64;
    let err = loop {
        match ts[0].post_send(qa, &msg(n), n) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n <= 16, "more buffered sends accepted than buffers lent");
    };
    assert!(
        matches!(err, TransportError::Busy { peer: 1, what } if what.contains("eager buffer")),
        "{err}"
    );
    assert_eq!((n, ts[0].resources(qa).eager_free), (16, 0));
    for i in 0..16 {
        let sge = Sge {
            key: rbuf,
            offset: i * 1024,
            len: 1024,
        };
        ts[1].post_recv(qb, sge, i).unwrap();
    }
    let got = collect(&mut ts, 1, 16);
    for c in &got {
        assert_eq!((c.status, c.bytes), (Status::Success, 1000));
        let mut v = vec![0u8; 1000];
        ts[1].region_read(rbuf, c.cookie * 1024, &mut v).unwrap();
        assert_eq!(v, msg(c.cookie));
    }
    let end = Instant::now() + Duration::from_secs(5);
    while ts[0].resources(qa).eager_free != 16 {
        ts[0].progress();
        ts[1].progress();
        assert!(Instant::now() < end, "{:?}", ts[0].resources(qa));
    }
    ts[0].post_send(qa, &msg(16), 16).unwrap();
}

fn scattered_region(
    t: &mut Transport,
    rng: &mut Rng,
    len: usize,
    access: Access,
) -> ntbdk_pmd::transport::RegionKey {
    let max_ext = 64 * (1 + rng.below(64) as usize);
    t.register_region_scattered(len, access, max_ext).unwrap()
}

fn local_sges(rng: &mut Rng, key: ntbdk_pmd::transport::RegionKey, len: u64) -> Vec<Sge> {
    let mut off = 0;
    rng.split(len, 6)
        .into_iter()
        .map(|l| {
            let s = Sge {
                key,
                offset: off,
                len: l,
            };
            off += l;
            s
        })
        .collect()
}

#[test]
fn writes_and_reads_random_sizes_and_fragmentation() {
    let (_f, mut ts) = loopback(2, 16 << 20, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let _qb = ts[1].create_qp(0).unwrap();
    let mut rng = Rng(0x5eed);
    let free_a = ts[0].region_area_free();
    let free_b = ts[1].region_area_free();
    for round in 0..24u64 {
        let len = if round % 6 == 0 {
            1 + rng.below(2 << 20)
        } else {
            1 + rng.below(64 << 10)
        } as usize;
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        let src = scattered_region(&mut ts[0], &mut rng, len, Access::LOCAL);
        ts[0].region_write(src, 0, &data).unwrap();
        let off = rng.below(4096);
        let dst = scattered_region(&mut ts[1], &mut rng, len + off as usize, Access::ALL);
        // Write.
        let sges = local_sges(&mut rng, src, len as u64);
        ts[0]
            .post_write(
                qa,
                &sges,
                RemoteAddr {
                    key: dst,
                    offset: off,
                },
                round,
            )
            .unwrap();
        let c = collect(&mut ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].cookie, c[0].bytes),
            (OpKind::Write, Status::Success, round, len as u64)
        );
        let mut back = vec![0u8; len];
        ts[1].region_read(dst, off, &mut back).unwrap();
        assert!(back == data, "write round {round}: {len} bytes differ");
        // Read it back, size known, into a fresh scattered region.
        let into = scattered_region(&mut ts[0], &mut rng, len, Access::LOCAL);
        let sges = local_sges(&mut rng, into, len as u64);
        ts[0]
            .post_read(
                qa,
                &sges,
                RemoteAddr {
                    key: dst,
                    offset: off,
                },
                1000 + round,
            )
            .unwrap();
        let c = collect(&mut ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].cookie, c[0].bytes),
            (OpKind::Read, Status::Success, 1000 + round, len as u64)
        );
        let mut back = vec![0u8; len];
        ts[0].region_read(into, 0, &mut back).unwrap();
        assert!(back == data, "read round {round}");
        // Size unknown: the rest of the region from `off`.
        ts[0]
            .post_read_unknown(
                qa,
                RemoteAddr {
                    key: dst,
                    offset: off,
                },
                64 << 20,
                2000 + round,
            )
            .unwrap();
        let c = collect(&mut ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].cookie, c[0].bytes),
            (
                OpKind::ReadUnknown,
                Status::Success,
                2000 + round,
                len as u64
            )
        );
        let got = c[0].region.expect("a region for the data");
        let mut back = vec![0u8; len];
        ts[0].region_read(got, 0, &mut back).unwrap();
        assert!(back == data, "unknown-size read round {round}");
        for k in [src, into, got] {
            ts[0].deregister_region(k).unwrap();
        }
        ts[1].deregister_region(dst).unwrap();
    }
    assert_eq!(ts[0].region_area_free(), free_a);
    assert_eq!(ts[1].region_area_free(), free_b);
    assert_eq!(ts[0].outstanding(), 0);
    let c = ts[0].counters(qa);
    assert_eq!(
        (c.writes, c.reads, c.failed_ops, c.dropped_total()),
        (24, 48, 0, 0)
    );
    for t in &ts {
        assert_eq!(t.device().counters().non_posted_reads, 0);
    }
}

#[test]
fn many_writes_in_flight_with_a_batch() {
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let src = ts[0].register_region(200 * 1000, Access::LOCAL).unwrap();
    let dst = ts[1].register_region(200 * 1000, Access::ALL).unwrap();
    let mut rng = Rng(3);
    let mut data = vec![0u8; 200 * 1000];
    rng.fill(&mut data);
    ts[0].region_write(src, 0, &data).unwrap();
    let sges: Vec<[Sge; 1]> = (0..200u64)
        .map(|i| {
            [Sge {
                key: src,
                offset: i * 1000,
                len: 1000,
            }]
        })
        .collect();
    let wrs: Vec<_> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| ntbdk_pmd::transport::WriteWr {
            local: s,
            remote: RemoteAddr {
                key: dst,
                offset: i as u64 * 1000,
            },
            cookie: i as u64,
        })
        .collect();
    assert_eq!(ts[0].post_writes(qa, &wrs).unwrap(), 200);
    let mut c = collect(&mut ts, 0, 200);
    c.sort_by_key(|c| c.cookie);
    for (i, c) in c.iter().enumerate() {
        assert_eq!((c.cookie, c.status), (i as u64, Status::Success));
    }
    let mut back = vec![0u8; 200 * 1000];
    ts[1].region_read(dst, 0, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn multicast_put_reaches_every_target_once() {
    let (_f, mut ts) = loopback(4, WIN, geo(4));
    let qps: Vec<_> = (1..4).map(|p| ts[0].create_qp(p).unwrap()).collect();
    let mut rng = Rng(11);
    for round in 0..6u64 {
        let len = 1 + rng.below(300_000) as usize;
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        let src = ts[0]
            .register_region_scattered(len, Access::LOCAL, 4096)
            .unwrap();
        ts[0].region_write(src, 0, &data).unwrap();
        let sges = local_sges(&mut rng, src, len as u64);
        ts[0].post_multicast_put(&qps, &sges, round).unwrap();
        let c = collect(&mut ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].cookie, c[0].bytes),
            (OpKind::MulticastPut, Status::Success, round, len as u64)
        );
        for (i, t) in ts.iter_mut().enumerate().skip(1) {
            let got = drain(t);
            assert_eq!(got.len(), 1, "target {i}: {got:?}");
            assert_eq!(
                (got[0].op, got[0].status, got[0].bytes),
                (OpKind::MulticastRecv, Status::Success, len as u64)
            );
            let region = got[0].region.unwrap();
            let mut back = vec![0u8; len];
            t.region_read(region, 0, &mut back).unwrap();
            assert!(back == data, "target {i} round {round}");
            t.deregister_region(region).unwrap();
        }
        ts[0].deregister_region(src).unwrap();
    }
}

#[test]
fn chain_multicast_stores_and_forwards_down_the_list() {
    let (_f, mut ts) = loopback(5, WIN, geo(5));
    let mut rng = Rng(23);
    for round in 0..6u64 {
        // A random order of the four targets.
        let mut order: Vec<u16> = vec![1, 2, 3, 4];
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let qps: Vec<_> = order.iter().map(|&p| ts[0].create_qp(p).unwrap()).collect();
        let len = 1 + rng.below(400_000) as usize;
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        let src = ts[0]
            .register_region_scattered(len, Access::LOCAL, 8192)
            .unwrap();
        ts[0].region_write(src, 0, &data).unwrap();
        let sges = local_sges(&mut rng, src, len as u64);
        let all: Vec<_> = (1..5).map(|p| ts[0].create_qp(p).unwrap()).collect();
        let before: Vec<u64> = all.iter().map(|q| ts[0].counters(*q).bytes_out).collect();
        ts[0]
            .post_multicast_put_with(&qps, &sges, MulticastMode::Chain, round)
            .unwrap();
        let c = collect(&mut ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].cookie, c[0].bytes),
            (OpKind::MulticastPut, Status::Success, round, len as u64)
        );
        // The initiator copied to the first target only.
        for p in 1..5u16 {
            let moved = ts[0].counters(all[p as usize - 1]).bytes_out - before[p as usize - 1];
            assert_eq!(
                moved,
                if p == order[0] { len as u64 } else { 0 },
                "port {p}"
            );
        }
        for &p in &order {
            let t = &mut ts[p as usize];
            let got = drain(t);
            assert_eq!(got.len(), 1, "target {p}: {got:?}");
            assert_eq!(
                (got[0].op, got[0].status, got[0].bytes),
                (OpKind::MulticastRecv, Status::Success, len as u64)
            );
            let region = got[0].region.unwrap();
            let mut back = vec![0u8; len];
            t.region_read(region, 0, &mut back).unwrap();
            assert!(back == data, "target {p} round {round}");
            t.deregister_region(region).unwrap();
        }
        ts[0].deregister_region(src).unwrap();
    }
}

#[test]
fn a_broken_chain_fails_the_multicast() {
    let (fabric, mut ts) = loopback(4, WIN, geo(4));
    post_chain(&mut ts[0], &[2, 1, 3], 7);
    // The middle target dies before answering.
    fabric.kill(1);
    let mut rest = vec![ts.remove(0), ts.remove(1), ts.remove(1)];
    let c = collect(&mut rest, 0, 1);
    assert_eq!(
        (c[0].op, c[0].cookie, c[0].status),
        (OpKind::MulticastPut, 7, Status::PeerDown)
    );
    assert_eq!(rest[0].outstanding(), 0);
}

/// Posts a 100 000-byte multicast from `t` down the chain `ports`; returns
/// its queue pairs and source.
fn post_chain(t: &mut Transport, ports: &[u16], cookie: u64) -> (Vec<Qp>, [Sge; 1]) {
    let qps: Vec<_> = ports.iter().map(|&p| t.create_qp(p).unwrap()).collect();
    let src = t.register_region(100_000, Access::LOCAL).unwrap();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: 100_000,
    }];
    t.post_multicast_put_with(&qps, &sge, MulticastMode::Chain, cookie)
        .unwrap();
    (qps, sge)
}

/// Posts a chain 0 → 1 → 2 ([`post_chain`]) and polls ports 1 and 2 (not
/// the origin) until both serve it; returns port 2's queue pair to 0.
fn serve_chain_from_0(ts: &mut [Transport]) -> Qp {
    post_chain(&mut ts[0], &[1, 2], 7);
    let (q1, q2) = (ts[1].create_qp(0).unwrap(), ts[2].create_qp(0).unwrap());
    let end = Instant::now() + Duration::from_secs(5);
    while ts[1].resources(q1).serving == 0 || ts[2].resources(q2).serving == 0 {
        ts[1].progress();
        ts[2].progress();
        assert!(Instant::now() < end, "the chain was not served");
    }
    q2
}

#[test]
fn a_chain_refused_at_one_link_frees_the_other_links_storage_at_once() {
    // The middle target's quota is too small for the put; the others'
    // operations would time out only after a minute.
    let (_f, mut ts) = loopback_with(4, WIN, |p| Config {
        op_timeout: Duration::from_secs(60),
        peer_storage_quota: (p == 1).then_some(4096),
        ..Config::new(geo(4))
    });
    let chain = [2u16, 1, 3];
    let (qps, sge) = post_chain(&mut ts[0], &chain, 7);
    let c = collect(&mut ts, 0, 1);
    assert_eq!((c[0].op, c[0].cookie), (OpKind::MulticastPut, 7));
    assert!(!c[0].status.is_ok(), "{c:?}");
    // Every target lets go of the operation: none is served any more, and
    // a second put of the same size, to the two that have room, goes
    // through (their quota was not held by the failed one).
    let origin = |t: &mut Transport| t.create_qp(0).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while chain.iter().any(|&p| {
        let q = origin(&mut ts[p as usize]);
        ts[p as usize].resources(q).serving > 0
    }) {
        assert!(
            Instant::now() < end,
            "a target still holds the failed put's storage"
        );
        for t in ts.iter_mut() {
            t.progress();
        }
    }
    ts[0]
        .post_multicast_put_with(&[qps[0], qps[2]], &sge, MulticastMode::Chain, 8)
        .unwrap();
    let c = collect(&mut ts, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (8, Status::Success));
}

#[test]
fn remote_access_errors_complete_with_an_error() {
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let src = ts[0].register_region(4096, Access::LOCAL).unwrap();
    let ro = ts[1]
        .register_region(4096, Access::LOCAL | Access::REMOTE_READ)
        .unwrap();
    let wo = ts[1]
        .register_region(4096, Access::LOCAL | Access::REMOTE_WRITE)
        .unwrap();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: 100,
    }];
    ts[0]
        .post_write(qa, &sge, RemoteAddr { key: ro, offset: 0 }, 1)
        .unwrap();
    ts[0]
        .post_write(
            qa,
            &sge,
            RemoteAddr {
                key: wo,
                offset: 4000,
            },
            2,
        )
        .unwrap();
    ts[0]
        .post_write(
            qa,
            &sge,
            RemoteAddr {
                key: ntbdk_pmd::transport::RegionKey(12345),
                offset: 0,
            },
            3,
        )
        .unwrap();
    ts[0]
        .post_read(qa, &sge, RemoteAddr { key: wo, offset: 0 }, 4)
        .unwrap();
    ts[0]
        .post_read_unknown(qa, RemoteAddr { key: wo, offset: 0 }, 1 << 20, 5)
        .unwrap();
    ts[0]
        .post_read_unknown(qa, RemoteAddr { key: ro, offset: 0 }, 100, 6)
        .unwrap();
    let mut c = collect(&mut ts, 0, 6);
    c.sort_by_key(|c| c.cookie);
    let st: Vec<_> = c.iter().map(|c| c.status).collect();
    assert_eq!(
        st,
        [
            Status::RemoteAccess,
            Status::RemoteAccess,
            Status::RemoteAccess,
            Status::RemoteAccess,
            Status::RemoteAccess,
            Status::TooLarge
        ]
    );
    // Local errors are refused at post time.
    assert!(
        ts[0]
            .post_write(
                qa,
                &[Sge {
                    key: src,
                    offset: 4000,
                    len: 200
                }],
                RemoteAddr { key: wo, offset: 0 },
                9
            )
            .is_err()
    );
    assert!(
        ts[0]
            .post_read(
                qa,
                &[Sge {
                    key: ro,
                    offset: 0,
                    len: 1
                }],
                RemoteAddr { key: ro, offset: 0 },
                9
            )
            .is_err()
    );
    assert_eq!(ts[0].outstanding(), 0);
    let qb = ts[1].create_qp(0).unwrap();
    assert!(
        ts[1]
            .counters(qb)
            .dropped(ntbdk_pmd::transport::DropKind::Access)
            >= 4
    );
}

#[test]
fn geometry_mismatch_fails_the_handshake_cleanly() {
    let fabric = LoopbackFabric::new(2, WIN);
    let mut a = Transport::new(Arc::new(fabric.join(0).unwrap()), Config::new(geo(2))).unwrap();
    let other = Geometry {
        queue_depth: 64,
        ..geo(2)
    };
    let mut b = Transport::new(Arc::new(fabric.join(1).unwrap()), Config::new(other)).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !matches!(a.peer_state(1), PeerState::Failed(_))
        || !matches!(b.peer_state(0), PeerState::Failed(_))
    {
        a.progress();
        b.progress();
        assert!(
            Instant::now() < end,
            "{:?} {:?}",
            a.peer_state(1),
            b.peer_state(0)
        );
    }
    let qa = a.create_qp(1).unwrap();
    let err = a.post_send(qa, b"x", 0).unwrap_err();
    assert!(
        matches!(err, TransportError::HandshakeFailed { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("queue depth"), "{err}");
    assert!(a.wait_connected(1, Duration::from_millis(10)).is_err());
}

#[test]
fn peer_death_fails_its_operations_and_it_can_reconnect() {
    let (fabric, mut ts) = loopback(3, WIN, geo(3));
    let q1 = ts[0].create_qp(1).unwrap();
    let q2 = ts[0].create_qp(2).unwrap();
    let src = ts[0].register_region(1 << 20, Access::LOCAL).unwrap();
    let d1 = ts[1].register_region(1 << 20, Access::ALL).unwrap();
    let d2 = ts[2].register_region(1 << 20, Access::ALL).unwrap();
    let rb = ts[1].register_region(4096, Access::LOCAL).unwrap();
    let free0 = ts[0].region_area_free();
    // Outstanding work towards port 1, which never progresses again.
    let sge = [Sge {
        key: src,
        offset: 0,
        len: 1 << 20,
    }];
    for i in 0..5 {
        ts[0]
            .post_write(q1, &sge, RemoteAddr { key: d1, offset: 0 }, i)
            .unwrap();
    }
    ts[0]
        .post_read_unknown(q1, RemoteAddr { key: d1, offset: 0 }, 1 << 30, 5)
        .unwrap();
    ts[0].post_multicast_put(&[q1, q2], &sge, 6).unwrap();
    ts[0]
        .post_recv(
            q1,
            Sge {
                key: src,
                offset: 0,
                len: 64,
            },
            7,
        )
        .unwrap();
    for _ in 0..10 {
        ts[0].progress();
        ts[2].progress();
    }
    assert!(ts[0].outstanding() >= 6);
    fabric.kill(1);
    let t1 = ts.remove(1);
    let mut ts2 = ts; // [port 0, port 2]
    let mut c = collect(&mut ts2, 0, 8);
    c.sort_by_key(|c| c.cookie);
    for (i, c) in c.iter().enumerate() {
        assert_eq!(c.cookie, i as u64);
        let want = if c.op == OpKind::Recv {
            Status::Flushed
        } else {
            Status::PeerDown
        };
        assert_eq!(c.status, want, "{c:?}");
    }
    assert_eq!(ts2[0].outstanding(), 0);
    assert_eq!(ts2[0].region_area_free(), free0);
    assert_eq!(ts2[0].peer_state(1), PeerState::Down);
    // Port 2 still works.
    ts2[0]
        .post_write(q2, &sge, RemoteAddr { key: d2, offset: 0 }, 50)
        .unwrap();
    let c = collect(&mut ts2, 0, 1);
    assert_eq!(c[0].status, Status::Success);
    // Port 1 comes back (a new host), reconnects, and everything is full again.
    drop(t1);
    let dev = fabric.join(1).unwrap();
    let mut t1 = Transport::new(Arc::new(dev), Config::new(geo(3))).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !ts2[0].is_connected(1) || !t1.is_connected(0) {
        ts2[0].progress();
        ts2[1].progress();
        t1.progress();
        assert!(Instant::now() < end);
    }
    while ts2[0].resources(q1).eager_free != 16 {
        ts2[0].progress();
        t1.progress();
        assert!(Instant::now() < end);
    }
    let r = ts2[0].resources(q1);
    assert_eq!((r.backlog, r.outstanding, r.serving), (0, 0, 0));
    assert_eq!(r.postq_free, 32);
    let d1 = t1.register_region(1 << 20, Access::ALL).unwrap();
    ts2[0]
        .post_write(q1, &sge, RemoteAddr { key: d1, offset: 0 }, 60)
        .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let c = loop {
        t1.progress();
        let got = drain(&mut ts2[0]);
        if !got.is_empty() {
            break got;
        }
        assert!(Instant::now() < end);
    };
    assert_eq!((c[0].status, c[0].cookie), (Status::Success, 60));
    assert_eq!(ts2[0].counters(q1).connects, 2);
    let _ = rb;
}

#[test]
fn restarting_transport_on_the_same_device_reconnects() {
    let fabric = LoopbackFabric::new(2, WIN);
    let da: Arc<dyn NtbDevice> = Arc::new(fabric.join(0).unwrap());
    let mut a = Transport::new(da.clone(), Config::new(geo(2))).unwrap();
    let b = Transport::new(Arc::new(fabric.join(1).unwrap()), Config::new(geo(2))).unwrap();
    let mut ts = [a, b];
    transport_common::connect_all(&mut ts);
    let [old_a, mut b] = ts;
    let qb = b.create_qp(0).unwrap();
    let rb = b.register_region(64, Access::LOCAL).unwrap();
    b.post_recv(
        qb,
        Sge {
            key: rb,
            offset: 0,
            len: 8,
        },
        1,
    )
    .unwrap();
    drop(old_a);
    a = Transport::new(da, Config::new(geo(2))).unwrap();
    let mut ts = [a, b];
    transport_common::connect_all(&mut ts);
    let c = drain(&mut ts[1]);
    assert_eq!(c.len(), 1, "the old connection's receive is flushed: {c:?}");
    assert_eq!(c[0].status, Status::Flushed);
    let qa = ts[0].create_qp(1).unwrap();
    let qb = ts[1].create_qp(0).unwrap();
    ts[1]
        .post_recv(
            qb,
            Sge {
                key: rb,
                offset: 0,
                len: 8,
            },
            2,
        )
        .unwrap();
    ts[0].post_send(qa, b"again", 3).unwrap();
    let c = collect(&mut ts, 1, 1);
    assert_eq!(
        (c[0].status, c[0].cookie, c[0].bytes),
        (Status::Success, 2, 5)
    );
    let _ = Completion::default();
}

#[test]
fn a_batch_rings_the_doorbell_once_when_configured() {
    let fabric = LoopbackFabric::new(2, WIN);
    let cfg = Config {
        doorbell: true,
        ..Config::new(geo(2))
    };
    let a = Transport::new(Arc::new(fabric.join(0).unwrap()), cfg.clone()).unwrap();
    let b = Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap();
    let mut ts = [a, b];
    transport_common::connect_all(&mut ts);
    let qa = ts[0].create_qp(1).unwrap();
    let before = ts[0].device().counters().posted_writes;
    let msgs = [[1u8; 16]; 8];
    let wrs: Vec<SendWr> = msgs
        .iter()
        .map(|m| SendWr {
            data: m,
            cookie: 0,
            signaled: true,
        })
        .collect();
    assert_eq!(ts[0].post_sends(qa, &wrs).unwrap(), 8);
    // Eight slots (body + tag each) and one doorbell.
    assert_eq!(ts[0].device().counters().posted_writes - before, 8 * 2 + 1);
    assert_eq!(ts[1].device().db_read() & 1, 1);
}

#[test]
fn dropping_a_transport_fails_what_its_peers_had_outstanding() {
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let src = ts[0].register_region(4096, Access::LOCAL).unwrap();
    ts[0]
        .post_read_unknown(
            qa,
            RemoteAddr {
                key: ntbdk_pmd::transport::RegionKey(1),
                offset: 0,
            },
            4096,
            77,
        )
        .unwrap();
    drop(ts.pop());
    let end = Instant::now() + Duration::from_secs(5);
    let c = loop {
        let got = drain(&mut ts[0]);
        if !got.is_empty() {
            break got;
        }
        assert!(Instant::now() < end);
    };
    assert_eq!((c[0].cookie, c[0].status), (77, Status::PeerDown));
    assert!(!ts[0].is_connected(1));
    let _ = src;
}

#[test]
fn a_write_moves_each_payload_byte_once_with_posted_writes_only() {
    let (_f, mut ts) = loopback(2, WIN, geo(2));
    let qa = ts[0].create_qp(1).unwrap();
    let len = 1u64 << 20;
    let src = ts[0]
        .register_region_scattered(len as usize, Access::LOCAL, 64 << 10)
        .unwrap();
    let dst = ts[1]
        .register_region_scattered(len as usize, Access::ALL, 32 << 10)
        .unwrap();
    let (a0, b0) = (ts[0].device().counters(), ts[1].device().counters());
    ts[0]
        .post_write(
            qa,
            &[Sge {
                key: src,
                offset: 0,
                len,
            }],
            RemoteAddr {
                key: dst,
                offset: 0,
            },
            1,
        )
        .unwrap();
    assert_eq!(collect(&mut ts, 0, 1)[0].status, Status::Success);
    let (a1, b1) = (ts[0].device().counters(), ts[1].device().counters());
    // The initiator wrote the payload once plus a few 64-byte messages and
    // credits; the target wrote only messages (its SGL: 32 extents, 5 per
    // slot) — no staging copy anywhere.
    let a_extra = a1.posted_bytes - a0.posted_bytes - len;
    let b_bytes = b1.posted_bytes - b0.posted_bytes;
    assert!(
        a_extra < 1024,
        "initiator wrote {a_extra} bytes beyond the payload"
    );
    assert!(b_bytes < 2048, "target wrote {b_bytes} bytes");
    assert_eq!(a1.non_posted_reads + b1.non_posted_reads, 0);
}

/// Two connected transports with `Config::signal_sends` off, a queue
/// pair between them, and a 16 KiB receive region at the second.
fn unsignaled_pair() -> (Arc<LoopbackFabric>, Vec<Transport>, Qp, Qp, RegionKey) {
    let fabric = LoopbackFabric::new(2, 4 << 20);
    let mut cfg = Config::new(Geometry::small(2));
    cfg.signal_sends = false;
    let mut ts: Vec<Transport> = (0..2)
        .map(|p| Transport::new(Arc::new(fabric.join(p).unwrap()), cfg.clone()).unwrap())
        .collect();
    transport_common::connect_all(&mut ts);
    let (qa, qb) = (ts[0].create_qp(1).unwrap(), ts[1].create_qp(0).unwrap());
    let buf = ts[1].register_region(64 * 256, Access::LOCAL).unwrap();
    (fabric, ts, qa, qb, buf)
}

/// Posts receives of `size` bytes each on `qp` until `*posted` reaches
/// `upto`, cycling through `buf` (16 KiB): receive `i` at slot `i` modulo
/// the slots `buf` holds, its cookie the slot.
fn keep_posted(t: &mut Transport, qp: Qp, buf: RegionKey, posted: &mut u64, upto: u64, size: u64) {
    let slots = 64 * 256 / size;
    while *posted < upto {
        let slot = *posted % slots;
        let sge = Sge {
            key: buf,
            offset: slot * size,
            len: size,
        };
        t.post_recv(qp, sge, slot).unwrap();
        *posted += 1;
    }
}

#[test]
fn unsignaled_sends_complete_nothing_and_arrive_every_byte() {
    let (_fabric, mut ts, qa, qb, buf) = unsignaled_pair();
    let mut got = Vec::new();
    let mut done = [Completion::default(); 32];
    let mut sent = 0u32;
    let end = Instant::now() + Duration::from_secs(20);
    let mut posted = 0u64;
    while got.len() < 200 {
        // Keep receives posted, one 64-byte slot each.
        keep_posted(&mut ts[1], qb, buf, &mut posted, got.len() as u64 + 8, 64);
        if sent < 200 {
            let m = [sent as u8; 40];
            match ts[0].post_send(qa, &m, u64::from(sent)) {
                Ok(()) => sent += 1,
                Err(TransportError::Busy { .. }) => {}
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        // The sender's completion queue stays empty: nothing was signaled.
        assert_eq!(ts[0].poll_completions(&mut done), 0);
        let n = ts[1].poll_completions(&mut done);
        for c in &done[..n] {
            assert_eq!(
                (c.op, c.status, c.bytes),
                (OpKind::Recv, Status::Success, 40)
            );
            let mut m = [0u8; 40];
            ts[1].region_read(buf, c.cookie * 64, &mut m).unwrap();
            got.push(m);
        }
        assert!(Instant::now() < end, "{} of 200 received", got.len());
    }
    for (i, m) in got.iter().enumerate() {
        assert!(m.iter().all(|&b| b == i as u8), "message {i}");
    }
    assert_eq!(ts[0].counters(qa).sends, 200);
}

#[test]
fn with_signal_sends_off_only_the_sends_that_ask_complete_in_order() {
    let (_fabric, mut ts, qa, qb, buf) = unsignaled_pair();
    // 300 sends of 1 to 200 bytes (one to four slots), in batches of up to
    // 16; every third asks for a completion (as perftest signals one send
    // in `--cq-mod`).
    let msgs: Vec<Vec<u8>> = (0..300u32)
        .map(|i| vec![i as u8; 1 + (i as usize * 37) % 200])
        .collect();
    let (mut sent, mut posted) = (0usize, 0u64);
    let (mut got, mut signaled) = (Vec::new(), Vec::new());
    let mut done = [Completion::default(); 32];
    let end = Instant::now() + Duration::from_secs(20);
    while got.len() < msgs.len() {
        keep_posted(&mut ts[1], qb, buf, &mut posted, got.len() as u64 + 16, 256);
        if sent < msgs.len() {
            let wrs: Vec<SendWr> = (sent..msgs.len().min(sent + 16))
                .map(|i| SendWr {
                    data: &msgs[i],
                    cookie: i as u64,
                    signaled: i % 3 == 0,
                })
                .collect();
            match ts[0].post_sends(qa, &wrs) {
                Ok(n) => sent += n,
                Err(TransportError::Busy { .. }) => {}
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        let n = ts[0].poll_completions(&mut done);
        for c in &done[..n] {
            assert_eq!((c.op, c.status), (OpKind::Send, Status::Success));
            assert_eq!(c.bytes, msgs[c.cookie as usize].len() as u64);
            signaled.push(c.cookie);
        }
        let n = ts[1].poll_completions(&mut done);
        for c in &done[..n] {
            assert_eq!((c.op, c.status), (OpKind::Recv, Status::Success));
            let mut m = vec![0u8; c.bytes as usize];
            ts[1].region_read(buf, c.cookie * 256, &mut m).unwrap();
            got.push(m);
        }
        assert!(Instant::now() < end, "{} of 300 received", got.len());
    }
    assert_eq!(got, msgs, "every byte of every send, in order");
    let n = ts[0].poll_completions(&mut done);
    signaled.extend(done[..n].iter().map(|c| c.cookie));
    let asked: Vec<u64> = (0..300).filter(|i| i % 3 == 0).collect();
    assert_eq!(
        signaled, asked,
        "exactly the signaled sends, once, in order"
    );
    assert_eq!(ts[0].counters(qa).sends, 300);
}

#[test]
fn a_chain_link_that_gives_up_releases_its_successors_storage() {
    // Port 1 gives its served operations up after 300 ms, port 2 only
    // after a minute; the initiator (port 0) never puts.
    let (_f, mut ts) = loopback_with(3, WIN, |p| Config {
        op_timeout: Duration::from_millis(if p == 1 { 300 } else { 60_000 }),
        ..Config::new(geo(3))
    });
    let q = serve_chain_from_0(&mut ts);
    let asked = Instant::now();
    while ts[2].resources(q).serving > 0 {
        ts[1].progress();
        ts[2].progress();
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "port 2 still holds storage its previous link gave up"
        );
    }
}

#[test]
fn a_chain_link_that_times_out_keeps_its_storage_until_its_previous_link_is_done() {
    // Port 2, the chain's last link, gives its served operations up after
    // a second (and keeps what it sets aside as long); its previous link
    // (port 1) and the origin wait a minute.
    let (_f, mut ts) = loopback_with(3, WIN, |p| Config {
        op_timeout: Duration::from_millis(if p == 2 { 1000 } else { 60_000 }),
        ..Config::new(geo(3))
    });
    let free2 = ts[2].region_area_free();
    let q = serve_chain_from_0(&mut ts);
    // Only port 2 is polled: it gives the operation up while port 1,
    // honest but slow, may still forward into its storage.
    let end = Instant::now() + Duration::from_secs(10);
    while ts[2].resources(q).serving > 0 {
        ts[2].progress();
        assert!(Instant::now() < end, "port 2 never gave the operation up");
    }
    let held = ts[2].region_area_free();
    assert!(held < free2, "freed while port 1 may write it");
    // New memory of port 2's, filled, must not be where port 1 writes.
    let mine = ts[2].register_region(100_000, Access::LOCAL).unwrap();
    ts[2].region_write(mine, 0, &[0xee; 100_000]).unwrap();
    let after = ts[2].region_area_free();
    // Now port 1 gets the data and forwards it; its `ChainDone` frees
    // the storage set aside.
    let end = Instant::now() + Duration::from_secs(10);
    while ts[2].region_area_free() != after + (free2 - held) {
        for t in ts.iter_mut() {
            t.progress();
        }
        assert!(
            Instant::now() < end,
            "the storage set aside was never freed"
        );
    }
    let mut back = vec![0u8; 100_000];
    ts[2].region_read(mine, 0, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0xee),
        "the late forward landed in reused memory"
    );
    assert!(
        drain(&mut ts[2]).is_empty(),
        "nothing is delivered once given up"
    );
    let q21 = ts[2].create_qp(1).unwrap();
    assert_eq!(ts[2].counters(q21).dropped_total(), 0);
}

#[test]
fn a_chain_link_cut_off_from_its_origin_keeps_its_storage_until_its_previous_link_is_done() {
    // Short operations: a link that sees its origin's link drop gives the
    // operation up at its deadline (the origin may only have stalled).
    let (fabric, mut ts) = loopback_with(3, WIN, |_| Config {
        op_timeout: Duration::from_millis(500),
        ..Config::new(geo(3))
    });
    // 0 → 1 → 2: port 2's storage is written by port 1, not the origin.
    let free2 = ts[2].region_area_free();
    serve_chain_from_0(&mut ts);
    // Both links hold storage; then the origin goes. Port 2 sees it
    // first, while port 1 (which could still forward into port 2's
    // storage) does not poll.
    ts[1].progress();
    ts[2].progress();
    let held = ts[2].region_area_free();
    assert!(held < free2);
    fabric.kill(0);
    let end = Instant::now() + Duration::from_secs(5);
    while ts[2].is_connected(0) {
        ts[2].progress();
        assert!(Instant::now() < end, "port 2 did not see the death");
    }
    assert_eq!(
        ts[2].region_area_free(),
        held,
        "freed while port 1 may write it"
    );
    // Port 1 sees it too and, giving the operation up, releases port 2.
    let end = Instant::now() + Duration::from_secs(10);
    while ts[2].region_area_free() != free2 {
        ts[1].progress();
        ts[2].progress();
        assert!(Instant::now() < end, "port 2's storage was never freed");
    }
    let q21 = ts[2].create_qp(1).unwrap();
    assert_eq!(ts[2].counters(q21).dropped_total(), 0);
}

#[test]
fn storage_set_aside_still_counts_against_its_origins_quota() {
    // Port 2 gives port 0's requests at most 150 000 bytes of storage.
    let (fabric, mut ts) = loopback_with(3, WIN, |p| Config {
        peer_storage_quota: (p == 2).then_some(150_000),
        ..Config::new(geo(3))
    });
    let free2 = ts[2].region_area_free();
    serve_chain_from_0(&mut ts);
    ts[1].progress();
    ts[2].progress();
    // Port 0 goes and comes back as a new host; port 1 (the previous
    // link, which could still write port 2's storage) is not polled, so
    // port 2 keeps that storage aside.
    fabric.kill(0);
    let died = Instant::now();
    while ts[2].is_connected(0) {
        ts[2].progress();
        assert!(Instant::now() < died + Duration::from_secs(5));
    }
    let mut t0 = ts.remove(0);
    drop(t0);
    t0 = Transport::new(Arc::new(fabric.join(0).unwrap()), Config::new(geo(3))).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !t0.is_connected(2) || !ts[1].is_connected(0) {
        t0.progress();
        ts[1].progress();
        assert!(Instant::now() < end, "port 0 did not reconnect to port 2");
    }
    // The new port 0 asks for 100 000 bytes more: over its quota there.
    let put = |t0: &mut Transport, cookie| {
        let q = t0.create_qp(2).unwrap();
        let src = t0.register_region(100_000, Access::LOCAL).unwrap();
        let sge = [Sge {
            key: src,
            offset: 0,
            len: 100_000,
        }];
        t0.post_multicast_put(&[q], &sge, cookie).unwrap();
    };
    put(&mut t0, 8);
    let mut hosts = vec![t0, ts.remove(1)];
    let c = collect(&mut hosts, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (8, Status::TooLarge));
    // Once port 1 is polled, it gives the old chain up and releases port
    // 2's storage: the same request then fits.
    let mut all = vec![hosts.remove(0), ts.remove(0), hosts.remove(0)];
    let end = Instant::now() + Duration::from_secs(5);
    while all[2].region_area_free() != free2 {
        for t in all.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end, "port 2 kept the old storage");
    }
    put(&mut all[0], 9);
    let c = collect(&mut all, 0, 1);
    assert_eq!((c[0].cookie, c[0].status), (9, Status::Success));
}

#[test]
fn a_chain_link_never_forwards_into_a_restarted_next_links_memory() {
    // The scenario needs port 0 to read port 1's answer before it notices
    // port 2's death.
    let intact = until_reached(
        "port 0 never put before it noticed port 2's death",
        forward_after_the_next_link_restarted,
    );
    assert!(intact, "port 1 forwarded into the new host's memory");
}

/// 0 → 1 → 2, port 2 replaced by a new host after it gave port 1 its
/// storage, then port 0 puts: whether the new host's first region kept
/// its bytes, or `None` when port 0 cancelled instead of putting.
fn forward_after_the_next_link_restarted() -> Option<bool> {
    let (fabric, mut ts) = loopback(3, WIN, geo(3));
    // Port 1 holds port 2's storage and has told port 0 it is clear to
    // send; port 0 has not polled since.
    serve_chain_from_0(&mut ts);
    ts[1].progress();
    ts[2].progress();
    // Port 2 goes and a new host takes its port; port 1 reconnects to it.
    fabric.kill(2);
    drop(ts.pop());
    let end = Instant::now() + Duration::from_secs(5);
    while ts[1].is_connected(2) {
        ts[1].progress();
        assert!(Instant::now() < end, "port 1 did not see the death");
    }
    let mut t2 = Transport::new(Arc::new(fabric.join(2).unwrap()), Config::new(geo(3))).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !t2.is_connected(1) || !ts[1].is_connected(2) {
        t2.progress();
        ts[1].progress();
        assert!(Instant::now() < end, "port 2 did not come back");
    }
    // The new host's first memory, where the old one's storage was.
    let mine = t2.register_region(100_000, Access::LOCAL).unwrap();
    t2.region_write(mine, 0, &[0xee; 100_000]).unwrap();
    // Port 0 puts to port 1, which gets the data.
    for _ in 0..200 {
        ts[0].progress();
        ts[1].progress();
        t2.progress();
    }
    let got = drain(&mut ts[1]);
    if !got.iter().any(|c| c.op == OpKind::MulticastRecv) {
        return None;
    }
    let mut back = vec![0u8; 100_000];
    t2.region_read(mine, 0, &mut back).unwrap();
    Some(back.iter().all(|&b| b == 0xee))
}

/// A rendezvous write starts no copy late: the target gives its storage up
/// a timeout after the request reached it, and here, while the initiator
/// was not polled, the target's application deregistered the region,
/// the served write expired, and a new region took the bytes. The
/// initiator, polled at last, finds the target's answer past its copy
/// window (three quarters of the timeout after the post): the write fails
/// with a timeout and the new region keeps its contents. A run whose first
/// poll expired the write before reading the answer does not reach the
/// check and is tried again.
#[test]
fn a_write_answered_after_its_copy_window_writes_nothing() {
    let timeout = Duration::from_millis(200);
    let len = 64 * 1024;
    let untouched = until_reached(
        "every run expired the write before reading the target's answer",
        || {
            let (_f, mut ts) = loopback_with(2, WIN, |_| Config {
                op_timeout: timeout,
                ..Config::new(geo(2))
            });
            // Scattered, so not advertised for one-sided writes (whose
            // revocation would hold the bytes until the initiator polls).
            let dst = ts[1]
                .register_region_scattered(len, Access::ALL, 16 * 1024)
                .unwrap();
            let src = ts[0].register_region(len, Access::ALL).unwrap();
            ts[0].region_write(src, 0, &vec![0x55; len]).unwrap();
            let q01 = ts[0].create_qp(1).unwrap();
            let q10 = ts[1].create_qp(0).unwrap();
            let sge = [Sge {
                key: src,
                offset: 0,
                len: len as u64,
            }];
            let at = RemoteAddr {
                key: dst,
                offset: 0,
            };
            ts[0].post_write(q01, &sge, at, 1).unwrap();
            let end = Instant::now() + Duration::from_secs(5);
            while ts[1].resources(q10).serving == 0 {
                ts[1].progress();
                assert!(Instant::now() < end, "the target never served the write");
            }
            ts[1].deregister_region(dst).unwrap();
            std::thread::sleep(timeout);
            while ts[1].resources(q10).serving > 0 {
                ts[1].progress();
                assert!(Instant::now() < end, "the served write never expired");
            }
            let fresh = ts[1]
                .register_region_scattered(len, Access::ALL, 16 * 1024)
                .unwrap();
            ts[1].region_write(fresh, 0, &vec![0xaa; len]).unwrap();
            ts[0].progress();
            if ts[0]
                .counters(q01)
                .dropped(ntbdk_pmd::transport::DropKind::UnknownOp)
                > 0
            {
                return None; // expired before the answer was read
            }
            let mut got = vec![0u8; len];
            ts[1].region_read(fresh, 0, &mut got).unwrap();
            if got.iter().any(|&x| x != 0xaa) {
                return Some(false);
            }
            let done = drain(&mut ts[0]);
            assert!(
                done.iter()
                    .any(|c| c.cookie == 1 && c.status == Status::Timeout),
                "{done:?}"
            );
            Some(true)
        },
    );
    assert!(untouched, "the late copy landed in the new region");
}

/// The destination of a read of unknown size that failed is set aside,
/// not reused: the target serves the read from when the request reached
/// it, and here it reads the request only after the initiator gave up. Its
/// late copy lands in the storage set aside, never in a region the
/// initiator registered meanwhile; the storage goes back to the area two
/// timeouts later.
#[test]
fn a_failed_read_keeps_its_destination_while_the_target_may_still_copy_in() {
    let timeout = Duration::from_millis(200);
    let len = 16 * 1024;
    let (_f, mut ts) = loopback_with(2, WIN, |_| Config {
        op_timeout: timeout,
        ..Config::new(geo(2))
    });
    let src = ts[1].register_region(len, Access::ALL).unwrap();
    ts[1].region_write(src, 0, &vec![0x55; len]).unwrap();
    let q01 = ts[0].create_qp(1).unwrap();
    let free_at_start = ts[0].region_area_free();
    let at = RemoteAddr {
        key: src,
        offset: 0,
    };
    ts[0].post_read_unknown(q01, at, len as u64, 1).unwrap();
    // The target answers the size; the initiator allocates its destination
    // and sends the request, which the target does not read yet.
    let end = Instant::now() + Duration::from_secs(5);
    while ts[0].region_area_free() == free_at_start {
        ts[1].progress();
        ts[0].progress();
        assert!(Instant::now() < end, "no destination allocated");
    }
    let failed = loop {
        ts[0].progress();
        if let Some(c) = drain(&mut ts[0]).into_iter().find(|c| c.cookie == 1) {
            break c;
        }
        assert!(Instant::now() < end, "the read never timed out");
    };
    assert_eq!(failed.status, Status::Timeout);
    let fresh = ts[0]
        .register_region_scattered(len, Access::LOCAL, len)
        .unwrap();
    ts[0].region_write(fresh, 0, &vec![0xaa; len]).unwrap();
    // The target wakes up and serves the read.
    let q10 = ts[1].create_qp(0).unwrap();
    let served = ts[1].counters(q10).served;
    let end = Instant::now() + Duration::from_secs(5);
    while ts[1].counters(q10).served == served {
        ts[1].progress();
        assert!(Instant::now() < end, "the target never served the read");
    }
    let mut got = vec![0u8; len];
    ts[0].region_read(fresh, 0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0xaa),
        "the late copy landed in a region registered after the read failed"
    );
    // Two timeouts later the destination goes back to the area.
    let end = Instant::now() + Duration::from_secs(5);
    while ts[0].region_area_free() + len as u64 != free_at_start {
        ts[0].progress();
        ts[1].progress();
        assert!(Instant::now() < end, "the destination was never freed");
    }
}

/// A connection we end because the peer stopped crediting (what we queued
/// for it passed the backlog's limit) starts over under a new incarnation:
/// once the peer polls again it sees it, ends its side, and the two
/// reconnect. Before, the peer stayed connected to nobody.
#[test]
fn a_peer_that_stopped_crediting_reconnects_once_it_polls_again() {
    // Port 1 may have any number of operations outstanding.
    let (_f, mut ts) = transport_common::loopback_with(2, 16 << 20, |p| Config {
        max_outstanding: if p == 1 { 1 << 20 } else { 4096 },
        ..Config::new(geo(2))
    });
    let q01 = ts[0].create_qp(1).unwrap();
    let q10 = ts[1].create_qp(0).unwrap();
    overflow_until_reset(&mut ts, q10);
    assert!(ts[1].is_connected(0), "port 1 has not polled yet");
    await_reconnection(&mut ts, q10);
    assert_eq!(ts[0].counters(q01).disconnects, 1);
}

/// Port 1 posts writes and never polls, so it credits none of port 0's
/// answers (each an error `Ack`: the key is unknown), which wait in port
/// 0's backlog; past its limit port 0 resets the connection. Port 1's own
/// posts wait for room (`Busy`) while port 0 drains them. Returns once
/// port 0 has reset (port 1 has not polled since).
fn overflow_until_reset(ts: &mut [Transport], q10: Qp) {
    let src = ts[1].register_region(64, Access::ALL).unwrap();
    let local = [Sge {
        key: src,
        offset: 0,
        len: 64,
    }];
    let nowhere = RemoteAddr {
        key: RegionKey(0x5eed),
        offset: 0,
    };
    let mut posted = 0u64;
    while ts[0].is_connected(1) {
        for _ in 0..16 {
            match ts[1].post_write(q10, &local, nowhere, posted) {
                Ok(()) => posted += 1,
                Err(TransportError::Busy { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        ts[0].progress();
        assert!(posted < 1 << 20, "the backlog never overflowed");
    }
}

/// Polls both until they have connected again after port 0's reset.
fn await_reconnection(ts: &mut [Transport], q10: Qp) {
    let end = Instant::now() + Duration::from_secs(10);
    while !(ts[0].is_connected(1) && ts[1].is_connected(0) && ts[1].counters(q10).disconnects > 0) {
        ts[0].progress();
        ts[1].progress();
        assert!(
            Instant::now() < end,
            "no reconnection after the reset: port 1 still connected to nobody"
        );
    }
}

/// A peer whose link drops and comes back under the same generation (it
/// only stalled, and never saw the link change) may still write what we
/// advertised to it before it reads our hello: a region deregistered while
/// its link was down keeps its bytes until the peer has connected again.
/// (Released at once, they could be registered again and take the late
/// write.)
#[test]
fn a_region_deregistered_while_its_peer_is_down_is_held_until_it_reconnects() {
    let (fabric, mut ts) = loopback(2, WIN, geo(2));
    let q10 = ts[1].create_qp(0).unwrap();
    let r = ts[0].register_region(4096, Access::ALL).unwrap();
    // Until port 1 has learnt the region.
    let end = Instant::now() + Duration::from_secs(10);
    let remote = RemoteAddr { key: r, offset: 0 };
    while matches!(
        ts[1].post_write_direct(q10, &[], remote, None, 0),
        Err(TransportError::UnknownRemoteKey { .. })
    ) {
        ts[0].progress();
        ts[1].progress();
        assert!(Instant::now() < end, "the region was never advertised");
    }
    fabric.kill(1);
    let end = Instant::now() + Duration::from_secs(10);
    while ts[0].is_connected(1) {
        ts[0].progress();
        assert!(Instant::now() < end, "port 0 never saw the link drop");
    }
    let free = ts[0].region_area_free();
    ts[0].deregister_region(r).unwrap();
    for _ in 0..1000 {
        ts[0].progress();
    }
    assert_eq!(
        ts[0].region_area_free(),
        free,
        "freed while the peer may still write it"
    );
    // Port 1 comes back, as it was; once it has connected again it holds
    // nothing of the old connection, and the bytes are free.
    fabric.revive(1);
    let end = Instant::now() + Duration::from_secs(10);
    while ts[0].region_area_free() == free {
        ts[0].progress();
        ts[1].progress();
        assert!(Instant::now() < end, "the region was never released");
    }
    assert!(ts[0].is_connected(1), "released before the peer answered");
}

/// A peer that drains its old rings after we reset the connection (it had
/// stopped polling, and takes its old messages before it reads our new
/// hello) writes its old progress into the credit words our reset had
/// zeroed. The next connection must not take those for its own: a stale
/// PostQ credit had port 0 overwrite sends port 1 had not read (each
/// completed as sent), and port 1 then waited for good. Credit words carry
/// the connection's epoch, as slots do.
#[test]
fn a_late_credit_of_a_reset_connection_is_not_taken_by_the_next() {
    let (_f, mut ts) = transport_common::loopback_with(2, 16 << 20, |p| Config {
        max_outstanding: if p == 1 { 1 << 20 } else { 4096 },
        ..Config::new(geo(2))
    });
    let depth = u64::from(geo(2).queue_depth);
    let q01 = ts[0].create_qp(1).unwrap();
    let q10 = ts[1].create_qp(0).unwrap();
    let rbuf = ts[1]
        .register_region(8 * 4 * depth as usize, Access::LOCAL)
        .unwrap();
    let recv = |i: u64| RecvWr {
        sge: Sge {
            key: rbuf,
            offset: 8 * i,
            len: 8,
        },
        cookie: i,
    };
    // The old connection: half a ring of sends port 1 takes only after
    // port 0 has reset (it does not poll until then).
    let old: Vec<RecvWr> = (0..depth / 2).map(recv).collect();
    assert_eq!(ts[1].post_recvs(q10, &old).unwrap(), old.len());
    for i in 0..depth / 2 {
        ts[0].post_send(q01, &i.to_le_bytes(), i).unwrap();
    }
    // The reset, as in the test above: port 1 posts and never polls, port
    // 0's answers overflow its backlog.
    overflow_until_reset(&mut ts, q10);
    await_reconnection(&mut ts, q10);
    drain(&mut ts[0]);
    drain(&mut ts[1]);
    // The new connection: port 1 takes nothing until port 0 has filled
    // the PostQ, which holds `depth` sends.
    let mut sent = 0u64;
    loop {
        match ts[0].post_send(q01, &(1000 + sent).to_le_bytes(), sent) {
            Ok(()) => sent += 1,
            Err(TransportError::Busy { .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent <= 2 * depth, "the PostQ never filled");
    }
    assert_eq!(sent, depth, "port 0 took a stale credit as room");
    let new: Vec<RecvWr> = (0..sent).map(|i| recv(depth + i)).collect();
    assert_eq!(ts[1].post_recvs(q10, &new).unwrap(), new.len());
    let got = collect(&mut ts, 1, sent as usize);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(
            (c.op, c.status, c.cookie, c.bytes),
            (OpKind::Recv, Status::Success, depth + i as u64, 8),
            "message {i} of the new connection"
        );
        let mut back = [0u8; 8];
        ts[1]
            .region_read(rbuf, 8 * (depth + i as u64), &mut back)
            .unwrap();
        assert_eq!(u64::from_le_bytes(back), 1000 + i as u64);
    }
}

/// A host with more regions open to a peer for one-sided writes than it
/// advertises to one peer (32 768, half of what a peer can learn and of
/// the queue's backlog) advertises only as many: advertising them all on
/// connecting overflowed the queue to the peer, and the connection reset,
/// connected and reset again for good. The regions past the bound stay
/// open to rendezvous writes.
#[test]
fn more_regions_than_a_peer_can_learn_do_not_keep_the_connection_resetting() {
    let fabric = LoopbackFabric::new(2, 16 << 20);
    let cfg = Config::new(geo(2));
    let mut ts = vec![Transport::new(Arc::new(fabric.join(0).unwrap()), cfg.clone()).unwrap()];
    let keys: Vec<RegionKey> = (0..66_000)
        .map(|_| ts[0].register_region(64, Access::ALL).unwrap())
        .collect();
    ts.push(Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap());
    transport_common::connect_all(&mut ts);
    let q01 = ts[0].create_qp(1).unwrap();
    let q10 = ts[1].create_qp(0).unwrap();
    let probe = |t: &mut Transport, key| {
        t.post_write_direct(q10, &[], RemoteAddr { key, offset: 0 }, None, 0)
    };
    // Until every advertisement has gone out, then a few more polls for
    // the last to be read.
    let end = Instant::now() + Duration::from_secs(10);
    while ts[0].resources(q01).backlog > 0 {
        ts[0].progress();
        ts[1].progress();
        assert!(Instant::now() < end, "the advertisements never drained");
    }
    for _ in 0..100 {
        ts[0].progress();
        ts[1].progress();
    }
    assert_eq!(ts[0].counters(q01).disconnects, 0, "the connection reset");
    let unknown: Vec<RegionKey> = keys
        .iter()
        .copied()
        .filter(|&k| {
            matches!(
                probe(&mut ts[1], k),
                Err(TransportError::UnknownRemoteKey { .. })
            )
        })
        .collect();
    assert_eq!(unknown.len(), 66_000 - 32_768, "regions the peer learnt");
    // A rendezvous write still reaches a region past the bound.
    let src = ts[1].register_region(64, Access::ALL).unwrap();
    let sge = [Sge {
        key: src,
        offset: 0,
        len: 64,
    }];
    let at = RemoteAddr {
        key: unknown[0],
        offset: 0,
    };
    ts[1].post_write(q10, &sge, at, 9).unwrap();
    let done = collect(&mut ts, 1, 1);
    assert_eq!((done[0].cookie, done[0].status), (9, Status::Success));
}
