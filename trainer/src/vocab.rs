//! Training on the vocabulary a run uses, and the trained rows put back (issue 57).
//!
//! e5-small's word embedding is 250k rows; a hospital's texts use a few thousand. A model folder pruned to those
//! rows ([`prune`]) trains to the same result on them, fits where the full one does not (the GPU test machine takes
//! 64 MiB per run), and [`scatter`] writes the trained rows back into the full model, so the served encoder still
//! knows every token (the rows the run never used keep their values). Renumbering is by token string: the pruned
//! folder's tokenizer says which full row each of its rows is.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::encoder::read_json;
use crate::weights::Weights;
use crate::{Error, Result};

/// The word-embedding table of the encoders the trainer prunes (BERT / XLM-R names).
const WORD: &str = "embeddings.word_embeddings.weight";

/// The tokens of a `tokenizer.json`'s model, by id (Unigram: its list; WordLevel: its map).
fn tokens(tj: &serde_json::Value) -> Result<Vec<String>> {
    let model = &tj["model"];
    match model["type"].as_str() {
        Some("Unigram") => Ok(model["vocab"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p[0].as_str().unwrap_or_default().to_string())
            .collect()),
        Some("WordLevel") => {
            let map = model["vocab"].as_object().ok_or_else(|| Error::Config("WordLevel without a vocab".into()))?;
            let mut by_id = vec![String::new(); map.len()];
            for (tok, id) in map {
                let slot = id.as_u64().and_then(|i| by_id.get_mut(i as usize));
                *slot.ok_or_else(|| Error::Config(format!("token {tok:?} has id {id} outside the vocab")))? =
                    tok.clone();
            }
            Ok(by_id)
        }
        other => Err(Error::Config(format!("a vocabulary can be pruned for Unigram and WordLevel, not {other:?}"))),
    }
}

/// The ids of `dir`'s tokenizer that `texts` (as the encoder reads them, prompts included) use, with what keeps a
/// pruned tokenizer segmenting them the same: the padding and other special ids of `config.json`, every added token,
/// the unknown token, and for Unigram the lowest-scored piece (an unknown character is scored below it). Ascending.
pub fn kept_ids(dir: &Path, texts: &[String]) -> Result<Vec<u32>> {
    let path = dir.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let mut kept = BTreeSet::new();
    for t in texts {
        let enc = tok.encode(t.as_str(), true).map_err(|e| Error::Data(format!("tokenizing {t:?}: {e}")))?;
        kept.extend(enc.get_ids().iter().copied());
    }
    // The model's own special ids (padding is what batches are filled with).
    let cfg: serde_json::Value = read_json(&dir.join("config.json"))?;
    for key in ["pad_token_id", "bos_token_id", "eos_token_id"] {
        kept.extend(cfg[key].as_u64().map(|i| i as u32));
    }
    let tj: serde_json::Value = read_json(&path)?;
    kept.extend(tj["added_tokens"].as_array().into_iter().flatten().filter_map(|a| a["id"].as_u64()).map(|i| i as u32));
    let model = &tj["model"];
    kept.extend(model["unk_id"].as_u64().map(|i| i as u32));
    if let Some(unk) = model["unk_token"].as_str() {
        kept.extend(tokens(&tj)?.iter().position(|t| t == unk).map(|i| i as u32));
    }
    if let Some(vocab) = model["vocab"].as_array() {
        let score = |p: &serde_json::Value| p[1].as_f64().unwrap_or(0.0);
        let lowest = vocab.iter().enumerate().min_by(|a, b| score(a.1).total_cmp(&score(b.1)));
        kept.extend(lowest.map(|(i, _)| i as u32));
    }
    Ok(kept.into_iter().collect())
}

