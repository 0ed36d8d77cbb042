//! Training data from the appliance's own stores, only from collections approved for training.
//!
//! - Stage I (`corpus.jsonl`, the trainer's corpus layout): the chunks of approved collections as the document
//!   encoder sees them, the training queries of their judgment sets and, when the recipe asks for it, past search
//!   queries of the audit log (de-duplicated).
//! - Stage II (`stage2.jsonl`, CARE JSONL): the training part of every judgment set of an approved collection
//!   (uploads and clinician feedback), plus heading-path → passage pairs of structured documents. Each group gets
//!   up to [`DataOptions::negatives`] negatives: judged non-relevant passages first, then hard negatives mined from
//!   the served dense index, then (when the recipe asks) the query's BM25 matches
//!   ([`DataOptions::lexical_negatives`]), then random passages to top the group up.
//!
//! The evaluation part of a judgment set never enters either file: judgments are read by part, and search queries
//! are kept only when [`part_of`] puts them in the training part, so a query asked by a clinician and later judged
//! for evaluation cannot leak in through Stage I.
//!
//! Negatives are mined with the document model as the guide when it can encode queries (else the live query
//! encoder), from the group's own collection (where the query is served: passages of another collection are easy
//! negatives that teach nothing about the ranking clinicians see; on the real run, one run each, it moved huatuo dev
//! nDCG@10 from +2.45 to +2.94). Likely false negatives (a mined passage that answers the query but was never
//! judged) are dropped with a margin calibrated on the guide's scores: a candidate scoring above the query's own
//! positive, or within `FN_MARGIN_SD` standard deviations (of the positives' scores) below it, is dropped. Keeping
//! the candidates ranked above the positive instead (dropping only those clearly above it) was measured worse on
//! the real run: huatuo dev +2.14 against +2.94, toyhom +0.67 against +1.78. A fixed ratio of the positive's score
//! (the trainer's old 0.95 rule) means nothing across encoders whose cosines live in 0.7–0.9 (e5) or −0.2–0.8.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use care_formats::trainer::{Hyper, Stage2Options};
use care_formats::training::TrainingExample;
use care_modelio::tensor::{Tensor, TensorMap};
use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::accounts::Admin;
use crate::encoders::TextKind;
use crate::error::{Error, Result};
use crate::hybrid::embedding_text;
use crate::judgments::part_of;
use crate::models::{ActivePair, ModelRecord};
use crate::store::{ChunkRow, Collection};

/// Candidates scoring above a query's positive, or within this many standard deviations (of the positives'
/// scores) below it, are treated as likely false negatives.
const FN_MARGIN_SD: f32 = 0.5;
/// Dense candidates mined per training query. Deep enough that a query whose positive the guide ranks low still
/// finds candidates below it: at 30, the real run's huatuo groups (e5-small's dense nDCG@10 there is 0.35) lost
/// 72 % of their candidates to the false-negative filter and a third of the groups were topped up at random. The
/// scan is exact either way, so depth costs only the sort.
const MINE_DEPTH: usize = 100;
/// BM25 matches examined per group the dense candidates left short.
const LEXICAL_MINE_DEPTH: usize = 50;
/// Queries encoded per batch while mining.
const MINE_BATCH: usize = 32;
/// Beside `corpus.jsonl`: the served vectors of its lines.
pub(crate) const SERVED_VECTORS: &str = "served_vectors.safetensors";

/// What goes into one run's data (part of the recipe).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DataOptions {
    /// Past search queries (audit log, training part only) join the Stage I texts.
    pub include_search_queries: bool,
    /// Heading-path → passage pairs per run, at most (a seeded sample).
    pub max_heading_pairs: usize,
    /// Negatives per Stage II group (CARE: 7 with 1 positive).
    pub negatives: usize,
    /// Stage II groups per judged query, at most: a seeded choice among its relevant documents (0: one group per
    /// relevant document). kuake's 2,558 training queries held 10,237 of the real run's 15,993 groups (up to 19
    /// each), so a query with many positives outweighed ten with one; one group per query gave +3.27 / +2.28
    /// nDCG@10 on huatuo / toyhom dev against +2.94 / +1.78, kuake unchanged
    /// (docs/experiments/2026-11-26-retraining-one-group-per-query.md).
    pub groups_per_query: usize,
    /// A group the dense candidates leave short is filled from the query's BM25 matches (same false-negative
    /// filter) before random passages: passages that share the query's words but not its answer. Short groups are
    /// those whose positive the guide ranks low (every candidate above it is dropped as a likely false negative):
    /// 3,809 of 8,313 on the real run. Off by default: on the real run it cut the random negatives from 26,532 to
    /// 5,523 and changed dev nDCG@10 by −0.62 / +0.03 / +0.04 (huatuo / toyhom / kuake) against the same recipe
    /// without it (docs/experiments/2026-11-27-retraining-lexical-negatives.md).
    pub lexical_negatives: bool,
    pub seed: u64,
}

