//! CARE's losses.
//!
//! - [`info_nce`]: in-batch contrastive loss with hard negatives. `q [B, H]`, `d [B·G, H]` where rows
//!   `i·G .. i·G+G` are query i's positive followed by its G−1 hard negatives; every other query's group serves
//!   as in-batch negatives. Scores are cosine / temperature.
//! - [`asymmetric_info_nce`]: the same with the query from the query encoder and documents from the document
//!   encoder, document vectors truncated (Matryoshka) to the query width.
//! - [`mse_alignment`]: squared distance between the two encoders' normalised embeddings of the same text.
//! - [`matryoshka`]: any of the above averaged over truncation widths.

use tch::{Kind, Tensor};

use crate::pooling::{normalize, truncate};

/// Contrastive loss; `q` and `d` need not be normalised (they are here).
pub fn info_nce(q: &Tensor, d: &Tensor, temperature: f64, group_size: i64) -> Tensor {
    let q = normalize(q);
    let d = normalize(d);
    let b = q.size()[0];
    let scores = q.matmul(&d.tr()) / temperature;
    let target = Tensor::arange(b, (Kind::Int64, q.device())) * group_size;
    // Not `cross_entropy_for_logits`: it computes in f32 whatever the input kind, and the gradient checks run
    // in f64.
    -scores.log_softmax(1, scores.kind()).gather(1, &target.unsqueeze(1), false).mean(scores.kind())
}

/// Query-encoder queries against document-encoder documents truncated to the query width.
pub fn asymmetric_info_nce(q: &Tensor, d: &Tensor, temperature: f64, group_size: i64) -> Tensor {
    let w = q.size()[1];
    info_nce(q, &truncate(d, w), temperature, group_size)
}

/// Squared distance between normalised embeddings of the same texts (document side truncated to the query
/// width), summed over the vector and averaged over the batch: 2(1 − cos) for unit vectors, whatever the width, so
/// weight 1 is the paper's balance for a 384-wide e5 and a 1024-wide Qwen3 alike. (Mean over elements, as
/// `torch.nn.functional.mse_loss` does, would shrink the term by the width.)
pub fn mse_alignment(q: &Tensor, d: &Tensor) -> Tensor {
    let w = q.size()[1];
    (normalize(q) - truncate(d, w)).square().sum_dim_intlist(-1, false, None::<Kind>).mean(None::<Kind>)
}

/// Averages `loss(q[:, :w], d[:, :w])` over `widths` (each clipped to the vectors' widths).
pub fn matryoshka(q: &Tensor, d: &Tensor, widths: &[i64], loss: impl Fn(&Tensor, &Tensor) -> Tensor) -> Tensor {
    let hq = q.size()[1];
    let hd = d.size()[1];
    let mut total: Option<Tensor> = None;
    let mut n = 0;
    for &w in widths {
        let (wq, wd) = (w.min(hq), w.min(hd));
        let l = loss(&q.narrow(1, 0, wq), &d.narrow(1, 0, wd));
        total = Some(match total {
            Some(t) => t + l,
            None => l,
        });
        n += 1;
    }
    total.map_or_else(|| loss(q, d), |t| t / f64::from(n))
}
