//! PEFT's adapter directory: `adapter_config.json` (a `LoraConfig`) and `adapter_model.safetensors`, whose keys
//! are `base_model.model.<module path>.lora_A.weight` `[r, in]` and `.lora_B.weight` `[out, r]`, as
//! `peft.PeftModel.save_pretrained` writes them and `PeftModel.from_pretrained(base, dir)` reads them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value, json};

use super::{
    AdaptableModule, LoraSettings, MAX_RANK, adaptable_modules, check_settings, dense_mut,
};
use crate::error::{ModelError, Result};
use crate::nn::LoraAdapter;
use crate::weights::Checkpoint;
use crate::{EmberBackend, Transformer};

/// The adapter's configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// PEFT's key prefix: the `PeftModel` wraps a `LoraModel` (`base_model`) that wraps the transformers model.
const KEY_PREFIX: &str = "base_model.model.";

/// An adapter read from a PEFT directory: its settings and each adapted module's `A` and `B` values.
#[derive(Clone, Debug)]
pub struct PeftAdapter {
    /// The directory read.
    pub dir: PathBuf,
    /// Rank, alpha, dropout and target names from `adapter_config.json`.
    pub settings: LoraSettings,
    /// `(Hugging Face module path, A [r, in], B [out, r])`, row-major.
    pub weights: Vec<(String, Vec<f32>, Vec<f32>)>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn config_error(path: &Path, message: String) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        message,
    }
}

