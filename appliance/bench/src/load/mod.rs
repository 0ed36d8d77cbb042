//! `care-bench --load`: throughput and latency of `care serve` processes under load, over HTTPS on loopback.
//!
//! One run prepares a data directory once (the set's corpus ingested, the default model imported so hybrid search
//! uses dense retrieval), copies it for each server binary under test (`--server before=… --server after=…`), starts
//! each as `care serve` on a free loopback port and drives `GET /api/v1/search` with an API token:
//!
//! * closed loop: N clients each send their next query as soon as the previous one answered (`--concurrency`);
//! * open loop: queries sent on a fixed schedule whatever the server does (`--rates`), latency counted from the
//!   scheduled send time, so a slow server cannot hide queueing (no coordinated omission);
//! * with ingest: the closed loop again while the server ingests another collection uploaded through its admin API.
//!
//! With `--encoder NAME=SPEC` (repeated) the servers are one binary serving different query encoders from copies of
//! the same data directory: e5-small's `fp32` or `int8` graph, or a query package of e5-small's pairing (a pruned
//! encoder from `care-train prune` + `export`) as `DIR:fp32` or `DIR:int8`.
//!
//! Phases run server by server (order alternating) before the next phase starts, so every server sees the same
//! machine conditions. The client is one tokio worker thread; its CPU time is reported beside the server's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use care_engine::chart;

/// Flags of `care-bench --load` (the set, `--e5s1`, `--int8` and `--out` are shared with `care-bench`).
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Load benchmark: run `care serve` processes on loopback and measure search throughput and latency over
    /// HTTPS, closed- and open-loop, with and without a concurrent ingest (--set names the searched corpus).
    #[arg(long)]
    pub load: bool,
    /// With --load: a server binary to measure, NAME=PATH (repeat to compare builds side by side; the first one
    /// also prepares the data directory, so list the oldest first). Default: this executable, named "current".
    #[arg(long = "server", value_name = "NAME=PATH", requires = "load")]
    pub servers: Vec<String>,
    /// With --load: a query encoder to serve, NAME=SPEC (repeat to compare encoders side by side, the first is the
    /// baseline): `fp32` or `int8` (e5-small's graphs), or `DIR:fp32` / `DIR:int8` (a query package of e5-small's
    /// pairing, e.g. a pruned encoder). Each runs on the first --server's binary.
    #[arg(long = "encoder", value_name = "NAME=SPEC", requires = "load", conflicts_with = "servers")]
    pub encoders: Vec<String>,
    /// With --load: phases to run, of closed, open, ingest.
    #[arg(long, value_delimiter = ',', default_value = "closed,open,ingest", requires = "load")]
    pub phases: Vec<String>,
    /// With --load: closed-loop concurrencies (clients each waiting for its answer before sending again).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64", requires = "load")]
    pub concurrency: Vec<usize>,
    /// With --load: open-loop request rates per second (sent on schedule whatever the server does).
    #[arg(long, value_delimiter = ',', default_value = "5,10,20,40", requires = "load")]
    pub rates: Vec<f64>,
    /// With --load: closed-loop concurrencies measured again while another collection is ingested.
    #[arg(long, value_delimiter = ',', default_value = "16", requires = "load")]
    pub ingest_concurrency: Vec<usize>,
    /// With --load: measured seconds of each phase.
    #[arg(long, default_value_t = 20.0, requires = "load")]
    pub duration: f64,
    /// With --load: seconds of the same load before each measured window (not counted).
    #[arg(long, default_value_t = 5.0, requires = "load")]
    pub warmup: f64,
    /// With --load: idle seconds between phases.
    #[arg(long, default_value_t = 3.0, requires = "load")]
    pub settle: f64,
    /// With --load: seconds before a request counts as an error (timeout).
    #[arg(long, default_value_t = 30.0, requires = "load")]
    pub timeout: f64,
    /// With --load: open loop only: most requests in flight; a send beyond it is dropped (counted, not sent).
    #[arg(long, default_value_t = 512, requires = "load")]
    pub max_inflight: usize,
    /// With --load: BEIR-layout set whose corpus.jsonl is uploaded during the ingest phases (default: the cmedir set
    /// beside --set).
    #[arg(long, requires = "load")]
    pub ingest_set: Option<PathBuf>,
    /// With --load: documents uploaded per ingest phase (at most the ingest corpus).
    #[arg(long, default_value_t = 20_000, requires = "load")]
    pub ingest_docs: usize,
    /// With --load: use only the first N documents of the searched corpus (quick trials).
    #[arg(long, requires = "load")]
    pub max_docs: Option<usize>,
    /// With --load: folder holding a prepared data directory to reuse between runs (prepared into it when empty).
    #[arg(long, requires = "load")]
    pub prepared: Option<PathBuf>,
    /// With --load: folder for the servers' data directory copies, configs and logs (default: a temporary folder,
    /// removed afterwards unless --keep).
    #[arg(long, requires = "load")]
    pub work_dir: Option<PathBuf>,
    /// With --load: keep the work folder (server logs, data directories).
    #[arg(long, requires = "load")]
    pub keep: bool,
    /// With --load: retrieval method sent with each search (bm25, dense, rrf, weighted; default: the collection's,
    /// i.e. hybrid when a model is active).
    #[arg(long, requires = "load")]
    pub method: Option<String>,
}

