//! One-sided writes between two processes on the emulated fabric: the
//! parent writes straight into a region of a child's (with and without an
//! immediate), the child checks every byte of every write at the first
//! immediate at or after it, each immediate exactly once and in order; then
//! the child deregisters the region while the parent keeps writing into it:
//! the region's bytes stay held until the parent acknowledges, the parent's
//! writes are refused from then on, and memory registered afterwards is
//! never written by a late write.

mod transport_common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::Port;
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};
use ntbdk_pmd::transport::{
    Access, Config, DropKind, Geometry, OpKind, RegionKey, RemoteAddr, Status, Transport,
    TransportError,
};
use transport_common::{Host, RoleChild, TestDir, child_role, env};

const LONG: Duration = Duration::from_secs(30);
/// The child's region.
const REGION: u64 = 128 << 10;
/// Writes of the first phase, each in a slot of its own.
const WRITES: u64 = 200;
const SLOT: u64 = 512;
/// Writes of the second phase are this long, at `(k % SLOTS2) * LEN2`.
const LEN2: u64 = 256;
const SLOTS2: u64 = REGION / LEN2;
/// Immediates of the second phase carry this bit.
const PHASE2: u64 = 1 << 40;
/// The child deregisters the region after this many second-phase
/// immediates.
const REVOKE_AFTER: u64 = 64;
/// What the child fills memory registered after the revocation with.
const AFTER: u8 = 0xEE;

fn geo() -> Geometry {
    Geometry {
        ports: 2,
        queue_depth: 64,
        eager_count: 32,
        eager_size: 4096,
        data: ntbdk_pmd::transport::DataQueues::NONE,
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

/// Write `i` of the first phase: (offset, length); lengths vary from 1 to
/// `SLOT` and offsets are not aligned.
fn phase1_span(i: u64) -> (u64, u64) {
    let len = 1 + (i * 61) % SLOT;
    (i * SLOT + (SLOT - len) / 2, len)
}

/// Byte `j` of first-phase write `i`.
fn phase1_byte(i: u64, j: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9) ^ j.wrapping_mul(31)).rotate_right(7) as u8
}

/// Whether first-phase write `i` carries an immediate (the last one does,
/// so every write is followed by one).
fn phase1_imm(i: u64) -> bool {
    i.is_multiple_of(3) || i == WRITES - 1
}

/// Second-phase write `k`: its offset and bytes (the same bytes every
/// time a slot is rewritten, so a check at a notice never races a later
/// write).
fn phase2_write(k: u64) -> (u64, Vec<u8>) {
    let s = k % SLOTS2;
    let data = (0..LEN2).map(|j| (s * 131 + j * 7 + 1) as u8 | 1).collect();
    (s * LEN2, data)
}

/// The dispatcher for child roles; a no-op in a normal test run.
#[test]
fn child_entry() {
    match child_role().as_deref() {
        None => {}
        Some("target") => target(),
        Some(r) => panic!("unknown role {r}"),
    }
}

