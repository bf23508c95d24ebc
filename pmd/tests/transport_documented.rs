//! Behaviours the transport documents that no other test pins down, each
//! checked so that the test fails when the behaviour breaks: operations
//! towards a silent peer time out, a peer speaking another protocol version
//! fails the handshake (and connects once it speaks ours), non-temporal
//! copies move every byte, and an extent longer than one SGL entry can
//! carry is split and moved end to end.

mod transport_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::loopback::{LoopbackDevice, LoopbackFabric};
use ntbdk_pmd::transport::inject::Injector;
use ntbdk_pmd::transport::wire::{Hello, SGE_MAX_LEN, TAG_OFFSET};
use ntbdk_pmd::transport::{
    Access, Config, CpuEngine, Geometry, Layout, MIN_NT_THRESHOLD, OpKind, PeerState, RemoteAddr,
    Sge, Status, Transport, TransportError, VERSION, default_nt_threshold,
};
use transport_common::{Rng, collect, connect_all, drain};

fn geo(n: u16) -> Geometry {
    Geometry {
        ports: n,
        queue_depth: 32,
        eager_count: 16,
        eager_size: 1024,
        data: ntbdk_pmd::transport::DataQueues::NONE,
    }
}

/// Two transports with `cfg` on a loopback fabric of `window`-byte windows,
/// connected.
fn pair(window: usize, cfg: &Config) -> (Arc<LoopbackFabric>, Vec<Transport>) {
    let fabric = LoopbackFabric::new(2, window);
    let mut ts: Vec<Transport> = (0..2)
        .map(|p| {
            let dev: Arc<LoopbackDevice> = Arc::new(fabric.join(p).unwrap());
            Transport::new(dev, cfg.clone()).unwrap()
        })
        .collect();
    connect_all(&mut ts);
    (fabric, ts)
}

/// One SGE over `len` bytes of `key` from `offset`.
fn sge(key: ntbdk_pmd::transport::RegionKey, offset: u64, len: u64) -> Sge {
    Sge { key, offset, len }
}

// ---- operation timeouts ----

#[test]
fn operations_towards_a_silent_peer_complete_with_timeout() {
    // Port 1 connects, then never polls again (a hung process whose link
    // stays up): nothing we ask of it is answered. Every kind of operation
    // fails with `Status::Timeout` once `op_timeout` passes without
    // progress — not before, and not much after.
    let op_timeout = Duration::from_millis(300);
    let mut cfg = Config::new(geo(2));
    cfg.op_timeout = op_timeout;
    let (_f, mut ts) = pair(8 << 20, &cfg);
    let q = ts[0].create_qp(1).unwrap();
    let remote = ts[1].register_region(64 << 10, Access::ALL).unwrap();
    let free0 = ts[0].region_area_free();
    let src = ts[0].register_region(64 << 10, Access::LOCAL).unwrap();
    let dst = ts[0].register_region(64 << 10, Access::LOCAL).unwrap();
    let at = RemoteAddr {
        key: remote,
        offset: 0,
    };
    let posted = Instant::now();
    ts[0]
        .post_write(q, &[sge(src, 0, 64 << 10)], at, 1)
        .unwrap();
    ts[0].post_read(q, &[sge(dst, 0, 4096)], at, 2).unwrap();
    ts[0].post_read_unknown(q, at, 1 << 20, 3).unwrap();
    assert_eq!(ts[0].outstanding(), 3);
    let mut got = Vec::new();
    let end = posted + op_timeout + Duration::from_secs(5);
    while got.len() < 3 {
        got.extend(drain(&mut ts[0]));
        assert!(
            Instant::now() < end,
            "operations towards a silent peer did not time out: {got:?}"
        );
    }
    let took = posted.elapsed();
    got.sort_by_key(|c| c.cookie);
    let kinds: Vec<_> = got.iter().map(|c| (c.cookie, c.op, c.status)).collect();
    assert_eq!(
        kinds,
        [
            (1, OpKind::Write, Status::Timeout),
            (2, OpKind::Read, Status::Timeout),
            (3, OpKind::ReadUnknown, Status::Timeout),
        ]
    );
    assert!(got.iter().all(|c| c.bytes == 0 && c.region.is_none()));
    assert!(
        took >= op_timeout,
        "timed out after {took:?}, before the {op_timeout:?} timeout"
    );
    eprintln!("operations timed out after {took:?} (op_timeout {op_timeout:?})");
    assert_eq!(ts[0].outstanding(), 0);
    assert_eq!(ts[0].counters(q).failed_ops, 3);
    // Still connected: a timeout fails the operation, not the connection.
    assert!(ts[0].is_connected(1));
    // The peer wakes up: the answers to the operations that timed out are
    // dropped, and new operations complete.
    ts[0].region_write(src, 0, &[0x3c; 4096]).unwrap();
    ts[0].post_write(q, &[sge(src, 0, 4096)], at, 4).unwrap();
    let c = loop {
        let c = collect(&mut ts, 0, 1);
        if c[0].cookie == 4 {
            break c;
        }
    };
    assert_eq!(c[0].status, Status::Success, "{c:?}");
    let mut back = [0u8; 4096];
    ts[1].region_read(remote, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x3c));
    ts[0].deregister_region(src).unwrap();
    ts[0].deregister_region(dst).unwrap();
    assert_eq!(
        ts[0].region_area_free(),
        free0,
        "a timed-out read of unknown size left storage behind"
    );
}

