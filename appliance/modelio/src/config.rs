//! The encoder hyper-parameters shared by the ONNX exporter and `config.json`.
//!
//! Why one struct for BERT and XLM-R: the two encoders are the same network; they differ only in how position
//! ids are formed (XLM-R offsets them past `padding_idx`, BERT counts from 0) and in the names on the config.
//! The trainer fills the same struct for fine-tuned checkpoints, so the exporter stays architecture-generic.

use serde_json::{Value, json};

/// How position ids are derived from the inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionIds {
    /// XLM-RoBERTa / RoBERTa: `cumsum(mask) * mask + padding_idx`, so the first real token gets
    /// `padding_idx + 1` and padding tokens get `padding_idx` (a zero row).
    XlmRoberta { padding_idx: i64 },
    /// BERT: `0..seq_len` for every row.
    Bert,
}

/// Encoder configuration (the subset of Hugging Face's `BertConfig` / `XLMRobertaConfig` that shapes the graph).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    /// Rows of `embeddings.position_embeddings.weight` (514 for XLM-R: 512 usable + 2 reserved).
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
    pub pad_token_id: u32,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub position_ids: PositionIds,
}

impl BertConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Longest input the position table supports.
    pub fn max_sequence_length(&self) -> usize {
        match self.position_ids {
            PositionIds::XlmRoberta { padding_idx } => {
                self.max_position_embeddings.saturating_sub(usize::try_from(padding_idx + 1).unwrap_or(0))
            }
            PositionIds::Bert => self.max_position_embeddings,
        }
    }

    /// `config.json` as Hugging Face `transformers` writes it for `XLMRobertaModel` (or `BertModel`).
    pub fn to_hf_config_json(&self) -> Value {
        let (architecture, model_type) = match self.position_ids {
            PositionIds::XlmRoberta { .. } => ("XLMRobertaModel", "xlm-roberta"),
            PositionIds::Bert => ("BertModel", "bert"),
        };
        json!({
            "architectures": [architecture],
            "attention_probs_dropout_prob": 0.1,
            "bos_token_id": self.bos_token_id,
            "classifier_dropout": null,
            "eos_token_id": self.eos_token_id,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "layer_norm_eps": f32_to_json(self.layer_norm_eps),
            "max_position_embeddings": self.max_position_embeddings,
            "model_type": model_type,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "pad_token_id": self.pad_token_id,
            "position_embedding_type": "absolute",
            "torch_dtype": "float32",
            "type_vocab_size": self.type_vocab_size,
            "use_cache": true,
            "vocab_size": self.vocab_size,
        })
    }
}

/// The shortest decimal that round-trips the f32 (`1e-12`, not `9.999999960041972e-13`).
fn f32_to_json(v: f32) -> Value {
    let shortest: f64 = v.to_string().parse().unwrap_or(f64::from(v));
    json!(shortest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_is_written_as_the_shortest_f32_decimal() {
        assert_eq!(f32_to_json(1e-12).as_f64(), Some(1e-12));
        assert_eq!(f32_to_json(1e-12).to_string(), "1e-12");
        assert_eq!(f32_to_json(1e-5).as_f64(), Some(1e-5));
    }
}
