//! Accounts: users and roles, password logins with lockout, browser sessions, API tokens and per-collection read
//! grants.
//!
//! Secrets never reach SQLite in the clear: passwords are argon2id PHC strings; session ids and API tokens are
//! 256-bit random values stored as sha256 hex (they are high-entropy, so a fast hash is enough and lookups stay
//! indexed). Argon2 runs on a fixed pool of threads that keep their memory (accounts/hashing.rs), without the
//! store's connection lock held, so a login never stalls searches and a burst of sign-ins cannot grow memory.
//! Every change to an account, role, token or grant is audited in the same transaction.

mod hashing;
mod tokens;
pub use tokens::*;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::audit;
use crate::clock::utc_unix;
use crate::error::{Error, Result};
use crate::store::{Store, now};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Clinician,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Clinician => "clinician",
        }
    }
    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "admin" => Ok(Role::Admin),
            "clinician" => Ok(Role::Clinician),
            _ => Err(Error::InvalidInput(format!("未知角色 {s:?}：只能是 admin（管理员）或 clinician（临床用户）"))),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub role: Role,
    pub created_at: String,
    pub failed_logins: i64,
    /// Unix seconds until which logins are refused.
    pub locked_until: Option<i64>,
    pub disabled: bool,
    /// Set for the first administrator's generated password: every page leads to the password change until done.
    pub must_change_password: bool,
    /// Where the identity lives: a password here, or the hospital's directory (which then owns role and grants).
    pub source: AccountSource,
    /// The name the directory gives the person.
    pub display_name: Option<String>,
    /// Groups (departments) the account belongs to, which documents' access lists name: the directory's at each
    /// sign-in, or set by an administrator for a local account.
    pub groups: Vec<String>,
}

impl User {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
    pub fn is_locked(&self, now: i64) -> bool {
        self.locked_until.is_some_and(|t| t > now)
    }
}

/// Where an account's identity lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccountSource {
    /// A password kept here (administrators, break-glass accounts, sites without a directory).
    Local,
    Ldap,
    Oidc,
}

impl AccountSource {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountSource::Local => "local",
            AccountSource::Ldap => "ldap",
            AccountSource::Oidc => "oidc",
        }
    }
    pub fn parse(s: &str) -> AccountSource {
        match s {
            "ldap" => AccountSource::Ldap,
            "oidc" => AccountSource::Oidc,
            _ => AccountSource::Local,
        }
    }
    pub fn label_zh(self) -> &'static str {
        match self {
            AccountSource::Local => "本地账户",
            AccountSource::Ldap => "目录账户（LDAP）",
            AccountSource::Oidc => "统一认证（OIDC）",
        }
    }
}

/// A directory that vouches for names that are no local account (LDAP: [`crate::directory`] implements it, so
/// that this module, below it, needs nothing of the protocols).
pub trait Directory {
    /// Checks the name and password there; when it accepts, the account is created or refreshed from what the
    /// directory says and returned.
    fn sign_in(&self, store: &Store, username: &str, password: &str, client: &str) -> Result<DirectoryAnswer>;
}

/// What a directory said at a sign-in.
pub enum DirectoryAnswer {
    SignedIn(User),
    /// Wrong password (the person exists).
    Rejected,
    /// No such person, or the directory's filter excludes them (disabled, left the hospital).
    Gone,
}

/// Lockout policy: after `max_failed` consecutive failures the account is locked for `lock_seconds`. On top of
/// the per-name lock, one client address may fail `address_max_failed` times (sign-ins and current-password checks
/// together, over any names) per `address_window_seconds`; then it is refused without a password check for the
/// rest of the window. Guessing across many names from one machine is what the per-name lock cannot see.
#[derive(Debug, Clone, Copy)]
pub struct LoginPolicy {
    pub max_failed: u32,
    pub lock_seconds: i64,
    pub address_max_failed: u32,
    pub address_window_seconds: i64,
}

impl Default for LoginPolicy {
    fn default() -> Self {
        LoginPolicy { max_failed: 5, lock_seconds: 15 * 60, address_max_failed: 30, address_window_seconds: 15 * 60 }
    }
}

/// One password attempt counted against its client address before the password is checked (that cost is what a
/// flood from one machine is after): a full window refuses it at once, and concurrent attempts cannot pass the
/// limit together. Only a failed check stays counted ([`AddressAttempt::failed`]); dropped otherwise (a success, a
/// lock, an overloaded or unreachable check), the attempt is taken back. The refusal itself is not audited: the
/// record of the failure that filled the window says it, and one record per refused attempt would let the flood
/// fill the audit log instead.
struct AddressAttempt<'a> {
    store: &'a Store,
    key: String,
    /// Attempts in the window, this one included.
    counted: u32,
    failed: bool,
}

