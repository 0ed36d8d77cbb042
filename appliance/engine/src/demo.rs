//! The demo collection compiled into the binary: original articles written for the project (see
//! `assets/demo/README.md`), loaded by `care demo` so a fresh install has something to search.

use std::path::Path;

use crate::engine::{Engine, FileReport};
use crate::error::{Error, Result};
use crate::ingest::{FileKind, parse_bytes};
use crate::judgments::JudgmentSource;

include!(concat!(env!("OUT_DIR"), "/demo_articles.rs"));

pub const DEMO_COLLECTION: &str = "demo";
/// The demo's judgment set: queries written for the project with the article that answers each, so a new admin
/// can evaluate models and run a retraining on the demo (the collection still has to be approved for training).
pub const DEMO_JUDGMENTS: &str = "demo-judgments";
const JUDGMENTS_CSV: &str = include_str!("../assets/demo/judgments.csv");

/// Creates the `demo` collection if needed and (re)loads the articles; unchanged articles are no-ops.
pub fn load_demo(engine: &Engine) -> Result<FileReport> {
    match engine.create_collection(DEMO_COLLECTION, "演示数据：常见疾病与常用药物（项目编写，非医疗建议）", "system")
    {
        Ok(_) | Err(Error::CollectionExists(_)) => {}
        Err(e) => return Err(e),
    }
    let mut docs = Vec::new();
    for (name, text) in DEMO_ARTICLES {
        let parsed = parse_bytes(Path::new(&format!("demo/{name}")), FileKind::Markdown, text.as_bytes())?;
        docs.extend(parsed.documents);
    }
    let report = engine.ingest_documents(DEMO_COLLECTION, &docs)?;
    let admin = crate::accounts::Admin::system();
    if !engine.models().judgment_sets(&admin, Some(DEMO_COLLECTION))?.iter().any(|s| s.name == DEMO_JUDGMENTS) {
        let src = JudgmentSource::CsvText { name: "assets/demo/judgments.csv", text: JUDGMENTS_CSV };
        engine.models().import_judgments(&admin, DEMO_COLLECTION, DEMO_JUDGMENTS, src)?;
    }
    Ok(report)
}
