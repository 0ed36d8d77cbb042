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
    pages(bytes, max_pages)?.map(|p| p.map(|(_, img)| img)).collect()
}

/// Pages decoded as they are asked for: each page's number (from 1) and pixels.
pub type Pages<'a> = Box<dyn Iterator<Item = Result<(u32, RgbImage)>> + 'a>;

/// The pages of an image file, decoded one at a time as the iterator is advanced (numbered from 1; its size hint is
/// the page count); going past `max_pages` yields an error before the next page is decoded.
pub fn pages(bytes: &[u8], max_pages: usize) -> Result<Pages<'_>> {
    if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        // Pages are counted from the chain of directories first (no pixels read): a 10,000-page TIFF is refused
        // before its first page is decoded.
        let mut d = tiff::decoder::Decoder::new(Cursor::new(bytes)).map_err(refused)?;
        let mut count = 1;
        for _ in 1..max_pages {
            if !d.more_images() {
                break;
            }
            d.next_image().map_err(refused)?;
            count += 1;
        }
        if d.more_images() {
            return Err(refused(format!("TIFF 超过 {max_pages} 页的上限")));
        }
        let d = tiff::decoder::Decoder::new(Cursor::new(bytes)).map_err(refused)?;
        return Ok(Box::new(TiffPages { d, page: 0, count, max_pages, done: false }));
    }
    let reader = || image::ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(refused);
    let format = reader()?.format().ok_or_else(|| refused("不是 JPEG、PNG、BMP 或 TIFF 图像"))?;
    if !matches!(format, image::ImageFormat::Jpeg | image::ImageFormat::Png | image::ImageFormat::Bmp) {
        return Err(refused(format!("不支持的图像格式 {format:?}")));
    }
    if format == image::ImageFormat::Jpeg && !complete_jpeg(bytes) {
        return Err(refused("JPEG 文件不完整（缺少结束标记），可能在传输中被截断；请重新上传完整的文件"));
    }
    let (w, h) = reader()?.into_dimensions().map_err(refused)?;
    check_size(w, h, 1)?;
    let mut r = reader()?;
    r.limits(limits());
    let page = r.decode().map_err(refused)?.to_rgb8();
    Ok(Box::new(std::iter::once(Ok((1, page)))))
}

/// Whether a JPEG ends its last scan with an end-of-image marker. The decoder fills a truncated image's missing
/// rows with grey and reports no error; half a package insert indexed as if whole is worse than a refusal. Inside
/// entropy-coded data every 0xFF is followed by 0x00 or a restart marker, so an EOI after the last start-of-scan
/// can only be the real end.
fn complete_jpeg(bytes: &[u8]) -> bool {
    let last_scan = bytes.windows(2).rposition(|w| w == [0xFF, 0xDA]);
    last_scan.is_some_and(|at| bytes[at..].windows(2).any(|w| w == [0xFF, 0xD9]))
}

/// A TIFF's pages, each checked against the pixel bound from its header before it is decoded.
struct TiffPages<'a> {
    d: tiff::decoder::Decoder<Cursor<&'a [u8]>>,
    page: usize,
    /// Pages the file has (counted from its directories).
    count: usize,
    max_pages: usize,
    done: bool,
}

impl Iterator for TiffPages<'_> {
    type Item = Result<(u32, RgbImage)>;

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count.saturating_sub(self.page);
        (left, Some(left))
    }

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.page > 0 {
            if !self.d.more_images() {
                self.done = true;
                return None;
            }
            if let Err(e) = self.d.next_image() {
                self.done = true;
                return Some(Err(refused(e)));
            }
        }
        self.page += 1;
        let page = self.page;
        let read = if page > self.max_pages {
            Err(refused(format!("TIFF 超过 {} 页的上限", self.max_pages)))
        } else {
            tiff_page(&mut self.d, page)
        };
        self.done |= read.is_err();
        Some(read.map(|img| (page as u32, img)))
    }
}

fn tiff_page(d: &mut tiff::decoder::Decoder<Cursor<&[u8]>>, page: usize) -> Result<RgbImage> {
    use tiff::ColorType;
    use tiff::decoder::DecodingResult;
    let (w, h) = d.dimensions().map_err(refused)?;
    check_size(w, h, page)?;
    let color = d.colortype().map_err(refused)?;
    let data = d.read_image().map_err(refused)?;
    let img = match (data, color) {
        (DecodingResult::U8(data), ColorType::Gray(8)) => {
            image::GrayImage::from_raw(w, h, data).map(DynamicImage::ImageLuma8)
        }
        (DecodingResult::U8(data), ColorType::RGB(8)) => RgbImage::from_raw(w, h, data).map(DynamicImage::ImageRgb8),
        (DecodingResult::U8(data), ColorType::RGBA(8)) => {
            image::RgbaImage::from_raw(w, h, data).map(DynamicImage::ImageRgba8)
        }
        // Bilevel pages (fax, CCITT G4) come packed eight pixels to a byte, rows padded to a byte.
        (DecodingResult::U8(data), ColorType::Gray(1)) => bilevel(w, h, &data, true).map(DynamicImage::ImageLuma8),
        (_, other) => return Err(refused(format!("第 {page} 页：不支持的 TIFF 颜色格式 {other:?}"))),
    };
    Ok(img.ok_or_else(|| refused(format!("第 {page} 页的像素不完整")))?.to_rgb8())
}

