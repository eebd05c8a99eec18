//! The accepted range of every sampling setting, checked in one place so that the command line (which names the
//! flag) and a library caller (which gets a typed [`SamplingError`]) refuse the same values with the same words.
//!
//! Without these checks a bad value does not fail, it silently corrupts the distribution: a NaN temperature or
//! penalty turns every logit into NaN, and the argmax of all-NaN logits is token 0 on every step.

/// A sampling setting outside its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sampling {setting} is {value}: expected {expected}")]
pub struct SamplingError {
    /// The setting, as named in [`super::SamplingConfig`] (`temperature`, `top_p`, `logit_bias[3]`, ...).
    pub setting: String,
    /// The rejected value, as text (an integer or a float).
    pub value: String,
    /// The accepted range, in words: one of the `*_RANGE` constants of this module.
    pub expected: &'static str,
}

/// What `temperature` accepts; 0 means greedy.
pub const TEMPERATURE_RANGE: &str = "a finite number >= 0 (0 is greedy)";
/// What `top_k` accepts.
pub const TOP_K_RANGE: &str = "an integer >= 1";
/// What `top_p` accepts: 0 would keep nothing, above 1 is meaningless for a probability mass.
pub const TOP_P_RANGE: &str = "a number in (0, 1]";
/// What `min_p` accepts: 1 (or more) would drop every token except ties with the most likely one.
pub const MIN_P_RANGE: &str = "a number in [0, 1)";
/// What `repetition_penalty` accepts: it divides positive logits, so 0 divides by zero and a negative one flips
/// their sign.
pub const REPETITION_PENALTY_RANGE: &str = "a finite number > 0 (1 is none)";
/// What `frequency_penalty` and `presence_penalty` accept (negative values encourage repetition, as in OpenAI's
/// API).
pub const ADDITIVE_PENALTY_RANGE: &str = "a finite number (0 is none)";
/// What a `logit_bias` entry accepts: `-inf` bans the token; NaN or `+inf` would make every probability NaN.
pub const LOGIT_BIAS_RANGE: &str = "a finite number, or -inf to ban the token";

/// `value` is printed with `Debug`, which writes `1e38` rather than 39 digits.
fn refuse(setting: &str, value: impl std::fmt::Debug, expected: &'static str) -> SamplingError {
    SamplingError {
        setting: setting.to_string(),
        value: format!("{value:?}"),
        expected,
    }
}

/// Checks a temperature.
pub fn check_temperature(value: f32) -> Result<f32, SamplingError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(refuse("temperature", value, TEMPERATURE_RANGE))
    }
}

/// Checks a top-k count.
pub fn check_top_k(value: usize) -> Result<usize, SamplingError> {
    if value >= 1 {
        Ok(value)
    } else {
        Err(refuse("top_k", value, TOP_K_RANGE))
    }
}

/// Checks a top-p mass.
pub fn check_top_p(value: f32) -> Result<f32, SamplingError> {
    // Written so that NaN fails: every comparison with NaN is false.
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(refuse("top_p", value, TOP_P_RANGE))
    }
}

/// Checks a min-p fraction.
pub fn check_min_p(value: f32) -> Result<f32, SamplingError> {
    if (0.0..1.0).contains(&value) {
        Ok(value)
    } else {
        Err(refuse("min_p", value, MIN_P_RANGE))
    }
}

/// Checks a repetition penalty.
pub fn check_repetition_penalty(value: f32) -> Result<f32, SamplingError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(refuse(
            "repetition_penalty",
            value,
            REPETITION_PENALTY_RANGE,
        ))
    }
}

/// Checks a frequency or presence penalty; `setting` names which.
pub fn check_additive_penalty(setting: &str, value: f32) -> Result<f32, SamplingError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(refuse(setting, value, ADDITIVE_PENALTY_RANGE))
    }
}

/// Checks one logit bias; `index` is its position in the list, for the message.
pub fn check_logit_bias(index: usize, bias: f32) -> Result<f32, SamplingError> {
    if bias.is_finite() || bias == f32::NEG_INFINITY {
        Ok(bias)
    } else {
        Err(refuse(
            &format!("logit_bias[{index}]"),
            bias,
            LOGIT_BIAS_RANGE,
        ))
    }
}
