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
        Some(f) => format!("{} + environment", f.display()),
        None => "compiled defaults + environment (no config file)".into(),
    };
    if cfg.server.bind.parse::<std::net::SocketAddr>().is_err() {
        return fail(
            "config",
            format!("server.bind = {:?} is not an address:port ({source})", cfg.server.bind),
            "set server.bind to e.g. \"0.0.0.0:8443\" in the config file",
        );
    }
    ok("config", format!("valid ({source})"))
}

fn config_permissions(file: &Path) -> Option<Check> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    let mode = meta.permissions().mode() & 0o777;
    Some(if mode & 0o007 != 0 {
        warn(
            "config permissions",
            format!("{} is readable by every user (mode {mode:o})", file.display()),
            format!("chown root:care {0} && chmod 0640 {0}", file.display()),
        )
    } else {
        ok("config permissions", format!("mode {mode:o}"))
    })
}

/// Returns the check and, when readable, the metadata schema version.
fn data_dir_check(dir: &Path) -> (Check, Option<u32>) {
    const NAME: &str = "data directory";
    if !dir.exists() {
        return (
            warn(
                NAME,
                format!("{} does not exist yet", dir.display()),
                "run `care init` as the service user (the package's postinst does this)",
            ),
            None,
        );
    }
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    if let Err(e) = std::fs::write(&probe, b"") {
        return (
            fail(
                NAME,
                format!("{} is not writable by this user: {e}", dir.display()),
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
                format!("layout version {v} is newer than this build supports ({LAYOUT_VERSION})"),
                "install the newer care-appliance package again",
            ),
            None,
        );
    }
    let sqlite = dir.join("care.sqlite");
    if !sqlite.exists() {
        return (warn(NAME, format!("{} has no metadata database yet", dir.display()), "run `care init`"), None);
    }
    match peek_schema_version(&sqlite) {
        Ok(v) if v > latest_schema() => (
            fail(
                NAME,
                format!(
                    "metadata schema {v} was written by a newer appliance (this build reads up to {})",
                    latest_schema()
                ),
                "install the newer package again, or restore the backup taken before it was installed",
            ),
            Some(v),
        ),
        Ok(v) if v < latest_schema() => (
            warn(
                NAME,
                format!("metadata schema {v} will be migrated to {} on the next start", latest_schema()),
                format!("back up {} first, then run `care init` or start the service", dir.display()),
            ),
            Some(v),
        ),
        Ok(v) => (ok(NAME, format!("{} (layout {LAYOUT_VERSION}, schema {v})", dir.display())), Some(v)),
        Err(e) => (fail(NAME, format!("{}: {e}", sqlite.display()), "restore care.sqlite from backup"), None),
    }
}

fn disk_check(dir: &Path) -> Check {
    const NAME: &str = "disk space";
    match care_engine::datadir::free_bytes(dir) {
        Ok((at, free)) => {
            let gib = free as f64 / (1u64 << 30) as f64;
            let detail = format!("{gib:.1} GiB free on the file system of {}", at.display());
            if free < DISK_FAIL_BYTES {
                fail(NAME, detail, "free space: ingest and re-embedding need room for new index segments")
            } else if free < DISK_WARN_BYTES {
                warn(NAME, detail, "plan more space before large uploads or re-embedding")
            } else {
                ok(NAME, detail)
            }
        }
        Err(e) => warn(NAME, format!("cannot read free space of {}: {e}", dir.display()), "check the mount"),
    }
}

