//! Products with a weight kept as ggml blocks ([`GgmlMatrix`]) on burn-flex: the one room of the integer
//! products, and the dispatch between them.
//!
//! - [`decode`]: up to [`MAX_ROWS`] rows (a decode step), activations quantized to 8-bit chunks ([`q8`]) and
//!   dotted with the blocks in integers, as llama.cpp's `vec_dot` kernels do; on every x86 instruction set
//!   ([`crate::cpu::isa`]) and a portable one.
//! - [`prompt`]: from [`INTEGER_TILE_ROWS`] rows on CPUs with AVX-512 VNNI, register tiles of `vpdpbusd`, as
//!   llama.cpp's tiled products do.
//! - [`exact`]: f32 activations times the dequantized blocks, what [`GgmlProducts::Exact`] selects and
//!   everywhere the integer paths do not reach (prompts without VNNI); the oracle of the other two.
//!
//! `ggml_dense_many` takes several weights with one input (a layer's query, key and value; an MLP's gate and
//! up) where the tiles run: the input is quantized once and every product's channels go to the threads in one
//! hand-off.
//!
//! The setting comes from the layer ([`GgmlProducts`]), never from process-wide state.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;

use super::quantized::MAX_ROWS;
use super::{f32_slice, zeroed};
use crate::GgmlProducts;
use ember_ggml::GgmlMatrix;

mod decode;
mod exact;
#[cfg(target_arch = "x86_64")]
mod prompt;
mod q8;
#[cfg(test)]
mod tests;

/// `x` `[rows, cols]` times `weight` `[out, cols]` transposed, plus `bias` `[out]`, as `[rows, out]`; `None` for
/// inputs this kernel does not take (not 2-D, not contiguous f32, widths that do not match), which the caller
/// computes another way.
pub(crate) fn ggml_dense(
    x: &FlexTensor,
    weight: GgmlMatrix<'_>,
    bias: Option<&FlexTensor>,
    products: GgmlProducts,
) -> Option<FlexTensor> {
    let xs = x.layout().shape();
    let [out, cols] = weight.shape();
    if xs.num_dims() != 2 || xs[1] != cols || xs[0] == 0 {
        return None;
    }
    let rows = xs[0];
    let x = f32_slice(x)?;
    let bias = match bias {
        Some(b) if b.layout().shape().num_elements() != out => return None,
        Some(b) => Some(f32_slice(b)?),
        None => None,
    };
    let mut result = zeroed(Shape::from(vec![rows, out]));
    let dst = &mut result.storage_mut::<f32>()[..rows * out];
    let exact = products == GgmlProducts::Exact;
    let tiled =
        !exact && rows >= INTEGER_TILE_ROWS && integer_many_rows(x, rows, weight, bias, dst);
    if tiled {
        // Written by the integer tiles.
    } else if rows > MAX_ROWS {
        exact::many_rows(x, rows, weight, bias, dst);
    } else if exact {
        exact::few_rows(x, rows, weight, bias, dst);
    } else {
        decode::few_rows(x, rows, weight, bias, dst);
    }
    Some(result)
}

/// [`ggml_dense`] of several weights with one input (a layer's query, key and value projections), `None`
/// unless the integer tiles take them all ([`prompt::many_products`]: AVX-512 VNNI, at least
/// [`INTEGER_TILE_ROWS`] rows, the default products); the caller then runs [`ggml_dense`] per weight.
pub(crate) fn ggml_dense_many(
    x: &FlexTensor,
    weights: &[(GgmlMatrix<'_>, Option<&FlexTensor>)],
    products: GgmlProducts,
) -> Option<Vec<FlexTensor>> {
    let xs = x.layout().shape();
    let [_, cols] = weights.first()?.0.shape();
    if xs.num_dims() != 2
        || xs[1] != cols
        || xs[0] < INTEGER_TILE_ROWS
        || products == GgmlProducts::Exact
    {
        return None;
    }
    // Checked before the outputs are allocated: without the tiles (AVX2 CPUs) every call declines.
    if !integer_tiles_available() {
        return None;
    }
    let rows = xs[0];
    let x = f32_slice(x)?;
    // Widths and bias lengths are checked by the tiles, which write nothing when one does not fit.
    let biases = weights
        .iter()
        .map(|(_, bias)| bias.map(f32_slice).map_or(Some(None), |b| b.map(Some)))
        .collect::<Option<Vec<_>>>()?;
    let mut results: Vec<FlexTensor> = weights
        .iter()
        .map(|(w, _)| zeroed(Shape::from(vec![rows, w.shape()[0]])))
        .collect();
    let ran = integer_many_products(x, rows, weights, &biases, &mut results);
    ran.then_some(results)
}

/// The integer tiles of [`ggml_dense_many`] into `results`; whether they ran (nothing is written otherwise).
fn integer_many_products(
    x: &[f32],
    rows: usize,
    weights: &[(GgmlMatrix<'_>, Option<&FlexTensor>)],
    biases: &[Option<&[f32]>],
    results: &mut [FlexTensor],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut products: Vec<prompt::Product<'_>> = weights
            .iter()
            .zip(biases)
            .zip(results.iter_mut())
            .map(|(((weight, _), &bias), result)| {
                let out = weight.shape()[0];
                prompt::Product {
                    weight: *weight,
                    bias,
                    dst: &mut result.storage_mut::<f32>()[..rows * out],
                }
            })
            .collect();
        prompt::many_products(x, rows, &mut products)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, rows, weights, biases, results);
        false
    }
}

/// Rows from which the integer tiles ([`prompt`], where the CPU has AVX-512 VNNI) beat the decode
/// kernel, measured on batched decode steps of SmolLM2 at 2 threads (`ember bench --batch B`, docs/BENCHMARKS.md).
/// Since the tiles take every weight type on the unsigned side of `vpdpbusd` (no per-chunk sums of the signed
/// types) and keep two chains of sums, they win from 3 rows (step time at 4 rows: Q4_1 -26%, Q4_K_M -21%,
/// Q8_0 -15%, Q6_K -12%; at 3 rows Q4_1 -19%, Q4_K_M -14%, Q8_0 and Q6_K even); at 2 rows the decode kernel
/// wins by 10-20%, each weight block's unpacking serving too few rows.
const INTEGER_TILE_ROWS: usize = 3;

/// Whether the CPU has the integer tiles ([`prompt`]).
pub(crate) fn integer_tiles_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::isa::Vnni::detect().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The integer prompt path where the CPU has it ([`prompt`]); `false` (nothing written) elsewhere.
fn integer_many_rows(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        prompt::many_rows(x, rows, weight, bias, dst)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, rows, weight, bias, dst);
        false
    }
}
