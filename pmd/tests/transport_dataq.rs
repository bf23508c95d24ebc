//! Data queues on the emulated fabric: bursts of mbufs with every byte and
//! every user word checked, each mbuf delivered once and in place (no copy),
//! pools back to full after a run, after a peer's death and after the
//! application dropped mbufs on the floor, several queues driven from
//! several threads at once, back-pressure on exhaustion, and the same
//! between two processes.

mod transport_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ntbdk_mempool::ZoneOptions;
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuFabric, FabricConfig};
use ntbdk_pmd::hw::{NtbDevice, Port};
use ntbdk_pmd::mbuf::{Mbuf, MbufPool};
use ntbdk_pmd::transport::{
    Config, DataPart, DataQueue, DataQueues, Geometry, Transport, TransportError,
    wire::{SLOT, TAG_OFFSET},
};
use transport_common::{RoleChild, TestDir, child_role, env};

const LONG: Duration = Duration::from_secs(30);

fn geometry(queues: u16, nb_desc: u32, buf_size: u32) -> Geometry {
    Geometry {
        data: DataQueues {
            count: queues,
            nb_desc,
            buf_size,
        },
        ..Geometry::small(2)
    }
}

fn fabric(dir: &TestDir, name: &str, g: &Geometry) -> EmuFabric {
    let window = g.layout().unwrap().window_size_for(256 << 10);
    let fc = FabricConfig {
        slots: 2,
        window_size: window.next_multiple_of(1 << 20),
        // No host here dies unannounced: a loaded machine's stall must not
        // drop a live one.
        heartbeat_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    EmuFabric::create_in(dir.path(), name, &fc).unwrap()
}

fn host(fabric: &EmuFabric, dir: &TestDir, slot: Port, g: Geometry) -> Transport {
    let d = fabric
        .join(&DeviceConfig {
            slot: Some(slot),
            dir: Some(dir.path().to_owned()),
            ..Default::default()
        })
        .unwrap();
    Transport::new(Arc::new(d), Config::new(g)).unwrap()
}

fn connect(ts: &mut [Transport]) {
    let end = Instant::now() + LONG;
    while !(ts[0].is_connected(1) && ts[1].is_connected(0)) {
        for t in ts.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end, "no connection within {LONG:?}");
    }
}

/// Two hosts on a fabric of their own (fields drop in order: transports,
/// the fabric, then its directory).
struct Hosts {
    ts: Vec<Transport>,
    _f: EmuFabric,
    _dir: TestDir,
}

/// Two hosts, not yet connected: take their queues, then
/// `connect(&mut h.ts)`. Bind the queues after the hosts, so they drop
/// first.
fn hosts(tag: &str, g: Geometry) -> Hosts {
    let dir = TestDir::new(tag);
    let f = fabric(&dir, tag, &g);
    let ts = vec![host(&f, &dir, 0, g), host(&f, &dir, 1, g)];
    Hosts {
        ts,
        _f: f,
        _dir: dir,
    }
}

/// Two connected hosts, with data queue 0 of host 0 towards host 1 (`tx`)
/// and of host 1 towards host 0 (`rx`). Bind all three: the queues, bound
/// after the hosts, drop before them.
fn pair(tag: &str, g: Geometry) -> (Hosts, DataQueue, DataQueue) {
    let mut h = hosts(tag, g);
    let tx = h.ts[0].data_queue(1, 0).unwrap();
    let rx = h.ts[1].data_queue(0, 0).unwrap();
    connect(&mut h.ts);
    (h, tx, rx)
}

