//! Training data: readers for the CARE JSONL layout, `train_pairs.jsonl` and BEIR train splits; Stage I
//! self-pairs from an approved corpus; hard-negative mining that drops likely false negatives; a seeded
//! shuffler so the example order of every step is a pure function of (seed, epoch).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

use care_formats::training::{TrainingExample, read_examples, read_pairs};
use serde::Deserialize;
use tch::Tensor;

use crate::{Error, Result};

fn open(path: &Path) -> Result<BufReader<std::fs::File>> {
    Ok(BufReader::new(std::fs::File::open(path).map_err(|e| Error::io(path, e))?))
}

/// CARE layout: `{"query", "pos": [..], "neg": [..], "prompt"?, "type"?}`.
pub fn read_care_jsonl(path: &Path) -> Result<Vec<TrainingExample>> {
    read_examples(open(path)?).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

/// `train_pairs.jsonl`: `{"query", "positive", "negatives": [..], ...}`.
pub fn read_train_pairs(path: &Path) -> Result<Vec<TrainingExample>> {
    read_pairs(open(path)?).map_err(|e| Error::Data(format!("{}: {e}", path.display())))
}

/// Either format, told apart by the first record's keys.
pub fn read_training_file(path: &Path) -> Result<Vec<TrainingExample>> {
    let mut first = String::new();
    open(path)?.read_line(&mut first).map_err(|e| Error::io(path, e))?;
    if first.contains("\"positive\"") { read_train_pairs(path) } else { read_care_jsonl(path) }
}

#[derive(Debug, Deserialize)]
struct CorpusLine {
    /// `id` in our layouts, `_id` in standard BEIR corpora.
    #[serde(default, alias = "_id")]
    id: String,
    #[serde(default)]
    title: String,
    text: String,
    #[serde(default)]
    kind: Option<String>,
}

/// A corpus text with its id.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub id: String,
    pub text: String,
    pub kind: Option<String>,
}

/// A corpus line's text as training reads it: title and text joined by a space when there is a title
/// (`care-train prune-vocab` keeps the pieces of exactly this).
pub fn corpus_text(title: &str, text: &str) -> String {
    if title.trim().is_empty() { text.to_string() } else { format!("{} {text}", title.trim()) }
}

/// `corpus.jsonl` (BEIR or the training corpus): title and text joined by a space when both are present.
pub fn read_corpus(path: &Path) -> Result<Vec<Doc>> {
    let mut out = Vec::new();
    for (i, line) in open(path)?.lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let c: CorpusLine =
            serde_json::from_str(&line).map_err(|e| Error::Data(format!("{} line {}: {e}", path.display(), i + 1)))?;
        out.push(Doc { id: c.id, text: corpus_text(&c.title, &c.text), kind: c.kind });
    }
    Ok(out)
}

/// A BEIR set split: queries (id, text) and judgements query → {doc → grade}.
#[derive(Debug, Clone)]
pub struct BeirSplit {
    pub queries: Vec<(String, String)>,
    pub qrels: HashMap<String, HashMap<String, u32>>,
}

