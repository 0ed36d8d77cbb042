//! Text encodings: UTF-8, UTF-16 (with or without BOM), GB18030/GBK and Big5, detected or given per file.
//!
//! Order of decisions: a byte-order mark wins; then valid UTF-8; then UTF-16 recognised by its NUL pattern; then
//! binary data is refused (NUL bytes or many control characters); then chardetng's guess, preferring GB18030 (a
//! superset of GBK and GB2312) unless the guess is Big5. Decoding never substitutes U+FFFD silently: bytes that do
//! not decode are an error naming the encoding and the offset, so a mis-detected file is noticed, not indexed as
//! mojibake. An explicit encoding (the upload's `encoding` option) bypasses detection.

use std::path::Path;

use encoding_rs::{BIG5, Encoding, GB18030, UTF_16BE, UTF_16LE};

use crate::error::{Error, Result};

/// Decodes `bytes` to text. `forced` is an encoding label (`gb18030`, `gbk`, `big5`, `utf-16le`, …).
pub fn decode(path: &Path, bytes: &[u8], forced: Option<&str>) -> Result<String> {
    if let Some(label) = forced.map(str::trim).filter(|l| !l.is_empty()) {
        let enc = Encoding::for_label(label.as_bytes()).ok_or_else(|| {
            Error::InvalidInput(format!("未知编码 {label:?}：请用 utf-8、utf-16le、utf-16be、gb18030、gbk 或 big5"))
        })?;
        // A BOM of the same encoding is not content.
        let body = match Encoding::for_bom(bytes) {
            Some((bom_enc, n)) if bom_enc == enc => &bytes[n..],
            _ => bytes,
        };
        return decode_strict(path, body, enc, "按指定的编码");
    }
    if let Some((enc, n)) = Encoding::for_bom(bytes) {
        return decode_strict(path, &bytes[n..], enc, "按其字节顺序标记");
    }
    if let Ok(s) = std::str::from_utf8(bytes) {
        if looks_binary(s.as_bytes()) {
            return Err(binary(path));
        }
        return Ok(s.to_string());
    }
    if let Some(enc) = utf16_without_bom(bytes) {
        return decode_strict(path, bytes, enc, "按其 NUL 字节特征");
    }
    if looks_binary(bytes) {
        return Err(binary(path));
    }
    let mut det = chardetng::EncodingDetector::new(chardetng::Iso2022JpDetection::Deny);
    det.feed(bytes, true);
    let guess = det.guess(None, chardetng::Utf8Detection::Allow);
    let order: Vec<&'static Encoding> = if guess == BIG5 { vec![BIG5, GB18030] } else { vec![GB18030, BIG5] };
    for enc in order {
        if let Some(s) = enc.decode_without_bom_handling_and_without_replacement(bytes) {
            return Ok(s.into_owned());
        }
    }
    let valid_up_to = std::str::from_utf8(bytes).err().map_or(0, |e| e.valid_up_to());
    Err(Error::Encoding {
        path: path.to_path_buf(),
        message: format!(
            "文本既不是有效的 UTF-8（第一个无效字节在偏移 {valid_up_to}），也不是 UTF-16、GB18030/GBK 或 Big5 \
             （检测结果倾向 {}）；请转换为 UTF-8（如 `iconv -f <编码> -t UTF-8`），或明确指定其编码（上传选项 \
             `encoding`，命令行 `--encoding`）",
            guess.name()
        ),
    })
}

fn decode_strict(path: &Path, bytes: &[u8], enc: &'static Encoding, how: &str) -> Result<String> {
    let (text, had_errors) = enc.decode_without_bom_handling(bytes);
    if had_errors {
        // Find the first offending position for the message.
        let mut decoder = enc.new_decoder_without_bom_handling();
        let mut out = String::with_capacity(bytes.len() * 2);
        let (res, read) = decoder.decode_to_string_without_replacement(bytes, &mut out, true);
        let offset = if let encoding_rs::DecoderResult::Malformed(bad, _) = res {
            read.saturating_sub(bad as usize)
        } else {
            read
        };
        return Err(Error::Encoding {
            path: path.to_path_buf(),
            message: format!(
                "不是有效的 {}（{how}）：偏移 {offset} 处的字节无法解码；请指定文件真实的编码（上传选项 \
                 `encoding`，命令行 `--encoding`），或将其转换为 UTF-8",
                enc.name()
            ),
        });
    }
    let text = text.into_owned();
    if looks_binary(text.as_bytes()) {
        return Err(binary(path));
    }
    Ok(text)
}

