//! The chunks' text in memory, for the search page's "not found" check.
//!
//! A query term that the lexical index does not hold as a term (jieba cut the passages around it differently) is
//! looked for as a substring of the text, heading and title of every chunk of the readable collections
//! ([`TextPresence::contains`]). In SQLite that reads every row: 30–40 ms per term for kuake_qtr's 32,171 short
//! passages in a release build, paid again for the term's traditional form and its synonyms, on every search with
//! such a term. Here it is one SIMD substring search (`memchr::memmem`) over a buffer per collection.
//!
//! An absent term is the costly case: the whole buffer is read to say "nowhere", and the search page's absent-name
//! check asks for a dozen spans of every query. Each collection therefore also keeps, per character pair, the
//! chunks holding it; a needle is looked for only in the chunks holding all its pairs, which for an absent name is
//! usually none (one lookup per pair). A pair common enough that its chunks are a large share of the collection
//! sends the needle back to the plain scan, which is then as fast per chunk.
//!
//! The copy follows the table: chunks added since are appended (ingest only adds rows); a deletion, counted by a
//! trigger (migration 16), rebuilds it. Beyond [`MAX_BYTES`] of text no copy is kept and SQLite answers.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use super::Store;
use crate::error::Result;

/// Text and its pair index kept in memory at most, all collections together; beyond it the check scans SQLite.
pub const MAX_BYTES: usize = 512 << 20;

/// The newest chunk id and the number of chunk rows ever deleted: equal stamps, the same chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkStamp {
    pub newest: i64,
    pub deletions: i64,
}

/// Words remembered as absent, at most (the map is emptied when full).
const ABSENT_WORDS_MAX: usize = 20_000;

/// Whether words occur in the chunks' text: the copy in memory ([`TextImage`], or SQLite when the text is too large
/// to keep), and the words found absent, each remembered with the chunks' stamp then. Such a word is still absent
/// from those chunks while no chunk row has been deleted since (a new chunk could then reuse a scanned id), so
/// asking again reads only the chunks added since: clinicians' words that occur nowhere recur across queries.
#[derive(Default)]
pub(crate) struct TextPresence {
    image: TextImage,
    absent: Mutex<HashMap<(String, String), ChunkStamp>>,
}

impl TextPresence {
    /// Whether some chunk text, heading or title of `collections` contains `word` (ASCII case folded).
    pub(crate) fn contains(&self, store: &Store, word: &str, collections: &[String]) -> Result<bool> {
        let key = (word.to_string(), collections.join("\u{1f}"));
        let lock = || self.absent.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = store.chunk_stamp()?;
        let after = lock()
            .get(&key)
            .filter(|scanned| scanned.deletions == stamp.deletions)
            .map_or(0, |scanned| scanned.newest.min(stamp.newest));
        if after == stamp.newest {
            return Ok(false);
        }
        let found = match self.image.contains(store, stamp, word, collections, after)? {
            Some(found) => found,
            None => store.any_chunk_contains(word, collections, after)?,
        };
        let mut absent = lock();
        if found {
            absent.remove(&key);
        } else {
            if absent.len() >= ABSENT_WORDS_MAX {
                absent.clear();
            }
            absent.insert(key, stamp);
        }
        Ok(found)
    }

    /// The chunks among `ids` (of `collections`) whose title, heading or text holds one of `needles` (folded; a
    /// Latin needle as a whole word); None when the text is too large to keep.
    pub(crate) fn chunks_containing(
        &self,
        store: &Store,
        ids: &[i64],
        needles: &[String],
        collections: &[String],
    ) -> Result<Option<rustc_hash::FxHashSet<i64>>> {
        self.image.chunks_containing(store, store.chunk_stamp()?, ids, needles, collections)
    }

    /// Whether `word` is remembered as absent (for any collections).
    #[cfg(test)]
    pub(crate) fn remembers_absent(&self, word: &str) -> bool {
        self.absent.lock().unwrap().keys().any(|k| k.0 == word)
    }
}

#[derive(Default)]
struct TextImage {
    inner: RwLock<Image>,
    /// Held by the one search rebuilding the copy after a deletion (see [`TextImage::current`]).
    rebuilding: std::sync::Mutex<()>,
}

#[derive(Default)]
struct Image {
    stamp: Option<ChunkStamp>,
    /// The newest chunk copied; can be newer than `stamp` (rows committed between the two reads).
    copied_to: i64,
    bytes: usize,
    too_large: bool,
    collections: HashMap<String, Texts>,
}

