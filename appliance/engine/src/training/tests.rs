use super::*;

/// Writes each `(path, bytes)` of `files` under `root`, `bytes` bytes long.
fn write_files(root: &Path, files: &[(&str, usize)]) {
    for (f, n) in files {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![b'x'; *n]).unwrap();
    }
}

#[test]
fn an_ended_runs_folder_keeps_its_data_and_logs_and_frees_its_weights() {
    let t = tempfile::tempdir().unwrap();
    let files = [
        ("corpus.jsonl", 10),
        ("served_vectors.safetensors", 1000),
        ("logs/stage1.log", 10),
        ("stage1/metrics.jsonl", 10),
        ("stage1/loss.svg", 10),
        ("stage1/query/model.safetensors", 2000),
        ("stage1/query/config.json", 10),
        ("stage1/checkpoints/step-00000010/params.safetensors", 300),
        ("stage1/checkpoints/step-00000010/state.json", 5),
        ("export/model.onnx", 2000),
        ("export/manifest.toml", 10),
    ];
    write_files(t.path(), &files);
    assert_eq!(prune_run_dir(t.path()), 1000 + 2000 + 300 + 5 + 2000);
    for (f, n) in files {
        let kept = n == 10;
        assert_eq!(t.path().join(f).exists(), kept, "{f}");
    }
    assert!(!t.path().join("stage1/checkpoints").exists());
    assert_eq!(prune_run_dir(t.path()), 0, "pruning twice frees nothing more");
}

/// Each ended phase frees what no later one reads, and only that: a restart after it finds what it resumes.
#[test]
fn an_ended_phase_frees_only_what_no_later_phase_reads() {
    let t = tempfile::tempdir().unwrap();
    let files = [
        ("served_vectors.safetensors", 1000),
        ("stage1/query/model.safetensors", 2000),
        ("stage1/checkpoints/step-00000010/params.safetensors", 300),
        ("stage2/query/model.safetensors", 2000),
        ("stage2/document/model.safetensors", 2000),
        ("stage2/checkpoints/step-00000004/optim.safetensors", 600),
        ("stage2/metrics.jsonl", 10),
        ("merged/model.safetensors", 2000),
        ("export/model.safetensors", 2000),
        ("export/model_int8.onnx", 1500),
        ("export-document/model.onnx", 2000),
    ];
    write_files(t.path(), &files);
    let exists = |f: &str| t.path().join(f).exists();
    assert_eq!(prune_behind(t.path(), "data"), 0);
    assert_eq!(prune_behind(t.path(), "stage1"), 300);
    assert!(exists("stage1/query/model.safetensors") && exists("stage2/checkpoints"));
    assert_eq!(prune_behind(t.path(), "stage2"), 600);
    assert!(exists("stage2/query/model.safetensors") && exists("stage2/document/model.safetensors"));
    std::fs::rename(t.path().join("merged"), t.path().join("unmerged")).unwrap();
    assert_eq!(prune_behind(t.path(), "merge"), 0, "without a merge the export reads Stage II's weights");
    std::fs::rename(t.path().join("unmerged"), t.path().join("merged")).unwrap();
    assert_eq!(prune_behind(t.path(), "merge"), 1000 + 2000 * 3, "the export reads the merged weights only");
    assert!(exists("merged/model.safetensors") && exists("stage2/metrics.jsonl"));
    assert_eq!(prune_behind(t.path(), "export"), 2000);
    assert!(exists("export/model.safetensors") && exists("export-document/model.onnx"));
    assert!(!exists("merged/model.safetensors") && exists("stage2/metrics.jsonl"));
    assert_eq!(prune_behind(t.path(), "import"), 2000 + 1500 + 2000);
    assert!(!exists("export/model_int8.onnx") && !exists("export-document/model.onnx"));
}

#[test]
fn stage_two_sees_each_group_at_most_four_times() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("stage2.jsonl");
    let r = Recipe { stage2_steps: 500, stage2_batch_size: 32, ..Recipe::default() };
    std::fs::write(&file, "{}\n".repeat(100)).unwrap();
    assert_eq!(capped_steps(&r, &file), 16, "100 groups: 4 batches of 32 an epoch, 4 epochs");
    std::fs::write(&file, "{}\n".repeat(8313)).unwrap();
    assert_eq!(capped_steps(&r, &file), 500, "the real run's 8,313 groups: the recipe's steps");
    let few = Recipe { stage2_max_groups: 64, ..r.clone() };
    assert_eq!(capped_steps(&few, &file), 8, "only stage2_max_groups of the groups are used");
    assert_eq!(capped_steps(&r, &t.path().join("none")), 4, "no file: one batch, four times");
}