// ---- protocol version ----

/// Writes `hello` into `victim`'s mailbox for the injector's port with a
/// fresh `tag`, as a peer's `send_hello` does (body first, tag last).
fn write_hello(inj: &Injector, from: u16, hello: &Hello, tag: u64) {
    let off = Layout::mailbox(from);
    inj.scribble(off + TAG_OFFSET, &0u64.to_le_bytes()).unwrap();
    inj.scribble(off, &hello.encode()).unwrap();
    inj.scribble(off + TAG_OFFSET, &tag.to_le_bytes()).unwrap();
}

#[test]
fn a_protocol_version_mismatch_fails_the_handshake_then_a_matching_peer_connects() {
    let fabric = LoopbackFabric::new(2, 4 << 20);
    let cfg = Config::new(geo(2));
    let mut a = Transport::new(Arc::new(fabric.join(0).unwrap()), cfg.clone()).unwrap();
    // Port 1 is a host of a later release: its hellos carry another
    // version, with the same geometry.
    let future = fabric.join(1).unwrap();
    let inj = Injector::new(&future, 0, *a.layout(), 0).unwrap();
    let g = cfg.geometry;
    let hello = Hello {
        version: VERSION + 1,
        ports: g.ports,
        queue_depth: g.queue_depth,
        eager_count: g.eager_count,
        eager_size: g.eager_size,
        incarnation: 0x1234_5678_9abc,
        seen: 0,
        data: ntbdk_pmd::transport::DataQueues::NONE,
    };
    write_hello(&inj, 1, &hello, 1);
    let end = Instant::now() + Duration::from_secs(5);
    while !matches!(a.peer_state(1), PeerState::Failed(_)) {
        a.progress();
        assert!(Instant::now() < end, "{:?}", a.peer_state(1));
    }
    let PeerState::Failed(reason) = a.peer_state(1) else {
        unreachable!()
    };
    assert!(
        reason.contains("protocol version") && reason.contains(&(VERSION + 1).to_string()),
        "{reason}"
    );
    // The hello that says it has seen us does not connect either.
    write_hello(
        &inj,
        1,
        &Hello {
            seen: a.incarnation(),
            ..hello
        },
        2,
    );
    for _ in 0..2000 {
        a.progress();
    }
    assert!(matches!(a.peer_state(1), PeerState::Failed(_)));
    assert!(!a.is_connected(1));
    let q = a.create_qp(1).unwrap();
    let err = a.post_send(q, b"x", 0).unwrap_err();
    assert!(
        matches!(&err, TransportError::HandshakeFailed { peer: 1, reason } if reason.contains("version")),
        "{err}"
    );
    let err = a.wait_connected(1, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(err, TransportError::HandshakeFailed { peer: 1, .. }),
        "{err}"
    );
    // The host is replaced by one that speaks our version: it connects.
    drop(inj);
    let mut b = Transport::new(Arc::new(future), cfg).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !a.is_connected(1) || !b.is_connected(0) {
        a.progress();
        b.progress();
        assert!(
            Instant::now() < end,
            "{:?} {:?}",
            a.peer_state(1),
            b.peer_state(0)
        );
    }
    let qb = b.create_qp(0).unwrap();
    let rb = b.register_region(64, Access::LOCAL).unwrap();
    b.post_recv(qb, sge(rb, 0, 64), 9).unwrap();
    a.post_send(q, b"same version", 1).unwrap();
    let mut ts = [a, b];
    let c = collect(&mut ts, 1, 1);
    assert_eq!(
        (c[0].cookie, c[0].status, c[0].bytes),
        (9, Status::Success, 12)
    );
}

