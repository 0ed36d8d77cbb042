//! The one table from engine error codes to HTTP statuses, and the error bodies.

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
    }
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: &'static str,
    pub message: String,
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
        let status = self.status_code();
        // Internal details (paths, SQL) stay in the server log; the client gets the code and a safe message.
        let message = if status.is_server_error() {
            tracing::error!(error = %self.0, "request failed");
            "internal error; the administrator can find details in the server log".to_string()
        } else {
            self.0.to_string()
        };
        HttpResponse::build(status).json(ErrorBody { code: self.0.code().as_str(), message })
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
            );
            assert_eq!(s.is_client_error(), client, "{code:?} → {s}");
        }
    }
}
