//! The generation loop against a toy model whose logits are a known function of the unpadded history, so any
//! leak of padding, misplaced token or lost cache entry changes the output.

use ember_inference::sampling::SamplingConfig;
use ember_inference::{
    Conversation, Decoder, FinishReason, GenerationConfig, InferenceError, generate,
};
use ember_tokenizer::{GgufVocab, Tokenizer, byte_level};

/// Vocabulary of 256 byte tokens (as the byte-level tokenizer below spells them).
const VOCAB: usize = 256;

/// Logits depend on the last two real tokens and the number of real tokens: a different cache content or a
/// padding token treated as real changes them.
struct Toy {
    context: usize,
}

/// Per row: the real (unpadded) tokens; and the number of positions including padding.
struct ToyState {
    rows: Vec<Vec<u32>>,
    positions: usize,
}

impl Toy {
    fn logits(history: &[u32]) -> Vec<f32> {
        let last = history.last().copied().unwrap_or(0) as f32;
        let prev = history
            .len()
            .checked_sub(2)
            .map_or(0.0, |i| history[i] as f32);
        let n = history.len() as f32;
        (0..VOCAB)
            .map(|t| 4.0 * (0.37 * t as f32 + 0.71 * last + 0.29 * prev + 0.13 * n).sin())
            .collect()
    }
}

impl Decoder for Toy {
    type State = ToyState;

    fn context_length(&self) -> usize {
        self.context
    }

    fn new_state(&self, batch: usize) -> Result<ToyState, InferenceError> {
        Ok(ToyState {
            rows: vec![Vec::new(); batch],
            positions: 0,
        })
    }

    fn state_len(&self, state: &ToyState) -> usize {
        state.positions
    }

    fn step(
        &self,
        state: &mut ToyState,
        tokens: &[Vec<u32>],
        padding: &[Vec<bool>],
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        assert!(
            tokens.iter().all(|t| t.len() == tokens[0].len()),
            "rows of a step have equal length"
        );
        state.positions += tokens[0].len();
        assert!(
            state.positions <= self.context,
            "the loop never overfills the context"
        );
        for ((row, toks), pad) in state.rows.iter_mut().zip(tokens).zip(padding) {
            row.extend(toks.iter().zip(pad).filter(|(_, p)| !**p).map(|(t, _)| *t));
        }
        Ok(state.rows.iter().map(|r| Toy::logits(r)).collect())
    }

    fn retain_rows(&self, state: &mut ToyState, rows: &[usize]) -> Result<(), InferenceError> {
        state.rows = rows.iter().map(|&r| state.rows[r].clone()).collect();
        Ok(())
    }
}

/// A byte-level tokenizer with one token per byte and no merges: token id = byte value.
fn byte_tokenizer() -> Tokenizer {
    let vocab = GgufVocab {
        model: "gpt2".to_string(),
        tokens: (0..=255u8)
            .map(|b| byte_level::byte_to_char(b).to_string())
            .collect(),
        ..GgufVocab::default()
    };
    Tokenizer::from_gguf_vocab(vocab).unwrap()
}

fn sampled(seed: u64, max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig {
            temperature: 0.9,
            top_k: Some(40),
            seed,
            ..SamplingConfig::default()
        },
        ..GenerationConfig::default()
    }
}

