//! Query understanding, applied at query time so that nothing is re-indexed.
//!
//! A query is folded the way passages were at ingest (full-width letters and digits to ASCII, [`crate::text`])
//! and from traditional to simplified characters (OpenCC's t2s tables), so 高血壓 searches for 高血压. Passages
//! written in traditional characters keep their index terms; the query therefore also carries the traditional
//! forms of its words, weighted like the words themselves, and highlighting folds a passage's words before
//! comparing them. Its salient terms (content words: dictionary words, not function words or single characters)
//! are what a result page reports as found or not found.
//!
//! Terms of the synonym table ([`crate::synonyms`]) found in the query add their group's other terms at a lower
//! weight; such a term is salient as a whole (慢阻肺, not 慢阻 and 肺) and counts as found where any of its group's
//! terms is.

use std::collections::HashMap;

use jieba_rs::Jieba;

use crate::lexical;
use crate::synonyms::SynonymTable;
pub use crate::text::{contains_term, fold, to_simplified, to_traditional};

/// A query as searched.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    /// As typed (trimmed).
    pub original: String,
    /// Normalised and simplified: what the query encoder reads and the terms come from.
    pub folded: String,
    /// BM25 terms with weights: the folded query's tokens (weight 1, exactly the unexpanded query), then the
    /// traditional forms of its words that differ from them, then the tokens of synonyms (`synonym_weight`).
    pub terms: Vec<(String, f32)>,
    /// Content words of the folded query and the synonym-table terms in it, in order.
    pub salient: Vec<String>,
    /// The salient terms whose absence a page states (未找到包含…): the synonym table's terms and
    /// [`lexical::is_key_term`]'s. The others (everyday words, numbers) count where they match and are otherwise
    /// passed over in silence.
    pub key: Vec<String>,
    /// For a salient term of the synonym table: the other terms of its group (folded), which count as it.
    pub alternatives: HashMap<String, Vec<String>>,
    /// The synonym-table terms of the query as found, with their group's other terms as written (shown as
    /// 同时检索了).
    pub expansions: Vec<(String, Vec<String>)>,
}

impl QueryPlan {
    /// The plan without synonym expansion.
    pub fn new(jieba: &Jieba, query: &str) -> Self {
        Self::with_synonyms(jieba, query, &SynonymTable::default(), 0.0)
    }

    pub fn with_synonyms(jieba: &Jieba, query: &str, table: &SynonymTable, synonym_weight: f32) -> Self {
        let original = query.trim().to_string();
        let folded = to_simplified(&crate::text::normalize(&original));
        let mut terms: Vec<(String, f32)> = lexical::tokenize(jieba, &folded).into_iter().map(|t| (t.2, 1.0)).collect();
        // Only tokens with a character that differs between the scripts: a shared character (高 in 高血壓) would
        // otherwise count twice and change the scores of every simplified passage.
        let traditional = to_traditional(&folded);
        for source in [original.as_str(), traditional.as_str()] {
            for (_, _, w) in lexical::tokenize(jieba, source) {
                if to_simplified(&w) != w && !terms.iter().any(|t| t.0 == w) {
                    terms.push((w, 1.0));
                }
            }
        }
        let lower = folded.to_lowercase();
        let matches = if synonym_weight > 0.0 { table.find(&lower) } else { Vec::new() };
        let mut alternatives = HashMap::new();
        let mut expansions = Vec::new();
        for m in &matches {
            let found = lower[m.start..m.end].to_string();
            let others: Vec<&String> = table.terms(m.group).iter().filter(|t| fold(t) != found).collect();
            for t in &others {
                for (_, _, w) in lexical::tokenize(jieba, &fold(t)) {
                    if !terms.iter().any(|x| x.0 == w) {
                        terms.push((w, synonym_weight));
                    }
                }
            }
            alternatives.insert(found.clone(), others.iter().map(|t| fold(t)).collect());
            expansions.push((found, others.into_iter().cloned().collect()));
        }
        let salient = salient_terms(&lexical::content_words(jieba, &without_urls(&folded)), &lower, &matches);
        let key = salient.iter().filter(|w| table.contains(w) || lexical::is_key_term(jieba, w)).cloned().collect();
        QueryPlan { original, folded, terms, salient, key, alternatives, expansions }
    }

