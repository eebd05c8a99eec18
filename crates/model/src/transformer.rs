//! [`Transformer`]: the one decoder-only model every family runs through, configured by its [`ModelSpec`].

use std::collections::HashMap;

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{
    Bool, DType, ElementConversion, FloatDType, Int, Tensor, TensorData, module::embedding,
};
use ember_attention::{AttentionKernel, EmberBackend, GgmlProducts, KvCache, Rope, RopeCache};
use ember_optimization::{GgmlLinear, PackedWeight, QuantizedLinear};

use crate::error::{ModelError, Result};
use crate::nn::attention::CallPositions;
use crate::nn::{Block, BlockModule, Embedding, Linear, Mlp, Norm, SelfAttention, in_dtype};
use crate::spec::{ModelSpec, Positions};
use crate::tensors::{EMBED, FINAL_NORM, LM_HEAD, POS_EMBED, TensorSpec, layer_name};
use crate::weights::{Progress, RandomInit, WeightSource};

mod segments;
pub use segments::Segments;

/// A decoder-only transformer: embeddings, blocks, final norm, LM head.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    /// Token embeddings `[vocab, hidden]` (also the LM head when tied).
    pub embed: Embedding<B>,
    /// Learned positions `[context_length, hidden]` (GPT-2, GPT-Neo).
    pub pos_embed: Option<Param<Tensor<B, 2>>>,
    /// The blocks.
    pub layers: Vec<Block<B>>,
    /// Norm before the LM head.
    pub final_norm: Norm<B>,
    /// Untied LM head `[vocab, hidden]`.
    pub lm_head: Option<Linear<B>>,
    #[module(skip)]
    spec: ModelSpec,
    #[module(skip)]
    kernel: AttentionKernel,
    /// RoPE tables for the context window, built on the first forward call on a device and reused.
    #[module(skip)]
    rope: RopeCache,
    /// The same for the sliding-window layers' RoPE, when the spec has one (Gemma 3).
    #[module(skip)]
    local_rope: RopeCache,
    /// Activation dtype (mixed precision); `None` computes in the parameters' dtype.
    #[module(skip)]
    compute_dtype: Option<FloatDType>,
}

/// The rotary tables of the global layers and of the sliding-window layers, where the spec has them.
type RopePair<B> = (Option<Rope<B>>, Option<Rope<B>>);

/// Optional inputs of a forward call beyond the tokens.
pub struct Step<'a, B: EmberBackend> {
    /// KV cache: its length is the position of the first token, and every layer appends to it.
    pub cache: Option<&'a mut dyn KvCache<B>>,
    /// Per-row positions `[batch, seq]` (left-padded batches); default `cached..cached + seq` for every row.
    pub positions: Option<Tensor<B, 2, Int>>,
    /// Padding keys `[batch, cached + seq]`, `true` = never attended to.
    pub key_padding: Option<Tensor<B, 2, Bool>>,
}

impl<B: EmberBackend> Default for Step<'_, B> {
    fn default() -> Self {
        Step {
            cache: None,
            positions: None,
            key_padding: None,
        }
    }
}

/// A matrix a source handed over packed, uploaded as the layer of its kind.
enum PackedLayer<B: EmberBackend> {
    Codes(QuantizedLinear<B>),
    Ggml(GgmlLinear<B>),
}

impl<B: EmberBackend> From<PackedLayer<B>> for Linear<B> {
    fn from(layer: PackedLayer<B>) -> Self {
        match layer {
            PackedLayer::Codes(layer) => Linear::Quantized(layer),
            PackedLayer::Ggml(layer) => Linear::Ggml(layer),
        }
    }
}

/// Builds modules from a [`WeightSource`], visiting each canonical tensor once.
struct Builder<'a, 'p, B: EmberBackend> {
    expected: HashMap<String, TensorSpec>,
    source: &'a mut dyn WeightSource,
    device: &'a B::Device,
    done: usize,
    progress: Option<Progress<'p>>,
}

impl<B: EmberBackend> Builder<'_, '_, B> {
    fn optional<const D: usize>(&mut self, name: &str) -> Result<Option<Param<Tensor<B, D>>>> {
        let Some(spec) = self.expected.get(name) else {
            return Ok(None);
        };
        let values = self.source.take(spec)?;
        let tensor =
            Tensor::<B, D>::from_data(TensorData::new(values, spec.shape.clone()), self.device);
        self.done += 1;
        if let Some(progress) = self.progress.as_mut() {
            progress(self.done, self.expected.len(), name);
        }
        Ok(Some(Param::from_tensor(tensor)))
    }

