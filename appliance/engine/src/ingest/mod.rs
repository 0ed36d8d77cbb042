//! Reading files into documents: PDF (text layer), DOCX, HTML, Markdown, TXT, CSV/TSV, JSONL, and ZIP archives of
//! these.
//!
//! A file is read and validated completely before anything is written: a malformed file is rejected whole with an
//! error naming the file (and line), so it can never leave half of itself in a collection. Size is checked from
//! metadata before a byte is read; archives are checked for path traversal, entry counts and expansion (zip bombs)
//! before any member is parsed. Third-party parsers run under `catch_unwind`, so a parser bug on a hostile file is
//! reported as a malformed file instead of taking the worker down.
//!
//! Every format ends as normalised text (see [`crate::text::normalize`]) in which headings are Markdown `#` lines,
//! so the chunker sees one structure whatever the source was.

mod archive;
mod csv;
mod docx;
pub mod encoding;
pub mod fixtures;
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct IngestConfig {
    pub chunk: crate::text::ChunkConfig,
    /// Documents written per SQLite transaction and tantivy commit.
    pub batch_documents: usize,
    /// Size, archive and expansion limits applied to every uploaded file.
    pub limits: IngestLimits,
    /// Files of ingestion jobs processed at once by the background worker (parsing runs in parallel; writes to
    /// the stores are serialised).
    pub workers: usize,
    /// Where uploaded files are parsed: in a sandboxed child process, under these limits.
    pub isolation: IsolationConfig,
    /// Scanned pages and images, read by the OCR.
    pub ocr: scan::OcrConfig,
}

/// The parser process (`[ingest.isolation]`). `care serve` and the CLI parse every uploaded file in a child
/// (`care ingest-worker`) with an address-space, CPU-time and file-size limit, no network and no file access
/// beyond the one file, so a hostile file that exhausts memory or loops costs one failed file, not the server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct IsolationConfig {
    /// Parse in a child process (off only for debugging a parser).
    pub enabled: bool,
    /// The child's address-space limit, in MiB.
    pub memory_mb: u64,
    /// The child's CPU-time limit, in seconds.
    pub cpu_seconds: u64,
    /// Wall-clock limit, in seconds (a child that sleeps or blocks is stopped too).
    pub wall_seconds: u64,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig { enabled: true, memory_mb: 2048, cpu_seconds: 300, wall_seconds: 600 }
    }
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            chunk: crate::text::ChunkConfig::default(),
            batch_documents: 2000,
            limits: IngestLimits::default(),
            workers: 2,
            isolation: IsolationConfig::default(),
            ocr: scan::OcrConfig::default(),
        }
    }
}

#[cfg(test)]
mod fuzz;
mod html;
pub mod meta;
mod pdf;
pub mod scan;
pub mod worker;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::text::normalize;

/// A document ready to be chunked and stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParsedDocument {
    /// Identity inside the collection: the JSONL/CSV `id`, or the file name (for an archive member, its path
    /// inside the archive after the archive's name). Re-ingesting the same id replaces it.
    pub external_id: String,
    pub title: String,
    /// Normalised text (see [`crate::text::normalize`]).
    pub text: String,
    pub source: String,
    /// Department, type and date ([`meta`]); empty when neither the file nor the upload says.
    #[serde(default)]
    pub meta: meta::DocMeta,
    /// The lines read from scanned pages by the OCR, with their places in `text` (empty for typed text).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scan: Vec<scan::ScanLine>,
}

impl ParsedDocument {
    pub fn content_hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.title.as_bytes());
        h.update([0u8]);
        h.update(self.text.as_bytes());
        h.update(self.meta.hash_bytes());
        hex::encode(h.finalize())
    }
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParsedFile {
    pub documents: Vec<ParsedDocument>,
    /// Records that held no text after normalisation (kept out of the index, reported to the user).
    pub skipped_empty: usize,
}

