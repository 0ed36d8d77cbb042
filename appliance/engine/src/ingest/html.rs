//! HTML exports (intranet pages, guideline sites saved from a browser): visible text only, headings kept.
//!
//! Script, style, navigation, header/footer chrome, forms and embedded objects are dropped; block elements end a
//! line; `<h1>`..`<h6>` become Markdown heading lines so the chunker keeps them as chunk context. List items are
//! one line each with their marker (`3. ` in an `<ol>`, honouring `start` and `value`; `• ` otherwise) and a table
//! row is one line, `| cell | cell |` (a table holding headings or other tables is layout: its cells stay
//! paragraphs), the light markup [`crate::docview`] renders back as lists and tables.

use ego_tree::iter::Edge;
use ego_tree::{NodeId, NodeRef};
use scraper::{ElementRef, Html, Node};

use super::TableBuf;

const SKIP: &[&str] = &[
    "script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form", "button", "select", "svg",
    "canvas", "iframe", "object", "embed", "head", "menu",
];
const BLOCK: &[&str] = &[
    "p",
    "div",
    "section",
    "article",
    "main",
    "li",
    "ul",
    "ol",
    "tr",
    "table",
    "thead",
    "tbody",
    "dl",
    "dt",
    "dd",
    "blockquote",
    "pre",
    "figure",
    "figcaption",
    "address",
    "br",
    "hr",
    "caption",
    "body",
];

/// The charset an HTML file declares in its first bytes (`<meta charset=gbk>`), when it has none other (BOM).
pub(super) fn declared_charset(bytes: &[u8]) -> Option<&'static str> {
    let head = &bytes[..bytes.len().min(2048)];
    let lower: Vec<u8> = head.iter().map(u8::to_ascii_lowercase).collect();
    let pos = lower.windows(8).position(|w| w == b"charset=")?;
    let rest = &lower[pos + 8..];
    let rest = rest.strip_prefix(b"\"").or_else(|| rest.strip_prefix(b"'")).unwrap_or(rest);
    let end = rest.iter().position(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')).unwrap_or(rest.len());
    let label = &rest[..end];
    encoding_rs::Encoding::for_label(label).map(|e| e.name())
}

/// Deeper than this, a page is refused before it reaches the HTML parser, whose scope checks walk the open-element
/// stack at every tag (cost = tags × depth: minutes for a 2 MB file of nested `<div>`). Browsers stop nesting much
/// earlier (Chrome's parser at 512 levels), so no real page comes near it.
pub(super) const MAX_DEPTH: usize = 1024;

const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr", "param",
    "keygen", "basefont", "bgsound", "frame",
];
// Usually left unclosed in real pages; the parser closes them itself when the next one starts.
const IMPLIED_END: &[&str] =
    &["p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot", "colgroup", "caption"];
const RAW_TEXT: &[&str] =
    &["script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "noscript", "plaintext"];

/// (title, text with Markdown heading lines), or the byte offset where elements nest deeper than [`MAX_DEPTH`].
pub(super) fn extract(html: &str) -> Result<(String, String), usize> {
    match too_deep(html) {
        Some(at) => Err(at),
        None => Ok(extract_tree(html)),
    }
}

fn extract_tree(html: &str) -> (String, String) {
    let doc = Html::parse_document(html);
    let title = doc
        .select(&scraper::Selector::parse("title").expect("static selector"))
        .next()
        .map(|t| t.text().collect::<String>())
        .unwrap_or_default();
    let mut out = String::new();
    walk(doc.root_element(), &mut out);
    (title.split_whitespace().collect::<Vec<_>>().join(" "), out)
}

/// Where elements first nest deeper than [`MAX_DEPTH`], estimated from the tags alone in one linear pass, the way
/// the parser nests them: an end tag closes up to the latest open element of its name and a stray one is ignored
/// (so `<div></x>` cannot hide depth); `<div/>` opens a div as in browsers, except inside SVG/MathML.
fn too_deep(html: &str) -> Option<usize> {
    let b = html.as_bytes();
    let mut open: Vec<String> = Vec::new();
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    let mut i = 0;
    while let Some(off) = b[i..].iter().position(|&c| c == b'<') {
        let lt = i + off;
        if b[lt..].starts_with(b"<!--") {
            i = find(b, lt + 4, b"-->").map_or(b.len(), |e| e + 3);
            continue;
        }
        let end_tag = b.get(lt + 1) == Some(&b'/');
        let start = lt + 1 + end_tag as usize;
        let len = b[start..].iter().take_while(|c| c.is_ascii_alphanumeric()).count();
        if len == 0 || !b[start].is_ascii_alphabetic() {
            i = lt + 1;
            continue;
        }
        let name = html[start..start + len].to_ascii_lowercase();
        let gt = b[start..].iter().position(|&c| c == b'>').map_or(b.len(), |p| start + p);
        i = (gt + 1).min(b.len());
        if end_tag {
            close_named(&mut open, &mut counts, &name);
        } else if RAW_TEXT.contains(&name.as_str()) {
            i = raw_text_end(b, i, &name);
        } else if !VOID.contains(&name.as_str()) && !IMPLIED_END.contains(&name.as_str()) {
            let foreign = counts.get("svg").copied().unwrap_or(0) + counts.get("math").copied().unwrap_or(0) > 0;
            if foreign && b[..gt].ends_with(b"/") {
                continue;
            }
            *counts.entry(name.clone()).or_default() += 1;
            open.push(name);
            if open.len() > MAX_DEPTH {
                return Some(lt);
            }
        }
    }
    None
}

fn close_named(open: &mut Vec<String>, counts: &mut std::collections::HashMap<String, usize>, name: &str) {
    if counts.get(name).copied().unwrap_or(0) == 0 {
        return;
    }
    while let Some(top) = open.pop() {
        let n = counts.entry(top.clone()).or_default();
        *n = n.saturating_sub(1);
        if top == name {
            break;
        }
    }
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| from + p)
}