    fn required<const D: usize>(&mut self, name: &str) -> Result<Param<Tensor<B, D>>> {
        self.optional(name)?
            .ok_or_else(|| ModelError::InvalidSpec(format!("the spec has no tensor `{name}`")))
    }

    /// Matrix `name` uploaded packed with `bias`, when the source holds it packed.
    fn packed(
        &mut self,
        name: &str,
        bias: impl FnOnce(&mut Self) -> Result<Option<Param<Tensor<B, 1>>>>,
    ) -> Result<Option<PackedLayer<B>>> {
        let Some(spec) = self.expected.get(name) else {
            return Ok(None);
        };
        let Some(weight) = self.source.take_quantized(spec)? else {
            return Ok(None);
        };
        self.done += 1;
        if let Some(progress) = self.progress.as_mut() {
            progress(self.done, self.expected.len(), name);
        }
        let bias = bias(self)?.map(|b| b.val());
        let layer = match weight {
            PackedWeight::Codes(weight) => {
                QuantizedLinear::new(&weight, bias, self.device).map(PackedLayer::Codes)
            }
            PackedWeight::Ggml(weight) => {
                GgmlLinear::new(weight, bias, self.device).map(PackedLayer::Ggml)
            }
        };
        layer.map(Some).map_err(|e| ModelError::Quantization {
            tensor: name.to_string(),
            message: e.to_string(),
        })
    }

    fn embedding(&mut self) -> Result<Embedding<B>> {
        Ok(match self.packed(EMBED, |_| Ok(None))? {
            Some(PackedLayer::Codes(table)) => Embedding::Quantized(table),
            Some(PackedLayer::Ggml(table)) => Embedding::Ggml(table),
            None => Embedding::Dense(self.required(EMBED)?),
        })
    }

    fn linear(&mut self, prefix: &str) -> Result<Linear<B>> {
        let bias_name = format!("{prefix}.bias");
        if let Some(layer) = self.packed(&format!("{prefix}.weight"), |b| b.optional(&bias_name))? {
            return Ok(layer.into());
        }
        Ok(Linear::dense(
            self.required(&format!("{prefix}.weight"))?,
            self.optional(&format!("{prefix}.bias"))?,
        ))
    }

    fn norm(&mut self, prefix: &str, spec: &ModelSpec) -> Result<Norm<B>> {
        Ok(Norm {
            weight: self.required(&format!("{prefix}.weight"))?,
            bias: self.optional(&format!("{prefix}.bias"))?,
            kind: spec.features.norm.kind,
            eps: spec.features.norm.eps,
            unit_offset: spec.features.norm_unit_offset,
        })
    }

    fn block(&mut self, layer: usize, spec: &ModelSpec) -> Result<Block<B>> {
        let name = |suffix: &str| layer_name(layer, suffix);
        let attn_norm = self.norm(&name("attn_norm"), spec)?;
        let (q, k, v) = (
            self.linear(&name("attn.q"))?,
            self.linear(&name("attn.k"))?,
            self.linear(&name("attn.v"))?,
        );
        let (q_norm, k_norm) = if spec.features.qk_norm {
            (
                Some(self.norm(&name("attn.q_norm"), spec)?),
                Some(self.norm(&name("attn.k_norm"), spec)?),
            )
        } else {
            (None, None)
        };
        let o = self.linear(&name("attn.o"))?;
        let attn_post_norm = if spec.features.post_norms {
            Some(self.norm(&name("attn_post_norm"), spec)?)
        } else {
            None
        };
        let mlp_norm = self.norm(&name("mlp_norm"), spec)?;
        let gate = match spec.features.mlp {
            crate::spec::MlpKind::Gated => Some(self.linear(&name("mlp.gate"))?),
            crate::spec::MlpKind::Plain => None,
        };
        let (up, down) = (
            self.linear(&name("mlp.up"))?,
            self.linear(&name("mlp.down"))?,
        );
        let mlp_post_norm = if spec.features.post_norms {
            Some(self.norm(&name("mlp_post_norm"), spec)?)
        } else {
            None
        };
        Ok(Block {
            attn_norm,
            attn: SelfAttention {
                q,
                k,
                v,
                o,
                q_norm,
                k_norm,
                num_heads: spec.num_heads,
                num_kv_heads: spec.num_kv_heads,
                head_dim: spec.head_dim,
                softcap: spec.features.attn_softcap,
            },
            attn_post_norm,
            mlp_norm,
            mlp: Mlp {
                gate,
                up,
                down,
                activation: spec.features.activation,
            },
            mlp_post_norm,
            residual: spec.features.residual,
            window: spec.attention_windows[layer],
        })
    }
}