/// Per-upload options (the admin page's upload form, `care ingest` flags).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IngestOptions {
    /// Text encoding of every text-like file in the upload (`gb18030`, `gbk`, `big5`, `utf-16le`, …); `None`
    /// detects it per file.
    pub encoding: Option<String>,
    /// CSV/TSV: the column holding the text (default: the first of text, content, body, 正文, 内容, answer, 答案,
    /// question, 问题).
    pub csv_text_column: Option<String>,
    /// CSV/TSV: the column holding the title (default: title or 标题 when present, else none).
    pub csv_title_column: Option<String>,
    /// CSV/TSV: the column holding a stable id (default: id or _id when present, else `<file>:<line>`).
    pub csv_id_column: Option<String>,
    /// Department, type and date for every document of the upload that does not say its own (the upload form).
    pub meta: meta::DocMeta,
    /// The external id of the document this upload's one file replaces (the console's 更新内容 on a document):
    /// the file must hold exactly one document, which takes this id, so a new version under another file name
    /// replaces the old one instead of standing beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// Bounds on what one upload may make the appliance read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IngestLimits {
    /// Largest file accepted, in bytes (checked from metadata before reading).
    pub max_file_bytes: u64,
    /// Most members one archive (including nested archives) may have.
    pub max_archive_entries: usize,
    /// Most bytes one archive may expand to in total.
    pub max_expanded_bytes: u64,
    /// Largest uncompressed:compressed ratio of an archive member (larger is treated as a zip bomb).
    pub max_expansion_ratio: u64,
    /// How deep archives may nest inside archives.
    pub max_archive_depth: usize,
    /// Most text a file (or archive member) may yield per byte of itself, beyond the first MiB: a small PDF whose
    /// pages repeat one huge content stream is refused instead of filling the index.
    pub max_text_ratio: u64,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_file_bytes: 1 << 30,
            max_archive_entries: 10_000,
            max_expanded_bytes: 2 << 30,
            max_expansion_ratio: 100,
            max_archive_depth: 3,
            max_text_ratio: 64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Text,
    Markdown,
    Jsonl,
    Csv,
    Tsv,
    Html,
    Docx,
    Pdf,
    /// A scan or photograph (JPEG, PNG, BMP, TIFF), read by the OCR.
    Image,
    Zip,
}

impl FileKind {
    pub fn of(path: &Path) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match ext.as_str() {
            "txt" | "text" => Ok(FileKind::Text),
            "md" | "markdown" => Ok(FileKind::Markdown),
            "jsonl" | "ndjson" => Ok(FileKind::Jsonl),
            "csv" => Ok(FileKind::Csv),
            "tsv" => Ok(FileKind::Tsv),
            "html" | "htm" | "xhtml" => Ok(FileKind::Html),
            "docx" => Ok(FileKind::Docx),
            "pdf" => Ok(FileKind::Pdf),
            "jpg" | "jpeg" | "png" | "bmp" | "tif" | "tiff" => Ok(FileKind::Image),
            "zip" => Ok(FileKind::Zip),
            _ => Err(Error::UnsupportedFormat { path: path.to_path_buf(), ext }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileKind::Text => "text",
            FileKind::Markdown => "Markdown",
            FileKind::Jsonl => "JSONL",
            FileKind::Csv => "CSV",
            FileKind::Tsv => "TSV",
            FileKind::Html => "HTML",
            FileKind::Docx => "DOCX",
            FileKind::Pdf => "PDF",
            FileKind::Image => "图像",
            FileKind::Zip => "ZIP",
        }
    }
}

/// One unit of an upload: a plain file, or a member of an archive, with what came of parsing it.
#[derive(Debug)]
pub struct Unit {
    /// How the unit is named in reports: the file's path, or `archive.zip/folder/member.pdf`.
    pub name: String,
    pub result: Result<ParsedFile>,
}

/// Where a byte buffer came from: `path` names it in messages and `source`, `ident` is the identity base for
/// documents made from it (the file name for a plain file, `archive.zip/dir/member` for an archive member).
#[derive(Debug, Clone)]
pub struct Origin {
    pub path: PathBuf,
    pub ident: String,
}

