//! The Intel NTB backend (`IntelNtb`) against its register model, in one
//! process: bring-up and the handshake, register semantics (doorbells,
//! scratchpads, link), translation errors, a peer restart seen as a new
//! generation, and the transport's workloads with every byte verified, no
//! non-posted read, and a store fence before every publication on
//! write-combined apertures.

mod transport_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::intel::model::{DRAM_IOVA, IntelNtbModel, ModelBar, ModelMemory};
use ntbdk_pmd::hw::intel::regs;
use ntbdk_pmd::hw::intel::{B2bSide, IntelConfig, IntelError, IntelNtb, IntelPart};
use ntbdk_pmd::hw::mmio::Mmio;
use ntbdk_pmd::hw::{HwError, LinkEvent, NtbDevice};
use ntbdk_pmd::transport::{
    Access, Config, Geometry, OpKind, PeerState, RemoteAddr, Sge, Status, Transport, TransportError,
};
use transport_common::{Rng, collect, connect_all, death_bound};

const BAR: [usize; 2] = [8 << 20, 1 << 20];
const DRAM: usize = 16 << 20;
const PARTS: [IntelPart; 3] = [IntelPart::Gen3Skx, IntelPart::Gen4Icx, IntelPart::Gen4Spr];

type Dev = IntelNtb<ModelBar>;

struct Pair {
    mem: ModelMemory,
    models: [IntelNtbModel; 2],
    devs: [Arc<Dev>; 2],
}

fn pair_with(part: IntelPart, wc: bool, cfg: IntelConfig) -> Pair {
    let mem = ModelMemory::create(part, BAR, DRAM).unwrap();
    let models = [
        IntelNtbModel::attach(&mem, B2bSide::Usd),
        IntelNtbModel::attach(&mem, B2bSide::Dsd),
    ];
    let devs = [
        Arc::new(models[0].device(cfg.clone(), wc).unwrap()),
        Arc::new(models[1].device(cfg, wc).unwrap()),
    ];
    Pair { mem, models, devs }
}

fn pair(part: IntelPart, wc: bool) -> Pair {
    pair_with(part, wc, IntelConfig::default())
}

/// Services both devices until each sees the other's generation.
fn settle(devs: &[Arc<Dev>; 2]) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        for d in devs {
            d.service().unwrap();
        }
        let a = devs[0].link(1).unwrap();
        let b = devs[1].link(0).unwrap();
        if a.up
            && b.up
            && a.generation == devs[1].generation()
            && b.generation == devs[0].generation()
        {
            return;
        }
        assert!(Instant::now() < end, "no handshake: {a:?} {b:?}");
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

fn transports(devs: &[Arc<Dev>; 2]) -> Vec<Transport> {
    let mut ts: Vec<Transport> = devs
        .iter()
        .map(|d| Transport::new(d.clone(), Config::new(geo())).unwrap())
        .collect();
    connect_all(&mut ts);
    ts
}

