//! Text normalisation and chunking for Chinese medical text.
//!
//! Normalisation folds full-width letters, digits and spaces to ASCII (so "ＣＴ" and "CT" index alike), drops
//! control characters (exports often carry them, e.g. U+001A), and collapses runs of whitespace. Chinese
//! punctuation is kept: clinicians read the snippets, and the chunker splits on it.
//!
//! Chunking packs whole sentences (ending in 。！？；!?; or a line break) into chunks of at most `max_chars`
//! characters, repeats the last sentences of a chunk (up to `overlap_chars`) at the start of the next so an
//! answer spanning a boundary is still found, and starts a new chunk at every Markdown heading, keeping the
//! heading path as the chunk's context.

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
    /// Upper bound on a chunk's length in characters (a single longer sentence is split hard).
    pub max_chars: usize,
    /// How much trailing context of one chunk is repeated at the start of the next.
    pub overlap_chars: usize,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig { max_chars: 400, overlap_chars: 80 }
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

fn is_sentence_end(c: char) -> bool {
    matches!(c, '。' | '！' | '？' | '；' | '!' | '?' | ';' | '\n')
}

/// A sentence as (char_start, char_end) in the document, with the heading path in force.
#[derive(Debug, Clone)]
struct Sentence {
    start: usize,
    end: usize,
    heading: usize,
}

/// Splits normalised text into chunks. Markdown headings (`#`..`######` at a line start) are taken as structure.
pub fn chunk(text: &str, cfg: &ChunkConfig) -> Vec<Chunk> {
    let chars: Vec<char> = text.chars().collect();
    let max = cfg.max_chars.max(16);
    let mut headings: Vec<String> = vec![String::new()];
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut sentences: Vec<Sentence> = Vec::new();

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
                if is_sentence_end(chars[i]) || i - s + 1 >= max {
                    push_sentence(&chars, &mut sentences, s, i + 1, h);
                    s = i + 1;
                }
            }
            push_sentence(&chars, &mut sentences, s, line_end, h);
        }
        line_start = line_end + 1;
    }

    let mut out: Vec<Chunk> = Vec::new();
    let mut i = 0;
    while i < sentences.len() {
        let heading = sentences[i].heading;
        let start = sentences[i].start;
        let mut j = i;
        while j + 1 < sentences.len()
            && sentences[j + 1].heading == heading
            && sentences[j + 1].end - start <= max
        {
            j += 1;
        }
        let end = sentences[j].end;
        out.push(Chunk {
            heading: headings[heading].clone(),
            text: chars[start..end].iter().collect::<String>().trim().to_string(),
            char_start: start,
            char_end: end,
        });
        if j + 1 >= sentences.len() || sentences[j + 1].heading != heading {
            i = j + 1;
            continue;
        }
        // Overlap: step back over trailing sentences that fit in the overlap budget, but always advance.
        let mut k = j + 1;
        while k > i + 1 && sentences[j].end - sentences[k - 1].start <= cfg.overlap_chars {
            k -= 1;
        }
        i = k;
    }
    out
}

fn push_sentence(chars: &[char], out: &mut Vec<Sentence>, start: usize, end: usize, heading: usize) {
    if start < end && chars[start..end].iter().any(|c| !c.is_whitespace()) {
        out.push(Sentence { start, end, heading });
    }
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
        let cfg = ChunkConfig { max_chars: 22, overlap_chars: 11 };
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
        let chunks = chunk(&text, &ChunkConfig { max_chars: 20, overlap_chars: 0 });
        assert_eq!(chunks.iter().map(|c| c.text.chars().count()).collect::<Vec<_>>(), vec![20, 20, 10]);
    }
}
