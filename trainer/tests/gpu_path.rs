//! The GPU path's CPU-checkable parts (issue: "The GPU path, real"): the autocast type each `--precision` puts in
//! effect, fp16 refused for training, bf16 and fp32 Stage II losses agreeing, fused attention equal to eager
//! (grouped-query and padded), the flat AdamW equal to the per-tensor update, LoRA over a bf16 base with fp32
//! adapters, the doctor's memory estimate, and `care-train gpu-check` on a machine without a GPU.

use std::collections::BTreeMap;
use std::path::PathBuf;

use care_formats::trainer::{Hyper, Precision};
use care_formats::training::TrainingExample;
use care_trainer::doctor::{E5_SMALL, QWEN3_SIZES, stage2_estimate};
use care_trainer::encoder::{Encoder, EncoderSettings, Model};
use care_trainer::models::linear::Linear;
use care_trainer::models::{Attention, Bert, BertConfig, Qwen3, Qwen3Config};
use care_trainer::optim::{AdamW, AdamWConfig};
use care_trainer::precision::{self, AutocastDevice, PrecisionExt};
use care_trainer::train::{DocSide, LossConfig, TrainConfig, Trainer, select_trainable};
use care_trainer::weights::Weights;
use tch::{Device, Kind, Tensor};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn qwen_cfg() -> Qwen3Config {
    Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: Some(8),
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        attention_bias: false,
        attention_dropout: 0.0,
        hidden_act: "silu".into(),
        eos_token_id: Some(1),
        pad_token_id: None,
    }
}

fn bert_cfg() -> BertConfig {
    BertConfig {
        model_type: "xlm-roberta".into(),
        vocab_size: 64,
        hidden_size: 16,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        intermediate_size: 32,
        max_position_embeddings: 40,
        type_vocab_size: 1,
        layer_norm_eps: 1e-5,
        pad_token_id: 0,
        bos_token_id: None,
        eos_token_id: None,
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        hidden_act: "gelu".into(),
    }
}

/// Left-padded (Qwen3) or right-padded (BERT) ids with one full row, and a batch without padding.
fn batches(left: bool) -> [(Tensor, Tensor); 2] {
    let rows: [&[i64]; 3] = [&[5, 6, 7, 8, 9, 10], &[11, 12], &[13, 14, 15, 16]];
    let mut ids = vec![0i64; 18];
    for (i, r) in rows.iter().enumerate() {
        let off = if left { 6 - r.len() } else { 0 };
        ids[i * 6 + off..i * 6 + off + r.len()].copy_from_slice(r);
    }
    let padded = Tensor::from_slice(&ids).view([3, 6]);
    let full = Tensor::arange_start(2, 20, (Kind::Int64, Device::Cpu)).view([3, 6]);
    [(padded.shallow_clone(), padded.ne(0).to_kind(Kind::Int64)), (full.shallow_clone(), full.ones_like())]
}

/// Forward + a loss's gradient with respect to every weight, under `imp`.
fn run_model(
    fwd: &dyn Fn(&Tensor, &Tensor) -> Tensor,
    ws: &Weights,
    ids: &Tensor,
    mask: &Tensor,
) -> (Tensor, Vec<Tensor>) {
    for (_, w) in ws.iter() {
        let mut w = w.shallow_clone();
        let _ = w.requires_grad_(true);
        w.zero_grad();
    }
    let h = fwd(ids, mask);
    let m = mask.to_kind(Kind::Float).unsqueeze(-1);
    // A fixed random projection: Σ h² of a (Layer/RMS)-normed output is nearly constant, so its gradient would be
    // rounding noise.
    let r = Tensor::from_slice(&(0..h.numel()).map(|i| ((i * 7919 % 997) as f32 / 997.0) - 0.5).collect::<Vec<_>>())
        .view(h.size().as_slice());
    (&h * &m * r).sum(Kind::Float).backward();
    let grads = ws.iter().map(|(_, w)| w.grad().copy()).collect();
    (h.detach(), grads)
}

