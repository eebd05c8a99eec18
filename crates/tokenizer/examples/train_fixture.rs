//! Trains the small tokenizer committed as `tests/fixtures/ours_trained.tokenizer.json` (run by
//! `scripts/fixtures/tokenizer_fixtures.py --ours`, which then checks it with HF `tokenizers`).

use ember_tokenizer::{BpeTrainer, NoProgress};

/// The corpus slice and size the fixture uses; `tests/train.rs` retrains with the same settings.
const TRAIN_BYTES: usize = 200_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let corpus = std::fs::read_to_string(root.join("../../data/tinyshakespeare.txt"))?;
    let slice = &corpus[..TRAIN_BYTES];
    let trained = BpeTrainer::new(500)
        .special_tokens(["<|endoftext|>"])
        .train_texts(&[slice], &mut NoProgress)?;
    let out = root.join("tests/fixtures/ours_trained.tokenizer.json");
    std::fs::write(&out, trained.to_json_string())?;
    println!("wrote {} ({} merges)", out.display(), trained.num_merges());
    Ok(())
}
