//! Evaluation: BEIR-layout retrieval sets and ranking metrics.

pub mod metrics;
pub mod sts;

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
                "{}：划分 {split} 中没有任何查询在 {} 里有相关性标注 (no query of split '{split}' has judgements)",
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

/// Per-query candidate lists, computed once and fused many times (evaluation and weight tuning).
pub struct Candidates {
    pub qid: String,
    pub bm25: Vec<crate::fusion::Ranked>,
    pub dense: Vec<crate::fusion::Ranked>,
}

/// BM25 and (when a model is active) dense candidates for every query of the set, from the search pipeline
/// ([`crate::Engine::judged_candidates`]): each query understood, folded and expanded as a search does it.
pub fn candidates(
    searcher: crate::search::Searcher<'_>,
    set: &BeirSet,
    collection: &str,
    depth: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Candidates2> {
    let col = searcher.retrieval.store.collection(collection)?;
    let models = searcher.retrieval.models;
    let pair = models.active_pair(searcher.retrieval.store)?;
    let encoder = pair.as_ref().map(|p| models.query_encoder(&p.query)).transpose()?;
    let dense = pair.as_ref().zip(encoder.as_deref()).map(|(p, encoder)| crate::search::JudgedDense {
        encoder,
        query: &p.query,
        document: &p.document,
    });
    judged(searcher, set, &col, dense, depth, &mut |done, total| {
        progress(done, total);
        Ok(())
    })
}

/// The set's candidate lists from the search pipeline in `col`, the dense ones from `dense` (the live pair, or a
/// candidate pair's graph for the gate), with what is needed to score them.
pub(crate) fn judged(
    searcher: crate::search::Searcher<'_>,
    set: &BeirSet,
    col: &crate::store::Collection,
    dense: Option<crate::search::JudgedDense<'_>>,
    depth: usize,
    progress: &mut dyn FnMut(usize, usize) -> Result<()>,
) -> Result<Candidates2> {
    let has_dense = dense.is_some();
    let lists = searcher.judged_candidates(&set.queries, col, dense, depth, progress)?;
    let lists = set
        .queries
        .iter()
        .zip(lists)
        .map(|((qid, _), (bm25, dense))| Candidates { qid: qid.clone(), bm25, dense })
        .collect();
    Ok(Candidates2 { lists, doc_names: document_names(searcher.retrieval.store, col.id)?, has_dense })
}

/// Candidate lists plus the document id → external id map needed to score them.
pub struct Candidates2 {
    pub lists: Vec<Candidates>,
    pub doc_names: HashMap<i64, String>,
    pub has_dense: bool,
}

pub(crate) fn document_names(store: &crate::store::Store, collection_id: i64) -> Result<HashMap<i64, String>> {
    let conn = store.conn();
    let mut stmt = conn.prepare("SELECT id, external_id FROM documents WHERE collection_id = ?1")?;
    let rows = stmt.query_map([collection_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<HashMap<_, _>, _>>()?)
}

impl Candidates2 {
    /// Scores one fusion configuration: chunk lists fused, reduced to each document's best chunk.
    pub fn score(&self, set: &BeirSet, method: crate::fusion::Method, dense_weight: f32) -> MetricSummary {
        let runs = self.lists.iter().map(|c| (c.qid.clone(), self.ranked(c, method, dense_weight))).collect();
        score(set, &runs)
    }

    /// Fused documents (external ids, first passage of each) of one query's candidates.
    fn ranked(&self, c: &Candidates, method: crate::fusion::Method, dense_weight: f32) -> Vec<String> {
        let fused = crate::fusion::fuse(&c.bm25, &c.dense, method, dense_weight);
        let mut seen = std::collections::HashSet::new();
        fused
            .iter()
            .filter_map(|h| self.doc_names.get(&h.document_id).cloned())
            .filter(|n| seen.insert(n.clone()))
            .collect()
    }

    /// nDCG@10, MRR@10 and Recall@100 of each query, in the order of `self.lists` (for paired comparisons).
    pub fn per_query(&self, set: &BeirSet, method: crate::fusion::Method, dense_weight: f32) -> Vec<[f64; 3]> {
        let min_rel = set.min_relevant();
        let empty = Judgements::new();
        self.lists
            .iter()
            .map(|c| {
                let ranked = self.ranked(c, method, dense_weight);
                let judged = set.qrels.get(&c.qid).unwrap_or(&empty);
                [
                    metrics::ndcg_at(&ranked, judged, 10),
                    metrics::mrr_at(&ranked, judged, 10, min_rel),
                    metrics::recall_at(&ranked, judged, 100, min_rel),
                ]
            })
            .collect()
    }

    /// The same candidates restricted to the queries `keep` selects (by position), with the matching set.
    pub fn subset(&self, set: &BeirSet, keep: impl Fn(usize) -> bool) -> (Candidates2, BeirSet) {
        let mut sub_set = set.clone();
        sub_set.queries = set.queries.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, q)| q.clone()).collect();
        let ids: std::collections::HashSet<&str> = sub_set.queries.iter().map(|q| q.0.as_str()).collect();
        let lists = self
            .lists
            .iter()
            .filter(|c| ids.contains(c.qid.as_str()))
            .map(|c| Candidates { qid: c.qid.clone(), bm25: c.bm25.clone(), dense: c.dense.clone() })
            .collect();
        (Candidates2 { lists, doc_names: self.doc_names.clone(), has_dense: self.has_dense }, sub_set)
    }

    /// Two-fold cross-fitting for sets without a separate training split: the weight used on each half is fitted
    /// on the other half, so no query is scored with a weight tuned on itself. Returns the pooled metrics and the
    /// two weights.
    pub fn cross_fit(&self, set: &BeirSet) -> (MetricSummary, [f32; 2]) {
        let (a, sa) = self.subset(set, |i| i % 2 == 0);
        let (b, sb) = self.subset(set, |i| i % 2 == 1);
        let (wa, _) = a.tune(&sa);
        let (wb, _) = b.tune(&sb);
        let ma = b.score(&sb, crate::fusion::Method::Weighted, wa);
        let mb = a.score(&sa, crate::fusion::Method::Weighted, wb);
        let (na, nb) = (mb.queries as f64, ma.queries as f64);
        let mix = |x: f64, y: f64| (x * nb + y * na) / (na + nb).max(1.0);
        let pooled = MetricSummary {
            ndcg_at_10: mix(ma.ndcg_at_10, mb.ndcg_at_10),
            map_at_10: mix(ma.map_at_10, mb.map_at_10),
            mrr_at_10: mix(ma.mrr_at_10, mb.mrr_at_10),
            recall_at_100: mix(ma.recall_at_100, mb.recall_at_100),
            queries: ma.queries + mb.queries,
        };
        (pooled, [wa, wb])
    }

    /// Grid search of the dense weight (0.00..=1.00 step 0.05) maximising nDCG@10. Returns (best weight, curve).
    pub fn tune(&self, set: &BeirSet) -> (f32, Vec<(f32, f64)>) {
        let mut curve = Vec::new();
        let mut best = (0.0f32, f64::MIN);
        for i in 0..=20 {
            let w = i as f32 * 0.05;
            let m = self.score(set, crate::fusion::Method::Weighted, w).ndcg_at_10;
            curve.push((w, m));
            // Prefer the weight nearer 0.5 on ties: it degrades more gracefully on unseen queries.
            if m > best.1 + 1e-12 || ((m - best.1).abs() <= 1e-12 && (w - 0.5).abs() < (best.0 - 0.5).abs()) {
                best = (w, m);
            }
        }
        (best.0, curve)
    }
}
