//! Backups: one consistent archive of everything a hospital put in, made while the appliance serves, ingests and
//! trains; verified byte for byte; restored onto an empty directory of a new machine.
//!
//! A backup is a task of its own lane ([`crate::tasks`]), so it runs beside ingestion and training in the process
//! that holds the jobs lock (`care serve`, or the `care backup create` that runs it when no server does). Its
//! snapshot ([`snapshot`]) is taken while the engine's writes wait, and costs what copying the metadata database
//! costs: the indexes and models are hard-linked, not copied (their files are never changed in place), and the
//! archive is written from those links after the writes resume. What it holds and how it is checked is in
//! [`archive`]; [`restore`] puts it back.

pub mod archive;
pub mod restore;
pub mod schedule;
mod snapshot;
pub mod standby;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use archive::{BackupInfo, BackupKey, ManifestEntry};

use crate::accounts::Admin;
use crate::cancel::CancelToken;
use crate::error::{Error, Result};

/// The task's stored kind.
pub const BACKUP: &str = "backup.create";
/// An archive's file name ends so; anything else in the folder is not listed.
pub const EXTENSION: &str = "care-backup";

pub use crate::config::BackupConfig;

/// What a backup task is asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackupParams {
    /// Another folder than `[backup] dir`.
    #[serde(default)]
    pub to: Option<PathBuf>,
}

impl crate::jobs::JobParams for BackupParams {
    const KIND: &'static str = BACKUP;
}

/// A finished backup.
#[derive(Debug, Clone, Serialize)]
pub struct BackupReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub sha256: String,
    pub encrypted: bool,
    pub info: BackupInfo,
    pub seconds: f64,
    /// How long writes (ingestion batches, deletions) waited for the snapshot.
    pub writes_paused_ms: u64,
    /// Archives the retention rule removed.
    pub removed: Vec<String>,
}

/// An archive in a backup folder, as `care backup list` and the console show it.
#[derive(Debug, Clone, Serialize)]
pub struct BackupEntry {
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
    /// `None` when its start cannot be read (then `problem` says why).
    pub info: Option<BackupInfo>,
    pub problem: Option<String>,
}

/// An archive read to its end with every byte checked.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub path: PathBuf,
    pub info: BackupInfo,
    pub files: usize,
    pub data_bytes: u64,
}

/// `care-20261130-021500.care-backup` for a UTC time.
fn archive_name(t: time::OffsetDateTime) -> String {
    format!(
        "care-{:04}{:02}{:02}-{:02}{:02}{:02}.{EXTENSION}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The UTC time an archive's name says it was made, for retention; `None` for any other file.
fn archive_time(name: &str) -> Option<time::PrimitiveDateTime> {
    let stem = name.strip_prefix("care-")?.strip_suffix(&format!(".{EXTENSION}"))?;
    let fmt = time::macros::format_description!("[year][month][day]-[hour][minute][second]");
    time::PrimitiveDateTime::parse(stem, &fmt).ok()
}

/// The archives' paths in `dir`, by name, newest first. Half-written ones (hidden names) are never among them.
fn archive_paths(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(name, _)| archive_time(name).is_some())
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0));
    Ok(out)
}

/// The archives in `dir`, newest first, each with its `backup.json` (the start of the archive) read.
pub fn list(dir: &Path, key: Option<&BackupKey>) -> Result<Vec<BackupEntry>> {
    Ok(archive_paths(dir)?
        .into_iter()
        .map(|(name, path)| {
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let (info, problem) = match archive::read_info(&path, key) {
                Ok(i) => (Some(i), None),
                Err(err) => (None, Some(err.to_string())),
            };
            BackupEntry { name, path, bytes, info, problem }
        })
        .collect())
}

/// Reads `path` to its end and checks every byte (see [`archive`]).
pub fn verify(path: &Path, key: Option<&BackupKey>) -> Result<VerifyReport> {
    let (info, manifest) = archive::read(path, key, |_| Ok(()), |_, _| Ok(()))?;
    Ok(VerifyReport {
        path: path.to_path_buf(),
        files: manifest.len(),
        data_bytes: manifest.iter().map(|m| m.size).sum(),
        info,
    })
}

/// Which archives retention keeps: the newest of each of the newest `daily` days and `weekly` ISO weeks.
fn to_remove(names: &[String], daily: u32, weekly: u32) -> Vec<String> {
    if daily == 0 && weekly == 0 {
        return Vec::new();
    }
    let mut dated: Vec<(time::PrimitiveDateTime, &String)> =
        names.iter().filter_map(|n| archive_time(n).map(|t| (t, n))).collect();
    dated.sort_by(|a, b| b.0.cmp(&a.0));
    let mut keep = std::collections::HashSet::new();
    let mut days = Vec::new();
    let mut weeks = Vec::new();
    for (t, n) in &dated {
        let day = t.date();
        if !days.contains(&day) && days.len() < daily as usize {
            days.push(day);
            keep.insert(*n);
        }
        let week = (t.date().iso_week(), t.date().to_iso_week_date().0);
        if !weeks.contains(&week) && weeks.len() < weekly as usize {
            weeks.push(week);
            keep.insert(*n);
        }
    }
    dated.iter().filter(|(_, n)| !keep.contains(n)).map(|(_, n)| (*n).clone()).collect()
}

