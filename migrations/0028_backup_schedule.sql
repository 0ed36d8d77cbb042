-- 0028: the backup schedule, target folder and retention an administrator sets on the console (设置 → 备份), over
-- care.toml's [backup]. One row. A NULL column is care.toml's value; `time` '' is "no scheduled backup".
-- `next_due` is the next run (UTC, RFC 3339) as computed for the time in `due_for`: a changed time recomputes it,
-- and a run missed while the appliance was down is made once at the next start, then the schedule moves on.
CREATE TABLE backup_schedule (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    time TEXT,
    dir TEXT,
    keep_daily INTEGER,
    keep_weekly INTEGER,
    next_due TEXT NOT NULL DEFAULT '',
    due_for TEXT NOT NULL DEFAULT '',
    last_fired_at TEXT NOT NULL DEFAULT '',
    last_job INTEGER,
    updated_by TEXT NOT NULL DEFAULT '',
    updated_at TEXT NOT NULL DEFAULT ''
);