fn port_check(bind: &str) -> Check {
    const NAME: &str = "port";
    match TcpListener::bind(bind) {
        Ok(_) => ok(NAME, format!("{bind} is free")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => warn(
            NAME,
            format!("{bind} is in use (by the running service, or by another program)"),
            format!(
                "`systemctl status care`; if it is not care, change server.bind (e.g. `ss -ltnp | grep {}`)",
                bind.rsplit(':').next().unwrap_or("")
            ),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => fail(
            NAME,
            format!("not allowed to listen on {bind}"),
            "ports below 1024 need CAP_NET_BIND_SERVICE; use 8443, or grant it in a systemd drop-in (AmbientCapabilities=CAP_NET_BIND_SERVICE)",
        ),
        Err(e) => fail(NAME, format!("cannot listen on {bind}: {e}"), "set server.bind to an address of this host"),
    }
}

fn tls_check(cfg: &AppConfig) -> Check {
    const NAME: &str = "TLS";
    let tls_dir = cfg.engine.storage.data_dir.join("tls");
    match care_server::tls::inspect(&cfg.server, &tls_dir) {
        Ok(None) => warn(
            NAME,
            "no certificate yet: a self-signed one is generated on first start",
            "for production set server.tls_cert and server.tls_key to the hospital CA's certificate",
        ),
        Ok(Some(info)) => {
            let days = info.days_left;
            let detail = format!(
                "{} (expires in {days} days{})",
                info.path.display(),
                if info.self_signed { ", self-signed" } else { "" }
            );
            if days < 0 {
                fail(NAME, detail, "the certificate has expired: renew it and restart the service")
            } else if days < 30 {
                warn(NAME, detail, "renew the certificate soon")
            } else if info.self_signed {
                warn(
                    NAME,
                    detail,
                    "browsers warn about self-signed certificates; set server.tls_cert/tls_key for production",
                )
            } else {
                ok(NAME, detail)
            }
        }
        Err(e) => fail(
            NAME,
            e.to_string(),
            "fix server.tls_cert / server.tls_key (PEM files readable by the care user, key matching the certificate)",
        ),
    }
}

fn runtime_checks(cfg: &AppConfig) -> Vec<Check> {
    let mut out = Vec::new();
    match care_engine::encoders::init_runtime(&cfg.engine.model) {
        Ok((path, _)) => out.push(ok("ONNX Runtime", path.display().to_string())),
        Err(e) => {
            out.push(fail(
                "ONNX Runtime",
                e.to_string(),
                "install the care-appliance package again, or set model.ort_library",
            ));
            return out;
        }
    }
    out.push(cpu_check());
    let probe = care_engine::encoders::probe_cuda(&cfg.engine.model);
    out.push(gpu_check(&cfg.engine.model.device, care_engine::encoders::gpu_present(), probe));
    out
}

/// The CPU line: its model and cores, the vector scan's instruction set, and whether int8 query encoding pays here
/// (the int8 graph is worth serving where the CPU has an 8-bit dot-product instruction).
fn cpu_check() -> Check {
    let int8 = care_engine::kernels::Int8Support::detected();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let detail = format!(
        "{}，{cores} 核；向量扫描用 {}；{}",
        crate::bench::cpu_model(),
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
    const NAME: &str = "models and indexes";
    let e = match Engine::open(cfg.engine.clone(), OpenMode::Existing) {
        Ok(e) => e,
        Err(err) if err.code() == ErrorCode::Locked => {
            return warn(
                NAME,
                "the running service holds the indexes; not checked",
                "stop the service to run the full check",
            );
        }
        Err(err) if err.code() == ErrorCode::ModelMismatch => {
            return fail(NAME, err.to_string(), "activate a matching pair: `care model list`, `care model activate`");
        }
        Err(err) => return fail(NAME, err.to_string(), "see the message; `care check` gives details"),
    };
    let models = match e.active_models() {
        Ok(Some(p)) => {
            format!("active pair {}@{} / {}@{}", p.query.name, p.query.version, p.document.name, p.document.version)
        }
        Ok(None) => "no model active (BM25 only)".into(),
        Err(err) => return fail(NAME, err.to_string(), "`care model list`; re-import the default model"),
    };
    match e.check() {
        Ok(r) if r.consistent => {
            ok(NAME, format!("{models}; {} chunks, SQLite, tantivy and LanceDB agree", r.sqlite_chunks))
        }
        Ok(r) => fail(
            NAME,
            format!("{models}; indexes disagree with SQLite: {}", serde_json::to_string(&r).unwrap_or_default()),
            "restart the service (recovery repairs interrupted work) and run `care check` again",
        ),
        Err(err) => fail(NAME, err.to_string(), "`care check` gives details"),
    }
}

pub fn print(checks: &[Check]) {
    for c in checks {
        let mark = match c.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        println!("[{mark}] {:<20} {}", c.name, c.detail);
        if let Some(fix) = &c.fix
            && c.status != Status::Ok
        {
            println!("       {:<20} fix: {fix}", "");
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

    fn missing(lib: &str) -> care_engine::Result<Result<(), CudaUnavailable>> {
        Ok(Err(CudaUnavailable::new(format!(
            "Failed to load library {PROVIDER} with error: {lib}: cannot open shared object file"
        ))))
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
