-- Deleted chunk rows, counted: with the newest chunk id this tells a reader that copied the chunks' text (the search
-- page's in-memory "not found" check) whether its copy still equals the table. Chunk ids are not AUTOINCREMENT, so
-- after deletions a new chunk can take an id the copy already holds; the count changes first.
CREATE TABLE chunk_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    deletions INTEGER NOT NULL
);
INSERT INTO chunk_state (id, deletions) VALUES (1, 0);
CREATE TRIGGER chunks_deleted AFTER DELETE ON chunks BEGIN
    UPDATE chunk_state SET deletions = deletions + 1 WHERE id = 1;
END;
