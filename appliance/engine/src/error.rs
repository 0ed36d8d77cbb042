//! The engine's one error type and its stable error codes.
//!
//! Every failure a user can see carries an [`ErrorCode`], declared once in the `error_codes!` table with its
//! status class, Chinese title and documentation anchor; the HTTP layer maps classes to statuses in one exhaustive
//! `match`. Failures only HTTP can have (no session, a bad CSRF token) are the server's own errors, with codes
//! from the same table. Messages say what went wrong, where, and how to
//! fix it, because the reader is usually a hospital admin, not a developer.

use std::path::PathBuf;

use serde::Serialize;

/// The HTTP status class of a code. The server turns a class into a status in one exhaustive `match`; the engine
/// only decides which class a failure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusClass {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    TooLarge,
    UnsupportedMedia,
    Unprocessable,
    Locked,
    /// Too many requests of one kind from one client or user in a window (HTTP 429).
    TooManyRequests,
    Unavailable,
    Internal,
}

impl StatusClass {
    /// A failure of the appliance rather than of the request (details stay in the server log).
    pub fn is_server_error(self) -> bool {
        matches!(self, StatusClass::Unavailable | StatusClass::Internal)
    }
}

/// Declares the one table of error codes: variant, stable code, status class, the Chinese title error pages show.
/// Each code's documentation is the row of `docs/admin/errors.md` anchored at `error-<code>`.
macro_rules! error_codes {
    ($($variant:ident = $code:literal, $class:ident, $title:literal;)*) => {
        /// Stable error codes: the `code` field of every JSON error and the key of docs/admin/errors.md.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $($variant,)*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }
            pub fn class(self) -> StatusClass {
                match self {
                    $(ErrorCode::$variant => StatusClass::$class,)*
                }
            }
            /// The short title of the error page, for clinicians and admins.
            pub fn title_zh(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $title,)*
                }
            }
            /// Where the code is explained: its row of the admin guide's error table.
            pub fn docs_anchor(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => concat!("docs/admin/errors.md#error-", $code),)*
                }
            }
        }
    };
}

