//! The appliance's HTTPS layer.
//!
//! ```text
//!  serve() ── rustls (self-signed on first start unless configured) ── actix-web
//!    ├ errors   the one ErrorCode → HTTP status table (exhaustive match) and JSON/HTML error bodies
//!    ├ tls      certificate loading and first-start generation
//!    └ routes   pages (askama templates in /templates, assets from /web) and the JSON API under /api/v1
//! ```
//!
//! The engine is synchronous (SQLite, tantivy); handlers call it through `web::block` so a slow query never
//! stalls the async workers.

pub mod errors;
pub mod routes;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use actix_web::{App, HttpServer, web};
use care_engine::Engine;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ServerConfig {
    /// Address of the HTTPS listener.
    pub bind: String,
    /// PEM certificate chain and private key. When unset, a self-signed pair is generated on first start in
    /// `<data_dir>/tls/`.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Extra names (host names, IPs) put into the generated certificate besides localhost.
    pub tls_names: Vec<String>,
    pub workers: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "0.0.0.0:8443".into(),
            tls_cert: None,
            tls_key: None,
            tls_names: Vec::new(),
            workers: 2,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

pub struct AppState {
    pub engine: Arc<Engine>,
}

/// Runs the HTTPS server until it is stopped (Ctrl-C / SIGTERM). `on_ready` gets the bound address, which
/// matters when `bind` asks for port 0.
pub async fn serve(
    engine: Arc<Engine>,
    cfg: ServerConfig,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let tls = tls::server_config(&cfg, &engine.data_dir().tls())?;
    let state = web::Data::new(AppState { engine });
    let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes::configure))
        .workers(cfg.workers.max(1))
        .bind_rustls_0_23(&cfg.bind, tls)
        .map_err(|source| ServeError::Bind { addr: cfg.bind.clone(), source })?;
    if let Some(addr) = server.addrs().first() {
        on_ready(*addr);
    }
    server.run().await?;
    Ok(())
}
