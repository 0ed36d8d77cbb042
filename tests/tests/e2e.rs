//! End-to-end: the real `care` binary, real SQLite and tantivy, real HTTPS.

use std::io::Write;
use std::time::{Duration, Instant};

use care_e2e::Care;

/// Deterministic pseudo-random numbers (no extra dependency; the seed is printed for reproduction).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

const WORDS: &[&str] = &[
    "糖尿病", "高血压", "二甲双胍", "胰岛素", "阿司匹林", "冠心病", "心力衰竭", "肾功能", "肝功能", "血糖",
    "血压", "治疗", "患者", "剂量", "不良反应", "禁忌症", "检查", "随访", "饮食", "运动",
];

fn write_corpus(dir: &std::path::Path, files: usize, docs_per_file: usize, seed: u64) -> Vec<std::path::PathBuf> {
    let mut rng = Lcg(seed);
    (0..files)
        .map(|f| {
            let p = dir.join(format!("part-{f:03}.jsonl"));
            let mut out = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
            for d in 0..docs_per_file {
                let n = 8 + rng.next() % 20;
                let text: Vec<&str> = (0..n).map(|_| WORDS[(rng.next() % WORDS.len() as u64) as usize]).collect();
                writeln!(out, "{{\"id\":\"f{f}-d{d}\",\"text\":\"{}。\"}}", text.join("")).unwrap();
            }
            p
        })
        .collect()
}

#[test]
fn kill_9_during_ingest_leaves_sqlite_and_index_in_agreement() {
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    // Small batches: many commits, so a kill lands between the SQLite and index commits often.
    care.env.push(("CARE__INGEST__BATCH_DOCUMENTS".into(), "50".into()));
    care.ok(&["init"]);
    care.ok(&["collection", "create", "bulk"]);
    // With the default model active, every batch is also embedded into LanceDB: three stores to keep in step.
    let e5 = care_e2e::e5s1();
    care.ok(&["model", "import-e5s1", e5.to_str().unwrap()]);
    let corpus = t.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let files = write_corpus(&corpus, 20, 100, 7);
    let mut args = vec!["ingest".to_string(), "bulk".to_string()];
    args.extend(files.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill schedule seed {seed}");
    let mut rng = Lcg(seed);
    let mut killed_mid_way = 0;
    for round in 0..4 {
        let mut child = care.command(&args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        let delay = Duration::from_millis(300 + rng.next() % 4000);
        let started = Instant::now();
        while started.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            killed_mid_way += 1;
        }
        child.wait().unwrap();
        // Opening the data directory repairs whatever the kill interrupted; `check` compares ids exactly.
        let report = care.json(&["check"]);
        eprintln!("round {round} after {delay:?}: {report}");
        assert_eq!(report["consistent"], true, "{report}");
    }
    assert!(killed_mid_way > 0, "no round was killed mid-ingest; the test proved nothing");
    // Finishing the ingest yields every document exactly once.
    let out = care.run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = care.json(&["check"]);
    assert_eq!(report["consistent"], true, "{report}");
    let stats = care.json(&["stats"]);
    assert_eq!(stats["documents"], 2000, "{stats}");
    assert_eq!(stats["chunks"], stats["lexical_docs"], "{stats}");
    assert_eq!(stats["pending_documents"], 0);
    assert_eq!(report["dense_vectors"], stats["chunks"], "{report}");
}

#[test]
fn cli_reports_bad_input_specifically() {
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    care.ok(&["init"]);
    let good = t.path().join("good.txt");
    std::fs::write(&good, "慢性阻塞性肺疾病患者应戒烟。").unwrap();
    let out = care.run(&["ingest", "nosuch", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("collection 'nosuch' does not exist"), "{err}");

    let bad = t.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\":\"ok\"}\nnot json\n").unwrap();
    let out = care.run(&["ingest", "--create", "c", bad.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "partial failure exits 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FAILED") && err.contains("bad.jsonl:2:"), "{err}");
    let hits = care.json(&["search", "--json", "戒烟"]);
    assert_eq!(hits["hits"][0]["external_id"], "good.txt");
}

#[test]
fn https_search_api_and_page_on_the_demo() {
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    let out = care.run(&["demo", "--no-serve"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The API needs a caller: an administrator's API token, as a machine client would use.
    let pw = t.path().join("admin.pw");
    std::fs::write(&pw, "demo-admin-passphrase").unwrap();
    care.ok(&["user", "add", "admin", "--role", "admin", "--password-file", pw.to_str().unwrap()]);
    let token = care.ok(&["user", "token", "admin", "--name", "e2e"]).trim().to_string();
    let (_server, base) = care.serve();
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    let client = reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .default_headers(headers)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    let r = client.get(format!("{base}/api/v1/search")).query(&[("q", "二甲双胍的禁忌症")]).send().unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["method"], "weighted", "the demo serves hybrid search with the default model");
    let top = &body["hits"][0];
    assert!(top["title"].as_str().unwrap().contains("二甲双胍"), "{top}");
    assert!(top["parts"]["dense_rank"].is_number() && top["parts"]["bm25_rank"].is_number(), "{top}");
    assert!(top["heading"].as_str().unwrap().contains("禁忌"), "{top}");
    let hits = body["hits"].as_array().unwrap();
    assert!(hits.iter().any(|h| !h["highlights"].as_array().unwrap().is_empty()), "{body}");

    let r = client.get(format!("{base}/search")).query(&[("q", "二甲双胍的禁忌症")]).send().unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers().get("content-security-policy").unwrap().to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'self'"));
    let html = r.text().unwrap();
    assert!(html.contains("<mark>") && html.contains("二甲双胍"), "{html}");

    let r = client.get(format!("{base}/api/v1/search")).query(&[("q", "x"), ("collection", "nosuch")]).send().unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["code"], "not_found");

    let r = client.get(format!("{base}/api/v1/search")).query(&[("q", "  ")]).send().unwrap();
    assert_eq!(r.status(), 400);

    // TLS is the only way in: a plain-HTTP request to the same port gets no HTTP answer.
    let plain = base.replace("https://", "http://");
    let r = reqwest::blocking::Client::new().get(format!("{plain}/healthz")).timeout(Duration::from_secs(5)).send();
    assert!(r.map(|r| !r.status().is_success()).unwrap_or(true));
}
