//! Stopping and waking background work: the cancel token a running task checks at each batch, and the hub the
//! engine keeps so that any operation can wake the scheduler or raise a running task's token. Below the engine
//! (it holds a [`Hub`]); the scheduler and the tasks themselves are above it ([`crate::tasks`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// What a job's operation ends with when the job was cancelled or the worker is stopping.
pub(crate) fn interrupted() -> Error {
    Error::Cancelled("任务已取消或服务正在停止 (the job was cancelled or the worker is stopping)".into())
}

/// Why a task should stop before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Its job was cancelled: it ends `cancelled`.
    Cancelled,
    /// The scheduler is stopping: the task stays queued and resumes at the next start.
    Shutdown,
}

/// The one way a running task learns it should stop: checked by the task at each batch (ingest batches,
/// embedding and scoring batches, training progress), raised by a cancel (in this process, or read from SQLite
/// when another process's datagram wakes the scheduler) or by the scheduler stopping.
#[derive(Debug, Clone)]
pub struct CancelToken {
    inner: Arc<TokenInner>,
}

#[derive(Debug)]
struct TokenInner {
    cancelled: AtomicBool,
    shutdown: Arc<AtomicBool>,
    /// Lets [`CancelToken::sleep`] end early when the token is raised.
    gate: Mutex<()>,
    cv: Condvar,
}

impl CancelToken {
    /// A token that is raised by [`CancelToken::cancel`] or when `shutdown` is set (then notify with
    /// [`CancelToken::wake`]).
    pub fn new(shutdown: Arc<AtomicBool>) -> Self {
        let inner =
            TokenInner { cancelled: AtomicBool::new(false), shutdown, gate: Mutex::new(()), cv: Condvar::new() };
        CancelToken { inner: Arc::new(inner) }
    }

    /// A token nothing raises (direct calls from the CLI and the tests).
    pub fn never() -> Self {
        Self::new(Arc::new(AtomicBool::new(false)))
    }

    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Wakes a [`CancelToken::sleep`] so it sees a shutdown raised meanwhile.
    pub fn wake(&self) {
        let _g = self.inner.gate.lock().unwrap_or_else(|p| p.into_inner());
        self.inner.cv.notify_all();
    }

    /// Why the task should stop, if it should. A cancel wins over a shutdown: the admin asked for an end.
    pub fn stop_reason(&self) -> Option<StopReason> {
        if self.inner.cancelled.load(Ordering::SeqCst) {
            Some(StopReason::Cancelled)
        } else if self.inner.shutdown.load(Ordering::SeqCst) {
            Some(StopReason::Shutdown)
        } else {
            None
        }
    }

    pub fn is_raised(&self) -> bool {
        self.stop_reason().is_some()
    }

    /// `Err(Cancelled)` when raised: the check at each batch.
    pub fn check(&self) -> Result<()> {
        if self.is_raised() { Err(interrupted()) } else { Ok(()) }
    }

    /// Waits up to `d`, ending early when the token is raised (a running trainer is watched this way).
    pub fn sleep(&self, d: Duration) {
        let deadline = Instant::now() + d;
        let mut g = self.inner.gate.lock().unwrap_or_else(|p| p.into_inner());
        while !self.is_raised() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
            g = self.inner.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// What the engine keeps for the scheduler: the wake-up signal and the tokens of running tasks.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    /// Bumped by every change; a scheduler thread sleeps until it differs from what it saw.
    generation: Mutex<u64>,
    cv: Condvar,
    running: Mutex<HashMap<i64, CancelToken>>,
}

impl Hub {
    pub(crate) fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn notify(&self) {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.cv.notify_all();
    }

    /// Sleeps until the generation differs from `seen` or `deadline` passes (no deadline: only a change wakes).
    pub(crate) fn wait(&self, seen: u64, deadline: Option<Instant>) {
        let mut g = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        while *g == seen {
            match deadline.map(|d| d.checked_duration_since(Instant::now())) {
                None => g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(None) => return,
                Some(Some(left)) => g = self.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0,
            }
        }
    }

    /// The token of job `job` under the scheduler whose stop flag is `shutdown`; a token left by a scheduler
    /// that stopped is replaced (it would read as stopping).
    pub(crate) fn token_for(&self, job: i64, shutdown: &Arc<AtomicBool>) -> CancelToken {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let t = running.entry(job).or_insert_with(|| CancelToken::new(shutdown.clone()));
        if !Arc::ptr_eq(&t.inner.shutdown, shutdown) {
            *t = CancelToken::new(shutdown.clone());
        }
        t.clone()
    }

    /// Wakes every lane and every token's sleep (a scheduler is stopping).
    pub(crate) fn wake_all(&self) {
        for t in self.running.lock().unwrap_or_else(|p| p.into_inner()).values() {
            t.wake();
        }
        self.notify();
    }

    pub(crate) fn unregister(&self, job: i64) {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&job);
    }

    /// Raises the token of job `job` if it runs in this process.
    pub(crate) fn cancel(&self, job: i64) {
        if let Some(t) = self.running.lock().unwrap_or_else(|p| p.into_inner()).get(&job) {
            t.cancel();
        }
    }

    pub(crate) fn running_jobs(&self) -> Vec<i64> {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect()
    }
}

/// The socket the scheduler holding the jobs lock listens on.
pub(crate) fn socket_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("jobs.sock")
}
