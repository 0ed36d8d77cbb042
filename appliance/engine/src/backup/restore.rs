//! Restoring an archive onto an empty data directory (a new machine, or a new disk).
//!
//! The archive is read once, every byte checked as it streams (see [`super::archive`]), into a hidden folder beside
//! the target (`.NAME.restore-PID`); only when the manifest has matched every file is that folder renamed to the
//! target. So a damaged archive, a full disk or a `kill -9` half-way leaves the target as it was (absent or
//! empty) and a hidden folder the next restore removes. An archive from a newer version is refused on its first
//! kilobytes; an older one is migrated when the restored directory is opened. Then the restored directory is
//! checked as `care check` does, the audit chain verified in full, and the restore recorded in its audit log.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::archive::{self, BackupInfo, BackupKey};
use crate::accounts::Admin;
use crate::config::EngineConfig;
use crate::engine::{ConsistencyReport, Engine, OpenMode};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    pub data_dir: PathBuf,
    pub info: BackupInfo,
    pub files: usize,
    pub bytes: u64,
    /// The schema the archive had, when it was older than this version's (the restore migrated it).
    pub migrated_from: Option<u32>,
    pub check: ConsistencyReport,
    pub audit_records_checked: u64,
    pub seconds: f64,
}

fn is_empty_dir(p: &Path) -> Result<bool> {
    match std::fs::read_dir(p) {
        Ok(mut it) => Ok(it.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(p, e)),
    }
}

/// Refuses an archive this version cannot read, before any file is written.
fn readable_here(archive: &Path, info: &BackupInfo) -> Result<()> {
    let newer = |what: &str, found: u32, supported: u32| {
        Error::InvalidInput(format!(
            "备份 {} 来自更新的版本（care {}，{what} {found}，本机只支持到 {supported}）；请先把本机升级到 care {} 或更新版本再恢复",
            archive.display(),
            info.appliance_version,
            info.appliance_version
        ))
    };
    if info.layout_version > crate::datadir::LAYOUT_VERSION {
        return Err(newer("数据目录格式", info.layout_version, crate::datadir::LAYOUT_VERSION));
    }
    let latest = crate::store::latest_schema();
    if info.schema_version > latest {
        return Err(newer("元数据库版本", info.schema_version, latest));
    }
    Ok(())
}

/// Restores `archive` into `cfg.storage.data_dir`, which must be empty or absent, then opens it (migrating an
/// older backup), checks it and records the restore as `actor` in its audit log.
pub fn restore(archive: &Path, cfg: &EngineConfig, key: Option<&BackupKey>, actor: &str) -> Result<RestoreReport> {
    let started = Instant::now();
    let target = cfg.storage.data_dir.clone();
    if !is_empty_dir(&target)? {
        return Err(Error::InvalidInput(format!(
            "数据目录 {} 不是空的；恢复只写入空目录（如新机器的 /var/lib/care），以免覆盖现有数据。请换一个空目录，或确认不再需要后移走现有目录",
            target.display()
        )));
    }
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "care".into());
    let parent = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    remove_stale(&parent, &name);
    let staging = parent.join(format!(".{name}.restore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let mut b = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&staging).map_err(|e| Error::io(&staging, e))?;
    let extracted = extract(archive, &staging, key);
    let (info, files, bytes) = extracted.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&staging);
    })?;
    if target.exists() {
        std::fs::remove_dir(&target).map_err(|e| Error::io(&target, e))?;
    }
    std::fs::rename(&staging, &target).map_err(|e| Error::io(&target, e))?;
    crate::audit::sync_dir(&parent);
    tracing::info!(archive = %archive.display(), data_dir = %target.display(), files, "backup extracted");

    let migrated_from = (info.schema_version < crate::store::latest_schema()).then_some(info.schema_version);
    let engine = Engine::open(cfg.clone(), OpenMode::Existing)?;
    let check = engine.indexer().check()?;
    let verified = engine.audit().verify(&Admin::system(), true)?;
    let detail = serde_json::json!({
        "archive": archive, "created_at": info.created_at, "from_version": info.appliance_version,
        "migrated_from_schema": migrated_from, "files": files, "consistent": check.consistent,
    });
    engine.store.audit_record(actor, "backup.restore", &detail)?;
    Ok(RestoreReport {
        data_dir: target,
        info,
        files,
        bytes,
        migrated_from,
        check,
        audit_records_checked: verified.records_checked,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the archive's files under `staging`, each synced; returns what it held.
fn extract(archive: &Path, staging: &Path, key: Option<&BackupKey>) -> Result<(BackupInfo, usize, u64)> {
    let mut bytes = 0u64;
    let (info, manifest) = archive::read(
        archive,
        key,
        |info| readable_here(archive, info),
        |rel, data| {
            let dst = staging.join(rel);
            if let Some(p) = dst.parent() {
                std::fs::create_dir_all(p).map_err(|e| Error::io(p, e))?;
            }
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&dst).map_err(|e| Error::io(&dst, e))?;
            bytes += std::io::copy(data, &mut f).map_err(|e| match e.kind() {
                std::io::ErrorKind::Other | std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
                    archive::damaged(archive, e)
                }
                _ => Error::io(&dst, e),
            })?;
            f.flush().and_then(|()| f.sync_all()).map_err(|e| Error::io(&dst, e))
        },
    )?;
    Ok((info, manifest.len(), bytes))
}

/// Removes hidden folders of restores into `name` whose process is gone.
fn remove_stale(parent: &Path, name: &str) {
    let prefix = format!(".{name}.restore-");
    crate::datadir::remove_orphans(parent, |n| n.strip_prefix(prefix.as_str()), "restore");
}
