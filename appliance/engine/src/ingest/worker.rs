//! Uploaded files parsed in a sandboxed child process ([`crate::sandbox`]).
//!
//! PDF, DOCX, HTML and archive readers are large third-party code fed hostile bytes. `care` re-executes itself as
//! `care ingest-worker` for every file: the child limits itself ([`IsolationConfig`]), reads the one file, then
//! gives up all further file and network access and parses. A child that dies or exceeds a limit fails that file
//! with a Chinese message naming the limit; the server notices nothing else.
//!
//! The protocol is one JSON request on the child's standard input and one JSON reply on its standard output,
//! read by the parent up to a bound derived from the file's size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::scan::OcrConfig;
use super::{FileKind, IngestLimits, IngestOptions, ParsedFile, Unit};
use super::{IngestConfig, IsolationConfig};
use crate::encoders::ModelConfig;
use crate::error::{Error, ErrorCode, Result};

/// The subcommand the parent runs.
pub const SUBCOMMAND: &str = "ingest-worker";

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    path: PathBuf,
    options: IngestOptions,
    limits: IngestLimits,
    /// How scans are read, and the ONNX Runtime library the OCR runs on (loaded before file access ends).
    #[serde(default)]
    ocr: OcrConfig,
    #[serde(default)]
    ort_library: Option<PathBuf>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    /// The file's own failure (too large, unsafe archive), or its units.
    failed: Option<Failure>,
    units: Vec<UnitReply>,
    /// The child's peak resident memory (getrusage), for the log: what a file cost to parse.
    #[serde(default)]
    peak_rss_kb: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct UnitReply {
    name: String,
    parsed: Option<ParsedFile>,
    failed: Option<Failure>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Failure {
    code: String,
    message: String,
}

impl Failure {
    fn of(e: &Error) -> Self {
        Failure { code: e.code().as_str().to_string(), message: e.to_string() }
    }

    fn into_error(self) -> Error {
        let code = ErrorCode::ALL.iter().copied().find(|c| c.as_str() == self.code).unwrap_or(ErrorCode::Internal);
        Error::Parser { code, message: self.message }
    }
}

/// [`super::read_units`], in a child process when the executable is registered and isolation is on; scans are
/// read with `cfg.ocr` on the ONNX Runtime `models` names, `on_page(read, of)` told after each page the child
/// reads (`of` is 0 when the count is not known yet).
pub fn read_units(
    path: &Path,
    opts: &IngestOptions,
    cfg: &IngestConfig,
    models: &ModelConfig,
    on_page: &mut dyn FnMut(u32, u32),
) -> Result<Vec<Unit>> {
    match crate::sandbox::executable() {
        Some(exe) if cfg.isolation.enabled => read_units_isolated(exe, path, opts, cfg, models, on_page),
        _ => {
            super::scan::use_ocr(&cfg.ocr, models);
            super::read_units(path, opts, &cfg.limits)
        }
    }
}

/// Whether a file of this kind may hold scans (and its parser then gets the OCR and its time).
fn may_hold_scans(kind: FileKind) -> bool {
    matches!(kind, FileKind::Pdf | FileKind::Image | FileKind::Zip)
}

/// Parses `path` in a child of `exe` under `cfg.isolation`'s limits.
pub fn read_units_isolated(
    exe: &Path,
    path: &Path,
    opts: &IngestOptions,
    cfg: &IngestConfig,
    models: &ModelConfig,
    on_page: &mut dyn FnMut(u32, u32),
) -> Result<Vec<Unit>> {
    let (limits, iso) = (&cfg.limits, &cfg.isolation);
    // Checked here too, so that an oversized file costs no process.
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let size = meta.len();
    let kind = FileKind::of(path)?;
    let scans = may_hold_scans(kind) && cfg.ocr.enabled;
    // Decided here, once per process (the CUDA probe is kept), and passed down as "cuda" or "cpu".
    let device = match scans {
        true => crate::encoders::device_for(&cfg.ocr.runtime(models))?.device,
        false => "cpu",
    };
    let request = serde_json::to_vec(&Request {
        path: path.to_path_buf(),
        options: opts.clone(),
        limits: limits.clone(),
        // The child's environment is cleared: it gets the models' folder resolved here.
        ocr: OcrConfig { models: cfg.ocr.models_dir(), device: device.into(), ..cfg.ocr.clone() },
        ort_library: if scans { crate::encoders::runtime_library(models).ok() } else { None },
    })
    .map_err(|e| Error::Internal(format!("parser request: {e}")))?;
    // A file of scans may take its pages' time on top of the parser's own: the child raises its CPU limit page by
    // page up to this (see `scan::read_pages`), and the wall clock allows the same.
    let budget = if scans { cfg.ocr.budget_seconds() } else { 0 };
    // A reply is the file's text as JSON: bounded by the text budget, with room for escaping and names.
    let reply_cap =
        size.saturating_mul(limits.max_text_ratio).saturating_add(1 << 20).saturating_mul(7) / 2 + (1 << 20);
    // The child limits itself first thing, before it reads the request or the file (see [`serve`]).
    let cpu = iso.cpu_seconds.max(1);
    let args =
        [SUBCOMMAND.to_string(), iso.memory_mb.max(64).to_string(), cpu.to_string(), (cpu + 1 + budget).to_string()];
    // CUDA reserves tens of gigabytes of address space it never touches: a child that opens the GPU is bounded by
    // the memory it writes to instead (see `sandbox::MEMORY_BY`).
    let mut env = vec![("CARE_LOG", "error".into())];
    if device == "cuda" {
        env.push((crate::sandbox::MEMORY_BY, crate::sandbox::BY_DATA.into()));
    }
    let ended = crate::sandbox::run(
        exe,
        &args,
        &env,
        &request,
        reply_cap,
        Duration::from_secs(iso.wall_seconds.max(1) + budget),
        &mut |note| {
            let mut words = note.split(' ');
            if let (Some("page"), Some(read), Some(of)) = (words.next(), words.next(), words.next()) {
                on_page(read.parse().unwrap_or(0), of.parse().unwrap_or(0));
            }
        },
    )?;
    if ended.timed_out {
        return Err(limit_error(
            path,
            &format!("解析超过了 {} 秒的时间上限 (ingest.isolation.wall_seconds)", iso.wall_seconds),
        ));
    }
    if ended.reply_overflow {
        return Err(limit_error(path, "解析结果超出了文字上限 (ingest.limits.max_text_ratio)"));
    }
    if !ended.status.success() {
        tracing::warn!(file = %path.display(), status = ?ended.status, stderr = %ended.stderr.trim(),
            "the parser process failed");
        return Err(died(path, &ended, iso));
    }
    let reply: Reply = serde_json::from_slice(&ended.reply)
        .map_err(|e| Error::Internal(format!("the parser process's reply for {}: {e}", path.display())))?;
    tracing::info!(file = %path.display(), peak_rss_mb = reply.peak_rss_kb / 1024, "parsed in the sandboxed child");
    if let Some(f) = reply.failed {
        // Reading the file itself ran out of the address space.
        if f.code == ErrorCode::Io.as_str() && f.message.contains("out of memory") {
            return Err(memory_error(path, iso));
        }
        return Err(f.into_error());
    }
    Ok(reply
        .units
        .into_iter()
        .map(|u| Unit {
            name: u.name,
            result: match (u.parsed, u.failed) {
                (Some(p), None) => Ok(p),
                (_, Some(f)) => Err(f.into_error()),
                (None, None) => Err(Error::Internal("the parser process sent a unit without a result".into())),
            },
        })
        .collect())
}

fn limit_error(path: &Path, what: &str) -> Error {
    Error::Parser {
        code: ErrorCode::TooLarge,
        message: format!("{}：{what}，此文件未导入；请检查文件是否损坏，或拆分后重新上传", file_name(path)),
    }
}

/// The failure of a child that did not reply: which limit ended it, when that can be told.
fn died(path: &Path, ended: &crate::sandbox::Ended, iso: &IsolationConfig) -> Error {
    let (status, signal) = (ended.status, ended.signal());
    if ended.out_of_memory() {
        return memory_error(path, iso);
    }
    if ended.out_of_cpu() {
        return limit_error(
            path,
            &format!("解析超过了 {} 秒的 CPU 时间上限 (ingest.isolation.cpu_seconds)", iso.cpu_seconds),
        );
    }
    Error::Parser {
        code: ErrorCode::MalformedRecord,
        message: format!(
            "{}：解析进程异常退出（{}），此文件未导入；请重新导出或另存后再上传",
            file_name(path),
            signal.map_or_else(|| format!("退出码 {}", status.code().unwrap_or(-1)), |s| format!("信号 {s}"))
        ),
    }
}

fn memory_error(path: &Path, iso: &IsolationConfig) -> Error {
    limit_error(path, &format!("解析所需内存超过了 {} MB 的上限 (ingest.isolation.memory_mb)", iso.memory_mb))
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// The child's side (`care ingest-worker`): reads the request, the file, then drops file and network access and
/// parses. Returns the process exit code.
pub fn serve() -> i32 {
    let Some(input) = crate::sandbox::child_start(SUBCOMMAND, 1 << 20) else { return 2 };
    let Ok(req) = serde_json::from_slice::<Request>(&input) else {
        eprintln!("care ingest-worker: malformed request");
        return 2;
    };
    let reply = match read_then_confine(&req) {
        Err(e) => Reply { failed: Some(Failure::of(&e)), units: Vec::new(), peak_rss_kb: 0 },
        Ok(units) => Reply {
            failed: None,
            peak_rss_kb: nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
                .map_or(0, |u| u.max_rss() as u64),
            units: units
                .into_iter()
                .map(|u| match u.result {
                    Ok(p) => UnitReply { name: u.name, parsed: Some(p), failed: None },
                    Err(e) => UnitReply { name: u.name, parsed: None, failed: Some(Failure::of(&e)) },
                })
                .collect(),
        },
    };
    crate::sandbox::child_reply(&reply)
}

fn read_then_confine(req: &Request) -> Result<Vec<Unit>> {
    let path = &req.path;
    let (kind, bytes) = super::read_checked(path, &req.limits)?;
    if may_hold_scans(kind) && req.ocr.enabled {
        // The models and ONNX Runtime are read now: after `confine` nothing more is.
        let models = ModelConfig { ort_library: req.ort_library.clone(), ..Default::default() };
        super::scan::use_ocr(&req.ocr, &models);
        if let Err(e) = super::scan::preload() {
            eprintln!("care {SUBCOMMAND}: the OCR models could not be loaded ({e}); scans are refused");
        }
    }
    crate::sandbox::confine(SUBCOMMAND);
    super::units_of_bytes(path, kind, &bytes, &req.options, &req.limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_cross_the_process_boundary_with_their_code() {
        let e = Error::UnsafeArchive { path: "a.zip".into(), reason: "path traversal".into() };
        let f = Failure::of(&e);
        let back = serde_json::from_slice::<Failure>(&serde_json::to_vec(&f).unwrap()).unwrap().into_error();
        assert_eq!(back.code(), ErrorCode::UnsafeArchive);
        assert_eq!(back.to_string(), e.to_string());
        let unknown = Failure { code: "no_such_code".into(), message: "x".into() }.into_error();
        assert_eq!(unknown.code(), ErrorCode::Internal);
    }
}
