//! The trainer's integration tests (CPU, tiny models): forward parity with `transformers` fixtures, LoRA merge,
//! finite-difference gradients of every loss, AdamW and its schedule, gradient-cache equivalence, bit-exact
//! resume, hard-negative mining, export.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use care_formats::trainer::Hyper;
use care_formats::training::TrainingExample;
use care_trainer::data::{
    MiningOptions, batch_indices, mine_hard_negatives, permutation, source_batch_indices, source_ids,
};
use care_trainer::encoder::Encoder;
use care_trainer::loss;
use care_trainer::models::{Bert, BertConfig, Qwen3, Qwen3Config};
use care_trainer::optim::{AdamW, AdamWConfig, Schedule};
use care_trainer::train::{DocSide, LossConfig, TrainConfig, Trainer, select_trainable};
use care_trainer::weights::{Weights, load_tensors, save_tensors};
use tch::{Device, Kind, Tensor};

/// libtorch's generator and thread count are process-wide and the test harness runs tests on parallel
/// threads, so every test that draws random numbers or relies on bitwise reproducibility holds this lock.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn max_abs_diff_on_real_tokens(got: &Tensor, want: &Tensor, mask: &Tensor) -> f64 {
    let m = mask.to_kind(Kind::Float).unsqueeze(-1);
    ((got - want).abs() * m).max().double_value(&[])
}

#[test]
fn bert_forward_matches_transformers() {
    let _guard = serial();
    for name in ["bert", "xlmr"] {
        let dir = fixtures().join(name);
        let model = Bert::load(&dir, Device::Cpu).unwrap();
        let io = load_tensors(&dir.join("io.safetensors")).unwrap();
        let (ids, mask, want) = (&io["input_ids"], &io["attention_mask"], &io["last_hidden_state"]);
        let got = tch::no_grad(|| model.forward_t(ids, mask, false));
        let diff = max_abs_diff_on_real_tokens(&got, want, mask);
        assert!(diff < 1e-4, "{name}: max |Δ| = {diff}");
        // The fixture is not trivially matched: a perturbed model must differ.
        assert!(want.abs().mean(Kind::Float).double_value(&[]) > 0.1);
    }
}

#[test]
fn qwen3_forward_matches_transformers_with_left_padding() {
    let _guard = serial();
    let dir = fixtures().join("qwen3");
    let model = Qwen3::load(&dir, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(model.cfg.head_dim(), 16, "explicit head_dim differs from hidden/heads = 8");
    let io = load_tensors(&dir.join("io.safetensors")).unwrap();
    let (ids, mask, want) = (&io["input_ids"], &io["attention_mask"], &io["last_hidden_state"]);
    let got = tch::no_grad(|| model.forward_t(ids, mask, false));
    let diff = max_abs_diff_on_real_tokens(&got, want, mask);
    assert!(diff < 1e-4, "qwen3: max |Δ| = {diff}");
    // Last-token pooling picks the final (real) position of every left-padded row.
    let pooled = care_trainer::pooling::pool(&got, mask, care_formats::Pooling::LastToken);
    let last = want.select(1, -1);
    assert!((pooled - last).abs().max().double_value(&[]) < 1e-4);
}

#[test]
fn lora_merge_leaves_outputs_unchanged() {
    let _guard = serial();
    tch::manual_seed(7);
    let dir = fixtures().join("qwen3");
    let io = load_tensors(&dir.join("io.safetensors")).unwrap();
    let (ids, mask) = (&io["input_ids"], &io["attention_mask"]);
    let mut q = Qwen3::load(&dir, Device::Cpu, Kind::Float).unwrap();
    let base = tch::no_grad(|| q.forward_t(ids, mask, false));
    let targets: Vec<String> =
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].map(String::from).to_vec();
    q.add_lora(&targets, 4, 8.0, 0.5);
    let adapted = tch::no_grad(|| q.forward_t(ids, mask, false));
    let moved = (&adapted - &base).abs().max().double_value(&[]);
    assert!(moved > 1e-3, "a random-B adapter must change the output ({moved})");
    assert_eq!(q.weights.names().iter().filter(|n| n.contains("lora_")).count(), 2 * 7 * 2);
    q.merge_lora();
    let merged = tch::no_grad(|| q.forward_t(ids, mask, false));
    let diff = max_abs_diff_on_real_tokens(&merged, &adapted, mask);
    assert!(diff < 1e-5, "merge changed outputs by {diff}");
    assert!(q.weights.names().iter().all(|n| !n.contains("lora_")));

    let dir = fixtures().join("xlmr");
    let io = load_tensors(&dir.join("io.safetensors")).unwrap();
    let (ids, mask) = (&io["input_ids"], &io["attention_mask"]);
    let mut b = Bert::load(&dir, Device::Cpu).unwrap();
    b.add_lora(&["query".into(), "value".into(), "intermediate".into()], 2, 4.0, 0.5);
    let adapted = tch::no_grad(|| b.forward_t(ids, mask, false));
    b.merge_lora();
    let merged = tch::no_grad(|| b.forward_t(ids, mask, false));
    assert!(max_abs_diff_on_real_tokens(&merged, &adapted, mask) < 1e-5);
}

/// Central finite differences of `f` at `x` (f64) against autograd.
fn check_grad(name: &str, x: &Tensor, f: &dyn Fn(&Tensor) -> Tensor) {
    let xg = x.detach().set_requires_grad(true);
    let y = f(&xg);
    y.backward();
    let analytic = xg.grad();
    let eps = 1e-6;
    let flat = x.detach().view(-1);
    let n = flat.size()[0];
    let mut worst: f64 = 0.0;
    for i in 0..n {
        let plus = flat.copy();
        let _ = plus.get(i).g_add_scalar_(eps);
        let minus = flat.copy();
        let _ = minus.get(i).g_add_scalar_(-eps);
        let fd = (f(&plus.view(x.size().as_slice())).double_value(&[])
            - f(&minus.view(x.size().as_slice())).double_value(&[]))
            / (2.0 * eps);
        let an = analytic.view(-1).double_value(&[i]);
        worst = worst.max((fd - an).abs() / (1.0 + fd.abs()));
    }
    assert!(worst < 1e-6, "{name}: worst relative gradient error {worst}");
    assert!(analytic.abs().sum(Kind::Double).double_value(&[]) > 1e-8, "{name}: zero gradient");
}

#[test]
fn loss_gradients_match_finite_differences() {
    let _guard = serial();
    tch::manual_seed(3);
    let opts = (Kind::Double, Device::Cpu);
    let q = Tensor::randn([3, 4], opts);
    let d = Tensor::randn([6, 6], opts); // group size 2; document width 6 > query width 4
    let d_same = Tensor::randn([6, 4], opts);
    check_grad("info_nce wrt q", &q, &|x| loss::info_nce(x, &d_same, 0.1, 2));
    check_grad("info_nce wrt d", &d_same, &|x| loss::info_nce(&q, x, 0.02, 2));
    check_grad("asymmetric wrt q", &q, &|x| loss::asymmetric_info_nce(x, &d, 0.05, 2));
    check_grad("asymmetric wrt d", &d, &|x| loss::asymmetric_info_nce(&q, x, 0.05, 2));
    let d3 = Tensor::randn([3, 6], opts);
    check_grad("mse wrt q", &q, &|x| loss::mse_alignment(x, &d3));
    check_grad("mse wrt d", &d3, &|x| loss::mse_alignment(&q, x));
    check_grad("matryoshka wrt q", &q, &|x| {
        loss::matryoshka(x, &d, &[2, 4], |a, b| loss::asymmetric_info_nce(a, b, 0.1, 2))
    });
    check_grad("matryoshka wrt d", &d, &|x| {
        loss::matryoshka(&q, x, &[2, 4], |a, b| loss::asymmetric_info_nce(a, b, 0.1, 2))
    });
}

