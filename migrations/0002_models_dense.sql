-- 0002: model registry, dense indexes and per-collection fusion settings.

-- One row per model package folder under <data_dir>/models/. The files themselves are checked against the
-- package manifest's sha256 list when loaded.
CREATE TABLE models (
    id           INTEGER PRIMARY KEY,
    name         TEXT NOT NULL,
    version      TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('query', 'document', 'both')),
    architecture TEXT NOT NULL,
    dir          TEXT NOT NULL,
    pairing_id   TEXT NOT NULL,
    width        INTEGER NOT NULL,
    metrics      TEXT NOT NULL DEFAULT '{}',
    created_at   TEXT NOT NULL,
    UNIQUE (name, version)
);

-- Small key/value settings: the active query and document model ids.
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- A dense index is one LanceDB table per (collection, document model). It records the pairing id of the model that
-- built it; queries are only answered with a query encoder of the same pairing.
CREATE TABLE dense_indexes (
    id            INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    model_id      INTEGER NOT NULL REFERENCES models(id),
    table_name    TEXT NOT NULL UNIQUE,
    pairing_id    TEXT NOT NULL,
    width         INTEGER NOT NULL,
    created_at    TEXT NOT NULL,
    UNIQUE (collection_id, model_id)
);

-- Fusion of BM25 and dense scores, fitted per collection by `care tune-fusion`.
CREATE TABLE fusion (
    collection_id INTEGER PRIMARY KEY REFERENCES collections(id) ON DELETE CASCADE,
    method        TEXT NOT NULL CHECK (method IN ('bm25', 'dense', 'rrf', 'weighted')),
    dense_weight  REAL NOT NULL,
    fitted_on     TEXT NOT NULL DEFAULT '',
    metrics       TEXT NOT NULL DEFAULT '{}',
    updated_at    TEXT NOT NULL
);
