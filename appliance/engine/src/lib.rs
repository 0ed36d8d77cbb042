//! The CARE engine: everything the appliance does, with no knowledge of HTTP.
//!
//! ```text
//!  Engine (engine.rs) ── one data directory (datadir.rs): its parts opened together and lent
//!   ├ indexer   the write protocol: ingest batches, deletions, collections, crash replay, the consistency check
//!   ├ versioned values built from SQLite rows, reloaded by a thread of their own while searches keep the old one
//!   ├ config    the engine's care.toml sections and their defaults
//!   ├ error     the one error type and its stable codes (Chinese title, status class, docs anchor)
//!   ├ service   every operation pages, API and CLI call: the asking Actor is its authorisation input, and its
//!   │           change commits with its one audit record (service/{users,uploads,vectors,judgments}.rs)
//!   ├ store     SQLite metadata, embedded migrations from /migrations; the source of truth
//!   │           (the chunks' text kept in memory for the "not found" check: store/texts.rs; the WAL
//!   │           checkpointed by a thread of its own instead of inside a commit: store/wal.rs)
//!   ├ audit     append-only, hash-chained audit records written in the same transaction as the change: the key
//!   │           outside SQLite, the chain walk and re-chaining, the anchor (audit/{key,chain,anchor}.rs); searches'
//!   │           records by the group-commit writer thread, one transaction per batch (audit/writer.rs)
//!   ├ settings  the settings an admin changes in the console (fusion and synonym weights, chunk size, sign-in
//!   │           lifetimes): stored in SQLite over care.toml's, audited, read from memory
//!   ├ clock     stored UTC times read in the hospital's time on pages
//!   ├ accounts  users and roles, lockout, sessions, API tokens, per-collection read grants; argon2 on a fixed
//!   │           pool of threads that keep their memory (accounts/hashing.rs); API tokens (accounts/tokens.rs); tests in accounts/tests.rs
//!   ├ directory sign-in through the hospital's LDAP/AD (directory/ldap.rs) or OIDC provider (directory/oidc.rs):
//!   │           group → role and group → grant mapping, accounts provisioned and disabled by the directory
//!   │           (directory.rs); both editable on the settings page over care.toml's (directory/console.rs)
//!   ├ analytics what clinicians search and where they fail: searches per day, top, not-found and 没帮助 queries,
//!   │           latency, aggregated from the searches' audit records and feedback (CSV export audited)
//!   ├ limits    in-memory rate limits per client address or user (sign-in failures, feedback, refusals)
//!   ├ priority  long writes (a synonym import, a filing spreadsheet) on a thread of their own at a lower CPU
//!   │           priority, so that searches beside them keep the cores
//!   ├ feedback  the document view behind a hit and relevance feedback kept for training
//!   ├ docview   the document view's structure (lists, tables from the stored light markup) and query marks
//!   ├ ocr       text in page images (scans, photos): PP-OCRv4's detection, direction and recognition models on
//!   │           ONNX Runtime, lines in reading order with boxes and confidence; page images out of image files and
//!   │           scanned PDFs, bounded (ocr/{detect,recognise,layout,images}.rs; real-model tests in ocr/tests.rs)
//!   ├ ingest    files → ParsedDocument (pdf, docx, html, md, txt, csv, jsonl, zip, images; encodings; limits):
//!   │           ingest/{pdf,docx,html,csv,archive,encoding}.rs, scans read by the OCR in ingest/scan.rs (pages
//!   │           and confidence kept per line), a document's department, type and date
//!   │           from its record, folders or upload form in ingest/meta.rs, parsed in a sandboxed child by
//!   │           ingest/worker.rs; fuzz targets and fixture writers in
//!   │           ingest/{fuzz,fixtures}.rs
//!   ├ jobs      durable jobs in SQLite: rows, files, typed parameters (`JobParams`), cancel requests
//!   ├ cancel    cancel tokens a task checks at each batch, and the hub that wakes the scheduler (held by the
//!   │           engine, so below it)
//!   ├ tasks     on top of everything it runs: the typed Task enum (stored as a job's kind and params) and the one
//!   │           scheduler (tasks/scheduler.rs) with its lanes: ingest (tasks/ingest_lane.rs: claiming, reading
//!   │           and confirming files, resumed after a crash), the model lane (tasks/model_lane.rs: evaluation,
//!   │           promotion, training and offline embedding, one `match` on Task), a backup lane, a timer lane for schedules and
//!   │           housekeeping; woken on submit, cancel, a task's end and due times, never polling
//!   ├ text      normalisation (full/half width, controls) and sentence/heading-aware chunking
//!   ├ lexical   tantivy BM25 with jieba search-mode tokens + medical dictionary; derived from SQLite
//!   ├ query     query understanding: folding (full-width, traditional → simplified), salient terms, synonym
//!   │           expansion, pinyin
//!   ├ synonyms  the admins' synonym and abbreviation table (seeded, CSV, audited, reloaded by version)
//!   ├ encoders  ONNX Runtime encoders for model packages (pooling, Matryoshka width, prompts, batching); the
//!   │           device decision by a real CUDA probe and one batching thread per model (encoders/{device,service}.rs)
//!   ├ gpu       what the GPU path needs (install prefix, driver node) and why CUDA is unavailable: named by the
//!   │           error type and the encoders alike
//!   ├ models    model registry, active (query, document) pair and the pairing rule; the models in memory, loaded
//!   │           once: encoders, tokenizers, the active pair as last read (models/loaded.rs)
//!   ├ judgments labelled query sets per collection (uploads and clinician feedback), split train/eval by query
//!   ├ lifecycle import of a verified model package (hashes, roles, ONNX Runtime parity with the trainer;
//!   │           the graph checked in a sandboxed child by lifecycle/graph.rs; lifecycle/tests.rs)
//!   ├ sandbox   untrusted input handled in a child of `care` under address-space, CPU and wall-clock limits
//!   │           and Landlock: the parsers (ingest/worker.rs) and the graph check
//!   ├ dense     LanceDB tables per (collection, document model); exact scan or IVF-PQ
//!   ├ kernels   the exact scan's inner products, AVX-512 / AVX2 / NEON picked at run time
//!   ├ fusion    BM25 ∥ dense → RRF or weighted min-max, with per-hit score parts
//!   ├ facets    filters by department, type and date (applied inside both legs), disjunctive facet counts,
//!   │           date order; the metadata kept in memory by version
//!   ├ hybrid    Retrieval: dense sync with SQLite, query encoding, model activation, the fused rankings
//!   ├ search    the one search pipeline (page, API, CLI, eval, the gate): plan → understand → encode → legs →
//!   │           fuse → evidence (what answers, counted apart from what is only near) → page
//!   ├ vectors   document vectors computed offline: export chunks for the trainer, import its embedding shards
//!   ├ eval      BEIR/STS sets and ranking metrics (nDCG, MAP, MRR, Recall), fusion tuning (eval/{metrics,sts}.rs)
//!   ├ training  retraining as a job: data from approved collections + feedback, `care-train run --spec` child
//!   │           processes (a guard kills and reaps each; their events are the progress), export → import → gate →
//!   │           promotion; schedules; offline embedding (training/{child,data,schedule,embed,tests}.rs)
//!   ├ trainer   whether `care-train` can run here: checked in the background, cached for pages
//!   ├ backup    one consistent archive of the data directory made while serving (the database copied, the
//!   │           indexes and models hard-linked while writes wait: backup/snapshot.rs), compressed, optionally
//!   │           encrypted, every byte checked (backup/archive.rs); restored onto an empty directory
//!   │           (backup/restore.rs); its own lane of the scheduler; the daily time, folder and retention
//!   │           the console sets (backup/schedule.rs); a standby's marker and promotion
//!   │           (backup/standby.rs); tests in backup/tests.rs
//!   ├ chart     small SVG charts for reports
//!   ├ csv_out   the one CSV writer of every export: formula prefixes neutralised (OWASP), RFC 4180 quoting
//!   ├ demo      the embedded demo collection
//!   └ tests     (test builds only) the integration tests, inside the crate so they reach its crate-private
//!               operations: tests/{engine,scans,scheduler,service}.rs
//! ```
//!
//! Callers (the `care` CLI and the HTTP server) use [`Engine`] and [`error::Error`]; error codes
//! ([`error::ErrorCode`]) are stable and mapped to HTTP statuses by the server alone.

