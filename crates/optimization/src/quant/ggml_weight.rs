//! [`GgmlWeight`]: a weight matrix kept in the ggml block format it was stored in (a GGUF tensor's bytes), and
//! [`PackedWeight`], either kind of packed weight a source can hand over.

use ember_ggml::{GgmlMatrix, GgmlType};

use crate::error::QuantError;
use crate::quant::weight::QuantizedWeight;

/// A `[out_features, in_features]` weight held as ggml blocks of one [`GgmlType`], byte for byte as a GGUF file
/// stores it: row `r` (one output channel) is `in_features / block_len` blocks. Its values are ggml's
/// dequantization of those blocks ([`GgmlWeight::dequantize`], bit-exact with ggml's reference).
#[derive(Clone, Debug, PartialEq)]
pub struct GgmlWeight {
    ty: GgmlType,
    shape: [usize; 2],
    blocks: Vec<u8>,
}

impl GgmlWeight {
    /// The weight of `shape` in `blocks` of `ty`, after checking that `ty` is block-quantized
    /// ([`GgmlType::BLOCK_QUANTIZED`]), that `in_features` is a whole number of blocks and that `blocks` holds
    /// exactly the bytes the shape needs.
    pub fn new(ty: GgmlType, shape: [usize; 2], blocks: Vec<u8>) -> Result<Self, QuantError> {
        GgmlMatrix::new(ty, shape, &blocks).map_err(|reason| QuantError::GgmlBlocks { reason })?;
        Ok(Self { ty, shape, blocks })
    }

    /// The block type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// `[out_features, in_features]`.
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// The block bytes, `[out_features, row_bytes]` row-major.
    pub fn blocks(&self) -> &[u8] {
        &self.blocks
    }

    /// The weight as the kernels read it.
    pub fn matrix(&self) -> GgmlMatrix<'_> {
        // `new` checked exactly what `GgmlMatrix::new` checks, and nothing changes the fields afterwards.
        GgmlMatrix::new(self.ty, self.shape, &self.blocks)
            .unwrap_or_else(|reason| unreachable!("checked at construction: {reason}"))
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.matrix().row_bytes()
    }

    /// Bytes this weight occupies: its blocks, as in the file.
    pub fn storage_bytes(&self) -> usize {
        self.blocks.len()
    }

    /// Dequantizes rows `first..first + count` to a row-major `[count, in_features]` f32 matrix.
    ///
    /// # Panics
    /// If the rows are out of range.
    pub fn dequantize_rows(&self, first: usize, count: usize) -> Vec<f32> {
        assert!(
            first + count <= self.shape[0],
            "rows {first}..{} of a weight with {} rows",
            first + count,
            self.shape[0]
        );
        let mut out = vec![0f32; count * self.shape[1]];
        self.matrix().dequantize_rows(first, &mut out);
        out
    }

    /// Dequantizes the whole weight to a row-major `[out_features, in_features]` f32 matrix.
    pub fn dequantize(&self) -> Vec<f32> {
        self.dequantize_rows(0, self.shape[0])
    }
}

/// A weight a source hands over already packed: ember's INT8/INT4 groups or ggml blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum PackedWeight {
    /// Codes and per-group scales in ember's layout ([`QuantizedWeight`]).
    Codes(QuantizedWeight),
    /// ggml blocks as stored ([`GgmlWeight`]).
    Ggml(GgmlWeight),
}

impl PackedWeight {
    /// `[out_features, in_features]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            PackedWeight::Codes(w) => w.shape(),
            PackedWeight::Ggml(w) => w.shape(),
        }
    }
}
