//! ONNX model writer and the BERT/XLM-R encoder exporter.
//!
//! Why hand-built: the appliance runs encoders with ONNX Runtime but must not depend on Python or PyTorch to
//! produce the model files, and the trainer needs the same exporter for fine-tuned weights. The ONNX message
//! types used here are encoded with [`crate::protobuf`]; field numbers are those of `onnx/onnx.proto`.
//!
//! The exported graph is the one `torch.onnx.export` produces for `XLMRobertaModel` (opset 17): Gather
//! embeddings, `LayerNormalization`, MatMul+Add projections with pre-transposed `[in, out]` weights,
//! Reshape/Transpose into heads, scaled dot-product with an additive mask, exact GELU written as
//! `x * 0.5 * (1 + Erf(x / √2))`. Keeping to that standard shape lets ORT's optimiser fuse LayerNorm, Gelu and
//! attention as it does for exported Hugging Face models. Weights are stored as raw little-endian initializers
//! and streamed to disk, so a 470 MB model is never held twice in memory.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use crate::config::{BertConfig, PositionIds};
use crate::protobuf::{Msg, len_field_header, len_field_len};
use crate::tensor::{TensorSource, TensorView};

/// `TensorProto.DataType` values.
pub mod data_type {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
}

/// The IR version matching opset 17 (ONNX 1.12).
pub const IR_VERSION: i64 = 8;
pub const OPSET: i64 = 17;

#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("weight {0:?} is missing")]
    MissingWeight(String),
    #[error("weight {name:?} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("writing {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Attribute values used by the exporter.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    Ints(Vec<i64>),
    String(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    pub name: String,
    pub value: AttrValue,
}

impl Attribute {
    pub fn int(name: &str, v: i64) -> Self {
        Self { name: name.into(), value: AttrValue::Int(v) }
    }
    pub fn float(name: &str, v: f32) -> Self {
        Self { name: name.into(), value: AttrValue::Float(v) }
    }
    pub fn ints(name: &str, v: &[i64]) -> Self {
        Self { name: name.into(), value: AttrValue::Ints(v.to_vec()) }
    }

    /// `AttributeProto`: name = 1, f = 2, i = 3, s = 4, ints = 8, type = 20.
    fn encode(&self) -> Msg {
        let mut m = Msg::new();
        m.string(1, &self.name);
        match &self.value {
            AttrValue::Float(f) => {
                m.float(2, *f).int32(20, 1);
            }
            AttrValue::Int(i) => {
                m.int64(3, *i).int32(20, 2);
            }
            AttrValue::String(s) => {
                m.string(4, s).int32(20, 3);
            }
            AttrValue::Ints(v) => {
                for i in v {
                    m.int64(8, *i);
                }
                m.int32(20, 7);
            }
        }
        m
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op_type: String,
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<Attribute>,
    /// Empty for the default ONNX domain; `com.microsoft` for ORT contrib ops.
    pub domain: String,
}

impl Node {
    /// `NodeProto`: input = 1, output = 2, name = 3, op_type = 4, attribute = 5, domain = 7.
    fn encode(&self) -> Msg {
        let mut m = Msg::new();
        for i in &self.inputs {
            m.string(1, i);
        }
        for o in &self.outputs {
            m.string(2, o);
        }
        m.string(3, &self.name).string(4, &self.op_type);
        for a in &self.attributes {
            m.message(5, &a.encode());
        }
        if !self.domain.is_empty() {
            m.string(7, &self.domain);
        }
        m
    }
}

/// Initializer payloads; f32 data may be borrowed from the caller's weights.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData<'a> {
    F32(Cow<'a, [f32]>),
    I64(Vec<i64>),
    I8(Vec<i8>),
    U8(Vec<u8>),
}

impl TensorData<'_> {
    fn data_type(&self) -> i32 {
        match self {
            TensorData::F32(_) => data_type::FLOAT,
            TensorData::I64(_) => data_type::INT64,
            TensorData::I8(_) => data_type::INT8,
            TensorData::U8(_) => data_type::UINT8,
        }
    }

