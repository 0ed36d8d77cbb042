//! What clinicians search and where they fail, for admins: aggregated from the searches' audit records (so the
//! audit retention, `[audit] retention_days`, is this data's retention too) and from 没帮助 feedback. Query texts
//! appear only when the appliance logs them (`[audit] log_queries`); otherwise the counts stand without them.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::csv_out::{Cell, CsvOut};
use crate::error::Result;
use crate::store::Store;

/// Most days a report covers.
pub const MAX_DAYS: u32 = 366;
/// Queries listed per table.
const TOP: usize = 20;

/// One query and how often it was searched in the window (for feedback: marked 没帮助).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueryCount {
    pub query: String,
    pub count: usize,
}

/// A query searched often whose results were seldom opened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueryClicks {
    pub query: String,
    pub searches: usize,
    /// Results opened from its pages.
    pub clicks: usize,
}

/// Searches a query needs before its click-through is listed (once is no pattern).
const MIN_SEARCHES_FOR_RATE: usize = 3;

/// Searches on one day (UTC).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DayCount {
    pub day: String,
    pub searches: usize,
    /// Searches with a key term that occurs in no readable document (the page's "not found" statement, for the
    /// whole query or one of its terms) or that found nothing.
    pub not_found: usize,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Analytics {
    pub days: u32,
    /// The window's first instant (UTC, RFC 3339).
    pub since: String,
    pub searches: usize,
    pub not_found: usize,
    /// Searches with a department, type or date filter.
    pub filtered: usize,
    /// Filtered searches per facet (科室, 类型, 来源, 语言, 日期), and the values filtered on most.
    pub facet_use: Vec<QueryCount>,
    /// Whether query texts are in the audit log (`[audit] log_queries`): without them the query lists are empty.
    pub queries_logged: bool,
    pub per_day: Vec<DayCount>,
    pub top_queries: Vec<QueryCount>,
    /// The most frequent queries that found nothing or one of whose key terms occurs nowhere (替格瑞洛的禁忌症 when
    /// 替格瑞洛 does): candidates for a synonym entry.
    pub not_found_queries: Vec<QueryCount>,
    /// The key terms searches found nowhere, the most frequent first: each proposed for the synonym table.
    pub missing_terms: Vec<QueryCount>,
    /// Queries whose results clinicians marked 没帮助 most often.
    pub unhelpful_queries: Vec<QueryCount>,
    /// Results opened from a search page, and their mean rank (1 = the first hit).
    pub clicks: usize,
    pub mean_click_rank: Option<f64>,
    /// Queries searched at least three times whose results were opened least often (per search).
    pub low_click_queries: Vec<QueryClicks>,
    /// Search latency in the engine (ms), where recorded.
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
}

