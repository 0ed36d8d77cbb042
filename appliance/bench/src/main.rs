//! `care-bench`: the appliance's benchmarks, apart from the `care` binary hospitals install. Every figure comes
//! from the search pipeline clinicians use (`engine.search().run` in process, `GET /api/v1/search` over HTTPS):
//!
//! * `care-bench --set DIR`: per-query latency of the pipeline and of its stages (as the pipeline times them),
//!   ingest and embedding throughput (`--http`: the same queries over HTTPS, split by `Server-Timing`);
//! * `--ann`: the dense leg's exact scan against IVF-PQ on a prepared directory (`--reuse`);
//! * `--filters`: filtered searches on a prepared directory;
//! * `--load`: `care serve` processes under closed- and open-loop load, with and without an ingest;
//! * `--absent FILE`: absent drug and disease names named, real queries flagged (issue 53's probe).
//! * `--ocr DIR`: the OCR's character error rate and pages per second on rendered scans (issue 54).
//!
//! The engine's configuration is `care.toml`'s defaults, `--config FILE` and `CARE__SECTION__KEY` variables.

mod absent;
mod ann;
mod filters;
mod hot_paths;
mod load;
mod ocr;

use std::path::PathBuf;

use anyhow::{Context, Result};
use care_engine::EngineConfig;
use clap::Parser;

/// Measure per-query latency of each search stage and ingest/embedding throughput on a BEIR set (JSON); with
/// --load, throughput and latency of `care serve` processes under concurrent load.
#[derive(Parser, Debug)]
#[command(name = "care-bench", version)]
struct Cli {
    /// A care.toml whose engine sections apply (CARE__SECTION__KEY variables apply over it).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long, required_unless_present = "ocr")]
    set: Option<PathBuf>,
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
    /// Absent-name probe (tests/bench/absent_names.py's JSONL) searched on the directory named by --reuse.
    #[arg(long, value_name = "FILE", requires = "reuse")]
    absent: Option<PathBuf>,
    /// With --absent: keep the probe's names out of the lexicons (how names no lexicon holds are found).
    #[arg(long, requires = "absent")]
    hold_out: bool,
    #[command(flatten)]
    load: Box<load::LoadArgs>,
    #[command(flatten)]
    ann: ann::AnnArgs,
    #[command(flatten)]
    filters: filters::FilterArgs,
    #[command(flatten)]
    ocr: ocr::OcrArgs,
}

fn main() {
    // Sandboxed parsers and graph checks are children of this executable (and not commands for people).
    care_engine::serve_sandboxed_child_or_register();
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn engine_config(file: Option<&std::path::Path>) -> Result<EngineConfig> {
    use figment::Figment;
    use figment::providers::{Env, Format, Serialized, Toml};
    let mut fig = Figment::from(Serialized::defaults(EngineConfig::default()));
    if let Some(p) = file {
        fig = fig.merge(Toml::file_exact(p));
    }
    Ok(fig.merge(Env::prefixed("CARE__").split("__")).extract()?)
}

fn run(cli: Cli) -> Result<i32> {
    let Cli { config, set, queries, e5s1, int8, threads, http, reuse, out, absent, hold_out, load, ann, filters, ocr } =
        cli;
    if let Some(dir) = &ocr.ocr {
        let report = ocr::run(&ocr, dir)?;
        ocr::write_recognised(&report, dir)?;
        let json = serde_json::to_string_pretty(&report)?;
        match &out {
            Some(out) => std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?,
            None => println!("{json}"),
        }
        return Ok(0);
    }
    let set = set.unwrap_or_default();
    if load.load {
        return load::run(&set, e5s1.as_deref(), int8, out.as_deref(), &load);
    }
    let cfg = engine_config(config.as_deref())?;
    match reuse {
        Some(reuse) if absent.is_some() => {
            let report = absent::run(&cfg, &set, &reuse, absent.as_deref().unwrap_or(&reuse), hold_out)?;
            let json = serde_json::to_string_pretty(&report)?;
            match &out {
                Some(out) => std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?,
                None => println!("{json}"),
            }
        }
        Some(reuse) if filters.filters => {
            let report = filters::run(&cfg, &set, &reuse, queries)?;
            filters::write(&report, out.as_ref())?;
        }
        Some(reuse) if ann.ann => {
            let report = ann::run(&cfg, &set, &reuse, queries, &ann)?;
            let json = serde_json::to_string_pretty(&report)?;
            match &out {
                Some(out) => {
                    std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
                    let svg_path = out.with_extension("svg");
                    std::fs::write(&svg_path, ann::chart(&report))
                        .with_context(|| format!("writing {}", svg_path.display()))?;
                }
                None => println!("{json}"),
            }
        }
        reuse => {
            let opts = hot_paths::BenchOptions { set, queries, e5s1, threads, http, int8, reuse };
            let report = hot_paths::run(&cfg, &opts)?;
            hot_paths::write(&report, out.as_deref())?;
            if let Some(out) = out {
                hot_paths::write_chart(&report, &out)?;
            }
        }
    }
    Ok(0)
}
