//! [`GgmlMatrix`]: a borrowed `[rows, cols]` matrix of ggml blocks, the form the product kernels read.

use super::{GgmlType, dequantize_block};

/// A row-major `[rows, cols]` matrix (one row per output channel) stored as ggml blocks: row `r` is
/// `cols / block_len` whole blocks at bytes `r * row_bytes..(r + 1) * row_bytes`, exactly as in a GGUF file.
///
/// Only [`GgmlMatrix::new`] builds one, after checking the type, the shape and the byte length, so the kernels
/// index it without further checks.
#[derive(Clone, Copy, Debug)]
pub struct GgmlMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    blocks: &'a [u8],
}

impl<'a> GgmlMatrix<'a> {
    /// A view of `blocks` as a `[rows, cols]` matrix of `ty`, or the reason it is not one: a type that is not
    /// block-quantized, `cols` not a positive multiple of the block length, or a byte length other than
    /// `rows * cols / block_len * block_bytes`.
    pub fn new(ty: GgmlType, [rows, cols]: [usize; 2], blocks: &'a [u8]) -> Result<Self, String> {
        let Some((block_len, block_bytes)) =
            ty.block_geometry().filter(|_| ty.is_block_quantized())
        else {
            return Err(format!(
                "{ty} is not a block-quantized type (one of {})",
                list(&GgmlType::BLOCK_QUANTIZED)
            ));
        };
        if rows == 0 || cols == 0 || !cols.is_multiple_of(block_len) {
            return Err(format!(
                "{rows} x {cols}: columns must be a positive multiple of the {ty} block length {block_len}"
            ));
        }
        // The shape may come from a file: a product that overflows is as wrong as one that does not match.
        let expected = rows
            .checked_mul(cols / block_len)
            .and_then(|n| n.checked_mul(block_bytes));
        match expected {
            Some(expected) if expected == blocks.len() => Ok(Self {
                ty,
                rows,
                cols,
                blocks,
            }),
            Some(expected) => Err(format!(
                "{rows} x {cols} {ty} takes {expected} bytes ({block_bytes} per block of {block_len}), got {}",
                blocks.len()
            )),
            None => Err(format!(
                "{rows} x {cols} {ty} elements overflow the address space"
            )),
        }
    }

    /// The block type.
    #[inline]
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// `[rows, cols]`.
    #[inline]
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// `(elements, bytes)` of one block.
    #[inline]
    pub fn block_geometry(&self) -> (usize, usize) {
        // `new` accepted only types with a geometry.
        self.ty.block_geometry().unwrap_or((1, 1))
    }

    /// Bytes of one row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        let (block_len, block_bytes) = self.block_geometry();
        self.cols / block_len * block_bytes
    }

    /// All the block bytes, `[rows, row_bytes]`.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.blocks
    }

    /// The blocks of row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        let n = self.row_bytes();
        &self.blocks[r * n..(r + 1) * n]
    }

    /// Dequantizes rows `first..first + out.len() / cols` into `out` (row-major), bit for bit as ggml does.
    ///
    /// Inlined into the caller's crate: ember-attention's prompt path calls it inside its AVX2 switch
    /// (`vectorized!`), which vectorises only what is inlined into it.
    #[inline]
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) {
        let (block_len, block_bytes) = self.block_geometry();
        for (r, out) in out.chunks_exact_mut(self.cols).enumerate() {
            let blocks = self.row(first + r).chunks_exact(block_bytes);
            for (block, out) in blocks.zip(out.chunks_exact_mut(block_len)) {
                dequantize_block(self.ty, block, out);
            }
        }
    }
}

fn list(types: &[GgmlType]) -> String {
    types
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
