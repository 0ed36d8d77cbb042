//! The JSON API under /api/v1 and the service functions pages share with it (search with per-collection grants,
//! documents, feedback), so a page and its API twin cannot drift apart in what they allow or audit.

use actix_web::{HttpResponse, delete, get, patch, post, put, web};
use care_engine::accounts::{self, Role};
use care_engine::{SearchRequest, SearchResults, audit, feedback};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::errors::ApiError;
use crate::guard::Caller;

/// Runs blocking engine work on the blocking pool and flattens its errors.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> care_engine::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    web::block(f).await.map_err(ApiError::internal)?.map_err(ApiError)
}

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
}

/// Appends one audit record on its own (for attempts that change nothing, such as a denied read): in a
/// transaction of its own, because a record and the chain head it moves must commit together.
pub fn audit_alone(
    engine: &care_engine::Engine,
    actor: &str,
    action: &str,
    detail: &serde_json::Value,
) -> care_engine::Result<()> {
    let mut conn = engine.store().conn();
    let tx = conn.transaction()?;
    audit::append(&tx, actor, action, detail)?;
    tx.commit()?;
    Ok(())
}

/// A query as it may appear in the audit log: its text when the appliance logs queries, else only its length.
fn logged_query(q: &str, log_queries: bool) -> serde_json::Value {
    let q = q.trim();
    if log_queries {
        serde_json::Value::String(q.chars().take(care_engine::MAX_QUERY_CHARS).collect())
    } else {
        serde_json::json!({"chars": q.chars().count()})
    }
}

/// Search as `caller`: only collections the caller may read are searched; naming another one is refused
/// (a clinician cannot learn whether it exists). Every search is audited (who, query, collections, result count),
/// and so is every refused one (a non-granted collection, a query over the limits).
pub async fn search_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    p: &SearchParams,
) -> Result<SearchResults, ApiError> {
    let engine = state.engine.clone();
    let user = caller.user.clone();
    let log_queries = state.settings.audit.log_queries;
    let mut req = SearchRequest {
        query: p.q.clone(),
        collections: None,
        limit: p.limit,
        offset: p.offset.unwrap_or(0),
        method: p.method,
        dense_weight: None,
    };
    let wanted = p.collection.clone().filter(|c| !c.is_empty());
    let res = blocking(move || {
        let refused = |action: &str, reason: &str, err: care_engine::Error| {
            let detail = serde_json::json!({
                "query": logged_query(&req.query, log_queries),
                "collection": wanted,
                "offset": req.offset,
                "reason": reason,
            });
            audit_alone(&engine, &user.username, action, &detail)?;
            Err(err)
        };
        if let Err(e) = engine.validate_search(&req) {
            return refused("search.rejected", &e.to_string(), e);
        }
        let readable = accounts::readable_collections(engine.store(), &user)?;
        let cols = match &wanted {
            Some(c) if readable.contains(c) || user.is_admin() => vec![c.clone()],
            Some(c) => {
                let e = care_engine::Error::Forbidden(format!("你没有访问知识库「{c}」的权限；请联系管理员开通"));
                return refused("search.denied", "collection not granted", e);
            }
            None => readable,
        };
        let res = if cols.is_empty() {
            SearchResults {
                query: req.query.trim().to_string(),
                method: "bm25",
                dense_weight: 0.0,
                total_candidates: 0,
                hits: Vec::new(),
                encode_ms: 0.0,
                retrieve_ms: 0.0,
                took_ms: 0.0,
            }
        } else {
            req.collections = Some(cols.clone());
            engine.search(&req)?
        };
        let detail = serde_json::json!({
            "query": if log_queries { serde_json::Value::from(res.query.as_str()) } else { "(not logged)".into() },
            "collections": cols,
            "results": res.hits.len(),
            "candidates": res.total_candidates,
            "offset": req.offset,
            "method": res.method,
        });
        audit_alone(&engine, &user.username, "search", &detail)?;
        Ok(res)
    })
    .await?;
    state.metrics.search(res.method, res.took_ms / 1e3);
    Ok(res)
}

