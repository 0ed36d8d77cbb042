//! The snapshot a backup archives: the data directory as it was at one moment, in a hidden staging folder inside
//! it (`.backup-PID-N`, removed when the snapshot is dropped, or by the next backup after a crash).
//!
//! While the engine's writes wait (its write lock: ingestion batches, deletions, vector imports), the metadata
//! database is copied with `VACUUM INTO` from a read-only connection of its own (searches keep reading, the audit
//! writer keeps writing: WAL), and the indexes are hard-linked. Tantivy and Lance never change a file in place:
//! they write new files and switch to them (tantivy's `meta.json`, Lance's version manifests), so the links keep
//! the files as they were even if a merge or a clean-up removes them a second later. Manifests are linked before
//! the files they name, so every version linked has its files. The models are hard-linked too (a package is
//! written once, then renamed into place). What could not be linked (another file system) is copied.
//!
//! After the writes resume, the copy's audit anchor is written for the copy itself (the live anchor may already
//! be ahead of it), and the staged lexical index is opened to check that it is whole and agrees with the copy.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::archive::BackupInfo;
use crate::error::{Error, Result};

const STAGING: &str = ".backup-";

pub(crate) struct Snapshot {
    /// The staging folder, removed with the snapshot.
    _staging: Staging,
    pub(crate) info: BackupInfo,
    /// (path inside the archive, staged file), metadata first.
    pub(crate) files: Vec<(String, PathBuf)>,
    pub(crate) writes_paused_ms: u64,
}

/// A staging folder of this process's own, removed when dropped: at the end of the backup, or at a failure on the
/// way there.
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The folders whose files are linked, in order; within each, manifests first.
const LINKED: [&str; 5] = ["lexical", "dense", "models", "tls", "uploads"];

/// Files that belong to a running process, not to the data: locks, sockets, a model import's staging.
fn skipped(rel: &Path) -> bool {
    rel.components().any(|c| {
        let s = c.as_os_str().to_string_lossy();
        s == ".locks"
            || s.starts_with(crate::datadir::IMPORT_STAGING)
            || (s.starts_with(".tantivy-") && s.ends_with(".lock"))
    })
}

/// Files under `root` (relative), manifests and index metadata first: a file written later than the listing of
/// its folder is not linked, and a manifest linked earlier than its data files only names files that existed then.
fn files_under(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for e in entries {
            let e = e.map_err(|err| Error::io(&dir, err))?;
            let r = rel.join(e.file_name());
            if skipped(&r) {
                continue;
            }
            let t = e.file_type().map_err(|err| Error::io(e.path(), err))?;
            if t.is_dir() {
                stack.push(r);
            } else if t.is_file() {
                out.push(r);
            }
        }
    }
    let first = |p: &PathBuf| {
        let s = p.to_string_lossy();
        !(s.contains("_versions/") || s.ends_with("meta.json") || s.ends_with(".managed.json"))
    };
    out.sort_by_key(|p| (first(p), p.clone()));
    Ok(out)
}

/// Links `src` to `dst`, or copies it when a link cannot be made (another file system).
fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    match std::fs::hard_link(src, dst) {
        Ok(()) => Ok(()),
        // Gone between the listing and the link: a clean-up removed a file no version needs any more.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => match std::fs::copy(src, dst) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(dst, e)),
        },
    }
}

