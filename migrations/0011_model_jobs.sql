-- 0011: evaluating and promoting a model pair run as durable jobs beside ingestion (jobs.kind 'model.evaluate' and
-- 'model.promote'): a restart resumes them. `stage` says what a running job is doing, `result` what a finished one
-- produced (JSON: the evaluation report's id and verdict, or the pair that went live).
ALTER TABLE jobs ADD COLUMN stage TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN result TEXT NOT NULL DEFAULT '';

-- An admin may reject a candidate after reading its evaluation: the pair then cannot be promoted, not even with an
-- override, until it is evaluated again (a newer evaluation row).
ALTER TABLE model_evaluations ADD COLUMN rejected_by TEXT NOT NULL DEFAULT '';
ALTER TABLE model_evaluations ADD COLUMN rejected_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE model_evaluations ADD COLUMN rejected_at TEXT NOT NULL DEFAULT '';
