//! Retraining as an appliance job: approved collections and feedback → `care-train` → a candidate pair → the
//! evaluation gate → promotion, as one durable job (kind `model.train`) in the queue the model thread runs.
//!
//! The server never links libtorch: each training phase is a `care-train run --spec FILE` child process writing into
//! `<data>/train/<job>/`. The spec (what to do) and the events the child reports (steps, checkpoints, its end) are
//! the types of `care_formats::trainer`, shared with the trainer; the child's standard error is the phase's log. Phases run in order and each leaves a marker in `state.json` when it ends, so a restart
//! after a crash skips what finished and re-runs the interrupted phase; the trainer's own `--resume` continues
//! Stage I/II from their last checkpoint, bit for bit (the trainer's tests prove it). The candidate is imported
//! only after export, in one transaction (lifecycle import), so cancelling or crashing earlier registers nothing.
//!
//! ```text
//!  data ─▶ init (prune) ─▶ stage1 ─▶ stage2 ─▶ export ─▶ import ─▶ evaluate ─▶ promote | keep with its report
//! ```

mod child;
pub mod data;
pub mod embed;
pub mod schedule;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use care_formats::ModelRole;
use care_formats::manifest::ModelManifest;
use care_formats::trainer::{
    Event, ExportOptions, ExportSpec, FailCode, Hyper, LayerPick, Lora, MergeSpec, Phase, PruneSpec, ServedVectors,
    Stage, Stage1Options, Stage1Spec, Stage2Options, Stage2Spec, TrainSpec,
};
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

pub use crate::trainer::TrainerStatus;
pub use data::{DataCounts, DataOptions};

use crate::accounts::{Actor, Admin};
use crate::cancel::CancelToken;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::hybrid::DenseProgress;
use crate::lifecycle::{Transfer, pair_spec};
use crate::models::{self, ActivePair, ModelRecord};

pub const TRAIN: &str = "model.train";

/// Which encoders a run trains.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Sides {
    /// Document encoder frozen (Stage I + Stage II on the query encoder): the stored vectors stay valid and
    /// promotion is a hot swap.
    QueryOnly,
    /// Stage II also trains the document encoder (LoRA); promotion re-embeds every collection (blue/green).
    Both,
}

/// A run's recipe. The defaults are sized for a night on a CPU-only workstation: on 2 cores a query-side run from
/// a symmetric 12-layer e5-small (Stage I skipped) on 55k passages and 8k groups (one per judged query) takes
/// about 25 minutes alone (data 3 min, Stage II 500 steps at 1.6 s, the gate 7 min). A 4-layer query encoder
/// pruned from it adds Stage I (1,500 steps at about 0.45 s) and its Stage II steps cost 0.6 s.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Recipe {
    pub sides: Sides,
    /// Keep this many layers of the live query encoder (a smaller, faster one); `None` keeps its size.
    pub query_layers: Option<u32>,
    pub stage1_steps: u64,
    pub stage2_steps: u64,
    pub batch_size: usize,
    pub stage2_batch_size: usize,
    pub stage1_max_texts: usize,
    /// Stage I reads every training query and only the passages of at most this many characters (0: every
    /// passage, the paper's Stage I). A query encoder serves short texts, and a long passage costs the student
    /// several times a short one's step (docs/experiments/2026-11-25-retraining-mining-and-pruning.md).
    pub stage1_max_chars: usize,
    /// Stage II groups per run, at most (a seeded sample); each costs 8 document-encoder passes up front.
    pub stage2_max_groups: usize,
    /// Each Stage II batch from one collection (`care-train stage2 --batch-by-source`), so that in-batch
    /// negatives are passages of the collection the query searches.
    pub stage2_batch_by_source: bool,
    /// Stage II's learning rate.
    pub lr: f64,
    /// Stage I's: a freshly pruned encoder is far from its teacher and moves at 2e-4, where Stage II at 2e-4 lost
    /// 1.6 points of huatuo dense nDCG@10 against 5e-5 (docs/experiments/2026-11-25-retraining-mining-and-pruning.md).
    pub stage1_lr: f64,
    /// Stage I's MSE weight on the squared distance of the unit vectors (2(1 − cos)); the paper uses 1. 1.3 is
    /// what the measured CPU runs used (500 on the former per-element mean at e5's width 384).
    pub mse_weight: f64,
    pub checkpoint_every: u64,
    /// Keep the query encoder's word embeddings fixed (250k × 384 for e5: most of its parameters; on a CPU the
    /// optimizer step over them costs more than the rest of the step).
    pub freeze_embeddings: bool,
    /// Weight of the trained query encoder when it is averaged with the one Stage II started from (WiSE-FT,
    /// `care-train merge`); 1 keeps it as trained. One query encoder serves every collection, and training on
    /// some moves it away from others. On the real run 0.4 is what passed the gate (job 9, promoted; job 7 at 1
    /// was gated out on kuake_qtr's loss): dev huatuo26m_test +4.45 against +3.47, kuake_qtr −0.06 against
    /// −0.22, at the cost of toyhom_neike +1.63 against +2.17
    /// (docs/experiments/2026-11-26-retraining-limits-of-a-cpu-night.md).
    pub merge_ratio: f64,
    /// Promote the candidate when it passes the gate; otherwise keep it with its report for an admin to decide.
    pub promote: bool,
    /// With `sides = both`: the rank and scale of the LoRA adapters Stage II trains on the document encoder
    /// (CARE: r = 32, α = 64) and the projections they sit on (empty: BERT's query, key, value and dense).
    pub lora_rank: i64,
    pub lora_alpha: f64,
    pub lora_targets: Vec<String>,
    /// Stage II encodes at most this many texts in one graph (gradient cache; 0: the whole batch at once). A
    /// trainable document side keeps every passage's activations for the backward pass: 8 groups of 8 passages of
    /// up to 256 tokens grew care-train past 20 GB on a CPU run, which 16 bounds at the cost of one more forward
    /// pass.
    pub stage2_sub_batch: usize,
    #[serde(flatten)]
    pub data: DataOptions,
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe {
            sides: Sides::QueryOnly,
            query_layers: None,
            // 1,500 steps on short texts (below) are about 11 minutes on 2 cores for a 4-layer student.
            stage1_steps: 1500,
            stage2_steps: 500,
            batch_size: Hyper::default().batch_size,
            // 32 groups (255 negatives per query in a step), not 8: on the real run's huatuo dev it gave +2.45
            // nDCG@10 against +0.64 (docs/experiments/2026-11-25-retraining-first-real-run.md); about 1.6 s a step
            // on 2 cores.
            stage2_batch_size: 32,
            stage1_max_texts: 50_000,
            stage1_max_chars: 48,
            stage2_max_groups: 20_000,
            stage2_batch_by_source: false,
            lr: 5e-5,
            stage1_lr: 2e-4,
            mse_weight: 1.3,
            checkpoint_every: 50,
            freeze_embeddings: true,
            merge_ratio: 0.4,
            promote: true,
            lora_rank: Lora::default().rank,
            lora_alpha: Lora::default().alpha,
            lora_targets: Lora::default().targets,
            stage2_sub_batch: 0,
            data: DataOptions::default(),
        }
    }
}

