//! HTML exports (intranet pages, guideline sites saved from a browser): visible text only, headings kept.
//!
//! Script, style, navigation, header/footer chrome, forms and embedded objects are dropped; block elements end a
//! line; `<h1>`..`<h6>` become Markdown heading lines so the chunker keeps them as chunk context.

use scraper::{ElementRef, Html, Node};

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

/// (title, text with Markdown heading lines).
pub(super) fn extract(html: &str) -> (String, String) {
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

fn walk(el: ElementRef<'_>, out: &mut String) {
    let name = el.value().name();
    if SKIP.contains(&name) {
        return;
    }
    let heading = match name {
        "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => Some((name.as_bytes()[1] - b'0') as usize),
        _ => None,
    };
    if let Some(level) = heading {
        let text: String = el.text().collect::<String>().split_whitespace().collect::<Vec<_>>().join(" ");
        if !text.is_empty() {
            out.push('\n');
            out.push_str(&"#".repeat(level));
            out.push(' ');
            out.push_str(&text);
            out.push('\n');
        }
        return;
    }
    let block = BLOCK.contains(&name) || name == "td" || name == "th";
    if block {
        out.push('\n');
    }
    for child in el.children() {
        match child.value() {
            Node::Text(t) => out.push_str(t),
            Node::Element(_) => {
                if let Some(c) = ElementRef::wrap(child) {
                    walk(c, out);
                }
            }
            _ => {}
        }
    }
    if name == "td" || name == "th" {
        out.push(' ');
    } else if block {
        out.push('\n');
    }
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
        let (title, text) = extract(html);
        assert_eq!(title, "高血压 指南");
        let text = crate::text::normalize(&text);
        assert_eq!(text, "# 高血压\n血压≥140/90 mmHg\n可诊断。\n## 治疗\n限盐\n运动");
        assert_eq!(declared_charset(html.as_bytes()), Some("GBK"));
    }
}
