//! The `care serve` processes under test and the data directory they are prepared from.

use super::*;

// Servers

pub(super) struct Server {
    pub(super) name: String,
    pub(super) bin: PathBuf,
    pub(super) version: String,
    pub(super) profile: String,
    pub(super) config: PathBuf,
    pub(super) log: PathBuf,
    pub(super) child: Option<Child>,
    pub(super) base: String,
    pub(super) token: String,
    pub(super) client: reqwest::Client,
    pub(super) startup_s: f64,
    pub(super) first_search_s: f64,
    pub(super) warm_up_s: f64,
    pub(super) encoder: Option<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Server {
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(super) fn target(&self, a: &LoadArgs) -> Target {
        Target {
            client: self.client.clone(),
            base: self.base.clone(),
            token: self.token.clone(),
            method: a.method.clone(),
            timeout: Duration::from_secs_f64(a.timeout),
        }
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = &mut self.child
            && let Some(status) = c.try_wait()?
        {
            bail!("server {} exited ({status}); see {}", self.name, self.log.display());
        }
        Ok(())
    }
}

#[derive(Debug, Serialize)]
pub struct ServerInfo {
    pub name: String,
    pub binary: PathBuf,
    pub version: String,
    /// Guessed from the binary's path (target/release, target/debug) when it is not this executable.
    pub profile: String,
    pub binary_bytes: u64,
    pub binary_modified: String,
    /// From spawning `care serve` to its "listening on" line.
    pub startup_s: f64,
    /// `--encoder`: the query encoder this server serves (model@version and graph).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoder: Option<String>,
    /// The first search after the start (loads the encoder and indexes), then the concurrent warm-up searches.
    pub first_search_s: f64,
    pub warm_up_s: f64,
}

/// Runs `bin --config C --data-dir D args…` and returns its stdout; fails with its stderr.
pub(super) fn care(bin: &Path, config: &Path, data_dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("CARE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed ({}):\n{}{}",
            bin.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn version_of(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(super) fn profile_of(bin: &Path) -> String {
    let parts: Vec<String> = bin.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    for p in ["release", "debug"] {
        if parts.iter().any(|c| c == p) {
            return p.into();
        }
    }
    "unknown".into()
}

/// A config that pins everything the benchmark relies on; the rest stays at compiled defaults (and CARE__…
/// environment variables still apply, e.g. CARE__MODEL__THREADS). The default model is the one prepared (or none,
/// so that a BM25-only run stays BM25-only even where the package's model file is installed).
pub(super) fn write_config(path: &Path, data_dir: &Path, e5s1: Option<&Path>) -> Result<()> {
    let mut t = toml::Table::new();
    let mut storage = toml::Table::new();
    storage.insert("data_dir".into(), data_dir.display().to_string().into());
    t.insert("storage".into(), storage.into());
    let none = data_dir.with_extension("no-default-model");
    let mut model = toml::Table::new();
    model.insert("default_model".into(), e5s1.unwrap_or(&none).display().to_string().into());
    t.insert("model".into(), model.into());
    let mut server = toml::Table::new();
    server.insert("bind".into(), "127.0.0.1:0".into());
    server.insert("http_redirect_bind".into(), "".into());
    t.insert("server".into(), server.into());
    std::fs::write(path, toml::to_string(&t)?).with_context(|| format!("writing {}", path.display()))
}

pub(super) fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let ty = entry.file_type()?;
        if ty.is_dir() {
            copy_dir(&from, &to)?;
        } else if ty.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else {
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    Ok(())
}

/// Copies the prepared data directory for one server, gives it an administrator with an API token (made by that
/// server's own binary), and starts `care serve` on a free loopback port.
pub(super) fn start_server(
    name: &str,
    bin: &Path,
    (prepared, encoder): (&Path, Option<&EncoderSpec>),
    e5s1: Option<&Path>,
    work: &Path,
) -> Result<Server> {
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let data_dir = dir.join("data");
    eprintln!("[{name}] copying the prepared data directory to {}", data_dir.display());
    copy_dir(prepared, &data_dir)?;
    let config = dir.join("care.toml");
    write_config(&config, &data_dir, e5s1)?;
    let encoder = encoder.map(|enc| select_encoder(bin, &config, &data_dir, enc)).transpose()?;
    let pw = dir.join("admin-password");
    std::fs::write(&pw, format!("bench-load-{}-{name}\n", std::process::id()))?;
    care(
        bin,
        &config,
        &data_dir,
        &["user", "add", "bench-load", "--role", "admin", "--password-file", &pw.to_string_lossy(), "--permanent"],
    )?;
    let token = care(bin, &config, &data_dir, &["user", "token", "bench-load", "--name", "care-bench --load"])?
        .trim()
        .to_string();
    let log = dir.join("serve.log");
    let started = Instant::now();
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("serve")
        .env("CARE_LOG", std::env::var("CARE_LOG").unwrap_or_else(|_| "warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {} serve", bin.display()))?;
    let stdout = child.stdout.take().context("server stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Keeps reading so the pipe never fills.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let mut server = Server {
        name: name.into(),
        bin: bin.to_path_buf(),
        version: version_of(bin),
        profile: profile_of(bin),
        config,
        log: log.clone(),
        child: Some(child),
        base: String::new(),
        token,
        client: reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .tcp_nodelay(true)
            .build()
            .context("building the HTTPS client")?,
        startup_s: 0.0,
        first_search_s: 0.0,
        warm_up_s: 0.0,
        encoder,
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        server.check_alive()?;
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(url) => {
                server.base = url;
                break;
            }
            Err(_) if Instant::now() < deadline => {}
            Err(_) => bail!("server {name} did not start in 600 s; see {}", log.display()),
        }
    }
    server.startup_s = started.elapsed().as_secs_f64();
    eprintln!("[{name}] {} serving {} (started in {:.1} s)", server.version, server.base, server.startup_s);
    Ok(server)
}

/// A query encoder of `--encoder NAME=SPEC`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum EncoderSpec {
    /// e5-small (prepared as `e5-small@1`, its int8 graph as `e5-small@1-int8`).
    E5(care_engine::Graph),
    /// A query package of e5-small's pairing, imported into the server's copy.
    Package(PathBuf, care_engine::Graph),
}

pub(super) fn parse_encoders(flags: &[String]) -> Result<Vec<(String, EncoderSpec)>> {
    let mut out = Vec::new();
    for (name, spec) in named_flags("--encoder", flags, "--encoder fp32=fp32 --encoder pruned=/tmp/pruned-l4:int8")? {
        let (dir, graph) = match spec.rsplit_once(':') {
            Some((d, g)) => (Some(d), g),
            None => (None, spec.as_str()),
        };
        let graph = care_engine::Graph::parse(graph)
            .with_context(|| format!("--encoder {name}={spec}: the graph must be fp32 or int8"))?;
        let spec = match dir {
            None => EncoderSpec::E5(graph),
            Some(d) => EncoderSpec::Package(
                PathBuf::from(d).canonicalize().with_context(|| format!("--encoder {name}: package {d}"))?,
                graph,
            ),
        };
        out.push((name, spec));
    }
    Ok(out)
}

/// Makes the server's data directory serve `enc` for queries (e5-small@1 keeps the documents); returns what it
/// serves, as `model@version graph`.
pub(super) fn select_encoder(bin: &Path, config: &Path, data_dir: &Path, enc: &EncoderSpec) -> Result<String> {
    use care_engine::Graph;
    let (query, graph) = match enc {
        EncoderSpec::E5(Graph::Fp32) => ("e5-small@1".to_string(), Graph::Fp32),
        EncoderSpec::E5(Graph::Int8) => ("e5-small@1-int8".to_string(), Graph::Int8),
        EncoderSpec::Package(dir, g) => {
            let out = care(bin, config, data_dir, &["model", "import", &dir.to_string_lossy()])?;
            let spec = out
                .lines()
                .find_map(|l| l.strip_prefix("imported ")?.split_whitespace().next().map(str::to_string))
                .context("reading `care model import` output")?;
            (spec, *g)
        }
    };
    let args = ["model", "activate", "--query", &query, "--document", "e5-small@1", "--query-graph", graph.as_str()];
    care(bin, config, data_dir, &args)?;
    Ok(format!("{query} {graph}"))
}

// Preparation

#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Clone)]
pub struct Prepared {
    pub set: PathBuf,
    pub max_docs: Option<usize>,
    pub corpus_documents: usize,
    pub model: Option<String>,
    pub int8_queries: bool,
    pub prepared_with: PathBuf,
    pub prepare_seconds: f64,
    pub stats: serde_json::Value,
}

/// Fills `root/data` with the set's corpus (cut to `max_docs`) and the default model, through the CLI of `bin`;
/// reuses what an earlier run prepared there when it matches.
pub(super) fn prepare(
    bin: &Path,
    root: &Path,
    set: &Path,
    e5s1: Option<&Path>,
    int8: bool,
    max_docs: Option<usize>,
) -> Result<Prepared> {
    let marker = root.join("prepared.json");
    let set = set.canonicalize().with_context(|| format!("set {}", set.display()))?;
    let model = e5s1.map(|p| p.display().to_string());
    if marker.exists() {
        let p: Prepared = serde_json::from_str(&std::fs::read_to_string(&marker)?)
            .with_context(|| format!("reading {}", marker.display()))?;
        if p.set != set || p.max_docs != max_docs || p.model != model || p.int8_queries != int8 {
            bail!(
                "{} was prepared for another set, --max-docs, model or --int8 ({}); use another --prepared folder",
                root.display(),
                marker.display()
            );
        }
        eprintln!("reusing the data directory prepared in {}", root.display());
        return Ok(p);
    }
    let data = root.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).with_context(|| format!("removing the unfinished {}", data.display()))?;
    }
    std::fs::create_dir_all(root)?;
    let started = Instant::now();
    let config = root.join("care.toml");
    write_config(&config, &data, e5s1)?;
    let text = std::fs::read_to_string(set.join("corpus.jsonl"))
        .with_context(|| format!("reading {}", set.join("corpus.jsonl").display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).take(max_docs.unwrap_or(usize::MAX)).collect();
    let corpus = root.join("corpus.jsonl");
    std::fs::write(&corpus, lines.join("\n") + "\n")?;
    care(bin, &config, &data, &["init"])?;
    if let Some(f) = e5s1 {
        eprintln!("importing the default model {} (fp32)", f.display());
        let out = care(bin, &config, &data, &["model", "import-e5s1", &f.to_string_lossy()])?;
        if int8 {
            // The same weights: the int8 query graph shares the fp32 document model's pairing.
            let (name, pairing) = parse_import(&out).context("reading `care model import-e5s1` output")?;
            let f = f.to_string_lossy();
            care(
                bin,
                &config,
                &data,
                &["model", "import-e5s1", &f, "--version", "1-int8", "--pairing-id", &pairing, "--int8"],
            )?;
            care(
                bin,
                &config,
                &data,
                &["model", "activate", "--query", &format!("{name}@1-int8"), "--document", &format!("{name}@1")],
            )?;
        }
    }
    eprintln!("ingesting {} documents of {} (embedding them too; slow in a debug build)", lines.len(), set.display());
    care(bin, &config, &data, &["collection", "create", "bench"])?;
    care(bin, &config, &data, &["ingest", "bench", &corpus.to_string_lossy()])?;
    care(bin, &config, &data, &["reembed"])?;
    let stats = serde_json::from_str(&care(bin, &config, &data, &["stats"])?).unwrap_or(serde_json::Value::Null);
    let p = Prepared {
        set,
        max_docs,
        corpus_documents: lines.len(),
        model,
        int8_queries: int8,
        prepared_with: bin.to_path_buf(),
        prepare_seconds: started.elapsed().as_secs_f64(),
        stats,
    };
    std::fs::write(&marker, serde_json::to_string_pretty(&p)?)?;
    eprintln!("prepared in {:.0} s", p.prepare_seconds);
    Ok(p)
}

/// (model name, pairing id) from "imported NAME@VERSION (pairing ID) into DIR".
pub(super) fn parse_import(out: &str) -> Option<(String, String)> {
    let line = out.lines().find(|l| l.starts_with("imported "))?;
    let name = line.strip_prefix("imported ")?.split('@').next()?.to_string();
    let pairing = line.split("(pairing ").nth(1)?.split(')').next()?.to_string();
    Some((name, pairing))
}

pub(super) fn read_queries(set: &Path) -> Result<Vec<String>> {
    let p = set.join("queries.jsonl");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let mut qs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("a line of {}", p.display()))?;
        if let Some(t) = v.get("text").and_then(|t| t.as_str()).filter(|t| !t.trim().is_empty()) {
            qs.push(t.to_string());
        }
    }
    if qs.is_empty() {
        bail!("{} holds no queries", p.display());
    }
    Ok(qs)
}
