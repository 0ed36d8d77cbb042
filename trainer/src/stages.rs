//! The phases the appliance runs, as library functions of their specs ([`care_formats::trainer`]): the command
//! line's stage commands build a spec from their flags and call these, `care-train run --spec FILE` reads one
//! from a file, and the tests call them directly. Each returns what it wrote as an [`Outcome`] and tells `emit`
//! of its steps and checkpoints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use care_formats::trainer::{
    EmbedCorpusSpec, Event, ExportSpec, FailCode, Hyper, LayerPick, Lora, MergeSpec, Phase, PruneSpec, ServedVectors,
    Stage1Spec, Stage2Spec,
};
use care_formats::training::TrainingExample;
use tch::{Device, Kind};

use crate::data::{self, MiningOptions};
use crate::encoder::{Encoder, write_json};
use crate::precision::PrecisionExt;
use crate::train::{DocSide, LossConfig, TrainConfig, Trainer, frozen_doc_side_with, select_trainable};

/// What a phase wrote: the line a person reads and the machine-readable summary (Stage I/II: their run.json).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub message: String,
    pub summary: serde_json::Value,
}

impl Outcome {
    fn said(message: String) -> Self {
        Outcome { message, summary: serde_json::Value::Null }
    }
}

/// Runs `phase` on `dev`.
pub fn run(phase: &Phase, dev: Device, emit: &mut dyn FnMut(Event)) -> Result<Outcome> {
    match phase {
        Phase::Prune(s) => prune(s),
        Phase::Stage1(s) => stage1(s, dev, emit),
        Phase::Stage2(s) => stage2(s, dev, emit),
        Phase::Merge(s) => merge(s),
        Phase::Export(s) => export(s),
        Phase::EmbedCorpus(s) => embed_corpus(s, dev),
    }
}

/// The failure code of an error a phase returned (the trainer's own error kinds; anything else is internal).
pub fn fail_code(e: &anyhow::Error) -> FailCode {
    for cause in e.chain() {
        if let Some(err) = cause.downcast_ref::<crate::Error>() {
            return match err {
                crate::Error::Io { .. } => FailCode::Io,
                crate::Error::Config(_) | crate::Error::Weights(_) => FailCode::Model,
                crate::Error::Data(_) => FailCode::Data,
                crate::Error::Checkpoint(_) => FailCode::Checkpoint,
                crate::Error::Export(_) => FailCode::Export,
                crate::Error::Torch(_) => FailCode::Internal,
            };
        }
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return FailCode::Io;
        }
    }
    FailCode::Internal
}

pub fn load_encoder(dir: &Path, dev: Device, k: Kind, max_length: Option<usize>) -> Result<Encoder> {
    let mut e = Encoder::load(dir, dev, k).with_context(|| format!("loading {}", dir.display()))?;
    if let Some(m) = max_length {
        e.settings.max_length = m;
        e.tokenizer
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: m - usize::from(e.settings.append_eos.is_some()),
                ..Default::default()
            }))
            .map_err(anyhow::Error::msg)?;
    }
    Ok(e)
}

/// A seeded sample of at most `n` items (order kept).
pub fn sample<T: Clone>(items: &[T], n: usize, seed: u64) -> Vec<T> {
    if items.len() <= n {
        return items.to_vec();
    }
    let mut idx = data::permutation(items.len(), seed, 0);
    idx.truncate(n);
    idx.sort_unstable();
    idx.into_iter().map(|i| items[i].clone()).collect()
}

pub fn render(template: &str, t: &str) -> String {
    template.replace("{text}", t)
}

/// The example as the encoders read it: the query through the query template, passages through the document's.
pub fn render_example(e: TrainingExample, h: &Hyper) -> TrainingExample {
    TrainingExample {
        query: render(&h.query_template, &e.query),
        pos: e.pos.iter().map(|p| render(&h.document_template, p)).collect(),
        neg: e.neg.iter().map(|p| render(&h.document_template, p)).collect(),
        prompt: e.prompt,
        kind: e.kind,
    }
}

/// Adds LoRA adapters to `enc` (seeded, so a resumed run rebuilds the same ones before its checkpoint loads).
pub fn add_lora(enc: &mut Encoder, lora: &Lora, seed: u64) {
    let targets: Vec<String> = if !lora.targets.is_empty() {
        lora.targets.clone()
    } else if matches!(enc.model, crate::encoder::Model::Qwen3(_)) {
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].map(String::from).to_vec()
    } else {
        ["query", "key", "value", "dense"].map(String::from).to_vec()
    };
    tch::manual_seed(seed as i64);
    enc.model.add_lora(&targets, lora.rank, lora.alpha, 0.0);
}

