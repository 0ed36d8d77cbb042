//! The ingestion handle's operations: files an administrator uploads or names, queued as ingest jobs.

use crate::error::{Error, Result};
use crate::ingest::IngestOptions;
use std::path::PathBuf;

impl crate::engine::Ingest<'_> {
    /// Queues an ingestion job for files that stay where they are (the CLI); they are read, never deleted.
    pub fn submit_in_place(
        &self,
        collection: &str,
        files: Vec<PathBuf>,
        opts: IngestOptions,
        actor: &crate::accounts::Admin,
    ) -> Result<i64> {
        let mut abs = Vec::with_capacity(files.len());
        for f in files {
            // A missing file is reported by the job like any other bad file; only make the path absolute.
            abs.push(std::path::absolute(&f).map_err(|e| Error::io(&f, e))?);
        }
        self.queue.submit(collection, abs, opts, actor, false)
    }
}
