-- 0026: a synonym import is written here in short batches and moved into `synonyms` by one short transaction, so
-- that an import of 50,000 groups never holds the writer (which every search's audit record waits for) for seconds.
-- Empty between imports; what an interrupted import left is cleared by the next one.
CREATE TABLE synonym_staging (
    id INTEGER PRIMARY KEY,
    preferred TEXT NOT NULL UNIQUE,
    variants TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
