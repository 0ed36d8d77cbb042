//! BERT / XLM-RoBERTa encoder (Hugging Face `BertModel` / `XLMRobertaModel` names), the query encoder.
//!
//! The two differ only in position ids: XLM-R counts from `padding_idx + 1` over non-pad tokens and gives pad
//! tokens `padding_idx`; BERT counts `0..len`. Attention uses an additive mask with the dtype's minimum, as
//! `transformers` does, so fully-masked rows stay finite.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::attention::{Attention, Mask, attend};
use super::linear::{Linear, layer_norm};
use crate::weights::Weights;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    pub max_position_embeddings: i64,
    #[serde(default = "one")]
    pub type_vocab_size: i64,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub pad_token_id: i64,
    #[serde(default)]
    pub bos_token_id: Option<i64>,
    #[serde(default)]
    pub eos_token_id: Option<i64>,
    #[serde(default = "default_dropout")]
    pub hidden_dropout_prob: f64,
    #[serde(default = "default_dropout")]
    pub attention_probs_dropout_prob: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

fn default_model_type() -> String {
    "bert".into()
}
fn one() -> i64 {
    1
}
fn default_eps() -> f64 {
    1e-12
}
fn default_dropout() -> f64 {
    0.1
}
fn default_act() -> String {
    "gelu".into()
}

impl BertConfig {
    pub fn load(dir: &Path) -> Result<Self> {
        let p = dir.join("config.json");
        let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
        let cfg: Self = serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", p.display())))?;
        if cfg.hidden_size % cfg.num_attention_heads != 0 {
            return Err(Error::Config(format!(
                "{}: hidden_size {} is not a multiple of num_attention_heads {}",
                p.display(),
                cfg.hidden_size,
                cfg.num_attention_heads
            )));
        }
        if cfg.hidden_act != "gelu" {
            return Err(Error::Config(format!(
                "{}: hidden_act {:?} is not supported (gelu only)",
                p.display(),
                cfg.hidden_act
            )));
        }
        Ok(cfg)
    }

    pub fn is_xlm_roberta(&self) -> bool {
        self.model_type == "xlm-roberta" || self.model_type == "roberta"
    }

    /// The exporter's view of this config.
    pub fn to_modelio(&self) -> care_modelio::BertConfig {
        care_modelio::BertConfig {
            vocab_size: self.vocab_size as usize,
            hidden_size: self.hidden_size as usize,
            num_hidden_layers: self.num_hidden_layers as usize,
            num_attention_heads: self.num_attention_heads as usize,
            intermediate_size: self.intermediate_size as usize,
            max_position_embeddings: self.max_position_embeddings as usize,
            type_vocab_size: self.type_vocab_size as usize,
            layer_norm_eps: self.layer_norm_eps as f32,
            pad_token_id: self.pad_token_id as u32,
            bos_token_id: self.bos_token_id.unwrap_or(0) as u32,
            eos_token_id: self.eos_token_id.unwrap_or(2) as u32,
            position_ids: if self.is_xlm_roberta() {
                care_modelio::PositionIds::XlmRoberta { padding_idx: self.pad_token_id }
            } else {
                care_modelio::PositionIds::Bert
            },
        }
    }

    /// Writes `config.json` as `transformers` would (via the exporter's writer), with `model_type` kept.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = self.to_modelio().to_hf_config_json();
        v["hidden_dropout_prob"] = self.hidden_dropout_prob.into();
        v["attention_probs_dropout_prob"] = self.attention_probs_dropout_prob.into();
        v
    }
}

#[derive(Debug)]
struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    ao: Linear,
    aln_w: Tensor,
    aln_b: Tensor,
    fi: Linear,
    fo: Linear,
    oln_w: Tensor,
    oln_b: Tensor,
}

#[derive(Debug)]
pub struct Bert {
    pub cfg: BertConfig,
    word: Tensor,
    pos: Tensor,
    ttype: Tensor,
    eln_w: Tensor,
    eln_b: Tensor,
    layers: Vec<Layer>,
    pub weights: Weights,
    /// Fused by default; the eager path is the reference in tests.
    pub attention: Attention,
}

