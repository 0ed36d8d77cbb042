//! Embeds the demo collection (`assets/demo/*.md`) so `care demo` works from the binary alone.
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    // Read at run time: a build script binary reused from another checkout path must not look in that path.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR for build scripts");
    let dir = Path::new(&manifest).join("assets/demo");
    println!("cargo:rerun-if-changed={}", dir.display());
    // A missing or empty folder fails the build: an empty demo once compiled silently from a half-checked-out tree.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("demo articles: cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "README.md")
        .collect();
    assert!(!names.is_empty(), "demo articles: no .md files in {}", dir.display());
    names.sort();
    let mut out = String::from(
        "/// (file name, content) of every demo article.\npub static DEMO_ARTICLES: &[(&str, &str)] = &[\n",
    );
    for n in &names {
        let p = dir.join(n);
        println!("cargo:rerun-if-changed={}", p.display());
        let _ = writeln!(out, "    ({n:?}, include_str!({:?})),", p.display().to_string());
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("demo_articles.rs");
    std::fs::write(dest, out).expect("write demo_articles.rs");
}
