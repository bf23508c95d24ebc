//! `ntb-tool` end to end: the binary against a fabric in a private directory,
//! with a live device of this process as the peer.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let p = std::env::temp_dir().join(format!("ntbdk-tool-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    Dir(p)
}

fn tool(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ntb-tool"))
        .arg("--dir")
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("running ntb-tool")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = tool(dir, args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "ntb-tool {args:?} failed: {}{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn fails(dir: &Path, args: &[&str]) -> String {
    let o = tool(dir, args);
    assert!(!o.status.success(), "ntb-tool {args:?} should fail");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("error"), "{err}");
    err
}

#[test]
fn create_list_status_destroy() {
    let d = dir("life");
    let p = d.0.as_path();
    let out = ok(
        p,
        &["create", "lab", "--slots", "8", "--window-size", "64K"],
    );
    assert!(out.contains("8 slots"), "{out}");
    let err = fails(p, &["create", "lab"]);
    assert!(err.contains("already exists"), "{err}");
    assert!(ok(p, &["list"]).contains("lab"));
    let f = EmuFabric::attach_in(p, "lab").unwrap();
    assert_eq!(f.config().slots, 8);
    assert_eq!(f.config().window_size, 64 << 10);
    let st = ok(p, &["status", "lab", "--all"]);
    assert_eq!(
        st.lines().filter(|l| l.contains(" free ")).count(),
        8,
        "{st}"
    );
    ok(p, &["destroy", "lab"]);
    let err = fails(p, &["status", "lab"]);
    assert!(err.contains("no fabric named"), "{err}");
    let err = fails(p, &["create", "bad/name"]);
    assert!(err.contains("bad fabric name"), "{err}");
    let err = fails(p, &["create", "lab", "--window-size", "3 parsecs"]);
    assert!(err.contains("unknown size unit"), "{err}");
}

#[test]
fn registers_and_peer_operations_against_a_live_device() {
    let d = dir("regs");
    let p = d.0.as_path();
    ok(
        p,
        &[
            "create",
            "regs",
            "--slots",
            "4",
            "--window-size",
            "64K",
            "--timeout-ms",
            "2000",
        ],
    );
    let dev = EmuDevice::open(
        "regs",
        &DeviceConfig {
            fabric: FabricConfig {
                slots: 4,
                window_size: 64 << 10,
                ..Default::default()
            },
            dir: Some(p.to_owned()),
            ..Default::default()
        },
    )
    .unwrap();
    let me = dev.port().to_string();

    // Status shows our slot up and owned by us.
    let st = ok(p, &["status", "regs"]);
    let row = st
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{me} up")))
        .unwrap_or_else(|| panic!("no row for slot {me}:\n{st}"));
    assert!(row.contains(&std::process::id().to_string()), "{row}");

    // Ringing as a host (the tool claims a free slot briefly).
    ok(p, &["db", "ring", "regs", "--peer", &me, "0x5"]);
    assert_eq!(dev.db_read(), 0x5);
    assert!(ok(p, &["db", "read", "regs", "--slot", &me]).contains("db 0x5"));
    ok(p, &["db", "clear", "regs", "--slot", &me, "0x1"]);
    assert_eq!(dev.db_read(), 0x4);
    ok(p, &["db", "mask", "regs", "--slot", &me, "--set", "0xf0"]);
    assert_eq!(dev.db_mask(), 0xf0);
    let out = ok(p, &["db", "mask", "regs", "--slot", &me, "--clear", "0x30"]);
    assert!(out.contains("0xc0"), "{out}");

    // Scratchpads: the peer's through the bridge, and the slot's own.
    ok(p, &["spad", "write", "regs", "--peer", &me, "2", "0xbeef"]);
    assert_eq!(dev.spad_read(2).unwrap(), 0xbeef);
    dev.spad_write(3, 77).unwrap();
    let out = ok(p, &["spad", "read", "regs", "--peer", &me, "3"]);
    assert!(out.contains("(77)"), "{out}");
    let out = ok(p, &["spad", "read", "regs", "--slot", &me]);
    assert_eq!(out.lines().count(), 16, "{out}");
    ok(p, &["spad", "write", "regs", "--slot", &me, "5", "9"]);
    assert_eq!(dev.spad_read(5).unwrap(), 9);

    // Readable errors.
    let err = fails(p, &["spad", "read", "regs", "--slot", &me, "99"]);
    assert!(err.contains("no scratchpad 99"), "{err}");
    let err = fails(
        p,
        &["db", "ring", "regs", "--peer", &me, "--slot", &me, "1"],
    );
    assert!(err.contains("pid"), "{err}");
    let free = if dev.port() == 3 { "2" } else { "3" };
    let err = fails(p, &["db", "ring", "regs", "--peer", free, "1"]);
    assert!(err.contains("down"), "{err}");
    // The free slot the tool would act from is no peer.
    let err = fails(
        p,
        &["db", "ring", "regs", "--peer", free, "--slot", free, "1"],
    );
    assert!(err.contains("no peer to act on"), "{err}");
    let err = fails(p, &["destroy", "regs"]);
    assert!(err.contains("--force"), "{err}");

    // The tool's brief slots were released.
    let st = EmuFabric::attach_in(p, "regs").unwrap().status();
    assert_eq!(st.slots.iter().filter(|s| s.link_up).count(), 1);
    drop(dev);
    std::thread::sleep(Duration::from_millis(10));
    ok(p, &["destroy", "regs"]);
}

