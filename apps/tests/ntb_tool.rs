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
    let err = fails(p, &["destroy", "regs"]);
    assert!(err.contains("--force"), "{err}");

    // The tool's brief slots were released.
    let st = EmuFabric::attach_in(p, "regs").unwrap().status();
    assert_eq!(st.slots.iter().filter(|s| s.link_up).count(), 1);
    drop(dev);
    std::thread::sleep(Duration::from_millis(10));
    ok(p, &["destroy", "regs"]);
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
    ] {
        let out = ok(&d.0, args);
        assert!(out.contains("Usage"), "{args:?}: {out}");
    }
    let o = tool(&d.0, &["frobnicate"]);
    assert!(!o.status.success());
}
