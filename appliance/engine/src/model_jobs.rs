//! Model jobs: evaluating and promoting a candidate pair run in the durable job queue, beside ingestion.
//!
//! Both can take many minutes (a candidate document model embeds every collection into its own tables first), so
//! the console and the API submit a job and show its progress instead of holding a request open. A job is a row in
//! `jobs` (kind `model.evaluate` or `model.promote`, the candidate and any override reason in `params`); the
//! worker's model thread runs one at a time through the same engine operations the CLI calls
//! ([`Engine::evaluate_as`], [`Engine::promote_as`]), with the submitting admin as the actor. A crash or restart puts
//! a running job back in the queue and the next start runs it again: embedding resumes from the vectors already
//! written (the candidate's tables are only ever added to), and the live pair keeps serving until the switch, which
//! is one transaction. Cancelling a running job stops it at its next batch; what it embedded stays for the next try.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::hybrid::{DenseProgress, set_interrupt};
use crate::jobs::FileError;
use crate::lifecycle::pair_spec;
use crate::service::Actor;
use crate::store::now;

pub const EVALUATE: &str = "model.evaluate";
pub const PROMOTE: &str = "model.promote";

#[derive(Debug, Serialize, Deserialize)]
struct ModelJobParams {
    candidate: String,
    #[serde(default)]
    override_reason: Option<String>,
}

/// How often a running job writes its progress and reads its cancel flag.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

impl Engine {
    /// Queues an evaluation of `candidate` (`Q@v,D@v`) against the live pair. Returns the job id.
    pub fn submit_evaluate_as(&self, actor: &Actor, candidate: &str) -> Result<i64> {
        actor.require_admin()?;
        if self.active_models()?.is_none() {
            return Err(Error::InvalidInput("没有在用的模型 (no live model pair to compare with)".into()));
        }
        let pair = self.resolve_pair(candidate)?;
        self.submit_model_job(actor, EVALUATE, &ModelJobParams { candidate: pair_spec(&pair), override_reason: None })
    }

    /// Queues the promotion of `candidate`. The gate is checked now, so a refusal comes at once, and again when
    /// the job runs, against the pair live then.
    pub fn submit_promote_as(&self, actor: &Actor, candidate: &str, override_reason: Option<&str>) -> Result<i64> {
        actor.require_admin()?;
        let (pair, _) = self.promotion_allowed(candidate, override_reason)?;
        let override_reason = override_reason.map(str::trim).filter(|r| !r.is_empty()).map(str::to_string);
        self.submit_model_job(actor, PROMOTE, &ModelJobParams { candidate: pair_spec(&pair), override_reason })
    }