/// Payload of message `seq`: its length and bytes follow from `seq` alone.
fn payload(seq: u64, max: usize) -> Vec<u8> {
    let len = 1 + (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % max;
    (0..len)
        .map(|i| (seq as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

fn pool(name: &str, count: u32, room: usize) -> MbufPool {
    MbufPool::create(name, count, room, 32, &ZoneOptions::no_huge()).unwrap()
}

/// Sends `count` messages (sequence in the user word) through `q`.
fn send_all(q: &mut DataQueue, pool: &MbufPool, count: u64, max: usize, burst: usize) {
    let mut seq = 0;
    let mut batch: Vec<Mbuf> = Vec::with_capacity(burst);
    let end = Instant::now() + LONG;
    while seq < count || !batch.is_empty() {
        while batch.len() < burst && seq < count {
            let mut m = pool.alloc().expect("the sender's pool has room");
            m.append(&payload(seq, max)).unwrap();
            m.set_user(seq);
            batch.push(m);
            seq += 1;
        }
        q.tx_burst(&mut batch);
        assert!(
            Instant::now() < end,
            "sent {seq} of {count} within {LONG:?}"
        );
    }
}

/// Receives `count` messages from `q`, checking order, user words and every
/// byte; frees them in bulk.
fn receive_all(q: &mut DataQueue, count: u64, max: usize, burst: usize) {
    let mut next = 0u64;
    let mut got: Vec<Mbuf> = Vec::with_capacity(burst);
    let end = Instant::now() + LONG;
    while next < count {
        q.rx_burst(&mut got, burst);
        for m in &got {
            assert_eq!(m.user(), next, "messages out of order or lost");
            assert!(m.is_shared() && m.data().is_none());
            assert_eq!(m.to_vec(), payload(next, max), "message {next} corrupted");
            assert_eq!((m.port(), m.queue()), (q.peer(), q.queue()));
            next += 1;
        }
        Mbuf::free_bulk(&mut got);
        assert!(Instant::now() < end, "received {next} of {count}");
    }
}

/// Sets its flag when dropped, so control threads stop even when a check
/// in the scope that owns it panics (no hang instead of a failure).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Polls both transports (the control path) until `stop`.
fn control(ts: &mut [Transport], stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        for t in ts.iter_mut() {
            t.progress();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn bursts_deliver_every_byte_once_and_pools_come_back_full() {
    let g = geometry(1, 64, 256);
    let (mut hosts, mut tx, mut rx) = pair("dataq-bytes", g);
    let txp = pool("dataq-bytes-tx", 256, 256);
    const N: u64 = 50_000;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sender = s.spawn(|| send_all(&mut tx, &txp, N, 256, 32));
        let receiver = s.spawn(|| receive_all(&mut rx, N, 256, 32));
        s.spawn(|| control(&mut hosts.ts, &stop));
        let _stop = StopOnDrop(&stop);
        sender.join().unwrap();
        receiver.join().unwrap();
    });
    assert_eq!(txp.available(), txp.size(), "every sent mbuf freed");
    // Every receive buffer is lent to the sender or free: none leaked.
    rx.rx_burst(&mut Vec::new(), 0);
    assert_eq!(rx.rx_lent() + rx.rx_pool_available(), rx.rx_pool_size());
    let (ts_, rs) = (tx.stats(), rx.stats());
    assert_eq!((ts_.tx, rs.rx), (N, N));
    assert_eq!(ts_.tx_bytes, rs.rx_bytes);
    assert_eq!((rs.bad_desc, ts_.bad_lend), (0, 0));
}

#[test]
fn a_received_mbuf_is_the_buffer_the_peer_wrote() {
    let g = geometry(1, 16, 128);
    let (hosts, mut tx, mut rx) = pair("dataq-inplace", g);
    let txp = pool("dataq-inplace-tx", 16, 128);
    let mut got = Vec::new();
    let end = Instant::now() + LONG;
    let mut m = txp.alloc().unwrap();
    m.append(&[0x11; 100]).unwrap();
    let mut one = vec![m];
    while got.is_empty() {
        tx.tx_burst(&mut one);
        rx.rx_burst(&mut got, 1);
        assert!(Instant::now() < end);
    }
    assert_eq!(got[0].to_vec(), vec![0x11; 100]);
    // The sender's raw window: overwrite every receive buffer of the queue.
    // The mbuf held by the receiver sees it — it was never copied out.
    let layout = g.layout().unwrap();
    let raw = hosts.ts[0].device().peer_window(1, 0).unwrap();
    let bufs = layout.data_part(0, 0, DataPart::Bufs);
    raw.write(bufs, &vec![0xEE; 16 * 128]).unwrap();
    assert_eq!(got[0].to_vec(), vec![0xEE; 100], "the mbuf is not in place");
    assert_eq!(got[0].load_u8(99), Some(0xEE));
    assert_eq!(got[0].load_u8(100), None);
}

/// The sender sends into the buffers lent last: one message at a time,
/// received and freed at once, keeps reusing the last lend batch or two
/// (the receiver lends a quarter of a 256-deep queue at a time) instead of
/// writing every one of `nb_desc` in turn, which, with large buffers, spills
/// the caches. Counted through the receiver's window: a buffer never used
/// still holds zeros.
#[test]
fn the_sender_reuses_the_buffers_lent_last() {
    let (nb_desc, buf) = (256u32, 128usize);
    let g = geometry(1, nb_desc, buf as u32);
    let (hosts, mut tx, mut rx) = pair("dataq-reuse", g);
    let txp = pool("dataq-reuse-tx", 16, buf);
    let mut got = Vec::new();
    let end = Instant::now() + LONG;
    for _ in 0..2000 {
        let mut m = txp.alloc().unwrap();
        m.append(&[0xAB]).unwrap();
        let mut one = vec![m];
        // The receiver lends its buffers from its bursts.
        while got.is_empty() {
            tx.tx_burst(&mut one);
            rx.rx_burst(&mut got, 1);
            assert!(Instant::now() < end, "a message did not arrive");
        }
        Mbuf::free_bulk(&mut got);
    }
    let layout = g.layout().unwrap();
    let win = hosts.ts[1].device().local_window(0).unwrap();
    let bufs = layout.data_part(0, 0, DataPart::Bufs);
    let mut used = 0;
    for b in 0..nb_desc as usize {
        let mut first = [0u8; 1];
        win.read(bufs + b * buf, &mut first).unwrap();
        used += usize::from(first[0] == 0xAB);
    }
    assert!(used >= 1, "no buffer was written");
    assert!(
        used <= nb_desc as usize / 2,
        "{used} of {nb_desc} buffers were written for one message in flight"
    );
}

/// Descriptors travel up to three to a slot; bursts of any size take them
/// in order, one slot split over several bursts included.
#[test]
fn descriptors_three_to_a_slot_arrive_in_order_in_bursts_of_any_size() {
    let g = geometry(1, 16, 128);
    let (hosts, mut tx, mut rx) = pair("dataq-packed", g);
    let txp = pool("dataq-packed-tx", 32, 128);
    rx.rx_burst(&mut Vec::new(), 0); // lends every buffer
    let mut batch: Vec<Mbuf> = (0..7u64)
        .map(|i| {
            let mut m = txp.alloc().unwrap();
            m.append(&[i as u8; 10]).unwrap();
            m.set_user(i);
            m
        })
        .collect();
    assert_eq!(
        tx.tx_burst(&mut batch),
        7,
        "seven in one burst: three slots"
    );
    // The receiver's descriptor ring, as the sender's device reads it: the
    // counts 3, 3 and 1 in the first three slots, the fourth never tagged.
    let (layout, dev) = (*hosts.ts[1].layout(), hosts.ts[0].device().clone());
    let desc = layout.data_part(0, 0, DataPart::Desc);
    let word = |off: usize| {
        let mut b = [0u8; 8];
        dev.non_posted_read(1, 0, off, &mut b).unwrap();
        u64::from_le_bytes(b)
    };
    let counts: Vec<u64> = (0..3).map(|i| word(desc + i * SLOT)).collect();
    assert_eq!(counts, [3, 3, 1]);
    assert_eq!(
        word(desc + 3 * SLOT + TAG_OFFSET),
        0,
        "a fourth slot written"
    );
    let mut seen = Vec::new();
    for max in [1, 2, 1, 3, 5] {
        let mut got = Vec::new();
        let n = rx.rx_burst(&mut got, max);
        assert!(n <= max);
        for m in &got {
            assert_eq!(m.to_vec(), vec![m.user() as u8; 10]);
            seen.push(m.user());
        }
    }
    assert_eq!(seen, (0..7).collect::<Vec<_>>());
    assert_eq!(rx.stats().bad_desc, 0);
}

#[test]
fn exhaustion_is_back_pressure_and_dropped_mbufs_come_back() {
    let g = geometry(1, 16, 64);
    let (_hosts, mut tx, mut rx) = pair("dataq-exhaust", g);
    let txp = pool("dataq-exhaust-tx", 64, 64);
    // The receiver holds everything it gets: after 16 the sender stalls.
    let mut held = Vec::new();
    let mut batch = Vec::new();
    txp.alloc_bulk(40, &mut batch).unwrap();
    for (i, m) in batch.iter_mut().enumerate() {
        m.append(&[i as u8; 8]).unwrap();
        m.set_user(i as u64);
    }
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        tx.tx_burst(&mut batch);
        rx.rx_burst(&mut held, 64);
    }
    assert_eq!(held.len(), 16, "only as many as the receive buffers");
    assert_eq!(batch.len(), 40 - 16, "the rest stays with the caller");
    assert!(tx.stats().tx_full > 0);
    assert_eq!(rx.rx_pool_available(), 0);
    // Dropped on the floor (not freed explicitly): back to the pool, lent
    // again, and the rest flows in order.
    let first: Vec<u64> = held.iter().map(|m| m.user()).collect();
    assert_eq!(first, (0..16).collect::<Vec<u64>>());
    drop(held);
    let mut rest = Vec::new();
    let end = Instant::now() + LONG;
    while rest.len() < 24 {
        tx.tx_burst(&mut batch);
        let mut got = Vec::new();
        rx.rx_burst(&mut got, 64);
        rest.extend(got.iter().map(|m| (m.user(), m.to_vec())));
        assert!(Instant::now() < end);
    }
    for (k, (user, bytes)) in rest.iter().enumerate() {
        assert_eq!(*user, 16 + k as u64);
        assert_eq!(bytes, &vec![(16 + k) as u8; 8]);
    }
    rx.rx_burst(&mut Vec::new(), 0);
    assert_eq!(rx.rx_lent() + rx.rx_pool_available(), 16);
    assert_eq!(txp.available(), 64);
}

#[test]
fn buffers_lent_to_a_dead_peer_are_reclaimed() {
    let g = geometry(1, 32, 64);
    let mut h = hosts("dataq-death", g);
    let mut rx = h.ts[1].data_queue(0, 0).unwrap();
    connect(&mut h.ts);
    rx.rx_burst(&mut Vec::new(), 0);
    assert_eq!(rx.rx_lent(), 32, "all buffers lent once connected");
    // The peer goes away (its goodbye tears the connection down).
    let peer = h.ts.remove(0);
    drop(peer);
    let end = Instant::now() + LONG;
    while h.ts[0].is_connected(0) {
        h.ts[0].progress();
        assert!(Instant::now() < end);
    }
    assert!(!rx.is_up());
    assert_eq!(rx.rx_lent(), 0);
    assert_eq!(
        rx.rx_pool_available(),
        32,
        "buffers lent to the dead peer reclaimed"
    );
    assert_eq!(rx.rx_burst(&mut Vec::new(), 32), 0);
}

#[test]
fn several_queues_run_on_several_threads_at_once() {
    let g = geometry(2, 64, 128);
    let mut h = hosts("dataq-multi", g);
    let mut txs: Vec<DataQueue> = (0..2).map(|q| h.ts[0].data_queue(1, q).unwrap()).collect();
    let mut rxs: Vec<DataQueue> = (0..2).map(|q| h.ts[1].data_queue(0, q).unwrap()).collect();
    connect(&mut h.ts);
    let pools: Vec<MbufPool> = (0..2)
        .map(|q| pool(&format!("dataq-multi-{q}"), 128, 128))
        .collect();
    const N: u64 = 20_000;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for (q, p) in txs.iter_mut().zip(&pools) {
            joins.push(s.spawn(move || send_all(q, p, N, 128, 16)));
        }
        for q in rxs.iter_mut() {
            joins.push(s.spawn(move || receive_all(q, N, 128, 16)));
        }
        s.spawn(|| control(&mut h.ts, &stop));
        let _stop = StopOnDrop(&stop);
        for j in joins {
            j.join().unwrap();
        }
    });
    for (t, r) in txs.iter().zip(&rxs) {
        assert_eq!((t.stats().tx, r.stats().rx), (N, N));
    }
}

#[test]
fn queue_errors_say_what_to_do() {
    let dir = TestDir::new("dataq-errors");
    let g = geometry(2, 16, 64);
    let f = fabric(&dir, "dataq-errors", &g);
    let mut t = host(&f, &dir, 0, g);
    assert!(matches!(
        t.data_queue(1, 2),
        Err(TransportError::NoDataQueue { count: 2, .. })
    ));
    assert!(matches!(
        t.data_queue(0, 0),
        Err(TransportError::NoSuchPeer { .. })
    ));
    let _q = t.data_queue(1, 1).unwrap();
    let e = t.data_queue(1, 1).unwrap_err();
    assert!(matches!(e, TransportError::DataQueueTaken { .. }));
    assert!(e.to_string().contains("move that handle"));
}

// ---- between two processes ----

const XN: u64 = 30_000;

/// The dispatcher for child roles; a no-op in a normal test run.
#[test]
fn child_entry() {
    if child_role().as_deref() == Some("sender") {
        sender_child();
    }
}

fn sender_child() {
    let dir: String = env("DQ_DIR");
    let f = EmuFabric::attach_in(std::path::Path::new(&dir), "dataq-xproc").unwrap();
    let g = geometry(1, 128, 512);
    let d = f
        .join(&DeviceConfig {
            slot: Some(1),
            dir: Some(dir.into()),
            ..Default::default()
        })
        .unwrap();
    let mut t = Transport::new(Arc::new(d), Config::new(g)).unwrap();
    let mut q = t.data_queue(0, 0).unwrap();
    t.wait_connected(0, LONG).unwrap();
    let p = pool("dataq-xproc-tx", 512, 512);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                t.progress();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let _stop = StopOnDrop(&stop);
        send_all(&mut q, &p, XN, 512, 32);
        // Stay until the receiver says it has everything.
        let end = Instant::now() + LONG;
        while q.is_up() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert_eq!(p.available(), p.size());
    println!("SENT {}", q.stats().tx);
}

#[test]
fn bursts_between_two_processes_verify_every_byte() {
    let dir = TestDir::new("dataq-xproc");
    let g = geometry(1, 128, 512);
    let f = fabric(&dir, "dataq-xproc", &g);
    let mut t = host(&f, &dir, 0, g);
    let mut q = t.data_queue(1, 0).unwrap();
    let mut child = RoleChild::spawn(
        "child_entry",
        "sender",
        &[("DQ_DIR", dir.path().display().to_string())],
    );
    t.wait_connected(1, LONG).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                t.progress();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let _stop = StopOnDrop(&stop);
        receive_all(&mut q, XN, 512, 32);
    });
    assert_eq!(q.stats().rx, XN);
    drop(t); // goodbye: the child sees the connection go and reports
    let line = child.expect_line("SENT", LONG);
    assert_eq!(line.trim(), XN.to_string());
    assert!(child.wait_success(LONG));
    assert!(!q.is_up(), "our transport is gone");
    assert_eq!(q.rx_pool_available(), q.rx_pool_size());
}