    /// The folded query when folding changed it (shown as "已按简体检索").
    pub fn folded_if_changed(&self) -> Option<&str> {
        (self.folded != self.original).then_some(self.folded.as_str())
    }

    /// A salient term and the other forms that count as it.
    pub fn forms<'a>(&'a self, term: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        std::iter::once(term).chain(self.alternatives.get(term).into_iter().flatten().map(String::as_str))
    }

    /// A salient term's forms ([`QueryPlan::forms`]), each also in traditional characters where that differs: what
    /// a passage written in either script holds when it holds the term.
    pub fn forms_in_both_scripts(&self, term: &str) -> Vec<String> {
        let mut out = Vec::new();
        for f in self.forms(term) {
            out.push(f.to_string());
            let trad = to_traditional(f);
            if trad != f {
                out.push(trad);
            }
        }
        out
    }

    /// The salient terms `text` contains, itself or through a synonym (compared folded, so a traditional passage
    /// counts; a Latin term only as a whole word).
    pub fn terms_in(&self, text: &str) -> Vec<String> {
        let f = fold(text);
        self.salient.iter().filter(|w| self.forms(w).any(|t| contains_term(&f, t))).cloned().collect()
    }

    /// The salient terms `text` contains, each named as found: the term as typed where the text holds it, else the
    /// synonym it holds with the term it stands for (慢性阻塞性肺疾病（COPD）), so a page never names a word the
    /// passage does not contain.
    pub fn evidence_in(&self, text: &str) -> Vec<String> {
        let f = fold(text);
        let mut out = Vec::new();
        for w in &self.salient {
            if contains_term(&f, w) {
                out.push(self.as_typed(w));
            } else if let Some(alt) = self.alternatives.get(w).into_iter().flatten().find(|t| contains_term(&f, t)) {
                out.push(format!("{}（{}）", self.as_written(w, alt), self.as_typed(w)));
            }
        }
        out
    }

    /// A folded salient term as the query wrote it (COPD for copd), where the query holds it as one piece.
    fn as_typed(&self, term: &str) -> String {
        let lower = self.original.to_lowercase();
        match lower.find(term) {
            Some(at) if lower.len() == self.original.len() => self.original[at..at + term.len()].to_string(),
            _ => term.to_string(),
        }
    }

    /// A synonym of `term` (folded) as the synonym table writes it.
    fn as_written(&self, term: &str, alt: &str) -> String {
        self.expansions
            .iter()
            .filter(|(t, _)| t == term)
            .flat_map(|(_, others)| others)
            .find(|o| fold(o) == alt)
            .cloned()
            .unwrap_or_else(|| alt.to_string())
    }
}

