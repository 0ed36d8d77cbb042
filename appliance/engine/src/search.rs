//! The one search pipeline every caller runs — the page, the JSON API, `care search`, `care eval`, fusion
//! tuning, the evaluation gate and the benchmarks: validate → understand (folding, synonyms, pinyin, key terms) →
//! encode → legs (BM25, dense) → fuse → evidence → page. Nothing else reaches the legs, so what the gate scores is
//! what a clinician sees.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::fusion::{Explained, Ranked, ScoreParts};
use crate::store::Collection;

/// Longest query accepted, in characters.
pub const MAX_QUERY_CHARS: usize = 1000;

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct SearchRequest {
    pub query: String,
    /// Restrict to these collections; `None` searches all of them.
    #[serde(default)]
    pub collections: Option<Vec<String>>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub offset: usize,
    /// Force a retrieval method (bm25, dense, rrf, weighted) instead of the collection's tuned one.
    #[serde(default)]
    pub method: Option<crate::fusion::Method>,
    #[serde(default)]
    pub dense_weight: Option<f32>,
    /// One hit per document (its best passage), paged over documents; the others are counted.
    #[serde(default)]
    pub group_by_document: bool,
    /// The words as typed: no synonym expansion, no pinyin reading (folding still applies).
    #[serde(default)]
    pub exact: bool,
    /// Synonym weight instead of `search.synonym_weight` (benchmarks compare weights on one index).
    #[serde(default)]
    pub synonym_weight: Option<f32>,
    /// Only documents of these departments, types and dates.
    #[serde(default)]
    pub filter: crate::facets::SearchFilter,
    #[serde(default)]
    pub sort: crate::facets::Sort,
    /// The reader's groups when documents' access lists apply to them (`None`: an administrator, or a caller
    /// inside the engine); set by the service layer from the actor, never taken from a request.
    #[serde(skip)]
    pub reader_groups: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchHit {
    pub rank: usize,
    pub score: f32,
    pub chunk_id: i64,
    pub document_id: i64,
    pub external_id: String,
    pub collection: String,
    pub title: String,
    pub heading: String,
    pub source: String,
    /// A fragment of the chunk around the best match.
    pub snippet: String,
    /// Byte ranges of matched terms inside `snippet`.
    pub highlights: Vec<(usize, usize)>,
    pub text: String,
    /// How the score came about: raw, rank and normalised parts of BM25 and dense retrieval. `score` and these
    /// parts are relative to this query's candidates (min-max), so they are for explaining a ranking, not for
    /// comparing queries: pages show [`SearchHit::matched_terms`] instead.
    pub parts: ScoreParts,
    /// The query's salient terms this passage contains (title, heading or text; compared folded).
    pub matched_terms: Vec<String>,
    /// The words of the query found in this passage as the passage writes them, a synonym with the query's term it
    /// stands for (慢性阻塞性肺疾病（COPD）): what the page shows as 包含.
    pub evidence: Vec<String>,
    /// Found by the dense leg only: no query term matched it in BM25 (shown as 仅语义相近).
    pub dense_only: bool,
    /// With `group_by_document`: how many more passages of this document are in the ranking.
    pub more_in_document: usize,
    /// The document's department, type and date (empty where unknown).
    pub meta: crate::ingest::meta::DocMeta,
    /// Read from a scanned page by the OCR (its page and confidence); `None` for typed text.
    pub scan: Option<crate::ingest::scan::ScanOrigin>,
}

/// A synonym-table term found in a query and the other terms of its group, searched at a lower weight.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Expansion {
    pub term: String,
    pub synonyms: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchResults {
    pub query: String,
    /// The query as searched when folding changed it (traditional → simplified, full-width → ASCII).
    pub folded_query: Option<String>,
    /// The method actually used: bm25 when no encoder is active or no dense index covers the collections.
    pub method: crate::fusion::Method,
    pub dense_weight: f32,
    /// Hits of the ranking (documents when grouped) that answer: their passage holds a salient term of the query
    /// that was found (`matched_terms`). Zero when nothing was found.
    pub total: usize,
    /// Hits of the ranking that hold no term found, only near in meaning (仅语义相近), counted apart. Pages are
    /// consecutive slices of the ranking, `total + near_total` hits long.
    pub near_total: usize,
    /// More passages contain the query's words than the ranking holds (`search.max_offset` + `search.max_limit`):
    /// `total` is a lower bound (约).
    pub total_is_lower_bound: bool,
    /// Same as `total` (kept for older clients).
    pub total_candidates: usize,
    /// The query's salient terms (content words, folded), in order.
    pub terms: Vec<String>,
    /// Salient terms that occur in the searched collections.
    pub matched_terms: Vec<String>,
    /// Key terms (drug, disease and other clinical terms, the synonym table's, the admin dictionary's) that occur
    /// nowhere in the searched collections: no hit answers them. Other salient words that occur nowhere (everyday
    /// words, numbers) are in neither list.
    pub missing_terms: Vec<String>,
    /// No salient term occurs anywhere (or the query has none): whatever is listed is only semantically near.
    pub not_found: bool,
    /// Synonym-table terms of the query and the synonyms searched with them (同时检索了).
    pub expansions: Vec<Expansion>,
    /// The typed query when it was read as pinyin (gxy): `folded_query` is then the word searched (高血压).
    pub pinyin_of: Option<String>,
    /// Words the query may have meant (您是不是要找), e.g. the readings of ambiguous pinyin initials.
    pub did_you_mean: Vec<String>,
    pub grouped: bool,
    /// The filter as applied (dates in stored form) and the order.
    pub filter: crate::facets::SearchFilter,
    pub sort: crate::facets::Sort,
    /// Documents of the query's ranking per department, type and year; each dimension counted under the other
    /// dimensions' filters (so a chosen department still shows the others' counts).
    pub facets: crate::facets::Facets,
    pub hits: Vec<SearchHit>,
    pub encode_ms: f64,
    pub retrieve_ms: f64,
    /// Counting the facets (part of `retrieve_ms`).
    pub facets_ms: f64,
    /// The pipeline's stages one by one (the API's `Server-Timing` names them): planning and query understanding,
    /// both legs and their fusion, the evidence (terms found, what answers), the page's texts and snippets.
    pub stages: StageTimes,
    pub took_ms: f64,
}

impl SearchResults {
    /// The answer for a caller with nothing to search (no readable collection).
    pub fn empty(query: &str) -> Self {
        SearchResults {
            query: query.to_string(),
            folded_query: None,
            method: crate::fusion::Method::Bm25,
            dense_weight: 0.0,
            total: 0,
            near_total: 0,
            total_is_lower_bound: false,
            total_candidates: 0,
            terms: Vec::new(),
            matched_terms: Vec::new(),
            missing_terms: Vec::new(),
            not_found: true,
            expansions: Vec::new(),
            pinyin_of: None,
            did_you_mean: Vec::new(),
            grouped: false,
            filter: Default::default(),
            sort: Default::default(),
            facets: Default::default(),
            hits: Vec::new(),
            encode_ms: 0.0,
            retrieve_ms: 0.0,
            facets_ms: 0.0,
            stages: StageTimes::default(),
            took_ms: 0.0,
        }
    }
}

/// Milliseconds per stage of one search ([`SearchResults::stages`]).
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StageTimes {
    pub understand_ms: f64,
    pub encode_ms: f64,
    /// Both legs and their fusion, with the filter's second pass where there is one; split below.
    pub legs_ms: f64,
    pub bm25_ms: f64,
    pub dense_ms: f64,
    pub fuse_ms: f64,
    pub evidence_ms: f64,
    pub facets_ms: f64,
    pub snippets_ms: f64,
    /// The search's audit record, committed with those of searches beside it (the façade's, after the pipeline).
    pub audit_ms: f64,
}

impl StageTimes {
    /// Each stage by its name, in pipeline order (`legs` is not one: it is BM25, dense and fuse together).
    pub fn named(&self) -> [(&'static str, f64); 9] {
        [
            ("understand", self.understand_ms),
            ("encode", self.encode_ms),
            ("bm25", self.bm25_ms),
            ("dense", self.dense_ms),
            ("fuse", self.fuse_ms),
            ("evidence", self.evidence_ms),
            ("facets", self.facets_ms),
            ("snippets", self.snippets_ms),
            ("audit", self.audit_ms),
        ]
    }

    /// As a `Server-Timing` header value (W3C).
    pub fn server_timing(&self) -> String {
        self.named().iter().map(|(name, ms)| format!("{name};dur={ms:.3}")).collect::<Vec<_>>().join(", ")
    }
}

/// A request made ready once ([`Searcher::plan_search`]); every stage after reads it.
pub(crate) struct SearchPlan {
    pub(crate) query: String,
    pub(crate) filter: crate::facets::SearchFilter,
    pub(crate) limit: usize,
    pub(crate) wants_dense: bool,
    /// The request's method and dense weight (the collection's tuned ones where `None`).
    pub(crate) spec: (Option<crate::fusion::Method>, Option<f32>),
    pub(crate) cols: Vec<Collection>,
    pub(crate) names: Vec<String>,
    /// The filing as of this request, and the documents of `cols` the reader may see where access lists restrict
    /// them (`None`: every document of `cols`).
    pub(crate) metas: crate::versioned::Held<crate::facets::MetaIndex>,
    pub(crate) visible: Option<std::sync::Arc<crate::facets::DocSet>>,
    pub(crate) understood: Understood,
}

/// What a reader may read: the collections searched and, where access lists restrict them, the documents visible.
/// Every word the pipeline shows back (terms found, pinyin readings, suggestions, synonyms searched) is checked
/// against it, so that nothing a page says comes from a document the reader may not open.
#[derive(Clone, Copy)]
pub(crate) struct Readable<'a> {
    pub(crate) names: &'a [String],
    pub(crate) visible: Option<&'a crate::facets::DocSet>,
}

/// A query understood: the plan as searched, the typed query when it was read as pinyin, and suggestions.
pub(crate) struct Understood {
    pub(crate) plan: crate::query::QueryPlan,
    pub(crate) pinyin_of: Option<String>,
    pub(crate) did_you_mean: Vec<String>,
}

/// The dense leg of [`Searcher::judged_candidates`]: the query encoder to judge (the live one, or a candidate
/// pair's graph) and the pair whose tables it searches.
pub(crate) struct JudgedDense<'a> {
    /// Encodes one query at a time, as a search does.
    pub(crate) encoder: &'a crate::encoders::OrtEncoder,
    pub(crate) query: &'a crate::models::ModelRecord,
    pub(crate) document: &'a crate::models::ModelRecord,
}

