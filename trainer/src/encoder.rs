//! An encoder = model + tokenizer + pooling: texts in, vectors out.
//!
//! A model folder is a Hugging Face one (`config.json`, `model.safetensors`, `tokenizer.json`) plus an optional
//! `encoder.json` the trainer writes (pooling, max length, LoRA settings), so a folder the trainer saved is
//! loaded exactly as it was trained. BERT/XLM-R pads on the right and defaults to mean pooling (e5); Qwen3 pads
//! on the left, appends the end-of-text token and pools the last token.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use care_formats::Pooling;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::models::{Bert, BertConfig, Qwen3, Qwen3Config};
use crate::pooling::pool;
use crate::{Error, Result};

pub const ENCODER_FILE: &str = "encoder.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderSettings {
    pub pooling: Pooling,
    pub max_length: usize,
    /// Appended after tokenisation when the tokenizer does not add it (Qwen3's `<|endoftext|>`).
    #[serde(default)]
    pub append_eos: Option<u32>,
}

#[derive(Debug)]
pub enum Model {
    Bert(Bert),
    Qwen3(Qwen3),
}

impl Model {
    pub fn forward_t(&self, ids: &Tensor, mask: &Tensor, train: bool) -> Tensor {
        match self {
            Model::Bert(m) => m.forward_t(ids, mask, train),
            Model::Qwen3(m) => m.forward_t(ids, mask, train),
        }
    }

    pub fn hidden_size(&self) -> i64 {
        match self {
            Model::Bert(m) => m.cfg.hidden_size,
            Model::Qwen3(m) => m.cfg.hidden_size,
        }
    }

    pub fn weights(&self) -> &crate::weights::Weights {
        match self {
            Model::Bert(m) => &m.weights,
            Model::Qwen3(m) => &m.weights,
        }
    }

    pub fn add_lora(&mut self, targets: &[String], rank: i64, alpha: f64, b_std: f64) {
        match self {
            Model::Bert(m) => m.add_lora(targets, rank, alpha, b_std),
            Model::Qwen3(m) => m.add_lora(targets, rank, alpha, b_std),
        }
    }

    pub fn merge_lora(&mut self) {
        match self {
            Model::Bert(m) => m.merge_lora(),
            Model::Qwen3(m) => m.merge_lora(),
        }
    }

    pub fn config_json(&self) -> serde_json::Value {
        match self {
            Model::Bert(m) => m.cfg.to_json(),
            Model::Qwen3(m) => serde_json::to_value(&m.cfg).unwrap_or_default(),
        }
    }
}

/// Token ids and mask for a batch, padded on one side.
#[derive(Debug)]
pub struct Batch {
    pub ids: Tensor,
    pub mask: Tensor,
}

#[derive(Debug)]
pub struct Encoder {
    pub model: Model,
    pub tokenizer: tokenizers::Tokenizer,
    pub settings: EncoderSettings,
    pub pad_id: u32,
    pub left_pad: bool,
    pub source: PathBuf,
    pub device: Device,
}

fn model_type(dir: &Path) -> Result<String> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", p.display())))?;
    Ok(v["model_type"].as_str().unwrap_or("bert").to_string())
}

