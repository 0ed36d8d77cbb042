//! What a hospital files a document under: its department (科室), its type (指南, 药品说明书, …), its date, who
//! issued it (来源: 国家卫健委, 中华医学会, 本院) and its language.
//!
//! Taken, in this order of precedence, from the record itself (JSONL fields, CSV columns), from the folders an
//! archive member sits in, and from the upload form (which fills only what the file does not say). A value that is
//! present but not understood (a date such as 2023-13-01) rejects the record with its line, like any malformed
//! field: a clinician filtering by year must not miss a guideline because its date was silently dropped.

use serde::{Deserialize, Serialize};

/// Document types a folder name is recognised as (any other folder that names a department is taken as one).
pub const DOC_TYPES: &[&str] = &[
    "指南",
    "共识",
    "药品说明书",
    "说明书",
    "护理规范",
    "操作规范",
    "规范",
    "制度",
    "流程",
    "模板",
    "手册",
    "路径",
    "临床路径",
    "标准",
    "教材",
    "文献",
    "问答",
];

/// Field and column names read as each piece of metadata (ASCII case-insensitive).
pub const DEPARTMENT_FIELDS: &[&str] = &["department", "dept", "科室", "部门"];
pub const TYPE_FIELDS: &[&str] = &["doc_type", "type", "category", "类型", "文档类型", "类别"];
pub const DATE_FIELDS: &[&str] = &["date", "published", "revised", "日期", "发布日期", "修订日期", "发布时间"];
/// Who issued the document. Not `source`: corpora use that field for a URL or a file path, which would then be
/// refused as too long for a name (and `documents.source` already holds where the text was read from).
pub const ISSUER_FIELDS: &[&str] =
    &["issuer", "publisher", "organization", "来源", "发布机构", "发布单位", "制定单位", "出处"];
pub const LANGUAGE_FIELDS: &[&str] = &["language", "lang", "语言", "语种"];
/// Who may read the document: groups or departments (empty: everyone who may read its collection).
pub const ACCESS_FIELDS: &[&str] = &["access", "visible_to", "可见范围", "访问范围", "可见科室"];
/// Every filing field's names, in [`DocMeta`]'s order.
pub const ALL_FIELDS: [&[&str]; 6] =
    [DEPARTMENT_FIELDS, TYPE_FIELDS, DATE_FIELDS, ISSUER_FIELDS, LANGUAGE_FIELDS, ACCESS_FIELDS];
/// Groups an access list may name.
const MAX_ACCESS_GROUPS: usize = 20;

/// Longest department or type name kept (longer is not a name but a misplaced text column).
const MAX_NAME_CHARS: usize = 40;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DocMeta {
    /// 科室, e.g. 心内科.
    pub department: String,
    /// Document type, e.g. 指南.
    pub doc_type: String,
    /// Publication or revision date as `YYYY`, `YYYY-MM` or `YYYY-MM-DD` (as precise as the source was).
    pub date: String,
    /// Who issued it (来源), e.g. 国家卫健委.
    pub issuer: String,
    /// Its language as a Chinese name (中文, 英文, …): given, or read from the text at ingest.
    pub language: String,
    /// Who may read it besides administrators: groups or departments, comma-separated (`心内科,护理部`), matched
    /// against the reader's groups (directory groups, or those an administrator gave a local account). Empty:
    /// everyone granted its collection.
    pub access: String,
}

/// Why a metadata value was refused (the caller adds the file and line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("日期「{0}」无法识别：请写成 2023、2023-05 或 2023-05-12（也可写 2023年5月12日、2023/5/12）")]
    Date(String),
    #[error("{what}「{value}」过长（最多 {MAX_NAME_CHARS} 个字）：这一列可能不是{what}")]
    TooLong { what: &'static str, value: String },
}

