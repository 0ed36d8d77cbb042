//! The search page a clinician acts on, in real headless Chromium against `care serve` on the demo: the not-found
//! statement, the 仅语义相近 mark, traditional characters, grouped results and page N of a long query.

use std::time::Duration;

use care_e2e::webdriver::Browser;
use care_e2e::{Care, write};

const ADMIN_PW: &str = "search-page-admin-passphrase";

/// The demo, served, with a signed-in browser.
fn demo_browser(dir: &std::path::Path) -> (Care, care_e2e::Served, Browser) {
    let care = Care::new(&dir.join("data"));
    let out = care.run(&["demo", "--no-serve"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pwf = write(&dir.join("admin.pw"), &format!("{ADMIN_PW}\n"));
    care.ok(&["user", "add", "doctor", "--role", "admin", "--password-file", pwf.to_str().unwrap(), "--permanent"]);
    let served = care.serve_full();
    let b = Browser::start(1280, 900);
    b.goto(&format!("{}/login", served.https));
    b.type_into("#username", "doctor");
    b.type_into("#password", ADMIN_PW);
    b.click("form[action='/login'] button[type=submit]");
    b.wait_for("the search page", Duration::from_secs(30), |s| s.contains("id=\"q\""));
    (care, served, b)
}

/// (document id, chunk id) of every hit on the page, in order.
fn hits(src: &str) -> Vec<(String, String)> {
    src.split("<h2><a href=\"/doc/")
        .skip(1)
        .filter_map(|s| {
            let end = s.find('"')?;
            let (doc, chunk) = s[..end].split_once("#c")?;
            // The link carries the query (?q=…) so the document view marks its terms.
            Some((doc.split('?').next()?.to_string(), chunk.to_string()))
        })
        .collect()
}

fn search(b: &Browser, base: &str, q: &str, page: usize) -> String {
    let enc: String = q.bytes().map(|c| format!("%{c:02X}")).collect();
    b.goto(&format!("{base}/search?q={enc}&page={page}"));
    // The first query loads the encoder: slow in a debug build on 2 shared cores.
    b.wait_for("results", Duration::from_secs(120), |s| s.contains("id=\"result-meta\""))
}

#[test]
fn the_search_page_says_what_matched_what_did_not_and_pages_one_ranking() {
    if !care_e2e::webdriver::available() {
        panic!("chromium and chromedriver are required (packaging/dev.sh setup installs them)");
    }
    let t = tempfile::tempdir().unwrap();
    let (_care, served, b) = demo_browser(t.path());
    let base = served.https.clone();

    // A term no readable document holds: stated first, and no result claims it.
    let src = search(&b, &base, "替格瑞洛的禁忌症", 1);
    let banner = b.text("#missing-terms");
    assert!(banner.contains("未找到包含“替格瑞洛”的资料"), "{banner}");
    assert!(src.find("id=\"missing-terms\"").unwrap() < src.find("class=\"results\"").unwrap_or(usize::MAX));
    assert!(!b.text("ol.results").contains("包含：替格瑞洛"));
    assert!(b.text("ol.results").contains("包含：禁忌症"), "{src}");
    // The total counts what answers: summed over every page, the hits that hold a term found (the others are
    // folded under 仅语义相近 and counted apart).
    let total: usize = b.text("#total").trim().parse().unwrap();
    let last: usize = {
        let meta = b.text("#result-meta");
        meta.split(" / ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().parse().unwrap()
    };
    let mut answering = 0;
    for n in 1..=last {
        let src = search(&b, &base, "替格瑞洛的禁忌症", n);
        answering += hits(src.split("id=\"weak-hits\"").next().unwrap()).len();
    }
    assert_eq!(total, answering, "共 {total} 篇 against {answering} answering hits over {last} pages");
    assert!(b.text("#near-total").trim().parse::<usize>().unwrap() > 0);
    let src = search(&b, &base, "啊啊啊qwe", 1);
    assert_eq!(b.text("#total").trim(), "0", "{src}");

    // Gibberish: a not-found page with suggestions; the dense leg's neighbours are folded and marked.
    let src = search(&b, &base, "qwzxv 喵喵 嗷嗷嗷 zzkkq", 1);
    assert!(b.text("#not-found").contains("未找到包含"), "{src}");
    assert!(b.text("#not-found").contains("错别字"), "suggestions: {src}");
    assert!(
        src.contains("id=\"weak-hits\"") && !src.contains("<details class=\"weak\" id=\"weak-hits\" open"),
        "{src}"
    );
    assert!(src.contains("仅语义相近"), "dense-only hits are marked: {src}");
    assert!(!b.find_all("#weak-hits li.hit").is_empty());

    // Traditional characters: folded, searched and highlighted in the simplified passage.
    let src = search(&b, &base, "高血壓", 1);
    assert!(b.text("#folded").contains("已按简体检索：高血压"), "{src}");
    assert!(src.contains("<mark>高血压</mark>"), "{src}");
    assert!(!src.contains("id=\"missing-terms\""), "{src}");

    // Grouped results: one per document, the rest counted, and page N continues the same ranking.
    let src = search(&b, &base, "高血压患者可以吃布洛芬吗", 1);
    let meta = b.text("#result-meta");
    assert!(meta.contains("共") && meta.contains("第 1 /"), "{meta}");
    let first = hits(&src);
    let docs: std::collections::HashSet<&String> = first.iter().map(|h| &h.0).collect();
    assert_eq!(docs.len(), first.len(), "one hit per document: {first:?}");
    assert!(src.contains("该文档另有"), "passages of the same document are counted: {src}");
    let second = hits(&search(&b, &base, "高血压患者可以吃布洛芬吗", 2));
    assert!(!second.is_empty(), "a second page");
    assert!(second.iter().all(|h| !docs.contains(&h.0)), "page 2 repeats a document of page 1: {second:?}");
    assert!(b.text("#result-meta").contains("第 2 /"));

    // Pinyin initials: gxy is read as 高血压, said so, and the passages are highlighted.
    let src = search(&b, &base, "gxy", 1);
    assert!(b.text("#pinyin").contains("“gxy”已按拼音检索：高血压"), "{src}");
    assert!(src.contains("<mark>高血压</mark>"), "{src}");
    assert!(!src.contains("id=\"not-found\""), "{src}");

    // An abbreviation no demo document writes: found through the synonym table, which the page names, and the
    // synonym is highlighted.
    let src = search(&b, &base, "COPD", 1);
    assert!(b.text("#expansions").contains("慢性阻塞性肺疾病"), "{src}");
    assert!(src.contains("<mark>慢性阻塞性肺疾病</mark>") || src.contains("<mark>慢阻肺</mark>"), "{src}");
    assert!(!src.contains("id=\"missing-terms\"") && !src.contains("id=\"not-found\""), "{src}");
    // The evidence names the word the passage holds, and what it stands for.
    let results = b.text("ol.results");
    assert!(results.contains("慢性阻塞性肺疾病（COPD）") || results.contains("慢阻肺（COPD）"), "{results}");
    assert!(!results.contains("包含：COPD") && !results.contains("包含：copd"), "{results}");
}

/// The console's synonym page: add a group, see it used by the next search, delete it (after confirming).
#[test]
fn admins_edit_the_synonym_table_and_the_next_search_uses_it() {
    if !care_e2e::webdriver::available() {
        panic!("chromium and chromedriver are required (packaging/dev.sh setup installs them)");
    }
    let t = tempfile::tempdir().unwrap();
    let (_care, served, b) = demo_browser(t.path());
    let base = served.https.clone();
    let src = search(&b, &base, "降糖一线药X", 1);
    assert!(!src.contains("id=\"expansions\""), "not a table term yet: {src}");
    b.goto(&format!("{base}/admin/synonyms?q=%E4%BA%8C%E7%94%B2%E5%8F%8C%E8%83%8D"));
    b.wait_for("synonym page", Duration::from_secs(30), |s| s.contains("id=\"synonyms\""));
    b.type_into("#add-synonym input[name=preferred]", "降糖首选药X");
    b.type_into("#add-synonym input[name=variants]", "盐酸二甲双胍片X|降糖一线药X");
    b.click("#add-synonym button[type=submit]");
    let page = b.wait_for("saved", Duration::from_secs(30), |s| s.contains("已新增"));
    assert!(page.contains("降糖一线药X"), "{page}");
    let src = search(&b, &base, "降糖一线药X", 1);
    assert!(b.text("#expansions").contains("降糖首选药X"), "{src}");
}

/// What each hit on the page is filed under ("心内科 · 指南 · 2023-05").
fn filed(src: &str) -> Vec<String> {
    src.split("<span class=\"filed\">").skip(1).filter_map(|s| Some(s[..s.find('<')?].to_string())).collect()
}

/// Facets, filters and date order on the demo (its articles are filed under departments, types and dates): each
/// click keeps the state in the URL, so a reloaded or shared link shows the same page.
#[test]
fn facets_filter_by_department_type_and_date_and_the_url_keeps_the_state() {
    if !care_e2e::webdriver::available() {
        panic!("chromium and chromedriver are required (packaging/dev.sh setup installs them)");
    }
    let t = tempfile::tempdir().unwrap();
    let (_care, served, b) = demo_browser(t.path());
    let base = served.https.clone();
    let src = search(&b, &base, "高血压", 1);
    assert!(b.text("#facet-department").contains("心内科"), "{src}");
    assert!(b.text("#facet-type").contains("指南") && b.text("#facet-year").contains("20"), "{src}");
    // The demo's issuer is given, its language read from the text.
    assert!(b.text("#facet-issuer").contains("本项目编写") && b.text("#facet-language").contains("中文"), "{src}");
    let unfiltered = filed(&src);
    assert!(unfiltered.iter().any(|f| !f.starts_with("心内科")), "other departments before filtering: {unfiltered:?}");

    // A department: every hit is filed under it, the value is marked picked, the total says filtered.
    b.click("#facet-department a[data-value='心内科']");
    let src = b.wait_for("the filtered page", Duration::from_secs(60), |s| s.contains("（已筛选）"));
    assert!(b.url().contains("department=%E5%BF%83%E5%86%85%E7%A7%91"), "{}", b.url());
    let f = filed(&src);
    assert!(!f.is_empty() && f.iter().all(|x| x.starts_with("心内科")), "{f:?}");
    assert!(src.contains("data-value=\"心内科\" class=\"selected\""), "{src}");
    // The other departments are still offered, with their counts.
    assert!(b.find_all("#facet-department a").len() > 1, "{src}");

    // And a type: both filters hold.
    b.click("#facet-type a[data-value='药品说明书']");
    let src = b.wait_for("two filters", Duration::from_secs(60), |s| {
        s.contains("data-value=\"药品说明书\" class=\"selected\"")
    });
    let f = filed(&src);
    assert!(!f.is_empty() && f.iter().all(|x| x.starts_with("心内科 · 药品说明书")), "{f:?}");

    // Newest first.
    b.click("#sort-toggle");
    let src = b.wait_for("date order", Duration::from_secs(60), |s| s.contains("日期（最新在前）"));
    assert!(b.url().contains("sort=date"), "{}", b.url());
    // Within the hits that contain the query's words (those that only resemble it stay folded below, in the same
    // order).
    let strong = src.split("id=\"weak-hits\"").next().unwrap();
    let dates: Vec<String> = filed(strong).iter().map(|x| x.split(" · ").nth(2).unwrap().to_string()).collect();
    assert!(dates.len() > 1 && dates.windows(2).all(|w| w[0] >= w[1]), "{dates:?}");

    // A date range typed into the form keeps the other filters and the order.
    b.type_into("#from", "2021");
    b.type_into("#to", "2022");
    b.click("#date-filter button[type=submit]");
    let src = b.wait_for("the date range", Duration::from_secs(60), |s| s.contains("name=\"from\" value=\"2021\""));
    let url = b.url();
    assert!(url.contains("from=2021") && url.contains("to=2022") && url.contains("sort=date"), "{url}");
    let f = filed(&src);
    assert!(!f.is_empty(), "{src}");
    for x in &f {
        let date = x.split(" · ").nth(2).unwrap();
        assert!(x.starts_with("心内科 · 药品说明书") && ("2021".."2023").contains(&date), "{x}");
    }

    // The URL is the state: opened again, the same page.
    b.goto(&url);
    let again = b.wait_for("the same page", Duration::from_secs(60), |s| s.contains("id=\"result-meta\""));
    assert_eq!(filed(&again), f);

    // Clearing drops every filter but keeps the query.
    b.click("#clear-filters");
    let src =
        b.wait_for("unfiltered", Duration::from_secs(60), |s| !s.contains("（已筛选）") && s.contains("result-meta"));
    assert!(!b.url().contains("department=") && b.url().contains("q="), "{}", b.url());
    assert!(filed(&src).iter().any(|f| !f.starts_with("心内科")));

    // A date nobody can read: a Chinese error, not a crash.
    b.goto(&format!("{base}/search?q=%E9%AB%98%E8%A1%80%E5%8E%8B&from=last-year"));
    let src = b.wait_for("the error", Duration::from_secs(60), |s| s.contains("class=\"error\""));
    assert!(b.text("p.error").contains("日期筛选"), "{src}");

    // The admin's analytics: what was searched, what found nothing, which results were opened, and a zero-result
    // query proposed as a synonym.
    search(&b, &base, "qwzxv喵喵", 1);
    // Issue 53: a query with one key term found nowhere (替格瑞洛; 禁忌症 is found) counts as not found for that term.
    search(&b, &base, "替格瑞洛的禁忌症", 1);
    search(&b, &base, "高血压", 1);
    b.click("li.hit h2 a");
    b.wait_for("the document", Duration::from_secs(30), |s| s.contains("class=\"document\""));
    b.goto(&format!("{base}/admin/analytics?days=7"));
    let src = b.wait_for("the analytics page", Duration::from_secs(30), |s| s.contains("id=\"analytics-headline\""));
    assert!(b.text("#top-queries").contains("高血压"), "{src}");
    assert!(b.text("#not-found-queries").contains("qwzxv喵喵"), "{src}");
    assert!(b.text("#not-found-queries").contains("替格瑞洛的禁忌症"), "a partly found query: {src}");
    let missing = b.text("#missing-terms table");
    assert!(missing.contains("替格瑞洛") && !missing.contains("禁忌症"), "the term found nowhere, alone: {missing}");
    assert!(src.contains("<svg") && src.contains("每日检索"), "the chart: {src}");
    let head = b.text("#analytics-headline");
    assert!(head.contains("使用筛选") && head.contains("打开结果 1 次（平均第 1.0 条）"), "{head}");
    assert!(b.text("#low-click-queries").contains("高血压"), "searched often, opened once: {src}");
    let used = b.text("#facet-use");
    assert!(used.contains("科室：心内科") && used.contains("类型：药品说明书") && used.contains("日期"), "{used}");
    b.click("#not-found-queries a.propose");
    let src = b.wait_for("the synonym form", Duration::from_secs(30), |s| s.contains("id=\"proposed\""));
    assert!(src.contains("value=\"qwzxv喵喵\""), "the query fills the variants: {src}");
    b.goto(&format!("{base}/admin/analytics?days=7"));
    b.wait_for("the analytics page", Duration::from_secs(30), |s| s.contains("id=\"missing-terms\""));
    b.click("#missing-terms a.propose");
    let src = b.wait_for("the synonym form", Duration::from_secs(30), |s| s.contains("id=\"proposed\""));
    assert!(src.contains("value=\"替格瑞洛\""), "the missing term fills the variants: {src}");

    // The console opens on the overview: collections, documents, the live pair, the week's searches.
    b.goto(&format!("{base}/admin"));
    let src = b.wait_for("the overview", Duration::from_secs(30), |s| s.contains("id=\"overview-headline\""));
    let head = b.text("#overview-headline");
    assert!(head.contains("1 个资料库") && head.contains("48 篇文档"), "{head}");
    assert!(head.contains("e5-small") && head.contains("次检索"), "{head}");
    assert!(src.contains("各资料库文档数"), "{src}");
}
