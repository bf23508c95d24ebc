//! Launching pinned workers and collecting their results.

use std::any::Any;
use std::sync::OnceLock;
use std::thread::JoinHandle;

use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

use thiserror::Error;

/// A core (logical CPU) number, as the OS numbers them.
pub type CoreId = usize;

/// Why a worker did not produce its result.
#[derive(Debug, Error)]
pub enum LcoreError {
    /// The requested core is not one this process may run on.
    #[error("no core {core}: this process may run on cores {available:?}")]
    NoSuchCore {
        /// Requested core.
        core: CoreId,
        /// Cores available to this process.
        available: Vec<CoreId>,
    },
    /// The OS refused to pin the worker.
    #[error("worker {name:?} could not be pinned to core {core}")]
    Pin {
        /// The worker.
        name: String,
        /// Its core.
        core: CoreId,
    },
    /// The worker thread could not be created.
    #[error("spawning worker {name:?}: {source}")]
    Spawn {
        /// The worker.
        name: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The worker panicked; the message is the panic's payload.
    #[error("worker {name:?} panicked: {message}")]
    Panicked {
        /// The worker.
        name: String,
        /// What it said.
        message: String,
    },
}

/// The cores this process may run on, ascending, as first seen by this
/// module.
///
/// Remembered because the system reports the calling thread's affinity,
/// which pinning narrows: asked from a pinned thread (a worker starting
/// another) it would list that thread's one core. Ask once before pinning
/// threads by other means, so the first look sees the whole set.
pub fn available_cores() -> Vec<CoreId> {
    process_cores().iter().map(|c| c.id).collect()
}

/// [`available_cores`] as `core_affinity` ids, read once.
fn process_cores() -> &'static [core_affinity::CoreId] {
    static CORES: OnceLock<Vec<core_affinity::CoreId>> = OnceLock::new();
    CORES.get_or_init(|| {
        let mut v = core_affinity::get_core_ids().unwrap_or_default();
        v.sort_unstable_by_key(|c| c.id);
        v
    })
}

/// Lets the calling thread run on every core of [`available_cores`] (a
/// thread spawned by a pinned one inherits its one core). Best effort: an
/// unknown set leaves the affinity as it is.
fn unpin_current() {
    let mut set = CpuSet::new();
    let known = !process_cores().is_empty();
    if known && process_cores().iter().all(|c| set.set(c.id).is_ok()) {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

/// The CPU the calling thread is running on now (`sched_getcpu`).
pub fn current_cpu() -> Option<CoreId> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    (c >= 0).then_some(c as CoreId)
}

/// One launched worker.
#[derive(Debug)]
pub struct Worker<T> {
    name: String,
    core: Option<CoreId>,
    handle: JoinHandle<Result<T, LcoreError>>,
}

fn panic_message(p: Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

impl<T: Send + 'static> Worker<T> {
    /// Starts `f` on a new thread named `name`, pinned to `core` (`None`:
    /// not pinned: free to run on any of [`available_cores`], even when the
    /// caller is pinned).
    pub fn spawn<F>(core: Option<CoreId>, name: &str, f: F) -> Result<Worker<T>, LcoreError>
    where
        F: FnOnce() -> T + Send + 'static,
    {
        let target = match core {
            Some(c) => match process_cores().iter().find(|id| id.id == c) {
                Some(&id) => Some(id),
                None => {
                    return Err(LcoreError::NoSuchCore {
                        core: c,
                        available: available_cores(),
                    });
                }
            },
            None => None,
        };
        let tname = name.to_owned();
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                if target.is_none() {
                    unpin_current();
                } else if let Some(id) = target
                    && !core_affinity::set_for_current(id)
                {
                    return Err(LcoreError::Pin {
                        name: tname,
                        core: id.id,
                    });
                }
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
                    LcoreError::Panicked {
                        name: tname,
                        message: panic_message(p),
                    }
                })
            })
            .map_err(|source| LcoreError::Spawn {
                name: name.to_owned(),
                source,
            })?;
        Ok(Worker {
            name: name.to_owned(),
            core,
            handle,
        })
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The core it was pinned to.
    pub fn core(&self) -> Option<CoreId> {
        self.core
    }

    /// Whether it has returned.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for it and returns its result.
    pub fn join(self) -> Result<T, LcoreError> {
        match self.handle.join() {
            Ok(r) => r,
            // Unreachable in practice (the closure's panics are caught), but
            // a panic in the pinning code is reported the same way.
            Err(p) => Err(LcoreError::Panicked {
                name: self.name,
                message: panic_message(p),
            }),
        }
    }
}

/// A set of launched workers with results of one type.
#[derive(Debug)]
pub struct Lcores<T> {
    workers: Vec<Worker<T>>,
}

impl<T: Send + 'static> Default for Lcores<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static> Lcores<T> {
    /// No workers yet.
    pub fn new() -> Self {
        Lcores {
            workers: Vec::new(),
        }
    }

    /// Launches `f` as worker `name` on `core` (`None`: unpinned). Fails
    /// without launching if the core does not exist.
    pub fn launch<F>(&mut self, core: Option<CoreId>, name: &str, f: F) -> Result<(), LcoreError>
    where
        F: FnOnce() -> T + Send + 'static,
    {
        self.workers.push(Worker::spawn(core, name, f)?);
        Ok(())
    }

    /// Workers launched and not yet joined.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Waits for every worker; results in launch order.
    pub fn join(self) -> Vec<Result<T, LcoreError>> {
        self.workers.into_iter().map(Worker::join).collect()
    }
}
