//! Engine settings (the `[storage]`, `[ingest]`, `[search]`, `[model]`, `[lifecycle]`, `[training]`, `[limits]`,
//! `[ldap]`, `[oidc]`, `[backup]` and `[background]` sections of `care.toml`).
//!
//! Layering (defaults < file < env < CLI) is done by the binary; the engine only defines the shape and defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::encoders::ModelConfig;
pub use crate::ingest::{IngestConfig, IsolationConfig};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EngineConfig {
    pub storage: StorageConfig,
    pub ingest: IngestConfig,
    pub search: SearchConfig,
    pub model: ModelConfig,
    pub lifecycle: LifecycleConfig,
    pub training: TrainingConfig,
    pub limits: LimitsConfig,
    /// Sign-in through the hospital's LDAP / Active Directory.
    pub ldap: crate::directory::ldap::LdapConfig,
    /// Sign-in through the hospital's OpenID Connect provider (统一认证).
    pub oidc: crate::directory::oidc::OidcConfig,
    /// Where backups go, their key and retention.
    pub backup: BackupConfig,
    /// The CPU priority of background work beside searches.
    pub background: BackgroundConfig,
}

impl EngineConfig {
    /// Bytes `[training] keep_free_gb` keeps free on the data disk for search, sign-in and SQLite.
    pub fn disk_reserve_bytes(&self) -> u64 {
        (self.training.keep_free_gb.max(0.0) * f64::from(1u32 << 30)) as u64
    }
}

/// Caps on what accumulates (`[limits]`): each refusal is a Chinese error naming the setting.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LimitsConfig {
    /// Training schedules that may exist at once.
    pub max_schedules: usize,
    /// Jobs (ingest uploads, evaluations, promotions, training, offline embedding) that may wait in the queue.
    pub max_queued_jobs: usize,
    /// Feedback clicks one user may give per hour; feedback can start a schedule's training run.
    pub feedback_per_user_per_hour: u32,
    /// Feedback rows of one user that count in training data and evaluation (that user's newest, over all
    /// collections): the rate limit bounds how fast feedback arrives, this bounds how far one account, careless
    /// or hostile, can pull what the model learns and the gate that judges it. 0: feedback is not used.
    pub max_feedback_per_user: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_schedules: 20,
            max_queued_jobs: 200,
            feedback_per_user_per_hour: 300,
            max_feedback_per_user: 200,
        }
    }
}

/// How candidate model pairs are judged (`[lifecycle]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LifecycleConfig {
    /// Share of each judgment set's queries (picked by a hash of the query text) kept for evaluation; training
    /// never sees them.
    pub eval_fraction: f64,
    /// The gate: the lower end of the 95 % interval of (candidate − live) nDCG@10 must exceed this.
    pub gate_margin: f64,
    /// The gate: the candidate's query-encode p99 may be at most this multiple of the live pair's.
    pub max_latency_ratio: f64,
    /// The gate: no collection's nDCG@10 may fall by more than this (point estimate on its evaluation part). The
    /// gain is judged over every evaluation query, and one query encoder serves every collection, so a large
    /// collection's gain could otherwise hide a small one's loss.
    pub max_collection_loss: f64,
    /// A candidate whose package carries an int8 query graph is timed and scored in both graphs; the int8 one
    /// serves when its encode p50 is lower and its nDCG@10 over every evaluation query is at most this below the
    /// fp32 graph's.
    pub int8_max_loss: f64,
    /// Resamples of the paired bootstrap.
    pub bootstrap_samples: usize,
    /// Vector tables kept for rollback: besides the live pair's, those of the document models of this many earlier
    /// live pairs. Older ones are dropped by housekeeping; rolling back that far re-embeds first.
    pub keep_rollback_tables: usize,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            eval_fraction: 0.3,
            gate_margin: 0.0,
            max_latency_ratio: 1.25,
            max_collection_loss: 0.01,
            int8_max_loss: 0.005,
            bootstrap_samples: 1000,
            keep_rollback_tables: 2,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct StorageConfig {
    /// Where SQLite, the indexes and the models live.
    pub data_dir: PathBuf,
    /// Read-only SQLite connections shared by searches, session checks and listings; they read beside the one
    /// writer (WAL), so ingest does not hold them up. More only helps with more cores.
    pub read_connections: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from("/var/lib/care"),
            read_connections: crate::store::DEFAULT_READ_CONNECTIONS,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SearchConfig {
    pub default_limit: usize,
    pub max_limit: usize,
    /// Deepest result offset a request may page to. Bounded because the lexical index preallocates
    /// `offset + limit` slots: an unbounded offset from a URL would abort the process.
    pub max_offset: usize,
    /// Weight of title and heading matches relative to body matches in BM25.
    pub title_boost: f32,
    /// Snippet length in bytes (about a third as many Chinese characters).
    pub snippet_bytes: usize,
    /// Candidates taken from each of BM25 and dense retrieval before fusion.
    pub candidates: usize,
    /// Dense weight of weighted fusion for collections that have not been tuned (`care tune-fusion`).
    pub default_dense_weight: f32,
    /// Tables with more vectors than this get an IVF-PQ index; smaller ones are searched exactly.
    pub ann_threshold: usize,
    /// IVF partitions probed and the refine factor (shortlist re-ranked with full vectors) for ANN search.
    pub ann_nprobes: usize,
    pub ann_refine: u32,
    /// BM25 weight of the synonyms a query's table terms add (the query's own terms weigh 1); 0 turns expansion off.
    pub synonym_weight: f32,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            default_limit: 10,
            max_limit: 100,
            max_offset: 1000,
            title_boost: 1.0,
            snippet_bytes: 240,
            candidates: 100,
            default_dense_weight: 0.7,
            ann_threshold: 1_000_000,
            ann_nprobes: 64,
            ann_refine: 10,
            synonym_weight: 0.35,
        }
    }
}

