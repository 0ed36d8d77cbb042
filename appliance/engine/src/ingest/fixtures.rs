//! Writers of small, real files in the formats ingestion reads: a PDF whose Chinese text is set in a CID font with a
//! ToUnicode CMap (what Word/WPS "save as PDF" produces), a DOCX package, a ZIP. Tests, fuzz seeds and benchmarks
//! build their fixtures with these instead of checking binary files into the repository.

use std::collections::BTreeMap;
use std::io::{Cursor, Write};

use lopdf::content::{Content, Operation};
use lopdf::{Document, Object, Stream, StringFormat, dictionary};

/// A PDF with one page per entry, each page one text line per string. Text is shown with 2-byte CIDs of a Type0
/// font; only the ToUnicode CMap says which character each code is, as in real exported PDFs.
pub fn pdf_bytes(pages: &[Vec<&str>]) -> Vec<u8> {
    pdf_bytes_with_cmap(pages, "")
}

/// [`pdf_bytes`] with `extra` CMap sections (e.g. a hostile bfrange) before the CMap's end.
pub fn pdf_bytes_with_cmap(pages: &[Vec<&str>], extra: &str) -> Vec<u8> {
    pdf_document(&pages.iter().map(|p| PdfPage::Typed(p.clone())).collect::<Vec<_>>(), extra, 1)
}

/// A hostile PDF of `pages` pages that all show one content stream of `lines` (compressed, so the file stays small
/// while every page yields the whole stream's text).
pub fn pdf_bytes_one_stream(lines: &[&str], pages: usize) -> Vec<u8> {
    pdf_document(&[PdfPage::Typed(lines.to_vec())], "", pages.max(1))
}

/// A PDF of typed pages and scans, in order (a scanner's file, or a guideline with scanned appendices).
pub fn pdf_mixed(pages: &[PdfPage<'_>]) -> Vec<u8> {
    pdf_document(pages, "", 1)
}

/// A page of [`pdf_mixed`].
#[derive(Debug, Clone)]
pub enum PdfPage<'a> {
    /// Lines of text in the CID font.
    Typed(Vec<&'a str>),
    /// One image filling the page, as a scanner writes it, and no text.
    Scan(PdfImage),
}

/// An image stream of a PDF page.
#[derive(Debug, Clone)]
pub struct PdfImage {
    pub filter: &'static str,
    pub data: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub color_space: &'static str,
    pub bits: i64,
    /// CCITT's `/K` (negative: Group 4).
    pub k: Option<i64>,
}

impl PdfImage {
    /// The page as JPEG (`/DCTDecode`, what most scanners and phones write).
    pub fn jpeg(img: &image::RgbImage) -> Self {
        let mut data = Vec::new();
        image::DynamicImage::ImageRgb8(img.clone())
            .write_to(&mut Cursor::new(&mut data), image::ImageFormat::Jpeg)
            .expect("encode jpeg");
        PdfImage {
            filter: "DCTDecode",
            data,
            width: img.width(),
            height: img.height(),
            color_space: "DeviceRGB",
            bits: 8,
            k: None,
        }
    }

    /// The page as black-and-white CCITT Group 4 fax (`/CCITTFaxDecode`, `/K -1`): what document scanners write
    /// for text pages.
    pub fn fax_g4(img: &image::GrayImage) -> Self {
        let width = u16::try_from(img.width()).expect("fax width");
        let mut enc = fax::encoder::Encoder::new(fax::VecWriter::new());
        for row in img.rows() {
            let pels = row.map(|p| if p.0[0] < 128 { fax::Color::Black } else { fax::Color::White });
            enc.encode_line(pels, width).expect("encode fax line");
        }
        let data = enc.finish().expect("finish fax").finish();
        PdfImage {
            filter: "CCITTFaxDecode",
            data,
            width: img.width(),
            height: img.height(),
            color_space: "DeviceGray",
            bits: 1,
            k: Some(-1),
        }
    }
}

/// A real 8 × 8 PNG whose header claims `width` × `height` pixels (its checksum redone, so only the size is a
/// lie): what a decoder that trusts the header would allocate for.
pub fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut png = Vec::new();
    image::DynamicImage::new_rgb8(8, 8).write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png).expect("png");
    assert_eq!(&png[12..16], b"IHDR");
    png[16..20].copy_from_slice(&width.to_be_bytes());
    png[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = png[12..29].iter().fold(!0u32, |mut crc, &b| {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
        crc
    });
    png[29..33].copy_from_slice(&(!crc).to_be_bytes());
    png
}

