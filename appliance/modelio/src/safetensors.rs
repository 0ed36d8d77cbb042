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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorMap};

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
