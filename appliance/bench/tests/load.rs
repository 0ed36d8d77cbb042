//! `care-bench --load` end to end with tiny settings: it prepares a data directory, serves it over HTTPS, drives
//! closed- and open-loop search and an ingest through the admin API, and writes JSON + SVG.

use std::path::{Path, PathBuf};
use std::process::Command;

fn shared() -> PathBuf {
    std::env::var_os("CARE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

#[test]
fn load_benchmark_runs_against_care_serve() {
    let sets = shared().join("data/retrieval");
    assert!(sets.join("kuake_qtr/corpus.jsonl").exists(), "{} lacks kuake_qtr (set CARE_SHARED)", sets.display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("load.json");
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    // The `care` the workspace builds beside this benchmark is the server it measures.
    let bench = Path::new(env!("CARGO_BIN_EXE_care-bench"));
    let care = bench.with_file_name("care");
    assert!(care.exists(), "{} is not built (cargo build --workspace)", care.display());
    let res = Command::new(bench)
        .env("CARE__TRAINING__KEEP_FREE_GB", "0") // independent of the host's free disk
        .arg(format!("--server=current={}", care.display()))
        .args(["--config", empty.to_str().unwrap(), "--load", "--set"])
        .arg(sets.join("kuake_qtr"))
        .arg("--ingest-set")
        .arg(sets.join("cmedir"))
        .args(["--max-docs", "300", "--ingest-docs", "1000", "--duration", "2", "--warmup", "1", "--settle", "0"])
        .args(["--concurrency", "1,4", "--ingest-concurrency", "4", "--rates", "5", "--out"])
        .arg(&out)
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .env("CARE_LOG", "warn")
        // BM25 only: importing the model and loading the encoder take minutes in a debug build; the dense path is the
        // same `care` CLI calls the e2e tests cover.
        .env_remove("CARE_E5S1")
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "care-bench --load failed: {}\n{}",
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
    assert_eq!(report["prepared"]["corpus_documents"], 300);
    assert_eq!(report["prepared"]["model"], serde_json::Value::Null);
    assert!(report["servers"][0]["first_search_s"].as_f64().unwrap() > 0.0);
    let phases = report["phases"].as_array().unwrap();
    let labels: Vec<&str> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(labels, ["closed c=1", "closed c=4", "open 5/s", "closed c=4 + ingest"]);
    for p in phases {
        assert_eq!(p["server"], "current");
        assert!(p["throughput_rps"].as_f64().unwrap() > 0.0, "{p}");
        assert_eq!(p["errors"], 0, "{p}");
        assert!(p["latency"]["p99_ms"].as_f64().unwrap() >= p["latency"]["p50_ms"].as_f64().unwrap());
    }
    // The open loop sends on schedule: 5/s for 2 s.
    assert_eq!(phases[2]["requests"], 10, "{}", phases[2]);
    let ingest = &phases[3]["ingest"];
    assert!(ingest["job_id"].as_i64().unwrap() > 0, "{ingest}");
    assert_eq!(ingest["documents_uploaded"], 1000);
    assert!(report["summary"]["ingest"][0]["p99_ratio_with_over_without"].as_f64().unwrap() > 0.0);
    let svg = std::fs::read_to_string(out.with_extension("svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("closed c=4 + ingest"), "{svg}");
    let stdout = String::from_utf8_lossy(&res.stdout);
    assert!(stdout.contains("p99 with ingest / without"), "{stdout}");
}
