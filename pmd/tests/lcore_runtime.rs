//! The runtime: pinned workers, result collection, panics, polling modes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use ntbdk_pmd::lcore::{
    LcoreError, Lcores, PollLoop, PollMode, StopFlag, available_cores, current_cpu,
};

#[test]
fn workers_run_on_the_requested_cores_and_return_results() {
    let cores = available_cores();
    assert!(!cores.is_empty());
    let mut lc = Lcores::new();
    for &c in &cores {
        lc.launch(Some(c), &format!("w{c}"), move || {
            // Pinned before the closure runs: every sample is on core c.
            let mut seen = Vec::new();
            for _ in 0..50 {
                seen.push(current_cpu().unwrap());
                std::thread::yield_now();
            }
            (c, seen)
        })
        .unwrap();
    }
    assert_eq!(lc.len(), cores.len());
    let results = lc.join();
    for (r, &c) in results.into_iter().zip(&cores) {
        let (core, seen) = r.unwrap();
        assert_eq!(core, c);
        assert!(
            seen.iter().all(|&s| s == c),
            "worker for core {c} ran on {seen:?}"
        );
    }
}

#[test]
fn a_missing_core_is_an_error_and_panics_are_reported() {
    let mut lc = Lcores::<u32>::new();
    let e = lc.launch(Some(100_000), "nowhere", || 1).unwrap_err();
    assert!(matches!(e, LcoreError::NoSuchCore { core: 100_000, .. }));
    assert!(e.to_string().contains("no core 100000"), "{e}");
    lc.launch(None, "fine", || 7).unwrap();
    lc.launch(None, "boom", || panic!("worker exploded"))
        .unwrap();
    lc.launch(None, "fine2", || 8).unwrap();
    let r = lc.join();
    assert_eq!(*r[0].as_ref().unwrap(), 7);
    match &r[1] {
        Err(LcoreError::Panicked { name, message }) => {
            assert_eq!(name, "boom");
            assert!(message.contains("worker exploded"));
        }
        other => panic!("expected a panic report, got {other:?}"),
    }
    assert_eq!(*r[2].as_ref().unwrap(), 8);
}

#[test]
fn spin_loop_counts_busy_and_empty_polls_and_stops() {
    let stop = StopFlag::new();
    let mut pl = PollLoop::new(PollMode::Spin, stop.clone());
    let mut i = 0u64;
    let stats = pl.run(|| {
        i += 1;
        if i == 10_000 {
            stop.stop();
        }
        if i.is_multiple_of(4) { 3 } else { 0 }
    });
    assert_eq!(stats.iterations, 10_000);
    assert_eq!(stats.busy_polls, 2_500);
    assert_eq!(stats.empty_polls, 7_500);
    assert_eq!(stats.work, 7_500);
    assert_eq!(stats.yields, 0);
    assert_eq!(pl.counters().snapshot(), stats);
}

#[test]
fn hybrid_loop_yields_after_its_spin_budget() {
    let stop = StopFlag::new();
    let mut pl = PollLoop::new(PollMode::Hybrid { spins: 100 }, stop.clone());
    let mut i = 0u64;
    let stats = pl.run(|| {
        i += 1;
        if i == 10_000 {
            stop.stop();
        }
        0
    });
    assert_eq!(stats.empty_polls, 10_000);
    assert_eq!(stats.yields, 100, "one yield per 100 empty polls");
    // A busy poll resets the budget.
    let stop = StopFlag::new();
    let mut pl = PollLoop::new(PollMode::Hybrid { spins: 100 }, stop.clone());
    let mut i = 0u64;
    let stats = pl.run(|| {
        i += 1;
        if i == 10_000 {
            stop.stop();
        }
        usize::from(i.is_multiple_of(50))
    });
    assert_eq!(stats.yields, 0);
}

#[test]
fn hybrid_spinners_share_one_core() {
    // Three spinners pinned to one core: with hybrid mode each yields to the
    // others, so all of them make progress until stopped.
    let core = available_cores()[0];
    let stop = StopFlag::new();
    let progress: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
    let mut lc = Lcores::new();
    for (k, p) in progress.iter().enumerate() {
        let (s, p) = (stop.clone(), p.clone());
        lc.launch(Some(core), &format!("spinner{k}"), move || {
            PollLoop::new(PollMode::Hybrid { spins: 16 }, s).run(|| {
                p.fetch_add(1, Relaxed);
                0
            })
        })
        .unwrap();
    }
    let t = Instant::now();
    while progress.iter().any(|p| p.load(Relaxed) < 1000) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "a spinner starved: {progress:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.stop();
    for r in lc.join() {
        let st = r.unwrap();
        assert!(st.yields > 0 && st.iterations >= 1000);
    }
}

/// A pinned worker may start another on a different core (the process's
/// cores, not the caller's one), and a worker started unpinned from a pinned
/// one may run on every core.
#[test]
fn a_pinned_worker_starts_others_on_any_core_of_the_process() {
    let cores = available_cores();
    assert!(!cores.is_empty());
    let (first, last) = (cores[0], *cores.last().unwrap());
    let mut outer = Lcores::new();
    outer
        .launch(Some(first), "outer", move || {
            let mut inner = Lcores::new();
            inner.launch(Some(last), "pinned", current_cpu).unwrap();
            inner
                .launch(None, "free", || {
                    Some(core_affinity::get_core_ids().unwrap_or_default().len())
                })
                .unwrap();
            let mut r = inner.join().into_iter();
            let pinned = r.next().unwrap().unwrap();
            let free = r.next().unwrap().unwrap();
            (pinned, free)
        })
        .unwrap();
    let (pinned, free) = outer.join().pop().unwrap().unwrap();
    assert_eq!(pinned, Some(last));
    assert_eq!(
        free,
        Some(cores.len()),
        "the unpinned worker kept its parent's pin"
    );
}
