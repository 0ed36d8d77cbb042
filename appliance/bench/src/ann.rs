//! `care-bench --ann`: the table size at which the IVF-PQ index should take over from the exact scan
//! (`search.ann_threshold`).
//!
//! The real document vectors of a prepared benchmark directory (`care-bench --reuse DIR`) are tiled to 1×, 2×, 4×…
//! their count. Every copy after the first is each vector plus Gaussian noise, re-normalised: exact duplicates would
//! make recall meaningless, and small noise keeps the neighbourhoods as crowded as real ones (harder for IVF-PQ than
//! random vectors). At each size both served paths run in one process on the same real query vectors: the exact
//! scan (`DenseStore::search_exact`, int8 pass and f32 re-score) and LanceDB IVF-PQ with the configured
//! `ann_nprobes`/`ann_refine`, whose recall@100 is measured against an f32 scan.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use care_engine::dense::DenseStore;
use care_engine::engine::OpenMode;
use care_engine::eval::BeirSet;
use care_engine::{Engine, EngineConfig};
use serde::Serialize;

use crate::hot_paths::Latency;

#[derive(clap::Args, Debug, Default)]
pub struct AnnArgs {
    /// ANN benchmark: exact scan against IVF-PQ on the vectors of `--reuse DIR` tiled to larger sizes.
    #[arg(long, requires = "reuse")]
    pub ann: bool,
    /// With --ann: table sizes as multiples of the prepared corpus's chunk count.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16", requires = "ann")]
    pub ann_scales: Vec<usize>,
    /// With --ann: standard deviation per dimension of the noise added to each tiled copy.
    #[arg(long, default_value_t = 0.02, requires = "ann")]
    pub ann_noise: f32,
}

