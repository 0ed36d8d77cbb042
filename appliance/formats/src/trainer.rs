//! The contract between the appliance and `care-train`: what one phase is asked to do ([`TrainSpec`], a JSON file
//! given as `care-train run --spec FILE`) and what it reports while it runs ([`Event`], one JSON object per line).
//!
//! Both sides read these types, so a field added on one side cannot be forgotten on the other, and the defaults of
//! every hyper-parameter are written once, here: the trainer's command-line flags take theirs from the same
//! `Default` implementations, and a spec that leaves a field out gets the same value.
//!
//! ```text
//!  engine ── spec.json ──▶ care-train run --spec spec.json ── stdout: started, step…, checkpoint…, done | failed
//! ```
//!
//! Versions: a spec carries [`SPEC_VERSION`] and the trainer refuses another; the first event (`started`) carries
//! [`EVENT_FORMAT`] and the appliance refuses a stream of another format. Adding an optional field (with a serde
//! default) keeps a version; renaming or removing one, or changing a meaning, bumps it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The version of [`TrainSpec`] this crate writes and reads.
pub const SPEC_VERSION: u32 = 1;
/// The version of the [`Event`] stream this crate writes and reads (carried by [`Event::Started`]).
pub const EVENT_FORMAT: u32 = 1;

/// The device a phase runs on unless told otherwise: CUDA when libtorch sees a GPU, else the CPU.
pub const DEFAULT_DEVICE: &str = "auto";

/// The template a query encoder reads its texts through unless told otherwise (e5's prompt).
pub const DEFAULT_QUERY_TEMPLATE: &str = "query: {text}";
/// The template a document encoder reads passages through unless told otherwise (e5's prompt).
pub const DEFAULT_DOCUMENT_TEMPLATE: &str = "passage: {text}";

/// One phase for `care-train run --spec FILE`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSpec {
    /// [`SPEC_VERSION`] of the writer.
    pub version: u32,
    /// cpu, cuda or auto (CUDA when libtorch sees a GPU).
    #[serde(default = "default_device")]
    pub device: String,
    /// Intra-op CPU threads (0: libtorch's default).
    #[serde(default)]
    pub threads: usize,
    /// Where the events go, appended one per line; none: standard output.
    #[serde(default)]
    pub events: Option<PathBuf>,
    pub phase: Phase,
}

fn default_device() -> String {
    DEFAULT_DEVICE.into()
}

impl TrainSpec {
    /// A spec of the current version for `phase` on `device`.
    pub fn new(phase: Phase, device: &str, threads: usize) -> Self {
        TrainSpec { version: SPEC_VERSION, device: device.into(), threads, events: None, phase }
    }

    /// Reads a spec written by any writer; another version is refused with both numbers.
    pub fn from_json(text: &str) -> Result<Self, ContractError> {
        // The version first, so a spec of another version says so rather than which field it lacks.
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| ContractError::Json(e.to_string()))?;
        let version = v.get("version").and_then(serde_json::Value::as_u64).unwrap_or(0);
        if version != u64::from(SPEC_VERSION) {
            return Err(ContractError::Version { what: "spec", found: version, expected: SPEC_VERSION });
        }
        serde_json::from_value(v).map_err(|e| ContractError::Json(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// What went wrong reading a spec or an event.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContractError {
    #[error("{0}")]
    Json(String),
    #[error("{what} version {found}, this side reads version {expected}")]
    Version { what: &'static str, found: u64, expected: u32 },
}

/// The phases the appliance runs, tagged by `stage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub enum Phase {
    Prune(PruneSpec),
    Stage1(Stage1Spec),
    Stage2(Stage2Spec),
    Merge(MergeSpec),
    Export(ExportSpec),
    EmbedCorpus(EmbedCorpusSpec),
}

/// The name of a phase, as events and logs carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Prune,
    Stage1,
    Stage2,
    Merge,
    Export,
    EmbedCorpus,
}

impl Stage {
    /// The phase's command name (`care-train stage1`, `embed-corpus` …), also its log file's name.
    pub fn command(self) -> &'static str {
        match self {
            Stage::Prune => "prune",
            Stage::Stage1 => "stage1",
            Stage::Stage2 => "stage2",
            Stage::Merge => "merge",
            Stage::Export => "export",
            Stage::EmbedCorpus => "embed-corpus",
        }
    }
}

