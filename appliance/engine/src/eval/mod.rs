//! Evaluation: BEIR-layout retrieval sets and ranking metrics.

pub mod metrics;

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use metrics::Judgements;

/// A retrieval set in BEIR layout: `corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`.
#[derive(Debug, Clone)]
pub struct BeirSet {
    pub name: String,
    pub dir: PathBuf,
    pub queries: Vec<(String, String)>,
    pub qrels: HashMap<String, Judgements>,
}

#[derive(Deserialize)]
struct QueryLine {
    #[serde(alias = "_id")]
    id: String,
    text: String,
}

impl BeirSet {
    /// Loads the queries of `split` that have at least one judgement.
    pub fn load(dir: &Path, split: &str) -> Result<Self> {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("set").to_string();
        let qrels_path = dir.join("qrels").join(format!("{split}.tsv"));
        let f = std::fs::File::open(&qrels_path).map_err(|e| Error::io(&qrels_path, e))?;
        let mut qrels: HashMap<String, Judgements> = HashMap::new();
        for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line.map_err(|e| Error::io(&qrels_path, e))?;
            let parts: Vec<&str> = line.split('\t').collect();
            if i == 0 && parts.first() == Some(&"query-id") {
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            let grade = parts.get(2).and_then(|g| g.trim().parse::<i64>().ok());
            let (Some(q), Some(d), Some(g)) = (parts.first(), parts.get(1), grade) else {
                return Err(Error::MalformedRecord {
                    path: qrels_path.clone(),
                    line: i + 1,
                    message: "expected `query-id<TAB>corpus-id<TAB>score`".into(),
                });
            };
            qrels.entry(q.to_string()).or_default().insert(d.to_string(), g.max(0) as u32);
        }
        let qpath = dir.join("queries.jsonl");
        let f = std::fs::File::open(&qpath).map_err(|e| Error::io(&qpath, e))?;
        let mut queries = Vec::new();
        for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line.map_err(|e| Error::io(&qpath, e))?;
            if line.trim().is_empty() {
                continue;
            }
            let q: QueryLine = serde_json::from_str(&line).map_err(|e| Error::MalformedRecord {
                path: qpath.clone(),
                line: i + 1,
                message: e.to_string(),
            })?;
            if qrels.contains_key(&q.id) {
                queries.push((q.id, q.text));
            }
        }
        if queries.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{}: no query of split '{split}' has judgements in {}",
                qpath.display(),
                qrels_path.display()
            )));
        }
        Ok(BeirSet { name, dir: dir.to_path_buf(), queries, qrels })
    }

    pub fn corpus_path(&self) -> PathBuf {
        self.dir.join("corpus.jsonl")
    }

    /// The grade from which a document counts as relevant for binary metrics. Graded sets (max grade ≥ 3) use 2,
    /// as their READMEs define ("relevant ≥ 2"); binary sets use 1.
    pub fn min_relevant(&self) -> u32 {
        let max = self.qrels.values().flat_map(|j| j.values()).copied().max().unwrap_or(1);
        if max >= 3 { 2 } else { 1 }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MetricSummary {
    pub ndcg_at_10: f64,
    pub map_at_10: f64,
    pub mrr_at_10: f64,
    pub recall_at_100: f64,
    pub queries: usize,
}

/// Scores rankings (query id → ranked doc ids) against the set's judgements.
pub fn score(set: &BeirSet, runs: &BTreeMap<String, Vec<String>>) -> MetricSummary {
    let min_rel = set.min_relevant();
    let mut s = MetricSummary::default();
    for (qid, _) in &set.queries {
        let judged = &set.qrels[qid];
        let empty = Vec::new();
        let ranked = runs.get(qid).unwrap_or(&empty);
        s.ndcg_at_10 += metrics::ndcg_at(ranked, judged, 10);
        s.map_at_10 += metrics::map_at(ranked, judged, 10, min_rel);
        s.mrr_at_10 += metrics::mrr_at(ranked, judged, 10, min_rel);
        s.recall_at_100 += metrics::recall_at(ranked, judged, 100, min_rel);
        s.queries += 1;
    }
    let n = s.queries.max(1) as f64;
    s.ndcg_at_10 /= n;
    s.map_at_10 /= n;
    s.mrr_at_10 /= n;
    s.recall_at_100 /= n;
    s
}
