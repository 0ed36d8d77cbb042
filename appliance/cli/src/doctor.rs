//! `care doctor`: checks an installation and says what to fix.
//!
//! It never changes anything: the data directory is inspected read-only (an older schema is reported as "will be
//! migrated", not migrated), and the full index check runs only when the service is not holding the indexes.

use std::net::TcpListener;
use std::path::Path;

use care_engine::datadir::LAYOUT_VERSION;
use care_engine::encoders::{CudaUnavailable, NVIDIA_NODE};
use care_engine::store::{latest_schema, peek_schema_version};
use care_engine::{Engine, ErrorCode, OpenMode};
use serde::Serialize;

use crate::config::AppConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(name: &'static str, detail: impl Into<String>) -> Check {
    Check { name, status: Status::Ok, detail: detail.into(), fix: None }
}
fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
}
fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
}

/// Free space below this fails the check (ingest and re-embedding write new index segments before old ones go).
const DISK_FAIL_BYTES: u64 = 2 << 30;
const DISK_WARN_BYTES: u64 = 10 << 30;

pub fn run(cfg: &AppConfig, config_file: Option<&Path>) -> Vec<Check> {
    let mut checks = vec![config_check(cfg, config_file)];
    checks.extend(config_file.and_then(config_permissions));
    let data_dir = cfg.engine.storage.data_dir.clone();
    let (dir_check, schema) = data_dir_check(&data_dir);
    checks.push(dir_check);
    checks.push(disk_check(&data_dir));
    checks.push(port_check(&cfg.server.bind));
    checks.push(tls_check(cfg));
    checks.extend(runtime_checks(cfg));
    if schema == Some(latest_schema()) {
        checks.push(index_check(cfg));
    }
    checks
}

fn config_check(cfg: &AppConfig, file: Option<&Path>) -> Check {
    let source = match file {
        Some(f) => format!("{} + 环境变量", f.display()),
        None => "内置默认值 + 环境变量（没有配置文件）".into(),
    };
    if cfg.server.bind.parse::<std::net::SocketAddr>().is_err() {
        return fail(
            "配置",
            format!("server.bind = {:?} 不是“地址:端口”（{source}）", cfg.server.bind),
            "在配置文件中把 server.bind 设为例如 \"0.0.0.0:8443\"",
        );
    }
    ok("配置", format!("有效（{source}）"))
}

fn config_permissions(file: &Path) -> Option<Check> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    let mode = meta.permissions().mode() & 0o777;
    Some(if mode & 0o007 != 0 {
        warn(
            "配置文件权限",
            format!("{} 所有用户都能读取（权限 {mode:o}），其中可能有密钥", file.display()),
            format!("chown root:care {0} && chmod 0640 {0}", file.display()),
        )
    } else {
        ok("配置文件权限", format!("权限 {mode:o}"))
    })
}

/// Returns the check and, when readable, the metadata schema version.
fn data_dir_check(dir: &Path) -> (Check, Option<u32>) {
    const NAME: &str = "数据目录";
    if !dir.exists() {
        return (
            warn(
                NAME,
                format!("{} 尚不存在", dir.display()),
                "以服务用户运行 `care init`（安装包的 postinst 会做这一步）",
            ),
            None,
        );
    }
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    if let Err(e) = std::fs::write(&probe, b"") {
        return (
            fail(
                NAME,
                format!("当前用户不能写入 {}：{e}", dir.display()),
                format!("chown -R care:care {}", dir.display()),
            ),
            None,
        );
    }
    let _ = std::fs::remove_file(&probe);
    let layout = std::fs::read_to_string(dir.join("VERSION")).ok().and_then(|s| s.trim().parse::<u32>().ok());
    if let Some(v) = layout
        && v > LAYOUT_VERSION
    {
        return (
            fail(
                NAME,
                format!("目录布局版本 {v} 比本程序支持的（{LAYOUT_VERSION}）新"),
                "重新安装较新的 care-appliance 安装包",
            ),
            None,
        );
    }
    let sqlite = dir.join("care.sqlite");
    if !sqlite.exists() {
        return (warn(NAME, format!("{} 中还没有元数据库", dir.display()), "运行 `care init`"), None);
    }
    match peek_schema_version(&sqlite) {
        Ok(v) if v > latest_schema() => (
            fail(
                NAME,
                format!("元数据库结构版本 {v} 由较新的版本写入（本程序最高读取 {}）", latest_schema()),
                "重新安装较新的安装包，或恢复安装前做的备份",
            ),
            Some(v),
        ),
        Ok(v) if v < latest_schema() => (
            warn(
                NAME,
                format!("元数据库结构版本 {v} 将在下次启动时升级到 {}", latest_schema()),
                format!("先备份 {}，再运行 `care init` 或启动服务", dir.display()),
            ),
            Some(v),
        ),
        Ok(v) => (ok(NAME, format!("{}（布局 {LAYOUT_VERSION}，结构版本 {v}）", dir.display())), Some(v)),
        Err(e) => (fail(NAME, format!("{}：{e}", sqlite.display()), "从备份恢复 care.sqlite"), None),
    }
}