fn load_served(s: Option<&ServedVectors>, document_template: &str) -> Result<Option<crate::train::ServedVectors>> {
    let Some(s) = s else { return Ok(None) };
    Ok(Some(crate::train::served_vectors(&s.corpus, &s.vectors, document_template)?))
}

/// Trains (resuming when asked), writes the chart and `run.json`; returns the summary.
pub fn finish_training(
    trainer: &mut Trainer<'_>,
    h: &Hyper,
    out: &Path,
    title: &str,
    mut summary: serde_json::Value,
) -> Result<serde_json::Value> {
    if h.resume {
        match trainer.resume()? {
            Some(s) => eprintln!("resumed from step {s}"),
            None => eprintln!("no checkpoint in {}; starting fresh", out.display()),
        }
    } else if out.join("metrics.jsonl").exists() {
        std::fs::remove_file(out.join("metrics.jsonl"))?;
    }
    let started = Instant::now();
    let dev = trainer.query.device;
    let log =
        crate::precision::train_autocast(dev, h.precision, || trainer.run(None)).map_err(anyhow::Error::msg)??;
    let secs = started.elapsed().as_secs_f64();
    if trainer.cfg.hyper.checkpoint_every > 0
        && !trainer.cfg.hyper.steps.is_multiple_of(trainer.cfg.hyper.checkpoint_every)
    {
        let path = trainer.save_checkpoint()?;
        trainer.emit(Event::Checkpoint { step: trainer.opt.step, path });
    }
    let all = crate::train::read_metrics(&out.join("metrics.jsonl"))?;
    std::fs::write(out.join("loss.svg"), crate::svg::loss_chart(title, &all, 20))?;
    let mean_step = if log.is_empty() { 0.0 } else { log.iter().map(|m| m.seconds).sum::<f64>() / log.len() as f64 };
    summary["steps_run"] = log.len().into();
    summary["seconds"] = secs.into();
    summary["mean_step_seconds"] = mean_step.into();
    summary["first_loss"] = all.first().map_or(0.0, |m| m.loss).into();
    summary["last_loss_mean_20"] =
        (all.iter().rev().take(20).map(|m| m.loss).sum::<f64>() / all.len().clamp(1, 20) as f64).into();
    summary["config"] = serde_json::to_value(&trainer.cfg)?;
    summary["device"] = format!("{:?}", trainer.query.device).into();
    summary["threads"] = tch::get_num_threads().into();
    write_json(&out.join("run.json"), &summary)?;
    eprintln!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(summary)
}

pub fn prune(s: &PruneSpec) -> Result<Outcome> {
    let pick = match s.pick {
        LayerPick::First => crate::export::LayerPick::First,
        LayerPick::Spread => crate::export::LayerPick::Spread,
    };
    let cfg = crate::export::prune_layers(&s.from, s.layers, pick, &s.out)?;
    Ok(Outcome::said(format!("kept {} layers of {} in {}", cfg.num_hidden_layers, s.from.display(), s.out.display())))
}

