//! The JSON API under /api/v1: each handler parses its request, calls one engine service operation as the caller
//! (`care_engine::service`, where authorisation and audit live) and serialises the answer.

use actix_web::{HttpRequest, HttpResponse, delete, get, patch, post, put, web};
use care_engine::judgments::JudgmentSetInfo;
use care_engine::lifecycle::ImportReport;
use care_engine::training::Recipe;
use care_engine::training::schedule::ScheduleSpec;
use care_engine::{SearchAs, UserInfo, UserUpdate, audit};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::call::{anon, call, call_admin};
use crate::errors::ApiError;
use crate::guard::Caller;

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchParams {
    /// The question or keywords.
    #[serde(default)]
    pub q: String,
    /// Restrict to one collection (default: every collection the caller may read).
    #[serde(default)]
    pub collection: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub offset: Option<usize>,
    /// bm25, dense, rrf or weighted (default: the collection's tuned method).
    #[serde(default)]
    #[param(value_type = Option<String>)]
    pub method: Option<care_engine::fusion::Method>,
    /// `document`: one hit per document (its best passage, `more_in_document` counting the others), paged over
    /// documents. Default: every passage.
    #[serde(default)]
    pub group: Option<String>,
    /// `true`: search the words as typed, without the synonym table's expansion or a pinyin reading.
    #[serde(default)]
    pub exact: Option<bool>,
    /// Only documents of these departments (科室), comma-separated.
    #[serde(default)]
    pub department: Option<String>,
    /// Only documents of these types (指南, 药品说明书, …), comma-separated.
    #[serde(default)]
    pub doc_type: Option<String>,
    /// Only documents issued by these (来源, e.g. 国家卫健委), comma-separated.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Only documents in these languages (中文, 英文, or codes such as en), comma-separated.
    #[serde(default)]
    pub language: Option<String>,
    /// Dated on or after (`2021`, `2021-06` or `2021-06-01`).
    #[serde(default)]
    pub from: Option<String>,
    /// Dated on or before.
    #[serde(default)]
    pub to: Option<String>,
    /// `relevance` (default) or `date` (newest first).
    #[serde(default)]
    pub sort: Option<String>,
}

/// A comma-separated list (full-width commas and 、 too, as typed in Chinese).
fn list(v: &Option<String>) -> Vec<String> {
    v.as_deref()
        .unwrap_or("")
        .split([',', '，', '、'])
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl SearchParams {
    pub fn to_search(&self) -> Result<SearchAs, care_engine::Error> {
        let sort = care_engine::facets::Sort::parse(self.sort.as_deref().unwrap_or("").trim()).ok_or_else(|| {
            care_engine::Error::InvalidInput("排序方式只能是 relevance（相关度）或 date（日期，最新在前）".into())
        })?;
        Ok(SearchAs {
            query: self.q.clone(),
            collection: self.collection.clone(),
            more_collections: Vec::new(),
            limit: self.limit,
            offset: self.offset.unwrap_or(0),
            method: self.method,
            group_by_document: self.group.as_deref() == Some("document"),
            exact: self.exact.unwrap_or(false),
            filter: care_engine::facets::SearchFilter {
                departments: list(&self.department),
                doc_types: list(&self.doc_type),
                issuers: list(&self.issuer),
                languages: list(&self.language),
                date_from: self.from.clone().unwrap_or_default(),
                date_to: self.to.clone().unwrap_or_default(),
            },
            sort,
        })
    }
}

/// Search as the caller (the engine applies grants and audits); the latency is recorded for /metrics.
pub async fn search_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    p: &SearchParams,
) -> Result<care_engine::SearchResults, ApiError> {
    let s = p.to_search()?;
    let res = call(state, caller, move |e, a| e.search().run(a, &s)).await?;
    state.metrics.search(res.method.as_str(), res.took_ms / 1e3);
    Ok(res)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Me {
    pub username: String,
    pub role: String,
    /// Collections this user may search.
    pub collections: Vec<String>,
}

#[utoipa::path(get, path = "/api/v1/me", tag = "account", responses((status = 200, body = Me)))]
#[get("/api/v1/me")]
pub async fn me(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let cols = call(&state, &caller, |e, a| e.search().readable_collections(a)).await?;
    Ok(HttpResponse::Ok().json(Me {
        username: caller.user.username.clone(),
        role: caller.user.role.as_str().into(),
        collections: cols,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct PasswordChange {
    pub current: String,
    pub new: String,
}

#[utoipa::path(post, path = "/api/v1/me/password", tag = "account", request_body = PasswordChange,
    responses((status = 204, description = "changed; all sessions of the user end")))]
#[post("/api/v1/me/password")]
pub async fn me_password(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<PasswordChange>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    let (policy, client) = (state.settings.auth.policy(), crate::guard::client_address(&req));
    call(&state, &caller, move |e, a| e.accounts().change_own_password(a, &b.current, &b.new, policy, &client)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/api/v1/search", tag = "search", params(SearchParams),
    responses((status = 200, description = "one page of the query's ranking: passages with snippets, highlights, \
        score parts and match evidence (`matched_terms` and `dense_only` per hit; `terms`, `matched_terms`, \
        `missing_terms` and `not_found` for the query; `total`)", body = care_engine::SearchResults),
              (status = 403, description = "a collection the caller may not read")))]
#[get("/api/v1/search")]
pub async fn search(
    state: web::Data<AppState>,
    caller: Caller,
    p: web::Query<SearchParams>,
) -> Result<HttpResponse, ApiError> {
    let r = search_as(&state, &caller, &p).await?;
    // The pipeline's stages; the guard adds the sign-in check and the whole request in front.
    Ok(HttpResponse::Ok().insert_header(("server-timing", r.stages.server_timing())).json(r))
}

#[utoipa::path(get, path = "/api/v1/collections", tag = "search",
    responses((status = 200, description = "collections the caller may read, with counts", body = Object)))]
#[get("/api/v1/collections")]
pub async fn collections(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(call(&state, &caller, |e, a| e.collections().list(a)).await?))
}

