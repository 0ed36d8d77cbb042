//! The scheduler: the threads that run every background task, woken only when something changes.
//!
//! Lanes: `workers` ingest threads (parsing is the slow part, so files of ingest jobs run in parallel), one model
//! thread (evaluate, promote, train, embed: one at a time, they compete for the same cores and tables), one backup
//! thread (a backup must not wait for a night's training), and one
//! timer thread for due-time entries (training schedules, the daily backup, housekeeping chores). No lane polls: each sleeps on
//! the engine's [`Hub`](super::Hub) until a submit, a cancel, a task's end, a stop or its next due time.
//!
//! Only the process holding `<data_dir>/jobs.lock` runs stored tasks (a `care ingest` beside a running `care serve`
//! queues its job for the server). A lock thread waits for that lock in a blocking call, then listens on
//! `<data_dir>/jobs.sock`, where other processes' submits and cancels arrive as datagrams. Housekeeping does not
//! need the lock: it ran in every server before, and still does in every process started with [`Housekeeping`].

use std::collections::{HashMap, HashSet};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{CancelToken, Chore, Housekeeping, socket_path};
use crate::engine::Engine;

/// What a scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Ingest threads (at least one).
    pub workers: usize,
    /// Housekeeping chores; `None` in short-lived CLI processes.
    pub housekeeping: Option<Housekeeping>,
}

/// Stack of the ingest threads. The parsers are iterative, so this is defence in depth: a stack overflow aborts
/// the whole process (not catchable like a panic), and a parser regression on a deep document should not take
/// `care serve` down.
const WORKER_STACK: usize = 16 << 20;

/// How long a lane waits before retrying after a store error (woken earlier by any change).
pub(crate) const RETRY: Duration = Duration::from_secs(2);

/// Re-reads the queue this often only when the socket could not be bound (a data directory path longer than a
/// socket path may be): then other processes' submits have no other way to arrive.
const NO_SOCKET_RECHECK: Duration = Duration::from_secs(30);

/// State the lanes share.
pub(crate) struct Shared {
    pub(crate) engine: Arc<Engine>,
    pub(crate) stop: Arc<AtomicBool>,
    /// (job, ordinal) of ingest files being read in this process.
    pub(crate) claimed: Mutex<HashSet<(i64, i64)>>,
    /// The jobs lock, once this process holds it.
    pub(crate) lock: Mutex<Option<std::fs::File>>,
    /// Failed attempts per (job, ordinal) in this process, for errors of the stores or the model (not of the file).
    pub(crate) attempts: Mutex<HashMap<(i64, i64), u32>>,
    socket_bound: AtomicBool,
    /// A second handle of the lock thread's socket: shutting it down ends that thread's wait even when the socket's
    /// file is gone (a data directory moved or removed under a running server), where a wake-up datagram cannot
    /// arrive.
    listener: Mutex<Option<UnixDatagram>>,
}

impl Shared {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Shared {
            engine,
            stop: Arc::new(AtomicBool::new(false)),
            claimed: Mutex::new(HashSet::new()),
            lock: Mutex::new(None),
            attempts: Mutex::new(HashMap::new()),
            socket_bound: AtomicBool::new(false),
            listener: Mutex::new(None),
        }
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(crate) fn holds_lock(&self) -> bool {
        self.lock.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The cancel token of job `job`, shared by every thread working on it in this process.
    pub(crate) fn token(&self, job: i64) -> CancelToken {
        self.engine.tasks.token_for(job, &self.stop)
    }

    /// Sleeps until something changes (or `deadline`), unless the generation moved since `seen`.
    fn wait(&self, seen: u64, deadline: Option<Instant>) {
        self.engine.tasks.wait(seen, deadline);
    }
}

/// Starts and owns the background threads; see the module documentation.
#[derive(Debug)]
pub struct Scheduler;

/// The running scheduler; dropping it stops it like [`SchedulerHandle::shutdown`].
pub struct SchedulerHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    lock_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SchedulerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerHandle").field("threads", &self.threads.len()).finish()
    }
}

