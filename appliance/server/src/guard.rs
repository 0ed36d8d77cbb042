//! The one middleware every request passes: request id, identity, the access table, CSRF, security headers,
//! latency metrics and error rendering.
//!
//! Identity comes from a bearer API token (`Authorization: Bearer care_…`, for machine clients) or the session
//! cookie `__Host-care_session` (Secure, HttpOnly, SameSite=Strict, Path=/; the `__Host-` prefix makes browsers
//! refuse it from plain HTTP or with a Domain). CSRF: a state-changing request that rides on the session cookie
//! must carry the session's synchronizer token (`X-CSRF-Token` header, or the `csrf` form field; in a multipart
//! upload the form's first field, read without reading the upload). A token never travels in a URL: URLs end up in
//! logs, history and Referer headers. Bearer requests carry no ambient credential, so they need none. The login
//! form, which has no session yet, uses a double-submit cookie.

use std::future::{Ready, ready};
use std::time::{Duration, Instant};

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode, header};
use actix_web::middleware::Next;
use actix_web::web::{self, Bytes};
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse};
use care_engine::ErrorCode;
use care_engine::accounts::{self, TokenScope, User};

use crate::AppState;
use crate::errors::{self, ApiError};
use crate::table::{self, Access, Kind};

/// What a user whose password must be changed (the first administrator's printed one) may still reach.
const PASSWORD_CHANGE_ROUTES: &[&str] =
    &["/account", "/account/password", "/logout", "/api/v1/me", "/api/v1/me/password", "/assets/{file}"];

/// What a standby accepts besides reading: signing in and out (its sessions live and die with the copy).
const STANDBY_WRITES: &[&str] = &["/login", "/logout"];

pub const SESSION_COOKIE: &str = "__Host-care_session";
pub const LOGIN_CSRF_COOKIE: &str = "__Host-care_login_csrf";

#[derive(Debug, Clone)]
pub struct RequestId(pub String);

#[derive(Debug, Clone)]
pub enum Via {
    Session {
        cookie: String,
        csrf: String,
    },
    /// A bearer token and what it opens.
    Token(care_engine::accounts::TokenScope),
}

/// The signed-in user of a request (set by the guard; extract it in handlers).
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: User,
    pub via: Via,
}

impl Caller {
    pub fn name(&self) -> &str {
        &self.user.username
    }
    /// The caller as the engine's service layer sees it (its authorisation input).
    pub fn actor(&self) -> care_engine::Actor {
        care_engine::Actor::user(&self.user)
    }
    /// The session's CSRF token, for forms rendered for this caller (empty for token callers).
    pub fn csrf(&self) -> &str {
        match &self.via {
            Via::Session { csrf, .. } => csrf,
            Via::Token(_) => "",
        }
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, Self::Error>>;
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<Caller>()
                .cloned()
                .ok_or_else(|| ApiError::SignInRequired("请先登录 (sign in first)".into())),
        )
    }
}

/// `Option<Caller>` for public routes that behave differently when signed in.
#[derive(Debug, Clone)]
pub struct MaybeCaller(pub Option<Caller>);

impl FromRequest for MaybeCaller {
    type Error = ApiError;
    type Future = Ready<Result<Self, Self::Error>>;
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Ok(MaybeCaller(req.extensions().get::<Caller>().cloned())))
    }
}

pub fn cookie(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers().get_all(header::COOKIE).filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name && !v.is_empty()).then(|| v.to_string())
    })
}

/// The client's address as the connection shows it. Forwarded-for headers are not read: the appliance is reached
/// directly, and a header is the client's to choose, so trusting one would let anyone pick the address a limit
/// counts.
pub fn client_address(req: &HttpRequest) -> String {
    req.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default()
}

/// `Set-Cookie` for a secure, script-invisible, same-site-only cookie; `max_age` 0 deletes it.
pub fn set_cookie(name: &str, value: &str, max_age: i64) -> (header::HeaderName, String) {
    (header::SET_COOKIE, format!("{name}={value}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}"))
}

pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `key` in an `application/x-www-form-urlencoded` string.
pub fn form_field(body: &str, key: &str) -> Option<String> {
    body.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(k) == key).then(|| percent_decode(v))
    })
}

/// Constant-time comparison for tokens.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn request_id() -> String {
    accounts::random_token().map(|t| t[..16].to_string()).unwrap_or_else(|_| "0000000000000000".into())
}

