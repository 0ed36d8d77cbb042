//! AdamW (decoupled weight decay, as `torch.optim.AdamW`), a warmup + linear-decay schedule, and gradient
//! clipping by global norm.
//!
//! Why not `tch::nn::Optimizer`: its moment buffers live inside libtorch where they cannot be saved, and exact
//! resume needs them. Here the state is plain named tensors that a checkpoint writes and reads back bit for bit.

use std::collections::BTreeMap;

use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// Linear warmup over `warmup` steps to the peak, then linear decay to zero at `total` steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub warmup: u64,
    pub total: u64,
}

impl Schedule {
    /// Multiplier for the learning rate of (1-based) step `step`.
    pub fn factor(&self, step: u64) -> f64 {
        if step <= self.warmup && self.warmup > 0 {
            return step as f64 / self.warmup as f64;
        }
        let rest = self.total.saturating_sub(self.warmup).max(1);
        (self.total.saturating_sub(step) as f64 / rest as f64).max(0.0)
    }
}

#[derive(Debug)]
pub struct AdamW {
    pub cfg: AdamWConfig,
    /// Trainable parameters by name (sorted, so state order is deterministic).
    pub params: BTreeMap<String, Tensor>,
    pub m: BTreeMap<String, Tensor>,
    pub v: BTreeMap<String, Tensor>,
    pub step: u64,
}

impl AdamW {
    pub fn new(cfg: AdamWConfig, params: BTreeMap<String, Tensor>) -> Self {
        let m = params.iter().map(|(n, p)| (n.clone(), p.zeros_like().to_kind(Kind::Float))).collect();
        let v = params.iter().map(|(n, p)| (n.clone(), p.zeros_like().to_kind(Kind::Float))).collect();
        Self { cfg, params, m, v, step: 0 }
    }

    pub fn zero_grad(&mut self) {
        for p in self.params.values_mut() {
            p.zero_grad();
        }
    }

    /// Scales gradients so their global L2 norm is at most `max_norm`; returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        let norms: Vec<Tensor> = self
            .params
            .values()
            .filter_map(|p| {
                let g = p.grad();
                g.defined().then(|| g.to_kind(Kind::Float).norm().pow_tensor_scalar(2))
            })
            .collect();
        if norms.is_empty() {
            return 0.0;
        }
        let total = Tensor::stack(&norms, 0).sum(Kind::Float).sqrt().double_value(&[]);
        if max_norm > 0.0 && total > max_norm {
            let coef = max_norm / (total + 1e-6);
            tch::no_grad(|| {
                for p in self.params.values() {
                    let mut g = p.grad();
                    if g.defined() {
                        let _ = g.g_mul_scalar_(coef);
                    }
                }
            });
        }
        total
    }

    /// One update with learning rate `lr` (the schedule is applied by the caller).
    pub fn step(&mut self, lr: f64) {
        self.step += 1;
        let AdamWConfig { beta1, beta2, eps, weight_decay, .. } = self.cfg;
        let t = self.step as i32;
        let bc1 = 1.0 - beta1.powi(t);
        let bc2 = 1.0 - beta2.powi(t);
        tch::no_grad(|| {
            for (name, p) in &self.params {
                let g = p.grad();
                if !g.defined() {
                    continue;
                }
                let g = g.to_kind(Kind::Float);
                let mut p = p.shallow_clone();
                let m = self.m.get_mut(name).expect("state for every param");
                let _ = m.g_mul_scalar_(beta1).g_add_(&(&g * (1.0 - beta1)));
                let v = self.v.get_mut(name).expect("state for every param");
                let _ = v.g_mul_scalar_(beta2).g_add_(&(&g * &g * (1.0 - beta2)));
                if weight_decay > 0.0 {
                    let _ = p.g_mul_scalar_(1.0 - lr * weight_decay);
                }
                let denom = (&*v / bc2).sqrt() + eps;
                let update = (&*m / bc1) / denom * lr;
                let _ = p.g_sub_(&update.to_kind(p.kind()));
            }
        });
    }
}
