//! `ember info`: print a model's spec, parameter count and memory by dtype, from its config alone.

use std::path::Path;

use anyhow::Context as _;
use ember_model::gguf::{self, GgufFile};
use ember_model::spec::DTYPES;
use ember_model::{MlpKind, ModelDir, ModelSpec, Positions, RopeConfig, RopeScaling};

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
    if gguf::is_gguf(path) {
        let file = GgufFile::open(path)?;
        return Ok(gguf::model_spec(&file)?.1);
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
        Positions::Rope(rope) => describe_rope(rope),
    }
}

fn describe_rope(rope: &RopeConfig) -> String {
    let scaling = match &rope.scaling {
        RopeScaling::None => "no scaling".to_string(),
        RopeScaling::Linear { factor } => format!("linear scaling x{factor}"),
        RopeScaling::Llama3 {
            factor,
            original_max_position_embeddings,
            ..
        } => format!("llama3 scaling x{factor} from {original_max_position_embeddings}"),
        RopeScaling::Dynamic {
            factor,
            max_position_embeddings,
        } => format!("dynamic NTK x{factor} past {max_position_embeddings}"),
        RopeScaling::LongRope {
            original_max_position_embeddings,
            attention_factor,
            ..
        } => format!(
            "LongRoPE (short factors up to {original_max_position_embeddings} positions, long ones past, \
             cos/sin x{attention_factor:.4})"
        ),
    };
    format!(
        "RoPE {:?}, theta {}, {} of {} dims rotated, {scaling}",
        rope.layout, rope.theta, rope.rotary_dim, rope.head_dim
    )
}

/// The table `ember info` prints.
/// `x` as a person writes it: `1e-5` for an epsilon (read from an f32 field, so printed at f32 precision when it
/// is exactly an f32, not as `0.000009999999747378752`).
fn short_float(x: f64) -> String {
    let single = x as f32;
    if f64::from(single) == x {
        format!("{single:e}")
    } else {
        format!("{x:e}")
    }
}

/// The per-layer windows in a line: `none (full causal attention)`, `4096 on every layer`, or the repeating
/// pattern with its count (`4096 full, 6 times`), run-length compressed (`4096 x5, full`).
fn describe_windows(windows: &[Option<usize>]) -> String {
    let name = |w: &Option<usize>| w.map_or("full".to_string(), |w| w.to_string());
    if windows.iter().all(Option::is_none) {
        return "none (full causal attention)".to_string();
    }
    if windows.iter().all(|w| *w == windows[0]) {
        return format!("{} on every layer", name(&windows[0]));
    }
    let period = (1..=windows.len())
        .find(|&p| windows.len().is_multiple_of(p) && windows.chunks(p).all(|c| c == &windows[..p]))
        .unwrap_or(windows.len());
    let mut runs: Vec<(String, usize)> = Vec::new();
    for w in &windows[..period] {
        match runs.last_mut() {
            Some((last, count)) if *last == name(w) => *count += 1,
            _ => runs.push((name(w), 1)),
        }
    }
    let pattern = runs
        .iter()
        .map(|(w, n)| {
            if *n == 1 {
                w.clone()
            } else {
                format!("{w} x{n}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    match windows.len() / period {
        1 => pattern,
        repeats => format!("{pattern}, {repeats} times"),
    }
}

pub fn report(spec: &ModelSpec) -> String {
    let b = spec.features.biases;
    let biases: Vec<&str> = [
        (b.qkv, "qkv"),
        (b.attn_out, "attn_out"),
        (b.mlp_in, "mlp_in"),
        (b.mlp_out, "mlp_out"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    let params = spec.parameter_count();
    let mut rows = vec![
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
                "{:?} (eps {}{}{})",
                spec.features.norm.kind,
                short_float(spec.features.norm.eps),
                if spec.features.norm.bias {
                    ", bias"
                } else {
                    ""
                },
                if spec.features.norm_unit_offset {
                    ", scale 1 + weight"
                } else {
                    ""
                }
            ),
        ),
        (
            "residual",
            format!(
                "{:?}, {}",
                spec.features.residual,
                if spec.features.post_norms {
                    "pre- and post-norm"
                } else {
                    "pre-norm"
                }
            ),
        ),
        ("positions", describe_positions(spec)),
        (
            "mlp",
            format!(
                "{} {:?}",
                if spec.features.mlp == MlpKind::Gated {
                    "gated"
                } else {
                    "plain"
                },
                spec.features.activation
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
            if spec.features.qk_norm { "yes" } else { "no" }.to_string(),
        ),
        (
            "attention windows",
            describe_windows(&spec.attention_windows),
        ),
        (
            "attention scale",
            spec.features
                .attention_scale
                .map_or("1/sqrt(head_dim)".to_string(), |s| s.to_string()),
        ),
        (
            "tied embeddings",
            if spec.features.tied_embeddings {
                "yes"
            } else {
                "no"
            }
            .to_string(),
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
    // Gemma's knobs, listed only where a model uses them.
    let f = &spec.features;
    let extra = [
        (
            "local positions",
            f.local_rope
                .as_ref()
                .map(|rope| format!("{} (sliding-window layers)", describe_rope(rope))),
        ),
        (
            "embedding scale",
            f.scaled_embeddings
                .then(|| format!("sqrt(hidden) = {}", (spec.hidden_size as f64).sqrt())),
        ),
        (
            "attn soft cap",
            f.attn_softcap.map(|c| format!("{c} (c * tanh(score / c))")),
        ),
        (
            "logit soft cap",
            f.final_softcap
                .map(|c| format!("{c} (c * tanh(logit / c))")),
        ),
    ];
    let at = rows.len() - 2;
    for (key, value) in extra.into_iter().rev() {
        if let Some(value) = value {
            rows.insert(at, (key, value));
        }
    }
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
        super::println(&serde_json::to_string_pretty(&value)?)?;
    } else {
        super::print(&report(&spec))?;
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
    fn gemma_knobs_are_listed_only_where_a_model_uses_them() {
        let mut spec = ModelSpec::llama_style(128, 64, 2, 4, 2, 128, 64);
        let plain = report(&spec);
        for row in [
            "embedding scale",
            "soft cap",
            "local positions",
            "1 + weight",
        ] {
            assert!(!plain.contains(row), "{plain}");
        }
        spec.features.scaled_embeddings = true;
        spec.features.norm_unit_offset = true;
        spec.features.post_norms = true;
        spec.features.attn_softcap = Some(50.0);
        spec.features.final_softcap = Some(30.0);
        spec.features.local_rope = Some(RopeConfig::new(16));
        let gemma = report(&spec);
        for row in [
            "sqrt(hidden) = 8\n",
            "scale 1 + weight",
            "pre- and post-norm",
            "attn soft cap      50",
            "logit soft cap     30",
            "local positions    RoPE",
        ] {
            assert!(gemma.contains(row), "{gemma} should contain {row}");
        }
    }

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.00 GiB");
    }
}
