//! In-memory rate limits: a fixed-window counter per key (a client address, a user), bounded in memory.
//!
//! They live in the serving process and not in SQLite on purpose: what they count (failed sign-ins per address,
//! feedback per user, refused requests worth an audit record) arrives in floods, and a write per event is the
//! cost they exist to bound. A restart forgets them, which only ever makes a limit more lenient for one window.

use std::collections::HashMap;
use std::sync::Mutex;

/// Keys tracked at most. Beyond it the oldest window is dropped, so a flood of fresh keys (an attacker rotating
/// addresses) costs bounded memory; it can only reset other keys' counters, never lock anyone out.
const MAX_KEYS: usize = 65_536;

/// The limits one store keeps.
#[derive(Debug, Default)]
pub struct Limits {
    /// Failed sign-ins and current-password checks per client address, each counted before its password is
    /// checked and taken back when it succeeds: concurrent attempts cannot pass the limit together.
    pub sign_in_failures: RateLimiter,
    /// Password checks running now per account name: guesses at one name from many addresses wait their turn
    /// instead of all passing the lockout check before the first failure is counted.
    pub sign_ins_by_name: InFlight,
    /// Feedback per user.
    pub feedback: RateLimiter,
    /// Audit records of refused requests, per client address and in all.
    pub refusals: RateLimiter,
}

/// Counts events per key in fixed windows of `window_seconds`; `limit` events fill a window.
#[derive(Debug)]
pub struct RateLimiter {
    /// key → (start of its window, events counted in it)
    windows: Mutex<HashMap<String, (i64, u32)>>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimiter {
    pub fn new() -> Self {
        RateLimiter { windows: Mutex::new(HashMap::new()) }
    }

    fn count(w: &mut HashMap<String, (i64, u32)>, key: &str, window_seconds: i64, now: i64) -> u32 {
        if !w.contains_key(key) && w.len() >= MAX_KEYS {
            w.retain(|_, &mut (start, _)| now < start + window_seconds);
            if w.len() >= MAX_KEYS
                && let Some(oldest) = w.iter().min_by_key(|(_, (start, _))| *start).map(|(k, _)| k.clone())
            {
                w.remove(&oldest);
            }
        }
        let e = w.entry(key.to_string()).or_insert((now, 0));
        if now >= e.0 + window_seconds {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
        e.1
    }

    /// Counts one event unless the window is already full: `Ok(events so far)` or `Err(seconds to wait)`.
    pub fn admit(&self, key: &str, limit: u32, window_seconds: i64, now: i64) -> Result<u32, i64> {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(start, n)) = w.get(key)
            && now < start + window_seconds
            && n >= limit.max(1)
        {
            return Err(start + window_seconds - now);
        }
        Ok(Self::count(&mut w, key, window_seconds, now))
    }

    /// Takes back one event of `key` counted by [`Self::admit`] (an attempt that turned out not to count).
    pub fn undo(&self, key: &str) {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = w.get_mut(key) {
            e.1 = e.1.saturating_sub(1);
        }
    }

    /// Keys tracked now (for tests and the memory bound).
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Operations running now per key, at most `limit` each, the next ones waiting their turn: a key is tracked only
/// while one runs or waits, so memory follows the requests in flight (themselves bounded by the queues in front).
#[derive(Debug, Default)]
pub struct InFlight {
    /// key → (running, waiting)
    running: Mutex<HashMap<String, (u32, u32)>>,
    turn: std::sync::Condvar,
}

/// One admitted operation; leaving counts it out and lets the next one of its key in.
#[derive(Debug)]
pub struct Running<'a> {
    of: &'a InFlight,
    key: String,
}

impl InFlight {
    /// Admits one more operation of `key` once fewer than `limit` run, waiting for that; `None` at once when
    /// `max_waiting` already wait.
    pub fn enter(&self, key: &str, limit: u32, max_waiting: u32) -> Option<Running<'_>> {
        let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let e = r.entry(key.to_string()).or_insert((0, 0));
        if e.0 >= limit.max(1) {
            if e.1 >= max_waiting {
                return None;
            }
            e.1 += 1;
            while r.get(key).is_some_and(|e| e.0 >= limit.max(1)) {
                r = self.turn.wait(r).unwrap_or_else(|p| p.into_inner());
            }
            r.entry(key.to_string()).or_insert((0, 1)).1 -= 1;
        }
        r.entry(key.to_string()).or_insert((0, 0)).0 += 1;
        Some(Running { of: self, key: key.to_string() })
    }