#[test]
fn each_batched_row_equals_generating_its_prompt_alone() {
    let model = Toy { context: 64 };
    let prompts = vec![vec![5, 9, 200, 3, 17], vec![42], vec![7, 7, 7]];
    let config = GenerationConfig {
        eos: vec![13],
        ..sampled(11, 12)
    };
    let batch = generate(&model, None, &prompts, &config, &mut |_, _| {}).unwrap();
    for (row, prompt) in prompts.iter().enumerate() {
        // Row `b` of a batch samples with seed `seed + b`.
        let alone_config = GenerationConfig {
            sampling: SamplingConfig {
                seed: 11 + row as u64,
                ..config.sampling.clone()
            },
            ..config.clone()
        };
        let alone = generate(
            &model,
            None,
            std::slice::from_ref(prompt),
            &alone_config,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(batch[row].ids, alone[0].ids, "row {row}");
        assert_eq!(
            batch[row].finish_reason, alone[0].finish_reason,
            "row {row}"
        );
        assert_eq!(batch[row].prompt_ids, *prompt);
    }
}

#[test]
fn greedy_follows_the_argmax_of_the_model() {
    let model = Toy { context: 64 };
    let config = GenerationConfig {
        max_new_tokens: 6,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let out = generate(&model, None, &[vec![1, 2, 3]], &config, &mut |_, _| {}).unwrap();
    let mut history = vec![1, 2, 3];
    for &id in &out[0].ids {
        let logits = Toy::logits(&history);
        let best = (0..VOCAB)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap();
        assert_eq!(id as usize, best);
        history.push(id);
    }
    assert_eq!(out[0].ids.len(), 6);
    assert_eq!(out[0].finish_reason, FinishReason::Length);
}

#[test]
fn rows_finish_independently_at_eos() {
    let model = Toy { context: 64 };
    let greedy = GenerationConfig {
        max_new_tokens: 8,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let free = generate(
        &model,
        None,
        &[vec![1, 2, 3], vec![9]],
        &greedy,
        &mut |_, _| {},
    )
    .unwrap();
    // Make a token only row 0 produces (first at index k >= 1) the EOS: row 0 stops there, row 1 is unaffected.
    let k = (1..free[0].ids.len())
        .find(|&k| {
            !free[1].ids.contains(&free[0].ids[k]) && !free[0].ids[..k].contains(&free[0].ids[k])
        })
        .expect("row 0 produces a token row 1 does not");
    let eos = free[0].ids[k];
    let config = GenerationConfig {
        eos: vec![eos],
        ..greedy
    };
    let out = generate(
        &model,
        None,
        &[vec![1, 2, 3], vec![9]],
        &config,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(out[0].ids, free[0].ids[..=k]);
    assert_eq!(out[0].finish_reason, FinishReason::Eos);
    assert_eq!(out[1].ids, free[1].ids);
    assert_eq!(out[1].finish_reason, FinishReason::Length);
}

#[test]
fn stop_strings_cut_text_and_streaming_sees_the_same_text() {
    let model = Toy { context: 128 };
    let tok = byte_tokenizer();
    // Banning bytes >= 128 keeps the text ASCII, so any two adjacent tokens form a valid stop string.
    let ascii_only = (128..256).map(|t| (t, f32::NEG_INFINITY)).collect();
    let sampling = SamplingConfig {
        logit_bias: ascii_only,
        ..SamplingConfig::greedy()
    };
    let base = GenerationConfig {
        max_new_tokens: 40,
        sampling,
        ..GenerationConfig::default()
    };
    let free = generate(&model, Some(&tok), &[vec![65, 66]], &base, &mut |_, _| {})
        .unwrap()
        .remove(0);
    assert_eq!(
        free.text,
        String::from_utf8_lossy(&free.ids.iter().map(|&i| i as u8).collect::<Vec<_>>())
    );
    // A stop string made of generated tokens 5 and 6 spans a token boundary.
    let stop_bytes: Vec<u8> = free.ids[5..7].iter().map(|&i| i as u8).collect();
    let stop = String::from_utf8(stop_bytes).unwrap();
    let first = free.text.find(&stop).unwrap();
    let config = GenerationConfig {
        stop: vec![stop.clone()],
        ..base
    };
    let mut streamed = String::new();
    let out = generate(
        &model,
        Some(&tok),
        &[vec![65, 66]],
        &config,
        &mut |_, piece| streamed.push_str(piece),
    )
    .unwrap()
    .remove(0);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.text, free.text[..first]);
    assert_eq!(
        streamed, out.text,
        "streamed pieces add up to the final text"
    );
}

#[test]
fn too_long_prompt_is_an_error_unless_truncated() {
    let model = Toy { context: 8 };
    let prompt: Vec<u32> = (1..=10).collect();
    let config = GenerationConfig {
        max_new_tokens: 3,
        ..sampled(0, 3)
    };
    let err = generate(
        &model,
        None,
        std::slice::from_ref(&prompt),
        &config,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            InferenceError::PromptTooLong {
                prompt_len: 10,
                context_length: 8,
                ..
            }
        ),
        "{err}"
    );
    let config = GenerationConfig {
        truncate: true,
        ..config
    };
    let out = generate(&model, None, &[prompt], &config, &mut |_, _| {}).unwrap();
    assert_eq!(
        out[0].prompt_ids,
        [6, 7, 8, 9, 10],
        "the oldest tokens go, leaving room for 3 new ones"
    );
    assert_eq!(out[0].ids.len(), 3);
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let model = Toy { context: 6 };
    let config = GenerationConfig {
        max_new_tokens: 100,
        ..sampled(0, 100)
    };
    let out = generate(&model, None, &[vec![1, 2, 3, 4]], &config, &mut |_, _| {}).unwrap();
    // 4 prompt positions + 2 generated tokens run through the model fill 6; one more is sampled from the last logits.
    assert_eq!(out[0].ids.len(), 3);
    assert_eq!(out[0].finish_reason, FinishReason::Length);
}

#[test]
fn conversation_turns_reuse_the_cache_and_match_one_shot_generation() {
    let model = Toy { context: 64 };
    let config = GenerationConfig {
        max_new_tokens: 5,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let mut chat = Conversation::new(&model, &config.sampling).unwrap();
    let first = chat
        .turn(&model, &[10, 11], None, &config, &mut |_| {})
        .unwrap();
    let second = chat
        .turn(&model, &[12], None, &config, &mut |_| {})
        .unwrap();
    // One shot over the whole transcript: turn 1, reply 1, turn 2.
    let transcript: Vec<u32> = [vec![10, 11], first.ids.clone(), vec![12]].concat();
    let one_shot = generate(
        &model,
        None,
        std::slice::from_ref(&transcript),
        &config,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(second.ids, one_shot[0].ids);
    assert_eq!(chat.history(), [transcript, second.ids.clone()].concat());
}

/// A library caller (no command line in front) gets a typed error, not NaN logits and ids 0, 0, 0, ...
#[test]
fn out_of_range_sampling_is_refused_before_anything_runs() {
    let model = Toy { context: 64 };
    let config = GenerationConfig {
        max_new_tokens: 4,
        sampling: SamplingConfig {
            repetition_penalty: Some(f32::NAN),
            ..SamplingConfig::greedy()
        },
        ..GenerationConfig::default()
    };
    let err = generate(&model, None, &[vec![1, 2, 3]], &config, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(&err, InferenceError::InvalidSampling(e) if e.setting == "repetition_penalty"),
        "{err}"
    );
    let top_p = SamplingConfig {
        top_p: Some(0.0),
        ..SamplingConfig::default()
    };
    assert!(matches!(
        Conversation::new(&model, &top_p),
        Err(InferenceError::InvalidSampling(_))
    ));
}
