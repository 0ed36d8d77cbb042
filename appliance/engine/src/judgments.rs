//! Labelled query sets per collection: what candidate models are judged on, and (their training parts) what
//! retraining learns from.
//!
//! A set comes from an upload (BEIR `queries.jsonl` + `qrels/<split>.tsv`, or CSV `query, document or passage id,
//! grade`) or from clinician feedback, read as judgments where it is stored (有帮助 → grade 1, 没帮助 → judged
//! non-relevant, grade 0). Every judgment's part, training or evaluation, follows from a hash of its query text
//! alone ([`part_of`]): the same query lands in the same part in every set and every run, so an evaluation query
//! never reaches training, whichever set it came from.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use rusqlite::params;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::eval::metrics::Judgements;

/// Most judgments one import may carry.
pub const MAX_JUDGMENTS: usize = 500_000;
/// The name feedback judgments are listed under.
pub const FEEDBACK_SET: &str = "feedback";

/// Where an uploaded set is read from.
#[derive(Debug, Clone, Copy)]
pub enum JudgmentSource<'a> {
    Beir {
        dir: &'a Path,
        split: &'a str,
    },
    Csv(&'a Path),
    /// CSV text already in memory (the demo's set compiled into the binary); `name` stands for it in messages.
    CsvText {
        name: &'a str,
        text: &'a str,
    },
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JudgmentSetInfo {
    pub collection: String,
    pub name: String,
    pub source: String,
    pub created_by: String,
    pub created_at: String,
    pub judgments: usize,
    pub train_queries: usize,
    pub eval_queries: usize,
    /// Judgments of the upload naming no document or passage of the collection (skipped).
    pub unresolved: usize,
}

/// Judged queries of one part: BEIR-shaped (query id → text, query id → document external id → grade).
#[derive(Debug, Clone, Default)]
pub struct Judged {
    pub queries: Vec<(String, String)>,
    pub qrels: HashMap<String, Judgements>,
}

impl Judged {
    /// Queries with at least one relevant document (the others cannot be scored by nDCG or MRR).
    pub fn scorable(self) -> Judged {
        let queries = self
            .queries
            .into_iter()
            .filter(|(id, _)| self.qrels.get(id).is_some_and(|j| j.values().any(|g| *g > 0)))
            .collect();
        Judged { queries, qrels: self.qrels }
    }

    pub fn as_beir(&self, name: &str) -> crate::eval::BeirSet {
        crate::eval::BeirSet {
            name: name.into(),
            dir: Default::default(),
            queries: self.queries.clone(),
            qrels: self.qrels.clone(),
        }
    }
}

/// "train" or "eval": fixed by the query text (trimmed, case-folded), `eval_fraction` of queries go to "eval".
pub fn part_of(query: &str, eval_fraction: f64) -> &'static str {
    let h = Sha256::digest(query.trim().to_lowercase().as_bytes());
    let x = u64::from_be_bytes(h[..8].try_into().unwrap_or([0; 8])) as f64 / u64::MAX as f64;
    if x < eval_fraction { "eval" } else { "train" }
}

/// (query, id as given, grade) rows of an upload.
pub(crate) fn read_rows(src: JudgmentSource<'_>) -> Result<Vec<(String, String, i64)>> {
    match src {
        JudgmentSource::Beir { dir, split } => {
            let set = crate::eval::BeirSet::load(dir, split)?;
            let mut rows = Vec::new();
            // A query id repeated in queries.jsonl counts once, and rows are counted while built: 2,000 copies of
            // one id with 2,000 judgments each once built 4 M rows (+600 MB) before the limit refused them.
            let mut seen = std::collections::HashSet::new();
            for (qid, text) in &set.queries {
                if !seen.insert(qid) {
                    continue;
                }
                for (doc, grade) in &set.qrels[qid] {
                    rows.push((text.clone(), doc.clone(), i64::from(*grade)));
                    if rows.len() > MAX_JUDGMENTS {
                        return Ok(rows);
                    }
                }
            }
            Ok(rows)
        }
        JudgmentSource::Csv(path) => {
            let file = std::fs::File::open(path).map_err(|e| Error::MalformedFile {
                path: path.into(),
                format: "CSV",
                message: e.to_string(),
            })?;
            read_csv(path, file)
        }
        JudgmentSource::CsvText { name, text } => read_csv(Path::new(name), text.as_bytes()),
    }
}

