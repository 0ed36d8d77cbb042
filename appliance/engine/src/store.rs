//! SQLite metadata: migrations and the queries the engine needs.
//!
//! Migrations are the numbered files in the repository's `migrations/` folder, embedded at build time and applied
//! in order; `PRAGMA user_version` records the last one. A database written by a newer build (higher
//! user_version) is refused rather than silently misread.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

pub use crate::audit::now;
use crate::error::{Error, Result};

pub mod texts;
mod wal;

/// (version, SQL). Append only; never edit a released migration.
pub const MIGRATIONS: &[(u32, &str)] = &[
    (1, include_str!("../../../migrations/0001_init.sql")),
    (2, include_str!("../../../migrations/0002_models_dense.sql")),
    (3, include_str!("../../../migrations/0003_audit_head.sql")),
    (4, include_str!("../../../migrations/0004_ingest_jobs.sql")),
    (5, include_str!("../../../migrations/0005_auth.sql")),
    (6, include_str!("../../../migrations/0006_vector_imports.sql")),
    (7, include_str!("../../../migrations/0007_audit_key.sql")),
    (8, include_str!("../../../migrations/0008_job_file_starts.sql")),
    (9, include_str!("../../../migrations/0009_login_hardening.sql")),
    (10, include_str!("../../../migrations/0010_model_lifecycle.sql")),
    (11, include_str!("../../../migrations/0011_model_jobs.sql")),
    (12, include_str!("../../../migrations/0012_training.sql")),
    (13, include_str!("../../../migrations/0013_pair_fusion.sql")),
    (14, include_str!("../../../migrations/0014_synonyms.sql")),
    (15, include_str!("../../../migrations/0015_task_submitter.sql")),
    (16, include_str!("../../../migrations/0016_chunk_deletions.sql")),
    (17, include_str!("../../../migrations/0017_document_meta.sql")),
    (18, include_str!("../../../migrations/0018_document_meta_version.sql")),
    (19, include_str!("../../../migrations/0019_audit_action_index.sql")),
    (20, include_str!("../../../migrations/0020_document_issuer_language.sql")),
    (21, include_str!("../../../migrations/0021_directory_accounts.sql")),
    (22, include_str!("../../../migrations/0022_document_access.sql")),
    (23, include_str!("../../../migrations/0023_settings.sql")),
    (24, include_str!("../../../migrations/0024_sign_in_config.sql")),
    (25, include_str!("../../../migrations/0025_model_query_graph.sql")),
    (26, include_str!("../../../migrations/0026_synonym_staging.sql")),
    (27, include_str!("../../../migrations/0027_scanned_passages.sql")),
    (28, include_str!("../../../migrations/0028_backup_schedule.sql")),
    (29, include_str!("../../../migrations/0029_token_scope.sql")),
    (30, include_str!("../../../migrations/0030_synonym_swap.sql")),
];

/// What a migration needs beyond its SQL, in the same transaction: 20 reads the language of the documents
/// already stored from their first passages (new ones get it at ingest).
fn after_migration(tx: &rusqlite::Transaction<'_>, version: u32) -> Result<()> {
    if version != 20 {
        return Ok(());
    }
    let docs: Vec<(i64, String)> = {
        let mut stmt = tx.prepare(
            "SELECT d.id, COALESCE((SELECT group_concat(t, ' ') FROM
                 (SELECT k.text AS t FROM chunks k WHERE k.document_id = d.id ORDER BY k.ordinal LIMIT 4)), '')
             FROM documents d",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    let mut update = tx.prepare("UPDATE documents SET language = ?2 WHERE id = ?1")?;
    for (id, text) in docs {
        let lang = crate::ingest::meta::detect_language(&text);
        if !lang.is_empty() {
            update.execute(params![id, lang])?;
        }
    }
    Ok(())
}

/// The metadata file is the appliance's alone (SQLite gives its -wal and -shm files the same mode).
fn restrict_to_owner(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| Error::io(path, e))?;
        }
    }
    Ok(())
}

pub fn latest_schema() -> u32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

/// The schema version of a database file, read without migrating or writing anything (`care doctor`).
pub fn peek_schema_version(path: &Path) -> Result<u32> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    Ok(conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
}

