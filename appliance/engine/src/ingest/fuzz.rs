//! Fuzz targets, one per parser, driven by proptest: valid seed files (built by [`super::fixtures`]) mutated by bit
//! flips, insertions, deletions, duplicated ranges and truncation, plus plain random bytes. Parsers run unguarded
//! (no `catch_unwind`), so any panic fails the target and proptest shrinks it to a small reproducer.
//!
//! `cargo test` runs each target for 128 cases. A long run, per target:
//! `CARE_FUZZ_SECONDS=60 cargo test -p care-engine --lib ingest::fuzz -- --nocapture --test-threads 1`

use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};

use super::fixtures::{docx_bytes, pdf_bytes, zip_bytes};
use super::{FileKind, IngestLimits, IngestOptions, Origin, UNGUARDED, parse_inner};

#[derive(Debug, Clone)]
enum Edit {
    Set(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Duplicate(Index, Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<Index>().prop_map(Edit::Delete),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Duplicate(a, b)),
    ]
}

/// Seeds mutated by up to 12 edits and an optional truncation, or random bytes.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    let mutated = (0..n, prop::collection::vec(edit(), 0..12), prop::option::of(any::<Index>())).prop_map(
        move |(i, edits, cut)| {
            let mut b = seeds[i].clone();
            for e in edits {
                if b.is_empty() {
                    b.push(0);
                }
                match e {
                    Edit::Set(i, v) => {
                        let i = i.index(b.len());
                        b[i] = v;
                    }
                    Edit::Insert(i, v) => {
                        let i = i.index(b.len() + 1);
                        b.insert(i, v);
                    }
                    Edit::Delete(i) => {
                        let i = i.index(b.len());
                        b.remove(i);
                    }
                    Edit::Duplicate(a, c) => {
                        let (a, c) = (a.index(b.len()), c.index(b.len()));
                        let (lo, hi) = (a.min(c), a.max(c).min(a.min(c) + 256));
                        let piece = b[lo..hi].to_vec();
                        b.splice(hi..hi, piece);
                    }
                }
            }
            if let Some(c) = cut {
                let keep = c.index(b.len() + 1);
                b.truncate(keep);
            }
            b
        },
    );
    prop_oneof![4 => mutated, 1 => prop::collection::vec(any::<u8>(), 0..2048)]
}

/// Runs `target` on generated inputs: 128 cases, or for `CARE_FUZZ_SECONDS` seconds. Panics fail the test.
fn fuzz(name: &str, strategy: impl Strategy<Value = Vec<u8>>, target: impl Fn(&[u8])) {
    UNGUARDED.with(|u| u.set(true));
    let secs: u64 = std::env::var("CARE_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let started = Instant::now();
    let mut cases = 0u64;
    loop {
        let mut runner = TestRunner::new(Config { cases: 128, failure_persistence: None, ..Config::default() });
        let result = runner.run(&strategy, |bytes| {
            target(&bytes);
            Ok(())
        });
        cases += 128;
        if let Err(e) = result {
            panic!("fuzz target {name}: {e}");
        }
        if started.elapsed() >= Duration::from_secs(secs) {
            break;
        }
    }
    eprintln!("fuzz {name}: {cases} inputs in {:.1} s, no panic", started.elapsed().as_secs_f64());
}

fn parse(kind: FileKind, name: &str, bytes: &[u8]) {
    let origin = Origin::of_file(Path::new(name));
    let limits = IngestLimits { max_file_bytes: 8 << 20, max_expanded_bytes: 16 << 20, ..Default::default() };
    let opts = IngestOptions::default();
    let _ = if kind == FileKind::Zip {
        super::archive::expand(&origin, bytes, &opts, &limits).map(|_| ())
    } else {
        parse_inner(&origin, kind, bytes, &opts, &limits).map(|f| {
            // What reaches the chunker must chunk without panicking too.
            for d in &f.documents {
                let _ = crate::text::chunk(&d.text, &crate::text::ChunkConfig::default());
            }
        })
    };
}

#[test]
fn fuzz_pdf() {
    let seeds = vec![
        pdf_bytes(&[vec!["二甲双胍用药指南", "严重肾功能不全者禁用。"], vec!["第二页"]]),
        pdf_bytes(&[vec!["Aspirin 100mg qd"]]),
    ];
    fuzz("pdf", inputs(seeds), |b| parse(FileKind::Pdf, "f.pdf", b));
}

#[test]
fn fuzz_docx() {
    let seeds = vec![
        docx_bytes(&[(Some("1"), "标题"), (None, "正文 & 内容。"), (Some("Heading2"), "小节")], Some("文档")),
        docx_bytes(&[(None, "x")], None),
    ];
    fuzz("docx", inputs(seeds), |b| parse(FileKind::Docx, "f.docx", b));
}

#[test]
fn fuzz_zip() {
    let inner = zip_bytes(&[("a.md", "# 标题\n正文。".as_bytes())]);
    let seeds = vec![
        zip_bytes(&[("a/b.txt", "高血压。".as_bytes()), ("c.jsonl", b"{\"text\":\"x\"}\n"), ("n.zip", &inner)]),
        zip_bytes(&[("q.csv", "text\n发热\n".as_bytes()), ("p.html", "<p>文</p>".as_bytes())]),
    ];
    fuzz("zip", inputs(seeds), |b| parse(FileKind::Zip, "f.zip", b));
}

#[test]
fn fuzz_html() {
    let (gbk, _, _) = encoding_rs::GBK.encode("<meta charset=gbk><title>痛风</title><h1>痛风</h1><p>低嘌呤饮食。</p>");
    let seeds = vec![
        gbk.into_owned(),
        b"<html><body><nav>x</nav><h2>A</h2><table><tr><td>1</td><td>2</td></tr></table><script>x</script></body></html>"
            .to_vec(),
    ];
    fuzz("html", inputs(seeds), |b| parse(FileKind::Html, "f.html", b));
}

#[test]
fn fuzz_csv() {
    let (gb, _, _) =
        encoding_rs::GB18030.encode("编号,问题,答案\nq1,发热？,\"多饮水，\"\"休息\"\"。\"\nq2,咳嗽？,就医。\n");
    let seeds = vec![gb.into_owned(), b"text\tid\nx\t1\n".to_vec()];
    fuzz("csv", inputs(seeds.clone()), |b| parse(FileKind::Csv, "f.csv", b));
    fuzz("tsv", inputs(seeds), |b| parse(FileKind::Tsv, "f.tsv", b));
}

#[test]
fn fuzz_jsonl() {
    let seeds = vec![
        "{\"id\":\"a\",\"title\":\"t\",\"text\":\"糖尿病\"}\n{\"_id\":7,\"text\":\"\\u001a高血压\"}\n"
            .as_bytes()
            .to_vec(),
    ];
    fuzz("jsonl", inputs(seeds), |b| parse(FileKind::Jsonl, "f.jsonl", b));
}

#[test]
fn fuzz_text_and_markdown() {
    let (gb, _, _) = encoding_rs::GB18030.encode("# 指南\n## 用法\n每日一次。ＣＴ检查前停药；５％葡萄糖！");
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend("二甲双胍。".encode_utf16().flat_map(|u| u.to_le_bytes()));
    let seeds = vec![gb.into_owned(), utf16, "# 标题\n正文。".as_bytes().to_vec()];
    fuzz("text", inputs(seeds.clone()), |b| parse(FileKind::Text, "f.txt", b));
    fuzz("markdown", inputs(seeds), |b| parse(FileKind::Markdown, "f.md", b));
}