impl Origin {
    pub fn of_file(path: &Path) -> Self {
        Origin {
            path: path.to_path_buf(),
            ident: path.file_name().and_then(|n| n.to_str()).unwrap_or("document").to_string(),
        }
    }
    fn stem(&self) -> String {
        Path::new(&self.ident).file_stem().and_then(|n| n.to_str()).unwrap_or("document").to_string()
    }
}

/// Reads one uploaded file into units: one for a plain file, one per member for an archive. An `Err` rejects the
/// whole file (too large, unreadable, an unsafe archive); a unit's own `Err` rejects only that unit.
pub fn read_units(path: &Path, opts: &IngestOptions, limits: &IngestLimits) -> Result<Vec<Unit>> {
    let (kind, bytes) = read_checked(path, limits)?;
    units_of_bytes(path, kind, &bytes, opts, limits)
}

/// Reads an uploaded file after checking its kind, that it is a regular file, and its size (from metadata,
/// before a byte is read).
pub(crate) fn read_checked(path: &Path, limits: &IngestLimits) -> Result<(FileKind, Vec<u8>)> {
    let kind = FileKind::of(path)?;
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::InvalidInput(format!("{}：不是普通文件（目录、设备或管道不能入库）", path.display())));
    }
    if meta.len() > limits.max_file_bytes {
        return Err(Error::TooLarge {
            what: path.display().to_string(),
            size: meta.len(),
            limit: limits.max_file_bytes,
            hint: "split it into smaller files, or raise ingest.limits.max_file_bytes".into(),
        });
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok((kind, bytes))
}

/// [`read_units`] once the file is read: the parsing half, which the isolated parser runs with no file access.
pub(crate) fn units_of_bytes(
    path: &Path,
    kind: FileKind,
    bytes: &[u8],
    opts: &IngestOptions,
    limits: &IngestLimits,
) -> Result<Vec<Unit>> {
    let origin = Origin::of_file(path);
    if kind == FileKind::Zip {
        return archive::expand(&origin, bytes, opts, limits);
    }
    Ok(vec![Unit { name: path.display().to_string(), result: parse_origin(&origin, kind, bytes, opts, limits) }])
}

/// Reads and parses one non-archive file with default options (archives: use [`read_units`]).
pub fn parse_file(path: &Path) -> Result<ParsedFile> {
    let mut units = read_units(path, &IngestOptions::default(), &IngestLimits::default())?;
    match units.len() {
        1 => units.remove(0).result,
        _ => Err(Error::InvalidInput(format!(
            "{}：压缩包含多个文件，须逐个读取 (an archive holds several files)",
            path.display()
        ))),
    }
}

/// Parses bytes of a known kind with default options; documents are named after `path`'s file name.
pub fn parse_bytes(path: &Path, kind: FileKind, bytes: &[u8]) -> Result<ParsedFile> {
    parse_origin(&Origin::of_file(path), kind, bytes, &IngestOptions::default(), &IngestLimits::default())
}

