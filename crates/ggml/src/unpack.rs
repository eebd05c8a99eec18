//! Blocks as small integers: the form the integer-dot kernels multiply.
//!
//! Each function turns one block of its type into [`IntChunk`]s of 32 consecutive weights, integers plus the
//! affine map back to the weights' values per 16-element half. The kernel then multiplies the integers with the
//! 8-bit activations exactly (`maddubs`/`madd` on AVX2) and applies the map once per half, which is the whole
//! trick of ggml's `vec_dot_*_q8` kernels. Every type's offset (Q4_0's 8, Q6_K's 32, Q3_K's 4) is moved into the
//! map, so the integers are unsigned and small (at most 63), which `maddubs` (unsigned times signed bytes) takes
//! without saturating; only Q8_0 and the IQ4 grids are signed and are multiplied by sign transfer instead.
//!
//! The weights these chunks stand for equal [`super::dequantize_block`]'s up to f32 rounding of the map (the
//! reference computes `d * (q - 8)`, the chunk `d * q - 8 d`); the tests pin both to the f64 product.

use super::kquants::{q3_k_scale, scale_min_k4};
use super::legacy::{IQ4_LEVELS, nibble};
use super::{GgmlType, f16_at};

/// Elements per chunk: one ggml legacy block, an eighth of a K-quant super-block, one activation block.
pub const CHUNK_LEN: usize = 32;

/// 32 consecutive weights `w[i] = scale[i / 16] * q[i] + min[i / 16]`.
///
/// `q` holds unsigned integers for every type but the signed ones ([`Unpack::SIGNED`]), where its bytes
/// are `i8` and `min` is zero.
///
/// Aligned to a cache line (its size): the VNNI tiles read runs of unpacked chunks, each then in one line
/// (at 32 bytes every other chunk's maps would lie in the next).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
pub struct IntChunk {
    /// The 32 integers (`i8` bytes for the signed types).
    pub q: [u8; CHUNK_LEN],
    /// Each 16-element half's scale.
    pub scale: [f32; 2],
    /// Each 16-element half's minimum (zero for the signed types).
    pub min: [f32; 2],
}

impl IntChunk {
    /// One map for both halves, as every 32-element sub-block has.
    #[inline(always)]
    fn set_map(&mut self, scale: f32, min: f32) {
        self.scale = [scale; 2];
        self.min = [min; 2];
    }
}

/// How an unpacker widens its blocks' f16 scales: by bits ([`SoftF16`]) or, where the CPU has it, by F16C's
/// `vcvtph2ps` (the kernel's instruction set implements this). In the decode kernel's profile the bit-level
/// widening compiled to about a dozen vector shifts, compares and blends per scale, once per 32 weights; F16C
/// does it in one instruction.
pub trait F16Reader: Copy {
    /// The little-endian f16 at byte `at` of `b`, widened exactly to f32.
    fn f16(self, b: &[u8], at: usize) -> f32;
}

/// [`F16Reader`] on any CPU: the f16 widened from its bits, exactly.
#[derive(Clone, Copy, Debug)]
pub struct SoftF16;

impl F16Reader for SoftF16 {
    #[inline(always)]
    fn f16(self, b: &[u8], at: usize) -> f32 {
        f16_at(b, at)
    }
}

/// One block type's unpacking, with its geometry as constants, so the kernel's block loops compile to fixed
/// strides (a geometry read at run time put an integer division in the hot loop).
pub trait Unpack {
    /// The type, for kernels with their own load of some types' blocks (the legacy ones straight into AVX2
    /// registers).
    const TYPE: GgmlType;
    /// Whether the chunks' integers are signed bytes (their minimum is then zero).
    const SIGNED: bool;
    /// The integer offset the unpacked chunks keep in their map (`min = -OFFSET * scale`: Q4_0's 8, Q5_0's 16,
    /// Q3_K's 4, Q6_K's 32), or 0 where the minimum is a float of its own or the type is signed. A kernel may
    /// move it into signed integers instead (`q - OFFSET`), as ggml's do.
    const OFFSET: i8;
    /// Bytes of one block.
    const BLOCK_BYTES: usize;
    /// Chunks of one block: 1 for the legacy types, 8 for a K-quant super-block.
    const CHUNKS: usize;
    /// Whether a chunk's two halves have maps of their own (Q2_K, Q3_K and Q6_K scale 16 weights at a time);
    /// otherwise `scale[0] == scale[1]` and `min[0] == min[1]`, and a kernel may apply one map per chunk.
    const HALF_MAPS: bool;
    /// Expands one block into `out[..CHUNKS]`, its f16 scales read by `h`.
    fn unpack<H: F16Reader>(h: H, block: &[u8], out: &mut [IntChunk]);
}

