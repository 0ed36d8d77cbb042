//! Hospital sign-in against real servers the tests start: OpenLDAP's slapd (StartTLS, users and groups) and an
//! OpenID Connect provider (node-oidc-provider). Sign-in, group → role and group → grant mapping, the directory
//! disabling someone, a local account never taken over, and forged, expired or replayed answers refused.

use std::path::Path;
use std::time::Duration;

use care_e2e::directory::{OidcProvider, Person, SERVICE_DN, SERVICE_PASSWORD, Slapd, free_port};
use care_e2e::{Care, add_user, cookie_value, no_redirect_client, page_csrf, set_cookies, write};
use reqwest::blocking::Client;

const LOCAL_ADMIN_PASSWORD: &str = "break-glass-Lamp-73";

/// Signs in through the form: (status, session cookie, page).
fn sign_in(c: &Client, base: &str, user: &str, pw: &str) -> (u16, Option<String>, String) {
    let res = c.get(format!("{base}/login")).send().unwrap();
    let token = cookie_value(&set_cookies(res.headers()), "__Host-care_login_csrf").expect("login csrf cookie");
    let res = c
        .post(format!("{base}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("__Host-care_login_csrf={token}"))
        .body(format!("username={user}&password={pw}&csrf={token}"))
        .send()
        .unwrap();
    let status = res.status().as_u16();
    let session = cookie_value(&set_cookies(res.headers()), "__Host-care_session");
    (status, session, res.text().unwrap())
}

fn get(c: &Client, url: &str, session: &str) -> (u16, String) {
    let res = c.get(url).header("cookie", format!("__Host-care_session={session}")).send().unwrap();
    (res.status().as_u16(), res.text().unwrap())
}

/// (source, role, disabled, display name) of an account, read from the appliance's SQLite.
fn account(data: &Path, user: &str) -> Option<(String, String, bool, Option<String>)> {
    let db = rusqlite::Connection::open(data.join("care.sqlite")).unwrap();
    db.query_row("SELECT source, role, disabled, display_name FROM users WHERE username = ?1", [user], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0, r.get(3)?))
    })
    .ok()
}

/// (collection, granted_by) of a user's grants.
fn grants(data: &Path, user: &str) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(data.join("care.sqlite")).unwrap();
    let mut st = db
        .prepare(
            "SELECT c.name, g.granted_by FROM grants g JOIN collections c ON c.id = g.collection_id
             JOIN users u ON u.id = g.user_id WHERE u.username = ?1 ORDER BY c.name",
        )
        .unwrap();
    st.query_map([user], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
}

fn appliance(t: &Path, config: &str) -> Care {
    let mut care = Care::new(&t.join("data"));
    care.config = Some(write(&t.join("care.toml"), config));
    care.ok(&["init"]);
    for c in ["xinnei", "common"] {
        care.ok(&["collection", "create", c]);
    }
    add_user(&care, t, "admin", "admin", LOCAL_ADMIN_PASSWORD);
    care
}

