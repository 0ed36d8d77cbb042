//! Qwen3 decoder (Hugging Face `Qwen3Model` names), the document encoder with last-token pooling.
//!
//! RMSNorm, rotary position embeddings (rotate-half form), grouped-query attention with per-head RMSNorm on
//! queries and keys, SwiGLU MLP, causal attention. Inputs are left-padded so the last position of every row is
//! a real token; positions count `0..len` as `transformers` does without explicit position ids — RoPE scores
//! depend only on relative offsets, so the left pad does not change real tokens' outputs.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::attention::{Attention, Mask, attend};
use super::linear::{Linear, rms_norm};
use crate::weights::Weights;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_maxpos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub attention_dropout: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub eos_token_id: Option<i64>,
    #[serde(default)]
    pub pad_token_id: Option<i64>,
}

fn default_model_type() -> String {
    "qwen3".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    1_000_000.0
}
fn default_maxpos() -> i64 {
    32768
}
fn default_act() -> String {
    "silu".into()
}

impl Qwen3Config {
    pub fn load(dir: &Path) -> Result<Self> {
        let p = dir.join("config.json");
        let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
        let cfg: Self = serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", p.display())))?;
        if cfg.num_attention_heads % cfg.num_key_value_heads != 0 {
            return Err(Error::Config(format!(
                "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                p.display(),
                cfg.num_attention_heads,
                cfg.num_key_value_heads
            )));
        }
        if cfg.hidden_act != "silu" {
            return Err(Error::Config(format!(
                "{}: hidden_act {:?} is not supported (silu only)",
                p.display(),
                cfg.hidden_act
            )));
        }
        Ok(cfg)
    }

    pub fn head_dim(&self) -> i64 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }
}

#[derive(Debug)]
struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
    in_norm: Tensor,
    post_norm: Tensor,
}

#[derive(Debug)]
pub struct Qwen3 {
    pub cfg: Qwen3Config,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    pub weights: Weights,
    /// Fused by default; the eager path is the reference in tests.
    pub attention: Attention,
}

/// `cat(-x2, x1)` over the last dimension.
fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[x2.neg(), x1], -1)
}

impl Qwen3 {
    pub fn new(cfg: &Qwen3Config, weights: Weights) -> Result<Self> {
        let (h, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let w = &weights;
        let mut layers = Vec::new();
        for l in 0..cfg.num_hidden_layers {
            let p = format!("layers.{l}");
            let ab = cfg.attention_bias;
            layers.push(Layer {
                q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, nh * hd, ab)?,
                k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, nkv * hd, ab)?,
                v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, nkv * hd, ab)?,
                o: Linear::load(w, &format!("{p}.self_attn.o_proj"), nh * hd, h, ab)?,
                q_norm: w.get(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                k_norm: w.get(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                gate: Linear::load(w, &format!("{p}.mlp.gate_proj"), h, ff, false)?,
                up: Linear::load(w, &format!("{p}.mlp.up_proj"), h, ff, false)?,
                down: Linear::load(w, &format!("{p}.mlp.down_proj"), ff, h, false)?,
                in_norm: w.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_norm: w.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
            });
        }
        Ok(Self {
            cfg: cfg.clone(),
            embed: w.get("embed_tokens.weight", &[cfg.vocab_size, h])?,
            layers,
            norm: w.get("norm.weight", &[h])?,
            weights,
            attention: Attention::default(),
        })
    }

    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self> {
        let cfg = Qwen3Config::load(dir)?;
        let mut w = Weights::load_dir(dir, device, kind)?;
        // A `Qwen3ForCausalLM` checkpoint's output head: an embedding model never uses it, and for an 8B model it
        // is 151k × 4096 parameters that would sit in GPU memory (and in every saved copy).
        w.remove("lm_head.weight");
        Self::new(&cfg, w)
    }

    fn rope(&self, l: i64, device: Device) -> (Tensor, Tensor) {
        let hd = self.cfg.head_dim();
        let inv = Tensor::arange_start_step(0, hd, 2, (Kind::Int64, device)).to_kind(Kind::Float) / hd as f64;
        let inv = (inv * self.cfg.rope_theta.ln()).exp().reciprocal();
        let pos = Tensor::arange(l, (Kind::Float, device));
        let freqs = pos.unsqueeze(1) * inv.unsqueeze(0);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (emb.cos(), emb.sin())
    }

