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
    server.wait_for_stdout("waiting for a client");
}

/// perftest's bandwidth header (MB/sec), exactly as `ib_write_bw` prints it.
const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
/// perftest's latency header, exactly as `ib_write_lat` prints it.
const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                          t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// What a script written for perftest does with its output: find the line
/// that is exactly perftest's `header`, take the lines after it up to the
/// dashed rule, split each on whitespace and read fields by perftest's
/// column positions.
fn perftest_rows(stdout: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines().skip_while(|l| *l != header);
    assert!(
        lines.next().is_some(),
        "no line equal to perftest's header {header:?}:\n{stdout}"
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

/// A bandwidth row read at perftest's positions ($1 #bytes, $2
/// #iterations, $3 BW peak, $4 BW average, $5 MsgRate): the size, the
/// count, and rates that agree (MB/sec = 2^20 bytes/s, as perftest's).
fn check_bw(row: &[String], bytes: u64, iters: Option<u64>) {
    assert_eq!(row.len(), 5, "{row:?}");
    assert_eq!(num(&row[0]) as u64, bytes, "{row:?}");
    let n = num(&row[1]) as u64;
    match iters {
        Some(i) => assert_eq!(n, i, "{row:?}"),
        None => assert!(n > 0, "{row:?}"),
    }
    let (peak, avg, mpps) = (num(&row[2]), num(&row[3]), num(&row[4]));
    assert!(mpps > 0.0 && mpps < 1000.0, "{row:?}");
    let expect = bytes as f64 * mpps * 1e6 / f64::from(1u32 << 20);
    assert!((avg - expect).abs() <= 0.01 + expect * 0.01, "{row:?}");
    // The peak is never below the average (a stretch at least as fast as
    // the whole run exists).
    assert!(peak >= avg, "{row:?}");
}

/// A latency row read at perftest's positions ($3 t_min, $4 t_max, $5
/// t_typical, $6 t_avg, $7 t_stdev, $8 99%, $9 99.9%): ordered, positive.
fn check_lat(row: &[String], bytes: u64, iters: Option<u64>) {
    assert_eq!(row.len(), 9, "{row:?}");
    assert_eq!(num(&row[0]) as u64, bytes, "{row:?}");
    if let Some(i) = iters {
        assert_eq!(num(&row[1]) as u64, i, "{row:?}");
    }
    let v: Vec<f64> = row[2..].iter().map(|c| num(c)).collect();
    let (min, max, typ, avg, stdev, p99, p999) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    assert!(min > 0.0, "{row:?}");
    assert!(
        min <= typ && typ <= p99 && p99 <= p999 && p999 <= max,
        "{row:?}"
    );
    assert!(min <= avg && avg <= max && stdev >= 0.0, "{row:?}");
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
    let bw = perftest_rows(&d.stdout, BW_HEADER);
    assert_eq!(bw.len(), 1, "{}", d.stdout);
    check_bw(&bw[0], 4096, Some(2000));
    let lat = perftest_rows(&d.stdout, LAT_HEADER);
    assert_eq!(lat.len(), 1, "{}", d.stdout);
    check_lat(&lat[0], 4096, Some(2000));
    assert!(
        d.stdout.contains("non-posted reads 0 (0:"),
        "the counters must prove posted writes only:\n{}",
        d.stdout
    );
    let report = Report::read_json(&json).unwrap();
    assert_eq!(report.tool, "ntb-perf");
    check_json_fields(&std::fs::read_to_string(&json).unwrap(), &json);
    assert_eq!(report.params["op"], "write");
    assert_eq!(report.bandwidth.len(), 1);
    assert_eq!(report.bandwidth[0].bytes, 4096);
    assert_eq!(report.bandwidth[0].iterations, 2000);
    assert!(report.bandwidth[0].gb_per_s > 0.0);
    assert_eq!(report.latency.len(), 1);
    assert_eq!(report.latency[0].iterations, 2000);
    assert!(
        !report.latency[0].interrupted,
        "a complete row is not marked"
    );
    assert!(
        !std::fs::read_to_string(&json)
            .unwrap()
            .contains("interrupted"),
        "nor is the field written for it"
    );
    assert!(!report.latency[0].distribution.is_empty());
    let svg = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the plot is well-formed XML");
    // One size: bandwidth, message rate, and its latency's percentile plot.
    let series = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("series"))
        .count();
    assert_eq!(series, 3, "{svg}");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

/// The client's `served` count from its counters block: writes the server
/// placed into our region through the rendezvous (none when it answers
/// with one-sided writes).
fn served_by_client(stdout: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.contains("qp -> port"))
        .unwrap_or_else(|| panic!("no counters line:\n{stdout}"));
    let at = line.find("served ").expect("a served count") + "served ".len();
    line[at..].split(',').next().unwrap().parse().unwrap()
}

#[test]
fn write_modes_direct_and_rendezvous() {
    let dir = Dir::new("modes");
    for mode in ["direct", "rendezvous"] {
        let json = dir.0.join(format!("{mode}.json"));
        let d = run(
            &dir,
            &[
                "--op",
                "write",
                "--write-mode",
                mode,
                "-s",
                "4K",
                "-n",
                "1000",
                "--json",
                json.to_str().unwrap(),
            ],
        );
        assert_ok(&d);
        assert!(
            d.stdout.contains(&format!(" Write mode      : {mode} (")),
            "{}",
            d.stdout
        );
        check_bw(&perftest_rows(&d.stdout, BW_HEADER)[0], 4096, Some(1000));
        check_lat(&perftest_rows(&d.stdout, LAT_HEADER)[0], 4096, Some(1000));
        let served = served_by_client(&d.stdout);
        if mode == "direct" {
            assert_eq!(served, 0, "answers are one-sided writes:\n{}", d.stdout);
        } else {
            assert!(
                served >= 1000,
                "answers are rendezvous writes:\n{}",
                d.stdout
            );
        }
        assert_eq!(Report::read_json(&json).unwrap().params["write_mode"], mode);
    }
    // The default is direct; a sweep re-arms the polled byte at each size.
    let d = run(&dir, &["--test", "lat", "-a", "-n", "50"]);
    assert_ok(&d);
    assert!(
        d.stdout.contains(" Write mode      : direct ("),
        "{}",
        d.stdout
    );
    let lat = perftest_rows(&d.stdout, LAT_HEADER);
    assert_eq!(lat.len(), 23, "2 B .. 8 MiB:\n{}", d.stdout);
    for (i, row) in lat.iter().enumerate() {
        check_lat(row, 2 << i, Some(50));
    }
    let d = run(
        &dir,
        &["--op", "read", "--write-mode", "direct", "-s", "64"],
    );
    assert_fails_with(&d, "--write-mode says how --op write writes");
    assert!(dir.fabrics().is_empty());
}

/// The rows after a bidirectional table's rule: this side's direction,
/// then the servers'.
fn direction_rows(stdout: &str) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let after = |marker: &str| -> Vec<Vec<String>> {
        stdout
            .lines()
            .skip_while(|l| !l.contains(marker))
            .skip(1)
            .take_while(|l| l.starts_with(' ') && !l.contains("->") && !l.starts_with("---"))
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    };
    (
        after("(this side, as measured here)"),
        after("(the servers, as each timed itself)"),
    )
}

