-- 0006: document vectors computed offline (trainer `embed-corpus` → embedding shards) and loaded into a dense index
-- by `care collection import-vectors`. A dense table may then hold vectors from two encoders of the same pairing:
-- the registered document model's online encoder (dense_indexes.model_id) and the offline document encoder named
-- in the shards. These tables say which vector came from where.

-- One row per completed import into one dense index.
CREATE TABLE dense_imports (
    id                INTEGER PRIMARY KEY,
    dense_index_id    INTEGER NOT NULL REFERENCES dense_indexes(id) ON DELETE CASCADE,
    -- embeddings.json "model": the document encoder that computed the vectors (name@version or a path).
    source_model      TEXT NOT NULL,
    pairing_id        TEXT NOT NULL,
    width             INTEGER NOT NULL,
    document_template TEXT NOT NULL,
    rows              INTEGER NOT NULL,
    -- sha256 of the embeddings.json that was imported (it lists every shard's sha256).
    index_sha256      TEXT NOT NULL,
    imported_at       TEXT NOT NULL
);

-- The chunks whose current vector in a dense index came from an import. A chunk that is re-ingested with new text
-- gets a new row id, so its row here disappears with the old chunk (cascade) and the new chunk is embedded online.
CREATE TABLE dense_vector_sources (
    dense_index_id INTEGER NOT NULL REFERENCES dense_indexes(id) ON DELETE CASCADE,
    chunk_id       INTEGER NOT NULL REFERENCES chunks(id) ON DELETE CASCADE,
    import_id      INTEGER NOT NULL REFERENCES dense_imports(id) ON DELETE CASCADE,
    PRIMARY KEY (dense_index_id, chunk_id)
) WITHOUT ROWID;
CREATE INDEX dense_vector_sources_chunk ON dense_vector_sources(chunk_id);
CREATE INDEX dense_vector_sources_import ON dense_vector_sources(import_id);