mod ingest;
mod measure;
mod servers;

use ingest::*;
use measure::*;
use servers::*;

// ---------------------------------------------------------------------------------------------------------------
// Phases and the report

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Closed(usize),
    Open(f64),
    ClosedWithIngest(usize),
}

impl Phase {
    fn label(&self) -> String {
        match self {
            Phase::Closed(c) => format!("closed c={c}"),
            Phase::Open(r) => format!("open {r}/s"),
            Phase::ClosedWithIngest(c) => format!("closed c={c} + ingest"),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct PhaseResult {
    pub phase: String,
    pub server: String,
    /// closed or open
    pub kind: &'static str,
    pub concurrency: Option<usize>,
    pub rate_rps: Option<f64>,
    pub with_ingest: bool,
    /// Position in the run (phases interleave servers).
    pub sequence: usize,
    pub started_at: String,
    pub window_s: f64,
    #[serde(flatten)]
    pub window: Window,
    /// Open loop: sends dropped at the in-flight cap, and sends the client made >10 ms late.
    pub dropped: Option<usize>,
    pub late: Option<usize>,
    /// CPU seconds the server process and this client used during the measured window.
    pub server_cpu_s: Option<f64>,
    pub client_cpu_s: Option<f64>,
    /// /proc/loadavg at the start of the phase.
    pub load_avg: String,
    pub ingest: Option<IngestReport>,
}

#[derive(Debug, Serialize)]
pub struct Machine {
    /// std::thread::available_parallelism (what this process may use).
    pub cores: usize,
    /// "processor" lines in /proc/cpuinfo.
    pub cpus_online: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
    pub kernel: String,
    pub load_avg_start: String,
    pub load_avg_end: String,
}

#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub tool: &'static str,
    pub date: String,
    pub machine: Machine,
    pub set: String,
    pub queries: usize,
    pub prepared: Prepared,
    pub settings: serde_json::Value,
    pub servers: Vec<ServerInfo>,
    pub phases: Vec<PhaseResult>,
    pub summary: serde_json::Value,
}

fn proc_cpu_s(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ: 100 on Linux.
    Some(ticks / 100.0)
}

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = care_engine::kernels::cpu_model();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Machine {
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        cpus_online: cpuinfo.lines().filter(|l| l.starts_with("processor")).count(),
        cpu_model,
        memory_mib: memory_kib / 1024,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        load_avg_start: load_avg(),
        load_avg_end: String::new(),
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn modified(p: &Path) -> String {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .map(time::OffsetDateTime::from)
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// `NAME=PATH` flags, or the `care` built beside this executable as "current".
fn parse_servers(flags: &[String]) -> Result<Vec<(String, PathBuf)>> {
    if flags.is_empty() {
        return Ok(vec![("current".into(), std::env::current_exe()?.with_file_name("care"))]);
    }
    let mut out = Vec::new();
    for (name, path) in named_flags("--server", flags, "--server before=/usr/bin/care")? {
        let path = PathBuf::from(path);
        let path = path.canonicalize().with_context(|| format!("--server {name}: {}", path.display()))?;
        out.push((name, path));
    }
    Ok(out)
}

/// `NAME=VALUE` flags, each name letters, digits, '-' or '_' and given once.
fn named_flags(flag: &str, flags: &[String], example: &str) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for f in flags {
        let Some((name, value)) = f.split_once('=') else {
            bail!("{flag} {f:?}: use NAME=VALUE, e.g. {example}");
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            bail!("{flag} {f:?}: the name must be letters, digits, '-' or '_'");
        }
        if out.iter().any(|(n, _)| n == name) {
            bail!("{flag} {name} given twice");
        }
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

/// True for a positive number (false for NaN).
fn positive(x: f64) -> bool {
    x > 0.0
}

fn phase_list(a: &LoadArgs) -> Result<Vec<Phase>> {
    let mut out = Vec::new();
    for p in &a.phases {
        match p.trim() {
            "closed" => out.extend(a.concurrency.iter().map(|&c| Phase::Closed(c))),
            "open" => out.extend(a.rates.iter().map(|&r| Phase::Open(r))),
            "ingest" => out.extend(a.ingest_concurrency.iter().map(|&c| Phase::ClosedWithIngest(c))),
            "" => {}
            other => bail!("unknown phase {other:?}: use closed, open or ingest"),
        }
    }
    if out.iter().any(|p| matches!(p, Phase::Closed(0) | Phase::ClosedWithIngest(0)))
        || out.iter().any(|p| matches!(p, Phase::Open(r) if !positive(*r)))
    {
        bail!("concurrencies and rates must be positive");
    }
    if out.is_empty() {
        bail!("no phase to run");
    }
    Ok(out)
}

struct Run<'a> {
    a: &'a LoadArgs,
    rt: tokio::runtime::Runtime,
    queries: Arc<Vec<String>>,
    ingest_body: Vec<u8>,
    ingest_docs: usize,
    sequence: usize,
}

impl Run<'_> {
    fn phase(&mut self, s: &mut Server, phase: Phase, index: usize) -> Result<PhaseResult> {
        s.check_alive()?;
        let a = self.a;
        let t = s.target(a);
        let (w0, w1) = (a.warmup, a.warmup + a.duration);
        let offset = (index * 997) % self.queries.len();
        let pid = s.pid().map(|p| p.to_string());
        let load = load_avg();
        let started_at = now_rfc3339();
        self.sequence += 1;
        eprintln!("[{}] {} ...", s.name, phase.label());
        let queries = self.queries.clone();
        let ingest_body = &self.ingest_body;
        let collection = format!("bench-ingest-{}-{}-{}", s.name, index, std::process::id());
        let (samples, counts, cpu, ingest) = self.rt.block_on(async {
            let ingest = if let Phase::ClosedWithIngest(_) = phase {
                Some(start_ingest(&t, &collection, ingest_body).await?)
            } else {
                None
            };
            let start = Instant::now();
            // CPU time of the server and of this client over the measured window.
            let cpu = tokio::spawn({
                let pid = pid.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs_f64(w0)).await;
                    let s0 = pid.as_deref().and_then(proc_cpu_s);
                    let c0 = proc_cpu_s("self");
                    tokio::time::sleep(Duration::from_secs_f64(w1 - w0)).await;
                    let diff = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
                    (diff(s0, pid.as_deref().and_then(proc_cpu_s)), diff(c0, proc_cpu_s("self")))
                }
            });
            let stop = Arc::new(AtomicBool::new(false));
            let polls = Arc::new(Mutex::new(Vec::new()));
            let poller = ingest.map(|(id, _)| {
                let (t, stop, polls) = (t.clone(), stop.clone(), polls.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        if let Ok((state, documents)) = job_status(&t, id).await {
                            let done = finished(&state);
                            polls.lock().unwrap().push(JobPoll { t: start.elapsed().as_secs_f64(), documents, state });
                            if done {
                                break;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                })
            });
            let (samples, counts) = match phase {
                Phase::Closed(c) | Phase::ClosedWithIngest(c) => {
                    (closed_loop(&t, &queries, offset, c, start, w1).await, None)
                }
                Phase::Open(r) => {
                    let (s, c) = open_loop(&t, &queries, offset, r, start, (w0, w1), a.max_inflight).await;
                    (s, Some(c))
                }
            };
            let cpu = cpu.await.unwrap_or((None, None));
            stop.store(true, Ordering::SeqCst);
            if let Some(p) = poller {
                let _ = p.await;
            }
            let ingest = match ingest {
                Some((id, queued_s)) => {
                    let (a0, a1, fin, covered, state) = ingest_report(&polls.lock().unwrap(), w0, w1);
                    let cleanup = Instant::now();
                    stop_ingest(&t, &collection, id).await?;
                    Some(IngestReport {
                        collection: collection.clone(),
                        job_id: id,
                        documents_uploaded: self.ingest_docs,
                        queued_s,
                        documents_at_window_start: a0,
                        documents_at_window_end: a1,
                        documents_per_s_in_window: (a1 - a0) as f64 / (w1 - w0),
                        finished_in_window: fin,
                        window_covered: covered,
                        state_at_window_end: state,
                        cleanup_s: cleanup.elapsed().as_secs_f64(),
                    })
                }
                None => None,
            };
            anyhow::Ok((samples, counts, cpu, ingest))
        })?;
        s.check_alive()?;
        let window = summarize(&samples, w0, w1);
        if window.requests == 0 {
            eprintln!("[{}] warning: no request was due in the measured window (one outlasted it?)", s.name);
        }
        let (concurrency, rate) = match phase {
            Phase::Closed(c) | Phase::ClosedWithIngest(c) => (Some(c), None),
            Phase::Open(r) => (None, Some(r)),
        };
        let r = PhaseResult {
            phase: phase.label(),
            server: s.name.clone(),
            kind: if rate.is_some() { "open" } else { "closed" },
            concurrency,
            rate_rps: rate,
            with_ingest: matches!(phase, Phase::ClosedWithIngest(_)),
            sequence: self.sequence,
            started_at,
            window_s: a.duration,
            window,
            dropped: counts.as_ref().map(|c| c.dropped),
            late: counts.as_ref().map(|c| c.late),
            server_cpu_s: cpu.0,
            client_cpu_s: cpu.1,
            load_avg: load,
            ingest,
        };
        eprintln!(
            "[{}] {}: {:.1} req/s, p50 {:.0} ms, p99 {:.0} ms, {} errors",
            s.name, r.phase, r.window.throughput_rps, r.window.latency.p50_ms, r.window.latency.p99_ms, r.window.errors
        );
        Ok(r)
    }
}

pub fn run(set: &Path, e5s1: Option<&Path>, int8: bool, out: Option<&Path>, a: &LoadArgs) -> Result<i32> {
    if !positive(a.duration) || !positive(a.timeout) || a.warmup < 0.0 || a.settle < 0.0 {
        bail!("--duration and --timeout must be positive, --warmup and --settle not negative");
    }
    let encoders = parse_encoders(&a.encoders)?;
    let servers: Vec<(String, PathBuf)> = match parse_servers(&a.servers)? {
        // One binary serving each encoder.
        bins if !encoders.is_empty() => encoders.iter().map(|(n, _)| (n.clone(), bins[0].1.clone())).collect(),
        bins => bins,
    };
    if let Some((name, bin)) = servers.iter().find(|(_, bin)| !bin.is_file()) {
        bail!("server {name}: no {} (build `care` beside care-bench, or name one with --server)", bin.display());
    }
    if !encoders.is_empty() && e5s1.is_none() {
        bail!("--encoder needs --e5s1: the documents are embedded by e5-small");
    }
    // e5-small's int8 graph is prepared when an encoder asks for it.
    let int8 = int8 || encoders.iter().any(|(_, e)| *e == EncoderSpec::E5(care_engine::Graph::Int8));
    let phases = phase_list(a)?;
    let queries = read_queries(set)?;
    let mut m = machine();
    let date = now_rfc3339();
    let set_name = set.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();

    let wants_ingest = phases.iter().any(|p| matches!(p, Phase::ClosedWithIngest(_)));
    let (ingest_body, ingest_docs, ingest_set) = if wants_ingest {
        let dir = match &a.ingest_set {
            Some(d) => d.clone(),
            None => set.parent().map(|p| p.join("cmedir")).unwrap_or_default(),
        };
        let f = dir.join("corpus.jsonl");
        let text = std::fs::read_to_string(&f).with_context(|| {
            format!("reading the ingest corpus {} (pass --ingest-set, or --phases closed,open)", f.display())
        })?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).take(a.ingest_docs).collect();
        (format!("{}\n", lines.join("\n")).into_bytes(), lines.len(), Some(dir))
    } else {
        (Vec::new(), 0, None)
    };

    let temp = a.work_dir.is_none();
    let work = a
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("care-bench-load-{}", std::process::id())));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let prepared_root = a.prepared.clone().unwrap_or_else(|| work.join("prepared"));
    let prepared = prepare(&servers[0].1, &prepared_root, set, e5s1, int8, a.max_docs)?;

    let mut running = Vec::new();
    for (i, (name, bin)) in servers.iter().enumerate() {
        let encoder = encoders.get(i).map(|(_, e)| e);
        running.push(start_server(name, bin, (&prepared_root.join("data"), encoder), e5s1, &work)?);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let burst = a.concurrency.iter().chain(&a.ingest_concurrency).copied().max().unwrap_or(4).max(1);
    for s in &mut running {
        let (first, warm) = rt.block_on(warm_up(&s.target(a), &queries, burst))?;
        eprintln!("[{}] first search {first:.1} s, warm-up at concurrency {burst} {warm:.1} s", s.name);
        (s.first_search_s, s.warm_up_s) = (first, warm);
    }
    let mut r = Run { a, rt, queries: Arc::new(queries), ingest_body, ingest_docs, sequence: 0 };
    let mut results = Vec::new();
    let n = running.len();
    for (i, phase) in phases.iter().enumerate() {
        // Alternate which server goes first so that neither always follows the other's load.
        for k in 0..n {
            let s = &mut running[(i + k) % n];
            results.push(r.phase(s, *phase, i)?);
            std::thread::sleep(Duration::from_secs_f64(a.settle));
        }
    }
    m.load_avg_end = load_avg();
    let infos: Vec<ServerInfo> = running
        .iter()
        .map(|s| ServerInfo {
            name: s.name.clone(),
            binary: s.bin.clone(),
            version: s.version.clone(),
            profile: s.profile.clone(),
            binary_bytes: std::fs::metadata(&s.bin).map_or(0, |m| m.len()),
            binary_modified: modified(&s.bin),
            startup_s: s.startup_s,
            encoder: s.encoder.clone(),
            first_search_s: s.first_search_s,
            warm_up_s: s.warm_up_s,
        })
        .collect();
    let logs: Vec<(String, PathBuf, PathBuf)> =
        running.iter().map(|s| (s.name.clone(), s.log.clone(), s.config.clone())).collect();
    drop(running);
    drop(r);

    let names: Vec<String> = servers.iter().map(|(n, _)| n.clone()).collect();
    let summary = summary(&results, &names);
    let report = LoadReport {
        tool: "care-bench --load",
        date,
        machine: m,
        set: set_name,
        queries: queries_len(set),
        prepared,
        settings: serde_json::json!({
            "duration_s": a.duration,
            "warmup_s": a.warmup,
            "settle_s": a.settle,
            "timeout_s": a.timeout,
            "concurrency": a.concurrency,
            "rates": a.rates,
            "ingest_concurrency": a.ingest_concurrency,
            "phases": a.phases,
            "ingest_set": ingest_set,
            "ingest_docs": ingest_docs,
            "max_inflight": a.max_inflight,
            "method": a.method,
            "client": "one tokio worker thread in the `care-bench` process, on the same machine as the servers",
            "server_config": "compiled defaults, bind 127.0.0.1:0, no HTTP redirect listener (CARE__* variables apply)",
        }),
        servers: infos,
        phases: results,
        summary,
    };
    let text = serde_json::to_string_pretty(&report)?;
    print_table(&report);
    match out {
        Some(p) => {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
            let svg_path = p.with_extension("svg");
            std::fs::write(&svg_path, svg(&report)).with_context(|| format!("writing {}", svg_path.display()))?;
            println!("wrote {} and {}", p.display(), svg_path.display());
        }
        None => println!("{text}"),
    }
    if temp && !a.keep {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        for (name, log, config) in &logs {
            eprintln!("[{name}] config {}, log {}", config.display(), log.display());
        }
    }
    Ok(0)
}

