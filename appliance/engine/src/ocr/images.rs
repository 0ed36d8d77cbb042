//! Page images out of files: JPEG, PNG, BMP, multi-page TIFF, and the images of a scanned PDF's pages (embedded
//! JPEG, and Flate-compressed grey or RGB pixels). Every image's size is read from its header and checked against
//! [`super::MAX_PAGE_PIXELS`] before its pixels are decoded, and a file gives at most `max_pages` pages, so a
//! hostile header (a 100,000 × 100,000 PNG) or a 10,000-page TIFF costs nothing.

use std::io::Cursor;

use image::{DynamicImage, RgbImage};

use super::MAX_PAGE_PIXELS;
use crate::error::{Error, Result};

fn refused(what: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("图像无法读取：{what}"))
}

fn check_size(width: u32, height: u32, page: usize) -> Result<()> {
    if u64::from(width) * u64::from(height) > MAX_PAGE_PIXELS {
        return Err(refused(format!(
            "第 {page} 页 {width} × {height} 像素，超过上限 {} 万像素",
            MAX_PAGE_PIXELS / 10_000
        )));
    }
    Ok(())
}

fn limits() -> image::Limits {
    let mut l = image::Limits::default();
    l.max_alloc = Some(MAX_PAGE_PIXELS * 4 + (64 << 20));
    l
}

/// The pages of an image file, at most `max_pages` of them (more is refused, naming the bound).
pub fn decode(bytes: &[u8], max_pages: usize) -> Result<Vec<RgbImage>> {
    if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        return tiff_pages(bytes, max_pages);
    }
    let reader = || image::ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|e| refused(e));
    let format = reader()?.format().ok_or_else(|| refused("不是 JPEG、PNG、BMP 或 TIFF 图像"))?;
    if !matches!(format, image::ImageFormat::Jpeg | image::ImageFormat::Png | image::ImageFormat::Bmp) {
        return Err(refused(format!("不支持的图像格式 {format:?}")));
    }
    let (w, h) = reader()?.into_dimensions().map_err(refused)?;
    check_size(w, h, 1)?;
    let mut r = reader()?;
    r.limits(limits());
    Ok(vec![r.decode().map_err(refused)?.to_rgb8()])
}

fn tiff_pages(bytes: &[u8], max_pages: usize) -> Result<Vec<RgbImage>> {
    use tiff::ColorType;
    use tiff::decoder::{Decoder, DecodingResult};
    let mut d = Decoder::new(Cursor::new(bytes)).map_err(refused)?;
    let mut pages = Vec::new();
    loop {
        let page = pages.len() + 1;
        if page > max_pages {
            return Err(refused(format!("TIFF 超过 {max_pages} 页的上限")));
        }
        let (w, h) = d.dimensions().map_err(refused)?;
        check_size(w, h, page)?;
        let color = d.colortype().map_err(refused)?;
        let DecodingResult::U8(data) = d.read_image().map_err(refused)? else {
            return Err(refused(format!("第 {page} 页：不支持的 TIFF 像素格式 {color:?}")));
        };
        let img = match color {
            ColorType::Gray(8) => image::GrayImage::from_raw(w, h, data).map(DynamicImage::ImageLuma8),
            ColorType::RGB(8) => RgbImage::from_raw(w, h, data).map(DynamicImage::ImageRgb8),
            ColorType::RGBA(8) => image::RgbaImage::from_raw(w, h, data).map(DynamicImage::ImageRgba8),
            other => return Err(refused(format!("第 {page} 页：不支持的 TIFF 颜色格式 {other:?}"))),
        };
        pages.push(img.ok_or_else(|| refused(format!("第 {page} 页的像素不完整")))?.to_rgb8());
        if !d.more_images() {
            return Ok(pages);
        }
        d.next_image().map_err(refused)?;
    }
}

/// The scans of a PDF file's first `max_pages` pages ([`pdf_page_images`]).
pub fn pdf_scans(bytes: &[u8], max_pages: usize) -> Result<Vec<(u32, Option<RgbImage>)>> {
    let doc = lopdf::Document::load_mem(bytes).map_err(|e| refused(format!("PDF 无法解析：{e}")))?;
    let pages: Vec<u32> = doc.get_pages().keys().copied().take(max_pages).collect();
    pdf_page_images(&doc, &pages)
}

