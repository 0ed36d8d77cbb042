//! Ingestion jobs: durable in SQLite, run by a background worker with bounded concurrency, resumable after a crash.
//!
//! A job is a row in `jobs` plus one row per file in `job_files`. The worker claims files one at a time (several in
//! parallel: parsing is the slow part; writes to the stores are serialised by the engine), ingests each through the
//! same crash-safe batch protocol as `Engine::ingest_files`, and confirms the file in one transaction that also
//! updates the job's counters and error list. A crash leaves the interrupted file unconfirmed; on restart the job is
//! re-queued and the file read again — documents it had already written are recognised by (collection, external id,
//! content hash) and skipped, so nothing is duplicated. A file during which the process died [`MAX_CRASHES`] times
//! (counted in `job_files`) is recorded as failed instead of read again. One bad file never stops the others: its
//! error is recorded with a stable code and a message naming the file.
//!
//! States: `queued` → `running` → `done` (every file processed; `errors` lists files that were rejected while the
//! others were indexed), `failed` (every file was rejected, nothing indexed), or `cancelled` (files not yet started
//! are skipped; what was already indexed stays). Only one process runs jobs at a time: the worker holds an exclusive
//! lock on `<data_dir>/jobs.lock`, so a `care ingest` next to a running `care serve` queues its job for the server.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, FileReport};
use crate::error::{Error, Result};
use crate::ingest::IngestOptions;
use crate::service::Actor;
use crate::store::now;
use crate::tasks::scheduler::{Lane, Scheduler, SchedulerHandle, SchedulerOptions, Shared};
use crate::tasks::{StopReason, Task};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            _ => return None,
        })
    }
    pub fn is_finished(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Cancelled)
    }

    /// The state in the words pages and the CLI show (the store keeps the codes).
    pub fn label(self) -> &'static str {
        match self {
            JobState::Queued => "排队中",
            JobState::Running => "进行中",
            JobState::Done => "完成",
            JobState::Failed => "失败",
            JobState::Cancelled => "已取消",
        }
    }
}

/// What a model task is doing, as shown: the stage its progress wrote while it runs, else its state's label.
/// Ingest jobs have no stage (their files say it).
pub fn stage_text(kind: &str, state: JobState, stage: &str) -> String {
    if stage.is_empty() && kind != "ingest" { state.label().to_string() } else { stage.to_string() }
}

/// A file (or archive member) that was rejected, with the stable error code and a message naming it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileError {
    pub file: String,
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Job {
    pub id: i64,
    pub kind: String,
    pub state: JobState,
    pub collection: String,
    pub actor: String,
    /// Files processed so far, of `progress_total` files submitted.
    pub progress_done: u64,
    pub progress_total: u64,
    /// Documents written or confirmed unchanged so far, over all files (progress inside a large file).
    pub documents_done: u64,
    pub errors: Vec<FileError>,
    /// Set once cancellation was asked for and the running file has not yet stopped.
    pub cancel_requested: bool,
    pub created_at: String,
    pub updated_at: String,
    /// What a running model job is doing (empty for ingestion).
    pub stage: String,
    /// What a finished model job produced (JSON; empty for ingestion).
    pub result: String,
}

impl Job {
    /// See [`stage_text`].
    pub fn stage_text(&self) -> String {
        stage_text(&self.kind, self.state, &self.stage)
    }
}

/// One file of a job and what came of it.
#[derive(Debug, Clone, Serialize)]
pub struct JobFile {
    pub ordinal: i64,
    /// The name shown to people: the path as given (CLI), or the name inside the upload folder.
    pub file: String,
    pub state: String,
    pub added: u64,
    pub replaced: u64,
    pub unchanged: u64,
    pub chunks: u64,
    pub errors: Vec<FileError>,
}

/// The stored parameters of an ingest task ([`Task::Ingest`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestParams {
    pub options: IngestOptions,
}

const JOB_COLUMNS: &str = "id, kind, state, collection, actor, progress_done, progress_total, documents_done, errors, \
                           cancel_requested, created_at, updated_at, stage, result";