fn queries_len(set: &Path) -> usize {
    read_queries(set).map_or(0, |q| q.len())
}

fn find<'a>(results: &'a [PhaseResult], server: &str, phase: &str) -> Option<&'a PhaseResult> {
    results.iter().find(|r| r.server == server && r.phase == phase)
}

/// Per closed-loop concurrency: each server's throughput and p99, and throughput relative to the first server;
/// per ingest phase: p99 with the ingest over p99 without it (same concurrency), per server.
fn summary(results: &[PhaseResult], servers: &[String]) -> serde_json::Value {
    let base = &servers[0];
    let mut closed = Vec::new();
    let mut concurrencies: Vec<usize> =
        results.iter().filter(|r| r.kind == "closed" && !r.with_ingest).filter_map(|r| r.concurrency).collect();
    concurrencies.dedup();
    for c in concurrencies {
        let label = Phase::Closed(c).label();
        let mut per = serde_json::Map::new();
        let mut ratio = serde_json::Map::new();
        let b = find(results, base, &label).map(|r| r.window.throughput_rps);
        for s in servers {
            if let Some(r) = find(results, s, &label) {
                per.insert(
                    s.clone(),
                    serde_json::json!({"throughput_rps": r.window.throughput_rps, "p50_ms": r.window.latency.p50_ms,
                        "p99_ms": r.window.latency.p99_ms, "errors": r.window.errors}),
                );
                if s != base
                    && let Some(b) = b.filter(|b| *b > 0.0)
                {
                    ratio.insert(format!("{s}/{base}"), (r.window.throughput_rps / b).into());
                }
            }
        }
        closed.push(serde_json::json!({"concurrency": c, "servers": per, "throughput_ratio": ratio}));
    }
    let mut ingest = Vec::new();
    for r in results.iter().filter(|r| r.with_ingest) {
        let c = r.concurrency.unwrap_or(0);
        let without = find(results, &r.server, &Phase::Closed(c).label());
        let ratio = without.map(|w| w.window.latency.p99_ms).filter(|p| *p > 0.0).map(|p| r.window.latency.p99_ms / p);
        ingest.push(serde_json::json!({
            "server": r.server,
            "concurrency": c,
            "p99_without_ingest_ms": without.map(|w| w.window.latency.p99_ms),
            "p99_with_ingest_ms": r.window.latency.p99_ms,
            "p99_ratio_with_over_without": ratio,
            "throughput_without_rps": without.map(|w| w.window.throughput_rps),
            "throughput_with_rps": r.window.throughput_rps,
            "errors_with_ingest": r.window.errors,
            "ingest_documents_in_window": r.ingest.as_ref().map(|i| i.documents_at_window_end - i.documents_at_window_start),
            "ingest_window_covered": r.ingest.as_ref().map(|i| i.window_covered),
        }));
    }
    serde_json::json!({"baseline": base, "closed": closed, "ingest": ingest})
}