/// Read-only connections handed out by [`Store::reader`] when no `storage.read_connections` setting says otherwise.
pub const DEFAULT_READ_CONNECTIONS: usize = 4;

#[derive(Debug)]
pub struct Store {
    /// Before `conn`: fields drop in order, and the writer closing last checkpoints and removes the WAL.
    readers: ReaderPool,
    /// Shared only with the engine's audit writer thread (`audit/writer.rs`), which the engine stops before its
    /// store closes.
    conn: Arc<Mutex<Connection>>,
    /// The folder holding the database, `audit.key` and `audit.anchor`.
    dir: PathBuf,
    audit: crate::audit::Monitor,
    /// The serving process's in-memory rate limits (per client address, per user); one set per open store so
    /// two data directories in one process (tests) never share counters.
    pub(crate) limits: crate::limits::Limits,
    /// The audit log's last record id when this store was opened: a store that appended records checkpoints the
    /// log when it closes (see `Drop`).
    audit_head_at_open: std::sync::atomic::AtomicI64,
    /// Checkpoints the WAL off the commit path ([`wal`]); stopped before the writer closes.
    checkpointer: wal::Checkpointer,
}

/// Records appended after the last checkpoint are covered only by the chain, and a tail cut off the chain (the last
/// records before a shutdown, or a CLI command's record) leaves a shorter chain that still verifies. So a process
/// that wrote to the log checkpoints it as it closes: `care serve` at shutdown (explicitly, and here), every CLI
/// command that changed something. A failure is logged, never raised: closing must not fail, and the next
/// checkpoint or `care audit verify` reports a broken chain.
impl Drop for Store {
    fn drop(&mut self) {
        let opened = self.audit_head_at_open.load(std::sync::atomic::Ordering::Relaxed);
        let head: Option<i64> = self.conn().query_row("SELECT max(id) FROM audit", [], |r| r.get(0)).ok().flatten();
        if head.is_some_and(|h| h > opened)
            && let Err(e) = crate::audit::checkpoint(self)
        {
            tracing::warn!(error = %e, "audit checkpoint at close failed");
        }
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        self.checkpointer.stop(&mut conn);
    }
}

const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a connection that found the database locked tries again.
const BUSY_STEP: std::time::Duration = std::time::Duration::from_millis(1);

/// Waits for the write lock (or a checkpoint) in steps of [`BUSY_STEP`] for up to [`BUSY_TIMEOUT`]. SQLite's own
/// busy wait backs off to sleeps of 25, 50 and then 100 ms: while another process writes in short batches with
/// pauses between them (`care collection file` beside `care serve`), a waiting search's audit record slept through
/// the pauses and searches took ~80 ms longer. A process has no other way to learn that SQLite's file lock was
/// freed; trying it is one system call.
fn wait_for_lock(conn: &mut Connection) -> rusqlite::Result<()> {
    fn again(tries: i32) -> bool {
        std::thread::sleep(BUSY_STEP);
        (tries as u128) < BUSY_TIMEOUT.as_micros() / BUSY_STEP.as_micros()
    }
    conn.busy_handler(Some(again))
}

thread_local! {
    /// Readers this thread holds: a thread that already holds one and finds the pool empty gets an extra
    /// connection instead of waiting, since the readers it would wait for may include its own.
    static HELD_READERS: Cell<usize> = const { Cell::new(0) };
}

/// How a read-only connection is opened: what a thread that outlives a borrow of the store (a background reload,
/// [`crate::engine::Versioned`]) takes with it.
#[derive(Clone)]
pub(crate) struct ReaderOpener {
    path: PathBuf,
    key: [u8; 32],
}

impl ReaderOpener {
    pub(crate) fn open(&self) -> Result<Connection> {
        use rusqlite::OpenFlags;
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let mut conn = Connection::open_with_flags(&self.path, flags)?;
        // Audit verification and listings call care_audit_mac() on readers too.
        crate::audit::register_key(&conn, self.key)?;
        wait_for_lock(&mut conn)?;
        conn.pragma_update(None, "query_only", "ON")?;
        // Every read of the process shares these few connections; the default cache (16) would evict and re-prepare.
        conn.set_prepared_statement_cache_capacity(64);
        stable_plans(&conn)?;
        Ok(conn)
    }
}

