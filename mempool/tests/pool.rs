//! Object pools: the safe and raw APIs, bulk semantics, exhaustion, misuse,
//! the per-thread caches, and a multi-thread stress test.

use std::collections::HashSet;
use std::sync::{Arc, Barrier};

use ntbdk_mempool::{IovaMode, ObjIdx, Pool, PoolError, PoolOptions, PoolStats, Zone, ZoneOptions};

/// A pool that tracks object state (the default).
fn pool(name: &str, elt_size: usize, count: u32, cache: usize) -> Pool {
    let o = PoolOptions {
        cache_size: cache,
        ..PoolOptions::new(elt_size, count)
    };
    Pool::create(name, &o, &ZoneOptions::no_huge()).unwrap()
}

/// A pool in the lean data-path configuration (no state in release builds).
fn lean(name: &str, elt_size: usize, count: u32, cache: usize) -> Pool {
    let o = PoolOptions {
        cache_size: cache,
        track_state: false,
        ..PoolOptions::new(elt_size, count)
    };
    Pool::create(name, &o, &ZoneOptions::no_huge()).unwrap()
}

/// Returns handles with the unchecked data-path call.
fn put_raw(p: &Pool, hs: &[ObjIdx]) {
    // SAFETY: every caller passes handles it took from `p` and still owns,
    // each once.
    unsafe { p.put_bulk(hs) }
}

fn handles(n: usize) -> Vec<ObjIdx> {
    vec![ObjIdx::default(); n]
}

/// The object's bytes (the tests own the objects they look at).
#[allow(clippy::mut_from_ref)]
fn bytes(p: &Pool, h: ObjIdx) -> &mut [u8] {
    // SAFETY: the tests own the objects they touch; elt_size bytes from ptr.
    unsafe { std::slice::from_raw_parts_mut(p.ptr(h).unwrap().as_ptr(), p.elt_size()) }
}

#[test]
fn objects_are_distinct_aligned_and_keep_their_bytes() {
    for cache in [0, 8] {
        let p = pool("distinct", 100, 50, cache);
        assert_eq!((p.size(), p.elt_size(), p.stride()), (50, 100, 128));
        let mut hs = handles(50);
        p.get_bulk(&mut hs).unwrap();
        let idx: HashSet<u32> = hs.iter().map(|h| h.index()).collect();
        assert_eq!(idx.len(), 50, "every object handed out once");
        for h in &hs {
            assert_eq!(
                p.ptr(*h).unwrap().as_ptr() as usize % 64,
                0,
                "cache-line aligned"
            );
            assert!(p.is_in_use(*h).unwrap());
            bytes(&p, *h).fill(h.index() as u8);
        }
        for h in &hs {
            assert!(
                bytes(&p, *h).iter().all(|&b| b == h.index() as u8),
                "object {h} overlapped"
            );
        }
        assert_eq!((p.available(), p.in_use()), (0, 50));
        put_raw(&p, &hs);
        assert_eq!((p.available(), p.in_use()), (50, 0));
        assert!(hs.iter().all(|h| !p.is_in_use(*h).unwrap()));
    }
}

#[test]
fn safe_objects_return_themselves() {
    let p = pool("safe", 64, 4, 2);
    {
        let mut a = p.get().unwrap();
        let b = p.get().unwrap();
        assert_ne!(a.handle(), b.handle());
        a.copy_from_slice(&[7; 64]);
        assert_eq!(a.len(), 64);
        assert_eq!(p.in_use(), 2);
        let raw = a.into_handle();
        assert_eq!(p.in_use(), 2, "into_handle does not return the object");
        assert_eq!(bytes(&p, raw), &[7; 64][..]);
        p.put_checked(raw).unwrap();
    }
    assert_eq!(p.in_use(), 0);
    let h = p.get_raw().unwrap();
    // SAFETY: `h` is ours alone, and wrapped once.
    let o = unsafe { ntbdk_mempool::Obj::from_handle(&p, h) };
    assert!(matches!(
        p.put_checked(h),
        Err(PoolError::OwnedByObj { .. })
    ));
    drop(o);
    assert!(matches!(p.put_checked(h), Err(PoolError::NotInUse { .. })));
    assert_eq!(p.in_use(), 0);
}

