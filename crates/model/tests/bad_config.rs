//! Hostile and broken `config.json` values are errors naming the file and key, before anything is sized by
//! them: no abort on a huge layer count or context, no NaN logits from a bad norm eps, no silently dropped
//! `rope_scaling`. Each case edits one parity fixture's config (or, for the norm eps, the GGUF metadata a config
//! is made from); some were found by `fuzz_config.rs`.

mod common;

use std::path::Path;

use common::fixture;
use ember_model::gguf::{self, GgufFile};
use ember_model::spec::{MAX_LAYERS, MAX_MODEL_BYTES, MAX_SIZE};
use ember_model::{ModelDir, ModelSpec, Positions, RopeScaling, arch};
use serde_json::{Value, json};

const NAME: &str = "edited/config.json";

fn config(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn edited(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut c = config(name);
    edit(&mut c);
    c
}

fn parse(c: &Value) -> ember_model::Result<ModelSpec> {
    arch::parse_config_value(c, Path::new(NAME)).map(|(_, spec)| spec)
}

/// Parsing fails naming the file and every one of `needles`.
#[track_caller]
fn assert_rejected(c: &Value, needles: &[&str]) {
    let msg = parse(c)
        .expect_err("the edited config must be rejected")
        .to_string();
    assert!(msg.contains(NAME), "{msg}");
    for needle in needles {
        assert!(msg.contains(needle), "{msg} should mention {needle}");
    }
}

#[test]
fn a_huge_layer_count_is_an_error_before_any_per_layer_table() {
    // 2^40 layers used to build a 2^40-entry window table (16 TiB) and abort.
    for (name, key) in [
        ("llama3", "num_hidden_layers"),
        ("qwen2", "num_hidden_layers"),
        ("mistral", "num_hidden_layers"),
        ("gpt2", "n_layer"),
        ("gpt_neox", "num_hidden_layers"),
        ("gpt_neo", "num_layers"),
    ] {
        let c = edited(name, |c| c[key] = json!(1u64 << 40));
        assert_rejected(&c, &[key, "1099511627776", &MAX_LAYERS.to_string()]);
    }
}

#[test]
fn a_huge_gpt_neo_repeat_count_is_counted_not_expanded() {
    let c = edited("gpt_neo", |c| {
        c["attention_types"] = json!([[["global", "local"], 1u64 << 40]])
    });
    assert_rejected(&c, &["attention_types", "2199023255552", "num_layers"]);
    let c = edited("gpt_neo", |c| {
        c["attention_types"] = json!([[["global", "local"], u64::MAX]])
    });
    assert_rejected(&c, &["attention_types"]);
}

#[test]
fn a_huge_context_is_an_error_naming_the_bound() {
    for name in ["llama3", "gpt2"] {
        let key = if name == "gpt2" {
            "n_positions"
        } else {
            "max_position_embeddings"
        };
        let c = edited(name, |c| c[key] = json!(1u64 << 40));
        assert_rejected(&c, &["context_length", &MAX_SIZE.to_string()]);
    }
}

#[test]
fn a_bad_norm_eps_is_an_error_not_nan_logits() {
    for (name, key) in [
        ("llama3", "rms_norm_eps"),
        ("gpt2", "layer_norm_epsilon"),
        ("gpt_neox", "layer_norm_eps"),
        ("gpt_neo", "layer_norm_epsilon"),
    ] {
        // Negative and zero give NaN; 1e-60 and 1e60 round to 0 and infinity in f32.
        for eps in [-1e-5, 0.0, 1e-60, 1e60] {
            let c = edited(name, |c| c[key] = json!(eps));
            assert_rejected(&c, &["eps"]);
        }
        // JSON has no NaN; a string is the closest a file gets, and it is a type error naming the key.
        let c = edited(name, |c| c[key] = json!("NaN"));
        assert_rejected(&c, &[key]);
    }
}

/// Every family's norm eps key in `config.json`, with a fixture of the family.
const NORM_EPS_KEYS: [(&str, &str); 10] = [
    ("llama3", "rms_norm_eps"),
    ("mistral", "rms_norm_eps"),
    ("qwen2", "rms_norm_eps"),
    ("qwen3", "rms_norm_eps"),
    ("phi3", "rms_norm_eps"),
    ("gemma2", "rms_norm_eps"),
    ("gemma3", "rms_norm_eps"),
    ("gpt2", "layer_norm_epsilon"),
    ("gpt_neo", "layer_norm_epsilon"),
    ("gpt_neox", "layer_norm_eps"),
];

const EPS_EXPECTED: &str = "expected a positive number that f32 can hold";

#[test]
fn every_familys_norm_eps_key_refuses_what_is_not_a_usable_number() {
    // `null` is what a NaN becomes in a JSON value (JSON has none); families whose key may be absent used to read
    // it as absent and run with their default.
    let values = [
        Value::Null,
        json!("NaN"),
        json!(-1e-5),
        json!(0.0),
        json!(1e-60),
        json!(1e60),
    ];
    for (name, key) in NORM_EPS_KEYS {
        for value in &values {
            let c = edited(name, |c| c[key] = value.clone());
            assert_rejected(&c, &[&format!("`{key}` is {value}"), EPS_EXPECTED]);
        }
    }
}

#[test]
fn python_nan_and_infinity_in_a_config_file_name_the_key() {
    // Python's json module, and so transformers' `save_pretrained`, writes non-finite floats as these bare words.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    for (name, key) in NORM_EPS_KEYS {
        for literal in ["NaN", "Infinity", "-Infinity"] {
            let c = edited(name, |c| c[key] = json!("placeholder"));
            let text = serde_json::to_string_pretty(&c)
                .unwrap()
                .replace("\"placeholder\"", literal);
            std::fs::write(&path, text).unwrap();
            let msg = arch::read_config(&path).err().unwrap().to_string();
            for needle in [
                "config.json",
                &format!("`{key}` is {literal},"),
                EPS_EXPECTED,
            ] {
                assert!(msg.contains(needle), "{msg} should mention {needle}");
            }
        }
    }
    // Another key gets the same name, with what it holds.
    std::fs::write(
        &path,
        r#"{"architectures": ["LlamaForCausalLM"], "rope_theta": NaN}"#,
    )
    .unwrap();
    let msg = arch::read_config(&path).err().unwrap().to_string();
    assert!(
        msg.contains("`rope_theta` is NaN") && msg.contains("a finite number"),
        "{msg}"
    );
}

