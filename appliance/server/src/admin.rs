//! The admin console: collections (create, upload, approve for training, delete), jobs (live progress, errors per
//! file, cancel), users (roles, lock, password reset, grants, API tokens), models (versions, active pair,
//! metrics) and the audit log (filter, verify, CSV export). Each form posts to a handler that calls the same
//! engine service operation as its JSON twin in `api`, then redirects back with a signed message.

use crate::filters;
use actix_web::http::header;
use actix_web::{HttpResponse, get, post, web};
use askama::Template;
use care_engine::audit::AuditRecord;
use care_engine::{JobView, UserInfo, UserUpdate, accounts};
use serde::Deserialize;

use crate::AppState;
use crate::api::{self, AuditQuery};
use crate::call::{call, call_admin};
use crate::errors::ApiError;
use crate::guard::{Caller, percent_encode};
use crate::pages::{Nav, render, see_other};
use crate::uploads;

/// The message an admin action leaves for the page it redirects to. It travels in the URL, so it carries a keyed
/// hash: a link crafted elsewhere (`/admin/users?flash=请把密码发给…`) shows nothing in the console.
#[derive(Debug, Default, Deserialize)]
pub struct Flash {
    #[serde(default)]
    flash: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    sig: Option<String>,
}

fn flash_sig(kind: &str, msg: &str) -> String {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).expect("OS random source");
        k
    });
    let mac = care_engine::audit::hmac_sha256(key, format!("{kind}\u{1f}{msg}").as_bytes());
    hex::encode(&mac[..16])
}

impl Flash {
    fn checked(&self, kind: &str, msg: &Option<String>) -> Option<String> {
        let (m, sig) = (msg.as_ref()?, self.sig.as_deref()?);
        (flash_sig(kind, m) == sig).then(|| m.chars().take(500).collect())
    }
    pub(crate) fn flash(&self) -> Option<String> {
        self.checked("flash", &self.flash)
    }
    pub(crate) fn error(&self) -> Option<String> {
        self.checked("error", &self.error)
    }
}

pub(crate) fn back_with(path: &str, flash: &str) -> HttpResponse {
    signed_back(path, "flash", flash)
}

/// A failed admin action returns to its page with the message shown; server errors still get the error page.
pub(crate) fn back_with_error(path: &str, e: ApiError) -> Result<HttpResponse, ApiError> {
    if e.is_server_error() {
        return Err(e);
    }
    Ok(signed_back(path, "error", &e.public_message()))
}

/// `path` (which may already hold a query, e.g. a list's filters, and end in a `#section`) with a signed message
/// of `kind` added.
fn signed_back(path: &str, kind: &str, msg: &str) -> HttpResponse {
    let (path, section) = path.split_once('#').map_or((path, String::new()), |(p, s)| (p, format!("#{s}")));
    let sep = if path.contains('?') { '&' } else { '?' };
    see_other(&format!("{path}{sep}{kind}={}&sig={}{section}", percent_encode(msg), flash_sig(kind, msg)))
}

#[get("/admin")]
pub async fn admin_home() -> HttpResponse {
    HttpResponse::Found().insert_header((header::LOCATION, "/admin/overview")).finish()
}

// ---------------------------------------------------------------------------------------------------------------
// Overview: the console's landing

#[derive(Template)]
#[template(path = "admin_overview.html")]
struct OverviewPage {
    nav: Option<Nav>,
    flash: Option<String>,
    collections: Vec<care_engine::store::CollectionStats>,
    documents: u64,
    chunks: u64,
    /// Queued and running jobs.
    active_jobs: Vec<JobView>,
    live: String,
    /// The newest evaluation: candidate, decision and nDCG@10 change, when there is one.
    last_evaluation: Option<(i64, String, bool, String)>,
    health: care_engine::HealthReport,
    free: String,
    analytics: care_engine::analytics::Analytics,
    not_found_pct: String,
    searches_chart: String,
    documents_chart: String,
    backup: crate::admin_backup::Summary,
    /// This appliance's standby state, or a standby's last pull from it.
    standby: Option<String>,
}

