//! Password hashing on a fixed pool of threads that keep their argon2 memory.
//!
//! argon2id (m = 19 MiB, t = 2) run on whichever thread asked left that thread's allocator arena holding the 19 MiB
//! after the hash: 60 concurrent anonymous sign-ins took the server from 967 MB to 2 GB, and it stayed (a bound on
//! how many hashes run at once held CPU, not memory). Here a fixed number of threads each own one block buffer for
//! the life of the process, so hashing memory is `workers × 19 MiB` however many sign-ins arrive; the rest wait in a
//! bounded queue, and beyond the queue a sign-in is refused at once (`overloaded`, 503) instead of piling up.
//!
//! The pool takes at most half the cores (one on a 2-core machine, two at most): a burst of sign-ins at a shift
//! change must not take the CPU searches run on.

use std::sync::mpsc::{self, TrySendError};
use std::sync::{Arc, LazyLock, Mutex};

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};

use crate::error::{Error, Result};

/// Sign-ins allowed to wait for a hashing thread. A waiting request holds a blocked thread, not argon2 memory; at
/// ~40 ms a hash, one worker clears it in about 10 s; a sign-in that would wait longer is told to try again.
const QUEUE: usize = 256;

/// The most memory a stored hash may ask for (64 MiB). Ours ask for 19 MiB; a hash imported with a larger cost is
/// refused instead of making a thread grow its buffer past the bound.
const MAX_BLOCKS: usize = 64 * 1024;

/// A hash of no password, with our parameters: checked against when the name is unknown, so that the time taken
/// does not tell which names exist. Its output matches no password (it is all zeros); only its cost matters.
pub(super) const DUMMY_PHC: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$bm90IGEgcmVhbCBzYWx0IQ$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

type Job = Box<dyn FnOnce(&mut Vec<Block>) + Send>;

/// Password hashes computed since the process started (sign-ins, password checks and changes): `/metrics` shows it,
/// so a flood's cost can be read from outside.
static COMPUTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn computed() -> u64 {
    COMPUTED.load(std::sync::atomic::Ordering::Relaxed)
}

struct Pool {
    jobs: mpsc::SyncSender<Job>,
}

fn workers() -> usize {
    (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).clamp(1, 2)
}

static POOL: LazyLock<Pool> = LazyLock::new(|| Pool::new(workers(), QUEUE));

impl Pool {
    fn new(workers: usize, queue: usize) -> Pool {
        let (jobs, rx) = mpsc::sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let rx = Arc::clone(&rx);
            let spawned = std::thread::Builder::new().name(format!("care-argon2-{i}")).spawn(move || {
                // Grown to the first hash's size and kept: the point of the pool.
                let mut memory: Vec<Block> = Vec::new();
                loop {
                    let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    };
                    // A panic drops the job's answer channel (its caller gets an internal error); the thread lives.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut memory)));
                }
            });
            if let Err(e) = spawned {
                tracing::error!("cannot start password hashing thread: {e}");
            }
        }
        Pool { jobs }
    }

    /// Runs `f` on a hashing thread with its block buffer, waiting for a turn in the bounded queue.
    fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut Vec<Block>) -> T + Send + 'static) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |memory| {
            let _ = tx.send(f(memory));
        });
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(Error::Overloaded("登录请求过多，请稍后再试 (too many sign-ins at once)".into()));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(Error::Internal("password hashing threads stopped".into()));
            }
        }
        rx.recv().map_err(|_| Error::Internal("password hashing failed on its thread".into()))
    }
}

/// `n` blocks of the thread's buffer, grown (never shrunk) when a hash needs more.
fn blocks(memory: &mut Vec<Block>, n: usize) -> &mut [Block] {
    if memory.len() < n {
        memory.resize(n, Block::default());
    }
    &mut memory[..n]
}

/// A new argon2id PHC string for `password` (default parameters, random salt).
pub(super) fn hash(password: &str) -> Result<String> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| Error::Internal(format!("OS random source: {e}")))?;
    let password = password.to_owned();
    POOL.run(move |memory| hash_with(memory, password.as_bytes(), &salt))?
}

fn hash_with(memory: &mut Vec<Block>, password: &[u8], salt: &[u8]) -> Result<String> {
    let internal = |e: &dyn std::fmt::Display| Error::Internal(format!("argon2: {e}"));
    let params = Params::default();
    let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
    let memory = blocks(memory, params.block_count());
    COMPUTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone())
        .hash_password_into_with_memory(password, salt, &mut out, memory)
        .map_err(|e| internal(&e))?;
    let salt = SaltString::encode_b64(salt).map_err(|e| internal(&e))?;
    let phc = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params).map_err(|e| internal(&e))?,
        salt: Some(salt.as_salt()),
        hash: Some(Output::new(&out).map_err(|e| internal(&e))?),
    };
    Ok(phc.to_string())
}

/// Whether `password` matches the PHC string `phc` (any argon2 variant and cost up to [`MAX_BLOCKS`]); a string
/// that is no argon2 hash matches nothing.
pub(super) fn verify(password: &str, phc: &str) -> Result<bool> {
    let (password, phc) = (password.to_owned(), phc.to_owned());
    POOL.run(move |memory| verify_with(memory, password.as_bytes(), &phc))
}