#[test]
fn ldap_sign_in_maps_groups_follows_the_directory_and_never_takes_over_a_local_account() {
    assert!(
        care_e2e::directory::slapd_available(),
        "slapd and ldap-utils are missing: packaging/dev.sh installs them (Debian packages slapd, ldap-utils)"
    );
    let t = tempfile::tempdir().unwrap();
    let ldap = Slapd::start(
        t.path(),
        &[
            Person { uid: "dr.li", cn: "李医生", password: "li-directory-pass", groups: &["staff", "cardiology"] },
            Person {
                uid: "chief.zhao",
                cn: "赵主任",
                password: "zhao-directory-pass",
                groups: &["staff", "care-admins", "cardiology"],
            },
            Person { uid: "visitor.sun", cn: "孙访客", password: "sun-directory-pass", groups: &["visitors"] },
            // Same name as the appliance's local administrator: must never become that account.
            Person {
                uid: "admin", cn: "重名者", password: "admin-directory-pass", groups: &["staff", "care-admins"]
            },
        ],
    );
    let config = format!(
        "[ldap]\nurl = \"{}\"\nstarttls = true\nca_file = \"{}\"\nbind_dn = \"{SERVICE_DN}\"\n\
         bind_password = \"{SERVICE_PASSWORD}\"\nuser_base = \"ou=people,dc=hospital,dc=test\"\n\
         user_filter = \"(&(objectClass=inetOrgPerson)(uid={{username}})(!(employeeType=disabled)))\"\n\
         member_of_attribute = \"\"\ngroup_base = \"ou=groups,dc=hospital,dc=test\"\ngroup_filter = \"(member={{dn}})\"\n\
         [ldap.groups]\nadmin = [\"care-admins\"]\nclinician = [\"staff\"]\n\
         [ldap.groups.collections]\ncardiology = [\"xinnei\"]\n",
        ldap.url,
        ldap.ca_file.display()
    );
    let data = t.path().join("data");
    let care = appliance(t.path(), &config);
    // An administrator's own grant, which the directory's mapping must leave alone.
    let served = care.serve_full();
    let base = served.https.clone();
    let c = no_redirect_client(Duration::from_secs(60));

    // The sign-in page says directory accounts work here.
    let (_, page) = get(&c, &format!("{base}/login"), "");
    assert!(page.contains("directory-hint") && page.contains("医院目录"), "{page}");

    // A clinician: account created from the directory, role and grant from the groups.
    let (status, session, body) = sign_in(&c, &base, "dr.li", "li-directory-pass");
    assert_eq!(status, 303, "{body}");
    let li_session = session.expect("session cookie");
    assert_eq!(account(&data, "dr.li"), Some(("ldap".into(), "clinician".into(), false, Some("李医生".into()))));
    assert_eq!(grants(&data, "dr.li"), vec![("xinnei".to_string(), "directory".to_string())]);
    assert_eq!(get(&c, &format!("{base}/search"), &li_session).0, 200);
    assert_eq!(get(&c, &format!("{base}/admin/users"), &li_session).0, 403);
    // The wrong password is told like any wrong password.
    let (status, _, body) = sign_in(&c, &base, "dr.li", "not-the-password");
    assert_eq!(status, 401);
    assert!(body.contains("用户名或密码错误"), "{body}");
    // An empty password would be an "unauthenticated bind", which LDAP servers accept: it must prove nothing.
    let (status, ..) = sign_in(&c, &base, "dr.li", "");
    assert_ne!(status, 303);
    // A local password cannot be set for a directory account.
    let f = write(&t.path().join("li.pw"), "a-local-password-for-li-42");
    let out = care.run(&["user", "passwd", "dr.li", "--password-file", f.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("目录"), "{out:?}");

    // An administrator by group.
    let (status, session, _) = sign_in(&c, &base, "chief.zhao", "zhao-directory-pass");
    assert_eq!(status, 303);
    assert_eq!(account(&data, "chief.zhao").unwrap().1, "admin");
    let (status, users) = get(&c, &format!("{base}/admin/users"), &session.unwrap());
    assert_eq!(status, 200);
    assert!(users.contains("dr.li") && users.contains("目录账户"), "{users}");

    // Someone in no mapped group: refused with the reason, no account made.
    let (status, _, body) = sign_in(&c, &base, "visitor.sun", "sun-directory-pass");
    assert_eq!(status, 401);
    assert!(body.contains("不在允许使用本系统的组中"), "{body}");
    assert_eq!(account(&data, "visitor.sun"), None);

    // The directory's "admin" cannot take over the local administrator; the local password still works.
    let (status, _, body) = sign_in(&c, &base, "admin", "admin-directory-pass");
    assert_eq!(status, 401, "{body}");
    let (status, ..) = sign_in(&c, &base, "admin", LOCAL_ADMIN_PASSWORD);
    assert_eq!(status, 303);
    assert_eq!(account(&data, "admin").unwrap().0, "local");

    // An administrator grants dr.li a collection by hand; then the directory moves dr.li out of cardiology.
    care.ok(&["user", "grant", "dr.li", "common"]);
    ldap.modify(
        "dn: cn=cardiology,ou=groups,dc=hospital,dc=test\nchangetype: modify\ndelete: member\n\
         member: uid=dr.li,ou=people,dc=hospital,dc=test\n",
    );
    let (status, ..) = sign_in(&c, &base, "dr.li", "li-directory-pass");
    assert_eq!(status, 303);
    let g = grants(&data, "dr.li");
    assert_eq!(g.len(), 1, "{g:?}");
    assert!(g[0].0 == "common" && g[0].1 != "directory", "the hand grant stays, the directory's went: {g:?}");

    // The directory disables dr.li: the next sign-in is refused, the account disabled here, its sessions ended.
    ldap.modify(
        "dn: uid=dr.li,ou=people,dc=hospital,dc=test\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n",
    );
    let (status, ..) = sign_in(&c, &base, "dr.li", "li-directory-pass");
    assert_eq!(status, 401);
    assert!(account(&data, "dr.li").unwrap().2, "disabled here too");
    assert_ne!(get(&c, &format!("{base}/search"), &li_session).0, 200, "the earlier session ended");

    // The directory disables chief.zhao: the sweep (every six hours in the service; here by hand) disables the
    // account and ends its sign-in without waiting for an attempt.
    let (_, zhao_session, _) = sign_in(&c, &base, "chief.zhao", "zhao-directory-pass");
    let zhao_session = zhao_session.expect("signed in");
    assert_eq!(get(&c, &format!("{base}/admin/users"), &zhao_session).0, 200);
    ldap.modify(
        "dn: uid=chief.zhao,ou=people,dc=hospital,dc=test\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n",
    );
    let out = care.ok(&["user", "sync-directory"]);
    assert!(out.contains("已停用") && out.contains("chief.zhao") && !out.contains("dr.li"), "{out}");
    assert!(account(&data, "chief.zhao").unwrap().2);
    assert_ne!(get(&c, &format!("{base}/admin/users"), &zhao_session).0, 200, "its sign-in ended");

    // The directory down: a clear Chinese message, and the local administrator still gets in.
    drop(ldap);
    let (status, _, body) = sign_in(&c, &base, "chief.zhao", "zhao-directory-pass");
    assert_eq!(status, 503);
    assert!(body.contains("统一认证服务暂不可用") && body.contains("本地管理员账户仍可登录"), "{body}");
    let (status, ..) = sign_in(&c, &base, "admin", LOCAL_ADMIN_PASSWORD);
    assert_eq!(status, 303);

    // Every step is in the audit log.
    let log = care.ok(&["audit", "list", "--limit", "200"]);
    for action in ["user.directory_sync", "user.directory_disable", "auth.login_failed"] {
        assert!(log.contains(action), "{action} missing from the audit log");
    }
}

/// Posts the settings page's sign-in form: (status, where it went back to, decoded).
fn save_sign_in(c: &Client, base: &str, session: &str, fields: &[(&str, &str)]) -> (u16, String) {
    let (_, page) = get(c, &format!("{base}/admin/settings"), session);
    let mut form: Vec<(&str, String)> = fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
    form.push(("csrf", page_csrf(&page)));
    let res = c
        .post(format!("{base}/admin/settings/sign-in"))
        .header("cookie", format!("__Host-care_session={session}"))
        .form(&form)
        .send()
        .unwrap();
    let to = res.headers().get("location").map(|l| l.to_str().unwrap().to_string()).unwrap_or_default();
    // The flash or error it carries, decoded.
    let url = reqwest::Url::parse(&format!("https://appliance{to}")).unwrap();
    let said: Vec<String> = url.query_pairs().map(|(k, v)| format!("{k}={v}")).collect();
    (res.status().as_u16(), said.join("&"))
}

/// Issue 36: the hospital sign-in set on the console's settings page, over LDAPS, with no `[ldap]` in care.toml.
/// A section that cannot work (a wrong service password, plain LDAP) is refused in Chinese and nothing is stored;
/// a working one applies to the next sign-in without a restart; the secret is never shown back and survives a
/// save that leaves it empty; clearing it returns to care.toml's (none: directory sign-in is off again).
#[test]
fn ldaps_sign_in_set_on_the_settings_page_applies_without_a_restart() {
    assert!(care_e2e::directory::slapd_available(), "slapd and ldap-utils are missing: packaging/dev.sh installs them");
    let t = tempfile::tempdir().unwrap();
    let ldap = Slapd::start(
        t.path(),
        &[Person { uid: "nurse.wu", cn: "吴护士", password: "wu-directory-pass", groups: &["nursing"] }],
    );
    let data = t.path().join("data");
    let care = appliance(t.path(), "");
    let served = care.serve_full();
    let base = served.https.clone();
    let c = no_redirect_client(Duration::from_secs(60));
    let (status, admin, _) = sign_in(&c, &base, "admin", LOCAL_ADMIN_PASSWORD);
    assert_eq!(status, 303);
    let admin = admin.unwrap();
    let (_, page) = get(&c, &format!("{base}/login"), "");
    assert!(!page.contains("directory-hint"), "no directory configured yet");
    assert_eq!(sign_in(&c, &base, "nurse.wu", "wu-directory-pass").0, 401);

    let ca = ldap.ca_file.display().to_string();
    let section = |url: &str, password: &str| -> Vec<(&str, String)> {
        vec![
            ("protocol", "ldap".into()),
            ("url", url.into()),
            ("ca_file", ca.clone()),
            ("bind_dn", SERVICE_DN.into()),
            ("bind_password", password.into()),
            ("user_base", "ou=people,dc=hospital,dc=test".into()),
            ("user_filter", "(&(objectClass=inetOrgPerson)(uid={username}))".into()),
            ("name_attribute", "uid".into()),
            ("display_attribute", "cn".into()),
            ("member_of_attribute", "".into()),
            ("group_base", "ou=groups,dc=hospital,dc=test".into()),
            ("group_filter", "(member={dn})".into()),
            ("timeout_seconds", "10".into()),
            ("groups.clinician", "nursing".into()),
            ("groups.collections", "cn=nursing,ou=groups,dc=hospital,dc=test = common".into()),
        ]
    };
    let post = |fields: Vec<(&str, String)>| {
        let f: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        save_sign_in(&c, &base, &admin, &f)
    };
    // Refused: the wrong service password (the server answers, the bind fails), and plain LDAP.
    let (status, to) = post(section(&ldap.ldaps_url, "not-the-service-password"));
    assert_eq!(status, 303);
    assert!(to.contains("error=") && to.contains("未保存") && to.contains("服务账户"), "{to}");
    let plain = ldap.url.clone();
    let (_, to) = post(section(&plain, SERVICE_PASSWORD));
    assert!(to.contains("未加密"), "StartTLS left off on ldap:// is refused: {to}");
    let stored = |p: &str| -> i64 {
        let db = rusqlite::Connection::open(data.join("care.sqlite")).unwrap();
        db.query_row("SELECT count(*) FROM sign_in_config WHERE protocol = ?1", [p], |r| r.get(0)).unwrap()
    };
    assert_eq!(stored("ldap"), 0, "nothing stored from a refused form");

    // Saved over LDAPS: the next sign-in uses it, no restart.
    let (_, to) = post(section(&ldap.ldaps_url, SERVICE_PASSWORD));
    assert!(to.contains("flash=") && to.contains("已保存"), "{to}");
    assert_eq!(stored("ldap"), 1);
    let (_, page) = get(&c, &format!("{base}/admin/settings"), &admin);
    assert!(page.contains(&ldap.ldaps_url) && page.contains("已开启"), "the page shows the section in force");
    assert!(!page.contains(SERVICE_PASSWORD) && page.contains("已设置（不显示）"), "the secret is never shown back");
    let (status, session, body) = sign_in(&c, &base, "nurse.wu", "wu-directory-pass");
    assert_eq!(status, 303, "{body}");
    assert_eq!(account(&data, "nurse.wu").unwrap().0, "ldap");
    assert_eq!(grants(&data, "nurse.wu"), vec![("common".to_string(), "directory".to_string())]);
    assert_eq!(get(&c, &format!("{base}/search"), &session.unwrap()).0, 200);

    // A save that leaves the secret empty keeps it (the sign-in still binds as the service account).
    let (_, to) = post(section(&ldap.ldaps_url, ""));
    assert!(to.contains("已保存"), "{to}");
    assert_eq!(sign_in(&c, &base, "nurse.wu", "wu-directory-pass").0, 303);

    // Cleared: care.toml has no [ldap], so directory sign-in is off again.
    let (_, to) = save_sign_in(&c, &base, &admin, &[("protocol", "ldap"), ("clear", "1")]);
    assert!(to.contains("恢复为配置文件"), "{to}");
    assert_eq!(stored("ldap"), 0);
    assert_eq!(sign_in(&c, &base, "nurse.wu", "wu-directory-pass").0, 401);

    // Every save and the clearing are audited, with the names of the fields changed and no secret.
    let log = care.ok(&["audit", "list", "--action", "settings.sign_in", "--limit", "20"]);
    assert!(log.matches("settings.sign_in").count() >= 3 && log.contains("bind_password"), "{log}");
    assert!(!log.contains(SERVICE_PASSWORD), "{log}");
}

fn oidc_config(issuer: &str, redirect: &str) -> String {
    format!(
        "[oidc]\nissuer = \"{issuer}\"\nclient_id = \"care\"\nclient_secret = \"care-client-secret\"\n\
         redirect_url = \"{redirect}\"\n[oidc.groups]\nadmin = [\"care-admins\"]\nclinician = [\"staff\"]\n\
         [oidc.groups.collections]\ncardiology = [\"xinnei\"]\n"
    )
}

/// A browser-like client: cookies kept, redirects followed up to the appliance's callback (which it stops at, so
/// the test can replay the callback elsewhere).
fn browser() -> Client {
    Client::builder()
        .cookie_store(true)
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::custom(|a| {
            if a.url().path() == "/login/oidc/callback" || a.previous().len() > 10 { a.stop() } else { a.follow() }
        }))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Starts a sign-in at the appliance and logs `who` in at the provider; returns the callback URL the provider
/// sends the browser back to.
fn provider_login(b: &Client, base: &str, issuer: &str, who: &str) -> String {
    let res = b.get(format!("{base}/login/oidc?next=%2Fsearch")).send().unwrap();
    assert_eq!(res.status(), 200, "the provider's login page");
    let uid = res.url().path().trim_start_matches("/interaction/").to_string();
    let res = b
        .post(format!("{issuer}/interaction/{uid}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("login={who}"))
        .send()
        .unwrap();
    assert!(res.status().is_redirection(), "{}", res.status());
    let loc = res.headers()["location"].to_str().unwrap().to_string();
    assert!(loc.contains("/login/oidc/callback?") && loc.contains("code="), "{loc}");
    loc
}

#[test]
fn oidc_sign_in_with_pkce_maps_claims_and_refuses_forged_expired_or_replayed_answers() {
    assert!(
        care_e2e::directory::oidc_available(),
        "the OIDC provider is missing: packaging/dev.sh runs `npm ci` in tests/oidc (Node.js from Debian)"
    );
    let t = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("https://127.0.0.1:{port}");
    let redirect = format!("{base}/login/oidc/callback");
    let idp = OidcProvider::start("care", "care-client-secret", &redirect);
    let data = t.path().join("data");
    let care = appliance(t.path(), &oidc_config(&idp.issuer, &redirect));
    let _served = care.serve_at(&format!("127.0.0.1:{port}"));

    // The sign-in page offers the hospital's sign-on beside the local form.
    let b = browser();
    let page = b.get(format!("{base}/login")).send().unwrap().text().unwrap();
    assert!(page.contains("id=\"oidc-sign-in\"") && page.contains("统一身份认证登录"), "{page}");

    // The whole flow: appliance → provider (PKCE) → callback → signed in, with role and grant from the groups.
    let callback = provider_login(&b, &base, &idp.issuer, "dr.li");
    assert!(!callback.contains("code_verifier"));
    // The callback in another browser (no state cookie): refused, and nobody is signed in.
    let other = browser();
    let res = other.get(&callback).send().unwrap();
    assert_eq!(res.status(), 401);
    assert!(res.text().unwrap().contains("不是从本浏览器发起的"));
    // In the browser that started it: signed in.
    let res = b.get(&callback).send().unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.text().unwrap().contains("已登录"));
    let res = b.get(format!("{base}/search")).send().unwrap();
    assert_eq!((res.status().as_u16(), res.url().path().to_string()), (200, "/search".to_string()));
    assert_eq!(account(&data, "dr.li"), Some(("oidc".into(), "clinician".into(), false, Some("李医生".into()))));
    assert_eq!(grants(&data, "dr.li"), vec![("xinnei".to_string(), "directory".to_string())]);
    // Replaying the same callback (code and state used once) signs no one in.
    let res = b.get(&callback).send().unwrap();
    assert_eq!(res.status(), 401);

    // An administrator by group; someone in no mapped group refused; the local "admin" never taken over.
    let b2 = browser();
    let res = b2.get(provider_login(&b2, &base, &idp.issuer, "chief.zhao")).send().unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(b2.get(format!("{base}/admin/users")).send().unwrap().status(), 200);
    let b3 = browser();
    let res = b3.get(provider_login(&b3, &base, &idp.issuer, "visitor.sun")).send().unwrap();
    assert_eq!(res.status(), 401);
    assert!(res.text().unwrap().contains("不在允许使用本系统的组中"));
    let b4 = browser();
    let res = b4.get(provider_login(&b4, &base, &idp.issuer, "admin")).send().unwrap();
    assert_eq!(res.status(), 401);
    assert!(res.text().unwrap().contains("本地账户"));
    assert_eq!(account(&data, "admin").unwrap().0, "local");

    // The administrator changes the section on the settings page (the provider's discovery answers, so it is
    // saved); the next visitor's sign-in page has the new button, and the flow still signs people in.
    let page = b2.get(format!("{base}/admin/settings")).send().unwrap().text().unwrap();
    assert!(page.contains(&idp.issuer) && !page.contains("care-client-secret"), "in force, secret not shown");
    let csrf = page_csrf(&page);
    let form = [
        ("protocol", "oidc"),
        ("csrf", csrf.as_str()),
        ("issuer", idp.issuer.as_str()),
        ("client_id", "care"),
        ("client_secret", ""),
        ("redirect_url", redirect.as_str()),
        ("scopes", "profile\nemail\ngroups"),
        ("username_claim", "preferred_username"),
        ("display_claim", "name"),
        ("groups_claim", "groups"),
        ("button_label", "院内统一登录"),
        ("groups.admin", "care-admins"),
        ("groups.clinician", "staff"),
        ("groups.collections", "cardiology = xinnei"),
    ];
    let res = b2.post(format!("{base}/admin/settings/sign-in")).form(&form).send().unwrap();
    assert_eq!(res.status(), 200, "followed back to the settings page");
    assert!(res.text().unwrap().contains("已保存"));
    let b5 = browser();
    let page = b5.get(format!("{base}/login")).send().unwrap().text().unwrap();
    assert!(page.contains("院内统一登录") && !page.contains("统一身份认证登录"), "{page}");
    let res = b5.get(provider_login(&b5, &base, &idp.issuer, "dr.li")).send().unwrap();
    assert_eq!(res.status(), 200, "the kept client secret still redeems the code");
    drop(_served);

    // ID tokens checked against the provider's published keys, in process: genuine passes; expired, another
    // nonce, another audience, an altered payload and an unsigned token are refused.
    let mut cfg = care_engine::EngineConfig::default();
    cfg.storage.data_dir = t.path().join("verify");
    cfg.oidc.issuer = idp.issuer.clone();
    cfg.oidc.client_id = "care".into();
    cfg.oidc.client_secret = "care-client-secret".into();
    cfg.oidc.redirect_url = redirect.clone();
    let engine = care_engine::Engine::open(cfg, care_engine::OpenMode::Create).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let claims = |exp: i64, aud: &str, nonce: &str| {
        serde_json::json!({"iss": idp.issuer, "aud": aud, "sub": "dr.li", "iat": now - 10, "exp": exp,
            "nonce": nonce, "preferred_username": "dr.li", "groups": ["staff"]})
    };
    let genuine = idp.sign(&claims(now + 300, "care", "n-1"));
    let who = engine.accounts().oidc_verify(&genuine, "n-1").expect("a genuine token passes");
    assert_eq!((who.username.as_str(), who.groups.as_slice()), ("dr.li", &["staff".to_string()][..]));
    let refused = |jwt: &str, nonce: &str| {
        let e = engine.accounts().oidc_verify(jwt, nonce).expect_err("refused");
        assert_eq!(e.code(), care_engine::ErrorCode::Unauthenticated, "{e}");
        assert!(e.to_string().contains("未通过校验"), "{e}");
    };
    refused(&idp.sign(&claims(now - 600, "care", "n-1")), "n-1");
    refused(&genuine, "another-nonce");
    refused(&idp.sign(&claims(now + 300, "someone-else", "n-1")), "n-1");
    // Forged: the payload of another person under the genuine signature.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = genuine.split('.').collect();
    let mut forged_claims = claims(now + 300, "care", "n-1");
    forged_claims["preferred_username"] = "admin".into();
    forged_claims["groups"] = serde_json::json!(["care-admins"]);
    let forged = format!("{}.{}.{}", parts[0], b64.encode(forged_claims.to_string()), parts[2]);
    refused(&forged, "n-1");
    let unsigned = format!("{}.{}.", b64.encode(r#"{"alg":"none"}"#), parts[1]);
    refused(&unsigned, "n-1");
}