macro_rules! unpackers {
    ($($name:ident: $fun:ident, $signed:expr, $offset:expr, $bytes:expr, $chunks:expr, $halves:expr;)*) => {$(
        #[doc = concat!("[`Unpack`] of ", stringify!($name), " blocks.")]
        #[allow(non_camel_case_types)]
        pub struct $name;
        impl Unpack for $name {
            const TYPE: GgmlType = GgmlType::$name;
            const SIGNED: bool = $signed;
            const OFFSET: i8 = $offset;
            const BLOCK_BYTES: usize = $bytes;
            const CHUNKS: usize = $chunks;
            const HALF_MAPS: bool = $halves;
            #[inline(always)]
            fn unpack<H: F16Reader>(h: H, block: &[u8], out: &mut [IntChunk]) {
                $fun(h, block, out)
            }
        }
    )*};
}

unpackers! {
    Q4_0: q4_0, false, 8, 18, 1, false;
    Q4_1: q4_1, false, 0, 20, 1, false;
    Q5_0: q5_0, false, 16, 22, 1, false;
    Q5_1: q5_1, false, 0, 24, 1, false;
    Q8_0: q8_0, true, 0, 34, 1, false;
    IQ4_NL: iq4_nl, true, 0, 18, 1, false;
    Q2_K: q2_k, false, 0, 84, 8, true;
    Q3_K: q3_k, false, 4, 110, 8, true;
    Q4_K: q4_k, false, 0, 144, 8, false;
    Q5_K: q5_k, false, 0, 176, 8, false;
    Q6_K: q6_k, false, 32, 210, 8, true;
    IQ4_XS: iq4_xs, true, 0, 136, 8, false;
}

/// Evaluates `$body` with the type `$u` bound to `$ty`'s [`Unpack`], or `$none` for a type that is not
/// block-quantized.
#[macro_export]
macro_rules! with_unpacker {
    ($ty:expr, |$u:ident| $body:expr, $none:expr) => {{
        use $crate::GgmlType as T;
        use $crate::unpack as u;
        match $ty {
            T::Q4_0 => {
                type $u = u::Q4_0;
                $body
            }
            T::Q4_1 => {
                type $u = u::Q4_1;
                $body
            }
            T::Q5_0 => {
                type $u = u::Q5_0;
                $body
            }
            T::Q5_1 => {
                type $u = u::Q5_1;
                $body
            }
            T::Q8_0 => {
                type $u = u::Q8_0;
                $body
            }
            T::IQ4_NL => {
                type $u = u::IQ4_NL;
                $body
            }
            T::Q2_K => {
                type $u = u::Q2_K;
                $body
            }
            T::Q3_K => {
                type $u = u::Q3_K;
                $body
            }
            T::Q4_K => {
                type $u = u::Q4_K;
                $body
            }
            T::Q5_K => {
                type $u = u::Q5_K;
                $body
            }
            T::Q6_K => {
                type $u = u::Q6_K;
                $body
            }
            T::IQ4_XS => {
                type $u = u::IQ4_XS;
                $body
            }
            T::F32 | T::F16 | T::Bf16 | T::Other(_) => $none,
        }
    }};
}

/// `(bytes[i] >> shift) & mask` for `8 N` bytes, eight at a time in `u64` words (SWAR: the bits a word's shift
/// moves in from the next byte lie above every field's mask, as `shift` plus the field's width is at most 8).
/// Word arithmetic needs no SIMD and stores the chunk in four writes rather than 32.
#[inline(always)]
fn fields<const N: usize>(bytes: &[u8], shift: u32, mask: u8) -> [u64; N] {
    let mask = u64::from_le_bytes([mask; 8]);
    let mut words = [0u64; N];
    for (word, b) in words.iter_mut().zip(bytes[..8 * N].chunks_exact(8)) {
        let b = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        *word = (u64::from_le_bytes(b) >> shift) & mask;
    }
    words
}

/// Writes 32 bytes given as four little-endian words.
#[inline(always)]
fn store(q: &mut [u8; CHUNK_LEN], words: [u64; 4]) {
    for (q, word) in q.chunks_exact_mut(8).zip(words) {
        q.copy_from_slice(&word.to_le_bytes());
    }
}

