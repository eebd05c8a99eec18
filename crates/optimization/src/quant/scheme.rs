//! Quantization schemes: bit width, grouping along the input dimension, and symmetry.

use std::fmt;
use std::str::FromStr;

use crate::error::QuantError;

/// The largest group size a scheme accepts: 16x the largest group in common use (256). Rows are padded to whole
/// groups, so a group of a million elements (which parsing once accepted) pads every row to a million codes and
/// makes quantizing a small model take minutes and gigabytes.
pub const MAX_GROUP_SIZE: usize = 4096;

/// Groups up to this size are accepted on rows of any length, so that one scheme (`int4` is `int4-g32`) applies
/// to every matrix of a model, small ones included; larger groups must fit in the row (rounded up to 8).
pub const ALWAYS_ACCEPTED_GROUP: usize = 256;

/// How many consecutive input elements of one output row share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// One scale per output channel (the whole row of `in_features` elements).
    PerChannel,
    /// One scale per group of this many consecutive input elements of a row; the last group of a
    /// row may be shorter when `in_features` is not a multiple. Must be a positive multiple of 8.
    Group(usize),
}

/// A weight quantization scheme.
///
/// Every scheme stores one unsigned integer code `c` per weight plus per-group floats, and
/// dequantizes as `w = (c - z) * s` (symmetric, fixed zero code `z`) or `w = c * s + m`
/// (asymmetric, per-group minimum `m`, i.e. a zero point of `-m / s`). Keeping `m` rather than an
/// integer zero point makes GGUF Q4_1 blocks load bit-exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// 8-bit symmetric: codes `q + 128` with `q` in `[-127, 127]`, `s = max|w| / 127`.
    Int8 {
        /// Scale sharing: per output channel (the usual INT8 choice) or group-wise (GGUF Q8_0).
        granularity: Granularity,
    },
    /// 4-bit group-wise, two codes per byte.
    Int4 {
        /// Elements per group (32, 64 or 128 are typical); a positive multiple of 8.
        group_size: usize,
        /// Symmetric: codes `q + 8`, `q` in `[-7, 7]`, `s = max|w| / 7`. Asymmetric: codes in
        /// `[0, 15]`, `s = (max - min) / 15`, `m = min`.
        symmetric: bool,
    },
}

impl QuantScheme {
    /// INT8 with one scale per output channel.
    pub const INT8: QuantScheme = QuantScheme::Int8 {
        granularity: Granularity::PerChannel,
    };

    /// Symmetric INT4 with groups of 32 (`int4-g32`).
    pub const INT4_G32: QuantScheme = QuantScheme::Int4 {
        group_size: 32,
        symmetric: true,
    };

    /// Asymmetric INT4 with groups of 32 and a float minimum per group (`int4-g32-asym`, which bare `int4`
    /// means): GGUF Q4_1's grid, so a Q4_1 file re-quantizes without loss, and on an f32 model it loses less
    /// than the symmetric grid (docs/BENCHMARKS.md "int4 and the head").
    pub const INT4: QuantScheme = QuantScheme::Int4 {
        group_size: 32,
        symmetric: false,
    };

    /// Bits per stored code.
    pub fn bits(&self) -> usize {
        match self {
            QuantScheme::Int8 { .. } => 8,
            QuantScheme::Int4 { .. } => 4,
        }
    }

    /// Whether per-group minimums are stored (asymmetric) instead of a fixed zero code.
    pub fn is_asymmetric(&self) -> bool {
        matches!(
            self,
            QuantScheme::Int4 {
                symmetric: false,
                ..
            }
        )
    }

    /// The fixed code that represents zero in a symmetric scheme; `None` when asymmetric.
    pub fn zero_code(&self) -> Option<u8> {
        match self {
            QuantScheme::Int8 { .. } => Some(128),
            QuantScheme::Int4 {
                symmetric: true, ..
            } => Some(8),
            QuantScheme::Int4 {
                symmetric: false, ..
            } => None,
        }
    }

    /// Largest magnitude `|q|` a symmetric scheme uses (127 or 7); the scale is `max|w| / qmax`.
    pub(crate) fn symmetric_qmax(&self) -> f32 {
        match self {
            QuantScheme::Int8 { .. } => 127.0,
            QuantScheme::Int4 { .. } => 7.0,
        }
    }

    /// Largest code of the scheme (255 or 15).
    pub(crate) fn max_code(&self) -> u8 {
        match self {
            QuantScheme::Int8 { .. } => 255,
            QuantScheme::Int4 { .. } => 15,
        }
    }

    /// Elements per group for a row of `in_features` elements.
    pub fn group_len(&self, in_features: usize) -> usize {
        match self {
            QuantScheme::Int8 {
                granularity: Granularity::PerChannel,
            } => in_features,
            QuantScheme::Int8 {
                granularity: Granularity::Group(g),
            } => *g,
            QuantScheme::Int4 { group_size, .. } => *group_size,
        }
    }

    /// Groups per row of `in_features` elements (the last one possibly partial).
    pub fn groups_per_row(&self, in_features: usize) -> usize {
        in_features.div_ceil(self.group_len(in_features))
    }

