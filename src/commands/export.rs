//! `ember export`: writes a model as a GGUF file that llama.cpp runs (f32, f16 or bf16 weights); `ember quantize
//! --quantize q4_k_m ...` writes its quantized GGUF files through [`write_gguf`] too.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use ember_inference::{ModelAssets, WeightFormat, WeightsFile};
use ember_model::EmberBackend;
use ember_model::gguf::{
    GgufExport, GgufRecipe, GgufSummary, MetadataValue, check_gguf_writable, save_gguf,
    tokenizer_metadata, vocab_metadata,
};

use crate::Context;
use crate::backend::BackendJob;
use crate::commands::model_args::load_with_progress;

/// Flags of `ember export`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model to export: a Hugging Face directory, a training run's `best/` or a GGUF file [required].
    #[arg(long)]
    pub model: PathBuf,
    /// File to write (replaced atomically when it exists) [required].
    #[arg(long)]
    pub out: PathBuf,
    /// File format: gguf [default: gguf].
    #[arg(long, default_value = "gguf")]
    pub format: String,
    /// Type of the weight matrices: f32, f16 or bf16; vectors stay f32 [default: f32].
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// The model's name in the file (`general.name`) [default: the model's directory or file name].
    #[arg(long)]
    pub name: Option<String>,
}

/// Runs `ember export`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    if args.format != "gguf" {
        bail!("--format {}: expected gguf", args.format);
    }
    let recipe = match GgufRecipe::parse(&args.dtype) {
        Some(r @ (GgufRecipe::F32 | GgufRecipe::F16 | GgufRecipe::Bf16)) => r,
        _ => bail!(
            "--dtype {}: expected f32, f16 or bf16 (quantized types are written by `ember quantize --quantize \
             q4_k_m|q8_0|... --out FILE.gguf`)",
            args.dtype
        ),
    };
    write_gguf(&args.model, &args.out, recipe, args.name, ctx)
}

struct GgufJob {
    assets: ModelAssets,
    export: GgufExport,
    out: PathBuf,
    quiet: bool,
}

impl BackendJob for GgufJob {
    type Output = anyhow::Result<GgufSummary>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let model = load_with_progress::<B>(&self.assets, &device, &WeightFormat::F32, self.quiet)?;
        let bar = super::progress_bar(
            self.quiet,
            Some(0),
            "writing {bar:30} {pos}/{len} tensors {msg}",
        );
        let mut progress = |done: usize, total: usize, name: &str| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(name.to_string());
        };
        let summary = save_gguf(&model, &self.export, &self.out, Some(&mut progress))
            .with_context(|| format!("writing {}", self.out.display()))?;
        bar.finish_and_clear();
        Ok(summary)
    }
}

/// Writes the model at `model` to the GGUF file `out` under `recipe`, with its tokenizer and chat template.
pub fn write_gguf(
    model: &Path,
    out: &Path,
    recipe: GgufRecipe,
    name: Option<String>,
    ctx: &Context,
) -> anyhow::Result<()> {
    if out.is_dir() {
        bail!(
            "--out {}: is a directory; a GGUF file is written to a file path",
            out.display()
        );
    }
    if model.canonicalize().ok() == out.canonicalize().ok() {
        bail!("--out must differ from --model (the file being read would be replaced)");
    }
    let assets = ModelAssets::open(model)?;
    // The family's refusal comes before the tokenizer's and before minutes of loading weights.
    check_gguf_writable(&assets.spec).with_context(|| format!("--model {}", model.display()))?;
    let tokenizer = tokenizer_keys(&assets)?;
    if let WeightsFile::Gguf(file) = &assets.weights
        && recipe.default_type().is_block_quantized()
        && file
            .tensors()
            .iter()
            .any(|t| t.ggml_type.is_block_quantized())
        && !ctx.quiet
    {
        stderr!(
            "warning: {} is already quantized; its blocks are dequantized and quantized again, which adds the \
             second rounding to the first (quantize from the f32/f16 original where you have it)",
            model.display()
        );
    }
    let name = name.or_else(|| default_name(model));
    let job = GgufJob {
        assets,
        export: GgufExport {
            recipe,
            tokenizer,
            name,
        },
        out: out.to_path_buf(),
        quiet: ctx.quiet,
    };
    let summary = ctx.dispatch(None, job)??;
    if !ctx.quiet {
        let types: Vec<String> = summary
            .types
            .iter()
            .map(|(ty, n)| format!("{n} {ty}"))
            .collect();
        stderr!(
            "wrote {} ({recipe}): {} tensors ({}), {:.1} MiB of weights",
            out.display(),
            summary.tensors,
            types.join(", "),
            summary.data_bytes as f64 / (1u64 << 20) as f64
        );
    }
    Ok(())
}

/// The `tokenizer.*` keys for the file: a GGUF model's own, copied; otherwise the model's tokenizer written as a
/// GGUF vocabulary, with its chat template.
fn tokenizer_keys(assets: &ModelAssets) -> anyhow::Result<Vec<(String, MetadataValue)>> {
    if let WeightsFile::Gguf(file) = &assets.weights {
        return Ok(tokenizer_metadata(file));
    }
    let Some(tokenizer) = &assets.tokenizer else {
        bail!(
            "--model {}: has no tokenizer (tokenizer.json); llama.cpp needs the vocabulary in the GGUF file",
            assets.path.display()
        );
    };
    let vocab = tokenizer
        .to_gguf_vocab()
        .with_context(|| format!("--model {}: its tokenizer", assets.path.display()))?;
    let template = assets.chat_template.as_ref().map(|t| t.source());
    Ok(vocab_metadata(&vocab, template))
}

/// The model's name from its path: a directory's name (its parent's for a run's `best/`), a file's stem.
fn default_name(model: &Path) -> Option<String> {
    let path = if model.is_file() {
        return model.file_stem().map(|s| s.to_string_lossy().into_owned());
    } else if model
        .file_name()
        .is_some_and(|n| n == "best" || n == "last")
    {
        model.parent()?
    } else {
        model
    };
    path.file_name().map(|s| s.to_string_lossy().into_owned())
}