/// Stage I: document encoder frozen; query encoder aligned on self-pairs (contrastive + MSE).
pub fn stage1(s: &Stage1Spec, dev: Device, emit: &mut dyn FnMut(Event)) -> Result<Outcome> {
    let (h, o) = (&s.hyper, &s.options);
    h.precision.check_trainable().map_err(anyhow::Error::msg)?;
    let q = load_encoder(&s.query, dev, Kind::Float, Some(h.document_max_length))?;
    let d = load_encoder(&s.document, dev, h.precision.frozen_kind(dev), Some(h.document_max_length))?;
    let mut docs = data::read_corpus(&s.corpus)?;
    if !o.kinds.is_empty() {
        docs.retain(|doc| doc.kind.as_ref().is_some_and(|k| o.kinds.contains(k)));
    }
    let is_query = |doc: &data::Doc| doc.kind.as_ref().is_some_and(|k| o.query_kinds.contains(k));
    if o.max_chars > 0 {
        docs.retain(|doc| is_query(doc) || doc.text.chars().count() <= o.max_chars);
    }
    let docs = sample(&docs, o.max_texts, h.seed);
    let teacher_query = o.teacher_query_template.as_deref().unwrap_or(&h.query_template);
    let (ex, texts) = data::stage1_pairs(&docs, &o.query_kinds, &h.query_template, &h.document_template, teacher_query);
    let n_query = docs.iter().filter(|doc| is_query(doc)).count();
    std::fs::create_dir_all(&s.out)?;
    let served = load_served(s.served.as_ref(), &h.document_template)?;
    let mut side = frozen_doc_side_with(
        &d,
        texts.clone(),
        h.infer_batch,
        Some(&s.out.join("doc_vectors.safetensors")),
        served.as_ref(),
    )?;
    if let Some(qt) = &o.query_teacher {
        let qt = load_encoder(qt, dev, h.precision.frozen_kind(dev), Some(h.document_max_length))?;
        let own = o.query_teacher_template.as_deref().unwrap_or(&h.query_template);
        let mut seen = std::collections::HashSet::new();
        // (the side's key, the text as stage1_pairs gave it to the document encoder; the text as the query
        // teacher reads it): one pair per document, in order.
        let rows: Vec<(String, String)> = docs
            .iter()
            .zip(&ex)
            .filter(|(doc, _)| is_query(doc))
            .map(|(doc, e)| (e.pos[0].clone(), own.replace("{text}", &doc.text)))
            .filter(|(k, _)| seen.insert(k.clone()))
            .collect();
        crate::train::realign_rows(&mut side, &qt, &rows, h.infer_batch)?;
    }
    let params = select_trainable(&q, "query.", &|n| !(h.freeze_embeddings && n.starts_with("embeddings.word")));
    let cfg =
        TrainConfig::new(h.clone(), LossConfig { temperature: o.temperature, group_size: 1, mse_weight: o.mse_weight });
    let mut t = Trainer::new(&q, side, &ex, cfg, params, &s.out)?;
    t.events = Some(Box::new(emit));
    let summary = serde_json::json!({"stage": "stage1", "query": s.query, "document": s.document, "texts": texts.len(),
        "query_side_texts": n_query, "document_side_texts": texts.len() - n_query, "query_teacher": o.query_teacher});
    let summary = finish_training(&mut t, h, &s.out, "Stage I：查询编码器对齐冻结的文档编码器", summary)?;
    drop(t);
    let mut q = q;
    q.save(&s.out.join("query"), true)?;
    Ok(Outcome { message: format!("saved the Stage I query encoder in {}", s.out.join("query").display()), summary })
}

