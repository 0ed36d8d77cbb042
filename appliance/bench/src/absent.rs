//! `care-bench --absent FILE`: how often the search pipeline names a drug or disease name that occurs nowhere in
//! the collection (issue 53), and how often it flags something in real queries, over a probe built by
//! `tests/bench/absent_names.py` and the data directory named by `--reuse` (its collection `bench` holds --set's
//! corpus). Every query runs the pipeline as the search page runs it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use care_engine::engine::OpenMode;
use care_engine::{Engine, EngineConfig, SearchAs};
use serde::{Deserialize, Serialize};

use crate::hot_paths::bench_admin;

#[derive(Deserialize)]
struct Row {
    query: String,
    name: Option<String>,
    kind: Option<String>,
    source: String,
}

#[derive(Serialize, Default)]
pub struct Group {
    pub queries: usize,
    /// Queries whose name the synonym table maps to a term the corpus holds: found, rightly (包含：尿路结石（尿石症）),
    /// and left out of `named_share`.
    pub through_synonym: usize,
    /// Queries whose absent name a "not found" term names: a term that holds the whole name (the name, or the
    /// stretch of the query around it that occurs nowhere either: 功能性血管平滑肌瘤).
    pub named: usize,
    pub named_share: f64,
    /// Of those, the terms that are the name or the name and at most two more characters (its dosage form).
    pub named_exactly: usize,
    pub named_exactly_share: f64,
    /// Queries where a term was said to occur nowhere (for unmodified queries: what should not happen).
    pub flagged: usize,
    pub flagged_share: f64,
    /// Examples: the absent names not named (with what was said), the flagged terms of unmodified queries.
    pub misses: Vec<String>,
}

#[derive(Serialize)]
pub struct AbsentReport {
    pub probe: String,
    /// Whether the probe's names were kept out of the lexicons (`--hold-out`).
    pub held_out_of_lexicon: bool,
    pub groups: BTreeMap<String, Group>,
    /// Flagged terms of unmodified queries that the corpus does contain (read from the corpus file itself, in
    /// both scripts): each one a false statement to a clinician.
    pub flagged_but_present: Vec<String>,
    /// Unmodified queries searched as a pinyin reading (their letters read as initials).
    pub read_as_pinyin: Vec<String>,
}

pub fn run(base: &EngineConfig, set: &Path, reuse: &Path, probe: &Path, hold_out: bool) -> Result<AbsentReport> {
    let lines = std::fs::read_to_string(probe)?;
    if hold_out {
        // The probe's names kept out of the lexicons: what the rules find without a lexicon that holds the name.
        let names = lines.lines().filter_map(|l| serde_json::from_str::<Row>(l).ok()?.name);
        care_engine::lexical::hold_out_of_lexicon(names);
    }
    let mut cfg = base.clone();
    cfg.storage.data_dir = reuse.to_path_buf();
    let e = Engine::open(cfg, OpenMode::Existing)
        .with_context(|| format!("{} is not a prepared benchmark directory", reuse.display()))?;
    let corpus = std::fs::read_to_string(set.join("corpus.jsonl"))?;
    let text = |t: &str| corpus.contains(t) || corpus.contains(&care_engine::query::to_traditional(t));
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let (mut present, mut pinyin) = (Vec::new(), Vec::new());
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let row: Row = serde_json::from_str(line)?;
        let r = e.search().run(&bench_admin(), &SearchAs { query: row.query.clone(), ..Default::default() })?;
        let g = groups.entry(format!("{}/{}", row.source, row.kind.as_deref().unwrap_or("none"))).or_default();
        g.queries += 1;
        g.flagged += usize::from(!r.missing_terms.is_empty());
        match &row.name {
            Some(name) if r.matched_terms.iter().any(|m| m.contains(name.as_str())) => g.through_synonym += 1,
            Some(name) => {
                let n = name.chars().count();
                let named = r.missing_terms.iter().any(|m| m.contains(name.as_str()));
                let exactly = r.missing_terms.iter().any(|m| m.contains(name.as_str()) && m.chars().count() <= n + 2);
                g.named += usize::from(named);
                g.named_exactly += usize::from(exactly);
                if !named && g.misses.len() < 40 {
                    g.misses.push(format!("{} → {:?}", row.query, r.missing_terms));
                }
            }
            None => {
                if !r.missing_terms.is_empty() && g.misses.len() < 60 {
                    g.misses.push(format!("{} → {:?}", row.query, r.missing_terms));
                }
                present.extend(r.missing_terms.iter().filter(|m| text(m)).map(|m| format!("{m} ({})", row.query)));
                if r.pinyin_of.is_some() {
                    pinyin.push(format!("{} → {}", row.query, r.folded_query.unwrap_or_default()));
                }
            }
        }
    }
    for g in groups.values_mut() {
        g.named_share = g.named as f64 / (g.queries - g.through_synonym).max(1) as f64;
        g.named_exactly_share = g.named_exactly as f64 / (g.queries - g.through_synonym).max(1) as f64;
        g.flagged_share = g.flagged as f64 / g.queries.max(1) as f64;
    }
    Ok(AbsentReport {
        probe: probe.display().to_string(),
        held_out_of_lexicon: hold_out,
        groups,
        flagged_but_present: present,
        read_as_pinyin: pinyin,
    })
}