#[test]
fn every_gguf_familys_norm_eps_key_refuses_nan_infinity_and_negatives() {
    // A NaN used to become JSON `null` on the way to the config, which the LLaMA lineage read as absent: the
    // file loaded with the default eps.
    let dir = tempfile::tempdir().unwrap();
    for (name, key) in [
        ("llama", "llama.attention.layer_norm_rms_epsilon"),
        ("mistral", "llama.attention.layer_norm_rms_epsilon"),
        ("qwen2", "qwen2.attention.layer_norm_rms_epsilon"),
        ("qwen3", "qwen3.attention.layer_norm_rms_epsilon"),
        ("phi3", "phi3.attention.layer_norm_rms_epsilon"),
        ("gemma2", "gemma2.attention.layer_norm_rms_epsilon"),
        ("gemma3", "gemma3.attention.layer_norm_rms_epsilon"),
        ("gpt2", "gpt2.attention.layer_norm_epsilon"),
        ("gpt_neox", "gptneox.attention.layer_norm_epsilon"),
    ] {
        let original =
            std::fs::read(fixture("gguf_families").join(format!("{name}.gguf.bin"))).unwrap();
        for (eps, shown) in [
            (f32::NAN, "NaN"),
            (f32::INFINITY, "inf"),
            (f32::NEG_INFINITY, "-inf"),
            (-1e-5, "-1e-5"),
            (0.0, "0e0"),
        ] {
            let path = dir.path().join(format!("{name}.gguf"));
            std::fs::write(&path, with_f32(&original, key, eps)).unwrap();
            let msg = gguf::model_spec(&GgufFile::open(&path).unwrap())
                .err()
                .unwrap_or_else(|| panic!("{name} with {key} = {eps} loaded"))
                .to_string();
            for needle in [
                &format!("{name}.gguf"),
                &format!("`{key}`"),
                EPS_EXPECTED,
                &format!("found {shown}"),
            ] {
                assert!(msg.contains(needle), "{msg} should mention {needle}");
            }
        }
    }
}

#[test]
fn a_non_finite_gguf_setting_is_refused_naming_its_key() {
    // Every float setting is read through one accessor: a NaN RoPE base used to reach the config as `null`, and
    // the family's default (10000) replaced it silently.
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read(fixture("gguf_families").join("llama.gguf.bin")).unwrap();
    let key = "llama.rope.freq_base";
    for value in [f32::NAN, f32::INFINITY] {
        let path = dir.path().join("llama.gguf");
        std::fs::write(&path, with_f32(&original, key, value)).unwrap();
        let msg = gguf::model_spec(&GgufFile::open(&path).unwrap())
            .err()
            .unwrap_or_else(|| panic!("{key} = {value} loaded"))
            .to_string();
        assert!(
            msg.contains(&format!("`{key}`")) && msg.contains("a finite number"),
            "{msg}"
        );
    }
}