impl<'a> AddressAttempt<'a> {
    fn begin(store: &'a Store, client: &str, policy: LoginPolicy, now_ts: i64) -> Result<Self> {
        let key = crate::limits::address_key(client);
        let limit = policy.address_max_failed;
        match store.limits.sign_in_failures.admit(&key, limit, policy.address_window_seconds, now_ts) {
            Ok(counted) => Ok(AddressAttempt { store, key, counted, failed: false }),
            Err(wait) => Err(Error::RateLimited(format!(
                "此地址的登录失败次数过多，请 {} 后再试 (too many failed sign-ins from this address)",
                crate::limits::minutes_zh(wait)
            ))),
        }
    }

    /// The attempt failed and stays counted; the one that fills the window is audited.
    fn failed(mut self, policy: LoginPolicy, now_ts: i64) -> Result<()> {
        self.failed = true;
        if self.counted < policy.address_max_failed.max(1) {
            return Ok(());
        }
        let mut conn = self.store.conn();
        let tx = conn.transaction()?;
        audit::append(
            &tx,
            "system",
            "auth.address_throttled",
            &serde_json::json!({"client": self.key, "failures": self.counted,
                "until": utc_unix(now_ts + policy.address_window_seconds)}),
        )?;
        tx.commit()?;
        Ok(())
    }
}

impl Drop for AddressAttempt<'_> {
    fn drop(&mut self) {
        if !self.failed {
            self.store.limits.sign_in_failures.undo(&self.key);
        }
    }
}

/// Password checks of one name run one at a time, the next ones waiting their turn (at most [`NAME_WAITERS`]):
/// concurrent guesses at one name, from however many addresses, then each see the lock the ones before them set,
/// instead of all passing the lockout check before the first failure is counted. A person signs in once at a time.
const CHECKS_PER_NAME: u32 = 1;
const NAME_WAITERS: u32 = 32;

fn name_turn<'a>(store: &'a Store, username: &str) -> Result<crate::limits::Running<'a>> {
    let key: String = username.trim().to_lowercase().chars().take(64).collect();
    store.limits.sign_ins_by_name.enter(&key, CHECKS_PER_NAME, NAME_WAITERS).ok_or_else(|| {
        Error::RateLimited("此账户的登录请求过多，请稍后再试 (too many sign-ins for this name at once)".into())
    })
}

pub const MIN_PASSWORD_CHARS: usize = 10;

/// What `grants.granted_by` says for a grant that follows a directory group (replaced at each sign-in).
pub const DIRECTORY_GRANTOR: &str = "directory";

pub fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// 32 random bytes from the OS, hex encoded.
pub fn random_token() -> Result<String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| Error::Internal(format!("OS random source: {e}")))?;
    Ok(hex::encode(b))
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Password hashes computed by this process so far (the pool's count; `/metrics` exports it).
pub fn password_hashes_computed() -> u64 {
    hashing::computed()
}

pub fn hash_password(password: &str) -> Result<String> {
    hashing::hash(password)
}

fn password_matches(password: &str, phc: &str) -> Result<bool> {
    hashing::verify(password, phc)
}

/// Words Chinese users build passwords from that zxcvbn's (English-centred) lists miss: love numbers, common
/// pinyin names and the workplace. Matched like dictionary words, so `woaini1314` or `yiyuan2024` rate as weak.
const CHINESE_COMMON: &[&str] = &[
    "woaini",
    "aini",
    "1314",
    "520",
    "5201314",
    "zhangsan",
    "lisi",
    "wangwu",
    "zhang",
    "wang",
    "li",
    "liu",
    "chen",
    "yang",
    "zhao",
    "huang",
    "zhou",
    "wu",
    "xu",
    "sun",
    "ma",
    "zhu",
    "hu",
    "guo",
    "lin",
    "he",
    "gao",
    "luo",
    "yiyuan",
    "yisheng",
    "hushi",
    "keshi",
    "zhongguo",
    "beijing",
    "shanghai",
    "qq",
    "care",
    "hospital",
    "admin",
    "doctor",
    "nurse",
    "mima",
    "woaiyiyuan",
];

/// Least zxcvbn score (0–4) a new password needs: 3 is "safely unguessable" (about 10^8 guesses and more).
const MIN_PASSWORD_SCORE: u8 = 3;

/// A new password's strength: long enough, not the user name, and not guessable. zxcvbn (Dropbox's
/// estimator) carries the leaked-password lists, keyboard walks, dates and l33t forms, so `password12`,
/// `Aa123456789` and `1qaz2wsx3edc` are refused however long they are; the user name and common Chinese choices
/// count as dictionary words too.
pub fn check_password_strength(username: &str, password: &str) -> Result<()> {
    let n = password.chars().count();
    if n < MIN_PASSWORD_CHARS {
        return Err(Error::InvalidInput(format!("密码至少需要 {MIN_PASSWORD_CHARS} 个字符，现在只有 {n} 个")));
    }
    let name = username.to_lowercase();
    if password.to_lowercase() == name {
        return Err(Error::InvalidInput("密码不能与用户名相同".into()));
    }
    let mut inputs: Vec<&str> = CHINESE_COMMON.to_vec();
    inputs.push(&name);
    // zxcvbn's cost grows with length; past 100 characters a password is not guessable anyway.
    let head: String = password.chars().take(100).collect();
    let weak = zxcvbn::zxcvbn(&head, &inputs);
    if (weak.score() as u8) < MIN_PASSWORD_SCORE {
        return Err(Error::InvalidInput(
            "密码太容易被猜中（常见密码、键盘顺序、生日、拼音姓名或“123”类结尾都属此类）；\
             请换一个更长、无规律的密码，例如三四个不相关的词加上数字或符号"
                .into(),
        ));
    }
    Ok(())
}

pub(crate) fn validate_username(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.chars().count() <= 64
        && name.chars().all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("用户名 {name:?} 不可用：请用 1–64 个字母、数字或 - _ . @")))
    }
}

