//! Text normalisation and chunking for Chinese medical text.
//!
//! Normalisation folds full-width letters, digits and spaces to ASCII (so "ＣＴ" and "CT" index alike), drops
//! control characters (exports often carry them, e.g. U+001A), and collapses runs of whitespace. Chinese
//! punctuation is kept: clinicians read the snippets, and the chunker splits on it. Folding ([`fold`]) adds
//! traditional → simplified and lower case: what passages and queries are compared in (query, synonyms, highlights).
//!
//! Chunking packs whole sentences (ending in 。！？；!?; or a line break) into chunks of at most a budget of
//! characters, or of tokens of the active query encoder's tokenizer ([`Tokens`]), repeats the
//! last sentences of a chunk (up to the overlap budget) at the start of the next so an answer spanning a boundary is still found, and starts a new chunk at every Markdown heading, keeping the
//! heading path as the chunk's context.

use std::sync::OnceLock;

use ferrous_opencc::OpenCC;
use ferrous_opencc::config::BuiltinConfig;
use serde::{Deserialize, Serialize};

pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    let mut pending_newline = false;
    for c in text.chars() {
        let c = match c {
            '\u{3000}' => ' ',
            '\u{FF10}'..='\u{FF19}' | '\u{FF21}'..='\u{FF3A}' | '\u{FF41}'..='\u{FF5A}' => {
                char::from_u32(c as u32 - 0xFEE0).unwrap_or(c)
            }
            // Full-width ASCII symbols used in values and units (５％, ０．５ｍｇ, ＜＝, ／): folded like letters.
            // Sentence and clause punctuation (，。！？；：（）) is Chinese typography and stays as written.
            '＂' | '＃' | '＄' | '％' | '＆' | '＇' | '＊' | '＋' | '－' | '．' | '／' | '＜' | '＝' | '＞' | '＠'
            | '［' | '＼' | '］' | '＾' | '＿' | '｀' | '｛' | '｜' | '｝' | '～' => {
                char::from_u32(c as u32 - 0xFEE0).unwrap_or(c)
            }
            // Half-width forms of CJK punctuation (used by some legacy exports) to their full-width forms.
            '\u{FF61}' => '。',
            '\u{FF64}' => '、',
            '\u{FEFF}' | '\u{200B}' | '\u{200C}' | '\u{200D}' => continue,
            c => c,
        };
        if c == '\n' {
            pending_newline = true;
            continue;
        }
        if c.is_whitespace() || c.is_control() {
            pending_space = true;
            continue;
        }
        if !out.is_empty() {
            if pending_newline {
                out.push('\n');
            } else if pending_space {
                out.push(' ');
            }
        }
        pending_space = false;
        pending_newline = false;
        out.push(c);
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChunkConfig {
    /// Upper bound on a chunk's length in characters (a single longer sentence is split hard). Used when no query
    /// encoder is active.
    pub max_chars: usize,
    /// How much trailing context of one chunk is repeated at the start of the next.
    pub overlap_chars: usize,
    /// Upper bound on a chunk's length in tokens of the active query encoder's tokenizer (used when a model is
    /// active, so chunks fit the encoder's window together with their heading context).
    pub max_tokens: usize,
    pub overlap_tokens: usize,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig { max_chars: 400, overlap_chars: 80, max_tokens: 300, overlap_tokens: 60 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// "章 > 节" path of the Markdown headings above this chunk.
    pub heading: String,
    pub text: String,
    /// Character offsets of the chunk in the normalised document text.
    pub char_start: usize,
    pub char_end: usize,
}

/// How chunk length is measured.
pub trait Measure {
    /// Length of `s` in this measure's units.
    fn len(&self, s: &str) -> usize;
    /// Character offsets (ascending, exclusive of 0 and `s`'s length) at which to cut `s` into pieces of at most
    /// `max` units.
    fn cut_points(&self, s: &str, max: usize) -> Vec<usize>;
    /// True when a span's length is its character count (lets the chunker skip measuring).
    fn is_chars(&self) -> bool {
        false
    }
}

/// Characters.
#[derive(Debug, Clone, Copy)]
pub struct Chars;

impl Measure for Chars {
    fn len(&self, s: &str) -> usize {
        s.chars().count()
    }
    fn cut_points(&self, s: &str, max: usize) -> Vec<usize> {
        (1..).map(|k| k * max).take_while(|&p| p < s.chars().count()).collect()
    }
    fn is_chars(&self) -> bool {
        true
    }
}

/// Tokens of a Hugging Face tokenizer (special tokens not counted), e.g. the active query encoder's.
pub struct Tokens<'a>(pub &'a tokenizers::Tokenizer);

impl Measure for Tokens<'_> {
    fn len(&self, s: &str) -> usize {
        self.0.encode_fast(s, false).map(|e| e.len()).unwrap_or_else(|_| s.chars().count())
    }
    fn cut_points(&self, s: &str, max: usize) -> Vec<usize> {
        let Ok(enc) = self.0.encode(s, false) else { return Chars.cut_points(s, max) };
        let offsets = enc.get_offsets();
        let mut bytes: Vec<usize> = (1..)
            .map(|k| k * max.max(1))
            .take_while(|&t| t < offsets.len())
            .map(|t| offsets[t].0)
            .filter(|&b| b > 0 && b < s.len() && s.is_char_boundary(b))
            .collect();
        bytes.dedup();
        bytes.into_iter().map(|b| s[..b].chars().count()).collect()
    }
}

