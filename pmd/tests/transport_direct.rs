//! One-sided writes on the emulated fabric: advertised regions written
//! straight from the initiator with every byte checked, immediates exactly
//! once and after their data, errors at the initiator, and revocation that
//! holds the region's memory until the peer acknowledges.

mod transport_common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::emu::{DeviceConfig, EmuFabric, FabricConfig};
use ntbdk_pmd::transport::{
    Access, Completion, Config, DirectWr, DropKind, Geometry, OpKind, RegionKey, RemoteAddr,
    Status, Transport, TransportError,
};
use transport_common::{Rng, TestDir};

const LONG: Duration = Duration::from_secs(20);

/// `n` transports on one emulated fabric, connected all to all.
fn hosts(dir: &TestDir, name: &str, n: u16) -> (EmuFabric, Vec<Transport>) {
    hosts_with(dir, name, Config::new(Geometry::small(n)))
}

/// The same with `cfg` on every host (its geometry's port count).
fn hosts_with(dir: &TestDir, name: &str, cfg: Config) -> (EmuFabric, Vec<Transport>) {
    let n = cfg.geometry.ports;
    let fc = FabricConfig {
        slots: n as usize,
        window_size: 1 << 20,
        // No host here dies unannounced: a loaded machine's stall must not
        // drop a live one.
        heartbeat_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let fabric = EmuFabric::create_in(dir.path(), name, &fc).unwrap();
    let mut ts: Vec<Transport> = (0..n)
        .map(|slot| {
            let d = fabric
                .join(&DeviceConfig {
                    slot: Some(slot),
                    dir: Some(dir.path().to_owned()),
                    ..Default::default()
                })
                .unwrap();
            Transport::new(Arc::new(d), cfg.clone()).unwrap()
        })
        .collect();
    let end = Instant::now() + LONG;
    while (0..n).any(|i| (0..n).any(|j| i != j && !ts[i as usize].is_connected(j))) {
        for t in ts.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end, "no mesh within {LONG:?}");
    }
    (fabric, ts)
}

/// Polls everyone until `from` may write `key` of `to` directly.
fn learn(ts: &mut [Transport], from: usize, to: usize, key: RegionKey) {
    let qp = ts[from].create_qp(to as u16).unwrap();
    let end = Instant::now() + LONG;
    loop {
        for t in ts.iter_mut() {
            t.progress();
        }
        // A zero-length probe is refused for its size, not its key, once known.
        match ts[from].post_write_direct(qp, &[], RemoteAddr { key, offset: 0 }, None, 0) {
            Err(TransportError::UnknownRemoteKey { .. }) => {}
            Err(TransportError::TransferSize { .. }) => return,
            other => panic!("probe: {other:?}"),
        }
        assert!(Instant::now() < end, "region {key:?} never advertised");
    }
}

