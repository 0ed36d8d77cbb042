-- 0030: an import's staged table becomes `synonyms` by renaming it (and the old one is retired and emptied in short
-- batches afterwards), instead of a copy of every row under the write lock: 50,000 groups held the writer ~100 ms,
-- which every search's audit record waited for. The staging table is therefore defined exactly as `synonyms` is.
DROP TABLE synonym_staging;
CREATE TABLE synonym_staging (
    id INTEGER PRIMARY KEY,
    preferred TEXT NOT NULL UNIQUE,
    variants TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL CHECK (origin IN ('seed', 'admin', 'import')),
    updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
