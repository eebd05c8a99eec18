//! ggml's reference quantizers: f32 rows to GGML blocks, bit for bit as `ggml_quantize_chunk` writes them with
//! no importance matrix (the `quantize_row_*_ref` functions of `ggml-quants.c`, and `quantize_iq4_nl` /
//! `quantize_iq4_xs` with no weights), so a model ember quantizes is the file llama.cpp would have written.
//!
//! [`quantize`] cuts the values into blocks and hands each to its type's block quantizer: [`legacy`] for the
//! 32-element types, [`kquants`] for the 256-element K-quants, [`iq4`] for the non-linear IQ4 grid, all built on
//! the scale searches of [`search`]. Every block is worked on the stack; the output is the one allocation.

mod iq4;
mod kquants;
mod legacy;
mod search;

use thiserror::Error;

use super::GgmlType;

/// Why [`quantize`] could not write a buffer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QuantizeError {
    /// `ty` has no quantizer here ([`can_quantize`]).
    #[error("ggml quantize: cannot write {0} (writable: {WRITABLE})")]
    Unsupported(GgmlType),
    /// A row is not a whole number of `ty`'s blocks.
    #[error(
        "ggml quantize: rows of {cols} elements are not a whole number of {ty} blocks of {block_len}"
    )]
    Cols {
        /// The type asked for.
        ty: GgmlType,
        /// The row length given.
        cols: usize,
        /// The elements in one block of `ty`.
        block_len: usize,
    },
    /// The values are not a whole number of rows.
    #[error("ggml quantize: {len} values are not a whole number of rows of {cols}")]
    Length {
        /// `values.len()`.
        len: usize,
        /// The row length given.
        cols: usize,
    },
}

/// The types [`quantize`] writes, for error messages.
const WRITABLE: &str =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";

/// Writes one block of `ty` from a block's worth of values into the block's bytes.
type BlockFn = fn(&[f32], &mut [u8]);

/// The block quantizer of a block-quantized `ty`.
fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => legacy::q4_0,
        T::Q4_1 => legacy::q4_1,
        T::Q5_0 => legacy::q5_0,
        T::Q5_1 => legacy::q5_1,
        T::Q8_0 => legacy::q8_0,
        T::Q2_K => kquants::q2_k,
        T::Q3_K => kquants::q3_k,
        T::Q4_K => kquants::q4_k,
        T::Q5_K => kquants::q5_k,
        T::Q6_K => kquants::q6_k,
        T::IQ4_NL => iq4::iq4_nl,
        T::IQ4_XS => iq4::iq4_xs,
        T::F32 | T::F16 | T::Bf16 | T::Other(_) => return None,
    })
}

/// Whether [`quantize`] can write `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16) || block_fn(ty).is_some()
}

/// Quantizes `values`, rows of `cols` elements laid end to end, into `ty`'s blocks as ggml's reference
/// quantizer (`ggml_quantize_chunk` with no importance matrix) writes them, bit for bit.
///
/// F32 is the values' little-endian bytes, F16 and BF16 round each to nearest, ties to even (ggml's
/// `GGML_FP32_TO_FP16` and `GGML_FP32_TO_BF16`, the latter keeping NaNs quiet NaNs). Blocks never straddle rows,
/// so a whole number of blocks per row is required; as every row is then a whole number of blocks, the output is
/// the blocks of all values in order, `values.len() / block_len * block_bytes` bytes
/// ([`GgmlType::block_geometry`]). Non-finite values never panic; what they quantize to is unspecified.
pub fn quantize(ty: GgmlType, values: &[f32], cols: usize) -> Result<Vec<u8>, QuantizeError> {
    let (block_len, block_bytes) = ty
        .block_geometry()
        .filter(|_| can_quantize(ty))
        .ok_or(QuantizeError::Unsupported(ty))?;
    if !cols.is_multiple_of(block_len) {
        return Err(QuantizeError::Cols {
            ty,
            cols,
            block_len,
        });
    }
    if !values.len().is_multiple_of(cols) {
        return Err(QuantizeError::Length {
            len: values.len(),
            cols,
        });
    }
    let mut out = vec![0u8; values.len() / block_len * block_bytes];
    let blocks = values
        .chunks_exact(block_len)
        .zip(out.chunks_exact_mut(block_bytes));
    match ty {
        GgmlType::F32 => blocks.for_each(|(v, b)| b.copy_from_slice(&v[0].to_le_bytes())),
        GgmlType::F16 => blocks.for_each(|(v, b)| b.copy_from_slice(&f16_le(v[0]).0)),
        GgmlType::Bf16 => {
            blocks.for_each(|(v, b)| b.copy_from_slice(&bf16_bits(v[0]).to_le_bytes()))
        }
        _ => {
            if let Some(quantize_block) = block_fn(ty) {
                blocks.for_each(|(v, b)| quantize_block(v, b));
            }
        }
    }
    Ok(out)
}

/// `x` rounded to the nearest f16, ties to even (ggml's `GGML_FP32_TO_FP16`), as its little-endian bytes and its
/// value widened back to f32 (ggml's `GGML_FP16_TO_FP32` of the stored scale, which the quantizers reuse).
#[inline]
fn f16_le(x: f32) -> ([u8; 2], f32) {
    let h = half::f16::from_f32(x);
    (h.to_bits().to_le_bytes(), h.to_f32())
}

/// `x` as bfloat16 bits the way ggml's `ggml_compute_fp32_to_bf16` rounds: to nearest, ties to even, with a NaN
/// made quiet rather than rounded (which could carry it into an infinity).
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_ties_to_even() {
        // 1 + 2^-11 lies halfway between 1 and the next f16; the even neighbour is 1.
        assert_eq!(f16_le(1.0 + 2f32.powi(-11)).0, 0x3C00u16.to_le_bytes());
        assert_eq!(
            f16_le(1.0 + 3.0 * 2f32.powi(-11)).0,
            0x3C02u16.to_le_bytes()
        );
        assert_eq!(f16_le(65520.0).0, 0x7C00u16.to_le_bytes());
    }

    #[test]
    fn bf16_rounds_ties_to_even_and_quiets_nans() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
    }

    #[test]
    fn every_type_survives_non_finite_input() {
        let mut values = vec![0.5f32; 512];
        values[3] = f32::NAN;
        values[40] = f32::INFINITY;
        values[300] = f32::NEG_INFINITY;
        values[301] = f32::MAX;
        values[302] = f32::MIN_POSITIVE / 4.0;
        for ty in GgmlType::BLOCK_QUANTIZED
            .into_iter()
            .chain([GgmlType::F16, GgmlType::Bf16])
        {
            let (block_len, block_bytes) = ty.block_geometry().unwrap();
            let out = quantize(ty, &values, 512).unwrap();
            assert_eq!(out.len(), 512 / block_len * block_bytes, "{ty}");
        }
    }
}