/// The text without its web addresses: a pasted link's pieces (clustered, query, %e6) are no terms of the
/// question (the link is still searched as typed).
fn without_urls(text: &str) -> String {
    text.split_whitespace()
        .map(|piece| {
            let lower = piece.to_ascii_lowercase();
            match ["http://", "https://", "www."].iter().filter_map(|p| lower.find(p)).min() {
                // Addresses run to the next space; ASCII case-folding keeps byte offsets.
                Some(at) => &piece[..at],
                None => piece,
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Content words outside the synonym terms found, and those terms, in query order.
fn salient_terms(words: &[String], lower: &str, matches: &[crate::synonyms::TermMatch]) -> Vec<String> {
    let mut placed: Vec<(usize, String)> = Vec::new();
    let mut cursor = 0;
    for w in words {
        let at = lower[cursor..].find(w.as_str()).map(|p| cursor + p);
        if let Some(p) = at {
            cursor = p;
        }
        let (s, e) = at.map_or((usize::MAX, usize::MAX), |p| (p, p + w.len()));
        if !matches.iter().any(|m| s < m.end && m.start < e) {
            placed.push((s, w.clone()));
        }
    }
    for m in matches {
        placed.push((m.start, lower[m.start..m.end].to_string()));
    }
    placed.sort_by_key(|p| p.0);
    let mut out: Vec<String> = Vec::new();
    for (_, w) in placed {
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traditional_queries_fold_to_simplified_and_keep_their_own_forms() {
        let (jieba, _) = crate::lexical::build_jieba(None).unwrap();
        let p = QueryPlan::new(&jieba, "高血壓的治療");
        assert_eq!(p.folded, "高血压的治疗");
        assert!(p.terms.iter().any(|t| t.0 == "高血压"), "{:?}", p.terms);
        assert!(p.terms.iter().any(|t| t.0 == "高血壓"), "traditional passages still match: {:?}", p.terms);
        assert!(
            p.salient.contains(&"高血压".to_string()) && p.salient.contains(&"治疗".to_string()),
            "{:?}",
            p.salient
        );
        assert!(!p.salient.contains(&"的".to_string()));
        // A simplified query is searched exactly as before: its own tokens, each once, weight 1, plus only the
        // traditional forms that differ.
        let s = QueryPlan::new(&jieba, "二甲双胍的禁忌症");
        let plain: Vec<String> =
            crate::lexical::tokenize(&jieba, "二甲双胍的禁忌症").into_iter().map(|t| t.2).collect();
        assert_eq!(s.terms[..plain.len()].iter().map(|t| t.0.clone()).collect::<Vec<_>>(), plain);
        assert!(s.terms[plain.len()..].iter().all(|t| to_simplified(&t.0) != t.0), "{:?}", s.terms);
        assert_eq!(s.folded_if_changed(), None);
        // Full-width letters fold as passages did at ingest.
        assert_eq!(QueryPlan::new(&jieba, "ＣＯＰＤ 治療").folded, "COPD 治疗");
        assert_eq!(QueryPlan::new(&jieba, "ＣＯＰＤ 治療").salient, vec!["copd".to_string(), "治疗".to_string()]);
        // A passage in traditional characters contains the simplified term.
        assert_eq!(p.terms_in("長期高血壓患者"), vec!["高血压".to_string()]);
    }

    #[test]
    fn punctuation_and_function_words_are_not_salient() {
        let (jieba, _) = crate::lexical::build_jieba(None).unwrap();
        assert!(QueryPlan::new(&jieba, "？？！！……").salient.is_empty());
        assert!(QueryPlan::new(&jieba, "的了吗").salient.is_empty());
        // An unknown two-character word is jieba guessing at misspelt text (退疼 for 腿疼), not a term to report
        // as missing; dictionary drug names and longer unknown words are.
        let c = QueryPlan::new(&jieba, "孕妇腰痛,屁股同,退疼");
        assert!(!c.salient.contains(&"退疼".to_string()), "{:?}", c.salient);
        assert!(c.salient.contains(&"孕妇".to_string()), "{:?}", c.salient);
        assert!(QueryPlan::new(&jieba, "替格瑞洛有什么副作用").salient.contains(&"替格瑞洛".to_string()));
        let g = QueryPlan::new(&jieba, "qwzxv 喵喵 嗷嗷嗷 zzkkq");
        assert!(
            g.salient.contains(&"qwzxv".to_string()) && g.salient.contains(&"zzkkq".to_string()),
            "{:?}",
            g.salient
        );
        // Three characters the HMM glued (完牙想 in 刷完牙想呕) are no term either; a longer unknown name is.
        assert!(!QueryPlan::new(&jieba, "刷完牙想呕咽喉").salient.contains(&"完牙想".to_string()));
        assert!(
            QueryPlan::new(&jieba, "达格列净的剂量").salient.contains(&"达格列净".to_string()),
            "{:?}",
            QueryPlan::new(&jieba, "达格列净的剂量").salient
        );
    }

    #[test]
    fn only_clinical_terms_can_be_reported_missing() {
        let (jieba, _) = crate::lexical::build_jieba(None).unwrap();
        let key = |q: &str| QueryPlan::new(&jieba, q).key;
        // Drugs and diseases of the medical dictionary, clinical nouns by their ending, long unknown names.
        assert!(key("替格瑞洛有什么副作用").contains(&"替格瑞洛".to_string()));
        let k = key("支气管炎能吃柑子吗");
        assert!(k.contains(&"支气管炎".to_string()) && !k.contains(&"柑子".to_string()), "{k:?}");
        assert!(key("粘液腺癌术后").contains(&"粘液腺癌".to_string()));
        // Drug names no dictionary holds, which jieba cuts into pieces or drops, are found by their spelling.
        assert_eq!(key("服用瑞戈非尼后"), vec!["瑞戈非尼".to_string()]);
        let v = QueryPlan::new(&jieba, "维奈克拉的用法");
        assert!(v.key.contains(&"维奈克拉".to_string()) && !v.salient.contains(&"奈克".to_string()), "{:?}", v.salient);
        let two = QueryPlan::new(&jieba, "吃奥美拉唑索马鲁肽行吗").key;
        assert!(two.contains(&"奥美拉唑".to_string()) && two.contains(&"索马鲁肽".to_string()), "{two:?}");
        // Everyday words, numbers, measurements and short unknown abbreviations are searched, never claimed
        // missing: a narrative that mentions a mirror or a date is not unanswered for lack of one.
        let everyday = QueryPlan::new(&jieba, "2013年照镜子发现175cm的孙子cdfi 咋办");
        assert!(everyday.key.is_empty(), "{:?}", everyday.key);
        assert!(everyday.salient.contains(&"镜子".to_string()) || everyday.salient.contains(&"照镜子".to_string()));
        assert!(!everyday.salient.contains(&"咋办".to_string()), "a colloquial function word");
        // A pasted link's pieces are no terms.
        let link = QueryPlan::new(&jieba, "孕妇 http://mama.baidu.com/clustered/general?query=%E6%80%80");
        assert_eq!(link.salient, vec!["孕妇".to_string()]);
        // The synonym table's terms are key terms, expanded or not.
        let table = SynonymTable::build(1, vec![vec!["慢性阻塞性肺疾病".into(), "COPD".into()]]);
        assert_eq!(QueryPlan::with_synonyms(&jieba, "COPD", &table, 0.0).key, vec!["copd".to_string()]);
        assert!(QueryPlan::new(&jieba, "COPD").key.is_empty(), "not in the table: a short unknown abbreviation");
        // The admin's dictionary words are the hospital's own terms.
        let dir = tempfile::tempdir().unwrap();
        let dict = dir.path().join("user_dict.txt");
        std::fs::write(&dict, "晨交 20000 v\n").unwrap();
        let (admin, _) = crate::lexical::build_jieba(Some(&dict)).unwrap();
        assert!(!jieba.has_word("晨交") && QueryPlan::new(&admin, "晨交记录").key.contains(&"晨交".to_string()));
    }

    #[test]
    fn synonym_terms_expand_at_a_lower_weight_and_count_as_found() {
        let (jieba, _) = crate::lexical::build_jieba(None).unwrap();
        let table = SynonymTable::build(
            1,
            vec![
                vec!["慢性阻塞性肺疾病".into(), "慢阻肺".into(), "COPD".into()],
                vec!["心肌梗死".into(), "心梗".into(), "MI".into()],
            ],
        );
        let p = QueryPlan::with_synonyms(&jieba, "慢阻肺的治疗", &table, 0.5);
        assert_eq!(p.salient, vec!["慢阻肺".to_string(), "治疗".to_string()]);
        assert!(p.terms.iter().any(|t| t.0 == "copd" && t.1 == 0.5), "{:?}", p.terms);
        assert!(p.terms.iter().filter(|t| t.1 == 1.0).all(|t| t.0 != "copd"));
        assert!(p.terms.iter().take_while(|t| t.1 == 1.0).count() > 0, "the original terms come first, at weight 1");
        assert_eq!(p.terms_in("COPD患者的长期治疗"), vec!["慢阻肺".to_string(), "治疗".to_string()]);
        assert_eq!(p.expansions[0].0, "慢阻肺");
        assert!(p.expansions[0].1.contains(&"COPD".to_string()));
        let mi = QueryPlan::with_synonyms(&jieba, "MI 溶栓", &table, 0.5);
        assert!(mi.terms_in("心梗后溶栓").contains(&"mi".to_string()));
        assert!(!mi.terms_in("admin 溶栓").contains(&"mi".to_string()), "a Latin term only as a whole word");
        // Without a weight nothing is expanded: the plan is the plain one.
        let plain = QueryPlan::with_synonyms(&jieba, "慢阻肺的治疗", &table, 0.0);
        assert_eq!(plain.terms, QueryPlan::new(&jieba, "慢阻肺的治疗").terms);
        assert!(plain.expansions.is_empty());
    }
}