/// The offset of `</name` (any case) at or after `from`, where raw text such as a script's ends.
fn raw_text_end(b: &[u8], from: usize, name: &str) -> usize {
    let n = name.len();
    (from..b.len())
        .find(|&j| {
            b[j] == b'<'
                && b.get(j + 1) == Some(&b'/')
                && b.get(j + 2..j + 2 + n).is_some_and(|t| t.eq_ignore_ascii_case(name.as_bytes()))
        })
        .unwrap_or(b.len())
}

/// Where text goes while the tree is walked: the page, or the cell of the innermost table being read; and the
/// lists open around it (ordered or not, and the next number).
#[derive(Default)]
struct Writer {
    out: String,
    tables: Vec<TableBuf>,
    lists: Vec<(bool, i64)>,
    /// A list item's marker was just written: the item's first block (`<li><p>…`) does not start a new line.
    after_marker: bool,
}

impl Writer {
    fn text(&mut self, t: &str) {
        if self.after_marker && t.trim().is_empty() {
            return;
        }
        self.after_marker = false;
        self.cur().push_str(t);
    }

    fn newline(&mut self) {
        if !self.after_marker {
            self.cur().push('\n');
        }
    }

    fn cur(&mut self) -> &mut String {
        match self.tables.last_mut() {
            Some(t) => &mut t.cell,
            None => &mut self.out,
        }
    }
}

/// Iterative on purpose: a page is a tree as deep as the uploader likes (50,000 nested `<div>` is 550 KB), and a
/// recursive walk would overflow the worker's stack and take the whole process down.
#[allow(
    clippy::wildcard_enum_match_arm,
    reason = "scraper nodes other than text and elements (comments, doctypes) carry no text"
)]
fn walk(root: ElementRef<'_>, out: &mut String) {
    let mut w = Writer::default();
    // The element whose subtree is being left out (SKIP element, or a heading already written whole).
    let mut skipping: Option<NodeId> = None;
    for edge in root.traverse() {
        match edge {
            Edge::Open(node) if skipping.is_none() => match node.value() {
                Node::Text(t) => w.text(t),
                Node::Element(el) if !open(node, el, &mut w) => skipping = Some(node.id()),
                _ => {}
            },
            Edge::Open(_) => {}
            Edge::Close(node) if skipping.is_some() => {
                if skipping == Some(node.id()) {
                    skipping = None;
                }
            }
            Edge::Close(node) => {
                if let Node::Element(el) = node.value() {
                    close(el.name(), &mut w);
                }
            }
        }
    }
    while !w.tables.is_empty() {
        close("table", &mut w);
    }
    out.push_str(&w.out);
}

/// Writes what goes before an element's children; false when its children are not to be walked.
fn open(node: NodeRef<'_, Node>, el: &scraper::node::Element, w: &mut Writer) -> bool {
    let name = el.name();
    if SKIP.contains(&name) {
        return false;
    }
    if let Some(level) = heading_level(name) {
        let text = ElementRef::wrap(node).map(|el| el.text().collect::<String>()).unwrap_or_default();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if !text.is_empty() {
            let out = w.cur();
            out.push('\n');
            out.push_str(&"#".repeat(level));
            out.push(' ');
            out.push_str(&text);
            out.push('\n');
        }
        return false;
    }
    match name {
        "ol" => {
            let start = el.attr("start").and_then(|s| s.trim().parse::<i64>().ok()).unwrap_or(1);
            w.lists.push((true, start));
        }
        "ul" | "dir" => w.lists.push((false, 0)),
        "table" => w.tables.push(TableBuf::default()),
        _ => {}
    }
    if is_block(name) {
        w.newline();
    }
    if name == "li" {
        let marker = match w.lists.last_mut() {
            Some((true, next)) => {
                let n = el.attr("value").and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(*next);
                *next = n + 1;
                format!("{n}. ")
            }
            _ => "• ".to_string(),
        };
        w.cur().push_str(&marker);
        w.after_marker = true;
    }
    true
}

