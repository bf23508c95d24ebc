//! The transport between real processes on the emulated fabric: the full
//! workload with every byte verified, zero non-posted reads, peer death by
//! SIGKILL and reconnect, 64 hosts all-to-all (past the 32-entry R-LUT), and
//! the device-layer proof that 64 concurrent non-posted readers would not fit.

mod transport_common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};
use ntbdk_pmd::hw::{HwError, NtbDevice, Port};
use ntbdk_pmd::transport::{
    Access, Config, Geometry, MulticastMode, OpKind, PeerState, RegionKey, RemoteAddr, Sge, Status,
    Transport,
};
use transport_common::{Host, Rng, RoleChild, TestDir, child_role, death_bound, env, fnv};

const LONG: Duration = Duration::from_secs(30);

/// The tests of this file spin several processes each; on a small machine
/// running them one at a time keeps heartbeats fresh and timings sane.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn geo(ports: u16) -> Geometry {
    Geometry {
        ports,
        queue_depth: 64,
        eager_count: 32,
        eager_size: 4096,
        data: ntbdk_pmd::transport::DataQueues::NONE,
    }
}

fn fabric_cfg(slots: usize, window: usize, timeout: Duration) -> FabricConfig {
    FabricConfig {
        slots,
        window_size: window,
        heartbeat_timeout: timeout,
        ..Default::default()
    }
}

fn join(fabric: &EmuFabric, slot: Port) -> EmuDevice {
    fabric
        .join(&DeviceConfig {
            slot: Some(slot),
            ..Default::default()
        })
        .expect("join the fabric")
}

fn child_fabric() -> EmuFabric {
    let dir: String = env("XPORT_DIR");
    let name: String = env("XPORT_NAME");
    EmuFabric::attach_in(std::path::Path::new(&dir), &name).expect("child attaches")
}

fn spawn(dir: &TestDir, name: &str, role: &str, extra: &[(&str, String)]) -> RoleChild {
    let mut e = vec![
        ("XPORT_DIR", dir.0.display().to_string()),
        ("XPORT_NAME", name.to_owned()),
    ];
    e.extend(extra.iter().cloned());
    RoleChild::spawn("child_entry", role, &e)
}

/// The dispatcher for child roles; a no-op in a normal test run.
#[test]
fn child_entry() {
    match child_role().as_deref() {
        None => {}
        Some("server") => server(),
        Some("mesh") => mesh(),
        Some(r) => panic!("unknown role {r}"),
    }
}

// ---- the server child: exposes a region, answers commands from port 0 ----

fn server() {
    let fabric = child_fabric();
    let slot: Port = env("XPORT_SLOT");
    let ports: u16 = env("XPORT_PORTS");
    let r_len: usize = env("XPORT_RLEN");
    let dev = Arc::new(join(&fabric, slot));
    let t = Transport::new(dev.clone(), Config::new(geo(ports))).unwrap();
    let mut h = Host::new(t, ports, 8);
    let r =
        h.t.register_region_scattered(r_len, Access::ALL, 64 << 10)
            .unwrap();
    h.t.wait_connected(0, LONG).unwrap();
    let mut k = vec![b'K'];
    k.extend_from_slice(&r.0.to_le_bytes());
    h.send(0, &k);
    let mut lost_since: Option<Instant> = None;
    loop {
        h.pump();
        while let Some(c) = h.mc.pop_front() {
            let region = c.region.unwrap();
            let mut v = vec![0u8; c.bytes as usize];
            h.t.region_read(region, 0, &mut v).unwrap();
            h.t.deregister_region(region).unwrap();
            let mut m = vec![b'M'];
            m.extend_from_slice(&fnv(&v).to_le_bytes());
            m.extend_from_slice(&c.bytes.to_le_bytes());
            h.send(0, &m);
        }
        if let Some(m) = h.inbox.get_mut(&0).and_then(|q| q.pop_front()) {
            let u64_at = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().unwrap());
            match m[0] {
                b'S' => {
                    let (off, len) = (u64_at(1), u64_at(9));
                    let mut v = vec![0u8; len as usize];
                    h.t.region_read(r, off, &mut v).unwrap();
                    let mut a = vec![b'H'];
                    a.extend_from_slice(&fnv(&v).to_le_bytes());
                    h.send(0, &a);
                }
                b'E' => {
                    let mut a = m.clone();
                    a[0] = b'e';
                    h.send(0, &a);
                }
                b'P' => std::thread::sleep(Duration::from_millis(u64_at(1))),
                b'B' => {
                    let mut a = vec![b'N'];
                    a.extend_from_slice(&dev.counters().non_posted_reads.to_le_bytes());
                    h.send(0, &a);
                    let end = Instant::now() + Duration::from_millis(200);
                    while Instant::now() < end {
                        h.pump();
                    }
                    return;
                }
                other => panic!("unknown command {other}"),
            }
        }
        if h.t.peer_state(0) != PeerState::Connected {
            let since = *lost_since.get_or_insert_with(Instant::now);
            assert!(since.elapsed() < Duration::from_secs(10), "lost the parent");
        } else {
            lost_since = None;
        }
    }
}

