//! Walking the chain, a page of records at a time, and re-chaining a log written before the audit key existed.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};

use super::LogStore;
use super::anchor::{ANCHOR_FILE, Anchor};
use super::{append, key, record_hash, record_text};
use crate::error::{Error, Result};

/// Records read per lock of the store's connection: small enough that a request waiting for the lock waits
/// milliseconds, large enough that a walk of 500k records takes a hundred lock round trips.
pub(crate) const PAGE: i64 = 5_000;

pub(crate) fn tampered(id: i64, reason: impl Into<String>) -> Error {
    Error::AuditTampered { id, reason: reason.into() }
}

struct Row {
    id: i64,
    at: String,
    actor: String,
    action: String,
    detail: String,
    prev_hash: String,
    hash: String,
    /// The keyed MAC of the record's fields, computed by SQLite for records at or after the keying start.
    mac: Option<String>,
}

fn read_page(conn: &Connection, after: i64, until: i64, keyed_from: i64) -> Result<Vec<Row>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, at, actor, action, detail, prev_hash, hash,
                CASE WHEN id >= ?3 THEN care_audit_mac(prev_hash || char(31) || id || char(31) || at || char(31)
                     || actor || char(31) || action || char(31) || detail || char(31)) END
         FROM audit WHERE id > ?1 AND id <= ?2 ORDER BY id LIMIT ?4",
    )?;
    let rows = stmt.query_map(params![after, until, keyed_from, PAGE], |r| {
        Ok(Row {
            id: r.get(0)?,
            at: r.get(1)?,
            actor: r.get(2)?,
            action: r.get(3)?,
            detail: r.get(4)?,
            prev_hash: r.get(5)?,
            hash: r.get(6)?,
            mac: r.get(7)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// How a walk reaches the database: a page at a time through the store's lock, so requests interleave with it, or
/// under one lock (or transaction) held throughout, for a consistent snapshot.
pub(crate) enum Access<'a> {
    Paged(&'a dyn LogStore),
    Held(&'a Connection),
}

impl Access<'_> {
    pub fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        match self {
            Access::Paged(store) => f(&store.writer()),
            Access::Held(conn) => f(conn),
        }
    }
}

/// What a walk checks against, read under one lock before it starts.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    pub head: (i64, String),
    /// The last record removed by retention (0 and "" when none was).
    retention: (i64, String),
    /// Records from this id on carry keyed MACs; older ones the unkeyed hashes they were written with.
    keyed_from: i64,
    /// Checking a log from before the key: every record unkeyed, no keying start to confirm.
    legacy: bool,
}

impl Bounds {
    pub fn read(conn: &Connection) -> Result<Self> {
        let head = conn.query_row("SELECT last_id, last_hash FROM audit_head WHERE singleton = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        let retention = conn
            .query_row("SELECT purged_through_id, purged_through_hash FROM audit_anchor WHERE singleton = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((0, String::new()));
        let (keyed_from, key_id): (Option<i64>, String) =
            conn.query_row("SELECT keyed_from_id, key_id FROM audit_key WHERE singleton = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        let b = Bounds { head, retention, keyed_from: keyed_from.unwrap_or(i64::MAX), legacy: keyed_from.is_none() };
        if !b.legacy && b.head.0 >= b.keyed_from && key_id != key::fingerprint(conn)? {
            return Err(tampered(
                b.keyed_from,
                "audit.key is not the key this log was written with (was care.sqlite restored or copied without \
                 its audit.key?); the keyed records cannot be checked",
            ));
        }
        Ok(b)
    }
}

fn is_rekey_record(r: &Row, keyed_from: i64) -> bool {
    let d: serde_json::Value = serde_json::from_str(&r.detail).unwrap_or_default();
    r.action == "audit.rekey" && d["keyed_from_id"].as_i64() == Some(keyed_from)
}

fn truncated(a: &Anchor, head_id: i64) -> Error {
    tampered(
        a.id,
        format!(
            "{ANCHOR_FILE} confirmed records through {} at {}, but the log now ends at record {head_id}: newer records \
             were removed (truncated) and the chain head moved back",
            a.id, a.at
        ),
    )
}

fn rewritten(id: i64) -> Error {
    tampered(id, format!("its hash differs from the one {ANCHOR_FILE} recorded; the chain was rewritten"))
}

/// One pass over the records after a starting point (the retention anchor, or the last checkpoint).
pub(crate) struct Walk {
    b: Bounds,
    prev: (i64, String),
    from_retention: bool,
    retention_confirmed: bool,
    anchor: Option<Anchor>,
    saw_unkeyed: bool,
    n: u64,
}

impl Walk {
    /// From the oldest record kept: everything is checked, `anchor` included when there is one.
    pub fn from_retention(b: Bounds, anchor: Option<Anchor>) -> Result<Self> {
        if let Some(a) = anchor.as_ref().filter(|a| a.id > b.head.0) {
            return Err(truncated(a, b.head.0));
        }
        Ok(Walk {
            prev: b.retention.clone(),
            retention_confirmed: b.retention.0 == 0,
            from_retention: true,
            anchor,
            saw_unkeyed: false,
            n: 0,
            b,
        })
    }

    /// From the last checkpoint: that record must still be there with its hash; only newer records are checked.
    /// An anchor that retention has since purged leaves nothing to resume from, so that walk starts at retention.
    pub fn from_anchor(conn: &Connection, b: Bounds, a: Anchor) -> Result<Self> {
        if a.id > b.head.0 {
            return Err(truncated(&a, b.head.0));
        }
        if a.id <= b.retention.0 {
            return Self::from_retention(b, None);
        }
        let hash: Option<String> =
            conn.query_row("SELECT hash FROM audit WHERE id = ?1", [a.id], |r| r.get(0)).optional()?;
        match hash {
            None => Err(tampered(a.id, format!("this record, confirmed by {ANCHOR_FILE}, was removed"))),
            Some(h) if h != a.hash => Err(rewritten(a.id)),
            Some(_) => Ok(Walk {
                saw_unkeyed: a.id < b.keyed_from,
                prev: (a.id, a.hash),
                from_retention: false,
                retention_confirmed: true,
                anchor: None,
                n: 0,
                b,
            }),
        }
    }

    /// Checks every record up to the head read in `Bounds`. Returns how many records were checked.
    pub fn run(mut self, access: &Access<'_>) -> Result<u64> {
        loop {
            let page = access.with(|c| read_page(c, self.prev.0, self.b.head.0, self.b.keyed_from))?;
            if page.is_empty() {
                break;
            }
            for r in &page {
                self.step(r)?;
            }
        }
        self.finish()?;
        Ok(self.n)
    }

    fn step(&mut self, r: &Row) -> Result<()> {
        self.check_link(r)?;
        self.check_keying(r)?;
        self.check_contents(r)?;
        if let Some(a) = self.anchor.as_ref().filter(|a| a.id == r.id && a.hash != r.hash) {
            return Err(rewritten(a.id));
        }
        if r.action == "audit.purge" && !self.retention_confirmed {
            let d: serde_json::Value = serde_json::from_str(&r.detail).unwrap_or_default();
            self.retention_confirmed = d["through_id"].as_i64() == Some(self.b.retention.0)
                && d["through_hash"].as_str() == Some(self.b.retention.1.as_str());
        }
        self.prev = (r.id, r.hash.clone());
        self.n += 1;
        Ok(())
    }

    fn check_link(&self, r: &Row) -> Result<()> {
        let (pid, phash) = &self.prev;
        let first = self.n == 0 && self.from_retention;
        if r.id != pid + 1 {
            let reason = if first {
                format!("the log should start at record {} but starts at {}; older records were removed", pid + 1, r.id)
            } else {
                format!("records {} to {} are missing", pid + 1, r.id - 1)
            };
            return Err(tampered(r.id, reason));
        }
        if &r.prev_hash != phash {
            let reason = if first {
                "it does not follow the last purged record"
            } else {
                "its link to the previous record is broken"
            };
            return Err(tampered(r.id, reason));
        }
        Ok(())
    }

    fn check_contents(&self, r: &Row) -> Result<()> {
        let expected = if r.id < self.b.keyed_from {
            record_hash(&r.prev_hash, r.id, &r.at, &r.actor, &r.action, &r.detail)
        } else {
            r.mac.clone().unwrap_or_default()
        };
        if expected != r.hash {
            return Err(tampered(
                r.id,
                "its contents were changed after it was written, or its hash was recomputed without the audit key",
            ));
        }
        Ok(())
    }

    /// Unkeyed records are only legitimate before the `audit.rekey` record that started the keyed chain; otherwise
    /// moving the keying start would let anyone re-chain the log with plain SHA-256.
    fn check_keying(&mut self, r: &Row) -> Result<()> {
        if self.b.legacy {
            return Ok(());
        }
        if r.id < self.b.keyed_from {
            self.saw_unkeyed = true;
        } else if r.id == self.b.keyed_from && self.saw_unkeyed && !is_rekey_record(r, self.b.keyed_from) {
            return Err(tampered(r.id, "unkeyed records precede it, but it is not the audit.rekey record"));
        }
        Ok(())
    }

    fn finish(&self) -> Result<()> {
        let (rid, _) = &self.b.retention;
        if self.from_retention && !self.retention_confirmed {
            let reason = "the retention anchor does not match any purge record; it was moved by hand";
            return Err(tampered(*rid, reason));
        }
        if !self.b.legacy && self.saw_unkeyed && self.prev.0 < self.b.keyed_from {
            let reason = "the keyed chain should start here but the log ends before it; the keying start was moved";
            return Err(tampered(self.b.keyed_from, reason));
        }
        let (hid, hhash) = &self.b.head;
        if self.prev.0 < *hid && self.n == 0 && self.from_retention {
            return Err(tampered(*hid, "all records were removed"));
        }
        if self.prev.0 < *hid {
            let reason = format!(
                "the log ends at record {} but the chain head says {hid}; newer records were removed",
                self.prev.0
            );
            return Err(tampered(*hid, reason));
        }
        if &self.prev.1 != hhash {
            return Err(tampered(*hid, "the chain head's hash does not match this record; the head was edited"));
        }
        Ok(())
    }
}

/// Run once, right after migrating, on a database whose log predates the key (`keyed_from_id` still NULL). An
/// intact old chain is re-chained with the key and an `audit.rekey` record appended; a broken one is left as it is,
/// so verification keeps naming the damaged record, and the keyed chain starts after it. One transaction.
///
/// An `audit.anchor` file means the log was keyed before: a database that nonetheless looks unkeyed had its keying
/// reset by hand, and re-chaining it would launder whatever was rewritten, so it is kept like a broken one.
pub(crate) fn ensure_keyed(conn: &mut Connection, dir: &Path) -> Result<()> {
    if keyed_from(conn)?.is_some() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Another process opening the same data dir may have done it while this one waited for the write lock.
    if keyed_from(&tx)?.is_some() {
        return Ok(());
    }
    let b = Bounds::read(&tx)?;
    let fingerprint = key::fingerprint(&tx)?;
    let c: &Connection = &tx;
    if b.head.0 == 0 {
        set_keyed(c, 1, &fingerprint)?;
    } else {
        let walked = if dir.join(ANCHOR_FILE).exists() {
            Err(tampered(
                b.head.0,
                format!("the log looks older than the audit key, but {ANCHOR_FILE} shows it was keyed"),
            ))
        } else {
            Walk::from_retention(b.clone(), None).and_then(|w| w.run(&Access::Held(c)))
        };
        match walked {
            Ok(_) => rechain(&tx, &b, &fingerprint)?,
            Err(e @ Error::AuditTampered { .. }) => keep_broken(&tx, &b, &fingerprint, &e)?,
            Err(e) => return Err(e),
        }
    }
    tx.commit()?;
    Ok(())
}

fn keyed_from(conn: &Connection) -> Result<Option<i64>> {
    Ok(conn.query_row("SELECT keyed_from_id FROM audit_key WHERE singleton = 1", [], |r| r.get(0))?)
}

fn set_keyed(conn: &Connection, keyed_from: i64, fingerprint: &str) -> Result<()> {
    conn.execute(
        "UPDATE audit_key SET keyed_from_id = ?1, key_id = ?2 WHERE singleton = 1",
        params![keyed_from, fingerprint],
    )?;
    Ok(())
}

fn rechain(conn: &rusqlite::Transaction<'_>, b: &Bounds, fingerprint: &str) -> Result<()> {
    let mut prev = b.retention.1.clone();
    let (mut after, mut n) = (b.retention.0, 0u64);
    loop {
        let page = read_page(conn, after, b.head.0, i64::MAX)?;
        let Some(last) = page.last() else { break };
        after = last.id;
        for r in &page {
            let h = key::mac(conn, &record_text(&prev, r.id, &r.at, &r.actor, &r.action, &r.detail))?;
            conn.execute("UPDATE audit SET prev_hash = ?2, hash = ?3 WHERE id = ?1", params![r.id, prev, h])?;
            prev = h;
            n += 1;
        }
    }
    conn.execute("UPDATE audit_head SET last_hash = ?1 WHERE singleton = 1", [&prev])?;
    let keyed_from = b.retention.0 + 1;
    set_keyed(conn, keyed_from, fingerprint)?;
    append(conn, "system", "audit.rekey", &serde_json::json!({"keyed_from_id": keyed_from, "rechained": n}))?;
    tracing::info!(records = n, "re-chained the audit log with the audit key");
    Ok(())
}

fn keep_broken(conn: &rusqlite::Transaction<'_>, b: &Bounds, fingerprint: &str, e: &Error) -> Result<()> {
    let keyed_from = b.head.0 + 1;
    set_keyed(conn, keyed_from, fingerprint)?;
    let detail = serde_json::json!({"keyed_from_id": keyed_from, "rechained": 0, "unkeyed_log_error": e.to_string()});
    append(conn, "system", "audit.rekey", &detail)?;
    tracing::error!(error = %e, "the audit log written before the audit key does not verify; it was not re-chained");
    Ok(())
}