#[test]
fn bring_up_gives_ports_from_the_port_definition_and_a_handshake() {
    for part in PARTS {
        let p = pair(part, false);
        let [a, b] = &p.devs;
        assert_eq!((a.port(), b.port()), (0, 1), "{part:?}");
        assert_eq!((a.part(), b.side()), (part, B2bSide::Dsd));
        assert_ne!(a.generation(), b.generation());
        assert!(p.models[0].link_up());
        settle(&p.devs);
        let mut ev = Vec::new();
        a.poll_link_events(&mut ev);
        assert_eq!(
            ev,
            vec![LinkEvent::Up {
                peer: 1,
                generation: b.generation()
            }],
            "{part:?}"
        );
        // Translation programmed as the drivers do: limit = BAR start + size.
        let r = a.registers();
        let base = r.read64(regs::xbase(0)).unwrap();
        let limit = r.read64(regs::xlmt(0)).unwrap();
        assert!(base >= DRAM_IOVA && base.is_multiple_of(BAR[0] as u64));
        assert_eq!(a.local_window(0).unwrap().iova(), base);
        assert_eq!(limit & 0xFFFF_FFFF, BAR[0] as u64);
        match part {
            IntelPart::Gen3Skx => {
                let cntl = r.read32(regs::NTBCNTL).unwrap();
                assert_eq!(cntl & regs::NTBCNTL_DISABLE, 0);
                assert_eq!(cntl & regs::NTBCNTL_SNOOP, regs::NTBCNTL_SNOOP);
            }
            _ => {
                assert_ne!(
                    r.read32(regs::GEN4_PPD0).unwrap() & regs::GEN4_PPD_LINKTRN,
                    0
                );
                assert_eq!(r.read32(regs::GEN4_LINK_CTRL).unwrap() & 0x10, 0);
            }
        }
        if part == IntelPart::Gen4Icx {
            let idx = r.read32(regs::gen4_xbaseidx(0)).unwrap();
            assert_eq!(idx & 0xFFFF, BAR[0].ilog2());
            assert_eq!(idx >> 16, BAR[1].ilog2());
        }
        let g = a.mw_geometry(0).unwrap();
        let align = if part == IntelPart::Gen4Spr {
            4096
        } else {
            BAR[0]
        };
        assert_eq!((g.size, g.addr_align), (BAR[0], align));
        // The handshake used posted writes only.
        assert_eq!(
            a.counters().non_posted_reads + b.counters().non_posted_reads,
            0
        );
        let _ = &p.mem;
    }
}

#[test]
fn doorbells_are_write_1_to_clear_ring_the_peer_and_keep_out_of_reserved_bits() {
    for part in PARTS {
        let p = pair(part, false);
        settle(&p.devs);
        let [a, b] = &p.devs;
        assert_eq!(a.db_valid_mask(), 0x0FFF_FFFF);
        a.peer_db_set(1, 0b1010_0001).unwrap();
        assert_eq!(b.db_read(), 0b1010_0001, "{part:?}");
        assert_eq!(a.db_read(), 0, "the ring lands on the other side only");
        b.db_clear(0b0000_0001);
        assert_eq!(b.db_read(), 0b1010_0000);
        // Raw W1C on the status register: writing 0 bits changes nothing.
        let rb = b.registers();
        rb.write64(regs::DB_STATUS, 0).unwrap();
        assert_eq!(b.db_read(), 0b1010_0000);
        rb.write32(regs::DB_STATUS, 0b1000_0000).unwrap();
        assert_eq!(b.db_read(), 0b0010_0000);
        // Raw peer doorbell: 0x100 + 4 * bit.
        a.registers().write32(regs::peer_doorbell(7), 1).unwrap();
        assert_eq!(b.db_read(), 0b1010_0000);
        // Mask: kept for the caller; the hardware's masks every doorbell
        // and the link (nothing takes the interrupts), and the status still
        // latches.
        let all = u64::from(u32::MAX) | regs::DB_LINK_BIT;
        assert_eq!(rb.read64(regs::DB_MASK).unwrap(), all);
        b.db_set_mask(0b11);
        assert_eq!(b.db_mask(), 0b11);
        b.db_clear_mask(0b01);
        assert_eq!(b.db_mask(), 0b10);
        assert_eq!(rb.read64(regs::DB_MASK).unwrap(), all);
        a.peer_db_set(1, 0b10).unwrap();
        assert_eq!(b.db_read() & 0b10, 0b10);
        // Bit 28 is the handshake's, 31 is avoided (Skylake vector 31).
        for bad in [1 << 28, 1 << 31, 1 << 32] {
            let e = a.peer_db_set(1, bad).unwrap_err();
            assert!(matches!(e, HwError::Invalid(_)), "{e}");
        }
        assert!(matches!(
            a.peer_db_set(0, 1),
            Err(HwError::NoSuchPeer { .. })
        ));
        // Each bit rung is one posted 4-byte write.
        let before = a.counters().posted_writes;
        a.peer_db_set(1, 0b111).unwrap();
        assert_eq!(a.counters().posted_writes - before, 3);
    }
}

