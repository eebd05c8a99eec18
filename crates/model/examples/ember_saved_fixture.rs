//! Writes the `ember_llama` fixture: an ember-initialised LLaMA-style model saved in the Hugging Face layout,
//! plus the logits ember computes for a fixed sequence (`ember_logits.safetensors`). Then
//! `scripts/fixtures/model_fixtures.py --check-ember DIR` loads it with transformers and records the comparison.
//!
//! Run: `cargo run -p ember-model --example ember_saved_fixture [DIR [MODEL_DIR]]`; with `MODEL_DIR` the model
//! saved is the one loaded from there (e.g. a parity fixture, to check the config ember writes for its family)
//! instead of a fresh LLaMA.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ember_model::weights::RandomInit;
use ember_model::{ModelSpec, Transformer, save};
use safetensors::tensor::{Dtype, TensorView};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(
                std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
            )
            .join("tests/fixtures/ember_llama")
        });
    let device = Default::default();
    let model = match std::env::args().nth(2) {
        Some(from) => ember_model::load::<Flex>(from.as_ref(), &device, None)?.model,
        None => {
            // GQA (4 query heads, 2 KV heads), untied head; std 0.3 so the logits are far from uniform.
            let spec = ModelSpec::llama_style(128, 32, 2, 4, 2, 64, 64);
            Transformer::<Flex>::from_source(
                &spec,
                &mut RandomInit::with_std(7, spec.num_layers, 0.3),
                &device,
                None,
            )?
        }
    };
    let spec = model.spec().clone();
    save(&model, &out)?;
    let ids: Vec<i64> = (0..24).map(|i| (i * 37 + 11) % 128).collect();
    let tokens =
        Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids.clone(), [1, ids.len()]), &device);
    let logits: Vec<f32> = model.forward(tokens)?.into_data().into_vec()?;
    let token_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let logit_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![
        (
            "tokens",
            TensorView::new(Dtype::I64, vec![ids.len()], &token_bytes)?,
        ),
        (
            "logits",
            TensorView::new(Dtype::F32, vec![ids.len(), spec.vocab_size], &logit_bytes)?,
        ),
    ];
    safetensors::serialize_to_file(views, &None, &out.join("ember_logits.safetensors"))?;
    println!("wrote {}", out.display());
    Ok(())
}
