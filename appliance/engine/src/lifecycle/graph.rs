//! The import-time check of a package's ONNX graphs: each loads in ONNX Runtime, runs, yields vectors of the
//! manifest's width and, with `parity.json`, matches the trainer's vectors (the int8 graph within the looser
//! [`INT8_PARITY_MIN_COSINE`]: its projection weights are rounded).
//!
//! The graph is untrusted input to a large C++ library: a graph can ask for a tensor of any shape, loop, or crash
//! the runtime. When `care` registered its executable ([`crate::sandbox`]), the check runs in a child
//! (`care model-check`) under an address-space, CPU-time and wall-clock limit, with no file or network access once
//! the graph, the tokenizer and `parity.json` are read; a child that dies or exceeds a limit refuses the package
//! with a message naming the limit, and `care serve` keeps serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use care_formats::{Graph, ModelManifest};
use serde::{Deserialize, Serialize};

use super::{MAX_PARITY_BYTES, MAX_PARITY_TEXTS, ONNX_FILE, PARITY_FILE, PARITY_MIN_COSINE, invalid};
use crate::encoders::{ModelConfig, OrtEncoder, TextKind};
use crate::error::{Error, ErrorCode, Result};

/// The worst cosine between the int8 graph's vectors and the trainer's (fp32) parity vectors: dynamic int8
/// quantisation of a 12-layer encoder keeps them above 0.99 (e5-small: 0.995); a graph further off is not the
/// same encoder.
pub const INT8_PARITY_MIN_COSINE: f64 = 0.95;

/// The subcommand the parent runs.
pub const SUBCOMMAND: &str = "model-check";

/// CPU seconds and wall-clock seconds a graph check may take: loading and running a 12-layer encoder on a few
/// hundred parity texts takes seconds.
const CPU_SECONDS: u64 = 300;
const WALL_SECONDS: u64 = 600;

/// The child's address space: ONNX Runtime holds the graph's weights about twice (the file and its initialisers)
/// plus its arena and threads' stacks; 2 GiB on top of four times the graph's size.
fn memory_mb(graph_bytes: u64) -> u64 {
    2048 + graph_bytes.saturating_mul(4) / (1 << 20)
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    staged: PathBuf,
    src: PathBuf,
    ort_library: PathBuf,
}

/// The child's verdict. Refusals carry what the parent's error needs; the source path is the parent's.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Passed { parity_texts: usize, parity_min_cosine: Option<f64> },
    Invalid { message: String },
    Parity { worst: f64, index: usize, text: String, min: f64 },
    Failed { code: String, message: String },
}