fn verify_with(memory: &mut Vec<Block>, password: &[u8], phc: &str) -> bool {
    let Ok(h) = PasswordHash::new(phc) else { return false };
    let (Ok(algorithm), Ok(params), Some(salt), Some(expected)) =
        (Algorithm::try_from(h.algorithm), Params::try_from(&h), h.salt, h.hash)
    else {
        return false;
    };
    let version = match h.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let n = params.block_count();
    let mut salt_buf = [0u8; 64];
    let (true, Ok(salt)) = (n <= MAX_BLOCKS, salt.decode_b64(&mut salt_buf)) else { return false };
    let mut out = vec![0u8; expected.len()];
    COMPUTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Argon2::new(algorithm, version, params)
        .hash_password_into_with_memory(password, salt, &mut out, blocks(memory, n))
        .is_ok()
        // Output's equality is constant-time.
        && Output::new(&out).is_ok_and(|o| o == expected)
}

#[cfg(test)]
mod tests {
    use argon2::password_hash::{PasswordHasher, PasswordVerifier, SaltString};

    use super::*;

    #[test]
    fn pool_hashes_verify_like_the_argon2_crate_and_back() {
        let ours = hash("correct horse 电池").unwrap();
        assert!(ours.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{ours}");
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(Argon2::default().verify_password("correct horse 电池".as_bytes(), &parsed).is_ok());
        assert!(verify("correct horse 电池", &ours).unwrap());
        assert!(!verify("correct horse 电 池", &ours).unwrap());
        // Hashes stored before the pool (the crate's own encoder) still verify.
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let theirs = Argon2::default().hash_password(b"old password", &salt).unwrap().to_string();
        assert!(verify("old password", &theirs).unwrap());
        assert!(!verify("old passwore", &theirs).unwrap());
        // Other variants and costs the crate writes verify too; a cost past the bound or garbage matches nothing.
        let small = Params::new(1024, 1, 1, None).unwrap();
        let argon2i = Argon2::new(Algorithm::Argon2i, Version::V0x10, small).hash_password(b"p", &salt).unwrap();
        assert!(verify("p", &argon2i.to_string()).unwrap());
        let huge = Params::new(128 * 1024, 1, 1, None).unwrap();
        let big = Argon2::new(Algorithm::Argon2id, Version::V0x13, huge).hash_password(b"p", &salt).unwrap();
        assert!(!verify("p", &big.to_string()).unwrap(), "128 MiB is past the bound");
        for junk in ["", "plain", "$argon2id$v=19$m=19456,t=2,p=1$", "$bcrypt$xyz"] {
            assert!(!verify("p", junk).unwrap(), "{junk}");
        }
    }

    #[test]
    fn the_dummy_costs_what_a_real_hash_costs_and_matches_nothing() {
        let dummy = PasswordHash::new(DUMMY_PHC).unwrap();
        let (p, d) = (Params::try_from(&dummy).unwrap(), Params::default());
        assert_eq!((p.m_cost(), p.t_cost(), p.p_cost()), (d.m_cost(), d.t_cost(), d.p_cost()));
        assert_eq!(p.output_len(), Some(Params::DEFAULT_OUTPUT_LEN));
        assert_eq!(dummy.algorithm, Algorithm::Argon2id.ident());
        assert!(!verify("", DUMMY_PHC).unwrap());
        assert!(!verify("not a real password", DUMMY_PHC).unwrap());
    }

    #[test]
    fn concurrent_callers_share_the_fixed_threads() {
        let phc = hash("p").unwrap();
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let phc = phc.clone();
                std::thread::spawn(move || verify(if i % 2 == 0 { "p" } else { "q" }, &phc).unwrap())
            })
            .collect();
        let ok: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(ok, (0..16).map(|i| i % 2 == 0).collect::<Vec<_>>());
        // Whoever asks, the work runs on the pool's own threads (whose buffers are the bound).
        let names: std::collections::BTreeSet<String> = (0..8)
            .map(|_| std::thread::spawn(|| POOL.run(|_| std::thread::current().name().unwrap().to_string()).unwrap()))
            .map(|h| h.join().unwrap())
            .collect();
        assert!(names.len() <= workers() && workers() <= 2, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("care-argon2-")), "{names:?}");
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_the_workers_bound_what_runs() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pool = Arc::new(Pool::new(1, 3));
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let spawn = |_| {
            let (pool, now, peak) = (pool.clone(), now.clone(), peak.clone());
            std::thread::spawn(move || {
                pool.run(move |memory| {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    let at = blocks(memory, 1024).as_ptr() as usize;
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    now.fetch_sub(1, Ordering::SeqCst);
                    at
                })
            })
        };
        // The first job is running before the rest arrive, so one runs and three wait, whatever the timing.
        let mut threads = vec![spawn(0)];
        while peak.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        threads.extend((1..12).map(spawn));
        let results: Vec<Result<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let refused = results.iter().filter(|r| matches!(r, Err(Error::Overloaded(_)))).count();
        assert_eq!(peak.load(Ordering::SeqCst), 1, "one worker runs one job at a time");
        assert!(refused >= 1, "twelve at once overflow a queue of three");
        assert!(results.len() - refused >= 4, "the running and the queued ones all ran: {refused} refused");
        let buffers: std::collections::BTreeSet<&usize> = results.iter().flatten().collect();
        assert_eq!(buffers.len(), 1, "every job ran in the worker's one buffer, never a new allocation");
        assert_eq!(Error::Overloaded(String::new()).code(), crate::ErrorCode::Overloaded);
    }
}
