//! `ember quantize`: writes a model directory with its weights quantized (`config.json`, the packed
//! `model.quantized.safetensors` and the tokenizer files), which `generate`, `eval`, `logits` and `bench` load
//! as stored; or, with one of llama.cpp's recipes (`--quantize q4_k_m`, `q8_0`, ...), a GGUF file that llama.cpp
//! and ember both run.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use ember_inference::{ModelAssets, WeightFormat, WeightsFile};
use ember_model::gguf::GgufRecipe;
use ember_model::{EmberBackend, save_quantized};

use crate::Context;
use crate::backend::BackendJob;
use crate::commands::model_args::{QuantizeArgs, load_with_progress};

/// Files of a model directory that describe its tokenizer and generation defaults, copied as they are.
const SIDE_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// Flags of `ember quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model to quantize: a Hugging Face directory, or (for a GGUF recipe) also a training run's `best/` or a
    /// GGUF file [required].
    #[arg(long)]
    pub model: PathBuf,
    /// Directory to write (created; existing files of the same names are replaced), or for a GGUF recipe the
    /// `.gguf` file (replaced atomically) [required].
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub quantize: QuantizeArgs,
    /// For a GGUF recipe: the model's name in the file (`general.name`) [default: the model's directory or file
    /// name].
    #[arg(long)]
    pub name: Option<String>,
}

struct QuantizeJob {
    assets: ModelAssets,
    precision: WeightFormat,
    out: PathBuf,
    quiet: bool,
}

impl BackendJob for QuantizeJob {
    type Output = anyhow::Result<(usize, usize)>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let dense = self.assets.spec.parameter_count() as usize * 4;
        let model = load_with_progress::<B>(&self.assets, &device, &self.precision, self.quiet)?;
        save_quantized(&model, &self.out)
            .with_context(|| format!("writing {}", self.out.display()))?;
        Ok((model.weight_memory_bytes(), dense))
    }
}

/// Runs `ember quantize`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    if let Some(recipe) = args
        .quantize
        .quantize
        .as_deref()
        .and_then(GgufRecipe::parse)
        && recipe.default_type().is_block_quantized()
    {
        // A recipe sets every tensor's type itself, the embedding and the head included.
        for (set, flag) in [
            (args.quantize.quantize_embeddings, "--quantize-embeddings"),
            (args.quantize.f32_lm_head, "--f32-lm-head"),
            (args.quantize.exact_products, "--exact-products"),
        ] {
            if set {
                bail!(
                    "{flag} applies to the int8/int4 schemes; --quantize {recipe} chooses every tensor's \
                     type (the head and a tied embedding Q6_K or Q8_0, as llama.cpp does)"
                );
            }
        }
        return crate::commands::export::write_gguf(&args.model, &args.out, recipe, args.name, ctx);
    }
    let precision = args.quantize.weight_format()?;
    let scheme = match precision {
        WeightFormat::Quantized(q) => q.scheme,
        WeightFormat::Stored => bail!(
            "--quantize gguf keeps a GGUF file's blocks; a GGUF file already loads quantized with \
             `ember generate --quantize gguf`"
        ),
        WeightFormat::F32 => {
            bail!(
                "--quantize SCHEME is required: int8, int8-gN, int4-gN, int4-gN-asym (a quantized directory) \
                 or one of llama.cpp's types for a GGUF file: q8_0, q6_k, q5_k_m, q5_k_s, q5_1, q5_0, q4_k_m, \
                 q4_k_s, q4_1, q4_0, q3_k_l, q3_k_m, q3_k_s, q2_k"
            )
        }
    };
    let assets = ModelAssets::open(&args.model)?;
    let WeightsFile::Dir(dir) = &assets.weights else {
        bail!(
            "--model {}: `ember quantize` reads a Hugging Face model directory; a GGUF file already loads \
             quantized with `--quantize gguf`",
            args.model.display()
        );
    };
    let source = dir.dir.clone();
    if source.canonicalize().ok() == args.out.canonicalize().ok() {
        bail!(
            "--out must differ from --model (the dense weights would sit next to the quantized ones)"
        );
    }
    let job = QuantizeJob {
        assets,
        precision,
        out: args.out.clone(),
        quiet: ctx.quiet,
    };
    let (bytes, dense) = ctx.dispatch(None, job)??;
    copy_side_files(&source, &args.out)?;
    if !ctx.quiet {
        stderr!(
            "wrote {} ({scheme}): weights {:.1} MiB, {:.2}x of f32",
            args.out.display(),
            bytes as f64 / (1u64 << 20) as f64,
            bytes as f64 / dense as f64
        );
    }
    Ok(())
}

fn copy_side_files(from: &Path, to: &Path) -> anyhow::Result<()> {
    for name in SIDE_FILES {
        let source = from.join(name);
        if source.is_file() {
            std::fs::copy(&source, to.join(name))
                .with_context(|| format!("copying {} to {}", source.display(), to.display()))?;
        }
    }
    Ok(())
}