#[test]
fn direct_writes_land_every_byte_and_immediates_come_once_after_their_data() {
    let dir = TestDir::new("direct");
    let (_f, mut ts) = hosts(&dir, "direct", 2);
    let region = ts[1].register_region(64 * 1024, Access::ALL).unwrap();
    learn(&mut ts, 0, 1, region);
    let qp = ts[0].create_qp(1).unwrap();
    let mut rng = Rng(7);
    let mut sent: Vec<Vec<u8>> = Vec::new();
    for i in 0..100u64 {
        let mut data = vec![0u8; 1 + rng.below(512) as usize];
        rng.fill(&mut data);
        let remote = RemoteAddr {
            key: region,
            offset: i * 640,
        };
        ts[0]
            .post_write_direct(qp, &data, remote, Some(i), 1000 + i)
            .unwrap();
        sent.push(data);
    }
    // The initiator completes each write as soon as it is posted.
    let mut done = [Completion::default(); 128];
    let n = ts[0].poll_completions(&mut done);
    assert_eq!(n, 100);
    assert!(
        done[..n]
            .iter()
            .all(|c| c.op == OpKind::WriteDirect && c.status.is_ok())
    );
    // The target hears of each once, and its data is there when it does.
    let mut seen = HashSet::new();
    let end = Instant::now() + LONG;
    while seen.len() < 100 {
        let n = ts[1].poll_completions(&mut done);
        for c in &done[..n] {
            assert_eq!(
                (c.op, c.status, c.region),
                (OpKind::WriteImm, Status::Success, Some(region))
            );
            assert!(seen.insert(c.cookie), "immediate {} twice", c.cookie);
            let data = &sent[c.cookie as usize];
            assert_eq!(c.bytes, data.len() as u64);
            let mut got = vec![0u8; data.len()];
            ts[1].region_read(region, c.cookie * 640, &mut got).unwrap();
            assert_eq!(&got, data, "write {} not in place at its notice", c.cookie);
        }
        ts[0].progress();
        assert!(Instant::now() < end, "{} of 100 notices", seen.len());
    }
    // The same bytes through the in-place view.
    let view = ts[1].region_view(region).unwrap();
    assert_eq!(view.len(), 64 * 1024);
    for (i, data) in sent.iter().enumerate() {
        let mut got = vec![0u8; data.len()];
        view.read(i as u64 * 640, &mut got).unwrap();
        assert_eq!(&got, data);
        assert_eq!(view.load_u8(i as u64 * 640), Some(data[0]));
    }
    assert_eq!(view.load_u8(64 * 1024), None);
    assert!(view.read(64 * 1024 - 4, &mut [0u8; 8]).is_err());
    // A write without an immediate tells the target nothing.
    ts[0]
        .post_write_direct(
            qp,
            &[9; 64],
            RemoteAddr {
                key: region,
                offset: 0,
            },
            None,
            1,
        )
        .unwrap();
    for _ in 0..1000 {
        ts[0].progress();
        assert_eq!(ts[1].poll_completions(&mut done), 0);
    }
    let mut got = [0u8; 64];
    ts[1].region_read(region, 0, &mut got).unwrap();
    assert_eq!(got, [9; 64]);
    drop(ts);
    EmuFabric::destroy_in(dir.path(), "direct").unwrap();
}

