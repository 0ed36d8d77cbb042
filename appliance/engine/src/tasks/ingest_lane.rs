//! The ingest lane: claims one file of a queued ingestion job at a time (several lanes in parallel), reads it
//! through the engine's crash-safe batch protocol and confirms it with the job's counters in one transaction
//! (the job model is [`crate::jobs`]); and [`Worker`], the scheduler as the CLI commands that follow work start it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use rusqlite::params;

use super::scheduler::{Lane, Scheduler, SchedulerHandle, SchedulerOptions, Shared};
use super::{StopReason, Task};
use crate::engine::{Engine, FileReport};
use crate::error::{Error, Result};
use crate::ingest::IngestOptions;
use crate::jobs::{FileError, JobState, MAX_CRASHES};
use crate::store::now;

/// A claimed unit of work: one file of one job.
#[derive(Debug, Clone)]
struct Claim {
    job: i64,
    ordinal: i64,
    path: PathBuf,
    collection: String,
    options: IngestOptions,
}

/// A file whose processing failed this many times for reasons other than its content (model cannot load, disk
/// full) is recorded as failed with that error, so one broken dependency cannot wedge the queue.
const MAX_ATTEMPTS: u32 = 3;

/// The scheduler without housekeeping, as the CLI commands that follow work and the tests start it.
#[derive(Debug)]
pub struct Worker;

/// The running scheduler a [`Worker`] started.
pub type WorkerHandle = SchedulerHandle;

impl Worker {
    /// Starts the scheduler with `concurrency` ingest threads (at least one); see [`Scheduler`].
    pub fn start(engine: Arc<Engine>, concurrency: usize) -> WorkerHandle {
        Scheduler::start(engine, SchedulerOptions { workers: concurrency, housekeeping: None })
    }
}

/// One step of an ingest lane: claims a file and ingests it.
pub(crate) fn ingest_step(s: &Shared) -> Lane {
    let c = match claim(s) {
        Ok(Some(c)) => c,
        Ok(None) => return Lane::Idle,
        Err(e) => {
            tracing::error!(error = %e, "ingest lane could not read the job queue");
            return Lane::Retry;
        }
    };
    let res = process(s, &c);
    if let Err(e) = end_start(&s.engine, &c) {
        tracing::error!(job = c.job, error = %e, "could not record that reading the file ended");
    }
    let Err(e) = res else { return Lane::Worked };
    // Another process holding the index is waited out; other failures are retried a few times.
    let n = if matches!(e, Error::Locked { .. }) {
        0
    } else {
        let mut a = s.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let n = a.entry((c.job, c.ordinal)).or_insert(0);
        *n += 1;
        *n
    };
    if n < MAX_ATTEMPTS {
        tracing::error!(job = c.job, file = %c.path.display(), error = %e, "ingest lane error; will retry");
        release(s, &c);
        return Lane::Retry;
    }
    tracing::error!(job = c.job, file = %c.path.display(), error = %e, "ingest failed {n} times; giving up on the file");
    let report = FileReport {
        path: c.path.clone(),
        error_code: Some(e.code().as_str()),
        error: Some(format!("{e}（已重试 {n} 次仍失败；请排除原因后重新上传此文件）")),
        ..Default::default()
    };
    if let Err(e2) = record_file(&s.engine, &c, &[report]) {
        tracing::error!(error = %e2, "could not record the failed file");
    }
    release(s, &c);
    Lane::Worked
}

fn release(s: &Shared, c: &Claim) {
    s.claimed.lock().unwrap_or_else(|p| p.into_inner()).remove(&(c.job, c.ordinal));
}

/// Claims the next queued file of the oldest active job, finishing jobs that have nothing left on the way.
fn claim(s: &Shared) -> Result<Option<Claim>> {
    let e = &s.engine;
    let mut claimed = s.claimed.lock().unwrap_or_else(|p| p.into_inner());
    let active: Vec<(i64, i64)> = {
        let conn = e.store.reader();
        let mut stmt =
            conn.prepare("SELECT id, cancel_requested FROM jobs WHERE kind = 'ingest' AND state IN ('queued', 'running') ORDER BY id")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<Vec<_>, _>>()?
    };
    for (job, cancel) in active {
        let busy = claimed.iter().any(|(j, _)| *j == job);
        match crate::tasks::submitter_of(&e, job) {
            Ok(_) => {}
            Err(err @ Error::Forbidden(_)) => {
                if !busy {
                    crate::tasks::refuse_task(&e, job, &err)?;
                }
                continue;
            }
            Err(err) => return Err(err),
        }
        if cancel != 0 {
            if !busy {
                finish_job(e, job, true)?;
            }
            continue;
        }
        let next = next_file(e, job, &claimed)?;
        match next {
            Some(c) => {
                start(e, &c)?;
                claimed.insert((job, c.ordinal));
                return Ok(Some(c));
            }
            None if !busy => finish_job(e, job, false)?,
            None => {}
        }
    }
    Ok(None)
}

