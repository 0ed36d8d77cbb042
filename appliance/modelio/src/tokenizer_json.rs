//! Writer for a Hugging Face `tokenizer.json` equivalent to XLM-RoBERTa's.
//!
//! Why this exact shape: the engine loads tokenizers with the `tokenizers` crate, and the reference ids were
//! produced by the Hugging Face XLM-R tokenizer. Reproducing its pipeline component by component gives exact
//! parity: `Precompiled` (SentencePiece `nmt_nfkc`, see [`crate::charsmap`]) then `Replace(" {2,}" -> " ")`,
//! `Metaspace("▁", prepend_scheme = always)`, a Unigram model over the SentencePiece pieces and scores, and the
//! `<s> $A </s>` template. Padding and truncation stay unset; callers choose them per request.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::charsmap::{self, CharsmapError};

/// What the writer needs to know about a SentencePiece Unigram tokenizer.
#[derive(Debug, Clone, Copy)]
pub struct UnigramSpec<'a> {
    pub pieces: &'a [String],
    pub scores: &'a [f32],
    pub bos_id: u32,
    pub eos_id: u32,
    pub pad_id: u32,
    pub unk_id: u32,
    /// Per-code-point `nmt_nfkc` rules; composition rules are derived from them.
    pub normalizer: &'a BTreeMap<char, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerJsonError {
    #[error("{pieces} pieces but {scores} scores")]
    ScoreCount { pieces: usize, scores: usize },
    #[error("special token id {id} ({role}) is outside the {pieces}-piece vocabulary")]
    SpecialOutOfRange { role: &'static str, id: u32, pieces: usize },
    #[error("building the precompiled charsmap: {0}")]
    Charsmap(#[from] CharsmapError),
}

/// The `precompiled_charsmap` blob for `normalizer` (all derived `nmt_nfkc` rules).
pub fn precompiled_charsmap(normalizer: &BTreeMap<char, String>) -> Result<Vec<u8>, CharsmapError> {
    charsmap::build(&charsmap::nmt_nfkc_rules(normalizer))
}

/// Builds the `tokenizer.json` document.
pub fn tokenizer_json(spec: &UnigramSpec<'_>) -> Result<Value, TokenizerJsonError> {
    let n = spec.pieces.len();
    if spec.scores.len() != n {
        return Err(TokenizerJsonError::ScoreCount { pieces: n, scores: spec.scores.len() });
    }
    for (role, id) in [("bos", spec.bos_id), ("eos", spec.eos_id), ("pad", spec.pad_id), ("unk", spec.unk_id)] {
        if id as usize >= n {
            return Err(TokenizerJsonError::SpecialOutOfRange { role, id, pieces: n });
        }
    }
    let piece = |id: u32| spec.pieces[id as usize].as_str();
    let (bos, eos) = (piece(spec.bos_id), piece(spec.eos_id));

    // Added tokens in id order, as transformers writes them: the four SentencePiece specials and `<mask>`
    // (XLM-R's mask strips the space to its left so "a <mask>" masks the word, not "▁").
    let mut specials: Vec<(u32, bool)> =
        vec![(spec.bos_id, false), (spec.pad_id, false), (spec.eos_id, false), (spec.unk_id, false)];
    if let Some(mask) = spec.pieces.iter().position(|p| p == "<mask>") {
        specials.push((mask as u32, true));
    }
    specials.sort_unstable();
    specials.dedup_by_key(|s| s.0);
    let added_tokens: Vec<Value> = specials
        .iter()
        .map(|&(id, lstrip)| {
            json!({
                "id": id,
                "content": piece(id),
                "single_word": false,
                "lstrip": lstrip,
                "rstrip": false,
                "normalized": false,
                "special": true,
            })
        })
        .collect();

    let charsmap = precompiled_charsmap(spec.normalizer)?;
    let special = |t: &str| json!({"SpecialToken": {"id": t, "type_id": 0}});
    let seq = |s: &str| json!({"Sequence": {"id": s, "type_id": 0}});
    let metaspace = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true});
    let vocab: Vec<Value> = spec.pieces.iter().zip(spec.scores).map(|(p, s)| json!([p, f64::from(*s)])).collect();

    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Precompiled", "precompiled_charsmap": base64::engine::general_purpose::STANDARD.encode(&charsmap)},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
            ]
        },
        "pre_tokenizer": metaspace.clone(),
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special(bos), seq("A"), special(eos)],
            "pair": [special(bos), seq("A"), special(eos), special(eos), seq("B"), special(eos)],
            "special_tokens": {
                bos: {"id": bos, "ids": [spec.bos_id], "tokens": [bos]},
                eos: {"id": eos, "ids": [spec.eos_id], "tokens": [eos]},
            }
        },
        "decoder": metaspace,
        "model": {
            "type": "Unigram",
            "unk_id": spec.unk_id,
            "vocab": vocab,
            "byte_fallback": false
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_xlmr_pipeline() {
        let pieces: Vec<String> =
            ["<s>", "<pad>", "</s>", "<unk>", "▁", "▁a", "é", "<mask>"].map(String::from).to_vec();
        let scores = vec![0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, 0.0];
        let normalizer: BTreeMap<char, String> = [('\u{3000}', " ".to_string())].into_iter().collect();
        let spec = UnigramSpec {
            pieces: &pieces,
            scores: &scores,
            bos_id: 0,
            eos_id: 2,
            pad_id: 1,
            unk_id: 3,
            normalizer: &normalizer,
        };
        let v = tokenizer_json(&spec).unwrap();
        assert_eq!(v["model"]["unk_id"], 3);
        assert_eq!(v["model"]["vocab"][5], json!(["▁a", -2.0]));
        assert_eq!(v["added_tokens"].as_array().unwrap().len(), 5);
        assert_eq!(v["added_tokens"][4]["content"], "<mask>");
        assert_eq!(v["added_tokens"][4]["lstrip"], true);
        assert_eq!(v["pre_tokenizer"]["prepend_scheme"], "always");
        assert_eq!(v["post_processor"]["special_tokens"]["</s>"]["ids"], json!([2]));
        let blob = base64::engine::general_purpose::STANDARD
            .decode(v["normalizer"]["normalizers"][0]["precompiled_charsmap"].as_str().unwrap())
            .unwrap();
        let cm = charsmap::Charsmap::parse(&blob).unwrap();
        assert_eq!(cm.transform("\u{3000}"), Some(" "));
        assert_eq!(cm.transform("e\u{301}"), Some("é"));
    }
}
