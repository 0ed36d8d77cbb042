//! Real directory servers for the sign-in tests: OpenLDAP's `slapd` (Debian's package) with StartTLS, and
//! node-oidc-provider (npm, `tests/oidc/`). Each runs as a child of the test on a free loopback port and is killed
//! when dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::KillOnDrop;

pub const BASE: &str = "dc=hospital,dc=test";
pub const SERVICE_DN: &str = "cn=care,ou=services,dc=hospital,dc=test";
pub const SERVICE_PASSWORD: &str = "svc-secret-2026";
const ROOT_DN: &str = "cn=admin,dc=hospital,dc=test";
const ROOT_PASSWORD: &str = "root-secret-2026";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Whether slapd can run here (CI installs it via packaging/dev.sh; a machine without it says so loudly).
pub fn slapd_available() -> bool {
    Path::new("/usr/sbin/slapd").exists() && Path::new("/usr/bin/ldapmodify").exists()
}

pub struct Slapd {
    _child: KillOnDrop,
    /// `ldap://` (StartTLS offered).
    pub url: String,
    /// `ldaps://`: TLS from the first byte, same certificate.
    pub ldaps_url: String,
    /// The server's self-signed certificate, the CA file the appliance trusts.
    pub ca_file: PathBuf,
    dir: PathBuf,
}

/// One person in the test directory: uid, display name, password, groups (by cn).
pub struct Person<'a> {
    pub uid: &'a str,
    pub cn: &'a str,
    pub password: &'a str,
    pub groups: &'a [&'a str],
}

impl Slapd {
    /// Starts slapd with StartTLS on a free port and LDAPS on another, loaded with `people` and the groups they name.
    pub fn start(dir: &Path, people: &[Person<'_>]) -> Slapd {
        let dir = dir.join("slapd");
        std::fs::create_dir_all(dir.join("db")).expect("mkdir");
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("certificate");
        let ca_file = dir.join("server.pem");
        std::fs::write(&ca_file, ck.cert.pem()).expect("write cert");
        std::fs::write(dir.join("server.key"), ck.signing_key.serialize_pem()).expect("write key");
        let d = dir.display();
        let conf = format!(
            "include /etc/ldap/schema/core.schema\ninclude /etc/ldap/schema/cosine.schema\n\
             include /etc/ldap/schema/inetorgperson.schema\ninclude /etc/ldap/schema/nis.schema\n\
             pidfile {d}/slapd.pid\nmodulepath /usr/lib/ldap\nmoduleload back_mdb\n\
             TLSCertificateFile {d}/server.pem\nTLSCertificateKeyFile {d}/server.key\n\
             database mdb\nmaxsize 10485760\nsuffix \"{BASE}\"\nrootdn \"{ROOT_DN}\"\nrootpw {ROOT_PASSWORD}\n\
             directory {d}/db\n\
             access to attrs=userPassword by self =xw by anonymous auth by * none\n\
             access to * by dn.exact=\"{SERVICE_DN}\" read by * none\n"
        );
        std::fs::write(dir.join("slapd.conf"), conf).expect("write conf");
        std::fs::write(dir.join("data.ldif"), ldif(people)).expect("write ldif");
        let out = Command::new("/usr/sbin/slapadd")
            .args(["-f", &format!("{d}/slapd.conf"), "-l", &format!("{d}/data.ldif")])
            .output()
            .expect("run slapadd");
        assert!(out.status.success(), "slapadd: {}", String::from_utf8_lossy(&out.stderr));
        let (port, tls_port) = (free_port(), free_port());
        let url = format!("ldap://127.0.0.1:{port}");
        let ldaps_url = format!("ldaps://127.0.0.1:{tls_port}");
        let child = Command::new("/usr/sbin/slapd")
            .args(["-f", &format!("{d}/slapd.conf"), "-h", &format!("{url}/ {ldaps_url}/"), "-d", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn slapd");
        let child = KillOnDrop(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        for p in [port, tls_port] {
            while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
                assert!(Instant::now() < deadline, "slapd did not listen on {p}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Slapd { _child: child, url, ldaps_url, ca_file, dir }
    }

    /// Applies an LDIF change as the directory's administrator (what the hospital's IT does).
    pub fn modify(&self, ldif: &str) {
        let f = self.dir.join("change.ldif");
        std::fs::write(&f, ldif).expect("write change");
        let out = Command::new("/usr/bin/ldapmodify")
            .args(["-x", "-H", &self.url, "-D", ROOT_DN, "-w", ROOT_PASSWORD, "-f"])
            .arg(&f)
            .output()
            .expect("run ldapmodify");
        assert!(out.status.success(), "ldapmodify: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn ldif(people: &[Person<'_>]) -> String {
    let mut s = format!(
        "dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\no: Hospital\ndc: hospital\n\n\
         dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people\n\n\
         dn: ou=groups,{BASE}\nobjectClass: organizationalUnit\nou: groups\n\n\
         dn: ou=services,{BASE}\nobjectClass: organizationalUnit\nou: services\n\n\
         dn: {SERVICE_DN}\nobjectClass: person\ncn: care\nsn: care\nuserPassword: {SERVICE_PASSWORD}\n\n"
    );
    let mut groups: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for p in people {
        s += &format!(
            "dn: uid={},ou=people,{BASE}\nobjectClass: inetOrgPerson\nuid: {}\ncn: {}\nsn: {}\nuserPassword: {}\n\n",
            p.uid, p.uid, p.cn, p.cn, p.password
        );
        for g in p.groups {
            groups.entry(g).or_default().push(p.uid);
        }
    }
    for (g, members) in groups {
        s += &format!("dn: cn={g},ou=groups,{BASE}\nobjectClass: groupOfNames\ncn: {g}\n");
        for m in members {
            s += &format!("member: uid={m},ou=people,{BASE}\n");
        }
        s += "\n";
    }
    s
}

/// node-oidc-provider, from `tests/oidc` (packaging/dev.sh runs `npm ci` there).
pub fn oidc_provider_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc")
}

pub fn oidc_available() -> bool {
    oidc_provider_dir().join("node_modules/oidc-provider").is_dir()
        && Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success())
}

pub struct OidcProvider {
    _child: KillOnDrop,
    pub issuer: String,
}

impl OidcProvider {
    pub fn start(client_id: &str, client_secret: &str, redirect_uri: &str) -> OidcProvider {
        let port = free_port();
        let mut child = Command::new("node")
            .arg(oidc_provider_dir().join("provider.mjs"))
            .args([&port.to_string(), client_id, client_secret, redirect_uri])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn node oidc provider");
        let stdout = child.stdout.take().expect("stdout");
        let child = KillOnDrop(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(i) = line.strip_prefix("issuer ") {
                    let _ = tx.send(i.to_string());
                }
            }
        });
        let issuer = rx.recv_timeout(Duration::from_secs(30)).expect("the OIDC provider did not start");
        OidcProvider { _child: child, issuer }
    }

    /// An ID token with these claims, signed with the provider's own key.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let c = reqwest::blocking::Client::new();
        let r = c.post(format!("{}/test/sign", self.issuer)).body(claims.to_string()).send().expect("sign");
        assert!(r.status().is_success());
        r.text().expect("token")
    }
}
