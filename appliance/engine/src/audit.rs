//! The audit log: append-only records, each hash-chained to the previous one.
//!
//! `hash = sha256(prev_hash ‖ id ‖ at ‖ actor ‖ action ‖ detail)` with unit separators between fields, so an edited
//! field changes that record's hash and a removed record breaks the next record's `prev_hash` link. The newest
//! record's id and hash are also kept in `audit_head`, updated in the same transaction, which catches a removed tail.
//! Callers append inside the transaction that makes the change, so a change and its record commit together.

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::store::now;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditRecord {
    pub id: i64,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub detail: serde_json::Value,
    pub prev_hash: String,
    pub hash: String,
}

fn record_hash(prev_hash: &str, id: i64, at: &str, actor: &str, action: &str, detail: &str) -> String {
    let mut h = Sha256::new();
    for part in [prev_hash, &id.to_string(), at, actor, action, detail] {
        h.update(part.as_bytes());
        h.update([0x1f]);
    }
    hex::encode(h.finalize())
}

/// Appends one record. Pass the transaction that makes the audited change (a `Transaction` derefs to
/// `Connection`), so both commit or neither does.
pub fn append(conn: &Connection, actor: &str, action: &str, detail: &serde_json::Value) -> Result<i64> {
    let (last_id, last_hash): (i64, String) =
        conn.query_row("SELECT last_id, last_hash FROM audit_head WHERE singleton = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let id = last_id + 1;
    let at = now();
    let detail = serde_json::to_string(detail).map_err(|e| Error::Internal(format!("audit detail: {e}")))?;
    let hash = record_hash(&last_hash, id, &at, actor, action, &detail);
    conn.execute(
        "INSERT INTO audit (id, at, actor, action, detail, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![id, at, actor, action, detail, last_hash, hash],
    )?;
    conn.execute("UPDATE audit_head SET last_id = ?1, last_hash = ?2 WHERE singleton = 1", params![id, hash])?;
    Ok(id)
}

/// Walks the whole chain; the first broken link is returned as [`Error::AuditTampered`].
/// Returns the number of records checked.
pub fn verify(conn: &Connection) -> Result<u64> {
    let (head_id, head_hash): (i64, String) =
        conn.query_row("SELECT last_id, last_hash FROM audit_head WHERE singleton = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let mut stmt = conn.prepare("SELECT id, at, actor, action, detail, prev_hash, hash FROM audit ORDER BY id")?;
    let mut rows = stmt.query([])?;
    let mut prev: Option<(i64, String)> = None;
    let mut n = 0u64;
    while let Some(r) = rows.next()? {
        let (id, at, actor, action, detail, prev_hash, hash): (i64, String, String, String, String, String, String) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?);
        if let Some((pid, phash)) = &prev {
            if id != pid + 1 {
                return Err(Error::AuditTampered { id, reason: format!("records {} to {} are missing", pid + 1, id - 1) });
            }
            if &prev_hash != phash {
                return Err(Error::AuditTampered { id, reason: "its link to the previous record is broken".into() });
            }
        }
        if record_hash(&prev_hash, id, &at, &actor, &action, &detail) != hash {
            return Err(Error::AuditTampered { id, reason: "its contents were changed after it was written".into() });
        }
        prev = Some((id, hash));
        n += 1;
    }
    match prev {
        Some((id, hash)) if id == head_id && hash == head_hash => Ok(n),
        None if head_id == 0 => Ok(0),
        Some((id, _)) => Err(Error::AuditTampered {
            id: head_id,
            reason: format!("the log ends at record {id} but the chain head says {head_id}; newer records were removed"),
        }),
        None => Err(Error::AuditTampered { id: head_id, reason: "all records were removed".into() }),
    }
}

/// Newest first, optionally filtered by actor and action prefix.
pub fn list(conn: &Connection, actor: Option<&str>, action_prefix: Option<&str>, limit: usize) -> Result<Vec<AuditRecord>> {
    let mut stmt = conn.prepare(
        "SELECT id, at, actor, action, detail, prev_hash, hash FROM audit
         WHERE (?1 IS NULL OR actor = ?1) AND (?2 IS NULL OR action LIKE ?2 || '%')
         ORDER BY id DESC LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![actor, action_prefix, limit as i64], |r| {
        let detail: String = r.get(4)?;
        Ok(AuditRecord {
            id: r.get(0)?,
            at: r.get(1)?,
            actor: r.get(2)?,
            action: r.get(3)?,
            detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::String(detail)),
            prev_hash: r.get(5)?,
            hash: r.get(6)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// The newest record's id, if any (cheap; used by tests and `care audit`).
pub fn head(conn: &Connection) -> Result<Option<i64>> {
    Ok(conn
        .query_row("SELECT last_id FROM audit_head WHERE singleton = 1 AND last_id > 0", [], |r| r.get(0))
        .optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, crate::store::Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = crate::store::Store::open(&dir.path().join("care.sqlite")).unwrap();
        (dir, s)
    }

    #[test]
    fn chain_verifies_and_detects_edit_middle_and_tail_removal() {
        let (_d, s) = store();
        {
            let c = s.conn();
            assert_eq!(verify(&c).unwrap(), 0);
            for i in 0..5 {
                append(&c, "admin", "collection.create", &serde_json::json!({"name": format!("c{i}")})).unwrap();
            }
            assert_eq!(verify(&c).unwrap(), 5);
            assert_eq!(list(&c, None, Some("collection."), 2).unwrap().len(), 2);
        }
        let c = s.conn();
        c.execute("UPDATE audit SET detail = '{\"name\":\"evil\"}' WHERE id = 3", []).unwrap();
        assert!(matches!(verify(&c), Err(Error::AuditTampered { id: 3, .. })));
        // Restore, then remove a middle record.
        let (_d2, s2) = store();
        let c2 = s2.conn();
        for _ in 0..4 {
            append(&c2, "a", "x", &serde_json::json!({})).unwrap();
        }
        c2.execute("DELETE FROM audit WHERE id = 2", []).unwrap();
        assert!(matches!(verify(&c2), Err(Error::AuditTampered { id: 3, .. })));
        // Removing the tail is caught by the head.
        let (_d3, s3) = store();
        let c3 = s3.conn();
        for _ in 0..3 {
            append(&c3, "a", "x", &serde_json::json!({})).unwrap();
        }
        c3.execute("DELETE FROM audit WHERE id = 3", []).unwrap();
        assert!(matches!(verify(&c3), Err(Error::AuditTampered { .. })));
    }

    #[test]
    fn append_rolls_back_with_its_transaction() {
        let (_d, s) = store();
        let mut c = s.conn();
        {
            let tx = c.transaction().unwrap();
            append(&tx, "a", "x", &serde_json::json!({})).unwrap();
            // dropped without commit
        }
        assert_eq!(head(&c).unwrap(), None);
        assert_eq!(verify(&c).unwrap(), 0);
    }
}
