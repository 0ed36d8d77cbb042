//! The model handle's operations on document vectors: the export an offline encoder reads, and its vectors imported.

use crate::error::{Error, Result};
use crate::store::now;
use crate::vectors::*;
use care_formats::embeddings::{self, EMBEDDINGS_FILE, EMBEDDINGS_FORMAT, EmbeddingsIndex};
use rusqlite::params;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::path::Path;

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
        let _w = self.engine.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let col = self.engine.store.collection(collection)?;
        let doc = self.engine.vectors().document_model(model, || {
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
        let live = self.engine.vectors().live_chunks_of(collection)?;
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
            .engine
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
            self.engine.dense.upsert_chunks(&table, &rows)?;
            done += ids.len();
            progress(ImportProgress { phase: "writing", done, total });
        }
        if self.engine.dense.count(&table)? > self.engine.cfg.search.ann_threshold {
            self.engine.dense.build_ann(&table)?;
        }

        // 4. Provenance and audit, in one transaction.
        let source_model = idx.model.clone();
        let import_id = {
            let mut conn = self.engine.store.conn();
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
