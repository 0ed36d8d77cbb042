//! Scanned pages and photographs read into text by the OCR ([`crate::ocr`]): images as documents (JPEG, PNG, BMP,
//! multi-page TIFF) and the pages of a PDF that carry an image and no text.
//!
//! The models are registered once per process ([`use_ocr`]): `care serve` registers them from `[ingest.ocr]`, and
//! the sandboxed parser from its request, reading the files ([`preload`]) before it gives up file access. They are
//! turned into ONNX Runtime sessions only when a page needs reading, so a text PDF costs no model load.
//!
//! Every recognised line keeps its page and confidence as a [`ScanLine`] (character offsets in the document's
//! text), so a passage can say 识别自扫描件 with its page, and mark what was read with little confidence. Pages are
//! read one at a time (decoded, read, dropped): a 300-page TIFF never holds more than one page's pixels.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use image::RgbImage;
use serde::{Deserialize, Serialize};

use crate::encoders::ModelConfig;
use crate::error::{Error, Result};
use crate::ocr::{OcrFiles, OcrLine, OcrModels};

/// Where the .deb installs the OCR models.
pub const PACKAGED_OCR: &str = "/usr/share/care/ocr";
/// Lines read with less confidence than this are marked as uncertain where a passage is shown.
pub const LOW_CONFIDENCE: f32 = 0.85;

/// Reading scans (`[ingest.ocr]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct OcrConfig {
    /// Read scanned pages and images (off: they are refused, as before).
    pub enabled: bool,
    /// The folder of the PP-OCRv4 ONNX files (default: `$CARE_OCR_MODELS`, else [`PACKAGED_OCR`]).
    pub models: Option<PathBuf>,
    /// Most scanned pages read from one file (more is refused, naming the bound).
    pub max_pages: usize,
    /// Seconds one page may take; the parsing process's CPU and wall-clock limits grow by this per page read.
    pub seconds_per_page: u64,
    /// ONNX Runtime threads per model (0: one per core).
    pub threads: usize,
    /// Where the models run: `auto` (the GPU when one is present and a CUDA session runs, else the CPU), `cpu`, or
    /// `cuda` (a file of scans fails, naming what is missing, when CUDA cannot run).
    pub device: String,
}

impl Default for OcrConfig {
    fn default() -> Self {
        OcrConfig {
            enabled: true,
            models: None,
            max_pages: 300,
            seconds_per_page: 30,
            threads: 0,
            device: "auto".into(),
        }
    }
}

impl OcrConfig {
    /// The models' folder this configuration resolves to, if it exists.
    pub fn models_dir(&self) -> Option<PathBuf> {
        self.models
            .clone()
            .or_else(|| std::env::var_os("CARE_OCR_MODELS").map(PathBuf::from))
            .or_else(|| Some(PathBuf::from(PACKAGED_OCR)))
            .filter(|d| d.join(crate::ocr::REC_FILE).is_file())
    }

    /// The runtime settings the OCR's sessions get: the encoders' (`models`: the ONNX Runtime library) with the
    /// OCR's own device, whatever the encoders' `model.device`.
    pub fn runtime(&self, models: &ModelConfig) -> ModelConfig {
        ModelConfig { device: self.device.clone(), ..models.clone() }
    }

    /// The extra CPU (and wall-clock) seconds a file that is read page by page may take.
    pub fn budget_seconds(&self) -> u64 {
        if self.enabled { (self.max_pages as u64).saturating_mul(self.seconds_per_page) } else { 0 }
    }
}

/// One recognised line of a document: its page, its characters in the document's text, and the OCR's confidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScanLine {
    pub page: u32,
    /// Character offsets in the normalised document text.
    pub start: u32,
    pub end: u32,
    pub confidence: f32,
}

