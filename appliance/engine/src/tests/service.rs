//! The service layer's tests: real SQLite in temporary data directories.

use crate::EngineConfig;
use crate::accounts::LoginPolicy;
use crate::engine::Engine;
use crate::engine::OpenMode;
use crate::error::{Error, Result};
use crate::ingest::ParsedDocument;
use crate::service::*;

fn engine(dir: &std::path::Path) -> Engine {
    let cfg = crate::config::test_config(dir);
    Engine::open(cfg, OpenMode::Create).unwrap()
}

#[test]
fn health_says_when_the_disk_is_below_the_reserve() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(t.path());
    let h = crate::service::health_report(&e);
    assert!(h.ok && h.problems.is_empty() && h.free_bytes.is_some(), "{h:?}");
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = t.path().to_path_buf();
    cfg.training.keep_free_gb = 1e9;
    drop(e);
    let e = Engine::open(cfg, OpenMode::Existing).unwrap();
    let h = crate::service::health_report(&e);
    assert!(!h.ok && h.problems.iter().any(|p| p.contains("低于保留值")), "{h:?}");
    assert!(!t.path().join(".health-probe").exists(), "the probe leaves nothing");
}

/// Uploads and model imports are refused as `disk_full` (Chinese, before anything is written) when the data
/// disk is below `[training] keep_free_gb`; SQLite's "database or disk is full" is `disk_full` too, not
/// `storage`. The SQLite case is real: `max_page_count` makes the store full.
#[test]
fn uploads_imports_and_a_full_store_answer_disk_full() {
    let t = tempfile::tempdir().unwrap();
    let root = Admin::console("cli:root");
    let e = engine(t.path());
    e.collections().create(&root, "c1", "").unwrap();
    e.dir.ensure_free(e.cfg.disk_reserve_bytes(), "上传文件", 0).unwrap();
    drop(e);
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = t.path().to_path_buf();
    cfg.training.keep_free_gb = 1e9;
    let e = Engine::open(cfg, OpenMode::Existing).unwrap();
    let uploads_before = std::fs::read_dir(e.queue().uploads_dir()).map(|d| d.count()).unwrap_or(0);
    for err in [
        e.ingest().new_upload(&root, "c1").unwrap_err(),
        e.ingest().new_staging_upload(&root).unwrap_err(),
        e.models().import(&root, &t.path().join("no-package")).unwrap_err(),
    ] {
        // A missing package is found before space matters; the other two say the disk is short.
        if err.code() == crate::ErrorCode::DiskFull {
            assert!(err.to_string().contains("磁盘空间不足") && err.to_string().contains("keep_free_gb"), "{err}");
        }
    }
    assert_eq!(e.ingest().new_upload(&root, "c1").unwrap_err().code(), crate::ErrorCode::DiskFull);
    assert_eq!(std::fs::read_dir(e.queue().uploads_dir()).map(|d| d.count()).unwrap_or(0), uploads_before);

    let pages: i64 = e.store.conn().query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    e.store.conn().execute_batch(&format!("PRAGMA max_page_count = {pages}")).unwrap();
    let long = "很长的说明".repeat(20_000);
    let err = (0..50).find_map(|i| e.collections().create(&root, &format!("full{i}"), &long).err()).unwrap();
    assert_eq!(err.code(), crate::ErrorCode::DiskFull, "{err}");
    assert!(err.to_string().contains("磁盘空间不足"), "{err}");
}

