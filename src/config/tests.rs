//! Tests of the run configuration: shipped configs, defaults, and every error naming its key.

use super::*;

fn parse(text: &str) -> Result<RunConfig, ConfigError> {
    RunConfig::parse(text, Path::new("test.yaml"))
}

#[test]
fn shipped_configs_parse_and_default_yaml_equals_the_built_in_defaults() {
    let root = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let default = RunConfig::load(&root.join("configs/default.yaml")).unwrap();
    let mut builtin = RunConfig::default();
    builtin.resolve_paths(&root.join("configs"));
    assert_eq!(
        default, builtin,
        "configs/default.yaml must list the built-in defaults"
    );
    let shakespeare = RunConfig::load(&root.join("configs/tinyshakespeare.yaml")).unwrap();
    assert_eq!(shakespeare.name, "tinyshakespeare");
    assert!(shakespeare.data.inputs[0].ends_with("data/tinyshakespeare.txt"));
    assert!(
        shakespeare.data.inputs[0].exists(),
        "the corpus ships in the repo"
    );
}

#[test]
fn unknown_key_is_an_error_naming_the_key_and_file() {
    let err = parse("training:\n  learning_rat: 0.1\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("test.yaml"), "{msg}");
    assert!(msg.contains("learning_rat"), "{msg}");
    assert!(msg.contains("training"), "{msg}");
}

#[test]
fn wrong_type_names_the_dotted_key() {
    let err = parse("model:\n  num_layers: many\n").unwrap_err();
    match err {
        ConfigError::Parse { key, .. } => assert_eq!(key, "model.num_layers"),
        other => panic!("expected a parse error, got {other}"),
    }
}

#[test]
fn omitted_keys_take_defaults() {
    let config = parse("name: x\ntraining:\n  max_steps: 700\n").unwrap();
    assert_eq!(config.training.max_steps, 700);
    assert_eq!(
        config.training.batch_size,
        TrainingConfig::default().batch_size
    );
    assert_eq!(config.model, ModelConfig::default());
}

#[test]
fn devices_are_a_count_a_list_or_auto() {
    let devices = |yaml: &str| parse(yaml).unwrap().training.devices;
    assert_eq!(
        devices("training:\n  batch_size: 8\n  devices: 2\n").indices(8, None),
        [0, 1]
    );
    assert_eq!(
        devices("training:\n  batch_size: 8\n  devices: [0, 3]\n").indices(8, None),
        [0, 3]
    );
    let auto = devices("training:\n  batch_size: 6\n  devices: auto\n");
    // One replica per CPU thread, as many as divide the batch; on a GPU backend (no thread count), device 0.
    assert_eq!(auto.indices(6, Some(2)), [0, 1]);
    assert_eq!(auto.indices(6, Some(4)), [0, 1, 2]);
    assert_eq!(auto.indices(6, None), [0]);
    for (yaml, key) in [
        (
            "training:\n  batch_size: 8\n  devices: 3\n",
            "training.devices",
        ),
        ("training:\n  devices: []\n", "training.devices"),
        ("training:\n  devices: 0\n", "training.devices"),
    ] {
        let err = parse(yaml).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { key: k, .. } if k == key),
            "{yaml}: {err}"
        );
    }
    assert!(parse("training:\n  devices: most\n").is_err());
}

#[test]
fn nodes_name_this_machine_and_share_the_batch() {
    let nodes = |rest: &str| {
        format!(
            "training:\n  batch_size: 8\n  devices: 2\n  nodes: {{count: 2, orchestrator: \"ws://10.0.0.1:3000\", \
             address: \"ws://10.0.0.2:3001\", data_port: 3001{rest}}}\n"
        )
    };
    let config = parse(&nodes(", rank: 1")).unwrap();
    assert_eq!(
        config.training.nodes.map(|n| (n.count, n.rank)),
        Some((2, 1))
    );
    // Which share of the batch is this machine's has no safe default.
    assert!(parse(&nodes("")).is_err());
    for (yaml, key) in [
        (nodes(", rank: 2"), "training.nodes.rank"),
        (
            nodes(", rank: 0").replace("count: 2", "count: 3"),
            "training.batch_size",
        ),
        (
            nodes(", rank: 0").replace("count: 2", "count: 0"),
            "training.nodes.count",
        ),
    ] {
        let err = parse(&yaml).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { key: k, .. } if k == key),
            "{yaml}: {err}"
        );
    }
}

#[test]
fn inconsistent_heads_are_rejected_with_the_key() {
    let err = parse("model:\n  num_heads: 8\n  num_kv_heads: 3\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, .. } if key == "model.num_kv_heads"),
        "{err}"
    );
    let err = parse("model:\n  hidden_size: 100\n  num_heads: 8\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, .. } if key == "model.num_heads"),
        "{err}"
    );
}

#[test]
fn out_of_range_values_are_rejected() {
    for (yaml, key) in [
        ("data:\n  val_fraction: 1.5\n", "data.val_fraction"),
        ("training:\n  learning_rate: 0\n", "training.learning_rate"),
        ("training:\n  beta2: 1.0\n", "training.beta2"),
        (
            "training:\n  max_steps: 10\n  warmup_steps: 20\n",
            "training.warmup_steps",
        ),
        ("tokenizer:\n  vocab_size: 100\n", "tokenizer.vocab_size"),
    ] {
        let err = parse(yaml).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { key: k, .. } if k == key),
            "{yaml}: {err}"
        );
    }
}

#[test]
fn backend_key_accepts_the_cli_names() {
    assert_eq!(
        parse("backend: wgpu\n").unwrap().backend,
        Some(BackendRequest::Wgpu)
    );
    assert!(parse("backend: tpu\n").is_err());
}

#[test]
fn attention_is_a_kernel_name() {
    assert_eq!(
        parse("model:\n  attention: manual\n")
            .unwrap()
            .model
            .attention,
        AttentionKernel::Manual
    );
    let err = parse("model:\n  attention: sparse\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Parse { key, message, .. }
            if key == "model.attention" && message.contains("manual")),
        "{err}"
    );
}

#[test]
fn lora_keys_take_peft_defaults_and_an_unknown_one_is_named() {
    let from = "model:\n  from: base\ntraining:\n  lora: ";
    let lora = parse(&format!("{from}{{rank: 4}}\n"))
        .unwrap()
        .training
        .lora
        .unwrap();
    assert_eq!(
        lora,
        ember_model::lora::LoraSettings {
            rank: 4,
            alpha: 16.0,
            dropout: 0.0,
            targets: vec!["q_proj".into(), "v_proj".into()],
        }
    );
    let err = parse(&format!("{from}{{rnak: 4}}\n")).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Parse { key, message, .. }
            if key.starts_with("training.lora") && message.contains("rnak")),
        "{err}"
    );
}
