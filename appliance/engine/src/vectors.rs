//! Document vectors computed offline: the appliance exports a collection's chunks, the trainer embeds them with the
//! large document encoder (`care-train embed-corpus`, on a GPU), and the appliance imports the resulting embedding
//! shards (`care_formats::embeddings`) into the collection's dense index.
//!
//! - Export ids are `<chunk row id>:<first 16 hex digits of sha256(text)>`, where `text` is exactly what the
//!   online document encoder embeds ([`crate::hybrid::embedding_text`]). A chunk whose text changed, or a row id
//!   SQLite reused, no longer matches, so stale vectors are refused instead of being attached to other text.
//! - Import verifies everything before writing anything: format version, every shard's sha256 and size, width and
//!   pairing id against the active document model, vector norms, and that every id is a live chunk of the
//!   collection. Then it upserts the vectors into the active document model's dense table, one LanceDB commit per
//!   shard, and records in SQLite (with the audit record, in one transaction) which chunks' vectors came from which
//!   offline encoder.
//! - Chunks the shards do not cover keep the vectors they have (from the online encoder). Chunks ingested later are
//!   embedded by the online encoder as usual; a re-ingested document's chunks get new ids, so their imported
//!   vectors and provenance go away with the old chunks.
//! - A crash during the write phase leaves some shards written and nothing recorded; running the import again
//!   finishes it (upserts are idempotent).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use care_formats::embeddings::{self, EMBEDDINGS_FILE, EMBEDDINGS_FORMAT, EmbeddingsError, EmbeddingsIndex};
use rusqlite::params;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::hybrid::embedding_text;
use crate::models;
use crate::models::ModelRecord;
use crate::store::{ChunkRow, now};

/// How far an imported vector's L2 norm may be from 1 (f32 vectors written at a truncated width and renormalised
/// by the trainer are well inside this); accepted vectors are then renormalised exactly.
pub const NORM_TOLERANCE: f32 = 1e-3;

/// The id a chunk is exported under (see the module documentation).
pub fn export_id(chunk_id: i64, text: &str) -> String {
    let h = hex::encode(Sha256::digest(text.as_bytes()));
    format!("{chunk_id}:{}", &h[..16])
}

#[derive(Debug, Clone, Serialize)]
pub struct ChunkExport {
    pub collection: String,
    pub path: PathBuf,
    pub chunks: usize,
}

/// Progress of an import: `phase` is "verifying" (reading and checking every shard) or "writing".
#[derive(Debug, Clone, Serialize)]
pub struct ImportProgress {
    pub phase: &'static str,
    pub done: usize,
    pub total: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct VectorImport {
    pub collection: String,
    /// The offline document encoder named in `embeddings.json`.
    pub source_model: String,
    pub pairing_id: String,
    pub width: usize,
    pub document_template: String,
    pub shards: usize,
    /// Chunks whose vectors were replaced (or added).
    pub imported: usize,
    pub live_chunks: usize,
    /// Live chunks the shards do not cover; they keep their current vectors.
    pub not_covered: usize,
    /// The registered document model whose dense index received the vectors (`name@version`).
    pub document_model: String,
    /// Whether that model can embed text itself (an ONNX graph in its package): if not, chunks not covered and
    /// chunks ingested later have no dense vectors until vectors are imported for them.
    pub online_document_encoder: bool,
    pub import_id: i64,
}

/// Chunks of a dense index by where their vectors came from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VectorSources {
    /// Offline encoder (`model` of the imported shards) → chunks whose current vector it computed.
    pub imported: Vec<(String, usize)>,
    /// Live chunks whose vector (if any) came from the registered document model's own encoder.
    pub online: usize,
}

fn shard_err(dir: &Path, e: EmbeddingsError) -> Error {
    match e {
        EmbeddingsError::Io { path, source } => Error::Io { path, source },
        EmbeddingsError::Invalid { path, message } => {
            Error::CorruptShards { path: if path.as_os_str().is_empty() { dir.to_path_buf() } else { path }, message }
        }
    }
}

/// A collection's chunks as the offline document encoder sees them, and the vectors its dense index holds.
#[derive(Clone, Copy)]
pub struct Vectors<'e> {
    pub(crate) r: crate::hybrid::Retrieval<'e>,
}

