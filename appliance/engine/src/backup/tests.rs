//! Backups on real data directories: the demo, ingestion running beside the backup,
//! restores onto empty directories checked as `care check` does, damaged and foreign archives refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::archive::{self, BackupKey};
use super::restore::restore;
use super::*;
use crate::Engine;
use crate::engine::OpenMode;
use crate::{EngineConfig, SearchRequest};

fn config(dir: &Path) -> EngineConfig {
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.to_path_buf();
    cfg.training.keep_free_gb = 0.0;
    cfg
}

/// The demo, BM25 only: the archive's work is dominated by model files (e5-small's graph is 470 MB), which the
/// package test (`packaging/deb-test.sh`) backs up and restores with the packaged model, dense tables and all.
fn demo(dir: &Path) -> Engine {
    let e = Engine::open(config(dir), OpenMode::Create).unwrap();
    crate::demo::load_demo(&e).unwrap();
    e
}

fn token() -> CancelToken {
    CancelToken::new(Arc::new(AtomicBool::new(false)))
}

fn backup(e: &Engine, to: &Path) -> BackupReport {
    crate::backup::BackupMaker::of(&e)
        .make_backup(&BackupParams { to: Some(to.to_path_buf()) }, &token(), &mut |_, _, _| {})
        .unwrap()
}

/// What a clinician sees for `q`: the ids and scores of the first page.
fn ranking(e: &Engine, q: &str) -> Vec<(String, String)> {
    e.searcher()
        .search_unaudited(&SearchRequest { query: q.into(), limit: Some(10), ..Default::default() })
        .unwrap()
        .hits
        .into_iter()
        .map(|h| (h.external_id, format!("{:.5}", h.score)))
        .collect()
}

const QUERIES: [&str; 6] =
    ["二甲双胍的禁忌症", "高血压患者可以吃布洛芬吗", "孕妇", "糖尿病饮食", "头孢过敏", "阿司匹林"];

#[test]
fn a_backup_beside_ingestion_restores_onto_an_empty_directory_with_identical_results() {
    let t = tempfile::tempdir().unwrap();
    let e = Arc::new(demo(&t.path().join("data")));
    e.indexer().create_collection("notes", "", "test").unwrap();
    // Ingestion runs while the first backup is made: the snapshot is one moment of it.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (e, stop, dir) = (e.clone(), stop.clone(), t.path().join("files"));
        std::fs::create_dir_all(&dir).unwrap();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) && n < 40 {
                let f = dir.join(format!("note-{n}.txt"));
                std::fs::write(&f, format!("第 {n} 号会诊记录：患者血压升高，建议复查肾功能与电解质。")).unwrap();
                e.indexer().ingest_files("notes", &[f], &mut |_| {}).unwrap();
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let during = backup(&e, &t.path().join("backups"));
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().unwrap();
    assert!(written > 0);
    assert!(during.info.chunks > 0 && during.info.files > 10, "{:?}", during.info);
    let r = restore(&during.path, &config(&t.path().join("restored-during")), None, "test").unwrap();
    assert!(r.check.consistent, "a snapshot taken mid-ingest restores consistent: {:?}", r.check);
    assert_eq!(r.check.sqlite_chunks as u64, during.info.chunks);
    assert!(r.audit_records_checked > 0);

    // Quiet now: a second backup restores to exactly what the appliance shows.
    let quiet = backup(&e, &t.path().join("backups"));
    let restored_dir = t.path().join("restored");
    let r = restore(&quiet.path, &config(&restored_dir), None, "test").unwrap();
    assert!(r.check.consistent && r.migrated_from.is_none(), "{r:?}");
    let back = Engine::open(config(&restored_dir), OpenMode::Existing).unwrap();
    assert_eq!(
        back.retrieval().active_models().unwrap().map(|p| crate::lifecycle::pair_spec(&p)),
        quiet.info.live_pair
    );
    for q in QUERIES.iter().copied().chain(["第 3 号会诊记录", "电解质"]) {
        assert_eq!(ranking(&back, q), ranking(&e, q), "{q}");
    }
    // The restore is in the restored log, and the chain verifies with it.
    let log = crate::audit::search(&back.store.reader(), &Default::default(), 5, 0).unwrap();
    assert!(log.iter().any(|r| r.action == "backup.restore"), "{log:?}");
    assert!(back.audit().verify(&Admin::system(), true).is_ok());
    // A second restore onto the same, now full, directory is refused and changes nothing.
    let err = restore(&quiet.path, &config(&restored_dir), None, "test").unwrap_err();
    assert!(err.to_string().contains("不是空的"), "{err}");
    // Nothing hidden is left behind: no staging beside the data, no half-written archive.
    let hidden = |d: &Path| {
        std::fs::read_dir(d).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with('.')).count()
    };
    assert_eq!(hidden(&t.path().join("backups")), 0);
    assert_eq!(hidden(t.path()), 0);
    assert_eq!(
        std::fs::read_dir(t.path().join("data"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".backup-"))
            .count(),
        0
    );
}

