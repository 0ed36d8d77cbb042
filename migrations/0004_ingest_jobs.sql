-- 0004: ingestion jobs (issue 4). A job owns a list of files; each file is processed and confirmed on its own, so a
-- job interrupted by a crash resumes at its first unconfirmed file (re-ingesting a half-written file is a no-op for
-- the documents it already wrote: identity is (collection, external id) and unchanged content hashes are skipped).
ALTER TABLE jobs ADD COLUMN collection TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN actor TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
-- Documents written so far (all files), updated after every batch: progress inside one large file.
ALTER TABLE jobs ADD COLUMN documents_done INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_state ON jobs(state) WHERE state IN ('queued', 'running');

-- state: 'queued' (not yet confirmed), 'done', 'failed' (error_code/error_message say why; nothing of it stored,
-- except members of an archive that succeeded, listed in `detail`), 'skipped' (the job was cancelled first).
-- owned = 1: the file lives under <data_dir>/uploads/ and is deleted when the job ends.
CREATE TABLE job_files (
    job_id        INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    ordinal       INTEGER NOT NULL,
    path          TEXT NOT NULL,
    owned         INTEGER NOT NULL DEFAULT 0,
    state         TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'done', 'failed', 'skipped')),
    added         INTEGER NOT NULL DEFAULT 0,
    replaced      INTEGER NOT NULL DEFAULT 0,
    unchanged     INTEGER NOT NULL DEFAULT 0,
    chunks        INTEGER NOT NULL DEFAULT 0,
    detail        TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (job_id, ordinal)
);

-- How a document's chunks were cut ("chars:400/80" or "tokens:<model>:<max>/<overlap>"): re-ingesting unchanged
-- content re-chunks it only when the chunker differs, so chunk boundaries are reproducible.
ALTER TABLE documents ADD COLUMN chunker TEXT NOT NULL DEFAULT '';