/// The PDF writer: each entry of `pages` is a page, shown `repeat` times (the repeats share its content stream).
fn pdf_document(pages: &[PdfPage<'_>], extra: &str, repeat: usize) -> Vec<u8> {
    let mut codes: BTreeMap<char, u16> = BTreeMap::new();
    let typed = pages.iter().filter_map(|p| match p {
        PdfPage::Typed(lines) => Some(lines),
        PdfPage::Scan(_) => None,
    });
    for line in typed.flatten() {
        for c in line.chars() {
            let next = codes.len() as u16 + 1;
            codes.entry(c).or_insert(next);
        }
    }
    let mut cmap = String::from(
        "/CIDInit /ProcSet findresource begin\n12 dict begin\nbegincmap\n/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def\n\
         /CMapName /Adobe-Identity-UCS def\n/CMapType 2 def\n1 begincodespacerange\n<0000> <FFFF>\nendcodespacerange\n",
    );
    let entries: Vec<(char, u16)> = codes.iter().map(|(c, n)| (*c, *n)).collect();
    for block in entries.chunks(100) {
        cmap.push_str(&format!("{} beginbfchar\n", block.len()));
        for (c, n) in block {
            let mut units = [0u16; 2];
            let hex: String = c.encode_utf16(&mut units).iter().map(|u| format!("{u:04X}")).collect();
            cmap.push_str(&format!("<{n:04X}> <{hex}>\n"));
        }
        cmap.push_str("endbfchar\n");
    }
    cmap.push_str(extra);
    cmap.push_str("endcmap\nCMapName currentdict /CMap defineresource pop\nend\nend\n");

    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let to_unicode = doc.add_object(Stream::new(dictionary! {}, cmap.into_bytes()));
    let descendant = doc.add_object(dictionary! {
        "Type" => "Font",
        "Subtype" => "CIDFontType2",
        "BaseFont" => "SimSun",
        "CIDSystemInfo" => dictionary! {
            "Registry" => Object::string_literal("Adobe"),
            "Ordering" => Object::string_literal("Identity"),
            "Supplement" => 0,
        },
        "DW" => 1000,
    });
    let font = doc.add_object(dictionary! {
        "Type" => "Font",
        "Subtype" => "Type0",
        "BaseFont" => "SimSun",
        "Encoding" => "Identity-H",
        "DescendantFonts" => vec![descendant.into()],
        "ToUnicode" => to_unicode,
    });
    let resources = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font } });
    let mut kids = Vec::new();
    for page in pages {
        let lines = match page {
            PdfPage::Typed(lines) => lines,
            PdfPage::Scan(img) => {
                kids.push(scan_page(&mut doc, pages_id, img).into());
                continue;
            }
        };
        let mut ops = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let bytes: Vec<u8> = line.chars().flat_map(|c| codes[&c].to_be_bytes()).collect();
            ops.push(Operation::new("BT", vec![]));
            ops.push(Operation::new("Tf", vec!["F1".into(), 12.into()]));
            ops.push(Operation::new("Td", vec![72.into(), (760 - 18 * i as i64).into()]));
            ops.push(Operation::new("Tj", vec![Object::String(bytes, StringFormat::Hexadecimal)]));
            ops.push(Operation::new("ET", vec![]));
        }
        let content = Content { operations: ops }.encode().expect("encode content");
        let content_id = doc.add_object(Stream::new(dictionary! {}, content));
        for _ in 0..repeat {
            let page = doc.add_object(dictionary! {
                "Type" => "Page",
                "Parent" => pages_id,
                "Contents" => content_id,
                "Resources" => resources,
                "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
            });
            kids.push(page.into());
        }
    }
    let count = kids.len() as i64;
    doc.objects
        .insert(pages_id, Object::Dictionary(dictionary! { "Type" => "Pages", "Kids" => kids, "Count" => count }));
    let catalog = doc.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    doc.trailer.set("Root", catalog);
    doc.compress();
    let mut out = Vec::new();
    doc.save_to(&mut out).expect("write pdf");
    out
}

