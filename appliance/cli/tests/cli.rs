//! The `care` binary's own integration tests (configuration layers as the binary sees them, help, errors).
//! Having this file also makes cargo build `target/<profile>/care` for the end-to-end tests in /tests.

use std::process::Command;

fn care() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_care"));
    c.env_remove("CARE_CONFIG");
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
