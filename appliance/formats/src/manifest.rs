//! `manifest.toml` of a model package folder.
//!
//! A package folder holds `manifest.toml`, `tokenizer.json`, `model.onnx`, optionally `model_int8.onnx` (the same
//! query encoder with int8 projection weights, [`Graph::Int8`]) and `config.json` + `model.safetensors` (for
//! further training). The manifest records a sha256 per file so a corrupted or
//! half-copied package is refused at load time instead of serving wrong vectors.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest format this build reads and writes. Newer manifests are refused, older ones upgraded on read.
pub const MANIFEST_FORMAT: u32 = 1;
pub const MANIFEST_FILE: &str = "manifest.toml";

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid model manifest: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "{path} has manifest format {found}, newer than this build understands ({MANIFEST_FORMAT}); upgrade the appliance"
    )]
    TooNew { path: PathBuf, found: u32 },
    #[error("{path}: file {file} is listed in the manifest but missing")]
    MissingFile { path: PathBuf, file: String },
    /// The file's own hash is not shown: a package could otherwise point a name at any file the importer can read
    /// and learn its hash from the message.
    #[error("{path}: file {file} does not have the sha256 the manifest lists; the package is corrupt or was edited")]
    HashMismatch { path: PathBuf, file: String, expected: String, actual: String },
    /// A listed file that is a symbolic link, a folder or a device: packages hold plain files only.
    #[error("{path}: {file} is not a regular file (links are not followed); copy the package's files themselves")]
    NotRegularFile { path: PathBuf, file: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelRole {
    Query,
    Document,
    Both,
}

impl ModelRole {
    pub fn encodes_queries(self) -> bool {
        matches!(self, ModelRole::Query | ModelRole::Both)
    }
    pub fn encodes_documents(self) -> bool {
        matches!(self, ModelRole::Document | ModelRole::Both)
    }
}

/// The ONNX graphs of one encoder a package can carry. Documents are always encoded by the fp32 graph; queries by
/// the one the evaluation gate chose for the model (the int8 graph when it is faster and within its nDCG margin).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Graph {
    #[default]
    Fp32,
    /// Dynamically quantised int8 projection weights (f32 activations): about 3× faster to encode a query on
    /// CPUs with int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, Arm dot product).
    Int8,
}

impl Graph {
    pub const ALL: [Graph; 2] = [Graph::Fp32, Graph::Int8];

