//! Text encoders on ONNX Runtime (`ort`, loaded dynamically from the library shipped with the appliance).
//!
//! An [`OrtEncoder`] serves one graph of a model package: `tokenizer.json` (Hugging Face `tokenizers`), `model.onnx`
//! (or the int8 `model_int8.onnx`, [`Graph`]), and the manifest that says how to turn hidden states into a vector (pooling, width, prompt templates). Inputs are
//! sorted by length and cut into batches of at most `batch_tokens` padded tokens, so one long document does not
//! pad a whole batch. The device is decided by opening a real CUDA session ([`device`]): `cuda` fails without it,
//! `auto` falls back to the CPU out loud.
//! Each encoder's session is owned by its own thread ([`service`]): callers tokenise, hand over token ids and
//! wait, so concurrent queries are batched together and go ahead of document embedding. Calls are synchronous;
//! the HTTP layer runs them on its blocking pool, never on the async workers.

mod device;
mod service;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use care_formats::{Graph, ModelManifest, Pooling};
use ndarray::Array2;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelConfig {
    /// The ONNX Runtime shared library. Unset: `ORT_DYLIB_PATH`, then the GPU variant's ([`GPU_PREFIX`]) when
    /// installed, then the packaged (CPU) location.
    pub ort_library: Option<PathBuf>,
    /// "auto" (CUDA when a GPU is present and a CUDA session opens, else the CPU with a warning), "cpu" or "cuda"
    /// (fail at start, naming the missing library, if the CUDA provider cannot be created).
    pub device: String,
    /// Threads per inference call. 0: every core on CPU (the pool does not spin, so idle threads leave the cores to
    /// the rest of each search), ONNX Runtime's choice on CUDA. One encoder thread per model runs every call and
    /// merges concurrent queries into batches.
    pub threads: usize,
    /// Upper bound on padded tokens per inference call: concurrent queries merged into one batch, and documents
    /// embedded at once.
    pub batch_tokens: usize,
    /// Padded tokens of document embedding per inference call; a query waits for at most one such piece of an
    /// ingest in progress, and pieces alternate with query batches while searches keep coming. 0: 256 on CPU,
    /// where larger batches are no faster and only lengthen that wait; `batch_tokens` on CUDA.
    pub document_piece_tokens: usize,
    /// The default model file (E5S1, shipped by the .deb), imported and activated by `care serve` when the data
    /// directory has no model yet. A missing file is not an error: search then runs BM25 only.
    pub default_model: PathBuf,
    /// The nice value of document embedding on the CPU, set by the engine from `[background] nice`: above 0,
    /// documents run on a thread and session of their own at that priority.
    #[serde(skip)]
    pub documents_nice: i32,
}

/// Document pieces on CPU when `document_piece_tokens` is 0.
const CPU_DOCUMENT_PIECE_TOKENS: usize = 256;

impl ModelConfig {
    fn budgets(&self, device: &str) -> Budgets {
        let tokens = self.batch_tokens.max(512);
        let piece = match self.document_piece_tokens {
            0 if device == "cpu" => CPU_DOCUMENT_PIECE_TOKENS,
            0 => tokens,
            n => n,
        };
        Budgets { query_tokens: tokens, document_tokens: piece.min(tokens) }
    }
}

/// Where the .deb installs the default model.
pub const PACKAGED_DEFAULT_MODEL: &str = "/usr/share/care/models/e5-small-q4.bin";

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            ort_library: None,
            device: "auto".into(),
            threads: 0,
            batch_tokens: 8192,
            document_piece_tokens: 0,
            default_model: PathBuf::from(PACKAGED_DEFAULT_MODEL),
            documents_nice: 0,
        }
    }
}

/// The environment variable (and value) that stops ONNX Runtime's own usage telemetry (Microsoft's build records
/// events in the user's cache folder to send them): set by `care` at start, passed to sandboxed children, and in
/// the systemd unit.
pub const NO_TELEMETRY: (&str, &str) = ("ORT_DISABLE_TELEMETRY", "1");