/// Removes hidden leftovers of backups whose process is gone (`.care-….partial-PID`).
fn remove_stale_partials(dir: &Path) {
    crate::datadir::remove_orphans(dir, partial_pid, "backup");
}

/// The process id a half-written archive's name carries.
fn partial_pid(name: &str) -> Option<&str> {
    name.starts_with(".care-").then(|| name.rsplit_once(".partial-")).flatten().map(|p| p.1)
}

/// Makes backups: the snapshot taken beside the writers, the archive written, retention applied.
#[derive(Clone, Copy)]
pub struct BackupMaker<'e> {
    pub(crate) cfg: &'e crate::config::EngineConfig,
    pub(crate) dir: &'e crate::datadir::DataDir,
    pub(crate) store: &'e crate::store::Store,
    pub(crate) write_lock: &'e std::sync::Mutex<()>,
    pub(crate) retrieval: crate::hybrid::Retrieval<'e>,
    pub(crate) queue: crate::jobs::JobQueue<'e>,
}

impl BackupMaker<'_> {
    /// The part, borrowed from the engine's.
    pub fn of(e: &crate::Engine) -> BackupMaker<'_> {
        e.backups().maker()
    }

    /// The key archives are encrypted with (`[backup] key_file`), read now.
    pub fn backup_key(&self) -> Result<Option<BackupKey>> {
        self.cfg.backup.key_file.as_deref().map(BackupKey::read).transpose()
    }

    /// What is in force: the console's folder, time and retention over care.toml's.
    fn backup_plan(&self) -> Result<schedule::Plan> {
        schedule::plan(&self.store.reader(), &self.cfg)
    }

    /// The folder archives go to by default.
    pub fn backup_folder(&self) -> Result<PathBuf> {
        Ok(self.backup_plan()?.dir)
    }

    /// Makes one backup into `p.to` (or the configured folder): the snapshot, then the archive written as a hidden
    /// file and renamed into place when complete, then retention. `progress(stage, done, total)` sees the bytes.
    pub(crate) fn make_backup(
        &self,
        p: &BackupParams,
        token: &CancelToken,
        progress: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<BackupReport> {
        let started = Instant::now();
        let key = self.backup_key()?;
        let plan = self.backup_plan()?;
        let folder = p.to.clone().unwrap_or_else(|| plan.dir.clone());
        std::fs::create_dir_all(&folder).map_err(|e| Error::io(&folder, e))?;
        remove_stale_partials(&folder);
        progress("正在生成快照", 0, 0);
        let snap = snapshot::Snapshot::take(self)?;
        let total = snap.info.data_bytes;
        // The archive may not fill the target's disk, nor (when it is the data disk) eat the reserve kept free
        // for searching. Compression usually needs less; an estimate too low would fail mid-way, cleanly.
        let reserve = if same_disk(&folder, self.dir.root()) { self.cfg.disk_reserve_bytes() } else { 0 };
        if let Ok((_, available)) = crate::datadir::free_bytes(&folder)
            && available < total.saturating_add(reserve)
        {
            return Err(Error::NoSpace {
                what: format!("备份到 {}（未压缩 {}）", folder.display(), crate::error::gib(total)),
                needed: total,
                available,
                reserve,
            });
        }
        let name = archive_name(time::OffsetDateTime::now_utc());
        let final_path = folder.join(&name);
        let partial = folder.join(format!(".{name}.partial-{}", std::process::id()));
        let written = (|| -> Result<(String, u64)> {
            let f = std::fs::File::create(&partial).map_err(|e| Error::io(&partial, e))?;
            let out = std::io::BufWriter::with_capacity(1 << 20, f);
            let (out, sha, bytes) = archive::write(out, &final_path, &snap.info, &snap.files, key.as_ref(), |done| {
                progress("正在写入备份", done, total);
                token.check()
            })?;
            let f = out.into_inner().map_err(|e| Error::io(&partial, e.into_error()))?;
            f.sync_all().map_err(|e| Error::io(&partial, e))?;
            std::fs::rename(&partial, &final_path).map_err(|e| Error::io(&final_path, e))?;
            crate::audit::sync_dir(&folder);
            Ok((sha, bytes))
        })();
        let (sha256, bytes) = written.inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })?;
        let (info, writes_paused_ms) = (snap.info.clone(), snap.writes_paused_ms);
        drop(snap);
        // Retention needs the names only, not each archive's start decompressed.
        let names: Vec<String> = archive_paths(&folder)?.into_iter().map(|(n, _)| n).collect();
        let mut removed = to_remove(&names, plan.keep_daily, plan.keep_weekly);
        removed.retain(|n| *n != name && std::fs::remove_file(folder.join(n)).is_ok());
        Ok(BackupReport {
            path: final_path,
            bytes,
            sha256,
            encrypted: key.is_some(),
            info,
            seconds: started.elapsed().as_secs_f64(),
            writes_paused_ms,
            removed,
        })
    }
}