/// Where a passage read by the OCR came from: the scanned pages it spans and the least confidence of its lines
/// (what pages show as 识别自扫描件 · 第 N 页).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScanOrigin {
    pub page: u32,
    /// The last scanned page it spans (`page` when it lies on one).
    pub last_page: u32,
    pub confidence: f32,
}

impl ScanOrigin {
    /// Whether some of the passage was read with little confidence (pages say 识别可能有误).
    pub fn uncertain(&self) -> bool {
        self.confidence < LOW_CONFIDENCE
    }

    /// What pages show: 识别自扫描件 · 第 N 页, and a warning when some of it was read with little confidence.
    pub fn label(&self) -> String {
        let uncertain = if self.uncertain() { " · 部分文字识别把握较低，请核对原件" } else { "" };
        match self.last_page > self.page {
            true => format!("识别自扫描件 · 第 {}–{} 页{uncertain}", self.page, self.last_page),
            false => format!("识别自扫描件 · 第 {} 页{uncertain}", self.page),
        }
    }

    /// From the chunk's three columns (NULL for typed text).
    pub fn from_columns(page: Option<i64>, last_page: Option<i64>, confidence: Option<f64>) -> Option<Self> {
        let page = u32::try_from(page?).ok()?;
        let last_page = last_page.and_then(|p| u32::try_from(p).ok()).unwrap_or(page).max(page);
        Some(ScanOrigin { page, last_page, confidence: confidence.unwrap_or(0.0) as f32 })
    }
}

/// What a passage spanning `[start, end)` of a document's text was read from; `None` for typed text.
pub fn passage_scan(lines: &[ScanLine], start: usize, end: usize) -> Option<ScanOrigin> {
    let (start, end) = (start as u32, end as u32);
    let mut touched = lines.iter().filter(|l| l.start < end && l.end > start);
    let first = touched.next()?;
    let init = ScanOrigin { page: first.page, last_page: first.page, confidence: first.confidence };
    Some(touched.fold(init, |o, l| ScanOrigin {
        page: o.page.min(l.page),
        last_page: o.last_page.max(l.page),
        confidence: o.confidence.min(l.confidence),
    }))
}

/// One page's recognised text: its lines, each normalised, with the confidence it was read with, and whether the
/// next line continues it (a paragraph wrapped at the column's edge).
#[derive(Debug, Clone, PartialEq)]
pub struct ScannedPage {
    pub page: u32,
    pub lines: Vec<(String, f32, bool)>,
}

/// A document's text in parts: typed text (already extracted) and scanned pages, in page order.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Scanned(ScannedPage),
}

impl Part {
    /// Whether it holds no text at all (a blank page, an empty run).
    pub fn is_blank(&self) -> bool {
        match self {
            Part::Text(t) => t.trim().is_empty(),
            Part::Scanned(p) => p.lines.is_empty(),
        }
    }
}

/// The parts joined into one normalised text, and the recognised lines' places in it. A paragraph wrapped over
/// several lines is joined again (without a space between Chinese characters), so a word cut at the line's end is
/// found whole.
pub fn assemble(parts: &[Part]) -> (String, Vec<ScanLine>) {
    let (mut text, mut lines, mut chars) = (String::new(), Vec::new(), 0u32);
    let push = |text: &mut String, s: &str, chars: &mut u32| {
        text.push_str(s);
        *chars += s.chars().count() as u32;
    };
    for part in parts {
        match part {
            Part::Text(t) => {
                let t = crate::text::normalize(t);
                if !t.is_empty() {
                    if !text.is_empty() {
                        push(&mut text, "\n", &mut chars);
                    }
                    push(&mut text, &t, &mut chars);
                }
            }
            Part::Scanned(page) => {
                // A page starts on a new line; within it, a wrapped paragraph's lines are joined again.
                let mut joined = false;
                for (line, confidence, continues) in &page.lines {
                    if !text.is_empty() {
                        let sep = match joined {
                            false => "\n",
                            true if ascii_edge(text.chars().last(), line.chars().next()) => " ",
                            true => "",
                        };
                        push(&mut text, sep, &mut chars);
                    }
                    let start = chars;
                    push(&mut text, line, &mut chars);
                    lines.push(ScanLine { page: page.page, start, end: chars, confidence: *confidence });
                    joined = *continues;
                }
            }
        }
    }
    (text, lines)
}