/// The last `days` days' search analytics, as of `now` (Unix seconds).
pub fn report(store: &Store, days: u32, now: i64) -> Result<Analytics> {
    let days = days.clamp(1, MAX_DAYS);
    let since = time::OffsetDateTime::from_unix_timestamp(now - i64::from(days) * 86_400)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default();
    let conn = store.reader();
    let mut stmt = conn.prepare_cached(
        "SELECT substr(at, 1, 10), json_extract(detail, '$.query'), json_extract(detail, '$.candidates'),
                json_extract(detail, '$.not_found'), json_extract(detail, '$.took_ms'), json_extract(detail, '$.filter') IS NOT NULL,
                json_extract(detail, '$.filter.departments'), json_extract(detail, '$.filter.doc_types'),
                json_extract(detail, '$.filter.date_from') || json_extract(detail, '$.filter.date_to'),
                json_extract(detail, '$.filter.issuers'), json_extract(detail, '$.filter.languages'),
                json_extract(detail, '$.missing')
         FROM audit WHERE action = 'search' AND at >= ?1",
    )?;
    let mut rows = stmt.query([&since])?;
    let (mut searches, mut not_found, mut filtered, mut logged) = (0, 0, 0, false);
    let mut per_day: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut top, mut failed): (HashMap<String, usize>, HashMap<String, usize>) = Default::default();
    let mut absent_terms: HashMap<String, usize> = HashMap::new();
    let mut took = Vec::new();
    let mut facets: HashMap<String, usize> = HashMap::new();
    while let Some(r) = rows.next()? {
        let day: String = r.get(0)?;
        // A query is text when logged, an object ({"chars": n}) when not.
        let query: Option<String> = r.get::<_, Option<String>>(1).ok().flatten().filter(|q| !q.starts_with('{'));
        let candidates: Option<i64> = r.get(2)?;
        // The terms found nowhere: their words where queries are logged, else how many (records before these
        // were kept have neither).
        let (absent, absent_count) = match r.get::<_, rusqlite::types::Value>(11)? {
            rusqlite::types::Value::Text(j) => {
                let words: Vec<String> = serde_json::from_str(&j).unwrap_or_default();
                let n = words.len();
                (words, n)
            }
            rusqlite::types::Value::Integer(n) => (Vec::new(), usize::try_from(n).unwrap_or(0)),
            rusqlite::types::Value::Null | rusqlite::types::Value::Real(_) | rusqlite::types::Value::Blob(_) => {
                (Vec::new(), 0)
            }
        };
        let missing = r.get::<_, Option<i64>>(3)?.unwrap_or(0) != 0 || candidates == Some(0) || absent_count > 0;
        for w in absent {
            *absent_terms.entry(w).or_default() += 1;
        }
        if let Some(ms) = r.get::<_, Option<f64>>(4)? {
            took.push(ms);
        }
        searches += 1;
        filtered += usize::from(r.get::<_, bool>(5)?);
        for (facet, i) in [("科室", 6), ("类型", 7), ("来源", 9), ("语言", 10)] {
            let values: Vec<String> =
                r.get::<_, Option<String>>(i)?.and_then(|j| serde_json::from_str(&j).ok()).unwrap_or_default();
            if !values.is_empty() {
                *facets.entry(facet.to_string()).or_default() += 1;
            }
            for v in values {
                *facets.entry(format!("{facet}：{v}")).or_default() += 1;
            }
        }
        if r.get::<_, Option<String>>(8)?.is_some_and(|d| !d.is_empty()) {
            *facets.entry("日期".to_string()).or_default() += 1;
        }
        let d = per_day.entry(day).or_default();
        d.0 += 1;
        if missing {
            not_found += 1;
            d.1 += 1;
        }
        if let Some(q) = query {
            logged = true;
            let q = q.trim().to_string();
            if missing {
                *failed.entry(q.clone()).or_default() += 1;
            }
            *top.entry(q).or_default() += 1;
        }
    }
    let mut cl = conn.prepare_cached(
        "SELECT json_extract(detail, '$.query'), json_extract(detail, '$.rank') FROM audit
         WHERE action = 'search.click' AND at >= ?1",
    )?;
    let mut clicked: HashMap<String, usize> = HashMap::new();
    let (mut clicks, mut rank_sum) = (0usize, 0f64);
    let mut rows = cl.query([&since])?;
    while let Some(r) = rows.next()? {
        clicks += 1;
        rank_sum += r.get::<_, Option<f64>>(1)?.unwrap_or(0.0);
        if let Some(q) = r.get::<_, Option<String>>(0).ok().flatten().filter(|q| !q.starts_with('{')) {
            *clicked.entry(q.trim().to_string()).or_default() += 1;
        }
    }
    let mut low: Vec<QueryClicks> = top
        .iter()
        .filter(|(_, n)| **n >= MIN_SEARCHES_FOR_RATE)
        .map(|(q, n)| QueryClicks { query: q.clone(), searches: *n, clicks: clicked.get(q).copied().unwrap_or(0) })
        .collect();
    // Lowest rate first (clicks / searches, compared without division), then the most searched.
    low.sort_by(|a, b| {
        (a.clicks * b.searches)
            .cmp(&(b.clicks * a.searches))
            .then(b.searches.cmp(&a.searches))
            .then(a.query.cmp(&b.query))
    });
    low.truncate(TOP);
    let mut fb =
        conn.prepare_cached("SELECT query, COUNT(*) FROM feedback WHERE helpful = 0 AND at >= ?1 GROUP BY query")?;
    let unhelpful: HashMap<String, usize> = fb
        .query_map([&since], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as usize)))?
        .collect::<std::result::Result<_, _>>()?;
    took.sort_by(f64::total_cmp);
    let pct = |p: f64| (!took.is_empty()).then(|| took[((took.len() - 1) as f64 * p).round() as usize]);
    Ok(Analytics {
        days,
        since,
        searches,
        not_found,
        filtered,
        facet_use: ranked(facets),
        queries_logged: logged || searches == 0,
        per_day: per_day.into_iter().map(|(day, (s, n))| DayCount { day, searches: s, not_found: n }).collect(),
        top_queries: ranked(top),
        not_found_queries: ranked(failed),
        missing_terms: ranked(absent_terms),
        unhelpful_queries: ranked(unhelpful),
        clicks,
        mean_click_rank: (clicks > 0).then(|| rank_sum / clicks as f64),
        low_click_queries: low,
        latency_p50_ms: pct(0.5),
        latency_p99_ms: pct(0.99),
    })
}

