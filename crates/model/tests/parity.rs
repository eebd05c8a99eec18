//! Parity with Hugging Face transformers: for every supported architecture, a tiny random-weight model saved by
//! `save_pretrained` (scripts/fixtures/model_fixtures.py) must give transformers' logits with every attention
//! kernel, and the same greedy continuation when decoding token by token through the KV cache.

mod common;

use common::{B, FIXTURES, expected, fixture, max_abs_diff, tokens};
use ember_attention::{AttentionKernel, ContiguousKvCache};
use ember_model::{Step, Transformer, load};

/// fp32 on both sides with the same stored weights; only the summation order differs (blocked matmuls, the
/// flash kernel's online softmax). Logits are O(1-10), so a rounding-order error is ~1e-6; 1e-4 leaves room for
/// accumulation over two layers while any real mistake (a wrong mask entry, a swapped rotation half) is >1e-2.
const LOGIT_TOLERANCE: f32 = 1e-4;

fn load_fixture(name: &str) -> Transformer<B> {
    let loaded = load::<B>(&fixture(name), &Default::default(), None)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        loaded.unused.is_empty(),
        "{name}: unused tensors {:?}",
        loaded.unused
    );
    loaded.model
}

#[test]
fn logits_match_transformers_for_every_architecture_and_kernel() {
    let mut failures = Vec::new();
    for name in FIXTURES {
        let exp = expected(name);
        let model = load_fixture(name);
        for kernel in AttentionKernel::ALL {
            let model = model.clone().with_kernel(kernel);
            let logits = model.forward(tokens(&exp.tokens)).unwrap();
            assert_eq!(
                logits.dims(),
                [1, exp.tokens.len(), model.spec().vocab_size],
                "{name}"
            );
            let got = logits.into_data().into_vec::<f32>().unwrap();
            let diff = max_abs_diff(&got, &exp.logits);
            if diff > LOGIT_TOLERANCE {
                failures.push(format!(
                    "{name} with {kernel}: max |ember - transformers| = {diff}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn greedy_decoding_with_the_kv_cache_matches_transformers_generate() {
    for name in FIXTURES {
        let exp = expected(name);
        // Exact token equality is meaningful only if no step was a near tie: the script records the smallest
        // top-1/top-2 margin, which must dwarf the logit tolerance.
        assert!(
            exp.greedy_min_gap > 10.0 * LOGIT_TOLERANCE,
            "{name}: fixture has a near tie"
        );
        for kernel in AttentionKernel::ALL {
            let model = load_fixture(name).with_kernel(kernel);
            let generated = common::greedy(&model, &exp.tokens, exp.greedy.len());
            assert_eq!(generated, exp.greedy, "{name} with {kernel}");
        }
    }
}

#[test]
fn cached_prefill_in_chunks_gives_the_same_logits_as_one_pass() {
    // Windows (8 and 6) are shorter than the chunks' offsets, so this checks the cache offset feeds the
    // sliding-window masks and RoPE positions correctly (Gemma 3: the local and global RoPE tables too).
    for name in ["mistral", "gpt_neo", "qwen2", "gemma2", "gemma3"] {
        let exp = expected(name);
        let model = load_fixture(name);
        let vocab = model.spec().vocab_size;
        let mut cache = ContiguousKvCache::<B>::new(model.spec().num_layers);
        let mut got = Vec::new();
        for chunk in exp.tokens.chunks(7) {
            let step = Step {
                cache: Some(&mut cache),
                ..Step::default()
            };
            let logits = model.forward_with(tokens(chunk), step).unwrap();
            got.extend(logits.into_data().into_vec::<f32>().unwrap());
        }
        assert_eq!(got.len(), exp.tokens.len() * vocab);
        let diff = max_abs_diff(&got, &exp.logits);
        assert!(
            diff <= LOGIT_TOLERANCE,
            "{name}: chunked prefill differs by {diff}"
        );
    }
}