#[test]
fn bidirectional_bandwidth_sums_both_directions() {
    let dir = Dir::new("bidir");
    for op in ["write", "send", "read"] {
        let json = dir.0.join(format!("{op}.json"));
        let d = run(
            &dir,
            &[
                "-b",
                "--op",
                op,
                "--test",
                "bw",
                "-s",
                "1K",
                "-n",
                "2000",
                "--json",
                json.to_str().unwrap(),
            ],
        );
        assert_ok(&d);
        assert!(d.stdout.contains("Bidirectional BW Test"), "{}", d.stdout);
        let total = perftest_rows(&d.stdout, BW_HEADER);
        assert_eq!(total.len(), 1, "{}", d.stdout);
        check_bw(&total[0], 1024, None);
        let (ours, theirs) = direction_rows(&d.stdout);
        assert_eq!((ours.len(), theirs.len()), (1, 1), "{}", d.stdout);
        check_bw(&ours[0], 1024, Some(2000));
        // The server posts its -n too, as perftest's -b does on each side.
        check_bw(&theirs[0], 1024, Some(2000));
        // The total sums the directions' figures beside this side's
        // iterations, as perftest's -b reports.
        let n = |r: &[String], i: usize| num(&r[i]);
        assert_eq!(n(&total[0], 1), n(&ours[0], 1), "{}", d.stdout);
        for col in [3, 4] {
            let sum = n(&ours[0], col) + n(&theirs[0], col);
            assert!(
                (n(&total[0], col) - sum).abs() <= 0.02 + sum * 0.001,
                "column {col}: {}",
                d.stdout
            );
        }
        let report = Report::read_json(&json).unwrap();
        assert_eq!(report.params["bidirectional"], true);
        assert_eq!(report.bandwidth[0].iterations, n(&total[0], 1) as u64);
    }
    // Two servers share -n 3 (2 and 1), and -n 1 (1 and 0: a server with
    // no share posts nothing, not "until stopped").
    for (iters, servers_total) in [("3", 3), ("1", 1)] {
        let d = run(
            &dir,
            &["-b", "-q", "2", "--test", "bw", "-s", "64", "-n", iters],
        );
        assert_ok(&d);
        let (ours, theirs) = direction_rows(&d.stdout);
        check_bw(&ours[0], 64, Some(iters.parse().unwrap()));
        check_bw(&theirs[0], 64, Some(servers_total));
    }
    assert!(dir.fabrics().is_empty());
}

