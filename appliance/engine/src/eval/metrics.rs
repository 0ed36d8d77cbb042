//! Ranking metrics, computed the way BEIR/pytrec_eval do so numbers compare with published ones.
//!
//! - nDCG@k: linear gain (the judged grade), log2 discount, ideal DCG from all judged grades of the query.
//! - MAP@k, MRR@k, Recall@k: binary; a document counts as relevant when its grade ≥ `min_relevant`.
//!
//! A query with no relevant document scores 0 for MRR/MAP/Recall and is skipped by the caller if it wishes.

use std::collections::HashMap;

/// Judged grades of one query: document id → grade.
pub type Judgements = HashMap<String, u32>;

pub fn dcg(gains: impl IntoIterator<Item = f64>) -> f64 {
    gains.into_iter().enumerate().map(|(i, g)| g / ((i + 2) as f64).log2()).sum()
}

pub fn ndcg_at(ranked: &[String], judged: &Judgements, k: usize) -> f64 {
    let got = dcg(ranked.iter().take(k).map(|d| judged.get(d).copied().unwrap_or(0) as f64));
    let mut ideal: Vec<u32> = judged.values().copied().filter(|&g| g > 0).collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let best = dcg(ideal.into_iter().take(k).map(f64::from));
    if best == 0.0 { 0.0 } else { got / best }
}

fn is_rel(judged: &Judgements, d: &str, min_relevant: u32) -> bool {
    judged.get(d).is_some_and(|&g| g >= min_relevant)
}

pub fn mrr_at(ranked: &[String], judged: &Judgements, k: usize, min_relevant: u32) -> f64 {
    ranked.iter().take(k).position(|d| is_rel(judged, d, min_relevant)).map_or(0.0, |p| 1.0 / (p + 1) as f64)
}

pub fn recall_at(ranked: &[String], judged: &Judgements, k: usize, min_relevant: u32) -> f64 {
    let total = judged.values().filter(|&&g| g >= min_relevant).count();
    if total == 0 {
        return 0.0;
    }
    let found = ranked.iter().take(k).filter(|d| is_rel(judged, d, min_relevant)).count();
    found as f64 / total as f64
}

/// Average precision at k, normalised by min(k, number of relevant documents) as pytrec_eval's `map_cut` does.
pub fn map_at(ranked: &[String], judged: &Judgements, k: usize, min_relevant: u32) -> f64 {
    let total = judged.values().filter(|&&g| g >= min_relevant).count();
    if total == 0 {
        return 0.0;
    }
    let mut hits = 0usize;
    let mut sum = 0.0;
    for (i, d) in ranked.iter().take(k).enumerate() {
        if is_rel(judged, d, min_relevant) {
            hits += 1;
            sum += hits as f64 / (i + 1) as f64;
        }
    }
    sum / total.min(k) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(pairs: &[(&str, u32)]) -> Judgements {
        pairs.iter().map(|(d, g)| (d.to_string(), *g)).collect()
    }
    fn ranked(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }
    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn ndcg_hand_computed() {
        // Ranking: a(3) x(0) b(2); ideal: 3, 2, 1(c).
        let j = judged(&[("a", 3), ("b", 2), ("c", 1), ("z", 0)]);
        let r = ranked(&["a", "x", "b"]);
        let dcg = 3.0 + 0.0 / 3f64.log2() + 2.0 / 2.0; // log2(4) = 2
        let idcg = 3.0 + 2.0 / 3f64.log2() + 1.0 / 2.0;
        close(ndcg_at(&r, &j, 10), dcg / idcg);
        // Cut at 1: only "a" counts, ideal is 3 as well.
        close(ndcg_at(&r, &j, 1), 1.0);
        // Perfect ranking scores 1; no relevant docs scores 0.
        close(ndcg_at(&ranked(&["a", "b", "c"]), &j, 10), 1.0);
        close(ndcg_at(&r, &judged(&[("a", 0)]), 10), 0.0);
    }

    #[test]
    fn binary_metrics_hand_computed() {
        let j = judged(&[("a", 1), ("b", 2), ("c", 3), ("d", 2)]);
        let r = ranked(&["x", "b", "a", "c", "y"]);
        // min_relevant 2: relevant = b, c, d.
        close(mrr_at(&r, &j, 10, 2), 0.5);
        close(mrr_at(&r, &j, 1, 2), 0.0);
        close(recall_at(&r, &j, 10, 2), 2.0 / 3.0);
        close(recall_at(&r, &j, 2, 2), 1.0 / 3.0);
        // AP: hits at ranks 2 and 4 → (1/2 + 2/4) / 3.
        close(map_at(&r, &j, 10, 2), (0.5 + 0.5) / 3.0);
        // With min_relevant 1, "a" at rank 3 also counts: (1/2 + 2/3 + 3/4) / 4.
        close(map_at(&r, &j, 10, 1), (0.5 + 2.0 / 3.0 + 0.75) / 4.0);
        // AP@2 is normalised by min(k, R) = 2.
        close(map_at(&r, &j, 2, 2), 0.5 / 2.0);
    }
}
