//! Clinician pages: login, search (filters, pagination, feedback), document view, account, the embeddable widget.
//! Templates escape everything; highlighted snippets are split into parts so no `|safe` is needed. No inline
//! scripts: the pages work without JavaScript, and /assets/app.js only enhances them.

use crate::filters;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, get, post, web};
use askama::Template;
use care_engine::SearchHit;
use care_engine::docview::{self, Block, Section};
use care_engine::fusion::Method;
use serde::Deserialize;

use crate::AppState;
use crate::api::{self, SearchParams};
use crate::call::{anon, call};
use crate::errors::{ApiError, status_of};
use crate::guard::{self, Caller, MaybeCaller, percent_encode};

/// What the page header needs about the signed-in user.
pub struct Nav {
    pub username: String,
    pub is_admin: bool,
    pub csrf: String,
}

impl Nav {
    pub fn of(c: &Caller) -> Option<Nav> {
        Some(Nav { username: c.user.username.clone(), is_admin: c.user.is_admin(), csrf: c.csrf().to_string() })
    }
}

pub fn html(body: String) -> HttpResponse {
    HttpResponse::Ok().content_type("text/html; charset=utf-8").body(body)
}

pub fn render(t: &impl Template) -> Result<HttpResponse, ApiError> {
    Ok(html(t.render().map_err(ApiError::internal)?))
}

pub fn see_other(to: &str) -> HttpResponse {
    HttpResponse::SeeOther().insert_header((header::LOCATION, to.to_string())).finish()
}

/// A redirect target from a form must stay on this site.
pub fn local_path(p: &str, fallback: &str) -> String {
    // Whitelist, not blacklist: browsers drop TAB, CR and LF inside URLs and read `\` as `/`, so `/\t/evil.example`
    // becomes `//evil.example`, a different host. Only visible ASCII without `\`, starting with one `/`, and short
    // enough for a Location header.
    let visible = p.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'\\');
    let one_slash = p.starts_with('/') && !p[1..].starts_with('/');
    if visible && one_slash && p.len() <= 2048 { p.to_string() } else { fallback.to_string() }
}

/// A hit prepared for the template: the snippet split into plain and highlighted parts.
pub struct HitView {
    pub rank: usize,
    pub chunk_id: i64,
    pub document_id: i64,
    pub title: String,
    pub heading: String,
    pub collection: String,
    pub source: String,
    pub score: String,
    /// "关键词 #3 · 语义 #1": where each retriever ranked this passage.
    pub why: String,
    pub parts: Vec<(bool, String)>,
    /// Feedback on this hit was just recorded.
    pub judged: bool,
    /// The query's terms this passage contains, as the reader sees them ("二甲双胍、禁忌症").
    pub matched: String,
    /// Found by meaning only: no query term matched it.
    pub dense_only: bool,
    /// It contains none of the query's terms: listed under 可能不相关.
    pub weak: bool,
    /// More passages of the same document in the ranking (grouped results).
    pub more_in_document: usize,
    /// "心内科 · 指南 · 2023-05": what the document is filed under, empty when unknown.
    pub filed: String,
    /// 识别自扫描件 · 第 N 页 (and a warning when read with little confidence); empty for typed text.
    pub scanned: String,
}

impl HitView {
    pub fn from_hit(h: &SearchHit) -> Self {
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
            chunk_id: h.chunk_id,
            document_id: h.document_id,
            title: if h.title.is_empty() { h.external_id.clone() } else { h.title.clone() },
            heading: h.heading.clone(),
            collection: h.collection.clone(),
            source: h.source.clone(),
            score: format!("{:.3}", h.score),
            why: [h.parts.bm25_rank.map(|r| format!("关键词 #{r}")), h.parts.dense_rank.map(|r| format!("语义 #{r}"))]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" · "),
            parts,
            judged: false,
            matched: h.evidence.join("、"),
            dense_only: h.dense_only,
            weak: h.matched_terms.is_empty(),
            more_in_document: h.more_in_document,
            filed: [&h.meta.department, &h.meta.doc_type, &h.meta.date, &h.meta.issuer]
                .into_iter()
                .filter(|s| !s.is_empty())
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" · "),
            scanned: h.scan.map(|s| s.label()).unwrap_or_default(),
        }
    }
}

