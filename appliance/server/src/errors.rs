//! Errors as clients see them. Codes, status classes and Chinese titles come from the engine's one table
//! (`care_engine::ErrorCode`); here a class becomes an HTTP status in one exhaustive `match`, and the failures only
//! HTTP has (no session, a bad CSRF token) get their own variants. The same code, message and request id reach API
//! clients (JSON) and browsers (an HTML page); the guard middleware renders both, because only it knows the request
//! id and whether the route is a page.

use crate::filters;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use care_engine::error::StatusClass;
use care_engine::{Error, ErrorCode};
use serde::Serialize;

/// Exhaustive on purpose: a new class does not compile until it has a status here.
pub fn http_status(class: StatusClass) -> StatusCode {
    match class {
        StatusClass::BadRequest => StatusCode::BAD_REQUEST,
        StatusClass::Unauthorized => StatusCode::UNAUTHORIZED,
        StatusClass::Forbidden => StatusCode::FORBIDDEN,
        StatusClass::NotFound => StatusCode::NOT_FOUND,
        StatusClass::Conflict => StatusCode::CONFLICT,
        StatusClass::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        StatusClass::UnsupportedMedia => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        StatusClass::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        StatusClass::Locked => StatusCode::LOCKED,
        StatusClass::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        StatusClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        StatusClass::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub fn status_of(code: ErrorCode) -> StatusCode {
    http_status(code.class())
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// A failed request: an engine error, or one of the failures only HTTP has.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Engine(#[from] Error),
    #[error("{0}")]
    SignInRequired(String),
    #[error("表单已失效：请刷新页面后重新提交 (the form's CSRF token is missing or invalid; reload and submit again)")]
    CsrfRejected,
}

impl ApiError {
    pub fn internal(e: impl std::fmt::Display) -> Self {
        ApiError::Engine(Error::Internal(e.to_string()))
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        ApiError::Engine(Error::InvalidInput(msg.into()))
    }
    pub fn forbidden(msg: impl Into<String>) -> Self {
        ApiError::Engine(Error::Forbidden(msg.into()))
    }
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::Engine(e) => e.code(),
            ApiError::SignInRequired(_) => ErrorCode::Unauthenticated,
            ApiError::CsrfRejected => ErrorCode::CsrfRejected,
        }
    }
    pub fn is_server_error(&self) -> bool {
        self.code().class().is_server_error()
    }
    /// The message a client may see: internal details (paths, SQL) stay in the server log. A full disk and a
    /// busy appliance are told as they are (their messages are written for people and say what to do). Server
    /// staging folders (an upload's, a model import's) are taken out of the message: they name the server's
    /// layout and nothing the admin can act on; a file keeps its own name.
    ///
    /// Every message a person reads is Chinese: one whose text is not (a library's or a parser's words passed on)
    /// is led by its code's Chinese title, so the reader still learns what kind of failure it is.
    pub fn public_message(&self) -> String {
        if self.is_server_error() && !matches!(self.code(), ErrorCode::DiskFull | ErrorCode::Overloaded) {
            return "内部错误；管理员可在服务器日志中按请求编号查到详情 (internal error; see the server log)"
                .to_string();
        }
        let msg = without_staging(&self.to_string());
        if has_chinese(&msg) { msg } else { format!("{}：{msg}", self.code().title_zh()) }
    }
}

/// Whether a text holds Chinese (a CJK ideograph): what every message shown to a person must.
pub fn has_chinese(s: &str) -> bool {
    s.chars().any(care_engine::text::is_cjk)
}

/// Folders whose next path component is a staging token (`<data_dir>/uploads/`, `<data_dir>/models/.import-`),
/// set once when the server starts.
static STAGING_ROOTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// A request actix could not parse, told in Chinese (its own texts are English, e.g. "Query deserialize error:
/// invalid digit found in string"); the parser's words follow in brackets for the logs. An oversized body keeps
/// its own code (413).
fn unparsable(what: &str, detail: String, too_large: Option<(usize, usize)>) -> actix_web::Error {
    let e = match too_large {
        Some((size, limit)) => Error::TooLarge {
            what: what.into(),
            size: size as u64,
            limit: limit as u64,
            hint: "请缩短后重新提交".into(),
        },
        None => Error::InvalidInput(format!("{what}格式不正确，无法识别；请检查后重试 ({detail})")),
    };
    ApiError::Engine(e).into()
}

