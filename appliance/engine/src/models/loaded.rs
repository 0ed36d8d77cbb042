//! The models the engine has in memory: one encoder per (model, graph), the query models' tokenizers (chunks are
//! measured in their tokens), and the active pair as last read from SQLite. The search path, ingest, evaluation and
//! training all reach models through this one owner, so a model is loaded once per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use care_formats::Graph;

use super::{ActivePair, ModelRecord};
use crate::encoders::{ModelConfig, OrtEncoder};
use crate::error::{Error, Result};
use crate::store::Store;

/// How long the active pair read from SQLite is trusted: the query path asks for it several times per search, and a
/// pair switched by another process (the CLI while the server runs) shows up within this.
const ACTIVE_PAIR_FOR: Duration = Duration::from_secs(1);

pub(crate) struct LoadedModels {
    cfg: ModelConfig,
    encoders: Mutex<HashMap<(i64, Graph), Arc<OrtEncoder>>>,
    tokenizers: Mutex<HashMap<i64, Arc<tokenizers::Tokenizer>>>,
    active: Mutex<Option<(Instant, Option<ActivePair>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LoadedModels {
    /// `documents_nice`: `[background] nice`, the priority of document embedding on the CPU.
    pub(crate) fn new(mut cfg: ModelConfig, documents_nice: i32) -> Self {
        cfg.documents_nice = documents_nice;
        Self { cfg, encoders: Default::default(), tokenizers: Default::default(), active: Default::default() }
    }

    /// The active pair, read from `store` at most once per [`ACTIVE_PAIR_FOR`].
    pub(crate) fn active_pair(&self, store: &Store) -> Result<Option<ActivePair>> {
        let mut cache = lock(&self.active);
        if let Some((at, pair)) = cache.as_ref()
            && at.elapsed() < ACTIVE_PAIR_FOR
        {
            return Ok(pair.clone());
        }
        let pair = crate::models::active(store)?;
        *cache = Some((Instant::now(), pair.clone()));
        Ok(pair)
    }

    /// After this process changed the active pair: the next search reads it again.
    pub(crate) fn forget_active_pair(&self) {
        *lock(&self.active) = None;
    }

    /// The model's fp32 encoder: documents, and the hard-negative miner's guide.
    pub(crate) fn encoder(&self, model: &ModelRecord) -> Result<Arc<OrtEncoder>> {
        self.graph(model, Graph::Fp32)
    }

    /// The encoder queries are searched with: the graph the model was promoted with.
    pub(crate) fn query_encoder(&self, model: &ModelRecord) -> Result<Arc<OrtEncoder>> {
        self.graph(model, model.served_query_graph())
    }

    /// One graph's encoder, loaded once (each with its own session thread).
    pub(crate) fn graph(&self, model: &ModelRecord, graph: Graph) -> Result<Arc<OrtEncoder>> {
        let mut cache = lock(&self.encoders);
        if let Some(e) = cache.get(&(model.id, graph)) {
            return Ok(e.clone());
        }
        let e = Arc::new(OrtEncoder::load_graph(&model.dir, graph, &self.cfg)?);
        tracing::info!(model = %model.name, version = %model.version, %graph, device = e.device, "loaded encoder");
        cache.insert((model.id, graph), e.clone());
        Ok(e)
    }

    /// A query model's tokenizer, loaded without its ONNX session: whole passages measured, no truncation or padding.
    pub(crate) fn tokenizer(&self, model: &ModelRecord) -> Result<Arc<tokenizers::Tokenizer>> {
        let mut cache = lock(&self.tokenizers);
        if let Some(t) = cache.get(&model.id) {
            return Ok(t.clone());
        }
        let path = model.dir.join("tokenizer.json");
        let mut t =
            tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
        t.with_truncation(None).map_err(|e| Error::Model(e.to_string()))?;
        t.with_padding(None);
        let t = Arc::new(t);
        cache.insert(model.id, t.clone());
        Ok(t)
    }
}
