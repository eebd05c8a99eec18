//! `Gemma2ForCausalLM` and `Gemma3ForCausalLM` (text): the LLaMA lineage's projections with Gemma's knobs:
//! embeddings scaled by `sqrt(hidden)`, RMSNorm by `1 + weight`, a norm before and after each sublayer, a GeGLU
//! MLP, `query_pre_attn_scalar`, alternating sliding-window and global layers, soft-capped attention scores and
//! logits (Gemma 2), and q/k norms with a separate RoPE base for the sliding layers (Gemma 3).
//!
//! The truth is transformers' `models/gemma2` and `models/gemma3` (configuration and modeling files).
//!
//! Two generations share this one file (about 680 lines, the longest family): one parser and one GGUF mapping
//! driven by a `Generation` table, where a file per generation would copy both.

use ember_attention::{RopeConfig, RopeLayout};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{
    Family, GgufTensor, TensorSource, activation, from_value, gguf_names, hf_names, layer_count,
    norm_eps, rope, split_layer,
};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::{
    Activation, Biases, Features, MlpKind, ModelSpec, NormKind, NormSpec, Positions, Residual,
};
use crate::tensors::TensorSpec;

/// The Gemma 2 family.
pub struct Gemma2;

/// The Gemma 3 family (text-only `Gemma3ForCausalLM` with a `Gemma3TextConfig`).
pub struct Gemma3;

/// The keys both generations share; keys whose `null` differs from their absence are read by [`nullable`].
#[derive(Deserialize)]
struct GemmaConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    #[serde(default = "default_head_dim")]
    head_dim: usize,
    hidden_activation: Option<String>,
    hidden_act: Option<String>,
    max_position_embeddings: Option<usize>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "default_query_scalar")]
    query_pre_attn_scalar: f64,
    layer_types: Option<Vec<String>>,
    /// Gemma 3's older form of `layer_types`: every `n`-th layer is global.
    sliding_window_pattern: Option<usize>,
    #[serde(default)]
    use_bidirectional_attention: Option<bool>,
}

fn default_head_dim() -> usize {
    256
}

fn default_true() -> bool {
    true
}

fn default_query_scalar() -> f64 {
    256.0
}

/// The defaults that differ between the generations.
struct Generation {
    architecture: &'static str,
    model_type: &'static str,
    max_positions: usize,
    attn_softcap: Option<f64>,
    final_softcap: Option<f64>,
    /// Every `n`-th layer (1-based) is global when `layer_types` is absent: 2 for Gemma 2, 6 for Gemma 3.
    global_every: usize,
    /// Whether the older `sliding_window_pattern` key sets that `n` (Gemma 3 only).
    reads_pattern: bool,
    /// llama.cpp's GGUF architecture.
    gguf: &'static str,
    /// The layer count of the 27B model, whose attention scale llama.cpp takes from `hidden / heads` rather than
    /// the head width (as Google's reference config does).
    layers_27b: u64,
}

const GEMMA2: Generation = Generation {
    architecture: "Gemma2ForCausalLM",
    model_type: "gemma2",
    max_positions: 8192,
    attn_softcap: Some(50.0),
    final_softcap: Some(30.0),
    global_every: 2,
    reads_pattern: false,
    gguf: "gemma2",
    layers_27b: 46,
};

const GEMMA3: Generation = Generation {
    architecture: "Gemma3ForCausalLM",
    model_type: "gemma3_text",
    max_positions: 131_072,
    attn_softcap: None,
    final_softcap: None,
    global_every: 6,
    reads_pattern: true,
    gguf: "gemma3",
    layers_27b: 62,
};

/// `config[key]`: absent gives `default`, `null` gives `None` (transformers' defaults are not `None` for the
/// soft caps and the window, so `null` is how a config turns them off).
fn nullable<T: DeserializeOwned>(
    config: &Value,
    key: &str,
    default: Option<T>,
) -> Result<Option<T>, String> {
    match config.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| format!("`{key}`: {e}")),
    }
}

