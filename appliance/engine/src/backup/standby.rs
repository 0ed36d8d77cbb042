//! A standby appliance: a copy of a primary's data directory, restored from the primary's newest backup and
//! replaced by the next one, serving search read-only until an administrator promotes it.
//!
//! `care standby` (the CLI) pulls the backups with a token that opens only them, restores each new one beside the
//! live copy and switches; this module is what both sides read: the marker a standby's data directory carries
//! (`standby.json`: where its data came from, how old it is, when the primary was last asked), and the lag the
//! overview shows. A data directory with the marker is served read-only; promoting removes it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The marker's file name in the data directory. Never in a backup: the snapshot copies named parts only.
pub const MARKER: &str = "standby.json";

/// What a standby's data directory says of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StandbyState {
    /// The primary's address (`https://…`).
    pub primary: String,
    /// The archive the data was restored from, and when the primary made it (UTC).
    pub archive: String,
    pub archive_created_at: String,
    /// When it was restored here, and how long the restore took.
    pub restored_at: String,
    pub restore_seconds: f64,
    /// When the primary was last asked for a newer backup, and what went wrong then, if anything.
    pub checked_at: String,
    #[serde(default)]
    pub last_error: Option<String>,
}

impl StandbyState {
    /// Minutes between the primary's backup and now: how far behind the primary this copy may be.
    pub fn lag_minutes(&self) -> Option<i64> {
        let made =
            time::OffsetDateTime::parse(&self.archive_created_at, &time::format_description::well_known::Rfc3339)
                .ok()?;
        Some((time::OffsetDateTime::now_utc() - made).whole_minutes().max(0))
    }
}

/// The marker of `data_dir`, if it is a standby's.
pub fn read(data_dir: &Path) -> Option<StandbyState> {
    let text = std::fs::read_to_string(data_dir.join(MARKER)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes the marker whole (a temporary file renamed over it), so a reader never sees half of one.
pub fn write(data_dir: &Path, s: &StandbyState) -> Result<()> {
    let path = data_dir.join(MARKER);
    let tmp = data_dir.join(format!(".{MARKER}.{}", std::process::id()));
    let json = serde_json::to_vec_pretty(s).map_err(|e| Error::Internal(format!("standby marker: {e}")))?;
    std::fs::write(&tmp, json).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
}

/// The refusal of a write on a standby, naming the way forward.
pub fn refusal(s: &StandbyState) -> Error {
    Error::ReadOnly(format!(
        "这是备用机（只读），数据来自主机 {} 的备份 {}；请在主机上操作，或在备用机上运行 care standby promote 使其成为主机",
        s.primary, s.archive
    ))
}

impl crate::engine::Backups<'_> {
    /// Makes this standby's copy a primary's: audited in the copy's log, then the marker goes (a `care standby`
    /// following it restarts its server as a primary).
    pub fn promote(&self, actor: &crate::accounts::Admin, s: &StandbyState) -> Result<()> {
        let detail = serde_json::json!({"primary": s.primary, "archive": s.archive,
            "archive_created_at": s.archive_created_at});
        self.store.audit_record(&actor.name, "standby.promote", &detail)?;
        let path = self.dir.root().join(MARKER);
        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))
    }
}