#[get("/")]
pub async fn index() -> HttpResponse {
    HttpResponse::Found().insert_header((header::LOCATION, "/search")).finish()
}

// ---------------------------------------------------------------------------------------------------------------
// Login / logout

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    next: String,
    username: String,
    options: care_engine::service::SignInOptions,
}

#[derive(Debug, Deserialize)]
pub struct NextParam {
    #[serde(default)]
    next: Option<String>,
    /// Set by the sign-out's redirect, so that the sign-in page says it happened.
    #[serde(default)]
    signed_out: Option<String>,
}

fn login_page(
    req: &HttpRequest,
    state: &AppState,
    flash: Option<&str>,
    error: Option<String>,
    next: &str,
    username: &str,
    status: actix_web::http::StatusCode,
) -> Result<HttpResponse, ApiError> {
    // Double-submit token for the login form (there is no session to bind it to yet).
    let token = match guard::cookie(req, guard::LOGIN_CSRF_COOKIE) {
        Some(t) => t,
        None => care_engine::accounts::random_token().map_err(ApiError::Engine)?,
    };
    let page = LoginPage {
        nav: None,
        flash: flash.map(str::to_string),
        error,
        csrf: token.clone(),
        next: next.to_string(),
        username: username.to_string(),
        options: state.engine.accounts().sign_in_options(),
    };
    Ok(HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(guard::set_cookie(guard::LOGIN_CSRF_COOKIE, &token, 3600))
        .body(page.render().map_err(ApiError::internal)?))
}

#[get("/login")]
pub async fn login_form(
    req: HttpRequest,
    state: web::Data<AppState>,
    q: web::Query<NextParam>,
    who: MaybeCaller,
) -> Result<HttpResponse, ApiError> {
    let next = local_path(q.next.as_deref().unwrap_or("/search"), "/search");
    if who.0.is_some() {
        return Ok(see_other(&next));
    }
    let flash = q.signed_out.is_some().then_some("您已退出登录。");
    login_page(&req, &state, flash, None, &next, "", actix_web::http::StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    username: String,
    password: String,
    #[serde(default)]
    next: String,
}

#[post("/login")]
pub async fn login(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, ApiError> {
    let f = form.into_inner();
    let next = local_path(&f.next, "/search");
    let policy = state.settings.auth.policy();
    let client = guard::client_address(&req);
    let (user, pw) = (f.username.trim().to_string(), f.password);
    match anon(&state, move |e| e.accounts().login(&user, &pw, policy, &client)).await {
        Ok((_, cookie, _csrf)) => Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, next))
            .insert_header(guard::set_cookie(
                guard::SESSION_COOKIE,
                &cookie,
                state.engine.settings().session_seconds(state.settings.session_defaults()).1,
            ))
            .append_header(guard::set_cookie(guard::LOGIN_CSRF_COOKIE, "", 0))
            .finish()),
        Err(e) if !e.is_server_error() => {
            // Anything else a sign-in can fail with is told as a wrong name or password, which leaks nothing.
            let code = e.code();
            let msg = if code == care_engine::ErrorCode::AccountLocked {
                format!("账户已锁定：{e}")
            } else if code == care_engine::ErrorCode::RateLimited {
                e.public_message()
            } else if code == care_engine::ErrorCode::Forbidden {
                "账户已停用，请联系管理员。".to_string()
            } else if code == care_engine::ErrorCode::Unauthenticated && e.public_message() != "用户名或密码错误"
            {
                // Said only after the directory accepted the password: why this person may not come in.
                e.public_message()
            } else {
                "用户名或密码错误。".to_string()
            };
            login_page(&req, &state, None, Some(msg), &next, f.username.trim(), status_of(e.code()))
        }
        Err(e) if e.code() == care_engine::ErrorCode::DirectoryUnavailable => {
            let msg = format!("{}：医院目录暂时无法连接，请稍后再试；本地管理员账户仍可登录。", e.code().title_zh());
            login_page(&req, &state, None, Some(msg), &next, f.username.trim(), status_of(e.code()))
        }
        Err(e) => Err(e),
    }
}

/// The cookie that binds an OpenID Connect sign-in to the browser that started it. SameSite=Lax: it must come
/// back on the provider's redirect, a cross-site navigation.
const OIDC_STATE_COOKIE: &str = "__Host-care_oidc_state";
const OIDC_STATE_SECONDS: i64 = 600;

