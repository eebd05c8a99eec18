//! Host-side quantized weight matrices: quantize, pack, unpack and dequantize in pure Rust.

use crate::error::QuantError;
use crate::quant::scheme::QuantScheme;

/// A `[out_features, in_features]` weight quantized with a [`QuantScheme`], held on the host.
///
/// Layout (also the on-disk layout):
/// - `codes`: row-major, each row padded to `groups_per_row * group_len` codes (padding codes
///   dequantize to garbage and are never read back), packed `8 / bits` codes per byte; for INT4
///   byte `j` holds code `2j` in its low nibble and code `2j + 1` in its high nibble.
/// - `scales`: `[out_features, groups_per_row]` f32.
/// - `mins`: `[out_features, groups_per_row]` f32, asymmetric schemes only.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedWeight {
    scheme: QuantScheme,
    shape: [usize; 2],
    codes: Vec<u8>,
    scales: Vec<f32>,
    mins: Option<Vec<f32>>,
}

impl QuantizedWeight {
    /// Quantizes a row-major `[out_features, in_features]` f32 matrix (PyTorch / GGUF orientation:
    /// one row per output channel).
    ///
    /// Each group's codes are the round-to-nearest of `w / s` (symmetric) or `(w - m) / s`
    /// (asymmetric), so every element satisfies `|w - dequantize(w)| <= s / 2` up to f32 rounding.
    pub fn quantize(
        weights: &[f32],
        shape: [usize; 2],
        scheme: QuantScheme,
    ) -> Result<Self, QuantError> {
        let [rows, cols] = shape;
        scheme.validate(rows, cols)?;
        check_len("weights", rows * cols, weights.len())?;
        if let Some(pos) = weights.iter().position(|w| !w.is_finite()) {
            return Err(QuantError::NonFinite {
                row: pos / cols,
                col: pos % cols,
                value: weights[pos],
            });
        }
        let group = scheme.group_len(cols);
        let groups = scheme.groups_per_row(cols);
        let padded = groups * group;
        let mut codes = vec![0u8; rows * padded];
        let mut scales = Vec::with_capacity(rows * groups);
        let mut mins = scheme
            .is_asymmetric()
            .then(|| Vec::with_capacity(rows * groups));
        for (row, row_weights) in weights.chunks_exact(cols).enumerate() {
            for (g, chunk) in row_weights.chunks(group).enumerate() {
                let out = &mut codes[row * padded + g * group..][..chunk.len()];
                match (&mut mins, scheme.zero_code()) {
                    (None, Some(zero)) => {
                        scales.push(quantize_symmetric(chunk, scheme, zero, out));
                    }
                    (Some(mins), _) => {
                        let (scale, min) = quantize_asymmetric(chunk, scheme.max_code(), out);
                        scales.push(scale);
                        mins.push(min);
                    }
                    (None, None) => unreachable!("asymmetric schemes always carry mins"),
                }
            }
        }
        Ok(Self {
            scheme,
            shape,
            codes: pack(&codes, scheme.bits()),
            scales,
            mins,
        })
    }

