//! A run: the lcores launched pinned, the transport polled on the main
//! thread (connection and heartbeat), statistics every period, Ctrl-C, and
//! the lcores' results collected.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use ntbdk_pmd::lcore::{CoreId, StopFlag, Worker};
use ntbdk_pmd::transport::Transport;

use super::lcore::RaiseOnDrop;
use super::stats::StatsPrinter;
use crate::cli::is_interrupted;
use crate::cli::session::interrupted;

/// What one lcore runs: its result is a line for the summary (empty: none).
pub type LcoreFn = Box<dyn FnOnce() -> Result<String> + Send>;

/// One lcore to launch.
pub struct Job {
    /// Its name (the thread's, and in messages).
    pub name: String,
    /// The core it is pinned to.
    pub core: Option<CoreId>,
    /// What it runs.
    pub run: LcoreFn,
}

/// How the run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The lcores' summary lines, in launch order.
    pub lines: Vec<String>,
    /// The first lcore error (an interruption only if nothing else failed).
    pub error: Option<anyhow::Error>,
}

/// How often the main thread polls the transport.
const PROGRESS_EVERY: Duration = Duration::from_micros(100);

/// Launches `jobs`, then polls `t` and prints `stats` every `period` until
/// every lcore has returned. Ctrl-C raises `stop` (every lcore ends); so
/// does an lcore that fails, panics, or cannot be pinned.
pub fn run_lcores(
    t: &mut Transport,
    jobs: Vec<Job>,
    stats: &mut StatsPrinter,
    period: Duration,
    stop: &StopFlag,
) -> Result<Outcome> {
    let mut workers = Vec::with_capacity(jobs.len());
    for j in jobs {
        // An lcore that fails, panics, or never runs (its core could not
        // be taken) ends the others.
        let raise = RaiseOnDrop::new(stop.clone());
        let run = j.run;
        let w = Worker::spawn(j.core, &j.name, move || {
            let r = run();
            if r.is_ok() {
                raise.disarm();
            }
            r
        });
        match w {
            Ok(w) => workers.push(w),
            Err(e) => {
                stop.stop();
                for w in workers {
                    let _ = w.join();
                }
                return Err(anyhow!(e).context(format!("launching lcore {}", j.name)));
            }
        }
    }
    let mut next = Instant::now() + period;
    while !workers.iter().all(Worker::is_finished) {
        t.progress();
        if interrupted() {
            stop.stop();
        }
        let now = Instant::now();
        if now >= next {
            print!("{}", stats.report(now));
            next = now + period;
        }
        std::thread::sleep(PROGRESS_EVERY);
    }
    let mut out = Outcome {
        lines: Vec::new(),
        error: None,
    };
    for w in workers {
        let name = w.name().to_string();
        match w.join() {
            Ok(Ok(line)) if !line.is_empty() => out.lines.push(line),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => keep_first(&mut out.error, e.context(format!("lcore {name}"))),
            Err(e) => keep_first(&mut out.error, anyhow!(e)),
        }
    }
    if out.error.is_none() && interrupted() {
        out.error = Some(crate::cli::Interrupted.into());
    }
    Ok(out)
}

/// Keeps the first real error: an interruption gives way to a failure.
fn keep_first(slot: &mut Option<anyhow::Error>, e: anyhow::Error) {
    match slot {
        Some(old) if !is_interrupted(old) => {}
        _ if slot.is_some() && is_interrupted(&e) => {}
        _ => *slot = Some(e),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ntbdk_pmd::hw::loopback::LoopbackFabric;
    use ntbdk_pmd::transport::{Config, Geometry};

    use super::*;

    /// An lcore that panics, like one that fails, ends the others (one
    /// waiting for the stop flag here): the run returns, naming the panic,
    /// instead of polling for good.
    #[test]
    fn a_panicking_lcore_ends_the_others() {
        let fabric = LoopbackFabric::new(2, 4 << 20);
        let mut t = Transport::new(
            Arc::new(fabric.join(0).unwrap()),
            Config::new(Geometry::small(2)),
        )
        .unwrap();
        let stop = StopFlag::new();
        let watched = stop.clone();
        let jobs = vec![
            Job {
                name: "panics".into(),
                core: None,
                run: Box::new(|| panic!("an lcore's bug")),
            },
            Job {
                name: "waits".into(),
                core: None,
                run: Box::new(move || {
                    while !watched.is_stopped() {
                        std::thread::yield_now();
                    }
                    Ok("stopped".into())
                }),
            },
        ];
        let mut stats = StatsPrinter::new(Vec::new(), Instant::now());
        let out = run_lcores(&mut t, jobs, &mut stats, Duration::from_secs(3600), &stop).unwrap();
        assert_eq!(out.lines, ["stopped"]);
        let e = format!("{:#}", out.error.expect("the panic is the run's error"));
        assert!(e.contains("an lcore's bug"), "{e}");
    }
}
