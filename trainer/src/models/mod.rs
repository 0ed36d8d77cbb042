//! Model code, candle-style: a serde config mirroring `config.json`, one struct per block, `forward_t`.

pub mod attention;
pub mod bert;
pub mod linear;
pub mod qwen3;

pub use attention::Attention;
pub use bert::{Bert, BertConfig};
pub use qwen3::{Qwen3, Qwen3Config};
