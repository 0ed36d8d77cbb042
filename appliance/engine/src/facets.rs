//! Filters, facet counts and date order over document metadata (department, type, date, issuer, language).
//!
//! Metadata lives in SQLite (`documents.department/doc_type/doc_date/issuer/language`); searches read it from an in-memory copy,
//! [`MetaIndex`], reloaded when a trigger-maintained version changes (ingest, edit, delete). A filter becomes a
//! [`DocSet`] of the documents it admits, and both legs apply it while they collect (tantivy's fast-field filter,
//! the dense scan's row test), before any top-k cut: a rare department is never emptied out of a page by better
//! passages of other departments. Metadata is kept out of the index files so that an admin's edit is a row update,
//! not a re-index.
//!
//! Facet counts are disjunctive, as in Elasticsearch's and Meilisearch's faceted search: each dimension counts the
//! documents of the unfiltered ranking that pass the *other* dimensions' filters, so a clinician who picked 心内科
//! still sees how many the other departments hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ingest::meta::{DocMeta, language_name, parse_date};

/// Which documents a search may return (every field empty: all).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchFilter {
    /// Any of these departments (科室).
    pub departments: Vec<String>,
    /// Any of these document types.
    pub doc_types: Vec<String>,
    /// Issued by any of these (来源).
    pub issuers: Vec<String>,
    /// In any of these languages (中文, 英文, …).
    pub languages: Vec<String>,
    /// Dated on or after (`YYYY`, `YYYY-MM` or `YYYY-MM-DD`; a document dated 2021 is in a range from 2021-06).
    pub date_from: String,
    /// Dated on or before.
    pub date_to: String,
}

/// The order of a ranking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Sort {
    /// Best match first.
    #[default]
    Relevance,
    /// Newest first (undated last), best match first within a date.
    Date,
}

impl Sort {
    pub fn parse(s: &str) -> Option<Sort> {
        match s {
            "" | "relevance" => Some(Sort::Relevance),
            "date" => Some(Sort::Date),
            _ => None,
        }
    }
}

/// Most values a filter may name per dimension (a URL is not a place for a department list).
const MAX_VALUES: usize = 50;

/// The dimensions filtered by name (department, type, issuer, language), in this order everywhere below; the
/// date is the one dimension filtered by range.
const NAMED: usize = 4;

/// A document's values in the named dimensions.
fn named_values(m: &DocMeta) -> [&str; NAMED] {
    [&m.department, &m.doc_type, &m.issuer, &m.language]
}

impl SearchFilter {
    /// The values wanted in each named dimension (empty: any).
    fn named(&self) -> [&[String]; NAMED] {
        [&self.departments, &self.doc_types, &self.issuers, &self.languages]
    }

    fn dated(&self) -> bool {
        !self.date_from.is_empty() || !self.date_to.is_empty()
    }

    pub fn is_empty(&self) -> bool {
        self.named().iter().all(|v| v.is_empty()) && !self.dated()
    }

    /// The filter with its dates in the stored form, blank values dropped, languages by their Chinese names; a
    /// date that is not one is refused.
    pub fn normalized(&self) -> Result<SearchFilter> {
        let clean = |v: &[String], what: &str| -> Result<Vec<String>> {
            let mut out: Vec<String> = v.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
            out.sort();
            out.dedup();
            if out.len() > MAX_VALUES {
                return Err(Error::InvalidInput(format!("{what}筛选最多 {MAX_VALUES} 项，收到 {} 项", out.len())));
            }
            Ok(out)
        };
        let date = |s: &str| parse_date(s).map_err(|e| Error::InvalidInput(format!("日期筛选：{e}")));
        let languages: Vec<String> = self.languages.iter().map(|l| language_name(l)).collect();
        let f = SearchFilter {
            departments: clean(&self.departments, "科室")?,
            doc_types: clean(&self.doc_types, "类型")?,
            issuers: clean(&self.issuers, "来源")?,
            languages: clean(&languages, "语言")?,
            date_from: date(&self.date_from)?,
            date_to: date(&self.date_to)?,
        };
        if !f.date_from.is_empty() && !f.date_to.is_empty() && f.date_from > upper(&f.date_to) {
            return Err(Error::InvalidInput(format!("日期范围有误：起始 {} 晚于截止 {}", f.date_from, f.date_to)));
        }
        Ok(f)
    }

