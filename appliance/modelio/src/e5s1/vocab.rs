//! The model cut down to the vocabulary a run's texts use (issue 57).
//!
//! e5-small's word embedding holds 250,037 rows: 54 MB of its 72 MB file, while a hospital's four retrieval sets
//! use about 11k pieces. A copy that keeps only those rows is the same encoder on those texts, and small enough to
//! travel where the full file cannot (the GPU test machine takes 64 MiB per run). The rows are gathered as stored
//! (a Q4_0 row of 384 values is 12 whole blocks), so nothing is quantised again.

use std::collections::BTreeSet;

use super::{E5s1Error, E5s1File, E5s1Tokenizer, Encoding, MAGIC, Q4_0_BLOCK, Q4_0_BLOCK_BYTES, Result};

/// The ids a pruned tokenizer must keep to segment a run's texts as the full one does: the pieces `used` (the ids
/// the full tokenizer gave those texts), the four special pieces, and the lowest-scored piece, ascending (so the
/// special ids 0–3 keep their numbers).
///
/// Why the lowest-scored piece: the Unigram model scores an unknown character at its lowest piece's score minus
/// 10. With that piece kept, every segmentation of the run's texts scores as before; the best one uses only kept
/// pieces, and the pruned vocabulary offers none the full one lacked, so it stays the best.
pub fn kept_ids(tok: &E5s1Tokenizer, used: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let n = tok.pieces.len() as u32;
    let lowest = tok.scores.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32);
    let mut kept: BTreeSet<u32> = used.into_iter().filter(|&i| i < n).collect();
    kept.extend([tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id]);
    kept.extend(lowest);
    kept.into_iter().collect()
}