fn assert_close(a: &Tensor, b: &Tensor, mask: Option<&Tensor>, tol: f64, what: &str) {
    let d = (a - b).abs();
    let d = match mask {
        Some(m) => d * m.to_kind(Kind::Float).unsqueeze(-1),
        None => d,
    };
    let err = d.max().double_value(&[]);
    let scale = b.abs().max().double_value(&[]).max(1e-3);
    assert!(err <= tol * scale + 1e-6, "{what}: max |Δ| {err} (scale {scale})");
}

#[test]
fn fused_attention_equals_eager_for_qwen3_with_gqa_and_padding_and_for_bert() {
    let _guard = serial();
    tch::manual_seed(3);
    let mut q = Qwen3::random(&qwen_cfg(), Device::Cpu).unwrap();
    for (ids, mask) in batches(true) {
        let mut out = Vec::new();
        for imp in [Attention::Eager, Attention::Sdpa] {
            q.attention = imp;
            out.push(run_model(&|i, m| q.forward_t(i, m, true), &q.weights, &ids, &mask));
        }
        assert_close(&out[1].0, &out[0].0, Some(&mask), 1e-5, "qwen3 hidden states");
        for (g1, g0) in out[1].1.iter().zip(&out[0].1) {
            assert_close(g1, g0, None, 1e-4, "qwen3 gradients");
        }
    }
    let mut b = Bert::random(&bert_cfg(), Device::Cpu).unwrap();
    for (ids, mask) in batches(false) {
        let mut out = Vec::new();
        for imp in [Attention::Eager, Attention::Sdpa] {
            b.attention = imp;
            out.push(run_model(&|i, m| b.forward_t(i, m, true), &b.weights, &ids, &mask));
        }
        assert_close(&out[1].0, &out[0].0, Some(&mask), 1e-5, "bert hidden states");
        for (g1, g0) in out[1].1.iter().zip(&out[0].1) {
            assert_close(g1, g0, None, 1e-4, "bert gradients");
        }
    }
}

