//! A PyTorch `Linear` (`weight [out, in]`, optional `bias`) with an optional LoRA adapter.
//!
//! LoRA (Hu et al.): `y = x Wᵀ + b + (α / r) · (x Aᵀ) Bᵀ` with `A [r, in]` random and `B [out, r]` zero, so a
//! freshly added adapter changes nothing. Merging folds `(α / r) · B A` into `W` for export; the merged model
//! is an ordinary checkpoint the ONNX exporter and `transformers` read.

use tch::{Device, Kind, Tensor};

use crate::Result;
use crate::weights::Weights;

#[derive(Debug)]
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

#[derive(Debug)]
pub struct Linear {
    pub name: String,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub lora: Option<Lora>,
}

impl Linear {
    pub fn load(w: &Weights, name: &str, inp: i64, out: i64, bias: bool) -> Result<Self> {
        let weight = w.get(&format!("{name}.weight"), &[out, inp])?;
        let bias = if bias { Some(w.get(&format!("{name}.bias"), &[out])?) } else { None };
        Ok(Self { name: name.to_string(), weight, bias, lora: None })
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.matmul(&self.weight.tr());
        let y = match &self.bias {
            Some(b) => y + b,
            None => y,
        };
        match &self.lora {
            // The adapters stay fp32 (they are what trains) over a possibly bf16 base; under autocast the matmuls
            // cast anyway, without it the branch runs in the input's type.
            Some(l) => {
                let (a, b) = (l.a.to_kind(x.kind()), l.b.to_kind(x.kind()));
                y + x.matmul(&a.tr()).matmul(&b.tr()) * l.scale
            }
            None => y,
        }
    }

    /// Adds a rank-`r` adapter, registering `{name}.lora_A.weight` / `{name}.lora_B.weight` in `w`. The adapter is
    /// fp32 whatever the base's type: a frozen bf16 base halves the memory of an LLM encoder, while bf16 adapters
    /// would lose the small updates AdamW makes to them (PEFT's `autocast_adapter_dtype` does the same).
    /// `b_std > 0` starts B random instead of zero (tests use it to make the adapter matter).
    pub fn add_lora(&mut self, w: &mut Weights, rank: i64, alpha: f64, b_std: f64) {
        let (out, inp) = (self.weight.size()[0], self.weight.size()[1]);
        let device = self.weight.device();
        // Kaiming-uniform bound for A as in PEFT (a = √5 → bound = 1/√in).
        let bound = 1.0 / (inp as f64).sqrt();
        let a = (Tensor::rand([rank, inp], (Kind::Float, device)) * 2.0 - 1.0) * bound;
        let b = if b_std > 0.0 {
            Tensor::randn([out, rank], (Kind::Float, device)) * b_std
        } else {
            Tensor::zeros([out, rank], (Kind::Float, device))
        };
        w.insert(format!("{}.lora_A.weight", self.name), a.shallow_clone());
        w.insert(format!("{}.lora_B.weight", self.name), b.shallow_clone());
        self.lora = Some(Lora { a, b, scale: alpha / rank as f64 });
    }

    /// Folds the adapter into the weight (in place, so every holder of the weight sees it) and drops it.
    pub fn merge_lora(&mut self, w: &mut Weights) {
        if let Some(l) = self.lora.take() {
            tch::no_grad(|| {
                let _ = self.weight.g_add_(&lora_delta(&l.a, &l.b, l.scale));
            });
            w.remove(&format!("{}.lora_A.weight", self.name));
            w.remove(&format!("{}.lora_B.weight", self.name));
        }
    }

    pub fn device(&self) -> Device {
        self.weight.device()
    }
}

/// What an adapter adds to its weight, `scale · B A` (`A [r, in]`, `B [out, r]`): folded in here when a model
/// merges its adapters, and by `carry::carry_in` over adapters brought back alone.
pub fn lora_delta(a: &Tensor, b: &Tensor, scale: f64) -> Tensor {
    b.matmul(a) * scale
}

/// Layer norm over the last dimension with weight and bias.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Tensor {
    x.layer_norm([w.size()[0]], Some(w), Some(b), eps, true)
}

/// RMSNorm as in Qwen: computed in f32, scaled by the weight, cast back.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let xf = x.to_kind(Kind::Float);
    let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
    let normed = xf * (var + eps).rsqrt();
    w * normed.to_kind(kind)
}