#[utoipa::path(get, path = "/api/v1/documents/{id}", tag = "search", params(("id" = i64, Path)),
    responses((status = 200, description = "the document and its passages in order", body = Object), (status = 404)))]
#[get("/api/v1/documents/{id}")]
pub async fn document(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    Ok(HttpResponse::Ok().json(call(&state, &caller, move |e, a| e.search().document(a, id)).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FeedbackBody {
    /// The query the judged result answered.
    pub query: String,
    pub chunk_id: i64,
    pub helpful: bool,
}

#[utoipa::path(post, path = "/api/v1/feedback", tag = "search", request_body = FeedbackBody,
    responses((status = 201, description = "stored for training", body = Object)))]
#[post("/api/v1/feedback")]
pub async fn post_feedback(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<FeedbackBody>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    let id = call(&state, &caller, move |e, a| e.search().feedback(a, &b.query, b.chunk_id, b.helpful)).await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"id": id})))
}

// ---------------------------------------------------------------------------------------------------------------
// Administration

#[utoipa::path(get, path = "/api/v1/admin/collections", tag = "admin", responses((status = 200, body = Object)))]
#[get("/api/v1/admin/collections")]
pub async fn admin_collections(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(call(&state, &caller, |e, a| e.collections().list(a)).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewCollection {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

#[utoipa::path(post, path = "/api/v1/admin/collections", tag = "admin", request_body = NewCollection,
    responses((status = 201, body = Object), (status = 409, description = "exists")))]
#[post("/api/v1/admin/collections")]
pub async fn admin_create_collection(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<NewCollection>,
) -> Result<HttpResponse, ApiError> {
    let c = body.into_inner();
    Ok(HttpResponse::Created()
        .json(call_admin(&state, &caller, move |e, a| e.collections().create(a, &c.name, &c.description)).await?))
}

#[utoipa::path(delete, path = "/api/v1/admin/collections/{name}", tag = "admin", params(("name" = String, Path)),
    responses((status = 204, description = "deleted with its documents, indexes and grants")))]
#[delete("/api/v1/admin/collections/{name}")]
pub async fn admin_delete_collection(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = name.into_inner();
    call_admin(&state, &caller, move |e, a| e.collections().delete(a, &name)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/api/v1/admin/collections/{name}/files", tag = "admin", params(("name" = String, Path)),
    request_body(content_type = "multipart/form-data", description = "one or more `file` parts"),
    responses((status = 202, description = "an ingest job was queued", body = Object), (status = 413)))]
#[post("/api/v1/admin/collections/{name}/files")]
pub async fn admin_upload(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    payload: actix_multipart::Multipart,
) -> Result<HttpResponse, ApiError> {
    let job = crate::uploads::upload(&state, &caller, &name, payload).await?;
    Ok(HttpResponse::Accepted().json(serde_json::json!({"job_id": job})))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Approval {
    pub approved: bool,
}

#[utoipa::path(put, path = "/api/v1/admin/collections/{name}/approval", tag = "admin", params(("name" = String, Path)),
    request_body = Approval, responses((status = 204)))]