/// A document, if the caller may read its collection (otherwise 404, not 403: ids must not reveal what exists).
/// A refused read is audited.
pub async fn document_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    id: i64,
) -> Result<feedback::DocumentView, ApiError> {
    let engine = state.engine.clone();
    let user = caller.user.clone();
    blocking(move || {
        let not_found = || care_engine::Error::NotFound { what: format!("document #{id}") };
        let doc = match feedback::document(engine.store(), id) {
            Ok(d) => d,
            Err(care_engine::Error::NotFound { .. }) => {
                audit_alone(
                    &engine,
                    &user.username,
                    "document.denied",
                    &serde_json::json!({"document": id, "reason": "no such document"}),
                )?;
                return Err(not_found());
            }
            Err(e) => return Err(e),
        };
        if !user.is_admin() && !accounts::granted_collections(engine.store(), user.id)?.contains(&doc.collection) {
            let detail =
                serde_json::json!({"document": id, "collection": doc.collection, "reason": "collection not granted"});
            audit_alone(&engine, &user.username, "document.denied", &detail)?;
            return Err(not_found());
        }
        Ok(doc)
    })
    .await
}

pub async fn feedback_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    query: String,
    chunk_id: i64,
    helpful: bool,
) -> Result<i64, ApiError> {
    let engine = state.engine.clone();
    let user = caller.user.clone();
    let log_queries = state.settings.audit.log_queries;
    blocking(move || {
        let denied = |reason: &str| -> care_engine::Result<i64> {
            let detail = serde_json::json!({"chunk": chunk_id, "query": logged_query(&query, log_queries), "reason": reason});
            audit_alone(&engine, &user.username, "feedback.denied", &detail)?;
            Err(care_engine::Error::NotFound { what: format!("passage #{chunk_id}") })
        };
        if query.trim().is_empty() || query.chars().count() > care_engine::MAX_QUERY_CHARS {
            let detail = serde_json::json!({"chunk": chunk_id, "query_chars": query.chars().count(), "reason": "query empty or too long"});
            audit_alone(&engine, &user.username, "feedback.rejected", &detail)?;
            return Err(care_engine::Error::InvalidInput(format!(
                "反馈所针对的查询须为 1 到 {} 个字符 (feedback query must be 1-{} characters)",
                care_engine::MAX_QUERY_CHARS,
                care_engine::MAX_QUERY_CHARS
            )));
        }
        let collection = match feedback::chunk_collection(engine.store(), chunk_id) {
            Ok((c, _, _)) => c,
            Err(care_engine::Error::NotFound { .. }) => return denied("no such passage"),
            Err(e) => return Err(e),
        };
        if !user.is_admin() && !accounts::granted_collections(engine.store(), user.id)?.contains(&collection) {
            return denied("collection not granted");
        }
        feedback::record(engine.store(), &user.username, &query, chunk_id, helpful)
    })
    .await
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
    let engine = state.engine.clone();
    let user = caller.user.clone();
    let cols = blocking(move || accounts::readable_collections(engine.store(), &user)).await?;
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
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<PasswordChange>,
) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let name = caller.user.username.clone();
    let b = body.into_inner();
    blocking(move || accounts::set_password(engine.store(), &name, &name, Some(&b.current), &b.new)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/api/v1/search", tag = "search", params(SearchParams),
    responses((status = 200, description = "ranked passages with snippets, highlights and score parts", body = Object),
              (status = 403, description = "a collection the caller may not read")))]
#[get("/api/v1/search")]
pub async fn search(
    state: web::Data<AppState>,
    caller: Caller,
    p: web::Query<SearchParams>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(search_as(&state, &caller, &p).await?))
}

#[utoipa::path(get, path = "/api/v1/collections", tag = "search",
    responses((status = 200, description = "collections the caller may read, with counts", body = Object)))]
#[get("/api/v1/collections")]
pub async fn collections(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let user = caller.user.clone();
    let res = blocking(move || {
        let readable = accounts::readable_collections(engine.store(), &user)?;
        Ok(engine.collections()?.into_iter().filter(|c| readable.contains(&c.collection.name)).collect::<Vec<_>>())
    })
    .await?;
    Ok(HttpResponse::Ok().json(res))
}

#[utoipa::path(get, path = "/api/v1/documents/{id}", tag = "search", params(("id" = i64, Path)),
    responses((status = 200, description = "the document and its passages in order", body = Object), (status = 404)))]
#[get("/api/v1/documents/{id}")]
pub async fn document(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(document_as(&state, &caller, id.into_inner()).await?))
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
    let id = feedback_as(&state, &caller, b.query, b.chunk_id, b.helpful).await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"id": id})))
}

// ---------------------------------------------------------------------------------------------------------------
// Administration

