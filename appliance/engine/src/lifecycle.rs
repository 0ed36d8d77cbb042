//! Model lifecycle: a package from anywhere (`care-train export`, a vendor, another appliance) becomes a registered
//! model only after it verifies, and is copied under `<data_dir>/models/<name>/<version>/` first so that the
//! registry never names files that are not there.
//!
//! Import checks, in order: the manifest (format, names, role, pooling against architecture, width, templates,
//! pairing id, plain file names), every listed file's sha256, that a model which must encode online has its ONNX
//! graph and tokenizer, that the graph loads and produces vectors of the declared width, and, when the package
//! carries `parity.json` (the trainer's own vectors of sample texts), that ONNX Runtime here reproduces them at
//! cosine ≥ [`PARITY_MIN_COSINE`] (an int8 graph beside it: [`graph::INT8_PARITY_MIN_COSINE`]). A package failing
//! any check changes nothing: no folder, no row, no audit record of an import.
//!
//! Evaluation scores a candidate pair against the live one on the held-out judgments; a candidate whose package
//! also carries an int8 query graph is timed and scored in both graphs, and the faster one within
//! `int8_max_loss` of the fp32 graph's nDCG@10 is the one judged by the gate and served once promoted.

use std::path::{Path, PathBuf};

use care_formats::{Graph, ModelManifest, ModelRole, Pooling};
use serde::{Deserialize, Serialize};

use crate::accounts::{Actor, Admin};
use crate::encoders::TextKind;
use crate::error::{Error, Result};
use crate::hybrid::DenseProgress;
use crate::models::{self, ActivePair, ModelRecord};
use rusqlite::OptionalExtension;

pub mod graph;

/// How close ONNX Runtime's vectors must come to the trainer's `parity.json` (the bar; fp32 exports
/// measure ≥ 0.9999).
pub const PARITY_MIN_COSINE: f64 = 0.999;
pub const PARITY_FILE: &str = "parity.json";
const ONNX_FILE: &str = "model.onnx";
const TOKENIZER_FILE: &str = "tokenizer.json";
/// Bounds on what a package may declare, so a hostile manifest cannot ask for absurd allocations.
const MAX_WIDTH: usize = 16_384;
const MAX_LENGTH: usize = 32_768;
const MAX_PARITY_TEXTS: usize = 1_000;
const MAX_PARITY_BYTES: u64 = 64 << 20;

/// The trainer's vectors of sample texts, written beside the package by `care-train export`.

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportReport {
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub model: ModelRecord,
    /// Whether the appliance can encode with it (an ONNX graph); an offline document model only has imported vectors.
    pub online: bool,
    pub parity_texts: usize,
    /// Lowest cosine between ONNX Runtime's and the trainer's vectors (None: the package has no parity.json).
    pub parity_min_cosine: Option<f64>,
}

fn invalid(path: &Path, message: impl Into<String>) -> Error {
    Error::InvalidPackage { path: path.to_path_buf(), message: message.into() }
}

fn manifest_err(src: &Path, e: care_formats::manifest::ManifestError) -> Error {
    use care_formats::manifest::ManifestError;
    if let ManifestError::TooNew { found, .. } = e {
        return Error::TooNew {
            what: format!("model package {}", src.display()),
            found,
            supported: care_formats::manifest::MANIFEST_FORMAT,
        };
    }
    invalid(src, e.to_string())
}

/// A name or version usable as one path component and in `name@version` specs.
fn check_component(src: &Path, what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            src,
            format!("{what} {s:?} must be 1–64 characters of a–z, A–Z, 0–9, '.', '_', '-', not starting with '.'"),
        ))
    }
}

/// What the manifest itself must satisfy beyond its own parse-time checks.
pub fn check_manifest(src: &Path, m: &ModelManifest) -> Result<()> {
    check_component(src, "name", &m.name)?;
    check_component(src, "version", &m.version)?;
    if m.hidden > MAX_WIDTH || m.max_length > MAX_LENGTH {
        return Err(invalid(
            src,
            format!(
                "hidden {} or max_length {} is beyond this appliance's bounds ({MAX_WIDTH}, {MAX_LENGTH})",
                m.hidden, m.max_length
            ),
        ));
    }
    let decoder = matches!(m.architecture.as_str(), "qwen3" | "qwen2" | "llama" | "mistral");
    let encoder = matches!(m.architecture.as_str(), "bert" | "xlm-roberta");
    match (decoder, encoder, m.pooling) {
        (true, _, Pooling::LastToken) | (_, true, Pooling::Cls | Pooling::Mean) => {}
        (false, false, _) => {
            return Err(invalid(
                src,
                format!(
                    "architecture {:?} is not one this appliance serves (bert, xlm-roberta, qwen3, qwen2, llama, mistral)",
                    m.architecture
                ),
            ));
        }
        (_, _, p) => {
            return Err(invalid(
                src,
                format!(
                    "pooling {p:?} does not fit architecture {:?} (decoders pool the last token; BERT-style encoders pool CLS or the mean)",
                    m.architecture
                ),
            ));
        }
    }
    for f in m.files.keys() {
        let plain = !f.is_empty()
            && !f.starts_with('.')
            && !f.contains(['/', '\\'])
            && f != care_formats::manifest::MANIFEST_FILE;
        if !plain {
            return Err(invalid(src, format!("file name {f:?} in the manifest is not a plain file name")));
        }
    }
    let online = m.files.contains_key(ONNX_FILE);
    if online && !m.files.contains_key(TOKENIZER_FILE) {
        return Err(invalid(
            src,
            format!("{ONNX_FILE} is listed but {TOKENIZER_FILE} is not; the graph cannot be fed"),
        ));
    }
    if !online && m.role.encodes_queries() {
        return Err(invalid(
            src,
            format!("a {} model must carry {ONNX_FILE}: queries are encoded online", role_name(m.role)),
        ));
    }
    Ok(())
}

