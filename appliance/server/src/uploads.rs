//! Uploads and ingest jobs for the admin console and API.
//!
//! An upload streams each multipart `file` part to `<data_dir>/uploads/<random>/` (names sanitised, total size
//! capped by `server.max_upload_mib`), records a job row (`jobs` table, kind `ingest`), and ingests the files on a
//! background thread one file at a time through `Engine::ingest_files`, updating progress and per-file errors in
//! the row after each file; a cancel request takes effect between files. Jobs a restart interrupted are marked
//! failed on start (their files stay in the uploads folder for a retry).
//!
//! This runner is deliberately small: the engine's own job queue (issue 4) replaces it when it lands.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use actix_web::web;
use care_engine::{Engine, audit};
use futures::StreamExt;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::AppState;
use crate::api::blocking;
use crate::errors::ApiError;
use crate::guard::Caller;

#[derive(Debug, Clone, Serialize)]
pub struct FileError {
    pub file: String,
    pub code: String,
    pub message: String,
}

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

fn cancel_flags() -> &'static Mutex<HashMap<i64, Arc<AtomicBool>>> {
    static FLAGS: OnceLock<Mutex<HashMap<i64, Arc<AtomicBool>>>> = OnceLock::new();
    FLAGS.get_or_init(Default::default)
}

fn row_to_job(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    let params: String = r.get(3)?;
    let errors: String = r.get(6)?;
    let p: serde_json::Value = serde_json::from_str(&params).unwrap_or_default();
    let errors: Vec<serde_json::Value> = serde_json::from_str(&errors).unwrap_or_default();
    Ok(Job {
        id: r.get(0)?,
        kind: r.get(1)?,
        state: r.get(2)?,
        collection: p["collection"].as_str().unwrap_or_default().to_string(),
        actor: p["actor"].as_str().unwrap_or_default().to_string(),
        files: p["files"].as_array().map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect()).unwrap_or_default(),
        documents: p["documents"].as_i64().unwrap_or(0),
        progress_done: r.get(4)?,
        progress_total: r.get(5)?,
        errors: errors
            .iter()
            .map(|e| FileError {
                file: e["file"].as_str().unwrap_or_default().into(),
                code: e["code"].as_str().unwrap_or_default().into(),
                message: e["message"].as_str().unwrap_or_default().into(),
            })
            .collect(),
        created_at: r.get(7)?,
        updated_at: r.get(8)?,
    })
}

const JOB_COLS: &str = "id, kind, state, params, progress_done, progress_total, errors, created_at, updated_at";

pub fn list_jobs(engine: &Engine, limit: usize) -> care_engine::Result<Vec<Job>> {
    let conn = engine.store().conn();
    let mut st = conn.prepare(&format!("SELECT {JOB_COLS} FROM jobs ORDER BY id DESC LIMIT ?1"))?;
    let rows = st.query_map([limit as i64], row_to_job)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

pub fn get_job(engine: &Engine, id: i64) -> care_engine::Result<Job> {
    engine
        .store()
        .conn()
        .query_row(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"), [id], row_to_job)
        .optional()?
        .ok_or_else(|| care_engine::Error::NotFound { what: format!("job #{id}") })
}

/// Marks jobs a previous process left queued or running as failed (called once at server start).
pub fn fail_interrupted(engine: &Engine) -> care_engine::Result<usize> {
    Ok(engine.store().conn().execute(
        "UPDATE jobs SET state = 'failed', updated_at = ?1,
           errors = json_insert(errors, '$[#]', json_object('file', '', 'code', 'cancelled', 'message', 'interrupted by a restart; upload the files again'))
         WHERE kind = 'ingest' AND state IN ('queued', 'running')",
        [care_engine::store::now()],
    )?)
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
    blocking(move || {
        let j = get_job(&engine, id)?;
        if !matches!(j.state.as_str(), "queued" | "running") {
            return Err(care_engine::Error::InvalidInput(format!("job #{id} is {} and cannot be cancelled", j.state)));
        }
        if let Some(f) = cancel_flags().lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            f.store(true, Ordering::SeqCst);
        }
        audit::append(&engine.store().conn(), &actor, "job.cancel", &serde_json::json!({"job": id}))?;
        Ok(())
    })
    .await
}

pub async fn approve(state: &web::Data<AppState>, caller: &Caller, name: &str, approved: bool) -> Result<(), ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let name = name.to_string();
    blocking(move || {
        let mut conn = engine.store().conn();
        let tx = conn.transaction()?;
        let n = tx.execute("UPDATE collections SET approved_for_training = ?2 WHERE name = ?1", params![name, approved as i64])?;
        if n == 0 {
            return Err(care_engine::Error::UnknownCollection(name));
        }
        audit::append(&tx, &actor, "collection.approve", &serde_json::json!({"collection": name, "approved": approved}))?;
        tx.commit()?;
        Ok(())
    })
    .await
}