/// A fabric of four slots in `p` and a live device of this process on it.
fn fabric_with_device(p: &Path, name: &str) -> EmuDevice {
    ok(
        p,
        &[
            "create",
            name,
            "--slots",
            "4",
            "--window-size",
            "64K",
            "--timeout-ms",
            "2000",
        ],
    );
    device(p, name)
}

/// A live device of this process on the existing fabric `name` in `p`.
fn device(p: &Path, name: &str) -> EmuDevice {
    EmuFabric::attach_in(p, name)
        .unwrap()
        .join(&DeviceConfig::default())
        .unwrap()
}

#[test]
fn memory_window_bytes_through_the_bridge() {
    let d = dir("mw");
    let p = d.0.as_path();
    let dev = fabric_with_device(p, "mw");
    let me = dev.port().to_string();
    let win = dev.local_window(0).unwrap();

    let out = ok(
        p,
        &[
            "mw",
            "write",
            "mw",
            "--peer",
            &me,
            "--offset",
            "0x100",
            "de:ad:be:ef",
        ],
    );
    assert!(out.contains("4 bytes"), "{out}");
    let mut got = [0u8; 6];
    win.read(0xff, &mut got).unwrap();
    assert_eq!(got, [0, 0xde, 0xad, 0xbe, 0xef, 0]);

    let out = ok(
        p,
        &[
            "mw", "write", "mw", "--peer", &me, "--offset", "0x200", "--fill", "0x5a", "--len",
            "40",
        ],
    );
    assert!(out.contains("40 bytes"), "{out}");
    let mut got = [0u8; 42];
    win.read(0x1ff, &mut got).unwrap();
    assert_eq!(got[0], 0);
    assert!(got[1..41].iter().all(|&b| b == 0x5a), "{got:?}");
    assert_eq!(got[41], 0);

    win.write(0x300, b"hello, NTB").unwrap();
    let out = ok(
        p,
        &[
            "mw", "read", "mw", "--peer", &me, "--offset", "0x300", "--len", "10",
        ],
    );
    assert_eq!(
        out,
        "00000300  68 65 6c 6c 6f 2c 20 4e  54 42                    |hello, NTB|\n"
    );
    let reads = EmuFabric::attach_in(p, "mw").unwrap().status();
    assert!(
        reads
            .slots
            .iter()
            .all(|s| s.link_up == (s.slot == dev.port())),
        "the tool's brief slot was released"
    );

    let err = fails(
        p,
        &[
            "mw", "read", "mw", "--peer", &me, "--offset", "64K", "--len", "1",
        ],
    );
    assert!(err.contains("reading 1 bytes at 0x10000"), "{err}");
    let err = fails(
        p,
        &[
            "mw", "write", "mw", "--peer", &me, "--offset", "0xfffe", "aabbcc",
        ],
    );
    assert!(err.contains("writing 3 bytes at 0xfffe"), "{err}");
    let err = fails(p, &["mw", "read", "mw", "--peer", &me, "--len", "2M"]);
    assert!(err.contains("1 byte to 1 MiB"), "{err}");
    let err = fails(p, &["mw", "write", "mw", "--peer", &me, "xyz"]);
    assert!(err.contains("hex bytes"), "{err}");
    fails(p, &["mw", "write", "mw", "--peer", &me]);
}