/// The header's " CQ Moderation   : N" line.
fn cq_moderation(stdout: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(" CQ Moderation"))
        .unwrap_or_else(|| panic!("no CQ Moderation line:\n{stdout}"));
    num(line.rsplit(':').next().unwrap().trim()) as u64
}

#[test]
fn completion_moderation_counts_every_request() {
    let dir = Dir::new("cqmod");
    // (arguments, the moderation used): perftest's default of 100, its
    // post list rule, its large-message rule, a count -Q does not divide,
    // the window shared by two servers (128 / 2), and what cannot go
    // unsignaled.
    for (args, moderation) in [
        (&["--op", "send", "-s", "64", "-n", "1000"][..], 100),
        (
            &["--op", "send", "-s", "64", "-n", "1000", "-l", "32"][..],
            32,
        ),
        (
            &[
                "--op", "send", "-s", "64", "-n", "1000", "-l", "32", "-Q", "8",
            ][..],
            8,
        ),
        (&["-s", "64", "-n", "999", "-Q", "7"][..], 7),
        (&["-s", "16K", "-n", "300"][..], 1),
        (&["-s", "16K", "-n", "300", "-Q", "16"][..], 16),
        (&["-s", "64", "-n", "1000", "-q", "2"][..], 64),
        (
            &["--op", "send", "-s", "64", "-n", "1000", "-t", "10"][..],
            10,
        ),
        // Clamped to the window, and still dividing the post list.
        (
            &[
                "--op", "send", "-s", "64", "-n", "960", "-l", "96", "-Q", "96", "-t", "64",
            ][..],
            48,
        ),
        (&["--op", "read", "-s", "64", "-n", "500"][..], 1),
        (
            &["--write-mode", "rendezvous", "-s", "64", "-n", "500"][..],
            1,
        ),
    ] {
        let mut a = vec!["--test", "bw"];
        a.extend_from_slice(args);
        let d = run(&dir, &a);
        assert_ok(&d);
        assert_eq!(cq_moderation(&d.stdout), moderation, "{args:?}");
        let iters: u64 = args[args.iter().position(|a| *a == "-n").unwrap() + 1]
            .parse()
            .unwrap();
        let size = if args.contains(&"16K") { 16384 } else { 64 };
        // Every request counted once, however few were signaled.
        check_bw(&perftest_rows(&d.stdout, BW_HEADER)[0], size, Some(iters));
    }
    // Timed runs end with requests unsignaled: one more, signaled,
    // accounts for them, and the run ends.
    for op in ["send", "write"] {
        let d = run(&dir, &["--test", "bw", "--op", op, "-s", "64", "-D", "0.3"]);
        assert_ok(&d);
        check_bw(&perftest_rows(&d.stdout, BW_HEADER)[0], 64, None);
    }
    for (args, needle) in [
        (&["--op", "read", "-Q", "4"][..], "always signaled"),
        (
            &["--write-mode", "rendezvous", "-Q", "4"][..],
            "always signaled",
        ),
        (&["--test", "lat", "-Q", "4"][..], "bandwidth tests"),
        (
            &["--op", "send", "-l", "32", "-Q", "5"][..],
            "multiple of -Q 5",
        ),
        (&["-Q", "0"][..], "--cq-mod"),
    ] {
        assert_fails_with(&run(&dir, args), needle);
    }
    assert!(dir.fabrics().is_empty());
}

#[test]
fn windows_are_described_for_every_side() {
    use ntbdk_mempool::{HugepageCounts, PageSize};
    let dir = Dir::new("windows");
    let d = run(&dir, &["--test", "bw", "-s", "64", "-n", "100", "-q", "2"]);
    assert_ok(&d);
    let line = d
        .stdout
        .lines()
        .find(|l| l.starts_with(" Windows         : "))
        .unwrap_or_else(|| panic!("no Windows line:\n{}", d.stdout));
    for port in 0..3 {
        assert!(line.contains(&format!("port {port} on ")), "{line}");
    }
    let pools: Vec<HugepageCounts> = [PageSize::Huge2M, PageSize::Huge1G]
        .into_iter()
        .filter_map(HugepageCounts::read)
        .collect();
    let none_reserved = !pools.is_empty() && pools.iter().all(|c| c.total == 0);
    if line.contains("on 4 KiB pages") {
        assert_eq!(
            line.contains("no hugepages reserved"),
            none_reserved,
            "{line}"
        );
    } else {
        assert!(!line.contains("("), "every side on hugepages: {line}");
    }
}

