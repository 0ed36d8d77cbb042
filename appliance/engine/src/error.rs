//! The engine's one error type and its stable error codes.
//!
//! Every failure a user can see carries an [`ErrorCode`]; the HTTP layer maps codes to statuses in one
//! exhaustive `match`, so adding a code forces a decision there. Messages say what went wrong, where, and how to
//! fix it, because the reader is usually a hospital admin, not a developer.

use std::path::PathBuf;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    NotFound,
    AlreadyExists,
    InvalidInput,
    UnsupportedFormat,
    BadEncoding,
    EmptyInput,
    MalformedRecord,
    IncompatibleVersion,
    ModelMismatch,
    Locked,
    Storage,
    Index,
    Model,
    Io,
    Internal,
    TooLarge,
    UnsafeArchive,
    Cancelled,
    Unauthenticated,
    Forbidden,
    CsrfRejected,
    AccountLocked,
    AuditTampered,
    CorruptShards,
    UnknownChunks,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 25] = [
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::InvalidInput,
        ErrorCode::UnsupportedFormat,
        ErrorCode::BadEncoding,
        ErrorCode::EmptyInput,
        ErrorCode::MalformedRecord,
        ErrorCode::IncompatibleVersion,
        ErrorCode::ModelMismatch,
        ErrorCode::Locked,
        ErrorCode::Storage,
        ErrorCode::Index,
        ErrorCode::Model,
        ErrorCode::Io,
        ErrorCode::Internal,
        ErrorCode::TooLarge,
        ErrorCode::UnsafeArchive,
        ErrorCode::Cancelled,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::CsrfRejected,
        ErrorCode::AccountLocked,
        ErrorCode::AuditTampered,
        ErrorCode::CorruptShards,
        ErrorCode::UnknownChunks,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::UnsupportedFormat => "unsupported_format",
            ErrorCode::BadEncoding => "bad_encoding",
            ErrorCode::EmptyInput => "empty_input",
            ErrorCode::MalformedRecord => "malformed_record",
            ErrorCode::IncompatibleVersion => "incompatible_version",
            ErrorCode::ModelMismatch => "model_mismatch",
            ErrorCode::Locked => "locked",
            ErrorCode::Storage => "storage",
            ErrorCode::Index => "index",
            ErrorCode::Model => "model",
            ErrorCode::Io => "io",
            ErrorCode::Internal => "internal",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::UnsafeArchive => "unsafe_archive",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::CsrfRejected => "csrf_rejected",
            ErrorCode::AccountLocked => "account_locked",
            ErrorCode::AuditTampered => "audit_tampered",
            ErrorCode::CorruptShards => "corrupt_shards",
            ErrorCode::UnknownChunks => "unknown_chunks",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("collection '{0}' does not exist; create it with `care collection create {0}` or pass --create")]
    UnknownCollection(String),
    #[error("collection '{0}' already exists")]
    CollectionExists(String),
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("{0}")]
    InvalidInput(String),
    #[error(
        "{path}: unsupported file type '{ext}'; supported: .pdf, .docx, .html, .htm, .md, .txt, .csv, .tsv, .jsonl, .zip"
    )]
    UnsupportedFormat { path: PathBuf, ext: String },
    #[error(
        "{path}: not valid UTF-8 (first bad byte at offset {offset}); convert it to UTF-8, e.g. `iconv -f GB18030 -t UTF-8 in > out`"
    )]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("{path}: the file is empty; nothing to ingest")]
    EmptyFile { path: PathBuf },
    /// Text in an encoding that could not be detected or that does not decode cleanly.
    #[error("{path}: {message}")]
    Encoding { path: PathBuf, message: String },
    /// A file whose container or syntax is broken (truncated PDF, DOCX that is not a zip, CSV without the column).
    #[error("{path}: not a valid {format} file: {message}")]
    MalformedFile { path: PathBuf, format: &'static str, message: String },
    /// A well-formed file with no extractable text (e.g. a scanned PDF without a text layer).
    #[error("{path}: {message}")]
    NoText { path: PathBuf, message: String },
    #[error("{path}:{line}: {message}")]
    MalformedRecord { path: PathBuf, line: usize, message: String },
    #[error("{what} has format version {found}, newer than this build supports ({supported}); upgrade the appliance")]
    TooNew { what: String, found: u32, supported: u32 },
    #[error("{0}")]
    ModelMismatch(String),
    #[error("{0}")]
    Model(String),
    #[error("{what} is locked by another care process ({detail}); stop it or wait for it to finish")]
    Locked { what: String, detail: String },
    #[error("metadata store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("lexical index: {0}")]
    Tantivy(tantivy::TantivyError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("internal error: {0}")]
    Internal(String),
    #[error("{what} is {size} bytes, over the limit of {limit} bytes; {hint}")]
    TooLarge { what: String, size: u64, limit: u64, hint: String },
    #[error("{path}: unsafe archive: {reason}")]
    UnsafeArchive { path: PathBuf, reason: String },
    #[error("{0} was cancelled")]
    Cancelled(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("the form's CSRF token is missing or invalid; reload the page and submit again")]
    CsrfRejected,
    #[error("account '{user}' is locked after repeated failed logins until {until}; ask an administrator to unlock it")]
    AccountLocked { user: String, until: String },
    #[error("audit log record {id}: {reason}")]
    AuditTampered { id: i64, reason: String },
    /// Embedding shards that fail verification (checksum, sizes, file names): damaged or incompletely copied.
    #[error("{path}: {message}; copy the embeddings folder again or re-run `care-train embed-corpus`")]
    CorruptShards { path: PathBuf, message: String },
    /// Embedding shards naming chunks the collection does not have (any more): exported before a change.
    #[error(
        "{path}: {count} of {total} vector ids are not live chunks of collection '{collection}' (first: {first}); the \
         collection changed since its chunks were exported. Re-export with `care collection export-chunks {collection} \
         --out chunks.jsonl`, embed them again with `care-train embed-corpus`, and import the new folder"
    )]
    UnknownChunks { path: PathBuf, collection: String, count: usize, total: usize, first: String },
}

