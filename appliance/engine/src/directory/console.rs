//! The hospital sign-in as the settings page edits it: `care.toml`'s `[ldap]` and `[oidc]` give the start, and a
//! section an administrator saves in the console replaces the file's (SQLite `sign_in_config`, audited in the same
//! transaction) until they clear it. Readers take the sections in force from an in-memory copy that every change
//! replaces, so a change applies to the next sign-in without a restart.
//!
//! A section is saved only when it holds together and works: the checks the appliance makes at start, every
//! collection a group grants exists, and the server answers (a service-account bind, or the provider's discovery
//! document), so a typo cannot lock the hospital's staff out. Secrets are never shown back: their field is empty
//! and left empty it keeps the stored value.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use rusqlite::{OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

use super::ldap::LdapConfig;
use super::oidc::OidcConfig;
use crate::audit;
use crate::error::{Error, Result};
use crate::store::{Store, now};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Ldap,
    Oidc,
}

impl Protocol {
    pub const ALL: [Protocol; 2] = [Protocol::Ldap, Protocol::Oidc];

    pub fn key(self) -> &'static str {
        match self {
            Protocol::Ldap => "ldap",
            Protocol::Oidc => "oidc",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Ldap => "医院目录（LDAP/AD）",
            Protocol::Oidc => "统一认证（OIDC）",
        }
    }
    pub fn parse(key: &str) -> Result<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.key() == key).ok_or_else(|| {
            Error::InvalidInput(format!("没有名为「{}」的登录方式", key.chars().take(40).collect::<String>()))
        })
    }
    fn fields(self) -> &'static [Spec] {
        match self {
            Protocol::Ldap => LDAP_FIELDS,
            Protocol::Oidc => OIDC_FIELDS,
        }
    }
}

/// How a field is typed on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldKind {
    Text,
    /// Never shown; left empty it keeps the stored value.
    Secret,
    Flag,
    Number,
    /// One entry per line (group DNs hold commas).
    Lines,
    /// `组 = 资料库1, 资料库2` per line.
    Grants,
}

/// A field: its place in the section (`groups.admin`), its words, its kind.
#[derive(Debug, Clone, Copy)]
struct Spec {
    key: &'static str,
    label: &'static str,
    help: &'static str,
    kind: FieldKind,
}

const fn f(key: &'static str, label: &'static str, help: &'static str, kind: FieldKind) -> Spec {
    Spec { key, label, help, kind }
}

use FieldKind::{Flag, Grants, Lines, Number, Secret, Text};

const GROUP_FIELDS: [Spec; 3] = [
    f("groups.admin", "管理员组", "每行一个组（完整 DN 或其 `cn`）；其成员是本系统的管理员", Lines),
    f("groups.clinician", "临床用户组", "每行一个组；留空则目录允许登录的人都是临床用户", Lines),
    f("groups.collections", "组授予的资料库", "每行一条：组 = 资料库1, 资料库2", Grants),
];

const LDAP_FIELDS: &[Spec] = &[
    f("url", "地址", "`ldaps://dc1.hospital.local:636`，或 `ldap://…:389` 并开启 StartTLS；留空即关闭目录登录", Text),
    f("starttls", "StartTLS", "`ldap://` 地址先升级为加密连接（不加密的连接不被接受）", Flag),
    f("ca_file", "CA 证书文件", "签发目录服务器证书的医院 CA 在本机的路径（PEM）；留空用系统根证书", Text),
    f("bind_dn", "服务账户", "用来查找人员的只读账户（DN）", Text),
    f("bind_password", "服务账户密码", "不显示；留空则保持原密码", Secret),
    f("user_base", "用户位置", "查找人员的起点（`base DN`）", Text),
    f("user_filter", "用户筛选", "`{username}` 换成登录时输入的用户名；在此排除已停用的人员", Text),
    f("name_attribute", "用户名属性", "其值成为本系统的账户名", Text),
    f("display_attribute", "姓名属性", "页面上显示的姓名", Text),
    f("member_of_attribute", "所属组属性", "人员条目上列出所属组的属性（AD 的 `memberOf`）；留空则不读", Text),
    f("group_base", "组位置", "在此查找列出成员的组；留空只用所属组属性", Text),
    f("group_filter", "组筛选", "`{dn}` 换成人员的 DN，`{username}` 换成用户名", Text),
    f("timeout_seconds", "超时（秒）", "连接和每次查询最多等待的秒数（1–120）", Number),
    GROUP_FIELDS[0],
    GROUP_FIELDS[1],
    GROUP_FIELDS[2],
];

