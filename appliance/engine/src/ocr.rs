//! Text in page images: scans, photographed package inserts, faxes.
//!
//! PP-OCRv4's Chinese models (Apache-2.0), as the ONNX files of the PyPI package `rapidocr-onnxruntime` 1.4.4, run
//! on the ONNX Runtime the appliance already serves its encoder with: the detection model (DBNet) finds text lines
//! ([`detect`]), the direction classifier turns upside-down ones, and the recognition model reads each line's
//! characters (CTC over the 6,622-character dictionary kept in its metadata, [`recognise`]). The steps and their
//! constants are RapidOCR's, so the appliance reads what that reference reads. Lines come back in reading order with
//! their box and confidence ([`layout`]).
//!
//! Every page is bounded before a pixel is decoded: [`MAX_PAGE_PIXELS`]; the detector sees at most
//! [`DET_MAX_SIDE`] pixels a side.

mod detect;
mod images;
mod layout;
mod recognise;

pub use images::{decode as decode_images, pages as image_pages, pdf_page_image, pdf_page_image_streams, pdf_scans};

use std::path::{Path, PathBuf};

use image::RgbImage;

use crate::encoders::ModelConfig;
use crate::error::{Error, Result};

/// The model files, as named in the wheel.
pub const DET_FILE: &str = "ch_PP-OCRv4_det_infer.onnx";
pub const CLS_FILE: &str = "ch_ppocr_mobile_v2.0_cls_infer.onnx";
pub const REC_FILE: &str = "ch_PP-OCRv4_rec_infer.onnx";

/// Largest page image read, in pixels (an A3 page at 300 dpi is 17.4 M).
pub const MAX_PAGE_PIXELS: u64 = 40_000_000;
/// Longest side the detector looks at (RapidOCR's `max_side_len`); larger pages are scaled down for detection
/// only, and lines are cut from the full image.
pub const DET_MAX_SIDE: u32 = 2000;
/// Lines read with less confidence are dropped (RapidOCR's `text_score`).
pub const MIN_LINE_CONFIDENCE: f32 = 0.5;

/// One line of text read from a page.
#[derive(Debug, Clone, PartialEq)]
pub struct OcrLine {
    pub text: String,
    /// The mean probability of its characters (0–1).
    pub confidence: f32,
    /// Its corners in page pixels, clockwise from the top left.
    pub corners: [[f32; 2]; 4],
}

impl OcrLine {
    /// (left, top, right, bottom) of the line's box.
    pub fn bounds(&self) -> [f32; 4] {
        let xs = self.corners.map(|c| c[0]);
        let ys = self.corners.map(|c| c[1]);
        let min = |v: [f32; 4]| v.into_iter().fold(f32::INFINITY, f32::min);
        let max = |v: [f32; 4]| v.into_iter().fold(f32::NEG_INFINITY, f32::max);
        [min(xs), min(ys), max(xs), max(ys)]
    }
}

/// The three sessions and the dictionary; one per parsing process (each session holds its own thread pool).
pub struct OcrModels {
    dir: PathBuf,
    det: ort::session::Session,
    cls: ort::session::Session,
    rec: ort::session::Session,
    /// Index 0 is CTC's blank; then the dictionary; last a space.
    chars: Vec<String>,
    device: &'static str,
}

impl std::fmt::Debug for OcrModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (dir, chars) = (&self.dir, self.chars.len());
        f.debug_struct("OcrModels").field("dir", dir).field("chars", &chars).field("device", &self.device).finish()
    }
}

fn ocr_err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Model(format!("OCR 模型 {}：{what}", path.display()))
}

/// The three model files read into memory: a sandboxed parser reads them before it gives up file access, and
/// builds the sessions only when a page needs them.
pub struct OcrFiles {
    dir: PathBuf,
    det: Vec<u8>,
    cls: Vec<u8>,
    rec: Vec<u8>,
}

impl OcrFiles {
    /// Reads the three models from `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let read = |file: &str| -> Result<Vec<u8>> {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(ocr_err(
                    &path,
                    "文件不存在（packaging/dev.sh setup 从 PyPI 的 rapidocr-onnxruntime 取得；或设置 ingest.ocr.models）",
                ));
            }
            std::fs::read(&path).map_err(|e| Error::io(&path, e))
        };
        Ok(Self { dir: dir.to_path_buf(), det: read(DET_FILE)?, cls: read(CLS_FILE)?, rec: read(REC_FILE)? })
    }
}

impl OcrModels {
    /// Loads the three models from `dir` with `threads` intra-op threads (0: one per core).
    pub fn load(dir: &Path, cfg: &ModelConfig, threads: usize) -> Result<Self> {
        Self::from_files(&OcrFiles::read(dir)?, cfg, threads)
    }