error_codes! {
    NotFound = "not_found", NotFound, "未找到";
    AlreadyExists = "already_exists", Conflict, "已存在";
    InvalidInput = "invalid_input", BadRequest, "输入有误";
    UnsupportedFormat = "unsupported_format", UnsupportedMedia, "不支持的文件格式";
    BadEncoding = "bad_encoding", Unprocessable, "文件编码无法识别";
    EmptyInput = "empty_input", Unprocessable, "文件为空";
    MalformedRecord = "malformed_record", Unprocessable, "记录格式错误";
    IncompatibleVersion = "incompatible_version", Conflict, "版本不兼容";
    ModelMismatch = "model_mismatch", Conflict, "模型不匹配";
    Locked = "locked", Unavailable, "资源被占用，请稍后再试";
    Storage = "storage", Internal, "存储错误";
    Index = "index", Internal, "索引错误";
    Model = "model", Internal, "模型错误";
    Io = "io", Internal, "读写错误";
    Internal = "internal", Internal, "内部错误";
    TooLarge = "too_large", TooLarge, "文件过大";
    UnsafeArchive = "unsafe_archive", Unprocessable, "压缩包或文件结构不安全";
    Cancelled = "cancelled", Conflict, "已取消";
    Unauthenticated = "unauthenticated", Unauthorized, "请先登录";
    Forbidden = "forbidden", Forbidden, "没有权限";
    CsrfRejected = "csrf_rejected", Forbidden, "表单已失效，请刷新页面后重试";
    AccountLocked = "account_locked", Locked, "账户已锁定";
    AuditTampered = "audit_tampered", Internal, "审计日志校验失败";
    CorruptShards = "corrupt_shards", Unprocessable, "向量文件已损坏";
    UnknownChunks = "unknown_chunks", Conflict, "向量与当前文档不符";
    InvalidPackage = "invalid_package", Unprocessable, "模型包无效";
    ParityFailed = "parity_failed", Unprocessable, "模型输出与训练端不一致";
    TrainerUnavailable = "trainer_unavailable", Unavailable, "训练程序不可用";
    Busy = "busy", Conflict, "已有同类任务在运行";
    DiskFull = "disk_full", Unavailable, "磁盘空间不足";
    Overloaded = "overloaded", Unavailable, "服务繁忙，请稍后再试";
    RateLimited = "rate_limited", TooManyRequests, "操作过于频繁，请稍后再试";
    LimitReached = "limit_reached", Conflict, "已达数量上限";
    DirectoryUnavailable = "directory_unavailable", Unavailable, "统一认证服务暂不可用";
    ReadOnly = "read_only", Conflict, "备用机只读";
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "资料库 {0} 不存在；请先在“资料库”页面新建，或运行 `care collection create {0}`（`care ingest` 可加 `--create`）"
    )]
    UnknownCollection(String),
    #[error("资料库 {0} 已存在")]
    CollectionExists(String),
    #[error("未找到：{what}")]
    NotFound { what: String },
    #[error("{0}")]
    InvalidInput(String),
    #[error(
        "{path}：不支持 .{ext} 文件；可上传 .pdf、.docx、.html、.htm、.md、.txt、.csv、.tsv、.jsonl、.zip，以及扫描图像 .jpg、.png、.bmp、.tif"
    )]
    UnsupportedFormat { path: PathBuf, ext: String },
    #[error(
        "{path}：不是有效的 UTF-8 文本（第一个错误字节在偏移 {offset}）；请转成 UTF-8，例如 `iconv -f GB18030 -t UTF-8 原文件 > 新文件`，或上传时指定编码"
    )]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("{path}：文件为空，没有可入库的内容")]
    EmptyFile { path: PathBuf },
    /// Text in an encoding that could not be detected or that does not decode cleanly.
    #[error("{path}：{message}")]
    Encoding { path: PathBuf, message: String },
    /// A file whose container or syntax is broken (truncated PDF, DOCX that is not a zip, CSV without the column).
    #[error("{path}：不是有效的 {format} 文件：{message}")]
    MalformedFile { path: PathBuf, format: &'static str, message: String },
    /// A well-formed file with no extractable text (e.g. a scanned PDF without a text layer).
    #[error("{path}: {message}")]
    NoText { path: PathBuf, message: String },
    #[error("{path} 第 {line} 行：{message}")]
    MalformedRecord { path: PathBuf, line: usize, message: String },
    #[error("{what} 的格式版本为 {found}，比本程序支持的 {supported} 新；请升级本系统")]
    TooNew { what: String, found: u32, supported: u32 },
    #[error("{0}")]
    ModelMismatch(String),
    #[error("{0}")]
    Model(String),
    #[error("{what} 正被另一个 care 进程占用（{detail}）；请等它结束或先停止它")]
    Locked { what: String, detail: String },
    #[error("元数据库出错 (metadata store: {0})")]
    Sqlite(rusqlite::Error),
    #[error("检索索引出错 (lexical index: {0})")]
    Tantivy(tantivy::TantivyError),
    #[error("{}", io_message(path, source))]
    Io { path: PathBuf, source: std::io::Error },
    #[error("内部错误 (internal error: {0})")]
    Internal(String),
    #[error("{what} 有 {size} 字节，超过上限 {limit} 字节；{hint}")]
    TooLarge { what: String, size: u64, limit: u64, hint: String },
    #[error("{path}：{}，已拒绝：{reason}", unsafe_kind(path))]
    UnsafeArchive { path: PathBuf, reason: String },
    #[error("{0} 已取消")]
    Cancelled(String),
    /// A sign-in that failed (unknown name or wrong password; which one is not said).
    #[error("{0}")]
    LoginFailed(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("账户 {user} 因多次登录失败已锁定，至 {until} 解除；如需提前解锁请联系管理员")]
    AccountLocked { user: String, until: String },
    #[error("审计日志第 {id} 条校验失败：{reason}")]
    AuditTampered { id: i64, reason: String },
    /// Embedding shards that fail verification (checksum, sizes, file names): damaged or incompletely copied.
    #[error("{path}：{message}；请重新拷贝向量文件夹，或重新运行 `care-train embed-corpus`")]
    CorruptShards { path: PathBuf, message: String },
    /// Embedding shards naming chunks the collection does not have (any more): exported before a change.
    #[error(
        "{path}：{total} 个向量中有 {count} 个不对应资料库 {collection} 现有的片段（第一个：{first}），导出片段后资料库已有变动。\
         请重新导出（`care collection export-chunks {collection} --out chunks.jsonl`），用 `care-train embed-corpus` 重新计算向量，\
         再导入新的文件夹"
    )]
    UnknownChunks { path: PathBuf, collection: String, count: usize, total: usize, first: String },
    /// A model package that cannot be registered as it is: damaged, incomplete or self-contradictory.
    #[error("模型包 {path}：{message}")]
    InvalidPackage { path: PathBuf, message: String },
    /// A package whose ONNX graph, run by this appliance, does not reproduce the vectors its trainer recorded.
    #[error(
        "模型包 {path}：本机 ONNX Runtime 算出的向量与训练端记录的只相似到余弦 {worst:.6}（第 {index} 条文本 {text:?}；\
         至少需要 {min}），导出的模型或分词器与训练所得权重不符；请用 `care-train export` 重新导出"
    )]
    ParityFailed { path: PathBuf, worst: f64, index: usize, text: String, min: f64 },
    /// `care-train` cannot start here (not installed, libtorch missing or of another version); says how to fix it.
    #[error("{0}")]
    TrainerUnavailable(String),
    /// A run that must not overlap another (training) while one is queued or running.
    #[error("{0}")]
    Busy(String),
    /// More work of one kind at once than the appliance admits (sign-ins waiting for password hashing).
    #[error("{0}")]
    Overloaded(String),
    /// One client or user did one kind of thing too often in a window (failed sign-ins from an address, feedback).
    #[error("{0}")]
    RateLimited(String),
    /// Something that accumulates (schedules, queued jobs) is at its configured cap (`[limits]`).
    #[error("{0}")]
    LimitReached(String),
    /// A write asked of a standby appliance, which only serves search ([`crate::backup::standby`]).
    #[error("{0}")]
    ReadOnly(String),
    /// The hospital's directory (LDAP) or sign-on platform (OIDC) could not be reached or refused the service
    /// account; the message is for people, the cause is in the log.
    #[error("{0}")]
    Directory(String),
    /// Too little free space for a training run (said before it starts, not half-way through).
    #[error(
        "{} (disk full: {available} bytes free under {path}, {needed} needed)",
        disk_short_message(*available, *needed, *reserve)
    )]
    DiskFull { path: PathBuf, needed: u64, available: u64, reserve: u64 },
    /// Too little free space for what an upload or a model import would write, said before it is accepted: the
    /// space kept free (`[training] keep_free_gb`) is for search, sign-in and SQLite.
    #[error("{}", no_space_message(what, *needed, *available, *reserve))]
    NoSpace { what: String, needed: u64, available: u64, reserve: u64 },
    /// A store (SQLite, the lexical or the dense index) failed a write because the disk is full (ENOSPC,
    /// SQLITE_FULL): said as such, not as a storage fault.
    #[error("磁盘空间不足：写入{store}时磁盘已满；请清理数据目录所在的磁盘后重试 ({detail})")]
    StoreFull { store: &'static str, detail: String },
    /// The CUDA provider cannot be created (`model.device = "cuda"`): names the missing library and the install.
    #[error("GPU 不可用（model.device = \"cuda\"）：{0}")]
    CudaUnavailable(crate::gpu::CudaUnavailable),
    /// A file's failure as the isolated parser process reported it (its code and message, already for people).
    #[error("{message}")]
    Parser { code: ErrorCode, message: String },
}

