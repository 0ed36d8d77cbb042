//! Uploads for the admin console and API: the one part of an operation that is HTTP's own (a multipart stream).
//!
//! Each multipart `file` part is streamed to a fresh folder the engine hands out under `<data_dir>/uploads/`
//! (names sanitised, total size capped by `server.max_upload_mib`; the disk writes run on the blocking pool), then
//! the engine's `submit_upload_as` queues an ingest job that owns the files: its worker runs it, resumes it after
//! a restart, records per-file errors and deletes the files when the job ends.

use std::io::Write;
use std::path::{Path, PathBuf};

use actix_web::web;
use futures::StreamExt;

use crate::AppState;
use crate::call::call_admin;
use crate::errors::ApiError;
use crate::guard::Caller;

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

/// An upload's folder, removed when this is dropped unless a queued job took it over. actix drops a handler's
/// future when the client goes away mid-upload, so code after an `.await` is not enough to clean up.
struct Staging {
    dir: PathBuf,
    kept: bool,
}

impl Staging {
    fn new(dir: PathBuf) -> Self {
        Staging { dir, kept: false }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.kept {
            let d = std::mem::take(&mut self.dir);
            // Off the async runtime: removing a large upload takes a while.
            std::thread::spawn(move || {
                let _ = std::fs::remove_dir_all(d);
            });
        }
    }
}

/// Bytes gathered before one write to disk on the blocking pool.
const WRITE_BUFFER: usize = 1 << 20;

/// Streams the multipart `file` parts to disk and queues an ingest job. Returns the job id.
pub async fn upload(
    state: &web::Data<AppState>,
    caller: &Caller,
    collection: &str,
    payload: actix_multipart::Multipart,
) -> Result<i64, ApiError> {
    let col = collection.to_string();
    let mut staging = Staging::new(call_admin(state, caller, move |e, a| e.ingest().new_upload(a, &col)).await?);
    let limit = upload_limit(state, state.settings.server.max_upload_mib.saturating_mul(1 << 20));
    let queued = match receive_with(
        payload,
        &staging.dir,
        limit,
        &["department", "doc_type", "date", "issuer", "language", "access"],
    )
    .await
    {
        Ok((files, fields)) => {
            let field = |k: &str| fields.get(k).cloned().unwrap_or_default();
            // The form's filing, for the documents that do not say their own.
            let form = care_engine::ingest::meta::DocMeta {
                department: field("department"),
                doc_type: field("doc_type"),
                date: field("date"),
                issuer: field("issuer"),
                language: field("language"),
                access: field("access"),
            };
            match form.checked() {
                Ok(meta) => {
                    let col = collection.to_string();
                    call_admin(state, caller, move |e, a| e.ingest().submit_upload(a, &col, files, meta)).await
                }
                Err(m) => Err(ApiError::invalid(m.to_string())),
            }
        }
        Err(e) => Err(e),
    };
    // A queued job owns the folder; anything else leaves nothing behind.
    staging.kept = queued.is_ok();
    queued
}

/// Streams one file, a new version of the document `external_id`, and queues its ingest job. Returns the job id.
pub async fn replace(
    state: &web::Data<AppState>,
    caller: &Caller,
    collection: &str,
    external_id: &str,
    payload: actix_multipart::Multipart,
) -> Result<i64, ApiError> {
    let col = collection.to_string();
    let mut staging = Staging::new(call_admin(state, caller, move |e, a| e.ingest().new_upload(a, &col)).await?);
    let limit = upload_limit(state, state.settings.server.max_upload_mib.saturating_mul(1 << 20));
    let queued = match receive(payload, &staging.dir, limit).await {
        Ok(files) => {
            let (col, id) = (collection.to_string(), external_id.to_string());
            call_admin(state, caller, move |e, a| e.ingest().submit_replacement(a, &col, &id, files)).await
        }
        Err(e) => Err(e),
    };
    staging.kept = queued.is_ok();
    queued
}

/// Streams the multipart `file` parts of a model package (manifest.toml, model.onnx, tokenizer.json, …) to a
/// fresh folder and imports it; the folder is removed afterwards, whatever the outcome.
pub async fn import_model(
    state: &web::Data<AppState>,
    caller: &Caller,
    payload: actix_multipart::Multipart,
) -> Result<care_engine::lifecycle::ImportReport, ApiError> {
    let staging = Staging::new(call_admin(state, caller, |e, a| e.ingest().new_staging_upload(a)).await?);
    let limit = upload_limit(state, state.settings.server.max_upload_mib.saturating_mul(1 << 20));
    match receive(payload, &staging.dir, limit).await {
        Ok(_) => {
            let d = staging.dir.clone();
            call_admin(state, caller, move |e, a| e.models().import(a, &d)).await
        }
        Err(e) => Err(e),
    }
}