impl Phase {
    pub fn stage(&self) -> Stage {
        match self {
            Phase::Prune(_) => Stage::Prune,
            Phase::Stage1(_) => Stage::Stage1,
            Phase::Stage2(_) => Stage::Stage2,
            Phase::Merge(_) => Stage::Merge,
            Phase::Export(_) => Stage::Export,
            Phase::EmbedCorpus(_) => Stage::EmbedCorpus,
        }
    }

    /// Training steps the phase runs (0 for phases without a step loop).
    pub fn steps(&self) -> u64 {
        match self {
            Phase::Stage1(s) => s.hyper.steps,
            Phase::Stage2(s) => s.hyper.steps,
            Phase::Prune(_) | Phase::Merge(_) | Phase::Export(_) | Phase::EmbedCorpus(_) => 0,
        }
    }
}

/// Numeric precision of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
    Fp16,
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fp32" => Ok(Self::Fp32),
            "bf16" => Ok(Self::Bf16),
            "fp16" => Ok(Self::Fp16),
            other => Err(format!("unknown precision {other:?}: use fp32, bf16 or fp16")),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
        })
    }
}

/// The step loop's hyper-parameters, shared by every training stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Hyper {
    pub steps: u64,
    pub batch_size: usize,
    /// Encode at most this many texts with a graph at once (gradient cache); 0 = whole batch.
    pub sub_batch: usize,
    pub lr: f64,
    pub warmup_ratio: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    pub seed: u64,
    pub checkpoint_every: u64,
    pub keep_checkpoints: usize,
    /// Continue from the newest checkpoint in the output folder.
    pub resume: bool,
    /// Matryoshka widths to average the contrastive loss over (empty: the query width).
    pub matryoshka: Vec<i64>,
    pub query_template: String,
    pub document_template: String,
    pub query_max_length: usize,
    pub document_max_length: usize,
    /// Keep the query encoder's word-embedding matrix fixed (250k × 384 for e5: most of its parameters).
    pub freeze_embeddings: bool,
    /// Batch size for no-grad encoding (frozen document pools, mining).
    pub infer_batch: usize,
    pub precision: Precision,
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper {
            steps: 200,
            batch_size: 32,
            sub_batch: 0,
            lr: 1e-4,
            warmup_ratio: 0.05,
            weight_decay: 0.05,
            max_grad_norm: 1.0,
            seed: 42,
            checkpoint_every: 100,
            keep_checkpoints: 2,
            resume: false,
            matryoshka: Vec::new(),
            query_template: DEFAULT_QUERY_TEMPLATE.into(),
            document_template: DEFAULT_DOCUMENT_TEMPLATE.into(),
            query_max_length: 64,
            document_max_length: 256,
            freeze_embeddings: false,
            infer_batch: 64,
            precision: Precision::Fp32,
        }
    }
}

/// Document vectors the appliance already serves, reused by a frozen document side instead of re-embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedVectors {
    /// safetensors with `vectors` [N, d] and `present` [N]: row i is line i of `corpus`.
    pub vectors: PathBuf,
    /// The corpus file (corpus.jsonl layout) whose lines `vectors` holds.
    pub corpus: PathBuf,
}

/// Which layers a pruned encoder keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerPick {
    /// Layers 0..k.
    #[default]
    First,
    /// k layers evenly spread from the first to the last.
    Spread,
}

/// Keep `layers` layers of a BERT/XLM-R encoder (query-encoder initialisation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PruneSpec {
    pub from: PathBuf,
    pub layers: i64,
    #[serde(default)]
    pub pick: LayerPick,
    pub out: PathBuf,
}