impl<B: EmberBackend> Transformer<B> {
    /// Builds a model of `spec` on `device` with every parameter taken from `source`; `progress` is called
    /// after each tensor.
    pub fn from_source(
        spec: &ModelSpec,
        source: &mut dyn WeightSource,
        device: &B::Device,
        progress: Option<Progress<'_>>,
    ) -> Result<Self> {
        spec.validate()?;
        let expected = spec
            .tensors()
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        let mut b = Builder::<B> {
            expected,
            source,
            device,
            done: 0,
            progress,
        };
        let embed = b.embedding()?;
        let pos_embed = b.optional(POS_EMBED)?;
        let layers = (0..spec.num_layers)
            .map(|layer| b.block(layer, spec))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = b.norm(FINAL_NORM, spec)?;
        let lm_head = match b.packed(LM_HEAD, |_| Ok(None))? {
            Some(head) => Some(head.into()),
            None => b
                .optional(LM_HEAD)?
                .map(|weight| Linear::dense(weight, None)),
        };
        Ok(Transformer {
            embed,
            pos_embed,
            layers,
            final_norm,
            lm_head,
            spec: spec.clone(),
            kernel: AttentionKernel::default(),
            rope: RopeCache::new(),
            local_rope: RopeCache::new(),
            compute_dtype: None,
        })
    }

    /// A freshly initialised model for training from scratch (see [`RandomInit`]); the same seed gives the same
    /// weights on every backend.
    pub fn init(spec: &ModelSpec, seed: u64, device: &B::Device) -> Result<Self> {
        Self::from_source(
            spec,
            &mut RandomInit::new(seed, spec.num_layers),
            device,
            None,
        )
    }

    /// The device the model's weights live on.
    pub fn device(&self) -> B::Device {
        self.embed.device()
    }

    /// The spec this model was built from.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The attention kernel forward passes use (default: flash).
    pub fn kernel(&self) -> AttentionKernel {
        self.kernel
    }

    /// The same model computing attention with `kernel`.
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The same model multiplying its layers kept as ggml blocks (projections, LM head, a tied embedding's
    /// projection) in `products`' arithmetic (default: [`GgmlProducts::Integer`], as llama.cpp does). Each of
    /// those layers carries the setting, so other models in the process keep theirs.
    pub fn with_ggml_products(mut self, products: GgmlProducts) -> Self {
        for block in &mut self.layers {
            for (_, linear) in block.linears_mut() {
                linear.set_ggml_products(products);
            }
        }
        if let Some(head) = &mut self.lm_head {
            head.set_ggml_products(products);
        }
        self.embed.set_ggml_products(products);
        self
    }

    /// The same model computing its activations in `dtype` (e.g. bf16) while its parameters keep theirs (the f32
    /// master weights of mixed-precision training): embeddings are cast after the lookup, every matmul casts its
    /// weight to the activations' dtype, norms compute their statistics in f32, and logits come back in f32.
    /// `None` restores computing in the parameters' dtype.
    pub fn with_compute_dtype(mut self, dtype: Option<FloatDType>) -> Self {
        self.compute_dtype = dtype;
        self
    }

    /// The activation dtype set by [`Transformer::with_compute_dtype`].
    pub fn compute_dtype(&self) -> Option<FloatDType> {
        self.compute_dtype
    }

    /// Logits `[batch, seq, vocab]` for `tokens` `[batch, seq]`, without a cache.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>> {
        self.forward_with(tokens, Step::default())
    }

