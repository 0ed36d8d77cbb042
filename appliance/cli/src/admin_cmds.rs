//! `care user …` and `care audit …`: account administration and the audit log from the command line (the console
//! equivalent of the admin pages; also how an operator recovers when no administrator can log in).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use care_engine::accounts::{self, Role};
use care_engine::{Engine, audit};
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
    },
    /// List users with their role, lock state and grants.
    List,
    /// Set a new password (read like `add`); ends the user's sessions and clears a lock.
    Passwd {
        username: String,
        #[arg(long)]
        password_file: Option<PathBuf>,
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
    },
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
    let s = e.store();
    let who = actor();
    match cmd {
        UserCommand::Add { username, role, password_file } => {
            let pw = read_password(password_file.as_ref())?;
            let u = accounts::create_user(s, &who, &username, &pw, Role::parse(&role)?)?;
            println!("created {} ({})", u.username, u.role.as_str());
        }
        UserCommand::List => {
            let now = accounts::unix_now();
            for u in accounts::list_users(s)? {
                let state = if u.disabled {
                    "disabled"
                } else if u.is_locked(now) {
                    "locked"
                } else {
                    "active"
                };
                let cols = accounts::granted_collections(s, u.id)?;
                println!(
                    "{}\t{}\t{}\t{}",
                    u.username,
                    u.role.as_str(),
                    state,
                    if u.is_admin() { "*".into() } else { cols.join(",") }
                );
            }
        }
        UserCommand::Passwd { username, password_file } => {
            let pw = read_password(password_file.as_ref())?;
            accounts::set_password(s, &who, &username, None, &pw)?;
            println!("password of {username} changed; their sessions ended");
        }
        UserCommand::Set { username, role, unlock, disable, enable } => {
            let role = role.as_deref().map(Role::parse).transpose()?;
            let disabled = if disable {
                Some(true)
            } else if enable {
                Some(false)
            } else {
                None
            };
            let u = accounts::update_user(s, &who, &username, role, disabled, unlock)?;
            println!("{}: role {}, {}", u.username, u.role.as_str(), if u.disabled { "disabled" } else { "enabled" });
        }
        UserCommand::Grant { username, collection } => {
            accounts::grant(s, &who, &username, &collection)?;
            println!("{username} may now read '{collection}'");
        }
        UserCommand::Revoke { username, collection } => {
            accounts::revoke(s, &who, &username, &collection)?;
            println!("{username} may no longer read '{collection}'");
        }
        UserCommand::Token { username, name } => {
            let (_, secret) = accounts::create_token(s, &who, &username, &name)?;
            println!("{secret}");
        }
    }
    Ok(0)
}

pub fn run_audit(e: &Engine, cmd: AuditCommand) -> Result<i32> {
    match cmd {
        // The full walk proves the whole log; the checkpoint then moves audit.anchor to what was just proven.
        AuditCommand::Verify => {
            match audit::verify_full(e.store()).and_then(|r| audit::checkpoint(e.store()).map(|_| r)) {
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
            let recs = audit::search(&e.store().conn(), &f, limit, 0)?;
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
            let recs = audit::search(&e.store().conn(), &f, usize::MAX >> 1, 0)?;
            std::fs::write(&out, audit::to_csv(&recs)).with_context(|| format!("writing {}", out.display()))?;
            audit::append(
                &e.store().conn(),
                &actor(),
                "audit.export",
                &serde_json::json!({"records": recs.len(), "file": out}),
            )?;
            println!("wrote {} records to {}", recs.len(), out.display());
            Ok(0)
        }
        AuditCommand::Purge { days } => {
            if days == 0 {
                bail!("--days must be at least 1");
            }
            let cutoff = time::OffsetDateTime::now_utc() - time::Duration::days(i64::from(days));
            let cutoff = cutoff.format(&time::format_description::well_known::Rfc3339)?;
            let n = audit::purge_before(&mut e.store().conn(), &actor(), &cutoff, days)?;
            println!("removed {n} records older than {days} days; the chain stays verifiable from its anchor");
            Ok(0)
        }
    }
}
