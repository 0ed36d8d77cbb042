//! SentencePiece `precompiled_charsmap`: builder, parser and lookup.
//!
//! Why: Hugging Face tokenizers reproduce SentencePiece's `nmt_nfkc` normalisation for XLM-R with a
//! `Precompiled` normaliser whose only data is this blob, exactly as SentencePiece stores it:
//!
//! ```text
//! u32 trie_bytes | trie: trie_bytes/4 little-endian u32 units (Darts-clone double array) | pool
//! ```
//!
//! The trie maps UTF-8 source strings to byte offsets into `pool`, a run of NUL-terminated UTF-8 replacements.
//! E5S1 only carries the rules per code point, but the reference tokenizer also *composes* sequences such as
//! `e` + U+0301 into `é`: SentencePiece's builder adds, for every character whose NFKD is several code points,
//! every spelling of that decomposition (each code point replaced by anything that NFKD-normalises to it) as a
//! rule towards the NFC form, then drops rules that shorter rules already imply. [`nmt_nfkc_rules`] redoes that
//! derivation from the per-code-point map, and [`build`] writes a double array that the `spm_precompiled`
//! reader (used by `tokenizers`) walks exactly like SentencePiece's own.
//!
//! Unit layout read by Darts-clone (and `spm_precompiled`): bits 0-7 label, bit 8 "has leaf", bit 9 "offset is
//! shifted by 8", bits 10-31 offset; a value unit has bit 31 set and the value in bits 0-30. A node at `p` has
//! children at `p ^ offset(p) ^ label` and, when it has a leaf, its value at `p ^ offset(p)`.

use std::collections::{BTreeMap, HashMap, HashSet};

