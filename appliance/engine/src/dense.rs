//! Dense vectors in Lance tables (LanceDB's storage format, through `care-lance`): one table per (collection,
//! document model), named by the caller.
//!
//! Lance is the durable store. Search is exact for tables below `ann_threshold` rows, done on an in-memory copy of
//! the vectors (an int8 pass and an f32 re-score, perfect recall); above the threshold an IVF-PQ index is built and
//! queried with refinement (re-ranking the shortlist with full vectors), and its recall against the exact scan is
//! what `recall_at` measures. `care-bench --ann` measured where IVF-PQ starts to pay on 2 cores: not before about
//! 700,000 rows of width 384 (the default threshold is 1,000,000).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use arrow_array::types::Float32Type;
use arrow_array::{Array, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

use crate::error::{Error, Result};

fn dense_err(e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    if crate::error::says_disk_full(&text) {
        return Error::StoreFull { store: "向量索引", detail: text };
    }
    Error::Internal(format!("dense index: {text}"))
}

pub struct DenseStore {
    store: care_lance::Store,
    tables: Mutex<HashMap<String, Arc<DenseTable>>>,
}

impl std::fmt::Debug for DenseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseStore").finish()
    }
}

/// A scored chunk from a dense search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenseHit {
    pub chunk_id: i64,
    pub document_id: i64,
    pub score: f32,
}

struct Flat {
    chunk_ids: Vec<i64>,
    doc_ids: Vec<i64>,
    vectors: Vec<f32>,
    /// The int8 copy the first pass of a large exact scan reads (None below [`INT8_SCAN_FROM`] rows).
    approx: Option<crate::kernels::Int8Rows>,
}

/// Rows from which the exact scan reads an int8 copy first and re-scores `INT8_OVERSAMPLE` × k candidates in f32:
/// below it the f32 rows sit in cache and one pass is as fast.
const INT8_SCAN_FROM: usize = 4096;
/// On kuake_qtr's 32,171 e5-small vectors and 300 training queries, 1.25 × k candidates already gave the exact
/// top k of every query, at the k = 100 a search's dense leg asks for and at 1,100 (1.1 × missed up to 9 rows;
/// `tests/bench/int8_oversample.py`); 1.5 keeps twice that margin. At 4 × the heap of 400 candidates and their
/// re-scoring (random reads of the f32 rows) took 9 % of a loaded server's CPU, at 1.5 × 3 %.
pub(crate) const INT8_OVERSAMPLE: f32 = 1.5;

/// Rows up to which a write changes the in-memory copy in place of dropping it: below, a copy of the copy costs the
/// writer less than the table read that searches would otherwise wait for; above (a re-embedding of a large
/// collection writes in many batches), each batch's copy would cost more than one read afterwards.
const FLAT_UPDATE_MAX_ROWS: usize = 1 << 18;

impl Flat {
    fn approximate(&mut self, width: usize) {
        self.approx =
            (self.chunk_ids.len() >= INT8_SCAN_FROM).then(|| crate::kernels::Int8Rows::quantize(&self.vectors, width));
    }

    /// This copy with the rows `dropped(chunk_id, document_id)` selects removed and `rows` appended after the rest,
    /// where a Lance write puts them (in a fragment of their own).
    fn changed(&self, width: usize, dropped: impl Fn(i64, i64) -> bool, rows: &[(i64, i64, Vec<f32>)]) -> Flat {
        let mut next = Flat { chunk_ids: Vec::new(), doc_ids: Vec::new(), vectors: Vec::new(), approx: None };
        let kept = self.chunk_ids.iter().zip(&self.doc_ids).zip(self.vectors.chunks_exact(width.max(1)));
        for ((&chunk, &doc), v) in kept.filter(|((c, d), _)| !dropped(**c, **d)) {
            next.chunk_ids.push(chunk);
            next.doc_ids.push(doc);
            next.vectors.extend_from_slice(v);
        }
        for (chunk, doc, v) in rows {
            next.chunk_ids.push(*chunk);
            next.doc_ids.push(*doc);
            next.vectors.extend_from_slice(v);
        }
        next.approximate(width);
        next
    }
}

pub struct DenseTable {
    name: String,
    width: usize,
    table: care_lance::Table,
    flat: RwLock<Option<Arc<Flat>>>,
    has_ann: RwLock<bool>,
}