#[test]
fn each_precision_puts_its_own_type_in_effect_and_fp16_cannot_train() {
    let _guard = serial();
    let a = Tensor::randn([8, 8], (Kind::Float, Device::Cpu));
    // The CPU's autocast is driven by the same code as CUDA's (only the device type differs): what a matmul
    // produces is the type in effect.
    for (p, want) in [(Precision::Fp32, Kind::Float), (Precision::Bf16, Kind::BFloat16), (Precision::Fp16, Kind::Half)]
    {
        let (mm, setting) = precision::with_autocast(AutocastDevice::Cpu, p.autocast_kind(), || {
            (a.matmul(&a).kind(), precision::autocast_dtype(AutocastDevice::Cpu).unwrap())
        })
        .unwrap();
        assert_eq!(mm, want, "{p:?}: matmul under autocast");
        if p != Precision::Fp32 {
            assert_eq!(setting, want, "{p:?}: libtorch's autocast type");
        }
        assert!(!precision::autocast_enabled(AutocastDevice::Cpu).unwrap(), "{p:?}: autocast left on");
        assert_eq!(a.matmul(&a).kind(), Kind::Float, "{p:?}: state restored");
    }
    // Nested regions: the loss runs without autocast inside a bf16 step.
    let inner = precision::with_autocast(AutocastDevice::Cpu, Some(Kind::BFloat16), || {
        precision::without_autocast(|| a.matmul(&a).kind())
    })
    .unwrap();
    assert_eq!(inner, Kind::Float);
    // On the CPU, training runs as is (fp32), whatever the precision.
    assert_eq!(precision::train_autocast(Device::Cpu, Precision::Bf16, || a.matmul(&a).kind()).unwrap(), Kind::Float);
    assert_eq!(Precision::Bf16.frozen_kind(Device::Cuda(0)), Kind::BFloat16);
    assert_eq!(Precision::Bf16.frozen_kind(Device::Cpu), Kind::Float);
    assert!(Precision::Fp16.check_trainable().unwrap_err().contains("loss scaling"));
    assert!(Precision::Bf16.check_trainable().is_ok() && Precision::Fp32.check_trainable().is_ok());
    // The CLI refuses fp16 training before it loads anything.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_care-train"))
        .args(["--device", "cpu", "stage2", "--query", "/nonexistent", "--document", "/nonexistent"])
        .args(["--train", "/nonexistent", "--out", "/tmp/care-fp16-refused", "--precision", "fp16"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("fp16 cannot train"), "{err}");
}

fn encoders(doc_kind: Kind) -> (Encoder, Encoder) {
    tch::manual_seed(21);
    let b = Bert::random(&bert_cfg(), Device::Cpu).unwrap();
    let q0 = Qwen3::random(&qwen_cfg(), Device::Cpu).unwrap();
    let mut w = Weights::new();
    for (n, t) in q0.weights.iter() {
        w.insert(n.clone(), t.to_kind(doc_kind));
    }
    let q = Qwen3::new(&qwen_cfg(), w).unwrap();
    let enc = |model, pooling, eos, left_pad| Encoder {
        model,
        tokenizer: care_trainer::gpu_check::word_tokenizer(64).unwrap(),
        settings: EncoderSettings { pooling, max_length: 32, append_eos: eos },
        pad_id: 0,
        left_pad,
        source: PathBuf::new(),
        device: Device::Cpu,
    };
    let qe = enc(Model::Bert(b), care_formats::Pooling::Mean, None, false);
    let mut de = enc(Model::Qwen3(q), care_formats::Pooling::LastToken, Some(1), true);
    tch::manual_seed(5);
    // A random B (not zero) so the adapters matter to the loss from the first step.
    de.model.add_lora(&["q_proj".into(), "v_proj".into(), "gate_proj".into()], 4, 8.0, 0.05);
    (qe, de)
}

fn examples() -> Vec<TrainingExample> {
    let w = |i: usize| format!("w{}", 2 + i % 62);
    (0..8)
        .map(|i| TrainingExample {
            query: format!("{} {} {}", w(i), w(i * 7 + 1), w(i * 3 + 2)),
            pos: vec![format!("{} {} {} {} {}", w(i), w(i * 7 + 1), w(i + 5), w(i * 11), w(i + 3))],
            neg: vec![format!("{} {}", w(i + 9), w(i * 5 + 4)), format!("{} {} {}", w(i + 2), w(i), w(i * 13))],
            prompt: None,
            kind: None,
        })
        .collect()
}

fn cfg() -> TrainConfig {
    TrainConfig::new(
        Hyper {
            steps: 3,
            batch_size: 4,
            sub_batch: 0,
            lr: 1e-3,
            warmup_ratio: 0.0,
            weight_decay: 0.05,
            max_grad_norm: 1.0,
            seed: 1,
            checkpoint_every: 0,
            keep_checkpoints: 1,
            ..Hyper::default()
        },
        LossConfig { temperature: 0.02, group_size: 3, mse_weight: 0.0 },
    )
}

#[test]
fn lora_over_a_bf16_base_keeps_fp32_adapters_and_its_bf16_loss_agrees_with_fp32() {
    let _guard = serial();
    let ex = examples();
    let dir = tempfile::tempdir().unwrap();
    let mut losses = BTreeMap::new();
    for (name, doc_kind, autocast) in [("fp32", Kind::Float, None), ("bf16", Kind::BFloat16, Some(Kind::BFloat16))] {
        let (q, d) = encoders(doc_kind);
        let mut params = select_trainable(&q, "query.", &|_| true);
        params.extend(select_trainable(&d, "document.", &|n| n.contains("lora_")));
        for (n, p) in &params {
            assert_eq!(p.kind(), Kind::Float, "{name}: trainable {n} must be fp32");
        }
        let frozen: Vec<Kind> =
            d.named_parameters().iter().filter(|(n, _)| !n.contains("lora_")).map(|(_, t)| t.kind()).collect();
        assert!(frozen.iter().all(|k| *k == doc_kind), "{name}: frozen base kinds {frozen:?}");
        let mut t = Trainer::new(&q, DocSide::Trainable(&d), &ex, cfg(), params, dir.path()).unwrap();
        let log = precision::with_autocast(AutocastDevice::Cpu, autocast, || t.run(None)).unwrap().unwrap();
        for (n, p) in &t.opt.params {
            assert_eq!(p.grad().kind(), Kind::Float, "{name}: gradient of {n}");
        }
        losses.insert(name, log.iter().map(|m| m.loss).collect::<Vec<_>>());
    }
    let (a, b) = (&losses["fp32"], &losses["bf16"]);
    assert!(a.iter().all(|l| l.is_finite()) && b.iter().all(|l| l.is_finite()), "{losses:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 0.05 * x.abs().max(1.0), "bf16 loss {y} vs fp32 {x} ({losses:?})");
    }
}

/// The per-tensor AdamW this trainer used before the flat buffers, as the reference.
fn reference_step(
    params: &BTreeMap<String, Tensor>,
    m: &mut BTreeMap<String, Tensor>,
    v: &mut BTreeMap<String, Tensor>,
    c: AdamWConfig,
    lr: f64,
    t: i32,
    clip: f64,
) {
    tch::no_grad(|| {
        let norms: Vec<Tensor> = params
            .values()
            .filter_map(|p| {
                let g = p.grad();
                g.defined().then(|| g.norm().pow_tensor_scalar(2))
            })
            .collect();
        let total = Tensor::stack(&norms, 0).sum(Kind::Float).sqrt().double_value(&[]);
        if total > clip {
            for p in params.values() {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.g_mul_scalar_(clip / (total + 1e-6));
                }
            }
        }
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for (n, p) in params {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut p = p.shallow_clone();
            let mm = m.get_mut(n).unwrap();
            let _ = mm.g_mul_scalar_(c.beta1).g_add_(&(&g * (1.0 - c.beta1)));
            let vv = v.get_mut(n).unwrap();
            let _ = vv.g_mul_scalar_(c.beta2).g_add_(&(&g * &g * (1.0 - c.beta2)));
            let _ = p.g_mul_scalar_(1.0 - lr * c.weight_decay);
            let denom = (&*vv / bc2).sqrt() + c.eps;
            let _ = p.g_sub_(&((&*mm / bc1) / denom * lr));
        }
    });
}

