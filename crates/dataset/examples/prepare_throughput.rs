//! Measures preparation throughput with ember's tokenizer, the library path of `ember prepare`.
//!
//! `cargo run --release -p ember-dataset --example prepare_throughput -- TOKENIZER OUTPUT INPUT...`

use std::path::PathBuf;
use std::time::Instant;

use ember_dataset::{PrepareOptions, TokenizerEncoder, prepare};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [tokenizer, output, inputs @ ..] = args.as_slice() else {
        return Err("usage: prepare_throughput TOKENIZER OUTPUT INPUT...".into());
    };
    let encoder = TokenizerEncoder::from_path(tokenizer)?;
    let options = PrepareOptions::new(inputs.to_vec(), output.clone());
    let started = Instant::now();
    let report = prepare(&encoder, &options, &|_| {})?;
    let seconds = started.elapsed().as_secs_f64();
    let m = &report.manifest;
    let bytes: u64 = m.inputs.iter().map(|i| i.bytes).sum();
    let tokens = m.train.tokens + m.val.tokens;
    println!(
        "{bytes} bytes, {tokens} tokens ({:?}, {:?}, {} shards) in {seconds:.3} s: {:.2} MB/s, {:.0} tokens/s",
        m.dtype,
        m.split_method,
        m.shards.len(),
        bytes as f64 / 1e6 / seconds,
        tokens as f64 / seconds
    );
    Ok(())
}