impl DenseTable {
    fn flat(&self) -> Option<Arc<Flat>> {
        self.flat.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After a write to the table: the in-memory copy `before` the write, changed as the write changed the table,
    /// replaces it, so that the next search does not stop to read the table again (an ingest of 40 small files
    /// made every searcher that came next read it 40 times). The copy is dropped instead (the next search reads
    /// the table) when the write failed or may have stopped half-way, when it is large, or when another write or a
    /// read replaced it meanwhile.
    fn after_write(
        &self,
        before: Option<Arc<Flat>>,
        written: bool,
        dropped: impl Fn(i64, i64) -> bool,
        rows: &[(i64, i64, Vec<f32>)],
    ) {
        let next = before
            .as_ref()
            .filter(|b| written && b.chunk_ids.len() <= FLAT_UPDATE_MAX_ROWS)
            .map(|b| Arc::new(b.changed(self.width, dropped, rows)));
        let mut flat = self.flat.write().unwrap_or_else(|p| p.into_inner());
        let unchanged = match (flat.as_ref(), before.as_ref()) {
            (Some(now), Some(b)) => Arc::ptr_eq(now, b),
            _ => false,
        };
        *flat = if unchanged { next } else { None };
    }
}

impl DenseStore {
    pub fn open(dir: &Path) -> Result<Self> {
        let store = care_lance::Store::open(dir).map_err(|e| match e {
            care_lance::Error::Io { path, source } => Error::io(&path, source),
            care_lance::Error::NotUtf8(path) => {
                Error::InvalidInput(format!("向量库路径 {} 不是 UTF-8 编码", path.display()))
            }
            other @ (care_lance::Error::Lance(_) | care_lance::Error::Arrow(_)) => dense_err(other),
        })?;
        Ok(DenseStore { store, tables: Mutex::new(HashMap::new()) })
    }

