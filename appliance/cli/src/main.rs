//! `care`: the appliance's command line (init, ingest, search, serve, demo, eval).

mod config;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use care_engine::engine::OpenMode;
use care_engine::eval::{self, BeirSet};
use care_engine::{Engine, EngineConfig, SearchRequest};
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
    /// Ingest .txt, .md and .jsonl files into a collection.
    Ingest {
        collection: String,
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Create the collection if it does not exist.
        #[arg(long)]
        create: bool,
        /// Print the per-file report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete documents (by id) from a collection.
    Delete { collection: String, #[arg(required = true)] ids: Vec<String> },
    /// Search and print ranked passages.
    Search {
        query: String,
        #[arg(long = "collection", short)]
        collections: Vec<String>,
        #[arg(long, short = 'n', default_value_t = 10)]
        limit: usize,
        #[arg(long)]
        json: bool,
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
    /// Serve the HTTPS search page and API.
    Serve {
        #[arg(long)]
        bind: Option<String>,
    },
    /// Initialise if needed, load the embedded demo collection, and serve.
    Demo {
        #[arg(long)]
        bind: Option<String>,
        /// Load the demo data and exit without serving.
        #[arg(long)]
        no_serve: bool,
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
    },
    /// Print the effective configuration (secrets masked).
    Config,
}

#[derive(Subcommand, Debug)]
enum CollectionCommand {
    Create {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    List,
}

#[derive(Subcommand, Debug)]
enum DictCommand {
    Add {
        #[arg(required = true)]
        words: Vec<String>,
    },
}

fn main() {
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
    let bind = match &cli.command {
        Command::Serve { bind } | Command::Demo { bind, .. } => bind.clone(),
        _ => None,
    };
    let overrides = config::CliOverrides { data_dir: cli.data_dir.clone(), bind };
    let cfg = config::load(cli.config.as_deref(), &overrides)?;
    let open = |mode| Engine::open(cfg.engine.clone(), mode).map_err(anyhow::Error::from);
    match cli.command {
        Command::Config => {
            print!("{}", config::redacted_toml(&cfg)?);
        }
        Command::Init => {
            let e = open(OpenMode::Create)?;
            println!("initialised {}", e.data_dir().root().display());
        }
        Command::Collection { command } => {
            let e = open(OpenMode::Existing)?;
            match command {
                CollectionCommand::Create { name, description } => {
                    let c = e.create_collection(&name, &description, "cli")?;
                    println!("created collection '{}'", c.name);
                }
                CollectionCommand::List => {
                    for c in e.collections()? {
                        println!("{}\t{} documents\t{} chunks", c.collection.name, c.documents, c.chunks);
                    }
                }
            }
        }
        Command::Ingest { collection, files, create, json } => {
            let e = open(OpenMode::Existing)?;
            if create {
                match e.create_collection(&collection, "", "cli") {
                    Ok(_) | Err(care_engine::Error::CollectionExists(_)) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            return ingest(&e, &collection, &files, json);
        }
        Command::Delete { collection, ids } => {
            let e = open(OpenMode::Existing)?;
            let n = e.delete_documents(&collection, &ids)?;
            println!("deleted {n} documents from '{collection}'");
        }
        Command::Search { query, collections, limit, json } => {
            let e = open(OpenMode::Existing)?;
            let req = SearchRequest {
                query,
                collections: if collections.is_empty() { None } else { Some(collections) },
                limit: Some(limit),
                offset: 0,
            };
            let res = e.search(&req)?;
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
        Command::Check => {
            let e = open(OpenMode::Existing)?;
            let r = e.check()?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            if !r.consistent {
                return Ok(3);
            }
        }
        Command::Dict { command: DictCommand::Add { words } } => {
            Engine::add_dictionary_words(&cfg.engine, &words)?;
            println!("added {} word(s); the lexical index was rebuilt", words.len());
        }
        Command::Serve { .. } => {
            let e = open(OpenMode::Existing)?;
            serve(e, cfg.server.clone())?;
        }
        Command::Demo { no_serve, .. } => {
            let e = open(OpenMode::Create)?;
            let r = care_engine::demo::load_demo(&e)?;
            eprintln!(
                "demo collection: {} added, {} updated, {} unchanged ({} chunks written)",
                r.added, r.replaced, r.unchanged, r.chunks
            );
            if !no_serve {
                serve(e, cfg.server.clone())?;
            }
        }
        Command::Eval { set, split, out } => {
            let report = evaluate(&cfg.engine, &set, &split, cli.data_dir.is_some())?;
            let text = serde_json::to_string_pretty(&report)?;
            if let Some(out) = out {
                std::fs::write(&out, &text).with_context(|| format!("writing {}", out.display()))?;
            }
            println!("{text}");
        }
    }
    Ok(0)
}

fn ingest(e: &Engine, collection: &str, files: &[PathBuf], json: bool) -> Result<i32> {
    let bar = ProgressBar::new(files.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} files {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = e.ingest_files(collection, files, &mut |p| {
        bar.set_position(p.files_done as u64);
        if p.documents_in_file > 0 {
            bar.set_message(format!("{}/{} documents in current file", p.documents_done, p.documents_in_file));
        }
    })?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    let mut err = std::io::stderr().lock();
    for f in &report.files {
        match &f.error {
            Some(msg) => writeln!(err, "FAILED {}: {msg}", f.path.display())?,
            None if !json => writeln!(
                err,
                "ok {}: {} added, {} replaced, {} unchanged, {} empty skipped, {} chunks",
                f.path.display(),
                f.added,
                f.replaced,
                f.unchanged,
                f.skipped_empty,
                f.chunks
            )?,
            None => {}
        }
    }
    // Exit 2 tells scripts that some files were rejected while the others were ingested.
    Ok(if report.failed() > 0 { 2 } else { 0 })
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
        println!("{:>2}. [{:.2}] {} ({}){}", h.rank, h.score, title, h.collection,
            if h.heading.is_empty() { String::new() } else { format!(" › {}", h.heading) });
        println!("    {}", snippet.replace('\n', " "));
    }
    println!("({} results in {:.1} ms)", res.hits.len(), res.took_ms);
}

fn serve(engine: Engine, server: care_server::ServerConfig) -> Result<()> {
    let engine = Arc::new(engine);
    tracing::info!(bind = %server.bind, "starting HTTPS server");
    actix_web::rt::System::new().block_on(care_server::serve(engine, server, |addr| {
        // Tests and scripts read this line to learn the port.
        println!("listening on https://{addr}");
        let _ = std::io::stdout().flush();
    }))?;
    Ok(())
}

#[derive(serde::Serialize)]
struct EvalReport {
    set: String,
    split: String,
    queries: usize,
    corpus_documents: usize,
    methods: BTreeMap<String, eval::MetricSummary>,
}

/// Ingests the set's corpus into its own collection (in a temporary data directory unless one was given) and
/// scores each retrieval method on the split's queries.
fn evaluate(base: &EngineConfig, set_dir: &std::path::Path, split: &str, keep_dir: bool) -> Result<EvalReport> {
    let set = BeirSet::load(set_dir, split)?;
    let tmp;
    let mut cfg = base.clone();
    if !keep_dir {
        tmp = tempfile_dir()?;
        cfg.storage.data_dir = tmp.clone();
    }
    let e = Engine::open(cfg.clone(), OpenMode::Create)?;
    let col = format!("eval-{}", set.name);
    if e.collection(&col).is_err() {
        e.create_collection(&col, "evaluation corpus", "eval")?;
    }
    let report = e.ingest_files(&col, &[set.corpus_path()], &mut |_| {})?;
    if let Some(err) = report.files.iter().find_map(|f| f.error.clone()) {
        bail!("ingesting the corpus failed: {err}");
    }
    let corpus_documents = e
        .collections()?
        .into_iter()
        .find(|c| c.collection.name == col)
        .map_or(0, |c| c.documents as usize);
    let mut runs = BTreeMap::new();
    for (qid, text) in &set.queries {
        let ranked = e.rank_bm25(text, &col, 100)?;
        runs.insert(qid.clone(), ranked.into_iter().map(|(d, _)| d).collect::<Vec<_>>());
    }
    let mut methods = BTreeMap::new();
    methods.insert("bm25".to_string(), eval::score(&set, &runs));
    if !keep_dir {
        let _ = std::fs::remove_dir_all(&cfg.storage.data_dir);
    }
    Ok(EvalReport { set: set.name.clone(), split: split.into(), queries: set.queries.len(), corpus_documents, methods })
}

fn tempfile_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("care-eval-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    Ok(base)
}
