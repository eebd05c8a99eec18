//! RoPE configuration and the inverse frequencies of each scaling scheme (host-side math, Hugging Face's
//! `modeling_rope_utils` semantics).

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

use crate::AttentionError;

/// How the rotated dimensions are paired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeLayout {
    /// Dimension `i` pairs with `i + rotary_dim / 2` (LLaMA, Mistral, GPT-NeoX: `rotate_half`).
    #[default]
    RotateHalf,
    /// Dimension `2i` pairs with `2i + 1` (GPT-J: `rotate_every_two`).
    Interleaved,
}

/// Frequency scaling for contexts longer than the model was trained on (`rope_scaling` / `rope_parameters`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Plain RoPE.
    #[default]
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// Context extension factor.
        factor: f64,
    },
    /// LLaMA 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp in between.
    Llama3 {
        /// Scale of the low-frequency band.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Context length of pre-training.
        original_max_position_embeddings: usize,
    },
    /// Dynamic NTK: once the sequence grows past `max_position_embeddings`, the base is raised to
    /// `theta * (factor * seq_len / max_position_embeddings - (factor - 1)) ^ (dim / (dim - 2))`.
    Dynamic {
        /// Scaling strength.
        factor: f64,
        /// Length up to which plain frequencies are used (the model's `max_position_embeddings`).
        max_position_embeddings: usize,
    },
    /// LongRoPE (Phi-3 128k, Phi-3.5; Hugging Face `longrope`, formerly `su`): frequency `i` divided by
    /// `short_factor[i]` while the sequence fits `original_max_position_embeddings` and by `long_factor[i]` once
    /// it is longer, and cos/sin multiplied by `attention_factor`. As in transformers the choice is per call, by
    /// the sequence's length so far (cache plus new tokens).
    #[serde(rename = "longrope")]
    LongRope {
        /// Divisors while the sequence fits the original context (`rotary_dim / 2` of them).
        short_factor: Vec<f64>,
        /// Divisors past it.
        long_factor: Vec<f64>,
        /// Context length of pre-training.
        original_max_position_embeddings: usize,
        /// Scale of cos and sin (`sqrt(1 + ln(factor) / ln(original))` unless the config gives it).
        attention_factor: f64,
    },
}