/// Where the .deb installs the library.
pub const PACKAGED_ORT: &str = "/usr/lib/care/libonnxruntime.so.1.31.1";

static ORT: OnceLock<std::result::Result<(PathBuf, ort::environment::Environment), String>> = OnceLock::new();

/// Loads ONNX Runtime once per process; returns the library path and the shared environment. The GPU variant's
/// library (docs/admin/gpu.md) goes before the packaged CPU one, so installing it is all it takes.
pub fn init_runtime(cfg: &ModelConfig) -> Result<(PathBuf, ort::environment::Environment)> {
    ORT.get_or_init(|| {
        let path = find_runtime(cfg)?;
        let builder = ort::init_from(&path).map_err(|e| format!("loading {}: {e}", path.display()))?;
        let env = builder
            .with_name("care")
            .with_telemetry(false)
            .build()
            .map_err(|e| format!("starting ONNX Runtime: {e}"))?;
        Ok((path, env))
    })
    .clone()
    .map_err(Error::Model)
}

/// The ONNX Runtime library `cfg` resolves to, without loading it (a sandboxed child loads it instead).
pub fn runtime_library(cfg: &ModelConfig) -> Result<PathBuf> {
    find_runtime(cfg).map_err(Error::Model)
}

fn find_runtime(cfg: &ModelConfig) -> std::result::Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = cfg
        .ort_library
        .clone()
        .into_iter()
        .chain(std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from))
        .chain([gpu_runtime_library(), PathBuf::from(PACKAGED_ORT)])
        .collect();
    candidates.iter().find(|p| p.exists()).cloned().ok_or_else(|| {
        format!(
            "ONNX Runtime library not found (looked at {}); set model.ort_library or ORT_DYLIB_PATH \
             (`packaging/dev.sh setup` installs it from the onnxruntime PyPI wheel)",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

pub use device::choose as choose_device;
pub use device::{
    CudaUnavailable, GPU_INSTALL, GPU_PREFIX, NVIDIA_NODE, ServedDevice, gpu_present, gpu_runtime_library,
    served_device,
};

/// Whether a one-node CUDA session opens and runs with the loaded ONNX Runtime (loads it first); probed once.
pub fn probe_cuda(cfg: &ModelConfig) -> Result<std::result::Result<(), CudaUnavailable>> {
    let (_, env) = init_runtime(cfg)?;
    Ok(device::probe_cuda(&env))
}

/// The device `cfg.device` resolves to in this process, not counted as the encoders' (the OCR's sessions ask).
/// ONNX Runtime is loaded only when CUDA has to be probed.
pub fn device_for(cfg: &ModelConfig) -> Result<ServedDevice> {
    device::choose(&cfg.device, gpu_present(), || match init_runtime(cfg) {
        Ok((_, env)) => device::probe_cuda(&env),
        Err(e) => Err(CudaUnavailable::new(e.to_string())),
    })
}

/// `builder` on `device` ("cuda" or "cpu"): on CUDA the provider is registered with `error_on_failure`, so that a
/// provider that cannot load fails the session ([`Error::CudaUnavailable`]) instead of leaving it on the CPU
/// unnoticed. The encoders' and the OCR's sessions are built through it.
pub(crate) fn on_device(
    builder: ort::session::builder::SessionBuilder,
    device: &str,
) -> Result<ort::session::builder::SessionBuilder> {
    match device {
        "cuda" => builder
            .with_execution_providers([device::cuda_provider()])
            .map_err(|e| Error::CudaUnavailable(CudaUnavailable::new(e.to_string()))),
        _ => Ok(builder),
    }
}

/// The device the encoder sessions get under `cfg.device`, logged and counted when `auto` falls back to the CPU;
/// `cuda` without a usable CUDA provider is [`Error::CudaUnavailable`]. `care serve` calls it at start.
pub fn resolve_device(cfg: &ModelConfig) -> Result<ServedDevice> {
    let (_, env) = init_runtime(cfg)?;
    let served = device::choose(&cfg.device, gpu_present(), || device::probe_cuda(&env))?;
    device::record(&served);
    Ok(served)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    Query,
    Document,
}

pub use service::EncoderStats;
use service::{BatchRunner, Budgets, EncoderService, Lane};

pub struct OrtEncoder {
    dir: PathBuf,
    manifest: ModelManifest,
    tokenizer: tokenizers::Tokenizer,
    service: EncoderService,
    pub device: &'static str,
}

/// The session and what it takes to turn its outputs into vectors; lives on the encoder's service thread.
struct OrtRunner {
    dir: PathBuf,
    manifest: ModelManifest,
    session: ort::session::Session,
    pad_id: u32,
    input_names: Vec<String>,
    output_name: String,
}

impl std::fmt::Debug for OrtEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtEncoder").field("dir", &self.dir).field("device", &self.device).finish()
    }
}

fn model_err(dir: &Path, what: impl std::fmt::Display) -> Error {
    Error::Model(format!("model package {}: {what}", dir.display()))
}

impl OrtEncoder {
    /// Loads a package folder's fp32 graph, verifying its files against the manifest hashes.
    pub fn load(dir: &Path, cfg: &ModelConfig) -> Result<Self> {
        Self::load_graph(dir, Graph::Fp32, cfg)
    }

    /// Loads one of a package folder's graphs, verifying its files against the manifest hashes.
    pub fn load_graph(dir: &Path, graph: Graph, cfg: &ModelConfig) -> Result<Self> {
        let manifest = ModelManifest::load(dir).map_err(|e| Error::Model(e.to_string()))?;
        manifest.verify_files(dir).map_err(|e| Error::Model(e.to_string()))?;
        if !manifest.files.contains_key(graph.file()) {
            return Err(model_err(dir, format!("模型包没有 {} ({graph} graph not in the manifest)", graph.file())));
        }
        Self::load_with_manifest(dir, graph, manifest, cfg)
    }

    pub fn load_with_manifest(dir: &Path, graph: Graph, manifest: ModelManifest, cfg: &ModelConfig) -> Result<Self> {
        let (_, env) = init_runtime(cfg)?;
        let mut tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| model_err(dir, format!("tokenizer.json: {e}")))?;
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: manifest.max_length,
                ..Default::default()
            }))
            .map_err(|e| model_err(dir, e))?;
        tokenizer.with_padding(None);
        let pad_id = ["<pad>", "[PAD]", "<|endoftext|>"].iter().find_map(|t| tokenizer.token_to_id(t)).unwrap_or(0);
        let (runner, device) = OrtRunner::build(dir, graph, &manifest, cfg, &env, pad_id)?;
        let name = format!("{}@{} {graph}", manifest.name, manifest.version);
        let service = if device == "cpu" && cfg.documents_nice > 0 {
            // Documents (ingest, re-embedding) get a session of their own at background priority (see
            // `encoders/service.rs`); on a GPU the one session's queue keeps queries first.
            let (budgets, nice) = (cfg.budgets(device), cfg.documents_nice);
            let (dir, manifest, cfg) = (dir.to_path_buf(), manifest.clone(), cfg.clone());
            let documents = move || Ok(OrtRunner::build(&dir, graph, &manifest, &cfg, &env, pad_id)?.0);
            EncoderService::start_split(&name, runner, budgets, nice, documents)?
        } else {
            EncoderService::start(&name, runner, cfg.budgets(device))?
        };
        Ok(OrtEncoder { dir: dir.to_path_buf(), manifest, tokenizer, service, device })
    }

    pub fn manifest(&self) -> &ModelManifest {
        &self.manifest
    }
    pub fn width(&self) -> usize {
        self.manifest.width
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What this encoder's service thread has done: requests, batches run, the largest batch.
    pub fn stats(&self) -> EncoderStats {
        self.service.stats()
    }

    /// Token ids as the model sees them (prompt applied, special tokens added, truncated).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| model_err(&self.dir, e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Queries go ahead of documents on the service thread and are batched with other callers' queries.
    pub fn encode(&self, texts: &[&str], kind: TextKind) -> Result<Vec<Vec<f32>>> {
        let (rendered, lane): (Vec<String>, Lane) = match kind {
            TextKind::Query => (texts.iter().map(|t| self.manifest.render_query(t)).collect(), Lane::Query),
            TextKind::Document => (texts.iter().map(|t| self.manifest.render_document(t)).collect(), Lane::Document),
        };
        self.encode_on(&rendered, lane)
    }

    /// Encodes texts exactly as given (no prompt template), as document work.
    pub fn encode_rendered(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        self.encode_on(texts, Lane::Document)
    }

    /// Tokenises on the calling thread (so the service thread only runs the model), then waits for the vectors.
    fn encode_on(&self, texts: &[String], lane: Lane) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = match texts {
            [] => return Ok(Vec::new()),
            [one] => vec![self.token_ids(one)?],
            many => self
                .tokenizer
                .encode_batch(many.iter().map(String::as_str).collect::<Vec<_>>(), true)
                .map_err(|e| model_err(&self.dir, e))?
                .into_iter()
                .map(|e| e.get_ids().to_vec())
                .collect(),
        };
        self.service.encode(ids, lane)
    }
}

