//! Semantic textual similarity: cosine of the two sentences' embeddings against the human label, reported as
//! Pearson and Spearman correlation (the MTEB convention).

use std::io::BufRead;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct StsPair {
    pub a: String,
    pub b: String,
    pub label: f64,
}

/// Reads `sentence1<TAB>sentence2<TAB>label[...]` with a header line.
pub fn read_pairs(path: &Path) -> Result<Vec<StsPair>> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if i == 0 && line.starts_with("sentence1") || line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        let label = cols.get(2).and_then(|l| l.trim().parse::<f64>().ok());
        match (cols.first(), cols.get(1), label) {
            (Some(a), Some(b), Some(label)) => out.push(StsPair { a: a.to_string(), b: b.to_string(), label }),
            _ => {
                return Err(Error::MalformedRecord {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: "expected sentence1<TAB>sentence2<TAB>label".into(),
                });
            }
        }
    }
    Ok(out)
}

pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len()) as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = x.iter().sum::<f64>() / n;
    let my = y.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx).powi(2);
        syy += (b - my).powi(2);
    }
    if sxx == 0.0 || syy == 0.0 { 0.0 } else { sxy / (sxx * syy).sqrt() }
}

/// Ranks with ties given their average rank (as scipy.stats.spearmanr does).
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for k in i..=j {
            r[idx[k]] = avg;
        }
        i = j + 1;
    }
    r
}

pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    pearson(&ranks(x), &ranks(y))
}

#[derive(Debug, Clone, Serialize)]
pub struct StsReport {
    pub pairs: usize,
    pub pearson: f64,
    pub spearman: f64,
}

/// Scores pairs with the active query encoder (both sides encoded as queries, the symmetric task).
pub fn evaluate(retrieval: crate::hybrid::Retrieval<'_>, pairs: &[StsPair]) -> Result<StsReport> {
    let mut cos = Vec::with_capacity(pairs.len());
    for batch in pairs.chunks(128) {
        let a: Vec<&str> = batch.iter().map(|p| p.a.as_str()).collect();
        let b: Vec<&str> = batch.iter().map(|p| p.b.as_str()).collect();
        let (va, _) =
            retrieval.encode_queries(&a)?.ok_or_else(|| Error::Model("no active model to evaluate".into()))?;
        let (vb, _) =
            retrieval.encode_queries(&b)?.ok_or_else(|| Error::Model("no active model to evaluate".into()))?;
        for (x, y) in va.iter().zip(&vb) {
            cos.push(crate::encoders::dot(x, y) as f64);
        }
    }
    let labels: Vec<f64> = pairs.iter().map(|p| p.label).collect();
    Ok(StsReport { pairs: pairs.len(), pearson: pearson(&cos, &labels), spearman: spearman(&cos, &labels) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correlations_hand_computed() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert!((pearson(&x, &[2.0, 4.0, 6.0, 8.0]) - 1.0).abs() < 1e-12);
        assert!((pearson(&x, &[4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        // x = 1,2,3 ; y = 1,3,2 → means 2,2; sxy = (-1)(-1)+0+(1)(0) = 1; sxx = 2; syy = 2 → 0.5
        assert!((pearson(&[1.0, 2.0, 3.0], &[1.0, 3.0, 2.0]) - 0.5).abs() < 1e-12);
        // Monotone but non-linear: Spearman 1, Pearson < 1.
        let y = [1.0, 10.0, 100.0, 1000.0];
        assert!((spearman(&x, &y) - 1.0).abs() < 1e-12);
        assert!(pearson(&x, &y) < 0.99);
        // Ties get average ranks: [1, 2, 2, 3] → ranks [1, 2.5, 2.5, 4].
        assert_eq!(ranks(&[1.0, 2.0, 2.0, 3.0]), vec![1.0, 2.5, 2.5, 4.0]);
    }
}