/// Little-endian writers for the file's fields.
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: usize) {
        self.0.extend_from_slice(&(v as i32).to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

impl E5s1File {
    /// This model as an E5S1 file whose tokenizer and word embedding hold only the pieces `kept` (ascending ids of
    /// this file's tokenizer, with the special pieces, e.g. from [`kept_ids`]): piece `kept[i]` becomes id `i`.
    /// Every other tensor is copied byte for byte.
    pub fn pruned(&self, kept: &[u32]) -> Result<Vec<u8>> {
        let (h, t) = (&self.header, &self.tokenizer);
        let invalid = |reason: String| E5s1Error::InvalidTokenizer { offset: 0, reason };
        if kept.windows(2).any(|w| w[0] >= w[1]) || kept.last().is_some_and(|&l| l as usize >= t.pieces.len()) {
            return Err(invalid(format!("kept ids must ascend within 0..{}", t.pieces.len())));
        }
        let new_id = |id: u32| {
            kept.binary_search(&id).map_err(|_| invalid(format!("special piece {id} is not among the kept ids")))
        };
        let mut o = Out(Vec::new());
        o.0.extend_from_slice(MAGIC);
        o.u32(h.version);
        for v in [h.hidden_size, h.num_layers, h.num_heads, h.intermediate_size, kept.len()] {
            o.i32(v);
        }
        o.i32(h.max_positions);
        o.i32(h.type_vocab_size);
        o.f32(h.layer_norm_eps);
        o.i32(h.quant_block);
        // Tokenizer: the kept pieces, renumbered.
        o.i32(kept.len());
        for id in [t.bos_id, t.eos_id, t.pad_id, t.unk_id] {
            o.i32(new_id(id)?);
        }
        let pieces: Vec<&str> = kept.iter().map(|&i| t.pieces[i as usize].as_str()).collect();
        o.u64(pieces.iter().map(|p| p.len() as u64).sum());
        let mut at = 0u32;
        o.u32(at);
        for p in &pieces {
            at += p.len() as u32;
            o.u32(at);
        }
        for &i in kept {
            o.f32(t.scores[i as usize]);
        }
        for p in &pieces {
            o.0.extend_from_slice(p.as_bytes());
        }
        // The normaliser as parsed.
        let mut map = Out(Vec::new());
        for (from, to) in &t.normalizer {
            map.u32(u32::from(*from));
            map.u8(to.chars().count() as u8);
            for c in to.chars() {
                map.u32(u32::from(c));
            }
        }
        o.i32(t.normalizer.len());
        o.u32(map.0.len() as u32);
        o.0.extend_from_slice(&map.0);
        // Tensors: the word embedding's kept rows as stored; the rest as they are.
        let data: Vec<(&super::TensorEntry, Vec<u8>, u64)> = self
            .tensors
            .iter()
            .map(|e| {
                let raw = &self.bytes[e.data_offset as usize..(e.data_offset + e.byte_len) as usize];
                if e.name != "emb.word" {
                    return (e, raw.to_vec(), e.shape.iter().product::<usize>() as u64);
                }
                let row = match e.encoding {
                    Encoding::F32 => h.hidden_size * 4,
                    Encoding::Q4_0 => h.hidden_size / Q4_0_BLOCK * Q4_0_BLOCK_BYTES,
                };
                let rows: Vec<u8> =
                    kept.iter().flat_map(|&i| &raw[i as usize * row..(i as usize + 1) * row]).copied().collect();
                (e, rows, (kept.len() * h.hidden_size) as u64)
            })
            .collect();
        let directory: usize = 4 + data.iter().map(|(e, _, _)| 2 + e.name.len() + 1 + 4 + 8 + 8).sum::<usize>();
        let mut offset = (o.0.len() + directory) as u64;
        o.i32(data.len());
        for (e, bytes, elements) in &data {
            o.u16(e.name.len() as u16);
            o.0.extend_from_slice(e.name.as_bytes());
            o.u8(e.dtype_code);
            o.u32(*elements as u32);
            o.u64(offset);
            o.u64(bytes.len() as u64);
            offset += bytes.len() as u64;
        }
        for (_, bytes, _) in &data {
            o.0.extend_from_slice(bytes);
        }
        Ok(o.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pruned file parses, its tokenizer holds the kept pieces in order with their scores and renumbered special
    /// ids, its word embedding the kept rows exactly, and every other tensor is unchanged.
    #[test]
    fn a_pruned_file_keeps_the_kept_rows_and_everything_else() {
        let full = E5s1File::from_bytes(super::super::tests::tiny_file(|_| {})).unwrap();
        let kept = kept_ids(full.tokenizer(), [5]);
        // The specials 0–3, the piece used (5), the lowest-scored piece (5 too, at −2).
        assert_eq!(kept, [0, 1, 2, 3, 5]);
        let pruned = E5s1File::from_bytes(full.pruned(&kept).unwrap()).unwrap();
        let (a, b) = (full.tokenizer(), pruned.tokenizer());
        assert_eq!(b.pieces, ["<s>", "<pad>", "</s>", "<unk>", "b"]);
        assert_eq!(b.scores, [0.0, 0.0, 0.0, 0.0, -2.0]);
        assert_eq!((b.bos_id, b.eos_id, b.pad_id, b.unk_id), (a.bos_id, a.eos_id, a.pad_id, a.unk_id));
        assert_eq!(b.normalizer, a.normalizer);
        assert_eq!(pruned.header().vocab_size, 5);
        let (w, v) = (full.tensor("emb.word").unwrap(), pruned.tensor("emb.word").unwrap());
        let h = full.header().hidden_size;
        for (new, &old) in kept.iter().enumerate() {
            let old = old as usize;
            assert_eq!(v.data[new * h..(new + 1) * h], w.data[old * h..(old + 1) * h], "row {old}");
        }
        for e in full.tensors().iter().filter(|e| e.name != "emb.word") {
            assert_eq!(full.tensor(&e.name).unwrap().data, pruned.tensor(&e.name).unwrap().data, "{}", e.name);
        }
        assert!(full.pruned(&[0, 1, 2, 5]).is_err(), "the unknown piece (3) must be kept");
        assert!(full.pruned(&[0, 1, 2, 3, 5, 4]).is_err(), "ids must ascend");
    }
}