// Set by the fuzz targets: parsers then run without `catch_unwind`, so a panic is seen instead of reported.
#[cfg(test)]
thread_local! {
    static UNGUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Parses bytes of a known kind. A panic inside a parser becomes a malformed-file error.
pub fn parse_origin(
    origin: &Origin,
    kind: FileKind,
    bytes: &[u8],
    opts: &IngestOptions,
    limits: &IngestLimits,
) -> Result<ParsedFile> {
    // What the record does not say of its department, type or date, the upload (and an archive's folders) may.
    let fill = |mut f: ParsedFile| -> Result<ParsedFile> {
        if !opts.meta.is_empty() {
            for d in &mut f.documents {
                d.meta = std::mem::take(&mut d.meta).or(&opts.meta);
            }
        }
        if let Some(id) = &opts.replaces {
            let [d] = f.documents.as_mut_slice() else {
                return Err(Error::MalformedFile {
                    path: origin.path.clone(),
                    format: kind.name(),
                    message: format!(
                        "用于更新文档「{id}」的文件应只含一篇文档，此文件含 {} 篇；多篇请在资料库页面整批上传",
                        f.documents.len()
                    ),
                });
            };
            d.external_id.clone_from(id);
        }
        Ok(f)
    };
    #[cfg(test)]
    if UNGUARDED.with(|u| u.get()) {
        return parse_inner(origin, kind, bytes, opts, limits).and_then(fill);
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse_inner(origin, kind, bytes, opts, limits))) {
        Ok(r) => r.and_then(|f| within_text_budget(origin, bytes.len(), limits, f)).and_then(fill),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::MalformedFile {
                path: origin.path.clone(),
                format: kind.name(),
                message: format!("{} 解析器无法读取此文件（{what}）；请重新保存或重新导出后再上传", kind.name()),
            })
        }
    }
}

/// Refuses a file whose text is out of proportion to its size ([`IngestLimits::max_text_ratio`]).
fn within_text_budget(origin: &Origin, size: usize, limits: &IngestLimits, f: ParsedFile) -> Result<ParsedFile> {
    let text: u64 = f.documents.iter().map(|d| (d.text.len() + d.title.len()) as u64).sum();
    text_budget_check(origin, size, limits, text)?;
    Ok(f)
}

/// `text` bytes from a file of `size` bytes: within [`IngestLimits::max_text_ratio`], or a too-large error.
pub(crate) fn text_budget_check(origin: &Origin, size: usize, limits: &IngestLimits, text: u64) -> Result<()> {
    let budget = (size as u64).saturating_mul(limits.max_text_ratio).saturating_add(1 << 20);
    if text > budget {
        return Err(Error::TooLarge {
            what: format!("{}: the text extracted from it", origin.path.display()),
            size: text,
            limit: budget,
            hint: format!(
                "a file may yield at most {}× its own size in text (ingest.limits.max_text_ratio); \
                 a document that repeats one page stream is usually crafted",
                limits.max_text_ratio
            ),
        });
    }
    Ok(())
}

