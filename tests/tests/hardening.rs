//! Hostile requests against the real `care serve` (issue "Hardening"): none may take the process down, answer 500
//! or grow its memory past a stated bound, and refused attempts leave audit records. Every hostile input is
//! generated here; nothing large is committed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use care_e2e::{Care, Served, add_user, cookie_value, page_csrf, set_cookies, token, two_collections};
use care_server::errors::has_chinese;
use care_server::table::ROUTES;
use reqwest::blocking::{Body, Client, Response};

const ADMIN_PW: &str = "admin-passphrase-1";
const CLIN_PW: &str = "clinician-passphrase-1";

fn client() -> Client {
    care_e2e::no_redirect_client(Duration::from_secs(120))
}

/// Two collections sharing terms (a leak between them would show), an admin, a clinician granted one of them and a
/// clinician granted none.
struct Site {
    _t: tempfile::TempDir,
    dir: PathBuf,
    care: Care,
    admin: String,
    clin: String,
    nogrant: String,
    secret_doc: i64,
    secret_chunk: i64,
}

fn site(env: &[(&str, &str)]) -> Site {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().to_path_buf();
    let mut care = Care::new(&dir.join("data"));
    care.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    care.ok(&["init"]);
    two_collections(&care, &dir);
    add_user(&care, &dir, "admin", "admin", ADMIN_PW);
    add_user(&care, &dir, "drwang", "clinician", CLIN_PW);
    add_user(&care, &dir, "drli", "clinician", CLIN_PW);
    care.ok(&["user", "grant", "drwang", "granted"]);
    let (admin, clin, nogrant) =
        (token(&care, "admin", "hardening"), token(&care, "drwang", "hardening"), token(&care, "drli", "hardening"));
    let secret = care.json(&["search", "--json", "-c", "secret", "阿司匹林"]);
    let secret_doc = secret["hits"][0]["document_id"].as_i64().unwrap();
    let secret_chunk = secret["hits"][0]["chunk_id"].as_i64().unwrap();
    Site { _t: t, dir, care, admin, clin, nogrant, secret_doc, secret_chunk }
}

fn alive(served: &mut Served, c: &Client) {
    assert!(served.child.0.try_wait().unwrap().is_none(), "care serve died");
    let res = c.get(format!("{}/healthz", served.https)).send().expect("server answers");
    assert_eq!(res.status(), 200);
}

