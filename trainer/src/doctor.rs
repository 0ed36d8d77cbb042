//! `care-train doctor`: what this machine can train, said before a run rather than discovered during one.
//!
//! libtorch's CUDA library is loaded only when something references it (tch-rs issue 980), so "libtorch sees no
//! GPU" has two causes that need different fixes: no GPU at all, or a GPU with a CPU-only (or unloaded) libtorch.
//! The doctor tells them apart from the process's own mappings and the NVIDIA driver's view.

use serde::Serialize;

/// A Qwen3 document encoder size (the published configurations).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Qwen3Size {
    pub name: &'static str,
    pub params: f64,
    pub hidden: f64,
    pub layers: f64,
    pub heads: f64,
}

pub const QWEN3_SIZES: [Qwen3Size; 3] = [
    Qwen3Size { name: "Qwen3-Embedding-0.6B", params: 0.6e9, hidden: 1024.0, layers: 28.0, heads: 16.0 },
    Qwen3Size { name: "Qwen3-Embedding-4B", params: 4.0e9, hidden: 2560.0, layers: 36.0, heads: 32.0 },
    Qwen3Size { name: "Qwen3-Embedding-8B", params: 8.2e9, hidden: 4096.0, layers: 36.0, heads: 32.0 },
];

/// Bytes a Stage II step with LoRA needs on the GPU: frozen bf16 weights, LoRA r = 32 adapters on the seven
/// projections with their AdamW moments (fp32), and the activations of `texts` sequences of `seq` tokens kept for
/// the backward pass (Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer in 16-bit, no recomputation).
/// With `--sub-batch` only one sub-batch's activations are alive (gradient cache), so pass the sub-batch here.
pub fn stage2_lora_bytes(m: &Qwen3Size, texts: f64, seq: f64) -> f64 {
    let weights = 2.0 * m.params;
    let lora_params = m.layers * 7.0 * 2.0 * 32.0 * m.hidden * 2.0;
    let lora = lora_params * (4.0 + 4.0 + 8.0);
    let activations = m.layers * seq * texts * m.hidden * (34.0 + 5.0 * m.heads * seq / m.hidden);
    weights + lora + activations
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
        // The frozen bf16 weights alone: 8.2e9 × 2 bytes ≈ 15.3 GiB.
        assert!((15.0..20.0).contains(&at(&big, 1.0)), "{}", at(&big, 1.0));
    }
}
