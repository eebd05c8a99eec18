//! The integer decode path of ggml-packed weights against the f64 product of the dequantized weights, for every
//! packed type: exact (up to f32 rounding) when the activations lie on the 8-bit grid, within the activation
//! rounding's bound otherwise, the AVX2 path against the portable one, and a row alone against the same row in
//! a batch.

use crate::cpu::ggml::decode::{few_rows, few_rows_portable};
use crate::cpu::ggml::q8::{Q8Chunk, quantize};
use crate::cpu::tests::values;
use ember_ggml::unpack::{CHUNK_LEN, IntChunk, SoftF16, Unpack};
use ember_ggml::with_unpacker;
use ember_ggml::{GgmlMatrix, GgmlType, dequantize};

/// Byte offsets of each block's f16 fields (ggml's block structs), which random bytes must not make NaN.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// `[out, cols]` random valid blocks of `ty`: every integer field random, f16 fields finite.
pub(super) fn random_blocks(ty: GgmlType, [out, cols]: [usize; 2], seed: u64) -> Vec<u8> {
    let (block_len, block_bytes) = ty.block_geometry().unwrap();
    let n = out * cols / block_len;
    let mut blocks: Vec<u8> = values(n * block_bytes, seed, 1.0)
        .into_iter()
        .map(|v| ((v + 1.0) * 127.99) as u8)
        .collect();
    let scales = values(n * 2, seed + 1, 0.1);
    for (b, block) in blocks.chunks_exact_mut(block_bytes).enumerate() {
        for (k, &at) in f16_fields(ty).iter().enumerate() {
            let value = half::f16::from_f32(scales[2 * b + k]);
            block[at..at + 2].copy_from_slice(&value.to_le_bytes());
        }
    }
    blocks
}

/// Every chunk of `weight` as the kernel sees it, `[out, cols / 32]`.
fn chunks_of(weight: GgmlMatrix<'_>) -> Vec<IntChunk> {
    let [out, cols] = weight.shape();
    let (block_len, block_bytes) = weight.block_geometry();
    let mut chunks = vec![IntChunk::default(); out * cols / CHUNK_LEN];
    let per_block = block_len / CHUNK_LEN;
    for (block, chunks) in weight
        .bytes()
        .chunks_exact(block_bytes)
        .zip(chunks.chunks_exact_mut(per_block))
    {
        with_unpacker!(weight.ty(), |U| U::unpack(SoftF16, block, chunks), ());
    }
    chunks
}

/// Per output: the exact `x W^T + b` in f64, the activation rounding's bound `Σ_i |w_i| d_i / 2`, and the f32
/// rounding bound of the kernel's arithmetic. The integer sums are exact; each chunk adds its two halves through
/// about eight f32 roundings (the maps `d * sc` and `dmin * m`, the scale times the activation scale, the
/// multiply-adds, the minimum terms) on terms bounded by `T = Σ_h |scale_h| Σ |q x| + |min_h| Σ |x|` (the offset
/// moved into the minimum can make `T` a few times `Σ |w x|`), and the chunk sums accumulate over `cols / 32`
/// chunks: `(cols / 32 + 16) * eps * T` covers both with room (eps is twice the unit roundoff).
pub(super) fn reference(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
) -> Vec<(f64, f64, f64)> {
    let [out, cols] = weight.shape();
    let w = dequantize(weight.ty(), weight.bytes()).unwrap();
    let chunks = chunks_of(weight);
    let signed = with_unpacker!(weight.ty(), |U| U::SIGNED, unreachable!());
    let mut result = Vec::new();
    for row in x.chunks_exact(cols).take(rows) {
        let scales: Vec<f64> = row
            .chunks_exact(CHUNK_LEN)
            .map(|c| f64::from(c.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0))
            .collect();
        for o in 0..out {
            let w = &w[o * cols..(o + 1) * cols];
            let b = bias.map_or(0.0, |b| f64::from(b[o]));
            let exact = row
                .iter()
                .zip(w)
                .map(|(&x, &w)| f64::from(x) * f64::from(w))
                .sum::<f64>()
                + b;
            let activation = w
                .iter()
                .enumerate()
                .map(|(i, &w)| f64::from(w).abs() * scales[i / CHUNK_LEN] / 2.0)
                .sum::<f64>();
            let mut terms = b.abs();
            for (c, chunk) in chunks[o * cols / CHUNK_LEN..(o + 1) * cols / CHUNK_LEN]
                .iter()
                .enumerate()
            {
                for (i, &q) in chunk.q.iter().enumerate() {
                    let q = if signed {
                        f64::from(q as i8)
                    } else {
                        f64::from(q)
                    };
                    let x = f64::from(row[c * CHUNK_LEN + i]).abs();
                    let h = i / 16;
                    terms += (f64::from(chunk.scale[h]) * q).abs() * x
                        + f64::from(chunk.min[h]).abs() * x;
                }
            }
            let rounding = (cols / CHUNK_LEN + 16) as f64 * f64::from(f32::EPSILON) * terms;
            result.push((exact, activation, rounding));
        }
    }
    result
}

