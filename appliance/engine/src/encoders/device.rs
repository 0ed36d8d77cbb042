//! Which device the encoder sessions run on, decided by opening a real CUDA session rather than by asking ONNX
//! Runtime whether it was compiled with CUDA.
//!
//! Why: a GPU build of ONNX Runtime lists the CUDA provider even when the provider cannot load its CUDA libraries,
//! and a provider registered without `error_on_failure` that fails to load only logs an error and leaves the session
//! on the CPU. So `model.device = "cuda"` registers the provider with `error_on_failure` and stops with the missing
//! library named; `auto` uses CUDA only when a GPU is present and a one-node CUDA session opens and runs, and
//! otherwise falls back to the CPU out loud (a warning, `/metrics`, `care doctor`). What is reported is what the
//! session was built with.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use serde::Serialize;

pub use crate::gpu::{CudaUnavailable, GPU_INSTALL, GPU_PREFIX, NVIDIA_NODE, gpu_runtime_library};

/// What `model.device` asked for, what the sessions got, and why not CUDA when it fell back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServedDevice {
    pub requested: String,
    /// "cuda" or "cpu": the providers the session was built with.
    pub device: &'static str,
    /// Set when `auto` ended on the CPU: why CUDA was not used.
    pub fallback: Option<CudaUnavailable>,
}

/// Sessions built on the CPU because `auto` could not use CUDA, and the latest decision, for `/metrics`.
static FALLBACKS: AtomicU64 = AtomicU64::new(0);
static LAST: Mutex<Option<ServedDevice>> = Mutex::new(None);

/// The latest device decision of this process (None before any) and how many sessions fell back to the CPU.
pub fn served_device() -> (Option<ServedDevice>, u64) {
    (LAST.lock().unwrap_or_else(|p| p.into_inner()).clone(), FALLBACKS.load(Ordering::Relaxed))
}

pub(super) fn record(served: &ServedDevice) {
    if let Some(why) = &served.fallback {
        FALLBACKS.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(requested = %served.requested, reason = %why.reason, "CUDA unavailable: encoders run on the CPU");
    }
    *LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some(served.clone());
}

/// Whether an NVIDIA GPU is visible to this process.
pub fn gpu_present() -> bool {
    Path::new(NVIDIA_NODE).exists()
}

/// Picks the device for `requested` ("auto", "cpu" or "cuda"): `cuda` must pass `probe`; `auto` uses CUDA when
/// a GPU is present and `probe` passes, the CPU otherwise with the reason kept. `probe` runs only when needed.
pub fn choose(
    requested: &str,
    gpu: bool,
    probe: impl FnOnce() -> Result<(), CudaUnavailable>,
) -> crate::Result<ServedDevice> {
    let served = |device, fallback| ServedDevice { requested: requested.to_string(), device, fallback };
    match requested {
        "cpu" => Ok(served("cpu", None)),
        "cuda" => probe().map(|()| served("cuda", None)).map_err(crate::Error::CudaUnavailable),
        "auto" if !gpu => {
            Ok(served("cpu", Some(CudaUnavailable::new(format!("no NVIDIA GPU: {NVIDIA_NODE} does not exist")))))
        }
        "auto" => Ok(match probe() {
            Ok(()) => served("cuda", None),
            Err(why) => served("cpu", Some(why)),
        }),
        other => Err(crate::Error::InvalidInput(format!("model.device 只能是 auto、cpu 或 cuda，而不是 {other:?}"))),
    }
}

/// The CUDA provider, failing instead of silently leaving the session on the CPU.
pub(super) fn cuda_provider() -> ort::ep::ExecutionProviderDispatch {
    ort::ep::CUDA::default().build().error_on_failure()
}

/// Opens and runs a one-node (Identity) session with the CUDA provider, once per process: the CUDA libraries load,
/// the driver answers and a kernel runs, or the reason why not. Call after [`super::init_runtime`].
pub fn probe_cuda(env: &ort::environment::Environment) -> Result<(), CudaUnavailable> {
    static PROBE: OnceLock<Result<(), CudaUnavailable>> = OnceLock::new();
    PROBE.get_or_init(|| run_probe(env)).clone()
}

fn run_probe(env: &ort::environment::Environment) -> Result<(), CudaUnavailable> {
    preload_gpu_libraries();
    let fail = |e: &dyn std::fmt::Display| CudaUnavailable::new(e.to_string());
    let mut session = ort::session::Session::builder(env)
        .map_err(|e| fail(&e))?
        .with_execution_providers([cuda_provider()])
        .map_err(|e| fail(&e))?
        .commit_from_memory(&identity_model())
        .map_err(|e| fail(&e))?;
    let x = ndarray::Array1::<f32>::from_vec(vec![1.0, 2.0]);
    let input = ort::value::TensorRef::from_array_view(x.view()).map_err(|e| fail(&e))?;
    let out = session.run(ort::inputs!["x" => input]).map_err(|e| fail(&e))?;
    let y = out["y"].try_extract_array::<f32>().map_err(|e| fail(&e))?;
    match y.iter().copied().collect::<Vec<f32>>() == [1.0, 2.0] {
        true => Ok(()),
        false => Err(CudaUnavailable::new(format!("the CUDA probe returned {y:?} for [1, 2]"))),
    }
}

