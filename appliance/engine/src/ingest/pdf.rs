//! PDF text layer through `lopdf` (Type0/CID fonts decoded with their ToUnicode CMaps, which is how Chinese text
//! from Word, WPS and most typesetting tools is stored).
//!
//! A file that does not end in `%%EOF` is refused as truncated even though the lenient parser could salvage part of
//! it: indexing half a guideline without saying so is worse than asking for the upload again. Pages that are scans
//! (an image and no text) are read by the OCR ([`super::scan`]). Decompression of every page and font stream is
//! bounded.

use std::path::Path;

use super::{IngestLimits, Origin};
use crate::error::{Error, Result};

fn malformed(path: &Path, message: String) -> Error {
    Error::MalformedFile { path: path.to_path_buf(), format: "PDF", message }
}

#[cfg(test)]
fn extract(path: &Path, bytes: &[u8], limits: &IngestLimits) -> Result<String> {
    Ok(super::scan::assemble(&extract_filed(path, bytes, limits)?.0).0)
}

/// The text, in parts (typed pages' text, scanned pages read by the OCR, in page order), and the filing the
/// document information dictionary gives: entries named like the JSONL fields (`/科室`, `/Department`, `/类型`,
/// `/Date`, …). CreationDate and ModDate are not taken as dates: they say when the file was written, not when a
/// guideline was issued.
///
/// A page that shows no text (no `BT` text object in its content) but draws an image is a scan. When scans cannot
/// be read here ([`super::scan`]), a PDF of scans only is refused with the reason, and a mixed one keeps its typed
/// pages.
pub(super) fn extract_filed(
    path: &Path,
    bytes: &[u8],
    limits: &IngestLimits,
) -> Result<(Vec<super::scan::Part>, super::meta::DocMeta)> {
    let head = &bytes[..bytes.len().min(1024)];
    if !head.windows(5).any(|w| w == b"%PDF-") {
        return Err(malformed(path, "it does not start with a %PDF- header; is it really a PDF?".into()));
    }
    let tail = &bytes[bytes.len().saturating_sub(2048)..];
    if !tail.windows(5).any(|w| w == b"%%EOF") {
        return Err(malformed(
            path,
            format!(
                "the file is truncated ({} bytes, no %%EOF end marker); upload the complete file again",
                bytes.len()
            ),
        ));
    }
    let doc = lopdf::Document::load_mem(bytes).map_err(|e| malformed(path, format!("cannot parse it: {e}")))?;
    if doc.is_encrypted() {
        return Err(malformed(path, "it is password-protected; remove the password and upload it again".into()));
    }
    check_cmaps(path, &doc)?;
    let meta = super::meta::DocMeta::from_properties(&info(&doc), None)
        .map_err(|e| malformed(path, format!("document information: {e}")))?;
    let pages: Vec<(u32, lopdf::ObjectId)> = doc.get_pages().into_iter().collect();
    if pages.is_empty() {
        return Err(malformed(path, "it has no pages".into()));
    }
    let limit = usize::try_from(limits.max_file_bytes.min(256 << 20)).unwrap_or(256 << 20);
    let scans: Vec<(u32, lopdf::ObjectId)> =
        pages.iter().copied().filter(|&(_, id)| !shows_text(&doc, id, limit) && has_image(&doc, id)).collect();
    let why_not = super::scan::unavailable_reason();
    let mut text = TextRun { total: 0, first_error: None };
    let mut parts: Vec<(u32, super::scan::Part)> = Vec::new();
    // Runs of typed pages, between the scans, in page order.
    let typed: Vec<u32> = pages.iter().filter(|p| !scans.contains(p)).map(|p| p.0).collect();
    for run in typed.chunk_by(|a, b| b == &(a + 1)) {
        let t = text.extract(path, bytes, limits, &doc, run, limit)?;
        parts.push((run[0], super::scan::Part::Text(t)));
    }
    if why_not.is_none() && !scans.is_empty() {
        let mut next = scans.iter();
        let read = super::scan::read_pages(path, scans.len(), |_| {
            for &(page, id) in next.by_ref() {
                if let Some(img) = crate::ocr::pdf_page_image(&doc, id, page).map_err(|e| named(path, e))? {
                    return Ok(Some((page, img)));
                }
            }
            Ok(None)
        })?;
        parts.extend(read.into_iter().map(|p| (p.page, super::scan::Part::Scanned(p))));
    }
    parts.sort_by_key(|p| p.0);
    let parts: Vec<super::scan::Part> = parts.into_iter().map(|p| p.1).filter(|p| !p.is_blank()).collect();
    if parts.is_empty() {
        return Err(match (text.first_error, why_not) {
            (Some((p, e)), _) => malformed(path, format!("no text could be decoded (page {p}: {e})")),
            (None, Some(why)) if !scans.is_empty() => Error::NoText {
                path: path.to_path_buf(),
                message: format!("它的 {} 页是扫描件，没有文字层；{why}", scans.len()),
            },
            _ => Error::NoText {
                path: path.to_path_buf(),
                message: format!("它的 {} 页既没有文字，也没有可识别的扫描图像", pages.len()),
            },
        });
    }
    Ok((parts, meta))
}

