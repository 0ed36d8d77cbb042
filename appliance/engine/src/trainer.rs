//! Whether `care-train` can run here, known without making a page wait for it.
//!
//! While a trainer is being built (`packaging/dev.sh demo` serves first and builds `care-train` in the background),
//! a file named like the trainer plus `.building` lies beside where it will be: the status then says so instead of
//! "unavailable", and because an answer that is not ready is kept only [`NOT_READY_MAX_AGE`], the page enables
//! training within seconds of the build ending, without a restart.
//!
//! The engine holds one [`TrainerCheck`]; pages and the API read its cached [`TrainerStatus`]: the first read (the server makes one when it
//! starts) starts a check on a background thread and says 正在检测训练程序… until it ends, and a read of an answer
//! older than [`MAX_AGE`] starts another while the old answer is still shown. Only submitting work for the trainer
//! (a training run, an offline embedding) and `care train status` check again and wait for the answer.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How long an answer is shown before a read starts a background check again.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(10 * 60);
/// How long an answer that the trainer cannot run is shown before a read checks again: a trainer that was being
/// built or installed is noticed this soon (a missing file costs one failed spawn per check).
pub(crate) const NOT_READY_MAX_AGE: Duration = Duration::from_secs(10);
/// How long `care-train --version` may take before it is killed and the trainer counted as unusable.
const VERSION_TIMEOUT: Duration = Duration::from_secs(30);
const CHECKING: &str = "正在检测训练程序…";
const BUILDING: &str = "训练模块正在编译（演示在后台构建训练程序），完成后“训练”页自动启用“开始训练”。";

/// Whether the trainer can run here, said before an admin starts a run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainerStatus {
    pub ready: bool,
    pub version: String,
    /// The device runs will use: "cuda" when a GPU is visible and the device setting allows it, else "cpu".
    pub device: String,
    /// Chinese: with how to fix it when not ready, or that the first check has not ended yet.
    pub message: String,
    /// The first check since the start has not ended yet (`ready` is false until it has).
    pub checking: bool,
    /// The trainer is still being built (its `.building` marker lies beside it): pages wait for it instead of
    /// showing an error.
    pub building: bool,
}

impl TrainerStatus {
    fn checking(device: String) -> Self {
        TrainerStatus {
            ready: false,
            version: String::new(),
            device,
            message: CHECKING.into(),
            checking: true,
            building: false,
        }
    }
}

/// The engine's newest answer, shared with the background check that refreshes it.
#[derive(Default)]
pub(crate) struct TrainerCheck {
    inner: Arc<Mutex<Cached>>,
}

#[derive(Default)]
struct Cached {
    /// The newest answer, with when the check that gave it started.
    known: Option<(Instant, TrainerStatus)>,
    /// A background check is under way (at most one at a time).
    refreshing: bool,
}

impl Cached {
    /// Keeps `st` unless an answer from a check that started later is already known.
    fn store(&mut self, started: Instant, st: TrainerStatus) {
        if self.known.as_ref().is_none_or(|(at, _)| *at <= started) {
            self.known = Some((started, st));
        }
    }
}

fn lock(m: &Mutex<Cached>) -> MutexGuard<'_, Cached> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TrainerCheck {
    /// The newest answer for `bin` on `device`, without waiting. With no answer yet, or one older than ten
    /// minutes, a check starts in the background; until the first one ends, `checking` is set and the message
    /// says so.
    pub(crate) fn latest(&self, bin: &Path, device: String) -> TrainerStatus {
        let mut c = lock(&self.inner);
        let stale =
            c.known.as_ref().is_none_or(|(at, st)| at.elapsed() >= if st.ready { MAX_AGE } else { NOT_READY_MAX_AGE });
        if stale && !c.refreshing {
            let inner = self.inner.clone();
            let (bin, dev) = (bin.to_path_buf(), device.clone());
            let spawned = std::thread::Builder::new().name("care-trainer-check".into()).spawn(move || {
                let started = Instant::now();
                let st = check(&bin, dev);
                let mut c = lock(&inner);
                c.refreshing = false;
                c.store(started, st);
            });
            match spawned {
                Ok(_) => c.refreshing = true,
                Err(e) => tracing::warn!(error = %e, "could not start the trainer check"),
            }
        }
        match &c.known {
            Some((_, st)) => st.clone(),
            None => TrainerStatus::checking(device),
        }
    }

    /// Checks now and waits for the answer (at most 30 s), which later reads show too.
    pub(crate) fn refresh(&self, bin: &Path, device: String) -> TrainerStatus {
        let started = Instant::now();
        let st = check(bin, device);
        lock(&self.inner).store(started, st.clone());
        st
    }
}

