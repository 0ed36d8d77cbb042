-- The hospital sign-in as an administrator saved it on the settings page (设置): one row per protocol, its whole
-- section as JSON, in force over care.toml's [ldap] / [oidc] until it is cleared. The secrets it holds (the service
-- account's password, the client secret) live where care.toml's do: in the appliance's own data dir, never shown
-- back by a page or the API.
CREATE TABLE sign_in_config (
    protocol   TEXT PRIMARY KEY CHECK (protocol IN ('ldap', 'oidc')),
    config     TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
