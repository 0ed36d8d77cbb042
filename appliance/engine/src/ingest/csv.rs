//! CSV/TSV question banks and tables: one document per row, text (and optionally title and id) taken from named
//! columns. A named column that the header lacks is an error listing the header, so a typo is fixed in one try.

use std::collections::HashMap;
use std::path::Path;

use super::{IngestOptions, ParsedDocument, ParsedFile};
use crate::error::{Error, Result};
use crate::text::normalize;

const TEXT_COLUMNS: &[&str] = &["text", "content", "body", "正文", "内容", "answer", "答案", "question", "问题"];
const TITLE_COLUMNS: &[&str] = &["title", "标题", "题目"];
pub(super) const ID_COLUMNS: &[&str] = &["id", "_id", "external_id", "编号"];

pub(super) fn parse(
    path: &Path,
    text: &str,
    tab: bool,
    ident: &str,
    source: &str,
    opts: &IngestOptions,
) -> Result<ParsedFile> {
    let fmt = if tab { "TSV" } else { "CSV" };
    let mut rdr = ::csv::ReaderBuilder::new()
        .delimiter(if tab { b'\t' } else { b',' })
        .has_headers(true)
        .flexible(false)
        .from_reader(text.as_bytes());
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| Error::MalformedFile {
            path: path.to_path_buf(),
            format: fmt,
            message: format!("表头无法读取：{e}"),
        })?
        .iter()
        .map(|h| h.trim().trim_start_matches('\u{feff}').to_string())
        .collect();
    let find = |wanted: Option<&str>, defaults: &[&str], role: &str, required: bool| -> Result<Option<usize>> {
        match wanted.map(str::trim).filter(|w| !w.is_empty()) {
            Some(w) => header.iter().position(|h| h == w).map(Some).ok_or_else(|| Error::MalformedFile {
                path: path.to_path_buf(),
                format: fmt,
                message: format!(
                    "指定的{role}列 {w:?} 不在表头中；表头为：{}",
                    header.iter().map(|h| format!("{h:?}")).collect::<Vec<_>>().join(", ")
                ),
            }),
            None => {
                let found = defaults.iter().find_map(|d| header.iter().position(|h| h.eq_ignore_ascii_case(d)));
                if found.is_none() && required {
                    return Err(Error::MalformedFile {
                        path: path.to_path_buf(),
                        format: fmt,
                        message: format!(
                            "找不到{role}列：表头（{1}）中没有 {0} 中的任何一个；请用上传选项 `csv_{role}_column` \
                             指定（命令行 `--csv-{role}-column`）",
                            defaults.join(", "),
                            header.iter().map(|h| format!("{h:?}")).collect::<Vec<_>>().join(", ")
                        ),
                    });
                }
                Ok(found)
            }
        }
    };
    let text_col = find(opts.csv_text_column.as_deref(), TEXT_COLUMNS, "text", true)?.unwrap_or(0);
    let title_col = find(opts.csv_title_column.as_deref(), TITLE_COLUMNS, "title", false)?;
    let id_col = find(opts.csv_id_column.as_deref(), ID_COLUMNS, "id", false)?;
    // The filing's columns, found by the names the metadata module reads (asked for by those names below).
    let mut filing: Vec<(&[&str], usize)> = Vec::new();
    for names in super::meta::ALL_FIELDS {
        filing.extend(find(None, names, "filing", false)?.map(|c| (names, c)));
    }

    let mut out = ParsedFile::default();
    let mut seen: HashMap<String, u64> = HashMap::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line() as usize);
            Error::MalformedRecord {
                path: path.to_path_buf(), line, message: format!("{fmt} 记录无法读取：{e}")
            }
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        let id = match id_col.map(|i| rec.get(i).unwrap_or("").trim()) {
            Some(id) if !id.is_empty() => id.to_string(),
            Some(_) => {
                return Err(Error::MalformedRecord {
                    path: path.to_path_buf(),
                    line: line as usize,
                    message: "编号列为空".into(),
                });
            }
            None => format!("{ident}:{line}"),
        };
        if let Some(prev) = seen.insert(id.clone(), line) {
            return Err(Error::MalformedRecord {
                path: path.to_path_buf(),
                line: line as usize,
                message: format!("编号 {id:?} 重复（第 {prev} 行已用过）"),
            });
        }
        let body = normalize(rec.get(text_col).unwrap_or(""));
        if body.is_empty() {
            out.skipped_empty += 1;
            continue;
        }
        let cell = |names: &[&str]| {
            filing.iter().find(|(n, _)| *n == names).and_then(|(_, c)| rec.get(*c)).unwrap_or("").to_string()
        };
        let meta = super::meta::DocMeta::from_fields(cell).map_err(|e| Error::MalformedRecord {
            path: path.to_path_buf(),
            line: line as usize,
            message: e.to_string(),
        })?;
        out.documents.push(ParsedDocument {
            external_id: id,
            title: title_col.map(|i| normalize(rec.get(i).unwrap_or(""))).unwrap_or_default(),
            text: body,
            source: format!("{source}:{line}"),
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

    fn opts(text: Option<&str>, title: Option<&str>, id: Option<&str>) -> IngestOptions {
        IngestOptions {
            csv_text_column: text.map(Into::into),
            csv_title_column: title.map(Into::into),
            csv_id_column: id.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn picks_columns_and_reports_missing_ones() {
        let p = Path::new("bank.csv");
        let csv =
            "编号,问题,答案\nq1,二甲双胍的禁忌症？,\"严重肾功能不全者禁用。\"\nq2,阿司匹林的副作用？,胃肠道出血。\n";
        let f = parse(p, csv, false, "bank.csv", "bank.csv", &opts(Some("答案"), Some("问题"), Some("编号"))).unwrap();
        assert_eq!(f.documents.len(), 2);
        assert_eq!(f.documents[0].external_id, "q1");
        assert_eq!(f.documents[0].title, "二甲双胍的禁忌症？");
        assert_eq!(f.documents[0].text, "严重肾功能不全者禁用。");
        assert_eq!(f.documents[1].source, "bank.csv:3");
        let err = parse(p, csv, false, "bank.csv", "bank.csv", &opts(Some("正文"), None, None)).unwrap_err();
        assert_eq!(err.code().as_str(), "malformed_record");
        assert!(err.to_string().contains("\"正文\" 不在表头中；表头为：\"编号\", \"问题\", \"答案\""), "{err}");
        // Default columns: 答案 (text) and 编号 (id) are found without options; without an id column, ids are
        // file:line.
        let f = parse(p, csv, false, "bank.csv", "bank.csv", &IngestOptions::default()).unwrap();
        assert_eq!((f.documents[1].external_id.as_str(), f.documents[1].text.as_str()), ("q2", "胃肠道出血。"));
        let f = parse(p, "问题\n发热？\n", false, "bank.csv", "bank.csv", &IngestOptions::default()).unwrap();
        assert_eq!(f.documents[0].external_id, "bank.csv:2");
        let err = parse(p, "a,b\n1,2\n", false, "x.csv", "x.csv", &IngestOptions::default()).unwrap_err();
        assert!(err.to_string().contains("找不到text列"), "{err}");
        let err = parse(p, "text\nok\nx,y\n", false, "x.csv", "x.csv", &IngestOptions::default()).unwrap_err();
        assert_eq!(err.code().as_str(), "malformed_record", "{err}");
        assert!(err.to_string().starts_with("bank.csv 第 3 行："), "{err}");
    }
}