    fn byte_len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len() * 4,
            TensorData::I64(v) => v.len() * 8,
            TensorData::I8(v) => v.len(),
            TensorData::U8(v) => v.len(),
        }
    }

    /// Writes the raw little-endian bytes, converting in chunks.
    fn write_raw(&self, w: &mut impl Write) -> std::io::Result<()> {
        const CHUNK: usize = 16 * 1024;
        match self {
            TensorData::F32(v) => {
                let mut buf = Vec::with_capacity(CHUNK * 4);
                for chunk in v.chunks(CHUNK) {
                    buf.clear();
                    for x in chunk {
                        buf.extend_from_slice(&x.to_le_bytes());
                    }
                    w.write_all(&buf)?;
                }
                Ok(())
            }
            TensorData::I64(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                w.write_all(&bytes)
            }
            TensorData::I8(v) => {
                let bytes: Vec<u8> = v.iter().map(|&x| x as u8).collect();
                w.write_all(&bytes)
            }
            TensorData::U8(v) => w.write_all(v),
        }
    }
}

/// A named constant tensor of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Initializer<'a> {
    pub name: String,
    pub dims: Vec<i64>,
    pub data: TensorData<'a>,
}

impl Initializer<'_> {
    /// `TensorProto` without its raw data: dims = 1, data_type = 2, name = 8 (raw_data = 9 follows).
    fn header(&self) -> Msg {
        let mut m = Msg::new();
        for d in &self.dims {
            m.int64(1, *d);
        }
        m.int32(2, self.data.data_type()).string(8, &self.name);
        m
    }

    fn encoded_len(&self, header: &Msg) -> usize {
        header.len() + len_field_len(9, self.data.byte_len())
    }

    fn write(&self, w: &mut impl Write, header: &Msg) -> std::io::Result<()> {
        w.write_all(header.as_bytes())?;
        w.write_all(&len_field_header(9, self.data.byte_len()))?;
        self.data.write_raw(w)
    }
}

/// A tensor dimension: fixed, or symbolic (dynamic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(i64),
    Param(String),
}

/// A typed graph input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    pub elem_type: i32,
    pub dims: Vec<Dim>,
}

impl ValueInfo {
    /// `ValueInfoProto { name = 1, type = 2 }`, `TypeProto { tensor_type = 1 }`,
    /// `TypeProto.Tensor { elem_type = 1, shape = 2 }`, `TensorShapeProto { dim = 1 }`,
    /// `Dimension { dim_value = 1, dim_param = 2 }`.
    fn encode(&self) -> Msg {
        let mut shape = Msg::new();
        for d in &self.dims {
            let mut dim = Msg::new();
            match d {
                Dim::Fixed(v) => dim.int64(1, *v),
                Dim::Param(p) => dim.string(2, p),
            };
            shape.message(1, &dim);
        }
        let mut tensor = Msg::new();
        tensor.int32(1, self.elem_type).message(2, &shape);
        let mut ty = Msg::new();
        ty.message(1, &tensor);
        let mut m = Msg::new();
        m.string(1, &self.name).message(2, &ty);
        m
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph<'a> {
    pub name: String,
    pub nodes: Vec<Node>,
    pub initializers: Vec<Initializer<'a>>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
}

/// An ONNX model: one graph plus the opsets it imports.
#[derive(Debug, Clone, PartialEq)]
pub struct Model<'a> {
    pub ir_version: i64,
    /// `(domain, version)`; the default domain is `""`.
    pub opsets: Vec<(String, i64)>,
    pub producer_name: String,
    pub producer_version: String,
    pub doc_string: String,
    pub graph: Graph<'a>,
}