async fn identify(req: &ServiceRequest, state: &web::Data<AppState>) -> Result<Option<Caller>, ApiError> {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|s| s.trim().to_string());
    let session = cookie(req.request(), SESSION_COOKIE);
    if bearer.is_none() && session.is_none() {
        return Ok(None);
    }
    let (idle, max) = state.engine.settings().session_seconds(state.settings.session_defaults());
    crate::call::anon(state, move |engine| {
        if let Some(t) = bearer {
            return Ok(engine
                .accounts()
                .token_caller(&t)?
                .map(|(user, scope)| Caller { user, via: Via::Token(scope) }));
        }
        let cookie = session.unwrap_or_default();
        Ok(engine
            .accounts()
            .session(&cookie, idle, max)?
            .map(|s| Caller { user: s.user, via: Via::Session { cookie, csrf: s.csrf_token } }))
    })
    .await
}

/// Largest urlencoded form body read anywhere (the login form, admin forms). The CSRF check reads the body
/// before the handler's own extractor, so it must enforce this itself: actix's payload limit is the upload size.
pub const FORM_LIMIT: usize = 256 * 1024;

fn form_too_large(size: u64) -> ApiError {
    ApiError::Engine(care_engine::Error::TooLarge {
        what: "表单 (the form body)".into(),
        size,
        limit: FORM_LIMIT as u64,
        hint: "表单内容过大；请缩短后重新提交 (shorten the form)".into(),
    })
}

/// Pulls the body of a form post (at most [`FORM_LIMIT`] bytes, refused by its declared length before reading)
/// so its `csrf` field can be checked, then puts it back for the handler.
async fn take_form_body(req: &mut ServiceRequest) -> Result<Bytes, ApiError> {
    use futures::StreamExt;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > FORM_LIMIT as u64) {
        return Err(form_too_large(n));
    }
    let mut payload = req.take_payload();
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("表单无法读取：{e}")))?;
        if body.len() + chunk.len() > FORM_LIMIT {
            return Err(form_too_large((body.len() + chunk.len()) as u64));
        }
        body.extend_from_slice(&chunk);
    }
    let bytes = body.freeze();
    put_back(req, bytes.clone(), Payload::None);
    Ok(bytes)
}

/// Puts the bytes a check read back in front of the rest of the body (`rest`), for the handler's own extractor.
fn put_back(req: &mut ServiceRequest, read: Bytes, rest: Payload) {
    use futures::StreamExt;
    let stream: std::pin::Pin<Box<dyn futures::Stream<Item = Result<Bytes, actix_web::error::PayloadError>>>> =
        Box::pin(futures::stream::once(async move { Ok(read) }).chain(rest));
    req.set_payload(Payload::from(stream));
}

/// Bytes of a multipart body read at most to find its first field (the pages put `csrf` first).
const MULTIPART_HEAD: usize = 16 * 1024;

/// The `csrf` field of a multipart form when it is the first part: reads at most [`MULTIPART_HEAD`] bytes of the
/// body, never the upload behind it, then puts what it read back in front of the rest for the handler.
async fn multipart_csrf(req: &mut ServiceRequest, content_type: &str) -> Result<Option<String>, ApiError> {
    use futures::StreamExt;
    let Some(boundary) = content_type.split(';').find_map(|p| p.trim().strip_prefix("boundary=")) else {
        return Ok(None);
    };
    let boundary = boundary.trim_matches('"').to_string();
    let mut payload = req.take_payload();
    let mut head = web::BytesMut::new();
    let mut found = FirstPart::Incomplete;
    while head.len() < MULTIPART_HEAD {
        match payload.next().await {
            Some(chunk) => {
                head.extend_from_slice(&chunk.map_err(|e| ApiError::invalid(format!("上传内容无法读取：{e}")))?)
            }
            None => break,
        }
        found = first_part(&head, &boundary, "csrf");
        if !matches!(found, FirstPart::Incomplete) {
            break;
        }
    }
    put_back(req, head.freeze(), payload);
    Ok(match found {
        FirstPart::Value(v) => Some(v),
        FirstPart::Other | FirstPart::Incomplete => None,
    })
}

#[derive(Debug, PartialEq)]
enum FirstPart {
    Value(String),
    /// The first part is another field.
    Other,
    Incomplete,
}

