-- 0005: accounts, sessions, API tokens, per-collection read grants, relevance feedback, and the audit anchor.
-- Secrets are never stored: passwords as argon2id PHC strings, session ids and API tokens as sha256 hex.

ALTER TABLE users ADD COLUMN failed_logins INTEGER NOT NULL DEFAULT 0;
-- Unix seconds; the account refuses logins until then. NULL = not locked.
ALTER TABLE users ADD COLUMN locked_until INTEGER;
ALTER TABLE users ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN password_changed_at TEXT;

CREATE TABLE sessions (
    id_hash    TEXT PRIMARY KEY,
    user_id    INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    -- Synchronizer token for this session's forms (not secret from the session's own pages).
    csrf_token TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL
);
CREATE INDEX sessions_user ON sessions(user_id);

CREATE TABLE api_tokens (
    id          INTEGER PRIMARY KEY,
    user_id     INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    token_hash  TEXT NOT NULL UNIQUE,
    -- First characters of the token, shown in lists so an admin can tell tokens apart.
    prefix      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    last_used   TEXT,
    revoked     INTEGER NOT NULL DEFAULT 0
);

-- Read permission of a clinician on a collection (admins read everything).
CREATE TABLE grants (
    user_id       INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    granted_by    TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (user_id, collection_id)
);

-- Relevance judgements from the result page, kept for later training.
CREATE TABLE feedback (
    id          INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    username    TEXT NOT NULL,
    query       TEXT NOT NULL,
    chunk_id    INTEGER NOT NULL,
    document_id INTEGER NOT NULL,
    collection  TEXT NOT NULL,
    helpful     INTEGER NOT NULL CHECK (helpful IN (0, 1)),
    -- Snapshot of the judged passage, so training data survives re-ingestion of the document.
    passage     TEXT NOT NULL
);
CREATE INDEX feedback_collection ON feedback(collection);

-- Where the audit chain starts after retention purged old records: the id and hash of the last purged record.
-- The purge itself is an audit record carrying the same id and hash, so the anchor cannot be moved silently.
CREATE TABLE audit_anchor (
    singleton           INTEGER PRIMARY KEY CHECK (singleton = 1),
    purged_through_id   INTEGER NOT NULL,
    purged_through_hash TEXT NOT NULL
);
INSERT INTO audit_anchor (singleton, purged_through_id, purged_through_hash) VALUES (1, 0, '');
