//! PDF text layer through `lopdf` (Type0/CID fonts decoded with their ToUnicode CMaps, which is how Chinese text
//! from Word, WPS and most typesetting tools is stored).
//!
//! A file that does not end in `%%EOF` is refused as truncated even though the lenient parser could salvage part of
//! it: indexing half a guideline without saying so is worse than asking for the upload again. A PDF with pages but
//! no text is a scan and gets its own error (OCR it first). Decompression of every page and font stream is bounded.

use std::path::Path;

use super::IngestLimits;
use crate::error::{Error, Result};

fn malformed(path: &Path, message: String) -> Error {
    Error::MalformedFile { path: path.to_path_buf(), format: "PDF", message }
}

pub(super) fn extract(path: &Path, bytes: &[u8], limits: &IngestLimits) -> Result<String> {
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
    let pages: Vec<u32> = doc.get_pages().keys().copied().collect();
    if pages.is_empty() {
        return Err(malformed(path, "it has no pages".into()));
    }
    let limit = usize::try_from(limits.max_file_bytes.min(256 << 20)).unwrap_or(256 << 20);
    let mut text = String::new();
    let mut first_error: Option<(u32, String)> = None;
    for &p in &pages {
        for chunk in doc.extract_text_chunks_with_limit(&[p], limit) {
            match chunk {
                Ok(t) => text.push_str(&t),
                Err(lopdf::Error::Decompress(e)) => {
                    return Err(Error::UnsafeArchive {
                        path: path.to_path_buf(),
                        reason: format!("page {p}: a compressed stream expands past the limit ({e}); not indexed"),
                    });
                }
                Err(e) => {
                    first_error.get_or_insert((p, e.to_string()));
                }
            }
        }
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    if text.trim().is_empty() {
        return Err(match first_error {
            Some((p, e)) => malformed(path, format!("no text could be decoded (page {p}: {e})")),
            None => Error::NoText {
                path: path.to_path_buf(),
                message: format!(
                    "its {} page(s) have no text layer (a scan?); run OCR on it (e.g. ocrmypdf) and upload the result",
                    pages.len()
                ),
            },
        });
    }
    Ok(text)
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
        assert!(err.to_string().contains("g.pdf: not a valid PDF file: the file is truncated"), "{err}");
        let err = extract(Path::new("g.pdf"), b"%PDF-1.5\ngarbage\n%%EOF", &IngestLimits::default()).unwrap_err();
        assert_eq!(err.code().as_str(), "malformed_record", "{err}");
        let blank = pdf_bytes(&[vec![]]);
        let err = extract(Path::new("scan.pdf"), &blank, &IngestLimits::default()).unwrap_err();
        assert!(matches!(err, Error::NoText { .. }), "{err}");
    }
}
