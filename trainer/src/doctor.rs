//! `care-train doctor`: what this machine can train, said before a run rather than discovered during one.
//!
//! libtorch's CUDA library is loaded only when something references it (tch-rs issue 980), so "libtorch sees no
//! GPU" has two causes that need different fixes: no GPU at all, or a GPU with a CPU-only (or unloaded) libtorch.
//! The doctor tells them apart from the process's own mappings and the NVIDIA driver's view.

use care_formats::trainer::{Hyper, Lora, Stage2Options};
use serde::Serialize;

/// A Qwen3 document encoder's shape (the published configurations, or a test's).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Qwen3Size {
    pub name: &'static str,
    pub vocab: f64,
    pub hidden: f64,
    pub ffn: f64,
    pub layers: f64,
    pub heads: f64,
    pub kv_heads: f64,
    pub head_dim: f64,
}

pub const QWEN3_SIZES: [Qwen3Size; 3] = [
    Qwen3Size {
        name: "Qwen3-Embedding-0.6B",
        vocab: 151_669.0,
        hidden: 1024.0,
        ffn: 3072.0,
        layers: 28.0,
        heads: 16.0,
        kv_heads: 8.0,
        head_dim: 128.0,
    },
    Qwen3Size {
        name: "Qwen3-Embedding-4B",
        vocab: 151_665.0,
        hidden: 2560.0,
        ffn: 9728.0,
        layers: 36.0,
        heads: 32.0,
        kv_heads: 8.0,
        head_dim: 128.0,
    },
    Qwen3Size {
        name: "Qwen3-Embedding-8B",
        vocab: 151_665.0,
        hidden: 4096.0,
        ffn: 12288.0,
        layers: 36.0,
        heads: 32.0,
        kv_heads: 8.0,
        head_dim: 128.0,
    },
];

/// The query encoder trained beside it: e5-small (XLM-R, 12 × 384).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BertSize {
    pub vocab: f64,
    pub hidden: f64,
    pub ffn: f64,
    pub layers: f64,
}

pub const E5_SMALL: BertSize = BertSize { vocab: 250_037.0, hidden: 384.0, ffn: 1536.0, layers: 12.0 };

impl Qwen3Size {
    /// Parameters: embedding, per layer q/k/v/o, gate/up/down and four norms, the final norm.
    pub fn params(&self) -> f64 {
        let (h, q, kv) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let layer = h * q + 2.0 * h * kv + q * h + 3.0 * h * self.ffn + 2.0 * h + 2.0 * self.head_dim;
        self.vocab * h + self.layers * layer + h
    }

    /// LoRA parameters of rank `r` on all seven projections: r·(in + out) each.
    pub fn lora_params(&self, r: f64) -> f64 {
        let (h, q, kv, ff) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.ffn);
        self.layers * r * ((h + q) + 2.0 * (h + kv) + (q + h) + 2.0 * (h + ff) + (ff + h))
    }

    /// Bytes per token per layer that a bf16 LoRA step keeps for the backward pass, counted from this trainer's
    /// forward (`models/qwen3.rs`): RMSNorm upcasts to fp32 (the fp32 copy is saved, 4h, plus its bf16 output that
    /// the projections save, 2h; twice per layer), the per-head q/k norms likewise in fp32, fused attention saves
    /// q, k, v and its output in bf16 (K/V repeated to every head when a padding mask forces the memory-efficient
    /// kernel) and an fp32 log-sum-exp per head, each adapter its rank-r middle, SwiGLU four ffn-wide tensors.
    pub fn activation_bytes_per_token_layer(&self, rank: f64, padded: bool) -> f64 {
        let (h, q, kv) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let norms = 2.0 * (4.0 * h + 2.0 * h) + 4.0 * q + 4.0 * kv;
        let attention = if padded { 8.0 * q } else { 4.0 * q + 4.0 * kv } + 4.0 * self.heads;
        norms + attention + 7.0 * 2.0 * rank + 8.0 * self.ffn
    }
}

impl BertSize {
    pub fn params(&self) -> f64 {
        let h = self.hidden;
        self.vocab * h + 514.0 * h + self.layers * (4.0 * h * h + 2.0 * h * self.ffn + 9.0 * h + self.ffn)
    }