/// Plans that do not depend on the values bound (SQLite's query planner stability guarantee). Without it, a
/// statement whose plan looked at a bound value (`x = ?` where ? may be 0 or 1, a LIMIT) is marked to re-prepare
/// when its bindings are cleared, which rusqlite's statement cache does each time it takes a statement back:
/// such cached statements were compiled again on every use (the search's fusion setting and page rows, ~0.1 ms a
/// search). The schema keeps no statistics whose plans this would forgo.
fn stable_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Read-only WAL connections, opened on first use up to `size`.
struct ReaderPool {
    path: PathBuf,
    key: [u8; 32],
    size: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Connection>,
    opened: usize,
}

impl std::fmt::Debug for ReaderPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the key.
        f.debug_struct("ReaderPool").field("path", &self.path).field("size", &self.size).finish()
    }
}

impl ReaderPool {
    fn new(path: &Path, key: [u8; 32], size: usize) -> Self {
        ReaderPool { path: path.to_path_buf(), key, size, state: Default::default(), freed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_one(&self) -> Result<Connection> {
        ReaderOpener { path: self.path.clone(), key: self.key }.open()
    }

    /// An idle connection, a new one while fewer than `size` are open, else the next one returned.
    fn take<'a>(&'a self, writer: &'a Mutex<Connection>) -> Reader<'a> {
        let nested = HELD_READERS.with(Cell::get) > 0;
        let mut st = self.lock();
        loop {
            if let Some(c) = st.idle.pop() {
                return Reader::new(self, Held::Pooled(c));
            }
            let pooled = st.opened < self.size;
            if pooled || nested {
                st.opened += usize::from(pooled);
                drop(st);
                return self.open_reader(pooled, writer);
            }
            st = self.freed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn open_reader<'a>(&'a self, pooled: bool, writer: &'a Mutex<Connection>) -> Reader<'a> {
        match self.open_one() {
            Ok(c) if pooled => Reader::new(self, Held::Pooled(c)),
            Ok(c) => Reader::new(self, Held::Extra(c)),
            Err(e) => {
                if pooled {
                    self.lock().opened -= 1;
                }
                // Reads still work through the writer; only their concurrency with writes is lost.
                tracing::error!(error = %e, path = %self.path.display(), "cannot open a read-only SQLite connection");
                Reader::new(self, Held::Writer(writer.lock().unwrap_or_else(|p| p.into_inner())))
            }
        }
    }

    fn give_back(&self, conn: Connection) {
        self.lock().idle.push(conn);
        self.freed.notify_one();
    }
}

enum Held<'a> {
    Pooled(Connection),
    Extra(Connection),
    Writer(MutexGuard<'a, Connection>),
}

/// A read-only connection from [`Store::reader`], returned to the pool when dropped. Not `Send`, like the
/// writer's guard: it counts towards this thread's held readers.
pub struct Reader<'a> {
    pool: &'a ReaderPool,
    held: Option<Held<'a>>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<'a> Reader<'a> {
    fn new(pool: &'a ReaderPool, held: Held<'a>) -> Self {
        HELD_READERS.with(|n| n.set(n.get() + 1));
        Reader { pool, held: Some(held), _not_send: std::marker::PhantomData }
    }
}

impl std::fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl std::ops::Deref for Reader<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        match self.held.as_ref() {
            Some(Held::Pooled(c) | Held::Extra(c)) => c,
            Some(Held::Writer(g)) => g,
            None => unreachable!("a reader's connection is only taken when it is dropped"),
        }
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        HELD_READERS.with(|n| n.set(n.get().saturating_sub(1)));
        if let Some(Held::Pooled(c)) = self.held.take() {
            self.pool.give_back(c);
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Collection {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub owner: String,
    pub approved_for_training: bool,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CollectionStats {
    #[serde(flatten)]
    pub collection: Collection,
    pub documents: u64,
    pub chunks: u64,
}

/// A chunk as the lexical index needs it.
#[derive(Debug, Clone)]
pub struct ChunkRow {
    pub chunk_id: i64,
    pub document_id: i64,
    pub collection: String,
    pub title: String,
    pub heading: String,
    pub text: String,
}

/// A chunk as search results show it.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkView {
    pub chunk_id: i64,
    pub document_id: i64,
    pub external_id: String,
    pub collection: String,
    pub title: String,
    pub source: String,
    pub heading: String,
    pub text: String,
    pub ordinal: i64,
    pub meta: crate::ingest::meta::DocMeta,
    /// Read from a scanned page by the OCR: which, and how surely.
    pub scan: Option<crate::ingest::scan::ScanOrigin>,
}

impl Store {
    /// One audit record in a transaction of its own, for what has no row of its own to commit with (a refused
    /// read, an export, a download).
    pub(crate) fn audit_record(&self, actor: &str, action: &str, detail: &serde_json::Value) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        crate::audit::append(&tx, actor, action, detail)?;
        tx.commit()?;
        Ok(())
    }

    /// Opens (creating if needed) the database and the audit key beside it, migrates, and re-chains an audit log
    /// written before the key existed.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, DEFAULT_READ_CONNECTIONS)
    }

    /// Like [`Store::open`], with `read_connections` read-only connections for [`Store::reader`] (at least one).
    pub fn open_with(path: &Path, read_connections: usize) -> Result<Self> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        let key = crate::audit::load_or_create_key(&dir)?;
        let mut conn = Connection::open(path)?;
        // Every write transaction takes the write lock when it begins, waiting its turn (busy_timeout): a deferred
        // one that read first failed at once with "database is locked" when another process (`care collection
        // file`, a restore) had written since its read, instead of waiting — searches' audit records among them.
        conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        restrict_to_owner(path)?;
        crate::audit::register_key(&conn, key)?;
        wait_for_lock(&mut conn)?;
        // WAL keeps readers (search) unblocked by the ingest writer; NORMAL sync is crash-safe for a killed
        // process, and the index recovery on open repairs anything a power loss drops.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let checkpointer = wal::Checkpointer::start(&mut conn, path)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        stable_plans(&conn)?;
        // Readers are opened on first use, which comes after the migration below: their schema caches and
        // prepared statements never predate it.
        let readers = ReaderPool::new(path, key, read_connections.max(1));
        let store = Store {
            conn: Arc::new(Mutex::new(conn)),
            readers,
            dir,
            audit: Default::default(),
            limits: Default::default(),
            audit_head_at_open: i64::MAX.into(),
            checkpointer,
        };
        store.migrate()?;
        crate::audit::ensure_keyed(&mut store.conn(), &store.dir)?;
        let head: i64 = store.conn().query_row("SELECT ifnull(max(id), 0) FROM audit", [], |r| r.get(0))?;
        store.audit_head_at_open.store(head, std::sync::atomic::Ordering::Relaxed);
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The one writer. Everything that writes, or must read inside a write transaction, goes through it.
    pub fn conn(&self) -> MutexGuard<'_, Connection> {
        // A poisoned lock only means another thread panicked mid-call; SQLite's own transaction state is intact.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A long write as a run of short transactions: `write` gets each batch of `items` (and its index) in a
    /// transaction of its own, and between batches the writer is left free for as long as the batch held it, so
    /// that searches' audit records, in this process or another (`care collection file` beside `care serve`),
    /// wait at most one batch instead of the whole write (SQLite's busy wait backs off, and a loop that takes the
    /// lock again at once would starve them).
    pub(crate) fn in_batches<T>(
        &self,
        items: &[T],
        size: usize,
        mut write: impl FnMut(&rusqlite::Transaction<'_>, &[T], usize) -> Result<()>,
    ) -> Result<()> {
        let batches: Vec<&[T]> = if items.is_empty() { vec![&[]] } else { items.chunks(size.max(1)).collect() };
        let last = batches.len() - 1;
        for (i, batch) in batches.into_iter().enumerate() {
            let held = std::time::Instant::now();
            {
                let mut conn = self.conn();
                let tx = conn.transaction()?;
                write(&tx, batch, i)?;
                tx.commit()?;
            }
            if i < last {
                std::thread::sleep(held.elapsed());
            }
        }
        Ok(())
    }

    /// The writer connection itself, for the engine's audit writer thread (`audit/writer.rs`), which locks it like
    /// [`Store::conn`] does.
    pub(crate) fn shared_writer(&self) -> Arc<Mutex<Connection>> {
        Arc::clone(&self.conn)
    }

    /// The same as [`Store::conn`], named for call sites that want to say so.
    pub fn writer(&self) -> MutexGuard<'_, Connection> {
        self.conn()
    }

    /// A read-only connection for reads that need no transaction with a write (search, session checks,
    /// listings). WAL gives each statement the latest committed snapshot without waiting for the writer, so a
    /// long ingest transaction does not hold up searches. Do not wait for the writer while holding one: the
    /// pool is small, and threads queued on the writer with readers in hand can starve the writer's holder.
    pub fn reader(&self) -> Reader<'_> {
        self.readers.take(&self.conn)
    }

    /// What opens a read-only connection of this store's own, for work that outlives a borrow of it.
    pub(crate) fn reader_opener(&self) -> ReaderOpener {
        ReaderOpener { path: self.readers.path.clone(), key: self.readers.key }
    }

    pub fn schema_version(&self) -> Result<u32> {
        Ok(self.reader().pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    fn migrate(&self) -> Result<()> {
        let mut conn = self.conn();
        let current: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let latest = latest_schema();
        if current > latest {
            return Err(Error::TooNew { what: "the metadata database".into(), found: current, supported: latest });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            after_migration(&tx, *version)?;
            tx.pragma_update(None, "user_version", version)?;
            tx.commit()?;
            tracing::info!(version, "applied metadata migration");
        }
        Ok(())
    }

    pub fn create_collection(&self, name: &str, description: &str, owner: &str) -> Result<Collection> {
        validate_collection_name(name)?;
        let conn = self.conn();
        let res = conn.execute(
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
        drop(conn);
        self.collection(name)
    }

    pub fn collection(&self, name: &str) -> Result<Collection> {
        self.reader()
            .prepare_cached(
                "SELECT id, name, description, owner, approved_for_training, created_at FROM collections WHERE name = ?1",
            )?
            .query_row([name], row_to_collection)
            .optional()?
            .ok_or_else(|| Error::UnknownCollection(name.into()))
    }

    /// External id → document id of a collection's live documents.
    pub fn document_external_ids(&self, collection_id: i64) -> Result<std::collections::HashMap<String, i64>> {
        let conn = self.reader();
        let mut stmt =
            conn.prepare("SELECT external_id, id FROM documents WHERE collection_id = ?1 AND state != 'deleting'")?;
        let rows = stmt.query_map([collection_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// A chunk of the collection and its document's external id, if the chunk is there.
    pub fn chunk_document(&self, collection_id: i64, chunk_id: i64) -> Result<Option<(i64, String)>> {
        Ok(self
            .reader()
            .prepare_cached(
                "SELECT c.id, d.external_id FROM chunks c JOIN documents d ON d.id = c.document_id \
                 WHERE c.id = ?1 AND d.collection_id = ?2",
            )?
            .query_row([chunk_id, collection_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// All collections without counts (cheap; the query path uses this).
    pub fn collection_list(&self) -> Result<Vec<Collection>> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT id, name, description, owner, approved_for_training, created_at FROM collections ORDER BY name",
        )?;
        let rows = stmt.query_map([], row_to_collection)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn collections(&self) -> Result<Vec<CollectionStats>> {
        let conn = self.reader();
        let mut stmt = conn.prepare(
            "SELECT c.id, c.name, c.description, c.owner, c.approved_for_training, c.created_at,
                    (SELECT COUNT(*) FROM documents d WHERE d.collection_id = c.id),
                    (SELECT COUNT(*) FROM chunks k JOIN documents d ON d.id = k.document_id WHERE d.collection_id = c.id)
             FROM collections c ORDER BY c.name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(CollectionStats {
                collection: row_to_collection(r)?,
                documents: r.get::<_, i64>(6)? as u64,
                chunks: r.get::<_, i64>(7)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Chunks of the given documents, for (re)indexing.
    pub fn chunks_of_documents(&self, doc_ids: &[i64]) -> Result<Vec<ChunkRow>> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT k.id, k.document_id, c.name, d.title, k.heading, k.text
             FROM chunks k JOIN documents d ON d.id = k.document_id JOIN collections c ON c.id = d.collection_id
             WHERE k.document_id = ?1 ORDER BY k.ordinal",
        )?;
        let mut out = Vec::new();
        for id in doc_ids {
            let rows = stmt.query_map([id], row_to_chunk)?;
            for r in rows {
                out.push(r?);
            }
        }
        Ok(out)
    }

    /// Every chunk of every indexed or pending document, streamed to `f` (for a full lexical rebuild).
    pub fn for_each_live_chunk(&self, mut f: impl FnMut(ChunkRow) -> Result<()>) -> Result<()> {
        let conn = self.reader();
        let mut stmt = conn.prepare(
            "SELECT k.id, k.document_id, c.name, d.title, k.heading, k.text
             FROM chunks k JOIN documents d ON d.id = k.document_id JOIN collections c ON c.id = d.collection_id
             WHERE d.state != 'deleting' ORDER BY k.id",
        )?;
        let rows = stmt.query_map([], row_to_chunk)?;
        for r in rows {
            f(r?)?;
        }
        Ok(())
    }

    pub fn documents_in_state(&self, state: &str) -> Result<Vec<i64>> {
        let conn = self.reader();
        let mut stmt = conn.prepare("SELECT id FROM documents WHERE state = ?1 ORDER BY id")?;
        let rows = stmt.query_map([state], |r| r.get(0))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn set_documents_state(&self, doc_ids: &[i64], state: &str) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached("UPDATE documents SET state = ?1 WHERE id = ?2")?;
            for id in doc_ids {
                stmt.execute(params![state, id])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn delete_documents(&self, doc_ids: &[i64]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached("DELETE FROM documents WHERE id = ?1")?;
            for id in doc_ids {
                stmt.execute([id])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Number of chunks whose documents the lexical index should hold.
    pub fn live_chunk_count(&self) -> Result<u64> {
        let n: i64 = self.reader().query_row(
            "SELECT COUNT(*) FROM chunks k JOIN documents d ON d.id = k.document_id WHERE d.state != 'deleting'",
            [],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Whether any chunk of `collections` newer than `after_chunk` contains `needle` in its text, heading or
    /// document title (ASCII case folded). A scan that stops at the first match: `TextPresence::contains` uses it when
    /// the collections' text is too large to keep in memory ([`texts::TextImage`]).
    pub fn any_chunk_contains(&self, needle: &str, collections: &[String], after_chunk: i64) -> Result<bool> {
        if collections.is_empty() || needle.is_empty() {
            return Ok(false);
        }
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!("SELECT EXISTS (SELECT 1 {})", containing(needle, collections)))?;
        let mut args: Vec<&dyn rusqlite::ToSql> = collections.iter().map(|c| c as &dyn rusqlite::ToSql).collect();
        args.extend([&after_chunk as &dyn rusqlite::ToSql, &needle, &needle, &needle]);
        Ok(stmt.query_row(args.as_slice(), |r| r.get::<_, bool>(0))?)
    }

    /// Whether a chunk of a document `admit` accepts, in `collections`, contains `needle` (the same test as
    /// [`Store::any_chunk_contains`]): for readers whom access lists restrict, so that the "not found" statement
    /// does not reveal words that only documents hidden from them hold. Stops at the first admitted match.
    pub fn any_admitted_chunk_contains(
        &self,
        needle: &str,
        collections: &[String],
        admit: impl Fn(i64) -> bool,
    ) -> Result<bool> {
        if collections.is_empty() || needle.is_empty() {
            return Ok(false);
        }
        let conn = self.reader();
        let mut stmt =
            conn.prepare_cached(&format!("SELECT DISTINCT k.document_id {}", containing(needle, collections)))?;
        let mut args: Vec<&dyn rusqlite::ToSql> = collections.iter().map(|c| c as &dyn rusqlite::ToSql).collect();
        // Every chunk id is above 0: all chunks.
        args.extend([&0i64 as &dyn rusqlite::ToSql, &needle, &needle, &needle]);
        let mut rows = stmt.query(args.as_slice())?;
        while let Some(r) = rows.next()? {
            if admit(r.get(0)?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The newest chunk id and the count of chunk rows ever deleted: equal stamps mean the same chunks.
    pub fn chunk_stamp(&self) -> Result<texts::ChunkStamp> {
        // Asked several times by every search (each term looked for in the text): a cached statement.
        Ok(self
            .reader()
            .prepare_cached(
                "SELECT (SELECT COALESCE(MAX(id), 0) FROM chunks), (SELECT deletions FROM chunk_state WHERE id = 1)",
            )?
            .query_row([], |r| Ok(texts::ChunkStamp { newest: r.get(0)?, deletions: r.get(1)? }))?)
    }

    /// Calls `f(chunk id, collection, [title, heading, text])` for every chunk newer than `after_chunk`, in id order,
    /// until it returns false.
    pub(crate) fn for_each_chunk_text(
        &self,
        after_chunk: i64,
        mut f: impl FnMut(i64, &str, [&str; 3]) -> bool,
    ) -> Result<()> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT k.id, c.name, d.title, k.heading, k.text FROM chunks k JOIN documents d ON d.id = k.document_id \
             JOIN collections c ON c.id = d.collection_id WHERE k.id > ?1 ORDER BY k.id",
        )?;
        let mut rows = stmt.query([after_chunk])?;
        while let Some(r) = rows.next()? {
            let (c, t, h, x): (String, String, String, String) = (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
            if !f(r.get(0)?, &c, [&t, &h, &x]) {
                break;
            }
        }
        Ok(())
    }

    pub fn chunk_views(&self, chunk_ids: &[i64]) -> Result<Vec<ChunkView>> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT k.id, k.document_id, d.external_id, c.name, d.title, d.source, k.heading, k.text, k.ordinal,
                    d.department, d.doc_type, d.doc_date, d.issuer, d.language, d.access, k.scan_page, k.scan_last_page,
                    k.scan_confidence
             FROM chunks k JOIN documents d ON d.id = k.document_id JOIN collections c ON c.id = d.collection_id
             WHERE k.id = ?1",
        )?;
        let mut out = Vec::with_capacity(chunk_ids.len());
        for id in chunk_ids {
            if let Some(v) = stmt
                .query_row([id], |r| {
                    Ok(ChunkView {
                        chunk_id: r.get(0)?,
                        document_id: r.get(1)?,
                        external_id: r.get(2)?,
                        collection: r.get(3)?,
                        title: r.get(4)?,
                        source: r.get(5)?,
                        heading: r.get(6)?,
                        text: r.get(7)?,
                        ordinal: r.get(8)?,
                        meta: crate::ingest::meta::DocMeta {
                            department: r.get(9)?,
                            doc_type: r.get(10)?,
                            date: r.get(11)?,
                            issuer: r.get(12)?,
                            language: r.get(13)?,
                            access: r.get(14)?,
                        },
                        scan: crate::ingest::scan::ScanOrigin::from_columns(r.get(15)?, r.get(16)?, r.get(17)?),
                    })
                })
                .optional()?
            {
                out.push(v);
            }
        }
        Ok(out)
    }
}

fn row_to_collection(r: &rusqlite::Row<'_>) -> rusqlite::Result<Collection> {
    Ok(Collection {
        id: r.get(0)?,
        name: r.get(1)?,
        description: r.get(2)?,
        owner: r.get(3)?,
        approved_for_training: r.get::<_, i64>(4)? != 0,
        created_at: r.get(5)?,
    })
}

fn row_to_chunk(r: &rusqlite::Row<'_>) -> rusqlite::Result<ChunkRow> {
    Ok(ChunkRow {
        chunk_id: r.get(0)?,
        document_id: r.get(1)?,
        collection: r.get(2)?,
        title: r.get(3)?,
        heading: r.get(4)?,
        text: r.get(5)?,
    })
}

/// Collection names appear in URLs, CLI arguments and index terms; keep them simple and unambiguous.
pub fn validate_collection_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.chars().count() <= 64
        && name.chars().all(|c| c.is_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("资料库名称 {name:?} 不可用：请用 1–64 个字母、数字、- 或 _（不能以 - 开头）")))
    }
}

impl crate::audit::LogStore for Store {
    fn writer(&self) -> MutexGuard<'_, Connection> {
        self.conn()
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
    fn monitor(&self) -> &crate::audit::Monitor {
        &self.audit
    }
    fn as_dyn(&self) -> &dyn crate::audit::LogStore {
        self
    }
}

/// `FROM … WHERE …` of the chunks of `collections` newer than a chunk id (the first parameter after the
/// collections' names) whose text, heading or document title contains the needle (the next three parameters),
/// ASCII case folded. lower() copies every text it reads; a needle without ASCII letters (most Chinese terms)
/// needs no folding and the scan reads the texts in place.
fn containing(needle: &str, collections: &[String]) -> String {
    let marks = vec!["?"; collections.len()].join(",");
    let col = |c: &str| if needle.bytes().any(|b| b.is_ascii_alphabetic()) { format!("lower({c})") } else { c.into() };
    format!(
        "FROM chunks k JOIN documents d ON d.id = k.document_id JOIN collections c ON c.id = d.collection_id \
         WHERE c.name IN ({marks}) AND k.id > ? AND (instr({}, ?) > 0 OR instr({}, ?) > 0 OR instr({}, ?) > 0)",
        col("k.text"),
        col("k.heading"),
        col("d.title")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_stored_before_languages_get_theirs_from_their_passages() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("care.sqlite");
        {
            let conn = rusqlite::Connection::open(&p).unwrap();
            for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v < 20) {
                conn.execute_batch(sql).unwrap();
                conn.pragma_update(None, "user_version", v).unwrap();
            }
            conn.execute_batch(
                "INSERT INTO collections (id, name, created_at) VALUES (1, 'c', 't');
                 INSERT INTO documents (id, collection_id, external_id, content_hash, created_at)
                   VALUES (1, 1, 'zh', 'h', 't'), (2, 1, 'en', 'h', 't'), (3, 1, 'none', 'h', 't');
                 INSERT INTO chunks (document_id, ordinal, text, char_start, char_end) VALUES
                   (1, 0, '二甲双胍禁用于严重肾功能不全（eGFR<30）。', 0, 1),
                   (2, 0, 'Metformin is contraindicated in severe renal impairment.', 0, 1);",
            )
            .unwrap();
        }
        let s = Store::open(&p).unwrap();
        let langs: Vec<(String, String)> = {
            let conn = s.reader();
            let mut stmt = conn.prepare("SELECT external_id, language FROM documents ORDER BY id").unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        };
        let want = [("zh", "中文"), ("en", "英文"), ("none", "")].map(|(a, b)| (a.to_string(), b.to_string()));
        assert_eq!(langs, want);
    }

    #[test]
    fn migrates_and_refuses_newer_schema() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("care.sqlite");
        let s = Store::open(&p).unwrap();
        assert_eq!(s.schema_version().unwrap(), latest_schema());
        s.create_collection("demo", "", "admin").unwrap();
        assert!(matches!(s.create_collection("demo", "", ""), Err(Error::CollectionExists(_))));
        drop(s);
        // Reopening is a no-op and keeps data.
        let s = Store::open(&p).unwrap();
        assert_eq!(s.collections().unwrap().len(), 1);
        s.conn().pragma_update(None, "user_version", latest_schema() + 1).unwrap();
        drop(s);
        let err = Store::open(&p).unwrap_err();
        assert!(matches!(err, Error::TooNew { .. }), "{err}");
    }

    #[test]
    fn readers_are_pooled_and_nest_without_waiting() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open_with(&t.path().join("care.sqlite"), 1).unwrap();
        s.create_collection("a", "", "admin").unwrap();
        let outer = s.reader();
        // The only pooled connection is taken: a nested read on the same thread gets a connection of its own.
        assert_eq!(s.collection_list().unwrap().len(), 1);
        drop(outer);
        let held = s.reader();
        std::thread::scope(|sc| {
            let other = sc.spawn(|| s.collection("a").map(|c| c.name));
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(!other.is_finished(), "another thread waits for the pool rather than opening more");
            drop(held);
            assert_eq!(other.join().unwrap().unwrap(), "a");
        });
        assert!(s.reader().execute("DELETE FROM collections", []).is_err(), "readers are read-only");
        let mac: String = s.reader().query_row("SELECT care_audit_mac('x')", [], |r| r.get(0)).unwrap();
        assert_eq!(mac.len(), 64, "the audit key is registered on readers");
    }

    #[test]
    fn collection_names_are_validated() {
        assert!(validate_collection_name("kuake_qtr").is_ok());
        assert!(validate_collection_name("内科-指南").is_ok());
        assert!(validate_collection_name("../etc").is_err());
        assert!(validate_collection_name("").is_err());
        assert!(validate_collection_name("a b").is_err());
    }
}