#[put("/api/v1/admin/collections/{name}/approval")]
pub async fn admin_approve(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    body: web::Json<Approval>,
) -> Result<HttpResponse, ApiError> {
    let (name, approved) = (name.into_inner(), body.approved);
    call_admin(&state, &caller, move |e, a| e.collections().approve(a, &name, approved)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Limit {
    #[serde(default)]
    pub limit: Option<usize>,
}

#[utoipa::path(get, path = "/api/v1/admin/jobs", tag = "admin", params(Limit), responses((status = 200, body = Object)))]
#[get("/api/v1/admin/jobs")]
pub async fn admin_jobs(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<Limit>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(50);
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, move |e, a| e.tasks().jobs(a, limit)).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/jobs/{id}", tag = "admin", params(("id" = i64, Path)), responses((status = 200, body = Object)))]
#[get("/api/v1/admin/jobs/{id}")]
pub async fn admin_job(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, move |e, a| e.tasks().job(a, id)).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/jobs/{id}/cancel", tag = "admin", params(("id" = i64, Path)), responses((status = 204)))]
#[post("/api/v1/admin/jobs/{id}/cancel")]
pub async fn admin_cancel_job(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    call_admin(&state, &caller, move |e, a| e.tasks().cancel(a, id)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/api/v1/admin/users", tag = "admin", responses((status = 200, body = [UserInfo])))]
#[get("/api/v1/admin/users")]
pub async fn admin_users(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, |e, a| e.accounts().users(a)).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewUser {
    pub username: String,
    pub password: String,
    /// admin or clinician
    pub role: String,
}

#[utoipa::path(post, path = "/api/v1/admin/users", tag = "admin", request_body = NewUser, responses((status = 201)))]
#[post("/api/v1/admin/users")]
pub async fn admin_create_user(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<NewUser>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    let u =
        call_admin(&state, &caller, move |e, a| e.accounts().create_user(a, &b.username, &b.password, &b.role, false))
            .await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"username": u.username, "role": u.role})))
}

#[utoipa::path(patch, path = "/api/v1/admin/users/{name}", tag = "admin", params(("name" = String, Path)),
    request_body = UserUpdate, responses((status = 204)))]
#[patch("/api/v1/admin/users/{name}")]
pub async fn admin_update_user(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    body: web::Json<UserUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (name, u) = (name.into_inner(), body.into_inner());
    call_admin(&state, &caller, move |e, a| e.accounts().update_user(a, &name, &u)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(delete, path = "/api/v1/admin/users/{name}", tag = "admin", params(("name" = String, Path)), responses((status = 204)))]
#[delete("/api/v1/admin/users/{name}")]
pub async fn admin_delete_user(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = name.into_inner();
    call_admin(&state, &caller, move |e, a| e.accounts().delete_user(a, &name)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(put, path = "/api/v1/admin/users/{name}/grants/{collection}", tag = "admin",
    params(("name" = String, Path), ("collection" = String, Path)), responses((status = 204)))]
#[put("/api/v1/admin/users/{name}/grants/{collection}")]
pub async fn admin_grant(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, col) = path.into_inner();
    call_admin(&state, &caller, move |e, a| e.accounts().grant(a, &name, &col)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(delete, path = "/api/v1/admin/users/{name}/grants/{collection}", tag = "admin",
    params(("name" = String, Path), ("collection" = String, Path)), responses((status = 204)))]
#[delete("/api/v1/admin/users/{name}/grants/{collection}")]
pub async fn admin_revoke(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, col) = path.into_inner();
    call_admin(&state, &caller, move |e, a| e.accounts().revoke(a, &name, &col)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewToken {
    /// What will use the token, e.g. "HIS integration".
    pub name: String,
}

#[utoipa::path(post, path = "/api/v1/admin/users/{name}/tokens", tag = "admin", params(("name" = String, Path)),
    request_body = NewToken, responses((status = 201, description = "the token secret, shown only in this response", body = Object)))]
#[post("/api/v1/admin/users/{name}/tokens")]
pub async fn admin_create_token(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
    body: web::Json<NewToken>,
) -> Result<HttpResponse, ApiError> {
    let (name, tname) = (name.into_inner(), body.into_inner().name);
    let (t, secret) = call_admin(&state, &caller, move |e, a| e.accounts().create_token(a, &name, &tname)).await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"id": t.id, "token": secret, "prefix": t.prefix})))
}