// ---- non-temporal copies ----

/// Writes `data` from `src` at `src_off` into `dst` at `dst_off` through
/// `sges` pieces, and reads it back into `back` at `back_off` with a read;
/// asserts both completions.
fn write_then_read(
    ts: &mut [Transport],
    lens: &[u64],
    (src, src_off): (ntbdk_pmd::transport::RegionKey, u64),
    (dst, dst_off): (ntbdk_pmd::transport::RegionKey, u64),
    (back, back_off): (ntbdk_pmd::transport::RegionKey, u64),
    cookie: u64,
) {
    let q = ts[0].create_qp(1).unwrap();
    let mut off = 0;
    let pieces: Vec<Sge> = lens
        .iter()
        .map(|&l| {
            let s = sge(src, src_off + off, l);
            off += l;
            s
        })
        .collect();
    let at = RemoteAddr {
        key: dst,
        offset: dst_off,
    };
    ts[0].post_write(q, &pieces, at, cookie).unwrap();
    let c = collect(ts, 0, 1);
    assert_eq!(
        (c[0].cookie, c[0].status, c[0].bytes),
        (cookie, Status::Success, off)
    );
    let mut boff = 0;
    let pieces: Vec<Sge> = lens
        .iter()
        .rev()
        .map(|&l| {
            let s = sge(back, back_off + boff, l);
            boff += l;
            s
        })
        .collect();
    ts[0].post_read(q, &pieces, at, cookie + 1).unwrap();
    let c = collect(ts, 0, 1);
    assert_eq!(
        (c[0].cookie, c[0].status, c[0].bytes),
        (cookie + 1, Status::Success, off)
    );
}

#[test]
fn non_temporal_copies_move_every_byte() {
    // A threshold of 1: every copy of the data path takes the non-temporal
    // path (an unaligned head, 16-byte streaming stores, a tail), with
    // odd offsets and lengths on both sides; a second pass straddles a
    // larger threshold.
    for threshold in [1usize, 4096] {
        let mut cfg = Config::new(geo(2));
        cfg.nt_threshold = threshold;
        let (_f, mut ts) = pair(16 << 20, &cfg);
        let len: u64 = (3 << 20) + 4099;
        let src = ts[0]
            .register_region(len as usize + 64, Access::LOCAL)
            .unwrap();
        let back = ts[0]
            .register_region(len as usize + 64, Access::LOCAL)
            .unwrap();
        let dst = ts[1]
            .register_region_scattered(len as usize + 64, Access::ALL, 64 * 1021)
            .unwrap();
        let mut data = vec![0u8; len as usize];
        Rng(threshold as u64).fill(&mut data);
        ts[0].region_write(src, 3, &data).unwrap();
        // Pieces around the threshold, odd and tiny ones included.
        let mut lens = vec![1, 15, 16, 17, 4095, 4096, 4097, 63, 1 << 20];
        let sum: u64 = lens.iter().sum();
        lens.push(len - sum);
        write_then_read(&mut ts, &lens, (src, 3), (dst, 29), (back, 7), 10);
        let mut got = vec![0u8; len as usize];
        ts[1].region_read(dst, 29, &mut got).unwrap();
        let bad = got.iter().zip(&data).position(|(a, b)| a != b);
        assert!(
            bad.is_none(),
            "threshold {threshold}: written byte {bad:?} differs"
        );
        ts[0].region_read(back, 7, &mut got).unwrap();
        let bad = got.iter().zip(&data).position(|(a, b)| a != b);
        assert!(
            bad.is_none(),
            "threshold {threshold}: read byte {bad:?} differs"
        );
        // Nothing around the destination was touched.
        let mut edge = [0u8; 29];
        ts[1].region_read(dst, 0, &mut edge).unwrap();
        assert_eq!(edge, [0u8; 29]);
        let mut edge = [0u8; 35];
        ts[1].region_read(dst, 29 + len, &mut edge).unwrap();
        assert_eq!(edge, [0u8; 35]);
    }
}