/// Whether a wrapped line's end and the next line's start are both Latin letters or digits (then a space joins them).
fn ascii_edge(a: Option<char>, b: Option<char>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a.is_ascii_alphanumeric() && b.is_ascii_alphanumeric())
}

/// The page's lines as text lines: each normalised, and marked as continued when it reaches the right edge of
/// the page's text and does not end a sentence (the next line then carries on the same paragraph).
pub fn page_lines(page: u32, lines: &[OcrLine]) -> ScannedPage {
    let right = lines.iter().map(|l| l.bounds()[2]).fold(f32::NEG_INFINITY, f32::max);
    let out = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let text = crate::text::normalize(&l.text);
            if text.is_empty() {
                return None;
            }
            let [left, top, r, bottom] = l.bounds();
            let height = (bottom - top).max(1.0);
            let ends_sentence = text.ends_with(['。', '！', '？', '；', '：', '.', '!', '?', ';', ':']);
            // The next line starts at the same left edge (a column's next line, not a table's next cell).
            let next_left = lines.get(i + 1).map(|n| n.bounds()[0]);
            let continues = !ends_sentence
                && right - r < 1.5 * height
                && next_left.is_some_and(|nl| (nl - left).abs() < 2.0 * height);
            Some((text, l.confidence, continues))
        })
        .collect();
    ScannedPage { page, lines: out }
}

/// The registered models: where they are, their bytes once read, their sessions once built.
struct Reader {
    cfg: OcrConfig,
    model_cfg: ModelConfig,
    dir: Option<PathBuf>,
    files: Option<OcrFiles>,
    models: Option<OcrModels>,
}

static READER: Mutex<Option<Reader>> = Mutex::new(None);

fn reader() -> std::sync::MutexGuard<'static, Option<Reader>> {
    READER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers how this process reads scans; a second call with the same settings keeps what is loaded.
pub fn use_ocr(cfg: &OcrConfig, model_cfg: &ModelConfig) {
    let mut slot = reader();
    if slot.as_ref().is_some_and(|r| &r.cfg == cfg && r.model_cfg.ort_library == model_cfg.ort_library) {
        return;
    }
    let dir = cfg.models_dir();
    *slot = Some(Reader { cfg: cfg.clone(), model_cfg: cfg.runtime(model_cfg), dir, files: None, models: None });
}

/// The registered configuration (the default when none was registered).
pub fn config() -> OcrConfig {
    reader().as_ref().map(|r| r.cfg.clone()).unwrap_or_default()
}

/// Reads the model files and loads ONNX Runtime now (the sandboxed parser, before it gives up file access).
/// Without models this does nothing: a scan is then refused when it is met, with the reason.
///
/// On CUDA the sessions are built now too: the CUDA libraries and the GPU's device files are opened when a session
/// is, and after the parser gives up file access they could not be. A GPU that fails here leaves the pages to the
/// CPU, said on standard error (the parent's log).
pub fn preload() -> Result<()> {
    let mut slot = reader();
    let Some(r) = slot.as_mut().filter(|r| r.cfg.enabled) else { return Ok(()) };
    let Some(dir) = r.dir.clone() else { return Ok(()) };
    let loaded = OcrFiles::read(&dir).and_then(|f| crate::encoders::init_runtime(&r.model_cfg).map(|_| f));
    match loaded {
        Ok(files) if r.model_cfg.device == "cuda" => {
            match OcrModels::from_files(&files, &r.model_cfg, r.cfg.threads) {
                Ok(models) => r.models = Some(models),
                Err(e) => {
                    eprintln!("OCR on CUDA failed ({e}); reading on the CPU");
                    r.model_cfg.device = "cpu".into();
                    r.files = Some(files);
                }
            }
            Ok(())
        }
        Ok(files) => {
            r.files = Some(files);
            Ok(())
        }
        Err(e) => {
            // Nothing can be read later (file access ends): scans are refused, saying the models are missing.
            r.dir = None;
            Err(e)
        }
    }
}