/// Collections, documents, jobs running, the live model pair and its last evaluation, disk, and the week's
/// searches, on one page.
#[get("/admin/overview")]
pub async fn overview_page(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let (collections, jobs, (_, live), evals, health, analytics, backup) = call_admin(&state, &caller, |e, a| {
        Ok((
            e.collections().list(a)?,
            e.tasks().jobs(a, 100)?,
            e.models().list(a)?,
            e.models().evaluations(a, 1)?,
            care_engine::service::health_report(&e),
            e.audit().analytics(a, 7)?,
            e.backups().status(a)?,
        ))
    })
    .await?;
    let rows: Vec<(String, Vec<f64>)> =
        collections.iter().map(|c| (c.collection.name.clone(), vec![c.documents as f64])).collect();
    let pct =
        if analytics.searches == 0 { 0.0 } else { 100.0 * analytics.not_found as f64 / analytics.searches as f64 };
    render(&OverviewPage {
        nav: Nav::of(&caller),
        flash: None,
        documents: collections.iter().map(|c| c.documents).sum(),
        chunks: collections.iter().map(|c| c.chunks).sum(),
        documents_chart: care_engine::chart::grouped_bars("各资料库文档数", "", &["文档"], &rows),
        collections,
        active_jobs: jobs.into_iter().filter(|j| j.state == "queued" || j.state == "running").collect(),
        live: live.map_or_else(
            || "未启用（仅关键词检索）".to_string(),
            |p| format!("查询 {}@{} · 文档 {}@{}", p.query.name, p.query.version, p.document.name, p.document.version),
        ),
        last_evaluation: evals.into_iter().next().map(|(r, _)| {
            let g = &r.overall_ndcg_at_10;
            (
                r.id,
                r.candidate.clone(),
                r.passed,
                format!("{:+.4}（95% 区间 {:+.4} ~ {:+.4}）", g.gain, g.gain_lo, g.gain_hi),
            )
        }),
        free: health.free_bytes.map_or("未知".into(), |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)),
        health,
        not_found_pct: format!("{pct:.1}"),
        searches_chart: care_engine::analytics::chart(&analytics),
        analytics,
        standby: crate::admin_backup::standby_line(state.engine.data_dir().root(), &backup),
        backup: crate::admin_backup::summary(&backup),
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Collections

#[derive(Template)]
#[template(path = "admin_collections.html")]
struct CollectionsPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    collections: Vec<care_engine::store::CollectionStats>,
    max_upload_mib: u64,
    doc_types: &'static [&'static str],
}

#[get("/admin/collections")]
pub async fn collections_page(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    let collections = call(&state, &caller, |e, a| e.collections().list(a)).await?;
    let f = f.into_inner();
    render(&CollectionsPage {
        nav: Nav::of(&caller),
        flash: f.flash(),
        error: f.error(),
        csrf: caller.csrf().to_string(),
        collections,
        max_upload_mib: state.settings.server.max_upload_mib,
        doc_types: care_engine::ingest::meta::DOC_TYPES,
    })
}

#[derive(Debug, Deserialize)]
pub struct CreateForm {
    name: String,
    #[serde(default)]
    description: String,
}

#[post("/admin/collections")]
pub async fn create_collection(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<CreateForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    match call_admin(&state, &caller, move |e, a| e.collections().create(a, &f.name, &f.description)).await {
        Ok(c) => Ok(back_with("/admin/collections", &format!("已创建资料库 {}", c.name))),
        Err(e) => back_with_error("/admin/collections", e),
    }
}

#[post("/admin/collections/{name}/upload")]
pub async fn upload_files(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    payload: actix_multipart::Multipart,
) -> Result<HttpResponse, ApiError> {
    match uploads::upload(&state, &caller, &name, payload).await {
        Ok(job) => {
            let m = format!("已上传，入库任务 #{job} 已开始");
            Ok(see_other(&format!("/admin/jobs?flash={}&sig={}#job-{job}", percent_encode(&m), flash_sig("flash", &m))))
        }
        Err(e) => back_with_error("/admin/collections", e),
    }
}

#[derive(Debug, Deserialize)]
pub struct ApproveForm {
    approved: u8,
}

#[post("/admin/collections/{name}/approve")]
pub async fn approve_collection(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<ApproveForm>,
) -> Result<HttpResponse, ApiError> {
    let approved = f.approved != 0;
    let n = name.to_string();
    match call_admin(&state, &caller, move |e, a| e.collections().approve(a, &n, approved)).await {
        Ok(_) => Ok(back_with(
            "/admin/collections",
            &format!("资料库 {} {}", name, if approved { "已批准用于训练" } else { "已撤销训练批准" }),
        )),
        Err(e) => back_with_error("/admin/collections", e),
    }
}