const USER_COLS: &str = "id, username, role, created_at, failed_logins, locked_until, disabled, must_change_password, source, display_name, groups";
const USER_COL_COUNT: usize = 11;

fn row_to_user(r: &rusqlite::Row<'_>) -> rusqlite::Result<User> {
    row_to_user_at(r, 0)
}

/// A user from the `USER_COLS` columns starting at column `at` (joins put other columns first).
fn row_to_user_at(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<User> {
    let role: String = r.get(at + 2)?;
    Ok(User {
        id: r.get(at)?,
        username: r.get(at + 1)?,
        role: if role == "admin" { Role::Admin } else { Role::Clinician },
        created_at: r.get(at + 3)?,
        failed_logins: r.get(at + 4)?,
        locked_until: r.get(at + 5)?,
        disabled: r.get::<_, i64>(at + 6)? != 0,
        must_change_password: r.get::<_, i64>(at + 7)? != 0,
        source: AccountSource::parse(&r.get::<_, String>(at + 8)?),
        display_name: r.get(at + 9)?,
        groups: split_groups(&r.get::<_, String>(at + 10)?),
    })
}

/// Groups as stored (comma-separated) → a list.
pub(crate) fn split_groups(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_string).collect()
}

pub fn user_count(store: &Store) -> Result<i64> {
    Ok(store.reader().query_row("SELECT COUNT(*) FROM users", [], |r| r.get(0))?)
}

pub fn list_users(store: &Store) -> Result<Vec<User>> {
    let conn = store.reader();
    let mut stmt = conn.prepare(&format!("SELECT {USER_COLS} FROM users ORDER BY username"))?;
    let rows = stmt.query_map([], row_to_user)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn user_by(conn: &Connection, username: &str) -> Result<User> {
    conn.query_row(&format!("SELECT {USER_COLS} FROM users WHERE username = ?1"), [username], row_to_user)
        .optional()?
        .ok_or_else(|| Error::NotFound { what: format!("用户 {username}") })
}

pub fn user(store: &Store, username: &str) -> Result<User> {
    user_by(&store.reader(), username)
}

pub fn user_by_id(store: &Store, id: i64) -> Result<User> {
    store
        .reader()
        .query_row(&format!("SELECT {USER_COLS} FROM users WHERE id = ?1"), [id], row_to_user)
        .optional()?
        .ok_or_else(|| Error::NotFound { what: format!("用户 #{id}") })
}

/// Creates an account. A `temporary` password (one an administrator chose for someone else) must be replaced at
/// the first sign-in: whoever set it knows it.
pub fn create_user(
    store: &Store,
    actor: &str,
    username: &str,
    password: &str,
    role: Role,
    temporary: bool,
) -> Result<User> {
    validate_username(username)?;
    check_password_strength(username, password)?;
    let phc = hash_password(password)?;
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let res = tx.execute(
        "INSERT INTO users (username, password_hash, role, created_at, password_changed_at, must_change_password)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
        params![username, phc, role.as_str(), now(), temporary as i64],
    );
    match res {
        Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
            return Err(Error::InvalidInput(format!("用户名 {username} 已被占用")));
        }
        r => r?,
    };
    let detail = serde_json::json!({"user": username, "role": role.as_str(), "temporary_password": temporary});
    audit::append(&tx, actor, "user.create", &detail)?;
    let u = user_by(&tx, username)?;
    tx.commit()?;
    Ok(u)
}

/// Failure state of a login name: the account's own counters, or the throttle row of a name that is no account.
enum Subject {
    Account(User, String),
    Unknown(String),
}

/// How an attempted name appears in the audit log: a real account by name; anything else only as a short hash and
/// its length, since people type passwords into the user-name field and names are attacker-chosen and unbounded.
fn attempted_name(username: &str) -> (String, serde_json::Value) {
    let h = sha256_hex(&username.to_lowercase());
    ("anonymous".into(), serde_json::json!({"name_sha256": &h[..16], "name_chars": username.chars().count()}))
}

fn locked_error(username: &str, until: i64) -> Error {
    Error::AccountLocked { user: username.chars().take(64).collect(), until: utc_unix(until) }
}