#[test]
fn scratchpads_route_to_the_peer_and_a_peer_read_is_counted_non_posted() {
    for part in PARTS {
        let p = pair(part, false);
        settle(&p.devs);
        let [a, b] = &p.devs;
        assert_eq!(a.spad_count(), 6);
        a.peer_spad_write(1, 0, 0xABCD_0001).unwrap();
        a.peer_spad_write(1, 1, 0xABCD_0002).unwrap();
        assert_eq!(b.spad_read(0).unwrap(), 0xABCD_0001, "{part:?}");
        assert_eq!(b.spad_read(1).unwrap(), 0xABCD_0002);
        // The user's scratchpads are the last six (10..=15) of the 16.
        assert_eq!(b.registers().read32(regs::spad(10)).unwrap(), 0xABCD_0001);
        a.peer_spad_write(1, 5, 0xABCD_0006).unwrap();
        assert_eq!(b.registers().read32(regs::spad(15)).unwrap(), 0xABCD_0006);
        a.spad_write(1, 77).unwrap();
        assert_eq!(a.spad_read(1).unwrap(), 77);
        assert_eq!(b.peer_spad_read(0, 1).unwrap(), 77);
        assert_eq!(b.counters().non_posted_reads, 1);
        assert_eq!(a.counters().non_posted_reads, 0);
        assert!(matches!(a.spad_read(6), Err(HwError::NoSuchSpad { .. })));
        // The peer's scratchpads sit at a per-generation offset of BAR0.
        let peer_off = if part.is_gen4() {
            regs::gen4_peer_spad(3)
        } else {
            regs::gen3_peer_spad(3)
        };
        a.registers().write32(peer_off, 0x55).unwrap();
        assert_eq!(b.registers().read32(regs::spad(3)).unwrap(), 0x55);
    }
}

#[test]
fn the_link_follows_both_sides_and_peer_writes_are_lost_while_it_is_down() {
    let mem = ModelMemory::create(IntelPart::Gen3Skx, BAR, DRAM).unwrap();
    let a = IntelNtbModel::attach(&mem, B2bSide::Usd);
    let da = a.device(IntelConfig::default(), false).unwrap();
    assert!(!a.link_up(), "no peer yet");
    assert!(!da.link(1).unwrap().up);
    // A write to the absent peer's scratchpad goes nowhere; a read of it
    // completes with all ones.
    let ra = da.registers();
    ra.write32(regs::gen3_peer_spad(14), 9).unwrap();
    assert_eq!(ra.read32(regs::gen3_peer_spad(14)).unwrap(), u32::MAX);
    let b = IntelNtbModel::attach(&mem, B2bSide::Dsd);
    assert!(!a.link_up(), "present but not enabled");
    let db = Arc::new(b.device(IntelConfig::default(), false).unwrap());
    assert!(a.link_up());
    assert_eq!(db.spad_read(0).unwrap(), 0, "the early write was lost");
    // Each side saw the link bit (32) set by the change.
    let mut ev = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while ev.is_empty() {
        da.poll_link_events(&mut ev);
        db.service().unwrap();
        assert!(Instant::now() < end);
    }
    assert_eq!(
        ev[0],
        LinkEvent::Up {
            peer: 1,
            generation: db.generation()
        }
    );
    // The config-space link status (gen3) reads active.
    drop(db);
    drop(b);
    assert!(!a.link_up());
    ev.clear();
    da.poll_link_events(&mut ev);
    assert!(
        matches!(ev[..], [LinkEvent::Down { peer: 1, .. }]),
        "{ev:?}"
    );
}