#[test]
fn batches_complete_only_their_signaled_writes_and_stop_at_the_first_bad_one() {
    let dir = TestDir::new("direct-batch");
    let (_f, mut ts) = hosts(&dir, "direct-batch", 2);
    let big = ts[1].register_region(64 * 1024, Access::ALL).unwrap();
    let small = ts[1].register_region(4096, Access::ALL).unwrap();
    learn(&mut ts, 0, 1, big);
    learn(&mut ts, 0, 1, small);
    let qp = ts[0].create_qp(1).unwrap();
    let mut rng = Rng(11);
    // 40 writes in runs that switch region (key changes mid-batch), every
    // fifth signaled, the last with an immediate.
    let datas: Vec<Vec<u8>> = (0..40)
        .map(|_| {
            let mut d = vec![0u8; 1 + rng.below(100) as usize];
            rng.fill(&mut d);
            d
        })
        .collect();
    let at = |i: usize| {
        let key = if (i / 3).is_multiple_of(2) {
            big
        } else {
            small
        };
        RemoteAddr {
            key,
            offset: i as u64 * 100,
        }
    };
    let wrs: Vec<DirectWr> = (0..40)
        .map(|i| DirectWr {
            data: &datas[i],
            remote: at(i),
            imm: (i == 39).then_some(77),
            signaled: i % 5 == 4,
            cookie: i as u64,
        })
        .collect();
    assert_eq!(ts[0].post_writes_direct(qp, &wrs).unwrap(), 40);
    let mut done = [Completion::default(); 64];
    let n = ts[0].poll_completions(&mut done);
    let cookies: Vec<u64> = done[..n].iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, (0..40).filter(|i| i % 5 == 4).collect::<Vec<_>>());
    assert!(done[..n].iter().all(|c| c.op == OpKind::WriteDirect));
    // The immediate comes once, and every write of the batch is in place
    // when it does.
    let end = Instant::now() + LONG;
    let imm = loop {
        ts[0].progress();
        let n = ts[1].poll_completions(&mut done);
        if n > 0 {
            assert_eq!(n, 1);
            break done[0];
        }
        assert!(Instant::now() < end, "no immediate");
    };
    assert_eq!(
        (imm.op, imm.cookie, imm.region),
        (OpKind::WriteImm, 77, Some(small))
    );
    for (i, d) in datas.iter().enumerate() {
        let mut got = vec![0u8; d.len()];
        ts[1]
            .region_read(at(i).key, at(i).offset, &mut got)
            .unwrap();
        assert_eq!(&got, d, "write {i}");
    }
    // A batch stops at its first bad write: the ones before it land and
    // count, nothing after it is written, its error is not returned.
    let fresh = [0xA5u8; 16];
    let mut bad: Vec<DirectWr> = (0..8)
        .map(|i| DirectWr {
            data: &fresh,
            remote: RemoteAddr {
                key: big,
                offset: 8192 + i * 16,
            },
            imm: None,
            signaled: true,
            cookie: 100 + i,
        })
        .collect();
    bad[5].remote = RemoteAddr {
        key: small,
        offset: 4090,
    };
    assert_eq!(ts[0].post_writes_direct(qp, &bad).unwrap(), 5);
    let n = ts[0].poll_completions(&mut done);
    let cookies: Vec<u64> = done[..n].iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, vec![100, 101, 102, 103, 104]);
    let mut got = [0u8; 16 * 8];
    ts[1].region_read(big, 8192, &mut got).unwrap();
    assert!(got[..80].iter().all(|&b| b == 0xA5));
    assert!(
        got[80..].iter().all(|&b| b != 0xA5),
        "written at or past the bad write"
    );
    // A first bad write is the batch's error, and nothing is written.
    bad[0].remote.key = RegionKey(big.0 ^ 0x5555);
    assert!(matches!(
        ts[0].post_writes_direct(qp, &bad),
        Err(TransportError::UnknownRemoteKey { peer: 1, .. })
    ));
    bad[0].remote.key = big;
    bad[0].data = &[];
    assert!(matches!(
        ts[0].post_writes_direct(qp, &bad),
        Err(TransportError::TransferSize { len: 0 })
    ));
    assert_eq!(ts[0].poll_completions(&mut done), 0);
    assert_eq!(ts[0].post_writes_direct(qp, &[]).unwrap(), 0);
    drop(ts);
    EmuFabric::destroy_in(dir.path(), "direct-batch").unwrap();
}

#[test]
fn direct_writes_are_checked_at_the_initiator() {
    let dir = TestDir::new("direct-check");
    let (_f, mut ts) = hosts(&dir, "direct-check", 3);
    let open = ts[1].register_region(4096, Access::ALL).unwrap();
    let local_only = ts[1].register_region(4096, Access::LOCAL).unwrap();
    let for_two = ts[1].register_region_for(4096, Access::ALL, &[2]).unwrap();
    learn(&mut ts, 0, 1, open);
    learn(&mut ts, 2, 1, for_two);
    let qp = ts[0].create_qp(1).unwrap();
    let w = |ts: &mut Vec<Transport>, key, offset, len: usize| {
        ts[0].post_write_direct(qp, &vec![1u8; len], RemoteAddr { key, offset }, None, 0)
    };
    assert!(w(&mut ts, open, 0, 4096).is_ok());
    assert!(matches!(
        w(&mut ts, open, 1, 4096),
        Err(TransportError::RemoteOutOfRange {
            region_len: 4096,
            ..
        })
    ));
    assert!(matches!(
        w(&mut ts, open, u64::MAX, 1),
        Err(TransportError::RemoteOutOfRange { .. })
    ));
    for key in [local_only, for_two, RegionKey(open.0 ^ 0x5555)] {
        assert!(
            matches!(
                w(&mut ts, key, 0, 8),
                Err(TransportError::UnknownRemoteKey { peer: 1, .. })
            ),
            "{key:?}"
        );
    }
    drop(ts);
    EmuFabric::destroy_in(dir.path(), "direct-check").unwrap();
}

