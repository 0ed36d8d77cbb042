//! Criterion benchmarks of the query path's CPU-bound pieces (no model, no disk):
//! jieba tokenisation of a query, the exact vector scan at kuake_qtr scale, and weighted fusion.
//! Run: `cargo bench -p care-engine --bench hot_paths`.

use care_engine::dense::flat_top_k;
use care_engine::fusion::{Method, fuse};
use care_engine::lexical::{build_jieba, tokenize};
use criterion::{Criterion, criterion_group, criterion_main};

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

fn benches(c: &mut Criterion) {
    let (jieba, _) = build_jieba(None).unwrap();
    c.bench_function("jieba_search_tokenize_query", |b| {
        b.iter(|| tokenize(&jieba, std::hint::black_box("二甲双胍的禁忌症有哪些")))
    });

    let (n, w) = (32_171usize, 384usize);
    let mut seed = 7u64;
    let vectors: Vec<f32> = (0..n * w).map(|_| lcg(&mut seed)).collect();
    let q: Vec<f32> = (0..w).map(|_| lcg(&mut seed)).collect();
    c.bench_function("flat_top100_32k_x384", |b| b.iter(|| flat_top_k(&vectors, w, std::hint::black_box(&q), 100)));

    let bm25: Vec<(i64, i64, f32)> = (0..100).map(|i| (i, i, 30.0 - i as f32 * 0.2)).collect();
    let dense: Vec<(i64, i64, f32)> = (50..150).map(|i| (i, i, 0.9 - i as f32 * 0.001)).collect();
    c.bench_function("fuse_weighted_100x100", |b| b.iter(|| fuse(&bm25, &dense, Method::Weighted, 0.7)));
}

criterion_group!(hot, benches);
criterion_main!(hot);
