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
        conn.query_row("SELECT last_id, last_hash FROM audit_head WHERE singleton = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
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
///
/// The chain starts at the retention anchor: the first record must follow the last purged one (id and hash), and
/// when anything was purged the anchor must match the `audit.purge` record that purged it, so neither removing the
/// oldest records nor moving the anchor by hand goes unnoticed.
pub fn verify(conn: &Connection) -> Result<u64> {
    let (head_id, head_hash): (i64, String) =
        conn.query_row("SELECT last_id, last_hash FROM audit_head WHERE singleton = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let (anchor_id, anchor_hash) = anchor(conn)?;
    let mut stmt = conn.prepare("SELECT id, at, actor, action, detail, prev_hash, hash FROM audit ORDER BY id")?;
    let mut rows = stmt.query([])?;
    let mut prev: Option<(i64, String)> = None;
    let mut anchor_confirmed = anchor_id == 0;
    let mut n = 0u64;
    while let Some(r) = rows.next()? {
        let (id, at, actor, action, detail, prev_hash, hash): (i64, String, String, String, String, String, String) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?);
        match &prev {
            Some((pid, phash)) => {
                if id != pid + 1 {
                    return Err(Error::AuditTampered {
                        id,
                        reason: format!("records {} to {} are missing", pid + 1, id - 1),
                    });
                }
                if &prev_hash != phash {
                    return Err(Error::AuditTampered {
                        id,
                        reason: "its link to the previous record is broken".into(),
                    });
                }
            }
            None => {
                if id != anchor_id + 1 {
                    return Err(Error::AuditTampered {
                        id,
                        reason: format!(
                            "the log should start at record {} but starts at {id}; older records were removed",
                            anchor_id + 1
                        ),
                    });
                }
                if prev_hash != anchor_hash {
                    return Err(Error::AuditTampered {
                        id,
                        reason: "it does not follow the last purged record".into(),
                    });
                }
            }
        }
        if record_hash(&prev_hash, id, &at, &actor, &action, &detail) != hash {
            return Err(Error::AuditTampered { id, reason: "its contents were changed after it was written".into() });
        }
        if action == "audit.purge" && !anchor_confirmed {
            let d: serde_json::Value = serde_json::from_str(&detail).unwrap_or_default();
            anchor_confirmed =
                d["through_id"].as_i64() == Some(anchor_id) && d["through_hash"].as_str() == Some(anchor_hash.as_str());
        }
        prev = Some((id, hash));
        n += 1;
    }
    if !anchor_confirmed {
        return Err(Error::AuditTampered {
            id: anchor_id,
            reason: "the retention anchor does not match any purge record; it was moved by hand".into(),
        });
    }
    match prev {
        Some((id, hash)) if id == head_id && hash == head_hash => Ok(n),
        None if head_id == 0 => Ok(0),
        Some((id, _)) => Err(Error::AuditTampered {
            id: head_id,
            reason: format!(
                "the log ends at record {id} but the chain head says {head_id}; newer records were removed"
            ),
        }),
        None => Err(Error::AuditTampered { id: head_id, reason: "all records were removed".into() }),
    }
}

fn anchor(conn: &Connection) -> Result<(i64, String)> {
    Ok(conn
        .query_row("SELECT purged_through_id, purged_through_hash FROM audit_anchor WHERE singleton = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?
        .unwrap_or((0, String::new())))
}

/// Retention: removes records written before `cutoff` (RFC 3339), never the newest one, moves the anchor to the
/// last removed record and appends an `audit.purge` record naming it, all in one transaction. Returns how many
/// records were removed.
pub fn purge_before(conn: &mut Connection, actor: &str, cutoff: &str, retention_days: u32) -> Result<u64> {
    let tx = conn.transaction()?;
    let newest: i64 = tx.query_row("SELECT last_id FROM audit_head WHERE singleton = 1", [], |r| r.get(0))?;
    let last: Option<(i64, String)> = tx
        .query_row(
            "SELECT id, hash FROM audit WHERE at < ?1 AND id < ?2 ORDER BY id DESC LIMIT 1",
            params![cutoff, newest],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((through_id, through_hash)) = last else { return Ok(0) };
    let n = tx.execute("DELETE FROM audit WHERE id <= ?1", [through_id])? as u64;
    tx.execute(
        "UPDATE audit_anchor SET purged_through_id = ?1, purged_through_hash = ?2 WHERE singleton = 1",
        params![through_id, through_hash],
    )?;
    append(
        &tx,
        actor,
        "audit.purge",
        &serde_json::json!({"through_id": through_id, "through_hash": through_hash, "removed": n, "retention_days": retention_days, "cutoff": cutoff}),
    )?;
    tx.commit()?;
    Ok(n)
}

/// Filter for listing and exporting.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub actor: Option<String>,
    pub action_prefix: Option<String>,
    /// Inclusive lower and exclusive upper bounds on `at` (RFC 3339 prefixes such as `2026-11-01` work).
    pub since: Option<String>,
    pub until: Option<String>,
    /// Substring of the detail JSON (e.g. a query or a collection name).
    pub text: Option<String>,
}

/// Newest first, filtered, paged.
pub fn search(conn: &Connection, f: &Filter, limit: usize, offset: usize) -> Result<Vec<AuditRecord>> {
    let mut stmt = conn.prepare(
        "SELECT id, at, actor, action, detail, prev_hash, hash FROM audit
         WHERE (?1 IS NULL OR actor = ?1) AND (?2 IS NULL OR action LIKE ?2 || '%')
           AND (?3 IS NULL OR at >= ?3) AND (?4 IS NULL OR at < ?4) AND (?5 IS NULL OR instr(detail, ?5) > 0)
         ORDER BY id DESC LIMIT ?6 OFFSET ?7",
    )?;
    let rows = stmt.query_map(
        params![f.actor, f.action_prefix, f.since, f.until, f.text, limit as i64, offset as i64],
        row_to_record,
    )?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn row_to_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<AuditRecord> {
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
}

/// CSV (RFC 4180) of the records, oldest first, with the hashes so an export can be checked against the chain.
/// Cells starting with `=`, `+`, `-` or `@` are prefixed with `'` so a spreadsheet does not run them as formulas.
pub fn to_csv(records: &[AuditRecord]) -> String {
    fn cell(s: &str) -> String {
        let s = if s.starts_with(['=', '+', '-', '@']) { format!("'{s}") } else { s.to_string() };
        if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s }
    }
    let mut out = String::from("id,at,actor,action,detail,prev_hash,hash\r\n");
    for r in records.iter().rev() {
        let detail = r.detail.to_string();
        let cells = [
            r.id.to_string(),
            r.at.clone(),
            r.actor.clone(),
            r.action.clone(),
            detail,
            r.prev_hash.clone(),
            r.hash.clone(),
        ];
        out.push_str(&cells.iter().map(|c| cell(c)).collect::<Vec<_>>().join(","));
        out.push_str("\r\n");
    }
    out
}

/// Newest first, optionally filtered by actor and action prefix.
pub fn list(
    conn: &Connection,
    actor: Option<&str>,
    action_prefix: Option<&str>,
    limit: usize,
) -> Result<Vec<AuditRecord>> {
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
    fn purge_keeps_the_chain_verifiable_and_removing_the_oldest_record_is_caught() {
        let (_d, s) = store();
        let mut c = s.conn();
        for i in 0..6 {
            append(&c, "admin", "search", &serde_json::json!({"q": i})).unwrap();
        }
        // Backdate the first four records.
        c.execute("UPDATE audit SET at = '2020-01-01T00:00:00Z' WHERE id <= 4", []).unwrap();
        // (Backdating changed their contents: re-hash them so only the purge is under test.)
        let mut prev = String::new();
        let rows: Vec<(i64, String, String, String, String)> = {
            let mut st = c.prepare("SELECT id, at, actor, action, detail FROM audit ORDER BY id").unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
                .unwrap()
                .map(|r| r.unwrap())
                .collect()
        };
        for (id, at, actor, action, detail) in rows {
            let h = record_hash(&prev, id, &at, &actor, &action, &detail);
            c.execute("UPDATE audit SET prev_hash = ?2, hash = ?3 WHERE id = ?1", params![id, prev, h]).unwrap();
            c.execute("UPDATE audit_head SET last_hash = ?1 WHERE last_id = ?2", params![h, id]).unwrap();
            prev = h;
        }
        assert_eq!(verify(&c).unwrap(), 6);
        let removed = purge_before(&mut c, "system", "2021-01-01", 180).unwrap();
        assert_eq!(removed, 4);
        assert_eq!(verify(&c).unwrap(), 3, "records 5, 6 and the purge record");
        assert_eq!(purge_before(&mut c, "system", "2021-01-01", 180).unwrap(), 0);
        // Removing the oldest remaining record is caught by the anchor.
        c.execute("DELETE FROM audit WHERE id = 5", []).unwrap();
        assert!(matches!(verify(&c), Err(Error::AuditTampered { id: 6, .. })));
        // Moving the anchor to hide it is caught too.
        let h5: String = c.query_row("SELECT prev_hash FROM audit WHERE id = 6", [], |r| r.get(0)).unwrap();
        c.execute("UPDATE audit_anchor SET purged_through_id = 5, purged_through_hash = ?1", [h5]).unwrap();
        let err = verify(&c).unwrap_err();
        assert!(err.to_string().contains("anchor"), "{err}");
        let csv = to_csv(&search(&c, &Filter::default(), 10, 0).unwrap());
        assert!(csv.starts_with("id,at,actor,action,detail,prev_hash,hash\r\n6,"), "{csv}");
    }

    #[test]
    fn removing_the_first_record_is_caught() {
        let (_d, s) = store();
        let c = s.conn();
        for _ in 0..3 {
            append(&c, "a", "x", &serde_json::json!({})).unwrap();
        }
        c.execute("DELETE FROM audit WHERE id = 1", []).unwrap();
        assert!(matches!(verify(&c), Err(Error::AuditTampered { id: 2, .. })));
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
