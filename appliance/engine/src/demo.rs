//! The demo collection compiled into the binary: original articles written for the project (see
//! `assets/demo/README.md`), loaded by `care demo` so a fresh install has something to search.

use std::path::Path;

use crate::engine::{Engine, FileReport};
use crate::error::{Error, Result};
use crate::ingest::{FileKind, parse_bytes};

include!(concat!(env!("OUT_DIR"), "/demo_articles.rs"));

pub const DEMO_COLLECTION: &str = "demo";

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
    engine.ingest_documents(DEMO_COLLECTION, &docs)
}