#[test]
fn spinners_sharing_a_core_are_warned_of() {
    let dir = Dir::new("cores");
    // The servers of --qp 2 take cores from --peer-lcore on: from 0, the
    // first shares the client's (on any machine).
    let d = run(
        &dir,
        &[
            "--test",
            "bw",
            "-s",
            "64",
            "-n",
            "10",
            "-q",
            "2",
            "--lcore",
            "0",
            "--peer-lcore",
            "0",
        ],
    );
    assert_ok(&d);
    assert!(
        d.stderr
            .contains("the client and server 1 poll on the same core 0")
            && d.stderr.contains("--peer-lcore for the first server"),
        "{}",
        d.stderr
    );
    let d = run(
        &dir,
        &[
            "--test",
            "lat",
            "-s",
            "64",
            "-n",
            "10",
            "--lcore",
            "0",
            "--peer-lcore",
            "0",
        ],
    );
    assert_ok(&d);
    assert!(
        d.stderr
            .contains("the client and server 1 poll on the same core 0"),
        "{}",
        d.stderr
    );
    assert_eq!(d.stderr.matches("poll on the same core").count(), 1, "once");
}

#[test]
fn sweep_of_sizes_by_duration() {
    let dir = Dir::new("sweep");
    let d = run(&dir, &["--test", "bw", "-a", "-D", "0.01"]);
    assert_ok(&d);
    let bw = perftest_rows(&d.stdout, BW_HEADER);
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
        check_bw(&perftest_rows(&d.stdout, BW_HEADER)[0], 64, Some(1000));
        check_lat(&perftest_rows(&d.stdout, LAT_HEADER)[0], 64, Some(1000));
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
    let lat = perftest_rows(&d.stdout, LAT_HEADER);
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
    check_bw(
        &perftest_rows(&client.stdout, BW_HEADER)[0],
        1 << 20,
        Some(200),
    );
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
        (
            &["--fabric", "x", "--peer-slot", "1", "--qp", "2"][..],
            "--peer-slot names one server",
        ),
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

/// A client asking for more servers than the fabric has other ports fails
/// at once, saying how to make room, instead of waiting out its timeout.
/// A server on `fabric` that outlives any slow client start (it is killed
/// on drop), once it waits for a client.
fn serving(dir: &Dir, fabric: &str) -> Run {
    let server = Run::start(
        dir,
        "server",
        &["--fabric", fabric, "--server", "--timeout", "60"],
    );
    wait_until_serving(&server);
    server
}

#[test]
fn more_servers_than_ports_is_refused_at_once() {
    let dir = Dir::new("qports");
    let server = serving(&dir, "qp");
    let t = std::time::Instant::now();
    let d = run(&dir, &["--fabric", "qp", "-q", "2", "-s", "64"]);
    assert_fails_with(&d, "at most 1 server(s)");
    assert!(d.stderr.contains("--slots 3"), "{}", d.stderr);
    // Well under the client's 10 s wait for its servers, which it would
    // have waited out.
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    drop(server);
}

#[test]
fn busy_slot_is_refused() {
    let dir = Dir::new("busy");
    let server = serving(&dir, "b");
    let d = run(&dir, &["--fabric", "b", "--slot", "0", "-s", "64"]);
    assert_fails_with(&d, "slot 0");
    drop(server);
}

#[test]
fn perftest_flags_gbits_post_list_and_out_json() {
    let dir = Dir::new("flags");
    let json = dir.0.join("out.json");
    let d = run(
        &dir,
        &[
            "--test",
            "bw",
            "-s",
            "64K",
            "-n",
            "1000",
            "-l",
            "8",
            "-t",
            "64",
            "-q",
            "1",
            "-F",
            "--report_gbits",
            "--out_json",
            "--out_json_file",
            json.to_str().unwrap(),
        ],
    );
    assert_ok(&d);
    assert!(d.stdout.contains(" Post List       : 8\n"), "{}", d.stdout);
    assert!(d.stdout.contains(" TX depth        : 64\n"), "{}", d.stdout);
    let header = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";
    let rows = perftest_rows(&d.stdout, header);
    assert_eq!(rows.len(), 1, "{}", d.stdout);
    let r = &rows[0];
    assert_eq!((num(&r[0]), num(&r[1])), (65536.0, 1000.0), "{r:?}");
    // Gb/sec = bytes × Mpps × 8 / 1000.
    let expect = 65536.0 * num(&r[4]) * 8.0 / 1000.0;
    assert!((num(&r[3]) - expect).abs() <= 0.01 + expect * 0.01, "{r:?}");
    assert!(num(&r[2]) > 0.0, "peak measured: {r:?}");
    let report = Report::read_json(&json).unwrap();
    assert_eq!(report.params["post_list"], 8);
    assert_eq!(report.bandwidth.len(), 1);
    assert!(report.bandwidth[0].peak_gb_per_s > 0.0);
    // The default post list is perftest's, 1, and the header says so.
    let d = run(&dir, &["--test", "bw", "-s", "64", "-n", "100"]);
    assert_ok(&d);
    assert!(d.stdout.contains(" Post List       : 1\n"), "{}", d.stdout);
    assert!(dir.fabrics().is_empty());
}

#[test]
fn latency_samples_with_h_and_u() {
    let dir = Dir::new("hist");
    for flag in ["-H", "-U"] {
        let d = run(&dir, &["--test", "lat", "-s", "64", "-n", "50", flag]);
        assert_ok(&d);
        assert!(d.stdout.contains("#, usec\n"), "{}", d.stdout);
        let samples: Vec<f64> = d
            .stdout
            .lines()
            .skip_while(|l| *l != "#, usec")
            .skip(1)
            .take_while(|l| !l.starts_with("---"))
            .map(|l| num(l.split(", ").nth(1).unwrap()))
            .collect();
        assert_eq!(samples.len(), 50, "{}", d.stdout);
        if flag == "-H" {
            assert!(samples.windows(2).all(|w| w[0] <= w[1]), "-H sorts");
        }
        check_lat(&perftest_rows(&d.stdout, LAT_HEADER)[0], 64, Some(50));
    }
}

#[test]
fn perftest_flags_without_meaning_name_the_nearest_option() {
    let dir = Dir::new("foreign");
    for (args, needle) in [
        (&["-d", "mlx5_0"][..], "--device"),
        (&["--ib-dev=mlx5_0"][..], "--device"),
        (&["-x", "3"][..], "--peer-slot"),
        (&["-p", "18515"][..], "scratchpad"),
        (&["192.168.1.2"][..], "no server address"),
        (&["-s", "64", "10.0.0.1"][..], "no server address"),
    ] {
        let d = run(&dir, args);
        assert_eq!(d.status.code(), Some(2), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains(needle), "{args:?}: {}", d.stderr);
    }
    for (args, needle) in [
        (&["-b", "--test", "lat"][..], "measures bandwidth"),
        (&["-b", "--run_infinitely"][..], "drop --run_infinitely"),
        (&["--run_infinitely", "--test", "lat"][..], "bandwidth only"),
        (&["-H", "--test", "bw"][..], "--test lat"),
        (&["-U", "--run_infinitely"][..], "without --run_infinitely"),
        (
            &["--out_json_file", "/nonexistent/dir/x.json"][..],
            "cannot write",
        ),
    ] {
        assert_fails_with(&run(&dir, args), needle);
    }
    assert!(dir.fabrics().is_empty());
}

#[test]
fn server_waits_for_a_client_past_the_old_ten_seconds() {
    let dir = Dir::new("patient");
    let mut server = Run::start(&dir, "server", &["--fabric", "pat", "--server"]);
    wait_until_serving(&server);
    let out = std::fs::read_to_string(&server.out).unwrap();
    assert!(out.contains("until Ctrl-C"), "{out}");
    assert!(
        !out.contains("--server)"),
        "a server must not ask for a server: {out}"
    );
    std::thread::sleep(Duration::from_millis(10_500));
    assert!(server.running(), "the server gave up waiting");
    let client = run(
        &dir,
        &["--fabric", "pat", "--test", "bw", "-s", "4K", "-n", "100"],
    );
    assert_ok(&client);
    assert_ok(&server.finish());
    assert!(dir.fabrics().is_empty());
}

/// Ctrl-C on a server kept busy by a send bandwidth run ends it promptly
/// (130), though every poll finds work.
#[test]
fn ctrl_c_ends_a_busy_server() {
    let dir = Dir::new("busy-srv");
    let server = Run::start(&dir, "server", &["--fabric", "bs", "--server"]);
    wait_until_serving(&server);
    let client = Run::start(
        &dir,
        "client",
        &[
            "--fabric", "bs", "--test", "bw", "--op", "send", "-s", "64", "-D", "20",
        ],
    );
    client.wait_for_stdout(BW_HEADER);
    std::thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    server.signal(libc::SIGINT);
    let s = server.finish();
    assert_eq!(s.status.code(), Some(130), "{}\n{}", s.stdout, s.stderr);
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "the server took {:?} to stop",
        signalled.elapsed()
    );
    let c = client.finish();
    assert_ne!(c.status.code(), Some(0), "{}\n{}", c.stdout, c.stderr);
}