#[test]
fn a_revoked_region_keeps_its_memory_until_the_peer_acknowledges() {
    let dir = TestDir::new("revoke");
    let (_f, mut ts) = hosts(&dir, "revoke", 2);
    let free0 = ts[1].region_area_free();
    let region = ts[1].register_region(64 * 1024, Access::ALL).unwrap();
    learn(&mut ts, 0, 1, region);
    let held = ts[1].region_area_free();
    assert!(held < free0);
    ts[1].deregister_region(region).unwrap();
    // Not back yet: the peer may still write it.
    assert_eq!(ts[1].region_area_free(), held);
    // More than is free now, less than there would be had the revoked
    // region's bytes come back.
    let again = ts[1].register_region(held as usize + 4096, Access::LOCAL);
    assert!(
        again.is_err(),
        "the revoked region's bytes were handed out again"
    );
    // The peer takes the revocation, forgets the key and acknowledges.
    let qp = ts[0].create_qp(1).unwrap();
    let end = Instant::now() + LONG;
    while ts[1].region_area_free() != free0 {
        ts[0].progress();
        ts[1].progress();
        assert!(
            Instant::now() < end,
            "the revocation was never acknowledged"
        );
    }
    assert!(matches!(
        ts[0].post_write_direct(
            qp,
            &[1; 8],
            RemoteAddr {
                key: region,
                offset: 0
            },
            None,
            0
        ),
        Err(TransportError::UnknownRemoteKey { .. })
    ));
    drop(ts);
    EmuFabric::destroy_in(dir.path(), "revoke").unwrap();
}

/// A write-with-immediate whose notice arrives after the target's
/// application deregistered the region (the data landed first): the notice
/// is dropped, not counted as an access violation of the honest writer.
#[test]
fn a_notice_that_arrives_after_its_region_was_deregistered_is_not_blamed_on_the_writer() {
    let dir = TestDir::new("late-notice");
    let (_f, mut ts) = hosts(&dir, "late-notice", 2);
    let free0 = ts[1].region_area_free();
    let region = ts[1].register_region(4096, Access::ALL).unwrap();
    learn(&mut ts, 0, 1, region);
    let q01 = ts[0].create_qp(1).unwrap();
    let q10 = ts[1].create_qp(0).unwrap();
    let to = RemoteAddr {
        key: region,
        offset: 0,
    };
    ts[0]
        .post_write_direct(q01, &[9; 64], to, Some(77), 1)
        .unwrap();
    // The notice is in port 1's ring, unread, when it deregisters.
    ts[1].deregister_region(region).unwrap();
    let mut comps = vec![Completion::default(); 16];
    let mut notices = 0;
    let mut poll_1 = |t: &mut Transport| {
        let n = t.poll_completions(&mut comps);
        comps[..n]
            .iter()
            .filter(|c| c.op == OpKind::WriteImm)
            .count()
    };
    // Until the revocation is over (port 0 acknowledged), then a while
    // more: the notice, sent before the acknowledgement, is taken by then.
    let end = Instant::now() + LONG;
    while ts[1].region_area_free() != free0 {
        ts[0].progress();
        notices += poll_1(&mut ts[1]);
        assert!(Instant::now() < end, "the revocation never ended");
    }
    for _ in 0..100 {
        ts[0].progress();
        notices += poll_1(&mut ts[1]);
    }
    assert_eq!(notices, 0, "a notice for a deregistered region");
    assert_eq!(
        ts[1].counters(q10).dropped(DropKind::Access),
        0,
        "the late notice was counted against the writer"
    );
    drop(ts);
    EmuFabric::destroy_in(dir.path(), "late-notice").unwrap();
}