#[test]
fn forged_descriptors_are_refused_and_counted_and_a_good_one_still_lands() {
    use ntbdk_pmd::transport::{epoch, inject::Injector};
    let dir = TestDir::new("dataq-forged");
    let g = geometry(1, 16, 128);
    let f = fabric(&dir, "dataq-forged", &g);
    let rogue_dev = Arc::new(
        f.join(&DeviceConfig {
            slot: Some(0),
            dir: Some(dir.path().to_owned()),
            ..Default::default()
        })
        .unwrap(),
    );
    let rogue = Transport::new(rogue_dev.clone(), Config::new(g)).unwrap();
    let mut ts = vec![rogue, host(&f, &dir, 1, g)];
    let mut rx = ts[1].data_queue(0, 0).unwrap();
    connect(&mut ts);
    rx.rx_burst(&mut Vec::new(), 0); // lends every buffer to the rogue
    let e = epoch(ts[0].incarnation(), ts[1].incarnation());
    let layout = *ts[1].layout();
    let mut inj = Injector::new(&*rogue_dev, 1, layout, e).unwrap();
    // A slot of one descriptor: the count, then buffer, length, user word.
    let desc = |buffer: u32, len: u32, user: u64| {
        let mut b = [0u8; 56];
        b[0..8].copy_from_slice(&1u64.to_le_bytes());
        b[8..12].copy_from_slice(&buffer.to_le_bytes());
        b[12..16].copy_from_slice(&len.to_le_bytes());
        b[16..24].copy_from_slice(&user.to_le_bytes());
        b
    };
    // Which buffer the victim lent first: its FreeQ entry in the rogue's
    // own window.
    let lent = {
        let local = rogue_dev.local_window(0).unwrap();
        let raw = local
            .load_u64(layout.data_part(1, 0, DataPart::FreeQ))
            .unwrap();
        (raw as u32) - 1
    };
    inj.push_descriptor(0, 0, &desc(1000, 8, 0)).unwrap(); // out of range
    inj.push_descriptor(0, 1, &desc(lent, 129, 0)).unwrap(); // longer than a buffer
    let mut got = Vec::new();
    assert_eq!(rx.rx_burst(&mut got, 8), 0);
    assert_eq!(rx.stats().bad_desc, 2);
    // A good one: the payload written into the lent buffer, then named.
    let bufs = layout.data_part(0, 0, DataPart::Bufs);
    inj.scribble(bufs + lent as usize * 128, b"forged but fine")
        .unwrap();
    inj.push_descriptor(0, 2, &desc(lent, 15, 77)).unwrap();
    // Naming the same buffer again (no longer lent) is refused.
    inj.push_descriptor(0, 3, &desc(lent, 15, 78)).unwrap();
    assert_eq!(rx.rx_burst(&mut got, 8), 1);
    assert_eq!(
        (got[0].to_vec(), got[0].user()),
        (b"forged but fine".to_vec(), 77)
    );
    assert_eq!(rx.stats().bad_desc, 3);
    // Slots whose count is not 1..=3 are refused whole.
    for (seq, count) in [(4, 0u64), (5, 4), (6, u64::MAX)] {
        let mut b = desc(lent, 15, 79);
        b[0..8].copy_from_slice(&count.to_le_bytes());
        inj.push_descriptor(0, seq, &b).unwrap();
    }
    assert_eq!(rx.rx_burst(&mut got, 8), 0);
    assert_eq!(rx.stats().bad_desc, 6);
    // A slot of three whose middle one is bad: the other two land.
    let next_lent = |inj_seq: u64| {
        let local = rogue_dev.local_window(0).unwrap();
        let raw = local
            .load_u64(layout.data_part(1, 0, DataPart::FreeQ) + inj_seq as usize * 8)
            .unwrap();
        (raw as u32) - 1
    };
    let (b1, b2) = (next_lent(1), next_lent(2));
    let mut three = desc(b1, 5, 80);
    three[0..8].copy_from_slice(&3u64.to_le_bytes());
    three[24..28].copy_from_slice(&1000u32.to_le_bytes()); // out of range
    three[28..32].copy_from_slice(&5u32.to_le_bytes());
    three[40..44].copy_from_slice(&b2.to_le_bytes());
    three[44..48].copy_from_slice(&6u32.to_le_bytes());
    three[48..56].copy_from_slice(&81u64.to_le_bytes());
    inj.push_descriptor(0, 7, &three).unwrap();
    let mut more = Vec::new();
    assert_eq!(rx.rx_burst(&mut more, 8), 2);
    assert_eq!(
        more.iter().map(|m| (m.len(), m.user())).collect::<Vec<_>>(),
        vec![(5, 80), (6, 81)]
    );
    assert_eq!(rx.stats().bad_desc, 7);
    drop((got, more));
    rx.rx_burst(&mut Vec::new(), 0);
    assert_eq!(rx.rx_lent() + rx.rx_pool_available(), 16, "nothing lost");
}