/// Checks the graph of the package staged at `staged` (imported from `src`), in a child when the executable is
/// registered; the number of parity texts and their worst cosine.
pub(super) fn check(staged: &Path, src: &Path, m: &ModelManifest, cfg: &ModelConfig) -> Result<(usize, Option<f64>)> {
    let Some(exe) = crate::sandbox::executable() else {
        return check_graph(staged, src, m, cfg, || {});
    };
    let ort_library = crate::encoders::runtime_library(cfg)?;
    // The graphs are checked one after the other, but both sessions live until the end.
    let mut graph_bytes = 0u64;
    for g in graphs(m) {
        let graph = staged.join(g.file());
        graph_bytes += std::fs::metadata(&graph).map_err(|e| Error::io(&graph, e))?.len();
    }
    let memory_mb = memory_mb(graph_bytes);
    let request = serde_json::to_vec(&Request { staged: staged.into(), src: src.into(), ort_library })
        .map_err(|e| Error::Internal(format!("graph check request: {e}")))?;
    let args = [SUBCOMMAND.to_string(), memory_mb.to_string(), CPU_SECONDS.to_string()];
    let ended = crate::sandbox::run(
        exe,
        &args,
        &[("CARE_LOG", "error".into())],
        &request,
        1 << 20,
        Duration::from_secs(WALL_SECONDS),
        &mut |_| {},
    )?;
    let limit = |what: String| invalid(src, format!("{ONNX_FILE} 等计算图检查时{what}，模型未导入"));
    if ended.timed_out {
        return Err(limit(format!("超过了 {WALL_SECONDS} 秒的时间上限")));
    }
    if !ended.status.success() {
        tracing::warn!(package = %src.display(), status = ?ended.status, stderr = %ended.stderr.trim(),
            "the graph check process failed");
        if ended.out_of_memory() {
            return Err(limit(format!("所需内存超过了 {memory_mb} MB 的上限")));
        }
        if ended.out_of_cpu() {
            return Err(limit(format!("超过了 {CPU_SECONDS} 秒的 CPU 时间上限")));
        }
        return Err(limit(format!("使 ONNX Runtime 异常退出（{:?}）", ended.status)));
    }
    let reply: Reply = serde_json::from_slice(&ended.reply)
        .map_err(|e| Error::Internal(format!("the graph check's reply for {}: {e}", src.display())))?;
    match reply {
        Reply::Passed { parity_texts, parity_min_cosine } => Ok((parity_texts, parity_min_cosine)),
        // ONNX Runtime turns a failed allocation into an error: the address-space limit at work.
        Reply::Invalid { message } | Reply::Failed { message, .. } if crate::sandbox::allocation_failure(&message) => {
            tracing::warn!(package = %src.display(), %message, "the graph check ran out of its memory limit");
            Err(limit(format!("所需内存超过了 {memory_mb} MB 的上限")))
        }
        Reply::Invalid { message } => Err(invalid(src, message)),
        Reply::Parity { worst, index, text, min } => {
            Err(Error::ParityFailed { path: src.into(), worst, index, text, min })
        }
        Reply::Failed { code, message } if code == ErrorCode::Model.as_str() => Err(Error::Model(message)),
        Reply::Failed { message, .. } => Err(Error::Internal(message)),
    }
}

/// The child's side (`care model-check`); returns the process exit code.
pub fn serve() -> i32 {
    let Some(input) = crate::sandbox::child_start(SUBCOMMAND, 1 << 16) else { return 2 };
    let Ok(req) = serde_json::from_slice::<Request>(&input) else {
        eprintln!("care {SUBCOMMAND}: malformed request");
        return 2;
    };
    let cfg = ModelConfig {
        ort_library: Some(req.ort_library.clone()),
        device: "cpu".into(),
        threads: 1,
        ..Default::default()
    };
    let result = ModelManifest::load(&req.staged)
        .map_err(|e| invalid(&req.src, e.to_string()))
        .and_then(|m| check_graph(&req.staged, &req.src, &m, &cfg, || crate::sandbox::confine(SUBCOMMAND)));
    let reply = match result {
        Ok((parity_texts, parity_min_cosine)) => Reply::Passed { parity_texts, parity_min_cosine },
        Err(Error::InvalidPackage { message, .. }) => Reply::Invalid { message },
        Err(Error::ParityFailed { worst, index, text, min, .. }) => Reply::Parity { worst, index, text, min },
        Err(e) => Reply::Failed { code: e.code().as_str().to_string(), message: e.to_string() },
    };
    crate::sandbox::child_reply(&reply)
}

#[derive(Debug, Deserialize)]
struct ParityFile {
    texts: Vec<String>,
    embeddings: Vec<Vec<f32>>,
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(f64::MIN_POSITIVE)
}

/// The graphs the package lists: fp32 always (an online package has it), int8 when present.
fn graphs(m: &ModelManifest) -> impl Iterator<Item = Graph> + '_ {
    Graph::ALL.into_iter().filter(|g| m.files.contains_key(g.file()))
}

