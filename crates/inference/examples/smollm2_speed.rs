//! Prefill and decode throughput of SmolLM2-135M-Instruct (GGUF) on the CPU backend, the figures in
//! docs/INFERENCE.md. Run scripts/fetch_smollm2.sh first, then:
//!
//! `RAYON_NUM_THREADS=2 cargo run -p ember-inference --example smollm2_speed -- [threads] [new_tokens] [manual|fused|flash]`

use std::time::Instant;

use burn::backend::Flex;
use ember_inference::sampling::SamplingConfig;
use ember_inference::{GenerationConfig, TransformerLm, generate};
use ember_model::AttentionKernel;
use ember_model::gguf::GgufFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2);
    let new_tokens: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let kernel: AttentionKernel = args.next().as_deref().unwrap_or("flash").parse()?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    let path = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("../../.cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf");
    let file = GgufFile::open(path)?;
    let device = Default::default();
    let start = Instant::now();
    let lm = TransformerLm::new(
        ember_model::gguf::load::<Flex>(&file, &device, None)?,
        device,
    );
    println!("load + dequantize: {:.2} s", start.elapsed().as_secs_f64());
    // The chat prompt of the SmolLM2 fixture (31 tokens), repeated to a 124-token prompt.
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        std::path::PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
        )
        .join("tests/fixtures/smollm2.json"),
    )?)?;
    let chat: Vec<u32> = fixture["chat_ids"]
        .as_array()
        .ok_or("chat_ids")?
        .iter()
        .filter_map(|v| v.as_u64())
        .map(|v| v as u32)
        .collect();
    let prompt: Vec<u32> = chat.iter().cycle().take(chat.len() * 4).copied().collect();
    let config = GenerationConfig {
        max_new_tokens: new_tokens,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    for run in 0..3 {
        let g = generate(
            &lm,
            None,
            std::slice::from_ref(&prompt),
            &config,
            &mut |_, _| {},
        )?
        .remove(0);
        println!(
            "run {run}: {kernel} attention, threads {threads}, prompt {} tokens, prefill {:.1} tok/s (ttft {:.3} s), decode {} tokens at {:.1} tok/s",
            g.prompt_ids.len(),
            g.prefill_tokens_per_second(),
            g.time_to_first_token.as_secs_f64(),
            g.ids.len(),
            g.decode_tokens_per_second()
        );
    }
    Ok(())
}