impl Model<'_> {
    /// Serialises the `ModelProto` to `w`, streaming initializer data; returns the byte count.
    ///
    /// `ModelProto`: ir_version = 1, producer_name = 2, producer_version = 3, doc_string = 6, graph = 7,
    /// opset_import = 8 (`OperatorSetIdProto { domain = 1, version = 2 }`). `GraphProto`: node = 1, name = 2,
    /// initializer = 5, input = 11, output = 12.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<u64> {
        let mut head = Msg::new();
        head.int64(1, self.ir_version).string(2, &self.producer_name).string(3, &self.producer_version);
        if !self.doc_string.is_empty() {
            head.string(6, &self.doc_string);
        }
        for (domain, version) in &self.opsets {
            let mut op = Msg::new();
            op.string(1, domain).int64(2, *version);
            head.message(8, &op);
        }

        let g = &self.graph;
        let mut small = Msg::new();
        for n in &g.nodes {
            small.message(1, &n.encode());
        }
        small.string(2, &g.name);
        for i in &g.inputs {
            small.message(11, &i.encode());
        }
        for o in &g.outputs {
            small.message(12, &o.encode());
        }
        let headers: Vec<Msg> = g.initializers.iter().map(Initializer::header).collect();
        let graph_len = small.len()
            + g.initializers.iter().zip(&headers).map(|(i, h)| len_field_len(5, i.encoded_len(h))).sum::<usize>();

        w.write_all(head.as_bytes())?;
        w.write_all(&len_field_header(7, graph_len))?;
        w.write_all(small.as_bytes())?;
        for (init, h) in g.initializers.iter().zip(&headers) {
            w.write_all(&len_field_header(5, init.encoded_len(h)))?;
            init.write(w, h)?;
        }
        Ok((head.len() + len_field_len(7, graph_len)) as u64)
    }

    /// Writes the model to `path` atomically (temporary sibling, fsync, rename); returns the byte count.
    pub fn save(&self, path: &Path) -> Result<u64, OnnxError> {
        let mut n = 0;
        crate::fsutil::write_atomic(path, |w| {
            n = self.write_to(w)?;
            Ok::<(), std::io::Error>(())
        })
        .map_err(|source| OnnxError::Io { path: path.display().to_string(), source })?;
        Ok(n)
    }
}

/// Builds graphs with generated, unique value names.
#[derive(Debug, Default)]
pub struct GraphBuilder<'a> {
    graph: Graph<'a>,
    counter: usize,
    /// `DynamicQuantizeLinear` outputs (value, scale, zero point) per input, so the query, key and value
    /// projections of one activation quantise it once, as ONNX Runtime's own dynamic quantisation does.
    quantized: std::collections::HashMap<String, (String, String, String)>,
}

impl<'a> GraphBuilder<'a> {
    pub fn new(name: &str) -> Self {
        Self { graph: Graph { name: name.into(), ..Graph::default() }, counter: 0, quantized: Default::default() }
    }

    pub fn input(&mut self, name: &str, elem_type: i32, dims: Vec<Dim>) -> String {
        self.graph.inputs.push(ValueInfo { name: name.into(), elem_type, dims });
        name.to_string()
    }

    pub fn output(&mut self, name: &str, elem_type: i32, dims: Vec<Dim>) {
        self.graph.outputs.push(ValueInfo { name: name.into(), elem_type, dims });
    }

    pub fn initializer(&mut self, name: &str, dims: Vec<i64>, data: TensorData<'a>) -> String {
        self.graph.initializers.push(Initializer { name: name.into(), dims, data });
        name.to_string()
    }

    /// A scalar (0-d) constant.
    pub fn scalar_f32(&mut self, name: &str, v: f32) -> String {
        self.initializer(name, vec![], TensorData::F32(Cow::Owned(vec![v])))
    }

    pub fn scalar_i64(&mut self, name: &str, v: i64) -> String {
        self.initializer(name, vec![], TensorData::I64(vec![v]))
    }

    pub fn vec_i64(&mut self, name: &str, v: &[i64]) -> String {
        self.initializer(name, vec![v.len() as i64], TensorData::I64(v.to_vec()))
    }

    /// Adds a node with one output named after `hint`, returning that output's name.
    pub fn op(&mut self, op_type: &str, hint: &str, inputs: &[&str], attributes: Vec<Attribute>) -> String {
        let out = self.unique(hint);
        self.op_named(op_type, inputs, &out, attributes);
        out
    }

    /// Adds a node whose single output has exactly the name `output`.
    pub fn op_named(&mut self, op_type: &str, inputs: &[&str], output: &str, attributes: Vec<Attribute>) {
        self.counter += 1;
        self.graph.nodes.push(Node {
            op_type: op_type.into(),
            name: format!("{op_type}_{}", self.counter),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: vec![output.to_string()],
            attributes,
            domain: String::new(),
        });
    }

    /// Adds an arbitrary node (several outputs, other domains).
    pub fn node(&mut self, node: Node) {
        self.counter += 1;
        self.graph.nodes.push(node);
    }

    pub fn unique(&mut self, hint: &str) -> String {
        self.counter += 1;
        format!("{hint}_{}", self.counter)
    }