#[test]
fn losses_have_the_expected_values() {
    let _guard = serial();
    let opts = (Kind::Double, Device::Cpu);
    // Perfectly aligned, orthogonal pairs: contrastive loss = log(1 + (B·G − 1)·e^{−1/t}); MSE = 0.
    let q = Tensor::eye(2, opts);
    let d = Tensor::cat(
        &[
            Tensor::eye(2, opts).get(0).unsqueeze(0),
            Tensor::zeros([1, 2], opts) + 0.0,
            Tensor::eye(2, opts).get(1).unsqueeze(0),
            Tensor::zeros([1, 2], opts),
        ],
        0,
    );
    let d = d + Tensor::from_slice(&[0.0f64, 0.0, 0.0, -1.0, 0.0, 0.0, -1.0, 0.0]).view([4, 2]);
    let l = loss::info_nce(&q, &d, 0.1, 2).double_value(&[]);
    // scores/t for row 0: [10, -10 (d1 = (0,-1) · (1,0) = 0!)] — compute exactly instead of by hand:
    let s = q.matmul(&care_trainer::pooling::normalize(&d).tr()) / 0.1;
    let want = -s.log_softmax(1, Kind::Double).get(0).double_value(&[0]) / 2.0
        - s.log_softmax(1, Kind::Double).get(1).double_value(&[2]) / 2.0;
    assert!((l - want).abs() < 1e-12);
    assert!(loss::mse_alignment(&q, &q).double_value(&[]).abs() < 1e-15);
    // Truncation: the document side is cut to the query width before scoring.
    let wide = Tensor::cat(&[q.shallow_clone(), Tensor::ones([2, 3], opts) * 100.0], 1);
    assert!(loss::mse_alignment(&q, &wide).double_value(&[]).abs() < 1e-15);
}

#[test]
fn adamw_matches_the_reference_update_and_schedule() {
    let _guard = serial();
    let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
    let mut params = BTreeMap::new();
    params.insert("p".to_string(), p.shallow_clone());
    let cfg = AdamWConfig { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.05 };
    let mut opt = AdamW::new(cfg, params);
    let mut expect = [1.0f64, -2.0];
    let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
    for t in 1..=3 {
        opt.zero_grad();
        (&p * &p).sum(Kind::Float).backward(); // grad = 2p
        opt.step(0.1);
        for i in 0..2 {
            let g = 2.0 * expect[i];
            expect[i] *= 1.0 - 0.1 * 0.05;
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            let mh = m[i] / (1.0 - 0.9f64.powi(t));
            let vh = v[i] / (1.0 - 0.999f64.powi(t));
            expect[i] -= 0.1 * mh / (vh.sqrt() + 1e-8);
        }
    }
    let got = Vec::<f32>::try_from(&p.detach()).unwrap();
    for i in 0..2 {
        assert!((f64::from(got[i]) - expect[i]).abs() < 1e-5, "{got:?} vs {expect:?}");
    }
    let s = Schedule { warmup: 10, total: 110 };
    assert_eq!(s.factor(5), 0.5);
    assert_eq!(s.factor(10), 1.0);
    assert_eq!(s.factor(60), 0.5);
    assert_eq!(s.factor(110), 0.0);
    // Clipping scales the global norm down to the limit.
    opt.zero_grad();
    (&p * 100.0).sum(Kind::Float).backward();
    let before = opt.clip_grad_norm(1.0);
    assert!((before - 100.0 * 2f64.sqrt()).abs() < 1e-3);
    let after = p.grad().norm().double_value(&[]);
    assert!((after - 1.0).abs() < 1e-4, "{after}");
}

// ---- tiny encoders on disk --------------------------------------------------------------------------------

const WORDS: usize = 60;

fn tokenizer_json() -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[PAD]".into(), 0.into());
    vocab.insert("[UNK]".into(), 1.into());
    for i in 0..WORDS {
        vocab.insert(format!("w{i}"), (i + 2).into());
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
}

fn write_tiny_bert(dir: &Path, seed: i64) {
    write_tiny_bert_with(dir, seed, 0.1);
}