/// A soft cap read from `key`, which must be positive: transformers divides by it.
fn softcap(config: &Value, key: &str, default: Option<f64>) -> Result<Option<f64>, String> {
    let cap = nullable::<f64>(config, key, default)?;
    match cap {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(format!(
            "`{key}` is {c}, expected a positive number (or null for no capping)"
        )),
        _ => Ok(cap),
    }
}

/// Per-layer windows: `layer_types` when given, else every `global_every`-th layer global.
fn windows(
    config: &Value,
    c: &GemmaConfig,
    num_layers: usize,
    generation: &Generation,
) -> Result<Vec<Option<usize>>, String> {
    let window = nullable::<usize>(config, "sliding_window", Some(4096))?;
    if window == Some(0) {
        return Err("`sliding_window` must be positive".to_string());
    }
    let global_every = match c.sliding_window_pattern {
        Some(0) if generation.reads_pattern => {
            return Err("`sliding_window_pattern` must be positive".to_string());
        }
        Some(n) if generation.reads_pattern => n,
        _ => generation.global_every,
    };
    let sliding: Vec<bool> = match &c.layer_types {
        Some(types) => {
            if types.len() != num_layers {
                return Err(format!(
                    "`layer_types` has {} entries for {num_layers} layers",
                    types.len()
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(format!(
                        "unsupported `layer_types` entry `{other}` (supported: sliding_attention, full_attention)"
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        None => (0..num_layers)
            .map(|i| !(i + 1).is_multiple_of(global_every))
            .collect(),
    };
    if window.is_none() && sliding.contains(&true) {
        return Err("`sliding_window` is null but `layer_types` has sliding layers".to_string());
    }
    Ok(sliding
        .iter()
        .map(|&s| if s { window } else { None })
        .collect())
}

/// Gemma 3's two RoPEs `(global, local)`: `rope_parameters.full_attention` / `.sliding_attention`, or the older
/// `rope_theta` (+ `rope_scaling`, global layers only) and `rope_local_base_freq`.
fn gemma3_ropes(
    config: &Value,
    head_dim: usize,
    max_positions: usize,
) -> Result<(RopeConfig, RopeConfig), String> {
    let nested = match config.get("rope_parameters") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => {
            if !map.contains_key("full_attention") && !map.contains_key("sliding_attention") {
                return Err(
                    "`rope_parameters` must have `full_attention` / `sliding_attention` entries"
                        .to_string(),
                );
            }
            Some(map)
        }
        Some(_) => return Err("`rope_parameters` must be an object".to_string()),
    };
    let part = |key: &str| nested.and_then(|m| m.get(key)).cloned();
    // transformers fills each layer type's theta from the legacy keys, then from its defaults (1e6 global, 1e4
    // local); `rope_scaling` updates the global entry only.
    let legacy = |key: &str, default: f64| config.get(key).cloned().unwrap_or(json!(default));
    let mut global = json!({ "rope_theta": legacy("rope_theta", 1_000_000.0) });
    if let Some(p) = part("full_attention") {
        global["rope_parameters"] = p;
    }
    if let Some(s) = config.get("rope_scaling") {
        global["rope_scaling"] = s.clone();
    }
    let mut local = json!({ "rope_theta": legacy("rope_local_base_freq", 10_000.0) });
    if let Some(p) = part("sliding_attention") {
        local["rope_parameters"] = p;
    }
    let parse = |c: &Value, what: &str| {
        rope::parse(c, &rope::STANDARD, head_dim, max_positions)
            .map_err(|e| format!("{what} RoPE: {e}"))
    };
    Ok((
        parse(&global, "global (`full_attention`)")?,
        parse(&local, "local (`sliding_attention`)")?,
    ))
}

fn parse_gemma(config: &Value, generation: &Generation) -> Result<ModelSpec, String> {
    let c: GemmaConfig = from_value(config)?;
    if c.use_bidirectional_attention == Some(true) {
        return Err(
            "`use_bidirectional_attention: true` is not supported (ember is causal)".to_string(),
        );
    }
    if c.num_attention_heads == 0 {
        return Err("`num_attention_heads` must be positive".to_string());
    }
    if !(c.query_pre_attn_scalar.is_finite() && c.query_pre_attn_scalar > 0.0) {
        return Err(format!(
            "`query_pre_attn_scalar` is {}, expected a positive number",
            c.query_pre_attn_scalar
        ));
    }
    // transformers' Gemma 2/3 read only `hidden_activation` (default gelu_pytorch_tanh) and ignore
    // `hidden_act`; a `hidden_act` that disagrees is refused rather than guessed at.
    let act_name = c
        .hidden_activation
        .as_deref()
        .unwrap_or("gelu_pytorch_tanh");
    let act = activation("hidden_activation", act_name)?;
    if let Some(other) = &c.hidden_act
        && activation("hidden_act", other)? != act
    {
        return Err(format!(
            "`hidden_act` ({other}) disagrees with `hidden_activation` ({act_name}), which Gemma uses"
        ));
    }
    let num_layers = layer_count("num_hidden_layers", c.num_hidden_layers)?;
    let context_length = c
        .max_position_embeddings
        .unwrap_or(generation.max_positions);
    let (global, local) = if generation.model_type == GEMMA3.model_type {
        let (global, local) = gemma3_ropes(config, c.head_dim, context_length)?;
        let local = (local != global).then_some(local);
        (global, local)
    } else {
        (
            rope::parse(config, &rope::STANDARD, c.head_dim, context_length)?,
            None,
        )
    };
    let scalar = c.query_pre_attn_scalar;
    Ok(ModelSpec {
        architecture: generation.architecture.to_string(),
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        num_layers,
        num_heads: c.num_attention_heads,
        num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
        head_dim: c.head_dim,
        intermediate_size: c.intermediate_size,
        context_length,
        positions: Positions::Rope(global),
        attention_windows: windows(config, &c, num_layers, generation)?,
        features: Features {
            norm: NormSpec {
                kind: NormKind::RmsNorm,
                eps: norm_eps::from_config(config, "rms_norm_eps", 1e-6)?,
                bias: false,
            },
            activation: act,
            mlp: MlpKind::Gated,
            biases: Biases {
                qkv: c.attention_bias,
                attn_out: c.attention_bias,
                mlp_in: false,
                mlp_out: false,
            },
            qk_norm: generation.model_type == GEMMA3.model_type,
            // The usual 1/sqrt(head_dim) stays `None`, so a saved spec reads back equal.
            attention_scale: (scalar != c.head_dim as f64).then(|| scalar.powf(-0.5)),
            tied_embeddings: c.tie_word_embeddings,
            scaled_embeddings: true,
            norm_unit_offset: true,
            post_norms: true,
            attn_softcap: softcap(config, "attn_logit_softcapping", generation.attn_softcap)?,
            final_softcap: softcap(config, "final_logit_softcapping", generation.final_softcap)?,
            local_rope: local,
            ..Features::default()
        },
    })
}

/// The integer `query_pre_attn_scalar` whose `** -0.5` is exactly `scale` (transformers types it `int`).
fn query_scalar(spec: &ModelSpec) -> Result<u64, String> {
    let Some(scale) = spec.features.attention_scale else {
        return Ok(spec.head_dim as u64);
    };
    let scalar = (1.0 / (scale * scale)).round();
    if (1.0..2f64.powi(53)).contains(&scalar) && scalar.powf(-0.5) == scale {
        Ok(scalar as u64)
    } else {
        Err(format!(
            "attention scale {scale} is not n^-0.5 for an integer `query_pre_attn_scalar` n"
        ))
    }
}

fn gemma_config(spec: &ModelSpec, generation: &Generation) -> Result<Value, String> {
    let f = &spec.features;
    let Positions::Rope(global) = &spec.positions else {
        return Err("Gemma uses RoPE, not learned positions".to_string());
    };
    if std::iter::once(global)
        .chain(f.local_rope.as_ref())
        .any(|r| r.layout != RopeLayout::RotateHalf || r.rotary_dim != r.head_dim)
    {
        return Err("Gemma rotates whole heads in the rotate-half layout".to_string());
    }
    let b = f.biases;
    let expressible = f.norm.kind == NormKind::RmsNorm
        && f.residual == Residual::Sequential
        && f.mlp == MlpKind::Gated
        && f.scaled_embeddings
        && f.norm_unit_offset
        && f.post_norms
        && b.qkv == b.attn_out
        && !b.mlp_in
        && !b.mlp_out;
    if !expressible {
        return Err("Gemma needs RMSNorm by 1 + weight with post-norms, a sequential residual, a gated MLP \
                    without biases, scaled embeddings and one attention_bias switch"
            .to_string());
    }
    let is_gemma3 = generation.model_type == GEMMA3.model_type;
    if f.qk_norm != is_gemma3 {
        return Err(format!(
            "{} {} q/k norms",
            generation.architecture,
            if is_gemma3 { "has" } else { "has no" }
        ));
    }
    let sizes: Vec<usize> = spec.attention_windows.iter().flatten().copied().collect();
    if sizes.windows(2).any(|w| w[0] != w[1]) {
        return Err("Gemma layers share one sliding window size".to_string());
    }
    let layer_types: Vec<&str> = spec
        .attention_windows
        .iter()
        .map(|w| {
            if w.is_some() {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let mut config = json!({
        "architectures": [generation.architecture],
        "model_type": generation.model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        // Gemma's own name for the tanh GELU (`gelu_new` is the same function under GPT-2's name).
        "hidden_activation": match f.activation {
            Activation::GeluTanh => "gelu_pytorch_tanh",
            other => other.hf_name(),
        },
        "max_position_embeddings": spec.context_length,
        "rms_norm_eps": f.norm.eps,
        "tie_word_embeddings": f.tied_embeddings,
        "attention_bias": b.qkv,
        "query_pre_attn_scalar": query_scalar(spec)?,
        "sliding_window": sizes.first(),
        "layer_types": layer_types,
        "attn_logit_softcapping": f.attn_softcap,
        "final_logit_softcapping": f.final_softcap,
        "torch_dtype": "float32",
    });
    if is_gemma3 {
        let local = f.local_rope.as_ref().unwrap_or(global);
        config["rope_parameters"] = json!({
            "full_attention": rope::to_parameters(global),
            "sliding_attention": rope::to_parameters(local),
        });
    } else {
        if f.local_rope.is_some() {
            return Err("Gemma 2 has one RoPE for every layer".to_string());
        }
        config["rope_theta"] = json!(global.theta);
        config["rope_parameters"] = rope::to_parameters(global);
    }
    Ok(config)
}

/// Gemma's checkpoint names: the LLaMA lineage's, except that its four block norms are
/// `input_layernorm`, `post_attention_layernorm` (the attention output's post-norm, not the MLP's pre-norm as
/// in LLaMA), `pre_feedforward_layernorm` and `post_feedforward_layernorm`.
fn gemma_source(tensor: &TensorSpec) -> TensorSource {
    let renamed = split_layer(&tensor.name).and_then(|(layer, suffix)| {
        let (module, param) = suffix.rsplit_once('.')?;
        let hf = match module {
            "attn_post_norm" => "post_attention_layernorm",
            "mlp_norm" => "pre_feedforward_layernorm",
            "mlp_post_norm" => "post_feedforward_layernorm",
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{hf}.{param}"))
    });
    match renamed {
        Some(name) => TensorSource::whole(name, tensor),
        None => hf_names::llama_source(tensor),
    }
}

impl Family for Gemma2 {
    fn architecture(&self) -> &'static str {
        GEMMA2.architecture
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        parse_gemma(config, &GEMMA2)
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        gemma_source(tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        gemma_config(spec, &GEMMA2)
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some(GEMMA2.gguf)
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        gemma_gguf_config(h, &GEMMA2)
    }

    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        gemma_gguf_metadata(spec, &GEMMA2)
    }

    fn gguf_tensor(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        gemma_gguf_tensor(tensor)
    }
}

impl Family for Gemma3 {
    fn architecture(&self) -> &'static str {
        GEMMA3.architecture
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        parse_gemma(config, &GEMMA3)
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        gemma_source(tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        gemma_config(spec, &GEMMA3)
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some(GEMMA3.gguf)
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        gemma_gguf_config(h, &GEMMA3)
    }

    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        gemma_gguf_metadata(spec, &GEMMA3)
    }

    fn gguf_tensor(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        gemma_gguf_tensor(tensor)
    }
}

/// The config of a Gemma GGUF file. What the metadata does not carry is llama.cpp's own rule: the attention scale
/// (`1/sqrt(head_dim)`, `1/sqrt(hidden/heads)` for the 27B models), and which layers slide
/// (`attention.sliding_window_pattern`, a count or a per-layer array, by default every 2nd (Gemma 2) / 6th
/// (Gemma 3) layer global); absent soft caps are off.
fn gemma_gguf_config(h: &GgufHparams<'_>, generation: &Generation) -> Result<Value, GgufError> {
    let mut config = h.rope_lineage(generation.architecture, 10_000.0)?;
    config["model_type"] = json!(generation.model_type);
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    let layers = h.block_count()?;
    let heads = h.uint("attention.head_count")?.max(1);
    config["query_pre_attn_scalar"] = if layers == generation.layers_27b {
        json!(h.hidden_size()? / heads)
    } else {
        config["head_dim"].clone()
    };
    config["attn_logit_softcapping"] = json!(h.opt_float("attn_logit_softcapping")?);
    config["final_logit_softcapping"] = json!(h.opt_float("final_logit_softcapping")?);
    let window = h.opt_uint("attention.sliding_window")?.filter(|&w| w > 0);
    let pattern_key = h.key("attention.sliding_window_pattern");
    let sliding: Vec<bool> = match h.file().get(&pattern_key) {
        _ if window.is_none() => vec![false; layers as usize],
        Some(MetadataValue::Array(flags)) => {
            if flags.len() as u64 != layers {
                return Err(h.file().metadata_error(
                    &pattern_key,
                    &format!("one flag per layer ({layers})"),
                    format!("{} entries", flags.len()),
                ));
            }
            flags
                .iter()
                .map(|f| {
                    f.as_bool().ok_or_else(|| {
                        h.file()
                            .metadata_error(&pattern_key, "an array of booleans", f.type_name())
                    })
                })
                .collect::<Result<_, _>>()?
        }
        _ => {
            let n = h
                .opt_uint("attention.sliding_window_pattern")?
                .unwrap_or(generation.global_every as u64);
            // llama.cpp: layer `il` slides when `il % n < n - 1` (0 = every layer).
            (0..layers).map(|il| n == 0 || il % n < n - 1).collect()
        }
    };
    config["sliding_window"] = json!(window);
    config["layer_types"] = json!(
        sliding
            .iter()
            .map(|&s| if s {
                "sliding_attention"
            } else {
                "full_attention"
            })
            .collect::<Vec<_>>()
    );
    if let Some(local) = h.opt_float("rope.freq_base_swa")? {
        config["rope_local_base_freq"] = json!(local);
    }
    Ok(config)
}

/// The metadata of a Gemma GGUF file, or why llama.cpp would run `spec` differently: llama.cpp fixes what the
/// file does not say (which layers slide, Gemma 2's soft caps when absent, one RoPE scaling for the global
/// layers only), so a spec off those rules is refused here rather than written as another model. The attention
/// scale and everything else is checked by reading the file back.
fn gemma_gguf_metadata(
    spec: &ModelSpec,
    generation: &Generation,
) -> Result<Vec<(String, MetadataValue)>, String> {
    let f = &spec.features;
    let arch = generation.gguf;
    let sizes: Vec<usize> = spec.attention_windows.iter().flatten().copied().collect();
    if sizes.windows(2).any(|w| w[0] != w[1]) {
        return Err("Gemma layers share one sliding window size".to_string());
    }
    let n = generation.global_every;
    let pattern = (0..spec.num_layers)
        .all(|il| spec.attention_windows.get(il).is_some_and(Option::is_some) == (il % n < n - 1));
    if !pattern {
        return Err(format!(
            "llama.cpp runs {} with layers {}, {}, ... global and the others sliding, which these layers' \
             windows are not",
            generation.architecture,
            n - 1,
            2 * n - 1
        ));
    }
    let is_gemma3 = generation.model_type == GEMMA3.model_type;
    let capped = f.attn_softcap.is_some() && f.final_softcap.is_some();
    if is_gemma3 && (f.attn_softcap.is_some() || f.final_softcap.is_some()) {
        return Err("llama.cpp's gemma3 has no soft caps".to_string());
    }
    if !is_gemma3 && !capped {
        return Err(
            "llama.cpp caps every Gemma 2's attention scores and logits (50 and 30 when the \
                    file gives none)"
                .to_string(),
        );
    }
    let mut out = crate::gguf::rope_lineage_metadata(arch, spec)?;
    let mut put = |key: &str, value: MetadataValue| out.push((format!("{arch}.{key}"), value));
    if let Some(cap) = f.attn_softcap {
        put("attn_logit_softcapping", MetadataValue::F32(cap as f32));
    }
    if let Some(cap) = f.final_softcap {
        put("final_logit_softcapping", MetadataValue::F32(cap as f32));
    }
    if let Some(&window) = sizes.first() {
        put(
            "attention.sliding_window",
            crate::gguf::count_value(window, "sliding window")?,
        );
    }
    if let Some(local) = &f.local_rope {
        if local.scaling != ember_attention::RopeScaling::None {
            return Err("llama.cpp scales the RoPE of Gemma's global layers only".to_string());
        }
        put("rope.freq_base_swa", MetadataValue::F32(local.theta as f32));
    }
    Ok(out)
}

/// Gemma's GGUF tensors: llama.cpp's names (`post_attention_norm`, `ffn_norm` for the pre-feed-forward norm,
/// `post_ffw_norm`), every norm stored as `1 + weight` by the converter.
fn gemma_gguf_tensor(tensor: &TensorSpec) -> Option<GgufTensor> {
    let renamed = split_layer(&tensor.name).and_then(|(layer, suffix)| {
        let name = match suffix {
            "attn_post_norm.weight" => "post_attention_norm.weight",
            "mlp_post_norm.weight" => "post_ffw_norm.weight",
            _ => return None,
        };
        Some(GgufTensor::whole(format!("blk.{layer}.{name}")))
    });
    let place = renamed.or_else(|| gguf_names::whole(&tensor.name))?;
    Some(if tensor.name.ends_with("norm.weight") {
        place.offset(1.0)
    } else {
        place
    })
}

/// Refuses, for a family `architecture` that has none of Gemma's knobs, a spec that uses one, naming it by its
/// Gemma config key: every other family's `to_config` calls this, so no knob is dropped on save.
pub(crate) fn refuse_gemma_knobs(spec: &ModelSpec, architecture: &str) -> Result<(), String> {
    let f = &spec.features;
    let used = [
        (
            f.scaled_embeddings,
            "embeddings scaled by sqrt(hidden_size)",
        ),
        (f.norm_unit_offset, "RMSNorm by (1 + weight)"),
        (f.post_norms, "post-norms (`post_feedforward_layernorm`)"),
        (f.attn_softcap.is_some(), "`attn_logit_softcapping`"),
        (f.final_softcap.is_some(), "`final_logit_softcapping`"),
        (
            f.local_rope.is_some(),
            "a local RoPE (`rope_local_base_freq`)",
        ),
    ];
    match used.iter().find(|(on, _)| *on) {
        Some((_, knob)) => Err(format!("{architecture} cannot express Gemma's {knob}")),
        None => Ok(()),
    }
}