#[derive(Debug, Deserialize)]
pub struct DeleteForm {
    /// The collection name typed again, so a mis-click cannot delete a collection.
    confirm: String,
}

#[post("/admin/collections/{name}/delete")]
pub async fn delete_collection(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<DeleteForm>,
) -> Result<HttpResponse, ApiError> {
    if f.confirm.trim() != name.as_str() {
        return back_with_error("/admin/collections", ApiError::invalid(format!("请输入资料库名称 {name} 以确认删除")));
    }
    let n = name.to_string();
    match call_admin(&state, &caller, move |e, a| e.collections().delete(a, &n)).await {
        Ok(_) => Ok(back_with("/admin/collections", &format!("已删除资料库 {name}"))),
        Err(e) => back_with_error("/admin/collections", e),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The documents of a collection

const DOCS_PER_PAGE: usize = 50;

#[derive(Template)]
#[template(path = "admin_documents.html")]
struct DocumentsPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    collection: String,
    title: String,
    department: String,
    doc_type: String,
    departments: Vec<(String, usize)>,
    types: Vec<(String, usize)>,
    docs: Vec<care_engine::DocumentRow>,
    total: usize,
    first: usize,
    last: usize,
    prev_url: Option<String>,
    next_url: Option<String>,
    /// This page's URL, where an edit or a deletion returns.
    back: String,
    doc_type_names: &'static [&'static str],
}

#[derive(Debug, Default, Deserialize)]
pub struct DocListParams {
    #[serde(default)]
    title: String,
    #[serde(default)]
    department: String,
    #[serde(default)]
    doc_type: String,
    #[serde(default)]
    page: Option<usize>,
}

impl DocListParams {
    fn url(&self, collection: &str, page: usize) -> String {
        let mut u = format!("/admin/collections/{}/documents?page={page}", percent_encode(collection));
        for (k, v) in [("title", &self.title), ("department", &self.department), ("doc_type", &self.doc_type)] {
            if !v.trim().is_empty() {
                u.push_str(&format!("&{k}={}", percent_encode(v.trim())));
            }
        }
        u
    }
}

/// A collection's documents, newest first: find by title or id, filter by department and type, open, re-file,
/// delete.
#[get("/admin/collections/{name}/documents")]
pub async fn documents_page(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    p: web::Query<DocListParams>,
    f: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    let (name, p) = (name.into_inner(), p.into_inner());
    // The list goes 50 a page; a page number past any collection is an empty page, not an overflow.
    let page = p.page.unwrap_or(1).clamp(1, 100_000);
    let q = care_engine::DocumentQuery {
        title: p.title.clone(),
        department: p.department.clone(),
        doc_type: p.doc_type.clone(),
        offset: (page - 1) * DOCS_PER_PAGE,
        limit: DOCS_PER_PAGE,
    };
    let n = name.clone();
    let ((docs, total), (departments, types)) = call_admin(&state, &caller, move |e, a| {
        Ok((e.collections().documents(a, &n, &q)?, e.collections().filing_values(a, &n)?))
    })
    .await?;
    let f = f.into_inner();
    let first = (page - 1) * DOCS_PER_PAGE + 1;
    render(&DocumentsPage {
        nav: Nav::of(&caller),
        flash: f.flash(),
        error: f.error(),
        csrf: caller.csrf().to_string(),
        title: p.title.clone(),
        department: p.department.clone(),
        doc_type: p.doc_type.clone(),
        departments,
        types,
        last: (first + docs.len()).saturating_sub(1),
        first,
        prev_url: (page > 1).then(|| p.url(&name, page - 1)),
        next_url: (page * DOCS_PER_PAGE < total).then(|| p.url(&name, page + 1)),
        back: p.url(&name, page),
        docs,
        total,
        collection: name,
        doc_type_names: care_engine::ingest::meta::DOC_TYPES,
    })
}

/// Where a form on the document list returns: its own list page (filters and page kept), never elsewhere.
fn documents_back(name: &str, back: &str) -> String {
    let own = format!("/admin/collections/{}/documents", percent_encode(name));
    let b = crate::pages::local_path(back, &own);
    if b.starts_with(&own) { b } else { own }
}