impl Vectors<'_> {
    /// The live chunks of a collection with their export ids, in chunk-id order.
    fn live_chunks_of(&self, collection: &str) -> Result<Vec<(ChunkRow, String)>> {
        let mut out = Vec::new();
        self.r.store.for_each_live_chunk(|r| {
            if r.collection == collection {
                let id = export_id(r.chunk_id, &embedding_text(&r));
                out.push((r, id));
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Writes every live chunk of `collection` to `out` as JSONL `{"id", "text"}` (the layout the trainer's
    /// `embed-corpus` reads; no title field, so it embeds exactly `text`). Written to a temporary file and renamed.
    #[cfg(test)]
    pub(crate) fn export_chunks(&self, collection: &str, out: &Path) -> Result<ChunkExport> {
        self.export_chunks_for(collection, out, None)
    }

    /// Live chunks of `collection` that document model `model` (`name@version`, default: the live one) has no
    /// vector for: what an offline document model still needs imported.
    pub fn pending_vectors(&self, collection: &str, model: Option<&str>) -> Result<(ModelRecord, Vec<i64>)> {
        let col = self.r.store.collection(collection)?;
        let doc = self.document_model(model, || {
            Error::InvalidInput("当前没有在用的模型对；请用 --model 指定文档编码器".into())
        })?;
        let missing = self.r.missing_vectors(&col, &doc)?;
        Ok((doc, missing))
    }

    /// The document model named `spec` (`name@version`), else the live pair's; `no_live` when there is neither.
    pub(crate) fn document_model(&self, spec: Option<&str>, no_live: impl FnOnce() -> Error) -> Result<ModelRecord> {
        match spec {
            Some(spec) => models::find(&self.r.store, spec),
            None => Ok(models::active(&self.r.store)?.ok_or_else(no_live)?.document),
        }
    }

    /// [`Engine::export_chunks`], only the chunks still pending for document model `pending_for` when given.
    pub(crate) fn export_chunks_for(
        &self,
        collection: &str,
        out: &Path,
        pending_for: Option<&str>,
    ) -> Result<ChunkExport> {
        self.r.store.collection(collection)?;
        let only: Option<std::collections::HashSet<i64>> = match pending_for {
            Some(m) => Some(self.pending_vectors(collection, Some(m))?.1.into_iter().collect()),
            None => None,
        };
        let mut n = 0;
        let name = out.file_name().ok_or_else(|| Error::InvalidInput(format!("{} 不是文件路径", out.display())))?;
        let tmp = out.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
        let res = (|| -> Result<()> {
            let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
            let mut w = std::io::BufWriter::new(f);
            self.r.store.for_each_live_chunk(|r| {
                if r.collection == collection && only.as_ref().is_none_or(|o| o.contains(&r.chunk_id)) {
                    let text = embedding_text(&r);
                    let line = serde_json::json!({"id": export_id(r.chunk_id, &text), "text": text});
                    serde_json::to_writer(&mut w, &line).map_err(|e| Error::Internal(format!("writing JSON: {e}")))?;
                    w.write_all(b"\n").map_err(|e| Error::io(&tmp, e))?;
                    n += 1;
                }
                Ok(())
            })?;
            let f = w.into_inner().map_err(|e| Error::io(&tmp, e.into_error()))?;
            f.sync_all().map_err(|e| Error::io(&tmp, e))?;
            if n == 0 && only.is_some() {
                return Err(Error::InvalidInput(format!("资料库「{collection}」没有等待该模型向量的文本块，无需导出")));
            }
            if n == 0 {
                return Err(Error::InvalidInput(format!("资料库 {collection} 还没有可导出的片段；请先上传文档")));
            }
            std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e))
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res?;
        Ok(ChunkExport { collection: collection.to_string(), path: out.to_path_buf(), chunks: n })
    }

    /// Every vector in a collection's dense index of the active document model, by chunk id (loads the table).
    pub fn dense_vectors(&self, collection: &str) -> Result<Vec<(i64, Vec<f32>)>> {
        let col = self.r.store.collection(collection)?;
        let Some(pair) = models::active(&self.r.store)? else { return Ok(Vec::new()) };
        let mut v = self.dense_vectors_of(col.id, &pair.document)?;
        v.sort_by_key(|p| p.0);
        Ok(v)
    }

    /// Every vector in the dense index of (collection, document model), by chunk id, in table order; none when
    /// that index does not exist.
    pub(crate) fn dense_vectors_of(&self, collection_id: i64, model: &ModelRecord) -> Result<Vec<(i64, Vec<f32>)>> {
        match self.r.dense_table(collection_id, model, false)? {
            Some((_, table)) => self.r.dense.vectors(&table),
            None => Ok(Vec::new()),
        }
    }

    /// Where the current vectors of a collection's dense index (active document model) came from.
    #[cfg(test)]
    pub(crate) fn vector_sources(&self, collection: &str) -> Result<VectorSources> {
        let col = self.r.store.collection(collection)?;
        let live = self.live_chunks_of(collection)?.len();
        let Some(pair) = models::active(&self.r.store)? else {
            return Ok(VectorSources { imported: Vec::new(), online: live });
        };
        let conn = self.r.store.reader();
        let mut stmt = conn.prepare(
            "SELECT i.source_model, COUNT(*) FROM dense_vector_sources s
               JOIN dense_imports i ON i.id = s.import_id
               JOIN dense_indexes x ON x.id = s.dense_index_id
             WHERE x.collection_id = ?1 AND x.model_id = ?2
             GROUP BY i.source_model ORDER BY i.source_model",
        )?;
        let rows = stmt.query_map(params![col.id, pair.document.id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as usize))
        })?;
        let imported: Vec<(String, usize)> = rows.collect::<Result<_, _>>()?;
        let n: usize = imported.iter().map(|p| p.1).sum();
        Ok(VectorSources { imported, online: live.saturating_sub(n) })
    }
}

/// Whether a model package can embed text in the appliance (it ships an ONNX graph), as opposed to a document
/// encoder that only runs offline in the trainer.
pub fn has_online_encoder(package_dir: &Path) -> bool {
    package_dir.join("model.onnx").exists()
}

impl crate::engine::Models<'_> {
    /// Vectors computed offline (a folder written by `care-train embed-corpus`) imported into the tables of document model `model` (`name@version`), live or not: an
    /// offline document model gets its vectors this way before it can go live.
    pub fn import_vectors(
        &self,
        collection: &str,
        dir: &Path,
        model: Option<&str>,
        actor: &crate::accounts::Admin,
        progress: &mut dyn FnMut(ImportProgress),
    ) -> Result<VectorImport> {
        let actor = actor.name.as_str();
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let col = self.store.collection(collection)?;
        let doc = self.vectors().document_model(model, || {
            Error::Model(
                "no active model: imported vectors go into the active document model's dense index; \
                             import or activate a model first (`care model import-e5s1`, `care model activate`), or \
                             name the document model with --model"
                    .into(),
            )
        })?;
        if !matches!(doc.role.as_str(), "document" | "both") {
            return Err(Error::ModelMismatch(format!("模型 {}@{} 不是文档编码器", doc.name, doc.version)));
        }
        let doc = &doc;

        // 1. The index file: format version, identity, sizes, file names.
        let index_path = dir.join(EMBEDDINGS_FILE);
        let bytes = match std::fs::read(&index_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound {
                    what: format!(
                        "{} (write the folder with `care-train embed-corpus --out DIR`)",
                        index_path.display()
                    ),
                });
            }
            Err(e) => return Err(Error::io(&index_path, e)),
        };
        let index_sha256 = hex::encode(Sha256::digest(&bytes));
        let format = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| v["format"].as_u64());
        if let Some(found) = format.filter(|f| *f > EMBEDDINGS_FORMAT as u64) {
            return Err(Error::TooNew {
                what: index_path.display().to_string(),
                found: found as u32,
                supported: EMBEDDINGS_FORMAT,
            });
        }
        let idx: EmbeddingsIndex = embeddings::read_index(dir).map_err(|e| shard_err(dir, e))?;
        let corrupt = |message: String| Error::CorruptShards { path: index_path.clone(), message };
        if idx.format != EMBEDDINGS_FORMAT {
            return Err(corrupt(format!(
                "format {} is not an embeddings format this build reads ({EMBEDDINGS_FORMAT})",
                idx.format
            )));
        }
        if idx.pairing_id != doc.pairing_id {
            return Err(Error::ModelMismatch(format!(
                "{}：这些向量由 {} 为配对 {:?} 计算，而在用的文档模型 {}@{} 的配对为 {:?}，在用的查询编码器不是与它们\
                 一起训练的；请用 `care-train embed-corpus --pairing-id {}` 重新计算，或先启用配对为 {:?} 的一组模型",
                index_path.display(),
                idx.model,
                idx.pairing_id,
                doc.name,
                doc.version,
                doc.pairing_id,
                doc.pairing_id,
                idx.pairing_id
            )));
        }
        if idx.width != doc.width {
            return Err(Error::ModelMismatch(format!(
                "{}：这些向量的维度为 {}，而在用的模型 {}@{} 的向量维度为 {}；请用 `care-train embed-corpus --width {}` \
                 重新计算",
                index_path.display(),
                idx.width,
                doc.name,
                doc.version,
                doc.width,
                doc.width
            )));
        }
        if idx.shards.is_empty() {
            return Err(corrupt("lists no shards".into()));
        }
        let listed: usize = idx.shards.iter().map(|s| s.rows).sum();
        if listed != idx.rows {
            return Err(corrupt(format!("says {} rows but its shards hold {listed}", idx.rows)));
        }
        for s in &idx.shards {
            for f in [&s.vectors, &s.ids] {
                let plain = Path::new(f).file_name().is_some_and(|n| n == f.as_str());
                if !plain || f.starts_with('.') {
                    return Err(corrupt(format!("shard file name {f:?} is not a plain file name in this folder")));
                }
            }
        }

        // 2. Every shard: checksum and size (read_shard), then ids and norms.
        let live = self.vectors().live_chunks_of(collection)?;
        let by_id: HashMap<&str, (i64, i64)> =
            live.iter().map(|(r, id)| (id.as_str(), (r.chunk_id, r.document_id))).collect();
        let total = idx.rows;
        let mut seen: HashMap<String, (usize, usize)> = HashMap::with_capacity(total);
        let mut unknown: Vec<String> = Vec::new();
        let mut unknown_count = 0;
        let mut done = 0;
        progress(ImportProgress { phase: "verifying", done, total });
        for (k, shard) in idx.shards.iter().enumerate() {
            let (ids, data) = embeddings::read_shard(dir, &idx, shard).map_err(|e| shard_err(dir, e))?;
            let ids_path = dir.join(&shard.ids);
            for (row, (id, v)) in ids.iter().zip(data.chunks_exact(idx.width)).enumerate() {
                if let Some((k0, r0)) = seen.insert(id.clone(), (k, row)) {
                    return Err(Error::MalformedRecord {
                        path: ids_path,
                        line: row + 1,
                        message: format!("id {id:?} appears again (first in {} line {})", idx.shards[k0].ids, r0 + 1),
                    });
                }
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if !norm.is_finite() || (norm - 1.0).abs() > NORM_TOLERANCE {
                    return Err(Error::MalformedRecord {
                        path: ids_path,
                        line: row + 1,
                        message: format!(
                            "the vector of {id:?} (row {row} of {}) has L2 norm {norm}; vectors must be L2-normalised at \
                             width {} (embed-corpus writes them so)",
                            shard.vectors, idx.width
                        ),
                    });
                }
                if !by_id.contains_key(id.as_str()) {
                    unknown_count += 1;
                    if unknown.len() < 5 {
                        unknown.push(format!("{id:?}"));
                    }
                }
            }
            done += ids.len();
            progress(ImportProgress { phase: "verifying", done, total });
        }
        if unknown_count > 0 {
            return Err(Error::UnknownChunks {
                path: dir.to_path_buf(),
                collection: collection.to_string(),
                count: unknown_count,
                total,
                first: unknown.join(", "),
            });
        }
        drop(seen);

        // 3. Write: one LanceDB commit per shard. The shard is re-read and its checksum checked again, so bytes that
        // changed since step 2 are refused rather than written.
        let (pairing, table) = self
            .retrieval()
            .dense_table(col.id, doc, true)?
            .ok_or_else(|| Error::Internal(format!("no dense index for collection '{collection}'")))?;
        if pairing != idx.pairing_id {
            return Err(Error::ModelMismatch(format!(
                "资料库「{collection}」的向量索引为配对 {pairing:?} 建立，而这些向量属于配对 {:?}",
                idx.pairing_id
            )));
        }
        let mut chunk_ids: Vec<i64> = Vec::with_capacity(total);
        let mut done = 0;
        progress(ImportProgress { phase: "writing", done, total });
        for shard in &idx.shards {
            let (ids, data) = embeddings::read_shard(dir, &idx, shard).map_err(|e| shard_err(dir, e))?;
            let mut rows = Vec::with_capacity(ids.len());
            for (id, v) in ids.iter().zip(data.chunks_exact(idx.width)) {
                let &(chunk_id, document_id) = by_id
                    .get(id.as_str())
                    .ok_or_else(|| Error::Internal(format!("{id:?} vanished between verification and writing")))?;
                let mut v = v.to_vec();
                crate::encoders::l2_normalize(&mut v);
                rows.push((chunk_id, document_id, v));
                chunk_ids.push(chunk_id);
            }
            self.dense.upsert_chunks(&table, &rows)?;
            done += ids.len();
            progress(ImportProgress { phase: "writing", done, total });
        }
        if self.dense.count(&table)? > self.cfg.search.ann_threshold {
            self.dense.build_ann(&table)?;
        }

        // 4. Provenance and audit, in one transaction.
        let source_model = idx.model.clone();
        let import_id = {
            let mut conn = self.store.conn();
            let tx = conn.transaction()?;
            let dense_index_id: i64 = tx.query_row(
                "SELECT id FROM dense_indexes WHERE collection_id = ?1 AND model_id = ?2",
                params![col.id, doc.id],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO dense_imports (dense_index_id, source_model, pairing_id, width, document_template, rows, index_sha256, imported_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    dense_index_id,
                    source_model,
                    idx.pairing_id,
                    idx.width as i64,
                    idx.document_template,
                    idx.rows as i64,
                    index_sha256,
                    now()
                ],
            )?;
            let import_id = tx.last_insert_rowid();
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO dense_vector_sources (dense_index_id, chunk_id, import_id) VALUES (?1, ?2, ?3)
                     ON CONFLICT (dense_index_id, chunk_id) DO UPDATE SET import_id = excluded.import_id",
                )?;
                for c in &chunk_ids {
                    stmt.execute(params![dense_index_id, c, import_id])?;
                }
            }
            // Imports whose every vector has since been replaced say nothing any more.
            tx.execute(
                "DELETE FROM dense_imports WHERE dense_index_id = ?1 AND id != ?2
                   AND NOT EXISTS (SELECT 1 FROM dense_vector_sources s WHERE s.import_id = dense_imports.id)",
                params![dense_index_id, import_id],
            )?;
            crate::audit::append(
                &tx,
                actor,
                "collection.import_vectors",
                &serde_json::json!({
                    "collection": collection,
                    "from": dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()).display().to_string(),
                    "source_model": source_model,
                    "pairing_id": idx.pairing_id,
                    "width": idx.width,
                    "rows": idx.rows,
                    "index_sha256": index_sha256,
                    "document_model": format!("{}@{}", doc.name, doc.version),
                    "not_covered": live.len() - chunk_ids.len(),
                }),
            )?;
            tx.commit()?;
            import_id
        };
        let covered: HashSet<i64> = chunk_ids.iter().copied().collect();
        Ok(VectorImport {
            collection: collection.to_string(),
            source_model,
            pairing_id: idx.pairing_id,
            width: idx.width,
            document_template: idx.document_template,
            shards: idx.shards.len(),
            imported: covered.len(),
            live_chunks: live.len(),
            not_covered: live.len() - covered.len(),
            document_model: format!("{}@{}", doc.name, doc.version),
            online_document_encoder: has_online_encoder(&doc.dir),
            import_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_ids_change_with_the_text() {
        let a = export_id(7, "二甲双胍");
        assert_eq!(a, export_id(7, "二甲双胍"));
        assert!(a.starts_with("7:") && a.len() == 2 + 16, "{a}");
        assert_ne!(a, export_id(7, "二甲双胍。"));
        assert_ne!(a, export_id(8, "二甲双胍"));
    }
}
