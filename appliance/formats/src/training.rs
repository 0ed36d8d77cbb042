//! CARE training data: one JSON object per line, `{"query", "pos": [..], "neg": [..], "prompt"?, "type"?}`.
//!
//! Stage I self-pairs use `pos == [query]` and an empty `neg`; Stage II triples carry judged or mined hard
//! negatives. Readers report the line number of a malformed record instead of skipping it silently.

use std::io::BufRead;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingExample {
    pub query: String,
    pub pos: Vec<String>,
    #[serde(default)]
    pub neg: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainingDataError {
    #[error("reading training data: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
}

/// Reads every example; the first malformed line aborts with its line number.
pub fn read_examples(reader: impl BufRead) -> Result<Vec<TrainingExample>, TrainingDataError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let ex: TrainingExample =
            serde_json::from_str(&line).map_err(|e| TrainingDataError::Line { line: i + 1, message: e.to_string() })?;
        if ex.pos.is_empty() {
            return Err(TrainingDataError::Line { line: i + 1, message: "`pos` is empty".into() });
        }
        out.push(ex);
    }
    Ok(out)
}

/// One line of `train_pairs.jsonl` (the shared training set): a query, one positive, judged negatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainPair {
    pub query: String,
    pub positive: String,
    #[serde(default)]
    pub negatives: Vec<String>,
    #[serde(default)]
    pub grade: Option<u32>,
    #[serde(default)]
    pub source: Option<String>,
}

impl From<TrainPair> for TrainingExample {
    fn from(p: TrainPair) -> Self {
        TrainingExample { query: p.query, pos: vec![p.positive], neg: p.negatives, prompt: None, kind: p.source }
    }
}

/// Reads `train_pairs.jsonl` records as [`TrainingExample`]s (`kind` = the pair's `source`).
pub fn read_pairs(reader: impl BufRead) -> Result<Vec<TrainingExample>, TrainingDataError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let p: TrainPair =
            serde_json::from_str(&line).map_err(|e| TrainingDataError::Line { line: i + 1, message: e.to_string() })?;
        if p.positive.trim().is_empty() {
            return Err(TrainingDataError::Line { line: i + 1, message: "`positive` is empty".into() });
        }
        out.push(p.into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_care_layout_and_names_bad_line() {
        let ok = "{\"query\":\"q\",\"pos\":[\"q\"],\"neg\":[]}\n\n{\"query\":\"a\",\"pos\":[\"b\"],\"neg\":[\"c\"],\"prompt\":\"p\",\"type\":\"retrieval\"}\n";
        let ex = read_examples(ok.as_bytes()).unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[1].kind.as_deref(), Some("retrieval"));
        let bad = "{\"query\":\"q\",\"pos\":[\"q\"]}\n{\"query\":\"x\",\"pos\":[]}\n";
        let err = read_examples(bad.as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "line 2: `pos` is empty");
    }

    #[test]
    fn reads_train_pairs_and_names_bad_line() {
        let ok = "{\"query\":\"q\",\"positive\":\"p\",\"negatives\":[\"n1\",\"n2\"],\"grade\":3,\"source\":\"kuake_qtr:train\"}\n";
        let ex = read_pairs(ok.as_bytes()).unwrap();
        assert_eq!(ex[0].pos, vec!["p".to_string()]);
        assert_eq!(ex[0].neg.len(), 2);
        assert_eq!(ex[0].kind.as_deref(), Some("kuake_qtr:train"));
        let bad = "{\"query\":\"q\",\"positive\":\"p\"}\n{\"query\":\"q\",\"positive\":\" \"}\n";
        assert_eq!(read_pairs(bad.as_bytes()).unwrap_err().to_string(), "line 2: `positive` is empty");
    }

    #[test]
    fn reads_shared_care_samples_when_present() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/care-samples");
        let Ok(f) = std::fs::File::open(dir.join("stage2-medteb-retrieval.jsonl")) else {
            eprintln!("shared data not present; skipping");
            return;
        };
        let ex = read_examples(std::io::BufReader::new(f)).unwrap();
        assert_eq!(ex.len(), 20);
        assert!(ex.iter().all(|e| !e.neg.is_empty() && e.prompt.is_some()));
    }
}
