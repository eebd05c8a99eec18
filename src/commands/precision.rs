//! The `--quantize` flags shared by `generate`, `logits`, `eval` and `bench`, and loading a model at the precision
//! they ask for.

use anyhow::Context as _;
use ember_inference::{ModelAssets, Precision};
use ember_model::{AttentionBackend, QuantScheme, Quantization, Transformer};
use indicatif::{ProgressBar, ProgressStyle};

/// Loads `assets` onto `device` at `precision` behind a tensor-count progress bar (hidden with `--quiet`).
pub fn load_with_progress<B: AttentionBackend>(
    assets: &ModelAssets,
    device: &B::Device,
    precision: &Precision,
    quiet: bool,
) -> anyhow::Result<Transformer<B>> {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(ProgressStyle::with_template(
        "loading {bar:30} {pos}/{len} tensors {msg}",
    )?);
    let mut progress = |done: usize, total: usize, name: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(name.to_string());
    };
    let model = assets.load_as::<B>(device, Some(&mut progress), precision)?;
    bar.finish_and_clear();
    Ok(model)
}

/// How to hold the weights once loaded.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct QuantizeArgs {
    /// Quantize the weights for inference: int8 (per output channel), int8-gN, int4 (= int4-g32), int4-gN, each
    /// int4 form optionally with -asym (zero points); or `gguf` to keep a GGUF file's Q8_0/Q4_0/Q4_1 blocks
    /// exactly as stored [default: none, f32 weights].
    #[arg(long, value_name = "SCHEME")]
    pub quantize: Option<String>,
    /// With --quantize SCHEME: also quantize the token embedding table [default: off].
    #[arg(long, requires = "quantize")]
    pub quantize_embeddings: bool,
    /// With --quantize SCHEME: keep the LM head in f32 [default: off, the head is quantized].
    #[arg(long, requires = "quantize")]
    pub f32_lm_head: bool,
}

impl QuantizeArgs {
    /// The precision the flags ask for; an unknown scheme is an error naming the flag and the accepted forms.
    pub fn precision(&self) -> anyhow::Result<Precision> {
        let Some(text) = self.quantize.as_deref() else {
            return Ok(Precision::F32);
        };
        if text == "gguf" {
            return Ok(Precision::Stored);
        }
        let scheme: QuantScheme = text.parse().with_context(|| {
            format!(
                "--quantize {text}: expected int8, int8-gN, int4, int4-gN, int4-gN-asym or gguf \
                 (N a multiple of 8, e.g. int4-g128)"
            )
        })?;
        Ok(Precision::Quantized(Quantization {
            scheme,
            lm_head: !self.f32_lm_head,
            embeddings: self.quantize_embeddings,
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        quantize: QuantizeArgs,
    }

    fn precision(args: &[&str]) -> anyhow::Result<Precision> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        cli.quantize.precision()
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(precision(&[]).unwrap(), Precision::F32);
        assert_eq!(
            precision(&["--quantize", "gguf"]).unwrap(),
            Precision::Stored
        );
        let Precision::Quantized(q) =
            precision(&["--quantize", "int4-g128-asym", "--f32-lm-head"]).unwrap()
        else {
            panic!("expected a scheme");
        };
        assert_eq!(q.scheme.to_string(), "int4-g128-asym");
        assert!(!q.lm_head && !q.embeddings);
        assert_eq!(
            precision(&["--quantize", "int8", "--quantize-embeddings"])
                .unwrap()
                .label(),
            "int8+emb"
        );
    }

    #[test]
    fn bad_input_names_the_flag() {
        let err = precision(&["--quantize", "int3"]).unwrap_err();
        assert!(format!("{err:#}").contains("--quantize int3"), "{err:#}");
        assert!(
            precision(&["--quantize-embeddings"]).is_err(),
            "needs --quantize"
        );
    }
}
