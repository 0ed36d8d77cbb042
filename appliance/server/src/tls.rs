//! TLS is on by default: an admin-supplied certificate, or a self-signed one made on first start and reused.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::{ServeError, ServerConfig};

pub fn server_config(cfg: &ServerConfig, tls_dir: &Path) -> Result<rustls::ServerConfig, ServeError> {
    let (cert_path, key_path) = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        (None, None) => {
            let c = tls_dir.join("cert.pem");
            let k = tls_dir.join("key.pem");
            if !c.exists() || !k.exists() {
                generate_self_signed(&c, &k, &cfg.tls_names)?;
                tracing::warn!(cert = %c.display(), "generated a self-signed certificate; configure server.tls_cert/tls_key for production");
            }
            (c, k)
        }
        _ => {
            return Err(ServeError::Tls(
                "set both server.tls_cert and server.tls_key, or neither to use a generated certificate".into(),
            ));
        }
    };
    load(&cert_path, &key_path).map(|(config, _)| config)
}

/// Reads the PEM pair and builds the rustls config (which also checks that the key matches the certificate).
/// Returns the certificate chain too, for [`inspect`].
fn load(cert_path: &Path, key_path: &Path) -> Result<(rustls::ServerConfig, Vec<CertificateDer<'static>>), ServeError> {
    let certs = read_certs(cert_path)?;
    let key = read_key(key_path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs.clone(), key)
        .map_err(|e| ServeError::Tls(format!("{} / {}: {e}", cert_path.display(), key_path.display())))?;
    Ok((config, certs))
}

/// What `care doctor` reports about the certificate.
#[derive(Debug, Clone)]
pub struct CertInfo {
    pub path: std::path::PathBuf,
    pub days_left: i64,
    pub self_signed: bool,
}

/// Loads the configured (or previously generated) certificate and key exactly as [`server_config`] would, without
/// generating anything. `Ok(None)`: nothing configured and nothing generated yet.
pub fn inspect(cfg: &ServerConfig, tls_dir: &Path) -> Result<Option<CertInfo>, ServeError> {
    let (cert_path, key_path) = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        (None, None) => {
            let (c, k) = (tls_dir.join("cert.pem"), tls_dir.join("key.pem"));
            if !c.exists() {
                return Ok(None);
            }
            (c, k)
        }
        _ => return Err(ServeError::Tls("set both server.tls_cert and server.tls_key, or neither".into())),
    };
    let (_, certs) = load(&cert_path, &key_path)?;
    let (_, leaf) = x509_parser::parse_x509_certificate(&certs[0])
        .map_err(|e| ServeError::Tls(format!("{}: {e}", cert_path.display())))?;
    let not_after = leaf.validity().not_after.timestamp();
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    Ok(Some(CertInfo {
        path: cert_path,
        days_left: (not_after - now).div_euclid(86_400),
        self_signed: leaf.issuer() == leaf.subject(),
    }))
}

fn generate_self_signed(cert: &Path, key: &Path, extra: &[String]) -> Result<(), ServeError> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    names.extend(extra.iter().cloned());
    let ck = rcgen::generate_simple_self_signed(names).map_err(|e| ServeError::Tls(e.to_string()))?;
    write_private(key, ck.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(cert, ck.cert.pem()).map_err(|e| ServeError::Tls(format!("{}: {e}", cert.display())))?;
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ServeError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts.open(path).map_err(|e| ServeError::Tls(format!("{}: {e}", path.display())))?;
    f.write_all(bytes).map_err(|e| ServeError::Tls(format!("{}: {e}", path.display())))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ServeError> {
    let f = std::fs::File::open(path).map_err(|e| ServeError::Tls(format!("{}: {e}", path.display())))?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut std::io::BufReader::new(f)).collect();
    let certs = certs.map_err(|e| ServeError::Tls(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!("{}: no PEM certificate found", path.display())));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, ServeError> {
    let f = std::fs::File::open(path).map_err(|e| ServeError::Tls(format!("{}: {e}", path.display())))?;
    rustls_pemfile::private_key(&mut std::io::BufReader::new(f))
        .map_err(|e| ServeError::Tls(format!("{}: {e}", path.display())))?
        .ok_or_else(|| ServeError::Tls(format!("{}: no PEM private key found", path.display())))
}