fn is_sentence_end(c: char) -> bool {
    matches!(c, '。' | '！' | '？' | '；' | '!' | '?' | ';' | '\n')
}

/// A sentence as (char_start, char_end) in the document, with the heading path in force.
#[derive(Debug, Clone)]
struct Sentence {
    start: usize,
    end: usize,
    heading: usize,
    size: usize,
}

/// Splits normalised text into chunks of at most `cfg.max_chars` characters.
pub fn chunk(text: &str, cfg: &ChunkConfig) -> Vec<Chunk> {
    chunk_measured(text, cfg.max_chars.max(16), cfg.overlap_chars, &Chars)
}

/// Splits normalised text into chunks of at most `max` units of `m` (whole sentences where possible), repeating up
/// to `overlap` units of trailing sentences at the start of the next chunk. Markdown headings (`#`..`######` at a
/// line start) start a new chunk and are kept as the chunk's heading path.
pub fn chunk_measured(text: &str, max: usize, overlap: usize, m: &dyn Measure) -> Vec<Chunk> {
    let chars: Vec<char> = text.chars().collect();
    let max = max.max(1);
    // Before measuring, no sentence is longer than this many characters (bounds tokenizer work on one huge line).
    let hard_chars = if m.is_chars() { max } else { max.saturating_mul(8).max(64) };
    let mut headings: Vec<String> = vec![String::new()];
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut raw: Vec<(usize, usize, usize)> = Vec::new();

    // Walk line by line so headings are recognised, then sentence by sentence inside a line.
    let mut line_start = 0;
    while line_start < chars.len() {
        let line_end = chars[line_start..].iter().position(|&c| c == '\n').map_or(chars.len(), |p| line_start + p);
        let line: String = chars[line_start..line_end].iter().collect();
        let level = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&level) && line.chars().nth(level) == Some(' ') {
            let title = line[level..].trim().to_string();
            while stack.last().is_some_and(|(l, _)| *l >= level) {
                stack.pop();
            }
            stack.push((level, title));
            headings.push(stack.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(" > "));
        } else {
            let h = headings.len() - 1;
            let mut s = line_start;
            for i in line_start..line_end {
                if is_sentence_end(chars[i]) || i - s + 1 >= hard_chars {
                    push_raw(&chars, &mut raw, s, i + 1, h);
                    s = i + 1;
                }
            }
            push_raw(&chars, &mut raw, s, line_end, h);
        }
        line_start = line_end + 1;
    }

    let span = |a: usize, b: usize| -> String { chars[a..b].iter().collect() };
    let mut sentences: Vec<Sentence> = Vec::with_capacity(raw.len());
    for (start, end, heading) in raw {
        if m.is_chars() {
            sentences.push(Sentence { start, end, heading, size: end - start });
            continue;
        }
        let text = span(start, end);
        let size = m.len(&text);
        if size <= max {
            sentences.push(Sentence { start, end, heading, size });
            continue;
        }
        let mut prev = start;
        for cut in m.cut_points(&text, max).into_iter().map(|c| start + c).chain(std::iter::once(end)) {
            if cut > prev {
                let piece = span(prev, cut);
                sentences.push(Sentence { start: prev, end: cut, heading, size: m.len(&piece) });
                prev = cut;
            }
        }
    }

    // Size of sentences i..=j as one chunk: the exact character span, or the sum of the parts' tokens.
    let sizes: Vec<usize> = sentences.iter().map(|s| s.size).collect();
    let prefix: Vec<usize> = std::iter::once(0)
        .chain(sizes.iter().scan(0, |acc, &x| {
            *acc += x;
            Some(*acc)
        }))
        .collect();
    let size_of = |i: usize, j: usize| -> usize {
        if m.is_chars() { sentences[j].end - sentences[i].start } else { prefix[j + 1] - prefix[i] }
    };

    let mut out: Vec<Chunk> = Vec::new();
    let mut i = 0;
    while i < sentences.len() {
        let heading = sentences[i].heading;
        let start = sentences[i].start;
        let mut j = i;
        while j + 1 < sentences.len() && sentences[j + 1].heading == heading && size_of(i, j + 1) <= max {
            j += 1;
        }
        // Tokens of a concatenation can exceed the sum of its parts' tokens; measure the real chunk and shrink.
        let mut text = span(start, sentences[j].end).trim().to_string();
        while !m.is_chars() && j > i && m.len(&text) > max {
            j -= 1;
            text = span(start, sentences[j].end).trim().to_string();
        }
        let end = sentences[j].end;
        out.push(Chunk { heading: headings[heading].clone(), text, char_start: start, char_end: end });
        if j + 1 >= sentences.len() || sentences[j + 1].heading != heading {
            i = j + 1;
            continue;
        }
        // Overlap: step back over trailing sentences that fit in the overlap budget, but always advance.
        let mut k = j + 1;
        while k > i + 1 && size_of(k - 1, j) <= overlap {
            k -= 1;
        }
        i = k;
    }
    out
}