    /// Whether a document's date overlaps the range; an undated document is in no range.
    fn date_ok(&self, m: &DocMeta) -> bool {
        if !self.dated() {
            return true;
        }
        !m.date.is_empty()
            && (self.date_from.is_empty() || upper(&m.date) >= self.date_from)
            && (self.date_to.is_empty() || m.date <= upper(&self.date_to))
    }

    pub fn admits(&self, m: &DocMeta) -> bool {
        self.named().iter().zip(named_values(m)).all(|(want, v)| want.is_empty() || want.iter().any(|w| w == v))
            && self.date_ok(m)
    }
}

/// The latest date a partial date stands for, in string order: 2021 → "2021~" sorts after every 2021-MM-DD ('~'
/// is after the digits and '-').
fn upper(date: &str) -> String {
    format!("{date}~")
}

/// A set of document ids, one bit each (ids are SQLite row ids: dense and small).
#[derive(Debug, Clone, Default)]
pub struct DocSet {
    bits: Vec<u64>,
}

impl DocSet {
    pub fn insert(&mut self, id: i64) {
        let Ok(i) = usize::try_from(id) else { return };
        if self.bits.len() <= i / 64 {
            self.bits.resize(i / 64 + 1, 0);
        }
        self.bits[i / 64] |= 1 << (i % 64);
    }

    pub fn contains(&self, id: i64) -> bool {
        usize::try_from(id).is_ok_and(|i| self.bits.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0))
    }

    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// The ids in both sets.
    pub fn intersect(&self, other: &DocSet) -> DocSet {
        DocSet { bits: self.bits.iter().zip(&other.bits).map(|(a, b)| a & b).collect() }
    }

    /// The ids, ascending.
    pub fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.bits
            .iter()
            .enumerate()
            .flat_map(|(i, w)| (0..64).filter(move |b| w & (1 << b) != 0).map(move |b| (i * 64 + b) as i64))
    }
}

/// Whether a document's access list admits a reader with these groups: an empty list admits everyone who may read
/// the collection; otherwise one of the reader's groups must be on it (names compared ignoring ASCII case).
pub fn access_admits(meta: &DocMeta, groups: &[String]) -> bool {
    let mut listed = meta.access_groups().peekable();
    listed.peek().is_none() || listed.any(|a| groups.iter().any(|g| g.eq_ignore_ascii_case(a)))
}

/// One value of a facet and how many documents of the query's ranking have it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FacetCount {
    pub value: String,
    pub count: usize,
    /// The current filter names this value.
    pub selected: bool,
}

/// Counts per department, type, issuer, language and year for the current query (documents, not passages), most
/// first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Facets {
    pub departments: Vec<FacetCount>,
    pub doc_types: Vec<FacetCount>,
    pub issuers: Vec<FacetCount>,
    pub languages: Vec<FacetCount>,
    /// Newest year first.
    pub years: Vec<FacetCount>,
}

impl Facets {
    pub fn is_empty(&self) -> bool {
        [&self.departments, &self.doc_types, &self.issuers, &self.languages, &self.years].iter().all(|v| v.is_empty())
    }
}

/// Every document's metadata and collection, as of `version`, with its names numbered so that filtering 30,000
/// documents and counting a ranking's facets compare integers.
#[derive(Debug, Default)]
pub struct MetaIndex {
    pub version: i64,
    /// Looked up for every hit of every search (the facet counts): the integer hash, not SipHash (keys are row ids,
    /// not attacker-chosen strings).
    docs: rustc_hash::FxHashMap<i64, Entry>,
    /// Names (of any dimension) by number, and back (0 is "none").
    names: Vec<String>,
    numbers: HashMap<String, u32>,
    /// The admitted sets of recent filters: clinicians page through and refine one filter.
    recent: Mutex<Vec<(SearchFilter, Vec<i64>, Arc<DocSet>)>>,
    /// Collections holding a document with an access list: searches elsewhere need no visibility set.
    restricted: std::collections::HashSet<i64>,
    /// The visible sets of recent readers' groups (per collections), kept like `recent`.
    visible_sets: Mutex<Vec<(Vec<String>, Vec<i64>, Arc<DocSet>)>>,
}