    fn schema(width: usize) -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("chunk_id", DataType::Int64, false),
            Field::new("document_id", DataType::Int64, false),
            Field::new(
                "vector",
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), width as i32),
                false,
            ),
        ]))
    }

    /// Opens (creating if needed) a table of vectors of `width`.
    pub fn table(&self, name: &str, width: usize) -> Result<Arc<DenseTable>> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tables.get(name) {
            return Ok(t.clone());
        }
        let table = self.store.open_or_create(name, Self::schema(width)).map_err(dense_err)?;
        let has_ann = self.store.has_index(&table, "vector").map_err(dense_err)?;
        let t = Arc::new(DenseTable {
            name: name.to_string(),
            width,
            table,
            flat: RwLock::new(None),
            has_ann: RwLock::new(has_ann),
        });
        tables.insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// The names of every table in the database, recorded in SQLite or not.
    pub fn table_names(&self) -> Result<Vec<String>> {
        self.store.table_names().map_err(dense_err)
    }

    pub fn drop_table(&self, name: &str) -> Result<()> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        self.store.drop_table(name).map_err(dense_err)
    }

    /// Replaces all vectors of the given documents with `rows` (chunk_id, document_id, vector).
    pub fn replace_documents(&self, t: &DenseTable, doc_ids: &[i64], rows: &[(i64, i64, Vec<f32>)]) -> Result<()> {
        let deletes: Vec<String> = doc_ids
            .chunks(500)
            .map(|ids| {
                let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
                format!("document_id IN ({list})")
            })
            .collect();
        let batch = if rows.is_empty() { None } else { Some(Self::record_batch(t, rows)?) };
        let before = t.flat();
        let written = self.store.replace(&t.table, &deletes, batch);
        let docs: std::collections::HashSet<i64> = doc_ids.iter().copied().collect();
        t.after_write(before, written.is_ok(), |_, doc| docs.contains(&doc), rows);
        written.map_err(dense_err)
    }

    /// Sets the vectors of the given chunks (inserting those the table lacks) in one Lance commit, so a crash
    /// leaves either all of `rows` or none of them. Other chunks' vectors are untouched.
    pub fn upsert_chunks(&self, t: &DenseTable, rows: &[(i64, i64, Vec<f32>)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let batch = Self::record_batch(t, rows)?;
        let before = t.flat();
        let written = self.store.upsert(&t.table, "chunk_id", batch);
        let chunks: std::collections::HashSet<i64> = rows.iter().map(|r| r.0).collect();
        t.after_write(before, written.is_ok(), |chunk, _| chunks.contains(&chunk), rows);
        written.map_err(dense_err)
    }

    fn record_batch(t: &DenseTable, rows: &[(i64, i64, Vec<f32>)]) -> Result<RecordBatch> {
        for r in rows {
            if r.2.len() != t.width {
                return Err(dense_err(format!(
                    "vector of width {} for table {} of width {}",
                    r.2.len(),
                    t.name,
                    t.width
                )));
            }
        }
        RecordBatch::try_new(
            Self::schema(t.width),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(
                    rows.iter().map(|r| Some(r.2.iter().map(|x| Some(*x)).collect::<Vec<_>>())),
                    t.width as i32,
                )),
            ],
        )
        .map_err(dense_err)
    }

    /// Every stored vector by chunk id (for tests and consistency checks; loads the whole table).
    pub fn vectors(&self, t: &DenseTable) -> Result<Vec<(i64, Vec<f32>)>> {
        let flat = self.load_flat(t)?;
        Ok(flat
            .chunk_ids
            .iter()
            .zip(flat.vectors.chunks_exact(t.width.max(1)))
            .map(|(c, v)| (*c, v.to_vec()))
            .collect())
    }

    pub fn count(&self, t: &DenseTable) -> Result<usize> {
        self.store.count(&t.table).map_err(dense_err)
    }

    /// Every (chunk_id, document_id) stored, for consistency checks.
    pub fn all_ids(&self, t: &DenseTable) -> Result<Vec<(i64, i64)>> {
        let batches = self.store.scan(&t.table, Some(&["chunk_id", "document_id"])).map_err(dense_err)?;
        let mut out = Vec::new();
        for b in batches {
            let c = column_i64(&b, "chunk_id")?;
            let d = column_i64(&b, "document_id")?;
            out.extend(c.values().iter().copied().zip(d.values().iter().copied()));
        }
        Ok(out)
    }

    fn load_flat(&self, t: &DenseTable) -> Result<Arc<Flat>> {
        if let Some(f) = t.flat() {
            return Ok(f);
        }
        let batches = self.store.scan(&t.table, None).map_err(dense_err)?;
        let mut flat = Flat { chunk_ids: Vec::new(), doc_ids: Vec::new(), vectors: Vec::new(), approx: None };
        for b in batches {
            flat.chunk_ids.extend_from_slice(column_i64(&b, "chunk_id")?.values());
            flat.doc_ids.extend_from_slice(column_i64(&b, "document_id")?.values());
            let v = b
                .column_by_name("vector")
                .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
                .ok_or_else(|| dense_err("vector column missing"))?;
            let values = v.values().as_any().downcast_ref::<Float32Array>().ok_or_else(|| dense_err("vector type"))?;
            let start = v.offset() * t.width;
            flat.vectors.extend_from_slice(&values.values()[start..start + v.len() * t.width]);
        }
        flat.approximate(t.width);
        let flat = Arc::new(flat);
        *t.flat.write().unwrap_or_else(|p| p.into_inner()) = Some(flat.clone());
        Ok(flat)
    }

    /// Exact top-k by inner product (vectors are normalised, so this is cosine similarity).
    pub fn search_exact(&self, t: &DenseTable, q: &[f32], k: usize) -> Result<Vec<DenseHit>> {
        self.search_exact_where(t, q, k, None)
    }

    /// [`DenseStore::search_exact`] among the chunks of the documents in `keep` (a search filter), tested row by
    /// row during the scan, so the top k are the best admitted chunks.
    pub fn search_exact_where(
        &self,
        t: &DenseTable,
        q: &[f32],
        k: usize,
        keep: Option<&crate::facets::DocSet>,
    ) -> Result<Vec<DenseHit>> {
        Ok(self.search_exact_pair(t, q, k, None, keep)?.1)
    }

    /// One scan, two rankings: the top `all` chunks of every document (when asked) and the top `k` of the
    /// documents in `keep`.
    pub fn search_exact_pair(
        &self,
        t: &DenseTable,
        q: &[f32],
        k: usize,
        all: Option<usize>,
        keep: Option<&crate::facets::DocSet>,
    ) -> Result<(Vec<DenseHit>, Vec<DenseHit>)> {
        let flat = self.load_flat(t)?;
        let w = t.width;
        if q.len() != w {
            return Err(dense_err(format!("query vector width {} but table {} has width {w}", q.len(), t.name)));
        }
        let admit = |row: usize| keep.is_none_or(|s| s.contains(flat.doc_ids[row]));
        // The scan is bound by memory bandwidth: on a 2-core EPYC VM the f32 rows of kuake_qtr (32k × 384, 49 MB)
        // took 5.6 ms, so large tables are read as int8 first (a quarter of the bytes) and the candidates re-scored
        // exactly; the result is the exact top k unless the true top k fall outside 1.5 k int8 candidates.
        let (every, kept) = match &flat.approx {
            Some(approx) => crate::kernels::top_k_int8_pair(approx, &flat.vectors, q, k, INT8_OVERSAMPLE, all, admit),
            None => crate::kernels::top_k_pair(&flat.vectors, q, k, all, admit),
        };
        let hits = |v: Vec<(f32, usize)>| -> Vec<DenseHit> {
            v.into_iter()
                .map(|(s, i)| DenseHit { chunk_id: flat.chunk_ids[i], document_id: flat.doc_ids[i], score: s })
                .collect()
        };
        Ok((hits(every), hits(kept)))
    }

    /// Approximate top-k through the table's IVF-PQ index, re-ranked with full vectors.
    pub fn search_ann(
        &self,
        t: &DenseTable,
        q: &[f32],
        k: usize,
        nprobes: usize,
        refine: u32,
    ) -> Result<Vec<DenseHit>> {
        self.search_ann_where(t, q, k, nprobes, refine, None)
    }

    /// [`DenseStore::search_ann`] among the documents in `keep`: Lance's pre-filter (applied before the index's
    /// candidates are cut), given as the admitted document ids.
    pub fn search_ann_where(
        &self,
        t: &DenseTable,
        q: &[f32],
        k: usize,
        nprobes: usize,
        refine: u32,
        keep: Option<&crate::facets::DocSet>,
    ) -> Result<Vec<DenseHit>> {
        let filter = keep.map(|s| {
            let ids: Vec<String> = s.ids().map(|i| i.to_string()).collect();
            if ids.is_empty() { "false".to_string() } else { format!("document_id IN ({})", ids.join(",")) }
        });
        let query = care_lance::Nearest {
            column: "vector",
            query: q,
            k,
            nprobes,
            refine,
            filter,
            columns: &["chunk_id", "document_id"],
        };
        let batches = self.store.nearest(&t.table, &query).map_err(dense_err)?;
        let mut out = Vec::new();
        for b in batches {
            let c = column_i64(&b, "chunk_id")?;
            let d = column_i64(&b, "document_id")?;
            let dist = b
                .column_by_name("_distance")
                .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
                .ok_or_else(|| dense_err("_distance column missing"))?;
            for i in 0..b.num_rows() {
                // Lance's dot "distance" is 1 - <q, v>.
                out.push(DenseHit { chunk_id: c.value(i), document_id: d.value(i), score: 1.0 - dist.value(i) });
            }
        }
        out.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(out)
    }

    pub fn has_ann(&self, t: &DenseTable) -> bool {
        *t.has_ann.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Builds (or rebuilds) the IVF-PQ index over the vectors.
    pub fn build_ann(&self, t: &DenseTable) -> Result<()> {
        let n = self.count(t)?;
        let partitions = ((n as f64).sqrt() as u32).clamp(1, 4096);
        // 4 dimensions per PQ code keeps quantisation error low enough for the refine step to recover recall.
        let sub_vectors = (t.width / 4).max(1) as u32;
        self.store.build_ivf_pq(&t.table, "vector", partitions as usize, sub_vectors as usize).map_err(dense_err)?;
        *t.has_ann.write().unwrap_or_else(|p| p.into_inner()) = true;
        Ok(())
    }

    /// Mean recall@k of the ANN search against the exact scan, over `queries`.
    pub fn recall_at(
        &self,
        t: &DenseTable,
        queries: &[Vec<f32>],
        k: usize,
        nprobes: usize,
        refine: u32,
    ) -> Result<f64> {
        let mut total = 0.0;
        for q in queries {
            let exact: std::collections::HashSet<i64> =
                self.search_exact(t, q, k)?.iter().map(|h| h.chunk_id).collect();
            let ann = self.search_ann(t, q, k, nprobes, refine)?;
            let found = ann.iter().filter(|h| exact.contains(&h.chunk_id)).count();
            total += found as f64 / exact.len().max(1) as f64;
        }
        Ok(total / queries.len().max(1) as f64)
    }
}

