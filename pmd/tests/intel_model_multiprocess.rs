//! The Intel NTB backend between two processes: each runs `IntelNtb` over
//! its own register model, both models over one memfd (the parent's,
//! opened by the child as `/proc/<pid>/fd/<fd>`). The transport's writes
//! and sends are verified byte by byte (hashes), no non-posted read is
//! made, the write-combined apertures fence every publication, and a peer
//! killed with SIGKILL is declared down by its heartbeat and, restarted, is
//! a new generation that reconnects.

mod transport_common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::intel::model::{IntelNtbModel, ModelMemory};
use ntbdk_pmd::hw::intel::{B2bSide, IntelConfig, IntelPart};
use ntbdk_pmd::transport::{
    Access, Config, Geometry, PeerState, RegionKey, RemoteAddr, Sge, Status, Transport,
};
use transport_common::{Host, Rng, RoleChild, child_role, death_bound, fnv};

const LONG: Duration = Duration::from_secs(30);
const RLEN: usize = 2 << 20;

/// Both sides beat; a side that stops is declared down after this.
fn intel_cfg() -> IntelConfig {
    IntelConfig {
        heartbeat_timeout: Some(Duration::from_secs(1)),
        ..IntelConfig::default()
    }
}

fn geo() -> Geometry {
    Geometry {
        ports: 2,
        queue_depth: 32,
        eager_count: 16,
        eager_size: 1024,
        data: ntbdk_pmd::transport::DataQueues::NONE,
    }
}

/// The dispatcher for child roles; a no-op in a normal test run.
#[test]
fn child_entry() {
    match child_role().as_deref() {
        None => {}
        Some("server") => server(),
        Some(r) => panic!("unknown role {r}"),
    }
}

