//! Helpers shared by the integration tests: child processes (the test binary
//! re-executed in a "child role"), bounded waits, privilege checks.

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Environment variable naming the child role a re-executed test binary plays.
pub const ROLE_ENV: &str = "NTBDK_MEMPOOL_TEST_ROLE";

/// The role this process was started to play, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Whether this process is a child started to run the test `name`.
pub fn is_child(name: &str) -> bool {
    role().as_deref() == Some(name)
}

/// Reports that test `name` skipped its checks, and why, on standard
/// error itself: the test harness captures `print!` and `eprint!` of a
/// passing test but not writes to the stream, so a skip shows in a plain
/// `cargo test` run. Every test that skips calls this.
pub fn skip(name: &str, why: impl std::fmt::Display) {
    use std::io::Write;
    // One write, so the line is not split by the harness's own output.
    let line = format!("SKIPPED {name}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A command that re-runs this test binary with only the test `name`, in the
/// child role `name`. The child is killed if this thread dies
/// (`PR_SET_PDEATHSIG`), so no orphan outlives a failed test.
pub fn child_command(name: &str) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, name)
        .stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// Kills the child when dropped, unless it was reaped: a panicking test never
/// leaves a process behind.
pub struct Reaper(pub Option<Child>);

impl Reaper {
    /// Waits at most `timeout` for the child; kills it and panics on timeout.
    pub fn wait(mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.0.take().expect("child already reaped");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("child process did not finish within {timeout:?}: killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Spawns `cmd` and asserts it exits successfully within `timeout`.
pub fn run_child(mut cmd: Command, timeout: Duration) {
    let child = cmd.spawn().expect("spawn child test process");
    let st = Reaper(Some(child)).wait(timeout);
    assert!(st.success(), "child process failed: {st}");
}
