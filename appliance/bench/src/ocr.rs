//! `care-bench --ocr DIR`: the OCR's character error rate and speed on pages rendered by
//! `tests/bench/ocr_pages.py --corpus DIR` (issue 54): each page of DIR/truth.jsonl decoded from its file (PNG,
//! JPEG, TIFF page, or the scan inside a PDF) and read by the engine's OCR; CER counts characters, white space
//! left out and full-width forms folded, summed over pages (edits / characters of the truth), clean and degraded apart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

#[derive(clap::Args, Debug, Default)]
pub struct OcrArgs {
    /// OCR benchmark over the pages in DIR (tests/bench/ocr_pages.py --corpus DIR).
    #[arg(long, value_name = "DIR")]
    pub ocr: Option<PathBuf>,
    /// With --ocr: the folder of the OCR models (default: $CARE_OCR_MODELS).
    #[arg(long, value_name = "DIR", requires = "ocr")]
    pub ocr_models: Option<PathBuf>,
    /// With --ocr: read at most this many pages (every page when 0).
    #[arg(long, default_value_t = 0, requires = "ocr")]
    pub ocr_limit: usize,
    /// With --ocr: ONNX Runtime threads per model.
    #[arg(long, default_value_t = 2, requires = "ocr")]
    pub ocr_threads: usize,
}

#[derive(Deserialize)]
struct Truth {
    set: String,
    id: String,
    file: String,
    page: usize,
    degraded: bool,
    dpi: u32,
    text: String,
}

#[derive(Serialize, Default)]
pub struct Group {
    pub pages: usize,
    pub characters: usize,
    pub edits: usize,
    pub cer: f64,
    pub seconds: f64,
    pub pages_per_second: f64,
}

#[derive(Serialize)]
pub struct Report {
    pub pages: usize,
    pub threads: usize,
    pub cpu: String,
    pub cores: usize,
    pub clean: Group,
    pub degraded: Group,
    pub by_kind: BTreeMap<String, Group>,
    pub peak_rss_mb: f64,
    /// The worst pages: (id, CER, what was read).
    pub worst: Vec<(String, f64, String)>,
    /// Each page's recognised text, for ingesting the recognised collection: id → text.
    #[serde(skip)]
    pub texts: Vec<(String, String, String)>,
}

/// The characters compared: white space left out, full-width forms folded to ASCII (as ingest folds them).
fn squeeze(s: &str) -> Vec<char> {
    s.chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| match c as u32 {
            0xFF01..=0xFF5E => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
            _ => c,
        })
        .collect()
}

fn add(g: &mut Group, chars: usize, e: usize, seconds: f64) {
    g.pages += 1;
    g.characters += chars;
    g.edits += e;
    g.seconds += seconds;
    g.cer = g.edits as f64 / g.characters.max(1) as f64;
    g.pages_per_second = g.pages as f64 / g.seconds.max(1e-9);
}

pub fn run(args: &OcrArgs, dir: &Path) -> Result<Report> {
    let models = match &args.ocr_models {
        Some(m) => m.clone(),
        None => PathBuf::from(std::env::var_os("CARE_OCR_MODELS").context("set --ocr-models or CARE_OCR_MODELS")?),
    };
    let mut ocr = care_engine::ocr::OcrModels::load(&models, &Default::default(), args.ocr_threads)?;
    let truth: Vec<Truth> = std::fs::read_to_string(dir.join("truth.jsonl"))
        .with_context(|| format!("reading {}", dir.join("truth.jsonl").display()))?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let limit = if args.ocr_limit == 0 { truth.len() } else { args.ocr_limit };
    let (mut clean, mut degraded, mut by_kind) = (Group::default(), Group::default(), BTreeMap::new());
    let mut worst = Vec::new();
    let mut texts = Vec::new();
    for t in truth.iter().take(limit) {
        let bytes = std::fs::read(dir.join(&t.file))?;
        let started = Instant::now();
        let page = if t.file.ends_with(".pdf") {
            care_engine::ocr::pdf_scans(&bytes, t.page)?.into_iter().nth(t.page - 1).and_then(|p| p.1)
        } else {
            care_engine::ocr::decode_images(&bytes, 500)?.into_iter().nth(t.page - 1)
        }
        .with_context(|| format!("{} has no page {}", t.file, t.page))?;
        let lines = ocr.read_page(&page)?;
        let seconds = started.elapsed().as_secs_f64();
        let read = lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>().join("\n");
        let (r, want) = (squeeze(&read), squeeze(&t.text));
        let e = care_engine::ocr::edit_distance(&r, &want);
        add(if t.degraded { &mut degraded } else { &mut clean }, want.len(), e, seconds);
        let ext = t.file.rsplit('.').next().unwrap_or("").to_string();
        let kind = format!("{}/{}dpi/{}", if t.degraded { "degraded" } else { "clean" }, t.dpi, ext);
        add(by_kind.entry(kind).or_default(), want.len(), e, seconds);
        worst.push((t.id.clone(), e as f64 / want.len().max(1) as f64, read.clone()));
        texts.push((t.set.clone(), t.id.clone(), read));
        eprint!("\r{} / {} pages", texts.len(), limit.min(truth.len()));
    }
    eprintln!();
    worst.sort_by(|a, b| b.1.total_cmp(&a.1));
    worst.truncate(10);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak_rss_mb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0);
    Ok(Report {
        pages: texts.len(),
        threads: args.ocr_threads,
        cpu: care_engine::kernels::cpu_model(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        clean,
        degraded,
        by_kind,
        peak_rss_mb,
        worst,
        texts,
    })
}

/// The recognised pages as a BEIR corpus per set (`DIR/SET/recognised.jsonl`), for ingesting beside the text.
pub fn write_recognised(report: &Report, dir: &Path) -> Result<()> {
    let mut by_set: BTreeMap<&str, String> = BTreeMap::new();
    for (set, id, text) in &report.texts {
        let line = serde_json::json!({ "id": id, "title": "", "text": text });
        let out = by_set.entry(set).or_default();
        out.push_str(&line.to_string());
        out.push('\n');
    }
    for (set, body) in by_set {
        let path = dir.join(set).join("recognised.jsonl");
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
