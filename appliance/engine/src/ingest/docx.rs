//! DOCX (Word, WPS): the text of `word/document.xml`, paragraph by paragraph, with heading paragraphs (styles
//! `Heading1`.., `Title`, Chinese Word's numeric style ids `1`..`6`, or an outline level) as Markdown headings.
//! The title comes from `docProps/core.xml` when set.
//!
//! Structure is kept as light markup that the chunker and BM25 are indifferent to: a numbered or bulleted paragraph
//! gets the marker Word shows for it (`3. `, `• `, computed from `word/numbering.xml`), and a table row is one
//! line, `| cell | cell |` (see [`crate::docview`], which renders them as lists and tables).

use std::collections::HashMap;
use std::path::Path;

use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;

use super::archive;
use super::{IngestLimits, TableBuf};
use crate::error::{Error, Result};

fn malformed(path: &Path, message: String) -> Error {
    Error::MalformedFile { path: path.to_path_buf(), format: "DOCX", message }
}

/// (title, text, filing from the document's properties).
pub(super) fn extract(
    path: &Path,
    bytes: &[u8],
    limits: &IngestLimits,
) -> Result<(String, String, super::meta::DocMeta)> {
    if !bytes.starts_with(b"PK") {
        let hint = if bytes.starts_with(&[0xD0, 0xCF, 0x11, 0xE0]) {
            "it is an old binary .doc file renamed to .docx; save it as .docx from Word or WPS"
        } else {
            "a .docx file is a zip archive and this one does not start like one; save it again as .docx"
        };
        return Err(malformed(path, format!("not a zip archive: {hint}")));
    }
    let mut zip = archive::open(path, bytes, "DOCX")?;
    let xml = archive::read_named(path, &mut zip, "word/document.xml", limits, "DOCX")?
        .ok_or_else(|| malformed(path, "the archive has no word/document.xml; it is not a Word document".into()))?;
    let lists = match archive::read_named(path, &mut zip, "word/numbering.xml", limits, "DOCX") {
        Ok(Some(n)) => numbering(&n),
        _ => Numbering::default(),
    };
    let text = document_text(path, &xml, &lists)?;
    let (title, category) = match archive::read_named(path, &mut zip, "docProps/core.xml", limits, "DOCX") {
        Ok(Some(core)) => (core_value(&core, b"dc:title").unwrap_or_default(), core_value(&core, b"cp:category")),
        _ => (String::new(), None),
    };
    let custom = match archive::read_named(path, &mut zip, "docProps/custom.xml", limits, "DOCX") {
        Ok(Some(xml)) => custom_properties(&xml),
        _ => Vec::new(),
    };
    Ok((title, text, filing(path, &custom, category.as_deref())?))
}

/// The department, type and date a Word document's properties give: custom properties named like the JSONL
/// fields (科室, 类型, 日期, …; 文件 → 属性 → 自定义 in Word and WPS), and the category (类别) as the type. Save
/// and creation times are not read as dates: they say when a file was edited, not when a guideline was issued.
fn filing(path: &Path, custom: &[(String, String)], category: Option<&str>) -> Result<super::meta::DocMeta> {
    super::meta::DocMeta::from_properties(custom, category)
        .map_err(|e| malformed(path, format!("document properties: {e}")))
}

/// (name, text value) of each custom property (`docProps/custom.xml`).
#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "quick-xml events this reader does not use are skipped, new ones too"
)]
fn custom_properties(xml: &[u8]) -> Vec<(String, String)> {
    let mut reader = Reader::from_reader(xml);
    let mut buf = Vec::new();
    let (mut out, mut name, mut value) = (Vec::new(), None::<String>, String::new());
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) if e.local_name().as_ref() == b"property" => {
                name = attr(&e, b"name");
                value.clear();
            }
            Ok(Event::Text(t)) if name.is_some() => value.push_str(&t.unescape().unwrap_or_default()),
            Ok(Event::End(e)) if e.local_name().as_ref() == b"property" => {
                if let Some(n) = name.take() {
                    out.push((n, value.trim().to_string()));
                }
                if out.len() >= 200 {
                    break;
                }
            }
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
        buf.clear();
    }
    out
}

