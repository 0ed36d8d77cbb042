//! Untrusted input handled in a child process of `care` itself, under resource limits.
//!
//! Two kinds of input are large third-party code fed hostile bytes: uploaded files (PDF, DOCX, HTML, archive
//! readers; [`crate::ingest::worker`]) and the ONNX graph of an imported model package (ONNX Runtime;
//! [`crate::lifecycle`]). Either can allocate gigabytes, loop or crash; inside `care serve` that would be a search
//! outage. So `care` re-executes itself with a hidden subcommand: the child limits its own address space, CPU time
//! and file writes first thing, reads one JSON request on standard input, gives up further file and network access
//! (Landlock, where the kernel has it) once it has read what it needs, and writes one JSON reply. The parent reads
//! the reply up to a bound and kills the child at a wall-clock limit.
//!
//! Processes that did not register the executable ([`use_executable`]: the engine's own tests, embedders) do the
//! work in-process, as before.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};

static EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// Registers the `care` executable that serves the sandboxed subcommands; from then on untrusted input is handled
/// in children.
pub fn use_executable(exe: PathBuf) {
    let _ = EXECUTABLE.set(exe);
}

/// The registered executable, if any.
pub fn executable() -> Option<&'static Path> {
    EXECUTABLE.get().map(PathBuf::as_path)
}

/// How a child ended: its status, its reply (at most the cap the parent gave), whether more came, the tail of its
/// standard error, and whether the wall-clock limit killed it.
pub struct Ended {
    pub status: ExitStatus,
    pub reply: Vec<u8>,
    pub reply_overflow: bool,
    pub stderr: String,
    pub timed_out: bool,
}

impl Ended {
    /// The signal that ended the child, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.signal()
    }

    /// Whether the child ran out of its address space (the allocator says so on standard error or in the reply).
    pub fn out_of_memory(&self) -> bool {
        allocation_failure(&self.stderr)
    }

    /// Whether the CPU-time limit ended the child (SIGXCPU at the soft limit, SIGKILL at the hard one).
    pub fn out_of_cpu(&self) -> bool {
        matches!(self.signal(), Some(s) if s == nix::libc::SIGXCPU || s == nix::libc::SIGKILL)
    }
}

/// Whether `text` (a child's standard error, or an error it replied with) says an allocation failed: the Rust
/// allocator, glibc and ONNX Runtime word it differently.
pub fn allocation_failure(text: &str) -> bool {
    ["memory allocation", "out of memory", "Cannot allocate", "bad_alloc", "Failed to allocate"]
        .iter()
        .any(|s| text.contains(s))
}

/// How a child marks a line of its standard error as a note for the parent (progress), not a message.
const NOTE_PREFIX: &str = "care-note ";

static IN_CHILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A note from a sandboxed child to its parent (e.g. `page 3 10`), passed to [`run`]'s `on_note` while the child
/// works; nothing outside a child.
pub fn note(text: &str) {
    if IN_CHILD.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{NOTE_PREFIX}{text}");
    }
}

/// What the parent hears from a running child.
enum Event {
    Note(String),
    Exited(std::io::Result<ExitStatus>),
}