#[utoipa::path(delete, path = "/api/v1/admin/tokens/{id}", tag = "admin", params(("id" = i64, Path)), responses((status = 204)))]
#[delete("/api/v1/admin/tokens/{id}")]
pub async fn admin_revoke_token(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    call_admin(&state, &caller, move |e, a| e.accounts().revoke_token(a, id)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/api/v1/admin/models", tag = "admin", responses((status = 200, description = "versions, roles, metrics and the active pair", body = Object)))]
#[get("/api/v1/admin/models")]
pub async fn admin_models(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let (models, active) = call_admin(&state, &caller, |e, a| e.models().list(a)).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"models": models, "active": active})))
}

#[utoipa::path(post, path = "/api/v1/admin/models", tag = "admin",
    request_body(content_type = "multipart/form-data", description = "the package's files as `file` parts: manifest.toml, the files it lists, and parity.json when the trainer wrote one"),
    responses((status = 201, description = "verified and registered", body = ImportReport),
        (status = 422, description = "invalid_package or parity_failed: nothing was registered"), (status = 413)))]
#[post("/api/v1/admin/models")]
pub async fn admin_import_model(
    state: web::Data<AppState>,
    caller: Caller,
    payload: actix_multipart::Multipart,
) -> Result<HttpResponse, ApiError> {
    let report = crate::uploads::import_model(&state, &caller, payload).await?;
    Ok(HttpResponse::Created().json(report))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Candidate {
    /// `QUERY@VERSION,DOCUMENT@VERSION`.
    pub candidate: String,
    /// Promote although the candidate did not pass its evaluation (the reason is audited).
    #[serde(default)]
    pub override_reason: Option<String>,
}

/// A model job was queued: follow it at `/api/v1/admin/jobs/{job}`; its `result` names the evaluation report or
/// the pair that went live.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobAccepted {
    pub job: i64,
}

fn accepted(job: i64) -> HttpResponse {
    HttpResponse::Accepted().insert_header(("Location", format!("/api/v1/admin/jobs/{job}"))).json(JobAccepted { job })
}

#[utoipa::path(post, path = "/api/v1/admin/models/evaluate", tag = "admin", request_body = Candidate,
    responses((status = 202, description = "evaluation queued as a job; its result names the stored report (see /api/v1/admin/models/evaluations)", body = JobAccepted),
        (status = 400, description = "no live pair, or a malformed candidate"), (status = 404, description = "unknown model")))]
#[post("/api/v1/admin/models/evaluate")]
pub async fn admin_evaluate(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Candidate>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    Ok(accepted(call_admin(&state, &caller, move |e, a| e.models().submit_evaluate(a, &b.candidate)).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/models/evaluations", tag = "admin", params(Limit),
    responses((status = 200, description = "stored evaluation reports, newest first, each with its SVG chart", body = Object)))]
#[get("/api/v1/admin/models/evaluations")]
pub async fn admin_evaluations(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<Limit>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(20).min(200);
    let list = call_admin(&state, &caller, move |e, a| e.models().evaluations(a, limit)).await?;
    let out: Vec<_> = list.into_iter().map(|(r, svg)| serde_json::json!({"report": r, "chart_svg": svg})).collect();
    Ok(HttpResponse::Ok().json(out))
}

#[utoipa::path(post, path = "/api/v1/admin/models/promote", tag = "admin", request_body = Candidate,
    responses((status = 202, description = "promotion queued as a job (blue/green: the live pair serves until the new tables are complete)", body = JobAccepted),
        (status = 403, description = "not evaluated, rejected, or gated out without an override reason")))]
#[post("/api/v1/admin/models/promote")]
pub async fn admin_promote(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Candidate>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    Ok(accepted(
        call_admin(&state, &caller, move |e, a| {
            e.models().submit_promote(a, &b.candidate, b.override_reason.as_deref())
        })
        .await?,
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Reject {
    /// `Q@v,D@v` (or `M@v`) of an evaluated candidate.
    pub candidate: String,
    /// Why (audited; shown on the report).
    pub reason: String,
}

#[utoipa::path(post, path = "/api/v1/admin/models/reject", tag = "admin", request_body = Reject,
    responses((status = 200, description = "the evaluation that was marked rejected", body = Object),
        (status = 400, description = "no reason"), (status = 404, description = "no evaluation of the candidate")))]
#[post("/api/v1/admin/models/reject")]
pub async fn admin_reject(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Reject>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    let id = call_admin(&state, &caller, move |e, a| e.models().reject(a, &b.candidate, &b.reason)).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"evaluation": id})))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct Rollback {
    #[serde(default)]
    pub reason: String,
}