impl Default for DataOptions {
    fn default() -> Self {
        DataOptions {
            include_search_queries: false,
            max_heading_pairs: 2000,
            // The trainer's Stage II group (1 positive + 7 negatives) and seed.
            negatives: Stage2Options::default().group_size - 1,
            groups_per_query: 1,
            lexical_negatives: false,
            seed: Hyper::default().seed,
        }
    }
}

/// What a run trained on: recorded with the run and shown in the console.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DataCounts {
    pub collections: Vec<CollectionCounts>,
    pub stage1_passages: usize,
    pub stage1_queries: usize,
    pub stage2_groups: usize,
    pub judged_pairs: usize,
    pub heading_pairs: usize,
    pub judged_negatives: usize,
    pub mined_candidates: usize,
    pub false_negatives_dropped: usize,
    /// The margin below a positive's score under which mined candidates are kept.
    pub false_negative_margin: f32,
    /// BM25 matches examined for groups the dense candidates left short, dropped by the filter, and kept.
    #[serde(default)]
    pub lexical_candidates: usize,
    #[serde(default)]
    pub lexical_dropped: usize,
    #[serde(default)]
    pub lexical_negatives: usize,
    pub groups_topped_up: usize,
    pub random_negatives: usize,
    /// Judged + heading groups before the `stage2_max_groups` sample.
    pub groups_before_sampling: usize,
    /// Corpus passages whose document vector came from the served index (handed to the trainer).
    pub served_vectors: usize,
    /// Positives the index lacked, encoded while mining.
    pub positives_encoded: usize,
    /// Where the mined negatives came from: the query encoder that searched (the guide) and the document model
    /// whose served vectors it searched, as `NAME@VERSION`; empty when nothing was mined.
    #[serde(default)]
    pub mined_with: String,
    #[serde(default)]
    pub mined_from: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CollectionCounts {
    pub name: String,
    pub passages: usize,
    pub train_queries: usize,
    /// Judged queries of the evaluation part, left out.
    pub eval_queries_left_out: usize,
}

/// One Stage II group before negatives: the query, its positive chunk and the chunks judged not relevant.
struct Group {
    query: String,
    /// The collection the query is judged against: its negatives come from there.
    collection: String,
    /// Asked by a clinician (feedback): always kept when groups are sampled.
    feedback: bool,
    kind: String,
    positive: i64,
    skip_docs: HashSet<i64>,
    judged_neg: Vec<i64>,
}

/// A training run's data: approved passages, judged and searched queries with mined hard negatives, the served
/// vectors, written where the trainer reads them.
#[derive(Clone, Copy)]
pub struct TrainingData<'e> {
    pub(crate) cfg: &'e crate::config::EngineConfig,
    pub(crate) retrieval: crate::hybrid::Retrieval<'e>,
    pub(crate) vectors: crate::vectors::Vectors<'e>,
    pub(crate) judgments: crate::judgments::Judgments<'e>,
}

