//! LDAP / Active Directory sign-in (`[ldap]` in care.toml): the service account finds the person by the name they
//! typed, a bind as that entry checks their password, and the service account reads their groups.
//!
//! The connection is always encrypted (LDAPS, or StartTLS on `ldap://`), so a password never crosses the network
//! in the clear; the server's certificate is checked against `ca_file` (the hospital's CA) or the system roots.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ldap3::{LdapConn, LdapConnSettings, Scope, SearchEntry, ldap_escape};
use serde::{Deserialize, Serialize};

use super::{AccountSource, DirectoryUser, GroupMapping, Verdict};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LdapConfig {
    /// `ldaps://dc1.hospital.local:636`, or `ldap://…:389` with `starttls`. Empty: LDAP sign-in is off.
    pub url: String,
    pub starttls: bool,
    /// PEM file of the CA that signed the directory server's certificate; empty: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The service account that looks people up (read-only is enough).
    pub bind_dn: String,
    /// Its password; never shown back (`care config` prints `***` when set).
    pub bind_password: String,
    pub user_base: String,
    /// `{username}` is replaced by the escaped name typed at sign-in. Exclude disabled people here, e.g. for AD
    /// `(&(sAMAccountName={username})(!(userAccountControl:1.2.840.113556.1.4.803:=2)))`.
    pub user_filter: String,
    /// The attribute whose value becomes the account name here.
    pub name_attribute: String,
    pub display_attribute: String,
    /// Groups listed on the person's entry (AD, or OpenLDAP's memberof overlay); empty to skip.
    pub member_of_attribute: String,
    /// Where to search groups that list their members; empty to rely on `member_of_attribute` alone.
    pub group_base: String,
    /// `{dn}` is the person's escaped DN, `{username}` their escaped name.
    pub group_filter: String,
    pub timeout_seconds: u64,
    pub groups: GroupMapping,
}

impl Default for LdapConfig {
    fn default() -> Self {
        LdapConfig {
            url: String::new(),
            starttls: true,
            ca_file: None,
            bind_dn: String::new(),
            bind_password: String::new(),
            user_base: String::new(),
            user_filter: "(&(objectClass=person)(uid={username}))".into(),
            name_attribute: "uid".into(),
            display_attribute: "cn".into(),
            member_of_attribute: "memberOf".into(),
            group_base: String::new(),
            group_filter: "(|(member={dn})(uniqueMember={dn})(memberUid={username}))".into(),
            timeout_seconds: 10,
            groups: GroupMapping::default(),
        }
    }
}

impl LdapConfig {
    pub fn enabled(&self) -> bool {
        !self.url.trim().is_empty()
    }

    /// Settings that would send a password in the clear or cannot work, refused when the appliance starts.
    pub fn validate(&self) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let bad = |m: String| Err(Error::InvalidInput(format!("[ldap] 配置有误：{m}")));
        let tls = self.url.starts_with("ldaps://") || (self.url.starts_with("ldap://") && self.starttls);
        if !tls {
            return bad(format!("{} 未加密；请用 ldaps:// 或开启 starttls，密码不能明文传输", self.url));
        }
        if self.user_base.is_empty() || !self.user_filter.contains("{username}") {
            return bad("user_base 不能为空，user_filter 必须含 {username}".into());
        }
        if let Some(ca) = &self.ca_file
            && !ca.is_file()
        {
            return bad(format!("找不到 CA 证书文件 {}", ca.display()));
        }
        Ok(())
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    tracing::warn!(error = %e, "ldap: {what}");
    Error::Directory(format!("目录服务器{what}，请稍后再试或联系信息科"))
}

fn connect(cfg: &LdapConfig) -> Result<LdapConn> {
    let mut settings = LdapConnSettings::new()
        .set_conn_timeout(Duration::from_secs(cfg.timeout_seconds.max(1)))
        .set_starttls(cfg.starttls && cfg.url.starts_with("ldap://"));
    if let Some(ca) = &cfg.ca_file {
        settings = settings.set_config(Arc::new(tls_config(ca)?));
    }
    LdapConn::with_settings(settings, &cfg.url).map_err(|e| unavailable("无法连接", e))
}

