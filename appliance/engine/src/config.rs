//! Engine settings (the `[engine]`, `[ingest]` and `[search]` sections of `care.toml`).
//!
//! Layering (defaults < file < env < CLI) is done by the binary; the engine only defines the shape and defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::text::ChunkConfig;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EngineConfig {
    pub storage: StorageConfig,
    pub ingest: IngestConfig,
    pub search: SearchConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            storage: StorageConfig::default(),
            ingest: IngestConfig::default(),
            search: SearchConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct StorageConfig {
    /// Where SQLite, the indexes and the models live.
    pub data_dir: PathBuf,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig { data_dir: PathBuf::from("/var/lib/care") }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct IngestConfig {
    pub chunk: ChunkConfig,
    /// Documents written per SQLite transaction and tantivy commit.
    pub batch_documents: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig { chunk: ChunkConfig::default(), batch_documents: 2000 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SearchConfig {
    pub default_limit: usize,
    pub max_limit: usize,
    /// Weight of title and heading matches relative to body matches in BM25.
    pub title_boost: f32,
    /// Snippet length in bytes (about a third as many Chinese characters).
    pub snippet_bytes: usize,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig { default_limit: 10, max_limit: 100, title_boost: 1.0, snippet_bytes: 240 }
    }
}
