//! Pools whose objects lie in memory the pool does not own
//! (`Pool::create_over`): handles and pointers, refusals, counts.

use std::ptr::NonNull;
use std::sync::Arc;

use ntbdk_mempool::{ObjIdx, Pool, PoolError, PoolOptions};

/// A cache line, so the test memory is aligned as pool objects are.
#[repr(C, align(64))]
struct Line([u8; 64]);

fn area(bytes: usize) -> (NonNull<u8>, Arc<Vec<Line>>) {
    let mem = Arc::new((0..bytes / 64).map(|_| Line([0; 64])).collect::<Vec<_>>());
    let ptr = NonNull::new(mem.as_ptr() as *mut u8).unwrap();
    (ptr, mem)
}

#[test]
fn objects_are_where_the_creator_said_and_all_come_back() {
    let (ptr, mem) = area(16 * 256);
    let opts = PoolOptions {
        cache_size: 0,
        ..PoolOptions::new(256, 16)
    };
    // SAFETY: `mem` stays alive in the pool (keep) and nothing else uses it.
    let pool = unsafe { Pool::create_over("ext-test", &opts, ptr, 16 * 256, mem) }.unwrap();
    assert!(pool.is_external());
    let mut hs = [ObjIdx::default(); 16];
    pool.get_bulk(&mut hs).unwrap();
    let mut seen: Vec<usize> = hs
        .iter()
        .map(|&h| pool.ptr(h).unwrap().as_ptr() as usize - ptr.as_ptr() as usize)
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..16).map(|i| i * 256).collect::<Vec<_>>());
    assert!(matches!(
        pool.get_bulk(&mut [ObjIdx::default()]),
        Err(PoolError::Exhausted { .. })
    ));
    pool.put_bulk_checked(&hs).unwrap();
    assert_eq!(pool.available(), 16);
    assert!(pool.put_checked(hs[0]).is_err(), "a double put is refused");
}

#[test]
fn slice_and_zone_calls_are_refused() {
    let (ptr, mem) = area(4 * 64);
    // SAFETY: as above.
    let pool =
        unsafe { Pool::create_over("ext-refuse", &PoolOptions::new(64, 4), ptr, 4 * 64, mem) }
            .unwrap();
    assert!(matches!(pool.get(), Err(PoolError::External { .. })));
    let h = pool.get_raw().unwrap();
    assert!(matches!(pool.offset_of(h), Err(PoolError::External { .. })));
    assert!(matches!(pool.handle_at(0), Err(PoolError::External { .. })));
    pool.put_checked(h).unwrap();
}

#[test]
fn too_small_or_misaligned_memory_is_refused() {
    let (ptr, mem) = area(4 * 64);
    // SAFETY: the call fails before using the memory.
    let r = unsafe {
        Pool::create_over(
            "ext-small",
            &PoolOptions::new(64, 8),
            ptr,
            4 * 64,
            mem.clone(),
        )
    };
    assert!(matches!(r, Err(PoolError::InvalidOptions(_))));
    let odd = NonNull::new(ptr.as_ptr().wrapping_add(1)).unwrap();
    // SAFETY: as above.
    let r = unsafe { Pool::create_over("ext-odd", &PoolOptions::new(64, 2), odd, 4 * 64 - 1, mem) };
    assert!(matches!(r, Err(PoolError::InvalidOptions(_))));
}
