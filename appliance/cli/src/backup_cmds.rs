//! `care backup` (create, list, verify, keygen) and `care restore`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use care_engine::backup::{BackupKey, BackupParams, restore::restore};
use care_engine::{Engine, EngineConfig, JobState};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum BackupCommand {
    /// Make a backup now, while the appliance serves (the `care serve` holding the jobs lock makes it, or this
    /// process when none runs): the metadata database, the audit key, the indexes and the models, in one
    /// compressed archive (encrypted when `[backup] key_file` is set). Prints where it went.
    Create {
        /// Folder for the archive (default: `[backup] dir`, else `care-backups` beside the data directory).
        #[arg(long)]
        to: Option<PathBuf>,
        /// Only queue it.
        #[arg(long)]
        detach: bool,
        #[arg(long)]
        json: bool,
    },
    /// The archives in the backup folder, newest first (half-written ones are never listed).
    List {
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Read an archive to its end and check every byte against its manifest (exit 1 when it is damaged).
    Verify {
        archive: PathBuf,
        /// The key file it was encrypted with (default: `[backup] key_file`).
        #[arg(long)]
        key: Option<PathBuf>,
    },
    /// Write a new random key file for encrypting backups (keep a copy apart from the archives).
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
}

fn key(path: Option<&Path>, cfg: &EngineConfig) -> Result<Option<BackupKey>> {
    Ok(path.or(cfg.backup.key_file.as_deref()).map(BackupKey::read).transpose()?)
}

pub(crate) fn run_backup(cfg: &EngineConfig, workers: usize, command: BackupCommand) -> Result<i32> {
    let admin = crate::console();
    match command {
        BackupCommand::Create { to, detach, json } => {
            let e = Arc::new(Engine::open(cfg.clone(), care_engine::OpenMode::Existing)?);
            let to = to.map(|p| std::path::absolute(&p)).transpose()?;
            let job = e.backups().submit(&admin, &BackupParams { to })?;
            if detach {
                println!("queued backup job {job}");
                return Ok(0);
            }
            let j = crate::train_cmds::run_with_bar(&e, workers, job)?;
            if j.state != JobState::Done {
                let why = j.errors.first().map(|e| e.message.clone()).unwrap_or_default();
                bail!("备份任务 #{job} 未完成（{}）：{why}", j.state.label());
            }
            let r: serde_json::Value = serde_json::from_str(&j.result)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "备份已写入 {}（{} MB，{} 个文件，用时 {:.1} 秒；写入暂停 {} 毫秒）",
                    r["path"].as_str().unwrap_or_default(),
                    r["bytes"].as_u64().unwrap_or(0).div_ceil(1 << 20),
                    r["info"]["files"],
                    r["seconds"].as_f64().unwrap_or(0.0),
                    r["writes_paused_ms"]
                );
            }
        }
        BackupCommand::List { dir, json } => {
            let e = Engine::open(cfg.clone(), care_engine::OpenMode::Existing)?;
            let list = e.backups().list(&admin, dir.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            let plan = e.backups().status(&admin)?.plan;
            match (&plan.time, &plan.next_due) {
                (Some(t), Some(n)) => println!(
                    "每天 {t} 备份到 {}（下次 {}），保留每日 {} 份、每周 {} 份",
                    plan.dir.display(),
                    care_engine::clock::local(n),
                    plan.keep_daily,
                    plan.keep_weekly
                ),
                _ => println!("未设置定时备份（care.toml 的 [backup] time，或控制台 设置 → 备份）"),
            }
            if list.is_empty() {
                let dir = match dir {
                    Some(d) => d,
                    None => care_engine::backup::BackupMaker::of(&e).backup_folder()?,
                };
                println!("{} 中还没有备份", dir.display());
            }
            for b in &list {
                match &b.info {
                    Some(i) => println!(
                        "{}  {:>8} MB  care {}  {} 个资料库 {} 篇文档  {}",
                        b.name,
                        b.bytes.div_ceil(1 << 20),
                        i.appliance_version,
                        i.collections,
                        i.documents,
                        i.live_pair.as_deref().unwrap_or("（无在用模型）")
                    ),
                    None => println!("{}  无法读取：{}", b.name, b.problem.as_deref().unwrap_or_default()),
                }
            }
        }
        BackupCommand::Verify { archive, key: key_file } => {
            let k = key(key_file.as_deref(), cfg)?;
            // Verifying needs no data directory; when there is one, the check is in its audit log.
            let r = match Engine::open(cfg.clone(), care_engine::OpenMode::Existing) {
                Ok(e) => e.backups().verify(&admin, &archive, k.as_ref()),
                Err(_) => care_engine::backup::verify(&archive, k.as_ref()),
            }?;
            println!(
                "{}：完好（{} 个文件，{} MB 数据，{} 由 care {} 生成）",
                r.path.display(),
                r.files,
                r.data_bytes.div_ceil(1 << 20),
                r.info.created_at,
                r.info.appliance_version
            );
        }
        BackupCommand::Keygen { out } => {
            if out.exists() {
                bail!("{} 已存在；为免覆盖旧密钥（用它加密的备份将无法恢复），请换一个文件名", out.display());
            }
            crate::write_private(&out, format!("{}\n", BackupKey::generate()?.to_hex()).as_bytes())?;
            println!("已生成备份密钥 {}；请另存一份在备份以外的地方，丢失后加密的备份无法恢复", out.display());
        }
    }
    Ok(0)
}

/// `care restore ARCHIVE --data-dir DIR`.
pub(crate) fn run_restore(cfg: &EngineConfig, archive: &Path, key_file: Option<&Path>, json: bool) -> Result<i32> {
    let k = key(key_file, cfg)?;
    eprintln!("正在恢复 {} 到 {} …", archive.display(), cfg.storage.data_dir.display());
    let r = restore(archive, cfg, k.as_ref(), &crate::cli_actor())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "已恢复到 {}：{} 个文件，{} 篇文档，{} 个片段；一致性检查{}，审计日志 {} 条校验通过；用时 {:.1} 秒{}",
            r.data_dir.display(),
            r.files,
            r.info.documents,
            r.check.sqlite_chunks,
            if r.check.consistent { "通过" } else { "未通过" },
            r.audit_records_checked,
            r.seconds,
            r.migrated_from.map(|v| format!("（元数据库已从版本 {v} 升级）")).unwrap_or_default()
        );
    }
    Ok(if r.check.consistent { 0 } else { 3 })
}
