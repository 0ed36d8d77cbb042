//! The model lane: evaluating and promoting a candidate pair, training and offline embedding run one at a time as
//! typed tasks ([`Task`]) of the scheduler, beside ingestion.
//!
//! They can take many minutes (a candidate document model embeds every collection into its own tables first), so
//! the console and the API submit a task and show its progress instead of holding a request open. The lane runs
//! them through the same engine operations the CLI calls ([`Models::evaluate`], [`Models::promote`]), as
//! their submitter, re-checked when the task starts. A crash or restart puts a running task back in the queue and
//! the next start runs it again: embedding resumes from the vectors already written (the candidate's tables are
//! only ever added to), and the live pair keeps serving until the switch, which is one transaction. Cancelling a
//! running task raises its cancel token, which its loops check at their next batch; what it embedded stays for the
//! next try.

use rusqlite::{OptionalExtension, params};

use super::scheduler::Shared;
use super::{CancelToken, CandidateParams, StopReason, Task};
use crate::accounts::{Actor, Admin};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::jobs::FileError;
use crate::lifecycle::pair_spec;
use crate::store::now;

pub const EVALUATE: &str = "model.evaluate";
pub const PROMOTE: &str = "model.promote";

/// The stored kinds the model lane runs.
pub(crate) const MODEL_KINDS: &[&str] = &[EVALUATE, PROMOTE, crate::training::TRAIN, crate::training::embed::EMBED];
/// The stored kinds the backup lane runs: a backup must not wait for a night's training to end.
pub(crate) const BACKUP_KINDS: &[&str] = &[crate::backup::BACKUP];

fn submit_model_task(engine: &Engine, actor: &Actor, task: Task) -> Result<i64> {
    let (Task::Evaluate(p) | Task::Promote(p)) = &task else {
        return Err(Error::Internal(format!("{} is not an evaluation or a promotion", task.kind())));
    };
    let detail = serde_json::json!({"kind": task.kind(), "candidate": p.candidate,
        "override_reason": p.override_reason});
    let id = {
        let mut conn = engine.store.conn();
        let tx = conn.transaction()?;
        engine.queue().queue_room(&tx)?;
        let (kind, json) = task.to_row()?;
        let id = crate::jobs::insert_row(&tx, kind, &json, actor)?;
        let mut detail = detail;
        detail["job"] = id.into();
        crate::audit::append(&tx, &actor.name, "model.job_submit", &detail)?;
        tx.commit()?;
        id
    };
    engine.queue().tasks_changed();
    Ok(id)
}

/// Runs the oldest queued task of `kinds` (a lane's: [`MODEL_KINDS`], [`BACKUP_KINDS`]), if any, to its end
/// (or until the scheduler stops, which leaves it queued for the next start). Returns whether a task was taken.
/// Called by the lane, whose process holds the jobs lock, so no other process runs the same task.
pub(crate) fn run_next_model_job(engine: &Engine, s: &Shared, kinds: &[&str]) -> Result<bool> {
    let marks = vec!["?"; kinds.len()].join(", ");
    let next: Option<(i64, String, String, bool)> = engine
        .store
        .reader()
        .query_row(
            &format!(
                "SELECT id, kind, params, cancel_requested FROM jobs WHERE kind IN ({marks})
                 AND state IN ('queued', 'running') ORDER BY id LIMIT 1"
            ),
            rusqlite::params_from_iter(kinds),
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? != 0)),
        )
        .optional()?;
    let Some((id, kind, json, cancelled)) = next else { return Ok(false) };
    if cancelled {
        end_model_job(engine, id, Outcome::Cancelled)?;
        return Ok(true);
    }
    let actor = match crate::tasks::submitter_of(engine, id) {
        Ok(a) => a,
        Err(err @ Error::Forbidden(_)) => {
            crate::tasks::refuse_task(engine, id, &err)?;
            return Ok(true);
        }
        Err(err) => return Err(err),
    };
    engine.store.conn().execute(
        "UPDATE jobs SET state = 'running', updated_at = ?2 WHERE id = ?1 AND state = 'queued'",
        params![id, now()],
    )?;
    tracing::info!(job = id, kind, "model task started");
    let token = s.token(id);
    let result = Task::from_row(id, &kind, &json).and_then(|task| run_task(engine, id, task, &actor, &token));
    let outcome = match result {
        Ok(result) => Outcome::Done(result),
        Err(Error::Cancelled(_)) if token.stop_reason() == Some(StopReason::Shutdown) => {
            tracing::info!(job = id, "model task interrupted by shutdown; it resumes at the next start");
            engine.tasks.unregister(id);
            return Ok(true);
        }
        Err(Error::Cancelled(_)) => Outcome::Cancelled,
        Err(e) => Outcome::Failed(e),
    };
    after_model_task(engine, id, &kind, outcome)?;
    Ok(true)
}