/// Checks a password login. Failures count towards the lockout, for names that are accounts and names that are not
/// alike, so neither the answer nor its timing tells which names exist; a disabled account answers like a wrong
/// password. The counters change with single SQL statements (never read-modify-write across the password check),
/// so concurrent guesses cannot slip past the limit and a stale attempt cannot clear a lock. Every attempt is
/// audited, never with the password.
///
/// With a directory (`ldap`), names that are no local account are checked there instead: an accepted person gets
/// their account created or refreshed (`crate::directory::provision`); one the directory no longer knows is
/// disabled here. Directory accounts never sign in with a password kept here.
pub fn authenticate(
    store: &Store,
    username: &str,
    password: &str,
    policy: LoginPolicy,
    client: &str,
    directory: Option<&dyn Directory>,
) -> Result<User> {
    let now_ts = unix_now();
    let attempt = AddressAttempt::begin(store, client, policy, now_ts)?;
    let _turn = name_turn(store, username)?;
    let subject = match lookup_login(store, username)? {
        Some((user, phc)) => Subject::Account(user, phc),
        None => Subject::Unknown(sha256_hex(&username.to_lowercase())),
    };
    if let Some(until) = locked_until(store, &subject, now_ts)? {
        audit_failure(store, username, &subject, client, "locked", None)?;
        return Err(locked_error(username, until));
    }
    let directory = match &subject {
        Subject::Account(u, _) if u.source == AccountSource::Local => None,
        _ => directory,
    };
    let ok = match (&subject, directory) {
        (_, Some(dir)) => match dir.sign_in(store, username, password, client)? {
            DirectoryAnswer::SignedIn(user) => return login_succeeded(store, &user, &user.username, client, now_ts),
            DirectoryAnswer::Gone => {
                disable_directory_account(store, username, "not found in the directory")?;
                false
            }
            DirectoryAnswer::Rejected => false,
        },
        (Subject::Account(u, phc), None) => password_matches(password, phc)? && !u.disabled,
        (Subject::Unknown(_), None) => {
            // Spend the same time as a real check, so response time does not reveal which names exist.
            password_matches(password, hashing::DUMMY_PHC)?;
            false
        }
    };
    if ok && let Subject::Account(user, _) = &subject {
        return login_succeeded(store, user, username, client, now_ts);
    }
    let (failures, until) = count_failure(store, &subject, policy, now_ts)?;
    attempt.failed(policy, now_ts)?;
    let reason = match &subject {
        Subject::Account(u, _) if u.disabled => "disabled",
        Subject::Account(..) => "wrong password",
        Subject::Unknown(_) => "unknown user",
    };
    audit_failure(store, username, &subject, client, reason, Some((failures, until)))?;
    match until {
        Some(t) => Err(locked_error(username, t)),
        None => Err(Error::LoginFailed("用户名或密码错误".into())),
    }
}

fn lookup_login(store: &Store, username: &str) -> Result<Option<(User, String)>> {
    if validate_username(username).is_err() {
        return Ok(None);
    }
    let conn = store.conn();
    Ok(conn
        .query_row(&format!("SELECT {USER_COLS}, password_hash FROM users WHERE username = ?1"), [username], |r| {
            Ok((row_to_user(r)?, r.get::<_, String>(USER_COL_COUNT)?))
        })
        .optional()?)
}

/// The lock in force now, read fresh (another attempt may have set it since the subject was loaded).
fn locked_until(store: &Store, subject: &Subject, now_ts: i64) -> Result<Option<i64>> {
    let conn = store.conn();
    let until: Option<i64> = match subject {
        Subject::Account(u, _) => {
            conn.query_row("SELECT locked_until FROM users WHERE id = ?1", [u.id], |r| r.get(0)).optional()?.flatten()
        }
        Subject::Unknown(h) => conn
            .query_row("SELECT locked_until FROM login_throttle WHERE name_hash = ?1", [h], |r| r.get(0))
            .optional()?
            .flatten(),
    };
    Ok(until.filter(|t| *t > now_ts))
}

/// Signs in unless a lock was set while the password was being checked; clears the counter only then.
pub(crate) fn login_succeeded(store: &Store, user: &User, username: &str, client: &str, now_ts: i64) -> Result<User> {
    let mut conn = store.conn();
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let n = tx.execute(
        "UPDATE users SET failed_logins = 0, locked_until = NULL
         WHERE id = ?1 AND (locked_until IS NULL OR locked_until <= ?2)",
        params![user.id, now_ts],
    )?;
    if n == 0 {
        let until: i64 = tx.query_row("SELECT locked_until FROM users WHERE id = ?1", [user.id], |r| r.get(0))?;
        audit::append(&tx, username, "auth.login_failed", &serde_json::json!({"reason": "locked", "client": client}))?;
        tx.commit()?;
        return Err(locked_error(username, until));
    }
    audit::append(&tx, username, "auth.login", &serde_json::json!({"client": client}))?;
    tx.commit()?;
    Ok(User { failed_logins: 0, locked_until: None, ..user.clone() })
}