fn attr(e: &BytesStart<'_>, key: &[u8]) -> Option<String> {
    e.attributes().flatten().find(|a| a.key.as_ref() == key).map(|a| String::from_utf8_lossy(&a.value).into_owned())
}

fn heading_level(style: &str) -> Option<usize> {
    let s = style.to_ascii_lowercase();
    if s == "title" {
        return Some(1);
    }
    let digits = s.strip_prefix("heading").map(str::trim).unwrap_or(&s);
    match digits.parse::<usize>() {
        Ok(n @ 1..=6) => Some(n),
        _ => None,
    }
}

/// How a list level is numbered (`word/numbering.xml`): its format and first number.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LevelFormat {
    fmt: String,
    start: u32,
}

/// The lists of `word/numbering.xml`: which abstract list each `w:num` instance uses, and each abstract list's
/// level formats.
#[derive(Debug, Default)]
struct Numbering {
    abstracts: HashMap<String, HashMap<u8, LevelFormat>>,
    nums: HashMap<String, String>,
}

impl Numbering {
    fn level(&self, num_id: &str, ilvl: u8) -> Option<&LevelFormat> {
        self.abstracts.get(self.nums.get(num_id)?)?.get(&ilvl)
    }
}

/// Reads `word/numbering.xml`; a part that does not parse gives no formats (items are then numbered 1, 2, …).
#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "quick-xml events this reader does not use are skipped, new ones too"
)]
fn numbering(xml: &[u8]) -> Numbering {
    let mut n = Numbering::default();
    let mut reader = Reader::from_reader(xml);
    let mut buf = Vec::new();
    let (mut abs, mut lvl, mut num): (Option<String>, Option<u8>, Option<String>) = (None, None, None);
    while let Ok(ev) = reader.read_event_into(&mut buf) {
        match ev {
            Event::Start(e) | Event::Empty(e) => match e.name().as_ref() {
                b"w:abstractNum" => abs = attr(&e, b"w:abstractNumId"),
                b"w:lvl" => lvl = attr(&e, b"w:ilvl").and_then(|v| v.parse().ok()),
                b"w:num" => num = attr(&e, b"w:numId"),
                b"w:numFmt" | b"w:start" => {
                    if let (Some(a), Some(l)) = (&abs, lvl) {
                        let f = n
                            .abstracts
                            .entry(a.clone())
                            .or_default()
                            .entry(l)
                            .or_insert(LevelFormat { fmt: "decimal".into(), start: 1 });
                        let val = attr(&e, b"w:val").unwrap_or_default();
                        if e.name().as_ref() == b"w:numFmt" {
                            f.fmt = val;
                        } else {
                            f.start = val.parse().unwrap_or(1);
                        }
                    }
                }
                b"w:abstractNumId" => {
                    if let (Some(id), Some(a)) = (&num, attr(&e, b"w:val")) {
                        n.nums.insert(id.clone(), a);
                    }
                }
                _ => {}
            },
            Event::End(e) => match e.name().as_ref() {
                b"w:abstractNum" => abs = None,
                b"w:lvl" => lvl = None,
                b"w:num" => num = None,
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    n
}

/// Chinese numerals for list numbers formatted `chineseCounting` and the like (一、二、…、九十九).
fn chinese_number(n: u32) -> String {
    const D: [char; 10] = ['零', '一', '二', '三', '四', '五', '六', '七', '八', '九'];
    match n {
        0..=9 => D[n as usize].to_string(),
        10..=19 => format!("十{}", if n > 10 { D[(n % 10) as usize].to_string() } else { String::new() }),
        20..=99 => format!(
            "{}十{}",
            D[(n / 10) as usize],
            if n.is_multiple_of(10) { String::new() } else { D[(n % 10) as usize].to_string() }
        ),
        _ => n.to_string(),
    }
}

/// The marker written before a list item, as the document view and a reader of the plain text expect it: `3. `
/// for numbered items (whatever Word's glyphs: the view renders `<ol>`), `• ` for bullets, `三、` for Chinese
/// counting (a paragraph, as printed), nothing for `none`.
fn marker(fmt: &str, n: u32) -> String {
    match fmt {
        "bullet" => "• ".into(),
        "none" => String::new(),
        f if f.starts_with("chinese") || f.starts_with("ideograph") || f.starts_with("taiwanese") => {
            format!("{}、", chinese_number(n))
        }
        _ => format!("{n}. "),
    }
}

#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "quick-xml events this reader does not use are skipped, new ones too"
)]
fn document_text(path: &Path, xml: &[u8], lists: &Numbering) -> Result<String> {
    let mut reader = Reader::from_reader(xml);
    reader.config_mut().trim_text(false);
    let mut out = String::new();
    let mut para = String::new();
    let mut level: Option<usize> = None;
    // The paragraph's list membership: numbering instance and level (`w:numPr`), or a list paragraph style.
    let (mut num_id, mut ilvl, mut list_style): (Option<String>, u8, Option<&'static str>) = (None, 0, None);
    let mut in_num_pr = false;
    // Next number per (numbering instance, level); a deeper level restarts when a shallower item comes.
    let mut counters: HashMap<(String, u8), u32> = HashMap::new();
    let mut tables: Vec<TableBuf> = Vec::new();
    let mut in_text = false;
    let mut buf = Vec::new();
    loop {
        let ev = reader
            .read_event_into(&mut buf)
            .map_err(|e| malformed(path, format!("word/document.xml at byte {}: {e}", reader.buffer_position())))?;
        match ev {
            Event::Start(e) | Event::Empty(e) if matches!(e.name().as_ref(), b"w:pStyle") => {
                let style = attr(&e, b"w:val").unwrap_or_default();
                level = heading_level(&style).or(level);
                let s = style.to_ascii_lowercase();
                if s.starts_with("listnumber") {
                    list_style = Some("decimal");
                } else if s.starts_with("listbullet") {
                    list_style = Some("bullet");
                }
            }
            Event::Start(e) | Event::Empty(e) if matches!(e.name().as_ref(), b"w:outlineLvl") => {
                if let Some(n) = attr(&e, b"w:val").and_then(|v| v.parse::<usize>().ok()).filter(|n| *n < 6) {
                    level = Some(n + 1);
                }
            }
            Event::Start(e) if e.name().as_ref() == b"w:numPr" => in_num_pr = true,
            Event::End(e) if e.name().as_ref() == b"w:numPr" => in_num_pr = false,
            Event::Start(e) | Event::Empty(e) if in_num_pr && e.name().as_ref() == b"w:ilvl" => {
                ilvl = attr(&e, b"w:val").and_then(|v| v.parse().ok()).unwrap_or(0).min(8);
            }
            Event::Start(e) | Event::Empty(e) if in_num_pr && e.name().as_ref() == b"w:numId" => {
                // numId 0 switches numbering off for a paragraph whose style would number it.
                num_id = attr(&e, b"w:val");
            }
            Event::Start(e) if e.name().as_ref() == b"w:p" => {
                para.clear();
                level = None;
                (num_id, ilvl, list_style) = (None, 0, None);
            }
            Event::Start(e) if e.name().as_ref() == b"w:t" => in_text = true,
            Event::End(e) if e.name().as_ref() == b"w:t" => in_text = false,
            Event::Empty(e) if e.name().as_ref() == b"w:tab" => para.push('\t'),
            Event::Empty(e) if matches!(e.name().as_ref(), b"w:br" | b"w:cr") => para.push('\n'),
            Event::Text(t) if in_text => {
                para.push_str(&t.unescape().map_err(|e| malformed(path, format!("word/document.xml: {e}")))?);
            }
            Event::End(e) if e.name().as_ref() == b"w:p" => {
                let p = para.trim();
                let dest = match tables.last_mut() {
                    Some(t) => &mut t.cell,
                    None => &mut out,
                };
                if !p.is_empty() {
                    if let Some(l) = level {
                        dest.push_str(&"#".repeat(l));
                        dest.push(' ');
                        dest.push_str(&p.replace('\n', " "));
                    } else {
                        let list = match (num_id.as_deref(), list_style) {
                            (Some("0"), _) | (None, None) => None,
                            (Some(id), _) => Some((id.to_string(), lists.level(id, ilvl).cloned())),
                            (None, Some(fmt)) => {
                                Some((format!("style:{fmt}"), Some(LevelFormat { fmt: fmt.into(), start: 1 })))
                            }
                        };
                        if let Some((id, fmt)) = list {
                            let fmt = fmt.unwrap_or(LevelFormat { fmt: "decimal".into(), start: 1 });
                            counters.retain(|(i, l), _| *i != id || *l <= ilvl);
                            let n = counters.entry((id, ilvl)).or_insert(fmt.start);
                            dest.push_str(&marker(&fmt.fmt, *n));
                            *n += 1;
                        }
                        dest.push_str(p);
                    }
                    dest.push('\n');
                }
                para.clear();
                level = None;
                (num_id, ilvl, list_style) = (None, 0, None);
            }
            Event::Start(e) if e.name().as_ref() == b"w:tbl" => tables.push(TableBuf::default()),
            Event::End(e) if e.name().as_ref() == b"w:tc" => {
                if let Some(t) = tables.last_mut() {
                    t.end_cell();
                }
            }
            Event::Empty(e) if e.name().as_ref() == b"w:tc" => {
                if let Some(t) = tables.last_mut() {
                    t.end_cell();
                }
            }
            Event::End(e) if e.name().as_ref() == b"w:tr" => {
                if let Some(t) = tables.last_mut() {
                    t.end_row();
                }
            }
            Event::End(e) if e.name().as_ref() == b"w:tbl" => {
                if let Some(t) = tables.pop() {
                    let text = t.finish();
                    match tables.last_mut() {
                        Some(parent) => {
                            parent.layout = true;
                            parent.cell.push_str(&text);
                        }
                        None => out.push_str(&text),
                    }
                }
            }
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    // Tables left open by a truncated part still give their text.
    while let Some(t) = tables.pop() {
        let text = t.finish();
        match tables.last_mut() {
            Some(parent) => parent.cell.push_str(&text),
            None => out.push_str(&text),
        }
    }
    Ok(out)
}

#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "quick-xml events this reader does not use are skipped, new ones too"
)]
/// The text of one element of `docProps/core.xml` (`dc:title`, `cp:category`), when set.
fn core_value(xml: &[u8], element: &[u8]) -> Option<String> {
    let mut reader = Reader::from_reader(xml);
    let mut buf = Vec::new();
    let mut in_title = false;
    let mut title = String::new();
    loop {
        match reader.read_event_into(&mut buf).ok()? {
            Event::Start(e) if e.name().as_ref() == element => in_title = true,
            Event::End(e) if e.name().as_ref() == element => break,
            Event::Text(t) if in_title => title.push_str(&t.unescape().ok()?),
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    let t = title.trim().to_string();
    (!t.is_empty()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::fixtures::{docx_bytes, docx_package};

    #[test]
    fn paragraphs_headings_and_title() {
        let d = docx_bytes(
            &[
                (Some("1"), "二甲双胍"),
                (Some("Heading2"), "禁忌症"),
                (None, "严重肾功能不全 & 酸中毒者禁用。"),
                (None, "  "),
            ],
            Some("二甲双胍用药规范"),
        );
        let (title, text, _) = extract(Path::new("p.docx"), &d, &IngestLimits::default()).unwrap();
        assert_eq!(title, "二甲双胍用药规范");
        assert_eq!(text, "# 二甲双胍\n## 禁忌症\n严重肾功能不全 & 酸中毒者禁用。\n");
        let err = extract(Path::new("p.docx"), b"plain text pretending", &IngestLimits::default()).unwrap_err();
        assert!(err.to_string().contains("p.docx：不是有效的 DOCX 文件：not a zip archive"), "{err}");
    }

    fn p(text: &str, num: Option<(u32, u32)>) -> String {
        let ppr = num.map_or(String::new(), |(id, lvl)| {
            format!("<w:pPr><w:numPr><w:ilvl w:val=\"{lvl}\"/><w:numId w:val=\"{id}\"/></w:numPr></w:pPr>")
        });
        format!("<w:p>{ppr}<w:r><w:t>{text}</w:t></w:r></w:p>")
    }

    fn cell(text: &str) -> String {
        format!("<w:tc><w:tcPr/>{}</w:tc>", p(text, None))
    }

    #[test]
    fn numbered_and_bulleted_lists_and_tables_keep_their_structure() {
        // Word's numbering: abstract list 0 numbers level 0 decimally and bullets level 1; list 1 (numId 2) starts
        // at 3; numId 3 is Chinese counting.
        let numbering = "<w:abstractNum w:abstractNumId=\"0\">\
            <w:lvl w:ilvl=\"0\"><w:start w:val=\"1\"/><w:numFmt w:val=\"decimal\"/><w:lvlText w:val=\"%1.\"/></w:lvl>\
            <w:lvl w:ilvl=\"1\"><w:start w:val=\"1\"/><w:numFmt w:val=\"bullet\"/><w:lvlText w:val=\"\u{f0b7}\"/></w:lvl>\
            </w:abstractNum>\
            <w:abstractNum w:abstractNumId=\"1\"><w:lvl w:ilvl=\"0\"><w:start w:val=\"3\"/><w:numFmt w:val=\"decimal\"/></w:lvl></w:abstractNum>\
            <w:abstractNum w:abstractNumId=\"2\"><w:lvl w:ilvl=\"0\"><w:numFmt w:val=\"chineseCounting\"/></w:lvl></w:abstractNum>\
            <w:num w:numId=\"1\"><w:abstractNumId w:val=\"0\"/></w:num>\
            <w:num w:numId=\"2\"><w:abstractNumId w:val=\"1\"/></w:num>\
            <w:num w:numId=\"3\"><w:abstractNumId w:val=\"2\"/></w:num>";
        let body = [
            "<w:p><w:pPr><w:pStyle w:val=\"Heading2\"/></w:pPr><w:r><w:t>禁忌症</w:t></w:r></w:p>".to_string(),
            p("下列患者禁用：", None),
            p("严重肾功能不全；", Some((1, 0))),
            p("急性心肌梗死；", Some((1, 0))),
            p("包括休克", Some((1, 1))),
            p("对本品过敏者。", Some((1, 0))),
            p("不是列表", Some((0, 0))),
            p("接着第三条", Some((2, 0))),
            p("概述", Some((3, 0))),
            format!(
                "<w:tbl><w:tblPr/><w:tr>{}{}</w:tr><w:tr>{}{}</w:tr><w:tr>{}<w:tc/></w:tr></w:tbl>",
                cell("药物"),
                cell("剂量"),
                cell("二甲双胍"),
                cell("500 mg | 每日两次"),
                cell("阿司匹林")
            ),
            p("表后正文。", None),
        ]
        .concat();
        let d = docx_package(&body, Some(numbering), None);
        let f = crate::ingest::parse_bytes(Path::new("list.docx"), crate::ingest::FileKind::Docx, &d).unwrap();
        assert_eq!(
            f.documents[0].text,
            "## 禁忌症\n下列患者禁用：\n1. 严重肾功能不全；\n2. 急性心肌梗死；\n• 包括休克\n3. 对本品过敏者。\n不是列表\n\
             3. 接着第三条\n一、概述\n| 药物 | 剂量 |\n| 二甲双胍 | 500 mg ¦ 每日两次 |\n| 阿司匹林 | |\n表后正文。"
        );
        // Each item and each row is a line of its own, so a sentence of its own for the chunker.
        let view = crate::docview::blocks(&f.documents[0].text, &|t| {
            vec![crate::docview::Part { text: t.to_string(), mark: false }]
        });
        assert!(
            view.iter()
                .any(|b| matches!(b, crate::docview::Block::List { ordered: true, items, .. } if items.len() == 2))
        );
        assert!(view.iter().any(|b| matches!(b, crate::docview::Block::Table { rows, .. } if rows.len() == 3)));
        // A table holding a heading is page layout: its cells stay paragraphs.
        let layout = format!(
            "<w:tbl><w:tr><w:tc><w:p><w:pPr><w:pStyle w:val=\"Heading1\"/></w:pPr><w:r><w:t>用法</w:t></w:r></w:p>{}</w:tc></w:tr></w:tbl>",
            p("每日一次。", None)
        );
        let (_, text, _) =
            extract(Path::new("l.docx"), &docx_package(&layout, None, None), &IngestLimits::default()).unwrap();
        assert_eq!(crate::text::normalize(&text), "# 用法\n每日一次。");
    }

    #[test]
    fn department_type_and_date_come_from_custom_properties_and_the_category() {
        use crate::ingest::fixtures::zip_bytes;
        let with = |core: &str, custom: Option<&str>| {
            let base = docx_package("<w:p><w:r><w:t>正文</w:t></w:r></w:p>", None, None);
            let mut zip = zip::ZipArchive::new(std::io::Cursor::new(base)).unwrap();
            let mut members: Vec<(String, Vec<u8>)> = (0..zip.len())
                .map(|i| {
                    let mut f = zip.by_index(i).unwrap();
                    let mut b = Vec::new();
                    std::io::Read::read_to_end(&mut f, &mut b).unwrap();
                    (f.name().unwrap().to_string(), b)
                })
                .collect();
            members.push((
                "docProps/core.xml".into(),
                format!(
                    "<?xml version=\"1.0\"?><cp:coreProperties xmlns:cp=\"http://schemas.openxmlformats.org/package/2006/metadata/core-properties\" \
                     xmlns:dc=\"http://purl.org/dc/elements/1.1/\">{core}</cp:coreProperties>"
                )
                .into_bytes(),
            ));
            if let Some(c) = custom {
                members.push((
                    "docProps/custom.xml".into(),
                    format!(
                        "<?xml version=\"1.0\"?><Properties xmlns=\"http://schemas.openxmlformats.org/officeDocument/2006/custom-properties\" \
                         xmlns:vt=\"http://schemas.openxmlformats.org/officeDocument/2006/docPropsVTypes\">{c}</Properties>"
                    )
                    .into_bytes(),
                ));
            }
            let refs: Vec<(&str, &[u8])> = members.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
            zip_bytes(&refs)
        };
        let prop = |name: &str, v: &str| {
            format!(
                "<property fmtid=\"{{D5CDD505-2E9C-101B-9397-08002B2CF9AE}}\" pid=\"2\" name=\"{name}\"><vt:lpwstr>{v}</vt:lpwstr></property>"
            )
        };
        let d = with(
            "<dc:title>胸痛中心流程</dc:title><cp:category>制度</cp:category>",
            Some(&format!("{}{}", prop("科室", "心内科"), prop("发布日期", "2022年3月"))),
        );
        let (title, _, meta) = extract(Path::new("p.docx"), &d, &IngestLimits::default()).unwrap();
        assert_eq!(title, "胸痛中心流程");
        assert_eq!(
            (meta.department.as_str(), meta.doc_type.as_str(), meta.date.as_str()),
            ("心内科", "制度", "2022-03")
        );
        // A custom type overrides the category; no properties, no filing (and no save time taken for a date).
        let d = with(
            "<cp:category>制度</cp:category><dcterms:modified>2024-01-01T00:00:00Z</dcterms:modified>",
            Some(&prop("类型", "指南")),
        );
        let (_, _, meta) = extract(Path::new("p.docx"), &d, &IngestLimits::default()).unwrap();
        assert_eq!((meta.doc_type.as_str(), meta.date.as_str()), ("指南", ""));
        // A date nobody can read refuses the file, naming the property.
        let d = with("", Some(&prop("日期", "去年")));
        let err = extract(Path::new("p.docx"), &d, &IngestLimits::default()).unwrap_err().to_string();
        assert!(err.contains("document properties") && err.contains("去年"), "{err}");
    }
}
