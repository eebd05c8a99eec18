//! [`GenerationWorkload`] over ember-inference's [`Decoder`]: the same incremental steps `ember generate`
//! runs (prefill over a fresh KV cache, then one token per row per step), with the same sampler.

use ember_inference::Decoder;
use ember_inference::sampling::{Sampler, SamplingConfig};

use crate::BenchError;
use crate::generation::GenerationWorkload;

/// Generation of `batch` copies of one prompt on a [`Decoder`], sampling with ember-inference's [`Sampler`].
///
/// Every row gets the same prompt, so the batch has no padding and every row does the same work; rows still
/// sample independently from their own logits.
pub struct LmWorkload<'m, M: Decoder> {
    model: &'m M,
    batch: usize,
    prompt: Vec<u32>,
    sampling: SamplingConfig,
    sampler: Sampler,
    state: Option<M::State>,
    /// Prompt and generated ids of every row, the history penalties read.
    histories: Vec<Vec<u32>>,
}

impl<'m, M: Decoder> LmWorkload<'m, M> {
    /// A workload generating up to `gen_len` tokens after `prompt` for `batch` rows. Errors when the prompt is
    /// empty or prompt plus generated tokens exceed the model's context window.
    pub fn new(
        model: &'m M,
        batch: usize,
        prompt: Vec<u32>,
        gen_len: usize,
        sampling: SamplingConfig,
    ) -> Result<Self, BenchError> {
        if prompt.is_empty() || batch == 0 {
            return Err(BenchError::InvalidSettings(
                "batch and prompt length must be at least 1".into(),
            ));
        }
        let needed = prompt.len() + gen_len;
        if needed > model.context_length() {
            return Err(BenchError::InvalidSettings(format!(
                "prompt-len {} + gen-len {gen_len} = {needed} positions exceed the model's context length {}",
                prompt.len(),
                model.context_length()
            )));
        }
        let sampler = Sampler::new(&sampling);
        Ok(Self {
            model,
            batch,
            prompt,
            sampling,
            sampler,
            state: None,
            histories: Vec::new(),
        })
    }

    /// Ids generated so far by each row of the current generation.
    pub fn generated(&self) -> Vec<&[u32]> {
        self.histories
            .iter()
            .map(|h| &h[self.prompt.len()..])
            .collect()
    }

    fn sample_rows(&mut self, logits: Vec<Vec<f32>>) -> Result<(), BenchError> {
        if logits.len() != self.batch {
            return Err(BenchError::Workload(format!(
                "model returned {} rows for a batch of {}",
                logits.len(),
                self.batch
            )));
        }
        for (row, history) in logits.iter().zip(&mut self.histories) {
            let next = self.sampler.sample(row, history);
            history.push(next);
        }
        Ok(())
    }
}

fn model_error(e: ember_inference::InferenceError) -> BenchError {
    BenchError::Workload(e.to_string())
}

impl<M: Decoder> GenerationWorkload for LmWorkload<'_, M> {
    fn prefill(&mut self) -> Result<(), BenchError> {
        // A fresh sampler per generation: every run samples the same sequence, so runs do the same work.
        self.sampler = Sampler::new(&self.sampling);
        let mut state = self.model.new_state(self.batch).map_err(model_error)?;
        let tokens = vec![self.prompt.clone(); self.batch];
        let padding = vec![vec![false; self.prompt.len()]; self.batch];
        let logits = self
            .model
            .step(&mut state, &tokens, &padding)
            .map_err(model_error)?;
        self.state = Some(state);
        self.histories = tokens;
        self.sample_rows(logits)
    }

    fn decode_step(&mut self) -> Result<(), BenchError> {
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| BenchError::Workload("decode step before prefill".into()))?;
        let tokens: Vec<Vec<u32>> = self
            .histories
            .iter()
            .map(|h| vec![h[h.len() - 1]])
            .collect();
        let padding = vec![vec![false]; self.batch];
        let logits = self
            .model
            .step(state, &tokens, &padding)
            .map_err(model_error)?;
        self.sample_rows(logits)
    }

    fn kv_cache_bytes(&self) -> Option<u64> {
        self.state
            .as_ref()
            .map(|state| self.model.cache_bytes(state) as u64)
    }
}

/// A deterministic synthetic prompt of `len` ids below `vocab_size`, spread over the vocabulary (a multiplicative
/// walk by a prime) so that embedding lookups touch many rows, as a real prompt would.
pub fn synthetic_prompt(len: usize, vocab_size: usize) -> Vec<u32> {
    let vocab = vocab_size.max(1) as u64;
    (0..len as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use ember_inference::InferenceError;

    use super::*;

    /// A model whose next-token logits peak at `last token + 1`, recording the shape of every call.
    struct Counter {
        vocab: usize,
        calls: RefCell<Vec<(usize, usize)>>,
    }

    impl Decoder for Counter {
        type State = usize;
        fn context_length(&self) -> usize {
            32
        }
        fn new_state(&self, _batch: usize) -> Result<usize, InferenceError> {
            Ok(0)
        }
        fn state_len(&self, state: &usize) -> usize {
            *state
        }
        fn step(
            &self,
            state: &mut usize,
            tokens: &[Vec<u32>],
            _: &[Vec<bool>],
        ) -> Result<Vec<Vec<f32>>, InferenceError> {
            self.calls
                .borrow_mut()
                .push((tokens.len(), tokens[0].len()));
            *state += tokens[0].len();
            Ok(tokens
                .iter()
                .map(|row| {
                    let mut logits = vec![0.0; self.vocab];
                    logits[(row[row.len() - 1] as usize + 1) % self.vocab] = 1.0;
                    logits
                })
                .collect())
        }
        fn retain_rows(&self, _: &mut usize, _: &[usize]) -> Result<(), InferenceError> {
            Ok(())
        }
    }

    #[test]
    fn prefill_runs_the_whole_prompt_then_each_step_feeds_back_one_token_per_row() {
        let model = Counter {
            vocab: 10,
            calls: RefCell::new(Vec::new()),
        };
        let mut w = LmWorkload::new(&model, 3, vec![4, 5, 6], 4, SamplingConfig::greedy()).unwrap();
        w.prefill().unwrap();
        for _ in 0..3 {
            w.decode_step().unwrap();
        }
        assert_eq!(*model.calls.borrow(), vec![(3, 3), (3, 1), (3, 1), (3, 1)]);
        // Greedy on "last + 1" logits counts up from the prompt's last id.
        assert_eq!(w.generated(), vec![&[7, 8, 9, 0][..]; 3]);
        // A second generation starts from a fresh cache and the same prompt.
        w.prefill().unwrap();
        assert_eq!(w.generated(), vec![&[7][..]; 3]);
    }

    #[test]
    fn workloads_longer_than_the_context_are_refused() {
        let model = Counter {
            vocab: 10,
            calls: RefCell::new(Vec::new()),
        };
        let err = LmWorkload::new(&model, 1, vec![1; 30], 3, SamplingConfig::greedy())
            .err()
            .unwrap();
        assert!(err.to_string().contains("context length 32"), "{err}");
    }

    #[test]
    fn synthetic_prompts_stay_inside_the_vocabulary() {
        let p = synthetic_prompt(500, 49);
        assert_eq!(p.len(), 500);
        assert!(p.iter().all(|&id| id < 49));
        // 7919 is prime and coprime to 49, so 49 consecutive positions visit all 49 ids.
        let distinct: std::collections::BTreeSet<_> = p[..49].iter().collect();
        assert_eq!(distinct.len(), 49);
    }
}
