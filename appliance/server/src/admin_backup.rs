//! The console's backups (设置 → 备份): the daily time, the target folder and retention, the last result and the
//! next run (also on the overview), the archives in the folder, and "back up now"; and the two API routes a
//! standby pulls backups through (a token that opens only them). The forms call the same engine operations as
//! `care backup`.

use actix_web::body::SizedStream;
use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{HttpResponse, get, post, web};
use care_engine::backup::BackupEntry;
use care_engine::backup::schedule::{ScheduleSpec, Status};
use care_engine::clock::local;
use serde::Deserialize;

use crate::AppState;
use crate::admin::{back_with, back_with_error};
use crate::call::call_admin;
use crate::errors::ApiError;
use crate::guard::Caller;

const BACK: &str = "/admin/settings#backup";

fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MB", bytes.div_ceil(1 << 20))
    }
}

/// One archive as the settings page lists it.
pub struct ArchiveRow {
    pub name: String,
    pub made: String,
    pub size: String,
    pub what: String,
}

/// The 备份 section of the settings page.
pub struct BackupSection {
    /// "每天 02:30" or that none is set.
    pub when: String,
    pub time: String,
    pub dir: String,
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub changed: Option<String>,
    pub last: Summary,
    pub archives: Vec<ArchiveRow>,
    /// Why the folder could not be listed.
    pub list_error: Option<String>,
}

/// The last result and the next run, in a line for the overview and the settings page.
pub struct Summary {
    pub text: String,
    /// The last backup failed (or none ever ended while one is scheduled long ago): shown as a warning.
    pub warn: bool,
}

pub fn summary(s: &Status) -> Summary {
    let last = match &s.last {
        None => "尚无备份".to_string(),
        Some(l) if l.state == "done" => {
            format!("上次备份 {} 成功（{}）", local(&l.at), l.bytes.map(size).unwrap_or_default())
        }
        Some(l) if l.state == "cancelled" => format!("上次备份 {} 已取消", local(&l.at)),
        Some(l) => format!("上次备份 {} 失败：{}", local(&l.at), l.error.as_deref().unwrap_or("原因未记录")),
    };
    let next = match (&s.running, &s.plan.next_due) {
        (Some(job), _) => format!("备份任务 #{job} 正在进行"),
        (None, Some(n)) => format!("下次 {}", local(n)),
        (None, None) => "未设置定时备份".to_string(),
    };
    Summary { text: format!("{last} · {next}"), warn: s.last.as_ref().is_some_and(|l| l.state == "failed") }
}

/// The overview's standby line: on a standby, where its data came from and how far behind it may be; on a
/// primary, a standby's last pull.
pub fn standby_line(data_dir: &std::path::Path, s: &Status) -> Option<String> {
    if let Some(st) = care_engine::backup::standby::read(data_dir) {
        let lag = st.lag_minutes().map_or_else(String::new, |m| format!("，落后主机约 {m} 分钟"));
        let error = st.last_error.as_deref().map_or_else(String::new, |e| format!("；上次检查出错：{e}"));
        return Some(format!(
            "备用机（只读）：数据来自主机 {} 的备份 {}（主机生成于 {}{lag}）；恢复于 {}，用时 {:.0} 秒；上次检查 {}{error}",
            st.primary,
            st.archive,
            local(&st.archive_created_at),
            local(&st.restored_at),
            st.restore_seconds,
            local(&st.checked_at)
        ));
    }
    s.pulled.as_ref().map(|p| format!("备用机（{}）上次于 {} 取走备份 {}", p.by, local(&p.at), p.archive))
}

pub fn section(s: &Status, list: Result<Vec<BackupEntry>, String>) -> BackupSection {
    let (archives, list_error) = match list {
        Ok(l) => (
            l.into_iter()
                .map(|b| ArchiveRow {
                    made: b.info.as_ref().map_or_else(String::new, |i| local(&i.created_at)),
                    size: size(b.bytes),
                    what: match (&b.info, &b.problem) {
                        (Some(i), _) => format!(
                            "{} 个资料库 · {} 篇文档 · care {}{}",
                            i.collections,
                            i.documents,
                            i.appliance_version,
                            i.live_pair.as_deref().map_or_else(String::new, |p| format!(" · 模型 {p}"))
                        ),
                        (None, Some(p)) => format!("无法读取：{p}"),
                        (None, None) => String::new(),
                    },
                    name: b.name,
                })
                .collect(),
            None,
        ),
        Err(e) => (Vec::new(), Some(e)),
    };
    let p = &s.plan;
    BackupSection {
        when: p.time.as_ref().map_or_else(|| "未设置定时备份".to_string(), |t| format!("每天 {t}")),
        time: p.time.clone().unwrap_or_default(),
        dir: p.dir.display().to_string(),
        keep_daily: p.keep_daily,
        keep_weekly: p.keep_weekly,
        changed: p.changed.as_ref().map(|(by, at)| format!("{by} 于 {} 在此修改", local(at))),
        last: summary(s),
        archives,
        list_error,
    }
}