impl Recipe {
    /// The recipe a run takes when the admin changes nothing, on `device` ("cuda" or "cpu"). On a CPU, the query side
    /// at the default budget (both sides cost about 40× a group there: 16,000 groups would be some 11 hours of Stage
    /// II on 2 cores). On a GPU, CARE's full Stage II at the same budget (500 steps × 32 groups): the document side
    /// through LoRA too, at CARE's learning rate 1e-4, each batch in one graph (no gradient cache). On the CPU both
    /// sides gained toyhom_neike +2.40 from 1,200 groups where the query side alone stayed below +2.4
    /// (docs/experiments/2026-11-27-retraining-both-sides-at-equal-budget.md).
    pub fn for_device(device: &str) -> Recipe {
        match device {
            "cuda" => Recipe { sides: Sides::Both, lr: 1e-4, stage2_sub_batch: 0, ..Recipe::default() },
            _ => Recipe::default(),
        }
    }

    /// Stage II groups the recipe trains on (steps × groups a step; fewer when four passes over the data phase's
    /// groups end it first, see [`capped_steps`]): the budget the 训练 page and `care doctor` state.
    pub fn stage2_group_budget(&self) -> u64 {
        self.stage2_steps * self.stage2_batch_size as u64
    }

    /// Stage I's steps for a run from `pair`. Stage I aligns a query encoder to the frozen document encoder. When
    /// the query encoder *is* the document encoder (a symmetric pair such as e5-small, kept at full size) they are
    /// aligned by construction, and Stage I would only spend hours teaching a model its own vectors: 0, and Stage II
    /// starts from it directly.
    fn stage1_steps_from(&self, pair: &ActivePair) -> u64 {
        let same_encoder = self.query_layers.is_none() && pair.query.id == pair.document.id;
        if same_encoder { 0 } else { self.stage1_steps }
    }

    /// Bounds every field a request can set.
    pub fn check(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::InvalidInput(format!("训练配置无效 (recipe: {what})")));
        if self.stage1_steps > 100_000 || !(1..=100_000).contains(&self.stage2_steps) {
            return bad("stage1_steps must be 0–100000 and stage2_steps 1–100000");
        }
        if !(1..=1024).contains(&self.batch_size) || !(1..=1024).contains(&self.stage2_batch_size) {
            return bad("batch sizes must be 1–1024");
        }
        if self.query_layers.is_some_and(|l| !(1..=64).contains(&l)) {
            return bad("query_layers must be 1–64");
        }
        let rate = |x: f64| x > 0.0 && x < 1.0;
        if !(rate(self.lr) && rate(self.stage1_lr) && (0.0..=1e4).contains(&self.mse_weight)) {
            return bad("lr and stage1_lr must be in (0, 1) and mse_weight in [0, 10000]");
        }
        let projection = |t: &String| {
            !t.is_empty() && t.len() <= 64 && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        };
        let lora_ok = (1..=512).contains(&self.lora_rank)
            && self.lora_alpha > 0.0
            && self.lora_alpha <= 1e4
            && self.lora_targets.len() <= 16
            && self.lora_targets.iter().all(projection);
        if !lora_ok || self.stage2_sub_batch > 4096 {
            return bad(
                "lora_rank must be 1–512, lora_alpha in (0, 10000], lora_targets at most 16 projection names, \
                 stage2_sub_batch at most 4096",
            );
        }
        if !(self.merge_ratio > 0.0 && self.merge_ratio <= 1.0) {
            return bad("merge_ratio must be in (0, 1]; 1 keeps the trained query encoder as it is");
        }
        let texts = 1..=1_000_000;
        if !texts.contains(&self.stage1_max_texts)
            || !texts.contains(&self.stage2_max_groups)
            || self.data.negatives > 63
            || self.data.groups_per_query > 10_000
            || self.stage1_max_chars > 100_000
        {
            return bad(
                "stage1_max_texts and stage2_max_groups must be 1–1000000, negatives at most 63, groups_per_query \
                 at most 10000, stage1_max_chars at most 100000",
            );
        }
        Ok(())
    }
}

pub use crate::config::TrainingConfig;

/// A run frees what no later phase reads as soon as a phase ends (see [`prune_behind`]) and imports its export
/// by hard links, so its disk peak is the largest of three moments, in copies of the starting weights (query
/// `Wq`, document `Wd`; an ONNX graph, fp32 or int8 — embeddings stay fp32 in int8 — is about one copy):
/// - training: Stage I's output (when it runs), Stage II's outputs (`Wq`, and `Wd` when both sides train) and the
///   checkpoints (see [`checkpoint_bytes`]);
/// - export: the trained weights (`Wq` + `Wd`) and the packages (safetensors + fp32 graph + int8 graph = `3 Wq`;
///   safetensors + graph = `2 Wd`);
/// - re-embedding (both sides): the imported packages (`3 Wq + 2 Wd`) and the candidate's dense tables.
const EXPORT_QUERY_COPIES: u64 = 4;
const EXPORT_DOCUMENT_COPIES: u64 = 3;
const IMPORTED_QUERY_COPIES: u64 = 3;
const IMPORTED_DOCUMENT_COPIES: u64 = 2;

/// Bytes the checkpoints of training the query encoder in `dir` hold at most: its trainable tensors (without the
/// word embeddings when the recipe freezes them) with their two AdamW moments, for the checkpoints kept plus the
/// one being written. The document side trains LoRA adapters only: small beside these.
fn checkpoint_bytes(dir: &Path, freeze_embeddings: bool) -> Result<u64> {
    let path = dir.join("model.safetensors");
    let layout =
        care_modelio::safetensors::validate(&path).map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
    let trainable = layout.bytes_where(|n| !(freeze_embeddings && n.contains("embeddings.word")));
    Ok(trainable * 3 * (Hyper::default().keep_checkpoints.max(1) as u64 + 1))
}