fn disk_check(dir: &Path) -> Check {
    const NAME: &str = "磁盘空间";
    match care_engine::datadir::free_bytes(dir) {
        Ok((at, free)) => {
            let gib = free as f64 / (1u64 << 30) as f64;
            let detail = format!("{} 所在文件系统剩余 {gib:.1} GiB", at.display());
            if free < DISK_FAIL_BYTES {
                fail(NAME, detail, "请清理磁盘：入库和重新生成向量都要先写出新的索引段")
            } else if free < DISK_WARN_BYTES {
                warn(NAME, detail, "大批上传或重新生成向量之前请准备更多空间")
            } else {
                ok(NAME, detail)
            }
        }
        Err(e) => warn(NAME, format!("无法读取 {} 的剩余空间：{e}", dir.display()), "检查挂载"),
    }
}

fn port_check(bind: &str) -> Check {
    const NAME: &str = "端口";
    match TcpListener::bind(bind) {
        Ok(_) => ok(NAME, format!("{bind} 空闲")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => warn(
            NAME,
            format!("{bind} 已被占用（正在运行的服务，或其他程序）"),
            format!(
                "`systemctl status care`；如果不是 care，请修改 server.bind（查看：`ss -ltnp | grep {}`）",
                bind.rsplit(':').next().unwrap_or("")
            ),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => fail(
            NAME,
            format!("无权监听 {bind}"),
            "1024 以下的端口需要 CAP_NET_BIND_SERVICE：请用 8443，或在 systemd 配置片段中授予（AmbientCapabilities=CAP_NET_BIND_SERVICE）",
        ),
        Err(e) => fail(NAME, format!("无法监听 {bind}：{e}"), "把 server.bind 设为本机的地址"),
    }
}

fn tls_check(cfg: &AppConfig) -> Check {
    const NAME: &str = "TLS";
    let tls_dir = cfg.engine.storage.data_dir.join("tls");
    match care_server::tls::inspect(&cfg.server, &tls_dir) {
        Ok(None) => warn(
            NAME,
            "还没有证书：首次启动时会生成自签名证书",
            "正式使用请把 server.tls_cert 和 server.tls_key 设为医院 CA 签发的证书",
        ),
        Ok(Some(info)) => {
            let days = info.days_left;
            let detail =
                format!("{}（{days} 天后到期{}）", info.path.display(), if info.self_signed { "，自签名" } else { "" });
            if days < 0 {
                fail(NAME, detail, "证书已过期：请更新证书并重启服务")
            } else if days < 30 {
                warn(NAME, detail, "请尽快更新证书")
            } else if info.self_signed {
                warn(NAME, detail, "浏览器会对自签名证书发出警告；正式使用请设置 server.tls_cert 和 server.tls_key")
            } else {
                ok(NAME, detail)
            }
        }
        Err(e) => fail(
            NAME,
            e.to_string(),
            "修正 server.tls_cert / server.tls_key（care 用户可读的 PEM 文件，私钥与证书匹配）",
        ),
    }
}

fn runtime_checks(cfg: &AppConfig) -> Vec<Check> {
    let mut out = Vec::new();
    match care_engine::encoders::init_runtime(&cfg.engine.model) {
        Ok((path, _)) => out.push(ok("ONNX Runtime", path.display().to_string())),
        Err(e) => {
            out.push(fail("ONNX Runtime", e.to_string(), "重新安装 care-appliance 安装包，或设置 model.ort_library"));
            return out;
        }
    }
    out.push(cpu_check());
    let ocr = &cfg.engine.ingest.ocr;
    let ocr_device = care_engine::encoders::device_for(&ocr.runtime(&cfg.engine.model));
    out.push(ocr_check(ocr, ocr_device.map(|d| d.device).map_err(|e| e.to_string())));
    let probe = care_engine::encoders::probe_cuda(&cfg.engine.model);
    out.push(gpu_check(&cfg.engine.model.device, care_engine::encoders::gpu_present(), probe));
    out.push(training_check(care_engine::training::device_for(&cfg.engine.training)));
    out
}

/// The training line: the device runs train on and the recipe a run takes there when the admin changes nothing
/// (`Recipe::for_device`: both sides at full budget on a GPU, the query side on a CPU).
fn training_check(device: &str) -> Check {
    use care_engine::training::{Recipe, Sides};
    let r = Recipe::for_device(device);
    let groups = r.stage2_group_budget();
    let detail = match r.sides {
        Sides::Both => format!(
            "在 GPU 上训练；默认配方：查询编码器与文档编码器（LoRA r = {}）一起训练，{} 组（{} 步 × {} 组）；\
             GPU 上的步时尚无本机实测（首次运行后“训练”页按实测估算）",
            r.lora_rank, groups, r.stage2_steps, r.stage2_batch_size
        ),
        Sides::QueryOnly => format!(
            "在 CPU 上训练；默认配方：只训练查询编码器，{groups} 组（{} 步 × {} 组），文档向量不变；\
             两侧一起训练在 CPU 上每组用时约为 40 倍，可在“训练”页选择",
            r.stage2_steps, r.stage2_batch_size
        ),
    };
    ok("训练", detail)
}

/// The OCR line: whether scans and photos can be read here (where the models are, or why not), and on which device
/// (`device`: what `ingest.ocr.device` resolves to, or why `cuda` cannot be had).
fn ocr_check(ocr: &care_engine::ingest::scan::OcrConfig, device: Result<&str, String>) -> Check {
    const NAME: &str = "文字识别";
    if !ocr.enabled {
        return ok(NAME, "已关闭 (ingest.ocr.enabled = false)：扫描件和图像上传时会被拒绝");
    }
    match (ocr.models_dir(), device) {
        (Some(_), Err(why)) => fail(
            NAME,
            format!("ingest.ocr.device = \"cuda\"，但 CUDA 不可用：{why}"),
            "安装 GPU 版 ONNX Runtime（见 docs/admin/gpu.md），或把 ingest.ocr.device 设为 auto",
        ),
        (Some(dir), Ok(device)) => ok(
            NAME,
            format!(
                "PP-OCRv4 模型：{}；在{}上识别；每个文件最多识别 {} 页扫描件",
                dir.display(),
                if device == "cuda" { " GPU " } else { " CPU " },
                ocr.max_pages
            ),
        ),
        (None, _) => warn(
            NAME,
            "找不到文字识别模型：扫描件和图像上传时会被拒绝",
            format!(
                "重新安装 care-appliance 安装包（模型在 {}），或设置 ingest.ocr.models",
                care_engine::ingest::scan::PACKAGED_OCR
            ),
        ),
    }
}

/// The CPU line: its model and cores, the vector scan's instruction set, and whether int8 query encoding pays here
/// (the int8 graph is worth serving where the CPU has an 8-bit dot-product instruction).
fn cpu_check() -> Check {
    let int8 = care_engine::kernels::Int8Support::detected();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let detail = format!(
        "{}，{cores} 核；向量扫描用 {}；{}",
        care_engine::kernels::cpu_model(),
        care_engine::kernels::Isa::detected().name(),
        int8.label_zh()
    );
    ok("CPU", detail)
}

/// The GPU line: decided by a real one-node CUDA session (the probe), not by what ONNX Runtime was compiled with.
fn gpu_check(device: &str, gpu: bool, probe: care_engine::Result<Result<(), CudaUnavailable>>) -> Check {
    const NAME: &str = "GPU";
    let why = match probe {
        Ok(Ok(())) if device == "cpu" => {
            return warn(
                NAME,
                "CUDA 可用，但 model.device = \"cpu\"",
                "设置 model.device = \"auto\" 以在 GPU 上编码查询",
            );
        }
        Ok(Ok(())) => return ok(NAME, "CUDA 可用：测试会话已在 GPU 上打开并运行，查询在 GPU 上编码"),
        Ok(Err(why)) => why,
        Err(e) => CudaUnavailable::new(e.to_string()),
    };
    let missing = why.missing.as_deref().map(|m| format!("缺少 {m}；")).unwrap_or_default();
    let detail = |head: &str| format!("{head}；CUDA 不可用（CUDA unavailable）：{missing}{}", why.reason.trim());
    match (device, gpu) {
        ("cuda", _) => fail(NAME, detail("model.device = \"cuda\"，服务将无法启动"), why.fix_zh()),
        ("cpu", _) => ok(NAME, detail("model.device = \"cpu\"：查询在 CPU 上编码")),
        (_, true) => warn(NAME, detail("检测到 NVIDIA GPU，但查询回退到 CPU 编码"), why.fix_zh()),
        (_, false) => ok(NAME, detail(&format!("无 GPU（{NVIDIA_NODE} 不存在）：查询在 CPU 上编码"))),
    }
}

fn index_check(cfg: &AppConfig) -> Check {
    const NAME: &str = "模型与索引";
    let e = match Engine::open(cfg.engine.clone(), OpenMode::Existing) {
        Ok(e) => e,
        Err(err) if err.code() == ErrorCode::Locked => {
            return warn(NAME, "正在运行的服务占用着索引，未检查", "停止服务后可做完整检查");
        }
        Err(err) if err.code() == ErrorCode::ModelMismatch => {
            return fail(NAME, err.to_string(), "启用一对匹配的模型：`care model list`，`care model activate`");
        }
        Err(err) => return fail(NAME, err.to_string(), "见上面的信息；`care check` 给出详情"),
    };
    let models = match e.retrieval().active_models() {
        Ok(Some(p)) => {
            format!("在用模型 {}@{} / {}@{}", p.query.name, p.query.version, p.document.name, p.document.version)
        }
        Ok(None) => "没有启用模型（只用关键词检索）".into(),
        Err(err) => return fail(NAME, err.to_string(), "`care model list`；重新导入默认模型"),
    };
    match e.indexer().check() {
        Ok(r) if r.consistent => {
            ok(NAME, format!("{models}；{} 个文本块，SQLite、tantivy 与 LanceDB 一致", r.sqlite_chunks))
        }
        Ok(r) => fail(
            NAME,
            format!("{models}；索引与 SQLite 不一致：{}", serde_json::to_string(&r).unwrap_or_default()),
            "重启服务（恢复过程会修复中断的工作），再运行 `care check`",
        ),
        Err(err) => fail(NAME, err.to_string(), "`care check` 给出详情"),
    }
}

pub fn print(checks: &[Check]) {
    for c in checks {
        let mark = match c.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        // Padded to 20 columns as a terminal shows them (a Chinese character takes two).
        let width: usize = c.name.chars().map(|ch| if ch >= '\u{2e80}' { 2 } else { 1 }).sum();
        println!("[{mark}] {}{} {}", c.name, " ".repeat(20usize.saturating_sub(width)), c.detail);
        if let Some(fix) = &c.fix
            && c.status != Status::Ok
        {
            println!("       {:<20} 处理：{fix}", "");
        }
    }
}

pub fn exit_code(checks: &[Check]) -> i32 {
    if checks.iter().any(|c| c.status == Status::Fail) { 1 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use care_engine::encoders::ModelConfig;

    const PROVIDER: &str = "libonnxruntime_providers_cuda.so";

    #[test]
    fn the_ocr_line_names_the_models_or_says_scans_will_be_refused() {
        use care_engine::ingest::scan::OcrConfig;
        let empty = tempfile::tempdir().unwrap();
        let missing = ocr_check(&OcrConfig { models: Some(empty.path().into()), ..Default::default() }, Ok("cpu"));
        assert!(matches!(missing.status, Status::Warn) && missing.detail.contains("会被拒绝"), "{missing:?}");
        assert!(missing.fix.as_deref().is_some_and(|f| f.contains("/usr/share/care/ocr")), "{missing:?}");
        let off = ocr_check(&OcrConfig { enabled: false, ..Default::default() }, Ok("cpu"));
        assert!(matches!(off.status, Status::Ok) && off.detail.contains("已关闭"), "{off:?}");
        let dir =
            std::env::var_os("CARE_OCR_MODELS").expect("CARE_OCR_MODELS (packaging/dev.sh setup fetches the models)");
        let found = ocr_check(&OcrConfig { models: Some(dir.clone().into()), ..Default::default() }, Ok("cpu"));
        assert!(matches!(found.status, Status::Ok) && found.detail.contains("PP-OCRv4"), "{found:?}");
        assert!(found.detail.contains("在 CPU 上识别"), "{found:?}");
        let no_cuda = ocr_check(&OcrConfig { models: Some(dir.into()), ..Default::default() }, Err("没有 GPU".into()));
        assert!(matches!(no_cuda.status, Status::Fail) && no_cuda.detail.contains("没有 GPU"), "{no_cuda:?}");
    }

    fn missing(lib: &str) -> care_engine::Result<Result<(), CudaUnavailable>> {
        Ok(Err(CudaUnavailable::new(format!(
            "Failed to load library {PROVIDER} with error: {lib}: cannot open shared object file"
        ))))
    }

    #[test]
    fn the_training_line_names_the_recipe_the_device_gets() {
        let gpu = training_check("cuda");
        assert!(gpu.detail.contains("文档编码器") && gpu.detail.contains("16000 组"), "{}", gpu.detail);
        let cpu = training_check("cpu");
        assert!(cpu.detail.contains("只训练查询编码器") && cpu.detail.contains("16000 组"), "{}", cpu.detail);
    }

    #[test]
    fn the_gpu_line_follows_the_probe_and_the_configured_device() {
        assert_eq!(gpu_check("auto", true, Ok(Ok(()))).status, Status::Ok);
        assert_eq!(gpu_check("cpu", true, Ok(Ok(()))).status, Status::Warn);
        let cuda = gpu_check("cuda", true, missing("libcublasLt.so.13"));
        assert_eq!(cuda.status, Status::Fail);
        assert!(cuda.detail.contains("libcublasLt.so.13"), "{}", cuda.detail);
        assert!(cuda.fix.as_deref().is_some_and(|f| f.contains("onnxruntime-gpu[cuda,cudnn]==1.31.1")), "{cuda:?}");
        let fallback = gpu_check("auto", true, missing("libcudnn.so.9"));
        assert_eq!(fallback.status, Status::Warn, "a GPU left unused is worth a warning");
        assert!(fallback.detail.contains("回退到 CPU"), "{}", fallback.detail);
        assert_eq!(gpu_check("auto", false, missing("libcudart.so.13")).status, Status::Ok);
    }

    /// The real probe against the runtime this machine has (CPU-only in CI): unavailable, with the reason.
    #[test]
    fn the_cuda_probe_here_says_unavailable_with_a_reason() {
        let model = ModelConfig::default();
        let (lib, _) = care_engine::encoders::init_runtime(&model).unwrap();
        if lib.with_file_name(PROVIDER).exists() {
            eprintln!("skipped: {} has a CUDA provider beside it", lib.display());
            return;
        }
        let check = gpu_check("cuda", care_engine::encoders::gpu_present(), care_engine::encoders::probe_cuda(&model));
        eprintln!("{check:?}");
        assert_eq!(check.status, Status::Fail);
        assert!(check.detail.contains("CUDA 不可用") && check.detail.contains(PROVIDER), "{}", check.detail);
    }
}
