-- 0029: what an API token may do. '' = everything its user may; 'backups' = only list and download backups (the
-- token a standby appliance pulls them with: it opens nothing else, whatever its administrator may).
ALTER TABLE api_tokens ADD COLUMN scope TEXT NOT NULL DEFAULT '';