/// Stage II sees each group at most this many times. CARE trains one epoch; the CPU default (500 steps of 32) is
/// about two over the real run's 8,313 groups. Without a cap a small judgment set (the demo's 100 training
/// queries) would be repeated 160 times, for a quarter of an hour, into a model that only learnt those queries.
const STAGE2_MAX_EPOCHS: u64 = 4;

/// The recipe's Stage II steps, capped at [`STAGE2_MAX_EPOCHS`] passes over the groups the data phase wrote
/// (at most `stage2_max_groups` of them are used).
fn capped_steps(recipe: &Recipe, stage2_file: &Path) -> u64 {
    let groups = std::fs::read(stage2_file).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
    let groups = groups.min(recipe.stage2_max_groups) as u64;
    let per_epoch = groups.div_ceil(recipe.stage2_batch_size.max(1) as u64).max(1);
    recipe.stage2_steps.min(per_epoch * STAGE2_MAX_EPOCHS)
}

/// Stage II can train the document side only of a document encoder this appliance embeds with itself (an ONNX
/// graph, BERT/XLM-R): an offline LLM document encoder is re-embedded by `care-train embed-corpus` on a GPU machine.
fn trainable_document(document: &ModelRecord) -> Result<()> {
    if !document.online || !document.dir.join("model.safetensors").exists() {
        return Err(Error::InvalidInput(format!(
            "文档编码器 {}@{} 是离线模型（无 ONNX 图），本机无法重新生成其文档向量；请改用 sides = query_only \
             (the document encoder {}@{} is an offline model: training the document side needs one this appliance \
             embeds with itself)",
            document.name, document.version, document.name, document.version
        )));
    }
    Ok(())
}

/// What a finished run keeps in its folder: what it trained on and how (data, logs, metrics, charts, state). The
/// weights go: the import copied the candidate into `models/`, and a weekly run would otherwise leave about 2 GB
/// behind for a 12-layer query encoder until the disk that search and ingest need is full.
fn prune_run_dir(dir: &Path) -> u64 {
    prune_run_dir_but(dir, &[])
}

/// [`prune_run_dir`], leaving the entries of `dir` itself whose name starts with one of `keep`.
fn prune_run_dir_but(dir: &Path, keep: &[&str]) -> u64 {
    let mut freed = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    for entry in entries.flatten() {
        if keep.iter().any(|k| entry.file_name().to_string_lossy().starts_with(k)) {
            continue;
        }
        let p = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        if meta.is_dir() {
            if p.file_name().is_some_and(|n| n == "checkpoints") {
                freed += remove_dir_counted(&p);
            } else {
                freed += prune_run_dir(&p);
            }
        } else if p.extension().is_some_and(|x| x == "safetensors" || x == "onnx" || x == "bin" || x == "pt")
            && std::fs::remove_file(&p).is_ok()
        {
            freed += meta.len();
        }
    }
    freed
}

/// Frees, once `phase` of the run in `dir` has ended, the weights no later phase reads: a restart resumes past an
/// ended phase, so nothing freed here is read again. After Stage I or II: that stage's checkpoints (its resume
/// points); after a merge: everything but the merged weights; after the export: everything but the export
/// folders (the stages' and merged weights); after the import: the export folders too (the packages under
/// `models/` are hard links to the same files). Returns the bytes freed.
fn prune_behind(dir: &Path, phase: &str) -> u64 {
    match phase {
        "stage1" | "stage2" => remove_dir_counted(&dir.join(phase).join("checkpoints")),
        // Merged weights are what the export reads; without a merge (ratio 1) it reads Stage II's own.
        "merge" if dir.join("merged").exists() => prune_run_dir_but(dir, &["merged", "export"]),
        "export" => prune_run_dir_but(dir, &["export"]),
        "import" => prune_run_dir(dir),
        _ => 0,
    }
}

/// Removes the folder `dir` with everything in it; returns its bytes (0 when it could not be removed).
fn remove_dir_counted(dir: &Path) -> u64 {
    let size = dir_size(dir);
    if std::fs::remove_dir_all(dir).is_ok() { size } else { 0 }
}

/// Bytes of a model package's weights (its `*.safetensors` files).
fn safetensors_bytes(dir: &Path) -> Result<u64> {
    Ok(std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .sum())
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// One training run as the console and the API show it.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingRun {
    pub job: i64,
    pub state: String,
    pub stage: String,
    pub progress_done: i64,
    pub progress_total: i64,
    pub schedule: Option<i64>,
    pub recipe: Recipe,
    pub base: String,
    pub counts: Option<DataCounts>,
    /// Wall seconds of each finished phase, in order.
    pub phases: Vec<(String, f64)>,
    pub device: String,
    pub candidate: String,
    pub evaluation: Option<i64>,
    pub decision: String,
    pub created_by: String,
    pub created_at: String,
    pub updated_at: String,
    pub error: String,
}

/// Free space on the data disk against what a run needs (its weights' peak plus the space kept free).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrainingDisk {
    pub free_bytes: u64,
    pub needed_bytes: u64,
    pub reserve_bytes: u64,
}

impl TrainingDisk {
    pub fn enough(&self) -> bool {
        self.free_bytes >= self.needed_bytes
    }

    /// The line the 训练 page and `care train status` show (a refused run says the short one).
    pub fn describe(&self) -> String {
        use crate::error::gib;
        if self.enough() {
            format!(
                "磁盘：剩余 {}，一次训练约需 {}（含为检索和入库保留的 {}）",
                gib(self.free_bytes),
                gib(self.needed_bytes),
                gib(self.reserve_bytes)
            )
        } else {
            crate::error::disk_short_message(self.free_bytes, self.needed_bytes, self.reserve_bytes)
        }
    }
}

/// A run's expected wall time and the finished run it was judged from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Estimate {
    pub from_job: i64,
    pub seconds: f64,
}

impl Estimate {
    pub fn minutes(&self) -> u64 {
        (self.seconds / 60.0).ceil() as u64
    }
}

