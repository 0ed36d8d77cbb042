//! Routes: the clinician search page and the JSON API.

use actix_web::http::header;
use actix_web::{HttpResponse, get, web};
use askama::Template;
use care_engine::{SearchHit, SearchRequest};
use serde::Deserialize;

use crate::AppState;
use crate::errors::ApiError;

const STYLE: &str = include_str!("../../../web/style.css");

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(index).service(search_page).service(api_search).service(api_collections).service(healthz).service(style);
}

#[derive(Debug, Deserialize)]
pub struct SearchParams {
    #[serde(default)]
    q: String,
    #[serde(default)]
    collection: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    method: Option<care_engine::fusion::Method>,
}

impl SearchParams {
    fn request(&self) -> SearchRequest {
        SearchRequest {
            query: self.q.clone(),
            collections: self.collection.as_ref().filter(|c| !c.is_empty()).map(|c| vec![c.clone()]),
            limit: self.limit,
            offset: self.offset.unwrap_or(0),
            method: self.method,
            dense_weight: None,
        }
    }
}

/// A hit prepared for the template: the snippet split into plain and highlighted parts, so the template
/// escapes everything and needs no `|safe`.
pub struct HitView {
    pub rank: usize,
    pub title: String,
    pub heading: String,
    pub collection: String,
    pub source: String,
    pub score: String,
    /// "关键词 #3 · 语义 #1": where each retriever ranked this passage.
    pub why: String,
    pub parts: Vec<(bool, String)>,
}

impl HitView {
    fn from_hit(h: &SearchHit) -> Self {
        let mut parts = Vec::new();
        let mut pos = 0;
        for &(s, e) in &h.highlights {
            if s < pos || e > h.snippet.len() || !h.snippet.is_char_boundary(s) || !h.snippet.is_char_boundary(e) {
                continue;
            }
            if s > pos {
                parts.push((false, h.snippet[pos..s].to_string()));
            }
            parts.push((true, h.snippet[s..e].to_string()));
            pos = e;
        }
        if pos < h.snippet.len() {
            parts.push((false, h.snippet[pos..].to_string()));
        }
        HitView {
            rank: h.rank,
            title: if h.title.is_empty() { h.external_id.clone() } else { h.title.clone() },
            heading: h.heading.clone(),
            collection: h.collection.clone(),
            source: h.source.clone(),
            score: format!("{:.3}", h.score),
            why: [
                h.parts.bm25_rank.map(|r| format!("关键词 #{r}")),
                h.parts.dense_rank.map(|r| format!("语义 #{r}")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" · "),
            parts,
        }
    }
}

#[derive(Template)]
#[template(path = "search.html")]
pub struct SearchPage {
    pub query: String,
    pub collection: String,
    pub collections: Vec<String>,
    pub hits: Vec<HitView>,
    pub took_ms: String,
    pub method: String,
    pub error: Option<String>,
}

fn html(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
        .insert_header(("Content-Security-Policy", "default-src 'self'; script-src 'self'; frame-ancestors 'none'"))
        .insert_header(("Strict-Transport-Security", "max-age=31536000"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(body)
}

#[get("/")]
async fn index() -> HttpResponse {
    HttpResponse::Found().insert_header((header::LOCATION, "/search")).finish()
}

#[get("/search")]
async fn search_page(state: web::Data<AppState>, params: web::Query<SearchParams>) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let params = params.into_inner();
    let req = params.request();
    let (collections, result) = web::block(move || {
        let cols = engine.store().collection_list().map(|c| c.into_iter().map(|c| c.name).collect::<Vec<_>>());
        let res = if req.query.trim().is_empty() { None } else { Some(engine.search(&req)) };
        (cols, res)
    })
    .await
    .map_err(|e| ApiError(care_engine::Error::Internal(e.to_string())))?;
    let mut page = SearchPage {
        query: params.q.clone(),
        collection: params.collection.clone().unwrap_or_default(),
        collections: collections?,
        hits: Vec::new(),
        took_ms: String::new(),
        method: String::new(),
        error: None,
    };
    match result {
        None => {}
        Some(Ok(r)) => {
            page.hits = r.hits.iter().map(HitView::from_hit).collect();
            page.took_ms = format!("{:.1}", r.took_ms);
            page.method = match r.method {
                "weighted" => "混合（加权融合）",
                "rrf" => "混合（RRF）",
                "dense" => "语义",
                _ => "关键词（BM25）",
            }
            .to_string();
        }
        Some(Err(e)) if !crate::errors::status_of(e.code()).is_server_error() => page.error = Some(e.to_string()),
        Some(Err(e)) => return Err(e.into()),
    }
    let body = page.render().map_err(|e| ApiError(care_engine::Error::Internal(e.to_string())))?;
    Ok(html(body))
}

#[get("/api/v1/search")]
async fn api_search(state: web::Data<AppState>, params: web::Query<SearchParams>) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let req = params.request();
    let res = web::block(move || engine.search(&req))
        .await
        .map_err(|e| ApiError(care_engine::Error::Internal(e.to_string())))??;
    Ok(HttpResponse::Ok().json(res))
}

#[get("/api/v1/collections")]
async fn api_collections(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let engine = state.engine.clone();
    let res = web::block(move || engine.collections())
        .await
        .map_err(|e| ApiError(care_engine::Error::Internal(e.to_string())))??;
    Ok(HttpResponse::Ok().json(res))
}

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

#[get("/assets/style.css")]
async fn style() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/css; charset=utf-8"))
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(STYLE)
}
