//! ggml tensor element types: block geometry and names.

use std::fmt;

/// A ggml tensor type as numbered in a GGUF tensor info (ggml's `enum ggml_type`).
///
/// Quantized types store a tensor's innermost dimension in blocks of elements packed into a fixed number of bytes
/// ([`GgmlType::block_geometry`]).
// The variants carry ggml's own type names (`Q4_K`), which every GGUF tool and error message uses.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16: the top half of a binary32.
    Bf16,
    /// 32 four-bit weights with one f16 scale, offset 8.
    Q4_0,
    /// 32 four-bit weights with an f16 scale and an f16 minimum.
    Q4_1,
    /// 32 five-bit weights with one f16 scale, offset 16.
    Q5_0,
    /// 32 five-bit weights with an f16 scale and an f16 minimum.
    Q5_1,
    /// 32 eight-bit weights with one f16 scale.
    Q8_0,
    /// 256-element super-block of sixteen 16-element sub-blocks with 4-bit scales and minimums, 2-bit weights.
    Q2_K,
    /// 256-element super-block of sixteen 16-element sub-blocks with 6-bit signed scales, 3-bit weights (the
    /// third bit in a separate mask).
    Q3_K,
    /// 256-element super-block of eight 32-element sub-blocks with 6-bit scales and minimums, 4-bit weights.
    Q4_K,
    /// As [`GgmlType::Q4_K`] with a fifth weight bit.
    Q5_K,
    /// 256-element super-block of sixteen 16-element sub-blocks with 8-bit scales, 6-bit weights.
    Q6_K,
    /// 32 four-bit indices into a fixed non-uniform table of 16 levels, one f16 scale.
    IQ4_NL,
    /// 256-element super-block of eight 32-element IQ4_NL-style sub-blocks with 6-bit signed scales.
    IQ4_XS,
    /// Any other ggml type, by number (readable as metadata, not dequantizable here).
    Other(u32),
}

impl GgmlType {
    /// The types [`crate::dequantize`] supports, for error messages.
    pub const SUPPORTED: &'static str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";

    /// The block-quantized types a matrix can be kept packed in and multiplied from
    /// ([`GgmlType::is_block_quantized`]).
    pub const BLOCK_QUANTIZED: [GgmlType; 12] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
    ];

    /// Whether this is one of [`GgmlType::BLOCK_QUANTIZED`]: stored in blocks of several elements that
    /// [`crate::dequantize_block`] expands.
    pub fn is_block_quantized(self) -> bool {
        Self::BLOCK_QUANTIZED.contains(&self)
    }

    /// The type with ggml number `id`.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            20 => Self::IQ4_NL,
            23 => Self::IQ4_XS,
            30 => Self::Bf16,
            other => Self::Other(other),
        }
    }

    /// The ggml number of this type.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::Bf16 => 30,
            Self::Other(id) => id,
        }
    }

    /// `(elements per block, bytes per block)`, or `None` for a type this reader does not know the layout of.
    #[inline]
    pub fn block_geometry(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 2 + 16),
            Self::Q4_1 => (32, 2 + 2 + 16),
            Self::Q5_0 => (32, 2 + 4 + 16),
            Self::Q5_1 => (32, 2 + 2 + 4 + 16),
            Self::Q8_0 => (32, 2 + 32),
            Self::Q2_K => (256, 16 + 64 + 2 + 2),
            Self::Q3_K => (256, 32 + 64 + 12 + 2),
            Self::Q4_K => (256, 2 + 2 + 12 + 128),
            Self::Q5_K => (256, 2 + 2 + 12 + 32 + 128),
            Self::Q6_K => (256, 128 + 64 + 16 + 2),
            Self::IQ4_NL => (32, 2 + 16),
            Self::IQ4_XS => (256, 2 + 2 + 4 + 128),
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ4_XS => "IQ4_XS",
            Self::Other(id) => {
                return write!(
                    f,
                    "#{id}{}",
                    other_name(*id)
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                );
            }
        };
        f.write_str(name)
    }
}

/// ggml's names for the types this reader does not dequantize, so errors say e.g. `#16 (IQ2_XXS)`.
fn other_name(id: u32) -> Option<&'static str> {
    Some(match id {
        9 => "Q8_1",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        21 => "IQ3_S",
        22 => "IQ2_S",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}