fn write_tiny_bert_with(dir: &Path, seed: i64, dropout: f64) {
    tch::manual_seed(seed);
    let cfg = BertConfig {
        model_type: "xlm-roberta".into(),
        vocab_size: (WORDS + 2) as i64,
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
        hidden_dropout_prob: dropout,
        attention_probs_dropout_prob: dropout,
        hidden_act: "gelu".into(),
    };
    let m = Bert::random(&cfg, Device::Cpu).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    m.weights.save(&dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string(&cfg.to_json()).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
}

fn write_tiny_qwen(dir: &Path, seed: i64) {
    write_tiny_qwen_with(dir, seed, 0.1);
}

fn write_tiny_qwen_with(dir: &Path, seed: i64, dropout: f64) {
    tch::manual_seed(seed);
    let cfg = Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: (WORDS + 2) as i64,
        hidden_size: 24,
        intermediate_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: Some(8),
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        attention_bias: false,
        attention_dropout: dropout,
        hidden_act: "silu".into(),
        eos_token_id: None,
        pad_token_id: None,
    };
    let m = Qwen3::random(&cfg, Device::Cpu).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    m.weights.save(&dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
}

fn examples(n: usize) -> Vec<TrainingExample> {
    let w = |i: usize| format!("w{}", i % WORDS);
    (0..n)
        .map(|i| TrainingExample {
            query: format!("{} {} {}", w(i), w(i * 7 + 1), w(i * 3 + 2)),
            pos: vec![format!("{} {} {} {}", w(i), w(i * 7 + 1), w(i + 5), w(i * 11))],
            neg: vec![format!("{} {}", w(i + 9), w(i * 5 + 4))],
            prompt: None,
            kind: None,
        })
        .collect()
}

fn config(steps: u64, sub_batch: usize) -> TrainConfig {
    TrainConfig::new(
        Hyper {
            steps,
            batch_size: 4,
            sub_batch,
            lr: 1e-3,
            warmup_ratio: 0.25,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
            seed: 42,
            checkpoint_every: 3,
            keep_checkpoints: 2,
            matryoshka: vec![8, 16],
            ..Hyper::default()
        },
        LossConfig { temperature: 0.05, group_size: 3, mse_weight: 0.5 },
    )
}

struct Models {
    query: Encoder,
    doc: Encoder,
}

fn load_models(root: &Path) -> Models {
    let query = Encoder::load(&root.join("q"), Device::Cpu, Kind::Float).unwrap();
    let mut doc = Encoder::load(&root.join("d"), Device::Cpu, Kind::Float).unwrap();
    tch::manual_seed(99);
    doc.model.add_lora(&["q_proj".into(), "v_proj".into(), "down_proj".into()], 2, 4.0, 0.0);
    Models { query, doc }
}

fn trainable(m: &Models) -> BTreeMap<String, Tensor> {
    let mut p = select_trainable(&m.query, "query.", &|n| !n.starts_with("embeddings.word"));
    p.extend(select_trainable(&m.doc, "document.", &|n| n.contains("lora_")));
    p
}

fn snapshot(p: &BTreeMap<String, Tensor>) -> BTreeMap<String, Vec<f32>> {
    p.iter().map(|(n, t)| (n.clone(), Vec::<f32>::try_from(&t.detach().contiguous().view(-1)).unwrap())).collect()
}

#[test]
fn resumed_run_reproduces_the_uninterrupted_one_bit_for_bit() {
    let _guard = serial();
    tch::set_num_threads(1);
    let root = tempfile::tempdir().unwrap();
    write_tiny_bert(&root.path().join("q"), 1);
    write_tiny_qwen(&root.path().join("d"), 2);
    let ex = examples(10);

    // Uninterrupted: 7 steps (crosses an epoch boundary at 10 / 4 → 2 steps per epoch).
    let m = load_models(root.path());
    let out_a = root.path().join("a");
    let mut t = Trainer::new(&m.query, DocSide::Trainable(&m.doc), &ex, config(7, 0), trainable(&m), &out_a).unwrap();
    let full = t.run(None).unwrap();
    let want = snapshot(&t.opt.params);
    assert_eq!(full.len(), 7);
    assert!(full[6].loss < full[0].loss * 1.5, "training diverged: {full:?}");

    // Interrupted after 4 steps (last checkpoint at 3), restarted from fresh models, resumed.
    let out_b = root.path().join("b");
    {
        let m = load_models(root.path());
        let mut t =
            Trainer::new(&m.query, DocSide::Trainable(&m.doc), &ex, config(7, 0), trainable(&m), &out_b).unwrap();
        t.run(Some(4)).unwrap();
    }
    let m2 = load_models(root.path());
    let mut t2 =
        Trainer::new(&m2.query, DocSide::Trainable(&m2.doc), &ex, config(7, 0), trainable(&m2), &out_b).unwrap();
    assert_eq!(t2.resume().unwrap(), Some(3));
    t2.run(None).unwrap();
    let got = snapshot(&t2.opt.params);
    assert_eq!(got.len(), want.len());
    for (name, w) in &want {
        assert!(got[name] == *w, "parameter {name} differs after resume");
    }
    let log_a = care_trainer::train::read_metrics(&out_a.join("metrics.jsonl")).unwrap();
    let log_b = care_trainer::train::read_metrics(&out_b.join("metrics.jsonl")).unwrap();
    assert_eq!(
        log_a.iter().map(|m| (m.step, m.loss.to_bits())).collect::<Vec<_>>(),
        log_b.iter().map(|m| (m.step, m.loss.to_bits())).collect::<Vec<_>>()
    );
    // keep_checkpoints = 2: steps 3 and 6 remain.
    let kept: Vec<u64> = care_trainer::train::list_checkpoints(&out_b).iter().map(|c| c.0).collect();
    assert_eq!(kept, vec![3, 6]);
}

#[test]
fn gradient_cache_sub_batches_give_the_full_batch_gradient() {
    let _guard = serial();
    tch::set_num_threads(1);
    let root = tempfile::tempdir().unwrap();
    // Without dropout the chunking cannot change the masks, so both paths must agree to rounding.
    write_tiny_bert_with(&root.path().join("q"), 5, 0.0);
    write_tiny_qwen_with(&root.path().join("d"), 6, 0.0);
    let ex = examples(8);
    let grads = |sub: usize| {
        let m = load_models(root.path());
        let p = trainable(&m);
        let t = Trainer::new(
            &m.query,
            DocSide::Trainable(&m.doc),
            &ex,
            config(1, sub),
            p,
            &root.path().join(format!("g{sub}")),
        )
        .unwrap();
        let l = t.forward_backward(0).unwrap();
        let g: BTreeMap<String, Tensor> = t.opt.params.iter().map(|(n, p)| (n.clone(), p.grad().copy())).collect();
        (l, g)
    };
    let (l0, g0) = grads(0);
    let (l2, g2) = grads(2);
    assert!((l0.0 - l2.0).abs() < 1e-6, "loss {l0:?} vs {l2:?}");
    let mut compared = 0;
    for (n, a) in &g0 {
        let b = &g2[n];
        if !a.defined() {
            continue;
        }
        let diff = (a - b).abs().max().double_value(&[]);
        let scale = a.abs().max().double_value(&[]).max(1e-6);
        assert!(diff / scale < 1e-4, "{n}: {diff} (scale {scale})");
        compared += 1;
    }
    assert!(compared > 10);
}

#[test]
fn frozen_document_side_trains_only_the_query_encoder() {
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    write_tiny_bert(&root.path().join("q"), 11);
    write_tiny_qwen(&root.path().join("d"), 12);
    let ex = examples(8);
    let q = Encoder::load(&root.path().join("q"), Device::Cpu, Kind::Float).unwrap();
    let d = Encoder::load(&root.path().join("d"), Device::Cpu, Kind::Float).unwrap();
    let doc_before = snapshot(&d.named_parameters());
    let side = care_trainer::train::frozen_doc_side(&d, care_trainer::data::document_pool(&ex), 4, None).unwrap();
    let mut cfg = config(5, 0);
    cfg.hyper.lr = 5e-3;
    cfg.loss.group_size = 2;
    let params = select_trainable(&q, "query.", &|_| true);
    let mut t = Trainer::new(&q, side, &ex, cfg, params, &root.path().join("f")).unwrap();
    let log = t.run(None).unwrap();
    assert!(log.iter().all(|m| m.loss.is_finite() && m.mse > 0.0));
    assert_eq!(snapshot(&d.named_parameters()), doc_before, "the frozen document encoder changed");
}

#[test]
fn data_order_is_a_pure_function_of_seed_and_step() {
    let _guard = serial();
    let p = permutation(10, 1, 0);
    let mut sorted = p.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_ne!(p, permutation(10, 1, 1), "epochs are reshuffled");
    assert_eq!(batch_indices(10, 4, 1, 3), batch_indices(10, 4, 1, 3));
    assert_eq!(&batch_indices(10, 4, 1, 0)[..], &p[..4]);
}

#[test]
fn batches_by_source_hold_one_collection_and_cover_an_epoch_once() {
    let ex = |kind: &str| TrainingExample {
        query: "q".into(),
        pos: vec!["p".into()],
        neg: vec![],
        prompt: None,
        kind: Some(kind.into()),
    };
    // 10 huatuo examples (judged and feedback), 7 kuake, 2 of a small collection: batches of 4 give 2 + 1 + 1.
    let mut all: Vec<TrainingExample> = (0..5).map(|_| ex("judged:huatuo")).collect();
    all.extend((0..7).map(|_| ex("judged:kuake")));
    all.extend((0..5).map(|_| ex("feedback:huatuo")));
    all.extend((0..2).map(|_| ex("judged:small")));
    let src = source_ids(&all);
    assert_eq!(
        src.iter().filter(|&&s| s == src[0]).count(),
        10,
        "judged: and feedback: of one collection are one source"
    );
    let epoch: Vec<Vec<usize>> = (0..4).map(|k| source_batch_indices(&src, 4, 7, k)).collect();
    let mut seen = std::collections::HashSet::new();
    for b in &epoch {
        assert!(b.iter().all(|&i| src[i] == src[b[0]]), "a batch mixes collections: {b:?}");
        assert!(b.iter().all(|&i| seen.insert(i)), "an example came twice within one epoch");
    }
    assert_eq!(epoch.iter().map(Vec::len).collect::<std::collections::BTreeSet<_>>(), [2, 4].into());
    assert_eq!(source_batch_indices(&src, 4, 7, 5), source_batch_indices(&src, 4, 7, 5), "not a pure function");
    assert_ne!((4..8).map(|k| source_batch_indices(&src, 4, 7, k)).collect::<Vec<_>>(), epoch, "epochs are reshuffled");
}

#[test]
fn mining_skips_positives_and_drops_likely_false_negatives() {
    let _guard = serial();
    let pool: Vec<String> = (0..6).map(|i| format!("d{i}")).collect();
    // Query 0's positive is d0 (score 1.0); d1 scores 0.99 (likely an unlabelled positive), d2..d5 lower.
    let pv = Tensor::from_slice(&[1.0f32, 0.0, 0.99, 0.141, 0.8, 0.6, 0.7, 0.714, 0.5, 0.866, 0.2, 0.98]).view([6, 2]);
    let pv = care_trainer::pooling::normalize(&pv);
    let qv = Tensor::from_slice(&[1.0f32, 0.0, 1.0, 0.0]).view([2, 2]);
    let ex =
        |p: &str| TrainingExample { query: "q".into(), pos: vec![p.into()], neg: vec![], prompt: None, kind: None };
    // The margin is on the encoder's own scale: positives scoring 1.0 and 0.96 (σ ≈ 0.028) give 0.5σ ≈ 0.014, so
    // d1 (0.99, within 0.014 of query 0's positive) is dropped and d2 (0.8) is kept.
    let mut exs = vec![ex("d0"), ex("d0")];
    let opts = MiningOptions { negatives: 2, skip_top: 0, depth: 10, margin_sd: 0.5 };
    let r = mine_hard_negatives(&mut exs, &qv, &[1.0, 0.96], &pool, &pv, opts).unwrap();
    assert!((r.margin - 0.5 * 0.04 / 2f32.sqrt()).abs() < 1e-4, "{r:?}");
    assert_eq!(exs[0].neg, vec!["d2".to_string(), "d3".to_string()]);
    // Query 1's positive scored 0.96: d1 (0.99) lies above 0.96 − 0.014 and is dropped too.
    assert_eq!(exs[1].neg, vec!["d2".to_string(), "d3".to_string()]);
    assert_eq!((r.dropped, r.short), (2, 0));
    // A wide score spread widens the margin: with positives 1.0 and 0.4 (σ ≈ 0.42, margin ≈ 0.21) query 0 also
    // drops d2 (0.8 > 0.79), and query 1 keeps nothing above 0.19: one group is left short and reported.
    let mut exs = vec![ex("d0"), ex("d0")];
    let r = mine_hard_negatives(&mut exs, &qv, &[1.0, 0.4], &pool, &pv, opts).unwrap();
    assert_eq!(exs[0].neg, vec!["d3".to_string(), "d4".to_string()], "{r:?}");
    assert!(exs[1].neg.is_empty(), "{r:?}");
    assert_eq!(r.short, 1);
}

#[test]
fn query_package_export_writes_a_verified_manifest_and_parity_vectors() {
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    write_tiny_bert(&root.path().join("q"), 21);
    let mut q = Encoder::load(&root.path().join("q"), Device::Cpu, Kind::Float).unwrap();
    q.model.add_lora(&["query".into()], 2, 4.0, 0.3);
    let info = care_trainer::export::PackageInfo {
        name: "tiny".into(),
        version: "1".into(),
        pairing_id: "tiny-pair".into(),
        query_template: "w1 {text}".into(),
        document_template: "w2 {text}".into(),
        instruction: String::new(),
        provenance: BTreeMap::new(),
        int8: true,
    };
    let out = root.path().join("pkg");
    let texts = vec!["w3 w4".to_string(), "w5".to_string()];
    let m = care_trainer::export::export_package(&mut q, &out, &info, care_formats::ModelRole::Query, &texts).unwrap();
    m.verify_files(&out).unwrap();
    assert_eq!(m.role, care_formats::ModelRole::Query);
    // Both graphs, listed with their hashes: the gate times and scores the int8 one beside the fp32 one.
    for g in care_formats::Graph::ALL {
        assert!(m.files.contains_key(g.file()) && out.join(g.file()).exists(), "{g} graph missing");
    }
    // A document encoder's package carries no int8 graph (documents are encoded in fp32).
    let doc = root.path().join("doc");
    let d =
        care_trainer::export::export_package(&mut q, &doc, &info, care_formats::ModelRole::Document, &texts).unwrap();
    assert!(!d.files.contains_key(care_formats::Graph::Int8.file()) && !doc.join("model_int8.onnx").exists());
    let parity: care_trainer::export::ParityFile =
        serde_json::from_str(&std::fs::read_to_string(out.join("parity.json")).unwrap()).unwrap();
    assert_eq!(parity.embeddings.len(), 2);
    // The exported safetensors hold the merged weights: reloading gives the same vectors as the parity file.
    let back = Encoder::load(&out, Device::Cpu, Kind::Float).unwrap();
    let v = tch::no_grad(|| care_trainer::pooling::normalize(&back.embed(&["w1 w3 w4"], false).unwrap()));
    let want = Tensor::from_slice(&parity.embeddings[0]).unsqueeze(0);
    assert!((v - want).abs().max().double_value(&[]) < 1e-5);
}

#[test]
fn pruning_keeps_the_first_or_spread_layers() {
    use care_trainer::export::{LayerPick, kept_layers, prune_layers};
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    write_tiny_bert(&root.path().join("q"), 31);
    let cfg = prune_layers(&root.path().join("q"), 1, LayerPick::First, &root.path().join("p")).unwrap();
    assert_eq!(cfg.num_hidden_layers, 1);
    let src = Weights::load(&root.path().join("q/model.safetensors"), Device::Cpu, Kind::Float).unwrap();
    let w = Weights::load(&root.path().join("p/model.safetensors"), Device::Cpu, Kind::Float).unwrap();
    let name = "encoder.layer.0.output.dense.weight";
    let same = |a: &Weights, an: &str, bn: &str| {
        let (x, y) = (a.iter().find(|t| t.0 == an).unwrap().1, src.iter().find(|t| t.0 == bn).unwrap().1);
        x.equal(y)
    };
    assert!(same(&w, name, "encoder.layer.0.output.dense.weight"));
    assert!(!w.names().iter().any(|n| n.starts_with("encoder.layer.1.")));
    assert!(prune_layers(&root.path().join("q"), 3, LayerPick::First, &root.path().join("x")).is_err());
    Encoder::load(&root.path().join("p"), Device::Cpu, Kind::Float).unwrap();
    // Spread: one layer of two is the last one, renumbered 0.
    prune_layers(&root.path().join("q"), 1, LayerPick::Spread, &root.path().join("s")).unwrap();
    let w = Weights::load(&root.path().join("s/model.safetensors"), Device::Cpu, Kind::Float).unwrap();
    assert!(same(&w, name, "encoder.layer.1.output.dense.weight"));
    assert!(!w.names().iter().any(|n| n.starts_with("encoder.layer.1.")));
    Encoder::load(&root.path().join("s"), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(kept_layers(12, 4, LayerPick::Spread).unwrap(), [0, 4, 8, 11]);
    assert_eq!(kept_layers(12, 6, LayerPick::Spread).unwrap(), [0, 3, 5, 7, 9, 11]);
    assert_eq!(kept_layers(12, 12, LayerPick::Spread).unwrap(), (0..12).collect::<Vec<_>>());
    assert!(kept_layers(12, 0, LayerPick::Spread).is_err());
    Encoder::load(&root.path().join("p"), Device::Cpu, Kind::Float).unwrap();
}

#[test]
fn merge_averages_a_tuned_encoder_with_the_one_it_started_from_and_refuses_another() {
    use care_trainer::export::{LayerPick, merge_weights, prune_layers};
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    let p = |n: &str| root.path().join(n);
    write_tiny_bert(&p("base"), 41);
    write_tiny_bert(&p("tuned"), 42);
    // The tuned one carries the prefixed names a Hugging Face task model writes; the merge matches them anyway.
    let w = Weights::load(&p("tuned/model.safetensors"), Device::Cpu, Kind::Float).unwrap();
    save_tensors(w.iter().map(|(n, t)| (format!("roberta.{n}"), t.shallow_clone())), &p("tuned/model.safetensors"))
        .unwrap();
    let tensor = |dir: &str| {
        let w = Weights::load_dir(&p(dir), Device::Cpu, Kind::Float).unwrap();
        w.iter().find(|t| t.0 == "encoder.layer.1.output.dense.weight").unwrap().1.shallow_clone()
    };
    let changed = merge_weights(&p("tuned"), &p("base"), 0.25, &p("m")).unwrap();
    assert!(changed > 4, "random matrices of two seeds differ: {changed}");
    let want = tensor("tuned") * 0.25 + tensor("base") * 0.75;
    assert!((tensor("m") - want).abs().max().double_value(&[]) < 1e-6);
    // 1 copies the tuned weights, 0 the base's; the merged folder loads and encodes.
    merge_weights(&p("tuned"), &p("base"), 1.0, &p("one")).unwrap();
    assert!(tensor("one").equal(&tensor("tuned")));
    merge_weights(&p("tuned"), &p("base"), 0.0, &p("zero")).unwrap();
    assert!(tensor("zero").equal(&tensor("base")));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("m").join(care_trainer::export::MERGE_FILE)).unwrap()).unwrap();
    assert_eq!((record["ratio"].as_f64(), record["tensors_averaged"].as_u64()), (Some(0.25), Some(changed as u64)));
    let enc = Encoder::load(&p("m"), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(tch::no_grad(|| enc.embed(&["w1 w2"], false).unwrap()).size(), [1, 16]);
    // Another architecture (a pruned copy has fewer layers) and a ratio out of range are refused.
    prune_layers(&p("base"), 1, LayerPick::Spread, &p("small")).unwrap();
    let err = merge_weights(&p("small"), &p("base"), 0.5, &p("x")).unwrap_err().to_string();
    assert!(err.contains("trained from"), "{err}");
    assert!(merge_weights(&p("tuned"), &p("base"), 1.5, &p("x")).is_err());
    assert!(!p("x").join("model.safetensors").exists());
}

#[test]
fn embed_corpus_writes_shards_the_appliance_reads() {
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    write_tiny_qwen(&root.path().join("d"), 41);
    let d = Encoder::load(&root.path().join("d"), Device::Cpu, Kind::Float).unwrap();
    let docs: Vec<care_trainer::data::Doc> = (0..7)
        .map(|i| care_trainer::data::Doc { id: format!("doc{i}"), text: format!("w{i} w{}", i + 1), kind: None })
        .collect();
    let out = root.path().join("emb");
    let idx = care_trainer::export::embed_corpus(&d, &docs, &out, "{text}", 16, "pair", 3, 4).unwrap();
    assert_eq!((idx.rows, idx.shards.len(), idx.width), (7, 2, 16));
    let (ids, data) = care_formats::embeddings::read_shard(&out, &idx, &idx.shards[1]).unwrap();
    assert_eq!(ids, vec!["doc4", "doc5", "doc6"]);
    let norm: f32 = data[..16].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "vectors are normalised at the truncated width");
}