impl DocMeta {
    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(|f| f.is_empty())
    }

    fn fields(&self) -> [&String; 6] {
        [&self.department, &self.doc_type, &self.date, &self.issuer, &self.language, &self.access]
    }

    /// The groups of the access list (none: open to the collection's readers).
    pub fn access_groups(&self) -> impl Iterator<Item = &str> {
        self.access.split(',').map(str::trim).filter(|g| !g.is_empty())
    }

    /// The values checked and put in their stored form (names trimmed, the date read, the language named).
    pub fn checked(&self) -> Result<DocMeta, MetaError> {
        Ok(DocMeta {
            department: name("科室", &self.department)?,
            doc_type: name("类型", &self.doc_type)?,
            date: parse_date(&self.date)?,
            issuer: name("来源", &self.issuer)?,
            language: language_name(&name("语言", &self.language)?),
            access: access_list(&self.access)?,
        })
    }

    /// Reads a record's filing: `field` gives the value of the first of the names it is asked for that the record
    /// has (JSONL fields, CSV columns, document properties), or an empty string.
    pub fn from_fields(mut field: impl FnMut(&[&str]) -> String) -> Result<DocMeta, MetaError> {
        DocMeta {
            department: field(DEPARTMENT_FIELDS),
            doc_type: field(TYPE_FIELDS),
            date: field(DATE_FIELDS),
            issuer: field(ISSUER_FIELDS),
            language: field(LANGUAGE_FIELDS),
            access: field(ACCESS_FIELDS),
        }
        .checked()
    }

    /// Fills what `self` lacks from `other` (the record wins over its folders, both over the upload form).
    pub fn or(mut self, other: &DocMeta) -> DocMeta {
        for (mine, theirs) in [
            (&mut self.department, &other.department),
            (&mut self.doc_type, &other.doc_type),
            (&mut self.date, &other.date),
            (&mut self.issuer, &other.issuer),
            (&mut self.language, &other.language),
            (&mut self.access, &other.access),
        ] {
            if mine.is_empty() {
                mine.clone_from(theirs);
            }
        }
        self
    }

    /// What the folders of an archive member say: a folder named as a document type is its type, one ending in a
    /// department's suffix (科, 室, 中心, 部) its department, a four-digit year (2000–2099) its date. The innermost
    /// folder wins; other folder names say nothing.
    pub fn from_folders<'a>(folders: impl IntoIterator<Item = &'a str>) -> DocMeta {
        let mut m = DocMeta::default();
        for f in folders {
            let f = f.trim();
            if f.is_empty() || f.chars().count() > MAX_NAME_CHARS {
                continue;
            }
            if DOC_TYPES.contains(&f) {
                m.doc_type = f.to_string();
            } else if ["科", "室", "中心", "部"].iter().any(|s| f.ends_with(s)) {
                m.department = f.to_string();
            } else if f.len() == 4 && f.starts_with("20") && f.bytes().all(|b| b.is_ascii_digit()) {
                m.date = f.to_string();
            }
        }
        m
    }

    /// The filing a file's own properties give (a Word document's custom properties, a PDF's document
    /// information): properties named like the JSONL fields, and a category as the type when no property names one.
    pub fn from_properties(props: &[(String, String)], category: Option<&str>) -> Result<DocMeta, MetaError> {
        DocMeta::from_fields(|names| {
            let named = props.iter().find(|(k, _)| names.iter().any(|n| k.trim().eq_ignore_ascii_case(n)));
            match named {
                Some((_, v)) => v.clone(),
                None if names == TYPE_FIELDS => category.unwrap_or("").to_string(),
                None => String::new(),
            }
        })
    }

    /// The year, for facets: the first four characters of the date.
    pub fn year(&self) -> Option<&str> {
        self.date.get(..4)
    }

    /// Bytes folded into a document's content hash, so that a changed filing in the file updates the stored one;
    /// empty when there is no metadata, so hashes of documents without any stay as they were (and the issuer and
    /// language add bytes only when given, so the hashes of documents filed before they existed stay too).
    pub fn hash_bytes(&self) -> Vec<u8> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut s = format!("\u{0}meta\u{0}{}\u{0}{}\u{0}{}", self.department, self.doc_type, self.date);
        if !self.issuer.is_empty() || !self.language.is_empty() || !self.access.is_empty() {
            s.push_str(&format!("\u{0}{}\u{0}{}", self.issuer, self.language));
        }
        if !self.access.is_empty() {
            s.push_str(&format!("\u{0}access\u{0}{}", self.access));
        }
        s.into_bytes()
    }
}

