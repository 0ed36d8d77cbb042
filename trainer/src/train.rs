//! The training loop shared by all stages.
//!
//! One step = a batch of examples → query vectors (query encoder) and document groups (positive + hard
//! negatives) from the document side, which is either frozen (vectors computed once and cached), trainable
//! (e.g. through LoRA), or the query encoder itself (symmetric initialisation) → loss → AdamW.
//!
//! Exact resume: the examples of step k and every dropout mask are pure functions of (seed, k): the batch comes
//! from [`crate::data::batch_indices`] and libtorch's generator is re-seeded from (seed, k, sub-batch) before
//! each forward pass. A checkpoint therefore needs only the parameters, the AdamW moments and k.
//!
//! Sub-batching (gradient cache, Gao et al. 2021): with `sub_batch` set, vectors are first computed without a
//! graph, the loss's gradient with respect to them is taken once over the whole batch, and each sub-batch is then
//! re-encoded with a graph and back-propagated with that gradient. The result equals the full-batch gradient
//! (same dropout masks, same in-batch negatives) while only one sub-batch's activations are alive at a time.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use care_formats::trainer::{Event, Hyper, StepKind};
use care_formats::training::TrainingExample;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::data::{SplitMix, batch_indices, source_batch_indices};
use crate::encoder::Encoder;
use crate::loss;
use crate::optim::{AdamW, AdamWConfig, Schedule};
use crate::{Error, Result};

/// Where document vectors come from.
#[derive(Debug)]
pub enum DocSide<'a> {
    /// Frozen encoder: vectors of every pool text computed once; `index` maps text → row of `vectors`.
    Frozen { vectors: Tensor, index: HashMap<String, i64> },
    /// A trainable encoder (Stage II, usually LoRA on a large decoder).
    Trainable(&'a Encoder),
    /// The query encoder itself (symmetric fine-tune, "independent initialisation").
    Same,
}

/// The loss of a stage (the step loop's other settings are its [`Hyper`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LossConfig {
    pub temperature: f64,
    /// Documents per query: 1 positive + `group_size − 1` negatives.
    pub group_size: usize,
    /// Weight of the MSE alignment term (Stage I: 1.0; 0 disables it).
    pub mse_weight: f64,
}

/// What the step loop runs: the stage's hyper-parameters (the contract's [`Hyper`], flattened, so `run.json` and
/// a checkpoint's `state.json` keep their fields at the top) and its loss.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainConfig {
    #[serde(flatten)]
    pub hyper: Hyper,
    pub loss: LossConfig,
    /// Each batch from one source ([`crate::data::source_batch_indices`]); Stage II only.
    #[serde(default)]
    pub batch_by_source: bool,
}