/// Real weights: the trainer's XLM-R forward + tokenizer on the imported 4-bit e5-small reproduce the reference
/// vectors of `/work/shared/models` (made with the HF tokenizer and a PyTorch export) at cosine ≥ 0.9999.
#[test]
fn e5_small_forward_reproduces_the_reference_vectors() {
    let _guard = serial();
    let (Some(bin), Some(shared)) = (std::env::var_os("CARE_E5S1"), std::env::var_os("CARE_SHARED")) else {
        eprintln!("CARE_E5S1 / CARE_SHARED not set (packaging/dev.sh test sets them); skipping");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    care_trainer::export::e5s1_to_folder(Path::new(&bin), dir.path()).unwrap();
    let enc = Encoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let refs = std::fs::read_to_string(Path::new(&shared).join("models/e5-small-embedding-vectors.jsonl")).unwrap();
    let mut worst: f64 = 1.0;
    let mut n = 0;
    let lines: Vec<serde_json::Value> = refs.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let texts: Vec<String> = lines.iter().map(|v| v["text"].as_str().unwrap().to_string()).collect();
    let got = enc.embed_all(&texts, 8, &mut |_| {}).unwrap();
    for (i, v) in lines.iter().enumerate() {
        let want: Vec<f32> = v["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let want = care_trainer::pooling::normalize(&Tensor::from_slice(&want));
        let cos = (got.get(i as i64) * want).sum(Kind::Float).double_value(&[]);
        worst = worst.min(cos);
        n += 1;
    }
    assert_eq!(n, 30);
    assert!(worst >= 0.9999, "worst cosine {worst}");
}

/// `embed-corpus` reads the appliance's chunk export (`id`, `text`), our corpora (`id`, `title`, `text`, `kind`) and
/// standard BEIR corpora (`_id`), joining title and text.
#[test]
fn corpus_reader_takes_every_id_layout() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("corpus.jsonl");
    std::fs::write(
        &p,
        concat!(
            "{\"id\": \"17:0a1b\", \"text\": \"二甲双胍\"}\n",
            "{\"_id\": \"d2\", \"title\": \"痛风\", \"text\": \"避免高嘌呤饮食。\"}\n",
            "{\"id\": \"mc-1\", \"text\": \"发热怎么办\", \"kind\": \"question\"}\n",
        ),
    )
    .unwrap();
    let docs = care_trainer::data::read_corpus(&p).unwrap();
    let got: Vec<(&str, &str, Option<&str>)> =
        docs.iter().map(|d| (d.id.as_str(), d.text.as_str(), d.kind.as_deref())).collect();
    assert_eq!(
        got,
        vec![
            ("17:0a1b", "二甲双胍", None),
            ("d2", "痛风 避免高嘌呤饮食。", None),
            ("mc-1", "发热怎么办", Some("question"))
        ]
    );
}

/// 4B/8B checkpoints come sharded (`model.safetensors.index.json`) and, saved from `Qwen3ForCausalLM`, with every
/// tensor under `model.` beside an unprefixed `lm_head.weight`. Such a folder must load as the single file does.
#[test]
fn sharded_and_prefixed_checkpoints_load_like_the_single_file() {
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    let one = t.path().join("one");
    write_tiny_qwen_with(&one, 11, 0.0);
    let sharded = t.path().join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(one.join(f), sharded.join(f)).unwrap();
    }
    let tensors = load_tensors(&one.join("model.safetensors")).unwrap();
    let names: Vec<String> = tensors.keys().cloned().collect();
    let (a, b) = names.split_at(names.len() / 2);
    let files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let mut index = serde_json::Map::new();
    for (part, file) in [(a, files[0]), (b, files[1])] {
        let mut list: Vec<(String, Tensor)> =
            part.iter().map(|n| (format!("model.{n}"), tensors[n].shallow_clone())).collect();
        if file == files[1] {
            list.push(("lm_head.weight".into(), Tensor::randn([(WORDS + 2) as i64, 24], (Kind::Float, Device::Cpu))));
        }
        for (n, _) in &list {
            index.insert(n.clone(), file.into());
        }
        care_trainer::weights::save_tensors(list.into_iter(), &sharded.join(file)).unwrap();
    }
    let write_index = |m: &serde_json::Map<String, serde_json::Value>| {
        let v = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": m});
        std::fs::write(sharded.join("model.safetensors.index.json"), v.to_string()).unwrap();
    };
    write_index(&index);
    assert!(!sharded.join("model.safetensors").exists());
    let texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9"];
    let want = Encoder::load(&one, Device::Cpu, Kind::Float).unwrap().embed(&texts, false).unwrap();
    let got = Encoder::load(&sharded, Device::Cpu, Kind::Float).unwrap().embed(&texts, false).unwrap();
    assert_eq!((got - &want).abs().max().double_value(&[]), 0.0);
    let w = Weights::load_dir(&sharded, Device::Cpu, Kind::Float).unwrap();
    assert!(w.contains("lm_head.weight") && w.contains("norm.weight") && !w.contains("model.norm.weight"));
    assert!(Qwen3::load(&sharded, Device::Cpu, Kind::Float).is_ok());
    // A tensor the index names but its shard lacks, and a shard path leaving the folder, are refused by name.
    let mut broken = index.clone();
    broken.insert("model.extra.weight".into(), files[0].into());
    write_index(&broken);
    let err = Weights::load_dir(&sharded, Device::Cpu, Kind::Float).unwrap_err().to_string();
    assert!(err.contains("model.extra.weight") && err.contains(files[0]), "{err}");
    let mut escape = index.clone();
    escape.insert("model.norm.weight".into(), "../one/model.safetensors".into());
    write_index(&escape);
    let err = Weights::load_dir(&sharded, Device::Cpu, Kind::Float).unwrap_err().to_string();
    assert!(err.contains("not a plain file name"), "{err}");
}