#[derive(Default)]
struct Texts {
    /// `title \0 heading \0 text \0` of each chunk, ASCII letters lower-cased (as SQLite's `lower()` folds).
    buf: Vec<u8>,
    /// (chunk id, offset of its title in `buf`), ids ascending.
    starts: Vec<(i64, usize)>,
    /// For each pair of adjacent characters of a field ([`pair`]), the positions in `starts` of the chunks holding
    /// it, ascending.
    pairs: rustc_hash::FxHashMap<u64, Vec<u32>>,
}

/// Bytes counted for each posting and for each distinct pair (the map's entry and its vector's header).
const POSTING_BYTES: usize = 4;
const PAIR_BYTES: usize = 48;

/// The key of two adjacent characters.
fn pair(a: char, b: char) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

/// The character pairs of `field`, in order, repeats kept (no pair spans two fields: a needle holds no NUL).
fn pairs_of(field: &str, into: &mut Vec<u64>) {
    let mut chars = field.chars().peekable();
    while let (Some(a), Some(&b)) = (chars.next(), chars.peek()) {
        into.push(pair(a, b));
    }
}

impl TextImage {
    /// Whether a chunk of `collections` newer than `after_chunk` contains `needle`, ASCII case folded (what
    /// [`Store::any_chunk_contains`] answers), as of `stamp`; None when the text is too large to keep.
    fn contains(
        &self,
        store: &Store,
        stamp: ChunkStamp,
        needle: &str,
        collections: &[String],
        after_chunk: i64,
    ) -> Result<Option<bool>> {
        Ok(self.current(store, stamp)?.and_then(|image| image.find(needle, collections, after_chunk)))
    }

    /// The copy as of `stamp`. Chunks added since are appended under the write lock (little to read); after a
    /// deletion the copy is rebuilt from every chunk, which takes long for a large library: one caller rebuilds it
    /// beside the lock while the others go on with the copy as it was (it may still hold the deleted chunks, which
    /// no ranking returns any more), so a deletion never stalls every search. None while the copy is not as of
    /// `stamp` (the callers then ask SQLite, as when the text is too large to keep).
    fn current(&self, store: &Store, stamp: ChunkStamp) -> Result<Option<std::sync::RwLockReadGuard<'_, Image>>> {
        let read = || self.inner.read().unwrap_or_else(|p| p.into_inner());
        let held = read().stamp;
        if held == Some(stamp) {
            return Ok(Some(read()));
        }
        if held.is_none_or(|h| h.deletions == stamp.deletions) {
            let mut image = self.inner.write().unwrap_or_else(|p| p.into_inner());
            if image.stamp != Some(stamp) {
                image.refresh(store, stamp)?;
            }
        } else if let Ok(_turn) = self.rebuilding.try_lock() {
            let mut fresh = Image::default();
            fresh.refresh(store, stamp)?;
            *self.inner.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        }
        let image = read();
        Ok((image.stamp == Some(stamp)).then_some(image))
    }

    /// The chunks among `ids` (of `collections`) whose title, heading or text holds one of `needles` (folded; a
    /// Latin needle as a whole word), as of `stamp`; None when the text is too large to keep.
    fn chunks_containing(
        &self,
        store: &Store,
        stamp: ChunkStamp,
        ids: &[i64],
        needles: &[String],
        collections: &[String],
    ) -> Result<Option<rustc_hash::FxHashSet<i64>>> {
        Ok(self.current(store, stamp)?.and_then(|image| image.holding(ids, needles, collections)))
    }
}

impl Image {
    fn refresh(&mut self, store: &Store, stamp: ChunkStamp) -> Result<()> {
        let same_rows = self.stamp.is_some_and(|s| s.deletions == stamp.deletions);
        if !same_rows {
            *self = Image::default();
        } else if self.too_large {
            // Rows were only added: still too large, and nothing to read.
            self.stamp = Some(stamp);
            return Ok(());
        }
        let (mut bytes, mut copied_to, mut too_large) = (self.bytes, self.copied_to, false);
        let collections = &mut self.collections;
        store.for_each_chunk_text(self.copied_to, |id, collection, parts| {
            let add = parts.iter().map(|p| p.len() + 1).sum::<usize>();
            if bytes + add > MAX_BYTES {
                too_large = true;
                return false;
            }
            bytes += add;
            copied_to = id;
            let texts = match collections.get_mut(collection) {
                Some(t) => t,
                None => collections.entry(collection.to_string()).or_default(),
            };
            bytes += texts.push(id, &parts);
            true
        })?;
        if too_large {
            tracing::info!(max_bytes = MAX_BYTES, "chunk texts too large to keep in memory; absent terms scan SQLite");
            *self = Image { too_large: true, ..Image::default() };
        } else {
            (self.bytes, self.copied_to) = (bytes, copied_to);
        }
        self.stamp = Some(stamp);
        Ok(())
    }

