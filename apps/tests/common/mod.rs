//! What every app test needs: a private fabric directory, the app run as a
//! child with a deadline, and checks of how it ended.
//!
//! Each test crate names its binary in a root `const BIN: &str`.

#![allow(dead_code)] // each test crate uses its own part of this

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// No run may take longer than this (they take about a second alone).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The app under test (its file name), for messages.
fn app() -> String {
    std::path::Path::new(super::BIN).file_name().map_or_else(
        || super::BIN.to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// A private fabric directory (`NTBDK_SHM_DIR`), removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "ntbdk-{}-{tag}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    /// Fabric control segments left in the directory.
    pub fn fabrics(&self) -> Vec<String> {
        let mut files = self.leftovers();
        files.retain(|n| n.starts_with("ntbdk-fabric-"));
        files
    }

    /// Everything a run left in the directory: fabric control segments and
    /// stats pages.
    pub fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("ntbdk-"))
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running app, killed if dropped before it exits.
pub struct Run {
    child: Option<Child>,
    /// Where its stdout goes.
    pub out: PathBuf,
    err: PathBuf,
}

/// What a finished run left.
pub struct Done {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From [`Run::finish`] to its exit.
    pub took: Duration,
}

impl Run {
    /// Starts the app with `args` on the fabric directory `dir`; `tag`
    /// names its output files.
    pub fn start(dir: &Dir, tag: &str, args: &[&str]) -> Self {
        let out = dir.0.join(format!("{tag}.out"));
        let err = dir.0.join(format!("{tag}.err"));
        let mut cmd = Command::new(super::BIN);
        default_signals(&mut cmd);
        let child = cmd
            .args(args)
            .env("NTBDK_SHM_DIR", &dir.0)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", app()));
        Self {
            child: Some(child),
            out,
            err,
        }
    }

    /// Waits for the exit (killing the app after [`DEADLINE`]).
    pub fn finish(mut self) -> Done {
        let started = Instant::now();
        let mut child = self.child.take().unwrap();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} hung: killed after {DEADLINE:?}", app());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Done {
            status,
            stdout: std::fs::read_to_string(&self.out).unwrap(),
            stderr: std::fs::read_to_string(&self.err).unwrap(),
            took: started.elapsed(),
        }
    }

    /// Waits until the app's stdout holds `text` (failing past
    /// [`DEADLINE`]).
    pub fn wait_for_stdout(&self, text: &str) {
        let t = std::time::Instant::now();
        while !std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .contains(text)
        {
            assert!(t.elapsed() < DEADLINE, "no {text:?} within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the app is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends `signal` to the app (e.g. `libc::SIGINT`, a Ctrl-C).
    pub fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("running").id();
        // SAFETY: kill(2) on our own child's pid; no memory is passed.
        let rc = unsafe { libc::kill(pid as i32, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// Kills the app now.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.child = None;
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Gives `cmd`'s process the default SIGINT, SIGTERM and SIGHUP: the apps
/// keep a signal ignored at start (as under `nohup`), and a test run may
/// itself have them ignored (a background job of a script ignores SIGINT).
pub fn default_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only signal(2), which is
    // async-signal-safe, runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}

/// One run to its end.
pub fn run(dir: &Dir, args: &[&str]) -> Done {
    Run::start(dir, "run", args).finish()
}

pub fn assert_ok(d: &Done) {
    assert!(
        d.status.success(),
        "{} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        app(),
        d.status,
        d.stdout,
        d.stderr
    );
}

/// Fails (exit code 1 or 2, not a signal), saying `needle` on stderr.
pub fn assert_fails_with(d: &Done, needle: &str) {
    assert!(
        matches!(d.status.code(), Some(1 | 2)),
        "expected {} to fail cleanly, got {}:\nstdout:\n{}\nstderr:\n{}",
        app(),
        d.status,
        d.stdout,
        d.stderr
    );
    assert!(
        d.stderr.contains(needle),
        "stderr should mention {needle:?}:\n{}",
        d.stderr
    );
}