/// Adds one failure atomically; the failure that reaches the limit sets the lock and restarts the count.
/// Returns (failures counted, lock set by this failure).
fn count_failure(store: &Store, subject: &Subject, policy: LoginPolicy, now_ts: i64) -> Result<(i64, Option<i64>)> {
    let max = i64::from(policy.max_failed.max(1));
    let until = now_ts + policy.lock_seconds;
    let conn = store.conn();
    let (failed, locked): (i64, Option<i64>) = match subject {
        Subject::Account(u, _) => conn.query_row(
            "UPDATE users SET
                 failed_logins = CASE WHEN failed_logins + 1 >= ?2 THEN 0 ELSE failed_logins + 1 END,
                 locked_until = CASE WHEN failed_logins + 1 >= ?2 THEN max(coalesce(locked_until, 0), ?3) ELSE locked_until END
             WHERE id = ?1 RETURNING failed_logins, locked_until",
            params![u.id, max, until],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?,
        Subject::Unknown(h) => conn.query_row(
            "INSERT INTO login_throttle (name_hash, failed_logins, locked_until, updated_at) VALUES (?1, 1, NULL, ?4)
             ON CONFLICT(name_hash) DO UPDATE SET
                 failed_logins = CASE WHEN failed_logins + 1 >= ?2 THEN 0 ELSE failed_logins + 1 END,
                 locked_until = CASE WHEN failed_logins + 1 >= ?2 THEN max(coalesce(locked_until, 0), ?3) ELSE locked_until END,
                 updated_at = ?4
             RETURNING failed_logins, locked_until",
            params![h, max, until, now_ts],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?,
    };
    // The count restarts at 0 exactly when this failure reached the limit and set the lock.
    let set_lock = failed == 0;
    Ok((if set_lock { max } else { failed }, locked.filter(|_| set_lock)))
}

fn audit_failure(
    store: &Store,
    username: &str,
    subject: &Subject,
    client: &str,
    reason: &str,
    counted: Option<(i64, Option<i64>)>,
) -> Result<()> {
    let (actor, mut detail) = match subject {
        Subject::Account(..) => (username.to_string(), serde_json::json!({})),
        Subject::Unknown(_) => attempted_name(username),
    };
    detail["reason"] = reason.into();
    detail["client"] = client.chars().take(64).collect::<String>().into();
    if let Some((failures, _)) = counted {
        detail["failures"] = failures.into();
    }
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    audit::append(&tx, &actor, "auth.login_failed", &detail)?;
    if let Some((_, Some(t))) = counted {
        let who = if matches!(subject, Subject::Account(..)) {
            serde_json::json!(username)
        } else {
            detail["name_sha256"].clone()
        };
        audit::append(&tx, "system", "auth.account_locked", &serde_json::json!({"user": who, "until": utc_unix(t)}))?;
    }
    tx.commit()?;
    Ok(())
}

/// The check of the current password a user gives to change it, with the client it came from.
#[derive(Debug, Clone, Copy)]
pub struct CurrentPassword<'a> {
    pub password: &'a str,
    pub policy: LoginPolicy,
    pub client: &'a str,
}

/// Changes a password. `current` is required when users change their own password; an admin resetting someone
/// else's passes `None`. All of the user's sessions and the lockout are cleared.
///
/// The current-password check is throttled like a sign-in: a wrong password counts towards the account's lock and
/// the client address's limit, and a locked account or a refused address is not checked at all. Otherwise anyone
/// holding a signed-in browser could guess the password behind it without limit.
///
/// A password set without the current one (an administrator's reset) is temporary unless `permanent`: the user
/// replaces it at the next sign-in.
pub fn set_password(
    store: &Store,
    actor: &str,
    username: &str,
    current: Option<CurrentPassword<'_>>,
    new: &str,
    permanent: bool,
) -> Result<()> {
    if let Ok(u) = user(store, username)
        && u.source != AccountSource::Local
    {
        return Err(Error::InvalidInput(format!(
            "{username} 是{}，密码由医院的目录管理，请在那里修改",
            u.source.label_zh()
        )));
    }
    check_password_strength(username, new)?;
    let temporary = current.is_none() && !permanent;
    if let Some(cur) = current {
        check_current_password(store, username, cur)?;
    }
    let phc = hash_password(new)?;
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let n = tx.execute(
        "UPDATE users SET password_hash = ?2, password_changed_at = ?3, failed_logins = 0, locked_until = NULL,
             must_change_password = ?4 WHERE username = ?1",
        params![username, phc, now(), temporary as i64],
    )?;
    if n == 0 {
        return Err(Error::NotFound { what: format!("用户 {username}") });
    }
    tx.execute("DELETE FROM sessions WHERE user_id = (SELECT id FROM users WHERE username = ?1)", [username])?;
    // A new password is usually a response to a suspected leak: the user's API tokens end with the old password.
    let tokens = tx.execute(
        "UPDATE api_tokens SET revoked = 1 WHERE revoked = 0 AND user_id = (SELECT id FROM users WHERE username = ?1)",
        [username],
    )?;
    audit::append(
        &tx,
        actor,
        "user.password_change",
        &serde_json::json!({"user": username, "reset_by_admin": current.is_none(), "temporary": temporary,
            "tokens_revoked": tokens}),
    )?;
    tx.commit()?;
    Ok(())
}

fn check_current_password(store: &Store, username: &str, cur: CurrentPassword<'_>) -> Result<()> {
    let now_ts = unix_now();
    let attempt = AddressAttempt::begin(store, cur.client, cur.policy, now_ts)?;
    let _turn = name_turn(store, username)?;
    let (user, phc) =
        lookup_login(store, username)?.ok_or_else(|| Error::NotFound { what: format!("用户 {username}") })?;
    let subject = Subject::Account(user, phc.clone());
    if let Some(until) = locked_until(store, &subject, now_ts)? {
        return Err(locked_error(username, until));
    }
    if password_matches(cur.password, &phc)? {
        return Ok(());
    }
    let (failures, until) = count_failure(store, &subject, cur.policy, now_ts)?;
    attempt.failed(cur.policy, now_ts)?;
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let detail = serde_json::json!({
        "reason": "wrong current password",
        "client": cur.client.chars().take(64).collect::<String>(),
        "failures": failures,
    });
    audit::append(&tx, username, "user.password_check_failed", &detail)?;
    if let Some(t) = until {
        audit::append(
            &tx,
            "system",
            "auth.account_locked",
            &serde_json::json!({"user": username, "until": utc_unix(t)}),
        )?;
    }
    tx.commit()?;
    match until {
        Some(t) => Err(locked_error(username, t)),
        None => Err(Error::InvalidInput("当前密码错误 (the current password is wrong)".into())),
    }
}

/// Changes the role, the disabled flag or clears a lock; refuses to leave the appliance without an enabled admin.
pub fn update_user(
    store: &Store,
    actor: &str,
    username: &str,
    role: Option<Role>,
    disabled: Option<bool>,
    unlock: bool,
) -> Result<User> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let before = user_by(&tx, username)?;
    if let Some(r) = role {
        tx.execute("UPDATE users SET role = ?2 WHERE id = ?1", params![before.id, r.as_str()])?;
    }
    if let Some(d) = disabled {
        tx.execute("UPDATE users SET disabled = ?2 WHERE id = ?1", params![before.id, d as i64])?;
        if d {
            tx.execute("DELETE FROM sessions WHERE user_id = ?1", [before.id])?;
        }
    }
    if unlock {
        tx.execute("UPDATE users SET failed_logins = 0, locked_until = NULL WHERE id = ?1", [before.id])?;
    }
    let admins: i64 =
        tx.query_row("SELECT COUNT(*) FROM users WHERE role = 'admin' AND disabled = 0", [], |r| r.get(0))?;
    if admins == 0 {
        return Err(Error::InvalidInput("此操作会使系统没有可用的管理员，已拒绝；请先启用或任命另一位管理员".into()));
    }
    audit::append(
        &tx,
        actor,
        "user.update",
        &serde_json::json!({"user": username, "role": role.map(Role::as_str), "disabled": disabled, "unlock": unlock}),
    )?;
    let after = user_by(&tx, username)?;
    tx.commit()?;
    Ok(after)
}

