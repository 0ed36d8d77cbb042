//! Named f32 tensors, the currency between readers (E5S1, later the trainer's checkpoints) and writers
//! (ONNX, safetensors).
//!
//! Why a trait: the ONNX and safetensors writers only need "give me the tensor called X", so the trainer can
//! hand them whatever map it holds its fine-tuned weights in without converting to one concrete type.

use std::collections::{BTreeMap, HashMap};

/// An owned, dense, row-major f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Returns `None` when `data.len()` is not the product of `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Option<Self> {
        (shape.iter().product::<usize>() == data.len()).then_some(Self { shape, data })
    }

    pub fn view(&self) -> TensorView<'_> {
        TensorView { shape: &self.shape, data: &self.data }
    }
}

/// A borrowed tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorView<'a> {
    pub shape: &'a [usize],
    pub data: &'a [f32],
}

/// Tensors keyed by Hugging Face parameter name; sorted, so iteration order is deterministic.
pub type TensorMap = BTreeMap<String, Tensor>;

/// Lookup of named tensors by the writers.
pub trait TensorSource {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>>;
    /// All names, sorted (safetensors writes them in this order).
    fn names(&self) -> Vec<String>;
}

impl TensorSource for BTreeMap<String, Tensor> {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.get(name).map(Tensor::view)
    }
    fn names(&self) -> Vec<String> {
        self.keys().cloned().collect()
    }
}

impl<S: std::hash::BuildHasher> TensorSource for HashMap<String, Tensor, S> {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.get(name).map(Tensor::view)
    }
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.keys().cloned().collect();
        names.sort();
        names
    }
}
