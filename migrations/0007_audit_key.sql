-- 0007: the keyed audit chain. Record hashes become HMAC-SHA256 under the key in `audit.key` (a file beside
-- care.sqlite, never in it), so rewriting the chain needs that key, not just write access to this database.
CREATE TABLE audit_key (
    singleton     INTEGER PRIMARY KEY CHECK (singleton = 1),
    -- First record hashed with the key. NULL until the first open with a key re-chains the existing log (done in
    -- Rust right after migrating, since SQL cannot see the key); a log whose old chain was already broken keeps it
    -- and the keyed chain starts at its `audit.rekey` record.
    keyed_from_id INTEGER,
    -- Fingerprint of the key, so a database restored without its audit.key is named as such.
    key_id        TEXT NOT NULL DEFAULT '',
    -- Copy of the record id in `audit.anchor`, so deleting that file is noticed.
    anchor_id     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO audit_key (singleton, keyed_from_id) VALUES (1, NULL);