#[derive(Debug, Deserialize)]
pub struct FilingForm {
    external_id: String,
    #[serde(default)]
    department: String,
    #[serde(default)]
    doc_type: String,
    #[serde(default)]
    date: String,
    #[serde(default)]
    issuer: String,
    #[serde(default)]
    language: String,
    #[serde(default)]
    access: String,
    #[serde(default)]
    back: String,
}

#[post("/admin/collections/{name}/documents/file")]
pub async fn file_document(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<FilingForm>,
) -> Result<HttpResponse, ApiError> {
    let (name, f) = (name.into_inner(), f.into_inner());
    let back = documents_back(&name, &f.back);
    let meta = care_engine::ingest::meta::DocMeta {
        department: f.department,
        doc_type: f.doc_type,
        date: f.date,
        issuer: f.issuer,
        language: f.language,
        access: f.access,
    };
    let (n, id) = (name.clone(), f.external_id.clone());
    match call_admin(&state, &caller, move |e, a| {
        e.collections().file_documents(a, &n, &care_engine::ingest::meta::Filing::whole(vec![(id, meta)]))
    })
    .await
    {
        Ok((1, _)) => Ok(back_with(&back, &format!("已保存文档 {} 的归档信息", f.external_id))),
        Ok(_) => back_with_error(&back, ApiError::invalid(format!("资料库 {name} 中没有文档 {}", f.external_id))),
        Err(e) => back_with_error(&back, e),
    }
}

#[derive(Debug, Deserialize)]
pub struct ReplaceQuery {
    external_id: String,
}

/// A new version of one document (the list's 更新内容): its ingest job is queued and the jobs page shows it.
#[post("/admin/collections/{name}/documents/replace")]
pub async fn replace_document(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    q: web::Query<ReplaceQuery>,
    payload: actix_multipart::Multipart,
) -> Result<HttpResponse, ApiError> {
    let back = documents_back(&name, "");
    match uploads::replace(&state, &caller, &name, &q.external_id, payload).await {
        Ok(job) => {
            let m = format!("已上传文档 {} 的新版本，入库任务 #{job} 已开始", q.external_id);
            Ok(see_other(&format!("/admin/jobs?flash={}&sig={}#job-{job}", percent_encode(&m), flash_sig("flash", &m))))
        }
        Err(e) => back_with_error(&back, e),
    }
}

#[derive(Debug, Deserialize)]
pub struct DocDeleteForm {
    external_id: String,
    #[serde(default)]
    back: String,
}

