//! The service layer: every operation a page, the JSON API or the CLI can ask for, written once.
//!
//! Each operation takes the [`Actor`] asking (the authorisation input), checks what that actor may do, and makes
//! its change together with its one audit record in the same SQLite transaction (the free functions in
//! `accounts`, `feedback`, `jobs` and `models` append inside their transactions; `audit::append` only accepts a
//! transaction). Refused attempts, which change nothing, are audited in a transaction of their own; searches and
//! refused searches through the group-commit audit writer (`audit/writer.rs`), in a transaction shared with other
//! searches' records. The HTTP layer and the CLI are adapters: they turn a request into a call here and the result
//! into a response.
//!
//! The operations are grouped into handles by concept: `engine.search()`, `.collections()`, `.ingest()`,
//! `.models()`, `.training()`, `.accounts()`, `.audit()` and `.tasks()` (e.g. `engine.accounts().users(&admin)`).
//! A handle is a `Copy` struct of the parts its operations use (the store, the audit writer, the job queue, the
//! search pipeline…); `Models` and `Training`, which orchestrate imports, the gate and training runs, hold the engine.
//! Each group's operations live beside the code they drive (`impl Models<'_>` in lifecycle.rs, `impl Training<'_>`
//! in training/); what they share is here.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::accounts::{self, ApiToken, LoginPolicy, Role, Session, User};
pub use crate::accounts::{Actor, Admin};
use crate::audit::{self, AuditRecord, AuditStatus, Filter, VerifyReport};
use crate::engine::Engine;
pub use crate::engine::{Accounts, Audit, Collections, Ingest, Models, Search, Tasks, Training};
use crate::error::{Error, Result};
use crate::feedback::{self, DocumentView, Feedback};
use crate::fusion::Method;
use crate::hybrid::FusionSetting;
use crate::ingest::meta::DocMeta;
use crate::jobs::{FileError, Job};
use crate::models::{ActivePair, ModelRecord};
use crate::search::{MAX_QUERY_CHARS, SearchRequest, SearchResults};
use crate::store::{Collection, CollectionStats};
use crate::synonyms::{self, ImportReport, NewSynonym, SynonymEntry};

mod judgments;
mod uploads;
mod users;
mod vectors;
pub use users::{SignInOptions, SignInSection};

/// Refused requests audited per client address per ten minutes ([`Audit::refusal`]).
pub const REFUSALS_PER_ADDRESS: u32 = 20;
/// Refused requests audited in all per ten minutes.
pub const REFUSALS_IN_ALL: u32 = 200;

/// A search as a client asks for it: named collections (pages and the API name at most one), else every
/// collection the actor may read.
#[derive(Debug, Clone, Default)]
pub struct SearchAs {
    pub query: String,
    pub collection: Option<String>,
    /// Further named collections, each checked like `collection` (`care search -c a -c b`).
    pub more_collections: Vec<String>,
    pub limit: Option<usize>,
    pub offset: usize,
    pub method: Option<Method>,
    /// One hit per document, the others counted (the search page's default).
    pub group_by_document: bool,
    /// The words as typed: no synonyms, no pinyin reading.
    pub exact: bool,
    /// Only documents of these departments, types and dates (within the readable collections).
    pub filter: crate::facets::SearchFilter,
    pub sort: crate::facets::Sort,
}

/// What the console's document list asks for.
#[derive(Debug, Clone, Default)]
pub struct DocumentQuery {
    pub title: String,
    pub department: String,
    pub doc_type: String,
    pub offset: usize,
    pub limit: usize,
}

/// One document in the console's list.
#[derive(Debug, Clone, Serialize)]
pub struct DocumentRow {
    pub id: i64,
    pub external_id: String,
    pub title: String,
    pub source: String,
    pub meta: DocMeta,
    pub created_at: String,
    pub chunks: usize,
}

/// The appliance's health as `/healthz` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    pub ok: bool,
    pub schema_version: Option<u32>,
    /// Free bytes on the data disk (None when it cannot be measured).
    pub free_bytes: Option<u64>,
    pub reserve_bytes: u64,
    /// What is wrong, in Chinese.
    pub problems: Vec<String>,
}

/// A user as the console and the API list them.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserInfo {
    pub username: String,
    pub role: String,
    pub created_at: String,
    pub disabled: bool,
    pub locked: bool,
    pub failed_logins: i64,
    pub collections: Vec<String>,
    /// The password was set by an administrator (or printed at installation) and is replaced at the next sign-in.
    pub must_change_password: bool,
    /// `local`, `ldap` or `oidc`: a directory account's role and directory grants follow its groups.
    pub source: String,
    /// How the source reads on a page (本地账户, 目录账户（LDAP）, …).
    pub source_zh: String,
    pub display_name: Option<String>,
    /// Groups (departments) documents' access lists are matched against.
    pub groups: Vec<String>,
}

/// What an admin may change about a user in one request.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserUpdate {
    pub role: Option<String>,
    pub disabled: Option<bool>,
    #[serde(default)]
    pub unlock: bool,
    /// Reset the password (ends the user's sessions and revokes their API tokens). The user replaces it at the
    /// next sign-in unless `permanent`.
    pub password: Option<String>,
    /// The new password is the user's own (the command line's `--permanent`, for a service account or an
    /// operator's own break-glass account): no change is asked for. Never read from a request: over HTTP an
    /// administrator's password for someone else is always temporary.
    #[serde(skip_deserializing)]
    pub permanent: bool,
    /// A local account's groups (departments), comma-separated, which documents' access lists name.
    #[serde(default)]
    pub groups: Option<String>,
}

/// A job (ingestion, or a model job) as the console and the API show it.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: i64,
    pub kind: String,
    pub state: String,
    pub collection: String,
    pub actor: String,
    pub files: Vec<String>,
    pub progress_done: i64,
    pub progress_total: i64,
    pub documents: i64,
    pub errors: Vec<FileError>,
    pub created_at: String,
    pub updated_at: String,
    /// What a running model job is doing ("嵌入 kuake", "评测 kuake"); empty for ingestion.
    pub stage: String,
    /// What a finished model job produced (JSON), e.g. `{"evaluation": 7, "passed": true, …}`.
    pub result: Option<serde_json::Value>,
}