    /// The fully trained fp32 query encoder under bf16 autocast, per token per layer: autocast casts the fp32
    /// activations to bf16 for each projection (saved: 3 × 2h for q/k/v, 2h, 2h and 2ffn for the others), the
    /// fp32 bias adds promote q/k/v and the MLP back to fp32, attention saves four bf16 tensors, LayerNorm and
    /// GELU keep their fp32 inputs.
    pub fn activation_bytes_per_token_layer(&self) -> f64 {
        let (h, ff) = (self.hidden, self.ffn);
        6.0 * h + 8.0 * h + 2.0 * h + 2.0 * h + 2.0 * 4.0 * h + 4.0 * ff + 2.0 * ff
    }
}

/// What a Stage II step holds on the GPU, in bytes, by part.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stage2Estimate {
    /// The frozen bf16 document base.
    pub document_weights: f64,
    /// LoRA adapters in fp32 with their gradients and AdamW moments (16 bytes each) and their bf16 casts.
    pub lora_state: f64,
    /// The query encoder in fp32 with gradients and moments (16 bytes per parameter) and bf16 casts of its
    /// projection weights (autocast's cache).
    pub query_state: f64,
    pub document_activations: f64,
    pub query_activations: f64,
    pub total: f64,
}

/// The memory of one Stage II step: `docs` documents of `doc_len` tokens and `queries` queries of `query_len`
/// tokens alive at once (with `--sub-batch`, one sub-batch), LoRA rank `rank` on the document side.
pub fn stage2_estimate(
    d: &Qwen3Size,
    q: &BertSize,
    (docs, doc_len): (f64, f64),
    (queries, query_len): (f64, f64),
    rank: f64,
    padded: bool,
) -> Stage2Estimate {
    let document_weights = 2.0 * d.params();
    let lora_state = d.lora_params(rank) * (16.0 + 2.0);
    let q_linear = q.layers * (4.0 * q.hidden * q.hidden + 2.0 * q.hidden * q.ffn);
    let query_state = 16.0 * q.params() + 2.0 * q_linear;
    let doc_tokens = docs * doc_len;
    // The final norm (fp32 copy and output) once, the layers each.
    let document_activations =
        doc_tokens * (d.layers * d.activation_bytes_per_token_layer(rank, padded) + 6.0 * d.hidden);
    let query_activations = queries * query_len * q.layers * q.activation_bytes_per_token_layer();
    let total = document_weights + lora_state + query_state + document_activations + query_activations;
    Stage2Estimate { document_weights, lora_state, query_state, document_activations, query_activations, total }
}

/// Bytes a Stage II step at the default LoRA rank (32) needs on the GPU for `texts` documents of `seq` tokens
/// (padded batches), with an e5-small query encoder reading one query per group (8 documents) of the default
/// query length (64 tokens): the defaults of care_formats::trainer.
pub fn stage2_lora_bytes(m: &Qwen3Size, texts: f64, seq: f64) -> f64 {
    let (group, query_len) = (Stage2Options::default().group_size as f64, Hyper::default().query_max_length as f64);
    stage2_estimate(m, &E5_SMALL, (texts, seq), ((texts / group).ceil(), query_len), Lora::default().rank as f64, true)
        .total
}

#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    pub name: String,
    pub total_mib: u64,
    pub free_mib: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub libtorch_dir: Option<String>,
    pub libtorch_version: Option<String>,
    pub libtorch_cuda_loaded: bool,
    pub cuda_usable: bool,
    pub cuda_devices: i64,
    pub cudnn: bool,
    pub gpus: Vec<Gpu>,
    pub threads: i32,
    /// (model, GiB needed, fits in the first GPU's free memory) at the asked batch.
    pub stage2_lora: Vec<(String, f64, bool)>,
    /// What to do, in order; empty when the GPU is usable or none is present.
    pub advice: Vec<String>,
}

/// The libtorch folder the process loaded (`…/torch` of `…/torch/lib/libtorch_cpu.so`) and whether libtorch_cuda
/// is mapped, from /proc/self/maps.
fn loaded_libtorch() -> (Option<std::path::PathBuf>, bool) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut dir = None;
    let mut cuda = false;
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        if path.ends_with("libtorch_cpu.so") {
            dir = std::path::Path::new(path).parent().and_then(|p| p.parent()).map(|p| p.to_path_buf());
        }
        cuda |= path.ends_with("libtorch_cuda.so");
    }
    (dir, cuda)
}

