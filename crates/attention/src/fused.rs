//! burn's own attention op (`burn::tensor::module::attention`): the backend's fused kernel where it has one.

use burn::tensor::{Tensor, backend::Backend, module, ops::AttentionModuleOptions};

use crate::mask::tile_mask;
use crate::{AttentionOptions, MaskSpec};

/// Attention through burn's module op. Shapes as in [`crate::attention`].
///
/// burn's op needs as many KV heads as query heads, so grouped K/V are repeated here (and only here). Its
/// `is_causal` aligns the causal diagonal bottom-right (query `i` sees keys `<= kv_len - q_len + i`), which is
/// our rule exactly when `query_offset == kv_len - q_len` and there is no window; every other case passes an
/// explicit mask. On autodiff backends burn differentiates through its unfused fallback.
pub(crate) fn fused_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    options: &AttentionOptions<B>,
) -> Tensor<B, 4> {
    let [batch, q_heads, q_len, head_dim] = q.dims();
    let [_, kv_heads, kv_len, _] = k.dims();
    let group = q_heads / kv_heads;
    let (k, v) = (repeat_kv(k, group), repeat_kv(v, group));

    let spec = options.mask;
    let bottom_right = spec.causal && spec.window.is_none() && spec.query_offset + q_len == kv_len;
    let explicit = if bottom_right {
        MaskSpec::default()
    } else {
        spec
    };
    let mask = tile_mask(
        &explicit,
        0..q_len,
        0..kv_len,
        options.key_padding.as_ref(),
        &q.device(),
    )
    .map(|mask| mask.expand([batch, q_heads, q_len, kv_len]));
    let module_options = AttentionModuleOptions {
        scale: Some(options.resolved_scale(head_dim)),
        // burn caps before applying the mask, as Gemma does (a capped -inf would become a finite -cap).
        softcap: options.softcap,
        is_causal: bottom_right,
    };
    module::attention(q, k, v, mask, None, module_options)
}

/// `[batch, kv_heads, len, dim]` -> `[batch, kv_heads * group, len, dim]`, each KV head repeated for the
/// `group` consecutive query heads that read it.
fn repeat_kv<B: Backend>(x: Tensor<B, 4>, group: usize) -> Tensor<B, 4> {
    if group == 1 {
        return x;
    }
    let [batch, kv_heads, len, dim] = x.dims();
    x.reshape([batch, kv_heads, 1, len, dim])
        .expand([batch, kv_heads, group, len, dim])
        .reshape([batch, kv_heads * group, len, dim])
}