#[utoipa::path(post, path = "/api/v1/admin/models/rollback", tag = "admin", request_body = Rollback,
    responses((status = 200, body = Object), (status = 404, description = "no previous pair")))]
#[post("/api/v1/admin/models/rollback")]
pub async fn admin_rollback(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Rollback>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, move |e, a| e.models().rollback(a, &b.reason)).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/models/history", tag = "admin",
    responses((status = 200, description = "live pairs, newest first", body = Object)))]
#[get("/api/v1/admin/models/history")]
pub async fn admin_model_history(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, |e, a| e.models().history(a, 100)).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JudgmentsQuery {
    #[serde(default)]
    pub collection: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/admin/judgments", tag = "admin", params(JudgmentsQuery),
    responses((status = 200, body = [JudgmentSetInfo])))]
#[get("/api/v1/admin/judgments")]
pub async fn admin_judgments(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<JudgmentsQuery>,
) -> Result<HttpResponse, ApiError> {
    let col = q.into_inner().collection;
    Ok(HttpResponse::Ok()
        .json(call_admin(&state, &caller, move |e, a| e.models().judgment_sets(a, col.as_deref())).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/collections/{name}/judgments/{set}", tag = "admin",
    params(("name" = String, Path), ("set" = String, Path)),
    request_body(content_type = "multipart/form-data", description = "`file` parts: one CSV (`query,document or passage id,grade`), or BEIR's queries.jsonl and one qrels .tsv"),
    responses((status = 201, body = JudgmentSetInfo), (status = 400)))]
#[post("/api/v1/admin/collections/{name}/judgments/{set}")]
pub async fn admin_import_judgments(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
    payload: actix_multipart::Multipart,
) -> Result<HttpResponse, ApiError> {
    let (name, set) = path.into_inner();
    Ok(HttpResponse::Created()
        .json(crate::uploads::import_judgments(&state, &caller, Some((&name, &set)), payload).await?))
}

#[utoipa::path(delete, path = "/api/v1/admin/collections/{name}/judgments/{set}", tag = "admin",
    params(("name" = String, Path), ("set" = String, Path)), responses((status = 204), (status = 404)))]
#[delete("/api/v1/admin/collections/{name}/judgments/{set}")]
pub async fn admin_delete_judgments(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, set) = path.into_inner();
    call_admin(&state, &caller, move |e, a| e.models().delete_judgments(a, &name, &set)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Activate {
    /// `name@version` of the query encoder.
    pub query: String,
    /// `name@version` of the document encoder (same pairing id).
    pub document: String,
}

#[utoipa::path(post, path = "/api/v1/admin/models/activate", tag = "admin", request_body = Activate,
    responses((status = 200, body = Object), (status = 409, description = "pairing ids differ")))]
#[post("/api/v1/admin/models/activate")]
pub async fn admin_activate(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Activate>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    Ok(HttpResponse::Ok().json(
        call_admin(&state, &caller, move |e, a| e.models().activate(a, &b.query, &b.document, &mut |_| Ok(()))).await?,
    ))
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    #[serde(default)]
    pub actor: Option<String>,
    /// Action prefix, e.g. `auth.` or `search`.
    #[serde(default)]
    pub action: Option<String>,
    /// From this time (RFC 3339 or a date such as 2026-11-01), inclusive.
    #[serde(default)]
    pub since: Option<String>,
    /// Until this time, exclusive.
    #[serde(default)]
    pub until: Option<String>,
    /// Text contained in the record's detail (a query, a collection, a user).
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub offset: Option<usize>,
}

impl AuditQuery {
    pub fn filter(&self) -> audit::Filter {
        let nz = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
        audit::Filter {
            actor: nz(&self.actor),
            action_prefix: nz(&self.action),
            since: nz(&self.since),
            until: nz(&self.until),
            text: nz(&self.text),
        }
    }
}

/// One page of audit records for `q`, at most `max` records.
pub async fn audit_records(
    state: &web::Data<AppState>,
    caller: &Caller,
    q: &AuditQuery,
    max: usize,
) -> Result<Vec<audit::AuditRecord>, ApiError> {
    let (f, limit, offset) = (q.filter(), q.limit.unwrap_or(100).min(max), q.offset.unwrap_or(0));
    call_admin(state, caller, move |e, a| e.audit().records(a, &f, limit, offset)).await
}

