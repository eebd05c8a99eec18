//! A minimal GGUF v3 writer for tests: a tiny `llama` model that loads, with the position of every integer field
//! of its header recorded (counts, string and array lengths, dimensions, types, offsets) so a fuzzer can make the
//! header lie precisely. Shared by the model crate's tests and the root crate's (`#[path]`).

#![allow(dead_code)]

/// The IEEE half-precision bits of `v`, truncated (test values are small and normal; tiny ones flush to zero).
/// Written out rather than taken from `half` so the root crate, which does not depend on it, can use this file.
pub fn f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    sign | ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

/// [`f16_bits`] as the value it encodes.
fn f16_value(bits: u16) -> f32 {
    let exp = i32::from((bits >> 10) & 0x1f);
    let mantissa = f32::from(bits & 0x3ff);
    let magnitude = if exp == 0 {
        mantissa * 2f32.powi(-24)
    } else {
        (1.0 + mantissa / 1024.0) * 2f32.powi(exp - 15)
    };
    if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// A little-endian integer field: byte offset and width.
pub type Field = (usize, usize);

/// Metadata value types of the GGUF format.
pub const U32: u32 = 4;
/// `i32`.
pub const I32: u32 = 5;
/// `f32`.
pub const F32: u32 = 6;
/// UTF-8 string.
pub const STRING: u32 = 8;
/// Array.
pub const ARRAY: u32 = 9;

/// ggml tensor types used here.
pub const GGML_F32: u32 = 0;
/// `F16`.
pub const GGML_F16: u32 = 1;
/// `Q4_0`.
pub const GGML_Q4_0: u32 = 2;
/// `Q8_0`.
pub const GGML_Q8_0: u32 = 8;

/// A metadata value to write.
#[derive(Clone, Debug)]
pub enum Value {
    /// `u32`.
    U32(u32),
    /// `f32`.
    F32(f32),
    /// String.
    Str(String),
    /// Array of strings.
    Strs(Vec<String>),
    /// Array of `i32`.
    I32s(Vec<i32>),
    /// Array of `f32`.
    F32s(Vec<f32>),
}

/// One tensor: name, dims innermost first, ggml type, and its data (already in that type's encoding).
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Name.
    pub name: String,
    /// Dims, innermost first.
    pub dims: Vec<u64>,
    /// ggml type number.
    pub ggml_type: u32,
    /// Encoded bytes.
    pub data: Vec<u8>,
}

/// A GGUF file being written, and the integer fields written so far.
#[derive(Default)]
pub struct Writer {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Every integer field of the header.
    pub fields: Vec<Field>,
}

impl Writer {
    fn u32(&mut self, v: u32) {
        self.fields.push((self.bytes.len(), 4));
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.fields.push((self.bytes.len(), 8));
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes.extend_from_slice(s.as_bytes());
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::U32(x) => self.u32(*x),
            Value::F32(x) => self.bytes.extend_from_slice(&x.to_le_bytes()),
            Value::Str(s) => self.string(s),
            Value::Strs(items) => {
                self.u32(STRING);
                self.u64(items.len() as u64);
                items.iter().for_each(|s| self.string(s));
            }
            Value::I32s(items) => {
                self.u32(I32);
                self.u64(items.len() as u64);
                items
                    .iter()
                    .for_each(|x| self.bytes.extend_from_slice(&x.to_le_bytes()));
            }
            Value::F32s(items) => {
                self.u32(F32);
                self.u64(items.len() as u64);
                items
                    .iter()
                    .for_each(|x| self.bytes.extend_from_slice(&x.to_le_bytes()));
            }
        }
    }

    fn type_of(v: &Value) -> u32 {
        match v {
            Value::U32(_) => U32,
            Value::F32(_) => F32,
            Value::Str(_) => STRING,
            Value::Strs(_) | Value::I32s(_) | Value::F32s(_) => ARRAY,
        }
    }
}

/// The bytes and header fields of a GGUF v3 file with `metadata` and `tensors` (alignment 32).
pub fn write(metadata: &[(&str, Value)], tensors: &[Tensor]) -> (Vec<u8>, Vec<Field>) {
    const ALIGN: usize = 32;
    let mut w = Writer::default();
    w.bytes.extend_from_slice(b"GGUF");
    w.u32(3);
    w.u64(tensors.len() as u64);
    w.u64(metadata.len() as u64);
    for (key, value) in metadata {
        w.string(key);
        w.u32(Writer::type_of(value));
        w.value(value);
    }
    let mut offset = 0usize;
    for t in tensors {
        w.string(&t.name);
        w.u32(t.dims.len() as u32);
        t.dims.iter().for_each(|&d| w.u64(d));
        w.u32(t.ggml_type);
        w.u64(offset as u64);
        offset = (offset + t.data.len()).div_ceil(ALIGN) * ALIGN;
    }
    w.bytes.resize(w.bytes.len().div_ceil(ALIGN) * ALIGN, 0);
    for t in tensors {
        w.bytes.extend_from_slice(&t.data);
        w.bytes.resize(w.bytes.len().div_ceil(ALIGN) * ALIGN, 0);
    }
    (w.bytes, w.fields)
}

