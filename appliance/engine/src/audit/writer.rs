//! Group commit for the search path's audit records.
//!
//! Why: every search is audited, and each record used to be a write transaction of its own on the store's single
//! writer connection, so concurrent searches queued on that connection one commit at a time. Here one thread
//! takes whatever records are waiting (up to [`MAX_BATCH`]), appends them with [`super::append`] in ONE
//! transaction, in the order they were queued, and then answers each caller: concurrent searches share a commit
//! instead of queueing one by one.
//!
//! Nothing else changes: [`Writer::append`] returns only once its record is committed (or with the error that kept
//! it out), the chain links records one after another inside the batch's transaction exactly as separate
//! transactions would, and a failed batch is rolled back whole and fails every caller in it, so no record is lost
//! or written twice. Only searches (and refused searches) are written here; a change still commits with its
//! record in its own transaction.
//!
//! The thread also keeps the tally of requests refused beyond the audit cap ([`Writer::refused`]): a flood must not
//! fill the log one record per request, nor go unrecorded. Counted in memory, they are written as one
//! `request.refusals_aggregated` record per [`AGGREGATE_SECONDS`] (how many, which refusals, from which
//! addresses, first and last), when the window ends or when the engine closes: the thread waits for that due time,
//! it never polls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use rusqlite::Connection;

use crate::error::{Error, Result};

/// Records one transaction takes at most.
pub(crate) const MAX_BATCH: usize = 256;

/// Refusals over the cap are summed for this long before their aggregate record is written.
pub(crate) const AGGREGATE_SECONDS: u64 = 60;

/// Addresses an aggregate names one by one at most; the rest are counted together. The tally keeps at most
/// [`TALLY_ADDRESSES`] while it sums, so a flood from rotating addresses costs bounded memory.
const NAMED_ADDRESSES: usize = 20;
const TALLY_ADDRESSES: usize = 10_000;

enum Msg {
    Record(Pending),
    /// A refused request beyond the cap: (its action, the client's address key).
    Refused(String, String),
}

/// Refusals summed since `first`.
#[derive(Default)]
struct Tally {
    count: u64,
    first: i64,
    last: i64,
    actions: std::collections::BTreeMap<String, u64>,
    addresses: std::collections::HashMap<String, u64>,
    /// Refusals from addresses beyond [`TALLY_ADDRESSES`].
    unnamed: u64,
}

impl Tally {
    fn add(&mut self, action: String, address: String, now: i64) {
        if self.count == 0 {
            self.first = now;
        }
        self.count += 1;
        self.last = now;
        *self.actions.entry(action).or_default() += 1;
        let known = self.addresses.len() < TALLY_ADDRESSES || self.addresses.contains_key(&address);
        match known {
            true => *self.addresses.entry(address).or_default() += 1,
            false => self.unnamed += 1,
        }
    }

    /// The aggregate record's detail: the busiest addresses by name, the rest as one count.
    fn detail(&self) -> serde_json::Value {
        let mut by: Vec<(&String, &u64)> = self.addresses.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let named: serde_json::Map<String, serde_json::Value> =
            by.iter().take(NAMED_ADDRESSES).map(|(a, n)| ((*a).clone(), (**n).into())).collect();
        let others: u64 = by.iter().skip(NAMED_ADDRESSES).map(|(_, n)| **n).sum::<u64>() + self.unnamed;
        serde_json::json!({
            "refused": self.count,
            "actions": self.actions,
            "addresses": named,
            "other_addresses_refused": others,
            "distinct_addresses": self.addresses.len() as u64 + u64::from(self.unnamed > 0),
            "first": crate::clock::utc_unix(self.first),
            "last": crate::clock::utc_unix(self.last),
            "reason": "beyond the audit cap on refused requests",
        })
    }
}

/// A record waiting for the writer, and where its outcome goes.
struct Pending {
    actor: String,
    action: String,
    detail: serde_json::Value,
    done: mpsc::SyncSender<Result<i64>>,
}

