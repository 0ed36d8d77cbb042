-- 0012: retraining as an appliance job (jobs.kind 'model.train'). A run's recipe and the pair it starts from are in
-- jobs.params; what it trained on, how long each phase took, its loss chart and the gate's decision are here.
CREATE TABLE training_runs (
    job_id        INTEGER PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    schedule_id   INTEGER,
    device        TEXT NOT NULL DEFAULT 'cpu',
    counts        TEXT NOT NULL DEFAULT '',
    phases        TEXT NOT NULL DEFAULT '[]',
    loss_svg      TEXT NOT NULL DEFAULT '',
    candidate     TEXT NOT NULL DEFAULT '',
    evaluation_id INTEGER REFERENCES model_evaluations(id),
    -- '' while running; then 'promoted', 'passed' (kept for an admin) or 'gated_out'
    decision      TEXT NOT NULL DEFAULT ''
);

-- Schedules: `spec` is the admin's JSON (weekday, time, min_new_feedback, recipe, enabled); `next_due` the next time
-- trigger in UTC ('' without one); `feedback_mark` the newest feedback row counted at the last run.
CREATE TABLE training_schedules (
    id            INTEGER PRIMARY KEY,
    spec          TEXT NOT NULL,
    next_due      TEXT NOT NULL DEFAULT '',
    last_fired_at TEXT NOT NULL DEFAULT '',
    last_job      INTEGER,
    feedback_mark INTEGER NOT NULL DEFAULT 0,
    created_by    TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