/// `y = Identity(x)` over a float vector of two, serialised with the appliance's own ONNX writer.
fn identity_model() -> Vec<u8> {
    use care_modelio::onnx::{Dim, Graph, IR_VERSION, Model, Node, OPSET, ValueInfo, data_type};
    let value = |name: &str| ValueInfo { name: name.into(), elem_type: data_type::FLOAT, dims: vec![Dim::Fixed(2)] };
    let node = Node {
        op_type: "Identity".into(),
        name: "probe".into(),
        inputs: vec!["x".into()],
        outputs: vec!["y".into()],
        attributes: vec![],
        domain: String::new(),
    };
    let model = Model {
        ir_version: IR_VERSION,
        opsets: vec![(String::new(), OPSET)],
        producer_name: "care".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: String::new(),
        graph: Graph {
            name: "cuda_probe".into(),
            nodes: vec![node],
            inputs: vec![value("x")],
            outputs: vec![value("y")],
            ..Default::default()
        },
    };
    let mut bytes = Vec::new();
    model.write_to(&mut bytes).expect("writing to a Vec cannot fail");
    bytes
}

/// Loads the CUDA 13 and cuDNN libraries of the GPU variant by absolute path, so that the CUDA provider finds them
/// by name even when `LD_LIBRARY_PATH` was not set (e.g. `care doctor` from a shell). Each on its own and best
/// effort: one that is not there is left for the provider to name, without hiding the others.
pub(super) fn preload_gpu_libraries() {
    let prefix = Path::new(GPU_PREFIX);
    let sets = [
        (prefix.join("nvidia/cu13/lib"), ort::ep::cuda::CUDA_DYLIBS),
        (prefix.join("nvidia/cudnn/lib"), ort::ep::cuda::CUDNN_DYLIBS),
    ];
    for (dir, names) in sets.iter().filter(|(dir, _)| dir.is_dir()) {
        for name in names.iter() {
            if let Err(e) = ort::util::preload_dylib(dir.join(name)) {
                tracing::debug!(error = %e, "preloading {name} from {}", dir.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_library_is_read_from_the_loader_error() {
        let ort = "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot \
                   open shared object file: No such file or directory";
        assert_eq!(CudaUnavailable::new(ort).missing.as_deref(), Some("libcublasLt.so.13"));
        let own = "/usr/lib/care/libonnxruntime_providers_cuda.so: cannot open shared object file: No such file";
        assert_eq!(CudaUnavailable::new(own).missing.as_deref(), Some("libonnxruntime_providers_cuda.so"));
        let built = "CUDA execution provider is not enabled in this build.";
        assert_eq!(CudaUnavailable::new(built).missing.as_deref(), Some("libonnxruntime_providers_cuda.so"));
        assert_eq!(CudaUnavailable::new("CUDA failure 100: no CUDA-capable device").missing, None);
    }

    #[test]
    fn a_missing_driver_is_fixed_with_the_driver_and_a_missing_library_with_the_install_command() {
        let driver = CudaUnavailable::new("libcuda.so.1: cannot open shared object file");
        assert!(driver.fix_zh().contains("580"), "{}", driver.fix_zh());
        assert!(!driver.fix_zh().contains("pip"), "{}", driver.fix_zh());
        let lib = CudaUnavailable::new("x: libcudnn.so.9: cannot open shared object file");
        assert!(lib.fix_zh().contains(GPU_INSTALL), "{}", lib.fix_zh());
        assert!(lib.to_string().contains("缺少 libcudnn.so.9"), "{lib}");
    }

    fn unavailable() -> Result<(), CudaUnavailable> {
        Err(CudaUnavailable::new("libcudart.so.13: cannot open shared object file"))
    }

    #[test]
    fn each_request_gets_the_device_it_can_have_and_says_why_not_cuda() {
        let probe_never = || -> Result<(), CudaUnavailable> { panic!("the CPU needs no CUDA probe") };
        assert_eq!(choose("cpu", true, probe_never).unwrap().device, "cpu");
        let no_gpu = choose("auto", false, probe_never).unwrap();
        assert_eq!(no_gpu.device, "cpu");
        assert!(no_gpu.fallback.unwrap().reason.contains(NVIDIA_NODE));
        let broken = choose("auto", true, unavailable).unwrap();
        assert_eq!((broken.device, broken.fallback.unwrap().missing.as_deref()), ("cpu", Some("libcudart.so.13")));
        assert_eq!(
            choose("auto", true, || Ok(())).unwrap(),
            ServedDevice { requested: "auto".into(), device: "cuda", fallback: None }
        );
        let err = choose("cuda", true, unavailable).unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::Model);
        assert!(err.to_string().contains("libcudart.so.13"), "{err}");
        assert_eq!(choose("gpu", true, probe_never).unwrap_err().code(), crate::ErrorCode::InvalidInput);
    }
}