/// Stage I: document encoder frozen; query encoder aligned on self-pairs (contrastive + MSE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage1Spec {
    pub query: PathBuf,
    pub document: PathBuf,
    /// Approved corpus (`{"id","title","text","kind"}` lines) to draw self-pairs from.
    pub corpus: PathBuf,
    pub out: PathBuf,
    #[serde(default)]
    pub served: Option<ServedVectors>,
    #[serde(default)]
    pub options: Stage1Options,
    #[serde(default)]
    pub hyper: Hyper,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stage1Options {
    /// Use at most this many texts (a seeded sample).
    pub max_texts: usize,
    /// Use only texts of these corpus kinds; empty: all.
    pub kinds: Vec<String>,
    /// Use only passages of at most this many characters (0: all); query-kind texts are always kept.
    pub max_chars: usize,
    /// Corpus kinds the teacher reads as queries (through `teacher_query_template`).
    pub query_kinds: Vec<String>,
    /// The document encoder's own query prompt (default: the student's query template).
    pub teacher_query_template: Option<String>,
    /// Encoder whose vectors the query-kind texts are aligned to instead of the document encoder's.
    pub query_teacher: Option<PathBuf>,
    /// The query teacher's prompt (default: the student's query template).
    pub query_teacher_template: Option<String>,
    pub temperature: f64,
    /// Weight of the MSE term on the squared distance of the unit vectors (the paper's is 1).
    pub mse_weight: f64,
}

impl Default for Stage1Options {
    fn default() -> Self {
        Stage1Options {
            max_texts: 20_000,
            kinds: Vec::new(),
            max_chars: 0,
            query_kinds: vec!["question".into(), "query".into()],
            teacher_query_template: None,
            query_teacher: None,
            query_teacher_template: None,
            temperature: 0.1,
            mse_weight: 1.0,
        }
    }
}

/// LoRA adapters: only the adapters train, merged into the saved weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lora {
    pub rank: i64,
    pub alpha: f64,
    /// Empty: Qwen3's q,k,v,o,gate,up,down projections; BERT's query,key,value,dense.
    pub targets: Vec<String>,
}

impl Default for Lora {
    fn default() -> Self {
        Lora { rank: 32, alpha: 64.0, targets: Vec::new() }
    }
}

/// Stage II: joint training (document encoder through LoRA, or frozen), 1 positive + hard negatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage2Spec {
    pub query: PathBuf,
    pub document: PathBuf,
    /// CARE JSONL or train_pairs.jsonl files.
    pub train: Vec<PathBuf>,
    pub out: PathBuf,
    #[serde(default)]
    pub served: Option<ServedVectors>,
    #[serde(default)]
    pub options: Stage2Options,
    #[serde(default)]
    pub hyper: Hyper,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stage2Options {
    /// Keep only examples whose `type`/`source` starts with one of these.
    pub sources: Vec<String>,
    /// Use at most this many examples (a seeded sample).
    pub max_examples: Option<usize>,
    pub temperature: f64,
    pub group_size: usize,
    /// Mine hard negatives from the document pool to fill every group.
    pub mine: bool,
    pub mine_corpus: Option<PathBuf>,
    pub mine_corpus_max: usize,
    /// A corpus whose every document joins the frozen pool; its vectors are cached at `pool_cache`.
    pub pool_corpus: Option<PathBuf>,
    pub pool_cache: Option<PathBuf>,
    /// Do not train the document encoder (its vectors are computed once).
    pub freeze_document: bool,
    /// Fill each batch from one source, so in-batch negatives come from the positive's collection.
    pub batch_by_source: bool,
    pub lora: Lora,
    /// Save the trained document side unmerged: its start's weights, the LoRA adapters and `lora.json`, for
    /// `care-train carry-out` to take back only the adapters (a lent GPU machine's runs). Such a folder is not a
    /// model until `carry-in` folds the adapters in.
    pub document_adapters: bool,
}