/// The nibbles of a 32-element legacy block (`qs[16]`) in element order: the low nibbles, then the high ones.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u64; 4] {
    let [a, b] = fields::<2>(qs, 0, 0x0F);
    let [c, d] = fields::<2>(qs, 4, 0x0F);
    [a, b, c, d]
}

/// `SPREAD[b]` has byte `i` equal to `0x10` where bit `i` of `b` is set: eight fifth bits at once.
const SPREAD: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            if (b >> i) & 1 == 1 {
                table[b] |= 0x10 << (8 * i);
            }
            i += 1;
        }
        b += 1;
    }
    table
};

/// Nibbles with bit `i` of the little-endian `qh` as bit 4 of element `i`.
#[inline(always)]
fn five_bits(qs: &[u8], qh: u32) -> [u64; 4] {
    let mut words = nibbles(qs);
    for (k, word) in words.iter_mut().enumerate() {
        *word |= SPREAD[((qh >> (8 * k)) & 0xFF) as usize];
    }
    words
}

/// Q4_0 `[d][qs: 16]`: `w = d * q - 8 d`.
#[inline(always)]
pub fn q4_0<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let d = h.f16(b, 0);
    store(&mut out[0].q, nibbles(&b[2..18]));
    out[0].set_map(d, -f32::from(Q4_0::OFFSET) * d);
}

/// Q4_1 `[d][m][qs: 16]`: `w = d * q + m`.
#[inline(always)]
pub fn q4_1<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    store(&mut out[0].q, nibbles(&b[4..20]));
    out[0].set_map(h.f16(b, 0), h.f16(b, 2));
}

/// Q5_0 `[d][qh: u32][qs: 16]`: `w = d * q - 16 d`.
#[inline(always)]
pub fn q5_0<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let d = h.f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    store(&mut out[0].q, five_bits(&b[6..22], qh));
    out[0].set_map(d, -f32::from(Q5_0::OFFSET) * d);
}

/// Q5_1 `[d][m][qh: u32][qs: 16]`: `w = d * q + m`.
#[inline(always)]
pub fn q5_1<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    store(&mut out[0].q, five_bits(&b[8..24], qh));
    out[0].set_map(h.f16(b, 0), h.f16(b, 2));
}

/// Q8_0 `[d][qs: i8 x 32]`, signed: `w = d * q`.
#[inline(always)]
pub fn q8_0<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    out[0].q.copy_from_slice(&b[2..34]);
    out[0].set_map(h.f16(b, 0), 0.0);
}

/// The signed IQ4 levels of the 16 index bytes `qs` (nibbles ordered as Q4_0's).
#[inline(always)]
fn iq4_levels(qs: &[u8], q: &mut [u8; CHUNK_LEN]) {
    for (i, q) in q.iter_mut().enumerate() {
        *q = IQ4_LEVELS[usize::from(nibble(qs, i))] as u8;
    }
}

/// IQ4_NL `[d][qs: 16]`, signed: `w = d * level`.
#[inline(always)]
pub fn iq4_nl<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    iq4_levels(&b[2..18], &mut out[0].q);
    out[0].set_map(h.f16(b, 0), 0.0);
}

/// Q2_K `[scales: 16][qs: 64][d][dmin]`: chunk `c` is bit pair `c % 4` of `qs[32 (c / 4)..][..32]`; 16-element
/// sub-block `s` maps `w = (d * (sc_s & 15)) * q - dmin * (sc_s >> 4)`.
#[inline(always)]
pub fn q2_k<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (h.f16(b, 80), h.f16(b, 82));
    for (c, chunk) in out[..8].iter_mut().enumerate() {
        let shift = 2 * (c % 4) as u32;
        store(&mut chunk.q, fields(&qs[32 * (c / 4)..], shift, 0x03));
        for half in 0..2 {
            let sc = scales[2 * c + half];
            chunk.scale[half] = d * f32::from(sc & 0x0F);
            chunk.min[half] = -(dmin * f32::from(sc >> 4));
        }
    }
}