/// The newest finished run with the same `query_layers` on `device` (the same phases run), its phases' wall times
/// with Stage I scaled by the texts it sees (steps × batch) and Stage II by the groups. No guess from constants: the
/// first run on a machine has nothing to go by, and a CPU and a GPU differ by orders of magnitude.
pub fn estimate(runs: &[TrainingRun], recipe: &Recipe, device: &str) -> Option<Estimate> {
    let past = runs.iter().find(|r| {
        r.state == "done"
            && r.device == device
            && r.recipe.query_layers == recipe.query_layers
            && r.recipe.sides == recipe.sides
            && r.phases.iter().any(|(p, _)| p == "stage2")
    })?;
    let seen = |steps: u64, batch: usize| steps as f64 * batch as f64;
    let scale = |new: f64, old: f64| if old > 0.0 { new / old } else { 1.0 };
    let (p, r) = (&past.recipe, recipe);
    let seconds = past
        .phases
        .iter()
        .map(|(name, secs)| {
            secs * match name.as_str() {
                "stage1" => scale(seen(r.stage1_steps, r.batch_size), seen(p.stage1_steps, p.batch_size)),
                "stage2" => scale(seen(r.stage2_steps, r.stage2_batch_size), seen(p.stage2_steps, p.stage2_batch_size)),
                _ => 1.0,
            }
        })
        .sum();
    Some(Estimate { from_job: past.job, seconds })
}

/// `state.json` of a run directory: what finished, so a restart skips it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct RunState {
    phases: Vec<(String, f64)>,
    candidate: String,
}

impl RunState {
    fn done(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p.0 == phase)
    }
}

/// The stored parameters of a training task ([`Task::Train`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainParams {
    pub recipe: Recipe,
    /// The pair live when the run was submitted: what it starts from and is judged against.
    pub base: String,
    #[serde(default)]
    pub schedule: Option<i64>,
}

impl crate::jobs::JobParams for TrainParams {
    const KIND: &'static str = "model.train";
}

/// How often a running phase writes its progress at most, and how long a cancel waits at most to be seen.
const POLL: Duration = Duration::from_millis(500);

/// The training run queued or running, if any (runs never overlap).
pub(crate) fn unfinished_run(conn: &rusqlite::Connection) -> Result<Option<i64>> {
    Ok(conn
        .query_row("SELECT id FROM jobs WHERE kind = ?1 AND state IN ('queued', 'running') LIMIT 1", [TRAIN], |r| {
            r.get(0)
        })
        .optional()?)
}

fn run_dir(engine: &Engine, job: i64) -> PathBuf {
    engine.cfg.storage.data_dir.join("train").join(format!("run-{job}"))
}

/// Frees the weights of every run that has ended (done, failed or cancelled) and removes the work folders of
/// ended offline-embedding jobs. Called when a training or embedding job ends and before a run starts, so a
/// crash between a job's end and its clean-up is repaired by the next one. Returns the bytes freed.
pub(crate) fn prune_finished_runs(engine: &Engine) -> Result<u64> {
    let root = engine.cfg.storage.data_dir.join("train");
    let Ok(entries) = std::fs::read_dir(&root) else { return Ok(0) };
    let mut freed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let (embed, id) = match (name.strip_prefix("run-"), name.strip_prefix("embed-")) {
            (Some(id), _) => (false, id),
            (_, Some(id)) => (true, id),
            _ => continue,
        };
        let Ok(id) = id.parse::<i64>() else { continue };
        let state: Option<String> =
            engine.store.reader().query_row("SELECT state FROM jobs WHERE id = ?1", [id], |r| r.get(0)).optional()?;
        if matches!(state.as_deref(), Some("queued" | "running")) {
            continue;
        }
        if embed {
            freed += remove_dir_counted(&entry.path());
        } else {
            freed += prune_run_dir(&entry.path());
        }
    }
    if freed > 0 {
        tracing::info!(freed_bytes = freed, "freed the weights of ended training runs");
    }
    Ok(freed)
}

/// Frees the weights of run `job` (see [`prune_run_dir`]).
pub(crate) fn free_run_weights(engine: &Engine, job: i64) {
    let freed = prune_run_dir(&run_dir(engine, job));
    tracing::info!(job, freed_bytes = freed, "freed the run's weights");
}

/// The data disk's free space against what a run of `recipe` from `pair` needs at its peak (see
/// [`EXPORT_QUERY_COPIES`]) plus `[training] keep_free_gb` left for search and ingest.
fn training_disk(engine: &Engine, pair: &ActivePair, recipe: &Recipe) -> Result<TrainingDisk> {
    let wq = safetensors_bytes(&pair.query.dir)?;
    let stage1 = if recipe.stage1_steps_from(pair) > 0 { wq } else { 0 };
    let (wd, tables) = if recipe.sides == Sides::Both {
        // 4 bytes per dimension of every chunk, twice for the table's own overhead and the scan's int8 copy.
        let chunks: i64 = engine.store.reader().query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))?;
        (safetensors_bytes(&pair.document.dir)?, (chunks.max(0) as u64) * pair.document.width as u64 * 8)
    } else {
        (0, 0)
    };
    let training = stage1 + wq + wd + checkpoint_bytes(&pair.query.dir, recipe.freeze_embeddings)?;
    let export = EXPORT_QUERY_COPIES * wq + EXPORT_DOCUMENT_COPIES * wd;
    let embedding = IMPORTED_QUERY_COPIES * wq + IMPORTED_DOCUMENT_COPIES * wd + tables;
    let reserve_bytes = (engine.cfg.training.keep_free_gb.max(0.0) * f64::from(1u32 << 30)) as u64;
    let root = &engine.cfg.storage.data_dir;
    let (_, free_bytes) = crate::datadir::free_bytes(root).map_err(|e| Error::io(root, e))?;
    let peak = training.max(export).max(embedding);
    Ok(TrainingDisk { free_bytes, needed_bytes: peak.saturating_add(reserve_bytes), reserve_bytes })
}

/// Refuses a run the data disk cannot hold (see [`training_disk`]).
fn check_training_disk(engine: &Engine, pair: &ActivePair, recipe: &Recipe) -> Result<()> {
    let d = training_disk(engine, pair, recipe)?;
    if !d.enough() {
        return Err(Error::DiskFull {
            path: engine.cfg.storage.data_dir.clone(),
            needed: d.needed_bytes,
            available: d.free_bytes,
            reserve: d.reserve_bytes,
        });
    }
    Ok(())
}

/// "cuda" when a GPU is visible and the device setting allows it, else "cpu".
fn training_device(engine: &Engine) -> String {
    device_for(&engine.cfg.training).to_string()
}

/// The device runs train on under `cfg` (`training.device`: auto, cpu or cuda) on this machine: "cuda" when a GPU
/// is visible and the setting allows it, else "cpu" (`care doctor` says it, with the recipe it picks).
pub fn device_for(cfg: &TrainingConfig) -> &'static str {
    match cfg.device.as_str() {
        "cpu" => "cpu",
        _ if Path::new("/dev/nvidia0").exists() || Path::new("/dev/nvidiactl").exists() => "cuda",
        _ => "cpu",
    }
}