#[test]
fn flat_adamw_updates_equal_the_per_tensor_ones() {
    let _guard = serial();
    tch::manual_seed(8);
    let shapes: [&[i64]; 4] = [&[3, 5], &[7], &[2, 2, 2], &[4]];
    let make = || -> BTreeMap<String, Tensor> {
        tch::manual_seed(8);
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("p{i}"), Tensor::randn(*s, (Kind::Float, Device::Cpu)).set_requires_grad(true)))
            .collect()
    };
    let x = Tensor::randn([16], (Kind::Float, Device::Cpu));
    // p3 never gets a gradient (a weight the forward does not use): it must stay untouched, as before.
    let loss = |p: &BTreeMap<String, Tensor>, k: f64| {
        let s = (p["p0"].sum(Kind::Float) * &x.get(0)
            + (&p["p1"] * &p["p1"]).sum(Kind::Float)
            + p["p2"].pow_tensor_scalar(3).sum(Kind::Float))
            * k;
        s.backward();
    };
    let c = AdamWConfig { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.05 };
    for clip in [1e9, 0.5] {
        let mine = make();
        let mut opt = AdamW::new(c, mine.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect());
        let theirs = make();
        let mut m: BTreeMap<String, Tensor> = theirs.iter().map(|(n, t)| (n.clone(), t.zeros_like())).collect();
        let mut v = m.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        for t in 1..=4 {
            opt.zero_grad();
            loss(&mine, f64::from(t));
            opt.clip_grad_norm(clip);
            opt.step(0.1);
            for p in theirs.values() {
                p.grad().defined().then(|| p.shallow_clone().zero_grad());
            }
            loss(&theirs, f64::from(t));
            reference_step(&theirs, &mut m, &mut v, c, 0.1, t, clip);
        }
        for (n, p) in &mine {
            let (a, b) = (p.detach(), theirs[n].detach());
            let tol = if clip > 1e8 { 0.0 } else { 1e-6 };
            let err = (&a - &b).abs().max().double_value(&[]);
            assert!(err <= tol, "clip {clip}: {n} differs by {err}");
            assert!(opt.m[n].size() == p.size(), "moments keep their shapes by name");
        }
        assert_eq!(
            Vec::<f32>::try_from(&mine["p3"].detach()).unwrap(),
            Vec::<f32>::try_from(&make()["p3"].detach()).unwrap()
        );
    }
}