/// The value of the multipart body's first part when that part is the field `name`.
fn first_part(body: &[u8], boundary: &str, name: &str) -> FirstPart {
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let delimiter = format!("--{boundary}\r\n");
    let Some(start) = find(body, delimiter.as_bytes()) else { return FirstPart::Incomplete };
    let part = &body[start + delimiter.len()..];
    let Some(end_of_headers) = find(part, b"\r\n\r\n") else { return FirstPart::Incomplete };
    let headers = String::from_utf8_lossy(&part[..end_of_headers]).to_ascii_lowercase();
    let wanted = format!("name=\"{name}\"");
    if !headers.lines().any(|l| l.starts_with("content-disposition:") && l.split(';').any(|p| p.trim() == wanted)) {
        return FirstPart::Other;
    }
    let value = &part[end_of_headers + 4..];
    match find(value, format!("\r\n--{boundary}").as_bytes()) {
        Some(end) => FirstPart::Value(String::from_utf8_lossy(&value[..end]).into_owned()),
        None => FirstPart::Incomplete,
    }
}

async fn check_csrf(req: &mut ServiceRequest, caller: Option<&Caller>) -> Result<(), ApiError> {
    let expected = match caller.map(|c| &c.via) {
        Some(Via::Token(_)) => return Ok(()),
        Some(Via::Session { csrf, .. }) => csrf.clone(),
        // Anonymous posts (the login form): double-submit cookie.
        None => cookie(req.request(), LOGIN_CSRF_COOKIE).ok_or(ApiError::CsrfRejected)?,
    };
    let header = req.headers().get("x-csrf-token").and_then(|v| v.to_str().ok()).map(str::to_string);
    let given = match header {
        Some(h) => Some(h),
        None => {
            let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            if ct.starts_with("application/x-www-form-urlencoded") {
                let body = take_form_body(req).await?;
                form_field(&String::from_utf8_lossy(&body), "csrf")
            } else if ct.starts_with("multipart/form-data") {
                multipart_csrf(req, &ct).await?
            } else {
                None
            }
        }
    };
    match given {
        Some(g) if !expected.is_empty() && same(&g, &expected) => Ok(()),
        _ => Err(ApiError::CsrfRejected),
    }
}

fn security_headers(res: &mut HttpResponse, state: &AppState, embed: bool, cacheable: bool, rid: &str) {
    let h = res.headers_mut();
    let frame_ancestors = if embed {
        let mut a = vec!["'self'".to_string()];
        a.extend(state.settings.server.embed_origins.iter().cloned());
        a.join(" ")
    } else {
        "'none'".to_string()
    };
    let csp = format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; \
         base-uri 'none'; form-action 'self'; frame-ancestors {frame_ancestors}"
    );
    let pairs: [(&str, String); 6] = [
        ("content-security-policy", csp),
        ("strict-transport-security", "max-age=31536000".into()),
        ("x-content-type-options", "nosniff".into()),
        ("referrer-policy", "same-origin".into()),
        ("cross-origin-opener-policy", "same-origin".into()),
        ("x-request-id", rid.to_string()),
    ];
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (header::HeaderName::try_from(k), header::HeaderValue::try_from(v)) {
            h.insert(k, v);
        }
    }
    if !embed {
        h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    }
    if !cacheable {
        h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    }
}

/// Audits a refusal of the guard's own (no sign-in on an API route, not an administrator, no CSRF token): who,
/// which route pattern (never the raw path, which is the client's to choose) and from which address. The engine
/// rate-limits these records; a failure to write one is logged, not shown to the client.
async fn audit_refusal(
    state: &web::Data<AppState>,
    req: &ServiceRequest,
    actor: &str,
    action: &'static str,
    route: &str,
) {
    let (actor, client) = (actor.to_string(), client_address(req.request()));
    let detail = serde_json::json!({"method": req.method().as_str(), "route": route});
    if let Err(e) = crate::call::anon(state, move |en| en.audit().refusal(&actor, action, &client, &detail)).await {
        tracing::warn!(error = %e, action, "could not audit a refused request");
    }
}

fn is_page_path(path: &str) -> bool {
    !(path.starts_with("/api/") || path == "/metrics" || path == "/healthz" || path.ends_with(".csv"))
}