fn push_raw(chars: &[char], out: &mut Vec<(usize, usize, usize)>, start: usize, end: usize, heading: usize) {
    if start < end && chars[start..end].iter().any(|c| !c.is_whitespace()) {
        out.push((start, end, heading));
    }
}

/// OpenCC's converters, built once (their dictionaries are compiled into the binary).
fn converters() -> Option<&'static (OpenCC, OpenCC)> {
    static CC: OnceLock<Option<(OpenCC, OpenCC)>> = OnceLock::new();
    CC.get_or_init(|| match (OpenCC::from_config(BuiltinConfig::T2s), OpenCC::from_config(BuiltinConfig::S2t)) {
        (Ok(t2s), Ok(s2t)) => Some((t2s, s2t)),
        (a, b) => {
            // Never happens with the built-in tables; searching unfolded is the safe fallback.
            tracing::error!(t2s = a.is_ok(), s2t = b.is_ok(), "OpenCC tables failed to load; queries are not folded");
            None
        }
    })
    .as_ref()
}

/// A Chinese character (the CJK unified ideographs and extension A).
pub fn is_cjk(c: char) -> bool {
    matches!(c, '\u{4e00}'..='\u{9fff}' | '\u{3400}'..='\u{4dbf}')
}

/// Traditional → simplified.
pub fn to_simplified(text: &str) -> String {
    converters().map_or_else(|| text.to_string(), |c| c.0.convert(text))
}

/// Simplified → traditional.
pub fn to_traditional(text: &str) -> String {
    converters().map_or_else(|| text.to_string(), |c| c.1.convert(text))
}