/// The child: port 1, the target of the parent's one-sided writes.
fn target() {
    let dir: String = env("XPORT_DIR");
    let fabric = EmuFabric::attach_in(std::path::Path::new(&dir), "direct-mp").unwrap();
    let t = Transport::new(Arc::new(join(&fabric, 1)), Config::new(geo())).unwrap();
    let mut h = Host::new(t, 2, 8);
    let free0 = h.t.region_area_free();
    let r = h.t.register_region(REGION as usize, Access::ALL).unwrap();
    h.t.wait_connected(0, LONG).unwrap();
    let mut k = vec![b'K'];
    k.extend_from_slice(&r.0.to_le_bytes());
    h.send(0, &k);

    // Phase 1: every write checked at the first immediate at or after it.
    let mut seen = HashSet::new();
    let (mut verified, mut bytes) = (0u64, 0u64);
    let end = Instant::now() + LONG;
    while verified < WRITES {
        h.pump();
        let mut notices: Vec<_> = h.done.drain().map(|(_, c)| c).collect();
        notices.sort_by_key(|c| c.cookie);
        for c in notices {
            assert_eq!(
                (c.op, c.status, c.region),
                (OpKind::WriteImm, Status::Success, Some(r)),
                "a first-phase notice"
            );
            let i = c.cookie;
            assert!(seen.insert(i), "immediate {i} twice");
            assert!(i < WRITES && phase1_imm(i), "immediate {i} never sent");
            assert_eq!(
                i,
                (verified..WRITES).find(|&j| phase1_imm(j)).unwrap(),
                "immediate {i} out of order"
            );
            assert_eq!(c.bytes, phase1_span(i).1);
            for w in verified..=i {
                let (off, len) = phase1_span(w);
                let mut got = vec![0u8; len as usize];
                h.t.region_read(r, off, &mut got).unwrap();
                for (j, &b) in got.iter().enumerate() {
                    assert_eq!(
                        b,
                        phase1_byte(w, j as u64),
                        "write {w} byte {j} at immediate {i}"
                    );
                }
                bytes += len;
            }
            verified = i + 1;
        }
        assert!(Instant::now() < end, "{verified} of {WRITES} writes seen");
    }
    report(&mut h, b'1', &[verified, seen.len() as u64, bytes]);

    // Phase 2: the parent writes on; after some notices, revoke.
    let mut notices = 0u64;
    let end = Instant::now() + LONG;
    while notices < REVOKE_AFTER {
        h.pump();
        for (_, c) in h.done.drain() {
            assert_eq!((c.op, c.region), (OpKind::WriteImm, Some(r)));
            assert!(c.cookie & PHASE2 != 0, "a first-phase immediate again");
            let (off, want) = phase2_write(c.cookie & !PHASE2);
            let mut got = vec![0u8; LEN2 as usize];
            h.t.region_read(r, off, &mut got).unwrap();
            assert_eq!(
                got,
                want,
                "second-phase write {} at its notice",
                c.cookie & !PHASE2
            );
            notices += 1;
        }
        assert!(Instant::now() < end, "{notices} second-phase notices");
    }
    h.t.deregister_region(r).unwrap();
    let held = h.t.region_area_free();
    assert!(held < free0, "the revoked region's bytes came back at once");
    // Until the parent acknowledges, the bytes stay out of the area.
    let end = Instant::now() + LONG;
    let mut polls_held = 0u64;
    while h.t.region_area_free() != free0 {
        assert_eq!(
            h.t.region_area_free(),
            held,
            "the area changed before the acknowledgement"
        );
        h.pump();
        // Notices already in flight for the revoked region are dropped.
        h.done.clear();
        polls_held += 1;
        assert!(
            Instant::now() < end,
            "the revocation was never acknowledged"
        );
    }
    // Memory registered now takes the revoked bytes; no late write may
    // land in it while the parent goes on trying.
    let r2 = h.t.register_region(REGION as usize, Access::LOCAL).unwrap();
    h.t.region_write(r2, 0, &vec![AFTER; REGION as usize])
        .unwrap();
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        h.pump();
        h.done.clear();
    }
    let mut got = vec![0u8; REGION as usize];
    h.t.region_read(r2, 0, &mut got).unwrap();
    if let Some(j) = got.iter().position(|&b| b != AFTER) {
        panic!("byte {j} of memory registered after the revocation was written");
    }
    let qp = h.qp(0);
    let dropped = h.t.counters(qp).dropped(DropKind::Access);
    report(&mut h, b'2', &[notices, polls_held, dropped]);
    // Stay until the parent has the message and says goodbye.
    let m = h.recv(0, LONG);
    assert_eq!(m, b"B");
}

/// Sends the parent a report: `tag`, then `values` (little-endian).
fn report(h: &mut Host, tag: u8, values: &[u64]) {
    let mut m = vec![tag];
    for v in values {
        m.extend_from_slice(&v.to_le_bytes());
    }
    h.send(0, &m);
}

