//! What people see (issue 56): a crawler signs in to the demo as an administrator and as a clinician, and visits
//! every page the server's route table lists, the pages a visitor meets and the error pages, in headless Chromium.
//! A page fails on any word of Latin letters that a person reads on it (the rendered text, the title, buttons'
//! and fields' labels) outside an allow list of codes, names and units; on a missing heading, main landmark or
//! current-page mark in the navigation; and on a serious or critical violation of axe-core's accessibility rules. What people typed or imported (passages,
//! titles, file names, synonyms, the query) is marked `translate="no"` by the templates, and commands, paths and
//! settings are `<code>`: those are not the appliance's words.

use std::collections::BTreeSet;
use std::time::Duration;

use care_e2e::webdriver::Browser;
use care_e2e::{Care, add_user};
use care_server::table::{Access, Kind, ROUTES};
use serde_json::json;

const ADMIN: &str = "zhangwei";
const CLINICIAN: &str = "lina";
const PW: &str = "crawler-passphrase-1";
/// Pages that do not exist, named in Chinese: the error page echoes the address, which is the visitor's text.
const MISSING_PAGE: &str = "/%E6%B2%A1%E6%9C%89%E8%BF%99%E4%B8%80%E9%A1%B5";
/// The Latin letters the test itself types into a query (啊啊啊qwe): echoed in the page's title, they are the
/// clinician's words.
const TYPED: &str = "qwe";

/// Words of Latin letters a page may show: formats, standards and product names, units, and the test's own data
/// (user names, the demo collection). Anything else a person reads must be Chinese.
const ALLOWED: &[&str] = &[
    // the product, formats and protocols
    "CARE", "PDF", "DOCX", "HTML", "Markdown", "TXT", "CSV", "JSONL", "JSON", "ZIP", "TIFF", "PNG", "JPEG", "JPG",
    "BMP", "UTF", "GBK", "GB", "HTTPS", "HTTP", "TLS", "API", "URL", "LDAP", "OIDC", "AD", "ID", "IP", "SQLite",
    // models and methods (names)
    "BM25", "ONNX", "Runtime", "CUDA", "GPU", "CPU", "LoRA", "Stage", "I", "II", "CARE", "nDCG", "MRR", "Recall", "RRF",
    "int8", "fp32", "bf16", "Qwen", "e5", "small", "jieba", "zstd", "COPD", "BEIR", "qrels", "libtorch", "cuBLAS",
    "cuDNN", // directory sign-in terms an administrator configures by
    "AD", "DN", "CA", "PEM", "StartTLS", // units and times
    "ms", "MB", "GB", "KB", "TB", "MiB", "GiB", "KiB", "UTC", "HH", "MM", "mg",  // the hospital's systems
    "HIS", // machines
    "AMD", "EPYC", // the test's data
    "demo", "zhangwei", "lina", "admin",
];

/// The Latin-letter words a person reads on the current page: its text as rendered, its title, and the labels
/// of controls that are not text (placeholders, button values, alt and aria labels).
fn latin_words(b: &Browser) -> BTreeSet<String> {
    let text = b.execute(
        "for (const e of document.querySelectorAll('code, kbd, samp, pre, [translate=no]')) e.textContent = ' ';
         const parts = [document.title, document.body.innerText];
         for (const e of document.querySelectorAll('[placeholder],[aria-label],[alt],[title],input[type=submit],input[type=button]')) {
             for (const a of ['placeholder', 'aria-label', 'alt', 'title', 'value']) {
                 if (e.hasAttribute(a) && (a !== 'value' || e.type === 'submit' || e.type === 'button')) parts.push(e.getAttribute(a));
             }
         }
         return parts.join('\\n');",
        json!([]),
    );
    let text = text.as_str().unwrap_or_default().replace(TYPED, " ");
    let mut words = BTreeSet::new();
    // A token is a run of ASCII letters, digits and joiners; one with a digit is a code or a name (e5-small,
    // #12, 2026-11-30), one of letters only is a word.
    for token in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')) {
        if token.chars().any(|c| c.is_ascii_digit()) {
            continue;
        }
        for word in token.split(['-', '_', '.']).filter(|w| w.len() >= 2) {
            if !ALLOWED.contains(&word) {
                words.insert(word.to_string());
            }
        }
    }
    words
}

