//! `care-train gpu-check`: one short run that proves the GPU path, written for a machine lent for minutes.
//!
//! The report (one JSON file) holds the device facts (libtorch, CUDA load, GPU, driver), the autocast type in
//! effect under each `--precision` (and what plain `tch::autocast` gives, the old defect), and for each case a
//! Stage II step of the product's own loop ([`crate::train::Trainer`]: tokenise, query encoder trained fully,
//! Qwen3 document encoder through LoRA r = 32, α = 64, 1 positive + 7 negatives, t = 0.02, AdamW, clipping):
//!
//! - `parity`: the first loss of the same batch and weights on the CPU (fp32), on CUDA in fp32 and in bf16;
//! - `bN`: N queries × 8 documents per step on CUDA in bf16, step times after two warm-up steps, the peak memory
//!   (device memory in use, sampled, less the CUDA context) against [`crate::doctor::stage2_estimate`].
//!
//! Each case runs in a child process (the same binary, `--case`), so every peak is measured from a clean
//! allocator and a case that fails (out of memory, a missing kernel) is reported while the others still run.
//! Models are random with real shapes: `tiny` (2 layers) and `qwen3-0.6b` (Qwen3-Embedding-0.6B's configuration
//! with an e5-small-shaped query encoder). Inputs are fixed-length word sequences through a word-level tokenizer,
//! so both sides see exactly `query_len` and `doc_len` tokens (the timed cases) or mixed lengths with padding (the
//! parity case).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use care_formats::Pooling;
use care_formats::trainer::{Hyper, Lora, Precision, Stage2Options};
use care_formats::training::TrainingExample;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::doctor::{self, BertSize, Qwen3Size};
use crate::encoder::{Encoder, EncoderSettings, Model};
use crate::models::{Bert, BertConfig, Qwen3, Qwen3Config};
use crate::precision::{self, AutocastDevice};
use crate::train::{DocSide, LossConfig, TrainConfig, Trainer, select_trainable};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Where the JSON report goes.
    #[arg(long)]
    pub json: PathBuf,
    /// Model shapes to run: tiny, qwen3-0.6b.
    #[arg(long, value_delimiter = ',', default_value = "tiny,qwen3-0.6b")]
    pub models: Vec<String>,
    /// Queries per timed step (each with 8 documents); one case per value.
    #[arg(long, value_delimiter = ',', default_value = "4,8")]
    pub batches: Vec<usize>,
    /// Timed steps per case (after two warm-up steps).
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    #[arg(long, default_value_t = 256)]
    pub doc_len: usize,
    #[arg(long, default_value_t = 32)]
    pub query_len: usize,
    /// Seconds a case may take before it is stopped and reported as such.
    #[arg(long, default_value_t = 240)]
    pub case_timeout: u64,
    /// Internal: run one case (`MODEL:parity` or `MODEL:bN`) in this process and write its JSON to --json.
    #[arg(long, hide = true)]
    pub case: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub care_train: String,
    pub facts: serde_json::Value,
    pub autocast: Option<AutocastReport>,
    pub cases: Vec<serde_json::Value>,
    pub seconds: f64,
}

/// The type a matmul of two fp32 CUDA tensors comes out in.
#[derive(Debug, Serialize, Deserialize)]
pub struct AutocastReport {
    /// `tch::autocast(true, …)` alone: libtorch's default CUDA autocast type (what `--precision bf16` used to get).
    pub tch_autocast_default: String,
    /// Under this trainer's autocast for each precision.
    pub fp32: String,
    pub bf16: String,
    pub fp16: String,
    /// `at::autocast::get_autocast_dtype(CUDA)` inside the bf16 region.
    pub bf16_setting: String,
}

