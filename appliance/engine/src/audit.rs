//! The audit log: append-only records, each chained to the previous one with a keyed MAC.
//!
//! `hash = HMAC-SHA256(key, prev_hash ‖ id ‖ at ‖ actor ‖ action ‖ detail)` with unit separators between fields,
//! so an edited field changes that record's hash and a removed record breaks the next record's `prev_hash` link.
//! The key lives in `audit.key` beside care.sqlite, not in it, so whoever can write the database still cannot
//! recompute the chain after rewriting records. The newest record's id and hash are kept in `audit_head`, updated in
//! the same transaction, which catches a removed tail; `audit.anchor` (see [`anchor`]) catches a removed tail whose
//! head was moved back too. Callers append inside the transaction that makes the change, so a change and its
//! record commit together; searches, which change nothing, append through the group-commit [`writer`].
//!
//! Records written before the key existed keep their plain SHA-256 hashes only if their chain was already broken
//! when the key arrived (see [`chain::ensure_keyed`]); an intact old chain is re-chained with the key.

mod anchor;
mod chain;
pub(crate) mod key;
pub(crate) mod writer;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub use anchor::ANCHOR_FILE;
pub(crate) use anchor::{anchor_snapshot, sync_dir};
pub(crate) use chain::ensure_keyed;
use chain::{Access, Bounds, Walk};
pub use key::{KEY_FILE, hmac_sha256};
pub(crate) use key::{load_or_create as load_or_create_key, register as register_key};

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

impl AuditRecord {
    /// The action as the audit page names it.
    pub fn action_zh(&self) -> &'static str {
        action_zh(&self.action)
    }
    /// When, in the hospital's time.
    pub fn at_local(&self) -> String {
        crate::clock::local(&self.at)
    }
}

/// One field of a record's detail as the audit page shows it: its Chinese name where it has one (else its key, shown
/// as code), and its value in words (是/否, lists joined), or as compact JSON when it is a structure (`structured`).
#[derive(Debug, Clone, PartialEq)]
pub struct DetailItem {
    pub key: String,
    pub label: Option<&'static str>,
    pub value: String,
    pub structured: bool,
}

/// A record's detail (a JSON object) as fields people read, in the order of their keys; anything that is not an object
/// is one unnamed structured field.
pub fn detail_items(detail: &str) -> Vec<DetailItem> {
    let scalar = |v: &serde_json::Value| match v {
        serde_json::Value::Null => Some("—".to_string()),
        serde_json::Value::Bool(b) => Some(if *b { "是" } else { "否" }.to_string()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(s) => Some(s.clone()),
        _ => None,
    };
    let item = |key: &str, v: &serde_json::Value| {
        let listed = v.as_array().and_then(|a| a.iter().map(scalar).collect::<Option<Vec<_>>>()).map(|a| a.join("、"));
        let (value, structured) = match scalar(v).or(listed) {
            Some(text) => (text, false),
            None => (v.to_string(), true),
        };
        DetailItem { key: key.to_string(), label: detail_zh(key), value, structured }
    };
    match serde_json::from_str::<serde_json::Value>(detail) {
        Ok(serde_json::Value::Object(fields)) => fields.iter().map(|(k, v)| item(k, v)).collect(),
        Ok(other) => vec![DetailItem { key: String::new(), label: None, value: other.to_string(), structured: true }],
        Err(_) => vec![DetailItem { key: String::new(), label: None, value: detail.to_string(), structured: true }],
    }
}

/// The Chinese names of the detail fields records carry most; the others are shown by their key.
pub fn detail_zh(key: &str) -> Option<&'static str> {
    Some(match key {
        "reason" => "原因",
        "collection" | "collection_id" => "资料库",
        "user" | "username" => "用户",
        "job" | "job_id" => "任务",
        "id" => "编号",
        "schedule" => "计划",
        "query" | "q" => "检索词",
        "client" => "客户端地址",
        "error" | "errors" => "错误",
        "role" => "角色",
        "name" => "名称",
        "model" | "models" => "模型",
        "document" | "documents" => "文档",
        "chunk" => "段落",
        "archive" | "archives" => "备份文件",
        "until" | "cutoff" => "截止",
        "token_id" => "令牌",
        "status" => "状态",
        "route" => "页面或接口",
        "method" => "检索方式",
        "kind" => "类型",
        "files" => "文件",
        "words" => "词",
        "time" | "created_at" => "时间",
        "text" => "内容",
        "setting" => "设置项",
        "searches" => "检索次数",
        "scope" => "范围",
        "retention_days" => "保留天数",
        "results" => "结果数",
        "records" => "记录数",
        "recipe" => "训练方案",
        "passed" => "通过",
        "keep_daily" => "保留每日备份",
        "keep_weekly" => "保留每周备份",
        "judgments" => "评判",
        "helpful" => "有帮助",
        "groups" => "组数",
        "feedback" => "反馈",
        "embedded" => "已向量化",
        "disabled" => "已停用",
        "dir" => "目录",
        "description" => "说明",
        "decision" => "结论",
        "days" => "天数",
        "approved" => "已批准用于训练",
        "active" => "启用",
        "evaluation" => "评估",
        "candidate" => "候选模型",
        "live" => "在用模型",
        "preferred" => "首选词",
        "variants" => "同义词",
        "filter" => "筛选",
        "next_due" => "下次运行",
        "removed" => "删除",
        "restored" => "恢复",
        "bytes" => "字节数",
        "lang" => "语言",
        "owner" => "负责人",
        "to" => "至",
        "from" => "自",
        _ => return None,
    })
}