/// Whether audit records of searches carry the query text (`[audit] log_queries`); set once by the server.
static LOG_QUERIES: AtomicBool = AtomicBool::new(true);

/// A query as it may appear in the audit log: its text when the appliance logs queries, else only its length.
fn logged_query(q: &str) -> serde_json::Value {
    let q = q.trim();
    if LOG_QUERIES.load(Ordering::Relaxed) {
        serde_json::Value::String(q.chars().take(MAX_QUERY_CHARS).collect())
    } else {
        serde_json::json!({"chars": q.chars().count()})
    }
}

/// The key terms a search found nowhere, as the audit log keeps them: the words when queries are logged (统计
/// lists them as proposals for the synonym table), else only how many.
fn logged_terms(terms: &[String]) -> serde_json::Value {
    if LOG_QUERIES.load(Ordering::Relaxed) { serde_json::json!(terms) } else { serde_json::json!(terms.len()) }
}

fn not_found_document(id: i64) -> Error {
    Error::NotFound { what: format!("文档 #{id}") }
}

/// A search's audit record (or a refused search's), committed together with the records of searches running at
/// the same time by the group-commit writer ([`audit::writer`]); returns once it is committed.
fn audit_search(
    writer: &crate::audit::writer::Writer,
    actor: &Actor,
    action: &str,
    detail: serde_json::Value,
) -> Result<()> {
    writer.append(&actor.name, action, detail).map(drop)
}

fn may_read(search: &Search<'_>, actor: &Actor, collection: &str) -> Result<bool> {
    Ok(actor.is_admin() || search.readable_collections(actor)?.iter().any(|c| c == collection))
}

/// Whether a document's access list admits `actor` (administrators read everything; an empty list admits
/// everyone who may read the collection).
fn may_see_document(searcher: crate::search::Searcher<'_>, actor: &Actor, document: i64) -> Result<bool> {
    if actor.is_admin() {
        return Ok(true);
    }
    let metas = searcher.meta_index()?;
    Ok(metas.meta(document).is_none_or(|m| crate::facets::access_admits(m, &actor.groups)))
}

/// [`Engine::search`] with any panic inside a search stage caught and turned into an error: one bad input
/// (a snippet of an odd passage, a tokenizer corner) must cost that search, not the request's worker.
fn search_caught(searcher: crate::search::Searcher<'_>, req: &SearchRequest) -> Result<SearchResults> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| searcher.search_unaudited(req))) {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            tracing::error!(panic = %what, "search panicked");
            Err(Error::Internal(format!("search panicked: {what}")))
        }
    }
}

fn job_view(queue: crate::jobs::JobQueue<'_>, j: Job) -> Result<JobView> {
    let files = queue.job_files(j.id)?.into_iter().map(|f| f.file).collect();
    let stage = j.stage_text();
    Ok(JobView {
        id: j.id,
        kind: j.kind,
        state: j.state.as_str().to_string(),
        collection: j.collection,
        actor: j.actor,
        files,
        progress_done: j.progress_done as i64,
        progress_total: j.progress_total as i64,
        documents: j.documents_done as i64,
        errors: j.errors,
        created_at: j.created_at,
        updated_at: j.updated_at,
        stage,
        result: serde_json::from_str(&j.result).ok(),
    })
}

/// What `/healthz` answers: the metadata store readable, a small write to the data disk succeeding (fsynced),
/// and free space above `[training] keep_free_gb`. A disk that fills makes every write fail; the health check
/// says so before clinicians do.
pub fn health_report(engine: &Engine) -> HealthReport {
    let mut problems = Vec::new();
    let schema_version = match engine.store.schema_version() {
        Ok(v) => Some(v),
        Err(e) => {
            problems.push(format!("元数据库不可读 (metadata store: {e})"));
            None
        }
    };
    let probe = engine.dir.root().join(".health-probe");
    let wrote = std::fs::File::create(&probe)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"ok").and_then(|()| f.sync_all()));
    let _ = std::fs::remove_file(&probe);
    if let Err(e) = wrote {
        problems.push(format!("数据目录无法写入 (write probe failed: {e})"));
    }
    let reserve_bytes = engine.cfg.disk_reserve_bytes();
    let free_bytes = crate::datadir::free_bytes(engine.dir.root()).map(|f| f.1).ok();
    if let Some(free) = free_bytes.filter(|f| *f < reserve_bytes) {
        problems.push(format!(
            "数据盘剩余空间 {} 低于保留值 {}（[training] keep_free_gb）(disk below the reserve)",
            crate::error::gib(free),
            crate::error::gib(reserve_bytes)
        ));
    }
    HealthReport { ok: problems.is_empty(), schema_version, free_bytes, reserve_bytes, problems }
}