/// Deletes a collection's documents everywhere (SQLite, lexical and dense indexes, through the engine's crash-safe
/// deletion), then the collection row with its grants and dense table records.
pub async fn delete_collection(state: &web::Data<AppState>, caller: &Caller, name: &str) -> Result<(), ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let name = name.to_string();
    blocking(move || {
        let col = engine.collection(&name)?;
        let ids: Vec<String> = {
            let conn = engine.store().conn();
            let mut st = conn.prepare("SELECT external_id FROM documents WHERE collection_id = ?1")?;
            let rows = st.query_map([col.id], |r| r.get(0))?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        for batch in ids.chunks(2000) {
            engine.delete_documents(&name, batch)?;
        }
        let mut conn = engine.store().conn();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM dense_indexes WHERE collection_id = ?1", [col.id])?;
        tx.execute("DELETE FROM collections WHERE id = ?1", [col.id])?;
        audit::append(&tx, &actor, "collection.delete", &serde_json::json!({"collection": name, "documents": ids.len()}))?;
        tx.commit()?;
        Ok(())
    })
    .await
}

/// Keeps the base name, replaces anything outside letters, digits, `.-_` and CJK with `_`.
fn safe_name(raw: &str) -> String {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let s: String = base.chars().map(|c| if c.is_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    let s = s.trim_start_matches('.').to_string();
    if s.is_empty() { "upload".into() } else { s.chars().take(120).collect() }
}

/// Streams the multipart `file` parts to disk and queues an ingest job. Returns the job id.
pub async fn upload(state: &web::Data<AppState>, caller: &Caller, collection: &str, mut payload: actix_multipart::Multipart) -> Result<i64, ApiError> {
    let engine = state.engine.clone();
    let col = collection.to_string();
    blocking({
        let engine = engine.clone();
        move || engine.collection(&col)
    })
    .await?;
    let limit = state.settings.server.max_upload_mib.saturating_mul(1 << 20);
    let dir = engine.data_dir().root().join("uploads").join(&care_engine::accounts::random_token().map_err(ApiError)?[..16]);
    std::fs::create_dir_all(&dir).map_err(|e| ApiError(care_engine::Error::io(&dir, e)))?;
    let cleanup = |dir: &Path| {
        let _ = std::fs::remove_dir_all(dir);
    };
    let mut files: Vec<PathBuf> = Vec::new();
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
        let Some(fname) = field.content_disposition().and_then(|cd| cd.get_filename()).filter(|f| !f.is_empty()).map(safe_name)
        else {
            continue;
        };
        let mut path = dir.join(&fname);
        let mut n = 1;
        while path.exists() {
            path = dir.join(format!("{n}-{fname}"));
            n += 1;
        }
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
    let job_id = blocking({
        let engine = engine.clone();
        let files = files.clone();
        move || {
            let names: Vec<String> = files.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
            let mut conn = engine.store().conn();
            let tx = conn.transaction()?;
            let ts = care_engine::store::now();
            tx.execute(
                "INSERT INTO jobs (kind, state, params, progress_done, progress_total, errors, created_at, updated_at)
                 VALUES ('ingest', 'queued', ?1, 0, ?2, '[]', ?3, ?3)",
                params![serde_json::json!({"collection": col, "actor": actor, "files": names}).to_string(), files.len() as i64, ts],
            )?;
            let id = tx.last_insert_rowid();
            audit::append(&tx, &actor, "collection.upload", &serde_json::json!({"collection": col, "job": id, "files": names, "bytes": total}))?;
            tx.commit()?;
            Ok(id)
        }
    })
    .await?;
    let flag = Arc::new(AtomicBool::new(false));
    cancel_flags().lock().unwrap_or_else(|p| p.into_inner()).insert(job_id, flag.clone());
    let col = collection.to_string();
    std::thread::Builder::new()
        .name(format!("care-ingest-{job_id}"))
        .spawn(move || run_job(&engine, job_id, &col, &files, &flag))
        .map_err(ApiError::internal)?;
    Ok(job_id)
}

/// One job: files in order, progress after each; stops between files when cancelled.
fn run_job(engine: &Engine, id: i64, collection: &str, files: &[PathBuf], cancel: &AtomicBool) {
    // One ingest at a time: the engine's writer is single-threaded by design.
    static WRITER: Mutex<()> = Mutex::new(());
    let _w = WRITER.lock().unwrap_or_else(|p| p.into_inner());
    let set = |state: &str, done: i64, errors: &[FileError], docs: i64| {
        let conn = engine.store().conn();
        let _ = conn.execute(
            "UPDATE jobs SET state = ?2, progress_done = ?3, errors = ?4, updated_at = ?5,
               params = json_set(params, '$.documents', ?6) WHERE id = ?1",
            params![id, state, done, serde_json::to_string(errors).unwrap_or_else(|_| "[]".into()), care_engine::store::now(), docs],
        );
    };
    let mut errors = Vec::new();
    let mut docs = 0i64;
    set("running", 0, &errors, 0);
    let mut final_state = "done";
    for (i, f) in files.iter().enumerate() {
        if cancel.load(Ordering::SeqCst) {
            final_state = "cancelled";
            break;
        }
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match engine.ingest_files(collection, std::slice::from_ref(f), &mut |_| {}) {
            Ok(report) => {
                for fr in report.files {
                    docs += (fr.added + fr.replaced + fr.unchanged) as i64;
                    if let Some(msg) = fr.error {
                        let msg = msg.replace(&f.display().to_string(), &name);
                        errors.push(FileError { file: name.clone(), code: fr.error_code.unwrap_or("invalid_input").into(), message: msg });
                    }
                }
            }
            Err(e) => {
                errors.push(FileError { file: name.clone(), code: e.code().as_str().into(), message: e.to_string() });
                if matches!(e, care_engine::Error::UnknownCollection(_)) {
                    final_state = "failed";
                    break;
                }
            }
        }
        let _ = std::fs::remove_file(f);
        set("running", (i + 1) as i64, &errors, docs);
    }
    if final_state == "done" && !errors.is_empty() && errors.len() == files.len() {
        final_state = "failed";
    }
    let done: i64 = engine.store().conn().query_row("SELECT progress_done FROM jobs WHERE id = ?1", [id], |r| r.get(0)).unwrap_or(0);
    set(final_state, done, &errors, docs);
    if let Some(parent) = files.first().and_then(|f| f.parent()) {
        let _ = std::fs::remove_dir(parent);
    }
    let _ = audit::append(
        &engine.store().conn(),
        "system",
        "job.finish",
        &serde_json::json!({"job": id, "state": final_state, "documents": docs, "failed_files": errors.len()}),
    );
    cancel_flags().lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
}