const OIDC_FIELDS: &[Spec] = &[
    f("issuer", "签发方", "统一认证平台的签发方（`issuer`）地址；留空即关闭统一认证登录", Text),
    f("client_id", "客户端 ID", "在统一认证平台登记本系统时得到", Text),
    f("client_secret", "客户端密钥", "不显示；留空则保持原密钥", Secret),
    f("redirect_url", "回调地址", "在平台登记的本系统回调：`https://<本机地址>/login/oidc/callback`", Text),
    f("scopes", "申请的范围", "`openid` 之外，每行一个", Lines),
    f("username_claim", "用户名声明", "其值成为本系统的账户名", Text),
    f("display_claim", "姓名声明", "页面上显示的姓名", Text),
    f("groups_claim", "组声明", "列出人员所属组的声明", Text),
    f("ca_file", "CA 证书文件", "签发平台证书的医院 CA 在本机的路径（PEM）；留空用系统根证书", Text),
    f("button_label", "按钮文字", "登录页上统一认证按钮的文字", Text),
    GROUP_FIELDS[0],
    GROUP_FIELDS[1],
    GROUP_FIELDS[2],
];

/// A field as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Field {
    /// The form's name for it.
    pub key: &'static str,
    pub label: &'static str,
    pub help: &'static str,
    pub kind: FieldKind,
    /// The value in force as typed (empty for a secret).
    pub value: String,
    /// A secret: whether one is stored.
    pub set: bool,
}

/// Who saved a section in the console, and when.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saved {
    pub by: String,
    pub at: String,
}

/// The sections in force.
#[derive(Debug, Clone, Default)]
pub struct SignIn {
    pub ldap: LdapConfig,
    pub oidc: OidcConfig,
    pub ldap_saved: Option<Saved>,
    pub oidc_saved: Option<Saved>,
}

impl SignIn {
    pub fn saved(&self, p: Protocol) -> Option<&Saved> {
        match p {
            Protocol::Ldap => self.ldap_saved.as_ref(),
            Protocol::Oidc => self.oidc_saved.as_ref(),
        }
    }

    pub fn enabled(&self, p: Protocol) -> bool {
        match p {
            Protocol::Ldap => self.ldap.enabled(),
            Protocol::Oidc => self.oidc.enabled(),
        }
    }

    fn section(&self, p: Protocol) -> Value {
        match p {
            Protocol::Ldap => serde_json::to_value(&self.ldap),
            Protocol::Oidc => serde_json::to_value(&self.oidc),
        }
        .unwrap_or(Value::Null)
    }

    /// The page's fields of `p`, with the values in force.
    pub fn fields(&self, p: Protocol) -> Vec<Field> {
        let section = self.section(p);
        p.fields()
            .iter()
            .map(|s| {
                let v = lookup(&section, s.key);
                let set = s.kind == Secret && v.as_str().is_some_and(|x| !x.is_empty());
                Field { key: s.key, label: s.label, help: s.help, kind: s.kind, value: shown(s.kind, v), set }
            })
            .collect()
    }
}

fn lookup<'v>(section: &'v Value, key: &str) -> &'v Value {
    key.split('.').fold(section, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn shown(kind: FieldKind, v: &Value) -> String {
    let list = |v: &Value| -> Vec<String> {
        v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()).unwrap_or_default()
    };
    match (kind, v) {
        (Secret, _) | (_, Value::Null) => String::new(),
        (Lines, v) => list(v).join("\n"),
        (Grants, Value::Object(m)) => {
            m.iter().map(|(g, cs)| format!("{g} = {}", list(cs).join(", "))).collect::<Vec<_>>().join("\n")
        }
        (_, Value::String(s)) => s.clone(),
        (_, v) => v.to_string(),
    }
}

/// The value a field's text stands for; `None` keeps what is stored (a field the form does not carry, an empty
/// secret). A flag the form does not carry is off: that is how a browser sends an unticked box.
fn typed(s: &Spec, raw: Option<&str>) -> Result<Option<Value>> {
    let Some(raw) = raw else {
        return Ok((s.kind == Flag).then_some(Value::Bool(false)));
    };
    let bad = |why: String| Error::InvalidInput(format!("登录设置「{}」{why}", s.label));
    let lines = || raw.lines().map(str::trim).filter(|l| !l.is_empty());
    Ok(Some(match s.kind {
        Secret if raw.is_empty() => return Ok(None),
        Secret => Value::String(raw.to_string()),
        Flag => Value::Bool(matches!(raw, "on" | "true" | "1")),
        Number => {
            let n: u64 = raw.trim().parse().map_err(|_| bad(format!("须为整数，收到「{}」", clip(raw))))?;
            if !(1..=120).contains(&n) {
                return Err(bad(format!("须在 1 到 120 之间，收到 {n}")));
            }
            Value::from(n)
        }
        Lines => Value::from(lines().map(str::to_string).collect::<Vec<_>>()),
        Grants => {
            let mut map = serde_json::Map::new();
            for (i, line) in lines().enumerate() {
                // At the last '=': a group's DN holds some, a collection's name none.
                let Some((group, cs)) = line.rsplit_once(['=', '＝']) else {
                    return Err(bad(format!("第 {} 行应为「组 = 资料库1, 资料库2」，收到「{}」", i + 1, clip(line))));
                };
                let cs: Vec<&str> = cs.split([',', '，', '、', ' ']).map(str::trim).filter(|c| !c.is_empty()).collect();
                if group.trim().is_empty() || cs.is_empty() {
                    return Err(bad(format!("第 {} 行缺少组或资料库：「{}」", i + 1, clip(line))));
                }
                map.insert(group.trim().to_string(), Value::from(cs));
            }
            Value::Object(map)
        }
        // Optional paths (the CA file) are absent when empty.
        Text if raw.trim().is_empty() && s.key == "ca_file" => Value::Null,
        Text => Value::String(raw.trim().to_string()),
    }))
}