#[post("/admin/collections/{name}/documents/delete")]
pub async fn delete_document(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<DocDeleteForm>,
) -> Result<HttpResponse, ApiError> {
    let (name, f) = (name.into_inner(), f.into_inner());
    let back = documents_back(&name, &f.back);
    let (n, ids) = (name.clone(), vec![f.external_id.clone()]);
    match call_admin(&state, &caller, move |e, a| e.collections().delete_documents(&n, &ids, a)).await {
        Ok(_) => Ok(back_with(&back, &format!("已删除文档 {}", f.external_id))),
        Err(e) => back_with_error(&back, e),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Search analytics

#[derive(Template)]
#[template(path = "admin_analytics.html")]
struct AnalyticsPage {
    nav: Option<Nav>,
    flash: Option<String>,
    a: care_engine::analytics::Analytics,
    chart: String,
    not_found_pct: String,
    latency: String,
    /// The windows offered, and whether each is the one shown.
    choices: Vec<(u32, bool)>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DaysParam {
    #[serde(default)]
    pub days: Option<u64>,
}

impl DaysParam {
    pub fn days(&self) -> u32 {
        self.days.unwrap_or(30).clamp(1, u64::from(care_engine::analytics::MAX_DAYS)) as u32
    }
}

/// What clinicians search and where they fail: searches per day, the most frequent queries, those that found
/// nothing (each with a link that proposes it as a synonym entry), those marked 没帮助, latency.
#[get("/admin/analytics")]
pub async fn analytics_page(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<DaysParam>,
) -> Result<HttpResponse, ApiError> {
    let days = q.days();
    let a = call_admin(&state, &caller, move |e, admin| e.audit().analytics(admin, days)).await?;
    let pct = if a.searches == 0 { 0.0 } else { 100.0 * a.not_found as f64 / a.searches as f64 };
    render(&AnalyticsPage {
        nav: Nav::of(&caller),
        flash: None,
        chart: care_engine::analytics::chart(&a),
        not_found_pct: format!("{pct:.1}"),
        choices: [7, 30, 90, 365].into_iter().map(|d| (d, d == a.days)).collect(),
        latency: match (a.latency_p50_ms, a.latency_p99_ms) {
            (Some(p50), Some(p99)) => format!("{p50:.0} / {p99:.0} 毫秒"),
            _ => "—".into(),
        },
        a,
    })
}

#[get("/admin/analytics.csv")]
pub async fn analytics_csv(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<DaysParam>,
) -> Result<HttpResponse, ApiError> {
    let days = q.days();
    let csv = call_admin(&state, &caller, move |e, a| e.audit().export_analytics(a, days)).await?;
    Ok(csv_download(csv, "care-analytics.csv"))
}

// ---------------------------------------------------------------------------------------------------------------
// Jobs

#[derive(Template)]
#[template(path = "admin_jobs.html")]
struct JobsPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    jobs: Vec<JobView>,
}

#[get("/admin/jobs")]
pub async fn jobs_page(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    let jobs = call_admin(&state, &caller, |e, a| e.tasks().jobs(a, 50)).await?;
    let f = f.into_inner();
    render(&JobsPage {
        nav: Nav::of(&caller),
        flash: f.flash(),
        error: f.error(),
        csrf: caller.csrf().to_string(),
        jobs,
    })
}

#[post("/admin/jobs/{id}/cancel")]
pub async fn cancel_job(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    match call_admin(&state, &caller, move |e, a| e.tasks().cancel(a, id)).await {
        Ok(()) => Ok(back_with("/admin/jobs", &format!("任务 #{id} 将在当前文件完成后取消"))),
        Err(e) => back_with_error("/admin/jobs", e),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Users

#[derive(Template)]
#[template(path = "admin_users.html")]
struct UsersPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    users: Vec<UserInfo>,
    collections: Vec<String>,
    tokens: Vec<accounts::ApiToken>,
    new_token: Option<String>,
}

async fn users_page(
    state: &web::Data<AppState>,
    caller: &Caller,
    flash: Option<String>,
    error: Option<String>,
    new_token: Option<String>,
) -> Result<HttpResponse, ApiError> {
    let (users, collections, tokens) = call_admin(state, caller, |e, a| {
        Ok((e.accounts().users(a)?, e.search().readable_collections(a)?, e.accounts().tokens(a, None)?))
    })
    .await?;
    render(&UsersPage {
        nav: Nav::of(caller),
        flash,
        error,
        csrf: caller.csrf().to_string(),
        users,
        collections,
        tokens,
        new_token,
    })
}

#[get("/admin/users")]
pub async fn users_index(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    users_page(&state, &caller, q.flash(), q.error(), None).await
}

#[derive(Debug, Deserialize)]
pub struct NewUserForm {
    username: String,
    password: String,
    role: String,
}

#[post("/admin/users")]
pub async fn create_user(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<NewUserForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    match call_admin(&state, &caller, move |e, a| e.accounts().create_user(a, &f.username, &f.password, &f.role, false))
        .await
    {
        Ok(u) => Ok(back_with("/admin/users", &format!("已创建用户 {}", u.username))),
        Err(e) => back_with_error("/admin/users", e),
    }
}

#[derive(Debug, Deserialize)]
pub struct UserForm {
    /// set_role, disable, enable, unlock, reset_password, delete
    action: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    groups: String,
}

#[post("/admin/users/{name}")]
pub async fn update_user(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<UserForm>,
) -> Result<HttpResponse, ApiError> {
    let name = name.into_inner();
    let f = f.into_inner();
    let mut u = UserUpdate::default();
    match f.action.as_str() {
        "set_role" => u.role = Some(f.role),
        "disable" => u.disabled = Some(true),
        "enable" => u.disabled = Some(false),
        "unlock" => u.unlock = true,
        "reset_password" => u.password = Some(f.password),
        "set_groups" => u.groups = Some(f.groups),
        "delete" => {
            let n = name.clone();
            return match call_admin(&state, &caller, move |e, a| e.accounts().delete_user(a, &n)).await {
                Ok(()) => Ok(back_with("/admin/users", &format!("已删除用户 {name}"))),
                Err(e) => back_with_error("/admin/users", e),
            };
        }
        other => return back_with_error("/admin/users", ApiError::invalid(format!("未知操作 {other:?}"))),
    }
    let n = name.clone();
    match call_admin(&state, &caller, move |e, a| e.accounts().update_user(a, &n, &u)).await {
        Ok(()) => Ok(back_with("/admin/users", &format!("已更新用户 {name}"))),
        Err(e) => back_with_error("/admin/users", e),
    }
}

#[derive(Debug, Deserialize)]
pub struct GrantForm {
    collection: String,
    /// grant or revoke
    action: String,
}

#[post("/admin/users/{name}/grants")]
pub async fn grants_form(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<GrantForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    let (n, c, grant) = (name.to_string(), f.collection.clone(), f.action == "grant");
    let r =
        call_admin(
            &state,
            &caller,
            move |e, a| if grant { e.accounts().grant(a, &n, &c) } else { e.accounts().revoke(a, &n, &c) },
        )
        .await;
    match r {
        Ok(()) => Ok(back_with(
            "/admin/users",
            &format!("{} {} 对资料库 {} 的访问权限", if grant { "已授予" } else { "已撤销" }, name, f.collection),
        )),
        Err(e) => back_with_error("/admin/users", e),
    }
}

#[derive(Debug, Deserialize)]
pub struct TokenForm {
    name: String,
}

/// Creates an API token and shows its secret once, on the page itself (never in a redirect URL).
#[post("/admin/users/{name}/tokens")]
pub async fn create_token(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    f: web::Form<TokenForm>,
) -> Result<HttpResponse, ApiError> {
    let (n, t) = (name.to_string(), f.into_inner().name);
    match call_admin(&state, &caller, move |e, a| e.accounts().create_token(a, &n, &t)).await {
        Ok((_, secret)) => {
            users_page(
                &state,
                &caller,
                Some(format!("已为 {name} 创建 API 令牌，请立即复制，它只显示这一次。")),
                None,
                Some(secret),
            )
            .await
        }
        Err(e) => back_with_error("/admin/users", e),
    }
}

#[post("/admin/tokens/{id}/revoke")]
pub async fn revoke_token(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    match call_admin(&state, &caller, move |e, a| e.accounts().revoke_token(a, id)).await {
        Ok(()) => Ok(back_with("/admin/users", &format!("已吊销令牌 #{id}"))),
        Err(e) => back_with_error("/admin/users", e),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Synonym table

#[derive(Template)]
#[template(path = "admin_synonyms.html")]
struct SynonymsPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    rows: Vec<care_engine::synonyms::SynonymEntry>,
    total: usize,
    filter: String,
    page: usize,
    pages: usize,
    propose: String,
}

const SYNONYMS_PER_PAGE: usize = 50;

#[derive(Debug, Default, Deserialize)]
pub struct SynonymsQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    page: Option<usize>,
    /// A query that found nothing, proposed as a variant of a group the admin names (from the analytics page).
    #[serde(default)]
    propose: String,
}

#[get("/admin/synonyms")]
pub async fn synonyms_page(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<SynonymsQuery>,
    flash: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let filter: String = q.q.trim().chars().take(40).collect();
    let page = q.page.unwrap_or(1).clamp(1, 10_000);
    let f = filter.clone();
    let (rows, total) = call_admin(&state, &caller, move |e, a| {
        e.search().synonyms(a, Some(f.as_str()), SYNONYMS_PER_PAGE, (page - 1) * SYNONYMS_PER_PAGE)
    })
    .await?;
    render(&SynonymsPage {
        nav: Nav::of(&caller),
        flash: flash.flash(),
        error: flash.error(),
        csrf: caller.csrf().to_string(),
        rows,
        total,
        filter,
        page,
        pages: total.div_ceil(SYNONYMS_PER_PAGE).max(1),
        propose: q.propose.trim().chars().take(40).collect(),
    })
}

#[derive(Debug, Deserialize)]
pub struct SynonymForm {
    preferred: String,
    variants: String,
    #[serde(default)]
    note: String,
}

impl SynonymForm {
    fn group(self) -> care_engine::synonyms::NewSynonym {
        care_engine::synonyms::NewSynonym { preferred: self.preferred, variants: vec![self.variants], note: self.note }
    }
}

#[post("/admin/synonyms")]
pub async fn add_synonym(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<SynonymForm>,
) -> Result<HttpResponse, ApiError> {
    let g = f.into_inner().group();
    match call_admin(&state, &caller, move |e, a| e.search().save_synonym(a, None, &g)).await {
        Ok(s) => Ok(back_with("/admin/synonyms", &format!("已新增“{}”：{}", s.preferred, s.variants.join("、")))),
        Err(e) => back_with_error("/admin/synonyms", e),
    }
}

#[post("/admin/synonyms/import")]
pub async fn import_synonyms(
    state: web::Data<AppState>,
    caller: Caller,
    payload: actix_multipart::Multipart,
) -> Result<HttpResponse, ApiError> {
    match crate::uploads::import_synonyms(&state, &caller, payload).await {
        Ok(r) => Ok(back_with(
            "/admin/synonyms",
            &format!("已导入：新增 {} 组，更新 {} 组，删除 {} 组", r.added, r.updated, r.removed),
        )),
        Err(e) => back_with_error("/admin/synonyms", e),
    }
}

#[post("/admin/synonyms/{id}")]
pub async fn update_synonym(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
    f: web::Form<SynonymForm>,
) -> Result<HttpResponse, ApiError> {
    let (id, g) = (id.into_inner(), f.into_inner().group());
    match call_admin(&state, &caller, move |e, a| e.search().save_synonym(a, Some(id), &g)).await {
        Ok(s) => Ok(back_with("/admin/synonyms", &format!("已保存“{}”", s.preferred))),
        Err(e) => back_with_error("/admin/synonyms", e),
    }
}

#[post("/admin/synonyms/{id}/delete")]
pub async fn delete_synonym(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    match call_admin(&state, &caller, move |e, a| e.search().delete_synonym(a, id)).await {
        Ok(s) => Ok(back_with("/admin/synonyms", &format!("已删除“{}”一组", s.preferred))),
        Err(e) => back_with_error("/admin/synonyms", e),
    }
}

#[get("/admin/synonyms.csv")]
pub async fn synonyms_csv(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    api::admin_export_synonyms_response(&state, &caller).await
}

/// A CSV file the browser saves as `filename`.
pub(crate) fn csv_download(csv: String, filename: &str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{filename}\"")))
        .body(csv)
}

