//! Settings an administrator changes in the console (设置) instead of editing `care.toml` and restarting: the
//! fusion weight, the synonym weight, the chunk size of new ingests and how long a sign-in lasts.
//!
//! `care.toml` gives each one's default; a change made here is stored in SQLite (`console_settings`), audited in the same
//! transaction (`settings.update`, with the old and new value) and takes effect at once: readers take the value
//! from an in-memory copy that every change replaces. Clearing a value returns to the file's.

use std::collections::BTreeMap;
use std::sync::RwLock;

use rusqlite::params;
use serde::Serialize;

use crate::audit;
use crate::error::{Error, Result};
use crate::store::{Store, now};

/// One changeable setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    DenseWeight,
    SynonymWeight,
    ChunkTokens,
    SessionIdleMinutes,
    SessionMaxHours,
}

/// How a setting reads on the page and which values it takes.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Its key here and its place in `care.toml`.
    pub key: &'static str,
    pub config: &'static str,
    pub label: &'static str,
    pub help: &'static str,
    pub min: f64,
    pub max: f64,
    pub integer: bool,
}

impl Setting {
    pub const ALL: [Setting; 5] = [
        Setting::DenseWeight,
        Setting::SynonymWeight,
        Setting::ChunkTokens,
        Setting::SessionIdleMinutes,
        Setting::SessionMaxHours,
    ];

    pub fn spec(self) -> Spec {
        let s = |key, config, label, help, min, max, integer| Spec { key, config, label, help, min, max, integer };
        match self {
            Setting::DenseWeight => s(
                "dense_weight",
                "search.default_dense_weight",
                "语义检索权重",
                "混合检索中语义（向量）结果所占的权重，0 为只用关键词，1 为只用语义；已按资料库调优的权重优先",
                0.0,
                1.0,
                false,
            ),
            Setting::SynonymWeight => s(
                "synonym_weight",
                "search.synonym_weight",
                "同义词权重",
                "同义词、缩写、繁体写法等扩展词相对原词的权重，0 为不扩展",
                0.0,
                1.0,
                false,
            ),
            Setting::ChunkTokens => s(
                "chunk_tokens",
                "ingest.chunk.max_tokens",
                "文本块长度（词元）",
                "此后入库或重新入库的文档按此长度切块；已入库的文档不变",
                32.0,
                512.0,
                true,
            ),
            Setting::SessionIdleMinutes => s(
                "session_idle_minutes",
                "auth.session_idle_minutes",
                "登录空闲超时（分钟）",
                "多久没有操作后需要重新登录",
                5.0,
                24.0 * 60.0,
                true,
            ),
            Setting::SessionMaxHours => s(
                "session_max_hours",
                "auth.session_max_hours",
                "登录最长有效期（小时）",
                "无论是否操作，登录在此之后失效",
                1.0,
                24.0 * 7.0,
                true,
            ),
        }
    }

    pub fn parse_key(key: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.spec().key == key)
    }

    /// A value as typed, checked against the setting's range (a Chinese message naming it otherwise).
    pub fn parse_value(self, raw: &str) -> Result<f64> {
        let spec = self.spec();
        let bad = || {
            Error::InvalidInput(format!(
                "「{}」须为 {} 到 {} 之间的{}，收到「{}」",
                spec.label,
                spec.min,
                spec.max,
                if spec.integer { "整数" } else { "数" },
                raw.chars().take(40).collect::<String>()
            ))
        };
        let v: f64 = raw.trim().parse().map_err(|_| bad())?;
        if !v.is_finite() || v < spec.min || v > spec.max || (spec.integer && v.fract() != 0.0) {
            return Err(bad());
        }
        Ok(v)
    }
}

/// A stored change: the value, who made it, when.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub value: f64,
    pub by: String,
    pub at: String,
}

/// The changes in force, kept in memory for the readers (search, ingest, sign-in checks).
#[derive(Debug, Default)]
pub struct LiveSettings {
    changes: RwLock<BTreeMap<Setting, Change>>,
}

impl LiveSettings {
    /// The dense leg's weight in fusion where no fitted setting applies: the console's, else `care.toml`'s.
    pub fn dense_weight(&self, cfg: &crate::config::EngineConfig) -> f32 {
        self.get(Setting::DenseWeight).map_or(cfg.search.default_dense_weight, |v| v as f32)
    }

    /// The weight of synonym and spelling expansions: the console's setting, else `care.toml`'s.
    pub fn synonym_weight(&self, cfg: &crate::config::EngineConfig) -> f32 {
        self.get(Setting::SynonymWeight).map_or(cfg.search.synonym_weight, |v| v as f32)
    }

    pub fn get(&self, s: Setting) -> Option<f64> {
        self.changes.read().unwrap_or_else(|p| p.into_inner()).get(&s).map(|c| c.value)
    }

    pub fn change(&self, s: Setting) -> Option<Change> {
        self.changes.read().unwrap_or_else(|p| p.into_inner()).get(&s).cloned()
    }

    /// Reads the stored changes (unknown keys, from a newer version, are skipped).
    pub fn reload(&self, store: &Store) -> Result<()> {
        let conn = store.reader();
        let mut stmt = conn.prepare("SELECT key, value, updated_by, updated_at FROM console_settings")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, Change { value: r.get(1)?, by: r.get(2)?, at: r.get(3)? }))
        })?;
        let mut map = BTreeMap::new();
        for row in rows {
            let (k, c) = row?;
            if let Some(s) = Setting::parse_key(&k) {
                map.insert(s, c);
            }
        }
        *self.changes.write().unwrap_or_else(|p| p.into_inner()) = map;
        Ok(())
    }
}

/// Stores `value` for `s` (`None`: back to `care.toml`'s), audited with the value before, then reloads `live`.
pub fn set(store: &Store, live: &LiveSettings, actor: &str, s: Setting, value: Option<f64>) -> Result<()> {
    let before = live.get(s);
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    match value {
        Some(v) => tx.execute(
            "INSERT INTO console_settings (key, value, updated_by, updated_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(key) DO UPDATE SET value = ?2, updated_by = ?3, updated_at = ?4",
            params![s.spec().key, v, actor, now()],
        )?,
        None => tx.execute("DELETE FROM console_settings WHERE key = ?1", [s.spec().key])?,
    };
    let detail = serde_json::json!({"setting": s.spec().key, "from": before, "to": value});
    audit::append(&tx, actor, "settings.update", &detail)?;
    tx.commit()?;
    drop(conn);
    live.reload(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_against_each_range() {
        assert_eq!(Setting::DenseWeight.parse_value(" 0.35 ").unwrap(), 0.35);
        for (s, bad) in [
            (Setting::DenseWeight, "1.5"),
            (Setting::DenseWeight, "NaN"),
            (Setting::ChunkTokens, "100.5"),
            (Setting::SessionIdleMinutes, "1"),
            (Setting::SessionMaxHours, "半天"),
        ] {
            let e = s.parse_value(bad).unwrap_err().to_string();
            assert!(e.contains(s.spec().label), "{e}");
        }
        assert!(Setting::ALL.iter().all(|s| Setting::parse_key(s.spec().key) == Some(*s)));
    }
}