impl TrainConfig {
    pub fn new(hyper: Hyper, loss: LossConfig) -> Self {
        TrainConfig { hyper, loss, batch_by_source: false }
    }
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepMetrics {
    pub step: u64,
    pub loss: f64,
    pub contrastive: f64,
    pub mse: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub seconds: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct CheckpointState {
    step: u64,
    seed: u64,
    config: TrainConfig,
}

/// The per-step seed for sub-batch `part` (0 = query side, 1.. document side).
fn step_seed(seed: u64, step: u64, part: u64) -> i64 {
    let mut r = SplitMix::new(seed ^ step.wrapping_mul(0x9E37_79B9) ^ part.wrapping_mul(0x85EB_CA6B_C2B2_AE35));
    (r.next_u64() >> 1) as i64
}

/// Selects parameters to train from `enc`, prefixed with `prefix`, and sets `requires_grad` on all of them
/// accordingly (frozen ones get false, so no graph is built through them).
pub fn select_trainable(enc: &Encoder, prefix: &str, train: &dyn Fn(&str) -> bool) -> BTreeMap<String, Tensor> {
    let mut out = BTreeMap::new();
    for (name, t) in enc.named_parameters() {
        let on = train(&name);
        let mut t = t;
        let _ = t.requires_grad_(on);
        if on {
            out.insert(format!("{prefix}{name}"), t);
        }
    }
    out
}

/// Document vectors the appliance already serves, by the text the document encoder reads (template applied).
///
/// Why: with the document encoder frozen, the teacher's vectors of the approved passages are exactly the ones in
/// the served dense index; re-computing them with tch cost the real run 27 minutes for 4,000 texts on 2 cores.
#[derive(Debug)]
pub struct ServedVectors {
    pub vectors: Tensor,
    pub rows: HashMap<String, i64>,
}

/// Reads `vectors` (safetensors: `vectors` [N, d] and `present` [N], row i = line i of `corpus`): each line whose
/// row is present maps `template(text)` to its vector.
pub fn served_vectors(corpus: &Path, vectors: &Path, template: &str) -> Result<ServedVectors> {
    let docs = crate::data::read_corpus(corpus)?;
    let mut t = crate::weights::load_tensors(vectors)?;
    let (Some(v), Some(present)) = (t.remove("vectors"), t.remove("present")) else {
        return Err(Error::Data(format!("{}: needs tensors `vectors` and `present`", vectors.display())));
    };
    let present: Vec<f32> = Vec::<f32>::try_from(&present.to_kind(Kind::Float))
        .map_err(|e| Error::Data(format!("{}: `present`: {e}", vectors.display())))?;
    if v.dim() != 2 || v.size()[0] as usize != present.len() || present.len() > docs.len() {
        return Err(Error::Data(format!(
            "{}: {:?} vectors and {} `present` flags for the {} lines of {}",
            vectors.display(),
            v.size(),
            present.len(),
            docs.len(),
            corpus.display()
        )));
    }
    let rows = docs
        .iter()
        .zip(&present)
        .enumerate()
        .filter(|(_, (_, p))| **p > 0.5)
        .map(|(i, (d, _))| (template.replace("{text}", &d.text), i as i64))
        .collect();
    Ok(ServedVectors { vectors: crate::pooling::normalize(&v.to_kind(Kind::Float)), rows })
}

/// Builds the frozen document side: normalised vectors for every distinct positive/negative text.
pub fn frozen_doc_side(
    enc: &Encoder,
    texts: Vec<String>,
    batch: usize,
    cache: Option<&Path>,
) -> Result<DocSide<'static>> {
    frozen_doc_side_with(enc, texts, batch, cache, None)
}

/// [`frozen_doc_side`] that takes the vectors of texts in `served` from there and embeds only the others. The
/// served vectors must come from `enc`: up to 8 of the shortest (never truncated differently) are re-embedded and
/// each must agree to cosine 0.98, else the run stops (vectors of another document encoder would teach the query
/// encoder the wrong space).
pub fn frozen_doc_side_with(
    enc: &Encoder,
    texts: Vec<String>,
    batch: usize,
    cache: Option<&Path>,
    served: Option<&ServedVectors>,
) -> Result<DocSide<'static>> {
    let Some(served) = served else { return frozen_doc_side_cached(enc, texts, batch, cache) };
    let width = enc.hidden_size();
    if served.vectors.size()[1] != width {
        return Err(Error::Data(format!(
            "served document vectors are {} wide, the document encoder gives {width}: they come from another model",
            served.vectors.size()[1]
        )));
    }
    let (known, missing): (Vec<usize>, Vec<usize>) =
        (0..texts.len()).partition(|&i| served.rows.contains_key(&texts[i]));
    let mut probe: Vec<usize> = known.clone();
    probe.sort_by_key(|&i| (texts[i].chars().count(), i));
    probe.truncate(8);
    if !probe.is_empty() {
        let pt: Vec<String> = probe.iter().map(|&i| texts[i].clone()).collect();
        let mine = enc.embed_all(&pt, batch, &mut |_| {})?;
        let theirs = Tensor::stack(&pt.iter().map(|t| served.vectors.get(served.rows[t])).collect::<Vec<_>>(), 0);
        let cos: Vec<f32> = Vec::<f32>::try_from((&mine * &theirs).sum_dim_intlist(1, false, Kind::Float))?;
        let worst = cos.iter().copied().fold(f32::INFINITY, f32::min);
        if worst < 0.98 {
            return Err(Error::Data(format!(
                "served document vectors disagree with the document encoder (cosine {worst:.4} on a short text): they \
                 come from another model or prompt; run without --served-vectors"
            )));
        }
        eprintln!("served vectors: {} of {} pool texts (probe cosine ≥ {worst:.4})", known.len(), texts.len());
    }
    let mt: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
    let mut pb = progress_bar(mt.len() as u64, "embedding texts the index does not hold (frozen)");
    let mv = enc.embed_all(&mt, batch, &mut |d| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    let mut rows: Vec<Option<Tensor>> = (0..texts.len()).map(|_| None).collect();
    for &i in &known {
        rows[i] = Some(served.vectors.get(served.rows[&texts[i]]));
    }
    for (k, &i) in missing.iter().enumerate() {
        rows[i] = Some(mv.get(k as i64));
    }
    let rows: Vec<Tensor> = rows.into_iter().flatten().collect();
    let vectors =
        if rows.is_empty() { Tensor::zeros([0, width], (Kind::Float, Device::Cpu)) } else { Tensor::stack(&rows, 0) };
    let index = texts.into_iter().enumerate().map(|(i, t)| (t, i as i64)).collect();
    Ok(DocSide::Frozen { vectors: vectors.to_device(enc.device), index })
}

/// Replaces the frozen side's rows keyed by `rows.0` with `teacher`'s vectors of `rows.1` (Stage I distillation of
/// a trained query encoder: queries aligned to it, passages still to the document encoder).
pub fn realign_rows(side: &mut DocSide<'_>, teacher: &Encoder, rows: &[(String, String)], batch: usize) -> Result<()> {
    let DocSide::Frozen { vectors, index } = side else {
        return Err(Error::Data("a query teacher needs a frozen document side".into()));
    };
    if teacher.hidden_size() != vectors.size()[1] {
        return Err(Error::Data(format!(
            "the query teacher gives {} wide vectors, the document side {}: it is not in the document encoder's space",
            teacher.hidden_size(),
            vectors.size()[1]
        )));
    }
    let at: Vec<i64> = rows.iter().filter_map(|(k, _)| index.get(k).copied()).collect();
    if at.len() != rows.len() {
        return Err(Error::Data("query teacher texts missing from the document side".into()));
    }
    let texts: Vec<String> = rows.iter().map(|(_, t)| t.clone()).collect();
    let mut pb = progress_bar(texts.len() as u64, "embedding queries with the query teacher");
    let v = teacher.embed_all(&texts, batch, &mut |d| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    let idx = Tensor::from_slice(&at).to_device(vectors.device());
    *vectors = vectors.index_copy(0, &idx, &v.to_device(vectors.device()).to_kind(vectors.kind()));
    eprintln!("query teacher: {} query texts realigned", texts.len());
    Ok(())
}

fn frozen_doc_side_cached(
    enc: &Encoder,
    texts: Vec<String>,
    batch: usize,
    cache: Option<&Path>,
) -> Result<DocSide<'static>> {
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        texts.hash(&mut h);
        enc.fingerprint().hash(&mut h);
        format!("{:016x}", h.finish())
    };
    let cached = cache.and_then(|p| {
        let meta = std::fs::read_to_string(p.with_extension("key")).ok()?;
        if meta.trim() != key {
            return None;
        }
        crate::weights::load_tensors(p).ok()?.remove("vectors")
    });
    let vectors = match cached {
        Some(v) => v,
        None => {
            let mut pb = progress_bar(texts.len() as u64, "embedding document pool (frozen)");
            let v = enc.embed_all(&texts, batch, &mut |d| pb.set_position(d as u64))?;
            pb.finish_and_clear();
            if let Some(p) = cache {
                crate::weights::save_tensors(std::iter::once(("vectors".to_string(), v.shallow_clone())), p)?;
                std::fs::write(p.with_extension("key"), &key).map_err(|e| Error::io(p, e))?;
            }
            v
        }
    };
    let index = texts.into_iter().enumerate().map(|(i, t)| (t, i as i64)).collect();
    Ok(DocSide::Frozen { vectors: vectors.to_device(enc.device), index })
}