#[derive(Debug, Serialize)]
pub struct AnnPoint {
    pub rows: usize,
    pub exact: Latency,
    /// Process CPU milliseconds per query (all threads; LanceDB's search is multi-threaded).
    pub exact_cpu_ms: f64,
    pub ann: Latency,
    pub ann_cpu_ms: f64,
    pub ann_build_seconds: f64,
    /// Mean recall@100 of IVF-PQ against an f32 exact scan.
    pub ann_recall_at_100: f64,
    /// Bytes the exact scan keeps in memory (f32 rows plus the int8 copy).
    pub exact_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct AnnReport {
    pub set: String,
    pub queries: usize,
    pub width: usize,
    pub cpu: String,
    pub cores: usize,
    pub vector_isa: String,
    pub nprobes: usize,
    pub refine: u32,
    pub noise: f32,
    pub points: Vec<AnnPoint>,
    /// Smallest measured size at which IVF-PQ's p99 beats the exact scan's with recall@100 ≥ 0.95 (None: never).
    pub crossover_rows: Option<usize>,
}

pub fn run(base: &EngineConfig, set_dir: &Path, reuse: &Path, queries: usize, a: &AnnArgs) -> Result<AnnReport> {
    let set = BeirSet::load(set_dir, "dev")?;
    let mut cfg = base.clone();
    cfg.storage.data_dir = reuse.to_path_buf();
    cfg.model.threads = 1;
    let e = Engine::open(cfg.clone(), OpenMode::Existing).with_context(|| {
        format!("{} is not a prepared benchmark directory (run care-bench --reuse first)", reuse.display())
    })?;
    e.models().activate(&crate::hot_paths::bench_admin(), "e5-small@1", "e5-small@1", &mut |_| Ok(()))?;
    let base_rows = e.vectors().dense_vectors("bench")?;
    let Some(width) = base_rows.first().map(|r| r.1.len()) else { bail!("{} holds no dense vectors", reuse.display()) };
    let texts: Vec<&str> = set.queries.iter().take(queries).map(|(_, q)| q.as_str()).collect();
    let (qvecs, _) = e.retrieval().encode_queries(&texts)?.context("no active query encoder")?;
    drop(e);

    let scratch = PathBuf::from(reuse).join("ann-scale");
    let _ = std::fs::remove_dir_all(&scratch);
    let store = DenseStore::open(&scratch)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut points = Vec::new();
    let mut scales = a.ann_scales.clone();
    scales.sort_unstable();
    scales.dedup();
    // One table grows from size to size; each size re-trains the index over all its rows.
    let t = store.table("scale", width)?;
    let mut copies = 0;
    for scale in scales {
        while copies < scale {
            let rows: Vec<(i64, i64, Vec<f32>)> = base_rows
                .iter()
                .enumerate()
                .map(|(i, (_, v))| {
                    let id = (copies * base_rows.len() + i) as i64;
                    let v = if copies == 0 { v.clone() } else { rng.perturb(v, a.ann_noise) };
                    (id, id, v)
                })
                .collect();
            for part in rows.chunks(20_000) {
                // Appends: no document of these ids is stored yet, so nothing is deleted.
                store.replace_documents(&t, &[], part)?;
            }
            copies += 1;
        }
        let p = measure(&store, &t, &qvecs, &cfg)?;
        eprintln!("{}", serde_json::to_string(&p)?);
        points.push(p);
    }
    drop(t);
    drop(store);
    let _ = std::fs::remove_dir_all(&scratch);
    let crossover_rows =
        points.iter().find(|p| p.ann.p99_ms < p.exact.p99_ms && p.ann_recall_at_100 >= 0.95).map(|p| p.rows);
    Ok(AnnReport {
        set: set.name.clone(),
        queries: qvecs.len(),
        width,
        cpu: care_engine::kernels::cpu_model(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        vector_isa: care_engine::kernels::Isa::detected().name().into(),
        nprobes: cfg.search.ann_nprobes,
        refine: cfg.search.ann_refine,
        noise: a.ann_noise,
        points,
        crossover_rows,
    })
}

fn measure(
    store: &DenseStore,
    t: &care_engine::dense::DenseTable,
    qvecs: &[Vec<f32>],
    cfg: &EngineConfig,
) -> Result<AnnPoint> {
    let rows = store.count(t)?;
    let (nprobes, refine) = (cfg.search.ann_nprobes, cfg.search.ann_refine);
    // The first exact search loads the in-memory copy; not timed, as in a warm server.
    store.search_exact(t, &qvecs[0], 100)?;
    let (exact, exact_cpu_ms) = timed(qvecs, |q| store.search_exact(t, q, 100).map(drop))?;
    let t0 = Instant::now();
    store.build_ann(t)?;
    let ann_build_seconds = t0.elapsed().as_secs_f64();
    store.search_ann(t, &qvecs[0], 100, nprobes, refine)?;
    let (ann, ann_cpu_ms) = timed(qvecs, |q| store.search_ann(t, q, 100, nprobes, refine).map(drop))?;
    let ann_recall_at_100 = store.recall_at(t, qvecs, 100, nprobes, refine)?;
    Ok(AnnPoint {
        rows,
        exact,
        exact_cpu_ms,
        ann,
        ann_cpu_ms,
        ann_build_seconds,
        ann_recall_at_100,
        exact_bytes: rows * t.width() * 5,
    })
}

fn timed(qvecs: &[Vec<f32>], mut f: impl FnMut(&[f32]) -> care_engine::Result<()>) -> Result<(Latency, f64)> {
    let cpu0 = process_cpu_ms();
    let mut xs = Vec::with_capacity(qvecs.len());
    for q in qvecs {
        let t = Instant::now();
        f(q)?;
        xs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu = (process_cpu_ms() - cpu0) / qvecs.len().max(1) as f64;
    Ok((Latency::from(xs), cpu))
}

/// User plus system CPU of this process in milliseconds (clock ticks of 10 ms; averaged over many queries).
fn process_cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th fields overall.
    let rest = stat.rsplit_once(')').map_or("", |p| p.1);
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) * 10.0
}

/// xorshift64* with Box-Muller: reproducible noise without a dependency.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn perturb(&mut self, v: &[f32], sigma: f32) -> Vec<f32> {
        let mut out: Vec<f32> = v
            .iter()
            .map(|x| {
                let (u1, u2) = (self.uniform(), self.uniform());
                let g = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                x + sigma * g as f32
            })
            .collect();
        let n = out.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
        out.iter_mut().for_each(|x| *x /= n);
        out
    }
}

/// Latency per table size (p50 and p99 of both paths) above recall@100 of IVF-PQ.
pub fn chart(r: &AnnReport) -> String {
    let rows: Vec<(String, Vec<f64>)> = r
        .points
        .iter()
        .map(|p| (format!("{} rows", p.rows), vec![p.exact.p50_ms, p.exact.p99_ms, p.ann.p50_ms, p.ann.p99_ms]))
        .collect();
    let recall: Vec<(String, Vec<f64>)> =
        r.points.iter().map(|p| (format!("{} rows", p.rows), vec![p.ann_recall_at_100])).collect();
    let head = format!("{}, {} queries, {} ({} cores)", r.set, r.queries, r.cpu, r.cores);
    care_engine::chart::stack(&[
        care_engine::chart::grouped_bars(
            &format!("dense top 100: exact scan vs IVF-PQ (nprobes {}, refine {}) — {head}", r.nprobes, r.refine),
            " ms",
            &["exact p50", "exact p99", "IVF-PQ p50", "IVF-PQ p99"],
            &rows,
        ),
        care_engine::chart::grouped_bars("IVF-PQ recall@100 against the exact scan", "", &["recall@100"], &recall),
    ])
}
