use super::*;
use crate::Engine;

/// An offline document package (no graph: nothing but the weights) named `name@1` whose model.safetensors is
/// `weights`.
fn offline_package(at: &Path, name: &str, weights: &[u8]) -> PathBuf {
    let dir = at.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    let mut m = ModelManifest {
        format: care_formats::manifest::MANIFEST_FORMAT,
        name: name.into(),
        version: "1".into(),
        role: ModelRole::Document,
        architecture: "qwen3".into(),
        pooling: Pooling::LastToken,
        width: 64,
        hidden: 64,
        max_length: 512,
        normalize: true,
        query_template: "{text}".into(),
        document_template: "{text}".into(),
        instruction: String::new(),
        pairing_id: format!("{name}-pairing"),
        files: Default::default(),
        provenance: Default::default(),
    };
    m.write(&dir, &["model.safetensors"]).unwrap();
    dir
}

/// A header claiming `claimed` bytes of F32 over `actual` bytes of data.
fn lying_weights(claimed: u64, actual: usize) -> Vec<u8> {
    let h = serde_json::json!({"w": {"dtype": "F32", "shape": [claimed / 4], "data_offsets": [0, claimed]}});
    let mut h = serde_json::to_vec(&h).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.resize(out.len() + actual, 0);
    out
}

fn good_weights() -> Vec<u8> {
    let mut m = care_modelio::TensorMap::new();
    m.insert("w".into(), care_modelio::Tensor { shape: vec![4, 4], data: vec![0.5; 16] });
    let mut out = Vec::new();
    care_modelio::safetensors::write_to(&m, &mut out).unwrap();
    out
}

fn engine(dir: &Path) -> Engine {
    let cfg = crate::config::test_config(dir);
    Engine::open(cfg, crate::engine::OpenMode::Create).unwrap()
}

/// The finding: an offline package whose safetensors header declares 2 GiB over 64 bytes registered. Now it is
/// refused as `invalid_package` with the reason in Chinese, and nothing is registered or left behind.
#[test]
fn safetensors_headers_that_lie_about_the_file_are_refused_at_import() {
    let t = tempfile::tempdir().unwrap();
    let e = engine(&t.path().join("data"));
    let admin = Admin::console("cli:root");
    let bad = offline_package(t.path(), "liar", &lying_weights(2 << 30, 64));
    let err = e.models().import(&admin, &bad).unwrap_err();
    assert_eq!(err.code(), crate::ErrorCode::InvalidPackage, "{err}");
    assert!(err.to_string().contains("model.safetensors 的头部与文件不符") && err.to_string().contains("超出数据区"));
    assert!(models::find(&e.store, "liar@1").is_err());
    assert!(!e.dir.models().join("liar").join("1").exists());
    let good = offline_package(t.path(), "honest", &good_weights());
    assert!(!e.models().import(&admin, &good).unwrap().online);
}

/// Two imports of one `name@version` at once: exactly one registers; the other is told, in Chinese, that
/// another import of it runs (`busy`) or that it is registered; the winner's folder survives. An import while
/// the lock is held (by another process, say) is refused without touching anything.
#[test]
fn concurrent_imports_of_one_name_and_version_leave_one_model() {
    let t = tempfile::tempdir().unwrap();
    let e = std::sync::Arc::new(engine(&t.path().join("data")));
    let pkg = offline_package(t.path(), "twice", &good_weights());
    let held = import_lock(&e.dir.import_locks(), "twice@1").unwrap();
    let err = e.models().import(&Admin::console("cli:root"), &pkg).unwrap_err();
    assert_eq!(err.code(), crate::ErrorCode::Busy);
    assert!(err.to_string().contains("正在由另一个导入处理"), "{err}");
    drop(held);
    for round in 0..3 {
        let name = format!("race{round}");
        let pkg = offline_package(t.path(), &name, &good_weights());
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let (e, pkg, barrier) = (e.clone(), pkg.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    e.models().import(&Admin::console("cli:root"), &pkg)
                })
            })
            .collect();
        let results: Vec<_> = runs.into_iter().map(|r| r.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
        let lost = results.into_iter().find_map(|r| r.err()).unwrap();
        let msg = lost.to_string();
        assert!(msg.contains("正在由另一个导入处理") || msg.contains("已注册"), "{msg}");
        let m = models::find(&e.store, &format!("{name}@1")).unwrap();
        assert!(m.dir.join("model.safetensors").is_file(), "the winner's folder was removed");
    }
}

fn gain(lo: f64) -> Compared {
    Compared {
        live: 0.5,
        live_lo: 0.45,
        live_hi: 0.55,
        candidate: 0.5 + lo + 0.01,
        candidate_lo: 0.5,
        candidate_hi: 0.6,
        gain: lo + 0.01,
        gain_lo: lo,
        gain_hi: lo + 0.02,
    }
}

#[test]
fn gate_needs_both_the_quality_bound_and_the_latency_budget() {
    let lc = crate::config::LifecycleConfig { gate_margin: 0.005, max_latency_ratio: 1.25, ..Default::default() };
    let live = EncodeLatency { p50_ms: 8.0, p99_ms: 10.0 };
    let (fast, slow) = (EncodeLatency { p50_ms: 4.0, p99_ms: 12.5 }, EncodeLatency { p50_ms: 9.0, p99_ms: 12.6 });
    let cols = [("huatuo".to_string(), 0.02), ("kuake".to_string(), -0.005)];
    assert!(gate(&gain(0.006), &cols, (&live, &fast), &lc).0);
    // The bound must beat the margin, not merely be positive.
    let (ok, why) = gate(&gain(0.004), &cols, (&live, &fast), &lc);
    assert!(!ok && why[0].contains("未高于"), "{why:?}");
    let (ok, why) = gate(&gain(0.05), &cols, (&live, &slow), &lc);
    assert!(!ok && why[2].contains("超出") && why[2].contains("12.50"), "{why:?}");
    // A large collection's gain does not hide a smaller one's loss beyond max_collection_loss (0.01).
    let (ok, why) = gate(&gain(0.006), &[("huatuo".into(), 0.03), ("kuake".into(), -0.012)], (&live, &fast), &lc);
    assert!(!ok && why[1].contains("kuake") && why[1].contains("-0.0120") && why[1].contains("超过"), "{why:?}");
    let (ok, why) = gate(&gain(0.006), &cols, (&live, &fast), &lc);
    assert!(ok && why[1].contains("kuake") && why[1].contains("未超过"), "{why:?}");
}
