//! The plain-HTTP listener: it answers every request with a permanent redirect to the same path on HTTPS and
//! nothing else (no page, no cookie), so a clinician who types the bare host name still lands on TLS.

use std::net::SocketAddr;

use actix_web::dev::Server;
use actix_web::http::header;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use crate::ServeError;

/// What the redirector may send browsers to: names the certificate is issued for, and IP literals of this
/// listener. The Host header is the client's to choose, so it is never echoed unless it is one of these (a
/// reflected Host lets a poisoned cache or a rebinding page send clinicians to another server).
#[derive(Clone)]
struct Targets {
    https_port: u16,
    names: Vec<String>,
}

impl Targets {
    fn host_for(&self, req: &HttpRequest) -> String {
        let asked = req.connection_info().host().to_string();
        let host = strip_port(&asked).to_ascii_lowercase();
        let local = req.app_config().local_addr().ip();
        let ip_ok = host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| local.is_unspecified() || ip == local);
        if ip_ok || self.names.iter().any(|n| n.eq_ignore_ascii_case(&host)) {
            host
        } else if local.is_unspecified() {
            self.names.first().cloned().unwrap_or_else(|| "localhost".into())
        } else if local.is_ipv6() {
            format!("[{local}]")
        } else {
            local.to_string()
        }
    }
}

async fn redirect(req: HttpRequest, targets: web::Data<Targets>) -> HttpResponse {
    let host = targets.host_for(&req);
    let port = targets.https_port;
    let authority = if port == 443 { host } else { format!("{host}:{port}") };
    let target = format!("https://{authority}{}", req.uri().path_and_query().map_or("/", |p| p.as_str()));
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, target))
        .insert_header(("strict-transport-security", "max-age=31536000"))
        .finish()
}

fn strip_port(host: &str) -> &str {
    if let Some(end) = host.rfind(']') {
        return &host[..=end];
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

/// `names`: the host names the HTTPS certificate carries (`server.tls_names`, plus localhost).
pub fn server(bind: &str, https_port: u16, names: &[String]) -> Result<(SocketAddr, Server), ServeError> {
    let mut names: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
    names.push("localhost".into());
    let targets = web::Data::new(Targets { https_port, names });
    let srv = HttpServer::new(move || App::new().app_data(targets.clone()).default_service(web::to(redirect)))
        .workers(1)
        .bind(bind)
        .map_err(|source| ServeError::Bind { addr: bind.to_string(), source })?;
    let addr = srv.addrs().first().copied().ok_or_else(|| ServeError::Tls(format!("no address bound for {bind}")))?;
    Ok((addr, srv.run()))
}
