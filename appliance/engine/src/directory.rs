//! Directory sign-in: hospital staff sign in with the account the hospital already keeps for them (LDAP / Active
//! Directory, or its single sign-on platform over OpenID Connect), not with a second password kept here.
//!
//! Both protocols end in a [`DirectoryUser`]: the name the directory vouches for, a display name and the groups it
//! puts the person in. [`provision`] turns that into a local account at every sign-in: created the first time, its
//! role and its directory grants (`granted_by = 'directory'`) replaced by what the group mapping says now, so a
//! change made in the directory takes effect at the next sign-in while grants an administrator gave by hand stay.
//! Someone the directory no longer knows, has disabled, or has taken out of every mapped group is disabled here and
//! signed out ([`crate::accounts::disable_directory_account`]). Local accounts stay for break-glass administrators; a directory name never takes one
//! over, and a directory account never signs in with a local password.

pub mod console;
pub mod ldap;
pub mod oidc;

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

pub use crate::accounts::AccountSource;
use crate::accounts::{Role, User};
use crate::audit;
use crate::error::{Error, Result};
use crate::store::{Store, now};

pub use crate::accounts::DIRECTORY_GRANTOR;

/// LDAP as the directory a password sign-in consults for names that are no local account.
impl crate::accounts::Directory for ldap::LdapConfig {
    fn sign_in(
        &self,
        store: &Store,
        username: &str,
        password: &str,
        client: &str,
    ) -> Result<crate::accounts::DirectoryAnswer> {
        use crate::accounts::DirectoryAnswer;
        Ok(match ldap::check(self, username, password)? {
            Verdict::Accepted(person) => DirectoryAnswer::SignedIn(provision(store, &person, &self.groups, client)?),
            Verdict::Rejected => DirectoryAnswer::Rejected,
            Verdict::Gone => DirectoryAnswer::Gone,
        })
    }
}

/// Which directory groups make an administrator or a clinician, and which collections each group may read
/// (`[ldap.groups]`, `[oidc.groups]`). A group is named by its full DN or by its first value (`cn`), in any case.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct GroupMapping {
    pub admin: Vec<String>,
    /// Empty: every person the directory signs in is a clinician (the usual choice when the filter already limits
    /// who may sign in).
    pub clinician: Vec<String>,
    /// Group → collections its members may read.
    pub collections: BTreeMap<String, Vec<String>>,
}