    /// Keys with an operation running or waiting now.
    pub fn len(&self) -> usize {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut r = self.of.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = r.get_mut(&self.key) {
            e.0 -= 1;
            if *e == (0, 0) {
                r.remove(&self.key);
            }
        }
        drop(r);
        self.of.turn.notify_all();
    }
}

/// The key a client address is limited under: an IPv6 address by its /64 (one host or household is handed a whole
/// /64, so counting single addresses would let it rotate past the limit), an IPv4-mapped IPv6 address as IPv4,
/// anything that is no address (a test's label, an empty peer) as itself.
pub fn address_key(client: &str) -> String {
    match client.trim().parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => a.to_string(),
        Ok(std::net::IpAddr::V6(a)) => match a.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = a.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        Err(_) => client.chars().take(64).collect(),
    }
}

/// "N 分钟" (rounded up) for a wait in seconds, as refusals tell it.
pub fn minutes_zh(seconds: i64) -> String {
    format!("{} 分钟", ((seconds.max(1) + 59) / 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_fill_refuse_and_reopen() {
        let l = RateLimiter::new();
        for i in 1..=3 {
            assert_eq!(l.admit("a", 3, 60, 1000), Ok(i));
        }
        assert_eq!(l.admit("a", 3, 60, 1010), Err(50));
        assert_eq!(l.admit("a", 3, 60, 1010), Err(50), "a refusal counts nothing");
        assert_eq!(l.admit("b", 3, 60, 1010), Ok(1), "keys are independent");
        assert_eq!(l.admit("a", 3, 60, 1060), Ok(1), "a new window");
        assert_eq!(l.admit("a", 3, 60, 1060), Ok(2));
    }

    #[test]
    fn undone_events_reopen_the_window_and_in_flight_keys_leave() {
        let l = RateLimiter::new();
        assert_eq!(l.admit("a", 2, 60, 1000), Ok(1));
        assert_eq!(l.admit("a", 2, 60, 1000), Ok(2));
        assert!(l.admit("a", 2, 60, 1000).is_err());
        l.undo("a");
        assert_eq!(l.admit("a", 2, 60, 1000), Ok(2));
        let f = InFlight::default();
        let one = f.enter("x", 2, 0).unwrap();
        let two = f.enter("x", 2, 0).unwrap();
        assert!(f.enter("x", 2, 0).is_none(), "a third at once is refused when none may wait");
        assert!(f.enter("y", 2, 0).is_some(), "names are independent");
        drop(one);
        let three = f.enter("x", 2, 0).unwrap();
        // With room to wait, a third waits for a turn instead.
        std::thread::scope(|sc| {
            let waiter = sc.spawn(|| f.enter("x", 2, 1).map(drop).is_some());
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(f.enter("x", 2, 1).is_none(), "the one waiting place is taken");
            drop(two);
            assert!(waiter.join().unwrap(), "the waiter got its turn");
        });
        drop(three);
        assert!(f.is_empty(), "nothing is kept once nothing runs");
    }

    #[test]
    fn memory_is_bounded_under_a_flood_of_keys() {
        let l = RateLimiter::new();
        for i in 0..(MAX_KEYS + 1000) {
            l.admit(&format!("k{i}"), u32::MAX, 60, 1000).unwrap();
        }
        assert_eq!(l.len(), MAX_KEYS);
        // Expired windows are dropped first.
        l.admit("late", u32::MAX, 60, 10_000_000).unwrap();
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn addresses_are_keyed_by_host_or_ipv6_prefix() {
        assert_eq!(address_key("10.1.2.3"), "10.1.2.3");
        assert_eq!(address_key("::ffff:10.1.2.3"), "10.1.2.3");
        assert_eq!(address_key("2001:db8:1:2::5"), address_key("2001:db8:1:2:ffff::9"));
        assert_ne!(address_key("2001:db8:1:2::5"), address_key("2001:db8:1:3::5"));
        assert_eq!(address_key("test"), "test");
        assert_eq!(minutes_zh(61), "2 分钟");
    }
}