impl Default for Stage2Options {
    fn default() -> Self {
        Stage2Options {
            sources: Vec::new(),
            max_examples: None,
            temperature: 0.02,
            group_size: 8,
            mine: false,
            mine_corpus: None,
            mine_corpus_max: 20_000,
            pool_corpus: None,
            pool_cache: None,
            freeze_document: false,
            batch_by_source: false,
            lora: Lora::default(),
            document_adapters: false,
        }
    }
}

/// `care-train init` (independent initialisation: a symmetric contrastive fine-tune of one encoder, an engineer's
/// tool the appliance does not run): its loss, beside Stage I's and Stage II's. Its step loop is a [`Hyper`].
#[derive(Debug, Clone, PartialEq)]
pub struct InitOptions {
    pub temperature: f64,
    /// Documents per query: 1 positive + `group_size − 1` negatives.
    pub group_size: usize,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions { temperature: 0.02, group_size: 2 }
    }
}

/// RATIO × tuned + (1 − RATIO) × base (WiSE-FT).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeSpec {
    pub tuned: PathBuf,
    pub base: PathBuf,
    /// Weight of the tuned encoder, 0..=1 (1 copies it).
    pub ratio: f64,
    pub out: PathBuf,
}

/// A trained encoder as an appliance model package (ONNX) with parity vectors: the query encoder, or with
/// `options.role = document` a document encoder trained in Stage II (its LoRA adapters merged).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportSpec {
    /// The encoder to export (a document encoder when `options.role` is `document`).
    pub query: PathBuf,
    pub out: PathBuf,
    /// Pairing id of the document model whose vectors this query encoder was aligned to.
    pub pairing_id: String,
    #[serde(default)]
    pub options: ExportOptions,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExportOptions {
    pub name: String,
    pub version: String,
    pub query_template: String,
    pub document_template: String,
    /// Texts for parity.json (one per line); none: built-in medical queries.
    pub parity_texts: Option<PathBuf>,
    /// What the package encodes: `query`, or `document` (parity vectors then use the document template).
    pub role: crate::ModelRole,
    /// A query encoder's package also carries `model_int8.onnx` ([`crate::Graph::Int8`]), which the evaluation
    /// gate times and scores beside the fp32 graph. Ignored for a document encoder (documents are encoded in fp32).
    pub int8: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            name: "care-query".into(),
            version: "1".into(),
            query_template: DEFAULT_QUERY_TEMPLATE.into(),
            document_template: DEFAULT_DOCUMENT_TEMPLATE.into(),
            parity_texts: None,
            role: crate::ModelRole::Query,
            int8: true,
        }
    }
}

/// A corpus encoded by the document encoder into embedding shards for the appliance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedCorpusSpec {
    pub document: PathBuf,
    pub corpus: PathBuf,
    pub out: PathBuf,
    pub pairing_id: String,
    #[serde(default)]
    pub options: EmbedOptions,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EmbedOptions {
    /// Vector width (Matryoshka truncation); none: the encoder's.
    pub width: Option<i64>,
    pub document_template: String,
    pub batch: usize,
    pub rows_per_shard: usize,
    pub max_length: usize,
    pub precision: Precision,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            width: None,
            document_template: DEFAULT_DOCUMENT_TEMPLATE.into(),
            batch: 64,
            rows_per_shard: 50_000,
            max_length: 512,
            precision: Precision::Fp32,
        }
    }
}

/// What a step counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// An optimiser step (loss set).
    Train,
}

/// Why a phase failed; the message says what and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailCode {
    /// The spec is unreadable, of another version, or asks for something impossible.
    Spec,
    /// The device asked for cannot be used (CUDA missing, libtorch cannot see the GPU).
    Device,
    /// Training data: missing, malformed, or nothing left after filtering; a loss that is not finite.
    Data,
    /// A model folder: config, weights or tokenizer.
    Model,
    /// A checkpoint that cannot be resumed.
    Checkpoint,
    /// Writing the package or the embedding shards.
    Export,
    /// Reading or writing a file.
    Io,
    /// Anything else (libtorch, a bug).
    Internal,
}

