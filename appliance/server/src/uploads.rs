//! Uploads and ingest jobs for the admin console and API.
//!
//! An upload streams each multipart `file` part to a fresh folder under `<data_dir>/uploads/` (names sanitised,
//! total size capped by `server.max_upload_mib`) and submits an ingest job to the engine's durable queue; the
//! engine's worker (started by `care serve`) runs it, resumes it after a restart, and records per-file errors.
//! Job pages and the API read the queue through [`list_jobs`] / [`get_job`].

use std::path::{Path, PathBuf};

use actix_web::web;
use care_engine::{Engine, FileError};
use futures::StreamExt;
use serde::Serialize;

use crate::AppState;
use crate::api::blocking;
use crate::errors::ApiError;
use crate::guard::Caller;

#[derive(Debug, Clone, Serialize)]
pub struct Job {
    pub id: i64,
    pub kind: String,
    pub state: String,
    pub collection: String,
    pub actor: String,
    pub files: Vec<String>,
    pub progress_done: i64,
    pub progress_total: i64,
    pub documents: i64,
    pub errors: Vec<FileError>,
    pub created_at: String,
    pub updated_at: String,
}

/// The console's view of an engine job: the file names and counts the pages and the API show.
fn view(engine: &Engine, j: care_engine::Job) -> care_engine::Result<Job> {
    let files = engine.job_files(j.id)?.into_iter().map(|f| f.file).collect();
    Ok(Job {
        id: j.id,
        kind: j.kind,
        state: j.state.as_str().to_string(),
        collection: j.collection,
        actor: j.actor,
        files,
        progress_done: j.progress_done as i64,
        progress_total: j.progress_total as i64,
        documents: j.documents_done as i64,
        errors: j.errors,
        created_at: j.created_at,
        updated_at: j.updated_at,
    })
}

pub fn list_jobs(engine: &Engine, limit: usize) -> care_engine::Result<Vec<Job>> {
    engine.jobs(limit)?.into_iter().map(|j| view(engine, j)).collect()
}

pub fn get_job(engine: &Engine, id: i64) -> care_engine::Result<Job> {
    let j = engine.job(id)?;
    view(engine, j)
}

pub async fn jobs(state: &web::Data<AppState>, limit: usize) -> Result<Vec<Job>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || list_jobs(&engine, limit.clamp(1, 500))).await
}

pub async fn job(state: &web::Data<AppState>, id: i64) -> Result<Job, ApiError> {
    let engine = state.engine.clone();
    blocking(move || get_job(&engine, id)).await
}

pub async fn cancel(state: &web::Data<AppState>, caller: &Caller, id: i64) -> Result<(), ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    blocking(move || engine.cancel_job(id, &actor)).await
}

pub async fn approve(state: &web::Data<AppState>, caller: &Caller, name: &str, approved: bool) -> Result<(), ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let name = name.to_string();
    blocking(move || engine.set_approved_for_training(&name, approved, &actor).map(|_| ())).await
}

/// Deletes a collection's documents everywhere (SQLite, lexical and dense indexes, through the engine's crash-safe
/// deletion), then the collection row; grants go with it (ON DELETE CASCADE).
pub async fn delete_collection(state: &web::Data<AppState>, caller: &Caller, name: &str) -> Result<(), ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let name = name.to_string();
    blocking(move || engine.delete_collection(&name, &actor).map(|_| ())).await
}

/// Most files one upload may carry (a folder of guidelines is better sent as one ZIP).
pub const MAX_UPLOAD_FILES: usize = 1000;

/// Keeps the base name, replaces anything outside letters, digits, `.-_` and CJK with `_`.
fn safe_name(raw: &str) -> String {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let s: String =
        base.chars().map(|c| if c.is_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    let s = s.trim_start_matches('.').to_string();
    if s.is_empty() { "upload".into() } else { s.chars().take(120).collect() }
}

/// Streams the multipart `file` parts to disk and queues an ingest job. Returns the job id.
pub async fn upload(
    state: &web::Data<AppState>,
    caller: &Caller,
    collection: &str,
    mut payload: actix_multipart::Multipart,
) -> Result<i64, ApiError> {
    let engine = state.engine.clone();
    let col = collection.to_string();
    blocking({
        let engine = engine.clone();
        move || engine.collection(&col)
    })
    .await?;
    let limit = state.settings.server.max_upload_mib.saturating_mul(1 << 20);
    let dir = blocking({
        let engine = engine.clone();
        move || engine.new_upload_dir()
    })
    .await?;
    let cleanup = |dir: &Path| {
        let _ = std::fs::remove_dir_all(dir);
    };
    let mut files: Vec<PathBuf> = Vec::new();
    let mut taken = std::collections::HashSet::new();
    let mut total: u64 = 0;
    while let Some(field) = payload.next().await {
        let mut field = field.map_err(|e| {
            cleanup(&dir);
            ApiError::invalid(format!("reading the upload: {e}"))
        })?;
        if field.name() != Some("file") {
            continue;
        }
        // A browser sends an empty part for a file input left empty.
        let Some(fname) =
            field.content_disposition().and_then(|cd| cd.get_filename()).filter(|f| !f.is_empty()).map(safe_name)
        else {
            continue;
        };
        if files.len() >= MAX_UPLOAD_FILES {
            cleanup(&dir);
            return Err(ApiError::invalid(format!(
                "一次最多上传 {MAX_UPLOAD_FILES} 个文件；请分批上传，或打包成 ZIP (more than {MAX_UPLOAD_FILES} files in one upload)"
            )));
        }
        // Same-named parts get a numbered prefix; the names taken so far are kept in a set (no directory probing).
        let mut name = fname.clone();
        let mut n = 1;
        while !taken.insert(name.clone()) {
            name = format!("{n}-{fname}");
            n += 1;
        }
        let path = dir.join(&name);
        let mut out = std::fs::File::create(&path).map_err(|e| ApiError(care_engine::Error::io(&path, e)))?;
        while let Some(chunk) = field.next().await {
            let chunk = chunk.map_err(|e| {
                cleanup(&dir);
                ApiError::invalid(format!("reading the upload: {e}"))
            })?;
            total += chunk.len() as u64;
            if total > limit {
                cleanup(&dir);
                return Err(ApiError(care_engine::Error::TooLarge {
                    what: "the upload".into(),
                    size: total,
                    limit,
                    hint: "upload fewer files at once or raise server.max_upload_mib".into(),
                }));
            }
            use std::io::Write;
            out.write_all(&chunk).map_err(|e| ApiError(care_engine::Error::io(&path, e)))?;
        }
        files.push(path);
    }
    if files.is_empty() {
        cleanup(&dir);
        return Err(ApiError::invalid("the upload holds no files; choose at least one file"));
    }
    let actor = caller.name().to_string();
    let col = collection.to_string();
    // The engine's job queue owns the files from here: its worker ingests them (resuming after a restart) and
    // deletes them when the job ends.
    let job_id = blocking({
        let engine = engine.clone();
        move || {
            let names: Vec<String> =
                files.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
            let id = engine.submit_ingest(&col, files, care_engine::IngestOptions::default(), &actor)?;
            let detail = serde_json::json!({"collection": col, "job": id, "files": names, "bytes": total});
            crate::api::audit_alone(&engine, &actor, "collection.upload", &detail)?;
            Ok(id)
        }
    })
    .await?;
    Ok(job_id)
}
