//! The audit key: 32 random bytes in `audit.key` next to care.sqlite, never stored in the database, so write
//! access to care.sqlite alone cannot produce valid record MACs.

use std::io::Write;
use std::path::Path;

use rusqlite::Connection;
use rusqlite::functions::FunctionFlags;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub const KEY_FILE: &str = "audit.key";

/// HMAC-SHA256 (RFC 2104) for keys of at most one block, which is all this module uses.
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    assert!(key.len() <= 64, "HMAC keys longer than one block are not used here");
    let (mut ipad, mut opad) = ([0x36u8; 64], [0x5cu8; 64]);
    for (i, b) in key.iter().enumerate() {
        ipad[i] ^= b;
        opad[i] ^= b;
    }
    let inner = Sha256::new().chain_update(ipad).chain_update(msg).finalize();
    let mut out = [0u8; 32];
    out.copy_from_slice(&Sha256::new().chain_update(opad).chain_update(inner).finalize());
    out
}

/// Reads `dir/audit.key`, creating it on first use.
pub(crate) fn load_or_create(dir: &Path) -> Result<[u8; 32]> {
    let path = dir.join(KEY_FILE);
    if !path.exists() {
        create(dir, &path)?;
    }
    read_hex_key(&path).and_then(|k| {
        k.ok_or_else(|| {
            Error::InvalidInput(format!(
                "审计密钥文件 {} 不是 64 位十六进制密钥 (does not hold a 64-digit hex key)；请从与 care.sqlite 一起做的备份中恢复",
                path.display()
            ))
        })
    })
}

/// A key file's 32 bytes, written as 64 hex digits (the audit key, a backup key); `None` when it holds anything
/// else.
pub(crate) fn read_hex_key(path: &Path) -> Result<Option<[u8; 32]>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    Ok(hex::decode(text.trim()).ok().and_then(|b| <[u8; 32]>::try_from(b).ok()))
}

/// Written to a private temporary file and hard-linked into place, so a second process opening the same data dir
/// at the same moment either wins or reads the complete winner, never a half-written key.
fn create(dir: &Path, path: &Path) -> Result<()> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| Error::Internal(format!("OS random source: {e}")))?;
    let tmp = dir.join(format!(".{KEY_FILE}.{}.tmp", std::process::id()));
    let written = write_private(&tmp, format!("{}\n", hex::encode(key)).as_bytes());
    let linked = written.and_then(|()| match std::fs::hard_link(&tmp, path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    });
    let _ = std::fs::remove_file(&tmp);
    linked.map_err(|e| Error::io(path, e))?;
    super::anchor::sync_dir(dir);
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Registers `care_audit_mac(text) -> hex HMAC-SHA256(key, text)` on the connection. DIRECTONLY keeps it out of
/// triggers and views, so someone who can change the schema cannot plant a trigger that makes the appliance
/// compute MACs of text they choose.
pub(crate) fn register(conn: &Connection, key: [u8; 32]) -> Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC | FunctionFlags::SQLITE_DIRECTONLY;
    conn.create_scalar_function("care_audit_mac", 1, flags, move |ctx| {
        let text: String = ctx.get(0)?;
        Ok(hex::encode(hmac_sha256(&key, text.as_bytes())))
    })?;
    Ok(())
}

/// The MAC of `text` under the key registered on `conn`.
pub(crate) fn mac(conn: &Connection, text: &str) -> Result<String> {
    Ok(conn.query_row("SELECT care_audit_mac(?1)", [text], |r| r.get(0))?)
}

/// A short fingerprint of the key, kept in the database so a care.sqlite restored without its audit.key is
/// reported as such rather than as every record having been altered.
pub(crate) fn fingerprint(conn: &Connection) -> Result<String> {
    Ok(mac(conn, "care audit key fingerprint")?[..16].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_hmac_matches_rfc4231() {
        let tag = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex::encode(tag), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn audit_key_is_created_once_and_private() {
        let d = tempfile::tempdir().unwrap();
        let k = load_or_create(d.path()).unwrap();
        assert_eq!(load_or_create(d.path()).unwrap(), k);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(d.path().join(KEY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
