//! Measures how long loading a Hugging Face model directory takes on the CPU backend (config parse, memory map,
//! dtype conversion, upload), e.g. for a 135M SmolLM-shaped checkpoint.
//!
//! Run: `cargo run -p ember-model --example load_time -- DIR`.

use std::time::Instant;

use burn::backend::Flex;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: load_time MODEL_DIR")?;
    for run in 1..=3 {
        let start = Instant::now();
        let loaded =
            ember_model::load::<Flex>(std::path::Path::new(&dir), &Default::default(), None)?;
        let elapsed = start.elapsed();
        println!(
            "run {run}: loaded {} parameters in {:.3} s ({} unused tensors)",
            loaded.model.spec().parameter_count(),
            elapsed.as_secs_f64(),
            loaded.unused.len()
        );
    }
    Ok(())
}
