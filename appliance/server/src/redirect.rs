//! The plain-HTTP listener: it answers every request with a permanent redirect to the same path on HTTPS and
//! nothing else (no page, no cookie), so a clinician who types the bare host name still lands on TLS.

use std::net::SocketAddr;

use actix_web::dev::Server;
use actix_web::http::header;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use crate::ServeError;

async fn redirect(req: HttpRequest, https_port: web::Data<u16>) -> HttpResponse {
    // The Host header names the plain-HTTP port; keep the host, swap in the HTTPS port.
    let host = req.connection_info().host().to_string();
    let host = strip_port(&host).to_string();
    let port = **https_port;
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

pub fn server(bind: &str, https_port: u16) -> Result<(SocketAddr, Server), ServeError> {
    let port = web::Data::new(https_port);
    let srv = HttpServer::new(move || App::new().app_data(port.clone()).default_service(web::to(redirect)))
        .workers(1)
        .bind(bind)
        .map_err(|source| ServeError::Bind { addr: bind.to_string(), source })?;
    let addr = srv.addrs().first().copied().ok_or_else(|| ServeError::Tls(format!("no address bound for {bind}")))?;
    Ok((addr, srv.run()))
}
