//! The CPU priority of long writes beside searches.
//!
//! On a busy workstation every core is shared by clinicians' searches. An administrator's long write (a 50,000-group
//! synonym import, a 100,000-row filing spreadsheet) took a core for seconds and the searches beside it waited for
//! CPU (p99 1.7× the quiet p99 on two cores): no lock was held, the CPU itself was the queue. Such work runs at a
//! lower priority (Linux's nice value): it takes the CPU searches leave idle and waits while they need it.

/// The nice value long writes run at: under full load a thread at 10 gets about a tenth of a thread at 0's share.
pub const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`BACKGROUND_NICE`] (Linux keeps a nice value per thread, and
/// threads started afterwards inherit it). An unprivileged process cannot raise it again, so this is for a thread
/// of its own ([`in_background`]) or a command-line process that ends with the work. A process already running
/// lower keeps its priority; a failure only leaves the priority as it was.
pub fn lower_this_thread() {
    lower_this_thread_to(BACKGROUND_NICE);
}

/// Lowers the calling thread's CPU priority to `nice` (`[background] nice` for the scheduler's lanes and document
/// embedding); 0 or a value the thread is already at or below changes nothing.
pub fn lower_this_thread_to(nice: i32) {
    let now = rustix::process::getpriority_process(None).unwrap_or(0);
    if now < nice
        && let Err(e) = rustix::process::setpriority_process(None, nice)
    {
        tracing::debug!(error = %e, "cannot lower the CPU priority of background work");
    }
}

/// Runs `work` on a thread of its own at [`BACKGROUND_NICE`] and returns what it returns (a panic in it panics
/// here). Should no thread start, it runs on the caller's, at the caller's priority.
pub fn in_background<R: Send, F: FnOnce() -> R + Send>(work: F) -> R {
    let work = std::sync::Mutex::new(Some(work));
    let run = || {
        let w = work.lock().unwrap_or_else(|p| p.into_inner()).take();
        w.map(|w| w())
    };
    std::thread::scope(|s| {
        let lowered = std::thread::Builder::new().name("care-background".into()).spawn_scoped(s, || {
            lower_this_thread();
            run()
        });
        match lowered {
            Ok(t) => t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(_) => run(),
        }
    })
    .expect("the work runs once")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_work_runs_lower_and_the_caller_keeps_its_priority() {
        let before = rustix::process::getpriority_process(None).unwrap();
        let inside = in_background(|| rustix::process::getpriority_process(None).unwrap());
        assert_eq!(inside, before.max(BACKGROUND_NICE));
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), before, "only the work's thread was lowered");
        let panicked = std::panic::catch_unwind(|| in_background(|| panic!("boom")));
        assert!(panicked.is_err(), "a panic in the work reaches the caller");
    }
}