/// Runs `exe args…` with only `env` in its environment, writes `request` to its standard input, and waits at most
/// `wall` for it to end (then kills it), keeping at most `reply_cap` bytes of its standard output. The child's
/// [`note`]s reach `on_note` as they come.
pub fn run(
    exe: &Path,
    args: &[String],
    env: &[(&str, OsString)],
    request: &[u8],
    reply_cap: u64,
    wall: Duration,
    on_note: &mut dyn FnMut(&str),
) -> Result<Ended> {
    let mut cmd = Command::new(exe);
    cmd.args(args).env_clear().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (k, v) = crate::encoders::NO_TELEMETRY;
    cmd.env(k, v);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child =
        cmd.spawn().map_err(|e| Error::Internal(format!("starting the sandboxed process {}: {e}", exe.display())))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (mut stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
        (Some(i), Some(o), Some(e)) => (i, o, e),
        _ => return Err(Error::Internal("the sandboxed process's pipes are missing".into())),
    };
    let out = std::thread::spawn(move || read_capped(stdout, reply_cap));
    let (tx, rx) = std::sync::mpsc::channel();
    let notes = tx.clone();
    let err = std::thread::spawn(move || read_notes(stderr, 64 << 10, &notes));
    let _ = stdin.write_all(request);
    drop(stdin);
    // The child is waited on by a thread; the wall-clock limit kills it from here.
    std::thread::spawn(move || {
        let _ = tx.send(Event::Exited(child.wait()));
    });
    let deadline = std::time::Instant::now() + wall;
    let (status, timed_out) = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(Event::Note(n)) => on_note(&n),
            Ok(Event::Exited(s)) => break (s, false),
            Err(_) => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let exited = rx.iter().find_map(|e| match e {
                    Event::Exited(s) => Some(s),
                    Event::Note(_) => None,
                });
                break (exited.unwrap_or_else(|| Err(std::io::Error::other("the sandboxed process was lost"))), true);
            }
        }
    };
    let status = status.map_err(|e| Error::Internal(format!("waiting for the sandboxed process: {e}")))?;
    let (reply, reply_overflow) = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    Ok(Ended { status, reply, reply_overflow, stderr: String::from_utf8_lossy(&err).into_owned(), timed_out })
}

/// Reads a child's standard error to its end: note lines go to `notes`, the rest is kept up to `cap` bytes. A line
/// is read at most 4 KiB at a time, so a child that writes without newlines costs no memory.
fn read_notes(r: impl Read, cap: usize, notes: &std::sync::mpsc::Sender<Event>) -> Vec<u8> {
    use std::io::BufRead;
    let (mut r, mut kept, mut line) = (std::io::BufReader::new(r), Vec::new(), Vec::new());
    loop {
        line.clear();
        match (&mut r).take(4096).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return kept,
            Ok(_) => {}
        }
        match line.strip_prefix(NOTE_PREFIX.as_bytes()) {
            Some(n) => {
                let _ = notes.send(Event::Note(String::from_utf8_lossy(n).trim_end().to_string()));
            }
            None if kept.len() < cap => kept.extend_from_slice(&line[..line.len().min(cap - kept.len())]),
            None => {}
        }
    }
}

/// Reads `r` to its end, keeping at most `cap` bytes; whether more came.
pub(crate) fn read_capped(mut r: impl Read, cap: u64) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let _ = (&mut r).take(cap).read_to_end(&mut buf);
    // Drain the rest so the child never blocks on a full pipe.
    let more = std::io::copy(&mut r, &mut std::io::sink()).unwrap_or(0) > 0;
    (buf, more)
}

/// The child's first step: its limits from the arguments after the subcommand (MEMORY_MB CPU_SECONDS [CPU_HARD]:
/// the hard CPU limit, which [`allow_more_cpu`] may raise the soft one to, defaults to one second more), then
/// its request (at most `max_request` bytes) from standard input. `None` (after a message on standard error) when
/// either is malformed. A seccomp filter that forbids setrlimit (an older unit file) must not stop every upload or
/// import: the work then runs without the limits, still outside the server's process.
pub fn child_start(who: &str, max_request: u64) -> Option<Vec<u8>> {
    let arg = |i: usize| std::env::args().nth(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(memory_mb), Some(cpu_seconds)) = (arg(2), arg(3)) else {
        eprintln!("usage: care {who} MEMORY_MB CPU_SECONDS [CPU_HARD] (started by care itself)");
        return None;
    };
    let cpu_hard = arg(4).unwrap_or(0).max(cpu_seconds + 1);
    IN_CHILD.store(true, std::sync::atomic::Ordering::Relaxed);
    let by_data = std::env::var(MEMORY_BY).is_ok_and(|v| v == BY_DATA);
    if let Err(e) = limit_self(memory_mb, by_data, cpu_seconds, cpu_hard) {
        eprintln!("care {who}: setting resource limits failed ({e}); running without them");
    }
    let mut input = Vec::new();
    if std::io::stdin().take(max_request).read_to_end(&mut input).is_err() {
        eprintln!("care {who}: reading the request failed");
        return None;
    }
    Some(input)
}