#[test]
fn translation_errors_say_what_is_wrong() {
    // Gen3: the address must be a multiple of the whole BAR size.
    let p = pair(IntelPart::Gen3Skx, false);
    let a = &p.devs[0];
    let e = a
        .set_inbound_translation(0, DRAM_IOVA + 4096, 4096)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("not a multiple of 0x800000") && msg.contains("whole BAR size"),
        "{msg}"
    );
    let e = a.translate(1, DRAM_IOVA, 2 << 20).unwrap_err();
    assert!(matches!(e, IntelError::TranslationSize { .. }), "{e}");
    assert!(e.to_string().contains("Imbar"), "{e}");
    assert!(matches!(
        a.set_inbound_translation(2, DRAM_IOVA, 4096),
        Err(HwError::NoSuchWindow { .. })
    ));
    // Sapphire Rapids only needs 4 KiB alignment.
    let p = pair(IntelPart::Gen4Spr, false);
    p.devs[0]
        .translate(1, DRAM_IOVA + (15 << 20), 4096)
        .unwrap();
    // A window bigger than the BAR is refused at open.
    let mem = ModelMemory::create(IntelPart::Gen4Icx, BAR, DRAM).unwrap();
    let m = IntelNtbModel::attach(&mem, B2bSide::Usd);
    let cfg = IntelConfig {
        window_size: Some(16 << 20),
        ..IntelConfig::default()
    };
    let e = m.device(cfg, false).unwrap_err();
    assert!(
        matches!(e, IntelError::TranslationSize { mw: 0, .. }),
        "{e}"
    );
    // More memory than the side has: the IOVA range runs out.
    let big = ModelMemory::create(IntelPart::Gen3Skx, [8 << 20, 8 << 20], 12 << 20).unwrap();
    let e = IntelNtbModel::attach(&big, B2bSide::Usd)
        .device(IntelConfig::default(), false)
        .unwrap_err();
    assert!(matches!(e, IntelError::IovaExhausted { .. }), "{e}");
    // A heartbeat timeout of zero would end the peer at the first poll.
    let cfg = IntelConfig {
        heartbeat_timeout: Some(Duration::ZERO),
        ..IntelConfig::default()
    };
    let e = IntelNtbModel::attach(&mem, B2bSide::Usd)
        .device(cfg, false)
        .unwrap_err();
    assert!(e.to_string().contains("heartbeat timeout of 0"), "{e}");
}

#[test]
fn a_misprogrammed_peer_translation_is_a_clear_error_not_a_stray_write() {
    let p = pair(IntelPart::Gen4Icx, false);
    settle(&p.devs);
    let [a, b] = &p.devs;
    let rb = b.registers();
    let (base, limit) = (
        rb.read64(regs::xbase(0)).unwrap(),
        rb.read64(regs::xlmt(0)).unwrap(),
    );
    a.peer_window(1, 0).unwrap();
    // Misaligned base (the driver refuses it; write the register directly).
    rb.write64(regs::xbase(0), base + 4096).unwrap();
    let e = a.peer_window(1, 0).unwrap_err().to_string();
    assert!(e.contains("not a multiple of 0x800000"), "{e}");
    rb.write64(regs::xbase(0), base).unwrap();
    // Zero-length window: limit at the BAR start.
    rb.write64(regs::xlmt(0), limit - BAR[0] as u64).unwrap();
    let e = a.peer_window(1, 0).unwrap_err().to_string();
    assert!(
        e.contains("zero-length") && e.contains("inbound translation"),
        "{e}"
    );
    // Base outside the peer's memory.
    rb.write64(regs::xlmt(0), limit).unwrap();
    rb.write64(regs::xbase(0), DRAM_IOVA + (64 << 20)).unwrap();
    let e = a.peer_window(1, 0).unwrap_err().to_string();
    assert!(e.contains("outside its memory"), "{e}");
    rb.write64(regs::xbase(0), base).unwrap();
    assert_eq!(a.peer_window(1, 0).unwrap().len(), BAR[0]);
    // A window too small for the transport: refused when it is built.
    let small = pair_with(
        IntelPart::Gen3Skx,
        false,
        IntelConfig {
            window_size: Some(8 << 10),
            ..IntelConfig::default()
        },
    );
    let e = Transport::new(small.devs[0].clone(), Config::new(geo())).unwrap_err();
    assert!(matches!(e, TransportError::WindowTooSmall { .. }), "{e}");
    // Gen3 without the external limit: the B2B side blocks the window.
    let g3 = pair(IntelPart::Gen3Skx, false);
    settle(&g3.devs);
    g3.devs[1]
        .registers()
        .write64(regs::gen3_embar_xlmt(0), 0)
        .unwrap();
    let e = g3.devs[0].peer_window(1, 0).unwrap_err().to_string();
    assert!(e.contains("external"), "{e}");
}

