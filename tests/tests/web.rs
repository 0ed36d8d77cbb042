//! End-to-end tests of the web appliance: the real `care serve` on loopback ports with TLS, driven over HTTPS by a
//! plain client and by headless Chromium (WebDriver).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use care_e2e::webdriver::Browser;
use care_e2e::{Care, Served, add_user, cookie_value, page_csrf, set_cookies, token, two_collections, write};
use care_server::table::{Access, Kind, ROUTES};
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::SET_COOKIE;

const ADMIN_PW: &str = "admin-passphrase-1";
const CLIN_PW: &str = "clinician-passphrase-1";

fn client() -> Client {
    care_e2e::no_redirect_client(Duration::from_secs(60))
}

const METFORMIN_MD: &str = "# 二甲双胍用药指南\n\n## 适应症\n\n二甲双胍是2型糖尿病患者控制血糖的一线用药，可单用或与胰岛素联用。\n\n\
## 禁忌症\n\n严重肾功能不全（eGFR低于30）的患者禁用二甲双胍；急性代谢性酸中毒、严重感染和缺氧状态者亦应停用。\n\n\
## 不良反应\n\n常见胃肠道反应，如腹泻、恶心，多在用药初期出现，小剂量起始可减轻。\n";

fn multipart(name: &str, content: &str) -> (String, Vec<u8>) {
    let boundary = "----care-test-boundary-7d1f";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: text/markdown\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    (format!("multipart/form-data; boundary={boundary}"), body.into_bytes())
}