#[test]
fn lora_adapters_are_fp32_over_a_bf16_base_and_run_without_autocast() {
    let _guard = serial();
    let mut w = Weights::new();
    w.insert("l.weight", Tensor::randn([6, 4], (Kind::BFloat16, Device::Cpu)));
    let mut lin = Linear::load(&w, "l", 4, 6, false).unwrap();
    lin.add_lora(&mut w, 2, 4.0, 0.1);
    let l = lin.lora.as_ref().unwrap();
    assert_eq!((l.a.kind(), l.b.kind()), (Kind::Float, Kind::Float));
    let mut a = l.a.shallow_clone();
    let _ = a.requires_grad_(true);
    let y = lin.forward(&Tensor::randn([3, 4], (Kind::BFloat16, Device::Cpu)));
    assert_eq!(y.kind(), Kind::BFloat16);
    y.to_kind(Kind::Float).sum(Kind::Float).backward();
    assert_eq!(a.grad().kind(), Kind::Float, "the adapter's gradient is fp32");
}

#[test]
fn doctor_estimate_counts_weights_adapters_and_activations_by_shape() {
    let small = QWEN3_SIZES[0];
    let e = stage2_estimate(&small, &E5_SMALL, (64.0, 256.0), (8.0, 32.0), 32.0, false);
    // 0.6B in bf16 ≈ 1.1 GiB; LoRA r=32 on 28 layers ≈ 20M adapters × 18 bytes.
    assert!((1.1e9..1.25e9).contains(&e.document_weights), "{e:?}");
    assert!((0.3e9..0.4e9).contains(&e.lora_state), "{e:?}");
    // 16,384 document tokens × 28 layers × ~62 KB: the activations dominate.
    assert!(e.document_activations > 10.0 * e.document_weights, "{e:?}");
    let padded = stage2_estimate(&small, &E5_SMALL, (64.0, 256.0), (8.0, 32.0), 32.0, true);
    assert!(padded.document_activations > e.document_activations, "padding repeats K/V to every head");
    let twice = stage2_estimate(&small, &E5_SMALL, (128.0, 256.0), (16.0, 32.0), 32.0, false);
    let act = |x: &care_trainer::doctor::Stage2Estimate| x.document_activations + x.query_activations;
    assert!((act(&twice) / act(&e) - 2.0).abs() < 1e-9, "activations are linear in the batch");
}

#[test]
fn gpu_check_without_a_gpu_reports_cpu_parity_and_says_cuda_is_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("check.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_care-train"))
        .args(["gpu-check", "--models", "tiny", "--steps", "2", "--doc-len", "24", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["facts"]["cuda_usable"], false, "{r}");
    assert!(r["autocast"].is_null());
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 1, "only the CPU parity case without CUDA: {r}");
    assert_eq!(cases[0]["case"], "tiny:parity");
    let loss = cases[0]["cpu_fp32"].as_f64().unwrap();
    // 2 queries' InfoNCE over 16 documents from random encoders.
    assert!(loss.is_finite() && loss > 0.5, "{r}");
    assert!(cases[0].get("cuda_bf16").is_none());
}