impl TrainingData<'_> {
    /// The part, borrowed from the engine's.
    pub fn of(e: &crate::Engine) -> TrainingData<'_> {
        TrainingData { cfg: &e.cfg, retrieval: e.retrieval(), vectors: e.vectors(), judgments: e.judgments() }
    }

    /// Writes `corpus.jsonl` and `stage2.jsonl` into `dir` from the approved collections and returns the counts;
    /// with a pair, also `served_vectors.safetensors`, the document vectors the index holds for the corpus lines.
    /// At most `max_groups` Stage II groups (a seeded sample, drawn before mining: mining is the costly part).
    pub(crate) fn assemble_training_data(
        &self,
        dir: &Path,
        pair: Option<&ActivePair>,
        opts: &DataOptions,
        max_groups: usize,
    ) -> Result<DataCounts> {
        let approved: Vec<Collection> =
            self.retrieval.store.collection_list()?.into_iter().filter(|c| c.approved_for_training).collect();
        if approved.is_empty() {
            return Err(Error::InvalidInput(
                "没有批准用于训练的集合 (no collection is approved for training; approve one on the 集合 page or with \
                 `care collection approve NAME`)"
                    .into(),
            ));
        }
        let names: HashSet<&str> = approved.iter().map(|c| c.name.as_str()).collect();
        let mut chunks: Vec<ChunkRow> = Vec::new();
        self.retrieval.store.for_each_live_chunk(|r| {
            if names.contains(r.collection.as_str()) {
                chunks.push(r);
            }
            Ok(())
        })?;
        let mut counts = DataCounts::default();
        let mut groups = Vec::new();
        for col in &approved {
            let (g, c) = self.judged_groups(col, &chunks, opts)?;
            counts.judged_pairs += g.len();
            groups.extend(g);
            counts.collections.push(c);
        }
        // Stage I texts beside the passages: the judged training queries (what the query encoder will serve) and,
        // when asked, past search queries; each once.
        let mut queries: Vec<String> = groups.iter().map(|g| g.query.clone()).collect();
        if opts.include_search_queries {
            queries.extend(self.search_queries_for_training()?);
        }
        let mut seen = HashSet::new();
        queries.retain(|q| seen.insert(q.clone()));
        counts.stage1_passages = chunks.len();
        counts.stage1_queries = queries.len();
        write_corpus(&dir.join("corpus.jsonl"), &chunks, &queries)?;
        let served = match pair {
            Some(p) => self.served_vectors(&approved, &p.document)?,
            None => HashMap::new(),
        };
        counts.served_vectors = write_served_vectors(&dir.join(SERVED_VECTORS), &chunks, &served)?;

        let by_id: HashMap<i64, usize> = chunks.iter().enumerate().map(|(i, c)| (c.chunk_id, i)).collect();
        let headings = heading_groups(&chunks, opts.max_heading_pairs, opts.seed);
        counts.heading_pairs = headings.len();
        groups.extend(headings);
        counts.groups_before_sampling = groups.len();
        let groups = sample_groups(groups, max_groups, opts.seed);
        let ctx = MineCtx { chunks: &chunks, by_id: &by_id, cols: &approved, served: &served };
        let examples = self.with_negatives(&groups, &ctx, pair, opts, &mut counts)?;
        counts.stage2_groups = examples.len();
        let mut out = jsonl(&dir.join("stage2.jsonl"))?;
        for ex in &examples {
            writeln!(out, "{}", serde_json::to_string(ex).map_err(|e| Error::Internal(e.to_string()))?)
                .map_err(|e| Error::io(dir, e))?;
        }
        out.flush().map_err(|e| Error::io(dir, e))?;
        Ok(counts)
    }

    /// Search queries of the audit log (`search` records), training part only, de-duplicated, in first-seen order.
    fn search_queries_for_training(&self) -> Result<Vec<String>> {
        let fraction = self.cfg.lifecycle.eval_fraction;
        let rows: Vec<String> = self
            .retrieval
            .store
            .reader()
            // Query texts are in the log only while query logging is on; otherwise `query` is a length record.
            .prepare(
                "SELECT json_extract(detail, '$.query') FROM audit \
                 WHERE action = 'search' AND json_type(detail, '$.query') = 'text' ORDER BY id",
            )?
            .query_map([], |r| r.get::<_, Option<String>>(0))?
            .filter_map(|r| r.ok().flatten())
            .collect();
        let mut seen = HashSet::new();
        Ok(rows
            .into_iter()
            .map(|q| q.trim().to_string())
            .filter(|q| !q.is_empty() && part_of(q, fraction) == "train" && seen.insert(q.clone()))
            .collect())
    }

    /// The training part of a collection's judgments as groups: each relevant document's best-matching chunk is a
    /// positive; documents judged not relevant give judged negatives.
    fn judged_groups(
        &self,
        col: &Collection,
        chunks: &[ChunkRow],
        opts: &DataOptions,
    ) -> Result<(Vec<Group>, CollectionCounts)> {
        let train = self.judgments.judged(col.id, "train")?;
        let eval = self.judgments.judged(col.id, "eval")?.scorable();
        let docs: HashMap<String, i64> = self
            .retrieval
            .store
            .reader()
            .prepare("SELECT external_id, id FROM documents WHERE collection_id = ?1 AND state != 'deleting'")?
            .query_map(params![col.id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut of_doc: HashMap<i64, Vec<&ChunkRow>> = HashMap::new();
        for c in chunks.iter().filter(|c| c.collection == col.name) {
            of_doc.entry(c.document_id).or_default().push(c);
        }
        let best = |doc: i64, query: &str| -> Option<i64> {
            of_doc.get(&doc)?.iter().max_by_key(|c| overlap(query, &c.text)).map(|c| c.chunk_id)
        };
        let asked: HashSet<String> = self.judgments.feedback_rows(col.id)?.into_iter().map(|r| r.0).collect();
        let mut groups = Vec::new();
        let mut train_queries = 0;
        for (qid, query) in &train.queries {
            let Some(judged) = train.qrels.get(qid) else { continue };
            // Sorted: the judgments are hash maps, and a resumed or repeated run must write the very same groups.
            let mut resolved: Vec<(i64, u32)> =
                judged.iter().filter_map(|(ext, g)| docs.get(ext).map(|d| (*d, *g))).collect();
            resolved.sort_unstable();
            let positives: Vec<i64> = resolved.iter().filter(|(_, g)| *g > 0).map(|(d, _)| *d).collect();
            let skip_docs: HashSet<i64> = positives.iter().copied().collect();
            let judged_neg: Vec<i64> =
                resolved.iter().filter(|(_, g)| *g == 0).filter_map(|(d, _)| best(*d, query)).collect();
            // Capped after resolving: a relevant document without a live chunk must not use up the query's pick.
            let found: Vec<i64> = positives.iter().filter_map(|&d| best(d, query)).collect();
            let feedback = asked.contains(query);
            for positive in capped(&found, opts.groups_per_query, opts.seed, query) {
                groups.push(Group {
                    query: query.clone(),
                    collection: col.name.clone(),
                    feedback,
                    kind: format!("{}:{}", if feedback { "feedback" } else { "judged" }, col.name),
                    positive,
                    skip_docs: skip_docs.clone(),
                    judged_neg: judged_neg.clone(),
                });
            }
            train_queries += usize::from(!found.is_empty());
        }
        let passages = chunks.iter().filter(|c| c.collection == col.name).count();
        let counts = CollectionCounts {
            name: col.name.clone(),
            passages,
            train_queries,
            eval_queries_left_out: eval.queries.len(),
        };
        Ok((groups, counts))
    }

    /// The document vectors a dense index of `model` holds for the approved collections, by chunk id.
    fn served_vectors(&self, cols: &[Collection], model: &ModelRecord) -> Result<HashMap<i64, Vec<f32>>> {
        let mut out = HashMap::new();
        for col in cols {
            out.extend(self.vectors.dense_vectors_of(col.id, model)?);
        }
        Ok(out)
    }

    /// Fills each group with negatives (judged, mined from the dense index with the false-negative filter, then
    /// random) and renders it as a training example.
    fn with_negatives(
        &self,
        groups: &[Group],
        ctx: &MineCtx<'_>,
        pair: Option<&ActivePair>,
        opts: &DataOptions,
        counts: &mut DataCounts,
    ) -> Result<Vec<TrainingExample>> {
        let (chunks, by_id) = (ctx.chunks, ctx.by_id);
        let mined = match pair {
            Some(pair) => self.mine(groups, ctx, pair, counts)?,
            None => groups.iter().map(|_| (0.0, Vec::new(), Default::default())).collect(),
        };
        let pos_scores: Vec<f32> = mined.iter().map(|m| m.0).collect();
        let margin = FN_MARGIN_SD * std_dev(&pos_scores);
        counts.false_negative_margin = margin;
        let text = |id: i64| by_id.get(&id).map(|&i| embedding_text(&chunks[i]));
        let mut rng = SplitMix(opts.seed);
        let mut of_col: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, c) in chunks.iter().enumerate() {
            of_col.entry(c.collection.as_str()).or_default().push(i);
        }
        let mut out = Vec::with_capacity(groups.len());
        for (g, (pos_score, cands, qvec)) in groups.iter().zip(&mined) {
            let pool = of_col.get(g.collection.as_str()).map_or(&[][..], Vec::as_slice);
            let doc_of = |id: i64| by_id.get(&id).map(|&i| chunks[i].document_id);
            let mut neg: Vec<i64> = Vec::new();
            for &id in g.judged_neg.iter().take(opts.negatives) {
                neg.push(id);
                counts.judged_negatives += 1;
            }
            for &(id, score) in cands {
                if neg.len() >= opts.negatives {
                    break;
                }
                if id == g.positive || doc_of(id).is_none_or(|d| g.skip_docs.contains(&d)) || neg.contains(&id) {
                    continue;
                }
                counts.mined_candidates += 1;
                if score >= pos_score - margin {
                    counts.false_negatives_dropped += 1;
                    continue;
                }
                neg.push(id);
            }
            if opts.lexical_negatives && neg.len() < opts.negatives && !qvec.is_empty() {
                let examined: HashSet<i64> = cands.iter().map(|c| c.0).collect();
                let guide_score =
                    |id: i64| ctx.served.get(&id).map(|v| qvec.iter().zip(v).map(|(a, b)| a * b).sum::<f32>());
                let hits = self.retrieval.lexical.search(
                    &g.query,
                    Some(std::slice::from_ref(&g.collection)),
                    LEXICAL_MINE_DEPTH,
                    1.0,
                )?;
                for h in hits {
                    if neg.len() >= opts.negatives {
                        break;
                    }
                    let id = h.chunk_id;
                    if id == g.positive
                        || examined.contains(&id)
                        || neg.contains(&id)
                        || g.skip_docs.contains(&h.document_id)
                    {
                        continue;
                    }
                    // The same false-negative filter as the dense candidates, on the guide's score of the passage.
                    let Some(score) = guide_score(id) else { continue };
                    counts.lexical_candidates += 1;
                    if score >= pos_score - margin {
                        counts.lexical_dropped += 1;
                        continue;
                    }
                    neg.push(id);
                    counts.lexical_negatives += 1;
                }
            }
            if neg.len() < opts.negatives && pool.len() > opts.negatives + g.skip_docs.len() + 1 {
                counts.groups_topped_up += 1;
                let mut tries = 0;
                while neg.len() < opts.negatives && tries < 100 {
                    tries += 1;
                    let c = &chunks[pool[(rng.next() % pool.len() as u64) as usize]];
                    if c.chunk_id != g.positive && !g.skip_docs.contains(&c.document_id) && !neg.contains(&c.chunk_id) {
                        neg.push(c.chunk_id);
                        counts.random_negatives += 1;
                    }
                }
            }
            let Some(pos) = text(g.positive) else { continue };
            out.push(TrainingExample {
                query: g.query.clone(),
                pos: vec![pos],
                neg: neg.into_iter().filter_map(text).collect(),
                prompt: None,
                kind: Some(g.kind.clone()),
            });
        }
        Ok(out)
    }

    /// For each group: the positive's score and the dense top candidates (chunk id, score) of the served index.
    /// Each distinct query is encoded and searched once (a query judged with several relevant documents makes
    /// several groups); a positive's vector is read from the index when the guide scores against the served
    /// document vectors, and encoded only when the index lacks it.
    fn mine(
        &self,
        groups: &[Group],
        ctx: &MineCtx<'_>,
        pair: &ActivePair,
        counts: &mut DataCounts,
    ) -> Result<Vec<Mined>> {
        let (chunks, by_id, cols) = (ctx.chunks, ctx.by_id, ctx.cols);
        // The guide: the document model when it also encodes queries (CARE's large encoder is the better judge of
        // relevance), else the live query encoder. A small query encoder that is still poorly aligned ranks true
        // negatives above the positive, and its scores would make the false-negative filter drop nearly all of them.
        let guide = if pair.document.role == "both" { &pair.document } else { &pair.query };
        counts.mined_with = format!("{}@{}", guide.name, guide.version);
        counts.mined_from = format!("{}@{}", pair.document.name, pair.document.version);
        let qenc = self.retrieval.models.encoder(guide)?;
        // Each distinct query is encoded once and searched once in each collection it is judged against.
        let mut keys: Vec<(&str, &str)> = groups.iter().map(|g| (g.query.as_str(), g.collection.as_str())).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut queries: Vec<&str> = keys.iter().map(|k| k.0).collect();
        queries.dedup();
        let mut vec_of: HashMap<&str, std::sync::Arc<Vec<f32>>> = HashMap::with_capacity(queries.len());
        for batch in queries.chunks(MINE_BATCH) {
            vec_of.extend(
                batch.iter().copied().zip(qenc.encode(batch, TextKind::Query)?.into_iter().map(std::sync::Arc::new)),
            );
        }
        let mut hits_of: HashMap<(&str, &str), Candidates> = HashMap::with_capacity(keys.len());
        for &(q, c) in &keys {
            let col = cols.iter().find(|x| x.name == c).map_or(&[][..], std::slice::from_ref);
            let hits = self.retrieval.dense_search_in(&vec_of[q], guide, &pair.document, col, MINE_DEPTH, None)?;
            hits_of.insert((q, c), hits.into_iter().map(|h| (h.chunk_id, h.score)).collect());
        }
        // Positives the index lacks (a chunk ingested but not yet embedded): encoded, as the index would.
        let mut pos_vec: HashMap<i64, Vec<f32>> = HashMap::new();
        let missing: Vec<i64> = {
            let mut m: Vec<i64> = groups.iter().map(|g| g.positive).filter(|p| !ctx.served.contains_key(p)).collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        if !missing.is_empty() {
            let denc = self.retrieval.models.encoder(&pair.document)?;
            for batch in missing.chunks(MINE_BATCH) {
                let texts: Vec<String> = batch
                    .iter()
                    .map(|id| by_id.get(id).map_or_else(String::new, |&i| embedding_text(&chunks[i])))
                    .collect();
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                pos_vec.extend(batch.iter().copied().zip(denc.encode(&refs, TextKind::Document)?));
            }
        }
        counts.positives_encoded = missing.len();
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let q = &vec_of[g.query.as_str()];
            let hits = &hits_of[&(g.query.as_str(), g.collection.as_str())];
            let p = ctx.served.get(&g.positive).or_else(|| pos_vec.get(&g.positive));
            let pos_score = p.map_or(0.0, |p| q.iter().zip(p).map(|(a, b)| a * b).sum::<f32>());
            out.push((pos_score, hits.clone(), q.clone()));
        }
        Ok(out)
    }
}

