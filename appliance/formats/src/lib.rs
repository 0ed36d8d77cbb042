//! Formats shared by the appliance and the trainer.
//!
//! This crate is deliberately small (serde, toml, sha2): the trainer depends on it and must not inherit the
//! server's dependency tree. Everything here is a versioned on-disk format:
//!
//! - [`manifest`]: the model package manifest (`manifest.toml`), the contract between whoever produced a model
//!   (importer, trainer) and the serving engine, including the pairing id that ties a query encoder to the
//!   document encoder whose vectors it was trained against.
//! - [`training`]: the CARE training-data JSONL layout (`query`, `pos`, `neg`, `prompt`) and `train_pairs.jsonl`.
//! - [`embeddings`]: document-vector shards written offline (trainer `embed-corpus`) for the appliance to load.
//! - [`trainer`]: the phase specs the appliance hands `care-train run --spec` and the JSON-lines events it reads
//!   back, with the one set of training defaults.

pub mod embeddings;
pub mod manifest;
pub mod trainer;
pub mod training;

pub use manifest::{Graph, ModelManifest, ModelRole, Pooling};