impl crate::engine::Audit<'_> {
    pub fn set_log_queries(&self, on: bool) {
        LOG_QUERIES.store(on, Ordering::Relaxed);
    }

    /// Audits a request the HTTP layer refused before any operation ran: `request.unauthenticated` (no valid
    /// sign-in or API token), `request.forbidden` (not an administrator) or `request.csrf_rejected` (a form without
    /// its token). `actor` is the signed-in user, or `anonymous`. Rate-limited: at most [`REFUSALS_PER_ADDRESS`]
    /// records per client address and [`REFUSALS_IN_ALL`] in all per ten minutes, so a flood of refused requests
    /// cannot fill the audit log; those beyond the cap are counted and written as one `request.refusals_aggregated`
    /// record a minute (how many, which, from where, first and last: [`crate::audit::writer`]). Returns whether a
    /// record of its own was written.
    pub fn refusal(&self, actor: &str, action: &str, client: &str, detail: &serde_json::Value) -> Result<bool> {
        let (now, window) = (accounts::unix_now(), 600);
        let limits = &self.store.limits.refusals;
        let key = crate::limits::address_key(client);
        if limits.admit(&key, REFUSALS_PER_ADDRESS, window, now).is_err()
            || limits.admit("(all addresses)", REFUSALS_IN_ALL, window, now).is_err()
        {
            self.audit_writer.refused(action, &key);
            return Ok(false);
        }
        let mut detail = detail.clone();
        detail["client"] = key.into();
        let actor: String = actor.chars().take(64).collect();
        // Through the group-commit writer, like searches: a burst of refusals shares commits instead of queueing
        // one transaction each on the writer connection in front of clinicians' searches.
        self.audit_writer.append(&actor, action, detail)?;
        Ok(true)
    }

    // -- audit -----------------------------------------------------------------------------------------------

    pub fn records(&self, _admin: &Admin, f: &Filter, limit: usize, offset: usize) -> Result<Vec<AuditRecord>> {
        // SQLite takes the offset as i64; past the end is simply empty.
        audit::search(&self.store.reader(), f, limit, offset.min(i64::MAX as usize))
    }

    /// Search analytics of the last `days` days (see [`crate::analytics`]).
    pub fn analytics(&self, _admin: &Admin, days: u32) -> Result<crate::analytics::Analytics> {
        crate::analytics::report(self.store, days, accounts::unix_now())
    }

    /// The analytics as CSV; the export is audited (queries clinicians typed leave the appliance).
    pub fn export_analytics(&self, actor: &Admin, days: u32) -> Result<String> {
        let a = self.analytics(actor, days)?;
        let detail = serde_json::json!({"days": a.days, "searches": a.searches});
        self.store.audit_record(&actor.name, "analytics.export", &detail)?;
        Ok(crate::analytics::to_csv(&a))
    }

    /// The records matching `f` as CSV; the export itself is audited (who took a copy of what).
    pub fn export(&self, actor: &Admin, f: &Filter, limit: usize, filter_text: &str) -> Result<String> {
        let records = self.records(actor, f, limit, 0)?;
        let detail = serde_json::json!({"records": records.len(), "filter": filter_text});
        self.store.audit_record(&actor.name, "audit.export", &detail)?;
        Ok(audit::to_csv(&records))
    }

    /// `full`: walk the whole log; otherwise verify what was appended since the last checkpoint.
    pub fn verify(&self, _admin: &Admin, full: bool) -> Result<VerifyReport> {
        if full { audit::verify_full(self.store) } else { audit::checkpoint(self.store) }
    }

    pub fn status(&self, _admin: &Admin) -> Result<AuditStatus> {
        Ok(audit::status(self.store))
    }

    /// Retention: removes records before `cutoff` (RFC 3339), recording the purge in the same transaction.
    pub fn purge(&self, actor: &Admin, cutoff: &str, retention_days: u32) -> Result<u64> {
        audit::purge_before(&mut self.store.conn(), &actor.name, cutoff, retention_days)
    }
}

