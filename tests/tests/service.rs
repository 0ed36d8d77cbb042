//! The service layer seen from outside (issue "Server service layer"): every state-changing operation leaves
//! exactly one audit record, whichever interface made it — an admin page form, the JSON API or the `care` CLI —
//! against the real `care serve` over HTTPS and the real SQLite audit log.

use std::path::Path;
use std::time::Duration;

use care_e2e::{Care, add_user, cookie_value, set_cookies, token, write};
use reqwest::blocking::{Client, RequestBuilder};

const ADMIN_PW: &str = "admin-passphrase-1";
const CLIN_PW: &str = "clinician-passphrase-1";

/// Worker outcomes (`ingest.done` …) are the job's own later events, not a second record of the submission.
const LATER_EVENTS: &[&str] =
    &["ingest.done", "ingest.failed", "ingest.cancelled", "model.job_done", "model.job_failed", "model.job_cancelled"];

/// The audit log, newest first, read through the API (the CLI would open the engine beside the server's worker).
fn audit(api: &Api, limit: usize) -> serde_json::Value {
    let url = format!("{}/api/v1/admin/audit?limit={limit}", api.base);
    api.c.get(url).bearer_auth(&api.token).send().unwrap().json().unwrap()
}

fn newest_id(api: &Api) -> i64 {
    audit(api, 1)[0]["id"].as_i64().unwrap_or(0)
}

/// The actions recorded after `since`, without the worker's later events.
fn actions_after(api: &Api, since: i64) -> Vec<String> {
    let list = audit(api, 1000);
    let mut out: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["id"].as_i64().unwrap() > since)
        .map(|r| r["action"].as_str().unwrap().to_string())
        .filter(|a| !LATER_EVENTS.contains(&a.as_str()))
        .collect();
    out.reverse();
    out
}

/// Runs `op` and asserts it left exactly one record, `action`.
fn one_record(api: &Api, what: &str, action: &str, op: impl FnOnce()) {
    let before = newest_id(api);
    op();
    assert_eq!(actions_after(api, before), vec![action.to_string()], "{what}");
}

