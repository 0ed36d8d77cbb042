//! `audit.anchor`: the id and hash of the newest verified record, MACed with the audit key and kept outside
//! care.sqlite, so cutting records off the end and moving `audit_head` back is noticed. Its id is also copied into
//! `audit_key.anchor_id`, so deleting the file is noticed too.

use std::io::Write;
use std::path::Path;

use rusqlite::Connection;
use serde::{Deserialize, Serialize};

use super::key;
use crate::error::{Error, Result};

pub const ANCHOR_FILE: &str = "audit.anchor";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anchor {
    pub id: i64,
    pub hash: String,
    pub at: String,
    pub mac: String,
}

fn mac_text(id: i64, hash: &str, at: &str) -> String {
    format!("audit.anchor\u{1f}{id}\u{1f}{hash}\u{1f}{at}\u{1f}")
}

fn tampered(id: i64, reason: impl Into<String>) -> Error {
    Error::AuditTampered { id, reason: reason.into() }
}

/// The anchor in force: `None` when none was ever written. A missing file the database says was written, an
/// older file than the database recorded, or a file whose MAC does not match are reported as tampering.
pub(crate) fn load(conn: &Connection, dir: &Path) -> Result<Option<Anchor>> {
    let copy: i64 = conn.query_row("SELECT anchor_id FROM audit_key WHERE singleton = 1", [], |r| r.get(0))?;
    let path = dir.join(ANCHOR_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && copy == 0 => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(tampered(copy, format!("{ANCHOR_FILE}, which confirmed records through {copy}, was deleted")));
        }
        Err(e) => return Err(Error::io(&path, e)),
    };
    let a: Anchor = serde_json::from_str(&text)
        .map_err(|e| tampered(copy, format!("{ANCHOR_FILE} is not a valid anchor ({e}); it was altered")))?;
    if key::mac(conn, &mac_text(a.id, &a.hash, &a.at))? != a.mac {
        return Err(tampered(a.id, format!("{ANCHOR_FILE} was altered or made without this appliance's audit.key")));
    }
    // A file newer than the copy is a crash between writing the file and updating the copy; older is a rollback.
    if a.id < copy {
        return Err(tampered(
            a.id,
            format!("{ANCHOR_FILE} was replaced by an older one (through {}, the database recorded {copy})", a.id),
        ));
    }
    Ok(Some(a))
}

/// Moves the anchor forward to `(id, hash)`: the file first (temporary file, fsync, rename, fsync of the folder),
/// then the copy in the database, so a crash in between leaves a file ahead of the copy, which `load` accepts. The
/// immediate transaction orders this against another process (the CLI beside the server) moving it too, so neither
/// moves it back.
pub(crate) fn store(conn: &mut Connection, dir: &Path, id: i64, hash: &str) -> Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let copy: i64 = tx.query_row("SELECT anchor_id FROM audit_key WHERE singleton = 1", [], |r| r.get(0))?;
    if copy >= id {
        return Ok(());
    }
    let at = super::now();
    let a = Anchor { id, hash: hash.to_string(), mac: key::mac(&tx, &mac_text(id, hash, &at))?, at };
    let path = dir.join(ANCHOR_FILE);
    let tmp = dir.join(format!(".{ANCHOR_FILE}.{}.tmp", std::process::id()));
    let json = serde_json::to_vec(&a).map_err(|e| Error::Internal(format!("audit anchor: {e}")))?;
    write_synced(&tmp, &json).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    sync_dir(dir);
    tx.execute("UPDATE audit_key SET anchor_id = ?1 WHERE singleton = 1", [id])?;
    tx.commit()?;
    // The journal keeps a trail of the chain's head outside this box's files, for the case the anchor cannot cover.
    tracing::info!(id, hash, "audit anchor moved");
    Ok(())
}

/// Writes into `dir` the anchor a copy of the database on `conn` (a backup's snapshot) needs: the record its
/// `audit_key.anchor_id` names, MACed with the key registered on `conn`, so the copy's chain verifies on its own.
/// Nothing is written when no anchor was ever written.
pub(crate) fn anchor_snapshot(conn: &Connection, dir: &Path) -> Result<()> {
    let id: i64 = conn.query_row("SELECT anchor_id FROM audit_key WHERE singleton = 1", [], |r| r.get(0))?;
    if id == 0 {
        return Ok(());
    }
    use rusqlite::OptionalExtension;
    let hash: Option<String> = conn.query_row("SELECT hash FROM audit WHERE id = ?1", [id], |r| r.get(0)).optional()?;
    // Retention may have purged the anchored record; the purge keeps the hash it ended on.
    let hash = match hash {
        Some(h) => h,
        None => conn.query_row(
            "SELECT purged_through_hash FROM audit_anchor WHERE singleton = 1 AND purged_through_id = ?1",
            [id],
            |r| r.get(0),
        )?,
    };
    let at = super::now();
    let a = Anchor { id, mac: key::mac(conn, &mac_text(id, &hash, &at))?, hash, at };
    let json = serde_json::to_vec(&a).map_err(|e| Error::Internal(format!("audit anchor: {e}")))?;
    let path = dir.join(ANCHOR_FILE);
    write_synced(&path, &json).map_err(|e| Error::io(&path, e))
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Makes a rename durable. Best effort: not every platform can open a folder for syncing.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