    /// The group size of a group-wise scheme; `None` for per-channel INT8.
    fn group(&self) -> Option<usize> {
        match self {
            QuantScheme::Int8 {
                granularity: Granularity::PerChannel,
            } => None,
            QuantScheme::Int8 {
                granularity: Granularity::Group(g),
            } => Some(*g),
            QuantScheme::Int4 { group_size, .. } => Some(*group_size),
        }
    }

    /// Checks the scheme's own parameters: a group size that is a positive multiple of 8, at most
    /// [`MAX_GROUP_SIZE`].
    pub fn validate_parameters(&self) -> Result<(), QuantError> {
        let Some(group) = self.group() else {
            return Ok(());
        };
        if group == 0 || group % 8 != 0 {
            return Err(QuantError::InvalidGroupSize { group_size: group });
        }
        if group > MAX_GROUP_SIZE {
            return Err(QuantError::GroupTooLarge {
                group_size: group,
                max: MAX_GROUP_SIZE,
                why: "16x the largest group in common use".into(),
            });
        }
        Ok(())
    }

    /// Checks the scheme's parameters and that a `[out_features, in_features]` matrix fits it: a group longer
    /// than [`ALWAYS_ACCEPTED_GROUP`] must not be longer than the row (rounded up to a multiple of 8).
    pub fn validate(&self, out_features: usize, in_features: usize) -> Result<(), QuantError> {
        if out_features == 0 || in_features == 0 {
            return Err(QuantError::EmptyShape {
                shape: [out_features, in_features],
            });
        }
        self.validate_parameters()?;
        let Some(group) = self.group() else {
            return Ok(());
        };
        let row_bound = in_features.next_multiple_of(8).max(ALWAYS_ACCEPTED_GROUP);
        if group > row_bound {
            return Err(QuantError::GroupTooLarge {
                group_size: group,
                max: row_bound,
                why: format!(
                    "rows of {in_features} elements, each padded to a whole group; groups up to \
                     {ALWAYS_ACCEPTED_GROUP} fit any row"
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for QuantScheme {
    /// The canonical spelling accepted by [`QuantScheme::from_str`], e.g. `int8`, `int8-g32`,
    /// `int4-g128`, `int4-g32-asym`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantScheme::Int8 {
                granularity: Granularity::PerChannel,
            } => write!(f, "int8"),
            QuantScheme::Int8 {
                granularity: Granularity::Group(g),
            } => write!(f, "int8-g{g}"),
            QuantScheme::Int4 {
                group_size,
                symmetric,
            } => {
                write!(f, "int4-g{group_size}")?;
                if !symmetric {
                    write!(f, "-asym")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for QuantScheme {
    type Err = QuantError;

    /// Parses `int8` (per channel), `int8-gN`, `int4` (= `int4-g32-asym`, [`QuantScheme::INT4`]), `int4-gN`
    /// (symmetric), and `int4`/`int4-gN` followed by `-asym` or `-sym`; `N` is a multiple of 8 up to
    /// [`MAX_GROUP_SIZE`]. Spelled group sizes default to symmetric, as every written file names them.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || QuantError::UnknownScheme {
            text: text.to_string(),
        };
        let mut parts = text.split('-');
        let kind = parts.next().ok_or_else(invalid)?;
        let mut group = None;
        let mut symmetric = None;
        for part in parts {
            if let Some(digits) = part.strip_prefix('g').filter(|_| group.is_none()) {
                group = Some(digits.parse::<usize>().map_err(|_| invalid())?);
            } else if part == "asym" && symmetric.is_none() {
                symmetric = Some(false);
            } else if part == "sym" && symmetric.is_none() {
                symmetric = Some(true);
            } else {
                return Err(invalid());
            }
        }
        let scheme = match kind {
            "int8" if symmetric != Some(false) => QuantScheme::Int8 {
                granularity: group.map_or(Granularity::PerChannel, Granularity::Group),
            },
            "int4" if group.is_none() && symmetric.is_none() => QuantScheme::INT4,
            "int4" => QuantScheme::Int4 {
                group_size: group.unwrap_or(32),
                symmetric: symmetric.unwrap_or(true),
            },
            _ => return Err(invalid()),
        };
        scheme.validate_parameters()?;
        Ok(scheme)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_sizes_are_bounded_when_parsed_and_by_the_row() {
        assert!("int4-g4096".parse::<QuantScheme>().is_ok());
        for text in ["int4-g4104", "int8-g1048576", "int4-g18446744073709551608"] {
            assert!(
                matches!(
                    text.parse::<QuantScheme>(),
                    Err(QuantError::GroupTooLarge { .. } | QuantError::UnknownScheme { .. })
                ),
                "{text}"
            );
        }
        let big: QuantScheme = "int4-g1024".parse().unwrap();
        assert!(big.validate(4, 1024).is_ok());
        assert!(big.validate(4, 1020).is_ok(), "rounded up to 8");
        let err = big.validate(4, 576).unwrap_err();
        assert!(
            matches!(err, QuantError::GroupTooLarge { max: 576, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("1024"), "{err}");
        // Common groups apply to small matrices too (a tiny model's 16-wide rows).
        for text in ["int4", "int4-g128-asym", "int8-g256"] {
            let scheme: QuantScheme = text.parse().unwrap();
            assert!(scheme.validate(2, 16).is_ok(), "{text}");
        }
        assert!(QuantScheme::INT8.validate(1, 1 << 20).is_ok());
    }
}
