//! The lexical (BM25) index: tantivy with a jieba tokenizer in search mode and a medical user dictionary.
//!
//! The index lives in `lexical/v1/` and is derived from SQLite: it stores only ids (chunk, document) and the
//! collection name; texts come back from SQLite. `index.json` beside the segments records the index format and
//! the hash of the dictionary that built it. When either differs from what this build would produce, the index
//! is rebuilt from SQLite instead of being queried with a tokenizer that disagrees with its terms.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use jieba_rs::{Jieba, TokenizeMode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, ConstScoreQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::tokenizer::{Token, TokenStream, Tokenizer};

/// A text fragment and the byte ranges in it to mark.
pub type Highlighted = (String, Vec<(usize, usize)>);
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use crate::error::{Error, Result};
use crate::store::ChunkRow;

pub const LEXICAL_FORMAT: u32 = 1;
/// Bumped when what goes into the index changes without a format change; a mismatch triggers a rebuild.
const CONTENT_REVISION: &str = "jieba_search+heading-context";
const TOKENIZER_NAME: &str = "jieba_search";
/// The medical dictionary shipped with the appliance; admins extend it with `user_dict.txt`.
pub const MEDICAL_DICT: &str = include_str!("../assets/medical_dict.txt");

/// Jieba in search mode: words plus their shorter in-vocabulary parts (禁忌症 → 禁忌, 禁忌症), so a query for either
/// form matches. Punctuation and whitespace are dropped; ASCII is lower-cased.
#[derive(Clone)]
pub struct JiebaTokenizer {
    jieba: Arc<Jieba>,
}

impl JiebaTokenizer {
    pub fn new(jieba: Arc<Jieba>) -> Self {
        JiebaTokenizer { jieba }
    }
}

pub struct JiebaTokenStream {
    tokens: Vec<Token>,
    index: usize,
}

fn is_indexable(word: &str) -> bool {
    word.chars().any(|c| c.is_alphanumeric())
}

/// The tokens of `text` as (byte_start, byte_end, lower-cased word), ordered by start, then end.
///
/// Why sorted: jieba's search mode yields a long word's 2-grams, then its 3-grams, then the word, so offsets go
/// backwards (二甲双胍 gives 二甲, 甲双, 双胍, 二甲双, 甲双胍, 二甲双胍). tantivy's snippet generator assumes tokens
/// never end before the fragment it is building starts and subtracted its way into a panic (page 11 of
/// 二甲双胍的禁忌症 answered 500; release builds wrapped silently). Queries use terms, not positions, so the order
/// changes no score and needs no re-indexing.
pub fn tokenize(jieba: &Jieba, text: &str) -> Vec<(usize, usize, String)> {
    let mut out: Vec<(usize, usize, String)> = jieba
        .tokenize(text, TokenizeMode::Search, true)
        .into_iter()
        .filter(|t| is_indexable(t.word))
        .map(|t| (t.byte_start, t.byte_end, t.word.to_lowercase()))
        .collect();
    out.sort_by_key(|t| (t.0, t.1));
    out
}

