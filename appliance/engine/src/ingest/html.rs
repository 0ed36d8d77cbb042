//! HTML exports (intranet pages, guideline sites saved from a browser): visible text only, headings kept.
//!
//! Script, style, navigation, header/footer chrome, forms and embedded objects are dropped; block elements end a
//! line; `<h1>`..`<h6>` become Markdown heading lines so the chunker keeps them as chunk context. List items are
//! one line each with their marker (`3. ` in an `<ol>`, honouring `start` and `value`; `• ` otherwise) and a table
//! row is one line, `| cell | cell |` (a table holding headings or other tables is layout: its cells stay
//! paragraphs), the light markup [`crate::docview`] renders back as lists and tables.

use ego_tree::iter::Edge;
use ego_tree::{NodeId, NodeRef};
use html5ever::tendril::StrTendril;
use html5ever::tree_builder::{ElementFlags, NodeOrText, QuirksMode, TreeSink};
use html5ever::{Attribute, QualName};
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

/// Deeper than this, a page is refused. The HTML parser's scope checks walk its open-element stack at every tag,
/// so a page nested N deep costs N² (minutes for a 2 MB file of nested `<div>`, or of `<svg>` then `<div/>` × N,
/// which breaks out of SVG and nests). Browsers stop nesting much earlier (Chrome's parser at 512 levels), so no
/// real page comes near it.
pub(super) const MAX_DEPTH: usize = 1024;

/// Input is fed to the parser in pieces of this many bytes and the depth checked after each: past the limit, a
/// piece can nest at most this many levels more before parsing stops (a few milliseconds of scope checks).
const PIECE: usize = 16 << 10;

/// (title, text with Markdown heading lines), or the byte offset of the piece of input where elements nest deeper
/// than [`MAX_DEPTH`].
pub(super) fn extract(html: &str) -> Result<(String, String), usize> {
    let doc = parse_bounded(html)?;
    Ok(extract_tree(&doc))
}

/// Parses as browsers do, with the depth counted by the tree builder itself ([`DepthSink`]) rather than estimated
/// from the tags: foster parenting, adoption and foreign-content breakout all nest where the builder puts them.
fn parse_bounded(html: &str) -> Result<Html, usize> {
    use html5ever::tendril::TendrilSink;
    let sink = DepthSink { tree: scraper::HtmlTreeSink::new(Html::new_document()), deepest: Default::default() };
    let deepest = std::rc::Rc::clone(&sink.deepest);
    let mut parser = html5ever::driver::parse_document(sink, Default::default());
    let mut at = 0;
    while at < html.len() {
        let mut end = (at + PIECE).min(html.len());
        while !html.is_char_boundary(end) {
            end += 1;
        }
        parser.process(html[at..end].into());
        if deepest.get() > MAX_DEPTH {
            return Err(at);
        }
        at = end;
    }
    let doc = parser.finish();
    if deepest.get() > MAX_DEPTH { Err(html.len()) } else { Ok(doc) }
}

fn extract_tree(doc: &Html) -> (String, String) {
    let title = doc
        .select(&scraper::Selector::parse("title").expect("static selector"))
        .next()
        .map(|t| t.text().collect::<String>())
        .unwrap_or_default();
    let mut out = String::new();
    walk(doc.root_element(), &mut out);
    (title.split_whitespace().collect::<Vec<_>>().join(" "), out)
}

/// scraper's tree sink, measuring how deep the builder attaches each node: the parent chain of the insertion
/// point is walked (up to just past [`MAX_DEPTH`], so a walk costs no more than the builder's own scope check),
/// which stays exact when adoption or foster parenting moves nodes.
struct DepthSink {
    tree: scraper::HtmlTreeSink,
    deepest: std::rc::Rc<std::cell::Cell<usize>>,
}

impl DepthSink {
    /// Records that a node is being attached as a child of `parent`.
    fn attach_below(&self, parent: &NodeId) {
        let html = self.tree.0.borrow();
        let mut up = html.tree.get(*parent);
        let mut depth = 0;
        while let Some(node) = up {
            depth += 1;
            if depth > MAX_DEPTH {
                break;
            }
            up = node.parent();
        }
        self.deepest.set(self.deepest.get().max(depth));
    }

    fn parent_of(&self, node: &NodeId) -> Option<NodeId> {
        self.tree.0.borrow().tree.get(*node).and_then(|n| n.parent()).map(|p| p.id())
    }
}

impl TreeSink for DepthSink {
    type Output = Html;
    type Handle = NodeId;
    type ElemName<'a> = <scraper::HtmlTreeSink as TreeSink>::ElemName<'a>;

