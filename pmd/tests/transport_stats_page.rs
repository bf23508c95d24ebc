//! The stats page: what a transport publishes for other processes
//! (`ntb-tool qp`) matches its own counters, follows its outstanding
//! operations and drops, goes away with it, and a reader refuses a page
//! that is not one without panicking.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ntbdk_pmd::hw::loopback::LoopbackFabric;
use ntbdk_pmd::transport::inject::Injector;
use ntbdk_pmd::transport::{
    Access, Config, DropKind, Geometry, PUBLISH_INTERVAL, PublishedState, RemoteAddr, Ring, Sge,
    Transport, TransportError, epoch, read_stats, stats_path,
};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let p = std::env::temp_dir().join(format!("ntbdk-stats-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    Dir(p)
}

/// Polls `t` until its page at `path` has been rewritten after this call
/// began (so it holds everything done before it), however long a loaded
/// machine takes: a rewrite waits for a publish interval and a slow-path
/// poll.
fn settle(t: &mut Transport, path: &Path) {
    let unix_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    // A poll first: what was sent to `t` is taken in now, and every page
    // rewrite from here on (a poll rewrites before it polls) shows it.
    t.progress();
    // A rewrite stamped a later millisecond than this began after it.
    let since = unix_ms();
    let end = Instant::now() + Duration::from_secs(10) + PUBLISH_INTERVAL;
    loop {
        t.progress();
        if read_stats(path).unwrap().updated_unix_ms > since {
            return;
        }
        assert!(Instant::now() < end, "the page was not rewritten in 10 s");
    }
}

#[test]
fn the_page_follows_counters_outstanding_work_and_drops() {
    let d = dir("follow");
    let fabric = LoopbackFabric::new(3, 4 << 20);
    let cfg = Config::new(Geometry::small(3));
    let rogue_dev = Arc::new(fabric.join(0).unwrap());
    let mut rogue = Transport::new(rogue_dev.clone(), cfg.clone()).unwrap();
    let mut victim = Transport::new(Arc::new(fabric.join(1).unwrap()), cfg).unwrap();
    while !rogue.is_connected(1) || !victim.is_connected(0) {
        rogue.progress();
        victim.progress();
    }
    let path = stats_path(&d.0, "lab", 1);
    victim.publish_stats(&path).unwrap();
    let page = read_stats(&path).unwrap();
    assert_eq!(page.port, 1);
    assert_eq!(page.pid, std::process::id());
    assert_eq!(page.peers.len(), 2, "ports 0 and 2, not ourselves");
    assert_eq!(page.peers[0].peer, 0);
    assert_eq!(page.peers[0].state, PublishedState::Connected);
    assert_eq!(page.peers[1].peer, 2);
    assert_eq!(page.peers[1].state, PublishedState::Down);
    assert_eq!(page.peers[0].outstanding_writes, 0);

    // A write towards a peer that does not poll stays outstanding.
    let target = rogue.register_region(4096, Access::ALL).unwrap();
    let src = victim.register_region(4096, Access::ALL).unwrap();
    let qp = victim.create_qp(0).unwrap();
    settle(&mut victim, &path); // learns of the region through the rogue's advertise
    victim
        .post_write(
            qp,
            &[Sge {
                key: src,
                offset: 0,
                len: 64,
            }],
            RemoteAddr {
                key: target,
                offset: 0,
            },
            7,
        )
        .unwrap();
    // Two malformed messages from the rogue.
    let e = epoch(rogue.incarnation(), victim.incarnation());
    let mut inj = Injector::new(&*rogue_dev, 1, *victim.layout(), e).unwrap();
    inj.push(Ring::Rx, &[0xff; 56]).unwrap();
    inj.push(Ring::Rx, &[0xff; 56]).unwrap();
    settle(&mut victim, &path);

    let page = read_stats(&path).unwrap();
    let p0 = &page.peers[0];
    assert_eq!(p0.outstanding_writes, 1, "{p0:?}");
    assert_eq!(p0.outstanding_reads, 0);
    assert_eq!(p0.counters.dropped(DropKind::Malformed), 2, "{p0:?}");
    // The page is the counters as of its last rewrite; only empty polls
    // have gone on since.
    let mut now = victim.counters(qp);
    assert!(p0.counters.empty_polls > 0 && p0.counters.empty_polls <= now.empty_polls);
    now.empty_polls = p0.counters.empty_polls;
    assert_eq!(p0.counters, now, "the page is the counters");
    assert!(p0.recvs_posted == 0 && p0.backlog == 0);
    assert!(page.updated_unix_ms > 0);

    drop(victim);
    assert!(!path.exists(), "the page goes with its transport");
    assert!(read_stats(&path).is_err());
}

#[test]
fn a_bad_page_is_an_error_not_a_panic() {
    let d = dir("bad");
    let fabric = LoopbackFabric::new(2, 4 << 20);
    let cfg = Config::new(Geometry::small(2));
    let mut t = Transport::new(Arc::new(fabric.join(0).unwrap()), cfg).unwrap();
    let good = stats_path(&d.0, "lab", 0);
    t.publish_stats(&good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    assert!(read_stats(&good).is_ok());

    let bad = d.0.join("bad");
    let check = |content: &[u8], needle: &str| {
        std::fs::write(&bad, content).unwrap();
        let e = read_stats(&bad).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    };
    let with_word = |i: usize, v: u64| {
        let mut b = bytes.clone();
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    check(b"", "shorter than a header");
    check(&[0u8; 4096], "no stats-page magic");
    check(&with_word(1, 99), "layout version 99");
    check(&with_word(5, 1 << 40), "bad geometry");
    check(&with_word(5, 4000), "cannot hold 4000 ports");
    check(&with_word(4, 2), "port 2 outside its 2 ports");
    check(&bytes[..bytes.len() - 8], "cannot hold 2 ports");
    check(&with_word(8, 1), "stayed in the middle of rewriting it");
    std::fs::write(&bad, with_word(8, 1)).unwrap();
    match read_stats(&bad) {
        Err(TransportError::StatsMidWrite { pid, .. }) => assert_eq!(pid, std::process::id()),
        other => panic!("{other:?}"),
    }
}

/// What another user can plant under a page's name in a world-writable
/// directory is refused at once: a FIFO (opening it would wait for a writer
/// for good) and a symbolic link (to a page or anything else).
#[test]
fn a_fifo_or_a_link_named_as_a_page_is_refused_without_blocking() {
    let d = dir("plant");
    let fifo = stats_path(&d.0, "lab", 1);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let e = read_stats(&fifo).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");

    let fabric = LoopbackFabric::new(2, 4 << 20);
    let mut t = Transport::new(
        Arc::new(fabric.join(0).unwrap()),
        Config::new(Geometry::small(2)),
    )
    .unwrap();
    let good = stats_path(&d.0, "lab", 0);
    t.publish_stats(&good).unwrap();
    let link = stats_path(&d.0, "lab", 2);
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let e = read_stats(&link).unwrap_err().to_string();
    assert!(e.contains("cannot open"), "{e}");
}

/// A page replaced at its path (a transport started again on the same
/// port) is a new file: a reader that opened the old one keeps reading it
/// whole, and
/// no file of the build is left beside it.
#[test]
fn a_replaced_page_is_a_new_file() {
    use std::os::unix::fs::MetadataExt;
    let d = dir("replace");
    let fabric = LoopbackFabric::new(2, 4 << 20);
    let cfg = Config::new(Geometry::small(2));
    let mut t = Transport::new(Arc::new(fabric.join(0).unwrap()), cfg).unwrap();
    let path = stats_path(&d.0, "lab", 0);
    t.publish_stats(&path).unwrap();
    let old = std::fs::File::open(&path).unwrap();
    let old_len = old.metadata().unwrap().len();
    t.publish_stats(&path).unwrap();
    let new = std::fs::metadata(&path).unwrap();
    assert_ne!(
        old.metadata().unwrap().ino(),
        new.ino(),
        "the same file, rewritten in place"
    );
    assert_eq!(
        old.metadata().unwrap().len(),
        old_len,
        "the old page was cut"
    );
    assert_eq!(read_stats(&path).unwrap().port, 0);
    let names: Vec<_> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}