/// The checks a run must pass before it is queued (they read the disk and start `care-train --version`, so
/// they run before the transaction that queues it), and its parameters and device.
pub(crate) fn prepare_training(
    engine: &Engine,
    recipe: &Recipe,
    schedule: Option<i64>,
) -> Result<(TrainParams, String)> {
    recipe.check()?;
    let pair = engine
        .retrieval()
        .active_models()?
        .ok_or_else(|| Error::InvalidInput("没有在用的模型，无法训练 (no live model pair to train from)".into()))?;
    if !engine.store.collection_list()?.iter().any(|c| c.approved_for_training) {
        return Err(Error::InvalidInput(
            "没有批准用于训练的集合 (no collection is approved for training; approve one first)".into(),
        ));
    }
    let st = refresh_trainer_status(engine);
    if !st.ready {
        return Err(Error::TrainerUnavailable(st.message));
    }
    prune_finished_runs(engine)?;
    if recipe.sides == Sides::Both {
        trainable_document(&pair.document)?;
    }
    check_training_disk(engine, &pair, recipe)?;
    Ok((TrainParams { recipe: recipe.clone(), base: pair_spec(&pair), schedule }, st.device))
}

/// Runs (or resumes) training job `id` to its end. Called by the model lane (tasks/model_lane.rs).
pub(crate) fn run_training_job(
    engine: &Engine,
    id: i64,
    p: &TrainParams,
    actor: &Admin,
    token: &CancelToken,
) -> Result<serde_json::Value> {
    let base = crate::lifecycle::Lifecycle::of(engine).resolve_pair(&p.base)?;
    let dir = run_dir(engine, id);
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| Error::io(&dir, e))?;
    let mut st: RunState = read_json(&dir.join("state.json")).unwrap_or_default();
    prune_finished_runs(engine)?;
    if st.phases.is_empty() {
        // Queued a while ago: the disk may have filled since it was submitted.
        check_training_disk(engine, &base, &p.recipe)?;
    }
    let run = Run { e: engine, id, dir: &dir, token };
    let q_manifest = ModelManifest::load(&base.query.dir).map_err(|e| Error::Model(e.to_string()))?;
    let d_manifest = ModelManifest::load(&base.document.dir).map_err(|e| Error::Model(e.to_string()))?;
    for f in ["config.json", "model.safetensors"] {
        if !base.query.dir.join(f).exists() || !base.document.dir.join(f).exists() {
            return Err(Error::Model(format!(
                "在用模型缺少训练权重 {f} (the live pair {} has no {f}: training needs each package's \
                 config.json and model.safetensors)",
                p.base
            )));
        }
    }
    // The trainer fills only `{text}`: hand it each template with the package's instruction already in.
    let prompt = |m: &ModelManifest, template: &str| m.render(template, "{text}");
    let teacher_query = prompt(&d_manifest, &d_manifest.query_template);
    let (query_template, document_template) =
        (prompt(&q_manifest, &q_manifest.query_template), prompt(&d_manifest, &d_manifest.document_template));
    run.phase(&mut st, "data", "整理训练数据", |_| {
        let counts = crate::training::data::TrainingData::of(engine).assemble_training_data(
            &dir,
            Some(&base),
            &p.recipe.data,
            p.recipe.stage2_max_groups,
        )?;
        engine.store.conn().execute(
            "UPDATE training_runs SET counts = ?2 WHERE job_id = ?1",
            params![id, serde_json::to_string(&counts).unwrap_or_default()],
        )?;
        Ok(())
    })?;
    let init = match p.recipe.query_layers {
        Some(k) => {
            let out = dir.join("query-init");
            run.phase(&mut st, "init", "裁剪查询编码器", |r| {
                r.trainer(Phase::Prune(PruneSpec {
                    from: base.query.dir.clone(),
                    layers: i64::from(k),
                    // Spread from the first layer to the last: it aligns several times faster in Stage I
                    // than the first k (docs/experiments/2026-11-25-retraining-mining-and-pruning.md).
                    pick: LayerPick::Spread,
                    out: out.clone(),
                }))
            })?;
            out
        }
        None => base.query.dir.clone(),
    };
    // What the recipe sets; every other hyper-parameter is the trainer's one default (care_formats).
    let hyper = |steps: u64, batch_size: usize, lr: f64| Hyper {
        steps,
        batch_size,
        lr,
        seed: p.recipe.data.seed,
        checkpoint_every: p.recipe.checkpoint_every,
        resume: true,
        freeze_embeddings: p.recipe.freeze_embeddings,
        query_template: query_template.clone(),
        document_template: document_template.clone(),
        ..Hyper::default()
    };
    // The frozen teacher's vectors of the approved passages are the served ones (written by the data phase).
    let served = || {
        dir.join(data::SERVED_VECTORS)
            .exists()
            .then(|| ServedVectors { vectors: dir.join(data::SERVED_VECTORS), corpus: dir.join("corpus.jsonl") })
    };
    let s1 = dir.join("stage1");
    let s1_steps = p.recipe.stage1_steps_from(&base);
    // Stage I can be skipped (0 steps): Stage II then starts from the initial query encoder.
    let s1_query = if s1_steps == 0 { init.clone() } else { s1.join("query") };
    run.phase(&mut st, "stage1", "Stage I 训练", |r| {
        if s1_steps == 0 {
            return Ok(());
        }
        r.trainer(Phase::Stage1(Stage1Spec {
            query: init.clone(),
            document: base.document.dir.clone(),
            corpus: dir.join("corpus.jsonl"),
            out: s1.clone(),
            served: served(),
            options: Stage1Options {
                max_texts: p.recipe.stage1_max_texts,
                max_chars: p.recipe.stage1_max_chars,
                mse_weight: p.recipe.mse_weight,
                // The teacher reads past search queries with its own query prompt, not the student's.
                teacher_query_template: Some(teacher_query.clone()),
                ..Stage1Options::default()
            },
            hyper: hyper(p.recipe.stage1_steps, p.recipe.batch_size, p.recipe.stage1_lr),
        }))
    })?;
    let s2 = dir.join("stage2");
    let stage2_steps = capped_steps(&p.recipe, &dir.join("stage2.jsonl"));
    run.phase(&mut st, "stage2", "Stage II 训练", |r| {
        r.trainer(Phase::Stage2(Stage2Spec {
            query: s1_query.clone(),
            document: base.document.dir.clone(),
            train: vec![dir.join("stage2.jsonl")],
            out: s2.clone(),
            served: served(),
            options: Stage2Options {
                // Query-only keeps the served vectors valid; both trains LoRA adapters on the document encoder
                // (CARE's r = 32, α = 64), which re-embeds every collection before the gate.
                freeze_document: p.recipe.sides == Sides::QueryOnly,
                lora: Lora {
                    rank: p.recipe.lora_rank,
                    alpha: p.recipe.lora_alpha,
                    targets: p.recipe.lora_targets.clone(),
                },
                group_size: p.recipe.data.negatives + 1,
                max_examples: Some(p.recipe.stage2_max_groups),
                batch_by_source: p.recipe.stage2_batch_by_source,
                ..Stage2Options::default()
            },
            hyper: Hyper {
                sub_batch: p.recipe.stage2_sub_batch,
                ..hyper(stage2_steps, p.recipe.stage2_batch_size, p.recipe.lr)
            },
        }))
    })?;
    store_loss_chart(engine, id, &[&s1, &s2])?;
    // WiSE-FT: the trained encoder averaged with its starting point (the recipe's choice; 1 skips it).
    let merge = p.recipe.merge_ratio < 1.0;
    let both = p.recipe.sides == Sides::Both;
    let trained = if merge { dir.join("merged") } else { s2.join("query") };
    // Both sides are averaged with their starting points by the same ratio, so they move together.
    let trained_document = if merge { dir.join("merged-document") } else { s2.join("document") };
    run.phase(&mut st, "merge", "合并权重", |r| {
        if !merge {
            return Ok(());
        }
        r.trainer(Phase::Merge(MergeSpec {
            tuned: s2.join("query"),
            base: s1_query.clone(),
            ratio: p.recipe.merge_ratio,
            out: trained.clone(),
        }))?;
        if both {
            r.trainer(Phase::Merge(MergeSpec {
                tuned: s2.join("document"),
                base: base.document.dir.clone(),
                ratio: p.recipe.merge_ratio,
                out: trained_document.clone(),
            }))?;
        }
        Ok(())
    })?;
    let export = dir.join("export");
    let name = format!("{}-r{id}", base.query.name);
    // Both sides: a new document model, and with it a new pairing (its vectors are no longer the live one's).
    let doc_export = dir.join("export-document");
    // A symmetric pair (one model for both roles) becomes two: the document side's package gets its own name.
    let doc_name = if base.document.name == base.query.name {
        format!("{}-r{id}-doc", base.document.name)
    } else {
        format!("{}-r{id}", base.document.name)
    };
    let pairing_id =
        if both { format!("{}-r{id}", base.document.pairing_id) } else { base.document.pairing_id.clone() };
    // One package of the new pair: `from`'s weights as `name`, in a fresh `out`.
    let export_one = |r: &Run<'_>, from: &Path, out: &Path, name: &str, role| {
        let _ = std::fs::remove_dir_all(out);
        r.trainer(Phase::Export(ExportSpec {
            query: from.to_path_buf(),
            out: out.to_path_buf(),
            pairing_id: pairing_id.clone(),
            options: ExportOptions {
                name: name.to_string(),
                query_template: query_template.clone(),
                document_template: document_template.clone(),
                role,
                ..ExportOptions::default()
            },
        }))
    };
    run.phase(&mut st, "export", "导出 ONNX", |r| {
        export_one(r, &trained, &export, &name, ModelRole::Query)?;
        if both {
            export_one(r, &trained_document, &doc_export, &doc_name, ModelRole::Document)?;
        }
        Ok(())
    })?;
    if !st.done("import") {
        let version = ExportOptions::default().version;
        let document = if both {
            format!("{doc_name}@{version}")
        } else {
            format!("{}@{}", base.document.name, base.document.version)
        };
        // A crash between an import's commit and this marker: that package is registered already.
        if both && models::find(&engine.store, &document).is_err() {
            engine.models().import_by(actor, &doc_export, Transfer::Link)?;
        }
        let spec = format!("{name}@{version},{document}");
        if crate::lifecycle::Lifecycle::of(engine).resolve_pair(&spec).is_err() {
            engine.models().import_by(actor, &export, Transfer::Link)?;
        }
        st.candidate = spec;
    }
    run.phase(&mut st, "import", "导入候选模型", |_| Ok(()))?;
    let candidate = st.candidate.clone();
    engine.store.conn().execute("UPDATE training_runs SET candidate = ?2 WHERE job_id = ?1", params![id, candidate])?;
    // Blue/green: every collection embedded into the candidate document model's own tables while the live pair
    // serves (resumable: what was written stays; cancel stops at the next batch). The gate then judges the
    // candidate on its own vectors; promotion switches in one transaction.
    if both {
        run.phase(&mut st, "embed", "重新生成文档向量", |r| {
            let cand = crate::lifecycle::Lifecycle::of(engine).resolve_pair(&candidate)?;
            engine.retrieval().prepare_document_model(&cand.document, &mut r.dense_progress())
        })?;
    }
    let mut report = None;
    run.phase(&mut st, "evaluate", "评测候选模型", |r| {
        let rep = engine.models().evaluate(actor, &candidate, &mut r.dense_progress())?;
        engine.store.conn().execute(
            "UPDATE training_runs SET evaluation_id = ?2, decision = ?3 WHERE job_id = ?1",
            params![id, rep.id, if rep.passed { "passed" } else { "gated_out" }],
        )?;
        report = Some((rep.id, rep.passed));
        Ok(())
    })?;
    let (eval_id, passed): (Option<i64>, bool) = match report {
        Some((e, p)) => (Some(e), p),
        None => engine.store.reader().query_row(
            "SELECT evaluation_id, decision = 'passed' OR decision = 'promoted' FROM training_runs WHERE job_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?,
    };
    let decision = if passed && p.recipe.promote {
        let live = engine.retrieval().active_models()?.map(|a| pair_spec(&a));
        if live.as_deref() != Some(candidate.as_str()) {
            run.phase(&mut st, "promote", "上线候选模型", |r| {
                engine.models().promote(actor, &candidate, None, &mut r.dense_progress()).map(|_| ())
            })?;
        }
        "promoted"
    } else if passed {
        "passed"
    } else {
        "gated_out"
    };
    engine.store.conn().execute("UPDATE training_runs SET decision = ?2 WHERE job_id = ?1", params![id, decision])?;
    Ok(serde_json::json!({"candidate": candidate, "evaluation": eval_id, "decision": decision}))
}