fn parse_inner(
    origin: &Origin,
    kind: FileKind,
    bytes: &[u8],
    opts: &IngestOptions,
    limits: &IngestLimits,
) -> Result<ParsedFile> {
    let path = &origin.path;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::EmptyFile { path: path.clone() });
    }
    let source = path.display().to_string();
    let single = |title: String, text: String| -> Result<ParsedFile> {
        if text.is_empty() {
            return Err(Error::EmptyFile { path: path.clone() });
        }
        let title = if title.is_empty() { origin.stem() } else { title };
        Ok(ParsedFile {
            documents: vec![ParsedDocument {
                external_id: origin.ident.clone(),
                title,
                text,
                source: source.clone(),
                meta: meta::DocMeta::default(),
                scan: Vec::new(),
            }],
            skipped_empty: 0,
        })
    };
    match kind {
        FileKind::Text | FileKind::Markdown => {
            let text = normalize(&encoding::decode(path, bytes, opts.encoding.as_deref())?);
            let title =
                if kind == FileKind::Markdown { markdown_title(&text).unwrap_or_default() } else { String::new() };
            single(title, text)
        }
        FileKind::Html => {
            // The page's own <meta charset> is believed unless the bytes are UTF-8 anyway (re-saved pages).
            let declared = match opts.encoding.as_deref() {
                Some(e) => Some(e),
                None if std::str::from_utf8(bytes).is_err() && encoding_rs::Encoding::for_bom(bytes).is_none() => {
                    html::declared_charset(bytes)
                }
                None => None,
            };
            let raw = encoding::decode(path, bytes, declared)?;
            let (title, text) = html::extract(&raw).map_err(|at| Error::MalformedFile {
                path: path.clone(),
                format: "HTML",
                message: format!(
                    "its elements nest more than {} levels deep (near byte {at}); no real page does — save or \
                     export the page again",
                    html::MAX_DEPTH
                ),
            })?;
            let text = normalize(&text);
            let title = normalize(&title);
            let title = if title.is_empty() { markdown_title(&text).unwrap_or_default() } else { title };
            single(title, text)
        }
        FileKind::Docx => {
            let (title, text, meta) = docx::extract(path, bytes, limits)?;
            let text = normalize(&text);
            let title = normalize(&title);
            let title = if title.is_empty() { markdown_title(&text).unwrap_or_default() } else { title };
            let mut parsed = single(title, text)?;
            for d in &mut parsed.documents {
                d.meta = meta.clone();
            }
            Ok(parsed)
        }
        FileKind::Pdf => {
            let (parts, meta) = pdf::extract_filed(path, bytes, limits)?;
            let (text, lines) = scan::assemble(&parts);
            let title = text.lines().next().filter(|l| l.chars().count() <= 60).unwrap_or("").to_string();
            let mut parsed = single(title, text)?;
            for d in &mut parsed.documents {
                d.meta = meta.clone();
                d.scan.clone_from(&lines);
            }
            Ok(parsed)
        }
        FileKind::Image => {
            let (text, lines) = scan::assemble(&scan::image_parts(path, bytes)?);
            if text.is_empty() {
                return Err(Error::NoText { path: path.clone(), message: "图像中没有识别出文字".into() });
            }
            let mut parsed = single(String::new(), text)?;
            for d in &mut parsed.documents {
                d.scan.clone_from(&lines);
            }
            Ok(parsed)
        }
        FileKind::Jsonl => {
            let text = encoding::decode(path, bytes, opts.encoding.as_deref())?;
            parse_jsonl(path, &text, &origin.ident, &source)
        }
        FileKind::Csv | FileKind::Tsv => {
            let text = encoding::decode(path, bytes, opts.encoding.as_deref())?;
            csv::parse(path, &text, kind == FileKind::Tsv, &origin.ident, &source, opts)
        }
        FileKind::Zip => Err(Error::InvalidInput(format!(
            "{}：压缩包须先展开再逐个读取 (archives are expanded first)",
            path.display()
        ))),
    }
}

/// A table being read: finished rows, the row and the cell being filled, and whether it holds structure that a
/// row of cells cannot (a heading or another table: then it is page layout, and its cells are written as
/// paragraphs, as before tables were kept).
#[derive(Debug, Default)]
struct TableBuf {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: String,
    layout: bool,
}

impl TableBuf {
    fn end_cell(&mut self) {
        let cell = std::mem::take(&mut self.cell);
        if cell.lines().any(|l| l.starts_with('#')) {
            self.layout = true;
        }
        self.row.push(cell);
    }
    fn end_row(&mut self) {
        if !self.cell.trim().is_empty() {
            self.end_cell();
        }
        self.cell.clear();
        let row = std::mem::take(&mut self.row);
        if !row.is_empty() {
            self.rows.push(row);
        }
    }
    /// The table as text: one line per row, `| a | b |` (cells on one line, empty rows dropped), or for a layout
    /// table each cell's own lines.
    fn finish(mut self) -> String {
        self.end_row();
        let mut out = String::new();
        for row in &self.rows {
            if self.layout {
                for cell in row.iter().filter(|c| !c.trim().is_empty()) {
                    out.push('\n');
                    out.push_str(cell.trim());
                    out.push('\n');
                }
                continue;
            }
            // A `|` inside a cell would read as a cell boundary: it is shown as `¦`.
            let cells: Vec<String> =
                row.iter().map(|c| c.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "¦")).collect();
            if cells.iter().all(String::is_empty) {
                continue;
            }
            out.push_str("\n| ");
            out.push_str(&cells.join(" | "));
            out.push_str(" |\n");
        }
        out
    }
}

fn markdown_title(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix("# ").map(|t| t.trim().to_string())).filter(|t| !t.is_empty())
}

