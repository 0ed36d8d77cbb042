-- What a hospital files a document under: its department (科室), its type (指南, 药品说明书, …) and its date
-- (YYYY, YYYY-MM or YYYY-MM-DD, as precise as the source). Empty when neither the file nor the upload said.
ALTER TABLE documents ADD COLUMN department TEXT NOT NULL DEFAULT '';
ALTER TABLE documents ADD COLUMN doc_type TEXT NOT NULL DEFAULT '';
ALTER TABLE documents ADD COLUMN doc_date TEXT NOT NULL DEFAULT '';
CREATE INDEX documents_department ON documents(collection_id, department) WHERE department != '';
CREATE INDEX documents_doc_type ON documents(collection_id, doc_type) WHERE doc_type != '';
