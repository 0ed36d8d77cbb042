//! Carrying trained weights off a machine that gives little back (issue 57: a lent GPU machine returns at most
//! 64 MiB a run, and e5-small's query encoder alone is 112 MB in f32).
//!
//! `carry_out` keeps only what training changed against the folder it started from: the changed tensors in bf16,
//! and LoRA adapters (a document side saved unmerged, `lora.json` beside it) in f32, since they are small and are
//! the whole of that side's change. A frozen tensor (the word embeddings, a bf16-loaded document base) is left
//! behind with a fingerprint; `carry_in` rebuilds the trained folder from the same start, checks the fingerprints,
//! folds the adapters in and writes an ordinary model folder.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::encoder::{read_json, write_json};
use crate::models::linear::lora_delta;
use crate::weights::{Weights, save_tensors};
use crate::{Error, Result};

pub const CARRY_FILE: &str = "carry.json";
pub const TENSORS_FILE: &str = "tensors.safetensors";
/// Written beside an unmerged model's weights by Stage II's `document_adapters`: the adapters' rank and scale.
pub const LORA_FILE: &str = "lora.json";
const FORMAT: u32 = 1;
/// A tensor counts as unchanged when every element is within bf16's rounding of the start's (2⁻⁸ relative): a
/// frozen tensor that went through bf16 on the GPU and back is unchanged; a trained one moves further.
const UNCHANGED: f64 = 1.0 / 256.0;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoraScale {
    pub rank: i64,
    pub alpha: f64,
}

/// What a tensor left behind looked like on the machine that trained, to check the start it is rebuilt from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fingerprint {
    pub shape: Vec<i64>,
    pub sum: f64,
    pub l2: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CarryManifest {
    pub format: u32,
    /// The trained folder's config.json, written back as it was.
    pub config: serde_json::Value,
    /// Tensors carried (in `tensors.safetensors`), by name.
    pub carried: Vec<String>,
    /// Tensors left behind, to be taken from the start.
    pub kept: std::collections::BTreeMap<String, Fingerprint>,
    pub lora: Option<LoraScale>,
}

#[derive(Debug, Serialize)]
pub struct CarryReport {
    pub carried: usize,
    pub kept: usize,
    pub bytes: u64,
}

fn fingerprint(t: &Tensor) -> Fingerprint {
    let t = t.to_kind(Kind::Double);
    Fingerprint { shape: t.size(), sum: t.sum(Kind::Double).double_value(&[]), l2: t.norm().double_value(&[]) }
}

fn unchanged(t: &Tensor, base: &Tensor) -> bool {
    if t.size() != base.size() {
        return false;
    }
    let (t, b) = (t.to_kind(Kind::Double), base.to_kind(Kind::Double));
    let bound = b.abs() * UNCHANGED + 1e-12;
    (t - b).abs().le_tensor(&bound).all().int64_value(&[]) != 0
}

