//! `ntb-fwd` end to end: a file transfer whose copy must match, txonly into
//! rxonly, and clean failures (bad arguments, absent peer).
//!
//! Every run gets its own fabric directory (`NTBDK_SHM_DIR`) and a deadline
//! after which it is killed.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ntb-fwd");
/// No run may take longer than this (they take well under a second alone).
const DEADLINE: Duration = Duration::from_secs(60);

/// A private fabric directory, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ntbdk-fwd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    /// Fabric control segments left in the directory.
    fn fabrics(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("ntbdk-fabric-"))
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `ntb-fwd`, killed if dropped before it exits.
struct Run {
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
}

/// What a finished run left.
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn start(dir: &Dir, tag: &str, args: &[&str]) -> Self {
        let out = dir.0.join(format!("{tag}.out"));
        let err = dir.0.join(format!("{tag}.err"));
        let child = Command::new(BIN)
            .args(args)
            .env("NTBDK_SHM_DIR", &dir.0)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("start ntb-fwd");
        Self {
            child: Some(child),
            out,
            err,
        }
    }

    fn finish(mut self) -> Done {
        let started = Instant::now();
        let mut child = self.child.take().unwrap();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ntb-fwd hung: killed after {DEADLINE:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Done {
            status,
            stdout: std::fs::read_to_string(&self.out).unwrap(),
            stderr: std::fs::read_to_string(&self.err).unwrap(),
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(dir: &Dir, args: &[&str]) -> Done {
    Run::start(dir, "run", args).finish()
}

fn assert_ok(d: &Done) {
    assert!(
        d.status.success(),
        "ntb-fwd failed ({}):\nstdout:\n{}\nstderr:\n{}",
        d.status,
        d.stdout,
        d.stderr
    );
}

fn assert_fails_with(d: &Done, needle: &str) {
    assert!(
        !d.status.success(),
        "ntb-fwd should have failed:\n{}",
        d.stdout
    );
    assert!(
        d.stderr.contains(needle),
        "stderr should mention {needle:?}:\n{}",
        d.stderr
    );
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
