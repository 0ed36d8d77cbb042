//! The CARE engine: everything the appliance does, with no knowledge of HTTP.
//!
//! ```text
//!  Engine (engine.rs) ── one data directory (datadir.rs), kept consistent across crashes
//!   ├ store     SQLite metadata, embedded migrations from /migrations; the source of truth
//!   ├ ingest    files → ParsedDocument (txt, md, jsonl); errors name file and line
//!   ├ text      normalisation (full/half width, controls) and sentence/heading-aware chunking
//!   ├ lexical   tantivy BM25 with jieba search-mode tokens + medical dictionary; derived from SQLite
//!   ├ eval      BEIR sets and ranking metrics (nDCG, MAP, MRR, Recall)
//!   └ demo      the embedded demo collection
//! ```
//!
//! Callers (the `care` CLI and the HTTP server) use [`Engine`] and [`error::Error`]; error codes
//! ([`error::ErrorCode`]) are stable and mapped to HTTP statuses by the server alone.

pub mod config;
pub mod datadir;
pub mod demo;
pub mod engine;
pub mod error;
pub mod eval;
pub mod ingest;
pub mod lexical;
pub mod store;
pub mod text;

pub use config::EngineConfig;
pub use engine::{Engine, IngestProgress, IngestReport, OpenMode, SearchHit, SearchRequest, SearchResults};
pub use error::{Error, ErrorCode, Result};