impl crate::engine::Search<'_> {
    // -- reading ---------------------------------------------------------------------------------------------

    /// What `actor` may read: every collection for an admin, the granted ones for a clinician.
    pub fn readable_collections(&self, actor: &Actor) -> Result<Vec<String>> {
        match actor.user_id {
            Some(id) if !actor.is_admin() => accounts::granted_collections(self.store, id),
            _ if actor.is_admin() => Ok(self.store.collection_list()?.into_iter().map(|c| c.name).collect()),
            _ => Ok(Vec::new()),
        }
    }

    /// Search as `actor`: only collections the actor may read are searched; naming another one is refused (a
    /// clinician cannot learn whether it exists). Every search is audited, and so is every refused one.
    pub fn run(&self, actor: &Actor, s: &SearchAs) -> Result<SearchResults> {
        let mut req = SearchRequest {
            query: s.query.clone(),
            collections: None,
            limit: s.limit,
            offset: s.offset,
            method: s.method,
            dense_weight: None,
            group_by_document: s.group_by_document,
            exact: s.exact,
            synonym_weight: None,
            filter: s.filter.clone(),
            sort: s.sort,
            // Documents whose access lists leave the actor out are not searched, in either leg.
            reader_groups: (!actor.is_admin()).then(|| actor.groups.clone()),
        };
        let wanted: Vec<String> =
            s.collection.iter().chain(&s.more_collections).filter(|c| !c.is_empty()).cloned().collect();
        let refused = |action: &str, reason: &str, err: Error| -> Result<SearchResults> {
            // One named collection is recorded as its name (null for none), several as a list.
            let named = match wanted.as_slice() {
                [] => serde_json::Value::Null,
                [one] => serde_json::json!(one),
                many => serde_json::json!(many),
            };
            let detail = serde_json::json!({
                "query": logged_query(&s.query), "collection": named, "offset": s.offset, "reason": reason,
            });
            audit_search(self.audit_writer, actor, action, detail)?;
            Err(err)
        };
        if let Err(e) = self.searcher.validate_search(&req) {
            return refused("search.rejected", &e.to_string(), e);
        }
        let readable = self.readable_collections(actor)?;
        if let Some(c) = wanted.iter().find(|c| !(actor.is_admin() || readable.contains(*c))) {
            let e = Error::Forbidden(format!("你没有访问知识库「{c}」的权限；请联系管理员开通"));
            return refused("search.denied", "collection not granted", e);
        }
        let cols = if wanted.is_empty() { readable } else { wanted.clone() };
        let mut res = if cols.is_empty() {
            SearchResults::empty(req.query.trim())
        } else {
            req.collections = Some(cols.clone());
            match search_caught(self.searcher, &req) {
                Ok(r) => r,
                Err(e) if e.code().class() == crate::error::StatusClass::Internal => {
                    // A failure of ours, not of the request: audited, and the person gets words to pass on (the
                    // server adds the request id to every error it renders).
                    let _ = refused("search.failed", &e.to_string(), e);
                    return Err(Error::Internal(
                        "检索时发生内部错误，已记录在审计日志（search.failed）；请稍后重试，或把页面上的请求编号告诉管理员                          (the search failed; it was audited)"
                            .into(),
                    ));
                }
                Err(e) => return Err(e),
            }
        };
        let mut detail = serde_json::json!({
            "query": logged_query(&res.query), "collections": cols, "results": res.hits.len(),
            "candidates": res.total_candidates, "offset": s.offset, "method": res.method,
            "not_found": res.not_found, "missing": logged_terms(&res.missing_terms),
            "took_ms": (res.took_ms * 10.0).round() / 10.0,
        });
        if !res.filter.is_empty() {
            detail["filter"] = serde_json::json!(res.filter);
        }
        let audited = std::time::Instant::now();
        audit_search(self.audit_writer, actor, "search", detail)?;
        res.stages.audit_ms = audited.elapsed().as_secs_f64() * 1e3;
        Ok(res)
    }

    /// A result the actor opened from a search (its rank on the page's ranking, 1-based): an audit record through
    /// the group-commit writer, read by the search analytics (click-through per query).
    pub fn click(&self, actor: &Actor, query: &str, document: i64, chunk: Option<i64>, rank: usize) -> Result<()> {
        let detail = serde_json::json!({
            "query": logged_query(query), "document": document, "chunk": chunk, "rank": rank.min(100_000),
        });
        audit_search(self.audit_writer, actor, "search.click", detail)
    }

    /// A document, if `actor` may read its collection (otherwise not found, never forbidden: ids must not reveal
    /// what exists). A refused read is audited.
    pub fn document(&self, actor: &Actor, id: i64) -> Result<DocumentView> {
        let denied = |detail: serde_json::Value| -> Result<DocumentView> {
            self.store.audit_record(&actor.name, "document.denied", &detail)?;
            Err(not_found_document(id))
        };
        let doc = match feedback::document(self.store, id) {
            Ok(d) => d,
            Err(Error::NotFound { .. }) => {
                return denied(serde_json::json!({"document": id, "reason": "no such document"}));
            }
            Err(e) => return Err(e),
        };
        if !may_read(self, actor, &doc.collection)? {
            let reason = "collection not granted";
            return denied(serde_json::json!({"document": id, "collection": doc.collection, "reason": reason}));
        }
        if !may_see_document(self.searcher, actor, id)? {
            let reason = "not on the document's access list";
            return denied(serde_json::json!({"document": id, "collection": doc.collection, "reason": reason}));
        }
        Ok(doc)
    }

    /// Stores a clinician's judgement of a passage for training, audited with it.
    pub fn feedback(&self, actor: &Actor, query: &str, chunk_id: i64, helpful: bool) -> Result<i64> {
        let n = query.trim().chars().count();
        if n == 0 || n > MAX_QUERY_CHARS {
            let detail = serde_json::json!({"chunk": chunk_id, "query_chars": n, "reason": "query empty or too long"});
            self.store.audit_record(&actor.name, "feedback.rejected", &detail)?;
            return Err(Error::InvalidInput(format!(
                "反馈所针对的查询须为 1 到 {MAX_QUERY_CHARS} 个字符 (feedback query must be 1-{MAX_QUERY_CHARS} characters)"
            )));
        }
        let denied = |reason: &str| -> Result<i64> {
            let detail = serde_json::json!({"chunk": chunk_id, "query": logged_query(query), "reason": reason});
            self.store.audit_record(&actor.name, "feedback.denied", &detail)?;
            Err(Error::NotFound { what: format!("片段 #{chunk_id}") })
        };
        let (collection, document) = match feedback::chunk_collection(self.store, chunk_id) {
            Ok((c, d, _)) => (c, d),
            Err(Error::NotFound { .. }) => return denied("no such passage"),
            Err(e) => return Err(e),
        };
        if !may_read(self, actor, &collection)? {
            return denied("collection not granted");
        }
        if !may_see_document(self.searcher, actor, document)? {
            return denied("not on the document's access list");
        }
        // Feedback feeds training and can start a schedule's run (min_new_feedback): one account must not be able
        // to flood it. Counted after the checks above, so refused clicks do not use up the allowance.
        let per_hour = self.cfg.limits.feedback_per_user_per_hour.max(1);
        if let Err(wait) = self.store.limits.feedback.admit(&actor.name, per_hour, 3600, accounts::unix_now()) {
            return Err(Error::RateLimited(format!(
                "反馈过于频繁：每人每小时最多 {per_hour} 条，请 {} 后再试 (too much feedback from one user)",
                crate::limits::minutes_zh(wait)
            )));
        }
        let id = feedback::record(self.store, &actor.name, query, chunk_id, helpful, &logged_query(query))?;
        // A schedule may fire on the count of new feedback.
        self.queue.tasks_changed();
        Ok(id)
    }

    pub fn feedback_list(&self, _admin: &Admin, collection: Option<&str>, limit: usize) -> Result<Vec<Feedback>> {
        feedback::list(self.store, collection, limit.min(100_000))
    }

    // -- synonym table ---------------------------------------------------------------------------------------

    /// Groups whose terms or note contain `filter`, a page of them, and how many match.
    pub fn synonyms(
        &self,
        _admin: &Admin,
        filter: Option<&str>,
        limit: usize,
        offset: usize,
    ) -> Result<(Vec<SynonymEntry>, usize)> {
        synonyms::list(self.store, filter, limit, offset)
    }

    /// Adds a group, or replaces group `id`; in force at the next search of every process.
    pub fn save_synonym(&self, actor: &Admin, id: Option<i64>, group: &NewSynonym) -> Result<SynonymEntry> {
        self.changing_synonyms(|| synonyms::save(self.store, &actor.name, id, group))
    }

    pub fn delete_synonym(&self, actor: &Admin, id: i64) -> Result<SynonymEntry> {
        self.changing_synonyms(|| synonyms::delete(self.store, &actor.name, id))
    }

    /// The writer, not a clinician's search, rebuilds the table after its change (seconds for 50,000 groups);
    /// searches meanwhile keep the table they had.
    fn changing_synonyms<R>(&self, change: impl FnOnce() -> Result<R>) -> Result<R> {
        self.synonyms.replace_with(|held| {
            let out = change()?;
            if !held {
                return Ok((None, out));
            }
            let version = synonyms::version(&self.store.reader())?;
            Ok((Some(synonyms::SynonymTable::load(self.store, version)?), out))
        })
    }

    /// Imports a CSV file's bytes (UTF-8 or GB18030, as spreadsheets in China save it); all or nothing.
    pub fn import_synonyms(&self, actor: &Admin, bytes: &[u8], replace: bool) -> Result<ImportReport> {
        if bytes.len() > synonyms::MAX_CSV_BYTES {
            return Err(Error::TooLarge {
                what: "同义词 CSV".into(),
                size: bytes.len() as u64,
                limit: synonyms::MAX_CSV_BYTES as u64,
                hint: "请拆分后分批导入".into(),
            });
        }
        // Read, checked, staged in batches and the new table built at background priority (seconds of CPU for
        // 50,000 groups, which searches beside it need more); then moved in and installed together: neither the
        // writer nor the rebuild stalls a search.
        let (staged, table) = crate::priority::in_background(|| -> Result<_> {
            let text = crate::ingest::encoding::decode(std::path::Path::new("synonyms.csv"), bytes, None)?;
            let groups = synonyms::parse_csv(&text)?;
            let staged = synonyms::stage(self.store, &actor.name, &groups, replace, "import")?;
            // Only where a search holds a table (not in `care synonyms import`).
            let table = self.synonyms.holds_value().then(|| staged.table());
            Ok((staged, table))
        })?;
        self.synonyms.replace_with(|_| Ok((table, staged.commit(self.store)?)))
    }

    pub fn export_synonyms(&self, _admin: &Admin) -> Result<String> {
        synonyms::export_csv(self.store)
    }
}

