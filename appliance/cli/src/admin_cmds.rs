//! `care user …` and `care audit …`: account administration and the audit log from the command line (the console
//! equivalent of the admin pages; also how an operator recovers when no administrator can log in).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use care_engine::accounts::TokenScope;
use care_engine::{Admin, Engine, UserUpdate, audit};
use clap::Subcommand;

/// Who the audit log names for CLI actions: the operating-system account running the command, from its real uid
/// (`$USER` is whatever the caller's environment says, so it cannot name an actor in an audit trail).
pub fn actor() -> String {
    let uid = nix::unistd::getuid();
    let name = nix::unistd::User::from_uid(uid).ok().flatten().map(|u| u.name);
    match (name, std::env::var("SUDO_USER").ok().filter(|_| uid.is_root())) {
        (Some(n), Some(via)) => format!("cli:{n} (sudo by {via})"),
        (Some(n), None) => format!("cli:{n}"),
        (None, _) => format!("cli:uid {uid}"),
    }
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user. The password is read from --password-file or standard input (never from the command line).
    Add {
        username: String,
        #[arg(long, default_value = "clinician", value_parser = ["admin", "clinician"])]
        role: String,
        #[arg(long)]
        password_file: Option<PathBuf>,
        /// The password is the user's own (a service account, or your own break-glass admin): no change is asked
        /// for at the first sign-in. Without it the user must replace the password you chose.
        #[arg(long)]
        permanent: bool,
    },
    /// List users with their role, lock state and grants.
    List,
    /// Set a new password (read like `add`); ends the user's sessions and clears a lock. The user replaces it at
    /// the next sign-in unless --permanent.
    Passwd {
        username: String,
        #[arg(long)]
        password_file: Option<PathBuf>,
        #[arg(long)]
        permanent: bool,
    },
    /// Change the role, lock state or enabled state.
    Set {
        username: String,
        #[arg(long, value_parser = ["admin", "clinician"])]
        role: Option<String>,
        #[arg(long)]
        unlock: bool,
        #[arg(long, conflicts_with = "enable")]
        disable: bool,
        #[arg(long)]
        enable: bool,
        /// A local account's groups (departments), comma-separated: documents whose access list names one of
        /// them are visible to it. `--groups ""` clears them.
        #[arg(long)]
        groups: Option<String>,
    },
    /// Disable the directory (LDAP) accounts the directory no longer finds; the service also does this every six
    /// hours.
    SyncDirectory,
    /// Let a clinician read a collection.
    Grant { username: String, collection: String },
    /// Withdraw a clinician's read access to a collection.
    Revoke { username: String, collection: String },
    /// Issue an API token for machine clients; the secret is printed once.
    Token {
        username: String,
        /// What uses it, e.g. "HIS integration".
        #[arg(long)]
        name: String,
        /// `backups`: the token only lists and downloads backups (what a standby pulls them with); the user must
        /// be an administrator.
        #[arg(long)]
        scope: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check the whole keyed chain and audit.anchor, then move the anchor to the newest record; exits 4 with the
    /// first broken record when the log was edited, re-chained or records removed.
    Verify,
    /// Print records, newest first.
    List {
        #[arg(long)]
        actor: Option<String>,
        /// Action prefix, e.g. `auth.` or `search`.
        #[arg(long)]
        action: Option<String>,
        #[arg(long)]
        since: Option<String>,
        #[arg(long)]
        until: Option<String>,
        #[arg(long, short = 'n', default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Write records as CSV (oldest first, with their hashes).
    Export {
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        since: Option<String>,
        #[arg(long)]
        until: Option<String>,
    },
    /// Remove records older than the retention period now (the server also does this daily).
    Purge {
        #[arg(long)]
        days: u32,
    },
}

fn read_password(file: Option<&PathBuf>) -> Result<String> {
    let mut s = String::new();
    match file {
        Some(f) => s = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        None => {
            std::io::stdin().read_to_string(&mut s).context("reading the password from standard input")?;
        }
    }
    let pw = s.trim_end_matches(['\n', '\r']).to_string();
    if pw.is_empty() {
        bail!("no password given: pass --password-file FILE or pipe it on standard input");
    }
    Ok(pw)
}

pub fn run_user(e: &Engine, cmd: UserCommand) -> Result<i32> {
    let who = Admin::console(actor());
    match cmd {
        UserCommand::Add { username, role, password_file, permanent } => {
            let pw = read_password(password_file.as_ref())?;
            let u = e.accounts().create_user(&who, &username, &pw, &role, permanent)?;
            println!("created {} ({})", u.username, u.role.as_str());
            if !permanent {
                println!("首次登录时 {} 需要把这个初始密码改成自己的密码", u.username);
            }
        }
        UserCommand::List => {
            for u in e.accounts().users(&who)? {
                let state = match (u.disabled, u.locked) {
                    (true, _) => "disabled",
                    (false, true) => "locked",
                    (false, false) => "active",
                };
                let cols = if u.role == "admin" { "*".into() } else { u.collections.join(",") };
                println!("{}\t{}\t{}\t{}", u.username, u.role, state, cols);
            }
        }
        UserCommand::Passwd { username, password_file, permanent } => {
            let password = Some(read_password(password_file.as_ref())?);
            e.accounts().update_user(&who, &username, &UserUpdate { password, permanent, ..Default::default() })?;
            println!("password of {username} changed; their sessions ended");
        }
        UserCommand::Set { username, role, unlock, disable, enable, groups } => {
            let disabled = if disable {
                Some(true)
            } else if enable {
                Some(false)
            } else {
                None
            };
            let upd = UserUpdate { role, disabled, unlock, groups, ..Default::default() };
            e.accounts().update_user(&who, &username, &upd)?;
            let u = e.accounts().users(&who)?.into_iter().find(|u| u.username == username);
            if let Some(u) = u {
                println!("{}: role {}, {}", u.username, u.role, if u.disabled { "disabled" } else { "enabled" });
            }
        }
        UserCommand::SyncDirectory => {
            let gone = e.accounts().directory_sweep(&who)?;
            if gone.is_empty() {
                println!("目录中的账户均仍在，未停用任何账户");
            } else {
                println!("已停用目录中已不存在的 {} 个账户：{}", gone.len(), gone.join("、"));
            }
        }
        UserCommand::Grant { username, collection } => {
            e.accounts().grant(&who, &username, &collection)?;
            println!("{username} may now read '{collection}'");
        }
        UserCommand::Revoke { username, collection } => {
            e.accounts().revoke(&who, &username, &collection)?;
            println!("{username} may no longer read '{collection}'");
        }
        UserCommand::Token { username, name, scope } => {
            let (_, secret) = match scope.as_deref() {
                None => e.accounts().create_token(&who, &username, &name)?,
                Some("backups") => e.accounts().create_scoped_token(&who, &username, &name, TokenScope::Backups)?,
                Some(other) => bail!("未知的令牌范围 {other}：只有 backups（只能读取备份）"),
            };
            println!("{secret}");
        }
    }
    Ok(0)
}

pub fn run_audit(e: &Engine, cmd: AuditCommand) -> Result<i32> {
    let who = Admin::console(actor());
    match cmd {
        // The full walk proves the whole log; the checkpoint then moves audit.anchor to what was just proven.
        AuditCommand::Verify => {
            match e.audit().verify(&who, true).and_then(|r| e.audit().verify(&who, false).map(|_| r)) {
                Ok(r) => {
                    println!(
                        "audit log intact: {} records, keyed hash chain verified; anchor at record {}",
                        r.records_checked, r.verified_through
                    );
                    Ok(0)
                }
                Err(err @ care_engine::Error::AuditTampered { .. }) => {
                    eprintln!("AUDIT LOG TAMPERED: {err}");
                    Ok(4)
                }
                Err(err) => Err(err.into()),
            }
        }
        AuditCommand::List { actor, action, since, until, limit, json } => {
            let f = audit::Filter { actor, action_prefix: action, since, until, text: None };
            let recs = e.audit().records(&who, &f, limit, 0)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&recs)?);
            } else {
                for r in recs {
                    println!("{}\t{}\t{}\t{}\t{}", r.id, r.at, r.actor, r.action, r.detail);
                }
            }
            Ok(0)
        }
        AuditCommand::Export { out, since, until } => {
            let f = audit::Filter { since, until, ..Default::default() };
            let csv = e.audit().export(&who, &f, usize::MAX >> 1, &format!("file {}", out.display()))?;
            std::fs::write(&out, &csv).with_context(|| format!("writing {}", out.display()))?;
            println!("wrote {} records to {}", csv.lines().count().saturating_sub(1), out.display());
            Ok(0)
        }
        AuditCommand::Purge { days } => {
            if days == 0 {
                bail!("--days must be at least 1");
            }
            let cutoff = time::OffsetDateTime::now_utc() - time::Duration::days(i64::from(days));
            let cutoff = cutoff.format(&time::format_description::well_known::Rfc3339)?;
            let n = e.audit().purge(&who, &cutoff, days)?;
            println!("removed {n} records older than {days} days; the chain stays verifiable from its anchor");
            Ok(0)
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum SynonymCommand {
    /// List groups (preferred term, synonyms, note), optionally those containing TEXT.
    List {
        filter: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Add a group: `care synonyms add 慢性阻塞性肺疾病 慢阻肺 COPD --note 呼吸`.
    Add {
        preferred: String,
        #[arg(required = true)]
        variants: Vec<String>,
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Replace group ID with these terms.
    Set {
        id: i64,
        preferred: String,
        #[arg(required = true)]
        variants: Vec<String>,
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Delete group ID.
    Remove { id: i64 },
    /// Import a CSV (首选词,同义词,备注; synonyms separated by |; UTF-8 or GB18030); all or nothing.
    Import {
        file: PathBuf,
        /// Remove the groups the file does not have (the file becomes the table).
        #[arg(long)]
        replace: bool,
    },
    /// Write the table as CSV to FILE (or standard output).
    Export { file: Option<PathBuf> },
}

/// `care synonyms …`: the same operations as the console's 同义词 page, audited as the shell's user; a running
/// server uses a change at its next search.
pub fn run_synonyms(e: &Engine, cmd: SynonymCommand) -> Result<i32> {
    use care_engine::synonyms::NewSynonym;
    let who = Admin::console(actor());
    match cmd {
        SynonymCommand::List { filter, json } => {
            let (rows, total) = e.search().synonyms(&who, filter.as_deref(), usize::MAX, 0)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for r in &rows {
                    println!("{}\t{}\t{}\t{}", r.id, r.preferred, r.variants.join("|"), r.note);
                }
                eprintln!("共 {total} 组");
            }
        }
        SynonymCommand::Add { preferred, variants, note } => {
            let s = e.search().save_synonym(&who, None, &NewSynonym { preferred, variants, note })?;
            println!("已新增第 {} 组：{}（{}）", s.id, s.preferred, s.variants.join("、"));
        }
        SynonymCommand::Set { id, preferred, variants, note } => {
            let s = e.search().save_synonym(&who, Some(id), &NewSynonym { preferred, variants, note })?;
            println!("已保存第 {} 组：{}（{}）", s.id, s.preferred, s.variants.join("、"));
        }
        SynonymCommand::Remove { id } => {
            let s = e.search().delete_synonym(&who, id)?;
            println!("已删除第 {id} 组：{}", s.preferred);
        }
        SynonymCommand::Import { file, replace } => {
            let bytes = std::fs::read(&file).with_context(|| format!("读取 {}", file.display()))?;
            let r = e.search().import_synonyms(&who, &bytes, replace)?;
            println!("已导入：新增 {} 组，更新 {} 组，删除 {} 组", r.added, r.updated, r.removed);
        }
        SynonymCommand::Export { file } => {
            let csv = e.search().export_synonyms(&who)?;
            match file {
                Some(f) => std::fs::write(&f, csv).with_context(|| format!("写入 {}", f.display()))?,
                None => print!("{csv}"),
            }
        }
    }
    Ok(0)
}