/// One-bit pixels, rows padded to whole bytes, to grey (`black_is_one`: a set bit is black).
fn bilevel(w: u32, h: u32, data: &[u8], black_is_one: bool) -> Option<image::GrayImage> {
    let row = (w as usize).div_ceil(8);
    if data.len() < row * h as usize {
        return None;
    }
    Some(mostly_white(image::GrayImage::from_fn(w, h, |x, y| {
        let bit = data[y as usize * row + x as usize / 8] >> (7 - x % 8) & 1;
        image::Luma([if (bit == 1) == black_is_one { 0 } else { 255 }])
    })))
}

/// The scans of a PDF file's first `max_pages` pages ([`pdf_page_image`]).
pub fn pdf_scans(bytes: &[u8], max_pages: usize) -> Result<Vec<(u32, Option<RgbImage>)>> {
    let doc = lopdf::Document::load_mem(bytes).map_err(|e| refused(format!("PDF 无法解析：{e}")))?;
    let pages: Vec<(u32, lopdf::ObjectId)> = doc.get_pages().into_iter().take(max_pages).collect();
    pages.into_iter().map(|(page, id)| Ok((page, pdf_page_image(&doc, id, page)?))).collect()
}

/// The largest image drawn on a PDF page (`page`: its number from 1, for messages), as the page's scan; `None`
/// for a page without images. An image in a codec not read here (JBIG2, JPEG 2000, two-dimensional G3 fax) is
/// refused naming the page.
pub fn pdf_page_image(doc: &lopdf::Document, id: lopdf::ObjectId, page: u32) -> Result<Option<RgbImage>> {
    let area = |s: &lopdf::Stream| {
        let dim = |k: &[u8]| s.dict.get(k).and_then(|o| o.as_i64()).unwrap_or(0).clamp(0, u32::MAX as i64) as u64;
        dim(b"Width") * dim(b"Height")
    };
    // The first of equally large images, as drawn in the resources' order.
    let best =
        pdf_page_image_streams(doc, id).map_err(refused)?.into_iter().fold(None, |best: Option<&lopdf::Stream>, s| {
            match best {
                Some(b) if area(s) <= area(b) => Some(b),
                _ => Some(s),
            }
        });
    best.map(|s| pdf_image(doc, s, page)).transpose()
}

/// The image XObjects a PDF page's resources (its own, then inherited) make available to it.
pub fn pdf_page_image_streams(
    doc: &lopdf::Document,
    id: lopdf::ObjectId,
) -> std::result::Result<Vec<&lopdf::Stream>, lopdf::Error> {
    let (resources, inherited) = doc.get_page_resources(id)?;
    let dicts = resources.into_iter().chain(inherited.into_iter().filter_map(|r| doc.get_dictionary(r).ok()));
    let mut out = Vec::new();
    for res in dicts {
        let Ok(xobjects) = res.get(b"XObject").and_then(|o| doc.dereference(o)).and_then(|(_, o)| o.as_dict()) else {
            continue;
        };
        for (_, obj) in xobjects.iter() {
            if let Ok((_, lopdf::Object::Stream(s))) = doc.dereference(obj)
                && s.dict.get(b"Subtype").and_then(|o| o.as_name()).ok() == Some(b"Image".as_slice())
            {
                out.push(s);
            }
        }
    }
    Ok(out)
}