impl crate::engine::Collections<'_> {
    /// Deletes documents of a collection by external id everywhere (SQLite, the lexical index, every dense table),
    /// recorded in the audit log. Unknown ids are reported as not found and nothing is deleted.
    pub fn delete_documents(
        &self,
        collection: &str,
        external_ids: &[String],
        actor: &crate::accounts::Admin,
    ) -> Result<usize> {
        self.indexer.delete_documents(collection, external_ids, &actor.name)
    }

    /// Collections with counts, only those `actor` may read.
    pub fn list(&self, actor: &Actor) -> Result<Vec<CollectionStats>> {
        let readable = self.search.readable_collections(actor)?;
        Ok(self.indexer.collection_stats()?.into_iter().filter(|c| readable.contains(&c.collection.name)).collect())
    }

    // -- collections, uploads, jobs --------------------------------------------------------------------------

    pub fn create(&self, actor: &Admin, name: &str, description: &str) -> Result<Collection> {
        self.indexer.create_collection(name.trim(), description, &actor.name)
    }

    pub fn approve(&self, actor: &Admin, collection: &str, approved: bool) -> Result<Collection> {
        self.indexer.set_approved_for_training(collection, approved, &actor.name)
    }

    /// Deletes a collection with its documents, indexes and grants; returns how many documents went.
    pub fn delete(&self, actor: &Admin, collection: &str) -> Result<usize> {
        self.indexer.delete_collection(collection, &actor.name)
    }

    /// A page of `collection`'s documents, newest first, with how many match: title (or id) containing
    /// `q.title`, and the department and type named (empty: any; `-` for "not filed").
    pub fn documents(&self, _admin: &Admin, collection: &str, q: &DocumentQuery) -> Result<(Vec<DocumentRow>, usize)> {
        let col = self.store.collection(collection)?;
        let conn = self.store.reader();
        let like = format!("%{}%", q.title.trim().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
        let wanted = |v: &str| match v.trim() {
            "-" => Some(String::new()),
            "" => None,
            v => Some(v.to_string()),
        };
        let (dept, kind) = (wanted(&q.department), wanted(&q.doc_type));
        let filter = "d.collection_id = ?1 AND d.state != 'deleting'
             AND (?2 = '%%' OR d.title LIKE ?2 ESCAPE '\\' OR d.external_id LIKE ?2 ESCAPE '\\')
             AND (?3 IS NULL OR d.department = ?3) AND (?4 IS NULL OR d.doc_type = ?4)";
        let args = rusqlite::params![col.id, like, dept, kind];
        let total: i64 =
            conn.query_row(&format!("SELECT COUNT(*) FROM documents d WHERE {filter}"), args, |r| r.get(0))?;
        let sql = format!(
            "SELECT d.id, d.external_id, d.title, d.source, d.department, d.doc_type, d.doc_date, d.created_at,
                    (SELECT COUNT(*) FROM chunks k WHERE k.document_id = d.id), d.issuer, d.language, d.access
             FROM documents d WHERE {filter} ORDER BY d.id DESC LIMIT {} OFFSET {}",
            q.limit.clamp(1, 500),
            q.offset.min(1_000_000)
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(args, |r| {
            Ok(DocumentRow {
                id: r.get(0)?,
                external_id: r.get(1)?,
                title: r.get(2)?,
                source: r.get(3)?,
                meta: DocMeta {
                    department: r.get(4)?,
                    doc_type: r.get(5)?,
                    date: r.get(6)?,
                    issuer: r.get(9)?,
                    language: r.get(10)?,
                    access: r.get(11)?,
                },
                created_at: r.get(7)?,
                chunks: r.get::<_, i64>(8)? as usize,
            })
        })?;
        Ok((rows.collect::<std::result::Result<_, _>>()?, total as usize))
    }

    /// The departments and types `collection`'s documents are filed under, with counts (the list page's choices).
    pub fn filing_values(
        &self,
        _admin: &Admin,
        collection: &str,
    ) -> Result<(Vec<(String, usize)>, Vec<(String, usize)>)> {
        let col = self.store.collection(collection)?;
        let conn = self.store.reader();
        let values = |column: &str| -> Result<Vec<(String, usize)>> {
            let mut stmt = conn.prepare(&format!(
                "SELECT {column}, COUNT(*) FROM documents WHERE collection_id = ?1 AND {column} != ''
                 GROUP BY {column} ORDER BY COUNT(*) DESC, {column} LIMIT 200"
            ))?;
            let rows = stmt.query_map([col.id], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as usize)))?;
            Ok(rows.collect::<std::result::Result<_, _>>()?)
        };
        Ok((values("department")?, values("doc_type")?))
    }

    /// Files documents of `collection` by external id (an admin's edit of one document, or a spreadsheet of many):
    /// the fields the filing gives replace the stored ones, an empty value clears one, the others stay. Only
    /// SQLite changes (searches read the filing from there), so no document is re-indexed; a later re-ingest of
    /// the same file keeps it. One audit record for the lot. Returns how many documents changed and the ids that
    /// name no document of the collection.
    pub fn file_documents(
        &self,
        actor: &Admin,
        collection: &str,
        filing: &crate::ingest::meta::Filing,
    ) -> Result<(usize, Vec<String>)> {
        let col = self.store.collection(collection)?;
        let mut clean = Vec::with_capacity(filing.rows.len());
        for (id, m) in &filing.rows {
            let m = m.checked().map_err(|e| Error::InvalidInput(format!("文档「{id}」：{e}")))?;
            clean.push((id, m));
        }
        const COLUMNS: [&str; 6] = ["department", "doc_type", "doc_date", "issuer", "language", "access"];
        let known: std::collections::HashSet<String> = {
            let conn = self.store.reader();
            let mut stmt = conn.prepare("SELECT external_id FROM documents WHERE collection_id = ?1")?;
            let rows = stmt.query_map([col.id], |r| r.get(0))?;
            rows.collect::<std::result::Result<_, _>>()?
        };
        let (rows, unknown): (Vec<_>, Vec<_>) = clean.into_iter().partition(|(id, _)| known.contains(id.as_str()));
        let unknown: Vec<String> = unknown.into_iter().map(|(id, _)| id.to_string()).collect();
        let mut detail = serde_json::json!({"collection": collection, "documents": rows.len(), "unknown": unknown.len(),
            "fields": COLUMNS.iter().zip(filing.sets).filter(|(_, s)| *s).map(|(c, _)| *c).collect::<Vec<_>>()});
        if let [(id, m)] = rows.as_slice() {
            detail["document"] = serde_json::json!(id);
            detail["meta"] = serde_json::json!(m);
        }
        let set: Vec<String> =
            (0..6).map(|i| format!("{0} = CASE WHEN ?{1} THEN ?{2} ELSE {0} END", COLUMNS[i], 3 + i, 9 + i)).collect();
        let s = filing.sets;
        // A batch at a time, so that a 100,000-row spreadsheet never holds the writer (which every search's audit
        // record waits for, in this process or the server's) for more than a few milliseconds. The audit record
        // goes with the first batch; filing is idempotent, so after a failure part-way the same file is filed again.
        // Searches keep the filing they had until the whole spreadsheet is in, then one reload (not one per batch)
        // by this writer: no search pays for it. A process that never searched (`care collection file`) builds none.
        // At background priority: a spreadsheet's batches are seconds of CPU that searches beside it need more.
        self.meta_index.replace_with(|held| {
            crate::priority::in_background(|| {
                let changed = self.file_batches(actor, col.id, &rows, s, &set, &detail)?;
                if !held {
                    return Ok((None, (changed, unknown)));
                }
                let version = crate::facets::MetaIndex::version(&self.store.reader())?;
                Ok((Some(crate::facets::MetaIndex::load(self.store, version)?), (changed, unknown)))
            })
        })
    }

    /// The filing's rows written [`FILING_BATCH`] per transaction, the audit record with the first.
    fn file_batches(
        &self,
        actor: &Admin,
        collection_id: i64,
        rows: &[(&String, crate::ingest::meta::DocMeta)],
        s: [bool; 6],
        set: &[String],
        detail: &serde_json::Value,
    ) -> Result<usize> {
        let mut changed = 0;
        let update = format!("UPDATE documents SET {} WHERE collection_id = ?1 AND external_id = ?2", set.join(", "));
        self.store.in_batches(rows, FILING_BATCH, |tx, batch, i| {
            let mut stmt = tx.prepare_cached(&update)?;
            for (id, m) in batch {
                let args = rusqlite::params![
                    collection_id,
                    id,
                    s[0],
                    s[1],
                    s[2],
                    s[3],
                    s[4],
                    s[5],
                    m.department,
                    m.doc_type,
                    m.date,
                    m.issuer,
                    m.language,
                    m.access
                ];
                changed += stmt.execute(args)?.min(1);
            }
            if i == 0 {
                crate::audit::append(tx, &actor.name, "document.file", detail)?;
            }
            Ok(())
        })?;
        Ok(changed)
    }
}