/// Disables a directory account the directory no longer admits and ends its sign-ins (local accounts are never
/// touched here). Returns whether anything changed.
pub fn disable_directory_account(store: &Store, username: &str, reason: &str) -> Result<bool> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let id: Option<i64> = tx
        .query_row("SELECT id FROM users WHERE username = ?1 AND source != 'local' AND disabled = 0", [username], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(id) = id else { return Ok(false) };
    tx.execute("UPDATE users SET disabled = 1 WHERE id = ?1", [id])?;
    tx.execute("DELETE FROM sessions WHERE user_id = ?1", [id])?;
    tx.execute("DELETE FROM grants WHERE user_id = ?1 AND granted_by = ?2", params![id, DIRECTORY_GRANTOR])?;
    audit::append(
        &tx,
        DIRECTORY_GRANTOR,
        "user.directory_disable",
        &serde_json::json!({"user": username, "reason": reason}),
    )?;
    tx.commit()?;
    Ok(true)
}

/// Sets the groups (departments) of a local account, which documents' access lists are matched against. A
/// directory account's groups come from the directory at each sign-in and are not set here.
pub fn set_groups(store: &Store, actor: &str, username: &str, groups: &str) -> Result<User> {
    let mut list: Vec<String> = Vec::new();
    for g in groups.split([',', '，', '、', ';', '；']).map(str::trim).filter(|g| !g.is_empty()) {
        if g.chars().count() > 40 {
            return Err(Error::InvalidInput(format!(
                "组名「{}…」过长（最多 40 个字）",
                g.chars().take(40).collect::<String>()
            )));
        }
        if !list.iter().any(|o| o.eq_ignore_ascii_case(g)) {
            list.push(g.to_string());
        }
    }
    if list.len() > 50 {
        return Err(Error::InvalidInput(format!("组太多：{} 个，最多 50 个", list.len())));
    }
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let before = user_by(&tx, username)?;
    if before.source != AccountSource::Local {
        return Err(Error::InvalidInput(format!(
            "{username} 是{}，其所在的组由医院目录决定，每次登录时更新",
            before.source.label_zh()
        )));
    }
    tx.execute("UPDATE users SET groups = ?2 WHERE id = ?1", params![before.id, list.join(",")])?;
    audit::append(&tx, actor, "user.update", &serde_json::json!({"user": username, "groups": list}))?;
    let after = user_by(&tx, username)?;
    tx.commit()?;
    Ok(after)
}