/// The eval cache of document vectors is keyed by the encoder's fingerprint: vectors another checkpoint wrote (a
/// document encoder before Stage II) are recomputed, not scored; the same encoder reuses them.
#[test]
fn eval_cache_refuses_vectors_of_other_weights() {
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write_tiny_bert_with(&a, 3, 0.0);
    write_tiny_bert_with(&b, 4, 0.0);
    let set = t.path().join("set");
    std::fs::create_dir_all(&set).unwrap();
    let corpus: String =
        (0..5).map(|i| format!("{{\"_id\": \"d{i}\", \"title\": \"\", \"text\": \"w{i} w{}\"}}\n", i + 7)).collect();
    std::fs::write(set.join("corpus.jsonl"), corpus).unwrap();
    let cache = t.path().join("vectors.safetensors");
    let ea = Encoder::load(&a, Device::Cpu, Kind::Float).unwrap();
    let eb = Encoder::load(&b, Device::Cpu, Kind::Float).unwrap();
    assert_ne!(ea.fingerprint(), eb.fingerprint());
    let (_, va) = care_trainer::eval::corpus_vectors(&ea, &set, "{text}", 4, Some(&cache)).unwrap();
    let (_, vb) = care_trainer::eval::corpus_vectors(&eb, &set, "{text}", 4, Some(&cache)).unwrap();
    let (_, fresh) = care_trainer::eval::corpus_vectors(&eb, &set, "{text}", 4, None).unwrap();
    assert!((&vb - &va).abs().max().double_value(&[]) > 1e-3, "b scored a's cached vectors");
    assert_eq!((&vb - &fresh).abs().max().double_value(&[]), 0.0);
    // The same encoder again: the cache (now b's) is reused, so a changed cache file shows through.
    care_trainer::weights::save_tensors(std::iter::once(("vectors".to_string(), &vb * 0.0)), &cache).unwrap();
    let (_, again) = care_trainer::eval::corpus_vectors(&eb, &set, "{text}", 4, Some(&cache)).unwrap();
    assert_eq!(again.abs().max().double_value(&[]), 0.0, "the matching cache was not reused");
}