#[test]
fn sent_mbufs_are_freed_in_batches_of_the_tx_free_threshold() {
    let g = geometry(1, 64, 64);
    let (_hosts, mut tx, mut rx) = pair("dataq-txfree", g);
    tx.set_tx_free_thresh(16);
    let txp = pool("dataq-txfree-tx", 64, 64);
    let end = Instant::now() + LONG;
    // Sent mbufs gathered and not yet freed, as the threshold says.
    let mut held = 0;
    let mut max_held = 0;
    for round in 0..8u8 {
        let mut batch = Vec::new();
        txp.alloc_bulk(6, &mut batch).unwrap();
        for m in batch.iter_mut() {
            m.append(&[round; 8]).unwrap();
        }
        while !batch.is_empty() {
            held += tx.tx_burst(&mut batch);
            if held >= 16 {
                held = 0; // all of them back at once
            }
            max_held = max_held.max(held);
            assert_eq!(txp.available(), 64 - held - batch.len(), "round {round}");
            rx.rx_burst(&mut Vec::new(), 64);
            assert!(Instant::now() < end);
        }
    }
    assert!(max_held >= 6, "sent mbufs were held back: {max_held}");
    let sent = held;
    assert_eq!(tx.tx_done_cleanup(), sent);
    assert_eq!(txp.available(), 64);
    // The default frees each mbuf as it is sent.
    tx.set_tx_free_thresh(0);
    let mut one = vec![txp.alloc().unwrap()];
    while !one.is_empty() {
        tx.tx_burst(&mut one);
        rx.rx_burst(&mut Vec::new(), 64);
        assert!(Instant::now() < end);
    }
    assert_eq!(txp.available(), 64);
}