/// The most frequent first (ties by text), at most [`TOP`].
fn ranked(m: HashMap<String, usize>) -> Vec<QueryCount> {
    let mut v: Vec<QueryCount> = m.into_iter().map(|(query, count)| QueryCount { query, count }).collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.query.cmp(&b.query)));
    v.truncate(TOP);
    v
}

/// The report as CSV (UTF-8 with a byte-order mark, so spreadsheet programs read the Chinese): one section per
/// table, `section,key,value` rows. Written by [`CsvOut`]: the query texts clinicians typed are neutralised there.
pub fn to_csv(a: &Analytics) -> String {
    let mut w = CsvOut::with_bom();
    w.header(&["项目", "键", "值"]);
    let mut row = |s: &str, k: &str, v: Cell<'_>| {
        w.row([Cell::Text(s), Cell::Text(k), v]);
    };
    row("概况", "天数", a.days.into());
    row("概况", "起始", (&a.since).into());
    row("概况", "检索次数", a.searches.into());
    row("概况", "未找到", a.not_found.into());
    row("概况", "使用筛选", a.filtered.into());
    row("概况", "打开结果", a.clicks.into());
    for f in &a.facet_use {
        row("筛选使用", &f.query, f.count.into());
    }
    for d in &a.per_day {
        row("每日检索", &d.day, d.searches.into());
        row("每日未找到", &d.day, d.not_found.into());
    }
    for (section, list) in [
        ("热门检索", &a.top_queries),
        ("未找到的检索", &a.not_found_queries),
        ("未找到的词", &a.missing_terms),
        ("标为没帮助", &a.unhelpful_queries),
    ] {
        for q in list {
            row(section, &q.query, q.count.into());
        }
    }
    for q in &a.low_click_queries {
        row("很少打开结果的检索", &q.query, Cell::Text(&format!("{}/{}", q.clicks, q.searches)));
    }
    w.finish()
}

/// Searches and not-found searches per day as a bar chart.
pub fn chart(a: &Analytics) -> String {
    let rows: Vec<(String, Vec<f64>)> = a
        .per_day
        .iter()
        .rev()
        .take(31)
        .rev()
        .map(|d| (d.day.clone(), vec![d.searches as f64, d.not_found as f64]))
        .collect();
    crate::chart::grouped_bars(&format!("每日检索（近 {} 天）", a.days), "", &["检索", "未找到"], &rows)
}