fn sign_in(b: &Browser, base: &str, user: &str) {
    b.goto(&format!("{base}/login"));
    b.type_into("#username", user);
    b.type_into("#password", PW);
    b.click("form[action='/login'] button[type=submit]");
    // Signing in says so, naming who.
    let said = format!("已登录：{user}");
    b.wait_for("signed in", Duration::from_secs(30), |s| s.contains("action=\"/logout\"") && s.contains(&said));
}

/// axe-core's source (tests/axe, installed by `packaging/dev.sh test`) and the call that runs it on the page and
/// hands back its serious and critical violations: the rule, how many elements, the first two of them.
static AXE_RUN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("axe/node_modules/axe-core/axe.min.js");
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (npm ci --prefix tests/axe, which `packaging/dev.sh test` runs)", path.display())
    });
    format!(
        "const done = arguments[arguments.length - 1];
         {source}
         axe.run(document, {{ resultTypes: ['violations'] }}).then(r => done(r.violations
             .filter(v => v.impact === 'serious' || v.impact === 'critical')
             .map(v => v.id + ' (' + v.impact + ', ' + v.nodes.length + '): '
                 + v.nodes.slice(0, 2).map(n => n.target.join(' ')).join(' | '))),
             e => done(['axe failed: ' + e]));"
    )
});

/// Visits `url` as `who` and returns what a person should not meet there: Latin words outside [`ALLOWED`], a page
/// without one heading and its main landmark, a navigation that does not mark the current page, and axe-core's
/// serious and critical violations. `CRAWL_DUMP=DIR` keeps each page's HTML.
fn findings(b: &Browser, who: &str, url: &str) -> Vec<String> {
    let mut found = Vec::new();
    b.goto(url);
    if let Some(d) = std::env::var_os("CRAWL_DUMP") {
        let name: String =
            format!("{who}{url}").chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        std::fs::write(std::path::Path::new(&d).join(name + ".html"), b.source()).unwrap();
    }
    // Every page has one heading of its own and its main landmark; a page the main navigation leads to (or lies
    // under) is marked there as the current one.
    let shape = b.execute(
        "const nav = [...document.querySelectorAll('nav[aria-label=\"主导航\"] a')];
         const under = nav.some(a => location.pathname === a.pathname || location.pathname.startsWith(a.pathname + '/'));
         return [document.querySelectorAll('h1').length, document.querySelectorAll('main').length,
                 !under || nav.some(a => a.getAttribute('aria-current') === 'page')];",
        json!([]),
    );
    if shape != json!([1, 1, true]) {
        found.push(format!("{who} {url}: [h1 elements, main elements, current page marked] = {shape}"));
    }
    // axe-core's rules (WCAG 2.x A and AA and its best practices): a serious or critical violation fails.
    let axe = b.execute_async(&AXE_RUN, json!([]));
    for v in axe.as_array().into_iter().flatten() {
        found.push(format!("{who} {url}: axe {v}"));
    }
    // Last: it blanks what is not the appliance's own text.
    let words = latin_words(b);
    if !words.is_empty() {
        found.push(format!("{who} {url}: {words:?}"));
    }
    found
}

/// The concrete URL of a page route, its parameters taken from the demo.
fn concrete(pattern: &str, doc: &str) -> String {
    pattern.replace("{id}", doc).replace("{name}", "demo")
}

