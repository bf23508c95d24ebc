//! A pool shared by two real processes: the child attaches the parent's zone
//! by `/proc/<pid>/fd/<fd>`, both hammer the same pool at once, then the
//! child hands objects over to the parent through shared memory.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{child_command, is_child};
use ntbdk_mempool::{ObjIdx, Pool, PoolOptions, Zone, ZoneOptions};

const COUNT: u32 = 256;
const HANDED: usize = 10;
const ROUNDS: usize = 50_000;

fn opts() -> PoolOptions {
    PoolOptions {
        cache_size: 16,
        ..PoolOptions::new(64, COUNT)
    }
}

/// Plain data in the zone after the pool: a rendezvous counter and the
/// handles the child hands over.
#[repr(C)]
struct Mailbox {
    arrived: AtomicU64,
    handed: AtomicU64,
    handles: [AtomicU64; HANDED],
}

fn mailbox_offset() -> usize {
    Pool::bytes_for(&opts()).unwrap().next_multiple_of(4096)
}

fn mailbox(zone: &Zone) -> &Mailbox {
    // SAFETY: the mailbox page is inside the zone (sized for it), aligned,
    // and holds only atomics, valid for any bytes (zero at first).
    unsafe { &*zone.as_ptr().add(mailbox_offset()).cast::<Mailbox>() }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Gets and puts at random, stamping each held object with `who` and a
/// sequence number and checking the stamp before putting it back.
fn hammer(p: &Pool, who: u64) {
    let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ who;
    let mut held: Vec<(ObjIdx, u64)> = Vec::new();
    for round in 0..ROUNDS {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let ptr = |h: ObjIdx| p.ptr(h).unwrap().as_ptr().cast::<u64>();
        if rng.is_multiple_of(2) && held.len() < 40 {
            let mut hs = vec![ObjIdx::default(); 1 + (rng >> 8) as usize % 20];
            if p.get_bulk(&mut hs).is_ok() {
                for h in hs {
                    let stamp = who << 40 | round as u64;
                    // SAFETY: we hold `h`; objects are 64-aligned, 64 bytes.
                    unsafe { ptr(h).write_volatile(stamp) };
                    held.push((h, stamp));
                }
            }
        } else if !held.is_empty() {
            let n = 1 + (rng >> 8) as usize % held.len();
            let back: Vec<(ObjIdx, u64)> = held.drain(..n).collect();
            for &(h, stamp) in &back {
                // SAFETY: as above.
                let got = unsafe { ptr(h).read_volatile() };
                assert_eq!(got, stamp, "object {h} was written by another process");
            }
            let hs: Vec<ObjIdx> = back.iter().map(|x| x.0).collect();
            p.put_bulk_checked(&hs).unwrap();
        }
    }
    let hs: Vec<ObjIdx> = held.iter().map(|x| x.0).collect();
    // SAFETY: the handles we still hold, each once.
    unsafe { p.put_bulk(&hs) };
}

#[test]
fn child_shared_pool() {
    if !is_child("child_shared_pool") {
        return;
    }
    let pid = std::env::var("NTBDK_PID").unwrap().parse().unwrap();
    let fd = std::env::var("NTBDK_FD").unwrap().parse().unwrap();
    let tag: u32 = std::env::var("NTBDK_TAG").unwrap().parse().unwrap();
    let zone = Arc::new(Zone::open_from_pid(pid, fd).unwrap());
    // SAFETY: the parent created the pool at offset 0 of this zone and uses
    // it only through pool handles.
    let p = unsafe { Pool::attach(zone.clone(), 0, 16) }.unwrap();
    assert_eq!(
        (p.name(), p.size(), p.elt_size(), p.tag()),
        ("xproc", COUNT as usize, 64, tag)
    );
    let mb = mailbox(&zone);
    mb.arrived.fetch_add(1, Ordering::AcqRel);
    wait_for("the parent", || mb.arrived.load(Ordering::Acquire) == 2);
    hammer(&p, 2);

    let mut hs = [ObjIdx::default(); HANDED];
    p.get_bulk(&mut hs).unwrap();
    for (slot, h) in mb.handles.iter().zip(hs) {
        // SAFETY: we hold `h`; 64 bytes.
        unsafe {
            p.ptr(h)
                .unwrap()
                .as_ptr()
                .write_bytes(0xC0 | (h.index() as u8 & 0xF), 64)
        };
        slot.store(h.to_bits(), Ordering::Relaxed);
    }
    mb.handed.store(HANDED as u64, Ordering::Release);
    // Dropping the handle returns this process's cached objects.
}

#[test]
fn pool_shared_between_processes() {
    if common::role().is_some() {
        return;
    }
    let zone = Arc::new(
        Zone::create(
            "xproc-pool",
            mailbox_offset() + 4096,
            &ZoneOptions::no_huge(),
        )
        .unwrap(),
    );
    // SAFETY: a fresh zone; the mailbox lies past the pool.
    let p = unsafe { Pool::create_in(zone.clone(), 0, "xproc", &opts()).unwrap() };
    let mut cmd = child_command("child_shared_pool");
    cmd.env("NTBDK_PID", std::process::id().to_string())
        .env(
            "NTBDK_FD",
            std::os::fd::AsRawFd::as_raw_fd(&zone.as_fd()).to_string(),
        )
        .env("NTBDK_TAG", p.tag().to_string());
    let child = common::Reaper(Some(cmd.spawn().unwrap()));
    let mb = mailbox(&zone);
    mb.arrived.fetch_add(1, Ordering::AcqRel);
    wait_for("the child", || mb.arrived.load(Ordering::Acquire) == 2);
    hammer(&p, 1);
    let st = child.wait(Duration::from_secs(60));
    assert!(st.success(), "child failed: {st}");
    p.flush_cache();

    assert_eq!(mb.handed.load(Ordering::Acquire), HANDED as u64);
    let handed: Vec<ObjIdx> = mb
        .handles
        .iter()
        .map(|s| ObjIdx::from_bits(s.load(Ordering::Relaxed)))
        .collect();
    for &h in &handed {
        assert!(p.is_in_use(h).unwrap(), "{h} was handed over in use");
        // SAFETY: the child gave `h` to us; 64 bytes.
        let b = unsafe { std::slice::from_raw_parts(p.ptr(h).unwrap().as_ptr(), 64) };
        assert!(
            b.iter().all(|&x| x == 0xC0 | (h.index() as u8 & 0xF)),
            "child's bytes in {h}"
        );
    }
    let s = p.stats();
    assert_eq!(s.available, COUNT as usize - HANDED, "{s:?}");
    p.put_bulk_checked(&handed).unwrap();
    assert_eq!(p.available(), COUNT as usize);
    assert!(
        p.put_checked(handed[0]).is_err(),
        "a second put of an object the child took (its state is in the shared table) is caught"
    );
    let mut all = vec![ObjIdx::default(); COUNT as usize];
    p.get_bulk(&mut all).unwrap();
    let distinct: std::collections::HashSet<u32> = all.iter().map(|h| h.index()).collect();
    assert_eq!(
        distinct.len(),
        COUNT as usize,
        "no object lost or duplicated"
    );
}