/// Flips one byte at `at` (a fraction of the file) of a copy of `src`.
fn flipped(src: &Path, at: f64, name: &str) -> PathBuf {
    let mut bytes = std::fs::read(src).unwrap();
    let i = ((bytes.len() as f64 * at) as usize).clamp(16, bytes.len() - 1);
    bytes[i] ^= 0x20;
    let dst = src.with_file_name(name);
    std::fs::write(&dst, bytes).unwrap();
    dst
}

#[test]
fn a_flipped_byte_a_cut_or_a_wrong_key_is_refused_by_verify_and_restore() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = config(&t.path().join("data"));
    let e = Engine::open(cfg.clone(), OpenMode::Create).unwrap();
    crate::demo::load_demo(&e).unwrap();
    let plain = backup(&e, &t.path().join("plain"));
    assert_eq!(verify(&plain.path, None).unwrap().files as u64, plain.info.files);
    drop(e);
    let key_file = t.path().join("backup.key");
    std::fs::write(&key_file, BackupKey::generate().unwrap().to_hex()).unwrap();
    cfg.backup.key_file = Some(key_file.clone());
    let e = Engine::open(cfg, OpenMode::Existing).unwrap();
    let sealed = backup(&e, &t.path().join("sealed"));
    assert!(sealed.encrypted);
    let key = BackupKey::read(&key_file).unwrap();
    assert!(verify(&sealed.path, Some(&key)).is_ok());
    let no_key = verify(&sealed.path, None).unwrap_err().to_string();
    assert!(no_key.contains("已加密"), "{no_key}");
    let wrong = verify(&sealed.path, Some(&BackupKey::generate().unwrap())).unwrap_err().to_string();
    assert!(wrong.contains("不是用这个密钥文件加密的"), "{wrong}");

    let mut bad = Vec::new();
    for (src, key) in [(&plain.path, None), (&sealed.path, Some(&key))] {
        for at in [0.01, 0.5, 0.999] {
            bad.push((flipped(src, at, &format!("flip-{at}.care-backup")), key));
        }
        let cut = src.with_file_name("cut.care-backup");
        let bytes = std::fs::read(src).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
        bad.push((cut, key));
        let longer = src.with_file_name("longer.care-backup");
        std::fs::write(&longer, [bytes.as_slice(), b"\x28\xb5\x2f\xfd garbage"].concat()).unwrap();
        bad.push((longer, key));
    }
    // Every byte of the plain archive's last 1,500 flipped in turn: some of these decode to the same content (bits
    // of zstd's table descriptions), and each is refused all the same.
    let bytes = std::fs::read(&plain.path).unwrap();
    let each = plain.path.with_file_name("each.care-backup");
    for i in bytes.len() - 1_500..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x20;
        std::fs::write(&each, &b).unwrap();
        assert!(verify(&each, None).is_err(), "a flip at byte {i} of {} passed", bytes.len());
    }
    for (i, (path, key)) in bad.iter().enumerate() {
        let err = verify(path, *key).unwrap_err().to_string();
        assert!(
            err.contains("已损坏") || err.contains("校验失败") || err.contains("截断"),
            "{}: {err}",
            path.display()
        );
        let target = t.path().join(format!("restored-{i}"));
        let err = restore(path, &config(&target), *key, "test").unwrap_err().to_string();
        assert!(!err.is_empty());
        assert!(!target.exists(), "{}: a refused restore writes nothing", path.display());
    }
    let leftovers: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("restore-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_backup_of_a_newer_version_is_refused_and_an_older_one_is_migrated() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::open(config(&t.path().join("data")), OpenMode::Create).unwrap();
    crate::demo::load_demo(&e).unwrap();
    let snap = snapshot::Snapshot::take(&crate::backup::BackupMaker::of(&e)).unwrap();
    let write = |info: &BackupInfo, files: &[(String, PathBuf)], name: &str| {
        let path = t.path().join(name);
        let f = std::fs::File::create(&path).unwrap();
        archive::write(f, &path, info, files, None, |_| Ok(())).unwrap();
        path
    };
    let mut newer = snap.info.clone();
    newer.schema_version = crate::store::latest_schema() + 1;
    newer.appliance_version = "9.0.0".into();
    let path = write(&newer, &snap.files, "newer.care-backup");
    let err = restore(&path, &config(&t.path().join("n")), None, "test").unwrap_err().to_string();
    assert!(err.contains("来自更新的版本") && err.contains("9.0.0"), "{err}");
    assert!(!t.path().join("n").exists());

    // An older database: the migrations of three versions ago, and the rest of an empty appliance.
    let empty = Engine::open(config(&t.path().join("empty")), OpenMode::Create).unwrap();
    let old_snap = snapshot::Snapshot::take(&crate::backup::BackupMaker::of(&empty)).unwrap();
    let old_version = crate::store::latest_schema() - 3;
    let old_db = t.path().join("old.sqlite");
    {
        let conn = rusqlite::Connection::open(&old_db).unwrap();
        for (v, sql) in crate::store::MIGRATIONS.iter().filter(|(v, _)| *v <= old_version) {
            conn.execute_batch(sql).unwrap();
            conn.pragma_update(None, "user_version", v).unwrap();
        }
    }
    let files: Vec<(String, PathBuf)> = old_snap
        .files
        .iter()
        .filter(|(n, _)| n != crate::audit::ANCHOR_FILE)
        .map(|(n, p)| if n == "care.sqlite" { (n.clone(), old_db.clone()) } else { (n.clone(), p.clone()) })
        .collect();
    let mut older = old_snap.info.clone();
    older.schema_version = old_version;
    let path = write(&older, &files, "older.care-backup");
    let r = restore(&path, &config(&t.path().join("o")), None, "test").unwrap();
    assert_eq!(r.migrated_from, Some(old_version));
    let back = Engine::open(config(&t.path().join("o")), OpenMode::Existing).unwrap();
    assert_eq!(back.store.schema_version().unwrap(), crate::store::latest_schema());
}

