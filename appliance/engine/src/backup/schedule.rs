//! The daily backup: its time, target folder and retention, set on the console (设置 → 备份) over care.toml's
//! `[backup]`, and fired by the scheduler's timer lane in the process that runs jobs.
//!
//! One row (`backup_schedule`, migration 28) holds the console's values (NULL: the file's) and the next run. Firing
//! queues the backup task and moves the next run in one transaction, so a crash neither loses nor repeats it; a run
//! missed while the appliance was down is made once at the next start. A run that comes due while another backup is
//! queued or running is not queued again: that one is the day's backup.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use time::OffsetDateTime;

use super::BackupParams;
use crate::accounts::{Actor, Admin};
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::store::{Store, now};
use crate::training::schedule::{hospital_offset, next_occurrence, parse_rfc3339, parse_time, rfc3339};

/// Kept archives an admin may ask for: two years of days, ten years of weeks.
const MAX_KEEP_DAILY: u32 = 731;
const MAX_KEEP_WEEKLY: u32 = 520;

/// What the console's form sets.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ScheduleSpec {
    /// "HH:MM" (the hospital's time); empty: no scheduled backup.
    pub time: String,
    /// Target folder (absolute); empty: care.toml's.
    pub dir: String,
    pub keep_daily: u32,
    pub keep_weekly: u32,
}

/// The schedule in force: the console's values over care.toml's.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// "HH:MM"; `None`: no scheduled backup.
    pub time: Option<String>,
    pub dir: PathBuf,
    pub keep_daily: u32,
    pub keep_weekly: u32,
    /// The next scheduled run (UTC, RFC 3339), once the scheduler has computed it for `time`.
    pub next_due: Option<String>,
    /// Who set the console's values and when (UTC); `None`: all from care.toml.
    pub changed: Option<(String, String)>,
}

/// The newest backup that ended, as the overview shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LastBackup {
    pub job: i64,
    /// done, failed or cancelled.
    pub state: String,
    /// When it ended (UTC).
    pub at: String,
    pub path: Option<String>,
    pub bytes: Option<u64>,
    pub error: Option<String>,
}

/// A standby's newest download of an archive from here.
#[derive(Debug, Clone, Serialize)]
pub struct Pull {
    /// When (UTC), by which account, which archive.
    pub at: String,
    pub by: String,
    pub archive: String,
}

/// The schedule, the last ended backup, the one queued or running, and the last standby pull.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub plan: Plan,
    pub last: Option<LastBackup>,
    pub running: Option<i64>,
    pub pulled: Option<Pull>,
}

#[derive(Default)]
struct Row {
    time: Option<String>,
    dir: Option<String>,
    keep_daily: Option<u32>,
    keep_weekly: Option<u32>,
    next_due: String,
    due_for: String,
    updated_by: String,
    updated_at: String,
}

fn row(conn: &Connection) -> Result<Row> {
    Ok(conn
        .query_row(
            "SELECT time, dir, keep_daily, keep_weekly, next_due, due_for, updated_by, updated_at
             FROM backup_schedule WHERE id = 1",
            [],
            |r| {
                Ok(Row {
                    time: r.get(0)?,
                    dir: r.get(1)?,
                    keep_daily: r.get(2)?,
                    keep_weekly: r.get(3)?,
                    next_due: r.get(4)?,
                    due_for: r.get(5)?,
                    updated_by: r.get(6)?,
                    updated_at: r.get(7)?,
                })
            },
        )
        .optional()?
        .unwrap_or_default())
}

fn plan_of(r: &Row, cfg: &EngineConfig) -> Plan {
    let time = r.time.clone().or_else(|| cfg.backup.time.clone()).filter(|t| !t.trim().is_empty());
    let next_due = time.as_ref().filter(|t| **t == r.due_for && !r.next_due.is_empty()).map(|_| r.next_due.clone());
    Plan {
        dir: r.dir.as_ref().map_or_else(|| cfg.backup.folder(&cfg.storage.data_dir), PathBuf::from),
        keep_daily: r.keep_daily.unwrap_or(cfg.backup.keep_daily),
        keep_weekly: r.keep_weekly.unwrap_or(cfg.backup.keep_weekly),
        changed: (!r.updated_by.is_empty()).then(|| (r.updated_by.clone(), r.updated_at.clone())),
        time,
        next_due,
    }
}

/// The schedule in force.
pub(crate) fn plan(conn: &Connection, cfg: &EngineConfig) -> Result<Plan> {
    Ok(plan_of(&row(conn)?, cfg))
}

