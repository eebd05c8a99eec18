//! Choosing the next token: a pipeline of [`LogitsProcessor`]s followed by greedy or seeded random choice.

mod processors;
pub mod ranges;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use processors::{
    FrequencyPresencePenalty, LogitBias, LogitsProcessor, MinP, RepetitionPenalty, Temperature,
    TopK, TopP, softmax,
};
pub use ranges::SamplingError;

/// The sampling settings of one generation, as the command line exposes them.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingConfig {
    /// `0` picks the most likely token (greedy); otherwise logits are divided by it before sampling.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`.
    pub top_p: Option<f32>,
    /// Drop tokens less likely than `p` times the most likely one.
    pub min_p: Option<f32>,
    /// Hugging Face repetition penalty (`1` is none).
    pub repetition_penalty: Option<f32>,
    /// Subtracted from a token's logit per earlier occurrence.
    pub frequency_penalty: Option<f32>,
    /// Subtracted from a token's logit if it occurred before.
    pub presence_penalty: Option<f32>,
    /// Added to the logits of chosen tokens.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the random generator: the same seed, model and prompt reproduce the same tokens.
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            frequency_penalty: None,
            presence_penalty: None,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingConfig {
    /// Greedy decoding: always the most likely token (after penalties and bias).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every setting against its range ([`ranges`]): the first one outside it is the error. A config
    /// that passes cannot put NaN into the logits.
    pub fn validate(&self) -> Result<(), SamplingError> {
        ranges::check_temperature(self.temperature)?;
        if let Some(k) = self.top_k {
            ranges::check_top_k(k)?;
        }
        if let Some(p) = self.top_p {
            ranges::check_top_p(p)?;
        }
        if let Some(p) = self.min_p {
            ranges::check_min_p(p)?;
        }
        if let Some(p) = self.repetition_penalty {
            ranges::check_repetition_penalty(p)?;
        }
        if let Some(p) = self.frequency_penalty {
            ranges::check_additive_penalty("frequency_penalty", p)?;
        }
        if let Some(p) = self.presence_penalty {
            ranges::check_additive_penalty("presence_penalty", p)?;
        }
        for (i, &(_, bias)) in self.logit_bias.iter().enumerate() {
            ranges::check_logit_bias(i, bias)?;
        }
        Ok(())
    }

    /// The processors this config implies, in the order Hugging Face applies them: penalties and bias first (they
    /// edit raw logits), then temperature, top-k, top-p and min-p (they shape the distribution sampled from).
    /// Greedy decoding skips the shaping steps, which cannot change the argmax.
    pub fn processors(&self) -> Vec<Box<dyn LogitsProcessor>> {
        let mut out: Vec<Box<dyn LogitsProcessor>> = Vec::new();
        if let Some(p) = self.repetition_penalty.filter(|&p| p != 1.0) {
            out.push(Box::new(RepetitionPenalty(p)));
        }
        let (frequency, presence) = (
            self.frequency_penalty.unwrap_or(0.0),
            self.presence_penalty.unwrap_or(0.0),
        );
        if frequency != 0.0 || presence != 0.0 {
            out.push(Box::new(FrequencyPresencePenalty {
                frequency,
                presence,
            }));
        }
        if !self.logit_bias.is_empty() {
            out.push(Box::new(LogitBias(self.logit_bias.clone())));
        }
        if self.temperature > 0.0 {
            if self.temperature != 1.0 {
                out.push(Box::new(Temperature(self.temperature)));
            }
            if let Some(k) = self.top_k {
                out.push(Box::new(TopK(k)));
            }
            if let Some(p) = self.top_p {
                out.push(Box::new(TopP(p)));
            }
            if let Some(p) = self.min_p {
                out.push(Box::new(MinP(p)));
            }
        }
        out
    }
}