/// The largest image drawn on each page of a PDF (`pages`: page numbers from 1), as the page's scan. A page's
/// image in a codec this reads not (JBIG2, JPEG 2000, CCITT for now) is refused naming the page.
pub fn pdf_page_images(doc: &lopdf::Document, pages: &[u32]) -> Result<Vec<(u32, Option<RgbImage>)>> {
    let ids = doc.get_pages();
    let mut out = Vec::with_capacity(pages.len());
    for &page in pages {
        let Some(&id) = ids.get(&page) else { continue };
        let mut best: Option<(u64, &lopdf::Stream)> = None;
        let (resources, inherited) = doc.get_page_resources(id).map_err(refused)?;
        let dicts = resources.into_iter().chain(inherited.into_iter().filter_map(|r| doc.get_dictionary(r).ok()));
        for res in dicts {
            let Ok(xobjects) = res.get(b"XObject").and_then(|o| doc.dereference(o)).and_then(|(_, o)| o.as_dict())
            else {
                continue;
            };
            for (_, obj) in xobjects.iter() {
                let Ok((_, lopdf::Object::Stream(s))) = doc.dereference(obj) else { continue };
                if s.dict.get(b"Subtype").and_then(|o| o.as_name()).ok() != Some(b"Image".as_slice()) {
                    continue;
                }
                let dim =
                    |k: &[u8]| s.dict.get(k).and_then(|o| o.as_i64()).unwrap_or(0).clamp(0, u32::MAX as i64) as u64;
                let area = dim(b"Width") * dim(b"Height");
                if best.is_none_or(|b| area > b.0) {
                    best = Some((area, s));
                }
            }
        }
        let image = match best {
            Some((_, s)) => Some(pdf_image(s, page)?),
            None => None,
        };
        out.push((page, image));
    }
    Ok(out)
}

fn pdf_image(s: &lopdf::Stream, page: u32) -> Result<RgbImage> {
    let page = page as usize;
    let int = |k: &[u8]| s.dict.get(k).and_then(|o| o.as_i64()).ok().and_then(|v| u32::try_from(v).ok());
    let (w, h) = (int(b"Width").unwrap_or(0), int(b"Height").unwrap_or(0));
    check_size(w, h, page)?;
    let filters: Vec<Vec<u8>> = match s.dict.get(b"Filter") {
        Ok(lopdf::Object::Name(n)) => vec![n.clone()],
        Ok(lopdf::Object::Array(a)) => a.iter().filter_map(|o| o.as_name().ok().map(<[u8]>::to_vec)).collect(),
        _ => Vec::new(),
    };
    match filters.iter().map(Vec::as_slice).collect::<Vec<_>>().as_slice() {
        [b"DCTDecode"] => {
            let mut r = image::ImageReader::with_format(Cursor::new(&s.content), image::ImageFormat::Jpeg);
            r.limits(limits());
            Ok(r.decode().map_err(|e| refused(format!("第 {page} 页的 JPEG 图像：{e}")))?.to_rgb8())
        }
        [b"FlateDecode"] | [] => {
            let data = s.decompressed_content().map_err(|e| refused(format!("第 {page} 页的图像：{e}")))?;
            let bits = int(b"BitsPerComponent").unwrap_or(8);
            let space = s.dict.get(b"ColorSpace").and_then(|o| o.as_name()).unwrap_or(b"DeviceGray");
            let img = match (space, bits) {
                (b"DeviceGray", 8) => image::GrayImage::from_raw(w, h, data).map(DynamicImage::ImageLuma8),
                (b"DeviceRGB", 8) => RgbImage::from_raw(w, h, data).map(DynamicImage::ImageRgb8),
                _ => None,
            };
            Ok(img.ok_or_else(|| refused(format!("第 {page} 页的图像格式不受支持（{} 位）", bits)))?.to_rgb8())
        }
        other => Err(refused(format!(
            "第 {page} 页的图像编码 {} 不受支持（支持 JPEG 与 Flate）",
            other.iter().map(|f| String::from_utf8_lossy(f)).collect::<Vec<_>>().join("+")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_header_is_refused_before_decoding_and_pages_are_bounded() {
        // A real 8 × 8 PNG whose header is made to claim 100,000 × 100,000 pixels (its checksum redone).
        let mut png = Vec::new();
        DynamicImage::ImageRgb8(RgbImage::new(8, 8))
            .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        assert_eq!(&png[12..16], b"IHDR");
        png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        let err = decode(&png, 10).unwrap_err().to_string();
        assert!(err.contains("超过上限"), "{err}");
        // A truncated image is refused, not a panic; a whole one reads.
        for format in [image::ImageFormat::Jpeg, image::ImageFormat::Png] {
            let mut bytes = Vec::new();
            DynamicImage::ImageRgb8(RgbImage::from_fn(64, 64, |x, y| image::Rgb([x as u8 * 4, y as u8 * 4, 0])))
                .write_to(&mut Cursor::new(&mut bytes), format)
                .unwrap();
            assert_eq!(decode(&bytes, 10).unwrap()[0].dimensions(), (64, 64));
            assert!(decode(&bytes[..bytes.len() / 2], 10).is_err(), "{format:?} cut in half");
        }
        assert!(decode(b"not an image", 10).is_err());
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }
}