/// The first queued file of `job` not being read in this process; files that crashed the process
/// [`MAX_CRASHES`] times are recorded as failed on the way.
fn next_file(e: &Engine, job: i64, claimed: &HashSet<(i64, i64)>) -> Result<Option<Claim>> {
    loop {
        let row: Option<(Claim, i64)> = {
            let conn = e.store.reader();
            let mut stmt = conn.prepare(
                "SELECT f.ordinal, f.path, j.collection, j.kind, j.params, f.unfinished_starts FROM job_files f
                 JOIN jobs j ON j.id = f.job_id WHERE f.job_id = ?1 AND f.state = 'queued' ORDER BY f.ordinal",
            )?;
            let mut rows = stmt.query([job])?;
            let mut found = None;
            while let Some(r) = rows.next()? {
                let ordinal: i64 = r.get(0)?;
                if !claimed.contains(&(job, ordinal)) {
                    let (kind, params): (String, String) = (r.get(3)?, r.get(4)?);
                    let options = match Task::from_row(job, &kind, &params)? {
                        Task::Ingest(p) => p.options,
                        other @ (Task::Evaluate(_)
                        | Task::Promote(_)
                        | Task::Train(_)
                        | Task::EmbedPending(_)
                        | Task::Backup(_)
                        | Task::Chore(_)) => {
                            return Err(Error::Internal(format!("job {job}: {} is not an ingest", other.kind())));
                        }
                    };
                    let (path, collection) = (PathBuf::from(r.get::<_, String>(1)?), r.get(2)?);
                    found = Some((Claim { job, ordinal, path, collection, options }, r.get(5)?));
                    break;
                }
            }
            found
        };
        match row {
            Some((c, crashes)) if crashes >= MAX_CRASHES => skip_crashed(e, &c, crashes)?,
            other => return Ok(other.map(|(c, _)| c)),
        }
    }
}

/// Records a file that kept killing the process as failed, so the job's other files go on.
fn skip_crashed(e: &Engine, c: &Claim, crashes: i64) -> Result<()> {
    tracing::error!(job = c.job, file = %c.path.display(), crashes, "the process died while reading this file; skipping it");
    let report = FileReport {
        path: c.path.clone(),
        error_code: Some("malformed_record"),
        error: Some(format!(
            "{}：读取此文件时设备已意外停止 {MAX_CRASHES} 次，已跳过此文件，其他文件继续处理。\
             请检查或修复此文件（例如用原软件重新保存或导出）后重新上传。",
            c.path.display()
        )),
        ..Default::default()
    };
    record_file(e, c, &[report])
}

/// Marks the job running and counts a start of the file, committed before a byte of it is read.
fn start(e: &Engine, c: &Claim) -> Result<()> {
    let mut conn = e.store.conn();
    let tx = conn.transaction()?;
    tx.execute(
        "UPDATE jobs SET state = 'running', updated_at = ?2 WHERE id = ?1 AND state = 'queued'",
        params![c.job, now()],
    )?;
    tx.execute(
        "UPDATE job_files SET unfinished_starts = unfinished_starts + 1 WHERE job_id = ?1 AND ordinal = ?2",
        params![c.job, c.ordinal],
    )?;
    tx.commit()?;
    Ok(())
}

/// Undoes [`start`]'s count once reading ended without the process dying (whatever the outcome).
fn end_start(e: &Engine, c: &Claim) -> Result<()> {
    e.store.conn().execute(
        "UPDATE job_files SET unfinished_starts = MAX(unfinished_starts - 1, 0) WHERE job_id = ?1 AND ordinal = ?2",
        params![c.job, c.ordinal],
    )?;
    Ok(())
}

