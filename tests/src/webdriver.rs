//! A minimal W3C WebDriver client over blocking HTTP, enough to drive headless Chromium through chromedriver
//! (Debian packages `chromium` and `chromium-driver`). No browser-automation crate: the protocol is a handful of
//! JSON calls.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    http: reqwest::blocking::Client,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

#[derive(Debug, Clone)]
pub struct Element(String);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Whether chromium and chromedriver are installed (packaging/dev.sh setup installs them).
pub fn available() -> bool {
    ["chromium", "chromedriver"].iter().all(|b| which(b).is_some())
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(bin)).find(|p| p.exists())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with a fresh profile. Chromium's background
    /// connections are switched off (the appliance's network is closed) and the self-signed certificate accepted.
    pub fn start(width: u32, height: u32) -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while http.get(format!("{base}/status")).send().is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--ignore-certificate-errors".into(),
            "--lang=zh-CN".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {"binary": which("chromium").unwrap(), "args": args}
        }}});
        let mut b = Browser { driver, http, base, session: String::new(), _profile: profile };
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().expect("session id").to_string();
        b
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let req = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url).json(&body.unwrap_or(json!({}))),
        };
        let resp = req.send().unwrap_or_else(|e| panic!("webdriver {method} {path}: {e}"));
        let status = resp.status();
        let v: Value = resp.json().unwrap_or(Value::Null);
        assert!(status.is_success(), "webdriver {method} {path}: {status} {v}");
        v["value"].clone()
    }

    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url})));
    }

    pub fn url(&self) -> String {
        self.call("GET", "/url", None).as_str().unwrap_or_default().to_string()
    }

    pub fn source(&self) -> String {
        self.call("GET", "/source", None).as_str().unwrap_or_default().to_string()
    }

    pub fn find(&self, css: &str) -> Element {
        let v = self.call("POST", "/element", Some(json!({"using": "css selector", "value": css})));
        Element(v[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {v}")).to_string())
    }

    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let v = self.call("POST", "/elements", Some(json!({"using": "css selector", "value": css})));
        v.as_array()
            .map(|a| a.iter().filter_map(|e| e[ELEMENT].as_str().map(|s| Element(s.to_string()))).collect())
            .unwrap_or_default()
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{}/clear", e.0), None);
        self.call("POST", &format!("/element/{}/value", e.0), Some(json!({"text": text})));
    }

    pub fn send_keys(&self, e: &Element, text: &str) {
        self.call("POST", &format!("/element/{}/value", e.0), Some(json!({"text": text})));
    }

    pub fn click(&self, css: &str) {
        let e = self.find(css);
        self.click_el(&e);
    }

    pub fn click_el(&self, e: &Element) {
        self.call("POST", &format!("/element/{}/click", e.0), None);
    }

    pub fn text(&self, css: &str) -> String {
        let e = self.find(css);
        self.call("GET", &format!("/element/{}/text", e.0), None).as_str().unwrap_or_default().to_string()
    }

    /// Accepts the page's open `window.confirm` (a form that asks first), waiting up to a few seconds for it.
    pub fn accept_confirm(&self, expect: &str) {
        self.answer_confirm(expect, true);
    }

    /// Declines it (取消): the form is not sent.
    pub fn dismiss_confirm(&self, expect: &str) {
        self.answer_confirm(expect, false);
    }

    fn answer_confirm(&self, expect: &str, accept: bool) {
        let started = Instant::now();
        loop {
            let resp = self.http.get(format!("{}/session/{}/alert/text", self.base, self.session)).send();
            if let Ok(r) = resp
                && r.status().is_success()
            {
                let v: Value = r.json().unwrap_or(Value::Null);
                let text = v["value"].as_str().unwrap_or_default().to_string();
                assert!(text.contains(expect), "the question asked: {text}");
                self.call("POST", if accept { "/alert/accept" } else { "/alert/dismiss" }, Some(json!({})));
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no confirmation was asked");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls until `cond` holds for the page source, or panics with the last source after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, cond: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let src = self.source();
            if cond(&src) {
                return src;
            }
            assert!(started.elapsed() < timeout, "timed out waiting for {what}; page:\n{src}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Saves a PNG screenshot of the viewport.
    pub fn screenshot(&self, path: &Path) {
        let v = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("base64 screenshot");
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the page and returns what it returns.
    pub fn execute(&self, script: &str, args: Value) -> Value {
        self.call("POST", "/execute/sync", Some(json!({"script": script, "args": args})))
    }

    /// Runs `script` in the page; it ends by calling its last argument with the result, which this returns.
    pub fn execute_async(&self, script: &str, args: Value) -> Value {
        self.call("POST", "/execute/async", Some(json!({"script": script, "args": args})))
    }

    pub fn set_window(&self, width: u32, height: u32) {
        self.call("POST", "/window/rect", Some(json!({"width": width, "height": height})));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.http.delete(format!("{}/session/{}", self.base, self.session)).send();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
