//! Mbufs and mbuf rings: data room and bounds, free on drop and in bulk,
//! and rings between threads that hand every mbuf over exactly once.

use ntbdk_mempool::ZoneOptions;
use ntbdk_pmd::mbuf::{Mbuf, MbufError, MbufPool, MbufRing};

fn pool(name: &str, count: u32, room: usize) -> MbufPool {
    MbufPool::create(name, count, room, 16, &ZoneOptions::no_huge()).unwrap()
}

#[test]
fn data_room_headroom_and_bounds() {
    let p = pool("mbuf-bounds", 4, 128);
    let mut m = p.alloc().unwrap();
    assert_eq!((m.len(), m.data_room(), m.tailroom()), (0, 128, 128));
    assert!(matches!(
        m.reset(129),
        Err(MbufError::NoRoom {
            len: 129,
            room: 128
        })
    ));
    m.reset(16).unwrap();
    m.append(&[7; 100]).unwrap();
    assert_eq!((m.data_off(), m.len(), m.tailroom()), (16, 100, 12));
    assert_eq!(
        m.append(&[0; 13]),
        Err(MbufError::NoRoom {
            len: 113,
            room: 112
        })
    );
    assert_eq!(m.len(), 100, "a refused append changes nothing");
    let mut b = [0u8; 4];
    m.read(96, &mut b).unwrap();
    assert_eq!(b, [7; 4]);
    assert!(matches!(
        m.read(97, &mut b),
        Err(MbufError::OutOfRange { .. })
    ));
    assert_eq!(m.load_u8(99), Some(7));
    assert_eq!(m.load_u8(100), None);
    m.data_mut().unwrap()[0] = 9;
    assert_eq!(m.data().unwrap()[0], 9);
    assert!(!m.is_shared());
    m.set_len(112).unwrap();
    assert!(m.set_len(113).is_err());
}

#[test]
fn mbufs_return_on_drop_and_in_bulk() {
    let p = pool("mbuf-free", 64, 64);
    let mut v = Vec::new();
    p.alloc_bulk(40, &mut v).unwrap();
    assert_eq!(p.available(), 24);
    assert!(p.alloc_bulk(25, &mut v).is_err(), "all or nothing");
    assert_eq!((v.len(), p.available()), (40, 24));
    v.truncate(30); // ten dropped
    assert_eq!(p.available(), 34);
    Mbuf::free_bulk(&mut v);
    assert!(v.is_empty());
    assert_eq!(p.available(), 64);
}

/// A bulk allocation that runs dry in a later chunk of its own says what
/// the caller asked for and how many were free before it took any (its
/// earlier chunks counted back), not the chunk's numbers.
#[test]
fn a_bulk_allocation_short_in_a_later_chunk_reports_the_whole_request() {
    let p = pool("mbuf-short", 100, 64);
    let mut v = Vec::new();
    match p.alloc_bulk(200, &mut v) {
        Err(ntbdk_mempool::PoolError::Exhausted {
            requested,
            available,
            ..
        }) => assert_eq!((requested, available), (200, 100)),
        other => panic!("expected Exhausted, got {other:?}"),
    }
    assert_eq!((v.len(), p.available()), (0, 100));
}

/// A bulk free of mbufs from two pools, interleaved in runs longer and
/// shorter than a chunk, returns each to its own pool once; what the
/// vector holds after a partial send is kept, in order.
#[test]
fn bulk_frees_of_mixed_pools_return_each_mbuf_to_its_pool_once() {
    let (a, b) = (pool("mbuf-mix-a", 256, 64), pool("mbuf-mix-b", 256, 64));
    let mut v = Vec::new();
    for (p, n) in [(&a, 3), (&b, 1), (&a, 70), (&b, 130), (&a, 1)] {
        p.alloc_bulk(n, &mut v).unwrap();
    }
    for (i, m) in v.iter_mut().enumerate() {
        m.set_user(i as u64);
    }
    assert_eq!((a.available(), b.available()), (256 - 74, 256 - 131));
    let mut rest = v.split_off(150);
    Mbuf::free_bulk(&mut v);
    assert!(v.is_empty());
    assert_eq!((a.available(), b.available()), (256 - 1, 256 - 131 + 77));
    assert_eq!(rest.first().map(Mbuf::user), Some(150));
    Mbuf::free_bulk(&mut rest);
    assert_eq!((a.available(), b.available()), (256, 256));
}

#[test]
fn a_ring_between_threads_hands_over_every_mbuf_once() {
    let p = pool("mbuf-ring", 256, 64);
    let (mut to, mut from) = MbufRing::spsc(64).unwrap();
    const N: u64 = 200_000;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut batch = Vec::new();
            let mut next = 0u64;
            while next < N || !batch.is_empty() {
                while batch.len() < 32 && next < N {
                    match p.alloc() {
                        Ok(mut m) => {
                            m.append(&next.to_le_bytes()).unwrap();
                            m.set_user(next);
                            batch.push(m);
                            next += 1;
                        }
                        Err(_) => break, // all in flight: wait for the consumer
                    }
                }
                to.enqueue_burst(&mut batch);
            }
            p.flush_cache();
        });
        s.spawn(|| {
            let mut got = Vec::new();
            let mut want = 0u64;
            while want < N {
                from.dequeue_burst(&mut got, 32);
                for m in &got {
                    assert_eq!(m.user(), want);
                    let mut b = [0u8; 8];
                    m.read(0, &mut b).unwrap();
                    assert_eq!(u64::from_le_bytes(b), want);
                    want += 1;
                }
                Mbuf::free_bulk(&mut got);
            }
            // The scope does not wait for the threads' caches to return.
            p.flush_cache();
        });
    });
    assert!(to.is_empty() && from.is_empty());
    assert_eq!(p.available(), 256);
}

#[test]
fn a_full_ring_keeps_the_rest_in_order_and_frees_what_it_holds_on_drop() {
    let p = pool("mbuf-ring-full", 16, 64);
    let ring = MbufRing::new(8).unwrap();
    let mut v = Vec::new();
    p.alloc_bulk(12, &mut v).unwrap();
    for (i, m) in v.iter_mut().enumerate() {
        m.set_user(i as u64);
    }
    assert_eq!(ring.enqueue_burst(&mut v), 8);
    let left: Vec<u64> = v.iter().map(Mbuf::user).collect();
    assert_eq!(left, [8, 9, 10, 11]);
    let mut out = Vec::new();
    assert_eq!(ring.dequeue_burst(&mut out, 3), 3);
    assert_eq!(out.iter().map(Mbuf::user).collect::<Vec<_>>(), [0, 1, 2]);
    drop(out);
    drop(v);
    assert_eq!(p.available(), 11);
    drop(ring);
    assert_eq!(p.available(), 16, "the ring freed the mbufs it held");
}

#[test]
fn mbufs_outlive_the_pool_handles_they_came_from() {
    let p = pool("mbuf-outlive", 8, 64);
    let clone = p.clone();
    let mut v = Vec::new();
    p.alloc_bulk(8, &mut v).unwrap();
    for m in &mut v {
        m.append(b"alive").unwrap();
    }
    let last = v.pop().unwrap();
    drop(p);
    assert_eq!(clone.available(), 0, "a clone sees the same pool");
    drop(clone);
    // Every handle to the pool is gone; the mbufs still hold it.
    assert!(v.iter().all(|m| m.to_vec() == b"alive"));
    Mbuf::free_bulk(&mut v);
    assert_eq!(last.to_vec(), b"alive");
    drop(last); // the last reference frees the pool
}
