//! Scaled dot-product attention for both model families: libtorch's fused kernel by default, the eager
//! `softmax(q kᵀ · scale + bias) v` kept as the reference the fused path is tested against.
//!
//! Why fused: eager attention materialises `[B, H, L, L]` scores and probabilities for the backward pass, which
//! dominates the activation memory of a long-document Stage II step and costs two extra kernels per layer.
//! `scaled_dot_product_attention` picks flash or memory-efficient kernels on CUDA (PyTorch's SDPA, the same
//! kernels `transformers` uses with `attn_implementation="sdpa"`) and a fused CPU kernel otherwise.
//!
//! The mask stays additive and finite (the caller's `bias`): a left-padded row sees only masked keys, and a
//! boolean mask turns such a row into NaN on some kernels, while a finite bias makes it a harmless average, as
//! the eager path does. Grouped-query attention: with no padding and a causal mask the kernel takes K/V with
//! fewer heads itself (`enable_gqa`); with a mask the memory-efficient kernel does not, so K/V heads are repeated
//! first, as `transformers` does.

use tch::{Kind, Tensor};

/// Which attention implementation a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Attention {
    /// libtorch's `scaled_dot_product_attention`.
    #[default]
    Sdpa,
    /// Explicit matmul + softmax (the reference).
    Eager,
}

/// The mask of one attention call.
#[derive(Debug)]
pub enum Mask<'a> {
    /// An additive bias broadcastable to `[B, H, L, L]` (0 = keep, a large finite negative = masked).
    Bias(&'a Tensor),
    /// Causal with no padding: no tensor needed, and the kernel may use flash attention.
    Causal,
    /// Every key visible (a batch without padding in a bidirectional encoder).
    None,
}

/// `q [B, H, L, D]`, `k`/`v [B, Hkv, L, D]` (H a multiple of Hkv) → `[B, H, L, D]`.
pub fn attend(imp: Attention, q: &Tensor, k: &Tensor, v: &Tensor, mask: Mask<'_>, dropout: f64, train: bool) -> Tensor {
    let (h, hkv, hd) = (q.size()[1], k.size()[1], q.size()[3]);
    let scale = 1.0 / (hd as f64).sqrt();
    let p = if train { dropout } else { 0.0 };
    match (imp, mask) {
        (Attention::Sdpa, Mask::Causal) => {
            Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, p, true, scale, h != hkv)
        }
        (Attention::Sdpa, Mask::None) => {
            Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, p, false, scale, h != hkv)
        }
        (Attention::Sdpa, Mask::Bias(bias)) => {
            let (k, v) = repeat_kv(k, v, h / hkv);
            Tensor::scaled_dot_product_attention(q, &k, &v, Some(bias.to_kind(q.kind())), p, false, scale, false)
        }
        (Attention::Eager, mask) => {
            let (k, v) = repeat_kv(k, v, h / hkv);
            let scores = q.matmul(&k.transpose(-1, -2)) * scale;
            let scores = match mask {
                Mask::Bias(bias) => scores + bias,
                Mask::None => scores,
                Mask::Causal => {
                    let l = q.size()[2];
                    let keep = Tensor::ones([l, l], (Kind::Bool, q.device())).tril(0);
                    scores.masked_fill(&keep.logical_not(), f64::NEG_INFINITY)
                }
            };
            let kind = q.kind();
            scores.softmax(-1, Kind::Float).to_kind(kind).dropout(p, train).matmul(&v)
        }
    }
}

fn repeat_kv(k: &Tensor, v: &Tensor, rep: i64) -> (Tensor, Tensor) {
    if rep == 1 {
        return (k.shallow_clone(), v.shallow_clone());
    }
    (k.repeat_interleave_self_int(rep, Some(1), None), v.repeat_interleave_self_int(rep, Some(1), None))
}