/// The search pipeline: a request planned once (validated, the caller's collections, the live pair, query
/// understanding), then run over the legs, fused, given evidence and paged. Borrowed from the engine's parts
/// ([`crate::engine::Engine::searcher`]); every caller (pages, API, CLI, evaluation, the gate) runs it.
#[derive(Clone, Copy)]
pub struct Searcher<'e> {
    /// The store, the indexes, the models and the settings the legs read.
    pub(crate) retrieval: crate::hybrid::Retrieval<'e>,
    pub(crate) synonyms: &'e crate::versioned::Versioned<crate::synonyms::SynonymTable>,
    pub(crate) texts: &'e crate::store::texts::TextPresence,
    pub(crate) meta_index: &'e crate::versioned::Versioned<crate::facets::MetaIndex>,
}

impl Searcher<'_> {
    /// Checks a search request's query text, paging and filter before any work is done (also for callers that end
    /// up searching nothing, so every caller gets the same limits). Returns the trimmed query and the normalised
    /// filter.
    pub(crate) fn validate_search<'a>(&self, req: &'a SearchRequest) -> Result<(&'a str, crate::facets::SearchFilter)> {
        let query = req.query.trim();
        if query.is_empty() {
            return Err(Error::InvalidInput("查询为空：请输入要搜索的词语 (the query is empty)".into()));
        }
        let n = query.chars().count();
        if n > MAX_QUERY_CHARS {
            return Err(Error::InvalidInput(format!(
                "查询过长：{n} 个字符，最多 {MAX_QUERY_CHARS} 个；请缩短后重试 (query longer than {MAX_QUERY_CHARS} characters)"
            )));
        }
        let max = self.retrieval.cfg.search.max_offset;
        if req.offset > max {
            return Err(Error::InvalidInput(format!(
                "翻页过深：offset 为 {}，最大 {max}（search.max_offset）；请细化查询 (offset beyond search.max_offset)",
                req.offset
            )));
        }
        Ok((query, req.filter.normalized()?))
    }

    /// Hybrid search with snippets, the one pipeline: the request planned once ([`Searcher::plan_search`]), the
    /// legs fused into one ranking ([`crate::hybrid::Retrieval::rank`]) that every page is a slice of, then evidence: which of the
    /// query's salient terms each hit contains, which terms occur nowhere, and how many hits answer (contain a
    /// term found) against how many are only near in meaning. Totals and facets count the answering ones.
    pub(crate) fn search_unaudited(&self, req: &SearchRequest) -> Result<SearchResults> {
        let started = Instant::now();
        let plan = self.plan_search(req)?;
        let understood = &plan.understood;
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let understand_ms = ms(started);
        let t0 = Instant::now();
        let encoded = {
            let _span = tracing::debug_span!("encode").entered();
            if plan.wants_dense { self.retrieval.encode_queries(&[understood.plan.folded.as_str()])? } else { None }
        };
        let encode_ms = t0.elapsed().as_secs_f64() * 1e3;
        let qvec = encoded.as_ref().and_then(|(v, m)| v.first().map(|v| (v.as_slice(), m)));
        let t1 = Instant::now();
        let (metas, visible) = (&plan.metas, plan.visible.as_ref());
        let readable = Readable { names: &plan.names, visible: visible.map(|v| v.as_ref()) };
        let legs = Instant::now();
        let (everything, mut ranking) = {
            let _span = tracing::debug_span!("legs").entered();
            self.rankings_for(&plan, qvec, metas, visible)?
        };
        let legs_ms = ms(legs);
        let evidence = Instant::now();
        if req.sort == crate::facets::Sort::Date {
            // Newest first; the ranking's order within a date (a stable sort), undated documents last.
            let date = |h: &Explained| metas.meta(h.document_id).map_or(String::new(), |m| m.date.clone());
            ranking.hits.sort_by_cached_key(|h| std::cmp::Reverse(date(h)));
        }
        let (matched_terms, missing_terms) = {
            let _span = tracing::debug_span!("evidence").entered();
            self.term_presence(&understood.plan, readable)?
        };
        let expansions = self.expansions_shown(&understood.plan, readable)?;
        // What answers: a passage holding a term found. Counted over the whole ranking, so that the total, the
        // pages and the facets agree with the statement above them.
        let answering = {
            let _span = tracing::debug_span!("answers").entered();
            let chunks: Vec<i64> =
                ranking.hits.iter().chain(everything.iter().flat_map(|r| r.hits.iter())).map(|h| h.chunk_id).collect();
            self.answering(&understood.plan, &matched_terms, &plan.names, &chunks, &ranking)?
        };
        let answers = |h: &Explained| answering.contains(&h.chunk_id);
        let evidence_ms = ms(evidence);
        let t = Instant::now();
        let docs_of =
            |hits: &[Explained]| hits.iter().filter(|h| answers(h)).map(|h| h.document_id).collect::<Vec<i64>>();
        let facets = match &everything {
            Some(all) => metas.facets(&docs_of(&all.hits), &docs_of(&ranking.hits), &plan.filter),
            None => metas.facets(&[], &docs_of(&ranking.hits), &plan.filter),
        };
        let facets_ms = t.elapsed().as_secs_f64() * 1e3;
        let retrieve_ms = t1.elapsed().as_secs_f64() * 1e3;
        let (ranked, more) = if req.group_by_document {
            group_by_document(&ranking.hits)
        } else {
            (ranking.hits.iter().collect(), vec![0; ranking.hits.len()])
        };
        let total = ranked.iter().filter(|h| answers(h)).count();
        let near_total = ranked.len() - total;
        let page: Vec<(&Explained, usize)> = ranked.into_iter().zip(more).skip(req.offset).take(plan.limit).collect();
        let snippets = Instant::now();
        let hits = {
            let _span = tracing::debug_span!("snippets").entered();
            self.page_hits(&understood.plan, &page, req.offset)?
        };
        let stages = StageTimes {
            understand_ms,
            encode_ms,
            legs_ms,
            bm25_ms: ranking.times.bm25_ms,
            dense_ms: ranking.times.dense_ms,
            fuse_ms: ranking.times.fuse_ms,
            evidence_ms,
            facets_ms,
            snippets_ms: ms(snippets),
            audit_ms: 0.0,
        };
        let u = plan.understood;
        Ok(SearchResults {
            query: plan.query,
            folded_query: if u.pinyin_of.is_some() {
                Some(u.plan.folded.clone())
            } else {
                u.plan.folded_if_changed().map(str::to_string)
            },
            expansions,
            pinyin_of: u.pinyin_of,
            did_you_mean: u.did_you_mean,
            method: ranking.method,
            dense_weight: ranking.dense_weight,
            total,
            near_total,
            total_is_lower_bound: ranking.capped,
            total_candidates: total,
            not_found: matched_terms.is_empty(),
            terms: u.plan.salient.clone(),
            matched_terms,
            missing_terms,
            grouped: req.group_by_document,
            filter: plan.filter,
            sort: req.sort,
            facets,
            hits,
            encode_ms,
            retrieve_ms,
            facets_ms,
            stages,
            took_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// A request made ready once: validated, its collections read, its query understood, its ranking asked for.
    pub(crate) fn plan_search(&self, req: &SearchRequest) -> Result<SearchPlan> {
        let _span = tracing::debug_span!("plan").entered();
        let (query, filter) = self.validate_search(req)?;
        let cols: Vec<Collection> = match &req.collections {
            Some(names) => names.iter().map(|c| self.retrieval.store.collection(c)).collect::<Result<_>>()?,
            None => self.retrieval.store.collection_list()?,
        };
        let names: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
        let metas = self.meta_index()?;
        let ids: Vec<i64> = cols.iter().map(|c| c.id).collect();
        // Documents whose access lists leave the reader out, when these collections have any: both legs search
        // only the visible ones, the facets count only those, and query understanding reads only them (their names
        // and numbers must not leak either).
        let visible = req.reader_groups.as_deref().and_then(|g| metas.visible(&ids, g));
        let readable = Readable { names: &names, visible: visible.as_deref() };
        let understood = self.understand(query, readable, req.exact, req.synonym_weight)?;
        Ok(SearchPlan {
            query: query.to_string(),
            filter,
            limit: req
                .limit
                .unwrap_or(self.retrieval.cfg.search.default_limit)
                .clamp(1, self.retrieval.cfg.search.max_limit),
            wants_dense: req.method != Some(crate::fusion::Method::Bm25),
            spec: (req.method, req.dense_weight),
            cols,
            names,
            metas,
            visible,
            understood,
        })
    }

    /// Query understanding as every caller gets it, the gate included: folding, the synonym table at the weight
    /// asked for (none when `exact`), and the pinyin reading of an all-letters query.
    pub(crate) fn understand(
        &self,
        query: &str,
        readable: Readable<'_>,
        exact: bool,
        synonym_weight: Option<f32>,
    ) -> Result<Understood> {
        let _span = tracing::debug_span!("understand").entered();
        let table = self.synonym_table()?;
        let weight =
            if exact { 0.0 } else { synonym_weight.unwrap_or(self.retrieval.live.synonym_weight(self.retrieval.cfg)) };
        let (plan, pinyin_of, did_you_mean) =
            self.plan_query(query, &table, readable, weight.clamp(0.0, 1.0), !exact)?;
        Ok(Understood { plan, pinyin_of, did_you_mean })
    }

    /// The ranking a page is cut from and, with a filter, the unfiltered one whose documents the filtered
    /// dimensions' facets count (from the same pass of each leg, [`crate::hybrid::Retrieval::rank_filtered`]).
    fn rankings_for(
        &self,
        plan: &SearchPlan,
        qvec: Option<(&[f32], &crate::models::ModelRecord)>,
        metas: &crate::facets::MetaIndex,
        visible: Option<&std::sync::Arc<crate::facets::DocSet>>,
    ) -> Result<(Option<crate::hybrid::Ranking>, crate::hybrid::Ranking)> {
        let terms = &plan.understood.plan.terms;
        let mut spec = crate::fusion::RankSpec {
            method: plan.spec.0,
            dense_weight: plan.spec.1,
            depth: self.ranking_depth(),
            keep: visible,
        };
        if plan.filter.is_empty() {
            return Ok((None, self.retrieval.rank(terms, qvec, &plan.cols, &spec)?));
        }
        let ids: Vec<i64> = plan.cols.iter().map(|c| c.id).collect();
        match visible {
            None => {
                let admitted = metas.admitted(&plan.filter, &ids);
                spec.keep = Some(&admitted);
                let (everything, filtered) = self.retrieval.rank_filtered(terms, qvec, &plan.cols, &spec)?;
                Ok((Some(everything), filtered))
            }
            Some(visible) => {
                // Two passes: the visible ranking (which the facets of the filtered dimensions count) and the
                // filtered one within it.
                let admitted = std::sync::Arc::new(metas.admitted(&plan.filter, &ids).intersect(visible));
                let everything = self.retrieval.rank(terms, qvec, &plan.cols, &spec)?;
                spec.keep = Some(&admitted);
                let mut filtered = self.retrieval.rank(terms, qvec, &plan.cols, &spec)?;
                filtered.times += everything.times;
                Ok((Some(everything), filtered))
            }
        }
    }

    /// The chunks among `chunks` that hold a form of one of `matched` (the query's salient terms found), read from
    /// the chunks' text in memory; where that is too large to keep, the keyword matches of `ranking` count.
    fn answering(
        &self,
        plan: &crate::query::QueryPlan,
        matched: &[String],
        collections: &[String],
        chunks: &[i64],
        ranking: &crate::hybrid::Ranking,
    ) -> Result<rustc_hash::FxHashSet<i64>> {
        if matched.is_empty() {
            return Ok(Default::default());
        }
        let needles: Vec<String> = matched.iter().flat_map(|w| plan.forms_in_both_scripts(w)).collect();
        Ok(match self.texts.chunks_containing(&self.retrieval.store, chunks, &needles, collections)? {
            Some(found) => found,
            None => ranking.hits.iter().filter(|h| h.parts.bm25.is_some()).map(|h| h.chunk_id).collect(),
        })
    }

    /// Candidate lists (BM25, dense) of judged queries, in order, exactly as a search computes its head: each query understood as a
    /// search understands it, its folded text encoded, both legs to `depth` in `col`. `care eval`, fusion tuning
    /// and the evaluation gate score these, so they judge the ranking clinicians see.
    pub(crate) fn judged_candidates(
        &self,
        queries: &[(String, String)],
        col: &Collection,
        dense: Option<JudgedDense<'_>>,
        depth: usize,
        progress: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> Result<Vec<(Vec<Ranked>, Vec<Ranked>)>> {
        let names = [col.name.clone()];
        let mut lists = Vec::with_capacity(queries.len());
        for (i, (_, text)) in queries.iter().enumerate() {
            progress(i, queries.len())?;
            let u = self.understand(text, Readable { names: &names, visible: None }, false, None)?;
            let (_, bm25) = self.retrieval.lexical.search_pair(
                &u.plan.terms,
                Some(&names),
                depth,
                self.retrieval.cfg.search.title_boost,
                false,
                None,
            )?;
            let dense = match &dense {
                Some(d) => {
                    let v =
                        d.encoder.encode(&[u.plan.folded.as_str()], crate::encoders::TextKind::Query)?.swap_remove(0);
                    self.retrieval
                        .dense_search_in(&v, d.query, d.document, std::slice::from_ref(col), depth, None)?
                        .into_iter()
                        .map(|h| (h.chunk_id, h.document_id, h.score))
                        .collect()
                }
                None => Vec::new(),
            };
            let bm25 = bm25.into_iter().map(|h| (h.chunk_id, h.document_id, h.score)).collect();
            lists.push((bm25, dense));
        }
        progress(queries.len(), queries.len())?;
        Ok(lists)
    }

    /// The synonym table as of its version in SQLite: reloaded when an edit (from any process) bumped it.
    pub(crate) fn synonym_table(&self) -> Result<crate::versioned::Held<crate::synonyms::SynonymTable>> {
        let version = crate::synonyms::version(&self.retrieval.store.reader())?;
        let opener = self.retrieval.store.reader_opener();
        self.synonyms.get(
            version,
            |t| t.version,
            move || crate::synonyms::SynonymTable::load_from(&opener.open()?, version),
        )
    }

    /// Every document's filing, reloaded when the version in SQLite moved (an ingest, an edit or a deletion from
    /// any process).
    pub(crate) fn meta_index(&self) -> Result<crate::versioned::Held<crate::facets::MetaIndex>> {
        let version = crate::facets::MetaIndex::version(&self.retrieval.store.reader())?;
        let opener = self.retrieval.store.reader_opener();
        self.meta_index.get(
            version,
            |m| m.version,
            move || crate::facets::MetaIndex::load_from(&opener.open()?, version),
        )
    }

    /// The query as searched, with synonyms; a run of letters that is no word the reader may read nor a table term
    /// is read as pinyin initials or pinyin, the whole query (gxy → 高血压) or inside Chinese (tnb吃什么 → 糖尿病吃什么):
    /// replaced by its reading when exactly one reading occurs in readable text, otherwise the readings that occur
    /// are offered as whole queries. Returns the plan, the typed query when it was read as pinyin, and the
    /// suggestions.
    fn plan_query(
        &self,
        query: &str,
        table: &crate::synonyms::SynonymTable,
        readable: Readable<'_>,
        weight: f32,
        pinyin: bool,
    ) -> Result<(crate::query::QueryPlan, Option<String>, Vec<String>)> {
        let plan = crate::query::QueryPlan::with_synonyms(self.retrieval.lexical.jieba(), query, table, weight);
        let typed = plan.folded.trim();
        let folded = typed.to_ascii_lowercase();
        let runs = letter_runs(&folded);
        let whole = matches!(runs.as_slice(), [r] if *r == (0..folded.len()));
        // Letters among other letters and digits only (an English phrase, a dose) are not pinyin.
        if !pinyin || runs.is_empty() || !(whole || folded.chars().any(crate::text::is_cjk)) {
            return Ok((plan, None, Vec::new()));
        }
        let (mut read, mut suggestions) = (folded.clone(), Vec::new());
        let mut replaced = false;
        // From the end, so that the earlier runs' byte ranges hold while later ones are replaced.
        for run in runs.into_iter().rev() {
            let word = &folded[run.clone()];
            // Inside Chinese, only letters typed in lower case are initials: PK术 and XYY染色体 are abbreviations.
            let abbreviation = !whole && typed[run.clone()].bytes().any(|b| b.is_ascii_uppercase());
            if abbreviation
                || !(2..=24).contains(&word.len())
                || table.contains(word)
                || self.readable_has(&[word.to_string()], readable)?
            {
                continue;
            }
            match self.pinyin_readings(word, table, readable)?.as_slice() {
                [] => {}
                [only] => {
                    read.replace_range(run, only);
                    replaced = true;
                }
                many => {
                    suggestions = many
                        .iter()
                        .take(5)
                        .map(|w| {
                            let mut q = folded.clone();
                            q.replace_range(run.clone(), w);
                            q
                        })
                        .collect();
                }
            }
        }
        if !replaced {
            return Ok((plan, None, suggestions));
        }
        let plan = crate::query::QueryPlan::with_synonyms(self.retrieval.lexical.jieba(), &read, table, weight);
        Ok((plan, Some(query.trim().to_string()), if suggestions.is_empty() { vec![read] } else { suggestions }))
    }

    /// The readings of `word` (pinyin initials or pinyin) that occur in readable text, the most frequent first:
    /// those of the characters' common readings, and other readings only when none of those occurs.
    fn pinyin_readings(
        &self,
        word: &str,
        table: &crate::synonyms::SynonymTable,
        readable: Readable<'_>,
    ) -> Result<Vec<String>> {
        let (common, other) = table.pinyin_candidates(word);
        let mut readings: Vec<(usize, String)> = Vec::new();
        for list in [common, other] {
            for w in list {
                if self.readable_has(std::slice::from_ref(&w), readable)? {
                    // Counted in the index only where no access list restricts the reader (a count over documents
                    // they may not see would order by them).
                    let n = match readable.visible {
                        None => self.retrieval.lexical.chunks_with(&w, readable.names)?.max(1),
                        Some(_) => 1,
                    };
                    readings.push((n, w));
                }
            }
            if !readings.is_empty() {
                break;
            }
        }
        readings.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        Ok(readings.into_iter().map(|r| r.1).collect())
    }

    /// Drug and disease names of the query that occur nowhere the reader may read though the segmenter cut them
    /// into pieces that do (马凡综合征 into 马凡 and 综合征, 龙血竭胶囊): any stretch of the query that is a term of
    /// the medical lexicons, and runs of segments without a function word that end like a name
    /// ([`crate::lexical::name_shaped`]), are made of content words and are not two readable pieces whose second
    /// is a term itself (口腔护理 + 并发症 is a question, not a name). Overlapping candidates are one name.
    fn absent_names(&self, plan: &crate::query::QueryPlan, readable: Readable<'_>) -> Result<Vec<String>> {
        use crate::lexical::{in_medical_lexicon, is_stopword, may_begin_name, name_shaped};
        const MOST_SEGMENTS: usize = 6;
        const MOST_CHARS: usize = 16;
        let jieba = self.retrieval.lexical.jieba();
        let folded = plan.folded.to_lowercase();
        let absent = |s: &str| -> Result<bool> {
            let mut forms = vec![s.to_string()];
            let traditional = crate::query::to_traditional(s);
            if traditional != s {
                forms.push(traditional);
            }
            Ok(!self.readable_has(&forms, readable)?)
        };
        // (start, end) in characters of the query.
        let mut found: Vec<(usize, usize)> = Vec::new();
        let chars: Vec<char> = folded.chars().collect();
        let mut at = 0;
        for run in folded.split(|c: char| !crate::text::is_cjk(c)) {
            let (first, n) = (at, run.chars().count());
            at += n + 1;
            if n < 3 {
                continue;
            }
            let text = |s: usize, e: usize| -> String { chars[first + s..first + e].iter().collect() };
            // From each start, the longest lexicon term decides: what is inside a term that occurs occurs too.
            for s in 0..n {
                for e in (s + 3..=n.min(s + MOST_CHARS)).rev() {
                    let term = text(s, e);
                    if in_medical_lexicon(&term) {
                        if absent(&term)? {
                            found.push((first + s, first + e));
                        }
                        break;
                    }
                }
            }
            let segs: Vec<&str> = jieba.cut(run, false).into_iter().map(|w| w.word).collect();
            let bounds: Vec<usize> = std::iter::once(0)
                .chain(segs.iter().scan(0, |c, s| {
                    *c += s.chars().count();
                    Some(*c)
                }))
                .collect();
            for end in 1..=segs.len() {
                for start in end.saturating_sub(MOST_SEGMENTS)..end {
                    let parts = &segs[start..end];
                    let span = parts.concat();
                    if !(3..=MOST_CHARS).contains(&span.chars().count())
                        || parts.iter().any(|s| is_stopword(s))
                        || !may_begin_name(jieba, parts[0])
                        || !if crate::lexical::dosage_form(&span) {
                            parts.iter().all(|s| crate::lexical::may_stand_in_product_name(jieba, s))
                        } else {
                            parts[1..].iter().all(|s| crate::lexical::may_continue_name(jieba, s))
                        }
                        || !name_shaped(&span)
                        || !absent(&span)?
                        || self.two_readable_pieces(parts, readable)?
                    {
                        continue;
                    }
                    found.push((first + bounds[start], first + bounds[end]));
                    break;
                }
            }
        }
        // Candidates that overlap are one name seen in parts (三氯乙烯 and 氯乙烯中毒 in 三氯乙烯中毒).
        found.sort_unstable();
        let mut kept: Vec<(usize, usize)> = Vec::new();
        for (s, e) in found {
            match kept.last_mut() {
                Some(last) if s < last.1 => last.1 = last.1.max(e),
                _ => kept.push((s, e)),
            }
        }
        Ok(kept.into_iter().map(|(s, e)| chars[s..e].iter().collect()).collect())
    }

    /// Whether `parts` split into two readable pieces whose second is a clinical term of two characters or more
    /// and whose first is no modifier (口腔护理 + 并发症, 爸 + 糖尿病; not 肾性 + 骨病).
    fn two_readable_pieces(&self, parts: &[&str], readable: Readable<'_>) -> Result<bool> {
        for k in 1..parts.len() {
            let (left, right) = (parts[..k].concat(), parts[k..].concat());
            if right.chars().count() >= 2
                && !left.ends_with(['性', '型', '状'])
                && crate::lexical::is_key_term(self.retrieval.lexical.jieba(), &right)
                && self.readable_has(std::slice::from_ref(&right), readable)?
                && self.readable_has(std::slice::from_ref(&left), readable)?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The synonyms searched as the page names them (也搜索了): for a reader whom access lists restrict, only those
    /// found in a document they may see (every synonym is searched all the same).
    fn expansions_shown(&self, plan: &crate::query::QueryPlan, readable: Readable<'_>) -> Result<Vec<Expansion>> {
        let mut shown = Vec::new();
        for (term, synonyms) in &plan.expansions {
            let synonyms = match readable.visible {
                None => synonyms.clone(),
                Some(_) => {
                    let mut kept = Vec::new();
                    for s in synonyms {
                        if self.readable_has(&plan.forms_in_both_scripts(s), readable)? {
                            kept.push(s.clone());
                        }
                    }
                    kept
                }
            };
            if !synonyms.is_empty() {
                shown.push(Expansion { term: term.clone(), synonyms });
            }
        }
        Ok(shown)
    }

    /// Whether one of `forms` occurs in text the reader may read: as an index term or a substring of the chunks'
    /// text, headings and titles of the collections, and, where access lists restrict the reader, in a document
    /// they may see.
    fn readable_has(&self, forms: &[String], readable: Readable<'_>) -> Result<bool> {
        let mut found = false;
        for f in forms {
            found = found || self.retrieval.lexical.any_chunk_with(f, readable.names)?;
        }
        for f in forms {
            found = found || self.texts.contains(&self.retrieval.store, f, readable.names)?;
        }
        if found && let Some(v) = readable.visible {
            found = false;
            for f in forms {
                let lower = f.to_ascii_lowercase();
                found = found
                    || self.retrieval.store.any_admitted_chunk_contains(&lower, readable.names, |d| v.contains(d))?;
            }
        }
        Ok(found)
    }

    /// How deep the one ranking of a query goes: the deepest hit a page may ask for.
    fn ranking_depth(&self) -> usize {
        let s = &self.retrieval.cfg.search;
        s.candidates.max(s.max_offset.saturating_add(s.max_limit))
    }

    /// The hits of one page, with texts, snippets (highlighting every searched form) and evidence.
    fn page_hits(
        &self,
        plan: &crate::query::QueryPlan,
        page: &[(&Explained, usize)],
        offset: usize,
    ) -> Result<Vec<SearchHit>> {
        let ids: Vec<i64> = page.iter().map(|h| h.0.chunk_id).collect();
        let views = self.retrieval.store.chunk_views(&ids)?;
        let by_id: HashMap<i64, _> = views.into_iter().map(|v| (v.chunk_id, v)).collect();
        let shown: Vec<(&Explained, usize, &crate::store::ChunkView)> =
            page.iter().filter_map(|(h, m)| by_id.get(&h.chunk_id).map(|v| (*h, *m, v))).collect();
        let texts: Vec<&str> = shown.iter().map(|(_, _, v)| v.text.as_str()).collect();
        let snippets = self.retrieval.lexical.snippets_for(
            &plan.terms,
            &texts,
            self.retrieval.cfg.search.snippet_bytes,
            &crate::query::to_simplified,
        )?;
        let whole = |v: &crate::store::ChunkView| format!("{}\n{}\n{}", v.title, v.heading, v.text);
        Ok(shown
            .into_iter()
            .zip(snippets)
            .enumerate()
            .map(|(i, ((h, more, v), (snippet, highlights)))| SearchHit {
                rank: offset + i + 1,
                score: h.score,
                chunk_id: v.chunk_id,
                document_id: v.document_id,
                external_id: v.external_id.clone(),
                collection: v.collection.clone(),
                title: v.title.clone(),
                heading: v.heading.clone(),
                source: v.source.clone(),
                snippet,
                highlights,
                text: v.text.clone(),
                parts: h.parts,
                matched_terms: plan.terms_in(&whole(v)),
                evidence: plan.evidence_in(&whole(v)),
                dense_only: h.parts.bm25.is_none(),
                more_in_document: more,
                meta: v.meta.clone(),
                scan: v.scan,
            })
            .collect())
    }

    /// (present, missing): the query's salient terms that some chunk of `collections` holds, and its key terms that
    /// none holds, in
    /// either script (a passage in traditional characters holds 高血壓). A term is first looked up as an index term;
    /// one that is not (jieba segmented the passages around it differently) is looked for as a substring of the
    /// chunks' text, headings and titles, so "not found" is said only of text that truly occurs nowhere. The scan
    /// runs only for such terms, and stops at the first chunk.
    fn term_presence(
        &self,
        plan: &crate::query::QueryPlan,
        readable: Readable<'_>,
    ) -> Result<(Vec<String>, Vec<String>)> {
        let mut present = Vec::new();
        let mut missing = Vec::new();
        for w in &plan.salient {
            if self.readable_has(&plan.forms_in_both_scripts(w), readable)? {
                present.push(w.clone());
            } else if plan.key.contains(w) {
                missing.push(w.clone());
            }
        }
        // A name absent as a whole is named whole, in place of its absent pieces (硬化性胆管炎, not 胆管炎).
        let names = self.absent_names(plan, readable)?;
        missing.retain(|m| !names.iter().any(|n| n.contains(m.as_str())));
        missing.extend(names.into_iter().filter(|n| !present.contains(n)));
        let folded = plan.folded.to_lowercase();
        missing.sort_by_key(|m| folded.find(m.as_str()).unwrap_or(usize::MAX));
        missing.dedup();
        Ok((present, missing))
    }
}

/// The ranking with one hit per document (its best, i.e. first, passage) and how many more each document has.
fn group_by_document(hits: &[Explained]) -> (Vec<&Explained>, Vec<usize>) {
    let mut first: HashMap<i64, usize> = HashMap::new();
    let mut out: Vec<&Explained> = Vec::new();
    let mut more: Vec<usize> = Vec::new();
    for h in hits {
        match first.get(&h.document_id) {
            Some(&i) => more[i] += 1,
            None => {
                first.insert(h.document_id, out.len());
                out.push(h);
                more.push(0);
            }
        }
    }
    (out, more)
}

/// The byte ranges of the runs of ASCII lower-case letters in `s`.
fn letter_runs(s: &str) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, b) in s.bytes().enumerate().chain(std::iter::once((s.len(), b' '))) {
        match (b.is_ascii_lowercase(), start) {
            (true, None) => start = Some(i),
            (false, Some(s0)) => {
                runs.push(s0..i);
                start = None;
            }
            _ => {}
        }
    }
    runs
}
