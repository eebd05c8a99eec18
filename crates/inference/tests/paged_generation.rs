//! Generation over the paged KV pool: each row stores only its own tokens, rows leave the pool as they finish,
//! and every logit and token equals the contiguous, left-padded path and full recomputation.

mod common;

use burn::backend::Flex;
use common::{assert_close, full_logits, tiny};
use ember_inference::sampling::SamplingConfig;
use ember_inference::{
    Decoder, GenerationConfig, InferenceError, KvCacheKind, TransformerLm, generate,
};

/// 2 layers, 2 KV heads of 8 dimensions: one cached position is 2 x 2 x (8 + 8) f32 = 256 bytes.
const TOKEN_BYTES: usize = 256;

fn paged(block_size: usize) -> KvCacheKind {
    KvCacheKind::Paged {
        block_size,
        budget_bytes: None,
    }
}

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap() as u32
}

#[test]
fn paged_steps_match_full_recomputation_through_padding_and_dropped_rows() {
    // Blocks of 4 positions, so rows cross block boundaries at different steps.
    let lm = tiny(paged(4));
    let mut rows = vec![vec![1u32, 2, 3, 4, 5, 6, 7], vec![9], vec![30, 31, 32]];
    let mut state = lm.new_state(3).unwrap();
    let width = 7;
    let tokens: Vec<Vec<u32>> = rows
        .iter()
        .map(|r| [vec![0; width - r.len()], r.clone()].concat())
        .collect();
    let padding: Vec<Vec<bool>> = rows
        .iter()
        .map(|r| (0..width).map(|i| i < width - r.len()).collect())
        .collect();
    let mut logits = lm.step(&mut state, &tokens, &padding).unwrap();
    for step in 0..6 {
        for (row, ids) in rows.iter().enumerate() {
            assert_close(
                &logits[row],
                &full_logits(&lm, ids),
                &format!("step {step}, row {row}"),
            );
        }
        if step == 2 {
            // The middle row finishes: the batch continues with rows 0 and 2 only.
            lm.retain_rows(&mut state, &[0, 2]).unwrap();
            rows.remove(1);
            logits.remove(1);
        }
        let next: Vec<Vec<u32>> = logits.iter().map(|l| vec![argmax(l)]).collect();
        for (ids, token) in rows.iter_mut().zip(&next) {
            ids.push(token[0]);
        }
        logits = lm
            .step(&mut state, &next, &vec![vec![false]; next.len()])
            .unwrap();
    }
    assert_eq!(lm.state_len(&state), 7 + 6, "the longest row's positions");
}

#[test]
fn paged_generation_equals_contiguous_and_each_prompt_alone() {
    let contiguous = tiny(KvCacheKind::Contiguous);
    let paged = tiny(paged(4));
    let prompts = vec![
        vec![1u32, 2, 3, 4, 5, 6],
        vec![9],
        vec![30, 31, 32],
        vec![77; 11],
    ];
    let mut config = GenerationConfig {
        max_new_tokens: 8,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    // Make row 1 stop early on its own EOS, so the others continue after it has left the batch.
    let first = generate(&contiguous, None, &prompts, &config, &mut |_, _| {}).unwrap();
    config.eos = vec![first[1].ids[2]];
    let want = generate(&contiguous, None, &prompts, &config, &mut |_, _| {}).unwrap();
    let got = generate(&paged, None, &prompts, &config, &mut |_, _| {}).unwrap();
    assert!(
        want.iter().any(|g| g.ids.len() == 8) && want[1].ids.len() <= 3,
        "rows finish at different steps: {:?}",
        want.iter().map(|g| g.ids.len()).collect::<Vec<_>>()
    );
    for (row, prompt) in prompts.iter().enumerate() {
        assert_eq!(
            got[row].ids, want[row].ids,
            "row {row}: paged vs contiguous"
        );
        assert_eq!(got[row].finish_reason, want[row].finish_reason, "row {row}");
        let alone = generate(
            &paged,
            None,
            std::slice::from_ref(prompt),
            &config,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(got[row].ids, alone[0].ids, "row {row}: batch vs alone");
    }
}

#[test]
fn paged_memory_follows_the_tokens_held_not_the_padded_batch() {
    // One long prompt and three short ones, 4 new tokens each.
    let prompts = vec![vec![5u32; 40], vec![6; 3], vec![7; 3], vec![8; 3]];
    let config = GenerationConfig {
        max_new_tokens: 4,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let run = |lm: &TransformerLm<Flex>| {
        let out = generate(lm, None, &prompts, &config, &mut |_, _| {}).unwrap();
        out[0].kv_cache_bytes
    };
    // Contiguous: 4 rows padded to 40 positions, doubled to 80 by the first decode step.
    assert_eq!(run(&tiny(KvCacheKind::Contiguous)), 4 * 80 * TOKEN_BYTES);
    // Paged, 16-position blocks: the prefill stores 40 + 3 + 3 + 3 tokens in 3 + 1 + 1 + 1 blocks (the storage
    // grows 1 -> 3 -> 6 blocks as rows arrive), and the 3 decode steps fit in the blocks already held.
    assert_eq!(run(&tiny(KvCacheKind::paged())), 6 * 16 * TOKEN_BYTES);
}

#[test]
fn a_batch_beyond_the_paged_budget_is_a_clear_error() {
    // Two 16-position blocks; the 40-token prompt alone needs three.
    let lm = tiny(KvCacheKind::paged().with_budget_bytes(2 * 16 * TOKEN_BYTES));
    let config = GenerationConfig {
        max_new_tokens: 2,
        ..GenerationConfig::default()
    };
    let err = generate(&lm, None, &[vec![5u32; 40]], &config, &mut |_, _| {}).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("KV-cache pool exhausted") && message.contains("raise the budget"),
        "{message}"
    );
    assert!(matches!(err, InferenceError::KvCache(_)), "{err:?}");
}

#[test]
fn kv_cache_kinds_parse_and_print_their_cli_names() {
    for name in ["contiguous", "paged", "paged-32"] {
        let kind: KvCacheKind = name.parse().unwrap();
        assert_eq!(kind.to_string(), name);
    }
    assert_eq!(
        "paged-8".parse::<KvCacheKind>().unwrap(),
        KvCacheKind::Paged {
            block_size: 8,
            budget_bytes: None
        }
    );
    for bad in ["page", "paged-0", "paged-x", ""] {
        let err = bad.parse::<KvCacheKind>().unwrap_err();
        assert!(
            err.contains("expected contiguous, paged or paged-N"),
            "{err}"
        );
    }
}