#[test]
fn a_full_disk_is_its_own_code_with_words_an_admin_acts_on() {
    let full = Error::io("/var/lib/care/x", std::io::Error::from(std::io::ErrorKind::StorageFull));
    assert_eq!(full.code(), crate::ErrorCode::DiskFull);
    assert!(full.to_string().starts_with("磁盘空间不足：写入 /var/lib/care/x"), "{full}");
    let other = Error::io("/var/lib/care/x", std::io::Error::from(std::io::ErrorKind::PermissionDenied));
    assert_eq!(other.code(), crate::ErrorCode::Io);
    let e = Error::DiskFull { path: "/d".into(), needed: 3 << 30, available: 1 << 30, reserve: 2 << 30 };
    assert!(e.to_string().contains("剩余 1.0 GB，一次训练约需 3.0 GB（含保留的 2.0 GB）"), "{e}");
}

fn run(job: i64, state: &str, device: &str, recipe: Recipe, phases: &[(&str, f64)]) -> TrainingRun {
    TrainingRun {
        job,
        state: state.into(),
        stage: String::new(),
        progress_done: 0,
        progress_total: 0,
        schedule: None,
        recipe,
        base: String::new(),
        counts: None,
        phases: phases.iter().map(|(p, s)| (p.to_string(), *s)).collect(),
        device: device.into(),
        candidate: String::new(),
        evaluation: None,
        decision: String::new(),
        created_by: String::new(),
        created_at: String::new(),
        updated_at: String::new(),
        error: String::new(),
    }
}

#[test]
fn the_estimate_scales_the_newest_finished_run_of_the_same_shape_on_this_device() {
    let d = Recipe::default();
    let pruned = Recipe { query_layers: Some(4), ..Recipe::default() };
    let full = [("data", 300.0), ("stage1", 0.0), ("stage2", 1200.0), ("merge", 4.0), ("evaluate", 400.0)];
    let runs = vec![
        run(12, "running", "cpu", d.clone(), &full[..2]),
        run(11, "done", "cuda", d.clone(), &[("data", 30.0), ("stage2", 60.0)]),
        run(10, "done", "cpu", pruned.clone(), &[("data", 100.0), ("stage1", 600.0), ("stage2", 300.0)]),
        run(9, "done", "cpu", d.clone(), &full),
        run(8, "failed", "cpu", d.clone(), &full[..1]),
    ];
    // The newest finished one of the same shape on this device: 9 for the default recipe, 10 for the pruned.
    assert_eq!(estimate(&runs, &d, "cpu"), Some(Estimate { from_job: 9, seconds: 1904.0 }));
    let twice = Recipe { stage2_steps: d.stage2_steps * 2, ..d.clone() };
    assert_eq!(estimate(&runs, &twice, "cpu").unwrap().seconds, 3104.0);
    let longer = Recipe { stage1_steps: pruned.stage1_steps * 3, stage2_batch_size: 16, ..pruned.clone() };
    assert_eq!(estimate(&runs, &longer, "cpu"), Some(Estimate { from_job: 10, seconds: 100.0 + 1800.0 + 150.0 }));
    assert_eq!(estimate(&runs, &d, "cuda").unwrap().from_job, 11);
    assert_eq!(estimate(&runs[..1], &d, "cpu"), None, "nothing finished: no estimate");
}

/// Issue 57: a GPU gets CARE's full Stage II by default (both sides, 500 steps × 32 groups, CARE's 1e-4, no gradient
/// cache); a CPU keeps the query side's recipe. Both pass the bounds a request is held to.
#[test]
fn the_default_recipe_on_a_gpu_trains_both_sides_at_full_budget() {
    let gpu = Recipe::for_device("cuda");
    assert_eq!((gpu.sides, gpu.stage2_group_budget()), (Sides::Both, 16_000));
    assert_eq!((gpu.lr, gpu.stage2_sub_batch, gpu.merge_ratio), (1e-4, 0, Recipe::default().merge_ratio));
    assert_eq!(Recipe::for_device("cpu"), Recipe::default());
    assert_eq!(Recipe::default().sides, Sides::QueryOnly);
    gpu.check().unwrap();
    // The device follows the setting: "cpu" whatever the machine has.
    let cfg = TrainingConfig { device: "cpu".into(), ..TrainingConfig::default() };
    assert_eq!(device_for(&cfg), "cpu");
}
