//! Dequantization of ggml block formats to f32.
//!
//! Each function mirrors ggml's reference `dequantize_row_*` (and the `gguf` Python package's
//! `gguf.quants.*.dequantize_blocks`), including the order of float operations, so results match bit for bit.

use half::f16;

use super::ggml_type::GgmlType;

/// Elements in a K-quant super-block.
const QK_K: usize = 256;

/// Dequantizes `bytes`, a whole number of `ty` blocks, to f32 values in storage order.
///
/// Returns `None` when `ty` is not a supported type or `bytes` is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let (block_len, block_bytes) = ty.block_geometry()?;
    if !bytes.len().is_multiple_of(block_bytes) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * block_len);
    let blocks = bytes.chunks_exact(block_bytes);
    match ty {
        GgmlType::F32 => out.extend(blocks.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        GgmlType::F16 => out.extend(blocks.map(|b| f16_at(b, 0))),
        GgmlType::Bf16 => out.extend(
            blocks.map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
        ),
        GgmlType::Q4_0 => blocks.for_each(|b| q4_0(b, &mut out)),
        GgmlType::Q4_1 => blocks.for_each(|b| q4_1(b, &mut out)),
        GgmlType::Q5_0 => blocks.for_each(|b| q5_0(b, &mut out)),
        GgmlType::Q5_1 => blocks.for_each(|b| q5_1(b, &mut out)),
        GgmlType::Q8_0 => blocks.for_each(|b| q8_0(b, &mut out)),
        GgmlType::Q4_K => blocks.for_each(|b| q4_k(b, &mut out)),
        GgmlType::Q5_K => blocks.for_each(|b| q5_k(b, &mut out)),
        GgmlType::Q6_K => blocks.for_each(|b| q6_k(b, &mut out)),
        GgmlType::Other(_) => return None,
    }
    Some(out)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 4-bit value of element `i` of a 32-element block whose nibbles are `qs[16]`: elements 0..16 are the low
/// nibbles, 16..32 the high nibbles.
fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < 16 {
        qs[i] & 0x0F
    } else {
        qs[i - 16] >> 4
    }
}

/// `[d: f16][qs: 16]`: `x = d * (q - 8)`.
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    out.extend((0..32).map(|i| d * (i32::from(nibble(qs, i)) - 8) as f32));
}

/// `[d: f16][m: f16][qs: 16]`: `x = d * q + m`.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    out.extend((0..32).map(|i| d * f32::from(nibble(qs, i)) + m));
}

/// The 5-bit value of element `i`: a nibble plus bit `i` of the little-endian `qh` word as bit 4.
fn five_bit(qh: u32, qs: &[u8], i: usize) -> u8 {
    nibble(qs, i) | ((((qh >> i) & 1) as u8) << 4)
}

/// `[d: f16][qh: u32][qs: 16]`: `x = d * (q - 16)`.
fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    out.extend((0..32).map(|i| d * (i32::from(five_bit(qh, qs, i)) - 16) as f32));
}

/// `[d: f16][m: f16][qh: u32][qs: 16]`: `x = d * q + m`.
fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    out.extend((0..32).map(|i| d * f32::from(five_bit(qh, qs, i)) + m));
}

/// `[d: f16][qs: i8 x 32]`: `x = d * q`.
fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| d * f32::from(q as i8)));
}

/// The eight 6-bit `(scale, min)` pairs packed into 12 bytes (ggml's `get_scale_min_k4`): bytes 0..4 hold the low
/// six bits of scales 0..4, bytes 4..8 those of mins 0..4, bytes 8..12 the low nibbles of scales/mins 4..8, whose
/// top two bits are the top bits of bytes 0..8.
fn scale_min_k4(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 0x3F, scales[j + 4] & 0x3F)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// Shared by Q4_K and Q5_K: `[d: f16][dmin: f16][scales: 12]` then weights; sub-block `j` of 32 elements is
/// `x = (d * sc_j) * q - dmin * m_j`, with `q` from `weight(j, l)`.
fn k4_family(b: &[u8], out: &mut Vec<f32>, weight: impl Fn(usize, usize) -> u8) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        out.extend((0..32).map(|l| dl * f32::from(weight(j, l)) - ml));
    }
}

/// Q4_K: 128 bytes of nibbles after the scales; sub-blocks `2c` and `2c + 1` are the low and high nibbles of the
/// 32 bytes `qs[32c..32c + 32]`.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let qs = &b[16..144];
    k4_family(b, out, |j, l| {
        (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F
    });
}

/// Q5_K: `qh[32]` then `qs[128]` after the scales; as Q4_K plus bit `j` of `qh[l]` as the weight's bit 4.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let qh = &b[16..48];
    let qs = &b[48..176];
    k4_family(b, out, |j, l| {
        let low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        low | (((qh[l] >> j) & 1) << 4)
    });
}

/// `[ql: 128][qh: 64][scales: i8 x 16][d: f16]`: each 128-element half `h` takes its low four bits from
/// `ql[64h..64h + 64]` (low nibbles for elements 0..64, high for 64..128) and its top two bits from bit pair
/// `i / 32` of `qh[32h + i % 32]`; `x = (d * scale[e / 16]) * (q - 32)`.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for e in 0..QK_K {
        let (h, i) = (e / 128, e % 128);
        let low = (ql[64 * h + i % 64] >> (4 * (i / 64))) & 0x0F;
        let high = (qh[32 * h + i % 32] >> (2 * (i / 32))) & 0x03;
        let q = i32::from(low | (high << 4)) - 32;
        let scale = d * f32::from(scales[e / 16] as i8);
        out.push(scale * q as f32);
    }
}
