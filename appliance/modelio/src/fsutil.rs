//! Crash-safe file writes.
//!
//! Why: model packages are read by a running engine, and a crash or full disk mid-write must never leave a
//! truncated file under its final name. Files are written to a hidden temporary sibling, fsynced, and renamed
//! into place (rename within one directory is atomic on POSIX filesystems).

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

/// Writes `path` through `.<name>.tmp-<pid>` in the same directory, fsyncs it, then renames it over `path`.
/// On any error the temporary file is removed and `path` is left as it was.
pub(crate) fn write_atomic<E: From<std::io::Error>>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<(), E>,
) -> Result<(), E> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        write(&mut w)?;
        w.flush()?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        // Make the rename itself durable; failure to sync a directory is not worth failing the write for.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