/// A progress bar on a terminal; without one (logs, CI) a plain line every 5 % of the way, so long CPU jobs
/// stay observable.
pub fn progress_bar(len: u64, msg: &str) -> Progress {
    use std::io::IsTerminal;
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {bar:30} {pos}/{len} [{elapsed_precise}, eta {eta}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_message(msg.to_string());
    let tty = std::io::stderr().is_terminal() && std::env::var_os("CARE_NO_PROGRESS").is_none();
    if !tty {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    Progress { pb, tty, label: msg.to_string(), len, next_line: 0, started: Instant::now() }
}

#[derive(Debug)]
pub struct Progress {
    pb: indicatif::ProgressBar,
    tty: bool,
    label: String,
    len: u64,
    next_line: u64,
    started: Instant,
}

impl Progress {
    pub fn set_position(&mut self, pos: u64) {
        self.pb.set_position(pos);
        if !self.tty && pos >= self.next_line {
            eprintln!("[{:>7.1}s] {} {pos}/{}", self.started.elapsed().as_secs_f64(), self.label, self.len);
            self.next_line = pos + (self.len / 20).max(1);
        }
    }
    pub fn set_message(&self, msg: String) {
        self.pb.set_message(msg);
    }
    pub fn finish_and_clear(&self) {
        self.pb.finish_and_clear();
        if !self.tty {
            eprintln!("[{:>7.1}s] {} done", self.started.elapsed().as_secs_f64(), self.label);
        }
    }
}

/// The trainer: encoders, data, optimiser, output folder.
pub struct Trainer<'a> {
    pub query: &'a Encoder,
    pub doc: DocSide<'a>,
    pub examples: &'a [TrainingExample],
    pub cfg: TrainConfig,
    pub opt: AdamW,
    pub out: PathBuf,
    /// Extra documents for filling groups whose examples have too few negatives.
    pub filler: Vec<String>,
    /// Source of each example, when batches are drawn by source.
    pub sources: Option<Vec<usize>>,
    /// Told of every step and checkpoint as it happens (`care-train run` writes them as events for the appliance).
    pub events: Option<Box<dyn FnMut(Event) + 'a>>,
}

impl std::fmt::Debug for Trainer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer").field("out", &self.out).field("step", &self.opt.step).finish()
    }
}