fn scattered(t: &mut Transport, len: usize, access: Access) -> ntbdk_pmd::transport::RegionKey {
    t.register_region_scattered(len, access, 64 << 10).unwrap()
}

/// Writes, reads and sends of random sizes between two transports; every
/// byte compared.
fn workload(ts: &mut [Transport], seed: u64, rounds: u64) {
    let qa = ts[0].create_qp(1).unwrap();
    let qb = ts[1].create_qp(0).unwrap();
    let mut rng = Rng(seed);
    for round in 0..rounds {
        let len = 1 + rng.below(if round % 4 == 0 { 1 << 20 } else { 48 << 10 }) as usize;
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        let src = scattered(&mut ts[0], len, Access::LOCAL);
        ts[0].region_write(src, 0, &data).unwrap();
        let dst = scattered(&mut ts[1], len, Access::ALL);
        let whole = |key| Sge {
            key,
            offset: 0,
            len: len as u64,
        };
        let at = |key| RemoteAddr { key, offset: 0 };
        ts[0].post_write(qa, &[whole(src)], at(dst), round).unwrap();
        let c = collect(ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].bytes),
            (OpKind::Write, Status::Success, len as u64)
        );
        let mut back = vec![0u8; len];
        ts[1].region_read(dst, 0, &mut back).unwrap();
        assert!(back == data, "write round {round}: {len} bytes differ");
        let into = scattered(&mut ts[0], len, Access::LOCAL);
        ts[0]
            .post_read(qa, &[whole(into)], at(dst), 1000 + round)
            .unwrap();
        let c = collect(ts, 0, 1);
        assert_eq!((c[0].op, c[0].status), (OpKind::Read, Status::Success));
        let mut back = vec![0u8; len];
        ts[0].region_read(into, 0, &mut back).unwrap();
        assert!(back == data, "read round {round}: {len} bytes differ");
        for k in [src, into] {
            ts[0].deregister_region(k).unwrap();
        }
        ts[1].deregister_region(dst).unwrap();
        // A send of up to one eager buffer, B to A.
        let n = 1 + rng.below(1024) as usize;
        let mut msg = vec![0u8; n];
        rng.fill(&mut msg);
        let rbuf = ts[0].register_region(1024, Access::LOCAL).unwrap();
        let qa2 = ts[0].create_qp(1).unwrap();
        ts[0]
            .post_recv(
                qa2,
                Sge {
                    key: rbuf,
                    offset: 0,
                    len: 1024,
                },
                5000 + round,
            )
            .unwrap();
        ts[1].post_send(qb, &msg, 0).unwrap();
        let c = collect(ts, 0, 1);
        assert_eq!(
            (c[0].op, c[0].status, c[0].bytes),
            (OpKind::Recv, Status::Success, n as u64)
        );
        let mut got = vec![0u8; n];
        ts[0].region_read(rbuf, 0, &mut got).unwrap();
        assert!(got == msg, "send round {round}");
        ts[0].deregister_region(rbuf).unwrap();
    }
}