#[test]
fn split_halves_reflect_through_a_ring_on_four_threads() {
    use ntbdk_pmd::mbuf::MbufRing;
    let g = geometry(1, 64, 256);
    let mut h = hosts("dataq-split", g);
    let (mut a_rx, mut a_tx) = h.ts[0].data_queue(1, 0).unwrap().split();
    let (mut b_rx, mut b_tx) = h.ts[1].data_queue(0, 0).unwrap().split();
    connect(&mut h.ts);
    let txp = pool("dataq-split-tx", 256, 256);
    let (mut ring_in, mut ring_out) = MbufRing::spsc(128).unwrap();
    const N: u64 = 30_000;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| control(&mut h.ts, &stop));
        let _stop = StopOnDrop(&stop);
        let mut joins = Vec::new();
        // A sends N, in order.
        joins.push(s.spawn(|| {
            let mut seq = 0;
            let mut batch = Vec::new();
            let end = Instant::now() + LONG;
            while seq < N || !batch.is_empty() {
                while batch.len() < 16 && seq < N {
                    let mut m = txp.alloc().expect("room in the sender's pool");
                    m.append(&payload(seq, 256)).unwrap();
                    m.set_user(seq);
                    batch.push(m);
                    seq += 1;
                }
                a_tx.tx_burst(&mut batch);
                assert!(Instant::now() < end, "A sent {seq}");
            }
        }));
        // B's rx stage hands every mbuf to its tx stage through the ring.
        let b_rx_stage = s.spawn(move || {
            let mut held = Vec::new();
            let mut moved = 0;
            let end = Instant::now() + LONG;
            while moved < N {
                if held.len() < 32 {
                    b_rx.rx_burst(&mut held, 32);
                }
                moved += ring_in.enqueue_burst(&mut held) as u64;
                assert!(Instant::now() < end, "B's rx stage moved {moved}");
            }
            b_rx
        });
        // B's tx stage sends them back (received mbufs, forwarded as they are).
        joins.push(s.spawn(move || {
            let mut pending = Vec::new();
            let mut back = 0;
            let end = Instant::now() + LONG;
            while back < N {
                let room = 32 - pending.len().min(32);
                ring_out.dequeue_burst(&mut pending, room);
                back += b_tx.tx_burst(&mut pending) as u64;
                assert!(Instant::now() < end, "B's tx stage sent {back}");
            }
        }));
        // A gets them back, in order, every byte.
        joins.push(s.spawn(|| receive_all_rx(&mut a_rx, N, 256, 32)));
        let b_rx = b_rx_stage.join().unwrap();
        for j in joins {
            j.join().unwrap();
        }
        // Every receive buffer B forwarded came back to its pool (or is
        // lent to A again).
        assert_eq!(b_rx.pool_available() + b_rx.lent(), b_rx.pool_size());
    });
    assert_eq!(txp.available(), txp.size());
}