#[utoipa::path(get, path = "/api/v1/admin/collections", tag = "admin", responses((status = 200, body = Object)))]
#[get("/api/v1/admin/collections")]
pub async fn admin_collections(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    Ok(HttpResponse::Ok().json(blocking(move || engine.collections()).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewCollection {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

pub async fn create_collection_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    c: NewCollection,
) -> Result<care_engine::store::Collection, ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    // The engine audits the creation in its own transaction.
    blocking(move || engine.create_collection(&c.name, &c.description, &actor)).await
}

#[utoipa::path(post, path = "/api/v1/admin/collections", tag = "admin", request_body = NewCollection,
    responses((status = 201, body = Object), (status = 409, description = "exists")))]
#[post("/api/v1/admin/collections")]
pub async fn admin_create_collection(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<NewCollection>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Created().json(create_collection_as(&state, &caller, body.into_inner()).await?))
}

#[utoipa::path(delete, path = "/api/v1/admin/collections/{name}", tag = "admin", params(("name" = String, Path)),
    responses((status = 204, description = "deleted with its documents, indexes and grants")))]
#[delete("/api/v1/admin/collections/{name}")]
pub async fn admin_delete_collection(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    crate::uploads::delete_collection(&state, &caller, &name).await?;
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
    crate::uploads::approve(&state, &caller, &name, body.approved).await?;
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
pub async fn admin_jobs(state: web::Data<AppState>, q: web::Query<Limit>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::uploads::jobs(&state, q.limit.unwrap_or(50)).await?))
}

#[utoipa::path(get, path = "/api/v1/admin/jobs/{id}", tag = "admin", params(("id" = i64, Path)), responses((status = 200, body = Object)))]
#[get("/api/v1/admin/jobs/{id}")]
pub async fn admin_job(state: web::Data<AppState>, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::uploads::job(&state, id.into_inner()).await?))
}

#[utoipa::path(post, path = "/api/v1/admin/jobs/{id}/cancel", tag = "admin", params(("id" = i64, Path)), responses((status = 204)))]
#[post("/api/v1/admin/jobs/{id}/cancel")]
pub async fn admin_cancel_job(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    crate::uploads::cancel(&state, &caller, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UserInfo {
    pub username: String,
    pub role: String,
    pub created_at: String,
    pub disabled: bool,
    pub locked: bool,
    pub failed_logins: i64,
    pub collections: Vec<String>,
}

pub async fn users_info(state: &web::Data<AppState>) -> Result<Vec<UserInfo>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || {
        let now = accounts::unix_now();
        accounts::list_users(engine.store())?
            .into_iter()
            .map(|u| -> care_engine::Result<UserInfo> {
                Ok(UserInfo {
                    collections: accounts::granted_collections(engine.store(), u.id)?,
                    locked: u.is_locked(now),
                    username: u.username,
                    role: u.role.as_str().into(),
                    created_at: u.created_at,
                    disabled: u.disabled,
                    failed_logins: u.failed_logins,
                })
            })
            .collect()
    })
    .await
}

#[utoipa::path(get, path = "/api/v1/admin/users", tag = "admin", responses((status = 200, body = [UserInfo])))]
#[get("/api/v1/admin/users")]
pub async fn admin_users(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(users_info(&state).await?))
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
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let b = body.into_inner();
    let u = blocking(move || {
        accounts::create_user(engine.store(), &actor, &b.username, &b.password, Role::parse(&b.role)?)
    })
    .await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"username": u.username, "role": u.role})))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct UserUpdate {
    pub role: Option<String>,
    pub disabled: Option<bool>,
    #[serde(default)]
    pub unlock: bool,
    /// Reset the password (ends the user's sessions).
    pub password: Option<String>,
}

pub async fn update_user_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    name: String,
    u: UserUpdate,
) -> Result<(), ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    blocking(move || {
        let role = u.role.as_deref().filter(|r| !r.is_empty()).map(Role::parse).transpose()?;
        accounts::update_user(engine.store(), &actor, &name, role, u.disabled, u.unlock)?;
        if let Some(pw) = u.password.filter(|p| !p.is_empty()) {
            accounts::set_password(engine.store(), &actor, &name, None, &pw)?;
        }
        Ok(())
    })
    .await
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
    update_user_as(&state, &caller, name.into_inner(), body.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(delete, path = "/api/v1/admin/users/{name}", tag = "admin", params(("name" = String, Path)), responses((status = 204)))]
