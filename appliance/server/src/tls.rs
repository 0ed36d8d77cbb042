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
    let certs = read_certs(&cert_path)?;
    let key = read_key(&key_path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Tls(format!("{} / {}: {e}", cert_path.display(), key_path.display())))
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