/// Byte ranges of the tokens of `text` that `wanted` accepts, overlapping and adjacent ones merged (search mode
/// yields both 二甲 and 二甲双胍; the reader sees one mark over 二甲双胍). Shared by snippets and the document view.
pub fn mark_ranges(jieba: &Jieba, text: &str, wanted: &dyn Fn(&str) -> bool) -> Vec<(usize, usize)> {
    let mut merged: Vec<(usize, usize)> = Vec::new();
    // `tokenize` yields tokens ordered by start, so one pass merges them.
    for (s, e, _) in tokenize(jieba, text).into_iter().filter(|(_, _, w)| wanted(w)) {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// The content words of a query, lower-cased, in order and without repeats: jieba's default segmentation (whole
/// dictionary words such as 替格瑞洛, not their parts) minus function words, punctuation and single Chinese
/// characters (too common to say anything on their own). These are the terms whose presence a result page states.
///
/// A two- or three-character word that no dictionary holds is jieba's HMM gluing colloquial or misspelt text
/// together (退疼, 完牙想, 环正取, 可放花): asserting that such a fragment occurs nowhere would be noise, so it is not
/// salient. Longer unknown words (a drug name the dictionaries lack) are; shorter drug and disease names are in
/// jieba's, the medical or the synonym dictionary, and the synonym table's terms are salient on their own.
pub fn content_words(jieba: &Jieba, text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in jieba.cut(text, true) {
        for w in dictionary_parts(jieba, w.word) {
            let known = jieba.has_word(&w);
            let w = w.trim().to_lowercase();
            let chars = w.chars().count();
            let single_cjk = chars == 1 && !w.is_ascii();
            let guessed_pair = (2..=3).contains(&chars) && !w.is_ascii() && !known;
            if !is_indexable(&w) || is_stopword(&w) || single_cjk || guessed_pair || (w.is_ascii() && chars < 2) {
                continue;
            }
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    // A transliterated name the words do not hold whole stands for its pieces (奈克, 拉托 in 维奈克拉托). Names the
    // words do hold (奥美拉唑 in 奥美拉唑索马鲁肽) are cut out of a run first: what is left is the unknown name.
    let whole: Vec<String> = out.iter().filter(|w| w.chars().count() >= 3).cloned().collect();
    for run in transliterated_runs(&text.to_lowercase()) {
        let mut rest = run;
        for w in &whole {
            rest = rest.replace(w.as_str(), " ");
        }
        for name in rest.split(' ').filter(|n| n.chars().count() >= 3) {
            if !out.iter().any(|w| w.contains(name)) {
                out.retain(|w| !name.contains(w.as_str()));
                out.push(name.to_string());
            }
        }
    }
    out
}

/// THUOCL's medical word list with each word's document frequency (assets/lexicon/README.md: source, licence). It
/// decides which words are clinical terms; it is not given to the segmenter, so indexing and ranking are unchanged.
const THUOCL_MEDICAL: &str = include_str!("../assets/lexicon/thuocl_medical.txt");

/// THUOCL's most frequent words are everyday ones (医院, 检查, 一次性, 人民医院): above this frequency only a word
/// with a clinical ending counts.
const THUOCL_EVERYDAY: u64 = 20_000;

/// Whether `word` is a term of the shipped medical lexicons: the medical dictionary, or THUOCL's medical list where
/// the word is specific (a clinical ending, or three characters or more and not among its most frequent words).
pub fn in_medical_lexicon(word: &str) -> bool {
    static MEDICAL: OnceLock<HashSet<&'static str>> = OnceLock::new();
    if HELD_OUT.get().is_some_and(|h| h.contains(word)) {
        return false;
    }
    let medical = MEDICAL.get_or_init(|| {
        let dict = MEDICAL_DICT.lines().filter_map(|l| l.split_whitespace().next());
        let thuocl = THUOCL_MEDICAL.lines().filter_map(|l| {
            let (w, freq) = l.split_once('\t')?;
            let freq: u64 = freq.trim().parse().ok()?;
            let clinical = w.ends_with(|c| CLINICAL_ENDINGS.contains(c));
            (clinical || (w.chars().count() >= 3 && freq <= THUOCL_EVERYDAY)).then_some(w.trim())
        });
        dict.chain(thuocl).collect()
    });
    medical.contains(word)
}

/// Words an evaluation keeps out of the lexicons ([`hold_out_of_lexicon`]).
static HELD_OUT: OnceLock<HashSet<String>> = OnceLock::new();

/// Keeps `words` out of [`in_medical_lexicon`] for the life of the process, so that an evaluation can measure how
/// names no lexicon holds are found (`care-bench --absent --hold-out`). Nothing in the appliance calls it.
pub fn hold_out_of_lexicon(words: impl IntoIterator<Item = String>) {
    let _ = HELD_OUT.set(words.into_iter().collect());
}

/// Endings of drug and disease names: a run of the query ending in one, absent from what the reader may read, is
/// a name the collections lack (罗氏综合征, 阿哌沙班, 龙血竭胶囊) even where its pieces occur.
const NAME_ENDINGS: &[&str] = &[
    "综合征",
    "综合症",
    "病",
    "症",
    "炎",
    "癌",
    "瘤",
    "溃疡",
    "结石",
    "梗死",
    "衰竭",
    "营养不良",
    "障碍",
    "畸形",
    "中毒",
    "硬化",
    "狭窄",
    "贫血",
    "疹",
    "癣",
    "瘘",
    "疝",
    "囊肿",
    "血肿",
    "片",
    "胶囊",
    "颗粒",
    "注射液",
    "口服液",
    "丸",
    "滴眼液",
    "乳膏",
    "软膏",
    "喷雾剂",
    "栓",
    "沙班",
    "替尼",
    "单抗",
    "韦",
    "肽",
    "唑",
    "胺",
    "嗪",
    "霉素",
    "沙星",
    "西林",
    "洛尔",
    "地平",
    "普利",
    "沙坦",
    "他汀",
    "格列净",
    "格列汀",
];

/// Dosage forms: a product's name before one may hold any words (元胡止痛片, 甘露消渴胶囊, 独一味咀嚼片).
const DOSAGE_FORMS: &[&str] =
    &["片", "胶囊", "颗粒", "注射液", "口服液", "丸", "滴眼液", "乳膏", "软膏", "喷雾剂", "栓"];

/// Words that take a medicine or say how, never part of its name (吃 in 慢性荨麻疹吃氯雷他定片).
const INTAKE: &[&str] =
    &["吃", "喝", "用", "服", "服用", "打", "买", "要", "想", "做", "给", "开", "换", "涂", "抹", "贴"];

/// Parts of speech that never stand in a name: pronouns, prepositions, conjunctions, particles, interjections.
const FUNCTION_TAGS: &[&str] = &["r", "p", "c", "u", "y", "e", "zg", "ul", "uj", "uv", "ud", "ug", "uz"];

/// Whether jieba knows `segment` as one word tagged with one of the lists' tags.
fn tagged(jieba: &Jieba, segment: &str, lists: &[&[&str]]) -> bool {
    matches!(jieba.tag(segment, false).as_slice(), [t] if lists.iter().any(|l| l.contains(&t.tag)))
}

/// Whether a segment may stand inside a product's name before its dosage form: any content word, verbs and
/// numbers included (止痛 in 元胡止痛片, 九味 in 九味羌活颗粒), but no word of taking it, pronoun, preposition,
/// conjunction or particle.
pub fn may_stand_in_product_name(jieba: &Jieba, segment: &str) -> bool {
    if is_stopword(segment) || INTAKE.contains(&segment) || !segment.chars().all(crate::text::is_cjk) {
        return false;
    }
    !tagged(jieba, segment, &[FUNCTION_TAGS])
}

/// Whether `word` ends in a dosage form ([`DOSAGE_FORMS`]).
pub fn dosage_form(word: &str) -> bool {
    DOSAGE_FORMS.iter().any(|e| word.ends_with(e) && word.len() > e.len())
}

/// Whether `word` (three characters or more) ends like a drug or disease name ([`NAME_ENDINGS`]).
pub fn name_shaped(word: &str) -> bool {
    word.chars().count() >= 3 && NAME_ENDINGS.iter().any(|e| word.ends_with(e) && word.len() > e.len())
}

/// Whether a segment may begin a name: not a function word, verb, pronoun, number or measure word (吃, 能, 这, 两).
pub fn may_begin_name(jieba: &Jieba, segment: &str) -> bool {
    if is_stopword(segment) || !segment.chars().all(crate::text::is_cjk) {
        return false;
    }
    if !jieba.has_word(segment) {
        return true;
    }
    // Verbs, numbers, measure words, adverbs, place and time words begin no name either.
    !tagged(jieba, segment, &[FUNCTION_TAGS, &["v", "vd", "m", "q", "d", "f", "t"]])
}

/// Whether a segment may stand inside a name after its first: as [`may_begin_name`], and also a single character
/// or a word of place (下 in 硬膜下血肿) or a number (三 in 二十一三体).
pub fn may_continue_name(jieba: &Jieba, segment: &str) -> bool {
    // A single character inside is the segmenter's failure on an unknown name (凡 of 马凡), whatever its tag.
    if may_begin_name(jieba, segment) || (segment.chars().count() == 1 && !is_stopword(segment)) {
        return true;
    }
    !is_stopword(segment) && segment.chars().all(crate::text::is_cjk) && tagged(jieba, segment, &[&["f", "m"]])
}

/// The tag the admin's dictionary words carry in the segmenter (jieba's own words carry parts of speech).
const ADMIN_TAG: &str = "care_admin";

/// Last characters that make a word a clinical noun: diseases and signs (…炎, …癌, …症), anatomy (…腺, …膜),
/// substances and dosage forms (…素, …酸, …片) and the common drug-name stems' endings.
const CLINICAL_ENDINGS: &str = "炎癌瘤症病痛疹疮痰腺膜菌素酸剂片胺苷酶醇酮嗪唑啶膦汀胞囊瘘痔疝痈疖癣痣瘫痹痿疸瘀肿疡脓结石栓塞梗衰泻疣\
                                 肝肾肺胃肠脑骨髓脉管窦核苗毒霉肽肌";

/// Whether a content word is one a result page may say occurs nowhere: a term of the medical dictionary or the
/// admin's, a transliterated name ([`transliterated_runs`]), a clinical noun (its last character is one of [`CLINICAL_ENDINGS`]), an unknown word of four or more
/// Chinese characters (a drug name no dictionary holds), or a Latin word of six or more letters. Everyday words
/// (镜子, 孙子, 咋办), numbers and measurements (175cm, 2013), and short Latin abbreviations the synonym table does
/// not know (cdfi) are still searched and shown as matched, but their absence says nothing about the collections:
/// a narrative question that mentions a mirror is not unanswered because no passage mentions one. The synonym
/// table's terms are key terms on their own ([`crate::query`]).
pub fn is_key_term(jieba: &Jieba, word: &str) -> bool {
    if in_medical_lexicon(word) {
        return true;
    }
    if word.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    if !transliterated_runs(word).is_empty() {
        return true;
    }
    if word.is_ascii() {
        return word.len() >= 6 && word.chars().all(|c| c.is_ascii_alphabetic());
    }
    if !jieba.has_word(word) {
        return word.chars().count() >= 4 || word.ends_with(|c| CLINICAL_ENDINGS.contains(c));
    }
    let tags = jieba.tag(word, false);
    match tags.as_slice() {
        [t] if t.tag == ADMIN_TAG => true,
        [t] => matches!(t.tag, "n" | "nz" | "vn" | "b") && word.ends_with(|c| CLINICAL_ENDINGS.contains(c)),
        _ => false,
    }
}

/// Characters that spell foreign names in Chinese, drug names above all (替格瑞洛, 瑞戈非尼, 维奈克拉, 司美格鲁肽).
/// Characters common in everyday words (地, 多, 生, 新, 安, 来, 常) are left out, so three of these in a row rarely
/// occur outside a transliterated name.
const TRANSLITERATION: &str = "阿艾奥巴贝比苄布达德迪丁厄恩尔伐法泛非菲芬伏弗氟福伽格戈哈赫吉嘉卡坎克喹拉莱赖兰劳雷黎里\
                               利林膦卢鲁伦罗洛氯马麦曼美蒙孟咪米莫姆那纳奈尼诺帕哌培喷匹泼珀普齐奇羟嗪曲瑞萨塞赛沙莎\
                               舍什施舒司丝斯苏索他塔泰坦特替汀酮托妥瓦万维韦沃乌西希昔辛欣溴亚伊依茵英尤佑扎泽珠佐唑\
                               啶胺肽苷";

/// Runs of three or more transliteration characters in `text`: the drug names no dictionary holds, which jieba
/// cuts into meaningless pieces (维奈克拉 → 维 + 奈克 + 拉) or drops.
pub fn transliterated_runs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut run = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if TRANSLITERATION.contains(c) && !c.is_ascii() {
            run.push(c);
            continue;
        }
        if run.chars().count() >= 3 && !out.contains(&run) {
            out.push(run.clone());
        }
        run.clear();
    }
    out
}

/// A word the HMM made up (not in any dictionary) that contains dictionary words is those words glued to their
/// neighbours (产检有 = 产检 + 有): its dictionary words stand for it. One that contains none (an unknown drug name)
/// stays whole.
fn dictionary_parts(jieba: &Jieba, word: &str) -> Vec<String> {
    if word.chars().count() < 3 || jieba.has_word(word) || word.is_ascii() {
        return vec![word.to_string()];
    }
    let parts: Vec<String> = jieba
        .cut(word, false)
        .into_iter()
        .map(|t| t.word.to_string())
        .filter(|p| p.chars().count() >= 2 && jieba.has_word(p))
        .collect();
    if parts.is_empty() { vec![word.to_string()] } else { parts }
}

impl Tokenizer for JiebaTokenizer {
    type TokenStream<'a> = JiebaTokenStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> JiebaTokenStream {
        let tokens = tokenize(&self.jieba, text)
            .into_iter()
            .enumerate()
            .map(|(position, (from, to, word))| Token {
                offset_from: from,
                offset_to: to,
                position,
                text: word,
                position_length: 1,
            })
            .collect();
        JiebaTokenStream { tokens, index: 0 }
    }
}

impl TokenStream for JiebaTokenStream {
    fn advance(&mut self) -> bool {
        self.index += 1;
        self.index <= self.tokens.len()
    }
    fn token(&self) -> &Token {
        &self.tokens[self.index - 1]
    }
    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.index - 1]
    }
}