/// Ingests one claimed file and confirms it. `Err` only for store failures (the file stays queued).
fn process(s: &Shared, c: &Claim) -> Result<()> {
    let e = &s.engine;
    let token = s.token(c.job);
    let mut stopped: Option<StopReason> = None;
    let reports: Vec<FileReport> = match e.indexer().collection(&c.collection) {
        Err(err) => vec![FileReport {
            path: c.path.clone(),
            error_code: Some(err.code().as_str()),
            error: Some(format!("{err}：上传后该资料库已被删除")),
            ..Default::default()
        }],
        Ok(col) => {
            let mut docs_seen = 0usize;
            let progress = &mut |done: usize, _total| {
                let delta = done.saturating_sub(docs_seen);
                docs_seen = done;
                let _ = e.store.conn().execute(
                    "UPDATE jobs SET documents_done = documents_done + ?2, updated_at = ?3 WHERE id = ?1",
                    params![c.job, delta as i64, now()],
                );
                stopped = token.stop_reason();
                stopped.is_none()
            };
            // A scan is read page by page in the parser: the jobs page says which page (the job's stage).
            let name = c.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let set_stage = |stage: String| {
                let _ = e
                    .store
                    .conn()
                    .execute("UPDATE jobs SET stage = ?2, updated_at = ?3 WHERE id = ?1", params![c.job, stage, now()]);
            };
            let pages = &mut |read: u32, of: u32| match of {
                0 => set_stage(format!("正在识别扫描件 {name}：已读 {read} 页")),
                of => set_stage(format!("正在识别扫描件 {name}：第 {read}/{of} 页")),
            };
            let res = e.indexer().ingest_one_file_stoppable(&col, &c.path, &c.options, progress, pages);
            set_stage(String::new());
            match res {
                Ok(r) => r,
                Err(Error::Cancelled(_)) => Vec::new(),
                Err(err) => return Err(err),
            }
        }
    };
    match stopped {
        // Left queued: the next start reads the file again (what was written is recognised, not duplicated).
        Some(StopReason::Shutdown) => {}
        Some(StopReason::Cancelled) => {
            e.store.conn().execute(
                "UPDATE job_files SET state = 'skipped' WHERE job_id = ?1 AND ordinal = ?2",
                params![c.job, c.ordinal],
            )?;
        }
        None => record_file(e, c, &reports)?,
    }
    release(s, c);
    Ok(())
}