/// What an unsafe file is called: the refusal is shared by archives and by the formats that compress inside
/// (a PDF's streams, a Word file's parts), and a PDF is no "压缩包" to the admin who uploaded it.
fn unsafe_kind(path: &std::path::Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "pdf" => "PDF 文件结构不安全（如解压后过大或嵌套过深）",
        "docx" => "Word 文件结构不安全（如解压后过大）",
        _ => "压缩包不安全",
    }
}

/// A size as people read it: GB with one decimal from 1 GiB up, else MB or KB (a reserve of 0 or a 300 MB upload
/// once read "0.0 GB").
pub(crate) fn gib(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{} MB", b.div_ceil(1 << 20)),
        0 => "0".into(),
        b => format!("{} KB", b.div_ceil(1 << 10)),
    }
}

/// What the 训练 page, `care train status` and a refused run say when the disk cannot hold a run.
pub(crate) fn disk_short_message(available: u64, needed: u64, reserve: u64) -> String {
    format!(
        "磁盘空间不足：剩余 {}，一次训练约需 {}（含保留的 {}）；请先清理数据目录所在磁盘（如不再需要的候选模型），\
         或调低 care.toml 的 [training] keep_free_gb",
        gib(available),
        gib(needed),
        gib(reserve)
    )
}

/// What a refused upload or import says: what it needed, what is free, what is kept free.
fn no_space_message(what: &str, needed: u64, available: u64, reserve: u64) -> String {
    let need = if needed >= 1 << 20 { format!("{what}约需 {}，", gib(needed)) } else { format!("{what}：") };
    format!(
        "磁盘空间不足：{need}数据盘剩余 {}，须保留 {}（care.toml 的 [training] keep_free_gb）；请先清理数据目录所在的磁盘后重试",
        gib(available),
        gib(reserve)
    )
}