    /// The graph's file in a package folder.
    pub fn file(self) -> &'static str {
        match self {
            Graph::Fp32 => "model.onnx",
            Graph::Int8 => "model_int8.onnx",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Graph::Fp32 => "fp32",
            Graph::Int8 => "int8",
        }
    }

    /// `fp32` or `int8` (as stored in the registry); None for anything else.
    pub fn parse(s: &str) -> Option<Graph> {
        Graph::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

impl std::fmt::Display for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pooling {
    Cls,
    Mean,
    /// Last non-padding token; the tokenizer pads on the left so the last position is always real.
    LastToken,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelManifest {
    pub format: u32,
    pub name: String,
    pub version: String,
    pub role: ModelRole,
    /// e.g. "xlm-roberta", "bert", "qwen3".
    pub architecture: String,
    pub pooling: Pooling,
    /// Output width after Matryoshka truncation; the dense index stores vectors of this width.
    pub width: usize,
    /// Width the network produces before truncation.
    pub hidden: usize,
    pub max_length: usize,
    #[serde(default)]
    pub normalize: bool,
    /// Prompt templates with `{text}` (and optionally `{instruction}`) placeholders.
    pub query_template: String,
    pub document_template: String,
    #[serde(default)]
    pub instruction: String,
    /// Query and document encoders trained together share this id; a dense index built by a document encoder
    /// is only ever queried with a query encoder carrying the same id.
    pub pairing_id: String,
    /// file name → sha256 (hex)
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Free-form provenance: where the weights came from, training run, metrics.
    #[serde(default)]
    pub provenance: BTreeMap<String, String>,
}

impl ModelManifest {
    /// Renders a prompt for a query or a document.
    pub fn render(&self, template: &str, text: &str) -> String {
        template.replace("{instruction}", &self.instruction).replace("{text}", text)
    }

    pub fn render_query(&self, text: &str) -> String {
        self.render(&self.query_template, text)
    }

    pub fn render_document(&self, text: &str) -> String {
        self.render(&self.document_template, text)
    }

    /// Reads and validates `dir/manifest.toml` without hashing the files (see [`ModelManifest::verify_files`]).
    pub fn load(dir: &Path) -> Result<Self, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Io { path: path.clone(), source })?;
        Self::parse(&text, &path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ManifestError> {
        #[derive(Deserialize)]
        struct Probe {
            format: Option<u32>,
        }
        let probe: Probe = toml::from_str(text)
            .map_err(|e| ManifestError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        let found = probe.format.unwrap_or(0);
        if found > MANIFEST_FORMAT {
            return Err(ManifestError::TooNew { path: path.to_path_buf(), found });
        }
        let m: ModelManifest = toml::from_str(text)
            .map_err(|e| ManifestError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        m.validate(path)?;
        Ok(m)
    }

    fn validate(&self, path: &Path) -> Result<(), ManifestError> {
        let invalid = |message: String| ManifestError::Invalid { path: path.to_path_buf(), message };
        if self.width == 0 || self.width > self.hidden {
            return Err(invalid(format!("width {} must be between 1 and hidden {}", self.width, self.hidden)));
        }
        if self.max_length < 2 {
            return Err(invalid(format!("max_length {} is too small", self.max_length)));
        }
        for (name, t) in [("query_template", &self.query_template), ("document_template", &self.document_template)] {
            if !t.contains("{text}") {
                return Err(invalid(format!("{name} {t:?} has no {{text}} placeholder")));
            }
        }
        if self.pairing_id.trim().is_empty() {
            return Err(invalid("pairing_id is empty".into()));
        }
        Ok(())
    }

    /// Writes the manifest atomically (temp file + rename) after hashing the listed files.
    pub fn write(&mut self, dir: &Path, files: &[&str]) -> Result<(), ManifestError> {
        self.format = MANIFEST_FORMAT;
        self.files.clear();
        for f in files {
            let p = dir.join(f);
            let h = sha256_file(&p).map_err(|source| ManifestError::Io { path: p.clone(), source })?;
            self.files.insert((*f).to_string(), h);
        }
        let path = dir.join(MANIFEST_FILE);
        let text = toml::to_string_pretty(self)
            .map_err(|e| ManifestError::Parse { path: path.clone(), message: e.to_string() })?;
        let tmp = dir.join(".manifest.toml.tmp");
        std::fs::write(&tmp, text).map_err(|source| ManifestError::Io { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, &path).map_err(|source| ManifestError::Io { path, source })
    }

    /// Checks every listed file against its recorded sha256.
    pub fn verify_files(&self, dir: &Path) -> Result<(), ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        for (file, expected) in &self.files {
            let p = dir.join(file);
            match std::fs::symlink_metadata(&p) {
                Err(_) => return Err(ManifestError::MissingFile { path: path.clone(), file: file.clone() }),
                Ok(md) if !md.file_type().is_file() => {
                    return Err(ManifestError::NotRegularFile { path: path.clone(), file: file.clone() });
                }
                Ok(_) => {}
            }
            let actual = sha256_file(&p).map_err(|source| ManifestError::Io { path: p.clone(), source })?;
            if &actual != expected {
                return Err(ManifestError::HashMismatch {
                    path: path.clone(),
                    file: file.clone(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        Ok(())
    }
}

pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ModelManifest {
        ModelManifest {
            format: MANIFEST_FORMAT,
            name: "e5-small".into(),
            version: "1".into(),
            role: ModelRole::Both,
            architecture: "xlm-roberta".into(),
            pooling: Pooling::Mean,
            width: 384,
            hidden: 384,
            max_length: 512,
            normalize: true,
            query_template: "query: {text}".into(),
            document_template: "passage: {text}".into(),
            instruction: String::new(),
            pairing_id: "e5-small-v1".into(),
            files: BTreeMap::new(),
            provenance: BTreeMap::new(),
        }
    }

    #[test]
    fn roundtrip_and_hash_check() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.onnx"), b"weights").unwrap();
        let mut m = sample();
        m.write(dir.path(), &["model.onnx"]).unwrap();
        let back = ModelManifest::load(dir.path()).unwrap();
        assert_eq!(back, m);
        back.verify_files(dir.path()).unwrap();
        std::fs::write(dir.path().join("model.onnx"), b"tampered").unwrap();
        let err = back.verify_files(dir.path()).unwrap_err();
        assert!(matches!(err, ManifestError::HashMismatch { .. }));
        let ManifestError::HashMismatch { actual, .. } = &err else { unreachable!() };
        assert!(!err.to_string().contains(actual.as_str()), "the file's own hash is never shown: {err}");
    }

    #[cfg(unix)]
    #[test]
    fn listed_files_that_are_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"secret").unwrap();
        let file = "model.safetensors".to_string();
        std::os::unix::fs::symlink(&target, dir.path().join(&file)).unwrap();
        m.files.insert(file.clone(), sha256_file(&target).unwrap());
        // Even with the right hash, a link is not imported.
        assert!(matches!(m.verify_files(dir.path()), Err(ManifestError::NotRegularFile { .. })));
    }

    #[test]
    fn refuses_newer_format_and_bad_templates() {
        let p = Path::new("x/manifest.toml");
        let mut m = sample();
        m.format = MANIFEST_FORMAT + 1;
        let text = toml::to_string(&m).unwrap();
        assert!(matches!(ModelManifest::parse(&text, p), Err(ManifestError::TooNew { .. })));
        let mut m = sample();
        m.query_template = "query: ".into();
        let err = ModelManifest::parse(&toml::to_string(&m).unwrap(), p).unwrap_err();
        assert!(err.to_string().contains("no {text} placeholder"), "{err}");
    }

    #[test]
    fn renders_care_instruction_template() {
        let mut m = sample();
        m.query_template = "<instruct>{instruction}\n<query>{text}".into();
        m.instruction = "Given a Chinese medical question, retrieve medical documents that answer the question.".into();
        assert_eq!(
            m.render_query("二甲双胍的禁忌症"),
            "<instruct>Given a Chinese medical question, retrieve medical documents that answer the question.\n<query>二甲双胍的禁忌症"
        );
    }
}