/// Waits until no ingest job is queued or running, so CLI commands (which open the engine) meet no pending write.
fn jobs_settle(api: &Api) {
    for _ in 0..600 {
        let jobs: serde_json::Value = api
            .c
            .get(format!("{}/api/v1/admin/jobs", api.base))
            .bearer_auth(&api.token)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let busy = jobs.as_array().unwrap().iter().any(|j| j["state"] == "queued" || j["state"] == "running");
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("ingest jobs did not finish");
}

struct Page {
    c: Client,
    base: String,
    cookie: String,
    csrf: String,
}

impl Page {
    /// Signs in through the login form (double-submit cookie) and reads the session's CSRF token from a page.
    fn sign_in(base: &str, user: &str, pw: &str) -> Page {
        let c = care_e2e::no_redirect_client(Duration::from_secs(120));
        let res = c.get(format!("{base}/login")).send().unwrap();
        let login = cookie_value(&set_cookies(res.headers()), "__Host-care_login_csrf").unwrap();
        let res = c
            .post(format!("{base}/login"))
            .header("cookie", format!("__Host-care_login_csrf={login}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("username={user}&password={pw}&csrf={login}"))
            .send()
            .unwrap();
        assert_eq!(res.status(), 303, "login of {user}");
        let v = cookie_value(&set_cookies(res.headers()), "__Host-care_session").unwrap();
        let cookie = format!("__Host-care_session={v}");
        let html = c.get(format!("{base}/account")).header("cookie", &cookie).send().unwrap().text().unwrap();
        let csrf = care_e2e::page_csrf(&html);
        Page { c, base: base.to_string(), cookie, csrf }
    }

    /// Posts a form and expects the redirect of a successful action.
    fn post(&self, path: &str, form: &str) {
        let res = self
            .c
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("{form}&csrf={}", self.csrf))
            .send()
            .unwrap();
        let loc = res.headers().get("location").map(|l| l.to_str().unwrap().to_string()).unwrap_or_default();
        assert!(res.status() == 303 || res.status() == 200, "POST {path}: {}", res.status());
        assert!(!loc.contains("error="), "POST {path} failed: {loc}");
    }
}

struct Api {
    c: Client,
    base: String,
    token: String,
}

impl Api {
    fn send(&self, r: RequestBuilder, what: &str) {
        let res = r.bearer_auth(&self.token).send().unwrap();
        assert!(res.status().is_success(), "{what}: {} {}", res.status(), res.text().unwrap_or_default());
    }
    fn json(&self, method: reqwest::Method, path: &str, body: serde_json::Value) {
        let r = self.c.request(method.clone(), format!("{}{path}", self.base)).json(&body);
        self.send(r, &format!("{method} {path}"));
    }
}

fn upload_form(dir: &Path, name: &str) -> reqwest::blocking::multipart::Form {
    let f = write(&dir.join(name), "# 二甲双胍\n\n二甲双胍禁用于严重肾功能不全的患者。\n");
    reqwest::blocking::multipart::Form::new().file("file", f).unwrap()
}

#[test]
fn every_operation_leaves_one_audit_record_from_page_api_and_cli() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let care = Care::new(&dir.join("data"));
    care.ok(&["init"]);
    add_user(&care, dir, "admin", "admin", ADMIN_PW);
    add_user(&care, dir, "drwang", "clinician", CLIN_PW);
    let admin_token = token(&care, "admin", "service-test");
    let served = care.serve_full();
    let page = Page::sign_in(&served.https, "admin", ADMIN_PW);
    let api = Api { c: care_e2e::https_client(), base: served.https.clone(), token: admin_token };
    use reqwest::Method as M;

    // Collections.
    one_record(&api, "page: create collection", "collection.create", || page.post("/admin/collections", "name=p1"));
    one_record(&api, "api: create collection", "collection.create", || {
        api.json(M::POST, "/api/v1/admin/collections", serde_json::json!({"name": "a1"}))
    });
    one_record(&api, "cli: create collection", "collection.create", || {
        care.ok(&["collection", "create", "c1"]);
    });
    one_record(&api, "page: approve", "collection.approve", || {
        page.post("/admin/collections/p1/approve", "approved=1")
    });
    one_record(&api, "api: approve", "collection.approve", || {
        api.json(M::PUT, "/api/v1/admin/collections/a1/approval", serde_json::json!({"approved": true}))
    });
    one_record(&api, "cli: approve", "collection.approve", || {
        care.ok(&["collection", "approve", "c1"]);
    });

    // Uploads queue one job each (its worker's later `ingest.done` is the job's own event).
    one_record(&api, "page: upload", "ingest.submit", || {
        let url = format!("{}/admin/collections/p1/upload", page.base);
        let res = page.c.post(url).header("cookie", &page.cookie).header("x-csrf-token", &page.csrf);
        let res = res.multipart(upload_form(dir, "p.md")).send().unwrap();
        assert_eq!(res.status(), 303);
    });
    one_record(&api, "api: upload", "ingest.submit", || {
        let r =
            api.c.post(format!("{}/api/v1/admin/collections/a1/files", api.base)).multipart(upload_form(dir, "a.md"));
        api.send(r, "upload");
    });

    jobs_settle(&api);

    // Users, passwords, grants, tokens.
    one_record(&api, "page: create user", "user.create", || {
        page.post("/admin/users", "username=pu&password=page-user-pass-1&role=clinician")
    });
    one_record(&api, "api: create user", "user.create", || {
        let body = serde_json::json!({"username": "au", "password": "api-user-pass-1", "role": "clinician"});
        api.json(M::POST, "/api/v1/admin/users", body)
    });
    one_record(&api, "cli: create user", "user.create", || add_user(&care, dir, "cu", "clinician", "cli-user-pass-1"));
    one_record(&api, "page: disable", "user.update", || page.post("/admin/users/pu", "action=disable"));
    one_record(&api, "api: disable", "user.update", || {
        api.json(M::PATCH, "/api/v1/admin/users/au", serde_json::json!({"disabled": true}))
    });
    one_record(&api, "cli: disable", "user.update", || {
        care.ok(&["user", "set", "cu", "--disable"]);
    });
    one_record(&api, "page: reset password", "user.password_change", || {
        page.post("/admin/users/pu", "action=reset_password&password=page-user-pass-2")
    });
    one_record(&api, "api: reset password", "user.password_change", || {
        api.json(M::PATCH, "/api/v1/admin/users/au", serde_json::json!({"password": "api-user-pass-2"}))
    });
    one_record(&api, "cli: reset password", "user.password_change", || {
        let f = write(&dir.join("cu2.pw"), "cli-user-pass-2");
        care.ok(&["user", "passwd", "cu", "--password-file", f.to_str().unwrap()]);
    });
    one_record(&api, "page: grant", "permission.grant", || {
        page.post("/admin/users/drwang/grants", "collection=p1&action=grant")
    });
    one_record(&api, "api: grant", "permission.grant", || {
        api.send(api.c.put(format!("{}/api/v1/admin/users/drwang/grants/a1", api.base)), "grant")
    });
    one_record(&api, "cli: grant", "permission.grant", || {
        care.ok(&["user", "grant", "drwang", "c1"]);
    });
    one_record(&api, "page: revoke", "permission.revoke", || {
        page.post("/admin/users/drwang/grants", "collection=c1&action=revoke")
    });
    one_record(&api, "api: revoke", "permission.revoke", || {
        api.send(api.c.delete(format!("{}/api/v1/admin/users/drwang/grants/a1", api.base)), "revoke")
    });
    one_record(&api, "cli: revoke", "permission.revoke", || {
        care.ok(&["user", "revoke", "drwang", "p1"]);
    });
    care.ok(&["user", "grant", "drwang", "p1"]);
    one_record(&api, "page: token", "token.create", || page.post("/admin/users/drwang/tokens", "name=fromform"));
    one_record(&api, "api: token", "token.create", || {
        api.json(M::POST, "/api/v1/admin/users/drwang/tokens", serde_json::json!({"name": "fromapi"}))
    });
    one_record(&api, "cli: token", "token.create", || {
        token(&care, "drwang", "fromcli");
    });
    one_record(&api, "page: revoke token", "token.revoke", || page.post("/admin/tokens/2/revoke", "x=1"));
    one_record(&api, "api: revoke token", "token.revoke", || {
        api.send(api.c.delete(format!("{}/api/v1/admin/tokens/3", api.base)), "revoke token")
    });

    // A clinician's judgement and own password.
    let clin = Page::sign_in(&served.https, "drwang", CLIN_PW);
    let url = format!("{}/api/v1/search?collection=p1&q=%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D", api.base);
    let hits: serde_json::Value = api.c.get(url).bearer_auth(&api.token).send().unwrap().json().unwrap();
    let chunk = hits["hits"][0]["chunk_id"].as_i64().expect("the uploaded document was ingested");
    one_record(&api, "page: feedback", "feedback", || {
        clin.post("/feedback", &format!("q=%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D&chunk={chunk}&helpful=1&back=/search"))
    });
    let clin_token = token(&care, "drwang", "judge");
    let clin_api = Api { c: care_e2e::https_client(), base: served.https.clone(), token: clin_token };
    one_record(&api, "api: feedback", "feedback", || {
        clin_api.json(
            M::POST,
            "/api/v1/feedback",
            serde_json::json!({"query": "二甲双胍", "chunk_id": chunk, "helpful": false}),
        )
    });
    // The clinician's feedback is in what the next retraining run would learn from, if its query falls in the
    // training part (else it is kept for evaluation only), once the collection is approved for training.
    api.json(M::PUT, "/api/v1/admin/collections/p1/approval", serde_json::json!({"approved": true}));
    let data = tempfile::tempdir().unwrap();
    let counts = care.json(&["train", "data", "--out", data.path().to_str().unwrap()]);
    let stage2 = std::fs::read_to_string(data.path().join("stage2.jsonl")).unwrap();
    let has = stage2.lines().any(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["query"] == "二甲双胍");
    let p1 = counts["collections"].as_array().unwrap().iter().find(|c| c["name"] == "p1").expect("p1 approved");
    let sets: serde_json::Value = api
        .c
        .get(format!("{}/api/v1/admin/judgments", api.base))
        .bearer_auth(&api.token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let fb = sets.as_array().unwrap().iter().find(|s| s["collection"] == "p1" && s["name"] == "feedback");
    let fb = fb.unwrap_or_else(|| panic!("the clinician's feedback is listed as a judgment set: {sets}"));
    if fb["train_queries"] == 1 {
        assert!(has && p1["train_queries"].as_i64() >= Some(1), "{counts} {stage2}");
    } else {
        assert!(!has && p1["eval_queries_left_out"].as_i64() >= Some(1), "{counts} {stage2}");
    }
    one_record(&api, "page: own password", "user.password_change", || {
        clin.post("/account/password", "current=clinician-passphrase-1&new=clinician-passphrase-2")
    });

    // Deleting a collection takes the lexical index's writer, which the running server holds: page and API now,
    // the CLI once the server has stopped.
    one_record(&api, "page: delete", "collection.delete", || page.post("/admin/collections/p1/delete", "confirm=p1"));
    one_record(&api, "api: delete", "collection.delete", || {
        api.send(api.c.delete(format!("{}/api/v1/admin/collections/a1", api.base)), "delete")
    });
    drop(served);
    let before = care.json(&["audit", "list", "--json", "-n", "1"])[0]["id"].as_i64().unwrap();
    care.ok(&["collection", "delete", "c1"]);
    let after = care.json(&["audit", "list", "--json", "-n", "5"]);
    let new: Vec<&str> = after
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["id"].as_i64().unwrap() > before)
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(new, vec!["collection.delete"], "cli: delete");
}
