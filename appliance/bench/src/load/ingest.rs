//! An ingest through the admin API during a phase, polled and summarised.

use super::*;

// Ingest during a phase

#[derive(Debug, Clone, Serialize, Default)]
pub struct IngestReport {
    pub collection: String,
    pub job_id: i64,
    /// Documents uploaded (one JSONL file).
    pub documents_uploaded: usize,
    /// Seconds from the upload to the job running (before the phase's warm-up starts).
    pub queued_s: f64,
    pub documents_at_window_start: i64,
    pub documents_at_window_end: i64,
    pub documents_per_s_in_window: f64,
    /// The job ended before the window did: the rest of the window measured search without an ingest.
    pub finished_in_window: bool,
    /// Share of the measured window during which the job was still running.
    pub window_covered: f64,
    /// The job's state when the measurement ended (it is then cancelled and the collection deleted).
    pub state_at_window_end: String,
    pub cleanup_s: f64,
}

pub(super) struct JobPoll {
    pub(super) t: f64,
    pub(super) documents: i64,
    pub(super) state: String,
}

pub(super) async fn job_status(t: &Target, id: i64) -> Result<(String, i64)> {
    let v: serde_json::Value = t
        .client
        .get(format!("{}/api/v1/admin/jobs/{id}", t.base))
        .bearer_auth(&t.token)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let state = v.get("state").and_then(|s| s.as_str()).unwrap_or("").to_string();
    let docs = v.get("documents").and_then(serde_json::Value::as_i64).unwrap_or(0);
    Ok((state, docs))
}

pub(super) fn finished(state: &str) -> bool {
    matches!(state, "done" | "failed" | "cancelled")
}

/// Creates a fresh collection and uploads `body` (a JSONL file) into it through the admin API; returns the job id
/// once the server's worker runs it.
pub(super) async fn start_ingest(t: &Target, collection: &str, body: &[u8]) -> Result<(i64, f64)> {
    let started = Instant::now();
    t.client
        .post(format!("{}/api/v1/admin/collections", t.base))
        .bearer_auth(&t.token)
        .json(&serde_json::json!({"name": collection, "description": "care-bench --load ingest"}))
        .send()
        .await?
        .error_for_status()
        .context("creating the ingest collection")?;
    let boundary = format!("care-bench-load-{}", std::process::id());
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ingest.jsonl\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(body);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let v: serde_json::Value = t
        .client
        .post(format!("{}/api/v1/admin/collections/{collection}/files", t.base))
        .bearer_auth(&t.token)
        .header(reqwest::header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
        .body(form)
        .send()
        .await?
        .error_for_status()
        .context("uploading the ingest file")?
        .json()
        .await?;
    let id = v.get("job_id").and_then(serde_json::Value::as_i64).context("no job_id in the upload's answer")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (state, _) = job_status(t, id).await?;
        if state != "queued" {
            break;
        }
        if Instant::now() > deadline {
            bail!("ingest job {id} was still queued after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((id, started.elapsed().as_secs_f64()))
}

/// Cancels the job if it still runs, waits for it to end, and deletes its collection, so that the next phase
/// searches the same index as the ones before.
pub(super) async fn stop_ingest(t: &Target, collection: &str, id: i64) -> Result<()> {
    let _ = t.client.post(format!("{}/api/v1/admin/jobs/{id}/cancel", t.base)).bearer_auth(&t.token).send().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !finished(&job_status(t, id).await?.0) {
        if Instant::now() > deadline {
            bail!("ingest job {id} did not end within 600 s of its cancellation");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.client
        .delete(format!("{}/api/v1/admin/collections/{collection}", t.base))
        .bearer_auth(&t.token)
        .timeout(Duration::from_secs(600))
        .send()
        .await?
        .error_for_status()
        .context("deleting the ingest collection")?;
    Ok(())
}

pub(super) fn ingest_report(polls: &[JobPoll], from: f64, to: f64) -> (i64, i64, bool, f64, String) {
    let at = |t: f64| polls.iter().rev().find(|p| p.t <= t).or(polls.first());
    let start = at(from).map_or(0, |p| p.documents);
    let end = at(to).map_or(0, |p| p.documents);
    let ended = polls.iter().find(|p| finished(&p.state)).map(|p| p.t);
    let finished_in_window = ended.is_some_and(|t| t < to);
    let covered = match ended {
        Some(t) => ((t - from) / (to - from)).clamp(0.0, 1.0),
        None => 1.0,
    };
    let state = at(to).map_or_else(String::new, |p| p.state.clone());
    (start, end, finished_in_window, covered, state)
}