use unicode_normalization::UnicodeNormalization;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CharsmapError {
    #[error("charsmap rule with an empty source string")]
    EmptyKey,
    #[error("charsmap rule source {0:?} contains a NUL byte, which the trie uses as terminator")]
    NulInKey(String),
    #[error("charsmap replacement {0:?} contains a NUL byte, which the pool uses as terminator")]
    NulInValue(String),
    #[error("charsmap trie grew past {0} units; offsets no longer fit the Darts-clone unit")]
    TooLarge(usize),
    #[error("charsmap blob is malformed: {0}")]
    Malformed(&'static str),
}

const LEAF_BIT: u32 = 1 << 8;
const EXT_BIT: u32 = 1 << 9;
const VALUE_BIT: u32 = 1 << 31;
const BLOCK: usize = 256;
/// Offsets are stored in 21 bits (or 21 bits shifted by 8 when aligned); XOR of two positions below 2^21
/// always fits, so the array is capped there.
const MAX_UNITS: usize = 1 << 21;

fn encode_offset(offset: u32) -> Option<u32> {
    if offset < (1 << 21) {
        Some(offset << 10)
    } else if offset < (1 << 29) && offset & 0xff == 0 {
        Some((offset << 2) | EXT_BIT)
    } else {
        None
    }
}

fn unit_offset(unit: u32) -> usize {
    ((unit >> 10) << ((unit & EXT_BIT) >> 6)) as usize
}

fn unit_label(unit: u32) -> u32 {
    unit & (VALUE_BIT | 0xff)
}

/// Builds the `precompiled_charsmap` blob for `rules` (source string -> replacement; empty replacement deletes).
pub fn build(rules: &BTreeMap<String, String>) -> Result<Vec<u8>, CharsmapError> {
    // Pool of NUL-terminated replacements, deduplicated.
    let mut pool = Vec::new();
    let mut pool_at: HashMap<&str, u32> = HashMap::new();
    let mut keys: Vec<(&[u8], u32)> = Vec::with_capacity(rules.len());
    for (k, v) in rules {
        if k.is_empty() {
            return Err(CharsmapError::EmptyKey);
        }
        if k.as_bytes().contains(&0) {
            return Err(CharsmapError::NulInKey(k.clone()));
        }
        if v.as_bytes().contains(&0) {
            return Err(CharsmapError::NulInValue(v.clone()));
        }
        let at = *pool_at.entry(v.as_str()).or_insert_with(|| {
            let at = pool.len() as u32;
            pool.extend_from_slice(v.as_bytes());
            pool.push(0);
            at
        });
        keys.push((k.as_bytes(), at));
    }
    let units = DoubleArrayBuilder::build(&keys)?;
    let mut blob = Vec::with_capacity(4 + units.len() * 4 + pool.len());
    blob.extend_from_slice(&((units.len() * 4) as u32).to_le_bytes());
    for u in &units {
        blob.extend_from_slice(&u.to_le_bytes());
    }
    blob.extend_from_slice(&pool);
    Ok(blob)
}

/// A trie node before placement.
#[derive(Default)]
struct Node {
    children: Vec<(u8, usize)>,
    value: Option<u32>,
    /// Identifier of the node's subtree up to equality (same values, same labelled children): equal subtrees
    /// share one placement, which is how Darts-clone's DAWG keeps Hangul's 200k rules small.
    class: usize,
}

/// A node's value and its children's (label, subtree class) pairs.
type SubtreeSignature = (Option<u32>, Vec<(u8, usize)>);

struct DoubleArrayBuilder {
    units: Vec<u32>,
    used: Vec<bool>,
    base_used: Vec<bool>,
    placed: HashMap<usize, usize>,
}

impl DoubleArrayBuilder {
    fn build(keys: &[(&[u8], u32)]) -> Result<Vec<u32>, CharsmapError> {
        // 1. Plain trie (keys arrive sorted, so children are appended in label order).
        let mut nodes = vec![Node::default()];
        for (key, value) in keys {
            let mut at = 0;
            for &b in *key {
                at = match nodes[at].children.iter().find(|(l, _)| *l == b) {
                    Some(&(_, child)) => child,
                    None => {
                        nodes.push(Node::default());
                        let child = nodes.len() - 1;
                        nodes[at].children.push((b, child));
                        child
                    }
                };
            }
            nodes[at].value = Some(*value);
        }
        for n in &mut nodes {
            n.children.sort_unstable_by_key(|c| c.0);
        }
        // 2. Subtree classes, children before parents (post-order via reversed pre-order).
        let mut order = Vec::with_capacity(nodes.len());
        let mut stack = vec![0usize];
        while let Some(n) = stack.pop() {
            order.push(n);
            stack.extend(nodes[n].children.iter().map(|c| c.1));
        }
        let mut classes: HashMap<SubtreeSignature, usize> = HashMap::new();
        for &n in order.iter().rev() {
            let sig = (nodes[n].value, nodes[n].children.iter().map(|&(l, c)| (l, nodes[c].class)).collect::<Vec<_>>());
            let next = classes.len();
            nodes[n].class = *classes.entry(sig).or_insert(next);
        }
        // 3. Placement. Unit 0 is the root; its offset points at the root's base.
        let mut b = DoubleArrayBuilder {
            units: vec![0; BLOCK],
            used: vec![false; BLOCK],
            base_used: vec![false; BLOCK],
            placed: HashMap::new(),
        };
        b.used[0] = true;
        let root_base = b.place(&nodes, 0)?;
        b.units[0] = encode_offset(root_base as u32).ok_or(CharsmapError::TooLarge(b.units.len()))?;
        Ok(b.units)
    }

    /// Places the children (and value) of `node`, returning its base.
    fn place(&mut self, nodes: &[Node], node: usize) -> Result<usize, CharsmapError> {
        let n = &nodes[node];
        if let Some(&base) = self.placed.get(&n.class) {
            return Ok(base);
        }
        let mut labels: Vec<usize> = n.children.iter().map(|c| c.0 as usize).collect();
        if n.value.is_some() {
            labels.insert(0, 0);
        }
        let base = self.find_base(&labels)?;
        self.base_used[base] = true;
        for &l in &labels {
            self.used[base ^ l] = true;
        }
        self.placed.insert(n.class, base);
        if let Some(v) = n.value {
            self.units[base] = VALUE_BIT | v;
        }
        for &(label, child) in &n.children {
            let pos = base ^ label as usize;
            let child_base = self.place(nodes, child)?;
            let offset = encode_offset((pos ^ child_base) as u32).ok_or(CharsmapError::TooLarge(self.units.len()))?;
            let leaf = if nodes[child].value.is_some() { LEAF_BIT } else { 0 };
            self.units[pos] = offset | leaf | u32::from(label);
        }
        Ok(base)
    }

    /// First base (searching the last few blocks, then a fresh block) where every `base ^ label` is free and no
    /// other node already uses the base. Unique bases matter: two parents sharing a base would see each other's
    /// children, since a child is only recognised by its label.
    fn find_base(&mut self, labels: &[usize]) -> Result<usize, CharsmapError> {
        // A childless, valueless node (only the root of an empty map) still gets a base of its own.
        let first_label = labels.first().copied().unwrap_or(0);
        let blocks = self.units.len() / BLOCK;
        for block in blocks.saturating_sub(16)..blocks {
            let lo = block * BLOCK;
            if self.used[lo..lo + BLOCK].iter().filter(|u| !**u).count() < labels.len() {
                continue;
            }
            for x in 0..BLOCK {
                // Try every free slot `lo + x` as the position of the first label.
                let base = lo + (x ^ first_label);
                if base == 0 || self.base_used[base] || self.used[lo + x] {
                    continue;
                }
                if labels.iter().all(|&l| !self.used[base ^ l]) {
                    return Ok(base);
                }
            }
        }
        let lo = self.units.len();
        if lo + BLOCK > MAX_UNITS {
            return Err(CharsmapError::TooLarge(lo));
        }
        self.units.resize(lo + BLOCK, 0);
        self.used.resize(lo + BLOCK, false);
        self.base_used.resize(lo + BLOCK, false);
        Ok(lo + first_label)
    }
}

/// A parsed `precompiled_charsmap`, looked up the way `spm_precompiled` (and so `tokenizers`) does.
#[derive(Debug, Clone)]
pub struct Charsmap {
    units: Vec<u32>,
    pool: Vec<u8>,
}

impl Charsmap {
    pub fn parse(blob: &[u8]) -> Result<Self, CharsmapError> {
        let size = blob.get(..4).ok_or(CharsmapError::Malformed("shorter than 4 bytes"))?;
        let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]) as usize;
        if !size.is_multiple_of(4) || blob.len() < 4 + size {
            return Err(CharsmapError::Malformed("trie size exceeds the blob"));
        }
        let units = blob[4..4 + size].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(Self { units, pool: blob[4 + size..].to_vec() })
    }

    /// Values of all rules whose source is a prefix of `key`, shortest first (Darts-clone `commonPrefixSearch`).
    pub fn common_prefix_search(&self, key: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        let Some(&root) = self.units.first() else { return out };
        let mut pos = unit_offset(root);
        for &c in key {
            if c == 0 {
                break;
            }
            pos ^= c as usize;
            let Some(&unit) = self.units.get(pos) else { return out };
            if unit_label(unit) != u32::from(c) {
                return out;
            }
            pos ^= unit_offset(unit);
            if unit & LEAF_BIT != 0 {
                match self.units.get(pos) {
                    Some(&v) => out.push(v & !VALUE_BIT),
                    None => return out,
                }
            }
        }
        out
    }

    /// The replacement `tokenizers`' `Precompiled::transform` returns: that of the *shortest* matching rule.
    pub fn transform(&self, chunk: &str) -> Option<&str> {
        let at = *self.common_prefix_search(chunk.as_bytes()).first()? as usize;
        let tail = self.pool.get(at..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).ok()
    }

    /// The replacement of exactly `key`, if it is a rule.
    pub fn get(&self, key: &str) -> Option<&str> {
        let &root = self.units.first()?;
        let mut pos = unit_offset(root);
        for &c in key.as_bytes() {
            pos ^= c as usize;
            let &u = self.units.get(pos)?;
            if unit_label(u) != u32::from(c) {
                return None;
            }
            pos ^= unit_offset(u);
        }
        // `pos` is the node's base; the node is a key when a value unit sits there.
        let &v = self.units.get(pos).filter(|&&u| u & VALUE_BIT != 0)?;
        let tail = self.pool.get((v & !VALUE_BIT) as usize..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).ok()
    }

    /// Every rule in the trie (depth-first walk), for round-trip checks.
    pub fn rules(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Some(&root) = self.units.first() else { return out };
        let mut stack: Vec<(usize, Vec<u8>)> = vec![(unit_offset(root), Vec::new())];
        while let Some((base, prefix)) = stack.pop() {
            for c in 1..=255u8 {
                let pos = base ^ c as usize;
                let Some(&unit) = self.units.get(pos) else { continue };
                if unit_label(unit) != u32::from(c) {
                    continue;
                }
                let child_base = pos ^ unit_offset(unit);
                let mut key = prefix.clone();
                key.push(c);
                if unit & LEAF_BIT != 0
                    && let Some(&v) = self.units.get(child_base)
                {
                    let tail = self.pool.get((v & !VALUE_BIT) as usize..).unwrap_or(&[]);
                    let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
                    out.insert(
                        String::from_utf8_lossy(&key).into_owned(),
                        String::from_utf8_lossy(&tail[..end]).into_owned(),
                    );
                }
                stack.push((child_base, key));
            }
        }
        out
    }
}

