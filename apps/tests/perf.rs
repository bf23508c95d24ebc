//! `ntb-perf` end to end: short self-contained runs of both tests and all
//! three operations with their output checked, two terminals, and every way
//! it must fail cleanly (bad size, unknown fabric, busy slot, absent peer).
//!
//! Every run gets its own fabric directory (`NTBDK_SHM_DIR`), a deadline
//! after which it is killed, and is checked to leave no fabric behind.

use std::time::{Duration, Instant};

use ntbdk_apps::report::Report;

const BIN: &str = env!("CARGO_BIN_EXE_ntb-perf");

mod common;
use common::{DEADLINE, Dir, Run, assert_fails_with, assert_ok, run};

/// Waits until a `--server` run holds its slot (it says so once it does).
fn wait_until_serving(server: &Run) {
    let t = Instant::now();
    while !std::fs::read_to_string(&server.out)
        .unwrap_or_default()
        .contains("waiting for a client")
    {
        assert!(t.elapsed() < DEADLINE, "the server never joined its fabric");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The rows (split into cells) between the header starting with `#bytes`
/// whose line contains `marker` and the closing rule.
fn rows(stdout: &str, marker: &str) -> Vec<Vec<String>> {
    let mut lines = stdout
        .lines()
        .skip_while(|l| !(l.contains("#bytes") && l.contains(marker)));
    assert!(
        lines.next().is_some(),
        "no table with {marker:?}:\n{stdout}"
    );
    lines
        .take_while(|l| !l.starts_with("---"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn num(cell: &str) -> f64 {
    cell.parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a number"))
}

/// A bandwidth row: size, count, plausible positive rates that agree.
fn check_bw(row: &[String], bytes: u64, iters: Option<u64>) {
    assert_eq!(row.len(), 4, "{row:?}");
    assert_eq!(num(&row[0]) as u64, bytes, "{row:?}");
    let n = num(&row[1]) as u64;
    match iters {
        Some(i) => assert_eq!(n, i, "{row:?}"),
        None => assert!(n > 0, "{row:?}"),
    }
    let (gbps, mpps) = (num(&row[2]), num(&row[3]));
    assert!(mpps > 0.0 && mpps < 1000.0, "{row:?}");
    // GB/s = bytes * Mpps / 1000 (two decimals printed).
    let expect = bytes as f64 * mpps / 1000.0;
    assert!((gbps - expect).abs() <= 0.01 + expect * 0.01, "{row:?}");
}

/// A latency row: size, count, ordered positive figures.
fn check_lat(row: &[String], bytes: u64, iters: Option<u64>) {
    assert_eq!(row.len(), 8, "{row:?}");
    assert_eq!(num(&row[0]) as u64, bytes, "{row:?}");
    if let Some(i) = iters {
        assert_eq!(num(&row[1]) as u64, i, "{row:?}");
    }
    let v: Vec<f64> = row[2..].iter().map(|c| num(c)).collect();
    let (min, typ, p99, p999, max) = (v[0], v[1], v[3], v[4], v[5]);
    assert!(min > 0.0, "{row:?}");
    assert!(
        min <= typ && typ <= p99 && p99 <= p999 && p999 <= max,
        "{row:?}"
    );
}

#[test]
fn write_bw_and_lat_with_json_and_plot() {
    let dir = Dir::new("write");
    let json = dir.0.join("figures.json");
    let svg = dir.0.join("plot.svg");
    let d = run(
        &dir,
        &[
            "-s",
            "4K",
            "-n",
            "2000",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert_ok(&d);
    let bw = rows(&d.stdout, "BW average[GB/s]");
    assert_eq!(bw.len(), 1, "{}", d.stdout);
    check_bw(&bw[0], 4096, Some(2000));
    let lat = rows(&d.stdout, "t_typical[usec]");
    assert_eq!(lat.len(), 1, "{}", d.stdout);
    check_lat(&lat[0], 4096, Some(2000));
    assert!(
        d.stdout.contains("non-posted reads 0 (0:"),
        "the counters must prove posted writes only:\n{}",
        d.stdout
    );
    let report = Report::read_json(&json).unwrap();
    assert_eq!(report.tool, "ntb-perf");
    assert_eq!(report.params["op"], "write");
    assert_eq!(report.bandwidth.len(), 1);
    assert_eq!(report.bandwidth[0].bytes, 4096);
    assert_eq!(report.bandwidth[0].iterations, 2000);
    assert!(report.bandwidth[0].gb_per_s > 0.0);
    assert_eq!(report.latency.len(), 1);
    assert_eq!(report.latency[0].iterations, 2000);
    assert!(!report.latency[0].distribution.is_empty());
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg"), "not an SVG");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

#[test]
fn sweep_of_sizes_by_duration() {
    let dir = Dir::new("sweep");
    let d = run(&dir, &["--test", "bw", "-a", "-D", "0.01"]);
    assert_ok(&d);
    let bw = rows(&d.stdout, "BW average[GB/s]");
    assert_eq!(bw.len(), 23, "2 B .. 8 MiB is 23 sizes:\n{}", d.stdout);
    for (i, row) in bw.iter().enumerate() {
        check_bw(row, 2 << i, None);
    }
    assert!(!d.stdout.contains("t_typical"), "--test bw runs no latency");
    assert!(dir.fabrics().is_empty());
}

#[test]
fn send_and_read() {
    let dir = Dir::new("ops");
    for op in ["send", "read"] {
        let d = run(&dir, &["--op", op, "-s", "64", "-n", "1000"]);
        assert_ok(&d);
        check_bw(&rows(&d.stdout, "BW average")[0], 64, Some(1000));
        check_lat(&rows(&d.stdout, "t_typical")[0], 64, Some(1000));
        let what = if op == "read" {
            "round trip"
        } else {
            "half round trip"
        };
        assert!(d.stdout.contains(what), "{}", d.stdout);
    }
    // A send sweep stops at one eager buffer.
    let d = run(&dir, &["--op", "send", "--test", "lat", "-n", "100"]);
    assert_ok(&d);
    let lat = rows(&d.stdout, "t_typical");
    assert_eq!(lat.len(), 12, "2 B .. 4 KiB:\n{}", d.stdout);
    assert!(dir.fabrics().is_empty());
}

#[test]
fn two_terminals() {
    let dir = Dir::new("two");
    let server = Run::start(&dir, "server", &["--fabric", "t2", "--server"]);
    wait_until_serving(&server);
    let client = run(
        &dir,
        &[
            "--fabric", "t2", "--test", "bw", "-s", "1M", "-n", "200", "--burst", "8",
        ],
    );
    assert_ok(&client);
    check_bw(&rows(&client.stdout, "BW average")[0], 1 << 20, Some(200));
    let server = server.finish();
    assert_ok(&server);
    assert!(server.stdout.contains("served port"), "{}", server.stdout);
    assert!(dir.fabrics().is_empty(), "the server removes its fabric");
}

#[test]
fn bad_arguments_are_refused() {
    let dir = Dir::new("args");
    for (args, needle) in [
        (&["-s", "9M"][..], "bad size"),
        (&["-s", "0"][..], "bad size"),
        (&["-s", "lots"][..], "bad size"),
        (&["--op", "send", "-s", "8K"][..], "use --op write"),
        (&["--op", "fly"][..], "invalid value"),
        (&["-s", "64", "-a"][..], "cannot be used with"),
        (&["-D", "0"][..], "-D/--duration"),
        (&["--timeout", "0"][..], "--timeout"),
        (&["--lcore", "999"][..], "--lcore 999"),
        (&["--server"][..], "--fabric"),
        (&["--qp", "9"][..], "--qp"),
    ] {
        let d = run(&dir, args);
        assert_fails_with(&d, needle);
    }
    assert!(dir.fabrics().is_empty());
}

#[test]
fn unknown_fabric() {
    let dir = Dir::new("unknown");
    let d = run(&dir, &["--fabric", "nosuch", "-s", "64"]);
    assert_fails_with(&d, "no fabric named \"nosuch\"");
    assert!(d.stderr.contains("--server"), "{}", d.stderr);
}

#[test]
fn absent_peer_times_out() {
    let dir = Dir::new("absent");
    // A server that waits for a client that never comes.
    let d = run(
        &dir,
        &["--fabric", "lonely", "--server", "--timeout", "0.5"],
    );
    assert_fails_with(&d, "joined fabric");
    assert!(dir.fabrics().is_empty());
}

#[test]
fn busy_slot_is_refused() {
    let dir = Dir::new("busy");
    let server = Run::start(
        &dir,
        "server",
        &["--fabric", "b", "--server", "--timeout", "5"],
    );
    wait_until_serving(&server);
    let d = run(&dir, &["--fabric", "b", "--slot", "0", "-s", "64"]);
    assert_fails_with(&d, "slot 0");
    drop(server);
}