/// The session for `graph` of the package in `dir` on the configured device, and the device's name.
fn build_session(
    dir: &Path,
    graph: Graph,
    cfg: &ModelConfig,
    env: &ort::environment::Environment,
) -> Result<(ort::session::Session, &'static str)> {
    let device = resolve_device(cfg)?.device;
    let mut builder = ort::session::Session::builder(env)
        .map_err(|e| model_err(dir, e))?
        .with_optimization_level(ort::session::builder::GraphOptimizationLevel::Level3)
        .map_err(|e| model_err(dir, e))?;
    let threads = match cfg.threads {
        0 if device == "cpu" => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    if threads > 0 {
        builder = builder.with_intra_threads(threads).map_err(|e| model_err(dir, e))?;
    }
    // Pool threads sleep between calls instead of spinning: a spinning pool holds the cores that the rest of
    // each search (TLS, BM25, SQLite, snippets) and ingest need while the encoder thread waits for work.
    builder = builder.with_intra_op_spinning(false).map_err(|e| model_err(dir, e))?;
    let session = on_device(builder, device)?
        .commit_from_file(dir.join(graph.file()))
        .map_err(|e| model_err(dir, format!("{}: {e}", graph.file())))?;
    Ok((session, device))
}

impl OrtRunner {
    /// A session of `graph` on the configured device, checked for the inputs and output the runner feeds and reads.
    fn build(
        dir: &Path,
        graph: Graph,
        manifest: &ModelManifest,
        cfg: &ModelConfig,
        env: &ort::environment::Environment,
        pad_id: u32,
    ) -> Result<(Self, &'static str)> {
        let (session, device) = build_session(dir, graph, cfg, env)?;
        let input_names: Vec<String> = session.inputs().iter().map(|i| i.name().to_string()).collect();
        for n in &input_names {
            if !matches!(n.as_str(), "input_ids" | "attention_mask" | "token_type_ids" | "position_ids") {
                return Err(model_err(dir, format!("{} has an unexpected input {n:?}", graph.file())));
            }
        }
        let output_name = session
            .outputs()
            .first()
            .map(|o| o.name().to_string())
            .ok_or_else(|| model_err(dir, format!("{} has no output", graph.file())))?;
        let manifest = manifest.clone();
        Ok((OrtRunner { dir: dir.to_path_buf(), manifest, session, pad_id, input_names, output_name }, device))
    }
}

impl BatchRunner for OrtRunner {
    fn run(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let (input_ids, mask) = self.pad(batch);
        let shape = input_ids.dim();
        let zeros = Array2::<i64>::zeros(shape);
        let positions = Array2::from_shape_fn(shape, |(_, c)| c as i64);
        let mut inputs: Vec<(std::borrow::Cow<'_, str>, ort::session::SessionInputValue<'_>)> = Vec::new();
        for name in &self.input_names {
            let arr = match name.as_str() {
                "input_ids" => &input_ids,
                "attention_mask" => &mask,
                "position_ids" => &positions,
                _ => &zeros,
            };
            let t = ort::value::TensorRef::from_array_view(arr.view()).map_err(|e| model_err(&self.dir, e))?;
            inputs.push((name.clone().into(), t.into()));
        }
        let outputs = self.session.run(inputs).map_err(|e| model_err(&self.dir, e))?;
        let out = outputs[self.output_name.as_str()].try_extract_array::<f32>().map_err(|e| model_err(&self.dir, e))?;
        let hidden = *out.shape().last().unwrap_or(&0);
        if hidden < self.manifest.width {
            return Err(model_err(
                &self.dir,
                format!("output width {hidden} < manifest width {}", self.manifest.width),
            ));
        }
        Ok((0..batch.len()).map(|r| pooled(&self.manifest, &out, &mask, r)).collect())
    }
}

impl OrtRunner {
    /// Ids and attention mask padded to the batch's longest sequence; on the left for last-token pooling, so the
    /// last position holds every sequence's last token.
    fn pad(&self, batch: &[&[u32]]) -> (Array2<i64>, Array2<i64>) {
        let n = batch.len();
        let seq = batch.iter().map(|b| b.len()).max().unwrap_or(1).max(1);
        let left = self.manifest.pooling == Pooling::LastToken;
        let mut input_ids = Array2::<i64>::from_elem((n, seq), self.pad_id as i64);
        let mut mask = Array2::<i64>::zeros((n, seq));
        for (r, ids) in batch.iter().enumerate() {
            let off = if left { seq - ids.len() } else { 0 };
            for (c, &id) in ids.iter().enumerate() {
                input_ids[[r, off + c]] = id as i64;
                mask[[r, off + c]] = 1;
            }
        }
        (input_ids, mask)
    }
}

/// Row `r`'s vector: pooled per the manifest unless the graph already pools, cut to the manifest width
/// (Matryoshka) and normalised.
fn pooled(manifest: &ModelManifest, out: &ndarray::ArrayViewD<'_, f32>, mask: &Array2<i64>, r: usize) -> Vec<f32> {
    let (hidden, seq) = (*out.shape().last().unwrap_or(&0), mask.ncols());
    let mut v = vec![0f32; hidden];
    let mut take = |c: usize| v.iter_mut().enumerate().for_each(|(h, x)| *x += out[[r, c, h]]);
    match manifest.pooling {
        _ if out.ndim() == 2 => v.iter_mut().enumerate().for_each(|(h, x)| *x = out[[r, h]]),
        Pooling::Cls => take(0),
        Pooling::LastToken => take(seq - 1),
        Pooling::Mean => {
            let positions: Vec<usize> = (0..seq).filter(|&c| mask[[r, c]] == 1).collect();
            positions.iter().for_each(|&c| take(c));
            let count = positions.len().max(1) as f32;
            v.iter_mut().for_each(|x| *x /= count);
        }
    }
    v.truncate(manifest.width);
    if manifest.normalize {
        l2_normalize(&mut v);
    }
    v
}

pub fn l2_normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// Inner product (SIMD picked at run time, see [`crate::kernels`]).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    crate::kernels::dot(a, b)
}
