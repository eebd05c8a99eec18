//! GGUF files of every family ember reads from GGUF, written by llama.cpp's own converter from tiny random
//! Hugging Face models (scripts/fixtures/gguf_family_fixtures.py): ember's logits from the GGUF equal
//! transformers' (its GGUF reader, or the original checkpoint where that reader loses something, see each
//! fixture's `.json`), and greedy decoding through the KV cache gives transformers' continuation.

mod common;

use std::path::PathBuf;

use common::{B, floats, max_abs_diff, tokens};
use ember_model::GgmlProducts;
use ember_model::gguf::{self, GgufFile};
use safetensors::SafeTensors;

/// Every fixture, with the Hugging Face architecture its GGUF must map to.
const FIXTURES: [(&str, &str); 13] = [
    ("llama", "LlamaForCausalLM"),
    ("llama_bias", "LlamaForCausalLM"),
    ("llama3", "LlamaForCausalLM"),
    ("llama_q8_0", "LlamaForCausalLM"),
    // llama.cpp converts Mistral to `llama`.
    ("mistral", "LlamaForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
    ("phi3", "Phi3ForCausalLM"),
    // LongRoPE: the prompt is longer than the original context (long factors).
    ("phi3_longrope", "Phi3ForCausalLM"),
    ("gpt2", "GPT2LMHeadModel"),
    ("gpt_neox", "GPTNeoXForCausalLM"),
    ("gemma2", "Gemma2ForCausalLM"),
    ("gemma3", "Gemma3ForCausalLM"),
];

/// f32 on both sides from the same stored values (the Q8_0 file: the same dequantized blocks, which ember's
/// dequantizer reproduces bit for bit); only the summation order differs, so as for the safetensors parity
/// fixtures 1e-4 bounds rounding while a wrong permutation, stacked slice or norm offset is > 1e-1.
const LOGIT_TOLERANCE: f32 = 1e-4;

fn path(name: &str, ext: &str) -> PathBuf {
    common::fixture("gguf_families").join(format!("{name}.{ext}"))
}

struct Expected {
    tokens: Vec<u32>,
    logits: Vec<f32>,
    greedy: Vec<u32>,
    greedy_min_gap: f32,
}

fn expected(name: &str) -> Expected {
    let bytes = std::fs::read(path(name, "safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ints = |key: &str| -> Vec<u32> {
        st.tensor(key)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    Expected {
        tokens: ints("tokens"),
        logits: floats(&st, "logits"),
        greedy: ints("greedy"),
        greedy_min_gap: floats(&st, "greedy_min_gap")[0],
    }
}

fn open(name: &str) -> GgufFile {
    GgufFile::open(path(name, "gguf.bin")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_family_loads_from_gguf_with_transformers_logits_and_greedy_ids() {
    let mut failures = Vec::new();
    for (name, architecture) in FIXTURES {
        let file = open(name);
        let (family, spec) = gguf::model_spec(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(family.architecture(), architecture, "{name}");
        assert_eq!(spec.architecture, architecture, "{name}");
        let exp = expected(name);
        assert!(
            exp.greedy_min_gap > 10.0 * LOGIT_TOLERANCE,
            "{name}: the fixture has a near tie"
        );
        let model = gguf::load::<B>(&file, &Default::default(), None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let logits = model.forward(tokens(&exp.tokens)).unwrap();
        let got = logits.into_data().into_vec::<f32>().unwrap();
        let diff = max_abs_diff(&got, &exp.logits);
        if diff > LOGIT_TOLERANCE {
            failures.push(format!("{name}: max |ember - transformers| = {diff}"));
        }
        let ids = common::greedy(&model, &exp.tokens, exp.greedy.len());
        if ids != exp.greedy {
            failures.push(format!(
                "{name}: greedy {ids:?}, transformers {:?}",
                exp.greedy
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_q8_0_file_kept_packed_gives_the_dequantized_logits() {
    let file = open("llama_q8_0");
    let exp = expected("llama_q8_0");
    let model = gguf::load_quantized::<B>(&file, &Default::default(), None).unwrap();
    assert!(
        model.weight_memory_bytes()
            < gguf::load::<B>(&file, &Default::default(), None)
                .unwrap()
                .weight_memory_bytes(),
        "the Q8_0 matrices stay packed"
    );
    let scale = exp.logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    for exact in [true, false] {
        let products = if exact {
            GgmlProducts::Exact
        } else {
            GgmlProducts::Integer
        };
        let got = model
            .clone()
            .with_ggml_products(products)
            .forward(tokens(&exp.tokens))
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let diff = max_abs_diff(&got, &exp.logits);
        // Exact, the packed Q8_0 products accumulate the same dequantized values in another order: the same 1e-4
        // holds, and so it does on the default products where this 24-token prompt takes the exact tiles. On
        // CPUs with AVX-512 VNNI the default rounds the prompt's activations to 8 bits: through random layers
        // that moved these logits by 0.38 of 6.8 (5.6%; random weights make no small outputs cancel, as
        // crates/model/tests/gguf_packed.rs finds too), held to 10% of the largest logit, while a wrong block or
        // row is off by the logits' own size.
        let bound = if !products.integer_prompts() {
            LOGIT_TOLERANCE
        } else {
            0.1 * scale
        };
        assert!(
            diff <= bound,
            "exact products: {exact}: max |packed - transformers| = {diff} (logits up to {scale})"
        );
    }
}

#[test]
fn gguf_specs_equal_the_original_checkpoints_specs() {
    // The converter's metadata maps back to the same spec the Hugging Face config gives (the safetensors parity
    // fixtures of the same families), up to what GGUF cannot carry: vocabulary, sizes and names differ per
    // fixture, so only the structural features are compared.
    for (gguf_name, hf_name) in [
        ("qwen3", "qwen3"),
        ("gpt_neox", "gpt_neox"),
        ("gpt2", "gpt2"),
    ] {
        let (_, from_gguf) = gguf::model_spec(&open(gguf_name)).unwrap();
        let from_hf = ember_model::ModelDir::open(&common::fixture(hf_name))
            .unwrap()
            .spec;
        assert_eq!(
            from_gguf.features.norm.kind, from_hf.features.norm.kind,
            "{gguf_name}"
        );
        assert_eq!(
            from_gguf.features.residual, from_hf.features.residual,
            "{gguf_name}"
        );
        assert_eq!(from_gguf.features.mlp, from_hf.features.mlp, "{gguf_name}");
        assert_eq!(
            from_gguf.features.qk_norm, from_hf.features.qk_norm,
            "{gguf_name}"
        );
        assert_eq!(
            from_gguf.features.activation, from_hf.features.activation,
            "{gguf_name}"
        );
    }
}

#[test]
fn llama3_scaling_is_recovered_from_the_converters_divisors() {
    let (_, spec) = gguf::model_spec(&open("llama3")).unwrap();
    let ember_model::Positions::Rope(rope) = &spec.positions else {
        panic!("RoPE expected")
    };
    assert!(
        matches!(rope.scaling, ember_model::RopeScaling::Llama3 { factor, .. } if factor == 8.0),
        "{:?}",
        rope.scaling
    );
}

#[test]
fn long_rope_is_read_from_the_converters_factor_tensors_and_saved_for_transformers() {
    let file = open("phi3_longrope");
    let (_, spec) = gguf::model_spec(&file).unwrap();
    let ember_model::Positions::Rope(rope) = &spec.positions else {
        panic!("RoPE expected")
    };
    let ember_model::RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings,
        attention_factor,
    } = &rope.scaling
    else {
        panic!("LongRoPE expected, found {:?}", rope.scaling)
    };
    // The fixture script's factors, stored by the converter as f32 tensors.
    assert_eq!(
        short_factor,
        &[1.0, 1.1f32 as f64, 1.3f32 as f64, 1.6f32 as f64]
    );
    assert_eq!(long_factor, &[1.0, 2.5, 6.0, 14.0]);
    assert_eq!(*original_max_position_embeddings, 16);
    // sqrt(1 + ln(64 / 16) / ln(16)), stored as f32.
    assert!((attention_factor - (1.0 + 4f64.ln() / 16f64.ln()).sqrt()).abs() < 1e-7);

    // Saved as a Hugging Face directory (the `rope_parameters` transformers reads, the original context at the top
    // level where Phi3Config looks first), it loads back to the same spec and logits.
    let model = gguf::load::<B>(&file, &Default::default(), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    ember_model::save(&model, dir.path()).unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["original_max_position_embeddings"], 16);
    assert_eq!(config["rope_parameters"]["rope_type"], "longrope");
    let reloaded = ember_model::load::<B>(dir.path(), &Default::default(), None)
        .unwrap()
        .model;
    assert_eq!(reloaded.spec(), model.spec());
    let exp = expected("phi3_longrope");
    let diff = max_abs_diff(
        &reloaded
            .forward(tokens(&exp.tokens))
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap(),
        &exp.logits,
    );
    assert!(
        diff <= LOGIT_TOLERANCE,
        "max |reloaded - transformers| = {diff}"
    );
}

#[test]
fn an_unknown_architecture_is_an_error_listing_the_supported() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(path("llama", "gguf.bin")).unwrap();
    // `general.architecture` = "llama" -> "lxama": same length, so the file stays well formed.
    let at = bytes
        .windows(5)
        .position(|w| w == b"llama")
        .expect("the architecture string");
    bytes[at + 1] = b'x';
    let renamed = dir.path().join("renamed.gguf");
    std::fs::write(&renamed, bytes).unwrap();
    let file = GgufFile::open(&renamed).unwrap();
    let err = gguf::model_spec(&file).err().unwrap().to_string();
    assert!(
        err.contains("general.architecture")
            && err.contains("lxama")
            && err.contains("qwen3")
            && err.contains("gptneox"),
        "{err}"
    );
}