/// Starts an OpenID Connect sign-in: to the provider, with the state bound to this browser.
#[get("/login/oidc")]
pub async fn oidc_start(state: web::Data<AppState>, q: web::Query<NextParam>) -> Result<HttpResponse, ApiError> {
    let next = local_path(q.next.as_deref().unwrap_or("/search"), "/search");
    let start = anon(&state, move |e| e.accounts().oidc_start(&next)).await?;
    let cookie = format!(
        "{OIDC_STATE_COOKIE}={}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={OIDC_STATE_SECONDS}",
        start.state
    );
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, start.url))
        .insert_header((header::SET_COOKIE, cookie))
        .finish())
}

#[derive(Debug, Deserialize)]
pub struct OidcCallback {
    #[serde(default)]
    state: String,
    #[serde(default)]
    code: String,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Template)]
#[template(path = "signed_in.html")]
struct SignedInPage {
    nav: Option<Nav>,
    flash: Option<String>,
    next: String,
}

/// The provider's redirect back: the state must be the one this browser started with. The session cookie is set
/// on a page that then moves on by itself: a SameSite=Strict cookie set during a cross-site redirect chain would
/// not be sent on the chain's next request.
#[get("/login/oidc/callback")]
pub async fn oidc_callback(
    req: HttpRequest,
    state: web::Data<AppState>,
    q: web::Query<OidcCallback>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let clear = format!("{OIDC_STATE_COOKIE}=; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=0");
    let bound = guard::cookie(&req, OIDC_STATE_COOKIE).is_some_and(|c| !q.state.is_empty() && c == q.state);
    let refused = |msg: String| -> Result<HttpResponse, ApiError> {
        let mut resp =
            login_page(&req, &state, None, Some(msg), "/search", "", actix_web::http::StatusCode::UNAUTHORIZED)?;
        resp.headers_mut()
            .append(header::SET_COOKIE, header::HeaderValue::from_str(&clear).map_err(ApiError::internal)?);
        Ok(resp)
    };
    if let Some(err) = q.error {
        let err: String = err.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
        return refused(format!("统一认证平台没有完成登录（{err}），请重试。"));
    }
    if !bound {
        return refused("登录请求不是从本浏览器发起的或已过期，请重新登录。".into());
    }
    let client = guard::client_address(&req);
    match anon(&state, move |e| e.accounts().oidc_finish(&q.state, &q.code, &client)).await {
        Ok((_, cookie, _csrf, next)) => {
            let page = SignedInPage { nav: None, flash: None, next: local_path(&next, "/search") };
            Ok(HttpResponse::Ok()
                .content_type("text/html; charset=utf-8")
                .insert_header(guard::set_cookie(
                    guard::SESSION_COOKIE,
                    &cookie,
                    state.engine.settings().session_seconds(state.settings.session_defaults()).1,
                ))
                .append_header((header::SET_COOKIE, clear))
                .body(page.render().map_err(ApiError::internal)?))
        }
        Err(e) if !e.is_server_error() => refused(e.public_message()),
        Err(e) => Err(e),
    }
}

#[post("/logout")]
pub async fn logout(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    if let guard::Via::Session { cookie, .. } = &caller.via {
        let cookie = cookie.clone();
        call(&state, &caller, move |e, a| e.accounts().logout(a, &cookie)).await?;
    }
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/login?signed_out=1"))
        .insert_header(guard::set_cookie(guard::SESSION_COOKIE, "", 0))
        .finish())
}

// ---------------------------------------------------------------------------------------------------------------
// Search

const PAGE_SIZE: usize = 10;
/// The deepest page the search page links to (`search.max_offset` allows 100 pages of 10).
const MAX_PAGES: usize = 50;

#[derive(Debug, Clone, Deserialize)]
pub struct PageParams {
    #[serde(default)]
    q: String,
    #[serde(default)]
    collection: String,
    #[serde(default)]
    page: Option<usize>,
    /// Set after a feedback post: the chunk just judged.
    #[serde(default)]
    judged: Option<i64>,
    #[serde(default)]
    department: String,
    #[serde(default)]
    doc_type: String,
    #[serde(default)]
    issuer: String,
    #[serde(default)]
    language: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    sort: String,
}