impl DenseTable {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn width(&self) -> usize {
        self.width
    }
}

/// Exact top-k rows of a row-major matrix by inner product with `q`: (score, row), best first.
pub fn flat_top_k(vectors: &[f32], width: usize, q: &[f32], k: usize) -> Vec<(f32, usize)> {
    debug_assert_eq!(width, q.len());
    crate::kernels::top_k(vectors, q, k)
}

fn column_i64<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a Int64Array> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| dense_err(format!("column {name} missing")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_top_k_orders_by_inner_product() {
        let v = [1.0, 0.0, 0.0, 1.0, 0.7, 0.7, -1.0, 0.0];
        let got = flat_top_k(&v, 2, &[1.0, 0.0], 3);
        assert_eq!(got.iter().map(|x| x.1).collect::<Vec<_>>(), vec![0, 2, 1]);
        assert!((got[1].0 - 0.7).abs() < 1e-6);
        assert_eq!(flat_top_k(&v, 2, &[1.0, 0.0], 10).len(), 4);
        assert!(flat_top_k(&[], 2, &[1.0, 0.0], 3).is_empty());
    }

    fn row(chunk: i64, doc: i64, width: usize) -> (i64, i64, Vec<f32>) {
        let v: Vec<f32> = (0..width).map(|j| ((chunk * 7 + j as i64 * 3) % 11) as f32 - 5.0).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
        (chunk, doc, v.into_iter().map(|x| x / n).collect())
    }

    /// What searches read after writes: the copy each write changed in place equals the table read afresh, and
    /// no write made the next search read the table.
    #[test]
    fn writes_change_the_in_memory_copy_as_they_change_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let store = DenseStore::open(dir.path()).unwrap();
        let width = 8;
        let t = store.table("t", width).unwrap();
        let first: Vec<_> = (0..30).map(|c| row(c, c / 3, width)).collect();
        store.replace_documents(&t, &(0..10).collect::<Vec<_>>(), &first).unwrap();
        assert!(t.flat().is_none(), "no copy yet: nothing to change");
        let q = row(99, 0, width).2;
        let before = store.search_exact(&t, &q, 5).unwrap();
        assert_eq!(before.len(), 5);
        // Document 2 (chunks 6-8) replaced by two chunks, document 20 added; chunks 0 and 40 upserted.
        store.replace_documents(&t, &[2, 20], &[row(100, 2, width), row(101, 2, width), row(102, 20, width)]).unwrap();
        let kept = t.flat().expect("the copy was changed, not dropped");
        store.upsert_chunks(&t, &[row(0, 0, width), row(40, 13, width)]).unwrap();
        let changed = t.flat().expect("the copy was changed, not dropped");
        assert!(!Arc::ptr_eq(&kept, &changed));
        *t.flat.write().unwrap() = None;
        let fresh = store.load_flat(&t).unwrap();
        let rows = |f: &Flat| {
            (0..f.chunk_ids.len())
                .map(|i| {
                    (
                        f.chunk_ids[i],
                        f.doc_ids[i],
                        f.vectors[i * width..(i + 1) * width].iter().map(|x| x.to_bits()).collect(),
                    )
                })
                .collect::<Vec<(i64, i64, Vec<u32>)>>()
        };
        // In Lance's order too, so that ties rank as they would after a restart.
        assert_eq!(rows(&changed), rows(&fresh));
        assert_eq!(changed.chunk_ids.len(), 30 - 3 + 3 + 1);
        // A failed write drops the copy: the next search reads the table.
        t.after_write(Some(fresh.clone()), false, |_, _| false, &[]);
        assert!(t.flat().is_none());
        // So does a write whose copy another read replaced meanwhile.
        let other = store.load_flat(&t).unwrap();
        t.after_write(Some(fresh), true, |_, _| false, &[]);
        assert!(t.flat().is_none() && other.chunk_ids.len() == 31);
    }
}