fn cores_label(m: &Machine) -> String {
    format!("{} cores, {}", m.cores, m.cpu_model)
}

fn print_table(r: &LoadReport) {
    println!(
        "care-bench --load: {} ({} documents, {} queries) on {}; {} s windows after {} s warm-up",
        r.set,
        r.prepared.corpus_documents,
        r.queries,
        cores_label(&r.machine),
        r.settings["duration_s"],
        r.settings["warmup_s"]
    );
    for s in &r.servers {
        println!("  {}: {} ({}, {} build)", s.name, s.binary.display(), s.version, s.profile);
    }
    println!(
        "{:<24} {:<10} {:>8} {:>8} {:>8} {:>8} {:>7}  notes",
        "phase", "server", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors"
    );
    for p in &r.phases {
        let mut notes = Vec::new();
        if let Some(d) = p.dropped.filter(|d| *d > 0) {
            notes.push(format!("{d} dropped"));
        }
        if let Some(l) = p.late.filter(|l| *l > 0) {
            notes.push(format!("{l} sent late"));
        }
        if let Some(cpu) = p.server_cpu_s {
            notes.push(format!("server {:.0}% CPU", 100.0 * cpu / p.window_s));
        }
        if let Some(cpu) = p.client_cpu_s {
            notes.push(format!("client {:.0}%", 100.0 * cpu / p.window_s));
        }
        if let Some(i) = &p.ingest {
            notes.push(format!(
                "ingest {} docs in window{}",
                i.documents_at_window_end - i.documents_at_window_start,
                if i.finished_in_window {
                    format!(", ended at {:.0}% of it", 100.0 * i.window_covered)
                } else {
                    String::new()
                }
            ));
        }
        println!(
            "{:<24} {:<10} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7}  {}",
            p.phase,
            p.server,
            p.window.throughput_rps,
            p.window.latency.p50_ms,
            p.window.latency.p90_ms,
            p.window.latency.p99_ms,
            p.window.errors,
            notes.join(", ")
        );
    }
    let cores = r.machine.cores;
    for c in r.summary["closed"].as_array().into_iter().flatten() {
        for (k, v) in c["throughput_ratio"].as_object().into_iter().flatten() {
            println!("throughput closed c={} {k}: {:.2}x ({cores} cores)", c["concurrency"], v.as_f64().unwrap_or(0.0));
        }
    }
    for i in r.summary["ingest"].as_array().into_iter().flatten() {
        if let Some(x) = i["p99_ratio_with_over_without"].as_f64() {
            println!(
                "p99 with ingest / without, closed c={} [{}]: {x:.2}x ({cores} cores)",
                i["concurrency"],
                i["server"].as_str().unwrap_or("")
            );
        }
    }
}