/// Writes what goes after an element's children (only for elements whose children were walked).
fn close(name: &str, w: &mut Writer) {
    match name {
        "td" | "th" => {
            if let Some(t) = w.tables.last_mut() {
                t.end_cell();
            }
            return;
        }
        "tr" => {
            if let Some(t) = w.tables.last_mut() {
                t.end_row();
            }
            return;
        }
        "table" => {
            if let Some(t) = w.tables.pop() {
                let text = t.finish();
                if let Some(parent) = w.tables.last_mut() {
                    parent.layout = true;
                }
                w.cur().push_str(&text);
            }
            return;
        }
        "caption" => {
            // Its own line before the table, not part of the first cell.
            let n = w.tables.len();
            if n > 0 {
                let caption = std::mem::take(&mut w.tables[n - 1].cell);
                let dest = if n > 1 { &mut w.tables[n - 2].cell } else { &mut w.out };
                dest.push('\n');
                dest.push_str(caption.trim());
                dest.push('\n');
                return;
            }
        }
        "ol" | "ul" | "dir" => {
            w.lists.pop();
        }
        // An empty item still ends its line.
        "li" => w.after_marker = false,
        _ => {}
    }
    if is_block(name) {
        w.newline();
    }
}

fn heading_level(name: &str) -> Option<usize> {
    match name {
        "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => Some((name.as_bytes()[1] - b'0') as usize),
        _ => None,
    }
}

fn is_block(name: &str) -> bool {
    BLOCK.contains(&name) || name == "td" || name == "th"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_visible_text_and_headings_drops_chrome() {
        let html = r#"<!doctype html><html><head><meta charset="gbk"><title>高血压 指南</title>
            <style>p{color:red}</style><script>var x = "不要索引";</script></head>
            <body><nav>首页 | 科室</nav><h1>高血压</h1><p>血压≥140/90 mmHg<br>可诊断。</p>
            <h2>治疗</h2><ul><li>限盐</li><li>运动</li></ul><footer>版权所有</footer></body></html>"#;
        let (title, text) = extract(html).unwrap();
        assert_eq!(title, "高血压 指南");
        let text = crate::text::normalize(&text);
        assert_eq!(text, "# 高血压\n血压≥140/90 mmHg\n可诊断。\n## 治疗\n• 限盐\n• 运动");
        assert_eq!(declared_charset(html.as_bytes()), Some("GBK"));
    }

    #[test]
    fn lists_and_tables_keep_their_structure() {
        let html = r#"<html><body><h2>禁忌症</h2><ol><li>严重肾功能不全</li><li>急性心肌梗死
            <ul><li>含休克</li></ul></li><li value="7">过敏者</li></ol><ol start="3"><li>续三</li></ol>
            <ul><li><p>限盐</p></li><li>运动</li></ul>
            <table><caption>常用剂量</caption><thead><tr><th>药物</th><th>剂量</th></tr></thead>
            <tbody><tr><td>二甲双胍</td><td><p>500 mg</p><p>每日两次</p></td></tr><tr><td>阿司匹林</td><td></td></tr></tbody></table>
            <table><tr><td><h3>布局</h3><p>正文一</p></td><td>正文二</td></tr></table></body></html>"#;
        let (_, text) = extract(html).unwrap();
        assert_eq!(
            crate::text::normalize(&text),
            "## 禁忌症\n1. 严重肾功能不全\n2. 急性心肌梗死\n• 含休克\n7. 过敏者\n3. 续三\n• 限盐\n• 运动\n常用剂量\n\
             | 药物 | 剂量 |\n| 二甲双胍 | 500 mg 每日两次 |\n| 阿司匹林 | |\n### 布局\n正文一\n正文二"
        );
    }

    #[test]
    fn the_walk_is_iterative() {
        // Past the nesting bound, on a 2 MiB stack: a recursive walk overflows it (and aborts the test process).
        let n = 5_000;
        let page = format!("{}<h2>深</h2><script>x</script>文{}", "<div><span>".repeat(n), "</span></div>".repeat(n));
        let run = move || extract_tree(&page);
        let (_, text) = std::thread::Builder::new().stack_size(2 << 20).spawn(run).unwrap().join().unwrap();
        assert_eq!(crate::text::normalize(&text), "## 深\n文");
    }

    #[test]
    fn nesting_is_estimated_as_the_parser_nests() {
        let deep = |open: &str, close: &str, n: usize| format!("{}x{}", open.repeat(n), close.repeat(n));
        assert_eq!(too_deep(&deep("<div>", "</div>", MAX_DEPTH)), None);
        assert_eq!(too_deep(&deep("<div>", "</div>", MAX_DEPTH + 1)), Some(5 * MAX_DEPTH));
        assert!(too_deep(&deep("<div></x>", "", MAX_DEPTH + 1)).is_some(), "stray end tags close nothing");
        assert!(too_deep(&deep("<DIV/>", "", MAX_DEPTH + 1)).is_some(), "<div/> opens a div in HTML");
        // Real pages: many siblings, unclosed <p>/<li>/<td>, inline SVG icons, tags inside scripts and comments.
        let flat = "<p>a<li>b<td>c<br><img src=x><svg><path d='M0'/><g/></svg><div>d</div>".repeat(10_000);
        let script = format!("<script>{}</script><!-- {} -->", "<div>".repeat(5000), "<div>".repeat(5000));
        assert_eq!(too_deep(&format!("<html><body>{flat}{script}</body></html>")), None);
    }
}