/// Half-precision document encoders: a left-padded row whose positions see only masked keys must not turn into
/// NaN (fp16 overflowed the mask to −inf), and a loss computed from bf16/fp16 encodings (taken in fp32) stays
/// within a stated tolerance of the fp32 one on a tiny Qwen3.
#[test]
fn half_precision_qwen3_has_no_nan_on_padded_rows_and_its_loss_matches_fp32() {
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    write_tiny_qwen_with(t.path(), 5, 0.0);
    let texts = ["w1", "w2 w3 w4 w5 w6 w7", "w8 w9", "w10 w11 w12", "w13", "w14 w15 w16 w17", "w18 w19", "w20"];
    let f32enc = Encoder::load(t.path(), Device::Cpu, Kind::Float).unwrap();
    let want = tch::no_grad(|| f32enc.embed(&texts, false)).unwrap();
    let m = Qwen3::load(t.path(), Device::Cpu, Kind::Half).unwrap();
    let ids = Tensor::from_slice(&[0i64, 0, 0, 5, 6, 0, 0, 7, 8, 9]).view([2, 5]);
    let mask = ids.ne(0).to_kind(Kind::Int64);
    let h = tch::no_grad(|| m.forward_t(&ids, &mask, false));
    assert_eq!(h.kind(), Kind::Half);
    assert_eq!(h.isnan().any().int64_value(&[]), 0, "NaN in a left-padded fp16 forward");
    // Query i's positive is document i, in groups of 2 (document 2i+1 is its negative).
    let q = want.narrow(0, 0, 4);
    for kind in [Kind::BFloat16, Kind::Half] {
        let enc = Encoder::load(t.path(), Device::Cpu, kind).unwrap();
        let got = tch::no_grad(|| enc.embed(&texts, false)).unwrap();
        assert_eq!(got.kind(), Kind::Float, "encodings leave the encoder in fp32");
        let cos = (&got * &want).sum_dim_intlist(1, false, Kind::Float).min().double_value(&[]);
        let l32 = loss::asymmetric_info_nce(&q, &want, 0.02, 2).double_value(&[]);
        let lh = loss::asymmetric_info_nce(&q, &got, 0.02, 2).double_value(&[]);
        assert!(cos > 0.99, "{kind:?}: min cosine to fp32 {cos}");
        assert!((lh - l32).abs() < 0.05 * l32.abs().max(1.0), "{kind:?}: loss {lh} vs fp32 {l32}");
    }
}

/// Stage I: the student (query encoder) and the teacher (document encoder) each get their own prompt. Asserted on
/// the token ids each tokenizer produces: the student's start with its template's word, the teacher's with the
/// document template's (passages) or its own query template's (query-kind texts).
#[test]
fn stage1_sends_each_encoder_its_own_template() {
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    write_tiny_bert_with(t.path(), 1, 0.0);
    let enc = Encoder::load(t.path(), Device::Cpu, Kind::Float).unwrap();
    let docs = vec![
        care_trainer::data::Doc { id: "p".into(), text: "w10 w11".into(), kind: Some("passage".into()) },
        care_trainer::data::Doc { id: "q".into(), text: "w12".into(), kind: Some("question".into()) },
    ];
    let kinds = vec!["question".to_string()];
    let (pairs, teacher) = care_trainer::data::stage1_pairs(&docs, &kinds, "w1 {text}", "w2 {text}", "w3 {text}");
    let first_id = |text: &str| enc.tokenizer.encode(text, false).unwrap().get_ids()[0];
    let id = |w: &str| enc.tokenizer.token_to_id(w).unwrap();
    assert!(pairs.iter().all(|p| first_id(&p.query) == id("w1")), "the student reads every text as a query");
    assert_eq!(first_id(&pairs[0].pos[0]), id("w2"), "the teacher reads a passage as a document");
    assert_eq!(first_id(&pairs[1].pos[0]), id("w3"), "the teacher reads a question with its own query prompt");
    assert_eq!(teacher, vec![pairs[0].pos[0].clone(), pairs[1].pos[0].clone()]);
}

/// `care-train init` on an LLM (Qwen3) trains LoRA adapters by default (a full fine-tune of a 4B/8B encoder does not
/// fit one GPU) and merges them on save: only the adapted projections change, every other tensor stays bit-equal.
#[test]
fn init_trains_lora_on_an_llm_and_merges_it_into_the_saved_weights() {
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("qwen");
    write_tiny_qwen_with(&base, 5, 0.0);
    let train = t.path().join("train.jsonl");
    let lines: Vec<String> = examples(16).iter().map(|e| serde_json::to_string(e).unwrap()).collect();
    std::fs::write(&train, lines.join("\n") + "\n").unwrap();
    let out = t.path().join("init");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_care-train"))
        .args(["--device", "cpu", "init", "--model"])
        .arg(&base)
        .arg("--train")
        .arg(&train)
        .args(["--steps", "4", "--batch-size", "4", "--lr", "1e-2", "--checkpoint-every", "0", "--lora-rank", "2"])
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let run: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["lora"]["rank"], 2, "{run}");
    let before = load_tensors(&base.join("model.safetensors")).unwrap();
    let after = load_tensors(&out.join("query/model.safetensors")).unwrap();
    let total: i64 = before.values().map(Tensor::numel).map(|n| n as i64).sum();
    assert!(run["trainable_parameters"].as_i64().unwrap() < total, "{run}");
    let adapted = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
    let mut changed = 0;
    for (name, b) in &before {
        let a = after.get(name).or_else(|| after.get(&format!("model.{name}"))).unwrap_or_else(|| panic!("{name}"));
        let same = a.equal(b);
        if adapted.iter().any(|p| name.contains(p)) {
            changed += usize::from(!same);
        } else {
            assert!(same, "{name} changed, but only LoRA adapters train");
        }
    }
    assert!(changed > 0, "no adapted projection changed: the merged LoRA did not reach the saved weights");
    assert!(after.keys().all(|k| !k.contains("lora_")), "unmerged adapters were saved");
}

#[test]
fn served_vectors_replace_the_frozen_teachers_passes_and_vectors_of_another_model_are_refused() {
    let _guard = serial();
    let root = tempfile::tempdir().unwrap();
    write_tiny_qwen(&root.path().join("d"), 12);
    write_tiny_qwen(&root.path().join("other"), 13);
    let d = Encoder::load(&root.path().join("d"), Device::Cpu, Kind::Float).unwrap();
    let other = Encoder::load(&root.path().join("other"), Device::Cpu, Kind::Float).unwrap();
    let texts: Vec<String> = ["高血压 用药", "二甲双胍 禁忌症", "糖尿病 饮食", "头痛 发热", "query line"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let corpus = root.path().join("corpus.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": i.to_string(), "title": "", "text": t}).to_string())
        .collect();
    std::fs::write(&corpus, lines.join("\n")).unwrap();
    let tpl = "passage: {text}";
    let rendered: Vec<String> = texts.iter().map(|t| tpl.replace("{text}", t)).collect();
    // Rows 0–3 served (the last line is a query: no vector), written as the appliance writes them.
    let write = |enc: &Encoder, path: &Path| {
        let v = enc.embed_all(&rendered[..4], 2, &mut |_| {}).unwrap();
        let v = Tensor::cat(&[v, Tensor::zeros([1, enc.hidden_size()], (Kind::Float, Device::Cpu))], 0);
        let present = Tensor::from_slice(&[1f32, 1., 1., 1., 0.]);
        care_trainer::weights::save_tensors(
            [("vectors".to_string(), v), ("present".to_string(), present)].into_iter(),
            path,
        )
        .unwrap();
    };
    let own = root.path().join("own.safetensors");
    write(&d, &own);
    let served = care_trainer::train::served_vectors(&corpus, &own, tpl).unwrap();
    assert_eq!(served.rows.len(), 4, "only present rows are served");
    // The pool: two served passages, the query line's text and one text the index does not hold.
    let pool = vec![rendered[1].clone(), rendered[4].clone(), "passage: 不在索引中".to_string(), rendered[3].clone()];
    let DocSide::Frozen { vectors, index } =
        care_trainer::train::frozen_doc_side_with(&d, pool.clone(), 2, None, Some(&served)).unwrap()
    else {
        panic!("a frozen side")
    };
    let DocSide::Frozen { vectors: all, index: all_index } =
        care_trainer::train::frozen_doc_side(&d, pool.clone(), 2, None).unwrap()
    else {
        panic!("a frozen side")
    };
    for t in &pool {
        let (a, b) = (vectors.get(index[t]), all.get(all_index[t]));
        let diff = (&a - &b).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "{t}: served + embedded rows differ from embedding all ({diff})");
    }
    // Served vectors of another document encoder are refused, naming why.
    let theirs = root.path().join("theirs.safetensors");
    write(&other, &theirs);
    let served = care_trainer::train::served_vectors(&corpus, &theirs, tpl).unwrap();
    let err = care_trainer::train::frozen_doc_side_with(&d, pool, 2, None, Some(&served)).unwrap_err();
    assert!(err.to_string().contains("disagree with the document encoder"), "{err}");
}