/// Streams an uploaded judgment set and imports it: a CSV file (`query,document or passage id,grade`), or BEIR's
/// `queries.jsonl` with one qrels `.tsv`. The folder is removed afterwards, whatever the outcome.
/// Imports an uploaded judgment set. `target` names the collection and the set (from the API's path); `None` reads
/// them from the form's `collection` and `name` fields (the console's form).
pub async fn import_judgments(
    state: &web::Data<AppState>,
    caller: &Caller,
    target: Option<(&str, &str)>,
    payload: actix_multipart::Multipart,
) -> Result<care_engine::judgments::JudgmentSetInfo, ApiError> {
    let staging = Staging::new(call_admin(state, caller, |e, a| e.ingest().new_staging_upload(a)).await?);
    let dir = staging.dir.clone();
    let limit = upload_limit(state, state.settings.server.max_upload_mib.saturating_mul(1 << 20));
    match receive_with(payload, &dir, limit, &["collection", "name"]).await {
        Ok((files, fields)) => {
            let field = |k: &str| fields.get(k).cloned().unwrap_or_default();
            let (col, set) = match target {
                Some((c, s)) => (c.to_string(), s.to_string()),
                None => (field("collection"), field("name")),
            };
            let d = dir.clone();
            call_admin(state, caller, move |e, a| {
                use care_engine::judgments::JudgmentSource;
                let is = |f: &PathBuf, ext: &str| f.extension().is_some_and(|x| x.eq_ignore_ascii_case(ext));
                if files.iter().any(|f| f.file_name().is_some_and(|n| n == "queries.jsonl")) {
                    // BEIR layout: queries.jsonl beside qrels/<split>.tsv.
                    let tsv = files.iter().find(|f| is(f, "tsv")).ok_or_else(|| {
                        care_engine::Error::InvalidInput("BEIR 评测集需要一个 qrels .tsv 文件 (queries.jsonl needs a qrels .tsv file beside it)".into())
                    })?;
                    let qrels = d.join("qrels");
                    std::fs::create_dir_all(&qrels).map_err(|e| care_engine::Error::io(&qrels, e))?;
                    std::fs::rename(tsv, qrels.join("upload.tsv")).map_err(|e| care_engine::Error::io(tsv, e))?;
                    e.models().import_judgments(a, &col, &set, JudgmentSource::Beir { dir: &d, split: "upload" })
                } else {
                    let csv = files.iter().find(|f| is(f, "csv")).ok_or_else(|| {
                        care_engine::Error::InvalidInput("请上传 CSV 文件，或 BEIR 的 queries.jsonl 与 qrels .tsv (upload a .csv, or queries.jsonl with a qrels .tsv)".into())
                    })?;
                    e.models().import_judgments(a, &col, &set, JudgmentSource::Csv(csv))
                }
            })
            .await
        }
        Err(e) => Err(e),
    }
}

/// Writes every `file` part into `dir`; returns the paths written.
async fn receive(payload: actix_multipart::Multipart, dir: &Path, limit: Limit) -> Result<Vec<PathBuf>, ApiError> {
    Ok(receive_with(payload, dir, limit, &[]).await?.0)
}

/// What an upload may write: at most `bytes` in all, and never into the space `[training] keep_free_gb` keeps
/// free (`reserve` bytes): each buffer is checked against the disk's free space before it is written, so a large
/// upload is refused as `disk_full` at the reserve instead of filling the disk that SQLite and the indexes need.
#[derive(Debug, Clone, Copy)]
struct Limit {
    bytes: u64,
    reserve: u64,
}

fn upload_limit(state: &AppState, bytes: u64) -> Limit {
    Limit { bytes, reserve: state.engine.config().disk_reserve_bytes() }
}

/// Longest text field a form may send beside its files (a collection or set name).
const MAX_FIELD_BYTES: usize = 256;

