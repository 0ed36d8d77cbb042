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

/// (title, text).
pub(super) fn extract(path: &Path, bytes: &[u8], limits: &IngestLimits) -> Result<(String, String)> {
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
    let title = match archive::read_named(path, &mut zip, "docProps/core.xml", limits, "DOCX") {
        Ok(Some(core)) => core_title(&core).unwrap_or_default(),
        _ => String::new(),
    };
    Ok((title, text))
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
fn core_title(xml: &[u8]) -> Option<String> {
    let mut reader = Reader::from_reader(xml);
    let mut buf = Vec::new();
    let mut in_title = false;
    let mut title = String::new();
    loop {
        match reader.read_event_into(&mut buf).ok()? {
            Event::Start(e) if e.name().as_ref() == b"dc:title" => in_title = true,
            Event::End(e) if e.name().as_ref() == b"dc:title" => break,
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
        let (title, text) = extract(Path::new("p.docx"), &d, &IngestLimits::default()).unwrap();
        assert_eq!(title, "二甲双胍用药规范");
        assert_eq!(text, "# 二甲双胍\n## 禁忌症\n严重肾功能不全 & 酸中毒者禁用。\n");
        let err = extract(Path::new("p.docx"), b"plain text pretending", &IngestLimits::default()).unwrap_err();
        assert!(err.to_string().contains("p.docx: not a valid DOCX file: not a zip archive"), "{err}");
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
        let (_, text) =
            extract(Path::new("l.docx"), &docx_package(&layout, None, None), &IngestLimits::default()).unwrap();
        assert_eq!(crate::text::normalize(&text), "# 用法\n每日一次。");
    }
}
