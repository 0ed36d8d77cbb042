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
    "糖尿病",
    "高血压",
    "二甲双胍",
    "胰岛素",
    "阿司匹林",
    "冠心病",
    "心力衰竭",
    "肾功能",
    "肝功能",
    "血糖",
    "血压",
    "治疗",
    "患者",
    "剂量",
    "不良反应",
    "禁忌症",
    "检查",
    "随访",
    "饮食",
    "运动",
];

/// One round's upload of exactly 1,000 documents in 10 files of three formats: 8 JSONL files of 100 records, a CSV
/// of 100 rows and a ZIP of 100 Markdown files. Every round edits a different fifth of the documents (their text
/// carries `roundmarker<r>`), so each job has real work (replacements re-embedded) besides unchanged documents.
fn write_round(dir: &std::path::Path, round: u64) -> Vec<std::path::PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let text = |doc: u64| -> String {
        let mut rng = Lcg(doc * 7919 + 1);
        let n = 8 + rng.next() % 20;
        let words: Vec<&str> = (0..n).map(|_| WORDS[(rng.next() % WORDS.len() as u64) as usize]).collect();
        // The last round that edited this document decides its text.
        let edited = (1..=round).rev().find(|r| doc % 5 == r % 5);
        match edited {
            Some(r) => format!("{}。roundmarker{r} 第{r}轮修订。", words.join("")),
            None => format!("{}。", words.join("")),
        }
    };
    let mut files = Vec::new();
    for f in 0..8u64 {
        let p = dir.join(format!("part-{f}.jsonl"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
        for d in 0..100 {
            let doc = f * 100 + d;
            writeln!(out, "{{\"id\":\"d{doc}\",\"text\":\"{}\"}}", text(doc)).unwrap();
        }
        files.push(p);
    }
    let csv = dir.join("bank.csv");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&csv).unwrap());
    writeln!(out, "id,title,text").unwrap();
    for doc in 800..900 {
        writeln!(out, "d{doc},问答{doc},{}", text(doc)).unwrap();
    }
    drop(out);
    files.push(csv);
    let mut w = ZipOut { path: dir.join("guides.zip"), data: Vec::new(), central: Vec::new(), count: 0 };
    for doc in 900..1000u64 {
        w.add(&format!("指南/d{doc}.md"), format!("# 指南{doc}\n## 要点\n{}", text(doc)).as_bytes());
    }
    files.push(w.finish());
    files
}

/// A tiny ZIP writer (stored, no compression, UTF-8 names) so the test crate needs no zip dependency.
struct ZipOut {
    path: std::path::PathBuf,
    data: Vec<u8>,
    central: Vec<u8>,
    count: u16,
}

impl ZipOut {
    fn add(&mut self, name: &str, body: &[u8]) {
        let crc = crc32(body);
        let offset = self.data.len() as u32;
        let n = name.as_bytes();
        let size = (body.len() as u32).to_le_bytes();
        self.data.extend_from_slice(&0x04034b50u32.to_le_bytes());
        self.data.extend_from_slice(&[20, 0, 0, 0x08, 0, 0, 0, 0, 0, 0]); // version, flags (UTF-8), stored, time, date
        self.data.extend_from_slice(&crc.to_le_bytes());
        self.data.extend_from_slice(&size);
        self.data.extend_from_slice(&size);
        self.data.extend_from_slice(&(n.len() as u16).to_le_bytes());
        self.data.extend_from_slice(&0u16.to_le_bytes());
        self.data.extend_from_slice(n);
        self.data.extend_from_slice(body);
        self.central.extend_from_slice(&0x02014b50u32.to_le_bytes());
        self.central.extend_from_slice(&[20, 0, 20, 0, 0, 0x08, 0, 0, 0, 0, 0, 0]);
        self.central.extend_from_slice(&crc.to_le_bytes());
        self.central.extend_from_slice(&size);
        self.central.extend_from_slice(&size);
        self.central.extend_from_slice(&(n.len() as u16).to_le_bytes());
        self.central.extend_from_slice(&[0; 8]); // extra, comment, disk, internal attributes
        self.central.extend_from_slice(&0u32.to_le_bytes()); // external attributes
        self.central.extend_from_slice(&offset.to_le_bytes());
        self.central.extend_from_slice(n);
        self.count += 1;
    }