/// The values of a report tagged `tag` (see [`report`]).
fn parse_report(m: &[u8], tag: u8) -> Vec<u64> {
    assert_eq!(m.first(), Some(&tag), "expected report {}", tag as char);
    m[1..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn one_sided_writes_between_processes_every_byte_checked_and_revoked_under_traffic() {
    let dir = TestDir::new("direct-mp");
    let fc = FabricConfig {
        slots: 2,
        window_size: 4 << 20,
        heartbeat_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let fabric = EmuFabric::create_in(dir.path(), "direct-mp", &fc).unwrap();
    let mut child = RoleChild::spawn(
        "child_entry",
        "target",
        &[("XPORT_DIR", dir.0.display().to_string())],
    );
    let t = Transport::new(Arc::new(join(&fabric, 0)), Config::new(geo())).unwrap();
    let mut h = Host::new(t, 2, 8);
    h.t.wait_connected(1, LONG).unwrap();
    let m = h.recv(1, LONG);
    assert_eq!(m[0], b'K');
    let r = RegionKey(u32::from_le_bytes(m[1..5].try_into().unwrap()));
    let qp = h.qp(1);
    // The region is advertised after the key message was sent: wait for it
    // (an empty write is refused for its size once the key is known).
    let end = Instant::now() + LONG;
    loop {
        match h
            .t
            .post_write_direct(qp, &[], RemoteAddr { key: r, offset: 0 }, None, 0)
        {
            Err(TransportError::UnknownRemoteKey { .. }) => h.pump(),
            Err(TransportError::TransferSize { .. }) => break,
            other => panic!("probe: {other:?}"),
        }
        assert!(Instant::now() < end, "region never advertised");
    }

    // Phase 1.
    for i in 0..WRITES {
        let (offset, len) = phase1_span(i);
        let data: Vec<u8> = (0..len).map(|j| phase1_byte(i, j)).collect();
        let imm = phase1_imm(i).then_some(i);
        h.t.post_write_direct(qp, &data, RemoteAddr { key: r, offset }, imm, i)
            .unwrap();
        h.pump();
        for (_, c) in h.done.drain() {
            assert_eq!((c.op, c.status), (OpKind::WriteDirect, Status::Success));
        }
    }
    // (Receiving pumps: the notices waiting for credits go out meanwhile.)
    let f = parse_report(&h.recv(1, LONG), b'1');
    let imms = (0..WRITES).filter(|&i| phase1_imm(i)).count() as u64;
    let total: u64 = (0..WRITES).map(|i| phase1_span(i).1).sum();
    assert_eq!(
        f,
        [WRITES, imms, total],
        "writes, immediates, bytes checked"
    );

    // Phase 2: write until refused, then keep trying until the child is done.
    let (mut k, mut accepted, mut refused) = (0u64, 0u64, 0u64);
    let end = Instant::now() + LONG;
    let f = loop {
        let (offset, data) = phase2_write(k);
        let imm = k.is_multiple_of(4).then_some(PHASE2 | k);
        match h
            .t
            .post_write_direct(qp, &data, RemoteAddr { key: r, offset }, imm, k)
        {
            Ok(()) => {
                assert_eq!(refused, 0, "a write accepted after one was refused");
                accepted += 1;
            }
            Err(TransportError::UnknownRemoteKey { .. }) => refused += 1,
            Err(e) => panic!("second-phase write {k}: {e}"),
        }
        k += 1;
        h.pump();
        for (_, c) in h.done.drain() {
            assert_eq!((c.op, c.status), (OpKind::WriteDirect, Status::Success));
        }
        if let Some(m) = h.inbox.get_mut(&1).and_then(|q| q.pop_front()) {
            break parse_report(&m, b'2');
        }
        assert!(
            Instant::now() < end,
            "the child never finished ({accepted} accepted, {refused} refused)"
        );
    };
    assert!(
        accepted >= REVOKE_AFTER * 4 - 3,
        "{accepted} writes accepted"
    );
    assert!(refused > 0, "no write was refused after the revocation");
    assert!(
        f[0] >= REVOKE_AFTER,
        "second-phase notices checked before the revocation"
    );
    h.send(1, b"B");
    assert!(child.wait_success(LONG), "the child failed");
    drop(h);
    EmuFabric::destroy_in(dir.path(), "direct-mp").unwrap();
}