pub async fn guard(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let state = req.app_data::<web::Data<AppState>>().cloned().expect("AppState is registered");
    let rid = request_id();
    req.extensions_mut().insert(RequestId(rid.clone()));
    let path = req.path().to_string();
    let method = req.method().clone();
    let pattern = req.match_pattern();
    let route = match &pattern {
        Some(p) => match table::lookup(method.as_str(), p) {
            Ok(r) => Some(r),
            Err(true) => {
                let mut res = HttpResponse::MethodNotAllowed().finish();
                security_headers(&mut res, &state, false, false, &rid);
                return Ok(req.into_response(res));
            }
            Err(false) => {
                tracing::error!(pattern = %p, method = %method, "route is not in the access table; refusing it");
                let e = ApiError::internal(format!("route {p} is missing from the access table"));
                let res = errors::render(ErrorCode::Internal, &e.public_message(), &rid, is_page_path(&path), None);
                return Ok(req.into_response(res));
            }
        },
        None => None,
    };
    let page = route.map_or(is_page_path(&path), |r| r.kind == Kind::Page);
    let denied = |code: ErrorCode, msg: &str| errors::render(code, msg, &rid, page, None);

    let identifying = Instant::now();
    let caller = match identify(&req, &state).await {
        Ok(c) => c,
        Err(e) => return Ok(req.into_response(denied(e.code(), &e.public_message()))),
    };
    let auth = identifying.elapsed();
    if let Some(c) = &caller {
        req.extensions_mut().insert(c.clone());
    }
    // From here on an error page keeps the caller's navigation.
    let nav = caller.as_ref().and_then(crate::pages::Nav::of);
    let denied = |code: ErrorCode, msg: &str| errors::render(code, msg, &rid, page, nav.as_ref());
    if let Some(r) = route {
        let backups_only = |c: &Caller| matches!(c.via, Via::Token(TokenScope::Backups));
        let allowed = match (r.access, &caller) {
            (Access::Public, _) => Ok(()),
            (_, None) => Err(None),
            (Access::Admin | Access::Backups, Some(c)) if !c.user.is_admin() => Err(Some(c.user.username.clone())),
            (Access::User | Access::Admin, Some(c)) if backups_only(c) => {
                audit_refusal(&state, &req, &c.user.username, "request.forbidden", r.pattern).await;
                let res = denied(ErrorCode::Forbidden, "此令牌只能读取备份（供备用机使用），不能进行其他操作");
                return Ok(finish(req.into_response(res), &state, route, started, &rid));
            }
            _ => Ok(()),
        };
        match allowed {
            Ok(()) => {}
            Err(None) if page => {
                let next = match req.query_string() {
                    "" => path.clone(),
                    q => format!("{path}?{q}"),
                };
                let res = HttpResponse::Found()
                    .insert_header((header::LOCATION, format!("/login?next={}", percent_encode(&next))))
                    .finish();
                return Ok(finish(req.into_response(res), &state, route, started, &rid));
            }
            Err(None) => {
                audit_refusal(&state, &req, "anonymous", "request.unauthenticated", r.pattern).await;
                let res = denied(
                    ErrorCode::Unauthenticated,
                    "请先登录（接口调用请在请求头加 `Authorization: Bearer <API 令牌>`）",
                );
                return Ok(finish(req.into_response(res), &state, route, started, &rid));
            }
            Err(Some(user)) => {
                audit_refusal(&state, &req, &user, "request.forbidden", r.pattern).await;
                let res = denied(ErrorCode::Forbidden, &format!("用户 {user} 不是管理员，无权进行此操作"));
                return Ok(finish(req.into_response(res), &state, route, started, &rid));
            }
        }
    }
    // A standby serves search only: every write but signing in and out is refused, naming the primary.
    if let (Some(s), Some(r)) = (&state.standby, route)
        && !matches!(*req.method(), Method::GET | Method::HEAD)
        && !STANDBY_WRITES.contains(&r.pattern)
    {
        let e = care_engine::backup::standby::refusal(s);
        let res = denied(e.code(), &e.to_string());
        return Ok(finish(req.into_response(res), &state, route, started, &rid));
    }
    // Only sessions: they are what the printed password opens. An API token was made by an administrator whose
    // password was changed, or by the operator on the machine (`care user token`).
    if let (Some(c), Some(r)) = (&caller, route)
        && c.user.must_change_password
        && matches!(c.via, Via::Session { .. })
        && !PASSWORD_CHANGE_ROUTES.contains(&r.pattern)
        && r.access != Access::Public
    {
        let res = if page {
            HttpResponse::SeeOther().insert_header((header::LOCATION, "/account")).finish()
        } else {
            denied(
                ErrorCode::Forbidden,
                "请先修改初始密码（「我的账户」页面或 POST /api/v1/me/password）(the initial password must be changed first)",
            )
        };
        return Ok(finish(req.into_response(res), &state, route, started, &rid));
    }
    if !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS)
        && let Some(r) = route
        && let Err(e) = check_csrf(&mut req, caller.as_ref()).await
    {
        if e.code() == ErrorCode::CsrfRejected {
            let actor = caller.as_ref().map_or("anonymous", |c| c.name());
            audit_refusal(&state, &req, actor, "request.csrf_rejected", r.pattern).await;
        }
        let res = denied(e.code(), &e.public_message());
        return Ok(finish(req.into_response(res), &state, route, started, &rid));
    }
    let res = next.call(req).await?.map_into_boxed_body();
    // Errors from handlers (and from actix's own extractors) are rendered here, with the request id.
    let res = if res.status().is_client_error() || res.status().is_server_error() {
        let (code, message) = match res.response().error() {
            Some(err) => match err.as_error::<ApiError>() {
                Some(api) => (api.code(), api.public_message()),
                None if res.status() == StatusCode::PAYLOAD_TOO_LARGE => (ErrorCode::TooLarge, err.to_string()),
                None if res.status().is_client_error() => (ErrorCode::InvalidInput, err.to_string()),
                None => (ErrorCode::Internal, "internal error".to_string()),
            },
            None => (ErrorCode::Internal, String::new()),
        };
        if res.response().error().is_some() {
            let (req, _) = res.into_parts();
            ServiceResponse::new(req, errors::render(code, &message, &rid, page, nav.as_ref()))
        } else {
            res
        }
    } else {
        res
    };
    let mut res = finish(res, &state, route, started, &rid);
    server_timing(res.response_mut(), auth, started.elapsed());
    Ok(res)
}

