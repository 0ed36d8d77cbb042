-- A counter that moves whenever a document's filing changes (added, re-filed, moved, deleted), so searches keep
-- the metadata in memory and reload it only when this differs from what they hold.
CREATE TABLE document_meta_state (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
INSERT INTO document_meta_state (id, version) VALUES (1, 0);
CREATE TRIGGER documents_meta_inserted AFTER INSERT ON documents
BEGIN UPDATE document_meta_state SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER documents_meta_updated AFTER UPDATE OF department, doc_type, doc_date, collection_id ON documents
BEGIN UPDATE document_meta_state SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER documents_meta_deleted AFTER DELETE ON documents
BEGIN UPDATE document_meta_state SET version = version + 1 WHERE id = 1; END;