#[test]
fn servers_wait_for_a_client_instead_of_pairing_and_a_q2_client_uses_both() {
    let dir = Dir::new("twins");
    let mut a = Run::start(
        &dir,
        "a",
        &[
            "--fabric",
            "tw",
            "--server",
            "--slots",
            "3",
            "--timeout",
            "20",
        ],
    );
    wait_until_serving(&a);
    let mut b = Run::start(
        &dir,
        "b",
        &["--fabric", "tw", "--server", "--timeout", "20"],
    );
    wait_until_serving(&b);
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.running() && b.running(), "two servers paired");
    let client = run(
        &dir,
        &[
            "--fabric", "tw", "-q", "2", "--test", "bw", "-s", "4K", "-n", "100",
        ],
    );
    assert_ok(&client);
    assert_ok(&a.finish());
    assert_ok(&b.finish());
    assert!(dir.fabrics().is_empty());
}

#[test]
fn two_servers_told_to_pair_refuse() {
    let dir = Dir::new("twins2");
    let a = Run::start(
        &dir,
        "a",
        &[
            "--fabric",
            "tw2",
            "--server",
            "--peer-slot",
            "1",
            "--timeout",
            "20",
        ],
    );
    wait_until_serving(&a);
    let b = run(
        &dir,
        &[
            "--fabric",
            "tw2",
            "--server",
            "--peer-slot",
            "0",
            "--timeout",
            "20",
        ],
    );
    assert_fails_with(&b, "another ntb-perf --server");
    assert_fails_with(&a.finish(), "another ntb-perf --server");
}