/// Deterministic small values: `n` numbers in about [-0.5, 0.5) from `seed`.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

/// `values` as F32 bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `values` (a multiple of 32) as Q8_0 blocks: an f16 scale and 32 `i8` codes each.
pub fn q8_0_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let bits = f16_bits(if amax > 0.0 { amax / 127.0 } else { 1.0 });
        let d = f16_value(bits);
        out.extend_from_slice(&bits.to_le_bytes());
        out.extend(block.iter().map(|v| (v / d).round() as i8 as u8));
    }
    out
}

/// `values` (a multiple of 32) as Q4_0 blocks: an f16 scale and 16 bytes of nibbles (element `j` low, `j + 16`
/// high).
pub fn q4_0_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let bits = f16_bits(if amax > 0.0 { amax / 7.0 } else { 1.0 });
        let d = f16_value(bits);
        out.extend_from_slice(&bits.to_le_bytes());
        let code = |v: f32| ((v / d).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
        out.extend((0..16).map(|j| code(block[j]) | (code(block[j + 16]) << 4)));
    }
    out
}

/// `values` as F16 bytes.
pub fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| f16_bits(*v).to_le_bytes())
        .collect()
}

/// Sizes of [`tiny_llama`].
pub const VOCAB: u64 = 32;
/// Hidden size.
pub const HIDDEN: u64 = 32;
/// MLP size.
pub const FFN: u64 = 64;

/// The metadata and tensors of a one-layer `llama` model (vocab 32, hidden 32, 2 heads of 16, 1 KV head, MLP 64,
/// context 64, tied embeddings) with an embedded tokenizer, its matrices in F32, F16, Q8_0 and Q4_0.
pub fn tiny_llama() -> (Vec<(&'static str, Value)>, Vec<Tensor>) {
    let tokens: Vec<String> = (0..VOCAB).map(|i| format!("t{i}")).collect();
    let metadata = vec![
        ("general.architecture", Value::Str("llama".into())),
        ("llama.context_length", Value::U32(64)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.block_count", Value::U32(1)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.attention.head_count", Value::U32(2)),
        ("llama.attention.head_count_kv", Value::U32(1)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Strs(tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::I32s(vec![1; VOCAB as usize]),
        ),
        (
            "tokenizer.ggml.scores",
            Value::F32s(vec![0.0; VOCAB as usize]),
        ),
        ("tokenizer.ggml.merges", Value::Strs(vec!["t 1".into()])),
        ("tokenizer.ggml.eos_token_id", Value::U32(1)),
    ];
    let matrix = |name: &str, inner: u64, outer: u64, ty: u32, seed: u32| {
        let v = values((inner * outer) as usize, seed);
        let data = match ty {
            GGML_F32 => f32_bytes(&v),
            GGML_F16 => f16_bytes(&v),
            GGML_Q8_0 => q8_0_bytes(&v),
            _ => q4_0_bytes(&v),
        };
        Tensor {
            name: name.to_string(),
            dims: vec![inner, outer],
            ggml_type: ty,
            data,
        }
    };
    let norm = |name: &str| Tensor {
        name: name.to_string(),
        dims: vec![HIDDEN],
        ggml_type: GGML_F32,
        data: f32_bytes(&vec![1.0; HIDDEN as usize]),
    };
    let tensors = vec![
        matrix("token_embd.weight", HIDDEN, VOCAB, GGML_F16, 1),
        norm("output_norm.weight"),
        norm("blk.0.attn_norm.weight"),
        matrix("blk.0.attn_q.weight", HIDDEN, 32, GGML_Q8_0, 2),
        matrix("blk.0.attn_k.weight", HIDDEN, 16, GGML_Q4_0, 3),
        matrix("blk.0.attn_v.weight", HIDDEN, 16, GGML_F32, 4),
        matrix("blk.0.attn_output.weight", 32, HIDDEN, GGML_Q8_0, 5),
        norm("blk.0.ffn_norm.weight"),
        matrix("blk.0.ffn_gate.weight", HIDDEN, FFN, GGML_Q4_0, 6),
        matrix("blk.0.ffn_up.weight", HIDDEN, FFN, GGML_F32, 7),
        matrix("blk.0.ffn_down.weight", FFN, HIDDEN, GGML_Q8_0, 8),
    ];
    (metadata, tensors)
}

/// [`tiny_llama`] written out.
pub fn tiny_llama_file() -> (Vec<u8>, Vec<Field>) {
    let (metadata, tensors) = tiny_llama();
    write(&metadata, &tensors)
}