/// Runs `bin --version`, bounded to [`VERSION_TIMEOUT`].
fn check(bin: &Path, device: String) -> TrainerStatus {
    check_within(bin, device, VERSION_TIMEOUT)
}

/// Runs `bin --version`: its output is read on helper threads and awaited on a channel for at most `timeout`, so
/// nothing polls; a trainer that does not answer in time is killed and reaped.
fn check_within(bin: &Path, device: String, timeout: Duration) -> TrainerStatus {
    let not_ready = |detail: String| TrainerStatus {
        ready: false,
        version: String::new(),
        device: device.clone(),
        message: format!(
            "训练程序不可用：{detail}。请安装 libtorch：`python3 -m pip install --no-deps --target /opt/care \
             torch==2.13.0 nvidia-cuda-runtime nvidia-cuda-cupti`（GPU 另需 cuBLAS/cuDNN 的安装包），或在 \
             `/etc/care/trainer.toml` 中设置 libtorch 路径；训练程序路径见 `care.toml` 的 `[training] trainer`"
        ),
        checking: false,
        building: false,
    };
    if !bin.exists() && building_marker(bin).exists() {
        return TrainerStatus {
            message: BUILDING.into(),
            checking: false,
            building: true,
            ..TrainerStatus::checking(device)
        };
    }
    tracing::debug!(trainer = %bin.display(), "checking the trainer");
    let child = Command::new(bin).arg("--version").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return not_ready(format!("无法启动 `{}`（系统错误：`{e}`）", bin.display())),
    };
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (tx, rx) = mpsc::channel();
    // Both pipes end when the trainer exits; reading them on two threads keeps a full one from stalling the other.
    let reader = std::thread::Builder::new().name("care-trainer-version".into()).spawn(move || {
        let err = std::thread::spawn(move || read_all(stderr));
        let out = read_all(stdout);
        let _ = tx.send((out, err.join().unwrap_or_default()));
    });
    let output = match reader {
        Ok(_) => rx.recv_timeout(timeout).ok(),
        Err(_) => None,
    };
    let Some((out, err)) = output else {
        let _ = child.kill();
        let _ = child.wait();
        return not_ready(format!("`{} --version` 超过 {} 秒没有结束", bin.display(), timeout.as_secs()));
    };
    let status = match child.wait() {
        Ok(s) => s,
        Err(e) => return not_ready(format!("`{} --version` 无法结束（`{e}`）", bin.display())),
    };
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        return not_ready(format!("`{}` 退出（`{status}`）：`{}`", bin.display(), err.trim()));
    }
    TrainerStatus {
        ready: true,
        version: String::from_utf8_lossy(&out).trim().to_string(),
        device,
        message: String::new(),
        checking: false,
        building: false,
    }
}

/// `care-train.building` beside `care-train`: written before a background build of the trainer starts and removed
/// when it ends (`packaging/dev.sh demo`).
fn building_marker(bin: &Path) -> std::path::PathBuf {
    let mut name = bin.as_os_str().to_os_string();
    name.push(".building");
    name.into()
}