pub fn run(args: &Args) -> Result<()> {
    if let Some(case) = &args.case {
        // A case is its own process: libtorch_cuda must be loaded here too (tch does not link it).
        let _ = crate::cuda::load();
        let out = run_case(args, case)?;
        std::fs::write(&args.json, serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    let started = Instant::now();
    let cuda_error = crate::cuda::load().err();
    let cuda = tch::Cuda::is_available();
    let facts = serde_json::json!({
        "doctor": doctor::report(64.0, args.doc_len as f64),
        "cuda_load_error": cuda_error,
        "cuda_usable": cuda,
        "driver": nvidia_smi("driver_version"),
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "pytorch_cuda_alloc_conf": std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok(),
    });
    let autocast = if cuda { Some(autocast_report()?) } else { None };
    let mut cases = Vec::new();
    for model in &args.models {
        let mut names = vec![format!("{model}:parity")];
        if cuda {
            names.extend(args.batches.iter().map(|b| format!("{model}:b{b}")));
        }
        for name in names {
            eprintln!("[gpu-check {:>6.1}s] case {name}", started.elapsed().as_secs_f64());
            cases.push(child_case(args, &name));
        }
    }
    let report = Report {
        care_train: env!("CARGO_PKG_VERSION").into(),
        facts,
        autocast,
        cases,
        seconds: started.elapsed().as_secs_f64(),
    };
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)?;
    eprintln!("[gpu-check] wrote {} in {:.1} s", args.json.display(), report.seconds);
    Ok(())
}

/// Runs one case in a child process; its JSON, or what went wrong with the tail of its output.
fn child_case(args: &Args, name: &str) -> serde_json::Value {
    let json = args.json.with_extension(format!("{}.json", name.replace(':', "-")));
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("care-train"));
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["gpu-check", "--json"]).arg(&json).args(["--case", name]);
    cmd.args(["--steps", &args.steps.to_string(), "--doc-len", &args.doc_len.to_string()]);
    cmd.args(["--query-len", &args.query_len.to_string()]);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let outcome = (|| -> Result<serde_json::Value> {
        let mut child = cmd.spawn().context("starting the case")?;
        let deadline = Instant::now() + Duration::from_secs(args.case_timeout);
        // Drain the pipes on threads so a chatty child never blocks on a full pipe.
        let (so, se) = (child.stdout.take(), child.stderr.take());
        let read = |p: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                if let Some(mut p) = p {
                    let _ = p.read_to_string(&mut s);
                }
                s
            })
        };
        let (to, te) = (read(so.map(|p| Box::new(p) as _)), read(se.map(|p| Box::new(p) as _)));
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = format!("{}{}", to.join().unwrap_or_default(), te.join().unwrap_or_default());
        // libtorch's errors open with the message and end in a long C++ backtrace: keep the opening lines.
        let tail: String = log.lines().filter(|l| !l.starts_with("frame #")).collect::<Vec<_>>().join("\n");
        let tail: String = tail.chars().rev().take(2500).collect::<Vec<_>>().into_iter().rev().collect();
        match status {
            Some(s) if s.success() => {
                let text = std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
                Ok(serde_json::from_str(&text)?)
            }
            Some(s) => bail!("exited with {s}: {tail}"),
            None => bail!("stopped after {} s: {tail}", args.case_timeout),
        }
    })();
    let _ = std::fs::remove_file(&json);
    outcome.unwrap_or_else(|e| serde_json::json!({"case": name, "error": format!("{e:#}")}))
}

fn kind_name(k: Kind) -> String {
    format!("{k:?}")
}

/// The autocast type in effect, read off real CUDA matmuls.
fn autocast_report() -> Result<AutocastReport> {
    let dev = Device::Cuda(0);
    let a = Tensor::randn([64, 64], (Kind::Float, dev));
    let mm = || a.matmul(&a).kind();
    let under = |p: Precision| precision::train_autocast(dev, p, mm).map_err(anyhow::Error::msg);
    let setting = precision::with_autocast(AutocastDevice::Cuda, Some(Kind::BFloat16), || {
        precision::autocast_dtype(AutocastDevice::Cuda)
    })
    .and_then(|r| r)
    .map_err(anyhow::Error::msg)?;
    Ok(AutocastReport {
        tch_autocast_default: kind_name(tch::autocast(true, mm)),
        fp32: kind_name(under(Precision::Fp32)?),
        bf16: kind_name(under(Precision::Bf16)?),
        fp16: kind_name(under(Precision::Fp16)?),
        bf16_setting: kind_name(setting),
    })
}

/// The shapes of one model family.
struct Shapes {
    doc: Qwen3Config,
    query: BertConfig,
    doc_size: Qwen3Size,
    query_size: BertSize,
}

