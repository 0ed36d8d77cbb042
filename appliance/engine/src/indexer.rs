//! The write side of one data directory: its SQLite store and its indexes, kept in agreement.
//!
//! Write protocol (what makes `kill -9` safe): for each batch, documents and chunks are first committed to SQLite
//! with state `pending`; then the lexical index replaces those documents' chunks and commits; then their vectors
//! are written to the active document model's dense table; then the rows are marked `indexed`. Deletions mark
//! rows `deleting`, remove them from the index, then delete the rows. On open, [`Indexer::recover`] replays
//! whatever a crash interrupted (re-indexing pending documents and finishing deletions are both idempotent), and
//! if the index's chunk count still disagrees with SQLite it rebuilds the index from SQLite, which is the source
//! of truth.

use std::path::PathBuf;

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::ingest::{IngestOptions, ParsedDocument};
use crate::store::{Collection, CollectionStats, now};
use crate::text::{Chars, Chunk, Tokens, chunk_measured};

/// How documents are cut into chunks right now: by the active query encoder's tokens, or by characters.
#[derive(Clone)]
pub struct Chunker {
    /// Recorded with every document ("chars:400/80", "tokens:e5-small@1:300/60").
    pub id: String,
    tokenizer: Option<std::sync::Arc<tokenizers::Tokenizer>>,
    max: usize,
    overlap: usize,
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunker").field("id", &self.id).finish()
    }
}

impl Chunker {
    pub fn chunk(&self, text: &str) -> Vec<Chunk> {
        match &self.tokenizer {
            Some(t) => chunk_measured(text, self.max, self.overlap, &Tokens(t)),
            None => chunk_measured(text, self.max.max(16), self.overlap, &Chars),
        }
    }
    /// The length of `text` in this chunker's units.
    pub fn measure(&self, text: &str) -> usize {
        use crate::text::Measure;
        match &self.tokenizer {
            Some(t) => Tokens(t).len(text),
            None => text.chars().count(),
        }
    }
}

/// A new or changed document of an ingest batch, chunked before the write transaction.
struct Planned<'d> {
    doc: &'d ParsedDocument,
    hash: String,
    chunks: Vec<Chunk>,
}

/// Inserts or updates a planned document as 'pending' (dropping its old chunks). `None` when the stored copy
/// already matches: another batch wrote the same content after this one was planned.
fn upsert_document(
    tx: &rusqlite::Transaction<'_>,
    collection_id: i64,
    p: &Planned<'_>,
    chunker_id: &str,
    ts: &str,
    fr: &mut FileReport,
) -> Result<Option<i64>> {
    let d = p.doc;
    let existing: Option<(i64, String, String)> = tx
        .prepare_cached(
            "SELECT id, content_hash, chunker FROM documents WHERE collection_id = ?1 AND external_id = ?2",
        )?
        .query_row(params![collection_id, d.external_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    // A language the file does not give is read from the text (a stored one, perhaps an admin's, is kept).
    let detected = crate::ingest::meta::detect_language(&d.text);
    Ok(Some(match existing {
        Some((_, h, c)) if h == p.hash && c == chunker_id => {
            fr.unchanged += 1;
            return Ok(None);
        }
        Some((id, _, _)) => {
            tx.prepare_cached(
                "UPDATE documents SET title = ?2, source = ?3, content_hash = ?4, state = 'pending', chunker = ?5,
                 department = CASE WHEN ?6 != '' THEN ?6 ELSE department END,
                 doc_type = CASE WHEN ?7 != '' THEN ?7 ELSE doc_type END,
                 doc_date = CASE WHEN ?8 != '' THEN ?8 ELSE doc_date END,
                 issuer = CASE WHEN ?9 != '' THEN ?9 ELSE issuer END,
                 language = CASE WHEN ?10 != '' THEN ?10 WHEN language != '' THEN language ELSE ?11 END,
                 access = CASE WHEN ?12 != '' THEN ?12 ELSE access END
                 WHERE id = ?1",
            )?
            .execute(params![
                id,
                d.title,
                d.source,
                p.hash,
                chunker_id,
                d.meta.department,
                d.meta.doc_type,
                d.meta.date,
                d.meta.issuer,
                d.meta.language,
                detected,
                d.meta.access
            ])?;
            tx.prepare_cached("DELETE FROM chunks WHERE document_id = ?1")?.execute([id])?;
            fr.replaced += 1;
            id
        }
        None => {
            tx.prepare_cached(
                "INSERT INTO documents (collection_id, external_id, title, source, content_hash, state, created_at, chunker,
                                        department, doc_type, doc_date, issuer, language, access)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                collection_id,
                d.external_id,
                d.title,
                d.source,
                p.hash,
                ts,
                chunker_id,
                d.meta.department,
                d.meta.doc_type,
                d.meta.date,
                d.meta.issuer,
                if d.meta.language.is_empty() { detected } else { d.meta.language.as_str() },
                d.meta.access
            ])?;
            fr.added += 1;
            tx.last_insert_rowid()
        }
    }))
}

