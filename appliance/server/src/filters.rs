//! Template filters the pages share (askama finds them as `filters::NAME` where a page's template is declared).

use askama::filters::Safe;
use askama::{Result, Values};

/// A message or a hint, HTML-escaped, with each `backticked` span (a command, a path, a setting's name) shown as
/// `<code>`: what an administrator types stands apart from the Chinese sentence around it. An unpaired backtick is
/// kept as text.
#[askama::filter_fn]
pub fn coded(s: impl ToString, _: &dyn Values) -> Result<Safe<String>> {
    Ok(Safe(coded_html(&s.to_string())))
}

fn coded_html(s: &str) -> String {
    let parts: Vec<&str> = s.split('`').collect();
    let last = parts.len() - 1;
    let mut out = String::with_capacity(s.len() + 16);
    for (i, part) in parts.iter().enumerate() {
        // An odd part lies between two backticks, unless it is the last and no backtick closes it.
        let code = i % 2 == 1 && i < last;
        if code {
            out.push_str("<code>");
        } else if i % 2 == 1 {
            out.push('`');
        }
        escape_into(&mut out, part);
        if code {
            out.push_str("</code>");
        }
    }
    out
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::coded_html;

    #[test]
    fn backticked_spans_become_code_and_everything_is_escaped() {
        assert_eq!(coded_html("运行 `care check` 后重试"), "运行 <code>care check</code> 后重试");
        assert_eq!(coded_html("<b>`a<b`"), "&lt;b&gt;<code>a&lt;b</code>");
        assert_eq!(coded_html("单个 ` 反引号"), "单个 ` 反引号");
        assert_eq!(coded_html("`a` 与 `b"), "<code>a</code> 与 `b");
    }
}
