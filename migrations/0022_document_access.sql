-- Document-level access: a document's access list (groups or departments, comma-separated; '' = everyone who may
-- read its collection) and each account's groups (from the directory at each sign-in, or set by an administrator
-- for a local account). Edits of an access list move the filing version, so searches see them at once.
ALTER TABLE documents ADD COLUMN access TEXT NOT NULL DEFAULT '';
ALTER TABLE users ADD COLUMN groups TEXT NOT NULL DEFAULT '';
DROP TRIGGER documents_meta_updated;
CREATE TRIGGER documents_meta_updated
AFTER UPDATE OF department, doc_type, doc_date, issuer, language, access, collection_id ON documents
BEGIN UPDATE document_meta_state SET version = version + 1 WHERE id = 1; END;
