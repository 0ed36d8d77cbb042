//! The one error table: engine error code → HTTP status and the short Chinese title shown on error pages. The same
//! code, message and request id reach API clients (JSON) and browsers (an HTML page); the guard middleware
//! renders both, because only it knows the request id and whether the route is a page.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use care_engine::{Error, ErrorCode};
use serde::Serialize;

/// Exhaustive on purpose: a new error code does not compile until it has a status here.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::AlreadyExists => StatusCode::CONFLICT,
        ErrorCode::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorCode::UnsupportedFormat => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorCode::BadEncoding => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::EmptyInput => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::MalformedRecord => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::IncompatibleVersion => StatusCode::CONFLICT,
        ErrorCode::ModelMismatch => StatusCode::CONFLICT,
        ErrorCode::Locked => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Storage => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Index => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Model => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Io => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::UnsafeArchive => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::Cancelled => StatusCode::CONFLICT,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::CsrfRejected => StatusCode::FORBIDDEN,
        ErrorCode::AccountLocked => StatusCode::LOCKED,
        ErrorCode::AuditTampered => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::CorruptShards => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::UnknownChunks => StatusCode::CONFLICT,
    }
}

/// The title of the HTML error page for each code. Exhaustive like [`status_of`].
pub fn title_zh(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::NotFound => "未找到",
        ErrorCode::AlreadyExists => "已存在",
        ErrorCode::InvalidInput => "输入有误",
        ErrorCode::UnsupportedFormat => "不支持的文件格式",
        ErrorCode::BadEncoding => "文件编码无法识别",
        ErrorCode::EmptyInput => "文件为空",
        ErrorCode::MalformedRecord => "记录格式错误",
        ErrorCode::IncompatibleVersion => "版本不兼容",
        ErrorCode::ModelMismatch => "模型不匹配",
        ErrorCode::Locked => "资源被占用，请稍后再试",
        ErrorCode::Storage => "存储错误",
        ErrorCode::Index => "索引错误",
        ErrorCode::Model => "模型错误",
        ErrorCode::Io => "读写错误",
        ErrorCode::Internal => "内部错误",
        ErrorCode::TooLarge => "文件过大",
        ErrorCode::UnsafeArchive => "压缩包不安全",
        ErrorCode::Cancelled => "已取消",
        ErrorCode::Unauthenticated => "请先登录",
        ErrorCode::Forbidden => "没有权限",
        ErrorCode::CsrfRejected => "表单已失效，请刷新页面后重试",
        ErrorCode::AccountLocked => "账户已锁定",
        ErrorCode::AuditTampered => "审计日志校验失败",
        ErrorCode::CorruptShards => "向量文件已损坏",
        ErrorCode::UnknownChunks => "向量与当前文档不符",
    }
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl ApiError {
    pub fn internal(e: impl std::fmt::Display) -> Self {
        ApiError(Error::Internal(e.to_string()))
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        ApiError(Error::InvalidInput(msg.into()))
    }
    pub fn forbidden(msg: impl Into<String>) -> Self {
        ApiError(Error::Forbidden(msg.into()))
    }
    /// The message a client may see: internal details (paths, SQL) stay in the server log.
    pub fn public_message(&self) -> String {
        if status_of(self.0.code()).is_server_error() {
            "内部错误；管理员可在服务器日志中按请求编号查到详情 (internal error; see the server log)".to_string()
        } else {
            self.0.to_string()
        }
    }
}

#[derive(askama::Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    title: &'a str,
    code: &'a str,
    message: &'a str,
    request_id: &'a str,
}

/// The error as the client sees it: JSON for programs, a page for browsers; both carry the request id.
pub fn render(code: ErrorCode, message: &str, request_id: &str, page: bool) -> HttpResponse {
    let status = status_of(code);
    if page {
        let body = askama::Template::render(&ErrorPage {
            status: status.as_u16(),
            title: title_zh(code),
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

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        status_of(self.0.code())
    }
    fn error_response(&self) -> HttpResponse {
        if self.status_code().is_server_error() {
            tracing::error!(error = %self.0, "request failed");
        }
        // The guard middleware replaces this body with the JSON or HTML rendering carrying the request id.
        HttpResponse::build(self.status_code()).json(ErrorBody {
            code: self.0.code().as_str(),
            message: self.public_message(),
            request_id: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_status_and_client_errors_are_4xx() {
        for code in ErrorCode::ALL {
            let s = status_of(code);
            let client = matches!(
                code,
                ErrorCode::NotFound
                    | ErrorCode::AlreadyExists
                    | ErrorCode::InvalidInput
                    | ErrorCode::UnsupportedFormat
                    | ErrorCode::BadEncoding
                    | ErrorCode::EmptyInput
                    | ErrorCode::MalformedRecord
                    | ErrorCode::IncompatibleVersion
                    | ErrorCode::ModelMismatch
                    | ErrorCode::TooLarge
                    | ErrorCode::UnsafeArchive
                    | ErrorCode::Cancelled
                    | ErrorCode::Unauthenticated
                    | ErrorCode::Forbidden
                    | ErrorCode::CsrfRejected
                    | ErrorCode::AccountLocked
                    | ErrorCode::CorruptShards
                    | ErrorCode::UnknownChunks
            );
            assert_eq!(s.is_client_error(), client, "{code:?} → {s}");
        }
    }
}