fn shapes(model: &str) -> Result<Shapes> {
    let qwen = |vocab, hidden, ffn, layers, heads, kv, hd| Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: Some(hd),
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 32768,
        attention_bias: false,
        attention_dropout: 0.0,
        hidden_act: "silu".into(),
        eos_token_id: Some(1),
        pad_token_id: None,
    };
    let bert = |vocab, hidden, ffn, layers, heads| BertConfig {
        model_type: "xlm-roberta".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        intermediate_size: ffn,
        max_position_embeddings: 514,
        type_vocab_size: 1,
        layer_norm_eps: 1e-5,
        pad_token_id: 0,
        bos_token_id: None,
        eos_token_id: None,
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        hidden_act: "gelu".into(),
    };
    let (doc, query) = match model {
        "tiny" => (qwen(4096, 64, 128, 2, 4, 2, 16), bert(4096, 32, 64, 2, 2)),
        "qwen3-0.6b" => (qwen(151_669, 1024, 3072, 28, 16, 8, 128), bert(250_037, 384, 1536, 12, 12)),
        other => bail!("unknown model {other:?}: use tiny or qwen3-0.6b"),
    };
    let doc_size = Qwen3Size {
        name: "case",
        vocab: doc.vocab_size as f64,
        hidden: doc.hidden_size as f64,
        ffn: doc.intermediate_size as f64,
        layers: doc.num_hidden_layers as f64,
        heads: doc.num_attention_heads as f64,
        kv_heads: doc.num_key_value_heads as f64,
        head_dim: doc.head_dim() as f64,
    };
    let query_size = BertSize {
        vocab: query.vocab_size as f64,
        hidden: query.hidden_size as f64,
        ffn: query.intermediate_size as f64,
        layers: query.num_hidden_layers as f64,
    };
    Ok(Shapes { doc, query, doc_size, query_size })
}

/// A word-level tokenizer over `w2 … w{n-1}` (ids 2…), `[PAD]` = 0, `<eos>` = 1: one word, one token.
pub fn word_tokenizer(n: usize) -> Result<tokenizers::Tokenizer> {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[PAD]".into(), 0.into());
    vocab.insert("<eos>".into(), 1.into());
    for i in 2..n {
        vocab.insert(format!("w{i}"), i.into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[PAD]"}
    });
    tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))
}

fn encoder(model: Model, pooling: Pooling, max_length: usize, eos: Option<u32>, device: Device) -> Result<Encoder> {
    let left_pad = matches!(model, Model::Qwen3(_));
    let mut tokenizer = word_tokenizer(4096)?;
    tokenizer
        .with_truncation(Some(tokenizers::TruncationParams { max_length, ..Default::default() }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let settings = EncoderSettings { pooling, max_length: max_length + 1, append_eos: eos };
    Ok(Encoder { model, tokenizer, settings, pad_id: 0, left_pad, source: PathBuf::new(), device })
}

/// Synthetic examples: a query of `query_len` words, 1 positive and 7 negatives of `doc_len` words (tokens: the
/// document side appends its end-of-text token, so `doc_len − 1` words). `ragged` varies lengths (padding).
fn examples(n: usize, query_len: usize, doc_len: usize, ragged: bool, seed: u64) -> Vec<TrainingExample> {
    let mut rng = crate::data::SplitMix::new(seed);
    let text = |len: usize, rng: &mut crate::data::SplitMix| {
        let len = if ragged { len / 2 + rng.below(len / 2 + 1) } else { len }.max(1);
        (0..len).map(|_| format!("w{}", 2 + rng.below(4094))).collect::<Vec<_>>().join(" ")
    };
    (0..n)
        .map(|_| TrainingExample {
            query: text(query_len, &mut rng),
            pos: vec![text(doc_len - 1, &mut rng)],
            neg: (0..7).map(|_| text(doc_len - 1, &mut rng)).collect(),
            prompt: None,
            kind: None,
        })
        .collect()
}

/// Stage II's defaults (care_formats::trainer) but for the batch, the steps, no warm-up and no checkpoints; groups of
/// 8 documents, as [`examples`] writes them.
fn train_config(batch: usize, steps: u64) -> TrainConfig {
    let hyper = Hyper {
        steps,
        batch_size: batch,
        warmup_ratio: 0.0,
        seed: 7,
        checkpoint_every: 0,
        keep_checkpoints: 1,
        ..Hyper::default()
    };
    TrainConfig::new(
        hyper,
        LossConfig { temperature: Stage2Options::default().temperature, group_size: 8, mse_weight: 0.0 },
    )
}

/// Random weights on the CPU (seeded, fp32), so every device starts from the same numbers.
fn cpu_models(s: &Shapes) -> Result<(Bert, Qwen3)> {
    tch::manual_seed(11);
    let q = Bert::random(&s.query, Device::Cpu)?;
    let d = Qwen3::random(&s.doc, Device::Cpu)?;
    Ok((q, d))
}

/// Copies of the weights on `dev`; the document side's frozen base in `doc_kind`.
fn moved(q: &Bert, d: &Qwen3, dev: Device, doc_kind: Kind) -> Result<(Bert, Qwen3)> {
    let mv = |w: &crate::weights::Weights, k: Kind| {
        let mut out = crate::weights::Weights::new();
        for (n, t) in w.iter() {
            out.insert(n.clone(), t.to_device(dev).to_kind(k));
        }
        out
    };
    Ok((Bert::new(&q.cfg, mv(&q.weights, Kind::Float))?, Qwen3::new(&d.cfg, mv(&d.weights, doc_kind))?))
}

/// One Stage II trainer over `q` and `d` (LoRA added to `d`), with `examples`.
fn encoders(q: Bert, d: Qwen3, dev: Device, args: &Args) -> Result<(Encoder, Encoder)> {
    let q = encoder(Model::Bert(q), Pooling::Mean, args.query_len, None, dev)?;
    let mut d = encoder(Model::Qwen3(d), Pooling::LastToken, args.doc_len, Some(1), dev)?;
    tch::manual_seed(5);
    let targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].map(String::from);
    let lora = Lora::default();
    d.model.add_lora(&targets, lora.rank, lora.alpha, 0.0);
    Ok((q, d))
}

fn trainer<'a>(
    q: &'a Encoder,
    d: &'a Encoder,
    ex: &'a [TrainingExample],
    cfg: TrainConfig,
    out: &Path,
) -> Result<Trainer<'a>> {
    let mut params = select_trainable(q, "query.", &|_| true);
    params.extend(select_trainable(d, "document.", &|n| n.contains("lora_")));
    Ok(Trainer::new(q, DocSide::Trainable(d), ex, cfg, params, out)?)
}

