//! The appliance's HTTPS layer.
//!
//! ```text
//!  serve() ── rustls (self-signed on first start unless configured) ── actix-web
//!    │         └ plain-HTTP listener that only redirects to https (redirect.rs)
//!    ├ guard    one middleware for every request: request id, identity (session cookie or bearer token),
//!    │          the access table (table.rs), CSRF, security headers, latency metrics, error pages
//!    ├ table    ROUTES: every route with its access level; the authorisation matrix test enumerates it
//!    ├ errors   the one ErrorCode → HTTP status / message table, rendered as JSON (API) or HTML (pages)
//!    ├ pages    clinician pages: login, search, document, feedback, account, embeddable widget
//!    ├ admin    admin console: collections + uploads, jobs, users + grants + tokens, models, audit
//!    ├ api      the JSON API under /api/v1 (OpenAPI document at /api/v1/openapi.json)
//!    ├ metrics  Prometheus exposition at /metrics
//!    └ tls      certificate loading and first-start generation
//! ```
//!
//! Handlers are adapters: each calls one engine service operation (`care_engine::service`, where authorisation
//! and audit live) through `call`, on the blocking pool, because the engine is synchronous (SQLite, tantivy,
//! ONNX) and a slow query must never stall the async workers.

pub mod admin;
pub mod admin_backup;
pub mod admin_models;
pub mod admin_training;
pub mod api;
pub mod call;
pub mod errors;
mod filters;
pub mod guard;
pub mod metrics;
pub mod openapi;
pub mod pages;
pub mod redirect;
pub mod routes;
pub mod table;
pub mod tls;
pub mod uploads;

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
    /// Plain-HTTP listener that answers every request with a redirect to HTTPS (and nothing else). Empty: off.
    pub http_redirect_bind: String,
    /// PEM certificate chain and private key. When unset, a self-signed pair is generated on first start in
    /// `<data_dir>/tls/`.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Extra names (host names, IPs) put into the generated certificate besides localhost.
    pub tls_names: Vec<String>,
    pub workers: usize,
    /// Origins allowed to frame the embeddable search widget at /embed (CSP frame-ancestors), e.g.
    /// "https://his.hospital.local". Every other page refuses to be framed.
    pub embed_origins: Vec<String>,
    /// Largest upload accepted in one request, in MiB.
    pub max_upload_mib: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "0.0.0.0:8443".into(),
            http_redirect_bind: "0.0.0.0:8080".into(),
            tls_cert: None,
            tls_key: None,
            tls_names: Vec::new(),
            workers: 2,
            embed_origins: Vec::new(),
            max_upload_mib: 512,
        }
    }
}

/// `[auth]`: accounts and sessions.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AuthConfig {
    /// Name of the administrator created on first start when there are no users.
    pub bootstrap_admin: String,
    /// File holding the first administrator's password. Unset: a random password is generated and printed once.
    pub bootstrap_password_file: Option<PathBuf>,
    /// Minutes without a request after which a session ends.
    pub session_idle_minutes: u32,
    /// Hours after which a session ends regardless of activity.
    pub session_max_hours: u32,
    /// Consecutive failed logins that lock an account, and for how long.
    pub lock_after_failures: u32,
    pub lock_minutes: u32,
    /// Failed sign-ins and current-password checks from one client address (any names; an IPv6 address counts
    /// by its /64) after which the address is refused for the rest of a window of `address_window_minutes`.
    pub address_lock_after_failures: u32,
    pub address_window_minutes: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            bootstrap_admin: "admin".into(),
            bootstrap_password_file: None,
            session_idle_minutes: 30,
            session_max_hours: 12,
            lock_after_failures: 5,
            lock_minutes: 15,
            address_lock_after_failures: 30,
            address_window_minutes: 15,
        }
    }
}

impl AuthConfig {
    pub fn policy(&self) -> care_engine::accounts::LoginPolicy {
        care_engine::accounts::LoginPolicy {
            max_failed: self.lock_after_failures,
            lock_seconds: i64::from(self.lock_minutes) * 60,
            address_max_failed: self.address_lock_after_failures.max(1),
            address_window_seconds: i64::from(self.address_window_minutes.max(1)) * 60,
        }
    }
    pub fn idle_seconds(&self) -> i64 {
        i64::from(self.session_idle_minutes.max(1)) * 60
    }
    pub fn max_seconds(&self) -> i64 {
        i64::from(self.session_max_hours.max(1)) * 3600
    }
}

/// `[audit]`: the hash-chained audit log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AuditConfig {
    /// Days audit records are kept; older ones are purged daily (the chain stays verifiable). 0 keeps everything.
    pub retention_days: u32,
    /// Record the text of every search query (who searched what is part of the audit trail).
    pub log_queries: bool,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig { retention_days: 365, log_queries: true }
    }
}

/// Everything the HTTP layer is configured with.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub audit: AuditConfig,
}

impl Settings {
    /// The sign-in lifetimes of `[auth]`, which the console's settings page may override.
    pub fn session_defaults(&self) -> care_engine::service::SessionDefaults {
        care_engine::service::SessionDefaults {
            idle_seconds: self.auth.idle_seconds(),
            max_seconds: self.auth.max_seconds(),
        }
    }