#[derive(Deserialize)]
struct JsonlRecord {
    #[serde(default, alias = "_id")]
    id: Option<serde_json::Value>,
    #[serde(default)]
    title: Option<String>,
    #[serde(alias = "content", alias = "body")]
    text: String,
    /// Every other field: department, type and date are looked up here ([`meta`]).
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

impl JsonlRecord {
    /// The first of `names` among the record's other fields (ASCII case-insensitive), as text.
    fn other(&self, names: &[&str]) -> String {
        names
            .iter()
            .find_map(|n| self.rest.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)))
            .map(|(_, v)| match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => String::new(),
            })
            .unwrap_or_default()
    }
}

fn parse_jsonl(path: &Path, text: &str, file_name: &str, source: &str) -> Result<ParsedFile> {
    let mut out = ParsedFile::default();
    let mut seen = std::collections::HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let rec: JsonlRecord = serde_json::from_str(line).map_err(|e| Error::MalformedRecord {
            path: path.to_path_buf(),
            line: line_no,
            message: format!("不是带字符串 `text` 字段的 JSON 对象：{e}"),
        })?;
        let meta = meta::DocMeta::from_fields(|names| rec.other(names)).map_err(|e| Error::MalformedRecord {
            path: path.to_path_buf(),
            line: line_no,
            message: e.to_string(),
        })?;
        let id = match rec.id {
            None => format!("{file_name}:{line_no}"),
            Some(serde_json::Value::String(s)) => s,
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(other) => {
                return Err(Error::MalformedRecord {
                    path: path.to_path_buf(),
                    line: line_no,
                    message: format!("`id` 应为字符串或数字，实为 {other}"),
                });
            }
        };
        if let Some(prev) = seen.insert(id.clone(), line_no) {
            return Err(Error::MalformedRecord {
                path: path.to_path_buf(),
                line: line_no,
                message: format!("编号 {id:?} 重复（第 {prev} 行已用过）"),
            });
        }
        let body = normalize(&rec.text);
        if body.is_empty() {
            out.skipped_empty += 1;
            continue;
        }
        out.documents.push(ParsedDocument {
            external_id: id,
            title: normalize(rec.title.as_deref().unwrap_or("")),
            text: body,
            source: format!("{source}:{line_no}"),
            meta,
            scan: Vec::new(),
        });
    }
    if out.documents.is_empty() && out.skipped_empty == 0 {
        return Err(Error::EmptyFile { path: path.to_path_buf() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_errors_name_file_and_line() {
        let p = Path::new("/data/q.jsonl");
        let err =
            parse_bytes(p, FileKind::Jsonl, b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\",\"text\":\n").unwrap_err();
        assert!(err.to_string().starts_with("/data/q.jsonl 第 2 行："), "{err}");
        let err = parse_bytes(p, FileKind::Jsonl, b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"a\",\"text\":\"y\"}")
            .unwrap_err();
        assert!(err.to_string().contains("编号 \"a\" 重复（第 1 行已用过）"), "{err}");
        let err = parse_bytes(p, FileKind::Jsonl, b"{\"id\":\"a\"}\n").unwrap_err();
        assert!(err.to_string().contains("q.jsonl 第 1 行"), "{err}");
    }

    #[test]
    fn decodes_gbk_rejects_binary_and_empty() {
        let p = Path::new("gbk.txt");
        // GBK is detected and decoded.
        let (gbk, _, _) = encoding_rs::GBK.encode("糖尿病患者应控制饮食，定期监测血糖。");
        let f = parse_bytes(p, FileKind::Text, &gbk).unwrap();
        assert_eq!(f.documents[0].text, "糖尿病患者应控制饮食，定期监测血糖。");
        let err = parse_bytes(p, FileKind::Text, b"ok\x00\x01\x02\x03binary").unwrap_err();
        assert_eq!(err.code().as_str(), "bad_encoding", "{err}");
        assert!(matches!(parse_bytes(p, FileKind::Text, b" \n\t"), Err(Error::EmptyFile { .. })));
        assert!(matches!(FileKind::of(Path::new("a.exe")), Err(Error::UnsupportedFormat { .. })));
    }

    #[test]
    fn markdown_title_and_beir_record() {
        let md = parse_bytes(Path::new("x/metformin.md"), FileKind::Markdown, "\u{feff}# 二甲双胍\n正文。".as_bytes())
            .unwrap();
        assert_eq!(md.documents[0].title, "二甲双胍");
        assert_eq!(md.documents[0].external_id, "metformin.md");
        let j = parse_bytes(
            Path::new("corpus.jsonl"),
            FileKind::Jsonl,
            "{\"id\": \"d1\", \"title\": \"\", \"text\": \"\\u001a孕妇出血\"}\n{\"id\": 7, \"text\": \"\\u001a\"}\n"
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(j.documents.len(), 1);
        assert_eq!(j.documents[0].text, "孕妇出血");
        assert_eq!(j.skipped_empty, 1);
    }

    /// The finding: an 11 KB PDF whose 16 pages share one content stream indexed 128 MiB of text. The text a file
    /// yields is bounded by its size.
    #[test]
    fn a_small_pdf_that_repeats_one_stream_is_refused_for_its_text() {
        let line = "二甲双胍禁用于严重肾功能不全的患者";
        let lines = vec![line; 5_000];
        let bytes = fixtures::pdf_bytes_one_stream(&lines, 16);
        assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
        let err = parse_bytes(Path::new("repeat.pdf"), FileKind::Pdf, &bytes).unwrap_err();
        assert_eq!(err.code(), crate::error::ErrorCode::TooLarge, "{err}");
        assert!(err.to_string().contains("max_text_ratio"), "{err}");
        // The same page once is an ordinary document.
        let once = fixtures::pdf_bytes_one_stream(&lines[..50], 1);
        assert_eq!(parse_bytes(Path::new("once.pdf"), FileKind::Pdf, &once).unwrap().documents.len(), 1);
    }

    #[test]
    fn markdown_lists_and_tables_stay_lines() {
        let md = "# 二甲双胍\n\n## 禁忌症\n\n1. 肾功能不全\n2. 严重感染\n\n- 限酒\n* 监测\n\n| 药物 | 剂量 |\n|---|---|\n| 二甲双胍 | 500 mg |\n";
        let f = parse_bytes(Path::new("m.md"), FileKind::Markdown, md.as_bytes()).unwrap();
        let text = &f.documents[0].text;
        assert_eq!(
            text,
            "# 二甲双胍\n## 禁忌症\n1. 肾功能不全\n2. 严重感染\n- 限酒\n* 监测\n| 药物 | 剂量 |\n|---|---|\n| 二甲双胍 | 500 mg |"
        );
        // Items and rows end sentences: chunks hold whole lines, never two items run together.
        let cfg = crate::text::ChunkConfig { max_chars: 24, overlap_chars: 0, ..Default::default() };
        let chunks = crate::text::chunk(text, &cfg);
        assert!(chunks.len() > 1);
        assert!(chunks.iter().flat_map(|c| c.text.lines()).all(|l| text.lines().any(|t| t == l)), "{chunks:?}");
        let plain = |t: &str| vec![crate::docview::Part { text: t.to_string(), mark: false }];
        let blocks = crate::docview::blocks(text.split_once("## 禁忌症\n").unwrap().1, &plain);
        use crate::docview::Block;
        assert!(matches!(&blocks[0], Block::List { ordered: true, start: 1, items } if items.len() == 2), "{blocks:?}");
        assert!(matches!(&blocks[1], Block::List { ordered: false, items, .. } if items.len() == 2), "{blocks:?}");
        assert!(
            matches!(&blocks[2], Block::Table { header: Some(h), rows } if h.len() == 2 && rows.len() == 1),
            "{blocks:?}"
        );
    }
}