/// One chart row per phase label (in run order) kept by `keep`, with `value`'s numbers for each server in turn
/// (`width` zeros for a server that lacks the phase).
fn rows(
    r: &LoadReport,
    names: &[&str],
    keep: impl Fn(&PhaseResult) -> bool,
    value: impl Fn(&PhaseResult) -> Vec<f64>,
    width: usize,
) -> Vec<(String, Vec<f64>)> {
    let mut labels: Vec<String> = Vec::new();
    for p in r.phases.iter().filter(|p| keep(p)) {
        if !labels.contains(&p.phase) {
            labels.push(p.phase.clone());
        }
    }
    labels
        .into_iter()
        .map(|l| {
            let v =
                names.iter().flat_map(|s| find(&r.phases, s, &l).map_or_else(|| vec![0.0; width], &value)).collect();
            (l, v)
        })
        .collect()
}

fn svg(r: &LoadReport) -> String {
    let names: Vec<&str> = r.servers.iter().map(|s| s.name.as_str()).collect();
    let cores = cores_label(&r.machine);
    let closed = |p: &PhaseResult| p.kind == "closed" && !p.with_ingest;
    let open = |p: &PhaseResult| p.kind == "open";
    let tput = |p: &PhaseResult| vec![p.window.throughput_rps];
    let p50p99 = |p: &PhaseResult| vec![p.window.latency.p50_ms, p.window.latency.p99_ms];
    let p99 = |p: &PhaseResult| vec![p.window.latency.p99_ms];
    let both: Vec<String> = names.iter().flat_map(|n| [format!("{n} p50"), format!("{n} p99")]).collect();
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let mut charts = Vec::new();
    let t = rows(r, &names, closed, tput, 1);
    if !t.is_empty() {
        charts.push(chart::grouped_bars(&format!("Closed-loop throughput ({cores})"), " req/s", &names, &t));
        let l = rows(r, &names, closed, p50p99, 2);
        charts.push(chart::grouped_bars("Closed-loop latency", " ms", &both, &l));
    }
    let o = rows(r, &names, open, p50p99, 2);
    if !o.is_empty() {
        let title = format!("Open-loop latency, counted from the scheduled send ({cores})");
        charts.push(chart::grouped_bars(&title, " ms", &both, &o));
        let t = rows(r, &names, open, tput, 1);
        charts.push(chart::grouped_bars("Open-loop achieved throughput", " req/s", &names, &t));
    }
    let ingest_cs: Vec<usize> = r.phases.iter().filter(|p| p.with_ingest).filter_map(|p| p.concurrency).collect();
    if !ingest_cs.is_empty() {
        let keep = |p: &PhaseResult| {
            p.with_ingest || (p.kind == "closed" && p.concurrency.is_some_and(|c| ingest_cs.contains(&c)))
        };
        let title = format!("Search p99 without and with a concurrent ingest ({cores})");
        charts.push(chart::grouped_bars(&title, " ms", &names, &rows(r, &names, keep, p99, 1)));
    }
    chart::stack(&charts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(issued: f64, ended: f64) -> Sample {
        Sample { issued, ended, outcome: Outcome::Ok }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), 50.0);
        assert_eq!(percentile(&xs, 0.99), 99.0);
        assert_eq!(percentile(&xs, 1.0), 100.0);
        assert_eq!(percentile(&xs, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        // 10 values: p99 is the largest, p90 the 9th.
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 0.99), 10.0);
        assert_eq!(percentile(&ten, 0.9), 9.0);
        let l = latency(vec![3.0, 1.0, 2.0]);
        assert_eq!((l.p50_ms, l.max_ms, l.mean_ms), (2.0, 3.0, 2.0));
    }

    #[test]
    fn open_loop_schedule_is_fixed_rate() {
        let s: Vec<f64> = schedule(10.0, 1.0).collect();
        assert_eq!(s.len(), 10);
        assert!((s[9] - 0.9).abs() < 1e-12);
        assert_eq!(schedule(4.0, 2.5).count(), 10);
        assert_eq!(schedule(1.0, 0.0).count(), 0);
    }

    #[test]
    fn window_counts_requests_due_in_it_and_latency_from_their_due_time() {
        let samples = vec![
            ok(0.5, 1.5), // warm-up: not counted, but its answer arrives in the window (throughput)
            ok(1.0, 1.1), // 100 ms
            ok(2.0, 2.3), // 300 ms
            ok(2.9, 3.4), // due in the window, answered after it: latency counts, throughput does not
            Sample { issued: 1.5, ended: 1.6, outcome: Outcome::Status(503) },
            Sample { issued: 2.5, ended: 2.6, outcome: Outcome::Transport("timeout") },
            ok(3.0, 3.1), // after the window
        ];
        let w = summarize(&samples, 1.0, 3.0);
        assert_eq!((w.requests, w.ok, w.errors), (5, 3, 2));
        assert_eq!(w.error_kinds.get("http 503"), Some(&1));
        assert_eq!(w.error_kinds.get("timeout"), Some(&1));
        // Answers in [1, 3): 1.5, 1.1, 2.3 -> 3 in 2 s.
        assert!((w.throughput_rps - 1.5).abs() < 1e-9);
        assert!((w.latency.p50_ms - 300.0).abs() < 1e-6, "{:?}", w.latency);
        assert!((w.latency.max_ms - 500.0).abs() < 1e-6);
    }

    #[test]
    fn ingest_progress_in_the_window() {
        let polls = vec![
            JobPoll { t: 0.0, documents: 0, state: "running".into() },
            JobPoll { t: 1.0, documents: 100, state: "running".into() },
            JobPoll { t: 3.0, documents: 500, state: "running".into() },
            JobPoll { t: 4.0, documents: 600, state: "done".into() },
        ];
        let (a, b, fin, covered, state) = ingest_report(&polls, 1.0, 5.0);
        assert_eq!((a, b, fin, state.as_str()), (100, 600, true, "done"));
        assert!((covered - 0.75).abs() < 1e-9);
        let (_, b, fin, covered, _) = ingest_report(&polls[..3], 1.0, 5.0);
        assert_eq!((b, fin, covered), (500, false, 1.0));
    }

    #[test]
    fn server_flags_and_phases() {
        assert!(parse_servers(&["before".into()]).is_err());
        assert!(parse_servers(&["a b=/bin/sh".into()]).is_err());
        assert!(parse_servers(&["x=/bin/sh".into(), "x=/bin/sh".into()]).is_err());
        let s = parse_servers(&["before=/bin/sh".into(), "after=/bin/sh".into()]).unwrap();
        assert_eq!(s[1].0, "after");
        assert_eq!(parse_servers(&[]).unwrap()[0].0, "current");
        assert_eq!(
            parse_import("imported e5-small@1 (pairing e5-small-q4@1) into /d/models/x\n"),
            Some(("e5-small".into(), "e5-small-q4@1".into()))
        );
    }
}