#[test]
fn browser_every_page_reads_in_chinese_for_an_administrator_a_clinician_and_a_visitor() {
    assert!(
        care_e2e::webdriver::available(),
        "chromium and chromedriver are needed (Debian packages chromium, chromium-driver; `packaging/dev.sh setup` installs them)"
    );
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    care.ok(&["demo", "--no-serve"]);
    add_user(&care, t.path(), ADMIN, "admin", PW);
    add_user(&care, t.path(), CLINICIAN, "clinician", PW);
    care.ok(&["user", "grant", CLINICIAN, "demo"]);
    let served = care.serve_full();
    let base = served.https.clone();
    let b = Browser::start(1280, 900);

    let mut found: Vec<String> = Vec::new();
    let mut visit = |b: &Browser, who: &str, url: &str| found.extend(findings(b, who, url));

    // A visitor: the sign-in page, the embeddable search and a page that does not exist.
    for path in ["/login", "/embed", MISSING_PAGE] {
        visit(&b, "visitor", &format!("{base}{path}"));
    }
    for (user, admin) in [(ADMIN, true), (CLINICIAN, false)] {
        sign_in(&b, &base, user);
        // A document of the demo, from a search.
        b.goto(&format!("{base}/search?q=%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D"));
        let src = b.wait_for("results", Duration::from_secs(30), |s| s.contains("href=\"/doc/"));
        let doc = src.split("href=\"/doc/").nth(1).unwrap().split(['?', '"']).next().unwrap().to_string();
        // 来源 is the issuer (a facet and a filing field) and nothing else: a hit names its file as 文件.
        let sources = b.execute(
            "return [...document.querySelectorAll('ol.results .source')].map(e => e.textContent).join(' ');",
            json!([]),
        );
        let sources = sources.as_str().unwrap_or_default();
        assert!(sources.contains("文件：") && !sources.contains("来源："), "{sources:?}");
        let pages = ROUTES.iter().filter(|r| r.method == "GET" && r.kind == Kind::Page);
        for r in pages.filter(|r| match r.access {
            Access::User => true,
            Access::Admin => admin,
            Access::Public | Access::Backups => false,
        }) {
            visit(&b, user, &format!("{base}{}", concrete(r.pattern, &doc)));
        }
        if admin {
            // An action that cannot run is disabled and says why: training with no collection approved for it.
            b.goto(&format!("{base}/admin/training"));
            let src = b.source();
            let none = src.contains("批准用于训练的资料库：<strong>无</strong>");
            let start = b.execute(
                "const b = [...document.querySelectorAll('form[action=\"/admin/training/run\"] button')].pop();
                 const why = document.getElementById('train-why');
                 return [b.disabled, why ? why.textContent : ''];",
                json!([]),
            );
            if none {
                assert_eq!(start[0], json!(true), "开始训练 with nothing approved: {start}");
                assert!(start[1].as_str().unwrap_or_default().contains("还没有批准"), "{start}");
            }
            // Before this machine has run one, the page states the demo's measured time and the machine.
            let estimate = b.text("#estimate-none");
            assert!(estimate.contains("78 秒") && estimate.contains("2 核 AMD EPYC"), "{estimate}");
            // Approving a collection for training asks first.
            b.goto(&format!("{base}/admin/collections"));
            let asks = b.execute(
                "const f = document.querySelector('form[action=\"/admin/collections/demo/approve\"]');
                 return f ? f.getAttribute('data-confirm') : '';",
                json!([]),
            );
            assert!(asks.as_str().unwrap_or_default().contains("批准资料库 demo 用于训练？"), "{asks}");
            // An initial password the administrator types is held to the same strength as one people choose.
            b.goto(&format!("{base}/admin/users"));
            b.type_into("#nu", "wangfang");
            b.type_into("#np", "wangfang2024");
            b.click("form[action='/admin/users'] button[type=submit]");
            let src = b.wait_for("the refusal", Duration::from_secs(30), |s| s.contains("太容易被猜中"));
            assert!(!src.contains("id=\"user-wangfang\"") && !src.contains(">wangfang</td>"), "created: {src}");
        }
        // A blank query shows no empty counts ("共 篇 · 第 1 / 0 页，用时 毫秒").
        b.goto(&format!("{base}/search?q="));
        let text = b.execute("return document.querySelector('main').innerText;", json!([]));
        let text = text.as_str().unwrap_or_default();
        assert!(!text.contains("共 篇") && !text.contains("/ 0 页") && !text.contains("用时 毫秒"), "{text}");
        // What a search page shows besides hits: nothing found, a blank query, page 2.
        for path in
            ["/search?q=%E5%95%8A%E5%95%8A%E5%95%8Aqwe", "/search?q=", "/search?q=%E7%B3%96%E5%B0%BF%E7%97%85&page=2"]
        {
            visit(&b, user, &format!("{base}{path}"));
        }
        // Error pages, which keep the navigation: what does not exist, and an administrator's page to a clinician.
        let mut errors = vec!["/doc/999999", MISSING_PAGE, "/admin/collections/%E4%B8%8D%E5%AD%98%E5%9C%A8/documents"];
        if !admin {
            errors.push("/admin/users");
        }
        for path in errors {
            visit(&b, user, &format!("{base}{path}"));
            let shown = b.execute(
                "return [document.querySelector('p.error') !== null,
                         document.querySelector('nav[aria-label=\"主导航\"] a[href=\"/search\"]') !== null];",
                json!([]),
            );
            assert_eq!(shown, json!([true, true]), "{user} {path}: [error shown, navigation kept]");
        }
        b.goto(&format!("{base}/account"));
        b.click("form[action='/logout'] button[type=submit]");
        // Signing out says so.
        b.wait_for("signed out", Duration::from_secs(30), |s| {
            s.contains("id=\"username\"") && s.contains("您已退出登录")
        });
    }
    assert!(
        found.is_empty(),
        "Latin words a person reads, and pages missing their heading, landmark or current-page mark:\n{}",
        found.join("\n")
    );
}

