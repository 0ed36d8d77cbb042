//! Background work as typed tasks, run by one scheduler ([`scheduler`]).
//!
//! A task is a row in `jobs`: its `kind` column is the tag of [`Task`] and its `params` column the variant's
//! fields, so rows written before the enum existed read back unchanged. A row is parsed once, when it is picked
//! up, and dispatched by one exhaustive `match` ([`crate::model_jobs`] for the model lane, [`crate::jobs`] for the
//! ingest lane). Housekeeping chores are tasks too, but are never stored: they are due-time entries of the
//! scheduler, re-created at every start.
//!
//! Whoever changes what the scheduler should do next (a submit, a cancel, a schedule edit, new feedback, a task
//! ending) calls [`crate::Engine::tasks_changed`]: that wakes the scheduler's threads in this process at once and,
//! through a datagram socket in the data directory, the scheduler of the process holding the jobs lock.

pub mod scheduler;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::service::Actor;

/// Parameters of a model evaluation or promotion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateParams {
    /// The candidate pair, `Q@v,D@v`.
    pub candidate: String,
    #[serde(default)]
    pub override_reason: Option<String>,
}

/// Every kind of background work. The serde tag is the stored `jobs.kind`; the content is the stored `params`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "params")]
pub enum Task {
    #[serde(rename = "ingest")]
    Ingest(crate::jobs::IngestParams),
    #[serde(rename = "model.evaluate")]
    Evaluate(CandidateParams),
    #[serde(rename = "model.promote")]
    Promote(CandidateParams),
    #[serde(rename = "model.train")]
    Train(crate::training::TrainParams),
    #[serde(rename = "model.embed_offline")]
    EmbedPending(crate::training::embed::EmbedParams),
    /// Housekeeping; never stored (see the module documentation).
    #[serde(rename = "chore")]
    Chore(Chore),
}

/// Housekeeping the scheduler runs at due times, in every process that runs work with [`Housekeeping`] settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Chore {
    /// Verifies the audit records appended since the last checkpoint.
    AuditCheckpoint,
    /// Walks the whole audit chain.
    AuditVerifyFull,
    /// Audit retention and the purge of ended sign-ins.
    Retention,
    /// Frees the weights of ended training runs (repairs a crash between a run's end and its clean-up).
    PruneRuns,
}

impl Chore {
    pub const ALL: [Chore; 4] = [Chore::AuditCheckpoint, Chore::AuditVerifyFull, Chore::Retention, Chore::PruneRuns];

    /// How long after its last run a chore is due again (the first run is at the scheduler's start).
    pub fn every(self) -> Duration {
        match self {
            Chore::AuditCheckpoint => Duration::from_secs(60),
            Chore::AuditVerifyFull => Duration::from_secs(24 * 3600),
            Chore::Retention | Chore::PruneRuns => Duration::from_secs(6 * 3600),
        }
    }
}

/// What the housekeeping chores need from the service's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Housekeeping {
    /// Audit records older than this many days are purged; 0 keeps them forever.
    pub audit_retention_days: u32,
    pub sign_in_idle_seconds: i64,
    pub sign_in_max_seconds: i64,
}

impl Task {
    /// The stored kind (`jobs.kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Task::Ingest(_) => "ingest",
            Task::Evaluate(_) => "model.evaluate",
            Task::Promote(_) => "model.promote",
            Task::Train(_) => "model.train",
            Task::EmbedPending(_) => "model.embed_offline",
            Task::Chore(_) => "chore",
        }
    }

    /// The stored `(kind, params)` of a task.
    pub fn to_row(&self) -> Result<(&'static str, String)> {
        let v = serde_json::to_value(self).map_err(|e| Error::Internal(format!("task parameters: {e}")))?;
        Ok((self.kind(), v["params"].to_string()))
    }

    /// The task stored as `(kind, params)`; job `id` names it in the error.
    pub fn from_row(id: i64, kind: &str, params: &str) -> Result<Task> {
        let params: serde_json::Value = serde_json::from_str(params)
            .map_err(|e| Error::Internal(format!("job {id}: unreadable parameters: {e}")))?;
        serde_json::from_value(serde_json::json!({"kind": kind, "params": params}))
            .map_err(|e| Error::Internal(format!("job {id} ({kind}): unreadable parameters: {e}")))
    }
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
        if self.is_raised() { Err(crate::hybrid::interrupted()) } else { Ok(()) }
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