    fn holding(&self, ids: &[i64], needles: &[String], collections: &[String]) -> Option<rustc_hash::FxHashSet<i64>> {
        if self.too_large {
            return None;
        }
        let texts: Vec<&Texts> = collections.iter().filter_map(|c| self.collections.get(c)).collect();
        let chunk = |id: i64| texts.iter().find_map(|t| t.position(id).map(|at| t.chunk(at)));
        let needles = Needles::new(needles)?;
        Some(ids.iter().copied().filter(|&id| chunk(id).is_some_and(|text| needles.any_in(text))).collect())
    }

    fn find(&self, needle: &str, collections: &[String], after_chunk: i64) -> Option<bool> {
        if self.too_large {
            return None;
        }
        // A NUL cannot be in a needle: it separates the fields, which SQLite compares one by one.
        if needle.is_empty() || needle.contains('\0') {
            return Some(false);
        }
        let folded = needle.to_ascii_lowercase();
        let finder = memchr::memmem::Finder::new(folded.as_bytes());
        let mut needle_pairs = Vec::new();
        pairs_of(&folded, &mut needle_pairs);
        Some(collections.iter().filter_map(|c| self.collections.get(c)).any(|t| {
            let first = t.starts.partition_point(|&(id, _)| id <= after_chunk);
            match t.candidates(&needle_pairs, first) {
                Some(chunks) => chunks.into_iter().any(|at| finder.find(t.chunk(at as usize)).is_some()),
                None => t.starts.get(first).is_some_and(|&(_, from)| finder.find(&t.buf[from..]).is_some()),
            }
        }))
    }
}

/// The needles of [`Image::holding`], looked for in the copy's bytes as [`crate::text::contains_term`] looks for
/// each in text: a Latin needle only where no ASCII letter or digit touches it. All of them in one pass over a
/// chunk (Aho-Corasick): a ranking is a thousand chunks and a query's terms, in both scripts and with their
/// synonyms, a dozen needles, on every search. The bytes need no UTF-8 check: a needle is whole characters, so a
/// match starts and ends on character boundaries, and the byte before or after it is an ASCII letter or digit
/// exactly when that character is one.
struct Needles {
    matcher: aho_corasick::AhoCorasick,
    latin: Vec<bool>,
    any_latin: bool,
}

impl Needles {
    fn new(needles: &[String]) -> Option<Self> {
        let folded: Vec<String> = needles.iter().filter(|n| !n.is_empty()).map(|n| n.to_ascii_lowercase()).collect();
        let latin: Vec<bool> = folded.iter().map(|n| n.starts_with(|c: char| c.is_ascii_alphanumeric())).collect();
        let matcher = aho_corasick::AhoCorasick::new(&folded).ok()?;
        Some(Needles { matcher, any_latin: latin.contains(&true), latin })
    }

    fn any_in(&self, hay: &[u8]) -> bool {
        if !self.any_latin {
            return self.matcher.is_match(hay);
        }
        let touches = |at: Option<&u8>| at.is_some_and(u8::is_ascii_alphanumeric);
        self.matcher.find_overlapping_iter(hay).any(|m| {
            !self.latin[m.pattern().as_usize()]
                || !touches(m.start().checked_sub(1).and_then(|b| hay.get(b))) && !touches(hay.get(m.end()))
        })
    }
}

impl Texts {
    /// Appends chunk `id`'s fields (ASCII folded) and indexes its character pairs; returns the index's bytes added.
    fn push(&mut self, id: i64, parts: &[&str]) -> usize {
        let position = self.starts.len() as u32;
        self.starts.push((id, self.buf.len()));
        let mut pairs = Vec::new();
        for part in parts {
            let folded = part.to_ascii_lowercase();
            pairs_of(&folded, &mut pairs);
            self.buf.extend_from_slice(folded.as_bytes());
            self.buf.push(0);
        }
        pairs.sort_unstable();
        pairs.dedup();
        let mut bytes = pairs.len() * POSTING_BYTES;
        for p in pairs {
            let chunks = self.pairs.entry(p).or_insert_with(|| {
                bytes += PAIR_BYTES;
                Vec::new()
            });
            chunks.push(position);
        }
        bytes
    }