    pub fn finish(self) -> Graph<'a> {
        self.graph
    }
}

/// How the encoder's projection weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// f32 MatMul weights.
    #[default]
    F32,
    /// Weights quantised to int8 per output column (symmetric); activations quantised dynamically per tensor
    /// (`DynamicQuantizeLinear` + `MatMulInteger`), as ORT's dynamic quantisation does.
    Int8,
}

fn weight<'w>(src: &'w impl TensorSource, name: &str, shape: &[usize]) -> Result<TensorView<'w>, OnnxError> {
    let t = src.tensor(name).ok_or_else(|| OnnxError::MissingWeight(name.to_string()))?;
    if t.shape != shape {
        return Err(OnnxError::ShapeMismatch { name: name.into(), expected: shape.to_vec(), found: t.shape.to_vec() });
    }
    Ok(t)
}

/// `[out, in]` row-major -> `[in, out]` row-major.
fn transpose(w: &[f32], out: usize, inp: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for o in 0..out {
        for i in 0..inp {
            t[i * out + o] = w[o * inp + i];
        }
    }
    t
}

fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// Builds the encoder graph over Hugging Face-named weights (`embeddings.word_embeddings.weight`,
/// `encoder.layer.{l}.attention.self.query.weight`, ... with PyTorch `[out, in]` Linear weights).
///
/// Inputs `input_ids`, `attention_mask` (int64 `[batch, sequence]`); output `last_hidden_state`
/// (float `[batch, sequence, hidden]`).
pub fn build_bert_model<'w>(
    cfg: &BertConfig,
    weights: &'w impl TensorSource,
    format: WeightFormat,
) -> Result<Model<'w>, OnnxError> {
    let (h, ff, nh) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads);
    if h == 0 || nh == 0 || h % nh != 0 {
        return Err(OnnxError::InvalidConfig(format!("hidden size {h} is not a positive multiple of {nh} heads")));
    }
    let hd = cfg.head_dim();
    let mut g = GraphBuilder::new("encoder");
    let batch_seq = || vec![Dim::Param("batch".into()), Dim::Param("sequence".into())];
    let ids = g.input("input_ids", data_type::INT64, batch_seq());
    let mask = g.input("attention_mask", data_type::INT64, batch_seq());

    // --- embeddings -------------------------------------------------------------------------------------
    let borrowed = |name: &str, shape: &[usize]| -> Result<TensorData<'w>, OnnxError> {
        Ok(TensorData::F32(Cow::Borrowed(weight(weights, name, shape)?.data)))
    };
    let word_name = "embeddings.word_embeddings.weight";
    let word = g.initializer(word_name, dims(&[cfg.vocab_size, h]), borrowed(word_name, &[cfg.vocab_size, h])?);
    let pos_name = "embeddings.position_embeddings.weight";
    let pos_table = g.initializer(
        pos_name,
        dims(&[cfg.max_position_embeddings, h]),
        borrowed(pos_name, &[cfg.max_position_embeddings, h])?,
    );
    let type_name = "embeddings.token_type_embeddings.weight";
    let type_table =
        g.initializer(type_name, dims(&[cfg.type_vocab_size, h]), borrowed(type_name, &[cfg.type_vocab_size, h])?);

    let words = g.op("Gather", "word_embeds", &[&word, &ids], vec![Attribute::int("axis", 0)]);
    let positions = match cfg.position_ids {
        PositionIds::XlmRoberta { padding_idx } => {
            // cumsum(mask) * mask + padding_idx: first real token -> padding_idx + 1, padding -> padding_idx.
            let axis1 = g.scalar_i64("const_axis_1", 1);
            let cs = g.op("CumSum", "mask_cumsum", &[&mask, &axis1], vec![]);
            let masked = g.op("Mul", "mask_cumsum_masked", &[&cs, &mask], vec![]);
            let pad = g.scalar_i64("const_padding_idx", padding_idx);
            g.op("Add", "position_ids", &[&masked, &pad], vec![])
        }
        PositionIds::Bert => {
            let shape = g.op("Shape", "input_shape", &[&ids], vec![]);
            let one = g.scalar_i64("const_one_i64", 1);
            let zero = g.scalar_i64("const_zero_i64", 0);
            let seq = g.op("Gather", "seq_len", &[&shape, &one], vec![Attribute::int("axis", 0)]);
            g.op("Range", "position_ids", &[&zero, &seq, &one], vec![])
        }
    };
    let pos = g.op("Gather", "position_embeds", &[&pos_table, &positions], vec![Attribute::int("axis", 0)]);
    let type0 = g.scalar_i64("const_token_type_0", 0);
    let ttype = g.op("Gather", "token_type_embed", &[&type_table, &type0], vec![Attribute::int("axis", 0)]);
    let sum1 = g.op("Add", "embeds_word_pos", &[&words, &pos], vec![]);
    let sum2 = g.op("Add", "embeds", &[&sum1, &ttype], vec![]);
    let mut x = layer_norm(&mut g, weights, cfg, "embeddings.LayerNorm", &sum2, None)?;

    // --- additive attention mask [batch, 1, 1, seq]: 0 where attended, f32::MIN where masked ---------------
    let axes12 = g.vec_i64("const_axes_1_2", &[1, 2]);
    let m4 = g.op("Unsqueeze", "mask_4d", &[&mask, &axes12], vec![]);
    let mf = g.op("Cast", "mask_float", &[&m4], vec![Attribute::int("to", i64::from(data_type::FLOAT))]);
    let one_f = g.scalar_f32("const_one_f32", 1.0);
    let inv = g.op("Sub", "mask_inverted", &[&one_f, &mf], vec![]);
    let neg = g.scalar_f32("const_mask_min", f32::MIN);
    let bias = g.op("Mul", "mask_bias", &[&inv, &neg], vec![]);

    let heads_shape = g.vec_i64("const_heads_shape", &[0, 0, nh as i64, hd as i64]);
    let merge_shape = g.vec_i64("const_merge_shape", &[0, 0, h as i64]);
    let scale = g.scalar_f32("const_sqrt_head_dim", (hd as f32).sqrt());
    let sqrt2 = g.scalar_f32("const_sqrt2", std::f32::consts::SQRT_2);
    let half = g.scalar_f32("const_half", 0.5);

    for l in 0..cfg.num_hidden_layers {
        let p = format!("encoder.layer.{l}");
        let q = linear(&mut g, weights, format, &format!("{p}.attention.self.query"), &x, h, h)?;
        let k = linear(&mut g, weights, format, &format!("{p}.attention.self.key"), &x, h, h)?;
        let v = linear(&mut g, weights, format, &format!("{p}.attention.self.value"), &x, h, h)?;
        let q4 = g.op("Reshape", "q_heads", &[&q, &heads_shape], vec![]);
        let k4 = g.op("Reshape", "k_heads", &[&k, &heads_shape], vec![]);
        let v4 = g.op("Reshape", "v_heads", &[&v, &heads_shape], vec![]);
        let qt = g.op("Transpose", "q_t", &[&q4], vec![Attribute::ints("perm", &[0, 2, 1, 3])]);
        let kt = g.op("Transpose", "k_t", &[&k4], vec![Attribute::ints("perm", &[0, 2, 3, 1])]);
        let vt = g.op("Transpose", "v_t", &[&v4], vec![Attribute::ints("perm", &[0, 2, 1, 3])]);
        let scores = g.op("MatMul", "scores", &[&qt, &kt], vec![]);
        let scaled = g.op("Div", "scores_scaled", &[&scores, &scale], vec![]);
        let masked = g.op("Add", "scores_masked", &[&scaled, &bias], vec![]);
        let probs = g.op("Softmax", "attn_probs", &[&masked], vec![Attribute::int("axis", -1)]);
        let ctx = g.op("MatMul", "context", &[&probs, &vt], vec![]);
        let ctx_t = g.op("Transpose", "context_t", &[&ctx], vec![Attribute::ints("perm", &[0, 2, 1, 3])]);
        let ctx3 = g.op("Reshape", "context_merged", &[&ctx_t, &merge_shape], vec![]);
        let attn_out = linear(&mut g, weights, format, &format!("{p}.attention.output.dense"), &ctx3, h, h)?;
        let res1 = g.op("Add", "attn_residual", &[&attn_out, &x], vec![]);
        x = layer_norm(&mut g, weights, cfg, &format!("{p}.attention.output.LayerNorm"), &res1, None)?;

        let inter = linear(&mut g, weights, format, &format!("{p}.intermediate.dense"), &x, h, ff)?;
        let div = g.op("Div", "gelu_div", &[&inter, &sqrt2], vec![]);
        let erf = g.op("Erf", "gelu_erf", &[&div], vec![]);
        let one_plus = g.op("Add", "gelu_add", &[&erf, &one_f], vec![]);
        let prod = g.op("Mul", "gelu_mul", &[&inter, &one_plus], vec![]);
        let gelu = g.op("Mul", "gelu", &[&prod, &half], vec![]);
        let out = linear(&mut g, weights, format, &format!("{p}.output.dense"), &gelu, ff, h)?;
        let res2 = g.op("Add", "ffn_residual", &[&out, &x], vec![]);
        let last = l + 1 == cfg.num_hidden_layers;
        x = layer_norm(
            &mut g,
            weights,
            cfg,
            &format!("{p}.output.LayerNorm"),
            &res2,
            last.then_some("last_hidden_state"),
        )?;
    }
    if cfg.num_hidden_layers == 0 {
        g.op_named("Identity", &[&x], "last_hidden_state", vec![]);
    }
    g.output(
        "last_hidden_state",
        data_type::FLOAT,
        vec![Dim::Param("batch".into()), Dim::Param("sequence".into()), Dim::Fixed(h as i64)],
    );

    Ok(Model {
        ir_version: IR_VERSION,
        opsets: vec![(String::new(), OPSET)],
        producer_name: "care-modelio".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: String::new(),
        graph: g.finish(),
    })
}

