//! Reading documents and judging passages: the document view behind a search hit, and relevance feedback
//! (helpful / not helpful) kept with a snapshot of the passage for later training.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::{Store, now};

#[derive(Debug, Clone, Serialize)]
pub struct DocumentChunk {
    pub chunk_id: i64,
    pub ordinal: i64,
    pub heading: String,
    pub text: String,
    /// Character offsets of the chunk in the document's normalised text (consecutive chunks overlap).
    pub char_start: i64,
    pub char_end: i64,
    /// Read from a scanned page by the OCR.
    pub scan: Option<crate::ingest::scan::ScanOrigin>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DocumentView {
    pub id: i64,
    pub external_id: String,
    pub title: String,
    pub source: String,
    pub collection: String,
    pub created_at: String,
    pub chunks: Vec<DocumentChunk>,
}

/// A document with its chunks in order (overlapping context between chunks is left as stored).
pub fn document(store: &Store, id: i64) -> Result<DocumentView> {
    let conn = store.reader();
    let head = conn
        .query_row(
            "SELECT d.id, d.external_id, d.title, d.source, c.name, d.created_at FROM documents d
             JOIN collections c ON c.id = d.collection_id WHERE d.id = ?1 AND d.state != 'deleting'",
            [id],
            |r| {
                Ok(DocumentView {
                    id: r.get(0)?,
                    external_id: r.get(1)?,
                    title: r.get(2)?,
                    source: r.get(3)?,
                    collection: r.get(4)?,
                    created_at: r.get(5)?,
                    chunks: Vec::new(),
                })
            },
        )
        .optional()?;
    let mut doc = head.ok_or_else(|| Error::NotFound { what: format!("文档 #{id}") })?;
    let mut stmt = conn.prepare_cached(
        "SELECT id, ordinal, heading, text, char_start, char_end, scan_page, scan_last_page, scan_confidence FROM chunks \
         WHERE document_id = ?1 ORDER BY ordinal",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok(DocumentChunk {
            chunk_id: r.get(0)?,
            ordinal: r.get(1)?,
            heading: r.get(2)?,
            text: r.get(3)?,
            char_start: r.get(4)?,
            char_end: r.get(5)?,
            scan: crate::ingest::scan::ScanOrigin::from_columns(r.get(6)?, r.get(7)?, r.get(8)?),
        })
    })?;
    doc.chunks = rows.collect::<Result<Vec<_>, _>>()?;
    Ok(doc)
}

/// The collection a chunk belongs to (for permission checks before recording feedback on it).
pub fn chunk_collection(store: &Store, chunk_id: i64) -> Result<(String, i64, String)> {
    store
        .reader()
        .query_row(
            "SELECT c.name, d.id, k.text FROM chunks k JOIN documents d ON d.id = k.document_id
             JOIN collections c ON c.id = d.collection_id WHERE k.id = ?1",
            [chunk_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?
        .ok_or_else(|| Error::NotFound { what: format!("片段 #{chunk_id}") })
}

#[derive(Debug, Clone, Serialize)]
pub struct Feedback {
    pub id: i64,
    pub at: String,
    pub username: String,
    pub query: String,
    pub chunk_id: i64,
    pub document_id: i64,
    pub collection: String,
    pub helpful: bool,
    pub passage: String,
}

/// Stores one judgement with its audit record (`logged_query`: the query as the audit log may show it). The
/// caller has checked that `username` may read the chunk's collection.
pub(crate) fn record(
    store: &Store,
    username: &str,
    query: &str,
    chunk_id: i64,
    helpful: bool,
    logged_query: &serde_json::Value,
) -> Result<i64> {
    let query = query.trim();
    if query.is_empty() || query.chars().count() > 1000 {
        return Err(Error::InvalidInput("反馈需要附上所评价的检索词（1–1000 个字符）".into()));
    }
    let (collection, document_id, passage) = chunk_collection(store, chunk_id)?;
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO feedback (at, username, query, chunk_id, document_id, collection, helpful, passage) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![now(), username, query, chunk_id, document_id, collection, helpful as i64, passage],
    )?;
    let id = tx.last_insert_rowid();
    let detail = serde_json::json!({"feedback": id, "chunk": chunk_id, "collection": collection, "helpful": helpful, "query": logged_query});
    crate::audit::append(&tx, username, "feedback", &detail)?;
    tx.commit()?;
    Ok(id)
}

pub fn list(store: &Store, collection: Option<&str>, limit: usize) -> Result<Vec<Feedback>> {
    let conn = store.reader();
    let mut stmt = conn.prepare(
        "SELECT id, at, username, query, chunk_id, document_id, collection, helpful, passage FROM feedback
         WHERE (?1 IS NULL OR collection = ?1) ORDER BY id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![collection, limit as i64], |r| {
        Ok(Feedback {
            id: r.get(0)?,
            at: r.get(1)?,
            username: r.get(2)?,
            query: r.get(3)?,
            chunk_id: r.get(4)?,
            document_id: r.get(5)?,
            collection: r.get(6)?,
            helpful: r.get::<_, i64>(7)? != 0,
            passage: r.get(8)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}