/// The writer thread and its queue; dropping it lets the thread commit what is queued, then joins it.
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    /// Transactions committed so far (records per commit says how much sharing there was); read by tests.
    #[cfg(test)]
    commits: Arc<AtomicU64>,
}

/// A queued record's outcome, to wait for.
struct Ticket(mpsc::Receiver<Result<i64>>);

fn stopped() -> Error {
    Error::Internal("the audit writer has stopped; the record was not written".into())
}

impl Writer {
    /// Starts the thread that writes through `conn`, the store's one writer connection.
    pub(crate) fn start(conn: Arc<Mutex<Connection>>) -> Result<Self> {
        let (queue, rx) = mpsc::channel();
        let commits = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&commits);
        let thread = std::thread::Builder::new()
            .name("care-audit-writer".into())
            .spawn(move || run(&conn, &rx, &counted))
            .map_err(|e| Error::Internal(format!("cannot start the audit writer thread: {e}")))?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
            #[cfg(test)]
            commits,
        })
    }

    /// Appends one record and returns its id once it is committed.
    pub(crate) fn append(&self, actor: &str, action: &str, detail: serde_json::Value) -> Result<i64> {
        self.submit(actor, action, detail)?.wait()
    }

    fn submit(&self, actor: &str, action: &str, detail: serde_json::Value) -> Result<Ticket> {
        let (done, outcome) = mpsc::sync_channel(1);
        let p = Pending { actor: actor.into(), action: action.into(), detail, done };
        self.queue.as_ref().ok_or_else(stopped)?.send(Msg::Record(p)).map_err(|_| stopped())?;
        Ok(Ticket(outcome))
    }

    /// Counts a refused request beyond the audit cap, for the next aggregate record; returns at once.
    pub(crate) fn refused(&self, action: &str, address_key: &str) {
        if let Some(q) = &self.queue {
            let _ = q.send(Msg::Refused(action.chars().take(64).collect(), address_key.chars().take(64).collect()));
        }
    }

    #[cfg(test)]
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

impl Ticket {
    fn wait(self) -> Result<i64> {
        self.0.recv().map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop once it has committed everything sent before.
        drop(self.queue.take());
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the audit writer thread panicked");
        }
    }
}

/// Blocks on the queue (or until a tally's aggregate is due); each wake-up commits everything waiting (up to
/// [`MAX_BATCH`]) as one transaction.
fn run(conn: &Mutex<Connection>, queue: &mpsc::Receiver<Msg>, commits: &AtomicU64) {
    let mut tally = Tally::default();
    let mut due: Option<std::time::Instant> = None;
    loop {
        let first = match due {
            None => queue.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(at) => queue.recv_timeout(at.saturating_duration_since(std::time::Instant::now())),
        };
        let first = match first {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                write_tally(conn, &mut tally, commits);
                due = (tally.count > 0).then(aggregate_due);
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                write_tally(conn, &mut tally, commits);
                return;
            }
        };
        let mut batch = Vec::new();
        for m in std::iter::once(first).chain(queue.try_iter().take(MAX_BATCH - 1)) {
            match m {
                Msg::Record(p) => batch.push(p),
                Msg::Refused(action, address) => {
                    tally.add(action, address, time::OffsetDateTime::now_utc().unix_timestamp());
                    due.get_or_insert_with(aggregate_due);
                }
            }
        }
        if !batch.is_empty() {
            commit_batch(conn, batch, commits);
        }
    }
}

/// When a tally started (or kept after a failed write) now is to be written.
fn aggregate_due() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(AGGREGATE_SECONDS)
}