#[test]
fn listing_skips_half_written_archives_and_retention_keeps_days_and_weeks() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::open(config(&t.path().join("data")), OpenMode::Create).unwrap();
    let made = backup(&e, &t.path().join("b"));
    std::fs::write(t.path().join("b").join(".care-20260101-000000.care-backup.partial-999999999"), b"half").unwrap();
    std::fs::write(t.path().join("b").join("notes.txt"), b"not a backup").unwrap();
    let listed = list(&t.path().join("b"), None).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].path, made.path);
    assert_eq!(listed[0].info.as_ref().unwrap().schema_version, crate::store::latest_schema());
    // A partial whose process is gone is removed by the next backup.
    backup(&e, &t.path().join("b"));
    assert!(!t.path().join("b").join(".care-20260101-000000.care-backup.partial-999999999").exists());

    let names: Vec<String> = [
        "20261130-020000",
        "20261130-010000",
        "20261129-020000",
        "20261128-020000",
        "20261127-020000",
        "20261120-020000",
        "20261113-020000",
        "20261001-020000",
    ]
    .iter()
    .map(|s| format!("care-{s}.{EXTENSION}"))
    .collect();
    let removed = to_remove(&names, 3, 3);
    // Days: the 30th (its newest), 29th, 28th. ISO weeks: the 30th's (a Monday), the 29th's (which holds the 27th
    // and 28th too) and the 20th's.
    let kept: Vec<&String> = names.iter().filter(|n| !removed.contains(n)).collect();
    assert_eq!(kept, [&names[0], &names[2], &names[3], &names[5]], "removed {removed:?}");
    assert!(to_remove(&names, 0, 0).is_empty());
}