fn role_name(r: ModelRole) -> &'static str {
    match r {
        ModelRole::Query => "query",
        ModelRole::Document => "document",
        ModelRole::Both => "query-and-document",
    }
}

/// A per-process counter, so concurrent imports stage in different folders.
fn next_staging() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// How an import brings a package's files under `models/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// Copies: the source is the admin's (an upload, a folder named on the command line) and may change later.
    Copy,
    /// Hard links (a copy where the file system refuses one): the source is a training run's own export, which
    /// nothing writes again and the run frees after the import; a copy would hold the candidate twice meanwhile.
    Link,
}

fn copy_package(src: &Path, dst: &Path, m: &ModelManifest, how: Transfer) -> Result<()> {
    std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, e))?;
    let extra = [care_formats::manifest::MANIFEST_FILE, PARITY_FILE];
    for f in m.files.keys().map(String::as_str).chain(extra) {
        let from = src.join(f);
        let md = std::fs::symlink_metadata(&from);
        if f == PARITY_FILE && md.is_err() {
            continue;
        }
        // Links are never followed: a package naming /etc/passwd as its weights must not copy it into models/.
        if md.as_ref().is_ok_and(|m| !m.file_type().is_file()) {
            return Err(invalid(
                src,
                format!("{f} 不是普通文件（不跟随符号链接）；请复制文件本身 (not a regular file)"),
            ));
        }
        if how == Transfer::Link && std::fs::hard_link(&from, dst.join(f)).is_ok() {
            continue;
        }
        std::fs::copy(&from, dst.join(f)).map_err(|e| Error::io(&from, e))?;
    }
    Ok(())
}

/// Every listed `*.safetensors` file of the staged copy has a header consistent with the file (offsets inside
/// the data section, spans matching dtype × shape, no overlaps): nothing that reads the weights later (the trainer,
/// `transformers`) is handed a file whose header lies.
fn check_safetensors(staged: &Path, src: &Path, m: &ModelManifest) -> Result<()> {
    for f in m.files.keys().filter(|f| f.ends_with(".safetensors")) {
        care_modelio::safetensors::validate(&staged.join(f))
            .map_err(|e| invalid(src, format!("{f} 的头部与文件不符：{e}")))?;
    }
    Ok(())
}

/// The lock held while one `name@version` is imported, by any process: an exclusive lock on
/// `models/.locks/<name>@<version>.lock` (released when dropped, or by the kernel when the process dies). Two
/// imports of one name and version used to race: both passed the registry check, and the loser's clean-up removed
/// the winner's folder.
fn import_lock(dir: &Path, spec: &str) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let p = dir.join(format!("{spec}.lock"));
    let f =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(|e| Error::io(&p, e))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Busy(format!(
            "模型 {spec} 正在由另一个导入处理；请等它结束后查看模型列表，勿重复导入 (another import of {spec} is running)"
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&p, e)),
    }
}

/// Candidate pairs: registering, evaluating against the live pair on held-out judgments, the gate's verdict.
#[derive(Clone, Copy)]
pub struct Lifecycle<'e> {
    pub(crate) cfg: &'e crate::config::EngineConfig,
    pub(crate) retrieval: crate::hybrid::Retrieval<'e>,
    pub(crate) searcher: crate::search::Searcher<'e>,
}

impl Lifecycle<'_> {
    /// The part, borrowed from the engine's.
    pub fn of(e: &crate::Engine) -> Lifecycle<'_> {
        Lifecycle { cfg: &e.cfg, retrieval: e.retrieval(), searcher: e.searcher() }
    }

    fn stage_and_register(
        &self,
        actor: &Actor,
        src: &Path,
        m: &ModelManifest,
        (staged, how): (&Path, Transfer),
        final_dir: &PathBuf,
    ) -> Result<ImportReport> {
        copy_package(src, staged, m, how)?;
        // Hash the copy too: the source may change while it is read, and the copy is what will be served.
        m.verify_files(staged).map_err(|e| manifest_err(src, e))?;
        check_safetensors(staged, src, m)?;
        let online = m.files.contains_key(ONNX_FILE);
        let (parity_texts, parity_min_cosine) =
            if online { graph::check(staged, src, m, &self.cfg.model)? } else { (0, None) };
        std::fs::create_dir_all(final_dir.parent().unwrap_or(final_dir)).map_err(|e| Error::io(final_dir, e))?;
        std::fs::rename(staged, final_dir).map_err(|e| Error::io(final_dir, e))?;
        let detail = serde_json::json!({
            "model": format!("{}@{}", m.name, m.version), "role": role_name(m.role), "pairing_id": m.pairing_id,
            "width": m.width, "online": online, "source": src.display().to_string(),
            "parity_texts": parity_texts, "parity_min_cosine": parity_min_cosine,
        });
        match models::register_audited(&self.retrieval.store, final_dir, m, &actor.name, &detail) {
            Ok(model) => Ok(ImportReport { model, online, parity_texts, parity_min_cosine }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(final_dir);
                Err(e)
            }
        }
    }
}

// -- evaluation, the gate, promotion and rollback ---------------------------------------------------------------