pub fn unparsable_query(e: actix_web::error::QueryPayloadError, _: &actix_web::HttpRequest) -> actix_web::Error {
    unparsable("网址中的查询参数", e.to_string(), None)
}

pub fn unparsable_path(e: actix_web::error::PathError, _: &actix_web::HttpRequest) -> actix_web::Error {
    unparsable("网址路径中的参数", e.to_string(), None)
}

pub fn unparsable_form(e: actix_web::error::UrlencodedError, _: &actix_web::HttpRequest) -> actix_web::Error {
    let big =
        if let actix_web::error::UrlencodedError::Overflow { size, limit } = &e { Some((*size, *limit)) } else { None };
    unparsable("表单", e.to_string(), big)
}

#[allow(clippy::wildcard_enum_match_arm, reason = "actix's enum is non_exhaustive; any other kind is a parse error")]
pub fn unparsable_json(e: actix_web::error::JsonPayloadError, _: &actix_web::HttpRequest) -> actix_web::Error {
    use actix_web::error::JsonPayloadError as J;
    let big = match &e {
        J::OverflowKnownLength { length, limit } => Some((*length, *limit)),
        J::Overflow { limit } => Some((limit + 1, *limit)),
        _ => None,
    };
    unparsable("JSON 请求体", e.to_string(), big)
}

pub fn set_staging_roots(roots: Vec<String>) {
    let _ = STAGING_ROOTS.set(roots.into_iter().filter(|r| !r.is_empty()).collect());
}

/// `msg` with each `<root><token>/` removed (the file name after it stays) and a bare `<root><token>` said as
/// 上传的文件.
pub fn without_staging(msg: &str) -> String {
    let Some(roots) = STAGING_ROOTS.get() else { return msg.to_string() };
    let mut out = msg.to_string();
    for root in roots {
        let mut done = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(root.as_str()) {
            done.push_str(&rest[..i]);
            let after = &rest[i + root.len()..];
            // Chinese messages end a path with full-width punctuation too (模型包 <dir>：…).
            let token_end = after
                .find(|c: char| matches!(c, '/' | ':' | '"' | ')' | '：' | '，' | '）' | '；') || c.is_whitespace());
            let after_token = &after[token_end.unwrap_or(after.len())..];
            match after_token.strip_prefix('/') {
                Some(file) => rest = file,
                None => {
                    done.push_str("上传的文件");
                    rest = after_token;
                }
            }
        }
        done.push_str(rest);
        out = done;
    }
    out
}

#[derive(askama::Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    /// The navigation of a signed-in caller: an error page is still a page of the appliance.
    nav: Option<&'a crate::pages::Nav>,
    flash: Option<String>,
    status: u16,
    title: &'a str,
    code: &'a str,
    message: &'a str,
    request_id: &'a str,
}

