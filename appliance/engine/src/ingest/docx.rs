//! DOCX (Word, WPS): the text of `word/document.xml`, paragraph by paragraph, with heading paragraphs (styles
//! `Heading1`.., `Title`, Chinese Word's numeric style ids `1`..`6`, or an outline level) as Markdown headings.
//! The title comes from `docProps/core.xml` when set.

use std::path::Path;

use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;

use super::IngestLimits;
use super::archive;
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
    let text = document_text(path, &xml)?;
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

#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "quick-xml events this reader does not use are skipped, new ones too"
)]
fn document_text(path: &Path, xml: &[u8]) -> Result<String> {
    let mut reader = Reader::from_reader(xml);
    reader.config_mut().trim_text(false);
    let mut out = String::new();
    let mut para = String::new();
    let mut level: Option<usize> = None;
    let mut in_text = false;
    let mut buf = Vec::new();
    loop {
        let ev = reader
            .read_event_into(&mut buf)
            .map_err(|e| malformed(path, format!("word/document.xml at byte {}: {e}", reader.buffer_position())))?;
        match ev {
            Event::Start(e) | Event::Empty(e) if matches!(e.name().as_ref(), b"w:pStyle") => {
                level = attr(&e, b"w:val").as_deref().and_then(heading_level).or(level);
            }
            Event::Start(e) | Event::Empty(e) if matches!(e.name().as_ref(), b"w:outlineLvl") => {
                if let Some(n) = attr(&e, b"w:val").and_then(|v| v.parse::<usize>().ok()).filter(|n| *n < 6) {
                    level = Some(n + 1);
                }
            }
            Event::Start(e) if e.name().as_ref() == b"w:p" => {
                para.clear();
                level = None;
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
                if !p.is_empty() {
                    if let Some(l) = level {
                        out.push_str(&"#".repeat(l));
                        out.push(' ');
                        out.push_str(&p.replace('\n', " "));
                    } else {
                        out.push_str(p);
                    }
                    out.push('\n');
                }
                para.clear();
                level = None;
            }
            Event::End(e) if e.name().as_ref() == b"w:tc" => para.push(' '),
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
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
    use crate::ingest::fixtures::docx_bytes;

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
}
