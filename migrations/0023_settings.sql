-- Settings an administrator changed in the console (设置); care.toml gives the defaults. One row per changed
-- setting; removing a row returns it to the file's value. (`settings`, from 0002, holds internal keys such as the
-- active models; these are the console's.)
CREATE TABLE console_settings (
    key        TEXT PRIMARY KEY,
    value      REAL NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
