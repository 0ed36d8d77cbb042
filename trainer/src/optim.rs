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

/// AdamW over flat buffers: the parameters with gradients at the first update, grouped by device and type, are
/// re-pointed (`set_data`) into one contiguous buffer per group, and so are their gradients and moments. An
/// update is then a dozen whole-buffer kernels instead of a dozen per tensor (`torch.optim.AdamW(foreach=True)`'s
/// point, which tch cannot call): a Stage II step of Qwen3 with LoRA has ~400 adapter tensors, so the per-tensor
/// loop launched ~6,000 kernels. The arithmetic per element is unchanged, so updates equal the per-tensor ones
/// (the global norm for clipping is summed in another order: equal within rounding).
///
/// `params`, `m` and `v` stay name → tensor maps (views into the buffers once grouped), so checkpoints write and
/// read them by name as before.
#[derive(Debug)]
pub struct AdamW {
    pub cfg: AdamWConfig,
    /// Trainable parameters by name (sorted, so state order is deterministic).
    pub params: BTreeMap<String, Tensor>,
    pub m: BTreeMap<String, Tensor>,
    pub v: BTreeMap<String, Tensor>,
    pub step: u64,
    groups: Vec<Group>,
    /// Parameters outside every group (no gradient at the first update): updated one by one when they have one.
    loose: Vec<String>,
    grouped: bool,
}

/// One flat buffer per role; `spans[i]` is `(name, offset, numel)` in all four.
#[derive(Debug)]
struct Group {
    p: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
    spans: Vec<(String, i64, i64)>,
}

impl AdamW {
    pub fn new(cfg: AdamWConfig, params: BTreeMap<String, Tensor>) -> Self {
        let m = params.iter().map(|(n, p)| (n.clone(), p.zeros_like().to_kind(Kind::Float))).collect();
        let v = params.iter().map(|(n, p)| (n.clone(), p.zeros_like().to_kind(Kind::Float))).collect();
        Self { cfg, params, m, v, step: 0, groups: Vec::new(), loose: Vec::new(), grouped: false }
    }

    pub fn zero_grad(&mut self) {
        for g in &mut self.groups {
            let _ = g.g.zero_();
        }
        for name in &self.loose {
            if let Some(p) = self.params.get_mut(name) {
                p.zero_grad();
            }
        }
        if !self.grouped {
            for p in self.params.values_mut() {
                p.zero_grad();
            }
        }
    }

    /// Forms the groups at the first update (gradients exist then) and, later, re-attaches a gradient that
    /// libtorch replaced (an undefined gradient is created anew by the next backward).
    fn ensure_grouped(&mut self) {
        if !self.grouped {
            self.group();
            self.grouped = true;
        }
        for g in &self.groups {
            for (name, off, n) in &g.spans {
                let mut grad = self.params[name].grad();
                let view = g.g.narrow(0, *off, *n);
                if !grad.defined() {
                    continue;
                }
                if grad.data_ptr() != view.data_ptr() {
                    let mut view = view.view(grad.size().as_slice());
                    tch::no_grad(|| view.copy_(&grad));
                    grad.set_data(&view);
                }
            }
        }
    }

    fn group(&mut self) {
        let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, p) in &self.params {
            if p.grad().defined() {
                by_key.entry(format!("{:?}/{:?}", p.device(), p.kind())).or_default().push(name.clone());
            } else {
                self.loose.push(name.clone());
            }
        }
        for names in by_key.into_values() {
            let first = &self.params[&names[0]];
            let (device, kind) = (first.device(), first.kind());
            let total: i64 = names.iter().map(|n| self.params[n].numel() as i64).sum();
            let mut grp = Group {
                p: Tensor::empty([total], (kind, device)),
                g: Tensor::zeros([total], (kind, device)),
                m: Tensor::empty([total], (Kind::Float, device)),
                v: Tensor::empty([total], (Kind::Float, device)),
                spans: Vec::with_capacity(names.len()),
            };
            let mut off = 0;
            tch::no_grad(|| {
                for name in names {
                    let p = self.params.get_mut(&name).expect("grouped from params");
                    let (n, shape) = (p.numel() as i64, p.size());
                    let at = |flat: &Tensor| flat.narrow(0, off, n).view(shape.as_slice());
                    let (mut pv, mut gv, mut mv, mut vv) = (at(&grp.p), at(&grp.g), at(&grp.m), at(&grp.v));
                    pv.copy_(p);
                    let mut grad = p.grad();
                    gv.copy_(&grad);
                    mv.copy_(&self.m[&name]);
                    vv.copy_(&self.v[&name]);
                    p.set_data(&pv);
                    grad.set_data(&gv);
                    self.m.insert(name.clone(), mv);
                    self.v.insert(name.clone(), vv);
                    grp.spans.push((name, off, n));
                    off += n;
                }
            });
            self.groups.push(grp);
        }
    }

    /// Scales gradients so their global L2 norm is at most `max_norm`; returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        self.ensure_grouped();
        let mut norms: Vec<Tensor> =
            self.groups.iter().map(|g| g.g.to_kind(Kind::Float).norm().pow_tensor_scalar(2)).collect();
        norms.extend(self.loose.iter().filter_map(|n| {
            let g = self.params[n].grad();
            g.defined().then(|| g.to_kind(Kind::Float).norm().pow_tensor_scalar(2))
        }));
        if norms.is_empty() {
            return 0.0;
        }
        let device = norms[0].device();
        let total = Tensor::stack(&norms.iter().map(|t| t.to_device(device)).collect::<Vec<_>>(), 0)
            .sum(Kind::Float)
            .sqrt()
            .double_value(&[]);
        if max_norm > 0.0 && total > max_norm {
            let coef = max_norm / (total + 1e-6);
            tch::no_grad(|| {
                for g in &mut self.groups {
                    let _ = g.g.g_mul_scalar_(coef);
                }
                for n in &self.loose {
                    let mut g = self.params[n].grad();
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
        self.ensure_grouped();
        self.step += 1;
        let t = self.step as i32;
        let c = self.cfg;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        tch::no_grad(|| {
            for g in &mut self.groups {
                adamw_update(&c, lr, bc1, bc2, &mut g.p.shallow_clone(), &g.g, &mut g.m, &mut g.v);
            }
            for name in &self.loose {
                let grad = self.params[name].grad();
                if !grad.defined() {
                    continue;
                }
                let mut p = self.params[name].shallow_clone();
                let m = self.m.get_mut(name).expect("state for every param");
                let v = self.v.get_mut(name).expect("state for every param");
                adamw_update(&c, lr, bc1, bc2, &mut p, &grad, m, v);
            }
        });
    }
}

/// `torch.optim.AdamW`'s update of one tensor (or one flat buffer), in place.
#[allow(clippy::too_many_arguments)]
fn adamw_update(
    c: &AdamWConfig,
    lr: f64,
    bc1: f64,
    bc2: f64,
    p: &mut Tensor,
    g: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
) {
    let g = g.to_kind(Kind::Float);
    let _ = m.g_mul_scalar_(c.beta1).g_add_(&(&g * (1.0 - c.beta1)));
    let _ = v.g_mul_scalar_(c.beta2).g_add_(&(&g * &g * (1.0 - c.beta2)));
    if c.weight_decay > 0.0 {
        let _ = p.g_mul_scalar_(1.0 - lr * c.weight_decay);
    }
    let denom = (&*v / bc2).sqrt() + c.eps;
    let update = (&*m / bc1) / denom * lr;
    let _ = p.g_sub_(&update.to_kind(p.kind()));
}
