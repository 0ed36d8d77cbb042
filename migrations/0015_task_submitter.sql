-- 0015: tasks run as their submitter, re-checked when they start (issue 31): the account behind `actor`, NULL for
-- the console and the system (no account). A task whose account was disabled, deleted or demoted meanwhile fails.
ALTER TABLE jobs ADD COLUMN actor_user_id INTEGER;

-- The stage of a queued or ended model task was stored as display words; the state already says it, and the pages
-- and the CLI render it (jobs::stage_text). A running task's stage stays its progress line.
UPDATE jobs SET stage = '' WHERE stage IN ('排队中', '完成', '已取消', '失败');
