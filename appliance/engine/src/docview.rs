//! The document view: a document's chunks read back as the text they came from, its light markup rendered as
//! structure, and the query's terms marked.
//!
//! Ingestion keeps structure in the stored text as markup that the chunker and BM25 are indifferent to (see
//! [`crate::ingest`]): one line per list item, prefixed `3. ` (numbered) or `• ` (bulleted), and one line per
//! table row, `| cell | cell |`. Markdown files already read that way (`- item`, `1. item`, pipe tables with a
//! `|---|` row under the header), and so do documents stored before this markup existed, whose lines become
//! paragraphs. [`blocks`] turns the lines back into paragraphs, lists and tables; the server's template escapes every
//! piece of text, so nothing from an uploaded file is ever emitted as HTML.
//!
//! Chunks repeat the end of the previous chunk (the overlap); [`new_text`] keeps only what each chunk adds, so the
//! document reads once, and each chunk is still its own section (the anchor search hits link to).

/// The zone label pages show beside times (kept in `clock`, which sets the offset).
pub use crate::clock::offset_label;
use std::collections::HashSet;

use jieba_rs::Jieba;
use serde::Serialize;

use crate::feedback::{DocumentChunk, DocumentView};
use crate::lexical::{is_stopword, tokenize};

/// A run of text, marked when it is a query term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Part {
    pub text: String,
    pub mark: bool,
}

/// A paragraph, list item, table cell or heading: text runs, some of them marked.
pub type Inline = Vec<Part>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Block {
    Paragraph {
        parts: Inline,
    },
    Quote {
        parts: Inline,
    },
    /// `start`: the number of the first item of a numbered list (a list cut by a chunk boundary goes on counting).
    List {
        ordered: bool,
        start: u64,
        items: Vec<Inline>,
    },
    /// `header`: the row above a Markdown `|---|` line.
    Table {
        header: Option<Vec<Inline>>,
        rows: Vec<Vec<Inline>>,
    },
    Rule,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Heading {
    /// 2..=6 (the document's title is the page's h1).
    pub level: usize,
    pub parts: Inline,
}

/// One chunk of the document: the headings that start before it, and what it adds to the text as blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Section {
    pub chunk_id: i64,
    pub headings: Vec<Heading>,
    pub blocks: Vec<Block>,
    /// 识别自扫描件 · 第 N 页 where a scanned page starts, or where a passage was read with little confidence;
    /// empty otherwise.
    pub scanned: String,
}

/// Marks a query's terms in text the way search snippets do: jieba search-mode tokens of the text that are tokens
/// of the query (function words excepted), overlapping and adjacent tokens merged into one mark.
pub struct Highlighter<'a> {
    jieba: &'a Jieba,
    words: HashSet<String>,
}

impl<'a> Highlighter<'a> {
    pub fn new(jieba: &'a Jieba, query: &str) -> Self {
        let query = crate::text::normalize(query);
        let words = tokenize(jieba, &query).into_iter().map(|t| t.2).filter(|w| !is_stopword(w)).collect();
        Highlighter { jieba, words }
    }

    /// A highlighter for the given terms (lower-cased), e.g. a query's expansions.
    pub fn with_words(jieba: &'a Jieba, words: impl IntoIterator<Item = String>) -> Self {
        Highlighter { jieba, words: words.into_iter().map(|w| w.to_lowercase()).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The byte ranges of `text` to mark, ascending and disjoint.
    pub fn ranges(&self, text: &str) -> Vec<(usize, usize)> {
        if self.words.is_empty() {
            return Vec::new();
        }
        // A passage's traditional words are marked for their simplified query terms (高血壓 for 高血压).
        crate::lexical::mark_ranges(self.jieba, text, &|w| {
            self.words.contains(w) || (!w.is_ascii() && self.words.contains(&crate::query::to_simplified(w)))
        })
    }

    /// `text` as runs, the query's terms marked.
    pub fn mark(&self, text: &str) -> Inline {
        let mut parts = Vec::new();
        let mut pos = 0;
        for (s, e) in self.ranges(text) {
            if s < pos || !text.is_char_boundary(s) || !text.is_char_boundary(e) {
                continue;
            }
            if s > pos {
                parts.push(Part { text: text[pos..s].to_string(), mark: false });
            }
            parts.push(Part { text: text[s..e].to_string(), mark: true });
            pos = e;
        }
        if pos < text.len() {
            parts.push(Part { text: text[pos..].to_string(), mark: false });
        }
        parts
    }
}

/// What `chunk` adds to the document after `prev`: its text without the sentences it repeats from the end of the
/// previous chunk. Chunk texts are their spans of the document trimmed, so the repeated part is found from the
/// character offsets and checked against the previous chunk's end; when the check fails, the whole text is kept.
pub fn new_text<'c>(prev: Option<&DocumentChunk>, chunk: &'c DocumentChunk) -> &'c str {
    let text = chunk.text.as_str();
    let Some(prev) = prev else { return text };
    let overlap = prev.char_end - chunk.char_start;
    if overlap <= 0 {
        return text;
    }
    // Characters trimmed off the span: at most one space before (normalised text has no runs of whitespace and
    // no line starts with one) plus any after.
    let trimmed = ((chunk.char_end - chunk.char_start).max(0) as usize).saturating_sub(text.chars().count());
    for lead in 0..=trimmed.min(1) {
        let skip = (overlap as usize).saturating_sub(lead);
        let at = text.char_indices().nth(skip).map_or(text.len(), |(i, _)| i);
        let (head, rest) = text.split_at(at);
        if !head.trim().is_empty() && prev.text.ends_with(head.trim_end()) {
            return rest.trim_start();
        }
    }
    text
}