#[utoipa::path(get, path = "/api/v1/admin/audit", tag = "admin", params(AuditQuery), responses((status = 200, body = Object)))]
#[get("/api/v1/admin/audit")]
pub async fn admin_audit(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(audit_records(&state, &caller, &q, 10_000).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AnalyticsQuery {
    /// The last N days (1–366, default 30).
    #[serde(default)]
    pub days: Option<u64>,
}

#[utoipa::path(get, path = "/api/v1/admin/analytics", tag = "admin", params(AnalyticsQuery),
    responses((status = 200, description = "searches per day, top, not-found and 没帮助 queries, latency",
        body = care_engine::analytics::Analytics)))]
#[get("/api/v1/admin/analytics")]
pub async fn admin_analytics(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<AnalyticsQuery>,
) -> Result<HttpResponse, ApiError> {
    let days = q.days.unwrap_or(30).clamp(1, u64::from(care_engine::analytics::MAX_DAYS)) as u32;
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, move |e, a| e.audit().analytics(a, days)).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VerifyQuery {
    /// Walk the whole log instead of only the records since the last checkpoint.
    #[serde(default)]
    pub full: bool,
}

#[utoipa::path(get, path = "/api/v1/admin/audit/verify", tag = "admin", params(VerifyQuery),
    responses((status = 200, description = "the chain is intact", body = Object), (status = 500, description = "audit_tampered")))]
#[get("/api/v1/admin/audit/verify")]
pub async fn admin_audit_verify(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<VerifyQuery>,
) -> Result<HttpResponse, ApiError> {
    let full = q.full;
    let r = call_admin(&state, &caller, move |e, a| e.audit().verify(a, full)).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "intact": true,
        "full": r.full,
        "records_checked": r.records_checked,
        "verified_through": r.verified_through,
    })))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedbackQuery {
    #[serde(default)]
    pub collection: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

#[utoipa::path(get, path = "/api/v1/admin/feedback", tag = "admin", params(FeedbackQuery),
    responses((status = 200, description = "relevance judgements with the judged passage", body = Object)))]
#[get("/api/v1/admin/feedback")]
pub async fn admin_feedback(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<FeedbackQuery>,
) -> Result<HttpResponse, ApiError> {
    let (col, limit) = (q.collection.clone(), q.limit.unwrap_or(1000));
    Ok(HttpResponse::Ok()
        .json(call_admin(&state, &caller, move |e, a| e.search().feedback_list(a, col.as_deref(), limit)).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SynonymQuery {
    /// Only groups with a term or note containing this text.
    #[serde(default)]
    pub q: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub offset: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SynonymList {
    pub total: usize,
    pub synonyms: Vec<care_engine::synonyms::SynonymEntry>,
}

#[utoipa::path(get, path = "/api/v1/admin/synonyms", tag = "admin", params(SynonymQuery),
    responses((status = 200, description = "groups of equivalent terms (preferred term first)", body = SynonymList)))]
#[get("/api/v1/admin/synonyms")]
pub async fn admin_synonyms(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<SynonymQuery>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let (limit, offset) = (q.limit.unwrap_or(100).min(10_000), q.offset.unwrap_or(0));
    let (synonyms, total) =
        call_admin(&state, &caller, move |e, a| e.search().synonyms(a, q.q.as_deref(), limit, offset)).await?;
    Ok(HttpResponse::Ok().json(SynonymList { total, synonyms }))
}

#[utoipa::path(post, path = "/api/v1/admin/synonyms", tag = "admin", request_body = care_engine::synonyms::NewSynonym,
    responses((status = 201, body = care_engine::synonyms::SynonymEntry),
        (status = 400, description = "invalid_input: an empty, too short or too long term, or a term of another group")))]
#[post("/api/v1/admin/synonyms")]
pub async fn admin_add_synonym(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<care_engine::synonyms::NewSynonym>,
) -> Result<HttpResponse, ApiError> {
    let g = body.into_inner();
    let saved = call_admin(&state, &caller, move |e, a| e.search().save_synonym(a, None, &g)).await?;
    Ok(HttpResponse::Created().json(saved))
}

#[utoipa::path(put, path = "/api/v1/admin/synonyms/{id}", tag = "admin", params(("id" = i64, Path)),
    request_body = care_engine::synonyms::NewSynonym, responses((status = 200, body = care_engine::synonyms::SynonymEntry)))]