impl GroupMapping {
    fn matches(pattern: &str, group: &str) -> bool {
        let first_value = group.split(',').next().and_then(|rdn| rdn.split_once('=')).map(|(_, v)| v.trim());
        pattern.eq_ignore_ascii_case(group.trim()) || first_value.is_some_and(|v| pattern.eq_ignore_ascii_case(v))
    }
    fn any(patterns: &[String], groups: &[String]) -> bool {
        patterns.iter().any(|p| groups.iter().any(|g| Self::matches(p, g)))
    }
    /// The role the groups give, or `None` when they give none (the sign-in is refused).
    pub fn role(&self, groups: &[String]) -> Option<Role> {
        if Self::any(&self.admin, groups) {
            Some(Role::Admin)
        } else if self.clinician.is_empty() || Self::any(&self.clinician, groups) {
            Some(Role::Clinician)
        } else {
            None
        }
    }
    /// The collections the groups grant, sorted and without repeats.
    pub fn collections(&self, groups: &[String]) -> Vec<String> {
        let mut out: Vec<String> = self
            .collections
            .iter()
            .filter(|(g, _)| Self::any(std::slice::from_ref(g), groups))
            .flat_map(|(_, cs)| cs.iter().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// A person as the directory vouches for them after a successful check.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectoryUser {
    pub source: AccountSource,
    pub username: String,
    pub display_name: Option<String>,
    pub groups: Vec<String>,
}

/// What a directory said about a name and password.
#[derive(Debug)]
pub enum Verdict {
    Accepted(DirectoryUser),
    /// Wrong password (the person exists).
    Rejected,
    /// No such person, or the directory's filter excludes them (disabled, left the hospital).
    Gone,
}

/// Creates or refreshes the local account of a person the directory signed in, with the role and grants their
/// groups give now; refuses (and disables a former account) when no mapped group admits them. One transaction:
/// account, grants and their audit record land together.
pub fn provision(store: &Store, who: &DirectoryUser, mapping: &GroupMapping, client: &str) -> Result<User> {
    crate::accounts::validate_username(&who.username)?;
    let Some(role) = mapping.role(&who.groups) else {
        crate::accounts::disable_directory_account(store, &who.username, "no mapped group")?;
        return Err(Error::LoginFailed(format!(
            "目录账户 {} 不在允许使用本系统的组中；请联系信息科将您加入相应的组",
            who.username
        )));
    };
    let wanted = mapping.collections(&who.groups);
    let mut conn = store.conn();
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let existing: Option<(i64, String, String, i64)> = tx
        .query_row("SELECT id, source, role, disabled FROM users WHERE username = ?1", [&who.username], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let (id, created, role_before) = match existing {
        Some((_, source, ..)) if source == AccountSource::Local.as_str() => {
            let detail =
                serde_json::json!({"reason": "local account", "client": client, "source": who.source.as_str()});
            audit::append(&tx, &who.username, "auth.login_failed", &detail)?;
            tx.commit()?;
            return Err(Error::LoginFailed(format!(
                "{} 是本系统的本地账户，不能用{}登录；请用本地密码登录，或请管理员处理重名",
                who.username,
                who.source.label_zh()
            )));
        }
        Some((_, _, _, disabled)) if disabled != 0 => {
            let detail = serde_json::json!({"reason": "disabled", "client": client, "source": who.source.as_str()});
            audit::append(&tx, &who.username, "auth.login_failed", &detail)?;
            tx.commit()?;
            return Err(Error::LoginFailed(format!("账户 {} 已在本系统停用，请联系管理员启用", who.username)));
        }
        Some((id, _, role_before, _)) => {
            tx.execute(
                "UPDATE users SET role = ?2, display_name = ?3, source = ?4, groups = ?5 WHERE id = ?1",
                params![id, role.as_str(), who.display_name, who.source.as_str(), stored_groups(&who.groups)],
            )?;
            (id, false, Some(role_before))
        }
        None => {
            // '!' is no PHC string: no password ever matches it, so the account cannot sign in locally.
            tx.execute(
                "INSERT INTO users (username, password_hash, role, created_at, source, display_name, groups)
                 VALUES (?1, '!', ?2, ?3, ?4, ?5, ?6)",
                params![
                    who.username,
                    role.as_str(),
                    now(),
                    who.source.as_str(),
                    who.display_name,
                    stored_groups(&who.groups)
                ],
            )?;
            (tx.last_insert_rowid(), true, None)
        }
    };
    let before = directory_grants(&tx, id)?;
    tx.execute("DELETE FROM grants WHERE user_id = ?1 AND granted_by = ?2", params![id, DIRECTORY_GRANTOR])?;
    for name in &wanted {
        tx.execute(
            "INSERT OR IGNORE INTO grants (user_id, collection_id, granted_by, created_at)
             SELECT ?1, id, ?2, ?3 FROM collections WHERE name = ?4",
            params![id, DIRECTORY_GRANTOR, now(), name],
        )?;
    }
    let after = directory_grants(&tx, id)?;
    if created || role_before.as_deref() != Some(role.as_str()) || before != after {
        let groups: Vec<&String> = who.groups.iter().take(50).collect();
        let detail = serde_json::json!({
            "user": who.username, "source": who.source.as_str(), "created": created, "role": role.as_str(),
            "collections": after, "groups": groups,
        });
        audit::append(&tx, DIRECTORY_GRANTOR, "user.directory_sync", &detail)?;
    }
    tx.commit()?;
    drop(conn);
    crate::accounts::user_by_id(store, id)
}

/// A person's groups as the account keeps them for access lists: a DN by its first value (`cn=心内科,ou=…` →
/// 心内科), at most 100, commas taken out (they separate the stored list).
fn stored_groups(groups: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    for g in groups.iter().take(100) {
        let first = g.split(',').next().unwrap_or("");
        let name = match first.split_once('=') {
            Some((_, v)) if g.contains('=') => v.trim(),
            _ => g.trim(),
        };
        let name: String = name.chars().filter(|c| *c != ',').take(64).collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out.join(",")
}

fn directory_grants(tx: &rusqlite::Transaction<'_>, user_id: i64) -> Result<Vec<String>> {
    let mut stmt = tx.prepare(
        "SELECT c.name FROM grants g JOIN collections c ON c.id = g.collection_id
         WHERE g.user_id = ?1 AND g.granted_by = ?2 ORDER BY c.name",
    )?;
    let rows = stmt.query_map(params![user_id, DIRECTORY_GRANTOR], |r| r.get(0))?;
    Ok(rows.collect::<Result<Vec<String>, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_map_by_dn_or_first_value_in_any_case() {
        let m = GroupMapping {
            admin: vec!["care-admins".into()],
            clinician: vec!["cn=Staff,ou=groups,dc=hospital".into()],
            collections: [("cardiology".to_string(), vec!["xinnei".to_string(), "common".to_string()])].into(),
        };
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(m.role(&g(&["CN=care-admins,OU=groups,DC=hospital"])), Some(Role::Admin));
        assert_eq!(m.role(&g(&["cn=staff,ou=groups,dc=hospital"])), Some(Role::Clinician));
        assert_eq!(m.role(&g(&["cn=visitors,ou=groups,dc=hospital"])), None);
        assert_eq!(m.collections(&g(&["cn=Cardiology,ou=groups,dc=hospital"])), vec!["common", "xinnei"]);
        assert!(m.collections(&g(&["cn=cardiology-x,ou=groups"])).is_empty());
        let open = GroupMapping::default();
        assert_eq!(open.role(&[]), Some(Role::Clinician));
    }
}