/// The schedule, the last ended backup and the one queued or running.
pub(crate) fn status(conn: &Connection, cfg: &EngineConfig) -> Result<Status> {
    let last = conn
        .query_row(
            "SELECT id, state, updated_at, result, errors FROM jobs
             WHERE kind = ?1 AND state IN ('done', 'failed', 'cancelled') ORDER BY id DESC LIMIT 1",
            [super::BACKUP],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, String>(3)?, r.get::<_, String>(4)?)),
        )
        .optional()?
        .map(|(job, state, at, result, errors): (i64, String, String, String, String)| {
            let result: serde_json::Value = serde_json::from_str(&result).unwrap_or_default();
            let errors: Vec<crate::jobs::FileError> = serde_json::from_str(&errors).unwrap_or_default();
            LastBackup {
                job,
                state,
                at,
                path: result["path"].as_str().map(str::to_string),
                bytes: result["bytes"].as_u64(),
                error: errors.into_iter().next().map(|e| e.message),
            }
        });
    let running = conn
        .query_row(
            "SELECT id FROM jobs WHERE kind = ?1 AND state IN ('queued', 'running') ORDER BY id LIMIT 1",
            [super::BACKUP],
            |r| r.get(0),
        )
        .optional()?;
    let mut plan = plan(conn, cfg)?;
    // Before the scheduler's first look (no process runs jobs yet) the next run is what it will compute.
    if plan.next_due.is_none() {
        plan.next_due = next_run(plan.time.as_deref(), cfg, OffsetDateTime::now_utc());
    }
    let pulled = conn
        .query_row(
            "SELECT at, actor, detail FROM audit WHERE action = 'backup.download' ORDER BY id DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)?)),
        )
        .optional()?
        .map(|(at, by, detail): (String, String, String)| {
            let d: serde_json::Value = serde_json::from_str(&detail).unwrap_or_default();
            Pull { at, by, archive: d["archive"].as_str().unwrap_or_default().to_string() }
        });
    Ok(Status { plan, last, running, pulled })
}

impl ScheduleSpec {
    /// Checks the values; the folder is created if missing and must take a file (a Chinese message otherwise).
    fn check(&self) -> Result<()> {
        if !self.time.trim().is_empty() {
            parse_time(&self.time)?;
        }
        if self.keep_daily > MAX_KEEP_DAILY || self.keep_weekly > MAX_KEEP_WEEKLY {
            return Err(Error::InvalidInput(format!(
                "保留份数过大：每日最多 {MAX_KEEP_DAILY}，每周最多 {MAX_KEEP_WEEKLY} (keep_daily/keep_weekly too large)"
            )));
        }
        let dir = self.dir.trim();
        if !dir.is_empty() {
            if !Path::new(dir).is_absolute() {
                return Err(Error::InvalidInput(format!(
                    "备份文件夹须为绝对路径，如 /mnt/backup/care，收到「{}」 (backup folder must be absolute)",
                    dir.chars().take(80).collect::<String>()
                )));
            }
            writable(Path::new(dir))?;
        }
        Ok(())
    }
}

/// Whether the service can create `dir` and write a file in it: the console's folder is checked when it is saved,
/// not at 02:30.
fn writable(dir: &Path) -> Result<()> {
    let probe = dir.join(format!(".care-write-check-{}", std::process::id()));
    let r = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b"care"))
        .and_then(|_| std::fs::remove_file(&probe));
    r.map_err(|e| {
        Error::InvalidInput(format!(
            "无法在备份文件夹 {} 中写入：{e}。请确认文件夹存在且服务账户 care 可写；以 systemd 运行时，/var/lib/care-backups \
             以外的文件夹还须在 care.service 中允许写入（systemctl edit care → [Service] ReadWritePaths=该文件夹，\
             见 docs/admin/backup.md） (backup folder not writable)",
            dir.display()
        ))
    })
}

