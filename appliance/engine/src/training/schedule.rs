//! Training schedules, kept in SQLite: "every Sunday 02:00" (hospital local time, `[training] utc_offset_minutes`),
//! "when ≥ N new feedback judgments", or both. The scheduler's timer lane fires them
//! ([`fire_due_schedules`]) at their due time and whenever something changes (new feedback, a run ending).
//!
//! A time trigger stores its next due instant. When the appliance was down past it, the first check after the start
//! finds it overdue and fires once (not once per missed week), then moves it to the next occurrence after now. A
//! schedule that comes due while a run is queued or running waits until that run ends: runs never overlap.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime, UtcOffset};

use super::Recipe;
use crate::accounts::{Actor, Admin};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::store::now;

/// What an admin sets.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleSpec {
    /// 0 = Monday … 6 = Sunday; `None` with a time = every day.
    #[serde(default)]
    pub weekday: Option<u8>,
    /// "HH:MM", local time; `None` = no time trigger.
    #[serde(default)]
    pub time: Option<String>,
    /// Fire when at least this many feedback judgments arrived since the last run of this schedule.
    #[serde(default)]
    pub min_new_feedback: Option<u32>,
    #[serde(default)]
    pub recipe: Recipe,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Serialize)]
pub struct Schedule {
    pub id: i64,
    #[serde(flatten)]
    pub spec: ScheduleSpec,
    /// Next time trigger, UTC (RFC 3339); empty without a time trigger.
    pub next_due: String,
    pub last_fired_at: String,
    pub last_job: Option<i64>,
    /// Feedback judgments since the last run of this schedule.
    pub new_feedback: i64,
    pub created_by: String,
}