/// A folder of this process's own inside the data directory (the links must be on its file system). Staging
/// folders of processes that are gone are removed first.
fn staging_dir(root: &Path) -> Result<PathBuf> {
    crate::datadir::remove_orphans(root, |n| n.strip_prefix(STAGING).and_then(|r| r.split('-').next()), "snapshot");
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = root.join(format!("{STAGING}{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut b = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

impl Snapshot {
    pub(crate) fn take(e: &super::BackupMaker<'_>) -> Result<Snapshot> {
        let root = e.dir.root().to_path_buf();
        let staging = Staging(staging_dir(&root)?);
        let dir = staging.0.as_path();
        let sqlite = dir.join("care.sqlite");
        // Room for the database's copy on the data disk, above the reserve kept for searching.
        let db_bytes = [e.dir.sqlite(), root.join("care.sqlite-wal")]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum::<u64>();
        e.dir.ensure_free(e.cfg.disk_reserve_bytes(), "备份时复制元数据库", db_bytes)?;
        let paused = Instant::now();
        {
            let _w = e.write_lock.lock().unwrap_or_else(|p| p.into_inner());
            let conn = rusqlite::Connection::open_with_flags(
                e.dir.sqlite(),
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            conn.busy_timeout(std::time::Duration::from_secs(30))?;
            conn.execute("VACUUM INTO ?1", [sqlite.to_string_lossy().as_ref()])?;
            for folder in LINKED {
                for rel in files_under(&root.join(folder))? {
                    link_or_copy(&root.join(folder).join(&rel), &dir.join(folder).join(&rel))?;
                }
            }
        }
        let writes_paused_ms = paused.elapsed().as_millis() as u64;
        for small in ["VERSION", crate::audit::KEY_FILE, "user_dict.txt"] {
            let src = root.join(small);
            if src.exists() {
                std::fs::copy(&src, dir.join(small)).map_err(|err| Error::io(&src, err))?;
            }
        }
        // Described first: describing writes the copy's audit anchor, which the list then holds.
        let described = describe(dir, e)?;
        let files = list(dir)?;
        let info = BackupInfo {
            files: files.len() as u64,
            data_bytes: files.iter().filter_map(|(_, p)| std::fs::metadata(p).ok()).map(|m| m.len()).sum(),
            ..described
        };
        Ok(Snapshot { _staging: staging, info, files, writes_paused_ms })
    }
}

/// Opens the copy staged in `dir` (with the audit key, to write its anchor) and says what it holds; the file count
/// and size are the caller's, once the files are listed.
fn describe(dir: &Path, e: &super::BackupMaker<'_>) -> Result<BackupInfo> {
    let conn = rusqlite::Connection::open(dir.join("care.sqlite"))?;
    let key = crate::audit::load_or_create_key(dir)?;
    crate::audit::register_key(&conn, key)?;
    crate::audit::anchor_snapshot(&conn, dir)?;
    // The backup running now is this one, done by the time the archive exists; backups still queued are the
    // source's business, not a restored machine's.
    conn.execute_batch(
        "UPDATE jobs SET state = 'done', stage = '' WHERE kind = 'backup.create' AND state = 'running';
         UPDATE jobs SET state = 'cancelled', stage = '' WHERE kind = 'backup.create' AND state = 'queued';",
    )?;
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).map(|n| n.max(0) as u64);
    let chunks =
        count("SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.state = 'indexed'")?;
    let schema_version: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let collections = count("SELECT count(*) FROM collections")?;
    let documents = count("SELECT count(*) FROM documents")?;
    let audit_head = count("SELECT ifnull(max(id), 0) FROM audit")? as i64;
    drop(conn);
    // The staged index must open and hold the copy's chunks; a merge that raced the links would show here.
    let in_index = staged_lexical_docs(&dir.join("lexical").join(format!("v{}", crate::lexical::LEXICAL_FORMAT)))?;
    if in_index != chunks {
        tracing::warn!(in_index, chunks, "the staged lexical index differs from the copy; a restore rebuilds it");
    }
    let info = BackupInfo {
        format: super::archive::FORMAT,
        created_at: crate::audit::now(),
        appliance_version: env!("CARGO_PKG_VERSION").to_string(),
        layout_version: crate::datadir::LAYOUT_VERSION,
        schema_version,
        collections,
        documents,
        chunks,
        live_pair: e.retrieval.active_models()?.map(|p| crate::lifecycle::pair_spec(&p)),
        audit_head,
        data_bytes: 0,
        files: 0,
    };
    Ok(info)
}

/// The staged files in `dir` as the archive names them: the database and keys first.
fn list(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut files = Vec::new();
    for small in ["VERSION", "care.sqlite", crate::audit::KEY_FILE, crate::audit::ANCHOR_FILE, "user_dict.txt"] {
        let p = dir.join(small);
        if p.exists() {
            files.push((small.to_string(), p));
        }
    }
    for folder in LINKED {
        for rel in files_under(&dir.join(folder))? {
            let name = format!("{folder}/{}", rel.to_string_lossy());
            files.push((name, dir.join(folder).join(rel)));
        }
    }
    Ok(files)
}

/// Documents in the staged lexical index, opened read-only as tantivy stores it (no writer, nothing written).
fn staged_lexical_docs(dir: &Path) -> Result<u64> {
    if !dir.join("meta.json").exists() {
        return Ok(0);
    }
    let index = tantivy::Index::open_in_dir(dir)?;
    Ok(index.reader()?.searcher().num_docs())
}