pub fn read_beir_split(dir: &Path, split: &str) -> Result<BeirSplit> {
    let qrels_path = dir.join("qrels").join(format!("{split}.tsv"));
    let mut qrels: HashMap<String, HashMap<String, u32>> = HashMap::new();
    for (i, line) in open(&qrels_path)?.lines().enumerate() {
        let line = line.map_err(|e| Error::io(&qrels_path, e))?;
        let f: Vec<&str> = line.split('\t').collect();
        if i == 0 && f.first() == Some(&"query-id") || line.trim().is_empty() {
            continue;
        }
        if f.len() < 3 {
            return Err(Error::Data(format!(
                "{} line {}: expected query-id, corpus-id, score",
                qrels_path.display(),
                i + 1
            )));
        }
        let grade: u32 = f[2]
            .trim()
            .parse()
            .map_err(|_| Error::Data(format!("{} line {}: bad score {:?}", qrels_path.display(), i + 1, f[2])))?;
        qrels.entry(f[0].to_string()).or_default().insert(f[1].to_string(), grade);
    }
    #[derive(Deserialize)]
    struct Q {
        id: String,
        text: String,
    }
    let qpath = dir.join("queries.jsonl");
    let mut queries = Vec::new();
    for (i, line) in open(&qpath)?.lines().enumerate() {
        let line = line.map_err(|e| Error::io(&qpath, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let q: Q =
            serde_json::from_str(&line).map_err(|e| Error::Data(format!("{} line {}: {e}", qpath.display(), i + 1)))?;
        if qrels.contains_key(&q.id) {
            queries.push((q.id, q.text));
        }
    }
    Ok(BeirSplit { queries, qrels })
}

/// A BEIR train split as training examples: each query with its documents graded ≥ `min_grade` as positives
/// and its judged documents below as negatives.
pub fn beir_train_examples(dir: &Path, split: &str, min_grade: u32) -> Result<Vec<TrainingExample>> {
    let s = read_beir_split(dir, split)?;
    let corpus: HashMap<String, String> =
        read_corpus(&dir.join("corpus.jsonl"))?.into_iter().map(|d| (d.id, d.text)).collect();
    let mut out = Vec::new();
    for (id, text) in &s.queries {
        let judged = &s.qrels[id];
        let mut docs: Vec<(&String, &u32)> = judged.iter().collect();
        docs.sort();
        let pos: Vec<String> =
            docs.iter().filter(|(_, g)| **g >= min_grade).filter_map(|(d, _)| corpus.get(*d).cloned()).collect();
        let neg: Vec<String> =
            docs.iter().filter(|(_, g)| **g < min_grade).filter_map(|(d, _)| corpus.get(*d).cloned()).collect();
        if !pos.is_empty() {
            out.push(TrainingExample { query: text.clone(), pos, neg, prompt: None, kind: Some("beir".into()) });
        }
    }
    Ok(out)
}

/// Stage I self-pairs: every text paired with itself, no negatives (queries and documents alike).
pub fn self_pairs(texts: &[String], kind: &str) -> Vec<TrainingExample> {
    texts
        .iter()
        .map(|t| TrainingExample {
            query: t.clone(),
            pos: vec![t.clone()],
            neg: vec![],
            prompt: None,
            kind: Some(kind.into()),
        })
        .collect()
}

/// Stage I pairs with each encoder's own prompt: the query encoder (student) sees every text through
/// `query_template`; the frozen document encoder (teacher) sees a passage through `document_template` and a
/// query-kind text through `teacher_query_template` (its own query instruction: an e5 student and a Qwen3 teacher
/// prompt queries differently). Returns the pairs and the teacher's distinct texts, in first-seen order.
pub fn stage1_pairs(
    docs: &[Doc],
    query_kinds: &[String],
    query_template: &str,
    document_template: &str,
    teacher_query_template: &str,
) -> (Vec<TrainingExample>, Vec<String>) {
    let render = |t: &str, x: &str| t.replace("{text}", x);
    let mut seen = HashSet::new();
    let mut teacher = Vec::new();
    let pairs = docs
        .iter()
        .map(|d| {
            let is_query = d.kind.as_ref().is_some_and(|k| query_kinds.contains(k));
            let t = render(if is_query { teacher_query_template } else { document_template }, &d.text);
            if seen.insert(t.clone()) {
                teacher.push(t.clone());
            }
            TrainingExample {
                query: render(query_template, &d.text),
                pos: vec![t],
                neg: vec![],
                prompt: None,
                kind: Some("stage1".into()),
            }
        })
        .collect();
    (pairs, teacher)
}

/// SplitMix64: a tiny, portable PRNG, so data order does not depend on any library's RNG.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A permutation of `0..n` for `(seed, epoch)`.
pub fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix::new(seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407));
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        p.swap(i, j);
    }
    p
}

/// Indices of the examples that make up step `step` (0-based) with batches of `batch`: epochs are walked in
/// order, each shuffled by `(seed, epoch)`; a pure function, which is what makes resume exact.
pub fn batch_indices(n: usize, batch: usize, seed: u64, step: u64) -> Vec<usize> {
    let per_epoch = (n / batch).max(1) as u64;
    let epoch = step / per_epoch;
    let k = (step % per_epoch) as usize;
    let p = permutation(n, seed, epoch);
    p.iter().cycle().skip(k * batch).take(batch).copied().collect()
}

/// Source id of each example: its `type` after the last ':' (`judged:kuake` and `feedback:kuake` are both
/// `kuake`), ids in first-seen order; examples without a type share one source.
pub fn source_ids(examples: &[TrainingExample]) -> Vec<usize> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    examples
        .iter()
        .map(|e| {
            let s = e.kind.as_deref().map_or("", |k| k.rsplit(':').next().unwrap_or(k));
            let n = ids.len();
            *ids.entry(s).or_insert(n)
        })
        .collect()
}

/// As [`batch_indices`], but every batch holds examples of one source. Mixed batches give a huatuo question
/// kuake's short titles as in-batch negatives, easy to tell apart; one source per batch makes every in-batch
/// negative a passage of the collection it is searched in (on the real run: within noise,
/// docs/experiments/2026-11-26-retraining-one-group-per-query.md).
/// Each epoch shuffles each source by `(seed, epoch, source)` and cuts it into full batches (a source smaller than
/// a batch is one batch), then shuffles the batches by `(seed, epoch)`: a pure function, so resume stays exact.
pub fn source_batch_indices(sources: &[usize], batch: usize, seed: u64, step: u64) -> Vec<usize> {
    let n_sources = sources.iter().max().map_or(0, |m| m + 1);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); n_sources];
    for (i, &s) in sources.iter().enumerate() {
        members[s].push(i);
    }
    let batches_of = |m: &Vec<usize>| (m.len() / batch.max(1)).max(usize::from(!m.is_empty()));
    let per_epoch = members.iter().map(batches_of).sum::<usize>().max(1) as u64;
    let (epoch, k) = (step / per_epoch, (step % per_epoch) as usize);
    let mut all: Vec<Vec<usize>> = Vec::new();
    for (s, m) in members.iter().enumerate() {
        let p = permutation(m.len(), seed ^ (s as u64 + 1).wrapping_mul(0x9FB2_1C65_1E98_DF25), epoch);
        let size = batch.min(m.len()).max(1);
        all.extend((0..batches_of(m)).map(|b| p[b * size..(b + 1) * size].iter().map(|&j| m[j]).collect()));
    }
    if all.is_empty() {
        return Vec::new();
    }
    let order = permutation(all.len(), seed, epoch);
    std::mem::take(&mut all[order[k]])
}

