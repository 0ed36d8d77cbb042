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

pub mod ingest_lane;
pub mod model_lane;
pub mod scheduler;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Engine;
use crate::accounts::{Actor, Admin};
pub(crate) use crate::cancel::socket_path;
pub use crate::cancel::{CancelToken, StopReason};
use crate::error::{Error, Result};
use crate::jobs::JobParams;

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
    /// A backup archive of the data directory (its own lane, beside ingestion and training).
    #[serde(rename = "backup.create")]
    Backup(crate::backup::BackupParams),
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
    /// Frees the weights of ended training runs (repairs a crash between a run's end and its clean-up) and drops
    /// the vector tables no rollback needs any more (the retention rule, `[lifecycle] keep_rollback_tables`).
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
            Task::Ingest(_) => crate::jobs::IngestParams::KIND,
            Task::Evaluate(_) => "model.evaluate",
            Task::Promote(_) => "model.promote",
            Task::Train(_) => crate::training::TrainParams::KIND,
            Task::EmbedPending(_) => crate::training::embed::EmbedParams::KIND,
            Task::Backup(_) => crate::backup::BACKUP,
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

/// Whom job `job` runs as: its submitter, re-checked now. An account that was disabled, deleted or is no longer
/// an administrator since it submitted is refused (`Forbidden`); the console and the system (no account) are
/// whoever can open the data directory, as when they submitted.
pub(crate) fn submitter_of(engine: &Engine, job: i64) -> Result<Admin> {
    let (name, user_id): (String, Option<i64>) =
        engine
            .store
            .reader()
            .query_row("SELECT actor, actor_user_id FROM jobs WHERE id = ?1", [job], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let Some(id) = user_id else { return Ok(Admin::console(name)) };
    let refused = |why: &str| {
        Error::Forbidden(format!(
            "提交任务 #{job} 的账号 {name} {why}，任务未运行；请由管理员重新提交 (the submitter {name} {why})"
        ))
    };
    match crate::accounts::user_by_id(&engine.store, id) {
        Ok(u) if u.disabled => Err(refused("已停用")),
        Ok(u) => Actor::user(&u).admin().map_err(|_| refused("已不是管理员")),
        Err(Error::NotFound { .. }) => Err(refused("已删除")),
        Err(e) => Err(e),
    }
}

/// Ends queued job `job` as failed with `err` (its submitter was refused), audited in the same transaction.
pub(crate) fn refuse_task(engine: &Engine, job: i64, err: &Error) -> Result<()> {
    tracing::warn!(job, error = %err, "task refused at run time");
    let errors = vec![crate::jobs::FileError {
        file: String::new(),
        code: err.code().as_str().to_string(),
        message: err.to_string(),
    }];
    let errors = serde_json::to_string(&errors).map_err(|e| Error::Internal(e.to_string()))?;
    {
        let mut conn = engine.store.conn();
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
            let detail = serde_json::json!({"job": job, "kind": kind, "submitter": actor, "error": err.to_string()});
            crate::audit::append(&tx, "system", "task.refused", &detail)?;
        }
        tx.commit()?;
    }
    engine.tasks.unregister(job);
    engine.queue().remove_owned_files(job)?;
    engine.queue().tasks_changed();
    Ok(())
}

/// Runs housekeeping chore `chore`. Failures are logged, never raised: the chore is due again at its next time,
/// and tampering with the audit log is logged at error level every time it is seen, so it reaches the journal
/// even if nobody opens the audit page.
pub(crate) fn run_chore(engine: &Engine, chore: Chore, hk: &Housekeeping) {
    let system = Admin::system();
    match chore {
        Chore::AuditCheckpoint | Chore::AuditVerifyFull => {
            let full = chore == Chore::AuditVerifyFull;
            match engine.audit().verify(&system, full) {
                Ok(r) if r.full => tracing::info!(checked = r.records_checked, "audit log verified in full"),
                Ok(_) => {}
                Err(e) => tracing::error!(full, error = %e, "audit log verification failed"),
            }
        }
        Chore::Retention => retention(engine, hk),
        Chore::PruneRuns => {
            if let Err(e) = crate::training::prune_finished_runs(engine) {
                tracing::warn!(error = %e, "could not free the weights of ended training runs");
            }
            match crate::lifecycle::Lifecycle::of(engine).prune_vector_tables() {
                Ok(p) if p.is_empty() => {}
                Ok(p) => tracing::info!(tables = ?p, "dropped vector tables past the rollback retention"),
                Err(e) => tracing::warn!(error = %e, "could not apply the vector-table retention"),
            }
        }
    }
}

fn retention(engine: &Engine, hk: &Housekeeping) {
    if hk.audit_retention_days > 0 {
        let cutoff = time::OffsetDateTime::now_utc() - time::Duration::days(i64::from(hk.audit_retention_days));
        let cutoff = cutoff.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        match engine.audit().purge(&Admin::system(), &cutoff, hk.audit_retention_days) {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "purged audit records past retention"),
            Err(e) => tracing::error!(error = %e, "audit retention purge failed"),
        }
    }
    // The console's sign-in lifetimes, when changed there, over the server's.
    let defaults =
        crate::service::SessionDefaults { idle_seconds: hk.sign_in_idle_seconds, max_seconds: hk.sign_in_max_seconds };
    let (idle, max) = engine.settings().session_seconds(defaults);
    if let Err(e) = engine.accounts().purge_sessions(idle, max) {
        tracing::error!(error = %e, "sign-in clean-up failed");
    }
    if engine.sign_in.get().ldap.enabled() {
        match engine.accounts().directory_sweep(&Admin::system()) {
            Ok(gone) if gone.is_empty() => {}
            Ok(gone) => tracing::info!(disabled = ?gone, "disabled accounts the directory no longer has"),
            Err(e) => tracing::warn!(error = %e, "directory sweep failed"),
        }
    }
}

/// Raises the cancel tokens of running tasks whose job was cancelled in SQLite (by another process).
pub(crate) fn sync_cancels(engine: &Engine) {
    for job in engine.tasks.running_jobs() {
        if engine.queue().job(job).is_ok_and(|j| j.cancel_requested) {
            engine.tasks.cancel(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;

    #[test]
    fn stored_rows_of_every_kind_read_back_as_their_task() {
        let rows = [
            ("ingest", r#"{"options":{"encoding":null}}"#),
            ("model.evaluate", r#"{"candidate":"a@1,b@1"}"#),
            ("model.promote", r#"{"candidate":"a@1,b@1","override_reason":"急需"}"#),
            ("model.embed_offline", r#"{"model":"qwen@1"}"#),
            ("model.train", r#"{"recipe":{},"base":"a@1,b@1","schedule":3}"#),
            ("backup.create", r#"{"to":"/mnt/nas/care"}"#),
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
