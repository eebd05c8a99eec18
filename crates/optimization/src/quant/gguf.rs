//! Building [`QuantizedWeight`]s straight from GGUF Q8_0 / Q4_0 / Q4_1 block bytes.
//!
//! Every GGUF block covers 32 consecutive elements of a row (GGUF `ne[0]`, our `in_features`) and
//! maps onto an ember group of 32 without any f32 round trip: the integer codes are copied (Q4
//! nibbles reordered into ember's packing) and the f16 block parameters widened to f32, which is
//! exact. Dequantized values are therefore bit-identical to ggml's.

use half::f16;

use crate::error::QuantError;
use crate::quant::scheme::{Granularity, QuantScheme};
use crate::quant::weight::QuantizedWeight;

/// Elements per GGUF block for the Q8_0, Q4_0 and Q4_1 types.
pub const GGUF_BLOCK_LEN: usize = 32;

impl QuantizedWeight {
    /// Loads GGUF `Q8_0` blocks (34 bytes: f16 `d`, 32 × i8 `q`; value `q * d`) of a
    /// `[rows, cols]` tensor (GGUF `ne = [cols, rows]`) as INT8 group-32 symmetric.
    pub fn from_gguf_q8_0(bytes: &[u8], shape: [usize; 2]) -> Result<Self, QuantError> {
        let scheme = QuantScheme::Int8 {
            granularity: Granularity::Group(GGUF_BLOCK_LEN),
        };
        let blocks = blocks("Q8_0", bytes, shape, 34)?;
        let mut codes = Vec::with_capacity(blocks.len() * GGUF_BLOCK_LEN);
        let mut scales = Vec::with_capacity(blocks.len());
        for block in blocks {
            scales.push(read_f16(block, 0));
            // Stored as `q + 128` so that i8's full range, including -128, maps into u8.
            codes.extend(block[2..].iter().map(|&q| (q as i8 as i16 + 128) as u8));
        }
        Self::from_parts(scheme, shape, codes, scales, None)
    }

    /// Loads GGUF `Q4_0` blocks (18 bytes: f16 `d`, 16 bytes of nibbles; value `(q - 8) * d`) as
    /// INT4 group-32 symmetric (zero code 8).
    pub fn from_gguf_q4_0(bytes: &[u8], shape: [usize; 2]) -> Result<Self, QuantError> {
        let scheme = QuantScheme::Int4 {
            group_size: GGUF_BLOCK_LEN,
            symmetric: true,
        };
        let blocks = blocks("Q4_0", bytes, shape, 18)?;
        let mut codes = Vec::with_capacity(blocks.len() * GGUF_BLOCK_LEN / 2);
        let mut scales = Vec::with_capacity(blocks.len());
        for block in blocks {
            scales.push(read_f16(block, 0));
            repack_nibbles(&block[2..], &mut codes);
        }
        Self::from_parts(scheme, shape, codes, scales, None)
    }

    /// Loads GGUF `Q4_1` blocks (20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles; value
    /// `q * d + m`) as INT4 group-32 asymmetric with `scale = d`, `min = m`.
    pub fn from_gguf_q4_1(bytes: &[u8], shape: [usize; 2]) -> Result<Self, QuantError> {
        let scheme = QuantScheme::Int4 {
            group_size: GGUF_BLOCK_LEN,
            symmetric: false,
        };
        let blocks = blocks("Q4_1", bytes, shape, 20)?;
        let mut codes = Vec::with_capacity(blocks.len() * GGUF_BLOCK_LEN / 2);
        let mut scales = Vec::with_capacity(blocks.len());
        let mut mins = Vec::with_capacity(blocks.len());
        for block in blocks {
            scales.push(read_f16(block, 0));
            mins.push(read_f16(block, 2));
            repack_nibbles(&block[4..], &mut codes);
        }
        Self::from_parts(scheme, shape, codes, scales, Some(mins))
    }
}

/// Splits `bytes` into the blocks of a `[rows, cols]` tensor, checking the sizes.
fn blocks<'a>(
    kind: &'static str,
    bytes: &'a [u8],
    [rows, cols]: [usize; 2],
    block_bytes: usize,
) -> Result<std::slice::ChunksExact<'a, u8>, QuantError> {
    let fail = |reason: String| QuantError::GgufBlocks {
        kind,
        rows,
        cols,
        reason,
    };
    if rows == 0 || cols == 0 || cols % GGUF_BLOCK_LEN != 0 {
        return Err(fail(format!(
            "columns must be a positive multiple of the block length {GGUF_BLOCK_LEN}"
        )));
    }
    // The shape comes from a file: a product that overflows is as wrong as one that does not match.
    let expected = rows
        .checked_mul(cols / GGUF_BLOCK_LEN)
        .and_then(|blocks| blocks.checked_mul(block_bytes));
    let Some(expected) = expected else {
        return Err(fail(format!(
            "{rows} x {cols} elements in {block_bytes}-byte blocks of {GGUF_BLOCK_LEN} overflow the address space"
        )));
    };
    if bytes.len() != expected {
        return Err(fail(format!(
            "expected {expected} bytes ({block_bytes} per block of {GGUF_BLOCK_LEN}), got {}",
            bytes.len()
        )));
    }
    Ok(bytes.chunks_exact(block_bytes))
}

fn read_f16(block: &[u8], offset: usize) -> f32 {
    f16::from_le_bytes([block[offset], block[offset + 1]]).to_f32()
}

/// GGUF keeps element `j` in the low nibble and element `j + 16` in the high nibble of byte `j`;
/// ember keeps elements `2i` and `2i + 1` together in byte `i`.
fn repack_nibbles(qs: &[u8], out: &mut Vec<u8>) {
    let half = GGUF_BLOCK_LEN / 2;
    let code = |j: usize| {
        if j < half {
            qs[j] & 0x0f
        } else {
            qs[j - half] >> 4
        }
    };
    out.extend((0..half).map(|i| code(2 * i) | (code(2 * i + 1) << 4)));
}