impl BackupMaker<'_> {
    /// The backup lane's task: makes the backup, writing its stage and bytes as the job's progress.
    pub(crate) fn run_backup_job(&self, id: i64, p: &BackupParams, token: &CancelToken) -> Result<serde_json::Value> {
        let mut last = Instant::now() - std::time::Duration::from_secs(1);
        let mut progress = |stage: &str, done: u64, total: u64| {
            if last.elapsed() >= std::time::Duration::from_millis(500) || done >= total {
                last = Instant::now();
                let mb = |b: u64| b.div_ceil(1 << 20);
                if let Err(e) = self.queue.job_progress(id, stage, mb(done), mb(total)) {
                    tracing::warn!(job = id, error = %e, "could not record progress");
                }
            }
        };
        let r = self.make_backup(p, token, &mut progress)?;
        tracing::info!(job = id, path = %r.path.display(), bytes = r.bytes, seconds = r.seconds,
            writes_paused_ms = r.writes_paused_ms, "backup written");
        serde_json::to_value(&r).map_err(|e| Error::Internal(format!("backup report: {e}")))
    }
}

/// Whether two existing paths are on one file system.
fn same_disk(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev(),
        _ => true,
    }
}

impl<'e> crate::engine::Backups<'e> {
    /// The part that makes backups, from this handle's.
    pub(crate) fn maker(self) -> BackupMaker<'e> {
        BackupMaker {
            cfg: self.cfg,
            dir: self.dir,
            store: self.store,
            write_lock: self.write_lock,
            retrieval: self.retrieval,
            queue: self.queue,
        }
    }
}

impl crate::engine::Backups<'_> {
    /// Queues a backup; the process that runs jobs makes it beside everything else. Returns the job id.
    pub fn submit(&self, actor: &Admin, p: &BackupParams) -> Result<i64> {
        let id = {
            let mut conn = self.store.conn();
            let tx = conn.transaction()?;
            self.queue.queue_room(&tx)?;
            let id = crate::jobs::insert_job(&tx, p, actor)?;
            let detail = serde_json::json!({"job": id, "to": p.to});
            crate::audit::append(&tx, &actor.name, "backup.submit", &detail)?;
            tx.commit()?;
            id
        };
        self.queue.tasks_changed();
        Ok(id)
    }

    /// The archives in `dir` (default: the configured folder), newest first.
    pub fn list(&self, _admin: &Admin, dir: Option<&Path>) -> Result<Vec<BackupEntry>> {
        let key = self.maker().backup_key()?;
        let dir = match dir {
            Some(d) => d.to_path_buf(),
            None => self.maker().backup_folder()?,
        };
        list(&dir, key.as_ref())
    }

    /// An archive of the backup folder by its name, to send to a standby; audited, so the overview shows the
    /// standby's last pull. Only names listed in the folder are opened (never a path from the request).
    pub fn download(&self, actor: &Admin, name: &str) -> Result<(PathBuf, u64)> {
        let folder = self.maker().backup_folder()?;
        let path =
            archive_paths(&folder)?.into_iter().find(|(n, _)| n == name).map(|(_, p)| p).ok_or_else(|| {
                Error::NotFound { what: format!("备份 {}", name.chars().take(80).collect::<String>()) }
            })?;
        let bytes = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
        self.store.audit_record(
            &actor.name,
            "backup.download",
            &serde_json::json!({"archive": name, "bytes": bytes}),
        )?;
        Ok((path, bytes))
    }

    /// The daily schedule in force, the last backup that ended and the one queued or running.
    pub fn status(&self, _admin: &Admin) -> Result<schedule::Status> {
        schedule::status(&self.store.reader(), &self.cfg)
    }

    /// Sets the daily time, the folder and the retention (`None`: back to care.toml's), audited; the scheduler
    /// computes the next run at once.
    pub fn set_schedule(&self, actor: &Admin, spec: Option<&schedule::ScheduleSpec>) -> Result<schedule::Plan> {
        let plan = schedule::set(self.store, &self.cfg, actor, spec)?;
        self.queue.tasks_changed();
        Ok(plan)
    }

    /// Reads an archive to its end, every byte checked; audited with its result.
    pub fn verify(&self, actor: &Admin, path: &Path, key: Option<&BackupKey>) -> Result<VerifyReport> {
        let own = self.maker().backup_key()?;
        let result = verify(path, key.or(own.as_ref()));
        let detail = match &result {
            Ok(r) => {
                serde_json::json!({"archive": path, "ok": true, "files": r.files, "created_at": r.info.created_at})
            }
            Err(e) => serde_json::json!({"archive": path, "ok": false, "error": e.to_string()}),
        };
        self.store.audit_record(&actor.name, "backup.verify", &detail)?;
        result
    }
}