/// Activations whose chunks are exact on the 8-bit grid: `q / 16` with `|q| <= 127` and each chunk's first value
/// `±127 / 16`, so the chunk scale is `1 / 16` and quantizing them loses nothing.
pub(super) fn on_grid(n: usize, seed: u64) -> Vec<f32> {
    values(n, seed, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let q = if i % CHUNK_LEN == 0 {
                if v < 0.0 { -127.0 } else { 127.0 }
            } else {
                (v * 127.0).round()
            };
            q / 16.0
        })
        .collect()
}

/// A decode-path kernel's signature.
pub(super) type Kernel = fn(&[f32], usize, GgmlMatrix<'_>, Option<&[f32]>, &mut [f32]);

pub(super) fn product(
    kernel: Kernel,
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let [out, _] = weight.shape();
    let mut y = vec![f32::NAN; rows * out];
    kernel(x, rows, weight, bias, &mut y);
    y
}

// 130 output channels: three parallel tasks, the last partial. 512 columns: two K-quant super-blocks, sixteen
// legacy blocks (two spans of eight).
pub(super) const SHAPE: [usize; 2] = [130, 512];

#[test]
fn on_grid_activations_make_the_integer_path_exact_up_to_f32_rounding() {
    let [out, cols] = SHAPE;
    for (t, ty) in GgmlType::BLOCK_QUANTIZED.into_iter().enumerate() {
        let blocks = random_blocks(ty, SHAPE, 100 + t as u64);
        let weight = GgmlMatrix::new(ty, SHAPE, &blocks).unwrap();
        let bias = values(out, 7, 1.0);
        // 1: a single row; 6: a group of four and two single rows.
        for (rows, bias) in [(1, None), (6, Some(&bias[..]))] {
            let x = on_grid(rows * cols, 3 + rows as u64);
            let reference = reference(&x, rows, weight, bias);
            let kernels: [(&str, Kernel); 2] =
                [("native", few_rows), ("portable", few_rows_portable)];
            for (path, kernel) in kernels {
                let y = product(kernel, &x, rows, weight, bias);
                for (i, (&y, &(exact, _, rounding))) in y.iter().zip(&reference).enumerate() {
                    assert!(
                        (f64::from(y) - exact).abs() <= rounding,
                        "{ty} {path} rows={rows} element {i}: {y} vs {exact} (tolerance {rounding})"
                    );
                }
            }
        }
    }
}

#[test]
fn off_grid_activations_stay_within_the_bound_of_their_rounding() {
    let [_, cols] = SHAPE;
    let rows = 5;
    for (t, ty) in GgmlType::BLOCK_QUANTIZED.into_iter().enumerate() {
        let blocks = random_blocks(ty, SHAPE, 200 + t as u64);
        let weight = GgmlMatrix::new(ty, SHAPE, &blocks).unwrap();
        let x = values(rows * cols, 11 + t as u64, 2.0);
        let reference = reference(&x, rows, weight, None);
        let y = product(few_rows, &x, rows, weight, None);
        let mut worst = 0f64;
        for (i, (&y, &(exact, activation, rounding))) in y.iter().zip(&reference).enumerate() {
            let error = (f64::from(y) - exact).abs();
            assert!(
                error <= activation + rounding,
                "{ty} element {i}: {y} vs {exact} (bound {activation} + {rounding})"
            );
            worst = worst.max(error / activation);
        }
        // The bound is the worst case (every rounding one way); random roundings cancel. A kernel that ignored
        // part of the activation rounding's structure, or the bound itself if it were vacuous, shows here.
        assert!(
            worst < 0.5,
            "{ty}: errors reach {worst} of the bound, which random rounding should not"
        );
    }
}

/// Every instruction set of the decode path against the portable one, each on the CPU that has it: the native
/// path takes the best one, so the others would go untested on a CPU with AVX-512 VNNI.
#[cfg(target_arch = "x86_64")]
#[test]
fn each_instruction_set_agrees_with_the_portable_path() {
    use crate::cpu::ggml::decode::few_rows_with;
    use crate::cpu::isa::{Avx2, AvxVnni, Vnni};
    let [out, cols] = SHAPE;
    let rows = 5;
    let (avx2, vnni, avx_vnni) = (Avx2::detect(), Vnni::detect(), AvxVnni::detect());
    if avx2.is_none() {
        eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
        return;
    }
    if vnni.is_none() {
        eprintln!("AVX-512 VNNI not checked: this CPU lacks it");
    }
    if avx_vnni.is_none() {
        eprintln!("AVX-VNNI not checked: this CPU lacks it");
    }
    for (t, ty) in GgmlType::BLOCK_QUANTIZED.into_iter().enumerate() {
        let blocks = random_blocks(ty, SHAPE, 800 + t as u64);
        let weight = GgmlMatrix::new(ty, SHAPE, &blocks).unwrap();
        let x = values(rows * cols, 51 + t as u64, 1.0);
        let portable = product(few_rows_portable, &x, rows, weight, None);
        let reference = reference(&x, rows, weight, None);
        let mut paths: Vec<(&str, Vec<f32>)> = Vec::new();
        if let Some(avx2) = avx2 {
            let mut y = vec![f32::NAN; rows * out];
            few_rows_with(avx2, &x, rows, weight, None, &mut y);
            paths.push(("avx2", y));
        }
        if let Some(vnni) = vnni {
            let mut y = vec![f32::NAN; rows * out];
            few_rows_with(vnni, &x, rows, weight, None, &mut y);
            paths.push(("avx512-vnni", y));
        }
        if let Some(vnni) = avx_vnni {
            let mut y = vec![f32::NAN; rows * out];
            few_rows_with(vnni, &x, rows, weight, None, &mut y);
            paths.push(("avx-vnni", y));
        }
        for (path, y) in paths {
            for (i, ((&a, &p), &(_, _, rounding))) in
                y.iter().zip(&portable).zip(&reference).enumerate()
            {
                // The same exact integers; only the f32 order of the per-half terms differs.
                assert!(
                    (f64::from(a) - f64::from(p)).abs() <= 2.0 * rounding,
                    "{ty} {path} element {i}: {a} vs portable {p}"
                );
            }
        }
    }
}

#[test]
fn the_native_path_agrees_with_the_portable_one_and_a_row_is_the_same_alone_and_in_a_batch() {
    let [out, cols] = SHAPE;
    let rows = 7;
    for (t, ty) in GgmlType::BLOCK_QUANTIZED.into_iter().enumerate() {
        let blocks = random_blocks(ty, SHAPE, 300 + t as u64);
        let weight = GgmlMatrix::new(ty, SHAPE, &blocks).unwrap();
        let x = values(rows * cols, 21 + t as u64, 1.0);
        let batch = product(few_rows, &x, rows, weight, None);
        let portable = product(few_rows_portable, &x, rows, weight, None);
        let reference = reference(&x, rows, weight, None);
        for (i, ((&a, &p), &(_, _, rounding))) in
            batch.iter().zip(&portable).zip(&reference).enumerate()
        {
            // Both sum the same exact integers; only the f32 order of the per-half terms differs.
            assert!(
                (f64::from(a) - f64::from(p)).abs() <= 2.0 * rounding,
                "{ty} element {i}: native {a} vs portable {p}"
            );
        }
        for r in 0..rows {
            let alone = product(few_rows, &x[r * cols..(r + 1) * cols], 1, weight, None);
            assert_eq!(
                alone[..],
                batch[r * out..(r + 1) * out],
                "{ty} row {r} differs alone and in a batch of {rows}"
            );
        }
    }
}

/// The AVX2 path's own loads of one-chunk blocks (straight from the bytes into registers) against unpacking
/// through memory, for every one-chunk type: the same bits in every register, except that Q4_0 and Q5_0 load
/// signed, their integers moved by the offset (8, 16) that unpacking keeps in the minimum, with the same scale.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_block_loads_equal_unpacking_through_memory() {
    use crate::cpu::ggml::decode::Dot;
    use crate::cpu::isa::Avx2;
    use ember_ggml::unpack::Unpack;
    let Some(avx2) = Avx2::detect() else {
        eprintln!("skipped: this CPU lacks AVX2, FMA or F16C, so the AVX2 loads never run here");
        return;
    };
    /// `[bytes, signs, scale, min]` of the chunk as unpacking makes it.
    fn through_memory<U: Unpack>(avx2: Avx2, block: &[u8]) -> [[u32; 8]; 4] {
        let mut chunk = [IntChunk::default()];
        U::unpack(SoftF16, block, &mut chunk);
        let w = if U::SIGNED {
            avx2.prepare::<true>(&chunk[0])
        } else {
            avx2.prepare::<false>(&chunk[0])
        };
        w.lanes()
    }
    /// The 32 integers a chunk's registers stand for: the sign bytes when signed (whose magnitudes must be the
    /// multiplied bytes), else the bytes.
    fn integers([bytes, signs, ..]: [[u32; 8]; 4], signed: bool) -> Vec<i32> {
        let le = |w: [u32; 8]| w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (bytes, signs) = (le(bytes), le(signs));
        if signed {
            for (&b, &s) in bytes.iter().zip(&signs) {
                assert_eq!(b, (s as i8).unsigned_abs(), "a signed chunk multiplies |q|");
            }
            signs.iter().map(|&s| i32::from(s as i8)).collect()
        } else {
            assert_eq!(bytes, signs);
            bytes.iter().map(|&b| i32::from(b)).collect()
        }
    }
    let mut checked = 0;
    for (t, ty) in GgmlType::BLOCK_QUANTIZED.into_iter().enumerate() {
        let (block_len, block_bytes) = ty.block_geometry().unwrap();
        if block_len != CHUNK_LEN {
            continue;
        }
        let blocks = random_blocks(ty, [4, 8 * CHUNK_LEN], 500 + t as u64);
        for (b, block) in blocks.chunks_exact(block_bytes).enumerate() {
            let (direct, unpacked, signed, own_sign) = with_unpacker!(
                ty,
                |U| (
                    avx2.load::<U>(block).lanes(),
                    through_memory::<U>(avx2, block),
                    avx2.signed::<U>(),
                    U::SIGNED
                ),
                unreachable!("{ty} is block-quantized")
            );
            // The unpackers build their minimum from `U::OFFSET` (`-OFFSET * scale`), and the on- and off-grid
            // tests check the unpacked weights against ggml's dequantization, so a wrong offset fails there.
            let offset = with_unpacker!(ty, |U| i32::from(U::OFFSET), 0);
            assert_eq!(signed, own_sign || offset != 0, "{ty}: signedness");
            if offset == 0 {
                assert_eq!(
                    direct, unpacked,
                    "{ty} block {b}: [bytes, signs, scale, min]"
                );
            } else {
                let moved: Vec<i32> = integers(unpacked, false)
                    .iter()
                    .map(|q| q - offset)
                    .collect();
                assert_eq!(integers(direct, true), moved, "{ty} block {b}: integers");
                assert_eq!(direct[2], unpacked[2], "{ty} block {b}: scale");
                assert_eq!(
                    direct[3], [0; 8],
                    "{ty} block {b}: a signed chunk has no minimum"
                );
            }
            checked += 1;
        }
    }
    // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL, 32 blocks each.
    assert_eq!(checked, 6 * 32);
}