fn clip(s: &str) -> String {
    s.chars().take(60).collect()
}

fn set_at(section: &mut Value, key: &str, v: Value) {
    let mut at = section;
    let parts: Vec<&str> = key.split('.').collect();
    for k in &parts[..parts.len() - 1] {
        at = &mut at[*k];
    }
    at[parts[parts.len() - 1]] = v;
}

/// One protocol's section, typed.
#[derive(Debug)]
pub enum Section {
    Ldap(LdapConfig),
    Oidc(OidcConfig),
}

impl Section {
    fn parse(p: Protocol, v: &Value) -> std::result::Result<Section, serde_json::Error> {
        Ok(match p {
            Protocol::Ldap => Section::Ldap(serde_json::from_value(v.clone())?),
            Protocol::Oidc => Section::Oidc(serde_json::from_value(v.clone())?),
        })
    }

    /// The checks the appliance makes at start.
    fn validate(&self) -> Result<()> {
        match self {
            Section::Ldap(c) => c.validate(),
            Section::Oidc(c) => c.validate(),
        }
    }

    fn groups(&self) -> &super::GroupMapping {
        match self {
            Section::Ldap(c) => &c.groups,
            Section::Oidc(c) => &c.groups,
        }
    }

    /// Whether its server answers (nothing to ask when the section turns the protocol off).
    pub fn probe(&self) -> Result<()> {
        match self {
            Section::Ldap(c) if c.enabled() => super::ldap::probe(c),
            Section::Oidc(c) if c.enabled() => super::oidc::probe(c),
            _ => Ok(()),
        }
    }

    fn install(self, s: &mut SignIn, saved: Option<Saved>) {
        match self {
            Section::Ldap(c) => (s.ldap, s.ldap_saved) = (c, saved),
            Section::Oidc(c) => (s.oidc, s.oidc_saved) = (c, saved),
        }
    }
}

/// A section as a form made it: stored as `json`, checked as `section`.
#[derive(Debug)]
pub struct Checked {
    pub json: Value,
    pub section: Section,
}

/// The section an administrator's form makes of the one in force: the fields of `p` that `form` carries (a flag
/// absent is off, a secret left empty is kept). Checked as at start; collections the groups grant must exist.
pub fn from_form(store: &Store, current: &SignIn, p: Protocol, form: &BTreeMap<String, String>) -> Result<Checked> {
    let mut json = current.section(p);
    for s in p.fields() {
        if let Some(v) = typed(s, form.get(s.key).map(String::as_str))? {
            set_at(&mut json, s.key, v);
        }
    }
    let section = Section::parse(p, &json).map_err(|e| Error::InvalidInput(format!("登录设置无效：{e}")))?;
    section.validate()?;
    for c in section.groups().collections.values().flatten() {
        if store.collection(c).is_err() {
            return Err(Error::InvalidInput(format!("「组授予的资料库」中的资料库 {c} 不存在")));
        }
    }
    Ok(Checked { json, section })
}

/// The sign-in in force, kept in memory for the sign-in paths.
#[derive(Debug, Default)]
pub struct LiveSignIn {
    current: RwLock<Arc<SignIn>>,
}

