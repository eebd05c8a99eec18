//! The 32-element block types (ggml's `block_q4_0` ... `block_q8_0`, `block_iq4_nl`): one scale (and minimum)
//! per block of 32 consecutive elements of a row.
//!
//! Each function expands one block into `out[..32]` with ggml's reference `dequantize_row_*` float operations in
//! the same order (the `gguf` Python package's `dequantize_blocks` does the same), so values match bit for bit.

use super::f16_at;

/// Elements per block of every type here.
pub const BLOCK_LEN: usize = 32;

/// The 16 levels of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`): a non-uniform grid denser near zero, where
/// weights concentrate.
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 4-bit value of element `i` of a 32-element block whose nibbles are `qs[16]`: elements 0..16 are the low
/// nibbles, 16..32 the high nibbles.
#[inline(always)]
pub fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < 16 {
        qs[i] & 0x0F
    } else {
        qs[i - 16] >> 4
    }
}

/// `[d: f16][qs: 16]`: `x = d * (q - 8)`.
#[inline(always)]
pub fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (i, x) in out[..BLOCK_LEN].iter_mut().enumerate() {
        *x = d * (i32::from(nibble(qs, i)) - 8) as f32;
    }
}

/// `[d: f16][m: f16][qs: 16]`: `x = d * q + m`.
#[inline(always)]
pub fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for (i, x) in out[..BLOCK_LEN].iter_mut().enumerate() {
        *x = d * f32::from(nibble(qs, i)) + m;
    }
}

/// The 5-bit value of element `i`: a nibble plus bit `i` of the little-endian `qh` word as bit 4.
#[inline(always)]
fn five_bit(qh: u32, qs: &[u8], i: usize) -> u8 {
    nibble(qs, i) | ((((qh >> i) & 1) as u8) << 4)
}

/// `[d: f16][qh: u32][qs: 16]`: `x = d * (q - 16)`.
#[inline(always)]
pub fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (i, x) in out[..BLOCK_LEN].iter_mut().enumerate() {
        *x = d * (i32::from(five_bit(qh, qs, i)) - 16) as f32;
    }
}

/// `[d: f16][m: f16][qh: u32][qs: 16]`: `x = d * q + m`.
#[inline(always)]
pub fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (i, x) in out[..BLOCK_LEN].iter_mut().enumerate() {
        *x = d * f32::from(five_bit(qh, qs, i)) + m;
    }
}

/// `[d: f16][qs: i8 x 32]`: `x = d * q`.
#[inline(always)]
pub fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (x, &q) in out[..BLOCK_LEN].iter_mut().zip(&b[2..34]) {
        *x = d * f32::from(q as i8);
    }
}

/// `[d: f16][qs: 16]`: `x = d * IQ4_LEVELS[q]`, nibbles ordered as Q4_0's.
#[inline(always)]
pub fn iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (i, x) in out[..BLOCK_LEN].iter_mut().enumerate() {
        *x = d * f32::from(IQ4_LEVELS[usize::from(nibble(qs, i))]);
    }
}