/// `Server-Timing` (W3C; browsers' developer tools show it): the sign-in check (`auth`: token or cookie lookup,
/// with its hand-off to a blocking thread) and the whole request inside the server (`app`, from the middleware's
/// start to the response's body built, before TLS writes it). With the search's own `took_ms` this splits a
/// request's time into the engine, the rest of the server, and the transport (`care-bench --http`).
fn server_timing(res: &mut HttpResponse, auth: Duration, app: Duration) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut value = format!("auth;dur={:.3}, app;dur={:.3}", ms(auth), ms(app));
    // A handler's own stages (the search pipeline's) follow.
    if let Some(stages) = res.headers().get("server-timing").and_then(|v| v.to_str().ok()) {
        value = format!("{value}, {stages}");
    }
    if let Ok(v) = header::HeaderValue::from_str(&value) {
        res.headers_mut().insert(header::HeaderName::from_static("server-timing"), v);
    }
}

fn finish(
    mut res: ServiceResponse<BoxBody>,
    state: &AppState,
    route: Option<&table::Route>,
    started: Instant,
    rid: &str,
) -> ServiceResponse<BoxBody> {
    let pattern = route.map_or("(unmatched)", |r| r.pattern);
    let embed = pattern == "/embed";
    let cacheable = pattern == "/assets/{file}";
    security_headers(res.response_mut(), state, embed, cacheable, rid);
    state.metrics.observe(
        res.request().method().as_str(),
        pattern,
        res.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::{FirstPart, first_part};

    fn body(parts: &[(&str, &str)]) -> Vec<u8> {
        let mut b = String::new();
        for (name, value) in parts {
            b.push_str(&format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"));
        }
        b.push_str("--XyZ--\r\n");
        b.into_bytes()
    }

    #[test]
    fn the_first_multipart_field_is_read_only_when_it_is_the_token() {
        let b = body(&[("csrf", "t0ken"), ("file", "a large upload")]);
        assert_eq!(first_part(&b, "XyZ", "csrf"), FirstPart::Value("t0ken".into()));
        // Another field first: no token (a form that put it later is refused, never read to its end).
        let b = body(&[("file", "x"), ("csrf", "t0ken")]);
        assert_eq!(first_part(&b, "XyZ", "csrf"), FirstPart::Other);
        // `name="csrf_x"` or a filename that mentions csrf is not the field.
        let b = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"name=\\\"csrf\\\"\"\r\n\r\nv\r\n";
        assert_eq!(first_part(b, "XyZ", "csrf"), FirstPart::Other);
        // Cut anywhere before the value ends, it waits for more.
        let whole = body(&[("csrf", "t0ken"), ("file", "x")]);
        let end = whole.windows(7).position(|w| w == b"\r\n--XyZ").unwrap();
        for cut in 0..end + 6 {
            assert_eq!(first_part(&whole[..cut], "XyZ", "csrf"), FirstPart::Incomplete, "cut at {cut}");
        }
    }
}