/// Why scans cannot be read here, if they cannot.
fn unavailable(r: Option<&Reader>) -> Option<String> {
    match r {
        Some(r) if !r.cfg.enabled => Some("文字识别已关闭 (ingest.ocr.enabled = false)".into()),
        Some(r) if r.dir.is_some() => None,
        _ => Some(format!(
            "本机没有文字识别模型（ingest.ocr.models、CARE_OCR_MODELS 或 {PACKAGED_OCR}；packaging/dev.sh setup 安装）"
        )),
    }
}

/// Why scans cannot be read in this process, if they cannot (a message for people).
pub fn unavailable_reason() -> Option<String> {
    unavailable(reader().as_ref())
}

/// Reads the pages `next` yields, one at a time: `next(i)` gives the i-th page (its number and image), `None` when
/// there are no more. `known` pages, when the caller knows how many (0 when not), are checked against
/// `max_pages` before any is read; each page is read within `seconds_per_page`.
pub fn read_pages(
    path: &Path,
    known: usize,
    mut next: impl FnMut(usize) -> Result<Option<(u32, RgbImage)>>,
) -> Result<Vec<ScannedPage>> {
    let mut slot = reader();
    if let Some(why) = unavailable(slot.as_ref()) {
        return Err(Error::NoText {
            path: path.to_path_buf(), message: format!("此文件是扫描件或图像，{why}")
        });
    }
    let Some(r) = slot.as_mut() else { unreachable!("checked by unavailable") };
    let (max_pages, per_page) = (r.cfg.max_pages, r.cfg.seconds_per_page);
    if known > max_pages {
        return Err(too_many(path, max_pages));
    }
    let mut out = Vec::new();
    for i in 0.. {
        let Some((page, image)) = next(i)? else { break };
        if i >= max_pages {
            return Err(too_many(path, max_pages));
        }
        if r.models.is_none() {
            let files = match r.files.take() {
                Some(f) => f,
                None => OcrFiles::read(r.dir.as_deref().unwrap_or(Path::new(PACKAGED_OCR)))?,
            };
            r.models = Some(OcrModels::from_files(&files, &r.model_cfg, r.cfg.threads)?);
        }
        let Some(models) = r.models.as_mut() else { unreachable!("loaded above") };
        crate::sandbox::allow_more_cpu(per_page);
        let began = Instant::now();
        let lines = models.read_page(&image).map_err(|e| on_page(path, page, e))?;
        drop(image);
        if began.elapsed().as_secs() > per_page {
            return Err(bounded(
                path,
                format!(
                    "第 {page} 页识别用了 {} 秒，超过每页 {per_page} 秒的上限 (ingest.ocr.seconds_per_page)；\
                     请以较低分辨率重新扫描",
                    began.elapsed().as_secs()
                ),
            ));
        }
        tracing::debug!(file = %path.display(), page, lines = lines.len(), ms = began.elapsed().as_millis() as u64,
            "page read by the OCR");
        out.push(page_lines(page, &lines));
        // The jobs page shows it (a sandboxed parser's note to the server).
        crate::sandbox::note(&format!("page {} {known}", out.len()));
    }
    Ok(out)
}

fn too_many(path: &Path, max_pages: usize) -> Error {
    bounded(path, format!("扫描页超过每个文件 {max_pages} 页的上限 (ingest.ocr.max_pages)，此文件未导入；请拆分后上传"))
}