impl Scheduler {
    pub fn start(engine: Arc<Engine>, opts: SchedulerOptions) -> SchedulerHandle {
        let nice = engine.config().background.nice;
        let shared = Arc::new(Shared::new(engine));
        let mut threads = Vec::new();
        // The lanes that do the work run at background priority (`[background] nice`), and so do the processes they start (a parsing
        // child, the trainer): searches beside an ingest or a backup keep the cores.
        for i in 0..opts.workers.max(1) {
            let s = shared.clone();
            threads.push(spawn(&format!("care-ingest-{i}"), move || lowered(nice, || ingest_lane(&s))));
        }
        let s = shared.clone();
        threads.push(spawn("care-model-jobs", move || lowered(nice, || model_lane(&s))));
        let s = shared.clone();
        threads.push(spawn("care-backups", move || lowered(nice, || backup_lane(&s))));
        let s = shared.clone();
        threads.push(spawn("care-timer", move || timer_lane(&s, opts.housekeeping)));
        let (weak, lock_path) = (Arc::downgrade(&shared), shared.engine.queue().jobs_lock_path());
        let lock_thread = spawn("care-jobs-lock", move || lock_and_listen(weak, lock_path));
        SchedulerHandle { shared, threads, lock_thread: Some(lock_thread) }
    }
}

/// Lowers the lane's own thread (which the threads and processes it starts inherit) before it runs.
fn lowered(nice: i32, lane: impl FnOnce()) {
    crate::priority::lower_this_thread_to(nice);
    lane();
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(WORKER_STACK)
        .spawn(f)
        .unwrap_or_else(|e| panic!("spawning the {name} thread: {e}"))
}

impl SchedulerHandle {
    /// True once this process holds the jobs lock (tasks submitted anywhere are run here).
    pub fn runs_jobs(&self) -> bool {
        self.shared.holds_lock()
    }

    /// Stops the threads after their current batch; interrupted tasks stay queued and resume at the next start.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let s = &self.shared;
        s.stop.store(true, Ordering::SeqCst);
        s.engine.tasks.wake_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The lock thread checks `stop` while holding this mutex before it stores the lock: once the mutex shows
        // no lock, that thread will never take it, and it is left blocked in its wait (it holds no engine).
        let held = s.holds_lock();
        if let Some(t) = self.lock_thread.take()
            && (held || t.is_finished())
        {
            wake_listener(&s.engine);
            if let Some(l) = s.listener.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = l.shutdown(std::net::Shutdown::Both);
            }
            let _ = t.join();
        }
        let mut lock = s.lock.lock().unwrap_or_else(|p| p.into_inner());
        if lock.is_some() {
            if let Err(e) = s.engine.queue().requeue_running() {
                tracing::warn!(error = %e, "could not re-queue running jobs at shutdown");
            }
            let _ = std::fs::remove_file(socket_path(s.engine.dir.root()));
        }
        *lock = None;
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_and_join();
        }
    }
}

fn wake_listener(e: &Engine) {
    if let Ok(s) = UnixDatagram::unbound() {
        let _ = s.send_to(b"s", socket_path(e.dir.root()));
    }
}

/// A worker thread: one step of work while this process holds the jobs lock, else sleep until woken (or until
/// the retry delay after an error).
fn lane(s: &Shared, step: impl Fn(&Shared) -> Lane) {
    loop {
        let seen = s.engine.tasks.generation();
        if s.stopped() {
            return;
        }
        if !s.holds_lock() {
            s.wait(seen, None);
            continue;
        }
        match step(s) {
            Lane::Worked => {}
            Lane::Idle => s.wait(seen, None),
            Lane::Retry => s.wait(seen, Some(Instant::now() + RETRY)),
        }
    }
}

fn ingest_lane(s: &Shared) {
    lane(s, super::ingest_lane::ingest_step);
}

fn model_lane(s: &Shared) {
    task_lane(s, super::model_lane::MODEL_KINDS, "model");
}

fn backup_lane(s: &Shared) {
    task_lane(s, super::model_lane::BACKUP_KINDS, "backup");
}

/// A lane that runs the stored tasks of `kinds` one at a time.
fn task_lane(s: &Shared, kinds: &[&str], name: &str) {
    lane(s, |s| match crate::tasks::model_lane::run_next_model_job(&s.engine, s, kinds) {
        Ok(true) => Lane::Worked,
        Ok(false) => Lane::Idle,
        Err(e) => {
            tracing::error!(lane = name, error = %e, "task lane error; will retry");
            Lane::Retry
        }
    });
}

