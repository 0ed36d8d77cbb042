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

use std::io::Write;
use std::path::{Path, PathBuf};

use care_formats::embeddings::EmbeddingsError;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::hybrid::embedding_text;
use crate::models;
use crate::models::ModelRecord;
use crate::store::ChunkRow;

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

pub(crate) fn shard_err(dir: &Path, e: EmbeddingsError) -> Error {
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
    pub(crate) fn live_chunks_of(&self, collection: &str) -> Result<Vec<(ChunkRow, String)>> {
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

    /// [`Vectors::export_chunks`], only the chunks still pending for document model `pending_for` when given.
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
        let rows = stmt.query_map(rusqlite::params![col.id, pair.document.id], |r| {
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
