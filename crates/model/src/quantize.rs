//! Weight quantization of a loaded [`Transformer`] for inference.

use ember_attention::AttentionBackend;
use ember_optimization::QuantScheme;

use crate::error::Result;
use crate::nn::{Embedding, Linear};
use crate::tensors::{LM_HEAD, layer_name};
use crate::transformer::Transformer;

/// Which weights [`Transformer::quantize`] converts, and how.
///
/// The projections of every block are always quantized. The LM head is by default too; the embedding table is
/// not: it is read a few rows per token, so quantizing it saves memory but no time, and small models lose more
/// quality there than anywhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantization {
    /// The scheme of every quantized weight.
    pub scheme: QuantScheme,
    /// Quantize the LM head (for tied models: a quantized copy of the embedding, or the quantized embedding
    /// itself when `embeddings` is set).
    pub lm_head: bool,
    /// Quantize the token embedding table.
    pub embeddings: bool,
}

impl Quantization {
    /// `scheme` for the blocks and the LM head; embeddings stay f32.
    pub fn new(scheme: QuantScheme) -> Self {
        Quantization {
            scheme,
            lm_head: true,
            embeddings: false,
        }
    }
}

impl<B: AttentionBackend> Transformer<B> {
    /// The model with its weights quantized as `q` says (one layer at a time, so peak memory stays near the
    /// f32 model's). Norms, biases and learned position tables stay f32. The result is for inference: quantized
    /// weights have no gradients.
    pub fn quantize(mut self, q: &Quantization) -> Result<Self> {
        let scheme = q.scheme;
        self.layers = std::mem::take(&mut self.layers)
            .into_iter()
            .enumerate()
            .map(|(i, mut block)| {
                let name = |suffix: &str| layer_name(i, suffix);
                block.attn.q = block.attn.q.quantize(scheme, &name("attn.q.weight"))?;
                block.attn.k = block.attn.k.quantize(scheme, &name("attn.k.weight"))?;
                block.attn.v = block.attn.v.quantize(scheme, &name("attn.v.weight"))?;
                block.attn.o = block.attn.o.quantize(scheme, &name("attn.o.weight"))?;
                block.mlp.up = block.mlp.up.quantize(scheme, &name("mlp.up.weight"))?;
                block.mlp.down = block.mlp.down.quantize(scheme, &name("mlp.down.weight"))?;
                block.mlp.gate = block
                    .mlp
                    .gate
                    .map(|gate| gate.quantize(scheme, &name("mlp.gate.weight")))
                    .transpose()?;
                Ok(block)
            })
            .collect::<Result<Vec<_>>>()?;
        if q.embeddings {
            self.embed = self.embed.quantize(scheme)?;
        }
        if q.lm_head {
            self.lm_head = match self.lm_head.take() {
                Some(head) => Some(head.quantize(scheme, LM_HEAD)?),
                // Tied: a quantized table already serves as the head; a dense one gets a quantized copy.
                None if matches!(self.embed, Embedding::Quantized(_)) => None,
                None => Some(Linear::Quantized(self.embed.quantized_head(scheme)?)),
            };
        }
        Ok(self)
    }

    /// Bytes the weights occupy on the device (f32 or quantized codes plus scales), counting a weight shared
    /// by the embedding and a tied LM head once.
    pub fn weight_memory_bytes(&self) -> usize {
        let dense = |n: usize| 4 * n;
        let norm = |n: &crate::nn::Norm<B>| {
            dense(n.weight.val().shape().num_elements())
                + n.bias
                    .as_ref()
                    .map_or(0, |b| dense(b.val().shape().num_elements()))
        };
        let mut total = self.embed.memory_bytes() + norm(&self.final_norm);
        if let Some(table) = &self.pos_embed {
            total += dense(table.val().shape().num_elements());
        }
        total += self.lm_head.as_ref().map_or(0, Linear::memory_bytes);
        for block in &self.layers {
            let attn = &block.attn;
            let mlp = &block.mlp;
            total += [&attn.q, &attn.k, &attn.v, &attn.o, &mlp.up, &mlp.down]
                .into_iter()
                .chain(mlp.gate.as_ref())
                .map(Linear::memory_bytes)
                .sum::<usize>();
            total += norm(&block.attn_norm) + norm(&block.mlp_norm);
            total += attn.q_norm.as_ref().map_or(0, norm) + attn.k_norm.as_ref().map_or(0, norm);
        }
        total
    }
}
