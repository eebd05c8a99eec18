//! Whole-file quantization recipes (`q4_k_m`, `q8_0`, ...) and the type each tensor gets under one: llama.cpp's
//! per-tensor mix (`llama_tensor_get_type` in `llama-quant.cpp`), so a file ember quantizes has the layout of
//! the one llama.cpp's quantizer makes from the same weights.
//!
//! The mix spends bits where errors cost most: the output head (and a tied embedding, which is the head) gets
//! Q6_K; under the `_M` recipes the value projections and the MLP down projections of the first and last eighth
//! of the layers, and of every third layer between, get more bits. A type whose block does not divide a
//! tensor's rows falls back to a 32-element type of similar size, and to F16 when even that does not fit.

use std::fmt;

use super::GgmlType;

/// A quantization recipe for a whole file, named as llama.cpp names its `llama_ftype`s.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufRecipe {
    /// Every tensor f32.
    F32,
    /// Matrices f16, vectors f32.
    F16,
    /// Matrices bf16, vectors f32.
    Bf16,
    /// Q4_0 matrices, the head Q6_K.
    Q4_0,
    /// Q4_1 matrices, the head Q6_K.
    Q4_1,
    /// Q5_0 matrices, the head Q6_K.
    Q5_0,
    /// Q5_1 matrices, the head Q6_K.
    Q5_1,
    /// Q8_0 everywhere.
    Q8_0,
    /// Q2_K, with Q3_K/Q4_K value, output and down projections.
    Q2_K,
    /// Q3_K throughout (the head Q6_K).
    Q3_K_S,
    /// Q3_K with Q4_K/Q5_K value, output and down projections.
    Q3_K_M,
    /// Q3_K with Q5_K value, output and down projections.
    Q3_K_L,
    /// Q4_K, with Q5_K for the first layers' value and down projections.
    Q4_K_S,
    /// Q4_K, with Q6_K for about half the layers' value and down projections: the usual download.
    Q4_K_M,
    /// Q5_K throughout (the head Q6_K).
    Q5_K_S,
    /// Q5_K, with Q6_K for about half the layers' value and down projections.
    Q5_K_M,
    /// Q6_K everywhere.
    Q6_K,
}

/// Every recipe with its name, in the order `--quantize` lists them.
pub const RECIPES: [(&str, GgufRecipe); 17] = [
    ("f32", GgufRecipe::F32),
    ("f16", GgufRecipe::F16),
    ("bf16", GgufRecipe::Bf16),
    ("q8_0", GgufRecipe::Q8_0),
    ("q6_k", GgufRecipe::Q6_K),
    ("q5_k_m", GgufRecipe::Q5_K_M),
    ("q5_k_s", GgufRecipe::Q5_K_S),
    ("q5_1", GgufRecipe::Q5_1),
    ("q5_0", GgufRecipe::Q5_0),
    ("q4_k_m", GgufRecipe::Q4_K_M),
    ("q4_k_s", GgufRecipe::Q4_K_S),
    ("q4_1", GgufRecipe::Q4_1),
    ("q4_0", GgufRecipe::Q4_0),
    ("q3_k_l", GgufRecipe::Q3_K_L),
    ("q3_k_m", GgufRecipe::Q3_K_M),
    ("q3_k_s", GgufRecipe::Q3_K_S),
    ("q2_k", GgufRecipe::Q2_K),
];

/// What the type choice needs to know about one tensor.
#[derive(Clone, Copy, Debug)]
pub struct RecipeTensor<'a> {
    /// The GGUF tensor name.
    pub name: &'a str,
    /// Its dimension count.
    pub dims: usize,
    /// The length of its rows (the innermost dimension, which blocks divide).
    pub cols: usize,
    /// The block it belongs to (`blk.{layer}.`), if any.
    pub layer: Option<usize>,
    /// The model's block count.
    pub layers: usize,
    /// Whether the file has no `output.weight`, so the token embedding is also the head.
    pub tied: bool,
    /// Query heads per key/value head.
    pub gqa: usize,
}

impl RecipeTensor<'_> {
    /// The block of GGUF tensor `name` (`blk.{layer}.`), if it is in one.
    pub fn layer_of(name: &str) -> Option<usize> {
        name.strip_prefix("blk.")?.split_once('.')?.0.parse().ok()
    }
}

impl GgufRecipe {
    /// The recipe called `name` (case-insensitive: `Q4_K_M` and `q4_k_m` alike).
    pub fn parse(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        RECIPES.iter().find(|(n, _)| *n == lower).map(|&(_, r)| r)
    }

    /// The names of every recipe, for error messages and help.
    pub fn names() -> String {
        RECIPES.map(|(n, _)| n).join(", ")
    }

