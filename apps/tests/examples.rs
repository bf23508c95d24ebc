//! The programs in `apps/examples/` run as two processes and say what they
//! should: each is compiled into this test from its own source file; host A
//! runs in the test, host B in this test binary run again as a child (the
//! `child_host_b` entry), each on the example's fabric, as the example's
//! own `main` does with itself. `cargo test` also builds each as an example
//! binary.

// Each example is compiled here as it is on its own, with its own copy of
// the module the examples share.
#![allow(clippy::duplicate_mod)]

use std::process::Command;
use std::sync::Mutex;

#[allow(dead_code)]
#[path = "../examples/messages.rs"]
mod messages;
#[allow(dead_code)]
#[path = "../examples/read.rs"]
mod read;
#[allow(dead_code)]
#[path = "../examples/write.rs"]
mod write;

/// The examples spin two processes each; on a small machine one at a time
/// keeps them quick.
static SERIAL: Mutex<()> = Mutex::new(());

/// The environment variable that makes `child_host_b` run host B of an
/// example: `EXAMPLE FABRIC`.
const CHILD: &str = "NTBDK_EXAMPLE_HOST_B";

/// Host B's process: this test binary again, running `child_host_b` only.
fn spawn_b(example: &str) -> impl Fn(&str) -> Command {
    let example = example.to_string();
    move |fabric| {
        let mut c = Command::new(std::env::current_exe().expect("the test binary"));
        c.args(["--exact", "child_host_b", "--nocapture", "--quiet"])
            .env(CHILD, format!("{example} {fabric}"));
        c
    }
}

/// Host B of an example, when this binary was started as its process.
#[test]
fn child_host_b() {
    let Ok(what) = std::env::var(CHILD) else {
        return; // a normal test run
    };
    let (example, fabric) = what.split_once(' ').expect("EXAMPLE FABRIC");
    let out = std::io::stdout();
    let r = match example {
        "messages" => messages::EXAMPLE.run_role(messages::common::Role::B, fabric, out),
        "write" => write::EXAMPLE.run_role(write::common::Role::B, fabric, out),
        "read" => read::EXAMPLE.run_role(read::common::Role::B, fabric, out),
        other => panic!("no example {other}"),
    };
    r.unwrap();
}

/// Runs `example` as two processes, returning its output (both hosts'
/// lines); fails the test when it fails.
fn output(example: impl FnOnce(&mut Vec<u8>) -> anyhow::Result<()>) -> String {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    if let Err(e) = example(&mut out) {
        panic!(
            "the example failed: {e:#}\nits output:\n{}",
            String::from_utf8_lossy(&out)
        );
    }
    String::from_utf8(out).expect("the output is UTF-8")
}

/// `line` is a line of `out`, whole.
fn has_line(out: &str, line: &str) -> bool {
    out.lines().any(|l| l == line)
}

/// The example's fabric is gone from the fabric directory once it returns.
fn no_fabric_left(what: &str) {
    let name = format!("example-{what}-{}", std::process::id());
    let left = ntbdk_pmd::hw::emu::EmuFabric::list()
        .expect("listing the fabric directory")
        .into_iter()
        .any(|f| f.name == name);
    assert!(!left, "the {what} example left its fabric {name} behind");
}

#[test]
fn messages_exchanges_a_key_and_greetings() {
    let out = output(|o| messages::EXAMPLE.run_pair(o, &spawn_b("messages")));
    assert!(has_line(&out, "host A: connected to port 1"), "{out}");
    assert!(
        has_line(&out, r#"host B: received "hello from A""#),
        "{out}"
    );
    assert!(
        has_line(&out, r#"host A: received "hello from B""#),
        "{out}"
    );
    let sent = out
        .lines()
        .find_map(|l| l.strip_prefix("host B: connected to port 0; sending region key "))
        .unwrap_or_else(|| panic!("B names its key: {out}"));
    assert!(
        has_line(
            &out,
            &format!("host A: B's region key is {sent} (4 bytes received)")
        ),
        "A receives the key B sent ({sent}): {out}"
    );
    no_fabric_left("messages");
}

#[test]
fn write_lands_every_byte() {
    let out = output(|o| write::EXAMPLE.run_pair(o, &spawn_b("write")));
    assert!(
        has_line(&out, "host A: wrote 1048576 bytes into B's region"),
        "{out}"
    );
    assert!(
        out.contains("host B: all 1048576 bytes of region 0x"),
        "{out}"
    );
    assert!(has_line(&out, r#"host A: B says "verified""#), "{out}");
    assert!(
        has_line(&out, "host A: non-posted reads across the bridge: 0"),
        "{out}"
    );
    no_fabric_left("write");
}

#[test]
fn read_brings_every_byte_without_reading_across() {
    let out = output(|o| read::EXAMPLE.run_pair(o, &spawn_b("read")));
    assert!(
        has_line(
            &out,
            "host A: read 1048576 bytes of B's region (cookie 9), all as B wrote them"
        ),
        "{out}"
    );
    assert!(
        has_line(&out, "host A: non-posted reads across the bridge: 0"),
        "{out}"
    );
    assert!(has_line(&out, r#"host B: A says "done""#), "{out}");
    no_fabric_left("read");
}

/// The README's crate example is the writer of `examples/write.rs`, word
/// for word, so it compiles as shown.
#[test]
fn the_readme_example_is_the_write_example() {
    let readme = include_str!("../../README.md");
    let section = readme
        .split_once("## Using the crates")
        .expect("the README has a Using the crates section")
        .1;
    let block = section
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the section has a rust block")
        .0;
    assert!(block.contains("fn host_a("), "{block}");
    assert!(
        include_str!("../examples/write.rs").contains(block),
        "the README's rust block is not a verbatim part of apps/examples/write.rs:\n{block}"
    );
}
