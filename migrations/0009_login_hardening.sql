-- 0009: login hardening (issue "Hardening"). Failed logins of names that are not accounts are throttled like
-- accounts, so a locked answer does not reveal which names exist and guessing unknown names is slowed as well.
-- Keyed by sha256 of the lower-cased name: attempted names (often a password typed into the wrong field) are not
-- stored in the clear.
CREATE TABLE login_throttle (
    name_hash     TEXT PRIMARY KEY,
    failed_logins INTEGER NOT NULL DEFAULT 0,
    locked_until  INTEGER,
    updated_at    INTEGER NOT NULL
);
-- The first administrator's generated password must be changed at the first sign-in.
ALTER TABLE users ADD COLUMN must_change_password INTEGER NOT NULL DEFAULT 0;