fn bounded(path: &Path, message: String) -> Error {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    Error::Parser { code: crate::error::ErrorCode::TooLarge, message: format!("{name}：{message}") }
}

fn on_page(path: &Path, page: u32, e: Error) -> Error {
    let Error::InvalidInput(m) = e else { return e };
    Error::InvalidInput(format!("{}：第 {page} 页：{m}", path.display()))
}

/// An image file (JPEG, PNG, BMP, TIFF with its pages) read into one document's parts.
pub fn image_parts(path: &Path, bytes: &[u8]) -> Result<Vec<Part>> {
    let max_pages = config().max_pages;
    let mut pages = crate::ocr::image_pages(bytes, max_pages).map_err(|e| named(path, e))?;
    let known = pages.size_hint().1.unwrap_or(0);
    let read = read_pages(path, known, |_| pages.next().transpose().map_err(|e| named(path, e)))?;
    Ok(read.into_iter().map(Part::Scanned).collect())
}

fn named(path: &Path, e: Error) -> Error {
    let Error::InvalidInput(m) = e else { return e };
    Error::MalformedFile { path: path.to_path_buf(), format: "图像", message: m }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str, left: f32, top: f32, right: f32) -> OcrLine {
        let bottom = top + 20.0;
        OcrLine {
            text: text.into(),
            confidence: 0.9,
            corners: [[left, top], [right, top], [right, bottom], [left, bottom]],
        }
    }

    #[test]
    fn wrapped_lines_are_one_paragraph_again_and_every_line_keeps_its_page_and_place() {
        // 二甲双胍 cut at the right edge: joined, so the word is found whole; a sentence's end starts a new line; a
        // table row (cells far apart, joined by the layout) stays its own line.
        let page = page_lines(
            3,
            &[
                line("本品禁用于严重肾功能不全的患者，二甲双", 10.0, 10.0, 400.0),
                line("胍可引起乳酸性酸中毒。", 10.0, 40.0, 250.0),
                line("阿卡波糖 50mg 每日三次", 10.0, 70.0, 300.0),
            ],
        );
        let typed = Part::Text("第一章 总则".into());
        let (text, lines) = assemble(&[typed, Part::Scanned(page)]);
        assert_eq!(
            text,
            "第一章 总则\n本品禁用于严重肾功能不全的患者，二甲双胍可引起乳酸性酸中毒。\n阿卡波糖 50mg 每日三次"
        );
        let chars: Vec<char> = text.chars().collect();
        let span = |l: &ScanLine| chars[l.start as usize..l.end as usize].iter().collect::<String>();
        assert_eq!(span(&lines[1]), "胍可引起乳酸性酸中毒。");
        assert!(lines.iter().all(|l| l.page == 3));
        // A passage over the typed text is typed; one over the scan says its page and its least confidence.
        assert_eq!(passage_scan(&lines, 0, 6), None);
        let mut low = lines.clone();
        low[2].confidence = 0.6;
        let origin = passage_scan(&low, 10, chars.len()).unwrap();
        assert_eq!((origin.page, origin.last_page, origin.confidence), (3, 3, 0.6));
        assert!(origin.uncertain() && origin.label().contains("请核对原件"), "{}", origin.label());
        assert_eq!(ScanOrigin::from_columns(Some(3), None, Some(0.95)).unwrap().label(), "识别自扫描件 · 第 3 页");
        assert_eq!(ScanOrigin::from_columns(Some(3), Some(4), Some(0.95)).unwrap().label(), "识别自扫描件 · 第 3–4 页");
    }

    #[test]
    fn latin_words_cut_by_a_wrap_get_their_space_back() {
        let page = page_lines(
            1,
            &[line("Metformin is contraindicated in", 0.0, 0.0, 500.0), line("renal failure.", 0.0, 30.0, 200.0)],
        );
        assert_eq!(assemble(&[Part::Scanned(page)]).0, "Metformin is contraindicated in renal failure.");
    }
}