/// What happened to one input file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileReport {
    pub path: PathBuf,
    pub added: usize,
    pub replaced: usize,
    pub unchanged: usize,
    pub skipped_empty: usize,
    pub chunks: usize,
    /// Set when the file was rejected; nothing from it was stored.
    pub error: Option<String>,
    pub error_code: Option<&'static str>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestReport {
    pub files: Vec<FileReport>,
}

impl IngestReport {
    pub fn failed(&self) -> usize {
        self.files.iter().filter(|f| f.error.is_some()).count()
    }
    pub fn documents_written(&self) -> usize {
        self.files.iter().map(|f| f.added + f.replaced).sum()
    }
}

/// Progress of an ingest, reported after every batch.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IngestProgress {
    pub files_done: usize,
    pub files_total: usize,
    pub documents_done: usize,
    pub documents_in_file: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    pub reindexed_documents: usize,
    pub finished_deletions: usize,
    pub rebuilt: bool,
    /// Chunks embedded or removed to bring dense indexes back in line with SQLite.
    pub dense_repaired: usize,
    /// Another live process holds the lexical index's writer: what looked unfinished is its batch in progress, so
    /// nothing was repaired (a process that died released the lock with it; the next open repairs).
    pub another_writer: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConsistencyReport {
    pub consistent: bool,
    pub sqlite_chunks: usize,
    pub index_chunks: usize,
    pub missing_from_index: usize,
    pub extra_in_index: usize,
    pub duplicates_in_index: usize,
    pub pending_documents: usize,
    /// Vectors in the active document model's dense tables, and how they differ from SQLite's chunks
    /// (all zero when no model is active).
    pub dense_vectors: usize,
    pub dense_missing: usize,
    pub dense_extra: usize,
    pub dense_duplicates: usize,
    /// Chunks waiting for vectors of an offline document model (expected, not an inconsistency).
    pub dense_pending: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub schema_version: u32,
    pub documents: u64,
    pub chunks: u64,
    pub pending_documents: u64,
    pub lexical_docs: u64,
    pub collections: Vec<CollectionStats>,
}

/// The write protocol over the store and the indexes, borrowed from the engine's parts
/// ([`crate::engine::Engine::indexer`]): ingest batches, deletions, recovery after a crash, the consistency check.
#[derive(Clone, Copy)]
pub struct Indexer<'e> {
    /// The store, the indexes, the models and the settings the writes go to.
    pub(crate) retrieval: crate::hybrid::Retrieval<'e>,
    /// Serialises writes to the stores (ingest batches, deletions): the write protocol assumes one writer, while
    /// job workers parse files in parallel.
    pub(crate) write_lock: &'e std::sync::Mutex<()>,
    pub(crate) queue: crate::jobs::JobQueue<'e>,
}

