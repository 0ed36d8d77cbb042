-- 0003: the audit chain's head. The hash chain in `audit` detects an edited or removed record in the middle; the head
-- (id and hash of the newest record, updated in the same transaction as every append) detects a removed tail.
CREATE TABLE audit_head (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    last_id   INTEGER NOT NULL,
    last_hash TEXT NOT NULL
);
INSERT INTO audit_head (singleton, last_id, last_hash) VALUES (1, 0, '');
