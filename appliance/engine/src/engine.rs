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

/// The façade's handles (their operations are in `service.rs` and beside the code they drive): each a `Copy`
/// struct of the parts it uses, reached by `Engine::<group>()`. Declared here, below every module that implements
/// operations on them, so that none of those modules has to import the service layer. `Models` and `Training`
/// orchestrate (imports, the gate, training runs, promotion) and hold the engine itself.
macro_rules! orchestrating {
    ($($(#[$doc:meta])* $name:ident => $group:ident;)*) => {
        $(
            $(#[$doc])*
            #[derive(Clone, Copy)]
            pub struct $name<'e> {
                pub(crate) engine: &'e Engine,
            }
        )*
        impl Engine {
            $(
                $(#[$doc])*
                pub fn $group(&self) -> $name<'_> {
                    $name { engine: self }
                }
            )*
        }
    };
}

orchestrating! {
    /// Model packages, the active pair, evaluation, promotion and rollback, judgment sets, document vectors.
    Models => models;
    /// Retraining runs, their schedules, data and disk needs, and whether the trainer can run here.
    Training => training;
}

/// Searching, the document view behind a hit, relevance feedback, and the synonym table searches expand with.
#[derive(Clone, Copy)]
pub struct Search<'e> {
    pub(crate) cfg: &'e EngineConfig,
    pub(crate) store: &'e Store,
    pub(crate) synonyms: &'e crate::versioned::Versioned<crate::synonyms::SynonymTable>,
    pub(crate) audit_writer: &'e crate::audit::writer::Writer,
    pub(crate) searcher: crate::search::Searcher<'e>,
    pub(crate) queue: crate::jobs::JobQueue<'e>,
}

/// Collections: listing what an actor may read, creating, approving for training, deleting.
#[derive(Clone, Copy)]
pub struct Collections<'e> {
    pub(crate) store: &'e Store,
    pub(crate) meta_index: &'e crate::versioned::Versioned<crate::facets::MetaIndex>,
    pub(crate) indexer: crate::indexer::Indexer<'e>,
    pub(crate) search: Search<'e>,
}

/// Uploads and ingestion jobs.
#[derive(Clone, Copy)]
pub struct Ingest<'e> {
    pub(crate) cfg: &'e EngineConfig,
    pub(crate) dir: &'e DataDir,
    pub(crate) store: &'e Store,
    pub(crate) queue: crate::jobs::JobQueue<'e>,
    pub(crate) indexer: crate::indexer::Indexer<'e>,
}

/// Users, sign-in, API tokens and read grants.
#[derive(Clone, Copy)]
pub struct Accounts<'e> {
    pub(crate) store: &'e Store,
    pub(crate) sign_in: &'e crate::directory::console::LiveSignIn,
    pub(crate) oidc: &'e crate::directory::oidc::OidcState,
}

/// The audit log: reading, exporting, verifying, purging, and the records of refused attempts.
#[derive(Clone, Copy)]
pub struct Audit<'e> {
    pub(crate) store: &'e Store,
    pub(crate) audit_writer: &'e crate::audit::writer::Writer,
}

/// Background tasks as the console lists them, and their cancellation.
#[derive(Clone, Copy)]
pub struct Tasks<'e> {
    pub(crate) store: &'e Store,
    pub(crate) queue: crate::jobs::JobQueue<'e>,
}

/// Backups: queuing one, listing and verifying archives.
#[derive(Clone, Copy)]
pub struct Backups<'e> {
    pub(crate) cfg: &'e EngineConfig,
    pub(crate) dir: &'e DataDir,
    pub(crate) store: &'e Store,
    pub(crate) queue: crate::jobs::JobQueue<'e>,
    pub(crate) write_lock: &'e std::sync::Mutex<()>,
    pub(crate) retrieval: crate::hybrid::Retrieval<'e>,
}

/// The settings an administrator changes in the console (audited), over `care.toml`'s.
#[derive(Clone, Copy)]
pub struct Settings<'e> {
    pub(crate) cfg: &'e EngineConfig,
    pub(crate) store: &'e Store,
    pub(crate) live: &'e crate::settings::LiveSettings,
    pub(crate) sign_in: &'e crate::directory::console::LiveSignIn,
}

impl Engine {
    /// Searching, the document view behind a hit, relevance feedback, and the synonym table searches expand with.
    pub fn search(&self) -> Search<'_> {
        Search {
            cfg: &self.cfg,
            store: &self.store,
            synonyms: &self.synonyms,
            audit_writer: &self.audit_writer,
            searcher: self.searcher(),
            queue: self.queue(),
        }
    }
    /// Collections: listing what an actor may read, creating, approving for training, deleting.
    pub fn collections(&self) -> Collections<'_> {
        Collections { store: &self.store, meta_index: &self.meta_index, indexer: self.indexer(), search: self.search() }
    }
    /// Uploads and ingestion jobs.
    pub fn ingest(&self) -> Ingest<'_> {
        Ingest { cfg: &self.cfg, dir: &self.dir, store: &self.store, queue: self.queue(), indexer: self.indexer() }
    }
    /// Users, sign-in, API tokens and read grants.
    pub fn accounts(&self) -> Accounts<'_> {
        Accounts { store: &self.store, sign_in: &self.sign_in, oidc: &self.oidc }
    }
    /// The audit log: reading, exporting, verifying, purging, and the records of refused attempts.
    pub fn audit(&self) -> Audit<'_> {
        Audit { store: &self.store, audit_writer: &self.audit_writer }
    }
    /// Background tasks as the console lists them, and their cancellation.
    pub fn tasks(&self) -> Tasks<'_> {
        Tasks { store: &self.store, queue: self.queue() }
    }
    /// Backups: queuing one, listing and verifying archives.
    pub fn backups(&self) -> Backups<'_> {
        Backups {
            cfg: &self.cfg,
            dir: &self.dir,
            store: &self.store,
            queue: self.queue(),
            write_lock: &self.write_lock,
            retrieval: self.retrieval(),
        }
    }
    /// The settings an administrator changes in the console (audited), over `care.toml`'s.
    pub fn settings(&self) -> Settings<'_> {
        Settings { cfg: &self.cfg, store: &self.store, live: &self.live, sign_in: &self.sign_in }
    }
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
            models: crate::models::LoadedModels::new(cfg.model.clone(), cfg.background.nice),
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
            retrieval: self.retrieval(),
            synonyms: &self.synonyms,
            texts: &self.texts,
            meta_index: &self.meta_index,
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
