//! Times as people read them: stored times are UTC RFC 3339 (sortable, unambiguous in the audit chain); pages show
//! them in the hospital's time (`[training] utc_offset_minutes`, 480 = China Standard Time) as
//! `2026-11-28 10:41`, set once when the engine opens.

use std::sync::atomic::{AtomicI32, Ordering};

static OFFSET_MINUTES: AtomicI32 = AtomicI32::new(480);

pub(crate) fn set_offset_minutes(m: i32) {
    OFFSET_MINUTES.store(m.clamp(-14 * 60, 14 * 60), Ordering::Relaxed);
}

/// `2026-11-28T02:41:26Z` → `2026-11-28 10:41:26` in the hospital's time; anything unreadable as it was.
pub fn local(stored: impl AsRef<str>) -> String {
    let stored = stored.as_ref();
    let fmt = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    let offset = time::UtcOffset::from_whole_seconds(OFFSET_MINUTES.load(Ordering::Relaxed) * 60)
        .unwrap_or(time::UtcOffset::UTC);
    time::OffsetDateTime::parse(stored.trim(), &time::format_description::well_known::Rfc3339)
        .ok()
        .and_then(|t| t.to_offset(offset).format(&fmt).ok())
        .unwrap_or_else(|| stored.to_string())
}

/// The hospital's time zone as a page states it beside the times it shows (`UTC+8`).
pub fn zone() -> String {
    offset_label(OFFSET_MINUTES.load(Ordering::Relaxed))
}

/// `UTC+8`, `UTC-3:30`: the offset pages show times at (`docview::local_time`, [`local`]).
pub fn offset_label(offset_minutes: i32) -> String {
    let m = offset_minutes.clamp(-1080, 1080);
    let sign = if m < 0 { '-' } else { '+' };
    let (h, mm) = (m.abs() / 60, m.abs() % 60);
    if mm == 0 { format!("UTC{sign}{h}") } else { format!("UTC{sign}{h}:{mm:02}") }
}

/// Unix seconds the same way.
pub fn local_unix(ts: i64) -> String {
    local(utc_unix(ts))
}

/// Unix seconds as a stored time is written (UTC, RFC 3339); a number out of range as the number.
pub fn utc_unix(ts: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ts)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| ts.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_reads_in_the_hospital_time() {
        super::set_offset_minutes(480);
        assert_eq!(super::local("2026-11-28T20:41:26Z"), "2026-11-29 04:41:26");
        assert_eq!(super::local("2026-11-28T02:41:26.123+00:00"), "2026-11-28 10:41:26");
        assert_eq!(super::local("not a time"), "not a time");
    }
}