    /// `[batch, seq]` ids and 0/1 mask (left padding) → final-norm hidden states `[batch, seq, hidden]`.
    // `x = x + …`, not `x += …`: on a tch Tensor `+=` is the in-place `add_`, which overwrites a value autograd
    // saved for the backward pass.
    #[allow(clippy::assign_op_pattern)]
    pub fn forward_t(&self, ids: &Tensor, mask: &Tensor, train: bool) -> Tensor {
        let cfg = &self.cfg;
        let (b, l) = (ids.size()[0], ids.size()[1]);
        let device = ids.device();
        let mut x = Tensor::embedding(&self.embed, ids, -1, false, false);
        let kind = x.kind();
        let (cos, sin) = self.rope(l, device);
        let (cos, sin) = (cos.to_kind(kind), sin.to_kind(kind));
        let (nh, nkv, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim());
        // No padding (one sync per forward): causal attention needs no mask tensor and may take the flash kernel.
        let padded = mask.min().int64_value(&[]) == 0;
        let bias = padded.then(|| {
            let causal = Tensor::ones([l, l], (Kind::Bool, device)).tril(0);
            let keep = causal.view([1, 1, l, l]).logical_and(&mask.to_kind(Kind::Bool).view([b, 1, 1, l]));
            // A masked score must stay finite after the score is added to it: a left-padded row sees only masked
            // keys, and an all −inf row is NaN after softmax. f32::MIN + s stays f32::MIN; in fp16, −65504 + s
            // overflows to −inf, and bf16 rounds f32::MIN itself to −inf.
            let min = if kind == Kind::Half {
                -1e4
            } else if kind == Kind::BFloat16 {
                -1e30
            } else {
                f64::from(f32::MIN)
            };
            Tensor::zeros([b, 1, l, l], (kind, device)).masked_fill(&keep.logical_not(), min)
        });
        for layer in &self.layers {
            let h = rms_norm(&x, &layer.in_norm, cfg.rms_norm_eps);
            let q =
                rms_norm(&layer.q.forward(&h).view([b, l, nh, hd]), &layer.q_norm, cfg.rms_norm_eps).transpose(1, 2);
            let k =
                rms_norm(&layer.k.forward(&h).view([b, l, nkv, hd]), &layer.k_norm, cfg.rms_norm_eps).transpose(1, 2);
            let v = layer.v.forward(&h).view([b, l, nkv, hd]).transpose(1, 2);
            let q = &q * &cos + rotate_half(&q) * &sin;
            let k = &k * &cos + rotate_half(&k) * &sin;
            let m = bias.as_ref().map_or(Mask::Causal, Mask::Bias);
            let ctx = attend(self.attention, &q, &k, &v, m, cfg.attention_dropout, train);
            let ctx = ctx.transpose(1, 2).contiguous().view([b, l, nh * hd]);
            x = x + layer.o.forward(&ctx);
            let h = rms_norm(&x, &layer.post_norm, cfg.rms_norm_eps);
            let m = layer.down.forward(&(layer.gate.forward(&h).silu() * layer.up.forward(&h)));
            x = x + m;
        }
        rms_norm(&x, &self.norm, cfg.rms_norm_eps)
    }

    /// LoRA on the projections named in `targets` (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`), as PEFT names them.
    pub fn add_lora(&mut self, targets: &[String], rank: i64, alpha: f64, b_std: f64) {
        for layer in &mut self.layers {
            for (short, lin) in [
                ("q_proj", &mut layer.q),
                ("k_proj", &mut layer.k),
                ("v_proj", &mut layer.v),
                ("o_proj", &mut layer.o),
                ("gate_proj", &mut layer.gate),
                ("up_proj", &mut layer.up),
                ("down_proj", &mut layer.down),
            ] {
                if targets.iter().any(|t| t == short) {
                    lin.add_lora(&mut self.weights, rank, alpha, b_std);
                }
            }
        }
    }

    pub fn merge_lora(&mut self) {
        for layer in &mut self.layers {
            for lin in [
                &mut layer.q,
                &mut layer.k,
                &mut layer.v,
                &mut layer.o,
                &mut layer.gate,
                &mut layer.up,
                &mut layer.down,
            ] {
                lin.merge_lora(&mut self.weights);
            }
        }
    }

    /// A random model for tests: normal(0, 0.02) projections, unit norms.
    pub fn random(cfg: &Qwen3Config, device: Device) -> Result<Self> {
        let mut w = Weights::new();
        let (h, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let s = 0.02;
        w.randn("embed_tokens.weight", &[cfg.vocab_size, h], s, device);
        w.insert("norm.weight", Tensor::ones([h], (Kind::Float, device)));
        for l in 0..cfg.num_hidden_layers {
            let p = format!("layers.{l}");
            for (n, i, o) in [
                ("self_attn.q_proj", h, nh * hd),
                ("self_attn.k_proj", h, nkv * hd),
                ("self_attn.v_proj", h, nkv * hd),
                ("self_attn.o_proj", nh * hd, h),
                ("mlp.gate_proj", h, ff),
                ("mlp.up_proj", h, ff),
                ("mlp.down_proj", ff, h),
            ] {
                w.randn(&format!("{p}.{n}.weight"), &[o, i], s, device);
                if cfg.attention_bias && n.starts_with("self_attn") {
                    w.randn(&format!("{p}.{n}.bias"), &[o], s, device);
                }
            }
            for n in ["self_attn.q_norm", "self_attn.k_norm"] {
                w.insert(format!("{p}.{n}.weight"), Tensor::ones([hd], (Kind::Float, device)));
            }
            for n in ["input_layernorm", "post_attention_layernorm"] {
                w.insert(format!("{p}.{n}.weight"), Tensor::ones([h], (Kind::Float, device)));
            }
        }
        Self::new(cfg, w)
    }
}