#[derive(Debug)]
struct Entry {
    collection: i64,
    /// The numbers of its named dimensions' values.
    named: [u32; NAMED],
    /// The year a facet counts (the date's first four bytes), `[0; 4]` without a date.
    year: [u8; 4],
    /// Boxed: counting the facets of a search's 1,100 hits reads the fields above only, and a 40-byte entry keeps
    /// the index a fifth the size (fewer cache misses than one with the six strings inline).
    meta: Box<DocMeta>,
}

/// Admitted sets kept per metadata version.
const RECENT_FILTERS: usize = 16;

impl MetaIndex {
    /// Every document's filing, labelled `version` (read by the caller before this).
    /// The filing's version in SQLite, moved by a trigger on every change of a document's filing.
    pub fn version(conn: &rusqlite::Connection) -> Result<i64> {
        // Read by every search: a cached statement.
        Ok(conn.prepare_cached("SELECT version FROM document_meta_state WHERE id = 1")?.query_row([], |r| r.get(0))?)
    }

    pub fn load(store: &crate::store::Store, version: i64) -> Result<MetaIndex> {
        Self::load_from(&store.reader(), version)
    }

    /// [`MetaIndex::load`] through a connection of the caller's.
    pub fn load_from(conn: &rusqlite::Connection, version: i64) -> Result<MetaIndex> {
        let mut stmt = conn.prepare(
            "SELECT id, collection_id, department, doc_type, doc_date, issuer, language, access FROM documents",
        )?;
        let rows = stmt.query_map([], |r| {
            let meta = DocMeta {
                department: r.get(2)?,
                doc_type: r.get(3)?,
                date: r.get(4)?,
                issuer: r.get(5)?,
                language: r.get(6)?,
                access: r.get(7)?,
            };
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, meta))
        })?;
        let mut idx = MetaIndex { version, ..Default::default() };
        for row in rows {
            let (id, collection, meta) = row?;
            idx.insert(id, collection, meta);
        }
        Ok(idx)
    }

    fn number(&mut self, name: &str) -> u32 {
        if let Some(n) = self.numbers.get(name) {
            return *n;
        }
        let n = self.names.len() as u32;
        self.names.push(name.to_string());
        self.numbers.insert(name.to_string(), n);
        n
    }

    fn insert(&mut self, id: i64, collection: i64, meta: DocMeta) {
        if self.names.is_empty() {
            self.names.push(String::new());
            self.numbers.insert(String::new(), 0);
        }
        let named = named_values(&meta).map(|v| self.number(v));
        if !meta.access.is_empty() {
            self.restricted.insert(collection);
        }
        let year = meta.year().and_then(|y| y.as_bytes().try_into().ok()).unwrap_or([0; 4]);
        self.docs.insert(id, Entry { collection, named, year, meta: Box::new(meta) });
    }

    pub fn meta(&self, doc: i64) -> Option<&DocMeta> {
        self.docs.get(&doc).map(|d| &*d.meta)
    }

    /// The numbers each named dimension of a filter wants (a name no document has gets none: it admits nothing),
    /// and whether the dimension is constrained at all.
    fn wanted(&self, filter: &SearchFilter) -> [(bool, Vec<u32>); NAMED] {
        filter
            .named()
            .map(|names| (!names.is_empty(), names.iter().filter_map(|n| self.numbers.get(n).copied()).collect()))
    }

    /// Which dimensions an entry passes: the named ones, then the date.
    fn passes(&self, e: &Entry, wanted: &[(bool, Vec<u32>); NAMED], filter: &SearchFilter) -> [bool; NAMED + 1] {
        let mut ok = [true; NAMED + 1];
        for (i, (constrained, numbers)) in wanted.iter().enumerate() {
            ok[i] = !constrained || numbers.contains(&e.named[i]);
        }
        ok[NAMED] = filter.date_ok(&e.meta);
        ok
    }

    /// The documents of `collections` a reader with `groups` may see, or `None` when no document there has an
    /// access list (the search then needs no restriction at all).
    pub fn visible(&self, collections: &[i64], groups: &[String]) -> Option<Arc<DocSet>> {
        if !collections.iter().any(|c| self.restricted.contains(c)) {
            return None;
        }
        let mut recent = self.visible_sets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, set)) = recent.iter().find(|(g, c, _)| g.as_slice() == groups && c == collections) {
            return Some(set.clone());
        }
        let mut set = DocSet::default();
        for (id, e) in &self.docs {
            if collections.contains(&e.collection) && access_admits(&e.meta, groups) {
                set.insert(*id);
            }
        }
        let set = Arc::new(set);
        if recent.len() >= RECENT_FILTERS {
            recent.remove(0);
        }
        recent.push((groups.to_vec(), collections.to_vec(), set.clone()));
        Some(set)
    }

    /// The documents of `collections` that `filter` admits (kept for the next searches with the same filter).
    pub fn admitted(&self, filter: &SearchFilter, collections: &[i64]) -> Arc<DocSet> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, set)) = recent.iter().find(|(f, c, _)| f == filter && c == collections) {
            return set.clone();
        }
        let wanted = self.wanted(filter);
        let mut set = DocSet::default();
        for (id, e) in &self.docs {
            if collections.contains(&e.collection) && self.passes(e, &wanted, filter).iter().all(|ok| *ok) {
                set.insert(*id);
            }
        }
        let set = Arc::new(set);
        if recent.len() >= RECENT_FILTERS {
            recent.remove(0);
        }
        recent.push((filter.clone(), collections.to_vec(), set.clone()));
        set
    }

    /// Facet counts: a dimension the filter constrains counts the distinct documents of `unfiltered` (the
    /// query's ranking without filters) that pass the other dimensions' filters; any other dimension counts the
    /// documents of `filtered` (the ranking the page shows), so the values' counts add up to its total.
    pub fn facets(&self, unfiltered: &[i64], filtered: &[i64], filter: &SearchFilter) -> Facets {
        let wanted = self.wanted(filter);
        let mut constrained = [filter.dated(); NAMED + 1];
        for (c, (w, _)) in constrained.iter_mut().zip(&wanted) {
            *c = *w;
        }
        let mut named: [Vec<usize>; NAMED] = std::array::from_fn(|_| vec![0usize; self.names.len()]);
        let mut year: BTreeMap<[u8; 4], usize> = BTreeMap::new();
        for (ranking, own) in [(unfiltered, true), (filtered, false)] {
            let mut docs = ranking.to_vec();
            docs.sort_unstable();
            docs.dedup();
            for doc in docs {
                let Some(e) = self.docs.get(&doc) else { continue };
                // Only the unfiltered ranking's counts ask which dimensions a document passes.
                let ok = if own { self.passes(e, &wanted, filter) } else { [true; NAMED + 1] };
                // From the unfiltered ranking, a constrained dimension counts what passes every other dimension.
                let others_pass = |dim: usize| ok.iter().enumerate().all(|(j, p)| j == dim || *p);
                for (dim, counts) in named.iter_mut().enumerate() {
                    if constrained[dim] == own && (!own || others_pass(dim)) && e.named[dim] != 0 {
                        counts[e.named[dim] as usize] += 1;
                    }
                }
                if constrained[NAMED] == own && (!own || others_pass(NAMED)) && e.year != [0; 4] {
                    *year.entry(e.year).or_insert(0) += 1;
                }
            }
        }
        let ranked = |m: Vec<(String, usize)>, chosen: &dyn Fn(&str) -> bool| -> Vec<FacetCount> {
            let mut v: Vec<FacetCount> =
                m.into_iter().map(|(value, count)| FacetCount { selected: chosen(&value), value, count }).collect();
            v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.cmp(&b.value)));
            v
        };
        let chosen = filter.named();
        let [departments, doc_types, issuers, languages] = std::array::from_fn(|dim| {
            let counts: Vec<(String, usize)> = named[dim]
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (self.names[i].clone(), *n))
                .collect();
            ranked(counts, &|v| chosen[dim].iter().any(|c| c == v))
        });
        let years = year.into_iter().map(|(y, n)| (String::from_utf8_lossy(&y).into_owned(), n));
        let mut years = ranked(years.collect(), &|y| {
            !filter.date_from.is_empty() && filter.date_from.starts_with(y) && filter.date_to.starts_with(y)
        });
        years.sort_by(|a, b| b.value.cmp(&a.value));
        Facets { departments, doc_types, issuers, languages, years }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(d: &str, t: &str, date: &str) -> DocMeta {
        DocMeta { department: d.into(), doc_type: t.into(), date: date.into(), ..Default::default() }
    }

    #[test]
    fn date_ranges_overlap_partial_dates() {
        let f = SearchFilter { date_from: "2021-06".into(), date_to: "2022".into(), ..Default::default() };
        assert!(f.admits(&m("", "", "2021")), "2021 overlaps June 2021 onwards");
        assert!(f.admits(&m("", "", "2022-12-31")));
        assert!(!f.admits(&m("", "", "2021-05-31")));
        assert!(!f.admits(&m("", "", "2023-01")));
        assert!(!f.admits(&m("", "", "")), "an undated document is in no range");
        assert!(SearchFilter::default().admits(&m("", "", "")));
    }

    #[test]
    fn normalized_reads_dates_and_refuses_nonsense() {
        let f = SearchFilter {
            departments: vec![" 心内科".into(), "".into(), "心内科".into()],
            date_from: "2021年5月".into(),
            ..Default::default()
        }
        .normalized()
        .unwrap();
        assert_eq!(f.departments, vec!["心内科"]);
        assert_eq!(f.date_from, "2021-05");
        let bad = SearchFilter { date_to: "去年".into(), ..Default::default() }.normalized().unwrap_err();
        assert!(bad.to_string().contains("日期筛选"), "{bad}");
        let reversed = SearchFilter { date_from: "2023".into(), date_to: "2021".into(), ..Default::default() };
        assert!(reversed.normalized().unwrap_err().to_string().contains("晚于"));
        assert!(
            SearchFilter { date_from: "2021-05".into(), date_to: "2021".into(), ..Default::default() }
                .normalized()
                .is_ok()
        );
    }

    #[test]
    fn doc_set_holds_what_was_inserted() {
        let mut s = DocSet::default();
        for id in [3, 64, 65, 1000, -1] {
            s.insert(id);
        }
        assert!(s.contains(3) && s.contains(64) && s.contains(1000));
        assert!(!s.contains(4) && !s.contains(-1) && !s.contains(100_000));
        assert_eq!(s.len(), 4);
        assert_eq!(s.ids().collect::<Vec<_>>(), vec![3, 64, 65, 1000]);
    }

    #[test]
    fn facets_count_documents_disjunctively() {
        let mut idx = MetaIndex::default();
        for (id, meta) in [
            (1, m("心内科", "指南", "2021-03")),
            (2, m("心内科", "药品说明书", "2023")),
            (3, m("内分泌科", "指南", "2023-01-02")),
            (4, m("", "", "")),
        ] {
            idx.insert(id, 1, meta);
        }
        let f = SearchFilter { departments: vec!["心内科".into()], ..Default::default() };
        // The filtered ranking holds 1 and 2 (and a chunk of 1 twice).
        let got = idx.facets(&[1, 1, 2, 3, 4], &[1, 2, 1], &f);
        // Departments ignore their own filter; types and years count the chosen department only.
        assert_eq!(
            got.departments,
            vec![
                FacetCount { value: "心内科".into(), count: 2, selected: true },
                FacetCount { value: "内分泌科".into(), count: 1, selected: false },
            ]
        );
        assert_eq!(
            got.doc_types.iter().map(|c| (c.value.as_str(), c.count)).collect::<Vec<_>>(),
            [("指南", 1), ("药品说明书", 1)]
        );
        assert_eq!(
            got.years.iter().map(|c| (c.value.as_str(), c.count)).collect::<Vec<_>>(),
            [("2023", 1), ("2021", 1)]
        );
        let set = idx.admitted(&f, &[1]);
        assert_eq!(set.ids().collect::<Vec<_>>(), vec![1, 2]);
        assert!(idx.admitted(&f, &[2]).is_empty(), "another collection's documents are never admitted");
    }
}