fn commit_batch(conn: &Mutex<Connection>, batch: Vec<Pending>, commits: &AtomicU64) {
    // A panic mid-batch rolls the transaction back as it unwinds; the thread stays up for the next batch.
    let records = batch.iter().map(|p| (p.actor.as_str(), p.action.as_str(), &p.detail));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| commit(conn, records)))
        .unwrap_or_else(|_| Err(Error::Internal("the audit writer panicked; the batch was not written".into())));
    match outcome {
        Ok(ids) => {
            commits.fetch_add(1, Ordering::Relaxed);
            for (p, id) in batch.into_iter().zip(ids) {
                let _ = p.done.send(Ok(id));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, records = batch.len(), "audit batch failed; nothing of it was written");
            for p in batch {
                let _ = p.done.send(Err(same_error(&e)));
            }
        }
    }
}

/// Writes the tally as one aggregate record and starts a new one; a failure is logged (the server's log still
/// counts every refusal) and the tally kept for the next try.
fn write_tally(conn: &Mutex<Connection>, tally: &mut Tally, commits: &AtomicU64) {
    if tally.count == 0 {
        return;
    }
    match commit(conn, [("system", "request.refusals_aggregated", &tally.detail())]) {
        Ok(_) => {
            commits.fetch_add(1, Ordering::Relaxed);
            *tally = Tally::default();
        }
        Err(e) => tracing::error!(error = %e, refused = tally.count, "aggregate refusal record not written"),
    }
}

/// Appends (actor, action, detail) records in one transaction, in order; their ids.
fn commit<'a>(
    conn: &Mutex<Connection>,
    records: impl IntoIterator<Item = (&'a str, &'a str, &'a serde_json::Value)>,
) -> Result<Vec<i64>> {
    let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
    let tx = conn.transaction()?;
    let ids = records.into_iter().map(|(actor, action, detail)| super::append(&tx, actor, action, detail));
    let ids = ids.collect::<Result<Vec<_>>>()?;
    tx.commit()?;
    Ok(ids)
}