/// A PDF page image error named with the file.
fn named(path: &Path, e: Error) -> Error {
    let Error::InvalidInput(m) = e else { return e };
    malformed(path, m)
}

/// Whether the page's content has a text object (`BT`), the only place a PDF shows text. A page whose content
/// cannot be read is counted as text, so that its error is the text extraction's.
fn shows_text(doc: &lopdf::Document, id: lopdf::ObjectId, limit: usize) -> bool {
    let Ok(content) = doc.get_page_content_with_limit(id, limit) else { return true };
    let delimiter = |b: Option<&u8>| b.is_none_or(|b| b.is_ascii_whitespace() || b"[]()<>/%".contains(b));
    content.windows(2).enumerate().any(|(i, w)| {
        w == b"BT" && delimiter(i.checked_sub(1).and_then(|j| content.get(j))) && delimiter(content.get(i + 2))
    })
}

fn has_image(doc: &lopdf::Document, id: lopdf::ObjectId) -> bool {
    crate::ocr::pdf_page_image_streams(doc, id).is_ok_and(|images| !images.is_empty())
}

/// The text pages' extraction, across runs: the text budget is the file's, and the first page error is kept.
struct TextRun {
    total: u64,
    first_error: Option<(u32, String)>,
}

impl TextRun {
    fn extract(
        &mut self,
        path: &Path,
        bytes: &[u8],
        limits: &IngestLimits,
        doc: &lopdf::Document,
        pages: &[u32],
        limit: usize,
    ) -> Result<String> {
        let budget = (bytes.len() as u64).saturating_mul(limits.max_text_ratio).saturating_add(1 << 20);
        let mut text = String::new();
        // lopdf rebuilds the whole page map on every call (4,000 pages one at a time took 30 s), so pages go in
        // groups: one page first, then as many as the text budget leaves room for at the largest page seen so far
        // (at most 256), so that pages repeating one huge content stream still stop at the page that crosses the
        // budget.
        let (mut next, mut group, mut largest_page) = (0, 1, 0);
        while next < pages.len() {
            let these = &pages[next..(next + group).min(pages.len())];
            let before = text.len();
            for chunk in doc.extract_text_chunks_with_limit(these, limit) {
                match chunk {
                    Ok(t) => text.push_str(&t),
                    Err(lopdf::Error::Decompress(e)) => {
                        return Err(Error::UnsafeArchive {
                            path: path.to_path_buf(),
                            reason: format!(
                                "page {}–{}: a compressed stream expands past the limit ({e}); not indexed",
                                these[0],
                                these[these.len() - 1]
                            ),
                        });
                    }
                    Err(e) => {
                        self.first_error.get_or_insert((these[0], e.to_string()));
                    }
                }
            }
            if !text.ends_with('\n') {
                text.push('\n');
            }
            // Pages that share one huge content stream would otherwise each add all of it (the finding: 11 KB,
            // 128 MiB of text): stop at the budget instead of after the last page.
            let total = self.total + text.len() as u64;
            super::text_budget_check(&Origin::of_file(path), bytes.len(), limits, total)?;
            next += these.len();
            largest_page = largest_page.max((text.len() - before).div_ceil(these.len()));
            let room = budget.saturating_sub(total) / (largest_page.max(4096) as u64);
            group = usize::try_from(room / 2).unwrap_or(256).clamp(1, 256);
        }
        self.total += text.len() as u64;
        Ok(text)
    }
}