/// Writes the adapters of `model` to `dir` (created if needed) in PEFT's format; `base` is recorded as
/// `base_model_name_or_path` (PEFT loads the base from there when asked to by path).
pub fn save_adapter<B: EmberBackend>(
    model: &Transformer<B>,
    settings: &LoraSettings,
    base: Option<&str>,
    dir: &Path,
) -> Result<()> {
    let adapters = model.lora_adapters()?;
    if adapters.is_empty() {
        return Err(ModelError::Lora("the model carries no LoRA adapter".into()));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let transposed = adapters.iter().any(|(m, _)| m.transposed);
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": settings.targets,
        "fan_in_fan_out": transposed,
        "bias": "none",
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| config_error(&config_path, e.to_string()))?;
    std::fs::write(&config_path, text + "\n").map_err(io(&config_path))?;

    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (module, lora) in &adapters {
        for (part, param) in [("lora_A", &lora.a), ("lora_B", &lora.b)] {
            let value = param.val();
            let shape = value.dims().to_vec();
            let values = value
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .map_err(|e| ModelError::Lora(format!("{}: {e:?}", module.hf_path)))?;
            tensors.push((
                format!("{KEY_PREFIX}{}.{part}.weight", module.hf_path),
                shape,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ));
        }
    }
    let path = dir.join(ADAPTER_WEIGHTS_FILE);
    let corrupt = |message: String| ModelError::Safetensors {
        path: path.clone(),
        message,
    };
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|e| corrupt(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(
        [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect(),
    );
    safetensors::serialize_to_file(views, &metadata, &path).map_err(|e| corrupt(e.to_string()))
}

/// Reads a PEFT LoRA adapter directory. Options ember does not implement (DoRA, rsLoRA, per-module ranks,
/// trained biases, extra saved modules) are errors naming the key, never ignored.
pub fn read_adapter(dir: &Path) -> Result<PeftAdapter> {
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let config: Value = serde_json::from_str(&text)
        .map_err(|e| config_error(&config_path, format!("invalid JSON: {e}")))?;
    let settings = parse_config(&config).map_err(|m| config_error(&config_path, m))?;
    check_settings(&settings).map_err(|e| config_error(&config_path, e.to_string()))?;

    let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
    let file = Checkpoint::open_file(&weights_path)?;
    let mut modules: BTreeSet<String> = BTreeSet::new();
    for name in file.names() {
        let module = name
            .strip_prefix(KEY_PREFIX)
            .and_then(|rest| {
                rest.strip_suffix(".lora_A.weight")
                    .or_else(|| rest.strip_suffix(".lora_B.weight"))
            })
            .ok_or_else(|| ModelError::Safetensors {
                path: weights_path.clone(),
                message: format!(
                    "tensor `{name}` is not a LoRA matrix (`{KEY_PREFIX}<module>.lora_A.weight` or `.lora_B.weight`)"
                ),
            })?;
        modules.insert(module.to_string());
    }
    let mut weights = Vec::with_capacity(modules.len());
    for module in modules {
        let read = |part: &str| -> Result<(Vec<usize>, Vec<f32>)> {
            let key = format!("{KEY_PREFIX}{module}.{part}.weight");
            let shape = file.shape(&key).ok_or_else(|| ModelError::Safetensors {
                path: weights_path.clone(),
                message: format!("missing tensor `{key}`"),
            })?;
            Ok((shape.to_vec(), file.read_f32(&key)?))
        };
        let (a_shape, a) = read("lora_A")?;
        let (b_shape, b) = read("lora_B")?;
        let rank = settings.rank;
        let fits =
            a_shape.len() == 2 && b_shape.len() == 2 && a_shape[0] == rank && b_shape[1] == rank;
        if !fits {
            return Err(ModelError::Safetensors {
                path: weights_path.clone(),
                message: format!(
                    "`{module}`: lora_A has shape {a_shape:?} and lora_B {b_shape:?}; expected [{rank}, in] and \
                     [out, {rank}] (r = {rank} in {ADAPTER_CONFIG_FILE})"
                ),
            });
        }
        weights.push((module, a, b));
    }
    if weights.is_empty() {
        return Err(ModelError::Safetensors {
            path: weights_path,
            message: "holds no LoRA matrix".into(),
        });
    }
    Ok(PeftAdapter {
        dir: dir.to_path_buf(),
        settings,
        weights,
    })
}

/// The settings of a PEFT `adapter_config.json`, refusing the options ember does not implement.
fn parse_config(config: &Value) -> std::result::Result<LoraSettings, String> {
    let get = |key: &str| config.get(key).filter(|v| !v.is_null());
    match get("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        other => return Err(format!("`peft_type`: expected \"LORA\", found {other:?}")),
    }
    let rank = get("r")
        .and_then(Value::as_u64)
        .filter(|r| (1..=MAX_RANK as u64).contains(r))
        .ok_or_else(|| format!("`r`: expected an integer in 1..={MAX_RANK}"))?
        as usize;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or("`lora_alpha`: expected a number")?;
    let dropout = get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let targets = match get("target_modules") {
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or("`target_modules`: expected a list of module names")?,
        Some(Value::String(pattern)) => {
            return Err(format!(
                "`target_modules`: the pattern {pattern:?} is not supported; list the module names"
            ));
        }
        _ => return Err("`target_modules`: expected a list of module names".into()),
    };
    for (key, off) in [
        ("use_dora", Value::Bool(false)),
        ("use_rslora", Value::Bool(false)),
        ("use_qalora", Value::Bool(false)),
        ("lora_bias", Value::Bool(false)),
        ("bias", Value::String("none".into())),
    ] {
        if let Some(value) = get(key)
            && *value != off
        {
            return Err(format!(
                "`{key}` = {value} is not supported (expected {off})"
            ));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if get(key).is_some_and(|v| v.as_object().is_none_or(|m| !m.is_empty())) {
            return Err(format!(
                "`{key}` (per-module ranks or alphas) is not supported"
            ));
        }
    }
    for key in [
        "modules_to_save",
        "layers_to_transform",
        "exclude_modules",
        "target_parameters",
        "layer_replication",
        "trainable_token_indices",
    ] {
        let empty = |v: &Value| match v {
            Value::Array(a) => a.is_empty(),
            Value::Object(m) => m.is_empty(),
            _ => false,
        };
        if get(key).is_some_and(|v| !empty(v)) {
            return Err(format!("`{key}` is not supported"));
        }
    }
    Ok(LoraSettings {
        rank,
        alpha,
        dropout,
        targets,
    })
}

impl<B: EmberBackend> Transformer<B> {
    /// The model with every parameter frozen and `adapter`'s matrices on the modules they name, trainable (to
    /// go on training) or applied as they are (`ember generate --adapter`). Every matrix must fit an adaptable
    /// module of this model, and every module the adapter's targets select must have its matrices.
    pub fn with_adapter(self, adapter: &PeftAdapter) -> Result<Self> {
        let modules = adaptable_modules(self.spec())?;
        let device = self.device();
        let mut model = burn::module::Module::no_grad(self);
        let mismatch =
            |message: String| ModelError::Lora(format!("{}: {message}", adapter.dir.display()));
        for (path, a, b) in &adapter.weights {
            let module: &AdaptableModule =
                modules.iter().find(|m| &m.hf_path == path).ok_or_else(|| {
                    mismatch(format!(
                        "`{path}` is not an adaptable module of {}",
                        model.spec().architecture
                    ))
                })?;
            let (inputs, outputs) = (module.inputs, module.outputs);
            let rank = adapter.settings.rank;
            if a.len() != rank * inputs || b.len() != outputs * rank {
                return Err(mismatch(format!(
                    "`{path}`: the matrices are [{rank}, {}] and [{}, {rank}]; the module is [{outputs}, {inputs}]",
                    a.len() / rank,
                    b.len() / rank
                )));
            }
            dense_mut(&mut model, &module.canonical)?.lora = Some(LoraAdapter::from_values(
                a.clone(),
                b.clone(),
                [inputs, outputs, rank],
                adapter.settings.alpha,
                adapter.settings.dropout,
                &device,
            ));
        }
        for module in &modules {
            let targeted = adapter.settings.targets.iter().any(|t| module.matches(t));
            if targeted
                && !adapter
                    .weights
                    .iter()
                    .any(|(path, _, _)| path == &module.hf_path)
            {
                return Err(mismatch(format!(
                    "target_modules selects `{}`, but {ADAPTER_WEIGHTS_FILE} has no matrices for it",
                    module.hf_path
                )));
            }
        }
        Ok(model)
    }
}