thread_local! {
    /// The token of the task this thread runs. The embedding and scoring loops sit under operations the CLI and
    /// the tests also call directly, with no task around them; they read the token here rather than through
    /// every signature in between (see [`crate::hybrid::report`]).
    static CURRENT: std::cell::RefCell<Option<CancelToken>> = const { std::cell::RefCell::new(None) };
}

/// Installs `token` as this thread's current task token until the guard drops.
pub(crate) fn enter(token: &CancelToken) -> CurrentGuard {
    CURRENT.with(|c| *c.borrow_mut() = Some(token.clone()));
    CurrentGuard
}

pub(crate) struct CurrentGuard;

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// Whether the task this thread runs was asked to stop (false outside a task).
pub(crate) fn current_raised() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(CancelToken::is_raised))
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

impl crate::Engine {
    /// Wakes the scheduler: here at once, and in the process holding the jobs lock through its socket (best
    /// effort: without a listener the datagram is dropped, and that process's next start reads the queue anyway).
    pub(crate) fn tasks_changed(&self) {
        self.tasks.notify();
        if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
            let _ = s.set_nonblocking(true);
            let _ = s.send_to(b"w", socket_path(self.dir.root()));
        }
    }

    /// Whom job `job` runs as: its submitter, re-checked now. An account that was disabled, deleted or is no longer
    /// an administrator since it submitted is refused (`Forbidden`); the console and the system (no account) are
    /// whoever can open the data directory, as when they submitted.
    pub(crate) fn submitter_of(&self, job: i64) -> Result<Actor> {
        let (name, user_id): (String, Option<i64>) =
            self.store.reader().query_row("SELECT actor, actor_user_id FROM jobs WHERE id = ?1", [job], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        let Some(id) = user_id else { return Ok(Actor::console(name)) };
        let refused = |why: &str| {
            Error::Forbidden(format!(
                "提交任务 #{job} 的账号 {name} {why}，任务未运行；请由管理员重新提交 (the submitter {name} {why})"
            ))
        };
        match crate::accounts::user_by_id(&self.store, id) {
            Ok(u) if u.disabled => Err(refused("已停用")),
            Ok(u) if !Actor::user(&u).is_admin() => Err(refused("已不是管理员")),
            Ok(u) => Ok(Actor::user(&u)),
            Err(Error::NotFound { .. }) => Err(refused("已删除")),
            Err(e) => Err(e),
        }
    }

    /// Ends queued job `job` as failed with `err` (its submitter was refused), audited in the same transaction.
    pub(crate) fn refuse_task(&self, job: i64, err: &Error) -> Result<()> {
        tracing::warn!(job, error = %err, "task refused at run time");
        let errors = vec![crate::jobs::FileError {
            file: String::new(),
            code: err.code().as_str().to_string(),
            message: err.to_string(),
        }];
        let errors = serde_json::to_string(&errors).map_err(|e| Error::Internal(e.to_string()))?;
        {
            let mut conn = self.store.conn();
            let tx = conn.transaction()?;
            tx.execute("UPDATE job_files SET state = 'skipped' WHERE job_id = ?1 AND state = 'queued'", [job])?;
            let n = tx.execute(
                "UPDATE jobs SET state = 'failed', errors = ?2, updated_at = ?3
                 WHERE id = ?1 AND state IN ('queued', 'running')",
                rusqlite::params![job, errors, crate::store::now()],
            )?;
            if n == 1 {
                let (kind, actor): (String, String) =
                    tx.query_row("SELECT kind, actor FROM jobs WHERE id = ?1", [job], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let detail =
                    serde_json::json!({"job": job, "kind": kind, "submitter": actor, "error": err.to_string()});
                crate::audit::append(&tx, "system", "task.refused", &detail)?;
            }
            tx.commit()?;
        }
        self.tasks.unregister(job);
        self.remove_owned_files(job)?;
        self.tasks_changed();
        Ok(())
    }

    /// Runs housekeeping chore `chore`. Failures are logged, never raised: the chore is due again at its next time,
    /// and tampering with the audit log is logged at error level every time it is seen, so it reaches the journal
    /// even if nobody opens the audit page.
    pub(crate) fn run_chore(&self, chore: Chore, hk: &Housekeeping) {
        let system = Actor::system();
        match chore {
            Chore::AuditCheckpoint | Chore::AuditVerifyFull => {
                let full = chore == Chore::AuditVerifyFull;
                match self.audit_verify_as(&system, full) {
                    Ok(r) if r.full => tracing::info!(checked = r.records_checked, "audit log verified in full"),
                    Ok(_) => {}
                    Err(e) => tracing::error!(full, error = %e, "audit log verification failed"),
                }
            }
            Chore::Retention => self.retention(hk),
            Chore::PruneRuns => {
                if let Err(e) = self.prune_finished_runs() {
                    tracing::warn!(error = %e, "could not free the weights of ended training runs");
                }
            }
        }
    }

    fn retention(&self, hk: &Housekeeping) {
        if hk.audit_retention_days > 0 {
            let cutoff = time::OffsetDateTime::now_utc() - time::Duration::days(i64::from(hk.audit_retention_days));
            let cutoff = cutoff.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
            match self.audit_purge_as(&Actor::system(), &cutoff, hk.audit_retention_days) {
                Ok(0) => {}
                Ok(n) => tracing::info!(removed = n, "purged audit records past retention"),
                Err(e) => tracing::error!(error = %e, "audit retention purge failed"),
            }
        }
        if let Err(e) = self.purge_sessions(hk.sign_in_idle_seconds, hk.sign_in_max_seconds) {
            tracing::error!(error = %e, "sign-in clean-up failed");
        }
    }

    /// Raises the cancel tokens of running tasks whose job was cancelled in SQLite (by another process).
    pub(crate) fn sync_cancels(&self) {
        for job in self.tasks.running_jobs() {
            if self.job(job).is_ok_and(|j| j.cancel_requested) {
                self.tasks.cancel(job);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_rows_of_every_kind_read_back_as_their_task() {
        let rows = [
            ("ingest", r#"{"options":{"encoding":null}}"#),
            ("model.evaluate", r#"{"candidate":"a@1,b@1"}"#),
            ("model.promote", r#"{"candidate":"a@1,b@1","override_reason":"急需"}"#),
            ("model.embed_offline", r#"{"model":"qwen@1"}"#),
            ("model.train", r#"{"recipe":{},"base":"a@1,b@1","schedule":3}"#),
        ];
        for (kind, params) in rows {
            let t = Task::from_row(1, kind, params).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(t.kind(), kind);
            let (k, p) = t.to_row().unwrap();
            assert_eq!(Task::from_row(1, k, &p).unwrap(), t, "{kind} round-trips");
        }
        assert!(Task::from_row(7, "model.unknown", "{}").unwrap_err().to_string().contains("job 7"));
    }

    #[test]
    fn a_token_stops_a_sleep_when_cancelled_and_says_why() {
        let stop = Arc::new(AtomicBool::new(false));
        let t = CancelToken::new(stop.clone());
        assert_eq!(t.stop_reason(), None);
        let t2 = t.clone();
        let h = std::thread::spawn(move || {
            let started = Instant::now();
            t2.sleep(Duration::from_secs(30));
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        t.cancel();
        assert!(h.join().unwrap() < Duration::from_secs(5));
        stop.store(true, Ordering::SeqCst);
        assert_eq!(t.stop_reason(), Some(StopReason::Cancelled), "a cancel wins over a shutdown");
    }
}