    /// Assembles a weight from already-packed codes and per-group parameters (the layout
    /// documented on [`QuantizedWeight`]), validating every length and code range.
    pub fn from_parts(
        scheme: QuantScheme,
        shape: [usize; 2],
        codes: Vec<u8>,
        scales: Vec<f32>,
        mins: Option<Vec<f32>>,
    ) -> Result<Self, QuantError> {
        let [rows, cols] = shape;
        scheme.validate(rows, cols)?;
        let groups = scheme.groups_per_row(cols);
        check_len("packed codes", rows * row_bytes(scheme, cols), codes.len())?;
        check_len("scales", rows * groups, scales.len())?;
        match (&mins, scheme.is_asymmetric()) {
            (Some(mins), true) => check_len("mins", rows * groups, mins.len())?,
            (None, false) => {}
            (Some(mins), false) => check_len("mins (symmetric scheme)", 0, mins.len())?,
            (None, true) => check_len("mins (asymmetric scheme)", rows * groups, 0)?,
        }
        Ok(Self {
            scheme,
            shape,
            codes,
            scales,
            mins,
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> QuantScheme {
        self.scheme
    }

    /// `[out_features, in_features]`.
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// Packed codes, `[out_features, row_bytes]` row-major.
    pub fn packed_codes(&self) -> &[u8] {
        &self.codes
    }

    /// Per-group scales, `[out_features, groups_per_row]` row-major.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Per-group minimums `[out_features, groups_per_row]` (asymmetric schemes only).
    pub fn mins(&self) -> Option<&[f32]> {
        self.mins.as_deref()
    }

    /// Bytes of packed codes per row (rows are padded to whole groups).
    pub fn row_bytes(&self) -> usize {
        row_bytes(self.scheme, self.shape[1])
    }

    /// Groups per row.
    pub fn groups_per_row(&self) -> usize {
        self.scheme.groups_per_row(self.shape[1])
    }

    /// Bytes this weight occupies: packed codes plus f32 scales (and mins).
    pub fn storage_bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.mins.as_ref().map_or(0, Vec::len))
    }

    /// The unsigned code of element `(row, col)`.
    pub fn code(&self, row: usize, col: usize) -> u8 {
        let index = row * self.row_bytes() * 8 / self.scheme.bits() + col;
        match self.scheme.bits() {
            8 => self.codes[index],
            _ => (self.codes[index / 2] >> (4 * (index % 2))) & 0x0f,
        }
    }

    /// The scale applying to element `(row, col)`.
    pub fn scale(&self, row: usize, col: usize) -> f32 {
        self.scales[self.group_index(row, col)]
    }

    /// Dequantizes to a row-major `[out_features, in_features]` f32 matrix.
    ///
    /// Uses exactly the f32 operations of [`crate::QuantizedLinear`]'s on-device dequantization,
    /// `(c - z) * s` or `c * s + m`, so both produce identical values.
    pub fn dequantize(&self) -> Vec<f32> {
        let [rows, cols] = self.shape;
        let mut out = Vec::with_capacity(rows * cols);
        for row in 0..rows {
            for col in 0..cols {
                let g = self.group_index(row, col);
                let code = f32::from(self.code(row, col));
                out.push(match (&self.mins, self.scheme.zero_code()) {
                    (Some(mins), _) => code * self.scales[g] + mins[g],
                    (None, zero) => (code - f32::from(zero.unwrap_or(0))) * self.scales[g],
                });
            }
        }
        out
    }

    fn group_index(&self, row: usize, col: usize) -> usize {
        row * self.groups_per_row() + col / self.scheme.group_len(self.shape[1])
    }
}

/// Bytes of packed codes per row for `in_features` columns.
pub(crate) fn row_bytes(scheme: QuantScheme, in_features: usize) -> usize {
    let padded = scheme.groups_per_row(in_features) * scheme.group_len(in_features);
    padded * scheme.bits() / 8
}

/// Writes the codes of one symmetric group into `out`; returns the scale `max|w| / qmax`.
fn quantize_symmetric(chunk: &[f32], scheme: QuantScheme, zero: u8, out: &mut [u8]) -> f32 {
    let qmax = scheme.symmetric_qmax();
    let amax = chunk.iter().fold(0.0f32, |a, w| a.max(w.abs()));
    let scale = amax / qmax;
    for (code, &w) in out.iter_mut().zip(chunk) {
        // A zero scale means an all-zero group: every code is the zero code.
        let q = if scale > 0.0 {
            (w / scale).round().clamp(-qmax, qmax)
        } else {
            0.0
        };
        *code = (q + f32::from(zero)) as u8;
    }
    scale
}

/// Writes the codes of one asymmetric group into `out`; returns `(scale, min)` with
/// `scale = (max - min) / max_code`.
fn quantize_asymmetric(chunk: &[f32], max_code: u8, out: &mut [u8]) -> (f32, f32) {
    let (min, max) = chunk
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &w| {
            (lo.min(w), hi.max(w))
        });
    let levels = f32::from(max_code);
    let scale = (max - min) / levels;
    for (code, &w) in out.iter_mut().zip(chunk) {
        let q = if scale > 0.0 {
            ((w - min) / scale).round().clamp(0.0, levels)
        } else {
            0.0
        };
        *code = q as u8;
    }
    (scale, min)
}

/// Packs one-code-per-byte values into `8 / bits` codes per byte, low nibble first.
fn pack(codes: &[u8], bits: usize) -> Vec<u8> {
    match bits {
        8 => codes.to_vec(),
        _ => codes
            .chunks_exact(2)
            .map(|pair| pair[0] | (pair[1] << 4))
            .collect(),
    }
}

fn check_len(what: &str, expected: usize, actual: usize) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            what: what.to_string(),
            expected,
            actual,
        })
    }
}