/// `file` with its f32 metadata value `key` set to `value`. A key is stored as its length, its bytes, the value
/// type (6 for f32) and the value.
fn with_f32(file: &[u8], key: &str, value: f32) -> Vec<u8> {
    let mut named = (key.len() as u64).to_le_bytes().to_vec();
    named.extend_from_slice(key.as_bytes());
    let at = file
        .windows(named.len())
        .position(|w| w == named)
        .unwrap_or_else(|| panic!("no key {key}"))
        + named.len();
    assert_eq!(file[at..at + 4], 6u32.to_le_bytes(), "{key} is not an f32");
    let mut edited = file.to_vec();
    edited[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
    edited
}

#[test]
fn heads_must_divide_the_width_they_split() {
    let c = edited("llama3", |c| {
        c.as_object_mut().unwrap().remove("head_dim");
        c["hidden_size"] = json!(30);
    });
    assert_rejected(&c, &["hidden_size", "num_attention_heads"]);
    let c = edited("gpt2", |c| c["n_embd"] = json!(30));
    assert_rejected(&c, &["n_embd", "n_head"]);
    let c = edited("llama3", |c| c["num_key_value_heads"] = json!(3));
    assert_rejected(&c, &["num_kv_heads"]);
    // An explicit head_dim need not divide the hidden size (Qwen3: 16 heads of 128 over 1024).
    let c = edited("qwen3", |c| c["head_dim"] = json!(12));
    parse(&c).unwrap();
}

#[test]
fn zero_sizes_are_errors() {
    for key in [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
    ] {
        let c = edited("llama3", |c| c[key] = json!(0));
        assert_rejected(&c, &["must be positive"]);
    }
    let c = edited("gpt2", |c| c["n_head"] = json!(0));
    assert_rejected(&c, &["n_head"]);
}

#[test]
fn a_shape_too_large_for_any_address_space_says_how_much_it_needs() {
    let c = edited("llama3", |c| {
        c["hidden_size"] = json!(1 << 20);
        c["intermediate_size"] = json!(1 << 24);
        c["num_hidden_layers"] = json!(4096);
    });
    let msg = parse(&c).unwrap_err().to_string();
    for needle in ["needs", "PiB", "parameters", "KV cache", "128.000 TiB"] {
        assert!(msg.contains(needle), "{msg} should mention {needle}");
    }
    // The same family at a real size is accepted, and its needs are what the count says.
    let spec = ModelDir::open(&fixture("configs").join("llama31_8b.json"))
        .unwrap()
        .spec;
    let needs = spec.memory_needs().unwrap();
    assert_eq!(needs.parameters, u128::from(spec.parameter_count()));
    assert!(needs.total() < MAX_MODEL_BYTES / 64);
}

#[test]
fn memory_needs_count_every_parameter_of_every_fixture() {
    for name in common::FIXTURES {
        let spec = ModelDir::open(&fixture(name)).unwrap().spec;
        let needs = spec.memory_needs().unwrap();
        assert_eq!(
            needs.parameters,
            u128::from(spec.parameter_count()),
            "{name}"
        );
        assert_eq!(needs.weight_bytes, needs.parameters * 4, "{name}");
        let kv =
            spec.context_length as u128 * 2 * spec.num_layers as u128 * spec.kv_dim() as u128 * 4;
        assert_eq!(needs.kv_cache_bytes, kv, "{name}");
    }
}

#[test]
fn rope_scaling_of_the_wrong_shape_is_an_error_not_dropped() {
    let scaling = config("llama3")["rope_parameters"].clone();
    let legacy = |value: Value| {
        edited("llama3", move |c| {
            c.as_object_mut().unwrap().remove("rope_parameters");
            c["rope_scaling"] = value;
        })
    };
    // The legacy key with a proper object keeps LLaMA 3's scaling; null is no scaling.
    let spec = parse(&legacy(scaling.clone())).unwrap();
    let Positions::Rope(rope) = spec.positions else {
        panic!("RoPE")
    };
    assert!(matches!(rope.scaling, RopeScaling::Llama3 { .. }));
    parse(&legacy(Value::Null)).unwrap();
    for (value, needles) in [
        (
            json!("llama3"),
            &["rope_scaling", "must be an object", "a string"][..],
        ),
        (json!([8.0]), &["rope_scaling", "an array"]),
        (json!({"rope_type": "yarn", "factor": 4.0}), &["yarn"]),
        (json!({"rope_type": "linear"}), &["rope_scaling", "factor"]),
        (
            json!({"rope_type": "linear", "factor": "8"}),
            &["rope_scaling.factor", "a string"],
        ),
        (json!({"factor": 8.0}), &["rope_scaling", "no `rope_type`"]),
        (json!({"rope_type": 3}), &["rope_scaling.rope_type"]),
        (
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": -16}),
            &["original_max_position_embeddings", "positive integer"],
        ),
        // Finite values whose frequencies are not: 1e-300 divides them to infinity.
        (
            json!({"rope_type": "linear", "factor": 1e-300}),
            &["frequenc"],
        ),
    ] {
        assert_rejected(&legacy(value), needles);
    }
    let c = edited("llama3", |c| c["rope_parameters"] = json!("llama3"));
    assert_rejected(&c, &["rope_parameters", "must be an object"]);
    // Both forms, disagreeing: one of them would be lost depending on the transformers version.
    let c = edited("llama3", |c| {
        c["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0})
    });
    assert_rejected(&c, &["rope_parameters", "rope_scaling", "disagree"]);
    let c = edited("llama3", |c| c["rope_scaling"] = scaling);
    parse(&c).unwrap();
}

#[test]
fn rotary_fractions_outside_zero_to_one_are_errors() {
    for pct in [0.0, -0.5, 1.5] {
        let c = edited("gpt_neox", |c| {
            c.as_object_mut().unwrap().remove("rope_parameters");
            c["rotary_pct"] = json!(pct);
        });
        assert_rejected(&c, &["rotary_pct"]);
    }
    let c = edited("phi3", |c| {
        c["rope_parameters"]["partial_rotary_factor"] = json!(2.0)
    });
    assert_rejected(&c, &["rope_parameters.partial_rotary_factor"]);
}

#[test]
fn fields_of_the_wrong_type_are_errors_naming_the_key() {
    for (name, key, value) in [
        ("llama3", "hidden_size", json!("32")),
        ("llama3", "num_attention_heads", json!(-4)),
        ("llama3", "tie_word_embeddings", json!("false")),
        ("qwen2", "use_sliding_window", json!(1)),
        ("gpt2", "n_inner", json!(64.5)),
        ("gpt_neo", "attention_types", json!({"global": 1})),
        ("mistral", "sliding_window", json!("8")),
    ] {
        let c = edited(name, |c| c[key] = value);
        assert_rejected(&c, &[key]);
    }
}

#[test]
fn windows_must_be_positive_and_bounded() {
    for window in [0u64, 1 << 40] {
        let c = edited("mistral", |c| c["sliding_window"] = json!(window));
        assert_rejected(&c, &["attention window"]);
    }
}

#[test]
fn a_derived_width_that_overflows_is_an_error() {
    // GPT-2's n_inner defaults to 4 * n_embd, which used to overflow (a panic in debug builds).
    let c = edited("gpt2", |c| {
        c["n_inner"] = Value::Null;
        c["n_embd"] = json!(u64::MAX - 3);
        c["n_head"] = json!(1);
    });
    assert_rejected(&c, &["n_embd"]);
}

#[test]
fn a_huge_claimed_context_builds_rope_rows_only_for_the_positions_used() {
    // The largest context validate accepts: 2^31 positions of head_dim 8 used to build 128 GiB of cos/sin
    // tables at the first forward pass and abort.
    let spec = ModelSpec::llama_style(16, 16, 1, 2, 2, 32, MAX_SIZE);
    spec.validate().unwrap();
    let model = ember_model::Transformer::<common::B>::init(&spec, 0, &Default::default()).unwrap();
    let logits = model.forward(common::tokens(&[1, 2, 3])).unwrap();
    assert_eq!(logits.dims(), [1, 3, 16]);
}

#[test]
fn sizes_whose_products_overflow_are_errors_not_panics() {
    // Found by fuzz_config: each size fit, but the parameter count multiplied past usize (a panic in debug
    // builds, a wrapped count in release).
    let c = edited("llama3", |c| {
        c["vocab_size"] = json!(MAX_SIZE);
        c["hidden_size"] = json!(MAX_SIZE);
        c["intermediate_size"] = json!(MAX_SIZE);
    });
    assert_rejected(&c, &["needs", "EiB"]);
}