/// A metric of the live and the candidate pair over the same queries, with paired-bootstrap 95 % intervals.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Compared {
    pub live: f64,
    #[serde(default)]
    pub live_lo: f64,
    #[serde(default)]
    pub live_hi: f64,
    pub candidate: f64,
    pub candidate_lo: f64,
    pub candidate_hi: f64,
    /// candidate − live, and its interval.
    pub gain: f64,
    pub gain_lo: f64,
    pub gain_hi: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionEvaluation {
    pub collection: String,
    pub eval_queries: usize,
    pub train_queries: usize,
    /// Dense weight of weighted fusion fitted on the training part, per pair.
    pub live_dense_weight: f32,
    pub candidate_dense_weight: f32,
    pub ndcg_at_10: Compared,
    pub mrr_at_10: Compared,
    pub recall_at_100: Compared,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EncodeLatency {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// One graph of the candidate's query encoder, timed and scored over every evaluation query.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphVariant {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub graph: Graph,
    pub ndcg_at_10: f64,
    pub encode: EncodeLatency,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EvaluationReport {
    pub id: i64,
    pub candidate: String,
    pub live: String,
    pub created_at: String,
    pub created_by: String,
    pub collections: Vec<CollectionEvaluation>,
    /// Over every evaluation query of every collection.
    pub overall_ndcg_at_10: Compared,
    pub live_encode: EncodeLatency,
    pub candidate_encode: EncodeLatency,
    /// The candidate's query graphs side by side: fp32, and int8 when its package carries one (empty in reports
    /// from before graphs were compared).
    #[serde(default)]
    pub graphs: Vec<GraphVariant>,
    /// The graph the candidate's figures above are of: the one the gate judged and a promotion serves.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub candidate_graph: Graph,
    #[serde(default)]
    pub int8_max_loss: f64,
    pub gate_margin: f64,
    pub max_latency_ratio: f64,
    pub bootstrap_samples: usize,
    pub passed: bool,
    /// Why the gate decided as it did (Chinese for the console, with the figures).
    pub reasons: Vec<String>,
    /// Set when an admin rejected the candidate after this evaluation: who, when and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Rejection>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rejection {
    pub by: String,
    pub at: String,
    pub reason: String,
}

impl EvaluationReport {
    /// "nDCG@10 gain +0.0123 [+0.0040, +0.0210]" over every evaluation query.
    pub fn ndcg_gain(&self) -> String {
        let g = &self.overall_ndcg_at_10;
        format!("nDCG@10 gain {:+.4} [{:+.4}, {:+.4}]", g.gain, g.gain_lo, g.gain_hi)
    }

    pub fn verdict(&self) -> &'static str {
        if self.passed { "passed" } else { "gated out" }
    }
}

/// Parses `Q@v,D@v` (or one `M@v` that encodes both sides).
fn parse_pair(spec: &str) -> Result<(String, String)> {
    let parts: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    match parts.as_slice() {
        [q, d] => Ok((q.to_string(), d.to_string())),
        [both] => Ok((both.to_string(), both.to_string())),
        _ => Err(Error::InvalidInput(format!(
            "模型组合格式应为 查询模型@版本,文档模型@版本 (expected QUERY@VERSION,DOCUMENT@VERSION, got {spec:?})"
        ))),
    }
}

fn spec(m: &ModelRecord) -> String {
    format!("{}@{}", m.name, m.version)
}

pub(crate) fn pair_spec(p: &ActivePair) -> String {
    format!("{},{}", spec(&p.query), spec(&p.document))
}

/// The gate: the candidate passes when the lower bound of its nDCG@10 gain beats the margin, no collection loses
/// more than `max_collection_loss` of nDCG@10, and its query-encode p99 stays within `max_latency_ratio` of the live
/// pair's. Returns the verdict and its reasons, in Chinese for the console, with the figures.
fn gate(
    overall: &Compared,
    collections: &[(String, f64)],
    (live, cand): (&EncodeLatency, &EncodeLatency),
    lc: &crate::config::LifecycleConfig,
) -> (bool, Vec<String>) {
    let quality_ok = overall.gain_lo > lc.gate_margin;
    let worst = collections.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    let collections_ok = worst.is_none_or(|w| w.1 >= -lc.max_collection_loss);
    let budget = live.p99_ms * lc.max_latency_ratio;
    let latency_ok = cand.p99_ms <= budget;
    let reasons = vec![
        format!(
            "nDCG@10 提升 {:+.4}，95% 区间下限 {:+.4} {} 门槛 {:+.4}",
            overall.gain,
            overall.gain_lo,
            if quality_ok { "高于" } else { "未高于" },
            lc.gate_margin
        ),
        match worst {
            Some((name, g)) => format!(
                "变化最差的资料库 {name}：nDCG@10 {g:+.4}，{} 允许的最大退步 {:.4}",
                if collections_ok { "未超过" } else { "超过" },
                lc.max_collection_loss
            ),
            None => "没有可评测的资料库".into(),
        },
        format!(
            "查询编码 p99 {:.2} ms，在用模型 {:.2} ms，上限 {:.2} ms（{}）",
            cand.p99_ms,
            live.p99_ms,
            budget,
            if latency_ok { "满足" } else { "超出" }
        ),
    ];
    (quality_ok && collections_ok && latency_ok, reasons)
}

/// The graph the candidate is judged and served with: int8 when it encodes faster (p50) and its nDCG@10 is at
/// most `max_loss` below the fp32 graph's; with the reason, in Chinese, with the figures.
pub(crate) fn choose_graph(graphs: &[GraphVariant], max_loss: f64) -> (Graph, Option<String>) {
    let find = |g: Graph| graphs.iter().find(|v| v.graph == g);
    let (Some(fp32), Some(int8)) = (find(Graph::Fp32), find(Graph::Int8)) else { return (Graph::Fp32, None) };
    let faster = int8.encode.p50_ms < fp32.encode.p50_ms;
    let close = int8.ndcg_at_10 >= fp32.ndcg_at_10 - max_loss;
    let chosen = if faster && close { Graph::Int8 } else { Graph::Fp32 };
    let why = format!(
        "查询编码计算图：int8 编码 p50 {:.2} ms（fp32 {:.2} ms，{}），nDCG@10 {:.4}（fp32 {:.4}，{}允许的差距 {:.4}）→ 选用 {chosen}",
        int8.encode.p50_ms,
        fp32.encode.p50_ms,
        if faster { "更快" } else { "不更快" },
        int8.ndcg_at_10,
        fp32.ndcg_at_10,
        if close { "在" } else { "超出" },
        max_loss
    );
    (chosen, Some(why))
}

/// Percentile of sorted values (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Paired bootstrap over queries: `live[i]` and `cand[i]` are the same query's metric under each pair.
fn compare(live: &[f64], cand: &[f64], samples: usize, seed: u64) -> Compared {
    let n = live.len();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let (mut gains, mut cands, mut lives) =
        (Vec::with_capacity(samples), Vec::with_capacity(samples), Vec::with_capacity(samples));
    let mut state = seed | 1;
    for _ in 0..samples {
        let (mut g, mut c) = (0.0, 0.0);
        for _ in 0..n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state % n.max(1) as u64) as usize;
            g += cand[i] - live[i];
            c += cand[i];
        }
        gains.push(g / n.max(1) as f64);
        cands.push(c / n.max(1) as f64);
        lives.push((c - g) / n.max(1) as f64);
    }
    for xs in [&mut gains, &mut cands, &mut lives] {
        xs.sort_by(f64::total_cmp);
    }
    let (l, c) = (mean(live), mean(cand));
    Compared {
        live: l,
        live_lo: percentile(&lives, 0.025),
        live_hi: percentile(&lives, 0.975),
        candidate: c,
        candidate_lo: percentile(&cands, 0.025),
        candidate_hi: percentile(&cands, 0.975),
        gain: c - l,
        gain_lo: percentile(&gains, 0.025),
        gain_hi: percentile(&gains, 0.975),
    }
}

