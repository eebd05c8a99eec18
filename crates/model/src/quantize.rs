//! Weight quantization of a loaded [`Transformer`] for inference.

use ember_attention::EmberBackend;
use ember_optimization::QuantScheme;

use crate::error::Result;
use crate::nn::{Block, Embedding, Linear};
use crate::tensors::{LM_HEAD, layer_name};
use crate::transformer::Transformer;

/// Which weights [`Transformer::quantize`] converts, and how.
///
/// The projections of every block are always quantized. The LM head is by default too (at INT8 under a 4-bit
/// scheme, see [`head_scheme`]); the embedding table is not: it is read a few rows per token, so quantizing it
/// saves memory but no time, and small models lose more quality there than anywhere else.
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

/// The scheme of the LM head under `scheme`: 4-bit schemes keep the head at INT8 per channel, as llama.cpp keeps
/// its output tensor at 6-8 bits in every 4-bit recipe. The head's errors land on every logit directly, with no
/// later layer to average them out: on SmolLM2-135M a 4-bit head alone cost 19 points of top-1 agreement with f32
/// (docs/BENCHMARKS.md "int4 and the head").
pub fn head_scheme(scheme: QuantScheme) -> QuantScheme {
    if scheme.bits() < 8 {
        QuantScheme::INT8
    } else {
        scheme
    }
}

impl<B: EmberBackend> Transformer<B> {
    /// The model with its weights quantized as `q` says (one layer at a time, so peak memory stays near the
    /// f32 model's). Norms, biases and learned position tables stay f32. The result is for inference: quantized
    /// weights have no gradients.
    pub fn quantize(mut self, q: &Quantization) -> Result<Self> {
        let scheme = q.scheme;
        for (i, block) in self.layers.iter_mut().enumerate() {
            for (suffix, linear) in block.linears_mut() {
                linear.quantize_in_place(scheme, &layer_name(i, &format!("{suffix}.weight")))?;
            }
        }
        if q.embeddings {
            self.embed = self.embed.quantize(scheme)?;
        }
        if q.lm_head {
            let head = head_scheme(scheme);
            self.lm_head = match self.lm_head.take() {
                Some(linear) => Some(linear.quantize(head, LM_HEAD)?),
                // Tied: a quantized table already serves as the head; a dense one gets a quantized copy.
                None if matches!(self.embed, Embedding::Quantized(_) | Embedding::Ggml(_)) => None,
                None => Some(Linear::Quantized(self.embed.quantized_head(head)?)),
            };
        }
        Ok(self)
    }

    /// Bytes the weights occupy on the device (f32, quantized codes plus scales, or ggml blocks as stored), counting a weight shared
    /// by the embedding and a tied LM head once.
    pub fn weight_memory_bytes(&self) -> usize {
        let positions = self
            .pos_embed
            .as_ref()
            .map_or(0, |table| 4 * table.val().shape().num_elements());
        self.embed.memory_bytes()
            + positions
            + self.layers.iter().map(Block::memory_bytes).sum::<usize>()
            + self.final_norm.memory_bytes()
            + self.lm_head.as_ref().map_or(0, Linear::memory_bytes)
    }
}
