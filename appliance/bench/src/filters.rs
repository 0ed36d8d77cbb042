//! `care-bench --filters`: what filtering by department, type and date costs a hybrid search, against the same
//! query unfiltered, in one run on one data directory (the set's corpus already ingested and embedded, e.g. the
//! one `care-bench --load` prepares). The corpus gets synthetic filing first: departments with a skewed share (a
//! large department near a quarter of the documents, a rare one near 1 %), types and dates spread over 2010–2024.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use care_engine::engine::OpenMode;
use care_engine::eval::BeirSet;
use care_engine::facets::SearchFilter;
use care_engine::ingest::meta::DocMeta;
use care_engine::{Engine, EngineConfig, SearchAs};
use serde::Serialize;

use crate::hot_paths::{Latency, bench_admin};

/// Flags of `care-bench --filters` (the set, `--queries`, `--reuse` and `--out` are shared with `care-bench`).
#[derive(clap::Args, Debug, Clone)]
pub struct FilterArgs {
    /// Filter benchmark: time hybrid searches filtered by department, type and date against the same queries
    /// unfiltered, on the data directory named by --reuse (its one collection holds --set's corpus).
    #[arg(long)]
    pub filters: bool,
}

/// Departments and their share of the synthetic filing (per mille), largest first.
const DEPARTMENTS: &[(&str, u32)] = &[
    ("心内科", 240),
    ("内分泌科", 150),
    ("呼吸内科", 120),
    ("消化内科", 100),
    ("神经内科", 90),
    ("儿科", 80),
    ("妇产科", 70),
    ("感染科", 60),
    ("肾内科", 40),
    ("风湿免疫科", 25),
    ("血液科", 15),
    ("皮肤科", 10),
];
const TYPES: &[(&str, u32)] =
    &[("问答", 400), ("指南", 250), ("药品说明书", 150), ("护理规范", 100), ("制度", 60), ("模板", 40)];

#[derive(Debug, Serialize)]
pub struct FilterCase {
    pub name: String,
    pub filter: SearchFilter,
    /// Share of the corpus's documents the filter admits.
    pub admitted_share: f64,
    pub latency: Latency,
    /// The retrieval part of it (both legs, fusion, filter, facets), as the engine timed it.
    pub retrieve: Latency,
    /// p50 and p99 as ratios to the unfiltered search's, same queries, same run.
    pub p50_ratio: f64,
    pub p99_ratio: f64,
    /// Mean documents in the filtered ranking, and queries whose filtered page was empty.
    pub mean_total: f64,
    pub empty_pages: usize,
}

#[derive(Debug, Serialize)]
pub struct FilterReport {
    pub set: String,
    pub corpus_documents: usize,
    pub queries: usize,
    pub model: Option<String>,
    pub cpu: String,
    pub cores: usize,
    pub unfiltered: Latency,
    pub unfiltered_retrieve: Latency,
    pub cases: Vec<FilterCase>,
    /// Counting the facets of one query (part of every search above), over all searches of the run.
    pub facet_counting: Latency,
}

/// A stable hash of a document id, for its synthetic filing.
fn fnv(s: &str, salt: u64) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325 ^ salt, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn pick<'a>(table: &[(&'a str, u32)], h: u64) -> &'a str {
    let mut x = (h % 1000) as u32;
    for (v, share) in table {
        if x < *share {
            return v;
        }
        x -= share;
    }
    table[0].0
}

fn synthetic(id: &str) -> DocMeta {
    let (a, b, c) = (fnv(id, 1), fnv(id, 2), fnv(id, 3));
    DocMeta {
        department: pick(DEPARTMENTS, a).into(),
        doc_type: pick(TYPES, b).into(),
        date: format!("{}-{:02}", 2010 + c % 15, 1 + (c / 15) % 12),
        ..Default::default()
    }
}

fn corpus_ids(set: &Path) -> Result<Vec<String>> {
    let f = std::fs::File::open(set.join("corpus.jsonl")).with_context(|| format!("{}/corpus.jsonl", set.display()))?;
    let mut ids = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        if let Some(id) = v.get("_id").or_else(|| v.get("id")).and_then(|x| x.as_str()) {
            ids.push(id.to_string());
        }
    }
    Ok(ids)
}

fn cases() -> Vec<(&'static str, SearchFilter)> {
    let f = |d: &[&str], t: &[&str], from: &str, to: &str| SearchFilter {
        departments: d.iter().map(|s| s.to_string()).collect(),
        doc_types: t.iter().map(|s| s.to_string()).collect(),
        date_from: from.into(),
        date_to: to.into(),
        ..Default::default()
    };
    vec![
        ("心内科 (24 %)", f(&["心内科"], &[], "", "")),
        ("妇产科 (7 %)", f(&["妇产科"], &[], "", "")),
        ("皮肤科 (1 %)", f(&["皮肤科"], &[], "", "")),
        ("指南 2020–2024 (8 %)", f(&[], &["指南"], "2020", "2024")),
        ("2 科室+2 类型+日期 (7 %)", f(&["内分泌科", "肾内科"], &["问答", "药品说明书"], "2015-06", "")),
    ]
}