fn libtorch_version(dir: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("version.py"))
        .ok()
        .or_else(|| std::fs::read_to_string(dir.join("build-version")).ok())?;
    text.lines()
        .find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim_matches(['\'', '"']).to_string()))
        .or_else(|| text.lines().next().map(str::to_string))
}

/// GPUs as the NVIDIA driver sees them (empty without `nvidia-smi`).
pub fn driver_gpus() -> Vec<Gpu> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"])
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            Some(Gpu {
                name: f.first()?.to_string(),
                total_mib: f.get(1)?.parse().ok()?,
                free_mib: f.get(2)?.parse().ok()?,
            })
        })
        .collect()
}

/// Whether a GPU is present at all, as far as the kernel and the driver say.
pub fn gpu_present() -> bool {
    std::path::Path::new("/dev/nvidiactl").exists() || !driver_gpus().is_empty()
}

pub fn report(texts: f64, seq: f64) -> Report {
    // Try to load libtorch_cuda when there is a GPU to use; why it failed is the first thing to fix.
    let load_error = if gpu_present() { crate::cuda::load().err() } else { None };
    let (dir, cuda_loaded) = loaded_libtorch();
    let cuda_usable = tch::Cuda::is_available();
    let gpus = driver_gpus();
    let free = gpus.first().map(|g| g.free_mib as f64 * 1024.0 * 1024.0);
    let stage2_lora = QWEN3_SIZES
        .iter()
        .map(|m| {
            let need = stage2_lora_bytes(m, texts, seq);
            (m.name.to_string(), need / (1u64 << 30) as f64, free.is_some_and(|f| need < 0.9 * f))
        })
        .collect();
    let mut advice = Vec::new();
    if !cuda_usable && (gpu_present() || !gpus.is_empty()) {
        if let Some(e) = load_error {
            advice.push(e);
        } else if cuda_loaded {
            advice.push(
                "libtorch_cuda is loaded but sees no device: check the driver (nvidia-smi) and that the CUDA \
                         runtime wheels match it (nvidia-cuda-runtime, nvidia-cublas, nvidia-cudnn)"
                    .into(),
            );
        } else {
            advice.push(
                "a GPU is present but libtorch_cuda is not loaded: install the CUDA build of torch==2.13.0 \
                         with nvidia-cuda-runtime, nvidia-cuda-cupti, nvidia-cublas and nvidia-cudnn, and start \
                         care-train through its wrapper (/usr/bin/care-train), which puts them on the library path"
                    .into(),
            );
        }
    }
    Report {
        libtorch_version: dir.as_deref().and_then(libtorch_version),
        libtorch_dir: dir.map(|d| d.display().to_string()),
        libtorch_cuda_loaded: cuda_loaded,
        cuda_usable,
        cuda_devices: if cuda_usable { tch::Cuda::device_count() } else { 0 },
        cudnn: cuda_usable && tch::Cuda::cudnn_is_available(),
        gpus,
        threads: tch::get_num_threads(),
        stage2_lora,
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_estimate_orders_models_and_grows_with_the_batch() {
        let [small, mid, big] = QWEN3_SIZES;
        let at = |m: &Qwen3Size, b: f64| stage2_lora_bytes(m, b, 256.0) / (1u64 << 30) as f64;
        assert!(at(&small, 8.0) < at(&mid, 8.0) && at(&mid, 8.0) < at(&big, 8.0));
        assert!(at(&big, 64.0) > at(&big, 8.0));
        // One document: the frozen bf16 weights (7.6e9 parameters, no output head, ≈ 14.1 GiB), LoRA's 87M adapters
        // with gradients and moments (≈ 1.5 GiB), the e5 query encoder's 118M in fp32 with moments (≈ 1.8 GiB) and
        // 256 tokens × 36 layers of activations (≈ 1.7 GiB).
        assert!((18.5..19.8).contains(&at(&big, 1.0)), "{}", at(&big, 1.0));
        // The published parameter counts, without the output head the embedding model drops.
        assert!((0.59e9..0.61e9).contains(&small.params()), "{}", small.params());
        assert!((7.4e9..7.7e9).contains(&big.params()), "{}", big.params());
        assert!((117e6..119e6).contains(&E5_SMALL.params()), "{}", E5_SMALL.params());
    }
}