/// The batch's error once more for each caller ([`Error`] is not `Clone`), with the same code: what a record of
/// its own failing the same way would have returned.
#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "an append fails in SQLite or the disk; anything else, new variants too, keeps its text as internal"
)]
fn same_error(e: &Error) -> Error {
    use rusqlite::Error as Sql;
    match e {
        Error::Sqlite(Sql::SqliteFailure(f, m)) => Error::Sqlite(Sql::SqliteFailure(*f, m.clone())),
        Error::Sqlite(other) => Error::Sqlite(Sql::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        )),
        Error::StoreFull { store, detail } => Error::StoreFull { store, detail: detail.clone() },
        Error::Internal(m) => Error::Internal(m.clone()),
        other => Error::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::ErrorCode;
    use crate::engine::{Engine, OpenMode};
    use crate::search::SearchRequest;
    use crate::service::{Admin, SearchAs};

    fn demo_engine(dir: &std::path::Path) -> Engine {
        let cfg = crate::config::test_config(dir);
        let e = Engine::open(cfg, OpenMode::Create).unwrap();
        crate::demo::load_demo(&e).unwrap();
        e
    }

    fn root() -> Admin {
        Admin::console("cli:root")
    }

    fn search_for(q: &str) -> SearchAs {
        SearchAs { query: q.into(), limit: Some(10), ..Default::default() }
    }

    /// (id, query) of every record with `action`, oldest first.
    fn records(e: &Engine, action: &str) -> Vec<(i64, String)> {
        let c = e.store.reader();
        let mut st = c.prepare("SELECT id, detail FROM audit WHERE action = ?1 ORDER BY id").unwrap();
        st.query_map([action], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .unwrap()
            .map(|r| {
                let (id, detail) = r.unwrap();
                let d: serde_json::Value = serde_json::from_str(&detail).unwrap();
                (id, d["query"].as_str().unwrap_or_default().to_string())
            })
            .collect()
    }

    fn last_id(e: &Engine) -> i64 {
        e.store.reader().query_row("SELECT max(id) FROM audit", [], |r| r.get(0)).unwrap()
    }

    const QUERIES: [&str; 6] = ["高血压", "糖尿病 饮食", "二甲双胍", "发热", "胰岛素注射", "咳嗽 儿童"];

    #[test]
    fn concurrent_searches_get_one_record_each_and_the_chain_verifies() {
        let t = tempfile::tempdir().unwrap();
        let e = demo_engine(t.path());
        let before = e.audit_writer.commits();
        let (threads, each) = (16, 8);
        std::thread::scope(|s| {
            for th in 0..threads {
                let e = &e;
                s.spawn(move || {
                    for i in 0..each {
                        let q = format!("{} t{th}n{i}", QUERIES[(th + i) % QUERIES.len()]);
                        e.search().run(&root(), &search_for(&q)).unwrap();
                    }
                });
            }
        });
        let mut got: Vec<String> = records(&e, "search").into_iter().map(|(_, q)| q).collect();
        got.sort();
        let mut want: Vec<String> = (0..threads)
            .flat_map(|th| (0..each).map(move |i| format!("{} t{th}n{i}", QUERIES[(th + i) % QUERIES.len()])))
            .collect();
        want.sort();
        assert_eq!(got, want, "exactly one record per search, each with its own query");
        let commits = e.audit_writer.commits() - before;
        assert!((1..=(threads * each) as u64).contains(&commits), "{commits} commits");
        let report = e.audit().verify(&root(), true).unwrap();
        assert_eq!(report.verified_through, last_id(&e));
    }

    #[test]
    fn queued_records_share_one_transaction() {
        let t = tempfile::tempdir().unwrap();
        let e = demo_engine(t.path());
        let before = e.audit_writer.commits();
        // While the writer connection is held, the thread takes at most one batch and blocks on it; the rest wait
        // in the queue and go into the next transaction together.
        let held = e.store.conn();
        let tickets: Vec<_> = (0..40)
            .map(|i| {
                e.audit_writer.submit("cli:root", "search", serde_json::json!({"query": format!("q{i}")})).unwrap()
            })
            .collect();
        drop(held);
        let ids: Vec<i64> = tickets.into_iter().map(|t| t.wait().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "queue order is chain order: {ids:?}");
        assert!(e.audit_writer.commits() - before <= 2, "{} commits for 40 records", e.audit_writer.commits() - before);
        let queries: Vec<String> = records(&e, "search").into_iter().map(|(_, q)| q).collect();
        assert_eq!(queries, (0..40).map(|i| format!("q{i}")).collect::<Vec<_>>());
        e.audit().verify(&root(), true).unwrap();
    }

    #[test]
    fn a_search_record_is_committed_when_search_as_returns() {
        let t = tempfile::tempdir().unwrap();
        let e = demo_engine(t.path());
        for (i, q) in QUERIES.iter().enumerate() {
            e.search().run(&root(), &search_for(q)).unwrap();
            // Another connection to the file sees it: committed, not only written inside a transaction.
            let other = rusqlite::Connection::open(e.data_dir().sqlite()).unwrap();
            let (action, detail): (String, String) = other
                .query_row("SELECT action, detail FROM audit ORDER BY id DESC LIMIT 1", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .unwrap();
            let detail: serde_json::Value = serde_json::from_str(&detail).unwrap();
            assert_eq!((action.as_str(), detail["query"].as_str()), ("search", Some(*q)), "search {i}");
        }
        // A refused search goes the same way.
        let err = e.search().run(&root(), &search_for("")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput);
        assert_eq!(records(&e, "search.rejected").len(), 1);
        // The engine closing lets the writer finish, and the store's checkpoint at close covers the last record.
        let last = last_id(&e);
        drop(e);
        let anchor = std::fs::read_to_string(t.path().join(crate::audit::ANCHOR_FILE)).unwrap();
        let anchor: serde_json::Value = serde_json::from_str(&anchor).unwrap();
        assert_eq!(anchor["id"], last);
    }

    #[test]
    fn a_failed_batch_fails_every_caller_in_it_and_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let e = demo_engine(t.path());
        e.search().run(&root(), &search_for("高血压")).unwrap();
        let head_before = records(&e, "search");
        e.store
            .conn()
            .execute_batch(
                "CREATE TRIGGER audit_read_only BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'audit is read-only'); END;",
            )
            .unwrap();
        // What a record written in a transaction of its own returns, as before the writer.
        let alone = e.store.audit_record(&root().name, "search", &serde_json::json!({})).unwrap_err();
        let errors: Vec<crate::Error> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let e = &e;
                    s.spawn(move || e.search().run(&root(), &search_for(&format!("糖尿病 {i}"))).unwrap_err())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for err in &errors {
            assert_eq!(err.code(), alone.code(), "{err}");
            assert_eq!(err.to_string(), alone.to_string());
        }
        assert_eq!(alone.code(), ErrorCode::Storage);
        // Records certainly in one batch (queued while the writer connection is held) all get the error.
        let held = e.store.conn();
        let tickets: Vec<_> = (0..5)
            .map(|i| e.audit_writer.submit("cli:root", "search", serde_json::json!({"query": i})).unwrap())
            .collect();
        drop(held);
        for ticket in tickets {
            assert_eq!(ticket.wait().unwrap_err().to_string(), alone.to_string());
        }
        assert_eq!(records(&e, "search"), head_before, "nothing of a failed batch is written");
        e.store.conn().execute_batch("DROP TRIGGER audit_read_only").unwrap();
        e.search().run(&root(), &search_for("二甲双胍")).unwrap();
        let after = records(&e, "search");
        assert_eq!(after.len(), 2);
        assert_eq!(after[1].1, "二甲双胍");
        e.audit().verify(&root(), true).unwrap();
    }

    /// p50/p99 of search latency under 16 threads, with the record written by the group-commit writer and by a
    /// transaction of its own per search (the path before the writer). Run with
    /// `cargo test -p care-engine --lib audit::writer::tests::latency -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement; prints latencies"]
    fn latency_with_and_without_the_writer() {
        let t = tempfile::tempdir().unwrap();
        let e = demo_engine(t.path());
        let secs: u64 = std::env::var("CARE_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
        for group in [false, true, false, true] {
            let commits_before = e.audit_writer.commits();
            let deadline = Instant::now() + Duration::from_secs(secs);
            let mut lat: Vec<Duration> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..16)
                    .map(|th| {
                        let e = &e;
                        s.spawn(move || {
                            let mut lat = Vec::new();
                            let mut i = th;
                            while Instant::now() < deadline {
                                let q = QUERIES[i % QUERIES.len()];
                                i += 1;
                                let start = Instant::now();
                                let req = SearchRequest { query: q.into(), limit: Some(10), ..Default::default() };
                                let res = e.searcher().search_unaudited(&req).unwrap();
                                let detail = serde_json::json!({"query": q, "results": res.hits.len()});
                                if group {
                                    e.audit_writer.append("cli:root", "search", detail).unwrap();
                                } else {
                                    e.store.audit_record(&root().name, "search", &detail).unwrap();
                                }
                                lat.push(start.elapsed());
                            }
                            lat
                        })
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
            });
            lat.sort();
            let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0;
            let commits = e.audit_writer.commits() - commits_before;
            println!(
                "{:<26} searches {:>6} ({:>6.0}/s)  p50 {:>7.2} ms  p99 {:>7.2} ms  commits {}",
                if group { "group-commit writer" } else { "own transaction each" },
                lat.len(),
                lat.len() as f64 / secs as f64,
                pct(0.50),
                pct(0.99),
                if group { commits.to_string() } else { lat.len().to_string() },
            );
        }
        e.audit().verify(&root(), true).unwrap();
    }
}