/// Every audited action's Chinese name (the code stays in the log and the filter). An action missing here reads
/// as 其他操作; the test below fails when the engine audits one this table lacks.
pub fn action_zh(action: &str) -> &'static str {
    match action {
        "analytics.export" => "导出检索分析",
        "audit.anchor" => "审计锚点更新",
        "audit.export" => "导出审计日志",
        "audit.purge" => "清理过期审计记录",
        "audit.rekey" => "审计链换钥",
        "auth.account_locked" => "账户锁定",
        "auth.address_throttled" => "地址限流",
        "auth.login" => "登录",
        "auth.login_failed" => "登录失败",
        "auth.logout" => "退出登录",
        "backup.job_cancelled" => "备份已取消",
        "backup.job_done" => "备份完成",
        "backup.job_failed" => "备份失败",
        "backup.download" => "备用机取走备份",
        "backup.restore" => "从备份恢复",
        "backup.schedule_failed" => "定时备份未能开始",
        "backup.schedule_skipped" => "跳过定时备份",
        "backup.schedule_update" => "修改备份设置",
        "backup.submit" => "提交备份",
        "backup.verify" => "校验备份",
        "collection.approve" => "批准用于训练",
        "collection.create" => "新建资料库",
        "collection.delete" => "删除资料库",
        "collection.export_chunks" => "导出文本块",
        "collection.import_vectors" => "导入文档向量",
        "document.delete" => "删除文档",
        "document.denied" => "拒绝查看文档",
        "document.file" => "修改文档分类",
        "feedback" => "反馈",
        "feedback.denied" => "拒绝反馈",
        "feedback.rejected" => "反馈无效",
        "fusion.tune" => "调整融合权重",
        "job.cancel" => "取消任务",
        "judgments.delete" => "删除评测集",
        "judgments.import" => "导入评测集",
        "model.activate" => "启用模型",
        "model.embed_offline" => "离线计算文档向量",
        "model.evaluate" => "评测模型",
        "model.import" => "导入模型",
        "model.job_submit" => "提交模型任务",
        "model.job_cancelled" => "模型任务已取消",
        "model.job_done" => "模型任务完成",
        "model.job_failed" => "模型任务失败",
        "model.promote" => "上线模型",
        "model.promote_override" => "强制上线模型",
        "model.reject" => "模型未通过评测",
        "model.rollback" => "回滚模型",
        "model.train" => "训练模型",
        "permission.grant" => "授予资料库权限",
        "permission.revoke" => "撤销资料库权限",
        "search" => "检索",
        "search.click" => "点击结果",
        "search.denied" => "拒绝检索",
        "search.failed" => "检索失败",
        "search.rejected" => "检索无效",
        "synonym.add" => "新增同义词",
        "synonym.delete" => "删除同义词",
        "synonym.import" => "导入同义词",
        "synonym.update" => "修改同义词",
        "task.refused" => "拒绝任务",
        "token.create" => "创建 API 令牌",
        "token.revoke" => "撤销 API 令牌",
        "training.schedule_delete" => "删除训练计划",
        "training.schedule_failed" => "训练计划未能启动",
        "training.schedule_set" => "设置训练计划",
        "training.submit" => "提交训练",
        "user.create" => "新建用户",
        "user.delete" => "删除用户",
        "user.directory_disable" => "目录停用账户",
        "user.directory_sync" => "目录同步账户",
        "user.password_change" => "修改密码",
        "user.password_check_failed" => "当前密码错误",
        "user.update" => "修改用户",
        "settings.update" => "修改设置",
        "settings.sign_in" => "修改登录方式",
        "ingest.files" => "导入文件",
        "dictionary.add" => "添加词典词条",
        "standby.promote" => "备用机转为主机",
        _ => "其他操作",
    }
}