/// Minutes after local midnight of "HH:MM".
pub(crate) fn parse_time(t: &str) -> Result<u32> {
    let bad = || Error::InvalidInput(format!("时间格式应为 HH:MM (time {t:?}: expected HH:MM, 00:00–23:59)"));
    let (h, m) = t.trim().split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

/// The first instant strictly after `after` that falls on `weekday` (any day when `None`) at `minute` local time.
pub fn next_occurrence(weekday: Option<u8>, minute: u32, offset: UtcOffset, after: OffsetDateTime) -> OffsetDateTime {
    let local = after.to_offset(offset);
    let midnight = local.replace_time(time::Time::MIDNIGHT);
    let at = |days: i64| midnight + Duration::days(days) + Duration::minutes(i64::from(minute));
    (0..=7)
        .map(at)
        .find(|t| *t > local && weekday.is_none_or(|w| t.weekday().number_days_from_monday() == w))
        .unwrap_or_else(|| at(7))
        .to_offset(UtcOffset::UTC)
}

pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

pub(crate) fn parse_rfc3339(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
}

/// The hospital's time zone as schedules read "HH:MM" (`[training] utc_offset_minutes`).
pub(crate) fn hospital_offset(cfg: &crate::config::EngineConfig) -> UtcOffset {
    UtcOffset::from_whole_seconds(cfg.training.utc_offset_minutes.clamp(-1080, 1080) * 60).unwrap_or(UtcOffset::UTC)
}

impl ScheduleSpec {
    fn check(&self) -> Result<Option<u32>> {
        self.recipe.check()?;
        if self.weekday.is_some_and(|w| w > 6) {
            return Err(Error::InvalidInput("星期应为 0（周一）到 6（周日） (weekday must be 0–6)".into()));
        }
        let minute = self.time.as_deref().filter(|t| !t.trim().is_empty()).map(parse_time).transpose()?;
        if minute.is_none() && self.min_new_feedback.is_none() {
            return Err(Error::InvalidInput(
                "计划至少需要一个触发条件：时间或新反馈数量 (a schedule needs a time or a feedback threshold)".into(),
            ));
        }
        if self.weekday.is_some() && minute.is_none() {
            return Err(Error::InvalidInput("设置了星期就需要时间 (a weekday needs a time)".into()));
        }
        if self.min_new_feedback.is_some_and(|n| n == 0 || n > 1_000_000) {
            return Err(Error::InvalidInput("新反馈数量应为 1–1000000 (min_new_feedback must be 1–1000000)".into()));
        }
        Ok(minute)
    }
}

fn offset(engine: &Engine) -> UtcOffset {
    hospital_offset(&engine.cfg)
}

/// Submits a run for the first enabled schedule (oldest first) that is due at `at`, unless a run is queued or
/// running. Returns the job submitted, if any. Called by the scheduler's timer lane whenever something changes
/// and at each schedule's due time.
pub(crate) fn fire_due_schedules(engine: &Engine, at: OffsetDateTime) -> Result<Option<i64>> {
    if super::unfinished_run(&engine.store.reader())?.is_some() {
        return Ok(None);
    }
    for s in engine.training().schedules(&Admin::system())? {
        let time_due = parse_rfc3339(&s.next_due).is_some_and(|t| t <= at);
        let feedback_due = s.spec.min_new_feedback.is_some_and(|n| s.new_feedback >= i64::from(n));
        if !s.spec.enabled || !(time_due || feedback_due) {
            continue;
        }
        // Outside the transaction: these checks start `care-train --version` and read the disk.
        let prepared = crate::training::prepare_training(engine, &s.spec.recipe, Some(s.id));
        if let Some(job) = fire_schedule(engine, &s, prepared, at)? {
            engine.queue().tasks_changed();
            return Ok(Some(job));
        }
    }
    Ok(None)
}

/// Fires schedule `s` in ONE transaction: the queued run with its audit record (or, when the run could not be
/// prepared, the audited failure) and the schedule's next due time, so a crash leaves either all or nothing
/// and a restart neither loses nor repeats the firing. Returns the run's job, if one was queued.
fn fire_schedule(
    engine: &Engine,
    s: &Schedule,
    prepared: Result<(super::TrainParams, String)>,
    at: OffsetDateTime,
) -> Result<Option<i64>> {
    let minute = s.spec.time.as_deref().and_then(|t| parse_time(t).ok());
    let next = minute.map(|m| rfc3339(next_occurrence(s.spec.weekday, m, offset(engine), at)));
    let mut conn = engine.store.conn();
    let tx = conn.transaction()?;
    // Still as it was read: otherwise another firing got here first.
    let unchanged: bool = tx
        .query_row(
            "SELECT next_due = ?2 AND last_fired_at = ?3 FROM training_schedules WHERE id = ?1",
            params![s.id, s.next_due, s.last_fired_at],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(false);
    if !unchanged {
        return Ok(None);
    }
    let job = match prepared {
        Ok((p, device)) => {
            match super::insert_training(&tx, &Actor::console(format!("schedule:{}", s.id)), &p, &device) {
                Ok(job) => Some(job),
                // A run was queued meanwhile: the schedule stays due and fires when that run ends.
                Err(Error::Busy(_)) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Err(e) => {
            // Not retried at every wake-up: the failure is recorded and the schedule moves to its next time.
            tracing::warn!(schedule = s.id, error = %e, "scheduled training could not start");
            let detail = serde_json::json!({"schedule": s.id, "error": e.to_string()});
            crate::audit::append(&tx, &Actor::system().name, "training.schedule_failed", &detail)?;
            None
        }
    };
    tx.execute(
        "UPDATE training_schedules SET next_due = ?2, last_fired_at = ?3, last_job = ?4,
                feedback_mark = (SELECT ifnull(max(id), 0) FROM feedback) WHERE id = ?1",
        params![s.id, next.unwrap_or_default(), rfc3339(at), job],
    )?;
    tx.commit()?;
    Ok(job)
}

/// The earliest time trigger after `now` of an enabled schedule, as an instant for the timer lane to wake at.
/// Triggers already past are left out: they wait for the run that blocks them, whose end wakes the lane.
pub(crate) fn next_schedule_due(engine: &Engine, now: OffsetDateTime) -> Result<Option<std::time::Instant>> {
    let next = engine
        .training()
        .schedules(&Admin::system())?
        .into_iter()
        .filter(|s| s.spec.enabled)
        .filter_map(|s| parse_rfc3339(&s.next_due))
        .filter(|t| *t > now)
        .min();
    Ok(next.map(|t| {
        let wait = std::time::Duration::try_from(t - now).unwrap_or_default();
        std::time::Instant::now() + wait
    }))
}

impl crate::engine::Training<'_> {
    /// Creates a schedule (`id = None`) or replaces one, audited in the same transaction.
    pub fn set_schedule(&self, actor: &Admin, id: Option<i64>, spec: &ScheduleSpec) -> Result<i64> {
        let minute = spec.check()?;
        let next =
            minute.map(|m| rfc3339(next_occurrence(spec.weekday, m, offset(self.engine), OffsetDateTime::now_utc())));
        let json = serde_json::to_string(spec).map_err(|e| Error::Internal(e.to_string()))?;
        let mut conn = self.engine.store.conn();
        let tx = conn.transaction()?;
        let mark: i64 = tx.query_row("SELECT ifnull(max(id), 0) FROM feedback", [], |r| r.get(0))?;
        let id = match id {
            Some(id) => {
                let n = tx.execute(
                    "UPDATE training_schedules SET spec = ?2, next_due = ?3 WHERE id = ?1",
                    params![id, json, next.clone().unwrap_or_default()],
                )?;
                if n == 0 {
                    return Err(Error::NotFound { what: format!("训练计划 #{id}") });
                }
                id
            }
            None => {
                // Each schedule can start a training run; [limits] max_schedules bounds how many exist.
                let cap = self.engine.cfg.limits.max_schedules.max(1);
                let n: i64 = tx.query_row("SELECT COUNT(*) FROM training_schedules", [], |r| r.get(0))?;
                if n as usize >= cap {
                    return Err(Error::LimitReached(format!(
                        "训练计划已达上限 {cap} 个；请先删除不再需要的计划（care.toml 的 [limits] max_schedules）(too many schedules)"
                    )));
                }
                tx.execute(
                    "INSERT INTO training_schedules (spec, next_due, feedback_mark, created_by, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![json, next.clone().unwrap_or_default(), mark, actor.name, now()],
                )?;
                tx.last_insert_rowid()
            }
        };
        crate::audit::append(
            &tx,
            &actor.name,
            "training.schedule_set",
            &serde_json::json!({"schedule": id, "spec": spec, "next_due": next}),
        )?;
        tx.commit()?;
        // The timer lane sleeps until the earliest due time it knew of.
        self.engine.queue().tasks_changed();
        Ok(id)
    }

    pub fn delete_schedule(&self, actor: &Admin, id: i64) -> Result<()> {
        let mut conn = self.engine.store.conn();
        let tx = conn.transaction()?;
        if tx.execute("DELETE FROM training_schedules WHERE id = ?1", [id])? == 0 {
            return Err(Error::NotFound { what: format!("训练计划 #{id}") });
        }
        crate::audit::append(&tx, &actor.name, "training.schedule_delete", &serde_json::json!({"schedule": id}))?;
        tx.commit()?;
        self.engine.queue().tasks_changed();
        Ok(())
    }

    pub fn schedules(&self, _admin: &Admin) -> Result<Vec<Schedule>> {
        let conn = self.engine.store.reader();
        // New feedback counts each user's rows only up to `[limits] max_feedback_per_user`, as training and the
        // evaluation gate do: one clinician clicking 有帮助 a thousand times cannot start a run alone.
        let mut stmt = conn.prepare(
            "SELECT s.id, s.spec, s.next_due, s.last_fired_at, s.last_job, s.created_by,
                    (SELECT ifnull(sum(min(n, ?1)), 0) FROM
                        (SELECT count(*) AS n FROM feedback f WHERE f.id > s.feedback_mark GROUP BY f.username))
             FROM training_schedules s ORDER BY s.id",
        )?;
        let cap = i64::from(self.engine.cfg.limits.max_feedback_per_user);
        let rows = stmt.query_map([cap], |r| {
            let spec: String = r.get(1)?;
            Ok((r.get(0)?, spec, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, spec, next_due, last_fired_at, last_job, created_by, new_feedback) = row?;
            let spec: ScheduleSpec = serde_json::from_str(&spec)
                .map_err(|e| Error::Internal(format!("training schedule {id}: unreadable spec: {e}")))?;
            out.push(Schedule { id, spec, next_due, last_fired_at, last_job, new_feedback, created_by });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn next_sunday_two_am_in_beijing() {
        let cst = UtcOffset::from_hms(8, 0, 0).unwrap();
        // Wednesday 2026-11-25 10:00 UTC = 18:00 CST; next Sunday 02:00 CST is 2026-11-29, = Saturday 18:00 UTC.
        let t = next_occurrence(Some(6), 120, cst, datetime!(2026-11-25 10:00 UTC));
        assert_eq!(t, datetime!(2026-11-28 18:00 UTC));
        // Exactly at the occurrence: the next one is a week later.
        assert_eq!(next_occurrence(Some(6), 120, cst, t), datetime!(2026-12-05 18:00 UTC));
        // Every day at 02:00 CST, asked at 17:59 UTC (01:59 CST): one minute later.
        assert_eq!(next_occurrence(None, 120, cst, datetime!(2026-11-25 17:59 UTC)), datetime!(2026-11-25 18:00 UTC));
    }

    #[test]
    fn specs_are_checked() {
        let ok = ScheduleSpec {
            weekday: Some(6),
            time: Some("02:00".into()),
            min_new_feedback: None,
            recipe: Recipe::default(),
            enabled: true,
        };
        assert_eq!(ok.check().unwrap(), Some(120));
        for bad in [
            ScheduleSpec { time: Some("25:00".into()), ..ok.clone() },
            ScheduleSpec { weekday: Some(7), ..ok.clone() },
            ScheduleSpec { time: None, min_new_feedback: None, ..ok.clone() },
            ScheduleSpec { time: None, weekday: Some(1), min_new_feedback: Some(5), ..ok.clone() },
            ScheduleSpec { min_new_feedback: Some(0), ..ok.clone() },
        ] {
            assert_eq!(bad.check().unwrap_err().code(), crate::ErrorCode::InvalidInput, "{bad:?}");
        }
    }
}
