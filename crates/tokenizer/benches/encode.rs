//! Single-thread encode throughput on Tiny Shakespeare (GPT-2 ranks when fetched, else the small trained
//! byte-level fixture), and the batch encoder over its paragraphs.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ember_tokenizer::Tokenizer;

fn tokenizer() -> Tokenizer {
    let root = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let gpt2 = root.join("../../.cache/assets/gpt2.tiktoken");
    let path = if gpt2.is_file() {
        gpt2
    } else {
        root.join("tests/fixtures/llama3_style.tokenizer.json")
    };
    Tokenizer::from_path(&path).expect("benchmark tokenizer loads")
}

fn bench(c: &mut Criterion) {
    let tok = tokenizer();
    let root = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let text = std::fs::read_to_string(root.join("../../data/tinyshakespeare.txt"))
        .expect("corpus present");
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(10);
    group.bench_function("tiny_shakespeare_single_thread", |b| {
        b.iter(|| tok.encode_ordinary(&text).unwrap())
    });
    let docs: Vec<&str> = text.split("\n\n").collect();
    group.bench_function("tiny_shakespeare_paragraphs_batch", |b| {
        b.iter(|| tok.encode_batch(&docs).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
