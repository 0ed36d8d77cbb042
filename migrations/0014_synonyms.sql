-- 0014: the synonym and abbreviation table admins edit (console, CLI, API, CSV). One row per group of
-- equivalent terms: the preferred term and its variants ('|'-separated). A term belongs to one group at most (the
-- engine checks it on every write). `synonym_state.version` grows with every change, so every process sees an
-- edit at its next search without a restart; `seeded` records that the shipped seed table was loaded once (an
-- admin's deletions of seed rows stay deleted).
CREATE TABLE synonyms (
    id INTEGER PRIMARY KEY,
    preferred TEXT NOT NULL UNIQUE,
    variants TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL CHECK (origin IN ('seed', 'admin', 'import')),
    updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE synonym_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL,
    seeded INTEGER NOT NULL
);
INSERT INTO synonym_state (id, version, seeded) VALUES (1, 0, 0);