/// Confirms a processed file: its state, counts and errors, and the job's counters, in one transaction.
fn record_file(e: &Engine, c: &Claim, reports: &[FileReport]) -> Result<()> {
    let prefix = e.queue().upload_prefix(&c.path);
    let errors: Vec<FileError> = reports
        .iter()
        .filter_map(|r| {
            r.error.as_ref().map(|m| FileError {
                file: e.queue().display_name(&r.path),
                code: r.error_code.unwrap_or("internal").to_string(),
                message: prefix.as_ref().map_or_else(|| m.clone(), |p| m.replace(p.as_str(), "")),
            })
        })
        .collect();
    let ok_units = reports.iter().filter(|r| r.error.is_none()).count();
    let state = if ok_units == 0 && !errors.is_empty() { "failed" } else { "done" };
    let sum = |f: fn(&FileReport) -> usize| reports.iter().map(f).sum::<usize>() as i64;
    let detail = serde_json::json!({"errors": errors, "units": reports.len()});
    let mut conn = e.store.conn();
    let tx = conn.transaction()?;
    let n = tx.execute(
        "UPDATE job_files SET state = ?3, added = ?4, replaced = ?5, unchanged = ?6, chunks = ?7, detail = ?8
         WHERE job_id = ?1 AND ordinal = ?2 AND state = 'queued'",
        params![
            c.job,
            c.ordinal,
            state,
            sum(|r| r.added),
            sum(|r| r.replaced),
            sum(|r| r.unchanged),
            sum(|r| r.chunks),
            detail.to_string()
        ],
    )?;
    if n == 1 {
        let old: String = tx.query_row("SELECT errors FROM jobs WHERE id = ?1", [c.job], |r| r.get(0))?;
        let mut all: Vec<FileError> = serde_json::from_str(&old).unwrap_or_default();
        all.extend(errors);
        tx.execute(
            "UPDATE jobs SET progress_done = progress_done + 1, errors = ?2, updated_at = ?3 WHERE id = ?1",
            params![c.job, serde_json::to_string(&all).unwrap_or_else(|_| "[]".into()), now()],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Ends a job whose files are all processed (or that was cancelled), with its audit record, then deletes its
/// uploaded files.
fn finish_job(e: &Engine, job: i64, cancelled: bool) -> Result<()> {
    let ended = {
        let mut conn = e.store.conn();
        let tx = conn.transaction()?;
        if cancelled {
            tx.execute("UPDATE job_files SET state = 'skipped' WHERE job_id = ?1 AND state = 'queued'", [job])?;
        }
        let (ok, failed, skipped, added, replaced, unchanged, chunks): (i64, i64, i64, i64, i64, i64, i64) = tx.query_row(
            "SELECT COALESCE(SUM(state = 'done'), 0), COALESCE(SUM(state = 'failed'), 0), COALESCE(SUM(state = 'skipped'), 0),
                    COALESCE(SUM(added), 0), COALESCE(SUM(replaced), 0), COALESCE(SUM(unchanged), 0), COALESCE(SUM(chunks), 0)
             FROM job_files WHERE job_id = ?1",
            [job],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)),
        )?;
        let state = if cancelled {
            JobState::Cancelled
        } else if ok == 0 && failed > 0 {
            JobState::Failed
        } else {
            JobState::Done
        };
        let n = tx.execute(
            "UPDATE jobs SET state = ?2, updated_at = ?3 WHERE id = ?1 AND state IN ('queued', 'running')",
            params![job, state.as_str(), now()],
        )?;
        if n == 1 {
            let (actor, collection): (String, String) =
                tx.query_row("SELECT actor, collection FROM jobs WHERE id = ?1", [job], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
            crate::audit::append(
                &tx,
                &actor,
                "ingest.done",
                &serde_json::json!({
                    "job": job, "collection": collection, "state": state.as_str(), "files_ok": ok, "files_failed": failed,
                    "files_skipped": skipped, "documents_added": added, "documents_replaced": replaced,
                    "documents_unchanged": unchanged, "chunks": chunks,
                }),
            )?;
        }
        tx.commit()?;
        n == 1
    };
    e.tasks.unregister(job);
    if ended {
        e.queue().remove_owned_files(job)?;
        e.queue().tasks_changed();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::engine::OpenMode;
    use crate::jobs::Job;

    fn engine(dir: &Path) -> Arc<Engine> {
        let cfg = crate::config::test_config(dir);
        Arc::new(Engine::open(cfg, OpenMode::Create).unwrap())
    }

    fn starts(e: &Engine, job: i64, ordinal: i64) -> i64 {
        e.store
            .conn()
            .query_row(
                "SELECT unfinished_starts FROM job_files WHERE job_id = ?1 AND ordinal = ?2",
                params![job, ordinal],
                |r| r.get(0),
            )
            .unwrap()
    }

    /// Claims files the way a worker does, then "dies": the claims are never ended, as after a kill -9.
    fn crash_after_claiming(e: &Arc<Engine>, n: usize) {
        let s = Shared::new(e.clone());
        for _ in 0..n {
            claim(&s).unwrap().expect("a queued file");
        }
    }

    fn wait(e: &Engine, id: i64) -> Job {
        let started = std::time::Instant::now();
        loop {
            let j = e.queue().job(id).unwrap();
            if j.state.is_finished() {
                return j;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "job {id} did not finish: {j:?}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    #[test]
    fn a_file_that_crashed_the_process_three_times_is_skipped_and_the_job_goes_on() {
        let t = tempfile::tempdir().unwrap();
        let e = engine(&t.path().join("data"));
        e.indexer().create_collection("c", "", "alice").unwrap();
        let up = e.queue().new_upload_dir().unwrap();
        let files: Vec<PathBuf> = ["a.md", "poison.md", "c.md"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let p = up.join(n);
                std::fs::write(&p, format!("# 文件{i}\n正文内容{i}。")).unwrap();
                p
            })
            .collect();
        let id = e.queue().submit_ingest("c", files, IngestOptions::default(), "alice").unwrap();
        // Two earlier crashes while reading poison.md, then a third: a.md and poison.md are read when it happens.
        e.store.conn().execute("UPDATE job_files SET unfinished_starts = 2 WHERE ordinal = 1", []).unwrap();
        crash_after_claiming(&e, 2);
        assert_eq!((starts(&e, id, 0), starts(&e, id, 1), starts(&e, id, 2)), (1, 3, 0));

        let w = Worker::start(e.clone(), 1);
        let job = wait(&e, id);
        w.shutdown();
        assert_eq!(job.state, JobState::Done, "{job:?}");
        assert_eq!(job.progress_done, 3);
        let files = e.queue().job_files(id).unwrap();
        let states: Vec<&str> = files.iter().map(|f| f.state.as_str()).collect();
        assert_eq!(states, vec!["done", "failed", "done"], "one crash (a.md) never fails a file");
        assert_eq!((files[0].added, files[2].added), (1, 1));
        let err = &job.errors[..];
        assert_eq!(err.len(), 1, "{err:?}");
        assert_eq!((err[0].file.as_str(), err[0].code.as_str()), ("poison.md", "malformed_record"));
        assert!(err[0].message.starts_with("poison.md："), "{}", err[0].message);
        assert!(err[0].message.contains("意外停止 3 次") && err[0].message.contains("重新上传"), "{}", err[0].message);
        // Reading that ended (a.md, c.md) took back its own start; a.md keeps the one crash.
        assert_eq!((starts(&e, id, 0), starts(&e, id, 2)), (1, 0));
        assert_eq!(e.indexer().stats().unwrap().documents, 2);
    }
}
