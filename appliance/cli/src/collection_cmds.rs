//! `care collection` and `care jobs`: collections, their filing, pending vectors; queued jobs and their progress.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use care_engine::{Engine, JobState};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{console, start_scheduler};

#[derive(Subcommand, Debug)]
pub(crate) enum CollectionCommand {
    /// Create an empty collection.
    Create {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List collections with their document and chunk counts.
    List,
    /// Approve a collection for training the encoders (or withdraw the approval with --revoke).
    Approve {
        name: String,
        #[arg(long)]
        revoke: bool,
    },
    /// Delete a collection and all its documents everywhere.
    Delete { name: String },
    /// File documents from a CSV (UTF-8): an id column (id, external_id, 编号) and any of 科室/department,
    /// 类型/doc_type, 日期/date, 来源/issuer, 语言/language. Replaces the fields it has columns for; re-indexes
    /// nothing.
    File { name: String, csv: PathBuf },
    /// Write every chunk of a collection as JSONL ({"id", "text"}) for `care-train embed-corpus` to embed offline
    /// with the large document encoder.
    ExportChunks {
        collection: String,
        #[arg(long)]
        out: PathBuf,
        /// Only the chunks document model NAME@VERSION has no vector for yet (an offline model's queue).
        #[arg(long, value_name = "MODEL")]
        pending_for: Option<String>,
    },
    /// How many live chunks a document model (default: the live one) has no vector for: chunks queued for an
    /// offline document model, searchable by BM25 until their vectors are imported.
    PendingVectors {
        collection: String,
        #[arg(long)]
        model: Option<String>,
    },
    /// Load document vectors computed offline (an `embed-corpus` output folder of embedding shards) into a
    /// collection's dense index, after verifying checksums, width, pairing id and chunk ids.
    ImportVectors {
        collection: String,
        /// The folder holding embeddings.json and its shards.
        #[arg(long)]
        from: PathBuf,
        /// Into this document model's tables (NAME@VERSION) instead of the live one's, e.g. an offline model
        /// before it goes live.
        #[arg(long)]
        model: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum JobsCommand {
    /// The newest jobs.
    List {
        #[arg(long, short = 'n', default_value_t = 20)]
        limit: usize,
    },
    /// One job with its files, as JSON.
    Show { id: i64 },
    /// Ask a queued or running job to stop after the file it is working on.
    Cancel { id: i64 },
    /// Run queued jobs (and resume interrupted ones) until none is left.
    Run,
}

/// Runs the worker in this process until job `id` ends (or waits for the process that holds the jobs lock, e.g.
/// `care serve`, to run it), drawing a progress bar; prints the per-file report.
pub(crate) fn run_ingest_job(e: &Arc<Engine>, id: i64, json: bool, workers: usize) -> Result<i32> {
    let worker = start_scheduler(e, workers);
    let job = e.queue().job(id)?;
    let bar = ProgressBar::new(job.progress_total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} files {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let job = loop {
        let j = e.queue().job(id)?;
        bar.set_position(j.progress_done);
        let mut msg = format!("{} documents", j.documents_done);
        if !j.errors.is_empty() {
            msg.push_str(&format!(", {} rejected", j.errors.len()));
        }
        if !worker.runs_jobs() && started.elapsed() > std::time::Duration::from_secs(2) {
            msg.push_str(" (queued for the care process that runs jobs, e.g. care serve)");
        }
        bar.set_message(msg);
        if j.state.is_finished() {
            break j;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    bar.finish_and_clear();
    worker.shutdown();
    let files = e.queue().job_files(id)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"job": job, "files": files}))?);
    }
    let mut err = std::io::stderr().lock();
    for f in &files {
        for fe in &f.errors {
            writeln!(err, "FAILED {} [{}]: {}", fe.file, fe.code, fe.message)?;
        }
        if f.state == "done" && !json {
            writeln!(
                err,
                "ok {}: {} added, {} replaced, {} unchanged, {} chunks",
                f.file, f.added, f.replaced, f.unchanged, f.chunks
            )?;
        }
    }
    if job.state == JobState::Cancelled {
        writeln!(err, "job {id} was cancelled")?;
        return Ok(1);
    }
    // Exit 2 tells scripts that some files were rejected while the others were ingested.
    Ok(if job.errors.is_empty() { 0 } else { 2 })
}

pub(crate) fn run_collection(e: &Engine, command: CollectionCommand) -> Result<i32> {
    match command {
        CollectionCommand::Create { name, description } => {
            let c = e.collections().create(&console(), &name, &description)?;
            println!("created collection '{}'", c.name);
        }
        CollectionCommand::Approve { name, revoke } => {
            let c = e.collections().approve(&console(), &name, !revoke)?;
            println!("collection '{}': approved for training = {}", c.name, c.approved_for_training);
        }
        CollectionCommand::Delete { name } => {
            let n = e.collections().delete(&console(), &name)?;
            println!("deleted collection '{name}' and its {n} documents");
        }
        CollectionCommand::File { name, csv } => {
            let text = std::fs::read_to_string(&csv).with_context(|| format!("reading {}", csv.display()))?;
            let filing = care_engine::ingest::meta::read_filing(&text)?;
            let (changed, unknown) = e.collections().file_documents(&console(), &name, &filing)?;
            println!("已更新 {changed} 篇文档的归档信息");
            if !unknown.is_empty() {
                let shown: Vec<&str> = unknown.iter().take(10).map(String::as_str).collect();
                println!("{} 个编号不是知识库「{name}」的文档：{}", unknown.len(), shown.join("、"));
            }
        }
        CollectionCommand::List => {
            for c in e.indexer().collection_stats()? {
                println!("{}\t{} documents\t{} chunks", c.collection.name, c.documents, c.chunks);
            }
        }
        CollectionCommand::PendingVectors { collection, model } => {
            let (doc, pending) = e.vectors().pending_vectors(&collection, model.as_deref())?;
            println!(
                "{} chunks of '{collection}' have no vector of {}@{}{}",
                pending.len(),
                doc.name,
                doc.version,
                if doc.online { "" } else { " (offline model: export them with --pending-for and import)" }
            );
        }
        CollectionCommand::ExportChunks { collection, out, pending_for } => {
            let r = e.models().export_chunks(&console(), &collection, &out, pending_for.as_deref())?;
            println!("wrote {} chunks of '{}' to {}", r.chunks, r.collection, r.path.display());
            println!(
                "next: care-train embed-corpus --document <encoder> --corpus {} --out <dir> --pairing-id <pairing>, \
                 then care collection import-vectors {} --from <dir>",
                r.path.display(),
                r.collection
            );
        }
        CollectionCommand::ImportVectors { collection, from, model, json } => {
            return import_vectors(e, &collection, &from, model.as_deref(), json);
        }
    }
    Ok(0)
}

pub(crate) fn run_jobs(e: &Arc<Engine>, command: JobsCommand, workers: usize) -> Result<i32> {
    match command {
        JobsCommand::List { limit } => {
            for j in e.queue().jobs(limit)? {
                let what = if j.kind == "ingest" {
                    format!(
                        "{}\t{}/{} files\t{} documents",
                        j.collection, j.progress_done, j.progress_total, j.documents_done
                    )
                } else {
                    format!("{}\t{} {}/{}\t{}", j.kind, j.stage_text(), j.progress_done, j.progress_total, j.result)
                };
                println!("{}\t{}\t{what}\t{} errors\t{}", j.id, j.state.as_str(), j.errors.len(), j.created_at);
            }
        }
        JobsCommand::Show { id } => {
            let out = serde_json::json!({"job": e.queue().job(id)?, "files": e.queue().job_files(id)?});
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        JobsCommand::Cancel { id } => {
            e.tasks().cancel(&console(), id)?;
            println!("cancellation of job {id} requested");
        }
        JobsCommand::Run => {
            let worker = start_scheduler(e, workers);
            loop {
                let active = e.queue().jobs(1000)?.into_iter().filter(|j| !j.state.is_finished()).count();
                if active == 0 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            worker.shutdown();
            println!("no queued jobs left");
        }
    }
    Ok(0)
}

/// `care collection import-vectors`: verifies, then writes, with a progress bar for each phase.
fn import_vectors(
    e: &Engine,
    collection: &str,
    from: &std::path::Path,
    model: Option<&str>,
    json: bool,
) -> Result<i32> {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {bar:30} {pos}/{len} vectors [{elapsed_precise}, eta {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = e.models().import_vectors(collection, from, model, &console(), &mut |p| {
        pb.set_length(p.total as u64);
        pb.set_position(p.done as u64);
        pb.set_message(p.phase);
    });
    pb.finish_and_clear();
    let r = r?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    println!(
        "imported {} vectors (width {}, pairing {}) computed by {} into the dense index of '{}' (document model {})",
        r.imported, r.width, r.pairing_id, r.source_model, r.collection, r.document_model
    );
    println!(
        "{} of {} live chunks covered; {} not covered keep their current vectors",
        r.imported, r.live_chunks, r.not_covered
    );
    if r.online_document_encoder {
        println!(
            "chunks ingested from now on are embedded by {}'s own encoder; import again to replace them",
            r.document_model
        );
    } else {
        println!(
            "{} has no online document encoder (no model.onnx in its package): the appliance cannot embed the uncovered \
             chunks or chunks ingested later; export and import vectors for them",
            r.document_model
        );
    }
    Ok(0)
}
