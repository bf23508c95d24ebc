//! Fuzzes a live transport: a rogue peer writes arbitrary slots into the
//! victim's queues; the victim must not panic, and its traffic with an honest
//! peer must still work afterwards.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use ntbdk_pmd::hw::loopback::LoopbackFabric;
use ntbdk_pmd::transport::{Access, Completion, Config, Geometry, Sge, Status, Transport, epoch};
use ntbdk_pmd::transport::{Ring, inject::Injector};

fuzz_target!(|data: &[u8]| {
    let fabric = LoopbackFabric::new(3, 1 << 20);
    let cfg = Config::new(Geometry::small(3));
    let rogue_dev = Arc::new(fabric.join(2).unwrap());
    let mut ts: Vec<Transport> = (0..2)
        .map(|p| Transport::new(Arc::new(fabric.join(p).unwrap()), cfg.clone()).unwrap())
        .collect();
    let mut rogue = Transport::new(rogue_dev.clone(), cfg).unwrap();
    // Set-up must succeed: a harness that returns early here would report
    // every input as handled while testing nothing.
    let connected = |ts: &[Transport], rogue: &Transport| {
        ts[0].is_connected(1)
            && ts[1].is_connected(0)
            && ts[1].is_connected(2)
            && rogue.is_connected(1)
    };
    let end = Instant::now() + Duration::from_secs(10);
    while !connected(&ts, &rogue) {
        ts[0].progress();
        ts[1].progress();
        rogue.progress();
        assert!(
            Instant::now() < end,
            "set-up failed: the transports did not connect within 10 s ({:?}, {:?}, {:?})",
            ts[0].peer_state(1),
            ts[1].peer_state(2),
            rogue.peer_state(1)
        );
    }
    let victim = &mut ts[1];
    let qr = victim.create_qp(2).unwrap();
    let buf = victim.register_region(8192, Access::ALL).unwrap();
    for i in 0..4 {
        victim
            .post_recv(
                qr,
                Sge {
                    key: buf,
                    offset: i * 1024,
                    len: 1024,
                },
                i,
            )
            .expect("set-up failed: a receive could not be posted");
    }
    let mut inj = Injector::new(
        &*rogue_dev,
        1,
        *victim.layout(),
        epoch(rogue.incarnation(), victim.incarnation()),
    )
    .unwrap();
    for chunk in data.chunks_exact(57) {
        let ring = [Ring::Rx, Ring::Tx, Ring::Cq, Ring::PostQ][(chunk[0] % 4) as usize];
        let mut body = [0u8; 56];
        body.copy_from_slice(&chunk[1..]);
        inj.push(ring, &body).unwrap();
        victim.progress();
    }
    // The honest peer still gets through.
    let q0 = ts[0].create_qp(1).unwrap();
    let q1 = ts[1].create_qp(0).unwrap();
    ts[1]
        .post_recv(
            q1,
            Sge {
                key: buf,
                offset: 4096,
                len: 64,
            },
            77,
        )
        .unwrap();
    ts[0].post_send(q0, b"still alive", 1).unwrap();
    let mut out = [Completion::default(); 16];
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        ts[0].progress();
        let n = ts[1].poll_completions(&mut out);
        if let Some(c) = out[..n].iter().find(|c| c.cookie == 77) {
            assert_eq!(c.status, Status::Success);
            return;
        }
    }
    panic!("the honest peer's message did not arrive within 10 s");
});