/// Heading-path → passage groups from chunks that carry a heading other than their title (structured documents).
fn heading_groups(chunks: &[ChunkRow], max: usize, seed: u64) -> Vec<Group> {
    let mut groups: Vec<Group> = chunks
        .iter()
        .filter(|c| !c.heading.trim().is_empty() && c.heading.trim() != c.title.trim())
        .map(|c| Group {
            query: c.heading.trim().to_string(),
            collection: c.collection.clone(),
            feedback: false,
            kind: format!("heading:{}", c.collection),
            positive: c.chunk_id,
            skip_docs: HashSet::from([c.document_id]),
            judged_neg: Vec::new(),
        })
        .collect();
    if groups.len() > max {
        let mut rng = SplitMix(seed ^ 0x4845_4144);
        let mut keyed: Vec<(u64, Group)> = groups.into_iter().map(|g| (rng.next(), g)).collect();
        keyed.sort_by_key(|k| k.0);
        groups = keyed.into_iter().take(max).map(|k| k.1).collect();
    }
    groups
}

/// What mining reads: the approved passages, their index by chunk id, the collections and the served vectors.
struct MineCtx<'a> {
    chunks: &'a [ChunkRow],
    by_id: &'a HashMap<i64, usize>,
    cols: &'a [Collection],
    served: &'a HashMap<i64, Vec<f32>>,
}

