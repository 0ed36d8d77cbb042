//! The data directory (default `/var/lib/care`) and its layout version.
//!
//! ```text
//! VERSION            layout version (this file)
//! care.sqlite        metadata, the source of truth
//! audit.key          the audit log's MAC key (kept out of care.sqlite; back it up with it)
//! audit.anchor       the newest verified audit record, MACed (catches a truncated log)
//! lexical/v1/        tantivy index (derived; rebuilt from SQLite when its format or dictionary changes)
//! dense/             LanceDB tables per collection and document-encoder version
//! models/            model packages
//! uploads/           files waiting to be ingested
//! tls/               self-signed certificate made on first start
//! user_dict.txt      the admin's additions to the medical dictionary
//! ```

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub const LAYOUT_VERSION: u32 = 1;

/// Creates `dir` (and missing parents) readable by the appliance's own user only: it holds patient-adjacent
/// queries, the audit log and keys.
fn create_private_dir(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir).map_err(|e| Error::io(dir, e))
}

#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

/// A model import stages its copy in `models/.import-PID-N` and renames it into place; a folder whose process is
/// gone is a crash's leftover.
pub(crate) const IMPORT_STAGING: &str = ".import-";

impl DataDir {
    /// Refuses `what`, which would write about `incoming` bytes to the data disk, when that would leave less than
    /// `reserve` free ([`crate::config::EngineConfig::disk_reserve_bytes`]): a full disk fails every write (audit
    /// records, so sign-ins and searches too), so uploads and imports stop at the reserve instead of at zero. Free
    /// space that cannot be measured is no reason to refuse.
    pub(crate) fn ensure_free(&self, reserve: u64, what: &str, incoming: u64) -> Result<()> {
        let Ok((_, available)) = free_bytes(self.root()) else { return Ok(()) };
        if available < incoming.saturating_add(reserve) {
            return Err(Error::NoSpace { what: what.to_string(), needed: incoming, available, reserve });
        }
        Ok(())
    }

    /// Where model imports take their per-`name@version` locks ([`crate::lifecycle`]).
    pub(crate) fn import_locks(&self) -> PathBuf {
        self.models().join(".locks")
    }

    /// Removes staging folders of model imports whose process is gone (a crash between copy and rename), and makes
    /// the locks folder, so that an import, refused or not, adds nothing else to `models/`.
    pub(crate) fn remove_stale_imports(&self) {
        if let Err(e) = std::fs::create_dir_all(self.import_locks()) {
            tracing::warn!(error = %e, "could not make the model import locks folder");
        }
        remove_orphans(
            &self.models(),
            |n| n.strip_prefix(IMPORT_STAGING).and_then(|r| r.split('-').next()),
            "model import",
        );
    }

    /// Opens an existing data directory, or creates it when `create` is set.
    pub fn open(root: &Path, create: bool) -> Result<Self> {
        let version_file = root.join("VERSION");
        if !version_file.exists() {
            if !create {
                return Err(Error::NotFound {
                    what: format!("data directory {} (run `care init` first)", root.display()),
                });
            }
            create_private_dir(root)?;
            let tmp = root.join(".VERSION.tmp");
            std::fs::write(&tmp, format!("{LAYOUT_VERSION}\n")).map_err(|e| Error::io(&tmp, e))?;
            std::fs::rename(&tmp, &version_file).map_err(|e| Error::io(&version_file, e))?;
        }
        let text = std::fs::read_to_string(&version_file).map_err(|e| Error::io(&version_file, e))?;
        let found: u32 = text.trim().parse().map_err(|_| {
            Error::InvalidInput(format!(
                "数据目录版本文件 {} 内容不是版本号 (not a layout version number): {text:?}",
                version_file.display()
            ))
        })?;
        if found > LAYOUT_VERSION {
            return Err(Error::TooNew {
                what: format!("data directory {}", root.display()),
                found,
                supported: LAYOUT_VERSION,
            });
        }
        let dir = DataDir { root: root.to_path_buf() };
        for sub in ["lexical", "dense", "models", "uploads", "tls"] {
            let p = dir.root.join(sub);
            if !p.exists() {
                create_private_dir(&p)?;
            }
        }
        Ok(dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn sqlite(&self) -> PathBuf {
        self.root.join("care.sqlite")
    }
    pub fn lexical(&self) -> PathBuf {
        self.root.join("lexical")
    }
    pub fn dense(&self) -> PathBuf {
        self.root.join("dense")
    }
    pub fn models(&self) -> PathBuf {
        self.root.join("models")
    }
    pub fn tls(&self) -> PathBuf {
        self.root.join("tls")
    }
    pub fn user_dict(&self) -> PathBuf {
        self.root.join("user_dict.txt")
    }
}

/// Bytes an unprivileged writer may still use on the file system of `path`, measured at its nearest existing
/// ancestor (a data directory not created yet is judged by the disk it will be created on), with that ancestor.
pub fn free_bytes(path: &Path) -> std::io::Result<(PathBuf, u64)> {
    let at = path.ancestors().find(|p| p.exists()).unwrap_or(path).to_path_buf();
    let st = nix::sys::statvfs::statvfs(&at)?;
    Ok((at, st.blocks_available() as u64 * st.fragment_size() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_layout_and_refuses_newer() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("data");
        assert!(matches!(DataDir::open(&root, false), Err(Error::NotFound { .. })));
        let d = DataDir::open(&root, true).unwrap();
        assert!(d.lexical().is_dir() && d.models().is_dir());
        std::fs::write(root.join("VERSION"), "99\n").unwrap();
        let err = DataDir::open(&root, false).unwrap_err();
        assert!(err.to_string().contains("格式版本为 99"), "{err}");
    }
}

/// Removes what processes that are gone left in `dir`: `pid_of` reads the process id an entry's name carries
/// (`None`: not a leftover of this kind); files and folders alike. Each writer of a half-made thing (a backup, a
/// restore, a snapshot, a model import) names it with its process id, and the next one clears up after a crash.
pub(crate) fn remove_orphans(dir: &Path, pid_of: impl Fn(&str) -> Option<&str>, what: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = pid_of(&name).filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            tracing::info!(entry = %name, "removing the leftover of an interrupted {what}");
            let path = e.path();
            let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        }
    }
}