/// Q3_K `[hmask: 32][qs: 64][scales: 12][d]`: chunk `c` takes bit pair `c % 4` of `qs[32 (c / 4)..][..32]` plus 4
/// where bit `c` of `hmask[l]` is set, so `q` is the reference's value plus 4: `w = scale_s * q - 4 scale_s`.
#[inline(always)]
pub fn q3_k<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = h.f16(b, 108);
    for (c, chunk) in out[..8].iter_mut().enumerate() {
        let low: [u64; 4] = fields(&qs[32 * (c / 4)..], 2 * (c % 4) as u32, 0x03);
        let high: [u64; 4] = fields(hmask, c as u32, 0x01);
        store(
            &mut chunk.q,
            std::array::from_fn(|k| low[k] | (high[k] << 2)),
        );
        for half in 0..2 {
            let scale = d * f32::from(q3_k_scale(scales, 2 * c + half) as i8 - 32);
            chunk.scale[half] = scale;
            chunk.min[half] = -f32::from(Q3_K::OFFSET) * scale;
        }
    }
}

/// Shared by Q4_K and Q5_K: sub-block `j`'s 6-bit `(sc, m)` from `[d][dmin][scales: 12]` make
/// `w = (d * sc) * q - dmin * m`; its integers are the low (even `j`) or high (odd) nibbles of
/// `qs[32 (j / 2)..][..32]`, plus, for Q5_K, bit `j` of `qh[l]` as bit 4.
#[inline(always)]
fn k4_family<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk], qs: &[u8], qh: Option<&[u8]>) {
    let (d, dmin) = (h.f16(b, 0), h.f16(b, 2));
    let scales = &b[4..16];
    for (j, chunk) in out[..8].iter_mut().enumerate() {
        let (sc, m) = scale_min_k4(scales, j);
        let low: [u64; 4] = fields(&qs[32 * (j / 2)..], 4 * (j % 2) as u32, 0x0F);
        let words = match qh {
            Some(qh) => {
                let high: [u64; 4] = fields(qh, j as u32, 0x01);
                std::array::from_fn(|k| low[k] | (high[k] << 4))
            }
            None => low,
        };
        store(&mut chunk.q, words);
        chunk.set_map(d * f32::from(sc), -(dmin * f32::from(m)));
    }
}

/// Q4_K `[d][dmin][scales: 12][qs: 128]`.
#[inline(always)]
pub fn q4_k<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    k4_family(h, b, out, &b[16..144], None);
}

/// Q5_K `[d][dmin][scales: 12][qh: 32][qs: 128]`.
#[inline(always)]
pub fn q5_k<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    k4_family(h, b, out, &b[48..176], Some(&b[16..48]));
}

/// Q6_K `[ql: 128][qh: 64][scales: i8 x 16][d]`: chunk `c` of half `h = c / 4` takes its low nibbles from
/// `ql[64 h + 32 ((c % 4) % 2)..][..32]` (the high nibbles for `c % 4 >= 2`) and its top bits from bit pair
/// `c % 4` of `qh[32 h..][..32]`; sub-block `s` maps `w = scale_s * q - 32 scale_s`, `scale_s = d * sc_s`.
#[inline(always)]
pub fn q6_k<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = h.f16(b, 208);
    for (c, chunk) in out[..8].iter_mut().enumerate() {
        let (h, k) = (c / 4, c % 4);
        let low: [u64; 4] = fields(&ql[64 * h + 32 * (k % 2)..], 4 * (k / 2) as u32, 0x0F);
        let high: [u64; 4] = fields(&qh[32 * h..], 2 * k as u32, 0x03);
        store(
            &mut chunk.q,
            std::array::from_fn(|i| low[i] | (high[i] << 4)),
        );
        for half in 0..2 {
            let scale = d * f32::from(scales[2 * c + half] as i8);
            chunk.scale[half] = scale;
            chunk.min[half] = -f32::from(Q6_K::OFFSET) * scale;
        }
    }
}

/// IQ4_XS `[d][scales_h: u16][scales_l: 4][qs: 128]`, signed: sub-block `s` of 32 is
/// `w = (d * (sc_s - 32)) * level` with the IQ4_NL levels of `qs[16 s..][..16]`.
#[inline(always)]
pub fn iq4_xs<H: F16Reader>(h: H, b: &[u8], out: &mut [IntChunk]) {
    let d = h.f16(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for (s, chunk) in out[..8].iter_mut().enumerate() {
        let low = (scales_l[s / 2] >> (4 * (s % 2))) & 0x0F;
        let high = ((scales_h >> (2 * s)) & 0x03) as u8;
        iq4_levels(&qs[16 * s..16 * s + 16], &mut chunk.q);
        chunk.set_map(d * f32::from((low | (high << 4)) as i8 - 32), 0.0);
    }
}