/// At most `cap` of a query's positive chunks (0: all), a choice seeded by the run's seed and the query text, so
/// a repeated run picks the same ones; kept in their order.
fn capped(positives: &[i64], cap: usize, seed: u64, query: &str) -> Vec<i64> {
    if cap == 0 {
        return positives.to_vec();
    }
    // FNV-1a of the query: a stable per-query stream (std's hasher is not stable across releases).
    let h = query.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3));
    sample_in_order(positives.to_vec(), cap, SplitMix(seed ^ h), |_| false)
}

/// At most `max` of `items` in their original order: those `first` marks, then a sample drawn with `rng` (one draw
/// per item, in order, so the choice repeats for the same seed).
fn sample_in_order<T>(items: Vec<T>, max: usize, mut rng: SplitMix, first: impl Fn(&T) -> bool) -> Vec<T> {
    if items.len() <= max {
        return items;
    }
    // Marked items sort first (key false before any true).
    let mut keyed: Vec<(bool, u64, usize)> =
        items.iter().enumerate().map(|(i, x)| (!first(x), rng.next(), i)).collect();
    keyed.sort_unstable();
    let mut keep = vec![false; items.len()];
    for (_, _, i) in keyed.into_iter().take(max) {
        keep[i] = true;
    }
    items.into_iter().zip(keep).filter_map(|(x, k)| k.then_some(x)).collect()
}

