//! How a model multiplies activations with weights kept as ggml blocks: a setting each packed layer carries
//! (like the attention kernel its model carries), so two models in one process (a server's target and draft, a
//! test's exact and integer copies) can differ. ember-model's `Transformer::with_ggml_products` sets it on every
//! packed layer of a model; `--exact-products` on the command line selects [`GgmlProducts::Exact`].

/// The arithmetic of products with ggml blocks ([`crate::EmberBackend::ggml_dense`]).
///
/// - [`Integer`](Self::Integer) (the default, as llama.cpp does): each activation row is quantized to 8-bit
///   chunks of 32 and multiplied with the blocks in integers, moving each output by at most `Σ |w_i| d_i / 2`
///   (`d_i` the activation chunk's scale, `max |x| / 127`). Decode steps take it everywhere; prompts and decode
///   batches of 3 rows or more take it only on CPUs with AVX-512 VNNI ([`GgmlProducts::integer_prompts`]),
///   where its tiles are 2-3x faster than dequantized tiles through gemm; elsewhere they are exact either way.
/// - [`Exact`](Self::Exact): f32 activations times the dequantized blocks, exact up to f32 rounding and 3-30x
///   slower per decode product (docs/BENCHMARKS.md): the oracle the integer paths are tested against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GgmlProducts {
    /// 8-bit activations, integer dot products.
    #[default]
    Integer,
    /// f32 activations, dequantized weights.
    Exact,
}

impl GgmlProducts {
    /// Whether products of several rows (prompts, decode batches of 3 rows or more) take the integer tiles
    /// under this setting on this CPU: [`Integer`](Self::Integer) on a CPU with AVX-512 VNNI. Tests use it to
    /// choose the error bound a prompt's logits are held to.
    pub fn integer_prompts(self) -> bool {
        self == Self::Integer && crate::cpu::integer_tiles_available()
    }
}