/// Loads the staged graphs and `parity.json`, calls `confine` (nothing more is read from disk), runs each graph on
/// a probe and, with `parity.json`, compares its vectors with the trainer's. The worst cosine is the fp32 graph's.
fn check_graph(
    staged: &Path,
    src: &Path,
    m: &ModelManifest,
    cfg: &ModelConfig,
    confine: impl FnOnce(),
) -> Result<(usize, Option<f64>)> {
    let encs = graphs(m)
        .map(|g| {
            let enc =
                OrtEncoder::load_with_manifest(staged, g, m.clone(), cfg).map_err(|e| invalid(src, e.to_string()))?;
            Ok((g, enc))
        })
        .collect::<Result<Vec<_>>>()?;
    let parity = read_parity(staged, src)?;
    confine();
    let mut checked = (0, None);
    for (g, enc) in &encs {
        let found = check_one(enc, *g, src, m, parity.as_ref())?;
        if *g == Graph::Fp32 {
            checked = found;
        }
    }
    Ok(checked)
}

/// One graph: a probe of the manifest's width, then the parity vectors within the graph's bound.
fn check_one(
    enc: &OrtEncoder,
    g: Graph,
    src: &Path,
    m: &ModelManifest,
    parity: Option<&ParityFile>,
) -> Result<(usize, Option<f64>)> {
    let file = g.file();
    let kind = if m.role.encodes_queries() { TextKind::Query } else { TextKind::Document };
    let probe =
        enc.encode(&["二甲双胍的禁忌症"], kind).map_err(|e| invalid(src, format!("{file} does not run: {e}")))?;
    if probe.first().map(Vec::len) != Some(m.width) {
        return Err(invalid(
            src,
            format!(
                "{file} produces vectors of width {:?}, the manifest says {}",
                probe.first().map(Vec::len),
                m.width
            ),
        ));
    }
    let Some(p) = parity else { return Ok((0, None)) };
    let refs: Vec<&str> = p.texts.iter().map(String::as_str).collect();
    let got = enc.encode(&refs, kind)?;
    let mut worst = (f64::INFINITY, 0);
    for (i, (g, want)) in got.iter().zip(&p.embeddings).enumerate() {
        if want.len() != g.len() {
            return Err(invalid(
                src,
                format!("{PARITY_FILE}: vector {i} has width {}, the model {}", want.len(), g.len()),
            ));
        }
        let c = cosine(g, want);
        if c < worst.0 || c.is_nan() {
            worst = (c, i);
        }
    }
    let min = match g {
        Graph::Fp32 => PARITY_MIN_COSINE,
        Graph::Int8 => INT8_PARITY_MIN_COSINE,
    };
    // NaN (a degenerate vector) fails too.
    if worst.0.is_nan() || worst.0 < min {
        return Err(Error::ParityFailed {
            path: src.to_path_buf(),
            worst: worst.0,
            index: worst.1,
            text: p.texts[worst.1].chars().take(80).collect(),
            min,
        });
    }
    Ok((p.texts.len(), Some(worst.0)))
}

/// `parity.json` of the staged package, bounded in size and count; None when the package has none.
fn read_parity(staged: &Path, src: &Path) -> Result<Option<ParityFile>> {
    let path = staged.join(PARITY_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let size = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
    if size > MAX_PARITY_BYTES {
        return Err(invalid(src, format!("{PARITY_FILE} is {size} bytes, over {MAX_PARITY_BYTES}")));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let p: ParityFile = serde_json::from_str(&text).map_err(|e| invalid(src, format!("{PARITY_FILE}: {e}")))?;
    if p.texts.is_empty() || p.texts.len() != p.embeddings.len() || p.texts.len() > MAX_PARITY_TEXTS {
        return Err(invalid(
            src,
            format!(
                "{PARITY_FILE} must hold 1–{MAX_PARITY_TEXTS} texts with one vector each ({} texts, {} vectors)",
                p.texts.len(),
                p.embeddings.len()
            ),
        ));
    }
    Ok(Some(p))
}