/// Stores the console's values (audited with the values before) and lets the next run be computed anew.
pub(crate) fn set(store: &Store, cfg: &EngineConfig, actor: &Admin, spec: Option<&ScheduleSpec>) -> Result<Plan> {
    if let Some(s) = spec {
        s.check()?;
    }
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let before = plan(&tx, cfg)?;
    tx.execute("INSERT INTO backup_schedule (id) VALUES (1) ON CONFLICT(id) DO NOTHING", [])?;
    let dir = |s: &ScheduleSpec| Some(s.dir.trim().to_string()).filter(|d| !d.is_empty());
    tx.execute(
        "UPDATE backup_schedule SET time = ?1, dir = ?2, keep_daily = ?3, keep_weekly = ?4, due_for = '',
                next_due = '', updated_by = ?5, updated_at = ?6 WHERE id = 1",
        params![
            spec.map(|s| s.time.trim().to_string()),
            spec.and_then(dir),
            spec.map(|s| s.keep_daily),
            spec.map(|s| s.keep_weekly),
            spec.map_or(String::new(), |_| actor.name.clone()),
            spec.map_or(String::new(), |_| now()),
        ],
    )?;
    let after = plan(&tx, cfg)?;
    let view = |p: &Plan| serde_json::json!({"time": p.time, "dir": p.dir, "keep_daily": p.keep_daily, "keep_weekly": p.keep_weekly});
    let detail = serde_json::json!({"from": view(&before), "to": view(&after), "from_file": spec.is_none()});
    crate::audit::append(&tx, &actor.name, "backup.schedule_update", &detail)?;
    tx.commit()?;
    Ok(after)
}

/// The first run of a daily `time` ("HH:MM", the hospital's time) strictly after `after` (UTC, RFC 3339).
fn next_run(time: Option<&str>, cfg: &EngineConfig, after: OffsetDateTime) -> Option<String> {
    let minute = parse_time(time?).ok()?;
    Some(rfc3339(next_occurrence(None, minute, hospital_offset(cfg), after)))
}

/// What a wake-up of the timer lane did about the daily backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fired {
    /// The backup queued now, if one was due.
    pub job: Option<i64>,
    /// The next run after this one (UTC): when the timer lane wakes next for it.
    pub next: Option<OffsetDateTime>,
}

impl Fired {
    /// How long from `now` until the next run, as the timer lane waits.
    pub(crate) fn wake_at(&self, now: OffsetDateTime) -> Option<std::time::Instant> {
        let t = self.next.filter(|t| *t > now)?;
        Some(std::time::Instant::now() + std::time::Duration::try_from(t - now).unwrap_or_default())
    }
}

/// Queues the scheduled backup when it is due at `at`, and (re)computes the next run; in the process that runs
/// jobs, at each wake-up of the timer lane (one read of the schedule's row when nothing is due).
pub(crate) fn fire_due(store: &Store, cfg: &EngineConfig, at: OffsetDateTime) -> Result<Fired> {
    // The common case, nothing due and the next run known, reads only.
    let is_due = |p: &Plan| p.next_due.as_deref().and_then(parse_rfc3339).is_some_and(|t| t <= at);
    let r = row(&store.reader())?;
    let p = plan_of(&r, cfg);
    // Settled: the stored next run belongs to the time in force (none stored when there is no time).
    let settled = if p.time.is_some() { p.next_due.is_some() } else { r.next_due.is_empty() };
    if settled && !is_due(&p) {
        return Ok(Fired { job: None, next: p.next_due.as_deref().and_then(parse_rfc3339) });
    }
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let p = plan(&tx, cfg)?;
    let next = next_run(p.time.as_deref(), cfg, at);
    tx.execute("INSERT INTO backup_schedule (id) VALUES (1) ON CONFLICT(id) DO NOTHING", [])?;
    let due = is_due(&p);
    let mut job = None;
    if due {
        let busy: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE kind = ?1 AND state IN ('queued', 'running'))",
            [super::BACKUP],
            |r| r.get(0),
        )?;
        let system = Actor::console("schedule:backup");
        let (action, detail) = if busy {
            ("backup.schedule_skipped", serde_json::json!({"reason": "a backup is queued or running"}))
        } else {
            match crate::jobs::queue_room(&tx, cfg.limits.max_queued_jobs) {
                Ok(()) => {
                    let id = crate::jobs::insert_job(&tx, &BackupParams::default(), &system)?;
                    job = Some(id);
                    ("backup.submit", serde_json::json!({"job": id, "scheduled": p.time}))
                }
                Err(e) => ("backup.schedule_failed", serde_json::json!({"error": e.to_string()})),
            }
        };
        crate::audit::append(&tx, &system.name, action, &detail)?;
    }
    tx.execute(
        "UPDATE backup_schedule SET next_due = ?1, due_for = ?2, last_fired_at = CASE WHEN ?3 THEN ?4 ELSE last_fired_at END,
                last_job = coalesce(?5, last_job) WHERE id = 1",
        params![next.clone().unwrap_or_default(), p.time.clone().unwrap_or_default(), due, rfc3339(at), job],
    )?;
    tx.commit()?;
    Ok(Fired { job, next: next.as_deref().and_then(parse_rfc3339) })
}