/// The document information dictionary's text entries (at most 100, each at most 200 characters).
fn info(doc: &lopdf::Document) -> Vec<(String, String)> {
    let dict = match doc.trailer.get(b"Info") {
        Ok(lopdf::Object::Reference(id)) => doc.get_dictionary(*id).ok(),
        Ok(lopdf::Object::Dictionary(d)) => Some(d),
        _ => None,
    };
    let Some(dict) = dict else { return Vec::new() };
    dict.iter()
        .take(100)
        .filter_map(|(k, v)| {
            let text = lopdf::decode_text_string(v).ok()?;
            Some((String::from_utf8_lossy(k).into_owned(), text.chars().take(200).collect()))
        })
        .collect()
}

/// Codes one bfrange entry may span. The PDF specification allows a range to vary only in its last byte (256
/// codes); an 834-byte file whose single range spanned 2^32 codes once grew `care serve` to 2.6 GB inside the PDF
/// library.
const MAX_BFRANGE_CODES: u64 = 256;
/// Codes all ranges of one CMap may declare (a CJK font maps about 30,000).
const MAX_CMAP_CODES: u64 = 200_000;

/// Every ToUnicode CMap of the file, checked before the PDF library expands it: each bfrange within one last
/// byte, all of them together within [`MAX_CMAP_CODES`].
fn check_cmaps(path: &Path, doc: &lopdf::Document) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for obj in doc.objects.values() {
        let mut streams = Vec::new();
        to_unicode_streams(obj, 0, &mut streams);
        for id in streams {
            if !seen.insert(id) {
                continue;
            }
            let Ok(stream) = doc.get_object(id).and_then(lopdf::Object::as_stream) else { continue };
            let Ok(text) = stream.get_plain_content_with_limit(4 << 20) else {
                return Err(Error::UnsafeArchive {
                    path: path.to_path_buf(),
                    reason: "PDF 字体的 ToUnicode 映射表过大或无法解压 (a ToUnicode CMap expands past 4 MiB)".into(),
                });
            };
            bfrange_codes(&text).map_err(|reason| Error::UnsafeArchive { path: path.to_path_buf(), reason })?;
        }
    }
    Ok(())
}

/// The ToUnicode streams a font dictionary inside `obj` refers to (dictionaries and arrays searched 8 deep).
fn to_unicode_streams(obj: &lopdf::Object, depth: usize, out: &mut Vec<lopdf::ObjectId>) {
    use lopdf::Object;
    if depth > 8 {
        return;
    }
    let dict = match obj {
        Object::Dictionary(d) => d,
        Object::Stream(s) => &s.dict,
        Object::Array(a) => {
            a.iter().for_each(|o| to_unicode_streams(o, depth + 1, out));
            return;
        }
        Object::Null
        | Object::Boolean(_)
        | Object::Integer(_)
        | Object::Real(_)
        | Object::Name(_)
        | Object::String(..)
        | Object::Reference(_) => return,
    };
    for (k, v) in dict.iter() {
        match (k.as_slice(), v) {
            (b"ToUnicode", Object::Reference(id)) => out.push(*id),
            (_, Object::Dictionary(_) | Object::Array(_)) => to_unicode_streams(v, depth + 1, out),
            _ => {}
        }
    }
}

