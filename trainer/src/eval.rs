//! Retrieval quality on a BEIR dev split with an exact scan, and query-encoder latency.
//!
//! The metric definitions follow the appliance's (`appliance/engine/src/eval/metrics.rs`): nDCG@10 with linear
//! gain and log2 discount, ideal DCG over all judged grades; MRR@10 and Recall@100 with relevance = grade ≥ 1.
//! Document vectors of a frozen encoder are cached so several query encoders are scored against one pass.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::data::{BeirSplit, read_beir_split, read_corpus};
use crate::encoder::Encoder;
use crate::pooling::truncate;
use crate::{Error, Result};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RetrievalMetrics {
    pub ndcg_at_10: f64,
    pub mrr_at_10: f64,
    pub recall_at_100: f64,
    pub queries: usize,
}

pub fn ndcg_at(ranked: &[&str], judged: &HashMap<String, u32>, k: usize) -> f64 {
    let dcg = |gains: Vec<f64>| gains.iter().enumerate().map(|(i, g)| g / ((i + 2) as f64).log2()).sum::<f64>();
    let gains: Vec<f64> = ranked.iter().take(k).map(|d| f64::from(judged.get(*d).copied().unwrap_or(0))).collect();
    let mut ideal: Vec<f64> = judged.values().map(|&g| f64::from(g)).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    ideal.truncate(k);
    let idcg = dcg(ideal);
    if idcg > 0.0 { dcg(gains) / idcg } else { 0.0 }
}

/// Document vectors of a BEIR corpus: `(ids, vectors [n, hidden])`, cached at `cache` when given. The cache is
/// reused only when its key file (`<cache>.key`: the encoder's fingerprint, the template, the document ids) matches,
/// so vectors of other weights or another corpus are recomputed, never scored.
pub fn corpus_vectors(
    doc: &Encoder,
    set: &Path,
    template: &str,
    batch: usize,
    cache: Option<&Path>,
) -> Result<(Vec<String>, Tensor)> {
    corpus_file_vectors(doc, &set.join("corpus.jsonl"), template, batch, cache)
}

/// [`corpus_vectors`] of one corpus file (ids in file order), so the vectors and the texts a caller reads from
/// that file always belong together.
pub fn corpus_file_vectors(
    doc: &Encoder,
    corpus: &Path,
    template: &str,
    batch: usize,
    cache: Option<&Path>,
) -> Result<(Vec<String>, Tensor)> {
    let docs = read_corpus(corpus)?;
    let ids: Vec<String> = docs.iter().map(|d| d.id.clone()).collect();
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (doc.fingerprint(), template, &ids).hash(&mut h);
        format!("{:016x}", h.finish())
    };
    if let Some(c) = cache
        && std::fs::read_to_string(c.with_extension("key")).is_ok_and(|k| k.trim() == key)
        && let Ok(mut t) = crate::weights::load_tensors(c)
        && let Some(v) = t.remove("vectors")
        && v.size()[0] == ids.len() as i64
    {
        return Ok((ids, v));
    }
    let texts: Vec<String> = docs.iter().map(|d| template.replace("{text}", &d.text)).collect();
    let mut pb = crate::train::progress_bar(texts.len() as u64, "embedding corpus");
    let v = doc.embed_all(&texts, batch, &mut |n| pb.set_position(n as u64))?;
    pb.finish_and_clear();
    if let Some(c) = cache {
        crate::weights::save_tensors(std::iter::once(("vectors".to_string(), v.shallow_clone())), c)?;
        std::fs::write(c.with_extension("key"), &key).map_err(|e| crate::Error::io(c, e))?;
    }
    Ok((ids, v))
}

/// Scores `query` against normalised document vectors (truncated to the query width).
pub fn evaluate(
    query: &Encoder,
    split: &BeirSplit,
    template: &str,
    doc_ids: &[String],
    doc_vecs: &Tensor,
    batch: usize,
) -> Result<RetrievalMetrics> {
    let texts: Vec<String> = split.queries.iter().map(|(_, t)| template.replace("{text}", t)).collect();
    let qv = query.embed_all(&texts, batch, &mut |_| {})?;
    let w = qv.size()[1];
    let d = truncate(&doc_vecs.to_device(Device::Cpu).to_kind(Kind::Float), w);
    let k = 100.min(doc_ids.len()) as i64;
    let (mut ndcg, mut mrr, mut recall) = (0.0, 0.0, 0.0);
    for start in (0..texts.len()).step_by(256) {
        let n = (texts.len() - start).min(256);
        let scores = qv.narrow(0, start as i64, n as i64).matmul(&d.tr());
        let (_, idx) = scores.topk(k, 1, true, true);
        let idx = Vec::<i64>::try_from(idx.contiguous().view(-1)).map_err(|e| Error::Data(e.to_string()))?;
        for r in 0..n {
            let (qid, _) = &split.queries[start + r];
            let judged = &split.qrels[qid];
            let ranked: Vec<&str> =
                idx[r * k as usize..(r + 1) * k as usize].iter().map(|&i| doc_ids[i as usize].as_str()).collect();
            ndcg += ndcg_at(&ranked, judged, 10);
            if let Some(p) = ranked.iter().take(10).position(|d| judged.get(*d).is_some_and(|&g| g >= 1)) {
                mrr += 1.0 / (p + 1) as f64;
            }
            let rel = judged.values().filter(|&&g| g >= 1).count().max(1);
            recall += ranked.iter().filter(|d| judged.get(**d).is_some_and(|&g| g >= 1)).count() as f64 / rel as f64;
        }
    }
    let n = texts.len().max(1) as f64;
    Ok(RetrievalMetrics { ndcg_at_10: ndcg / n, mrr_at_10: mrr / n, recall_at_100: recall / n, queries: texts.len() })
}

pub fn load_split(set: &Path, split: &str) -> Result<BeirSplit> {
    read_beir_split(set, split)
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub name: String,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub mean_ms: f64,
}

/// Per-query latency (batch of one, tokenisation included) of each encoder, measured interleaved on the same
/// queries so that machine load affects all alike.
pub fn query_latency(encoders: &[(&str, &Encoder)], queries: &[String], warmup: usize) -> Result<Vec<Latency>> {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); encoders.len()];
    tch::no_grad(|| -> Result<()> {
        for (i, q) in queries.iter().enumerate() {
            for (e, (_, enc)) in encoders.iter().enumerate() {
                let t0 = Instant::now();
                let v = enc.embed(&[q.as_str()], false)?;
                let _ = v.double_value(&[0, 0]);
                if i >= warmup {
                    times[e].push(t0.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        Ok(())
    })?;
    Ok(encoders
        .iter()
        .zip(times)
        .map(|((name, _), mut t)| {
            t.sort_by(f64::total_cmp);
            let pick = |p: f64| t.get(((t.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
            Latency {
                name: (*name).to_string(),
                p50_ms: pick(0.5),
                p90_ms: pick(0.9),
                mean_ms: t.iter().sum::<f64>() / t.len().max(1) as f64,
            }
        })
        .collect())
}