    /// Where chunk `id` is in `starts`. Ingest numbers a collection's chunks mostly in a row, so the offset from
    /// the first id is tried before the binary search.
    fn position(&self, id: i64) -> Option<usize> {
        let first = self.starts.first()?.0;
        let guess = usize::try_from(id - first).ok().filter(|&g| self.starts.get(g).is_some_and(|s| s.0 == id));
        guess.or_else(|| self.starts.binary_search_by_key(&id, |s| s.0).ok())
    }

    /// The bytes of the chunk at `at` in `starts`.
    fn chunk(&self, at: usize) -> &[u8] {
        let end = self.starts.get(at + 1).map_or(self.buf.len(), |s| s.1);
        &self.buf[self.starts[at].1..end]
    }

    /// The positions from `first` on of the chunks holding every pair of a needle, or None when its rarest pair is
    /// held by too large a share of them to be worth it (or it has no pair: one character).
    fn candidates(&self, needle_pairs: &[u64], first: usize) -> Option<Vec<u32>> {
        let mut postings = Vec::with_capacity(needle_pairs.len());
        for p in needle_pairs {
            match self.pairs.get(p) {
                Some(chunks) => postings.push(&chunks[chunks.partition_point(|&c| (c as usize) < first)..]),
                None => return Some(Vec::new()),
            }
        }
        postings.sort_unstable_by_key(|c| c.len());
        let rarest = postings.first()?;
        let scanned = self.starts.len() - first.min(self.starts.len());
        if rarest.len() > 64 && rarest.len() * 8 > scanned {
            return None;
        }
        let mut kept = rarest.to_vec();
        for other in &postings[1..] {
            if kept.len() <= 4 {
                break;
            }
            kept.retain(|c| other.binary_search(c).is_ok());
        }
        Some(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::params;

    /// Texts and needles from a small alphabet, so that substrings recur and absent ones are near misses.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn text(&mut self, max: u64, lower: bool) -> String {
            const ALPHABET: [char; 10] = ['糖', '尿', '病', '压', '根', '高', '血', 'a', 'B', 'c'];
            let n = 1 + self.next() % max;
            (0..n)
                .map(|_| ALPHABET[(self.next() % 10) as usize])
                .map(|c| if lower { c.to_ascii_lowercase() } else { c })
                .collect()
        }
    }

    fn add_document(s: &Store, g: &mut Gen, collection: i64, n: usize) -> i64 {
        let c = s.conn();
        c.execute(
            "INSERT INTO documents (collection_id, external_id, title, content_hash, created_at) VALUES (?1, ?2, ?3, '', '')",
            params![collection, format!("d{}", g.next()), g.text(4, false)],
        )
        .unwrap();
        let doc = c.last_insert_rowid();
        for i in 0..n {
            c.execute(
                "INSERT INTO chunks (document_id, ordinal, heading, text, char_start, char_end) VALUES (?1, ?2, ?3, ?4, 0, 0)",
                params![doc, i as i64, g.text(3, false), g.text(12, false)],
            )
            .unwrap();
        }
        doc
    }

    /// The byte needle of `holding` answers what `contains_term` answers on the text: Latin needles as whole words
    /// (next to CJK, punctuation, a NUL field separator or the ends), CJK ones anywhere.
    #[test]
    fn byte_needles_answer_as_contains_term_does() {
        let hays = [
            "copd患者\0慢阻肺\0copd",
            "admin\0mi\0",
            "急性mi后",
            "mi2",
            "xmi",
            "\0mi",
            "高血压和糖尿病",
            "ct检查",
            "ct",
            "abc ct。",
            "ctx ct",
            "高血壓",
            "",
        ];
        let needles = ["copd", "mi", "ct", "高血压", "糖尿", "慢阻肺", "血壓", "a"];
        for h in hays {
            for n in needles {
                assert_eq!(
                    super::Needles::new(&[n.to_string()]).unwrap().any_in(h.as_bytes()),
                    crate::text::contains_term(h, n),
                    "{n:?} in {h:?}"
                );
            }
            // All together: any of them, each as it is alone.
            let all: Vec<String> = needles.iter().map(|n| n.to_string()).collect();
            let alone = needles.iter().any(|n| crate::text::contains_term(h, n));
            assert_eq!(super::Needles::new(&all).unwrap().any_in(h.as_bytes()), alone, "{h:?}");
        }
    }