#[test]
fn bulk_is_all_or_nothing() {
    // Cache sizes: none, smaller than the bulk, larger than the bulk.
    for cache in [0, 16, 100] {
        let p = pool("bulk", 32, 250, cache);
        let mut a = handles(120); // more than the on-stack staging (64)
        p.get_bulk(&mut a).unwrap();
        let mut b = handles(131);
        let e = p.get_bulk(&mut b).unwrap_err();
        assert!(
            matches!(e, PoolError::Exhausted { requested: 131, .. }),
            "{e}"
        );
        assert!(
            b.iter().all(|h| *h == ObjIdx::default()),
            "out untouched on failure"
        );
        assert_eq!(
            p.available(),
            130,
            "nothing taken on failure (cache {cache})"
        );
        let mut c = handles(130);
        p.get_bulk(&mut c).unwrap();
        assert_eq!(p.available(), 0);
        assert!(matches!(p.get(), Err(PoolError::Exhausted { .. })));
        assert!(matches!(p.get_raw(), Err(PoolError::Exhausted { .. })));
        let mut one = handles(1);
        assert!(p.get_bulk(&mut one).is_err());
        p.get_bulk(&mut []).unwrap();
        let all: HashSet<u32> = a.iter().chain(&c).map(|h| h.index()).collect();
        assert_eq!(all.len(), 250);
        put_raw(&p, &a);
        p.put_bulk_checked(&c).unwrap();
        assert_eq!(p.available(), 250);
        assert_eq!(p.stats().get_failures, 4);
    }
}

#[test]
fn exhaustion_error_explains() {
    let p = pool("tiny", 8, 2, 0);
    let _a = p.get().unwrap();
    let _b = p.get().unwrap();
    let msg = p.get().unwrap_err().to_string();
    assert!(
        msg.starts_with("pool \"tiny\" exhausted: asked for 1 objects, 0 free"),
        "{msg}"
    );
    assert!(msg.contains("make the pool larger"), "{msg}");
}

#[test]
fn checked_put_rejects_double_put_and_foreign_handles() {
    let p = pool("checked", 16, 8, 4);
    let q = pool("other", 16, 8, 4);
    let h = p.get_raw().unwrap();
    let foreign = q.get_raw().unwrap();
    assert_eq!(h.index(), foreign.index(), "same index, different pool");
    let e = p.put_checked(foreign).unwrap_err();
    assert!(matches!(e, PoolError::ForeignHandle { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("does not belong to pool \"checked\""),
        "{e}"
    );
    for bogus in [
        ObjIdx::default(),
        ObjIdx::from_bits((p.tag() as u64) << 32 | 8),
    ] {
        assert!(matches!(
            p.put_checked(bogus),
            Err(PoolError::ForeignHandle { .. })
        ));
    }
    p.put_checked(h).unwrap();
    let e = p.put_checked(h).unwrap_err();
    assert!(matches!(e, PoolError::NotInUse { .. }), "{e}");
    assert!(e.to_string().contains("double put"), "{e}");
    assert_eq!(p.available(), 8);

    // Bulk: one bad handle and nothing is returned.
    let mut hs = handles(3);
    p.get_bulk(&mut hs).unwrap();
    let dup = [hs[0], hs[1], hs[0]];
    assert!(matches!(
        p.put_bulk_checked(&dup),
        Err(PoolError::NotInUse { .. })
    ));
    assert!(
        hs.iter().all(|h| p.is_in_use(*h).unwrap()),
        "state rolled back"
    );
    assert!(matches!(
        p.put_bulk_checked(&[hs[0], foreign]),
        Err(PoolError::ForeignHandle { .. })
    ));
    assert_eq!(p.available(), 5);
    p.put_bulk_checked(&hs).unwrap();
    assert_eq!(p.available(), 8);
    q.put_checked(foreign).unwrap();

    // A handle still owned by an Obj cannot be returned behind its back.
    let o = p.get().unwrap();
    let e = p.put_checked(o.handle()).unwrap_err();
    assert!(matches!(e, PoolError::OwnedByObj { .. }), "{e}");
    assert!(p.is_in_use(o.handle()).unwrap());
    let h = o.into_handle();
    p.put_checked(h).unwrap();
    assert_eq!(p.available(), 8);
}

#[test]
fn lean_pools_skip_state_but_still_catch_foreign_handles() {
    let p = lean("lean", 16, 8, 4);
    let q = pool("other", 16, 8, 4);
    assert_eq!(
        p.is_tracked(),
        cfg!(debug_assertions),
        "debug builds always track"
    );
    let mut hs = handles(8);
    p.get_bulk(&mut hs).unwrap();
    assert!(p.get().is_err());
    let foreign = q.get_raw().unwrap();
    assert!(matches!(
        p.put_checked(foreign),
        Err(PoolError::ForeignHandle { .. })
    ));
    if !p.is_tracked() {
        let e = p.put_checked(hs[0]).unwrap_err();
        assert!(matches!(e, PoolError::Untracked { .. }), "{e}");
        assert!(e.to_string().contains("track_state = true"), "{e}");
        assert!(matches!(
            p.is_in_use(hs[0]),
            Err(PoolError::Untracked { .. })
        ));
    }
    put_raw(&p, &hs);
    assert_eq!(p.available(), 8);
    {
        let mut o = p.get().unwrap();
        o.fill(1);
    }
    assert_eq!(p.available(), 8);
    q.put_checked(foreign).unwrap();
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "double put")]
fn unchecked_double_put_panics_in_debug() {
    let p = pool("debug-double", 16, 8, 4);
    let h = p.get_raw().unwrap();
    // SAFETY: deliberately broken (a double put), to see debug builds catch
    // it before anything is corrupted.
    unsafe {
        p.put(h);
        p.put(h);
    }
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "does not belong")]
fn unchecked_foreign_put_panics_in_debug() {
    let p = pool("debug-foreign", 16, 8, 4);
    let q = pool("debug-other", 16, 8, 4);
    // SAFETY: deliberately broken (a foreign handle), caught in debug builds
    // before anything is touched.
    unsafe { p.put(q.get_raw().unwrap()) };
}

