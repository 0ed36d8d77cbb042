-- Two more filing fields: who issued a document (来源: 国家卫健委, 中华医学会, 本院) and its language (中文, 英文,
-- …; read from the text at ingest when the file does not say). Edits of either move the filing version too.
ALTER TABLE documents ADD COLUMN issuer TEXT NOT NULL DEFAULT '';
ALTER TABLE documents ADD COLUMN language TEXT NOT NULL DEFAULT '';
DROP TRIGGER documents_meta_updated;
CREATE TRIGGER documents_meta_updated
AFTER UPDATE OF department, doc_type, doc_date, issuer, language, collection_id ON documents
BEGIN UPDATE document_meta_state SET version = version + 1 WHERE id = 1; END;