fn row_to_job(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    let state: String = r.get(2)?;
    let errors: String = r.get(8)?;
    Ok(Job {
        id: r.get(0)?,
        kind: r.get(1)?,
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        collection: r.get(3)?,
        actor: r.get(4)?,
        progress_done: r.get::<_, i64>(5)? as u64,
        progress_total: r.get::<_, i64>(6)? as u64,
        documents_done: r.get::<_, i64>(7)? as u64,
        errors: serde_json::from_str(&errors).unwrap_or_default(),
        cancel_requested: r.get::<_, i64>(9)? != 0,
        created_at: r.get(10)?,
        updated_at: r.get(11)?,
        stage: r.get(12)?,
        result: r.get(13)?,
    })
}

/// A name for an upload folder entry that cannot collide: time, process and a counter, hashed.
fn upload_token() -> String {
    use sha2::{Digest, Sha256};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = Sha256::new();
    h.update(format!(
        "{:?}/{}/{}",
        std::time::SystemTime::now(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    hex::encode(&h.finalize()[..12])
}

impl Engine {
    /// The folder where uploads wait for their job (`<data_dir>/uploads/`). An upload handler writes the files of
    /// one upload into a fresh sub-folder ([`Engine::new_upload_dir`]) and passes them to [`Engine::submit_ingest`].
    pub fn uploads_dir(&self) -> PathBuf {
        self.dir.root().join("uploads")
    }

    /// Creates `<data_dir>/uploads/<token>/` for the files of one upload.
    pub fn new_upload_dir(&self) -> Result<PathBuf> {
        let p = self.uploads_dir().join(upload_token());
        std::fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        Ok(p)
    }

    /// Refuses one more job when `[limits] max_queued_jobs` already wait: every queued upload holds its files on
    /// the data disk and every queued model job a turn of the one model lane, so an unbounded queue is unbounded
    /// disk and hours of work. Checked inside the inserting transaction, so concurrent submissions cannot pass it
    /// together.
    pub(crate) fn queue_room(&self, tx: &rusqlite::Transaction<'_>) -> Result<()> {
        let cap = self.cfg.limits.max_queued_jobs.max(1);
        let queued: i64 = tx.query_row("SELECT COUNT(*) FROM jobs WHERE state = 'queued'", [], |r| r.get(0))?;
        if queued as usize >= cap {
            return Err(Error::LimitReached(format!(
                "排队中的任务已达上限 {cap} 个；请等已排队的任务完成或取消一些后再提交（care.toml 的 [limits] max_queued_jobs）(too many queued jobs)"
            )));
        }
        Ok(())
    }

    pub(crate) fn jobs_lock_path(&self) -> PathBuf {
        self.dir.root().join("jobs.lock")
    }

    /// Queues an ingestion job for files already inside [`Engine::uploads_dir`]. The job owns them and deletes them
    /// when it ends. Returns the job id.
    pub fn submit_ingest(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &str,
    ) -> Result<i64> {
        self.submit_ingest_as_user(collection, files, opts, &Actor::console(actor))
    }

    /// [`Engine::submit_ingest`] for a signed-in actor: the job runs as that account, re-checked when it runs.
    pub(crate) fn submit_ingest_as_user(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &Actor,
    ) -> Result<i64> {
        let root = std::fs::canonicalize(self.uploads_dir()).map_err(|e| Error::io(self.uploads_dir(), e))?;
        let mut owned = Vec::with_capacity(files.len());
        for f in files {
            let c = std::fs::canonicalize(&f).map_err(|e| Error::io(&f, e))?;
            if !c.starts_with(&root) || c == root {
                return Err(Error::InvalidInput(format!(
                    "{} is not inside the uploads folder {}; upload handlers must place files there",
                    f.display(),
                    root.display()
                )));
            }
            owned.push(c);
        }
        self.submit(collection, owned, opts, actor, true)
    }

    /// Queues an ingestion job for files that stay where they are (the CLI); they are read, never deleted.
    pub fn submit_ingest_in_place(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &str,
    ) -> Result<i64> {
        let mut abs = Vec::with_capacity(files.len());
        for f in files {
            // A missing file is reported by the job like any other bad file; only make the path absolute.
            abs.push(std::path::absolute(&f).map_err(|e| Error::io(&f, e))?);
        }
        self.submit(collection, abs, opts, &Actor::console(actor), false)
    }

    fn submit(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &Actor,
        owned: bool,
    ) -> Result<i64> {
        self.store.collection(collection)?;
        if files.is_empty() {
            return Err(Error::InvalidInput("an ingestion job needs at least one file".into()));
        }
        if let Some(e) =
            opts.encoding.as_deref().filter(|e| encoding_rs::Encoding::for_label(e.trim().as_bytes()).is_none())
        {
            return Err(Error::InvalidInput(format!(
                "unknown encoding {e:?}; use utf-8, utf-16le, utf-16be, gb18030, gbk or big5"
            )));
        }
        let (kind, params_json) = Task::Ingest(IngestParams { options: opts.clone() }).to_row()?;
        let mut conn = self.store.conn();
        let tx = conn.transaction()?;
        self.queue_room(&tx)?;
        let ts = now();
        tx.execute(
            "INSERT INTO jobs (kind, state, params, progress_total, collection, actor, actor_user_id, created_at,
                               updated_at)
             VALUES (?1, 'queued', ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
            params![kind, params_json, files.len() as i64, collection, actor.name, actor.user_id, ts],
        )?;
        let id = tx.last_insert_rowid();
        {
            let mut ins = tx.prepare("INSERT INTO job_files (job_id, ordinal, path, owned) VALUES (?1, ?2, ?3, ?4)")?;
            for (i, f) in files.iter().enumerate() {
                ins.execute(params![id, i as i64, f.to_string_lossy(), owned as i64])?;
            }
        }
        let names: Vec<String> = files.iter().map(|f| self.display_name(f, owned)).collect();
        crate::audit::append(
            &tx,
            &actor.name,
            "ingest.submit",
            &serde_json::json!({"job": id, "collection": collection, "files": names, "options": opts}),
        )?;
        tx.commit()?;
        self.tasks_changed();
        Ok(id)
    }

    /// An uploaded file is shown by its name inside its upload folder, a CLI file by its path.
    fn display_name(&self, path: &Path, owned: bool) -> String {
        if owned
            && let Some(folder) = self.upload_folder(path)
            && let Ok(rest) = path.strip_prefix(&folder)
            && !rest.as_os_str().is_empty()
        {
            return rest.display().to_string();
        }
        path.display().to_string()
    }

    /// `<data_dir>/uploads/<token>` when `path` lies in an upload's folder.
    pub(crate) fn upload_folder(&self, path: &Path) -> Option<PathBuf> {
        let root = std::fs::canonicalize(self.uploads_dir()).unwrap_or_else(|_| self.uploads_dir());
        let rel = path.strip_prefix(&root).ok()?;
        let token = rel.components().next()?;
        Some(root.join(token))
    }

    /// Clinicians and admins see the name that was uploaded, not the folder the upload waits in: the
    /// `<data_dir>/uploads/<token>/` prefix to strip from sources and messages about `path`, when it is an uploaded file.
    pub(crate) fn upload_prefix(&self, path: &Path) -> Option<String> {
        self.upload_folder(path).map(|folder| format!("{}/", folder.display()))
    }

    pub fn job(&self, id: i64) -> Result<Job> {
        self.store
            .reader()
            .query_row(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"), [id], row_to_job)
            .optional()?
            .ok_or_else(|| Error::NotFound { what: format!("job {id}") })
    }

    /// The newest jobs first.
    pub fn jobs(&self, limit: usize) -> Result<Vec<Job>> {
        let conn = self.store.reader();
        let mut stmt = conn.prepare(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY id DESC LIMIT ?1"))?;
        let rows = stmt.query_map([limit as i64], row_to_job)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn job_files(&self, id: i64) -> Result<Vec<JobFile>> {
        /// ordinal, path, owned, state, added, replaced, unchanged, chunks, detail
        type JobFileRow = (i64, String, i64, String, i64, i64, i64, i64, String);
        self.job(id)?;
        let rows: Vec<JobFileRow> = {
            let conn = self.store.reader();
            let mut stmt = conn.prepare(
                "SELECT ordinal, path, owned, state, added, replaced, unchanged, chunks, detail FROM job_files
                 WHERE job_id = ?1 ORDER BY ordinal",
            )?;
            let rows = stmt.query_map([id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        Ok(rows
            .into_iter()
            .map(|(ordinal, path, owned, state, a, r, u, c, detail)| {
                let detail: serde_json::Value = serde_json::from_str(&detail).unwrap_or_default();
                JobFile {
                    ordinal,
                    file: self.display_name(Path::new(&path), owned != 0),
                    state,
                    added: a as u64,
                    replaced: r as u64,
                    unchanged: u as u64,
                    chunks: c as u64,
                    errors: serde_json::from_value(detail["errors"].clone()).unwrap_or_default(),
                }
            })
            .collect())
    }

    /// Cancels a job: a queued job ends at once; a running job stops after the batch in progress and skips the
    /// files it has not started. Documents already indexed stay (delete them if unwanted).
    pub fn cancel_job(&self, id: i64, actor: &str) -> Result<()> {
        let job = self.job(id)?;
        if job.state.is_finished() {
            return Err(Error::InvalidInput(format!(
                "job {id} already ended ({}); nothing to cancel",
                job.state.as_str()
            )));
        }
        let ended_now = {
            let mut conn = self.store.conn();
            let tx = conn.transaction()?;
            let ended = tx.execute(
                "UPDATE jobs SET state = 'cancelled', cancel_requested = 1, updated_at = ?2 WHERE id = ?1 AND state = 'queued'",
                params![id, now()],
            )? == 1;
            if ended {
                tx.execute("UPDATE job_files SET state = 'skipped' WHERE job_id = ?1 AND state = 'queued'", [id])?;
            } else {
                tx.execute("UPDATE jobs SET cancel_requested = 1, updated_at = ?2 WHERE id = ?1", params![id, now()])?;
            }
            crate::audit::append(
                &tx,
                actor,
                "job.cancel",
                &serde_json::json!({"job": id, "collection": job.collection}),
            )?;
            tx.commit()?;
            ended
        };
        // A running task in this process stops at its next batch; one in another process learns through the
        // datagram that `tasks_changed` sends (its scheduler then reads the flag just written).
        self.tasks.cancel(id);
        self.tasks_changed();
        if ended_now {
            self.remove_owned_files(id)?;
        }
        Ok(())
    }

    /// Run on open: when no other process runs jobs, jobs left `running` by a crash go back to `queued`, and files of
    /// ended jobs that a crash kept from being deleted are removed.
    pub(crate) fn recover_jobs(&self) -> Result<()> {
        let Some(lock) = self.try_jobs_lock()? else { return Ok(()) };
        self.requeue_running()?;
        drop(lock);
        Ok(())
    }

    fn try_jobs_lock(&self) -> Result<Option<std::fs::File>> {
        let p = self.jobs_lock_path();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| Error::io(&p, e))?;
        match f.try_lock() {
            Ok(()) => Ok(Some(f)),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&p, e)),
        }
    }

    pub(crate) fn requeue_running(&self) -> Result<()> {
        let n = self
            .store
            .conn()
            .execute("UPDATE jobs SET state = 'queued', updated_at = ?1 WHERE state = 'running'", [now()])?;
        if n > 0 {
            tracing::warn!(jobs = n, "re-queued ingestion jobs interrupted by a crash or restart");
        }
        let ended: Vec<i64> = {
            let conn = self.store.reader();
            let mut stmt = conn.prepare(
                "SELECT DISTINCT f.job_id FROM job_files f JOIN jobs j ON j.id = f.job_id
                 WHERE f.owned = 1 AND j.state IN ('done', 'failed', 'cancelled')",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        for id in ended {
            self.remove_owned_files(id)?;
        }
        Ok(())
    }

    /// Deletes the uploaded files of an ended job (and their upload folder once empty).
    pub(crate) fn remove_owned_files(&self, id: i64) -> Result<()> {
        let paths: Vec<String> = {
            let conn = self.store.reader();
            let mut stmt = conn.prepare("SELECT path FROM job_files WHERE job_id = ?1 AND owned = 1")?;
            let rows = stmt.query_map([id], |r| r.get(0))?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let root = std::fs::canonicalize(self.uploads_dir()).unwrap_or_else(|_| self.uploads_dir());
        for p in &paths {
            let p = Path::new(p);
            if !p.starts_with(&root) {
                continue;
            }
            if let Err(e) = std::fs::remove_file(p)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %p.display(), error = %e, "could not remove an uploaded file");
            }
            // Remove now-empty folders up to (not including) the uploads root.
            let mut dir = p.parent();
            while let Some(d) = dir {
                if d == root || !d.starts_with(&root) || std::fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
        }
        // The rows stay (they are the job's record); owned = 0 marks the files as gone.
        self.store.conn().execute("UPDATE job_files SET owned = 0 WHERE job_id = ?1 AND owned = 1", [id])?;
        Ok(())
    }
}

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

/// A file whose reading was interrupted by the process dying this many times (counted in SQLite, since the process
/// that would count in memory is the one that dies) is recorded as failed instead of read again: otherwise a file
/// that crashes the appliance would crash it at every restart, forever. Three, not one: a single kill (power cut,
/// an admin's restart, the OOM killer on a busy machine) says nothing about the file.
pub const MAX_CRASHES: i64 = 3;

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
        error: Some(format!("{e} (failed {n} times; fix the cause and upload the file again)")),
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
        match e.submitter_of(job) {
            Ok(_) => {}
            Err(err @ Error::Forbidden(_)) => {
                if !busy {
                    e.refuse_task(job, &err)?;
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
    let reports: Vec<FileReport> = match e.collection(&c.collection) {
        Err(err) => vec![FileReport {
            path: c.path.clone(),
            error_code: Some(err.code().as_str()),
            error: Some(format!("{err}; the collection was deleted after the upload")),
            ..Default::default()
        }],
        Ok(col) => {
            let mut docs_seen = 0usize;
            let res = e.ingest_one_file_stoppable(&col, &c.path, &c.options, &mut |done, _total| {
                let delta = done.saturating_sub(docs_seen);
                docs_seen = done;
                let _ = e.store.conn().execute(
                    "UPDATE jobs SET documents_done = documents_done + ?2, updated_at = ?3 WHERE id = ?1",
                    params![c.job, delta as i64, now()],
                );
                stopped = token.stop_reason();
                stopped.is_none()
            });
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
    let owned: bool = e
        .store
        .reader()
        .query_row("SELECT owned FROM job_files WHERE job_id = ?1 AND ordinal = ?2", params![c.job, c.ordinal], |r| {
            r.get::<_, i64>(0)
        })
        .map(|v| v != 0)?;
    let prefix = if owned { e.upload_prefix(&c.path) } else { None };
    let errors: Vec<FileError> = reports
        .iter()
        .filter_map(|r| {
            r.error.as_ref().map(|m| FileError {
                file: e.display_name(&r.path, owned),
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
        e.remove_owned_files(job)?;
        e.tasks_changed();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineConfig;
    use crate::engine::OpenMode;

    fn engine(dir: &Path) -> Arc<Engine> {
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = dir.to_path_buf();
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
            let j = e.job(id).unwrap();
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
        e.create_collection("c", "", "alice").unwrap();
        let up = e.new_upload_dir().unwrap();
        let files: Vec<PathBuf> = ["a.md", "poison.md", "c.md"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let p = up.join(n);
                std::fs::write(&p, format!("# 文件{i}\n正文内容{i}。")).unwrap();
                p
            })
            .collect();
        let id = e.submit_ingest("c", files, IngestOptions::default(), "alice").unwrap();
        // Two earlier crashes while reading poison.md, then a third: a.md and poison.md are read when it happens.
        e.store.conn().execute("UPDATE job_files SET unfinished_starts = 2 WHERE ordinal = 1", []).unwrap();
        crash_after_claiming(&e, 2);
        assert_eq!((starts(&e, id, 0), starts(&e, id, 1), starts(&e, id, 2)), (1, 3, 0));

        let w = Worker::start(e.clone(), 1);
        let job = wait(&e, id);
        w.shutdown();
        assert_eq!(job.state, JobState::Done, "{job:?}");
        assert_eq!(job.progress_done, 3);
        let files = e.job_files(id).unwrap();
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
        assert_eq!(e.stats().unwrap().documents, 2);
    }
}