/// `receive_all` for a receive half.
fn receive_all_rx(q: &mut ntbdk_pmd::transport::RxQueue, count: u64, max: usize, burst: usize) {
    let mut next = 0u64;
    let mut got: Vec<Mbuf> = Vec::with_capacity(burst);
    let end = Instant::now() + LONG;
    while next < count {
        q.rx_burst(&mut got, burst);
        for m in &got {
            assert_eq!(m.user(), next, "messages out of order or lost");
            assert_eq!(m.to_vec(), payload(next, max), "message {next} corrupted");
            next += 1;
        }
        Mbuf::free_bulk(&mut got);
        assert!(Instant::now() < end, "received {next} of {count}");
    }
}

/// One transport per window in a process: a second transport on the same
/// device is refused while the first lives, and after it, while an mbuf it
/// received (its buffer lies in the window) is alive; then it may start.
#[test]
fn a_window_runs_one_transport_and_outlives_it_in_its_received_mbufs() {
    let g = geometry(1, 16, 128);
    let (mut hosts, mut tx, mut rx) = pair("dataq-claim", g);
    let dev = hosts.ts[1].device().clone();
    let in_use = |dev: &Arc<dyn ntbdk_pmd::hw::NtbDevice>| {
        matches!(
            Transport::new(dev.clone(), Config::new(g)),
            Err(TransportError::WindowInUse { mw: 0 })
        )
    };
    assert!(in_use(&dev), "a second transport on a live one's window");
    let txp = pool("dataq-claim-tx", 16, 128);
    let mut m = txp.alloc().unwrap();
    m.append(&[0x22; 64]).unwrap();
    let (mut one, mut got) = (vec![m], Vec::new());
    let end = Instant::now() + LONG;
    while got.is_empty() {
        tx.tx_burst(&mut one);
        rx.rx_burst(&mut got, 1);
        for t in hosts.ts.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end);
    }
    // The receiving transport and its queue go; the mbuf stays.
    drop(rx);
    drop(hosts.ts.pop());
    assert!(in_use(&dev), "a new transport while a received mbuf lives");
    assert_eq!(got[0].to_vec(), vec![0x22; 64]);
    drop(got);
    Transport::new(dev, Config::new(g)).expect("the window is free again");
}