fn read_all(pipe: Option<impl Read>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut p) = pipe {
        let _ = p.read_to_end(&mut buf);
    }
    buf
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::engine::{Engine, OpenMode};

    /// A fake `care-train` in `dir` that counts its starts in `dir/spawns`, takes `delay` to answer and exits with
    /// `code`.
    fn fake_trainer(dir: &Path, delay: &str, code: i32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("care-train");
        let script = format!(
            "#!/bin/sh\necho started >> '{}'\nsleep {delay}\necho 'care-train 9.9.9'\necho 'no libtorch' >&2\n\
             exit {code}\n",
            dir.join("spawns").display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    }

    fn spawns(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("spawns")).map_or(0, |s| s.lines().count())
    }

    fn engine(dir: &Path, trainer: PathBuf) -> Engine {
        let mut cfg = crate::config::test_config(&dir.join("data"));
        cfg.training.trainer = trainer;
        cfg.training.device = "cpu".into();
        Engine::open(cfg, OpenMode::Create).unwrap()
    }

    /// Reads the status as pages do until the background check has answered.
    fn until_known(e: &Engine) -> TrainerStatus {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let st = crate::training::trainer_status(&e);
            if !st.checking {
                return st;
            }
            assert!(Instant::now() < until, "the background check did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn page_views_read_one_background_check_and_submitting_checks_again() {
        let t = tempfile::tempdir().unwrap();
        let e = engine(t.path(), fake_trainer(t.path(), "0.5", 0));
        // Two page views in a row: neither waits for the trainer, and it is started once.
        let asked = Instant::now();
        let (first, second) = (crate::training::trainer_status(&e), crate::training::trainer_status(&e));
        assert!(asked.elapsed() < Duration::from_millis(400), "a page view waited {:?}", asked.elapsed());
        for st in [&first, &second] {
            assert!(st.checking && !st.ready && st.message == CHECKING, "{st:?}");
            assert_eq!(st.device, "cpu");
        }
        let known = until_known(&e);
        assert!(known.ready && !known.checking && known.message.is_empty(), "{known:?}");
        assert_eq!(known.version, "care-train 9.9.9");
        assert_eq!(crate::training::trainer_status(&e,).version, "care-train 9.9.9");
        assert_eq!(spawns(t.path()), 1, "page views started the trainer more than once");
        // Submitting checks again and waits for the answer; pages then show it without another start.
        let now = crate::training::refresh_trainer_status(&e);
        assert!(now.ready, "{now:?}");
        assert_eq!(spawns(t.path()), 2);
        crate::training::trainer_status(&e);
        assert_eq!(spawns(t.path()), 2);
    }

    #[test]
    fn a_stale_answer_is_shown_while_one_background_check_refreshes_it() {
        let t = tempfile::tempdir().unwrap();
        let e = engine(t.path(), fake_trainer(t.path(), "0.3", 0));
        assert!(crate::training::refresh_trainer_status(&e,).ready);
        // Eleven minutes later, as far as the cache can tell.
        let old = Instant::now().checked_sub(MAX_AGE + Duration::from_secs(60)).expect("a monotonic clock past 11 min");
        lock(&e.trainer_check.inner).known.as_mut().unwrap().0 = old;
        let (a, b) = (crate::training::trainer_status(&e), crate::training::trainer_status(&e));
        assert!(a.ready && b.ready && !a.checking, "the stale answer is shown meanwhile: {a:?}");
        let until = Instant::now() + Duration::from_secs(30);
        while lock(&e.trainer_check.inner).known.as_ref().unwrap().0 == old {
            assert!(Instant::now() < until, "the background refresh did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(spawns(t.path()), 2, "one refresh for two page views of a stale answer");
    }

    #[test]
    fn a_trainer_being_built_is_said_and_enabled_soon_after_it_is_there() {
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("care-train");
        std::fs::write(building_marker(&bin), "").unwrap();
        let e = engine(t.path(), bin.clone());
        let st = until_known(&e);
        assert!(st.building && !st.ready && st.message.starts_with("训练模块正在编译"), "{st:?}");
        // Without the marker a missing trainer is an error, not a build.
        let missing = check(&t.path().join("elsewhere/care-train"), "cpu".into());
        assert!(!missing.building && missing.message.contains("无法启动"), "{missing:?}");
        // The build ends: the trainer appears and its marker goes. Once the answer is NOT_READY_MAX_AGE old (as far
        // as the cache can tell), the next page view checks again and the one after it shows the trainer ready.
        assert_eq!(fake_trainer(t.path(), "0", 0), bin);
        std::fs::remove_file(building_marker(&bin)).unwrap();
        assert!(crate::training::trainer_status(&e,).building, "an answer younger than NOT_READY_MAX_AGE is kept");
        let old = Instant::now().checked_sub(NOT_READY_MAX_AGE + Duration::from_secs(1)).expect("a monotonic clock");
        lock(&e.trainer_check.inner).known.as_mut().unwrap().0 = old;
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let st = crate::training::trainer_status(&e);
            if st.ready {
                assert!(!st.building && st.version == "care-train 9.9.9", "{st:?}");
                break;
            }
            assert!(st.building && Instant::now() < until, "the finished build was not noticed: {st:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_trainer_that_fails_or_is_missing_is_said_in_chinese() {
        let t = tempfile::tempdir().unwrap();
        let failing = check(&fake_trainer(t.path(), "0", 3), "cpu".into());
        assert!(!failing.ready && !failing.checking, "{failing:?}");
        assert!(
            failing.message.starts_with("训练程序不可用") && failing.message.contains("no libtorch"),
            "{failing:?}"
        );
        let missing = check(&t.path().join("nowhere/care-train"), "cpu".into());
        assert!(!missing.ready && missing.message.contains("无法启动"), "{missing:?}");
        // One that never answers is killed when its time is up.
        let hung = tempfile::tempdir().unwrap();
        let asked = Instant::now();
        let slow = check_within(&fake_trainer(hung.path(), "5", 0), "cpu".into(), Duration::from_secs(1));
        assert!(asked.elapsed() < Duration::from_secs(4), "waited {:?}", asked.elapsed());
        assert!(!slow.ready && slow.message.contains("超过 1 秒没有结束"), "{slow:?}");
    }
}