/// `[training]` in care.toml.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct TrainingConfig {
    /// The trainer executable (the .deb installs the `care-train` wrapper that finds libtorch).
    pub trainer: PathBuf,
    /// cpu, cuda or auto.
    pub device: String,
    /// Trainer threads (0: libtorch's default, every core).
    pub threads: usize,
    /// The hospital's offset from UTC in minutes, for schedules ("every Sunday 02:00" in local time).
    pub utc_offset_minutes: i32,
    /// Space (GB) a run must leave free on the data disk for ingest, search and SQLite: a run that would eat into
    /// it is refused before it starts.
    pub keep_free_gb: f64,
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            trainer: "care-train".into(),
            device: care_formats::trainer::DEFAULT_DEVICE.into(),
            threads: 0,
            utc_offset_minutes: 480,
            keep_free_gb: 2.0,
        }
    }
}

/// A configuration for tests: data in `dir`, and no disk reserve (tests must not depend on the host's free disk; the
/// reserve's own tests set one).
#[cfg(test)]
pub(crate) fn test_config(dir: &std::path::Path) -> EngineConfig {
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.to_path_buf();
    cfg.training.keep_free_gb = 0.0;
    cfg
}

/// `[backup]` in `care.toml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BackupConfig {
    /// Where archives go. Default: `care-backups` beside the data directory (`/var/lib/care-backups`); put it on
    /// another disk or a mounted share, or a dead disk takes the backups with the data.
    pub dir: Option<PathBuf>,
    /// A key file (`care backup keygen`) to encrypt archives with; keep a copy apart from the archives.
    pub key_file: Option<PathBuf>,
    /// Retention after each backup: the newest archive of each of the last `keep_daily` days and of each of the
    /// last `keep_weekly` weeks are kept, the others removed (both 0: nothing is removed).
    pub keep_daily: u32,
    pub keep_weekly: u32,
    /// A backup every day at this time ("HH:MM", the hospital's time, `[training] utc_offset_minutes`); none
    /// without it. The console's 设置 → 备份 can set it (and the folder and retention) over this file.
    pub time: Option<String>,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig { dir: None, key_file: None, keep_daily: 7, keep_weekly: 4, time: None }
    }
}

impl BackupConfig {
    /// The folder archives go to for the data directory `data_dir`.
    pub fn folder(&self, data_dir: &std::path::Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| {
            let parent = data_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
            parent.join("care-backups")
        })
    }
}

/// `[background]`: imports, backups, training and, on the CPU, document embedding run at a lower CPU priority than
/// searches, so that a clinician's search beside them keeps the cores (see `priority.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BackgroundConfig {
    /// The nice value of the scheduler's working lanes (and the parsing children and trainers they start) and of
    /// document embedding on the CPU, which then runs on a thread and ONNX session of its own. 0: background work
    /// runs at the searches' priority, and document pieces take turns with queries on the one encoder thread.
    pub nice: i32,
}

impl Default for BackgroundConfig {
    fn default() -> Self {
        // This crate's tests run many engines side by side in one process at nice 0. Lowered lanes there would wait
        // for the neighbouring tests rather than for searches (two training tests went from 6 to over 10 minutes).
        // The tests of the lowering set it themselves.
        let nice = if cfg!(test) { 0 } else { crate::priority::BACKGROUND_NICE };
        BackgroundConfig { nice }
    }
}