    fn finish(mut self) -> std::path::PathBuf {
        let (cd_offset, cd_len) = (self.data.len() as u32, self.central.len() as u32);
        let central = std::mem::take(&mut self.central);
        self.data.extend_from_slice(&central);
        self.data.extend_from_slice(&0x06054b50u32.to_le_bytes());
        self.data.extend_from_slice(&[0, 0, 0, 0]);
        self.data.extend_from_slice(&self.count.to_le_bytes());
        self.data.extend_from_slice(&self.count.to_le_bytes());
        self.data.extend_from_slice(&cd_len.to_le_bytes());
        self.data.extend_from_slice(&cd_offset.to_le_bytes());
        self.data.extend_from_slice(&0u16.to_le_bytes());
        std::fs::write(&self.path, &self.data).unwrap();
        self.path
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// The crash test: 20 rounds of a 1,000-document ingest job, each `care ingest` killed (SIGKILL) at a random
/// point, then restarted with `care jobs run`. After every restart the job has completed and SQLite, tantivy and
/// LanceDB hold exactly the same chunks: 1,000 documents, no duplicates, the round's edits in place.
#[test]
fn kill_9_during_ingest_jobs_resumes_without_duplicates() {
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    // Small batches: many commit points for a kill to land between (SQLite, tantivy, LanceDB, confirmation).
    care.env.push(("CARE__INGEST__BATCH_DOCUMENTS".into(), "100".into()));
    care.ok(&["init"]);
    care.ok(&["collection", "create", "bulk"]);
    // With the default model active, every batch is also embedded into LanceDB: three stores to keep in step.
    let e5 = care_e2e::e5s1();
    care.ok(&["model", "import-e5s1", e5.to_str().unwrap()]);
    let upload = t.path().join("upload");

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill schedule seed {seed}");
    let mut rng = Lcg(seed);
    let (mut killed_running, mut interrupted_jobs) = (0, 0);
    let started = Instant::now();
    // CI runs the short form (CI time is a budget); the full form is CARE_KILL_ROUNDS=20.
    let rounds: u64 = std::env::var("CARE_KILL_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    for round in 0..rounds {
        let files = write_round(&upload, round);
        let mut args = vec!["ingest".to_string(), "bulk".to_string()];
        args.extend(files.iter().map(|p| p.display().to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = care
            .command(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Round 0 embeds all 1,000 documents; later rounds re-embed the 200 edited ones.
        let window = if round == 0 { 6000 } else { 2500 };
        let delay = Duration::from_millis(150 + rng.next() % window);
        let t0 = Instant::now();
        while t0.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            killed_running += 1;
        }
        child.wait().unwrap();
        let job_id = (round + 1).to_string();
        let listed = care.ok(&["jobs", "list", "-n", "100"]);
        if listed.lines().count() < round as usize + 1 {
            // Killed before the job was even queued: submit it again, this time to the end.
            care.run(&args);
        } else if !listed.lines().next().unwrap_or("").contains("\tdone\t") {
            interrupted_jobs += 1;
        }
        // The restart: run whatever is queued, resuming the interrupted job.
        care.ok(&["jobs", "run"]);
        let shown = care.json(&["jobs", "show", &job_id]);
        assert_eq!(shown["job"]["state"], "done", "round {round}: {shown}");
        assert_eq!(shown["job"]["progress_done"], 10, "round {round}: {shown}");
        assert_eq!(shown["job"]["errors"].as_array().unwrap().len(), 0, "round {round}: {shown}");
        let report = care.json(&["check"]);
        assert_eq!(report["consistent"], true, "round {round}: {report}");
        let stats = care.json(&["stats"]);
        assert_eq!(stats["documents"], 1000, "round {round}: {stats}");
        assert_eq!(stats["chunks"], stats["lexical_docs"], "round {round}: {stats}");
        assert_eq!(report["dense_vectors"], stats["chunks"], "round {round}: {report}");
        assert_eq!(report["duplicates_in_index"], 0);
        assert_eq!(report["dense_duplicates"], 0);
        assert_eq!(stats["pending_documents"], 0);
        if round > 0 {
            // The round's edits are what is indexed: its marker finds edited documents only.
            let hits =
                care.json(&["search", "--json", "-n", "100", "--method", "bm25", &format!("roundmarker{round}")]);
            let ids: Vec<u64> = hits["hits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    let id = h["external_id"].as_str().unwrap();
                    let d = id.rsplit('/').next().unwrap().trim_start_matches('d').trim_end_matches(".md");
                    d.parse().unwrap()
                })
                .collect();
            assert!(!ids.is_empty() && ids.iter().all(|d| d % 5 == round % 5), "round {round}: {ids:?}");
        }
        eprintln!("round {round}: kill after {delay:?}; consistent ({:.0} s so far)", started.elapsed().as_secs_f64());
    }
    eprintln!(
        "{rounds} rounds in {:.1} s; {killed_running} kills hit a running process, {interrupted_jobs} interrupted a job",
        started.elapsed().as_secs_f64()
    );
    assert!(
        killed_running * 2 >= rounds,
        "only {killed_running} of {rounds} kills hit a running ingest; the test proved little"
    );
    assert!(interrupted_jobs * 4 >= rounds, "only {interrupted_jobs} kills interrupted a job mid-way");

    // The same 1,000 documents, now a blue/green promotion submitted to `care serve` as a job, and the server
    // killed while the job embeds them for a document model of another pairing: the old pair stays live and
    // consistent, and the restarted server resumes the job and finishes it.
    let pkg = t.path().join("bg");
    std::fs::create_dir_all(&pkg).unwrap();
    let live = care.data_dir.join("models/e5-small/1");
    for f in std::fs::read_dir(&live).unwrap() {
        let f = f.unwrap();
        if f.file_name() != "manifest.toml" {
            std::fs::hard_link(f.path(), pkg.join(f.file_name())).unwrap();
        }
    }
    let manifest: String = std::fs::read_to_string(live.join("manifest.toml"))
        .unwrap()
        .lines()
        .map(|l| match l {
            _ if l.starts_with("name = ") => "name = \"e5-bg\"".to_string(),
            _ if l.starts_with("pairing_id = ") => "pairing_id = \"blue-green\"".to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(pkg.join("manifest.toml"), manifest).unwrap();
    care.ok(&["model", "import", pkg.to_str().unwrap()]);
    care_e2e::add_user(&care, t.path(), "ops", "admin", "ops-password-123");
    let bearer = format!("Bearer {}", care_e2e::token(&care, "ops", "e2e"));
    let client = care_e2e::https_client();
    let (mut server, url) = care.serve();
    let resp = client
        .post(format!("{url}/api/v1/admin/models/promote"))
        .header("Authorization", &bearer)
        .json(&serde_json::json!({"candidate": "e5-bg@1", "override_reason": "crash test"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "{:?}", resp.text());
    let job = resp.json::<serde_json::Value>().unwrap()["job"].as_i64().unwrap();
    let job_state = |url: &str| care_e2e::get_json(&client, &format!("{url}/api/v1/admin/jobs/{job}"), &bearer);
    let until = Instant::now() + Duration::from_secs(60);
    let mut seen = job_state(&url);
    while seen["progress_done"].as_i64().unwrap_or(0) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        seen = job_state(&url);
    }
    assert_eq!(seen["state"], "running", "the job embeds: {seen}");
    server.0.kill().unwrap(); // SIGKILL
    server.0.wait().unwrap();
    let history = care.ok(&["model", "history"]);
    assert!(history.lines().next().unwrap().contains("e5-small@1 , e5-small@1"), "old pair live: {history}");
    let report = care.json(&["check"]);
    assert_eq!(report["consistent"], true, "after the killed promotion: {report}");
    let (_server, url) = care.serve();
    let until = Instant::now() + Duration::from_secs(600);
    let mut end = job_state(&url);
    while end["state"] != "done" && Instant::now() < until {
        assert!(end["state"] == "queued" || end["state"] == "running", "resumed job: {end}");
        std::thread::sleep(Duration::from_millis(200));
        end = job_state(&url);
    }
    assert_eq!(end["result"]["live"], "e5-bg@1,e5-bg@1", "{end}");
    let history = care.ok(&["model", "history"]);
    assert!(history.lines().next().unwrap().contains("e5-bg@1 , e5-bg@1"), "promoted: {history}");
    let report = care.json(&["check"]);
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(report["dense_vectors"], 1000, "{report}");
    eprintln!(
        "promotion job killed at {}/{} documents embedded; the old pair stayed live, the restarted server resumed it",
        seen["progress_done"], seen["progress_total"]
    );
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
    assert!(err.contains("资料库 nosuch 不存在"), "{err}");

    let bad = t.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\":\"ok\"}\nnot json\n").unwrap();
    let out = care.run(&["ingest", "--create", "c", bad.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "partial failure exits 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FAILED") && err.contains("bad.jsonl 第 2 行"), "{err}");
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
    care.ok(&["user", "add", "admin", "--role", "admin", "--password-file", pw.to_str().unwrap(), "--permanent"]);
    let token = care.ok(&["user", "token", "admin", "--name", "e2e"]).trim().to_string();
    let (_server, base) = care.serve();
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    let client = reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .default_headers(headers)
        // The first query loads the ONNX encoder: in a debug build on 2 cores shared with other tests that alone
        // has taken over 30 s.
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap();

    let r = client.get(format!("{base}/api/v1/search")).query(&[("q", "二甲双胍的禁忌症")]).send().unwrap();
    assert_eq!(r.status(), 200);
    // Server-Timing splits the request for `care-bench --http`: the token check inside the server's whole time,
    // which holds the engine's own.
    let timing = r.headers().get("server-timing").unwrap().to_str().unwrap().to_string();
    let dur = |name: &str| -> f64 {
        let part = timing.split(", ").find_map(|p| p.strip_prefix(name)?.strip_prefix(";dur="));
        part.unwrap_or_else(|| panic!("{name} in {timing}")).parse().unwrap()
    };
    let body: serde_json::Value = r.json().unwrap();
    assert!(dur("auth") > 0.0 && dur("auth") + body["took_ms"].as_f64().unwrap() <= dur("app"), "{timing} {body}");
    // And the search pipeline's stages, which together stay within the engine's own time.
    let stages = ["understand", "encode", "bm25", "dense", "fuse", "evidence", "facets", "snippets"];
    let sum: f64 = stages.iter().map(|s| dur(s)).sum();
    assert!(dur("encode") > 0.0 && sum <= body["took_ms"].as_f64().unwrap() + 0.01, "{timing} {body}");
    assert!(dur("bm25") > 0.0 && dur("dense") > 0.0 && dur("fuse") > 0.0, "both legs ran and were fused: {timing}");
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

/// A small approved kuake_qtr collection with judgments, the 4-layer query encoder that `packaging/dev.sh test`
/// exports (CARE_TRAINER_EXPORT) live beside the full e5-small document encoder.
fn training_site(care: &Care, dir: &std::path::Path, l4: &std::path::Path) {
    let set = care_e2e::shared().join("data/retrieval/kuake_qtr");
    let queries: Vec<(String, String)> = std::fs::read_to_string(set.join("queries.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["id"].as_str().unwrap().to_string(), v["text"].as_str().unwrap().to_string())
        })
        .collect();
    let mut qrels: Vec<(String, String, String)> = Vec::new();
    for l in std::fs::read_to_string(set.join("qrels/dev.tsv")).unwrap().lines().skip(1) {
        let f: Vec<&str> = l.split('\t').collect();
        if qrels.iter().map(|q| &q.0).collect::<std::collections::HashSet<_>>().len() >= 150
            && !qrels.iter().any(|q| q.0 == f[0])
        {
            continue;
        }
        qrels.push((f[0].to_string(), f[1].to_string(), f[2].to_string()));
    }
    let judged: std::collections::HashSet<&str> = qrels.iter().map(|q| q.1.as_str()).collect();
    let corpus = dir.join("corpus.jsonl");
    let mut out = std::fs::File::create(&corpus).unwrap();
    for (i, line) in std::fs::read_to_string(set.join("corpus.jsonl")).unwrap().lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if i < 500 || judged.contains(v["id"].as_str().unwrap()) {
            writeln!(out, "{line}").unwrap();
        }
    }
    let csv = dir.join("judgments.csv");
    let mut w = std::fs::File::create(&csv).unwrap();
    writeln!(w, "query,id,grade").unwrap();
    for (q, d, g) in &qrels {
        let text = &queries.iter().find(|x| &x.0 == q).unwrap().1;
        writeln!(w, "\"{}\",{d},{g}", text.replace('"', "\"\"")).unwrap();
    }
    care.ok(&["init"]);
    care.ok(&["collection", "create", "kuake"]);
    care.ok(&["model", "import-e5s1", care_e2e::e5s1().to_str().unwrap()]);
    care.ok(&["ingest", "kuake", corpus.to_str().unwrap()]);
    care.ok(&["model", "import", l4.to_str().unwrap()]);
    care.ok(&["model", "activate", "--query", "e5-small-l4", "--document", "e5-small"]);
    care.ok(&["collection", "approve", "kuake"]);
    care.ok(&["judgments", "import", "kuake", "dev150", "--csv", csv.to_str().unwrap()]);
}

/// The kill -9 tests' site: [`training_site`] with the trainer that `packaging/dev.sh test` builds (CARE_TRAIN_BIN),
/// `env` on top of the trainer's settings, and an admin's bearer token. None, the test skipped, without the trainer.
fn trainer_care(env: &[(&str, &str)]) -> Option<(tempfile::TempDir, Care, String)> {
    let (Some(bin), Some(l4)) = (std::env::var_os("CARE_TRAIN_BIN"), std::env::var_os("CARE_TRAINER_EXPORT")) else {
        eprintln!("CARE_TRAIN_BIN / CARE_TRAINER_EXPORT not set (packaging/dev.sh test sets them); skipping");
        return None;
    };
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    care.use_trainer(&bin);
    care.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    training_site(&care, t.path(), std::path::Path::new(&l4));
    care_e2e::add_user(&care, t.path(), "ops", "admin", "ops-password-123");
    let bearer = format!("Bearer {}", care_e2e::token(&care, "ops", "e2e"));
    Some((t, care, bearer))
}

/// Issue 16's crash test: `kill -9` of `care serve` while Stage I trains. The trainer dies with the server (no
/// orphan keeps writing into the run folder), the restarted server resumes Stage I from its last checkpoint, and
/// the finished query encoder is byte for byte the one an uninterrupted run of the same recipe produces.
#[test]
fn kill_9_of_care_serve_mid_training_resumes_and_equals_an_uninterrupted_run() {
    let Some((_t, care, bearer)) = trainer_care(&[]) else { return };
    let client = care_e2e::https_client();
    // Kept for the admin to judge (promote: false), so the second run starts from the same live pair.
    let recipe = serde_json::json!({"stage1_steps": 30, "stage2_steps": 6, "batch_size": 16, "stage2_batch_size": 4,
        "stage1_max_texts": 600, "stage2_max_groups": 60, "lr": 5e-4, "stage1_lr": 5e-4, "checkpoint_every": 10,
        "promote": false});
    let submit = |url: &str| -> i64 {
        let resp = client
            .post(format!("{url}/api/v1/admin/training/runs"))
            .header("Authorization", &bearer)
            .json(&recipe)
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 202, "{:?}", resp.text());
        resp.json::<serde_json::Value>().unwrap()["job"].as_i64().unwrap()
    };
    let get = |url: &str, path: &str| care_e2e::get_json(&client, &format!("{url}{path}"), &bearer);
    let run = |url: &str, job: i64| get(url, &format!("/api/v1/admin/training/runs/{job}"));
    let until_finished = |url: &str, job: i64| -> serde_json::Value {
        let until = Instant::now() + Duration::from_secs(900);
        loop {
            let r = run(url, job);
            if r["state"] == "done" || r["state"] == "failed" || r["state"] == "cancelled" {
                return r;
            }
            assert!(Instant::now() < until, "training run {job} did not finish: {r}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let models_before = care.ok(&["model", "list"]);
    // A disk that cannot hold the run (here: more kept free than any disk has) refuses it before anything is queued.
    let full = care.command(&["train", "run"]).env("CARE__TRAINING__KEEP_FREE_GB", "1000000").output().unwrap();
    let said = String::from_utf8_lossy(&full.stderr);
    assert!(!full.status.success() && said.contains("磁盘空间不足"), "{said}");
    assert!(!care.ok(&["train", "list"]).contains("queued"), "a refused run was queued");
    // Said before a run is started: `care train status` (and the 训练 page, the API) compare free and needed space.
    assert!(care.ok(&["train", "status"]).contains("磁盘：剩余"));
    let short = care.command(&["train", "status"]).env("CARE__TRAINING__KEEP_FREE_GB", "1000000").output().unwrap();
    let said = String::from_utf8_lossy(&short.stdout);
    assert!(short.status.code() == Some(2) && said.contains("磁盘空间不足"), "{said}");

    let (mut server, url) = care.serve();
    let page = get(&url, "/api/v1/admin/training");
    let (needed, reserve) =
        (page["disk"]["needed_bytes"].as_u64().unwrap(), page["disk"]["reserve_bytes"].as_u64().unwrap());
    // The tests keep no reserve (tests/src/lib.rs): what is needed is the run's own weights.
    assert!(needed > 1 << 20 && reserve == 0, "a run needs the live query encoder's weights: {}", page["disk"]);
    let job = submit(&url);
    let run_dir = care.data_dir.join("train").join(format!("run-{job}"));
    let ckpts = run_dir.join("stage1/checkpoints");
    let finished_checkpoint = || {
        std::fs::read_dir(&ckpts)
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| d.path().join("state.json").exists() && !d.file_name().to_string_lossy().ends_with(".tmp"))
    };
    let until = Instant::now() + Duration::from_secs(600);
    while !finished_checkpoint() {
        assert!(Instant::now() < until, "no Stage I checkpoint: {}", run(&url, job));
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = run(&url, job);
    assert_eq!(seen["state"], "running", "{seen}");
    server.0.kill().unwrap(); // SIGKILL
    server.0.wait().unwrap();
    // The trainer went with the server: the metrics log stops growing.
    let metrics = run_dir.join("stage1/metrics.jsonl");
    let len = || std::fs::metadata(&metrics).map_or(0, |m| m.len());
    std::thread::sleep(Duration::from_secs(1));
    let before = len();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(len(), before, "care-train kept training after its server was killed");
    assert_eq!(care.ok(&["model", "list"]), models_before, "nothing registered before the export");

    let (_server, url) = care.serve();
    let first = until_finished(&url, job);
    assert_eq!(first["state"], "done", "{first}");
    let log = std::fs::read_to_string(run_dir.join("logs/stage1.log")).unwrap();
    assert!(log.contains("resumed from step"), "Stage I did not resume from its checkpoint: {log}");
    let job2 = submit(&url);
    let second = until_finished(&url, job2);
    assert_eq!(second["state"], "done", "{second}");
    let run2 = care.data_dir.join("train").join(format!("run-{job2}"));
    // Same data, then the same weights.
    for f in ["corpus.jsonl", "stage2.jsonl"] {
        assert!(std::fs::read(run_dir.join(f)).unwrap() == std::fs::read(run2.join(f)).unwrap(), "{f} differs");
    }
    // An ended run keeps its data, logs and metrics; its weights went into the candidate package (and the disk).
    assert!(run_dir.join("logs/stage1.log").exists() && run_dir.join("stage1/metrics.jsonl").exists());
    for d in ["stage1/query", "stage2/query", "merged", "export"] {
        let left: Vec<_> = std::fs::read_dir(run_dir.join(d))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|x| x == "safetensors" || x == "onnx"))
            .collect();
        assert!(left.is_empty(), "an ended run kept its weights: {left:?}");
    }
    assert!(!run_dir.join("stage1/checkpoints").exists(), "an ended run kept its checkpoints");
    let package = |r: &serde_json::Value| {
        let spec = r["candidate"].as_str().expect("a candidate").split(',').next().unwrap().to_string();
        let (name, version) = spec.split_once('@').unwrap();
        care.data_dir.join("models").join(name).join(version)
    };
    let (p1, p2) = (package(&first), package(&second));
    assert_ne!(p1, p2);
    let mut compared = 0;
    for f in ["model.safetensors", "config.json", "tokenizer.json"] {
        let (a, b) = (std::fs::read(p1.join(f)).unwrap(), std::fs::read(p2.join(f)).unwrap());
        assert!(a == b, "{f} differs between the resumed and the uninterrupted run's candidates");
        compared += 1;
    }
    let evaluations = get(&url, "/api/v1/admin/models/evaluations");
    // Each query graph's nDCG@10: the headline figure is the graph the gate chose, and that choice weighs measured
    // encoding times, which a busy machine can tip either way between two runs of the same weights.
    let ndcg = |r: &serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value)> {
        let id = r["evaluation"].as_i64().expect("evaluated");
        let e = evaluations.as_array().unwrap().iter().find(|e| e["report"]["id"] == id).expect("its report");
        let graphs = e["report"]["graphs"].as_array().cloned().unwrap_or_default();
        if graphs.is_empty() {
            return vec![(serde_json::Value::Null, e["report"]["overall_ndcg_at_10"]["candidate"].clone())];
        }
        graphs.iter().map(|g| (g["graph"].clone(), g["ndcg_at_10"].clone())).collect()
    };
    assert_eq!(ndcg(&first), ndcg(&second));
    eprintln!(
        "killed at {}; resumed run and uninterrupted run: same data, same {compared} files, nDCG@10 {:?} / {:?}; phases {} / {}",
        seen["stage"],
        ndcg(&first),
        ndcg(&second),
        first["phases"],
        second["phases"]
    );
}

/// Issue 33's crash test: `kill -9` of `care serve` while a both-sides run re-embeds the collection into the
/// candidate document model's own tables. The restarted server resumes the re-embedding from the vectors written
/// (the phase's total is then what was left), the run promotes, and SQLite and the new tables agree with no
/// duplicate vector.
#[test]
fn kill_9_during_both_sides_re_embedding_resumes_from_the_vectors_written() {
    // The gate is not what this test is about: a few steps on 150 judged queries cannot show a gain.
    let gate = [("CARE__LIFECYCLE__GATE_MARGIN", "-1.0"), ("CARE__LIFECYCLE__MAX_COLLECTION_LOSS", "1.0")];
    let Some((_t, care, bearer)) = trainer_care(&gate) else { return };
    // A symmetric live pair: the document side that Stage II trains is the full e5-small.
    care.ok(&["model", "activate", "--query", "e5-small", "--document", "e5-small"]);
    let client = care_e2e::https_client();
    let recipe = serde_json::json!({"sides": "both", "stage2_steps": 4, "stage2_batch_size": 4,
        "stage2_max_groups": 40, "lr": 5e-4, "checkpoint_every": 2, "merge_ratio": 0.5});
    let run =
        |url: &str, job: i64| care_e2e::get_json(&client, &format!("{url}/api/v1/admin/training/runs/{job}"), &bearer);
    let finished = |r: &serde_json::Value| ["done", "failed", "cancelled"].iter().any(|s| r["state"] == *s);
    // (done, total) of the re-embedding phase ("重新生成文档向量", then "嵌入 kuake" per batch written), once seen.
    let mut in_phase = false;
    let mut embedding = |r: &serde_json::Value| -> Option<(u64, u64)> {
        let stage = r["stage"].as_str().unwrap_or_default();
        in_phase = (in_phase || stage == "重新生成文档向量") && !stage.starts_with("评测");
        let (done, total) = (r["progress_done"].as_u64()?, r["progress_total"].as_u64()?);
        (in_phase && stage.starts_with("嵌入") && total > 0).then_some((done, total))
    };

    let (mut server, url) = care.serve();
    let resp = client
        .post(format!("{url}/api/v1/admin/training/runs"))
        .header("Authorization", &bearer)
        .json(&recipe)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "{:?}", resp.text());
    let job = resp.json::<serde_json::Value>().unwrap()["job"].as_i64().unwrap();
    let until = Instant::now() + Duration::from_secs(900);
    let (written, total) = loop {
        let r = run(&url, job);
        assert!(!finished(&r), "the run ended before its re-embedding was seen: {r}");
        assert!(Instant::now() < until, "no re-embedding within 900 s: {r}");
        match embedding(&r) {
            Some((done, total)) if done > 0 && done < total => break (done, total),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    server.0.kill().unwrap(); // SIGKILL, between two batches' writes or in the middle of one
    server.0.wait().unwrap();

    let (_server, url) = care.serve();
    let until = Instant::now() + Duration::from_secs(900);
    let mut resumed = None;
    let last = loop {
        let r = run(&url, job);
        if resumed.is_none() {
            resumed = embedding(&r);
        }
        if finished(&r) {
            break r;
        }
        assert!(Instant::now() < until, "the resumed run did not finish: {r}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(last["state"], "done", "{last}");
    assert_eq!(last["decision"], "promoted", "{last}");
    let (_, left) = resumed.expect("the restarted run was not seen re-embedding");
    assert!(
        left + written <= total,
        "the restart re-embedded {left} of {total} documents ({written} were written before)"
    );
    // The promoted document model is live and its tables hold every chunk exactly once.
    let check: serde_json::Value = serde_json::from_str(&care.ok(&["check"])).unwrap();
    assert_eq!(check["consistent"], true, "{check}");
    assert_eq!(check["dense_duplicates"], 0, "{check}");
    assert!(care.ok(&["model", "list"]).contains(&format!("e5-small-r{job}-doc")));
    eprintln!(
        "killed after {written} of {total} documents re-embedded; the restart re-embedded {left}; {}",
        last["phases"]
    );
}

/// Searches `base` with `token` from `clients` threads until `stop`, returning (searches, failures).
fn searching(
    base: &str,
    token: &str,
    clients: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<(u64, Vec<String>)>> {
    (0..clients)
        .map(|i| {
            let (base, token, stop) = (base.to_string(), token.to_string(), stop.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder()
                    .danger_accept_invalid_certs(true)
                    .timeout(Duration::from_secs(180))
                    .build()
                    .unwrap();
                let (mut n, mut failed) = (0u64, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let q = WORDS[(i + n as usize) % WORDS.len()];
                    match client.get(format!("{base}/api/v1/search")).bearer_auth(&token).query(&[("q", q)]).send() {
                        Ok(r) if r.status() == 200 => {}
                        Ok(r) => failed.push(format!("{q}: {}", r.status())),
                        Err(e) => failed.push(format!("{q}: {e}")),
                    }
                    n += 1;
                }
                (n, failed)
            })
        })
        .collect()
}

/// The ids a CLI search of `q` returns from `care`'s data directory, in order, with their scores.
fn cli_ranking(care: &Care, q: &str) -> Vec<(String, String)> {
    let v = care.json(&["search", q, "--json", "-n", "10"]);
    v["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["external_id"].as_str().unwrap().to_string(), format!("{:.5}", h["score"].as_f64().unwrap())))
        .collect()
}

#[test]
fn backups_while_serving_restore_identically_and_kill_9_never_leaves_a_listed_backup() {
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    // BM25 only: with the default model each backup also archives its 470 MB graph, which the package test covers
    // (`packaging/deb-test.sh` backs up and restores the demo with the packaged model). No model is imported at start.
    care.env.push(("CARE__MODEL__DEFAULT_MODEL".into(), "/nonexistent/e5-small-q4.bin".into()));
    care.ok(&["init"]);
    care.ok(&["collection", "create", "demo"]);
    let guides: Vec<String> = [
        ("metformin.md", "# 二甲双胍\n\n## 禁忌症\n\n严重肾功能不全、酮症酸中毒患者禁用二甲双胍。\n"),
        ("pregnancy.md", "# 孕妇用药\n\n孕妇应避免使用四环素类抗生素，用药前请咨询医生。\n"),
        ("aspirin.md", "# 阿司匹林\n\n阿司匹林用于冠心病二级预防，每日剂量75到100毫克。\n"),
    ]
    .iter()
    .map(|(n, text)| care_e2e::write(&t.path().join(n), text).display().to_string())
    .collect();
    let mut args = vec!["ingest", "demo"];
    args.extend(guides.iter().map(String::as_str));
    care.ok(&args);
    care_e2e::add_user(&care, t.path(), "admin", "admin", "backup-admin-passphrase");
    let token = care_e2e::token(&care, "admin", "e2e");
    let backups = t.path().join("backups");
    let backups_arg = backups.to_str().unwrap().to_string();
    let mut served = care.serve_full();

    // A backup while clients search and an ingest runs: the server makes it (the CLI only queues and follows it).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = searching(&served.https, &token, 4, &stop);
    let notes: Vec<String> = (0..20)
        .map(|i| {
            let p = t.path().join(format!("note-{i}.md"));
            std::fs::write(&p, format!("# 会诊记录 {i}\n\n患者血压升高，建议复查肾功能，第 {i} 次随访。\n")).unwrap();
            p.display().to_string()
        })
        .collect();
    let mut ingest_args = vec!["ingest", "demo"];
    ingest_args.extend(notes.iter().map(String::as_str));
    let ingest = care.command(&ingest_args).stdout(std::process::Stdio::null()).spawn().unwrap();
    let during = care.json(&["backup", "create", "--to", &backups_arg, "--json"]);
    assert!(during["info"]["chunks"].as_u64().unwrap() > 0, "{during}");
    assert!(ingest.wait_with_output().unwrap().status.success());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut searches, mut failures) = (0, Vec::new());
    for c in clients {
        let (n, f) = c.join().unwrap();
        searches += n;
        failures.extend(f);
    }
    assert!(searches > 0 && failures.is_empty(), "{} of {searches} searches failed: {failures:?}", failures.len());

    // kill -9 of the server while it makes a backup: nothing half-written is listed or verifies; the restarted
    // server makes the queued backup again.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill schedule seed {seed}");
    let mut rng = Lcg(seed);
    for round in 0..3 {
        let queued = care.ok(&["backup", "create", "--to", &backups_arg, "--detach"]);
        assert!(queued.contains("queued"), "{queued}");
        std::thread::sleep(Duration::from_millis(rng.next() % 800));
        served.child.0.kill().unwrap();
        served.child.0.wait().unwrap();
        for b in care.json(&["backup", "list", "--dir", &backups_arg, "--json"]).as_array().unwrap() {
            let path = b["path"].as_str().unwrap();
            assert!(b["problem"].is_null(), "round {round}: a listed backup is readable: {b}");
            care.ok(&["backup", "verify", path]);
        }
        served = care.serve_full();
    }
    // The last queued backup runs after the last restart.
    let deadline = Instant::now() + Duration::from_secs(600);
    while !care.ok(&["jobs", "list", "-n", "1"]).contains("\tdone\t") {
        assert!(Instant::now() < deadline, "{}", care.ok(&["jobs", "list", "-n", "5"]));
        std::thread::sleep(Duration::from_millis(300));
    }
    // Retention (the newest of each day) leaves the last one; the first, made the same day, is gone.
    let listed = care.json(&["backup", "list", "--dir", &backups_arg, "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert!(listed[0]["name"].as_str().unwrap() > during["path"].as_str().unwrap().rsplit('/').next().unwrap());
    assert!(!std::path::Path::new(during["path"].as_str().unwrap()).exists(), "{during}");
    let hidden: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && !n.ends_with(&format!("partial-{}", served.child.0.id())))
        .collect();
    // Leftovers of killed servers are removed by the next backup, which the restarted server made.
    assert!(hidden.is_empty(), "{hidden:?}");
    drop(served);

    // Quiet: the newest backup restores onto an empty directory with the same answers, `care check` exact.
    let newest = listed[0]["path"].as_str().unwrap().to_string();
    let mut restored = Care::new(&t.path().join("restored"));
    restored.env = care.env.clone();
    // kill -9 of a restore first: the target stays absent, and the next restore succeeds.
    let mut child = restored.command(&["restore", &newest]).stdout(std::process::Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100 + rng.next() % 400));
    child.kill().unwrap();
    child.wait().unwrap();
    let target = t.path().join("restored");
    let done = target.join("care.sqlite").exists();
    assert!(done || !target.exists(), "a killed restore leaves no half-restored data directory");
    if done {
        std::fs::remove_dir_all(&target).unwrap();
    }
    let report = restored.json(&["restore", &newest, "--json"]);
    assert_eq!(report["check"]["consistent"], true, "{report}");
    assert!(restored.ok(&["check"]).contains("\"consistent\": true"));
    restored.ok(&["audit", "verify"]);
    for q in ["二甲双胍的禁忌症", "会诊记录 7", "孕妇"] {
        assert_eq!(cli_ranking(&restored, q), cli_ranking(&care, q), "{q}");
    }
    // A flipped byte: verify and restore refuse it, and the refused restore writes nothing.
    let mut bytes = std::fs::read(&newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    let flipped = t.path().join("flipped.care-backup");
    std::fs::write(&flipped, bytes).unwrap();
    let out = care.run(&["backup", "verify", flipped.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("已损坏"), "{out:?}");
    let mut again = Care::new(&t.path().join("again"));
    again.env = care.env.clone();
    assert!(!again.run(&["restore", flipped.to_str().unwrap()]).status.success());
    assert!(!t.path().join("again").join("care.sqlite").exists());
}

/// The titles of the first page a bearer's search of `q` gets from `base`.
fn titles(base: &str, token: &str, q: &str) -> Vec<String> {
    let url = reqwest::Url::parse_with_params(&format!("{base}/api/v1/search"), [("q", q), ("limit", "5")]).unwrap();
    let r = care_e2e::get_json(&care_e2e::https_client(), url.as_str(), &format!("Bearer {token}"));
    r["hits"].as_array().unwrap().iter().map(|h| h["title"].as_str().unwrap_or_default().to_string()).collect()
}

#[test]
fn a_standby_follows_the_primary_s_backups_serves_read_only_and_takes_writes_once_promoted() {
    let t = tempfile::tempdir().unwrap();
    let bm25_only = ("CARE__MODEL__DEFAULT_MODEL".to_string(), "/nonexistent/e5-small-q4.bin".to_string());
    let mut primary = Care::new(&t.path().join("primary"));
    primary.env.push(bm25_only.clone());
    primary.env.push(("CARE__BACKUP__DIR".into(), t.path().join("backups").display().to_string()));
    primary.ok(&["init"]);
    primary.ok(&["collection", "create", "guides"]);
    let first = care_e2e::write(&t.path().join("metformin.md"), "# 二甲双胍\n\n严重肾功能不全患者禁用二甲双胍。\n");
    primary.ok(&["ingest", "guides", first.to_str().unwrap()]);
    care_e2e::add_user(&primary, t.path(), "admin", "admin", "standby-admin-passphrase");
    let admin = care_e2e::token(&primary, "admin", "e2e");
    let pull = primary.ok(&["user", "token", "admin", "--name", "standby", "--scope", "backups"]);
    let token_file = care_e2e::write(&t.path().join("standby.token"), pull.trim());
    let served = primary.serve_full();
    primary.ok(&["backup", "create"]);

    // The follower restores the newest backup into its empty data directory and serves it; its server reports
    // each start (one per switch) on the follower's output.
    let mut standby = Care::new(&t.path().join("standby"));
    standby.env.push(bm25_only);
    standby.env.push(("CARE__SERVER__BIND".into(), "127.0.0.1:0".into()));
    standby.env.push(("CARE__SERVER__HTTP_REDIRECT_BIND".into(), "127.0.0.1:0".into()));
    let cert = t.path().join("primary/tls/cert.pem");
    let mut child = standby
        .command(&["standby", "--from", &served.https, "--token-file", token_file.to_str().unwrap()])
        .args(["--ca-file", cert.to_str().unwrap(), "--every", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let _follower = care_e2e::KillOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let next_start = || rx.recv_timeout(Duration::from_secs(180)).expect("the standby's server did not start");
    let base = next_start();
    assert_eq!(titles(&base, &admin, "二甲双胍"), ["二甲双胍"]);

    // Read-only: the API, the CLI; the overview says where the data came from.
    let c = care_e2e::https_client();
    let res =
        c.post(format!("{base}/api/v1/admin/collections")).bearer_auth(&admin).json(&serde_json::json!({"name": "x"}));
    let res = res.send().unwrap();
    assert_eq!(res.status(), 409);
    let body: serde_json::Value = res.json().unwrap();
    assert_eq!(body["code"], "read_only", "{body}");
    assert!(body["message"].as_str().unwrap().contains("备用机"), "{body}");
    let cli = standby.run(&["collection", "create", "x"]);
    assert!(!cli.status.success() && String::from_utf8_lossy(&cli.stderr).contains("备用机"), "{cli:?}");
    let overview = c.get(format!("{base}/admin/overview")).bearer_auth(&admin).send().unwrap().text().unwrap();
    assert!(overview.contains("备用机（只读）") && overview.contains(&served.https), "{overview}");

    // A document ingested on the primary is searchable on the standby after the primary's next backup.
    let second = care_e2e::write(&t.path().join("aspirin.md"), "# 阿司匹林\n\n阿司匹林用于冠心病二级预防。\n");
    primary.ok(&["ingest", "guides", second.to_str().unwrap()]);
    let started = Instant::now();
    primary.ok(&["backup", "create"]);
    let base = next_start();
    eprintln!("the primary's backup to search on the standby: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(titles(&base, &admin, "阿司匹林"), ["阿司匹林"]);
    let overview =
        c.get(format!("{}/admin/overview", served.https)).bearer_auth(&admin).send().unwrap().text().unwrap();
    assert!(overview.contains("取走备份"), "the primary shows the standby's pull: {overview}");

    // Promoted: the follower restarts its server as a primary, which takes writes.
    assert!(standby.ok(&["standby", "promote"]).contains("已转为主机"));
    let base = next_start();
    let res =
        c.post(format!("{base}/api/v1/admin/collections")).bearer_auth(&admin).json(&serde_json::json!({"name": "x"}));
    assert!(res.send().unwrap().status().is_success());
    assert_eq!(titles(&base, &admin, "阿司匹林"), ["阿司匹林"]);
}