#[test]
fn client_only_options_are_reported_ignored_on_the_server() {
    let dir = Dir::new("ignored");
    let d = run(
        &dir,
        &[
            "--fabric",
            "ig",
            "--server",
            "-s",
            "64",
            "-n",
            "5",
            "--timeout",
            "0.3",
        ],
    );
    assert!(
        d.stderr.contains("-s, -n ignored on the server"),
        "{}",
        d.stderr
    );
    assert_fails_with(&d, "start the client on the other side");
}

#[test]
fn ctrl_c_exits_130_and_keeps_what_was_measured() {
    let dir = Dir::new("sigint");
    let json = dir.0.join("inf.json");
    let r = Run::start(
        &dir,
        "inf",
        &[
            "--run_infinitely",
            "-s",
            "4K",
            "-D",
            "0.2",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let t = Instant::now();
    while perftest_rows_so_far(&r) < 2 {
        assert!(t.elapsed() < DEADLINE, "no interval reports");
        std::thread::sleep(Duration::from_millis(20));
    }
    r.signal(libc::SIGINT);
    let d = r.finish();
    assert_eq!(d.status.code(), Some(130), "{}\n{}", d.stdout, d.stderr);
    assert!(d.stderr.contains("interrupted"), "{}", d.stderr);
    let report = Report::read_json(&json).unwrap();
    assert!(report.bandwidth.len() >= 2, "{report:?}");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

/// Waits until the run has spawned its server and the server joined (its
/// stats page is there), and returns the server's pid.
/// A 30 s bandwidth run (`tag` names its output) whose spawned server has
/// joined and run for a moment, with that server's pid.
fn bw_run_with_its_server(dir: &Dir, tag: &str) -> (Run, u32) {
    let r = Run::start(dir, tag, &["--test", "bw", "-s", "64K", "-D", "30"]);
    let server = spawned_server(&r, dir);
    std::thread::sleep(Duration::from_millis(200));
    (r, server)
}

/// Sends `signal` to `pid`, which must exist.
fn signal_pid(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid; no memory is passed.
    let rc = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

fn spawned_server(r: &Run, dir: &Dir) -> u32 {
    let t = Instant::now();
    loop {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", r.pid()))
            .unwrap_or_default();
        let pages = dir
            .leftovers()
            .iter()
            .filter(|n| n.contains("qpstats"))
            .count();
        if let Some(pid) = children.split_whitespace().next()
            && pages == 2
        {
            return pid.parse().unwrap();
        }
        assert!(t.elapsed() < DEADLINE, "no server joined");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One-sided writes complete on every poll: Ctrl-C must still end a counted
/// run at once (it was seen only on idle polls, so a run of 10^9 writes
/// went to its end), with nothing left behind.
#[test]
fn ctrl_c_ends_a_busy_counted_run_at_once() {
    let dir = Dir::new("busy-int");
    let r = Run::start(
        &dir,
        "busy",
        &["--test", "bw", "-s", "64", "-n", "1000000000"],
    );
    spawned_server(&r, &dir);
    std::thread::sleep(Duration::from_millis(300));
    r.signal(libc::SIGINT);
    let d = r.finish();
    assert_eq!(d.status.code(), Some(130), "{}\n{}", d.stdout, d.stderr);
    // 10^9 writes take a minute or more here; the interrupt takes a poll.
    assert!(d.took < Duration::from_secs(10), "took {:?}", d.took);
    assert!(dir.leftovers().is_empty(), "left {:?}", dir.leftovers());
}

/// A SIGTERM to the whole process group (a `timeout`, a `kill` of the
/// group, systemd) ends the run as Ctrl-C does: the spawned server leaves
/// it to the client, which stops it.
#[test]
fn sigterm_to_the_process_group_ends_the_run_cleanly() {
    let dir = Dir::new("grp-term");
    let (r, server) = bw_run_with_its_server(&dir, "grp");
    // The server first: it is alive for sure (the client, signalled first,
    // could have stopped and reaped it already).
    signal_pid(server, libc::SIGTERM);
    r.signal(libc::SIGTERM);
    let d = r.finish();
    assert_eq!(d.status.code(), Some(130), "{}\n{}", d.stdout, d.stderr);
    assert!(!d.stderr.contains("error"), "{}", d.stderr);
    assert!(dir.leftovers().is_empty(), "left {:?}", dir.leftovers());
}

/// Ctrl-C in the middle of a latency size keeps that size's samples: the
/// row is printed and saved, with the round trips it measured.
#[test]
fn ctrl_c_during_a_latency_size_keeps_its_samples() {
    let dir = Dir::new("lat-int");
    let json = dir.0.join("lat.json");
    let r = Run::start(
        &dir,
        "lat",
        &[
            "--test",
            "lat",
            "-s",
            "64",
            "-n",
            "1000000000",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    r.wait_for_stdout(LAT_HEADER);
    std::thread::sleep(Duration::from_millis(300));
    r.signal(libc::SIGINT);
    let d = r.finish();
    assert_eq!(d.status.code(), Some(130), "{}\n{}", d.stdout, d.stderr);
    let rows = perftest_rows(&d.stdout, LAT_HEADER);
    assert!(!rows.is_empty(), "{}", d.stdout);
    check_lat(&rows[0], 64, None);
    let report = Report::read_json(&json).unwrap();
    assert_eq!(report.latency.len(), 1, "{report:?}");
    assert!(report.latency[0].iterations > 0, "{report:?}");
    assert!(
        report.latency[0].interrupted,
        "the row is marked: {report:?}"
    );
    assert!(
        std::fs::read_to_string(&json)
            .unwrap()
            .contains("\"interrupted\": true"),
        "in the JSON too"
    );
    assert!(d.stderr.contains("measured before Ctrl-C"), "{}", d.stderr);
    assert!(dir.leftovers().is_empty(), "left {:?}", dir.leftovers());
}

/// A server killed mid-run ends the run within the fabric's dead-peer
/// time, saying what happened, and its stats page goes with the fabric.
#[test]
fn a_killed_server_ends_the_run_saying_so() {
    let dir = Dir::new("srv-kill");
    let (r, server) = bw_run_with_its_server(&dir, "kill");
    signal_pid(server, libc::SIGKILL);
    let d = r.finish();
    assert_fails_with(&d, "port 1 left during the run");
    assert!(d.took < Duration::from_secs(20), "took {:?}", d.took);
    assert!(dir.leftovers().is_empty(), "left {:?}", dir.leftovers());
}

/// A server killed in the middle of a sweep fails the run, but the rows
/// measured before are saved (`--out_json`), the error in the report's
/// parameters.
#[test]
fn a_failed_sweep_still_saves_its_rows() {
    let dir = Dir::new("srv-kill-json");
    let json = dir.0.join("sweep.json");
    let r = Run::start(
        &dir,
        "sweep",
        &[
            "--test",
            "bw",
            "-a",
            "-D",
            "0.3",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let server = spawned_server(&r, &dir);
    let t = Instant::now();
    // Two rows printed (the header may not be there yet at the first looks).
    while perftest_rows_so_far(&r) < 2 {
        assert!(t.elapsed() < DEADLINE, "no rows");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_pid(server, libc::SIGKILL);
    let d = r.finish();
    // "port 1 left during the run", or "the server on port 1 is gone",
    // depending on the phase it dies in.
    assert_fails_with(&d, "port 1");
    assert!(
        d.stderr.contains("measured before the failure are saved"),
        "{}",
        d.stderr
    );
    let report = Report::read_json(&json).unwrap();
    assert!(report.bandwidth.len() >= 2, "{report:?}");
    let error = report.params["error"].as_str().unwrap_or_default();
    assert!(error.contains("port 1"), "{report:?}");
    assert!(dir.leftovers().is_empty(), "left {:?}", dir.leftovers());
}

/// A latency run's clock starts after the warm-up: a short -D still
/// measures every size.
#[test]
fn a_short_timed_latency_run_measures_every_size() {
    let dir = Dir::new("short-lat");
    let d = run(&dir, &["--test", "lat", "-s", "1M", "-D", "0.01"]);
    assert_ok(&d);
    let rows = perftest_rows(&d.stdout, LAT_HEADER);
    assert_eq!(rows.len(), 1, "{}", d.stdout);
    assert!(num(&rows[0][1]) >= 1.0, "no samples: {:?}", rows[0]);
    check_lat(&rows[0], 1 << 20, None);
}

/// A hangup ignored when the app started (`nohup`) stays ignored; one
/// not ignored ends a run as Ctrl-C does.
#[test]
fn a_hangup_ends_a_run_unless_nohup_ignored_it() {
    use std::os::unix::process::CommandExt;
    let dir = Dir::new("nohup");
    for ignored in [true, false] {
        let out = dir.0.join(format!("hup-{ignored}.out"));
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["--fabric", "nh", "--server", "--timeout", "20"])
            .env("NTBDK_SHM_DIR", &dir.0)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::process::Stdio::null());
        // Set either way: the test itself may run under nohup.
        common::default_signals(&mut cmd);
        if ignored {
            // SAFETY: between fork and exec only signal(2), which is
            // async-signal-safe, runs in the child (after the defaults).
            unsafe {
                cmd.pre_exec(|| {
                    libc::signal(libc::SIGHUP, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let t = Instant::now();
        while !std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("waiting for a client")
        {
            assert!(t.elapsed() < DEADLINE, "the server never joined its fabric");
            std::thread::sleep(Duration::from_millis(5));
        }
        signal_pid(child.id(), libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(300));
        let status = child.try_wait().unwrap();
        if ignored {
            assert!(status.is_none(), "nohup'd, it died of a hangup: {status:?}");
            signal_pid(child.id(), libc::SIGINT);
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "ignored {ignored}");
        assert!(dir.fabrics().is_empty(), "{:?}", dir.fabrics());
    }
}

/// One-sided writes are invisible to the server: a run longer than
/// `--timeout` must not look like a silent client to it.
#[test]
fn a_one_sided_run_outlives_a_short_timeout() {
    let dir = Dir::new("quiet");
    let d = run(
        &dir,
        &["--test", "bw", "-s", "64", "-D", "2", "--timeout", "0.5"],
    );
    assert_ok(&d);
    assert!(dir.leftovers().is_empty(), "left {:?}", dir.leftovers());
}

/// Options that do not go together exit 2, as clap's own errors do.
#[test]
fn options_that_do_not_go_together_exit_2() {
    let dir = Dir::new("usage");
    for (args, needle) in [
        (&["-D", "0"][..], "-D/--duration"),
        (&["--test", "lat", "-q", "2"][..], "one queue pair"),
        (&["--test", "lat", "-Q", "10"][..], "--cq-mod"),
    ] {
        let d = run(&dir, args);
        assert_eq!(d.status.code(), Some(2), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains(needle), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains("--help"), "{args:?}: {}", d.stderr);
    }
}

/// The fields every JSON report has, with their JSON types: the schema
/// version, the ntbdk version, the command line that ran (naming the report
/// file), typed parameters and the unit of every figure.
fn check_json_fields(text: &str, path: &std::path::Path) {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        v["schema"],
        ntbdk_apps::report::SCHEMA_VERSION,
        "schema version: {v:#}"
    );
    assert_eq!(v["ntbdk_version"], env!("CARGO_PKG_VERSION"));
    let argv: Vec<&str> = v["command_line"]
        .as_array()
        .expect("command_line is an array")
        .iter()
        .map(|a| a.as_str().expect("command line words are strings"))
        .collect();
    assert!(argv[0].ends_with("ntb-perf"), "{argv:?}");
    assert!(argv.contains(&path.to_str().unwrap()), "{argv:?}");
    let p = &v["params"];
    for key in ["post_list", "tx_depth", "qp", "cpu", "iterations_per_size"] {
        assert!(p[key].is_u64(), "{key} is not a number: {p:#}");
    }
    assert_eq!(p["iterations_per_size"], 2000);
    assert!(
        p["seconds_per_size"].is_null() || p["seconds_per_size"].is_f64(),
        "{p:#}"
    );
    assert!(p["report_gbits"].is_boolean(), "{p:#}");
    assert!(p["op"].is_string(), "{p:#}");
    let units = &v["units"];
    assert_eq!(units["bandwidth.gb_per_s"], "GB/s (10^9 B/s)", "{units:#}");
    assert_eq!(units["bandwidth.mpps"], "Mpps (10^6 messages/s)");
    assert_eq!(units["latency.*_us"], "us (microseconds)");
    assert!(v["bandwidth"][0]["bytes"].is_u64());
    assert!(v["latency"][0]["p99_us"].is_f64());
}

/// Data rows printed so far under the bandwidth header of a running app.
fn perftest_rows_so_far(r: &Run) -> usize {
    let out = std::fs::read_to_string(&r.out).unwrap_or_default();
    if !out.contains(BW_HEADER) {
        return 0;
    }
    perftest_rows(&out, BW_HEADER).len()
}

#[test]
fn closed_pipe_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = Dir::new("pipe");
    let mut child = Command::new(BIN)
        .args(["--test", "bw", "-a", "-D", "0.02"])
        .env("NTBDK_SHM_DIR", &dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader goes away (as `| head -1` does).
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}