#[test]
fn raw_handles_offsets_and_iova() {
    let p = pool("offsets", 200, 10, 0);
    let h = p.get_raw().unwrap();
    let off = p.offset_of(h).unwrap();
    assert_eq!(p.handle_at(off).unwrap(), h);
    assert_eq!(
        p.zone().as_ptr() as usize + off,
        p.ptr(h).unwrap().as_ptr() as usize
    );
    assert_eq!(
        p.iova(h, IovaMode::Va).unwrap(),
        p.ptr(h).unwrap().as_ptr() as u64
    );
    assert!(matches!(
        p.handle_at(off + 1),
        Err(PoolError::BadOffset { .. })
    ));
    assert!(matches!(p.handle_at(0), Err(PoolError::BadOffset { .. })));
    assert!(p.handle_at(off + 100 * p.stride()).is_err());
    assert_eq!(p.handle(h.index()).unwrap(), h);
    assert!(p.handle(10).is_err());
    assert_eq!(ObjIdx::from_bits(h.to_bits()), h);
    let next = p.handle(h.index() ^ 1).unwrap();
    assert_eq!(p.offset_of(next).unwrap().abs_diff(off), p.stride());
    p.put_checked(h).unwrap();
}

#[test]
fn options_are_validated() {
    let z = ZoneOptions::no_huge();
    for o in [
        PoolOptions::new(0, 10),
        PoolOptions::new(10, 0),
        PoolOptions {
            elt_align: 3,
            ..PoolOptions::new(10, 10)
        },
        PoolOptions {
            cache_size: Pool::MAX_CACHE + 1,
            ..PoolOptions::new(10, 10_000)
        },
    ] {
        let e = Pool::create("bad", &o, &z).unwrap_err();
        assert!(matches!(e, PoolError::InvalidOptions(_)), "{o:?}: {e}");
    }
    let big = PoolOptions {
        elt_align: 4096,
        ..PoolOptions::new(100, 3)
    };
    let p = Pool::create("page-aligned", &big, &z).unwrap();
    let mut hs = handles(3);
    p.get_bulk(&mut hs).unwrap();
    assert!(
        hs.iter()
            .all(|h| (p.ptr(*h).unwrap().as_ptr() as usize).is_multiple_of(4096))
    );
}