pub fn delete_user(store: &Store, actor: &str, username: &str) -> Result<()> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let u = user_by(&tx, username)?;
    tx.execute("DELETE FROM users WHERE id = ?1", [u.id])?;
    let admins: i64 =
        tx.query_row("SELECT COUNT(*) FROM users WHERE role = 'admin' AND disabled = 0", [], |r| r.get(0))?;
    if admins == 0 {
        return Err(Error::InvalidInput(
            "删除此用户会使系统没有可用的管理员，已拒绝；请先启用或任命另一位管理员".into(),
        ));
    }
    audit::append(&tx, actor, "user.delete", &serde_json::json!({"user": username}))?;
    tx.commit()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Sessions

#[derive(Debug, Clone)]
pub struct Session {
    pub user: User,
    pub csrf_token: String,
    pub created_at: i64,
    pub last_seen: i64,
}

/// Creates a session; returns the cookie value (shown once, stored only as its hash) and the CSRF token.
pub fn create_session(store: &Store, user: &User) -> Result<(String, String)> {
    let id = random_token()?;
    let csrf = random_token()?;
    let t = unix_now();
    store.conn().execute(
        "INSERT INTO sessions (id_hash, user_id, csrf_token, created_at, last_seen) VALUES (?1, ?2, ?3, ?4, ?4)",
        params![sha256_hex(&id), user.id, csrf, t],
    )?;
    Ok((id, csrf))
}

/// The live session for a cookie value, or `None` when unknown, idle longer than `idle_seconds`, older than
/// `max_seconds`, or its user is disabled. Expired sessions are removed. `last_seen` is refreshed at most once a
/// minute to keep writes off the hot path.
pub fn session(store: &Store, cookie: &str, idle_seconds: i64, max_seconds: i64) -> Result<Option<Session>> {
    let h = sha256_hex(cookie);
    let row = store
        .reader()
        .query_row(
            &format!(
                "SELECT s.csrf_token, s.created_at, s.last_seen, {} FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.id_hash = ?1",
                USER_COLS.split(", ").map(|c| format!("u.{c}")).collect::<Vec<_>>().join(", ")
            ),
            [&h],
            |r| {
                let csrf: String = r.get(0)?;
                let created: i64 = r.get(1)?;
                let seen: i64 = r.get(2)?;
                let user = row_to_user_at(r, 3)?;
                Ok(Session { user, csrf_token: csrf, created_at: created, last_seen: seen })
            },
        )
        .optional()?;
    let Some(s) = row else { return Ok(None) };
    let t = unix_now();
    if s.user.disabled || t - s.last_seen > idle_seconds || t - s.created_at > max_seconds {
        store.conn().execute("DELETE FROM sessions WHERE id_hash = ?1", [&h])?;
        return Ok(None);
    }
    if t - s.last_seen >= 60 {
        store.conn().execute("UPDATE sessions SET last_seen = ?2 WHERE id_hash = ?1", params![h, t])?;
    }
    Ok(Some(s))
}

pub fn end_session(store: &Store, cookie: &str, actor: &str) -> Result<()> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let n = tx.execute("DELETE FROM sessions WHERE id_hash = ?1", [sha256_hex(cookie)])?;
    if n > 0 {
        audit::append(&tx, actor, "auth.logout", &serde_json::json!({}))?;
    }
    tx.commit()?;
    Ok(())
}

/// Removes sessions idle past the timeout (run periodically; lookups also refuse them).
/// Also drops the failed-sign-in counters of unknown names that are neither locked nor touched for a day, so a
/// flood of made-up names does not grow the table for ever.
pub fn purge_sessions(store: &Store, idle_seconds: i64, max_seconds: i64) -> Result<usize> {
    let t = unix_now();
    let conn = store.conn();
    conn.execute(
        "DELETE FROM login_throttle WHERE updated_at < ?1 AND (locked_until IS NULL OR locked_until < ?2)",
        params![t - THROTTLE_KEEP_SECONDS, t],
    )?;
    Ok(conn.execute(
        "DELETE FROM sessions WHERE last_seen < ?1 OR created_at < ?2",
        params![t - idle_seconds, t - max_seconds],
    )?)
}

/// How long an unknown name's failed-sign-in counter is kept after its last attempt (when it is not locked).
const THROTTLE_KEEP_SECONDS: i64 = 24 * 3600;

// ---------------------------------------------------------------------------------------------------------------
// Grants

pub fn grant(store: &Store, actor: &str, username: &str, collection: &str) -> Result<()> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let u = user_by(&tx, username)?;
    let cid: i64 = tx
        .query_row("SELECT id FROM collections WHERE name = ?1", [collection], |r| r.get(0))
        .optional()?
        .ok_or_else(|| Error::UnknownCollection(collection.into()))?;
    tx.execute(
        "INSERT OR IGNORE INTO grants (user_id, collection_id, granted_by, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![u.id, cid, actor, now()],
    )?;
    audit::append(&tx, actor, "permission.grant", &serde_json::json!({"user": username, "collection": collection}))?;
    tx.commit()?;
    Ok(())
}

