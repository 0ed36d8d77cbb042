-- Directory sign-in: where an account's identity lives ('local' password here, 'ldap', 'oidc') and the name the
-- directory gives the person. Directory accounts have no usable password here (password_hash '!').
ALTER TABLE users ADD COLUMN source TEXT NOT NULL DEFAULT 'local' CHECK (source IN ('local', 'ldap', 'oidc'));
ALTER TABLE users ADD COLUMN display_name TEXT;
