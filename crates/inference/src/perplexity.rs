//! Perplexity of a token stream: how well a model predicts held-out text.

use burn::tensor::activation::log_softmax;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use ember_model::{EmberBackend, Transformer};

use crate::error::InferenceError;

/// The summed negative log-likelihood of the scored tokens of a text, and the model's own top prediction at
/// each of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    /// Tokens whose probability was scored.
    pub tokens: usize,
    /// Sum over scored tokens of `-ln p(token | preceding tokens of its window)`, in nats.
    pub nll_nats: f64,
    /// With `top1` asked for: the most likely next token at each scored position, in text order (what greedy
    /// decoding would pick there); empty otherwise.
    pub top1: Vec<u32>,
}

impl Perplexity {
    /// Mean loss per scored token, in nats.
    pub fn mean_nll(&self) -> f64 {
        self.nll_nats / self.tokens.max(1) as f64
    }

    /// `exp(mean loss)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }

    /// The fraction of scored positions where `self` and `other` (the same text scored by another model, e.g.
    /// quantized against f32) predict the same next token; `None` when they scored different positions.
    pub fn top1_agreement(&self, other: &Perplexity) -> Option<f64> {
        (self.top1.len() == other.top1.len() && !self.top1.is_empty()).then(|| {
            let same = self
                .top1
                .iter()
                .zip(&other.top1)
                .filter(|(a, b)| a == b)
                .count();
            same as f64 / self.top1.len() as f64
        })
    }

    /// Bits per byte of the text the scored tokens cover: comparable across tokenizers.
    pub fn bits_per_byte(&self, bytes: usize) -> f64 {
        self.nll_nats / std::f64::consts::LN_2 / bytes.max(1) as f64
    }
}

/// Scores `ids` with `model` over consecutive non-overlapping windows of `window` tokens (at most the model's
/// context), `batch` windows per forward pass. Within each window every token but the first is predicted from
/// the ones before it, so `ids.len() - windows` tokens are scored; a last window shorter than 2 tokens is
/// dropped. With `top1`, each scored position's most likely token is kept too ([`Perplexity::top1`]): an argmax
/// over the logits, done only when asked. `on_progress(done, total)` is called after each batch of windows.
pub fn perplexity<B: EmberBackend>(
    model: &Transformer<B>,
    ids: &[u32],
    window: usize,
    batch: usize,
    top1: bool,
    mut on_progress: impl FnMut(usize, usize),
) -> Result<Perplexity, InferenceError> {
    let context = model.spec().context_length;
    if window < 2 || window > context {
        return Err(InferenceError::InvalidWindow {
            window,
            context_length: context,
        });
    }
    model.check_tokens(ids)?;
    let device = model.device();
    let windows: Vec<&[u32]> = ids.chunks(window).filter(|w| w.len() >= 2).collect();
    let mut total = Perplexity {
        tokens: 0,
        nll_nats: 0.0,
        top1: Vec::new(),
    };
    let mut done = 0;
    // Full windows share a batch; a shorter last window runs on its own.
    for group in windows.chunk_by(|a, b| a.len() == b.len()) {
        for rows in group.chunks(batch.max(1)) {
            let len = rows[0].len();
            let data: Vec<i64> = rows
                .iter()
                .flat_map(|w| w.iter().map(|&id| i64::from(id)))
                .collect();
            let tokens =
                Tensor::<B, 2, Int>::from_data(TensorData::new(data, [rows.len(), len]), &device);
            let inputs = tokens.clone().narrow(1, 0, len - 1);
            let targets = tokens.narrow(1, 1, len - 1);
            let logits = model.forward(inputs)?;
            if top1 {
                let best = logits.clone().argmax(2).into_data().convert::<i64>();
                total.top1.extend(best.iter::<i64>().map(|id| id as u32));
            }
            let log_probs = log_softmax(logits, 2);
            let picked = log_probs.gather(2, targets.unsqueeze_dim::<3>(2));
            let nll: f64 = picked.sum().neg().into_scalar().elem();
            total.nll_nats += nll;
            total.tokens += rows.len() * (len - 1);
            done += rows.len();
            on_progress(done, windows.len());
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use ember_model::ModelSpec;

    use super::*;

    fn tiny() -> Transformer<Flex> {
        let spec = ModelSpec::llama_style(40, 16, 2, 4, 2, 32, 32);
        Transformer::init(&spec, 7, &Default::default()).unwrap()
    }

    /// The batched windowed sum equals scoring each window alone, token by token, from a full forward pass
    /// with a host-side log-softmax in f64 (tolerance: f32 logits, sums of ~100 terms, 1e-4 relative).
    #[test]
    fn equals_host_log_softmax_per_window() {
        let model = tiny();
        let ids: Vec<u32> = (0..77).map(|i| (i * 13 + 5) % 40).collect();
        let window = 16;
        let got = perplexity(&model, &ids, window, 3, false, |_, _| {}).unwrap();
        let mut expected = 0.0f64;
        let mut scored = 0;
        for w in ids.chunks(window).filter(|w| w.len() >= 2) {
            let data: Vec<i64> = w.iter().map(|&id| i64::from(id)).collect();
            let tokens = Tensor::<Flex, 2, Int>::from_data(
                TensorData::new(data, [1, w.len()]),
                &Default::default(),
            );
            let logits: Vec<f32> = model
                .forward(tokens)
                .unwrap()
                .into_data()
                .into_vec()
                .unwrap();
            for (t, row) in logits.chunks(40).enumerate().take(w.len() - 1) {
                let max = row.iter().fold(f64::MIN, |m, &x| m.max(f64::from(x)));
                let lse = max
                    + row
                        .iter()
                        .map(|&x| (f64::from(x) - max).exp())
                        .sum::<f64>()
                        .ln();
                expected += lse - f64::from(row[w[t + 1] as usize]);
                scored += 1;
            }
        }
        assert_eq!(got.tokens, scored);
        assert_eq!(
            scored,
            77 - 5,
            "5 windows, the first token of each unscored"
        );
        assert!(
            (got.nll_nats - expected).abs() <= 1e-4 * expected,
            "{} vs {expected}",
            got.nll_nats
        );
    }

    /// A random-weight model over a vocabulary of 40 sits near the uniform loss ln 40; bits per byte divide the
    /// summed nats by ln 2 and the byte count.
    #[test]
    fn derived_figures() {
        let p = Perplexity {
            tokens: 10,
            nll_nats: 10.0 * 40f64.ln(),
            top1: vec![1, 2, 3, 4],
        };
        let q = Perplexity {
            top1: vec![1, 2, 0, 4],
            ..p.clone()
        };
        assert_eq!(p.top1_agreement(&q), Some(0.75));
        assert_eq!(
            p.top1_agreement(&Perplexity {
                top1: vec![1],
                ..p.clone()
            }),
            None
        );
        assert!((p.perplexity() - 40.0).abs() < 1e-9);
        assert!((p.bits_per_byte(20) - 10.0 * 40f64.log2() / 20.0).abs() < 1e-12);
    }

    #[test]
    fn rejects_bad_window_and_ids() {
        let model = tiny();
        assert!(perplexity(&model, &[1, 2, 3], 1, 1, false, |_, _| {}).is_err());
        assert!(perplexity(&model, &[1, 2, 3], 33, 1, false, |_, _| {}).is_err());
        let err = perplexity(&model, &[1, 40], 2, 1, false, |_, _| {}).unwrap_err();
        assert!(err.to_string().contains("40"), "{err}");
    }
}
