//! The architecture registry: configs of published models parse to the right spec and exact parameter count,
//! and bad configs are errors that name the file and key.

mod common;

use std::path::Path;

use common::{FIXTURES, expected, fixture};
use ember_model::{ModelDir, ModelError, NormKind, Positions, Residual, RopeScaling, arch};

fn config(name: &str) -> std::path::PathBuf {
    fixture("configs").join(name)
}

#[test]
fn llama2_7b_config_gives_the_published_parameter_count() {
    let dir = ModelDir::open(&config("llama2_7b.json")).unwrap();
    // Meta's LLaMA-2-7B: 6,738,415,616 parameters (what transformers' `num_parameters()` reports).
    assert_eq!(dir.spec.parameter_count(), 6_738_415_616);
    assert_eq!(dir.spec.num_kv_heads, 32);
    assert_eq!(dir.spec.context_length, 4096);
}

#[test]
fn llama3_8b_config_gives_the_published_parameter_count_with_gqa() {
    let dir = ModelDir::open(&config("llama3_8b.json")).unwrap();
    assert_eq!(dir.spec.parameter_count(), 8_030_261_248);
    assert_eq!(
        (dir.spec.num_heads, dir.spec.num_kv_heads, dir.spec.head_dim),
        (32, 8, 128)
    );
    let Positions::Rope(rope) = &dir.spec.positions else {
        panic!("LLaMA 3 uses RoPE")
    };
    assert_eq!(rope.theta, 500_000.0);
    // Weights in bf16: 2 bytes per parameter.
    assert_eq!(dir.spec.weight_bytes(2.0), 16_060_522_496);
}

#[test]
fn llama31_rope_scaling_is_read_from_the_legacy_rope_scaling_key() {
    let dir = ModelDir::open(&config("llama31_8b.json")).unwrap();
    let Positions::Rope(rope) = &dir.spec.positions else {
        panic!("LLaMA 3.1 uses RoPE")
    };
    assert_eq!(
        rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(dir.spec.context_length, 131_072);
}

#[test]
fn gpt2_small_config_counts_the_tied_head_once() {
    let spec = ModelDir::open(&config("gpt2_small.json")).unwrap().spec;
    // transformers' GPT2LMHeadModel.num_parameters() for gpt2 (tied lm_head).
    assert_eq!(spec.parameter_count(), 124_439_808);
    assert_eq!(spec.features.norm.kind, NormKind::LayerNorm);
    assert_eq!(spec.intermediate_size, 3072);
}

#[test]
fn parameter_count_matches_pytorch_for_every_fixture() {
    for name in FIXTURES {
        let spec = ModelDir::open(&fixture(name)).unwrap().spec;
        assert_eq!(
            spec.parameter_count(),
            expected(name).num_parameters,
            "{name}"
        );
    }
}

#[test]
fn fixture_specs_carry_the_family_features() {
    let spec = |name| ModelDir::open(&fixture(name)).unwrap().spec;
    assert_eq!(spec("mistral").attention_windows, vec![Some(8), Some(8)]);
    assert_eq!(spec("qwen2").attention_windows, vec![None, Some(8)]);
    assert!(spec("qwen2").features.biases.qkv && !spec("qwen2").features.biases.attn_out);
    assert_eq!(spec("gpt_neo").attention_windows, vec![None, Some(6)]);
    assert_eq!(spec("gpt_neo").features.attention_scale, Some(1.0));
    assert!(spec("qwen3").features.qk_norm);
    assert_eq!(spec("qwen3").head_dim, 16);
    assert_eq!(spec("gpt_neox").features.residual, Residual::Parallel);
    assert_eq!(
        spec("gpt_neox_sequential").features.residual,
        Residual::Sequential
    );
    let Positions::Rope(rope) = spec("gpt_neox").positions else {
        panic!("NeoX uses RoPE")
    };
    assert_eq!((rope.rotary_dim, rope.head_dim), (4, 8));
    assert!(
        spec("llama_tied").features.tied_embeddings && !spec("llama3").features.tied_embeddings
    );
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("config.json");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn unknown_architecture_lists_the_supported_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(
        tmp.path(),
        r#"{"architectures": ["BertForMaskedLM"], "hidden_size": 8}"#,
    );
    let err = ModelDir::open(&path).err().unwrap();
    assert!(matches!(err, ModelError::UnknownArchitecture { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("BertForMaskedLM") && msg.contains("config.json"),
        "{msg}"
    );
    for supported in arch::supported() {
        assert!(msg.contains(supported), "{msg} should list {supported}");
    }
    assert_eq!(arch::supported().len(), 10);
}

#[test]
fn missing_key_names_the_key_and_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(
        tmp.path(),
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2}"#,
    );
    let msg = ModelDir::open(&path).err().unwrap().to_string();
    assert!(
        msg.contains("hidden_size") && msg.contains("config.json"),
        "{msg}"
    );
}

#[test]
fn missing_architectures_and_invalid_json_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(tmp.path(), r#"{"hidden_size": 8}"#);
    assert!(
        ModelDir::open(&path)
            .err()
            .unwrap()
            .to_string()
            .contains("architectures")
    );
    let path = write_config(tmp.path(), "{not json");
    assert!(
        ModelDir::open(&path)
            .err()
            .unwrap()
            .to_string()
            .contains("invalid JSON")
    );
}

#[test]
fn inconsistent_sizes_and_unknown_activation_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let base = r#""architectures": ["MistralForCausalLM"], "vocab_size": 10, "hidden_size": 8,
                  "intermediate_size": 8, "num_hidden_layers": 1"#;
    let path = write_config(
        tmp.path(),
        &format!("{{{base}, \"num_attention_heads\": 4, \"num_key_value_heads\": 3}}"),
    );
    let msg = ModelDir::open(&path).err().unwrap().to_string();
    assert!(msg.contains("num_kv_heads"), "{msg}");
    let path = write_config(
        tmp.path(),
        &format!("{{{base}, \"num_attention_heads\": 2, \"hidden_act\": \"swiglu2\"}}"),
    );
    let msg = ModelDir::open(&path).err().unwrap().to_string();
    assert!(
        msg.contains("hidden_act") && msg.contains("swiglu2"),
        "{msg}"
    );
    let path = write_config(
        tmp.path(),
        &format!(
            "{{{base}, \"num_attention_heads\": 2, \"rope_scaling\": {{\"rope_type\": \"yarn\", \"factor\": 4.0}}}}"
        ),
    );
    let msg = ModelDir::open(&path).err().unwrap().to_string();
    assert!(msg.contains("yarn"), "{msg}");
}