impl PageParams {
    /// The page's state as a search URL (shareable: query, collection, filters, order, page).
    fn url(&self, q: &str, page: usize) -> String {
        let mut u = format!("/search?q={}", percent_encode(q));
        for (k, v) in [
            ("collection", &self.collection),
            ("department", &self.department),
            ("doc_type", &self.doc_type),
            ("issuer", &self.issuer),
            ("language", &self.language),
            ("from", &self.from),
            ("to", &self.to),
            ("sort", &self.sort),
        ] {
            if !v.trim().is_empty() {
                u.push_str(&format!("&{k}={}", percent_encode(v.trim())));
            }
        }
        if page > 1 {
            u.push_str(&format!("&page={page}"));
        }
        u
    }

    /// This state changed by `f`, from its first page.
    fn with(&self, f: impl FnOnce(&mut PageParams)) -> String {
        let mut p = self.clone();
        f(&mut p);
        p.url(&p.q, 1)
    }

    fn filtered(&self) -> bool {
        [&self.department, &self.doc_type, &self.issuer, &self.language, &self.from, &self.to]
            .iter()
            .any(|v| !v.trim().is_empty())
    }
}

/// One facet value as a link that picks it (or, when picked, drops it).
struct FacetLink {
    value: String,
    count: usize,
    selected: bool,
    url: String,
}

/// A facet's heading and values (科室, 类型, 年份).
struct FacetGroup {
    id: &'static str,
    label: &'static str,
    links: Vec<FacetLink>,
}

#[derive(Template)]
#[template(path = "search.html")]
struct SearchPage {
    nav: Option<Nav>,
    flash: Option<String>,
    action: &'static str,
    embed: bool,
    csrf: String,
    query: String,
    collection: String,
    collections: Vec<String>,
    hits: Vec<HitView>,
    /// Hits that contain none of the query's terms (folded under 可能不相关).
    weak_hits: Vec<HitView>,
    took_ms: String,
    method: String,
    error: Option<String>,
    page: usize,
    first_rank: usize,
    prev_url: Option<String>,
    next_url: Option<String>,
    back: String,
    /// "约 1100" or "37": documents (grouped) in the ranking.
    total: String,
    /// Hits only near in meaning, counted apart from `total`.
    near_total: usize,
    last_page: usize,
    /// Terms of the query that occur in none of the readable collections.
    missing: Vec<String>,
    /// Nothing matched any term of the query.
    not_found: bool,
    /// The query as searched when it was folded (traditional → simplified).
    folded: Option<String>,
    /// The typed query when it was read as pinyin (gxy → 高血压: `folded` holds 高血压).
    pinyin_of: Option<String>,
    /// "慢阻肺：慢性阻塞性肺疾病、COPD" per synonym-table term of the query.
    expansions: Vec<String>,
    /// 您是不是要找 suggestions, with their search URLs.
    did_you_mean: Vec<(String, String)>,
    /// Counts per department, type, issuer, language and year for this query, as links that filter.
    facets: Vec<FacetGroup>,
    department: String,
    doc_type: String,
    issuer: String,
    language: String,
    from: String,
    to: String,
    sort_by_date: bool,
    /// The same search in the other order.
    sort_url: String,
    /// The same search without filters, when some are set.
    clear_url: Option<String>,
}

fn search_url(q: &str, collection: &str, page: usize) -> String {
    let mut u = format!("/search?q={}", percent_encode(q));
    if !collection.is_empty() {
        u.push_str(&format!("&collection={}", percent_encode(collection)));
    }
    if page > 1 {
        u.push_str(&format!("&page={page}"));
    }
    u
}

fn method_zh(m: Method) -> &'static str {
    match m {
        Method::Weighted => "混合（加权融合）",
        Method::Rrf => "混合（RRF）",
        Method::Dense => "语义",
        Method::Bm25 => "关键词（BM25）",
    }
}

