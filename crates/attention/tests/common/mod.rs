//! Shared test support: random inputs, a float64 attention oracle written in plain Rust (forward and
//! backward, independent of burn), and tolerance checks.

#![allow(dead_code)]

use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};
use ember_attention::{AttentionOptions, MaskSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One attention problem.
#[derive(Clone, Debug)]
pub struct Case {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub causal: bool,
    pub offset: usize,
    pub window: Option<usize>,
    /// Left-padding length of each batch row (empty: no padding mask).
    pub left_pad: Vec<usize>,
    /// Further padded keys `(batch row, key)` anywhere in a row (with or without `left_pad`).
    pub hidden: Vec<(usize, usize)>,
    /// Soft cap of the scaled scores (`None`: uncapped).
    pub softcap: Option<f64>,
}

impl Case {
    /// Full (bidirectional) attention with no padding; set the other fields with struct update syntax.
    pub fn new(
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        q_len: usize,
        kv_len: usize,
    ) -> Self {
        Case {
            batch,
            q_heads,
            kv_heads,
            head_dim,
            q_len,
            kv_len,
            causal: false,
            offset: 0,
            window: None,
            left_pad: Vec::new(),
            hidden: Vec::new(),
            softcap: None,
        }
    }

    pub fn spec(&self) -> MaskSpec {
        MaskSpec {
            causal: self.causal,
            query_offset: self.offset,
            window: self.window,
        }
    }

    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.q_heads, self.q_len, self.head_dim]
    }

    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.kv_heads, self.kv_len, self.head_dim]
    }

    /// Whether query row `i` of batch row `b` sees key `j`.
    pub fn visible(&self, b: usize, i: usize, j: usize) -> bool {
        let pos = self.offset + i;
        let causal_ok = !self.causal || j <= pos;
        let window_ok = self.window.is_none_or(|w| j + w > pos);
        causal_ok && window_ok && !self.is_padding(b, j)
    }

    /// Whether key `j` of batch row `b` is padding.
    pub fn is_padding(&self, b: usize, j: usize) -> bool {
        self.left_pad.get(b).is_some_and(|&pad| j < pad) || self.hidden.contains(&(b, j))
    }

    /// The `[batch, kv_len]` padding mask (`true` = padding), if the case has one.
    pub fn padding(&self) -> Option<Vec<bool>> {
        (!self.left_pad.is_empty() || !self.hidden.is_empty()).then(|| {
            (0..self.batch)
                .flat_map(|b| (0..self.kv_len).map(move |j| self.is_padding(b, j)))
                .collect()
        })
    }

    pub fn options<B: Backend>(&self, device: &B::Device) -> AttentionOptions<B> {
        let mut options = AttentionOptions::<B>::full();
        options.mask = self.spec();
        options.softcap = self.softcap;
        if let Some(pad) = self.padding() {
            options = options.with_key_padding(Tensor::<B, 2, Bool>::from_data(
                TensorData::new(pad, [self.batch, self.kv_len]),
                device,
            ));
        }
        options
    }
}

/// Inputs of a case, in f64, plus the upstream gradient `dL/d out` (the loss is `sum(out * grad_out)`).
pub struct Inputs {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub grad_out: Vec<f64>,
}

/// Uniform values in [-2, 2]: wide enough that softmax rows are far from uniform, so masking errors show.
pub fn random_vec(rng: &mut ChaCha8Rng, len: usize) -> Vec<f64> {
    (0..len).map(|_| rng.random_range(-2.0..2.0)).collect()
}

pub fn random_inputs(case: &Case, seed: u64) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let q_len: usize = case.q_shape().iter().product();
    let kv_len: usize = case.kv_shape().iter().product();
    Inputs {
        q: random_vec(&mut rng, q_len),
        k: random_vec(&mut rng, kv_len),
        v: random_vec(&mut rng, kv_len),
        grad_out: random_vec(&mut rng, q_len),
    }
}