fn read_csv(path: &Path, input: impl std::io::Read) -> Result<Vec<(String, String, i64)>> {
    let mut r = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(input);
    let mut rows = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| Error::MalformedRecord { path: path.into(), line: i + 1, message: e.to_string() })?;
        let field = |k: usize| rec.get(k).map(str::trim).unwrap_or("");
        let grade = field(2).parse::<i64>();
        if i == 0 && grade.is_err() {
            continue; // a header row
        }
        let grade = grade.map_err(|_| Error::MalformedRecord {
            path: path.into(),
            line: i + 1,
            message: format!("grade {:?} is not an integer; expected `query,document or passage id,grade`", field(2)),
        })?;
        if field(0).is_empty() || field(1).is_empty() {
            return Err(Error::MalformedRecord {
                path: path.into(),
                line: i + 1,
                message: "empty query or id; expected `query,document or passage id,grade`".into(),
            });
        }
        rows.push((field(0).to_string(), field(1).to_string(), grade));
        if rows.len() > MAX_JUDGMENTS {
            break;
        }
    }
    Ok(rows)
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.chars().count() <= 64
        && name != FEEDBACK_SET
        && name.chars().all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "评测集名称无效 (judgment set name {name:?}: 1–64 letters, digits, '.', '_', '-'; \"{FEEDBACK_SET}\" is reserved)"
        )))
    }
}

/// The judged queries of collections, uploaded and from feedback, as training and evaluation read them.
#[derive(Clone, Copy)]
pub struct Judgments<'e> {
    pub(crate) store: &'e crate::store::Store,
    pub(crate) cfg: &'e crate::config::EngineConfig,
}

impl Judgments<'_> {
    /// Every judged query of one part of a collection: uploaded sets and feedback merged by query text (the
    /// higher grade wins when two sources judge the same document).
    pub(crate) fn judged(&self, collection_id: i64, part: &str) -> Result<Judged> {
        let fraction = self.cfg.lifecycle.eval_fraction;
        let uploaded: Vec<(String, String, i64)> = self
            .store
            .reader()
            .prepare(
                "SELECT j.query, j.external_id, j.grade FROM judgments j JOIN judgment_sets s ON s.id = j.set_id \
                 WHERE s.collection_id = ?1 AND j.part = ?2",
            )?
            .query_map(params![collection_id, part], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        let feedback = self.feedback_rows(collection_id)?;
        Ok(merge(uploaded.iter().chain(feedback.iter().filter(|r| part_of(&r.0, fraction) == part))))
    }

    /// Clinician feedback on a collection as (query, document external id, grade) rows, both parts: of each user,
    /// only the newest `[limits] max_feedback_per_user` rows over all collections (ranked before the collection
    /// is picked, so spreading feedback over collections gains nothing). Training and evaluation both read
    /// feedback here, so one account weighs at most that much in either, whatever it clicked.
    pub(crate) fn feedback_rows(&self, collection_id: i64) -> Result<Vec<(String, String, i64)>> {
        let cap = i64::from(self.cfg.limits.max_feedback_per_user);
        Ok(self
            .store
            .reader()
            .prepare(
                "SELECT query, external_id, helpful FROM (
                     SELECT f.query, d.external_id, f.helpful, d.collection_id,
                            row_number() OVER (PARTITION BY f.username ORDER BY f.id DESC) AS newest
                     FROM feedback f JOIN documents d ON d.id = f.document_id)
                 WHERE collection_id = ?1 AND newest <= ?2",
            )?
            .query_map(params![collection_id, cap], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?)
    }
}

pub(crate) fn merge<'a>(rows: impl Iterator<Item = &'a (String, String, i64)>) -> Judged {
    let mut by_query: BTreeMap<String, Judgements> = BTreeMap::new();
    for (q, doc, grade) in rows {
        let g = by_query.entry(q.trim().to_string()).or_default().entry(doc.clone()).or_insert(0);
        *g = (*g).max(*grade as u32);
    }
    let mut j = Judged::default();
    for (i, (q, judged)) in by_query.into_iter().enumerate() {
        let id = format!("q{i}");
        j.queries.push((id.clone(), q));
        j.qrels.insert(id, judged);
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beir_upload_repeating_one_query_id_counts_it_once() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("qrels")).unwrap();
        let qrels: String = (0..50).map(|i| format!("q1\td{i}\t1\n")).collect();
        std::fs::write(d.path().join("qrels/upload.tsv"), format!("query-id\tcorpus-id\tscore\n{qrels}")).unwrap();
        let q = "{\"_id\": \"q1\", \"text\": \"二甲双胍的禁忌症\"}\n".repeat(2000);
        std::fs::write(d.path().join("queries.jsonl"), q).unwrap();
        let rows = read_rows(JudgmentSource::Beir { dir: d.path(), split: "upload" }).unwrap();
        assert_eq!(rows.len(), 50, "2,000 copies of q1 are one query with its 50 judgments");
    }

    #[test]
    fn parts_follow_the_query_text_and_the_fraction() {
        let qs: Vec<String> = (0..2000).map(|i| format!("问题 {i}")).collect();
        let eval = qs.iter().filter(|q| part_of(q, 0.3) == "eval").count();
        assert!((500..700).contains(&eval), "{eval} of 2000 in eval at 0.3");
        for q in &qs {
            assert_eq!(part_of(q, 0.3), part_of(&format!("  {}  ", q.to_uppercase()), 0.3));
        }
        assert!(qs.iter().all(|q| part_of(q, 0.0) == "train"));
    }
}