fn layer_norm<'w>(
    g: &mut GraphBuilder<'w>,
    weights: &'w impl TensorSource,
    cfg: &BertConfig,
    prefix: &str,
    x: &str,
    output: Option<&str>,
) -> Result<String, OnnxError> {
    let h = cfg.hidden_size;
    let wn = format!("{prefix}.weight");
    let bn = format!("{prefix}.bias");
    let w = g.initializer(&wn, dims(&[h]), TensorData::F32(Cow::Borrowed(weight(weights, &wn, &[h])?.data)));
    let b = g.initializer(&bn, dims(&[h]), TensorData::F32(Cow::Borrowed(weight(weights, &bn, &[h])?.data)));
    let attrs = vec![Attribute::int("axis", -1), Attribute::float("epsilon", cfg.layer_norm_eps)];
    Ok(match output {
        Some(name) => {
            g.op_named("LayerNormalization", &[x, &w, &b], name, attrs);
            name.to_string()
        }
        None => g.op("LayerNormalization", "layer_norm", &[x, &w, &b], attrs),
    })
}

/// `x @ W^T + b` for a PyTorch Linear named `prefix` with weight `[out, in]`.
fn linear<'w>(
    g: &mut GraphBuilder<'w>,
    weights: &'w impl TensorSource,
    format: WeightFormat,
    prefix: &str,
    x: &str,
    inp: usize,
    out: usize,
) -> Result<String, OnnxError> {
    let wn = format!("{prefix}.weight");
    let bn = format!("{prefix}.bias");
    let w = weight(weights, &wn, &[out, inp])?;
    let wt = transpose(w.data, out, inp);
    let b = g.initializer(&bn, dims(&[out]), TensorData::F32(Cow::Borrowed(weight(weights, &bn, &[out])?.data)));
    let y = match format {
        WeightFormat::F32 => {
            let w = g.initializer(&format!("{wn}.transposed"), dims(&[inp, out]), TensorData::F32(Cow::Owned(wt)));
            g.op("MatMul", "matmul", &[x, &w], vec![])
        }
        WeightFormat::Int8 => quantized_matmul(g, &wn, x, &wt, inp, out),
    };
    Ok(g.op("Add", "linear", &[&y, &b], vec![]))
}