/// The claim is recorded by the window's address, so a transport dropped
/// in one thread must not leave a record behind a window that is already
/// unmapped: a new window mapped at that address in another thread would be
/// refused as in use. Threads build and drop transports on fabrics of their
/// own, over and over; none may be refused.
#[test]
fn a_dropped_transport_leaves_no_claim_for_another_threads_new_window() {
    let g = geometry(1, 16, 128);
    let turns = if cfg!(debug_assertions) { 40 } else { 150 };
    std::thread::scope(|s| {
        for th in 0..3 {
            s.spawn(move || {
                for turn in 0..turns {
                    // Every turn: a fabric, two transports over windows it
                    // maps, all dropped again.
                    let h = hosts(&format!("dataq-reuse-{th}-{turn}"), g);
                    drop(h);
                }
            });
        }
    });
}

/// Sends messages `seqs` through `tx`, the receiver `rx` lending buffers
/// meanwhile; returns once all are sent.
fn send_seqs(
    tx: &mut DataQueue,
    rx: &mut DataQueue,
    ts: &mut [Transport],
    pool: &MbufPool,
    seqs: std::ops::Range<u64>,
) {
    let mut batch: Vec<Mbuf> = seqs
        .map(|seq| {
            let mut m = pool.alloc().unwrap();
            m.append(&payload(seq, 128)).unwrap();
            m.set_user(seq);
            m
        })
        .collect();
    let end = Instant::now() + LONG;
    while !batch.is_empty() {
        rx.rx_burst(&mut Vec::new(), 0); // lends free buffers
        tx.tx_burst(&mut batch);
        for t in ts.iter_mut() {
            t.progress();
        }
        assert!(Instant::now() < end, "{} left unsent", batch.len());
    }
}