/// Stage I with a query teacher (`--query-teacher`): the query-kind rows of the frozen side hold the teacher's
/// vectors of the text under its own prompt, the passages keep the document encoder's, and a key the side does not
/// hold is refused rather than silently skipped.
#[test]
fn a_query_teacher_replaces_only_the_query_rows_of_stage1s_frozen_side() {
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    let (dd, qd) = (t.path().join("doc"), t.path().join("teacher"));
    write_tiny_bert_with(&dd, 1, 0.0);
    write_tiny_bert_with(&qd, 2, 0.0);
    let doc = Encoder::load(&dd, Device::Cpu, Kind::Float).unwrap();
    let teacher = Encoder::load(&qd, Device::Cpu, Kind::Float).unwrap();
    let texts = vec!["w2 w10 w11".to_string(), "w3 w12".to_string()];
    let mut side = care_trainer::train::frozen_doc_side_with(&doc, texts.clone(), 4, None, None).unwrap();
    let rows = vec![("w3 w12".to_string(), "w1 w12".to_string())];
    care_trainer::train::realign_rows(&mut side, &teacher, &rows, 4).unwrap();
    let care_trainer::train::DocSide::Frozen { vectors, index } = &side else { panic!("frozen side expected") };
    let want_q = teacher.embed_all(&["w1 w12".to_string()], 4, &mut |_| {}).unwrap().get(0);
    let want_p = doc.embed_all(&texts[..1], 4, &mut |_| {}).unwrap().get(0);
    let got_q = vectors.get(index["w3 w12"]);
    let got_p = vectors.get(index["w2 w10 w11"]);
    assert!((got_q - &want_q).abs().max().double_value(&[]) < 1e-6, "the query row is the teacher's");
    assert!((got_p - want_p).abs().max().double_value(&[]) < 1e-6, "the passage row is the document encoder's");
    let doc_q = doc.embed_all(&texts[1..], 4, &mut |_| {}).unwrap().get(0);
    assert!((doc_q - want_q).abs().max().double_value(&[]) > 1e-3, "the two encoders differ, so the test can fail");
    let missing = vec![("w9 w9".to_string(), "w1 w9".to_string())];
    assert!(care_trainer::train::realign_rows(&mut side, &teacher, &missing, 4).is_err());
}

/// The appliance's door (`care-train run --spec`) and the library function it calls report the same run: a step
/// event per optimiser step and a checkpoint event per checkpoint, then `done`; a phase that cannot run ends with
/// `failed` and its code, and a spec of another version is refused before anything loads.
#[test]
fn stage2_as_a_library_function_and_through_run_spec_reports_steps_checkpoints_and_failures_as_events() {
    use care_formats::trainer::{
        Event, FailCode, Hyper, Phase, SPEC_VERSION, Stage, Stage2Options, Stage2Spec, StepKind, TrainSpec,
    };
    let _guard = serial();
    let t = tempfile::tempdir().unwrap();
    write_tiny_bert_with(&t.path().join("q"), 21, 0.0);
    write_tiny_bert_with(&t.path().join("d"), 22, 0.0);
    let train = t.path().join("train.jsonl");
    let lines: Vec<String> = examples(16).iter().map(|e| serde_json::to_string(e).unwrap()).collect();
    std::fs::write(&train, lines.join("\n") + "\n").unwrap();
    let spec = |out: &str| Stage2Spec {
        query: t.path().join("q"),
        document: t.path().join("d"),
        train: vec![train.clone()],
        out: t.path().join(out),
        served: None,
        options: Stage2Options { group_size: 3, freeze_document: true, ..Default::default() },
        hyper: Hyper {
            steps: 5,
            batch_size: 4,
            checkpoint_every: 2,
            lr: 1e-3,
            query_template: "{text}".into(),
            document_template: "{text}".into(),
            ..Default::default()
        },
    };

    // Called directly, as the stage commands and `run --spec` call it.
    let mut events = Vec::new();
    let outcome = care_trainer::stages::stage2(&spec("lib"), Device::Cpu, &mut |e| events.push(e)).unwrap();
    let steps: Vec<u64> = events
        .iter()
        .filter_map(|e| {
            let Event::Step { phase: StepKind::Train, step, total: 5, loss, .. } = e else { return None };
            loss.is_finite().then_some(*step)
        })
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5], "{events:?}");
    let checkpoints: Vec<u64> =
        events.iter().filter_map(|e| if let Event::Checkpoint { step, .. } = e { Some(*step) } else { None }).collect();
    // Every second step, and the last one (5 is no multiple of 2); the newest two are kept on disk.
    assert_eq!(checkpoints, [2, 4, 5], "{events:?}");
    let kept: Vec<u64> = care_trainer::train::list_checkpoints(&t.path().join("lib")).iter().map(|c| c.0).collect();
    assert_eq!(kept, [4, 5]);
    assert_eq!(outcome.summary["steps_run"], 5, "{outcome:?}");
    assert!(t.path().join("lib/query/model.safetensors").exists() && t.path().join("lib/metrics.jsonl").exists());

    // Through the binary: a spec file in, JSON lines out on stdout, the log on stderr.
    let run = |spec_text: String| {
        let file = t.path().join("spec.json");
        std::fs::write(&file, spec_text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_care-train"))
            .arg("run")
            .arg("--spec")
            .arg(&file)
            .output()
            .unwrap();
        let events: Vec<Event> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| Event::from_line(l).unwrap()).collect();
        (out.status.code(), events, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, events, log) = run(TrainSpec::new(Phase::Stage2(spec("bin")), "cpu", 1).to_json());
    assert_eq!(code, Some(0), "{log}");
    assert!(events[0].check_format().is_ok());
    assert!(matches!(&events[0], Event::Started { stage: Stage::Stage2, total: 5, .. }), "{events:?}");
    assert_eq!(events.iter().filter(|e| matches!(e, Event::Step { .. })).count(), 5, "{events:?}");
    assert_eq!(events.iter().filter(|e| matches!(e, Event::Checkpoint { .. })).count(), 3, "{events:?}");
    assert!(matches!(events.last(), Some(Event::Done { summary, .. }) if summary["steps_run"] == 5), "{events:?}");
    // The same seed and data: the binary's run is the library's, loss for loss (to rounding: libtorch's thread
    // count orders its reductions).
    let losses = |dir: &str| care_trainer::train::read_metrics(&t.path().join(dir).join("metrics.jsonl")).unwrap();
    let (lib, bin) = (losses("lib"), losses("bin"));
    assert_eq!(lib.len(), bin.len());
    for (a, b) in lib.iter().zip(&bin) {
        assert!((a.loss - b.loss).abs() <= 1e-5 * a.loss.abs().max(1.0), "{lib:?} {bin:?}");
    }

    // Nothing to train on: `failed` with the data code, exit status 1.
    let mut empty = spec("empty");
    empty.options.sources = vec!["no-such-source".into()];
    let (code, events, _) = run(TrainSpec::new(Phase::Stage2(empty), "cpu", 1).to_json());
    assert_eq!(code, Some(1));
    assert!(
        matches!(events.last(), Some(Event::Failed { code: FailCode::Data, message }) if message.contains("no training examples")),
        "{events:?}"
    );
    // Another version of the spec: refused before anything runs.
    let newer = TrainSpec::new(Phase::Stage2(spec("newer")), "cpu", 1)
        .to_json()
        .replace(&format!("\"version\": {SPEC_VERSION}"), "\"version\": 99");
    let (code, events, _) = run(newer);
    assert_eq!(code, Some(1));
    assert!(
        matches!(&events[..], [Event::Failed { code: FailCode::Spec, message }] if message.contains("version 99")),
        "{events:?}"
    );
    assert!(!t.path().join("newer").exists());
}

