//! Logits processors: each rewrites one row of next-token logits `[vocab]` in place.
//!
//! A token is removed from consideration by setting its logit to `-inf`; processors that look at probabilities
//! (top-p, min-p) compute a softmax over the finite logits they see.

use std::collections::HashMap;

/// One step of the logits pipeline.
pub trait LogitsProcessor: Send + Sync + std::fmt::Debug {
    /// Rewrites `logits` (`[vocab]`) given `history`, the prompt and the tokens generated so far.
    fn process(&self, logits: &mut [f32], history: &[u32]);
}

/// Softmax of `logits` in f64 (`-inf` gets probability 0). All-`-inf` input yields all zeros.
pub fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![0.0; logits.len()];
    }
    let exps: Vec<f64> = logits
        .iter()
        .map(|&l| (f64::from(l) - f64::from(max)).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Indices of `logits` sorted by decreasing logit (ties by increasing index, so the order is deterministic).
fn sorted_desc(logits: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order
}

/// Divides every logit by a temperature `> 0`: below 1 sharpens the distribution, above 1 flattens it.
#[derive(Clone, Copy, Debug)]
pub struct Temperature(pub f32);

impl LogitsProcessor for Temperature {
    fn process(&self, logits: &mut [f32], _history: &[u32]) {
        logits.iter_mut().for_each(|l| *l /= self.0);
    }
}

/// Keeps the `k` highest logits (and any tied with the `k`-th), removing the rest.
#[derive(Clone, Copy, Debug)]
pub struct TopK(pub usize);

impl LogitsProcessor for TopK {
    fn process(&self, logits: &mut [f32], _history: &[u32]) {
        if self.0 == 0 || self.0 >= logits.len() {
            return;
        }
        let order = sorted_desc(logits);
        let threshold = logits[order[self.0 - 1]];
        logits
            .iter_mut()
            .filter(|l| **l < threshold)
            .for_each(|l| *l = f32::NEG_INFINITY);
    }
}

/// Nucleus sampling: keeps the most probable tokens whose cumulative probability first reaches `p` (at least
/// one token), removing the rest.
#[derive(Clone, Copy, Debug)]
pub struct TopP(pub f32);

impl LogitsProcessor for TopP {
    fn process(&self, logits: &mut [f32], _history: &[u32]) {
        if self.0 >= 1.0 {
            return;
        }
        let probs = softmax(logits);
        let mut cumulative = 0.0;
        for (rank, i) in sorted_desc(logits).into_iter().enumerate() {
            // A token is kept when the tokens ranked above it have not yet reached `p`.
            if rank > 0 && cumulative >= f64::from(self.0) {
                logits[i] = f32::NEG_INFINITY;
            }
            cumulative += probs[i];
        }
    }
}

/// Removes tokens whose probability is below `p` times the most likely token's probability.
#[derive(Clone, Copy, Debug)]
pub struct MinP(pub f32);

impl LogitsProcessor for MinP {
    fn process(&self, logits: &mut [f32], _history: &[u32]) {
        let probs = softmax(logits);
        let threshold = probs.iter().copied().fold(0.0, f64::max) * f64::from(self.0);
        for (l, p) in logits.iter_mut().zip(probs) {
            if p < threshold {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// The CTRL / Hugging Face repetition penalty: every token that occurs in the history has a positive logit divided
/// by the penalty and a negative one multiplied by it (so a penalty `> 1` always makes it less likely).
#[derive(Clone, Copy, Debug)]
pub struct RepetitionPenalty(pub f32);

impl LogitsProcessor for RepetitionPenalty {
    fn process(&self, logits: &mut [f32], history: &[u32]) {
        let mut seen = vec![false; logits.len()];
        for &t in history {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if std::mem::replace(&mut seen[t as usize], true) {
                continue;
            }
            *l = if *l < 0.0 { *l * self.0 } else { *l / self.0 };
        }
    }
}

/// The OpenAI-style additive penalties: `logit -= frequency * count + presence * (count > 0)`, where `count` is how
/// often the token occurs in the history.
#[derive(Clone, Copy, Debug)]
pub struct FrequencyPresencePenalty {
    /// Subtracted once per occurrence.
    pub frequency: f32,
    /// Subtracted once if the token occurs at all.
    pub presence: f32,
}

impl LogitsProcessor for FrequencyPresencePenalty {
    fn process(&self, logits: &mut [f32], history: &[u32]) {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in history {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= self.frequency * n as f32 + self.presence;
            }
        }
    }
}

/// Adds a fixed bias to chosen tokens' logits (`-inf` bans a token).
#[derive(Clone, Debug, Default)]
pub struct LogitBias(pub Vec<(u32, f32)>);

impl LogitsProcessor for LogitBias {
    fn process(&self, logits: &mut [f32], _history: &[u32]) {
        for &(t, bias) in &self.0 {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
    }
}
