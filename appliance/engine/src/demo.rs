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

/// Departments of the demo's articles by number (01–24 drug articles, 25–48 disease articles), so that the
/// search page's department, type and year filters have something to show.
const DEPARTMENTS: [&str; 48] = [
    "内分泌科",
    "心内科",
    "心内科",
    "心内科",
    "心内科",
    "心内科",
    "心内科",
    "内分泌科",
    "心内科",
    "心内科",
    "心内科",
    "消化内科",
    "药剂科",
    "药剂科",
    "感染科",
    "感染科",
    "感染科",
    "感染科",
    "风湿免疫科",
    "内分泌科",
    "呼吸内科",
    "肾内科",
    "心内科",
    "心内科",
    "内分泌科",
    "心内科",
    "心内科",
    "心内科",
    "心内科",
    "神经内科",
    "呼吸内科",
    "呼吸内科",
    "呼吸内科",
    "呼吸内科",
    "消化内科",
    "消化内科",
    "感染科",
    "消化内科",
    "肾内科",
    "风湿免疫科",
    "内分泌科",
    "内分泌科",
    "内分泌科",
    "风湿免疫科",
    "血液科",
    "精神心理科",
    "精神心理科",
    "皮肤科",
];

/// The demo article `NN-name.md`'s department, type (drug articles are 药品说明书, disease articles 指南), a
/// date spread over 2019–2024, and its issuer (this project).
fn filed_under(name: &str) -> crate::ingest::meta::DocMeta {
    let n: usize = name.get(..2).and_then(|p| p.parse().ok()).unwrap_or(0);
    crate::ingest::meta::DocMeta {
        department: DEPARTMENTS.get(n.wrapping_sub(1)).map_or(String::new(), |d| d.to_string()),
        doc_type: if n == 0 {
            String::new()
        } else if n <= 24 {
            "药品说明书".into()
        } else {
            "指南".into()
        },
        date: if n == 0 { String::new() } else { format!("{}-{:02}", 2019 + n % 6, 1 + (n * 5) % 12) },
        // Honest about where the demo's text comes from; the language is read from the text.
        issuer: if n == 0 { String::new() } else { "本项目编写（演示）".into() },
        language: String::new(),
        access: String::new(),
    }
}

/// Creates the `demo` collection if needed and (re)loads the articles; unchanged articles are no-ops.
pub fn load_demo(engine: &Engine) -> Result<FileReport> {
    match engine.indexer().create_collection(
        DEMO_COLLECTION,
        "演示数据：常见疾病与常用药物（项目编写，非医疗建议）",
        "system",
    ) {
        Ok(_) | Err(Error::CollectionExists(_)) => {}
        Err(e) => return Err(e),
    }
    let mut docs = Vec::new();
    for (name, text) in DEMO_ARTICLES {
        let parsed = parse_bytes(Path::new(&format!("demo/{name}")), FileKind::Markdown, text.as_bytes())?;
        let meta = filed_under(name);
        docs.extend(parsed.documents.into_iter().map(|mut d| {
            d.meta = meta.clone();
            d
        }));
    }
    let report = engine.indexer().ingest_documents(DEMO_COLLECTION, &docs)?;
    let admin = crate::accounts::Admin::system();
    if !engine.models().judgment_sets(&admin, Some(DEMO_COLLECTION))?.iter().any(|s| s.name == DEMO_JUDGMENTS) {
        let src = JudgmentSource::CsvText { name: "assets/demo/judgments.csv", text: JUDGMENTS_CSV };
        engine.models().import_judgments(&admin, DEMO_COLLECTION, DEMO_JUDGMENTS, src)?;
    }
    Ok(report)
}
