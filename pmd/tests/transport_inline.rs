//! Tests of inline sends that span consecutive PostQ slots: every byte
//! delivered in order, and malformed runs from a peer dropped and counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::loopback::{LoopbackDevice, LoopbackFabric};
use ntbdk_pmd::transport::inject::Injector;
use ntbdk_pmd::transport::wire::{self, BODY, INLINE_LONG_MAX, INLINE_MAX, INLINE_SLOTS_MAX};
use ntbdk_pmd::transport::{
    Access, Completion, Config, DropKind, Geometry, OpKind, Qp, Ring, Sge, Status, Transport, epoch,
};

fn pair() -> (Arc<LoopbackDevice>, Transport, Transport) {
    let fabric = LoopbackFabric::new(2, 1 << 20);
    let cfg = Config::new(Geometry::small(2));
    let dev = Arc::new(fabric.join(0).unwrap());
    let mut a = Transport::new(dev.clone(), cfg.clone()).unwrap();
    let mut b = Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !a.is_connected(1) || !b.is_connected(0) {
        assert!(Instant::now() < end, "no connection within 10 s");
        a.progress();
        b.progress();
    }
    (dev, a, b)
}

/// Receives (reposting) until `want` receive completions arrived.
fn recvs(t: &mut Transport, want: usize) -> Vec<Completion> {
    let end = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 16];
    while got.len() < want {
        assert!(
            Instant::now() < end,
            "only {} of {want} receives",
            got.len()
        );
        let n = t.poll_completions(&mut buf);
        got.extend(buf[..n].iter().filter(|c| c.op == OpKind::Recv).copied());
    }
    got
}

/// Sends `msg` from `a` on `qa`, progressing both sides while the peer's
/// queue is busy.
fn send(a: &mut Transport, b: &mut Transport, qa: Qp, msg: &[u8]) {
    let end = Instant::now() + Duration::from_secs(10);
    while a.post_send(qa, msg, 0).is_err() {
        assert!(
            Instant::now() < end,
            "send of {} bytes stayed busy",
            msg.len()
        );
        a.progress();
        b.progress();
    }
}

#[test]
fn sends_of_every_length_arrive_intact_and_in_order() {
    let (_dev, mut a, mut b) = pair();
    let qa = a.create_qp(1).unwrap();
    let qb = b.create_qp(0).unwrap();
    let slot = 256u64;
    let region = b.register_region(4 * slot as usize, Access::LOCAL).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    // 1..=256 covers one slot, two to four slots and the eager path.
    for len in 1..=256usize {
        let cookie = len as u64 % 4;
        let sge = Sge {
            key: region,
            offset: cookie * slot,
            len: slot,
        };
        b.post_recv(qb, sge, cookie).unwrap();
        let msg: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        send(&mut a, &mut b, qa, &msg);
        let c = recvs(&mut b, 1)[0];
        assert_eq!(c.status, Status::Success, "len {len}");
        assert_eq!((c.bytes, c.cookie), (len as u64, cookie));
        let mut got = vec![0u8; len];
        b.region_read(region, cookie * slot, &mut got).unwrap();
        assert_eq!(got, msg, "len {len}");
        a.progress();
    }
    assert_eq!(b.counters(qb).dropped_total(), 0);
}

/// A receive buffer made of several extents: the payload, taken from its
/// slots, is split across them (a slot's piece across an extent's end).
#[test]
fn sends_land_across_the_extents_of_a_scattered_receive() {
    let (_dev, mut a, mut b) = pair();
    let qa = a.create_qp(1).unwrap();
    let qb = b.create_qp(0).unwrap();
    let region = b
        .register_region_scattered(4096, Access::LOCAL, 40)
        .unwrap();
    for len in 1..=INLINE_LONG_MAX {
        // At offsets that put extent ends anywhere in the payload.
        let offset = (len as u64 * 7) % 64;
        let sge = Sge {
            key: region,
            offset,
            len: INLINE_LONG_MAX as u64,
        };
        b.post_recv(qb, sge, len as u64).unwrap();
        let msg: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
        send(&mut a, &mut b, qa, &msg);
        let c = recvs(&mut b, 1)[0];
        assert_eq!(
            (c.status, c.bytes, c.cookie),
            (Status::Success, len as u64, len as u64)
        );
        let mut got = vec![0u8; len];
        b.region_read(region, offset, &mut got).unwrap();
        assert_eq!(got, msg, "len {len} at {offset}");
        a.progress();
    }
    assert_eq!(b.counters(qb).dropped_total(), 0);
}

#[test]
fn a_burst_of_multi_slot_sends_wraps_the_ring() {
    let (_dev, mut a, mut b) = pair();
    let qa = a.create_qp(1).unwrap();
    let qb = b.create_qp(0).unwrap();
    let region = b.register_region(64 * 256, Access::LOCAL).unwrap();
    for i in 0..64u64 {
        let sge = Sge {
            key: region,
            offset: i * 256,
            len: 256,
        };
        b.post_recv(qb, sge, i).unwrap();
    }
    let msgs: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 49 + i as usize * 2]).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while got.len() < msgs.len() {
        assert!(Instant::now() < end, "stalled at {sent} sent");
        if sent < msgs.len() {
            let wrs: Vec<_> = msgs[sent..]
                .iter()
                .map(|m| ntbdk_pmd::transport::SendWr {
                    data: m,
                    cookie: 0,
                    signaled: true,
                })
                .collect();
            sent += a.post_sends(qa, &wrs).unwrap_or(0);
        }
        a.progress();
        let mut buf = [Completion::default(); 16];
        let n = b.poll_completions(&mut buf);
        got.extend(buf[..n].iter().filter(|c| c.op == OpKind::Recv).copied());
    }
    for (i, c) in got.iter().enumerate() {
        assert_eq!(c.status, Status::Success);
        assert_eq!(c.cookie, i as u64);
        let mut buf = vec![0u8; c.bytes as usize];
        b.region_read(region, i as u64 * 256, &mut buf).unwrap();
        assert_eq!(buf, msgs[i]);
    }
}

