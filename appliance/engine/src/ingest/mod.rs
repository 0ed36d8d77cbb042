//! Reading files into documents.
//!
//! A file is read and validated completely before anything is written: a malformed file is rejected whole with
//! an error naming the file (and line), so it can never leave half of itself in a collection.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::text::normalize;

/// A document ready to be chunked and stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedDocument {
    /// Identity inside the collection: the JSONL `id`, or the file name. Re-ingesting the same id replaces it.
    pub external_id: String,
    pub title: String,
    /// Normalised text (see [`crate::text::normalize`]).
    pub text: String,
    pub source: String,
}

impl ParsedDocument {
    pub fn content_hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.title.as_bytes());
        h.update([0u8]);
        h.update(self.text.as_bytes());
        hex::encode(h.finalize())
    }
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct ParsedFile {
    pub documents: Vec<ParsedDocument>,
    /// Records that held no text after normalisation (kept out of the index, reported to the user).
    pub skipped_empty: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Text,
    Markdown,
    Jsonl,
}

impl FileKind {
    pub fn of(path: &Path) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match ext.as_str() {
            "txt" | "text" => Ok(FileKind::Text),
            "md" | "markdown" => Ok(FileKind::Markdown),
            "jsonl" | "ndjson" => Ok(FileKind::Jsonl),
            _ => Err(Error::UnsupportedFormat { path: path.to_path_buf(), ext }),
        }
    }
}

/// Reads and parses one file. Every error names the file.
pub fn parse_file(path: &Path) -> Result<ParsedFile> {
    let kind = FileKind::of(path)?;
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_bytes(path, kind, &bytes)
}

pub fn parse_bytes(path: &Path, kind: FileKind, bytes: &[u8]) -> Result<ParsedFile> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::EmptyFile { path: path.to_path_buf() });
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Error::NotUtf8 { path: path.to_path_buf(), offset: e.valid_up_to() })?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("document").to_string();
    let stem = path.file_stem().and_then(|n| n.to_str()).unwrap_or("document").to_string();
    let source = path.display().to_string();
    match kind {
        FileKind::Text | FileKind::Markdown => {
            let text = normalize(text);
            let title = match kind {
                FileKind::Markdown => text
                    .lines()
                    .find_map(|l| l.strip_prefix("# ").map(|t| t.trim().to_string()))
                    .unwrap_or_else(|| stem.clone()),
                _ => stem.clone(),
            };
            if text.is_empty() {
                return Err(Error::EmptyFile { path: path.to_path_buf() });
            }
            Ok(ParsedFile {
                documents: vec![ParsedDocument { external_id: file_name, title, text, source }],
                skipped_empty: 0,
            })
        }
        FileKind::Jsonl => parse_jsonl(path, text, &file_name, &source),
    }
}

#[derive(Deserialize)]
struct JsonlRecord {
    #[serde(default, alias = "_id")]
    id: Option<serde_json::Value>,
    #[serde(default)]
    title: Option<String>,
    #[serde(alias = "content", alias = "body")]
    text: String,
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
            message: format!("not a JSON object with a string `text` field: {e}"),
        })?;
        let id = match rec.id {
            None => format!("{file_name}:{line_no}"),
            Some(serde_json::Value::String(s)) => s,
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(other) => {
                return Err(Error::MalformedRecord {
                    path: path.to_path_buf(),
                    line: line_no,
                    message: format!("`id` must be a string or a number, found {other}"),
                });
            }
        };
        if let Some(prev) = seen.insert(id.clone(), line_no) {
            return Err(Error::MalformedRecord {
                path: path.to_path_buf(),
                line: line_no,
                message: format!("duplicate id {id:?} (first used on line {prev})"),
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
        let err = parse_bytes(p, FileKind::Jsonl, b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\",\"text\":\n").unwrap_err();
        assert!(err.to_string().starts_with("/data/q.jsonl:2: "), "{err}");
        let err = parse_bytes(p, FileKind::Jsonl, b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"a\",\"text\":\"y\"}").unwrap_err();
        assert!(err.to_string().contains("duplicate id \"a\" (first used on line 1)"), "{err}");
        let err = parse_bytes(p, FileKind::Jsonl, b"{\"id\":\"a\"}\n").unwrap_err();
        assert!(err.to_string().contains("q.jsonl:1"), "{err}");
    }

    #[test]
    fn rejects_non_utf8_and_empty() {
        let p = Path::new("gbk.txt");
        // "糖尿病" in GBK.
        let err = parse_bytes(p, FileKind::Text, b"ok \xcc\xc7\xc4\xf2\xb2\xa1").unwrap_err();
        assert!(matches!(err, Error::NotUtf8 { offset: 3, .. }), "{err}");
        assert!(err.to_string().contains("iconv"));
        assert!(matches!(parse_bytes(p, FileKind::Text, b" \n\t"), Err(Error::EmptyFile { .. })));
        assert!(matches!(FileKind::of(Path::new("a.exe")), Err(Error::UnsupportedFormat { .. })));
    }

    #[test]
    fn markdown_title_and_beir_record() {
        let md = parse_bytes(Path::new("x/metformin.md"), FileKind::Markdown, "\u{feff}# 二甲双胍\n正文。".as_bytes()).unwrap();
        assert_eq!(md.documents[0].title, "二甲双胍");
        assert_eq!(md.documents[0].external_id, "metformin.md");
        let j = parse_bytes(
            Path::new("corpus.jsonl"),
            FileKind::Jsonl,
            "{\"id\": \"d1\", \"title\": \"\", \"text\": \"\\u001a孕妇出血\"}\n{\"id\": 7, \"text\": \"\\u001a\"}\n".as_bytes(),
        )
        .unwrap();
        assert_eq!(j.documents.len(), 1);
        assert_eq!(j.documents[0].text, "孕妇出血");
        assert_eq!(j.skipped_empty, 1);
    }
}
