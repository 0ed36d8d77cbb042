//! Scans through ingestion (issue 54): a mixed PDF (typed page, JPEG scan, CCITT G4 fax), a photo and a multi-page
//! TIFF read by the real PP-OCRv4 models (`CARE_OCR_MODELS`, fetched by `packaging/dev.sh setup`), searchable with
//! their pages; hostile images refused in Chinese before their pixels are decoded.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use image::{GrayImage, RgbImage};

use crate::engine::OpenMode;
use crate::ingest::fixtures::{PdfImage, PdfPage, pdf_mixed, png_claiming};
use crate::{Engine, EngineConfig, SearchRequest};

fn models() -> PathBuf {
    std::env::var_os("CARE_OCR_MODELS").map(PathBuf::from).expect(
        "CARE_OCR_MODELS must name the folder of rapidocr-onnxruntime 1.4.4's models (packaging/dev.sh setup fetches them)",
    )
}

fn engine(dir: &Path, max_pages: usize) -> Engine {
    let mut cfg = EngineConfig::default();
    // Short passages, so that a page of the package insert is several and the typed page its own.
    cfg.ingest.chunk.max_chars = 40;
    cfg.ingest.chunk.overlap_chars = 0;
    cfg.storage.data_dir = dir.to_path_buf();
    cfg.training.keep_free_gb = 0.0;
    cfg.ingest.ocr.models = Some(models());
    cfg.ingest.ocr.max_pages = max_pages;
    cfg.ingest.ocr.threads = 2;
    let e = Engine::open(cfg, OpenMode::Create).unwrap();
    e.indexer().create_collection("scans", "", "test").unwrap();
    e
}

/// The rendered package insert (`tests/fixtures/ocr-page.png`): 二甲双胍片说明书 … 阿卡波糖 50mg 每日三次.
fn page() -> RgbImage {
    image::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ocr-page.png")).unwrap().to_rgb8()
}

fn encoded(img: &RgbImage, format: image::ImageFormat) -> Vec<u8> {
    let mut out = Vec::new();
    image::DynamicImage::ImageRgb8(img.clone()).write_to(&mut Cursor::new(&mut out), format).unwrap();
    out
}

/// A TIFF of `pages` grey pages.
fn tiff(img: &GrayImage, pages: usize) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    let mut enc = tiff::encoder::TiffEncoder::new(&mut out).unwrap();
    for _ in 0..pages {
        enc.write_image::<tiff::encoder::colortype::Gray8>(img.width(), img.height(), img.as_raw()).unwrap();
    }
    out.into_inner()
}

fn hits(e: &Engine, q: &str) -> Vec<crate::SearchHit> {
    let req = SearchRequest {
        query: q.into(),
        limit: Some(10),
        method: Some(crate::fusion::Method::Bm25),
        ..Default::default()
    };
    e.searcher().search_unaudited(&req).unwrap().hits
}

