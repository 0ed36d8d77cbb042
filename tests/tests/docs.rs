//! The documentation for its readers: README.md stays a short front page (at most 200 lines), the admin guide and
//! the README carry no lab-notebook wording (numbered work periods, "this …" of a work period), neither do the code
//! comments of the Rust sources, and every relative link of the README and the admin guide reaches a file.
//! Dated write-ups of measurements live in docs/experiments/, which this check leaves alone.

use std::fs;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 200;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repository root")
}

/// Files under `dir` (recursively) whose name ends with `ext`; build outputs and hidden folders are skipped.
fn files_with_ext(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name.starts_with('.') || name == "target" || name == "node_modules" {
                continue;
            }
            files_with_ext(&path, ext, out);
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
}

/// The banned wording found in `text`, if any: a numbered work period (the word for one, singular or plural,
/// followed by a number) or the period or task referred to with "this", in any letter case.
fn banned_wording(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    for phrase in ["this session", "this task"] {
        if lower.contains(phrase) {
            return Some(phrase.to_string());
        }
    }
    for word in ["session ", "sessions "] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(word) {
            let at = from + i;
            let after = &lower[at + word.len()..];
            let starts_word = at == 0 || !lower[..at].chars().next_back().is_some_and(char::is_alphanumeric);
            if starts_word && after.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                let end = (at + word.len() + 4).min(lower.len());
                let end = (end..=lower.len()).find(|&e| lower.is_char_boundary(e)).unwrap_or(lower.len());
                return Some(lower[at..end].to_string());
            }
            from = at + word.len();
        }
    }
    None
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

fn admin_docs(root: &Path) -> Vec<PathBuf> {
    let mut docs = Vec::new();
    files_with_ext(&root.join("docs/admin"), ".md", &mut docs);
    assert!(!docs.is_empty(), "docs/admin/ holds no Markdown file");
    docs
}

#[test]
fn readme_is_a_front_page_of_at_most_200_lines() {
    let root = repo_root();
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES} (move the rest to docs/)"
    );
}

#[test]
fn readme_and_admin_docs_carry_no_lab_notebook_wording() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    files.extend(admin_docs(&root));
    let mut found = Vec::new();
    for path in &files {
        let text = fs::read_to_string(path).expect("readable doc");
        for (n, line) in text.lines().enumerate() {
            if let Some(hit) = banned_wording(line) {
                found.push(format!("{}:{}: {hit:?}", rel(&root, path), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "dated lab-notebook wording belongs in docs/experiments/:\n{}", found.join("\n"));
}

#[test]
fn rust_comments_carry_no_lab_notebook_wording() {
    let root = repo_root();
    let mut sources = Vec::new();
    for dir in ["appliance", "trainer", "tests"] {
        files_with_ext(&root.join(dir), ".rs", &mut sources);
    }
    assert!(sources.len() > 50, "found only {} Rust files", sources.len());
    let mut found = Vec::new();
    for path in &sources {
        let text = fs::read_to_string(path).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            let Some(i) = line.find("//") else { continue };
            if let Some(hit) = banned_wording(&line[i + 2..]) {
                found.push(format!("{}:{}: {hit:?}", rel(&root, path), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "comments should cite docs/experiments/ by date instead:\n{}", found.join("\n"));
}

/// The targets of the inline links `[text](target)` and reference definitions `[label]: target` of a Markdown text.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    let mut in_fence = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
        {
            let target = trimmed[close + 2..].split_whitespace().next().unwrap_or("");
            targets.push((n + 1, target.to_string()));
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let inner = after[..end].trim();
            let target = if let Some(stripped) = inner.strip_prefix('<') {
                stripped.split('>').next().unwrap_or("")
            } else {
                inner.split_whitespace().next().unwrap_or("")
            };
            targets.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn relative_links_of_readme_and_admin_docs_reach_files() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    files.extend(admin_docs(&root));
    let mut broken = Vec::new();
    let mut checked = 0;
    for path in &files {
        let text = fs::read_to_string(path).expect("readable doc");
        let base = path.parent().expect("a folder");
        for (line, target) in link_targets(&text) {
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with('/')
            {
                continue;
            }
            let file = target.split('#').next().unwrap_or("");
            checked += 1;
            if !base.join(file).exists() {
                broken.push(format!("{}:{line}: {target}", rel(&root, path)));
            }
        }
    }
    assert!(checked > 0, "no relative link found in README.md and docs/admin/");
    assert!(broken.is_empty(), "relative links to files that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn the_banned_wording_check_fires_and_spares_other_uses_of_the_word() {
    for bad in ["see Session 15", "session 3's run", "sessions 11–14", "in this session", "This task had no GPU"] {
        assert!(banned_wording(bad).is_some(), "{bad:?} should be caught");
    }
    for fine in ["a sign-in session ends after 30 minutes", "the ONNX Runtime session", "session_idle_minutes = 30"] {
        assert_eq!(banned_wording(fine), None, "{fine:?} should pass");
    }
    let links =
        link_targets("[a](docs/admin/install.md) and [b](<x y.md> \"t\")\n```\n[c](skipped.md)\n```\n[d]: ../e.md\n");
    let targets: Vec<_> = links.into_iter().map(|(_, t)| t).collect();
    assert_eq!(targets, ["docs/admin/install.md", "x y.md", "../e.md"]);
}