/// ENOSPC gets words an admin acts on; any other I/O error keeps the system's.
fn io_message(path: &std::path::Path, source: &std::io::Error) -> String {
    if is_disk_full(source) {
        format!("磁盘空间不足：写入 {} 时磁盘已满；请清理它所在的磁盘后重试 ({source})", path.display())
    } else {
        format!("读写 {} 时出错：{source}", path.display())
    }
}

fn is_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28)
}

/// Whether an error a library reports only as text came from ENOSPC: tantivy and LanceDB wrap the I/O error in
/// their own types (several layers, some only as a message), and the system's text for errno 28 is stable.
pub(crate) fn says_disk_full(text: &str) -> bool {
    text.contains("os error 28") || text.contains("No space left on device") || text.contains("StorageFull")
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        if let rusqlite::Error::SqliteFailure(f, _) = &e
            && f.code == rusqlite::ErrorCode::DiskFull
        {
            return Error::StoreFull { store: "元数据库 (care.sqlite)", detail: e.to_string() };
        }
        Error::Sqlite(e)
    }
}

impl From<tantivy::TantivyError> for Error {
    fn from(e: tantivy::TantivyError) -> Self {
        if let tantivy::TantivyError::LockFailure(lock, detail) = e {
            Error::Locked { what: "the lexical index".into(), detail: detail.unwrap_or_else(|| format!("{lock:?}")) }
        } else if says_disk_full(&format!("{e} {e:?}")) {
            Error::StoreFull { store: "检索索引", detail: e.to_string() }
        } else {
            Error::Tantivy(e)
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
            Error::Io { source, .. } if is_disk_full(source) => ErrorCode::DiskFull,
            Error::Io { .. } => ErrorCode::Io,
            Error::Internal(_) => ErrorCode::Internal,
            Error::TooLarge { .. } => ErrorCode::TooLarge,
            Error::UnsafeArchive { .. } => ErrorCode::UnsafeArchive,
            Error::Cancelled(_) => ErrorCode::Cancelled,
            Error::LoginFailed(_) => ErrorCode::Unauthenticated,
            Error::Forbidden(_) => ErrorCode::Forbidden,
            Error::AccountLocked { .. } => ErrorCode::AccountLocked,
            Error::AuditTampered { .. } => ErrorCode::AuditTampered,
            Error::CorruptShards { .. } => ErrorCode::CorruptShards,
            Error::UnknownChunks { .. } => ErrorCode::UnknownChunks,
            Error::InvalidPackage { .. } => ErrorCode::InvalidPackage,
            Error::ParityFailed { .. } => ErrorCode::ParityFailed,
            Error::TrainerUnavailable(_) => ErrorCode::TrainerUnavailable,
            Error::Busy(_) => ErrorCode::Busy,
            Error::Overloaded(_) => ErrorCode::Overloaded,
            Error::RateLimited(_) => ErrorCode::RateLimited,
            Error::LimitReached(_) => ErrorCode::LimitReached,
            Error::ReadOnly(_) => ErrorCode::ReadOnly,
            Error::Directory(_) => ErrorCode::DirectoryUnavailable,
            Error::DiskFull { .. } | Error::NoSpace { .. } | Error::StoreFull { .. } => ErrorCode::DiskFull,
            Error::CudaUnavailable(_) => ErrorCode::Model,
            Error::Parser { code, .. } => *code,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod size_and_kind_tests {
    use super::*;

    #[test]
    fn sizes_read_in_their_unit_and_unsafe_files_by_their_kind() {
        assert_eq!(gib(3 << 30), "3.0 GB");
        assert_eq!(gib(300 << 20), "300 MB");
        assert_eq!(gib(1), "1 KB");
        assert_eq!(gib(0), "0");
        let e = |p: &str| Error::UnsafeArchive { path: p.into(), reason: "r".into() }.to_string();
        assert!(e("a.pdf").contains("PDF 文件结构不安全") && !e("a.pdf").contains("压缩包"), "{}", e("a.pdf"));
        assert!(e("b.DOCX").contains("Word 文件"), "{}", e("b.DOCX"));
        assert!(e("c.zip").contains("压缩包不安全"), "{}", e("c.zip"));
    }
}
