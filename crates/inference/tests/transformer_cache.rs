//! [`TransformerLm`] over a small random LLaMA-style transformer: the KV-cached, left-padded path against full
//! recomputation without a cache.

mod common;

use common::{assert_close, full_logits};
use ember_inference::sampling::SamplingConfig;
use ember_inference::{Decoder, GenerationConfig, KvCacheKind, TransformerLm, generate};

fn tiny() -> TransformerLm<burn::backend::Flex> {
    common::tiny(KvCacheKind::Contiguous)
}

#[test]
fn cached_decoding_matches_full_recomputation() {
    let lm = tiny();
    let mut ids = vec![5u32, 17, 3, 88, 40];
    let mut state = lm.new_state(1).unwrap();
    let mut logits = lm
        .step(&mut state, &[ids.clone()], &[vec![false; ids.len()]])
        .unwrap()
        .remove(0);
    for step in 0..8 {
        assert_close(&logits, &full_logits(&lm, &ids), &format!("step {step}"));
        let next = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap() as u32;
        ids.push(next);
        logits = lm
            .step(&mut state, &[vec![next]], &[vec![false]])
            .unwrap()
            .remove(0);
    }
    assert_eq!(lm.state_len(&state), ids.len());
}

#[test]
fn left_padded_rows_match_each_prompt_run_alone() {
    let lm = tiny();
    let prompts = vec![vec![1u32, 2, 3, 4, 5, 6], vec![9], vec![30, 31, 32]];
    let config = GenerationConfig {
        max_new_tokens: 6,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let batch = generate(&lm, None, &prompts, &config, &mut |_, _| {}).unwrap();
    for (row, prompt) in prompts.iter().enumerate() {
        let alone = generate(
            &lm,
            None,
            std::slice::from_ref(prompt),
            &config,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(batch[row].ids, alone[0].ids, "row {row}");
    }
    // And the padded prefill's logits equal the unpadded ones (positions restart at each row's first real token).
    let mut state = lm.new_state(2).unwrap();
    let tokens = vec![vec![0, 0, 0, 0, 0, 9], vec![1, 2, 3, 4, 5, 6]];
    let padding = vec![vec![true, true, true, true, true, false], vec![false; 6]];
    let logits = lm.step(&mut state, &tokens, &padding).unwrap();
    assert_close(&logits[0], &full_logits(&lm, &[9]), "padded row");
    assert_close(
        &logits[1],
        &full_logits(&lm, &[1, 2, 3, 4, 5, 6]),
        "unpadded row",
    );
}