/// One line of the event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The first line: the stream's format and what runs where.
    Started {
        format: u32,
        stage: Stage,
        /// `care-train <version>`.
        trainer: String,
        /// The device in use (`Cpu`, `Cuda(0)`).
        device: String,
        /// Training steps the phase runs to (0 for phases without a step loop).
        total: u64,
    },
    /// One finished step.
    Step {
        phase: StepKind,
        step: u64,
        total: u64,
        loss: f64,
        lr: f64,
        /// Wall seconds of this step.
        seconds: f64,
    },
    /// A checkpoint was written (a resumed run starts from the newest one).
    Checkpoint { step: u64, path: PathBuf },
    /// The last line of a phase that succeeded: what it wrote and its summary (Stage I/II: run.json).
    Done {
        message: String,
        #[serde(default)]
        summary: serde_json::Value,
    },
    /// The last line of a phase that failed.
    Failed { code: FailCode, message: String },
}

impl Event {
    /// One line (no newline) of the stream.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads one line of the stream.
    pub fn from_line(line: &str) -> Result<Self, ContractError> {
        serde_json::from_str(line.trim()).map_err(|e| ContractError::Json(e.to_string()))
    }

    /// Whether the phase ended with this event.
    pub fn is_end(&self) -> bool {
        matches!(self, Event::Done { .. } | Event::Failed { .. })
    }

    /// The started event of a phase for this format; a reader checks [`Event::check_format`] on it.
    pub fn started(stage: Stage, trainer: &str, device: &str, total: u64) -> Self {
        Event::Started { format: EVENT_FORMAT, stage, trainer: trainer.into(), device: device.into(), total }
    }