/// A connection restarted while both hosts live (host 0's transport is
/// replaced): the receiving queue starts over under the new epoch (one more
/// in `resets`), the mbufs it handed out before stay whole, the new
/// connection's traffic arrives in order, and every receive buffer comes
/// back.
#[test]
fn a_queue_starts_over_when_its_peer_restarts_and_keeps_what_it_handed_out() {
    let g = geometry(1, 16, 128);
    let dir = TestDir::new("dataq-restart");
    let f = fabric(&dir, "dataq-restart", &g);
    let mut ts = vec![host(&f, &dir, 0, g), host(&f, &dir, 1, g)];
    let mut tx = ts[0].data_queue(1, 0).unwrap();
    let mut rx = ts[1].data_queue(0, 0).unwrap();
    connect(&mut ts);
    let txp = pool("dataq-restart-tx", 64, 128);
    send_seqs(&mut tx, &mut rx, &mut ts, &txp, 0..8);
    let mut kept = Vec::new();
    let end = Instant::now() + LONG;
    while kept.len() < 8 {
        let want = 8 - kept.len();
        rx.rx_burst(&mut kept, want);
        assert!(Instant::now() < end, "received {} of 8", kept.len());
    }
    let resets = rx.stats().resets;

    // Host 0 restarts; host 1 and its queue live on.
    drop(tx);
    drop(ts.remove(0));
    ts.insert(0, host(&f, &dir, 0, g));
    let mut tx = ts[0].data_queue(1, 0).unwrap();
    connect(&mut ts);
    send_seqs(&mut tx, &mut rx, &mut ts, &txp, 100..108);
    let mut got = Vec::new();
    let end = Instant::now() + LONG;
    while got.len() < 8 {
        let want = 8 - got.len();
        rx.rx_burst(&mut got, want);
        assert!(Instant::now() < end, "received {} of 8 after", got.len());
    }
    let users: Vec<u64> = got.iter().map(Mbuf::user).collect();
    assert_eq!(users, (100..108).collect::<Vec<_>>());
    for m in got.iter().chain(&kept) {
        assert_eq!(m.to_vec(), payload(m.user(), 128), "message {}", m.user());
    }
    assert_eq!(rx.stats().resets, resets + 1);
    assert_eq!(rx.stats().bad_desc, 0);
    drop((got, kept));
    assert_eq!(rx.rx_pool_available() + rx.rx_lent(), rx.rx_pool_size());
}

/// An mbuf longer than the peer's buffers is dropped (freed, counted in
/// `tx_oversize` and in the count returned, as the README says); the ones
/// around it go through in order.
#[test]
fn an_oversize_mbuf_is_dropped_counted_and_the_rest_go_through() {
    let g = geometry(1, 16, 64);
    let (mut hosts, mut tx, mut rx) = pair("dataq-oversize", g);
    let txp = pool("dataq-oversize-tx", 8, 256);
    let mut batch: Vec<Mbuf> = [(0u64, 10usize), (1, 65), (2, 64)]
        .iter()
        .map(|&(seq, len)| {
            let mut m = txp.alloc().unwrap();
            m.append(&vec![seq as u8; len]).unwrap();
            m.set_user(seq);
            m
        })
        .collect();
    let end = Instant::now() + LONG;
    let mut handled = 0;
    while !batch.is_empty() {
        rx.rx_burst(&mut Vec::new(), 0);
        handled += tx.tx_burst(&mut batch);
        hosts.ts.iter_mut().for_each(|t| {
            t.progress();
        });
        assert!(Instant::now() < end);
    }
    assert_eq!(handled, 3);
    assert_eq!(tx.stats().tx_oversize, 1);
    assert_eq!(tx.stats().tx, 2);
    let mut got = Vec::new();
    let end = Instant::now() + LONG;
    while got.len() < 2 {
        let want = 2 - got.len();
        rx.rx_burst(&mut got, want);
        assert!(Instant::now() < end);
    }
    let seen: Vec<(u64, usize)> = got.iter().map(|m| (m.user(), m.len())).collect();
    assert_eq!(seen, [(0, 10), (2, 64)]);
    drop(got);
    assert_eq!(
        txp.available(),
        txp.size(),
        "the dropped mbuf was not freed"
    );
}