/// Derives SentencePiece's full `nmt_nfkc` rule set from the per-code-point rules carried by E5S1.
///
/// `singles` are authoritative for single code points (they include the nmt whitespace/control overrides).
/// Multi-code-point rules are derived as `spm_train`'s `Builder::BuildNFKCMap` does: for each character whose
/// NFKD is several code points and whose NFC differs from that NFKD, every sequence that spells the NFKD with
/// each code point replaced by any character NFKD-normalising to it maps to the NFC form; then
/// `RemoveRedundantMap` drops rules reproduced by shorter ones. Characters newer than the map (ones with a
/// compatibility mapping the map lacks) are left out so the rules stay those of the model's Unicode version.
pub fn nmt_nfkc_rules(singles: &BTreeMap<char, String>) -> BTreeMap<String, String> {
    // Code points the source map predates: NFKC changes them, yet the map has no rule for them.
    // (U+FF5E FULLWIDTH TILDE is deliberately unmapped by nmt_nfkc and is not "newer".)
    let mut newer: HashSet<char> = HashSet::new();
    let mut norm2orig: HashMap<char, Vec<char>> = HashMap::new();
    let mut decomposed: Vec<Vec<char>> = Vec::new();
    for cp in 1..=0x10FFFFu32 {
        let Some(c) = char::from_u32(cp) else { continue };
        if (0xFDD0..=0xFDEF).contains(&cp) || cp & 0xFFFE == 0xFFFE {
            continue; // noncharacters, skipped like ICU's U_IS_UNICODE_CHAR
        }
        let nfkd: Vec<char> = std::iter::once(c).nfkd().collect();
        if nfkd != [c]
            && c != '\u{FF5E}'
            && !singles.contains_key(&c)
            && std::iter::once(c).nfkc().ne(std::iter::once(c))
        {
            newer.insert(c);
        }
        if nfkd.len() == 1 {
            norm2orig.entry(nfkd[0]).or_default().push(c);
        } else if !newer.contains(&c) {
            decomposed.push(nfkd);
        }
    }
    decomposed.sort_unstable();
    decomposed.dedup();

    let mut rules: HashMap<Vec<char>, Vec<char>> =
        singles.iter().map(|(k, v)| (vec![*k], v.chars().collect())).collect();
    for nfkd in &decomposed {
        let nfc: Vec<char> = nfkd.iter().copied().nfc().collect();
        if &nfc == nfkd {
            continue;
        }
        let mut spellings: Vec<Vec<char>> = vec![Vec::new()];
        for d in nfkd {
            let origs: Vec<char> = match norm2orig.get(d) {
                Some(o) => o.iter().copied().filter(|&c| c == *d || !newer.contains(&c)).collect(),
                None => vec![*d],
            };
            spellings = spellings
                .into_iter()
                .flat_map(|s| {
                    origs.iter().map(move |&o| {
                        let mut s = s.clone();
                        s.push(o);
                        s
                    })
                })
                .collect();
        }
        for s in spellings {
            if s != nfc {
                rules.insert(s, nfc.clone());
            }
        }
    }
    let rules = remove_redundant(rules);
    rules.into_iter().map(|(k, v)| (k.into_iter().collect(), v.into_iter().collect())).collect()
}