/// Writes what `trained` changed against `base` into the folder `out` (`carry.json` + `tensors.safetensors`).
pub fn carry_out(trained: &Path, base: &Path, out: &Path) -> Result<CarryReport> {
    let t = Weights::load_dir(trained, Device::Cpu, Kind::Float)?;
    let b = Weights::load_dir(base, Device::Cpu, Kind::Float)?;
    let lora = trained.join(LORA_FILE);
    let lora: Option<LoraScale> = if lora.exists() { Some(read_json(&lora)?) } else { None };
    let mut carried = Vec::new();
    let mut kept = std::collections::BTreeMap::new();
    for (name, tensor) in t.iter() {
        let adapter = name.contains(".lora_A.") || name.contains(".lora_B.");
        if adapter && lora.is_none() {
            return Err(Error::Weights(format!("{name}: LoRA adapters without {LORA_FILE} (their scale)")));
        }
        match b.tensor(name) {
            Some(start) if !adapter && unchanged(tensor, start) => {
                kept.insert(name.clone(), fingerprint(start));
            }
            // Adapters are small and all of the document side's change: f32, as trained.
            _ => carried
                .push((name.clone(), if adapter { tensor.shallow_clone() } else { tensor.to_kind(Kind::BFloat16) })),
        }
    }
    if let Some((missing, _)) = b.iter().find(|(n, _)| !t.contains(n)) {
        return Err(Error::Weights(format!(
            "{missing}: in the start ({}) but not in the trained folder",
            base.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let file = out.join(TENSORS_FILE);
    let list: Vec<(String, Tensor)> = carried.iter().map(|(n, t)| (n.clone(), t.contiguous())).collect();
    Tensor::write_safetensors(&list, &file).map_err(|e| Error::Weights(format!("{}: {e}", file.display())))?;
    let manifest = CarryManifest {
        format: FORMAT,
        config: read_json(&trained.join("config.json"))?,
        carried: carried.iter().map(|(n, _)| n.clone()).collect(),
        kept,
        lora,
    };
    write_json(&out.join(CARRY_FILE), &serde_json::to_value(&manifest).unwrap_or_default())?;
    let bytes = std::fs::metadata(&file).map_err(|e| Error::io(&file, e))?.len();
    Ok(CarryReport { carried: manifest.carried.len(), kept: manifest.kept.len(), bytes })
}

/// Rebuilds the trained folder `out` from `carried` and the start `base` (the same start as `carry_out`'s):
/// every file of `base` but the weights, the config as trained, the carried tensors in f32 and the adapters folded
/// into their weights.
pub fn carry_in(carried: &Path, base: &Path, out: &Path) -> Result<CarryReport> {
    let m: CarryManifest = read_json(&carried.join(CARRY_FILE))?;
    if m.format != FORMAT {
        return Err(Error::Config(format!(
            "{}: carry format {} (this trainer reads {FORMAT})",
            carried.display(),
            m.format
        )));
    }
    let mut w = Weights::load_dir(base, Device::Cpu, Kind::Float)?;
    for (name, f) in &m.kept {
        let t = w.get(name, &f.shape)?;
        let g = fingerprint(&t);
        let close = |a: f64, b: f64, scale: f64| (a - b).abs() <= 1e-4 * scale.max(1e-6);
        if !(close(g.l2, f.l2, f.l2) && close(g.sum, f.sum, f.l2 * (t.numel() as f64).sqrt())) {
            return Err(Error::Weights(format!(
                "{name}: the start {} is not the one trained from (norm {:.6} here, {:.6} there)",
                base.display(),
                g.l2,
                f.l2
            )));
        }
    }
    let tensors = crate::weights::load_tensors(&carried.join(TENSORS_FILE))?;
    let mut adapters = std::collections::BTreeMap::new();
    for (name, t) in tensors {
        let t = t.to_kind(Kind::Float);
        if let Some(prefix) = name.strip_suffix(".lora_A.weight").or_else(|| name.strip_suffix(".lora_B.weight")) {
            adapters.entry(prefix.to_string()).or_insert_with(Vec::new).push((name.ends_with("A.weight"), t));
        } else {
            w.insert(name, t);
        }
    }
    let scale = m.lora.as_ref().map(|l| l.alpha / l.rank as f64);
    for (prefix, parts) in adapters {
        let (Some(scale), [(a_first, x), (_, y)]) = (scale, parts.as_slice()) else {
            return Err(Error::Weights(format!("{prefix}: an adapter needs lora_A, lora_B and {LORA_FILE}")));
        };
        let (a, b) = if *a_first { (x, y) } else { (y, x) };
        let name = format!("{prefix}.weight");
        let base_w = w.remove(&name).ok_or_else(|| Error::Weights(format!("{name}: no weight under the adapter")))?;
        w.insert(name, base_w + lora_delta(a, b, scale));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    for entry in std::fs::read_dir(base).map_err(|e| Error::io(base, e))? {
        let p = entry.map_err(|e| Error::io(base, e))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        // Every weights file (one, or shards and their index) is replaced by the rebuilt model.safetensors.
        let weights = name.ends_with(".safetensors") || name == "model.safetensors.index.json";
        if p.is_file() && !weights {
            std::fs::copy(&p, out.join(name)).map_err(|e| Error::io(&p, e))?;
        }
    }
    write_json(&out.join("config.json"), &m.config)?;
    save_tensors(w.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &out.join("model.safetensors"))?;
    let bytes = std::fs::metadata(out.join("model.safetensors")).map_err(|e| Error::io(out, e))?.len();
    Ok(CarryReport { carried: m.carried.len(), kept: m.kept.len(), bytes })
}