/// Function words that carry no meaning in a highlight (they still count, with their low IDF, in BM25).
const STOPWORDS: &[&str] = &[
    "的",
    "了",
    "是",
    "在",
    "和",
    "与",
    "及",
    "或",
    "有",
    "吗",
    "呢",
    "吧",
    "啊",
    "什么",
    "怎么",
    "怎么办",
    "如何",
    "为什么",
    "哪些",
    "多少",
    "能",
    "会",
    "要",
    "可以",
    "一个",
    "这",
    "那",
    "就",
    "都",
    "也",
    "还",
    "得",
    "地",
    "着",
    "过",
    "对",
    "咋",
    "啥",
    "咋办",
    "咋样",
    "为啥",
    "啥意思",
];

pub fn is_stopword(word: &str) -> bool {
    STOPWORDS.contains(&word)
}

/// Builds the segmenter: jieba's dictionary + the shipped medical dictionary + the admin's additions.
/// Returns the segmenter and a hash identifying the dictionaries (stored in the index metadata).
pub fn build_jieba(user_dict: Option<&Path>) -> Result<(Jieba, String)> {
    let mut jieba = Jieba::new();
    let mut hasher = Sha256::new();
    hasher.update(MEDICAL_DICT.as_bytes());
    jieba
        .load_dict(&mut std::io::Cursor::new(MEDICAL_DICT))
        .map_err(|e| Error::Internal(format!("shipped medical dictionary: {e}")))?;
    if let Some(p) = user_dict.filter(|p| p.exists()) {
        let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
        let normalized = normalize_dict(&text, p)?;
        hasher.update(b"\0user\0");
        hasher.update(normalized.as_bytes());
        // Tags do not change segmentation (the hash above stays what it was); the admin's words are loaded tagged
        // `ADMIN_TAG` so that query understanding knows them as the hospital's own vocabulary.
        let tagged: String = normalized
            .lines()
            .map(|l| {
                let mut f = l.split_whitespace();
                format!("{} {} {ADMIN_TAG}\n", f.next().unwrap_or(""), f.next().unwrap_or("20000"))
            })
            .collect();
        jieba
            .load_dict(&mut std::io::Cursor::new(tagged))
            .map_err(|e| Error::InvalidInput(format!("词典 {} 无法读取：{e}", p.display())))?;
    }
    Ok((jieba, hex::encode(hasher.finalize())))
}