/// One pair's per-query metrics on a collection's evaluation part and its fitted weight.
struct PairRun {
    weight: f32,
    per_query: Vec<[f64; 3]>,
}

/// A vector table the retention rule dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrunedTable {
    pub table: String,
    /// `name@version` of its document model, or `None` for a table SQLite did not record (left by a crash).
    pub model: Option<String>,
}

impl Lifecycle<'_> {
    /// The retention rule for vector tables: a rollback needs the tables of the document models of recent live
    /// pairs, not of every pair ever live. Keeps the live pair's, those of the newest
    /// `[lifecycle] keep_rollback_tables` earlier document models in the history, every candidate's (never live)
    /// and every offline model's (its vectors cannot be recomputed here); drops the rest, each with a
    /// `vectors.prune` audit record, and the tables SQLite does not know. Does nothing while a model task is queued
    /// or running, so no evaluation or promotion loses a table it reads.
    pub(crate) fn prune_vector_tables(&self) -> Result<Vec<PrunedTable>> {
        let busy: i64 = self.retrieval.store.reader().query_row(
            "SELECT COUNT(*) FROM jobs WHERE kind LIKE 'model.%' AND state IN ('queued', 'running')",
            [],
            |r| r.get(0),
        )?;
        if busy > 0 {
            return Ok(Vec::new());
        }
        let Some(live) = models::active(&self.retrieval.store)? else { return Ok(Vec::new()) };
        let mut keep = vec![live.document.id];
        let mut ever_live = std::collections::HashSet::new();
        for (_, document, _) in models::history(&self.retrieval.store, 10_000)? {
            ever_live.insert(document);
            if !keep.contains(&document) && keep.len() <= self.cfg.lifecycle.keep_rollback_tables {
                keep.push(document);
            }
        }
        let rows: Vec<(i64, String, i64)> = {
            let conn = self.retrieval.store.reader();
            let mut stmt = conn.prepare("SELECT id, table_name, model_id FROM dense_indexes")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut pruned = Vec::new();
        for (id, table, model) in &rows {
            if keep.contains(model) || !ever_live.contains(model) {
                continue;
            }
            let m = models::get(&self.retrieval.store, *model)?;
            if !m.online {
                continue;
            }
            let name = format!("{}@{}", m.name, m.version);
            let mut conn = self.retrieval.store.conn();
            let tx = conn.transaction()?;
            tx.execute("DELETE FROM dense_indexes WHERE id = ?1", [id])?;
            let detail = serde_json::json!({"table": table, "model": name, "reason": "retention"});
            crate::audit::append(&tx, "system", "vectors.prune", &detail)?;
            tx.commit()?;
            drop(conn);
            // Recorded first, dropped second: a crash in between leaves a table nothing records, dropped below on
            // the next run.
            self.retrieval.dense.drop_table(table)?;
            pruned.push(PrunedTable { table: table.clone(), model: Some(name) });
        }
        // Listed before SQLite is read: a table is created after its row, so one listed here and not recorded
        // below was left by a crash, never one being created now.
        let present = self.retrieval.dense.table_names()?;
        let recorded: std::collections::HashSet<String> = {
            let conn = self.retrieval.store.reader();
            let mut stmt = conn.prepare("SELECT table_name FROM dense_indexes")?;
            let names = stmt.query_map([], |r| r.get(0))?;
            names.collect::<Result<_, _>>()?
        };
        for table in present {
            if !recorded.contains(&table) && is_dense_table_name(&table) {
                self.retrieval.dense.drop_table(&table)?;
                pruned.push(PrunedTable { table, model: None });
            }
        }
        Ok(pruned)
    }
}

/// Whether `name` has the shape the engine gives its vector tables (`c<collection>_m<model>_v1`), so that nothing
/// else in the folder is ever dropped.
fn is_dense_table_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('c') else { return false };
    let Some((collection, rest)) = rest.split_once("_m") else { return false };
    let Some((model, version)) = rest.split_once("_v") else { return false };
    [collection, model, version].iter().all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
}

