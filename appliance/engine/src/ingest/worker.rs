//! Uploaded files parsed in a sandboxed child process.
//!
//! PDF, DOCX, HTML and archive readers are large third-party code fed hostile bytes: a file that makes one of them
//! allocate gigabytes or loop would take the server (and search with it) down if it ran inside `care serve`. So
//! `care` re-executes itself as `care ingest-worker` for every file: the parent sets an address-space, CPU-time
//! and file-size limit before the child starts ([`IsolationConfig`]), the child reads the one file, then gives up
//! all further file and network access (Landlock, where the kernel has it) and parses. A child that dies or
//! exceeds a limit fails that file with a Chinese message naming the limit; the server notices nothing else.
//!
//! The protocol is one JSON request on the child's standard input and one JSON reply on its standard output,
//! read by the parent up to a bound derived from the file's size.
//!
//! Processes that did not register the executable ([`use_executable`]: the engine's own tests, embedders) parse
//! in-process, as before.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{FileKind, IngestLimits, IngestOptions, ParsedFile, Unit};
use super::{IngestConfig, IsolationConfig};
use crate::error::{Error, ErrorCode, Result};

/// The subcommand the parent runs.
pub const SUBCOMMAND: &str = "ingest-worker";

static EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// Registers the `care` executable that serves [`SUBCOMMAND`]; from then on files are parsed in children.
pub fn use_executable(exe: PathBuf) {
    let _ = EXECUTABLE.set(exe);
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    path: PathBuf,
    options: IngestOptions,
    limits: IngestLimits,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    /// The file's own failure (too large, unsafe archive), or its units.
    failed: Option<Failure>,
    units: Vec<UnitReply>,
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

/// [`super::read_units`], in a child process when the executable is registered and isolation is on.
pub fn read_units(path: &Path, opts: &IngestOptions, cfg: &IngestConfig) -> Result<Vec<Unit>> {
    match EXECUTABLE.get() {
        Some(exe) if cfg.isolation.enabled => read_units_isolated(exe, path, opts, &cfg.limits, &cfg.isolation),
        _ => super::read_units(path, opts, &cfg.limits),
    }
}

/// Parses `path` in a child of `exe` under `iso`'s limits.
pub fn read_units_isolated(
    exe: &Path,
    path: &Path,
    opts: &IngestOptions,
    limits: &IngestLimits,
    iso: &IsolationConfig,
) -> Result<Vec<Unit>> {
    // Checked here too, so that an oversized file costs no process.
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let size = meta.len();
    FileKind::of(path)?;
    let request =
        serde_json::to_vec(&Request { path: path.to_path_buf(), options: opts.clone(), limits: limits.clone() })
            .map_err(|e| Error::Internal(format!("parser request: {e}")))?;
    let mut cmd = Command::new(exe);
    // The child limits itself first thing, before it reads the request or the file (see [`serve`]).
    cmd.args([SUBCOMMAND, &iso.memory_mb.max(64).to_string(), &iso.cpu_seconds.max(1).to_string()])
        .env_clear()
        .env("CARE_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        cmd.spawn().map_err(|e| Error::Internal(format!("starting the parser process {}: {e}", exe.display())))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (mut stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
        (Some(i), Some(o), Some(e)) => (i, o, e),
        _ => return Err(Error::Internal("the parser process's pipes are missing".into())),
    };
    // A reply is the file's text as JSON: bounded by the text budget, with room for escaping and names.
    let reply_cap =
        size.saturating_mul(limits.max_text_ratio).saturating_add(1 << 20).saturating_mul(7) / 2 + (1 << 20);
    let out = std::thread::spawn(move || read_capped(stdout, reply_cap));
    let err = std::thread::spawn(move || read_capped(stderr, 64 << 10));
    let _ = stdin.write_all(&request);
    drop(stdin);
    // The child is waited on by a thread; the wall-clock limit kills it from here.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let wall = Duration::from_secs(iso.wall_seconds.max(1));
    let (status, timed_out) = match rx.recv_timeout(wall) {
        Ok(s) => (s, false),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            (rx.recv().unwrap_or_else(|_| Err(std::io::Error::other("the parser process was lost"))), true)
        }
    };
    let status = status.map_err(|e| Error::Internal(format!("waiting for the parser process: {e}")))?;
    let (out, out_overflow) = out.join().unwrap_or_default();
    let (err, _) = err.join().unwrap_or_default();
    let stderr_tail = String::from_utf8_lossy(&err);
    if timed_out {
        return Err(limit_error(
            path,
            &format!("解析超过了 {} 秒的时间上限 (ingest.isolation.wall_seconds)", iso.wall_seconds),
        ));
    }
    if out_overflow {
        return Err(limit_error(path, "解析结果超出了文字上限 (ingest.limits.max_text_ratio)"));
    }
    if !status.success() {
        tracing::warn!(file = %path.display(), ?status, stderr = %stderr_tail.trim(), "the parser process failed");
        return Err(died(path, status, &stderr_tail, iso));
    }
    let reply: Reply = serde_json::from_slice(&out)
        .map_err(|e| Error::Internal(format!("the parser process's reply for {}: {e}", path.display())))?;
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

/// Reads `r` to its end, keeping at most `cap` bytes; whether more came.
fn read_capped(mut r: impl Read, cap: u64) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let _ = (&mut r).take(cap).read_to_end(&mut buf);
    // Drain the rest so the child never blocks on a full pipe.
    let more = std::io::copy(&mut r, &mut std::io::sink()).unwrap_or(0) > 0;
    (buf, more)
}

