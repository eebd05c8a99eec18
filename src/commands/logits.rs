//! `ember logits`: run one forward pass and write the logits to safetensors, for checking against other
//! implementations.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use burn::tensor::{Int, Tensor, TensorData};
use ember_inference::ModelAssets;
use ember_model::EmberBackend;
use safetensors::tensor::{Dtype, TensorView};

use crate::Context;
use crate::backend::BackendJob;
use crate::commands::model_args::{LoadArgs, ModelArgs};

/// Flags of `ember logits`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["tokens", "prompt"])))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids, e.g. `1,2,3` [this or --prompt is required].
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Text to encode with the model's tokenizer [this or --tokens is required].
    #[arg(long)]
    pub prompt: Option<String>,
    /// Output safetensors file: `logits` [T, vocab] f32 and `tokens` [T] i64 [required].
    #[arg(long)]
    pub output: PathBuf,
}

/// Loads the model on the selected backend and computes the logits of `ids`.
struct LogitsJob {
    assets: ModelAssets,
    ids: Vec<u32>,
    load: LoadArgs,
    quiet: bool,
}

impl BackendJob for LogitsJob {
    type Output = anyhow::Result<Vec<f32>>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let model = self.load.load::<B>(&self.assets, &device, self.quiet)?;
        model.check_tokens(&self.ids)?;
        let data: Vec<i64> = self.ids.iter().map(|&id| i64::from(id)).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(data, [1, self.ids.len()]), &device);
        let logits = model.forward(tokens)?.into_data().convert::<f32>();
        logits
            .into_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("reading logits back: {e:?}"))
    }
}

fn write_output(path: &Path, ids: &[u32], logits: &[f32], vocab: usize) -> anyhow::Result<()> {
    let token_bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&id| i64::from(id).to_le_bytes())
        .collect();
    let logit_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![
        (
            "logits",
            TensorView::new(Dtype::F32, vec![ids.len(), vocab], &logit_bytes)?,
        ),
        (
            "tokens",
            TensorView::new(Dtype::I64, vec![ids.len()], &token_bytes)?,
        ),
    ];
    safetensors::serialize_to_file(views, &None, path)
        .with_context(|| format!("writing {}", path.display()))
}

/// Runs `ember logits`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let assets = args.model.open()?;
    let flag = if args.tokens.is_some() {
        "--tokens"
    } else {
        "--prompt"
    };
    let ids = match (args.tokens, &args.prompt) {
        (Some(ids), _) => ids,
        (None, Some(prompt)) => {
            let tokenizer = assets.tokenizer.as_ref().with_context(|| {
                format!(
                    "--prompt needs a tokenizer with the model {}",
                    args.model.model.display()
                )
            })?;
            tokenizer.encode(prompt)?
        }
        (None, None) => bail!("give --tokens or --prompt"),
    };
    if ids.is_empty() {
        bail!("no tokens to run (empty --tokens or --prompt)");
    }
    // Positions past the context window have no trained position (RoPE tables and learned embeddings stop there),
    // so their logits would be garbage written with exit 0.
    let context = assets.spec.context_length;
    if ids.len() > context {
        bail!(
            "{flag}: {} tokens exceed the model's context length of {context}: give at most {context}",
            ids.len()
        );
    }
    let vocab = assets.spec.vocab_size;
    let job = LogitsJob {
        assets,
        ids: ids.clone(),
        load: args.model.load.clone(),
        quiet: ctx.quiet,
    };
    let logits = ctx.dispatch(None, job)??;
    write_output(&args.output, &ids, &logits, vocab)?;
    if !ctx.quiet {
        stderr!(
            "wrote logits [{}, {vocab}] to {}",
            ids.len(),
            args.output.display()
        );
    }
    Ok(())
}