/// SentencePiece's `Normalize`: greedy longest match with rules of at most `max_len` code points.
fn normalize_with(rules: &HashMap<Vec<char>, Vec<char>>, src: &[char], max_len: usize) -> Vec<char> {
    let mut out = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let longest = (1..=max_len.min(src.len() - i)).rev().find_map(|l| rules.get(&src[i..i + l]).map(|v| (l, v)));
        match longest {
            Some((l, v)) => {
                out.extend_from_slice(v);
                i += l;
            }
            None => {
                out.push(src[i]);
                i += 1;
            }
        }
    }
    out
}

/// SentencePiece's `RemoveRedundantMap`: keep single-code-point rules, and a longer rule only when the rules
/// shorter than it do not already produce its replacement.
fn remove_redundant(rules: HashMap<Vec<char>, Vec<char>>) -> HashMap<Vec<char>, Vec<char>> {
    let max_len = rules.keys().map(Vec::len).max().unwrap_or(0);
    let mut kept: HashMap<Vec<char>, Vec<char>> = HashMap::new();
    let mut by_len: Vec<Vec<(Vec<char>, Vec<char>)>> = vec![Vec::new(); max_len + 1];
    for (k, v) in rules {
        let l = k.len();
        by_len[l].push((k, v));
    }
    for (len, bucket) in by_len.into_iter().enumerate().skip(1) {
        if len == 1 {
            kept.extend(bucket);
            continue;
        }
        let mut add = Vec::new();
        for (k, v) in bucket {
            if normalize_with(&kept, &k, len - 1) != v {
                add.push((k, v));
            }
        }
        kept.extend(add);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn offsets_encode_like_darts_clone() {
        assert_eq!(unit_offset(encode_offset(5).unwrap()), 5);
        assert_eq!(unit_offset(encode_offset((1 << 21) - 1).unwrap()), (1 << 21) - 1);
        let big = 3 << 24;
        assert_eq!(encode_offset(big).unwrap() & EXT_BIT, EXT_BIT);
        assert_eq!(unit_offset(encode_offset(big).unwrap()), big as usize);
        assert_eq!(encode_offset((1 << 21) + 1), None);
    }

    #[test]
    fn trie_round_trips_and_searches_prefixes() {
        let r = rules(&[
            ("a", "A"),
            ("ab", "X"),
            ("abc", ""),
            ("b", "B"),
            ("e\u{301}", "é"),
            ("\u{3000}", " "),
            ("Ａ", "A"),
            ("\u{1}", ""),
            ("ᄀ", "ᄀ"),
        ]);
        let blob = build(&r).unwrap();
        let cm = Charsmap::parse(&blob).unwrap();
        assert_eq!(cm.rules(), r);
        // Shortest match first, like spm_precompiled.
        assert_eq!(cm.transform("abc"), Some("A"));
        assert_eq!(cm.common_prefix_search(b"abcd").len(), 3);
        assert_eq!(cm.transform("e\u{301}"), Some("é"));
        assert_eq!(cm.transform("e"), None);
        assert_eq!(cm.transform("z"), None);
        assert_eq!(cm.transform("\u{1}"), Some(""));
        assert_eq!(cm.get("ab"), Some("X"));
        assert_eq!(cm.get("e"), None);
        // Identical replacements share pool entries.
        assert_eq!(blob.len() - 4 - cm.units.len() * 4, "A\0X\0\0B\0é\0 \0ᄀ\0".len());
    }

    #[test]
    fn empty_map_builds_a_trie_that_matches_nothing() {
        let cm = Charsmap::parse(&build(&BTreeMap::new()).unwrap()).unwrap();
        assert_eq!(cm.transform("a"), None);
        assert!(cm.rules().is_empty());
        assert_eq!(build(&rules(&[("", "x")])), Err(CharsmapError::EmptyKey));
    }

    #[test]
    fn large_trie_round_trips() {
        // Enough keys to need many blocks and shared subtrees.
        let mut r = BTreeMap::new();
        for a in 0x1100u32..0x1113 {
            for b in 0x1161u32..0x1176 {
                for c in [0x11a8u32, 0x11ab, 0x11af] {
                    let k: String = [a, b, c].iter().map(|&x| char::from_u32(x).unwrap()).collect();
                    r.insert(k.clone(), k.nfc().collect::<String>());
                }
            }
        }
        for cp in 0xff01u32..0xff5e {
            let c = char::from_u32(cp).unwrap();
            r.insert(c.to_string(), c.to_string().nfkc().collect());
        }
        let cm = Charsmap::parse(&build(&r).unwrap()).unwrap();
        assert_eq!(cm.rules(), r);
        assert_eq!(cm.transform("가나"), None);
        assert_eq!(cm.transform("\u{1100}\u{1161}\u{11a8}"), Some("각"));
    }

    #[test]
    fn derives_composition_rules() {
        let singles: BTreeMap<char, String> = [('\u{3000}', " "), ('ｅ', "e"), ('\u{341}', "\u{301}")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        let r = nmt_nfkc_rules(&singles);
        assert_eq!(r.get("e\u{301}").map(String::as_str), Some("é"));
        assert_eq!(r.get("e\u{341}").map(String::as_str), Some("é"));
        assert_eq!(r.get("\u{3000}").map(String::as_str), Some(" "));
        // Single-code-point rules come only from the map.
        assert!(!r.contains_key("é"));
        assert_eq!(r.get("\u{1100}\u{1161}").map(String::as_str), Some("가"));
    }
}