/// Like [`receive`], and also returns the text fields named in `wanted` (each at most [`MAX_FIELD_BYTES`]).
async fn receive_with(
    mut payload: actix_multipart::Multipart,
    dir: &Path,
    limit: Limit,
    wanted: &[&str],
) -> Result<(Vec<PathBuf>, std::collections::HashMap<String, String>), ApiError> {
    let Limit { bytes: limit, reserve } = limit;
    let mut files: Vec<PathBuf> = Vec::new();
    let mut fields = std::collections::HashMap::new();
    let mut taken = std::collections::HashSet::new();
    let mut total: u64 = 0;
    while let Some(field) = payload.next().await {
        let mut field = field.map_err(|e| ApiError::invalid(format!("读取上传内容时出错：{e}")))?;
        if let Some(name) = field.name().filter(|n| wanted.contains(n)).map(str::to_string) {
            let mut value = Vec::new();
            while let Some(chunk) = field.next().await {
                value.extend_from_slice(&chunk.map_err(|e| ApiError::invalid(format!("读取上传内容时出错：{e}")))?);
                if value.len() > MAX_FIELD_BYTES {
                    return Err(ApiError::invalid(format!(
                        "表单字段 {name} 过长 (field {name} exceeds {MAX_FIELD_BYTES} bytes)"
                    )));
                }
            }
            fields.insert(name, String::from_utf8_lossy(&value).trim().to_string());
            continue;
        }
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
        let mut buf = Vec::with_capacity(WRITE_BUFFER);
        let mut first = true;
        while let Some(chunk) = field.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("读取上传内容时出错：{e}")))?;
            total += chunk.len() as u64;
            if total > limit {
                return Err(ApiError::Engine(care_engine::Error::TooLarge {
                    what: "the upload".into(),
                    size: total,
                    limit,
                    hint: "upload fewer files at once or raise server.max_upload_mib".into(),
                }));
            }
            buf.extend_from_slice(&chunk);
            if buf.len() >= WRITE_BUFFER {
                buf = write_part(&path, buf, first, reserve).await?;
                first = false;
            }
        }
        write_part(&path, buf, first, reserve).await?;
        files.push(path);
    }
    if files.is_empty() {
        return Err(ApiError::invalid("上传中没有文件；请至少选择一个文件"));
    }
    Ok((files, fields))
}

/// Appends `buf` to `path` (creating it when `create`) on the blocking pool, unless it would leave less than
/// `reserve` bytes free; hands the emptied buffer back.
async fn write_part(path: &Path, mut buf: Vec<u8>, create: bool, reserve: u64) -> Result<Vec<u8>, ApiError> {
    let p = path.to_path_buf();
    web::block(move || {
        if let Ok((_, available)) = care_engine::datadir::free_bytes(&p)
            && available < reserve.saturating_add(buf.len() as u64)
        {
            return Err(care_engine::Error::NoSpace {
                what: "上传文件".into(),
                needed: buf.len() as u64,
                available,
                reserve,
            });
        }
        let io = |e| care_engine::Error::io(&p, e);
        let mut f = std::fs::OpenOptions::new().create(true).append(true).truncate(false).open(&p).map_err(io)?;
        if create {
            f.set_len(0).map_err(io)?;
        }
        f.write_all(&buf).map_err(|e| care_engine::Error::io(&p, e))?;
        buf.clear();
        Ok::<_, care_engine::Error>(buf)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(ApiError::Engine)
}

/// A request body read into memory, refused past `limit` bytes (by its declared length first, then while reading).
pub async fn read_body(mut payload: web::Payload, limit: usize, what: &str) -> Result<Vec<u8>, ApiError> {
    let too_large = |size: usize| {
        ApiError::Engine(care_engine::Error::TooLarge {
            what: what.to_string(),
            size: size as u64,
            limit: limit as u64,
            hint: "请拆分后分批提交".into(),
        })
    };
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("读取请求内容失败 (reading the body: {e})")))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large(body.len() + chunk.len()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The console's synonym CSV upload: one `file` part and an optional `replace` field.
pub async fn import_synonyms(
    state: &web::Data<AppState>,
    caller: &Caller,
    payload: actix_multipart::Multipart,
) -> Result<care_engine::synonyms::ImportReport, ApiError> {
    let staging = Staging::new(call_admin(state, caller, |e, a| e.ingest().new_staging_upload(a)).await?);
    let limit = upload_limit(state, care_engine::synonyms::MAX_CSV_BYTES as u64 + 4096);
    match receive_with(payload, &staging.dir, limit, &["replace"]).await {
        Ok((files, fields)) => {
            let replace = fields.get("replace").is_some_and(|v| v == "1" || v == "on" || v == "true");
            match files.first() {
                None => Err(ApiError::invalid("请选择一个 CSV 文件".to_string())),
                Some(f) => {
                    let f = f.clone();
                    call_admin(state, caller, move |e, a| {
                        let bytes = std::fs::read(&f).map_err(|err| care_engine::Error::io(&f, err))?;
                        e.search().import_synonyms(a, &bytes, replace)
                    })
                    .await
                }
            }
        }
        Err(e) => Err(e),
    }
}
