//! A minimal protobuf wire-format encoder.
//!
//! Why hand-written: ONNX files are serialised `onnx.ModelProto` messages, and all the appliance ever does is
//! *write* a handful of message types (model, graph, node, attribute, tensor, value info). Pulling in prost plus
//! a protoc build step for that would add a code generator and a native tool to every build of the server; the
//! wire format needed here is four rules (varint, length-delimited, fixed32, field keys) and fits on a page.
//!
//! Messages are built bottom-up into [`Msg`] byte buffers. Very large payloads (multi-hundred-megabyte weight
//! tensors) are never copied into a `Msg`: callers compute their encoded length with [`len_field_len`] and
//! stream them after writing a [`len_field_header`], which is what `onnx::Model::write_to` does.

/// Wire type 0: varint (int32, int64, uint64, bool, enum).
pub const WIRE_VARINT: u8 = 0;
/// Wire type 2: length-delimited (string, bytes, embedded message, packed repeated).
pub const WIRE_LEN: u8 = 2;
/// Wire type 5: 32-bit little-endian (float, fixed32).
pub const WIRE_FIXED32: u8 = 5;

/// Number of bytes `v` takes as a base-128 varint.
pub fn varint_len(v: u64) -> usize {
    // 7 payload bits per byte; 0 still takes one byte.
    let bits = 64 - v.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Appends `v` as a base-128 varint (least significant group first, high bit = "more bytes follow").
pub fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// The field key: `(field_number << 3) | wire_type`, as a varint.
pub fn put_key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(buf, (u64::from(field) << 3) | u64::from(wire));
}

/// Encoded size of a field key.
pub fn key_len(field: u32) -> usize {
    varint_len(u64::from(field) << 3)
}

/// Total encoded size of a length-delimited field whose payload is `payload_len` bytes.
pub fn len_field_len(field: u32, payload_len: usize) -> usize {
    key_len(field) + varint_len(payload_len as u64) + payload_len
}

/// Key and length prefix of a length-delimited field; the caller writes the `payload_len` payload bytes next.
pub fn len_field_header(field: u32, payload_len: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(12);
    put_key(&mut buf, field, WIRE_LEN);
    put_varint(&mut buf, payload_len as u64);
    buf
}

/// An encoded message under construction. Field order follows call order; protobuf readers accept any order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    pub fn new() -> Self {
        Self::default()
    }

    /// Unsigned varint field (uint64, or a non-negative int).
    pub fn uint64(&mut self, field: u32, v: u64) -> &mut Self {
        put_key(&mut self.buf, field, WIRE_VARINT);
        put_varint(&mut self.buf, v);
        self
    }

    /// `int64` field: negative values are encoded as their 64-bit two's complement (10 bytes), per protobuf.
    pub fn int64(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint64(field, v as u64)
    }

    /// `int32`/enum field: sign-extended to 64 bits like `int64`, per protobuf.
    pub fn int32(&mut self, field: u32, v: i32) -> &mut Self {
        self.int64(field, i64::from(v))
    }

    /// `float` field (fixed32, little-endian IEEE 754).
    pub fn float(&mut self, field: u32, v: f32) -> &mut Self {
        put_key(&mut self.buf, field, WIRE_FIXED32);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// `bytes` field.
    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Self {
        put_key(&mut self.buf, field, WIRE_LEN);
        put_varint(&mut self.buf, v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// `string` field (UTF-8 bytes).
    pub fn string(&mut self, field: u32, v: &str) -> &mut Self {
        self.bytes(field, v.as_bytes())
    }

    /// Embedded message field.
    pub fn message(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.buf)
    }

    /// Appends already-encoded fields verbatim.
    pub fn raw(&mut self, encoded: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(encoded);
        self
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Vec<u8> {
        let mut b = Vec::new();
        put_varint(&mut b, v);
        assert_eq!(b.len(), varint_len(v), "varint_len({v})");
        b
    }

    #[test]
    fn varints_match_hand_computed_bytes() {
        assert_eq!(varint(0), [0x00]);
        assert_eq!(varint(1), [0x01]);
        assert_eq!(varint(127), [0x7f]);
        // 150 = 0b1001_0110 -> low 7 bits 0x16 | 0x80, then 0x01 (the protobuf docs' example).
        assert_eq!(varint(150), [0x96, 0x01]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(16_384), [0x80, 0x80, 0x01]);
        // -1 as int64: ten bytes, nine 0xff then 0x01.
        assert_eq!(varint(-1i64 as u64), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert_eq!(varint(u64::MAX).len(), 10);
    }

    #[test]
    fn fields_match_hand_computed_bytes() {
        let mut m = Msg::new();
        m.uint64(1, 150); // key (1<<3)|0 = 0x08
        assert_eq!(m.as_bytes(), [0x08, 0x96, 0x01]);

        let mut m = Msg::new();
        m.string(2, "testing"); // key (2<<3)|2 = 0x12, len 7
        assert_eq!(m.as_bytes(), [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);

        let mut m = Msg::new();
        m.float(2, 1.0); // key (2<<3)|5 = 0x15, 1.0f32 = 0x3f800000 LE
        assert_eq!(m.as_bytes(), [0x15, 0x00, 0x00, 0x80, 0x3f]);

        let mut m = Msg::new();
        m.int64(3, -2); // key 0x18, -2 = 0xffff_ffff_ffff_fffe
        assert_eq!(m.as_bytes(), [0x18, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);

        let mut inner = Msg::new();
        inner.uint64(1, 150);
        let mut outer = Msg::new();
        outer.message(3, &inner); // key (3<<3)|2 = 0x1a, len 3
        assert_eq!(outer.as_bytes(), [0x1a, 0x03, 0x08, 0x96, 0x01]);

        // Field 20 (AttributeProto.type) needs a two-byte key: 20<<3 = 160 -> [0xa0, 0x01].
        let mut m = Msg::new();
        m.int32(20, 2);
        assert_eq!(m.as_bytes(), [0xa0, 0x01, 0x02]);
        assert_eq!(key_len(20), 2);
    }

    #[test]
    fn streamed_header_agrees_with_msg_encoding() {
        let payload = vec![7u8; 300];
        let mut m = Msg::new();
        m.bytes(9, &payload);
        let mut streamed = len_field_header(9, payload.len());
        streamed.extend_from_slice(&payload);
        assert_eq!(m.as_bytes(), streamed.as_slice());
        assert_eq!(len_field_len(9, payload.len()), streamed.len());
    }
}
