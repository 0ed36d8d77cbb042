//! Prometheus text exposition, hand-rolled (a few counters and histograms do not need a metrics framework):
//! request latency histograms per route, searches by method, jobs by state (read from SQLite at scrape time), and the
//! device the encoders really run on with the count of sessions that fell back from CUDA to the CPU.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use care_engine::encoders::ServedDevice;

/// Upper bounds in seconds; tuned for a search that takes milliseconds and an upload that takes seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    /// (method, route pattern, status class) → latency histogram.
    requests: Mutex<BTreeMap<(String, String, String), Histogram>>,
    /// (retrieval method actually used) → searches; plus the total of results returned.
    searches: Mutex<BTreeMap<String, u64>>,
    search_latency: Mutex<Histogram>,
}

impl Metrics {
    pub fn observe(&self, method: &str, pattern: &str, status: u16, seconds: f64) {
        let class = format!("{}xx", status / 100);
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        let h = m.entry((method.to_string(), pattern.to_string(), class)).or_default();
        add(h, seconds);
    }

    pub fn search(&self, method: &str, seconds: f64) {
        *self.searches.lock().unwrap_or_else(|p| p.into_inner()).entry(method.to_string()).or_default() += 1;
        add(&mut self.search_latency.lock().unwrap_or_else(|p| p.into_inner()), seconds);
    }

    /// The exposition; `jobs` are (state, count) read by the caller, `device` the engine's latest device decision
    /// and its count of CPU fallbacks ([`care_engine::encoders::served_device`]).
    pub fn render(&self, jobs: &[(String, i64)], device: &(Option<ServedDevice>, u64)) -> String {
        let mut out = String::new();
        out.push_str("# HELP care_http_request_duration_seconds HTTP request latency by route.\n");
        out.push_str("# TYPE care_http_request_duration_seconds histogram\n");
        for ((method, route, status), h) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let labels = format!("method=\"{method}\",route=\"{}\",status=\"{status}\"", escape(route));
            write_histogram(&mut out, "care_http_request_duration_seconds", &labels, h);
        }
        out.push_str("# HELP care_password_hashes_total Password hashes computed (sign-ins, password checks).\n");
        out.push_str("# TYPE care_password_hashes_total counter\n");
        let _ = writeln!(out, "care_password_hashes_total {}", care_engine::accounts::password_hashes_computed());
        out.push_str("# HELP care_searches_total Searches answered, by the retrieval method used.\n");
        out.push_str("# TYPE care_searches_total counter\n");
        for (m, n) in self.searches.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "care_searches_total{{method=\"{}\"}} {n}", escape(m));
        }
        out.push_str(
            "# HELP care_search_duration_seconds Engine time per search (encode, retrieve, fuse, snippets).\n",
        );
        out.push_str("# TYPE care_search_duration_seconds histogram\n");
        write_histogram(
            &mut out,
            "care_search_duration_seconds",
            "",
            &self.search_latency.lock().unwrap_or_else(|p| p.into_inner()),
        );
        out.push_str("# HELP care_jobs Jobs by state.\n# TYPE care_jobs gauge\n");
        for state in ["queued", "running", "done", "failed", "cancelled"] {
            let n = jobs.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
            let _ = writeln!(out, "care_jobs{{state=\"{state}\"}} {n}");
        }
        write_device(&mut out, device);
        out
    }
}

/// The served device as an info metric (with the fallback reason, so an alert can say why), and the fallbacks.
fn write_device(out: &mut String, (served, fallbacks): &(Option<ServedDevice>, u64)) {
    out.push_str(
        "# HELP care_encoder_cuda_fallback_total Encoder sessions put on the CPU because CUDA was unusable.\n",
    );
    out.push_str("# TYPE care_encoder_cuda_fallback_total counter\n");
    let _ = writeln!(out, "care_encoder_cuda_fallback_total {fallbacks}");
    let Some(s) = served else { return };
    out.push_str("# HELP care_encoder_device_info The device the encoders run on, as requested and as served.\n");
    out.push_str("# TYPE care_encoder_device_info gauge\n");
    let reason = s.fallback.as_ref().map(|f| f.short()).unwrap_or_default();
    let _ = writeln!(
        out,
        "care_encoder_device_info{{requested=\"{}\",device=\"{}\",fallback_reason=\"{}\"}} 1",
        escape(&s.requested),
        s.device,
        escape(&reason)
    );
}

fn add(h: &mut Histogram, seconds: f64) {
    for (i, b) in BUCKETS.iter().enumerate() {
        if seconds <= *b {
            h.counts[i] += 1;
        }
    }
    h.sum += seconds;
    h.count += 1;
}

fn write_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (i, b) in BUCKETS.iter().enumerate() {
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {}", h.counts[i]);
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    let _ = writeln!(out, "{name}_sum{braces} {}", h.sum);
    let _ = writeln!(out, "{name}_count{braces} {}", h.count);
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe("GET", "/search", 200, 0.003);
        m.observe("GET", "/search", 200, 0.3);
        m.search("weighted", 0.004);
        let text = m.render(&[("done".into(), 2)], &(None, 0));
        assert!(text.contains("care_http_request_duration_seconds_bucket{method=\"GET\",route=\"/search\",status=\"2xx\",le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("care_http_request_duration_seconds_bucket{method=\"GET\",route=\"/search\",status=\"2xx\",le=\"0.5\"} 2"), "{text}");
        assert!(
            text.contains(
                "care_http_request_duration_seconds_count{method=\"GET\",route=\"/search\",status=\"2xx\"} 2"
            )
        );
        assert!(text.contains("care_searches_total{method=\"weighted\"} 1"));
        assert!(text.contains("care_jobs{state=\"done\"} 2"));
        assert!(text.contains("care_jobs{state=\"failed\"} 0"));
        assert!(text.contains("care_encoder_cuda_fallback_total 0\n"), "{text}");
        assert!(!text.contains("care_encoder_device_info"), "no device decided yet: {text}");
    }

    #[test]
    fn a_cpu_fallback_is_shown_with_its_reason() {
        let why = care_engine::encoders::CudaUnavailable::new("libcudart.so.13: cannot open shared object file");
        let served = ServedDevice { requested: "auto".into(), device: "cpu", fallback: Some(why) };
        let text = Metrics::default().render(&[], &(Some(served), 2));
        assert!(text.contains("care_encoder_cuda_fallback_total 2\n"), "{text}");
        let info =
            "care_encoder_device_info{requested=\"auto\",device=\"cpu\",fallback_reason=\"missing libcudart.so.13\"} 1";
        assert!(text.contains(info), "{text}");
    }
}
