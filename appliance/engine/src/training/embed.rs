//! The offline document model's missing vectors, embedded on this machine by `care-train embed-corpus` as a queued
//! job (`model.embed_offline`): an LLM document encoder (Qwen3) has no ONNX graph the appliance could run, so its
//! vectors for new chunks come from the trainer, on the GPU when there is one, and are imported with the same
//! checks as hand-made shards. Why this route and not a Qwen3 ONNX export: docs/dev/trainer.md (*Serving an LLM
//! document encoder*).

use std::path::Path;

use care_formats::ModelManifest;
use care_formats::trainer::{EmbedCorpusSpec, EmbedOptions, Phase};
use serde::{Deserialize, Serialize};

use super::Run;
use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::models::ModelRecord;
use crate::{Admin, Engine};

pub const EMBED: &str = "model.embed_offline";

/// The stored parameters of an offline embedding task ([`Task::EmbedPending`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedParams {
    /// `name@version` of the offline document model.
    pub model: String,
}

impl crate::jobs::JobParams for EmbedParams {
    const KIND: &'static str = "model.embed_offline";
}

/// Runs job `id`: per collection, export the pending chunks, embed them, import the shards. Restartable: a
/// collection whose vectors were imported has nothing pending any more.
pub(crate) fn run_offline_embed_job(
    engine: &Engine,
    id: i64,
    p: &EmbedParams,
    actor: &Admin,
    token: &CancelToken,
) -> Result<serde_json::Value> {
    let doc = crate::models::find(&engine.store, &p.model)?;
    embeddable(&doc)?;
    let manifest = ModelManifest::load(&doc.dir).map_err(|e| Error::Model(e.to_string()))?;
    let template = manifest.render(&manifest.document_template, "{text}");
    let dir = engine.cfg.storage.data_dir.join("train").join(format!("embed-{id}"));
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| Error::io(&dir, e))?;
    let run = Run { e: engine, id, dir: &dir, token };
    let cols = engine.store.collection_list()?;
    let mut embedded = 0;
    for (i, col) in cols.iter().enumerate() {
        run.progress(&format!("嵌入集合 {} ({}/{})", col.name, i + 1, cols.len()), i as u64, cols.len() as u64)?;
        let pending = engine.vectors().pending_vectors(&col.name, Some(&p.model))?.1.len();
        if pending == 0 {
            continue;
        }
        let chunks = dir.join(format!("chunks-{}.jsonl", col.id));
        let vecs = dir.join(format!("vectors-{}", col.id));
        engine.vectors().export_chunks_for(&col.name, &chunks, Some(&p.model))?;
        let _ = std::fs::remove_dir_all(&vecs);
        run.trainer(Phase::EmbedCorpus(EmbedCorpusSpec {
            document: doc.dir.clone(),
            corpus: chunks.clone(),
            out: vecs.clone(),
            pairing_id: doc.pairing_id.clone(),
            options: EmbedOptions {
                width: Some(doc.width as i64),
                document_template: template.clone(),
                ..EmbedOptions::default()
            },
        }))?;
        engine.models().import_vectors(&col.name, &vecs, Some(&p.model), actor, &mut |_| {})?;
        embedded += pending;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(serde_json::json!({"model": p.model, "embedded": embedded}))
}

/// Offline (no ONNX graph) and with the weights `care-train` loads (config.json and model.safetensors, or a sharded
/// checkpoint's index).
fn embeddable(doc: &ModelRecord) -> Result<()> {
    let name = format!("{}@{}", doc.name, doc.version);
    if doc.online {
        return Err(Error::InvalidInput(format!(
            "{name} 由本机 ONNX Runtime 在线嵌入，新段落入库时即已嵌入 ({name} is an online model: new chunks are embedded \
             as they are ingested)"
        )));
    }
    let has = |f: &str| Path::new(&doc.dir).join(f).exists();
    if !has("config.json") || !(has("model.safetensors") || has("model.safetensors.index.json")) {
        return Err(Error::InvalidInput(format!(
            "离线文档模型 {name} 的包中没有训练器可读的权重 (package {name} has no config.json + model.safetensors or \
             model.safetensors.index.json, so this machine cannot embed with it: list the weight files in the \
             package's manifest, or embed offline with `care-train embed-corpus` and `care collection import-vectors`)"
        )));
    }
    Ok(())
}

impl crate::engine::Models<'_> {
    /// Queues a job that embeds every chunk still lacking a vector of offline document model `model` (default: the
    /// live document model) with `care-train embed-corpus` and imports the vectors. Refused before anything is
    /// queued when the model is online, its package has no trainer weights, or `care-train` cannot start.
    pub fn submit_offline_embed(&self, actor: &Admin, model: Option<&str>) -> Result<i64> {
        let doc = self.engine.vectors().document_model(model, || {
            Error::InvalidInput("没有在用的模型；请指定离线文档模型 (no live pair: name the document model)".into())
        })?;
        embeddable(&doc)?;
        let st = crate::training::refresh_trainer_status(self.engine);
        if !st.ready {
            return Err(Error::TrainerUnavailable(st.message));
        }
        let model = format!("{}@{}", doc.name, doc.version);
        let id = {
            let mut conn = self.engine.store.conn();
            let tx = conn.transaction()?;
            self.engine.queue().queue_room(&tx)?;
            let id = crate::jobs::insert_job(&tx, &EmbedParams { model: model.clone() }, actor)?;
            crate::audit::append(
                &tx,
                &actor.name,
                "model.embed_offline",
                &serde_json::json!({"job": id, "model": model}),
            )?;
            tx.commit()?;
            id
        };
        self.engine.queue().tasks_changed();
        Ok(id)
    }
}