fn limit_error(path: &Path, what: &str) -> Error {
    Error::Parser {
        code: ErrorCode::TooLarge,
        message: format!("{}：{what}，此文件未导入；请检查文件是否损坏，或拆分后重新上传", file_name(path)),
    }
}

/// The failure of a child that did not reply: which limit ended it, when that can be told.
fn died(path: &Path, status: ExitStatus, stderr: &str, iso: &IsolationConfig) -> Error {
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal();
    if stderr.contains("memory allocation") || stderr.contains("out of memory") || stderr.contains("Cannot allocate") {
        return memory_error(path, iso);
    }
    if signal == Some(nix::libc::SIGXCPU) || signal == Some(nix::libc::SIGKILL) {
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
    let arg = |i: usize| std::env::args().nth(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(memory_mb), Some(cpu_seconds)) = (arg(2), arg(3)) else {
        eprintln!("usage: care {SUBCOMMAND} MEMORY_MB CPU_SECONDS (started by care itself)");
        return 2;
    };
    // A seccomp filter that forbids setrlimit (an older unit file) must not stop every upload: the file is then
    // parsed unconfined but still outside the server's process.
    if let Err(e) = limit_self(memory_mb, cpu_seconds) {
        eprintln!("care ingest-worker: setting resource limits failed ({e}); parsing without them");
    }
    let mut input = Vec::new();
    if std::io::stdin().take(1 << 20).read_to_end(&mut input).is_err() {
        return 2;
    }
    let Ok(req) = serde_json::from_slice::<Request>(&input) else {
        eprintln!("care ingest-worker: malformed request");
        return 2;
    };
    let reply = match read_then_confine(&req) {
        Err(e) => Reply { failed: Some(Failure::of(&e)), units: Vec::new() },
        Ok(units) => Reply {
            failed: None,
            units: units
                .into_iter()
                .map(|u| match u.result {
                    Ok(p) => UnitReply { name: u.name, parsed: Some(p), failed: None },
                    Err(e) => UnitReply { name: u.name, parsed: None, failed: Some(Failure::of(&e)) },
                })
                .collect(),
        },
    };
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer(&mut out, &reply).map_err(std::io::Error::from).and_then(|_| out.flush()) {
        Ok(()) => 0,
        Err(_) => 3,
    }
}

/// Address space, CPU time (SIGXCPU at the soft limit, SIGKILL a second later), no file writes (standard output is
/// a pipe, which the size limit does not cover), no core dumps.
fn limit_self(memory_mb: u64, cpu_seconds: u64) -> nix::Result<()> {
    use nix::sys::resource::{Resource, setrlimit};
    setrlimit(Resource::RLIMIT_AS, memory_mb << 20, memory_mb << 20)?;
    setrlimit(Resource::RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)?;
    setrlimit(Resource::RLIMIT_FSIZE, 0, 0)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
}

fn read_then_confine(req: &Request) -> Result<Vec<Unit>> {
    let path = &req.path;
    let (kind, bytes) = super::read_checked(path, &req.limits)?;
    confine();
    super::units_of_bytes(path, kind, &bytes, &req.options, &req.limits)
}

/// No further file access and no network for this process, as far as the kernel's Landlock allows (best effort:
/// an older kernel keeps the resource limits only).
fn confine() {
    use landlock::{ABI, Access, AccessFs, AccessNet, Ruleset, RulesetAttr};
    let abi = ABI::V4;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self());
    if let Err(e) = status {
        eprintln!("care ingest-worker: landlock unavailable ({e}); resource limits only");
    }
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

    #[test]
    fn a_capped_read_drains_the_rest_and_says_so() {
        let (buf, more) = read_capped(&b"0123456789"[..], 4);
        assert_eq!((buf.as_slice(), more), (&b"0123"[..], true));
        let (buf, more) = read_capped(&b"0123"[..], 4);
        assert_eq!((buf.as_slice(), more), (&b"0123"[..], false));
    }
}