    /// A needle is looked for only in the chunks holding all its pairs; a pair held by a large share of the chunks
    /// sends it to the plain scan; a pair held by none answers at once.
    #[test]
    fn needles_go_to_the_chunks_holding_their_pairs_and_common_pairs_to_the_scan() {
        let mut image = Image::default();
        let t = image.collections.entry("c".into()).or_default();
        let mut add = |text: &str| {
            t.push(t.starts.len() as i64 + 1, &[text]);
        };
        for i in 0..200 {
            add(&format!("患者{i}号的血糖"));
        }
        add("二甲双胍的禁忌症");
        add("甲乙丙甲丁");
        let t = &image.collections["c"];
        let pairs = |needle: &str| {
            let mut p = Vec::new();
            pairs_of(needle, &mut p);
            p
        };
        assert_eq!(t.candidates(&pairs("二甲双胍"), 0), Some(vec![200]), "a rare pair: one chunk to look in");
        assert_eq!(t.candidates(&pairs("替格瑞洛"), 0), Some(vec![]), "a pair no chunk holds");
        assert_eq!(t.candidates(&pairs("血糖"), 0), None, "a pair in every chunk: the scan");
        assert_eq!(t.candidates(&pairs("糖"), 0), None, "one character has no pair: the scan");
        assert_eq!(t.candidates(&pairs("二甲双胍"), 201), Some(vec![]), "only chunks after the first asked for");
        let cols = vec!["c".to_string()];
        assert_eq!(image.find("双胍的禁", &cols, 0), Some(true));
        assert_eq!(t.candidates(&pairs("乙丙甲乙"), 0), Some(vec![201]));
        assert_eq!(image.find("乙丙甲乙", &cols, 0), Some(false), "its pairs are held, the span is not");
        assert_eq!(image.find("号的血", &cols, 0), Some(true));
    }

    /// The image answers exactly what the SQLite scan answers, for every collection set and starting chunk, after
    /// additions, deletions (also through a document's cascade) and a new chunk taking a deleted chunk's id.
    #[test]
    fn the_image_answers_what_the_sqlite_scan_answers_as_the_chunks_change() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open_with(&t.path().join("care.sqlite"), 2).unwrap();
        let (a, b) = (s.create_collection("a", "", "t").unwrap().id, s.create_collection("b", "", "t").unwrap().id);
        let mut g = Gen(7);
        let image = TextImage::default();
        let sets: Vec<Vec<String>> = vec![vec!["a".into()], vec!["b".into()], vec!["a".into(), "b".into()], vec![]];
        let compare = |s: &Store, g: &mut Gen, round: &str| {
            let stamp = s.chunk_stamp().unwrap();
            let (mut found, mut checked) = (0, 0);
            for _ in 0..300 {
                let needle = g.text(5, true);
                for cols in &sets {
                    for after in [0, stamp.newest / 2, stamp.newest] {
                        let want = s.any_chunk_contains(&needle, cols, after).unwrap();
                        let got = image.contains(s, stamp, &needle, cols, after).unwrap();
                        assert_eq!(got, Some(want), "{round}: {needle:?} in {cols:?} after chunk {after}");
                        found += usize::from(want);
                        checked += 1;
                    }
                }
            }
            assert!(found > checked / 10 && found < checked * 9 / 10, "{round}: {found} of {checked} found");
            stamp
        };
        let mut docs: Vec<i64> = (0..40).map(|i| add_document(&s, &mut g, if i % 2 == 0 { a } else { b }, 3)).collect();
        let first = compare(&s, &mut g, "first copy");
        docs.extend((0..10).map(|_| add_document(&s, &mut g, a, 2)));
        let grown = compare(&s, &mut g, "chunks added");
        assert_eq!((grown.deletions, grown.newest > first.newest), (0, true));
        s.conn().execute("DELETE FROM documents WHERE id = ?1", [docs[3]]).unwrap();
        let cascaded = compare(&s, &mut g, "a document deleted");
        assert_eq!(cascaded.deletions, 3, "the cascade's chunk deletions are counted");
        // The newest chunks deleted, then new ones taking their ids: the stamp's newest id comes back the same.
        let last = *docs.last().unwrap();
        s.conn().execute("DELETE FROM documents WHERE id = ?1", [last]).unwrap();
        add_document(&s, &mut g, b, 2);
        let reused = compare(&s, &mut g, "ids reused");
        assert_eq!(reused.newest, cascaded.newest, "the new chunks took the deleted ids");
        assert_ne!(reused, cascaded);
    }
}