/// The child: the DSD side. Exposes a region, answers hash requests
/// (`S` off len → `H` hash), echoes (`E…` → `e…`), and on `B` reports its
/// non-posted reads and unfenced publications, then exits.
fn server() {
    let path = std::env::var("INTEL_MEM").expect("INTEL_MEM names the model memory");
    let mem = ModelMemory::open(&PathBuf::from(path)).expect("child opens the model memory");
    let model = IntelNtbModel::attach(&mem, B2bSide::Dsd);
    let dev = Arc::new(model.device(intel_cfg(), true).unwrap());
    let t = Transport::new(dev.clone(), Config::new(geo())).unwrap();
    let mut h = Host::new(t, 2, 8);
    let r = h.t.register_region(RLEN, Access::ALL).unwrap();
    h.t.wait_connected(0, LONG).unwrap();
    let mut k = vec![b'K'];
    k.extend_from_slice(&r.0.to_le_bytes());
    h.send(0, &k);
    let mut lost_since: Option<Instant> = None;
    loop {
        h.pump();
        if let Some(m) = h.inbox.get_mut(&0).and_then(|q| q.pop_front()) {
            let u64_at = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().unwrap());
            match m[0] {
                b'S' => {
                    let mut v = vec![0u8; u64_at(9) as usize];
                    h.t.region_read(r, u64_at(1), &mut v).unwrap();
                    let mut a = vec![b'H'];
                    a.extend_from_slice(&fnv(&v).to_le_bytes());
                    h.send(0, &a);
                }
                b'E' => {
                    let mut a = m.clone();
                    a[0] = b'e';
                    h.send(0, &a);
                }
                b'B' => {
                    let mut a = vec![b'N'];
                    a.extend_from_slice(&dev.counters().non_posted_reads.to_le_bytes());
                    a.extend_from_slice(&model.fences(0).report().unfenced.to_le_bytes());
                    a.extend_from_slice(&model.fences(0).report().publishes.to_le_bytes());
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

fn echo(h: &mut Host, rng: &mut Rng) {
    let mut m = vec![0u8; 1 + rng.below(1000) as usize];
    rng.fill(&mut m);
    m[0] = b'E';
    h.send(1, &m);
    let a = h.recv(1, LONG);
    assert_eq!(a[0], b'e');
    assert!(a[1..] == m[1..], "echo of {} bytes differs", m.len());
}

/// Writes random data into the child's region and checks its hash there.
fn write_and_check(h: &mut Host, rng: &mut Rng, key: RegionKey, cookie: u64) {
    let len = 1 + rng.below(RLEN as u64) as usize;
    let off = rng.below((RLEN - len) as u64 + 1);
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    let src = h.t.register_region(len, Access::LOCAL).unwrap();
    h.t.region_write(src, 0, &data).unwrap();
    let qp = h.qp(1);
    h.t.post_write(
        qp,
        &[Sge {
            key: src,
            offset: 0,
            len: len as u64,
        }],
        RemoteAddr { key, offset: off },
        cookie,
    )
    .unwrap();
    assert_eq!(h.wait(cookie, LONG).status, Status::Success);
    h.t.deregister_region(src).unwrap();
    let mut m = vec![b'S'];
    m.extend_from_slice(&off.to_le_bytes());
    m.extend_from_slice(&(len as u64).to_le_bytes());
    h.send(1, &m);
    let a = h.recv(1, LONG);
    assert_eq!(a[0], b'H');
    assert_eq!(
        u64::from_le_bytes(a[1..9].try_into().unwrap()),
        fnv(&data),
        "{len} bytes at {off} differ in the child"
    );
}

#[test]
fn two_processes_over_one_memfd_restart_and_reconnect() {
    let mem = ModelMemory::create(IntelPart::Gen3Skx, [8 << 20, 1 << 20], 16 << 20).unwrap();
    let model = IntelNtbModel::attach(&mem, B2bSide::Usd);
    let dev = Arc::new(model.device(intel_cfg(), true).unwrap());
    let vars = [("INTEL_MEM", mem.path().display().to_string())];
    let child = RoleChild::spawn("child_entry", "server", &vars);
    let t = Transport::new(dev.clone(), Config::new(geo())).unwrap();
    let mut h = Host::new(t, 2, 8);
    let key = key_of(&h.recv(1, LONG));
    let first = dev.link(1).unwrap().generation;
    let mut rng = Rng(0x1e7e1);
    for i in 0..6 {
        write_and_check(&mut h, &mut rng, key, i);
        echo(&mut h, &mut rng);
    }
    // SIGKILL: the dead child's model still looks present (its link stays
    // up); its heartbeat stops, so it is declared down.
    drop(child);
    let killed = Instant::now();
    let end = killed + LONG;
    while h.t.peer_state(1) == PeerState::Connected || dev.link(1).unwrap().up {
        h.pump();
        assert!(Instant::now() < end, "the dead child was not noticed");
    }
    let seen = killed.elapsed();
    let heartbeat = intel_cfg().heartbeat_timeout.unwrap();
    eprintln!("the dead child was noticed after {seen:?} (heartbeat timeout {heartbeat:?})");
    assert!(
        seen <= death_bound(heartbeat),
        "the dead child was noticed after {seen:?}, beyond {:?}",
        death_bound(heartbeat)
    );
    h.repost_all(1);
    // A new process attaching the side is a rebooted host: a new generation.
    let child = RoleChild::spawn("child_entry", "server", &vars);
    let key = key_of(&h.recv(1, LONG));
    let second = dev.link(1).unwrap().generation;
    assert_ne!(first, second, "the restarted child is a new generation");
    for i in 10..16 {
        write_and_check(&mut h, &mut rng, key, i);
        echo(&mut h, &mut rng);
    }
    h.send(1, b"B");
    let a = h.recv(1, LONG);
    assert_eq!(a[0], b'N');
    let word = |i: usize| u64::from_le_bytes(a[1 + 8 * i..9 + 8 * i].try_into().unwrap());
    assert_eq!(word(0), 0, "the child made non-posted reads");
    assert_eq!(word(1), 0, "the child published without a fence");
    assert!(word(2) > 0);
    let mut child = child;
    assert!(child.wait_success(LONG));
    assert_eq!(dev.counters().non_posted_reads, 0);
    let f = model.fences(0).report();
    assert!(
        f.publishes > 0 && f.unfenced == 0 && f.mixed_words == 0,
        "{f:?}"
    );
}