/// Dynamic-quantised `x @ Wt` with `Wt` `[in, out]`: int8 weights with one symmetric scale per output column,
/// uint8 activations with a per-tensor scale/zero point from `DynamicQuantizeLinear`.
fn quantized_matmul<'w>(g: &mut GraphBuilder<'w>, wn: &str, x: &str, wt: &[f32], inp: usize, out: usize) -> String {
    let mut scales = vec![0.0f32; out];
    for row in wt.chunks_exact(out) {
        for (s, &v) in scales.iter_mut().zip(row) {
            *s = s.max(v.abs());
        }
    }
    for s in &mut scales {
        *s = if *s > 0.0 { *s / 127.0 } else { 1.0 };
    }
    let q: Vec<i8> = wt
        .chunks_exact(out)
        .flat_map(|row| row.iter().zip(&scales).map(|(&v, &s)| (v / s).round().clamp(-127.0, 127.0) as i8))
        .collect();
    let wq = g.initializer(&format!("{wn}.quantized"), dims(&[inp, out]), TensorData::I8(q));
    let ws = g.initializer(&format!("{wn}.scale"), dims(&[out]), TensorData::F32(Cow::Owned(scales)));
    // Symmetric weights: one scalar zero point (0) serves every column; the per-column scales apply after the GEMM.
    let wz = g.initializer(&format!("{wn}.zero_point"), dims(&[]), TensorData::I8(vec![0]));
    let (xq, xs, xz) = quantize_once(g, x);
    let acc = g.op("MatMulInteger", "matmul_int32", &[&xq, &wq, &xz, &wz], vec![]);
    let accf = g.op("Cast", "matmul_int32_f", &[&acc], vec![Attribute::int("to", i64::from(data_type::FLOAT))]);
    let scale = g.op("Mul", "matmul_scale", &[&xs, &ws], vec![]);
    g.op("Mul", "matmul_dequant", &[&accf, &scale], vec![])
}

