//! `care standby`: a second appliance kept as a copy of a primary. It pulls the primary's newest backup (with a
//! token that opens only backups), restores it beside its live copy, switches, and serves search read-only from it
//! (`care serve` as its child, on the same configuration); `care standby promote` makes it a primary.
//!
//! The data directory is switched by two renames in its parent folder: the live copy moves aside
//! (`.NAME.standby-old`), the new one takes its name. A crash between them is repaired at the next start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use care_engine::backup::standby::{self, StandbyState};
use care_engine::{EngineConfig, OpenMode};
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub(crate) struct Follow {
    /// The primary's address, e.g. https://care-primary:8443.
    #[arg(long)]
    from: Option<String>,
    /// A file holding the primary's token for backups (`care user token ADMIN --name standby --scope backups`).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The primary's certificate (its `tls/cert.pem`), when it is self-signed or from the hospital's own CA.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Seconds between two looks for a newer backup.
    #[arg(long, default_value_t = 300)]
    every: u64,
}

#[derive(Subcommand, Debug)]
pub(crate) enum StandbyCommand {
    /// Make this standby a primary: its copy stops following and takes writes (audited). A `care standby`
    /// following now restarts its server as a primary within a few seconds.
    Promote,
    /// Where this standby's data came from and how far behind it may be.
    Status,
}

/// Set for the server child: it ties its life to the follower's (`PR_SET_PDEATHSIG`), so a killed follower leaves no
/// server behind serving a copy nobody replaces any more.
pub(crate) const DIE_WITH_PARENT: &str = "CARE_STANDBY_CHILD";

/// What the server child is started with: this executable and the configuration this process read.
pub(crate) struct ServeWith {
    pub config: Option<PathBuf>,
}

pub(crate) fn run(cfg: &EngineConfig, follow: Follow, cmd: Option<StandbyCommand>, with: ServeWith) -> Result<i32> {
    let data = cfg.storage.data_dir.clone();
    match cmd {
        Some(StandbyCommand::Status) => {
            match standby::read(&data) {
                Some(s) => println!("{}", serde_json::to_string_pretty(&s)?),
                None => println!("{} 不是备用机（没有 {}）", data.display(), standby::MARKER),
            }
            Ok(0)
        }
        Some(StandbyCommand::Promote) => promote(cfg),
        None => {
            let (Some(from), Some(token_file)) = (follow.from.clone(), follow.token_file.clone()) else {
                bail!("用法：care standby --from https://主机:8443 --token-file 令牌文件 [--ca-file 主机证书]");
            };
            let token = std::fs::read_to_string(&token_file)
                .with_context(|| format!("读取令牌文件 {}", token_file.display()))?
                .trim()
                .to_string();
            let client = client(follow.ca_file.as_deref())?;
            Follower { cfg: cfg.clone(), from: from.trim_end_matches('/').to_string(), token, client, with }
                .run(Duration::from_secs(follow.every.max(1)))
        }
    }
}

fn promote(cfg: &EngineConfig) -> Result<i32> {
    let data = &cfg.storage.data_dir;
    let Some(s) = standby::read(data) else {
        bail!("{} 不是备用机（没有 {}），无需转为主机", data.display(), standby::MARKER);
    };
    let e = care_engine::Engine::open(cfg.clone(), OpenMode::Existing)?;
    e.backups().promote(&care_engine::Admin::console(crate::cli_actor()), &s)?;
    println!("{} 已转为主机：不再跟随 {}，可以写入（数据截至主机备份 {}）", data.display(), s.primary, s.archive);
    Ok(0)
}

fn client(ca: Option<&Path>) -> Result<reqwest::blocking::Client> {
    let mut b = reqwest::blocking::Client::builder().connect_timeout(Duration::from_secs(20)).timeout(None);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("读取主机证书 {}", ca.display()))?;
        b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem).context("主机证书不是 PEM 格式")?);
    }
    Ok(b.build()?)
}

struct Follower {
    cfg: EngineConfig,
    from: String,
    token: String,
    client: reqwest::blocking::Client,
    with: ServeWith,
}

/// The newest archive the primary lists.
struct Newest {
    name: String,
    created_at: String,
}

impl Follower {
    fn data(&self) -> &Path {
        &self.cfg.storage.data_dir
    }

    /// `.NAME.standby-next` / `.NAME.standby-old` beside the data directory.
    fn sibling(&self, what: &str) -> PathBuf {
        let name = self.data().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        self.data().with_file_name(format!(".{name}.standby-{what}"))
    }