    /// llama.cpp's `general.file_type` number of the recipe (`enum llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 7,
            Self::Q5_0 => 8,
            Self::Q5_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K_S => 11,
            Self::Q3_K_M => 12,
            Self::Q3_K_L => 13,
            Self::Q4_K_S => 14,
            Self::Q4_K_M => 15,
            Self::Q5_K_S => 16,
            Self::Q5_K_M => 17,
            Self::Q6_K => 18,
            Self::Bf16 => 32,
        }
    }

    /// The type most matrices get.
    pub fn default_type(self) -> GgmlType {
        match self {
            Self::F32 => GgmlType::F32,
            Self::F16 => GgmlType::F16,
            Self::Bf16 => GgmlType::Bf16,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q2_K => GgmlType::Q2_K,
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L => GgmlType::Q3_K,
            Self::Q4_K_S | Self::Q4_K_M => GgmlType::Q4_K,
            Self::Q5_K_S | Self::Q5_K_M => GgmlType::Q5_K,
            Self::Q6_K => GgmlType::Q6_K,
        }
    }

    /// The type `tensor` is stored in under this recipe. Vectors, norms and position embeddings stay f32, as
    /// llama.cpp keeps them.
    pub fn tensor_type(self, tensor: &RecipeTensor<'_>) -> GgmlType {
        if !quantizable(tensor) {
            return GgmlType::F32;
        }
        let base = self.default_type();
        if !base.is_block_quantized() {
            return base;
        }
        fallback(self.mixed_type(tensor, base), tensor.cols)
    }

    /// llama.cpp's choice for `tensor` before the shape fallback.
    fn mixed_type(self, tensor: &RecipeTensor<'_>, base: GgmlType) -> GgmlType {
        use GgmlType as T;
        let category = Category::of(tensor.name);
        let (layer, layers) = (tensor.layer.unwrap_or(0), tensor.layers.max(1));
        let more_bits = use_more_bits(layer, layers);
        // A tied embedding is the output head too, and gets the head's type.
        let head = category == Category::Output || (category == Category::TokenEmbd && tensor.tied);
        if head {
            return if !tensor.cols.is_multiple_of(block_len(base)) {
                T::Q8_0
            } else if base != T::Q8_0 {
                T::Q6_K
            } else {
                base
            };
        }
        match category {
            Category::Output | Category::TokenEmbd => base,
            Category::AttnV => match self {
                Self::Q2_K if tensor.gqa >= 4 => T::Q4_K,
                Self::Q2_K => T::Q3_K,
                Self::Q3_K_M if layer < 2 => T::Q5_K,
                Self::Q3_K_M => T::Q4_K,
                Self::Q3_K_L => T::Q5_K,
                Self::Q4_K_M | Self::Q5_K_M if more_bits => T::Q6_K,
                Self::Q4_K_S if layer < 4 => T::Q5_K,
                _ => base,
            },
            Category::FfnDown => match self {
                Self::Q2_K => T::Q3_K,
                Self::Q3_K_M if layer < layers / 16 => T::Q5_K,
                Self::Q3_K_M => T::Q4_K,
                Self::Q3_K_L => T::Q5_K,
                Self::Q4_K_M | Self::Q5_K_M if more_bits => T::Q6_K,
                Self::Q4_K_S if layer < layers / 8 => T::Q5_K,
                _ => base,
            },
            Category::AttnOutput => match self {
                Self::Q2_K => T::Q3_K,
                Self::Q3_K_M => T::Q4_K,
                Self::Q3_K_L => T::Q5_K,
                _ => base,
            },
            Category::Other => base,
        }
    }
}

impl fmt::Display for GgufRecipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = RECIPES
            .iter()
            .find(|(_, r)| r == self)
            .map_or("?", |(n, _)| n);
        f.write_str(name)
    }
}

/// llama.cpp's broad tensor categories, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    /// The value projection, or a stacked query/key/value one (which llama.cpp treats as a value projection).
    AttnV,
    AttnOutput,
    FfnDown,
    Other,
}

impl Category {
    fn of(name: &str) -> Self {
        if name == super::OUTPUT {
            Self::Output
        } else if name == super::TOKEN_EMBD {
            Self::TokenEmbd
        } else if name.contains("attn_qkv.weight") || name.contains("attn_v.weight") {
            Self::AttnV
        } else if name.contains("attn_output.weight") {
            Self::AttnOutput
        } else if name.contains("ffn_down") {
            Self::FfnDown
        } else {
            Self::Other
        }
    }
}

/// Whether llama.cpp quantizes `tensor` at all: matrices whose name ends in `weight`, except norms and position
/// embeddings.
fn quantizable(tensor: &RecipeTensor<'_>) -> bool {
    tensor.dims >= 2
        && tensor.name.ends_with("weight")
        && !tensor.name.contains("_norm.weight")
        && tensor.name != "position_embd.weight"
        && !tensor.name.contains("ffn_gate_inp.weight")
}

/// The first and last eighth of the layers, and every third layer between.
fn use_more_bits(layer: usize, layers: usize) -> bool {
    let (i, n) = (layer as i64, layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn block_len(ty: GgmlType) -> usize {
    ty.block_geometry().map_or(1, |(len, _)| len)
}

/// `ty`, or llama.cpp's substitute when its blocks do not divide rows of `cols`.
fn fallback(ty: GgmlType, cols: usize) -> GgmlType {
    use GgmlType as T;
    if cols.is_multiple_of(block_len(ty)) {
        return ty;
    }
    let substitute = match ty {
        T::Q2_K | T::Q3_K => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        T::IQ4_XS => T::IQ4_NL,
        other => other,
    };
    if cols.is_multiple_of(block_len(substitute)) {
        substitute
    } else {
        T::F16
    }
}