#[get("/search")]
pub async fn search_page(
    state: web::Data<AppState>,
    caller: Caller,
    p: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let p = p.into_inner();
    let collections = call(&state, &caller, |e, a| e.search().readable_collections(a)).await?;
    let page_no = p.page.unwrap_or(1).clamp(1, MAX_PAGES);
    let mut page = SearchPage {
        nav: Nav::of(&caller),
        flash: None,
        action: "/search",
        embed: false,
        csrf: caller.csrf().to_string(),
        query: p.q.clone(),
        collection: p.collection.clone(),
        collections,
        hits: Vec::new(),
        weak_hits: Vec::new(),
        took_ms: String::new(),
        method: String::new(),
        error: None,
        page: page_no,
        first_rank: (page_no - 1) * PAGE_SIZE + 1,
        prev_url: None,
        next_url: None,
        back: p.url(&p.q, page_no),
        total: String::new(),
        near_total: 0,
        last_page: 0,
        missing: Vec::new(),
        not_found: false,
        folded: None,
        pinyin_of: None,
        expansions: Vec::new(),
        did_you_mean: Vec::new(),
        facets: Vec::new(),
        department: p.department.clone(),
        doc_type: p.doc_type.clone(),
        issuer: p.issuer.clone(),
        language: p.language.clone(),
        from: p.from.clone(),
        to: p.to.clone(),
        sort_by_date: p.sort == "date",
        sort_url: p.with(|n| n.sort = if p.sort == "date" { String::new() } else { "date".into() }),
        clear_url: p
            .filtered()
            .then(|| p.with(|n| (n.department, n.doc_type, n.issuer, n.language, n.from, n.to) = Default::default())),
    };
    if !p.q.trim().is_empty() {
        let some = |v: &str| Some(v.trim().to_string()).filter(|v| !v.is_empty());
        let params = SearchParams {
            q: p.q.clone(),
            collection: some(&p.collection),
            limit: Some(PAGE_SIZE),
            offset: Some((page_no - 1) * PAGE_SIZE),
            method: None,
            group: Some("document".into()),
            exact: None,
            department: some(&p.department),
            doc_type: some(&p.doc_type),
            issuer: some(&p.issuer),
            language: some(&p.language),
            from: some(&p.from),
            to: some(&p.to),
            sort: some(&p.sort),
        };
        match api::search_as(&state, &caller, &params).await {
            Ok(r) => fill_results(&mut page, &r, &p, page_no),
            Err(e) if !e.is_server_error() => page.error = Some(e.public_message()),
            Err(e) => return Err(e),
        }
    }
    render(&page)
}

/// The page's view of one result page: hits split by evidence, the not-found statement, the pager.
fn fill_results(page: &mut SearchPage, r: &care_engine::SearchResults, p: &PageParams, page_no: usize) {
    let mut hits: Vec<HitView> = r.hits.iter().map(HitView::from_hit).collect();
    for h in &mut hits {
        h.judged = p.judged == Some(h.chunk_id);
    }
    // When no term of the query occurs anywhere, nothing listed answers it: everything is only near in meaning.
    let (weak, strong): (Vec<HitView>, Vec<HitView>) = hits.into_iter().partition(|h| h.weak || r.not_found);
    page.hits = strong;
    page.weak_hits = weak;
    page.took_ms = format!("{:.1}", r.took_ms);
    page.method = method_zh(r.method).to_string();
    page.missing = r.missing_terms.clone();
    page.not_found = r.not_found;
    page.folded = r.folded_query.clone();
    page.pinyin_of = r.pinyin_of.clone();
    page.expansions = r.expansions.iter().map(|x| format!("{}：{}", x.term, x.synonyms.join("、"))).collect();
    if r.pinyin_of.is_none() {
        page.did_you_mean = r.did_you_mean.iter().map(|w| (w.clone(), p.url(w, 1))).collect();
    }
    page.facets = facet_groups(&r.facets, p);
    // Pages slice the whole ranking; the total counts only what answers, the rest is counted apart.
    page.last_page = (r.total + r.near_total).div_ceil(PAGE_SIZE).clamp(1, MAX_PAGES);
    page.total = if r.total_is_lower_bound { format!("约 {}", r.total) } else { r.total.to_string() };
    page.near_total = r.near_total;
    if page_no > 1 {
        page.prev_url = Some(p.url(&p.q, page_no - 1));
    }
    if page_no < page.last_page {
        page.next_url = Some(p.url(&p.q, page_no + 1));
    }
}

