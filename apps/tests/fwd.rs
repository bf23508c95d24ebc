//! `ntb-fwd` end to end: a file transfer whose copy must match, txonly into
//! rxonly, and clean failures (bad arguments, absent peer).
//!
//! Every run gets its own fabric directory (`NTBDK_SHM_DIR`) and a deadline
//! after which it is killed.

const BIN: &str = env!("CARGO_BIN_EXE_ntb-fwd");

mod common;
use common::{Dir, Run, assert_fails_with, assert_ok, run};

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

#[test]
fn file_trans_copies_a_random_file_intact() {
    let dir = Dir::new("file");
    // Not a multiple of the 4 KiB chunk, so the last chunk is short.
    let data = random_bytes(3 * 1024 * 1024 + 1234, 0x9e37_79b9_7f4a_7c15);
    let src = dir.0.join("in.bin");
    let dst = dir.0.join("out.bin");
    std::fs::write(&src, &data).unwrap();
    let rx = Run::start(
        &dir,
        "rx",
        &[
            "--fabric",
            "ft",
            "--mode",
            "file-trans",
            "--recv",
            dst.to_str().unwrap(),
            "--lcore",
            "1",
        ],
    );
    let tx = run(
        &dir,
        &[
            "--fabric",
            "ft",
            "--mode",
            "file-trans",
            "--send",
            src.to_str().unwrap(),
        ],
    );
    let rx = rx.finish();
    assert_ok(&tx);
    assert_ok(&rx);
    assert!(tx.stdout.contains("matches"), "{}", tx.stdout);
    assert!(
        rx.stdout
            .contains(&format!("file received: {} bytes", data.len())),
        "{}",
        rx.stdout
    );
    assert!(
        rx.stdout.contains("port "),
        "per-queue stats at exit:\n{}",
        rx.stdout
    );
    assert!(tx.stdout.contains("non-posted reads 0"), "{}", tx.stdout);
    let got = std::fs::read(&dst).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the received file differs");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

#[test]
fn txonly_to_rxonly_counts_messages() {
    let dir = Dir::new("txrx");
    // rxonly runs until its sender leaves.
    let rx = Run::start(
        &dir,
        "rx",
        &["--fabric", "tr", "--mode", "rxonly", "--lcore", "1"],
    );
    let tx = run(
        &dir,
        &[
            "--fabric", "tr", "--mode", "txonly", "-s", "128", "-n", "20000",
        ],
    );
    let rx = rx.finish();
    assert_ok(&tx);
    assert_ok(&rx);
    assert!(
        tx.stdout.contains("tx 20000 msgs 2560000 B"),
        "{}",
        tx.stdout
    );
    let line = rx.stdout.lines().rev().find(|l| l.contains("rx ")).unwrap();
    let n: u64 = line
        .split("rx ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Messages still in the receive queue when the sender leaves are
    // discarded with the connection: at most one queue's worth.
    let depth = u64::from(ntbdk_apps::perf::QUEUE_DEPTH);
    assert!(n <= 20000 && n + depth >= 20000, "{line}");
    assert!(dir.fabrics().is_empty(), "fabric left: {:?}", dir.fabrics());
}

#[test]
fn bad_arguments_are_refused() {
    let dir = Dir::new("args");
    for (args, needle) in [
        (&["--fabric", "a", "--mode", "fly"][..], "invalid value"),
        (&["--mode", "txonly"][..], "--fabric"),
        (
            &["--fabric", "a", "--mode", "file-trans"][..],
            "--send FILE",
        ),
        (&["--fabric", "a", "--mode", "iofwd"][..], "--rx-slot"),
        (
            &["--fabric", "a", "--mode", "txonly", "-s", "8K"][..],
            "at most 4096",
        ),
        (
            &["--fabric", "a", "--mode", "txonly", "-s", "huge"][..],
            "bad size",
        ),
        (
            &[
                "--fabric",
                "a",
                "--mode",
                "file-trans",
                "--send",
                "/nonexistent/x",
            ][..],
            "no such file",
        ),
        (
            &["--fabric", "bad name!", "--mode", "rxonly"][..],
            "bad name!",
        ),
    ] {
        assert_fails_with(&run(&dir, args), needle);
    }
    assert!(dir.fabrics().is_empty());
}

#[test]
fn absent_peer_times_out() {
    let dir = Dir::new("absent");
    let d = run(
        &dir,
        &["--fabric", "alone", "--mode", "rxonly", "--timeout", "0.3"],
    );
    assert_fails_with(&d, "joined fabric");
    assert!(dir.fabrics().is_empty());
}
