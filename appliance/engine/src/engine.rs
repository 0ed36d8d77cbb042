//! The engine: the parts of one data directory (its SQLite store, the lexical and dense indexes, the models, the
//! settings in force, the scheduler's signal) opened together and lent to the operations as parts of their own:
//! [`crate::indexer::Indexer`] (the write protocol), [`crate::search::Searcher`], [`crate::hybrid::Retrieval`],
//! [`crate::jobs::JobQueue`] and the others below. The façade's handles (`engine.search()`, `.models()`, …) are
//! declared here too.

use crate::config::EngineConfig;
use crate::datadir::DataDir;
use crate::dense::DenseStore;
use crate::error::{Error, Result};
use crate::lexical::LexicalIndex;
use crate::store::Store;

pub struct Engine {
    pub(crate) cfg: EngineConfig,
    pub(crate) dir: DataDir,
    /// The search path's group-commit audit writer ([`crate::audit::writer`]). Before `store`: fields drop in
    /// order, so its thread commits what is queued and lets go of the writer connection before the store
    /// checkpoints the log and closes.
    pub(crate) audit_writer: crate::audit::writer::Writer,
    pub(crate) store: Store,
    pub(crate) lexical: LexicalIndex,
    pub(crate) dense: DenseStore,
    /// Encoders, tokenizers and the active pair in memory ([`crate::models::LoadedModels`]).
    pub(crate) models: crate::models::LoadedModels,
    /// Serialises writes to the stores (ingest batches, deletions): the write protocol assumes one writer, while
    /// job workers parse files in parallel.
    pub(crate) write_lock: std::sync::Mutex<()>,
    /// The synonym table as of its version in SQLite ([`crate::search::Searcher::synonym_table`]).
    pub(crate) synonyms: crate::versioned::Versioned<crate::synonyms::SynonymTable>,
    /// Whether words occur in the chunks' text ([`crate::store::texts::TextPresence`]).
    pub(crate) texts: crate::store::texts::TextPresence,
    /// Documents' filing as of its version in SQLite ([`crate::search::Searcher::meta_index`]).
    pub(crate) meta_index: crate::versioned::Versioned<crate::facets::MetaIndex>,
    /// The trainer's status as of its newest check ([`crate::training::trainer_status`]).
    pub(crate) trainer_check: crate::trainer::TrainerCheck,
    /// The scheduler's wake-up signal and the cancel tokens of running tasks ([`crate::tasks`]).
    pub(crate) tasks: crate::cancel::Hub,
    /// OpenID Connect sign-ins in flight and the provider's metadata ([`crate::directory::oidc`]).
    pub(crate) oidc: crate::directory::oidc::OidcState,
    /// The console's changes to settings, over `cfg` ([`crate::settings`]).
    pub(crate) live: crate::settings::LiveSettings,
    /// The hospital sign-in in force: `cfg`'s sections or the console's ([`crate::directory::console`]).
    pub(crate) sign_in: crate::directory::console::LiveSignIn,
}

pub use crate::indexer::{Chunker, ConsistencyReport, FileReport, IngestProgress, IngestReport, RecoveryReport, Stats};

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("data_dir", &self.dir.root()).finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The data directory must exist (created by `care init`).
    Existing,
    /// Create the data directory if missing.
    Create,
}