/// Rows of a filing spreadsheet written per transaction. The filing runs at background priority, so on a busy
/// machine a batch holds the writer for longer than its own CPU time (500 rows: searches' audit records waited up
/// to 19 ms, release, 2 cores, 8 clients searching).
const FILING_BATCH: usize = 250;

impl crate::engine::Ingest<'_> {
    /// A fresh folder for an upload's files, after checking the collection exists (so nothing is written for a
    /// typo). The job created by [`Ingest::submit_upload`] owns the folder.
    pub fn new_upload(&self, _admin: &Admin, collection: &str) -> Result<std::path::PathBuf> {
        self.store.collection(collection)?;
        self.dir.ensure_free(self.cfg.disk_reserve_bytes(), "上传文件", 0)?;
        self.queue.new_upload_dir()
    }

    /// A fresh folder for uploaded files an operation reads once (a model package for [`Models::import`],
    /// a judgment set); the caller removes it afterwards, whatever the outcome.
    pub fn new_staging_upload(&self, _admin: &Admin) -> Result<std::path::PathBuf> {
        self.dir.ensure_free(self.cfg.disk_reserve_bytes(), "上传文件", 0)?;
        self.queue.new_upload_dir()
    }

    /// Queues an ingest job for uploaded files (audited as `ingest.submit` in the job's transaction). `meta` is
    /// the upload form's department, type and date, for the documents that do not say their own.
    pub fn submit_upload(
        &self,
        actor: &Admin,
        collection: &str,
        files: Vec<std::path::PathBuf>,
        meta: crate::ingest::meta::DocMeta,
    ) -> Result<i64> {
        self.queue.submit_ingest_as_user(collection, files, crate::IngestOptions { meta, ..Default::default() }, actor)
    }

    /// Queues a new version of one document of `collection` (the document list's 更新内容): the uploaded file
    /// must hold one document, which replaces `external_id` whatever the file's name (its filing stays where the
    /// file gives none). Archives are refused: their members would all claim the one id.
    pub fn submit_replacement(
        &self,
        actor: &Admin,
        collection: &str,
        external_id: &str,
        files: Vec<std::path::PathBuf>,
    ) -> Result<i64> {
        let col = self.store.collection(collection)?;
        let known: bool = self.store.reader().query_row(
            "SELECT EXISTS(SELECT 1 FROM documents WHERE collection_id = ?1 AND external_id = ?2)",
            rusqlite::params![col.id, external_id],
            |r| r.get(0),
        )?;
        if !known {
            return Err(Error::InvalidInput(format!("资料库 {collection} 中没有文档「{external_id}」")));
        }
        let [file] = files.as_slice() else {
            return Err(Error::InvalidInput(format!("更新一篇文档需要正好一个文件，收到 {} 个", files.len())));
        };
        if crate::ingest::FileKind::of(file)? == crate::ingest::FileKind::Zip {
            return Err(Error::InvalidInput(
                "更新单篇文档请上传该文档本身（PDF、DOCX、HTML、Markdown、TXT，或只含一条记录的 JSONL/CSV），不能是压缩包"
                    .into(),
            ));
        }
        let opts = crate::IngestOptions { replaces: Some(external_id.to_string()), ..Default::default() };
        self.queue.submit_ingest_as_user(collection, files, opts, actor)
    }

    /// Ingests files on this machine synchronously, in the caller's thread (evaluation and benchmark corpora);
    /// audited as `ingest.files` with what was written once it ends.
    pub fn files(
        &self,
        actor: &Admin,
        collection: &str,
        files: &[std::path::PathBuf],
        progress: &mut dyn FnMut(crate::engine::IngestProgress),
    ) -> Result<crate::engine::IngestReport> {
        let report = self.indexer.ingest_files(collection, files, progress)?;
        let detail = serde_json::json!({
            "collection": collection,
            "files": files.len(),
            "failed": report.failed(),
            "documents": report.documents_written(),
        });
        self.store.audit_record(&actor.name, "ingest.files", &detail)?;
        Ok(report)
    }
}