/// A peer's notices come unasked: an application that runs `progress` but
/// never polls its completions holds at most `cq_depth` of them. Past it
/// they are refused and counted, the data still lands, nothing of the
/// initiator fails, and polling makes room again.
#[test]
fn notices_stop_at_the_completion_queue_depth_and_resume_after_a_poll() {
    const DEPTH: usize = 100;
    let dir = TestDir::new("cq-depth");
    let mut cfg = Config::new(Geometry::small(2));
    cfg.cq_depth = DEPTH;
    let (_f, mut ts) = hosts_with(&dir, "cq-depth", cfg);
    let region = ts[1].register_region(64 * 1024, Access::ALL).unwrap();
    learn(&mut ts, 0, 1, region);
    let qp = ts[0].create_qp(1).unwrap();
    let to = |offset| RemoteAddr {
        key: region,
        offset,
    };
    let mut done = [Completion::default(); 256];
    let back = ts[1].create_qp(0).unwrap();
    let overloads = |t: &Transport| t.counters(back).dropped(DropKind::Overload);
    let before = overloads(&ts[1]);
    for i in 0..250u64 {
        let byte = [i as u8 + 1; 64];
        ts[0]
            .post_write_direct(qp, &byte, to(i * 64), Some(i), i)
            .unwrap();
        // The target moves its rings along but never polls completions.
        ts[1].progress();
    }
    assert_eq!(ts[0].poll_completions(&mut done), 250);
    assert!(done[..250].iter().all(|c| c.status.is_ok()));
    let end = Instant::now() + LONG;
    while overloads(&ts[1]) - before < 150 {
        ts[1].progress();
        assert!(Instant::now() < end, "the overrun was never counted");
    }
    for _ in 0..1000 {
        ts[1].progress();
    }
    assert_eq!(
        overloads(&ts[1]) - before,
        150,
        "refused more than the excess"
    );
    // Every byte landed, notice or not.
    let view = ts[1].region_view(region).unwrap();
    for i in 0..250u64 {
        assert_eq!(view.load_u8(i * 64 + 63), Some(i as u8 + 1), "write {i}");
    }
    // The first DEPTH notices wait, in order, and nothing else.
    assert_eq!(ts[1].poll_completions(&mut done), DEPTH);
    for (i, c) in done[..DEPTH].iter().enumerate() {
        assert_eq!((c.op, c.cookie), (OpKind::WriteImm, i as u64));
    }
    assert_eq!(ts[1].poll_completions(&mut done), 0);
    // Polled, the queue takes notices again.
    ts[0]
        .post_write_direct(qp, &[7; 64], to(0), Some(999), 0)
        .unwrap();
    let end = Instant::now() + LONG;
    loop {
        let n = ts[1].poll_completions(&mut done);
        if n > 0 {
            assert_eq!((n, done[0].op, done[0].cookie), (1, OpKind::WriteImm, 999));
            break;
        }
        assert!(Instant::now() < end, "no notice after the poll");
    }
    assert_eq!(overloads(&ts[1]) - before, 150);
    drop(ts);
    EmuFabric::destroy_in(dir.path(), "cq-depth").unwrap();
}

/// A region registered scattered that ends up in one piece is advertised to
/// the peers already connected, like any other (it reached only peers that
/// connected later).
#[test]
fn a_scattered_registration_in_one_piece_is_advertised() {
    let dir = TestDir::new("direct-scat");
    let (_f, mut ts) = hosts(&dir, "direct-scat", 2);
    let region = ts[1]
        .register_region_scattered(4096, Access::ALL, 1 << 20)
        .unwrap();
    learn(&mut ts, 0, 1, region);
    let qp = ts[0].create_qp(1).unwrap();
    let remote = RemoteAddr {
        key: region,
        offset: 100,
    };
    ts[0]
        .post_write_direct(qp, &[0x5a; 64], remote, None, 1)
        .unwrap();
    let mut got = [0u8; 64];
    ts[1].region_read(region, 100, &mut got).unwrap();
    assert_eq!(got, [0x5a; 64]);
}