#[derive(Clone, Copy, Debug)]
enum Body {
    Empty,
    Form(&'static str),
    Json(&'static str),
    Upload,
}

/// One row of the authorisation matrix: the concrete request and the status each caller must get.
struct Case {
    path: String,
    body: Body,
    anon: u16,
    clinician: u16,
    /// Any of these for the administrator (one value almost everywhere).
    admin: &'static [u16],
}

fn case(path: impl Into<String>, body: Body, anon: u16, clinician: u16, admin: &'static [u16]) -> Case {
    Case { path: path.into(), body, anon, clinician, admin }
}

fn send(c: &Client, method: &str, url: &str, body: Body, auth: Option<&str>) -> Response {
    let mut rb: RequestBuilder = match method {
        "GET" => c.get(url),
        "POST" => c.post(url),
        "PUT" => c.put(url),
        "PATCH" => c.patch(url),
        "DELETE" => c.delete(url),
        m => panic!("method {m}"),
    };
    if let Some(t) = auth {
        rb = rb.bearer_auth(t);
    }
    rb = match body {
        Body::Empty => rb,
        Body::Form(f) => rb.header("content-type", "application/x-www-form-urlencoded").body(f),
        Body::Json(j) => rb.header("content-type", "application/json").body(j),
        Body::Upload => {
            let (ct, bytes) = multipart("extra.md", "# 补充资料\n\n阿司匹林与氯吡格雷双联抗血小板治疗。\n");
            rb.header("content-type", ct).body(bytes)
        }
    };
    rb.send().unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Every route in the server's access table × anonymous / clinician / admin. A route added to the server without
/// a row here fails this test; so does a row for a route the server no longer has.
#[test]
fn authorisation_matrix_and_collection_isolation() {
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    care.env.push(("CARE__BACKUP__DIR".into(), "/proc/care-no-backups".into()));
    care.ok(&["init"]);
    two_collections(&care, t.path());
    care.ok(&["collection", "create", "scratch1"]);
    care.ok(&["collection", "create", "scratch2"]);
    add_user(&care, t.path(), "admin", "admin", ADMIN_PW);
    add_user(&care, t.path(), "drwang", "clinician", CLIN_PW);
    add_user(&care, t.path(), "doomed", "clinician", "doomed-passphrase-1");
    care.ok(&["user", "grant", "drwang", "granted"]);
    let admin = token(&care, "admin", "matrix admin"); // token 1
    let clin = token(&care, "drwang", "matrix clinician"); // token 2
    token(&care, "drwang", "spare 3"); // token 3
    token(&care, "drwang", "spare 4"); // token 4
    let found = care.json(&["search", "--json", "-c", "granted", "阿司匹林"]);
    let doc = found["hits"][0]["document_id"].as_i64().unwrap();
    let chunk = found["hits"][0]["chunk_id"].as_i64().unwrap();
    let secret = care.json(&["search", "--json", "-c", "secret", "阿司匹林"]);
    let secret_doc = secret["hits"][0]["document_id"].as_i64().unwrap();
    let secret_chunk = secret["hits"][0]["chunk_id"].as_i64().unwrap();
    // The secret document is filed under a department of its own: its name must not leak through facets.
    let filing = write(
        &t.path().join("filing.csv"),
        &format!("id,科室\n{},机密科\n", secret["hits"][0]["external_id"].as_str().unwrap()),
    );
    let out = care.ok(&["collection", "file", "secret", filing.to_str().unwrap()]);
    assert!(out.contains("已更新 1 篇"), "{out}");
    // A document of the granted collection whose access list names only the 会诊组: no clinician outside that
    // group may find, open, rate or count it (added after `doc` above was picked, so the matrix's ids stay open).
    let restricted_md = write(
        &t.path().join("restricted.md"),
        "# 会诊限阅记录\n\n阿司匹林抵抗患者的会诊记录：改用替格瑞洛，仅限会诊组查阅。\n",
    );
    care.ok(&["ingest", "granted", restricted_md.to_str().unwrap()]);
    let r = care.json(&["search", "--json", "-c", "granted", "阿司匹林抵抗 会诊"]);
    let hit =
        r["hits"].as_array().unwrap().iter().find(|h| h["title"] == "会诊限阅记录").expect("restricted doc").clone();
    let (restricted_doc, restricted_chunk) = (hit["document_id"].as_i64().unwrap(), hit["chunk_id"].as_i64().unwrap());
    let filing = write(
        &t.path().join("access.csv"),
        &format!("id,科室,可见范围\n{},会诊科,会诊组\n", hit["external_id"].as_str().unwrap()),
    );
    care.ok(&["collection", "file", "granted", filing.to_str().unwrap()]);

    let Served { child: _server, https: base, .. } = care.serve_full();
    let c = client();

    let feedback_form: &'static str = Box::leak(
        format!("q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97&chunk={chunk}&helpful=1&back=%2Fsearch").into_boxed_str(),
    );
    let feedback_json: &'static str =
        Box::leak(format!("{{\"query\":\"阿司匹林\",\"chunk_id\":{chunk},\"helpful\":true}}").into_boxed_str());
    let q = "q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97";
    let mut m: BTreeMap<(&str, &str), Case> = BTreeMap::new();
    use Body::*;
    // Public
    m.insert(("GET", "/"), case("/", Empty, 302, 302, &[302]));
    m.insert(("GET", "/healthz"), case("/healthz", Empty, 200, 200, &[200]));
    m.insert(("GET", "/assets/{file}"), case("/assets/style.css", Empty, 200, 200, &[200]));
    m.insert(("GET", "/login"), case("/login", Empty, 200, 303, &[303]));
    // A login post without the double-submit cookie is refused as CSRF; bearer callers reach the password check.
    m.insert(("POST", "/login"), case("/login", Form("username=nobody&password=wrong-password"), 403, 401, &[401]));
    // No [oidc] here: starting is "not found"; a callback without this browser's state cookie is refused.
    m.insert(("GET", "/login/oidc"), case("/login/oidc", Empty, 404, 404, &[404]));
    m.insert(("GET", "/login/oidc/callback"), case("/login/oidc/callback?state=x&code=y", Empty, 401, 401, &[401]));
    m.insert(("GET", "/embed"), case(format!("/embed?{q}"), Empty, 200, 200, &[200]));
    m.insert(("GET", "/api/v1/openapi.json"), case("/api/v1/openapi.json", Empty, 200, 200, &[200]));
    // Signed-in users
    m.insert(("GET", "/search"), case(format!("/search?{q}"), Empty, 302, 200, &[200]));
    m.insert(("GET", "/doc/{id}"), case(format!("/doc/{doc}"), Empty, 302, 200, &[200]));
    m.insert(("POST", "/feedback"), case("/feedback", Form(feedback_form), 302, 303, &[303]));
    m.insert(("POST", "/logout"), case("/logout", Empty, 302, 303, &[303]));
    m.insert(("GET", "/account"), case("/account", Empty, 302, 200, &[200]));
    m.insert(
        ("POST", "/account/password"),
        // A wrong current password is a refused form: the page says so with its real status.
        case("/account/password", Form("current=wrong-current-pw&new=another-long-pw"), 302, 400, &[400]),
    );
    m.insert(("GET", "/api/v1/me"), case("/api/v1/me", Empty, 401, 200, &[200]));
    m.insert(
        ("POST", "/api/v1/me/password"),
        case(
            "/api/v1/me/password",
            Json(r#"{"current":"wrong-current-pw","new":"another-long-pw"}"#),
            401,
            400,
            &[400],
        ),
    );
    m.insert(("GET", "/api/v1/search"), case(format!("/api/v1/search?{q}"), Empty, 401, 200, &[200]));
    m.insert(("GET", "/api/v1/collections"), case("/api/v1/collections", Empty, 401, 200, &[200]));
    m.insert(("GET", "/api/v1/documents/{id}"), case(format!("/api/v1/documents/{doc}"), Empty, 401, 200, &[200]));
    m.insert(("POST", "/api/v1/feedback"), case("/api/v1/feedback", Json(feedback_json), 401, 201, &[201]));
    // Admin console
    m.insert(("GET", "/admin"), case("/admin", Empty, 302, 403, &[302]));
    m.insert(("GET", "/admin/collections"), case("/admin/collections", Empty, 302, 403, &[200]));
    m.insert(
        ("POST", "/admin/collections"),
        case("/admin/collections", Form("name=fresh&description=x"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/collections/{name}/upload"),
        case("/admin/collections/granted/upload", Upload, 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/collections/{name}/approve"),
        case("/admin/collections/granted/approve", Form("approved=1"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/collections/{name}/delete"),
        case("/admin/collections/scratch2/delete", Form("confirm=scratch2"), 302, 403, &[303]),
    );
    m.insert(("GET", "/admin/jobs"), case("/admin/jobs", Empty, 302, 403, &[200]));
    m.insert(("POST", "/admin/jobs/{id}/cancel"), case("/admin/jobs/1/cancel", Empty, 302, 403, &[303]));
    m.insert(("GET", "/admin/users"), case("/admin/users", Empty, 302, 403, &[200]));
    m.insert(
        ("POST", "/admin/users"),
        case("/admin/users", Form("username=newbie&password=newbie-passphrase&role=clinician"), 302, 403, &[303]),
    );
    m.insert(("POST", "/admin/users/{name}"), case("/admin/users/newbie", Form("action=unlock"), 302, 403, &[303]));
    m.insert(
        ("POST", "/admin/users/{name}/grants"),
        case("/admin/users/newbie/grants", Form("collection=granted&action=grant"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/users/{name}/tokens"),
        case("/admin/users/newbie/tokens", Form("name=page"), 302, 403, &[200]),
    );
    m.insert(("POST", "/admin/tokens/{id}/revoke"), case("/admin/tokens/3/revoke", Empty, 302, 403, &[303]));
    m.insert(("GET", "/admin/models"), case("/admin/models", Empty, 302, 403, &[200]));
    m.insert(
        ("POST", "/admin/models/activate"),
        case("/admin/models/activate", Form("query=nope&document=nope"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/models/evaluate"),
        case("/admin/models/evaluate", Form("candidate=nope%401"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/models/promote"),
        case("/admin/models/promote", Form("candidate=nope%401&override_reason="), 302, 403, &[303]),
    );
    m.insert(("POST", "/admin/models/rollback"), case("/admin/models/rollback", Form("reason=x"), 302, 403, &[303]));
    m.insert(
        ("POST", "/admin/models/reject"),
        case("/admin/models/reject", Form("candidate=nope%401&reason=x"), 302, 403, &[303]),
    );
    // The console's judgment upload: a Markdown file with no collection named is refused back to the page.
    m.insert(("POST", "/admin/judgments"), case("/admin/judgments", Upload, 302, 403, &[303]));
    m.insert(("POST", "/admin/models/import"), case("/admin/models/import", Upload, 302, 403, &[303]));
    m.insert(("GET", "/admin/audit"), case("/admin/audit?action=search", Empty, 302, 403, &[200]));
    m.insert(("GET", "/admin/audit.csv"), case("/admin/audit.csv", Empty, 401, 403, &[200]));
    m.insert(("GET", "/admin/synonyms"), case("/admin/synonyms?q=COPD", Empty, 302, 403, &[200]));
    m.insert(("GET", "/admin/settings"), case("/admin/settings", Empty, 302, 403, &[200]));
    m.insert(
        ("POST", "/admin/settings"),
        case("/admin/settings", Form("key=dense_weight&value=0.6"), 302, 403, &[303]),
    );
    // The backup settings without a time (no daily backup); 立即备份 queues a backup into a folder that cannot be
    // made (`CARE__BACKUP__DIR` below), so the job fails at once instead of archiving the test's model.
    m.insert(
        ("POST", "/admin/settings/backup"),
        case("/admin/settings/backup", Form("time=&dir=&keep_daily=7&keep_weekly=4"), 302, 403, &[303]),
    );
    m.insert(("POST", "/admin/backups"), case("/admin/backups", Empty, 302, 403, &[303]));
    m.insert(("GET", "/api/v1/admin/backups"), case("/api/v1/admin/backups", Empty, 401, 403, &[200]));
    m.insert(
        ("GET", "/api/v1/admin/backups/{name}"),
        case("/api/v1/admin/backups/care-20260101-000000.care-backup", Empty, 401, 403, &[404]),
    );
    // A sign-in section that cannot work goes back to the page with the reason; nothing is stored.
    m.insert(
        ("POST", "/admin/settings/sign-in"),
        case("/admin/settings/sign-in", Form("protocol=ldap&url=ldap%3A%2F%2Fdc1&starttls="), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/synonyms"),
        case(
            "/admin/synonyms",
            Form("preferred=%E7%9F%A9%E9%98%B5%E7%94%B2&variants=%E7%9F%A9%E9%98%B5%E4%B9%99"),
            302,
            403,
            &[303],
        ),
    );
    // A Markdown file is no synonym CSV: refused back to the page with the line it failed on.
    m.insert(("POST", "/admin/synonyms/import"), case("/admin/synonyms/import", Upload, 302, 403, &[303]));
    m.insert(
        ("POST", "/admin/synonyms/{id}"),
        case("/admin/synonyms/999999", Form("preferred=%E7%9F%A9%E9%98%B5%E4%B8%99&variants=xyz"), 302, 403, &[303]),
    );
    m.insert(("POST", "/admin/synonyms/{id}/delete"), case("/admin/synonyms/999999/delete", Empty, 302, 403, &[303]));
    m.insert(("GET", "/admin/synonyms.csv"), case("/admin/synonyms.csv", Empty, 401, 403, &[200]));
    m.insert(("GET", "/metrics"), case("/metrics", Empty, 401, 403, &[200]));
    // Admin API
    m.insert(("GET", "/api/v1/admin/collections"), case("/api/v1/admin/collections", Empty, 401, 403, &[200]));
    m.insert(
        ("POST", "/api/v1/admin/collections"),
        case("/api/v1/admin/collections", Json(r#"{"name":"fresh2"}"#), 401, 403, &[201]),
    );
    m.insert(
        ("DELETE", "/api/v1/admin/collections/{name}"),
        case("/api/v1/admin/collections/scratch1", Empty, 401, 403, &[204]),
    );
    m.insert(
        ("POST", "/api/v1/admin/collections/{name}/files"),
        case("/api/v1/admin/collections/granted/files", Upload, 401, 403, &[202]),
    );
    m.insert(
        ("PUT", "/api/v1/admin/collections/{name}/approval"),
        case("/api/v1/admin/collections/granted/approval", Json(r#"{"approved":false}"#), 401, 403, &[204]),
    );
    m.insert(("GET", "/api/v1/admin/jobs"), case("/api/v1/admin/jobs", Empty, 401, 403, &[200]));
    m.insert(("GET", "/api/v1/admin/jobs/{id}"), case("/api/v1/admin/jobs/1", Empty, 401, 403, &[200]));
    // The job may already have finished (400: nothing to cancel) or still run (204).
    m.insert(
        ("POST", "/api/v1/admin/jobs/{id}/cancel"),
        case("/api/v1/admin/jobs/2/cancel", Empty, 401, 403, &[204, 400]),
    );
    m.insert(("GET", "/api/v1/admin/users"), case("/api/v1/admin/users", Empty, 401, 403, &[200]));
    m.insert(
        ("POST", "/api/v1/admin/users"),
        case(
            "/api/v1/admin/users",
            Json(r#"{"username":"apiuser","password":"apiuser-passphrase","role":"clinician"}"#),
            401,
            403,
            &[201],
        ),
    );
    m.insert(
        ("PATCH", "/api/v1/admin/users/{name}"),
        case("/api/v1/admin/users/apiuser", Json(r#"{"unlock":true}"#), 401, 403, &[204]),
    );
    m.insert(("DELETE", "/api/v1/admin/users/{name}"), case("/api/v1/admin/users/doomed", Empty, 401, 403, &[204]));
    m.insert(
        ("PUT", "/api/v1/admin/users/{name}/grants/{collection}"),
        case("/api/v1/admin/users/apiuser/grants/granted", Empty, 401, 403, &[204]),
    );
    m.insert(
        ("DELETE", "/api/v1/admin/users/{name}/grants/{collection}"),
        case("/api/v1/admin/users/apiuser/grants/granted", Empty, 401, 403, &[204]),
    );
    m.insert(
        ("POST", "/api/v1/admin/users/{name}/tokens"),
        case("/api/v1/admin/users/apiuser/tokens", Json(r#"{"name":"api"}"#), 401, 403, &[201]),
    );
    m.insert(("DELETE", "/api/v1/admin/tokens/{id}"), case("/api/v1/admin/tokens/4", Empty, 401, 403, &[204]));
    m.insert(("GET", "/api/v1/admin/models"), case("/api/v1/admin/models", Empty, 401, 403, &[200]));
    // A Markdown file is no model package: refused as invalid_package (422) and nothing registered.
    m.insert(("POST", "/api/v1/admin/models"), case("/api/v1/admin/models", Upload, 401, 403, &[422]));
    // No model is live in this data directory: evaluation and rollback have nothing to compare or return to.
    m.insert(
        ("POST", "/api/v1/admin/models/evaluate"),
        case("/api/v1/admin/models/evaluate", Json(r#"{"candidate":"nope@1,nope@1"}"#), 401, 403, &[400]),
    );
    m.insert(
        ("GET", "/api/v1/admin/models/evaluations"),
        case("/api/v1/admin/models/evaluations", Empty, 401, 403, &[200]),
    );
    m.insert(
        ("POST", "/api/v1/admin/models/promote"),
        case("/api/v1/admin/models/promote", Json(r#"{"candidate":"nope@1"}"#), 401, 403, &[404]),
    );
    m.insert(
        ("POST", "/api/v1/admin/models/reject"),
        case("/api/v1/admin/models/reject", Json(r#"{"candidate":"nope@1","reason":"x"}"#), 401, 403, &[404]),
    );
    m.insert(
        ("POST", "/api/v1/admin/models/rollback"),
        case("/api/v1/admin/models/rollback", Json("{}"), 401, 403, &[400]),
    );
    m.insert(("GET", "/api/v1/admin/models/history"), case("/api/v1/admin/models/history", Empty, 401, 403, &[200]));
    m.insert(("GET", "/api/v1/admin/judgments"), case("/api/v1/admin/judgments", Empty, 401, 403, &[200]));
    // A Markdown file is neither CSV nor BEIR: refused with a message naming both.
    m.insert(
        ("POST", "/api/v1/admin/collections/{name}/judgments/{set}"),
        case("/api/v1/admin/collections/granted/judgments/first", Upload, 401, 403, &[400]),
    );
    m.insert(
        ("DELETE", "/api/v1/admin/collections/{name}/judgments/{set}"),
        case("/api/v1/admin/collections/granted/judgments/nope", Empty, 401, 403, &[404]),
    );
    m.insert(
        ("POST", "/api/v1/admin/models/activate"),
        case("/api/v1/admin/models/activate", Json(r#"{"query":"nope","document":"nope"}"#), 401, 403, &[404]),
    );
    m.insert(("GET", "/api/v1/admin/audit"), case("/api/v1/admin/audit?action=search", Empty, 401, 403, &[200]));
    m.insert(("GET", "/api/v1/admin/audit/verify"), case("/api/v1/admin/audit/verify", Empty, 401, 403, &[200]));
    m.insert(("GET", "/api/v1/admin/feedback"), case("/api/v1/admin/feedback", Empty, 401, 403, &[200]));
    m.insert(("GET", "/api/v1/admin/synonyms"), case("/api/v1/admin/synonyms?q=COPD", Empty, 401, 403, &[200]));
    m.insert(
        ("POST", "/api/v1/admin/synonyms"),
        case("/api/v1/admin/synonyms", Json(r#"{"preferred":"矩阵丁","variants":["矩阵戊"]}"#), 401, 403, &[201]),
    );
    m.insert(("GET", "/api/v1/admin/synonyms.csv"), case("/api/v1/admin/synonyms.csv", Empty, 401, 403, &[200]));
    m.insert(
        ("POST", "/api/v1/admin/synonyms/import"),
        case("/api/v1/admin/synonyms/import", Upload, 401, 403, &[400]),
    );
    m.insert(
        ("PUT", "/api/v1/admin/synonyms/{id}"),
        case(
            "/api/v1/admin/synonyms/999999",
            Json(r#"{"preferred":"矩阵己","variants":["矩阵庚"]}"#),
            401,
            403,
            &[404],
        ),
    );
    m.insert(("DELETE", "/api/v1/admin/synonyms/{id}"), case("/api/v1/admin/synonyms/999999", Empty, 401, 403, &[404]));
    m.insert(
        ("GET", "/admin/collections/{name}/documents"),
        case("/admin/collections/granted/documents?title=%E9%98%BF", Empty, 302, 403, &[200]),
    );
    m.insert(
        ("POST", "/admin/collections/{name}/documents/file"),
        case("/admin/collections/granted/documents/file", Form("external_id=nope&department=x"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/collections/{name}/documents/delete"),
        case("/admin/collections/granted/documents/delete", Form("external_id=nope"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/collections/{name}/documents/replace"),
        case("/admin/collections/granted/documents/replace?external_id=nope", Upload, 302, 403, &[303]),
    );
    m.insert(("GET", "/admin/overview"), case("/admin/overview", Empty, 302, 403, &[200]));
    m.insert(("GET", "/admin/analytics"), case("/admin/analytics?days=7", Empty, 302, 403, &[200]));
    m.insert(("GET", "/admin/analytics.csv"), case("/admin/analytics.csv", Empty, 401, 403, &[200]));
    m.insert(("GET", "/api/v1/admin/analytics"), case("/api/v1/admin/analytics?days=400", Empty, 401, 403, &[200]));
    m.insert(("GET", "/admin/training"), case("/admin/training", Empty, 302, 403, &[200]));
    m.insert(("POST", "/admin/training/run"), case("/admin/training/run", Form("stage1_steps=1"), 302, 403, &[303]));
    m.insert(
        ("POST", "/admin/training/schedules"),
        case("/admin/training/schedules", Form("time=02%3A00&weekday=6"), 302, 403, &[303]),
    );
    m.insert(
        ("POST", "/admin/training/schedules/{id}/delete"),
        case("/admin/training/schedules/999/delete", Empty, 302, 403, &[303]),
    );
    m.insert(("GET", "/api/v1/admin/training"), case("/api/v1/admin/training", Empty, 401, 403, &[200]));
    // No trainer in this test's environment (or nothing approved for training at that point): refused, not queued.
    m.insert(
        ("POST", "/api/v1/admin/training/runs"),
        case("/api/v1/admin/training/runs", Json("{}"), 401, 403, &[400, 503]),
    );
    // The live document model is online: nothing to embed offline (or no trainer here).
    m.insert(
        ("POST", "/api/v1/admin/training/embed-pending"),
        case("/api/v1/admin/training/embed-pending", Json("{}"), 401, 403, &[400, 503]),
    );
    m.insert(
        ("GET", "/api/v1/admin/training/runs/{job}"),
        case("/api/v1/admin/training/runs/999", Empty, 401, 403, &[404]),
    );
    m.insert(
        ("GET", "/api/v1/admin/training/runs/{job}/loss.svg"),
        case("/api/v1/admin/training/runs/999/loss.svg", Empty, 401, 403, &[404]),
    );
    m.insert(
        ("POST", "/api/v1/admin/training/schedules"),
        case("/api/v1/admin/training/schedules", Json(r#"{"time":"02:00","weekday":6}"#), 401, 403, &[201]),
    );
    m.insert(
        ("DELETE", "/api/v1/admin/training/schedules/{id}"),
        case("/api/v1/admin/training/schedules/999", Empty, 401, 403, &[404]),
    );

    let table: Vec<(&str, &str)> = ROUTES.iter().map(|r| (r.method, r.pattern)).collect();
    for key in &table {
        assert!(
            m.contains_key(key),
            "route {key:?} of the server's access table has no row in the authorisation matrix"
        );
    }
    for key in m.keys() {
        assert!(table.contains(key), "matrix row {key:?} names a route the server does not have");
    }

    let mut checked = 0;
    for r in ROUTES {
        let cs = &m[&(r.method, r.pattern)];
        let url = format!("{base}{}", cs.path);
        // Anonymous
        let res = send(&c, r.method, &url, cs.body, None);
        assert_eq!(res.status().as_u16(), cs.anon, "anonymous {} {}", r.method, cs.path);
        if cs.anon == 302 && r.access != Access::Public {
            let loc = res.headers()["location"].to_str().unwrap();
            assert!(loc.starts_with("/login?next="), "{} {} → {loc}", r.method, cs.path);
        }
        // (A public page may refuse with 401 too: the OIDC callback without this browser's state.)
        if cs.anon == 401 && r.access != Access::Public {
            assert_eq!(r.kind, Kind::Api);
            let body: serde_json::Value = res.json().unwrap();
            assert_eq!(body["code"], "unauthenticated", "{body}");
            assert!(body["request_id"].as_str().is_some_and(|s| s.len() == 16), "{body}");
        }
        // Clinician
        let res = send(&c, r.method, &url, cs.body, Some(&clin));
        assert_eq!(
            res.status().as_u16(),
            cs.clinician,
            "clinician {} {}: {}",
            r.method,
            cs.path,
            res.text().unwrap_or_default()
        );
        if r.access == Access::Admin {
            assert_eq!(cs.clinician, 403, "{} {}", r.method, cs.path);
        }
        // Administrator
        let res = send(&c, r.method, &url, cs.body, Some(&admin));
        let st = res.status().as_u16();
        assert!(
            cs.admin.contains(&st),
            "admin {} {} → {st} (expected {:?}): {}",
            r.method,
            cs.path,
            cs.admin,
            res.text().unwrap_or_default()
        );
        checked += 1;
    }
    assert_eq!(checked, ROUTES.len());

    // A standby's token opens the backups and nothing else its administrator may do.
    let backups_only =
        care.ok(&["user", "token", "admin", "--name", "standby", "--scope", "backups"]).trim().to_string();
    let status = |path: &str| send(&c, "GET", &format!("{base}{path}"), Body::Empty, Some(&backups_only)).status();
    assert_eq!(status("/api/v1/admin/backups"), 200);
    for path in ["/api/v1/search?q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97", "/api/v1/admin/users", "/api/v1/me"] {
        assert_eq!(status(path), 403, "{path}");
    }
    let out = care.run(&["user", "token", "drwang", "--name", "x", "--scope", "backups"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("须属于管理员"), "{out:?}");

    // Isolation: the clinician searches only what was granted, whatever the request asks for.
    let get = |path: &str, tok: &str| send(&c, "GET", &format!("{base}{path}"), Body::Empty, Some(tok));
    let r: serde_json::Value = get(&format!("/api/v1/search?{q}&limit=50"), &clin).json().unwrap();
    let cols: Vec<&str> = r["hits"].as_array().unwrap().iter().map(|h| h["collection"].as_str().unwrap()).collect();
    assert!(!cols.is_empty(), "{r}");
    assert!(cols.iter().all(|c| *c == "granted"), "clinician saw {cols:?}");
    let r: serde_json::Value = get(&format!("/api/v1/search?{q}&limit=50"), &admin).json().unwrap();
    assert!(
        r["hits"].as_array().unwrap().iter().any(|h| h["collection"] == "secret"),
        "the admin sees every collection: {r}"
    );
    let res = get(&format!("/api/v1/search?{q}&collection=secret"), &clin);
    assert_eq!(res.status(), 403);
    // Facets and filters see only what the caller may read.
    let r: serde_json::Value = get(&format!("/api/v1/search?{q}&limit=50"), &clin).json().unwrap();
    assert!(!r["facets"].to_string().contains("机密科"), "{}", r["facets"]);
    let r: serde_json::Value =
        get(&format!("/api/v1/search?{q}&department=%E6%9C%BA%E5%AF%86%E7%A7%91"), &clin).json().unwrap();
    assert!(r["hits"].as_array().unwrap().is_empty() && r["total"] == 0, "{r}");
    let r: serde_json::Value =
        get(&format!("/api/v1/search?{q}&department=%E6%9C%BA%E5%AF%86%E7%A7%91"), &admin).json().unwrap();
    let hits = r["hits"].as_array().unwrap();
    assert!(!hits.is_empty() && hits.iter().all(|h| h["collection"] == "secret"), "{r}");
    let r: serde_json::Value = get(&format!("/api/v1/search?{q}"), &admin).json().unwrap();
    assert!(r["facets"]["departments"].to_string().contains("机密科"), "{}", r["facets"]);
    let res = get(&format!("/api/v1/search?{q}&from=2023-13"), &clin);
    assert_eq!(res.status(), 400, "an unreadable date is the caller's error");
    assert!(res.text().unwrap().contains("日期筛选"));
    let html = get(&format!("/search?{q}&collection=secret"), &clin).text().unwrap();
    assert!(!html.contains("机密病例") && html.contains("没有访问"), "{html}");
    let html = get(&format!("/search?{q}"), &clin).text().unwrap();
    assert!(html.contains("阿司匹林指南") && !html.contains("机密病例"), "{html}");
    assert_eq!(get(&format!("/api/v1/documents/{secret_doc}"), &clin).status(), 404);
    assert_eq!(get(&format!("/doc/{secret_doc}"), &clin).status(), 404);
    // Feedback on a passage the clinician may not read answers as if it did not exist.
    let feedback_on = |chunk: i64| {
        let fb = format!("{{\"query\":\"阿司匹林\",\"chunk_id\":{chunk},\"helpful\":true}}");
        let res = c
            .post(format!("{base}/api/v1/feedback"))
            .bearer_auth(&clin)
            .header("content-type", "application/json")
            .body(fb)
            .send()
            .unwrap();
        res.status().as_u16()
    };
    assert_eq!(feedback_on(secret_chunk), 404);
    let r: serde_json::Value = get("/api/v1/collections", &clin).json().unwrap();
    let names: Vec<&str> = r.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["granted"]);
    // The embed widget applies the same grants.
    let html = get(&format!("/embed?{q}"), &clin).text().unwrap();
    assert!(html.contains("阿司匹林指南") && !html.contains("机密病例"), "{html}");
    // Document-level access: the restricted document is invisible to the clinician outside its group everywhere
    // (search in every method, facets, a filter on its department, the document, feedback, the widget) and
    // visible to an administrator.
    let rq = "q=%E9%98%BF%E5%8F%B8%E5%8C%B9%E6%9E%97%E6%8A%B5%E6%8A%97%20%E4%BC%9A%E8%AF%8A";
    for method in ["", "&method=bm25", "&method=dense"] {
        let r: serde_json::Value = get(&format!("/api/v1/search?{rq}&limit=50{method}"), &clin).json().unwrap();
        assert!(
            !r.to_string().contains("会诊限阅记录") && !r["facets"].to_string().contains("会诊科"),
            "{method}: {r}"
        );
    }
    let r: serde_json::Value =
        get(&format!("/api/v1/search?{rq}&department=%E4%BC%9A%E8%AF%8A%E7%A7%91"), &clin).json().unwrap();
    assert!(r["total"] == 0 && !r.to_string().contains("会诊限阅记录"), "{r}");
    assert!(!get(&format!("/search?{rq}"), &clin).text().unwrap().contains("会诊限阅记录"));
    assert!(!get(&format!("/embed?{rq}"), &clin).text().unwrap().contains("会诊限阅记录"));
    assert_eq!(get(&format!("/api/v1/documents/{restricted_doc}"), &clin).status(), 404);
    assert_eq!(get(&format!("/doc/{restricted_doc}"), &clin).status(), 404);
    assert_eq!(feedback_on(restricted_chunk), 404);
    let r: serde_json::Value = get(&format!("/api/v1/search?{rq}&limit=50"), &admin).json().unwrap();
    assert!(r.to_string().contains("会诊限阅记录"), "the administrator sees it: {r}");
    // Suggestions come only from what the reader may open (issue 53): tgrl reads as 替格瑞洛 for the administrator,
    // whom the restricted document's word is visible to; the clinician is offered nothing that names it, and a
    // search for the word says it occurs nowhere they may read.
    let r: serde_json::Value = get("/api/v1/search?q=tgrl", &admin).json().unwrap();
    assert_eq!(r["folded_query"], "替格瑞洛", "{r}");
    let r: serde_json::Value = get("/api/v1/search?q=tgrl", &clin).json().unwrap();
    assert!(r["pinyin_of"].is_null() && !r.to_string().contains("替格瑞洛"), "{r}");
    let r: serde_json::Value = get("/api/v1/search?q=%E6%9B%BF%E6%A0%BC%E7%91%9E%E6%B4%9B", &clin).json().unwrap();
    assert!(r["missing_terms"].to_string().contains("替格瑞洛") && r["total"] == 0, "{r}");
    // In the group, the clinician sees it.
    care.ok(&["user", "set", "drwang", "--groups", "会诊组"]);
    let r: serde_json::Value = get(&format!("/api/v1/search?{rq}&limit=50"), &clin).json().unwrap();
    assert!(r.to_string().contains("会诊限阅记录"), "{r}");
    assert_eq!(get(&format!("/doc/{restricted_doc}"), &clin).status(), 200);
    // Unknown paths answer 404 with the error code (JSON for the API, an HTML page otherwise).
    let res = get("/api/v1/nope", &clin);
    assert_eq!(res.status(), 404);
    let res = get("/nope", &clin);
    assert_eq!(res.status(), 404);
    assert!(res.text().unwrap().contains("请求编号"));
    // Metrics count what happened above.
    let text = get("/metrics", &admin).text().unwrap();
    assert!(text.contains("care_http_request_duration_seconds_bucket{method=\"GET\",route=\"/api/v1/search\",status=\"2xx\",le=\"0.5\"}"), "{text}");
    assert!(text.contains("care_searches_total{method=\"bm25\"}"), "{text}");
    assert!(text.contains("care_jobs{state="), "{text}");
    // The OpenAPI document lists the search path.
    let doc: serde_json::Value = c.get(format!("{base}/api/v1/openapi.json")).send().unwrap().json().unwrap();
    assert!(doc["paths"]["/api/v1/search"]["get"].is_object());
}

fn hidden(html: &str, name: &str) -> String {
    let key = format!("name=\"{name}\" value=\"");
    let i = html.find(&key).unwrap_or_else(|| panic!("no hidden {name} in {html}")) + key.len();
    html[i..].split('"').next().unwrap().to_string()
}

#[test]
fn sessions_csrf_cookies_redirects_headers_and_lockout() {
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    care.ok(&["init"]);
    let served = care.serve_full();
    let base = served.https.clone();
    // First start with no users: the administrator is created and its generated password printed once.
    let pw = served.admin_password.clone().expect("bootstrap password printed");
    let c = client();

    // The login form: a double-submit cookie and the same token in the form.
    let res = c.get(format!("{base}/login")).send().unwrap();
    assert_eq!(res.status(), 200);
    let sc = set_cookies(res.headers());
    let login_cookie = cookie_value(&sc, "__Host-care_login_csrf").expect("login csrf cookie");
    assert!(sc[0].contains("Secure") && sc[0].contains("HttpOnly") && sc[0].contains("SameSite=Strict"), "{sc:?}");
    let html = res.text().unwrap();
    let form_token = hidden(&html, "csrf");
    assert_eq!(form_token, login_cookie);
    let login = |body: String, cookie: Option<&str>| {
        let mut rb =
            c.post(format!("{base}/login")).header("content-type", "application/x-www-form-urlencoded").body(body);
        if let Some(ck) = cookie {
            rb = rb.header("cookie", format!("__Host-care_login_csrf={ck}"));
        }
        rb.send().unwrap()
    };
    // Without the form token: refused, with an HTML error page carrying the request id.
    let res = login(format!("username=admin&password={pw}"), Some(&login_cookie));
    assert_eq!(res.status(), 403);
    let rid = res.headers()["x-request-id"].to_str().unwrap().to_string();
    let body = res.text().unwrap();
    assert!(body.contains("表单已失效") && body.contains(&rid) && body.contains("csrf_rejected"), "{body}");
    // A token that does not match the cookie (a cross-site post cannot read or set the cookie): refused.
    let res = login(format!("username=admin&password={pw}&csrf=forged"), Some(&login_cookie));
    assert_eq!(res.status(), 403);
    let res = login(format!("username=admin&password={pw}&csrf={form_token}"), None);
    assert_eq!(res.status(), 403);
    // Correct: a session cookie that is Secure, HttpOnly and SameSite=Strict.
    let res =
        login(format!("username=admin&password={pw}&csrf={form_token}&next=%2Fadmin%2Fusers"), Some(&login_cookie));
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()["location"], "/admin/users");
    let sc = set_cookies(res.headers());
    let session_header = sc.iter().find(|c| c.starts_with("__Host-care_session=")).expect("session cookie").clone();
    for flag in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(session_header.contains(flag), "{session_header} lacks {flag}");
    }
    let session = cookie_value(&sc, "__Host-care_session").unwrap();
    let ck = format!("__Host-care_session={session}");

    // The generated password was printed once: until it is changed, every page leads to the account page and the
    // API refuses everything but the password change.
    let res = c.get(format!("{base}/admin/users")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()["location"], "/account");
    let res = c.get(format!("{base}/api/v1/admin/collections")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.status(), 403);
    let res = c.get(format!("{base}/account")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.status(), 200);
    let html = res.text().unwrap();
    assert!(html.contains("请先修改初始密码"), "{html}");
    let account_csrf = page_csrf(&html);
    // A common password is refused, in Chinese, however long.
    let res = c
        .post(format!("{base}/account/password"))
        .header("cookie", &ck)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("current={pw}&new=password12&csrf={account_csrf}"))
        .send()
        .unwrap();
    let html = res.text().unwrap();
    assert!(html.contains("太容易被猜中"), "{html}");
    let new_pw = "a-new-admin-passphrase-9";
    let res = c
        .post(format!("{base}/account/password"))
        .header("cookie", &ck)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("current={pw}&new={new_pw}&csrf={account_csrf}"))
        .send()
        .unwrap();
    assert_eq!(res.status(), 303, "{}", res.text().unwrap());
    let pw = new_pw.to_string();
    let res = login(format!("username=admin&password={pw}&csrf={form_token}"), Some(&login_cookie));
    assert_eq!(res.status(), 303);
    let session = cookie_value(&set_cookies(res.headers()), "__Host-care_session").unwrap();
    let ck = format!("__Host-care_session={session}");

    let res = c.get(format!("{base}/search")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.status(), 200);
    // Security headers: CSP without inline script, HSTS, framing denied.
    let h = res.headers().clone();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert!(h["strict-transport-security"].to_str().unwrap().contains("max-age="));
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["cache-control"], "no-store");
    let csrf = page_csrf(&res.text().unwrap());

    // A password an administrator sets for someone else is theirs to replace at the first sign-in.
    let res = c
        .post(format!("{base}/admin/users"))
        .header("cookie", &ck)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("username=nurse.wang&password=ward-seven-lamp-42&role=clinician&csrf={csrf}"))
        .send()
        .unwrap();
    assert_eq!(res.status(), 303);
    let res = login(format!("username=nurse.wang&password=ward-seven-lamp-42&csrf={form_token}"), Some(&login_cookie));
    assert_eq!(res.status(), 303);
    let nurse =
        format!("__Host-care_session={}", cookie_value(&set_cookies(res.headers()), "__Host-care_session").unwrap());
    let res = c.get(format!("{base}/search")).header("cookie", &nurse).send().unwrap();
    assert_eq!((res.status().as_u16(), res.headers()["location"].to_str().unwrap()), (303, "/account"));
    let users = c.get(format!("{base}/admin/users")).header("cookie", &ck).send().unwrap().text().unwrap();
    assert!(users.contains("待本人修改初始密码"), "{users}");

    // The embed page is the one page other systems may frame.
    let res = c.get(format!("{base}/embed")).header("cookie", &ck).send().unwrap();
    let csp = res.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("frame-ancestors 'self'"), "{csp}");
    assert!(res.headers().get("x-frame-options").is_none());

    // Form posts riding on the session need the session's token.
    let post = |path: &str, body: &str, header: Option<&str>| {
        let mut rb = c
            .post(format!("{base}{path}"))
            .header("cookie", &ck)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_string());
        if let Some(hv) = header {
            rb = rb.header("x-csrf-token", hv);
        }
        rb.send().unwrap()
    };
    assert_eq!(post("/admin/collections", "name=viaform", None).status(), 403);
    assert_eq!(post("/admin/collections", "name=viaform&csrf=0000", None).status(), 403);
    let res = post("/admin/collections", &format!("name=viaform&csrf={csrf}"), None);
    assert_eq!(res.status(), 303, "{}", res.text().unwrap());
    // JSON calls from the pages' script send the token as a header.
    let api = |hdr: Option<&str>| {
        let mut rb = c
            .post(format!("{base}/api/v1/admin/collections"))
            .header("cookie", &ck)
            .header("content-type", "application/json")
            .body(r#"{"name":"viaapi"}"#);
        if let Some(hv) = hdr {
            rb = rb.header("x-csrf-token", hv);
        }
        rb.send().unwrap()
    };
    let res = api(None);
    assert_eq!(res.status(), 403);
    assert_eq!(res.json::<serde_json::Value>().unwrap()["code"], "csrf_rejected");
    assert_eq!(api(Some(&csrf)).status(), 201);
    let cols: serde_json::Value =
        c.get(format!("{base}/api/v1/admin/collections")).header("cookie", &ck).send().unwrap().json().unwrap();
    let names: Vec<&str> = cols.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["viaapi", "viaform"]);

    // Plain HTTP only redirects: no page, no cookie, even when a cookie is offered.
    let http = served.http.clone().expect("redirect listener");
    let port = base.rsplit(':').next().unwrap();
    for method in ["GET", "POST"] {
        let res = send(&c, method, &format!("{http}/search?q=x"), Body::Empty, None);
        assert_eq!(res.status(), 308);
        assert_eq!(res.headers()["location"], format!("https://127.0.0.1:{port}/search?q=x"));
        assert!(res.headers().get(SET_COOKIE).is_none());
        assert!(res.text().unwrap().is_empty());
    }
    let res = c.get(format!("{http}/admin/users")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.status(), 308);
    // The HTTPS port does not speak plain HTTP at all.
    let plain = base.replace("https://", "http://");
    let r = Client::new().get(format!("{plain}/healthz")).timeout(Duration::from_secs(5)).send();
    assert!(r.map(|r| !r.status().is_success()).unwrap_or(true));

    // Logout ends the session on the server, not only in the browser.
    let res = post("/logout", &format!("csrf={csrf}"), None);
    assert_eq!(res.status(), 303);
    assert!(
        set_cookies(res.headers()).iter().any(|c| c.starts_with("__Host-care_session=;") && c.contains("Max-Age=0"))
    );
    let res = c.get(format!("{base}/search")).header("cookie", &ck).send().unwrap();
    assert_eq!(res.status(), 302);

    // Lockout: five wrong passwords lock the account; then even the right one is refused (423).
    for i in 1..=5 {
        let res = login(format!("username=admin&password=wrong-{i}&csrf={form_token}"), Some(&login_cookie));
        let want = if i < 5 { 401 } else { 423 };
        assert_eq!(res.status(), want, "attempt {i}");
    }
    let res = login(format!("username=admin&password={pw}&csrf={form_token}"), Some(&login_cookie));
    assert_eq!(res.status(), 423);
    assert!(res.text().unwrap().contains("账户已锁定"));
    drop(served);
    // `care user set --unlock` (the console's recovery path) lets the administrator in again; verified via audit.
    care.ok(&["user", "set", "admin", "--unlock"]);
    let list = care.json(&["audit", "list", "--json", "-n", "500"]);
    let actions: Vec<&str> = list.as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    for a in
        ["auth.login", "auth.login_failed", "auth.account_locked", "auth.logout", "collection.create", "user.update"]
    {
        assert!(actions.contains(&a), "{a} missing from {actions:?}");
    }
    let out = care.run(&["audit", "verify"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn audit_verify_detects_altered_and_removed_records() {
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    care.ok(&["init"]);
    // A fresh log verifies (zero records).
    assert!(care.ok(&["audit", "verify"]).contains("0 records"));
    two_collections(&care, t.path());
    add_user(&care, t.path(), "admin", "admin", ADMIN_PW);
    add_user(&care, t.path(), "drwang", "clinician", CLIN_PW);
    care.ok(&["user", "grant", "drwang", "granted"]);
    care.ok(&["user", "grant", "drwang", "secret"]);
    care.ok(&["user", "revoke", "drwang", "secret"]);
    let out = care.ok(&["audit", "verify"]);
    let n: usize = out
        .split("intact: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // Creating and filling the collections is audited by the engine; the 2 users and 3 permission changes add 5.
    assert!(n >= 5, "{out}");
    let csv = t.path().join("audit.csv");
    care.ok(&["audit", "export", "--out", csv.to_str().unwrap()]);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), n + 1, "header + {n} records: {text}");
    assert!(text.contains("permission.grant"));

    let db = rusqlite::Connection::open(t.path().join("data/care.sqlite")).unwrap();
    let verify = || care.run(&["audit", "verify"]);
    // Alter one field of a record directly in SQLite.
    let (grant_id, original): (i64, String) = db
        .query_row("SELECT id, detail FROM audit WHERE action = 'permission.grant' ORDER BY id LIMIT 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    db.execute(
        "UPDATE audit SET detail = ?1 WHERE id = ?2",
        rusqlite::params![original.replace("granted", "secret"), grant_id],
    )
    .unwrap();
    let out = verify();
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TAMPERED") && err.contains(&format!("第 {grant_id} 条")) && err.contains("changed"), "{err}");
    db.execute("UPDATE audit SET detail = ?1 WHERE id = ?2", rusqlite::params![&original, grant_id]).unwrap();
    assert!(verify().status.success(), "restoring the record restores the chain");
    // Change the actor instead.
    db.execute("UPDATE audit SET actor = 'someone-else' WHERE id = 2", []).unwrap();
    assert_eq!(verify().status.code(), Some(4));
    let t2 = tempfile::tempdir().unwrap();
    // Remove a record in the middle, the first one, or the newest one: each is caught.
    for (victim, needle) in
        [("id = 3", "missing"), ("id = 1", "removed"), ("id = (SELECT MAX(id) FROM audit)", "removed")]
    {
        let care2 = Care::new(&t2.path().join(victim.replace(['=', ' ', '(', ')', '*'], "_")));
        care2.ok(&["init"]);
        add_user(&care2, t2.path(), "a1", "admin", ADMIN_PW);
        add_user(&care2, t2.path(), "a2", "clinician", CLIN_PW);
        add_user(&care2, t2.path(), "a3", "clinician", CLIN_PW);
        add_user(&care2, t2.path(), "a4", "clinician", CLIN_PW);
        assert!(care2.run(&["audit", "verify"]).status.success());
        let db2 = rusqlite::Connection::open(care2.data_dir.join("care.sqlite")).unwrap();
        db2.execute(&format!("DELETE FROM audit WHERE {victim}"), []).unwrap();
        let out = care2.run(&["audit", "verify"]);
        assert_eq!(out.status.code(), Some(4), "deleting {victim}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "deleting {victim}: {err}");
    }
}

fn screenshot_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn keep_screenshot(b: &Browser, name: &str) -> PathBuf {
    let p = screenshot_dir().join(name);
    b.screenshot(&p);
    if let Some(a) = std::env::var_os("CARE_ARTIFACTS") {
        let a = PathBuf::from(a);
        std::fs::create_dir_all(&a).unwrap();
        std::fs::copy(&p, a.join(name)).unwrap();
    }
    eprintln!("screenshot: {}", p.display());
    p
}

const STRUCTURED_HTML: &str = r#"<!doctype html><html><head><meta charset="utf-8"><title>二甲双胍用药规范</title></head>
<body><nav>首页 | 药学部</nav><h1>二甲双胍用药规范</h1>
<h2>禁忌症</h2><p>下列情况禁用二甲双胍：</p>
<ol><li>中重度肾功能不全，eGFR低于30。</li><li>失代偿性心力衰竭、休克等缺氧状态。</li><li>糖尿病酮症酸中毒。</li>
<li>对本品过敏者。</li></ol>
<h2>用法用量</h2><ul><li>随餐服用</li><li>小剂量起始</li></ul>
<table><thead><tr><th>剂型</th><th>起始剂量</th></tr></thead>
<tbody><tr><td>普通片</td><td>500 mg 每日两次</td></tr><tr><td>缓释片</td><td>500 mg 每日一次</td></tr></tbody></table>
<p>注入测试：&lt;script&gt;alert(1)&lt;/script&gt;</p></body></html>"#;

/// Issue 30 item 5: the document view keeps structure. A page whose contraindications are a numbered list opens
/// (from a search hit, with the query) as an `<ol>` of its items, its doses as a `<table>`, the query's terms
/// marked, the time local and readable, and text that looks like markup shown as text.
#[test]
fn browser_document_view_keeps_lists_tables_and_marks_the_query() {
    assert!(care_e2e::webdriver::available(), "chromium and chromedriver are needed");
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    let pwf = write(&t.path().join("admin.pw"), &format!("{ADMIN_PW}\n"));
    care.env.push(("CARE__AUTH__BOOTSTRAP_PASSWORD_FILE".into(), pwf.display().to_string()));
    care.ok(&["init"]);
    care.ok(&["collection", "create", "guidelines"]);
    let page = write(&t.path().join("metformin.html"), STRUCTURED_HTML);
    care.ok(&["ingest", "guidelines", page.to_str().unwrap()]);
    let found = care.json(&["search", "--json", "-c", "guidelines", "二甲双胍的禁忌症"]);
    let doc = found["hits"][0]["document_id"].as_i64().unwrap();
    let chunk = found["hits"][0]["chunk_id"].as_i64().unwrap();
    let served = care.serve_full();
    let base = served.https.clone();

    let b = Browser::start(1280, 900);
    b.goto(&format!("{base}/login"));
    b.type_into("#username", "admin");
    b.type_into("#password", ADMIN_PW);
    b.click("form[action='/login'] button[type=submit]");
    b.wait_for("the search page", Duration::from_secs(20), |s| s.contains("id=\"q\""));

    // The link a search hit carries: the query travels with it.
    let q = "%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D%E7%9A%84%E7%A6%81%E5%BF%8C%E7%97%87"; // 二甲双胍的禁忌症
    b.goto(&format!("{base}/doc/{doc}?q={q}#c{chunk}"));
    let src = b.wait_for("the document", Duration::from_secs(20), |s| s.contains("class=\"document\""));
    let items: Vec<String> = (1..=4).map(|i| b.text(&format!("article.document ol > li:nth-of-type({i})"))).collect();
    assert_eq!(
        items,
        [
            "中重度肾功能不全，eGFR低于30。",
            "失代偿性心力衰竭、休克等缺氧状态。",
            "糖尿病酮症酸中毒。",
            "对本品过敏者。"
        ],
        "{src}"
    );
    assert_eq!(b.find_all("article.document ol > li").len(), 4);
    assert_eq!(b.find_all("article.document ul > li").len(), 2, "{src}");
    // The table's rows (its header row among them) stay rows of cells.
    assert_eq!(b.find_all("article.document table tr").len(), 3, "{src}");
    assert_eq!(b.text("article.document table tr:nth-of-type(1) td:nth-of-type(2)"), "起始剂量", "{src}");
    assert_eq!(b.text("article.document table tr:nth-of-type(3) td:nth-of-type(1)"), "缓释片");
    // The query's terms are marked, in headings and text alike, and the page says so.
    assert_eq!(b.find_all("article.document mark").len(), 2, "{src}");
    assert!(src.contains("<mark>禁忌症</mark>") && src.contains("<mark>二甲双胍</mark>"), "{src}");
    assert!(b.text("p.query-marks").contains("二甲双胍的禁忌症"), "{src}");
    // Uploaded text is text: the escaped script in the page stays visible characters, never an element.
    assert!(b.find_all("article.document script").is_empty());
    assert!(b.text("article.document").contains("<script>alert(1)</script>"), "{src}");
    // The time is local and readable: 2026-11-26 21:05, not an RFC 3339 stamp.
    let meta = b.text("article.document p.meta");
    let shown = meta.split("入库时间 ").nth(1).unwrap_or_default().trim().to_string();
    let digits: String = shown.chars().map(|c| if c.is_ascii_digit() { '0' } else { c }).collect();
    assert_eq!(digits, "0000-00-00 00:00", "{meta}");
    keep_screenshot(&b, "document-structure.png");

    // Without a query nothing is marked, and the structure is the same.
    b.goto(&format!("{base}/doc/{doc}"));
    b.wait_for("the plain document", Duration::from_secs(20), |s| s.contains("class=\"document\""));
    assert!(b.find_all("article.document mark").is_empty());
    assert_eq!(b.find_all("article.document ol > li").len(), 4);
}

/// Issue 54 in the browser: an admin uploads a scanned PDF (a fax, CCITT G4) and a photographed package insert
/// through the console's form; both are read by the OCR in the parsing child; a word from each is found, the hit
/// says 识别自扫描件 · 第 1 页, and the document view marks the scanned page.
#[test]
fn browser_scanned_pdf_and_photo_upload_search_and_document_view() {
    use care_engine::ingest::fixtures::{PdfImage, PdfPage, pdf_mixed};
    assert!(care_e2e::webdriver::available(), "chromium and chromedriver are needed");
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    let pwf = write(&t.path().join("admin.pw"), &format!("{ADMIN_PW}\n"));
    care.env.push(("CARE__AUTH__BOOTSTRAP_PASSWORD_FILE".into(), pwf.display().to_string()));
    care.ok(&["init"]);
    care.ok(&["collection", "create", "scans"]);
    let served = care.serve_full();
    let base = served.https.clone();
    let page =
        image::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/engine/tests/fixtures/ocr-page.png"))
            .unwrap();
    let fax = t.path().join("传真说明书.pdf");
    std::fs::write(&fax, pdf_mixed(&[PdfPage::Scan(PdfImage::fax_g4(&page.to_luma8()))])).unwrap();
    let photo = t.path().join("说明书照片.jpg");
    page.to_rgb8().save(&photo).unwrap();

    let b = Browser::start(1280, 900);
    b.goto(&format!("{base}/login"));
    b.type_into("#username", "admin");
    b.type_into("#password", ADMIN_PW);
    b.click("form[action='/login'] button[type=submit]");
    b.wait_for("the search page", Duration::from_secs(20), |s| s.contains("id=\"q\""));
    b.goto(&format!("{base}/admin/collections"));
    let input = b.find("#col-scans input[type=file]");
    b.send_keys(&input, &format!("{}\n{}", fax.display(), photo.display()));
    b.click("#col-scans form[data-upload] button[type=submit]");
    let src = b.wait_for("the job to finish", Duration::from_secs(180), |s| {
        s.contains("data-state=\"done\"") || s.contains("data-state=\"failed\"")
    });
    assert!(src.contains("data-state=\"done\"") && src.contains("2 篇文档"), "{src}");

    // A word each scan holds: both files answer, each hit saying where it was read from.
    b.goto(&format!("{base}/search?q=%E9%85%AE%E7%97%87%E9%85%B8%E4%B8%AD%E6%AF%92")); // 酮症酸中毒
    let src = b.wait_for("results", Duration::from_secs(30), |s| s.contains("class=\"results\""));
    for file in ["传真说明书.pdf", "说明书照片.jpg"] {
        assert!(src.contains(file), "{file}: {src}");
    }
    let labels = b.find_all("li.hit span.scanned").len();
    assert!(
        labels >= 2 && src.matches("<span class=\"scanned\">识别自扫描件 · 第 1 页</span>").count() == labels,
        "{src}"
    );
    assert!(src.contains("<mark>"), "the query is marked in the recognised text: {src}");
    keep_screenshot(&b, "scan-search.png");

    b.click("li.hit h2 a");
    let src = b.wait_for("the document", Duration::from_secs(20), |s| s.contains("class=\"document\""));
    assert!(b.text("article.document p.scanned").starts_with("识别自扫描件 · 第 1 页"), "{src}");
    assert!(b.text("article.document").contains("阿卡波糖"), "{src}");
    keep_screenshot(&b, "scan-document.png");
}

/// The main flows in headless Chromium: log in, create a collection, upload files, watch the job finish (with a
/// per-file error), search with the keyboard, open a document, give feedback, log out. Screenshots of the search
/// page and the jobs page are kept in target/tmp/screenshots (and $CARE_ARTIFACTS when set).
#[test]
fn browser_login_upload_search_document_feedback_logout() {
    assert!(
        care_e2e::webdriver::available(),
        "chromium and chromedriver are needed (Debian packages chromium, chromium-driver; `packaging/dev.sh setup` installs them)"
    );
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    let pwf = write(&t.path().join("admin.pw"), &format!("{ADMIN_PW}\n"));
    care.env.push(("CARE__AUTH__BOOTSTRAP_PASSWORD_FILE".into(), pwf.display().to_string()));
    care.ok(&["init"]);
    let served = care.serve_full();
    assert!(served.admin_password.is_none(), "a password from the file is not printed");
    let base = served.https.clone();
    let md = write(&t.path().join("二甲双胍指南.md"), METFORMIN_MD);
    let bad = write(&t.path().join("broken.jsonl"), "{\"id\":\"1\",\"text\":\"阿司匹林\"}\nnot json\n");

    let b = Browser::start(1280, 900);
    b.goto(&format!("{base}/search"));
    assert!(b.url().contains("/login?next=") && b.url().ends_with("search"), "{}", b.url());
    b.type_into("#username", "admin");
    b.type_into("#password", ADMIN_PW);
    b.click("form[action='/login'] button[type=submit]");
    b.wait_for("the search page", Duration::from_secs(20), |s| s.contains("id=\"q\""));
    assert!(b.url().ends_with("/search"), "{}", b.url());

    // Admin: create a collection and upload two files (one is broken).
    b.goto(&format!("{base}/admin/collections"));
    b.type_into("#name", "guidelines");
    b.type_into("#description", "临床用药指南");
    b.click("form[action='/admin/collections'] button[type=submit]");
    b.wait_for("the new collection", Duration::from_secs(20), |s| s.contains("id=\"col-guidelines\""));
    let input = b.find("#col-guidelines input[type=file]");
    b.send_keys(&input, &format!("{}\n{}", md.display(), bad.display()));
    // The upload form's department and type, for documents that do not name their own.
    b.click("#col-guidelines details.upload-meta summary");
    b.type_into("#col-guidelines input[name=department]", "内分泌科");
    b.type_into("#col-guidelines input[name=doc_type]", "指南");
    b.click("#col-guidelines form[data-upload] button[type=submit]");
    // app.js uploads with progress, then follows the redirect to the jobs page, which polls the jobs API.
    let src = b.wait_for("the job to finish", Duration::from_secs(60), |s| {
        s.contains("data-state=\"done\"") && s.contains("1 篇文档")
    });
    assert!(b.url().contains("/admin/jobs"), "{}", b.url());
    assert!(src.contains("broken.jsonl") && src.contains("malformed_record"), "per-file error shown: {src}");
    let jobs_png = keep_screenshot(&b, "admin-jobs.png");

    // Clinician view of search: keyboard only (type, Enter).
    b.goto(&format!("{base}/search"));
    b.type_into("#q", "二甲双胍的禁忌症\u{E007}");
    let src = b.wait_for("results", Duration::from_secs(30), |s| s.contains("class=\"results\""));
    assert!(src.contains("<mark>") && src.contains("二甲双胍用药指南") && src.contains("禁忌症"), "{src}");
    assert!(src.contains("资料库：<span translate=\"no\">guidelines</span>"), "{src}");
    assert!(src.contains("<span class=\"filed\">内分泌科 · 指南</span>"), "the form's department and type: {src}");
    let search_png = keep_screenshot(&b, "search.png");

    // The collection's documents: found by title, re-filed, and the next search shows the new filing.
    b.goto(&format!("{base}/admin/collections"));
    b.click("#col-guidelines a.doc-list");
    b.wait_for("the document list", Duration::from_secs(20), |s| s.contains("id=\"documents\""));
    b.type_into("#doc-filter input[name=title]", "二甲双胍");
    b.click("#doc-filter button[type=submit]");
    b.wait_for("the filtered list", Duration::from_secs(20), |s| s.contains("value=\"二甲双胍\""));
    assert!(b.text("#doc-count").contains("共 1 篇"), "{}", b.text("#doc-count"));
    b.type_into("#documents form.filing input[name=department]", "心内科");
    b.click("#documents form.filing button[type=submit]");
    // The flash, not "的归档信息" alone: the list's own help text says that too.
    let src = b.wait_for("the saved filing", Duration::from_secs(20), |s| s.contains("已保存文档"));
    assert!(src.contains("value=\"心内科\"") && b.url().contains("title="), "back on the same list: {}", b.url());
    b.goto(&format!("{base}/search?q=%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D"));
    let src = b.wait_for("results", Duration::from_secs(30), |s| s.contains("class=\"results\""));
    assert!(src.contains("<span class=\"filed\">心内科 · 指南</span>"), "the new filing: {src}");

    // Open the document from the first result.
    b.click("li.hit h2 a");
    let src = b.wait_for("the document", Duration::from_secs(20), |s| s.contains("class=\"document\""));
    assert!(src.contains("eGFR低于30") && src.contains("不良反应"), "{src}");
    assert!(b.url().contains("/doc/"), "{}", b.url());

    // Feedback on the first result.
    b.goto(&format!("{base}/search?q=%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D%E7%9A%84%E7%A6%81%E5%BF%8C%E7%97%87"));
    b.click("li.hit form.feedback button[value='1']");
    b.wait_for("the feedback acknowledgement", Duration::from_secs(20), |s| s.contains("已记录，谢谢"));

    // A new version of the document under another file name, from its row: asked first, queued as a job that
    // names the file, and then the document's content is the new one, under the same id and filing.
    let v2 = write(
        &t.path().join("二甲双胍-2025版.md"),
        "# 二甲双胍用药指南\n\n2025 版：eGFR 介于30与45之间时二甲双胍减量使用。\n",
    );
    b.goto(&format!("{base}/admin/collections/guidelines/documents"));
    let input = b.find("#documents form.replace input[type=file]");
    b.send_keys(&input, &v2.display().to_string());
    b.click("#documents form.replace button[type=submit]");
    b.accept_confirm("替换");
    b.wait_for("the replacement job", Duration::from_secs(30), |s| s.contains("二甲双胍-2025版.md"));
    assert!(b.url().contains("/admin/jobs"), "{}", b.url());
    let started = std::time::Instant::now();
    let src = loop {
        b.goto(&format!("{base}/search?q=%E5%87%8F%E9%87%8F"));
        let src = b.wait_for("results", Duration::from_secs(30), |s| s.contains("id=\"q\""));
        if src.contains("2025 版") {
            break src;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the new version never became searchable: {src}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(src.contains("<span class=\"filed\">心内科 · 指南</span>"), "the filing stayed: {src}");
    b.goto(&format!("{base}/admin/collections/guidelines/documents"));
    assert!(b.text("#doc-count").contains("共 1 篇"), "replaced, not added: {}", b.text("#doc-count"));
    // Narrow screen (a phone on the ward network).
    b.set_window(390, 844);
    let narrow_png = keep_screenshot(&b, "search-narrow.png");
    b.set_window(1280, 900);

    // Log out; the search page then asks for a login again.
    b.click("form[action='/logout'] button[type=submit]");
    b.wait_for("the login page", Duration::from_secs(20), |s| s.contains("id=\"username\""));
    b.goto(&format!("{base}/search"));
    assert!(b.url().contains("/login"), "{}", b.url());
    drop(b);
    drop(served);

    for p in [&jobs_png, &search_png, &narrow_png] {
        let bytes = std::fs::read(p).unwrap();
        assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "{} is not a real screenshot", p.display());
    }
    // What the browser did is in the audit log, and the chain verifies.
    let list = care.json(&["audit", "list", "--json", "-n", "500"]);
    let recs = list.as_array().unwrap();
    let search = recs
        .iter()
        .find(|r| r["action"] == "search" && r["detail"]["query"] == "二甲双胍的禁忌症")
        .expect("search audited with its query");
    assert_eq!(search["actor"], "admin");
    assert!(search["detail"]["results"].as_u64().unwrap() >= 1, "{search}");
    for a in
        ["auth.login", "auth.logout", "collection.create", "ingest.submit", "ingest.done", "feedback", "document.file"]
    {
        assert!(recs.iter().any(|r| r["action"] == a), "{a} not audited");
    }
    let out = care.ok(&["audit", "verify"]);
    assert!(out.contains("intact"), "{out}");
    let db = rusqlite::Connection::open(t.path().join("data/care.sqlite")).unwrap();
    let (n, helpful, passage): (i64, i64, String) = db
        .query_row("SELECT COUNT(*), MAX(helpful), MAX(passage) FROM feedback", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!((n, helpful), (1, 1));
    assert!(passage.contains("二甲双胍"), "{passage}");
}

/// The sign-in page's choices (the hospital's sign-on button, the directory hint), the confirmations that guard
/// access-changing actions (declining one changes nothing), and the settings page (a change takes effect, is shown
/// with who made it, a value out of range is refused in Chinese, and the audit log names the change).
#[test]
fn browser_sign_in_choices_confirmations_and_settings() {
    assert!(care_e2e::webdriver::available(), "chromium and chromedriver are needed (packaging/dev.sh setup)");
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    // Directory and sign-on configured (nothing listens there: the page only shows the choices).
    care.config = Some(write(
        &t.path().join("care.toml"),
        "[ldap]\nurl = \"ldaps://127.0.0.1:1\"\nuser_base = \"ou=people,dc=hospital,dc=test\"\n\
         bind_password = \"s3cret-bind-pw\"\n[ldap.groups]\nadmin = [\"care-admins\"]\n\
         [oidc]\nissuer = \"https://127.0.0.1:1/realms/staff\"\nclient_id = \"care\"\n\
         redirect_url = \"https://127.0.0.1:8443/login/oidc/callback\"\nbutton_label = \"医院统一认证登录\"\n",
    ));
    care.ok(&["init"]);
    add_user(&care, t.path(), "admin", "admin", ADMIN_PW);
    add_user(&care, t.path(), "drwang", "clinician", CLIN_PW);
    let served = care.serve_full();
    let base = served.https.clone();

    let b = Browser::start(1280, 900);
    b.goto(&format!("{base}/login"));
    assert_eq!(b.text("#oidc-sign-in"), "医院统一认证登录");
    assert!(b.text("#directory-hint").contains("医院目录"));
    keep_screenshot(&b, "login-choices.png");
    b.type_into("#username", "admin");
    b.type_into("#password", ADMIN_PW);
    b.click("form[action='/login'] button[type=submit]");
    b.wait_for("signed in", Duration::from_secs(20), |s| s.contains("/logout"));

    // 停用 asks first; declining leaves the account enabled, accepting disables it.
    b.goto(&format!("{base}/admin/users"));
    let disable = "#user-drwang form[data-confirm*='停用'] button[type=submit]";
    b.click(disable);
    b.dismiss_confirm("停用 drwang");
    std::thread::sleep(Duration::from_millis(500));
    assert!(b.text("#user-drwang").contains("正常"), "{}", b.text("#user-drwang"));
    b.click(disable);
    b.accept_confirm("停用 drwang");
    b.wait_for("drwang disabled", Duration::from_secs(20), |s| s.contains("已更新用户 drwang"));
    assert!(b.text("#user-drwang").contains("已停用"));

    // The settings page: a change asks first, takes effect and is shown with who made it.
    b.goto(&format!("{base}/admin/settings"));
    assert!(b.text("#setting-dense_weight").contains("语义检索权重"));
    b.type_into("#v-dense_weight", "0.5");
    b.click("#setting-dense_weight button[type=submit]");
    b.accept_confirm("更改「语义检索权重」");
    b.wait_for("the setting saved", Duration::from_secs(20), |s| s.contains("已保存，立即生效"));
    let row = b.text("#setting-dense_weight");
    assert!(row.contains("0.5") && row.contains("admin 于"), "{row}");
    keep_screenshot(&b, "settings.png");
    // 设置 → 备份: the daily time asks first, is saved and shown with its next run; the overview says the same.
    b.type_into("#backup-time", "03:15");
    b.click("#backup-schedule button[type=submit]");
    b.accept_confirm("保存备份设置");
    b.wait_for("the backup time saved", Duration::from_secs(20), |s| s.contains("已保存：每天 03:15"));
    let line = b.text("#backup-summary");
    assert!(line.contains("每天 03:15") && line.contains("尚无备份") && line.contains("下次"), "{line}");
    b.type_into("#backup-dir", "backups");
    b.click("#backup-schedule button[type=submit]");
    b.accept_confirm("保存备份设置");
    b.wait_for("a relative folder refused", Duration::from_secs(20), |s| s.contains("须为绝对路径"));
    b.goto(&format!("{base}/admin/overview"));
    let line = b.text("#overview-backup");
    assert!(line.contains("尚无备份") && line.contains("下次"), "{line}");
    b.goto(&format!("{base}/admin/settings"));
    // The hospital sign-in as configured, its secret never shown.
    let src = b.source();
    assert!(
        src.contains("ldaps://127.0.0.1:1") && src.contains("care-admins") && src.contains("已设置（不显示）"),
        "{src}"
    );
    assert!(!src.contains("s3cret-bind-pw"), "the bind password must not reach the page");
    // Out of range: refused in Chinese, nothing changed.
    b.type_into("#v-dense_weight", "2");
    b.click("#setting-dense_weight button[type=submit]");
    b.accept_confirm("更改「语义检索权重」");
    let src = b.wait_for("the refusal", Duration::from_secs(20), |s| s.contains("须为 0 到 1 之间"));
    assert!(src.contains("收到「2」"), "{src}");
    assert!(b.text("#setting-dense_weight .value").starts_with("0.5"));
    // The audit log names the change in Chinese, with the time in the hospital's.
    b.goto(&format!("{base}/admin/audit?action=settings"));
    let src = b.wait_for("the audit page", Duration::from_secs(20), |s| s.contains("修改设置"));
    assert!(src.contains("settings.update"), "{src}");
    // Its detail reads as named fields, not as the stored JSON.
    assert!(src.contains("<dt>设置项</dt>") && src.contains("<dt>至</dt>"), "{src}");
    assert!(!src.contains("\"setting\"") && !src.contains("&quot;setting"), "{src}");
}