/// A setting as the console's settings page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SettingView {
    pub key: String,
    pub config: String,
    pub label: String,
    pub help: String,
    /// In force now.
    pub value: f64,
    /// `care.toml`'s (or the compiled default).
    pub default: f64,
    pub min: f64,
    pub max: f64,
    pub integer: bool,
    /// Changed in the console: by whom and when (local time).
    pub changed_by: Option<String>,
    pub changed_at: Option<String>,
}

/// The server's own defaults for the settings it applies (how long a sign-in lasts), from its `[auth]` section.
#[derive(Debug, Clone, Copy)]
pub struct SessionDefaults {
    pub idle_seconds: i64,
    pub max_seconds: i64,
}

impl crate::engine::Settings<'_> {
    /// Every changeable setting with its value in force, its default and the last change.
    pub fn list(&self, _admin: &Admin, session: SessionDefaults) -> Vec<SettingView> {
        use crate::settings::Setting;
        Setting::ALL
            .into_iter()
            .map(|s| {
                let spec = s.spec();
                // An f32 as written (0.7, not 0.699999988…).
                let short = |x: f32| x.to_string().parse::<f64>().unwrap_or(f64::from(x));
                let default = match s {
                    Setting::DenseWeight => short(self.cfg.search.default_dense_weight),
                    Setting::SynonymWeight => short(self.cfg.search.synonym_weight),
                    Setting::ChunkTokens => self.cfg.ingest.chunk.max_tokens as f64,
                    Setting::SessionIdleMinutes => session.idle_seconds as f64 / 60.0,
                    Setting::SessionMaxHours => session.max_seconds as f64 / 3600.0,
                };
                let change = self.live.change(s);
                SettingView {
                    key: spec.key.into(),
                    config: spec.config.into(),
                    label: spec.label.into(),
                    help: spec.help.into(),
                    value: change.as_ref().map_or(default, |c| c.value),
                    default,
                    min: spec.min,
                    max: spec.max,
                    integer: spec.integer,
                    changed_by: change.as_ref().map(|c| c.by.clone()),
                    changed_at: change.as_ref().map(|c| crate::clock::local(&c.at)),
                }
            })
            .collect()
    }

    /// Changes a setting from the text an administrator typed (empty: back to `care.toml`'s), audited.
    pub fn set(&self, actor: &Admin, key: &str, value: &str) -> Result<()> {
        let s = crate::settings::Setting::parse_key(key).ok_or_else(|| {
            Error::InvalidInput(format!("没有名为「{}」的设置", key.chars().take(40).collect::<String>()))
        })?;
        let v = if value.trim().is_empty() { None } else { Some(s.parse_value(value)?) };
        crate::settings::set(self.store, &self.live, &actor.name, s, v)
    }

    /// The hospital sign-in as the settings page edits it: per protocol, whether it is on, who saved it in the
    /// console (else `care.toml` applies) and its fields with the values in force (secrets never shown).
    pub fn sign_in(&self, _admin: &Admin) -> Vec<SignInSection> {
        use crate::directory::console::Protocol;
        let s = self.sign_in.get();
        Protocol::ALL
            .into_iter()
            .map(|p| SignInSection {
                protocol: p,
                key: p.key(),
                label: p.label(),
                enabled: s.enabled(p),
                saved: s
                    .saved(p)
                    .map(|v| crate::directory::console::Saved { by: v.by.clone(), at: crate::clock::local(&v.at) }),
                fields: s.fields(p),
            })
            .collect()
    }

    /// Saves a protocol's section from the settings page's form (`clear`: back to `care.toml`'s), audited. The
    /// section is saved only when it is complete and its server answers; the next sign-in uses it.
    pub fn save_sign_in(
        &self,
        actor: &Admin,
        protocol: &str,
        form: &std::collections::BTreeMap<String, String>,
        clear: bool,
    ) -> Result<()> {
        use crate::directory::console::{self, Protocol};
        let p = Protocol::parse(protocol)?;
        let current = self.sign_in.get();
        let section = if clear {
            None
        } else {
            let checked = console::from_form(self.store, &current, p, form)?;
            // The administrator's input does not work (yet): a refusal of the form, not an outage of the appliance.
            checked.section.probe().map_err(|e| Error::InvalidInput(format!("未保存：{e}")))?;
            Some(checked.json)
        };
        console::save(self.store, &actor.name, &current, p, section.as_ref())?;
        self.sign_in.reload(self.store, &self.cfg.ldap, &self.cfg.oidc)
    }

    /// How long a sign-in lasts (idle, in all): the console's settings, else the server's own.
    pub fn session_seconds(&self, defaults: SessionDefaults) -> (i64, i64) {
        use crate::settings::Setting;
        let idle = self.live.get(Setting::SessionIdleMinutes).map_or(defaults.idle_seconds, |m| (m * 60.0) as i64);
        let max = self.live.get(Setting::SessionMaxHours).map_or(defaults.max_seconds, |h| (h * 3600.0) as i64);
        (idle, max)
    }
}