/// Sums the codes the bfrange sections of a CMap declare; refuses a range wider than its last byte allows or a
/// total past [`MAX_CMAP_CODES`]. Entries are `<lo> <hi> <dst>` or `<lo> <hi> [<dst> …]`.
fn bfrange_codes(cmap: &[u8]) -> std::result::Result<u64, String> {
    let text = String::from_utf8_lossy(cmap);
    let mut total = 0u64;
    for section in text.split("beginbfrange").skip(1) {
        let body = section.split("endbfrange").next().unwrap_or("");
        let mut hex: Vec<&str> = Vec::new();
        let mut in_array = false;
        let mut rest = body;
        while let Some(open) = rest.find(['<', '[', ']']) {
            let c = rest.as_bytes()[open];
            rest = &rest[open + 1..];
            match c {
                b'[' => in_array = true,
                b']' => {
                    in_array = false;
                    hex.clear();
                }
                _ => {
                    let end = rest.find('>').unwrap_or(rest.len());
                    let h = &rest[..end];
                    rest = &rest[(end + 1).min(rest.len())..];
                    if in_array {
                        continue;
                    }
                    hex.push(h);
                    if hex.len() == 3 {
                        hex.clear(); // <lo> <hi> <dst>: the destination is not a range bound
                        continue;
                    }
                    if hex.len() == 2 {
                        let code = |s: &str| u64::from_str_radix(s.trim(), 16).unwrap_or(0);
                        let (lo, hi) = (code(hex[0]), code(hex[1]));
                        let span = hi.saturating_sub(lo) + 1;
                        if hi < lo || span > MAX_BFRANGE_CODES || (lo >> 8) != (hi >> 8) {
                            return Err(format!(
                                "PDF 字体映射表（ToUnicode CMap）的一个编码范围 <{}> <{}> 覆盖 {span} 个编码，超过规范允许的 \
                                 {MAX_BFRANGE_CODES} 个；文件可能经过恶意构造，未索引 (a bfrange spans {span} codes)",
                                hex[0].trim(),
                                hex[1].trim()
                            ));
                        }
                        total += span;
                        if total > MAX_CMAP_CODES {
                            return Err(format!(
                                "PDF 字体映射表声明的编码超过 {MAX_CMAP_CODES} 个；文件可能经过恶意构造，未索引 \
                                 (a ToUnicode CMap declares more than {MAX_CMAP_CODES} codes)"
                            ));
                        }
                    }
                }
            }
            // After <lo> <hi>, an array destination ends the entry at its ']'.
            if hex.len() == 2 && rest.trim_start().starts_with('[') {
                hex.clear();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::fixtures::pdf_bytes;

    #[test]
    fn chinese_text_through_tounicode_and_truncation() {
        let pdf =
            pdf_bytes(&[vec!["二甲双胍用药指南", "严重肾功能不全者禁用。"], vec!["第二页：ＣＴ检查前停药48小时。"]]);
        let text = extract(Path::new("g.pdf"), &pdf, &IngestLimits::default()).unwrap();
        assert_eq!(
            crate::text::normalize(&text),
            "二甲双胍用药指南\n严重肾功能不全者禁用。\n第二页：CT检查前停药48小时。"
        );
        let err = extract(Path::new("g.pdf"), &pdf[..pdf.len() * 2 / 3], &IngestLimits::default()).unwrap_err();
        assert!(err.to_string().contains("g.pdf：不是有效的 PDF 文件：the file is truncated"), "{err}");
        let err = extract(Path::new("g.pdf"), b"%PDF-1.5\ngarbage\n%%EOF", &IngestLimits::default()).unwrap_err();
        assert_eq!(err.code().as_str(), "malformed_record", "{err}");
        let blank = pdf_bytes(&[vec![]]);
        assert!(!matches!(
            extract(Path::new("scan.pdf"), &blank, &IngestLimits::default()),
            Err(Error::UnsafeArchive { .. })
        ));
        let err = extract(Path::new("scan.pdf"), &blank, &IngestLimits::default()).unwrap_err();
        assert!(matches!(err, Error::NoText { .. }), "{err}");
    }

    /// Issue 32: page lookup was quadratic (lopdf rebuilds the page map per call; 4,000 pages took 30 s). Pages now go
    /// in groups; every page's text still arrives, in order.
    #[test]
    fn thousands_of_pages_arrive_whole_and_in_order() {
        let labels: Vec<String> = (1..=4000).map(|i| format!("第{i}页：肾功能不全者慎用。")).collect();
        let pages: Vec<Vec<&str>> = labels.iter().map(|l| vec![l.as_str()]).collect();
        let pdf = pdf_bytes(&pages);
        let started = std::time::Instant::now();
        let text = crate::text::normalize(&extract(Path::new("long.pdf"), &pdf, &IngestLimits::default()).unwrap());
        eprintln!("4,000 pages ({} bytes) in {:.2} s", pdf.len(), started.elapsed().as_secs_f64());
        let mut at = 0;
        for l in &labels {
            let found = text[at..].find(l.as_str()).unwrap_or_else(|| panic!("{l} missing or out of order"));
            at += found + l.len();
        }
    }

    #[test]
    fn cmap_ranges_wider_than_their_last_byte_are_refused_before_the_library_expands_them() {
        use crate::ingest::fixtures::pdf_bytes_with_cmap;
        let page = vec![vec!["二甲双胍"]];
        // A conforming range (one last byte) and an array destination are fine.
        let ok = pdf_bytes_with_cmap(
            &page,
            "2 beginbfrange\n<0100> <01FF> <4E00>\n<0200> <0202> [<4E01> <4E02> <4E03>]\nendbfrange\n",
        );
        assert!(extract(Path::new("ok.pdf"), &ok, &IngestLimits::default()).is_ok());
        for bad in
            ["<00000000> <FFFFFFFF> <4E00>", "<000000> <FFFFFF> <4E00>", "<0000> <FFFF> <4E00>", "<00FF> <0100> <4E00>"]
        {
            let pdf = pdf_bytes_with_cmap(&page, &format!("1 beginbfrange\n{bad}\nendbfrange\n"));
            let started = std::time::Instant::now();
            let err = extract(Path::new("bomb.pdf"), &pdf, &IngestLimits::default()).unwrap_err();
            assert!(
                matches!(err, Error::UnsafeArchive { .. }) && err.to_string().contains("ToUnicode"),
                "{bad}: {err}"
            );
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{bad}: refused before any expansion");
        }
        // Many conforming ranges that together declare too much.
        let many: String = (0..1000u32).map(|i| format!("<{:04X}00> <{:04X}FF> <4E00>\n", i, i)).collect();
        let pdf = pdf_bytes_with_cmap(&page, &format!("1000 beginbfrange\n{many}endbfrange\n"));
        assert!(matches!(
            extract(Path::new("many.pdf"), &pdf, &IngestLimits::default()),
            Err(Error::UnsafeArchive { .. })
        ));
    }

    #[test]
    fn the_document_information_files_it() {
        let mut doc = lopdf::Document::load_mem(&pdf_bytes(&[vec!["胸痛中心流程"]])).unwrap();
        let mut dict = lopdf::Dictionary::new();
        dict.set("科室", lopdf::text_string("心内科"));
        dict.set("类型", lopdf::text_string("制度"));
        dict.set("Date", lopdf::Object::string_literal("2022-03-01"));
        dict.set("ModDate", lopdf::Object::string_literal("D:20240101000000Z"));
        let info = doc.add_object(dict);
        doc.trailer.set("Info", info);
        let mut bytes = Vec::new();
        doc.save_to(&mut bytes).unwrap();
        let (parts, meta) = extract_filed(Path::new("p.pdf"), &bytes, &IngestLimits::default()).unwrap();
        let text = super::super::scan::assemble(&parts).0;
        assert!(text.contains("胸痛中心流程"), "{text}");
        assert_eq!(
            (meta.department.as_str(), meta.doc_type.as_str(), meta.date.as_str()),
            ("心内科", "制度", "2022-03-01")
        );
        // No information dictionary: no filing.
        let (_, meta) =
            extract_filed(Path::new("p.pdf"), &pdf_bytes(&[vec!["正文"]]), &IngestLimits::default()).unwrap();
        assert!(meta.is_empty());
    }
}
