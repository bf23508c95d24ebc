//! `ntb-fwd` end to end, two processes on the data queues: every mode with
//! its checks (txonly into rxonly with --verify, iofwd reflecting to a
//! verifying sender, run to completion and pipelined, a file byte for byte,
//! two queues), the geometry shrunk to fit or refused when the sides
//! differ, Ctrl-C, and clean failures (bad flags, absent peer).
//!
//! Every run gets its own fabric directory (`NTBDK_SHM_DIR`) and a deadline
//! after which it is killed.

const BIN: &str = env!("CARGO_BIN_EXE_ntb-fwd");

mod common;
use std::time::Duration;

use common::{Dir, Done, Run, assert_fails_with, assert_ok, run};

/// Held by each test while its apps run: every run spins pinned lcores on
/// the machine's cores, and in one loaded CI run three tests whose apps
/// shared the cores with another test's saw their receivers take nothing
/// for the apps' 10 s timeout (the same tests pass alone in about 3 s).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Waits for the other tests' apps to finish (see [`ONE_AT_A_TIME`]).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A deterministic pseudo-random file of `len` bytes (xorshift).
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The number after `field` in the summary line labelled `label` ("queue 0",
/// "total").
fn summary(d: &Done, label: &str, field: &str) -> u64 {
    let at = d
        .stdout
        .find("summary over")
        .unwrap_or_else(|| panic!("no summary:\n{}", d.stdout));
    let line = d.stdout[at..]
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in the summary:\n{}", d.stdout));
    let rest = line
        .split(&format!("{field}:"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {field} in {line:?}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// Starts the app on core 1 and waits until it created its fabric.
fn first(dir: &Dir, tag: &str, args: &[&str]) -> Run {
    let r = Run::start(dir, tag, &[args, &["--lcore", "1"]].concat());
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while dir.fabrics().is_empty() {
        assert!(std::time::Instant::now() < end, "no fabric created");
        std::thread::sleep(Duration::from_millis(2));
    }
    r
}

/// Starts `a` (which creates the fabric) on core 1, runs `b` to its end,
/// and returns both ends.
fn pair(dir: &Dir, a: &[&str], b: &[&str]) -> (Done, Done) {
    let a = first(dir, "a", a);
    let b = run(dir, b);
    (a.finish(), b)
}

#[test]
fn file_trans_copies_a_random_file_intact() {
    let _one = one_at_a_time();
    let dir = Dir::new("file");
    // Not a multiple of the 2 KiB chunk, so the last chunk is short.
    let data = random_bytes(3 * 1024 * 1024 + 1234, 0x9e37_79b9_7f4a_7c15);
    let src = dir.0.join("in.bin");
    let dst = dir.0.join("out.bin");
    std::fs::write(&src, &data).unwrap();
    let (rx, tx) = pair(
        &dir,
        &[
            "--fabric",
            "ft",
            "--mode",
            "file-trans",
            "--recv",
            dst.to_str().unwrap(),
        ],
        &[
            "--fabric",
            "ft",
            "--mode",
            "file-trans",
            "--send",
            src.to_str().unwrap(),
        ],
    );
    assert_ok(&tx);
    assert_ok(&rx);
    assert!(tx.stdout.contains("matches"), "{}", tx.stdout);
    assert!(
        rx.stdout
            .contains(&format!("file received: {} bytes", data.len())),
        "{}",
        rx.stdout
    );
    // Header, chunks of 2048 bytes, trailer; the bytes the chunks carried.
    let chunks = data.len().div_ceil(2048) as u64;
    assert_eq!(summary(&rx, "queue 0", "RX-packets"), chunks + 2);
    assert_eq!(summary(&tx, "queue 0", "TX-packets"), chunks + 2);
    assert!(tx.stdout.contains("non-posted reads 0"), "{}", tx.stdout);
    let got = std::fs::read(&dst).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the received file differs");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

#[test]
fn txonly_to_rxonly_with_verify_receives_every_packet_intact() {
    let _one = one_at_a_time();
    let dir = Dir::new("txrx");
    let (rx, tx) = pair(
        &dir,
        &["--fabric", "tr", "--fwd-mode", "rxonly", "--verify"],
        &[
            "--fabric",
            "tr",
            "--fwd-mode",
            "txonly",
            "-s",
            "128",
            "-n",
            "50000",
        ],
    );
    assert_ok(&tx);
    assert_ok(&rx);
    assert!(
        rx.stdout
            .contains("received 50000 of the 50000 packets the peer sent (0 missing)"),
        "{}",
        rx.stdout
    );
    assert_eq!(summary(&tx, "total", "TX-packets"), 50000);
    assert_eq!(summary(&tx, "total", "TX-bytes"), 50000 * 128);
    assert_eq!(summary(&rx, "total", "RX-packets"), 50000);
    assert_eq!(summary(&rx, "total", "RX-bytes"), 50000 * 128);
    assert_eq!(summary(&rx, "total", "RX-errors"), 0);
    assert!(
        tx.stdout
            .contains("sent 50000 packets and the end marker; the peer received 50000"),
        "rxonly acknowledges the marker: {}",
        tx.stdout
    );
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

/// txonly --verify against a reflector that stops at its own count after
/// the whole stream went out (its -n just below txonly's, so the buffers it
/// lent took everything): the packets that never came back are missing,
/// and the run fails; it used to end well, the marker not being back.
#[test]
fn txonly_verify_counts_what_a_reflector_that_left_did_not_send_back() {
    let _one = one_at_a_time();
    let dir = Dir::new("iofew");
    let (io, tx) = pair(
        &dir,
        &["--fabric", "iof", "--fwd-mode", "iofwd", "-n", "1000"],
        &[
            "--fabric",
            "iof",
            "--fwd-mode",
            "txonly",
            "-n",
            "1200",
            "--verify",
        ],
    );
    assert_ok(&io);
    assert_eq!(summary(&io, "total", "TX-packets"), 1000, "{}", io.stdout);
    if tx.stderr.contains("left while queue 0 was sending") {
        // The reflector left before the last packets went out: a failure
        // of its own kind.
        assert_fails_with(&tx, "left while queue 0 was sending");
        return;
    }
    // What came back: the reflector's 1000, less any still in flight when
    // it left (its leaving ends the connection under them).
    let back = summary(&tx, "total", "RX-packets");
    assert!((1..=1000).contains(&back), "{}", tx.stdout);
    assert_fails_with(
        &tx,
        &format!(
            "--verify: {} packet(s) wrong, out of order or missing",
            1200 - back
        ),
    );
    assert_eq!(
        summary(&tx, "total", "RX-errors"),
        1200 - back,
        "{}",
        tx.stdout
    );
}

/// txonly --verify against an iofwd reflector: every packet comes back, in
/// order and intact.
fn reflect(tag: &str, iofwd: &[&str]) {
    let dir = Dir::new(tag);
    let fabric = ["--fabric", tag];
    let (io, tx) = pair(
        &dir,
        &[&fabric[..], &["--fwd-mode", "iofwd"], iofwd].concat(),
        &[
            &fabric[..],
            &[
                "--fwd-mode",
                "txonly",
                "-s",
                "200",
                "-n",
                "30000",
                "--verify",
            ],
        ]
        .concat(),
    );
    assert_ok(&tx);
    assert_ok(&io);
    assert!(
        tx.stdout
            .contains("sent 30000 packets, 30000 came back, then the end marker"),
        "{}",
        tx.stdout
    );
    assert_eq!(summary(&tx, "total", "RX-packets"), 30000);
    assert_eq!(summary(&tx, "total", "RX-bytes"), 30000 * 200);
    assert_eq!(summary(&tx, "total", "RX-errors"), 0);
    assert_eq!(summary(&io, "total", "RX-packets"), 30000);
    assert_eq!(summary(&io, "total", "TX-packets"), 30000);
    assert_eq!(summary(&io, "total", "TX-drops"), 0);
    assert!(
        io.stdout.contains("forwarded until the peer left"),
        "{}",
        io.stdout
    );
}

#[test]
fn iofwd_run_to_completion_reflects_every_packet() {
    let _one = one_at_a_time();
    reflect("iortc", &[]);
}

#[test]
fn iofwd_pipeline_reflects_every_packet() {
    let _one = one_at_a_time();
    reflect("iopipe", &["--pipeline"]);
}

#[test]
fn two_queues_each_carry_their_own_stream() {
    let _one = one_at_a_time();
    let dir = Dir::new("qp2");
    let (rx, tx) = pair(
        &dir,
        &[
            "--fabric",
            "q2",
            "--fwd-mode",
            "rxonly",
            "--verify",
            "--qp",
            "2",
        ],
        &[
            "--fabric",
            "q2",
            "--fwd-mode",
            "txonly",
            "--qp",
            "2",
            "-n",
            "20000",
            "--burst",
            "16",
        ],
    );
    assert_ok(&tx);
    assert_ok(&rx);
    for q in 0..2 {
        assert!(
            rx.stdout.contains(&format!(
                "queue {q}: received 20000 of the 20000 packets the peer sent (0 missing)"
            )),
            "{}",
            rx.stdout
        );
        assert_eq!(summary(&rx, &format!("queue {q}"), "RX-packets"), 20000);
        assert_eq!(summary(&tx, &format!("queue {q}"), "TX-packets"), 20000);
        assert!(
            tx.stdout.contains(&format!(
                "queue {q}: sent 20000 packets and the end marker; the peer received 20000"
            )),
            "each queue ends on rxonly's acknowledgement, not on the peer leaving: {}",
            tx.stdout
        );
    }
    assert_eq!(summary(&rx, "total", "RX-packets"), 40000);
    assert_eq!(summary(&rx, "total", "RX-errors"), 0);
}

#[test]
fn rxonly_stops_after_n_packets_and_the_sender_is_told() {
    let _one = one_at_a_time();
    let dir = Dir::new("rxn");
    let (rx, tx) = pair(
        &dir,
        &[
            "--fabric",
            "rn",
            "--fwd-mode",
            "rxonly",
            "-n",
            "1000",
            "--verify",
        ],
        &["--fabric", "rn", "--fwd-mode", "txonly", "-n", "1000000"],
    );
    assert_ok(&rx);
    assert_eq!(summary(&rx, "total", "RX-packets"), 1000);
    assert_eq!(summary(&rx, "total", "RX-errors"), 0);
    assert_fails_with(&tx, "left while queue 0 was sending");
}

#[test]
fn the_default_nb_desc_shrinks_to_the_window_the_other_side_made() {
    let _one = one_at_a_time();
    let dir = Dir::new("shrink");
    // The first side creates windows for 128 descriptors (1 MiB); the
    // second, asking for the default 1024, fits itself to them (and so
    // matches).
    let (rx, tx) = pair(
        &dir,
        &[
            "--fabric",
            "sh",
            "--fwd-mode",
            "rxonly",
            "--verify",
            "--nb-desc",
            "128",
        ],
        &["--fabric", "sh", "--fwd-mode", "txonly", "-n", "5000"],
    );
    assert_ok(&tx);
    assert_ok(&rx);
    assert!(
        tx.stderr.contains("default --nb-desc 1024 does not fit")
            && tx.stderr.contains("--nb-desc 128"),
        "{}",
        tx.stderr
    );
    // --txfreet follows: at most half of the descriptors.
    assert!(
        tx.stdout
            .contains("1 queue(s) of 128 x 2048 B, burst 32, txfreet 64"),
        "{}",
        tx.stdout
    );
    assert_eq!(summary(&rx, "total", "RX-packets"), 5000);
}

#[test]
fn a_geometry_mismatch_is_a_clear_error() {
    let _one = one_at_a_time();
    let dir = Dir::new("mismatch");
    let (rx, tx) = pair(
        &dir,
        // Long enough that a slow start of one side on a loaded machine
        // does not end the other's wait first (the mismatch is said when
        // the wait ends).
        &["--fabric", "mm", "--fwd-mode", "rxonly", "--timeout", "6"],
        &[
            "--fabric",
            "mm",
            "--fwd-mode",
            "txonly",
            "--nb-desc",
            "512",
            "--timeout",
            "6",
        ],
    );
    assert_fails_with(
        &tx,
        "give both sides the same --qp, --nb-desc and --buf-size",
    );
    assert_fails_with(
        &rx,
        "give both sides the same --qp, --nb-desc and --buf-size",
    );
    // Too large for the window the other side made: said before connecting.
    let rx = first(
        &dir,
        "big",
        &["--fabric", "mm2", "--fwd-mode", "rxonly", "--timeout", "5"],
    );
    let tx = run(
        &dir,
        &[
            "--fabric",
            "mm2",
            "--fwd-mode",
            "txonly",
            "--nb-desc",
            "2048",
            "--timeout",
            "5",
        ],
    );
    assert_fails_with(&tx, "--nb-desc 1024 fits");
    drop(rx);
}

/// As in the two-VM test: the peer's port first runs something of another
/// geometry (its hello stays in our mailbox), then a matching ntb-fwd.
#[test]
fn a_mismatched_peer_that_leaves_is_replaced_by_a_matching_one() {
    let _one = one_at_a_time();
    let dir = Dir::new("stale");
    let rx = first(
        &dir,
        "rx",
        &[
            "--fabric",
            "st",
            "--fwd-mode",
            "rxonly",
            "--verify",
            "--timeout",
            "20",
        ],
    );
    let wrong = run(
        &dir,
        &[
            "--fabric",
            "st",
            "--fwd-mode",
            "txonly",
            "--nb-desc",
            "256",
            "--timeout",
            "1",
        ],
    );
    assert_fails_with(&wrong, "another data-queue geometry");
    let tx = run(
        &dir,
        &["--fabric", "st", "--fwd-mode", "txonly", "-n", "3000"],
    );
    let rx = rx.finish();
    assert_ok(&tx);
    assert_ok(&rx);
    assert!(
        rx.stdout
            .contains("received 3000 of the 3000 packets the peer sent (0 missing)"),
        "{}",
        rx.stdout
    );
}

#[test]
fn iofwd_stopping_at_its_count_sends_what_it_received_first() {
    let _one = one_at_a_time();
    let dir = Dir::new("ion");
    let (io, tx) = pair(
        &dir,
        &["--fabric", "ion", "--fwd-mode", "iofwd", "-n", "20000"],
        &[
            "--fabric",
            "ion",
            "--fwd-mode",
            "txonly",
            "-s",
            "200",
            "-n",
            "20000",
        ],
    );
    assert_ok(&io);
    assert_ok(&tx);
    assert_eq!(summary(&io, "total", "RX-packets"), 20000);
    assert_eq!(summary(&io, "total", "TX-packets"), 20000, "{}", io.stdout);
    assert_eq!(summary(&io, "total", "TX-drops"), 0, "{}", io.stdout);
    assert_eq!(summary(&tx, "total", "RX-packets"), 20000, "{}", tx.stdout);
}

/// iofwd's `-n` is exact: it receives no packet past its count, whatever
/// the burst (a burst's worth more than the count was taken before).
#[test]
fn iofwd_receives_exactly_its_count() {
    let _one = one_at_a_time();
    let dir = Dir::new("iox");
    let (io, _tx) = pair(
        &dir,
        &["--fabric", "iox", "--fwd-mode", "iofwd", "-n", "10"],
        &["--fabric", "iox", "--fwd-mode", "txonly", "-n", "1000"],
    );
    assert_ok(&io);
    assert_eq!(summary(&io, "total", "RX-packets"), 10, "{}", io.stdout);
    assert_eq!(summary(&io, "total", "TX-packets"), 10, "{}", io.stdout);
}

/// rxonly and txonly given the same `-n`: rxonly stops at its count and
/// may leave before the end marker can be sent (it lends no buffer for
/// it); txonly, every packet sent, ends cleanly all the same.
#[test]
fn rxonly_and_txonly_with_the_same_count_both_succeed() {
    let _one = one_at_a_time();
    for round in 0..3 {
        let dir = Dir::new(&format!("samen{round}"));
        let (rx, tx) = pair(
            &dir,
            &[
                "--fabric",
                "sn",
                "--fwd-mode",
                "rxonly",
                "--verify",
                "-n",
                "5000",
            ],
            &["--fabric", "sn", "--fwd-mode", "txonly", "-n", "5000"],
        );
        assert_ok(&rx);
        assert_ok(&tx);
        assert_eq!(summary(&rx, "total", "RX-packets"), 5000, "{}", rx.stdout);
        assert_eq!(summary(&tx, "total", "TX-packets"), 5000, "{}", tx.stdout);
        assert_eq!(summary(&tx, "total", "TX-drops"), 0, "{}", tx.stdout);
    }
}

#[test]
fn rxonly_verify_fails_when_the_sender_leaves_without_its_end_marker() {
    let _one = one_at_a_time();
    let dir = Dir::new("noend");
    let rx = first(
        &dir,
        "rx",
        &["--fabric", "ne", "--fwd-mode", "rxonly", "--verify"],
    );
    let tx = Run::start(&dir, "tx", &["--fabric", "ne", "--fwd-mode", "txonly"]);
    // Sending (its first statistics come a period into the run).
    tx.wait_for_stdout("statistics at");
    tx.signal(libc::SIGINT);
    assert_eq!(tx.finish().status.code(), Some(130));
    assert_fails_with(&rx.finish(), "without its end marker");
}

#[test]
fn ctrl_c_ends_the_run_with_130_and_a_summary() {
    let _one = one_at_a_time();
    let dir = Dir::new("intr");
    let mut rx = first(&dir, "rx", &["--fabric", "in", "--fwd-mode", "rxonly"]);
    let mut tx = Run::start(&dir, "tx", &["--fabric", "in", "--fwd-mode", "txonly"]);
    // Let traffic flow (past the first statistics).
    tx.wait_for_stdout("statistics at");
    assert!(rx.running() && tx.running());
    tx.signal(libc::SIGINT);
    let tx = tx.finish();
    let rx = rx.finish();
    assert_eq!(tx.status.code(), Some(130), "{}\n{}", tx.stdout, tx.stderr);
    assert!(tx.stdout.contains("statistics at"), "{}", tx.stdout);
    assert!(summary(&tx, "total", "TX-packets") > 0, "{}", tx.stdout);
    // The receiver sees its peer leave: a normal end.
    assert_ok(&rx);
    assert!(rx.stdout.contains("the peer left"), "{}", rx.stdout);
    assert!(summary(&rx, "total", "RX-packets") > 0);
}

#[test]
fn bad_arguments_are_refused() {
    let _one = one_at_a_time();
    let dir = Dir::new("args");
    let rx = ["--fabric", "a", "--fwd-mode", "rxonly"];
    let tx = ["--fabric", "a", "--fwd-mode", "txonly"];
    for (args, needle) in [
        (vec!["--fabric", "a", "--mode", "fly"], "invalid value"),
        (vec!["--mode", "txonly"], "--fabric"),
        (vec!["--fabric", "a", "--mode", "file-trans"], "--send FILE"),
        ([&tx[..], &["--burst", "0"]].concat(), "--burst"),
        ([&tx[..], &["--burst", "33"]].concat(), "1..=32"),
        ([&tx[..], &["--nb-desc", "100"]].concat(), "power of two"),
        ([&tx[..], &["--nb-desc", "8192"]].concat(), "16..=4096"),
        ([&tx[..], &["--buf-size", "100"]].concat(), "multiple of 64"),
        ([&tx[..], &["--qp", "0"]].concat(), "--qp"),
        ([&tx[..], &["--qp", "17"]].concat(), "--qp"),
        ([&tx[..], &["-s", "4K"]].concat(), "--buf-size 2048"),
        ([&tx[..], &["-s", "huge"]].concat(), "bad size"),
        (
            [&tx[..], &["--nb-desc", "256", "--txfreet", "200"]].concat(),
            "at most half of --nb-desc 256",
        ),
        ([&tx[..], &["--pipeline"]].concat(), "--pipeline is for"),
        (
            [
                &tx[..],
                &["--qp", "16", "--nb-desc", "4096", "--buf-size", "64K"],
            ]
            .concat(),
            "more than the 1073741824 an emulated fabric gets",
        ),
        ([&rx[..], &["--send", "x"]].concat(), "file-trans"),
        (
            [&rx[..], &["-s", "128"]].concat(),
            "the packet size txonly sends",
        ),
        (
            vec![
                "--fabric",
                "a",
                "--mode",
                "file-trans",
                "--send",
                "x",
                "-n",
                "5",
            ],
            "do not apply to file-trans",
        ),
        (
            vec!["--fabric", "a", "--mode", "iofwd", "--verify"],
            "--verify checks",
        ),
        (
            vec![
                "--fabric",
                "a",
                "--mode",
                "file-trans",
                "--send",
                "/nonexistent/x",
            ],
            "no such file",
        ),
        (
            vec!["--fabric", "bad name!", "--mode", "rxonly"],
            "bad name!",
        ),
    ] {
        assert_fails_with(&run(&dir, &args), needle);
    }
    assert!(dir.fabrics().is_empty());
}

#[test]
fn absent_peer_times_out() {
    let _one = one_at_a_time();
    let dir = Dir::new("absent");
    let d = run(
        &dir,
        &["--fabric", "alone", "--mode", "rxonly", "--timeout", "0.3"],
    );
    assert_fails_with(&d, "joined fabric");
    assert!(dir.fabrics().is_empty());
}