/// Declares the façade's handles (their operations are in `service.rs` and beside the code they drive): a `Copy`
/// borrow of the engine each, reached by `Engine::<group>()`. Declared here, below every module that implements
/// operations on them, so that none of those modules has to import the service layer.
macro_rules! handles {
    ($($(#[$doc:meta])* $name:ident => $group:ident;)*) => {
        $(
            $(#[$doc])*
            #[derive(Clone, Copy)]
            pub struct $name<'e>(&'e Engine);

            impl std::ops::Deref for $name<'_> {
                type Target = Engine;
                fn deref(&self) -> &Engine {
                    self.0
                }
            }
        )*
        impl Engine {
            $(
                $(#[$doc])*
                pub fn $group(&self) -> $name<'_> {
                    $name(self)
                }
            )*
        }
    };
}

handles! {
    /// Searching, the document view behind a hit, relevance feedback, and the synonym table searches expand with.
    Search => search;
    /// Collections: listing what an actor may read, creating, approving for training, deleting.
    Collections => collections;
    /// Uploads and ingestion jobs.
    Ingest => ingest;
    /// Model packages, the active pair, evaluation, promotion and rollback, judgment sets, document vectors.
    Models => models;
    /// Retraining runs, their schedules, data and disk needs, and whether the trainer can run here.
    Training => training;
    /// Users, sign-in, API tokens and read grants.
    Accounts => accounts;
    /// The audit log: reading, exporting, verifying, purging, and the records of refused attempts.
    Audit => audit;
    /// Background tasks as the console lists them, and their cancellation.
    Tasks => tasks;
    /// Backups: queuing one, listing and verifying archives.
    Backups => backups;
    /// The settings an administrator changes in the console (audited), over `care.toml`'s.
    Settings => settings;
}

impl Engine {
    pub fn open(cfg: EngineConfig, mode: OpenMode) -> Result<Self> {
        cfg.ldap.validate()?;
        cfg.oidc.validate()?;
        crate::clock::set_offset_minutes(cfg.training.utc_offset_minutes);
        let dir = DataDir::open(&cfg.storage.data_dir, mode == OpenMode::Create)?;
        let store = Store::open_with(&dir.sqlite(), cfg.storage.read_connections)?;
        let lexical = LexicalIndex::open(&dir.lexical(), Some(&dir.user_dict()))?;
        let dense = DenseStore::open(&dir.dense())?;
        let audit_writer = crate::audit::writer::Writer::start(store.shared_writer())?;
        let engine = Engine {
            models: crate::models::LoadedModels::new(cfg.model.clone()),
            cfg,
            dir,
            audit_writer,
            store,
            lexical,
            dense,
            write_lock: Default::default(),
            synonyms: Default::default(),
            texts: Default::default(),
            meta_index: Default::default(),
            trainer_check: Default::default(),
            tasks: Default::default(),
            oidc: Default::default(),
            live: Default::default(),
            sign_in: Default::default(),
        };
        engine.live.reload(&engine.store)?;
        engine.sign_in.reload(&engine.store, &engine.cfg.ldap, &engine.cfg.oidc)?;
        crate::synonyms::ensure_seeded(&engine.store)?;
        let report = engine.indexer().recover()?;
        if report.reindexed_documents > 0
            || report.finished_deletions > 0
            || report.rebuilt
            || report.dense_repaired > 0
        {
            tracing::warn!(?report, "recovered from an interrupted write");
        }
        engine.queue().recover_jobs()?;
        let swept = engine.queue().sweep_uploads();
        if swept > 0 {
            tracing::info!(folders = swept, "removed upload folders that no job owns (interrupted uploads)");
        }
        Ok(engine)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    pub fn data_dir(&self) -> &DataDir {
        &self.dir
    }
    /// The dense indexes, models and fused rankings, borrowed from the parts that hold them.
    pub fn retrieval(&self) -> crate::hybrid::Retrieval<'_> {
        crate::hybrid::Retrieval {
            cfg: &self.cfg,
            dir: &self.dir,
            store: &self.store,
            lexical: &self.lexical,
            dense: &self.dense,
            models: &self.models,
            live: &self.live,
        }
    }
    /// Chunks as the offline document encoder sees them and the vectors of the dense indexes.
    pub fn vectors(&self) -> crate::vectors::Vectors<'_> {
        crate::vectors::Vectors { r: self.retrieval() }
    }
    /// Judged queries, uploaded and from feedback.
    pub(crate) fn judgments(&self) -> crate::judgments::Judgments<'_> {
        crate::judgments::Judgments { store: &self.store, cfg: &self.cfg }
    }
    /// The job queue: uploads, submissions, the scheduler's lock.
    pub fn queue(&self) -> crate::jobs::JobQueue<'_> {
        crate::jobs::JobQueue { cfg: &self.cfg, dir: &self.dir, store: &self.store, tasks: &self.tasks }
    }
    /// The search pipeline over the store, the indexes, the synonym table and the filing.
    pub fn searcher(&self) -> crate::search::Searcher<'_> {
        crate::search::Searcher {
            cfg: &self.cfg,
            store: &self.store,
            lexical: &self.lexical,
            synonyms: &self.synonyms,
            texts: &self.texts,
            meta_index: &self.meta_index,
            live: &self.live,
            retrieval: self.retrieval(),
        }
    }
    /// The write protocol: ingest batches, deletions, recovery and the consistency check.
    pub fn indexer(&self) -> crate::indexer::Indexer<'_> {
        crate::indexer::Indexer { retrieval: self.retrieval(), write_lock: &self.write_lock, queue: self.queue() }
    }
    // The parts end here.

    /// Adds words to the admin's dictionary and rebuilds the lexical index with it, audited as `dictionary.add`.
    /// Takes the configuration rather than an open engine: opening one is what rebuilds the index.
    pub fn add_dictionary_words(cfg: &EngineConfig, words: &[String], actor: &crate::accounts::Admin) -> Result<()> {
        let dir = DataDir::open(&cfg.storage.data_dir, false)?;
        let path = dir.user_dict();
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        for w in words {
            let w = w.trim();
            if w.is_empty() || w.contains(char::is_whitespace) {
                return Err(Error::InvalidInput(format!("词典词条 {w:?} 应为一个不含空格的词")));
            }
            if !text.ends_with('\n') && !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!("{w} 20000\n"));
        }
        let tmp = path.with_extension("txt.tmp");
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        // Opening the engine notices the new dictionary hash and rebuilds the index.
        let e = Engine::open(cfg.clone(), OpenMode::Existing)?;
        e.store.audit_record(&actor.name, "dictionary.add", &serde_json::json!({ "words": words }))
    }
}
