//! Configuration layers: compiled defaults < `/etc/care/care.toml` (or `--config`) < `CARE__SECTION__KEY`
//! environment variables < command-line flags.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use care_engine::EngineConfig;
use care_server::{AuditConfig, AuthConfig, ServerConfig};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

pub const DEFAULT_CONFIG: &str = "/etc/care/care.toml";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AppConfig {
    #[serde(flatten)]
    pub engine: EngineConfig,
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub audit: AuditConfig,
}

/// Flags that override every other layer when given.
#[derive(Debug, Default, Serialize)]
pub struct CliOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_bind: Option<String>,
}

pub fn load(explicit: Option<&Path>, overrides: &CliOverrides) -> Result<AppConfig> {
    let mut fig = Figment::from(Serialized::defaults(AppConfig::default()));
    match explicit {
        Some(p) => {
            if !p.exists() {
                bail!("config file {} does not exist", p.display());
            }
            fig = fig.merge(Toml::file_exact(p));
        }
        None => {
            if Path::new(DEFAULT_CONFIG).exists() {
                fig = fig.merge(Toml::file_exact(DEFAULT_CONFIG));
            }
        }
    }
    fig = fig.merge(Env::prefixed("CARE__").split("__"));
    if let Some(d) = &overrides.data_dir {
        fig = fig.merge(Serialized::default("storage.data_dir", d));
    }
    if let Some(b) = &overrides.bind {
        fig = fig.merge(Serialized::default("server.bind", b));
    }
    if let Some(b) = &overrides.http_bind {
        fig = fig.merge(Serialized::default("server.http_redirect_bind", b));
    }
    fig.extract().map_err(|err| {
        let problems: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
        anyhow::anyhow!("invalid configuration: {}", problems.join("; "))
    })
}

/// The effective configuration as TOML, with anything secret-looking masked, for logs and `care config`.
pub fn redacted_toml(cfg: &AppConfig) -> Result<String> {
    let mut v = toml::Value::try_from(cfg)?;
    redact(&mut v);
    Ok(toml::to_string_pretty(&v)?)
}

fn redact(v: &mut toml::Value) {
    if let toml::Value::Table(t) = v {
        for (k, val) in t.iter_mut() {
            let k = k.to_ascii_lowercase();
            if ["password", "secret", "token", "key"].iter().any(|s| k.contains(s))
                && !k.ends_with("_path")
                && let toml::Value::String(s) = val
                && !s.is_empty()
                && k != "tls_key"
            {
                *s = "***".into();
            }
            redact(val);
        }
    }
}

#[cfg(test)]
// figment's test Jail returns figment::Error, which is large; nothing to gain from boxing it in tests.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn layers_apply_in_order() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "care.toml",
                "[storage]\ndata_dir = \"/from/file\"\n[server]\nbind = \"127.0.0.1:1\"\n[search]\ndefault_limit = 7\n",
            )?;
            let p = jail.directory().join("care.toml");
            let c = load(Some(&p), &CliOverrides::default()).unwrap();
            assert_eq!(c.engine.storage.data_dir, PathBuf::from("/from/file"));
            assert_eq!(c.engine.search.default_limit, 7);
            // Untouched settings keep their compiled defaults.
            assert_eq!(c.engine.search.max_limit, 100);
            jail.set_env("CARE__STORAGE__DATA_DIR", "/from/env");
            jail.set_env("CARE__SERVER__BIND", "127.0.0.1:2");
            let c = load(Some(&p), &CliOverrides::default()).unwrap();
            assert_eq!(c.engine.storage.data_dir, PathBuf::from("/from/env"));
            assert_eq!(c.server.bind, "127.0.0.1:2");
            let o = CliOverrides { data_dir: Some("/from/cli".into()), bind: None, http_bind: None };
            let c = load(Some(&p), &o).unwrap();
            assert_eq!(c.engine.storage.data_dir, PathBuf::from("/from/cli"));
            assert!(load(Some(Path::new("/nonexistent/care.toml")), &o).is_err());
            Ok(())
        });
    }

    #[test]
    fn example_config_parses_and_matches_defaults() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/care.toml");
        let text = std::fs::read_to_string(&p).unwrap();
        let parsed: AppConfig = toml::from_str(&text).unwrap();
        let mut expected = AppConfig::default();
        expected.engine.storage.data_dir = PathBuf::from("/var/lib/care");
        // The package backs up every night; a bare `care` (the demo, the tests) has no daily backup.
        expected.engine.backup.time = Some("02:30".into());
        assert_eq!(parsed, expected, "packaging/care.toml must document the compiled defaults");
    }
}
