//! [`TransformerLm`] over a small random LLaMA-style transformer: the KV-cached, left-padded path against full
//! recomputation without a cache.

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ember_inference::sampling::SamplingConfig;
use ember_inference::{GenerationConfig, LanguageModel, TransformerLm, generate};
use ember_model::weights::RandomInit;
use ember_model::{ModelSpec, Transformer};

fn tiny() -> TransformerLm<Flex> {
    let device = Default::default();
    // GQA (4 query heads, 2 KV heads); std 0.3 keeps logits far from uniform so argmax ties are unlikely.
    let spec = ModelSpec::llama_style(96, 32, 2, 4, 2, 64, 48);
    let model = Transformer::<Flex>::from_source(
        &spec,
        &mut RandomInit::with_std(3, spec.num_layers, 0.3),
        &device,
        None,
    )
    .unwrap();
    TransformerLm::new(model, device)
}

/// Last-position logits of `ids` computed from scratch, without a cache.
fn full_logits(lm: &TransformerLm<Flex>, ids: &[u32]) -> Vec<f32> {
    let data = TensorData::new(
        ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(),
        [1, ids.len()],
    );
    let tokens = Tensor::<Flex, 2, Int>::from_data(data, &Default::default());
    let logits = lm.model().forward(tokens).unwrap();
    let [_, seq, vocab] = logits.dims();
    logits
        .slice([0..1, seq - 1..seq, 0..vocab])
        .into_data()
        .into_vec()
        .unwrap()
}

/// f32 attention over a cache sums in a different order than over the full sequence; differences stay within a few
/// ulps of logits of magnitude ~10, so 1e-4 absolute is a tight bound with margin.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-4, "{what}: max |diff| {worst}");
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
