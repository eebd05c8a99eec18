//! The one entry point every model layer calls, and the choice of kernel behind it.

use std::fmt;
use std::str::FromStr;

use burn::tensor::{Tensor, TensorPrimitive};

use crate::flash::{FlashBlocks, FlashConfig};
use crate::fused::fused_attention;
use crate::manual::manual_attention;
use crate::{AttentionError, AttentionOptions, EmberBackend};

/// Which implementation computes attention. All three agree to float tolerance (see the crate's tests).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKernel {
    /// The readable reference: full score matrix, softmax, weighted sum. Memory O(q_len * kv_len).
    Manual,
    /// burn's `module::attention` (the backend's fused kernel where it has one).
    Fused,
    /// ember's tiled online-softmax kernel with its own recomputing backward. Memory O(q_len + kv_len).
    #[default]
    Flash,
}

impl AttentionKernel {
    /// Every kernel, in the order the CLI lists them.
    pub const ALL: [AttentionKernel; 3] = [Self::Manual, Self::Fused, Self::Flash];

    /// The name used by configs and `--attention`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Manual => "manual",
            Self::Fused => "fused",
            Self::Flash => "flash",
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AttentionKernel {
    type Err = AttentionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kernel| kernel.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| AttentionError::UnknownKernel(s.to_string()))
    }
}

/// Scaled dot-product attention with grouped-query heads, causal/offset/window/padding masks.
///
/// q `[batch, q_heads, q_len, head_dim]`, k `[batch, kv_heads, kv_len, head_dim]`,
/// v `[batch, kv_heads, kv_len, v_dim]` -> `[batch, q_heads, q_len, v_dim]`. `q_heads` must be a multiple of
/// `kv_heads`; query head `h` reads KV head `h / (q_heads / kv_heads)` (the Hugging Face `repeat_kv` order),
/// and only the fused kernel ever materialises repeated K/V. Query rows with no visible key return zeros.
///
/// # Panics
/// If the shapes are inconsistent (see [`check_shapes`]): they come from the model's own configuration, so
/// a mismatch is a bug in the caller, like a mismatched matmul. Call [`check_shapes`] first to get an error.
pub fn attention<B: EmberBackend>(
    kernel: AttentionKernel,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    options: &AttentionOptions<B>,
) -> Tensor<B, 4> {
    if let Err(err) = check_shapes(&q, &k, &v, options) {
        panic!("{err}");
    }
    match kernel {
        AttentionKernel::Manual => manual_attention(q, k, v, options),
        AttentionKernel::Fused => fused_attention(q, k, v, options),
        AttentionKernel::Flash => flash_attention(q, k, v, options, FlashBlocks::default()),
    }
}

/// The flash kernel with explicit tile sizes (for tuning and for tests that need many partial tiles).
/// Dispatches to [`EmberBackend::flash_attention`], so on `Autodiff<B>` it records the flash backward.
///
/// # Panics
/// As [`attention`].
pub fn flash_attention<B: EmberBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    options: &AttentionOptions<B>,
    blocks: FlashBlocks,
) -> Tensor<B, 4> {
    if let Err(err) = check_shapes(&q, &k, &v, options) {
        panic!("{err}");
    }
    let config = FlashConfig {
        mask: options.mask,
        scale: options.resolved_scale(q.dims()[3]),
        softcap: options.softcap,
        blocks,
    };
    let output = B::flash_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        options.key_padding.clone().map(Tensor::into_primitive),
        config,
    );
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// Checks that q, k, v and the padding mask have shapes [`attention`] accepts.
pub fn check_shapes<B: EmberBackend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    options: &AttentionOptions<B>,
) -> Result<(), AttentionError> {
    let [batch, q_heads, q_len, head_dim] = q.dims();
    let [k_batch, kv_heads, kv_len, k_dim] = k.dims();
    let [v_batch, v_heads, v_len, _] = v.dims();
    let shape_error = |tensor, actual: Vec<usize>, expected: String| {
        Err(AttentionError::Shape {
            tensor,
            actual,
            expected,
        })
    };
    if q_len == 0 || head_dim == 0 || q_heads == 0 {
        return shape_error(
            "query",
            q.dims().to_vec(),
            "non-empty heads, rows and head_dim".into(),
        );
    }
    if k_batch != batch
        || kv_heads == 0
        || kv_len == 0
        || k_dim != head_dim
        || q_heads % kv_heads != 0
    {
        return shape_error(
            "key",
            k.dims().to_vec(),
            format!("[{batch}, kv_heads dividing {q_heads}, kv_len > 0, {head_dim}]"),
        );
    }
    if [v_batch, v_heads, v_len] != [batch, kv_heads, kv_len] {
        return shape_error(
            "value",
            v.dims().to_vec(),
            format!("[{batch}, {kv_heads}, {kv_len}, v_dim]"),
        );
    }
    if let Some(pad) = &options.key_padding
        && pad.dims() != [batch, kv_len]
    {
        return shape_error(
            "key_padding",
            pad.dims().to_vec(),
            format!("[{batch}, {kv_len}]"),
        );
    }
    if options.mask.window == Some(0) {
        return Err(AttentionError::EmptyWindow);
    }
    if let Some(cap) = options.softcap
        && !(cap.is_finite() && cap > 0.0)
    {
        return Err(AttentionError::InvalidSoftcap(cap));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_round_trip_and_unknown_names_are_rejected() {
        for kernel in AttentionKernel::ALL {
            assert_eq!(kernel.to_string().parse::<AttentionKernel>(), Ok(kernel));
        }
        assert_eq!(
            " Flash ".parse::<AttentionKernel>(),
            Ok(AttentionKernel::Flash)
        );
        let err = "sdpa".parse::<AttentionKernel>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown attention kernel `sdpa`, expected one of: manual, fused, flash"
        );
    }
}