/// The demo served, the clinician signed in in a browser window of `width` × `height`, on the results of 糖尿病.
fn clinician_searching(width: u32, height: u32) -> (tempfile::TempDir, Care, care_e2e::Served, Browser) {
    assert!(care_e2e::webdriver::available(), "chromium and chromedriver are needed");
    let t = tempfile::tempdir().unwrap();
    let care = Care::new(&t.path().join("data"));
    care.ok(&["demo", "--no-serve"]);
    add_user(&care, t.path(), CLINICIAN, "clinician", PW);
    care.ok(&["user", "grant", CLINICIAN, "demo"]);
    let served = care.serve_full();
    let b = Browser::start(width, height);
    sign_in(&b, &served.https, CLINICIAN);
    b.goto(&format!("{}/search?q=%E7%B3%96%E5%B0%BF%E7%97%85", served.https));
    b.wait_for("results", Duration::from_secs(30), |s| s.contains("class=\"results\""));
    (t, care, served, b)
}

/// On a phone (390 × 844) the first hit of a search with facets is above the fold: the facets fold away behind
/// one line until opened. The screenshot is kept.
#[test]
fn browser_on_a_phone_the_first_hit_is_above_the_fold() {
    let (_t, _care, _served, b) = clinician_searching(390, 844);
    let place = b.execute(
        "const hit = document.querySelector('ol.results li.hit').getBoundingClientRect();
         if (document.querySelector('details.facets-fold').open) return ['facets open', false];
         const facets = document.querySelector('.facets');
         return [hit.top, hit.top + 60 <= window.innerHeight, window.innerWidth, facets ? facets.getBoundingClientRect().height : 0];",
        json!([]),
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    b.screenshot(&dir.join("search-phone.png"));
    assert_eq!(
        place[1],
        json!(true),
        "the first hit's top and whether it shows, the width, the facets' height: {place}"
    );
}

/// The clinician's records of one kind in the audit log (`care audit list`), read beside the running server.
fn audit_count(care: &Care, action: &str) -> usize {
    let v = care.json(&["audit", "list", "--action", action, "--actor", CLINICIAN, "-n", "1000", "--json"]);
    v.as_array().map_or(0, |a| a.iter().filter(|r| r["action"] == action).count())
}

/// The clinician's records of `action`, once there is at least one (waiting up to 20 s).
fn recorded(care: &Care, action: &str) -> usize {
    let started = std::time::Instant::now();
    loop {
        let n = audit_count(care, action);
        if n > 0 {
            return n;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no {action} record");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// 有帮助 is recorded without the page reloading, so the search is neither run nor counted again.
#[test]
fn browser_feedback_is_recorded_without_running_the_search_again() {
    let (_t, care, _served, b) = clinician_searching(1280, 900);
    // Search records are committed in groups: wait for this one.
    let searches = recorded(&care, "search");
    b.execute("window.carePageMark = 1; return true", json!([]));
    b.click("ol.results li.hit form.feedback button[value='1']");
    b.wait_for("the thanks", Duration::from_secs(20), |s| s.contains("已记录，谢谢"));
    assert_eq!(b.execute("return window.carePageMark === 1", json!([])), json!(true), "the page was not reloaded");
    recorded(&care, "feedback");
    assert_eq!(audit_count(&care, "search"), searches, "the search was not run again");
}

/// Reloads `url` until its page holds `text` (a state the server reaches by itself); the page's source.
fn reload_until(b: &Browser, url: &str, text: &str, limit: Duration) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        b.goto(url);
        let src = b.source();
        if src.contains(text) {
            return src;
        }
        assert!(std::time::Instant::now() < deadline, "{url} never showed {text:?}:\n{src}");
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The crawler through the states of a training run (issue 56): the 训练 page and the jobs page while a run is
/// queued or running, the 训练 page when it is done (with the gate's decision and each phase's time) and when a
/// second run is cancelled, each held to what every page is. A real run of the demo's recipe, shortened to four
/// Stage II steps, by the trainer `packaging/dev.sh test` builds; skipped, saying so, without it (CARE_TRAIN_BIN).
#[test]
fn browser_the_training_page_reads_in_chinese_through_a_run_and_a_cancelled_one() {
    let Some(bin) = std::env::var_os("CARE_TRAIN_BIN") else {
        eprintln!("CARE_TRAIN_BIN not set (packaging/dev.sh test builds the trainer and sets it); skipping");
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let mut care = Care::new(&t.path().join("data"));
    care.use_trainer(&bin);
    care.ok(&["demo", "--no-serve"]);
    add_user(&care, t.path(), ADMIN, "admin", PW);
    care.ok(&["collection", "approve", "demo"]);
    let served = care.serve_full();
    let (base, b) = (served.https.clone(), Browser::start(1280, 900));
    sign_in(&b, &base, ADMIN);
    let training = format!("{base}/admin/training");
    let start_run = |steps: &str| {
        reload_until(&b, &training, "训练程序：<strong><code>", Duration::from_secs(120));
        b.type_into("#s2", steps);
        b.click("form[action='/admin/training/run'] button[type=submit]");
    };
    let mut found = Vec::new();
    start_run("4");
    let src = b.wait_for("the run", Duration::from_secs(60), |s| s.contains("排队中") || s.contains("进行中"));
    let job = src.split("id=\"run-").nth(1).unwrap().split('"').next().unwrap().to_string();
    found.extend(findings(&b, "admin", &training));
    found.extend(findings(&b, "admin", &format!("{base}/admin/jobs")));
    let card = |src: &str| {
        src.split(&format!("id=\"run-{job}\""))
            .nth(1)
            .unwrap_or("")
            .split("</section>")
            .next()
            .unwrap_or("")
            .to_string()
    };
    let done = reload_until(&b, &training, &format!("任务 #{job} · 完成"), Duration::from_secs(900));
    let done = card(&done);
    assert!(
        ["已上线", "通过评测", "未通过评测"].iter().any(|d| done.contains(d)) && done.contains("各阶段用时"),
        "{done}"
    );
    found.extend(findings(&b, "admin", &training));
    // A second run, cancelled while it waits or works.
    start_run("400");
    let src = b.wait_for("the second run", Duration::from_secs(60), |s| {
        s.split("id=\"run-").nth(1).is_some_and(|r| !r.starts_with(&format!("{job}\"")))
    });
    let second = src.split("id=\"run-").nth(1).unwrap().split('"').next().unwrap().to_string();
    b.click(&format!("form[action='/admin/jobs/{second}/cancel'] button[type=submit]"));
    reload_until(&b, &training, &format!("任务 #{second} · 已取消"), Duration::from_secs(120));
    found.extend(findings(&b, "admin", &training));
    assert!(found.is_empty(), "the training page through a run:\n{}", found.join("\n"));
}