// ---------------------------------------------------------------------------------------------------------------
// Audit

pub struct AuditRow {
    pub id: i64,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub detail: String,
}

impl AuditRow {
    fn at_local(&self) -> String {
        care_engine::clock::local(&self.at)
    }
    fn action_zh(&self) -> &'static str {
        care_engine::audit::action_zh(&self.action)
    }
    fn detail_items(&self) -> Vec<care_engine::audit::DetailItem> {
        care_engine::audit::detail_items(&self.detail)
    }
}

#[derive(Template)]
#[template(path = "admin_audit.html")]
struct AuditPage {
    nav: Option<Nav>,
    flash: Option<String>,
    q: AuditQuery,
    rows: Vec<AuditRow>,
    /// "ok", "error" or "pending" (no verification has finished since the server started).
    audit_state: &'static str,
    audit_message: String,
    csv_url: String,
    next_url: Option<String>,
}

fn audit_query_string(q: &AuditQuery) -> String {
    let mut parts = Vec::new();
    for (k, v) in
        [("actor", &q.actor), ("action", &q.action), ("since", &q.since), ("until", &q.until), ("text", &q.text)]
    {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            parts.push(format!("{k}={}", percent_encode(v)));
        }
    }
    parts.join("&")
}

/// The scheduler's latest audit verification (a housekeeping chore), so viewing the page walks nothing.
fn audit_banner(s: &care_engine::audit::AuditStatus) -> (&'static str, String) {
    let at = s.checked_at.as_deref().unwrap_or("");
    match (&s.error, &s.last) {
        (Some(e), _) => ("error", format!("审计日志校验失败（{at}）：{e}")),
        (None, Some(r)) => (
            "ok",
            format!(
                "审计日志完整：截至 {at}，第 {} 条及之前的记录均已通过密钥哈希链校验（每分钟增量校验新记录，每天全量校验一次；最近一次全量：{}）。",
                r.verified_through,
                s.last_full_at.as_deref().unwrap_or("尚未进行")
            ),
        ),
        (None, None) => ("pending", "审计日志尚未校验：服务启动后一分钟内完成首次校验。".to_string()),
    }
}