fn binary(path: &Path) -> Error {
    Error::Encoding {
        path: path.to_path_buf(),
        message: "看起来是二进制数据而不是文本（含 NUL 或控制字符）；请确认文件内容与其扩展名相符".into(),
    }
}

/// NUL bytes, or more than 2% control characters other than tab/CR/LF/FF/ESC/SUB, in the first 64 KiB.
fn looks_binary(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(65536)];
    if head.contains(&0) {
        return true;
    }
    let controls =
        head.iter().filter(|&&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c | 0x1a | 0x1b)).count();
    controls * 50 > head.len().max(1)
}

/// UTF-16 text without a BOM has NUL in one byte of most ASCII characters (and CJK text decodes as valid pairs).
fn utf16_without_bom(bytes: &[u8]) -> Option<&'static Encoding> {
    if bytes.len() < 4 || !bytes.len().is_multiple_of(2) {
        return None;
    }
    let head = &bytes[..bytes.len().min(4096) & !1];
    let pairs = head.len() / 2;
    let even_nul = head.iter().step_by(2).filter(|&&b| b == 0).count();
    let odd_nul = head.iter().skip(1).step_by(2).filter(|&&b| b == 0).count();
    let enc = if odd_nul * 4 > pairs && even_nul * 20 < pairs {
        UTF_16LE
    } else if even_nul * 4 > pairs && odd_nul * 20 < pairs {
        UTF_16BE
    } else {
        return None;
    };
    enc.decode_without_bom_handling_and_without_replacement(bytes).map(|_| enc)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "二甲双胍是2型糖尿病的一线用药，严重肾功能不全者禁用。";

    #[test]
    fn detects_utf8_utf16_gb18030_big5() {
        let p = Path::new("x.txt");
        assert_eq!(decode(p, TEXT.as_bytes(), None).unwrap(), TEXT);
        let (gb, _, _) = GB18030.encode(TEXT);
        assert_eq!(decode(p, &gb, None).unwrap(), TEXT);
        let (gbk, _, _) = encoding_rs::GBK.encode(TEXT);
        assert_eq!(decode(p, &gbk, Some("gbk")).unwrap(), TEXT);
        let trad = "二甲雙胍是第二型糖尿病的一線用藥，嚴重腎功能不全者禁用。這是繁體中文的說明文字。";
        let (b5, _, _) = BIG5.encode(trad);
        assert_eq!(decode(p, &b5, None).unwrap(), trad);
        let mut le = vec![0xFF, 0xFE];
        le.extend(TEXT.encode_utf16().flat_map(|u| u.to_le_bytes()));
        assert_eq!(decode(p, &le, None).unwrap(), TEXT);
        let ascii_ish = "CT and MRI 检查";
        let be: Vec<u8> = ascii_ish.encode_utf16().flat_map(|u| u.to_be_bytes()).collect();
        assert_eq!(decode(p, &be, None).unwrap(), ascii_ish);
    }

    #[test]
    fn refuses_binary_and_wrong_forced_encoding() {
        let p = Path::new("junk.txt");
        let junk: Vec<u8> = (0..2048u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let err = decode(p, &junk, None).unwrap_err();
        assert_eq!(err.code().as_str(), "bad_encoding");
        assert!(err.to_string().contains("junk.txt"), "{err}");
        let (gb, _, _) = GB18030.encode(TEXT);
        let err = decode(p, &gb, Some("utf-8")).unwrap_err();
        assert!(err.to_string().contains("不是有效的 UTF-8") && err.to_string().contains("偏移 0"), "{err}");
        assert!(matches!(decode(p, b"x", Some("klingon")), Err(Error::InvalidInput(_))));
    }
}
