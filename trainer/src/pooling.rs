//! Hidden states → sentence vectors: CLS, mean over the mask, last real token; Matryoshka truncation.

use care_formats::Pooling;
use tch::{Kind, Tensor};

/// `hidden [b, l, h]`, `mask [b, l]` (0/1) → `[b, h]`.
pub fn pool(hidden: &Tensor, mask: &Tensor, pooling: Pooling) -> Tensor {
    match pooling {
        Pooling::Cls => hidden.select(1, 0),
        Pooling::Mean => {
            let m = mask.to_kind(hidden.kind()).unsqueeze(-1);
            (hidden * &m).sum_dim_intlist(1, false, hidden.kind())
                / m.sum_dim_intlist(1, false, hidden.kind()).clamp_min(1e-9)
        }
        Pooling::LastToken => {
            // Index of the last 1 in each row: works for left padding (always l-1) and right padding.
            let l = mask.size()[1];
            let pos = Tensor::arange(l, (Kind::Int64, mask.device())).unsqueeze(0) * mask.to_kind(Kind::Int64);
            let last = pos.argmax(1, false);
            let h = hidden.size()[2];
            hidden.gather(1, &last.view([-1, 1, 1]).expand([-1, 1, h], false), false).squeeze_dim(1)
        }
    }
}

/// L2 normalisation over the last dimension.
pub fn normalize(x: &Tensor) -> Tensor {
    x / x.norm_scalaropt_dim(2, [-1], true).clamp_min(1e-12)
}

/// Matryoshka: the first `width` dimensions, re-normalised.
pub fn truncate(x: &Tensor, width: i64) -> Tensor {
    let h = x.size()[x.dim() - 1];
    if width >= h { normalize(x) } else { normalize(&x.narrow(-1, 0, width)) }
}