/// Issue 57: a query encoder trained on the vocabulary its run uses, its rows scattered back into the full model,
/// equals the same training on the full vocabulary: every row the run's texts use and every other tensor agree to
/// float rounding; the rows they never use keep the untrained model's values (the full run's weight decay shrinks
/// them, which is why the comparison is on the trained rows).
#[test]
fn training_on_a_pruned_vocabulary_and_scattering_back_equals_training_on_the_full_one() {
    let _guard = serial();
    tch::set_num_threads(1);
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    write_tiny_bert_with(&r.join("q"), 11, 0.0);
    write_tiny_qwen(&r.join("d"), 12);
    let ex = examples(8);
    let texts: Vec<String> =
        ex.iter().flat_map(|e| std::iter::once(e.query.clone()).chain(e.pos.clone()).chain(e.neg.clone())).collect();
    let kept = care_trainer::vocab::kept_ids(&r.join("q"), &texts).unwrap();
    assert!(kept.len() < WORDS + 2 && kept.contains(&0) && kept.contains(&1), "{kept:?}");
    care_trainer::vocab::prune(&r.join("q"), &kept, &r.join("q-pruned")).unwrap();
    let train = |query: &str, out: &str| {
        tch::manual_seed(7);
        let mut q = Encoder::load(&r.join(query), Device::Cpu, Kind::Float).unwrap();
        let d = Encoder::load(&r.join("d"), Device::Cpu, Kind::Float).unwrap();
        let side = care_trainer::train::frozen_doc_side(&d, care_trainer::data::document_pool(&ex), 4, None).unwrap();
        let mut cfg = config(5, 0);
        cfg.hyper.lr = 5e-3;
        cfg.loss.group_size = 2;
        let params = select_trainable(&q, "query.", &|_| true);
        let mut t = Trainer::new(&q, side, &ex, cfg, params, &r.join(format!("{out}-run"))).unwrap();
        t.run(None).unwrap();
        drop(t);
        q.save(&r.join(out), false).unwrap();
    };
    train("q", "full");
    train("q-pruned", "pruned");
    care_trainer::vocab::scatter(&r.join("pruned"), &r.join("q"), &r.join("merged")).unwrap();
    let load = |d: &str| Weights::load_dir(&r.join(d), Device::Cpu, Kind::Float).unwrap();
    let (full, merged, before) = (load("full"), load("merged"), load("q"));
    let word = "embeddings.word_embeddings.weight";
    let kept_rows: Vec<i64> = kept.iter().map(|&i| i64::from(i)).collect();
    for (name, t) in full.iter() {
        let m = merged.get(name, &t.size()).unwrap();
        let (a, b) = match name.as_str() {
            n if n == word => {
                let idx = Tensor::from_slice(&kept_rows);
                (t.index_select(0, &idx), m.index_select(0, &idx))
            }
            _ => (t.shallow_clone(), m),
        };
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff <= 1e-5, "{name}: differs by {diff}");
    }
    let (m, b) =
        (merged.get(word, &[(WORDS + 2) as i64, 16]).unwrap(), before.get(word, &[(WORDS + 2) as i64, 16]).unwrap());
    for row in (0..(WORDS + 2) as i64).filter(|i| !kept_rows.contains(i)) {
        assert_eq!(
            Vec::<f32>::try_from(m.get(row)).unwrap(),
            Vec::<f32>::try_from(b.get(row)).unwrap(),
            "unused row {row}"
        );
    }
    let trained = full.get(word, &[(WORDS + 2) as i64, 16]).unwrap();
    let moved = (trained.index_select(0, &Tensor::from_slice(&kept_rows))
        - b.index_select(0, &Tensor::from_slice(&kept_rows)))
    .abs()
    .max()
    .double_value(&[]);
    assert!(moved > 1e-4, "the kept rows did not train ({moved})");
}

/// Issue 57: what a lent GPU machine brings back. Stage II on both sides with `document_adapters` saves the document
/// side unmerged (which no loader takes for a model); `carry-out` keeps the query encoder's trained tensors in bf16
/// and the document side's adapters, leaving the frozen word embeddings and the document's start behind; `carry-in`
/// over the same starts rebuilds the document side exactly as Stage II would have merged it and the query encoder
/// to bf16's rounding, and refuses a start that is not the one trained from.
#[test]
fn carried_off_and_back_in_a_stage_two_run_is_the_run_to_bf16_rounding() {
    use care_formats::trainer::{Hyper, Lora, Stage2Options, Stage2Spec};
    use care_trainer::carry::{carry_in, carry_out};
    let _guard = serial();
    tch::set_num_threads(1);
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write_tiny_bert_with(&r.join("q"), 31, 0.0);
    write_tiny_bert_with(&r.join("d"), 32, 0.0);
    let train = r.join("train.jsonl");
    let lines: Vec<String> = examples(16).iter().map(|e| serde_json::to_string(e).unwrap()).collect();
    std::fs::write(&train, lines.join("\n") + "\n").unwrap();
    let spec = |out: &str, adapters: bool| Stage2Spec {
        query: r.join("q"),
        document: r.join("d"),
        train: vec![train.clone()],
        out: r.join(out),
        served: None,
        options: Stage2Options {
            group_size: 3,
            lora: Lora { rank: 4, alpha: 8.0, targets: Vec::new() },
            document_adapters: adapters,
            ..Default::default()
        },
        hyper: Hyper {
            steps: 4,
            batch_size: 4,
            lr: 1e-2,
            freeze_embeddings: true,
            checkpoint_every: 100,
            query_template: "{text}".into(),
            document_template: "{text}".into(),
            ..Default::default()
        },
    };
    care_trainer::stages::stage2(&spec("merged", false), Device::Cpu, &mut |_| {}).unwrap();
    care_trainer::stages::stage2(&spec("unmerged", true), Device::Cpu, &mut |_| {}).unwrap();
    let err = Encoder::load(&r.join("unmerged/document"), Device::Cpu, Kind::Float).unwrap_err();
    assert!(err.to_string().contains("carry-in"), "{err}");

    let q = carry_out(&r.join("unmerged/query"), &r.join("q"), &r.join("carry-q")).unwrap();
    let d = carry_out(&r.join("unmerged/document"), &r.join("d"), &r.join("carry-d")).unwrap();
    let names = |dir: &str| Weights::load_dir(&r.join(dir), Device::Cpu, Kind::Float).unwrap().names();
    let carried = |dir: &str| care_trainer::weights::load_tensors(&r.join(dir).join("tensors.safetensors")).unwrap();
    // The query side: everything but the frozen word embeddings, in bf16.
    let cq = carried("carry-q");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(r.join("carry-q/carry.json")).unwrap()).unwrap();
    let kept: Vec<&String> = manifest["kept"].as_object().unwrap().keys().collect();
    // Left behind: the frozen word embeddings, and the key biases, which no gradient reaches (a softmax does not
    // see the same number added to every score).
    assert_eq!(
        kept,
        [
            "embeddings.word_embeddings.weight",
            "encoder.layer.0.attention.self.key.bias",
            "encoder.layer.1.attention.self.key.bias"
        ],
        "{q:?}"
    );
    assert!(!cq.contains_key("embeddings.word_embeddings.weight") && cq.len() + 3 == names("q").len());
    assert!(cq.values().all(|t| t.kind() == Kind::BFloat16));
    // The document side: only its adapters (4 projections × 2 layers × A, B), f32.
    let cd = carried("carry-d");
    assert_eq!((cd.len(), d.kept), (16, names("d").len()), "{:?}", cd.keys().collect::<Vec<_>>());
    assert!(cd.iter().all(|(n, t)| n.contains(".lora_") && t.kind() == Kind::Float));

    carry_in(&r.join("carry-q"), &r.join("q"), &r.join("back-q")).unwrap();
    carry_in(&r.join("carry-d"), &r.join("d"), &r.join("back-d")).unwrap();
    let load = |dir: &str| Weights::load_dir(&r.join(dir), Device::Cpu, Kind::Float).unwrap();
    let worst = |a: &Weights, b: &Weights| {
        assert_eq!(a.names(), b.names());
        a.iter()
            .map(|(n, x)| {
                let y = b.get(n, &x.size()).unwrap();
                ((x - &y).abs().max().double_value(&[]) / y.abs().max().double_value(&[]).max(1e-12), n.clone())
            })
            .fold((0.0, String::new()), |m, v| if v.0 > m.0 { v } else { m })
    };
    let (rel, name) = worst(&load("back-d"), &load("merged/document"));
    assert!(rel <= 1e-5, "document side {name}: {rel}");
    let (rel, name) = worst(&load("back-q"), &load("merged/query"));
    assert!(rel <= 1.0 / 256.0, "query side {name}: {rel}");
    // Trained at all: the query side moved by more than its rounding.
    let (moved, _) = worst(&load("back-q"), &load("q"));
    assert!(moved > 1e-2, "{moved}");
    // The embeddings of the rebuilt encoders are the run's.
    let texts: Vec<String> = examples(4).iter().map(|e| e.query.clone()).collect();
    for (a, b) in [("back-q", "merged/query"), ("back-d", "merged/document")] {
        let ea =
            Encoder::load(&r.join(a), Device::Cpu, Kind::Float).unwrap().embed_all(&texts, 4, &mut |_| {}).unwrap();
        let eb =
            Encoder::load(&r.join(b), Device::Cpu, Kind::Float).unwrap().embed_all(&texts, 4, &mut |_| {}).unwrap();
        let cos = (&ea * &eb).sum_dim_intlist(1, false, Kind::Float).min().double_value(&[]);
        assert!(cos > 0.999, "{a}: cosine {cos}");
    }
    // Another start is refused: its word embeddings are not the frozen ones.
    let err = carry_in(&r.join("carry-q"), &r.join("d"), &r.join("wrong")).unwrap_err();
    assert!(err.to_string().contains("not the one trained from"), "{err}");
}