/// What one step of a lane did.
pub(crate) enum Lane {
    Worked,
    Idle,
    Retry,
}

/// Fires due schedules (in the lock holder) and runs due chores, then sleeps until the next due time or a change.
fn timer_lane(s: &Shared, housekeeping: Option<Housekeeping>) {
    let start = Instant::now();
    let mut due: HashMap<Chore, Instant> =
        housekeeping.as_ref().map(|_| Chore::ALL.iter().map(|c| (*c, start)).collect()).unwrap_or_default();
    loop {
        let seen = s.engine.tasks.generation();
        if s.stopped() {
            return;
        }
        if let Some(hk) = &housekeeping {
            for (chore, at) in due.iter_mut() {
                if *at <= Instant::now() && !s.stopped() {
                    crate::tasks::run_chore(&s.engine, *chore, hk);
                    *at = Instant::now() + chore.every();
                }
            }
        }
        let mut next = due.values().min().copied();
        if s.holds_lock() {
            let now = time::OffsetDateTime::now_utc();
            if let Err(e) = crate::training::schedule::fire_due_schedules(&s.engine, now) {
                tracing::error!(error = %e, "could not fire training schedules; will retry");
                next = earliest(next, Some(Instant::now() + RETRY));
            }
            next = earliest(next, crate::training::schedule::next_schedule_due(&s.engine, now).ok().flatten());
            let (store, cfg) = (&s.engine.store, &s.engine.cfg);
            match crate::backup::schedule::fire_due(store, cfg, now) {
                Ok(fired) => {
                    if fired.job.is_some() {
                        s.engine.queue().tasks_changed();
                    }
                    next = earliest(next, fired.wake_at(now));
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not fire the daily backup; will retry");
                    next = earliest(next, Some(Instant::now() + RETRY));
                }
            }
            if !s.socket_bound.load(Ordering::SeqCst) {
                next = earliest(next, Some(Instant::now() + NO_SOCKET_RECHECK));
            }
        }
        s.wait(seen, next);
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Waits (blocking, no retry loop) for the jobs lock, then listens for other processes' wake-ups. Holds only a
/// weak reference while it waits, so a scheduler stopped before it got the lock frees its engine.
fn lock_and_listen(weak: Weak<Shared>, lock_path: PathBuf) {
    let file = match std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path) {
        Ok(f) => f,
        Err(e) => return tracing::error!(path = %lock_path.display(), error = %e, "cannot open the jobs lock"),
    };
    if let Err(e) = file.lock() {
        return tracing::error!(path = %lock_path.display(), error = %e, "cannot take the jobs lock");
    }
    let Some(s) = weak.upgrade() else { return };
    if s.stopped() {
        return;
    }
    if let Err(e) = s.engine.queue().requeue_running() {
        tracing::error!(error = %e, "could not re-queue interrupted jobs");
    }
    let socket = bind(&s.engine);
    {
        let mut lock = s.lock.lock().unwrap_or_else(|p| p.into_inner());
        if s.stopped() {
            let _ = std::fs::remove_file(socket_path(s.engine.dir.root()));
            return;
        }
        *lock = Some(file);
    }
    s.socket_bound.store(socket.is_some(), Ordering::SeqCst);
    s.engine.queue().tasks_changed();
    let Some(socket) = socket else { return };
    *s.listener.lock().unwrap_or_else(|p| p.into_inner()) = socket.try_clone().ok();
    let mut buf = [0u8; 16];
    while socket.recv(&mut buf).is_ok() && !s.stopped() {
        crate::tasks::sync_cancels(&s.engine);
        s.engine.tasks.notify();
    }
}

/// Binds `<data_dir>/jobs.sock`. A file left there by a killed holder of the lock is stale: this thread holds the
/// lock now, so nobody else listens there.
fn bind(e: &Engine) -> Option<UnixDatagram> {
    let path = socket_path(e.dir.root());
    let _ = std::fs::remove_file(&path);
    match UnixDatagram::bind(&path) {
        Ok(s) => Some(s),
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err,
                "cannot listen for other processes' jobs; re-reading the queue every 30 s instead");
            None
        }
    }
}
