//! Measurement (samples, percentiles, the open-loop schedule) and the load generators.

use super::*;

// Measurement: samples, percentiles, open-loop schedule

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    Ok,
    /// A non-2xx answer.
    Status(u16),
    /// No answer: timeout, connection refused or reset, TLS failure.
    Transport(&'static str),
}

impl Outcome {
    pub(super) fn kind(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Status(s) => format!("http {s}"),
            Outcome::Transport(t) => (*t).into(),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Sample {
    /// Seconds from the phase start at which the request was due: when it was sent (closed loop) or scheduled
    /// (open loop).
    pub(super) issued: f64,
    /// Seconds from the phase start at which the answer (or failure) arrived.
    pub(super) ended: f64,
    pub(super) outcome: Outcome,
}

impl Sample {
    pub(super) fn latency_ms(&self) -> f64 {
        (self.ended - self.issued) * 1e3
    }
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentile of sorted values: the smallest value with at least `p` of all values at or below it.
pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(super) fn latency(mut xs: Vec<f64>) -> Latency {
    if xs.is_empty() {
        return Latency::default();
    }
    xs.sort_by(f64::total_cmp);
    Latency {
        p50_ms: percentile(&xs, 0.50),
        p90_ms: percentile(&xs, 0.90),
        p99_ms: percentile(&xs, 0.99),
        max_ms: xs[xs.len() - 1],
        mean_ms: xs.iter().sum::<f64>() / xs.len() as f64,
    }
}

/// What one phase measured in its window `[from, to)` (seconds from the phase start).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Window {
    /// Requests due in the window (each is waited for, up to the timeout, even past the window's end).
    pub requests: usize,
    pub ok: usize,
    /// Requests due in the window that failed: non-2xx answers, timeouts, connection errors.
    pub errors: usize,
    pub error_kinds: BTreeMap<String, usize>,
    /// Successful answers that arrived in the window, per second.
    pub throughput_rps: f64,
    /// Of the successful requests due in the window.
    pub latency: Latency,
}

pub(super) fn summarize(samples: &[Sample], from: f64, to: f64) -> Window {
    let mut w = Window::default();
    let mut lat = Vec::new();
    let mut done_in_window = 0usize;
    for s in samples {
        if s.outcome == Outcome::Ok && s.ended >= from && s.ended < to {
            done_in_window += 1;
        }
        if s.issued < from || s.issued >= to {
            continue;
        }
        w.requests += 1;
        if s.outcome == Outcome::Ok {
            w.ok += 1;
            lat.push(s.latency_ms());
        } else {
            w.errors += 1;
            *w.error_kinds.entry(s.outcome.kind()).or_default() += 1;
        }
    }
    w.throughput_rps = done_in_window as f64 / (to - from).max(1e-9);
    w.latency = latency(lat);
    w
}

/// Send times (seconds from the phase start) of an open loop at `rate` per second, up to `end`.
pub(super) fn schedule(rate: f64, end: f64) -> impl Iterator<Item = f64> {
    (0u64..).map(move |k| k as f64 / rate).take_while(move |&t| t < end)
}

// Load generators

/// One server as the client sees it.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) client: reqwest::Client,
    pub(super) base: String,
    pub(super) token: String,
    pub(super) method: Option<String>,
    pub(super) timeout: Duration,
}

impl Target {
    pub(super) async fn search(&self, q: &str) -> Outcome {
        let mut params = vec![("q", q)];
        if let Some(m) = &self.method {
            params.push(("method", m.as_str()));
        }
        let req = self
            .client
            .get(format!("{}/api/v1/search", self.base))
            .query(&params)
            .bearer_auth(&self.token)
            .timeout(self.timeout);
        match req.send().await {
            Ok(r) => {
                let status = r.status();
                match r.bytes().await {
                    Ok(_) if status.is_success() => Outcome::Ok,
                    Ok(_) => Outcome::Status(status.as_u16()),
                    Err(e) => Outcome::Transport(transport_kind(&e)),
                }
            }
            Err(e) => Outcome::Transport(transport_kind(&e)),
        }
    }
}

/// Readies a freshly started server: the first search loads the query encoder and the indexes (slow, so it is
/// reported), then `burst` concurrent searches, twice, so that every worker thread has served one. Returns the
/// seconds of both steps.
pub(super) async fn warm_up(t: &Target, queries: &[String], burst: usize) -> Result<(f64, f64)> {
    let long = Target { timeout: Duration::from_secs(600), ..t.clone() };
    let t0 = Instant::now();
    let first = long.search(&queries[0]).await;
    if first != Outcome::Ok {
        bail!("the first search failed: {}", first.kind());
    }
    let first_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for round in 0..2 {
        let mut tasks = Vec::new();
        for i in 0..burst {
            let (long, q) = (long.clone(), queries[(1 + round * burst + i) % queries.len()].clone());
            tasks.push(tokio::spawn(async move { long.search(&q).await }));
        }
        for task in tasks {
            if let Ok(o) = task.await
                && o != Outcome::Ok
            {
                bail!("a warm-up search failed: {}", o.kind());
            }
        }
    }
    Ok((first_s, t1.elapsed().as_secs_f64()))
}

pub(super) fn transport_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect error"
    } else if e.is_body() || e.is_decode() {
        "body error"
    } else {
        "transport error"
    }
}