    fn finish(self) -> Html {
        self.tree.finish()
    }
    fn parse_error(&self, msg: std::borrow::Cow<'static, str>) {
        self.tree.parse_error(msg);
    }
    fn get_document(&self) -> NodeId {
        self.tree.get_document()
    }
    fn elem_name<'a>(&'a self, target: &'a NodeId) -> Self::ElemName<'a> {
        self.tree.elem_name(target)
    }
    fn create_element(&self, name: QualName, attrs: Vec<Attribute>, flags: ElementFlags) -> NodeId {
        self.tree.create_element(name, attrs, flags)
    }
    fn create_comment(&self, text: StrTendril) -> NodeId {
        self.tree.create_comment(text)
    }
    fn create_pi(&self, target: StrTendril, data: StrTendril) -> NodeId {
        self.tree.create_pi(target, data)
    }
    fn append(&self, parent: &NodeId, child: NodeOrText<NodeId>) {
        if matches!(child, NodeOrText::AppendNode(_)) {
            self.attach_below(parent);
        }
        self.tree.append(parent, child);
    }
    fn append_based_on_parent_node(&self, element: &NodeId, prev_element: &NodeId, child: NodeOrText<NodeId>) {
        if self.parent_of(element).is_some() {
            self.append_before_sibling(element, child)
        } else {
            self.append(prev_element, child)
        }
    }
    fn append_doctype_to_document(&self, name: StrTendril, public_id: StrTendril, system_id: StrTendril) {
        self.tree.append_doctype_to_document(name, public_id, system_id);
    }
    fn get_template_contents(&self, target: &NodeId) -> NodeId {
        self.tree.get_template_contents(target)
    }
    fn same_node(&self, x: &NodeId, y: &NodeId) -> bool {
        self.tree.same_node(x, y)
    }
    fn set_quirks_mode(&self, mode: QuirksMode) {
        self.tree.set_quirks_mode(mode);
    }
    fn append_before_sibling(&self, sibling: &NodeId, new_node: NodeOrText<NodeId>) {
        if let (NodeOrText::AppendNode(_), Some(parent)) = (&new_node, self.parent_of(sibling)) {
            self.attach_below(&parent);
        }
        self.tree.append_before_sibling(sibling, new_node);
    }
    fn add_attrs_if_missing(&self, target: &NodeId, attrs: Vec<Attribute>) {
        self.tree.add_attrs_if_missing(target, attrs);
    }
    fn remove_from_parent(&self, target: &NodeId) {
        self.tree.remove_from_parent(target);
    }
    fn reparent_children(&self, node: &NodeId, new_parent: &NodeId) {
        self.attach_below(new_parent);
        self.tree.reparent_children(node, new_parent);
    }
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
        let run = move || extract_tree(&Html::parse_document(&page));
        let (_, text) = std::thread::Builder::new().stack_size(2 << 20).spawn(run).unwrap().join().unwrap();
        assert_eq!(crate::text::normalize(&text), "## 深\n文");
    }

    #[test]
    fn depth_is_counted_where_the_parser_nests() {
        let deep = |open: &str, close: &str, n: usize| format!("{}x{}", open.repeat(n), close.repeat(n));
        // <html> and <body> are two levels of their own.
        assert!(extract(&deep("<div>", "</div>", MAX_DEPTH - 2)).is_ok());
        assert_eq!(extract(&deep("<div>", "</div>", MAX_DEPTH - 1)), Err(0));
        assert!(extract(&deep("<div></x>", "", MAX_DEPTH)).is_err(), "stray end tags close nothing");
        assert!(extract(&deep("<DIV/>", "", MAX_DEPTH)).is_err(), "<div/> opens a div in HTML");
        // The review's page: inside <svg> a <div/> breaks out of SVG and nests as an HTML div.
        assert!(extract(&format!("<svg>{}", "<div/>".repeat(MAX_DEPTH))).is_err(), "foreign-content breakout");
        assert!(
            extract(&format!("<svg>{}</svg>", "<g/>".repeat(20_000))).is_ok(),
            "self-closed SVG elements stay flat"
        );
        // Where the refusal is reported: the start of the piece of input in which the limit was passed.
        let late = format!("{}{}", "<p>平</p>".repeat(10_000), "<div>".repeat(MAX_DEPTH));
        assert!(matches!(extract(&late), Err(at) if at > PIECE && at < late.len()), "{:?}", extract(&late).err());
        // Real pages: many siblings, unclosed <p>/<li>/<td>, inline SVG icons, tags inside scripts and comments.
        let flat = "<p>a<li>b<td>c<br><img src=x><svg><path d='M0'/><g/></svg><div>d</div>".repeat(10_000);
        let script = format!("<script>{}</script><!-- {} -->", "<div>".repeat(5000), "<div>".repeat(5000));
        assert!(extract(&format!("<html><body>{flat}{script}</body></html>")).is_ok());
    }

    /// Pages built to make the parser's work grow with the square of their size, each 1 MB: refused or read in
    /// about a second (debug build), never minutes. `cargo test -p care-engine --lib hostile_shapes -- --nocapture`.
    #[test]
    fn hostile_shapes_cost_little() {
        let shapes: [(&str, &str); 8] = [
            ("nested div", "<div>"),
            ("svg breakout", "<svg><div/>"),
            ("math breakout", "<math><p/>"),
            ("unclosed formatting", "<b><i><u>"),
            ("misnested formatting", "<b><p></b>"),
            ("anchor adoption", "<a><div>"),
            ("table foster parenting", "<table><div>"),
            ("nested tables", "<table><tr><td>"),
        ];
        for (what, unit) in shapes {
            let page = unit.repeat((1 << 20) / unit.len());
            let t = std::time::Instant::now();
            let outcome = extract(&page).map(|_| ()).map_err(|_| "refused");
            let took = t.elapsed();
            println!("{what}: {outcome:?} in {took:?}");
            assert!(took < std::time::Duration::from_secs(20), "{what} took {took:?}");
        }
    }
}