    fn submit_model_job(&self, actor: &Actor, kind: &str, p: &ModelJobParams) -> Result<i64> {
        let mut conn = self.store.conn();
        let tx = conn.transaction()?;
        let id = insert_job(&tx, kind, p, actor)?;
        crate::audit::append(
            &tx,
            &actor.name,
            "model.job_submit",
            &serde_json::json!({"job": id, "kind": kind, "candidate": p.candidate,
                "override_reason": p.override_reason}),
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Runs the oldest queued model job, if any, to its end (or until `stop` is raised, which leaves it queued
    /// for the next start). Returns whether a job ran. Called by the worker's model thread, which holds the jobs
    /// lock, so no other process runs the same job.
    pub(crate) fn run_next_model_job(&self, stop: &AtomicBool) -> Result<bool> {
        let next: Option<(i64, String, String, String)> = self
            .store
            .reader()
            .query_row(
                "SELECT id, kind, params, actor FROM jobs WHERE kind IN (?1, ?2, ?3, ?4) AND state IN ('queued', 'running') \
                 ORDER BY id LIMIT 1",
                params![EVALUATE, PROMOTE, crate::training::TRAIN, crate::training::embed::EMBED],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let Some((id, kind, json, actor)) = next else {
            // Idle: a due training schedule becomes the next job.
            return Ok(self.fire_due_schedules(time::OffsetDateTime::now_utc())?.is_some());
        };
        if self.job(id)?.cancel_requested {
            self.end_model_job(id, Outcome::Cancelled)?;
            return Ok(true);
        }
        self.store.conn().execute(
            "UPDATE jobs SET state = 'running', updated_at = ?2 WHERE id = ?1 AND state = 'queued'",
            params![id, now()],
        )?;
        tracing::info!(job = id, kind, "model job started");
        let outcome = if kind == crate::training::TRAIN || kind == crate::training::embed::EMBED {
            set_interrupt(false);
            let r = if kind == crate::training::TRAIN {
                self.run_training_job(id, &json, &Actor::console(actor), stop)
            } else {
                self.run_offline_embed_job(id, &json, &Actor::console(actor), stop)
            };
            set_interrupt(false);
            r
        } else {
            match serde_json::from_str::<ModelJobParams>(&json) {
                Ok(p) => self.run_model_job(id, &kind, &p, &Actor::console(actor), stop),
                Err(e) => Err(Error::Internal(format!("job {id}: unreadable parameters: {e}"))),
            }
        };
        let outcome = match outcome {
            Ok(result) => Outcome::Done(result),
            Err(Error::Cancelled(_)) if !self.job(id)?.cancel_requested => {
                tracing::info!(job = id, "model job interrupted by shutdown; it resumes at the next start");
                return Ok(true);
            }
            Err(Error::Cancelled(_)) => Outcome::Cancelled,
            Err(e) => Outcome::Failed(e),
        };
        if kind == crate::training::TRAIN {
            // Before the job reads as ended, so whoever sees it ended sees the disk freed. A crash in between
            // resumes a run whose phases all finished (nothing to redo) or one that failed anyway.
            self.free_run_weights(id);
        }
        self.end_model_job(id, outcome)?;
        if kind == crate::training::TRAIN || kind == crate::training::embed::EMBED {
            // Best effort: the next run's start prunes again.
            if let Err(e) = self.prune_finished_runs() {
                tracing::warn!(job = id, error = %e, "could not free the weights of ended training runs");
            }
        }
        Ok(true)
    }

    fn run_model_job(
        &self,
        id: i64,
        kind: &str,
        p: &ModelJobParams,
        actor: &Actor,
        stop: &AtomicBool,
    ) -> Result<serde_json::Value> {
        let mut progress = self.job_dense_progress(id, stop);
        set_interrupt(false);
        let r = match kind {
            EVALUATE => self
                .evaluate_as(actor, &p.candidate, &mut progress)
                .map(|r| serde_json::json!({"evaluation": r.id, "passed": r.passed, "ndcg_gain": r.ndcg_gain()})),
            _ => {
                // A crash after the switch committed but before the job ended: the candidate is live already.
                let live = self.active_models()?.map(|p| pair_spec(&p));
                if live.as_deref() == Some(p.candidate.as_str()) {
                    Ok(serde_json::json!({"live": p.candidate}))
                } else {
                    self.promote_as(actor, &p.candidate, p.override_reason.as_deref(), &mut progress)
                        .map(|pair| serde_json::json!({"live": pair_spec(&pair)}))
                }
            }
        };
        set_interrupt(false);
        r
    }

    /// Writes a job's stage and done/total; returns whether the job was asked to cancel.
    pub(crate) fn job_progress(&self, id: i64, stage: &str, done: u64, total: u64) -> Result<bool> {
        let cancel: i64 = self.store.conn().query_row(
            "UPDATE jobs SET progress_done = ?2, progress_total = ?3, stage = ?4, updated_at = ?5 WHERE id = ?1
             RETURNING cancel_requested",
            params![id, done as i64, total as i64, stage, now()],
            |r| r.get(0),
        )?;
        Ok(cancel != 0)
    }

    /// The progress sink of a job's embedding and scoring loops: writes at most every [`PROGRESS_EVERY`] (and at
    /// the end), and raises the thread's interrupt when the job is cancelled or the worker stops.
    pub(crate) fn job_dense_progress<'a>(&'a self, id: i64, stop: &'a AtomicBool) -> impl FnMut(DenseProgress) + 'a {
        let mut last = Instant::now() - PROGRESS_EVERY;
        move |d: DenseProgress| {
            if last.elapsed() < PROGRESS_EVERY && d.done < d.total {
                return;
            }
            last = Instant::now();
            let stage = format!("{} {}", d.stage, d.collection);
            let cancel = self.job_progress(id, &stage, d.done as u64, d.total as u64).unwrap_or(false);
            set_interrupt(cancel || stop.load(Ordering::SeqCst));
        }
    }

    fn end_model_job(&self, id: i64, outcome: Outcome) -> Result<()> {
        let (state, stage, result, errors) = match outcome {
            Outcome::Done(v) => ("done", "完成", v.to_string(), Vec::new()),
            Outcome::Cancelled => ("cancelled", "已取消", String::new(), Vec::new()),
            Outcome::Failed(e) => {
                tracing::error!(job = id, error = %e, "model job failed");
                let err =
                    FileError { file: String::new(), code: e.code().as_str().to_string(), message: e.to_string() };
                ("failed", "失败", String::new(), vec![err])
            }
        };
        let errors = serde_json::to_string(&errors).map_err(|e| Error::Internal(e.to_string()))?;
        self.store.conn().execute(
            "UPDATE jobs SET state = ?2, stage = ?3, result = ?4, errors = ?5, updated_at = ?6
             WHERE id = ?1 AND state IN ('queued', 'running')",
            params![id, state, stage, result, errors, now()],
        )?;
        Ok(())
    }
}

/// Queues a job of `kind` with its parameters (JSON) inside the caller's transaction, which also writes the audit
/// record. Returns the job id.
pub(crate) fn insert_job(
    tx: &rusqlite::Transaction<'_>,
    kind: &str,
    params: &impl Serialize,
    actor: &Actor,
) -> Result<i64> {
    let json = serde_json::to_string(params).map_err(|e| Error::Internal(format!("job params: {e}")))?;
    tx.execute(
        "INSERT INTO jobs (kind, state, params, actor, stage, created_at, updated_at)
         VALUES (?1, 'queued', ?2, ?3, '排队中', ?4, ?4)",
        params![kind, json, actor.name, now()],
    )?;
    Ok(tx.last_insert_rowid())
}

enum Outcome {
    Done(serde_json::Value),
    Cancelled,
    Failed(Error),
}
