//! The encoder service: one thread per loaded model owns its inference session, as text-embeddings-inference
//! does. Callers tokenise on their own threads and send token ids; the thread merges whatever queries are waiting
//! into batches bounded by padded tokens, and works through document requests (ingest, dense sync) one bounded
//! piece at a time, serving waiting queries between pieces. A search therefore waits for at most one document
//! piece, never for a whole ingest batch, and concurrent searches share one inference call instead of queueing
//! on a session lock. Under a steady stream of queries, pieces still get every other turn, so ingest goes on.
//!
//! On the CPU that one piece still cost every search behind it a piece's time (an ingest beside 8 searching
//! clients: search p99 1.97x the quiet p99, 2 cores), and the pieces took half the encoder's turns. There
//! ([`EncoderService::start_split`]) document requests go to a thread of their own at background priority with a
//! session of its own, built when document work arrives and dropped after [`DOCUMENT_IDLE`] without any: the
//! operating system, not the queue, then gives the cores to queries first, and a query never waits for a piece.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};

/// Runs one padded batch of token id sequences through a model: one vector per sequence, in order.
pub(crate) trait BatchRunner: Send + 'static {
    fn run(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>>;
}

/// Which queue a request waits in: queries are always served before the next document piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Query,
    Document,
}

/// Padded-token budgets of one inference call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budgets {
    /// Queries merged from concurrent requests.
    pub query_tokens: usize,
    /// One piece of a document request; also how long a query can wait behind document work.
    pub document_tokens: usize,
}

/// What the service has done since its model was loaded (for tests, benchmarks and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderStats {
    pub query_requests: u64,
    pub document_requests: u64,
    /// Sequences encoded (a request may carry several texts).
    pub sequences: u64,
    pub query_batches: u64,
    pub document_batches: u64,
    /// Most sequences run in one inference call.
    pub largest_batch: u64,
}

#[derive(Default)]
struct Counters {
    query_requests: AtomicU64,
    document_requests: AtomicU64,
    sequences: AtomicU64,
    query_batches: AtomicU64,
    document_batches: AtomicU64,
    largest_batch: AtomicU64,
}

impl Counters {
    fn batch(&self, lane: Lane, rows: usize) {
        let n = match lane {
            Lane::Query => &self.query_batches,
            Lane::Document => &self.document_batches,
        };
        n.fetch_add(1, Ordering::Relaxed);
        self.sequences.fetch_add(rows as u64, Ordering::Relaxed);
        self.largest_batch.fetch_max(rows as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> EncoderStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EncoderStats {
            query_requests: get(&self.query_requests),
            document_requests: get(&self.document_requests),
            sequences: get(&self.sequences),
            query_batches: get(&self.query_batches),
            document_batches: get(&self.document_batches),
            largest_batch: get(&self.largest_batch),
        }
    }
}

type Reply = Sender<Result<Vec<Vec<f32>>>>;

struct Request {
    lane: Lane,
    seqs: Vec<Vec<u32>>,
    reply: Reply,
}

/// Handle to a model's service thread. Dropping it closes the queue; the thread finishes what is queued and
/// exits, and the drop waits for that so the session is released before the model's files may be removed.
pub(crate) struct EncoderService {
    tx: Option<Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    /// The document thread's queue and the thread, when documents have one of their own.
    documents: Option<(Sender<Request>, JoinHandle<()>)>,
    counters: Arc<Counters>,
}

/// How long the document thread keeps its session after its last document request.
pub(crate) const DOCUMENT_IDLE: Duration = Duration::from_secs(60);

impl EncoderService {
    pub fn start(name: &str, runner: impl BatchRunner, budgets: Budgets) -> Result<Self> {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let worker =
            Worker { rx, runner, budgets, counters: counters.clone(), queries: Vec::new(), docs: VecDeque::new() };
        let thread = std::thread::Builder::new()
            .name(format!("encoder {name}"))
            .spawn(move || worker.run())
            .map_err(|e| Error::Internal(format!("starting the encoder thread: {e}")))?;
        Ok(EncoderService { tx: Some(tx), thread: Some(thread), documents: None, counters })
    }