impl From<tantivy::TantivyError> for Error {
    fn from(e: tantivy::TantivyError) -> Self {
        match e {
            tantivy::TantivyError::LockFailure(lock, detail) => Error::Locked {
                what: "the lexical index".into(),
                detail: detail.unwrap_or_else(|| format!("{lock:?}")),
            },
            other => Error::Tantivy(other),
        }
    }
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Error::UnknownCollection(_) | Error::NotFound { .. } => ErrorCode::NotFound,
            Error::CollectionExists(_) => ErrorCode::AlreadyExists,
            Error::InvalidInput(_) => ErrorCode::InvalidInput,
            Error::UnsupportedFormat { .. } => ErrorCode::UnsupportedFormat,
            Error::NotUtf8 { .. } => ErrorCode::BadEncoding,
            Error::EmptyFile { .. } | Error::NoText { .. } => ErrorCode::EmptyInput,
            Error::Encoding { .. } => ErrorCode::BadEncoding,
            Error::MalformedFile { .. } => ErrorCode::MalformedRecord,
            Error::MalformedRecord { .. } => ErrorCode::MalformedRecord,
            Error::TooNew { .. } => ErrorCode::IncompatibleVersion,
            Error::ModelMismatch(_) => ErrorCode::ModelMismatch,
            Error::Model(_) => ErrorCode::Model,
            Error::Locked { .. } => ErrorCode::Locked,
            Error::Sqlite(_) => ErrorCode::Storage,
            Error::Tantivy(_) => ErrorCode::Index,
            Error::Io { .. } => ErrorCode::Io,
            Error::Internal(_) => ErrorCode::Internal,
            Error::TooLarge { .. } => ErrorCode::TooLarge,
            Error::UnsafeArchive { .. } => ErrorCode::UnsafeArchive,
            Error::Cancelled(_) => ErrorCode::Cancelled,
            Error::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Error::Forbidden(_) => ErrorCode::Forbidden,
            Error::CsrfRejected => ErrorCode::CsrfRejected,
            Error::AccountLocked { .. } => ErrorCode::AccountLocked,
            Error::AuditTampered { .. } => ErrorCode::AuditTampered,
            Error::CorruptShards { .. } => ErrorCode::CorruptShards,
            Error::UnknownChunks { .. } => ErrorCode::UnknownChunks,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