    /// Refuses a started event of another format.
    pub fn check_format(&self) -> Result<(), ContractError> {
        match self {
            Event::Started { format, .. } if *format != EVENT_FORMAT => {
                Err(ContractError::Version { what: "event stream", found: u64::from(*format), expected: EVENT_FORMAT })
            }
            Event::Started { .. }
            | Event::Step { .. }
            | Event::Checkpoint { .. }
            | Event::Done { .. }
            | Event::Failed { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage1() -> Phase {
        Phase::Stage1(Stage1Spec {
            query: "q".into(),
            document: "d".into(),
            corpus: "c.jsonl".into(),
            out: "s1".into(),
            served: Some(ServedVectors { vectors: "v.safetensors".into(), corpus: "c.jsonl".into() }),
            options: Stage1Options {
                max_chars: 48,
                teacher_query_template: Some("t {text}".into()),
                ..Default::default()
            },
            hyper: Hyper { steps: 1500, resume: true, precision: Precision::Bf16, ..Default::default() },
        })
    }

    #[test]
    fn every_phase_round_trips_through_a_spec_file() {
        let phases = vec![
            Phase::Prune(PruneSpec { from: "a".into(), layers: 4, pick: LayerPick::Spread, out: "b".into() }),
            stage1(),
            Phase::Stage2(Stage2Spec {
                query: "q".into(),
                document: "d".into(),
                train: vec!["s2.jsonl".into()],
                out: "s2".into(),
                served: None,
                options: Stage2Options {
                    max_examples: Some(300),
                    freeze_document: true,
                    lora: Lora { targets: vec!["query".into()], ..Default::default() },
                    ..Default::default()
                },
                hyper: Hyper { matryoshka: vec![64, 128], ..Default::default() },
            }),
            Phase::Merge(MergeSpec { tuned: "t".into(), base: "b".into(), ratio: 0.4, out: "m".into() }),
            Phase::Export(ExportSpec {
                query: "m".into(),
                out: "e".into(),
                pairing_id: "e5-small-q4@1".into(),
                options: ExportOptions { name: "x-r3".into(), ..Default::default() },
            }),
            Phase::Export(ExportSpec {
                query: "s2/document".into(),
                out: "ed".into(),
                pairing_id: "e5-small-r3".into(),
                options: ExportOptions { role: crate::ModelRole::Document, ..Default::default() },
            }),
            Phase::EmbedCorpus(EmbedCorpusSpec {
                document: "d".into(),
                corpus: "c".into(),
                out: "v".into(),
                pairing_id: "p".into(),
                options: EmbedOptions { width: Some(256), ..Default::default() },
            }),
        ];
        for phase in phases {
            let mut spec = TrainSpec::new(phase, "cpu", 2);
            spec.events = Some("events.jsonl".into());
            let back = TrainSpec::from_json(&spec.to_json()).unwrap();
            assert_eq!(back, spec);
            assert_eq!(
                serde_json::to_value(&back).unwrap()["phase"]["stage"],
                back.phase.stage().command().replace('-', "_")
            );
        }
    }

    #[test]
    fn a_spec_that_leaves_fields_out_gets_the_one_set_of_defaults_and_another_version_is_refused() {
        let text = r#"{"version":1,"phase":{"stage":"stage1","query":"q","document":"d","corpus":"c","out":"o",
            "hyper":{"steps":7}}}"#;
        let spec = TrainSpec::from_json(text).unwrap();
        assert_eq!(spec.device, "auto");
        let Phase::Stage1(s) = &spec.phase else { panic!("{spec:?}") };
        assert_eq!(s.hyper, Hyper { steps: 7, ..Hyper::default() });
        assert_eq!(s.options, Stage1Options::default());
        assert_eq!(spec.phase.steps(), 7);
        let other = text.replace("\"version\":1", "\"version\":2");
        assert_eq!(
            TrainSpec::from_json(&other).unwrap_err(),
            ContractError::Version { what: "spec", found: 2, expected: SPEC_VERSION }
        );
        assert!(matches!(
            TrainSpec::from_json(r#"{"version":1,"phase":{"stage":"stage9"}}"#),
            Err(ContractError::Json(_))
        ));
        assert!(matches!(
            TrainSpec::from_json(r#"{"version":1,"phase":{"stage":"merge","tuned":"t"}}"#),
            Err(ContractError::Json(_))
        ));
    }

    #[test]
    fn every_event_round_trips_as_one_line() {
        let events = vec![
            Event::started(Stage::Stage2, "care-train 0.3.0", "Cpu", 30),
            Event::Step { phase: StepKind::Train, step: 1, total: 30, loss: 2.5, lr: 1e-4, seconds: 0.25 },
            Event::Checkpoint { step: 20, path: "s2/checkpoints/step-00000020".into() },
            Event::Done { message: "saved".into(), summary: serde_json::json!({"steps_run": 30}) },
            Event::Failed { code: FailCode::Data, message: "no training examples".into() },
        ];
        let stream: String = events.iter().map(|e| e.to_line() + "\n").collect();
        assert_eq!(stream.lines().count(), events.len(), "one line per event: {stream}");
        let back: Vec<Event> = stream.lines().map(|l| Event::from_line(l).unwrap()).collect();
        assert_eq!(back, events);
        assert!(back[0].check_format().is_ok());
        assert!(back[3].is_end() && back[4].is_end() && !back[1].is_end());
        assert!(stream.starts_with(r#"{"event":"started","format":1,"stage":"stage2""#), "{stream}");
        let newer =
            Event::Started { format: 2, stage: Stage::Merge, trainer: String::new(), device: String::new(), total: 0 };
        assert!(matches!(newer.check_format(), Err(ContractError::Version { found: 2, .. })));
        // A done event from a writer that sends no summary still reads.
        assert_eq!(
            Event::from_line(r#"{"event":"done","message":"ok"}"#).unwrap(),
            Event::Done { message: "ok".into(), summary: serde_json::Value::Null }
        );
    }
}