impl<'a> Trainer<'a> {
    pub fn new(
        query: &'a Encoder,
        doc: DocSide<'a>,
        examples: &'a [TrainingExample],
        cfg: TrainConfig,
        params: BTreeMap<String, Tensor>,
        out: &Path,
    ) -> Result<Self> {
        if examples.is_empty() {
            return Err(Error::Data("no training examples".into()));
        }
        if cfg.hyper.batch_size == 0 || cfg.loss.group_size == 0 {
            return Err(Error::Data("batch size and group size must be at least 1".into()));
        }
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        let opt = AdamW::new(
            AdamWConfig { lr: cfg.hyper.lr, weight_decay: cfg.hyper.weight_decay, ..Default::default() },
            params,
        );
        let filler = crate::data::document_pool(examples);
        let sources = cfg.batch_by_source.then(|| crate::data::source_ids(examples));
        Ok(Self { query, doc, examples, cfg, opt, out: out.to_path_buf(), filler, sources, events: None })
    }

    fn schedule(&self) -> Schedule {
        Schedule {
            warmup: (self.cfg.hyper.steps as f64 * self.cfg.hyper.warmup_ratio).round() as u64,
            total: self.cfg.hyper.steps,
        }
    }

    /// Query texts and document groups (positive first) of step `step`.
    pub fn batch(&self, step: u64) -> (Vec<String>, Vec<String>) {
        let idx = match &self.sources {
            Some(s) => source_batch_indices(s, self.cfg.hyper.batch_size, self.cfg.hyper.seed, step),
            None => batch_indices(self.examples.len(), self.cfg.hyper.batch_size, self.cfg.hyper.seed, step),
        };
        let g = self.cfg.loss.group_size;
        let mut rng = SplitMix::new(self.cfg.hyper.seed ^ step.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let mut qs = Vec::with_capacity(idx.len());
        let mut ds = Vec::with_capacity(idx.len() * g);
        for &i in &idx {
            let ex = &self.examples[i];
            qs.push(ex.query.clone());
            ds.push(ex.pos[rng.below(ex.pos.len())].clone());
            let mut negs: Vec<&String> = ex.neg.iter().collect();
            // Shuffle the judged/mined negatives, then top up with random pool texts when there are too few.
            for k in (1..negs.len()).rev() {
                negs.swap(k, rng.below(k + 1));
            }
            for k in 0..g - 1 {
                match negs.get(k) {
                    Some(n) => ds.push((*n).clone()),
                    None => ds.push(self.filler[rng.below(self.filler.len())].clone()),
                }
            }
        }
        (qs, ds)
    }

    /// Encodes `texts` with a graph, in sub-batches re-seeded per part.
    fn encode_seeded(&self, enc: &Encoder, texts: &[String], step: u64, side: u64, grad: bool) -> Result<Vec<Tensor>> {
        let sub = if self.cfg.hyper.sub_batch == 0 { texts.len() } else { self.cfg.hyper.sub_batch };
        let mut out = Vec::new();
        for (c, chunk) in texts.chunks(sub.max(1)).enumerate() {
            tch::manual_seed(step_seed(self.cfg.hyper.seed, step, side * 10_000 + c as u64));
            let t: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let v = if grad { enc.embed(&t, true)? } else { tch::no_grad(|| enc.embed(&t, true))? };
            out.push(v);
        }
        Ok(out)
    }

    /// The loss in fp32 whatever the encoders ran in: under CUDA autocast the similarity matmul would otherwise run
    /// in half precision, and logits scaled by 1/t = 50 lose most of their mantissa before the log-softmax.
    fn loss_of(&self, q: &Tensor, d: &Tensor) -> (Tensor, Tensor, Tensor) {
        crate::precision::without_autocast(|| self.loss_fp32(&q.to_kind(Kind::Float), &d.to_kind(Kind::Float)))
    }

    fn loss_fp32(&self, q: &Tensor, d: &Tensor) -> (Tensor, Tensor, Tensor) {
        let lc = &self.cfg.loss;
        let g = lc.group_size as i64;
        let widths = &self.cfg.hyper.matryoshka;
        let contrastive = if widths.is_empty() {
            loss::asymmetric_info_nce(q, d, lc.temperature, g)
        } else {
            loss::matryoshka(q, d, widths, |a, b| loss::asymmetric_info_nce(a, b, lc.temperature, g))
        };
        let mse = if lc.mse_weight > 0.0 {
            // The MSE term pairs each query with its own positive (row i·G).
            let pos = d.index_select(0, &(Tensor::arange(q.size()[0], (Kind::Int64, q.device())) * g));
            loss::mse_alignment(q, &pos)
        } else {
            Tensor::zeros([], (Kind::Float, q.device()))
        };
        let total = &contrastive + &mse * lc.mse_weight;
        (total, contrastive, mse)
    }

    /// Forward + backward of step `step`; returns (loss, contrastive, mse). Gradients accumulate in the params.
    pub fn forward_backward(&self, step: u64) -> Result<(f64, f64, f64)> {
        let (qs, ds) = self.batch(step);
        let doc_enc: Option<&Encoder> = match &self.doc {
            DocSide::Trainable(e) => Some(e),
            DocSide::Same => Some(self.query),
            DocSide::Frozen { .. } => None,
        };
        let frozen_docs = |ds: &[String]| -> Result<Tensor> {
            let DocSide::Frozen { vectors, index } = &self.doc else { unreachable!() };
            let rows: Vec<i64> = ds
                .iter()
                .map(|t| {
                    index
                        .get(t)
                        .copied()
                        .ok_or_else(|| Error::Data(format!("document not in the frozen pool: {t:.40}")))
                })
                .collect::<Result<_>>()?;
            Ok(vectors.index_select(0, &Tensor::from_slice(&rows).to_device(vectors.device())))
        };
        let whole = self.cfg.hyper.sub_batch == 0 || self.cfg.hyper.sub_batch >= qs.len().max(ds.len());
        if whole {
            let q = Tensor::cat(&self.encode_seeded(self.query, &qs, step, 0, true)?, 0);
            let d = match doc_enc {
                Some(e) => Tensor::cat(&self.encode_seeded(e, &ds, step, 1, true)?, 0),
                None => frozen_docs(&ds)?,
            };
            let (total, c, m) = self.loss_of(&q, &d);
            total.backward();
            return Ok((total.double_value(&[]), c.double_value(&[]), m.double_value(&[])));
        }
        // Gradient cache: representations without a graph, loss gradient w.r.t. them, then re-encode per chunk.
        let q_parts = self.encode_seeded(self.query, &qs, step, 0, false)?;
        let rq = Tensor::cat(&q_parts, 0).detach().set_requires_grad(true);
        let (rd, d_parts) = match doc_enc {
            Some(e) => {
                let parts = self.encode_seeded(e, &ds, step, 1, false)?;
                (Tensor::cat(&parts, 0).detach().set_requires_grad(true), Some(parts))
            }
            None => (frozen_docs(&ds)?, None),
        };
        let (total, c, m) = self.loss_of(&rq, &rd);
        total.backward();
        let gq = rq.grad();
        let sub = self.cfg.hyper.sub_batch;
        for (k, chunk) in qs.chunks(sub).enumerate() {
            tch::manual_seed(step_seed(self.cfg.hyper.seed, step, k as u64));
            let t: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let v = self.query.embed(&t, true)?;
            let g = gq.narrow(0, (k * sub) as i64, chunk.len() as i64);
            (v * g).sum(Kind::Float).backward();
        }
        if let (Some(e), Some(_)) = (doc_enc, d_parts) {
            let gd = rd.grad();
            for (k, chunk) in ds.chunks(sub).enumerate() {
                tch::manual_seed(step_seed(self.cfg.hyper.seed, step, 10_000 + k as u64));
                let t: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let v = e.embed(&t, true)?;
                let g = gd.narrow(0, (k * sub) as i64, chunk.len() as i64);
                (v * g).sum(Kind::Float).backward();
            }
        }
        Ok((total.double_value(&[]), c.double_value(&[]), m.double_value(&[])))
    }

    /// Runs from the current step to `cfg.hyper.steps`, checkpointing every `checkpoint_every` steps and stopping
    /// early after `stop_after` steps (tests use it to simulate an interruption).
    pub fn run(&mut self, stop_after: Option<u64>) -> Result<Vec<StepMetrics>> {
        let sched = self.schedule();
        let mut pb = progress_bar(self.cfg.hyper.steps, "training");
        pb.set_position(self.opt.step);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.out.join("metrics.jsonl"))
            .map_err(|e| Error::io(&self.out, e))?;
        let mut all = Vec::new();
        let mut done = 0;
        while self.opt.step < self.cfg.hyper.steps {
            if stop_after.is_some_and(|n| done >= n) {
                break;
            }
            let started = Instant::now();
            let step = self.opt.step;
            self.opt.zero_grad();
            let (l, c, m) = self.forward_backward(step)?;
            if !l.is_finite() {
                return Err(Error::Data(format!("loss is {l} at step {}; lower the learning rate", step + 1)));
            }
            let grad_norm = self.opt.clip_grad_norm(self.cfg.hyper.max_grad_norm);
            let lr = self.cfg.hyper.lr * sched.factor(step + 1);
            self.opt.step(lr);
            let met = StepMetrics {
                step: self.opt.step,
                loss: l,
                contrastive: c,
                mse: m,
                lr,
                grad_norm,
                seconds: started.elapsed().as_secs_f64(),
            };
            writeln!(log, "{}", serde_json::to_string(&met).unwrap_or_default())
                .map_err(|e| Error::io(&self.out, e))?;
            pb.set_position(self.opt.step);
            pb.set_message(format!("loss {l:.4}"));
            self.emit(Event::Step {
                phase: StepKind::Train,
                step: met.step,
                total: self.cfg.hyper.steps,
                loss: l,
                lr,
                seconds: met.seconds,
            });
            all.push(met);
            done += 1;
            if self.cfg.hyper.checkpoint_every > 0 && self.opt.step.is_multiple_of(self.cfg.hyper.checkpoint_every) {
                let path = self.save_checkpoint()?;
                self.emit(Event::Checkpoint { step: self.opt.step, path });
            }
        }
        pb.finish_and_clear();
        Ok(all)
    }