/// A seeded sample of at most `max` groups, kept in their original order. Clinicians' feedback is always kept
/// (it is what the hospital asked to be taught, and small); the rest is sampled.
fn sample_groups(groups: Vec<Group>, max: usize, seed: u64) -> Vec<Group> {
    sample_in_order(groups, max, SplitMix(seed ^ 0x5354_4732), |g| g.feedback)
}

/// `served_vectors.safetensors` beside `corpus.jsonl`: row i holds the served vector of line i (`present` 1) or
/// zeros (`present` 0: not embedded yet, or a query line). The trainer's frozen teacher reads these instead of
/// re-embedding (`care-train --served-vectors`). Returns how many rows are present; writes nothing without any.
fn write_served_vectors(path: &Path, chunks: &[ChunkRow], served: &HashMap<i64, Vec<f32>>) -> Result<usize> {
    let _ = std::fs::remove_file(path);
    let Some(width) = served.values().next().map(Vec::len) else { return Ok(0) };
    let mut data = vec![0f32; chunks.len() * width];
    let mut present = vec![0f32; chunks.len()];
    for (i, c) in chunks.iter().enumerate() {
        if let Some(v) = served.get(&c.chunk_id).filter(|v| v.len() == width) {
            data[i * width..(i + 1) * width].copy_from_slice(v);
            present[i] = 1.0;
        }
    }
    let n = present.iter().filter(|p| **p > 0.0).count();
    let t =
        |shape: Vec<usize>, d: Vec<f32>| Tensor::new(shape, d).ok_or_else(|| Error::Internal("tensor shape".into()));
    let map: TensorMap = [
        ("vectors".to_string(), t(vec![chunks.len(), width], data)?),
        ("present".to_string(), t(vec![chunks.len()], present)?),
    ]
    .into_iter()
    .collect();
    // Written to a temporary name and renamed, so a crash never leaves a torn file a resumed run would trust.
    let tmp = path.with_extension("tmp");
    care_modelio::safetensors::save(&map, &tmp).map_err(|e| Error::Internal(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    Ok(n)
}

fn write_corpus(path: &Path, chunks: &[ChunkRow], queries: &[String]) -> Result<()> {
    let mut out = jsonl(path)?;
    let mut line = |v: serde_json::Value| writeln!(out, "{v}").map_err(|e| Error::io(path, e));
    for c in chunks {
        // `text` is already what the document encoder reads (title and headings included): an empty `title`
        // keeps the trainer from prefixing the title a second time, so its texts are the served vectors' texts.
        line(serde_json::json!({"id": format!("c{}", c.chunk_id), "title": "", "text": embedding_text(c),
            "kind": "passage"}))?;
    }
    for (i, q) in queries.iter().enumerate() {
        line(serde_json::json!({"id": format!("q{i}"), "title": "", "text": q, "kind": "query"}))?;
    }
    out.flush().map_err(|e| Error::io(path, e))
}

fn jsonl(path: &Path) -> Result<std::io::BufWriter<std::fs::File>> {
    Ok(std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| Error::io(path, e))?))
}