#[test]
fn a_mixed_pdf_a_fax_a_photo_and_a_tiff_are_searchable_with_their_pages() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(t.path(), 300);
    let (rgb, gray) = (page(), image::DynamicImage::ImageRgb8(page()).to_luma8());
    let files = [
        (
            "指南.pdf",
            pdf_mixed(&[
                PdfPage::Typed(vec![
                    "糖尿病用药指南",
                    "总则：生活方式干预是一线治疗。",
                    "饮食控制与运动贯穿治疗全程，应长期坚持。",
                ]),
                PdfPage::Scan(PdfImage::jpeg(&rgb)),
                PdfPage::Scan(PdfImage::fax_g4(&gray)),
            ]),
        ),
        ("说明书照片.jpg", encoded(&rgb, image::ImageFormat::Jpeg)),
        ("传真.tif", tiff(&gray, 2)),
    ];
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|(name, bytes)| {
            let p = t.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect();
    let r = e.indexer().ingest_files("scans", &paths, &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0, "{:?}", r.files);

    // A word only the scans hold: every file answers, each passage with the page it was read from.
    let found = hits(&e, "阿卡波糖");
    let pages = |name: &str| -> Vec<u32> {
        let spans = found.iter().filter(|h| h.source.contains(name)).filter_map(|h| h.scan);
        let mut p: Vec<u32> = spans.flat_map(|s| s.page..=s.last_page).collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    assert_eq!(pages("指南.pdf"), [2, 3], "{found:#?}");
    assert_eq!(pages("说明书照片.jpg"), [1]);
    assert_eq!(pages("传真.tif"), [1, 2]);
    for h in &found {
        let s = h.scan.unwrap();
        assert!(s.confidence > 0.5 && !s.uncertain(), "{h:#?}");
        assert!(h.text.contains("阿卡波糖"), "{h:#?}");
    }
    // The typed page stays typed text; a wrapped line of the scans is one line again (二甲双胍片说明书 whole).
    let typed = hits(&e, "生活方式干预");
    assert_eq!(typed[0].scan, None, "{typed:#?}");
    assert!(hits(&e, "酮症酸中毒").iter().any(|h| h.source.contains("说明书照片.jpg")));

    // The document view says which page each scanned passage was read from.
    let doc_id = found.iter().find(|h| h.source.contains("指南.pdf")).unwrap().document_id;
    let doc = crate::feedback::document(&e.store, doc_id).unwrap();
    let labels: Vec<String> = crate::docview::document_sections(e.searcher(), &doc, "阿卡波糖")
        .into_iter()
        .map(|s| s.scanned)
        .filter(|s| !s.is_empty())
        .collect();
    assert!(labels.iter().any(|l| l.starts_with("识别自扫描件 · 第 2")), "{labels:?}");
    assert!(labels.iter().any(|l| l.contains("3 页")), "{labels:?}");
}

#[test]
fn hostile_images_are_refused_in_chinese_and_page_counts_are_bounded() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(t.path(), 3);
    let png = png_claiming(100_000, 100_000);
    let jpeg = encoded(&page(), image::ImageFormat::Jpeg);
    let small = GrayImage::from_pixel(64, 64, image::Luma([255]));
    let scans: Vec<PdfPage<'_>> = (0..5).map(|_| PdfPage::Scan(PdfImage::fax_g4(&small))).collect();
    let files: [(&str, Vec<u8>, &str); 4] = [
        ("巨幅.png", png, "超过上限"),
        ("截断.jpg", jpeg[..jpeg.len() / 2].to_vec(), "图像无法读取"),
        ("多页.tif", tiff(&small, 5), "超过 3 页的上限"),
        ("多页扫描.pdf", pdf_mixed(&scans), "超过每个文件 3 页的上限"),
    ];
    for (name, bytes, says) in files {
        let p = t.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let r = e.indexer().ingest_files("scans", &[p], &mut |_| {}).unwrap();
        let err = r.files[0].error.clone().unwrap_or_default();
        assert!(err.contains(says), "{name}: {err}");
        assert!(err.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)), "{name}: not Chinese: {err}");
    }
    assert_eq!(e.indexer().stats().unwrap().documents, 0);
}

/// With the OCR off, a scanned PDF is refused saying why, and a mixed one keeps its typed pages.
#[test]
fn without_the_ocr_a_scan_is_refused_with_the_reason_and_typed_pages_stay() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = t.path().to_path_buf();
    cfg.training.keep_free_gb = 0.0;
    cfg.ingest.ocr.enabled = false;
    let e = Engine::open(cfg, OpenMode::Create).unwrap();
    e.indexer().create_collection("scans", "", "test").unwrap();
    let gray = image::DynamicImage::ImageRgb8(page()).to_luma8();
    let scan = t.path().join("扫描.pdf");
    std::fs::write(&scan, pdf_mixed(&[PdfPage::Scan(PdfImage::fax_g4(&gray))])).unwrap();
    let mixed = t.path().join("混合.pdf");
    let pages = [PdfPage::Typed(vec!["总则：生活方式干预是一线治疗。"]), PdfPage::Scan(PdfImage::fax_g4(&gray))];
    std::fs::write(&mixed, pdf_mixed(&pages)).unwrap();
    let r = e.indexer().ingest_files("scans", &[scan, mixed], &mut |_| {}).unwrap();
    let err = r.files[0].error.clone().unwrap_or_default();
    assert!(err.contains("扫描件") && err.contains("文字识别已关闭"), "{err}");
    assert!(r.files[1].error.is_none(), "{:?}", r.files[1]);
    assert_eq!(hits(&e, "生活方式干预").len(), 1);
}
