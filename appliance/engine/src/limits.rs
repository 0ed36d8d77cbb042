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
    /// Failed sign-ins and current-password checks per client address.
    pub sign_in_failures: RateLimiter,
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

    /// Seconds until `key` may act again when its window is full at `now`, else `None`. Counts nothing.
    pub fn blocked(&self, key: &str, limit: u32, window_seconds: i64, now: i64) -> Option<i64> {
        let w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        match w.get(key) {
            Some(&(start, n)) if now < start + window_seconds && n >= limit.max(1) => {
                Some(start + window_seconds - now)
            }
            _ => None,
        }
    }

    /// Counts one event of `key` at `now`; returns the events in its window, this one included.
    pub fn hit(&self, key: &str, window_seconds: i64, now: i64) -> u32 {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        Self::count(&mut w, key, window_seconds, now)
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

    /// Keys tracked now (for tests and the memory bound).
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        assert_eq!(l.blocked("a", 3, 60, 1010), Some(50));
        assert_eq!(l.blocked("b", 3, 60, 1010), None, "keys are independent");
        assert_eq!(l.admit("a", 3, 60, 1060), Ok(1), "a new window");
        assert_eq!(l.blocked("a", 3, 60, 1060), None);
    }

    #[test]
    fn memory_is_bounded_under_a_flood_of_keys() {
        let l = RateLimiter::new();
        for i in 0..(MAX_KEYS + 1000) {
            l.hit(&format!("k{i}"), 60, 1000);
        }
        assert_eq!(l.len(), MAX_KEYS);
        // Expired windows are dropped first.
        l.hit("late", 60, 10_000_000);
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