/// An access list in its stored form: names split at commas (also ，、；;), trimmed, each a name, without repeats,
/// joined by ",".
fn access_list(raw: &str) -> Result<String, MetaError> {
    let mut out: Vec<String> = Vec::new();
    for g in raw.split([',', '，', '、', ';', '；']).map(str::trim).filter(|g| !g.is_empty()) {
        let g = name("可见范围", g)?;
        if !out.iter().any(|o| o.eq_ignore_ascii_case(&g)) {
            out.push(g);
        }
    }
    if out.len() > MAX_ACCESS_GROUPS {
        return Err(MetaError::TooLong { what: "可见范围", value: raw.chars().take(60).collect() });
    }
    Ok(out.join(","))
}

/// Languages by the names and codes files use, to the name the filter shows (others are kept as written).
const LANGUAGES: &[(&str, &[&str])] = &[
    (
        "中文",
        &[
            "zh",
            "zh-cn",
            "zh-hans",
            "zh-tw",
            "zh-hk",
            "zh-hant",
            "chi",
            "zho",
            "chinese",
            "汉语",
            "简体中文",
            "繁体中文",
            "繁體中文",
        ],
    ),
    ("英文", &["en", "en-us", "en-gb", "eng", "english", "英语"]),
    ("日文", &["ja", "ja-jp", "jpn", "japanese", "日语"]),
    ("韩文", &["ko", "ko-kr", "kor", "korean", "韩语"]),
    ("法文", &["fr", "fra", "fre", "french", "法语"]),
    ("德文", &["de", "deu", "ger", "german", "德语"]),
];

/// The Chinese name of a language written as a code or a name (`en`, `English`, `英语` → 英文).
pub fn language_name(raw: &str) -> String {
    let v = raw.trim();
    let lower = v.to_ascii_lowercase().replace('_', "-");
    LANGUAGES
        .iter()
        .find(|(name, aliases)| *name == v || aliases.contains(&lower.as_str()))
        .map_or_else(|| v.to_string(), |(name, _)| name.to_string())
}

/// The language of a text, from its first few thousand characters: Chinese when Han characters are at least a
/// third as many as Latin letters (a Chinese guideline full of English abbreviations is Chinese), Japanese or
/// Korean by their own scripts, English when Latin letters dominate; empty when there is nothing to tell by.
pub fn detect_language(text: &str) -> &'static str {
    let (mut han, mut kana, mut hangul, mut latin) = (0usize, 0usize, 0usize, 0usize);
    for c in text.chars().take(4000) {
        match c {
            c if crate::text::is_cjk(c) => han += 1,
            '\u{3040}'..='\u{30ff}' => kana += 1,
            '\u{ac00}'..='\u{d7af}' => hangul += 1,
            c if c.is_ascii_alphabetic() => latin += 1,
            _ => {}
        }
    }
    if kana * 5 > han && kana >= 10 {
        "日文"
    } else if hangul >= 10 && hangul * 3 >= latin {
        "韩文"
    } else if han > 0 && han * 3 >= latin {
        "中文"
    } else if latin >= 20 {
        "英文"
    } else {
        ""
    }
}

/// New filing for documents, by external id. `sets` says which of [`DocMeta`]'s fields it gives, in
/// [`ALL_FIELDS`]' order: a spreadsheet without a date column leaves the stored dates as they are, while in a
/// column it has an empty cell clears the value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filing {
    pub sets: [bool; 6],
    pub rows: Vec<(String, DocMeta)>,
}

impl Filing {
    /// A filing that gives every field (an admin's edit of one document).
    pub fn whole(rows: Vec<(String, DocMeta)>) -> Filing {
        Filing { sets: [true; 6], rows }
    }
}

/// Rows a filing spreadsheet may hold (a hospital's whole library is tens of thousands of documents).
const MAX_FILING_ROWS: usize = 1_000_000;

