//! Measurements for scripts/bench_tokenizer.py, printed as one JSON object:
//!
//! `bench_tokenizer encode TOKENIZER CORPUS REPEAT ROUNDS`: single-thread encode throughput of CORPUS repeated
//! REPEAT times (best of ROUNDS), plus the token count and an FNV-1a hash of the ids;
//! `bench_tokenizer train CORPUS VOCAB_SIZE OUT_DIR`: training time and bytes per token of the result.

use std::time::Instant;

use ember_tokenizer::{BpeTrainer, NoProgress, Tokenizer};

fn fnv1a64(ids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("encode") if args.len() == 6 => {
            let tok = Tokenizer::from_path(&args[2])?;
            let text = std::fs::read_to_string(&args[3])?.repeat(args[4].parse()?);
            let rounds: usize = args[5].parse()?;
            let mut best = f64::INFINITY;
            let mut ids = Vec::new();
            for _ in 0..rounds {
                let start = Instant::now();
                ids = tok.encode_ordinary(&text)?;
                best = best.min(start.elapsed().as_secs_f64());
            }
            println!(
                "{{\"bytes\": {}, \"seconds\": {best}, \"mb_per_s\": {}, \"tokens\": {}, \"fnv1a64\": \"{}\"}}",
                text.len(),
                text.len() as f64 / best / 1e6,
                ids.len(),
                fnv1a64(&ids)
            );
        }
        Some("train") if args.len() == 5 => {
            let text = std::fs::read_to_string(&args[2])?;
            let start = Instant::now();
            let trained = BpeTrainer::new(args[3].parse()?)
                .special_tokens(["<|endoftext|>"])
                .train_texts(&[&text], &mut NoProgress)?;
            let seconds = start.elapsed().as_secs_f64();
            trained.save(std::path::Path::new(&args[4]))?;
            let ids = trained.tokenizer()?.encode_ordinary(&text)?;
            println!(
                "{{\"seconds\": {seconds}, \"merges\": {}, \"bytes_per_token\": {}}}",
                trained.num_merges(),
                text.len() as f64 / ids.len() as f64
            );
        }
        _ => {
            eprintln!(
                "usage: bench_tokenizer encode TOKENIZER CORPUS REPEAT ROUNDS | train CORPUS VOCAB_SIZE OUT_DIR"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}