#[derive(Debug, Deserialize)]
pub struct ScheduleForm {
    #[serde(default)]
    time: String,
    #[serde(default)]
    dir: String,
    #[serde(default)]
    keep_daily: String,
    #[serde(default)]
    keep_weekly: String,
    #[serde(default)]
    clear: String,
}

fn count(raw: &str, what: &str) -> Result<u32, care_engine::Error> {
    raw.trim().parse().map_err(|_| {
        care_engine::Error::InvalidInput(format!(
            "「{what}」须为 0 或正整数，收到「{}」",
            raw.chars().take(20).collect::<String>()
        ))
    })
}

/// Saves the daily time, the folder and retention (`clear=1`: back to care.toml's).
#[post("/admin/settings/backup")]
pub async fn save_schedule(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<ScheduleForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    let clear = f.clear == "1";
    let r = call_admin(&state, &caller, move |e, a| {
        let spec = if clear {
            None
        } else {
            Some(ScheduleSpec {
                time: f.time,
                dir: f.dir,
                keep_daily: count(&f.keep_daily, "保留每日备份")?,
                keep_weekly: count(&f.keep_weekly, "保留每周备份")?,
            })
        };
        e.backups().set_schedule(a, spec.as_ref())
    })
    .await;
    match r {
        Ok(_) if clear => Ok(back_with(BACK, "已恢复为配置文件中的备份设置")),
        Ok(p) => Ok(back_with(
            BACK,
            &match p.time {
                Some(t) => format!("已保存：每天 {t} 备份到 {}", p.dir.display()),
                None => "已保存：不再定时备份".to_string(),
            },
        )),
        Err(e) => back_with_error(BACK, e),
    }
}

/// 立即备份: queues a backup now; its progress is on the jobs page.
#[post("/admin/backups")]
pub async fn backup_now(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let r = call_admin(&state, &caller, |e, a| e.backups().submit(a, &Default::default())).await;
    match r {
        Ok(id) => Ok(back_with(BACK, &format!("已开始备份（任务 #{id}），进度见任务页"))),
        Err(e) => back_with_error(BACK, e),
    }
}

/// The archives in the backup folder (newest first) with the schedule and the last backup; what a standby asks
/// for (its token opens only this and the download).
#[utoipa::path(get, path = "/api/v1/admin/backups", tag = "admin",
    responses((status = 200, description = "`{\"status\": …, \"archives\": [{\"name\", \"bytes\", \"info\"}, …]}`")))]
#[get("/api/v1/admin/backups")]
pub async fn admin_backups(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let (status, archives) =
        call_admin(&state, &caller, |e, a| Ok((e.backups().status(a)?, e.backups().list(a, None)?))).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": status, "archives": archives})))
}

/// One archive by its name in the listing, streamed; audited as the standby's pull.
#[utoipa::path(get, path = "/api/v1/admin/backups/{name}", tag = "admin",
    params(("name" = String, Path, description = "an archive's name as listed")),
    responses((status = 200, description = "the archive's bytes"), (status = 404, description = "no such archive")))]
#[get("/api/v1/admin/backups/{name}")]
pub async fn admin_backup_download(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = name.into_inner();
    let listed = name.clone();
    let (path, bytes) = call_admin(&state, &caller, move |e, a| e.backups().download(a, &listed)).await?;
    let file = std::fs::File::open(&path).map_err(|e| ApiError::from(care_engine::Error::io(&path, e)))?;
    // 1 MiB at a time on the blocking pool: an archive is gigabytes, and an async worker must not wait on a disk.
    let chunks = futures::stream::unfold(Some(file), |f| async move {
        let mut f = f?;
        let read = web::block(move || {
            let mut buf = vec![0u8; 1 << 20];
            let n = std::io::Read::read(&mut f, &mut buf)?;
            buf.truncate(n);
            Ok::<_, std::io::Error>((f, buf))
        })
        .await;
        match read {
            Ok(Ok((_, buf))) if buf.is_empty() => None,
            Ok(Ok((f, buf))) => Some((Ok(Bytes::from(buf)), Some(f))),
            Ok(Err(e)) => Some((Err(e), None)),
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
        }
    });
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")))
        .body(SizedStream::new(bytes, chunks)))
}