#[get("/admin/audit")]
pub async fn audit_page(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let limit = q.limit.unwrap_or(100).min(500);
    let records: Vec<AuditRecord> =
        api::audit_records(&state, &caller, &AuditQuery { limit: Some(limit), ..q.clone() }, 500).await?;
    let (audit_state, audit_message) = audit_banner(&call_admin(&state, &caller, |e, a| e.audit().status(a)).await?);
    let qs = audit_query_string(&q);
    let next_url = (records.len() == limit)
        .then(|| format!("/admin/audit?{qs}&offset={}", q.offset.unwrap_or(0).saturating_add(limit)));
    render(&AuditPage {
        nav: Nav::of(&caller),
        flash: None,
        rows: records
            .into_iter()
            .map(|r| AuditRow { id: r.id, at: r.at, actor: r.actor, action: r.action, detail: r.detail.to_string() })
            .collect(),
        audit_state,
        audit_message,
        csv_url: format!("/admin/audit.csv?{qs}"),
        next_url,
        q,
    })
}

#[get("/admin/audit.csv")]
pub async fn audit_csv(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let (f, limit, filter) = (q.filter(), q.limit.unwrap_or(1_000_000).min(1_000_000), audit_query_string(&q));
    let csv = call_admin(&state, &caller, move |e, a| e.audit().export(a, &f, limit, &filter)).await?;
    Ok(csv_download(csv, "care-audit.csv"))
}

