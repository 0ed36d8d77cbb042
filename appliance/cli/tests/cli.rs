//! The `care` binary's own integration tests (configuration layers as the binary sees them, help, errors).
//! Having this file also makes cargo build `target/<profile>/care` for the end-to-end tests in /tests.

use std::process::Command;

fn care() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_care"));
    c.env_remove("CARE_CONFIG");
    c.env("CARE__TRAINING__KEEP_FREE_GB", "0"); // independent of the host's free disk
    c
}

#[test]
fn env_and_flags_override_the_config_file() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("care.toml");
    std::fs::write(&file, "[storage]\ndata_dir = \"/from/file\"\n[search]\ndefault_limit = 5\n").unwrap();
    let out = care()
        .args(["--config", file.to_str().unwrap(), "config"])
        .env("CARE__SEARCH__DEFAULT_LIMIT", "9")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(v["storage"]["data_dir"].as_str(), Some("/from/file"));
    assert_eq!(v["search"]["default_limit"].as_integer(), Some(9));
    let out = care().args(["--config", file.to_str().unwrap(), "--data-dir", "/from/cli", "config"]).output().unwrap();
    let v: toml::Value = toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(v["storage"]["data_dir"].as_str(), Some("/from/cli"));
}

#[test]
fn commands_on_a_missing_data_dir_say_how_to_fix_it() {
    let t = tempfile::tempdir().unwrap();
    let out = care()
        .args(["--config", "/dev/null", "--data-dir", t.path().join("none").to_str().unwrap(), "search", "糖尿病"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("run `care init` first"), "{err}");
}

#[test]
fn bad_config_values_are_reported_with_their_key() {
    let out =
        care().args(["--config", "/dev/null", "config"]).env("CARE__SEARCH__DEFAULT_LIMIT", "many").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("invalid configuration") && err.contains("\"many\""), "{err}");
}

/// `care audit list --json --action PREFIX`: the records whose action is exactly `action`.
fn audit_records(data: &str, action: &str) -> Vec<serde_json::Value> {
    let out = care()
        .args(["--config", "/dev/null", "--data-dir", data, "audit", "list", "--json", "-n", "1000"])
        .args(["--action", action])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let recs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    recs.into_iter().filter(|r| r["action"] == action).collect()
}

/// `care search` and `care tune-fusion` go through the audited service layer as the console (named by the uid that
/// ran them): one search leaves one `search` record, one fit one `fusion.tune` record with the weight it stored.
#[test]
fn a_cli_search_and_a_cli_tune_fusion_each_leave_one_audit_record() {
    let e5s1 = std::env::var("CARE_E5S1").expect("CARE_E5S1 must point at e5-small-q4.bin (packaging/dev.sh env)");
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let data = data.to_str().unwrap();
    let run = |args: &[&str]| -> String {
        let out = care()
            .args(["--config", "/dev/null", "--data-dir", data])
            .args(args)
            .env("CARE_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "care {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["demo", "--no-serve", "--e5s1", &e5s1]);
    assert!(audit_records(data, "search").is_empty());

    let found: serde_json::Value =
        serde_json::from_str(&run(&["search", "--json", "-c", "demo", "二甲双胍的禁忌症"])).unwrap();
    let hits = found["hits"].as_array().unwrap();
    assert!(!hits.is_empty(), "{found}");
    let searches = audit_records(data, "search");
    assert_eq!(searches.len(), 1, "{searches:?}");
    assert!(searches[0]["actor"].as_str().unwrap().starts_with("cli:"), "{}", searches[0]);
    assert_eq!(searches[0]["detail"]["collections"], serde_json::json!(["demo"]));
    assert_eq!(searches[0]["detail"]["results"], hits.len());
    // The printed form is unchanged: ranked lines, then the count.
    let text = run(&["search", "阿司匹林"]);
    assert!(text.contains(" 1. [") && text.trim_end().ends_with("ms)"), "{text}");
    assert_eq!(audit_records(data, "search").len(), 2);

    // A two-query set judged on the demo's own documents.
    let set = t.path().join("demo-set");
    std::fs::create_dir_all(set.join("qrels")).unwrap();
    let aspirin: serde_json::Value = serde_json::from_str(&run(&["search", "--json", "阿司匹林"])).unwrap();
    let (metformin, aspirin) =
        (hits[0]["external_id"].as_str().unwrap(), aspirin["hits"][0]["external_id"].as_str().unwrap());
    std::fs::write(
        set.join("queries.jsonl"),
        "{\"_id\": \"q1\", \"text\": \"二甲双胍的禁忌症\"}\n{\"_id\": \"q2\", \"text\": \"阿司匹林\"}\n",
    )
    .unwrap();
    std::fs::write(
        set.join("qrels/train.tsv"),
        format!("query-id\tcorpus-id\tscore\nq1\t{metformin}\t1\nq2\t{aspirin}\t1\n"),
    )
    .unwrap();
    let tuned: serde_json::Value =
        serde_json::from_str(&run(&["tune-fusion", "--collection", "demo", "--set", set.to_str().unwrap()])).unwrap();
    let tunes = audit_records(data, "fusion.tune");
    assert_eq!(tunes.len(), 1, "{tunes:?}");
    let d = &tunes[0]["detail"];
    assert!(tunes[0]["actor"].as_str().unwrap().starts_with("cli:"), "{}", tunes[0]);
    assert_eq!(d["collection"], "demo");
    assert_eq!(d["method"], "weighted");
    assert_eq!(d["fitted_on"], "demo-set:train");
    assert_eq!(d["dense_weight"], tuned["dense_weight"], "{d} vs {tuned}");

    // Clinical text leaving the data directory for offline embedding is a copy someone took: audited too.
    let out = t.path().join("chunks.jsonl");
    run(&["collection", "export-chunks", "demo", "--out", out.to_str().unwrap()]);
    let exports = audit_records(data, "collection.export_chunks");
    assert_eq!(exports.len(), 1, "{exports:?}");
    let lines = std::fs::read_to_string(&out).unwrap().lines().count();
    assert_eq!(exports[0]["detail"]["chunks"], lines, "{}", exports[0]);
    assert!(exports[0]["actor"].as_str().unwrap().starts_with("cli:"), "{}", exports[0]);
}

/// A reader that leaves early (`care config | head -1`, `| grep -q`) ends the command as SIGPIPE ends a C tool:
/// status 141 and no panic on stderr.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut child = care()
        .args(["--config", "/dev/null", "config"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // closed before the child has printed anything
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