/// The child's last step: its reply on standard output; the process exit code.
pub fn child_reply(reply: &impl serde::Serialize) -> i32 {
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer(&mut out, reply).map_err(std::io::Error::from).and_then(|_| out.flush()) {
        Ok(()) => 0,
        Err(_) => 3,
    }
}

/// The environment variable that tells a child how its memory is bounded: unset, its address space; [`BY_DATA`],
/// the private memory it writes to (RLIMIT_DATA). A child that opens the GPU needs the second: the CUDA driver
/// reserves tens of gigabytes of address space (unified addressing) that it never touches, which an address-space
/// limit refuses, while every heap allocation, image and ONNX Runtime's host buffers still count.
pub const MEMORY_BY: &str = "CARE_SANDBOX_MEMORY";
pub const BY_DATA: &str = "data";

/// Memory (address space, or written private memory `by_data`), CPU time (SIGXCPU at the soft limit, SIGKILL a
/// second later), no file writes (standard output is a pipe, which the size limit does not cover), no core dumps.
fn limit_self(memory_mb: u64, by_data: bool, cpu_seconds: u64, cpu_hard: u64) -> nix::Result<()> {
    use nix::sys::resource::{Resource, setrlimit};
    let memory = if by_data { Resource::RLIMIT_DATA } else { Resource::RLIMIT_AS };
    setrlimit(memory, memory_mb << 20, memory_mb << 20)?;
    setrlimit(Resource::RLIMIT_CPU, cpu_seconds, cpu_hard)?;
    setrlimit(Resource::RLIMIT_FSIZE, 0, 0)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
}

/// Raises this process's CPU-time soft limit by `seconds`, up to its hard limit: a parser that starts work whose
/// size it knows (pages to read) gets that much more time, while a parser looping on a hostile file still stops at
/// the soft limit it started with. Does nothing where no limit is set.
pub fn allow_more_cpu(seconds: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_CPU)
        && soft != nix::sys::resource::RLIM_INFINITY
    {
        let _ = setrlimit(Resource::RLIMIT_CPU, soft.saturating_add(seconds).min(hard), hard);
    }
}

/// No further file access and no network for this process, as far as the kernel's Landlock allows (best effort:
/// an older kernel keeps the resource limits only).
pub fn confine(who: &str) {
    use landlock::{ABI, Access, AccessFs, AccessNet, Ruleset, RulesetAttr};
    let abi = ABI::V4;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self());
    if let Err(e) = status {
        eprintln!("care {who}: landlock unavailable ({e}); resource limits only");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_read_drains_the_rest_and_says_so() {
        let (buf, more) = read_capped(&b"abcdef"[..], 4);
        assert_eq!((buf.as_slice(), more), (&b"abcd"[..], true));
        let (buf, more) = read_capped(&b"ab"[..], 4);
        assert_eq!((buf.as_slice(), more), (&b"ab"[..], false));
    }

    #[test]
    fn notes_are_told_apart_from_messages_and_a_line_without_end_costs_no_memory() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut err = b"warning: x\ncare-note page 1 3\ncare-note page 2 3\n".to_vec();
        err.extend(std::iter::repeat_n(b'a', 1 << 20));
        let kept = read_notes(err.as_slice(), 64, &tx);
        drop(tx);
        let notes: Vec<String> = rx
            .iter()
            .filter_map(|e| match e {
                Event::Note(n) => Some(n),
                Event::Exited(_) => None,
            })
            .collect();
        assert_eq!(notes, ["page 1 3", "page 2 3"]);
        assert_eq!(kept.len(), 64);
        assert!(kept.starts_with(b"warning: x\naaa"));
    }
}