/// Rotary position embedding of one attention head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeConfig {
    /// Size of a head.
    pub head_dim: usize,
    /// Leading dimensions of each head that are rotated (even, `<= head_dim`); the rest pass through
    /// (GPT-NeoX `rotary_pct`, GPT-J `rotary_dim`).
    pub rotary_dim: usize,
    /// Base wavelength (`rope_theta`).
    pub theta: f64,
    /// Pairing of rotated dimensions.
    #[serde(default)]
    pub layout: RopeLayout,
    /// Frequency scaling.
    #[serde(default)]
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// Plain rotate-half RoPE over the whole head with `theta = 10000`.
    pub fn new(head_dim: usize) -> Self {
        Self {
            head_dim,
            rotary_dim: head_dim,
            theta: 10_000.0,
            layout: RopeLayout::RotateHalf,
            scaling: RopeScaling::None,
        }
    }

    /// Sets the base wavelength.
    pub fn with_theta(mut self, theta: f64) -> Self {
        self.theta = theta;
        self
    }

    /// Sets the number of rotated dimensions.
    pub fn with_rotary_dim(mut self, rotary_dim: usize) -> Self {
        self.rotary_dim = rotary_dim;
        self
    }

    /// Rotates `int(head_dim * factor)` dimensions, as Hugging Face's `partial_rotary_factor` / `rotary_pct`.
    pub fn with_partial_rotary_factor(mut self, factor: f64) -> Self {
        self.rotary_dim = (self.head_dim as f64 * factor) as usize;
        self
    }

    /// Sets the pairing of rotated dimensions.
    pub fn with_layout(mut self, layout: RopeLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets the frequency scaling.
    pub fn with_scaling(mut self, scaling: RopeScaling) -> Self {
        self.scaling = scaling;
        self
    }

    /// Checks every value is in range.
    pub fn validate(&self) -> Result<(), AttentionError> {
        let bad = |key, problem: String| Err(AttentionError::RopeConfig { key, problem });
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return bad(
                "rotary_dim",
                format!(
                    "is {}, expected an even number in 2..={}",
                    self.rotary_dim, self.head_dim
                ),
            );
        }
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return bad(
                "theta",
                format!("is {}, expected a positive number", self.theta),
            );
        }
        let positive = |key, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                bad(key, format!("is {value}, expected a positive number"))
            }
        };
        let scaling = match &self.scaling {
            RopeScaling::None => Ok(()),
            &RopeScaling::Linear { factor } => positive("rope_scaling.factor", factor),
            &RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("rope_scaling.factor", factor)?;
                positive("rope_scaling.low_freq_factor", low_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return bad(
                        "rope_scaling.high_freq_factor",
                        format!(
                            "is {high_freq_factor}, expected more than low_freq_factor ({low_freq_factor})"
                        ),
                    );
                }
                positive(
                    "rope_scaling.original_max_position_embeddings",
                    original_max_position_embeddings as f64,
                )
            }
            &RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } => {
                positive("rope_scaling.factor", factor)?;
                if self.rotary_dim <= 2 {
                    return bad("rotary_dim", "must exceed 2 for dynamic NTK scaling".into());
                }
                positive(
                    "rope_scaling.max_position_embeddings",
                    max_position_embeddings as f64,
                )
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                for (key, factors) in [
                    ("rope_scaling.short_factor", short_factor),
                    ("rope_scaling.long_factor", long_factor),
                ] {
                    if factors.len() != self.rotary_dim / 2 {
                        return bad(
                            key,
                            format!(
                                "has {} values, expected {} (half the rotary dimension)",
                                factors.len(),
                                self.rotary_dim / 2
                            ),
                        );
                    }
                    if let Some(f) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                        return bad(key, format!("holds {f}, expected positive numbers"));
                    }
                }
                positive("rope_scaling.attention_factor", *attention_factor)?;
                positive(
                    "rope_scaling.original_max_position_embeddings",
                    *original_max_position_embeddings as f64,
                )
            }
        };
        scaling?;
        // Each value can be in range while the frequencies they make are not (a linear factor of 1e-300
        // divides them to infinity in f32): every angle would be NaN and so would every logit.
        if let Some(f) = self
            .inv_freq(1)
            .into_iter()
            .find(|f| !(f.is_finite() && *f >= 0.0))
        {
            return bad(
                "rope_scaling",
                format!("gives the inverse frequency {f}, expected finite frequencies"),
            );
        }
        Ok(())
    }

    /// The `rotary_dim / 2` inverse frequencies for a sequence of `seq_len` positions (only dynamic NTK
    /// depends on it), rounded to f32 as Hugging Face computes them.
    pub fn inv_freq(&self, seq_len: usize) -> Vec<f32> {
        let dim = self.rotary_dim as f64;
        let base = match self.scaling {
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } if seq_len > max_position_embeddings => {
                let ratio =
                    factor * seq_len as f64 / max_position_embeddings as f64 - (factor - 1.0);
                self.theta * ratio.powf(dim / (dim - 2.0))
            }
            _ => self.theta,
        };
        (0..self.rotary_dim / 2)
            .map(|i| {
                let plain = 1.0 / base.powf((2 * i) as f64 / dim);
                let divisor = match &self.scaling {
                    RopeScaling::LongRope {
                        short_factor,
                        long_factor,
                        original_max_position_embeddings,
                        ..
                    } => {
                        let factors = if seq_len > *original_max_position_embeddings {
                            long_factor
                        } else {
                            short_factor
                        };
                        factors.get(i).copied().unwrap_or(1.0)
                    }
                    _ => 1.0,
                };
                (self.scale_frequency(plain) / divisor) as f32
            })
            .collect()
    }

    /// The factor cos and sin are multiplied by (LongRoPE's `attention_factor`; 1 otherwise), in f32 as
    /// Hugging Face applies it.
    pub fn attention_factor(&self) -> f32 {
        match self.scaling {
            RopeScaling::LongRope {
                attention_factor, ..
            } => attention_factor as f32,
            _ => 1.0,
        }
    }

    /// Applies the position-independent scalings (linear, LLaMA 3) to one inverse frequency.
    fn scale_frequency(&self, inv_freq: f64) -> f64 {
        match self.scaling {
            RopeScaling::Linear { factor } => inv_freq / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let context = original_max_position_embeddings as f64;
                let wavelen = 2.0 * PI / inv_freq;
                if wavelen < context / high_freq_factor {
                    inv_freq
                } else if wavelen > context / low_freq_factor {
                    inv_freq / factor
                } else {
                    let smooth = (context / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
                }
            }
            RopeScaling::None | RopeScaling::Dynamic { .. } | RopeScaling::LongRope { .. } => {
                inv_freq
            }
        }
    }

    /// Whether the frequencies depend on the sequence length `seq_len`, so cached tables cannot be used.
    pub(crate) fn needs_dynamic_tables(&self, seq_len: usize) -> bool {
        self.static_positions().is_some_and(|fixed| seq_len > fixed)
    }

    /// The sequence length up to which the frequencies do not depend on it (dynamic NTK, LongRoPE); `None`
    /// when they never do.
    pub(crate) fn static_positions(&self) -> Option<usize> {
        match self.scaling {
            RopeScaling::Dynamic {
                max_position_embeddings,
                ..
            } => Some(max_position_embeddings),
            RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } => Some(original_max_position_embeddings),
            _ => None,
        }
    }
}