/// The largest of CPU 0's caches as sysfs lists them (`48K`, `32M`...).
fn largest_cache() -> Option<usize> {
    std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache")
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| {
            let s = s.trim();
            let (num, mult) = match s.chars().last()? {
                'K' => (&s[..s.len() - 1], 1usize << 10),
                'M' => (&s[..s.len() - 1], 1 << 20),
                'G' => (&s[..s.len() - 1], 1 << 30),
                _ => (s, 1),
            };
            num.parse::<usize>().ok().map(|n| n * mult)
        })
        .max()
}

#[test]
fn the_default_nt_threshold_is_the_largest_cache_and_at_least_the_floor() {
    // As documented: the last-level cache size, at least MIN_NT_THRESHOLD,
    // 8 MiB where the cache size is unknown; the default engine and the
    // default configuration use it.
    let want = largest_cache().unwrap_or(8 << 20).max(MIN_NT_THRESHOLD);
    assert_eq!(default_nt_threshold(), want);
    assert_eq!(MIN_NT_THRESHOLD, 2 << 20);
    assert_eq!(CpuEngine::default().nt_threshold, want);
    assert_eq!(Config::new(geo(2)).nt_threshold, want);
}

// ---- one extent longer than an SGL entry carries ----

#[test]
fn an_extent_over_16_mib_is_split_and_moved_end_to_end() {
    // A contiguous region is one extent; an SGL entry carries at most
    // SGE_MAX_LEN (16 MiB - 1) bytes, so the target splits the extent
    // into several entries for a write, and the reader its destination
    // for a read. Every byte must land once, in place.
    let len = u64::from(SGE_MAX_LEN) + 1 + 8191;
    let mut cfg = Config::new(geo(2));
    cfg.op_timeout = Duration::from_secs(60);
    let (_f, mut ts) = pair(40 << 20, &cfg);
    let src = ts[0].register_region(len as usize, Access::LOCAL).unwrap();
    let back = ts[0].register_region(len as usize, Access::LOCAL).unwrap();
    let dst = ts[1]
        .register_region(len as usize + 4096, Access::ALL)
        .unwrap();
    let mut data = vec![0u8; len as usize];
    Rng(16).fill(&mut data);
    ts[0].region_write(src, 0, &data).unwrap();
    write_then_read(&mut ts, &[len], (src, 0), (dst, 5), (back, 0), 20);
    let mut got = vec![0u8; len as usize];
    ts[1].region_read(dst, 5, &mut got).unwrap();
    let bad = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(bad.is_none(), "written byte {bad:?} differs");
    ts[0].region_read(back, 0, &mut got).unwrap();
    let bad = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(bad.is_none(), "read byte {bad:?} differs");
    let q = ts[0].create_qp(1).unwrap();
    let c = ts[0].counters(q);
    assert_eq!((c.writes, c.reads), (1, 1));
    assert_eq!(c.bytes_out, len);
}