/// How a line of stored text reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line<'t> {
    /// Number, numbering style (1: `1.`/`1、`, 2: `1)`, 3: `(1)`), item text.
    Ordered(u64, u8, &'t str),
    Bullet(&'t str),
    Row(Vec<&'t str>),
    Separator,
    Quote(&'t str),
    Rule,
    Text(&'t str),
}

const BULLETS: &[char] = &['•', '●', '○', '◦', '▪', '■', '□', '◆', '◇', '·', '‣', '∙'];

fn ordered(line: &str) -> Option<(u64, u8, &str)> {
    let (paren, body) = match line.strip_prefix('(').or_else(|| line.strip_prefix('（')) {
        Some(r) => (true, r),
        None => (false, line),
    };
    let digits = body.bytes().take_while(u8::is_ascii_digit).count();
    if !(1..=3).contains(&digits) {
        return None;
    }
    let n: u64 = body[..digits].parse().ok()?;
    let after = &body[digits..];
    let (style, rest) = if paren {
        (3, after.strip_prefix(')').or_else(|| after.strip_prefix('）'))?)
    } else if let Some(r) = after.strip_prefix('.') {
        // "1.5 mg" is a number, not an item.
        if r.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        (1, r)
    } else if let Some(r) = after.strip_prefix('、') {
        (1, r)
    } else {
        (2, after.strip_prefix(')').or_else(|| after.strip_prefix('）'))?)
    };
    let rest = rest.trim_start();
    (!rest.is_empty()).then_some((n, style, rest))
}

fn bullet(line: &str) -> Option<&str> {
    let mut chars = line.chars();
    let c = chars.next()?;
    let rest = chars.as_str();
    if !(BULLETS.contains(&c) || (matches!(c, '-' | '*' | '+') && rest.starts_with(' '))) {
        return None;
    }
    let item = rest.trim_start();
    (!item.is_empty()).then_some(item)
}

fn is_separator(line: &str) -> bool {
    line.contains('|') && line.contains('-') && line.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

fn cells(line: &str) -> Vec<&str> {
    let inner = line.strip_prefix('|').unwrap_or(line);
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    inner.split('|').map(str::trim).collect()
}

fn classify<'t>(line: &'t str, next: Option<&str>, in_table: bool) -> Line<'t> {
    if is_separator(line) {
        return Line::Separator;
    }
    let piped = line.len() > 1 && line.starts_with('|') && line.ends_with('|');
    if piped || (line.contains('|') && (in_table || next.is_some_and(is_separator))) {
        return Line::Row(cells(line));
    }
    if line.len() >= 3 && (line.chars().all(|c| c == '-') || line.chars().all(|c| c == '*')) {
        return Line::Rule;
    }
    if let Some((n, style, rest)) = ordered(line) {
        return Line::Ordered(n, style, rest);
    }
    if let Some(rest) = bullet(line) {
        return Line::Bullet(rest);
    }
    if let Some(rest) = line.strip_prefix('>') {
        return Line::Quote(rest.trim_start());
    }
    Line::Text(line)
}

/// The blocks of a stretch of stored text, each piece of text passed through `mark`.
pub fn blocks(text: &str, mark: &dyn Fn(&str) -> Inline) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let mut out: Vec<Block> = Vec::new();
    // The numbering style and last number of the list being built, when the last block is a numbered list.
    let mut last_ordered: Option<(u8, u64)> = None;
    let mut in_table = false;
    for (i, line) in lines.iter().enumerate() {
        let kind = classify(line, lines.get(i + 1).copied(), in_table);
        in_table = matches!(kind, Line::Row(_) | Line::Separator);
        let ordered_now = if let Line::Ordered(n, style, _) = &kind { Some((*style, *n)) } else { None };
        match kind {
            Line::Ordered(n, style, item) => match out.last_mut() {
                Some(Block::List { ordered: true, items, .. }) if last_ordered == Some((style, n.wrapping_sub(1))) => {
                    items.push(mark(item));
                }
                _ => out.push(Block::List { ordered: true, start: n, items: vec![mark(item)] }),
            },
            Line::Bullet(item) => match out.last_mut() {
                Some(Block::List { ordered: false, items, .. }) => items.push(mark(item)),
                _ => out.push(Block::List { ordered: false, start: 1, items: vec![mark(item)] }),
            },
            Line::Row(cs) => {
                let row: Vec<Inline> = cs.into_iter().map(mark).collect();
                let header_next = lines.get(i + 1).is_some_and(|l| is_separator(l));
                match out.last_mut() {
                    Some(Block::Table { rows, .. }) if !header_next => rows.push(row),
                    _ if header_next => out.push(Block::Table { header: Some(row), rows: Vec::new() }),
                    _ => out.push(Block::Table { header: None, rows: vec![row] }),
                }
            }
            Line::Separator => {}
            Line::Quote(t) => out.push(Block::Quote { parts: mark(t) }),
            Line::Rule => out.push(Block::Rule),
            Line::Text(t) => out.push(Block::Paragraph { parts: mark(t) }),
        }
        last_ordered = ordered_now.or(match out.last() {
            Some(Block::List { ordered: true, .. }) => last_ordered,
            _ => None,
        });
    }
    out
}

/// The document as sections, one per chunk, headings placed where the heading path changes (the document's title,
/// already the page's h1, is not repeated).
pub fn sections(doc: &DocumentView, h: &Highlighter<'_>) -> Vec<Section> {
    let mark = |t: &str| h.mark(t);
    let mut out = Vec::with_capacity(doc.chunks.len());
    let mut prev_path: Vec<&str> = Vec::new();
    let mut prev: Option<&DocumentChunk> = None;
    for c in &doc.chunks {
        let mut path: Vec<&str> =
            if c.heading.is_empty() { Vec::new() } else { c.heading.split(" > ").map(str::trim).collect() };
        if path.first().is_some_and(|p| *p == doc.title.trim()) {
            path.remove(0);
        }
        let same = path.iter().zip(&prev_path).take_while(|(a, b)| a == b).count();
        let headings = path[same..]
            .iter()
            .enumerate()
            .map(|(k, t)| Heading { level: (same + k + 2).min(6), parts: h.mark(t) })
            .collect();
        let new_page = c.scan.is_some_and(|s| prev.and_then(|p| p.scan).is_none_or(|p| p.page != s.page));
        let scanned = c.scan.filter(|s| new_page || s.uncertain()).map(|s| s.label()).unwrap_or_default();
        out.push(Section { chunk_id: c.chunk_id, headings, blocks: blocks(new_text(prev, c), &mark), scanned });
        prev_path = path;
        prev = Some(c);
    }
    out
}

/// How many runs of the view are marked.
pub fn marked_count(sections: &[Section]) -> usize {
    fn n(parts: &Inline) -> usize {
        parts.iter().filter(|p| p.mark).count()
    }
    let mut total = 0;
    for s in sections {
        total += s.headings.iter().map(|h| n(&h.parts)).sum::<usize>();
        for b in &s.blocks {
            total += match b {
                Block::Paragraph { parts } | Block::Quote { parts } => n(parts),
                Block::List { items, .. } => items.iter().map(n).sum(),
                Block::Table { header, rows } => {
                    header.iter().flatten().map(n).sum::<usize>() + rows.iter().flatten().map(n).sum::<usize>()
                }
                Block::Rule => 0,
            };
        }
    }
    total
}

/// A stored RFC 3339 time (UTC) as the hospital reads it: `2026-11-26 21:05` at `offset_minutes` from UTC. A
/// value that does not parse is shown as stored.
pub fn local_time(rfc3339: &str, offset_minutes: i32) -> String {
    use time::format_description::well_known::Rfc3339;
    let Ok(t) = time::OffsetDateTime::parse(rfc3339, &Rfc3339) else { return rfc3339.to_string() };
    let offset =
        time::UtcOffset::from_whole_seconds(offset_minutes.clamp(-1080, 1080) * 60).unwrap_or(time::UtcOffset::UTC);
    let t = t.to_offset(offset);
    format!("{:04}-{:02}-{:02} {:02}:{:02}", t.year(), u8::from(t.month()), t.day(), t.hour(), t.minute())
}

/// The document view's sections for `doc`, with `query`'s terms marked as a search marks them: folded, in
/// either script, and with the synonyms the table adds (no marks for an empty query).
pub fn document_sections(searcher: crate::search::Searcher<'_>, doc: &DocumentView, query: &str) -> Vec<Section> {
    let jieba = searcher.retrieval.lexical.jieba();
    let plan = match searcher.synonym_table() {
        Ok(t) => crate::query::QueryPlan::with_synonyms(
            jieba,
            query,
            &t,
            searcher.retrieval.cfg.search.synonym_weight.clamp(0.0, 1.0),
        ),
        Err(_) => crate::query::QueryPlan::new(jieba, query),
    };
    let h = Highlighter::with_words(jieba, plan.terms.into_iter().map(|t| t.0).filter(|w| !is_stopword(w)));
    sections(doc, &h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(t: &str) -> Inline {
        vec![Part { text: t.to_string(), mark: false }]
    }

    fn texts(parts: &[Inline]) -> Vec<String> {
        parts.iter().map(|p| p.iter().map(|r| r.text.as_str()).collect()).collect()
    }

    #[test]
    fn lines_become_lists_tables_and_paragraphs() {
        let text = "禁忌症如下。\n1. 肾功能不全。\n2. 严重感染。\n3、过敏者。\n• 注意一\n- 注意二\n\
                    | 药物 | 剂量 |\n|---|---|\n| 二甲双胍 | 500 mg |\n| 阿司匹林 | |\n剂量 1.5 mg。\n> 仅供演示";
        let b = blocks(text, &plain);
        assert_eq!(b.len(), 6, "{b:#?}");
        assert_eq!(b[0], Block::Paragraph { parts: plain("禁忌症如下。") });
        let Block::List { ordered: true, start: 1, items } = &b[1] else { panic!("{:?}", b[1]) };
        assert_eq!(texts(items), ["肾功能不全。", "严重感染。", "过敏者。"]);
        let Block::List { ordered: false, items, .. } = &b[2] else { panic!("{:?}", b[2]) };
        assert_eq!(texts(items), ["注意一", "注意二"]);
        let Block::Table { header: Some(h), rows } = &b[3] else { panic!("{:?}", b[3]) };
        assert_eq!(texts(h), ["药物", "剂量"]);
        assert_eq!(rows.len(), 2);
        assert_eq!(texts(&rows[0]), ["二甲双胍", "500 mg"]);
        assert_eq!(texts(&rows[1]), ["阿司匹林", ""]);
        assert_eq!(b[4], Block::Paragraph { parts: plain("剂量 1.5 mg。") });
        assert_eq!(b[5], Block::Quote { parts: plain("仅供演示") });
    }

    #[test]
    fn numbering_continues_or_restarts() {
        let b = blocks("4. 丁\n5. 戊\n1. 甲\n(1) 子\n(2) 丑\n2019.10 修订", &plain);
        let starts: Vec<(u64, usize)> = b
            .iter()
            .filter_map(|b| {
                if let Block::List { ordered: true, start, items } = b { Some((*start, items.len())) } else { None }
            })
            .collect();
        assert_eq!(starts, [(4, 2), (1, 1), (1, 2)]);
        assert!(matches!(b.last(), Some(Block::Paragraph { .. })), "{b:?}");
    }

    #[test]
    fn overlap_is_shown_once() {
        let doc = "一二三四五六七八九十。甲乙丙丁戊己庚辛壬癸。子丑寅卯辰巳午未申酉。";
        let cfg = crate::text::ChunkConfig { max_chars: 22, overlap_chars: 11, ..Default::default() };
        let chunks: Vec<DocumentChunk> = crate::text::chunk(doc, &cfg)
            .into_iter()
            .enumerate()
            .map(|(i, c)| DocumentChunk {
                chunk_id: i as i64,
                ordinal: i as i64,
                heading: c.heading,
                text: c.text,
                char_start: c.char_start as i64,
                char_end: c.char_end as i64,
                scan: None,
            })
            .collect();
        assert_eq!(chunks.len(), 2);
        let joined: String = [new_text(None, &chunks[0]), new_text(Some(&chunks[0]), &chunks[1])].concat();
        assert_eq!(joined, doc);
        // Lines and a space before a sentence: what each chunk adds still joins up to the text.
        let doc = "第一行。\n1. 甲项。 乙句。\n2. 丙项。\n3. 丁项。\n4. 戊项。";
        let cfg = crate::text::ChunkConfig { max_chars: 16, overlap_chars: 8, ..Default::default() };
        let chunks: Vec<DocumentChunk> = crate::text::chunk(doc, &cfg)
            .into_iter()
            .map(|c| DocumentChunk {
                chunk_id: 0,
                ordinal: 0,
                heading: c.heading,
                text: c.text,
                char_start: c.char_start as i64,
                char_end: c.char_end as i64,
                scan: None,
            })
            .collect();
        assert!(chunks.len() > 2, "{chunks:?}");
        let mut prev = None;
        let mut all = String::new();
        for c in &chunks {
            all.push_str(new_text(prev, c));
            prev = Some(c);
        }
        let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        assert_eq!(squash(&all), squash(doc), "{chunks:?}");
    }

    #[test]
    fn marks_query_terms_and_local_times() {
        let (jieba, _) = crate::lexical::build_jieba(None).unwrap();
        let h = Highlighter::new(&jieba, "二甲双胍的禁忌症");
        let parts = h.mark("二甲双胍禁忌症：肾功能不全");
        assert_eq!(parts[0], Part { text: "二甲双胍禁忌症".into(), mark: true });
        assert!(!parts[1].mark);
        assert_eq!(h.mark("的").iter().filter(|p| p.mark).count(), 0, "function words are not marked");
        assert_eq!(Highlighter::new(&jieba, "").mark("二甲双胍"), plain("二甲双胍"));
        assert_eq!(local_time("2026-11-26T13:05:09Z", 480), "2026-11-26 21:05");
        assert_eq!(local_time("2026-11-26T20:05:00Z", 480), "2026-11-27 04:05");
        assert_eq!(local_time("not a time", 480), "not a time");
        assert_eq!(offset_label(480), "UTC+8");
        assert_eq!(offset_label(-210), "UTC-3:30");
    }

    proptest::proptest! {
        /// Whatever the text and chunk sizes, what each chunk adds joins up to the document (less its heading lines,
        /// which are not chunk text; whitespace aside), and reading it as blocks never panics.
        #[test]
        fn chunks_read_once_and_blocks_never_panic(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "甲", "乙丙", "。", "；", "\n", " ", "1. ", "(2) ", "• ", "- ", "| ", " | ", "|---|", "## 节\n", "> ", "12",
            ]), 0..80),
            max in 4usize..40,
            overlap in 0usize..20,
        ) {
            let doc = crate::text::normalize(&pieces.concat());
            let cfg = crate::text::ChunkConfig { max_chars: max, overlap_chars: overlap, ..Default::default() };
            let chunks: Vec<DocumentChunk> = crate::text::chunk_measured(&doc, cfg.max_chars, cfg.overlap_chars, &crate::text::Chars)
                .into_iter()
                .map(|c| DocumentChunk {
                    chunk_id: 0,
                    ordinal: 0,
                    heading: c.heading,
                    text: c.text,
                    char_start: c.char_start as i64,
                    char_end: c.char_end as i64,
                    scan: None,
                })
                .collect();
            let mut prev = None;
            let mut all = String::new();
            for c in &chunks {
                let t = new_text(prev, c);
                let _ = blocks(t, &plain);
                all.push_str(t);
                prev = Some(c);
            }
            let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
            let body: String = doc.lines().filter(|l| {
                let level = l.chars().take_while(|&c| c == '#').count();
                !((1..=6).contains(&level) && l.chars().nth(level) == Some(' '))
            }).collect::<Vec<_>>().join("\n");
            proptest::prop_assert_eq!(squash(&all), squash(&body));
        }
    }
}