impl crate::engine::Tasks<'_> {
    pub fn jobs(&self, _admin: &Admin, limit: usize) -> Result<Vec<JobView>> {
        self.queue.jobs(limit.clamp(1, 500))?.into_iter().map(|j| job_view(self.queue, j)).collect()
    }

    pub fn job(&self, _admin: &Admin, id: i64) -> Result<JobView> {
        job_view(self.queue, self.queue.job(id)?)
    }

    pub fn cancel(&self, actor: &Admin, id: i64) -> Result<()> {
        self.queue.cancel_job(id, &actor.name)
    }

    /// Jobs per state, for the metrics endpoint.
    pub fn counts(&self) -> Result<Vec<(String, i64)>> {
        let conn = self.store.reader();
        let mut st = conn.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }
}

impl crate::engine::Models<'_> {
    // -- models ----------------------------------------------------------------------------------------------

    pub fn list(&self, _admin: &Admin) -> Result<(Vec<ModelRecord>, Option<ActivePair>)> {
        Ok((self.engine.retrieval().model_records()?, self.engine.retrieval().active_models()?))
    }

    /// Makes (query, document) the live pair, audited with the previous pair in the activation's transaction.
    pub fn activate(
        &self,
        actor: &Admin,
        query: &str,
        document: &str,
        progress: &mut dyn FnMut(crate::hybrid::DenseProgress) -> Result<()>,
    ) -> Result<ActivePair> {
        self.engine.retrieval().activate_models_by(query, document, &actor.name, None, progress)
    }

    /// [`Self::activate`], the query model's queries encoded by `graph` from now on (the choice the evaluation gate
    /// makes on promotion, made by hand: `care model activate --query-graph`).
    pub fn activate_with_graph(
        &self,
        actor: &Admin,
        (query, graph): (&str, crate::Graph),
        document: &str,
        progress: &mut dyn FnMut(crate::hybrid::DenseProgress) -> Result<()>,
    ) -> Result<ActivePair> {
        self.engine.retrieval().activate_models_by(query, document, &actor.name, Some(graph), progress)
    }

    /// Stores the fusion setting fitted on labelled queries for `collection` (`care tune-fusion`); the weights and
    /// their `fusion.tune` audit record are written in one transaction.
    pub fn tune_fusion(
        &self,
        actor: &Admin,
        collection: &str,
        setting: &FusionSetting,
        metrics: &serde_json::Value,
    ) -> Result<()> {
        let row = self.engine.retrieval().fusion_row(collection, setting, metrics)?;
        let mut conn = self.engine.store.conn();
        let tx = conn.transaction()?;
        crate::models::upsert_fusion(&tx, &row)?;
        let detail = serde_json::json!({
            "collection": collection, "method": row.method, "dense_weight": setting.dense_weight,
            "fitted_on": row.fitted_on,
        });
        audit::append(&tx, &actor.name, "fusion.tune", &detail)?;
        tx.commit()?;
        Ok(())
    }

    /// Writes `collection`'s chunks to `out` for offline embedding ([`crate::vectors::Vectors::export_chunks_for`]): clinical text
    /// leaving the data directory, so the export is audited like the audit log's own (who took a copy of what).
    pub fn export_chunks(
        &self,
        admin: &Admin,
        collection: &str,
        out: &std::path::Path,
        pending_for: Option<&str>,
    ) -> Result<crate::vectors::ChunkExport> {
        let r = self.engine.vectors().export_chunks_for(collection, out, pending_for)?;
        let detail = serde_json::json!({
            "collection": r.collection, "chunks": r.chunks, "path": r.path.display().to_string(),
            "pending_for": pending_for,
        });
        self.engine.store.audit_record(&admin.name, "collection.export_chunks", &detail)?;
        Ok(r)
    }
}