fn store_loss_chart(engine: &Engine, id: i64, dirs: &[&Path]) -> Result<()> {
    let mut svg = String::new();
    for d in dirs {
        if let Ok(s) = std::fs::read_to_string(d.join("loss.svg")) {
            svg.push_str(&s);
        }
    }
    engine.store.conn().execute("UPDATE training_runs SET loss_svg = ?2 WHERE job_id = ?1", params![id, svg])?;
    Ok(())
}

/// Queues training run `p` inside the caller's transaction with its runs row and its audit record (a schedule
/// firing adds its own update to the same transaction). Refused when a run is queued or running.
pub(crate) fn insert_training(
    tx: &rusqlite::Transaction<'_>,
    actor: &Actor,
    p: &TrainParams,
    device: &str,
) -> Result<i64> {
    if let Some(id) = unfinished_run(tx)? {
        return Err(Error::Busy(format!(
            "训练任务 #{id} 尚未结束，同一时间只运行一个训练 (training job {id} is still queued or running; runs \
             never overlap: wait for it or cancel it on the 任务 page)"
        )));
    }
    let id = crate::jobs::insert_job(tx, p, actor)?;
    tx.execute(
        "INSERT INTO training_runs (job_id, schedule_id, device) VALUES (?1, ?2, ?3)",
        params![id, p.schedule, device],
    )?;
    crate::audit::append(
        tx,
        &actor.name,
        "training.submit",
        &serde_json::json!({"job": id, "base": p.base, "schedule": p.schedule, "recipe": p.recipe}),
    )?;
    Ok(id)
}

