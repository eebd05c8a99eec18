//! ggml's tensor types: their numbering, block geometry and dequantization to f32, the one home of the GGML
//! block formats (the GGUF reader, the packed [`GgmlType`] weights of `ember-optimization` and the CPU kernels
//! that multiply them all read blocks through here).
//!
//! A block-quantized row of `cols` elements is `cols / block_len` blocks laid end to end; [`dequantize_block`]
//! expands one, [`dequantize`] a whole buffer; [`quantize`] writes blocks from f32 rows as ggml's reference
//! quantizer does.

mod ggml_type;
pub mod kquants;
pub mod legacy;
mod matrix;
mod quantize;
pub mod unpack;

pub use ggml_type::GgmlType;
pub use matrix::GgmlMatrix;
pub use quantize::{QuantizeError, can_quantize, quantize};

/// The most elements one block of any supported type expands to (a K-quant super-block), so callers can
/// expand a block into a stack buffer.
pub const MAX_BLOCK_LEN: usize = kquants::QK_K;

/// The little-endian f16 at byte `at` of `b`, widened (exactly) to f32.
///
/// By bits rather than through `half`, whose conversion is an out-of-line call chosen at run time (F16C or
/// not): once per block, it was a call per 32 weights in the product kernels. The f16 magnitude bits shifted
/// into an f32's place are the value times 2^-112 for normal and subnormal numbers alike (a subnormal f16 lands
/// on an f32 subnormal, which the multiply makes normal again, exactly); infinities and NaNs take the f32
/// all-ones exponent.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    let bits = u32::from(h & 0x7FFF) << 13;
    let magnitude = if bits >= 0x7C00 << 13 {
        f32::from_bits(bits | 0x7F80_0000)
    } else {
        f32::from_bits(bits) * f32::from_bits((127 + 112) << 23)
    };
    f32::from_bits(magnitude.to_bits() | (u32::from(h & 0x8000) << 16))
}

/// Evaluates `$body` with `$f` bound to the block dequantizer of `$ty` (a function item, so each use is
/// monomorphised and inlined: the product kernels expand blocks inside their vectorised loops), or `$none` for
/// a type that is not block-quantized.
#[macro_export]
macro_rules! with_block_fn {
    ($ty:expr, |$f:ident| $body:expr, $none:expr) => {{
        use $crate::{GgmlType as T, kquants as k, legacy as l};
        match $ty {
            T::Q4_0 => {
                let $f = l::q4_0;
                $body
            }
            T::Q4_1 => {
                let $f = l::q4_1;
                $body
            }
            T::Q5_0 => {
                let $f = l::q5_0;
                $body
            }
            T::Q5_1 => {
                let $f = l::q5_1;
                $body
            }
            T::Q8_0 => {
                let $f = l::q8_0;
                $body
            }
            T::IQ4_NL => {
                let $f = l::iq4_nl;
                $body
            }
            T::Q2_K => {
                let $f = k::q2_k;
                $body
            }
            T::Q3_K => {
                let $f = k::q3_k;
                $body
            }
            T::Q4_K => {
                let $f = k::q4_k;
                $body
            }
            T::Q5_K => {
                let $f = k::q5_k;
                $body
            }
            T::Q6_K => {
                let $f = k::q6_k;
                $body
            }
            T::IQ4_XS => {
                let $f = k::iq4_xs;
                $body
            }
            T::F32 | T::F16 | T::Bf16 | T::Other(_) => $none,
        }
    }};
}

/// Expands one block of `ty` into `out`, bit for bit as ggml's reference dequantization does.
///
/// `block` must be one whole block and `out` at least the block's element count
/// ([`GgmlType::block_geometry`]); a type outside [`GgmlType::BLOCK_QUANTIZED`] writes nothing. Lengths are the
/// caller's to check (this runs per block in the product kernels); a short slice panics rather than reading
/// past it.
#[inline(always)]
pub fn dequantize_block(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    with_block_fn!(ty, |expand| expand(block, out), ())
}

/// Dequantizes `bytes`, a whole number of `ty` blocks, to f32 values in storage order.
///
/// Returns `None` when `ty` is not a supported type or `bytes` is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let (block_len, block_bytes) = ty.block_geometry()?;
    if !bytes.len().is_multiple_of(block_bytes) {
        return None;
    }
    let blocks = bytes.chunks_exact(block_bytes);
    Some(match ty {
        GgmlType::F32 => blocks
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => blocks.map(|b| f16_at(b, 0)).collect(),
        GgmlType::Bf16 => blocks
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect(),
        GgmlType::Other(_) => return None,
        _ => {
            let mut out = vec![0f32; bytes.len() / block_bytes * block_len];
            for (block, out) in blocks.zip(out.chunks_exact_mut(block_len)) {
                dequantize_block(ty, block, out);
            }
            out
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_widening_equals_half_on_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let ours = super::f16_at(&h.to_le_bytes(), 0);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}: {ours}");
            } else {
                assert_eq!(
                    ours.to_bits(),
                    theirs.to_bits(),
                    "{h:#06x}: {ours} vs {theirs}"
                );
            }
        }
    }
}