/// `c` clients, each sending its next query (taken in turn from `queries`, starting at `offset`) as soon as the
/// previous one answered, until `end` seconds after `start`.
pub(super) async fn closed_loop(
    t: &Target,
    queries: &Arc<Vec<String>>,
    offset: usize,
    c: usize,
    start: Instant,
    end: f64,
) -> Vec<Sample> {
    let next = Arc::new(AtomicUsize::new(offset));
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (t, queries, next) = (t.clone(), queries.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let issued = start.elapsed().as_secs_f64();
                if issued >= end {
                    break;
                }
                let q = &queries[next.fetch_add(1, Ordering::Relaxed) % queries.len()];
                let outcome = t.search(q).await;
                out.push(Sample { issued, ended: start.elapsed().as_secs_f64(), outcome });
            }
            out
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    all
}

#[derive(Debug, Default)]
pub(super) struct OpenLoopCounts {
    /// Sends skipped because `max_inflight` requests were outstanding (due in the window).
    pub(super) dropped: usize,
    /// Sends the client itself made more than 10 ms after their schedule (due in the window): a sign the client was
    /// short of CPU. Their latency still counts from the schedule.
    pub(super) late: usize,
}

/// Sends at `rate` per second on a fixed schedule until `end`; latency counts from each scheduled time.
pub(super) async fn open_loop(
    t: &Target,
    queries: &Arc<Vec<String>>,
    offset: usize,
    rate: f64,
    start: Instant,
    window: (f64, f64),
    max_inflight: usize,
) -> (Vec<Sample>, OpenLoopCounts) {
    let inflight = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut counts = OpenLoopCounts::default();
    let start_t = tokio::time::Instant::from_std(start);
    for (k, due) in schedule(rate, window.1).enumerate() {
        tokio::time::sleep_until(start_t + Duration::from_secs_f64(due)).await;
        let in_window = due >= window.0;
        if in_window && start.elapsed().as_secs_f64() - due > 0.010 {
            counts.late += 1;
        }
        if inflight.load(Ordering::SeqCst) >= max_inflight {
            if in_window {
                counts.dropped += 1;
            }
            continue;
        }
        inflight.fetch_add(1, Ordering::SeqCst);
        let (t, queries, inflight, tx) = (t.clone(), queries.clone(), inflight.clone(), tx.clone());
        tokio::spawn(async move {
            let outcome = t.search(&queries[(offset + k) % queries.len()]).await;
            inflight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(Sample { issued: due, ended: start.elapsed().as_secs_f64(), outcome });
        });
    }
    drop(tx);
    let mut samples = Vec::new();
    while let Some(s) = rx.recv().await {
        samples.push(s);
    }
    (samples, counts)
}