/// Stage II: joint training (document encoder through LoRA, or frozen), 1 positive + hard negatives.
pub fn stage2(s: &Stage2Spec, dev: Device, emit: &mut dyn FnMut(Event)) -> Result<Outcome> {
    let (h, o) = (&s.hyper, &s.options);
    h.precision.check_trainable().map_err(anyhow::Error::msg)?;
    let q = load_encoder(&s.query, dev, Kind::Float, Some(h.query_max_length))?;
    // Frozen or the base of LoRA adapters: either way these weights never train, so bf16 storage halves them.
    let mut d = load_encoder(&s.document, dev, h.precision.frozen_kind(dev), Some(h.document_max_length))?;
    let mut ex = Vec::new();
    for t in &s.train {
        ex.extend(data::read_training_file(t)?);
    }
    if !o.sources.is_empty() {
        ex.retain(|e| e.kind.as_ref().is_some_and(|k| o.sources.iter().any(|s| k.starts_with(s.as_str()))));
    }
    if let Some(n) = o.max_examples {
        ex = sample(&ex, n, h.seed);
    }
    if ex.is_empty() {
        let why = format!("no training examples left after filtering by sources {:?}", o.sources);
        return Err(crate::Error::Data(why).into());
    }
    let mut ex: Vec<TrainingExample> = ex.into_iter().map(|e| render_example(e, h)).collect();
    let judged_negatives = ex.iter().map(|e| e.neg.len()).sum::<usize>();
    let mut pool = data::document_pool(&ex);
    if let Some(c) = &o.mine_corpus {
        let extra = sample(&data::read_corpus(c)?, o.mine_corpus_max, h.seed);
        let seen: std::collections::HashSet<String> = pool.iter().cloned().collect();
        pool.extend(extra.into_iter().map(|doc| render(&h.document_template, &doc.text)).filter(|t| !seen.contains(t)));
    }
    std::fs::create_dir_all(&s.out)?;
    // Pool vectors from the current document encoder: mining uses them, a frozen document side reuses them.
    let side = match &o.pool_corpus {
        None => frozen_doc_side_with(
            &d,
            pool.clone(),
            h.infer_batch,
            Some(&s.out.join("doc_vectors.safetensors")),
            // A trainable document side uses the pool only to mine; its training steps re-encode.
            load_served(s.served.as_ref(), &h.document_template)?.as_ref(),
        )?,
        Some(pc) => {
            // The vectors of `pc` itself (this once read `<folder of pc>/corpus.jsonl` while the texts came
            // from `pc`, pairing vectors with the wrong texts whenever the file had another name).
            let (_, base) =
                crate::eval::corpus_file_vectors(&d, pc, &h.document_template, h.infer_batch, o.pool_cache.as_deref())?;
            let base_texts: Vec<String> =
                data::read_corpus(pc)?.iter().map(|doc| render(&h.document_template, &doc.text)).collect();
            let seen: std::collections::HashSet<&String> = base_texts.iter().collect();
            let extra: Vec<String> = pool.iter().filter(|t| !seen.contains(t)).cloned().collect();
            eprintln!("pool: {} corpus documents + {} other texts of the training data", base_texts.len(), extra.len());
            let extra_vecs = d.embed_all(&extra, h.infer_batch, &mut |_| {})?;
            let vectors = tch::Tensor::cat(&[base, extra_vecs], 0).to_device(d.device);
            let mut all = base_texts;
            all.extend(extra);
            let index = all.iter().enumerate().map(|(i, t)| (t.clone(), i as i64)).collect();
            pool = all;
            DocSide::Frozen { vectors, index }
        }
    };
    let mut mining = data::MiningReport::default();
    if o.mine {
        let DocSide::Frozen { vectors, index } = &side else { unreachable!() };
        let qtexts: Vec<String> = ex.iter().map(|e| e.query.clone()).collect();
        let mut pb = crate::train::progress_bar(qtexts.len() as u64, "mining: encoding queries");
        let qv = q.embed_all(&qtexts, h.infer_batch, &mut |n| pb.set_position(n as u64))?;
        pb.finish_and_clear();
        let w = qv.size()[1];
        let pv = crate::pooling::truncate(&vectors.to_device(Device::Cpu), w);
        let pos_rows: Vec<i64> = ex.iter().map(|e| index[&e.pos[0]]).collect();
        let pos_scores: Vec<f32> = Vec::<f32>::try_from(
            (&qv * pv.index_select(0, &tch::Tensor::from_slice(&pos_rows))).sum_dim_intlist(1, false, Kind::Float),
        )?;
        let opts = MiningOptions { negatives: o.group_size - 1, ..Default::default() };
        mining = data::mine_hard_negatives(&mut ex, &qv, &pos_scores, &pool, &pv, opts)?;
        eprintln!(
            "mined negatives; dropped {} likely false negatives (margin {:.4} below each positive); {} groups \
             still short (topped up at random)",
            mining.dropped, mining.margin, mining.short
        );
    }
    let side = if o.freeze_document {
        side
    } else {
        drop(side);
        add_lora(&mut d, &o.lora, h.seed);
        DocSide::Trainable(&d)
    };
    let mut params = select_trainable(&q, "query.", &|n| !(h.freeze_embeddings && n.starts_with("embeddings.word")));
    if !o.freeze_document {
        params.extend(select_trainable(&d, "document.", &|n| n.contains("lora_")));
    }
    let n_params: i64 = params.values().map(tch::Tensor::numel).map(|n| n as i64).sum();
    let loss = LossConfig { temperature: o.temperature, group_size: o.group_size, mse_weight: 0.0 };
    let cfg = TrainConfig { batch_by_source: o.batch_by_source, ..TrainConfig::new(h.clone(), loss) };
    let mut t = Trainer::new(&q, side, &ex, cfg, params, &s.out)?;
    t.events = Some(Box::new(emit));
    let summary = serde_json::json!({
        "stage": "stage2", "query": s.query, "document": s.document, "examples": ex.len(),
        "sources": data::kinds(&ex), "judged_negatives": judged_negatives, "pool": pool.len(),
        "mined": o.mine, "dropped_false_negatives": mining.dropped, "false_negative_margin": mining.margin,
        "groups_topped_up": mining.short, "document_frozen": o.freeze_document,
        "lora": if o.freeze_document { serde_json::Value::Null } else { serde_json::json!({"rank": o.lora.rank, "alpha": o.lora.alpha}) },
        "trainable_parameters": n_params,
    });
    let summary = finish_training(&mut t, h, &s.out, "Stage II：对比训练（1 个正例 + 难负例）", summary)?;
    drop(t);
    let mut q = q;
    q.save(&s.out.join("query"), true)?;
    if !o.freeze_document {
        let dir = s.out.join("document");
        d.save(&dir, !o.document_adapters)?;
        if o.document_adapters {
            let lora = crate::carry::LoraScale { rank: o.lora.rank, alpha: o.lora.alpha };
            write_json(&dir.join(crate::carry::LORA_FILE), &serde_json::to_value(lora).unwrap_or_default())?;
        }
    }
    Ok(Outcome { message: format!("saved the Stage II encoders in {}", s.out.display()), summary })
}

