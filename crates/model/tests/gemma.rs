//! Gemma 2 and Gemma 3: their configs carry every Gemma knob into the spec, bad values are errors naming the key,
//! a Gemma spec saves as a config that reads back as the same spec, and no other family saves a Gemma knob.

mod common;

use std::path::Path;

use common::{B, fixture};
use ember_model::{
    Activation, ModelDir, ModelError, ModelSpec, Positions, RopeConfig, RopeScaling, Transformer,
    arch, save,
};
use serde_json::{Value, json};

fn config(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn parse(c: &Value) -> ember_model::Result<ModelSpec> {
    arch::parse_config_value(c, Path::new("edited/config.json")).map(|(_, spec)| spec)
}

fn spec(name: &str) -> ModelSpec {
    ModelDir::open(&fixture(name)).unwrap().spec
}

fn rope(positions: &Positions) -> &RopeConfig {
    match positions {
        Positions::Rope(rope) => rope,
        Positions::Learned => panic!("Gemma uses RoPE"),
    }
}

#[test]
fn gemma2_config_carries_every_knob_into_the_spec() {
    let s = spec("gemma2");
    let f = &s.features;
    assert!(f.scaled_embeddings && f.norm_unit_offset && f.post_norms && f.tied_embeddings);
    assert!(!f.qk_norm);
    assert_eq!(f.activation, Activation::GeluTanh);
    assert_eq!((f.attn_softcap, f.final_softcap), (Some(5.0), Some(3.0)));
    assert_eq!(f.attention_scale, Some(24f64.powf(-0.5)));
    // transformers' default layer_types: even layers slide.
    assert_eq!(s.attention_windows, vec![Some(6), None, Some(6), None]);
    assert_eq!(f.local_rope, None);
}

#[test]
fn gemma3_config_carries_q_k_norms_and_two_ropes() {
    let s = spec("gemma3");
    let f = &s.features;
    assert!(f.scaled_embeddings && f.norm_unit_offset && f.post_norms && f.qk_norm);
    assert_eq!((f.attn_softcap, f.final_softcap), (None, None));
    // query_pre_attn_scalar equals head_dim: the usual scale.
    assert_eq!(f.attention_scale, None);
    assert_eq!(s.attention_windows, vec![Some(6), Some(6), None, Some(6)]);
    let global = rope(&s.positions);
    assert_eq!(global.theta, 1e6);
    assert_eq!(global.scaling, RopeScaling::Linear { factor: 8.0 });
    let local = f.local_rope.as_ref().expect("a local RoPE");
    assert_eq!(
        (local.theta, local.scaling.clone()),
        (1e4, RopeScaling::None)
    );
}

#[test]
fn absent_keys_take_transformers_defaults_and_null_turns_capping_off() {
    let mut c = config("gemma2");
    for key in [
        "layer_types",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
    ] {
        c.as_object_mut().unwrap().remove(key);
    }
    let s = parse(&c).unwrap();
    assert_eq!(
        (s.features.attn_softcap, s.features.final_softcap),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(s.features.attention_scale, Some(256f64.powf(-0.5)));
    assert_eq!(s.attention_windows, vec![Some(6), None, Some(6), None]);
    c["attn_logit_softcapping"] = Value::Null;
    c["final_logit_softcapping"] = Value::Null;
    let s = parse(&c).unwrap();
    assert_eq!(
        (s.features.attn_softcap, s.features.final_softcap),
        (None, None)
    );

    // Gemma 3 without layer_types: every 6th layer is global, or every sliding_window_pattern-th.
    let mut c = config("gemma3");
    c.as_object_mut().unwrap().remove("layer_types");
    c.as_object_mut().unwrap().remove("sliding_window_pattern");
    c["num_hidden_layers"] = json!(7);
    let windows = parse(&c).unwrap().attention_windows;
    assert_eq!(
        windows.iter().map(Option::is_none).collect::<Vec<_>>(),
        [false, false, false, false, false, true, false]
    );
    c["sliding_window_pattern"] = json!(3);
    let windows = parse(&c).unwrap().attention_windows;
    assert_eq!(windows[2], None);
    assert_eq!(windows[3], Some(6));

    // The older Gemma 3 keys: rope_theta (+ rope_scaling) for global layers, rope_local_base_freq for local ones.
    let mut c = config("gemma3");
    c.as_object_mut().unwrap().remove("rope_parameters");
    c["rope_theta"] = json!(500000.0);
    c["rope_local_base_freq"] = json!(20000.0);
    c["rope_scaling"] = json!({"rope_type": "linear", "factor": 4.0});
    let s = parse(&c).unwrap();
    assert_eq!(rope(&s.positions).theta, 500000.0);
    assert_eq!(
        rope(&s.positions).scaling,
        RopeScaling::Linear { factor: 4.0 }
    );
    assert_eq!(s.features.local_rope.as_ref().unwrap().theta, 20000.0);
}

#[test]
fn bad_gemma_values_are_errors_naming_the_key() {
    let cases: Vec<(&str, &str, Value, &[&str])> = vec![
        (
            "gemma2",
            "attn_logit_softcapping",
            json!(-5.0),
            &["attn_logit_softcapping", "-5"],
        ),
        (
            "gemma2",
            "final_logit_softcapping",
            json!(0.0),
            &["final_logit_softcapping", "positive"],
        ),
        (
            "gemma2",
            "final_logit_softcapping",
            json!("3"),
            &["final_logit_softcapping"],
        ),
        (
            "gemma2",
            "query_pre_attn_scalar",
            json!(0),
            &["query_pre_attn_scalar", "positive"],
        ),
        (
            "gemma3",
            "query_pre_attn_scalar",
            json!(-16),
            &["query_pre_attn_scalar"],
        ),
        (
            "gemma2",
            "sliding_window",
            json!(0),
            &["sliding_window", "positive"],
        ),
        (
            "gemma2",
            "layer_types",
            json!(["full_attention"]),
            &["layer_types", "1 entries"],
        ),
        (
            "gemma3",
            "layer_types",
            json!(["a", "b", "c", "d"]),
            &["layer_types", "`a`"],
        ),
        (
            "gemma2",
            "hidden_activation",
            json!("swiglu"),
            &["hidden_activation", "swiglu"],
        ),
        (
            "gemma2",
            "hidden_act",
            json!("silu"),
            &["hidden_act", "disagrees"],
        ),
        (
            "gemma3",
            "use_bidirectional_attention",
            json!(true),
            &["use_bidirectional_attention"],
        ),
        (
            "gemma3",
            "rope_parameters",
            json!({"rope_theta": 1e4}),
            &["rope_parameters", "full_attention"],
        ),
        (
            "gemma2",
            "sliding_window",
            Value::Null,
            &["sliding_window", "null"],
        ),
    ];
    for (name, key, value, needles) in cases {
        let mut c = config(name);
        c[key] = value.clone();
        let msg = parse(&c)
            .expect_err(&format!("{name}: {key} = {value} must be rejected"))
            .to_string();
        assert!(msg.contains("edited/config.json"), "{msg}");
        for needle in needles {
            assert!(msg.contains(needle), "{msg} should mention {needle}");
        }
    }
}

#[test]
fn gemma_configs_written_by_ember_read_back_as_the_same_spec() {
    for name in ["gemma2", "gemma3"] {
        let mut variants = vec![spec(name)];
        // Gemma 2 27B's query_pre_attn_scalar (144 = hidden / heads) and Gemma 3 27B's (168) are not head_dim.
        let mut other_scale = spec(name);
        other_scale.features.attention_scale = Some(168f64.powf(-0.5));
        variants.push(other_scale);
        let mut untied = spec(name);
        untied.features.tied_embeddings = false;
        variants.push(untied);
        let mut uncapped = spec(name);
        uncapped.features.attn_softcap = None;
        uncapped.features.final_softcap = Some(30.0);
        variants.push(uncapped);
        let family = arch::family(&variants[0].architecture).unwrap();
        for s in variants {
            let config = family.to_config(&s).unwrap();
            assert_eq!(family.parse_config(&config).unwrap(), s, "{name}: {config}");
        }
        // A scale that no integer query_pre_attn_scalar gives is refused, naming the key.
        let mut odd = spec(name);
        odd.features.attention_scale = Some(0.3);
        let err = family.to_config(&odd).unwrap_err();
        assert!(err.contains("query_pre_attn_scalar"), "{err}");
    }
    // Gemma 3 with one RoPE for every layer writes the global one for the sliding layers too.
    let mut one_rope = spec("gemma3");
    one_rope.features.local_rope = None;
    let family = arch::family("Gemma3ForCausalLM").unwrap();
    let config = family.to_config(&one_rope).unwrap();
    assert_eq!(family.parse_config(&config).unwrap(), one_rope);
}

/// A knob's name in the error, and how to set it on a spec.
type Knob = (&'static str, fn(&mut ModelSpec));

#[test]
fn other_families_refuse_every_gemma_knob_by_name() {
    let knobs: [Knob; 6] = [
        ("sqrt(hidden_size)", |s| s.features.scaled_embeddings = true),
        ("(1 + weight)", |s| s.features.norm_unit_offset = true),
        ("post_feedforward_layernorm", |s| {
            s.features.post_norms = true
        }),
        ("attn_logit_softcapping", |s| {
            s.features.attn_softcap = Some(50.0)
        }),
        ("final_logit_softcapping", |s| {
            s.features.final_softcap = Some(30.0)
        }),
        ("rope_local_base_freq", |s| {
            s.features.local_rope = Some(RopeConfig {
                theta: 1e4,
                ..RopeConfig::new(s.head_dim)
            })
        }),
    ];
    // Each family's own fixture, so the only thing it cannot write is the knob.
    for name in [
        "llama3", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gpt_neox", "gpt_neo",
    ] {
        for (needle, set) in &knobs {
            let mut s = spec(name);
            set(&mut s);
            let family = arch::family(&s.architecture).unwrap();
            let err = family.to_config(&s).unwrap_err();
            assert!(
                err.contains("cannot express Gemma's") && err.contains(needle),
                "{name}: {err}"
            );
        }
    }
}

#[test]
fn saving_a_gemma_model_as_llama_is_an_error_naming_the_knob() {
    let mut s = ModelSpec::llama_style(64, 16, 1, 2, 1, 32, 16);
    s.features.final_softcap = Some(30.0);
    let model = Transformer::<B>::init(&s, 0, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = save(&model, dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::Unsaveable { .. }), "{err}");
    assert!(err.to_string().contains("final_logit_softcapping"), "{err}");
    assert!(!dir.path().join("config.json").exists());
}