#[test]
fn the_transport_runs_over_modelled_intel_ntbs_with_every_byte_verified() {
    for part in PARTS {
        let p = pair(part, true);
        let mut ts = transports(&p.devs);
        workload(&mut ts, 0x1A7E1 ^ part as u64, 12);
        for (i, d) in p.devs.iter().enumerate() {
            assert_eq!(d.counters().non_posted_reads, 0, "{part:?} side {i}");
            // Write-combined apertures: a fence before every publication,
            // and no flag ever written as data.
            let f = p.models[i].fences(0).report();
            assert!(f.publishes > 50 && f.data > 50, "{part:?}: {f:?}");
            assert_eq!(
                (f.unfenced, f.mixed_words),
                (0, 0),
                "{part:?} side {i}: {f:?}, first unfenced at {:?}",
                p.models[i].fences(0).first_unfenced()
            );
            assert!(f.fences >= f.publishes);
        }
        assert!(p.devs[0].peer_window(1, 0).unwrap().is_write_combining());
    }
}

#[test]
fn without_write_combining_nothing_is_recorded() {
    let p = pair(IntelPart::Gen3Skx, false);
    let mut ts = transports(&p.devs);
    workload(&mut ts, 3, 2);
    assert_eq!(p.models[0].fences(0).report().publishes, 0);
    assert!(!p.devs[0].peer_window(1, 0).unwrap().is_write_combining());
}

#[test]
fn a_restarted_peer_is_a_new_generation_and_the_transport_reconnects() {
    let part = IntelPart::Gen4Spr;
    let p = pair(part, true);
    let mut ts = transports(&p.devs);
    workload(&mut ts, 11, 2);
    let old = p.devs[1].generation();
    assert_eq!(p.devs[0].link(1).unwrap().generation, old);
    // Side B goes away: its transport, device and model.
    let Pair { mem, models, devs } = p;
    let [ma, mb] = models;
    let [da, db] = devs;
    let tb = ts.pop().unwrap();
    drop(tb);
    drop(db);
    drop(mb);
    // Its link goes down (its BYE, then the link status) and the
    // connection ends (the transport may already be waiting for a new one).
    let end = Instant::now() + Duration::from_secs(5);
    while ts[0].is_connected(1) || da.link(1).unwrap().up {
        ts[0].progress();
        assert!(Instant::now() < end, "{:?}", ts[0].peer_state(1));
    }
    assert_ne!(ts[0].peer_state(1), PeerState::Connected);
    // It comes back: a power-on reset of its registers, a new device.
    let mb = IntelNtbModel::attach(&mem, B2bSide::Dsd);
    let db = Arc::new(mb.device(IntelConfig::default(), true).unwrap());
    assert_ne!(db.generation(), old);
    ts.push(Transport::new(db.clone(), Config::new(geo())).unwrap());
    connect_all(&mut ts);
    assert_eq!(da.link(1).unwrap().generation, db.generation());
    workload(&mut ts, 12, 3);
    assert_eq!(
        da.counters().non_posted_reads + db.counters().non_posted_reads,
        0
    );
    assert_eq!(ma.fences(0).report().unfenced, 0);
}

