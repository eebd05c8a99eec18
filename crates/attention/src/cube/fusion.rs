//! The flash forward on burn's fusion wrapper (`Fusion<CubeBackend>`, what `burn::backend::Wgpu` and `Cuda` are):
//! registered as one custom operation of the fusion stream that runs the inner backend's kernel when the stream
//! executes.

use std::marker::PhantomData;

use burn::tensor::ops::{BoolTensor, FloatTensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use crate::{EmberBackend, FlashConfig};

/// The recorded call: the IR of its inputs and outputs plus the non-tensor settings.
#[derive(Clone, Debug)]
struct FlashForward<B> {
    desc: CustomOpIr,
    config: FlashConfig,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + EmberBackend> Operation<B::FusionRuntime> for FlashForward<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let (inputs, outputs) = (&self.desc.inputs, &self.desc.outputs);
        let q = handles.get_float_tensor::<B>(&inputs[0]);
        let k = handles.get_float_tensor::<B>(&inputs[1]);
        let v = handles.get_float_tensor::<B>(&inputs[2]);
        let padding = inputs.get(3).map(|mask| handles.get_bool_tensor::<B>(mask));
        let (output, lse) = B::flash_attention_forward(q, k, v, padding, self.config);
        handles.register_float_tensor::<B>(&outputs[0].id, output);
        handles.register_float_tensor::<B>(&outputs[1].id, lse);
    }
}

impl<B: FusionBackend + EmberBackend> EmberBackend for Fusion<B> {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let client = q.client.clone();
        let dtype = q.dtype;
        let [batch, q_heads, q_len, _] = q.shape.dims::<4>();
        let v_dim = v.shape.dims::<4>()[3];
        let streams = match &key_padding {
            Some(mask) => OperationStreams::with_inputs([&q, &k, &v, mask]),
            None => OperationStreams::with_inputs([&q, &k, &v]),
        };
        let output = TensorIr::uninit(
            client.create_empty_handle(),
            [batch, q_heads, q_len, v_dim].into(),
            dtype,
        );
        let lse = TensorIr::uninit(
            client.create_empty_handle(),
            [batch, q_heads, q_len].into(),
            dtype,
        );
        let mut inputs = vec![q.into_ir(), k.into_ir(), v.into_ir()];
        inputs.extend(key_padding.map(|mask| mask.into_ir()));
        let desc = CustomOpIr::new("ember_flash_attention_forward", &inputs, &[output, lse]);
        let operation = FlashForward::<B> {
            desc: desc.clone(),
            config,
            _backend: PhantomData,
        };
        let [output, lse] = client
            .register(streams, OperationIr::Custom(desc), operation)
            .try_into()
            .expect("the operation declares two outputs");
        (output, lse)
    }
}