#[test]
fn smollm_135m_config_counts_its_tied_embeddings_once() {
    let spec = ModelDir::open(&config("smollm_135m.json")).unwrap().spec;
    // SmolLM-135M as transformers counts it (head tied to the 49152 x 576 embedding).
    assert_eq!(spec.parameter_count(), 134_515_008);
    assert!(spec.features.tied_embeddings);
    assert_eq!(
        (spec.num_heads, spec.num_kv_heads, spec.head_dim),
        (9, 3, 64)
    );
}

/// A Phi-3-mini-128k-style config: the legacy `rope_scaling` of type `su` with 48 factors each (head_dim 96),
/// the original context at the top level.
fn phi3_long_config(extra: &str) -> String {
    let factors = |step: f64| {
        (0..48)
            .map(|i| format!("{}", 1.0 + step * i as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"{{"architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "sliding_window": 262144, {extra}
            "rope_scaling": {{"type": "su", "short_factor": [{}], "long_factor": [{}]}}}}"#,
        factors(0.01),
        factors(0.5)
    )
}

#[test]
fn phi3_long_rope_is_read_from_the_legacy_su_scaling() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(
        tmp.path(),
        &phi3_long_config(r#""original_max_position_embeddings": 4096,"#),
    );
    let spec = ModelDir::open(&path).unwrap().spec;
    let Positions::Rope(rope) = &spec.positions else {
        panic!("Phi-3 uses RoPE")
    };
    let RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings,
        attention_factor,
    } = &rope.scaling
    else {
        panic!("LongRoPE expected, found {:?}", rope.scaling)
    };
    assert_eq!((short_factor.len(), long_factor.len()), (48, 48));
    assert_eq!((short_factor[1], long_factor[47]), (1.01, 24.5));
    assert_eq!(*original_max_position_embeddings, 4096);
    // transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)).
    let expected = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    assert!(
        (attention_factor - expected).abs() < 1e-12,
        "{attention_factor}"
    );
    // The long factors apply once a sequence is longer than 4096 positions.
    assert!(rope.inv_freq(4097)[47] < rope.inv_freq(4096)[47]);

    // Without the top-level key Phi3Config's own default (4096) applies, not max_position_embeddings.
    let path = write_config(tmp.path(), &phi3_long_config(""));
    let spec = ModelDir::open(&path).unwrap().spec;
    let Positions::Rope(rope) = &spec.positions else {
        panic!("Phi-3 uses RoPE")
    };
    assert!(matches!(
        rope.scaling,
        RopeScaling::LongRope {
            original_max_position_embeddings: 4096,
            ..
        }
    ));

    // Factors of the wrong count are an error naming the key.
    let path = write_config(
        tmp.path(),
        &phi3_long_config(r#""original_max_position_embeddings": 4096,"#).replace(
            "\"type\": \"su\", \"short_factor\": [1, ",
            "\"type\": \"su\", \"short_factor\": [",
        ),
    );
    let err = ModelDir::open(&path).err().unwrap().to_string();
    assert!(err.contains("short_factor"), "{err}");
}