/// The facet counts as links: a value picks it (one per facet on this page; the API takes lists), a picked value
/// drops it; a year sets the date range to that year.
fn facet_groups(f: &care_engine::facets::Facets, p: &PageParams) -> Vec<FacetGroup> {
    let links = |counts: &[care_engine::facets::FacetCount], set: &dyn Fn(&mut PageParams, String)| {
        counts
            .iter()
            .take(12)
            .map(|c| FacetLink {
                value: c.value.clone(),
                count: c.count,
                selected: c.selected,
                url: p.with(|n| set(n, if c.selected { String::new() } else { c.value.clone() })),
            })
            .collect::<Vec<_>>()
    };
    let groups = [
        ("facet-department", "科室", links(&f.departments, &|n, v| n.department = v)),
        ("facet-type", "类型", links(&f.doc_types, &|n, v| n.doc_type = v)),
        ("facet-issuer", "来源", links(&f.issuers, &|n, v| n.issuer = v)),
        ("facet-language", "语言", links(&f.languages, &|n, v| n.language = v)),
        (
            "facet-year",
            "年份",
            links(&f.years, &|n, v| {
                n.from = v.clone();
                n.to = v;
            }),
        ),
    ];
    groups.into_iter().filter(|g| !g.2.is_empty()).map(|(id, label, links)| FacetGroup { id, label, links }).collect()
}

#[derive(Debug, Deserialize)]
pub struct FeedbackForm {
    q: String,
    chunk: i64,
    helpful: u8,
    #[serde(default)]
    back: String,
}

#[post("/feedback")]
pub async fn feedback(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<FeedbackForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    let (q, chunk, helpful) = (f.q.clone(), f.chunk, f.helpful != 0);
    call(&state, &caller, move |e, a| e.search().feedback(a, &q, chunk, helpful)).await?;
    let back = local_path(&f.back, "/search");
    let sep = if back.contains('?') { '&' } else { '?' };
    Ok(see_other(&format!("{back}{sep}judged={}#hit-{}", f.chunk, f.chunk)))
}

// ---------------------------------------------------------------------------------------------------------------
// Documents and account

#[derive(Template)]
#[template(path = "document.html")]
struct DocumentPage {
    nav: Option<Nav>,
    flash: Option<String>,
    doc: care_engine::feedback::DocumentView,
    /// One per chunk: headings, then paragraphs, lists and tables, the query's terms marked.
    sections: Vec<Section>,
    /// The query whose terms are marked (empty: none).
    query: String,
    marks: usize,
    created_local: String,
    offset_label: String,
    search_url: String,
    plain_url: String,
}

#[derive(Debug, Deserialize)]
pub struct DocParams {
    /// The query that led here (from a search hit): its terms are marked in the text.
    #[serde(default)]
    q: String,
    /// The hit's rank and passage, when a result was clicked: recorded for the search analytics.
    #[serde(default)]
    r: Option<usize>,
    #[serde(default)]
    c: Option<i64>,
}

/// Where a search hit links: its passage in the document, with the query so the view marks its terms.
pub fn doc_href(document_id: i64, chunk_id: i64, q: &str) -> String {
    let q = q.trim();
    if q.is_empty() {
        format!("/doc/{document_id}#c{chunk_id}")
    } else {
        format!("/doc/{document_id}?q={}#c{chunk_id}", percent_encode(q))
    }
}

#[get("/doc/{id}")]
pub async fn document(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<i64>,
    p: web::Query<DocParams>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let p = p.into_inner();
    let query: String = p.q.trim().chars().take(care_engine::MAX_QUERY_CHARS).collect();
    let q = query.clone();
    let (doc, sections) = call(&state, &caller, move |e, a| {
        let doc = e.search().document(a, id)?;
        if let (false, Some(rank)) = (q.is_empty(), p.r) {
            // Only after the document was allowed; through the audit writer, so the page does not wait for it.
            e.search().click(a, &q, id, p.c, rank)?;
        }
        let sections = care_engine::docview::document_sections(e.searcher(), &doc, &q);
        Ok((doc, sections))
    })
    .await?;
    // Times are shown at the hospital's offset from UTC (the one training schedules use).
    let offset = state.engine.config().training.utc_offset_minutes;
    render(&DocumentPage {
        nav: Nav::of(&caller),
        flash: None,
        created_local: docview::local_time(&doc.created_at, offset),
        offset_label: docview::offset_label(offset),
        marks: if query.is_empty() { 0 } else { docview::marked_count(&sections) },
        search_url: if query.is_empty() { "/search".into() } else { search_url(&query, "", 1) },
        plain_url: format!("/doc/{id}"),
        query,
        sections,
        doc,
    })
}

