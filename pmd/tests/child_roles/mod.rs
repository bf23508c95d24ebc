//! Test processes in roles: the test binary re-executed as a child that
//! runs one role (selected by an environment variable), and a private
//! directory for each test's fabrics. Shared by the emulated-fabric and the
//! transport tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// Environment variable that selects a child role.
pub const ROLE_ENV: &str = "NTBDK_TEST_ROLE";

/// A private directory for one test's fabrics, removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("ntbdk-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TestDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process running one role; killed (and reaped) on drop.
pub struct RoleChild {
    pub child: Child,
    lines: Receiver<String>,
}

impl RoleChild {
    /// Re-executes this test binary running only `entry` (the test function
    /// that dispatches roles) with `role` and extra environment.
    pub fn spawn(entry: &str, role: &str, env: &[(&str, String)]) -> RoleChild {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([entry, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE_ENV, role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning a child test process");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        RoleChild { child, lines: rx }
    }

    /// The next line the child printed that starts with `prefix` (others are
    /// skipped), within `limit`; the rest of the line is returned.
    pub fn expect_line(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("child did not print {prefix:?} within {limit:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.child.try_wait();
                    panic!("child exited ({st:?}) before printing {prefix:?}")
                }
            }
        }
    }

    /// Waits (bounded) for the child to exit; returns whether it succeeded.
    pub fn wait_success(&mut self, limit: Duration) -> bool {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("child did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILLs the child without reaping it (it stays a zombie until drop).
    pub fn sigkill(&mut self) {
        // SAFETY: sending a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RoleChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a child: the role selected, if this process is one. Also arranges for
/// the child to die with its parent.
pub fn child_role() -> Option<String> {
    let role = std::env::var(ROLE_ENV).ok()?;
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and has no
    // memory-safety preconditions.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    Some(role)
}

/// A required environment variable of a child role.
pub fn env<T: std::str::FromStr>(key: &str) -> T {
    std::env::var(key)
        .unwrap_or_else(|_| panic!("{key} not set"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} unparsable"))
}

/// The longest a test lets a peer's death go unnoticed, for a heartbeat
/// timeout of `heartbeat`. As designed, a dead peer is declared down one
/// timeout after its last beat, by a check that runs every quarter of a
/// timeout or at each poll (sooner when its pid is gone); three timeouts
/// plus 250 ms of scheduling slack hold on a loaded two-core machine, while
/// a detector that waits several timeouts too long fails.
pub fn death_bound(heartbeat: Duration) -> Duration {
    heartbeat * 3 + Duration::from_millis(250)
}