/// Options for [`mine_hard_negatives`].
#[derive(Debug, Clone, Copy)]
pub struct MiningOptions {
    /// Negatives to keep per query.
    pub negatives: usize,
    /// Skip this many top-ranked candidates (the head holds most unlabelled positives).
    pub skip_top: usize,
    /// Look at most this deep into the ranking.
    pub depth: usize,
    /// Drop a candidate scoring above `positive score − margin_sd × σ` as a likely false negative, σ being the
    /// standard deviation of this encoder's positive scores over the run (NV-Retriever's "TopK-MarginPos" with the
    /// margin on the encoder's own scale). A fixed ratio of the positive's score ("TopK-PercPos" 0.95) means nothing
    /// for an encoder whose cosines all sit in 0.75–0.9: with e5 it dropped 118,706 candidates for 2,999 queries.
    pub margin_sd: f32,
}

impl Default for MiningOptions {
    fn default() -> Self {
        Self { negatives: 7, skip_top: 3, depth: 50, margin_sd: 0.5 }
    }
}

/// What mining did, recorded in the run's `run.json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct MiningReport {
    /// Candidates dropped as likely false negatives.
    pub dropped: usize,
    /// The score margin below the positive that was used (`margin_sd × σ`).
    pub margin: f32,
    /// Examples still short of `negatives` after mining (the trainer tops them up at random).
    pub short: usize,
}

/// Fills each example's `neg` up to `opts.negatives` from `pool`, ranked by `query_vecs · pool_vecs`.
/// `query_vecs [n, w]` (one per example) and `pool_vecs [m, w]` are normalised; `pos_scores[i]` is the score
/// of example i's first positive. Candidates equal to a positive or already a negative are skipped; the
/// returned count is how many candidates were dropped as likely false negatives.
pub fn mine_hard_negatives(
    examples: &mut [TrainingExample],
    query_vecs: &Tensor,
    pos_scores: &[f32],
    pool: &[String],
    pool_vecs: &Tensor,
    opts: MiningOptions,
) -> Result<MiningReport> {
    let k = (opts.depth + 1).min(pool.len()) as i64;
    let margin = opts.margin_sd * std_dev(pos_scores);
    let mut dropped = 0;
    let chunk = 256;
    for start in (0..examples.len()).step_by(chunk) {
        let end = (start + chunk).min(examples.len());
        let scores = query_vecs.narrow(0, start as i64, (end - start) as i64).matmul(&pool_vecs.tr());
        let (vals, idx) = scores.topk(k, 1, true, true);
        let vals = Vec::<f32>::try_from(vals.contiguous().view(-1)).map_err(|e| Error::Data(e.to_string()))?;
        let idx = Vec::<i64>::try_from(idx.contiguous().view(-1)).map_err(|e| Error::Data(e.to_string()))?;
        for (row, ex) in examples[start..end].iter_mut().enumerate() {
            let taken: HashSet<String> = ex.pos.iter().chain(ex.neg.iter()).cloned().collect();
            let limit = pos_scores[start + row] - margin;
            let mut rank = 0;
            for j in 0..k as usize {
                if ex.neg.len() >= opts.negatives {
                    break;
                }
                let cand = &pool[idx[row * k as usize + j] as usize];
                if taken.contains(cand) {
                    continue;
                }
                rank += 1;
                if rank <= opts.skip_top {
                    continue;
                }
                if vals[row * k as usize + j] > limit {
                    dropped += 1;
                    continue;
                }
                ex.neg.push(cand.clone());
            }
        }
    }
    let short = examples.iter().filter(|e| e.neg.len() < opts.negatives).count();
    Ok(MiningReport { dropped, margin, short })
}

fn std_dev(xs: &[f32]) -> f32 {
    if xs.len() < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f32>() / xs.len() as f32;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / (xs.len() - 1) as f32).sqrt()
}

/// Distinct texts of all positives and negatives, in first-seen order.
pub fn document_pool(examples: &[TrainingExample]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for e in examples {
        for t in e.pos.iter().chain(e.neg.iter()) {
            if seen.insert(t.clone()) {
                out.push(t.clone());
            }
        }
    }
    out
}

/// Counts examples per `kind`.
pub fn kinds(examples: &[TrainingExample]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in examples {
        *m.entry(e.kind.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    m
}