impl Bert {
    pub fn new(cfg: &BertConfig, weights: Weights) -> Result<Self> {
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let w = &weights;
        let mut layers = Vec::new();
        for l in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            layers.push(Layer {
                q: Linear::load(w, &format!("{p}.attention.self.query"), h, h, true)?,
                k: Linear::load(w, &format!("{p}.attention.self.key"), h, h, true)?,
                v: Linear::load(w, &format!("{p}.attention.self.value"), h, h, true)?,
                ao: Linear::load(w, &format!("{p}.attention.output.dense"), h, h, true)?,
                aln_w: w.get(&format!("{p}.attention.output.LayerNorm.weight"), &[h])?,
                aln_b: w.get(&format!("{p}.attention.output.LayerNorm.bias"), &[h])?,
                fi: Linear::load(w, &format!("{p}.intermediate.dense"), h, ff, true)?,
                fo: Linear::load(w, &format!("{p}.output.dense"), ff, h, true)?,
                oln_w: w.get(&format!("{p}.output.LayerNorm.weight"), &[h])?,
                oln_b: w.get(&format!("{p}.output.LayerNorm.bias"), &[h])?,
            });
        }
        Ok(Self {
            cfg: cfg.clone(),
            word: w.get("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?,
            pos: w.get("embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, h])?,
            ttype: w.get("embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, h])?,
            eln_w: w.get("embeddings.LayerNorm.weight", &[h])?,
            eln_b: w.get("embeddings.LayerNorm.bias", &[h])?,
            layers,
            weights,
            attention: Attention::default(),
        })
    }

    /// Loads `config.json` + `model.safetensors` from a Hugging Face model folder.
    pub fn load(dir: &Path, device: tch::Device) -> Result<Self> {
        let cfg = BertConfig::load(dir)?;
        let w = Weights::load_dir(dir, device, Kind::Float)?;
        Self::new(&cfg, w)
    }

    /// `[batch, seq]` int64 ids and 0/1 mask → last hidden state `[batch, seq, hidden]`.
    pub fn forward_t(&self, ids: &Tensor, mask: &Tensor, train: bool) -> Tensor {
        let cfg = &self.cfg;
        let (b, l) = (ids.size()[0], ids.size()[1]);
        let device = ids.device();
        let positions = if cfg.is_xlm_roberta() {
            let m = ids.ne(cfg.pad_token_id).to_kind(Kind::Int64);
            m.cumsum(1, Kind::Int64) * &m + cfg.pad_token_id
        } else {
            Tensor::arange(l, (Kind::Int64, device)).unsqueeze(0).expand([b, l], false)
        };
        let x = Tensor::embedding(&self.word, ids, -1, false, false)
            + Tensor::embedding(&self.pos, &positions, -1, false, false)
            + self.ttype.get(0);
        let mut x =
            layer_norm(&x, &self.eln_w, &self.eln_b, cfg.layer_norm_eps).dropout(cfg.hidden_dropout_prob, train);
        let kind = x.kind();
        let min = if kind == Kind::Float { f64::from(f32::MIN) } else { -65504.0 };
        let bias = (mask.to_kind(kind).neg() + 1.0).view([b, 1, 1, l]) * min;
        // No padding (one sync per forward): no mask, so the kernel may take flash attention.
        let padded = mask.min().int64_value(&[]) == 0;
        let nh = cfg.num_attention_heads;
        let hd = cfg.hidden_size / nh;
        for layer in &self.layers {
            let heads = |t: Tensor| t.view([b, l, nh, hd]).transpose(1, 2);
            let q = heads(layer.q.forward(&x));
            let k = heads(layer.k.forward(&x));
            let v = heads(layer.v.forward(&x));
            let drop = cfg.attention_probs_dropout_prob;
            let m = if padded { Mask::Bias(&bias) } else { Mask::None };
            let ctx = attend(self.attention, &q, &k, &v, m, drop, train);
            let ctx = ctx.transpose(1, 2).contiguous().view([b, l, cfg.hidden_size]);
            let a = layer.ao.forward(&ctx).dropout(cfg.hidden_dropout_prob, train);
            x = layer_norm(&(a + &x), &layer.aln_w, &layer.aln_b, cfg.layer_norm_eps);
            let f = layer.fi.forward(&x).gelu("none");
            let f = layer.fo.forward(&f).dropout(cfg.hidden_dropout_prob, train);
            x = layer_norm(&(f + &x), &layer.oln_w, &layer.oln_b, cfg.layer_norm_eps);
        }
        x
    }

    /// Adds LoRA adapters to the linear layers whose short name is in `targets`
    /// (`query`, `key`, `value`, `attention.output.dense` as `dense`, `intermediate`, `output`).
    pub fn add_lora(&mut self, targets: &[String], rank: i64, alpha: f64, b_std: f64) {
        for layer in &mut self.layers {
            for (short, lin) in [
                ("query", &mut layer.q),
                ("key", &mut layer.k),
                ("value", &mut layer.v),
                ("dense", &mut layer.ao),
                ("intermediate", &mut layer.fi),
                ("output", &mut layer.fo),
            ] {
                if targets.iter().any(|t| t == short) {
                    lin.add_lora(&mut self.weights, rank, alpha, b_std);
                }
            }
        }
    }

    pub fn merge_lora(&mut self) {
        for layer in &mut self.layers {
            for lin in [&mut layer.q, &mut layer.k, &mut layer.v, &mut layer.ao, &mut layer.fi, &mut layer.fo] {
                lin.merge_lora(&mut self.weights);
            }
        }
    }

    /// Keeps the layers `keep` (ascending indices), renumbered 0.. (query-encoder initialisation by pruning).
    pub fn prune_layers(cfg: &BertConfig, w: Weights, keep: &[i64]) -> Result<(BertConfig, Weights)> {
        let n = cfg.num_hidden_layers;
        if keep.is_empty() || keep.windows(2).any(|p| p[0] >= p[1]) || keep.iter().any(|&i| i < 0 || i >= n) {
            return Err(Error::Config(format!("cannot keep layers {keep:?} of {n}")));
        }
        let mut out = Weights::new();
        for (name, t) in w.iter() {
            if let Some((idx, tail)) = name.strip_prefix("encoder.layer.").and_then(|r| r.split_once('.')) {
                let idx: i64 = idx.parse().unwrap_or(-1);
                if let Some(pos) = keep.iter().position(|&i| i == idx) {
                    out.insert(format!("encoder.layer.{pos}.{tail}"), t.shallow_clone());
                }
            } else if !name.starts_with("pooler.") {
                out.insert(name.clone(), t.shallow_clone());
            }
        }
        let mut cfg = cfg.clone();
        cfg.num_hidden_layers = keep.len() as i64;
        Ok((cfg, out))
    }

    /// A random model (tests, fixtures): normal(0, 0.02) weights, unit norms.
    pub fn random(cfg: &BertConfig, device: tch::Device) -> Result<Self> {
        let mut w = Weights::new();
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let s = 0.02;
        w.randn("embeddings.word_embeddings.weight", &[cfg.vocab_size, h], s, device);
        w.randn("embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, h], s, device);
        w.randn("embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, h], s, device);
        let norm = |w: &mut Weights, p: &str| {
            w.insert(format!("{p}.weight"), Tensor::ones([h], (Kind::Float, device)));
            w.insert(format!("{p}.bias"), Tensor::zeros([h], (Kind::Float, device)));
        };
        norm(&mut w, "embeddings.LayerNorm");
        for l in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for (n, i, o) in [
                ("attention.self.query", h, h),
                ("attention.self.key", h, h),
                ("attention.self.value", h, h),
                ("attention.output.dense", h, h),
                ("intermediate.dense", h, ff),
                ("output.dense", ff, h),
            ] {
                w.randn(&format!("{p}.{n}.weight"), &[o, i], s, device);
                w.randn(&format!("{p}.{n}.bias"), &[o], s, device);
            }
            norm(&mut w, &format!("{p}.attention.output.LayerNorm"));
            norm(&mut w, &format!("{p}.output.LayerNorm"));
        }
        Self::new(cfg, w)
    }
}
