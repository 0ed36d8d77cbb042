//! A `care-train` child process and the events it writes ([`care_formats::trainer::Event`], one JSON object per
//! line of its standard output).
//!
//! [`TrainerChild`] owns the process: dropping it (an error, a cancel, a panic unwinding the task) kills and
//! reaps the child, so no phase outlives the task that started it and no zombie is left. [`follow`] reads the
//! events to the end, checking the task's cancel token between them. A `kill -9` of the server itself is covered
//! by the trainer's own parent-death signal (`CARE_TRAIN_PARENT`), since no destructor runs then.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use care_formats::trainer::Event;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};

/// A running child whose standard output is read line by line on a thread of its own.
#[derive(Debug)]
pub(crate) struct TrainerChild {
    child: Child,
    lines: Receiver<String>,
    reaped: bool,
}

impl TrainerChild {
    /// Starts `cmd` with its standard output piped to us (its standard error and input are the caller's choice).
    pub(crate) fn spawn(mut cmd: Command) -> std::io::Result<Self> {
        let mut child = cmd.stdout(Stdio::piped()).spawn()?;
        let out =
            child.stdout.take().ok_or_else(|| std::io::Error::other("the child's standard output is not piped"))?;
        let (tx, lines) = std::sync::mpsc::channel();
        // Ends when the child's standard output closes (its exit or its kill); never joined, so a grandchild that
        // kept the pipe open cannot hang the task.
        std::thread::Builder::new().name("care-train-events".into()).spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        })?;
        Ok(TrainerChild { child, lines, reaped: false })
    }

    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child's exit and reaps it.
    pub(crate) fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait()?;
        self.reaped = true;
        Ok(status)
    }

    /// Kills the child (SIGKILL) and reaps it; a child that already exited is only reaped.
    pub(crate) fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for TrainerChild {
    fn drop(&mut self) {
        if !self.reaped {
            tracing::info!(pid = self.child.id(), "stopping care-train");
        }
        self.kill();
    }
}

/// How a followed phase ended.
#[derive(Debug)]
pub(crate) struct Ended {
    pub status: ExitStatus,
    /// Its `done` or `failed` event, if it wrote one.
    pub last: Option<Event>,
}