#[test]
fn waits_for_a_doorbell_and_for_link_changes() {
    let d = dir("wait");
    let p = d.0.as_path();
    let dev = fabric_with_device(p, "wait");
    let me = dev.port().to_string();

    // Nothing rings: the wait ends with an error at its timeout.
    let err = fails(
        p,
        &["db", "wait", "wait", "--slot", &me, "--timeout", "0.2"],
    );
    assert!(err.contains("no doorbell"), "{err}");

    // A ring while waiting ends the wait with the bits; others do not.
    let waiter = std::thread::spawn({
        let p = p.to_owned();
        let me = me.clone();
        move || {
            ok(
                &p,
                &[
                    "db",
                    "wait",
                    "wait",
                    "--slot",
                    &me,
                    "0x4",
                    "--timeout",
                    "20",
                ],
            )
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    dev.fabric()
        .registers(dev.port())
        .unwrap()
        .db_set(0x1)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "bit 0x1 is not what it waits for");
    dev.fabric()
        .registers(dev.port())
        .unwrap()
        .db_set(0x4)
        .unwrap();
    let out = waiter.join().unwrap();
    assert!(out.contains("db 0x4"), "{out}");

    // Link: up now; down once the device leaves.
    let out = ok(
        p,
        &["link", "wait", "wait", "--slot", &me, "--timeout", "1"],
    );
    assert!(out.contains("link up"), "{out}");
    let err = fails(
        p,
        &[
            "link",
            "wait",
            "wait",
            "--slot",
            &me,
            "--down",
            "--timeout",
            "0.2",
        ],
    );
    assert!(err.contains("did not go down"), "{err}");
    let waiter = std::thread::spawn({
        let p = p.to_owned();
        let me = me.clone();
        move || {
            ok(
                &p,
                &[
                    "link",
                    "wait",
                    "wait",
                    "--slot",
                    &me,
                    "--down",
                    "--timeout",
                    "20",
                ],
            )
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    drop(dev);
    assert!(waiter.join().unwrap().contains("link down"));
    let err = fails(
        p,
        &["link", "wait", "wait", "--slot", "9", "--timeout", "0.1"],
    );
    assert!(err.contains("no slot 9"), "{err}");
}

#[test]
fn watch_prints_rates_per_host() {
    let d = dir("watch");
    let p = d.0.as_path();
    let dev = fabric_with_device(p, "watch");
    let me = dev.port().to_string();
    let peer = device(p, "watch");
    let win = peer.peer_window(dev.port(), 0).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    // The peer writes into our window and rings our doorbell meanwhile.
    let out = std::thread::scope(|s| {
        let (stop, peer, target) = (&stop, &peer, dev.port());
        s.spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                win.write(0, &[7u8; 64]).unwrap();
                peer.peer_db_set(target, 1).unwrap();
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        // The posted-write counters reach the fabric with the writer's
        // heartbeat (every 500 ms at this fabric's 2 s timeout): a sample
        // of 1.2 s spans at least two, however the jitter falls.
        let out = ok(p, &["status", "watch", "--watch", "1.2", "--count", "3"]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    assert_eq!(out.matches("rates over").count(), 3, "{out}");
    let writer_row = |sample: &str| -> Vec<String> {
        sample
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&peer.port().to_string()))
            .unwrap_or_else(|| panic!("no row for the writer:\n{out}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let last = out.rsplit("fabric watch").next().unwrap();
    let cols = writer_row(last);
    let rate: f64 = cols[6].parse().unwrap();
    assert!(rate > 100.0, "the writer posts writes: {cols:?}\n{out}");
    let target = last
        .lines()
        .find(|l| l.split_whitespace().next() == Some(me.as_str()))
        .unwrap();
    let target: Vec<&str> = target.split_whitespace().collect();
    assert_eq!(target[6], "0", "the target posts nothing: {target:?}");
    let rings: f64 = target[9].parse().unwrap();
    assert!(
        rings > 100.0,
        "rings received at the target: {target:?}\n{out}"
    );
    assert_eq!(cols[9], "0", "the writer receives no rings: {cols:?}");
    let err = fails(p, &["status", "watch", "--watch", "0"]);
    assert!(err.contains("--watch must be a positive number"), "{err}");
    let err = fails(p, &["status", "watch", "--watch", "1e19"]);
    assert!(err.contains("at most a day"), "{err}");
}

#[test]
fn list_marks_fabrics_whose_owners_are_all_dead() {
    let d = dir("dead");
    let p = d.0.as_path();
    ok(
        p,
        &["create", "alive", "--slots", "2", "--window-size", "64K"],
    );
    let _dev = device(p, "alive");
    let out = ok(p, &["list"]);
    assert!(
        !out.contains("owners dead"),
        "nobody owns a slot yet: {out}"
    );
    // A process that creates and joins "dead", then is killed without
    // leaving (so the fabric stays behind).
    let mut owner = Command::new(env!("CARGO_BIN_EXE_ntb-perf"))
        .args(["--server", "--fabric", "dead"])
        .env("NTBDK_SHM_DIR", p)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !EmuFabric::attach_in(p, "dead").is_ok_and(|f| f.status().slots.iter().any(|s| s.link_up))
    {
        assert!(owner.try_wait().unwrap().is_none(), "the server exited");
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server never joined"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = ok(p, &["list"]);
    assert!(!out.contains("owners dead"), "its owner lives: {out}");
    owner.kill().unwrap();
    owner.wait().unwrap();
    let out = ok(p, &["list"]);
    let line = |n: &str| {
        out.lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("{n} not listed:\n{out}"))
            .to_owned()
    };
    assert!(!line("alive").contains("owners dead"), "{out}");
    assert!(line("dead").contains("owners dead (1 slots held)"), "{out}");
    assert!(line("dead").contains("--reclaim"), "{out}");
}

#[test]
fn qp_shows_each_hosts_queue_pairs_from_their_stats_pages() {
    use ntbdk_apps::cli::session::publish_stats;
    use ntbdk_apps::perf::{Endpoint, fabric_config};
    use ntbdk_pmd::transport::{RemoteAddr, Sge};

    let d = dir("qp");
    let p = d.0.as_path();
    let f = EmuFabric::create_in(p, "qp", &fabric_config(4)).unwrap();
    let out = ok(p, &["qp", "qp"]);
    assert!(out.contains("no queue pairs published"), "{out}");

    let join = |slot| {
        std::sync::Arc::new(
            f.join(&DeviceConfig {
                slot: Some(slot),
                ..Default::default()
            })
            .unwrap(),
        )
    };
    let (dev_a, dev_b) = (join(0), join(1));
    let mut a = Endpoint::new(dev_a.clone(), Duration::from_secs(30)).unwrap();
    let mut b = Endpoint::new(dev_b.clone(), Duration::from_secs(30)).unwrap();
    publish_stats("test", &mut a.t, &dev_a);
    publish_stats("test", &mut b.t, &dev_b);
    let t0 = std::time::Instant::now();
    while !a.t.is_connected(1) || !b.t.is_connected(0) {
        a.t.progress();
        b.t.progress();
        assert!(t0.elapsed() < Duration::from_secs(20), "no connection");
    }
    // Both pages show the connection (a page is rewritten at most once per
    // publish interval, from a poll), however long a loaded machine takes.
    use ntbdk_pmd::transport::{PublishedPeer, PublishedState, read_stats, stats_path};
    let (page_a, page_b) = (stats_path(p, "qp", 0), stats_path(p, "qp", 1));
    let peer = |page: &Path, port| -> PublishedPeer {
        let stats = read_stats(page).unwrap();
        stats.peers.into_iter().find(|x| x.peer == port).unwrap()
    };
    let t0 = std::time::Instant::now();
    while peer(&page_a, 1).state != PublishedState::Connected
        || peer(&page_b, 0).state != PublishedState::Connected
    {
        a.t.progress();
        b.t.progress();
        assert!(t0.elapsed() < Duration::from_secs(20), "pages never fresh");
    }
    // A write from A to B that B never serves (B stops polling).
    let qp = a.t.create_qp(1).unwrap();
    a.t.post_write(
        qp,
        &[Sge {
            key: a.data,
            offset: 0,
            len: 4096,
        }],
        RemoteAddr {
            key: b.data,
            offset: 0,
        },
        1,
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    while peer(&page_a, 1).outstanding_writes != 1 {
        a.t.progress();
        assert!(t0.elapsed() < Duration::from_secs(20), "page never fresh");
    }

    let out = ok(p, &["qp", "qp"]);
    let row = |host: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(host))
            .unwrap_or_else(|| panic!("no row for host {host}:\n{out}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let ra = row("0");
    assert_eq!(ra[1], std::process::id().to_string(), "{out}");
    assert_eq!(&ra[2..7], ["1", "connected", "1", "0", "0"], "{out}");
    let rb = row("1");
    assert_eq!(&rb[2..5], ["0", "connected", "0"], "{out}");
    assert_eq!(
        out.lines().count(),
        3,
        "never-connected peers hidden: {out}"
    );
    assert_eq!(
        ok(p, &["qp", "qp", "--all"]).lines().count(),
        7,
        "two hosts, three peers each"
    );

    // A page nobody holds the slot of is stale, not shown as live.
    std::fs::copy(&page_a, stats_path(p, "qp", 3)).unwrap();
    let out = ok(p, &["qp", "qp"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("   3") && l.contains("stale")),
        "{out}"
    );
    std::fs::write(stats_path(p, "qp", 2), b"junk").unwrap();
    let out = ok(p, &["qp", "qp"]);
    assert!(out.contains("unreadable"), "{out}");
    // A FIFO planted under a page's name is refused, not waited on.
    let fifo = stats_path(p, "qp", 5);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let out = ok(p, &["qp", "qp"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("   5") && l.contains("not a regular file")),
        "{out}"
    );
    // A page its live host last rewrote long ago says how old it is; one
    // its live host left mid-write says so. (Neither host polls now.)
    use std::os::unix::fs::FileExt;
    let poke = |page: &Path, word: u64, v: u64| {
        let file = std::fs::OpenOptions::new().write(true).open(page).unwrap();
        file.write_all_at(&v.to_le_bytes(), word * 8).unwrap();
    };
    poke(&page_a, 9, 1);
    poke(&page_b, 8, 1);
    let out = ok(p, &["qp", "qp"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("   0") && l.contains("last rewritten")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("   1") && l.contains("in the middle of rewriting it")),
        "{out}"
    );
    let e = fails(p, &["qp", "vfio:0000:00:03.0"]);
    assert!(e.contains("only hosts on an emulated fabric"), "{e}");

    drop(a);
    assert!(!page_a.exists(), "the page goes with its transport");
    drop(b);
    drop((dev_a, dev_b));
    ok(p, &["destroy", "qp", "--force"]);
    let left: Vec<_> = std::fs::read_dir(p)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "destroy removes the stale pages too: {left:?}"
    );
}

#[test]
fn help_everywhere() {
    let d = dir("help");
    for args in [
        &["--help"][..],
        &["create", "--help"],
        &["status", "--help"],
        &["spad", "write", "--help"],
        &["db", "ring", "--help"],
        &["db", "mask", "--help"],
        &["db", "wait", "--help"],
        &["mw", "read", "--help"],
        &["mw", "write", "--help"],
        &["link", "wait", "--help"],
        &["qp", "--help"],
    ] {
        let out = ok(&d.0, args);
        assert!(out.contains("Usage"), "{args:?}: {out}");
    }
    let o = tool(&d.0, &["frobnicate"]);
    assert!(!o.status.success());
}
