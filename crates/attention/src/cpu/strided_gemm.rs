//! The strided `gemm` the flash kernels call per block, and its path for a few rows.
//!
//! A decode step's attention is one query row per head: `1 x 64` times `64 x keys` for the scores and
//! `1 x keys` times `keys x 64` for the output. Through the `gemm` crate those two calls per head and layer
//! cost its dispatch and packing each time (3.8% of a SmolLM2 decode step's samples, on the thread every
//! product waits for); up to [`SMALL_ROWS`] rows are plain vectorised dot products or row updates instead.

use super::simd::vectorized;

/// Rows up to which [`gemm`] takes plain loops (decode and short blocks), where the operands allow.
pub(super) const SMALL_ROWS: usize = 4;

/// One call's operands, as [`gemm`] takes them.
struct Operands<'a> {
    dims: (usize, usize, usize),
    dst_strides: (usize, usize),
    lhs: &'a [f32],
    lhs_strides: (usize, usize),
    rhs: &'a [f32],
    rhs_strides: (usize, usize),
    alpha: f32,
    accumulate: bool,
}

/// `Σ a[i] b[i]` in eight lanes, so that the loop vectorises, the lanes added by [`lane_sum`] and then the
/// terms past the last whole chunk of eight. The paged attention kernel's AVX2 scores compute exactly this
/// ([`super::paged`]), eight keys at a time.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = dot_tail(ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lane_sum(lanes) + tail
}

/// The eight lanes of a [`dot`] added as a tree: what two horizontal adds and a half swap give in AVX2.
#[inline(always)]
pub(super) fn lane_sum(l: [f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// The last `a.len() < 8` terms of a [`dot`], one after another.
#[inline(always)]
pub(super) fn dot_tail(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |sum, (x, y)| sum + x * y)
}

/// [`gemm`] by plain loops when a row of `lhs` and a column of `rhs` are both contiguous (dot products: the
/// scores) or the rows of `rhs` and `dst` are (row updates: the weighted values); `false`, touching nothing,
/// for other layouts. The caller checked every index against the slices.
#[inline(always)]
fn small_rows(o: &Operands<'_>, dst: &mut [f32]) -> bool {
    let (m, n, k) = o.dims;
    let ((dst_rs, dst_cs), (lhs_rs, lhs_cs), (rhs_rs, rhs_cs)) =
        (o.dst_strides, o.lhs_strides, o.rhs_strides);
    if lhs_cs == 1 && rhs_rs == 1 {
        for r in 0..m {
            let a = &o.lhs[r * lhs_rs..][..k];
            for j in 0..n {
                let v = o.alpha * dot(a, &o.rhs[j * rhs_cs..][..k]);
                let d = &mut dst[r * dst_rs + j * dst_cs];
                *d = if o.accumulate { *d + v } else { v };
            }
        }
        true
    } else if rhs_cs == 1 && dst_cs == 1 {
        for r in 0..m {
            let row = &mut dst[r * dst_rs..][..n];
            if !o.accumulate {
                row.fill(0.0);
            }
            for t in 0..k {
                let a = o.alpha * o.lhs[r * lhs_rs + t * lhs_cs];
                for (d, &b) in row.iter_mut().zip(&o.rhs[t * rhs_rs..][..n]) {
                    *d += a * b;
                }
            }
        }
        true
    } else {
        false
    }
}

/// `dst[m x n] (+)= alpha * lhs[m x k] · rhs[k x n]`, single-threaded, every operand given by (row, column)
/// strides. With `accumulate`, `dst` is added to instead of overwritten.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    lhs: &[f32],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[f32],
    (rhs_rs, rhs_cs): (usize, usize),
    alpha: f32,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(dst.len() > last(m, n, dst_rs, dst_cs));
    if k > 0 {
        assert!(lhs.len() > last(m, k, lhs_rs, lhs_cs) && rhs.len() > last(k, n, rhs_rs, rhs_cs));
    }
    let operands = Operands {
        dims: (m, n, k),
        dst_strides: (dst_rs, dst_cs),
        lhs,
        lhs_strides: (lhs_rs, lhs_cs),
        rhs,
        rhs_strides: (rhs_rs, rhs_cs),
        alpha,
        accumulate,
    };
    if m <= SMALL_ROWS && vectorized!(small_rows(&operands, dst)) {
        return;
    }
    // SAFETY: the asserts above keep every element gemm touches inside the three slices; `dst` is borrowed
    // mutably, so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `out` refilled as a row-major `[m, n]` block holding `alpha * lhs[m x k] · rhs[k x n]` (its allocation is
/// reused from block to block).
pub(super) fn gemm_fresh(
    (m, n, k): (usize, usize, usize),
    out: &mut Vec<f32>,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
    alpha: f32,
) {
    out.clear();
    out.resize(m * n, 0.0);
    gemm(
        (m, n, k),
        out,
        (n, 1),
        lhs,
        lhs_strides,
        rhs,
        rhs_strides,
        alpha,
        false,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                    / (1 << 24) as f32
                    - 0.5
            })
            .collect()
    }

    /// The plain-loop path against a float64 sum over the same strided operands, both layouts it takes, with and
    /// without accumulation; a layout it does not take is left to the `gemm` crate.
    #[test]
    fn a_few_rows_match_the_float64_product_in_both_layouts() {
        let (m, n, k) = (3, 37, 70);
        // (lhs strides, rhs strides, dst strides): scores-like, values-like, and one for the gemm crate.
        let layouts = [
            ((k + 5, 1), (1, k + 3), (n + 2, 1)),
            ((k, 1), (n + 4, 1), (n, 1)),
            ((1, m), (n, 1), (1, m)),
        ];
        for (case, &(ls, rs, ds)) in layouts.iter().enumerate() {
            let lhs = values((m - 1) * ls.0 + (k - 1) * ls.1 + 1, 1 + case as u32);
            let rhs = values((k - 1) * rs.0 + (n - 1) * rs.1 + 1, 7 + case as u32);
            let start = values((m - 1) * ds.0 + (n - 1) * ds.1 + 1, 13);
            let operands = Operands {
                dims: (m, n, k),
                dst_strides: ds,
                lhs: &lhs,
                lhs_strides: ls,
                rhs: &rhs,
                rhs_strides: rs,
                alpha: 0.75,
                accumulate: false,
            };
            let mut probe = start.clone();
            assert_eq!(small_rows(&operands, &mut probe), case < 2, "layout {case}");
            for accumulate in [false, true] {
                let mut dst = start.clone();
                gemm(
                    (m, n, k),
                    &mut dst,
                    ds,
                    &lhs,
                    ls,
                    &rhs,
                    rs,
                    0.75,
                    accumulate,
                );
                for r in 0..m {
                    for j in 0..n {
                        let exact: f64 = (0..k)
                            .map(|t| {
                                f64::from(lhs[r * ls.0 + t * ls.1])
                                    * f64::from(rhs[t * rs.0 + j * rs.1])
                            })
                            .sum::<f64>()
                            * 0.75
                            + if accumulate {
                                f64::from(start[r * ds.0 + j * ds.1])
                            } else {
                                0.0
                            };
                        let got = f64::from(dst[r * ds.0 + j * ds.1]);
                        // 70 products of magnitude <= 0.25 summed in f32: a few ulp of the sum of magnitudes.
                        assert!(
                            (got - exact).abs() <= 1e-5,
                            "layout {case} acc {accumulate} [{r},{j}]: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}
