//! `care train …`: retraining from the shell, the same engine operations the console's 训练 page calls.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use care_engine::training::schedule::ScheduleSpec;
use care_engine::training::{Recipe, TrainingRun};
use care_engine::{Admin, Engine, JobState};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Subcommand, Debug)]
pub enum TrainCommand {
    /// Whether `care-train` can run here (libtorch found, right version) and on which device.
    Status,
    /// Queue a retraining run from the live pair and follow it to its end: the running `care serve` runs it, or,
    /// when none runs, this command does.
    Run {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Only queue the run.
        #[arg(long)]
        detach: bool,
    },
    /// Training runs, newest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One run as JSON (recipe, data counts, phase times, candidate, gate decision).
    Show { job: i64 },
    /// The recipe a run takes (this machine's default, or DEVICE's, with the settings given on top), as JSON:
    /// what `packaging/dev.sh device-recipe` hands the GPU machine's script.
    Recipe {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// cpu or cuda: the default recipe of that device instead of this machine's.
        #[arg(long, value_parser = ["cpu", "cuda"])]
        device: Option<String>,
    },
    /// Write what the next run would train on (corpus.jsonl, stage2.jsonl) into a folder and print the counts.
    Data {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        recipe: RecipeArgs,
    },
    /// Embed the chunks an offline document model (an LLM with no ONNX graph) has no vectors for yet, with
    /// `care-train embed-corpus` on this machine (its GPU when there is one), and import them: a queued job.
    EmbedPending {
        /// `name@version` of the offline document model (default: the live document model).
        #[arg(long)]
        model: Option<String>,
        /// Only queue the job.
        #[arg(long)]
        detach: bool,
    },
    /// Retraining schedules.
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Add a schedule: a weekly or daily time (hospital local time), a feedback threshold, or both.
    Add {
        /// 0 = Monday … 6 = Sunday; leave out for every day.
        #[arg(long)]
        weekday: Option<u8>,
        /// HH:MM local time.
        #[arg(long)]
        time: Option<String>,
        /// Also run when at least this many new feedback judgments arrived.
        #[arg(long)]
        min_new_feedback: Option<u32>,
        #[command(flatten)]
        recipe: RecipeArgs,
        #[arg(long)]
        disabled: bool,
    },
    /// List schedules with their next due time.
    List,
    /// Delete a schedule.
    Delete { id: i64 },
}

/// The recipe: JSON (inline or a file), then single settings on top of it.
#[derive(Args, Debug, Clone)]
pub struct RecipeArgs {
    /// A recipe: inline JSON (`'{"query_layers": 4}'`) or a JSON file; fields of `Recipe`, missing ones take the
    /// defaults.
    #[arg(long)]
    recipe: Option<String>,
    /// Train a smaller query encoder: N layers of the live one, spread from its first to its last.
    #[arg(long)]
    query_layers: Option<u32>,
    #[arg(long)]
    stage1_steps: Option<u64>,
    #[arg(long)]
    stage2_steps: Option<u64>,
    #[arg(long)]
    batch_size: Option<usize>,
    /// Query groups per Stage II step (each 1 positive + 7 negatives).
    #[arg(long)]
    stage2_batch_size: Option<usize>,
    /// Train the document encoder too (LoRA), re-embedding every collection before the gate: CARE's full Stage II.
    #[arg(long)]
    both_sides: bool,
    /// Average the trained query encoder with the one it started from: this share of the trained one (0–1, WiSE-FT;
    /// 1 keeps it as trained). Keeps collections the training data covers less from losing.
    #[arg(long)]
    merge_ratio: Option<f64>,
    /// Keep the candidate for an admin to decide even when it passes the gate.
    #[arg(long)]
    no_promote: bool,
    /// Add past search queries (training part only) to Stage I.
    #[arg(long)]
    search_queries: bool,
}

impl RecipeArgs {
    /// The recipe given, over `base` (this machine's default) when none is.
    fn recipe(&self, base: Recipe) -> Result<Recipe> {
        let mut r: Recipe = match &self.recipe {
            // Inline when it looks like a JSON object: a file is rarely named `{...`.
            Some(j) if j.trim_start().starts_with('{') => serde_json::from_str(j)
                .with_context(|| format!("--recipe {j}: not a recipe (a JSON object with Recipe fields)"))?,
            Some(p) => serde_json::from_str(&std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?)
                .with_context(|| format!("{p}: not a recipe (a JSON object with Recipe fields)"))?,
            None => base,
        };
        r.query_layers = self.query_layers.or(r.query_layers);
        r.stage1_steps = self.stage1_steps.unwrap_or(r.stage1_steps);
        r.stage2_steps = self.stage2_steps.unwrap_or(r.stage2_steps);
        r.batch_size = self.batch_size.unwrap_or(r.batch_size);
        r.stage2_batch_size = self.stage2_batch_size.unwrap_or(r.stage2_batch_size);
        if self.both_sides {
            r.sides = care_engine::training::Sides::Both;
        }
        r.merge_ratio = self.merge_ratio.unwrap_or(r.merge_ratio);
        r.promote &= !self.no_promote;
        r.data.include_search_queries |= self.search_queries;
        r.check()?;
        Ok(r)
    }
}