/// The bytes a record's hash covers. `chain::read_page` builds the same string in SQL; keep them in step.
fn record_text(prev_hash: &str, id: i64, at: &str, actor: &str, action: &str, detail: &str) -> String {
    let mut s = String::new();
    for part in [prev_hash, &id.to_string(), at, actor, action, detail] {
        s.push_str(part);
        s.push('\u{1f}');
    }
    s
}

/// The unkeyed hash records had before the audit key; still checked for a broken old log that was not re-chained.
fn record_hash(prev_hash: &str, id: i64, at: &str, actor: &str, action: &str, detail: &str) -> String {
    hex::encode(Sha256::digest(record_text(prev_hash, id, at, actor, action, detail)))
}

/// Appends one record inside the transaction that makes the audited change, so both commit or neither does (the
/// type admits nothing else). The connection must come from [`Store`], which registers the key. Outside the engine,
/// operations go through the service layer ([`crate::service`]), which appends for them.
pub(crate) fn append(
    conn: &rusqlite::Transaction<'_>,
    actor: &str,
    action: &str,
    detail: &serde_json::Value,
) -> Result<i64> {
    let (last_id, last_hash): (i64, String) =
        conn.query_row("SELECT last_id, last_hash FROM audit_head WHERE singleton = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let id = last_id + 1;
    let at = now();
    let detail = serde_json::to_string(detail).map_err(|e| Error::Internal(format!("audit detail: {e}")))?;
    let hash = key::mac(conn, &record_text(&last_hash, id, &at, actor, action, &detail))?;
    conn.execute(
        "INSERT INTO audit (id, at, actor, action, detail, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![id, at, actor, action, detail, last_hash, hash],
    )?;
    conn.execute("UPDATE audit_head SET last_id = ?1, last_hash = ?2 WHERE singleton = 1", params![id, hash])?;
    Ok(id)
}

/// What one verification checked.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VerifyReport {
    /// Whether the whole log was walked (`verify_full`) or only what followed the last checkpoint.
    pub full: bool,
    /// Records whose link and MAC were checked by this run.
    pub records_checked: u64,
    /// The newest record now known to be intact (0 for an empty log).
    pub verified_through: i64,
}

/// The outcome of the latest verification in this process, for pages that must not walk the chain themselves.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AuditStatus {
    /// When the latest verification finished (RFC 3339); `None` before the first.
    pub checked_at: Option<String>,
    pub last: Option<VerifyReport>,
    /// When a full walk last succeeded.
    pub last_full_at: Option<String>,
    /// The tampering (or failure) the latest verification found; `None` when it passed.
    pub error: Option<String>,
}

/// What the audit log needs of the database that holds it ([`crate::store::Store`] implements it): the one writer
/// connection, the folder of `audit.key` and `audit.anchor`, and the verification state. A trait, so the log sits
/// below the store that checkpoints it on close.
pub trait LogStore {
    fn writer(&self) -> MutexGuard<'_, Connection>;
    fn dir(&self) -> &Path;
    fn monitor(&self) -> &Monitor;
    fn as_dyn(&self) -> &dyn LogStore;
}

