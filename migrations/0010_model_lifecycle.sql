-- 0010: the model lifecycle: labelled query sets per collection, evaluation reports of candidate pairs, and the
-- history of live pairs that rollback walks back.

-- A set of judgments an admin uploaded for one collection (BEIR qrels + queries, or CSV). Clinician feedback is
-- read as judgments straight from the feedback table, so it has no set row.
CREATE TABLE judgment_sets (
    id            INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    name          TEXT NOT NULL,
    source        TEXT NOT NULL,
    created_by    TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    UNIQUE (collection_id, name)
);

-- One judged (query, document or passage) with its grade. `part` is fixed at import from a hash of the query text,
-- so the same query always lands in the same part and training never sees an evaluation query.
CREATE TABLE judgments (
    id          INTEGER PRIMARY KEY,
    set_id      INTEGER NOT NULL REFERENCES judgment_sets(id) ON DELETE CASCADE,
    query       TEXT NOT NULL,
    external_id TEXT NOT NULL,
    chunk_id    INTEGER,
    grade       INTEGER NOT NULL,
    part        TEXT NOT NULL CHECK (part IN ('train', 'eval'))
);
CREATE INDEX judgments_set_part ON judgments(set_id, part);

-- An evaluation of a candidate pair against the live pair: the report (JSON), its chart (SVG) and the gate.
CREATE TABLE model_evaluations (
    id                INTEGER PRIMARY KEY,
    query_model_id    INTEGER NOT NULL REFERENCES models(id),
    document_model_id INTEGER NOT NULL REFERENCES models(id),
    baseline          TEXT NOT NULL,
    passed            INTEGER NOT NULL CHECK (passed IN (0, 1)),
    report            TEXT NOT NULL,
    chart_svg         TEXT NOT NULL,
    created_by        TEXT NOT NULL,
    created_at        TEXT NOT NULL
);
CREATE INDEX model_evaluations_candidate ON model_evaluations(query_model_id, document_model_id);

-- Every pair that was live, in order; the newest row is the live pair and rollback returns to the one before it.
CREATE TABLE model_history (
    id                INTEGER PRIMARY KEY,
    query_model_id    INTEGER NOT NULL REFERENCES models(id),
    document_model_id INTEGER NOT NULL REFERENCES models(id),
    actor             TEXT NOT NULL,
    reason            TEXT NOT NULL DEFAULT '',
    at                TEXT NOT NULL
);

-- The pair live when this migration runs starts the history.
INSERT INTO model_history (query_model_id, document_model_id, actor, reason, at)
SELECT CAST(q.value AS INTEGER), CAST(d.value AS INTEGER), 'migration', 'live before the history was kept',
       strftime('%Y-%m-%dT%H:%M:%SZ', 'now')
FROM settings q, settings d
WHERE q.key = 'active_query_model' AND d.key = 'active_document_model';