/// `tokenizer.json` with only the `kept` ids, renumbered in order.
fn pruned_tokenizer(tj: &serde_json::Value, kept: &[u32]) -> Result<serde_json::Value> {
    let new_id = |old: u64| kept.binary_search(&(old as u32)).ok().map(|i| i as u64);
    let mut out = tj.clone();
    let model = &mut out["model"];
    match model["type"].as_str() {
        Some("Unigram") => {
            let vocab = model["vocab"].as_array().cloned().unwrap_or_default();
            model["vocab"] = kept.iter().filter_map(|&i| vocab.get(i as usize).cloned()).collect();
            if let Some(unk) = model["unk_id"].as_u64() {
                model["unk_id"] =
                    new_id(unk).ok_or_else(|| Error::Config("the unknown piece is not kept".into()))?.into();
            }
        }
        _ => {
            let toks = tokens(tj)?;
            let map: serde_json::Map<String, serde_json::Value> =
                kept.iter().enumerate().map(|(n, &i)| (toks[i as usize].clone(), serde_json::Value::from(n))).collect();
            model["vocab"] = map.into();
        }
    }
    let renumber = |v: &mut serde_json::Value| -> Result<()> {
        if let Some(old) = v.as_u64() {
            *v = new_id(old).ok_or_else(|| Error::Config(format!("special token {old} is not kept")))?.into();
        }
        Ok(())
    };
    for a in out["added_tokens"].as_array_mut().into_iter().flatten() {
        renumber(&mut a["id"])?;
    }
    // XLM-R's post-processor names the ids of <s> and </s>.
    // (`get_mut`, not indexing: indexing a null would turn it into an object.)
    let specials = out.get_mut("post_processor").and_then(|p| p.get_mut("special_tokens"));
    if let Some(specials) = specials.and_then(|s| s.as_object_mut()) {
        for s in specials.values_mut() {
            for id in s["ids"].as_array_mut().into_iter().flatten() {
                renumber(id)?;
            }
        }
    }
    Ok(out)
}

/// Writes to `out` the model folder `src` with only the word-embedding rows `kept` (its tokenizer's ids,
/// ascending; see [`kept_ids`]), renumbered in order: the tokenizer and `config.json`'s `vocab_size` follow, every
/// other tensor and file is copied.
pub fn prune(src: &Path, kept: &[u32], out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut w = Weights::load_dir(src, Device::Cpu, Kind::Float)?;
    let word = w.remove(WORD).ok_or_else(|| Error::Weights(format!("{WORD} is missing from {}", src.display())))?;
    let index = Tensor::from_slice(&kept.iter().map(|&i| i64::from(i)).collect::<Vec<_>>());
    w.insert(WORD, word.index_select(0, &index));
    w.save(&out.join("model.safetensors"))?;
    let mut cfg: serde_json::Value = read_json(&src.join("config.json"))?;
    cfg["vocab_size"] = kept.len().into();
    crate::encoder::write_json(&out.join("config.json"), &cfg)?;
    let tj = pruned_tokenizer(&read_json(&src.join("tokenizer.json"))?, kept)?;
    crate::encoder::write_json(&out.join("tokenizer.json"), &tj)?;
    copy_others(src, out, &["model.safetensors", "config.json", "tokenizer.json"])
}

/// Writes to `out` the full model folder `full` with the trained folder `trained` (a [`prune`]d copy, trained)
/// put back: its word-embedding rows at the full rows of the same tokens, every other tensor from `trained`; the
/// full tokenizer and `config.json`, the trained folder's other files.
pub fn scatter(trained: &Path, full: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let full_ids: HashMap<String, i64> = tokens(&read_json(&full.join("tokenizer.json"))?)?
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i as i64))
        .collect();
    let rows: Vec<i64> = tokens(&read_json(&trained.join("tokenizer.json"))?)?
        .iter()
        .map(|t| full_ids.get(t).copied().ok_or_else(|| Error::Config(format!("token {t:?} is not in the full model"))))
        .collect::<Result<_>>()?;
    let mut w = Weights::load_dir(trained, Device::Cpu, Kind::Float)?;
    let base = Weights::load_dir(full, Device::Cpu, Kind::Float)?;
    let small =
        w.remove(WORD).ok_or_else(|| Error::Weights(format!("{WORD} is missing from {}", trained.display())))?;
    let whole = base.iter().find(|(n, _)| n.as_str() == WORD).map(|(_, t)| t.copy());
    let whole = whole.ok_or_else(|| Error::Weights(format!("{WORD} is missing from {}", full.display())))?;
    let whole = whole.index_copy(0, &Tensor::from_slice(&rows), &small.to_kind(whole.kind()));
    w.insert(WORD, whole);
    w.save(&out.join("model.safetensors"))?;
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(full.join(f), out.join(f)).map_err(|e| Error::io(&full.join(f), e))?;
    }
    copy_others(trained, out, &["model.safetensors", "config.json", "tokenizer.json"])
}

/// Copies the plain files of `src` other than `except` into `out` (companions such as `encoder.json`).
fn copy_others(src: &Path, out: &Path, except: &[&str]) -> Result<()> {
    for e in std::fs::read_dir(src).map_err(|e| Error::io(src, e))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_file() && !except.contains(&name.as_str()) {
            std::fs::copy(e.path(), out.join(&name)).map_err(|err| Error::io(&e.path(), err))?;
        }
    }
    Ok(())
}