#[test]
fn activation_chunks_round_to_nearest_within_half_their_scale() {
    let mut x = values(4 * CHUNK_LEN, 5, 3.0);
    x[CHUNK_LEN..2 * CHUNK_LEN].fill(0.0);
    x[2 * CHUNK_LEN + 3] = f32::NAN;
    let mut chunks = vec![Q8Chunk::default(); 4];
    quantize(&x, &mut chunks);
    for (c, (chunk, x)) in chunks.iter().zip(x.chunks_exact(CHUNK_LEN)).enumerate() {
        let amax = x
            .iter()
            .filter(|v| !v.is_nan())
            .fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(chunk.d, amax / 127.0, "chunk {c}");
        for (i, (&q, &v)) in chunk.q.iter().zip(x).enumerate() {
            assert!(q != i8::MIN, "chunk {c} value {i} is -128");
            if v.is_nan() {
                assert_eq!(q, 0, "a NaN activation counts as zero");
                continue;
            }
            let error = (f64::from(v) - f64::from(chunk.d) * f64::from(q)).abs();
            // Half a step, plus f32 rounding of `v / d` (relative eps of the value).
            let bound = f64::from(chunk.d) / 2.0 * (1.0 + 1e-5) + 1e-6 * f64::from(v.abs());
            assert!(
                error <= bound,
                "chunk {c} value {i}: {v} as {q} x {}",
                chunk.d
            );
        }
        for h in 0..2 {
            let sum: i32 = chunk.q[16 * h..16 * h + 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            assert_eq!(chunk.sums[h], chunk.d * sum as f32, "chunk {c} half {h}");
        }
    }
    assert_eq!(chunks[1].d, 0.0);
    assert!(chunks[1].q.iter().all(|&q| q == 0));
}

#[test]
fn every_unpacker_has_its_types_geometry() {
    for ty in GgmlType::BLOCK_QUANTIZED {
        let geometry = with_unpacker!(ty, |U| Some((U::CHUNKS * CHUNK_LEN, U::BLOCK_BYTES)), None);
        assert_eq!(geometry, ty.block_geometry(), "{ty}");
    }
}

#[test]
fn channels_split_into_equal_tasks_in_a_multiple_of_the_threads() {
    use crate::cpu::ggml::decode::split;
    for threads in 1..=8 {
        for out in [1, 7, 64, 192, 576, 1536, 2048, 49152, 151_936] {
            let (tasks, per_task) = split(out, threads);
            // Every channel in exactly one task, no task empty.
            assert!(
                tasks * per_task >= out && (tasks - 1) * per_task < out,
                "{out} on {threads}"
            );
            if out >= 64 * threads {
                assert!(
                    per_task <= 64,
                    "{out} on {threads}: {per_task} channels a task"
                );
                // Few tasks (a decode step's projections): the same number for every thread. Many (an LM head):
                // rounding may leave a few threads one task short, under 1% of the work.
                let short = tasks.div_ceil(threads) * threads - tasks;
                if tasks < 16 * threads {
                    assert_eq!(
                        short, 0,
                        "{out} channels on {threads} threads: {tasks} tasks"
                    );
                } else {
                    assert!(short * 100 < tasks, "{out} on {threads}: {tasks} tasks");
                }
            }
        }
    }
}