fn key_of(m: &[u8]) -> RegionKey {
    assert_eq!(m[0], b'K', "expected a key message");
    RegionKey(u32::from_le_bytes(m[1..5].try_into().unwrap()))
}

fn sges(rng: &mut Rng, key: RegionKey, len: u64) -> Vec<Sge> {
    let mut off = 0;
    rng.split(len, 8)
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

fn random_len(rng: &mut Rng, max: u64) -> u64 {
    let bits = rng.below(24) + 1;
    (1 + rng.below(1 << bits)).min(max)
}

fn remote_sum(h: &mut Host, p: Port, off: u64, len: u64) -> u64 {
    let mut m = vec![b'S'];
    m.extend_from_slice(&off.to_le_bytes());
    m.extend_from_slice(&len.to_le_bytes());
    h.send(p, &m);
    let a = h.recv(p, LONG);
    assert_eq!(a[0], b'H');
    u64::from_le_bytes(a[1..9].try_into().unwrap())
}

fn bye(h: &mut Host, p: Port) -> u64 {
    h.send(p, b"B");
    let a = h.recv(p, LONG);
    assert_eq!(a[0], b'N');
    u64::from_le_bytes(a[1..9].try_into().unwrap())
}

#[test]
fn workload_between_processes_every_byte_verified() {
    let _serial = serial();
    const MAX: u64 = 8 << 20;
    let r_len = MAX + (64 << 10);
    let dir = TestDir::new("workload");
    let fabric = EmuFabric::create_in(
        &dir.0,
        "wl",
        &fabric_cfg(3, 40 << 20, Duration::from_millis(500)),
    )
    .unwrap();
    let dev = Arc::new(join(&fabric, 0));
    let mut kids: Vec<RoleChild> = (1..3)
        .map(|s| {
            spawn(
                &dir,
                "wl",
                "server",
                &[
                    ("XPORT_SLOT", s.to_string()),
                    ("XPORT_PORTS", "3".into()),
                    ("XPORT_RLEN", r_len.to_string()),
                ],
            )
        })
        .collect();
    let t = Transport::new(dev.clone(), Config::new(geo(3))).unwrap();
    let mut h = Host::new(t, 3, 8);
    let keys = [
        RegionKey(0),
        key_of(&h.recv(1, LONG)),
        key_of(&h.recv(2, LONG)),
    ];
    let mut rng = Rng(0xfeed_beef);
    let mut cookie = 0u64;
    // Write, read (known size), read (unknown size), with random sizes and
    // random fragmentation on both sides.
    for round in 0..14 {
        let p: Port = 1 + (round % 2) as Port;
        let qp = h.qp(p);
        let len = if round < 2 {
            MAX
        } else {
            random_len(&mut rng, MAX)
        };
        let off = rng.below(64 << 10);
        let mut data = vec![0u8; len as usize];
        rng.fill(&mut data);
        let ext = 4096 * (1 + rng.below(256)) as usize;
        let src =
            h.t.register_region_scattered(len as usize, Access::LOCAL, ext)
                .unwrap();
        h.t.region_write(src, 0, &data).unwrap();
        cookie += 1;
        let s = sges(&mut rng, src, len);
        h.t.post_write(
            qp,
            &s,
            RemoteAddr {
                key: keys[p as usize],
                offset: off,
            },
            cookie,
        )
        .unwrap();
        let c = h.wait(cookie, LONG);
        assert_eq!(
            (c.op, c.status, c.bytes),
            (OpKind::Write, Status::Success, len),
            "round {round}"
        );
        assert_eq!(
            remote_sum(&mut h, p, off, len),
            fnv(&data),
            "round {round}: the target's bytes differ"
        );
        let into =
            h.t.register_region_scattered(len as usize, Access::LOCAL, ext)
                .unwrap();
        cookie += 1;
        let s = sges(&mut rng, into, len);
        h.t.post_read(
            qp,
            &s,
            RemoteAddr {
                key: keys[p as usize],
                offset: off,
            },
            cookie,
        )
        .unwrap();
        let c = h.wait(cookie, LONG);
        assert_eq!(
            (c.op, c.status, c.bytes),
            (OpKind::Read, Status::Success, len)
        );
        let mut back = vec![0u8; len as usize];
        h.t.region_read(into, 0, &mut back).unwrap();
        assert!(back == data, "round {round}: read bytes differ");
        cookie += 1;
        h.t.post_read_unknown(
            qp,
            RemoteAddr {
                key: keys[p as usize],
                offset: off,
            },
            16 << 20,
            cookie,
        )
        .unwrap();
        let c = h.wait(cookie, LONG);
        assert_eq!(
            (c.op, c.status, c.bytes),
            (OpKind::ReadUnknown, Status::Success, r_len - off)
        );
        let got = c.region.unwrap();
        h.t.region_read(got, 0, &mut back).unwrap();
        assert!(
            back == data,
            "round {round}: unknown-size read bytes differ"
        );
        for k in [src, into, got] {
            h.t.deregister_region(k).unwrap();
        }
    }
    // Send/recv: echoes of random sizes, in bursts, in order per peer.
    let eager = 4096u64;
    for burst in 0..20 {
        let msgs: Vec<Vec<u8>> = (0..16)
            .map(|_| {
                let mut m = vec![0u8; 1 + rng.below(eager - 1) as usize];
                rng.fill(&mut m);
                m[0] = b'E';
                m
            })
            .collect();
        let p: Port = 1 + (burst % 2) as Port;
        let qp = h.qp(p);
        let wrs: Vec<_> = msgs
            .iter()
            .map(|m| ntbdk_pmd::transport::SendWr {
                data: m,
                cookie: 0,
                signaled: true,
            })
            .collect();
        let mut sent = 0;
        let end = Instant::now() + LONG;
        while sent < wrs.len() {
            match h.t.post_sends(qp, &wrs[sent..]) {
                Ok(n) => sent += n,
                Err(ntbdk_pmd::transport::TransportError::Busy { .. }) => h.pump(),
                Err(e) => panic!("{e}"),
            }
            assert!(Instant::now() < end);
        }
        for m in &msgs {
            let a = h.recv(p, LONG);
            assert_eq!(a[0], b'e');
            assert_eq!(a[1..], m[1..], "echo differs");
        }
    }
    // Multicast put to both children.
    let targets = [h.qp(1), h.qp(2)];
    for round in 0..5 {
        let len = if round == 0 {
            MAX
        } else {
            random_len(&mut rng, MAX)
        };
        let mut data = vec![0u8; len as usize];
        rng.fill(&mut data);
        let src =
            h.t.register_region_scattered(len as usize, Access::LOCAL, 1 << 20)
                .unwrap();
        h.t.region_write(src, 0, &data).unwrap();
        cookie += 1;
        let s = sges(&mut rng, src, len);
        // Fan-out, and store-and-forward down the chain [2, 1] every other round.
        if round % 2 == 0 {
            h.t.post_multicast_put(&targets, &s, cookie).unwrap();
        } else {
            let chain = [targets[1], targets[0]];
            h.t.post_multicast_put_with(&chain, &s, MulticastMode::Chain, cookie)
                .unwrap();
        }
        let c = h.wait(cookie, LONG);
        assert_eq!(
            (c.op, c.status, c.bytes),
            (OpKind::MulticastPut, Status::Success, len)
        );
        for p in 1..3 {
            let a = h.recv(p, LONG);
            assert_eq!(a[0], b'M');
            assert_eq!(u64::from_le_bytes(a[9..17].try_into().unwrap()), len);
            assert_eq!(
                u64::from_le_bytes(a[1..9].try_into().unwrap()),
                fnv(&data),
                "multicast to {p} differs"
            );
        }
        h.t.deregister_region(src).unwrap();
    }
    // Posted writes only, on every host.
    for p in 1..3 {
        assert_eq!(bye(&mut h, p), 0, "port {p} issued non-posted reads");
    }
    let snap = dev.counters();
    assert_eq!(snap.non_posted_reads, 0);
    assert!(snap.posted_writes > 0, "{snap:?}");
    eprintln!("parent device counters after the workload: {snap:?}");
    for k in &mut kids {
        assert!(k.wait_success(LONG));
    }
    assert_eq!(h.t.outstanding(), 0);
    assert!(
        h.done.is_empty(),
        "completions nobody waited for: {:?}",
        h.done
    );
    for p in 1..3 {
        let qp = h.qp(p);
        let c = h.t.counters(qp);
        assert_eq!((c.failed_ops, c.dropped_total()), (0, 0), "{c:?}");
    }
}

/// The heartbeat timeout of the peer-death test: long enough that a
/// member whose heartbeat thread a loaded two-core machine holds off a
/// while (three processes spin here) is not taken for dead.
const HEARTBEAT: Duration = Duration::from_secs(1);

#[test]
fn peer_death_mid_transfer_fails_its_operations_and_it_can_reconnect() {
    let _serial = serial();
    let r_len: u64 = 4 << 20;
    let dir = TestDir::new("death");
    let fabric =
        EmuFabric::create_in(&dir.0, "death", &fabric_cfg(3, 24 << 20, HEARTBEAT)).unwrap();
    let dev = Arc::new(join(&fabric, 0));
    let server_env = |s: Port| {
        vec![
            ("XPORT_SLOT", s.to_string()),
            ("XPORT_PORTS", "3".into()),
            ("XPORT_RLEN", r_len.to_string()),
        ]
    };
    let mut victim = spawn(&dir, "death", "server", &server_env(1));
    let mut healthy = spawn(&dir, "death", "server", &server_env(2));
    let t = Transport::new(dev.clone(), Config::new(geo(3))).unwrap();
    let mut h = Host::new(t, 3, 8);
    let k1 = key_of(&h.recv(1, LONG));
    let _k2 = key_of(&h.recv(2, LONG));
    let (q1, q2) = (h.qp(1), h.qp(2));
    let free0 = h.t.region_area_free();
    let src = h.t.register_region(r_len as usize, Access::LOCAL).unwrap();
    let dst = h.t.register_region(r_len as usize, Access::LOCAL).unwrap();
    // The victim stops progressing (it sleeps), with work outstanding.
    let mut pause = vec![b'P'];
    pause.extend_from_slice(&5000u64.to_le_bytes());
    h.send(1, &pause);
    let whole = [Sge {
        key: src,
        offset: 0,
        len: r_len,
    }];
    for c in 1..=6 {
        h.t.post_write(q1, &whole, RemoteAddr { key: k1, offset: 0 }, c)
            .unwrap();
    }
    h.t.post_read(
        q1,
        &[Sge {
            key: dst,
            offset: 0,
            len: r_len,
        }],
        RemoteAddr { key: k1, offset: 0 },
        7,
    )
    .unwrap();
    h.t.post_read_unknown(q1, RemoteAddr { key: k1, offset: 0 }, 1 << 30, 8)
        .unwrap();
    h.t.post_multicast_put(&[q1, q2], &whole, 9).unwrap();
    let echo = |h: &mut Host, i: u64| {
        let mut m = vec![b'E'];
        m.extend_from_slice(&i.to_le_bytes());
        h.send(2, &m);
        // (Skip the report of the multicast that reached this peer.)
        let a = loop {
            let a = h.recv(2, LONG);
            if a[0] != b'M' {
                break a;
            }
        };
        assert_eq!(a[0], b'e');
        assert_eq!(a[1..], m[1..]);
    };
    for i in 0..20 {
        echo(&mut h, i);
    }
    let outstanding = h.t.resources(q1).outstanding;
    assert!(
        outstanding >= 2,
        "work should be outstanding with the sleeping peer ({outstanding})"
    );
    let killed = Instant::now();
    victim.sigkill();
    let mut statuses = Vec::new();
    for c in 1..=9 {
        let end = killed + Duration::from_secs(5);
        let done = loop {
            if let Some(d) = h.done.remove(&c) {
                break d;
            }
            h.pump();
            assert!(
                Instant::now() < end,
                "op {c} did not complete within 5 s of the peer's death"
            );
        };
        statuses.push(done.status);
    }
    let detected = killed.elapsed();
    eprintln!("peer death detected and its operations failed within {detected:?}");
    assert!(
        detected <= death_bound(HEARTBEAT),
        "the dead peer's operations failed {detected:?} after its death, beyond {:?} for a {HEARTBEAT:?} heartbeat timeout",
        death_bound(HEARTBEAT)
    );
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, Status::Success | Status::PeerDown)),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().filter(|s| **s == Status::PeerDown).count() >= outstanding.min(9) - 1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses[8],
        Status::PeerDown,
        "the multicast included the dead peer"
    );
    // Traffic with the other peer continues.
    for i in 100..120 {
        echo(&mut h, i);
    }
    assert_eq!(h.t.outstanding(), 0);
    assert_eq!(h.t.resources(q1).outstanding, 0);
    h.t.deregister_region(src).unwrap();
    h.t.deregister_region(dst).unwrap();
    assert_eq!(
        h.t.region_area_free(),
        free0,
        "regions allocated for the dead peer's operations were freed"
    );
    drop(victim);
    // The peer comes back (a new process in the same slot) and reconnects.
    let mut victim = spawn(&dir, "death", "server", &server_env(1));
    h.repost_all(1);
    let k1 = key_of(&h.recv(1, LONG));
    let end = Instant::now() + Duration::from_secs(5);
    while h.t.resources(q1).eager_free != 32 {
        h.pump();
        assert!(
            Instant::now() < end,
            "eager buffers did not return: {:?}",
            h.t.resources(q1)
        );
    }
    let r = h.t.resources(q1);
    assert_eq!((r.backlog, r.outstanding, r.serving), (0, 0, 0));
    let src = h.t.register_region(1 << 20, Access::LOCAL).unwrap();
    let mut data = vec![0u8; 1 << 20];
    Rng(5).fill(&mut data);
    h.t.region_write(src, 0, &data).unwrap();
    h.t.post_write(
        q1,
        &[Sge {
            key: src,
            offset: 0,
            len: 1 << 20,
        }],
        RemoteAddr { key: k1, offset: 0 },
        50,
    )
    .unwrap();
    assert_eq!(h.wait(50, LONG).status, Status::Success);
    assert_eq!(remote_sum(&mut h, 1, 0, 1 << 20), fnv(&data));
    assert_eq!(h.t.counters(q1).connects, 2);
    for p in 1..3 {
        assert_eq!(bye(&mut h, p), 0);
    }
    assert!(victim.wait_success(LONG) && healthy.wait_success(LONG));
    assert_eq!(dev.counters().non_posted_reads, 0);
}

