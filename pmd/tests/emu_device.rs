//! The emulated device within one process: bounds, link events, slot
//! claiming, R-LUT exhaustion, version and geometry mismatch, permissions,
//! and a 128-slot fabric with many participants.

mod emu_support;

use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use emu_support::{TestDir, wait_for};
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig, SlotState};
use ntbdk_pmd::hw::{HwError, LinkEvent, LinkState, NtbDevice};

fn cfg(dir: &TestDir, fabric: FabricConfig) -> DeviceConfig {
    DeviceConfig {
        fabric,
        dir: Some(dir.path().to_owned()),
        ..Default::default()
    }
}

fn small(slots: usize) -> FabricConfig {
    FabricConfig {
        slots,
        window_size: 64 << 10,
        heartbeat_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

#[test]
fn every_access_is_bounds_checked() {
    let dir = TestDir::new("bounds");
    let c = cfg(&dir, small(4));
    let a = EmuDevice::open("bounds", &c).unwrap();
    let b = EmuDevice::open("bounds", &c).unwrap();
    let len = 64 << 10;
    let w = a.peer_window(b.port(), 0).unwrap();
    assert_eq!(w.len(), len);
    assert!(matches!(
        w.write(len - 2, b"abc"),
        Err(HwError::OutOfBounds { .. })
    ));
    assert!(matches!(
        w.write(usize::MAX, b"a"),
        Err(HwError::OutOfBounds { .. })
    ));
    assert!(matches!(w.write_u64(4, 1), Err(HwError::Misaligned { .. })));
    assert!(matches!(
        w.write_u32(len, 1),
        Err(HwError::OutOfBounds { .. })
    ));
    w.write(len - 3, b"abc").unwrap();
    let mut buf = [0u8; 8];
    assert!(matches!(
        a.non_posted_read(b.port(), 0, len - 4, &mut buf),
        Err(HwError::OutOfBounds { .. })
    ));
    assert!(matches!(
        a.local_window(0).unwrap().read(len, &mut buf),
        Err(HwError::OutOfBounds { .. })
    ));
    assert!(matches!(
        a.peer_window(b.port(), 1),
        Err(HwError::NoSuchWindow { mw: 1, count: 1 })
    ));
    assert!(matches!(
        a.peer_window(a.port(), 0),
        Err(HwError::NoSuchPeer { .. })
    ));
    assert!(matches!(a.link(4), Err(HwError::NoSuchPeer { .. })));
    assert!(matches!(
        a.peer_spad_write(b.port(), 16, 0),
        Err(HwError::NoSuchSpad { index: 16, .. })
    ));
    assert!(matches!(a.spad_read(99), Err(HwError::NoSuchSpad { .. })));
    // Nobody in slot 3 (a took 0, b took 1): link down.
    let free = (0..4).find(|&p| p != a.port() && p != b.port()).unwrap();
    assert!(matches!(
        a.peer_db_set(free, 1),
        Err(HwError::LinkDown { .. })
    ));
    assert!(matches!(
        a.peer_window(free, 0),
        Err(HwError::LinkDown { .. })
    ));
    // Translations: aligned and within the window.
    a.set_inbound_translation(0, 0x20_0000, len).unwrap();
    assert!(a.set_inbound_translation(0, 0x20_0001, 4096).is_err());
    assert!(a.set_inbound_translation(0, 0, len + 4096).is_err());
    assert!(a.set_inbound_translation(0, 0, 0).is_err());
    let st = a.fabric().status();
    assert_eq!(
        st.slots[a.port() as usize].inbound_translation,
        Some((0x20_0000, len))
    );
    // Nothing failed was counted; the one good write was.
    assert_eq!(a.counters().posted_writes, 1);
    drop((a, b));
    EmuFabric::destroy_in(dir.path(), "bounds").unwrap();
}

#[test]
fn doorbells_masks_and_scratchpads() {
    let dir = TestDir::new("db");
    let fc = FabricConfig {
        db_bits: 16,
        ..small(4)
    };
    let c = cfg(&dir, fc);
    let a = EmuDevice::open("db", &c).unwrap();
    let b = EmuDevice::open("db", &c).unwrap();
    assert_eq!(a.db_valid_mask(), 0xffff);
    assert!(matches!(
        a.peer_db_set(b.port(), 1 << 16),
        Err(HwError::Invalid(_))
    ));
    a.peer_db_set(b.port(), 0b1001).unwrap();
    a.peer_db_set(b.port(), 0b0100).unwrap();
    assert_eq!(b.db_read(), 0b1101);
    b.db_clear(0b0001);
    assert_eq!(b.db_read(), 0b1100);
    b.db_set_mask(0xf0);
    b.db_clear_mask(0x30);
    assert_eq!(b.db_mask(), 0xc0);
    b.spad_write(2, 7).unwrap();
    a.peer_spad_write(b.port(), 3, 9).unwrap();
    assert_eq!(b.spad_read(3).unwrap(), 9);
    // A scratchpad read of a peer is non-posted and counted as such.
    assert_eq!(a.peer_spad_read(b.port(), 2).unwrap(), 7);
    let ca = a.counters();
    assert_eq!(ca.posted_writes, 3);
    assert_eq!(ca.non_posted_reads, 1);
    let mut buf = [0u8; 16];
    a.non_posted_read(b.port(), 0, 0, &mut buf).unwrap();
    assert_eq!(a.counters().non_posted_bytes, 4 + 16);
    drop((a, b));
    EmuFabric::destroy_in(dir.path(), "db").unwrap();
}

#[test]
fn link_events_follow_joins_leaves_and_rejoins() {
    let dir = TestDir::new("link");
    let c = cfg(&dir, small(4));
    let a = EmuDevice::open("link", &c).unwrap();
    let mut ev = Vec::new();
    assert_eq!(a.poll_link_events(&mut ev), 0);
    let b = EmuDevice::open("link", &c).unwrap();
    let (pb, g1) = (b.port(), b.generation());
    assert_eq!(a.poll_link_events(&mut ev), 1);
    assert_eq!(
        ev,
        vec![LinkEvent::Up {
            peer: pb,
            generation: g1
        }]
    );
    drop(b);
    ev.clear();
    a.poll_link_events(&mut ev);
    assert_eq!(
        ev,
        vec![LinkEvent::Down {
            peer: pb,
            generation: g1
        }]
    );
    assert_eq!(
        a.link(pb).unwrap(),
        LinkState {
            up: false,
            generation: g1
        }
    );
    // Rejoin the same slot: the new generation is reported.
    let b = EmuDevice::open(
        "link",
        &DeviceConfig {
            slot: Some(pb),
            ..c.clone()
        },
    )
    .unwrap();
    let g2 = b.generation();
    assert!(g2 > g1);
    ev.clear();
    a.poll_link_events(&mut ev);
    assert_eq!(
        ev,
        vec![LinkEvent::Up {
            peer: pb,
            generation: g2
        }]
    );
    // Taking a slot that is held is refused with the owner's pid.
    let err = EmuDevice::open(
        "link",
        &DeviceConfig {
            slot: Some(pb),
            ..c.clone()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("pid"), "{err}");
    let c2 = EmuDevice::open("link", &c).unwrap();
    let c3 = EmuDevice::open("link", &c).unwrap();
    let err = EmuDevice::open("link", &c).unwrap_err();
    assert!(err.to_string().contains("all 4 slots"), "{err}");
    drop((a, b, c2, c3));
    EmuFabric::destroy_in(dir.path(), "link").unwrap();
}

#[test]
fn a_stalled_device_is_declared_dead_and_learns_it_lost_its_slot() {
    let dir = TestDir::new("stall");
    let fc = FabricConfig {
        heartbeat_timeout: Duration::from_millis(50),
        ..small(4)
    };
    let mut c = cfg(&dir, fc);
    let a = EmuDevice::open("stall", &c).unwrap();
    c.heartbeat_thread = false;
    let b = EmuDevice::open("stall", &c).unwrap();
    // b never calls service(): a's scan reclaims it.
    wait_for(Duration::from_secs(10), "b reclaimed", || {
        (a.fabric().status().slots[b.port() as usize].state == SlotState::Free).then_some(())
    });
    assert!(!a.link(b.port()).unwrap().up);
    assert!(b.service().is_err());
    assert!(b.is_lost());
    drop((a, b));
    EmuFabric::destroy_in(dir.path(), "stall").unwrap();
}

#[test]
fn rlut_exhaustion_refuses_non_posted_reads_and_counts_them() {
    let dir = TestDir::new("rlut");
    let fc = small(4);
    assert_eq!(fc.rlut_entries, 32);
    let c = cfg(&dir, fc);
    let target = EmuDevice::open("rlut", &c).unwrap();
    let reader = Arc::new(
        EmuDevice::open(
            "rlut",
            &DeviceConfig {
                read_latency: Some(Duration::from_millis(400)),
                ..c.clone()
            },
        )
        .unwrap(),
    );
    let t = target.port();
    let n = 40;
    let barrier = Arc::new(Barrier::new(n));
    let results: Vec<Result<(), HwError>> = (0..n)
        .map(|_| {
            let (r, b) = (reader.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                let mut buf = [0u8; 64];
                r.non_posted_read(t, 0, 0, &mut buf)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(HwError::RlutExhausted { entries: 32 })))
        .count();
    assert_eq!(ok + refused, n, "{results:?}");
    assert!(ok >= 32, "the first 32 reads find entries ({ok})");
    assert!(
        refused >= 1,
        "40 reads of 400 ms at once exhaust 32 entries"
    );
    let cnt = reader.counters();
    assert_eq!(cnt.rlut_refusals, refused as u64);
    assert_eq!(cnt.non_posted_reads, ok as u64);
    let st = target.fabric().status();
    assert_eq!(st.slots[t as usize].rlut_refusals, refused as u64);
    assert_eq!(st.slots[t as usize].rlut_in_use, 0, "entries given back");
    // Posted writes never need an entry.
    let w = reader.peer_window(t, 0).unwrap();
    for i in 0..100 {
        w.write_u64(i * 8, i as u64).unwrap();
    }
    let e = HwError::RlutExhausted { entries: 32 }.to_string();
    assert!(e.contains("R-LUT"), "{e}");
    drop((target, reader, w));
    EmuFabric::destroy_in(dir.path(), "rlut").unwrap();
}

#[test]
fn posted_writes_go_through_while_the_rlut_is_exhausted() {
    let dir = TestDir::new("rlut-busy");
    let c = cfg(&dir, small(4));
    let target = EmuDevice::open("rlut-busy", &c).unwrap();
    let slow = DeviceConfig {
        read_latency: Some(Duration::from_secs(2)),
        ..c.clone()
    };
    let reader = Arc::new(EmuDevice::open("rlut-busy", &slow).unwrap());
    let other = EmuDevice::open("rlut-busy", &c).unwrap();
    let t = target.port();
    // 32 reads of 2 s each hold every entry of the target's R-LUT.
    let reads: Vec<_> = (0..32)
        .map(|_| {
            let r = reader.clone();
            std::thread::spawn(move || r.non_posted_read(t, 0, 0, &mut [0u8; 64]))
        })
        .collect();
    let in_use = || target.fabric().status().slots[t as usize].rlut_in_use;
    wait_for(Duration::from_secs(10), "32 entries held", || {
        (in_use() == 32).then_some(())
    });
    // Exhausted: one more read is refused at once...
    assert!(matches!(
        other.non_posted_read(t, 0, 0, &mut [0u8; 8]),
        Err(HwError::RlutExhausted { entries: 32 })
    ));
    // ...while posted writes from the reader holding the entries and from
    // another host take none, are refused nothing, and land.
    let before = (reader.counters(), other.counters());
    let (wr, wo) = (
        reader.peer_window(t, 0).unwrap(),
        other.peer_window(t, 0).unwrap(),
    );
    for i in 0..64usize {
        wr.write(4096 + i * 64, &[i as u8; 64]).unwrap();
        wo.write_u64(8192 + i * 8, 0xabc0 + i as u64).unwrap();
    }
    assert_eq!(in_use(), 32, "a posted write took or waited for an entry");
    let after = (reader.counters(), other.counters());
    assert_eq!(after.0.posted_writes - before.0.posted_writes, 64);
    assert_eq!(after.1.posted_writes - before.1.posted_writes, 64);
    assert_eq!(after.0.rlut_refusals, before.0.rlut_refusals);
    assert_eq!(after.1.rlut_refusals, before.1.rlut_refusals);
    let mine = target.local_window(0).unwrap();
    for i in 0..64usize {
        let mut got = [0u8; 64];
        mine.read(4096 + i * 64, &mut got).unwrap();
        assert_eq!(got, [i as u8; 64]);
        assert_eq!(mine.load_u64(8192 + i * 8).unwrap(), 0xabc0 + i as u64);
    }
    // The reads all complete and give their entries back.
    for r in reads {
        r.join().unwrap().unwrap();
    }
    assert_eq!(in_use(), 0);
    drop((target, reader, other, wr, wo));
    EmuFabric::destroy_in(dir.path(), "rlut-busy").unwrap();
}

#[test]
fn version_and_geometry_mismatches_are_clear_errors() {
    let dir = TestDir::new("mismatch");
    let fc = small(4);
    let f = EmuFabric::create_in(dir.path(), "mm", &fc).unwrap();
    // Owner-only permissions.
    let mode = std::fs::metadata(f.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Creating again is refused; opening with another geometry too.
    let e = EmuFabric::create_in(dir.path(), "mm", &fc).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    for other in [
        FabricConfig {
            slots: 8,
            ..fc.clone()
        },
        FabricConfig {
            window_size: 128 << 10,
            ..fc.clone()
        },
        FabricConfig {
            spads: 8,
            ..fc.clone()
        },
        FabricConfig {
            rlut_entries: 16,
            ..fc.clone()
        },
    ] {
        let e = EmuFabric::open_in(dir.path(), "mm", &other).unwrap_err();
        assert!(e.to_string().contains("another geometry"), "{e}");
    }
    EmuFabric::open_in(dir.path(), "mm", &fc).unwrap();
    // Another layout version (bytes 8..12 of the header).
    let path = f.path().to_owned();
    drop(f);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = EmuFabric::attach_in(dir.path(), "mm").unwrap_err();
    assert!(e.to_string().contains("layout version 99"), "{e}");
    let listed = EmuFabric::list_in(dir.path()).unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].problem.is_some());
    // Not a fabric at all.
    bytes[0] = b'X';
    std::fs::write(&path, &bytes).unwrap();
    let e = EmuFabric::attach_in(dir.path(), "mm").unwrap_err();
    assert!(e.to_string().contains("bad magic"), "{e}");
    EmuFabric::destroy_in(dir.path(), "mm").unwrap();
    // Missing and badly named fabrics.
    let e = EmuFabric::attach_in(dir.path(), "mm").unwrap_err();
    assert!(e.to_string().contains("no fabric named"), "{e}");
    assert!(EmuFabric::attach_in(dir.path(), "../etc").is_err());
    assert!(EmuFabric::create_in(dir.path(), "x", &small(1)).is_err());
}

#[test]
fn a_128_slot_fabric_with_many_participants() {
    let dir = TestDir::new("wide");
    let slots = 128;
    let fc = FabricConfig {
        slots,
        window_size: 64 << 10,
        heartbeat_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let c = DeviceConfig {
        heartbeat_thread: false,
        ..cfg(&dir, fc)
    };
    let devs: Vec<Arc<EmuDevice>> = (0..slots)
        .map(|_| Arc::new(EmuDevice::open("wide", &c).unwrap()))
        .collect();
    let mut ports: Vec<u16> = devs.iter().map(|d| d.port()).collect();
    ports.sort();
    assert_eq!(ports, (0..slots as u16).collect::<Vec<_>>());
    assert!(EmuDevice::open("wide", &c).is_err(), "the 129th is refused");
    // Each writes its neighbour's window and scratchpad and rings it, from
    // its own thread, then checks what its other neighbour sent.
    let barrier = Arc::new(Barrier::new(slots));
    let handles: Vec<_> = devs
        .iter()
        .cloned()
        .map(|d| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                let me = d.port();
                let next = (me + 1) % slots as u16;
                let prev = (me + slots as u16 - 1) % slots as u16;
                b.wait();
                let w = d.peer_window(next, 0).unwrap();
                let msg = [me as u8; 256];
                w.write(4096, &msg).unwrap();
                d.peer_spad_write(next, 0, me as u32).unwrap();
                d.peer_db_set(next, 1 << (me % 64)).unwrap();
                // The flag last, with release: it publishes all of the above.
                w.write_u64(0, me as u64 + 1).unwrap();
                let local = d.local_window(0).unwrap();
                wait_for(Duration::from_secs(30), "the neighbour's flag", || {
                    (local.load_u64(0).unwrap() == prev as u64 + 1).then_some(())
                });
                let mut got = [0u8; 256];
                local.read(4096, &mut got).unwrap();
                assert!(got.iter().all(|&x| x == prev as u8));
                assert_eq!(d.spad_read(0).unwrap(), prev as u32);
                assert_eq!(d.db_read(), 1 << (prev % 64));
                d.service().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let st = devs[0].fabric().status();
    assert!(
        st.slots
            .iter()
            .all(|s| s.state == SlotState::Up && s.link_up)
    );
    drop(devs);
    let st = EmuFabric::attach_in(dir.path(), "wide").unwrap().status();
    assert!(st.slots.iter().all(|s| s.state == SlotState::Free));
    EmuFabric::destroy_in(dir.path(), "wide").unwrap();
}

#[test]
fn absurd_sizes_and_timeouts_are_clear_errors() {
    let dir = TestDir::new("absurd");
    let bad = |fc: FabricConfig| {
        EmuFabric::create_in(dir.path(), "absurd", &fc)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let hb = bad(FabricConfig {
        heartbeat_timeout: Duration::MAX,
        ..small(2)
    });
    assert!(hb.contains("heartbeat timeout must be"), "{hb}");
    let win = bad(FabricConfig {
        window_size: 1 << 50,
        ..small(2)
    });
    assert!(win.contains("window size must be at most"), "{win}");
    // A window larger than the memory available is refused at join, with
    // what it needs and what there is (not an OOM kill).
    let fc = FabricConfig {
        window_size: 1 << 39,
        ..small(2)
    };
    let f = EmuFabric::create_in(dir.path(), "absurd", &fc).unwrap();
    let err = EmuDevice::join(&f, &cfg(&dir, fc)).unwrap_err().to_string();
    assert!(err.contains("need") && err.contains("available"), "{err}");
    drop(f);
    EmuFabric::destroy_in(dir.path(), "absurd").unwrap();
}

/// The mappings of this process whose name holds `zone`.
fn mappings_of(zone: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(zone))
        .count()
}

/// A peer's window, mapped for writes to it, is unmapped once its link goes
/// down: a departed peer's memory is not kept alive by the hosts it talked
/// to.
#[test]
fn a_departed_peers_window_is_unmapped_at_its_link_down() {
    let dir = TestDir::new("unmap");
    let c = cfg(&dir, small(4));
    let a = EmuDevice::open("unmap", &c).unwrap();
    let b = EmuDevice::open("unmap", &c).unwrap();
    let zone = format!("emu-unmap-{}", b.port());
    let mut ev = Vec::new();
    a.poll_link_events(&mut ev);
    a.peer_window(b.port(), 0).unwrap().write_u64(0, 7).unwrap();
    assert!(mappings_of(&zone) >= 2, "b's own mapping and a's");
    let (pb, g) = (b.port(), b.generation());
    drop(b);
    ev.clear();
    a.poll_link_events(&mut ev);
    assert!(ev.contains(&LinkEvent::Down {
        peer: pb,
        generation: g
    }));
    assert_eq!(
        mappings_of(&zone),
        0,
        "a still maps the window of b, which left"
    );
}