pub fn merge(s: &MergeSpec) -> Result<Outcome> {
    let changed = crate::export::merge_weights(&s.tuned, &s.base, s.ratio, &s.out)?;
    Ok(Outcome::said(format!("merged {changed} tensors ({} tuned) into {}", s.ratio, s.out.display())))
}

/// Sample queries for parity.json when no file is given.
const PARITY_TEXTS: &[&str] = &[
    "二甲双胍的禁忌症",
    "高血压患者可以吃布洛芬吗",
    "孕妇出血是什么原因？",
    "宝宝打完流感疫苗第三天拉肚子",
    "糖尿病人的饮食注意事项有哪些",
    "What are the side effects of metformin?",
    "头痛 发烧 咳嗽 三天",
    "乙肝小三阳需要治疗吗",
];

pub fn export(s: &ExportSpec) -> Result<Outcome> {
    let o = &s.options;
    let mut q = load_encoder(&s.query, Device::Cpu, Kind::Float, None)?;
    let texts: Vec<String> = match &o.parity_texts {
        Some(p) => std::fs::read_to_string(p)?.lines().filter(|l| !l.trim().is_empty()).map(String::from).collect(),
        None => PARITY_TEXTS.iter().map(|s| (*s).to_string()).collect(),
    };
    let mut provenance = BTreeMap::new();
    provenance.insert("trainer".into(), format!("care-train {} from {}", env!("CARGO_PKG_VERSION"), s.query.display()));
    // A merged encoder names the trained one it came from; the training run is beside that one.
    let merge = std::fs::read_to_string(s.query.join(crate::export::MERGE_FILE)).ok();
    let trained = merge
        .as_deref()
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|v| v["tuned"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| s.query.clone());
    if let Ok(run) = std::fs::read_to_string(trained.parent().unwrap_or(Path::new(".")).join("run.json")) {
        provenance.insert("training_run".into(), run.chars().filter(|c| *c != '\n').collect());
    }
    if let Some(m) = merge {
        provenance.insert("merge".into(), m.chars().filter(|c| *c != '\n').collect());
    }
    let info = crate::export::PackageInfo {
        name: o.name.clone(),
        version: o.version.clone(),
        pairing_id: s.pairing_id.clone(),
        query_template: o.query_template.clone(),
        document_template: o.document_template.clone(),
        instruction: String::new(),
        provenance,
        int8: o.int8,
    };
    let m = crate::export::export_package(&mut q, &s.out, &info, o.role, &texts)?;
    Ok(Outcome::said(format!(
        "wrote {:?} package {}@{} ({}, pairing {}) to {}",
        m.role,
        m.name,
        m.version,
        m.architecture,
        m.pairing_id,
        s.out.display()
    )))
}

pub fn embed_corpus(s: &EmbedCorpusSpec, dev: Device) -> Result<Outcome> {
    let o = &s.options;
    let d = load_encoder(&s.document, dev, o.precision.frozen_kind(dev), Some(o.max_length))?;
    let docs = data::read_corpus(&s.corpus)?;
    let width = o.width.unwrap_or(d.hidden_size());
    let started = Instant::now();
    let idx = crate::export::embed_corpus(
        &d,
        &docs,
        &s.out,
        &o.document_template,
        width,
        &s.pairing_id,
        o.batch,
        o.rows_per_shard,
    )?;
    let secs = started.elapsed().as_secs_f64();
    Ok(Outcome {
        message: format!(
            "embedded {} documents (width {}) in {:.1} s ({:.1} docs/s) into {}",
            idx.rows,
            idx.width,
            secs,
            idx.rows as f64 / secs,
            s.out.display()
        ),
        summary: serde_json::json!({"rows": idx.rows, "width": idx.width, "seconds": secs}),
    })
}