#[test]
fn malformed_runs_are_dropped_and_counted() {
    let (dev, a, mut b) = pair();
    let e = epoch(a.incarnation(), b.incarnation());
    let mut inj = Injector::new(&*dev, 1, *b.layout(), e).unwrap();
    let qb = b.create_qp(0).unwrap();
    let region = b.register_region(256, Access::LOCAL).unwrap();
    let sge = Sge {
        key: region,
        offset: 0,
        len: 256,
    };
    b.post_recv(qb, sge, 7).unwrap();
    let payload: Vec<u8> = (1..=120u8).collect();
    let mut good = [[0u8; BODY]; INLINE_SLOTS_MAX];
    let n = wire::encode_inline_slots(&payload, &mut good).unwrap();
    assert_eq!(n, 3);

    // A head whose length fits one slot: dropped alone.
    let mut bad = good[0];
    bad[1] = INLINE_MAX as u8;
    inj.push(Ring::PostQ, &bad).unwrap();
    // A head with a reserved byte set: dropped alone.
    let mut bad = good[0];
    bad[5] = 1;
    inj.push(Ring::PostQ, &bad).unwrap();
    // A head longer than the longest inline send: dropped alone.
    let mut bad = good[0];
    bad[1] = (INLINE_LONG_MAX + 1) as u8;
    inj.push(Ring::PostQ, &bad).unwrap();
    b.progress();
    assert_eq!(b.counters(qb).dropped(DropKind::Malformed), 3);

    // A run whose last slot has a byte set past the payload: the whole run
    // is dropped, nothing delivered.
    let mut tail = good[2];
    tail[BODY - 1] = 0xaa;
    inj.push(Ring::PostQ, &good[0]).unwrap();
    inj.push(Ring::PostQ, &good[1]).unwrap();
    b.progress();
    // Incomplete: nothing taken yet.
    assert_eq!(b.counters(qb).dropped(DropKind::Malformed), 3);
    inj.push(Ring::PostQ, &tail).unwrap();
    b.progress();
    assert_eq!(b.counters(qb).dropped(DropKind::Malformed), 4);
    let mut buf = [Completion::default(); 4];
    assert_eq!(b.poll_completions(&mut buf), 0);

    // A good run is delivered intact.
    for body in &good[..n] {
        inj.push(Ring::PostQ, body).unwrap();
    }
    let c = recvs(&mut b, 1)[0];
    assert_eq!((c.status, c.bytes, c.cookie), (Status::Success, 120, 7));
    let mut got = vec![0u8; 120];
    b.region_read(region, 0, &mut got).unwrap();
    assert_eq!(got, payload);
    drop(a);
}

#[test]
fn mixed_bursts_publish_whole_and_complete_exactly_what_was_posted() {
    // One-slot, multi-slot and eager-buffer sends in the same batches; a
    // batch is written last-first, and a batch cut short by a full ring
    // posts (and completes) exactly the count it returns.
    let (_dev, mut a, mut b) = pair();
    let qa = a.create_qp(1).unwrap();
    let qb = b.create_qp(0).unwrap();
    let eager = Geometry::small(2).eager_size as usize;
    let sizes = [8usize, 64, INLINE_LONG_MAX, INLINE_LONG_MAX + 1, eager, 1];
    let total = 300usize;
    let msgs: Vec<Vec<u8>> = (0..total)
        .map(|i| vec![(i * 7 + 3) as u8; sizes[i % sizes.len()]])
        .collect();
    let slot = eager as u64;
    let region = b.register_region(16 * eager, Access::LOCAL).unwrap();
    for i in 0..16u64 {
        let sge = Sge {
            key: region,
            offset: i * slot,
            len: slot,
        };
        b.post_recv(qb, sge, i).unwrap();
    }
    let (mut sent, mut send_done, mut got) = (0usize, 0usize, 0usize);
    let end = Instant::now() + Duration::from_secs(20);
    let mut buf = [Completion::default(); 16];
    while got < total {
        assert!(Instant::now() < end, "stalled: {sent} sent, {got} received");
        if sent < total {
            let wrs: Vec<_> = msgs[sent..total.min(sent + 9)]
                .iter()
                .map(|m| ntbdk_pmd::transport::SendWr {
                    data: m,
                    cookie: 0,
                    signaled: true,
                })
                .collect();
            sent += a.post_sends(qa, &wrs).unwrap_or(0);
        }
        let n = a.poll_completions(&mut buf);
        send_done += buf[..n].iter().filter(|c| c.op == OpKind::Send).count();
        let n = b.poll_completions(&mut buf);
        for c in buf[..n].iter().filter(|c| c.op == OpKind::Recv) {
            assert_eq!(c.status, Status::Success, "message {got}");
            let mut data = vec![0u8; c.bytes as usize];
            b.region_read(region, c.cookie * slot, &mut data).unwrap();
            assert_eq!(data, msgs[got], "message {got}");
            got += 1;
            let sge = Sge {
                key: region,
                offset: c.cookie * slot,
                len: slot,
            };
            b.post_recv(qb, sge, c.cookie).unwrap();
        }
    }
    while send_done < total {
        let n = a.poll_completions(&mut buf);
        assert!(n > 0, "{send_done} of {total} sends completed");
        send_done += buf[..n].iter().filter(|c| c.op == OpKind::Send).count();
    }
    assert_eq!(a.counters(qa).sends, total as u64);
    assert_eq!(b.counters(qb).dropped_total(), 0);
}