/// Now, as every stored timestamp is written: RFC 3339, UTC (also [`crate::store::now`]).
pub fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Per-store verification state: one walk at a time, and the latest outcome.
#[derive(Debug, Default)]
pub struct Monitor {
    walk: Mutex<()>,
    status: Mutex<AuditStatus>,
}

impl Monitor {
    fn walking(&self) -> MutexGuard<'_, ()> {
        self.walk.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, outcome: &Result<VerifyReport>) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.checked_at = Some(now());
        match outcome {
            Ok(r) => {
                if r.full {
                    s.last_full_at = s.checked_at.clone();
                }
                s.last = Some(r.clone());
                s.error = None;
            }
            Err(e) => s.error = Some(e.to_string()),
        }
    }
}

/// The latest verification's outcome; cheap, walks nothing.
pub fn status(store: &impl LogStore) -> AuditStatus {
    store.monitor().status.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Walks the whole log from the retention anchor to the head and checks it against `audit.anchor`. The first
/// problem is returned as [`Error::AuditTampered`].
///
/// The chain starts at the retention anchor: the first record must follow the last purged one (id and hash), and
/// when anything was purged the anchor must match the `audit.purge` record that purged it, so neither removing the
/// oldest records nor moving the anchor by hand goes unnoticed. The head must be at or past the anchor file's
/// record, with that record's hash unchanged, so cutting off the newest records is noticed even when `audit_head`
/// was moved back with them.
pub fn verify_full(store: &impl LogStore) -> Result<VerifyReport> {
    let _one_walk = store.monitor().walking();
    let outcome = paged_then_confirmed(store, |access| full_walk(access, store.dir()));
    store.monitor().record(&outcome);
    outcome
}

fn full_walk(access: &Access<'_>, dir: &Path) -> Result<VerifyReport> {
    let (b, a) = access.with(|c| Ok((Bounds::read(c)?, anchor::load(c, dir)?)))?;
    let through = b.head.0;
    let n = Walk::from_retention(b, a)?.run(access)?;
    Ok(VerifyReport { full: true, records_checked: n, verified_through: through })
}

/// Verifies what was appended since the last checkpoint (everything, the first time) and moves `audit.anchor` to
/// the head. Also checks that the anchor's record is still there with its hash and the head has not moved back
/// past it. The server runs this every minute; it reads only new records, so it stays cheap on a large log.
pub fn checkpoint(store: &impl LogStore) -> Result<VerifyReport> {
    let _one_walk = store.monitor().walking();
    let dir = store.dir();
    let outcome = paged_then_confirmed(store, |access| incremental_walk(access, dir)).and_then(|(report, hash)| {
        if report.verified_through > 0 {
            anchor::store(&mut store.writer(), dir, report.verified_through, &hash)?;
        }
        Ok(report)
    });
    store.monitor().record(&outcome);
    outcome
}

fn incremental_walk(access: &Access<'_>, dir: &Path) -> Result<(VerifyReport, String)> {
    let (walk, head) = access.with(|c| {
        let b = Bounds::read(c)?;
        let head = b.head.clone();
        let walk = match anchor::load(c, dir)? {
            Some(a) => Walk::from_anchor(c, b, a)?,
            None => Walk::from_retention(b, None)?,
        };
        Ok((walk, head))
    })?;
    let n = walk.run(access)?;
    Ok((VerifyReport { full: false, records_checked: n, verified_through: head.0 }, head.1))
}

/// Pages first, so requests interleave with the walk. A purge committed between two pages looks like removed
/// records, so a reported break is confirmed by walking again under one lock before it is believed.
fn paged_then_confirmed<T>(store: &impl LogStore, walk: impl Fn(&Access<'_>) -> Result<T>) -> Result<T> {
    match walk(&Access::Paged(store.as_dyn())) {
        Err(Error::AuditTampered { .. }) => walk(&Access::Held(&store.writer())),
        other => other,
    }
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
/// Written by [`crate::csv_out::CsvOut`] like every export, so an actor name or detail a spreadsheet would run as a
/// formula is neutralised.
pub fn to_csv(records: &[AuditRecord]) -> String {
    use crate::csv_out::{Cell, CsvOut};
    let mut w = CsvOut::new();
    w.header(&["id", "at", "actor", "action", "detail", "prev_hash", "hash"]);
    for r in records.iter().rev() {
        let detail = r.detail.to_string();
        let text = [&r.at, &r.actor, &r.action, &detail, &r.prev_hash, &r.hash].map(|t| Cell::Text(t));
        w.row(std::iter::once(Cell::Int(r.id)).chain(text));
    }
    w.finish()
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
    let rows = stmt.query_map(params![actor, action_prefix, limit as i64], row_to_record)?;
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
    use crate::store::MIGRATIONS;
    use crate::store::Store;

    #[test]
    fn details_read_as_named_fields_with_words_for_values_and_json_only_for_structures() {
        let items = detail_items(r#"{"collection":"demo","approved":true,"words":["a","b"],"spec":{"x":1},"n":3}"#);
        let shown: Vec<(Option<&str>, &str, bool)> =
            items.iter().map(|d| (d.label, d.value.as_str(), d.structured)).collect();
        assert_eq!(
            shown,
            [
                (Some("已批准用于训练"), "是", false),
                (Some("资料库"), "demo", false),
                (None, "3", false),
                (None, r#"{"x":1}"#, true),
                (Some("词"), "a、b", false),
            ]
        );
        assert_eq!(items[3].key, "spec");
        assert_eq!(detail_items("not json")[0].value, "not json");
        assert!(detail_items("{}").is_empty());
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("care.sqlite")).unwrap();
        (dir, s)
    }

    fn add(s: &Store, n: usize) {
        let mut c = s.conn();
        let tx = c.transaction().unwrap();
        for i in 0..n {
            append(&tx, "admin", "search", &serde_json::json!({"q": i})).unwrap();
        }
        tx.commit().unwrap();
    }

    /// The id and reason of a tampering report; panics on anything else.
    fn tampering(r: Result<VerifyReport>) -> (i64, String) {
        match r {
            Err(Error::AuditTampered { id, reason }) => (id, reason),
            other => panic!("expected tampering, got {other:?}"),
        }
    }

    /// What someone with write access to care.sqlite would do: recompute every hash and the head with `mac`.
    fn rechain_with(c: &Connection, mac: impl Fn(&str) -> String) {
        let rows: Vec<(i64, String, String, String, String)> = {
            let mut st = c.prepare("SELECT id, at, actor, action, detail FROM audit ORDER BY id").unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
                .unwrap()
                .map(|r| r.unwrap())
                .collect()
        };
        let mut prev: String = c.query_row("SELECT purged_through_hash FROM audit_anchor", [], |r| r.get(0)).unwrap();
        for (id, at, actor, action, detail) in rows {
            let h = mac(&record_text(&prev, id, &at, &actor, &action, &detail));
            c.execute("UPDATE audit SET prev_hash = ?2, hash = ?3 WHERE id = ?1", params![id, prev, h]).unwrap();
            c.execute("UPDATE audit_head SET last_hash = ?1 WHERE last_id = ?2", params![h, id]).unwrap();
            prev = h;
        }
    }

    fn sha256_hex(text: &str) -> String {
        hex::encode(Sha256::digest(text))
    }

    #[test]
    fn chain_verifies_and_detects_edit_middle_and_tail_removal() {
        let (_d, s) = store();
        assert_eq!(verify_full(&s).unwrap().records_checked, 0);
        for i in 0..5 {
            let mut c = s.conn();
            let tx = c.transaction().unwrap();
            append(&tx, "admin", "collection.create", &serde_json::json!({"name": format!("c{i}")})).unwrap();
            tx.commit().unwrap();
        }
        assert_eq!(verify_full(&s).unwrap().records_checked, 5);
        assert_eq!(list(&s.conn(), None, Some("collection."), 2).unwrap().len(), 2);
        s.conn().execute("UPDATE audit SET detail = '{\"name\":\"evil\"}' WHERE id = 3", []).unwrap();
        assert_eq!(tampering(verify_full(&s)).0, 3);
        assert!(status(&s).error.is_some(), "the status shows the latest failure");

        let (_d2, s2) = store();
        add(&s2, 4);
        s2.conn().execute("DELETE FROM audit WHERE id = 2", []).unwrap();
        assert_eq!(tampering(verify_full(&s2)).0, 3);
        // Removing the tail is caught by the head.
        let (_d3, s3) = store();
        add(&s3, 3);
        s3.conn().execute("DELETE FROM audit WHERE id = 3", []).unwrap();
        tampering(verify_full(&s3));
    }

    #[test]
    fn purge_keeps_the_chain_verifiable_and_removing_the_oldest_record_is_caught() {
        let (_d, s) = store();
        add(&s, 6);
        {
            let c = s.conn();
            // Backdate the first four records, then re-hash them with the key so only the purge is under test.
            c.execute("UPDATE audit SET at = '2020-01-01T00:00:00Z' WHERE id <= 4", []).unwrap();
            rechain_with(&c, |t| key::mac(&c, t).unwrap());
        }
        assert_eq!(verify_full(&s).unwrap().records_checked, 6);
        assert_eq!(checkpoint(&s).unwrap().verified_through, 6);
        let removed = purge_before(&mut s.conn(), "system", "2021-01-01", 180).unwrap();
        assert_eq!(removed, 4);
        assert_eq!(verify_full(&s).unwrap().records_checked, 3, "records 5, 6 and the purge record");
        assert_eq!(checkpoint(&s).unwrap().records_checked, 1, "only the purge record is new");
        assert_eq!(purge_before(&mut s.conn(), "system", "2021-01-01", 180).unwrap(), 0);
        // Removing the oldest remaining record is caught by the anchor.
        s.conn().execute("DELETE FROM audit WHERE id = 5", []).unwrap();
        assert_eq!(tampering(verify_full(&s)).0, 6);
        // Moving the anchor to hide it is caught too.
        let c = s.conn();
        let h5: String = c.query_row("SELECT prev_hash FROM audit WHERE id = 6", [], |r| r.get(0)).unwrap();
        c.execute("UPDATE audit_anchor SET purged_through_id = 5, purged_through_hash = ?1", [h5]).unwrap();
        drop(c);
        let (_, reason) = tampering(verify_full(&s));
        assert!(reason.contains("anchor"), "{reason}");
        let csv = to_csv(&search(&s.conn(), &Filter::default(), 10, 0).unwrap());
        assert!(csv.starts_with("id,at,actor,action,detail,prev_hash,hash\r\n6,"), "{csv}");
    }

    #[test]
    fn removing_the_first_record_is_caught() {
        let (_d, s) = store();
        add(&s, 3);
        s.conn().execute("DELETE FROM audit WHERE id = 1", []).unwrap();
        assert_eq!(tampering(verify_full(&s)).0, 2);
    }

    #[test]
    fn append_rolls_back_with_its_transaction() {
        let (_d, s) = store();
        {
            let mut c = s.conn();
            let tx = c.transaction().unwrap();
            append(&tx, "a", "x", &serde_json::json!({})).unwrap();
            // dropped without commit
        }
        assert_eq!(head(&s.conn()).unwrap(), None);
        assert_eq!(verify_full(&s).unwrap().records_checked, 0);
    }

    #[test]
    fn truncation_with_the_head_moved_back_is_caught() {
        let (_d, s) = store();
        add(&s, 5);
        checkpoint(&s).unwrap();
        {
            let c = s.conn();
            c.execute("DELETE FROM audit WHERE id >= 4", []).unwrap();
            let h3: String = c.query_row("SELECT hash FROM audit WHERE id = 3", [], |r| r.get(0)).unwrap();
            c.execute("UPDATE audit_head SET last_id = 3, last_hash = ?1", [h3]).unwrap();
        }
        for outcome in [verify_full(&s), checkpoint(&s)] {
            let (id, reason) = tampering(outcome);
            assert_eq!(id, 5);
            assert!(reason.contains("truncated") && reason.contains("through 5"), "{reason}");
        }
        // The anchor did not move back with the head.
        tampering(checkpoint(&s));
    }

    #[test]
    fn rewriting_and_rechaining_without_the_key_is_caught() {
        let mut other_key = [0u8; 32];
        getrandom::fill(&mut other_key).unwrap();
        let plain: &dyn Fn(&str) -> String = &sha256_hex;
        let wrong_key: &dyn Fn(&str) -> String = &|t: &str| hex::encode(key::hmac_sha256(&other_key, t.as_bytes()));
        for (name, mac) in [("plain SHA-256", plain), ("another key", wrong_key)] {
            for with_anchor_file in [true, false] {
                let (_d, s) = store();
                add(&s, 5);
                if with_anchor_file {
                    checkpoint(&s).unwrap();
                }
                {
                    let c = s.conn();
                    c.execute("UPDATE audit SET detail = '{\"q\":\"evil\"}' WHERE id = 2", []).unwrap();
                    rechain_with(&c, mac);
                }
                let (id, reason) = tampering(verify_full(&s));
                assert_eq!(id, 1, "{name}: {reason}");
                assert!(reason.contains("changed"), "{name}: {reason}");
                tampering(checkpoint(&s));
            }
        }
        // Moving the keying start so the whole log counts as pre-key records does not help either.
        for keyed_from in [5, 100] {
            let (_d, s) = store();
            add(&s, 5);
            let c = s.conn();
            c.execute("UPDATE audit_key SET keyed_from_id = ?1", [keyed_from]).unwrap();
            rechain_with(&c, sha256_hex);
            drop(c);
            let (_, reason) = tampering(verify_full(&s));
            assert!(reason.contains("rekey") || reason.contains("keying start"), "{reason}");
        }
        // Resetting the keying, so the next start would re-chain the rewritten log with the key, is refused.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("care.sqlite");
        let s = Store::open(&path).unwrap();
        add(&s, 5);
        checkpoint(&s).unwrap();
        {
            let c = s.conn();
            c.execute("UPDATE audit SET detail = '{\"q\":\"evil\"}' WHERE id = 2", []).unwrap();
            c.execute("UPDATE audit_key SET keyed_from_id = NULL", []).unwrap();
            rechain_with(&c, sha256_hex);
        }
        drop(s);
        let s = Store::open(&path).unwrap();
        let (id, reason) = tampering(verify_full(&s));
        assert!(id == 5 && reason.contains("rewritten"), "{reason}");
    }

    #[test]
    fn reopening_the_store_keeps_verifying() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("care.sqlite");
        let s = Store::open(&path).unwrap();
        add(&s, 3);
        checkpoint(&s).unwrap();
        drop(s);
        let key_file = std::fs::read(dir.path().join(KEY_FILE)).unwrap();
        let s = Store::open(&path).unwrap();
        assert_eq!(std::fs::read(dir.path().join(KEY_FILE)).unwrap(), key_file);
        assert_eq!(verify_full(&s).unwrap().records_checked, 3);
        add(&s, 2);
        let r = checkpoint(&s).unwrap();
        assert_eq!((r.records_checked, r.verified_through), (2, 5));
        assert_eq!(status(&s).last, Some(r));
        drop(s);
        // A database restored without its key is named as such.
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let s = Store::open(&path).unwrap();
        let (_, reason) = tampering(verify_full(&s));
        assert!(reason.contains("audit.key"), "{reason}");
    }

    /// A log as a build before the audit key wrote it: schema 6, plain SHA-256 hashes.
    fn old_log(dir: &Path, n: i64) -> std::path::PathBuf {
        let p = dir.join("care.sqlite");
        let c = Connection::open(&p).unwrap();
        for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v <= 6) {
            c.execute_batch(sql).unwrap();
            c.pragma_update(None, "user_version", v).unwrap();
        }
        let mut prev = String::new();
        for id in 1..=n {
            let (at, detail) = (now(), format!("{{\"q\":{id}}}"));
            let h = record_hash(&prev, id, &at, "admin", "search", &detail);
            c.execute(
                "INSERT INTO audit (id, at, actor, action, detail, prev_hash, hash) VALUES (?1, ?2, 'admin', 'search', ?3, ?4, ?5)",
                params![id, at, detail, prev, h],
            )
            .unwrap();
            prev = h;
        }
        c.execute("UPDATE audit_head SET last_id = ?1, last_hash = ?2", params![n, prev]).unwrap();
        p
    }

    fn newest(s: &Store) -> AuditRecord {
        search(&s.conn(), &Filter::default(), 1, 0).unwrap().remove(0)
    }

    #[test]
    fn an_old_unkeyed_log_is_rekeyed_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = old_log(dir.path(), 4);
        let old_hash1: String =
            Connection::open(&p).unwrap().query_row("SELECT hash FROM audit WHERE id = 1", [], |r| r.get(0)).unwrap();
        let s = Store::open(&p).unwrap();
        assert_eq!(verify_full(&s).unwrap().records_checked, 5);
        let rekey = newest(&s);
        assert_eq!((rekey.id, rekey.action.as_str()), (5, "audit.rekey"));
        assert_eq!(rekey.detail["rechained"], 4);
        let hash1: String = s.conn().query_row("SELECT hash FROM audit WHERE id = 1", [], |r| r.get(0)).unwrap();
        assert_ne!(hash1, old_hash1, "record 1 now carries a keyed MAC");
        drop(s);
        let s = Store::open(&p).unwrap();
        assert_eq!(newest(&s).id, 5, "re-keying happens once");

        // An old log that was already tampered with keeps its old hashes, so verification still names the record.
        let dir = tempfile::tempdir().unwrap();
        let p = old_log(dir.path(), 4);
        let c = Connection::open(&p).unwrap();
        c.execute("UPDATE audit SET detail = '{\"q\":\"evil\"}' WHERE id = 2", []).unwrap();
        let old_hash3: String = c.query_row("SELECT hash FROM audit WHERE id = 3", [], |r| r.get(0)).unwrap();
        drop(c);
        let s = Store::open(&p).unwrap();
        let hash3: String = s.conn().query_row("SELECT hash FROM audit WHERE id = 3", [], |r| r.get(0)).unwrap();
        assert_eq!(hash3, old_hash3, "not re-chained");
        assert_eq!(newest(&s).detail["rechained"], 0);
        add(&s, 2);
        let (id, reason) = tampering(verify_full(&s));
        assert_eq!(id, 2);
        assert!(reason.contains("changed"), "{reason}");
        tampering(checkpoint(&s));
    }

    #[test]
    fn checkpoint_checks_only_new_records() {
        let (_d, s) = store();
        add(&s, 6_000);
        assert_eq!(checkpoint(&s).unwrap().records_checked, 6_000, "the first checkpoint walks everything, in pages");
        add(&s, 3);
        let r = checkpoint(&s).unwrap();
        assert_eq!((r.full, r.records_checked, r.verified_through), (false, 3, 6_003));
        assert_eq!(checkpoint(&s).unwrap().records_checked, 0);
        assert_eq!(verify_full(&s).unwrap().records_checked, 6_003);
        // A record before the anchor is not re-read by a checkpoint, but the anchor's own record is.
        s.conn().execute("UPDATE audit SET detail = '{}' WHERE id = 10", []).unwrap();
        assert_eq!(checkpoint(&s).unwrap().records_checked, 0);
        assert_eq!(tampering(verify_full(&s)).0, 10);
        s.conn().execute("UPDATE audit SET hash = 'x' WHERE id = 6003", []).unwrap();
        assert_eq!(tampering(checkpoint(&s)).0, 6_003);
    }

    #[test]
    fn a_deleted_replaced_or_altered_anchor_file_is_caught() {
        let (d, s) = store();
        add(&s, 3);
        checkpoint(&s).unwrap();
        let path = d.path().join(ANCHOR_FILE);
        let at3 = std::fs::read_to_string(&path).unwrap();
        add(&s, 2);
        checkpoint(&s).unwrap();
        let at5 = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (_, reason) = tampering(verify_full(&s));
        assert!(reason.contains("deleted"), "{reason}");
        std::fs::write(&path, &at3).unwrap();
        let (_, reason) = tampering(checkpoint(&s));
        assert!(reason.contains("older"), "{reason}");
        std::fs::write(&path, at5.replace("\"id\":5", "\"id\":4")).unwrap();
        let (_, reason) = tampering(verify_full(&s));
        assert!(reason.contains("altered"), "{reason}");
        std::fs::write(&path, &at5).unwrap();
        assert_eq!(verify_full(&s).unwrap().records_checked, 5);
    }
}