    fn run(self, every: Duration) -> Result<i32> {
        // A crash between the two renames of a switch left no live copy: the old one comes back.
        if !self.data().exists() && self.sibling("old").exists() {
            std::fs::rename(self.sibling("old"), self.data())?;
        }
        let _ = std::fs::remove_dir_all(self.sibling("next"));
        let _ = std::fs::remove_dir_all(self.sibling("old"));
        let empty = std::fs::read_dir(self.data()).map_or(true, |mut d| d.next().is_none());
        if !empty && standby::read(self.data()).is_none() {
            bail!(
                "{} 已是一台主机的数据（没有 {}）；备用机须从空目录开始，或先换一个数据目录",
                self.data().display(),
                standby::MARKER
            );
        }
        let mut server = standby::read(self.data()).map(|_| self.serve()).transpose()?;
        loop {
            if server.is_some() && standby::read(self.data()).is_none() {
                // Promoted: the copy is a primary's now; serve it as one, and stop following.
                eprintln!("已转为主机：以主机身份重新启动服务，不再跟随 {}", self.from);
                stop(server.take());
                let mut child = self.serve()?;
                return Ok(child.wait()?.code().unwrap_or(1));
            }
            match self.newest() {
                Ok(newest) => {
                    let current = standby::read(self.data());
                    if current.as_ref().is_none_or(|s| s.archive != newest.name) {
                        match self.replace(&newest) {
                            Ok(state) => {
                                eprintln!(
                                    "已恢复主机备份 {}（用时 {:.1} 秒），切换服务",
                                    state.archive, state.restore_seconds
                                );
                                stop(server.take());
                                self.switch()?;
                                server = Some(self.serve()?);
                            }
                            Err(e) => self.note(Some(format!("{e:#}"))),
                        }
                    } else {
                        self.note(None);
                    }
                }
                Err(e) => {
                    eprintln!("无法从主机取得备份列表：{e:#}");
                    self.note(Some(format!("{e:#}")));
                }
            }
            let until = Instant::now() + every;
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(500));
                if server.is_some() && standby::read(self.data()).is_none() {
                    break;
                }
                // A server that stopped on its own is started again (the standby keeps serving).
                if let Some(child) = server.as_mut()
                    && child.try_wait()?.is_some()
                {
                    eprintln!("备用机服务已退出，重新启动");
                    server = Some(self.serve()?);
                }
            }
        }
    }

    fn get(&self, path: &str) -> Result<reqwest::blocking::Response> {
        let url = format!("{}{path}", self.from);
        let res = self.client.get(&url).bearer_auth(&self.token).send().with_context(|| format!("连接 {url}"))?;
        if !res.status().is_success() {
            let status = res.status();
            let body = res.text().unwrap_or_default();
            bail!("{url} 回答 {status}：{}", body.chars().take(300).collect::<String>());
        }
        Ok(res)
    }

    fn newest(&self) -> Result<Newest> {
        let list: serde_json::Value = self.get("/api/v1/admin/backups")?.json()?;
        list["archives"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|a| {
                Some(Newest {
                    name: a["name"].as_str()?.to_string(),
                    created_at: a["info"]["created_at"].as_str()?.to_string(),
                })
            })
            .context("主机上还没有可用的备份（在主机上运行 care backup create，或等定时备份）")
    }

    /// Downloads `newest` and restores it into `.NAME.standby-next`, marked as a standby's copy.
    fn replace(&self, newest: &Newest) -> Result<StandbyState> {
        let next = self.sibling("next");
        let _ = std::fs::remove_dir_all(&next);
        let archive = self.data().with_file_name(format!(".{}.download-{}", newest.name, std::process::id()));
        let fetched = (|| -> Result<()> {
            let mut res = self.get(&format!("/api/v1/admin/backups/{}", newest.name))?;
            let mut f = std::fs::File::create(&archive).with_context(|| format!("写入 {}", archive.display()))?;
            res.copy_to(&mut f).context("下载备份")?;
            f.sync_all()?;
            Ok(())
        })();
        let restored = fetched.and_then(|()| {
            let mut cfg = self.cfg.clone();
            cfg.storage.data_dir = next.clone();
            let key = self.cfg.backup.key_file.as_deref().map(care_engine::backup::BackupKey::read).transpose()?;
            Ok(care_engine::backup::restore::restore(&archive, &cfg, key.as_ref(), "standby")?)
        });
        let _ = std::fs::remove_file(&archive);
        let r = restored?;
        if !r.check.consistent {
            bail!("恢复的副本一致性检查未通过，未切换（{:?}）", r.check);
        }
        let now = care_engine::clock::utc_unix(time::OffsetDateTime::now_utc().unix_timestamp());
        let state = StandbyState {
            primary: self.from.clone(),
            archive: newest.name.clone(),
            archive_created_at: newest.created_at.clone(),
            restored_at: now.clone(),
            restore_seconds: r.seconds,
            checked_at: now,
            last_error: None,
        };
        standby::write(&next, &state)?;
        Ok(state)
    }

    /// The new copy takes the data directory's name; the old one goes.
    fn switch(&self) -> Result<()> {
        let (next, old) = (self.sibling("next"), self.sibling("old"));
        if self.data().exists() {
            std::fs::rename(self.data(), &old).with_context(|| format!("移开 {}", self.data().display()))?;
        }
        std::fs::rename(&next, self.data()).with_context(|| format!("换入 {}", next.display()))?;
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    }

    /// Records the time of this look (and its error) in the live copy's marker, for the overview.
    fn note(&self, error: Option<String>) {
        if let Some(mut s) = standby::read(self.data()) {
            s.checked_at = care_engine::clock::utc_unix(time::OffsetDateTime::now_utc().unix_timestamp());
            s.last_error = error;
            if let Err(e) = standby::write(self.data(), &s) {
                eprintln!("无法更新 {}：{e}", standby::MARKER);
            }
        }
    }

    /// `care serve` on the live copy, with this process's configuration; its output is this process's.
    fn serve(&self) -> Result<Child> {
        let mut c = Command::new(std::env::current_exe()?);
        if let Some(config) = &self.with.config {
            c.arg("--config").arg(config);
        }
        c.arg("--data-dir").arg(self.data()).arg("serve").env(DIE_WITH_PARENT, "1");
        c.spawn().context("启动备用机服务")
    }
}

/// Stops a server child: SIGTERM, then SIGKILL after 30 s.
fn stop(child: Option<Child>) {
    let Some(mut child) = child else { return };
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}