/// Accepts `word`, `word freq` or `word freq tag` per line; blank lines and `#` comments are ignored.
fn normalize_dict(text: &str, path: &Path) -> Result<String> {
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() > 3 || (parts.len() >= 2 && parts[1].parse::<usize>().is_err()) {
            return Err(Error::MalformedRecord {
                path: path.to_path_buf(),
                line: i + 1,
                message: format!("expected `word [frequency [tag]]`, found {line:?}"),
            });
        }
        let freq = parts.get(1).copied().unwrap_or("20000");
        match parts.get(2) {
            Some(tag) => out.push_str(&format!("{} {freq} {tag}\n", parts[0])),
            None => out.push_str(&format!("{} {freq}\n", parts[0])),
        }
    }
    Ok(out)
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct IndexMeta {
    format: u32,
    tokenizer: String,
    dictionary_sha256: String,
}

#[derive(Clone, Copy)]
struct Fields {
    chunk_id: Field,
    document_id: Field,
    collection: Field,
    title: Field,
    body: Field,
}

pub struct LexicalIndex {
    dir: PathBuf,
    index: Index,
    reader: IndexReader,
    writer: Mutex<Option<IndexWriter<TantivyDocument>>>,
    fields: Fields,
    jieba: Arc<Jieba>,
    /// True when the index was (re)created empty because its format or dictionary changed.
    pub needs_rebuild: bool,
}

impl std::fmt::Debug for LexicalIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LexicalIndex").field("dir", &self.dir).finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LexicalHit {
    pub chunk_id: i64,
    pub document_id: i64,
    pub score: f32,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let text = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER_NAME)
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    );
    let fields = Fields {
        chunk_id: b.add_u64_field("chunk_id", INDEXED | FAST | STORED),
        document_id: b.add_u64_field("document_id", INDEXED | FAST),
        collection: b.add_text_field("collection", STRING | FAST),
        title: b.add_text_field("title", text.clone()),
        body: b.add_text_field("body", text),
    };
    (b.build(), fields)
}