/// One running job: its directory, its cancel token and progress reporting.
struct Run<'a> {
    e: &'a Engine,
    id: i64,
    dir: &'a Path,
    token: &'a CancelToken,
}

impl Run<'_> {
    /// Runs `f` unless `name` finished before; records its wall time in `state.json` and the runs table.
    fn phase(&self, st: &mut RunState, name: &str, label: &str, f: impl FnOnce(&Run<'_>) -> Result<()>) -> Result<()> {
        if st.done(name) {
            return Ok(());
        }
        self.progress(label, 0, 0)?;
        let t = Instant::now();
        f(self)?;
        st.phases.push((name.to_string(), t.elapsed().as_secs_f64()));
        write_json(&self.dir.join("state.json"), st)?;
        self.e.store.conn().execute(
            "UPDATE training_runs SET phases = ?2 WHERE job_id = ?1",
            params![self.id, serde_json::to_string(&st.phases).unwrap_or_default()],
        )?;
        let freed_bytes = prune_behind(self.dir, name);
        tracing::info!(
            job = self.id,
            phase = name,
            seconds = t.elapsed().as_secs_f64(),
            freed_bytes,
            "training phase done"
        );
        Ok(())
    }

    /// Writes the job's stage and progress; fails with `Cancelled` when the task's token is raised.
    fn progress(&self, stage: &str, done: u64, total: u64) -> Result<()> {
        self.e.queue().job_progress(self.id, stage, done, total)?;
        self.token.check()
    }

    fn dense_progress(&self) -> impl FnMut(DenseProgress) -> Result<()> + '_ {
        self.e.queue().dense_progress(self.id, self.token)
    }

    /// Runs `phase` as `care-train run --spec FILE` to its end, its step events shown as the job's progress (step,
    /// loss, time left). Cancel or shutdown kills the child (see [`child::TrainerChild`]): its checkpoints stay for
    /// the resumed run.
    fn trainer(&self, phase: Phase) -> Result<()> {
        let cfg = &self.e.cfg.training;
        let stage = phase.stage();
        let name = stage.command();
        let label = match stage {
            Stage::Stage1 => "Stage I 训练",
            Stage::Stage2 => "Stage II 训练",
            Stage::Prune => "裁剪查询编码器",
            Stage::EmbedCorpus => "嵌入文档 (care-train embed-corpus)",
            Stage::Merge => "合并权重",
            Stage::Export => "导出 ONNX",
        };
        let specs = self.dir.join("specs");
        std::fs::create_dir_all(&specs).map_err(|e| Error::io(&specs, e))?;
        let spec_file = specs.join(format!("{name}.json"));
        let spec = TrainSpec::new(phase, &cfg.device, cfg.threads);
        std::fs::write(&spec_file, spec.to_json()).map_err(|e| Error::io(&spec_file, e))?;
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(|e| Error::io(&log, e))?;
        let mut stray = file.try_clone().map_err(|e| Error::io(&log, e))?;
        let mut cmd = Command::new(&cfg.trainer);
        cmd.arg("run").arg("--spec").arg(&spec_file);
        // The trainer ties its life to ours (PR_SET_PDEATHSIG), so a killed server leaves no orphan in the run folder.
        cmd.env("CARE_TRAIN_PARENT", std::process::id().to_string());
        cmd.stdin(Stdio::null()).stderr(file);
        let child = child::TrainerChild::spawn(cmd)
            .map_err(|e| Error::TrainerUnavailable(format!("无法启动训练程序 {} ({e})", cfg.trainer.display())))?;
        tracing::info!(job = self.id, stage = name, pid = child.id(), spec = %spec_file.display(), "started care-train");
        let steps = spec.phase.steps() > 0;
        let mut progress = child::StepProgress::new(spec.phase.steps());
        let show = |p: &child::StepProgress| if steps { p.text(label) } else { label.to_string() };
        self.progress(&show(&progress), 0, progress.total)?;
        // Step events can come many times a second: the job's row is written at most every POLL, and at the last step.
        let (mut shown, mut dirty) = (Instant::now(), false);
        let ended = child::follow(
            child,
            self.token,
            POLL,
            |e| {
                dirty |= e.is_some_and(|e| steps && progress.apply(e));
                if dirty && (shown.elapsed() >= POLL || progress.step == progress.total) {
                    self.progress(&show(&progress), progress.step, progress.total)?;
                    (shown, dirty) = (Instant::now(), false);
                }
                Ok(())
            },
            |line| {
                use std::io::Write;
                let _ = writeln!(stray, "[stdout] {line}");
            },
        )?;
        match ended.last {
            Some(Event::Done { .. }) if ended.status.success() => Ok(()),
            Some(Event::Failed { code: code @ (FailCode::Device | FailCode::Spec), message }) => {
                Err(Error::TrainerUnavailable(format!(
                    "训练程序无法运行 care-train {name} ({code:?}): {message}; 日志 {}",
                    log.display()
                )))
            }
            Some(Event::Failed { code, message }) => {
                Err(Error::Model(format!("care-train {name} 失败 ({code:?}): {message}; 日志 {}", log.display())))
            }
            // Killed, crashed, or a trainer that does not speak this contract: its log says why.
            Some(Event::Started { .. } | Event::Step { .. } | Event::Checkpoint { .. } | Event::Done { .. }) | None => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
                Err(Error::Model(format!(
                    "care-train {name} 失败 ({}); 日志 {}:\n{}",
                    ended.status,
                    log.display(),
                    tail.join("\n")
                )))
            }
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Option<T> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// Writes through a temporary file + rename, so a crash never leaves half a state file.
fn write_json<T: Serialize>(p: &Path, v: &T) -> Result<()> {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(v).map_err(|e| Error::Internal(e.to_string()))?)
        .map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, p).map_err(|e| Error::io(p, e))
}