#[put("/api/v1/admin/synonyms/{id}")]
pub async fn admin_update_synonym(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
    body: web::Json<care_engine::synonyms::NewSynonym>,
) -> Result<HttpResponse, ApiError> {
    let (id, g) = (id.into_inner(), body.into_inner());
    Ok(HttpResponse::Ok()
        .json(call_admin(&state, &caller, move |e, a| e.search().save_synonym(a, Some(id), &g)).await?))
}

#[utoipa::path(delete, path = "/api/v1/admin/synonyms/{id}", tag = "admin", params(("id" = i64, Path)),
    responses((status = 204)))]
#[delete("/api/v1/admin/synonyms/{id}")]
pub async fn admin_delete_synonym(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    call_admin(&state, &caller, move |e, a| e.search().delete_synonym(a, id)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/api/v1/admin/synonyms.csv", tag = "admin",
    responses((status = 200, description = "the whole table: 首选词,同义词,备注 (synonyms separated by |)", content_type = "text/csv")))]
#[get("/api/v1/admin/synonyms.csv")]
pub async fn admin_export_synonyms(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    admin_export_synonyms_response(&state, &caller).await
}

/// The synonym table as a CSV download: the API's and the console's export.
pub(crate) async fn admin_export_synonyms_response(
    state: &web::Data<AppState>,
    caller: &Caller,
) -> Result<HttpResponse, ApiError> {
    let csv = call_admin(state, caller, |e, a| e.search().export_synonyms(a)).await?;
    Ok(crate::admin::csv_download(csv, "care-synonyms.csv"))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SynonymImport {
    /// `true`: groups not in the file are removed (the file becomes the table). Default: added or replaced by
    /// preferred term.
    #[serde(default)]
    pub replace: bool,
}

#[utoipa::path(post, path = "/api/v1/admin/synonyms/import", tag = "admin", params(SynonymImport),
    request_body(content_type = "text/csv", description = "首选词,同义词,备注 rows (UTF-8 or GB18030; header optional)"),
    responses((status = 200, body = care_engine::synonyms::ImportReport),
        (status = 400, description = "invalid_input naming every bad line: nothing was imported"), (status = 413)))]
#[post("/api/v1/admin/synonyms/import")]
pub async fn admin_import_synonyms(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<SynonymImport>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = crate::uploads::read_body(payload, care_engine::synonyms::MAX_CSV_BYTES, "同义词 CSV").await?;
    let replace = q.replace;
    Ok(HttpResponse::Ok()
        .json(call_admin(&state, &caller, move |e, a| e.search().import_synonyms(a, &bytes, replace)).await?))
}

#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Object)))]
#[get("/healthz")]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    match anon(&state, |e| Ok(care_engine::service::health_report(&e))).await {
        Ok(h) if h.ok => HttpResponse::Ok()
            .json(serde_json::json!({"status": "ok", "schema_version": h.schema_version,
            "free_bytes": h.free_bytes, "reserve_bytes": h.reserve_bytes})),
        Ok(h) => HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "unhealthy",
            "schema_version": h.schema_version, "free_bytes": h.free_bytes, "reserve_bytes": h.reserve_bytes,
            "problems": h.problems})),
        Err(_) => HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "unavailable"})),
    }
}

#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "Prometheus text format")))]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (jobs, health) = anon(&state, |e| Ok((e.tasks().counts()?, care_engine::service::health_report(&e)))).await?;
    let mut body = state.metrics.render(&jobs, &care_engine::encoders::served_device());
    if let Some(free) = health.free_bytes {
        body.push_str(&format!(
            "# HELP care_data_disk_free_bytes Free bytes on the data disk.\n# TYPE care_data_disk_free_bytes gauge\n\
             care_data_disk_free_bytes {free}\n# HELP care_data_disk_reserve_bytes Free space kept for search and ingest \
             ([training] keep_free_gb).\n# TYPE care_data_disk_reserve_bytes gauge\ncare_data_disk_reserve_bytes {}\n",
            health.reserve_bytes
        ));
    }
    body.push_str(&format!(
        "# HELP care_healthy 1 when /healthz answers ok.\n# TYPE care_healthy gauge\ncare_healthy {}\n",
        u8::from(health.ok)
    ));
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(body))
}

#[utoipa::path(get, path = "/api/v1/admin/training", tag = "admin",
    responses((status = 200, description = "whether care-train can run here (and why not), the default recipe (this machine's: both sides on a GPU) and its expected wall time (`default_estimate`: from the newest finished run of its shape on this device, null before one), the data disk's free and needed bytes for a run (`disk`, null when no pair is live), the same two for the default recipe with `sides = both` (`both_estimate`, `both_disk`: its weights, the document encoder's and the new document vectors, re-embedding included), schedules and the newest runs", body = Object)))]
