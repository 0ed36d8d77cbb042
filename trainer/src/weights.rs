//! Named parameter tensors, loaded from and saved to `model.safetensors` under Hugging Face names.
//!
//! Why not `tch::nn::VarStore`: its variables live in a `HashMap`, so iteration order (and with it optimizer
//! state layout and checkpoint files) would not be deterministic, and its loader refuses the `model.` /
//! `roberta.` prefixes that Hugging Face writes for task heads. A sorted map of tensors is all training needs.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

/// Prefixes Hugging Face adds when a base model is saved inside a task model (`Qwen3ForCausalLM` → `model.`).
const STRIP_PREFIXES: &[&str] = &["model.", "roberta.", "bert.", "encoder_model."];

/// `name` without a task-model prefix.
fn strip(name: &str) -> String {
    STRIP_PREFIXES.iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name).to_string()
}

#[derive(Debug, Default)]
pub struct Weights {
    map: BTreeMap<String, Tensor>,
}

impl Weights {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads every tensor of a safetensors file onto `device` as `kind` (bf16 checkpoints become f32 on CPU).
    pub fn load(path: &Path, device: Device, kind: Kind) -> Result<Self> {
        let mut w = Self::new();
        w.add_file(path, device, kind)?;
        Ok(w)
    }

    /// Loads a model folder: `model.safetensors`, or the shards named by `model.safetensors.index.json` (how 4B/8B
    /// checkpoints are saved). Every tensor the index lists must be in its shard.
    pub fn load_dir(dir: &Path, device: Device, kind: Kind) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        if !index.exists() {
            return Self::load(&dir.join("model.safetensors"), device, kind);
        }
        let bad = |m: String| Error::Weights(format!("{}: {m}", index.display()));
        let text = std::fs::read_to_string(&index).map_err(|e| bad(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let map = v["weight_map"].as_object().ok_or_else(|| bad("no \"weight_map\" object".into()))?;
        let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| bad(format!("shard of {name:?} is not a file name")))?;
            // A shard is a plain file beside the index: no folders, no way out of the model folder.
            if file.is_empty() || file.contains(['/', '\\']) || file.starts_with('.') {
                return Err(bad(format!("shard {file:?} of {name:?} is not a plain file name")));
            }
            shards.entry(file).or_default().push(name);
        }
        let mut w = Self::new();
        for (file, names) in &shards {
            let added = w.add_file(&dir.join(file), device, kind)?;
            if let Some(missing) = names.iter().find(|n| !added.contains(&strip(n))) {
                return Err(bad(format!("tensor {missing:?} is not in its shard {file}")));
            }
        }
        Ok(w)
    }

    /// Adds a file's tensors, each with a task-model prefix (`model.`, `roberta.` …) removed; an unprefixed
    /// tensor (`lm_head.weight` of `Qwen3ForCausalLM`) keeps its name. Returns the names added.
    fn add_file(&mut self, path: &Path, device: Device, kind: Kind) -> Result<Vec<String>> {
        let tensors = Tensor::read_safetensors(path).map_err(|e| Error::Weights(format!("{}: {e}", path.display())))?;
        let mut added = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            let name = strip(&name);
            let t = if t.is_floating_point() { t.to_kind(kind) } else { t };
            if self.map.insert(name.clone(), t.to_device(device)).is_some() {
                return Err(Error::Weights(format!(
                    "{}: tensor {name:?} appears twice (with and without a prefix, or in two shards)",
                    path.display()
                )));
            }
            added.push(name);
        }
        Ok(added)
    }

    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        self.map.insert(name.into(), t);
    }

    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.map.remove(name)
    }

    /// The tensor `name`, whatever its shape.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.map.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// A shallow clone (same storage) of the tensor `name`, whose shape must be `shape`.
    pub fn get(&self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let t = self.map.get(name).ok_or_else(|| {
            Error::Weights(format!("tensor {name:?} is missing from the checkpoint (is config.json for this model?)"))
        })?;
        if t.size() != shape {
            return Err(Error::Weights(format!(
                "tensor {name:?} has shape {:?}, config.json implies {shape:?}",
                t.size()
            )));
        }
        Ok(t.shallow_clone())
    }

    /// Random normal(0, std) tensor registered under `name` (biases and norms use `zeros` / `ones`).
    pub fn randn(&mut self, name: &str, shape: &[i64], std: f64, device: Device) {
        let t = Tensor::randn(shape, (Kind::Float, device)) * std;
        self.map.insert(name.to_string(), t);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Tensor)> {
        self.map.iter()
    }

    pub fn names(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Writes all tensors (as f32, on CPU) to a safetensors file, atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        save_tensors(self.map.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), path)
    }

    /// The tensors as `care_modelio` f32 tensors (for the ONNX exporter).
    pub fn to_modelio(&self) -> Result<care_modelio::TensorMap> {
        let mut out = care_modelio::TensorMap::new();
        for (n, t) in &self.map {
            out.insert(n.clone(), to_modelio_tensor(t)?);
        }
        Ok(out)
    }
}

pub fn to_modelio_tensor(t: &Tensor) -> Result<care_modelio::Tensor> {
    let t = t.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous();
    let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let data = Vec::<f32>::try_from(t.view(-1)).map_err(|e| Error::Weights(e.to_string()))?;
    care_modelio::Tensor::new(shape, data).ok_or_else(|| Error::Weights("tensor shape/data mismatch".into()))
}

/// Writes named tensors to `path` via a temporary sibling and a rename, so a crash never leaves a torn file.
pub fn save_tensors(tensors: impl Iterator<Item = (String, Tensor)>, path: &Path) -> Result<()> {
    let list: Vec<(String, Tensor)> = tensors
        .map(|(n, t)| {
            let t = t.detach().to_device(Device::Cpu);
            let t = if t.is_floating_point() { t.to_kind(Kind::Float) } else { t };
            (n, t.contiguous())
        })
        .collect();
    let tmp = path.with_extension("safetensors.tmp");
    Tensor::write_safetensors(&list, &tmp).map_err(|e| Error::Weights(format!("{}: {e}", tmp.display())))?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    Ok(())
}

/// Reads named tensors (no prefix stripping, no conversion).
pub fn load_tensors(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let tensors = Tensor::read_safetensors(path).map_err(|e| Error::Weights(format!("{}: {e}", path.display())))?;
    Ok(tensors.into_iter().collect())
}
