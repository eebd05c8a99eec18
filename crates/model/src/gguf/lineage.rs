//! The `{arch}.*` metadata llama.cpp reads for the RoPE families (LLaMA, Qwen 2, Qwen 3): what its converter
//! writes from a Hugging Face config, and what [`super::GgufHparams::rope_lineage`] reads back.

use ember_attention::RopeScaling;

use super::MetadataValue;
use crate::arch::rope;
use crate::spec::{ModelSpec, Positions};

/// `spec` as a GGUF file can hold it. GGUF stores these floats as f32 (llama.cpp refuses any other type for
/// them), so a spec written to GGUF reads back with them rounded to f32. LLaMA 3 scaling is stored as its
/// frequency divisors, whose parameters are not unique: it reads back as the parameters
/// [`rope::llama3_from_factors`] solves from them, which give the same frequencies.
pub(crate) fn as_stored(spec: &ModelSpec) -> Result<ModelSpec, String> {
    let mut stored = spec.clone();
    let round = |v: f64| f64::from(v as f32);
    stored.features.norm.eps = round(stored.features.norm.eps);
    let global = match &mut stored.positions {
        Positions::Rope(rope) => Some(rope),
        _ => None,
    };
    for rope in global
        .into_iter()
        .chain(stored.features.local_rope.as_mut())
    {
        let divisors = rope::frequency_divisors(rope);
        rope.theta = round(rope.theta);
        match &mut rope.scaling {
            RopeScaling::Linear { factor } => *factor = round(*factor),
            RopeScaling::Llama3 { .. } => {
                rope.scaling = rope::llama3_from_factors(rope.theta, rope.rotary_dim, &divisors)?;
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                attention_factor,
                ..
            } => {
                short_factor.iter_mut().for_each(|f| *f = round(*f));
                long_factor.iter_mut().for_each(|f| *f = round(*f));
                *attention_factor = round(*attention_factor);
            }
            RopeScaling::None | RopeScaling::Dynamic { .. } => {}
        }
    }
    Ok(stored)
}

/// `n` as the u32 GGUF stores counts in, or an error naming `what` when it does not fit.
pub(crate) fn count_value(n: usize, what: &str) -> Result<MetadataValue, String> {
    u32::try_from(n)
        .map(MetadataValue::U32)
        .map_err(|_| format!("{what} {n} does not fit GGUF's u32"))
}

/// The metadata of a RoPE-lineage model of `spec` under architecture `arch`, or why it has a setting llama.cpp
/// files of that architecture cannot carry.
pub(crate) fn rope_lineage_metadata(
    arch: &str,
    spec: &ModelSpec,
) -> Result<Vec<(String, MetadataValue)>, String> {
    let Positions::Rope(rope) = &spec.positions else {
        return Err("needs rotary position embeddings".to_string());
    };
    let mut out = Vec::new();
    let mut put = |key: &str, value: MetadataValue| out.push((format!("{arch}.{key}"), value));
    let count = count_value;
    put(
        "context_length",
        count(spec.context_length, "context length")?,
    );
    put("embedding_length", count(spec.hidden_size, "hidden size")?);
    put("block_count", count(spec.num_layers, "layer count")?);
    put(
        "feed_forward_length",
        count(spec.intermediate_size, "intermediate size")?,
    );
    put("attention.head_count", count(spec.num_heads, "head count")?);
    put(
        "attention.head_count_kv",
        count(spec.num_kv_heads, "key/value head count")?,
    );
    if spec.head_dim * spec.num_heads != spec.hidden_size {
        put("attention.key_length", count(spec.head_dim, "head width")?);
        put(
            "attention.value_length",
            count(spec.head_dim, "head width")?,
        );
    }
    put(
        "attention.layer_norm_rms_epsilon",
        MetadataValue::F32(spec.features.norm.eps as f32),
    );
    put("rope.freq_base", MetadataValue::F32(rope.theta as f32));
    put(
        "rope.dimension_count",
        count(rope.rotary_dim, "rotary width")?,
    );
    put("vocab_size", count(spec.vocab_size, "vocabulary size")?);
    match &rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            put("rope.scaling.type", MetadataValue::String("linear".into()));
            put("rope.scaling.factor", MetadataValue::F32(*factor as f32));
        }
        other => {
            let name = match other {
                RopeScaling::Llama3 { .. } => "llama3",
                RopeScaling::Dynamic { .. } => "dynamic",
                RopeScaling::LongRope { .. } => "longrope",
                _ => "this",
            };
            return Err(format!(
                "llama.cpp's `{arch}` files cannot carry its `{name}` rope scaling (they carry none and \
                 linear; `llama` also llama3, `phi3` longrope)"
            ));
        }
    }
    Ok(out)
}
