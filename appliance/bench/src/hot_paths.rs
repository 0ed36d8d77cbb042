//! `care-bench`: per-query latency of each search stage and of the whole search (in process and over HTTPS),
//! plus ingest and embedding throughput, on a BEIR-layout set. Writes JSON; medians and p99 are what to compare.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use care_engine::engine::OpenMode;
use care_engine::eval::BeirSet;
use care_engine::{Engine, EngineConfig, SearchAs};
use serde::Serialize;

#[derive(Debug, Serialize, Default)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub n: usize,
}

impl Latency {
    pub(crate) fn from(mut xs: Vec<f64>) -> Self {
        if xs.is_empty() {
            return Latency::default();
        }
        xs.sort_by(f64::total_cmp);
        let q = |p: f64| xs[((xs.len() as f64 - 1.0) * p).round() as usize];
        Latency {
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            mean_ms: xs.iter().sum::<f64>() / xs.len() as f64,
            n: xs.len(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub set: String,
    pub queries: usize,
    pub corpus_documents: usize,
    pub model: Option<String>,
    pub model_threads: usize,
    /// The CPU (model name, cores) and the vector kernels' instruction set on it.
    pub cpu: String,
    pub cores: usize,
    pub vector_isa: String,
    /// The CPU's 8-bit dot-product support (what int8 query encoding gains here).
    pub int8_support: care_engine::kernels::Int8Support,
    pub ingest_seconds: f64,
    pub ingest_docs_per_second: f64,
    /// Model import plus embedding every chunk with the document encoder.
    pub embed_seconds: f64,
    pub embed_chunks_per_second: f64,
    pub encode_query: Latency,
    pub bm25: Latency,
    pub dense: Latency,
    pub fuse: Latency,
    pub hybrid_in_process: Latency,
    /// Mean share of the served dense top 100 that is also in an f32 exact scan's top 100 (1.0 = the same).
    pub dense_agreement_at_100: Option<f64>,
    pub hybrid_http: Option<Latency>,
    /// Where the HTTPS path's time goes, per query.
    pub http_parts: Option<HttpParts>,
    /// The encoder's share of `hybrid_in_process`, as the engine timed it (to compare with the HTTPS path's).
    pub in_process_encode: Latency,
    /// Mean time of each stage of the pipeline as it timed itself (`SearchResults::stages`), and `outside`: the
    /// whole call less the engine's own `took_ms` (the façade's checks and the search's audit record).
    pub stages_mean_ms: std::collections::BTreeMap<&'static str, f64>,
}

/// The HTTPS path's time split per query: the engine's search as it timed itself (`took_ms`, of which the query
/// encoding `encode_ms`), and everything outside it (TLS, HTTP, the token check, the hand-off to a blocking
/// thread, grants and the search audit, JSON) as the client's wall time minus `took_ms`. The server's
/// `Server-Timing` splits that further: the token check (`auth`, with its hand-off), the rest of the server
/// (`app` minus `auth` minus `took_ms`: the search's hand-off, grants, the audit, JSON) and the transport (wall
/// minus `app`: TLS, HTTP and the client's side of both).
#[derive(Debug, Serialize)]
pub struct HttpParts {
    /// The same façade call in process, alternated query by query with the HTTPS requests (which goes first
    /// alternates too), so both see the same machine state: `hybrid_http` minus this is the HTTPS path's cost.
    pub in_process_interleaved: Latency,
    /// p50 and p99 of the HTTPS requests minus those of `in_process_interleaved`.
    pub https_minus_in_process_p50_ms: f64,
    pub https_minus_in_process_p99_ms: f64,
    pub engine: Latency,
    pub encode: Latency,
    pub outside_engine: Latency,
    pub auth: Latency,
    pub server_rest: Latency,
    pub transport: Latency,
}

/// `(auth, app)` milliseconds from a `Server-Timing` header (0 for a part it lacks).
fn server_timing(h: &reqwest::header::HeaderMap) -> (f64, f64) {
    let v = h.get("server-timing").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let part = |name: &str| {
        v.split(',')
            .filter_map(|m| m.trim().strip_prefix(name)?.strip_prefix(";dur=")?.parse::<f64>().ok())
            .next()
            .unwrap_or(0.0)
    };
    (part("auth"), part("app"))
}

pub struct BenchOptions {
    pub set: PathBuf,
    pub queries: usize,
    pub e5s1: Option<PathBuf>,
    pub threads: usize,
    pub http: bool,
    pub int8: bool,
    pub reuse: Option<PathBuf>,
}

/// What preparing a benchmark data directory measured, kept beside it for runs that reuse it.
#[derive(Debug, Serialize, serde::Deserialize)]
struct Prepared {
    set: PathBuf,
    docs: usize,
    chunks: usize,
    ingest_seconds: f64,
    embed_seconds: f64,
}

const PREPARED: &str = "care-bench-prepared.json";

pub fn run(base: &EngineConfig, opts: &BenchOptions) -> Result<BenchReport> {
    let set = BeirSet::load(&opts.set, "dev")?;
    let dir =
        opts.reuse.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("care-bench-{}", std::process::id())));
    let mut cfg = base.clone();
    cfg.storage.data_dir = dir.clone();
    let marker = dir.join(PREPARED);
    let prepared = match std::fs::read(&marker).ok().and_then(|b| serde_json::from_slice::<Prepared>(&b).ok()) {
        Some(p) if p.set == opts.set => p,
        Some(p) => bail!("{} holds a benchmark of {}, not {}", dir.display(), p.set.display(), opts.set.display()),
        None => {
            let p = prepare(&cfg, &set, opts)?;
            if opts.reuse.is_some() {
                std::fs::write(&marker, serde_json::to_vec_pretty(&p)?)?;
            }
            p
        }
    };
    let (docs, chunks, ingest_seconds, embed_seconds) =
        (prepared.docs, prepared.chunks, prepared.ingest_seconds, prepared.embed_seconds);
    cfg.model.threads = opts.threads;
    let e = Arc::new(Engine::open(cfg, OpenMode::Existing)?);
    if opts.e5s1.is_some() {
        // A reused directory holds both query graphs: serve the one asked for (same pairing, nothing re-embedded).
        let query = if opts.int8 { "e5-small@1-int8" } else { "e5-small@1" };
        e.models().activate(&bench_admin(), query, "e5-small@1", &mut |_| Ok(()))?;
    }
    let col = e.indexer().collection("bench")?;
    let cols = vec![col.clone()];
    let queries: Vec<&str> = set.queries.iter().take(opts.queries).map(|(_, q)| q.as_str()).collect();
    // Warm-up: load the flat vectors, the ONNX session, tantivy's caches.
    for q in queries.iter().take(10) {
        e.search().run(&bench_admin(), &SearchAs { query: (*q).into(), ..Default::default() })?;
    }
    // Every figure is the search pipeline's, as clinicians' searches run it: the whole call timed here, each
    // stage as the pipeline timed it (`SearchResults::stages`).
    let (mut enc, mut bm, mut de, mut fu, mut all) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut stages: std::collections::BTreeMap<&'static str, f64> = Default::default();
    for q in &queries {
        let t = Instant::now();
        let res = e.search().run(&bench_admin(), &SearchAs { query: (*q).into(), ..Default::default() })?;
        let whole = ms(t);
        all.push(whole);
        enc.push(res.stages.encode_ms);
        bm.push(res.stages.bm25_ms);
        if res.stages.dense_ms > 0.0 {
            de.push(res.stages.dense_ms);
        }
        fu.push(res.stages.fuse_ms);
        let extra = [("legs", res.stages.legs_ms), ("took", res.took_ms), ("outside", whole - res.took_ms)];
        for (k, v) in res.stages.named().into_iter().chain(extra) {
            *stages.entry(k).or_default() += v / queries.len() as f64;
        }
        std::hint::black_box(res);
    }
    let all_encode = enc.clone();
    // The dense index's agreement with an exact f32 scan: a property of the index, measured apart from the timing.
    let mut served_dense: Vec<(Vec<f32>, Vec<i64>)> = Vec::new();
    if opts.e5s1.is_some() {
        for q in &queries {
            if let Some((vecs, m)) = e.retrieval().encode_queries(&[q])? {
                let hits = e.retrieval().dense_search(&vecs[0], &m, &cols, 100)?;
                served_dense.push((vecs[0].clone(), hits.iter().map(|h| h.chunk_id).collect()));
            }
        }
    }
    let dense_agreement_at_100 = dense_agreement(&e, &served_dense)?;
    let (hybrid_http, http_parts) = match opts.http {
        true => {
            let (wall, parts) = http_latency(e.clone(), &queries)?;
            (Some(wall), Some(parts))
        }
        false => (None, None),
    };
    let model = e.retrieval().active_models()?.map(|p| format!("{}@{}", p.query.name, p.query.version));
    let report = BenchReport {
        set: set.name.clone(),
        queries: queries.len(),
        corpus_documents: docs,
        model,
        model_threads: opts.threads,
        cpu: care_engine::kernels::cpu_model(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        vector_isa: care_engine::kernels::Isa::detected().name().into(),
        int8_support: care_engine::kernels::Int8Support::detected(),
        ingest_seconds,
        ingest_docs_per_second: docs as f64 / ingest_seconds.max(1e-9),
        embed_seconds,
        embed_chunks_per_second: if embed_seconds > 0.0 { chunks as f64 / embed_seconds } else { 0.0 },
        encode_query: Latency::from(enc),
        bm25: Latency::from(bm),
        dense: Latency::from(de),
        fuse: Latency::from(fu),
        hybrid_in_process: Latency::from(all),
        dense_agreement_at_100,
        hybrid_http,
        http_parts,
        in_process_encode: Latency::from(all_encode),
        stages_mean_ms: stages,
    };
    if opts.reuse.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

/// Ingests the set's corpus into a new data directory and embeds it (both query graphs imported when a model is
/// given, so later runs can switch between them).
fn prepare(cfg: &EngineConfig, set: &BeirSet, opts: &BenchOptions) -> Result<Prepared> {
    let mut cfg = cfg.clone();
    // Ingest and embed with every core; queries are then measured with `threads` (1 = one core).
    cfg.model.threads = 0;
    let e = Engine::open(cfg, OpenMode::Create)?;
    e.collections().create(&bench_admin(), "bench", "benchmark corpus")?;
    let t = Instant::now();
    let r = e.ingest().files(&bench_admin(), "bench", &[set.corpus_path()], &mut |_| {})?;
    if let Some(err) = r.files.iter().find_map(|f| f.error.clone()) {
        bail!("ingest failed: {err}");
    }
    let ingest_seconds = t.elapsed().as_secs_f64();
    let docs = r.files.iter().map(|f| f.added).sum::<usize>();
    let chunks = r.files.iter().map(|f| f.chunks).sum::<usize>();
    let mut embed_seconds = 0.0;
    if let Some(bin) = &opts.e5s1 {
        let t = Instant::now();
        let fp32 = e.retrieval().import_e5s1(bin, "1", None, false)?;
        // Documents stay fp32 (embedded offline); only the online query encoder may be the int8 graph. Same
        // weights, so the same pairing.
        e.retrieval().import_e5s1(bin, "1-int8", Some(&fp32.pairing_id), true)?;
        e.retrieval().sync_dense_indexes(&mut |_| Ok(()))?;
        embed_seconds = t.elapsed().as_secs_f64();
    }
    Ok(Prepared { set: opts.set.clone(), docs, chunks, ingest_seconds, embed_seconds })
}

/// How much of each served dense top 100 a plain f32 scan of the stored vectors also returns.
fn dense_agreement(e: &Engine, served: &[(Vec<f32>, Vec<i64>)]) -> Result<Option<f64>> {
    let stored = e.vectors().dense_vectors("bench")?;
    let Some(w) = stored.first().map(|v| v.1.len()) else { return Ok(None) };
    if served.is_empty() {
        return Ok(None);
    }
    let ids: Vec<i64> = stored.iter().map(|v| v.0).collect();
    let flat: Vec<f32> = stored.iter().flat_map(|v| v.1.iter().copied()).collect();
    let mut total = 0.0;
    for (q, got) in served {
        let exact: std::collections::HashSet<i64> =
            care_engine::dense::flat_top_k(&flat, w, q, 100).iter().map(|(_, i)| ids[*i]).collect();
        total += got.iter().filter(|c| exact.contains(c)).count() as f64 / exact.len().max(1) as f64;
    }
    Ok(Some(total / served.len() as f64))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Serves the engine on a loopback port in this process and times `GET /api/v1/search` over HTTPS, with the split
/// of each request's time ([`HttpParts`]).
fn http_latency(engine: Arc<Engine>, queries: &[&str]) -> Result<(Latency, HttpParts)> {
    let (tx, rx) = std::sync::mpsc::channel();
    // The API needs a caller: an administrator (reads every collection) with an API token, as a machine client has.
    engine.accounts().bootstrap_admin("bench", None)?;
    let (_, token) = engine.accounts().create_token(&care_engine::Admin::console("bench"), "bench", "care-bench")?;
    let settings = care_server::Settings {
        server: care_server::ServerConfig {
            bind: "127.0.0.1:0".into(),
            http_redirect_bind: String::new(),
            workers: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let served = engine.clone();
    std::thread::spawn(move || {
        let _ = actix_web::rt::System::new().block_on(care_server::serve(served, settings, move |addr, _| {
            let _ = tx.send(addr);
        }));
    });
    let addr = rx.recv_timeout(std::time::Duration::from_secs(30)).context("bench server did not start")?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    let client =
        reqwest::blocking::Client::builder().danger_accept_invalid_certs(true).default_headers(headers).build()?;
    let url = format!("https://{addr}/api/v1/search");
    for q in queries.iter().take(10) {
        client.get(&url).query(&[("q", q)]).send()?.error_for_status()?;
    }
    let (mut xs, mut took, mut encode, mut outside) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut auth, mut rest, mut transport, mut local) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let in_process = |q: &str| -> Result<f64> {
        let t = Instant::now();
        std::hint::black_box(engine.search().run(&bench_admin(), &SearchAs { query: q.into(), ..Default::default() })?);
        Ok(ms(t))
    };
    for (i, q) in queries.iter().enumerate() {
        if i % 2 == 0 {
            local.push(in_process(q)?);
        }
        let t = Instant::now();
        let r = client.get(&url).query(&[("q", q)]).send()?.error_for_status()?;
        let timing = server_timing(r.headers());
        let body = r.bytes()?;
        let wall = ms(t);
        if i % 2 == 1 {
            local.push(in_process(q)?);
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        let field = |k: &str| v[k].as_f64().unwrap_or(0.0);
        xs.push(wall);
        took.push(field("took_ms"));
        encode.push(field("encode_ms"));
        outside.push(wall - field("took_ms"));
        auth.push(timing.0);
        rest.push(timing.1 - timing.0 - field("took_ms"));
        transport.push(wall - timing.1);
    }
    let (https, local) = (Latency::from(xs), Latency::from(local));
    let parts = HttpParts {
        https_minus_in_process_p50_ms: https.p50_ms - local.p50_ms,
        https_minus_in_process_p99_ms: https.p99_ms - local.p99_ms,
        in_process_interleaved: local,
        engine: Latency::from(took),
        encode: Latency::from(encode),
        outside_engine: Latency::from(outside),
        auth: Latency::from(auth),
        server_rest: Latency::from(rest),
        transport: Latency::from(transport),
    };
    Ok((https, parts))
}

pub fn write(report: &BenchReport, out: Option<&Path>) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    if let Some(p) = out {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
    println!("{text}");
    Ok(())
}

/// The benchmark's own console administrator: its data directory is a scratch one, but it goes through the same
/// audited operations as everyone else.
pub(crate) fn bench_admin() -> care_engine::Admin {
    care_engine::Admin::console("bench")
}

/// The report's chart beside `out` (`.svg`): p50 and p99 of the whole search and of each stage.
pub fn write_chart(report: &BenchReport, out: &Path) -> Result<()> {
    let mut rows = vec![
        ("encode query".to_string(), &report.encode_query),
        ("BM25".to_string(), &report.bm25),
        ("dense".to_string(), &report.dense),
        ("fuse".to_string(), &report.fuse),
        ("hybrid (in process)".to_string(), &report.hybrid_in_process),
    ];
    if let Some(h) = &report.hybrid_http {
        rows.push(("hybrid (HTTPS)".to_string(), h));
    }
    if let Some(p) = &report.http_parts {
        rows.push(("in process, alternated with HTTPS".to_string(), &p.in_process_interleaved));
        rows.push(("HTTPS: encode inside".to_string(), &p.encode));
        rows.push(("HTTPS: outside the engine".to_string(), &p.outside_engine));
        rows.push(("HTTPS: token check".to_string(), &p.auth));
        rows.push(("HTTPS: rest of the server".to_string(), &p.server_rest));
        rows.push(("HTTPS: transport".to_string(), &p.transport));
    }
    let rows: Vec<(String, Vec<f64>)> = rows.into_iter().map(|(l, x)| (l, vec![x.p50_ms, x.p99_ms])).collect();
    let svg = care_engine::chart::grouped_bars(
        &format!("care-bench: {} ({} queries)", report.set, report.queries),
        " ms",
        &["p50", "p99"],
        &rows,
    );
    let svg_path = out.with_extension("svg");
    std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))
}
