//! The flags that say which model to run and how, shared by `generate`, `eval`, `logits` and `bench`
//! ([`ModelArgs`], [`LoadArgs`], [`QuantizeArgs`], [`KvCacheArgs`]), and loading a model the way they ask.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use ember_inference::{KvCacheKind, ModelAssets, WeightFormat};
use ember_model::{
    AttentionKernel, EmberBackend, GgmlProducts, QuantScheme, Quantization, Transformer,
};
use ember_optimization::quant::scheme::MAX_GROUP_SIZE;

/// The model to run (`--model`) and how to load it ([`LoadArgs`]).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Hugging Face model directory (config.json, model.safetensors, tokenizer.json), a directory written by
    /// `ember quantize`, or a GGUF file [required].
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub load: LoadArgs,
}

impl ModelArgs {
    /// Opens `--model`: spec, tokenizer and chat template, weights not yet read.
    pub fn open(&self) -> anyhow::Result<ModelAssets> {
        ModelAssets::open(&self.model)
            .with_context(|| format!("opening model {}", self.model.display()))
    }

    /// Loads `assets` (opened from `--model`) as [`LoadArgs::load`] does.
    pub fn load<B: EmberBackend>(
        &self,
        assets: &ModelAssets,
        device: &B::Device,
        quiet: bool,
    ) -> anyhow::Result<Transformer<B>> {
        self.load.load(assets, device, quiet)
    }
}

/// How a model is loaded and run: its attention kernel and the format of its weights.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// Attention kernel: manual, fused or flash [default: flash].
    #[arg(long, default_value_t = AttentionKernel::Flash)]
    pub attention: AttentionKernel,
    #[command(flatten)]
    pub quantize: QuantizeArgs,
    /// A LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors, e.g. a LoRA run's
    /// best/adapter) applied to the model without merging [default: none].
    #[arg(long)]
    pub adapter: Option<PathBuf>,
}

impl LoadArgs {
    /// Loads `assets` onto `device` in the weight format `--quantize` asks for, computing attention with
    /// `--attention`, behind a progress bar (hidden with `quiet`).
    pub fn load<B: EmberBackend>(
        &self,
        assets: &ModelAssets,
        device: &B::Device,
        quiet: bool,
    ) -> anyhow::Result<Transformer<B>> {
        let format = self.quantize.weight_format()?;
        if self.quantize.exact_products && !matches!(format, WeightFormat::Stored) {
            bail!("--exact-products applies to --quantize gguf (GGUF blocks kept packed)");
        }
        let products = if self.quantize.exact_products {
            GgmlProducts::Exact
        } else {
            GgmlProducts::Integer
        };
        let Some(dir) = &self.adapter else {
            return Ok(load_with_progress::<B>(assets, device, &format, quiet)?
                .with_kernel(self.attention)
                .with_ggml_products(products));
        };
        // The adapter sits on dense weights; a scheme then quantizes the merged layers.
        let quantization = match format {
            WeightFormat::F32 => None,
            WeightFormat::Quantized(q) => Some(q),
            WeightFormat::Stored => {
                bail!(
                    "--adapter needs the base weights dense; drop --quantize gguf (or merge the adapter first)"
                )
            }
        };
        let adapter = ember_model::lora::read_adapter(dir)
            .with_context(|| format!("--adapter {}", dir.display()))?;
        let model = load_with_progress::<B>(assets, device, &WeightFormat::F32, quiet)?
            .with_adapter(&adapter)
            .with_context(|| format!("--adapter {}", dir.display()))?;
        let model = match quantization {
            Some(q) => model.quantize(&q)?,
            None => model,
        };
        Ok(model.with_kernel(self.attention))
    }
}

/// The KV cache of generation.
#[derive(clap::Args, Debug, Clone)]
pub struct KvCacheArgs {
    /// KV cache: contiguous (one left-padded buffer for the batch), paged (each prompt's tokens in 16-position
    /// blocks, released as rows finish) or paged-N for N-position blocks [default: contiguous].
    #[arg(long, default_value = "contiguous")]
    pub kv_cache: KvCacheKind,
    /// Hard cap on the paged KV cache, in MiB, 1..=16777216; a batch that outgrows it fails with a message
    /// saying so [default: what a contiguous cache of the whole context window would take].
    #[arg(long, value_parser = crate::flags::kv_budget_mib)]
    pub kv_budget_mib: Option<usize>,
}

impl KvCacheArgs {
    /// The cache the flags describe; a budget without a paged cache, or of 0 MiB, is an error naming the flag.
    pub fn kind(&self) -> anyhow::Result<KvCacheKind> {
        Ok(match (self.kv_cache, self.kv_budget_mib) {
            (KvCacheKind::Contiguous, Some(_)) => {
                bail!("--kv-budget-mib applies to the paged cache; add --kv-cache paged")
            }
            (kind, Some(0)) => bail!("--kv-budget-mib must be at least 1 for --kv-cache {kind}"),
            (kind, Some(mib)) => kind.with_budget_bytes(mib << 20),
            (kind, None) => kind,
        })
    }
}