#[derive(Template)]
#[template(path = "account.html")]
struct AccountPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    username: String,
    role: &'static str,
    collections: Vec<String>,
}

async fn account_page(
    state: &web::Data<AppState>,
    caller: &Caller,
    flash: Option<String>,
    error: Option<String>,
) -> Result<HttpResponse, ApiError> {
    let collections = call(state, caller, |e, a| e.search().readable_collections(a)).await?;
    render(&AccountPage {
        nav: Nav::of(caller),
        flash,
        error,
        csrf: caller.csrf().to_string(),
        username: caller.user.username.clone(),
        role: if caller.user.is_admin() { "管理员" } else { "临床用户" },
        collections,
    })
}

#[get("/account")]
pub async fn account(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let flash = caller
        .user
        .must_change_password
        .then(|| {
            "请先修改初始密码：它由管理员为您设置，或在安装时显示在服务器上；为了安全，请改成只有您知道的密码，然后重新登录。"
                .to_string()
        });
    account_page(&state, &caller, flash, None).await
}

#[derive(Debug, Deserialize)]
pub struct PasswordForm {
    current: String,
    new: String,
}

#[post("/account/password")]
pub async fn change_password(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<PasswordForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    let (policy, client) = (state.settings.auth.policy(), guard::client_address(&req));
    match call(&state, &caller, move |e, a| e.accounts().change_own_password(a, &f.current, &f.new, policy, &client))
        .await
    {
        // Changing the password ends every session, this one included: sign in again.
        Ok(()) => Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, "/login"))
            .insert_header(guard::set_cookie(guard::SESSION_COOKIE, "", 0))
            .finish()),
        Err(e)
            if matches!(
                e.code(),
                care_engine::ErrorCode::InvalidInput
                    | care_engine::ErrorCode::AccountLocked
                    | care_engine::ErrorCode::RateLimited
            ) =>
        {
            // The form again with the reason, under the error's own status (400, 423 or 429).
            let mut res = account_page(&state, &caller, None, Some(e.public_message())).await?;
            *res.status_mut() = status_of(e.code());
            Ok(res)
        }
        Err(e) => Err(e),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The embeddable widget

#[derive(Template)]
#[template(path = "embed.html")]
struct EmbedPage {
    signed_in: bool,
    query: String,
    hits: Vec<HitView>,
    error: Option<String>,
    /// Terms of the query found in no readable collection.
    missing: Vec<String>,
    not_found: bool,
}

/// A compact search for other hospital systems to frame (allowed origins: `server.embed_origins`). It uses the
/// user's CARE session; the session cookie is SameSite=Strict, which browsers send to a frame whose embedding page
/// is on the same site (e.g. his.hospital.local framing care.hospital.local).
#[get("/embed")]
pub async fn embed(
    state: web::Data<AppState>,
    who: MaybeCaller,
    p: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let mut page = EmbedPage {
        signed_in: who.0.is_some(),
        query: p.q.clone(),
        hits: Vec::new(),
        error: None,
        missing: Vec::new(),
        not_found: false,
    };
    if let (Some(c), false) = (&who.0, p.q.trim().is_empty()) {
        let params =
            SearchParams { q: p.q.clone(), limit: Some(5), group: Some("document".into()), ..Default::default() };
        match api::search_as(&state, c, &params).await {
            Ok(r) => {
                page.hits = r.hits.iter().map(HitView::from_hit).collect();
                page.missing = r.missing_terms.clone();
                page.not_found = r.not_found;
            }
            Err(e) if !e.is_server_error() => page.error = Some(e.public_message()),
            Err(e) => return Err(e),
        }
    }
    render(&page)
}

const STYLE: &str = include_str!("../../../web/style.css");
const APP_JS: &str = include_str!("../../../web/app.js");

#[get("/assets/{file}")]
pub async fn asset(file: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (body, ct) = match file.as_str() {
        "style.css" => (STYLE, "text/css; charset=utf-8"),
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        other => return Err(ApiError::Engine(care_engine::Error::NotFound { what: format!("资源 `{other}`") })),
    };
    Ok(HttpResponse::Ok().content_type(ct).insert_header((header::CACHE_CONTROL, "public, max-age=3600")).body(body))
}