    /// Like [`EncoderService::start`], with document requests served by a thread of their own at background
    /// priority, on a runner `documents` builds there (so that its own threads inherit that priority) when
    /// document work arrives, and drops after [`DOCUMENT_IDLE`] without any.
    pub fn start_split<R: BatchRunner>(
        name: &str,
        runner: R,
        budgets: Budgets,
        nice: i32,
        documents: impl FnMut() -> Result<R> + Send + 'static,
    ) -> Result<Self> {
        let mut service = Self::start(name, runner, budgets)?;
        let (tx, rx) = mpsc::channel();
        let counters = service.counters.clone();
        let thread = std::thread::Builder::new()
            .name(format!("encoder {name} documents"))
            .spawn(move || document_lane(&rx, documents, budgets, nice, &counters))
            .map_err(|e| Error::Internal(format!("starting the document encoder thread: {e}")))?;
        service.documents = Some((tx, thread));
        Ok(service)
    }

    /// Encodes token id sequences on the service thread and waits for the vectors.
    pub fn encode(&self, seqs: Vec<Vec<u32>>, lane: Lane) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let count = match lane {
            Lane::Query => &self.counters.query_requests,
            Lane::Document => &self.counters.document_requests,
        };
        count.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = mpsc::channel();
        let stopped = || Error::Model("the encoder thread has stopped (see the log for its error)".into());
        let tx = match (&self.documents, lane) {
            (Some((documents, _)), Lane::Document) => Some(documents),
            _ => self.tx.as_ref(),
        };
        tx.ok_or_else(stopped)?.send(Request { lane, seqs, reply }).map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    pub fn stats(&self) -> EncoderStats {
        self.counters.snapshot()
    }
}

impl Drop for EncoderService {
    fn drop(&mut self) {
        drop(self.tx.take());
        let documents = self.documents.take().map(|(tx, thread)| {
            drop(tx);
            thread
        });
        for t in self.thread.take().into_iter().chain(documents) {
            if t.join().is_err() {
                tracing::error!("an encoder thread panicked");
            }
        }
    }
}

/// The document thread of [`EncoderService::start_split`]: each request whole, in bounded pieces, in the order
/// they came.
fn document_lane<R: BatchRunner>(
    rx: &Receiver<Request>,
    mut build: impl FnMut() -> Result<R>,
    budgets: Budgets,
    nice: i32,
    counters: &Counters,
) {
    crate::priority::lower_this_thread_to(nice);
    let mut runner: Option<R> = None;
    loop {
        let next = match runner {
            Some(_) => rx.recv_timeout(DOCUMENT_IDLE),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let request = match next {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                runner = None;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let built = match runner.take() {
            Some(r) => Ok(r),
            None => build(),
        };
        let reply = built.and_then(|mut r| {
            let vecs = encode_in_pieces(&mut r, &request.seqs, budgets.document_tokens, counters);
            runner = Some(r);
            vecs
        });
        // A caller that gave up no longer listens.
        let _ = request.reply.send(reply);
    }
}

/// `seqs` run in length-sorted pieces of at most `budget` padded tokens; the vectors in the order of `seqs`.
fn encode_in_pieces<R: BatchRunner>(
    runner: &mut R,
    seqs: &[Vec<u32>],
    budget: usize,
    counters: &Counters,
) -> Result<Vec<Vec<f32>>> {
    let order = by_length(seqs);
    let mut out = vec![Vec::new(); seqs.len()];
    for range in cut(seqs, &order, 0, budget, usize::MAX) {
        let batch: Vec<&[u32]> = order[range.clone()].iter().map(|&i| seqs[i].as_slice()).collect();
        let vecs = run_guarded(runner, &batch)?;
        counters.batch(Lane::Document, batch.len());
        for (&i, v) in order[range].iter().zip(vecs) {
            out[i] = v;
        }
    }
    Ok(out)
}

/// A document request part-way through: its sequences in length order, the next one to run, results so far.
struct DocJob {
    seqs: Vec<Vec<u32>>,
    order: Vec<usize>,
    next: usize,
    out: Vec<Vec<f32>>,
    reply: Reply,
}

struct Worker<R> {
    rx: Receiver<Request>,
    runner: R,
    budgets: Budgets,
    counters: Arc<Counters>,
    queries: Vec<Request>,
    docs: VecDeque<DocJob>,
}

impl<R: BatchRunner> Worker<R> {
    /// With both kinds waiting, query rounds and document pieces alternate: a query waits for at most the piece
    /// in progress, and a steady stream of searches cannot starve an ingest.
    fn run(mut self) {
        let mut documents_turn = false;
        while self.receive() {
            if self.queries.is_empty() || (documents_turn && !self.docs.is_empty()) {
                self.document_piece();
                documents_turn = false;
            } else {
                self.serve_queries();
                documents_turn = true;
            }
        }
    }

    /// Takes every request already sent, first waiting for one when there is nothing to do. `false` once the
    /// handle is gone and nothing is left.
    fn receive(&mut self) -> bool {
        if self.queries.is_empty() && self.docs.is_empty() {
            match self.rx.recv() {
                Ok(r) => self.queue(r),
                Err(_) => return false,
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(r) => self.queue(r),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return true,
            }
        }
    }

    fn queue(&mut self, r: Request) {
        match r.lane {
            Lane::Query => self.queries.push(r),
            Lane::Document => {
                let order = by_length(&r.seqs);
                let out = vec![Vec::new(); r.seqs.len()];
                self.docs.push_back(DocJob { seqs: r.seqs, order, next: 0, out, reply: r.reply });
            }
        }
    }

    /// Every waiting query, merged across requests into length-sorted batches.
    fn serve_queries(&mut self) {
        let requests = std::mem::take(&mut self.queries);
        let refs: Vec<(usize, usize, &[u32])> = requests
            .iter()
            .enumerate()
            .flat_map(|(r, q)| q.seqs.iter().enumerate().map(move |(s, ids)| (r, s, ids.as_slice())))
            .collect();
        let seqs: Vec<&[u32]> = refs.iter().map(|p| p.2).collect();
        let order = by_length(&seqs);
        let mut out: Vec<Vec<Vec<f32>>> = requests.iter().map(|q| vec![Vec::new(); q.seqs.len()]).collect();
        let mut failed = None;
        for range in cut(&seqs, &order, 0, self.budgets.query_tokens, usize::MAX) {
            let batch: Vec<&[u32]> = order[range.clone()].iter().map(|&i| seqs[i]).collect();
            match self.run_batch(Lane::Query, &batch) {
                Ok(vecs) => {
                    for (&i, v) in order[range].iter().zip(vecs) {
                        out[refs[i].0][refs[i].1] = v;
                    }
                }
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        for (q, vecs) in requests.into_iter().zip(out) {
            // A caller that gave up (its thread ended) no longer listens; nothing to do about it.
            let _ = q.reply.send(match &failed {
                None => Ok(vecs),
                Some(m) => Err(Error::Model(m.clone())),
            });
        }
    }

    /// The next bounded piece of the oldest document request; replies once the request is complete.
    fn document_piece(&mut self) {
        let Some(job) = self.docs.front_mut() else { return };
        let Some(range) = cut(&job.seqs, &job.order, job.next, self.budgets.document_tokens, 1).pop() else {
            return;
        };
        let batch: Vec<&[u32]> = job.order[range.clone()].iter().map(|&i| job.seqs[i].as_slice()).collect();
        let result = run_guarded(&mut self.runner, &batch);
        self.counters.batch(Lane::Document, batch.len());
        let finished = match result {
            Ok(vecs) => {
                for (&i, v) in job.order[range.clone()].iter().zip(vecs) {
                    job.out[i] = v;
                }
                job.next = range.end;
                (job.next == job.order.len()).then_some(Ok(()))
            }
            Err(e) => Some(Err(e)),
        };
        if let Some(outcome) = finished
            && let Some(done) = self.docs.pop_front()
        {
            let _ = done.reply.send(outcome.map(|()| done.out));
        }
    }

    fn run_batch(&mut self, lane: Lane, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let vecs = run_guarded(&mut self.runner, batch)?;
        self.counters.batch(lane, batch.len());
        Ok(vecs)
    }
}

/// A panic inside the model becomes an error for the requests of that batch; the thread, and so the encoder,
/// lives on for the next ones.
fn run_guarded<R: BatchRunner>(runner: &mut R, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runner.run(batch)))
        .unwrap_or_else(|_| Err(Error::Model("the encoder panicked on a batch (see the log)".into())))
}

/// Indexes of `seqs`, shortest first, so each batch pads little.
fn by_length<S: AsRef<[u32]>>(seqs: &[S]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| seqs[i].as_ref().len());
    order
}

/// Up to `max_batches` consecutive ranges of `order` from `start`, each as long as its padded size (rows times
/// the longest, which is the last in length order) fits `budget`; a sequence longer than the budget runs alone.
fn cut<S: AsRef<[u32]>>(
    seqs: &[S],
    order: &[usize],
    start: usize,
    budget: usize,
    max_batches: usize,
) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut begin = start;
    while begin < order.len() && ranges.len() < max_batches {
        let mut end = begin + 1;
        while end < order.len() && seqs[order[end]].as_ref().len() * (end + 1 - begin) <= budget {
            end += 1;
        }
        ranges.push(begin..end);
        begin = end;
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// (rows, longest) of every batch run.
    type Batches = Arc<Mutex<Vec<(usize, usize)>>>;

    /// A model whose vector of a sequence is [sum of ids, length]; records each batch's sizes and can stall.
    struct Fake {
        batches: Batches,
        delay: Duration,
    }

    impl BatchRunner for Fake {
        fn run(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
            let longest = batch.iter().map(|b| b.len()).max().unwrap_or(0);
            self.batches.lock().unwrap().push((batch.len(), longest));
            std::thread::sleep(self.delay);
            Ok(batch.iter().map(|b| vec![b.iter().sum::<u32>() as f32, b.len() as f32]).collect())
        }
    }

    fn service(delay_ms: u64, query_tokens: usize, document_tokens: usize) -> (EncoderService, Batches) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake { batches: batches.clone(), delay: Duration::from_millis(delay_ms) };
        (EncoderService::start("fake", fake, Budgets { query_tokens, document_tokens }).unwrap(), batches)
    }

    fn expected(seqs: &[Vec<u32>]) -> Vec<Vec<f32>> {
        seqs.iter().map(|s| vec![s.iter().sum::<u32>() as f32, s.len() as f32]).collect()
    }

    #[test]
    fn batches_respect_the_padded_token_budget_and_keep_order() {
        let (svc, batches) = service(0, 64, 64);
        let seqs: Vec<Vec<u32>> = (1..=40).map(|n| (0..(n % 13 + 1)).collect()).collect();
        assert_eq!(svc.encode(seqs.clone(), Lane::Document).unwrap(), expected(&seqs));
        assert_eq!(svc.encode(seqs.clone(), Lane::Query).unwrap(), expected(&seqs));
        for &(rows, longest) in batches.lock().unwrap().iter() {
            assert!(rows == 1 || rows * longest <= 64, "{rows} rows of {longest}");
        }
        let long = vec![(0..100).collect::<Vec<u32>>()];
        assert_eq!(svc.encode(long.clone(), Lane::Query).unwrap(), expected(&long), "longer than the budget: alone");
        assert_eq!(svc.encode(Vec::new(), Lane::Query).unwrap(), Vec::<Vec<f32>>::new());
    }

    #[test]
    fn concurrent_queries_are_merged_and_served_between_document_pieces() {
        let (svc, batches) = service(20, 4096, 8);
        let svc = Arc::new(svc);
        // 30 pieces of 20 ms: the document request is in progress when the queries arrive.
        let docs: Vec<Vec<u32>> = (0..30).map(|i| vec![i; 8]).collect();
        let d = {
            let (svc, docs) = (svc.clone(), docs.clone());
            std::thread::spawn(move || {
                let v = svc.encode(docs, Lane::Document).unwrap();
                (v, std::time::Instant::now())
            })
        };
        while svc.stats().document_batches == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let queries: Vec<_> = (0..8u32)
            .map(|i| {
                let svc = svc.clone();
                std::thread::spawn(move || {
                    (svc.encode(vec![vec![i, 1]], Lane::Query).unwrap(), std::time::Instant::now())
                })
            })
            .collect();
        let mut last_query = None;
        for (i, q) in queries.into_iter().enumerate() {
            let (v, at) = q.join().unwrap();
            assert_eq!(v, expected(&[vec![i as u32, 1]]));
            last_query = last_query.max(Some(at));
        }
        let (v, doc_done) = d.join().unwrap();
        assert_eq!(v, expected(&docs));
        assert!(last_query.unwrap() < doc_done, "queries wait for one piece, not the whole request");
        let s = svc.stats();
        assert_eq!((s.query_requests, s.document_requests, s.document_batches), (8, 1, 30));
        assert!(s.query_batches < 8, "{s:?}");
        assert!(s.largest_batch > 1, "{s:?}");
        assert_eq!(batches.lock().unwrap().len() as u64, s.query_batches + s.document_batches);
    }

    #[test]
    fn documents_progress_under_a_steady_stream_of_queries() {
        let (svc, _) = service(5, 4096, 8);
        let svc = Arc::new(svc);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..4u32)
            .map(|i| {
                let (svc, stop) = (svc.clone(), stop.clone());
                std::thread::spawn(move || {
                    let until = std::time::Instant::now() + Duration::from_secs(10);
                    while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                        svc.encode(vec![vec![i]], Lane::Query).unwrap();
                    }
                })
            })
            .collect();
        while svc.stats().query_batches < 5 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let docs: Vec<Vec<u32>> = (0..20).map(|i| vec![i; 8]).collect();
        let started = std::time::Instant::now();
        assert_eq!(svc.encode(docs.clone(), Lane::Document).unwrap(), expected(&docs));
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        clients.into_iter().for_each(|c| c.join().unwrap());
        // 20 pieces alternating with query rounds of 5 ms each: about 200 ms, far from the clients' 10 s.
        assert!(took < Duration::from_secs(5), "the document request starved: {took:?}");
    }

    /// A runner that records its thread's nice value and, for documents, waits at `gate` before each batch.
    struct Gated {
        nice: Arc<Mutex<Vec<i32>>>,
        gate: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
    }

    impl BatchRunner for Gated {
        fn run(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
            self.nice.lock().unwrap().push(rustix::process::getpriority_process(None).unwrap());
            if let Some(gate) = &self.gate {
                let open = gate.0.lock().unwrap();
                drop(gate.1.wait_while(open, |open| !*open).unwrap());
            }
            Ok(batch.iter().map(|b| vec![b.iter().sum::<u32>() as f32, b.len() as f32]).collect())
        }
    }

    #[test]
    fn split_documents_run_on_a_background_thread_and_queries_never_wait_for_them() {
        let (query_nice, doc_nice) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let builds = Arc::new(AtomicU64::new(0));
        let queries = Gated { nice: query_nice.clone(), gate: None };
        let documents = {
            let (nice, gate, builds) = (doc_nice.clone(), gate.clone(), builds.clone());
            move || {
                builds.fetch_add(1, Ordering::Relaxed);
                Ok(Gated { nice: nice.clone(), gate: Some(gate.clone()) })
            }
        };
        let budgets = Budgets { query_tokens: 64, document_tokens: 8 };
        let svc = Arc::new(
            EncoderService::start_split("split", queries, budgets, crate::priority::BACKGROUND_NICE, documents)
                .unwrap(),
        );
        let docs: Vec<Vec<u32>> = (0..5).map(|i| vec![i; 8]).collect();
        let d = {
            let (svc, docs) = (svc.clone(), docs.clone());
            std::thread::spawn(move || svc.encode(docs, Lane::Document).unwrap())
        };
        while doc_nice.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // The document request is stuck in its first piece; queries are answered meanwhile.
        for i in 0..3u32 {
            assert_eq!(svc.encode(vec![vec![i, 1]], Lane::Query).unwrap(), expected(&[vec![i, 1]]));
        }
        assert!(!d.is_finished(), "the document request is still in its first piece");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert_eq!(d.join().unwrap(), expected(&docs));
        assert_eq!(svc.encode(docs.clone(), Lane::Document).unwrap(), expected(&docs), "the runner is kept");
        assert_eq!(builds.load(Ordering::Relaxed), 1);
        let caller = rustix::process::getpriority_process(None).unwrap();
        assert!(query_nice.lock().unwrap().iter().all(|&n| n == caller), "queries run at the caller's priority");
        let lowered = caller.max(crate::priority::BACKGROUND_NICE);
        assert!(doc_nice.lock().unwrap().iter().all(|&n| n == lowered), "documents at background priority");
        let s = svc.stats();
        assert_eq!((s.query_requests, s.document_requests, s.query_batches, s.document_batches), (3, 2, 3, 10));
        drop(Arc::into_inner(svc).unwrap()); // joins both threads; a hang fails the test by timeout
    }

    struct Panicky;

    impl BatchRunner for Panicky {
        fn run(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
            assert!(batch[0][0] != 0, "a batch the model cannot take");
            Ok(batch.iter().map(|b| vec![b.len() as f32]).collect())
        }
    }

    #[test]
    fn a_panicking_batch_fails_its_requests_only() {
        let svc = EncoderService::start("panicky", Panicky, Budgets { query_tokens: 64, document_tokens: 64 }).unwrap();
        assert!(svc.encode(vec![vec![0, 1]], Lane::Document).is_err());
        assert!(svc.encode(vec![vec![0, 1]], Lane::Query).is_err());
        assert_eq!(svc.encode(vec![vec![1, 2, 3]], Lane::Query).unwrap(), vec![vec![3.0]]);
    }

    #[test]
    fn dropping_the_handle_stops_the_thread() {
        let (svc, _) = service(0, 64, 64);
        assert_eq!(svc.encode(vec![vec![1, 2]], Lane::Query).unwrap(), vec![vec![3.0, 2.0]]);
        drop(svc); // joins the thread; a hang here fails the test by timeout
    }
}