/// `[limits]`: a third schedule past max_schedules 2 and a third queued job past max_queued_jobs 2 are refused
/// as `limit_reached` in Chinese (changing an existing schedule is not); a user's fourth feedback in an hour past
/// feedback_per_user_per_hour 3 is `rate_limited`, while another user may still give feedback.
#[test]
fn schedules_queued_jobs_and_feedback_are_capped() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = crate::config::test_config(t.path());
    cfg.limits = crate::config::LimitsConfig {
        max_schedules: 2,
        max_queued_jobs: 2,
        feedback_per_user_per_hour: 3,
        ..Default::default()
    };
    let e = Engine::open(cfg, OpenMode::Create).unwrap();
    let root = Admin::console("cli:root");
    let spec: crate::training::schedule::ScheduleSpec =
        serde_json::from_str(r#"{"weekday": 6, "time": "02:00"}"#).unwrap();
    let first = e.training().set_schedule(&root, None, &spec).unwrap();
    e.training().set_schedule(&root, None, &spec).unwrap();
    let err = e.training().set_schedule(&root, None, &spec).unwrap_err();
    assert_eq!(err.code(), crate::ErrorCode::LimitReached, "{err}");
    assert!(err.to_string().contains("训练计划已达上限 2 个") && err.to_string().contains("max_schedules"));
    e.training().set_schedule(&root, Some(first), &spec).unwrap();

    e.collections().create(&root, "c1", "").unwrap();
    for i in 0..3 {
        let up = e.ingest().new_upload(&root, "c1").unwrap();
        let f = up.join(format!("d{i}.md"));
        std::fs::write(&f, "# 二甲双胍\n二甲双胍禁用于严重肾功能不全。\n").unwrap();
        let r = e.ingest().submit_upload(&root, "c1", vec![f], Default::default());
        if i < 2 {
            r.unwrap();
        } else {
            let err = r.unwrap_err();
            assert_eq!(err.code(), crate::ErrorCode::LimitReached, "{err}");
            assert!(err.to_string().contains("排队中的任务已达上限 2 个"), "{err}");
        }
    }

    let doc = ParsedDocument {
        external_id: "d1".into(),
        title: "二甲双胍".into(),
        text: "二甲双胍禁用于严重肾功能不全。".into(),
        source: "d1.md".into(),
        ..Default::default()
    };
    e.indexer().ingest_documents("c1", &[doc]).unwrap();
    let (wang, li) = (Admin::console("drwang"), Admin::console("drli"));
    let chunk =
        e.search().run(&root, &SearchAs { query: "二甲双胍".into(), ..Default::default() }).unwrap().hits[0].chunk_id;
    for _ in 0..3 {
        e.search().feedback(&wang, "二甲双胍", chunk, true).unwrap();
    }
    let err = e.search().feedback(&wang, "二甲双胍", chunk, false).unwrap_err();
    assert_eq!(err.code(), crate::ErrorCode::RateLimited, "{err}");
    assert!(err.to_string().contains("每人每小时最多 3 条"), "{err}");
    e.search().feedback(&li, "二甲双胍", chunk, true).unwrap();
}

