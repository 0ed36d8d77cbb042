//! `model.safetensors` writer (F32 only).
//!
//! Why: the trainer (PyTorch via tch) and Hugging Face `transformers` both load safetensors directly, so the
//! package carries the same weights the ONNX graph was built from, under `XLMRobertaModel` names. The format is
//! an 8-byte little-endian header length, a JSON header mapping each name to dtype/shape/`data_offsets`
//! (relative to the end of the header), then the raw little-endian data. Names are written sorted, the header
//! is padded with spaces to an 8-byte boundary (as the reference implementation does), and data is streamed.

use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::tensor::TensorSource;

#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("tensor {name:?}: shape {shape:?} does not match its {len} values")]
    Shape { name: String, shape: Vec<usize>, len: usize },
    #[error("tensor {0:?} listed but not found")]
    Missing(String),
    #[error("writing {path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// An I/O error from the output stream of [`write_to`] (its path is unknown there).
    #[error("writing safetensors data: {0}")]
    Write(#[from] std::io::Error),
}

/// The header JSON (with `__metadata__ {"format": "pt"}`) and the data section length.
pub fn header(tensors: &impl TensorSource) -> Result<(Vec<u8>, u64), SafetensorsError> {
    let mut map = Map::new();
    map.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for name in tensors.names() {
        let t = tensors.tensor(&name).ok_or_else(|| SafetensorsError::Missing(name.clone()))?;
        if t.shape.iter().product::<usize>() != t.data.len() {
            return Err(SafetensorsError::Shape { name, shape: t.shape.to_vec(), len: t.data.len() });
        }
        let end = offset + 4 * t.data.len() as u64;
        map.insert(name, json!({"dtype": "F32", "shape": t.shape, "data_offsets": [offset, end]}));
        offset = end;
    }
    let mut h = serde_json::to_vec(&Value::Object(map)).unwrap_or_default();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    Ok((h, offset))
}

/// Streams the whole file to `w`.
pub fn write_to(tensors: &impl TensorSource, w: &mut impl Write) -> Result<u64, SafetensorsError> {
    let (h, data_len) = header(tensors)?;
    w.write_all(&(h.len() as u64).to_le_bytes())?;
    w.write_all(&h)?;
    let mut buf = Vec::with_capacity(1 << 16);
    for name in tensors.names() {
        let t = tensors.tensor(&name).ok_or_else(|| SafetensorsError::Missing(name.clone()))?;
        for chunk in t.data.chunks(1 << 14) {
            buf.clear();
            buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
            w.write_all(&buf)?;
        }
    }
    Ok(8 + h.len() as u64 + data_len)
}

/// Writes a safetensors file to `path` atomically (temporary sibling, fsync, rename); returns the byte count.
pub fn save(tensors: &impl TensorSource, path: &Path) -> Result<u64, SafetensorsError> {
    let mut n = 0;
    crate::fsutil::write_atomic(path, |w| {
        n = write_to(tensors, w)?;
        Ok::<(), SafetensorsError>(())
    })
    .map_err(|e| {
        if let SafetensorsError::Write(source) = e {
            SafetensorsError::Io { path: path.display().to_string(), source }
        } else {
            e
        }
    })?;
    Ok(n)
}

/// Largest header accepted. Real headers are a few hundred KiB even for models with thousands of tensors; the
/// bound keeps a hostile length from making the check itself allocate gigabytes.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Bytes per element of a safetensors dtype, `None` for a dtype this check does not know.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// What a valid file holds: its tensors' names with their sizes in bytes (by name), and the length of its data
/// section (their sum).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub tensors: Vec<(String, u64)>,
    pub data_bytes: u64,
}

impl Layout {
    /// Bytes of the tensors whose name satisfies `pick`.
    pub fn bytes_where(&self, pick: impl Fn(&str) -> bool) -> u64 {
        self.tensors.iter().filter(|(n, _)| pick(n)).map(|(_, b)| b).sum()
    }
}