    /// Logits `[batch, seq, vocab]` for `tokens` `[batch, seq]`, continuing from `step.cache` if given.
    ///
    /// Token ids must be below the vocabulary size (check untrusted ids with [`Transformer::check_tokens`]).
    pub fn forward_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        step: Step<'_, B>,
    ) -> Result<Tensor<B, 3>> {
        let hidden = self.hidden_states(tokens, step)?;
        Ok(self.head(hidden))
    }

    /// Logits `[batch, vocab]` of the last position only, continuing from `step.cache` if given: what generation
    /// needs, without running the LM head over every prompt position.
    pub fn forward_last(
        &self,
        tokens: Tensor<B, 2, Int>,
        step: Step<'_, B>,
    ) -> Result<Tensor<B, 2>> {
        let hidden = self.hidden_states(tokens, step)?;
        let [batch, seq, width] = hidden.dims();
        Ok(self
            .head(hidden.slice([0..batch, seq - 1..seq, 0..width]))
            .reshape([batch, self.spec.vocab_size]))
    }

    /// The LM head applied to hidden states `[batch, seq, hidden]`; logits in f32 whatever the compute dtype,
    /// soft-capped in f32 when the spec caps them (Gemma 2).
    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed.project(hidden),
        };
        let logits = in_dtype(logits, DType::F32);
        match self.spec.features.final_softcap {
            Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
            None => logits,
        }
    }

    /// The final-normed hidden states `[batch, seq, hidden]` (what the LM head reads).
    pub fn hidden_states(
        &self,
        tokens: Tensor<B, 2, Int>,
        step: Step<'_, B>,
    ) -> Result<Tensor<B, 3>> {
        let Step {
            mut cache,
            positions,
            key_padding,
        } = step;
        let device = tokens.device();
        let offset = cache.as_ref().map_or(0, |c| c.len());
        let mut x = self.embed_tokens(tokens, positions.as_ref(), offset)?;
        let (rope, local_rope) = self.ropes(&device)?;
        let at = CallPositions {
            rope: rope.as_ref(),
            local_rope: local_rope.as_ref(),
            offset,
            explicit: positions,
            key_padding,
            kernel: self.kernel,
        };
        for (layer, block) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_mut().map(|c| &mut **c as &mut dyn KvCache<B>);
            x = block.forward(
                x,
                layer,
                self.spec.features.attention_scale,
                &at,
                layer_cache,
            )?;
        }
        Ok(self.final_norm.forward(x))
    }

    /// Token embeddings `[batch, seq, hidden]` in the compute dtype, scaled (Gemma) and with learned positions
    /// added: per-row `positions`, or `offset..offset + seq` for every row.
    fn embed_tokens(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Option<&Tensor<B, 2, Int>>,
        offset: usize,
    ) -> Result<Tensor<B, 3>> {
        let [_, seq] = tokens.dims();
        let mut x = self.embed.lookup(tokens);
        if self.spec.features.scaled_embeddings {
            // Gemma rounds sqrt(hidden) to the table's dtype first; the table is f32 here, and so is the factor.
            x = x.mul_scalar((self.spec.hidden_size as f64).sqrt() as f32);
        }
        if let Some(dtype) = self.compute_dtype {
            x = in_dtype(x, dtype.into());
        }
        let Some(table) = &self.pos_embed else {
            return Ok(x);
        };
        let end = match positions {
            Some(p) => {
                usize::try_from(p.clone().max().into_scalar().elem::<i64>() + 1).unwrap_or(0)
            }
            None => offset + seq,
        };
        if end > self.spec.context_length {
            return Err(ModelError::ContextOverflow {
                len: end,
                context_length: self.spec.context_length,
            });
        }
        let dtype = x.dtype();
        Ok(match positions {
            Some(p) => x + in_dtype(embedding(table.val(), p.clone()), dtype),
            None => {
                let rows = table
                    .val()
                    .slice([offset..offset + seq, 0..self.spec.hidden_size]);
                x + in_dtype(rows, dtype).unsqueeze::<3>()
            }
        })
    }

    /// The rotary tables of the global and the sliding-window layers on `device`, where the spec has them.
    fn ropes(&self, device: &B::Device) -> Result<RopePair<B>> {
        let rope = match &self.spec.positions {
            Positions::Rope(config) => Some(self.rope.get::<B>(
                config,
                self.spec.context_length,
                device,
            )?),
            Positions::Learned => None,
        };
        let local_rope = match &self.spec.features.local_rope {
            Some(config) => Some(self.local_rope.get::<B>(
                config,
                self.spec.context_length,
                device,
            )?),
            None => None,
        };
        Ok((rope, local_rope))
    }

    /// Checks that every id is a valid token of this model.
    pub fn check_tokens(&self, ids: &[u32]) -> Result<()> {
        let vocab_size = self.spec.vocab_size;
        match ids.iter().position(|&id| id as usize >= vocab_size) {
            Some(position) => Err(ModelError::TokenOutOfRange {
                id: ids[position],
                position,
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// The current value of canonical parameter `name` (row-major, canonical shape), for saving.
    pub fn parameter(&self, name: &str) -> Option<TensorData> {
        match name {
            EMBED => return Some(self.embed.data()),
            POS_EMBED => return self.pos_embed.as_ref().map(|p| p.val().into_data()),
            LM_HEAD => return self.lm_head.as_ref().map(Linear::weight_data),
            _ => {}
        }
        if let Some(param) = name.strip_prefix("final_norm.") {
            return self.final_norm.parameter(param);
        }
        let (module, param) = name.rsplit_once('.')?;
        match self.block_module(module)? {
            BlockModule::Norm(norm) => norm.parameter(param),
            BlockModule::Linear(linear) => linear.parameter(param),
        }
    }

    /// The block module under canonical name `name` without its parameter (`layers.3.attn.q`).
    pub fn block_module(&self, name: &str) -> Option<BlockModule<'_, B>> {
        let (layer, suffix) = crate::arch::split_layer(name)?;
        self.layers.get(layer)?.module(suffix)
    }
}