/// A page drawing `img` over an A4 page, and nothing else.
fn scan_page(doc: &mut Document, parent: lopdf::ObjectId, img: &PdfImage) -> lopdf::ObjectId {
    let mut dict = dictionary! {
        "Type" => "XObject",
        "Subtype" => "Image",
        "Width" => img.width as i64,
        "Height" => img.height as i64,
        "ColorSpace" => img.color_space,
        "BitsPerComponent" => img.bits,
        "Filter" => img.filter,
    };
    if let Some(k) = img.k {
        dict.set("DecodeParms", dictionary! { "K" => k, "Columns" => img.width as i64, "Rows" => img.height as i64 });
    }
    // Compressed image data is written as it is (doc.compress() leaves streams with a filter alone).
    let mut stream = Stream::new(dict, img.data.clone());
    stream.allows_compression = false;
    let image = doc.add_object(stream);
    let content = Content {
        operations: vec![
            Operation::new("q", vec![]),
            Operation::new("cm", vec![595.into(), 0.into(), 0.into(), 842.into(), 0.into(), 0.into()]),
            Operation::new("Do", vec!["Im0".into()]),
            Operation::new("Q", vec![]),
        ],
    }
    .encode()
    .expect("encode content");
    let content_id = doc.add_object(Stream::new(dictionary! {}, content));
    doc.add_object(dictionary! {
        "Type" => "Page",
        "Parent" => parent,
        "Contents" => content_id,
        "Resources" => dictionary! { "XObject" => dictionary! { "Im0" => image } },
        "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
    })
}

/// A ZIP with the given (name, bytes) members, deflated. Names are written as given (tests use this to build
/// hostile archives too).
pub fn zip_bytes(members: &[(&str, &[u8])]) -> Vec<u8> {
    zip_with(zip::CompressionMethod::Deflated, members)
}

/// A ZIP whose members are stored uncompressed (hostile but highly compressible content that must reach the parser
/// rather than be refused as a zip bomb).
pub fn zip_stored_bytes(members: &[(&str, &[u8])]) -> Vec<u8> {
    zip_with(zip::CompressionMethod::Stored, members)
}

fn zip_with(method: zip::CompressionMethod, members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let o = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, data) in members {
        w.start_file(*name, o).expect("zip entry");
        w.write_all(data).expect("zip data");
    }
    w.finish().expect("zip finish").into_inner()
}

/// A minimal but complete DOCX: `[Content_Types].xml`, the package relationship, `word/document.xml` with one
/// paragraph per entry (optionally styled, e.g. `Heading1` or Chinese Word's `1`), and `docProps/core.xml` with the
/// title when given.
pub fn docx_bytes(paragraphs: &[(Option<&str>, &str)], title: Option<&str>) -> Vec<u8> {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    let mut body = String::new();
    for (style, text) in paragraphs {
        body.push_str("<w:p>");
        if let Some(s) = style {
            body.push_str(&format!("<w:pPr><w:pStyle w:val=\"{}\"/></w:pPr>", esc(s)));
        }
        body.push_str(&format!("<w:r><w:t xml:space=\"preserve\">{}</w:t></w:r></w:p>", esc(text)));
    }
    docx_package(&body, None, title)
}

/// A DOCX whose `word/document.xml` body is the given WordprocessingML (paragraphs, tables; `w:` prefix), with
/// `word/numbering.xml` holding the given `w:abstractNum`/`w:num` elements when set, and the title when given.
pub fn docx_package(body: &str, numbering: Option<&str>, title: Option<&str>) -> Vec<u8> {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    const W: &str = "xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"";
    let doc = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?><w:document {W}><w:body>{body}</w:body></w:document>"
    );
    let numbering = numbering.map(|n| {
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?><w:numbering {W}>{n}</w:numbering>")
    });
    let types = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\">\
        <Default Extension=\"rels\" ContentType=\"application/vnd.openxmlformats-package.relationships+xml\"/>\
        <Default Extension=\"xml\" ContentType=\"application/xml\"/>\
        <Override PartName=\"/word/document.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml\"/></Types>";
    let rels = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\">\
        <Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument\" Target=\"word/document.xml\"/></Relationships>";
    let core = title.map(|t| {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><cp:coreProperties xmlns:cp=\"http://schemas.openxmlformats.org/package/2006/metadata/core-properties\" \
             xmlns:dc=\"http://purl.org/dc/elements/1.1/\"><dc:title>{}</dc:title></cp:coreProperties>",
            esc(t)
        )
    });
    let mut members: Vec<(&str, &[u8])> = vec![
        ("[Content_Types].xml", types.as_bytes()),
        ("_rels/.rels", rels.as_bytes()),
        ("word/document.xml", doc.as_bytes()),
    ];
    if let Some(c) = &core {
        members.push(("docProps/core.xml", c.as_bytes()));
    }
    if let Some(n) = &numbering {
        members.push(("word/numbering.xml", n.as_bytes()));
    }
    zip_bytes(&members)
}
