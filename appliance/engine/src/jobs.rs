//! Ingestion jobs: durable in SQLite, run by a background worker with bounded concurrency, resumable after a crash.
//!
//! A job is a row in `jobs` plus one row per file in `job_files`. The worker claims files one at a time (several in
//! parallel: parsing is the slow part; writes to the stores are serialised by the engine), ingests each through the
//! same crash-safe batch protocol as `Indexer::ingest_files`, and confirms the file in one transaction that also
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

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::accounts::Actor;
use crate::error::{Error, Result};
use crate::ingest::IngestOptions;
use crate::store::now;

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

/// The job queue on disk: uploads waiting for their job, submitting, listing, cancelling, and the lock that makes
/// one process the scheduler's.
#[derive(Clone, Copy)]
pub struct JobQueue<'e> {
    pub(crate) cfg: &'e crate::config::EngineConfig,
    pub(crate) dir: &'e crate::datadir::DataDir,
    pub(crate) store: &'e crate::store::Store,
    pub(crate) tasks: &'e crate::cancel::Hub,
}

/// How often a task's embedding and scoring loops write their progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Age after which an upload folder no job owns is an interrupted upload's.
const STALE_UPLOAD: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

impl JobQueue<'_> {
    /// Removes upload folders that no unfinished job owns and nothing touched for [`STALE_UPLOAD`]: what a process
    /// that died between receiving files and queuing them left (the server removes a folder when a client goes away
    /// mid-upload). Recent folders stay, as another process may be filling one.
    pub(crate) fn sweep_uploads(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.uploads_dir()) else { return 0 };
        let owned: std::collections::HashSet<std::path::PathBuf> = self
            .store
            .reader()
            .prepare(
                "SELECT f.path FROM job_files f JOIN jobs j ON j.id = f.job_id
                 WHERE f.owned = 1 AND j.state IN ('queued', 'running')",
            )
            .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<_>>>())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| self.upload_folder(std::path::Path::new(p)))
            .collect();
        let newest = |dir: &std::path::Path| -> Option<std::time::SystemTime> {
            let own = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
            let files =
                std::fs::read_dir(dir).ok()?.flatten().filter_map(|e| e.metadata().and_then(|m| m.modified()).ok());
            files.chain(own).max()
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let dir = std::fs::canonicalize(e.path()).unwrap_or_else(|_| e.path());
            let stale = newest(&dir).and_then(|t| t.elapsed().ok()).is_some_and(|age| age > STALE_UPLOAD);
            if e.file_type().is_ok_and(|t| t.is_dir()) && stale && !owned.contains(&dir) {
                removed += usize::from(std::fs::remove_dir_all(&dir).is_ok());
            }
        }
        removed
    }

    /// The progress sink of a task's embedding and scoring loops: writes at most every [`PROGRESS_EVERY`] (and at
    /// the end), and ends the loop with `Cancelled` once `token` is raised (the check at each batch).
    pub(crate) fn dense_progress<'a>(
        self,
        id: i64,
        token: &'a crate::cancel::CancelToken,
    ) -> impl FnMut(crate::hybrid::DenseProgress) -> Result<()> + 'a
    where
        Self: 'a,
    {
        let mut last = std::time::Instant::now() - PROGRESS_EVERY;
        move |d: crate::hybrid::DenseProgress| {
            if last.elapsed() >= PROGRESS_EVERY || d.done >= d.total {
                last = std::time::Instant::now();
                let stage = format!("{} {}", d.stage, d.collection);
                if let Err(e) = self.job_progress(id, &stage, d.done as u64, d.total as u64) {
                    tracing::warn!(job = id, error = %e, "could not record progress");
                }
            }
            token.check()
        }
    }

    /// Writes a job's stage and done/total.
    pub(crate) fn job_progress(&self, id: i64, stage: &str, done: u64, total: u64) -> Result<()> {
        self.store.conn().execute(
            "UPDATE jobs SET progress_done = ?2, progress_total = ?3, stage = ?4, updated_at = ?5 WHERE id = ?1",
            params![id, done as i64, total as i64, stage, now()],
        )?;
        Ok(())
    }

    /// Wakes the scheduler: here at once, and in the process holding the jobs lock through its socket (best
    /// effort: without a listener the datagram is dropped, and that process's next start reads the queue anyway).
    pub(crate) fn tasks_changed(&self) {
        self.tasks.notify();
        if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
            let _ = s.set_nonblocking(true);
            let _ = s.send_to(b"w", crate::cancel::socket_path(self.dir.root()));
        }
    }

    /// The folder where uploads wait for their job (`<data_dir>/uploads/`). An upload handler writes the files of
    /// one upload into a fresh sub-folder ([`JobQueue::new_upload_dir`]) and passes them to [`JobQueue::submit_ingest`].
    pub fn uploads_dir(&self) -> PathBuf {
        self.dir.root().join("uploads")
    }

    /// Creates `<data_dir>/uploads/<token>/` for the files of one upload.
    pub(crate) fn new_upload_dir(&self) -> Result<PathBuf> {
        let p = self.uploads_dir().join(upload_token());
        std::fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        Ok(p)
    }

    /// Refuses one more job when `[limits] max_queued_jobs` already wait: every queued upload holds its files on
    /// the data disk and every queued model job a turn of the one model lane, so an unbounded queue is unbounded
    /// disk and hours of work. Checked inside the inserting transaction, so concurrent submissions cannot pass it
    /// together.
    pub(crate) fn queue_room(&self, tx: &rusqlite::Transaction<'_>) -> Result<()> {
        queue_room(tx, self.cfg.limits.max_queued_jobs)
    }

    pub(crate) fn jobs_lock_path(&self) -> PathBuf {
        self.dir.root().join("jobs.lock")
    }

    #[cfg(test)] // the tests' shortcut; the façade's operation is audited
    /// Queues an ingestion job for files already inside [`JobQueue::uploads_dir`]. The job owns them and deletes them
    /// when it ends. Returns the job id.
    pub(crate) fn submit_ingest(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &str,
    ) -> Result<i64> {
        self.submit_ingest_as_user(collection, files, opts, &Actor::console(actor))
    }

    /// [`JobQueue::submit_ingest`] for a signed-in actor: the job runs as that account, re-checked when it runs.
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
                    "{} 不在上传文件夹 {} 中；上传的文件必须放在那里",
                    f.display(),
                    root.display()
                )));
            }
            owned.push(c);
        }
        self.submit(collection, owned, opts, actor, true)
    }

    pub(crate) fn submit(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &Actor,
        owned: bool,
    ) -> Result<i64> {
        self.store.collection(collection)?;
        if files.is_empty() {
            return Err(Error::InvalidInput("入库任务至少需要一个文件".into()));
        }
        if let Some(e) =
            opts.encoding.as_deref().filter(|e| encoding_rs::Encoding::for_label(e.trim().as_bytes()).is_none())
        {
            return Err(Error::InvalidInput(format!(
                "未知编码 {e:?}：请用 utf-8、utf-16le、utf-16be、gb18030、gbk 或 big5"
            )));
        }
        let (kind, params_json) = (IngestParams::KIND, params_json(&IngestParams { options: opts.clone() })?);
        let mut conn = self.store.conn();
        let tx = conn.transaction()?;
        self.queue_room(&tx)?;
        let id = insert(&tx, kind, &params_json, actor, Some((collection, files.len())))?;
        {
            let mut ins = tx.prepare("INSERT INTO job_files (job_id, ordinal, path, owned) VALUES (?1, ?2, ?3, ?4)")?;
            for (i, f) in files.iter().enumerate() {
                ins.execute(params![id, i as i64, f.to_string_lossy(), owned as i64])?;
            }
        }
        let names: Vec<String> = files.iter().map(|f| self.display_name(f)).collect();
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

    /// An uploaded file is shown by its name inside its upload folder, a CLI file by its path. Decided by where the
    /// path lies, not by whether the job still owns the file: a finished job's uploads are removed (owned = 0) and
    /// must not then show the server's folder.
    pub(crate) fn display_name(&self, path: &Path) -> String {
        if let Some(folder) = self.upload_folder(path)
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
            .ok_or_else(|| Error::NotFound { what: format!("任务 #{id}") })
    }

    /// The newest jobs first.
    pub fn jobs(&self, limit: usize) -> Result<Vec<Job>> {
        let conn = self.store.reader();
        let mut stmt = conn.prepare(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY id DESC LIMIT ?1"))?;
        let rows = stmt.query_map([limit as i64], row_to_job)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn job_files(&self, id: i64) -> Result<Vec<JobFile>> {
        /// ordinal, path, state, added, replaced, unchanged, chunks, detail
        type JobFileRow = (i64, String, String, i64, i64, i64, i64, String);
        self.job(id)?;
        let rows: Vec<JobFileRow> = {
            let conn = self.store.reader();
            let mut stmt = conn.prepare(
                "SELECT ordinal, path, state, added, replaced, unchanged, chunks, detail FROM job_files
                 WHERE job_id = ?1 ORDER BY ordinal",
            )?;
            let rows = stmt.query_map([id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        Ok(rows
            .into_iter()
            .map(|(ordinal, path, state, a, r, u, c, detail)| {
                let detail: serde_json::Value = serde_json::from_str(&detail).unwrap_or_default();
                JobFile {
                    ordinal,
                    file: self.display_name(Path::new(&path)),
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
    pub(crate) fn cancel_job(&self, id: i64, actor: &str) -> Result<()> {
        let job = self.job(id)?;
        if job.state.is_finished() {
            return Err(Error::InvalidInput(format!("任务 #{id} 已结束（{}），无需取消", job.state.as_str())));
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
        // A model task's stage and done/total describe the phase the dead process was in; the resumed task
        // writes its own, so until then it shows as queued (an ingest job's counters are cumulative: kept).
        let n = self.store.conn().execute(
            "UPDATE jobs SET state = 'queued', updated_at = ?1,
                 stage = CASE WHEN kind = 'ingest' THEN stage ELSE '' END,
                 progress_done = CASE WHEN kind = 'ingest' THEN progress_done ELSE 0 END,
                 progress_total = CASE WHEN kind = 'ingest' THEN progress_total ELSE 0 END
             WHERE state = 'running'",
            [now()],
        )?;
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

/// A file whose reading was interrupted by the process dying this many times (counted in SQLite, since the process
/// that would count in memory is the one that dies) is recorded as failed instead of read again: otherwise a file
/// that crashes the appliance would crash it at every restart, forever. Three, not one: a single kill (power cut,
/// an admin's restart, the OOM killer on a busy machine) says nothing about the file.
pub const MAX_CRASHES: i64 = 3;

/// Parameters a job row stores, with the `kind` the row carries; [`crate::tasks::Task`] reads both back (one variant
/// per kind, with these types as contents).
pub trait JobParams: Serialize {
    const KIND: &'static str;
}

impl JobParams for IngestParams {
    const KIND: &'static str = "ingest";
}

pub(crate) fn params_json(p: &impl Serialize) -> Result<String> {
    serde_json::to_string(p).map_err(|e| Error::Internal(format!("task parameters: {e}")))
}

/// Refuses a new job when `cap` jobs (`[limits] max_queued_jobs`) already wait.
pub(crate) fn queue_room(tx: &rusqlite::Transaction<'_>, cap: usize) -> Result<()> {
    let cap = cap.max(1);
    let queued: i64 = tx.query_row("SELECT COUNT(*) FROM jobs WHERE state = 'queued'", [], |r| r.get(0))?;
    if queued as usize >= cap {
        return Err(Error::LimitReached(format!(
            "排队中的任务已达上限 {cap} 个；请等已排队的任务完成或取消一些后再提交（care.toml 的 [limits] max_queued_jobs）(too many queued jobs)"
        )));
    }
    Ok(())
}

/// Queues a job of `params`' kind for `actor` in `tx` (the caller's transaction, with its audit record).
pub(crate) fn insert_job<P: JobParams>(tx: &rusqlite::Transaction<'_>, params: &P, actor: &Actor) -> Result<i64> {
    insert_row(tx, P::KIND, &params_json(params)?, actor)
}

/// Queues a job row as stored: `kind` and its JSON `params`.
pub(crate) fn insert_row(tx: &rusqlite::Transaction<'_>, kind: &str, json: &str, actor: &Actor) -> Result<i64> {
    insert(tx, kind, json, actor, None)
}

/// The one insert of a job row; an ingest job names its collection and counts its files.
fn insert(
    tx: &rusqlite::Transaction<'_>,
    kind: &str,
    json: &str,
    actor: &Actor,
    ingest: Option<(&str, usize)>,
) -> Result<i64> {
    let (collection, files) = ingest.map_or(("", 0), |(c, n)| (c, n as i64));
    tx.execute(
        "INSERT INTO jobs (kind, state, params, progress_total, collection, actor, actor_user_id, stage, created_at,
                           updated_at)
         VALUES (?1, 'queued', ?2, ?3, ?4, ?5, ?6, '', ?7, ?7)",
        params![kind, json, files, collection, actor.name, actor.user_id, now()],
    )?;
    Ok(tx.last_insert_rowid())
}
