//! API tokens: issued with a secret shown once (only its hash kept), scoped, listed, revoked, and resolved to
//! their user on each request.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::*;
use crate::error::{Error, Result};
use crate::store::{Store, now};

// ---------------------------------------------------------------------------------------------------------------
// API tokens

#[derive(Debug, Clone, Serialize)]
pub struct ApiToken {
    pub id: i64,
    pub username: String,
    pub name: String,
    pub prefix: String,
    pub created_at: String,
    pub last_used: Option<String>,
    pub revoked: bool,
    pub scope: TokenScope,
}

/// What a token opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TokenScope {
    /// Everything its user may do.
    #[default]
    Full,
    /// Only listing and downloading backups (a standby's token): nothing else, whatever its user may.
    Backups,
}

impl TokenScope {
    fn as_str(self) -> &'static str {
        match self {
            TokenScope::Full => "",
            TokenScope::Backups => "backups",
        }
    }

    /// A stored scope; one this version does not know opens nothing beyond backups.
    fn parse(s: &str) -> TokenScope {
        if s.is_empty() { TokenScope::Full } else { TokenScope::Backups }
    }
}

/// Issues a token for `username`; the returned secret (`care_<hex>`) is shown once and only its hash is kept.
pub fn create_token(store: &Store, actor: &str, username: &str, name: &str) -> Result<(ApiToken, String)> {
    create_scoped_token(store, actor, username, name, TokenScope::Full)
}

/// [`create_token`] limited to `scope`. A backups token needs an administrator: a backup holds everything.
pub fn create_scoped_token(
    store: &Store,
    actor: &str,
    username: &str,
    name: &str,
    scope: TokenScope,
) -> Result<(ApiToken, String)> {
    if name.trim().is_empty() || name.chars().count() > 100 {
        return Err(Error::InvalidInput("令牌需要 1–100 个字的用途说明（例如：HIS 集成）".into()));
    }
    let secret = format!("care_{}", random_token()?);
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let u = user_by(&tx, username)?;
    if scope == TokenScope::Backups && u.role != Role::Admin {
        return Err(Error::InvalidInput(format!(
            "读取备份的令牌须属于管理员：备份含全部资料与账户，{username} 不是管理员"
        )));
    }
    tx.execute(
        "INSERT INTO api_tokens (user_id, name, token_hash, prefix, created_at, scope) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![u.id, name.trim(), sha256_hex(&secret), &secret[..13], now(), scope.as_str()],
    )?;
    let id = tx.last_insert_rowid();
    audit::append(
        &tx,
        actor,
        "token.create",
        &serde_json::json!({"user": username, "token_id": id, "name": name.trim(), "scope": scope}),
    )?;
    tx.commit()?;
    drop(conn);
    let t = list_tokens(store, None)?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| Error::Internal("token vanished".into()))?;
    Ok((t, secret))
}

pub fn list_tokens(store: &Store, username: Option<&str>) -> Result<Vec<ApiToken>> {
    let conn = store.reader();
    let mut stmt = conn.prepare(
        "SELECT t.id, u.username, t.name, t.prefix, t.created_at, t.last_used, t.revoked, t.scope
         FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE (?1 IS NULL OR u.username = ?1) ORDER BY t.id",
    )?;
    let rows = stmt.query_map([username], |r| {
        Ok(ApiToken {
            id: r.get(0)?,
            username: r.get(1)?,
            name: r.get(2)?,
            prefix: r.get(3)?,
            created_at: r.get(4)?,
            last_used: r.get(5)?,
            revoked: r.get::<_, i64>(6)? != 0,
            scope: TokenScope::parse(&r.get::<_, String>(7)?),
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

pub fn revoke_token(store: &Store, actor: &str, id: i64) -> Result<()> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let n = tx.execute("UPDATE api_tokens SET revoked = 1 WHERE id = ?1", [id])?;
    if n == 0 {
        return Err(Error::NotFound { what: format!("API 令牌 #{id}") });
    }
    audit::append(&tx, actor, "token.revoke", &serde_json::json!({"token_id": id}))?;
    tx.commit()?;
    Ok(())
}

/// The user a bearer token belongs to, when the token is valid, not revoked and its user enabled.
///
/// `last_used` is refreshed at most once a minute, so a busy integration does not put a write on every request.
pub fn token_user(store: &Store, secret: &str) -> Result<Option<User>> {
    Ok(token_caller(store, secret)?.map(|(u, _)| u))
}

/// [`token_user`] with what the token opens.
pub fn token_caller(store: &Store, secret: &str) -> Result<Option<(User, TokenScope)>> {
    let found: Option<(i64, Option<String>, String, User)> = store
        .reader()
        .query_row(
            &format!(
                "SELECT t.id, t.last_used, t.scope, {} FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE t.token_hash = ?1 AND t.revoked = 0",
                USER_COLS.split(", ").map(|c| format!("u.{c}")).collect::<Vec<_>>().join(", ")
            ),
            [sha256_hex(secret)],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, row_to_user_at(r, 3)?)),
        )
        .optional()?;
    match found {
        Some((id, last, scope, u)) if !u.disabled => {
            let stale = last
                .and_then(|l| time::OffsetDateTime::parse(&l, &time::format_description::well_known::Rfc3339).ok())
                .is_none_or(|l| (time::OffsetDateTime::now_utc() - l).whole_seconds() >= 60);
            if stale {
                store.conn().execute("UPDATE api_tokens SET last_used = ?2 WHERE id = ?1", params![id, now()])?;
            }
            Ok(Some((u, TokenScope::parse(&scope))))
        }
        _ => Ok(None),
    }
}