pub fn run_train(e: Arc<Engine>, actor: &Admin, workers: usize, cmd: TrainCommand) -> Result<i32> {
    match cmd {
        TrainCommand::Status => {
            let s = care_engine::training::refresh_trainer_status(&e);
            if s.ready {
                println!("care-train ready: {} (device {})", s.version, s.device);
                let defaults = e.training().default_recipe();
                if defaults.sides == care_engine::training::Sides::Both {
                    println!(
                        "默认配方：查询编码器与文档编码器一起训练（GPU），{} 步 × {} 组",
                        defaults.stage2_steps, defaults.stage2_batch_size
                    );
                }
                match e.training().estimate(actor, &defaults)? {
                    Some(x) => {
                        println!("默认配方预计约 {} 分钟（按本机运行 #{} 的各阶段用时估算）", x.minutes(), x.from_job)
                    }
                    None => println!("本机尚无完成的同类训练运行，暂无法估算用时"),
                }
                if let Some(d) = e.training().disk(actor, care_engine::training::Sides::QueryOnly)? {
                    println!("{}", d.describe());
                    if !d.enough() {
                        return Ok(2);
                    }
                }
            } else {
                println!("{}", s.message);
                return Ok(2);
            }
        }
        TrainCommand::Recipe { recipe, device } => {
            let base = match device {
                Some(d) => Recipe::for_device(&d),
                None => e.training().default_recipe(),
            };
            println!("{}", serde_json::to_string_pretty(&recipe.recipe(base)?)?);
        }
        TrainCommand::Run { recipe, detach } => {
            let job = e.training().submit(actor, &recipe.recipe(e.training().default_recipe())?, None)?;
            println!("queued training job {job}");
            if !detach {
                return follow(e, actor, workers, job);
            }
        }
        TrainCommand::EmbedPending { model, detach } => {
            let job = e.models().submit_offline_embed(actor, model.as_deref())?;
            println!("queued embedding job {job}");
            if !detach {
                return follow_job(e, workers, job);
            }
        }
        TrainCommand::List { json } => {
            let runs = e.training().runs(actor, 50)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
            }
            for r in runs.iter().filter(|_| !json) {
                println!(
                    "#{:<5} {:<9} {:<10} {:<28} {:<24} {}",
                    r.job, r.state, r.decision, r.stage, r.candidate, r.created_at
                );
            }
        }
        TrainCommand::Data { out, recipe } => {
            let counts = e.training().data(actor, &out, &recipe.recipe(e.training().default_recipe())?)?;
            println!("{}", serde_json::to_string_pretty(&counts)?);
        }
        TrainCommand::Show { job } => println!("{}", serde_json::to_string_pretty(&e.training().run(actor, job)?)?),
        TrainCommand::Schedule { command } => match command {
            ScheduleCommand::Add { weekday, time, min_new_feedback, recipe, disabled } => {
                let spec = ScheduleSpec {
                    weekday,
                    time,
                    min_new_feedback,
                    recipe: recipe.recipe(e.training().default_recipe())?,
                    enabled: !disabled,
                };
                let id = e.training().set_schedule(actor, None, &spec)?;
                let s = e.training().schedules(actor)?.into_iter().find(|s| s.id == id);
                println!("schedule {id} added; next due {}", s.map(|s| s.next_due).unwrap_or_default());
            }
            ScheduleCommand::List => {
                for s in e.training().schedules(actor)? {
                    println!(
                        "#{:<4} {:<8} weekday {:?} time {:?} feedback ≥ {:?} ({} new)  next {}  last {} (job {:?})",
                        s.id,
                        if s.spec.enabled { "enabled" } else { "disabled" },
                        s.spec.weekday,
                        s.spec.time,
                        s.spec.min_new_feedback,
                        s.new_feedback,
                        s.next_due,
                        s.last_fired_at,
                        s.last_job
                    );
                }
            }
            ScheduleCommand::Delete { id } => {
                e.training().delete_schedule(actor, id)?;
                println!("schedule {id} deleted");
            }
        },
    }
    Ok(0)
}

/// Follows a run with a progress bar; runs the queue in this process when no server holds it.
fn follow(e: Arc<Engine>, actor: &Admin, workers: usize, job: i64) -> Result<i32> {
    run_with_bar(&e, workers, job)?;
    let run: TrainingRun = e.training().run(actor, job)?;
    let phases: Vec<String> = run.phases.iter().map(|(p, s)| format!("{p} {s:.0} s")).collect();
    println!("phases: {}", phases.join(", "));
    match run.state.as_str() {
        s if s == JobState::Done.as_str() => {
            println!("candidate {} → {} (evaluation {:?})", run.candidate, run.decision, run.evaluation);
            Ok(if run.decision == "gated_out" { 3 } else { 0 })
        }
        s => bail!("training job {job} ended {s}: {}", run.error),
    }
}

/// Runs the worker until job `job` ends, showing its stage; prints its result.
fn follow_job(e: Arc<Engine>, workers: usize, job: i64) -> Result<i32> {
    let j = run_with_bar(&e, workers, job)?;
    if j.state != JobState::Done {
        let why = j.errors.first().map(|e| e.message.clone()).unwrap_or_default();
        bail!("job {job} ended {}: {why}", j.state.as_str());
    }
    println!("{}", j.result);
    Ok(0)
}

/// Runs the worker (here, or in the `care serve` that holds the jobs lock) until job `job` ends, drawing its step
/// and stage as a progress bar; returns the finished job.
pub(crate) fn run_with_bar(e: &Arc<Engine>, workers: usize, job: i64) -> Result<care_engine::Job> {
    let worker = crate::start_scheduler(e, workers);
    let pb = ProgressBar::new(0);
    pb.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")?);
    let j = loop {
        let j = e.queue().job(job)?;
        pb.set_length(j.progress_total);
        pb.set_position(j.progress_done);
        pb.set_message(j.stage_text());
        if j.state.is_finished() {
            break j;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    pb.finish_and_clear();
    worker.shutdown();
    Ok(j)
}