/// Reads a filing spreadsheet (CSV, UTF-8): a header with an id column (`id`, `external_id`, `编号`, …) and any
/// of the department, type, date, issuer and language columns; one row per document. Returns the filing, or a
/// Chinese message naming the line.
pub fn read_filing(text: &str) -> Result<Filing, crate::Error> {
    let bad = |m: String| crate::Error::InvalidInput(m);
    let mut rdr = ::csv::ReaderBuilder::new().has_headers(true).flexible(false).from_reader(text.as_bytes());
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| bad(format!("表头无法读取：{e}")))?
        .iter()
        .map(|h| h.trim().trim_start_matches('\u{feff}').to_string())
        .collect();
    let col = |names: &[&str]| names.iter().find_map(|d| header.iter().position(|h| h.eq_ignore_ascii_case(d)));
    let id = col(super::csv::ID_COLUMNS).ok_or_else(|| {
        bad(format!("表头没有编号列（{}）；表头为：{}", super::csv::ID_COLUMNS.join("、"), header.join("、")))
    })?;
    let cols: Vec<Option<usize>> = ALL_FIELDS.iter().map(|f| col(f)).collect();
    if cols.iter().all(Option::is_none) {
        return Err(bad(format!("表头没有科室、类型、日期、来源、语言或可见范围列；表头为：{}", header.join("、"))));
    }
    let mut out = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| bad(format!("第 {} 行无法读取：{e}", e.position().map_or(0, |p| p.line()))))?;
        let line = rec.position().map_or(0, |p| p.line());
        if out.len() >= MAX_FILING_ROWS {
            return Err(bad(format!("行数超过 {MAX_FILING_ROWS}：请分批导入")));
        }
        let get = |c: Option<usize>| c.and_then(|i| rec.get(i)).unwrap_or("");
        let key = get(Some(id)).trim();
        if key.is_empty() {
            return Err(bad(format!("第 {line} 行的编号为空")));
        }
        let m = DocMeta::from_fields(|names| {
            get(ALL_FIELDS.iter().position(|f| *f == names).and_then(|i| cols[i])).to_string()
        })
        .map_err(|e| bad(format!("第 {line} 行：{e}")))?;
        out.push((key.to_string(), m));
    }
    let mut sets = [false; 6];
    for (set, c) in sets.iter_mut().zip(&cols) {
        *set = c.is_some();
    }
    Ok(Filing { sets, rows: out })
}

fn name(what: &'static str, value: &str) -> Result<String, MetaError> {
    let v = value.trim();
    if v.chars().count() > MAX_NAME_CHARS {
        return Err(MetaError::TooLong { what, value: v.chars().take(MAX_NAME_CHARS).collect::<String>() + "…" });
    }
    Ok(v.to_string())
}