#[test]
fn the_daily_backup_fires_once_when_due_and_the_console_s_values_override_the_file_s() {
    use time::macros::datetime;
    let t = tempfile::tempdir().unwrap();
    let mut cfg = config(&t.path().join("data"));
    cfg.backup.time = Some("02:30".into());
    cfg.training.utc_offset_minutes = 480;
    let e = Engine::open(cfg.clone(), OpenMode::Create).unwrap();
    let jobs = || -> i64 {
        e.store.reader().query_row("SELECT COUNT(*) FROM jobs WHERE kind = ?1", [BACKUP], |r| r.get(0)).unwrap()
    };
    // The first look computes the next run (02:30 in the hospital's time = 18:30 UTC) and queues nothing.
    let now = datetime!(2026-11-30 10:00 UTC);
    assert_eq!(schedule::fire_due(&e.store, &cfg, now).unwrap().job, None);
    let admin = Admin::system();
    assert_eq!(e.backups().status(&admin).unwrap().plan.next_due.as_deref(), Some("2026-11-30T18:30:00Z"));
    // A wake-up with nothing due says when the next one is, from the one read of the row.
    let fired = schedule::fire_due(&e.store, &cfg, datetime!(2026-11-30 18:29 UTC)).unwrap();
    assert_eq!((fired.job, fired.next), (None, Some(datetime!(2026-11-30 18:30 UTC))));
    assert!(fired.wake_at(datetime!(2026-11-30 18:29 UTC)).is_some());
    assert!(fired.wake_at(datetime!(2026-11-30 18:30 UTC)).is_none(), "no wake-up for a time already past");
    // Down past the time (two days): one backup at the start, then the next run after now.
    let late = datetime!(2026-12-02 09:00 UTC);
    let job = schedule::fire_due(&e.store, &cfg, late).unwrap().job.expect("a backup queued");
    assert_eq!(schedule::fire_due(&e.store, &cfg, late).unwrap().job, None, "queued once");
    assert_eq!(jobs(), 1);
    let status = e.backups().status(&admin).unwrap();
    assert_eq!((status.running, status.plan.next_due.as_deref()), (Some(job), Some("2026-12-02T18:30:00Z")));
    // Due again while that one still waits: skipped, not queued twice, and the skip is audited.
    assert_eq!(schedule::fire_due(&e.store, &cfg, datetime!(2026-12-02 18:31 UTC)).unwrap().job, None);
    assert_eq!(jobs(), 1);
    let skipped: i64 = e
        .store
        .reader()
        .query_row("SELECT COUNT(*) FROM audit WHERE action = 'backup.schedule_skipped'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(skipped, 1);

    // The console: another time, folder and retention, audited; a folder that cannot be written is refused.
    let folder = t.path().join("elsewhere");
    let spec = schedule::ScheduleSpec {
        time: "23:05".into(),
        dir: folder.display().to_string(),
        keep_daily: 3,
        keep_weekly: 0,
    };
    let plan = e.backups().set_schedule(&admin, Some(&spec)).unwrap();
    assert_eq!((plan.time.as_deref(), &plan.dir, plan.keep_daily), (Some("23:05"), &folder, 3));
    assert_eq!(crate::backup::BackupMaker::of(&e).backup_folder().unwrap(), folder);
    assert_eq!(schedule::fire_due(&e.store, &cfg, datetime!(2026-12-03 10:00 UTC)).unwrap().job, None);
    assert_eq!(e.backups().status(&admin).unwrap().plan.next_due.as_deref(), Some("2026-12-03T15:05:00Z"));
    let file = t.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    for (dir, time) in
        [(file.display().to_string(), "01:00"), ("relative/dir".into(), "01:00"), (String::new(), "25:00")]
    {
        let bad = schedule::ScheduleSpec { time: time.into(), dir, keep_daily: 1, keep_weekly: 1 };
        let err = e.backups().set_schedule(&admin, Some(&bad)).unwrap_err().to_string();
        assert!(err.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)), "a Chinese message: {err}");
    }
    // No time: no scheduled backup, and nothing is due any more.
    let off = schedule::ScheduleSpec { time: String::new(), ..spec };
    assert_eq!(e.backups().set_schedule(&admin, Some(&off)).unwrap().time, None);
    assert_eq!(schedule::fire_due(&e.store, &cfg, datetime!(2026-12-09 10:00 UTC)).unwrap().job, None);
    assert_eq!(e.backups().status(&admin).unwrap().plan.next_due, None);
    // Back to the file's values.
    let plan = e.backups().set_schedule(&admin, None).unwrap();
    assert_eq!(
        (plan.time.as_deref(), plan.dir, plan.changed),
        (Some("02:30"), cfg.backup.folder(&cfg.storage.data_dir), None)
    );
    let updates: i64 = e
        .store
        .reader()
        .query_row("SELECT COUNT(*) FROM audit WHERE action = 'backup.schedule_update'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(updates, 3);
}