/// `[limits] max_feedback_per_user`: a user's 1,000 feedback rows (one judged query each) count 50 in what
/// training and evaluation read, that user's newest; another user's few count in full; spreading over a second
/// collection gains nothing.
#[test]
fn one_users_feedback_counts_at_most_the_cap_in_training_and_evaluation() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = crate::config::test_config(t.path());
    cfg.limits.feedback_per_user_per_hour = 10_000;
    cfg.limits.max_feedback_per_user = 50;
    let e = Engine::open(cfg, OpenMode::Create).unwrap();
    let root = Admin::console("cli:root");
    let mut chunks = Vec::new();
    for c in ["c1", "c2"] {
        e.collections().create(&root, c, "").unwrap();
        let doc = ParsedDocument {
            external_id: format!("{c}-d1"),
            title: "二甲双胍".into(),
            text: "二甲双胍禁用于严重肾功能不全。".into(),
            source: "d1.md".into(),
            ..Default::default()
        };
        e.indexer().ingest_documents(c, &[doc]).unwrap();
        let ask = SearchAs { query: "二甲双胍".into(), collection: Some(c.into()), ..Default::default() };
        chunks.push(e.search().run(&root, &ask).unwrap().hits[0].chunk_id);
    }
    // A schedule that fires on new feedback counts it the same way (checked below, before anything fires).
    let spec = crate::training::schedule::ScheduleSpec {
        weekday: None,
        time: None,
        min_new_feedback: Some(60),
        recipe: Default::default(),
        enabled: false,
    };
    e.training().set_schedule(&root, None, &spec).unwrap();
    let (wang, li) = (Admin::console("drwang"), Admin::console("drli"));
    // drwang's oldest 30 go to c2, the rest to c1: his newest 50 are all on c1, so c2 counts none of his.
    for i in 0..1000 {
        e.search().feedback(&wang, &format!("问题 {i}"), chunks[usize::from(i < 30)], i % 2 == 0).unwrap();
    }
    for i in 0..5 {
        e.search().feedback(&li, &format!("李医生的问题 {i}"), chunks[1], true).unwrap();
    }
    let counted = |col: &str| -> Vec<String> {
        let id = e.store.collection(col).unwrap().id;
        let mut q: Vec<String> = ["train", "eval"]
            .iter()
            .flat_map(|part| e.judgments().judged(id, part).unwrap().queries.into_iter().map(|(_, q)| q))
            .collect();
        q.sort();
        q
    };
    let c1 = counted("c1");
    assert_eq!(c1.len(), 50, "{c1:?}");
    assert!(c1.iter().all(|q| q.strip_prefix("问题 ").and_then(|n| n.parse::<u32>().ok()).unwrap() >= 950));
    assert_eq!(counted("c2").len(), 5, "drli's 5 count in full; drwang's oldest 30 not at all");
    // The listing says what training and evaluation will read.
    let sets = e.models().judgment_sets(&root, Some("c1")).unwrap();
    assert_eq!(sets[0].train_queries + sets[0].eval_queries, 50, "{sets:?}");
    // 1,005 new rows, but drwang's count 50: short of the schedule's 60, so his clicks alone start no run.
    assert_eq!(e.training().schedules(&root).unwrap()[0].new_feedback, 55);
}