impl LiveSignIn {
    pub fn get(&self) -> Arc<SignIn> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `care.toml`'s sections, each replaced by the console's when one is stored. A stored section that no longer
    /// reads (written by a newer version) is skipped with a warning: the file's applies.
    pub fn reload(&self, store: &Store, file_ldap: &LdapConfig, file_oidc: &OidcConfig) -> Result<()> {
        let mut s = SignIn { ldap: file_ldap.clone(), oidc: file_oidc.clone(), ..SignIn::default() };
        for p in Protocol::ALL {
            let row: Option<(String, String, String)> = store
                .reader()
                .query_row(
                    "SELECT config, updated_by, updated_at FROM sign_in_config WHERE protocol = ?1",
                    [p.key()],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let Some((json, by, at)) = row else { continue };
            match serde_json::from_str::<Value>(&json).and_then(|v| Section::parse(p, &v)) {
                Ok(section) => section.install(&mut s, Some(Saved { by, at })),
                Err(e) => {
                    tracing::warn!(protocol = p.key(), error = %e, "stored sign-in settings unreadable; care.toml applies")
                }
            }
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(s);
        Ok(())
    }
}

/// Stores `section` for `p` (`None`: back to `care.toml`'s), audited with the names of the fields that changed
/// (a secret's name only), in one transaction.
pub fn save(store: &Store, actor: &str, current: &SignIn, p: Protocol, section: Option<&Value>) -> Result<()> {
    let before = current.section(p);
    let changed: Vec<&str> = match section {
        Some(after) => p.fields().iter().map(|s| s.key).filter(|k| lookup(&before, k) != lookup(after, k)).collect(),
        None => Vec::new(),
    };
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    match section {
        Some(v) => tx.execute(
            "INSERT INTO sign_in_config (protocol, config, updated_by, updated_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(protocol) DO UPDATE SET config = ?2, updated_by = ?3, updated_at = ?4",
            params![p.key(), v.to_string(), actor, now()],
        )?,
        None => tx.execute("DELETE FROM sign_in_config WHERE protocol = ?1", [p.key()])?,
    };
    let detail = serde_json::json!({"sign_in": p.key(), "changed": changed, "cleared": section.is_none()});
    audit::append(&tx, actor, "settings.sign_in", &detail)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_form_round_trips_and_keeps_a_secret_left_empty() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open_with(&t.path().join("s.sqlite"), 1).unwrap();
        store.create_collection("xinnei", "", "admin").unwrap();
        let mut current = SignIn::default();
        current.ldap.bind_password = "s3cret".into();
        let fields = current.fields(Protocol::Ldap);
        let pw = fields.iter().find(|f| f.key == "bind_password").unwrap();
        assert!(pw.set && pw.value.is_empty(), "a secret is never shown back: {pw:?}");
        let mut typed: BTreeMap<String, String> = fields.iter().map(|f| (f.key.to_string(), f.value.clone())).collect();
        typed.extend(form(&[
            ("url", "ldap://dc1.hospital.local"),
            ("starttls", "on"),
            ("user_base", "ou=people,dc=hospital"),
            ("groups.admin", "cn=care-admins,ou=groups,dc=hospital\n\n  it-staff "),
            ("groups.collections", "心内科 = xinnei\ncn=all,ou=groups ＝ xinnei，xinnei"),
        ]));
        let v = from_form(&store, &current, Protocol::Ldap, &typed).unwrap().json;
        let c: LdapConfig = serde_json::from_value(v).unwrap();
        assert_eq!(c.bind_password, "s3cret");
        assert_eq!(c.groups.admin, ["cn=care-admins,ou=groups,dc=hospital", "it-staff"]);
        assert_eq!(c.groups.collections["cn=all,ou=groups"], ["xinnei", "xinnei"]);
        assert_eq!(c.ca_file, None);
        // What the page shows of the result parses back to the same section.
        let again = SignIn { ldap: c.clone(), ..SignIn::default() };
        let shown: BTreeMap<String, String> =
            again.fields(Protocol::Ldap).into_iter().map(|f| (f.key.to_string(), f.value)).collect();
        let c2: LdapConfig =
            serde_json::from_value(from_form(&store, &again, Protocol::Ldap, &shown).unwrap().json).unwrap();
        assert_eq!(c, c2);
    }

    #[test]
    fn a_section_that_cannot_work_is_refused_in_chinese() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open_with(&t.path().join("s.sqlite"), 1).unwrap();
        let current = SignIn::default();
        let base = [("user_base", "ou=people,dc=h"), ("starttls", "on"), ("timeout_seconds", "10")];
        for (extra, words) in [
            (("url", "ldap://dc1"), ""),
            (("starttls", ""), "未加密"),
            (("timeout_seconds", "0"), "超时"),
            (("groups.collections", "心内科 xinnei"), "第 1 行"),
            (("groups.collections", "心内科 = missing"), "missing 不存在"),
        ] {
            let mut f = form(&base);
            f.insert("url".into(), "ldap://dc1".into());
            f.insert(extra.0.into(), extra.1.into());
            match from_form(&store, &current, Protocol::Ldap, &f) {
                Ok(_) => assert!(words.is_empty(), "{extra:?} accepted"),
                Err(e) => assert!(!words.is_empty() && e.to_string().contains(words), "{extra:?}: {e}"),
            }
        }
        let e = from_form(
            &store,
            &current,
            Protocol::Oidc,
            &form(&[
                ("issuer", "https://sso"),
                ("redirect_url", "https://care/login/oidc/callback"),
                ("client_id", ""),
            ]),
        );
        assert!(e.unwrap_err().to_string().contains("client_id"));
    }
}