fn run_case(args: &Args, case: &str) -> Result<serde_json::Value> {
    let (model, what) = case.split_once(':').context("--case MODEL:parity or MODEL:bN")?;
    let s = shapes(model)?;
    let tmp = std::env::temp_dir().join(format!("care-gpu-check-{}", std::process::id()));
    let out = if what == "parity" { parity_case(args, &s, &tmp) } else { timed_case(args, &s, what, &tmp) };
    let _ = std::fs::remove_dir_all(&tmp);
    let mut v = out?;
    v["case"] = case.into();
    Ok(v)
}

/// The first loss of one padded batch on the CPU (fp32), and on CUDA in fp32 and bf16 when there is one; a CPU
/// step time as well (the tiny model only: the CPU reference of a 0.6B step is minutes).
fn parity_case(args: &Args, s: &Shapes, tmp: &Path) -> Result<serde_json::Value> {
    let ex = examples(16, args.query_len, args.doc_len.min(64), true, 3);
    let cfg = train_config(2, 1);
    let (q0, d0) = cpu_models(s)?;
    let first = |dev: Device, kind: Kind, p: Precision, timed: bool| -> Result<(f64, f64)> {
        let (q, d) = moved(&q0, &d0, dev, kind)?;
        let (q, d) = encoders(q, d, dev, args)?;
        let mut t = trainer(&q, &d, &ex, cfg.clone(), tmp)?;
        let started = Instant::now();
        let loss = precision::train_autocast(dev, p, || t.run(None)).map_err(anyhow::Error::msg)??[0].loss;
        let secs = started.elapsed().as_secs_f64();
        if timed {
            eprintln!("first loss on {dev:?} {p:?}: {loss:.6} ({secs:.2} s)");
        }
        Ok((loss, secs))
    };
    let (cpu, cpu_secs) = first(Device::Cpu, Kind::Float, Precision::Fp32, true)?;
    let mut v =
        serde_json::json!({"batch": 2, "documents": 16, "ragged": true, "cpu_fp32": cpu, "cpu_step_seconds": cpu_secs});
    if tch::Cuda::is_available() {
        let (f32_loss, _) = first(Device::Cuda(0), Kind::Float, Precision::Fp32, true)?;
        let (bf16_loss, _) = first(Device::Cuda(0), Kind::BFloat16, Precision::Bf16, true)?;
        v["cuda_fp32"] = f32_loss.into();
        v["cuda_bf16"] = bf16_loss.into();
        v["rel_diff_fp32"] = ((f32_loss - cpu).abs() / cpu.abs()).into();
        v["rel_diff_bf16"] = ((bf16_loss - cpu).abs() / cpu.abs()).into();
    }
    Ok(v)
}