impl Indexer<'_> {
    /// Brings the lexical index into agreement with SQLite after a crash, a format change or a dictionary edit.
    pub(crate) fn recover(&self) -> Result<RecoveryReport> {
        let mut report = RecoveryReport::default();
        match self.recover_lexical(&mut report) {
            // A CLI command opened beside a server that is mid-ingest: the pending rows are the server's batch.
            Err(Error::Locked { .. }) => {
                tracing::info!("another process is writing the indexes; its unfinished batch is its own");
                report.another_writer = true;
                return Ok(report);
            }
            r => r?,
        }
        report.dense_repaired = self.retrieval.sync_dense_indexes(&mut |_| Ok(()))?;
        self.retrieval.dir.remove_stale_imports();
        Ok(report)
    }

    /// The lexical part of [`Indexer::recover`]: a rebuild when needed, deletions and pending batches finished.
    fn recover_lexical(&self, report: &mut RecoveryReport) -> Result<()> {
        if self.retrieval.lexical.needs_rebuild && self.retrieval.store.live_chunk_count()? > 0 {
            self.rebuild_lexical()?;
            report.rebuilt = true;
        }
        let deleting = self.retrieval.store.documents_in_state("deleting")?;
        if !deleting.is_empty() {
            self.retrieval.lexical.delete_documents(&deleting)?;
            self.retrieval.lexical.commit()?;
            self.retrieval.store.delete_documents(&deleting)?;
            // Their vectors are removed by the dense sync below (rows no longer in SQLite).
            report.finished_deletions = deleting.len();
        }
        let pending = self.retrieval.store.documents_in_state("pending")?;
        for batch in pending.chunks(self.retrieval.cfg.ingest.batch_documents.max(1)) {
            let chunks = self.retrieval.store.chunks_of_documents(batch)?;
            self.retrieval.lexical.replace_documents(batch, &chunks)?;
            self.retrieval.lexical.commit()?;
            self.retrieval.store.set_documents_state(batch, "indexed")?;
        }
        report.reindexed_documents = pending.len();
        // Power loss can roll SQLite back past a tantivy commit; counts reveal it and a rebuild repairs it.
        if !report.rebuilt && self.retrieval.lexical.num_docs() != self.retrieval.store.live_chunk_count()? {
            self.rebuild_lexical()?;
            report.rebuilt = true;
        }
        Ok(())
    }

    /// Compares the chunk ids in SQLite with those in the lexical index, exactly.
    pub fn check(&self) -> Result<ConsistencyReport> {
        self.retrieval.lexical.reload()?;
        let mut sqlite_ids = Vec::new();
        self.retrieval.store.for_each_live_chunk(|row| {
            sqlite_ids.push(row.chunk_id);
            Ok(())
        })?;
        let mut index_ids: Vec<i64> = self.retrieval.lexical.all_ids()?.into_iter().map(|(c, _)| c).collect();
        index_ids.sort_unstable();
        let duplicates = index_ids.windows(2).filter(|w| w[0] == w[1]).count();
        index_ids.dedup();
        let sq: std::collections::HashSet<i64> = sqlite_ids.iter().copied().collect();
        let ix: std::collections::HashSet<i64> = index_ids.iter().copied().collect();
        let missing_from_index = sq.difference(&ix).count();
        let extra_in_index = ix.difference(&sq).count();
        let pending_documents = self.retrieval.store.documents_in_state("pending")?.len()
            + self.retrieval.store.documents_in_state("deleting")?.len();
        let (dense_vectors, mut dense_missing, dense_extra, dense_duplicates) = self.retrieval.check_dense(&sq)?;
        let offline = self.retrieval.active_models()?.is_some_and(|p| !p.document.online);
        let dense_pending = if offline { std::mem::take(&mut dense_missing) } else { 0 };
        Ok(ConsistencyReport {
            dense_pending,
            consistent: missing_from_index == 0
                && extra_in_index == 0
                && duplicates == 0
                && pending_documents == 0
                && dense_missing == 0
                && dense_extra == 0
                && dense_duplicates == 0,
            dense_vectors,
            dense_missing,
            dense_extra,
            dense_duplicates,
            sqlite_chunks: sqlite_ids.len(),
            index_chunks: index_ids.len() + duplicates,
            missing_from_index,
            extra_in_index,
            duplicates_in_index: duplicates,
            pending_documents,
        })
    }

    /// Re-creates the lexical index content from SQLite.
    pub(crate) fn rebuild_lexical(&self) -> Result<()> {
        self.retrieval.lexical.delete_all()?;
        let mut batch = Vec::with_capacity(4096);
        self.retrieval.store.for_each_live_chunk(|row| {
            batch.push(row);
            if batch.len() == 4096 {
                self.retrieval.lexical.replace_documents(&[], &batch)?;
                batch.clear();
            }
            Ok(())
        })?;
        self.retrieval.lexical.replace_documents(&[], &batch)?;
        self.retrieval.lexical.commit()?;
        let pending = self.retrieval.store.documents_in_state("pending")?;
        self.retrieval.store.set_documents_state(&pending, "indexed")?;
        Ok(())
    }

    /// Creates a collection owned by `owner`, recorded in the audit log with `owner` as the actor.
    pub(crate) fn create_collection(&self, name: &str, description: &str, owner: &str) -> Result<Collection> {
        crate::store::validate_collection_name(name)?;
        {
            let mut conn = self.retrieval.store.conn();
            let tx = conn.transaction()?;
            let res = tx.execute(
                "INSERT INTO collections (name, description, owner, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![name, description, owner, now()],
            );
            match res {
                Ok(_) => {}
                Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
                    return Err(Error::CollectionExists(name.into()));
                }
                Err(e) => return Err(e.into()),
            }
            crate::audit::append(
                &tx,
                owner,
                "collection.create",
                &serde_json::json!({"collection": name, "description": description, "owner": owner}),
            )?;
            tx.commit()?;
        }
        self.retrieval.store.collection(name)
    }

    /// Marks a collection as approved (or no longer approved) for training the encoders.
    pub(crate) fn set_approved_for_training(
        &self,
        collection: &str,
        approved: bool,
        actor: &str,
    ) -> Result<Collection> {
        {
            let mut conn = self.retrieval.store.conn();
            let tx = conn.transaction()?;
            let n = tx.execute(
                "UPDATE collections SET approved_for_training = ?2 WHERE name = ?1",
                params![collection, approved as i64],
            )?;
            if n == 0 {
                return Err(Error::UnknownCollection(collection.into()));
            }
            crate::audit::append(
                &tx,
                actor,
                "collection.approve",
                &serde_json::json!({"collection": collection, "approved": approved}),
            )?;
            tx.commit()?;
        }
        self.retrieval.store.collection(collection)
    }

    /// Deletes a collection everywhere: its documents from the lexical index, its dense tables, then its rows.
    /// The audit record commits with the first change, marking the documents `deleting`: from there the deletion
    /// is decided, and a crash part-way is finished by recovery (documents) or by deleting again (the empty row).
    pub(crate) fn delete_collection(&self, name: &str, actor: &str) -> Result<usize> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let col = self.retrieval.store.collection(name)?;
        let (ids, tables) = {
            let mut conn = self.retrieval.store.conn();
            let tx = conn.transaction()?;
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare("SELECT id FROM documents WHERE collection_id = ?1")?;
                let rows = stmt.query_map([col.id], |r| r.get(0))?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            let tables: Vec<String> = {
                let mut stmt = tx.prepare("SELECT table_name FROM dense_indexes WHERE collection_id = ?1")?;
                let rows = stmt.query_map([col.id], |r| r.get(0))?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            tx.execute("UPDATE documents SET state = 'deleting' WHERE collection_id = ?1", [col.id])?;
            crate::audit::append(
                &tx,
                actor,
                "collection.delete",
                &serde_json::json!({"collection": name, "documents": ids.len(), "dense_tables": tables}),
            )?;
            tx.commit()?;
            (ids, tables)
        };
        self.retrieval.lexical.delete_documents(&ids)?;
        self.retrieval.lexical.commit()?;
        for t in &tables {
            self.retrieval.dense.drop_table(t)?;
        }
        self.retrieval.store.conn().execute("DELETE FROM collections WHERE id = ?1", [col.id])?;
        Ok(ids.len())
    }

    /// BM25 candidates alone, with the configured title boost (benchmarks time the stage on its own).
    pub fn bm25_search(
        &self,
        query: &str,
        collections: &[String],
        k: usize,
    ) -> Result<Vec<crate::lexical::LexicalHit>> {
        self.retrieval.lexical.search(query, Some(collections), k, self.retrieval.cfg.search.title_boost)
    }

    pub fn collection(&self, name: &str) -> Result<Collection> {
        self.retrieval.store.collection(name)
    }

    pub fn collection_stats(&self) -> Result<Vec<CollectionStats>> {
        self.retrieval.store.collections()
    }

    /// The chunker in force: tokens of the active query encoder's tokenizer when a model is active, else
    /// characters.
    pub(crate) fn chunker(&self) -> Result<Chunker> {
        let cfg = &self.retrieval.cfg.ingest.chunk;
        let Some(pair) = crate::models::active(&self.retrieval.store)? else {
            return Ok(Chunker {
                id: format!("chars:{}/{}", cfg.max_chars, cfg.overlap_chars),
                tokenizer: None,
                max: cfg.max_chars,
                overlap: cfg.overlap_chars,
            });
        };
        let q = &pair.query;
        let tok = self.retrieval.models.tokenizer(q)?;
        // The console's chunk size, when set, with the overlap kept under a quarter of it.
        let (max, overlap) = match self.retrieval.live.get(crate::settings::Setting::ChunkTokens) {
            Some(v) => (v as usize, cfg.overlap_tokens.min(v as usize / 4)),
            None => (cfg.max_tokens, cfg.overlap_tokens),
        };
        Ok(Chunker {
            id: format!("tokens:{}@{}:{max}/{overlap}", q.name, q.version),
            tokenizer: Some(tok),
            max,
            overlap,
        })
    }

    /// Ingests files into an existing collection, synchronously (jobs use the same path file by file). A file that
    /// cannot be read or parsed is reported with its error and nothing from it is stored; the other files proceed.
    /// An archive reports each member on its own. An unknown collection fails the whole call.
    pub(crate) fn ingest_files(
        &self,
        collection: &str,
        files: &[PathBuf],
        progress: &mut dyn FnMut(IngestProgress),
    ) -> Result<IngestReport> {
        self.ingest_files_with(collection, files, &IngestOptions::default(), progress)
    }

    pub(crate) fn ingest_files_with(
        &self,
        collection: &str,
        files: &[PathBuf],
        opts: &IngestOptions,
        progress: &mut dyn FnMut(IngestProgress),
    ) -> Result<IngestReport> {
        let col = self.retrieval.store.collection(collection)?;
        let mut report = IngestReport::default();
        for (i, path) in files.iter().enumerate() {
            let reports = self.ingest_one_file(&col, path, opts, &mut |done, total| {
                progress(IngestProgress {
                    files_done: i,
                    files_total: files.len(),
                    documents_done: done,
                    documents_in_file: total,
                })
            })?;
            progress(IngestProgress {
                files_done: i + 1,
                files_total: files.len(),
                documents_done: 0,
                documents_in_file: 0,
            });
            report.files.extend(reports);
        }
        Ok(report)
    }

    /// Reads, parses and writes one uploaded file (one report per unit: the file, or each archive member).
    /// Errors of the file are in the reports; an `Err` is a failure of the stores, which stops the caller.
    pub(crate) fn ingest_one_file(
        &self,
        col: &Collection,
        path: &std::path::Path,
        opts: &IngestOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<FileReport>> {
        let mut stay = |d, t| {
            progress(d, t);
            true
        };
        self.ingest_one_file_stoppable(col, path, opts, &mut stay, &mut |_, _| {})
    }

    /// Like `ingest_one_file`; `progress(done, total)` runs after every batch and returning `false` stops the file
    /// there with [`Error::Cancelled`] (batches written so far stay, and are recognised when the file is re-read).
    /// `pages(read, of)` runs after each scanned page the parser reads (`of` 0 when not known).
    pub(crate) fn ingest_one_file_stoppable(
        &self,
        col: &Collection,
        path: &std::path::Path,
        opts: &IngestOptions,
        progress: &mut dyn FnMut(usize, usize) -> bool,
        pages: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<FileReport>> {
        let units = match crate::ingest::worker::read_units(
            path,
            opts,
            &self.retrieval.cfg.ingest,
            &self.retrieval.cfg.model,
            pages,
        ) {
            Ok(u) => u,
            Err(e) => {
                return Ok(vec![FileReport {
                    path: path.to_path_buf(),
                    error_code: Some(e.code().as_str()),
                    error: Some(e.to_string()),
                    ..Default::default()
                }]);
            }
        };
        let chunker = self.chunker()?;
        // Clinicians see a document's source: the uploaded name or the file name, never a folder on the server.
        let prefix = self.queue.upload_prefix(path).or_else(|| {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty())?;
            Some(format!("{}/", parent.display()))
        });
        let mut out = Vec::with_capacity(units.len());
        for unit in units {
            let mut fr = FileReport { path: PathBuf::from(&unit.name), ..Default::default() };
            match unit.result {
                Err(e) => {
                    fr.error_code = Some(e.code().as_str());
                    fr.error = Some(e.to_string());
                }
                Ok(mut parsed) => {
                    fr.skipped_empty = parsed.skipped_empty;
                    if let Some(p) = &prefix {
                        for d in &mut parsed.documents {
                            d.source = d.source.replace(p.as_str(), "");
                        }
                    }
                    let total = parsed.documents.len();
                    let bs = self.retrieval.cfg.ingest.batch_documents.max(1);
                    for (b, batch) in parsed.documents.chunks(bs).enumerate() {
                        self.write_batch(col, batch, &mut fr, &chunker)?;
                        if !progress((b * bs + batch.len()).min(total), total) {
                            return Err(Error::Cancelled(format!("ingestion of {}", path.display())));
                        }
                    }
                }
            }
            out.push(fr);
        }
        Ok(out)
    }

    /// Ingests already-parsed documents (used by the demo loader and by tests).
    pub(crate) fn ingest_documents(&self, collection: &str, docs: &[ParsedDocument]) -> Result<FileReport> {
        let col = self.retrieval.store.collection(collection)?;
        let chunker = self.chunker()?;
        let mut fr = FileReport::default();
        for batch in docs.chunks(self.retrieval.cfg.ingest.batch_documents.max(1)) {
            self.write_batch(&col, batch, &mut fr, &chunker)?;
        }
        Ok(fr)
    }

    fn write_batch(
        &self,
        col: &Collection,
        docs: &[ParsedDocument],
        fr: &mut FileReport,
        chunker: &Chunker,
    ) -> Result<()> {
        // Lookups and chunking (which tokenises) run before the write lock and the transaction: workers chunk in
        // parallel and the SQLite writer is held only for inserts. Two workers may chunk the same document at
        // once; the transaction decides again under the lock, so whichever batch commits last wins everywhere.
        let planned = self.plan_batch(col, docs, chunker, fr)?;
        if planned.is_empty() {
            return Ok(());
        }
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        // 1. SQLite: new and changed documents with their chunks, state 'pending'.
        let (touched, rows) = self.write_pending(col, &planned, &chunker.id, fr)?;
        if touched.is_empty() {
            return Ok(());
        }
        // 2. Lexical index: replace those documents' chunks, commit atomically.
        self.retrieval.lexical.replace_documents(&touched, &rows)?;
        self.retrieval.lexical.commit()?;
        // 3. Dense vectors, when a document encoder is active (a crash here is repaired by the sync on open).
        self.retrieval.embed_documents(col, &touched, &rows)?;
        // 4. Confirm.
        self.retrieval.store.set_documents_state(&touched, "indexed")?;
        Ok(())
    }

    /// The batch's documents that are new or changed (first of each external id), chunked; counts the unchanged.
    fn plan_batch<'d>(
        &self,
        col: &Collection,
        docs: &'d [ParsedDocument],
        chunker: &Chunker,
        fr: &mut FileReport,
    ) -> Result<Vec<Planned<'d>>> {
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut fresh = Vec::new();
        {
            let conn = self.retrieval.store.reader();
            let mut find = conn.prepare_cached(
                "SELECT content_hash, chunker FROM documents WHERE collection_id = ?1 AND external_id = ?2",
            )?;
            for d in docs.iter().filter(|d| seen.insert(d.external_id.as_str())) {
                let hash = d.content_hash();
                let stored: Option<(String, String)> =
                    find.query_row(params![col.id, d.external_id], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
                match stored {
                    Some((h, c)) if h == hash && c == chunker.id => fr.unchanged += 1,
                    _ => fresh.push((d, hash)),
                }
            }
        }
        Ok(fresh.into_iter().map(|(doc, hash)| Planned { chunks: chunker.chunk(&doc.text), doc, hash }).collect())
    }

    /// Writes planned documents and their chunks as 'pending' in one transaction. Returns the documents written
    /// and their chunks as the lexical index needs them.
    fn write_pending(
        &self,
        col: &Collection,
        planned: &[Planned<'_>],
        chunker_id: &str,
        fr: &mut FileReport,
    ) -> Result<(Vec<i64>, Vec<crate::store::ChunkRow>)> {
        let (mut touched, mut rows) = (Vec::new(), Vec::new());
        let mut conn = self.retrieval.store.conn();
        // Immediate: take SQLite's write lock now rather than upgrading mid-way (another process may write).
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let ts = now();
        for p in planned {
            let Some(doc_id) = upsert_document(&tx, col.id, p, chunker_id, &ts, fr)? else { continue };
            let mut insert_chunk = tx.prepare_cached(
                "INSERT INTO chunks (document_id, ordinal, heading, text, char_start, char_end, scan_page, \
                 scan_last_page, scan_confidence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            for (ordinal, c) in p.chunks.iter().enumerate() {
                let scan = crate::ingest::scan::passage_scan(&p.doc.scan, c.char_start, c.char_end);
                insert_chunk.execute(params![
                    doc_id,
                    ordinal as i64,
                    c.heading,
                    c.text,
                    c.char_start as i64,
                    c.char_end as i64,
                    scan.map(|s| s.page),
                    scan.map(|s| s.last_page),
                    scan.map(|s| f64::from(s.confidence))
                ])?;
                rows.push(crate::store::ChunkRow {
                    chunk_id: tx.last_insert_rowid(),
                    document_id: doc_id,
                    collection: col.name.clone(),
                    title: p.doc.title.clone(),
                    heading: c.heading.clone(),
                    text: c.text.clone(),
                });
            }
            fr.chunks += p.chunks.len();
            touched.push(doc_id);
        }
        tx.commit()?;
        Ok((touched, rows))
    }

    pub fn stats(&self) -> Result<Stats> {
        let conn = self.retrieval.store.conn();
        let documents: i64 = conn.query_row("SELECT COUNT(*) FROM documents", [], |r| r.get(0))?;
        let chunks: i64 = conn.query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))?;
        let pending: i64 =
            conn.query_row("SELECT COUNT(*) FROM documents WHERE state != 'indexed'", [], |r| r.get(0))?;
        drop(conn);
        self.retrieval.lexical.reload()?;
        Ok(Stats {
            schema_version: self.retrieval.store.schema_version()?,
            documents: documents as u64,
            chunks: chunks as u64,
            pending_documents: pending as u64,
            lexical_docs: self.retrieval.lexical.num_docs(),
            collections: self.retrieval.store.collections()?,
        })
    }

    /// Deletes documents of a collection by external id everywhere (SQLite, the lexical index, every dense
    /// table), recorded in the audit log. Unknown ids are reported as not found and nothing is deleted.
    pub(crate) fn delete_documents(&self, collection: &str, external_ids: &[String], actor: &str) -> Result<usize> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let col = self.retrieval.store.collection(collection)?;
        let mut ids = Vec::new();
        {
            let conn = self.retrieval.store.conn();
            let mut find =
                conn.prepare_cached("SELECT id FROM documents WHERE collection_id = ?1 AND external_id = ?2")?;
            for e in external_ids {
                let id: Option<i64> = find.query_row(params![col.id, e], |r| r.get(0)).optional()?;
                ids.push(id.ok_or_else(|| Error::NotFound { what: format!("资料库 {collection} 中的文档 {e}") })?);
            }
        }
        // Marked `deleting` with the audit record: the deletion is decided here, and recovery finishes it.
        {
            let mut conn = self.retrieval.store.conn();
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached("UPDATE documents SET state = 'deleting' WHERE id = ?1")?;
                for id in &ids {
                    stmt.execute([id])?;
                }
            }
            crate::audit::append(
                &tx,
                actor,
                "document.delete",
                &serde_json::json!({"collection": collection, "documents": external_ids}),
            )?;
            tx.commit()?;
        }
        self.retrieval.lexical.delete_documents(&ids)?;
        self.retrieval.lexical.commit()?;
        self.retrieval.delete_dense_documents(col.id, &ids)?;
        self.retrieval.store.delete_documents(&ids)?;
        Ok(ids.len())
    }
}