/// Loads `assets` onto `device` in `format` behind a tensor-count progress bar (hidden with `--quiet`).
pub fn load_with_progress<B: EmberBackend>(
    assets: &ModelAssets,
    device: &B::Device,
    format: &WeightFormat,
    quiet: bool,
) -> anyhow::Result<Transformer<B>> {
    let bar = super::progress_bar(quiet, Some(0), "loading {bar:30} {pos}/{len} tensors {msg}");
    let mut progress = |done: usize, total: usize, name: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(name.to_string());
    };
    if matches!(format, WeightFormat::Stored) {
        for (tensor, ty) in assets.unpacked_matrices()? {
            stderr!("warning: {tensor} is {ty}, which ember does not keep packed: it loads as f32");
        }
    }
    let model = assets.load_as::<B>(device, Some(&mut progress), format)?;
    bar.finish_and_clear();
    Ok(model)
}

/// How to hold the weights once loaded.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct QuantizeArgs {
    /// Quantize the weights for inference: int8 (per output channel), int8-gN, int4 (= int4-g32), int4-gN, each
    /// int4 form optionally with -asym (zero points), N a multiple of 8 in 8..=4096 and, above 256, at most a
    /// weight row's length; or `gguf` to keep a GGUF file's quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    /// Q2_K..Q6_K, IQ4_NL, IQ4_XS) exactly as stored. `ember quantize` also takes llama.cpp's types (q8_0,
    /// q6_k, q5_k_m, q5_k_s, q5_1, q5_0, q4_k_m, q4_k_s, q4_1, q4_0, q3_k_l, q3_k_m, q3_k_s, q2_k) and writes
    /// a GGUF file [default: none, f32 weights].
    #[arg(long, value_name = "SCHEME")]
    pub quantize: Option<String>,
    /// With --quantize SCHEME: also quantize the token embedding table [default: off].
    #[arg(long, requires = "quantize")]
    pub quantize_embeddings: bool,
    /// With --quantize SCHEME: keep the LM head in f32 [default: off, the head is quantized].
    #[arg(long, requires = "quantize")]
    pub f32_lm_head: bool,
    /// With --quantize gguf: multiply decode steps with the dequantized blocks in f32 instead of quantizing the
    /// activations to 8 bits for integer dot products (as llama.cpp does); 3-30x slower per product, exact up
    /// to f32 rounding [default: off].
    #[arg(long, requires = "quantize")]
    pub exact_products: bool,
}

impl QuantizeArgs {
    /// The weight format the flags ask for; an unknown scheme is an error naming the flag and the accepted forms.
    pub fn weight_format(&self) -> anyhow::Result<WeightFormat> {
        let Some(text) = self.quantize.as_deref() else {
            return Ok(WeightFormat::F32);
        };
        if text == "gguf" {
            return Ok(WeightFormat::Stored);
        }
        let scheme: QuantScheme = text.parse().with_context(|| {
            format!(
                "--quantize {text}: expected int8, int8-gN, int4, int4-gN, int4-gN-asym or gguf \
                 (N a multiple of 8 in 8..={MAX_GROUP_SIZE}, e.g. int4-g128)"
            )
        })?;
        Ok(WeightFormat::Quantized(Quantization {
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

    fn format(args: &[&str]) -> anyhow::Result<WeightFormat> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        cli.quantize.weight_format()
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(format(&[]).unwrap(), WeightFormat::F32);
        assert_eq!(
            format(&["--quantize", "gguf"]).unwrap(),
            WeightFormat::Stored
        );
        let WeightFormat::Quantized(q) =
            format(&["--quantize", "int4-g128-asym", "--f32-lm-head"]).unwrap()
        else {
            panic!("expected a scheme");
        };
        assert_eq!(q.scheme.to_string(), "int4-g128-asym");
        assert!(!q.lm_head && !q.embeddings);
        assert_eq!(
            format(&["--quantize", "int8", "--quantize-embeddings"])
                .unwrap()
                .label(),
            "int8+emb"
        );
    }

    #[test]
    fn bad_input_names_the_flag() {
        let err = format(&["--quantize", "int3"]).unwrap_err();
        assert!(format!("{err:#}").contains("--quantize int3"), "{err:#}");
        assert!(
            format(&["--quantize-embeddings"]).is_err(),
            "needs --quantize"
        );
    }

    #[derive(Parser)]
    struct ModelCli {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        kv: KvCacheArgs,
    }

    fn parse_model(args: &[&str]) -> Result<ModelCli, clap::Error> {
        ModelCli::try_parse_from(
            ["t", "--model", "m"]
                .into_iter()
                .chain(args.iter().copied()),
        )
    }

    #[test]
    fn attention_is_typed_and_unknown_kernels_are_refused_by_name() {
        assert_eq!(
            parse_model(&[]).unwrap().model.load.attention,
            AttentionKernel::Flash
        );
        let manual = parse_model(&["--attention", "manual"]).unwrap();
        assert_eq!(manual.model.load.attention, AttentionKernel::Manual);
        let err = parse_model(&["--attention", "sparse"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("sparse") && err.contains("--attention"),
            "{err}"
        );
    }

    #[test]
    fn a_kv_budget_needs_a_paged_cache() {
        let err = parse_model(&["--kv-budget-mib", "4"])
            .unwrap()
            .kv
            .kind()
            .unwrap_err();
        assert!(err.to_string().contains("--kv-cache paged"), "{err}");
        let paged = parse_model(&["--kv-cache", "paged", "--kv-budget-mib", "4"]).unwrap();
        assert_eq!(
            paged.kv.kind().unwrap(),
            KvCacheKind::paged().with_budget_bytes(4 << 20)
        );
    }
}