fn tls_config(ca: &std::path::Path) -> Result<rustls::ClientConfig> {
    let pem = std::fs::read(ca).map_err(|e| Error::io(ca, e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| Error::InvalidInput(format!("CA 证书文件 {} 无法读取：{e}", ca.display())))?;
        roots.add(cert).map_err(|e| Error::InvalidInput(format!("CA 证书文件 {} 无效：{e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Looks up every enabled LDAP account of the appliance in the directory (as the service account, no password
/// needed) and disables those it no longer finds with `user_filter`: someone who left or was disabled there loses
/// access within one sweep, not only at their next sign-in attempt. Returns the names disabled.
pub fn sweep(cfg: &LdapConfig, store: &crate::store::Store) -> Result<Vec<String>> {
    let names: Vec<String> = {
        let conn = store.reader();
        let mut stmt = conn.prepare("SELECT username FROM users WHERE source = 'ldap' AND disabled = 0")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let timeout = Duration::from_secs(cfg.timeout_seconds.max(1));
    let mut conn = connect(cfg)?;
    conn.with_timeout(timeout)
        .simple_bind(&cfg.bind_dn, &cfg.bind_password)
        .and_then(|r| r.success())
        .map_err(|e| unavailable("拒绝了服务账户", e))?;
    let mut gone = Vec::new();
    for name in names {
        let filter = cfg.user_filter.replace("{username}", &ldap_escape(name.as_str()));
        let (found, _) = conn
            .with_timeout(timeout)
            .search(&cfg.user_base, Scope::Subtree, &filter, vec!["1.1"])
            .and_then(|r| r.success())
            .map_err(|e| unavailable("查找用户失败", e))?;
        if found.is_empty() && crate::accounts::disable_directory_account(store, &name, "not found in the directory")? {
            gone.push(name);
        }
    }
    let _ = conn.unbind();
    Ok(gone)
}

/// Whether the directory answers `cfg`: an encrypted connection and the service account's bind (the settings page
/// saves no section that fails it).
pub fn probe(cfg: &LdapConfig) -> Result<()> {
    let mut conn = connect(cfg)?;
    conn.with_timeout(Duration::from_secs(cfg.timeout_seconds.max(1)))
        .simple_bind(&cfg.bind_dn, &cfg.bind_password)
        .and_then(|r| r.success())
        .map_err(|e| unavailable("拒绝了服务账户", e))?;
    let _ = conn.unbind();
    Ok(())
}

/// Checks a name and password against the directory.
pub fn check(cfg: &LdapConfig, username: &str, password: &str) -> Result<Verdict> {
    // An empty password makes a simple bind "unauthenticated", which servers accept: it proves nothing.
    if username.trim().is_empty() || password.is_empty() {
        return Ok(Verdict::Rejected);
    }
    let timeout = Duration::from_secs(cfg.timeout_seconds.max(1));
    let mut conn = connect(cfg)?;
    let service_bind = |conn: &mut LdapConn| -> Result<()> {
        conn.with_timeout(timeout)
            .simple_bind(&cfg.bind_dn, &cfg.bind_password)
            .and_then(|r| r.success())
            .map(|_| ())
            .map_err(|e| unavailable("拒绝了服务账户", e))
    };
    service_bind(&mut conn)?;
    let filter = cfg.user_filter.replace("{username}", &ldap_escape(username));
    let attrs: Vec<&str> = [&cfg.name_attribute, &cfg.display_attribute, &cfg.member_of_attribute]
        .into_iter()
        .map(String::as_str)
        .filter(|a| !a.is_empty())
        .collect();
    let (mut found, _) = conn
        .with_timeout(timeout)
        .search(&cfg.user_base, Scope::Subtree, &filter, attrs)
        .and_then(|r| r.success())
        .map_err(|e| unavailable("查找用户失败", e))?;
    let entry = match found.len() {
        0 => return Ok(Verdict::Gone),
        1 => SearchEntry::construct(found.remove(0)),
        n => return Err(unavailable("查找用户失败", format!("{n} entries match {filter}"))),
    };
    let bound =
        conn.with_timeout(timeout).simple_bind(&entry.dn, password).map_err(|e| unavailable("无法验证密码", e))?;
    match bound.rc {
        0 => {}
        49 => return Ok(Verdict::Rejected), // invalidCredentials
        _ => return Err(unavailable("无法验证密码", bound)),
    }
    // Groups are read as the service account: people are often not allowed to read group entries.
    service_bind(&mut conn)?;
    let mut groups = entry.attrs.get(&cfg.member_of_attribute).cloned().unwrap_or_default();
    let name = entry.attrs.get(&cfg.name_attribute).and_then(|v| v.first()).cloned().unwrap_or(username.to_string());
    if !cfg.group_base.is_empty() {
        let gf = cfg
            .group_filter
            .replace("{dn}", &ldap_escape(entry.dn.as_str()))
            .replace("{username}", &ldap_escape(&name));
        let (gs, _) = conn
            .with_timeout(timeout)
            .search(&cfg.group_base, Scope::Subtree, &gf, vec!["cn"])
            .and_then(|r| r.success())
            .map_err(|e| unavailable("读取用户组失败", e))?;
        groups.extend(gs.into_iter().map(|g| SearchEntry::construct(g).dn));
    }
    let _ = conn.unbind();
    groups.sort();
    groups.dedup();
    Ok(Verdict::Accepted(DirectoryUser {
        source: AccountSource::Ldap,
        username: name,
        display_name: entry.attrs.get(&cfg.display_attribute).and_then(|v| v.first()).cloned(),
        groups,
    }))
}