#[test]
fn pools_in_one_zone_and_attach_validation() {
    let a_opts = PoolOptions::new(64, 100);
    let b_opts = PoolOptions::new(256, 10);
    let a_len = Pool::bytes_for(&a_opts).unwrap().next_multiple_of(4096);
    let zone = Arc::new(
        Zone::create(
            "two-pools",
            a_len + Pool::bytes_for(&b_opts).unwrap(),
            &ZoneOptions::no_huge(),
        )
        .unwrap(),
    );
    // SAFETY: disjoint regions of a fresh zone.
    let (a, b) = unsafe {
        (
            Pool::create_in(zone.clone(), 0, "a", &a_opts).unwrap(),
            Pool::create_in(zone.clone(), a_len, "b", &b_opts).unwrap(),
        )
    };
    assert_ne!(a.tag(), b.tag());
    let ha = a.get_raw().unwrap();
    assert!(matches!(
        b.put_checked(ha),
        Err(PoolError::ForeignHandle { .. })
    ));
    // SAFETY: pool `b` is at `a_len`, used only through pool handles.
    let b2 = unsafe { Pool::attach(zone.clone(), a_len, 0) }.unwrap();
    assert_eq!(
        (b2.name(), b2.size(), b2.elt_size(), b2.tag()),
        ("b", 10, 256, b.tag())
    );
    let hb = b2.get_raw().unwrap();
    assert!(b.is_in_use(hb).unwrap(), "both handles see the same state");
    b.put_checked(hb).unwrap();
    a.put_checked(ha).unwrap();

    // Misplaced or missing pools.
    // SAFETY: (here and below) a region that holds no pool image, refused
    // before anything is used.
    let e = unsafe { Pool::attach(zone.clone(), 4096, 0) }.unwrap_err();
    assert!(matches!(e, PoolError::BadPool { .. }), "{e}");
    assert!(e.to_string().contains("bad magic"), "{e}");
    assert!(matches!(
        // SAFETY: as above.
        unsafe { Pool::attach(zone.clone(), 100, 0) },
        Err(PoolError::InvalidOptions(_))
    ));
    assert!(matches!(
        // SAFETY: as above.
        unsafe { Pool::attach(zone.clone(), zone.len() + 4096, 0) },
        Err(PoolError::ZoneTooSmall { .. })
    ));
    // SAFETY: the region is past both pools.
    let e =
        unsafe { Pool::create_in(zone.clone(), a_len, "too-big", &PoolOptions::new(4096, 100)) }
            .unwrap_err();
    assert!(matches!(e, PoolError::ZoneTooSmall { .. }), "{e}");

    // A damaged header is refused.
    // SAFETY: pool `b`'s header (its stride field at byte 28); b and b2 are
    // not used while it is damaged.
    let stride = unsafe { &mut *zone.as_ptr().add(a_len + 28).cast::<u32>() };
    let saved = *stride;
    *stride += 64;
    // SAFETY: pool `b`, used only through pool handles; refused.
    let e = unsafe { Pool::attach(zone.clone(), a_len, 0) }.unwrap_err();
    assert!(
        e.to_string()
            .contains("differs from the one its shape implies"),
        "{e}"
    );
    *stride = saved;
    // SAFETY: as above, its tag field at byte 12.
    let tag = unsafe { &mut *zone.as_ptr().add(a_len + 12).cast::<u32>() };
    let saved = *tag;
    *tag = 0;
    // SAFETY: as above.
    let e = unsafe { Pool::attach(zone.clone(), a_len, 0) }.unwrap_err();
    assert!(e.to_string().contains("tag 0"), "{e}");
    *tag = saved;
    // SAFETY: pool `b`, used only through pool handles.
    unsafe { Pool::attach(zone, a_len, 0) }.unwrap();
}

