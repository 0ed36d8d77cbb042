//! The Lance dataset operations behind the engine's dense index: tables as `<dir>/<name>.lance` (LanceDB's layout),
//! written, scanned, searched and indexed through the `lance` crate, behind a synchronous API of plain types.
//!
//! Why a crate of its own: Lance's API is async and generic, so every call instantiates its futures in the caller.
//! Inside the engine (opt-level 2 in dev builds, for its own hot loops) they doubled its codegen (311 s instead of
//! 139 s of a cold build); here, at the default opt-level like Lance itself, they cost a few seconds. Calling the
//! `lance` crate instead of `lancedb` spares every cold build the `lancedb` layer (~180 s of rustc: its namespace and
//! remote clients, lindera and a second jieba), of which the engine used six table operations.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::{Float32Array, RecordBatch, RecordBatchIterator, RecordBatchReader};
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use lance::Dataset;
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched, WriteMode, WriteParams};
use lance::index::DatasetIndexExt;
use lance::index::vector::VectorIndexParams;
use lance_index::IndexType;
use lance_index::vector::ivf::IvfBuildParams;
use lance_index::vector::pq::PQBuildParams;
use lance_linalg::distance::DistanceType;

/// A table's directory: `<name>.lance`, as LanceDB names them.
const SUFFIX: &str = ".lance";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Lance(#[from] lance::Error),
    #[error("{0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("vector store path {} is not UTF-8", .0.display())]
    NotUtf8(PathBuf),
}

pub type Result<T> = std::result::Result<T, Error>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// The tables of one directory, and the runtime their async calls are blocked on.
#[derive(Debug)]
pub struct Store {
    rt: tokio::runtime::Runtime,
    dir: PathBuf,
}

/// One table at its newest version. Writers hold its lock for the whole write (as LanceDB's table does), so two
/// writes never race for a commit; readers take a copy (a few `Arc`s) and let go.
#[derive(Debug)]
pub struct Table {
    ds: Mutex<Dataset>,
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, Dataset> {
        self.ds.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn snapshot(&self) -> Dataset {
        self.lock().clone()
    }
}

/// A nearest-neighbour query through a table's vector index.
#[derive(Debug, Clone)]
pub struct Nearest<'a> {
    pub column: &'a str,
    pub query: &'a [f32],
    pub k: usize,
    pub nprobes: usize,
    pub refine: u32,
    /// An SQL predicate applied before the index's candidates are cut (a pre-filter).
    pub filter: Option<String>,
    /// The columns returned beside `_distance` (Lance's dot "distance" is 1 - <q, v>).
    pub columns: &'a [&'a str],
}

