//! Embedding shards: document vectors computed offline (the trainer's `embed-corpus` on a GPU) that the
//! appliance loads into its dense index instead of re-embedding.
//!
//! A folder holds `embeddings.json` (format, encoder identity and pairing id, width, shard list with row counts
//! and sha256) and per shard `shard-NNNNN.f32` (row-major little-endian f32, `rows × width`) plus
//! `shard-NNNNN.ids` (one document id per line, same order). Shards are written to temporary names and renamed,
//! and the index file is written last, so a crash mid-way leaves no index that names a torn shard.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const EMBEDDINGS_FORMAT: u32 = 1;
pub const EMBEDDINGS_FILE: &str = "embeddings.json";

#[derive(Debug, thiserror::Error)]
pub enum EmbeddingsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddingsError + '_ {
    move |source| EmbeddingsError::Io { path: path.to_path_buf(), source }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub vectors: String,
    pub ids: String,
    pub rows: usize,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsIndex {
    pub format: u32,
    /// The document encoder (`name@version` or a path) that produced the vectors.
    pub model: String,
    /// Must equal the pairing id of the query encoder that will search these vectors.
    pub pairing_id: String,
    /// Vector width after Matryoshka truncation; vectors are L2-normalised at this width.
    pub width: usize,
    /// Template the texts were rendered with (`passage: {text}`).
    pub document_template: String,
    pub rows: usize,
    pub shards: Vec<ShardInfo>,
}

/// Streams vectors into shards of at most `rows_per_shard` rows.
#[derive(Debug)]
pub struct ShardWriter {
    dir: PathBuf,
    index: EmbeddingsIndex,
    rows_per_shard: usize,
    ids: Vec<String>,
    data: Vec<f32>,
}

impl ShardWriter {
    pub fn create(dir: &Path, mut index: EmbeddingsIndex, rows_per_shard: usize) -> Result<Self, EmbeddingsError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        index.format = EMBEDDINGS_FORMAT;
        index.rows = 0;
        index.shards.clear();
        Ok(Self {
            dir: dir.to_path_buf(),
            index,
            rows_per_shard: rows_per_shard.max(1),
            ids: Vec::new(),
            data: Vec::new(),
        })
    }

    /// Adds one vector (its length must be the index width).
    pub fn push(&mut self, id: &str, vector: &[f32]) -> Result<(), EmbeddingsError> {
        if vector.len() != self.index.width {
            return Err(EmbeddingsError::Invalid {
                path: self.dir.clone(),
                message: format!("vector for {id:?} has {} values, width is {}", vector.len(), self.index.width),
            });
        }
        if id.contains('\n') {
            return Err(EmbeddingsError::Invalid {
                path: self.dir.clone(),
                message: format!("id {id:?} contains a newline"),
            });
        }
        self.ids.push(id.to_string());
        self.data.extend_from_slice(vector);
        if self.ids.len() >= self.rows_per_shard {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), EmbeddingsError> {
        if self.ids.is_empty() {
            return Ok(());
        }
        let n = self.index.shards.len();
        let vectors = format!("shard-{n:05}.f32");
        let ids = format!("shard-{n:05}.ids");
        let bytes: Vec<u8> = self.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let sha256 = {
            use sha2::{Digest, Sha256};
            hex::encode(Sha256::digest(&bytes))
        };
        write_atomic(&self.dir.join(&vectors), &bytes)?;
        let mut text = self.ids.join("\n");
        text.push('\n');
        write_atomic(&self.dir.join(&ids), text.as_bytes())?;
        self.index.rows += self.ids.len();
        self.index.shards.push(ShardInfo { vectors, ids, rows: self.ids.len(), sha256 });
        self.ids.clear();
        self.data.clear();
        Ok(())
    }

    /// Flushes the last shard and writes `embeddings.json`.
    pub fn finish(mut self) -> Result<EmbeddingsIndex, EmbeddingsError> {
        self.flush()?;
        let text = serde_json::to_vec_pretty(&self.index).unwrap_or_default();
        write_atomic(&self.dir.join(EMBEDDINGS_FILE), &text)?;
        Ok(self.index)
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), EmbeddingsError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Reads `embeddings.json`.
pub fn read_index(dir: &Path) -> Result<EmbeddingsIndex, EmbeddingsError> {
    let p = dir.join(EMBEDDINGS_FILE);
    let text = std::fs::read(&p).map_err(io(&p))?;
    let idx: EmbeddingsIndex = serde_json::from_slice(&text)
        .map_err(|e| EmbeddingsError::Invalid { path: p.clone(), message: e.to_string() })?;
    if idx.format > EMBEDDINGS_FORMAT {
        return Err(EmbeddingsError::Invalid {
            path: p,
            message: format!("format {} is newer than this build understands ({EMBEDDINGS_FORMAT})", idx.format),
        });
    }
    Ok(idx)
}

/// Reads one shard's ids and vectors, checking row count and sha256.
pub fn read_shard(
    dir: &Path,
    idx: &EmbeddingsIndex,
    shard: &ShardInfo,
) -> Result<(Vec<String>, Vec<f32>), EmbeddingsError> {
    let vp = dir.join(&shard.vectors);
    let mut bytes = Vec::new();
    std::fs::File::open(&vp).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io(&vp))?;
    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(&bytes))
    };
    if sha != shard.sha256 {
        return Err(EmbeddingsError::Invalid {
            path: vp,
            message: format!("sha256 {sha} differs from the index ({})", shard.sha256),
        });
    }
    if bytes.len() != shard.rows * idx.width * 4 {
        return Err(EmbeddingsError::Invalid {
            path: vp,
            message: format!("{} bytes, expected {} rows × {} × 4", bytes.len(), shard.rows, idx.width),
        });
    }
    let data = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let ip = dir.join(&shard.ids);
    let f = std::fs::File::open(&ip).map_err(io(&ip))?;
    let ids: Vec<String> = BufReader::new(f).lines().collect::<Result<_, _>>().map_err(io(&ip))?;
    if ids.len() != shard.rows {
        return Err(EmbeddingsError::Invalid {
            path: ip,
            message: format!("{} ids, index says {}", ids.len(), shard.rows),
        });
    }
    Ok((ids, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_tamper_detection() {
        let dir = tempfile::tempdir().unwrap();
        let index = EmbeddingsIndex {
            format: 0,
            model: "doc@1".into(),
            pairing_id: "p1".into(),
            width: 2,
            document_template: "passage: {text}".into(),
            rows: 0,
            shards: vec![],
        };
        let mut w = ShardWriter::create(dir.path(), index, 2).unwrap();
        for i in 0..5 {
            w.push(&format!("d{i}"), &[i as f32, -(i as f32)]).unwrap();
        }
        assert!(w.push("bad", &[1.0]).is_err());
        let idx = w.finish().unwrap();
        assert_eq!((idx.rows, idx.shards.len()), (5, 3));
        let back = read_index(dir.path()).unwrap();
        assert_eq!(back, idx);
        let (ids, data) = read_shard(dir.path(), &back, &back.shards[2]).unwrap();
        assert_eq!(ids, vec!["d4".to_string()]);
        assert_eq!(data, vec![4.0, -4.0]);
        std::fs::write(dir.path().join(&back.shards[0].vectors), [0u8; 16]).unwrap();
        let err = read_shard(dir.path(), &back, &back.shards[0]).unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");
    }
}