/// Reads `child`'s events to its exit. `on` gets each event, and `None` when `poll` passed without one (to flush
/// throttled progress); an error from it, or a raised `token`, kills the child (by dropping it) and is returned.
/// Lines that are no event go to `other` (a library printing on standard output must not fail the phase).
pub(crate) fn follow(
    mut child: TrainerChild,
    token: &CancelToken,
    poll: Duration,
    mut on: impl FnMut(Option<&Event>) -> Result<()>,
    mut other: impl FnMut(&str),
) -> Result<Ended> {
    let mut last = None;
    loop {
        token.check()?;
        match child.lines.recv_timeout(poll) {
            Ok(line) if line.trim().is_empty() => {}
            Ok(line) => match Event::from_line(&line) {
                Ok(e) => {
                    e.check_format().map_err(|err| {
                        Error::TrainerUnavailable(format!(
                            "训练程序的事件格式与本版本不符，请安装与 care 同一版本的 care-train ({err})"
                        ))
                    })?;
                    on(Some(&e))?;
                    if e.is_end() {
                        last = Some(e);
                    }
                }
                Err(_) => other(&line),
            },
            Err(RecvTimeoutError::Timeout) => on(None)?,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.wait().map_err(|e| Error::Internal(format!("waiting for care-train: {e}")))?;
    Ok(Ended { status, last })
}

/// Where a training phase is, from its step events: what the 任务 and 训练 pages show while it runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StepProgress {
    pub step: u64,
    pub total: u64,
    pub loss: Option<f64>,
    /// Wall seconds of the most recent steps (at most [`StepProgress::WINDOW`]), for the time left.
    recent: VecDeque<f64>,
}

impl StepProgress {
    const WINDOW: usize = 20;

    /// Before the first event of a phase of `total` steps.
    pub(crate) fn new(total: u64) -> Self {
        StepProgress { total, ..Default::default() }
    }

    /// Takes in what `e` says; true when it moved the progress.
    pub(crate) fn apply(&mut self, e: &Event) -> bool {
        match e {
            Event::Started { total, .. } => {
                self.total = *total;
                true
            }
            Event::Step { step, total, loss, seconds, .. } => {
                (self.step, self.total, self.loss) = (*step, *total, Some(*loss));
                if self.recent.len() == Self::WINDOW {
                    self.recent.pop_front();
                }
                self.recent.push_back(*seconds);
                true
            }
            Event::Checkpoint { .. } | Event::Done { .. } | Event::Failed { .. } => false,
        }
    }

    /// Minutes left at the recent steps' pace (none before the first step).
    pub(crate) fn minutes_left(&self) -> Option<f64> {
        if self.recent.is_empty() {
            return None;
        }
        let mean = self.recent.iter().sum::<f64>() / self.recent.len() as f64;
        Some((self.total.saturating_sub(self.step) as f64 * mean / 60.0).ceil())
    }

    /// "Stage I 训练 步 s/n · 损失 l · 剩余约 m 分钟", or "… 准备中" before the first step.
    pub(crate) fn text(&self, label: &str) -> String {
        match (self.loss, self.minutes_left()) {
            (Some(loss), Some(eta)) => {
                format!("{label} 步 {}/{} · 损失 {loss:.4} · 剩余约 {eta} 分钟", self.step, self.total)
            }
            _ => format!("{label} 准备中"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use super::*;

    /// Whether process `pid` still exists, a zombie included (one killed but never reaped).
    fn exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).stdin(Stdio::null());
        c
    }

    #[test]
    fn dropping_the_guard_kills_and_reaps_the_child() {
        let child = TrainerChild::spawn(sh("exec sleep 60")).unwrap();
        let pid = child.id();
        assert!(exists(pid));
        let t = Instant::now();
        drop(child);
        assert!(!exists(pid), "process {pid} is still there (running or a zombie) after the guard dropped");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn a_cancel_kills_and_reaps_a_running_phase_at_once() {
        let token = CancelToken::new(Arc::new(AtomicBool::new(false)));
        let child = TrainerChild::spawn(sh("exec sleep 60")).unwrap();
        let pid = child.id();
        let cancel = token.clone();
        let t = Instant::now();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            cancel.cancel();
        });
        let err = follow(child, &token, Duration::from_millis(50), |_| Ok(()), |_| {}).unwrap_err();
        canceller.join().unwrap();
        assert!(matches!(err, Error::Cancelled(_)), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(!exists(pid), "process {pid} outlived the cancel");
    }

    /// A stream `care-train run --spec` wrote (Stage II, 3 steps of the real e5-small-l4 on 2 CPU cores), replayed
    /// by a child that prints it: parsed into the progress the pages show, ended by its `done`.
    #[test]
    fn a_recorded_event_stream_becomes_step_progress_and_ends_with_done() {
        let recorded = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trainer-stage2-events.jsonl");
        let cmd = sh(&format!("echo 'a line that is no event'; cat '{}'", recorded.display()));
        let mut progress = StepProgress::default();
        let (mut texts, mut others, mut checkpoints) = (Vec::new(), Vec::new(), Vec::new());
        let ended = follow(
            TrainerChild::spawn(cmd).unwrap(),
            &CancelToken::never(),
            Duration::from_millis(200),
            |e| {
                if let Some(e) = e {
                    if let Event::Checkpoint { step, .. } = e {
                        checkpoints.push(*step);
                    }
                    if progress.apply(e) {
                        texts.push(progress.text("Stage II 训练"));
                    }
                }
                Ok(())
            },
            |l| others.push(l.to_string()),
        )
        .unwrap();
        assert!(ended.status.success());
        assert!(matches!(&ended.last, Some(Event::Done { summary, .. }) if summary["steps_run"] == 3), "{ended:?}");
        assert_eq!(others, ["a line that is no event"]);
        assert_eq!(checkpoints, [2, 3]);
        assert_eq!(texts[0], "Stage II 训练 准备中");
        assert!(texts[1].starts_with("Stage II 训练 步 1/3 · 损失 0.1691 · 剩余约 1 分钟"), "{texts:?}");
        assert_eq!(texts.len(), 4, "{texts:?}");
        assert_eq!((progress.step, progress.total), (3, 3));
        assert_eq!(progress.minutes_left(), Some(0.0));
    }

    #[test]
    fn a_stream_of_another_format_is_refused_and_its_child_stopped() {
        let cmd = sh(
            r#"echo '{"event":"started","format":99,"stage":"merge","trainer":"x","device":"Cpu","total":0}'; exec sleep 60"#,
        );
        let child = TrainerChild::spawn(cmd).unwrap();
        let pid = child.id();
        let err = follow(child, &CancelToken::never(), Duration::from_millis(50), |_| Ok(()), |_| {}).unwrap_err();
        assert!(matches!(err, Error::TrainerUnavailable(_)), "{err}");
        assert!(err.to_string().contains("事件格式") && err.to_string().contains("99"), "{err}");
        assert!(!exists(pid));
    }
}
