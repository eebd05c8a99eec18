//! ember's flash-attention forward as a CubeCL kernel, for the GPU backends (wgpu, CUDA).
//!
//! One unit computes one query row of one head: it walks the keys the mask lets it see, keeping the running
//! maximum, the running sum of exponentials and the weighted sum of values (the online softmax of
//! FlashAttention), so no score matrix is stored. Grouped-query heads read their shared KV head in place, and
//! causal / sliding-window limits bound the key loop rather than masking it. The backward pass stays the
//! portable recomputing one of [`crate::flash`] (the default methods of [`EmberBackend`]), and so does the
//! forward pass of soft-capped scores (Gemma 2): the kernel has no cap.

mod fusion;
mod kernel;

use burn::tensor::{
    Bool, DType, FloatDType, Tensor, TensorMetadata, bf16, f16, ops::BoolTensor, ops::FloatTensor,
};
use burn_cubecl::{
    BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement, ops::numeric::empty_device,
    tensor::CubeTensor,
};
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use crate::{EmberBackend, FlashConfig};
use kernel::flash_forward_kernel;

/// Runs [`kernel::flash_forward_kernel`] on the inputs' own float type (the backend's default, or bf16/f16 when a
/// model computes in half precision): output `[batch, q_heads, q_len, v_dim]` and log-sum-exp `[batch, q_heads,
/// q_len]` of that type, as [`crate::flash::flash_forward`] returns them. `padding` must have the inputs' type.
pub(crate) fn flash_forward_cube<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    padding: Option<CubeTensor<R>>,
    config: &FlashConfig,
) -> (CubeTensor<R>, CubeTensor<R>) {
    // A kernel instantiated for the backend's default type would read a bf16 buffer as f32.
    match q.dtype {
        DType::F16 => flash_forward_typed::<R, f16>(q, k, v, padding, config),
        DType::BF16 => flash_forward_typed::<R, bf16>(q, k, v, padding, config),
        DType::F64 => flash_forward_typed::<R, f64>(q, k, v, padding, config),
        _ => flash_forward_typed::<R, f32>(q, k, v, padding, config),
    }
}

fn flash_forward_typed<R: CubeRuntime, F: FloatElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    padding: Option<CubeTensor<R>>,
    config: &FlashConfig,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let [batch, q_heads, q_len, head_dim] = q.meta.shape().dims::<4>();
    let v_dim = v.meta.shape().dims::<4>()[3];
    let client = q.client.clone();
    let device = q.device.clone();
    let output = empty_device::<R, F>(
        client.clone(),
        device.clone(),
        [batch, q_heads, q_len, v_dim].into(),
    );
    let lse = empty_device::<R, F>(client.clone(), device, [batch, q_heads, q_len].into());
    let has_padding = padding.is_some();
    // Without padding the kernel never reads this argument; an input fills the slot (not an output: one buffer
    // bound both read-only and writable in a dispatch is a usage conflict on wgpu).
    let padding = padding.unwrap_or_else(|| q.clone());
    let rows = batch * q_heads * q_len;
    let cube_dim = CubeDim::new(&client, rows);
    let cube_count = calculate_cube_count_elemwise(&client, rows, cube_dim);
    flash_forward_kernel::launch::<F, R>(
        &client,
        cube_count,
        cube_dim,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        padding.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        config.scale as f32,
        config.mask.query_offset,
        config.mask.window.unwrap_or(0),
        head_dim,
        v_dim,
        config.mask.causal,
        config.mask.window.is_some(),
        has_padding,
    );
    (output, lse)
}

impl<R, F, I, BT> EmberBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // The CubeCL kernel has no score cap: soft-capped calls (Gemma 2) run the portable tiled kernel, which
        // caps each tile before masking.
        if config.softcap.is_some() {
            return crate::portable::portable_flash_forward::<Self>(q, k, v, key_padding, config);
        }
        // The kernel reads the padding mask as floats of the inputs' type (1 = padding): one cheap cast instead
        // of a kernel generic over each backend's boolean storage type.
        let dtype = FloatDType::from(q.dtype());
        let padding = key_padding.map(|mask| {
            Tensor::<Self, 2, Bool>::from_primitive(mask)
                .float()
                .cast(dtype)
                .into_primitive()
                .tensor()
        });
        flash_forward_cube::<R>(q, k, v, padding, &config)
    }
}