pub fn run(base: &EngineConfig, set_dir: &Path, data: &Path, queries: usize) -> Result<FilterReport> {
    let set = BeirSet::load(set_dir, "dev")?;
    let mut cfg = base.clone();
    cfg.storage.data_dir = data.to_path_buf();
    let e = Engine::open(cfg, OpenMode::Existing)?;
    let admin = bench_admin();
    let cols = e.indexer().collection_stats()?;
    let [col] = cols.as_slice() else { bail!("{} should hold exactly one collection", data.display()) };
    let name = col.collection.name.clone();
    let ids = corpus_ids(set_dir)?;
    let filing: Vec<(String, DocMeta)> = ids.iter().map(|id| (id.clone(), synthetic(id))).collect();
    let t = Instant::now();
    let whole = care_engine::ingest::meta::Filing::whole(filing.clone());
    let (changed, unknown) = e.collections().file_documents(&admin, &name, &whole)?;
    eprintln!("filed {changed} documents ({} unknown ids) in {:.1} s", unknown.len(), t.elapsed().as_secs_f64());
    let share =
        |f: &SearchFilter| filing.iter().filter(|(_, m)| f.admits(m)).count() as f64 / filing.len().max(1) as f64;
    let qs: Vec<&str> = set.queries.iter().take(queries).map(|(_, q)| q.as_str()).collect();
    let search = |q: &str, filter: &SearchFilter| {
        let s = SearchAs {
            query: q.into(),
            group_by_document: true,
            limit: Some(10),
            filter: filter.clone(),
            ..Default::default()
        };
        let t = Instant::now();
        let r = e.search().run(&admin, &s)?;
        Ok::<_, anyhow::Error>((t.elapsed().as_secs_f64() * 1e3, r))
    };
    let cases = cases();
    for q in qs.iter().take(10) {
        search(q, &SearchFilter::default())?;
        for (_, f) in &cases {
            search(q, f)?;
        }
    }
    let (mut plain, mut plain_retrieve) = (Vec::new(), Vec::new());
    let mut per: Vec<(Vec<f64>, usize, usize)> = vec![(Vec::new(), 0, 0); cases.len()];
    let mut per_retrieve: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut facet_ms = Vec::new();
    for (i, q) in qs.iter().enumerate() {
        // The unfiltered search and each filter, in an order that rotates per query (no case always runs first).
        for k in 0..=cases.len() {
            let slot = (i + k) % (cases.len() + 1);
            if slot == cases.len() {
                let (ms, r) = search(q, &SearchFilter::default())?;
                plain.push(ms);
                plain_retrieve.push(r.retrieve_ms);
                facet_ms.push(r.facets_ms);
            } else {
                let (ms, r) = search(q, &cases[slot].1)?;
                per[slot].0.push(ms);
                per_retrieve[slot].push(r.retrieve_ms);
                per[slot].1 += r.total;
                per[slot].2 += usize::from(r.hits.is_empty());
                facet_ms.push(r.facets_ms);
            }
        }
        if (i + 1) % 100 == 0 {
            eprintln!("{} / {} queries", i + 1, qs.len());
        }
    }
    let unfiltered = Latency::from(plain);
    let cases = cases
        .into_iter()
        .zip(per)
        .zip(per_retrieve)
        .map(|(((name, filter), (xs, total, empty)), retrieve)| {
            let n = xs.len().max(1) as f64;
            let latency = Latency::from(xs);
            FilterCase {
                name: name.into(),
                admitted_share: share(&filter),
                filter,
                p50_ratio: latency.p50_ms / unfiltered.p50_ms,
                p99_ratio: latency.p99_ms / unfiltered.p99_ms,
                latency,
                retrieve: Latency::from(retrieve),
                mean_total: total as f64 / n,
                empty_pages: empty,
            }
        })
        .collect();
    Ok(FilterReport {
        set: set.name.clone(),
        corpus_documents: ids.len(),
        queries: qs.len(),
        model: e.retrieval().active_models()?.map(|p| format!("{}@{}", p.query.name, p.query.version)),
        cpu: care_engine::kernels::cpu_model(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        unfiltered,
        unfiltered_retrieve: Latency::from(plain_retrieve),
        cases,
        facet_counting: Latency::from(facet_ms),
    })
}

/// Writes the report as JSON and its chart as SVG beside it (`--out X.json` → `X.svg`).
pub fn write(r: &FilterReport, out: Option<&PathBuf>) -> Result<()> {
    let json = serde_json::to_string_pretty(r)?;
    let Some(out) = out else {
        println!("{json}");
        return Ok(());
    };
    std::fs::write(out, json)?;
    let mut rows = vec![("unfiltered".to_string(), vec![r.unfiltered.p50_ms, r.unfiltered.p99_ms])];
    rows.extend(r.cases.iter().map(|c| (c.name.clone(), vec![c.latency.p50_ms, c.latency.p99_ms])));
    let title = format!(
        "Filtered hybrid search, {} ({} documents, {} queries, {} cores)",
        r.set, r.corpus_documents, r.queries, r.cores
    );
    let svg = care_engine::chart::grouped_bars(&title, " ms", &["p50", "p99"], &rows);
    std::fs::write(out.with_extension("svg"), svg)?;
    eprintln!("wrote {} and its .svg", out.display());
    Ok(())
}
