//! Fusing BM25 and dense rankings.
//!
//! Plain RRF ignores score gaps and, on the shared sets, loses to dense retrieval alone on three of four. Weighted
//! min-max fusion keeps the gaps: each list is scaled to [0, 1] by its own min and max, and a chunk's score is
//! `w · dense + (1 − w) · bm25`, a missing entry counting 0. The weight `w` is fitted per collection on labelled
//! queries (`care tune-fusion`). Every fused hit keeps its parts so the UI and API can explain a ranking.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Bm25,
    Dense,
    Rrf,
    Weighted,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Bm25 => "bm25",
            Method::Dense => "dense",
            Method::Rrf => "rrf",
            Method::Weighted => "weighted",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bm25" => Some(Method::Bm25),
            "dense" => Some(Method::Dense),
            "rrf" => Some(Method::Rrf),
            "weighted" => Some(Method::Weighted),
            _ => None,
        }
    }
}

pub const RRF_K: f32 = 60.0;

/// One ranked list entry: (chunk_id, document_id, raw score), best first.
pub type Ranked = (i64, i64, f32);

/// How a fused score came about: each retriever's raw score, rank (1-based) and min-max normalised value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScoreParts {
    pub bm25: Option<f32>,
    pub bm25_rank: Option<usize>,
    pub bm25_norm: f32,
    pub dense: Option<f32>,
    pub dense_rank: Option<usize>,
    pub dense_norm: f32,
}

/// What a ranking is asked for besides the query: the request's method and weight (else the collection's tuned
/// ones), its depth, and the documents a filter admits (none: every document).
#[derive(Debug, Clone, Copy)]
pub struct RankSpec<'a> {
    pub method: Option<Method>,
    pub dense_weight: Option<f32>,
    pub depth: usize,
    pub keep: Option<&'a std::sync::Arc<crate::facets::DocSet>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Explained {
    pub chunk_id: i64,
    pub document_id: i64,
    pub score: f32,
    pub parts: ScoreParts,
}

fn min_max(list: &[Ranked]) -> impl Fn(f32) -> f32 + use<> {
    let max = list.iter().map(|r| r.2).fold(f32::NEG_INFINITY, f32::max);
    let min = list.iter().map(|r| r.2).fold(f32::INFINITY, f32::min);
    move |s| if max > min { (s - min) / (max - min) } else { 1.0 }
}

/// Fuses two best-first lists. `dense_weight` is used by `Weighted` only.
pub fn fuse(bm25: &[Ranked], dense: &[Ranked], method: Method, dense_weight: f32) -> Vec<Explained> {
    let nb = min_max(bm25);
    let nd = min_max(dense);
    // Up to 2 × the ranking depth (1,100) entries a search: the integer hash, not SipHash.
    let mut by_chunk: rustc_hash::FxHashMap<i64, Explained> =
        rustc_hash::FxHashMap::with_capacity_and_hasher(bm25.len() + dense.len(), Default::default());
    let blank = |c: i64, d: i64| Explained { chunk_id: c, document_id: d, score: 0.0, parts: ScoreParts::default() };
    for (rank, &(c, d, s)) in bm25.iter().enumerate() {
        let e = by_chunk.entry(c).or_insert_with(|| blank(c, d));
        e.parts.bm25 = Some(s);
        e.parts.bm25_rank = Some(rank + 1);
        e.parts.bm25_norm = nb(s);
    }
    for (rank, &(c, d, s)) in dense.iter().enumerate() {
        let e = by_chunk.entry(c).or_insert_with(|| blank(c, d));
        e.parts.dense = Some(s);
        e.parts.dense_rank = Some(rank + 1);
        e.parts.dense_norm = nd(s);
    }
    let mut out: Vec<Explained> = by_chunk
        .into_values()
        .filter(|e| match method {
            Method::Bm25 => e.parts.bm25.is_some(),
            Method::Dense => e.parts.dense.is_some(),
            Method::Rrf | Method::Weighted => true,
        })
        .map(|mut e| {
            let rrf = |r: Option<usize>| r.map_or(0.0, |r| 1.0 / (RRF_K + r as f32));
            let p = &e.parts;
            e.score = match method {
                Method::Bm25 => p.bm25.unwrap_or(0.0),
                Method::Dense => p.dense.unwrap_or(0.0),
                Method::Rrf => rrf(p.bm25_rank) + rrf(p.dense_rank),
                Method::Weighted => dense_weight * p.dense_norm + (1.0 - dense_weight) * p.bm25_norm,
            };
            e
        })
        .collect();
    // Ties broken by chunk id (unique) so results are reproducible, with or without a stable sort.
    out.sort_unstable_by(|a, b| b.score.total_cmp(&a.score).then(a.chunk_id.cmp(&b.chunk_id)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_min_max_hand_computed() {
        let bm25 = [(1, 1, 10.0), (2, 2, 6.0), (3, 3, 2.0)];
        let dense = [(3, 3, 0.9), (1, 1, 0.5)];
        let f = fuse(&bm25, &dense, Method::Weighted, 0.7);
        // chunk 1: bm25 norm 1.0, dense norm 0.0 → 0.3; chunk 2: bm25 0.5, no dense → 0.15;
        // chunk 3: bm25 0.0, dense 1.0 → 0.7.
        let got: Vec<(i64, f32)> = f.iter().map(|e| (e.chunk_id, e.score)).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, 3);
        assert!((got[0].1 - 0.7).abs() < 1e-6);
        assert_eq!(got[1].0, 1);
        assert!((got[1].1 - 0.3).abs() < 1e-6);
        assert!((got[2].1 - 0.15).abs() < 1e-6);
        assert_eq!(f[0].parts.dense_rank, Some(1));
        assert_eq!(f[0].parts.bm25_rank, Some(3));
    }

    #[test]
    fn rrf_and_single_methods() {
        let bm25 = [(1, 1, 3.0), (2, 2, 2.0)];
        let dense = [(2, 2, 0.8), (3, 3, 0.7)];
        let f = fuse(&bm25, &dense, Method::Rrf, 0.0);
        assert_eq!(f[0].chunk_id, 2);
        assert!((f[0].score - (1.0 / 62.0 + 1.0 / 61.0)).abs() < 1e-7);
        let d = fuse(&bm25, &dense, Method::Dense, 0.0);
        assert_eq!(d.iter().map(|e| e.chunk_id).collect::<Vec<_>>(), vec![2, 3]);
        let b = fuse(&bm25, &dense, Method::Bm25, 0.0);
        assert_eq!(b.iter().map(|e| e.chunk_id).collect::<Vec<_>>(), vec![1, 2]);
        // Weight 0 and 1 reproduce the single rankings' order.
        let w1 = fuse(&bm25, &dense, Method::Weighted, 1.0);
        assert_eq!(w1[0].chunk_id, 2);
        let w0 = fuse(&bm25, &dense, Method::Weighted, 0.0);
        assert_eq!(w0[0].chunk_id, 1);
    }

    #[test]
    fn equal_scores_normalise_to_one() {
        let f = fuse(&[(1, 1, 5.0)], &[], Method::Weighted, 0.5);
        assert!((f[0].parts.bm25_norm - 1.0).abs() < 1e-7);
        assert!((f[0].score - 0.5).abs() < 1e-7);
    }
}