impl Store {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        if dir.to_str().is_none() {
            return Err(Error::NotUtf8(dir.to_path_buf()));
        }
        // The engine is synchronous: a small runtime of its own, blocked on for each call.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("care-lance")
            .enable_all()
            .build()
            .map_err(io(dir))?;
        Ok(Store { rt, dir: dir.to_path_buf() })
    }

    /// A table is a directory of that name (LanceDB's rule, as [`Store::table_names`] lists them).
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{SUFFIX}"))
    }

    /// Only directories named `<name>.lance` are tables (LanceDB's rule), sorted by name.
    pub fn table_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(SUFFIX)) else { continue };
            if !name.is_empty() && entry.file_type().is_ok_and(|t| t.is_dir()) {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Opens the table, or creates it empty with `schema`.
    pub fn open_or_create(&self, name: &str, schema: SchemaRef) -> Result<Table> {
        // open() refused a directory whose path is not UTF-8.
        let uri = self.path(name).to_string_lossy().into_owned();
        let ds = if self.path(name).is_dir() {
            self.rt.block_on(Dataset::open(&uri))?
        } else {
            let empty = RecordBatchIterator::new(Vec::<std::result::Result<RecordBatch, _>>::new(), schema);
            let create = WriteParams { mode: WriteMode::Create, ..Default::default() };
            self.rt.block_on(Dataset::write(empty, uri.as_str(), Some(create)))?
        };
        Ok(Table { ds: Mutex::new(ds) })
    }

    pub fn drop_table(&self, name: &str) -> Result<()> {
        let path = self.path(name);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        }
        Ok(())
    }

    /// Whether `column` has an index.
    pub fn has_index(&self, t: &Table, column: &str) -> Result<bool> {
        let ds = t.snapshot();
        let Some(field) = ds.schema().field(column).map(|f| f.id) else { return Ok(false) };
        Ok(self.rt.block_on(ds.load_indices())?.iter().any(|i| i.fields.contains(&field)))
    }

    /// Deletes the rows matching each predicate, then appends `batch`, holding the table for the whole sequence
    /// (each step is a commit of its own).
    pub fn replace(&self, t: &Table, deletes: &[String], batch: Option<RecordBatch>) -> Result<()> {
        let mut ds = t.lock();
        for predicate in deletes {
            self.rt.block_on(ds.delete(predicate))?;
        }
        if let Some(batch) = batch {
            let schema = batch.schema();
            self.rt.block_on(ds.append(RecordBatchIterator::new(vec![Ok(batch)], schema), None))?;
        }
        Ok(())
    }

    /// Sets the rows of `batch` by the key column `on`, inserting those the table lacks, in one commit.
    pub fn upsert(&self, t: &Table, on: &str, batch: RecordBatch) -> Result<()> {
        let schema = batch.schema();
        let reader: Box<dyn RecordBatchReader + Send> = Box::new(RecordBatchIterator::new(vec![Ok(batch)], schema));
        let mut ds = t.lock();
        let mut builder = MergeInsertBuilder::try_new(Arc::new(ds.clone()), vec![on.to_string()])?;
        builder.when_matched(WhenMatched::UpdateAll).when_not_matched(WhenNotMatched::InsertAll);
        let (merged, _) = self.rt.block_on(builder.try_build()?.execute_reader(reader))?;
        *ds = Arc::unwrap_or_clone(merged);
        Ok(())
    }

    pub fn count(&self, t: &Table) -> Result<usize> {
        Ok(self.rt.block_on(t.snapshot().count_rows(None))?)
    }

    /// Every row, of `columns` or of all columns.
    pub fn scan(&self, t: &Table, columns: Option<&[&str]>) -> Result<Vec<RecordBatch>> {
        let ds = t.snapshot();
        Ok(self.rt.block_on(async {
            let mut scan = ds.scan();
            if let Some(c) = columns {
                scan.project(c)?;
            }
            scan.try_into_stream().await?.try_collect::<Vec<_>>().await
        })?)
    }

    /// The `k` nearest rows by inner product through the table's vector index, re-ranked with full vectors.
    pub fn nearest(&self, t: &Table, q: &Nearest<'_>) -> Result<Vec<RecordBatch>> {
        let ds = t.snapshot();
        Ok(self.rt.block_on(async {
            // Lance sizes its candidate lists by k: no search returns more rows than the table holds.
            let k = q.k.min(ds.count_rows(None).await?.max(1));
            let query = Float32Array::from(q.query.to_vec());
            let mut scan = ds.scan();
            scan.nearest(q.column, &query, k)?;
            scan.nprobes(q.nprobes);
            scan.refine(q.refine);
            scan.distance_metric(DistanceType::Dot);
            scan.limit(Some(k as i64), None)?;
            scan.prefilter(true);
            if let Some(f) = &q.filter {
                scan.filter(f)?;
            }
            scan.project(q.columns)?;
            scan.try_into_stream().await?.try_collect::<Vec<_>>().await
        })?)
    }

    /// Builds (or rebuilds) an IVF-PQ index on `column` for inner-product search, with LanceDB's defaults for the
    /// rest: 8-bit codes, 50 k-means iterations, 256 training rows per partition.
    pub fn build_ivf_pq(&self, t: &Table, column: &str, partitions: usize, sub_vectors: usize) -> Result<()> {
        let mut ivf = IvfBuildParams::new(partitions);
        ivf.max_iters = 50;
        ivf.sample_rate = 256;
        let mut pq = PQBuildParams::new(sub_vectors, 8);
        pq.max_iters = 50;
        let params = VectorIndexParams::with_ivf_pq_params(DistanceType::Dot, ivf, pq);
        let mut ds = t.lock();
        self.rt.block_on(ds.create_index(&[column], IndexType::Vector, None, &params, true))?;
        Ok(())
    }
}