/// What a passage's or a query's text is compared in: ingest's normalisation, simplified, lower-cased.
pub fn fold(text: &str) -> String {
    to_simplified(&normalize(text)).to_lowercase()
}

/// Whether folded `hay` contains `term`; a Latin term only where no letter or digit touches it (MI is not in
/// "admin").
pub fn contains_term(hay: &str, term: &str) -> bool {
    if !term.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return hay.contains(term);
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    hay.match_indices(term)
        .any(|(s, _)| !alnum(hay[..s].chars().next_back()) && !alnum(hay[s + term.len()..].chars().next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_width_controls_and_whitespace() {
        assert_eq!(normalize("\u{1a}\u{1a} 孕妇出血是什么原因？\u{1a}"), "孕妇出血是什么原因？");
        assert_eq!(normalize("ＣＴ检查　１２３"), "CT检查 123");
        assert_eq!(normalize("第一行\r\n\n  第二行，逗号"), "第一行\n第二行，逗号");
    }

    #[test]
    fn chunks_on_sentences_with_overlap() {
        let text = "一二三四五六七八九十。甲乙丙丁戊己庚辛壬癸。子丑寅卯辰巳午未申酉。";
        let cfg = ChunkConfig { max_chars: 22, overlap_chars: 11, ..Default::default() };
        let chunks = chunk(text, &cfg);
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(
            texts,
            vec!["一二三四五六七八九十。甲乙丙丁戊己庚辛壬癸。", "甲乙丙丁戊己庚辛壬癸。子丑寅卯辰巳午未申酉。"]
        );
        assert_eq!((chunks[1].char_start, chunks[1].char_end), (11, 33));
    }

    #[test]
    fn headings_start_new_chunks_and_are_kept_as_context() {
        let text = normalize("# 二甲双胍\n## 禁忌症\n严重肾功能不全者禁用。\n## 用法用量\n随餐服用。");
        let chunks = chunk(&text, &ChunkConfig::default());
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].heading, "二甲双胍 > 禁忌症");
        assert_eq!(chunks[0].text, "严重肾功能不全者禁用。");
        assert_eq!(chunks[1].heading, "二甲双胍 > 用法用量");
    }

    #[test]
    fn overlong_sentence_is_split_hard() {
        let text: String = std::iter::repeat_n('字', 50).collect();
        let chunks = chunk(&text, &ChunkConfig { max_chars: 20, overlap_chars: 0, ..Default::default() });
        assert_eq!(chunks.iter().map(|c| c.text.chars().count()).collect::<Vec<_>>(), vec![20, 20, 10]);
    }

    /// A BERT-style tokenizer: every CJK character, punctuation mark and ASCII word is one token.
    fn bert_like() -> tokenizers::Tokenizer {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":false},
            "pre_tokenizer":{"type":"BertPreTokenizer"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}"#;
        json.parse().unwrap()
    }

    #[test]
    fn token_budget_counts_tokens_not_characters() {
        let tok = bert_like();
        let m = Tokens(&tok);
        // "metformin" is 9 characters but one token.
        assert_eq!(m.len("metformin禁用。"), 4);
        let text = "## 用法\nmetformin tablets twice daily。二甲双胍随餐服用。肾功能不全者减量。";
        let chunks = chunk_measured(&normalize(text), 14, 0, &m);
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, vec!["metformin tablets twice daily。二甲双胍随餐服用。", "肾功能不全者减量。"]);
        assert!(chunks.iter().all(|c| m.len(&c.text) <= 14 && c.heading == "用法"));
        // The same text by characters needs more chunks.
        assert!(chunk_measured(&normalize(text), 14, 0, &Chars).len() > 2);
        // An overlong sentence is cut at token boundaries, never inside a word.
        let long = "aspirin ".repeat(30);
        let pieces = chunk_measured(long.trim(), 8, 0, &m);
        assert_eq!(pieces.len(), 4);
        assert!(pieces.iter().all(|c| c.text.split(' ').all(|w| w == "aspirin")), "{pieces:?}");
    }
}