/// The uint8 form of activation `x` (value, scale, zero point), made by one `DynamicQuantizeLinear` however many
/// projections read it.
fn quantize_once(g: &mut GraphBuilder<'_>, x: &str) -> (String, String, String) {
    if let Some(done) = g.quantized.get(x) {
        return done.clone();
    }
    let xq = g.unique("x_quantized");
    let xs = g.unique("x_scale");
    let xz = g.unique("x_zero_point");
    let name = g.unique("DynamicQuantizeLinear");
    g.node(Node {
        op_type: "DynamicQuantizeLinear".into(),
        name,
        inputs: vec![x.to_string()],
        outputs: vec![xq.clone(), xs.clone(), xz.clone()],
        attributes: vec![],
        domain: String::new(),
    });
    let done = (xq, xs, xz);
    g.quantized.insert(x.to_string(), done.clone());
    done
}

/// Exports the encoder as an ONNX file at `path` (f32 weights).
pub fn export_bert(cfg: &BertConfig, weights: &impl TensorSource, path: &Path) -> Result<u64, OnnxError> {
    build_bert_model(cfg, weights, WeightFormat::F32)?.save(path)
}

/// Exports the encoder with dynamically quantised int8 projection weights.
pub fn export_bert_int8(cfg: &BertConfig, weights: &impl TensorSource, path: &Path) -> Result<u64, OnnxError> {
    build_bert_model(cfg, weights, WeightFormat::Int8)?.save(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorMap};

    #[test]
    fn value_info_and_attributes_encode_to_hand_computed_bytes() {
        let vi = ValueInfo {
            name: "x".into(),
            elem_type: data_type::INT64,
            dims: vec![Dim::Param("b".into()), Dim::Fixed(3)],
        };
        // dims: {2:"b"} = 12 01 62 ; {1:3} = 08 03 ; shape = 0a 03 12 01 62 0a 02 08 03
        // tensor = 08 07 12 09 <shape> ; type = 0a 0d <tensor> ; vi = 0a 01 78 12 0f <type>
        let expected = [
            0x0a, 0x01, b'x', 0x12, 0x0f, 0x0a, 0x0d, 0x08, 0x07, 0x12, 0x09, 0x0a, 0x03, 0x12, 0x01, b'b', 0x0a, 0x02,
            0x08, 0x03,
        ];
        assert_eq!(vi.encode().as_bytes(), expected);

        // name "axis" (0a 04 61 78 69 73), i = -1 (18 ff.. 01), type INT (a0 01 02)
        let a = Attribute::int("axis", -1).encode();
        let mut expected = vec![0x0a, 0x04, b'a', b'x', b'i', b's', 0x18];
        expected.extend_from_slice(&[0xff; 9]);
        expected.extend_from_slice(&[0x01, 0xa0, 0x01, 0x02]);
        assert_eq!(a.as_bytes(), expected.as_slice());

        let a = Attribute::ints("perm", &[0, 2]).encode();
        assert_eq!(a.as_bytes(), [0x0a, 0x04, b'p', b'e', b'r', b'm', 0x40, 0x00, 0x40, 0x02, 0xa0, 0x01, 0x07]);
    }

    #[test]
    fn initializer_streams_the_same_bytes_as_a_buffered_message() {
        let init = Initializer { name: "w".into(), dims: vec![2], data: TensorData::F32(Cow::Owned(vec![1.0, -2.0])) };
        let h = init.header();
        let mut streamed = Vec::new();
        init.write(&mut streamed, &h).unwrap();
        let mut m = Msg::new();
        m.int64(1, 2).int32(2, data_type::FLOAT).string(8, "w");
        let raw: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        m.bytes(9, &raw);
        assert_eq!(streamed, m.as_bytes());
        assert_eq!(init.encoded_len(&h), streamed.len());
    }

    fn tiny_weights(cfg: &BertConfig) -> TensorMap {
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let mut m = TensorMap::new();
        let mut put = |name: String, shape: Vec<usize>| {
            let n: usize = shape.iter().product();
            let data = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0).collect();
            m.insert(name, Tensor { shape, data });
        };
        put("embeddings.word_embeddings.weight".into(), vec![cfg.vocab_size, h]);
        put("embeddings.position_embeddings.weight".into(), vec![cfg.max_position_embeddings, h]);
        put("embeddings.token_type_embeddings.weight".into(), vec![cfg.type_vocab_size, h]);
        put("embeddings.LayerNorm.weight".into(), vec![h]);
        put("embeddings.LayerNorm.bias".into(), vec![h]);
        for l in 0..cfg.num_hidden_layers {
            for (m_, o, i) in [
                ("attention.self.query", h, h),
                ("attention.self.key", h, h),
                ("attention.self.value", h, h),
                ("attention.output.dense", h, h),
                ("intermediate.dense", ff, h),
                ("output.dense", h, ff),
            ] {
                put(format!("encoder.layer.{l}.{m_}.weight"), vec![o, i]);
                put(format!("encoder.layer.{l}.{m_}.bias"), vec![o]);
            }
            for ln in ["attention.output.LayerNorm", "output.LayerNorm"] {
                put(format!("encoder.layer.{l}.{ln}.weight"), vec![h]);
                put(format!("encoder.layer.{l}.{ln}.bias"), vec![h]);
            }
        }
        m
    }

    fn tiny_cfg() -> BertConfig {
        BertConfig {
            vocab_size: 11,
            hidden_size: 8,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 16,
            max_position_embeddings: 10,
            type_vocab_size: 1,
            layer_norm_eps: 1e-12,
            pad_token_id: 1,
            bos_token_id: 0,
            eos_token_id: 2,
            position_ids: PositionIds::XlmRoberta { padding_idx: 1 },
        }
    }

    #[test]
    fn tiny_encoder_graph_is_well_formed() {
        let cfg = tiny_cfg();
        let w = tiny_weights(&cfg);
        let model = build_bert_model(&cfg, &w, WeightFormat::F32).unwrap();
        let g = &model.graph;
        // Every node input is a graph input, an initializer or an earlier node's output.
        let mut known: std::collections::HashSet<String> = g.inputs.iter().map(|i| i.name.clone()).collect();
        known.extend(g.initializers.iter().map(|i| i.name.clone()));
        for n in &g.nodes {
            for i in &n.inputs {
                assert!(known.contains(i), "{} reads undefined {i}", n.name);
            }
            for o in &n.outputs {
                assert!(known.insert(o.clone()), "{o} defined twice");
            }
        }
        assert!(known.contains("last_hidden_state"));
        let mut bytes = Vec::new();
        let n = model.write_to(&mut bytes).unwrap();
        assert_eq!(n as usize, bytes.len());

        let mut missing = w.clone();
        missing.remove("encoder.layer.1.output.dense.bias");
        assert!(
            matches!(build_bert_model(&cfg, &missing, WeightFormat::F32), Err(OnnxError::MissingWeight(n)) if n.contains("layer.1.output.dense.bias"))
        );
        let bert = BertConfig { position_ids: PositionIds::Bert, ..cfg };
        assert!(build_bert_model(&bert, &w, WeightFormat::Int8).is_ok());
    }
}
