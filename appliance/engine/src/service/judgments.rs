//! The model handle's operations on judgment sets: importing, listing and deleting them.

use crate::accounts::Admin;
use crate::error::{Error, Result};
use crate::judgments::*;
use crate::search::MAX_QUERY_CHARS;
use crate::store::now;
use rusqlite::params;

impl crate::engine::Models<'_> {
    fn judgment_set_info(&self, collection: &str, name: &str) -> Result<JudgmentSetInfo> {
        self.engine
            .models()
            .judgment_sets(&Admin::system(), Some(collection))?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::NotFound { what: format!("资料库 {collection} 的评测集 {name}") })
    }

    /// Imports a judgment set for `collection` under `name`, each judgment resolved to a document (its external
    /// id) or a passage (chunk id) of the collection, in one transaction with its audit record.
    pub fn import_judgments(
        &self,
        actor: &Admin,
        collection: &str,
        name: &str,
        src: JudgmentSource<'_>,
    ) -> Result<JudgmentSetInfo> {
        check_name(name)?;
        let col = self.engine.store.collection(collection)?;
        let (source, origin) = match src {
            JudgmentSource::Beir { dir, split } => ("beir", format!("{} ({split})", dir.display())),
            JudgmentSource::Csv(p) => ("csv", p.display().to_string()),
            JudgmentSource::CsvText { name, .. } => ("csv", name.to_string()),
        };
        let rows = read_rows(src)?;
        if rows.len() > MAX_JUDGMENTS {
            return Err(Error::TooLarge {
                what: format!("judgment set {origin}"),
                size: rows.len() as u64,
                limit: MAX_JUDGMENTS as u64,
                hint: "split it into several sets".into(),
            });
        }
        let docs = self.engine.store.document_external_ids(col.id)?;
        let eval_fraction = self.engine.cfg.lifecycle.eval_fraction;
        let mut resolved = Vec::with_capacity(rows.len());
        let mut unresolved = 0;
        for (query, id, grade) in rows {
            let query: String = query.chars().take(MAX_QUERY_CHARS).collect();
            let target = if docs.contains_key(&id) {
                Some((id, None))
            } else {
                id.parse::<i64>()
                    .ok()
                    .and_then(|c| self.engine.store.chunk_document(col.id, c).ok().flatten())
                    .map(|(c, ext)| (ext, Some(c)))
            };
            match target {
                Some((ext, chunk)) => resolved.push((query, ext, chunk, grade.clamp(0, 100))),
                None => unresolved += 1,
            }
        }
        if resolved.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{origin}: 没有一条评测记录对应集合 {collection} 中的文档 (none of the {unresolved} judgments names a document \
                 id or passage id of collection '{collection}'; ids must be the documents' ids as ingested, e.g. the \
                 corpus `_id`)"
            )));
        }
        let mut conn = self.engine.store.conn();
        let tx = conn.transaction()?;
        let at = now();
        let inserted = tx.execute(
            "INSERT INTO judgment_sets (collection_id, name, source, created_by, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![col.id, name, source, actor.name, at],
        );
        if let Err(rusqlite::Error::SqliteFailure(e, _)) = &inserted
            && e.code == rusqlite::ErrorCode::ConstraintViolation
        {
            return Err(Error::InvalidInput(format!(
                "资料库 {collection} 已有评测集 {name}；请先删除它，或换一个名称"
            )));
        }
        inserted?;
        let set_id = tx.last_insert_rowid();
        {
            let mut stmt = tx.prepare(
                "INSERT INTO judgments (set_id, query, external_id, chunk_id, grade, part) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (q, ext, chunk, grade) in &resolved {
                stmt.execute(params![set_id, q, ext, chunk, grade, part_of(q, eval_fraction)])?;
            }
        }
        crate::audit::append(
            &tx,
            &actor.name,
            "judgments.import",
            &serde_json::json!({"collection": collection, "name": name, "source": origin,
                "judgments": resolved.len(), "unresolved": unresolved}),
        )?;
        tx.commit()?;
        drop(conn);
        let mut info = self.judgment_set_info(collection, name)?;
        info.unresolved = unresolved;
        Ok(info)
    }

    /// The uploaded sets and, per collection with feedback, the feedback set.
    pub fn judgment_sets(&self, _admin: &Admin, collection: Option<&str>) -> Result<Vec<JudgmentSetInfo>> {
        let conn = self.engine.store.reader();
        let mut stmt = conn.prepare(
            "SELECT c.name, s.name, s.source, s.created_by, s.created_at, COUNT(j.id), \
             COUNT(DISTINCT CASE WHEN j.part = 'train' THEN j.query END), \
             COUNT(DISTINCT CASE WHEN j.part = 'eval' THEN j.query END) \
             FROM judgment_sets s JOIN collections c ON c.id = s.collection_id LEFT JOIN judgments j ON j.set_id = s.id \
             WHERE ?1 IS NULL OR c.name = ?1 GROUP BY s.id ORDER BY c.name, s.name",
        )?;
        let mut out: Vec<JudgmentSetInfo> = stmt
            .query_map([collection], |r| {
                Ok(JudgmentSetInfo {
                    collection: r.get(0)?,
                    name: r.get(1)?,
                    source: r.get(2)?,
                    created_by: r.get(3)?,
                    created_at: r.get(4)?,
                    judgments: r.get::<_, i64>(5)? as usize,
                    train_queries: r.get::<_, i64>(6)? as usize,
                    eval_queries: r.get::<_, i64>(7)? as usize,
                    unresolved: 0,
                })
            })?
            .collect::<Result<_, _>>()?;
        drop(stmt);
        let fb: Vec<(String, i64, String)> = conn
            .prepare(
                "SELECT collection, COUNT(*), MIN(at) FROM feedback WHERE ?1 IS NULL OR collection = ?1 GROUP BY collection",
            )?
            .query_map([collection], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        drop(conn);
        for (col, n, at) in fb {
            let Ok(c) = self.engine.store.collection(&col) else { continue };
            let rows = self.engine.judgments().feedback_rows(c.id)?;
            let fraction = self.engine.cfg.lifecycle.eval_fraction;
            let count = |part: &str| merge(rows.iter().filter(|r| part_of(&r.0, fraction) == part)).queries.len();
            out.push(JudgmentSetInfo {
                collection: col,
                name: FEEDBACK_SET.into(),
                source: "feedback".into(),
                created_by: "clinicians".into(),
                created_at: at,
                judgments: n as usize,
                train_queries: count("train"),
                eval_queries: count("eval"),
                unresolved: 0,
            });
        }
        Ok(out)
    }

    /// Deletes an uploaded set (feedback is not a set: it goes with the feedback itself).
    pub fn delete_judgments(&self, actor: &Admin, collection: &str, name: &str) -> Result<usize> {
        let col = self.engine.store.collection(collection)?;
        let mut conn = self.engine.store.conn();
        let tx = conn.transaction()?;
        let n: i64 = tx.query_row(
            "SELECT COUNT(j.id) FROM judgment_sets s LEFT JOIN judgments j ON j.set_id = s.id \
             WHERE s.collection_id = ?1 AND s.name = ?2",
            params![col.id, name],
            |r| r.get(0),
        )?;
        let deleted =
            tx.execute("DELETE FROM judgment_sets WHERE collection_id = ?1 AND name = ?2", params![col.id, name])?;
        if deleted == 0 {
            return Err(Error::NotFound { what: format!("资料库 {collection} 的评测集 {name}") });
        }
        crate::audit::append(
            &tx,
            &actor.name,
            "judgments.delete",
            &serde_json::json!({"collection": collection, "name": name, "judgments": n}),
        )?;
        tx.commit()?;
        Ok(n as usize)
    }
}
