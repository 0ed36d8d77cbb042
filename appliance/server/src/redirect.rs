//! The plain-HTTP listener: it answers every request with a permanent redirect to the same path on HTTPS and
//! nothing else (no page, no cookie), so a clinician who types the bare host name still lands on TLS.

use std::net::{IpAddr, SocketAddr};

use actix_web::dev::{Extensions, Server};
use actix_web::http::header;
use actix_web::rt::net::TcpStream;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use crate::ServeError;

/// The address a client actually reached, recorded per connection: a listener bound to 0.0.0.0 only knows its
/// own IP from the accepted socket, and that IP is the one literal a Host header may name.
#[derive(Clone, Copy)]
struct ReachedAt(IpAddr);

/// What the redirector may send browsers to: names the certificate is issued for, localhost, and the IP this
/// connection reached. The Host header is the client's to choose, so it is never echoed unless it is one of
/// these (a reflected Host lets a poisoned cache or a rebinding page send clinicians to another server), and
/// forwarded-host headers are never read: nothing stands in front of this listener that could vouch for them.
#[derive(Clone)]
struct Targets {
    https_port: u16,
    /// `server.tls_names` as configured, lower case; the first is where a refused Host is sent.
    names: Vec<String>,
}

impl Targets {
    fn host_for(&self, req: &HttpRequest) -> String {
        let listener = req.app_config().local_addr().ip();
        // The accepted socket's address; for a listener bound to one IP it is that IP.
        let own = req.conn_data::<ReachedAt>().map_or(listener, |r| r.0).to_canonical();
        // Only the Host header itself: actix's connection_info() would prefer Forwarded / X-Forwarded-Host.
        let asked = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let host = strip_port(asked).to_ascii_lowercase();
        let literal = host.trim_matches(['[', ']']).parse::<IpAddr>().ok();
        let served = match literal {
            Some(ip) => !own.is_unspecified() && ip.to_canonical() == own,
            None => host == "localhost" || self.names.contains(&host),
        };
        if served {
            host
        } else if let (true, Some(name)) = (listener.is_unspecified(), self.names.first()) {
            name.clone()
        } else if own.is_unspecified() {
            "localhost".into()
        } else if own.is_ipv6() {
            format!("[{own}]")
        } else {
            own.to_string()
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

fn record_reached_at(conn: &dyn std::any::Any, ext: &mut Extensions) {
    if let Some(ip) = conn.downcast_ref::<TcpStream>().and_then(|s| s.local_addr().ok()).map(|a| a.ip()) {
        ext.insert(ReachedAt(ip));
    }
}

/// `names`: the host names the HTTPS certificate carries (`server.tls_names`; localhost is always served).
pub fn server(bind: &str, https_port: u16, names: &[String]) -> Result<(SocketAddr, Server), ServeError> {
    let names: Vec<String> = names.iter().map(|n| n.trim().to_ascii_lowercase()).filter(|n| !n.is_empty()).collect();
    let targets = web::Data::new(Targets { https_port, names });
    let srv = HttpServer::new(move || App::new().app_data(targets.clone()).default_service(web::to(redirect)))
        .workers(1)
        .on_connect(record_reached_at)
        .bind(bind)
        .map_err(|source| ServeError::Bind { addr: bind.to_string(), source })?;
    let addr = srv.addrs().first().copied().ok_or_else(|| ServeError::Tls(format!("no address bound for {bind}")))?;
    Ok((addr, srv.run()))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};

    /// Starts a real redirector on `bind` in its own actix system (the test thread stays a plain client).
    fn start(bind: &str, names: &[&str]) -> SocketAddr {
        let bind = bind.to_string();
        let names: Vec<String> = names.iter().map(|n| (*n).to_string()).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let (addr, srv) = super::server(&bind, 8443, &names).expect("redirector binds");
                tx.send(addr).expect("test waits");
                srv.await.expect("redirector runs");
            });
        });
        rx.recv().expect("redirector started")
    }

    /// One raw HTTP/1.1 request to 127.0.0.1 (the headers exactly as given); the status and Location back.
    fn get(port: u16, head: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.write_all(format!("GET /search?q=x HTTP/1.1\r\n{head}Connection: close\r\n\r\n").as_bytes()).expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("answer");
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let location = out
            .lines()
            .find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: ")))
            .unwrap_or("")
            .to_string();
        (status, location)
    }

    #[test]
    fn bound_to_all_addresses_it_redirects_only_to_served_names_and_the_address_reached() {
        let port = start("0.0.0.0:0", &["Care.Example"]).port();
        let to = |host: &str| format!("https://{host}:8443/search?q=x");
        let cases = [
            // Served: a certificate name (any case), localhost, and the IP this connection reached.
            ("Host: care.example\r\n", to("care.example")),
            ("Host: CARE.example:8080\r\n", to("care.example")),
            ("Host: localhost:8080\r\n", to("localhost")),
            ("Host: 127.0.0.1:8080\r\n", to("127.0.0.1")),
            // Any other literal is the client's choice, not this listener's address.
            ("Host: 10.1.2.3\r\n", to("care.example")),
            ("Host: 127.0.0.2\r\n", to("care.example")),
            ("Host: [2001:db8::1]:8080\r\n", to("care.example")),
            ("Host: evil.example\r\n", to("care.example")),
            ("Host: care.example.evil.example\r\n", to("care.example")),
            ("Host: evil.example@care.example\r\n", to("care.example")),
            // Forwarded-host headers are never read, whether the Host is served or not.
            ("Host: care.example\r\nX-Forwarded-Host: 10.9.9.9\r\n", to("care.example")),
            ("Host: care.example\r\nForwarded: host=evil.example\r\n", to("care.example")),
            ("Host: 10.1.2.3\r\nX-Forwarded-Host: 127.0.0.1\r\nForwarded: host=localhost\r\n", to("care.example")),
        ];
        for (head, want) in cases {
            assert_eq!(get(port, head), (308, want), "{head:?}");
        }
    }

    #[test]
    fn without_names_a_refused_host_goes_to_the_address_reached() {
        let port = start("0.0.0.0:0", &[]).port();
        assert_eq!(get(port, "Host: 10.1.2.3\r\n"), (308, "https://127.0.0.1:8443/search?q=x".into()));
        assert_eq!(
            get(port, "Host: evil.example\r\nX-Forwarded-Host: evil.example\r\n"),
            (308, "https://127.0.0.1:8443/search?q=x".into())
        );
        let port = start("127.0.0.1:0", &["care.example"]).port();
        assert_eq!(get(port, "Host: 10.1.2.3\r\n"), (308, "https://127.0.0.1:8443/search?q=x".into()));
        assert_eq!(get(port, "Host: care.example\r\n"), (308, "https://care.example:8443/search?q=x".into()));
    }
}