#[delete("/api/v1/admin/users/{name}")]
pub async fn admin_delete_user(
    state: web::Data<AppState>,
    caller: Caller,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    blocking(move || accounts::delete_user(engine.store(), &actor, &name)).await?;
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
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let (name, col) = path.into_inner();
    blocking(move || accounts::grant(engine.store(), &actor, &name, &col)).await?;
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
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let (name, col) = path.into_inner();
    blocking(move || accounts::revoke(engine.store(), &actor, &name, &col)).await?;
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
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let tname = body.into_inner().name;
    let (t, secret) = blocking(move || accounts::create_token(engine.store(), &actor, &name, &tname)).await?;
    Ok(HttpResponse::Created().json(serde_json::json!({"id": t.id, "token": secret, "prefix": t.prefix})))
}

#[utoipa::path(delete, path = "/api/v1/admin/tokens/{id}", tag = "admin", params(("id" = i64, Path)), responses((status = 204)))]
#[delete("/api/v1/admin/tokens/{id}")]
pub async fn admin_revoke_token(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    let id = id.into_inner();
    blocking(move || accounts::revoke_token(engine.store(), &actor, id)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/api/v1/admin/models", tag = "admin", responses((status = 200, description = "versions, roles, metrics and the active pair", body = Object)))]
#[get("/api/v1/admin/models")]
pub async fn admin_models(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let (models, active) = blocking(move || Ok((engine.models()?, engine.active_models()?))).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"models": models, "active": active})))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Activate {
    /// `name@version` of the query encoder.
    pub query: String,
    /// `name@version` of the document encoder (same pairing id).
    pub document: String,
}

pub async fn activate_as(
    state: &web::Data<AppState>,
    caller: &Caller,
    a: Activate,
) -> Result<care_engine::models::ActivePair, ApiError> {
    let engine = state.engine.clone();
    let actor = caller.name().to_string();
    blocking(move || {
        let before = engine.active_models()?;
        let pair = engine.activate_models(&a.query, &a.document, &mut |_| {})?;
        let name = |m: &care_engine::models::ModelRecord| format!("{}@{}", m.name, m.version);
        audit::append(
            &engine.store().conn(),
            &actor,
            "model.activate",
            &serde_json::json!({
                "query": name(&pair.query), "document": name(&pair.document),
                "previous_query": before.as_ref().map(|p| name(&p.query)),
                "previous_document": before.as_ref().map(|p| name(&p.document)),
            }),
        )?;
        Ok(pair)
    })
    .await
}

#[utoipa::path(post, path = "/api/v1/admin/models/activate", tag = "admin", request_body = Activate,
    responses((status = 200, body = Object), (status = 409, description = "pairing ids differ")))]
#[post("/api/v1/admin/models/activate")]
pub async fn admin_activate(
    state: web::Data<AppState>,
    caller: Caller,
    body: web::Json<Activate>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(activate_as(&state, &caller, body.into_inner()).await?))
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

pub async fn audit_records(
    state: &web::Data<AppState>,
    q: &AuditQuery,
    max: usize,
) -> Result<Vec<audit::AuditRecord>, ApiError> {
    let engine = state.engine.clone();
    let f = q.filter();
    let limit = q.limit.unwrap_or(100).min(max);
    // SQLite takes the offset as i64; past the end is simply empty.
    let offset = q.offset.unwrap_or(0).min(i64::MAX as usize);
    blocking(move || audit::search(&engine.store().conn(), &f, limit, offset)).await
}

#[utoipa::path(get, path = "/api/v1/admin/audit", tag = "admin", params(AuditQuery), responses((status = 200, body = Object)))]
#[get("/api/v1/admin/audit")]
pub async fn admin_audit(state: web::Data<AppState>, q: web::Query<AuditQuery>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(audit_records(&state, &q, 10_000).await?))
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
    q: web::Query<VerifyQuery>,
) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let full = q.full;
    let r = blocking(move || if full { audit::verify_full(engine.store()) } else { audit::checkpoint(engine.store()) })
        .await?;
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
    q: web::Query<FeedbackQuery>,
) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let col = q.collection.clone();
    let limit = q.limit.unwrap_or(1000).min(100_000);
    Ok(HttpResponse::Ok().json(blocking(move || feedback::list(engine.store(), col.as_deref(), limit)).await?))
}

#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Object)))]
#[get("/healthz")]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let engine = state.engine.clone();
    match blocking(move || engine.store().schema_version()).await {
        Ok(v) => HttpResponse::Ok().json(serde_json::json!({"status": "ok", "schema_version": v})),
        Err(_) => HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "unavailable"})),
    }
}

#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "Prometheus text format")))]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let jobs = blocking(move || {
        let conn = engine.store().conn();
        let mut st = conn.prepare("SELECT state, COUNT(*) FROM jobs GROUP BY state")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    })
    .await?;
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render(&jobs)))
}