#[test]
fn a_silent_peer_is_declared_down_by_its_heartbeat_and_a_new_incarnation_comes_up() {
    let heartbeat = Duration::from_millis(200);
    let cfg = IntelConfig {
        heartbeat_timeout: Some(heartbeat),
        ..IntelConfig::default()
    };
    let p = pair_with(IntelPart::Gen3Skx, false, cfg.clone());
    // B's last beat is written in `settle`, between these two instants:
    // the silence is at most `since.elapsed()` and at least
    // `silent.elapsed()`, however long this thread is descheduled.
    let since = Instant::now();
    settle(&p.devs);
    let silent = Instant::now();
    let [a, b] = &p.devs;
    let mut ev = Vec::new();
    a.poll_link_events(&mut ev);
    // B stops servicing (a hung or killed host whose link stays up).
    let end = Instant::now() + Duration::from_secs(5);
    ev.clear();
    while ev.is_empty() {
        a.poll_link_events(&mut ev);
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (seen, at_most) = (silent.elapsed(), since.elapsed());
    eprintln!("silent peer declared down after {seen:?} (heartbeat timeout {heartbeat:?})");
    assert!(
        seen <= death_bound(heartbeat),
        "declared down after {seen:?}, beyond {:?}",
        death_bound(heartbeat)
    );
    assert!(
        at_most >= heartbeat,
        "declared down after at most {at_most:?}, before its timeout"
    );
    assert_eq!(
        ev,
        vec![LinkEvent::Down {
            peer: 1,
            generation: b.generation()
        }]
    );
    // Its old generation is not brought up again; a new one is. B itself,
    // servicing again (it had only paused), is told: its link to A is down
    // too, instead of B writing on to a side that takes it for gone.
    b.service().unwrap();
    a.service().unwrap();
    assert!(!a.link(1).unwrap().up);
    assert!(
        !b.link(0).unwrap().up,
        "the paused side still sees the link up"
    );
    let mb = IntelNtbModel::attach(&p.mem, B2bSide::Dsd);
    let b2 = Arc::new(mb.device(cfg, false).unwrap());
    let end = Instant::now() + Duration::from_secs(5);
    while a.link(1).unwrap().generation != b2.generation() {
        b2.service().unwrap();
        assert!(Instant::now() < end);
    }
}

/// A side that does not judge its peer's heartbeat (the library's
/// default) still beats, so a peer that judges (as the apps do) does not
/// declare it gone while it services its device.
#[test]
fn a_side_without_a_heartbeat_timeout_still_beats_for_a_peer_that_judges() {
    let judging = IntelConfig {
        heartbeat_timeout: Some(4 * ntbdk_pmd::hw::intel::BEAT_PERIOD),
        ..IntelConfig::default()
    };
    let mem = ModelMemory::create(IntelPart::Gen3Skx, BAR, DRAM).unwrap();
    let ma = IntelNtbModel::attach(&mem, B2bSide::Usd);
    let mb = IntelNtbModel::attach(&mem, B2bSide::Dsd);
    let a = ma.device(judging, false).unwrap();
    let b = mb.device(IntelConfig::default(), false).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !(a.link(1).unwrap().up && b.link(0).unwrap().up) {
        a.service().unwrap();
        b.service().unwrap();
        assert!(Instant::now() < end, "no handshake");
    }
    // Five of A's timeouts, both servicing (B first: after a stall of the
    // test's thread B beats at once, before A judges).
    let end = Instant::now() + 20 * ntbdk_pmd::hw::intel::BEAT_PERIOD;
    while Instant::now() < end {
        b.service().unwrap();
        a.service().unwrap();
        assert!(a.link(1).unwrap().up, "A declared a live B gone");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A peer that comes back again and again (each time a new generation)
/// beside a side that never asks for its link events: the list they wait in
/// stays bounded, and the link state stays current.
#[test]
fn link_events_nobody_asks_for_are_bounded() {
    let mem = ModelMemory::create(IntelPart::Gen3Skx, BAR, DRAM).unwrap();
    let ma = IntelNtbModel::attach(&mem, B2bSide::Usd);
    let a = ma.device(IntelConfig::default(), false).unwrap();
    let mut last = 0;
    for _ in 0..100 {
        let mb = IntelNtbModel::attach(&mem, B2bSide::Dsd);
        let b = mb.device(IntelConfig::default(), false).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while a.link(1).unwrap().generation != b.generation() {
            b.service().unwrap();
            assert!(Instant::now() < end, "no handshake");
        }
        last = b.generation();
    }
    assert_eq!(a.link(1).unwrap().generation, last);
    let mut ev = Vec::new();
    let n = a.poll_link_events(&mut ev);
    assert!(n <= 64, "{n} link events kept");
    // The newest is kept: the current generation's coming up.
    assert!(
        ev.iter()
            .any(|e| matches!(e, LinkEvent::Up { generation, .. } if *generation == last)),
        "{ev:?}"
    );
}