/// Checks a safetensors file's header against the file without reading its data: the header length lies within
/// the file (and under [`MAX_HEADER_BYTES`]), the header is a JSON object, and every tensor has a known dtype, a
/// shape, and `data_offsets` inside the data section whose span is exactly dtype × shape; the spans neither
/// overlap nor leave gaps and together cover the data section, as the reference implementation requires. A
/// package declaring 2 GiB of weights over 64 bytes of data is refused here instead of by whatever reads it later.
/// Errors are Chinese sentences for an admin, with the offending tensor's name.
pub fn validate(path: &Path) -> Result<Layout, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| format!("无法读取 (cannot read): {e}"))?;
    let file_len = f.metadata().map_err(|e| format!("无法读取 (cannot read): {e}"))?.len();
    let mut len8 = [0u8; 8];
    f.read_exact(&mut len8)
        .map_err(|_| format!("文件只有 {file_len} 字节，不足 8 字节的头部长度 (shorter than the header length)"))?;
    let header_len = u64::from_le_bytes(len8);
    if header_len > MAX_HEADER_BYTES || header_len > file_len - 8 {
        return Err(format!(
            "头部长度 {header_len} 字节超出文件（共 {file_len} 字节）或上限 {MAX_HEADER_BYTES} 字节 (header length beyond the file)"
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(|e| format!("无法读取头部 (cannot read the header): {e}"))?;
    let data_len = file_len - 8 - header_len;
    let v: Value =
        serde_json::from_slice(&header).map_err(|e| format!("头部不是有效的 JSON (header is not JSON): {e}"))?;
    let Value::Object(map) = v else {
        return Err("头部不是 JSON 对象 (header is not a JSON object)".into());
    };
    let mut spans: Vec<(u64, u64, &str)> = Vec::with_capacity(map.len());
    for (name, t) in &map {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| format!("张量 {name:?}：{what}");
        let dtype = t.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("缺少 dtype (no dtype)"))?;
        let size = dtype_bytes(dtype).ok_or_else(|| bad(&format!("未知的 dtype {dtype:?} (unknown dtype)")))?;
        let shape = t.get("shape").and_then(Value::as_array).ok_or_else(|| bad("缺少 shape (no shape)"))?;
        let mut numel: u64 = 1;
        for d in shape {
            let d = d.as_u64().ok_or_else(|| bad("shape 含非整数 (shape is not a list of integers)"))?;
            numel = numel.checked_mul(d).ok_or_else(|| bad("shape 的元素数溢出 (shape overflows)"))?;
        }
        let bytes = numel.checked_mul(size).ok_or_else(|| bad("数据大小溢出 (size overflows)"))?;
        let offsets = t.get("data_offsets").and_then(Value::as_array).filter(|o| o.len() == 2);
        let (begin, end) = match offsets.map(|o| (o[0].as_u64(), o[1].as_u64())) {
            Some((Some(b), Some(e))) => (b, e),
            _ => return Err(bad("data_offsets 应为两个非负整数 (data_offsets must be two integers)")),
        };
        if begin > end || end > data_len {
            return Err(bad(&format!(
                "data_offsets [{begin}, {end}] 超出数据区（{data_len} 字节）(offsets beyond the data section)"
            )));
        }
        if end - begin != bytes {
            return Err(bad(&format!(
                "data_offsets 跨 {} 字节，而 {dtype} × {shape:?} 需要 {bytes} 字节 (span does not match dtype × shape)",
                end - begin
            )));
        }
        spans.push((begin, end, name));
    }
    spans.sort_unstable();
    let mut at = 0u64;
    for (begin, end, name) in &spans {
        if *begin < at {
            return Err(format!("张量 {name:?} 的数据与前一个张量重叠 (overlapping data_offsets)"));
        }
        if *begin > at {
            return Err(format!("张量 {name:?} 之前有 {} 字节不属于任何张量 (a gap in the data section)", begin - at));
        }
        at = *end;
    }
    if at != data_len {
        return Err(format!(
            "数据区有 {data_len} 字节，张量只占 {at} 字节 (the data section does not match the tensors)"
        ));
    }
    let mut tensors: Vec<(String, u64)> = spans.iter().map(|(b, e, n)| (n.to_string(), e - b)).collect();
    tensors.sort_unstable();
    Ok(Layout { tensors, data_bytes: data_len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorMap};

    /// A file with `header` (padded to 8 bytes) over `data` bytes of zeros.
    fn file(dir: &Path, header: &Value, data: usize) -> std::path::PathBuf {
        let mut h = serde_json::to_vec(header).unwrap();
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.resize(out.len() + data, 0);
        let p = dir.join("model.safetensors");
        std::fs::write(&p, out).unwrap();
        p
    }

    #[test]
    fn written_files_validate_and_hostile_headers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = TensorMap::new();
        m.insert("b".into(), Tensor { shape: vec![2, 3], data: vec![1.0; 6] });
        m.insert("a".into(), Tensor { shape: vec![4], data: vec![-1.0; 4] });
        let p = dir.path().join("model.safetensors");
        save(&m, &p).unwrap();
        let layout = validate(&p).unwrap();
        assert_eq!(layout, Layout { tensors: vec![("a".into(), 16), ("b".into(), 24)], data_bytes: 40 });
        assert_eq!(layout.bytes_where(|n| n != "a"), 24);

        let t = |dtype: &str, shape: Value, offsets: Value| json!({"dtype": dtype, "shape": shape, "data_offsets": offsets});
        let cases: Vec<(&str, Value, usize, &str)> = vec![
            ("2 GiB over 64 bytes", json!({"w": t("F32", json!([1 << 29]), json!([0, 1u64 << 31]))}), 64, "超出数据区"),
            ("span not dtype × shape", json!({"w": t("F32", json!([4]), json!([0, 8]))}), 8, "需要 16 字节"),
            (
                "overlap",
                json!({"a": t("U8", json!([8]), json!([0, 8])), "b": t("U8", json!([8]), json!([4, 12]))}),
                12,
                "重叠",
            ),
            (
                "gap",
                json!({"a": t("U8", json!([4]), json!([0, 4])), "b": t("U8", json!([4]), json!([8, 12]))}),
                12,
                "不属于任何张量",
            ),
            ("trailing data", json!({"a": t("U8", json!([4]), json!([0, 4]))}), 64, "张量只占 4 字节"),
            ("inverted offsets", json!({"a": t("U8", json!([0]), json!([8, 4]))}), 8, "超出数据区"),
            ("shape overflow", json!({"a": t("F64", json!([u64::MAX, 2]), json!([0, 8]))}), 8, "溢出"),
            ("unknown dtype", json!({"a": t("F128", json!([1]), json!([0, 16]))}), 16, "未知的 dtype"),
            ("not an object", json!([1, 2]), 0, "不是 JSON 对象"),
        ];
        for (what, header, data, want) in cases {
            let p = file(dir.path(), &header, data);
            let err = validate(&p).expect_err(what);
            assert!(err.contains(want), "{what}: {err}");
        }
        // A header length beyond the file, and one beyond the bound, are refused before anything is allocated.
        let p = dir.path().join("short.safetensors");
        std::fs::write(&p, [&(1u64 << 40).to_le_bytes()[..], b"{}"].concat()).unwrap();
        assert!(validate(&p).unwrap_err().contains("头部长度"));
        std::fs::write(&p, b"\x01\x02").unwrap();
        assert!(validate(&p).unwrap_err().contains("不足 8 字节"));
    }

    #[test]
    fn layout_matches_the_spec() {
        let mut m = TensorMap::new();
        m.insert("b".into(), Tensor { shape: vec![2], data: vec![1.0, 2.0] });
        m.insert("a".into(), Tensor { shape: vec![1, 1], data: vec![-1.0] });
        let mut out = Vec::new();
        let n = write_to(&m, &mut out).unwrap();
        assert_eq!(n as usize, out.len());
        let hl = u64::from_le_bytes(out[..8].try_into().unwrap()) as usize;
        assert_eq!(hl % 8, 0);
        let h: Value = serde_json::from_slice(&out[8..8 + hl]).unwrap();
        assert_eq!(h["a"]["data_offsets"], json!([0, 4]));
        assert_eq!(h["b"]["data_offsets"], json!([4, 12]));
        assert_eq!(h["b"]["shape"], json!([2]));
        assert_eq!(h["a"]["dtype"], "F32");
        let data = &out[8 + hl..];
        assert_eq!(data.len(), 12);
        assert_eq!(f32::from_le_bytes(data[0..4].try_into().unwrap()), -1.0);
        assert_eq!(f32::from_le_bytes(data[8..12].try_into().unwrap()), 2.0);
    }
}