    pub fn emit(&mut self, event: Event) {
        if let Some(f) = &mut self.events {
            f(event);
        }
    }

    fn checkpoint_dir(&self, step: u64) -> PathBuf {
        self.out.join("checkpoints").join(format!("step-{step:08}"))
    }

    /// Writes `checkpoints/step-N/` (parameters, AdamW moments, state) via a temporary folder + rename.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let dir = self.checkpoint_dir(self.opt.step);
        let tmp = dir.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        crate::weights::save_tensors(
            self.opt.params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())),
            &tmp.join("params.safetensors"),
        )?;
        let moments = self
            .opt
            .m
            .iter()
            .map(|(n, t)| (format!("m.{n}"), t.shallow_clone()))
            .chain(self.opt.v.iter().map(|(n, t)| (format!("v.{n}"), t.shallow_clone())));
        crate::weights::save_tensors(moments, &tmp.join("optim.safetensors"))?;
        let state = CheckpointState { step: self.opt.step, seed: self.cfg.hyper.seed, config: self.cfg.clone() };
        crate::encoder::write_json(&tmp.join("state.json"), &serde_json::to_value(&state).unwrap_or_default())?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| Error::io(&dir, e))?;
        // Keep the newest `keep_checkpoints`.
        let mut all = list_checkpoints(&self.out);
        while all.len() > self.cfg.hyper.keep_checkpoints.max(1) {
            let old = all.remove(0);
            let _ = std::fs::remove_dir_all(old.1);
        }
        Ok(dir)
    }

    /// Restores the newest checkpoint (if any); returns its step. The metrics log is cut back to that step.
    pub fn resume(&mut self) -> Result<Option<u64>> {
        let Some((step, dir)) = list_checkpoints(&self.out).pop() else { return Ok(None) };
        let state: CheckpointState =
            serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).map_err(|e| Error::io(&dir, e))?)
                .map_err(|e| Error::Checkpoint(format!("{}: {e}", dir.display())))?;
        if state.seed != self.cfg.hyper.seed || state.config.hyper.batch_size != self.cfg.hyper.batch_size {
            return Err(Error::Checkpoint(format!(
                "{} was written with seed {} / batch {}, this run uses seed {} / batch {}; resume with the same settings",
                dir.display(),
                state.seed,
                state.config.hyper.batch_size,
                self.cfg.hyper.seed,
                self.cfg.hyper.batch_size
            )));
        }
        let params = crate::weights::load_tensors(&dir.join("params.safetensors"))?;
        let moments = crate::weights::load_tensors(&dir.join("optim.safetensors"))?;
        tch::no_grad(|| -> Result<()> {
            for (name, p) in &self.opt.params {
                let src = params
                    .get(name)
                    .ok_or_else(|| Error::Checkpoint(format!("{} lacks parameter {name}", dir.display())))?;
                let mut p = p.shallow_clone();
                p.copy_(src);
                for (key, map) in [("m", &mut self.opt.m), ("v", &mut self.opt.v)] {
                    let src = moments
                        .get(&format!("{key}.{name}"))
                        .ok_or_else(|| Error::Checkpoint(format!("{} lacks {key}.{name}", dir.display())))?;
                    let dst = map.get_mut(name).expect("state for every param");
                    dst.copy_(src);
                }
            }
            Ok(())
        })?;
        self.opt.step = step;
        let path = self.out.join("metrics.jsonl");
        if let Ok(text) = std::fs::read_to_string(&path) {
            let kept: Vec<&str> =
                text.lines().filter(|l| serde_json::from_str::<StepMetrics>(l).is_ok_and(|m| m.step <= step)).collect();
            let mut s = kept.join("\n");
            if !s.is_empty() {
                s.push('\n');
            }
            std::fs::write(&path, s).map_err(|e| Error::io(&path, e))?;
        }
        Ok(Some(step))
    }
}

/// `(step, dir)` of finished checkpoints, oldest first.
pub fn list_checkpoints(out: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(out.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            e.path().join("state.json").exists().then_some((step, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// Reads `metrics.jsonl`.
pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| Error::Data(format!("{}: {e}", path.display()))))
        .collect()
}

/// The device to train on: CUDA when libtorch sees one, CPU otherwise.
pub fn default_device() -> Device {
    if crate::doctor::gpu_present() {
        let _ = crate::cuda::load();
    }
    Device::cuda_if_available()
}