pub mod accounts;
pub mod analytics;
pub mod audit;
pub mod backup;
pub mod cancel;
pub mod chart;
pub mod clock;
pub mod config;
pub mod csv_out;
pub mod datadir;
pub mod demo;
pub mod dense;
pub mod directory;
pub mod docview;
pub mod encoders;
pub mod engine;
pub mod error;
pub mod eval;
pub mod facets;
pub mod feedback;
pub mod fusion;
pub mod gpu;
pub mod hybrid;
pub mod indexer;
pub mod ingest;
pub mod jobs;
pub mod judgments;
// The only unsafe code: SIMD intrinsics behind run-time CPU detection (the .deb targets baseline x86-64).
#[allow(unsafe_code)]
pub mod kernels;
pub mod lexical;
pub mod lifecycle;
pub mod limits;
pub mod models;
pub mod ocr;
pub mod priority;
pub mod query;
pub mod sandbox;
pub mod search;
pub mod service;
pub mod settings;
pub mod store;
pub mod synonyms;
pub mod tasks;
pub mod text;
pub mod trainer;
pub mod training;
pub mod vectors;
pub mod versioned;

#[cfg(test)]
mod tests;

pub use care_formats::Graph;
pub use config::EngineConfig;
pub use engine::{Engine, IngestProgress, IngestReport, OpenMode};
pub use error::{Error, ErrorCode, Result};
pub use ingest::{IngestLimits, IngestOptions};
pub use jobs::{FileError, Job, JobState};
pub use search::{Expansion, MAX_QUERY_CHARS, SearchHit, SearchRequest, SearchResults};
pub use service::{Actor, Admin, DocumentQuery, DocumentRow, HealthReport, JobView, SearchAs, UserInfo, UserUpdate};
pub use tasks::ingest_lane::{Worker, WorkerHandle};
pub use tasks::scheduler::{Scheduler, SchedulerHandle, SchedulerOptions};
pub use tasks::{CancelToken, Chore, Housekeeping, Task};

/// The first thing the appliance's executables (`care`, `care-bench`) do: started as one of the engine's sandboxed
/// children (a file parser, an imported model's graph check), serve that and exit; otherwise register this
/// executable as the one those children are started from, so that untrusted input is handled in them.
pub fn serve_sandboxed_child_or_register() {
    let first = std::env::args().nth(1);
    if first.as_deref() == Some(ingest::worker::SUBCOMMAND) {
        std::process::exit(ingest::worker::serve());
    }
    if first.as_deref() == Some(lifecycle::graph::SUBCOMMAND) {
        std::process::exit(lifecycle::graph::serve());
    }
    if let Ok(exe) = std::env::current_exe() {
        sandbox::use_executable(exe);
    }
}