pub fn revoke(store: &Store, actor: &str, username: &str, collection: &str) -> Result<()> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let n = tx.execute(
        "DELETE FROM grants WHERE user_id = (SELECT id FROM users WHERE username = ?1)
           AND collection_id = (SELECT id FROM collections WHERE name = ?2)",
        params![username, collection],
    )?;
    if n == 0 {
        return Err(Error::NotFound { what: format!("{username} 对资料库 {collection} 的授权") });
    }
    audit::append(&tx, actor, "permission.revoke", &serde_json::json!({"user": username, "collection": collection}))?;
    tx.commit()?;
    Ok(())
}

/// Collections a clinician may read (names, sorted).
pub fn granted_collections(store: &Store, user_id: i64) -> Result<Vec<String>> {
    let conn = store.reader();
    let mut stmt = conn.prepare_cached(
        "SELECT c.name FROM grants g JOIN collections c ON c.id = g.collection_id WHERE g.user_id = ?1 ORDER BY c.name",
    )?;
    let rows = stmt.query_map([user_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// What `user` may read: every collection for an admin, the granted ones for a clinician.
pub fn readable_collections(store: &Store, user: &User) -> Result<Vec<String>> {
    if user.is_admin() {
        Ok(store.collection_list()?.into_iter().map(|c| c.name).collect())
    } else {
        granted_collections(store, user.id)
    }
}

/// Creates the first administrator when no user exists. Returns the generated password when none was given, so
/// the caller can show it once.
pub fn bootstrap_admin(store: &Store, username: &str, password: Option<&str>) -> Result<Option<String>> {
    if user_count(store)? > 0 {
        return Ok(None);
    }
    let generated = match password {
        Some(_) => None,
        None => Some(random_token()?[..20].to_string()),
    };
    let pw = password.or(generated.as_deref()).unwrap_or_default();
    // A generated password was printed once to a terminal or a journal: others may have seen it, so it must be
    // replaced.
    create_user(store, "system", username, pw, Role::Admin, generated.is_some())?;
    Ok(generated)
}

/// Who asks for an operation. Built from a signed-in [`User`], or for the shell on the appliance itself
/// ([`Actor::console`]: whoever can run `care` against the data directory already owns it) and for the server's
/// own housekeeping ([`Actor::system`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Actor {
    pub name: String,
    pub role: Role,
    /// The account behind the actor; `None` for the console and the system.
    pub user_id: Option<i64>,
    /// The account's groups, which documents' access lists are matched against (administrators read everything).
    pub groups: Vec<String>,
}

impl Actor {
    pub fn user(u: &User) -> Self {
        Actor { name: u.username.clone(), role: u.role, user_id: Some(u.id), groups: u.groups.clone() }
    }
    pub fn console(name: impl Into<String>) -> Self {
        Actor { name: name.into(), role: Role::Admin, user_id: None, groups: Vec::new() }
    }
    pub fn system() -> Self {
        Actor::console("system")
    }
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
    /// The proof an admin-only operation takes; refused with 403 for anyone else. Tasks call it again when they
    /// run, so an administrator demoted after submitting loses the task too.
    pub fn admin(&self) -> Result<Admin> {
        if self.is_admin() {
            Ok(Admin(self.clone()))
        } else {
            Err(Error::Forbidden("此操作需要管理员权限 (administrator role required)".into()))
        }
    }
}

/// An actor proven to be an administrator. Only [`Actor::admin`] (which checks the role) and [`Admin::console`]
/// make one, and every admin-only operation takes `&Admin`: an operation whose caller forgot the check does not
/// compile. It reads as the actor it proves (`Deref`), for audit records and ownership.
///
/// ```compile_fail
/// # fn f(e: &care_engine::Engine, someone: &care_engine::Actor) -> care_engine::Result<()> {
/// e.accounts().users(someone)?; // an actor is no proof: this does not compile
/// # Ok(())
/// # }
/// ```
/// ```no_run
/// # fn f(e: &care_engine::Engine, someone: &care_engine::Actor) -> care_engine::Result<()> {
/// e.accounts().users(&someone.admin()?)?; // checked: 403 unless `someone` is an administrator
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Admin(Actor);

impl Admin {
    /// The shell on the appliance itself (see [`Actor::console`]).
    pub fn console(name: impl Into<String>) -> Self {
        Admin(Actor::console(name))
    }
    /// The server's own housekeeping and the demo's setup.
    pub fn system() -> Self {
        Admin(Actor::system())
    }
    pub fn actor(&self) -> &Actor {
        &self.0
    }
}

impl std::ops::Deref for Admin {
    type Target = Actor;
    fn deref(&self) -> &Actor {
        &self.0
    }
}

#[cfg(test)]
mod tests;
