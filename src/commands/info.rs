//! `ember info`: print a model's spec, parameter count and memory by dtype, from its config alone.

use std::path::Path;

use anyhow::Context as _;
use ember_model::gguf::{self, GgufFile};
use ember_model::spec::DTYPES;
use ember_model::{MlpKind, ModelDir, ModelSpec, Positions, RopeScaling};

use crate::Context;

/// Flags of `ember info`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model directory, its config.json, or a GGUF file (no weights are read) [required].
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// Print the spec and sizes as JSON instead of a table [default: off].
    #[arg(long)]
    pub json: bool,
}

/// Reads the spec of a model directory, config.json or GGUF file.
fn read_spec(path: &Path) -> anyhow::Result<ModelSpec> {
    if gguf::llama::is_gguf(path) {
        let file = GgufFile::open(path)?;
        return Ok(gguf::llama::llama_spec(&file)?);
    }
    Ok(ModelDir::open(path)
        .with_context(|| format!("reading the model config of {}", path.display()))?
        .spec)
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in binary units (`12.55 GiB`).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

fn describe_positions(spec: &ModelSpec) -> String {
    match &spec.positions {
        Positions::Learned => format!("learned ({} positions)", spec.context_length),
        Positions::Rope(rope) => {
            let scaling = match rope.scaling {
                RopeScaling::None => "no scaling".to_string(),
                RopeScaling::Linear { factor } => format!("linear scaling x{factor}"),
                RopeScaling::Llama3 {
                    factor,
                    original_max_position_embeddings,
                    ..
                } => {
                    format!("llama3 scaling x{factor} from {original_max_position_embeddings}")
                }
                RopeScaling::Dynamic {
                    factor,
                    max_position_embeddings,
                } => {
                    format!("dynamic NTK x{factor} past {max_position_embeddings}")
                }
            };
            format!(
                "RoPE {:?}, theta {}, {} of {} dims rotated, {scaling}",
                rope.layout, rope.theta, rope.rotary_dim, rope.head_dim
            )
        }
    }
}

/// The table `ember info` prints.
pub fn report(spec: &ModelSpec) -> String {
    let b = spec.biases;
    let biases: Vec<&str> = [
        (b.qkv, "qkv"),
        (b.attn_out, "attn_out"),
        (b.mlp_in, "mlp_in"),
        (b.mlp_out, "mlp_out"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    let windows: Vec<String> = spec
        .attention_windows
        .iter()
        .map(|w| w.map_or("full".to_string(), |w| w.to_string()))
        .collect();
    let params = spec.parameter_count();
    let rows = [
        ("architecture", spec.architecture.clone()),
        ("vocab size", grouped(spec.vocab_size as u64)),
        ("hidden size", spec.hidden_size.to_string()),
        ("layers", spec.num_layers.to_string()),
        (
            "heads",
            format!(
                "{} query, {} key/value, head dim {}",
                spec.num_heads, spec.num_kv_heads, spec.head_dim
            ),
        ),
        ("intermediate size", spec.intermediate_size.to_string()),
        (
            "norm",
            format!(
                "{:?} (eps {}{})",
                spec.norm.kind,
                spec.norm.eps,
                if spec.norm.bias { ", bias" } else { "" }
            ),
        ),
        ("residual", format!("{:?}, pre-norm", spec.residual)),
        ("positions", describe_positions(spec)),
        (
            "mlp",
            format!(
                "{} {:?}",
                if spec.mlp == MlpKind::Gated {
                    "gated"
                } else {
                    "plain"
                },
                spec.activation
            ),
        ),
        (
            "biases",
            if biases.is_empty() {
                "none".to_string()
            } else {
                biases.join(", ")
            },
        ),
        (
            "q/k norm",
            if spec.qk_norm { "yes" } else { "no" }.to_string(),
        ),
        ("attention windows", windows.join(" ")),
        (
            "attention scale",
            spec.attention_scale
                .map_or("1/sqrt(head_dim)".to_string(), |s| s.to_string()),
        ),
        (
            "tied embeddings",
            if spec.tied_embeddings { "yes" } else { "no" }.to_string(),
        ),
        ("context length", grouped(spec.context_length as u64)),
        (
            "parameters",
            format!(
                "{} (non-embedding {})",
                grouped(params),
                grouped(spec.non_embedding_parameter_count())
            ),
        ),
    ];
    let mut out: String = rows.iter().map(|(k, v)| format!("{k:<18} {v}\n")).collect();
    for (dtype, bytes) in DTYPES {
        out.push_str(&format!(
            "{:<18} {}\n",
            format!("weights {dtype}"),
            human_bytes(spec.weight_bytes(bytes))
        ));
    }
    out.push_str(&format!(
        "{:<18} {} per token (f16), {} at full context\n",
        "kv cache",
        human_bytes(spec.kv_cache_bytes_per_token(2)),
        human_bytes(spec.kv_cache_bytes_per_token(2) * spec.context_length as u64)
    ));
    out
}

/// Runs `ember info`.
pub fn run(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    let spec = read_spec(&args.model)?;
    if args.json {
        let memory: serde_json::Map<String, serde_json::Value> = DTYPES
            .iter()
            .map(|(dtype, bytes)| (dtype.to_string(), spec.weight_bytes(*bytes).into()))
            .collect();
        let value = serde_json::json!({
            "spec": spec,
            "parameters": spec.parameter_count(),
            "non_embedding_parameters": spec.non_embedding_parameter_count(),
            "weight_bytes": memory,
            "kv_cache_bytes_per_token_f16": spec.kv_cache_bytes_per_token(2),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", report(&spec));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_inserts_thousands_separators() {
        assert_eq!(grouped(6_738_415_616), "6,738,415,616");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
    }

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.00 GiB");
    }
}