/// Characters of `query` found in `text`: picks the chunk of a judged document that a query is about.
fn overlap(query: &str, text: &str) -> usize {
    let chars: HashSet<char> = text.chars().collect();
    query.chars().filter(|c| !c.is_whitespace() && chars.contains(c)).count()
}

fn std_dev(xs: &[f32]) -> f32 {
    if xs.len() < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f32>() / xs.len() as f32;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / (xs.len() - 1) as f32).sqrt()
}

/// Dense candidates of a query: (chunk id, score), best first.
type Candidates = Vec<(i64, f32)>;
/// A group's positive score and its dense candidates.
/// A group's positive score, its dense candidates and the guide's vector of its query (empty when nothing was mined).
type Mined = (f32, Candidates, std::sync::Arc<Vec<f32>>);

/// A tiny seeded generator: sampling must repeat exactly for a resumed run.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl crate::engine::Training<'_> {
    /// Writes what the next run would train on into `dir` (`corpus.jsonl`, `stage2.jsonl`) and returns the counts:
    /// `care train data`, for an admin who wants to see it before a run. Without a live pair nothing is mined
    /// (groups are topped up at random).
    pub fn data(&self, _admin: &Admin, dir: &Path, recipe: &super::Recipe) -> Result<DataCounts> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let pair = self.engine.retrieval().active_models()?;
        crate::training::data::TrainingData::of(self.engine).assemble_training_data(
            dir,
            pair.as_ref(),
            &recipe.data,
            recipe.stage2_max_groups,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_prefers_the_chunk_about_the_query() {
        assert!(overlap("二甲双胍禁忌", "二甲双胍的禁忌症包括") > overlap("二甲双胍禁忌", "阿司匹林的用法"));
    }

    #[test]
    fn heading_sample_is_seeded_and_bounded() {
        let rows: Vec<ChunkRow> = (0..50)
            .map(|i| ChunkRow {
                chunk_id: i,
                document_id: i / 5,
                collection: "c".into(),
                title: "t".into(),
                heading: if i % 2 == 0 { format!("t > 节 {i}") } else { String::new() },
                text: format!("正文 {i}"),
            })
            .collect();
        let a: Vec<i64> = heading_groups(&rows, 10, 7).iter().map(|g| g.positive).collect();
        let b: Vec<i64> = heading_groups(&rows, 10, 7).iter().map(|g| g.positive).collect();
        assert_eq!(a.len(), 10);
        assert_eq!(a, b);
        assert_eq!(heading_groups(&rows, 100, 7).len(), 25);
    }

    #[test]
    fn a_query_keeps_at_most_its_cap_of_positives_the_same_ones_each_run() {
        let p: Vec<i64> = (10..20).collect();
        let one = capped(&p, 1, 42, "胸膜炎有啥症状");
        assert_eq!(one.len(), 1);
        assert_eq!(one, capped(&p, 1, 42, "胸膜炎有啥症状"), "not repeatable");
        let picks: HashSet<i64> = (0..40).map(|i| capped(&p, 1, 42, &format!("问题{i}"))[0]).collect();
        assert!(picks.len() > 3, "every query picks the same position: {picks:?}");
        let three = capped(&p, 3, 7, "q");
        assert!(three.len() == 3 && three.windows(2).all(|w| w[0] < w[1]), "{three:?}");
        assert_eq!(capped(&p, 0, 42, "q"), p);
        assert_eq!(capped(&p[..1], 1, 42, "q"), &p[..1]);
    }

    #[test]
    fn group_sample_keeps_feedback_and_order_and_repeats() {
        let groups = || -> Vec<Group> {
            (0..40)
                .map(|i| Group {
                    query: format!("q{i}"),
                    collection: String::new(),
                    feedback: i == 3 || i == 37,
                    kind: String::new(),
                    positive: i,
                    skip_docs: HashSet::new(),
                    judged_neg: Vec::new(),
                })
                .collect()
        };
        let a: Vec<i64> = sample_groups(groups(), 5, 1).iter().map(|g| g.positive).collect();
        assert_eq!(a.len(), 5);
        assert!(a.contains(&3) && a.contains(&37), "feedback was sampled out: {a:?}");
        assert!(a.windows(2).all(|w| w[0] < w[1]), "order changed: {a:?}");
        assert_eq!(a, sample_groups(groups(), 5, 1).iter().map(|g| g.positive).collect::<Vec<_>>());
        assert_ne!(a, sample_groups(groups(), 5, 2).iter().map(|g| g.positive).collect::<Vec<_>>());
        assert_eq!(sample_groups(groups(), 100, 1).len(), 40);
    }
}