#[get("/api/v1/admin/training")]
pub async fn admin_training(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let (trainer, runs, schedules, (estimate, disk, both_estimate, both_disk), defaults) =
        call_admin(&state, &caller, move |e, a| {
            let runs = e.training().runs(a, 50)?;
            let t = e.training();
            let defaults = t.default_recipe();
            let both = Recipe { sides: care_engine::training::Sides::Both, ..defaults.clone() };
            let estimate =
                (t.estimate(a, &defaults)?, t.disk(a, defaults.sides)?, t.estimate(a, &both)?, t.disk(a, both.sides)?);
            Ok((care_engine::training::trainer_status(&e), runs, t.schedules(a)?, estimate, defaults))
        })
        .await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"trainer": trainer, "default_recipe": defaults,
        "default_estimate": estimate, "disk": disk, "both_estimate": both_estimate, "both_disk": both_disk,
        "schedules": schedules, "runs": runs})))
}

#[utoipa::path(post, path = "/api/v1/admin/training/runs", tag = "admin", request_body = Recipe,
    responses((status = 202, description = "queued; follow it at /api/v1/admin/training/runs/{job}", body = JobAccepted),
        (status = 400, description = "invalid recipe, no live pair or nothing approved for training"),
        (status = 409, description = "busy: a run is already queued or running"),
        (status = 503, description = "trainer_unavailable (the message says how to install it) or disk_full (free and needed space)")))]
#[post("/api/v1/admin/training/runs")]
pub async fn admin_train(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Recipe>,
) -> Result<HttpResponse, ApiError> {
    let r = body.into_inner();
    Ok(accepted(call_admin(&state, &caller, move |e, a| e.training().submit(a, &r, None)).await?))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct EmbedPending {
    /// `name@version` of the offline document model; default: the live document model.
    #[serde(default)]
    pub model: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/admin/training/embed-pending", tag = "admin", request_body = EmbedPending,
    responses((status = 202, description = "queued: care-train embed-corpus embeds the chunks the offline document model has no vectors for, then they are imported", body = JobAccepted),
        (status = 400, description = "the model is online (its chunks embed at ingest) or its package has no trainer weights"),
        (status = 503, description = "trainer_unavailable: the message says how to install it")))]
#[post("/api/v1/admin/training/embed-pending")]
pub async fn admin_embed_pending(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<EmbedPending>,
) -> Result<HttpResponse, ApiError> {
    let model = body.into_inner().model;
    Ok(accepted(call_admin(&state, &caller, move |e, a| e.models().submit_offline_embed(a, model.as_deref())).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/training/runs/{job}", tag = "admin",
    responses((status = 200, description = "state, stage, progress, data counts, phase times, candidate, evaluation and decision", body = Object),
        (status = 404)))]
#[get("/api/v1/admin/training/runs/{job}")]
pub async fn admin_training_run(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let job = path.into_inner();
    Ok(HttpResponse::Ok().json(call_admin(&state, &caller, move |e, a| e.training().run(a, job)).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/training/runs/{job}/loss.svg", tag = "admin",
    responses((status = 200, description = "Stage I and Stage II loss charts", content_type = "image/svg+xml"), (status = 404)))]
#[get("/api/v1/admin/training/runs/{job}/loss.svg")]
pub async fn admin_training_loss(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let job = path.into_inner();
    let svg = call_admin(&state, &caller, move |e, a| e.training().loss_svg(a, job)).await?;
    Ok(HttpResponse::Ok().content_type("image/svg+xml").body(svg))
}

#[utoipa::path(post, path = "/api/v1/admin/training/schedules", tag = "admin", request_body = ScheduleSpec,
    responses((status = 201, description = "the new schedule's id", body = Object), (status = 400)))]
#[post("/api/v1/admin/training/schedules")]
pub async fn admin_add_schedule(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<ScheduleSpec>,
) -> Result<HttpResponse, ApiError> {
    let s = body.into_inner();
    let id = call_admin(&state, &caller, move |e, a| e.training().set_schedule(a, None, &s)).await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"schedule": id})))
}

#[utoipa::path(delete, path = "/api/v1/admin/training/schedules/{id}", tag = "admin",
    responses((status = 204), (status = 404)))]
#[delete("/api/v1/admin/training/schedules/{id}")]
pub async fn admin_delete_schedule(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    call_admin(&state, &caller, move |e, a| e.training().delete_schedule(a, id)).await?;
    Ok(HttpResponse::NoContent().finish())
}