    /// Builds the sessions from files already read (the ONNX Runtime library is loaded first if it is not yet), on
    /// the device `cfg.device` resolves to ([`crate::encoders::device_for`]).
    pub fn from_files(files: &OcrFiles, cfg: &ModelConfig, threads: usize) -> Result<Self> {
        let (_, env) = crate::encoders::init_runtime(cfg)?;
        let device = crate::encoders::device_for(cfg)?.device;
        let dir = &files.dir;
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let session = |file: &str, bytes: &[u8]| -> Result<ort::session::Session> {
            let path = dir.join(file);
            let builder = ort::session::Session::builder(&env)
                .map_err(|e| ocr_err(&path, e))?
                .with_optimization_level(ort::session::builder::GraphOptimizationLevel::Level3)
                .map_err(|e| ocr_err(&path, e))?
                .with_intra_threads(threads)
                .map_err(|e| ocr_err(&path, e))?
                .with_intra_op_spinning(false)
                .map_err(|e| ocr_err(&path, e))?;
            crate::encoders::on_device(builder, device)?.commit_from_memory(bytes).map_err(|e| ocr_err(&path, e))
        };
        let det = session(DET_FILE, &files.det)?;
        let cls = session(CLS_FILE, &files.cls)?;
        let rec = session(REC_FILE, &files.rec)?;
        let listed = rec
            .metadata()
            .ok()
            .and_then(|m| m.custom("character"))
            .ok_or_else(|| ocr_err(&dir.join(REC_FILE), "元数据中没有字典 (no 'character' metadata)"))?;
        let chars: Vec<String> = std::iter::once(String::new())
            .chain(listed.lines().map(str::to_string))
            .chain(std::iter::once(" ".to_string()))
            .collect();
        Ok(Self { dir: dir.clone(), det, cls, rec, chars, device })
    }

    /// "cuda" or "cpu": where the sessions run.
    pub fn device(&self) -> &'static str {
        self.device
    }

    /// The lines of one page, in reading order; lines read with less than [`MIN_LINE_CONFIDENCE`] are left out.
    pub fn read_page(&mut self, page: &RgbImage) -> Result<Vec<OcrLine>> {
        let pixels = u64::from(page.width()) * u64::from(page.height());
        if pixels > MAX_PAGE_PIXELS {
            return Err(Error::InvalidInput(format!(
                "页面图像 {} × {} 像素，超过上限 {} 万像素",
                page.width(),
                page.height(),
                MAX_PAGE_PIXELS / 10_000
            )));
        }
        if page.width() < 8 || page.height() < 8 {
            return Ok(Vec::new());
        }
        let regions = detect::regions(&mut self.det, page).map_err(|e| ocr_err(&self.dir.join(DET_FILE), e))?;
        let mut crops: Vec<RgbImage> = regions.iter().map(|r| recognise::crop(page, &r.corners)).collect();
        let turned =
            recognise::turn_upside_down(&mut self.cls, &mut crops).map_err(|e| ocr_err(&self.dir.join(CLS_FILE), e))?;
        let read =
            recognise::read(&mut self.rec, &self.chars, &crops).map_err(|e| ocr_err(&self.dir.join(REC_FILE), e))?;
        // Most lines upside down: the page was scanned the wrong way round, and is read as if turned (its boxes
        // given in the turned page's pixels), so that its reading order runs from the real top.
        let page_turned = turned * 2 > crops.len();
        let (w, h) = (page.width() as f32, page.height() as f32);
        let lines: Vec<OcrLine> = regions
            .into_iter()
            .zip(read)
            .filter(|(_, (text, confidence))| !text.trim().is_empty() && *confidence >= MIN_LINE_CONFIDENCE)
            .map(|(r, (text, confidence))| {
                let corners = if page_turned {
                    let [a, b, c, d] = r.corners.map(|[x, y]| [w - x, h - y]);
                    [c, d, a, b]
                } else {
                    r.corners
                };
                OcrLine { text, confidence, corners }
            })
            .collect();
        Ok(layout::reading_order(lines))
    }
}

/// An ONNX Runtime failure inside one of the steps.
type StepResult<T> = std::result::Result<T, ort::Error>;

/// A batch of images as the models take them: BGR planes (the models were trained on OpenCV's channel order),
/// scaled to [-1, 1], each `width` wide and padded with zeros on the right.
fn planes(images: &[&RgbImage], height: u32, width: u32) -> ndarray::Array4<f32> {
    let (h, w) = (height as usize, width as usize);
    let mut out = ndarray::Array4::<f32>::zeros((images.len(), 3, h, w));
    for (n, img) in images.iter().enumerate() {
        for (x, y, p) in img.enumerate_pixels() {
            let (x, y) = (x as usize, y as usize);
            if x < w && y < h {
                for c in 0..3 {
                    out[[n, c, y, x]] = f32::from(p.0[2 - c]) / 127.5 - 1.0;
                }
            }
        }
    }
    out
}

/// Levenshtein distance between two character sequences (the OCR benchmark's character error count).
pub fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diagonal + usize::from(ca != cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
