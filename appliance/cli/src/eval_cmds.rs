//! `care eval`, `care eval-sts` and `care tune-fusion`: BEIR and STS sets scored through the search pipeline.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Result, bail};
use care_engine::engine::OpenMode;
use care_engine::eval::{self, BeirSet};
use care_engine::fusion::Method;
use care_engine::{Engine, EngineConfig};
use indicatif::ProgressBar;

use crate::{console, dense_bar, dense_progress};

#[derive(serde::Serialize)]
pub(crate) struct EvalReport {
    pub(crate) set: String,
    pub(crate) split: String,
    pub(crate) queries: usize,
    pub(crate) corpus_documents: usize,
    pub(crate) dense_model: Option<String>,
    pub(crate) dense_weight: f32,
    pub(crate) tuned_on: Option<String>,
    pub(crate) methods: BTreeMap<String, eval::MetricSummary>,
    pub(crate) seconds: f64,
}

pub(crate) struct EvalOptions {
    pub(crate) int8_queries: bool,
    pub(crate) tune_on: Option<String>,
    pub(crate) e5s1: Option<PathBuf>,
    pub(crate) max_queries: Option<usize>,
    pub(crate) collection: Option<String>,
}

/// Fits the dense weight on `set` for `collection`; returns the weight, the nDCG curve and per-method metrics.
/// The fitted dense weight, the nDCG@10 curve over weights, and per-method metrics.
pub(crate) type Tuned = (f32, Vec<(f32, f64)>, serde_json::Value);

pub(crate) fn tune(e: &Engine, set: &BeirSet, collection: &str) -> Result<Tuned> {
    let pb = ProgressBar::new(set.queries.len() as u64);
    let cands = eval::candidates(e.searcher(), set, collection, 100, &mut |d, _| pb.set_position(d as u64))?;
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
pub(crate) fn evaluate(
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
        && e.retrieval().active_models()?.is_none()
    {
        let fp32 = e.retrieval().import_e5s1(bin, "1", None, false)?;
        if opts.int8_queries {
            e.retrieval().import_e5s1(bin, "1-int8", Some(&fp32.pairing_id), true)?;
            e.models().activate(&console(), "e5-small@1-int8", "e5-small@1", &mut |_| Ok(()))?;
        }
    }
    let col = match &opts.collection {
        Some(c) if !keep_dir => bail!("--collection {c} names a collection of a data directory: pass --data-dir too"),
        Some(c) => {
            e.indexer().collection(c)?;
            c.clone()
        }
        None => ingest_eval_corpus(&e, &set)?,
    };
    let pb = dense_bar();
    e.retrieval().sync_dense_indexes(&mut |p| dense_progress(&pb, &p))?;
    pb.finish_and_clear();
    let corpus_documents = e
        .indexer()
        .collection_stats()?
        .into_iter()
        .find(|c| c.collection.name == col)
        .map_or(0, |c| c.documents as usize);
    // The weight search serves on this collection (stored by a promotion or `care tune-fusion`, else the default),
    // so that "weighted" is the live hybrid.
    let mut weight = e.retrieval().fusion_for(e.indexer().collection(&col)?.id)?.dense_weight;
    let cross_fit = opts.tune_on.as_deref() == Some(split);
    if let (Some(tune_split), false) = (&opts.tune_on, cross_fit) {
        let mut tune_set = BeirSet::load(set_dir, tune_split)?;
        tune_set.queries.truncate(opts.max_queries.unwrap_or(1000).max(500));
        let (w, _, _) = tune(&e, &tune_set, &col)?;
        weight = w;
    }
    let pb = ProgressBar::new(set.queries.len() as u64);
    let cands = eval::candidates(e.searcher(), &set, &col, 100, &mut |d, _| pb.set_position(d as u64))?;
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
    let dense_model = e.retrieval().active_models()?.map(|p| format!("{}@{}", p.query.name, p.query.version));
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
pub(crate) fn ingest_eval_corpus(e: &Engine, set: &BeirSet) -> Result<String> {
    let col = format!("eval-{}", set.name);
    if e.indexer().collection(&col).is_err() {
        e.collections().create(&console(), &col, "evaluation corpus")?;
    }
    eprintln!("ingesting {} ...", set.corpus_path().display());
    let report = e.ingest().files(&console(), &col, &[set.corpus_path()], &mut |_| {})?;
    if let Some(err) = report.files.iter().find_map(|f| f.error.clone()) {
        bail!("ingesting the corpus failed: {err}");
    }
    Ok(col)
}

pub(crate) fn tempfile_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("care-eval-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    Ok(base)
}