const RUN_COLS: &str = "j.id, j.state, j.stage, j.progress_done, j.progress_total, r.schedule_id, j.params, r.counts,
    r.phases, r.device, r.candidate, r.evaluation_id, r.decision, j.actor, j.created_at, j.updated_at, j.errors";

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TrainingRun> {
    let params: String = r.get(6)?;
    let p: Option<TrainParams> = serde_json::from_str(&params).ok();
    let counts: String = r.get(7)?;
    let phases: String = r.get(8)?;
    let errors: String = r.get(16)?;
    let error = serde_json::from_str::<Vec<crate::jobs::FileError>>(&errors)
        .ok()
        .and_then(|e| e.into_iter().next())
        .map(|e| e.message)
        .unwrap_or_default();
    Ok(TrainingRun {
        job: r.get(0)?,
        state: r.get(1)?,
        stage: {
            let state = crate::jobs::JobState::parse(&r.get::<_, String>(1)?).unwrap_or(crate::jobs::JobState::Failed);
            crate::jobs::stage_text(TRAIN, state, &r.get::<_, String>(2)?)
        },
        progress_done: r.get(3)?,
        progress_total: r.get(4)?,
        schedule: r.get(5)?,
        recipe: p.as_ref().map(|p| p.recipe.clone()).unwrap_or_default(),
        base: p.map(|p| p.base).unwrap_or_default(),
        counts: serde_json::from_str(&counts).ok(),
        phases: serde_json::from_str(&phases).unwrap_or_default(),
        device: r.get(9)?,
        candidate: r.get(10)?,
        evaluation: r.get(11)?,
        decision: r.get(12)?,
        created_by: r.get(13)?,
        created_at: r.get(14)?,
        updated_at: r.get(15)?,
        error,
    })
}

/// Whether training can start here, and on which device, without waiting: the newest answer of a check
/// ([`crate::trainer`]), started in the background when there is none or it is older than ten minutes.
pub fn trainer_status(engine: &Engine) -> TrainerStatus {
    engine.trainer_check.latest(&engine.cfg.training.trainer, training_device(engine))
}

/// Checks the trainer now and waits for the answer (at most 30 s), which pages then show too: for submitting
/// work to the trainer and for `care train status`.
pub fn refresh_trainer_status(engine: &Engine) -> TrainerStatus {
    engine.trainer_check.refresh(&engine.cfg.training.trainer, training_device(engine))
}

impl crate::engine::Training<'_> {
    /// Said before an admin starts a run (the 训练 page, `care train status`): whether the data disk holds a run
    /// from the live pair. None when no pair is live.
    pub fn disk(&self, _admin: &Admin, sides: Sides) -> Result<Option<TrainingDisk>> {
        let recipe = Recipe { sides, ..self.default_recipe() };
        self.engine.retrieval().active_models()?.map(|p| training_disk(self.engine, &p, &recipe)).transpose()
    }

    /// The recipe a run takes here when the admin changes nothing ([`Recipe::for_device`] of this machine's
    /// training device): the 训练 page's form, `care train run` without settings, the API's `default_recipe`.
    pub fn default_recipe(&self) -> Recipe {
        Recipe::for_device(&training_device(self.engine))
    }

    /// How long `recipe` should take here, judged from the newest finished run of its shape on this device.
    pub fn estimate(&self, actor: &Admin, recipe: &Recipe) -> Result<Option<Estimate>> {
        Ok(estimate(&self.engine.training().runs(actor, 100)?, recipe, &training_device(self.engine)))
    }

    /// Queues a training run from the live pair. Refused at once when the trainer cannot run, nothing is approved
    /// for training, or another run is queued or running (runs never overlap).
    pub fn submit(&self, actor: &Admin, recipe: &Recipe, schedule: Option<i64>) -> Result<i64> {
        let (p, device) = prepare_training(self.engine, recipe, schedule)?;
        let id = {
            let mut conn = self.engine.store.conn();
            let tx = conn.transaction()?;
            let id = insert_training(&tx, actor, &p, &device)?;
            tx.commit()?;
            id
        };
        self.engine.queue().tasks_changed();
        Ok(id)
    }
    /// The newest training runs, newest first.
    pub fn runs(&self, _admin: &Admin, limit: usize) -> Result<Vec<TrainingRun>> {
        let conn = self.engine.store.reader();
        let mut stmt = conn.prepare(&format!(
            "SELECT {RUN_COLS} FROM jobs j JOIN training_runs r ON r.job_id = j.id ORDER BY j.id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit.min(1000) as i64], run_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn run(&self, _admin: &Admin, job: i64) -> Result<TrainingRun> {
        self.engine
            .store
            .reader()
            .query_row(
                &format!("SELECT {RUN_COLS} FROM jobs j JOIN training_runs r ON r.job_id = j.id WHERE j.id = ?1"),
                [job],
                run_row,
            )
            .optional()?
            .ok_or_else(|| Error::NotFound { what: format!("训练任务 #{job}") })
    }

    /// The run's loss charts (Stage I and Stage II, SVG), once its training phases ended.
    pub fn loss_svg(&self, _admin: &Admin, job: i64) -> Result<String> {
        self.engine
            .store
            .reader()
            .query_row("SELECT loss_svg FROM training_runs WHERE job_id = ?1", [job], |r| r.get(0))
            .optional()?
            .ok_or_else(|| Error::NotFound { what: format!("训练任务 #{job}") })
    }
}

#[cfg(test)]
mod tests;