/// The error as the client sees it: JSON for programs, a page for browsers (with the navigation of a signed-in
/// caller, `nav`); both carry the request id.
pub fn render(
    code: ErrorCode,
    message: &str,
    request_id: &str,
    page: bool,
    nav: Option<&crate::pages::Nav>,
) -> HttpResponse {
    let status = status_of(code);
    if page {
        let body = askama::Template::render(&ErrorPage {
            nav,
            flash: None,
            status: status.as_u16(),
            title: code.title_zh(),
            code: code.as_str(),
            message,
            request_id,
        })
        .unwrap_or_else(|_| format!("{} {}", status.as_u16(), code.as_str()));
        HttpResponse::build(status).content_type("text/html; charset=utf-8").body(body)
    } else {
        HttpResponse::build(status).json(ErrorBody {
            code: code.as_str(),
            message: message.to_string(),
            request_id: Some(request_id.to_string()),
        })
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        status_of(self.code())
    }
    fn error_response(&self) -> HttpResponse {
        if self.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        // The guard middleware replaces this body with the JSON or HTML rendering carrying the request id.
        HttpResponse::build(self.status_code()).json(ErrorBody {
            code: self.code().as_str(),
            message: self.public_message(),
            request_id: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_folders_are_taken_out_of_messages() {
        set_staging_roots(vec!["/d/uploads/".into(), "/d/models/.import-".into()]);
        assert_eq!(without_staging("/d/uploads/ab12/x.csv:3: 列数不对"), "x.csv:3: 列数不对");
        assert_eq!(
            without_staging("model package /d/uploads/ab12: bad manifest"),
            "model package 上传的文件: bad manifest"
        );
        assert_eq!(without_staging("/d/models/.import-77-0/model.onnx: 读取失败"), "model.onnx: 读取失败");
        assert_eq!(
            without_staging("模型包 /d/uploads/ab12：/d/uploads/ab12/manifest.toml is not a valid model manifest"),
            "模型包 上传的文件：manifest.toml is not a valid model manifest"
        );
        assert_eq!(without_staging("/elsewhere/x.csv: 保留"), "/elsewhere/x.csv: 保留");
    }

    #[test]
    fn every_code_has_a_status_and_server_classes_are_5xx() {
        for &code in ErrorCode::ALL {
            let s = status_of(code);
            assert_eq!(s.is_server_error(), code.class().is_server_error(), "{code:?} → {s}");
            assert!(s.is_client_error() || s.is_server_error(), "{code:?} → {s}");
        }
    }

    /// Whatever an error says, what a person is shown has Chinese in it: the engine's own texts are Chinese, and a
    /// text passed on from elsewhere (here English on purpose) is led by its code's Chinese title.
    #[test]
    fn every_error_a_person_sees_has_chinese_text() {
        use std::path::PathBuf;
        let p = || PathBuf::from("/srv/x.csv");
        let en = || "something went wrong".to_string();
        let errors = vec![
            Error::UnknownCollection("c".into()),
            Error::CollectionExists("c".into()),
            Error::NotFound { what: "user 'x'".into() },
            Error::InvalidInput(en()),
            Error::UnsupportedFormat { path: p(), ext: "exe".into() },
            Error::NotUtf8 { path: p(), offset: 3 },
            Error::EmptyFile { path: p() },
            Error::Encoding { path: p(), message: en() },
            Error::MalformedFile { path: p(), format: "CSV", message: en() },
            Error::NoText { path: p(), message: en() },
            Error::MalformedRecord { path: p(), line: 2, message: en() },
            Error::TooNew { what: "the index".into(), found: 9, supported: 3 },
            Error::ModelMismatch(en()),
            Error::Locked { what: "the index".into(), detail: en() },
            Error::TooLarge { what: "x.csv".into(), size: 9, limit: 1, hint: en() },
            Error::UnsafeArchive { path: p(), reason: en() },
            Error::Cancelled("job #3".into()),
            Error::LoginFailed(en()),
            Error::Forbidden(en()),
            Error::AccountLocked { user: "x".into(), until: "t".into() },
            Error::CorruptShards { path: p(), message: en() },
            Error::UnknownChunks { path: p(), collection: "c".into(), count: 1, total: 2, first: "k".into() },
            Error::InvalidPackage { path: p(), message: en() },
            Error::ParityFailed { path: p(), worst: 0.5, index: 0, text: "t".into(), min: 0.99 },
            Error::TrainerUnavailable(en()),
            Error::Busy(en()),
            Error::Overloaded(en()),
            Error::RateLimited(en()),
            Error::LimitReached(en()),
            Error::NoSpace { what: "上传".into(), needed: 1, available: 0, reserve: 0 },
            Error::Parser { code: ErrorCode::MalformedRecord, message: en() },
            Error::Internal(en()),
            Error::Model(en()),
        ];
        for e in errors {
            let shown = ApiError::Engine(e).public_message();
            assert!(has_chinese(&shown), "no Chinese in what a person reads: {shown}");
        }
        assert!(!has_chinese("plain English") && has_chinese("资料库 c"));
    }

    /// Each code's docs anchor names a row of the admin guide's error table that exists.
    #[test]
    fn every_code_is_documented_in_the_admin_guide() {
        let errors_md = include_str!("../../../docs/admin/errors.md");
        for &code in ErrorCode::ALL {
            let anchor = code.docs_anchor().trim_start_matches("docs/admin/errors.md#");
            assert!(
                errors_md.contains(&format!("<a id=\"{anchor}\"></a>")),
                "docs/admin/errors.md lacks the row for {}",
                code.as_str()
            );
        }
    }
}