impl LexicalIndex {
    /// Opens `root/v1`, recreating it empty (and flagging `needs_rebuild`) when it is missing, of another
    /// format, or built with other dictionaries.
    pub fn open(root: &Path, user_dict: Option<&Path>) -> Result<Self> {
        let (jieba, dict_hash) = build_jieba(user_dict)?;
        let jieba = Arc::new(jieba);
        let dir = root.join(format!("v{LEXICAL_FORMAT}"));
        let meta_path = dir.join("index.json");
        let want =
            IndexMeta { format: LEXICAL_FORMAT, tokenizer: CONTENT_REVISION.into(), dictionary_sha256: dict_hash };
        let have: Option<IndexMeta> = std::fs::read(&meta_path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(h) = &have
            && h.format > LEXICAL_FORMAT
        {
            return Err(Error::TooNew {
                what: format!("lexical index {}", dir.display()),
                found: h.format,
                supported: LEXICAL_FORMAT,
            });
        }
        let (schema, fields) = schema();
        let (index, needs_rebuild) = if have.as_ref() == Some(&want) && dir.join("meta.json").exists() {
            (Index::open_in_dir(&dir)?, false)
        } else {
            if dir.exists() {
                tracing::warn!(dir = %dir.display(), "lexical index is stale (format or dictionary changed); rebuilding");
                std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            }
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let index = Index::create_in_dir(&dir, schema)?;
            let tmp = dir.join(".index.json.tmp");
            let bytes = serde_json::to_vec_pretty(&want).map_err(|e| Error::Internal(e.to_string()))?;
            std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
            std::fs::rename(&tmp, &meta_path).map_err(|e| Error::io(&meta_path, e))?;
            (index, true)
        };
        index.tokenizers().register(TOKENIZER_NAME, JiebaTokenizer::new(jieba.clone()));
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(LexicalIndex { dir, index, reader, writer: Mutex::new(None), fields, jieba, needs_rebuild })
    }

    pub fn jieba(&self) -> &Jieba {
        &self.jieba
    }

    /// The writer is opened on first use so read-only commands never take tantivy's writer lock.
    fn writer(&self) -> Result<MutexGuard<'_, Option<IndexWriter<TantivyDocument>>>> {
        let mut guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.index.writer_with_num_threads(1, 64 * 1024 * 1024)?);
        }
        Ok(guard)
    }

    /// Replaces the chunks of the given documents: deletes every chunk of each document, then adds `chunks`.
    /// Nothing is visible until [`LexicalIndex::commit`].
    pub fn replace_documents(&self, doc_ids: &[i64], chunks: &[ChunkRow]) -> Result<()> {
        let guard = self.writer()?;
        let w = guard.as_ref().ok_or_else(|| Error::Internal("writer missing".into()))?;
        for id in doc_ids {
            w.delete_term(Term::from_field_u64(self.fields.document_id, *id as u64));
        }
        for c in chunks {
            let mut doc = TantivyDocument::default();
            doc.add_u64(self.fields.chunk_id, c.chunk_id as u64);
            doc.add_u64(self.fields.document_id, c.document_id as u64);
            doc.add_text(self.fields.collection, &c.collection);
            // The heading path usually starts with the document title (its H1); index the title once.
            let title = if c.heading.is_empty() {
                c.title.clone()
            } else if c.heading.starts_with(c.title.as_str()) {
                c.heading.clone()
            } else {
                format!("{} > {}", c.title, c.heading)
            };
            doc.add_text(self.fields.title, &title);
            // The heading path is the chunk's context ("二甲双胍 > 禁忌症"): a chunk under 禁忌症 rarely repeats the
            // word itself, yet is exactly what a query for it wants.
            if c.heading.is_empty() {
                doc.add_text(self.fields.body, &c.text);
            } else {
                doc.add_text(self.fields.body, format!("{}\n{}", c.heading, c.text));
            }
            w.add_document(doc)?;
        }
        Ok(())
    }

    pub fn delete_documents(&self, doc_ids: &[i64]) -> Result<()> {
        self.replace_documents(doc_ids, &[])
    }

    pub fn delete_all(&self) -> Result<()> {
        let guard = self.writer()?;
        let w = guard.as_ref().ok_or_else(|| Error::Internal("writer missing".into()))?;
        w.delete_all_documents()?;
        Ok(())
    }

    /// Makes everything added or deleted so far durable and visible, atomically.
    pub fn commit(&self) -> Result<()> {
        let mut guard = self.writer()?;
        if let Some(w) = guard.as_mut() {
            w.commit()?;
        }
        drop(guard);
        self.reader.reload()?;
        Ok(())
    }

    pub fn reload(&self) -> Result<()> {
        Ok(self.reader.reload()?)
    }

    pub fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Every (chunk_id, document_id) in the index, for consistency checks.
    pub fn all_ids(&self) -> Result<Vec<(i64, i64)>> {
        let searcher = self.reader.searcher();
        let mut out = Vec::new();
        for seg in searcher.segment_readers() {
            let chunk = seg.fast_fields().u64("chunk_id")?;
            let doc = seg.fast_fields().u64("document_id")?;
            for d in seg.doc_ids_alive() {
                if let (Some(c), Some(p)) = (chunk.first(d), doc.first(d)) {
                    out.push((c as i64, p as i64));
                }
            }
        }
        Ok(out)
    }

    /// The query's terms with weight 1 (the plain BM25 query of `text`).
    pub fn terms(&self, text: &str) -> Vec<(String, f32)> {
        tokenize(&self.jieba, text).into_iter().map(|t| (t.2, 1.0)).collect()
    }

    /// A disjunction of weighted terms over body and title (title boosted), restricted to `collections`. A term of
    /// weight 1 is a plain term query, so unexpanded queries score exactly as before expansion existed.
    fn build_weighted(
        &self,
        terms: &[(String, f32)],
        collections: Option<&[String]>,
        title_boost: f32,
    ) -> Option<Box<dyn Query>> {
        if terms.is_empty() {
            return None;
        }
        let weighted = |q: TermQuery, w: f32| -> Box<dyn Query> {
            if w == 1.0 { Box::new(q) } else { Box::new(tantivy::query::BoostQuery::new(Box::new(q), w)) }
        };
        let mut should: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for (word, w) in terms {
            let body = TermQuery::new(Term::from_field_text(self.fields.body, word), IndexRecordOption::WithFreqs);
            should.push((Occur::Should, weighted(body, *w)));
            if title_boost > 0.0 {
                let q = TermQuery::new(Term::from_field_text(self.fields.title, word), IndexRecordOption::WithFreqs);
                should.push((Occur::Should, weighted(q, title_boost * w)));
            }
        }
        let terms: Box<dyn Query> = Box::new(BooleanQuery::new(should));
        match collections {
            None => Some(terms),
            Some(cols) => Some(Box::new(BooleanQuery::new(vec![
                (Occur::Must, terms),
                (Occur::Must, self.collection_filter(cols)),
            ]))),
        }
    }

    fn collection_filter(&self, cols: &[String]) -> Box<dyn Query> {
        let filter: Vec<(Occur, Box<dyn Query>)> = cols
            .iter()
            .map(|c| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(
                    Term::from_field_text(self.fields.collection, c),
                    IndexRecordOption::Basic,
                ));
                (Occur::Should, q)
            })
            .collect();
        Box::new(ConstScoreQuery::new(Box::new(BooleanQuery::new(filter)), 0.0))
    }

    /// The query matching chunks of `collections` that hold `word` as an index term (body or title).
    fn word_in(&self, word: &str, collections: &[String]) -> BooleanQuery {
        let term = |f: Field| -> Box<dyn Query> {
            Box::new(TermQuery::new(Term::from_field_text(f, word), IndexRecordOption::Basic))
        };
        let either: Box<dyn Query> = Box::new(BooleanQuery::new(vec![
            (Occur::Should, term(self.fields.body)),
            (Occur::Should, term(self.fields.title)),
        ]));
        BooleanQuery::new(vec![(Occur::Must, either), (Occur::Must, self.collection_filter(collections))])
    }

    /// How many chunks of `collections` hold `word` as an index term (body or title).
    pub fn chunks_with(&self, word: &str, collections: &[String]) -> Result<usize> {
        if collections.is_empty() {
            return Ok(0);
        }
        Ok(self.reader.searcher().search(&self.word_in(word, collections), &tantivy::collector::Count)?)
    }

    /// Whether any chunk of `collections` holds `word` as an index term. Every search asks this for each of its
    /// words, so it stops at the first live match instead of counting a common word's whole posting list.
    pub fn any_chunk_with(&self, word: &str, collections: &[String]) -> Result<bool> {
        if collections.is_empty() {
            return Ok(false);
        }
        let searcher = self.reader.searcher();
        let df = searcher.doc_freq(&Term::from_field_text(self.fields.body, word))?
            + searcher.doc_freq(&Term::from_field_text(self.fields.title, word))?;
        if df == 0 {
            return Ok(false);
        }
        let query = self.word_in(word, collections);
        let weight = query.weight(tantivy::query::EnableScoring::disabled_from_searcher(&searcher))?;
        for segment in searcher.segment_readers() {
            let mut scorer = weight.scorer(segment, 1.0)?;
            let alive = segment.alive_bitset();
            let mut doc = scorer.doc();
            while doc != tantivy::TERMINATED {
                if alive.is_none_or(|a| a.is_alive(doc)) {
                    return Ok(true);
                }
                doc = scorer.advance();
            }
        }
        Ok(false)
    }

    /// BM25 top `limit` chunks for `text`, optionally restricted to `collections`.
    pub fn search(
        &self,
        text: &str,
        collections: Option<&[String]>,
        limit: usize,
        title_boost: f32,
    ) -> Result<Vec<LexicalHit>> {
        self.search_weighted(&self.terms(text), collections, limit, title_boost)
    }

    /// BM25 top `limit` chunks for weighted terms (query expansion: the original terms weigh more).
    pub fn search_weighted(
        &self,
        terms: &[(String, f32)],
        collections: Option<&[String]>,
        limit: usize,
        title_boost: f32,
    ) -> Result<Vec<LexicalHit>> {
        self.search_where(terms, collections, limit, title_boost, None)
    }

    /// [`LexicalIndex::search_weighted`] among the chunks of the documents in `keep` (a search filter): tested on
    /// the `document_id` fast field as hits are collected, before the top `limit` is cut.
    pub fn search_where(
        &self,
        terms: &[(String, f32)],
        collections: Option<&[String]>,
        limit: usize,
        title_boost: f32,
        keep: Option<&Arc<crate::facets::DocSet>>,
    ) -> Result<Vec<LexicalHit>> {
        Ok(self.search_pair(terms, collections, limit, title_boost, false, keep)?.1)
    }

    /// The top `limit` of every chunk (when `all`; else empty) and of the chunks of the documents in `keep`, from one
    /// walk of the postings (a pair of collectors).
    pub fn search_pair(
        &self,
        terms: &[(String, f32)],
        collections: Option<&[String]>,
        limit: usize,
        title_boost: f32,
        all: bool,
        keep: Option<&Arc<crate::facets::DocSet>>,
    ) -> Result<(Vec<LexicalHit>, Vec<LexicalHit>)> {
        let Some(query) = self.build_weighted(terms, collections, title_boost) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let searcher = self.reader.searcher();
        let top_docs = || TopDocs::with_limit(limit.max(1)).order_by_score();
        let filtered = |set: &Arc<crate::facets::DocSet>| {
            let set = set.clone();
            let admit = move |doc: u64| i64::try_from(doc).is_ok_and(|d| set.contains(d));
            tantivy::collector::FilterCollector::new("document_id".to_string(), admit, top_docs())
        };
        let (every, kept) = match keep {
            None => (Vec::new(), searcher.search(&query, &top_docs())?),
            Some(set) if all => searcher.search(&query, &(top_docs(), filtered(set)))?,
            Some(set) => (Vec::new(), searcher.search(&query, &filtered(set))?),
        };
        Ok((self.hits_of(&searcher, every)?, self.hits_of(&searcher, kept)?))
    }

    /// Chunk and document ids of collected top docs (read from the fast fields, a column per segment).
    fn hits_of(&self, searcher: &tantivy::Searcher, top: Vec<(f32, tantivy::DocAddress)>) -> Result<Vec<LexicalHit>> {
        let mut out = Vec::with_capacity(top.len());
        let mut columns: Vec<Option<(tantivy::columnar::Column<u64>, tantivy::columnar::Column<u64>)>> =
            vec![None; searcher.segment_readers().len()];
        for (score, addr) in top {
            let slot = &mut columns[addr.segment_ord as usize];
            if slot.is_none() {
                let ff = searcher.segment_reader(addr.segment_ord).fast_fields();
                *slot = Some((ff.u64("chunk_id")?, ff.u64("document_id")?));
            }
            if let Some((c, d)) = slot.as_ref()
                && let (Some(chunk_id), Some(document_id)) = (c.first(addr.doc_id), d.first(addr.doc_id))
            {
                out.push(LexicalHit { chunk_id: chunk_id as i64, document_id: document_id as i64, score });
            }
        }
        Ok(out)
    }

    /// Highlights the query's terms in each text: tantivy picks the best fragment (at most `max_bytes`), then every
    /// query word found in it is marked, overlapping and adjacent matches merged (search mode yields both
    /// 二甲 and 二甲双胍; the reader should see one mark over 二甲双胍). Function words are not marked. The query is
    /// analysed once for all texts of a result page.
    pub fn snippets(&self, query: &str, texts: &[&str], max_bytes: usize) -> Result<Vec<Highlighted>> {
        self.snippets_for(&self.terms(query), texts, max_bytes, &|t| t.to_string())
    }

    /// [`LexicalIndex::snippets`] for weighted terms (expanded queries: every form is marked); `fold` maps a
    /// passage's words to the forms the terms are in (traditional → simplified), so 高血壓 in a passage is marked for
    /// a query of 高血压.
    pub fn snippets_for(
        &self,
        terms: &[(String, f32)],
        texts: &[&str],
        max_bytes: usize,
        fold: &dyn Fn(&str) -> String,
    ) -> Result<Vec<Highlighted>> {
        let generator = match self.build_weighted(terms, None, 0.0) {
            Some(q) => {
                let searcher = self.reader.searcher();
                let mut g = SnippetGenerator::create(&searcher, q.as_ref(), self.fields.body)?;
                g.set_max_num_chars(max_bytes);
                Some(g)
            }
            None => None,
        };
        let words: std::collections::HashSet<String> =
            terms.iter().map(|t| t.0.clone()).filter(|w| !is_stopword(w)).collect();
        let mut out = Vec::with_capacity(texts.len());
        for text in texts {
            let fragment = generator.as_ref().map(|g| g.snippet(text).fragment().to_string()).unwrap_or_default();
            let (start, end) = match text.find(fragment.as_str()).filter(|_| !fragment.is_empty()) {
                Some(at) => (at, at + fragment.len()),
                // No query word occurs in this chunk (it matched on its title or by meaning): show its beginning.
                None => {
                    let mut end = max_bytes.min(text.len());
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    (0, end)
                }
            };
            out.push(self.cut_at_words(text, start, end, &|w| words.contains(w) || words.contains(&fold(w))));
        }
        Ok(out)
    }

    /// `text[start..end]` as a snippet that begins and ends on whole words, with … where the passage goes on and
    /// the wanted words marked. tantivy cuts a fragment at the ends of its tokens, and the index's tokens include
    /// the parts of long words (二甲 of 二甲双胍), so a fragment could end inside a drug's name; a passage's
    /// beginning is cut at a byte budget. Both move inward to the nearest boundary of jieba's default cut (outward
    /// when inward leaves nothing).
    fn cut_at_words(&self, text: &str, start: usize, end: usize, wanted: &dyn Fn(&str) -> bool) -> Highlighted {
        let mut bounds = vec![0];
        for w in self.jieba.cut(text, false) {
            bounds.push(bounds[bounds.len() - 1] + w.word.len());
        }
        let inward = (bounds.iter().find(|&&b| b >= start), bounds.iter().rev().find(|&&b| b <= end));
        let (start, end) = match inward {
            (Some(&s), Some(&e)) if s < e => (s, e),
            _ => (
                bounds.iter().rev().find(|&&b| b <= start).copied().unwrap_or(0),
                bounds.iter().find(|&&b| b >= end).copied().unwrap_or(text.len()),
            ),
        };
        let fragment = &text[start..end];
        let (before, after) = (if start > 0 { "…" } else { "" }, if end < text.len() { "…" } else { "" });
        let marks = mark_ranges(&self.jieba, fragment, wanted);
        let shift = before.len();
        (format!("{before}{fragment}{after}"), marks.into_iter().map(|(s, e)| (s + shift, e + shift)).collect())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medical_dictionary_keeps_drug_names_whole() {
        let (jieba, _) = build_jieba(None).unwrap();
        let words: Vec<String> = tokenize(&jieba, "二甲双胍的禁忌症，ＣＴ").into_iter().map(|t| t.2).collect();
        assert!(words.contains(&"二甲双胍".to_string()), "{words:?}");
        assert!(words.contains(&"禁忌症".to_string()), "{words:?}");
        assert!(!words.iter().any(|w| w == "，"), "punctuation must be dropped: {words:?}");
    }

    #[test]
    fn user_dictionary_changes_segmentation_and_hash() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("user_dict.txt");
        let (j0, h0) = build_jieba(Some(&p)).unwrap();
        let before: Vec<String> = tokenize(&j0, "替尔泊肽注射液").into_iter().map(|t| t.2).collect();
        std::fs::write(&p, "# 新药\n替尔泊肽 50000 nz\n").unwrap();
        let (j1, h1) = build_jieba(Some(&p)).unwrap();
        let after: Vec<String> = tokenize(&j1, "替尔泊肽注射液").into_iter().map(|t| t.2).collect();
        assert!(!before.contains(&"替尔泊肽".to_string()));
        assert!(after.contains(&"替尔泊肽".to_string()), "{after:?}");
        assert_ne!(h0, h1);
        std::fs::write(&p, "坏 行 有 四列\n").unwrap();
        let err = build_jieba(Some(&p)).unwrap_err();
        assert!(err.to_string().contains("user_dict.txt 第 1 行"), "{err}");
    }

    /// Random queries and passages through the snippet generator (the search page's highlight path): no panic, and
    /// every highlight is a char-boundary range inside its fragment. CI runs `CARE_SNIPPET_FUZZ_CASES` (default
    /// 3,000); the long form is 100,000 (docs/benchmarks.md, "Snippet fuzzing").
    #[test]
    fn snippet_generation_survives_random_queries_and_passages() {
        let t = tempfile::tempdir().unwrap();
        let lex = LexicalIndex::open(t.path(), None).unwrap();
        let chunk = |id: i64, text: &str| ChunkRow {
            chunk_id: id,
            document_id: id,
            collection: "c".into(),
            title: String::new(),
            heading: String::new(),
            text: text.into(),
        };
        let cases: usize = std::env::var("CARE_SNIPPET_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
        // Words that jieba's search mode splits into overlapping parts (the panic's trigger), punctuation, ASCII,
        // traditional characters and odd code points.
        let words = [
            "二甲双胍",
            "禁忌症",
            "禁忌",
            "高血压",
            "高血壓",
            "慢性阻塞性肺疾病",
            "心肌梗死",
            "COPD",
            "DM",
            "布洛芬",
            "，",
            "。",
            "（",
            "）",
            " ",
            "\n",
            "a",
            "123",
            "mg/kg",
            "乳酸性酸中毒",
            "肾功能不全",
            "𠀀",
            "\u{200B}",
            "ｱ",
            "的",
            "了",
            "急性冠状动脉综合征",
            "非甾体抗炎药",
            "维生素B12",
            "🙂",
        ];
        // Every word indexed, so the snippet generator weighs them all (it ignores terms no document holds).
        lex.replace_documents(&[], &words.iter().enumerate().map(|(i, w)| chunk(i as i64, w)).collect::<Vec<_>>())
            .unwrap();
        lex.commit().unwrap();
        lex.reload().unwrap();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let text = |len: usize, next: &mut dyn FnMut(usize) -> usize| -> String {
            (0..len).map(|_| words[next(words.len())]).collect()
        };
        for i in 0..cases {
            let ql = 1 + next(6);
            let q = text(ql, &mut next);
            let passages: Vec<String> = (0..3)
                .map(|_| {
                    let l = next(120);
                    text(l, &mut next)
                })
                .collect();
            let refs: Vec<&str> = passages.iter().map(String::as_str).collect();
            let max = 16 + next(300);
            let out = lex.snippets(&q, &refs, max).unwrap_or_else(|err| panic!("case {i}: {q:?}: {err}"));
            for ((frag, marks), passage) in out.into_iter().zip(&passages) {
                for (s, x) in marks {
                    assert!(
                        s < x && x <= frag.len() && frag.is_char_boundary(s) && frag.is_char_boundary(x),
                        "case {i}: {q:?}"
                    );
                    assert!(!frag[s..x].contains('…'), "case {i}: the ellipsis is marked in {frag:?}");
                }
                // Whole words of the passage, and … exactly where it goes on.
                let inner = frag.strip_prefix('…').unwrap_or(&frag);
                let inner = inner.strip_suffix('…').unwrap_or(inner);
                let mut bounds = vec![0];
                for w in lex.jieba.cut(passage, false) {
                    bounds.push(bounds[bounds.len() - 1] + w.word.len());
                }
                assert_eq!(bounds.last(), Some(&passage.len()));
                let fits = |at: usize| {
                    let end = at + inner.len();
                    bounds.contains(&at)
                        && bounds.contains(&end)
                        && frag.starts_with('…') == (at > 0)
                        && frag.ends_with('…') == (end < passage.len())
                };
                assert!(
                    passage.match_indices(inner).any(|(at, _)| fits(at)),
                    "case {i}: {frag:?} is not whole words of {passage:?} with … where it goes on"
                );
            }
        }
    }

    /// A word the HMM glued together stands for the dictionary words inside it; an unknown name stays whole.
    #[test]
    fn made_up_words_stand_for_their_dictionary_parts() {
        let (j, _) = build_jieba(None).unwrap();
        assert_eq!(dictionary_parts(&j, "高血压有"), vec!["高血压".to_string()]);
        assert_eq!(dictionary_parts(&j, "qwzxv"), vec!["qwzxv".to_string()], "no dictionary part: whole");
        assert_eq!(dictionary_parts(&j, "二甲双胍"), vec!["二甲双胍".to_string()], "a dictionary word stays");
    }

    /// The page-11 crash, reduced: search-mode tokens of a long word end before a later fragment starts.
    #[test]
    fn tokens_come_sorted_by_offset_so_snippets_of_long_words_never_underflow() {
        let (j, _) = build_jieba(None).unwrap();
        let toks = tokenize(&j, "慢性阻塞性肺疾病患者禁用二甲双胍，乳酸性酸中毒风险");
        assert!(toks.windows(2).all(|w| (w[0].0, w[0].1) <= (w[1].0, w[1].1)), "{toks:?}");
        let t = tempfile::tempdir().unwrap();
        let lex = LexicalIndex::open(t.path(), None).unwrap();
        let text = "二甲双胍禁忌症：".repeat(40) + "慢性阻塞性肺疾病";
        let row = ChunkRow {
            chunk_id: 1,
            document_id: 1,
            collection: "c".into(),
            title: String::new(),
            heading: String::new(),
            text: text.clone(),
        };
        lex.replace_documents(&[], &[row]).unwrap();
        lex.commit().unwrap();
        lex.reload().unwrap();
        for max in [8, 20, 33, 64, 150] {
            let out = lex.snippets("二甲双胍的禁忌症 慢性阻塞性肺疾病", &[text.as_str()], max).unwrap();
            assert!(!out[0].0.is_empty());
        }
    }
}