/// A small tmpfs of its own (root only: elsewhere the test says so and passes nothing off as checked).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` to the last byte.
fn fill(dir: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("ballast")).unwrap();
    let block = vec![7u8; 64 << 10];
    while f.write_all(&block).is_ok() {}
    let _ = f.write_all(&[7]);
}

#[test]
fn a_disk_that_fills_during_a_backup_fails_it_cleanly_while_searches_go_on() {
    let t = tempfile::tempdir().unwrap();
    let e = Arc::new(demo(&t.path().join("data")));
    let Some(disk) = Tmpfs::mount(&t.path().join("small"), "64m") else {
        eprintln!("SKIPPED: mounting a tmpfs needs root; the full-disk case was not checked");
        return;
    };
    let folder = disk.0.join("backups");
    let before: Vec<_> = QUERIES.iter().map(|q| ranking(&e, q)).collect();
    // Clinicians search all along.
    let stop = Arc::new(AtomicBool::new(false));
    let searcher = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) || n == 0 {
                for q in QUERIES {
                    e.searcher()
                        .search_unaudited(&SearchRequest { query: q.into(), ..Default::default() })
                        .expect("a search");
                    n += 1;
                }
            }
            n
        })
    };
    // The free-space check passes (64 MB for a few MB of data); the disk fills once the archive is being written.
    let mut filled = false;
    let err = BackupMaker::of(&e)
        .make_backup(&BackupParams { to: Some(folder.clone()) }, &token(), &mut |stage, _, _| {
            if stage == "正在写入备份" && !filled {
                fill(&disk.0);
                filled = true;
            }
        })
        .unwrap_err();
    stop.store(true, Ordering::SeqCst);
    assert!(searcher.join().unwrap() > 0);
    assert!(filled);
    assert_eq!(err.code(), crate::ErrorCode::DiskFull, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("磁盘空间不足") && msg.contains(&folder.display().to_string()), "names the archive: {msg}");
    // Nothing half-written is left, listed or verifiable; the data and what searches find are untouched.
    let left: Vec<_> = std::fs::read_dir(&folder).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(list(&folder, None).unwrap().is_empty());
    assert_eq!(QUERIES.iter().map(|q| ranking(&e, q)).collect::<Vec<_>>(), before);
    assert!(e.indexer().check().unwrap().consistent);
    // Room again: the next backup works.
    std::fs::remove_file(disk.0.join("ballast")).unwrap();
    let r = backup(&e, &folder);
    verify(&r.path, None).unwrap();
}

#[test]
fn a_command_opened_beside_a_writer_mid_batch_neither_fails_nor_touches_its_batch() {
    // `care backup create` (or any command) started while the server is in the middle of an ingest batch: the
    // pending rows are that batch, not a crash's leftover, and the server holds the index writer.
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    let server = demo(&dir);
    let batch = "UPDATE documents SET state = 'pending' WHERE id IN (SELECT id FROM documents ORDER BY id LIMIT 3)";
    assert_eq!(server.store.conn().execute(batch, []).unwrap(), 3);
    let pending = |e: &Engine| -> i64 {
        e.store.reader().query_row("SELECT COUNT(*) FROM documents WHERE state = 'pending'", [], |r| r.get(0)).unwrap()
    };
    let command = Engine::open(config(&dir), OpenMode::Existing).expect("opens beside the writer");
    assert_eq!(pending(&command), 3, "the other process's batch is left to it");
    assert!(!ranking(&command, "二甲双胍").is_empty());
    drop(command);
    // Once the writer is gone (a crash releases its lock too), the next open finishes the batch.
    drop(server);
    let after = Engine::open(config(&dir), OpenMode::Existing).unwrap();
    assert_eq!(pending(&after), 0);
    assert!(after.indexer().check().unwrap().consistent);
}