fn pdf_image(doc: &lopdf::Document, s: &lopdf::Stream, page: u32) -> Result<RgbImage> {
    let page = page as usize;
    let int = |k: &[u8]| s.dict.get(k).and_then(|o| o.as_i64()).ok().and_then(|v| u32::try_from(v).ok());
    let (w, h) = (int(b"Width").unwrap_or(0), int(b"Height").unwrap_or(0));
    check_size(w, h, page)?;
    let filters: Vec<Vec<u8>> = match s.dict.get(b"Filter") {
        Ok(lopdf::Object::Name(n)) => vec![n.clone()],
        Ok(lopdf::Object::Array(a)) => a.iter().filter_map(|o| o.as_name().ok().map(<[u8]>::to_vec)).collect(),
        _ => Vec::new(),
    };
    // At most the pixels the header declares, at eight bits a channel, plus a margin.
    let cap = (u64::from(w) * u64::from(h) * 3 + (1 << 20)) as usize;
    let bad = |what: String| refused(format!("第 {page} 页的图像：{what}"));
    match filters.iter().map(Vec::as_slice).collect::<Vec<_>>().as_slice() {
        [b"DCTDecode"] => {
            if !complete_jpeg(&s.content) {
                return Err(bad("JPEG 数据不完整（缺少结束标记）".into()));
            }
            let mut r = image::ImageReader::with_format(Cursor::new(&s.content), image::ImageFormat::Jpeg);
            r.limits(limits());
            Ok(r.decode().map_err(|e| bad(format!("JPEG：{e}")))?.to_rgb8())
        }
        [b"CCITTFaxDecode"] => fax_image(doc, s, w, h, &s.content).ok_or_else(|| bad("CCITT 传真编码无法解码".into())),
        [b"FlateDecode"] | [] => {
            let data = s.decompressed_content_with_limit(cap).map_err(|e| bad(e.to_string()))?;
            let bits = int(b"BitsPerComponent").unwrap_or(8);
            let space = s.dict.get(b"ColorSpace").and_then(|o| o.as_name()).unwrap_or(b"DeviceGray");
            let img = match (space, bits) {
                (b"DeviceGray", 8) => image::GrayImage::from_raw(w, h, data).map(DynamicImage::ImageLuma8),
                (b"DeviceRGB", 8) => RgbImage::from_raw(w, h, data).map(DynamicImage::ImageRgb8),
                (b"DeviceGray", 1) => bilevel(w, h, &data, false).map(DynamicImage::ImageLuma8),
                _ => None,
            };
            Ok(img.ok_or_else(|| bad(format!("格式不受支持（{} 位）", bits)))?.to_rgb8())
        }
        other => Err(bad(format!(
            "编码 {} 不受支持（支持 JPEG、Flate 与 CCITT G4 传真）",
            other.iter().map(|f| String::from_utf8_lossy(f)).collect::<Vec<_>>().join("+")
        ))),
    }
}

/// A CCITT fax image (`/K` < 0: Group 4; `/K` = 0: one-dimensional Group 3), black on white whatever `/BlackIs1`
/// says (a scan is mostly paper: a page decoded mostly black is turned over).
fn fax_image(doc: &lopdf::Document, s: &lopdf::Stream, w: u32, h: u32, data: &[u8]) -> Option<RgbImage> {
    // A dictionary, or an array of them (one per filter).
    let parms = s.dict.get(b"DecodeParms").ok().and_then(|o| doc.dereference(o).ok()).and_then(|(_, o)| {
        o.as_dict().ok().or_else(|| o.as_array().ok().and_then(|a| a.first()).and_then(|o| o.as_dict().ok())).cloned()
    });
    let get = |k: &[u8], d: i64| parms.as_ref().and_then(|p| p.get(k).ok()).and_then(|o| o.as_i64().ok()).unwrap_or(d);
    let (k, columns) = (get(b"K", 0), get(b"Columns", 1728));
    let width = u16::try_from(columns).ok().filter(|&c| u32::from(c) == w || w == 0)?;
    let height = u16::try_from(h).ok()?;
    let mut img = image::GrayImage::from_pixel(u32::from(width), h, image::Luma([255]));
    let mut y = 0u32;
    let mut line = |transitions: &[u16]| {
        if y < h {
            for (x, c) in fax::decoder::pels(transitions, width).enumerate() {
                if c == fax::Color::Black {
                    img.put_pixel(x as u32, y, image::Luma([0]));
                }
            }
        }
        y += 1;
    };
    match k {
        k if k < 0 => fax::decoder::decode_g4(data.iter().copied(), width, Some(height), &mut line)?,
        0 => fax::decoder::decode_g3(data.iter().copied(), &mut line)?,
        _ => return None,
    }
    Some(DynamicImage::ImageLuma8(mostly_white(img)).to_rgb8())
}

/// A bilevel page as black on white: inverted when most of it is black.
fn mostly_white(mut img: image::GrayImage) -> image::GrayImage {
    let dark = img.pixels().filter(|p| p.0[0] < 128).count();
    if dark * 2 > img.pixels().len() {
        image::imageops::invert(&mut img);
    }
    img
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_header_is_refused_before_decoding_and_pages_are_bounded() {
        let png = crate::ingest::fixtures::png_claiming(100_000, 100_000);
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
}