#[test]
fn cache_hits_misses_and_flush() {
    let p = pool("cache", 32, 1000, 64);
    let mut hs = handles(8);
    p.get_bulk(&mut hs).unwrap(); // refill: miss
    put_raw(&p, &hs); // hit
    p.get_bulk(&mut hs).unwrap(); // hit
    p.put_bulk_checked(&hs).unwrap(); // hit
    let s = p.stats();
    assert_eq!((s.cache_hits, s.cache_misses), (3, 1));
    // The refill took the 8 asked for plus half a cache.
    assert_eq!(
        (s.in_caches, s.in_ring, s.available),
        (8 + 32, 1000 - 40, 1000)
    );
    p.flush_cache();
    let s = p.stats();
    assert_eq!((s.in_caches, s.in_ring), (0, 1000));
    assert_eq!(
        (s.cache_hits, s.cache_misses),
        (3, 1),
        "counters survive a flush"
    );

    // Filling the cache past its size flushes half of it.
    let mut many = handles(64);
    p.get_bulk(&mut many).unwrap();
    for h in &many {
        p.put_checked(*h).unwrap();
    }
    let s = p.stats();
    assert!(s.in_caches <= 64 && s.in_caches >= 32, "{s:?}");
    assert_eq!(s.available, 1000);

    // Bulk operations larger than the cache bypass it.
    let before = p.stats();
    let mut huge = handles(100);
    p.get_bulk(&mut huge).unwrap();
    put_raw(&p, &huge);
    let after = p.stats();
    assert_eq!(after.in_caches, before.in_caches);
    assert_eq!(
        after.cache_hits + after.cache_misses,
        before.cache_hits + before.cache_misses
    );
}

#[test]
fn thread_exit_returns_its_cache() {
    let p = pool("thread-exit", 32, 500, 128);
    let q = p.clone();
    // A joined thread has run its thread-local destructors (a scoped thread
    // may not have yet when its scope ends).
    std::thread::spawn(move || {
        let mut hs = handles(10);
        q.get_bulk(&mut hs).unwrap();
        put_raw(&q, &hs);
        assert!(q.stats().in_caches > 0);
    })
    .join()
    .unwrap();
    let s = p.stats();
    assert_eq!((s.in_caches, s.in_ring, s.in_use), (0, 500, 0), "{s:?}");
    assert_eq!(s.cache_misses, 1, "the exited thread's counters are kept");
}

#[test]
fn dropping_a_handle_returns_other_threads_caches() {
    let p = pool("drop-handle", 32, 300, 64);
    // SAFETY: `p` is at offset 0 of its zone, used only through handles.
    let second = unsafe { Pool::attach(p.zone().clone(), 0, 64) }.unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let mut hs = handles(5);
        second.get_bulk(&mut hs).unwrap();
        put_raw(&second, &hs);
        assert!(second.stats().in_caches > 0);
        drop(second); // the last handle: its caches go back to the ring
        done_tx.send(()).unwrap();
        rx.recv().unwrap(); // stay alive, holding the (now empty) cache entry
    });
    done_rx.recv().unwrap();
    assert_eq!(p.stats().in_ring, 300);
    tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(p.available(), 300);
}

#[test]
fn objects_cross_threads() {
    let p = pool("cross", 64, 64, 16);
    let (tx, rx) = std::sync::mpsc::sync_channel(8);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..1000 {
                let mut o = p.get().unwrap();
                o[0] = 0x5A;
                tx.send(o).unwrap();
            }
            drop(tx);
            p.flush_cache();
        });
        s.spawn(|| {
            for o in rx {
                assert_eq!(o[0], 0x5A);
                drop(o); // returned by another thread than the one that took it
            }
            p.flush_cache();
        });
    });
    assert_eq!(p.available(), 64);
}