fn get(c: &Client, url: &str, bearer: &str) -> Response {
    c.get(url).bearer_auth(bearer).send().unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Integers at and past every boundary a handler could trip on (u64/i64/u32 limits, negatives, floats, NaN).
const EXTREMES: &[&str] = &[
    "-1",
    "0",
    "4294967296",
    "100000000000",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e400",
    "NaN",
];

/// Every numeric name a route reads from its query string, form or JSON body.
const NUMERIC: &[&str] = &["limit", "offset", "page", "judged", "chunk", "chunk_id", "id"];

fn hostile_request(c: &Client, method: &str, url: &str, v: &str, bearer: &str) -> Result<Response, reqwest::Error> {
    let form: String = NUMERIC.iter().map(|k| format!("{k}={v}&")).collect::<String>() + "q=x&helpful=1";
    let json = format!(
        "{{\"chunk_id\": {v}, \"limit\": {v}, \"offset\": {v}, \"query\": \"x\", \"helpful\": true, \"approved\": true}}"
    );
    let rb = match method {
        "GET" => c.get(url),
        "POST" => c.post(url),
        "PUT" => c.put(url),
        "PATCH" => c.patch(url),
        "DELETE" => c.delete(url),
        m => panic!("method {m}"),
    };
    let rb = rb.bearer_auth(bearer);
    let rb = if url.contains("/api/") {
        rb.header("content-type", "application/json").body(json)
    } else {
        rb.header("content-type", "application/x-www-form-urlencoded").body(form)
    };
    rb.send()
}

#[test]
fn extreme_integers_in_every_numeric_parameter_never_kill_the_server_or_answer_500() {
    // Every route is sent each value, 立即备份 too: its backups go to a folder that cannot be made, so each fails at
    // once instead of archiving the site's model (a fifth of a gigabyte a time).
    let s = site(&[("CARE__BACKUP__DIR", "/proc/care-no-backups")]);
    let mut served = s.care.serve_full();
    let c = client();
    // The finding itself: an offset past any page aborted the process (tantivy preallocates offset + limit).
    for off in ["100000000000", "18446744073709551615", "1001"] {
        let res =
            get(&c, &format!("{}/api/v1/search?q=%E9%AB%98%E8%A1%80%E5%8E%8B&offset={off}", served.https), &s.clin);
        assert_eq!(res.status(), 400, "offset={off}");
        let body: serde_json::Value = res.json().unwrap();
        assert!(body["message"].as_str().unwrap().contains("max_offset"), "{body}");
    }
    alive(&mut served, &c);
    let mut sent = 0;
    for route in ROUTES {
        for v in EXTREMES {
            // Every path parameter gets the value too ({id}, {name}, {collection}, {file}).
            let mut path = String::new();
            let mut rest = route.pattern;
            while let Some(i) = rest.find('{') {
                let j = rest[i..].find('}').unwrap() + i;
                path.push_str(&rest[..i]);
                path.push_str(v);
                rest = &rest[j + 1..];
            }
            path.push_str(rest);
            let query: String = NUMERIC.iter().map(|k| format!("{k}={v}&")).collect::<String>() + "q=%E9%98%BF";
            let url = format!("{}{path}?{query}", served.https);
            for who in [&s.admin, &s.clin] {
                let res = hostile_request(&c, route.method, &url, v, who)
                    .unwrap_or_else(|e| panic!("{} {url}: no answer ({e})", route.method));
                let status = res.status().as_u16();
                assert!(status < 500, "{} {url} answered {status}: {}", route.method, res.text().unwrap_or_default());
                sent += 1;
            }
        }
    }
    eprintln!("{sent} hostile requests over {} routes", ROUTES.len());
    alive(&mut served, &c);
}

/// Peak resident memory of a process (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

const MIB: u64 = 1 << 20;

/// `prefix` then `n` bytes of `a`: a large body generated on the fly, sized (Content-Length) or chunked.
fn big_body(prefix: &str, n: u64, sized: bool) -> Body {
    let r = std::io::Cursor::new(prefix.as_bytes().to_vec()).chain(std::io::repeat(b'a').take(n));
    if sized { Body::sized(r, prefix.len() as u64 + n) } else { Body::new(r) }
}

/// The login form's double-submit token (cookie and form field carry the same value).
fn login_csrf(c: &Client, base: &str) -> String {
    let res = c.get(format!("{base}/login")).send().unwrap();
    cookie_value(&set_cookies(res.headers()), "__Host-care_login_csrf").expect("login csrf cookie")
}

fn session(c: &Client, base: &str, user: &str, pw: &str) -> String {
    let token = login_csrf(c, base);
    let res = c
        .post(format!("{base}/login"))
        .header("cookie", format!("__Host-care_login_csrf={token}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("username={user}&password={pw}&csrf={token}"))
        .send()
        .unwrap();
    assert_eq!(res.status(), 303, "login of {user}");
    let v = cookie_value(&set_cookies(res.headers()), "__Host-care_session").expect("session cookie");
    format!("__Host-care_session={v}")
}

/// Memory bound: oversized bodies to every route class. The server's peak RSS may grow by less than
/// `BOUND_MIB` over all of them together, where buffering any one body would add hundreds of MiB.
#[test]
fn oversized_bodies_to_every_route_class_leave_memory_bounded() {
    const BOUND_MIB: u64 = 64;
    // The upload limit stays above the form and JSON bodies sent: a payload limit must not be what saves them (before
    // the fix, the CSRF check buffered a form up to the upload limit).
    let s = site(&[("CARE__SERVER__MAX_UPLOAD_MIB", "400")]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let pid = served.child.0.id();
    let ck = session(&c, &base, "admin", ADMIN_PW);
    let login_token = login_csrf(&c, &base);
    // Warm every route class once with a normal request, so the baseline includes the server's working set.
    get(&c, &format!("{base}/api/v1/search?q=%E9%98%BF"), &s.admin);
    let before = peak_rss(pid);
    // (what, request, body size)
    type Sender<'a> = Box<dyn Fn() -> Result<Response, reqwest::Error> + Sync + 'a>;
    let login_cookie = format!("__Host-care_login_csrf={login_token}");
    let cases: Vec<(&str, Sender)> = vec![
        (
            "anonymous form, 300 MiB declared",
            Box::new(|| {
                c.post(format!("{base}/login"))
                    .header("cookie", &login_cookie)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(big_body("username=x&password=", 300 * MIB, true))
                    .send()
            }),
        ),
        (
            "anonymous form, 300 MiB chunked",
            Box::new(|| {
                c.post(format!("{base}/login"))
                    .header("cookie", &login_cookie)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(big_body("username=x&password=", 300 * MIB, false))
                    .send()
            }),
        ),
        (
            "signed-in form, 300 MiB chunked",
            Box::new(|| {
                c.post(format!("{base}/admin/collections"))
                    .header("cookie", &ck)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(big_body("name=", 300 * MIB, false))
                    .send()
            }),
        ),
        (
            "JSON, 300 MiB chunked",
            Box::new(|| {
                c.post(format!("{base}/api/v1/feedback"))
                    .bearer_auth(&s.admin)
                    .header("content-type", "application/json")
                    .body(big_body("{\"query\": \"", 300 * MIB, false))
                    .send()
            }),
        ),
        (
            "upload, 420 MiB over a 400 MiB limit (streamed to disk)",
            Box::new(|| {
                let head = "--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n\r\n";
                c.post(format!("{base}/api/v1/admin/collections/granted/files"))
                    .bearer_auth(&s.admin)
                    .header("content-type", "multipart/form-data; boundary=b0undary")
                    .body(big_body(head, 420 * MIB, false))
                    .send()
            }),
        ),
    ];
    for (what, send) in &cases {
        let t0 = Instant::now();
        match send() {
            Ok(res) => assert!(
                matches!(res.status().as_u16(), 400 | 403 | 413),
                "{what}: answered {}: {}",
                res.status(),
                res.text().unwrap_or_default()
            ),
            // The server may close the connection after refusing, while the client is still sending.
            Err(e) => eprintln!("{what}: connection closed early ({e})"),
        }
        eprintln!("{what}: {:.1} s, peak RSS +{} MiB", t0.elapsed().as_secs_f64(), (peak_rss(pid) - before) / MIB);
        alive(&mut served, &c);
    }
    // Three at once: the finding's 1 GB case.
    std::thread::scope(|sc| {
        for _ in 0..3 {
            sc.spawn(|| {
                let _ = cases[0].1();
            });
        }
    });
    let grew = peak_rss(pid).saturating_sub(before);
    eprintln!("peak RSS grew by {} MiB over all oversized bodies (bound {BOUND_MIB} MiB)", grew / MIB);
    assert!(grew < BOUND_MIB * MIB, "peak RSS grew by {} MiB", grew / MIB);
    alive(&mut served, &c);
}

fn audit_actions(care: &Care, actor: &str) -> Vec<serde_json::Value> {
    let list = care.json(&["audit", "list", "--json", "-n", "1000"]);
    list.as_array().unwrap().iter().filter(|r| r["actor"] == actor).cloned().collect()
}

#[test]
fn refused_attempts_are_audited_and_paths_redirects_and_messages_cannot_be_steered() {
    let s = site(&[]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();

    // Denied and rejected attempts: a 403/404/400 to the caller, a record in the audit log.
    let r = get(&c, &format!("{base}/api/v1/search?q=%E9%98%BF&collection=secret"), &s.clin);
    assert_eq!(r.status(), 403);
    let r = get(&c, &format!("{base}/api/v1/documents/{}", s.secret_doc), &s.clin);
    assert_eq!(r.status(), 404);
    let fb = format!("{{\"query\":\"阿司匹林\",\"chunk_id\":{},\"helpful\":true}}", s.secret_chunk);
    let r = c.post(format!("{base}/api/v1/feedback")).bearer_auth(&s.clin).header("content-type", "application/json");
    assert_eq!(r.body(fb).send().unwrap().status(), 404);
    let long = "阿".repeat(1001);
    let r = c.get(format!("{base}/api/v1/search")).bearer_auth(&s.clin).query(&[("q", long.as_str())]).send().unwrap();
    assert_eq!(r.status(), 400);
    // A user with no grants gets the same query limits (it used to bypass them).
    let r =
        c.get(format!("{base}/api/v1/search")).bearer_auth(&s.nogrant).query(&[("q", long.as_str())]).send().unwrap();
    assert_eq!(r.status(), 400);
    let actions: Vec<String> =
        audit_actions(&s.care, "drwang").iter().map(|r| r["action"].as_str().unwrap().to_string()).collect();
    for want in ["search.denied", "document.denied", "feedback.denied", "search.rejected"] {
        assert!(actions.iter().any(|a| a == want), "no {want} record for drwang: {actions:?}");
    }
    assert!(audit_actions(&s.care, "drli").iter().any(|r| r["action"] == "search.rejected"));

    // Open redirect: `next` with a TAB (browsers drop it: `//evil.example`) or another control character.
    let ck = session(&c, &base, "drwang", CLIN_PW);
    for next in
        ["/%09/evil.example/", "/%0B/evil.example/", "/%5C/evil.example", "//evil.example", "https://evil.example"]
    {
        let res = c.get(format!("{base}/login?next={next}")).header("cookie", &ck).send().unwrap();
        assert_eq!(res.status(), 303, "next={next}");
        assert_eq!(res.headers()["location"], "/search", "next={next}");
    }
    let res = c.get(format!("{base}/login?next=/doc/1%3Fx%3D1")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.headers()["location"], "/doc/1?x=1", "a local path still works");

    // Admin pages do not show a message taken from a crafted URL.
    let ack = session(&c, &base, "admin", ADMIN_PW);
    let bait = "请把密码发到 evil.example";
    let res = c.get(format!("{base}/admin/users")).query(&[("flash", bait), ("error", bait)]).header("cookie", &ack);
    let html = res.send().unwrap().text().unwrap();
    assert!(!html.contains(bait), "a flash message from the URL was shown");
    // A real action's message is still shown after its redirect.
    let csrf = page_csrf(&html);
    let res = c
        .post(format!("{base}/admin/collections"))
        .header("cookie", &ack)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("name=fromform&csrf={csrf}"))
        .send()
        .unwrap();
    assert_eq!(res.status(), 303);
    let loc = res.headers()["location"].to_str().unwrap().to_string();
    let html = c.get(format!("{base}{loc}")).header("cookie", &ack).send().unwrap().text().unwrap();
    assert!(html.contains("已创建资料库 fromform"), "{loc}");

    // Creating a collection writes one audit record, not two.
    let r = c.post(format!("{base}/api/v1/admin/collections")).bearer_auth(&s.admin);
    let r = r.header("content-type", "application/json").body(r#"{"name":"viaapi"}"#).send().unwrap();
    assert_eq!(r.status(), 201);
    let creates = audit_actions(&s.care, "admin")
        .into_iter()
        .filter(|r| r["action"] == "collection.create" && r["detail"].to_string().contains("viaapi"))
        .count();
    assert_eq!(creates, 1);

    // The plain-HTTP redirector never echoes a Host header it does not serve.
    let http = served.http.clone().unwrap();
    let res = c.get(format!("{http}/search")).header("host", "evil.example").send().unwrap();
    assert_eq!(res.status(), 308);
    let loc = res.headers()["location"].to_str().unwrap();
    assert!(loc.starts_with("https://127.0.0.1:"), "{loc}");

    // Too many files in one upload: refused with a message, nothing queued.
    let mut body = Vec::new();
    for i in 0..=1000 {
        body.extend_from_slice(
            format!("--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.md\"\r\n\r\n# {i}\n\r\n")
                .as_bytes(),
        );
    }
    body.extend_from_slice(b"--b0--\r\n");
    let r = c.post(format!("{base}/api/v1/admin/collections/granted/files")).bearer_auth(&s.admin);
    let r = r.header("content-type", "multipart/form-data; boundary=b0").body(body).send().unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().unwrap().contains("1000"));

    // A password typed into the user-name field is not written to the audit log; unknown names are throttled
    // like accounts, and a disabled account answers like a wrong password.
    let typed = "Correct-Horse-Battery-Staple-77";
    for i in 1..=6 {
        let token = login_csrf(&c, &base);
        let res = c
            .post(format!("{base}/login"))
            .header("cookie", format!("__Host-care_login_csrf={token}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("username={typed}&password=whatever-{i}&csrf={token}"))
            .send()
            .unwrap();
        assert_eq!(res.status(), if i < 5 { 401 } else { 423 }, "attempt {i}");
    }
    let log = s.care.ok(&["audit", "list", "--json", "-n", "1000"]);
    assert!(!log.contains(typed), "the attempted name reached the audit log");

    // Sources shown to clinicians are file names, not folders on the server.
    let hits = get(&c, &format!("{base}/api/v1/search?q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97"), &s.clin);
    let hits: serde_json::Value = hits.json().unwrap();
    let source = hits["hits"][0]["source"].as_str().unwrap().to_string();
    assert_eq!(source, "aspirin.md");
    assert!(!hits.to_string().contains(s.dir.to_str().unwrap()));
    alive(&mut served, &c);

    // The CLI names the operating-system account, not whatever $USER says.
    let mut cmd = s.care.command(&["collection", "create", "cli-made"]);
    let out = cmd.env("USER", "forged-user").env("LOGNAME", "forged-user").output().unwrap();
    assert!(out.status.success());
    let log = s.care.ok(&["audit", "list", "--json", "-n", "5"]);
    assert!(!log.contains("forged-user") && log.contains("\"cli:"), "{log}");

    // The data directory and the metadata file are the appliance's alone.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&s.care.data_dir), 0o700);
        assert_eq!(mode(&s.care.data_dir.join("care.sqlite")), 0o600);
    }
}

/// Uploads `files` (name, bytes) to the collection `granted` in one multipart request; returns the job's id.
fn upload_files(c: &Client, base: &str, admin: &str, files: &[(&str, &[u8])]) -> i64 {
    let mut body = Vec::new();
    for (name, bytes) in files {
        body.extend(
            format!("--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\r\n").as_bytes(),
        );
        body.extend(*bytes);
        body.extend(b"\r\n");
    }
    body.extend(b"--b0--\r\n");
    let r = c.post(format!("{base}/api/v1/admin/collections/granted/files")).bearer_auth(admin);
    let r = r.header("content-type", "multipart/form-data; boundary=b0").body(body).send().unwrap();
    assert_eq!(r.status(), 202);
    r.json::<serde_json::Value>().unwrap()["job_id"].as_i64().unwrap()
}

/// Polls job `job` until it is done or failed (at most `limit`); returns its last view.
fn job_end(c: &Client, base: &str, admin: &str, job: i64, limit: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let j: serde_json::Value = get(c, &format!("{base}/api/v1/admin/jobs/{job}"), admin).json().unwrap();
        if j["state"] == "done" || j["state"] == "failed" {
            return j;
        }
        assert!(t0.elapsed() < limit, "job did not end: {j}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The finding: 50,000 nested `<div>` overflowed the ingest worker's stack and killed `care serve`, again at every
/// restart. Now such a file is refused with its own error while the rest of its upload is indexed, and the server
/// stays up.
#[test]
fn deeply_nested_html_upload_does_not_kill_the_server() {
    let s = site(&[]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let n = 50_000;
    let html = format!("<html><body>{}<p>深层嵌套</p>{}</body></html>", "<div>".repeat(n), "</div>".repeat(n));
    let files: [(&str, &[u8]); 2] =
        [("nested.html", html.as_bytes()), ("ok.md", "# 胰岛素\n\n胰岛素注射部位应轮换。\n".as_bytes())];
    let job = upload_files(&c, &base, &s.admin, &files);
    let state = job_end(&c, &base, &s.admin, job, Duration::from_secs(120));
    assert_eq!(state["state"], "done", "{state}");
    let errors = state["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{state}");
    assert_eq!(errors[0]["code"], "malformed_record", "{state}");
    assert!(errors[0]["file"].as_str().unwrap().contains("nested.html"), "{state}");
    alive(&mut served, &c);
    let hits: serde_json::Value =
        get(&c, &format!("{base}/api/v1/search?q=%E8%83%B0%E5%B2%9B%E7%B4%A0&method=bm25"), &s.admin).json().unwrap();
    assert!(hits.to_string().contains("ok.md"), "{hits}");
}

/// One address guessing across many names: after `auth.address_lock_after_failures` failures (sign-ins and wrong
/// current passwords together) it gets 429 `rate_limited` with a Chinese message, even for a right password, and
/// the failure that filled the window is audited once.
#[test]
fn one_address_guessing_across_names_is_limited_and_current_password_checks_count() {
    let s = site(&[("CARE__AUTH__ADDRESS_LOCK_AFTER_FAILURES", "4")]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let change = |current: &str| {
        c.post(format!("{base}/api/v1/me/password"))
            .bearer_auth(&s.nogrant)
            .header("content-type", "application/json")
            .body(serde_json::json!({"current": current, "new": "a-new-passphrase-2"}).to_string())
            .send()
            .unwrap()
    };
    let login = |user: &str, pw: &str| {
        let token = login_csrf(&c, &base);
        c.post(format!("{base}/login"))
            .header("cookie", format!("__Host-care_login_csrf={token}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("username={user}&password={pw}&csrf={token}"))
            .send()
            .unwrap()
    };
    for _ in 0..2 {
        let r = change("not-my-password");
        assert_eq!(r.status(), 400);
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(body["code"], "invalid_input");
        assert!(body["message"].as_str().unwrap().contains("当前密码错误"), "{body}");
    }
    for i in 0..2 {
        assert_eq!(login(&format!("guess{i}"), "whatever").status(), 401);
    }
    let r = login("drwang", CLIN_PW);
    assert_eq!(r.status(), 429, "a full window refuses even a right password");
    assert!(r.text().unwrap().contains("此地址的登录失败次数过多"));
    let r = change(CLIN_PW);
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["code"], "rate_limited");
    let throttled = audit_actions(&s.care, "system").iter().filter(|r| r["action"] == "auth.address_throttled").count();
    assert_eq!(throttled, 1);
    assert!(audit_actions(&s.care, "drli").iter().any(|r| r["action"] == "user.password_check_failed"));
    alive(&mut served, &c);
}

/// What actix could not parse (a query, a JSON body, a form, a path) is answered in Chinese with its code, and an
/// upload's CSRF token travels in the form's first field, never in the URL: a token put in the URL is refused.
#[test]
fn parse_errors_are_chinese_and_no_token_rides_in_a_url() {
    let s = site(&[]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let check = |r: Response, code: &str| {
        let status = r.status();
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(body["code"], code, "{status} {body}");
        assert!(has_chinese(body["message"].as_str().unwrap()), "English-only: {body}");
    };
    check(get(&c, &format!("{base}/api/v1/search?q=x&limit=abc"), &s.clin), "invalid_input");
    check(get(&c, &format!("{base}/api/v1/documents/not-a-number"), &s.clin), "invalid_input");
    let post_json = |path: &str, body: &str| {
        c.post(format!("{base}{path}"))
            .bearer_auth(&s.admin)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap()
    };
    check(post_json("/api/v1/admin/collections", "{\"name\": "), "invalid_input");
    check(post_json("/api/v1/admin/collections", &format!("{{\"name\": \"{}\"}}", "x".repeat(2 << 20))), "too_large");

    let ack = session(&c, &base, "admin", ADMIN_PW);
    let html = c.get(format!("{base}/admin/collections")).header("cookie", &ack).send().unwrap().text().unwrap();
    let csrf = page_csrf(&html);
    assert!(!html.contains(&format!("csrf={csrf}")), "the page puts the token in a URL");
    let upload = |url: String, first_field: Option<&str>| {
        let mut body = String::new();
        if let Some(t) = first_field {
            body.push_str(&format!("--b1\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{t}\r\n"));
        }
        body.push_str("--b1\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\n");
        body.push_str("高血压患者的饮食建议。\r\n--b1--\r\n");
        c.post(url)
            .header("cookie", &ack)
            .header("content-type", "multipart/form-data; boundary=b1")
            .body(body)
            .send()
            .unwrap()
    };
    let r = upload(format!("{base}/admin/collections/granted/upload?csrf={csrf}"), None);
    assert_eq!(r.status(), 403, "a token in the URL is no token");
    let r = upload(format!("{base}/admin/collections/granted/upload"), Some("wrong"));
    assert_eq!(r.status(), 403);
    let r = upload(format!("{base}/admin/collections/granted/upload"), Some(&csrf));
    assert_eq!(r.status(), 303, "the form's first field carries it");

    // A finished upload's job (its staging folder removed) still names its files as uploaded, not by the server's
    // folder; so do the job list and a rejected file's message.
    let job = upload_files(
        &c,
        &base,
        &s.admin,
        &[("ok.txt", "高血压患者的饮食建议。".as_bytes()), ("bad.pdf", b"%PDF-1.4 x")],
    );
    let j = job_end(&c, &base, &s.admin, job, Duration::from_secs(120));
    let all = get(&c, &format!("{base}/api/v1/admin/jobs"), &s.admin).text().unwrap();
    let page = c.get(format!("{base}/admin/jobs")).header("cookie", &ack).send().unwrap().text().unwrap();
    let data_dir = s.care.data_dir.to_str().unwrap();
    for text in [j.to_string(), all, page] {
        assert!(!text.contains(data_dir) && !text.contains("uploads/"), "a server path is shown: {text}");
    }
    assert_eq!(j["files"], serde_json::json!(["ok.txt", "bad.pdf"]), "{j}");
    alive(&mut served, &c);
}

/// Uploads and imports stop at `[training] keep_free_gb`: with a reserve larger than the disk, a file upload, a
/// model package upload and a judgment upload answer 503 `disk_full` with the Chinese reason (not 500, nothing
/// left under uploads/), `/healthz` says unhealthy, and search still answers.
#[test]
fn uploads_and_imports_below_the_disk_reserve_answer_disk_full() {
    let s = site(&[("CARE__TRAINING__KEEP_FREE_GB", "1000000")]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let part =
        "--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.md\"\r\n\r\n# 阿司匹林\n\r\n--b0--\r\n";
    for url in [
        format!("{base}/api/v1/admin/collections/granted/files"),
        format!("{base}/api/v1/admin/models"),
        format!("{base}/api/v1/admin/collections/granted/judgments/s1"),
    ] {
        let r = c.post(&url).bearer_auth(&s.admin).header("content-type", "multipart/form-data; boundary=b0");
        let r = r.body(part).send().unwrap();
        assert_eq!(r.status(), 503, "{url}");
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(body["code"], "disk_full", "{url}: {body}");
        let msg = body["message"].as_str().unwrap();
        assert!(msg.contains("磁盘空间不足") && msg.contains("keep_free_gb"), "{url}: {msg}");
    }
    let left = std::fs::read_dir(s.care.data_dir.join("uploads")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "an upload refused for space left files behind");
    let h = c.get(format!("{base}/healthz")).send().unwrap();
    assert_eq!(h.status(), 503);
    let r = get(&c, &format!("{base}/api/v1/search?q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97"), &s.clin);
    assert_eq!(r.status(), 200);
    assert!(served.child.0.try_wait().unwrap().is_none(), "care serve died");
}

/// `[limits]` over HTTP: a second schedule past max_schedules 1 is 409 `limit_reached`; a clinician's third feedback
/// in an hour past feedback_per_user_per_hour 2 is 429 `rate_limited`, both with Chinese messages.
#[test]
fn schedules_and_feedback_are_capped_over_http() {
    let s = site(&[("CARE__LIMITS__MAX_SCHEDULES", "1"), ("CARE__LIMITS__FEEDBACK_PER_USER_PER_HOUR", "2")]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let post = |url: &str, bearer: &str, body: String| {
        c.post(format!("{base}{url}"))
            .bearer_auth(bearer)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap()
    };
    let spec = r#"{"weekday": 6, "time": "02:00"}"#.to_string();
    assert!(post("/api/v1/admin/training/schedules", &s.admin, spec.clone()).status().is_success());
    let r = post("/api/v1/admin/training/schedules", &s.admin, spec);
    assert_eq!(r.status(), 409);
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["code"], "limit_reached");
    assert!(body["message"].as_str().unwrap().contains("训练计划已达上限"), "{body}");

    let hits: serde_json::Value =
        get(&c, &format!("{base}/api/v1/search?q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97"), &s.clin).json().unwrap();
    let chunk = hits["hits"][0]["chunk_id"].as_i64().unwrap();
    let fb = serde_json::json!({"query": "阿司匹林", "chunk_id": chunk, "helpful": true}).to_string();
    for _ in 0..2 {
        assert_eq!(post("/api/v1/feedback", &s.clin, fb.clone()).status(), 201);
    }
    let r = post("/api/v1/feedback", &s.clin, fb);
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["code"], "rate_limited");
    assert!(body["message"].as_str().unwrap().contains("反馈过于频繁"), "{body}");
    alive(&mut served, &c);
}

/// Guard refusals are audited but rate-limited: 100 requests with a wrong API token leave at most
/// `REFUSALS_PER_ADDRESS` `request.unauthenticated` records; a clinician on an admin route and a form post without
/// its CSRF token leave theirs. An admin's failed model upload does not show the server's staging folder. The audit
/// log is checkpointed when `care serve` stops and after a CLI write: cutting the last record off afterwards is
/// detected by `care audit verify`.
#[test]
fn guard_refusals_are_audited_within_a_bound_staging_paths_stay_hidden_and_closing_checkpoints() {
    let s = site(&[]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let r = get(&c, &format!("{base}/api/v1/admin/users"), &s.clin);
    assert_eq!(r.status(), 403);
    let ck = session(&c, &base, "drwang", CLIN_PW);
    let r = c.post(format!("{base}/logout")).header("cookie", &ck).send().unwrap();
    assert_eq!(r.status(), 403);
    for _ in 0..100 {
        let r = get(&c, &format!("{base}/api/v1/search?q=x"), "care_not-a-real-token");
        assert_eq!(r.status(), 401);
    }

    let part = "--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"manifest.toml\"\r\n\r\nnot toml [\r\n--b0--\r\n";
    let r = c.post(format!("{base}/api/v1/admin/models")).bearer_auth(&s.admin);
    let r = r.header("content-type", "multipart/form-data; boundary=b0").body(part).send().unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
    let text = r.text().unwrap();
    assert!(!text.contains(s.care.data_dir.to_str().unwrap()) && !text.contains("uploads/"), "{text}");
    alive(&mut served, &c);

    let records = s.care.json(&["audit", "list", "--json", "-n", "1000"]);
    let count = |action: &str, actor: &str| {
        records.as_array().unwrap().iter().filter(|r| r["action"] == action && r["actor"] == actor).count()
    };
    let unauth = count("request.unauthenticated", "anonymous");
    assert!((1..=REFUSALS_PER_ADDRESS).contains(&unauth), "{unauth} records for 100 refusals");
    assert_eq!(count("request.forbidden", "drwang"), 1);
    assert_eq!(count("request.csrf_rejected", "drwang"), 1);

    // Stop the server (SIGTERM: a graceful stop), then cut the last record off: the checkpoint taken at the stop
    // names that record, so the cut is found.
    let pid = served.child.0.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let _ = served.child.0.wait();
    // The refusals beyond the cap are not lost: the stop wrote their aggregate record.
    let records = s.care.json(&["audit", "list", "--json", "-n", "1000"]);
    let aggregates: Vec<&serde_json::Value> =
        records.as_array().unwrap().iter().filter(|r| r["action"] == "request.refusals_aggregated").collect();
    assert_eq!(aggregates.len(), 1, "{aggregates:?}");
    let detail = &aggregates[0]["detail"];
    assert_eq!(detail["refused"].as_u64(), Some((100 - unauth) as u64), "{detail}");
    assert_eq!(detail["actions"]["request.unauthenticated"].as_u64(), Some((100 - unauth) as u64), "{detail}");
    assert_eq!(detail["addresses"]["127.0.0.1"].as_u64(), Some((100 - unauth) as u64), "{detail}");
    let db = s.care.data_dir.join("care.sqlite");
    let cut = |db: &Path| {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.execute("DELETE FROM audit WHERE id = (SELECT max(id) FROM audit)", []).unwrap();
    };
    cut(&db);
    let out = s.care.run(&["audit", "verify"]);
    assert_eq!(out.status.code(), Some(4), "a tail cut after shutdown went unnoticed");
    // The same after a CLI write, on a fresh data directory.
    let t = tempfile::tempdir().unwrap();
    let care = care_e2e::Care::new(&t.path().join("data"));
    care.ok(&["init"]);
    care.ok(&["collection", "create", "c1"]);
    cut(&care.data_dir.join("care.sqlite"));
    let out = care.run(&["audit", "verify"]);
    assert_eq!(out.status.code(), Some(4), "a tail cut after a CLI write went unnoticed");
}

/// `care_engine::service::REFUSALS_PER_ADDRESS` (this crate reaches the engine only through the binary).
const REFUSALS_PER_ADDRESS: usize = 20;

/// Parsing runs in a sandboxed child (`care ingest-worker`): a file too big for the child's memory limit, and a
/// small PDF whose pages repeat one content stream, fail alone with a Chinese message naming the limit; the rest of
/// the upload is indexed, `care serve` stays up and its memory does not grow with the files.
#[test]
fn hostile_files_are_parsed_in_a_limited_child_and_fail_alone() {
    use care_engine::ingest::fixtures::pdf_bytes_one_stream;
    let s = site(&[("CARE__INGEST__ISOLATION__MEMORY_MB", "400")]);
    let mut served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    let line = "二甲双胍禁用于严重肾功能不全的患者，用药前应评估肾功能。\n";
    // 60 MB of text: reading and decoding it needs more than 400 MB in the child.
    let big = line.repeat(700_000).into_bytes();
    // 200 pages of one stream: far more text than a file of its size may yield (stopped at the budget).
    let repeated = pdf_bytes_one_stream(&vec![line.trim_end(); 3_000], 200);
    assert!(repeated.len() < 1 << 20, "{} bytes", repeated.len());
    let before = peak_rss(served.child.0.id());
    let files: [(&str, &[u8]); 3] =
        [("big.txt", &big), ("repeated.pdf", &repeated), ("ok.md", "# 胰岛素\n\n胰岛素注射部位应轮换。\n".as_bytes())];
    let job = upload_files(&c, &base, &s.admin, &files);
    let state = job_end(&c, &base, &s.admin, job, Duration::from_secs(300));
    alive(&mut served, &c);
    let errors = state["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{state}");
    for e in errors {
        assert_eq!(e["code"], "too_large", "{state}");
    }
    let message = |f: &str| {
        let e = errors.iter().find(|e| e["file"].as_str().unwrap().contains(f)).unwrap();
        e["message"].as_str().unwrap().to_string()
    };
    assert!(message("big.txt").contains("内存超过了 400 MB 的上限"), "{state}");
    assert!(message("repeated.pdf").contains("max_text_ratio"), "{state}");
    let grown = peak_rss(served.child.0.id()).saturating_sub(before);
    assert!(grown < 64 * MIB, "care serve's peak RSS grew by {} MiB", grown / MIB);
    let hits: serde_json::Value =
        get(&c, &format!("{base}/api/v1/search?q=%E8%83%B0%E5%B2%9B%E7%B4%A0&method=bm25"), &s.admin).json().unwrap();
    assert!(hits.to_string().contains("ok.md"), "{hits}");
}

/// Scans are read in the sandboxed child (issue 54): a faxed PDF and a photographed package insert are read there,
/// with the models loaded before file access ends and under the child's memory limit, and are searchable with the
/// page each passage came from; a 100,000 × 100,000 PNG header, a truncated JPEG, a 10,000-page TIFF and a PDF of
/// 1,000 scanned pages each fail alone with a Chinese message, before their pixels are decoded; `care serve` stays
/// up and its own memory does not grow (the OCR runs in the child).
#[test]
fn scans_are_read_in_the_limited_child_and_hostile_images_fail_alone() {
    use care_engine::ingest::fixtures::{PdfImage, PdfPage, pdf_mixed};
    use std::io::Cursor;
    let s = site(&[]);
    let mut served = s.care.serve_full();
    let (base, c) = (served.https.clone(), client());
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/engine/tests/fixtures/ocr-page.png");
    let page = image::open(fixture).unwrap();
    let encoded = |img: &image::DynamicImage, format| {
        let mut out = Vec::new();
        img.write_to(&mut Cursor::new(&mut out), format).unwrap();
        out
    };
    let fax = pdf_mixed(&[PdfPage::Scan(PdfImage::fax_g4(&page.to_luma8()))]);
    let photo = encoded(&page, image::ImageFormat::Jpeg);
    let png = care_engine::ingest::fixtures::png_claiming(100_000, 100_000);
    let blank = image::GrayImage::from_pixel(16, 16, image::Luma([255]));
    let mut tiff = Cursor::new(Vec::new());
    {
        let mut enc = tiff::encoder::TiffEncoder::new(&mut tiff).unwrap();
        for _ in 0..10_000 {
            enc.write_image::<tiff::encoder::colortype::Gray8>(16, 16, blank.as_raw()).unwrap();
        }
    }
    let thousand: Vec<PdfPage<'_>> = (0..1000).map(|_| PdfPage::Scan(PdfImage::fax_g4(&blank))).collect();
    let thousand = pdf_mixed(&thousand);
    let before = peak_rss(served.child.0.id());
    let files: [(&str, &[u8]); 6] = [
        ("传真.pdf", &fax),
        ("说明书照片.jpg", &photo),
        ("巨幅.png", &png),
        ("截断.jpg", &photo[..photo.len() / 2]),
        ("万页.tif", tiff.get_ref()),
        ("千页扫描.pdf", &thousand),
    ];
    let job = upload_files(&c, &base, &s.admin, &files);
    let state = job_end(&c, &base, &s.admin, job, Duration::from_secs(600));
    alive(&mut served, &c);
    let errors = state["errors"].as_array().unwrap();
    let message = |f: &str| {
        let e = errors.iter().find(|e| e["file"].as_str().unwrap().contains(f));
        e.map(|e| e["message"].as_str().unwrap().to_string()).unwrap_or_default()
    };
    assert_eq!(errors.len(), 4, "{state}");
    for (file, says) in
        [("巨幅.png", "超过上限"), ("截断.jpg", "图像"), ("万页.tif", "超过 300 页"), ("千页扫描.pdf", "300 页的上限")]
    {
        assert!(message(file).contains(says) && has_chinese(&message(file)), "{file}: {state}");
    }
    let grown = peak_rss(served.child.0.id()).saturating_sub(before);
    assert!(grown < 64 * MIB, "care serve's peak RSS grew by {} MiB", grown / MIB);
    let hits: serde_json::Value =
        get(&c, &format!("{base}/api/v1/search?q=%E9%98%BF%E5%8D%A1%E6%B3%A2%E7%B3%96&method=bm25"), &s.admin)
            .json()
            .unwrap();
    for file in ["传真.pdf", "说明书照片.jpg"] {
        let hit = hits["hits"].as_array().unwrap().iter().find(|h| h["source"].as_str().unwrap().contains(file));
        assert_eq!(hit.map(|h| h["scan"]["page"].clone()), Some(serde_json::json!(1)), "{file}: {hits}");
    }
}

/// Runs the parsing child (`care ingest-worker MEMORY_MB 120`) on `file` as `care serve` starts it for a file of
/// scans, with its memory bounded by what it writes (`by_data`, as when it opens the GPU) or by its address space;
/// its reply and standard error.
fn parse_in_child(file: &Path, memory_mb: u64, by_data: bool) -> (serde_json::Value, String) {
    use std::io::Write;
    let models = std::env::var("CARE_OCR_MODELS").expect("CARE_OCR_MODELS (packaging/dev.sh setup fetches the models)");
    let request = serde_json::json!({
        "path": file,
        "options": {},
        "limits": {},
        "ocr": { "models": models, "device": "cpu" },
        "ort_library": std::env::var("ORT_DYLIB_PATH").expect("ORT_DYLIB_PATH (packaging/dev.sh env)"),
    });
    let mut cmd = std::process::Command::new(care_e2e::care_bin());
    cmd.args(["ingest-worker", &memory_mb.to_string(), "120"]).env_clear().env("CARE_LOG", "error");
    if by_data {
        cmd.env(care_engine::sandbox::MEMORY_BY, care_engine::sandbox::BY_DATA);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let reply = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (reply, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A parsing child that opens the GPU cannot have its address space bounded (the CUDA driver reserves tens of
/// gigabytes it never touches), so `care serve` bounds what it writes instead (RLIMIT_DATA). That bound holds: a
/// scan is read under 2,048 MB of it, and the same scan under 100 MB fails as out of memory, not by running on. The
/// same page under an address-space bound for comparison. (The GPU itself is not here: the child reads on the CPU.)
#[test]
fn a_parsing_child_bounded_by_written_memory_reads_scans_and_stops_at_its_bound() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/engine/tests/fixtures/ocr-page.png");
    let read = |reply: &serde_json::Value| reply["units"].to_string();
    for by_data in [true, false] {
        let (reply, stderr) = parse_in_child(&fixture, 2048, by_data);
        assert!(read(&reply).contains("阿卡波糖"), "by_data {by_data}: {reply} {stderr}");
        let (reply, stderr) = parse_in_child(&fixture, 100, by_data);
        assert!(!read(&reply).contains("阿卡波糖"), "by_data {by_data}: read under 100 MB: {reply}");
        let said = format!("{reply} {stderr}");
        assert!(care_engine::sandbox::allocation_failure(&said), "by_data {by_data}: not out of memory: {said}");
    }
}

/// The shell that runs `care serve` on a small tmpfs of its own (a user and mount namespace: no root needed), and
/// obeys the test's commands on stdin: `fill` (a file takes every free byte), `free` (it goes), `check` (stop the
/// server, run `care check`). What it does is echoed on stdout, after the server's own lines.
const SMALL_DISK: &str = r#"set -u
mount -t tmpfs -o "size=${SIZE}k" tmpfs "$SMALL" || { echo "no-mount"; exit 3; }
cp -a "$SRC" "$SMALL/data" || exit 3
"$CARE" --data-dir "$SMALL/data" --config "$CONF" serve --bind 127.0.0.1:0 --http-bind 127.0.0.1:0 &
pid=$!
while read -r cmd; do
  case "$cmd" in
    fill) dd if=/dev/zero of="$SMALL/filler" bs=1k count="$SIZE" 2>/dev/null; df -k "$SMALL" | tail -1 | sed 's/^/filled /' ;;
    free) rm -f "$SMALL/filler"; echo freed ;;
    check) kill "$pid"; wait "$pid"; "$CARE" --data-dir "$SMALL/data" --config "$CONF" check; echo "check-exit $?"; exit 0 ;;
  esac
done
"#;

/// A data disk that really fills (a tmpfs the test mounts, not a reserve set above the disk): search, sign-in pages
/// and uploads answer without a 500, `/healthz` is unhealthy while nothing can be written, and after space is freed
/// the same server ingests again and `care check` finds the stores consistent. Skipped, saying why, where the kernel
/// gives no unprivileged user namespaces.
#[test]
fn a_data_disk_that_fills_up_is_no_outage_and_recovers() {
    // The probe mounts a tmpfs the way the test does; never fill a disk that is not the test's own.
    let probe = tempfile::tempdir().unwrap();
    let mounts = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs \"$0\"", probe.path().to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if !mounts {
        println!("skipped: no tmpfs can be mounted in an unprivileged user and mount namespace (`unshare -rm`) here");
        return;
    }
    let s = site(&[]);
    let small = s.dir.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let conf = s.dir.join("empty.toml");
    std::fs::write(&conf, "").unwrap();
    let used = dir_bytes(&s.care.data_dir);
    let mut sh = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", SMALL_DISK])
        .env("SIZE", ((used + (48 << 20)) / 1024).to_string())
        .env("SMALL", &small)
        .env("SRC", &s.care.data_dir)
        .env("CARE", care_e2e::care_bin())
        .env("CONF", &conf)
        .env("CARE_LOG", "warn")
        .env("CARE__TRAINING__KEEP_FREE_GB", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = sh.stdin.take().unwrap();
    let lines = {
        let (tx, rx) = std::sync::mpsc::channel();
        let out = std::io::BufReader::new(sh.stdout.take().unwrap());
        std::thread::spawn(move || {
            for l in std::io::BufRead::lines(out).map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        rx
    };
    let wait_for = |prefix: &str| -> String {
        loop {
            let l = lines.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|e| panic!("no `{prefix}`: {e}"));
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    };
    let mut say = |cmd: &str| std::io::Write::write_all(&mut stdin, format!("{cmd}\n").as_bytes()).unwrap();
    let base = wait_for("listening on ");
    let c = client();
    let search = format!("{base}/api/v1/search?q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97");
    assert_eq!(get(&c, &search, &s.clin).status(), 200);

    say("fill");
    let filled = wait_for("filled ");
    assert!(filled.split_whitespace().nth(3) == Some("0"), "the tmpfs is not full: {filled}");
    // Search reads; its audit record cannot be written: refused as disk_full, never a 500, never a search without
    // its record.
    let r = get(&c, &search, &s.clin);
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().unwrap();
    assert!(status == 200 || (status == 503 && body["code"] == "disk_full"), "search on a full disk: {status} {body}");
    let page = c.get(format!("{base}/login")).send().unwrap();
    assert_eq!(page.status(), 200, "the sign-in page is served from memory");
    let part =
        "--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.md\"\r\n\r\n# 阿司匹林\n\r\n--b0--\r\n";
    let up = c.post(format!("{base}/api/v1/admin/collections/granted/files")).bearer_auth(&s.admin);
    let up = up.header("content-type", "multipart/form-data; boundary=b0").body(part).send().unwrap();
    assert_eq!(up.status(), 503, "an upload onto a full disk");
    assert_eq!(up.json::<serde_json::Value>().unwrap()["code"], "disk_full");
    let h = c.get(format!("{base}/healthz")).send().unwrap();
    assert_eq!(h.status(), 503, "/healthz on a full disk");

    say("free");
    wait_for("freed");
    assert_eq!(c.get(format!("{base}/healthz")).send().unwrap().status(), 200, "/healthz after space is freed");
    assert_eq!(get(&c, &search, &s.clin).status(), 200);
    let job = upload_files(&c, &base, &s.admin, &[("after.md", "# 华法林\n\n华法林用于抗凝治疗。\n".as_bytes())]);
    assert_eq!(job_end(&c, &base, &s.admin, job, Duration::from_secs(120))["state"], "done");

    say("check");
    let exit = wait_for("check-exit ");
    assert_eq!(exit, "0", "care check after the disk was full");
    assert!(sh.wait().unwrap().success());
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(md) = std::fs::symlink_metadata(p) else { return 0 };
    if !md.is_dir() {
        return md.len();
    }
    std::fs::read_dir(p).unwrap().filter_map(Result::ok).map(|e| dir_bytes(&e.path())).sum()
}

/// A graph that asks ONNX Runtime for a 6.4 GB tensor (1.6 G float zeros per batch row, sized from the input so it
/// cannot be folded at load): run inside the importing process it would take 6.4 GB of memory before the width
/// check refused it.
fn hostile_graph(path: &Path) {
    use care_modelio::onnx::{Dim, GraphBuilder, Model};
    const INT64: i32 = 7;
    const FLOAT: i32 = 1;
    let mut g = GraphBuilder::new("hostile");
    let dims = vec![Dim::Param("batch".into()), Dim::Param("seq".into())];
    let ids = g.input("input_ids", INT64, dims.clone());
    g.input("attention_mask", INT64, dims);
    let zero = g.scalar_i64("zero", 0);
    let per_row = g.scalar_i64("per_row", 1_600_000_000);
    let axes = g.vec_i64("axes", &[0]);
    let shape = g.op("Shape", "shape", &[&ids], vec![]);
    let batch = g.op("Gather", "batch", &[&shape, &zero], vec![]);
    let n = g.op("Mul", "n", &[&batch, &per_row], vec![]);
    let big_shape = g.op("Unsqueeze", "big_shape", &[&n, &axes], vec![]);
    let big = g.op("ConstantOfShape", "big", &[&big_shape], vec![]);
    g.op_named("ReduceSum", &[&big], "last_hidden_state", vec![]);
    g.output("last_hidden_state", FLOAT, vec![]);
    let model = Model {
        ir_version: 8,
        opsets: vec![(String::new(), 14)],
        producer_name: "care-tests".into(),
        producer_version: "0".into(),
        doc_string: String::new(),
        graph: g.finish(),
    };
    model.save(path).unwrap();
}

/// Issue 32: the import-time check of a package's ONNX graph runs in a child under an address-space limit, like
/// the parsers. A graph that allocates 6.4 GB is refused with a message naming the memory limit, nothing is
/// registered, and the same package with the real graph imports.
#[test]
fn a_hostile_onnx_graph_is_checked_in_a_limited_child_and_refused() {
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    care.ok(&["init"]);
    care.ok(&["model", "import-e5s1", care_e2e::e5s1().to_str().unwrap()]);
    let live = care.data_dir.join("models/e5-small/1");
    let package = |name: &str, graph: &dyn Fn(&Path)| -> PathBuf {
        let pkg = t.path().join(name);
        std::fs::create_dir_all(&pkg).unwrap();
        let mut files = Vec::new();
        for f in std::fs::read_dir(&live).unwrap() {
            let f = f.unwrap().file_name().to_string_lossy().into_owned();
            if f == "manifest.toml" || f == "parity.json" {
                continue;
            }
            if f == "model.onnx" {
                graph(&pkg.join(&f));
            } else {
                std::fs::hard_link(live.join(&f), pkg.join(&f)).unwrap();
            }
            files.push(f);
        }
        let mut m = care_formats::ModelManifest::load(&live).unwrap();
        m.name = name.into();
        m.pairing_id = format!("{name}-pairing");
        let refs: Vec<&str> = files.iter().map(String::as_str).collect();
        m.write(&pkg, &refs).unwrap();
        pkg
    };
    let hostile = package("e5-hostile", &hostile_graph);
    let started = Instant::now();
    let out = care.run(&["model", "import", hostile.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the hostile graph imported: {stderr}");
    assert!(stderr.contains("内存") && stderr.contains("MB 的上限"), "the refusal names the memory limit: {stderr}");
    assert!(!stderr.contains("width"), "refused by the limit, not after allocating: {stderr}");
    let models = care.ok(&["model", "list"]);
    assert!(!models.contains("e5-hostile"), "{models}");
    eprintln!("hostile graph refused in {:.1} s", started.elapsed().as_secs_f64());

    // The sandbox passes a real graph: the same package with e5-small's graph imports.
    let good = package("e5-copy", &|p: &Path| {
        std::fs::hard_link(live.join("model.onnx"), p).unwrap();
    });
    care.ok(&["model", "import", good.to_str().unwrap()]);
    assert!(care.ok(&["model", "list"]).contains("e5-copy"));
}

/// Microsoft's build of ONNX Runtime records usage events (process, model and session details, with a device id)
/// in `~/.cache/Microsoft/DeveloperTools/.onnxruntime/` to send to Microsoft unless `ORT_DISABLE_TELEMETRY` is set.
/// `care` sets it itself, so loading models, embedding and searching leave nothing there whatever environment it
/// was started from (before the fix this test found `onnxruntime.db` and `deviceid` in the home folder).
#[test]
fn onnx_runtime_records_no_telemetry() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut care = Care::new(&t.path().join("data"));
    care.env.push(("HOME".into(), home.display().to_string()));
    care.env.push(("XDG_CACHE_HOME".into(), home.join(".cache").display().to_string()));
    // Started without the variable (packaging/dev.sh exports it for the Python tools).
    let run = |args: &[&str]| {
        let out = care.command(args).env_remove("ORT_DISABLE_TELEMETRY").output().unwrap();
        assert!(out.status.success(), "care {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["demo", "--no-serve", "--e5s1", care_e2e::e5s1().to_str().unwrap()]);
    assert!(run(&["search", "二甲双胍的禁忌症"]).contains("二甲双胍"));
    let mut left = Vec::new();
    let mut stack = vec![home.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { stack.push(p) } else { left.push(p) }
        }
    }
    assert!(left.is_empty(), "ONNX Runtime wrote {left:?}");
}

/// Issue 51 (the live probe's finding: `/admin/analytics.csv` wrote a clinician's `=HYPERLINK(…)` unescaped): over
/// HTTP, every CSV download neutralises every formula prefix, whether the text came in as a clinician's query or an
/// administrator's synonym entry, quoted or not. The cells are read by the `csv` crate.
#[test]
fn csv_downloads_neutralise_formula_prefixes() {
    use care_engine::csv_out::{FORMULA_PAYLOADS as PAYLOADS, neutralise};
    let s = site(&[]);
    let served = s.care.serve_full();
    let base = served.https.clone();
    let c = client();
    for (i, p) in PAYLOADS.into_iter().enumerate() {
        let r = c.get(format!("{base}/api/v1/search")).query(&[("q", p)]).bearer_auth(&s.clin).send().unwrap();
        assert_eq!(r.status(), 200, "search {p:?}");
        let term = p.replace([',', '|', '"'], "");
        let g = serde_json::json!({
            "preferred": format!("{}{i}甲", term.trim()), "variants": [format!("{}{i}乙", term.trim())], "note": p,
        });
        let r = c.post(format!("{base}/api/v1/admin/synonyms")).bearer_auth(&s.admin).json(&g).send().unwrap();
        assert_eq!(r.status(), 201, "synonym {p:?}");
    }
    for route in ["/admin/analytics.csv", "/admin/synonyms.csv", "/api/v1/admin/synonyms.csv", "/admin/audit.csv"] {
        let r = get(&c, &format!("{base}{route}"), &s.admin);
        assert_eq!(r.status(), 200, "{route}");
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/csv"), "{route}");
        let text = r.text().unwrap();
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let mut rd = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
        let cells: Vec<String> =
            rd.records().flat_map(|r| r.unwrap().iter().map(str::to_string).collect::<Vec<_>>()).collect();
        for cell in &cells {
            let lead = cell.trim_start_matches(char::is_whitespace);
            assert!(!cell.starts_with(['\t', '\r']) && !lead.starts_with(['=', '+', '-', '@']), "{route}: {cell:?}");
        }
        // The queries and notes did reach the downloads that carry them (the audit log holds them inside JSON).
        if route != "/admin/audit.csv" {
            for p in PAYLOADS {
                assert!(
                    cells.iter().any(|c| *c == neutralise(p.trim())),
                    "{route}: no cell {:?}",
                    neutralise(p.trim())
                );
            }
        }
    }
}