/// Refusals of the server's guard are audited at most `REFUSALS_PER_ADDRESS` per address and `REFUSALS_IN_ALL`
/// in all per window, whatever the flood. An engine that appended records moves the audit anchor as it closes,
/// so cutting the last record off afterwards is found by the next check (before, the chain still verified).
#[test]
fn refusals_are_audited_within_a_bound_and_closing_checkpoints_the_log() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(t.path());
    let detail = serde_json::json!({"method": "GET", "route": "/api/v1/search"});
    let refuse = |client: &str| e.audit().refusal("anonymous", "request.unauthenticated", client, &detail).unwrap();
    let one = (0..100).filter(|_| refuse("10.0.0.1")).count();
    assert_eq!(one, REFUSALS_PER_ADDRESS as usize);
    let many = (0..1000).filter(|i| refuse(&format!("10.1.{}.{}", i / 256, i % 256))).count();
    assert_eq!(one + many, REFUSALS_IN_ALL as usize);
    let n: i64 = e
        .store
        .reader()
        .query_row("SELECT COUNT(*) FROM audit WHERE action = 'request.unauthenticated'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n as u32, REFUSALS_IN_ALL);

    e.collections().create(&Admin::console("cli:root"), "c1", "").unwrap();
    // The 900 beyond the cap are not lost: closing writes their aggregate (a running engine, a minute later).
    drop(e);
    let conn = rusqlite::Connection::open(t.path().join("care.sqlite")).unwrap();
    let details: Vec<String> = conn
        .prepare("SELECT detail FROM audit WHERE action = 'request.refusals_aggregated'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<std::result::Result<_, _>>()
        .unwrap();
    assert_eq!(details.len(), 1, "{details:?}");
    let a: serde_json::Value = serde_json::from_str(&details[0]).unwrap();
    assert_eq!(a["refused"], 1100 - REFUSALS_IN_ALL);
    assert_eq!(a["actions"]["request.unauthenticated"], 1100 - REFUSALS_IN_ALL);
    assert_eq!(a["addresses"]["10.0.0.1"], 100 - REFUSALS_PER_ADDRESS, "the busiest address is named");
    assert_eq!(a["addresses"].as_object().unwrap().len(), 20, "twenty named, the rest counted together");
    assert_eq!(a["distinct_addresses"], 1 + 1000 - (REFUSALS_IN_ALL - REFUSALS_PER_ADDRESS));
    let named: u64 = a["addresses"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(named + a["other_addresses_refused"].as_u64().unwrap(), u64::from(1100 - REFUSALS_IN_ALL));
    conn.execute("DELETE FROM audit WHERE id = (SELECT max(id) FROM audit)", []).unwrap();
    drop(conn);
    let cfg = crate::config::test_config(t.path());
    let e = Engine::open(cfg, OpenMode::Existing).unwrap();
    let err = e.audit().verify(&Admin::console("cli:root"), false).unwrap_err();
    assert_eq!(err.code(), crate::ErrorCode::AuditTampered, "{err}");
}

fn audit_count(e: &Engine) -> i64 {
    e.store.reader().query_row("SELECT COUNT(*) FROM audit", [], |r| r.get(0)).unwrap()
}

/// Everything an operation here could change, as one comparable string.
fn state(e: &Engine) -> String {
    e.store
        .reader()
        .query_row(
            "SELECT ifnull((SELECT group_concat(name || approved_for_training) FROM collections), '') || '|' ||
                    ifnull((SELECT group_concat(username || role || disabled || password_hash) FROM users), '') || '|' ||
                    ifnull((SELECT group_concat(user_id || '-' || collection_id) FROM grants), '') || '|' ||
                    ifnull((SELECT group_concat(id || '-' || revoked) FROM api_tokens), '') || '|' ||
                    (SELECT COUNT(*) FROM feedback) || '|' || (SELECT COUNT(*) FROM sessions) || '|' ||
                    ifnull((SELECT group_concat(id || state) FROM documents), '') || '|' ||
                    (SELECT COUNT(*) FROM judgment_sets) || '-' || (SELECT COUNT(*) FROM judgments) || '|' ||
                    (SELECT COUNT(*) FROM models) || '-' || (SELECT COUNT(*) FROM model_history) || '|' ||
                    ifnull((SELECT group_concat(id || spec) FROM training_schedules), '')",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// A crash between an operation's change and its audit record, injected as a failing audit insert (a
/// trigger: the real SQLite, no mock): the operation must fail and change nothing. Run again without the
/// fault, it must change the state and add exactly one record.
fn atomic<T: std::fmt::Debug>(e: &Engine, what: &str, op: impl Fn() -> Result<T>) -> T {
    let (s0, n0) = (state(e), audit_count(e));
    e.store
        .conn()
        .execute_batch(
            "CREATE TRIGGER crash_before_audit BEFORE INSERT ON audit
             BEGIN SELECT RAISE(ABORT, 'injected crash before the audit record'); END;",
        )
        .unwrap();
    let failed = op();
    e.store.conn().execute_batch("DROP TRIGGER crash_before_audit").unwrap();
    assert!(failed.is_err(), "{what}: succeeded without its audit record: {failed:?}");
    assert_eq!(state(e), s0, "{what}: changed without its audit record");
    assert_eq!(audit_count(e), n0, "{what}");
    let out = op().unwrap_or_else(|err| panic!("{what}: {err}"));
    assert_ne!(state(e), s0, "{what}: changed nothing");
    assert_eq!(audit_count(e), n0 + 1, "{what}: exactly one audit record");
    out
}

#[test]
fn no_change_commits_without_its_audit_record() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(t.path());
    let root = Admin::console("cli:root");
    let policy = LoginPolicy { max_failed: 5, lock_seconds: 60, ..LoginPolicy::default() };
    e.accounts().create_user(&root, "admin", "admin-pass-1", "admin", true).unwrap();
    atomic(&e, "create collection", || e.collections().create(&root, "c1", ""));
    atomic(&e, "approve", || e.collections().approve(&root, "c1", true));
    atomic(&e, "create user", || e.accounts().create_user(&root, "drwang", "clinician-pass-1", "clinician", true));
    let upd = UserUpdate { disabled: Some(true), ..Default::default() };
    atomic(&e, "disable user", || e.accounts().update_user(&root, "drwang", &upd));
    let upd = UserUpdate { disabled: Some(false), password: None, ..Default::default() };
    e.accounts().update_user(&root, "drwang", &upd).unwrap();
    let upd = UserUpdate { password: Some("clinician-pass-2".into()), ..Default::default() };
    atomic(&e, "reset password", || e.accounts().update_user(&root, "drwang", &upd));
    atomic(&e, "grant", || e.accounts().grant(&root, "drwang", "c1"));
    let (tok, _) = atomic(&e, "create token", || e.accounts().create_token(&root, "drwang", "his"));
    atomic(&e, "revoke token", || e.accounts().revoke_token(&root, tok.id));
    let (user, cookie, _) = atomic(&e, "login", || e.accounts().login("drwang", "clinician-pass-2", policy, "test"));
    let doc = ParsedDocument {
        external_id: "d1".into(),
        title: "二甲双胍".into(),
        text: "二甲双胍禁用于严重肾功能不全。".into(),
        source: "d1.md".into(),
        ..Default::default()
    };
    e.indexer().ingest_documents("c1", &[doc]).unwrap();
    let clin = Actor::user(&user);
    let chunk =
        e.search().run(&clin, &SearchAs { query: "二甲双胍".into(), ..Default::default() }).unwrap().hits[0].chunk_id;
    atomic(&e, "feedback", || e.search().feedback(&clin, "二甲双胍", chunk, true));
    let csv = t.path().join("judgments.csv");
    std::fs::write(&csv, "query,id,grade\n二甲双胍的禁忌症,d1,2\n").unwrap();
    let src = crate::judgments::JudgmentSource::Csv(&csv);
    atomic(&e, "import judgments", || e.models().import_judgments(&root, "c1", "set1", src));
    atomic(&e, "delete judgments", || e.models().delete_judgments(&root, "c1", "set1"));
    let spec: crate::training::schedule::ScheduleSpec =
        serde_json::from_str(r#"{"weekday": 6, "time": "02:00", "min_new_feedback": 100}"#).unwrap();
    let sid = atomic(&e, "add training schedule", || e.training().set_schedule(&root, None, &spec));
    let spec = crate::training::schedule::ScheduleSpec { weekday: Some(0), ..spec };
    atomic(&e, "change training schedule", || e.training().set_schedule(&root, Some(sid), &spec));
    atomic(&e, "delete training schedule", || e.training().delete_schedule(&root, sid));
    atomic(&e, "logout", || e.accounts().logout(&clin, &cookie));
    atomic(&e, "own password", || {
        e.accounts().change_own_password(&clin, "clinician-pass-2", "clinician-pass-3", policy, "test")
    });
    atomic(&e, "revoke grant", || e.accounts().revoke(&root, "drwang", "c1"));
    atomic(&e, "delete user", || e.accounts().delete_user(&root, "drwang"));
    atomic(&e, "delete collection", || e.collections().delete(&root, "c1"));
    assert!(e.indexer().check().unwrap().consistent);
}

#[test]
fn clinicians_are_refused_admin_operations() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(t.path());
    let root = Admin::console("cli:root");
    let u = e.accounts().create_user(&root, "drli", "clinician-pass-1", "clinician", true).unwrap();
    let clin = Actor::user(&u);
    // Every admin-only operation takes `&Admin` (a clinician's call does not compile); the one way to one is
    // refused for a clinician, and a demoted administrator's account yields none either.
    assert!(matches!(clin.admin(), Err(Error::Forbidden(_))));
    // Another administrator stays, so demoting this one is allowed.
    e.accounts().create_user(&root, "li", "admin-pass-34", "admin", true).unwrap();
    let u = e.accounts().create_user(&root, "drwang", "admin-pass-12", "admin", true).unwrap();
    assert!(Actor::user(&u).admin().is_ok());
    e.accounts()
        .update_user(&root, "drwang", &UserUpdate { role: Some("clinician".into()), ..Default::default() })
        .unwrap();
    let demoted = crate::accounts::user_by_id(&e.store, u.id).unwrap();
    assert!(matches!(Actor::user(&demoted).admin(), Err(Error::Forbidden(_))));
    assert!(e.search().readable_collections(&clin).unwrap().is_empty());
}
