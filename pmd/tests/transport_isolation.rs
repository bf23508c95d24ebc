//! Isolation between peers and recovery from lost state, on the emulated
//! fabric: a host dropped from the fabric (it stalled past the heartbeat
//! timeout, in this process or as a stopped child process) is told so and
//! writes nothing more, so the host that took its place is undisturbed; a
//! peer stores only where it was granted.

mod transport_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::emu::{DeviceConfig, EmuFabric, FabricConfig, SlotState};
use ntbdk_pmd::hw::{HwError, Port};
use ntbdk_pmd::transport::{
    Access, Config, DropKind, Geometry, PeerState, RegionKey, RemoteAddr, Sge, Status, Transport,
    TransportError,
};
use transport_common::{Host, Rng, RoleChild, TestDir, child_role, death_bound, env};

const LONG: Duration = Duration::from_secs(20);

/// The heartbeat timeout of the tests that wait for a death: short enough
/// for a quick test, long enough that a live host a loaded machine stalls
/// for a moment (a descheduled thread, a throttled process) is not dropped.
const DEATH_TEST_HEARTBEAT: Duration = Duration::from_secs(1);

/// The heartbeat timeout of the tests where no host dies.
const LIVE_HEARTBEAT: Duration = Duration::from_secs(2);

fn geo() -> Geometry {
    Geometry {
        ports: 2,
        queue_depth: 64,
        eager_count: 16,
        eager_size: 1024,
        data: ntbdk_pmd::transport::DataQueues::NONE,
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

/// B's connection to port 0 as it stands (connections made, messages
/// dropped), to compare with after a dropped host woke up.
fn connection_of(b: &mut Host) -> (u64, u64) {
    let qb = b.qp(0);
    (b.t.counters(qb).connects, b.t.counters(qb).dropped_total())
}

/// C (port 0 now) and B exchange 50 more messages, every byte checked, and
/// B's connection to port 0 made no new connection and dropped nothing
/// since `before` ([`connection_of`]): the dropped host disturbed nothing.
fn assert_undisturbed(c: &mut Host, b: &mut Host, before: (u64, u64), tag: u8) {
    exchange(c, b, 0, 1, 50, tag);
    let (connects, drops) = connection_of(b);
    assert_eq!(
        connects, before.0,
        "B's connection to the new occupant was reset"
    );
    assert_eq!(
        drops, before.1,
        "B dropped messages on port 0 after A woke up"
    );
}

#[test]
fn a_stalled_host_is_told_it_was_dropped_and_the_new_occupant_is_undisturbed() {
    let dir = TestDir::new("zombie");
    let fc = FabricConfig {
        slots: 2,
        window_size: 1 << 20,
        heartbeat_timeout: DEATH_TEST_HEARTBEAT,
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
    // A holds grants in slot 0's table (their ids, which C's will reuse,
    // are withdrawn when A's transport is dropped).
    for _ in 0..2 {
        a.t.register_region(4096, Access::ALL).unwrap();
    }

    // A stalls. B's device declares it dead and frees slot 0.
    let stalled = Instant::now();
    let end = stalled + LONG;
    while b.t.peer_state(0) == PeerState::Connected
        || fabric.status().slots[0].state != SlotState::Free
    {
        b.pump();
        assert!(Instant::now() < end, "A was never declared dead");
    }
    let seen = stalled.elapsed();
    eprintln!("the stalled host was dropped after {seen:?}");
    assert!(
        seen <= death_bound(fc.heartbeat_timeout),
        "the stalled host was dropped after {seen:?}, beyond {:?}",
        death_bound(fc.heartbeat_timeout)
    );
    // C takes slot 0 and connects to B (whose receives for port 0 were
    // flushed when A's connection ended).
    let mut c = Host::new(Transport::new(join(0, true), cfg.clone()).unwrap(), 2, 8);
    connect(&mut c, &mut b, 0, 1);
    b.repost_all(0);
    exchange(&mut c, &mut b, 0, 1, 20, 0x20);
    let before = connection_of(&mut b);
    for _ in 0..2 {
        c.t.register_region(4096, Access::ALL).unwrap();
    }
    let c_grants = fabric.status().slots[0].granted_ranges;
    assert!(c_grants >= 2, "{c_grants} grants for C's two regions");

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
    // Nor its register writes: a scratchpad or doorbell of B's, as the owner
    // of slot 0 (C now), or its old registers (C's now).
    let spad = |h: &Host| h.t.device().spad_read(0).unwrap();
    let (spad_b, spad_c) = (spad(&b), spad(&c));
    let zombie = a.t.device();
    for refused in [
        zombie.peer_spad_write(1, 0, 0x5a5a_5a5a),
        zombie.peer_db_set(1, 1),
        zombie.spad_write(0, 0x5a5a_5a5a),
    ] {
        assert!(
            matches!(refused, Err(HwError::SlotLost { port: 0 })),
            "a dropped host's register write: {refused:?}"
        );
    }
    assert_eq!(spad(&b), spad_b);
    assert_eq!(spad(&c), spad_c);
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
    // A receive posted now would never complete: refused.
    let sge = Sge {
        key: a.recv_region,
        offset: 0,
        len: 64,
    };
    assert!(matches!(
        a.t.post_recv(qa, sge, 7),
        Err(TransportError::Lost)
    ));
    // Its goodbye on drop is suppressed too, and so are its withdrawals
    // of grants in what is C's table now.
    assert!(a.t.register_region(4096, Access::ALL).is_err());
    drop(a);
    assert_eq!(
        fabric.status().slots[0].granted_ranges,
        c_grants,
        "the dropped host edited the new occupant's grant table"
    );
    assert_undisturbed(&mut c, &mut b, before, 0x30);
    assert_eq!(b.t.peer_state(0), PeerState::Connected);
    assert_eq!(c.t.peer_state(1), PeerState::Connected);
    assert!(b.t.device().counters().posted_writes > b_writes_before);
    drop((b, c));
    EmuFabric::destroy_in(dir.path(), "zombie").unwrap();
}

/// The same on a fabric whose windows are one shared region (an ivshmem
/// BAR2): there slot 0's window is the same bytes whoever holds the slot,
/// so the dropped host, learning it was dropped, must not reset its
/// sections (its teardown zeroed the rings, credits and buffers of the new
/// occupant's connection), nor write its regions.
#[test]
fn a_dropped_host_on_a_shared_region_leaves_the_new_occupants_window_alone() {
    let fc = FabricConfig {
        slots: 2,
        window_size: 1 << 20,
        heartbeat_timeout: DEATH_TEST_HEARTBEAT,
        ..Default::default()
    };
    let len = 8 << 20;
    let mem = std::fs::File::from(
        nix::sys::memfd::memfd_create(c"ntbdk-test-shared", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .unwrap(),
    );
    mem.set_len(len as u64).unwrap();
    // Two mappings of the region, as two VMs have: A's, and B's and C's
    // (one process claims a window once, by its address).
    let map = || ntbdk_pmd::hw::emu::SharedRegion::map_fd(&mem, len, "test region").unwrap();
    let fabric = EmuFabric::open_shared(map(), "shared zombie", &fc).unwrap();
    let other = EmuFabric::attach_shared(map(), "shared zombie").unwrap();
    let join_via = |f: &EmuFabric, slot: Port, heartbeat_thread: bool| {
        Arc::new(
            f.join(&DeviceConfig {
                slot: Some(slot),
                heartbeat_thread,
                ..Default::default()
            })
            .expect("join"),
        )
    };
    let cfg = Config::new(geo());
    let mut a = Host::new(
        Transport::new(join_via(&fabric, 0, false), cfg.clone()).unwrap(),
        2,
        8,
    );
    let mut b = Host::new(
        Transport::new(join_via(&other, 1, true), cfg.clone()).unwrap(),
        2,
        8,
    );
    connect(&mut a, &mut b, 0, 1);
    exchange(&mut a, &mut b, 0, 1, 20, 0x10);
    let a_region = a.t.register_region(4096, Access::ALL).unwrap();
    // A stalls until B's side declares it dead and slot 0 is free.
    let end = Instant::now() + LONG;
    while b.t.peer_state(0) == PeerState::Connected
        || fabric.status().slots[0].state != SlotState::Free
    {
        b.pump();
        assert!(Instant::now() < end, "A was never declared dead");
    }
    let mut c = Host::new(
        Transport::new(join_via(&other, 0, true), cfg).unwrap(),
        2,
        8,
    );
    connect(&mut c, &mut b, 0, 1);
    b.repost_all(0);
    exchange(&mut c, &mut b, 0, 1, 20, 0x20);
    let before = connection_of(&mut b);
    // B's messages to C wait in slot 0's window, C not polling yet.
    let waiting: Vec<Vec<u8>> = (0..10u8)
        .map(|i| vec![0x40 ^ i; 32 + usize::from(i)])
        .collect();
    for m in &waiting {
        b.send(0, m);
    }
    // A wakes up, writes into its region (the bytes are C's now: refused),
    // and polls until it knows it was dropped (its teardown then must not
    // zero what waits for C).
    assert!(matches!(
        a.t.region_write(a_region, 0, &[0xa5; 64]),
        Err(TransportError::Lost)
    ));
    let end = Instant::now() + LONG;
    while a.t.peer_state(1) != PeerState::Lost {
        a.pump();
        assert!(Instant::now() < end, "A never learnt it was dropped");
    }
    drop(a);
    for (i, m) in waiting.iter().enumerate() {
        assert_eq!(&c.recv(1, LONG), m, "message {i} waiting for C");
    }
    assert_undisturbed(&mut c, &mut b, before, 0x30);
    let qc = c.qp(1);
    assert_eq!(c.t.counters(qc).disconnects, 0, "C's connection was reset");
}

/// Three hosts on one emulated fabric, connected all to all.
fn three(dir: &TestDir, name: &str) -> (EmuFabric, Vec<Host>) {
    let fc = FabricConfig {
        slots: 3,
        window_size: 1 << 20,
        heartbeat_timeout: LIVE_HEARTBEAT,
        ..Default::default()
    };
    let fabric = EmuFabric::create_in(dir.path(), name, &fc).unwrap();
    let cfg = Config::new(Geometry { ports: 3, ..geo() });
    let mut hs: Vec<Host> = (0..3)
        .map(|slot| {
            let d = fabric
                .join(&DeviceConfig {
                    slot: Some(slot),
                    dir: Some(dir.path().to_owned()),
                    ..Default::default()
                })
                .expect("join");
            Host::new(Transport::new(Arc::new(d), cfg.clone()).unwrap(), 3, 4)
        })
        .collect();
    let end = Instant::now() + LONG;
    while (0..3).any(|i| (0..3).any(|j| i != j && !hs[i].t.is_connected(j as Port))) {
        for h in hs.iter_mut() {
            h.pump();
        }
        assert!(Instant::now() < end, "no full mesh within {LONG:?}");
    }
    (fabric, hs)
}

/// A write or a read between two hosts of [`three`].
#[derive(Clone, Copy)]
enum Op {
    Write,
    Read,
}

/// Posts `op` from host `from` against region `key` of host `to` (a write
/// of `data`, or a read of `data.len()` bytes), and waits for its
/// completion, polling every host.
fn rdma(hs: &mut [Host], op: Op, from: usize, to: usize, key: RegionKey, data: &[u8]) -> Status {
    let local = hs[from]
        .t
        .register_region(data.len(), Access::LOCAL)
        .unwrap();
    hs[from].t.region_write(local, 0, data).unwrap();
    let qp = hs[from].qp(to as Port);
    let cookie = 0x5000 + to as u64;
    let sge = [Sge {
        key: local,
        offset: 0,
        len: data.len() as u64,
    }];
    let remote = RemoteAddr { key, offset: 0 };
    match op {
        Op::Write => hs[from].t.post_write(qp, &sge, remote, cookie),
        Op::Read => hs[from].t.post_read(qp, &sge, remote, cookie),
    }
    .unwrap();
    let end = Instant::now() + LONG;
    loop {
        for h in hs.iter_mut() {
            h.pump();
        }
        if let Some(c) = hs[from].done.remove(&cookie) {
            hs[from].t.deregister_region(local).unwrap();
            return c.status;
        }
        assert!(Instant::now() < end, "{from} -> {to} never completed");
    }
}

fn write(hs: &mut [Host], from: usize, to: usize, key: RegionKey, data: &[u8]) -> Status {
    rdma(hs, Op::Write, from, to, key, data)
}

fn read(hs: &mut [Host], from: usize, to: usize, key: RegionKey, len: usize) -> Status {
    rdma(hs, Op::Read, from, to, key, &vec![0u8; len])
}

#[test]
fn a_region_registered_for_one_peer_is_refused_to_the_others_and_keys_are_unguessable() {
    let dir = TestDir::new("keys");
    let (_fabric, mut hs) = three(&dir, "keys");
    // Host 0 registers a region for host 1 only.
    let r = hs[0]
        .t
        .register_region_for(4096, Access::ALL, &[1])
        .unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    // Host 1 writes it and reads it back: every byte.
    assert_eq!(write(&mut hs, 1, 0, r, &data), Status::Success);
    let mut got = vec![0u8; 4096];
    hs[0].t.region_read(r, 0, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(read(&mut hs, 1, 0, r, 4096), Status::Success);
    // Host 2 holds the same key: refused both ways, nothing changed.
    assert_eq!(write(&mut hs, 2, 0, r, &[0xee; 4096]), Status::RemoteAccess);
    assert_eq!(read(&mut hs, 2, 0, r, 4096), Status::RemoteAccess);
    hs[0].t.region_read(r, 0, &mut got).unwrap();
    assert_eq!(got, data, "a refused write changed the region");
    // Keys are not a counter: a guess next to a live key names nothing.
    let open = hs[0].t.register_region(64, Access::ALL).unwrap();
    for guess in [open.0.wrapping_add(1), open.0.wrapping_sub(1), open.0 ^ 1] {
        if guess != r.0 {
            assert_eq!(
                write(&mut hs, 2, 0, RegionKey(guess), &[1; 64]),
                Status::RemoteAccess
            );
        }
    }
    // A stale key (deregistered) is refused, even to the peer it was for.
    hs[0].t.deregister_region(r).unwrap();
    let r2 = hs[0]
        .t
        .register_region_for(4096, Access::ALL, &[1])
        .unwrap();
    assert_ne!(r2, r);
    assert_eq!(write(&mut hs, 1, 0, r, &data), Status::RemoteAccess);
    assert_eq!(write(&mut hs, 1, 0, r2, &data), Status::Success);
    // Every refusal was counted at host 0 as an access drop from host 2 or 1.
    let q2 = hs[0].qp(2);
    assert!(hs[0].t.counters(q2).dropped(DropKind::Access) >= 3);
    drop(hs);
    EmuFabric::destroy_in(dir.path(), "keys").unwrap();
}

#[test]
fn huge_timeouts_saturate_instead_of_panicking() {
    let fabric = ntbdk_pmd::hw::loopback::LoopbackFabric::new(2, 1 << 20);
    let mut cfg = Config::new(geo());
    cfg.op_timeout = Duration::MAX;
    let mut a = Transport::new(Arc::new(fabric.join(0).unwrap()), cfg.clone()).unwrap();
    let mut b = Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap();
    let end = Instant::now() + LONG;
    while !a.is_connected(1) || !b.is_connected(0) {
        a.progress();
        b.progress();
        assert!(Instant::now() < end, "no connection within {LONG:?}");
    }
    // Connected: an unbounded wait returns at once, without overflowing.
    a.wait_connected(1, Duration::MAX).unwrap();
    // An operation with an unbounded timeout still completes.
    let dst = b.register_region(64, Access::ALL).unwrap();
    let src = a.register_region(64, Access::LOCAL).unwrap();
    let qa = a.create_qp(1).unwrap();
    let sge = Sge {
        key: src,
        offset: 0,
        len: 64,
    };
    a.post_write(
        qa,
        &[sge],
        RemoteAddr {
            key: dst,
            offset: 0,
        },
        9,
    )
    .unwrap();
    let mut done = [ntbdk_pmd::transport::Completion::default(); 4];
    let end = Instant::now() + LONG;
    loop {
        b.progress();
        if a.poll_completions(&mut done) > 0 {
            assert_eq!((done[0].cookie, done[0].status), (9, Status::Success));
            break;
        }
        assert!(Instant::now() < end);
    }
}

#[test]
fn a_wedged_ring_is_detected_and_the_connection_resyncs() {
    use ntbdk_pmd::hw::loopback::LoopbackFabric;
    use ntbdk_pmd::transport::inject::Injector;
    use ntbdk_pmd::transport::{Part, epoch};

    let fabric = LoopbackFabric::new(3, 1 << 20);
    let mut cfg = Config::new(Geometry { ports: 3, ..geo() });
    cfg.op_timeout = Duration::from_millis(300);
    let rogue_dev = Arc::new(fabric.join(2).unwrap());
    let mut a = Host::new(
        Transport::new(Arc::new(fabric.join(0).unwrap()), cfg.clone()).unwrap(),
        3,
        8,
    );
    let mut b = Host::new(
        Transport::new(Arc::new(fabric.join(1).unwrap()), cfg.clone()).unwrap(),
        3,
        8,
    );
    let mut rogue = Transport::new(rogue_dev.clone(), cfg).unwrap();
    let end = Instant::now() + LONG;
    while !a.t.is_connected(1) || !b.t.is_connected(0) || !rogue.is_connected(1) {
        a.pump();
        b.pump();
        rogue.progress();
        assert!(Instant::now() < end);
    }
    let e = epoch(rogue.incarnation(), b.t.incarnation());
    let inj = Injector::new(&*rogue_dev, 1, *b.t.layout(), e).unwrap();

    // While B does not poll, A sends three messages (PostQ slots 0, 1, 2
    // of A's section in B's window), and the rogue zeroes the tag of
    // slot 0: B's consumer waits for a slot that never becomes valid while
    // A has gone on.
    for i in 0..3u8 {
        a.send(1, &[i; 24]);
    }
    let tag_of_slot0 = b.t.layout().part(0, Part::PostQ) + 56;
    inj.scribble(tag_of_slot0, &[0u8; 8]).unwrap();

    // B notices within its operation timeout and resets the connection;
    // both sides reconnect under a fresh epoch.
    let t0 = Instant::now();
    let qb = b.qp(0);
    while b.t.counters(qb).resyncs == 0 {
        a.pump();
        b.pump();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the wedge was never detected"
        );
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    let end = Instant::now() + LONG;
    while !a.t.is_connected(1) || !b.t.is_connected(0) {
        a.pump();
        b.pump();
        assert!(Instant::now() < end, "no reconnection after the resync");
    }
    b.repost_all(0);
    a.repost_all(1);
    // The two messages after the lost one were not delivered out of order
    // into the new connection; new traffic verifies byte for byte.
    assert!(b.inbox.get(&0).is_none_or(|q| q.is_empty()));
    exchange(&mut a, &mut b, 0, 1, 50, 0x40);
    assert_eq!(b.t.counters(qb).resyncs, 1);
}

/// A (port 0) and B (port 1) on a loopback fabric with a rogue (port 2)
/// that can wedge A's ring from B: for the tests of a connection A ends on
/// its own while B, not polled, still holds it.
struct OneSidedReset {
    a: Host,
    b: Host,
    inj: ntbdk_pmd::transport::inject::Injector,
}

impl OneSidedReset {
    fn new(op_timeout: Duration) -> Self {
        use ntbdk_pmd::hw::loopback::LoopbackFabric;
        use ntbdk_pmd::transport::epoch;
        use ntbdk_pmd::transport::inject::Injector;

        let fabric = LoopbackFabric::new(3, 1 << 20);
        let mut cfg = Config::new(Geometry { ports: 3, ..geo() });
        cfg.op_timeout = op_timeout;
        let rogue_dev = Arc::new(fabric.join(2).unwrap());
        let host = |p| {
            let t = Transport::new(Arc::new(fabric.join(p).unwrap()), cfg.clone()).unwrap();
            Host::new(t, 3, 8)
        };
        let (mut a, mut b) = (host(0), host(1));
        let mut rogue = Transport::new(rogue_dev.clone(), cfg.clone()).unwrap();
        let end = Instant::now() + LONG;
        while !a.t.is_connected(1) || !b.t.is_connected(0) || !rogue.is_connected(0) {
            a.pump();
            b.pump();
            rogue.progress();
            assert!(Instant::now() < end);
        }
        let e = epoch(rogue.incarnation(), a.t.incarnation());
        let inj = Injector::new(&*rogue_dev, 0, *a.t.layout(), e).unwrap();
        Self { a, b, inj }
    }

    /// A's ring from B wedges: B sends three messages and the rogue zeroes
    /// the tag of the first in A's window. A resets the connection about
    /// an operation timeout later.
    fn wedge(&mut self) {
        use ntbdk_pmd::transport::Part;
        for i in 0..3u8 {
            self.b.send(0, &[i; 24]);
        }
        let tag = self.a.t.layout().part(1, Part::PostQ) + 56;
        self.inj.scribble(tag, &[0u8; 8]).unwrap();
    }

    /// Polls A alone (B then still holds the old connection) until it has
    /// reset the connection, or until `limit`: when it did, the instant
    /// just before the poll that reset it (so no later than the reset).
    fn a_resets_alone(&mut self, limit: Duration) -> Option<Instant> {
        let qa = self.a.qp(1);
        let end = Instant::now() + limit;
        loop {
            let before = Instant::now();
            self.a.pump();
            if self.a.t.counters(qa).resyncs > 0 {
                return Some(before);
            }
            if before >= end {
                return None;
            }
        }
    }
}

/// A connection one side ends on its own (here a wedge, as above, with
/// the roles turned) may still be alive at the other, which goes on
/// writing the regions it knows until it sees the new incarnation: a
/// region deregistered in between keeps its bytes out of the area until
/// then, so a region registered meanwhile never receives those writes;
/// once the two have connected again the bytes are released.
#[test]
fn a_region_revoked_after_a_one_sided_reset_is_not_reused_while_the_peer_may_write_it() {
    let mut r = OneSidedReset::new(Duration::from_millis(300));
    // A's region, for B alone (the rogue, which stops polling, would
    // never acknowledge a revocation), known to B.
    let free_at_start = r.a.t.region_area_free();
    let len = 4096;
    let region = r.a.t.register_region_for(len, Access::ALL, &[1]).unwrap();
    let qb = r.b.qp(0);
    let at = |key| RemoteAddr { key, offset: 0 };
    let end = Instant::now() + LONG;
    while let Err(TransportError::UnknownRemoteKey { .. }) =
        r.b.t.post_write_direct(qb, &[], at(region), None, 0)
    {
        r.a.pump();
        r.b.pump();
        assert!(Instant::now() < end, "the region was never advertised");
    }
    r.wedge();
    r.a_resets_alone(LONG)
        .expect("the wedge was never detected");
    // A deregisters the region and registers another; B, still writing
    // under the old connection, writes the first.
    let (a, b) = (&mut r.a, &mut r.b);
    a.t.deregister_region(region).unwrap();
    let fresh = a.t.register_region_for(len, Access::ALL, &[1]).unwrap();
    a.t.region_write(fresh, 0, &[0xaa; 4096]).unwrap();
    b.t.post_write_direct(qb, &[0x55; 4096], at(region), None, 1)
        .unwrap();
    let mut got = vec![0u8; len];
    a.t.region_read(fresh, 0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0xaa),
        "a late write to the revoked region landed in the new one"
    );
    // B sees the new incarnation, both reconnect, and the revoked
    // region's bytes go back to the area.
    let end = Instant::now() + LONG;
    while !(a.t.is_connected(1) && b.t.is_connected(0))
        || a.t.region_area_free() + len as u64 != free_at_start
    {
        a.pump();
        b.pump();
        assert!(
            Instant::now() < end,
            "no reconnection, or the revoked region's bytes never came back \
             ({} free, {} at the start, {len} in use)",
            a.t.region_area_free(),
            free_at_start
        );
    }
}

/// After a one-sided reset, a peer that never comes back (it died on a
/// device that reports no link change, or stalls) does not hold what it
/// was advertised for ever: two operation timeouts after the reset the
/// revocation it cannot answer completes and the bytes go back.
#[test]
fn a_peer_that_never_comes_back_after_a_one_sided_reset_releases_its_regions() {
    let timeout = Duration::from_millis(300);
    let mut r = OneSidedReset::new(timeout);
    let free_at_start = r.a.t.region_area_free();
    let region = r.a.t.register_region_for(4096, Access::ALL, &[1]).unwrap();
    let qb = r.b.qp(0);
    let end = Instant::now() + LONG;
    let probe = RemoteAddr {
        key: region,
        offset: 0,
    };
    while let Err(TransportError::UnknownRemoteKey { .. }) =
        r.b.t.post_write_direct(qb, &[], probe, None, 0)
    {
        r.a.pump();
        r.b.pump();
        assert!(Instant::now() < end, "the region was never advertised");
    }
    r.wedge();
    // From before the reset: a pause of this thread after it must not make
    // the hold look shorter than it was.
    let reset = r
        .a_resets_alone(LONG)
        .expect("the wedge was never detected");
    r.a.t.deregister_region(region).unwrap();
    // B is never polled again.
    while r.a.t.region_area_free() != free_at_start {
        r.a.pump();
        assert!(reset.elapsed() < LONG, "the region was held for good");
    }
    let held = reset.elapsed();
    assert!(
        held >= timeout * 2 - Duration::from_millis(20),
        "released after {held:?}, before two timeouts"
    );
}

/// The same one-sided reset with a rendezvous write of B's that A was
/// serving: B, still inside its copy window, copies into the storage A
/// granted. The reset keeps that hold until the write's deadline, so a
/// region registered meanwhile never receives the copy. A run where A
/// reset before serving the write, or B's poll saw the reset first, does
/// not reach the check and is tried again.
#[test]
fn a_write_served_when_we_reset_keeps_its_bytes_until_its_deadline() {
    let timeout = Duration::from_millis(400);
    let len = 16 * 1024;
    let untouched = transport_common::until_reached(
        "no run had A serve the write just before its reset and B copy after it",
        || {
            let mut r = OneSidedReset::new(timeout);
            // Scattered, so not advertised (its revocation would hold the
            // bytes on its own).
            let dst =
                r.a.t
                    .register_region_scattered(len, Access::ALL, 4096)
                    .unwrap();
            let src = r.b.t.register_region(len, Access::LOCAL).unwrap();
            r.b.t.region_write(src, 0, &vec![0x55; len]).unwrap();
            r.wedge();
            // Polled together until shortly before A detects the wedge.
            let t0 = Instant::now();
            while t0.elapsed() < timeout * 8 / 10 {
                r.a.pump();
                r.b.pump();
            }
            let qb = r.b.qp(0);
            let sge = [Sge {
                key: src,
                offset: 0,
                len: len as u64,
            }];
            let at = RemoteAddr {
                key: dst,
                offset: 0,
            };
            r.b.t.post_write(qb, &sge, at, 7).unwrap();
            r.a_resets_alone(timeout)?;
            let (a, b) = (&mut r.a, &mut r.b);
            a.t.deregister_region(dst).unwrap();
            let fresh =
                a.t.register_region_scattered(len, Access::ALL, 4096)
                    .unwrap();
            a.t.region_write(fresh, 0, &vec![0xaa; len]).unwrap();
            let copied = b.t.counters(qb).bytes_out;
            b.t.progress();
            if b.t.counters(qb).bytes_out == copied {
                return None; // A had not served it, or B saw the reset
            }
            let mut got = vec![0u8; len];
            a.t.region_read(fresh, 0, &mut got).unwrap();
            Some(got.iter().all(|&x| x == 0xaa))
        },
    );
    assert!(
        untouched,
        "the late copy landed in a region registered after the reset"
    );
}

#[test]
fn a_peer_reaches_only_its_own_mailbox_and_section() {
    use ntbdk_pmd::transport::Layout;

    let dir = TestDir::new("grants");
    let (_fabric, mut hs) = three(&dir, "grants");
    assert!(hs.iter().all(|h| h.t.peers_isolated()));
    let layout = *hs[1].t.layout();
    // Host 2 (the rogue) writes into host 1's window with its own device's
    // handle, as a buggy or hostile peer on the fabric would.
    let win = hs[2].t.device().peer_window(1, 0).unwrap();
    let before = hs[2].t.device().counters().ungranted_writes;
    let attacks = [
        ("host 0's mailbox (a forged hello)", Layout::mailbox(0), 64),
        (
            "host 0's section (its rings)",
            layout.section_offset(0),
            4096,
        ),
        (
            "host 0's eager buffers",
            layout.section_offset(0) + layout.section_size() - 1024,
            1024,
        ),
        ("the window header", 0, 64),
    ];
    for (what, at, len) in attacks {
        match win.write(at, &vec![0u8; len]) {
            Err(HwError::NotGranted { peer: 1, .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
        assert!(
            win.write_u64(at.next_multiple_of(8), 0).is_err(),
            "{what}: a word store went through"
        );
    }
    assert_eq!(
        hs[2].t.device().counters().ungranted_writes - before,
        2 * attacks.len() as u64
    );
    // Its own mailbox and its own section are writable (regions: see
    // a_peer_stores_only_into_the_regions_registered_for_it).
    win.write(Layout::mailbox(2) + 8, &[0u8; 8]).unwrap();
    win.write(
        layout.section_offset(2) + layout.section_size() - 8,
        &[0u8; 8],
    )
    .unwrap_or_else(|e| panic!("own section: {e}"));
    // Hosts 0 and 1 never noticed.
    let (h0, rest) = hs.split_at_mut(1);
    exchange(&mut h0[0], &mut rest[0], 0, 1, 50, 0x50);
    let q10 = hs[1].qp(0);
    assert_eq!(hs[1].t.counters(q10).disconnects, 0);
    drop(hs);
    EmuFabric::destroy_in(dir.path(), "grants").unwrap();
}

/// Where region `key` of host `h` starts in its window: a random mark
/// written into the region, found in the window.
fn window_offset(h: &mut Host, key: RegionKey, rng: &mut Rng) -> usize {
    let mut mark = [0u8; 64];
    rng.fill(&mut mark);
    h.t.region_write(key, 0, &mark).unwrap();
    let local = h.t.device().local_window(0).unwrap();
    let start = h.t.layout().region_area_start();
    let mut grain = [0u8; 64];
    (start..local.len())
        .step_by(64)
        .find(|&o| {
            local.read(o, &mut grain).unwrap();
            grain == mark
        })
        .expect("the region's mark is not in the window")
}

/// Posts a read by host `from` of `len` bytes of `to`'s region `remote`
/// into `from`'s region `dst`, and waits for its completion.
fn read_into(hs: &mut [Host], from: usize, to: usize, remote: RegionKey, dst: RegionKey) -> Status {
    let len = hs[from].t.region_len(dst).unwrap();
    let qp = hs[from].qp(to as Port);
    let sge = Sge {
        key: dst,
        offset: 0,
        len,
    };
    let cookie = 0x6000 + to as u64;
    let remote = RemoteAddr {
        key: remote,
        offset: 0,
    };
    hs[from].t.post_read(qp, &[sge], remote, cookie).unwrap();
    let end = Instant::now() + LONG;
    loop {
        for h in hs.iter_mut() {
            h.pump();
        }
        if let Some(c) = hs[from].done.remove(&cookie) {
            return c.status;
        }
        assert!(Instant::now() < end, "{from} -> {to} never completed");
    }
}

#[test]
fn a_peer_stores_only_into_the_regions_registered_for_it() {
    let dir = TestDir::new("regions");
    let (fabric, mut hs) = three(&dir, "regions");
    let mut rng = Rng(13);
    // Host 0 registers a region for host 1, one for host 2, one for all.
    let for1 = hs[0]
        .t
        .register_region_for(8192, Access::ALL, &[1])
        .unwrap();
    let for2 = hs[0]
        .t
        .register_region_for(4096, Access::ALL, &[2])
        .unwrap();
    let open = hs[0].t.register_region(4096, Access::ALL).unwrap();
    let at2 = window_offset(&mut hs[0], for2, &mut rng);
    // A domain may name the owner itself (it needs no grant).
    let with_self = hs[0]
        .t
        .register_region_for(64, Access::LOCAL, &[0, 1])
        .unwrap();
    hs[0].t.deregister_region(with_self).unwrap();
    let mut secret = vec![0u8; 8192];
    rng.fill(&mut secret);
    hs[0].t.region_write(for1, 0, &secret).unwrap();

    // Host 2 stores 64 bytes at every grain of host 0's region area through
    // its own device: only the regions for it or for all take them.
    let win = hs[2].t.device().peer_window(0, 0).unwrap();
    let start = hs[0].t.layout().region_area_start();
    let before = hs[2].t.device().counters().ungranted_writes;
    let (mut taken, mut refused) = (0u64, 0u64);
    for o in (start..win.len()).step_by(64) {
        match win.write(o, &[0u8; 64]) {
            Ok(()) => taken += 64,
            Err(HwError::NotGranted { peer: 0, .. }) => refused += 1,
            Err(e) => panic!("store at {o}: {e}"),
        }
    }
    let recv_len = hs[0].t.region_len(hs[0].recv_region).unwrap();
    assert_eq!(
        taken,
        4096 + 4096 + recv_len.next_multiple_of(64),
        "host 2 stored outside the regions open to it"
    );
    assert_eq!(
        hs[2].t.device().counters().ungranted_writes - before,
        refused
    );
    let mut got = vec![0u8; 8192];
    hs[0].t.region_read(for1, 0, &mut got).unwrap();
    assert!(
        got == secret,
        "host 1's region changed under host 2's stores"
    );
    for key in [for2, open] {
        let mut g = vec![1u8; 4096];
        hs[0].t.region_read(key, 0, &mut g).unwrap();
        assert!(g.iter().all(|&b| b == 0), "a granted store did not land");
    }

    // Host 1 still reaches its region: a rendezvous write and a read, every
    // byte; a one-sided write; and host 0 writes host 1's read destination
    // when it is in host 0's domain — a destination of another domain is
    // refused when the read is posted.
    let mut data = vec![0u8; 8192];
    rng.fill(&mut data);
    assert_eq!(write(&mut hs, 1, 0, for1, &data), Status::Success);
    hs[0].t.region_read(for1, 0, &mut got).unwrap();
    assert!(got == data, "host 1's write did not land byte for byte");
    let dst = hs[1]
        .t
        .register_region_for(8192, Access::LOCAL, &[0])
        .unwrap();
    assert_eq!(read_into(&mut hs, 1, 0, for1, dst), Status::Success);
    hs[1].t.region_read(dst, 0, &mut got).unwrap();
    assert!(got == data, "host 1's read did not land byte for byte");
    let elsewhere = hs[1]
        .t
        .register_region_for(64, Access::LOCAL, &[2])
        .unwrap();
    let qp10 = hs[1].qp(0);
    let sge = Sge {
        key: elsewhere,
        offset: 0,
        len: 64,
    };
    let remote = RemoteAddr {
        key: for1,
        offset: 0,
    };
    assert!(matches!(
        hs[1].t.post_read(qp10, &[sge], remote, 1),
        Err(TransportError::NotInDomain { peer: 0, .. })
    ));
    let direct = hs[0]
        .t
        .register_region_for(4096, Access::LOCAL | Access::REMOTE_WRITE, &[1])
        .unwrap();
    let end = Instant::now() + LONG;
    let remote = RemoteAddr {
        key: direct,
        offset: 100,
    };
    loop {
        for h in hs.iter_mut() {
            h.pump();
        }
        match hs[1]
            .t
            .post_write_direct(qp10, &data[..999], remote, None, 2)
        {
            Ok(()) => break,
            Err(TransportError::UnknownRemoteKey { .. }) => {}
            Err(e) => panic!("one-sided write: {e}"),
        }
        assert!(Instant::now() < end, "the region was never advertised");
    }
    let mut g = vec![0u8; 999];
    hs[0].t.region_read(direct, 100, &mut g).unwrap();
    assert!(g == data[..999], "the one-sided write did not land");
    let (h0, rest) = hs.split_at_mut(1);
    exchange(&mut h0[0], &mut rest[0], 0, 1, 50, 0x60);
    let q10 = hs[1].qp(0);
    assert_eq!(hs[1].t.counters(q10).disconnects, 0);

    // Deregistered, the region for host 2 (advertised to it for one-sided
    // writes) stays writable by it until it acknowledged the revocation;
    // then the grant is gone.
    let free = hs[0].t.region_area_free();
    let grants = fabric.status().slots[0].granted_ranges;
    hs[0].t.deregister_region(for2).unwrap();
    win.write(at2, &[7u8; 64])
        .expect("the bytes of a region being revoked are still granted");
    let end = Instant::now() + LONG;
    while hs[0].t.region_area_free() < free + 4096 {
        for h in hs.iter_mut() {
            h.pump();
        }
        assert!(Instant::now() < end, "the revocation never completed");
    }
    assert!(matches!(
        win.write(at2, &[7u8; 64]),
        Err(HwError::NotGranted { peer: 0, .. })
    ));
    assert_eq!(fabric.status().slots[0].granted_ranges, grants - 1);
    // A transport that ends leaves nothing granted on its device.
    let dev0 = hs[0].t.device().clone();
    drop(hs);
    assert!(grants > 1);
    assert_eq!(fabric.status().slots[0].granted_ranges, 0);
    drop((win, dev0));
    EmuFabric::destroy_in(dir.path(), "regions").unwrap();
}

#[test]
fn a_revoked_region_stays_granted_to_each_peer_until_it_acknowledges() {
    let dir = TestDir::new("revoke");
    let (_fabric, mut hs) = three(&dir, "revoke");
    let mut rng = Rng(17);
    let both = hs[0]
        .t
        .register_region_for(4096, Access::ALL, &[1, 2])
        .unwrap();
    let at = window_offset(&mut hs[0], both, &mut rng);
    let w1 = hs[1].t.device().peer_window(0, 0).unwrap();
    let w2 = hs[2].t.device().peer_window(0, 0).unwrap();
    // Advertised to both (one-sided writes), so deregistering holds it.
    let end = Instant::now() + LONG;
    let free = hs[0].t.region_area_free();
    hs[0].t.deregister_region(both).unwrap();
    w1.write(at, &[1u8; 64]).unwrap();
    w2.write(at, &[2u8; 64]).unwrap();
    // Host 1 acknowledges (host 2 does not poll): its grant goes, host 2's
    // stays, and the bytes are not free yet.
    while w1.write(at, &[1u8; 64]).is_ok() {
        hs[0].pump();
        hs[1].pump();
        assert!(Instant::now() < end, "host 1 never acknowledged");
    }
    assert!(matches!(
        w1.write(at, &[1u8; 64]),
        Err(HwError::NotGranted { peer: 0, .. })
    ));
    w2.write(at, &[2u8; 64])
        .expect("host 2 has not acknowledged: still granted");
    assert_eq!(hs[0].t.region_area_free(), free);
    // Host 2 acknowledges: its grant goes too and the bytes are free.
    while hs[0].t.region_area_free() < free + 4096 {
        for h in hs.iter_mut() {
            h.pump();
        }
        assert!(Instant::now() < end, "host 2 never acknowledged");
    }
    assert!(w2.write(at, &[2u8; 64]).is_err());
    drop((w1, w2, hs));
    EmuFabric::destroy_in(dir.path(), "revoke").unwrap();
}

#[test]
fn a_full_grant_table_refuses_a_registration_cleanly() {
    let dir = TestDir::new("full");
    let (_fabric, mut hs) = three(&dir, "full");
    let free = hs[0].t.region_area_free();
    // Each region for one peer takes one entry; fill the table (regions
    // not for one-sided writes: no advertisement, no revocation hold).
    let mut keys = Vec::new();
    let err = loop {
        match hs[0].t.register_region_for(64, Access::LOCAL, &[1]) {
            Ok(k) => keys.push(k),
            Err(e) => break e,
        }
        assert!(keys.len() <= 512, "more regions than the table holds");
    };
    assert!(
        matches!(
            err,
            TransportError::Hw(HwError::GrantTableFull { capacity: 512, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("deregister regions"), "{err}");
    // Nothing of the refused region stays allocated.
    assert_eq!(hs[0].t.region_area_free(), free - 64 * keys.len() as u64);
    // One entry freed, one registration fits again.
    hs[0].t.deregister_region(keys.pop().unwrap()).unwrap();
    let k = hs[0]
        .t
        .register_region_for(64, Access::LOCAL, &[1])
        .unwrap();
    keys.push(k);
    for k in keys {
        hs[0].t.deregister_region(k).unwrap();
    }
    drop(hs);
    EmuFabric::destroy_in(dir.path(), "full").unwrap();
}

/// The dispatcher for child roles; a no-op in a normal test run.
#[test]
fn child_entry() {
    match child_role().as_deref() {
        None => {}
        Some("echo") => echo(),
        Some(r) => panic!("unknown role {r}"),
    }
}

/// A child on slot 0 (heartbeat thread on, as a real process has) that
/// echoes every message from port 1 until its transport says it lost its
/// place; then it checks that posting fails with `Lost` and says so.
fn echo() {
    let dir: String = env("ISO_DIR");
    let name: String = env("ISO_NAME");
    let fabric = EmuFabric::attach_in(std::path::Path::new(&dir), &name).expect("attach");
    let d = fabric
        .join(&DeviceConfig {
            slot: Some(0),
            dir: Some(dir.into()),
            ..Default::default()
        })
        .expect("join slot 0");
    let mut h = Host::new(
        Transport::new(Arc::new(d), Config::new(geo())).unwrap(),
        2,
        8,
    );
    // The parent stops us with SIGSTOP and resumes us with SIGCONT: the
    // handler tells us we were stopped (a long turn of the loop alone may
    // be a loaded machine).
    static CONTINUED: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_cont(_: libc::c_int) {
        CONTINUED.store(true, Ordering::Relaxed);
    }
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; no other code of this child handles SIGCONT.
    let old = unsafe {
        libc::signal(
            libc::SIGCONT,
            on_cont as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    assert_ne!(old, libc::SIG_ERR, "SIGCONT handler");
    h.t.wait_connected(1, LONG).unwrap();
    println!("READY");
    let qp = h.qp(1);
    let mut refused = None;
    let mut resumed = None;
    loop {
        // We were stopped and resumed: write at once, before polling again
        // (the rest of a poll the stop fell into may have told us already).
        if resumed.is_none() && CONTINUED.load(Ordering::Relaxed) {
            resumed = Some(match h.t.post_send(qp, b"zombie", 7) {
                Err(TransportError::Hw(HwError::SlotLost { port: 0 })) => "SlotLost",
                Err(TransportError::Lost) => "Lost",
                Ok(()) => "accepted",
                Err(_) => "other",
            });
        }
        if h.t.peer_state(1) == PeerState::Lost {
            let post = h.t.post_send(qp, b"zombie", 7);
            let post = matches!(post, Err(TransportError::Lost));
            let first = resumed.unwrap_or("none");
            println!("LOST post_refused={post} first_after_resume={first} earlier={refused:?}");
            return;
        }
        h.pump();
        while let Some(m) = h.inbox.get_mut(&1).and_then(|q| q.pop_front()) {
            match h.t.post_send(qp, &m, 0) {
                Ok(()) => {}
                // The first write after the resume may find the place gone
                // before a poll has said so.
                Err(e) => refused = Some(e.to_string()),
            }
        }
    }
}

#[test]
fn a_stopped_process_is_dropped_and_told_so_when_resumed() {
    let dir = TestDir::new("sigstop");
    let fc = FabricConfig {
        slots: 2,
        window_size: 1 << 20,
        heartbeat_timeout: DEATH_TEST_HEARTBEAT,
        ..Default::default()
    };
    let fabric = EmuFabric::create_in(dir.path(), "sigstop", &fc).unwrap();
    let join = |slot: Port| {
        let d = fabric
            .join(&DeviceConfig {
                slot: Some(slot),
                dir: Some(dir.path().to_owned()),
                ..Default::default()
            })
            .expect("join");
        Arc::new(d)
    };
    let mut b = Host::new(Transport::new(join(1), Config::new(geo())).unwrap(), 2, 8);
    let env = [
        ("ISO_DIR", dir.path().display().to_string()),
        ("ISO_NAME", "sigstop".to_owned()),
    ];
    let mut child = RoleChild::spawn("child_entry", "echo", &env);
    let end = Instant::now() + LONG;
    while !b.t.is_connected(0) {
        b.pump();
        assert!(Instant::now() < end, "the child never connected");
    }
    child.expect_line("READY", LONG);
    // The child echoes: every byte comes back.
    for i in 0..20u8 {
        let m = vec![i ^ 0x5a; 24 + 7 * i as usize];
        b.send(0, &m);
        assert_eq!(b.recv(0, LONG), m, "echo {i}");
    }

    // Stop it (all its threads, its heartbeat too): B declares it dead and
    // slot 0 is freed.
    // SAFETY: a signal to our own child's pid.
    assert_eq!(unsafe { libc::kill(child.pid() as i32, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    while b.t.peer_state(0) == PeerState::Connected
        || fabric.status().slots[0].state != SlotState::Free
    {
        b.pump();
        assert!(
            Instant::now() < stopped + LONG,
            "the stopped child was never dropped"
        );
    }
    assert!(
        stopped.elapsed() <= death_bound(fc.heartbeat_timeout),
        "the stopped child was dropped after {:?}",
        stopped.elapsed()
    );
    // C takes slot 0 in this process and talks to B.
    let mut c = Host::new(Transport::new(join(0), Config::new(geo())).unwrap(), 2, 8);
    connect(&mut c, &mut b, 0, 1);
    b.repost_all(0);
    exchange(&mut c, &mut b, 0, 1, 20, 0x70);
    let before = connection_of(&mut b);

    // Resume it while C and B keep talking: it learns it was dropped and
    // posts nothing; C and B see nothing of it.
    // SAFETY: a signal to our own child's pid.
    assert_eq!(unsafe { libc::kill(child.pid() as i32, libc::SIGCONT) }, 0);
    exchange(&mut c, &mut b, 0, 1, 30, 0x71);
    let said = child.expect_line("LOST", LONG);
    assert!(
        said.starts_with("post_refused=true"),
        "the child said: {said}"
    );
    // Its first write after the resume was refused: by its device's
    // tenure check, or by the transport if the poll the stop fell into
    // had told it already.
    assert!(
        ["SlotLost", "Lost"]
            .iter()
            .any(|w| said.contains(&format!("first_after_resume={w} "))),
        "the child said: {said}"
    );
    assert!(child.wait_success(LONG), "the child failed");
    assert_undisturbed(&mut c, &mut b, before, 0x72);
    assert_eq!(fabric.status().slots[0].owner_pid, Some(std::process::id()));
    drop((b, c, child));
    EmuFabric::destroy_in(dir.path(), "sigstop").unwrap();
}

/// A chain multicast 0 → 2 (a rogue) → 1 whose first link answers with
/// storage that host 0 may not write (memory of the rogue's not granted
/// to it): the put's copy is refused, the multicast fails, and every link
/// is cancelled. Host 1 then takes the rogue's claim that it forwarded the
/// data as the end of its storage's use: it delivers nothing, acknowledges
/// nothing, and counts nothing against anyone.
#[test]
fn a_chain_whose_put_is_refused_is_cancelled_down_the_chain() {
    use ntbdk_pmd::transport::inject::{Injector, first_op_id};
    use ntbdk_pmd::transport::wire::{self, Msg, SGES_PER_MSG, WireSge};
    use ntbdk_pmd::transport::{MulticastMode, OpKind, Ring, epoch};

    let dir = TestDir::new("putcancel");
    let (_fabric, mut hs) = three(&dir, "putcancel");
    // From here on, host 2 acts only through injectors.
    let rogue = hs.pop().unwrap();
    let inject = |victim: &Host| {
        let e = epoch(rogue.t.incarnation(), victim.t.incarnation());
        Injector::new(&**rogue.t.device(), victim.t.port(), *victim.t.layout(), e).unwrap()
    };
    let (mut to0, mut to1) = (inject(&hs[0]), inject(&hs[1]));
    let len = 16_384u32;
    let src = hs[0]
        .t
        .register_region(len as usize, Access::LOCAL)
        .unwrap();
    let qps = [hs[0].qp(2), hs[0].qp(1)];
    let sge = [Sge {
        key: src,
        offset: 0,
        len: len.into(),
    }];
    hs[0]
        .t
        .post_multicast_put_with(&qps, &sge, MulticastMode::Chain, 4)
        .unwrap();
    let op = first_op_id(hs[0].t.incarnation());
    let q10 = hs[1].qp(0);
    let end = Instant::now() + LONG;
    while hs[1].t.resources(q10).serving == 0 {
        hs[0].pump();
        hs[1].pump();
        assert!(Instant::now() < end, "host 1 did not serve the chain");
    }
    // The rogue's "storage": the start of its region area, where it
    // registered nothing for host 0.
    let mut sges = [WireSge::default(); SGES_PER_MSG];
    sges[0] = WireSge {
        offset: rogue.t.layout().region_area_start() as u64,
        len,
    };
    let answer = Msg::Sgl {
        op,
        start: 0,
        n: 1,
        sges,
    };
    to0.push(Ring::Tx, &wire::encode(&answer)).unwrap();
    let refused = hs[0].t.device().counters().ungranted_writes;
    let end = Instant::now() + LONG;
    let failed = loop {
        hs[0].pump();
        hs[1].pump();
        if let Some(c) = hs[0].done.remove(&4) {
            break c;
        }
        assert!(Instant::now() < end, "the multicast never completed");
    };
    assert_eq!(failed.op, OpKind::MulticastPut);
    assert!(!failed.status.is_ok(), "{failed:?}");
    assert!(
        hs[0].t.device().counters().ungranted_writes > refused,
        "the put was not refused by the device"
    );
    // The rogue says it forwarded the data into host 1's storage.
    let done = Msg::ChainDone { op, origin: 0, len };
    to1.push(Ring::Cq, &wire::encode(&done)).unwrap();
    let end = Instant::now() + LONG;
    while hs[1].t.resources(q10).serving > 0 {
        hs[0].pump();
        hs[1].pump();
        assert!(Instant::now() < end, "host 1 still holds its storage");
    }
    for _ in 0..100 {
        hs[0].pump();
        hs[1].pump();
    }
    assert!(hs[1].mc.is_empty(), "delivered: {:?}", hs[1].mc);
    let q12 = hs[1].qp(2);
    assert_eq!(hs[1].t.counters(q12).dropped_total(), 0);
    assert_eq!(hs[1].t.counters(q10).dropped_total(), 0);
    assert!(hs[1].t.is_connected(0) && hs[1].t.is_connected(2));
    let (h0, rest) = hs.split_at_mut(1);
    exchange(&mut h0[0], &mut rest[0], 0, 1, 20, 0x60);
    drop(hs);
    drop(rogue);
    EmuFabric::destroy_in(dir.path(), "putcancel").unwrap();
}

/// On a fabric whose devices keep grant tables, storage requests a peer
/// never finishes take one entry each (the storage is granted to it): past
/// its share (half the table split among the connected peers) they are
/// refused, so the application can still register regions and the other
/// peers still get storage. Before, 512 such requests filled the table.
#[test]
fn unfinished_storage_requests_cannot_fill_the_grant_table() {
    use ntbdk_pmd::transport::inject::Injector;
    use ntbdk_pmd::transport::wire::{self, Msg};
    use ntbdk_pmd::transport::{Ring, epoch};
    let dir = TestDir::new("grant-share");
    let (_fabric, mut hs) = three(&dir, "grant-share");
    let rogue_dev = hs[2].t.device().clone();
    let e = epoch(hs[2].t.incarnation(), hs[1].t.incarnation());
    let mut inj = Injector::new(&*rogue_dev, 1, *hs[1].t.layout(), e).unwrap();
    let q = hs[1].t.create_qp(2).unwrap();
    // Host 2 stops polling; what it does now goes through the injector.
    let share = 512 / 2 / 2;
    for op in 1..=520u64 {
        inj.push(Ring::Rx, &wire::encode(&Msg::Rts { op, len: 1 }))
            .unwrap();
        hs[1].t.progress();
    }
    assert_eq!(hs[1].t.resources(q).serving, share);
    assert_eq!(
        hs[1].t.counters(q).dropped(DropKind::Overload),
        520 - share as u64
    );
    let k = hs[1]
        .t
        .register_region_for(4096, Access::REMOTE_WRITE, &[0]);
    assert!(k.is_ok(), "{k:?}");
    // Host 0 still writes into it.
    let k = k.unwrap();
    assert_eq!(write(&mut hs[..2], 0, 1, k, &[0x42; 4096]), Status::Success);
}
