//! WAL checkpoints off the commit path.
//!
//! SQLite copies the write-ahead log back into the database inside the commit that takes the log past 1,000 pages,
//! and with `synchronous = NORMAL` that copy syncs the log and the database file to disk. Whichever commit crossed
//! the line paid for it: beside a synonym import or a filing spreadsheet it was often a search's audit record
//! (20–36 ms in `audit` on searches under writes, 2-core VM). Here the writer connection's commits only note the
//! log's size; a thread of its own, at background priority and on a connection of its own, runs a PASSIVE checkpoint
//! when the log has grown past the same 1,000 pages. A PASSIVE checkpoint takes no lock that a reader or the writer
//! waits for: the log is copied while commits go on. The thread waits on a channel, it never polls, and ends when
//! the store's writer connection closes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use rusqlite::Connection;

/// Log pages after which a checkpoint is due (SQLite's own default for its commit-time checkpoint).
const DUE_PAGES: i32 = 1_000;

/// The checkpoint thread of one store's writer connection.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    thread: Option<std::thread::JoinHandle<()>>,
    /// Checkpoints the thread has run that copied the whole log.
    #[cfg(test)]
    done: Arc<AtomicU64>,
}

impl Checkpointer {
    /// Moves the checkpoints of `conn`'s database (at `path`) to a thread of its own.
    pub(crate) fn start(conn: &mut Connection, path: &Path) -> rusqlite::Result<Self> {
        let done = Arc::new(AtomicU64::new(0));
        // One pending request is enough: commits made while a checkpoint runs are in the log it copies next time.
        let (due, requests) = mpsc::sync_channel::<()>(1);
        let (path, count) = (path.to_path_buf(), Arc::clone(&done));
        let started =
            std::thread::Builder::new().name("care-checkpoint".into()).spawn(move || run(&path, &requests, &count));
        let thread = match started {
            Ok(t) => {
                hand_checkpoints_to(conn, due)?;
                Some(t)
            }
            // Without the thread SQLite's own commit-time checkpoint stays: slower commits, nothing lost.
            Err(e) => {
                tracing::warn!(error = %e, "no checkpoint thread: the log is checkpointed by commits");
                None
            }
        };
        #[cfg(not(test))]
        drop(done);
        Ok(Checkpointer {
            thread,
            #[cfg(test)]
            done,
        })
    }

    /// Takes the hook off `conn` (which ends the thread's requests) and waits for the thread to end, so that its
    /// connection is closed before the store's: nothing of this database stays open once the store is gone (a
    /// restore replaces the files next).
    pub(crate) fn stop(&mut self, conn: &mut Connection) {
        if let Err(e) = conn.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, std::ffi::c_int) -> rusqlite::Result<()>>) {
            tracing::warn!(error = %e, "cannot take the checkpoint hook off the writer connection");
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Replaces SQLite's commit-time checkpoint on `conn` (installing a WAL hook does) by a request on `due`.
fn hand_checkpoints_to(conn: &mut Connection, due: mpsc::SyncSender<()>) -> rusqlite::Result<()> {
    conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
        if pages >= DUE_PAGES {
            let _ = due.try_send(());
        }
        Ok(())
    }))
}

fn run(path: &Path, requests: &mpsc::Receiver<()>, done: &AtomicU64) {
    crate::priority::lower_this_thread();
    let conn = match Connection::open(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "the checkpoint thread cannot open the database");
            return;
        }
    };
    while requests.recv().is_ok() {
        let _span = tracing::debug_span!("wal_checkpoint").entered();
        match log_and_copied(&conn) {
            Ok((log, copied)) => {
                tracing::debug!(log, copied, "checkpointed");
                if log == copied {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => tracing::warn!(error = %e, "checkpoint failed; the next one copies the log"),
        }
    }
}

/// Runs a PASSIVE checkpoint: (pages in the log, pages copied into the database).
fn log_and_copied(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(1)?, r.get(2)?)))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    use super::*;

    fn wal_db(dir: &Path) -> (PathBuf, Connection) {
        let path = dir.join("t.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        (path, conn)
    }

    /// Three commits of 500 pages each.
    fn write_1500_pages(conn: &mut Connection) {
        for _ in 0..3 {
            let tx = conn.transaction().unwrap();
            for _ in 0..500 {
                tx.execute("INSERT INTO t VALUES (zeroblob(4000))", []).unwrap();
            }
            tx.commit().unwrap();
        }
    }

    #[test]
    fn commits_past_the_mark_ask_for_a_checkpoint_instead_of_running_one() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut conn) = wal_db(dir.path());
        let (due, requests) = mpsc::sync_channel(1);
        hand_checkpoints_to(&mut conn, due).unwrap();
        write_1500_pages(&mut conn);
        assert!(requests.try_recv().is_ok(), "a commit past 1,000 pages asked for a checkpoint");
        // Had a commit checkpointed (SQLite's own way, at the second commit), the third would have started the log
        // again from its beginning: about 500 pages, not 1,500.
        let (log, copied) = log_and_copied(&Connection::open(&path).unwrap()).unwrap();
        assert!(log >= 1_500, "every commit is still in the log: {log} pages");
        assert_eq!(copied, log, "and a checkpoint copies it");
    }

    #[test]
    fn the_thread_copies_the_whole_log() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut conn) = wal_db(dir.path());
        let mut checkpointer = Checkpointer::start(&mut conn, &path).unwrap();
        write_1500_pages(&mut conn);
        let until = Instant::now() + Duration::from_secs(30);
        while checkpointer.done.load(Ordering::Relaxed) == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(checkpointer.done.load(Ordering::Relaxed) >= 1, "the thread copied the whole log");
        checkpointer.stop(&mut conn);
        assert!(checkpointer.thread.is_none(), "the thread ended");
        drop(conn);
        assert!(!path.with_extension("db-wal").exists(), "the last connection closed took the log away");
        let reader = Connection::open(&path).unwrap();
        assert_eq!(reader.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0)).unwrap(), 1_500);
    }
}