impl Lifecycle<'_> {
    /// Candidate lists of `set`'s queries under `pair`, its queries encoded by `graph` one at a time, as a search
    /// does.
    pub(crate) fn pair_candidates(
        &self,
        (pair, graph): (&ActivePair, Graph),
        set: &crate::eval::BeirSet,
        col: &crate::store::Collection,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<crate::eval::Candidates2> {
        let encoder = self.retrieval.models.graph(&pair.query, graph)?;
        let dense = crate::search::JudgedDense { encoder: &encoder, query: &pair.query, document: &pair.document };
        crate::eval::judged(self.searcher, set, col, Some(dense), 100, &mut |done, total| {
            if done % 50 == 0 {
                progress(DenseProgress { stage: "评测", collection: col.name.clone(), done, total })?;
            }
            Ok(())
        })
    }

    /// The pair's per-query metrics on `col`'s evaluation part, with the dense weight fitted on its training part
    /// (or `weight`: the int8 graph is scored with the weight fitted for the fp32 one, whose vectors it rounds).
    fn run_pair(
        &self,
        pair: (&ActivePair, Graph),
        col: &crate::store::Collection,
        (train, eval): (&crate::eval::BeirSet, &crate::eval::BeirSet),
        weight: Option<f32>,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<PairRun> {
        let weight = match weight {
            Some(w) => w,
            None if train.queries.is_empty() => self.retrieval.fusion_for(col.id)?.dense_weight,
            None => self.pair_candidates(pair, train, col, progress)?.tune(train).0,
        };
        let c = self.pair_candidates(pair, eval, col, progress)?;
        Ok(PairRun { weight, per_query: c.per_query(eval, crate::fusion::Method::Weighted, weight) })
    }

    /// Query-encode latencies of each (model, graph), measured interleaved (the encoders take turns query by query,
    /// the order rotated each time) after a warm-up, so that all see the same machine load: timing one after the
    /// other lets a burst of unrelated work land on one side only and fail (or pass) the gate by chance.
    fn encode_latencies(&self, sides: &[(&ModelRecord, Graph)], queries: &[String]) -> Result<Vec<EncodeLatency>> {
        const WARM_UP: usize = 8;
        let encs = sides.iter().map(|(m, g)| self.retrieval.models.graph(m, *g)).collect::<Result<Vec<_>>>()?;
        let mut ms = vec![Vec::with_capacity(queries.len()); encs.len()];
        // Warm-up first: the first queries' timings are dropped.
        for (i, q) in queries.iter().take(WARM_UP).chain(queries.iter()).enumerate() {
            for k in 0..encs.len() {
                let side = (i + k) % encs.len();
                let t = std::time::Instant::now();
                encs[side].encode(&[q.as_str()], TextKind::Query)?;
                if i >= WARM_UP.min(queries.len()) {
                    ms[side].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        Ok(ms
            .into_iter()
            .map(|mut xs| {
                xs.sort_by(f64::total_cmp);
                EncodeLatency { p50_ms: percentile(&xs, 0.5), p99_ms: percentile(&xs, 0.99) }
            })
            .collect())
    }

    fn store_evaluation(&self, actor: &Actor, cand: &ActivePair, r: &EvaluationReport) -> Result<i64> {
        let svg = evaluation_chart(r);
        let mut conn = self.retrieval.store.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO model_evaluations (query_model_id, document_model_id, baseline, passed, report, chart_svg, \
             created_by, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            rusqlite::params![
                cand.query.id,
                cand.document.id,
                r.live,
                r.passed,
                serde_json::to_string(r).map_err(|e| Error::Internal(e.to_string()))?,
                svg,
                actor.name,
                r.created_at
            ],
        )?;
        let id = tx.last_insert_rowid();
        crate::audit::append(
            &tx,
            &actor.name,
            "model.evaluate",
            &serde_json::json!({"evaluation": id, "candidate": r.candidate, "live": r.live, "passed": r.passed,
                "ndcg_gain": r.overall_ndcg_at_10.gain, "ndcg_gain_lo": r.overall_ndcg_at_10.gain_lo}),
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Resolves `candidate` and checks that it may go live: it passed its latest evaluation against the live pair,
    /// or an admin gives an override reason. Returns the pair and that evaluation with its verdict
    /// (`Some((id, true))` when it passed).
    pub(crate) fn promotion_allowed(
        &self,
        candidate: &str,
        override_reason: Option<&str>,
    ) -> Result<(ActivePair, Option<(i64, bool)>)> {
        let cand = self.resolve_pair(candidate)?;
        let live = models::active(&self.retrieval.store)?.map(|p| pair_spec(&p)).unwrap_or_default();
        if let Some(r) = self.rejection_of(&cand)? {
            return Err(Error::Forbidden(format!(
                "候选模型已被 {} 驳回（{}）；重新评测后才能上线 ({} was rejected by {} at {}: {}; evaluate it again \
                 to lift the rejection)",
                r.by,
                r.reason,
                pair_spec(&cand),
                r.by,
                r.at,
                r.reason
            )));
        }
        let verdict: Option<(i64, bool)> = self
            .retrieval
            .store
            .reader()
            .query_row(
                "SELECT id, passed FROM model_evaluations WHERE query_model_id = ?1 AND document_model_id = ?2 \
                 AND baseline = ?3 ORDER BY id DESC LIMIT 1",
                rusqlite::params![cand.query.id, cand.document.id, live],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let overridden = !override_reason.map(str::trim).unwrap_or("").is_empty();
        match verdict.map(|v| v.1) {
            Some(true) => {}
            _ if overridden => {}
            Some(false) => {
                return Err(Error::Forbidden(format!(
                    "候选模型未通过评测门槛；如确需上线，请填写理由强制上线 ({} failed its evaluation against {live}; \
                     promote with an override reason to go ahead anyway)",
                    pair_spec(&cand)
                )));
            }
            None => {
                return Err(Error::Forbidden(format!(
                    "候选模型尚未与在用模型对比评测 ({} has no evaluation against the live pair {live}; run \
                     `care model evaluate --candidate {}` first, or promote with an override reason)",
                    pair_spec(&cand),
                    pair_spec(&cand)
                )));
            }
        }
        Ok((cand, verdict))
    }

    /// The registered pair `Q@v,D@v` names, checked to be a valid pairing.
    pub(crate) fn resolve_pair(&self, spec: &str) -> Result<ActivePair> {
        let (q, d) = parse_pair(spec)?;
        let pair = ActivePair {
            query: models::find(&self.retrieval.store, &q)?,
            document: models::find(&self.retrieval.store, &d)?,
        };
        models::check_pair(&pair.query, &pair.document)?;
        Ok(pair)
    }

    /// The rejection standing on `pair`: its newest evaluation (against any live pair) was rejected.
    fn rejection_of(&self, pair: &ActivePair) -> Result<Option<Rejection>> {
        let r = self
            .retrieval
            .store
            .reader()
            .query_row(
                "SELECT rejected_by, rejected_at, rejected_reason FROM model_evaluations \
                 WHERE query_model_id = ?1 AND document_model_id = ?2 ORDER BY id DESC LIMIT 1",
                rusqlite::params![pair.query.id, pair.document.id],
                |r| Ok(Rejection { by: r.get(0)?, at: r.get(1)?, reason: r.get(2)? }),
            )
            .optional()?;
        Ok(r.filter(|r| !r.by.is_empty()))
    }

    /// What evaluation `id` judged its candidate with, so what it serves with once promoted: the dense weights it
    /// fitted on each collection's training part (a collection without training queries was scored with its
    /// stored weight, which stays), and the query graph it chose (none in a report from before graphs were
    /// compared: the model keeps its own).
    fn gate_choices(&self, id: i64) -> Result<(models::FusionChange, Option<Graph>)> {
        let json: String = self.retrieval.store.reader().query_row(
            "SELECT report FROM model_evaluations WHERE id = ?1",
            [id],
            |r| r.get(0),
        )?;
        let report: EvaluationReport =
            serde_json::from_str(&json).map_err(|e| Error::Internal(format!("evaluation {id}: {e}")))?;
        let mut weights = Vec::new();
        for c in report.collections.iter().filter(|c| c.train_queries > 0) {
            if let Ok(col) = self.retrieval.store.collection(&c.collection) {
                let fitted_on = format!("evaluation #{id}: training part, {} queries", c.train_queries);
                weights.push((col.id, c.candidate_dense_weight, fitted_on));
            }
        }
        let graph = (!report.graphs.is_empty()).then_some(report.candidate_graph);
        Ok((models::FusionChange::Set(weights), graph))
    }
}

/// The report's chart: live against candidate per collection and metric.
pub fn evaluation_chart(r: &EvaluationReport) -> String {
    let mut rows = Vec::new();
    for c in &r.collections {
        for (name, m) in [("nDCG@10", &c.ndcg_at_10), ("MRR@10", &c.mrr_at_10), ("Recall@100", &c.recall_at_100)] {
            rows.push((format!("{} {name}", c.collection), vec![m.live, m.candidate, m.candidate_lo, m.candidate_hi]));
        }
    }
    let title =
        format!("{} ({}) vs live {}: {} — {}", r.candidate, r.candidate_graph, r.live, r.ndcg_gain(), r.verdict());
    crate::chart::grouped_bars(&title, "", &["live", "candidate", "candidate 2.5%", "candidate 97.5%"], &rows)
}

impl crate::engine::Models<'_> {
    /// Verifies the package folder `src` and registers a copy of it (see the module docs). Admins only.
    pub fn import(&self, actor: &Admin, src: &Path) -> Result<ImportReport> {
        self.import_by(actor, src, Transfer::Copy)
    }

    /// [`Self::import`], bringing the files over as `how` says.
    pub(crate) fn import_by(&self, actor: &Admin, src: &Path, how: Transfer) -> Result<ImportReport> {
        let m = ModelManifest::load(src).map_err(|e| manifest_err(src, e))?;
        check_manifest(src, &m)?;
        let spec = format!("{}@{}", m.name, m.version);
        let _lock = import_lock(&self.engine.dir.import_locks(), &spec)?;
        m.verify_files(src).map_err(|e| manifest_err(src, e))?;
        if models::find(&self.engine.store, &spec).is_ok() {
            return Err(Error::InvalidInput(format!(
                "模型 {spec} 已注册；新的模型包请换一个版本号 (model {spec} is already registered; give the new package another version)"
            )));
        }
        let final_dir = self.engine.dir.models().join(&m.name).join(&m.version);
        // A folder without a registry row is what an import interrupted between rename and commit leaves.
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| Error::io(&final_dir, e))?;
        }
        // The copy under models/ is as large as the listed files (their sizes as the hash check just read them);
        // links take no room.
        let incoming = match how {
            Transfer::Copy => m
                .files
                .keys()
                .filter_map(|f| std::fs::symlink_metadata(src.join(f)).ok())
                .map(|md| md.len())
                .fold(0u64, u64::saturating_add),
            Transfer::Link => 0,
        };
        self.engine.dir.ensure_free(self.engine.cfg.disk_reserve_bytes(), &format!("导入模型 {spec}"), incoming)?;
        let staged = self.engine.dir.models().join(format!(
            "{}{}-{}",
            crate::datadir::IMPORT_STAGING,
            std::process::id(),
            next_staging()
        ));
        let result =
            crate::lifecycle::Lifecycle::of(self.engine).stage_and_register(actor, src, &m, (&staged, how), &final_dir);
        let _ = std::fs::remove_dir_all(&staged);
        result
    }

    /// Scores the candidate pair `Q@v,D@v` against the live pair on every collection's evaluation part, through
    /// the appliance's own hybrid search (weighted fusion, weight re-fitted per pair on the training part), and
    /// stores the report with the gate's verdict. A candidate document model is embedded into its own tables
    /// first; the live pair keeps serving meanwhile.
    pub fn evaluate(
        &self,
        actor: &Admin,
        candidate: &str,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<EvaluationReport> {
        let live = models::active(&self.engine.store)?
            .ok_or_else(|| Error::InvalidInput("没有在用的模型 (no live model pair to compare with)".into()))?;
        let cand = crate::lifecycle::Lifecycle::of(self.engine).resolve_pair(candidate)?;
        self.engine.retrieval().prepare_document_model(&cand.document, progress)?;
        let lc = &self.engine.cfg.lifecycle;
        let live_graph = live.query.served_query_graph();
        let graphs: Vec<Graph> = if cand.query.has_int8 { Graph::ALL.to_vec() } else { vec![Graph::Fp32] };
        // Per collection: its evaluation part's size, training part's size, and the live pair's run with the
        // candidate's run in each graph.
        let mut runs: Vec<(String, usize, usize, PairRun, Vec<PairRun>)> = Vec::new();
        let mut eval_texts = Vec::new();
        for col in self.engine.store.collection_list()? {
            let eval = self.engine.judgments().judged(col.id, "eval")?.scorable();
            if eval.queries.is_empty() {
                continue;
            }
            let train = self.engine.judgments().judged(col.id, "train")?.scorable();
            let (train, eval) = (train.as_beir("train"), eval.as_beir("eval"));
            let l = crate::lifecycle::Lifecycle::of(self.engine).run_pair(
                (&live, live_graph),
                &col,
                (&train, &eval),
                None,
                progress,
            )?;
            let mut c = vec![crate::lifecycle::Lifecycle::of(self.engine).run_pair(
                (&cand, Graph::Fp32),
                &col,
                (&train, &eval),
                None,
                progress,
            )?];
            for g in &graphs[1..] {
                let fitted = Some(c[0].weight);
                c.push(crate::lifecycle::Lifecycle::of(self.engine).run_pair(
                    (&cand, *g),
                    &col,
                    (&train, &eval),
                    fitted,
                    progress,
                )?);
            }
            runs.push((col.name.clone(), eval.queries.len(), train.queries.len(), l, c));
            eval_texts.extend(eval.queries.iter().map(|(_, text)| text.clone()));
        }
        if runs.is_empty() {
            return Err(Error::InvalidInput(
                "没有可用于评测的标注查询：请先导入评测集 (no collection has judged evaluation queries; import a judgment \
                 set with `care judgments import` or collect clinician feedback first)"
                    .into(),
            ));
        }
        let mut sides = vec![(&live.query, live_graph)];
        sides.extend(graphs.iter().map(|g| (&cand.query, *g)));
        let mut latencies = crate::lifecycle::Lifecycle::of(self.engine).encode_latencies(&sides, &eval_texts)?;
        let live_encode = latencies.remove(0);
        let variants: Vec<GraphVariant> = graphs
            .iter()
            .zip(latencies)
            .enumerate()
            .map(|(k, (g, encode))| {
                let ndcg: Vec<f64> = runs.iter().flat_map(|r| r.4[k].per_query.iter().map(|x| x[0])).collect();
                GraphVariant { graph: *g, ndcg_at_10: ndcg.iter().sum::<f64>() / ndcg.len().max(1) as f64, encode }
            })
            .collect();
        let (chosen, why) = choose_graph(&variants, lc.int8_max_loss);
        let k = graphs.iter().position(|g| *g == chosen).unwrap_or(0);
        let (mut all_live, mut all_cand) = (Vec::new(), Vec::new());
        let mut collections = Vec::new();
        for (name, eval_queries, train_queries, l, c) in &runs {
            let c = &c[k];
            let metric = |m: usize| {
                let (a, b): (Vec<f64>, Vec<f64>) =
                    l.per_query.iter().zip(&c.per_query).map(|(x, y)| (x[m], y[m])).unzip();
                compare(&a, &b, lc.bootstrap_samples, 0x5eed + m as u64)
            };
            collections.push(CollectionEvaluation {
                collection: name.clone(),
                eval_queries: *eval_queries,
                train_queries: *train_queries,
                live_dense_weight: l.weight,
                candidate_dense_weight: c.weight,
                ndcg_at_10: metric(0),
                mrr_at_10: metric(1),
                recall_at_100: metric(2),
            });
            all_live.extend(l.per_query.iter().map(|x| x[0]));
            all_cand.extend(c.per_query.iter().map(|x| x[0]));
        }
        let overall = compare(&all_live, &all_cand, lc.bootstrap_samples, 0x5eed);
        let candidate_encode = variants[k].encode.clone();
        let per_collection: Vec<(String, f64)> =
            collections.iter().map(|c| (c.collection.clone(), c.ndcg_at_10.gain)).collect();
        let (passed, mut reasons) = gate(&overall, &per_collection, (&live_encode, &candidate_encode), lc);
        reasons.extend(why);
        let mut report = EvaluationReport {
            id: 0,
            candidate: pair_spec(&cand),
            live: pair_spec(&live),
            created_at: crate::store::now(),
            created_by: actor.name.clone(),
            collections,
            overall_ndcg_at_10: overall,
            live_encode,
            candidate_encode,
            graphs: variants,
            candidate_graph: chosen,
            int8_max_loss: lc.int8_max_loss,
            gate_margin: lc.gate_margin,
            max_latency_ratio: lc.max_latency_ratio,
            bootstrap_samples: lc.bootstrap_samples,
            passed,
            reasons,
            rejected: None,
        };
        report.id = crate::lifecycle::Lifecycle::of(self.engine).store_evaluation(actor, &cand, &report)?;
        Ok(report)
    }

    /// Stored evaluations, newest first (reports with their chart).
    pub fn evaluations(&self, _admin: &Admin, limit: usize) -> Result<Vec<(EvaluationReport, String)>> {
        let conn = self.engine.store.reader();
        let mut stmt = conn.prepare(
            "SELECT id, report, chart_svg, rejected_by, rejected_at, rejected_reason FROM model_evaluations \
             ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit.min(1000) as i64], |r| {
            let rejection = Rejection { by: r.get(3)?, at: r.get(4)?, reason: r.get(5)? };
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, rejection))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, json, svg, rejection) = row?;
            let mut rep: EvaluationReport =
                serde_json::from_str(&json).map_err(|e| Error::Internal(format!("evaluation {id}: {e}")))?;
            rep.id = id;
            rep.rejected = Some(rejection).filter(|r| !r.by.is_empty());
            out.push((rep, svg));
        }
        Ok(out)
    }

    /// Rejects an evaluated candidate pair: it cannot be promoted, not even with an override, until it is
    /// evaluated again. Its report stays, marked. Returns the evaluation that was marked.
    pub fn reject(&self, actor: &Admin, candidate: &str, reason: &str) -> Result<i64> {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(Error::InvalidInput("请填写驳回理由 (a rejection needs a reason; it is audited)".into()));
        }
        let cand = crate::lifecycle::Lifecycle::of(self.engine).resolve_pair(candidate)?;
        let mut conn = self.engine.store.conn();
        let tx = conn.transaction()?;
        let id: i64 = tx
            .query_row(
                "SELECT id FROM model_evaluations WHERE query_model_id = ?1 AND document_model_id = ?2 \
                 ORDER BY id DESC LIMIT 1",
                rusqlite::params![cand.query.id, cand.document.id],
                |r| r.get(0),
            )
            .optional()?
            .ok_or_else(|| Error::NotFound {
                what: format!(
                    "候选模型 {} 的评测记录 (an evaluation of {} to reject)",
                    pair_spec(&cand),
                    pair_spec(&cand)
                ),
            })?;
        tx.execute(
            "UPDATE model_evaluations SET rejected_by = ?2, rejected_at = ?3, rejected_reason = ?4 WHERE id = ?1",
            rusqlite::params![id, actor.name, crate::store::now(), reason],
        )?;
        crate::audit::append(
            &tx,
            &actor.name,
            "model.reject",
            &serde_json::json!({"evaluation": id, "candidate": pair_spec(&cand), "reason": reason}),
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Makes the candidate pair live. It must have passed its latest evaluation against the pair live now, unless
    /// an admin overrides the gate with a reason. When the document model changes, every collection is embedded
    /// into the candidate's own tables first while the live pair keeps serving; the switch itself is one
    /// transaction.
    pub fn promote(
        &self,
        actor: &Admin,
        candidate: &str,
        override_reason: Option<&str>,
        progress: &mut dyn FnMut(DenseProgress) -> Result<()>,
    ) -> Result<ActivePair> {
        let (cand, verdict) =
            crate::lifecycle::Lifecycle::of(self.engine).promotion_allowed(candidate, override_reason)?;
        let reason = override_reason.map(str::trim).unwrap_or("");
        let (fusion, graph) = match verdict {
            Some((evaluation, _)) => crate::lifecycle::Lifecycle::of(self.engine).gate_choices(evaluation)?,
            None => (models::FusionChange::Keep, None),
        };
        self.engine.retrieval().prepare_document_model(&cand.document, progress)?;
        let action = if verdict.is_some_and(|v| v.1) { "model.promote" } else { "model.promote_override" };
        models::set_active_as(
            &self.engine.store,
            &cand.query,
            &cand.document,
            &actor.name,
            (action, reason),
            &fusion,
            graph,
        )?;
        self.engine.models.forget_active_pair();
        Ok(cand)
    }

    /// Returns to the pair that was live before the live one, with the fusion weights it served with. Its tables
    /// were kept, so only chunks ingested since are embedded before the switch.
    pub fn rollback(&self, actor: &Admin, reason: &str) -> Result<ActivePair> {
        let live = models::active(&self.engine.store)?
            .ok_or_else(|| Error::InvalidInput("没有在用的模型 (no live model pair)".into()))?;
        let previous = models::history(&self.engine.store, 1000)?
            .into_iter()
            .find(|(q, d, _)| (*q, *d) != (live.query.id, live.document.id))
            .ok_or_else(|| Error::NotFound {
                what: "可回滚的上一组模型 (a previous model pair to roll back to)".into(),
            })?;
        let pair = ActivePair {
            query: models::get(&self.engine.store, previous.0)?,
            document: models::get(&self.engine.store, previous.1)?,
        };
        self.engine.retrieval().prepare_document_model(&pair.document, &mut |_| Ok(()))?;
        models::set_active_as(
            &self.engine.store,
            &pair.query,
            &pair.document,
            &actor.name,
            ("model.rollback", reason.trim()),
            &models::FusionChange::RestoreBeforeLive,
            None,
        )?;
        self.engine.models.forget_active_pair();
        Ok(pair)
    }

    /// The live-pair history, newest first.
    pub fn history(&self, _admin: &Admin, limit: usize) -> Result<Vec<models::HistoryEntry>> {
        Ok(models::history(&self.engine.store, limit.min(1000))?.into_iter().map(|h| h.2).collect())
    }
}

#[cfg(test)]
mod tests;