impl Encoder {
    /// Loads a model folder on `device`; `kind` is the floating-point type of the weights (f32 to train).
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self> {
        // An unmerged Stage II document side would load as its start, the adapters ignored.
        if dir.join(crate::carry::LORA_FILE).exists() {
            return Err(Error::Config(format!(
                "{}: LoRA adapters not folded in (care-train carry-out, then carry-in, makes it a model)",
                dir.display()
            )));
        }
        let mt = model_type(dir)?;
        let (model, default_settings, left_pad) = match mt.as_str() {
            "bert" | "xlm-roberta" | "roberta" => {
                let cfg = BertConfig::load(dir)?;
                let w = crate::weights::Weights::load_dir(dir, device, kind)?;
                let max = if cfg.is_xlm_roberta() {
                    (cfg.max_position_embeddings - cfg.pad_token_id - 1) as usize
                } else {
                    cfg.max_position_embeddings as usize
                };
                (
                    Model::Bert(Bert::new(&cfg, w)?),
                    EncoderSettings { pooling: Pooling::Mean, max_length: max.min(512), append_eos: None },
                    false,
                )
            }
            "qwen3" => {
                let cfg = Qwen3Config::load(dir)?;
                let w = crate::weights::Weights::load_dir(dir, device, kind)?;
                let eos = cfg.eos_token_id.map(|e| e as u32);
                (
                    Model::Qwen3(Qwen3::new(&cfg, w)?),
                    EncoderSettings { pooling: Pooling::LastToken, max_length: 512, append_eos: eos },
                    true,
                )
            }
            other => {
                return Err(Error::Config(format!(
                    "{}: model_type {other:?} is not supported (bert, xlm-roberta, qwen3)",
                    dir.display()
                )));
            }
        };
        let settings = match std::fs::read_to_string(dir.join(ENCODER_FILE)) {
            Ok(t) => serde_json::from_str(&t)
                .map_err(|e| Error::Config(format!("{}: {e}", dir.join(ENCODER_FILE).display())))?,
            Err(_) => default_settings,
        };
        let tp = dir.join("tokenizer.json");
        let mut tokenizer =
            tokenizers::Tokenizer::from_file(&tp).map_err(|e| Error::Config(format!("{}: {e}", tp.display())))?;
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: settings.max_length - usize::from(settings.append_eos.is_some()),
                ..Default::default()
            }))
            .map_err(|e| Error::Config(e.to_string()))?;
        tokenizer.with_padding(None);
        let pad_id = ["<pad>", "[PAD]", "<|endoftext|>"].iter().find_map(|t| tokenizer.token_to_id(t)).unwrap_or(0);
        Ok(Self { model, tokenizer, settings, pad_id, left_pad, source: dir.to_path_buf(), device })
    }

    pub fn hidden_size(&self) -> i64 {
        self.model.hidden_size()
    }

    /// Tokenises, truncates and pads a batch.
    pub fn tokenize(&self, texts: &[&str]) -> Result<Batch> {
        let enc =
            self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| Error::Data(format!("tokenising: {e}")))?;
        let mut rows: Vec<Vec<i64>> = enc.iter().map(|e| e.get_ids().iter().map(|&i| i64::from(i)).collect()).collect();
        if let Some(eos) = self.settings.append_eos {
            for r in &mut rows {
                if r.last() != Some(&i64::from(eos)) {
                    r.push(i64::from(eos));
                }
            }
        }
        let l = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let b = rows.len();
        let mut ids = vec![i64::from(self.pad_id); b * l];
        let mut mask = vec![0i64; b * l];
        for (i, r) in rows.iter().enumerate() {
            let off = if self.left_pad { l - r.len() } else { 0 };
            for (j, &t) in r.iter().enumerate() {
                ids[i * l + off + j] = t;
                mask[i * l + off + j] = 1;
            }
        }
        let shape = [b as i64, l as i64];
        Ok(Batch {
            ids: Tensor::from_slice(&ids).view(shape).to_device(self.device),
            mask: Tensor::from_slice(&mask).view(shape).to_device(self.device),
        })
    }

    /// Pooled (not normalised) vectors `[n, hidden]`, with autograd when `train`.
    pub fn embed(&self, texts: &[&str], train: bool) -> Result<Tensor> {
        let b = self.tokenize(texts)?;
        let h = self.model.forward_t(&b.ids, &b.mask, train);
        Ok(pool(&h, &b.mask, self.settings.pooling).to_kind(Kind::Float))
    }

    /// Inference in batches of at most `batch` texts, sorted by length so padding stays small; rows come back
    /// in input order, L2-normalised, on the CPU. `progress` gets the number of texts done.
    pub fn embed_all(&self, texts: &[String], batch: usize, progress: &mut dyn FnMut(usize)) -> Result<Tensor> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(texts[i].chars().count()));
        let mut out: Vec<Option<Tensor>> = (0..texts.len()).map(|_| None).collect();
        let mut done = 0;
        tch::no_grad(|| -> Result<()> {
            for chunk in order.chunks(batch.max(1)) {
                let t: Vec<&str> = chunk.iter().map(|&i| texts[i].as_str()).collect();
                let v = crate::pooling::normalize(&self.embed(&t, false)?).to_device(Device::Cpu);
                for (k, &i) in chunk.iter().enumerate() {
                    out[i] = Some(v.get(k as i64));
                }
                done += chunk.len();
                progress(done);
            }
            Ok(())
        })?;
        let rows: Vec<Tensor> = out.into_iter().map(|t| t.expect("every row embedded")).collect();
        if rows.is_empty() {
            return Ok(Tensor::zeros([0, self.hidden_size()], (Kind::Float, Device::Cpu)));
        }
        Ok(Tensor::stack(&rows, 0))
    }

    /// Parameters by name.
    /// A fingerprint of what this encoder computes: every parameter's name, shape and value sums (LoRA adapters
    /// included), pooling and length. Caches of its vectors are keyed by it, so vectors of other weights (a
    /// document encoder after Stage II, another checkpoint in the same folder) are never reused. One pass over
    /// the parameters: far cheaper than hashing the files of an 8B checkpoint, and it sees in-memory changes.
    pub fn fingerprint(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tch::no_grad(|| {
            for (name, t) in self.model.weights().iter() {
                name.hash(&mut h);
                t.size().hash(&mut h);
                let t = t.to_kind(Kind::Double);
                t.sum(Kind::Double).double_value(&[]).to_bits().hash(&mut h);
                (&t * &t).sum(Kind::Double).double_value(&[]).to_bits().hash(&mut h);
            }
        });
        format!("{:?}", self.settings.pooling).hash(&mut h);
        self.settings.max_length.hash(&mut h);
        format!("{:016x}", h.finish())
    }

    pub fn named_parameters(&self) -> BTreeMap<String, Tensor> {
        self.model.weights().iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
    }

    /// Saves a model folder: `config.json`, `model.safetensors` (LoRA adapters merged first when `merge`),
    /// `tokenizer.json`, `encoder.json`.
    pub fn save(&mut self, dir: &Path, merge: bool) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        if merge {
            self.model.merge_lora();
        }
        let cfg = self.model.config_json();
        write_json(&dir.join("config.json"), &cfg)?;
        self.model.weights().save(&dir.join("model.safetensors"))?;
        write_json(&dir.join(ENCODER_FILE), &serde_json::to_value(&self.settings).unwrap_or_default())?;
        let src = self.source.join("tokenizer.json");
        let dst = dir.join("tokenizer.json");
        if src != dst {
            std::fs::copy(&src, &dst).map_err(|e| Error::io(&src, e))?;
        }
        Ok(())
    }
}

/// Reads a JSON file into `T` (a `serde_json::Value` for an untyped one); a malformed file is a config error.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

pub fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}
