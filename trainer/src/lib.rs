//! CARE's trainer: two-stage asymmetric retriever fine-tuning on libtorch (`tch`).
//!
//! ```text
//!  care-train (main.rs) ── explicit stage commands, and `run --spec FILE` (the appliance's door)
//!   ├ stages     the phases the appliance runs, as functions of their specs (care_formats::trainer)
//!   ├ models     BERT/XLM-R encoder and Qwen3 decoder on Hugging Face names; LoRA adapters that merge
//!   ├ weights    sorted named tensors ↔ model.safetensors
//!   ├ carry      what training changed, small enough to bring back from a lent GPU machine, and back in
//!   ├ encoder    model + tokenizer.json + pooling (CLS / mean / last token), batched inference
//!   ├ loss       InfoNCE with hard negatives, asymmetric variant, MSE alignment, Matryoshka
//!   ├ optim      AdamW with savable state, warmup + linear decay, global-norm clipping
//!   ├ data       CARE JSONL, BEIR train splits, train_pairs, Stage I self-pairs, hard-negative mining
//!   ├ train      the step loop: sub-batching (gradient cache), seeds per step, checkpoints, exact resume,
//!   │            metrics log + SVG chart
//!   ├ export     query encoder → ONNX model package (care-modelio's exporter) + parity vectors;
//!   │            document embeddings → embedding shards (care-formats)
//!   ├ eval       nDCG@10 on BEIR dev splits with an exact scan, and query-latency measurement
//!   ├ precision  bf16 autocast that is bf16 (libtorch's autocast type set by symbol), fp16 refused for training
//!   ├ gpu_check  `care-train gpu-check`: device facts and Stage II LoRA steps on CPU and CUDA, one JSON report
//!   ├ cuda       loads libtorch_cuda at run time (tch links only the CPU library)
//!   └ doctor     libtorch version, CUDA usable or why not, GPUs and free memory, which Qwen3 fits Stage II
//! ```
//!
//! The trainer shares only `care-formats` (manifests, training data, embedding shards) and `care-modelio`
//! (ONNX/safetensors writers) with the server; it never links ONNX Runtime, tantivy or LanceDB.

pub mod carry;
pub mod cuda;
pub mod data;
pub mod doctor;
pub mod encoder;
pub mod eval;
pub mod export;
pub mod gpu_check;
pub mod loss;
pub mod models;
pub mod optim;
pub mod pooling;
pub mod precision;
pub mod stages;
pub mod svg;
pub mod train;
pub mod vocab;
pub mod weights;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("model config: {0}")]
    Config(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("training data: {0}")]
    Data(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("export: {0}")]
    Export(String),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.display().to_string(), source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
