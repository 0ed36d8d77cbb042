//! What the GPU path needs and why it can be unavailable: the install prefix and command, the driver's device
//! node, and [`CudaUnavailable`]. A leaf module because both the error type and the encoders name them; the device
//! decision itself is `encoders/device.rs`.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where the GPU variant of the install puts the onnxruntime-gpu wheel and the NVIDIA CUDA 13 wheels (see
/// docs/admin/gpu.md); the systemd unit puts its `nvidia/*/lib` folders on `LD_LIBRARY_PATH`.
pub const GPU_PREFIX: &str = "/opt/care/ort-gpu";

/// The one command that installs the GPU runtime under [`GPU_PREFIX`] (onnxruntime-gpu 1.31.1 is a CUDA 13 build;
/// its `cuda` and `cudnn` extras are the nvidia-* wheels with libcudart/libcublas/libcurand/libcufft/libnvrtc 13 and
/// cuDNN 9).
pub const GPU_INSTALL: &str =
    "python3 -m pip install --target /opt/care/ort-gpu \"onnxruntime-gpu[cuda,cudnn]==1.31.1\"";

/// The device node every NVIDIA driver creates; absent means no GPU this process can use.
pub const NVIDIA_NODE: &str = "/dev/nvidiactl";

/// The ONNX Runtime library of the GPU variant, used when neither `model.ort_library` nor `ORT_DYLIB_PATH` is set.
pub fn gpu_runtime_library() -> PathBuf {
    Path::new(GPU_PREFIX).join("onnxruntime/capi/libonnxruntime.so.1.31.1")
}

/// Why the CUDA provider cannot be used: ONNX Runtime's own words and the library they say is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CudaUnavailable {
    /// ONNX Runtime's error text (or why the provider was not tried).
    pub reason: String,
    /// The shared library that could not be loaded, e.g. `libcublasLt.so.13`, when the text names one.
    pub missing: Option<String>,
}

impl CudaUnavailable {
    pub fn new(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        CudaUnavailable { missing: missing_library(&reason), reason }
    }

    /// What to do about it, in Chinese, naming the commands.
    pub fn fix_zh(&self) -> String {
        let driver = self.missing.as_deref() == Some("libcuda.so.1") || self.reason.contains("driver");
        if driver {
            return "安装 NVIDIA 驱动 ≥ 580（CUDA 13），用 `nvidia-smi` 确认后重启服务 / install NVIDIA driver >= 580"
                .into();
        }
        format!(
            "安装 GPU 版 ONNX Runtime（CUDA 13，驱动 ≥ 580）：`{GPU_INSTALL}`，然后重启服务（care 自动使用 {}，\
             除非设置了 model.ort_library 或 ORT_DYLIB_PATH）；或设置 model.device = \"auto\"/\"cpu\"。见 docs/admin/gpu.md",
            gpu_runtime_library().display()
        )
    }

    /// One line for logs and metrics: the missing piece when known, else ONNX Runtime's text.
    pub fn short(&self) -> String {
        match &self.missing {
            Some(lib) => format!("missing {lib}"),
            None => self.reason.clone(),
        }
    }
}

impl std::fmt::Display for CudaUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let missing = self.missing.as_deref().map(|m| format!("缺少 {m}（missing {m}）；")).unwrap_or_default();
        write!(
            f,
            "CUDA 不可用 / CUDA unavailable: {missing}ONNX Runtime: {}。解决 / fix: {}",
            self.reason.trim().trim_end_matches('.'),
            self.fix_zh()
        )
    }
}

/// The library a loader error names: the file before "cannot open shared object file", else a CUDA provider that
/// this build of ONNX Runtime lacks.
fn missing_library(text: &str) -> Option<String> {
    if let Some(at) = text.find(": cannot open shared object file") {
        let name = text[..at].rsplit(|c: char| c.is_whitespace() || "'\"`".contains(c)).next()?;
        return name.rsplit('/').next().filter(|n| !n.is_empty()).map(str::to_string);
    }
    let lacks_provider = text.contains("providers_cuda") || text.contains("not enabled in this build");
    lacks_provider.then(|| "libonnxruntime_providers_cuda.so".to_string())
}