/// The one dispatch of stored tasks on the model lane.
fn run_task(engine: &Engine, id: i64, task: Task, actor: &Admin, token: &CancelToken) -> Result<serde_json::Value> {
    match task {
        Task::Evaluate(p) => {
            let mut progress = engine.queue().dense_progress(id, token);
            engine
                .models()
                .evaluate(actor, &p.candidate, &mut progress)
                .map(|r| serde_json::json!({"evaluation": r.id, "passed": r.passed, "ndcg_gain": r.ndcg_gain()}))
        }
        Task::Promote(p) => {
            // A crash after the switch committed but before the task ended: the candidate is live already.
            let live = engine.retrieval().active_models()?.map(|p| pair_spec(&p));
            if live.as_deref() == Some(p.candidate.as_str()) {
                return Ok(serde_json::json!({"live": p.candidate}));
            }
            let mut progress = engine.queue().dense_progress(id, token);
            engine
                .models()
                .promote(actor, &p.candidate, p.override_reason.as_deref(), &mut progress)
                .map(|pair| serde_json::json!({"live": pair_spec(&pair)}))
        }
        Task::Train(p) => crate::training::run_training_job(engine, id, &p, actor, token),
        Task::EmbedPending(p) => crate::training::embed::run_offline_embed_job(engine, id, &p, actor, token),
        Task::Backup(p) => crate::backup::BackupMaker::of(engine).run_backup_job(id, &p, token),
        Task::Ingest(_) | Task::Chore(_) => {
            Err(Error::Internal(format!("job {id}: {} does not run on the model lane", task.kind())))
        }
    }
}

/// Ends a model task and frees what its kind leaves behind.
fn after_model_task(engine: &Engine, id: i64, kind: &str, outcome: Outcome) -> Result<()> {
    let trains = kind == crate::training::TRAIN;
    if trains {
        // Before the task reads as ended, so whoever sees it ended sees the disk freed. A crash in between
        // resumes a run whose phases all finished (nothing to redo) or one that failed anyway.
        crate::training::free_run_weights(engine, id);
    }
    end_model_job(engine, id, outcome)?;
    if trains || kind == crate::training::embed::EMBED {
        // Best effort: the next run's start and the housekeeping chore prune again.
        if let Err(e) = crate::training::prune_finished_runs(engine) {
            tracing::warn!(job = id, error = %e, "could not free the weights of ended training runs");
        }
    }
    Ok(())
}

/// Ends a model task with its audit record in the same transaction, so the log never misses an ended task
/// nor records one whose end was not written (an evaluation or promotion also records its own result, a
/// training run or an offline embedding nothing else: this record is how the log knows how they ended).
fn end_model_job(engine: &Engine, id: i64, outcome: Outcome) -> Result<()> {
    // The stage of an ended task is empty: its state says it, in words the pages and the CLI choose.
    let (state, result, errors) = match outcome {
        Outcome::Done(v) => ("done", v.to_string(), Vec::new()),
        Outcome::Cancelled => ("cancelled", String::new(), Vec::new()),
        Outcome::Failed(e) => {
            tracing::error!(job = id, error = %e, "model task failed");
            let err = FileError { file: String::new(), code: e.code().as_str().to_string(), message: e.to_string() };
            ("failed", String::new(), vec![err])
        }
    };
    let detail_errors = serde_json::to_value(&errors).map_err(|e| Error::Internal(e.to_string()))?;
    let errors = serde_json::to_string(&errors).map_err(|e| Error::Internal(e.to_string()))?;
    {
        let mut conn = engine.store.conn();
        let tx = conn.transaction()?;
        let n = tx.execute(
            "UPDATE jobs SET state = ?2, stage = '', result = ?3, errors = ?4, updated_at = ?5
             WHERE id = ?1 AND state IN ('queued', 'running')",
            params![id, state, result, errors, now()],
        )?;
        if n == 1 {
            let (kind, actor): (String, String) =
                tx.query_row("SELECT kind, actor FROM jobs WHERE id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let result: serde_json::Value = serde_json::from_str(&result).unwrap_or_default();
            let detail = serde_json::json!({"job": id, "kind": kind, "state": state, "result": result,
                "errors": detail_errors});
            let group = if kind.starts_with("backup.") { "backup" } else { "model" };
            crate::audit::append(&tx, &actor, &format!("{group}.job_{state}"), &detail)?;
        }
        tx.commit()?;
    }
    engine.tasks.unregister(id);
    engine.queue().tasks_changed();
    Ok(())
}

enum Outcome {
    Done(serde_json::Value),
    Cancelled,
    Failed(Error),
}

impl crate::engine::Models<'_> {
    /// Queues an evaluation of `candidate` (`Q@v,D@v`) against the live pair. Returns the job id.
    pub fn submit_evaluate(&self, actor: &Admin, candidate: &str) -> Result<i64> {
        if self.engine.retrieval().active_models()?.is_none() {
            return Err(Error::InvalidInput("没有在用的模型 (no live model pair to compare with)".into()));
        }
        let pair = crate::lifecycle::Lifecycle::of(self.engine).resolve_pair(candidate)?;
        submit_model_task(
            self.engine,
            actor,
            Task::Evaluate(CandidateParams { candidate: pair_spec(&pair), override_reason: None }),
        )
    }

    /// Queues the promotion of `candidate`. The gate is checked now, so a refusal comes at once, and again when
    /// the task runs, against the pair live then.
    pub fn submit_promote(&self, actor: &Admin, candidate: &str, override_reason: Option<&str>) -> Result<i64> {
        let (pair, _) = crate::lifecycle::Lifecycle::of(self.engine).promotion_allowed(candidate, override_reason)?;
        let override_reason = override_reason.map(str::trim).filter(|r| !r.is_empty()).map(str::to_string);
        submit_model_task(
            self.engine,
            actor,
            Task::Promote(CandidateParams { candidate: pair_spec(&pair), override_reason }),
        )
    }
}