/// `steps` timed bf16 Stage II steps of `batch` queries × 8 documents on CUDA, with the peak memory.
fn timed_case(args: &Args, s: &Shapes, what: &str, tmp: &Path) -> Result<serde_json::Value> {
    let batch: usize = what.strip_prefix('b').and_then(|b| b.parse().ok()).context("case bN")?;
    let dev = Device::Cuda(0);
    let _ = Tensor::zeros([1], (Kind::Float, dev)); // the CUDA context, before the baseline
    tch::Cuda::synchronize(0);
    let mem = MemSampler::start()?;
    let (q0, d0) = cpu_models(s)?;
    let (q, d) = moved(&q0, &d0, dev, Kind::BFloat16)?;
    drop((q0, d0));
    let (q, d) = encoders(q, d, dev, args)?;
    let ex = examples(batch * 4, args.query_len, args.doc_len, false, 9);
    let warm = 2;
    let mut t = trainer(&q, &d, &ex, train_config(batch, args.steps + warm), tmp)?;
    let log = precision::train_autocast(dev, Precision::Bf16, || t.run(None)).map_err(anyhow::Error::msg)??;
    tch::Cuda::synchronize(0);
    let peak = mem.stop();
    let mut secs: Vec<f64> = log.iter().skip(warm as usize).map(|m| m.seconds).collect();
    secs.sort_by(f64::total_cmp);
    let median = secs.get(secs.len() / 2).copied().unwrap_or(f64::NAN);
    let est = doctor::stage2_estimate(
        &s.doc_size,
        &s.query_size,
        ((batch * 8) as f64, args.doc_len as f64),
        (batch as f64, args.query_len as f64),
        Lora::default().rank as f64,
        false,
    );
    let mib = |b: f64| b / (1u64 << 20) as f64;
    Ok(serde_json::json!({
        "batch": batch, "documents": batch * 8, "doc_len": args.doc_len, "query_len": args.query_len,
        "precision": "bf16", "steps_timed": secs.len(),
        "step_seconds_median": median, "step_seconds_min": secs.first(), "step_seconds_max": secs.last(),
        "losses": log.iter().map(|m| m.loss).collect::<Vec<_>>(),
        "peak_mib": mib(peak as f64), "estimate_mib": mib(est.total), "estimate": est,
        "estimate_over_peak": est.total / peak as f64,
        "document_params": s.doc_size.params(), "query_params": s.query_size.params(),
        "lora_params": s.doc_size.lora_params(Lora::default().rank as f64),
    }))
}

/// Device memory in use, sampled every millisecond on a thread, less what was in use at the start (the CUDA
/// context). libtorch exposes no allocator statistics to tch, so this is what `nvidia-smi` would see for the
/// process: the caching allocator's reserve (with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` it tracks
/// what is allocated to within its 2 MiB pages).
struct MemSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl MemSampler {
    fn start() -> Result<Self> {
        let base = cuda_used()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(cuda_used().unwrap_or(0).saturating_sub(base));
                std::thread::sleep(Duration::from_millis(1));
            }
            peak.max(cuda_used().unwrap_or(0).saturating_sub(base))
        });
        Ok(Self { stop, handle })
    }

    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or(0)
    }
}

/// `total − free` of the current device, from the CUDA runtime libtorch already loaded.
#[allow(unsafe_code)]
fn cuda_used() -> Result<u64> {
    type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> i32;
    let this = libloading::os::unix::Library::this();
    // SAFETY: `cudaError_t cudaMemGetInfo(size_t*, size_t*)` from the libcudart that libtorch links; both
    // pointers are to locals.
    unsafe {
        let f = this.get::<MemGetInfo>(b"cudaMemGetInfo\0").context("cudaMemGetInfo not loaded")?;
        let (mut free, mut total) = (0usize, 0usize);
        let rc = f(&mut free, &mut total);
        if rc != 0 {
            bail!("cudaMemGetInfo returned {rc}");
        }
        Ok((total - free) as u64)
    }
}

fn nvidia_smi(field: &str) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args([format!("--query-gpu={field}"), "--format=csv,noheader".into()])
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

/// The CPU's model name (latencies compare only on the same CPU: reports name it).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into())
}
