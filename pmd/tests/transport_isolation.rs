//! Isolation between peers and recovery from lost state, on the emulated
//! fabric: a host dropped from the fabric (it stalled past the heartbeat
//! timeout) is told so and writes nothing more, so the host that took its
//! place is undisturbed.

mod transport_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::emu::{DeviceConfig, EmuFabric, FabricConfig, SlotState};
use ntbdk_pmd::hw::{HwError, Port};
use ntbdk_pmd::transport::{Config, Geometry, PeerState, Transport, TransportError};
use transport_common::{Host, TestDir};

const LONG: Duration = Duration::from_secs(20);

fn geo() -> Geometry {
    Geometry {
        ports: 2,
        queue_depth: 64,
        eager_count: 16,
        eager_size: 1024,
    }
}

/// Polls both until each sees the other connected.
fn connect(a: &mut Host, b: &mut Host, pa: Port, pb: Port) {
    let end = Instant::now() + LONG;
    while !a.t.is_connected(pb) || !b.t.is_connected(pa) {
        a.pump();
        b.pump();
        assert!(Instant::now() < end, "no connection within {LONG:?}");
    }
}

/// `n` messages each way, every byte checked in order.
fn exchange(a: &mut Host, b: &mut Host, pa: Port, pb: Port, n: usize, tag: u8) {
    for i in 0..n {
        let m = |from: u8| vec![tag ^ from ^ i as u8; 24 + (i % 200)];
        a.send(pb, &m(1));
        b.send(pa, &m(2));
        assert_eq!(b.recv(pa, LONG), m(1), "message {i} from {pa}");
        assert_eq!(a.recv(pb, LONG), m(2), "message {i} from {pb}");
    }
}

#[test]
fn a_stalled_host_is_told_it_was_dropped_and_the_new_occupant_is_undisturbed() {
    let dir = TestDir::new("zombie");
    let fc = FabricConfig {
        slots: 2,
        window_size: 1 << 20,
        heartbeat_timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let fabric = EmuFabric::create_in(dir.path(), "zombie", &fc).unwrap();
    let join = |slot: Port, heartbeat_thread: bool| {
        let d = fabric
            .join(&DeviceConfig {
                slot: Some(slot),
                heartbeat_thread,
                dir: Some(dir.path().to_owned()),
                ..Default::default()
            })
            .expect("join");
        Arc::new(d)
    };
    let cfg = Config::new(geo());
    // A beats only when it polls (no heartbeat thread): when it stops
    // polling it stalls, as a stopped process would.
    let mut a = Host::new(Transport::new(join(0, false), cfg.clone()).unwrap(), 2, 8);
    let mut b = Host::new(Transport::new(join(1, true), cfg.clone()).unwrap(), 2, 8);
    connect(&mut a, &mut b, 0, 1);
    exchange(&mut a, &mut b, 0, 1, 20, 0x10);

    // A stalls. B's device declares it dead and frees slot 0.
    let end = Instant::now() + LONG;
    while b.t.peer_state(0) == PeerState::Connected
        || fabric.status().slots[0].state != SlotState::Free
    {
        b.pump();
        assert!(Instant::now() < end, "A was never declared dead");
    }
    // C takes slot 0 and connects to B (whose receives for port 0 were
    // flushed when A's connection ended).
    let mut c = Host::new(Transport::new(join(0, true), cfg.clone()).unwrap(), 2, 8);
    connect(&mut c, &mut b, 0, 1);
    b.repost_all(0);
    exchange(&mut c, &mut b, 0, 1, 20, 0x20);
    let qb = b.qp(0);
    let b_connects = b.t.counters(qb).connects;
    let b_drops = b.t.counters(qb).dropped_total();

    // A wakes up. It must learn it was dropped, refuse to post, and write
    // nothing into B's window (where slot 0's mailbox and rings are C's now).
    // Its first act is a send, before any poll has told it anything: the
    // device refuses the write (its place is gone), nothing lands in C's
    // PostQ at B.
    let b_writes_before = b.t.device().counters().posted_writes;
    let qa = a.qp(1);
    match a.t.post_send(qa, b"zombie", 1) {
        Err(TransportError::Hw(HwError::SlotLost { port: 0 })) => {}
        other => panic!("a dropped host's send went through: {other:?}"),
    }
    let end = Instant::now() + LONG;
    while a.t.peer_state(1) != PeerState::Lost {
        a.pump();
        // Meanwhile B and C keep talking, undisturbed.
        c.pump();
        b.pump();
        assert!(Instant::now() < end, "A never learnt it was dropped");
    }
    assert!(matches!(
        a.t.post_send(qa, b"zombie", 1),
        Err(TransportError::Lost)
    ));
    assert!(matches!(
        a.t.wait_connected(1, Duration::from_millis(10)),
        Err(TransportError::Lost)
    ));
    assert!(matches!(
        a.t.device().service(),
        Err(HwError::SlotLost { port: 0 })
    ));
    // Its goodbye on drop is suppressed too.
    drop(a);
    exchange(&mut c, &mut b, 0, 1, 50, 0x30);
    assert_eq!(b.t.peer_state(0), PeerState::Connected);
    assert_eq!(c.t.peer_state(1), PeerState::Connected);
    assert_eq!(
        b.t.counters(qb).connects,
        b_connects,
        "B's connection to the new occupant was reset"
    );
    assert_eq!(
        b.t.counters(qb).dropped_total(),
        b_drops,
        "B dropped messages on port 0 after A woke up"
    );
    assert!(b.t.device().counters().posted_writes > b_writes_before);
    drop((b, c));
    EmuFabric::destroy_in(dir.path(), "zombie").unwrap();
}