/// Many threads get and put at random (single and bulk, checked and not),
/// each stamping the objects it holds and checking the stamp before it puts
/// them back: an object handed out twice at once fails the check.
fn stress(p: Pool) {
    const THREADS: usize = 4;
    const ROUNDS: usize = 100_000;
    let checked = p.is_tracked();
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, barrier) = (&p, &barrier);
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut held: Vec<(ObjIdx, u64)> = Vec::new();
                barrier.wait();
                for round in 0..ROUNDS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let stamp = (t as u64) << 48 | round as u64;
                    match rng % 4 {
                        0 | 1 if held.len() < 100 => {
                            let n = 1 + (rng >> 8) as usize % 40;
                            let mut hs = handles(n);
                            if p.get_bulk(&mut hs).is_ok() {
                                for h in hs {
                                    let b = bytes(p, h);
                                    b[..8].copy_from_slice(&stamp.to_le_bytes());
                                    held.push((h, stamp));
                                }
                            }
                        }
                        _ => {
                            let n = ((rng >> 8) as usize % 40).min(held.len());
                            let back: Vec<(ObjIdx, u64)> = held.drain(..n).collect();
                            for &(h, st) in &back {
                                let got = u64::from_le_bytes(bytes(p, h)[..8].try_into().unwrap());
                                assert_eq!(got, st, "object {h} was written by someone else");
                            }
                            let hs: Vec<ObjIdx> = back.iter().map(|x| x.0).collect();
                            if checked && round % 2 == 1 {
                                p.put_bulk_checked(&hs).unwrap();
                            } else {
                                put_raw(p, &hs);
                            }
                        }
                    }
                }
                let hs: Vec<ObjIdx> = held.iter().map(|x| x.0).collect();
                put_raw(p, &hs);
                // Scoped threads may end before their thread-local
                // destructors return the caches: return them now.
                p.flush_cache();
            });
        }
    });
    let s: PoolStats = p.stats();
    assert_eq!(s.available, 512, "{s:?}");
    assert_eq!((s.in_use, s.in_caches), (0, 0), "{s:?}");
    let mut all = handles(512);
    p.get_bulk(&mut all).unwrap();
    assert_eq!(
        all.iter().map(|h| h.index()).collect::<HashSet<_>>().len(),
        512
    );
}

#[test]
fn stress_threads_with_cache() {
    stress(pool("stress", 64, 512, 32));
}

#[test]
fn stress_threads_without_cache() {
    stress(pool("stress", 64, 512, 0));
}

#[test]
fn stress_threads_lean_with_cache() {
    stress(lean("stress", 64, 512, 32));
}

mod model {
    //! Random single-thread sequences of operations against a model.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Get,
        GetBulk(usize),
        Put(usize),
        PutBulk(usize),
        PutTwice(usize),
        Flush,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Get),
            (1usize..40).prop_map(Op::GetBulk),
            any::<usize>().prop_map(Op::Put),
            (1usize..40).prop_map(Op::PutBulk),
            any::<usize>().prop_map(Op::PutTwice),
            Just(Op::Flush),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn pool_matches_model(cache in 0usize..20, ops in proptest::collection::vec(op(), 1..120)) {
            const N: usize = 50;
            let p = pool("model", 16, N as u32, cache);
            let mut held: Vec<ObjIdx> = Vec::new();
            for op in ops {
                match op {
                    Op::Get => match p.get_raw() {
                        Ok(h) => held.push(h),
                        Err(_) => prop_assert_eq!(held.len(), N),
                    },
                    Op::GetBulk(n) => {
                        let mut hs = handles(n);
                        match p.get_bulk(&mut hs) {
                            Ok(()) => held.extend(hs),
                            Err(_) => prop_assert!(held.len() + n > N),
                        }
                    }
                    Op::Put(i) if !held.is_empty() => {
                        let h = held.swap_remove(i % held.len());
                        p.put_checked(h).unwrap();
                    }
                    Op::PutBulk(n) => {
                        let n = n.min(held.len());
                        let back: Vec<ObjIdx> = held.drain(..n).collect();
                        put_raw(&p, &back);
                    }
                    Op::PutTwice(i) if !held.is_empty() => {
                        let h = held.swap_remove(i % held.len());
                        p.put_checked(h).unwrap();
                        prop_assert!(p.put_checked(h).is_err());
                    }
                    Op::Flush => p.flush_cache(),
                    _ => {}
                }
                let unique: HashSet<u32> = held.iter().map(|h| h.index()).collect();
                prop_assert_eq!(unique.len(), held.len());
                prop_assert_eq!(p.in_use(), held.len());
                prop_assert_eq!(p.available(), N - held.len());
            }
        }
    }
}