/// Reads a date as hospitals write them: 2023, 2023-05, 2023-05-12, 2023/5/12, 2023.5.12, 2023年5月12日, 20230512,
/// or an ISO timestamp (its date part). Returns `YYYY[-MM[-DD]]`; an empty value is no date.
pub fn parse_date(raw: &str) -> Result<String, MetaError> {
    let s = raw.trim();
    if s.is_empty() {
        return Ok(String::new());
    }
    let bad = || MetaError::Date(s.chars().take(40).collect());
    // An ISO timestamp: keep its date.
    let s2 = s.split(['T', ' ']).next().unwrap_or(s);
    let parts: Vec<&str> = if s2.len() == 8 && s2.bytes().all(|b| b.is_ascii_digit()) {
        vec![&s2[..4], &s2[4..6], &s2[6..]]
    } else {
        s2.trim_end_matches('日').split(['-', '/', '.', '年', '月']).filter(|p| !p.is_empty()).collect()
    };
    if parts.is_empty() || parts.len() > 3 || parts.iter().any(|p| !p.bytes().all(|b| b.is_ascii_digit())) {
        return Err(bad());
    }
    let num = |p: &str| p.parse::<u32>().map_err(|_| bad());
    let year = num(parts[0])?;
    if parts[0].len() != 4 || !(1900..=2100).contains(&year) {
        return Err(bad());
    }
    let mut out = format!("{year:04}");
    if let Some(m) = parts.get(1) {
        let month = num(m)?;
        if !(1..=12).contains(&month) || m.len() > 2 {
            return Err(bad());
        }
        out.push_str(&format!("-{month:02}"));
        if let Some(d) = parts.get(2) {
            let day = num(d)?;
            if day == 0 || d.len() > 2 || day > days_in_month(year, month) {
                return Err(bad());
            }
            out.push_str(&format!("-{day:02}"));
        }
    }
    Ok(out)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_read_as_hospitals_write_them_and_nonsense_is_refused() {
        for (raw, want) in [
            ("2023", "2023"),
            ("2023-5", "2023-05"),
            ("2023-05-12", "2023-05-12"),
            ("2023/5/12", "2023-05-12"),
            ("2023.05.12", "2023-05-12"),
            ("2023年5月12日", "2023-05-12"),
            ("2023年5月", "2023-05"),
            ("20230512", "2023-05-12"),
            ("2024-02-29", "2024-02-29"),
            ("2023-05-12T08:00:00Z", "2023-05-12"),
            (" 2023-05-12 10:00 ", "2023-05-12"),
            ("", ""),
        ] {
            assert_eq!(parse_date(raw).as_deref(), Ok(want), "{raw}");
        }
        for raw in ["2023-13-01", "2023-02-29", "23-05-12", "去年", "2023-05-12-01", "1066", "2023-005", "五月"] {
            assert!(matches!(parse_date(raw), Err(MetaError::Date(_))), "{raw} should be refused");
        }
        assert!(MetaError::Date("x".into()).to_string().contains("无法识别"));
    }

    #[test]
    fn folders_name_department_type_and_year_and_the_record_wins() {
        let f = DocMeta::from_folders(["心内科", "2021", "指南", "杂项"]);
        let m3 = |d: &str, t: &str, date: &str| DocMeta {
            department: d.into(),
            doc_type: t.into(),
            date: date.into(),
            ..Default::default()
        };
        assert_eq!(f, m3("心内科", "指南", "2021"));
        assert_eq!(f.year(), Some("2021"));
        let rec = m3("", "药品说明书", "2023-05").checked().unwrap();
        let form = m3("药剂科", "制度", "2020");
        let m = rec.or(&f).or(&form);
        assert_eq!(m, m3("心内科", "药品说明书", "2023-05"));
        assert_eq!(DocMeta::default().or(&form), form);
        assert!(m3(&"长".repeat(41), "", "").checked().is_err());
        assert!(DocMeta::default().hash_bytes().is_empty());
        assert_ne!(form.hash_bytes(), m.hash_bytes());
    }

    #[test]
    fn issuer_and_language_are_read_named_and_detected() {
        let rec = serde_json::json!({"发布机构": " 国家卫健委 ", "lang": "EN_us", "科室": "心内科"});
        let m = DocMeta::from_fields(|names| {
            names.iter().find_map(|n| rec.get(*n)).and_then(|v| v.as_str()).unwrap_or("").to_string()
        })
        .unwrap();
        assert_eq!((m.issuer.as_str(), m.language.as_str(), m.department.as_str()), ("国家卫健委", "英文", "心内科"));
        for (raw, want) in
            [("zh-CN", "中文"), ("汉语", "中文"), ("中文", "中文"), ("English", "英文"), ("藏文", "藏文")]
        {
            assert_eq!(language_name(raw), want, "{raw}");
        }
        assert_eq!(detect_language("二甲双胍（metformin）的禁忌症：eGFR<30 ml/min 禁用，需监测 HbA1c。"), "中文");
        assert_eq!(detect_language("Metformin is contraindicated when eGFR is below 30 mL/min per 1.73 m2."), "英文");
        assert_eq!(detect_language("メトホルミンの禁忌について説明します。腎機能"), "日文");
        assert_eq!(detect_language("12345 ……"), "");
        // An issuer or language changes the hash only when given, so older documents keep theirs.
        let plain = DocMeta { department: "心内科".into(), ..Default::default() };
        let issued = DocMeta { issuer: "本院".into(), ..plain.clone() };
        assert!(String::from_utf8(plain.hash_bytes()).unwrap().ends_with("心内科\u{0}\u{0}"));
        assert_ne!(plain.hash_bytes(), issued.hash_bytes());
        let too_long = DocMeta { issuer: "长".repeat(41), ..Default::default() };
        assert!(matches!(too_long.checked(), Err(MetaError::TooLong { what: "来源", .. })));
    }
}