// ---- 64 hosts, all to all ----

const MESH_PORTS: u16 = 64;
const MESH_PROCS: u16 = 4;
const CHUNK: usize = 1024;

fn pattern(from: Port, to: Port, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(u64::from(from) * 131 + u64::from(to) * 7)
        .rotate_right(11) as u8
}

fn mesh() {
    let fabric = child_fabric();
    let base: Port = env("XPORT_BASE");
    let per = MESH_PORTS / MESH_PROCS;
    struct M {
        h: Host,
        dev: Arc<EmuDevice>,
        data: RegionKey,
        src: RegionKey,
        keys: Vec<Option<RegionKey>>,
        key_sent: Vec<bool>,
        posted: Vec<bool>,
        written: usize,
        done_from: usize,
    }
    let mut ms: Vec<M> = (base..base + per)
        .map(|slot| {
            let dev = Arc::new(join(&fabric, slot));
            let t = Transport::new(dev.clone(), Config::new(Geometry::small(MESH_PORTS))).unwrap();
            let mut h = Host::new(t, MESH_PORTS, 2);
            let data =
                h.t.register_region(CHUNK * MESH_PORTS as usize, Access::ALL)
                    .unwrap();
            let src =
                h.t.register_region(CHUNK * MESH_PORTS as usize, Access::LOCAL)
                    .unwrap();
            for p in 0..MESH_PORTS {
                let v: Vec<u8> = (0..CHUNK).map(|i| pattern(slot, p, i)).collect();
                h.t.region_write(src, p as u64 * CHUNK as u64, &v).unwrap();
            }
            let n = MESH_PORTS as usize;
            M {
                h,
                dev,
                data,
                src,
                keys: vec![None; n],
                key_sent: vec![false; n],
                posted: vec![false; n],
                written: 0,
                done_from: 0,
            }
        })
        .collect();
    let others = MESH_PORTS as usize - 1;
    let end = Instant::now() + Duration::from_secs(90);
    while ms
        .iter()
        .any(|m| m.written < others || m.done_from < others)
    {
        assert!(
            Instant::now() < end,
            "mesh did not finish: {:?}",
            ms.iter()
                .map(|m| (m.h.t.port(), m.written, m.done_from))
                .collect::<Vec<_>>()
        );
        for m in ms.iter_mut() {
            m.h.pump();
            let me = m.h.t.port();
            for p in 0..MESH_PORTS {
                if p == me || !m.h.t.is_connected(p) {
                    continue;
                }
                let pi = p as usize;
                if !m.key_sent[pi] {
                    let mut k = vec![b'K'];
                    k.extend_from_slice(&m.data.0.to_le_bytes());
                    let qp = m.h.qp(p);
                    if m.h.t.post_send(qp, &k, 0).is_ok() {
                        m.key_sent[pi] = true;
                    }
                }
                while let Some(msg) = m.h.inbox.get_mut(&p).and_then(|q| q.pop_front()) {
                    match msg[0] {
                        b'K' => m.keys[pi] = Some(key_of(&msg)),
                        b'D' => m.done_from += 1,
                        x => panic!("unexpected {x}"),
                    }
                }
                if let (Some(k), false) = (m.keys[pi], m.posted[pi]) {
                    let qp = m.h.qp(p);
                    let sge = [Sge {
                        key: m.src,
                        offset: p as u64 * CHUNK as u64,
                        len: CHUNK as u64,
                    }];
                    m.h.t
                        .post_write(
                            qp,
                            &sge,
                            RemoteAddr {
                                key: k,
                                offset: me as u64 * CHUNK as u64,
                            },
                            u64::from(p),
                        )
                        .unwrap();
                    m.posted[pi] = true;
                }
                if let Some(c) = m.h.done.remove(&u64::from(p)) {
                    assert_eq!(c.status, Status::Success, "write {me} -> {p}");
                    m.written += 1;
                    let qp = m.h.qp(p);
                    let end = Instant::now() + LONG;
                    while m.h.t.post_send(qp, b"D", 0).is_err() {
                        m.h.pump();
                        assert!(Instant::now() < end);
                    }
                }
            }
        }
    }
    for m in &mut ms {
        let me = m.h.t.port();
        for s in 0..MESH_PORTS {
            if s == me {
                continue;
            }
            let mut v = vec![0u8; CHUNK];
            m.h.t
                .region_read(m.data, s as u64 * CHUNK as u64, &mut v)
                .unwrap();
            assert!(
                v.iter().enumerate().all(|(i, &b)| b == pattern(s, me, i)),
                "bytes from {s} at {me} differ"
            );
        }
        assert_eq!(m.dev.counters().non_posted_reads, 0);
    }
    println!("MESH-OK {}", ms.len());
    // Keep serving until every process is done (peers may still wait for
    // our "done" messages): the parent says so with a file.
    let finish = finish_file(std::path::Path::new(&env::<String>("XPORT_DIR")));
    let end = Instant::now() + Duration::from_secs(60);
    while !finish.exists() {
        assert!(Instant::now() < end, "the parent never said finish");
        for m in ms.iter_mut() {
            m.h.pump();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Then each host checks its books and leaves; the parent checks that
    // this process exits successfully.
    for m in &mut ms {
        let me = m.h.t.port();
        assert_eq!(m.h.t.outstanding(), 0, "host {me}");
        for p in (0..MESH_PORTS).filter(|&p| p != me) {
            let qp = m.h.qp(p);
            let c = m.h.t.counters(qp);
            assert_eq!(
                (c.writes, c.failed_ops, c.dropped_total()),
                (1, 0, 0),
                "host {me}, peer {p}: {c:?}"
            );
        }
        assert!(m.h.done.is_empty(), "host {me}: {:?}", m.h.done);
    }
}

/// The file by which the parent tells the mesh children to finish.
fn finish_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("mesh.finish")
}

#[test]
fn sixty_four_hosts_exchange_all_to_all() {
    let _serial = serial();
    let dir = TestDir::new("mesh");
    let fabric = EmuFabric::create_in(
        &dir.0,
        "mesh",
        &fabric_cfg(MESH_PORTS as usize, 1 << 20, Duration::from_secs(2)),
    )
    .unwrap();
    let mut kids: Vec<RoleChild> = (0..MESH_PROCS)
        .map(|i| {
            spawn(
                &dir,
                "mesh",
                "mesh",
                &[("XPORT_BASE", (i * MESH_PORTS / MESH_PROCS).to_string())],
            )
        })
        .collect();
    for k in &mut kids {
        let n = k.expect_line("MESH-OK", Duration::from_secs(100));
        assert_eq!(n, (MESH_PORTS / MESH_PROCS).to_string());
    }
    // Every child ends its hosts, checks them and exits; a panic after
    // MESH-OK fails the test here.
    std::fs::write(finish_file(&dir.0), b"").unwrap();
    for (i, k) in kids.iter_mut().enumerate() {
        assert!(
            k.wait_success(LONG),
            "mesh child {i} failed after MESH-OK: {:?}",
            k.child.try_wait()
        );
    }
    assert!(MESH_PORTS as usize > fabric.config().rlut_entries);
}

#[test]
fn sixty_four_concurrent_non_posted_readers_exhaust_the_rlut() {
    let _serial = serial();
    // The reason the transport never reads: each in-flight non-posted read
    // holds an R-LUT entry at the target, and there are only 32.
    let dir = TestDir::new("rlut");
    let cfg = fabric_cfg(65, 64 << 10, Duration::from_secs(30));
    let fabric = EmuFabric::create_in(&dir.0, "rlut", &cfg).unwrap();
    let _target = join(&fabric, 0);
    let readers: Vec<Arc<EmuDevice>> = (1..65)
        .map(|s| {
            let c = DeviceConfig {
                slot: Some(s),
                heartbeat_thread: false,
                // Long enough that all 64 readers are in flight at once,
                // however a loaded machine schedules their threads.
                read_latency: Some(Duration::from_secs(1)),
                ..Default::default()
            };
            Arc::new(fabric.join(&c).unwrap())
        })
        .collect();
    let barrier = Arc::new(Barrier::new(64));
    let threads: Vec<_> = readers
        .iter()
        .map(|d| {
            let (d, b) = (d.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                b.wait();
                d.non_posted_read(0, 0, 0, &mut buf)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(HwError::RlutExhausted { .. })))
        .count();
    assert_eq!(ok + refused, 64, "{results:?}");
    assert!(ok <= cfg.rlut_entries, "{ok} reads held entries at once");
    assert!(refused >= 64 - cfg.rlut_entries, "only {refused} refusals");
    let refusals: u64 = readers.iter().map(|d| d.counters().rlut_refusals).sum();
    assert_eq!(refusals, refused as u64);
    // Posted writes from all 64 at once need no entry.
    for d in &readers {
        d.peer_window(0, 0)
            .unwrap()
            .write(d.port() as usize * 64, &[1u8; 64])
            .unwrap();
    }
}
