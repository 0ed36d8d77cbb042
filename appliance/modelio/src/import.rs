//! E5S1 -> model package directory (`tokenizer.json`, `model.onnx`, `config.json`, `model.safetensors`).
//!
//! Why atomic: the engine may be watching the package directory, and a crash mid-import must never leave a
//! truncated file under a final name. Every file is written to a hidden temporary name in the same directory,
//! synced, then renamed over the final name.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::e5s1::{E5s1Error, E5s1File};
use crate::onnx::{self, OnnxError, WeightFormat};
use crate::safetensors::{self, SafetensorsError};
use crate::tokenizer_json::{self, TokenizerJsonError};

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    E5s1(#[from] E5s1Error),
    #[error("tokenizer.json: {0}")]
    Tokenizer(#[from] TokenizerJsonError),
    #[error("model.onnx: {0}")]
    Onnx(#[from] OnnxError),
    #[error("model.safetensors: {0}")]
    Safetensors(#[from] SafetensorsError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// What was imported and written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    /// Rows of the word-embedding matrix (250,037); the tokenizer uses the first `tokenizer_pieces`.
    pub vocab_size: usize,
    pub tokenizer_pieces: usize,
    /// Hugging Face `max_position_embeddings` (514 = 512 usable positions + 2 reserved rows).
    pub max_position_embeddings: usize,
    /// Longest input in tokens, specials included (512).
    pub max_sequence_length: usize,
    /// Written files, final paths, in write order.
    pub files: Vec<PathBuf>,
}

/// Optional outputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Also write `model_int8.onnx` with dynamically quantised projection weights.
    pub int8_onnx: bool,
}

/// Converts the E5S1 file at `bin_path` into a model package in `out_dir` (created if missing).
pub fn import_e5s1(bin_path: impl AsRef<Path>, out_dir: impl AsRef<Path>) -> Result<ImportReport, ImportError> {
    import_e5s1_with(bin_path, out_dir, ImportOptions::default())
}

/// [`import_e5s1`] with options.
pub fn import_e5s1_with(
    bin_path: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    options: ImportOptions,
) -> Result<ImportReport, ImportError> {
    let out_dir = out_dir.as_ref();
    fs::create_dir_all(out_dir).map_err(|source| ImportError::Io { path: out_dir.to_path_buf(), source })?;
    let file = E5s1File::open(bin_path)?;
    let cfg = file.bert_config();
    let tok = file.tokenizer();
    let mut files = Vec::new();

    let spec = tok.unigram_spec();
    let tj = tokenizer_json::tokenizer_json(&spec)?;
    files.push(write_atomic(&out_dir.join("tokenizer.json"), |w| {
        serde_json::to_writer(&mut *w, &tj).map_err(std::io::Error::other)
    })?);

    let config = cfg.to_hf_config_json();
    files.push(write_atomic(&out_dir.join("config.json"), |w| {
        serde_json::to_writer_pretty(&mut *w, &config).map_err(std::io::Error::other)?;
        w.write_all(b"\n")
    })?);

    let weights = file.hf_tensors()?;
    drop(file);

    let onnx_path = out_dir.join("model.onnx");
    onnx::build_bert_model(&cfg, &weights, WeightFormat::F32)?.save(&onnx_path)?;
    files.push(onnx_path);

    if options.int8_onnx {
        let int8_path = out_dir.join("model_int8.onnx");
        onnx::build_bert_model(&cfg, &weights, WeightFormat::Int8)?.save(&int8_path)?;
        files.push(int8_path);
    }

    let st_path = out_dir.join("model.safetensors");
    safetensors::save(&weights, &st_path)?;
    files.push(st_path);

    Ok(ImportReport {
        hidden_size: cfg.hidden_size,
        num_layers: cfg.num_hidden_layers,
        num_heads: cfg.num_attention_heads,
        vocab_size: cfg.vocab_size,
        tokenizer_pieces: tok_len(&tj),
        max_position_embeddings: cfg.max_position_embeddings,
        max_sequence_length: cfg.max_sequence_length(),
        files,
    })
}

fn tok_len(tj: &serde_json::Value) -> usize {
    tj["model"]["vocab"].as_array().map_or(0, Vec::len)
}

/// Writes `path` atomically (temporary sibling, fsync, rename); on error nothing appears under `path`.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<PathBuf, ImportError> {
    crate::fsutil::write_atomic(path, write).map_err(|source| ImportError::Io { path: path.to_path_buf(), source })?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_atomic_write_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        let r = write_atomic(&path, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(r.is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        write_atomic(&path, |w| w.write_all(b"ok")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"ok");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