/// Output and gradients of the f64 reference.
pub struct Reference {
    pub out: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// Attention in plain f64, one query row at a time, with the textbook softmax gradient.
pub fn reference(case: &Case, x: &Inputs) -> Reference {
    let d = case.head_dim;
    let group = case.q_heads / case.kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let qi = |b: usize, h: usize, i: usize| ((b * case.q_heads + h) * case.q_len + i) * d;
    let ki = |b: usize, h: usize, j: usize| ((b * case.kv_heads + h) * case.kv_len + j) * d;
    let mut r = Reference {
        out: vec![0.0; x.q.len()],
        dq: vec![0.0; x.q.len()],
        dk: vec![0.0; x.k.len()],
        dv: vec![0.0; x.v.len()],
    };
    for b in 0..case.batch {
        for h in 0..case.q_heads {
            let kvh = h / group;
            for i in 0..case.q_len {
                let keys: Vec<usize> = (0..case.kv_len)
                    .filter(|&j| case.visible(b, i, j))
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let q = &x.q[qi(b, h, i)..qi(b, h, i) + d];
                let dot = |a: &[f64], c: &[f64]| a.iter().zip(c).map(|(u, w)| u * w).sum::<f64>();
                let raw: Vec<f64> = keys
                    .iter()
                    .map(|&j| scale * dot(q, &x.k[ki(b, kvh, j)..ki(b, kvh, j) + d]))
                    .collect();
                // `c tanh(s / c)`, and its slope `1 - tanh²` that the score gradients pass through.
                let (scores, slopes): (Vec<f64>, Vec<f64>) = match case.softcap {
                    Some(c) => raw
                        .iter()
                        .map(|s| ((s / c).tanh() * c, 1.0 - (s / c).tanh().powi(2)))
                        .unzip(),
                    None => (raw.clone(), vec![1.0; raw.len()]),
                };
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                let probs: Vec<f64> = exps.iter().map(|e| e / sum).collect();
                let go = &x.grad_out[qi(b, h, i)..qi(b, h, i) + d];
                let mut dprobs = Vec::with_capacity(keys.len());
                for (&j, &p) in keys.iter().zip(&probs) {
                    let v = &x.v[ki(b, kvh, j)..ki(b, kvh, j) + d];
                    let (row, key) = (qi(b, h, i), ki(b, kvh, j));
                    for (t, (vt, gt)) in v.iter().zip(go).enumerate() {
                        r.out[row + t] += p * vt;
                        r.dv[key + t] += p * gt;
                    }
                    dprobs.push(dot(go, v));
                }
                let mean: f64 = probs.iter().zip(&dprobs).map(|(p, dp)| p * dp).sum();
                for (((&j, &p), &dp), &slope) in keys.iter().zip(&probs).zip(&dprobs).zip(&slopes) {
                    let ds = p * (dp - mean) * scale * slope;
                    let (row, key) = (qi(b, h, i), ki(b, kvh, j));
                    for (t, qt) in q.iter().enumerate() {
                        r.dq[row + t] += ds * x.k[key + t];
                        r.dk[key + t] += ds * qt;
                    }
                }
            }
        }
    }
    r
}

/// A float tensor from f64 values (converted to the backend's default float dtype).
pub fn tensor<B: Backend>(values: &[f64], shape: [usize; 4], device: &B::Device) -> Tensor<B, 4> {
    let values: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

pub fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data()
        .convert::<f64>()
        .into_vec::<f64>()
        .expect("float tensor data")
}

/// Asserts `|actual - expected| <= atol + rtol * |expected|` elementwise, naming the worst element.
pub fn assert_close(what: &str, actual: &[f64], expected: &[f64], atol: f64, rtol: f64) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(a.is_finite(), "{what}: element {i} is {a}");
        let excess = (a - e).abs() - (atol + rtol * e.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let (i, excess) = worst;
    assert!(
        excess <= 0.0,
        "{what}: element {i} is {} but expected {} (atol {atol}, rtol {rtol})",
        actual[i],
        expected[i]
    );
}

/// Largest absolute difference, for reporting how tight a tolerance is.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