// ---------------------------------------------------------------------------------------------------------------
// Settings (设置)

#[derive(Template)]
#[template(path = "admin_settings.html")]
struct SettingsPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    settings: Vec<care_engine::service::SettingView>,
    sign_in: Vec<care_engine::service::SignInSection>,
    backup: crate::admin_backup::BackupSection,
}

#[get("/admin/settings")]
pub async fn settings_page(
    state: web::Data<AppState>,
    caller: Caller,
    flash: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    let session = state.settings.session_defaults();
    let (settings, sign_in, status, list) = call_admin(&state, &caller, move |e, a| {
        // A folder that cannot be read is said on the page, not an error page.
        let list = e.backups().list(a, None).map_err(|e| e.to_string());
        Ok((e.settings().list(a, session), e.settings().sign_in(a), e.backups().status(a)?, list))
    })
    .await?;
    render(&SettingsPage {
        backup: crate::admin_backup::section(&status, list),
        nav: Nav::of(&caller),
        flash: flash.flash(),
        error: flash.error(),
        csrf: caller.csrf().to_string(),
        settings,
        sign_in,
    })
}

/// Saves a hospital sign-in section from its form (`protocol`, the fields, `clear=1` to return to care.toml's).
#[post("/admin/settings/sign-in")]
pub async fn save_sign_in(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<std::collections::BTreeMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let form = f.into_inner();
    let protocol = form.get("protocol").cloned().unwrap_or_default();
    let clear = form.get("clear").is_some_and(|v| v == "1");
    let back = "/admin/settings";
    match call_admin(&state, &caller, move |e, a| e.settings().save_sign_in(a, &protocol, &form, clear)).await {
        Ok(()) if clear => Ok(back_with(back, "已恢复为配置文件中的登录设置")),
        Ok(()) => Ok(back_with(back, "已保存并已连通，下一次登录即按新设置")),
        Err(e) => back_with_error(back, e),
    }
}

#[derive(Debug, Deserialize)]
pub struct SettingForm {
    key: String,
    #[serde(default)]
    value: String,
}

#[post("/admin/settings")]
pub async fn set_setting(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<SettingForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    let cleared = f.value.trim().is_empty();
    match call_admin(&state, &caller, move |e, a| e.settings().set(a, &f.key, &f.value)).await {
        Ok(()) if cleared => Ok(back_with("/admin/settings", "已恢复为配置文件中的值")),
        Ok(()) => Ok(back_with("/admin/settings", "已保存，立即生效")),
        Err(e) => back_with_error("/admin/settings", e),
    }
}