/// Picks next tokens: runs the processors, then takes the argmax (greedy) or samples from the softmax with a
/// seeded ChaCha8 generator.
#[derive(Debug)]
pub struct Sampler {
    processors: Vec<Box<dyn LogitsProcessor>>,
    greedy: bool,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler for `config`, which is checked first ([`SamplingConfig::validate`]).
    pub fn try_new(config: &SamplingConfig) -> Result<Self, SamplingError> {
        config.validate()?;
        Ok(Self::new(config))
    }

    /// A sampler for `config` as given, unchecked: for configs built in code from constants (benchmarks,
    /// tests). Anything from a user goes through [`Sampler::try_new`]; an out-of-range value here (a NaN
    /// penalty, say) yields NaN logits and token 0 every step.
    pub fn new(config: &SamplingConfig) -> Self {
        Self::from_processors(config.processors(), config.temperature <= 0.0, config.seed)
    }

    /// A sampler running `processors` in order, then choosing greedily or at random from `seed`.
    pub fn from_processors(
        processors: Vec<Box<dyn LogitsProcessor>>,
        greedy: bool,
        seed: u64,
    ) -> Self {
        Self {
            processors,
            greedy,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Applies the processors to `logits` (`[vocab]`) in place.
    pub fn process(&self, logits: &mut [f32], history: &[u32]) {
        for p in &self.processors {
            p.process(logits, history);
        }
    }

    /// The distribution the next token is drawn from (a one-hot vector when greedy), `[vocab]`.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Vec<f64> {
        let mut logits = logits.to_vec();
        self.process(&mut logits, history);
        if self.greedy {
            let mut one_hot = vec![0.0; logits.len()];
            if let Some(i) = argmax(&logits) {
                one_hot[i] = 1.0;
            }
            return one_hot;
        }
        softmax(&logits)
    }

    /// Chooses the next token from `logits` (`[vocab]`, not modified) given `history` (prompt and generated ids).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.greedy {
            // The argmax of the processed logits, without the one-hot distribution: a server samples every
            // row of every step, and copying the logits and building a vocabulary-sized f64 vector had been
            // 7% of a batched SmolLM2 step.
            let best = if self.processors.is_empty() {
                argmax(logits)
            } else {
                let mut logits = logits.to_vec();
                self.process(&mut logits, history);
                argmax(&logits)
            };
            return best.unwrap_or(0) as u32;
        }
        let probs = self.distribution(logits, history);
        let u: f64 = self.rng.random();
        let mut cumulative = 0.0;
        let mut last_possible = 0;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                cumulative += p;
                last_possible = i;
                if u < cumulative {
                    return i as u32;
                }
            }
        }
        // Rounding can leave the cumulative sum a hair below u; the last token with mass is then the right pick.
        last_possible as u32
    }
}

/// Index of the largest logit (the first on ties), or `None` for an empty slice.
pub fn argmax(logits: &[f32]) -> Option<usize> {
    // The maximum in independent lanes (which the compiler vectorises), then the first index holding it: a
    // server takes the argmax of every row of every greedy step over a vocabulary-sized row, and the one-pass
    // fold below, a compare and branch per logit, had been 3% of a batch-8 SmolLM2 step, serial.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut nan = false;
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &l) in lanes.iter_mut().zip(chunk) {
            nan |= l.is_nan();
            *lane = if l > *lane { l } else { *lane };
        }
    }
    for &l in tail {
        nan |= l.is_nan();
        lanes[0] = if l > lanes[0] { l } else { lanes[0] };
    }
    if nan {
        return argmax_fold(logits);
    }
    let max = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    logits.iter().position(|&l| l == max)
}

/// [`argmax`] in one pass, for logits with NaNs: a NaN takes the lead and the next logit takes it back, the
/// order the sampler's callers have always seen.
fn argmax_fold(logits: &[f32]) -> Option<usize> {
    logits
        .iter()
        .enumerate()
        .fold(None, |best: Option<(usize, f32)>, (i, &l)| match best {
            Some((_, b)) if b >= l => best,
            _ => Some((i, l)),
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests;