    /// What the scheduler's housekeeping chores (audit checkpoints every minute, a full audit walk daily,
    /// retention and sign-in clean-up every six hours, all at start too) need from these settings. `care serve`
    /// starts the engine's scheduler with them before [`serve`].
    pub fn housekeeping(&self) -> care_engine::Housekeeping {
        care_engine::Housekeeping {
            audit_retention_days: self.audit.retention_days,
            sign_in_idle_seconds: self.auth.idle_seconds(),
            sign_in_max_seconds: self.auth.max_seconds(),
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
    #[error("creating the first administrator: {0}")]
    Bootstrap(String),
}

pub struct AppState {
    pub engine: Arc<Engine>,
    pub settings: Settings,
    pub metrics: metrics::Metrics,
    /// Set when this data directory is a standby's copy ([`care_engine::backup::standby`]): search only.
    pub standby: Option<care_engine::backup::standby::StandbyState>,
}

/// Creates the first administrator if there is no user yet. Returns the generated password (to print once).
pub fn bootstrap(engine: &Engine, auth: &AuthConfig) -> Result<Option<String>, ServeError> {
    let pw = match &auth.bootstrap_password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| ServeError::Bootstrap(format!("{}: {e}", p.display())))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        None => None,
    };
    engine
        .accounts()
        .bootstrap_admin(&auth.bootstrap_admin, pw.as_deref())
        .map_err(|e| ServeError::Bootstrap(e.to_string()))
}

/// Connections accepted by the kernel and waiting for a worker (Linux caps it at net.core.somaxconn, 4096).
const CONNECTION_BACKLOG: u32 = 4096;
/// TLS handshakes one worker runs at once; the rest wait in the backlog, costing nothing.
const HANDSHAKES_PER_WORKER: usize = 64;
/// A handshake's limit from its accept: long enough for a queued one on a busy 2-core machine.
const HANDSHAKE_SECONDS: u64 = 20;
/// A request's head must arrive within this after the handshake (actix's default is 5 s).
const REQUEST_HEAD_SECONDS: u64 = 15;

/// Runs the HTTPS server (and the plain-HTTP redirector) until stopped (Ctrl-C / SIGTERM). `on_ready` gets the
/// bound HTTPS address and the redirector's, which matters when the binds ask for port 0.
pub async fn serve(
    engine: Arc<Engine>,
    settings: Settings,
    on_ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> Result<(), ServeError> {
    let cfg = settings.server.clone();
    let tls = tls::server_config(&cfg, &engine.data_dir().tls())?;
    engine.audit().set_log_queries(settings.audit.log_queries);
    let staging = |p: PathBuf| p.to_string_lossy().into_owned();
    errors::set_staging_roots(vec![
        format!("{}/", staging(engine.queue().uploads_dir())),
        staging(engine.data_dir().models().join(".import-")),
    ]);
    // Starts the trainer check in the background, so the 训练 page already knows the answer when it is opened.
    care_engine::training::trainer_status(&engine);
    let standby = care_engine::backup::standby::read(engine.data_dir().root());
    let state = web::Data::new(AppState { engine, settings, metrics: metrics::Metrics::default(), standby });
    let upload_limit = (cfg.max_upload_mib as usize).saturating_mul(1 << 20);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::PayloadConfig::new(upload_limit))
            .app_data(web::FormConfig::default().limit(256 * 1024).error_handler(errors::unparsable_form))
            .app_data(web::JsonConfig::default().limit(1 << 20).error_handler(errors::unparsable_json))
            .app_data(web::QueryConfig::default().error_handler(errors::unparsable_query))
            .app_data(web::PathConfig::default().error_handler(errors::unparsable_path))
            .wrap(actix_web::middleware::from_fn(guard::guard))
            .configure(routes::configure)
            .default_service(web::to(routes::not_found))
    })
    .workers(cfg.workers.max(1))
    // A burst of new connections (clinicians at a shift change) waits its turn instead of being dropped: on a busy
    // machine actix's 3 s TLS handshake limit failed 13-70 % of 60-200 concurrent handshakes. The queue is the
    // kernel's accept backlog; handshakes in flight are capped per worker so each finishes quickly, and a client
    // still has HANDSHAKE_SECONDS from its accept. Measured by tests/bench/signin_burst.py.
    .backlog(CONNECTION_BACKLOG)
    .max_connection_rate(HANDSHAKES_PER_WORKER)
    .tls_handshake_timeout(std::time::Duration::from_secs(HANDSHAKE_SECONDS))
    .client_request_timeout(std::time::Duration::from_secs(REQUEST_HEAD_SECONDS))
    .bind_rustls_0_23(&cfg.bind, tls)
    .map_err(|source| ServeError::Bind { addr: cfg.bind.clone(), source })?;
    let https_addr = server.addrs().first().copied();
    let redirect = if cfg.http_redirect_bind.is_empty() {
        None
    } else {
        let port = https_addr.map_or(443, |a| a.port());
        Some(redirect::server(&cfg.http_redirect_bind, port, &cfg.tls_names)?)
    };
    if let Some(addr) = https_addr {
        on_ready(addr, redirect.as_ref().map(|r| r.0));
    }
    match redirect {
        Some((_, r)) => {
            let (a, b) = futures::future::join(server.run(), r).await;
            a?;
            b?;
        }
        None => server.run().await?,
    }
    Ok(())
}
